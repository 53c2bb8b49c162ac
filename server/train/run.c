// run.c - a training run: trainer + data + run directory (ll_train_run.h).
#include "ll_train_run.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <dirent.h>
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
#include "ll_fileio.h"
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
  int pending_best;  // the last evaluation set a record, to be linked as best.ckpt by this step's checkpoint
  int64_t *kept; // steps of the step checkpoints this process wrote (the last `keep`), oldest first
  int n_kept;
  int64_t *damaged; // steps of step checkpoints that failed to load at open: never pruned, never counted
  int n_damaged;
  char resumed_path[PATH_MAX + 32];
  char notes[2048]; // what opening the run did to the directory (skipped checkpoints, stale files)
  int64_t skipped_run; // consecutive skipped steps
  struct ll_train_diverge dv; // the last losses of steps that were not skipped
  struct ll_train_comm comm;  // size 1: alone
  int writer;                 // rank 0 (or alone): writes the run directory
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
  for (s = c->train_lora_experts ? c->train_lora_experts : ""; *s;) { // "gate,up,down": the experts' slots; *_shexp: the shared expert's
    static const char *const xs[6] = {"gate", "up", "down", "gate_shexp", "up_shexp", "down_shexp"};
    const size_t n = strcspn(s, ",");
    int x = 0;
    while (x < 6 && !(strlen(xs[x]) == n && strncmp(s, xs[x], n) == 0)) x++;
    if (x == 6)
      return ll_errf(err, errlen, LL_EINVAL, "train.lora_experts: unknown matrix '%.*s' (gate, up, down, gate_shexp, up_shexp, down_shexp)",
                     (int)(n < 32 ? n : 32), s);
    p->targets |= 1u << (x < 3 ? LL_LORA_GATE_EXPS + x : LL_LORA_GATE_SHEXP + x - 3);
    s += n + (s[n] == ',');
  }
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
  p->moe_aux_coef = c->train_moe_aux_coef;
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

// Our own names in a run directory: step-NNNNNNNN.ckpt (8 or more digits), last.ckpt, best.ckpt,
// last.ckpt.damaged, and their temporary files: ".<name>.tmp-<suffix>" (the .ckpt writer's
// mkstemp suffix, publish_link's pid). Anything else in the directory is the user's.
static int step_name(const char *nm, int64_t *step) {
  if (strncmp(nm, "step-", 5) != 0) return 0;
  const char *d = nm + 5;
  size_t nd = strspn(d, "0123456789");
  if (nd < 8 || nd > 18 || strcmp(d + nd, ".ckpt") != 0) return 0;
  *step = strtoll(d, NULL, 10);
  return 1;
}

static int temp_name(const char *nm) {
  if (nm[0] != '.') return 0;
  const char *t = strstr(nm, ".tmp-");
  if (!t || t == nm) return 0;
  char base[NAME_MAX + 1];
  snprintf(base, sizeof base, "%.*s", (int)(t - nm - 1), nm + 1);
  int64_t st;
  if (!step_name(base, &st) && strcmp(base, "last.ckpt") != 0 && strcmp(base, "best.ckpt") != 0 && strcmp(base, "last.ckpt.damaged") != 0)
    return 0;
  const char *x = t + 5;
  size_t n = strlen(x);
  return n >= 1 && n <= 20 && strspn(x, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") == n;
}

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

// The step checkpoints in dir, ascending (*steps malloc'd, NULL when none). Removes our stale
// temporary files on the way when sweep is set (a write cut short by kill -9 leaves one, MBs each).
static int scan_dir(const char *dir, int sweep, int64_t **steps, int *n, int *n_swept, char *err, size_t errlen) {
  *steps = NULL, *n = 0;
  if (n_swept) *n_swept = 0;
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return ll_errf(err, errlen, LL_EIO, "run directory '%s': %s", dir, strerror(errno));
  }
  int cap = 0, rc = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL && rc == 0;) {
    int64_t st;
    char p[PATH_MAX + NAME_MAX + 2];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue; // ours are plain files; leave anything else alone
    if (sweep && temp_name(e->d_name)) {
      if (ll_tmp_unlink_stale(p) && n_swept) (*n_swept)++; // not one a live writer holds (ll_fileio.h)
    } else if (step_name(e->d_name, &st)) {
      if (*n == cap) {
        cap = cap ? 2 * cap : 16;
        int64_t *ns = realloc(*steps, (size_t)cap * sizeof *ns);
        if (!ns) {
          rc = ll_errf(err, errlen, LL_ENOMEM, "train: out of memory");
          break;
        }
        *steps = ns;
      }
      (*steps)[(*n)++] = st;
    }
  }
  closedir(d);
  if (rc) {
    free(*steps);
    *steps = NULL, *n = 0;
    return rc;
  }
  if (*n > 1) qsort(*steps, (size_t)*n, sizeof **steps, cmp_i64);
  return 0;
}

static int has_step(const int64_t *v, int n, int64_t s) {
  for (int i = 0; i < n; i++)
    if (v[i] == s) return 1;
  return 0;
}

// `keep` applied to what is on disk (earlier processes' checkpoints too): the `keep` newest step
// checkpoints stay, and so do the last `keep` this process wrote (after --restart the old run's
// higher steps would otherwise outrank them), the one it resumed from until it has written one
// of its own, and those that failed to load (kept to be looked at; they count for nothing, so a
// damaged file never pushes a good one out).
static int prune(struct ll_train_run *r, char *err, size_t errlen) {
  int64_t *steps;
  int n;
  int rc = scan_dir(r->run_dir, 1, &steps, &n, NULL, err, errlen);
  if (rc) return rc;
  const int64_t keep = r->o.keep > 0 ? r->o.keep : 1;
  int64_t newer = 0; // good step checkpoints above steps[i]
  for (int i = n - 1; i >= 0; i--) {
    if (has_step(r->damaged, r->n_damaged, steps[i])) continue;
    if (newer++ < keep || (steps[i] == r->resumed_from && !r->n_kept) || has_step(r->kept, r->n_kept, steps[i])) continue;
    char old[PATH_MAX + 32];
    snprintf(old, sizeof old, "%s/step-%08lld.ckpt", r->run_dir, (long long)steps[i]);
    unlink(old);
  }
  free(steps);
  return 0;
}

static void note(struct ll_train_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct ll_train_run *r, const char *fmt, ...) {
  size_t l = strlen(r->notes);
  if (l + 1 >= sizeof r->notes) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->notes + l, sizeof r->notes - l, fmt, ap);
  va_end(ap);
}

// Resume from the newest checkpoint that loads: last.ckpt, then the step checkpoints from the
// highest down. A file that fails as damaged (checksum, truncation, format, I/O) is skipped and
// left where it is; one refused for not matching this run (LL_EINVAL: other mode, rank,
// targets, model) stops the run as before, since the older ones would not match either.
// 0 with r->resumed_from set, or nothing to resume (-1), or the first file's error.
static int resume_newest(struct ll_train_run *r, char *err, size_t errlen) {
  int64_t *steps;
  int n;
  int swept = 0;
  int rc = scan_dir(r->run_dir, r->writer, &steps, &n, &swept, err, errlen);
  if (rc) return rc;
  if (swept) note(r, "removed %d stale temporary file%s of interrupted writes\n", swept, swept == 1 ? "" : "s");
  char path[PATH_MAX + 32], first_err[600] = "", skipped[1024] = "";
  struct stat bad[8]; // inodes that failed (last.ckpt is a hard link to a step checkpoint)
  int n_bad = 0, tried = 0;
  snprintf(path, sizeof path, "%s/last.ckpt", r->run_dir);
  struct stat sb;
  int i = n; // next step checkpoint to try: steps[i - 1]
  int is_last = access(path, F_OK) == 0;
  if (!is_last && n == 0) goto out;
  if (!is_last) i = n, snprintf(path, sizeof path, "%s/step-%08lld.ckpt", r->run_dir, (long long)steps[--i]);
  for (;;) {
    int same = -1;
    if (stat(path, &sb) == 0)
      for (int k = 0; k < n_bad; k++)
        if (bad[k].st_dev == sb.st_dev && bad[k].st_ino == sb.st_ino) same = k;
    char e1[600];
    int r1;
    if (same >= 0) {
      r1 = LL_EFORMAT;
      snprintf(e1, sizeof e1, "the same file as one above");
    } else {
      r1 = ll_trainer_resume(r->tr, path, &r->src, e1, sizeof e1);
    }
    tried++;
    if (r1 == 0) {
      struct ll_trainer_state st;
      ll_trainer_state(r->tr, &st);
      r->resumed_from = st.step;
      snprintf(r->resumed_path, sizeof r->resumed_path, "%s", path);
      break;
    }
    if (r1 == LL_EINVAL || r1 == LL_ENOMEM) { // not this run's checkpoint, or no memory: no point in older ones
      rc = ll_errf(err, errlen, r1, "%s", e1);
      goto out;
    }
    if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", e1);
    if (same < 0 && n_bad < 8 && stat(path, &sb) == 0) bad[n_bad++] = sb;
    const char *base = strrchr(path, '/') + 1;
    size_t sl = strlen(skipped);
    snprintf(skipped + sl, sizeof skipped - sl, "%s%s (%s)", sl ? "; " : "", base, same >= 0 ? "the same file as one above" : e1);
    int64_t s;
    if (step_name(base, &s) && r->n_damaged < 64) {
      int64_t *nd = realloc(r->damaged, (size_t)(r->n_damaged + 1) * sizeof *nd);
      if (nd) r->damaged = nd, r->damaged[r->n_damaged++] = s;
    }
    if (i == 0) break;
    snprintf(path, sizeof path, "%s/step-%08lld.ckpt", r->run_dir, (long long)steps[--i]);
  }
  if (r->resumed_from < 0) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s%s", first_err,
                 tried > 1 ? " (and no older checkpoint of the run directory loads either)" : "");
    goto out;
  }
  if (skipped[0]) {
    // The damaged last.ckpt is kept as last.ckpt.damaged: the next save replaces last.ckpt.
    char last[PATH_MAX + 16], kept[80] = "";
    snprintf(last, sizeof last, "%s/last.ckpt", r->run_dir);
    char lerr[64];
    if (r->writer && is_last && strcmp(r->resumed_path, last) != 0 && publish_link(r->run_dir, last, "last.ckpt.damaged", lerr, sizeof lerr) == 0)
      snprintf(kept, sizeof kept, "; the damaged last.ckpt is kept as last.ckpt.damaged");
    note(r, "resuming from %s, the newest checkpoint that loads; skipped newer: %s%s\n", strrchr(r->resumed_path, '/') + 1, skipped, kept);
  }
out:
  free(steps);
  return rc;
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
  r->comm.size = 1;
  if (o->comm && o->comm->size > 1) r->comm = *o->comm;
  r->writer = r->comm.rank == 0;
  r->o.comm = NULL;
  snprintf(r->run_dir, sizeof r->run_dir, "%s", o->run_dir);
  r->o.run_dir = r->run_dir;
  struct ll_data_params dp;
  ll_data_params_init(&dp);
  dp.path = o->data_path;
  dp.seq_len = p->seq_len;
  dp.val_fraction = o->val_fraction;
  dp.seed = p->seed;
  dp.shuffle_pieces = o->shuffle_pieces;
  dp.train_on_thinking = o->train_on_thinking;
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
    if (rc == 0) rc = ll_trainer_set_comm(r->tr, &r->comm, err, errlen);
  }
  if (rc == 0) ll_trainer_memory(r->tr, &r->mem);
  if (rc == 0 && !o->restart) { // resume when the directory holds a run
    rc = resume_newest(r, err, errlen);
    // Checkpoints of earlier processes count against `keep` too (6 restarts used to leave 6 x keep).
    if (rc == 0 && r->writer && prune(r, err, errlen) != 0) rc = 0; // an unreadable directory fails at the first save, naming it
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
  free(r->damaged);
  free(r);
}

struct ll_trainer *ll_train_run_trainer(struct ll_train_run *r) { return r->tr; }
struct ll_train_source *ll_train_run_source(struct ll_train_run *r) { return &r->src; }
int64_t ll_train_run_resumed_from(const struct ll_train_run *r) { return r->resumed_from; }

int64_t ll_train_run_steps_per_epoch(const struct ll_train_run *r) {
  struct ll_data_stats st;
  ll_data_stats(r->data, &st);
  const int64_t per = (int64_t)r->p.batch * r->p.grad_accum * r->comm.size;
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
  char ranks[32] = ""; // data parallel: N ranks x grad_accum x batch
  if (r->comm.size > 1) snprintf(ranks, sizeof ranks, "%d ranks x ", r->comm.size);
  char what[128] = "full-parameter";
  if (r->p.mode == LL_TRAIN_LORA) {
    int wl = snprintf(what, sizeof what, "LoRA r=%d alpha=%g dropout=%g on ", r->p.rank, r->p.alpha, r->p.dropout);
    for (int t = 0, first = 1; t < LL_LORA_N_SLOTS && wl > 0 && (size_t)wl < sizeof what; t++)
      if ((r->p.targets >> t) & 1) wl += snprintf(what + wl, sizeof what - (size_t)wl, "%s%s", first ? "" : ",", ll_lora_target_name(t)), first = 0;
  }
  int k = snprintf(buf + n, cap - (size_t)n,
                   "train: %s, %lld steps of %s%d x %d sequences of %d tokens (%lld tokens per step), %lld steps per epoch (%.2f epochs)\n"
                   "memory: weights %s, %s %s, gradients %s, optimizer %s, activations %s%s: %s\n",
                   what, (long long)r->p.steps, ranks, r->p.grad_accum, r->p.batch, r->p.seq_len,
                   (long long)r->p.grad_accum * r->p.batch * r->p.seq_len * r->comm.size, (long long)spe, spe > 0 ? (double)r->p.steps / (double)spe : 0.0, w,
                   r->p.mode == LL_TRAIN_FULL ? "trained copies" : "adapters", a, g, op, ac, r->p.recompute ? " (recomputed per layer)" : "",
                   tot);
  return k < 0 ? k : n + k;
}

// Data parallel: every rank's parameters hash as rank 0's (called by every rank at the same
// step: a collective). LL_ESTATE naming the first rank that differs.
static int check_ranks(struct ll_train_run *r, uint64_t *hash, int64_t step, char *err, size_t errlen) {
  *hash = ll_trainer_param_hash(r->tr);
  if (r->comm.size <= 1) return 0;
  const int N = r->comm.size;
  double mine[2] = {(double)(*hash >> 32), (double)(*hash & 0xffffffffu)}, *all = malloc((size_t)N * 2 * sizeof *all);
  if (!all) return ll_errf(err, errlen, LL_ENOMEM, "train: out of memory");
  int rc = r->comm.gather_f64(r->comm.user, mine, 2, all, err, errlen);
  for (int k = 1; rc == 0 && k < N; k++)
    if (all[2 * k] != all[0] || all[2 * k + 1] != all[1])
      rc = ll_errf(err, errlen, LL_ESTATE, "data parallel: at step %lld rank %d's parameters (hash %08llx%08llx) differ from rank 0's (%08llx%08llx)",
                   (long long)step, k, (unsigned long long)all[2 * k], (unsigned long long)all[2 * k + 1], (unsigned long long)all[0],
                   (unsigned long long)all[1]);
  free(all);
  return rc;
}

static int save_now(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen) {
  struct ll_trainer_state st;
  ll_trainer_state(r->tr, &st);
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/step-%08lld.ckpt", r->run_dir, (long long)st.step);
  int rc;
  if (!r->writer) { // rank 0 writes; the others hold the same parameters (checked above)
    ev->saved = 1;
    snprintf(ev->path, sizeof ev->path, "%s", path);
    r->pending_best = 0;
    return 0;
  }
  if ((rc = mkdir_p(r->run_dir, err, errlen))) return rc;
  if ((rc = ll_trainer_save(r->tr, path, &r->src, err, errlen))) return rc;
  for (int i = 0; i < r->n_damaged; i++) // rewritten: no longer the damaged file
    if (r->damaged[i] == st.step) r->damaged[i--] = r->damaged[--r->n_damaged];
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
  const int64_t keep = r->o.keep > 0 ? r->o.keep : 1;
  if (r->n_kept > keep) {
    memmove(r->kept, r->kept + (r->n_kept - keep), (size_t)keep * sizeof *r->kept);
    r->n_kept = (int)keep;
  }
  return prune(r, err, errlen);
}

// A validation record outside a checkpoint step: best.ckpt written now, from these weights.
// Linking the next step checkpoint instead made best.ckpt whatever the weights had become by
// then (a diverged model's, with lr 1). On failure best.ckpt and best_val stay the previous
// record's, so the next record writes it.
static int write_best(struct ll_train_run *r, double v, char *err, size_t errlen) {
  struct ll_trainer_state st;
  ll_trainer_state(r->tr, &st);
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/best.ckpt", r->run_dir);
  ll_trainer_set_best_val(r->tr, v); // recorded in the checkpoint itself
  if (!r->writer) return 0;           // rank 0 writes it
  int rc = mkdir_p(r->run_dir, err, errlen);
  if (rc == 0) rc = ll_trainer_save(r->tr, path, &r->src, err, errlen);
  if (rc) {
    ll_trainer_set_best_val(r->tr, st.best_val);
    return rc;
  }
  fsync_dir(r->run_dir);
  return 0;
}

int ll_train_run_eval(struct ll_train_run *r, double *val, char *err, size_t errlen) {
  int rc = ll_trainer_eval(r->tr, &r->src, r->o.eval_seqs, val, err, errlen);
  if (rc) {
    *val = NAN;
    return rc;
  }
  r->val_loss = *val;
  // The weights before the first step are a candidate too (in LoRA mode: the base model): a
  // run that only gets worse (diverges) leaves them as best.ckpt.
  struct ll_trainer_state st;
  ll_trainer_state(r->tr, &st);
  if (*val < st.best_val && (rc = write_best(r, *val, err, errlen)) != 0) return rc;
  return 0;
}

int ll_train_run_save(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen) {
  memset(ev, 0, sizeof *ev);
  ev->val_loss = r->val_loss;
  struct ll_trainer_state st;
  ll_trainer_state(r->tr, &st);
  int rc = check_ranks(r, &ev->param_hash, st.step, err, errlen);
  return rc ? rc : save_now(r, ev, err, errlen);
}

// The loss far above its running minimum, both smoothed over LL_TRAIN_DIVERGE_SMOOTH steps
// (single batches differ by nats: a page of markup next to one of prose): the mean of the last
// few losses > 2x the lowest such mean of the last LL_TRAIN_DIVERGE_WINDOW steps and more than
// 1 nat above it. Warned once until the mean comes back under the line.
int ll_train_diverge_feed(struct ll_train_diverge *r, double loss, double *mean_out, double *min_out) {
  enum { S = LL_TRAIN_DIVERGE_SMOOTH, W = LL_TRAIN_DIVERGE_WINDOW };
  r->win[r->i] = loss;
  r->i = (r->i + 1) % W;
  if (r->n < W) r->n++;
  if (r->n < S + 1) return 0; // a mean now and a loss before it
  // means of S consecutive losses, oldest first; the last one ends with this step's loss
  const int n = r->n, first = (r->i - n + W) % W;
  double lo = INFINITY, mean = 0;
  for (int k = 0; k + S <= n; k++) {
    double m = 0;
    for (int i = 0; i < S; i++) m += r->win[(first + k + i) % W];
    m /= S;
    if (k + S == n) mean = m;
    else if (k + S <= n - S && m < lo) lo = m; // earlier means that do not overlap the last one
  }
  // At the start of a run (the window holds its first losses) the means of its first 1..S-1
  // losses count too: a run that diverges within its first steps has no calm S-step mean.
  for (int j = 1; n < W && j < S && j <= n - S; j++) {
    double m = 0;
    for (int i = 0; i < j; i++) m += r->win[(first + i) % W];
    if (m / j < lo) lo = m / j;
  }
  const int high = isfinite(lo) && mean > 2 * lo && mean > lo + 1.0;
  const int warn = high && !r->high;
  r->high = high;
  *mean_out = mean, *min_out = lo;
  return warn;
}

int ll_train_run_step(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen) {
  memset(ev, 0, sizeof *ev);
  ev->val_loss = r->val_loss;
  int rc = ll_trainer_step(r->tr, &r->src, &ev->info, err, errlen);
  if (rc) return rc;
  const int64_t step = ev->info.step;
  ev->finished = step >= r->p.steps;
  if (ev->info.skipped) {
    // NaN/Inf for ever (a poisoned base, data the model cannot take) would skip every step to
    // the end of the schedule: stop instead, the checkpoints as they were.
    if (++r->skipped_run >= r->o.max_skipped && r->o.max_skipped > 0) {
      char last[PATH_MAX + 16];
      snprintf(last, sizeof last, "%s/last.ckpt", r->run_dir);
      return ll_errf(err, errlen, LL_ESTATE,
                     "%lld consecutive steps skipped for a non-finite loss or gradient (train.max_skipped_steps %lld), at step %lld: "
                     "stopped; %s%s", (long long)r->skipped_run, (long long)r->o.max_skipped, (long long)step,
                     access(last, F_OK) == 0 ? "the last good checkpoint is " : "no checkpoint was written",
                     access(last, F_OK) == 0 ? last : "");
    }
  } else {
    r->skipped_run = 0;
    if (ll_train_diverge_feed(&r->dv, ev->info.loss, &ev->loss_mean, &ev->loss_min)) {
      ev->diverging = 1;
    }
  }
  double best_before = INFINITY;
  const int save_due = (r->o.checkpoint_every > 0 && step % r->o.checkpoint_every == 0) || ev->finished;
  if ((r->o.eval_every > 0 && step % r->o.eval_every == 0) || ev->finished) {
    double v;
    rc = ll_trainer_eval(r->tr, &r->src, r->o.eval_seqs, &v, err, errlen);
    if (rc == 0) {
      r->val_loss = ev->val_loss = v;
      ev->evaluated = 1;
      struct ll_trainer_state st;
      ll_trainer_state(r->tr, &st);
      if (v < st.best_val) { // a record: best.ckpt holds these weights, the ones evaluated
        if (save_due) { // linked to this step's checkpoint below
          best_before = st.best_val;
          ll_trainer_set_best_val(r->tr, v);
          r->pending_best = 1;
        } else if (write_best(r, v, ev->save_error, sizeof ev->save_error) == 0) {
          ev->best = 1;
        } else {
          ev->save_failed = 1;
        }
      }
    } else if (rc != LL_ENOTFOUND) {
      return rc;
    }
    rc = 0;
  }
  if (save_due) {
    if ((rc = check_ranks(r, &ev->param_hash, step, err, errlen))) return rc; // ranks that differ: the run is wrong, stop
    char serr[sizeof ev->save_error];
    if (save_now(r, ev, serr, sizeof serr) != 0) {
      if (r->pending_best) { // not linked: a later checkpoint holds other weights
        ll_trainer_set_best_val(r->tr, best_before);
        r->pending_best = 0;
      }
      ev->save_failed = 1;
      snprintf(ev->save_error, sizeof ev->save_error, "%s", serr);
    }
  }
  return 0;
}

const char *ll_train_run_notes(const struct ll_train_run *r) { return r->notes; }
const char *ll_train_run_resumed_path(const struct ll_train_run *r) { return r->resumed_path; }
