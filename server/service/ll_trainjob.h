// ll_trainjob.h - the server's background training job: a training run (ll_train_run.h) on a
// thread of its own with its own backend (a CPU backend; or, when the server serves on an
// OpenCL device, an instance of its own on that device, falling back to a CPU backend with the
// reason logged when it cannot be had), controlled from the monitor socket (train
// start|pause|resume|stop, save) and reported in the monitor's `training` object, its history
// and its events (man 7 llsrv-protocol, MONITOR SOCKET).
//
// Threads: create/stop/destroy on the main thread (stop before the scheduler stops: it joins
// the training thread and saves a last checkpoint of a running job, which is how SIGTERM keeps
// the work; destroy after); control and json from the loop thread (they only set flags and read
// a snapshot under a mutex, never waiting on training). The training thread runs at a lower
// priority (nice from train.share), so requests come first; what requests read (the live
// adapter, or the model in full mode) is written only on the scheduler's compute thread,
// between decode steps (the optimizer update, handed over through ll_sched_set_background),
// and its events are emitted there. Checkpoints and evaluations run on the training thread.
#ifndef LL_TRAINJOB_H
#define LL_TRAINJOB_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct ll_config;
struct ll_engine;
struct ll_sched;
struct ll_trainjob;

#define LL_TRAINJOB_HISTORY 512

// run_dir: where checkpoints go; data: the corpus. autostart: begin at once (train.enabled).
// On an OpenCL engine the trainer opens an instance beside the engine's (e must outlive j).
int ll_trainjob_create(struct ll_trainjob **out, struct ll_engine *e, struct ll_sched *s, const struct ll_config *cfg, const char *model_path,
                       const char *data, const char *run_dir, int autostart, char *err, size_t errlen);
// Joins the training thread and saves a running job's checkpoint: 0, or the failed save's code
// (logged as an error; the server then exits non-zero). Accepts NULL; before the scheduler stops.
int ll_trainjob_stop(struct ll_trainjob *j);
void ll_trainjob_destroy(struct ll_trainjob *j); // accepts NULL; stops it first if need be

// "start", "pause", "resume", "stop", "save": 0, or a negative code with the reason in msg.
int ll_trainjob_control(struct ll_trainjob *j, const char *cmd, char *msg, size_t cap);
// The monitor's `training` object (every field; history up to LL_TRAINJOB_HISTORY points).
json_t *ll_trainjob_json(struct ll_trainjob *j);
int64_t ll_trainjob_bytes(struct ll_trainjob *j); // trainer memory, -1 before the run opened
// What the trainer's own OpenCL instance holds on the device (its weights' copies, staging
// buffers), -1 when it trains on the CPU. The serving backend's allocations are not in it.
int64_t ll_trainjob_device_bytes(struct ll_trainjob *j);
// One line: "cpu" or "opencl", the training device's name and why it trains there. A device
// that cannot hold a run's buffers gives the run to the CPU (logged), so it may change then.
void ll_trainjob_describe(struct ll_trainjob *j, char *out, size_t cap);

// ---- more runs on the training thread (fine-tuning jobs, ftjobs.c) ----
// One training thread runs one run at a time: the configured run (the train: section) and the
// runs a queue hands it. fn(user, j) is called on the training thread between two steps of the
// configured run (or while it is off, paused, stopped or done) after ll_trainjob_kick; it runs
// at most one queued run to its end - or until ll_trainjob_quitting - and returns 1 when it
// ran one (it is called again), 0 when none is waiting. Meanwhile the configured run stands
// still where it is, open, its adapter still served as `live` (the monitor's `training` object
// says `yielded_to`: ll_trainjob_yield_to), and it goes on afterwards. Set once, before kicks.
void ll_trainjob_set_queue(struct ll_trainjob *j, int (*fn)(void *user, struct ll_trainjob *j), void *user);
void ll_trainjob_kick(struct ll_trainjob *j);            // any thread: the queue has work
int ll_trainjob_quitting(const struct ll_trainjob *j);   // training thread: ll_trainjob_stop was called
// For fn, on the training thread: the training backend and model, the hooks that make a
// trainer behave as the configured run's (its optimizer update on the compute thread between
// decode steps, train.share's pauses while requests run), work on the compute thread, and the
// name shown in the monitor (NULL: none).
struct ll_backend *ll_trainjob_backend(struct ll_trainjob *j);
const struct ll_model *ll_trainjob_model(struct ll_trainjob *j);
struct ll_trainer;
void ll_trainjob_hooks(struct ll_trainjob *j, struct ll_trainer *tr);
int ll_trainjob_on_compute(struct ll_trainjob *j, int (*fn)(void *), void *arg);
void ll_trainjob_yield_to(struct ll_trainjob *j, const char *name);

#endif
