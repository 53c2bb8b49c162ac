// ftjobs.c - OpenAI's fine-tuning API: files, jobs, their events and checkpoints (ll_ftjobs.h).
#include "ll_ftjobs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ll_chat.h"
#include "ll_config.h"
#include "ll_data.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_fileio.h"
#include "ll_log.h"
#include "ll_lora.h"
#include "ll_multipart.h"
#include "ll_proto.h"
#include "ll_sched.h"
#include "ll_train_run.h"
#include "ll_trainer.h"
#include "ll_trainjob.h"

#define FT_MAX_FILES 1024
#define FT_MAX_JOBS 1024
#define FT_MAX_EVENTS 4096       // per job; the oldest go first
#define FT_MAX_CKPTS 256         // per job
#define FT_MAX_RECORD (16 << 20) // bytes of a job's record read back
#define FT_MAX_SUFFIX 40
#define FT_MAX_EPOCHS 50
#define FT_MAX_BATCH 256
#define FT_AUTO_EPOCHS 3
#define FT_HEX 24 // random hex digits of an id

enum ft_status { FT_VALIDATING, FT_QUEUED, FT_RUNNING, FT_SUCCEEDED, FT_FAILED, FT_CANCELLED, FT_N_STATUS };
static const char *const k_status[FT_N_STATUS] = {"validating_files", "queued", "running", "succeeded", "failed", "cancelled"};
_Static_assert(FT_N_STATUS == LL_FTJOBS_N_STATUS, "ll_ftjobs_stats.jobs has a slot per status");

struct ft_file {
  char id[8 + FT_HEX];
  char filename[256];
  int64_t bytes, created_at;
  int64_t examples;
};

struct ft_event {
  char id[64];
  int64_t created_at;
  int level;   // 0 info, 1 warn, 2 error
  int metrics; // a step's figures (type "metrics"), else a message
  char *message;
  int64_t step;
  double train_loss, valid_loss; // NaN: none
};

struct ft_ckpt {
  char id[64];
  int64_t created_at, step;
  double train_loss, valid_loss;
};

struct ft_job {
  char id[8 + FT_HEX];
  char model[128], suffix[FT_MAX_SUFFIX + 1], training_file[8 + FT_HEX];
  char ft_model[LL_ADAPTER_NAME_MAX + 1]; // the name its model is served under (once succeeded)
  int status;
  int validating; // the worker is validating its file now
  int64_t created_at, finished_at, seed;
  int64_t seq; // creation order (created_at has seconds only)
  // Hyperparameters as asked (0: auto) and as resolved when the file was validated (0: not yet).
  int64_t req_epochs, req_batch;
  double req_lrm;
  int64_t n_epochs, batch, steps, steps_per_epoch;
  double lrm;
  int64_t step, trained_tokens;
  double last_loss; // of its last step (NaN: none yet; not kept across a restart)
  char err_code[48], err_param[32], err_msg[640];
  struct ft_event *ev;
  int n_ev, cap_ev;
  int64_t next_ev;
  struct ft_ckpt ck[FT_MAX_CKPTS];
  int n_ck;
  struct ll_lora *lora; // its model, served (succeeded)
  int dirty;            // the record on disk is older than this
};

struct upload { // an upload on its way through the worker
  struct upload *next;
  char *data;
  size_t len;
  char filename[256];
  ll_ftjobs_reply_fn fn;
  void *ctx;
  int status;
  json_t *reply;
};

struct ll_ftjobs {
  struct ll_ftjobs_env env;
  char dir[1024], files_dir[1100], jobs_dir[1100];
  char base_id[128];
  char *tmpl_setting; // the chat template runs read (ll_train_run_opts.chat_template); NULL: the model's
  char *tmpl_text;    // the template records are checked with (a built-in name or template text)
  const struct ll_tokenizer *tok;
  pthread_mutex_t mu;
  pthread_cond_t cv; // the worker waits here
  struct ft_file **files;
  int n_files;
  struct ft_job **jobs; // in creation order
  int n_jobs;
  struct upload *uploads, *done; // to the worker / back to the loop
  char **unlinks;                // paths the worker removes
  int n_unlinks;
  int work;  // something for the worker (dirty records, validations)
  int quit;
  pthread_t th;
  int th_started;
  uv_async_t async;
  int async_ready;
};

static int64_t now_unix(void) { return (int64_t)time(NULL); }

static void rand_hex(char *out, int n) {
  unsigned char b[FT_HEX];
  if (getrandom(b, (size_t)(n + 1) / 2, 0) != (ssize_t)((n + 1) / 2)) {
    struct timespec ts; // no entropy source: unique enough within this state directory
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 48);
    for (int i = 0; i < (n + 1) / 2; i++) x = x * 6364136223846793005ull + 1442695040888963407ull, b[i] = (unsigned char)(x >> 56);
  }
  static const char hx[] = "0123456789abcdef";
  for (int i = 0; i < n; i++) out[i] = hx[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
  out[n] = 0;
}

// An id we made: prefix, then FT_HEX lowercase hex digits.
static int id_ok(const char *s, size_t n, const char *prefix) {
  const size_t pl = strlen(prefix);
  if (n != pl + FT_HEX || memcmp(s, prefix, pl) != 0) return 0;
  for (size_t i = pl; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

// ---------------------------------------------------------------- files on disk

// Atomic publication: "<path>.tmp.XXXXXX" (flock held), fsync, rename, fsync the directory.
static int write_atomic(const char *path, const char *data, size_t len, char *err, size_t errlen) {
  char tmp[1200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp) return ll_errf(err, errlen, LL_ELIMIT, "%s: path too long", path);
  ll_tmp_sweep(path);
  int fd = mkstemp(tmp);
  if (fd < 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", tmp, strerror(errno));
  int hold = ll_tmp_hold(fd);
  int rc = 0;
  if (ll_write_all(fd, data, len) != 0 || fsync(fd) != 0) rc = ll_errf(err, errlen, LL_EIO, "%s: %s", tmp, strerror(errno));
  if (close(fd) != 0 && !rc) rc = ll_errf(err, errlen, LL_EIO, "%s: %s", tmp, strerror(errno));
  if (!rc && rename(tmp, path) != 0) rc = ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  if (rc) unlink(tmp);
  else ll_fsync_parent_dir(path);
  ll_tmp_release(hold);
  return rc;
}

// A whole file of at most cap bytes, NUL-terminated; NULL with why in err.
static char *read_small(const char *path, size_t cap, size_t *len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  char *b = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > cap) {
    ll_errf(err, errlen, LL_ELIMIT, "%s: not a regular file of at most %zu bytes", path, cap);
  } else if (!(b = malloc((size_t)st.st_size + 1))) {
    ll_errf(err, errlen, LL_ENOMEM, "%s: out of memory", path);
  } else {
    size_t got = 0;
    while (got < (size_t)st.st_size) {
      ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (got != (size_t)st.st_size) {
      ll_errf(err, errlen, LL_EIO, "%s: short read", path);
      free(b);
      b = NULL;
    } else {
      b[got] = 0;
      *len = got;
    }
  }
  close(fd);
  return b;
}

static void file_path(const struct ll_ftjobs *f, const char *id, const char *ext, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s%s", f->files_dir, id, ext);
}
static void job_path(const struct ll_ftjobs *f, const char *id, const char *ext, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s%s", f->jobs_dir, id, ext);
}

// ---------------------------------------------------------------- JSON of the API's objects (under mu)

static json_t *file_json(const struct ft_file *fl) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(fl->id));
  json_object_set_new(o, "object", json_string("file"));
  json_object_set_new(o, "bytes", json_integer(fl->bytes));
  json_object_set_new(o, "created_at", json_integer(fl->created_at));
  json_object_set_new(o, "filename", json_string(fl->filename));
  json_object_set_new(o, "purpose", json_string("fine-tune"));
  json_object_set_new(o, "status", json_string("processed"));
  json_object_set_new(o, "status_details", json_null());
  return o;
}

static json_t *auto_or_int(int64_t asked, int64_t resolved) {
  if (resolved > 0) return json_integer(resolved);
  return asked > 0 ? json_integer(asked) : json_string("auto");
}

static json_t *job_json(const struct ft_job *j) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(j->id));
  json_object_set_new(o, "object", json_string("fine_tuning.job"));
  json_object_set_new(o, "model", json_string(j->model));
  json_object_set_new(o, "created_at", json_integer(j->created_at));
  json_object_set_new(o, "finished_at", j->finished_at ? json_integer(j->finished_at) : json_null());
  json_object_set_new(o, "fine_tuned_model", j->status == FT_SUCCEEDED ? json_string(j->ft_model) : json_null());
  json_object_set_new(o, "organization_id", json_string("llsrv"));
  json_object_set_new(o, "result_files", json_array());
  json_object_set_new(o, "status", json_string(k_status[j->status]));
  json_object_set_new(o, "validation_file", json_null());
  json_object_set_new(o, "training_file", json_string(j->training_file));
  json_t *hp = json_object();
  json_object_set_new(hp, "n_epochs", auto_or_int(j->req_epochs, j->n_epochs));
  json_object_set_new(hp, "batch_size", auto_or_int(j->req_batch, j->batch));
  json_object_set_new(hp, "learning_rate_multiplier", j->lrm > 0 ? json_real(j->lrm) : j->req_lrm > 0 ? json_real(j->req_lrm) : json_string("auto"));
  json_t *meth = json_object(), *sup = json_object();
  json_object_set_new(sup, "hyperparameters", json_deep_copy(hp));
  json_object_set_new(meth, "type", json_string("supervised"));
  json_object_set_new(meth, "supervised", sup);
  json_object_set_new(o, "hyperparameters", hp);
  json_object_set_new(o, "method", meth);
  json_object_set_new(o, "trained_tokens", j->status == FT_SUCCEEDED ? json_integer(j->trained_tokens) : json_null());
  if (j->err_code[0]) {
    json_t *e = json_object();
    json_object_set_new(e, "code", json_string(j->err_code));
    json_object_set_new(e, "message", json_string(j->err_msg));
    json_object_set_new(e, "param", j->err_param[0] ? json_string(j->err_param) : json_null());
    json_object_set_new(o, "error", e);
  } else {
    json_object_set_new(o, "error", json_null());
  }
  json_object_set_new(o, "seed", json_integer(j->seed));
  json_object_set_new(o, "estimated_finish", json_null());
  json_object_set_new(o, "integrations", json_array());
  json_object_set_new(o, "user_provided_suffix", j->suffix[0] ? json_string(j->suffix) : json_null());
  // llsrv's own: progress in optimizer steps.
  json_object_set_new(o, "step", json_integer(j->step));
  json_object_set_new(o, "total_steps", j->steps ? json_integer(j->steps) : json_null());
  return o;
}

static const char *const k_level[3] = {"info", "warn", "error"};

static json_t *event_json(const struct ft_event *e) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(e->id));
  json_object_set_new(o, "object", json_string("fine_tuning.job.event"));
  json_object_set_new(o, "created_at", json_integer(e->created_at));
  json_object_set_new(o, "level", json_string(k_level[e->level]));
  json_object_set_new(o, "message", json_string(e->message ? e->message : ""));
  json_object_set_new(o, "type", json_string(e->metrics ? "metrics" : "message"));
  if (e->metrics) {
    json_t *d = json_object();
    json_object_set_new(d, "step", json_integer(e->step));
    json_object_set_new(d, "train_loss", num_or_null(e->train_loss));
    json_object_set_new(d, "valid_loss", num_or_null(e->valid_loss));
    json_object_set_new(o, "data", d);
  } else {
    json_object_set_new(o, "data", json_null());
  }
  return o;
}

static json_t *ckpt_json(const struct ft_job *j, const struct ft_ckpt *c) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(c->id));
  json_object_set_new(o, "object", json_string("fine_tuning.job.checkpoint"));
  json_object_set_new(o, "created_at", json_integer(c->created_at));
  char name[LL_ADAPTER_NAME_MAX + 32];
  snprintf(name, sizeof name, "%s:ckpt-step-%lld", j->ft_model, (long long)c->step);
  json_object_set_new(o, "fine_tuned_model_checkpoint", json_string(name));
  json_object_set_new(o, "step_number", json_integer(c->step));
  json_t *m = json_object();
  json_object_set_new(m, "step", json_integer(c->step));
  json_object_set_new(m, "train_loss", num_or_null(c->train_loss));
  json_object_set_new(m, "valid_loss", num_or_null(c->valid_loss));
  json_object_set_new(o, "metrics", m);
  json_object_set_new(o, "fine_tuning_job_id", json_string(j->id));
  return o;
}

// ---------------------------------------------------------------- events (under mu)

static void add_event(struct ft_job *j, int level, int metrics, int64_t step, double tl, double vl, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void add_event(struct ft_job *j, int level, int metrics, int64_t step, double tl, double vl, const char *fmt, ...) {
  char msg[800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (j->n_ev == FT_MAX_EVENTS) { // the oldest goes
    free(j->ev[0].message);
    memmove(j->ev, j->ev + 1, (size_t)(j->n_ev - 1) * sizeof *j->ev);
    j->n_ev--;
  }
  if (j->n_ev == j->cap_ev) {
    int cap = j->cap_ev ? 2 * j->cap_ev : 16;
    struct ft_event *v = realloc(j->ev, (size_t)cap * sizeof *v);
    if (!v) return;
    j->ev = v, j->cap_ev = cap;
  }
  struct ft_event *e = &j->ev[j->n_ev];
  memset(e, 0, sizeof *e);
  e->message = strdup(msg);
  if (!e->message) return;
  snprintf(e->id, sizeof e->id, "ftevent-%.12s-%lld", j->id + 6, (long long)j->next_ev++);
  e->created_at = now_unix();
  e->level = level, e->metrics = metrics, e->step = step, e->train_loss = tl, e->valid_loss = vl;
  j->n_ev++;
  j->dirty = 1;
}

// ---------------------------------------------------------------- records (persistence)

static json_t *job_record(const struct ft_job *j) {
  json_t *r = json_object();
  json_object_set_new(r, "version", json_integer(1));
  json_object_set_new(r, "job", job_json(j));
  json_t *p = json_object();
  json_object_set_new(p, "req_epochs", json_integer(j->req_epochs));
  json_object_set_new(p, "req_batch", json_integer(j->req_batch));
  json_object_set_new(p, "req_lrm", json_real(j->req_lrm));
  json_object_set_new(p, "n_epochs", json_integer(j->n_epochs));
  json_object_set_new(p, "batch", json_integer(j->batch));
  json_object_set_new(p, "lrm", json_real(j->lrm));
  json_object_set_new(p, "steps", json_integer(j->steps));
  json_object_set_new(p, "steps_per_epoch", json_integer(j->steps_per_epoch));
  json_object_set_new(p, "step", json_integer(j->step));
  json_object_set_new(p, "trained_tokens", json_integer(j->trained_tokens));
  json_object_set_new(p, "ft_model", json_string(j->ft_model));
  json_object_set_new(p, "next_event", json_integer(j->next_ev));
  json_object_set_new(p, "seq", json_integer(j->seq));
  json_object_set_new(r, "llsrv", p);
  json_t *ev = json_array();
  for (int i = 0; i < j->n_ev; i++) json_array_append_new(ev, event_json(&j->ev[i]));
  json_object_set_new(r, "events", ev);
  json_t *ck = json_array();
  for (int i = 0; i < j->n_ck; i++) json_array_append_new(ck, ckpt_json(j, &j->ck[i]));
  json_object_set_new(r, "checkpoints", ck);
  return r;
}

// Strict readers of a record's members: a missing or mistyped member fails the record.
static int rd_str(json_t *o, const char *k, char *out, size_t cap, int allow_null) {
  json_t *v = json_object_get(o, k);
  if (allow_null && (!v || json_is_null(v))) {
    out[0] = 0;
    return 0;
  }
  if (!json_is_string(v) || json_string_length(v) >= cap || memchr(json_string_value(v), 0, json_string_length(v))) return -1;
  memcpy(out, json_string_value(v), json_string_length(v) + 1);
  return 0;
}
static int rd_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, int allow_null) {
  json_t *v = json_object_get(o, k);
  if (allow_null && (!v || json_is_null(v))) {
    *out = 0;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) return -1;
  *out = json_integer_value(v);
  return 0;
}
static int rd_num(json_t *o, const char *k, double *out) { // null: NaN
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    *out = NAN;
    return 0;
  }
  if (!json_is_number(v)) return -1;
  *out = json_number_value(v);
  return isfinite(*out) ? 0 : -1;
}

static int status_of(const char *s) {
  for (int i = 0; i < FT_N_STATUS; i++)
    if (!strcmp(k_status[i], s)) return i;
  return -1;
}

static int job_from_record(json_t *r, struct ft_job *j, char *why, size_t cap) {
  const int64_t BIG = (int64_t)1 << 50;
  json_t *o = json_object_get(r, "job"), *p = json_object_get(r, "llsrv"), *ev = json_object_get(r, "events"), *ck = json_object_get(r, "checkpoints");
  char st[32], tmp[16];
  int64_t ver = 0;
  if (rd_int(r, "version", 1, 1, &ver, 0) || !json_is_object(o) || !json_is_object(p) || !json_is_array(ev) || !json_is_array(ck))
    return ll_errf(why, cap, LL_EFORMAT, "not a job record of version 1");
  if (rd_str(o, "id", j->id, sizeof j->id, 0) || !id_ok(j->id, strlen(j->id), "ftjob-")) return ll_errf(why, cap, LL_EFORMAT, "bad id");
  if (rd_str(o, "model", j->model, sizeof j->model, 0) || rd_str(o, "training_file", j->training_file, sizeof j->training_file, 0) ||
      !id_ok(j->training_file, strlen(j->training_file), "file-") || rd_str(o, "user_provided_suffix", j->suffix, sizeof j->suffix, 1) ||
      rd_str(o, "status", st, sizeof st, 0) || (j->status = status_of(st)) < 0 || rd_int(o, "created_at", 0, BIG, &j->created_at, 0) ||
      rd_int(o, "finished_at", 0, BIG, &j->finished_at, 1) || rd_int(o, "seed", 0, BIG, &j->seed, 0))
    return ll_errf(why, cap, LL_EFORMAT, "a field of \"job\" is missing or out of range");
  json_t *e = json_object_get(o, "error");
  if (json_is_object(e) && (rd_str(e, "code", j->err_code, sizeof j->err_code, 0) || rd_str(e, "message", j->err_msg, sizeof j->err_msg, 0) ||
                            rd_str(e, "param", j->err_param, sizeof j->err_param, 1)))
    return ll_errf(why, cap, LL_EFORMAT, "bad \"error\"");
  if (rd_int(p, "req_epochs", 0, FT_MAX_EPOCHS, &j->req_epochs, 0) || rd_int(p, "req_batch", 0, FT_MAX_BATCH, &j->req_batch, 0) ||
      rd_num(p, "req_lrm", &j->req_lrm) || rd_int(p, "n_epochs", 0, FT_MAX_EPOCHS, &j->n_epochs, 0) ||
      rd_int(p, "batch", 0, FT_MAX_BATCH, &j->batch, 0) || rd_num(p, "lrm", &j->lrm) || rd_int(p, "steps", 0, BIG, &j->steps, 0) ||
      rd_int(p, "steps_per_epoch", 0, BIG, &j->steps_per_epoch, 0) || rd_int(p, "step", 0, BIG, &j->step, 0) ||
      rd_int(p, "trained_tokens", 0, BIG, &j->trained_tokens, 0) || rd_str(p, "ft_model", j->ft_model, sizeof j->ft_model, 0) ||
      rd_int(p, "next_event", 0, BIG, &j->next_ev, 0) || rd_int(p, "seq", 0, BIG, &j->seq, 0) || j->req_lrm < 0 || j->req_lrm > 10 || j->lrm < 0 || j->lrm > 10)
    return ll_errf(why, cap, LL_EFORMAT, "a field of \"llsrv\" is missing or out of range");
  if (ll_adapter_name_check(j->ft_model, strlen(j->ft_model)) != 0) return ll_errf(why, cap, LL_EFORMAT, "bad model name");
  size_t ne = json_array_size(ev);
  if (ne > FT_MAX_EVENTS || json_array_size(ck) > FT_MAX_CKPTS) return ll_errf(why, cap, LL_ELIMIT, "too many events or checkpoints");
  j->ev = ne ? calloc(ne, sizeof *j->ev) : NULL;
  if (ne && !j->ev) return ll_errf(why, cap, LL_ENOMEM, "out of memory");
  j->cap_ev = (int)ne;
  for (size_t i = 0; i < ne; i++) {
    json_t *x = json_array_get(ev, i), *d = json_object_get(x, "data");
    struct ft_event *t = &j->ev[j->n_ev];
    char msg[800], lv[8];
    int64_t lvl = -1;
    if (!json_is_object(x) || rd_str(x, "id", t->id, sizeof t->id, 0) || rd_int(x, "created_at", 0, BIG, &t->created_at, 0) ||
        rd_str(x, "message", msg, sizeof msg, 0) || rd_str(x, "level", lv, sizeof lv, 0) || rd_str(x, "type", tmp, sizeof tmp, 0))
      return ll_errf(why, cap, LL_EFORMAT, "event %zu is malformed", i);
    for (int k = 0; k < 3; k++)
      if (!strcmp(lv, k_level[k])) lvl = k;
    if (lvl < 0) return ll_errf(why, cap, LL_EFORMAT, "event %zu: bad level", i);
    t->level = (int)lvl;
    t->metrics = !strcmp(tmp, "metrics");
    t->train_loss = t->valid_loss = NAN;
    if (t->metrics && (!json_is_object(d) || rd_int(d, "step", 0, BIG, &t->step, 0) || rd_num(d, "train_loss", &t->train_loss) ||
                       rd_num(d, "valid_loss", &t->valid_loss)))
      return ll_errf(why, cap, LL_EFORMAT, "event %zu: bad data", i);
    if (!(t->message = strdup(msg))) return ll_errf(why, cap, LL_ENOMEM, "out of memory");
    j->n_ev++;
  }
  for (size_t i = 0; i < json_array_size(ck); i++) {
    json_t *x = json_array_get(ck, i), *m = json_object_get(x, "metrics");
    struct ft_ckpt *c = &j->ck[j->n_ck];
    if (!json_is_object(x) || !json_is_object(m) || rd_str(x, "id", c->id, sizeof c->id, 0) ||
        rd_int(x, "created_at", 0, BIG, &c->created_at, 0) || rd_int(x, "step_number", 0, BIG, &c->step, 0) ||
        rd_num(m, "train_loss", &c->train_loss) || rd_num(m, "valid_loss", &c->valid_loss))
      return ll_errf(why, cap, LL_EFORMAT, "checkpoint %zu is malformed", i);
    j->n_ck++;
  }
  return 0;
}

static void job_free(struct ft_job *j) {
  if (!j) return;
  for (int i = 0; i < j->n_ev; i++) free(j->ev[i].message);
  free(j->ev);
  free(j);
}

// ---------------------------------------------------------------- upload validation (worker)

// Every line a record the trainer's data reader takes (ll_data_record_parse); the first bad
// one named. 0 with *examples, or an error message.
static int validate_jsonl(struct ll_ftjobs *f, const char *d, size_t n, int64_t *examples, char *msg, size_t cap) {
  *examples = 0;
  size_t line = 1;
  for (size_t i = 0; i < n; line++) {
    const char *nl = memchr(d + i, '\n', n - i);
    size_t ln = nl ? (size_t)(nl - (d + i)) : n - i;
    struct ll_data_record rec;
    char e2[400];
    int rc = ll_data_record_parse(d + i, ln, f->tmpl_text, 0, &rec, e2, sizeof e2);
    if (rc < 0) return ll_errf(msg, cap, rc, "Invalid file format: line %zu: %s", line, e2);
    if (rc == 0) {
      (*examples)++;
      ll_data_record_free(&rec);
    }
    i += ln + (nl ? 1 : 0);
  }
  if (*examples == 0) return ll_errf(msg, cap, LL_EFORMAT, "Invalid file format: the file has no training examples (JSONL, one {\"messages\": [...]} per line)");
  return 0;
}

static json_t *err_body(int status, const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static json_t *err_body(int status, const char *code, const char *param, const char *fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ll_http_error_object(status, code, param, msg);
}

static void do_upload(struct ll_ftjobs *f, struct upload *u) {
  char msg[700];
  int64_t examples = 0;
  if (validate_jsonl(f, u->data, u->len, &examples, msg, sizeof msg) != 0) {
    u->status = 400;
    u->reply = err_body(400, "invalid_file_format", "file", "%s", msg);
    return;
  }
  struct ft_file *fl = calloc(1, sizeof *fl);
  if (!fl) {
    u->status = 500;
    u->reply = err_body(500, "internal", NULL, "out of memory");
    return;
  }
  char id[FT_HEX + 1], path[1200], err[600];
  rand_hex(id, FT_HEX);
  snprintf(fl->id, sizeof fl->id, "file-%s", id);
  snprintf(fl->filename, sizeof fl->filename, "%s", u->filename);
  fl->bytes = (int64_t)u->len;
  fl->created_at = now_unix();
  fl->examples = examples;
  json_t *meta = file_json(fl);
  json_object_set_new(meta, "examples", json_integer(examples));
  char *mtxt = json_dumps(meta, JSON_COMPACT);
  json_decref(meta);
  file_path(f, fl->id, ".jsonl", path, sizeof path);
  int rc = mtxt ? write_atomic(path, u->data, u->len, err, sizeof err) : ll_errf(err, sizeof err, LL_ENOMEM, "out of memory");
  if (rc == 0) {
    char mp[1200];
    file_path(f, fl->id, ".json", mp, sizeof mp); // the record last: it commits the file
    rc = write_atomic(mp, mtxt, strlen(mtxt), err, sizeof err);
    if (rc) unlink(path);
  }
  free(mtxt);
  if (rc) {
    ll_log(LL_LOG_ERROR, "fine-tuning: cannot store an upload: %s", err);
    u->status = 500;
    u->reply = err_body(500, "internal", NULL, "cannot store the file: %s", err);
    free(fl);
    return;
  }
  pthread_mutex_lock(&f->mu);
  struct ft_file **v = f->n_files < FT_MAX_FILES ? realloc(f->files, (size_t)(f->n_files + 1) * sizeof *v) : NULL;
  if (v) f->files = v, f->files[f->n_files++] = fl;
  u->status = v ? 200 : 500;
  u->reply = v ? file_json(fl) : err_body(500, "internal", NULL, "out of memory");
  pthread_mutex_unlock(&f->mu);
  if (!v) free(fl);
  else ll_log(LL_LOG_INFO, "fine-tuning: stored %s (%s, %zu bytes, %lld examples)", fl->id, fl->filename, u->len, (long long)examples);
}

// ---------------------------------------------------------------- file validation of a job (worker)

static void job_fail(struct ft_job *j, const char *code, const char *param, const char *msg) { // under mu
  j->status = FT_FAILED;
  j->finished_at = now_unix();
  snprintf(j->err_code, sizeof j->err_code, "%s", code);
  snprintf(j->err_param, sizeof j->err_param, "%s", param ? param : "");
  snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
  add_event(j, 2, 0, 0, NAN, NAN, "Fine-tuning job failed: %s", msg);
  j->dirty = 1;
  ll_log(LL_LOG_WARN, "fine-tuning: %s failed: %s", j->id, msg);
}

// validating_files -> queued: the file is read as the run will read it (ll_data_open: the
// chat template, enough tokens for one sequence), which also gives the sequences per epoch
// that n_epochs and batch_size "auto" resolve from.
static void validate_job(struct ll_ftjobs *f, struct ft_job *j) {
  pthread_mutex_lock(&f->mu);
  char fid[sizeof j->training_file];
  snprintf(fid, sizeof fid, "%s", j->training_file);
  const int64_t req_epochs = j->req_epochs, req_batch = j->req_batch, seed = j->seed;
  const double req_lrm = j->req_lrm;
  pthread_mutex_unlock(&f->mu);
  const struct ll_config *cfg = f->env.cfg;
  char path[1200], err[700];
  file_path(f, fid, ".jsonl", path, sizeof path);
  struct ll_data_params dp;
  ll_data_params_init(&dp);
  dp.path = path;
  dp.seq_len = (int)cfg->train_seq_len;
  dp.val_fraction = cfg->train_val_fraction;
  dp.seed = (uint64_t)seed;
  dp.chat_template = f->tmpl_text;
  dp.train_on_thinking = cfg->train_on_thinking;
  struct ll_data *d = NULL;
  int rc = ll_data_open(&d, &dp, f->tok, err, sizeof err);
  struct ll_data_stats st;
  if (rc == 0) ll_data_stats(d, &st);
  ll_data_close(d);
  pthread_mutex_lock(&f->mu);
  j->validating = 0;
  if (j->status != FT_VALIDATING) { // cancelled meanwhile
    pthread_mutex_unlock(&f->mu);
    return;
  }
  if (rc) {
    job_fail(j, "invalid_training_file", "training_file", err);
  } else {
    const int64_t seqs = st.seqs_per_epoch > 0 ? st.seqs_per_epoch : 1;
    j->n_epochs = req_epochs ? req_epochs : FT_AUTO_EPOCHS;
    j->batch = req_batch ? req_batch : (cfg->train_batch < seqs ? cfg->train_batch : seqs);
    j->lrm = req_lrm > 0 ? req_lrm : 1.0;
    j->steps_per_epoch = (seqs + j->batch - 1) / j->batch;
    j->steps = j->n_epochs * j->steps_per_epoch;
    j->status = FT_QUEUED;
    add_event(j, 0, 0, 0, NAN, NAN,
              "Files validated, moving job to queued state: %lld training examples, %lld sequences of %lld tokens an epoch; "
              "%lld epochs x %lld steps of %lld sequences = %lld steps, learning rate %g",
              (long long)st.docs_train, (long long)st.seqs_per_epoch, (long long)cfg->train_seq_len, (long long)j->n_epochs,
              (long long)j->steps_per_epoch, (long long)j->batch, (long long)j->steps, cfg->train_lr * j->lrm);
  }
  j->dirty = 1;
  pthread_mutex_unlock(&f->mu);
  if (!rc && f->env.job) ll_trainjob_kick(f->env.job);
}

// ---------------------------------------------------------------- the worker thread

static void flush_records(struct ll_ftjobs *f) {
  for (int i = 0;; i++) {
    pthread_mutex_lock(&f->mu);
    if (i >= f->n_jobs) {
      pthread_mutex_unlock(&f->mu);
      return;
    }
    struct ft_job *j = f->jobs[i];
    char *txt = NULL;
    if (j->dirty) {
      json_t *r = job_record(j);
      txt = json_dumps(r, JSON_COMPACT);
      json_decref(r);
      if (txt) j->dirty = 0;
    }
    char path[1200];
    job_path(f, j->id, ".json", path, sizeof path);
    pthread_mutex_unlock(&f->mu);
    if (!txt) continue;
    char err[600];
    if (write_atomic(path, txt, strlen(txt), err, sizeof err) != 0) {
      ll_log(LL_LOG_WARN, "fine-tuning: cannot write a job's record: %s (tried again with its next change)", err);
      pthread_mutex_lock(&f->mu);
      j->dirty = 1;
      pthread_mutex_unlock(&f->mu);
      free(txt);
      return; // a full disk: not in a loop
    }
    free(txt);
  }
}

static void *worker_main(void *arg) {
  struct ll_ftjobs *f = arg;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    while (!f->quit && !f->uploads && !f->work && !f->n_unlinks) pthread_cond_wait(&f->cv, &f->mu);
    const int quit = f->quit;
    struct upload *u = f->uploads;
    f->uploads = NULL;
    f->work = 0;
    char **unl = f->unlinks;
    int n_unl = f->n_unlinks;
    f->unlinks = NULL, f->n_unlinks = 0;
    struct ft_job *val = NULL;
    for (int i = 0; i < f->n_jobs && !val; i++)
      if (f->jobs[i]->status == FT_VALIDATING && !f->jobs[i]->validating) val = f->jobs[i], val->validating = 1;
    if (val) f->work = 1; // look again for another one
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < n_unl; i++) unlink(unl[i]), free(unl[i]);
    free(unl);
    // Oldest first (the list is newest first).
    struct upload *rev = NULL;
    while (u) {
      struct upload *n = u->next;
      u->next = rev, rev = u, u = n;
    }
    for (struct upload *x = rev, *n; x; x = n) {
      n = x->next;
      do_upload(f, x);
      free(x->data);
      x->data = NULL;
      pthread_mutex_lock(&f->mu);
      x->next = f->done, f->done = x;
      pthread_mutex_unlock(&f->mu);
      if (f->async_ready) uv_async_send(&f->async);
    }
    if (val) validate_job(f, val);
    flush_records(f);
    if (quit) {
      pthread_mutex_lock(&f->mu);
      const int more = f->uploads || f->work || f->n_unlinks;
      pthread_mutex_unlock(&f->mu);
      if (!more) break;
    }
  }
  return NULL;
}

static void wake_worker(struct ll_ftjobs *f) { // under mu
  f->work = 1;
  pthread_cond_signal(&f->cv);
}

static void on_async(uv_async_t *a) {
  struct ll_ftjobs *f = a->data;
  pthread_mutex_lock(&f->mu);
  struct upload *d = f->done;
  f->done = NULL;
  pthread_mutex_unlock(&f->mu);
  while (d) {
    struct upload *n = d->next;
    d->fn(d->ctx, d->status, d->reply);
    free(d);
    d = n;
  }
}

// ---------------------------------------------------------------- jobs on the training thread

struct load_arg {
  struct ll_ftjobs *f;
  const char *path, *name;
  struct ll_lora *lora;
  char err[800];
};

// On the compute thread (between decode steps): the adapter loaded onto the serving backend
// and registered under the job's model name.
static int load_on_compute(void *p) {
  struct load_arg *a = p;
  struct ll_lora_dims d;
  ll_engine_lora_dims(a->f->env.e, &d);
  int rc = ll_lora_load(&a->lora, a->path, &d, ll_engine_backend(a->f->env.e), a->err, sizeof a->err);
  if (rc == 0 && (rc = ll_sched_adapter_register(a->f->env.s, a->name, a->lora)) != 0) {
    snprintf(a->err, sizeof a->err, "cannot serve it as '%s': %s (at most %d adapters)", a->name, ll_strerror(rc), LL_SCHED_MAX_ADAPTERS);
    ll_lora_free(a->lora);
    a->lora = NULL;
  }
  return rc;
}

// Runs job j (status running) to its end, a cancel, or the server's stop.
static void run_job(struct ll_ftjobs *f, struct ll_trainjob *tj, struct ft_job *j) {
  const struct ll_config *cfg = f->env.cfg;
  char err[1024], run_dir[1200], data[1200], id[sizeof j->id], name[sizeof j->ft_model];
  struct ll_trainer_params tp;
  pthread_mutex_lock(&f->mu);
  snprintf(id, sizeof id, "%s", j->id);
  snprintf(name, sizeof name, "%s", j->ft_model);
  job_path(f, j->id, ".run", run_dir, sizeof run_dir);
  file_path(f, j->training_file, ".jsonl", data, sizeof data);
  const int64_t steps = j->steps, batch = j->batch, spe = j->steps_per_epoch, epochs = j->n_epochs, seed = j->seed;
  const double lrm = j->lrm;
  pthread_mutex_unlock(&f->mu);
  int rc = ll_train_params_from_config(cfg, &tp, err, sizeof err);
  tp.mode = LL_TRAIN_LORA; // a job trains an adapter, whatever train.mode the configured run has
  tp.batch = (int)batch;
  tp.grad_accum = 1;
  tp.steps = steps;
  tp.lr = cfg->train_lr * lrm;
  tp.warmup = 0;
  tp.seed = (uint64_t)seed;
  struct ll_engine_info info;
  ll_engine_get_info(f->env.e, &info);
  struct ll_train_run_opts ro = {run_dir, data, f->env.model_path, info.arch, spe, spe, cfg->train_eval_seqs, epochs, cfg->train_val_fraction, 0,
                                 f->tmpl_setting, cfg->train_max_skipped_steps, 0 /* JSONL records: shuffled in runs of 8 */, NULL,
                                 cfg->train_on_thinking};
  struct ll_train_run *run = NULL;
  if (rc == 0) rc = ll_train_run_open(&run, ll_trainjob_model(tj), ll_trainjob_backend(tj), f->tok, &tp, &ro, err, sizeof err);
  if (rc) {
    pthread_mutex_lock(&f->mu);
    if (j->status == FT_RUNNING) job_fail(j, "training_failed", NULL, err);
    wake_worker(f);
    pthread_mutex_unlock(&f->mu);
    return;
  }
  ll_trainjob_hooks(tj, ll_train_run_trainer(run));
  const int64_t resumed = ll_train_run_resumed_from(run);
  ll_log(LL_LOG_INFO, "fine-tuning: %s %s: %lld steps of %lld sequences, lr %g, run directory %s", id, resumed >= 0 ? "resumes" : "starts",
         (long long)steps, (long long)batch, tp.lr, run_dir);
  if (resumed >= 0) {
    pthread_mutex_lock(&f->mu);
    add_event(j, 0, 0, resumed, NAN, NAN, "Resumed from the checkpoint of step %lld", (long long)resumed);
    wake_worker(f);
    pthread_mutex_unlock(&f->mu);
  }
  struct ll_train_run_event ev;
  memset(&ev, 0, sizeof ev);
  int finished = ll_train_run_done(run), failed = 0;
  char final_path[4160] = "";
  if (finished) snprintf(final_path, sizeof final_path, "%s/last.ckpt", run_dir);
  while (!finished) {
    pthread_mutex_lock(&f->mu);
    const int cancelled = j->status != FT_RUNNING;
    pthread_mutex_unlock(&f->mu);
    if (cancelled) break;
    if (ll_trainjob_quitting(tj)) { // the server stops: the job stays running and resumes here
      struct ll_train_run_event sev;
      if (ll_train_run_save(run, &sev, err, sizeof err) == 0) ll_log(LL_LOG_INFO, "fine-tuning: %s saved %s at shutdown", id, sev.path);
      else ll_log(LL_LOG_WARN, "fine-tuning: %s: the shutdown checkpoint failed: %s", id, err);
      break;
    }
    if ((rc = ll_train_run_step(run, &ev, err, sizeof err)) != 0) {
      pthread_mutex_lock(&f->mu);
      if (j->status == FT_RUNNING) job_fail(j, "training_failed", NULL, err);
      wake_worker(f);
      pthread_mutex_unlock(&f->mu);
      failed = 1;
      break;
    }
    pthread_mutex_lock(&f->mu);
    j->step = ev.info.step;
    j->trained_tokens += ev.info.tokens;
    if (!ev.info.skipped) j->last_loss = ev.info.loss;
    const double vl = ev.evaluated ? ev.val_loss : NAN;
    if (ev.info.skipped)
      add_event(j, 1, 1, ev.info.step, NAN, vl, "Step %lld/%lld: skipped (a non-finite loss or gradient)", (long long)ev.info.step, (long long)steps);
    else if (ev.evaluated && isfinite(vl))
      add_event(j, 0, 1, ev.info.step, ev.info.loss, vl, "Step %lld/%lld: training loss=%.4f, validation loss=%.4f", (long long)ev.info.step,
                (long long)steps, ev.info.loss, vl);
    else
      add_event(j, 0, 1, ev.info.step, ev.info.loss, NAN, "Step %lld/%lld: training loss=%.4f", (long long)ev.info.step, (long long)steps,
                ev.info.loss);
    if (ev.saved && j->n_ck < FT_MAX_CKPTS) {
      struct ft_ckpt *c = &j->ck[j->n_ck++];
      snprintf(c->id, sizeof c->id, "ftckpt-%.12s-%lld", id + 6, (long long)ev.info.step);
      c->created_at = now_unix();
      c->step = ev.info.step;
      c->train_loss = ev.info.skipped ? NAN : ev.info.loss;
      c->valid_loss = vl;
      add_event(j, 0, 0, ev.info.step, NAN, NAN, "Checkpoint created at step %lld", (long long)ev.info.step);
    }
    if (ev.save_failed) add_event(j, 1, 0, ev.info.step, NAN, NAN, "Checkpoint at step %lld failed: %s", (long long)ev.info.step, ev.save_error);
    wake_worker(f);
    pthread_mutex_unlock(&f->mu);
    if (ev.finished) {
      finished = 1;
      if (ev.saved) snprintf(final_path, sizeof final_path, "%s", ev.path);
    }
  }
  if (finished && !failed && !final_path[0]) { // the last step's checkpoint failed: once more
    struct ll_train_run_event sev;
    if (ll_train_run_save(run, &sev, err, sizeof err) == 0) snprintf(final_path, sizeof final_path, "%s", sev.path);
  }
  ll_train_run_close(run);
  if (!finished || failed) return;
  struct load_arg la = {.f = f, .path = final_path, .name = name};
  rc = final_path[0] ? ll_trainjob_on_compute(tj, load_on_compute, &la) : ll_errf(la.err, sizeof la.err, LL_EIO, "the final checkpoint could not be written: %s", err);
  pthread_mutex_lock(&f->mu);
  if (rc) {
    if (j->status == FT_RUNNING) job_fail(j, "training_failed", NULL, la.err);
  } else if (j->status != FT_RUNNING) { // cancelled during the last step: not served
    ll_sched_adapter_register(f->env.s, name, NULL);
    j->lora = la.lora; // freed with the others (a request may have named it meanwhile)
  } else {
    j->lora = la.lora;
    j->status = FT_SUCCEEDED;
    j->finished_at = now_unix();
    add_event(j, 0, 0, j->step, NAN, NAN, "New fine-tuned model created: %s", name);
    add_event(j, 0, 0, j->step, NAN, NAN, "The job has successfully completed");
    ll_log(LL_LOG_INFO, "fine-tuning: %s succeeded: model %s (adapter=%s)", id, name, name);
  }
  wake_worker(f);
  pthread_mutex_unlock(&f->mu);
}

// ll_trainjob_set_queue's fn: the oldest job that was running (interrupted by a stop), else
// the oldest queued one.
static int queue_fn(void *user, struct ll_trainjob *tj) {
  struct ll_ftjobs *f = user;
  pthread_mutex_lock(&f->mu);
  struct ft_job *j = NULL;
  for (int pass = 0; pass < 2 && !j; pass++)
    for (int i = 0; i < f->n_jobs && !j; i++)
      if (f->jobs[i]->status == (pass ? FT_QUEUED : FT_RUNNING)) j = f->jobs[i];
  if (!j || ll_trainjob_quitting(tj)) {
    pthread_mutex_unlock(&f->mu);
    return 0;
  }
  if (j->status == FT_QUEUED) add_event(j, 0, 0, 0, NAN, NAN, "Fine-tuning job started");
  j->last_loss = NAN;
  j->status = FT_RUNNING;
  wake_worker(f);
  char id[sizeof j->id];
  snprintf(id, sizeof id, "%s", j->id);
  pthread_mutex_unlock(&f->mu);
  ll_trainjob_yield_to(tj, id);
  run_job(f, tj, j);
  ll_trainjob_yield_to(tj, NULL);
  return 1;
}

// ---------------------------------------------------------------- HTTP handlers (loop thread)

struct hctx {
  struct ll_ftjobs *f;
  const char *method, *body, *ctype, *query;
  size_t mlen, blen, ctlen, qlen;
  const char *arg; // the {id} of the path
  size_t arg_len;
  ll_ftjobs_reply_fn fn;
  void *ctx;
};

static void reply(struct hctx *c, int status, json_t *body) { c->fn(c->ctx, status, body); }

static void reply_err(struct hctx *c, int status, const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_err(struct hctx *c, int status, const char *code, const char *param, const char *fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  reply(c, status, ll_http_error_object(status, code, param, msg));
}

// Query parameters: after=ID, limit=N (1..100, default 20). 0, or an error sent.
static int list_params(struct hctx *c, char *after, size_t acap, int *limit) {
  after[0] = 0;
  *limit = 20;
  for (size_t i = 0; i < c->qlen;) {
    const char *p = c->query + i;
    const char *amp = memchr(p, '&', c->qlen - i);
    size_t n = amp ? (size_t)(amp - p) : c->qlen - i;
    const char *eq = memchr(p, '=', n);
    size_t kl = eq ? (size_t)(eq - p) : n, vl = eq ? n - kl - 1 : 0;
    const char *v = eq ? eq + 1 : "";
    if (kl == 5 && !memcmp(p, "after", 5)) {
      if (vl >= acap) {
        reply_err(c, 400, "invalid_value", "after", "'after' is too long");
        return -1;
      }
      memcpy(after, v, vl);
      after[vl] = 0;
    } else if (kl == 5 && !memcmp(p, "limit", 5)) {
      char num[16];
      snprintf(num, sizeof num, "%.*s", (int)(vl < 15 ? vl : 15), v);
      char *end;
      long x = strtol(num, &end, 10);
      if (vl == 0 || vl > 15 || *end || x < 1 || x > 100) {
        reply_err(c, 400, "invalid_value", "limit", "'limit' must be an integer in 1..100");
        return -1;
      }
      *limit = (int)x;
    }
    i += n + (amp ? 1 : 0);
  }
  return 0;
}

static void list_reply(struct hctx *c, json_t *data, int has_more) {
  json_t *o = json_object();
  json_object_set_new(o, "object", json_string("list"));
  json_object_set_new(o, "data", data);
  json_object_set_new(o, "has_more", json_boolean(has_more));
  json_t *first = json_array_get(data, 0), *last = json_array_get(data, json_array_size(data) - 1);
  json_object_set_new(o, "first_id", first ? json_incref(json_object_get(first, "id")) : json_null());
  json_object_set_new(o, "last_id", last ? json_incref(json_object_get(last, "id")) : json_null());
  reply(c, 200, o);
}

static struct ft_file *find_file(struct ll_ftjobs *f, const char *id, size_t n) { // under mu
  for (int i = 0; i < f->n_files; i++)
    if (strlen(f->files[i]->id) == n && !memcmp(f->files[i]->id, id, n)) return f->files[i];
  return NULL;
}
static struct ft_job *find_job(struct ll_ftjobs *f, const char *id, size_t n) { // under mu
  for (int i = 0; i < f->n_jobs; i++)
    if (strlen(f->jobs[i]->id) == n && !memcmp(f->jobs[i]->id, id, n)) return f->jobs[i];
  return NULL;
}

static void h_upload(struct hctx *c) {
  char err[400];
  const char *b;
  size_t bl;
  struct ll_multipart_part parts[LL_MULTIPART_MAX_PARTS];
  int n = 0;
  if (ll_multipart_boundary(c->ctype, c->ctlen, &b, &bl, err, sizeof err) != 0 ||
      ll_multipart_parse(c->body, c->blen, b, bl, parts, &n, err, sizeof err) != 0) {
    reply_err(c, 400, "invalid_request", NULL, "%s", err);
    return;
  }
  const struct ll_multipart_part *purpose = ll_multipart_find(parts, n, "purpose"), *file = ll_multipart_find(parts, n, "file");
  if (!purpose || purpose->len != 9 || memcmp(purpose->data, "fine-tune", 9) != 0) {
    reply_err(c, 400, "invalid_value", "purpose", "'purpose' must be 'fine-tune' (the only purpose llsrv stores files for)");
    return;
  }
  if (!file) {
    reply_err(c, 400, "invalid_request", "file", "the form has no 'file' part");
    return;
  }
  struct upload *u = calloc(1, sizeof *u);
  if (!u || !(u->data = malloc(file->len + 1))) {
    free(u);
    reply_err(c, 500, "internal", NULL, "out of memory");
    return;
  }
  memcpy(u->data, file->data, file->len);
  u->len = file->len;
  // The file name as given when it is UTF-8 without control bytes, else a stand-in.
  size_t fl = file->filename ? file->filename_len : 0;
  json_t *t = fl && fl < sizeof u->filename ? json_stringn(file->filename, fl) : NULL;
  int ok = t != NULL;
  for (size_t i = 0; ok && i < fl; i++) ok = (unsigned char)file->filename[i] >= 0x20 && file->filename[i] != 0x7f;
  json_decref(t);
  snprintf(u->filename, sizeof u->filename, "%.*s", ok ? (int)fl : 12, ok ? file->filename : "upload.jsonl");
  u->fn = c->fn, u->ctx = c->ctx;
  struct ll_ftjobs *f = c->f;
  pthread_mutex_lock(&f->mu);
  u->next = f->uploads, f->uploads = u;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

static void h_files(struct hctx *c) {
  struct ll_ftjobs *f = c->f;
  json_t *data = json_array();
  pthread_mutex_lock(&f->mu);
  for (int i = f->n_files - 1; i >= 0; i--) json_array_append_new(data, file_json(f->files[i]));
  pthread_mutex_unlock(&f->mu);
  list_reply(c, data, 0);
}

static void h_file(struct hctx *c) {
  struct ll_ftjobs *f = c->f;
  pthread_mutex_lock(&f->mu);
  struct ft_file *fl = find_file(f, c->arg, c->arg_len);
  json_t *o = fl ? file_json(fl) : NULL;
  pthread_mutex_unlock(&f->mu);
  if (o) reply(c, 200, o);
  else reply_err(c, 404, "not_found", "file_id", "No such File object: %.*s", (int)(c->arg_len < 64 ? c->arg_len : 64), c->arg);
}

static void h_file_delete(struct hctx *c) {
  struct ll_ftjobs *f = c->f;
  pthread_mutex_lock(&f->mu);
  struct ft_file *fl = find_file(f, c->arg, c->arg_len);
  struct ft_job *user = NULL;
  for (int i = 0; fl && i < f->n_jobs && !user; i++)
    if (!strcmp(f->jobs[i]->training_file, fl->id) && f->jobs[i]->status <= FT_RUNNING) user = f->jobs[i];
  if (!fl || user) {
    char uid[64];
    snprintf(uid, sizeof uid, "%s", user ? user->id : "");
    const char *ust = user ? k_status[user->status] : "";
    pthread_mutex_unlock(&f->mu);
    if (!fl) reply_err(c, 404, "not_found", "file_id", "No such File object: %.*s", (int)(c->arg_len < 64 ? c->arg_len : 64), c->arg);
    else reply_err(c, 400, "file_in_use", "file_id", "the file is the training file of %s, which is %s (cancel it first)", uid, ust);
    return;
  }
  char p1[1200], p2[1200];
  file_path(f, fl->id, ".json", p1, sizeof p1); // the record first: it commits the file
  file_path(f, fl->id, ".jsonl", p2, sizeof p2);
  char **v = realloc(f->unlinks, (size_t)(f->n_unlinks + 2) * sizeof *v);
  if (v) {
    f->unlinks = v;
    if ((v[f->n_unlinks] = strdup(p1))) f->n_unlinks++;
    if ((v[f->n_unlinks] = strdup(p2))) f->n_unlinks++;
  }
  for (int i = 0; i < f->n_files; i++)
    if (f->files[i] == fl) memmove(f->files + i, f->files + i + 1, (size_t)(f->n_files - i - 1) * sizeof *f->files), f->n_files--;
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(fl->id));
  json_object_set_new(o, "object", json_string("file"));
  json_object_set_new(o, "deleted", json_true());
  free(fl);
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
  reply(c, 200, o);
}

// "auto" or an integer in lo..hi (0 for auto). 0, or an error sent.
static int hp_int(struct hctx *c, json_t *hp, const char *k, int64_t lo, int64_t hi, int64_t *out) {
  json_t *v = json_object_get(hp, k);
  *out = 0;
  if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), "auto"))) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    reply_err(c, 400, "invalid_value", k, "hyperparameters.%s must be \"auto\" or an integer in %lld..%lld", k, (long long)lo, (long long)hi);
    return -1;
  }
  *out = json_integer_value(v);
  return 0;
}

static void h_job_create(struct hctx *c) {
  struct ll_ftjobs *f = c->f;
  json_error_t je;
  json_t *b = json_loadb(c->body ? c->body : "", c->blen, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(b)) {
    json_decref(b);
    reply_err(c, 400, "invalid_json", NULL, "the body must be a JSON object");
    return;
  }
  json_t *model = json_object_get(b, "model"), *tf = json_object_get(b, "training_file"), *suffix = json_object_get(b, "suffix");
  json_t *hp = json_object_get(b, "hyperparameters"), *seed = json_object_get(b, "seed"), *vf = json_object_get(b, "validation_file");
  json_t *method = json_object_get(b, "method");
  int64_t ep = 0, bs = 0;
  double lrm = 0;
  struct ft_job *j = NULL;
  if (!json_is_string(model) || !json_is_string(tf)) {
    reply_err(c, 400, "invalid_value", !json_is_string(model) ? "model" : "training_file", "'model' and 'training_file' (strings) are required");
    goto out;
  }
  if (strcmp(json_string_value(model), f->base_id) != 0) {
    reply_err(c, 404, "model_not_found", "model", "The model '%.200s' cannot be fine-tuned here: jobs train adapters of the base model '%s'",
              json_string_value(model), f->base_id);
    goto out;
  }
  if (!f->env.job) {
    reply_err(c, 400, "invalid_request", "model", "the model '%s' cannot be fine-tuned: it has no tokenizer", f->base_id);
    goto out;
  }
  if (vf && !json_is_null(vf)) {
    reply_err(c, 400, "invalid_value", "validation_file",
              "validation_file is not supported: the job holds out train.val_fraction of the training file's examples for its validation loss");
    goto out;
  }
  if (suffix && !json_is_null(suffix)) {
    size_t sl = json_is_string(suffix) ? json_string_length(suffix) : 0;
    const char *s = json_is_string(suffix) ? json_string_value(suffix) : "";
    int ok = sl >= 1 && sl <= FT_MAX_SUFFIX;
    for (size_t i = 0; ok && i < sl; i++) ok = ll_adapter_name_check(s + i, 1) == 0 && s[i] != ':';
    if (!ok) {
      reply_err(c, 400, "invalid_value", "suffix", "'suffix' must be 1..%d characters of letters, digits, '.', '_' and '-'", FT_MAX_SUFFIX);
      goto out;
    }
  }
  if (method && !json_is_null(method)) { // {"type": "supervised", "supervised": {"hyperparameters": {...}}}
    json_t *ty = json_object_get(method, "type");
    if (!json_is_object(method) || !json_is_string(ty) || strcmp(json_string_value(ty), "supervised") != 0) {
      reply_err(c, 400, "invalid_value", "method", "'method.type' must be \"supervised\" (the only method llsrv trains)");
      goto out;
    }
    json_t *mh = json_object_get(json_object_get(method, "supervised"), "hyperparameters");
    if (json_is_object(mh)) hp = mh;
  }
  if (hp && !json_is_null(hp) && !json_is_object(hp)) {
    reply_err(c, 400, "invalid_value", "hyperparameters", "'hyperparameters' must be an object");
    goto out;
  }
  if (json_is_object(hp)) {
    if (hp_int(c, hp, "n_epochs", 1, FT_MAX_EPOCHS, &ep) || hp_int(c, hp, "batch_size", 1, FT_MAX_BATCH, &bs)) goto out;
    json_t *v = json_object_get(hp, "learning_rate_multiplier");
    if (v && !json_is_null(v) && !(json_is_string(v) && !strcmp(json_string_value(v), "auto"))) {
      lrm = json_is_number(v) ? json_number_value(v) : -1;
      if (!(lrm > 0 && lrm <= 10) || f->env.cfg->train_lr * lrm > 1) {
        reply_err(c, 400, "invalid_value", "learning_rate_multiplier",
                  "hyperparameters.learning_rate_multiplier must be \"auto\" or a number in (0, 10] (times train.lr = %g, at most 1)",
                  f->env.cfg->train_lr);
        goto out;
      }
    }
  }
  if (seed && !json_is_null(seed) && (!json_is_integer(seed) || json_integer_value(seed) < 0 || json_integer_value(seed) > 2147483647)) {
    reply_err(c, 400, "invalid_value", "seed", "'seed' must be an integer in 0..2147483647");
    goto out;
  }
  pthread_mutex_lock(&f->mu);
  struct ft_file *fl = find_file(f, json_string_value(tf), json_string_length(tf));
  if (!fl || f->n_jobs >= FT_MAX_JOBS) {
    pthread_mutex_unlock(&f->mu);
    if (!fl) reply_err(c, 400, "invalid_training_file", "training_file", "invalid training_file: %.100s (no such file; POST /v1/files uploads one)", json_string_value(tf));
    else reply_err(c, 400, "too_many_jobs", NULL, "at most %d fine-tuning jobs are kept", FT_MAX_JOBS);
    goto out;
  }
  j = calloc(1, sizeof *j);
  struct ft_job **v = j ? realloc(f->jobs, (size_t)(f->n_jobs + 1) * sizeof *v) : NULL;
  if (!v) {
    pthread_mutex_unlock(&f->mu);
    free(j);
    j = NULL;
    reply_err(c, 500, "internal", NULL, "out of memory");
    goto out;
  }
  f->jobs = v;
  char hex[FT_HEX + 1];
  rand_hex(hex, FT_HEX);
  snprintf(j->id, sizeof j->id, "ftjob-%s", hex);
  snprintf(j->model, sizeof j->model, "%s", f->base_id);
  snprintf(j->training_file, sizeof j->training_file, "%s", fl->id);
  if (json_is_string(suffix)) snprintf(j->suffix, sizeof j->suffix, "%s", json_string_value(suffix));
  // ft:<base>:<suffix>:<id>, the base cut so that the name fits an adapter name.
  snprintf(j->ft_model, sizeof j->ft_model, "ft:%.64s:%s:%.8s", f->base_id, j->suffix, hex);
  j->status = FT_VALIDATING;
  j->created_at = now_unix();
  j->seq = f->n_jobs ? f->jobs[f->n_jobs - 1]->seq + 1 : 1;
  j->seed = json_is_integer(seed) ? json_integer_value(seed) : f->env.cfg->train_seed % 2147483648ll;
  j->req_epochs = ep, j->req_batch = bs, j->req_lrm = lrm;
  add_event(j, 0, 0, 0, NAN, NAN, "Validating training file: %s", fl->id);
  f->jobs[f->n_jobs++] = j;
  json_t *o = job_json(j);
  wake_worker(f);
  pthread_mutex_unlock(&f->mu);
  ll_log(LL_LOG_INFO, "fine-tuning: %s created (training file %s, model %s)", j->id, j->training_file, j->ft_model);
  reply(c, 200, o);
out:
  json_decref(b);
}

static void h_jobs(struct hctx *c) {
  struct ll_ftjobs *f = c->f;
  char after[64];
  int limit;
  if (list_params(c, after, sizeof after, &limit)) return;
  json_t *data = json_array();
  int more = 0;
  pthread_mutex_lock(&f->mu);
  int i = f->n_jobs - 1;
  if (after[0]) {
    while (i >= 0 && strcmp(f->jobs[i]->id, after) != 0) i--;
    i--; // the ones after it (older); an unknown `after` gives an empty page
  }
  for (; i >= 0; i--) {
    if ((int)json_array_size(data) == limit) {
      more = 1;
      break;
    }
    json_array_append_new(data, job_json(f->jobs[i]));
  }
  pthread_mutex_unlock(&f->mu);
  list_reply(c, data, more);
}

static struct ft_job *job_or_404(struct hctx *c) { // locks mu when found
  pthread_mutex_lock(&c->f->mu);
  struct ft_job *j = find_job(c->f, c->arg, c->arg_len);
  if (j) return j;
  pthread_mutex_unlock(&c->f->mu);
  reply_err(c, 404, "not_found", "fine_tuning_job_id", "No such fine-tuning job: %.*s", (int)(c->arg_len < 64 ? c->arg_len : 64), c->arg);
  return NULL;
}

static void h_job(struct hctx *c) {
  struct ft_job *j = job_or_404(c);
  if (!j) return;
  json_t *o = job_json(j);
  pthread_mutex_unlock(&c->f->mu);
  reply(c, 200, o);
}

static void h_events(struct hctx *c) {
  char after[64];
  int limit;
  if (list_params(c, after, sizeof after, &limit)) return;
  struct ft_job *j = job_or_404(c);
  if (!j) return;
  json_t *data = json_array();
  int more = 0, i = j->n_ev - 1;
  if (after[0]) {
    while (i >= 0 && strcmp(j->ev[i].id, after) != 0) i--;
    i--;
  }
  for (; i >= 0; i--) { // newest first
    if ((int)json_array_size(data) == limit) {
      more = 1;
      break;
    }
    json_array_append_new(data, event_json(&j->ev[i]));
  }
  pthread_mutex_unlock(&c->f->mu);
  list_reply(c, data, more);
}

static void h_checkpoints(struct hctx *c) {
  char after[64];
  int limit;
  if (list_params(c, after, sizeof after, &limit)) return;
  struct ft_job *j = job_or_404(c);
  if (!j) return;
  json_t *data = json_array();
  int more = 0, i = j->n_ck - 1;
  if (after[0]) {
    while (i >= 0 && strcmp(j->ck[i].id, after) != 0) i--;
    i--;
  }
  for (; i >= 0; i--) {
    if ((int)json_array_size(data) == limit) {
      more = 1;
      break;
    }
    json_array_append_new(data, ckpt_json(j, &j->ck[i]));
  }
  pthread_mutex_unlock(&c->f->mu);
  list_reply(c, data, more);
}

static void h_cancel(struct hctx *c) {
  struct ft_job *j = job_or_404(c);
  if (!j) return;
  if (j->status >= FT_SUCCEEDED) {
    const char *st = k_status[j->status];
    pthread_mutex_unlock(&c->f->mu);
    reply_err(c, 400, "invalid_request", NULL, "the job is already %s", st);
    return;
  }
  // A running job stops before its next step (the training thread reads the status).
  j->status = FT_CANCELLED;
  j->finished_at = now_unix();
  add_event(j, 0, 0, j->step, NAN, NAN, "Fine-tuning job cancelled");
  json_t *o = job_json(j);
  wake_worker(c->f);
  pthread_mutex_unlock(&c->f->mu);
  ll_log(LL_LOG_INFO, "fine-tuning: %s cancelled", j->id);
  reply(c, 200, o);
}

// The routes: METHOD and a path of segments, "*" an id.
static const struct route {
  const char *method, *path;
  void (*fn)(struct hctx *c);
} k_routes[] = {
    {"POST", "/files", h_upload},
    {"GET", "/files", h_files},
    {"GET", "/files/*", h_file},
    {"DELETE", "/files/*", h_file_delete},
    {"POST", "/fine_tuning/jobs", h_job_create},
    {"GET", "/fine_tuning/jobs", h_jobs},
    {"GET", "/fine_tuning/jobs/*", h_job},
    {"GET", "/fine_tuning/jobs/*/events", h_events},
    {"GET", "/fine_tuning/jobs/*/checkpoints", h_checkpoints},
    {"POST", "/fine_tuning/jobs/*/cancel", h_cancel},
    {NULL, NULL, NULL},
};

// Matches path against a route's pattern; the "*" segment's text in *arg.
static int path_match(const char *pat, const char *p, size_t n, const char **arg, size_t *arg_len) {
  size_t i = 0;
  for (const char *q = pat; *q;) {
    if (*q == '*') {
      size_t s = i;
      while (i < n && p[i] != '/') i++;
      if (i == s) return 0;
      *arg = p + s, *arg_len = i - s;
      q++;
      continue;
    }
    if (i >= n || p[i] != *q) return 0;
    i++, q++;
  }
  return i == n;
}

int ll_ftjobs_request(struct ll_ftjobs *f, const char *method, size_t mlen, const char *path, size_t plen, const char *query, size_t qlen,
                      const char *body, size_t blen, const char *ctype, size_t ctlen, ll_ftjobs_reply_fn fn, void *ctx) {
  struct hctx c = {f, method, body, ctype, query, mlen, blen, ctlen, qlen, NULL, 0, fn, ctx};
  int path_known = 0;
  for (const struct route *r = k_routes; r->method; r++) {
    if (!path_match(r->path, path, plen, &c.arg, &c.arg_len)) continue;
    path_known = 1;
    if (strlen(r->method) == mlen && !memcmp(r->method, method, mlen)) {
      r->fn(&c);
      return 1;
    }
  }
  if (!path_known) return 0;
  reply_err(&c, 405, "method_not_allowed", NULL, "method %.*s is not allowed on /v1%.*s", (int)(mlen < 16 ? mlen : 16), method,
            (int)(plen < 200 ? plen : 200), path);
  return 1;
}

void ll_ftjobs_stats(struct ll_ftjobs *f, struct ll_ftjobs_stats *st) {
  memset(st, 0, sizeof *st);
  st->loss = NAN;
  if (!f) return;
  pthread_mutex_lock(&f->mu);
  st->files = f->n_files;
  for (int i = 0; i < f->n_jobs; i++) {
    const struct ft_job *j = f->jobs[i];
    st->jobs[j->status]++;
    if (j->status == FT_RUNNING) st->running = 1, st->step = j->step, st->total_steps = j->steps, st->loss = j->last_loss;
  }
  pthread_mutex_unlock(&f->mu);
}

const char *ll_ftjobs_status_name(int i) { return i >= 0 && i < FT_N_STATUS ? k_status[i] : NULL; }

// ---------------------------------------------------------------- open / close

static int mkdirs(const char *p, char *err, size_t errlen) {
  char b[1200];
  snprintf(b, sizeof b, "%s", p);
  for (char *s = b + 1;; s++) {
    if (*s && *s != '/') continue;
    char ch = *s;
    *s = 0;
    if (mkdir(b, 0700) != 0 && errno != EEXIST) return ll_errf(err, errlen, LL_EIO, "%s: %s", b, strerror(errno));
    *s = ch;
    if (!ch) return 0;
  }
}

static int by_created(const void *a, const void *b) {
  const struct ft_job *x = *(const struct ft_job *const *)a, *y = *(const struct ft_job *const *)b;
  return x->seq < y->seq ? -1 : x->seq > y->seq ? 1 : strcmp(x->id, y->id);
}

// The records of earlier processes: files, then jobs (with their models served again).
static void load_store(struct ll_ftjobs *f) {
  DIR *d = opendir(f->files_dir);
  struct dirent *de;
  while (d && (de = readdir(d)) && f->n_files < FT_MAX_FILES) {
    size_t n = strlen(de->d_name);
    if (n != 5 + FT_HEX + 5 || !id_ok(de->d_name, 5 + FT_HEX, "file-") || strcmp(de->d_name + 5 + FT_HEX, ".json") != 0) continue;
    char path[1400], dpath[1200], err[1300];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", f->files_dir, de->d_name);
    char *txt = read_small(path, 64 << 10, &len, err, sizeof err);
    json_t *o = txt ? json_loadb(txt, len, 0, NULL) : NULL;
    free(txt);
    struct ft_file *fl = calloc(1, sizeof *fl);
    struct stat st;
    int ok = fl && json_is_object(o) && !rd_str(o, "id", fl->id, sizeof fl->id, 0) && !strncmp(fl->id, de->d_name, 5 + FT_HEX) &&
             !rd_str(o, "filename", fl->filename, sizeof fl->filename, 0) && !rd_int(o, "bytes", 0, (int64_t)1 << 50, &fl->bytes, 0) &&
             !rd_int(o, "created_at", 0, (int64_t)1 << 50, &fl->created_at, 0) && !rd_int(o, "examples", 0, (int64_t)1 << 50, &fl->examples, 0);
    file_path(f, fl ? fl->id : "", ".jsonl", dpath, sizeof dpath);
    if (ok && (stat(dpath, &st) != 0 || st.st_size != fl->bytes)) {
      ok = 0;
      snprintf(err, sizeof err, "its data %s is missing or of another size", dpath);
    } else if (!ok && txt) {
      snprintf(err, sizeof err, "not a file record");
    }
    json_decref(o);
    if (!ok) {
      ll_log(LL_LOG_WARN, "fine-tuning: %s left out: %s", path, err);
      free(fl);
      continue;
    }
    struct ft_file **v = realloc(f->files, (size_t)(f->n_files + 1) * sizeof *v);
    if (!v) {
      free(fl);
      break;
    }
    f->files = v, f->files[f->n_files++] = fl;
  }
  if (d) closedir(d);
  // What a stop between an upload's two writes left (data without its record), and temporary
  // files of writes cut short: never referenced, removed.
  d = opendir(f->files_dir);
  while (d && (de = readdir(d))) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", f->files_dir, de->d_name);
    const size_t n = strlen(de->d_name);
    if (strstr(de->d_name, ".tmp.")) {
      if (ll_tmp_unlink_stale(path)) ll_log(LL_LOG_INFO, "fine-tuning: removed %s (a write cut short)", path);
    } else if (n == 5 + FT_HEX + 6 && id_ok(de->d_name, 5 + FT_HEX, "file-") && !strcmp(de->d_name + 5 + FT_HEX, ".jsonl") &&
               !find_file(f, de->d_name, 5 + FT_HEX)) {
      if (unlink(path) == 0) ll_log(LL_LOG_INFO, "fine-tuning: removed %s (an upload without its record)", path);
    }
  }
  if (d) closedir(d);
  d = opendir(f->jobs_dir);
  while (d && (de = readdir(d)) && f->n_jobs < FT_MAX_JOBS) {
    size_t n = strlen(de->d_name);
    if (n != 6 + FT_HEX + 5 || !id_ok(de->d_name, 6 + FT_HEX, "ftjob-") || strcmp(de->d_name + 6 + FT_HEX, ".json") != 0) continue;
    char path[1400], err[600];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", f->jobs_dir, de->d_name);
    char *txt = read_small(path, FT_MAX_RECORD, &len, err, sizeof err);
    json_error_t je;
    json_t *r = txt ? json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (txt && !r) snprintf(err, sizeof err, "invalid JSON at line %d: %s", je.line, je.text);
    free(txt);
    struct ft_job *j = calloc(1, sizeof *j);
    int ok = r && j && job_from_record(r, j, err, sizeof err) == 0 && !strncmp(j->id, de->d_name, 6 + FT_HEX);
    json_decref(r);
    struct ft_job **v = ok ? realloc(f->jobs, (size_t)(f->n_jobs + 1) * sizeof *v) : NULL;
    if (!v) {
      ll_log(LL_LOG_WARN, "fine-tuning: %s left out: %s", path, ok ? "out of memory" : err);
      job_free(j);
      continue;
    }
    f->jobs = v, f->jobs[f->n_jobs++] = j;
  }
  if (d) closedir(d);
  if (f->n_jobs > 1) qsort(f->jobs, (size_t)f->n_jobs, sizeof *f->jobs, by_created);
  for (int i = 0; i < f->n_jobs; i++) {
    struct ft_job *j = f->jobs[i];
    if (j->status == FT_RUNNING && !f->env.job) job_fail(j, "training_failed", NULL, "the model can no longer train (no tokenizer)");
    if (j->status != FT_SUCCEEDED) continue;
    char path[1200], err[900];
    job_path(f, j->id, ".run/last.ckpt", path, sizeof path);
    struct ll_lora_dims dm;
    ll_engine_lora_dims(f->env.e, &dm);
    int rc = ll_lora_load(&j->lora, path, &dm, ll_engine_backend(f->env.e), err, sizeof err);
    if (rc == 0 && (rc = ll_sched_adapter_register(f->env.s, j->ft_model, j->lora)) != 0) {
      snprintf(err, sizeof err, "too many adapters (at most %d)", LL_SCHED_MAX_ADAPTERS);
      ll_lora_free(j->lora);
      j->lora = NULL;
    }
    if (rc) ll_log(LL_LOG_WARN, "fine-tuning: the model %s of %s is not served: %s", j->ft_model, j->id, err);
  }
}

int ll_ftjobs_open(struct ll_ftjobs **out, const struct ll_ftjobs_env *env, char *err, size_t errlen) {
  *out = NULL;
  struct ll_ftjobs *f = calloc(1, sizeof *f);
  if (!f) return ll_errf(err, errlen, LL_ENOMEM, "fine-tuning: out of memory");
  f->env = *env;
  snprintf(f->dir, sizeof f->dir, "%s", env->dir);
  snprintf(f->files_dir, sizeof f->files_dir, "%s/files", env->dir);
  snprintf(f->jobs_dir, sizeof f->jobs_dir, "%s/jobs", env->dir);
  snprintf(f->base_id, sizeof f->base_id, "%s", env->base_id);
  f->env.dir = f->dir, f->env.base_id = f->base_id;
  f->tok = ll_engine_tokenizer(env->e);
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  int rc = mkdirs(f->files_dir, err, errlen);
  if (!rc) rc = mkdirs(f->jobs_dir, err, errlen);
  // The chat template of the training records: the configured one, else the model's, else
  // chatml - the one the HTTP API chats with, so the fine-tuned model is asked as it learnt.
  const char *setting = env->cfg->chat_template ? env->cfg->chat_template : f->tok && ll_tokenizer_chat_template(f->tok) ? NULL : "chatml";
  if (!rc && setting && !(f->tmpl_setting = strdup(setting))) rc = ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  if (!rc && setting) rc = ll_chat_template_load(setting, &f->tmpl_text, err, errlen);
  if (!rc && !setting && !(f->tmpl_text = strdup(ll_tokenizer_chat_template(f->tok)))) rc = ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  if (rc) {
    ll_errf(err, errlen, rc, "fine-tuning: %s", err);
    ll_ftjobs_free(f);
    return rc;
  }
  load_store(f);
  uv_async_init(env->loop, &f->async, on_async);
  f->async.data = f;
  uv_unref((uv_handle_t *)&f->async); // pending uploads do not keep a stopping loop alive
  f->async_ready = 1;
  if (pthread_create(&f->th, NULL, worker_main, f) != 0) {
    ll_ftjobs_free(f);
    return ll_errf(err, errlen, LL_ENOMEM, "fine-tuning: cannot start its thread");
  }
  f->th_started = 1;
  int n_wait = 0, n_models = 0;
  for (int i = 0; i < f->n_jobs; i++) {
    n_wait += f->jobs[i]->status <= FT_RUNNING;
    n_models += f->jobs[i]->lora != NULL;
  }
  if (env->job) ll_trainjob_set_queue(env->job, queue_fn, f);
  pthread_mutex_lock(&f->mu);
  wake_worker(f); // jobs still validating
  pthread_mutex_unlock(&f->mu);
  if (env->job && n_wait) ll_trainjob_kick(env->job);
  if (f->n_files || f->n_jobs)
    ll_log(LL_LOG_INFO, "fine-tuning: %d files, %d jobs (%d to run, %d models served) in %s", f->n_files, f->n_jobs, n_wait, n_models, f->dir);
  *out = f;
  return 0;
}

void ll_ftjobs_stop(struct ll_ftjobs *f) {
  if (!f || !f->th_started) return;
  pthread_mutex_lock(&f->mu);
  f->quit = 1;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
  pthread_join(f->th, NULL);
  f->th_started = 0;
  flush_records(f); // what the training thread recorded after the worker's last look
}

void ll_ftjobs_release_adapters(struct ll_ftjobs *f) {
  if (!f) return;
  for (int i = 0; i < f->n_jobs; i++) ll_lora_free(f->jobs[i]->lora), f->jobs[i]->lora = NULL;
}

void ll_ftjobs_free(struct ll_ftjobs *f) {
  if (!f) return;
  ll_ftjobs_stop(f);
  ll_ftjobs_release_adapters(f);
  for (struct upload *lists[2] = {f->uploads, f->done}, **l = lists; l < lists + 2; l++)
    for (struct upload *u = *l, *n; u; u = n) {
      n = u->next;
      u->fn(u->ctx, 0, NULL); // abandoned: only its context is released
      json_decref(u->reply);
      free(u->data);
      free(u);
    }
  for (int i = 0; i < f->n_files; i++) free(f->files[i]);
  free(f->files);
  for (int i = 0; i < f->n_jobs; i++) job_free(f->jobs[i]);
  free(f->jobs);
  for (int i = 0; i < f->n_unlinks; i++) free(f->unlinks[i]);
  free(f->unlinks);
  free(f->tmpl_setting);
  free(f->tmpl_text);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  free(f);
}
