// ll_sched.h - continuous batching: one compute thread drives the engine; requests join at
// the next step; every step decodes one token for each generating sequence and a prefill
// chunk for sequences still reading their prompt, in ONE ll_engine_decode call (one pass
// over the weights). Results come back through an outbox the
// event loop drains as structured events (the notify callback is where it calls uv_async_send).
//
// Threading: submit/cancel/shutdown/take_output/get_stats are called from the loop thread;
// everything else runs on the compute thread. A request is owned by the scheduler from
// submit on; the loop refers to it by (conn, id) only.
#ifndef LL_SCHED_H
#define LL_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "ll_proto.h"
#include "ll_sample.h"

struct ll_engine;
struct ll_sched;

enum ll_req_kind { LL_REQ_GEN, LL_REQ_CHAT, LL_REQ_TOKENIZE, LL_REQ_DETOKENIZE };

struct ll_sched_req {
  enum ll_req_kind kind;
  uint64_t conn;                   // the loop's connection handle id (opaque here)
  char id[LL_PROTO_MAX_ID + 1];
  char *text;                      // prompt / chat messages / text / ids (owned, malloc'ed)
  size_t text_len;
  struct ll_sampler_params sp;
  int max_tokens;
  int ignore_eos;
  int add_bos;                     // -1: the model's default
  int special;                     // GEN: parse special tokens in the prompt (default 1); CHAT:
                                   // in the messages' contents too (default 0: only the
                                   // template's markers are special tokens)
  int enable_thinking;             // CHAT with Qwen3's template: 0 pre-fills an empty think block (ll_chat_opts)
  int chat_default;                // CHAT on a model without a chat template: chatml (else ERR unsupported)
  int want_logprob;                // PROB events carry the sampled token's logprob even with n_probs 0
  int n_stops;
  char *stops[LL_MAX_STOP];        // owned
  char adapter[LL_ADAPTER_NAME_MAX + 1]; // "" (the server's default), "none", "live" or a registered name
  double t_submit;                 // CLOCK_MONOTONIC ms, set by ll_sched_submit (monitor's age_s)
};

struct ll_sched_params {
  int prefill_chunk;               // prompt tokens per sequence per step
  const char *chat_template;       // CHAT's template (a built-in name or template text, copied);
                                   // NULL: the model's tokenizer.chat_template
};

// What the scheduler tells the loop: structured events, one per thing that happened to a
// request, encoded by each protocol (the line protocol: ll_proto_encode_event; HTTP: http.c).
// Every request ends with exactly one final event (END, ERROR, IDS or TEXT).
enum ll_sched_ev_type {
  LL_EV_TOKEN,   // generated text data[0..len) (UTF-8 complete, stop strings removed; never empty)
  LL_EV_PROB,    // the sampled token, its logprob and the top n_top candidates (before its TOKEN)
  LL_EV_END,     // final: reason, usage and timings; data = a message (reason=error) or empty
  LL_EV_ERROR,   // final: code (a wire error code) and the message in data
  LL_EV_IDS,     // final: TOKENIZE's n_ids token ids, int32_t in data
  LL_EV_TEXT,    // final: DETOKENIZE's text in data
  LL_EV_MONITOR, // a monitor event: one JSON line with its '\n' in data, conn 0
};

struct ll_sched_ev {
  struct ll_sched_ev *next;
  enum ll_sched_ev_type type;
  uint64_t conn;
  int final;
  char id[LL_PROTO_MAX_ID + 1];
  const char *reason;              // END: stop|length|cancel|shutdown|error (static text)
  const char *code;                // ERROR: bad_param, context_exceeded, ... (static text)
  int prompt_tokens, tokens;       // END: usage
  double queue_ms, prefill_ms, decode_ms; // END: submitted -> admitted -> first token -> end
  int32_t token;                   // PROB: the sampled token
  float logprob;                   // PROB: its log-probability (after penalties, before temperature)
  int n_top;                       // PROB: entries of top (the request's n_probs)
  struct ll_token_prob top[20];
  int n_ids;                       // IDS
  size_t len;                      // bytes of data (without a NUL; data[len] is 0)
  char data[];
};

#define LL_SCHED_MAX_SHOWN 64 // per-request progress entries in the stats
struct ll_sched_req_progress {
  char id[LL_PROTO_MAX_ID + 1];
  uint64_t conn;
  int prefilling;
  int prompt_tokens, prefilled, tokens, max_tokens;
  char adapter[LL_ADAPTER_NAME_MAX + 1]; // "none", "live" or the adapter's name
  double age_s;                    // since submitted
  double tok_s;                    // decode tokens/s of this request; < 0 before its first token
};

struct ll_sched_stats {
  int active, queued;
  uint64_t requests_total, requests_done, tokens_generated, tokens_prefilled;
  double decode_tps, prefill_tps;  // over the last ~second of work; 0 when idle
  int kv_blocks_used;
  int n_shown;
  struct ll_sched_req_progress shown[LL_SCHED_MAX_SHOWN];
};

typedef void (*ll_sched_notify_fn)(void *user);

// The template CHAT renders with (chat_template of the params, else the model's), or NULL.
const char *ll_sched_chat_template(const struct ll_sched *s);

int ll_sched_create(struct ll_sched **out, struct ll_engine *e, const struct ll_sched_params *p,
                    ll_sched_notify_fn notify, void *user, char *err, size_t errlen);
// Stops the compute thread (cancelling what is left, no more output) and frees everything.
void ll_sched_destroy(struct ll_sched *s);

void ll_sched_req_free(struct ll_sched_req *r);
// Takes ownership of r (also on error). LL_ESTATE after shutdown.
int ll_sched_submit(struct ll_sched *s, struct ll_sched_req *r);
// n requests under one lock and one wake-up, so that the compute thread's next step sees all
// of them (submitted one by one, the first wakes it, and it may start a step before the rest
// are in). Takes ownership of each; rc[i] is r[i]'s result as ll_sched_submit's.
void ll_sched_submit_many(struct ll_sched *s, struct ll_sched_req **r, int n, int *rc);
// Cancel request `id` of conn, or all of conn's requests when id is NULL. Each one still ends
// with a final event (reason=cancel), which the loop drops if the connection is gone.
void ll_sched_cancel(struct ll_sched *s, uint64_t conn, const char *id);
// End everything with reason=shutdown and accept nothing more.
void ll_sched_shutdown(struct ll_sched *s);
// Events produced since the last call (in order), or NULL. Free each with free().
struct ll_sched_ev *ll_sched_take_events(struct ll_sched *s);
void ll_sched_get_stats(struct ll_sched *s, struct ll_sched_stats *st);

// ---- LoRA adapters requests may choose (GEN/CHAT adapter=NAME) ----
// Registers adapter a under `name` (ll_adapter_name_check; "none" is reserved; "live"
// is the trainer's adapter being trained), replacing an earlier one of that name; a NULL
// unregisters. Any thread. The scheduler does not own a: requests admitted earlier keep
// computing with the adapter they started with, so the caller keeps every adapter it
// registered alive until ll_sched_destroy(). At most LL_SCHED_MAX_ADAPTERS names.
// Requests naming an unknown adapter end with `ERR id bad_adapter :...`.
#define LL_SCHED_MAX_ADAPTERS 64
struct ll_lora;
int ll_sched_adapter_register(struct ll_sched *s, const char *name, const struct ll_lora *a);
// Hot-loading (adapter load/unload, the adapter_dir watch): publishes version `version` of
// adapter a under `name` (NULL: unloads the name), and the scheduler owns a from then on.
// Requests admitted from now on compute with it; those admitted earlier finish on the version
// they began with. A version is released - release(a), on whichever thread drops its last
// use, logged - once its name maps to another one (or none) and its last request has ended,
// or at ll_sched_destroy. "live" and "none" are refused (LL_EINVAL); on any error a stays the
// caller's. Any thread.
int ll_sched_adapter_publish(struct ll_sched *s, const char *name, struct ll_lora *a, uint64_t version, void (*release)(struct ll_lora *a));
// The published versions alive now (registered, or still used by requests), up to cap; returns the count.
struct ll_sched_adapter_version {
  char name[LL_ADAPTER_NAME_MAX + 1];
  uint64_t version;
  int users;      // requests computing with it
  int registered; // 1: its name maps to it; 0: replaced or unloaded, freed after its last request
};
int ll_sched_adapter_versions(struct ll_sched *s, struct ll_sched_adapter_version *out, int cap);
// Why `live` is not registered now, for the bad_adapter message of requests that name it (NULL
// or "": "training is not running"). Any thread.
void ll_sched_live_reason(struct ll_sched *s, const char *why);
// The names registered now ("live" among them while training), up to cap; returns the count.
// Any thread.
int ll_sched_adapter_names(struct ll_sched *s, char (*names)[LL_ADAPTER_NAME_MAX + 1], int cap);
// The adapter of requests that name none ("none" or NULL: the base model; the default).
int ll_sched_adapter_default(struct ll_sched *s, const char *name);

// ---- background work (training) on the compute thread ----
// fn(user, busy) runs one unit of background work (the training job's: its optimizer update, its
// events; the steps themselves run on the job's own thread, trainjob.c) on the compute thread
// between decode steps and returns 1 when it has more to do, 0 when it has nothing (then the
// thread sleeps until a request or ll_sched_wake). Generation has priority: with requests in
// flight (busy = 1) a unit runs only while background time stays under `share` of the
// compute time (measured over the last ~10 s); idle, units run back to back.
typedef int (*ll_sched_bg_fn)(void *user, int busy);
void ll_sched_set_background(struct ll_sched *s, ll_sched_bg_fn fn, void *user, double share);
void ll_sched_wake(struct ll_sched *s); // any thread: the background has work again
// Any thread: 1 while requests are admitted, queued or generating (read without a lock).
int ll_sched_busy(const struct ll_sched *s);
// Compute thread (from fn): one monitor event line (JSON text without '\n').
void ll_sched_emit_event(struct ll_sched *s, const char *json);

#endif
