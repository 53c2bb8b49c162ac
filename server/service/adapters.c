// adapters.c - hot-loaded LoRA adapters: monitor commands and the watched directory (ll_adapters.h).
#include "ll_adapters.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ll_error.h"
#include "ll_log.h"
#include "ll_lora.h"
#include "ll_proto.h"
#include "ll_sched.h"

#define MAX_DIR_FILES 64 // adapters taken from the watched directory (the scheduler serves 32 names)

// What a directory entry looked like when last loaded (or failed): a change reloads it.
struct seen {
  char name[LL_ADAPTER_NAME_MAX + 1];
  char path[PATH_MAX];
  int64_t mtime_ns, size, ino;
  int loaded; // 1: published under name; 0: failed (retried when the file changes)
};

struct ll_adapters {
  uv_loop_t *loop;
  struct ll_sched *sched;
  struct ll_lora_dims dims;
  char dir[PATH_MAX];
  uv_timer_t timer;
  int timer_open, closing, pending; // pending: work requests not yet completed
  int scanning;
  uint64_t version; // the last version number given (monotonic over every name)
  struct seen seen[MAX_DIR_FILES];
  int n_seen;
};

static void lora_release(struct ll_lora *a) { ll_lora_free(a); }

// ---- one load on a worker thread

struct load_req {
  uv_work_t w;
  struct ll_adapters *A;
  char name[LL_ADAPTER_NAME_MAX + 1];
  char path[PATH_MAX];
  struct ll_lora *a;
  int rc;
  char err[768];
  ll_adapters_done_fn done;
  void *user;
};

static void load_work(uv_work_t *w) {
  struct load_req *q = w->data;
  // Host memory (no backend): loaded beside the compute thread without touching its device.
  q->rc = ll_lora_load(&q->a, q->path, &q->A->dims, NULL, q->err, sizeof q->err);
}

// Publishes q->a as the next version of q->name; rc and a message.
static int publish(struct ll_adapters *A, const char *name, struct ll_lora **a, const char *path, char *msg, size_t cap) {
  const uint64_t v = A->version + 1;
  int rc = ll_sched_adapter_publish(A->sched, name, *a, v, lora_release);
  if (rc) {
    snprintf(msg, cap, "adapter '%s' from %s: %s", name, path,
             rc == LL_EINVAL ? "the name cannot be used (none, live, or not an adapter name: llsrv-protocol(7))" : rc == LL_ELIMIT ? "too many adapters (32)" : ll_strerror(rc));
    return rc;
  }
  A->version = v;
  snprintf(msg, cap, "adapter '%s' version %llu from %s: rank %d, alpha %g, %lld parameters", name, (unsigned long long)v, path, (*a)->rank,
           (double)(*a)->alpha, (long long)(*a)->n_params);
  *a = NULL; // the scheduler's now
  return 0;
}

static void load_after(uv_work_t *w, int status) {
  struct load_req *q = w->data;
  struct ll_adapters *A = q->A;
  A->pending--;
  char msg[1200];
  int rc = q->rc;
  if (status != 0 || A->closing) {
    rc = LL_ESTATE;
    snprintf(msg, sizeof msg, "adapter '%s': the server is stopping", q->name);
  } else if (rc) {
    snprintf(msg, sizeof msg, "adapter '%s': %s", q->name, q->err);
  } else {
    rc = publish(A, q->name, &q->a, q->path, msg, sizeof msg);
  }
  ll_log(rc ? LL_LOG_ERROR : LL_LOG_INFO, "%s%s", msg, rc ? "; the version served before stays" : "");
  ll_lora_free(q->a);
  if (q->done) q->done(q->user, rc, msg);
  free(q);
}

int ll_adapters_load(struct ll_adapters *A, const char *name, const char *path, ll_adapters_done_fn done, void *user) {
  if (A->closing) return LL_ESTATE;
  if (!name[0] || strlen(name) >= sizeof ((struct load_req *)0)->name || strlen(path) >= PATH_MAX || !path[0]) return LL_EINVAL;
  struct load_req *q = calloc(1, sizeof *q);
  if (!q) return LL_ENOMEM;
  q->A = A, q->done = done, q->user = user, q->w.data = q;
  snprintf(q->name, sizeof q->name, "%s", name);
  snprintf(q->path, sizeof q->path, "%s", path);
  int rc = uv_queue_work(A->loop, &q->w, load_work, load_after);
  if (rc) {
    free(q);
    return LL_EIO;
  }
  A->pending++;
  return 0;
}

int ll_adapters_unload(struct ll_adapters *A, const char *name, char *msg, size_t cap) {
  struct ll_sched_adapter_version v[64];
  int n = ll_sched_adapter_versions(A->sched, v, 64), found = 0;
  for (int i = 0; i < n && i < 64; i++) found |= v[i].registered && !strcmp(v[i].name, name);
  if (!found) {
    snprintf(msg, cap, "no hot-loaded adapter '%s'", name);
    return LL_ENOTFOUND;
  }
  ll_sched_adapter_publish(A->sched, name, NULL, 0, NULL);
  for (int i = 0; i < A->n_seen; i++) // a file of the watched directory comes back only when it changes
    if (!strcmp(A->seen[i].name, name)) A->seen[i].loaded = 0;
  snprintf(msg, cap, "adapter '%s' unloaded (requests in flight finish with it)", name);
  ll_log(LL_LOG_INFO, "%s", msg);
  return 0;
}

// ---- the watched directory: a scan on a worker thread, then publish on the loop

struct scan_file {
  char name[LL_ADAPTER_NAME_MAX + 1];
  char path[PATH_MAX];
  int64_t mtime_ns, size, ino;
  int changed;          // new or different from what was seen: loaded below
  struct ll_lora *a;    // loaded (changed files)
  int rc;
  char err[512];
};

struct scan_req {
  uv_work_t w;
  struct ll_adapters *A;
  struct seen seen[MAX_DIR_FILES]; // a copy: the worker reads it while the loop may change A's
  int n_seen;
  struct scan_file *files;
  int n_files, too_many;
  int rc;
  char err[PATH_MAX + 256];
};

static int adapter_file(const char *nm, char *stem, size_t cap) {
  const char *dot = strrchr(nm, '.');
  if (!dot || nm[0] == '.' || (strcmp(dot, ".gguf") != 0 && strcmp(dot, ".ckpt") != 0)) return 0; // ours only (not .tmp-*)
  const size_t n = (size_t)(dot - nm);
  if (n == 0 || n >= cap) return 0;
  memcpy(stem, nm, n);
  stem[n] = 0;
  return 1;
}

static void scan_work(uv_work_t *w) {
  struct scan_req *q = w->data;
  struct ll_adapters *A = q->A;
  DIR *d = opendir(A->dir);
  if (!d) {
    q->rc = LL_EIO;
    snprintf(q->err, sizeof q->err, "adapter_dir %s: %s", A->dir, strerror(errno));
    return;
  }
  q->files = calloc(MAX_DIR_FILES, sizeof *q->files);
  if (!q->files) {
    closedir(d);
    q->rc = LL_ENOMEM;
    snprintf(q->err, sizeof q->err, "adapter_dir: out of memory");
    return;
  }
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char stem[LL_ADAPTER_NAME_MAX + 1];
    if (!adapter_file(e->d_name, stem, sizeof stem)) continue;
    if (q->n_files == MAX_DIR_FILES) {
      q->too_many = 1;
      break;
    }
    struct scan_file *f = &q->files[q->n_files];
    snprintf(f->name, sizeof f->name, "%s", stem);
    if (snprintf(f->path, sizeof f->path, "%s/%s", A->dir, e->d_name) >= (int)sizeof f->path) continue;
    struct stat sb;
    if (stat(f->path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    f->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec, f->size = sb.st_size, f->ino = (int64_t)sb.st_ino;
    f->changed = 1;
    for (int i = 0; i < q->n_seen; i++)
      if (!strcmp(q->seen[i].path, f->path) && q->seen[i].mtime_ns == f->mtime_ns && q->seen[i].size == f->size && q->seen[i].ino == f->ino)
        f->changed = 0;
    if (f->changed) f->rc = ll_lora_load(&f->a, f->path, &A->dims, NULL, f->err, sizeof f->err);
    q->n_files++;
  }
  closedir(d);
}

static void scan_after(uv_work_t *w, int status) {
  struct scan_req *q = w->data;
  struct ll_adapters *A = q->A;
  A->pending--;
  A->scanning = 0;
  if (status == 0 && !A->closing) {
    if (q->rc) ll_log(LL_LOG_WARN, "%s (the adapters served stay; scanned again in %.0f s)", q->err, uv_timer_get_repeat(&A->timer) / 1e3);
    if (q->too_many) ll_log(LL_LOG_WARN, "adapter_dir %s: more than %d adapter files; the others are left out", A->dir, MAX_DIR_FILES);
    struct seen next[MAX_DIR_FILES];
    int n = 0;
    for (int k = 0; q->rc == 0 && k < q->n_files; k++) {
      struct scan_file *f = &q->files[k];
      struct seen *s = &next[n++];
      memset(s, 0, sizeof *s);
      snprintf(s->name, sizeof s->name, "%s", f->name);
      snprintf(s->path, sizeof s->path, "%s", f->path);
      s->mtime_ns = f->mtime_ns, s->size = f->size, s->ino = f->ino;
      for (int i = 0; i < A->n_seen; i++) // as it was (a failed new version leaves the old one served)
        if (!strcmp(A->seen[i].path, f->path)) s->loaded = A->seen[i].loaded;
      if (!f->changed) continue;
      char msg[1200];
      if (f->rc) {
        ll_log(LL_LOG_ERROR, "adapter_dir: %s: %s; the version served before (if any) stays, and the file is tried again when it changes", f->path,
               f->err);
        continue;
      }
      s->loaded = publish(A, f->name, &f->a, f->path, msg, sizeof msg) == 0;
      ll_log(s->loaded ? LL_LOG_INFO : LL_LOG_ERROR, "adapter_dir: %s", msg);
    }
    // Files gone: their names are unloaded (in-flight requests finish with them).
    for (int i = 0; q->rc == 0 && i < A->n_seen; i++) {
      int still = 0;
      for (int k = 0; k < n; k++) still |= !strcmp(next[k].name, A->seen[i].name) && next[k].loaded;
      if (A->seen[i].loaded && !still) {
        ll_sched_adapter_publish(A->sched, A->seen[i].name, NULL, 0, NULL);
        ll_log(LL_LOG_INFO, "adapter_dir: %s is gone: adapter '%s' unloaded (requests in flight finish with it)", A->seen[i].path, A->seen[i].name);
      }
    }
    if (q->rc == 0) {
      memcpy(A->seen, next, (size_t)n * sizeof *next);
      A->n_seen = n;
    }
  }
  for (int k = 0; k < q->n_files; k++) ll_lora_free(q->files[k].a);
  free(q->files);
  free(q);
}

static void on_scan_timer(uv_timer_t *t) {
  struct ll_adapters *A = t->data;
  if (A->scanning || A->closing) return; // one scan at a time (a slow disk: the next tick tries)
  struct scan_req *q = calloc(1, sizeof *q);
  if (!q) return;
  q->A = A, q->w.data = q;
  memcpy(q->seen, A->seen, (size_t)A->n_seen * sizeof *A->seen);
  q->n_seen = A->n_seen;
  if (uv_queue_work(A->loop, &q->w, scan_work, scan_after) != 0) {
    free(q);
    return;
  }
  A->scanning = 1;
  A->pending++;
}

int ll_adapters_create(struct ll_adapters **out, uv_loop_t *loop, struct ll_sched *s, const struct ll_lora_dims *dims, const char *dir,
                       double poll_s, char *err, size_t errlen) {
  *out = NULL;
  struct ll_adapters *A = calloc(1, sizeof *A);
  if (!A) return ll_errf(err, errlen, LL_ENOMEM, "adapters: out of memory");
  A->loop = loop, A->sched = s, A->dims = *dims;
  if (dir && dir[0]) {
    struct stat sb;
    if (strlen(dir) >= sizeof A->dir - 80) {
      free(A);
      return ll_errf(err, errlen, LL_EINVAL, "adapter_dir: path too long");
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      free(A);
      return ll_errf(err, errlen, LL_EINVAL, "adapter_dir %s: %s", dir, errno && stat(dir, &sb) != 0 ? strerror(errno) : "not a directory");
    }
    snprintf(A->dir, sizeof A->dir, "%s", dir);
    uv_timer_init(loop, &A->timer);
    A->timer.data = A;
    A->timer_open = 1;
    const uint64_t ms = poll_s > 0 ? (uint64_t)(poll_s * 1000) : 2000;
    uv_timer_start(&A->timer, on_scan_timer, 0, ms ? ms : 1);
  }
  *out = A;
  return 0;
}

static void on_timer_closed(uv_handle_t *h) {
  struct ll_adapters *A = h->data;
  A->timer_open = 0;
}

void ll_adapters_close(struct ll_adapters *A) {
  if (!A || A->closing) return;
  A->closing = 1;
  if (A->timer_open) uv_close((uv_handle_t *)&A->timer, on_timer_closed);
}

int ll_adapters_closed(const struct ll_adapters *A) { return !A || (A->closing && !A->timer_open && A->pending == 0); }

void ll_adapters_free(struct ll_adapters *A) { free(A); }
