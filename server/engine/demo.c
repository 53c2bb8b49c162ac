// demo.c - the embedded default model (ll_demo.h) and the state directory it lives in.
//
// The demo model is a tiny Llama (128 dims, 4 layers, 4 heads, FFN 352, context 512, f32,
// output head tied to the embeddings) with a byte-level SentencePiece vocabulary, so that
// `llsrv` with no model runs end to end and the background trainer has something small to
// train on the project's own sources. Its untrained weights are a fixed-seed random init,
// generated with integer and IEEE-exact double arithmetic only (no libm), so every machine
// writes the same tensors.
//
// Vocabulary (260 tokens): 0 <unk>, 1 <s> (BOS), 2 </s> (EOS), 3..258 the byte tokens
// <0x00>..<0xFF> (byte b = id b + 3, as in Llama's vocabulary), 259 "▁" (U+2581). The SPM
// encoder escapes every space to U+2581 before looking pieces up; without a "▁" token that
// escape would fall back to its three UTF-8 bytes and decode as "▁" instead of " ". With it, a
// space is one token that decodes to " ", and every other byte (invalid UTF-8 and NUL included)
// is its own byte token, so text round-trips exactly (a literal U+2581 in the input comes
// back as a space: the SPM escape cannot tell the two apart).
#include "ll_demo.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "ll_ckpt.h"
#include "ll_error.h"
#include "ll_fileio.h"
#include "ll_modelfile.h"
#include "ll_quant.h"

// ---------------------------------------------------------------- state directory

// mkdir -p with mode 0700 for every directory it creates. Existing components are kept as
// they are (their owner chose their mode).
static int mkdir_p(const char *path, char *err, size_t errlen) {
  size_t n = strlen(path);
  char *p = malloc(n + 1);
  if (!p) return ll_errf(err, errlen, LL_ENOMEM, "state directory: out of memory");
  memcpy(p, path, n + 1);
  int rc = 0;
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    if (p[i - 1] == '/') continue; // "a//b": the empty component was handled already
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0700) != 0 && errno != EEXIST) {
      rc = ll_errf(err, errlen, LL_EIO, "state directory: cannot create '%s': %s", p, strerror(errno));
      break;
    }
    p[i] = c;
  }
  free(p);
  return rc;
}

// The directory must be a directory of ours: another user's directory would let them
// replace the model we load (or read what we write).
static int check_own_dir(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0) return ll_errf(err, errlen, LL_EIO, "state directory '%s': %s", path, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return ll_errf(err, errlen, LL_EIO, "state directory '%s': %s", path, strerror(ENOTDIR));
  if (st.st_uid != geteuid())
    return ll_errf(err, errlen, LL_EIO, "state directory '%s' belongs to uid %lu, not to this user (uid %lu)", path, (unsigned long)st.st_uid,
                   (unsigned long)geteuid());
  return 0;
}

int ll_state_dir_resolve(const char *configured, char *out, size_t cap, char *err, size_t errlen) {
  if (!out || cap == 0) return ll_errf(err, errlen, LL_EINVAL, "state directory: no output buffer");
  out[0] = '\0';
  char buf[PATH_MAX];
  int n;
  const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
  if (configured && configured[0]) {
    n = snprintf(buf, sizeof buf, "%s", configured);
  } else if (xdg && xdg[0] == '/') { // the XDG spec: a relative value is invalid and ignored
    n = snprintf(buf, sizeof buf, "%s/llsrv", xdg);
  } else if (home && home[0]) {
    n = snprintf(buf, sizeof buf, "%s/.local/state/llsrv", home);
  } else {
    return ll_errf(err, errlen, LL_EINVAL, "state directory: neither XDG_STATE_HOME nor HOME is set (configure state_dir)");
  }
  if (n < 0 || (size_t)n >= sizeof buf) return ll_errf(err, errlen, LL_ELIMIT, "state directory: path is longer than %d bytes", PATH_MAX - 1);
  // Trailing slashes are dropped so the paths built from it read cleanly ("/x/models").
  while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
  int rc = mkdir_p(buf, err, errlen);
  if (rc == 0) rc = check_own_dir(buf, err, errlen);
  if (rc) return rc;
  // Absolute, so the path stays valid if the server later changes its working directory.
  char *abs = realpath(buf, NULL);
  if (!abs) return ll_errf(err, errlen, LL_EIO, "state directory '%s': %s", buf, strerror(errno));
  size_t len = strlen(abs);
  if (len >= cap) {
    free(abs);
    return ll_errf(err, errlen, LL_ELIMIT, "state directory '%s': path does not fit in %zu bytes", buf, cap);
  }
  memcpy(out, abs, len + 1);
  free(abs);
  return 0;
}

// ---------------------------------------------------------------- the model

#define DEMO_DIM 128
#define DEMO_LAYERS 4
#define DEMO_HEADS 4
#define DEMO_HEADS_KV 4
#define DEMO_FFN 352 // Llama's rule: 2/3 * 4 * dim, rounded up to a multiple of 32
#define DEMO_CTX 512
#define DEMO_VOCAB 260
#define DEMO_SEED 0x6c6c7372765f6431ull // "llsrv_d1": changing it changes every new demo model
#define DEMO_INIT_STD 0.02

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal by the Irwin-Hall sum of 12 uniforms (mean 6, variance 1). Box-Muller would
// need log/cos, whose last bit differs between C libraries; these sums are exact-rounding IEEE
// double operations, so the init is bit-identical everywhere. Its tails stop at 6 sigma,
// which an init does not miss.
static double gauss(uint64_t *s) {
  double sum = 0.0;
  for (int i = 0; i < 12; i++) sum += (double)(splitmix64(s) >> 11) * 0x1.0p-53;
  return sum - 6.0;
}

static void fill_normal(float *w, size_t n, double std, uint64_t *s) {
  for (size_t i = 0; i < n; i++) w[i] = (float)(gauss(s) * std);
}

struct demo_tensor {
  char name[48];
  int n_dims;
  int64_t ne[3];
  double std; // 0: RMSNorm weight, all 1.0
};

// Tensor list in file order (GGUF dims: ne[0] is the input / contiguous dimension); t holds
// 2 + 9 * layers entries.
static int demo_tensors(struct demo_tensor *t, const struct ll_init_dims *d, int n_vocab) {
  int n = 0;
  const double proj_std = DEMO_INIT_STD / sqrt(2.0 * d->layers); // GPT-2's residual projection scaling
  t[n++] = (struct demo_tensor){"token_embd.weight", 2, {d->dim, n_vocab, 1}, DEMO_INIT_STD};
  t[n++] = (struct demo_tensor){"output_norm.weight", 1, {d->dim, 1, 1}, 0};
  const int64_t kvd = (int64_t)d->dim / d->heads * d->heads_kv;
  for (int l = 0; l < d->layers; l++) {
    const struct {
      const char *suffix;
      int64_t k, n;
      int proj;
    } blk[] = {
        {"attn_norm", d->dim, 0, 0},
        {"attn_q", d->dim, d->dim, 0},
        {"attn_k", d->dim, kvd, 0},
        {"attn_v", d->dim, kvd, 0},
        {"attn_output", d->dim, d->dim, 1},
        {"ffn_norm", d->dim, 0, 0},
        {"ffn_gate", d->dim, d->ffn, 0},
        {"ffn_up", d->dim, d->ffn, 0},
        {"ffn_down", d->ffn, d->dim, 1},
    };
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++) {
      struct demo_tensor *e = &t[n++];
      // mixture of experts: the router, then each FFN matrix as experts stacked (ne[2])
      if (d->experts > 0 && !strcmp(blk[i].suffix, "ffn_gate")) {
        snprintf(e->name, sizeof e->name, "blk.%d.ffn_gate_inp.weight", l);
        *e = (struct demo_tensor){.n_dims = 2, .ne = {d->dim, d->experts, 1}, .std = DEMO_INIT_STD};
        snprintf(e->name, sizeof e->name, "blk.%d.ffn_gate_inp.weight", l);
        e = &t[n++];
      }
      snprintf(e->name, sizeof e->name, d->experts > 0 && !strncmp(blk[i].suffix, "ffn_", 4) && strcmp(blk[i].suffix, "ffn_norm") ? "blk.%d.%s_exps.weight"
                                                                                                                                     : "blk.%d.%s.weight",
               l, blk[i].suffix);
      e->n_dims = blk[i].n ? 2 : 1;
      e->ne[0] = blk[i].k;
      e->ne[1] = blk[i].n ? blk[i].n : 1;
      e->ne[2] = 1;
      if (d->experts > 0 && strstr(e->name, "_exps.")) e->n_dims = 3, e->ne[2] = d->experts;
      e->std = blk[i].n == 0 ? 0 : blk[i].proj ? proj_std : DEMO_INIT_STD;
    }
  }
  return n;
}

static int set_vocab_bytes(struct ll_modelfile *mf) {
  int rc = 0;
  char bytes[256][8];
  const char *toks[DEMO_VOCAB];
  float scores[DEMO_VOCAB];
  int32_t types[DEMO_VOCAB];
  int n = 0;
  toks[n] = "<unk>", types[n] = 2, scores[n++] = 0.0f;
  toks[n] = "<s>", types[n] = 3, scores[n++] = 0.0f;
  toks[n] = "</s>", types[n] = 3, scores[n++] = 0.0f;
  for (int b = 0; b < 256; b++) {
    snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
    toks[n] = bytes[b], types[n] = 6, scores[n++] = 0.0f;
  }
  toks[n] = "\xe2\x96\x81", types[n] = 1, scores[n++] = 0.0f; // the escaped space
  rc = rc ? rc : ll_mf_set_str(mf, "tokenizer.ggml.model", "llama");
  rc = rc ? rc : ll_mf_set_arr(mf, "tokenizer.ggml.tokens", LL_KV_STR, toks, (uint64_t)n);
  rc = rc ? rc : ll_mf_set_arr(mf, "tokenizer.ggml.scores", LL_KV_F32, scores, (uint64_t)n);
  rc = rc ? rc : ll_mf_set_arr(mf, "tokenizer.ggml.token_type", LL_KV_I32, types, (uint64_t)n);
  rc = rc ? rc : ll_mf_set_u32(mf, "tokenizer.ggml.unknown_token_id", 0);
  rc = rc ? rc : ll_mf_set_u32(mf, "tokenizer.ggml.bos_token_id", 1);
  rc = rc ? rc : ll_mf_set_u32(mf, "tokenizer.ggml.eos_token_id", 2);
  rc = rc ? rc : ll_mf_set_bool(mf, "tokenizer.ggml.add_bos_token", 1);
  rc = rc ? rc : ll_mf_set_bool(mf, "tokenizer.ggml.add_eos_token", 0);
  // No dummy-prefix space: text must come back byte for byte.
  rc = rc ? rc : ll_mf_set_bool(mf, "tokenizer.ggml.add_space_prefix", 0);
  return rc;
}

// Every tokenizer.* key of another model (its vocabulary, merges, special ids, template).
static int copy_vocab(struct ll_modelfile *mf, const struct ll_modelfile *from, int *n_vocab) {
  const struct ll_kv_array *toks;
  if (ll_mf_get_arr(from, "tokenizer.ggml.tokens", &toks) != 0 || toks->elem_type != LL_KV_STR || toks->n < 4 || toks->n > (1u << 22))
    return LL_EFORMAT;
  *n_vocab = (int)toks->n;
  for (uint64_t i = 0; i < from->n_kv; i++) {
    const struct ll_kv *kv = &from->kv[i];
    if (strncmp(kv->key.ptr, "tokenizer.", 10) != 0) continue;
    struct ll_kv *nk = realloc(mf->kv, (size_t)(mf->n_kv + 1) * sizeof *nk);
    if (!nk) return LL_ENOMEM;
    mf->kv = nk;
    struct ll_kv *d = &mf->kv[mf->n_kv];
    memset(d, 0, sizeof *d);
    if (!(d->key.ptr = malloc(kv->key.len + 1))) return LL_ENOMEM;
    memcpy(d->key.ptr, kv->key.ptr, kv->key.len + 1);
    d->key.len = kv->key.len;
    int rc = ll_kv_value_copy(&d->value, &kv->value);
    if (rc) {
      free(d->key.ptr);
      return rc;
    }
    mf->n_kv++;
  }
  return 0;
}

static int set_metadata(struct ll_modelfile *mf, const struct ll_init_dims *d, const char *name, const struct ll_modelfile *vocab_from,
                        int *n_vocab) {
  int rc = 0;
  *n_vocab = DEMO_VOCAB;
  rc = rc ? rc : ll_mf_set_str(mf, "general.architecture", "llama");
  rc = rc ? rc : ll_mf_set_str(mf, "general.name", name);
  rc = rc ? rc : ll_mf_set_u32(mf, "general.file_type", 0); // LLAMA_FTYPE_ALL_F32
  if (rc) return rc;
  if (vocab_from && (rc = copy_vocab(mf, vocab_from, n_vocab))) return rc;
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.vocab_size", (uint32_t)*n_vocab);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.context_length", (uint32_t)d->ctx);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.embedding_length", (uint32_t)d->dim);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.block_count", (uint32_t)d->layers);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.feed_forward_length", (uint32_t)d->ffn);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.attention.head_count", (uint32_t)d->heads);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.attention.head_count_kv", (uint32_t)d->heads_kv);
  rc = rc ? rc : ll_mf_set_u32(mf, "llama.rope.dimension_count", (uint32_t)(d->dim / d->heads));
  rc = rc ? rc : ll_mf_set_f32(mf, "llama.rope.freq_base", 10000.0f);
  rc = rc ? rc : ll_mf_set_f32(mf, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  if (d->experts > 0) { // Mixtral's layout: arch llama, feed_forward_length the expert width
    rc = rc ? rc : ll_mf_set_u32(mf, "llama.expert_count", (uint32_t)d->experts);
    rc = rc ? rc : ll_mf_set_u32(mf, "llama.expert_used_count", (uint32_t)d->top_k);
  }
  if (rc || vocab_from) return rc;
  return set_vocab_bytes(mf);
}

static const struct ll_init_dims demo_dims = {DEMO_DIM, DEMO_LAYERS, DEMO_HEADS, DEMO_HEADS_KV, DEMO_FFN, DEMO_CTX, 0, 0};

int ll_init_preset(const char *name, struct ll_init_dims *d) {
  if (!strcmp(name, "tiny")) *d = demo_dims; // the demo model's shape
  else if (!strcmp(name, "small")) *d = (struct ll_init_dims){384, 6, 6, 2, 1024, 1024, 0, 0};
  else return LL_EINVAL;
  return 0;
}

static int check_dims(const struct ll_init_dims *d, char *err, size_t errlen) {
  if (d->dim < 2 || d->dim > 16384 || d->layers < 1 || d->layers > 256 || d->heads < 1 || d->heads_kv < 1 || d->dim % d->heads ||
      d->heads % d->heads_kv || (d->dim / d->heads) % 2 || d->ffn < 1 || d->ffn > 65536 || d->ctx < 1 || d->ctx > (1 << 20) || d->experts < 0 ||
      d->experts > 256 || (d->experts > 0 && (d->top_k < 1 || d->top_k > d->experts)))
    return ll_errf(err, errlen, LL_EINVAL, "init: bad dimensions (dim %d, layers %d, heads %d/%d, ffn %d, ctx %d, experts %d, top-k %d)", d->dim,
                   d->layers, d->heads, d->heads_kv, d->ffn, d->ctx, d->experts, d->top_k);
  return 0;
}

// Builds the model into mf; *block receives the tensor memory (caller frees after writing).
static int build_model(struct ll_modelfile *mf, float **block, const struct ll_init_dims *d, uint64_t seed, const char *name,
                       const struct ll_modelfile *vocab_from, char *err, size_t errlen) {
  *block = NULL;
  int rc = check_dims(d, err, errlen), n_vocab;
  if (rc) return rc;
  rc = set_metadata(mf, d, name, vocab_from, &n_vocab);
  if (rc == LL_EFORMAT) return ll_errf(err, errlen, rc, "init: the vocabulary model has no tokenizer.ggml.tokens");
  if (rc) return ll_errf(err, errlen, rc, "init: metadata: %s", ll_strerror(rc));
  struct demo_tensor *t = calloc(2 + 10 * (size_t)d->layers, sizeof *t);
  if (!t) return ll_errf(err, errlen, LL_ENOMEM, "init: out of memory");
  const int n = demo_tensors(t, d, n_vocab);
  size_t total = 0;
  for (int i = 0; i < n; i++) total += (size_t)(t[i].ne[0] * t[i].ne[1] * t[i].ne[2]);
  float *w = malloc(total * sizeof *w);
  *block = w;
  if (!w) {
    free(t);
    return ll_errf(err, errlen, LL_ENOMEM, "init: out of memory for %zu weights", total);
  }
  uint64_t s = seed;
  for (int i = 0; i < n && rc == 0; i++) {
    const size_t cnt = (size_t)(t[i].ne[0] * t[i].ne[1] * t[i].ne[2]);
    if (t[i].std > 0) fill_normal(w, cnt, t[i].std, &s);
    else for (size_t j = 0; j < cnt; j++) w[j] = 1.0f;
    if ((rc = ll_mf_add_tensor(mf, t[i].name, LL_TYPE_F32, t[i].n_dims, t[i].ne, w)))
      rc = ll_errf(err, errlen, rc, "init: tensor '%s': %s", t[i].name, ll_strerror(rc));
    w += cnt;
  }
  free(t);
  return rc;
}

int ll_init_model_write(const char *path, const struct ll_init_dims *d, uint64_t seed, const struct ll_modelfile *vocab_from, char *err,
                        size_t errlen) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  float *block = NULL;
  int rc = build_model(&mf, &block, d, seed, "llsrv-init", vocab_from, err, errlen);
  if (rc == 0) {
    struct ll_ckpt_write_opts o;
    ll_ckpt_write_opts_init(&o);
    o.source_format = "init";
    o.note = "llsrv init: random init (N(0, 0.02); attn_output/ffn_down / sqrt(2 * n_layer)), untrained";
    rc = ll_ckpt_write(path, &mf, &o, err, errlen);
  }
  ll_modelfile_free(&mf);
  free(block);
  return rc;
}

static int fsync_dir(const char *dir, char *err, size_t errlen) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ll_errf(err, errlen, LL_EIO, "demo model: cannot open '%s': %s", dir, strerror(errno));
  int rc = 0;
  if (fsync(fd) != 0 && errno != EINVAL) // EINVAL: a filesystem that cannot sync directories
    rc = ll_errf(err, errlen, LL_EIO, "demo model: fsync '%s': %s", dir, strerror(errno));
  close(fd);
  return rc;
}

// Makes the intermediate file name unique per call, also between threads of one process.
static atomic_uint demo_tmp_seq;

// A start killed while it created demo.ckpt (kill -9 on the first start) leaves
// .demo.ckpt.new-PID-N (a complete model, MBs) or the .ckpt writer's temporary file of it;
// nothing else would ever remove them. Removed at each start: the first kind once its PID is
// gone (kill(PID, 0) fails with ESRCH; never this process's), the second once no writer holds
// it (ll_tmp_unlink_stale). Nothing else in the directory is touched.
static void sweep_stale(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *nm = e->d_name;
    const int writer_tmp = !strncmp(nm, "..demo.ckpt.new-", 16) && strstr(nm, ".tmp-");
    long pid = 0;
    unsigned seq = 0;
    int end = 0;
    const int ours = !writer_tmp && sscanf(nm, ".demo.ckpt.new-%ld-%u%n", &pid, &seq, &end) == 2 && nm[end] == '\0' && pid > 0;
    if (!writer_tmp && !ours) continue;
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, nm) >= sizeof p) continue;
    struct stat st;
    if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (writer_tmp) ll_tmp_unlink_stale(p);
    else if (pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) unlink(p);
  }
  closedir(d);
}

int ll_demo_model_ensure(const char *state_dir, char *path_out, size_t cap, char *err, size_t errlen) {
  if (!state_dir || !state_dir[0] || !path_out || cap == 0) return ll_errf(err, errlen, LL_EINVAL, "demo model: no state directory");
  path_out[0] = '\0';
  char dir[PATH_MAX], path[PATH_MAX], tmp[PATH_MAX];
  if ((size_t)snprintf(dir, sizeof dir, "%s/models", state_dir) >= sizeof dir ||
      (size_t)snprintf(path, sizeof path, "%s/demo.ckpt", dir) >= sizeof path ||
      (size_t)snprintf(tmp, sizeof tmp, "%s/.demo.ckpt.new-%ld-%u", dir, (long)getpid(), atomic_fetch_add(&demo_tmp_seq, 1u)) >= sizeof tmp)
    return ll_errf(err, errlen, LL_ELIMIT, "demo model: state directory path '%s' is too long", state_dir);
  if (strlen(path) >= cap) return ll_errf(err, errlen, LL_ELIMIT, "demo model: path '%s' does not fit in %zu bytes", path, cap);
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) return ll_errf(err, errlen, LL_EIO, "demo model: cannot create '%s': %s", dir, strerror(errno));
  sweep_stale(dir);

  struct stat st;
  if (stat(path, &st) == 0) {
    // Reused as is: it may be the trainer's newer weights. A damaged file is the engine's to report.
    if (!S_ISREG(st.st_mode)) return ll_errf(err, errlen, LL_EIO, "demo model: '%s' exists but is not a regular file", path);
    memcpy(path_out, path, strlen(path) + 1);
    return 0;
  }
  if (errno != ENOENT) return ll_errf(err, errlen, LL_EIO, "demo model: '%s': %s", path, strerror(errno));

  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  float *block = NULL;
  int rc = build_model(&mf, &block, &demo_dims, DEMO_SEED, "llsrv-demo", NULL, err, errlen);
  if (rc == 0) {
    struct ll_ckpt_write_opts o;
    ll_ckpt_write_opts_init(&o);
    o.source_format = "demo";
    o.note = "llsrv embedded demo model: untrained fixed-seed init (N(0, 0.02); attn_output/ffn_down / sqrt(2 * n_layer))";
    // Written under a name of our own, then linked into place: link() fails if another
    // process created demo.ckpt meanwhile, so a racing start never replaces a file that
    // already exists (possibly one the trainer has updated).
    rc = ll_ckpt_write(tmp, &mf, &o, err, errlen);
  }
  ll_modelfile_free(&mf);
  free(block);
  if (rc) return rc;
  if (link(tmp, path) != 0) {
    const int e = errno;
    if (e == EEXIST) {
      unlink(tmp); // the other process's file wins; both are the same init anyway
    } else if (rename(tmp, path) != 0) { // filesystem without hard links: atomic replace instead
      const int e2 = errno;
      unlink(tmp);
      return ll_errf(err, errlen, LL_EIO, "demo model: cannot move '%s' to '%s': %s", tmp, path, strerror(e2));
    }
  } else {
    unlink(tmp);
  }
  if ((rc = fsync_dir(dir, err, errlen))) return rc;
  memcpy(path_out, path, strlen(path) + 1);
  return 0;
}
