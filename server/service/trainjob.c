// trainjob.c - background training in the server (ll_trainjob.h).
#include "ll_trainjob.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ll_config.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_log.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_sched.h"
#include "ll_train_run.h"
#include "ll_trainer.h"

// ST_PAUSING: a pause was asked for while a step runs; the step finishes (its update is
// applied), then the job is paused. A resume in that window cancels the pause.
// ST_STARTING: the run is being opened (data scanned and tokenized, the step-0 evaluation),
// which takes a while on a real model; commands then act as on a start still pending.
enum job_state { ST_OFF, ST_RUNNING, ST_PAUSED, ST_STOPPED, ST_DONE, ST_ERROR, ST_PAUSING, ST_STARTING };
static const char *const state_names[] = {"off", "running", "paused", "stopped", "done", "error", "pausing", "starting"};

enum { CMD_START = 1, CMD_PAUSE = 2, CMD_RESUME = 4, CMD_STOP = 8, CMD_SAVE = 16 };

struct point {
  int64_t step;
  double loss, val; // NaN: none
};

struct ll_trainjob {
  struct ll_engine *e;
  struct ll_sched *s;
  struct ll_trainer_params tp;
  struct ll_train_run_opts ro;
  char model_path[1024], data[1024], run_dir[1024], arch[32];
  struct ll_train_run *run;  // the training thread's (destroy's once it has been joined)
  struct ll_backend *be;     // the training thread's own backend (CPU: its pool, its scratch; OpenCL: its queue)
  // On an OpenCL serving device the trainer computes on its own instance of that device (the
  // serving backend's staging buffers and queue belong to the compute thread), opened beside
  // the serving one on its context: the engine's ll_weights name the serving instance's device
  // copies (w->dev), which the trainer's queue reads where they are (one copy of the weights).
  const struct ll_model *m; // what the trainer computes on: the engine's model
  // Which device trains, and why (set before init_done, constant after): the log, the monitor.
  char be_name[16], be_device[128], be_reason[512];
  int n_threads, nice;
  double share;  // train.share
  double y_last; // when the training thread last passed a yield point (train_yield)
  pthread_t th;
  int th_started;

  pthread_mutex_t mu; // guards what follows (the loop thread reads it)
  pthread_cond_t cv;  // the training thread waits here: commands, quit, a compute job done
  int quit, init_done, init_rc;
  char init_err[256];
  // A job for the compute thread: the writes to what requests read (the optimizer update, the
  // trained weights' publication), run between decode steps; the training thread waits.
  int (*cjob)(void *arg);
  void *cjob_arg;
  int cjob_rc, cjob_done;
  char **evq; // events for the compute thread to emit (the scheduler's output is its own)
  int n_evq, cap_evq;
  int state, cmds;
  int64_t step, total, epoch, skipped, bytes;
  int64_t dev_bytes; // what the trainer's OpenCL instance holds on the device (-1: CPU trainer)
  double loss, val, lr, gnorm, tps, eta;
  char last_ckpt[4160], error[512];
  struct point hist[LL_TRAINJOB_HISTORY];
  int n_hist;
  int64_t stride; // history keeps steps that are multiples of stride (doubles when full)
  double t_run;   // seconds of training in this process, tokens over it (tokens/s)
  int64_t tokens;
  // The queue of other runs (fine-tuning jobs): fn runs one on this thread; kicked under mu.
  int (*q_fn)(void *user, struct ll_trainjob *j);
  void *q_user;
  int q_kicked;
  char yielded_to[128]; // under mu: the queued run that has the thread now ("" none)
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

// ---------------------------------------------------------------- history (under mu)

static void hist_add(struct ll_trainjob *j, int64_t step, double loss, double val) {
  if (j->n_hist && j->hist[j->n_hist - 1].step == step) { // the same step again (its evaluation)
    if (!isnan(val)) j->hist[j->n_hist - 1].val = val;
    return;
  }
  if (step % j->stride != 0 && isnan(val)) return;
  if (j->n_hist == LL_TRAINJOB_HISTORY) { // downsample: keep every other point, twice the stride
    int k = 0;
    for (int i = 0; i < j->n_hist; i += 2) j->hist[k++] = j->hist[i];
    j->n_hist = k;
    j->stride *= 2;
  }
  j->hist[j->n_hist++] = (struct point){step, loss, val};
}

// ---------------------------------------------------------------- events (training thread)

// Queued for the compute thread, which emits them with the next step's output.
static void event_json(struct ll_trainjob *j, json_t *ev) {
  json_object_set_new(ev, "type", json_string("event"));
  char *txt = json_dumps(ev, JSON_COMPACT);
  json_decref(ev);
  if (!txt) return;
  pthread_mutex_lock(&j->mu);
  if (j->n_evq == j->cap_evq && j->n_evq < 4096) {
    int cap = j->cap_evq ? 2 * j->cap_evq : 16;
    char **q = realloc(j->evq, (size_t)cap * sizeof *q);
    if (q) j->evq = q, j->cap_evq = cap;
  }
  if (j->n_evq < j->cap_evq) j->evq[j->n_evq++] = txt, txt = NULL; // else dropped (a monitor that stalls the loop)
  pthread_mutex_unlock(&j->mu);
  free(txt);
  ll_sched_wake(j->s);
}

// Runs fn(arg) on the compute thread between decode steps and returns its result (the
// training thread waits). The scheduler runs until the job's thread has been joined.
static int on_compute(struct ll_trainjob *j, int (*fn)(void *), void *arg) {
  pthread_mutex_lock(&j->mu);
  j->cjob = fn, j->cjob_arg = arg, j->cjob_done = 0;
  pthread_mutex_unlock(&j->mu);
  ll_sched_wake(j->s);
  pthread_mutex_lock(&j->mu);
  while (!j->cjob_done) pthread_cond_wait(&j->cv, &j->mu);
  int rc = j->cjob_rc;
  pthread_mutex_unlock(&j->mu);
  return rc;
}

static int update_hook(void *user, int (*update)(void *), void *arg) { return on_compute(user, update, arg); }

// Before each layer (ll_trainer_set_yield_hook). With requests in flight, training takes at most
// train.share of the wall time: after running t seconds since the last layer it pauses
// t·(1 - share)/share, or until the requests are done, so decoding has the CPU to itself most
// of the time (its lower priority alone still leaves two-threaded decode steps waiting on a
// preempted worker). Idle: no pause.
static void train_yield(void *user) {
  struct ll_trainjob *j = user;
  const double t = now_s();
  const double ran = j->y_last > 0 ? t - j->y_last : 0;
  if (ran > 0 && j->share < 1 && ll_sched_busy(j->s)) {
    double pause = ran * (1.0 - j->share) / j->share;
    if (pause > 0.25) pause = 0.25; // after a long gap (an evaluation, a checkpoint): one short pause
    const double until = t + pause;
    const struct timespec ms = {0, 1000000};
    while (now_s() < until && ll_sched_busy(j->s) && !__atomic_load_n(&j->quit, __ATOMIC_RELAXED)) nanosleep(&ms, NULL);
  }
  j->y_last = now_s();
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

// adapter=live names the adapter of a LoRA run that is running, pausing, paused or done; after
// `train stop` or an error it is withdrawn (requests that began with it finish with it: the
// run keeps it alive) and requests naming it are told why.
static void live_withdraw(struct ll_trainjob *j, const char *why) {
  if (j->tp.mode != LL_TRAIN_LORA) return;
  ll_sched_adapter_register(j->s, "live", NULL);
  ll_sched_live_reason(j->s, why);
}

static void fail(struct ll_trainjob *j, const char *msg) {
  ll_log(LL_LOG_ERROR, "training: %s", msg);
  char why[256];
  snprintf(why, sizeof why, "training stopped with an error: %.200s", msg);
  live_withdraw(j, why);
  pthread_mutex_lock(&j->mu);
  j->state = ST_ERROR;
  snprintf(j->error, sizeof j->error, "%s", msg);
  pthread_mutex_unlock(&j->mu);
  json_t *ev = json_object();
  json_object_set_new(ev, "event", json_string("train_error"));
  json_object_set_new(ev, "message", json_string(msg));
  event_json(j, ev);
}

static int save(struct ll_trainjob *j, int emit) {
  char err[512];
  struct ll_train_run_event ev;
  int rc = ll_train_run_save(j->run, &ev, err, sizeof err);
  if (rc) {
    // The previous checkpoints stay as they were (the new one is written beside them and
    // published by rename only when complete); training goes on.
    ll_log(LL_LOG_WARN, "training: checkpoint failed: %s", err);
    if (emit) {
      json_t *w = json_object();
      json_object_set_new(w, "event", json_string("warning"));
      char m[600];
      snprintf(m, sizeof m, "checkpoint failed: %s", err);
      json_object_set_new(w, "message", json_string(m));
      event_json(j, w);
    }
    return rc;
  }
  pthread_mutex_lock(&j->mu);
  snprintf(j->last_ckpt, sizeof j->last_ckpt, "%s", ev.path);
  int64_t step = j->step;
  pthread_mutex_unlock(&j->mu);
  if (emit) {
    json_t *e = json_object();
    json_object_set_new(e, "event", json_string("checkpoint_saved"));
    json_object_set_new(e, "step", json_integer(step));
    json_object_set_new(e, "path", json_string(ev.path));
    event_json(j, e);
  }
  return 0;
}

// Compute thread: requests see the trained weights from the next step on.
static int publish_weights(void *arg) {
  struct ll_trainjob *j = arg;
  struct ll_trainer *tr = ll_train_run_trainer(j->run);
  // What requests see: adapter=live (LoRA), or the model itself (full-parameter).
  if (ll_trainer_lora(tr)) return ll_sched_adapter_register(j->s, "live", ll_trainer_lora(tr));
  return ll_trainer_model(tr) ? ll_engine_use_weights(j->e, ll_trainer_model(tr)) : 0;
}

// What the trainer's OpenCL instance holds now (training thread; the loop reads the copy).
static void note_dev_bytes(struct ll_trainjob *j) {
  if (strcmp(j->be_name, "opencl") != 0) return;
  struct ll_backend_info bi;
  j->be->i->get_info(j->be, &bi);
  pthread_mutex_lock(&j->mu);
  j->dev_bytes = bi.mem_used;
  pthread_mutex_unlock(&j->mu);
}

static int use_cpu(struct ll_trainjob *j, char *err, size_t errlen);

static int open_run(struct ll_trainjob *j) {
  char err[1024], desc[4096];
  int rc = ll_train_run_open(&j->run, j->m, j->be, ll_engine_tokenizer(j->e), &j->tp, &j->ro, err, sizeof err);
  if (rc == LL_ENOMEM && strcmp(j->be_name, "opencl") == 0) {
    // The device cannot hold this run's buffers beside the server: the CPU trains instead.
    char cerr[256];
    ll_log(LL_LOG_WARN, "training: on the CPU: the serving device cannot hold the training buffers: %s", err);
    ll_backend_free(j->be);
    j->be = NULL;
    if ((rc = use_cpu(j, cerr, sizeof cerr)) != 0) {
      fail(j, cerr);
      return rc;
    }
    pthread_mutex_lock(&j->mu);
    snprintf(j->be_reason, sizeof j->be_reason, "cpu: the serving device cannot hold the training buffers: %.400s", err);
    pthread_mutex_unlock(&j->mu);
    rc = ll_train_run_open(&j->run, j->m, j->be, ll_engine_tokenizer(j->e), &j->tp, &j->ro, err, sizeof err);
  }
  if (rc) {
    fail(j, err);
    return rc;
  }
  ll_train_run_describe(j->run, desc, sizeof desc);
  for (char *line = strtok(desc, "\n"); line; line = strtok(NULL, "\n")) ll_log(LL_LOG_INFO, "training: %s", line);
  struct ll_trainer *tr = ll_train_run_trainer(j->run);
  ll_trainer_set_update_hook(tr, update_hook, j);
  ll_trainer_set_yield_hook(tr, train_yield, j);
  if ((rc = on_compute(j, publish_weights, j)) != 0) // training goes on; requests just cannot see it
    ll_log(LL_LOG_WARN, "training: the trained %s cannot be served: %s", ll_trainer_lora(tr) ? "adapter (adapter=live)" : "weights",
           ll_strerror(rc));
  struct ll_train_memory mem;
  ll_trainer_memory(tr, &mem);
  struct ll_trainer_state st;
  ll_trainer_state(tr, &st);
  double val = NAN;
  for (const char *nt = ll_train_run_notes(j->run); *nt;) { // skipped damaged checkpoints, stale files removed
    const size_t l = strcspn(nt, "\n");
    char m[2100];
    snprintf(m, sizeof m, "%.*s", (int)l, nt);
    ll_log(LL_LOG_WARN, "training: %s", m);
    json_t *w = json_object();
    json_object_set_new(w, "event", json_string("warning"));
    json_object_set_new(w, "message", json_string(m));
    event_json(j, w);
    nt += l + (nt[l] == '\n');
  }
  if (ll_train_run_resumed_from(j->run) >= 0)
    ll_log(LL_LOG_INFO, "training: resumed %s at step %lld", ll_train_run_resumed_path(j->run), (long long)st.step);
  else if (j->ro.eval_every > 0 && ll_train_run_eval(j->run, &val, err, sizeof err) != 0 && isfinite(val))
    ll_log(LL_LOG_WARN, "training: %s (training goes on)", err); // evaluated, but best.ckpt could not be written
  pthread_mutex_lock(&j->mu);
  j->bytes = mem.adapters + mem.grads + mem.optimizer + mem.activations;
  j->step = st.step;
  j->skipped = st.skipped;
  j->val = val;
  if (!isnan(val)) hist_add(j, st.step, NAN, val);
  pthread_mutex_unlock(&j->mu);
  note_dev_bytes(j);
  return 0;
}

// The compute thread's part (ll_sched_bg_fn): the training thread's events and its job.
static int compute_slice(void *user, int busy) {
  (void)busy;
  struct ll_trainjob *j = user;
  pthread_mutex_lock(&j->mu);
  char **q = j->evq;
  int n = j->n_evq;
  int (*fn)(void *) = j->cjob;
  void *arg = j->cjob_arg;
  j->evq = NULL, j->n_evq = j->cap_evq = 0, j->cjob = NULL;
  pthread_mutex_unlock(&j->mu);
  for (int i = 0; i < n; i++) ll_sched_emit_event(j->s, q[i]), free(q[i]);
  free(q);
  if (fn) {
    int rc = fn(arg);
    pthread_mutex_lock(&j->mu);
    j->cjob_rc = rc, j->cjob_done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
  }
  return 0;
}

// One round of the training thread: commands, then one step when running. Returns 1 when it
// ran a step that did not finish the run.
static int slice(struct ll_trainjob *j, int cmds) {
  pthread_mutex_lock(&j->mu);
  int state = j->state;
  pthread_mutex_unlock(&j->mu);
  if ((cmds & CMD_START) && state != ST_RUNNING && state != ST_PAUSED) {
    const int had_run = j->run != NULL;
    if (!had_run) {
      pthread_mutex_lock(&j->mu);
      j->state = ST_STARTING;
      pthread_mutex_unlock(&j->mu);
    }
    if (!had_run && open_run(j) != 0) return 0; // a new run publishes itself
    state = ll_train_run_done(j->run) ? ST_DONE : ST_RUNNING;
    if (had_run) {
      // Started again after a stop: requests see the run again.
      int rc = on_compute(j, publish_weights, j);
      if (rc) ll_log(LL_LOG_WARN, "training: the trained adapter (adapter=live) cannot be served: %s", ll_strerror(rc));
    }
  }
  if ((cmds & CMD_PAUSE) && (state == ST_RUNNING || state == ST_PAUSING)) state = ST_PAUSED;
  if ((cmds & CMD_RESUME) && state == ST_PAUSED) state = ST_RUNNING;
  if ((cmds & CMD_STOP) && (state == ST_RUNNING || state == ST_PAUSED || state == ST_PAUSING)) {
    save(j, 1);
    state = ST_STOPPED;
    live_withdraw(j, "training was stopped (train start continues it; its checkpoints are in train.checkpoint_dir)");
  }
  if ((cmds & CMD_SAVE) && j->run) save(j, 1);
  pthread_mutex_lock(&j->mu);
  // A pause asked for since this slice read the state stays pending (its command is queued).
  if (!(state == ST_RUNNING && j->state == ST_PAUSING)) j->state = state;
  state = j->state;
  pthread_mutex_unlock(&j->mu);
  if (state != ST_RUNNING) return 0;

  char err[1024];
  struct ll_train_run_event ev;
  const double t0 = now_s();
  int rc = ll_train_run_step(j->run, &ev, err, sizeof err);
  const double dt = now_s() - t0;
  note_dev_bytes(j); // the staging buffers grow to the largest op's operands
  if (rc) {
    struct ll_trainer_state st; // a step that ran before the error (max_skipped_steps) counts
    ll_trainer_state(ll_train_run_trainer(j->run), &st);
    pthread_mutex_lock(&j->mu);
    j->step = st.step;
    j->skipped = st.skipped;
    pthread_mutex_unlock(&j->mu);
    fail(j, err);
    return 0;
  }
  struct ll_trainer_state st;
  ll_trainer_state(ll_train_run_trainer(j->run), &st);
  pthread_mutex_lock(&j->mu);
  j->t_run += dt;
  j->tokens += ev.info.tokens;
  j->step = ev.info.step;
  j->epoch = ev.info.epoch;
  j->skipped = st.skipped;
  if (!ev.info.skipped) j->loss = ev.info.loss;
  j->lr = ev.info.lr;
  j->gnorm = ev.info.grad_norm;
  j->tps = j->t_run > 0 ? j->tokens / j->t_run : NAN;
  const int64_t steps_run = j->tokens / (ev.info.tokens > 0 ? ev.info.tokens : 1);
  j->eta = steps_run > 0 ? j->t_run / steps_run * (double)(j->total - j->step) : NAN;
  if (ev.evaluated) j->val = ev.val_loss;
  if (ev.saved) snprintf(j->last_ckpt, sizeof j->last_ckpt, "%s", ev.path);
  hist_add(j, ev.info.step, ev.info.skipped ? NAN : ev.info.loss, ev.evaluated ? ev.val_loss : NAN);
  if (ev.finished) j->state = ST_DONE, j->cmds &= ~(CMD_PAUSE | CMD_RESUME);
  pthread_mutex_unlock(&j->mu);
  if (ev.diverging) {
    char m[300];
    snprintf(m, sizeof m, "the loss is diverging: %.4f on average over the %d steps to step %lld, more than twice its minimum %.4f of the last %d steps (lr too high?)",
             ev.loss_mean, LL_TRAIN_DIVERGE_SMOOTH, (long long)ev.info.step, ev.loss_min, LL_TRAIN_DIVERGE_WINDOW);
    ll_log(LL_LOG_WARN, "training: %s", m);
    json_t *w = json_object();
    json_object_set_new(w, "event", json_string("warning"));
    json_object_set_new(w, "message", json_string(m));
    event_json(j, w);
  }
  if (ev.info.skipped) {
    json_t *e = json_object();
    json_object_set_new(e, "event", json_string("nan_skip"));
    json_object_set_new(e, "step", json_integer(ev.info.step));
    event_json(j, e);
  }
  if (ev.evaluated) {
    json_t *e = json_object();
    json_object_set_new(e, "event", json_string("train_eval"));
    json_object_set_new(e, "step", json_integer(ev.info.step));
    json_object_set_new(e, "loss", num_or_null(ev.info.loss));
    json_object_set_new(e, "val_loss", num_or_null(ev.val_loss));
    event_json(j, e);
  }
  if (ev.saved) {
    json_t *e = json_object();
    json_object_set_new(e, "event", json_string("checkpoint_saved"));
    json_object_set_new(e, "step", json_integer(ev.info.step));
    json_object_set_new(e, "path", json_string(ev.path));
    event_json(j, e);
  }
  if (ev.save_failed) {
    // The step stands; last.ckpt still names the previous good checkpoint; the next one retries.
    ll_log(LL_LOG_WARN, "training: checkpoint at step %lld failed: %s (training goes on; the last good checkpoint is %s)",
           (long long)ev.info.step, ev.save_error, j->last_ckpt[0] ? j->last_ckpt : "none yet");
    json_t *w = json_object();
    json_object_set_new(w, "event", json_string("warning"));
    char m[700];
    snprintf(m, sizeof m, "checkpoint at step %lld failed: %s", (long long)ev.info.step, ev.save_error);
    json_object_set_new(w, "message", json_string(m));
    event_json(j, w);
  }
  if (ev.finished) {
    json_t *e = json_object();
    json_object_set_new(e, "event", json_string("train_finished"));
    json_object_set_new(e, "step", json_integer(ev.info.step));
    json_object_set_new(e, "loss", num_or_null(ev.info.loss));
    json_object_set_new(e, "val_loss", num_or_null(ev.val_loss));
    event_json(j, e);
    ll_log(LL_LOG_INFO, "training: finished at step %lld, loss %.4f, val %.4f", (long long)ev.info.step, ev.info.loss, ev.val_loss);
    return 0;
  }
  return 1;
}

// Testing aid: LL_OPENCL_FAULT=train fails the trainer's OpenCL instance (not the serving one),
// to exercise the CPU fallback.
static int train_fault(void) {
  const char *f = getenv("LL_OPENCL_FAULT");
  return f && strcmp(f, "train") == 0;
}

// When the server serves on an OpenCL device, the trainer takes its own instance of that
// device, beside the serving one on its context and program (nothing is built or uploaded
// again). 0 with j->be set, or a negative code with why in err: the caller trains on
// the CPU instead, which must never stop serving.
static int open_device(struct ll_trainjob *j, const struct ll_backend_info *si, char *err, size_t errlen) {
  struct ll_backend *be = NULL;
  int rc = train_fault() ? ll_errf(err, errlen, LL_EIO, "LL_OPENCL_FAULT=train") : ll_backend_opencl_create_beside(&be, ll_engine_backend(j->e), err, errlen);
  if (rc) return rc;
  j->m = ll_engine_model(j->e);
  // The model's transcendentals, as the serving backend computes them; no batch invariance
  // (only requests need it; the OpenCL products do not depend on the batch anyway).
  be->ggml_math = ll_engine_backend(j->e)->ggml_math;
  be->batch_invariant = 0;
  j->be = be;
  struct ll_backend_info bi;
  be->i->get_info(be, &bi);
  snprintf(j->be_name, sizeof j->be_name, "opencl");
  snprintf(j->be_device, sizeof j->be_device, "%s", bi.device);
  snprintf(j->be_reason, sizeof j->be_reason,
           "opencl:%d:%d: the serving device, on an instance of its own beside the serving one (its queue, its buffers; the served weights shared)",
           si->cl_platform, si->cl_device);
  j->dev_bytes = bi.mem_used;
  return 0;
}

// The trainer on a CPU backend of its own (on the training thread: its pool's workers share
// the thread's lower priority). be_* change under mu (the monitor reads them).
static int use_cpu(struct ll_trainjob *j, char *err, size_t errlen) {
  // The products `llsrv train` takes, so the server trains as fast as it; the serving backend
  // keeps batch invariance for requests.
  struct ll_backend *be = NULL;
  int rc = ll_trainer_cpu_backend(&be, ll_engine_backend(j->e), j->n_threads, err, errlen);
  if (rc) return rc;
  struct ll_backend_info bi;
  be->i->get_info(be, &bi);
  pthread_mutex_lock(&j->mu);
  j->be = be;
  j->m = ll_engine_model(j->e);
  j->dev_bytes = -1;
  snprintf(j->be_name, sizeof j->be_name, "cpu");
  snprintf(j->be_device, sizeof j->be_device, "%s", bi.device);
  pthread_mutex_unlock(&j->mu);
  return 0;
}

// The training thread: its own backend (created here, so that a CPU pool's workers share this
// thread's lower priority), then commands and steps until ll_trainjob_stop.
static void *train_main(void *arg) {
  struct ll_trainjob *j = arg;
  if (j->nice > 0 && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), j->nice) != 0)
    ll_log(LL_LOG_DEBUG, "training: cannot lower the training thread's priority (nice %d)", j->nice);
  char err[256], derr[400];
  int rc = 0;
  struct ll_backend_info si;
  ll_engine_backend(j->e)->i->get_info(ll_engine_backend(j->e), &si);
  const int on_cl = strcmp(si.name, "opencl") == 0;
  if (on_cl && open_device(j, &si, derr, sizeof derr) != 0) {
    ll_log(LL_LOG_WARN, "training: on the CPU: the serving device opencl:%d:%d '%s' cannot train beside the server: %s", si.cl_platform,
           si.cl_device, si.device, derr);
    snprintf(j->be_reason, sizeof j->be_reason, "cpu: opencl:%d:%d cannot train beside the server: %s", si.cl_platform, si.cl_device, derr);
  }
  if (!j->be) {
    rc = use_cpu(j, err, sizeof err);
    if (rc == 0 && !on_cl) snprintf(j->be_reason, sizeof j->be_reason, "cpu: the serving device, on a CPU backend of its own (its pool, its scratch)");
  }
  if (rc == 0) ll_log(LL_LOG_INFO, "training: on %s; %s", j->be_device, j->be_reason);
  pthread_mutex_lock(&j->mu);
  j->init_rc = rc;
  if (rc) snprintf(j->init_err, sizeof j->init_err, "%s", err);
  j->init_done = 1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (rc) return NULL;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    while (!j->quit && !j->cmds && j->state != ST_RUNNING && !j->q_kicked) pthread_cond_wait(&j->cv, &j->mu);
    const int quit = j->quit, kicked = j->q_kicked;
    j->q_kicked = 0;
    pthread_mutex_unlock(&j->mu);
    if (quit) break;
    // Queued runs first: the configured run stands still (between two of its steps) meanwhile.
    if (kicked && j->q_fn) {
      while (j->q_fn(j->q_user, j) == 1 && !ll_trainjob_quitting(j)) {
      }
      continue;
    }
    pthread_mutex_lock(&j->mu);
    const int cmds = j->cmds;
    j->cmds = 0;
    // A pause that waited for its step takes effect here, under the lock, so that a resume
    // arriving now either cancels it (still pausing) or is queued behind it (paused).
    if ((cmds & CMD_PAUSE) && j->state == ST_PAUSING) j->state = ST_PAUSED;
    pthread_mutex_unlock(&j->mu);
    slice(j, cmds);
  }
  return NULL;
}

// ---------------------------------------------------------------- API

int ll_trainjob_create(struct ll_trainjob **out, struct ll_engine *e, struct ll_sched *s, const struct ll_config *cfg, const char *model_path,
                       const char *data, const char *run_dir, int autostart, char *err, size_t errlen) {
  *out = NULL;
  struct ll_trainjob *j = calloc(1, sizeof *j);
  if (!j) return ll_errf(err, errlen, LL_ENOMEM, "training: out of memory");
  int rc = ll_train_params_from_config(cfg, &j->tp, err, errlen);
  if (rc) {
    free(j);
    return rc;
  }
  struct ll_engine_info info;
  ll_engine_get_info(e, &info);
  j->e = e, j->s = s;
  snprintf(j->model_path, sizeof j->model_path, "%s", model_path);
  snprintf(j->data, sizeof j->data, "%s", data ? data : "");
  snprintf(j->run_dir, sizeof j->run_dir, "%s", run_dir);
  j->dev_bytes = -1;
  snprintf(j->arch, sizeof j->arch, "%s", info.arch);
  j->ro = (struct ll_train_run_opts){j->run_dir, j->data, j->model_path, j->arch, cfg->train_checkpoint_every, cfg->train_eval_every,
                                     cfg->train_eval_seqs, cfg->train_keep, cfg->train_val_fraction, 0, cfg->chat_template,
                                     cfg->train_max_skipped_steps, cfg->train_shuffle && !strcmp(cfg->train_shuffle, "pieces"), NULL,
                                     cfg->train_on_thinking};
  pthread_mutex_init(&j->mu, NULL);
  j->state = ST_OFF;
  j->total = j->tp.steps;
  j->stride = 1;
  j->loss = j->val = j->lr = j->gnorm = j->tps = j->eta = NAN;
  j->bytes = -1;
  j->cmds = autostart ? CMD_START : 0;
  j->n_threads = info.n_threads > 0 ? info.n_threads : 1;
  // Generation first: the training threads run at a lower priority, so that when both want the
  // CPU the scheduler gives training about train.share of it (CFS weights fall 1.25x per nice
  // level); with no requests they take all the idle compute.
  const double sh = j->share = cfg->train_share;
  j->nice = sh >= 0.5 ? 0 : (int)lround(log((1.0 - sh) / sh) / log(1.25));
  if (j->nice > 19) j->nice = 19;
  pthread_cond_init(&j->cv, NULL);
  if (pthread_create(&j->th, NULL, train_main, j) != 0) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "training: cannot start its thread");
  } else {
    pthread_mutex_lock(&j->mu);
    while (!j->init_done) pthread_cond_wait(&j->cv, &j->mu);
    rc = j->init_rc;
    pthread_mutex_unlock(&j->mu);
    if (rc) {
      pthread_join(j->th, NULL);
      rc = ll_errf(err, errlen, rc, "training: %s", j->init_err);
    } else {
      j->th_started = 1;
    }
  }
  if (rc) {
    ll_trainjob_destroy(j);
    return rc;
  }
  ll_sched_set_background(s, compute_slice, j, 1.0);
  if (j->tp.mode == LL_TRAIN_FULL)
    ll_sched_live_reason(s, "this run trains every weight (train.mode: full): the trained weights are the served model itself, "
                            "so send no adapter (or adapter=none)");
  *out = j;
  return 0;
}

int ll_trainjob_stop(struct ll_trainjob *j) {
  if (!j || !j->th_started) return 0;
  pthread_mutex_lock(&j->mu);
  __atomic_store_n(&j->quit, 1, __ATOMIC_RELAXED); // train_yield reads it without the lock
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  pthread_join(j->th, NULL); // ends after its current step (whose update the compute thread runs)
  j->th_started = 0;
  // This thread owns the run now. A running job keeps its work.
  int rc = 0;
  if (j->run && (j->state == ST_RUNNING || j->state == ST_PAUSED || j->state == ST_PAUSING)) {
    char err[512];
    struct ll_train_run_event ev;
    if ((rc = ll_train_run_save(j->run, &ev, err, sizeof err)) == 0) ll_log(LL_LOG_INFO, "training: saved %s at shutdown", ev.path);
    else
      ll_log(LL_LOG_ERROR, "training: the shutdown checkpoint failed: %s (the work since %s is lost)", err,
             j->last_ckpt[0] ? j->last_ckpt : "the start");
  }
  ll_sched_set_background(j->s, NULL, NULL, 0);
  return rc;
}

void ll_trainjob_destroy(struct ll_trainjob *j) {
  if (!j) return;
  ll_trainjob_stop(j);
  ll_train_run_close(j->run);
  ll_backend_free(j->be); // an OpenCL instance: its buffers (the served weights are the engine's)
  for (int i = 0; i < j->n_evq; i++) free(j->evq[i]);
  free(j->evq);
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

int ll_trainjob_control(struct ll_trainjob *j, const char *cmd, char *msg, size_t cap) {
  int bit = !strcmp(cmd, "start") ? CMD_START : !strcmp(cmd, "pause") ? CMD_PAUSE : !strcmp(cmd, "resume") ? CMD_RESUME
            : !strcmp(cmd, "stop") ? CMD_STOP : !strcmp(cmd, "save") ? CMD_SAVE : 0;
  if (!bit) return ll_errf(msg, cap, LL_EINVAL, "unknown training command '%.32s' (start, pause, resume, stop, save)", cmd);
  pthread_mutex_lock(&j->mu);
  const int st = j->state, pending_start = (j->cmds & CMD_START) || st == ST_STARTING;
  int rc = 0;
  if (bit == CMD_START && (st == ST_RUNNING || st == ST_PAUSED || st == ST_PAUSING || st == ST_STARTING))
    rc = ll_errf(msg, cap, LL_ESTATE, "training is already %s", state_names[st]);
  else if (bit == CMD_START && st == ST_DONE) rc = ll_errf(msg, cap, LL_ESTATE, "training is done (all %lld steps ran)", (long long)j->total);
  else if (bit == CMD_PAUSE && st == ST_PAUSING) rc = 0; // already asked for: the same answer again
  else if (bit == CMD_PAUSE && st != ST_RUNNING && !pending_start) rc = ll_errf(msg, cap, LL_ESTATE, "training is %s, not running", state_names[st]);
  else if (bit == CMD_RESUME && st != ST_PAUSED && st != ST_PAUSING)
    rc = ll_errf(msg, cap, LL_ESTATE, "training is %s, not paused", state_names[st]);
  else if (bit == CMD_STOP && st != ST_RUNNING && st != ST_PAUSED && st != ST_PAUSING && !pending_start)
    rc = ll_errf(msg, cap, LL_ESTATE, "training is %s", state_names[st]);
  else if (bit == CMD_SAVE && st == ST_OFF && !pending_start) rc = ll_errf(msg, cap, LL_ESTATE, "no training run to save (train start first)");
  if (rc == 0 && bit == CMD_RESUME && st == ST_PAUSING) {
    // The step has not ended yet: the pending pause is cancelled and it never stops.
    j->cmds &= ~CMD_PAUSE;
    j->state = ST_RUNNING;
  } else if (rc == 0) {
    j->cmds |= bit;
    // Paused for the monitor from now on; the step in flight finishes first.
    if (bit == CMD_PAUSE && st == ST_RUNNING) j->state = ST_PAUSING;
    if (bit == CMD_PAUSE) j->cmds &= ~CMD_RESUME;
    if (bit == CMD_RESUME) j->cmds &= ~CMD_PAUSE;
  }
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  return rc;
}

json_t *ll_trainjob_json(struct ll_trainjob *j) {
  json_t *tr = json_object();
  pthread_mutex_lock(&j->mu);
  json_object_set_new(tr, "state", json_string(state_names[j->state]));
  const int on = j->state != ST_OFF && j->state != ST_STARTING; // a run opening has no step yet
  json_object_set_new(tr, "step", on ? json_integer(j->step) : json_null());
  json_object_set_new(tr, "total_steps", json_integer(j->total));
  json_object_set_new(tr, "epoch", on ? json_integer(j->epoch) : json_null());
  json_object_set_new(tr, "loss", num_or_null(j->loss));
  json_object_set_new(tr, "val_loss", num_or_null(j->val));
  json_object_set_new(tr, "lr", num_or_null(j->lr));
  json_object_set_new(tr, "grad_norm", num_or_null(j->gnorm));
  json_object_set_new(tr, "tokens_per_s", num_or_null(j->tps));
  json_object_set_new(tr, "eta_s", j->state == ST_RUNNING ? num_or_null(j->eta) : json_null());
  json_object_set_new(tr, "last_checkpoint", j->last_ckpt[0] ? json_string(j->last_ckpt) : json_null());
  json_object_set_new(tr, "skipped_steps", on ? json_integer(j->skipped) : json_null());
  json_object_set_new(tr, "run_dir", json_string(j->run_dir));
  json_object_set_new(tr, "backend", json_string(j->be_name));
  json_object_set_new(tr, "device", json_string(j->be_device));
  json_object_set_new(tr, "device_reason", json_string(j->be_reason));
  if (j->state == ST_ERROR) json_object_set_new(tr, "error", json_string(j->error));
  json_object_set_new(tr, "yielded_to", j->yielded_to[0] ? json_string(j->yielded_to) : json_null());
  json_t *h = json_array();
  for (int i = 0; i < j->n_hist; i++) {
    json_t *p = json_array();
    json_array_append_new(p, json_integer(j->hist[i].step));
    json_array_append_new(p, num_or_null(j->hist[i].loss));
    json_array_append_new(p, num_or_null(j->hist[i].val));
    json_array_append_new(h, p);
  }
  pthread_mutex_unlock(&j->mu);
  json_object_set_new(tr, "history", h);
  json_object_set_new(tr, "history_tail", json_false()); // always the whole (downsampled) curve
  return tr;
}

int64_t ll_trainjob_device_bytes(struct ll_trainjob *j) {
  pthread_mutex_lock(&j->mu);
  int64_t b = j->dev_bytes;
  pthread_mutex_unlock(&j->mu);
  return b;
}

void ll_trainjob_describe(struct ll_trainjob *j, char *out, size_t cap) {
  pthread_mutex_lock(&j->mu);
  snprintf(out, cap, "%s: %s; %s", j->be_name, j->be_device, j->be_reason);
  pthread_mutex_unlock(&j->mu);
}

int64_t ll_trainjob_bytes(struct ll_trainjob *j) {
  pthread_mutex_lock(&j->mu);
  int64_t b = j->bytes;
  pthread_mutex_unlock(&j->mu);
  return b;
}

// ---------------------------------------------------------------- the queue of other runs

void ll_trainjob_set_queue(struct ll_trainjob *j, int (*fn)(void *user, struct ll_trainjob *j), void *user) {
  pthread_mutex_lock(&j->mu);
  j->q_fn = fn, j->q_user = user;
  pthread_mutex_unlock(&j->mu);
}

void ll_trainjob_kick(struct ll_trainjob *j) {
  pthread_mutex_lock(&j->mu);
  j->q_kicked = 1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

int ll_trainjob_quitting(const struct ll_trainjob *j) { return __atomic_load_n(&j->quit, __ATOMIC_RELAXED); }
struct ll_backend *ll_trainjob_backend(struct ll_trainjob *j) { return j->be; }
const struct ll_model *ll_trainjob_model(struct ll_trainjob *j) { return j->m; }
int ll_trainjob_on_compute(struct ll_trainjob *j, int (*fn)(void *), void *arg) { return on_compute(j, fn, arg); }

void ll_trainjob_hooks(struct ll_trainjob *j, struct ll_trainer *tr) {
  ll_trainer_set_update_hook(tr, update_hook, j);
  ll_trainer_set_yield_hook(tr, train_yield, j);
}

void ll_trainjob_yield_to(struct ll_trainjob *j, const char *name) {
  pthread_mutex_lock(&j->mu);
  snprintf(j->yielded_to, sizeof j->yielded_to, "%s", name ? name : "");
  pthread_mutex_unlock(&j->mu);
}
