// cmd_convert.c - `llsrv convert IN OUT [--quant keep|q8_0|q4_0|q4_1] [--threads N]`.
//
// IN: anything ll_model_open() reads (GGUF, llama2.c .bin, safetensors) or a .ckpt.
// OUT: a .ckpt (default) or, when it ends in ".gguf", a GGUF file.
// --quant re-encodes 2-D weight matrices (and 3-D expert stacks) whose rows are a multiple of 32 (norms, biases and
// other 1-D tensors become/stay F32); general.file_type records the result.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ll_ckpt.h"
#include "ll_cmd.h"
#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_modelfile.h"
#include "ll_quant.h"

// llama.cpp's LLAMA_FTYPE ids for general.file_type.
enum { FTYPE_ALL_F32 = 0, FTYPE_MOSTLY_Q4_0 = 2, FTYPE_MOSTLY_Q4_1 = 3, FTYPE_MOSTLY_Q8_0 = 7 };

static void usage(FILE *f) {
  fprintf(f, "usage: llsrv convert IN OUT.ckpt [--quant keep|q8_0|q4_0|q4_1] [--threads N] [--level Z]\n"
             "       llsrv convert IN.ckpt OUT.gguf\n"
             "IN is a GGUF file, a llama2.c .bin, a safetensors file or directory, or a .ckpt.\n"
             "--quant    re-encode 2-D weight matrices (default keep: tensors are copied bit-exactly)\n"
             "--threads  compression/quantization threads (default: online CPUs)\n"
             "--level    zstd level for .ckpt output (default 3)\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), k = strlen(suf);
  return n >= k && strcasecmp(s + n - k, suf) == 0;
}

// Bytes of a file, or of the regular files directly inside a directory (safetensors shards).
static uint64_t path_bytes(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return (uint64_t)st.st_size;
  uint64_t total = 0;
  DIR *d = opendir(path);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char q[4096];
    snprintf(q, sizeof q, "%s/%s", path, e->d_name);
    if (stat(q, &st) == 0 && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
  }
  if (d) closedir(d);
  return total;
}

static int file_sha256_hex(const char *path, char out[65]) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  unsigned char buf[1 << 16], d[32];
  unsigned int n = 0;
  int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
  ssize_t r;
  while (ok && (r = read(fd, buf, sizeof buf)) != 0) {
    if (r < 0) {
      if (errno == EINTR) continue;
      ok = 0;
      break;
    }
    ok = EVP_DigestUpdate(ctx, buf, (size_t)r) == 1;
  }
  ok = ok && EVP_DigestFinal_ex(ctx, d, &n) == 1 && n == 32;
  EVP_MD_CTX_free(ctx);
  close(fd);
  if (!ok) return -1;
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
  return 0;
}

// ---------------------------------------------------------------- progress bar

struct progress {
  int tty;
  double t0;
  const char *what;
};

static void progress_cb(void *user, const char *phase, uint64_t done, uint64_t total) {
  struct progress *p = user;
  if (!p->tty || total == 0) return;
  int width = 30, fill = (int)((double)done / (double)total * width);
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = 0;
  double dt = now_s() - p->t0;
  fprintf(stderr, "\r%s %-8s [%s] %3d%% %8.1f MB %6.1f s", p->what, phase, bar, (int)(100.0 * done / total),
          done / 1e6, dt);
  if (done >= total) fputc('\n', stderr);
  fflush(stderr);
}

// ---------------------------------------------------------------- quantization

struct qplan {
  int new_type;       // target type, or -1: keep the bytes
  uint64_t offset;    // in the new data block
  uint64_t nbytes;
};

struct qjob {
  struct ll_modelfile *mf;
  struct qplan *plan;
  unsigned char *block;
  atomic_ulong next;
  atomic_int rc;
  char err[256];
  pthread_mutex_t mu;
  struct progress *prog;
  atomic_ulong done;
  uint64_t total;
};

static int quant_one(struct qjob *j, uint64_t i) {
  const struct ll_tensor_info *t = &j->mf->tensors[i];
  const struct qplan *q = &j->plan[i];
  unsigned char *dst = j->block + q->offset;
  if (q->new_type < 0) {
    memcpy(dst, t->data, t->nbytes);
    return 0;
  }
  int64_t n0 = t->ne[0];
  uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
  size_t src_row = ll_row_size(t->type, n0), dst_row = ll_row_size(q->new_type, n0);
  float *buf = malloc((size_t)n0 * sizeof *buf);
  if (!buf) return LL_ENOMEM;
  int rc = 0;
  for (uint64_t r = 0; r < rows && !rc; r++) {
    const unsigned char *s = (const unsigned char *)t->data + r * src_row;
    rc = ll_dequantize_row(t->type, s, buf, n0);
    if (!rc) rc = ll_quantize_row(q->new_type, buf, dst + r * dst_row, n0);
  }
  free(buf);
  return rc;
}

static void *quant_thread(void *arg) {
  struct qjob *j = arg;
  for (;;) {
    uint64_t i = atomic_fetch_add(&j->next, 1);
    if (i >= j->mf->n_tensors || atomic_load(&j->rc)) break;
    int rc = quant_one(j, i);
    if (rc) {
      pthread_mutex_lock(&j->mu);
      if (!atomic_load(&j->rc)) {
        snprintf(j->err, sizeof j->err, "tensor '%s' (%s -> %s): %s", j->mf->tensors[i].name.ptr,
                 ll_type_name(j->mf->tensors[i].type), ll_type_name(j->plan[i].new_type), ll_strerror(rc));
        atomic_store(&j->rc, rc);
      }
      pthread_mutex_unlock(&j->mu);
      break;
    }
    uint64_t d = atomic_fetch_add(&j->done, j->mf->tensors[i].nbytes) + j->mf->tensors[i].nbytes;
    pthread_mutex_lock(&j->mu);
    progress_cb(j->prog, "quantize", d, j->total);
    pthread_mutex_unlock(&j->mu);
  }
  return NULL;
}

static int is_weight_matrix(const struct ll_tensor_info *t) {
  // 2-D matrices, and the 3-D expert stacks of a mixture of experts (each expert a matrix)
  const int experts = t->n_dims == 3 && strstr(t->name.ptr, "_exps.") != NULL;
  return (t->n_dims == 2 || experts) && (t->ne[2] == 1 || experts) && t->ne[3] == 1 && t->ne[0] % 32 == 0 &&
         ll_ckpt_role_from_tensor_name(t->name.ptr) == LL_CKPT_ROLE_WEIGHT;
}

// Re-encode mf's tensors for `target`; mf's tensors then point into *block (caller frees).
static int quantize_model(struct ll_modelfile *mf, int target, int n_threads, struct progress *prog,
                          void **block_out, char *err, size_t errlen) {
  uint64_t nt = mf->n_tensors, total = 0, in_total = 0;
  struct qplan *plan = calloc(nt ? nt : 1, sizeof *plan);
  if (!plan) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  for (uint64_t i = 0; i < nt; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    const struct ll_type_traits *tt = ll_type_traits_get(t->type);
    int want;
    if (is_weight_matrix(t)) {
      want = target;
      // The output projection is the most sensitive matrix: llama.cpp keeps it at higher
      // precision for 4-bit types (q6_K there); our best available quantizer is q8_0.
      if ((target == LL_TYPE_Q4_0 || target == LL_TYPE_Q4_1) && strcmp(t->name.ptr, "output.weight") == 0)
        want = LL_TYPE_Q8_0;
    } else {
      want = LL_TYPE_F32; // norms, biases, 1-D tensors, odd shapes
    }
    if (want == t->type) {
      plan[i].new_type = -1; // already there: keep the bytes exactly
    } else if (!tt || !tt->has_dequant || (want != LL_TYPE_F32 && ll_row_size(want, t->ne[0]) == 0)) {
      fprintf(stderr, "llsrv convert: keeping tensor '%s' as %s (cannot re-encode to %s)\n", t->name.ptr,
              ll_type_name(t->type), ll_type_name(want));
      plan[i].new_type = -1;
    } else {
      plan[i].new_type = want;
    }
    int ty = plan[i].new_type < 0 ? t->type : plan[i].new_type;
    uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    plan[i].nbytes = plan[i].new_type < 0 ? t->nbytes : ll_row_size(ty, t->ne[0]) * rows;
    plan[i].offset = total;
    total += (plan[i].nbytes + 63) / 64 * 64;
    in_total += t->nbytes;
  }
  unsigned char *block = aligned_alloc(64, total ? total : 64);
  if (!block) {
    free(plan);
    return ll_errf(err, errlen, LL_ENOMEM, "out of memory for %llu bytes of re-encoded tensors",
                   (unsigned long long)total);
  }
  struct qjob j = {.mf = mf, .plan = plan, .block = block, .prog = prog, .total = in_total};
  atomic_init(&j.next, 0);
  atomic_init(&j.rc, 0);
  atomic_init(&j.done, 0);
  pthread_mutex_init(&j.mu, NULL);
  pthread_t th[64];
  int ns = 0;
  for (int t = 1; t < n_threads && t < 64; t++)
    if (pthread_create(&th[ns], NULL, quant_thread, &j) == 0) ns++;
  quant_thread(&j);
  for (int t = 0; t < ns; t++) pthread_join(th[t], NULL);
  pthread_mutex_destroy(&j.mu);
  int rc = atomic_load(&j.rc);
  if (rc) {
    free(block);
    free(plan);
    return ll_errf(err, errlen, rc, "%s", j.err);
  }
  for (uint64_t i = 0; i < nt; i++) {
    struct ll_tensor_info *t = &mf->tensors[i];
    if (plan[i].new_type >= 0) t->type = plan[i].new_type;
    t->nbytes = plan[i].nbytes;
    t->data = block + plan[i].offset;
  }
  free(plan);
  *block_out = block;
  return 0;
}

// A .ckpt is opened here (parallel verified load, training state kept); everything else
// (GGUF, llama2.c .bin, safetensors) through ll_model_open's content detection.
static int open_input(const char *in, const unsigned char magic[8], struct ll_modelfile *mf,
                      struct ll_ckpt_manifest *man, int n_threads, char *err, size_t errlen) {
  if (ll_ckpt_is_ckpt(magic, 8)) return ll_ckpt_open_ex(in, mf, man, n_threads, err, errlen);
  return ll_model_open(in, mf, err, errlen);
}

// ---------------------------------------------------------------- command

int ll_cmd_convert(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *quant = "keep";
  long n_threads = sysconf(_SC_NPROCESSORS_ONLN);
  int level = 3;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--quant") == 0 && i + 1 < argc) {
      quant = argv[++i];
    } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
      char *end;
      n_threads = strtol(argv[++i], &end, 10);
      if (*end || n_threads < 1 || n_threads > 64) {
        fprintf(stderr, "llsrv convert: --threads must be 1..64\n");
        return 2;
      }
    } else if (strcmp(a, "--level") == 0 && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 19) {
        fprintf(stderr, "llsrv convert: --level must be 1..19\n");
        return 2;
      }
      level = (int)v;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "llsrv convert: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    } else if (!in) {
      in = a;
    } else if (!out) {
      out = a;
    } else {
      fprintf(stderr, "llsrv convert: unexpected argument '%s'\n", a);
      return 2;
    }
  }
  if (!in || !out) {
    usage(stderr);
    return 2;
  }
  if (n_threads < 1) n_threads = 1;
  if (n_threads > 64) n_threads = 64;
  int target = -1, ftype = -1;
  if (strcmp(quant, "q8_0") == 0) target = LL_TYPE_Q8_0, ftype = FTYPE_MOSTLY_Q8_0;
  else if (strcmp(quant, "q4_0") == 0) target = LL_TYPE_Q4_0, ftype = FTYPE_MOSTLY_Q4_0;
  else if (strcmp(quant, "q4_1") == 0) target = LL_TYPE_Q4_1, ftype = FTYPE_MOSTLY_Q4_1;
  else if (strcmp(quant, "f32") == 0) target = LL_TYPE_F32, ftype = FTYPE_ALL_F32;
  else if (strcmp(quant, "keep") != 0) {
    fprintf(stderr, "llsrv convert: --quant must be keep, q8_0, q4_0 or q4_1 (got '%s')\n", quant);
    return 2;
  }
  int to_gguf = ends_with(out, ".gguf");

  double t0 = now_s();
  struct progress prog = {isatty(2), t0, "convert"};
  struct ll_modelfile mf;
  char err[1024];
  ll_modelfile_init(&mf);
  unsigned char magic[8] = {0};
  {
    int fd = open(in, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      if (read(fd, magic, sizeof magic) != (ssize_t)sizeof magic) memset(magic, 0, sizeof magic);
      close(fd);
    }
  }
  // A .ckpt input keeps its training state (roles follow the tensor names).
  struct ll_ckpt_manifest man;
  memset(&man, 0, sizeof man);
  int rc = open_input(in, magic, &mf, &man, (int)n_threads, err, sizeof err);
  struct ll_ckpt_training training = man.training;
  ll_ckpt_manifest_free(&man);
  if (rc) {
    fprintf(stderr, "llsrv convert: %s\n", err);
    return 1;
  }
  uint64_t in_bytes = path_bytes(in);
  if (!mf.source_sha256[0]) { // provenance: the file we actually read
    struct stat st;
    if (stat(in, &st) == 0 && S_ISREG(st.st_mode)) file_sha256_hex(in, mf.source_sha256);
  }
  uint64_t n_params = 0;
  for (uint64_t i = 0; i < mf.n_tensors; i++)
    n_params += (uint64_t)mf.tensors[i].ne[0] * mf.tensors[i].ne[1] * mf.tensors[i].ne[2] * mf.tensors[i].ne[3];

  void *qblock = NULL;
  if (target >= 0) {
    if ((rc = quantize_model(&mf, target, (int)n_threads, &prog, &qblock, err, sizeof err))) {
      fprintf(stderr, "llsrv convert: %s\n", err);
      ll_modelfile_free(&mf);
      return 1;
    }
    ll_mf_set_u32(&mf, "general.file_type", (uint32_t)ftype);
    if (target != LL_TYPE_F32) ll_mf_set_u32(&mf, "general.quantization_version", 2);
  }
  if (to_gguf) {
    rc = ll_gguf_write(out, &mf, err, sizeof err);
  } else {
    struct ll_ckpt_write_opts o;
    ll_ckpt_write_opts_init(&o);
    o.zstd_level = level;
    o.n_threads = (int)n_threads;
    o.progress = progress_cb;
    o.progress_user = &prog;
    char note[128];
    snprintf(note, sizeof note, "llsrv convert --quant %s", quant);
    o.note = note;
    o.training = &training;
    rc = ll_ckpt_write(out, &mf, &o, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "llsrv convert: %s\n", err);
    ll_modelfile_free(&mf);
    free(qblock);
    return 1;
  }
  double dt = now_s() - t0;
  uint64_t out_bytes = path_bytes(out);
  fprintf(stderr, "llsrv convert: %s -> %s: %.2fM parameters, %llu tensors, %.1f MB -> %.1f MB (%s), %.2f s, %.1f MB/s\n",
          in, out, n_params / 1e6, (unsigned long long)mf.n_tensors, in_bytes / 1e6, out_bytes / 1e6,
          target >= 0 ? quant : "tensors kept", dt, dt > 0 ? in_bytes / 1e6 / dt : 0.0);
  ll_modelfile_free(&mf);
  free(qblock);
  return 0;
}
