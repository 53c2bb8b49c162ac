// ll_ftjobs.h - OpenAI's fine-tuning API behind the HTTP API (man 7 llsrv-http): training
// files (POST /v1/files, JSONL validated line by line), fine-tuning jobs that each train a
// LoRA adapter on the server's training thread exactly as the train: section's run does
// (server/train's run, trainjob.c's thread, hooks and backend), their events (the loss per
// step and evaluation) and checkpoints, and the result served as the model
// ft:<base>:<suffix>:<id> (GET /v1/models, `model` in chat/completions, adapter= on the line
// protocol).
//
// Persistence: <state_dir>/fine_tuning/files/<id>.jsonl + <id>.json and
// <state_dir>/fine_tuning/jobs/<id>.json (each published atomically: temp file, fsync,
// rename, fsync of the directory), a job's run directory <id>.run/ (its checkpoints; a job
// that was running when the server stopped resumes from its newest). Read back at start
// with every size and field checked; a damaged record is logged and left out.
//
// Threads: the HTTP handlers run on the loop thread and only touch memory; disk work (an
// upload's validation and write, records, a job's file validation) runs on a worker thread of
// this module, whose replies come back to the loop through a uv_async; jobs train on the
// training thread (ll_trainjob_set_queue), one at a time, oldest first, ahead of the
// configured run, which stands still meanwhile. One mutex guards the store.
#ifndef LL_FTJOBS_H
#define LL_FTJOBS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

struct ll_config;
struct ll_engine;
struct ll_sched;
struct ll_trainjob;
struct ll_ftjobs;

struct ll_ftjobs_env {
  const char *dir;            // <state_dir>/fine_tuning (made if need be)
  const char *base_id;        // the base model's id (GET /v1/models)
  const char *model_path;
  const struct ll_config *cfg;
  struct ll_engine *e;
  struct ll_sched *s;
  struct ll_trainjob *job;    // the training thread; NULL: the model cannot train (jobs are refused)
  uv_loop_t *loop;
};

// Loads the store, registers the succeeded jobs' models, starts the worker and queues the
// jobs left queued or running. On the main thread, after the scheduler and the training job.
int ll_ftjobs_open(struct ll_ftjobs **out, const struct ll_ftjobs_env *env, char *err, size_t errlen);
// Joins the worker after it has written every pending record (after ll_trainjob_stop, so that
// a job interrupted by the shutdown is recorded as running). Accepts NULL.
void ll_ftjobs_stop(struct ll_ftjobs *f);
// Frees the served adapters (after ll_sched_destroy, before the engine), then, once the
// loop's handles are closed (after ll_server_close), everything. Accept NULL.
void ll_ftjobs_release_adapters(struct ll_ftjobs *f);
void ll_ftjobs_free(struct ll_ftjobs *f);

// An answer for the HTTP layer (loop thread): status and the JSON body (the callee owns it);
// body NULL: the request is abandoned (shutdown) and only ctx is to be released.
typedef void (*ll_ftjobs_reply_fn)(void *ctx, int status, json_t *body);

// Handles METHOD PATH (PATH after "/v1", e.g. "/files/file-abc", without the query) on the
// loop thread. Returns 0 when PATH is not the fine-tuning API's (nothing called); otherwise 1,
// and fn is called exactly once - at once, or later from the loop (an upload).
int ll_ftjobs_request(struct ll_ftjobs *f, const char *method, size_t mlen, const char *path, size_t plen, const char *query,
                      size_t qlen, const char *body, size_t blen, const char *ctype, size_t ctlen, ll_ftjobs_reply_fn fn, void *ctx);

// For /metrics: jobs by status (ll_ftjobs_status_name(i) names jobs[i]; NULL past the last),
// the uploaded files, and the running job's step, total steps and last loss (NaN: none).
#define LL_FTJOBS_N_STATUS 6
struct ll_ftjobs_stats {
  int64_t jobs[LL_FTJOBS_N_STATUS];
  int64_t files;
  int running; // a job trains now: its step, total_steps, loss
  int64_t step, total_steps;
  double loss;
};
void ll_ftjobs_stats(struct ll_ftjobs *f, struct ll_ftjobs_stats *st); // accepts NULL (all zero)
const char *ll_ftjobs_status_name(int i);

// The OpenAI error object {"error": {message, type, param, code}} for an HTTP status (http.c).
json_t *ll_http_error_object(int status, const char *code, const char *param, const char *msg);

#endif
