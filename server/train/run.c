// run.c - a training run: trainer + data + run directory (ll_train_run.h).
#include "ll_train_run.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_chat.h"
#include "ll_config.h"
#include "ll_data.h"
#include "ll_error.h"
#include "ll_lora.h"

struct ll_train_run {
  struct ll_trainer *tr;
  struct ll_data *data;
  struct ll_train_source src;
  struct ll_trainer_params p;
  struct ll_train_run_opts o;
  char run_dir[PATH_MAX];
  struct ll_train_memory mem;
  int64_t resumed_from;
  double val_loss;
  int pending_best;  // the last evaluation set a record not yet saved as best.ckpt
  int64_t *kept; // steps of the step checkpoints on disk, oldest first
  int n_kept;
};

// ---------------------------------------------------------------- config

int ll_train_params_from_config(const struct ll_config *c, struct ll_trainer_params *p, char *err, size_t errlen) {
  ll_trainer_params_init(p);
  p->mode = c->train_mode && !strcmp(c->train_mode, "full") ? LL_TRAIN_FULL : LL_TRAIN_LORA;
  p->rank = (int)c->train_lora_rank;
  p->alpha = (float)c->train_lora_alpha;
  p->dropout = (float)c->train_lora_dropout;
  p->targets = 0;
  const char *s = c->train_lora_targets ? c->train_lora_targets : "";
  while (*s) { // "q,k,v" (the config loader checked the words)
    char w[16];
    size_t n = strcspn(s, ",");
    snprintf(w, sizeof w, "%.*s", (int)(n < 15 ? n : 15), s);
    int t = ll_lora_target_from_name(w);
    if (t < 0) return ll_errf(err, errlen, LL_EINVAL, "train.lora_targets: unknown target '%s' (q, k, v, o, gate, up, down)", w);
    p->targets |= 1u << t;
    s += n + (s[n] == ',');
  }
  if (p->mode == LL_TRAIN_LORA && !p->targets) return ll_errf(err, errlen, LL_EINVAL, "train.lora_targets: no target given");
  p->batch = (int)c->train_batch;
  p->seq_len = (int)c->train_seq_len;
  p->grad_accum = (int)c->train_grad_accum;
  p->steps = c->train_steps;
  p->lr = c->train_lr;
  p->warmup = c->train_warmup;
  p->schedule = !c->train_schedule || !strcmp(c->train_schedule, "cosine") ? LL_SCHED_COSINE
                : !strcmp(c->train_schedule, "linear")                    ? LL_SCHED_LINEAR
                                                                           : LL_SCHED_CONSTANT;
  p->min_lr_ratio = c->train_min_lr_ratio;
  p->weight_decay = c->train_weight_decay;
  p->clip = c->train_clip;
  p->seed = (uint64_t)c->train_seed;
  p->recompute = c->train_recompute;
  return 0;
}

// ---------------------------------------------------------------- files

static int mkdir_p(const char *path, char *err, size_t errlen) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return ll_errf(err, errlen, LL_ELIMIT, "run directory: path too long");
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s) continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return ll_errf(err, errlen, LL_EIO, "run directory '%s': %s", p, strerror(errno));
    *s = c;
    if (!c) break;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return ll_errf(err, errlen, LL_EIO, "run directory '%s' is not a directory", path);
  return 0;
}

static void fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

// name (last.ckpt / best.ckpt) -> the file at target, replaced atomically: a hard link under a
// temporary name, renamed over the old one.
static int publish_link(const char *dir, const char *target, const char *name, char *err, size_t errlen) {
  char tmp[PATH_MAX + 64], dst[PATH_MAX + 64];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld", dir, name, (long)getpid());
  snprintf(dst, sizeof dst, "%s/%s", dir, name);
  unlink(tmp);
  if (link(target, tmp) != 0) return ll_errf(err, errlen, LL_EIO, "checkpoint: cannot link '%s': %s", tmp, strerror(errno));
  if (rename(tmp, dst) != 0) {
    int e = errno;
    unlink(tmp);
    return ll_errf(err, errlen, LL_EIO, "checkpoint: cannot rename to '%s': %s", dst, strerror(e));
  }
  fsync_dir(dir);
  return 0;
}

// ---------------------------------------------------------------- the run

int ll_train_run_open(struct ll_train_run **out, const struct ll_model *m, struct ll_backend *be, const struct ll_tokenizer *tok,
                      const struct ll_trainer_params *p, const struct ll_train_run_opts *o, char *err, size_t errlen) {
  *out = NULL;
  if (!o->run_dir || !o->run_dir[0]) return ll_errf(err, errlen, LL_EINVAL, "train: no run directory (-o RUN_DIR)");
  if (!o->data_path || !o->data_path[0]) return ll_errf(err, errlen, LL_EINVAL, "train: no data (--data PATH or train.data)");
  if (!tok) return ll_errf(err, errlen, LL_EUNSUPPORTED, "train: the model has no tokenizer; training needs one to read text");
  struct ll_train_run *r = calloc(1, sizeof *r);
  if (!r) return ll_errf(err, errlen, LL_ENOMEM, "train: out of memory");
  r->p = *p;
  r->o = *o;
  r->resumed_from = -1;
  r->val_loss = NAN;
  snprintf(r->run_dir, sizeof r->run_dir, "%s", o->run_dir);
  r->o.run_dir = r->run_dir;
  struct ll_data_params dp;
  ll_data_params_init(&dp);
  dp.path = o->data_path;
  dp.seq_len = p->seq_len;
  dp.val_fraction = o->val_fraction;
  dp.seed = p->seed;
  char *tmpl = NULL;
  int rc = o->chat_template ? ll_chat_template_load(o->chat_template, &tmpl, err, errlen) : 0;
  dp.chat_template = tmpl;
  if (rc == 0) rc = ll_data_open(&r->data, &dp, tok, err, errlen);
  free(tmpl); // the data keeps its own copy
  if (rc == 0) {
    ll_data_train_source(r->data, &r->src);
    struct ll_trainer_params tp = *p;
    tp.arch = o->arch;
    tp.model_path = o->model_path;
    rc = ll_trainer_create(&r->tr, m, be, &tp, err, errlen);
  }
  if (rc == 0) ll_trainer_memory(r->tr, &r->mem);
  if (rc == 0 && !o->restart) { // resume when the directory holds a run
    char last[PATH_MAX + 16];
    snprintf(last, sizeof last, "%s/last.ckpt", r->run_dir);
    if (access(last, F_OK) == 0) {
      rc = ll_trainer_resume(r->tr, last, &r->src, err, errlen);
      struct ll_trainer_state st;
      ll_trainer_state(r->tr, &st);
      if (rc == 0) r->resumed_from = st.step;
    }
  }
  if (rc) {
    ll_train_run_close(r);
    return rc;
  }
  *out = r;
  return 0;
}

void ll_train_run_close(struct ll_train_run *r) {
  if (!r) return;
  ll_trainer_free(r->tr);
  ll_data_close(r->data);
  free(r->kept);
  free(r);
}

struct ll_trainer *ll_train_run_trainer(struct ll_train_run *r) { return r->tr; }
struct ll_train_source *ll_train_run_source(struct ll_train_run *r) { return &r->src; }
int64_t ll_train_run_resumed_from(const struct ll_train_run *r) { return r->resumed_from; }

int64_t ll_train_run_steps_per_epoch(const struct ll_train_run *r) {
  struct ll_data_stats st;
  ll_data_stats(r->data, &st);
  const int64_t per = (int64_t)r->p.batch * r->p.grad_accum;
  return per > 0 ? st.seqs_per_epoch / per : 0;
}

int ll_train_run_done(const struct ll_train_run *r) {
  struct ll_trainer_state st;
  ll_trainer_state(r->tr, &st);
  return st.step >= r->p.steps;
}

static void human(char *b, size_t cap, int64_t n) {
  if (n >= (1ll << 30)) snprintf(b, cap, "%.2f GiB", n / 1073741824.0);
  else if (n >= (1 << 20)) snprintf(b, cap, "%.1f MiB", n / 1048576.0);
  else snprintf(b, cap, "%.1f KiB", n / 1024.0);
}

int ll_train_run_describe(const struct ll_train_run *r, char *buf, size_t cap) {
  int n = ll_data_describe(r->data, buf, cap);
  if (n < 0 || (size_t)n >= cap) return n;
  char w[32], a[32], g[32], op[32], ac[32], tot[32];
  const struct ll_train_memory *m = &r->mem;
  human(w, sizeof w, m->weights), human(a, sizeof a, m->adapters), human(g, sizeof g, m->grads), human(op, sizeof op, m->optimizer);
  human(ac, sizeof ac, m->activations), human(tot, sizeof tot, m->weights + m->adapters + m->grads + m->optimizer + m->activations);
  const int64_t spe = ll_train_run_steps_per_epoch(r);
  char what[128] = "full-parameter";
  if (r->p.mode == LL_TRAIN_LORA) {
    int wl = snprintf(what, sizeof what, "LoRA r=%d alpha=%g dropout=%g on ", r->p.rank, r->p.alpha, r->p.dropout);
    for (int t = 0, first = 1; t < LL_LORA_N_TARGETS && wl > 0 && (size_t)wl < sizeof what; t++)
      if ((r->p.targets >> t) & 1) wl += snprintf(what + wl, sizeof what - (size_t)wl, "%s%s", first ? "" : ",", ll_lora_target_name(t)), first = 0;
  }
  int k = snprintf(buf + n, cap - (size_t)n,
                   "train: %s, %lld steps of %d x %d sequences of %d tokens (%lld tokens per step), %lld steps per epoch (%.2f epochs)\n"
                   "memory: weights %s, %s %s, gradients %s, optimizer %s, activations %s%s: %s\n",
                   what, (long long)r->p.steps, r->p.grad_accum, r->p.batch, r->p.seq_len,
                   (long long)r->p.grad_accum * r->p.batch * r->p.seq_len, (long long)spe, spe > 0 ? (double)r->p.steps / (double)spe : 0.0, w,
                   r->p.mode == LL_TRAIN_FULL ? "trained copies" : "adapters", a, g, op, ac, r->p.recompute ? " (recomputed per layer)" : "",
                   tot);
  return k < 0 ? k : n + k;
}

static int save_now(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen) {
  struct ll_trainer_state st;
  ll_trainer_state(r->tr, &st);
  int rc = mkdir_p(r->run_dir, err, errlen);
  if (rc) return rc;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/step-%08lld.ckpt", r->run_dir, (long long)st.step);
  if ((rc = ll_trainer_save(r->tr, path, &r->src, err, errlen))) return rc;
  if ((rc = publish_link(r->run_dir, path, "last.ckpt", err, errlen))) return rc;
  ev->saved = 1;
  snprintf(ev->path, sizeof ev->path, "%s", path);
  if (r->pending_best) {
    if ((rc = publish_link(r->run_dir, path, "best.ckpt", err, errlen))) return rc;
    ev->best = 1;
    r->pending_best = 0;
  }
  // Keep the last `keep` step checkpoints (the names last/best hold their own links).
  if (!r->n_kept || r->kept[r->n_kept - 1] != st.step) {
    int64_t *nk = realloc(r->kept, (size_t)(r->n_kept + 1) * sizeof *nk);
    if (!nk) return ll_errf(err, errlen, LL_ENOMEM, "train: out of memory");
    r->kept = nk;
    r->kept[r->n_kept++] = st.step;
  }
  while (r->n_kept > (r->o.keep > 0 ? r->o.keep : 1)) {
    char old[PATH_MAX + 32];
    snprintf(old, sizeof old, "%s/step-%08lld.ckpt", r->run_dir, (long long)r->kept[0]);
    unlink(old);
    memmove(r->kept, r->kept + 1, (size_t)(r->n_kept - 1) * sizeof *r->kept);
    r->n_kept--;
  }
  return 0;
}

int ll_train_run_eval(struct ll_train_run *r, double *val, char *err, size_t errlen) {
  int rc = ll_trainer_eval(r->tr, &r->src, r->o.eval_seqs, val, err, errlen);
  if (rc == 0) r->val_loss = *val;
  return rc;
}

int ll_train_run_save(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen) {
  memset(ev, 0, sizeof *ev);
  ev->val_loss = r->val_loss;
  return save_now(r, ev, err, errlen);
}

int ll_train_run_step(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen) {
  memset(ev, 0, sizeof *ev);
  ev->val_loss = r->val_loss;
  int rc = ll_trainer_step(r->tr, &r->src, &ev->info, err, errlen);
  if (rc) return rc;
  const int64_t step = ev->info.step;
  ev->finished = step >= r->p.steps;
  if ((r->o.eval_every > 0 && step % r->o.eval_every == 0) || ev->finished) {
    double v;
    rc = ll_trainer_eval(r->tr, &r->src, r->o.eval_seqs, &v, err, errlen);
    if (rc == 0) {
      r->val_loss = ev->val_loss = v;
      ev->evaluated = 1;
      struct ll_trainer_state st;
      ll_trainer_state(r->tr, &st);
      if (v < st.best_val) { // a record: best.ckpt follows at the next checkpoint (HF's save-best rule)
        ll_trainer_set_best_val(r->tr, v);
        r->pending_best = 1;
      }
    } else if (rc != LL_ENOTFOUND) {
      return rc;
    }
    rc = 0;
  }
  if ((r->o.checkpoint_every > 0 && step % r->o.checkpoint_every == 0) || ev->finished) {
    char serr[sizeof ev->save_error];
    if (save_now(r, ev, serr, sizeof serr) != 0) {
      ev->save_failed = 1;
      snprintf(ev->save_error, sizeof ev->save_error, "%s", serr);
    }
  }
  return 0;
}
