// test_gguf.c - the GGUF reader refuses every malformation class llama.cpp's own GGUF tests
// build by hand, survives truncation at every offset, and the writer round-trips bytes.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_error.h"
#include "ll_fileio.h"
#include "ll_gguf.h"
#include "ll_quant.h"
#include "testutil.h"

// ---- a tiny GGUF builder --------------------------------------------------------------
struct gb {
  unsigned char b[1 << 16];
  size_t n;
};
static void put(struct gb *g, const void *p, size_t n) { memcpy(g->b + g->n, p, n), g->n += n; }
static void u32(struct gb *g, uint32_t v) { put(g, &v, 4); }
static void u64(struct gb *g, uint64_t v) { put(g, &v, 8); }
static void str(struct gb *g, const char *s) { u64(g, strlen(s)), put(g, s, strlen(s)); }
static void pad(struct gb *g, size_t a) { while (g->n % a) g->b[g->n++] = 0; }

// Options that break one thing at a time.
struct opts {
  uint32_t version;
  uint64_t n_tensors_override, n_kv_override;
  int dup_key, dup_tensor, bad_type, bad_arr_type, huge_key, empty_key, huge_arr;
  int align_val; // 0: no general.alignment key
  int align_as_u64;
  uint32_t ndims;
  uint64_t dim0;
  int zero_dim, zero_ndims, overflow_dims, bad_ttype, ragged_row, misaligned_off, out_of_range;
  const char *magic;
};

static void build(struct gb *g, const struct opts *o) {
  g->n = 0;
  put(g, o->magic ? o->magic : "GGUF", 4);
  u32(g, o->version ? o->version : 3);
  u64(g, o->n_tensors_override ? o->n_tensors_override : 2);
  uint64_t n_kv = 6 + (o->align_val ? 1 : 0) + (o->dup_key ? 1 : 0);
  u64(g, o->n_kv_override ? o->n_kv_override : n_kv);
  // kv: every scalar type, a string, an array of strings, a nested array
  if (o->huge_key) u64(g, 1ull << 40), put(g, "x", 1);
  else str(g, o->empty_key ? "" : "general.architecture");
  u32(g, o->bad_type ? 99 : LL_KV_STR), str(g, "llama");
  str(g, "t.u8"), u32(g, LL_KV_U8), put(g, "\x07", 1);
  str(g, "t.f32"), u32(g, LL_KV_F32);
  float f = 1.5f;
  put(g, &f, 4);
  str(g, "t.i64"), u32(g, LL_KV_I64), u64(g, (uint64_t)-5);
  str(g, "t.strs"), u32(g, LL_KV_ARR), u32(g, o->bad_arr_type ? 77 : LL_KV_STR), u64(g, o->huge_arr ? (1ull << 60) : 2), str(g, "a"), str(g, "bc");
  str(g, "t.nested"), u32(g, LL_KV_ARR), u32(g, LL_KV_ARR), u64(g, 2);
  u32(g, LL_KV_I32), u64(g, 2), u32(g, 1), u32(g, 2);
  u32(g, LL_KV_BOOL), u64(g, 1), put(g, "\x01", 1);
  if (o->align_val) {
    str(g, "general.alignment");
    if (o->align_as_u64) u32(g, LL_KV_U64), u64(g, (uint64_t)o->align_val);
    else u32(g, LL_KV_U32), u32(g, (uint32_t)o->align_val);
  }
  if (o->dup_key) str(g, "t.u8"), u32(g, LL_KV_U8), put(g, "\x01", 1);
  // tensors: a (32, 2) q8_0 and a (4) f32
  uint64_t align = o->align_val > 0 && !o->align_as_u64 ? (uint64_t)o->align_val : 32;
  str(g, "w");
  u32(g, o->zero_ndims ? 0 : (o->ndims ? o->ndims : 2));
  if (o->overflow_dims) u64(g, 1ull << 32), u64(g, 1ull << 32);
  else u64(g, o->zero_dim ? 0 : o->dim0 ? o->dim0 : (o->ragged_row ? 33 : 32)), u64(g, 2);
  if (o->ndims > 2 && o->ndims <= 4) for (uint32_t d = 2; d < o->ndims; d++) u64(g, 1);
  u32(g, o->bad_ttype ? 4 : LL_TYPE_Q8_0);
  u64(g, 0);
  str(g, o->dup_tensor ? "w" : "b");
  u32(g, 1), u64(g, 4), u32(g, LL_TYPE_F32);
  u64(g, o->misaligned_off ? 70 : (o->out_of_range ? 4096 : ((68 + align - 1) / align * align)));
  pad(g, align);
  for (int i = 0; i < 68; i++) g->b[g->n++] = (unsigned char)i; // 2 q8_0 blocks
  pad(g, align);
  float vals[4] = {1, 2, 3, 4};
  put(g, vals, 16);
}

static int parse(const struct gb *g, size_t len, char *err, size_t errlen) {
  struct ll_modelfile mf;
  int rc = ll_gguf_parse(g->b, len, &mf, err, errlen);
  if (rc == 0) ll_modelfile_free(&mf);
  return rc;
}

static void refuse(const char *what, const struct opts *o, int want, const char *needle) {
  static struct gb g;
  char err[512] = "";
  build(&g, o);
  int rc = parse(&g, g.n, err, sizeof err);
  CHECKF(rc == want, "%s: got %d (%s), want %d", what, rc, err, want);
  CHECKF(needle == NULL || strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
}

static void test_valid(void) {
  static struct gb g;
  struct opts o = {0};
  build(&g, &o);
  struct ll_modelfile mf;
  char err[512];
  CHECKF(ll_gguf_parse(g.b, g.n, &mf, err, sizeof err) == 0, "%s", err);
  const char *s;
  int64_t iv;
  double fv;
  const struct ll_kv_array *arr;
  CHECK(ll_mf_get_str(&mf, "general.architecture", &s) == 0 && strcmp(s, "llama") == 0);
  CHECK(ll_mf_get_int(&mf, "t.u8", &iv) == 0 && iv == 7);
  CHECK(ll_mf_get_float(&mf, "t.f32", &fv) == 0 && fv == 1.5);
  CHECK(ll_mf_get_int(&mf, "t.i64", &iv) == 0 && iv == -5);
  CHECK(ll_mf_get_arr(&mf, "t.strs", &arr) == 0 && arr->n == 2 && strcmp(((struct ll_str *)arr->data)[1].ptr, "bc") == 0);
  CHECK(ll_mf_get_arr(&mf, "t.nested", &arr) == 0 && arr->elem_type == LL_KV_ARR && arr->n == 2);
  const struct ll_kv_value *inner = arr->data;
  CHECK(inner[0].v.arr.elem_type == LL_KV_I32 && ((int32_t *)inner[0].v.arr.data)[1] == 2);
  CHECK(inner[1].v.arr.elem_type == LL_KV_BOOL && ((uint8_t *)inner[1].v.arr.data)[0] == 1);
  CHECK(mf.n_tensors == 2);
  const struct ll_tensor_info *w = ll_mf_find_tensor(&mf, "w"), *b = ll_mf_find_tensor(&mf, "b");
  CHECK(w && w->type == LL_TYPE_Q8_0 && w->ne[0] == 32 && w->ne[1] == 2 && w->nbytes == 68);
  CHECK(b && b->nbytes == 16 && ((const float *)b->data)[3] == 4.0f);
  CHECK(w && ((const unsigned char *)w->data)[5] == 5);
  // Metadata blob round trip.
  void *blob;
  size_t bl;
  CHECK(ll_gguf_kv_serialize(&mf, &blob, &bl) == 0);
  struct ll_modelfile m2;
  ll_modelfile_init(&m2);
  CHECKF(ll_gguf_kv_deserialize(blob, bl, &m2, err, sizeof err) == 0, "%s", err);
  CHECK(m2.n_kv == mf.n_kv && ll_mf_get_int(&m2, "t.i64", &iv) == 0 && iv == -5);
  CHECK(ll_gguf_kv_deserialize(blob, bl, &m2, err, sizeof err) == LL_EEXIST); // keys already present
  free(blob);
  ll_modelfile_free(&m2);
  // Writer: same bytes back. A temporary file of an earlier write of the path that was cut
  // short (kill -9: nobody holds it) goes; other names stay.
  char dir[256], path[300], stale[340], other[340];
  CHECK(ll_test_tmpdir(dir, sizeof dir) != NULL);
  snprintf(path, sizeof path, "%s/w.gguf", dir);
  snprintf(stale, sizeof stale, "%s.tmp.Ab12Cd", path);
  snprintf(other, sizeof other, "%s.tmp.Ab12Cd.keep", path);
  for (int k = 0; k < 2; k++) {
    FILE *f = fopen(k ? other : stale, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
  }
  CHECKF(ll_gguf_write(path, &mf, err, sizeof err) == 0, "%s", err);
  CHECK(access(stale, F_OK) != 0 && access(other, F_OK) == 0);
  remove(other);
  size_t len;
  unsigned char *back = ll_test_read_file(path, &len);
  CHECKF(back && len == g.n && memcmp(back, g.b, len) == 0, "written file differs (%zu vs %zu bytes)", len, g.n);
  free(back);
  remove(path);
  remove(dir);
  ll_modelfile_free(&mf);

  // Truncation at every offset: refused, never a crash.
  int refused = 0;
  for (size_t cut = 0; cut < g.n; cut++) refused += parse(&g, cut, err, sizeof err) != 0;
  CHECKF(refused == (int)g.n, "%d of %zu truncations refused", refused, g.n);
}

static void test_malformed(void) {
  struct opts o;
#define CASE(what, field, val, want, needle) (memset(&o, 0, sizeof o), o.field = val, refuse(what, &o, want, needle))
  CASE("bad magic", magic, "GGUX", LL_EFORMAT, "magic");
  CASE("version 1", version, 1, LL_EUNSUPPORTED, "version");
  CASE("version 4", version, 4, LL_EFORMAT, "version");
  CASE("absurd n_tensors", n_tensors_override, 1ull << 40, LL_ELIMIT, "n_tensors");
  CASE("absurd n_kv", n_kv_override, 1ull << 40, LL_ELIMIT, "n_kv");
  CASE("more kv than bytes", n_kv_override, 60000, LL_ETRUNC, "n_kv");
  CASE("huge key length", huge_key, 1, LL_ELIMIT, "key");
  CASE("empty key", empty_key, 1, LL_EFORMAT, "key");
  CASE("bad value type", bad_type, 1, LL_EFORMAT, "value type");
  CASE("bad array element type", bad_arr_type, 1, LL_EFORMAT, "array element type");
  CASE("huge array", huge_arr, 1, LL_ELIMIT, "array length");
  CASE("duplicate key", dup_key, 1, LL_EEXIST, "duplicate key");
  CASE("duplicate tensor", dup_tensor, 1, LL_EEXIST, "duplicate tensor");
  CASE("alignment -1", align_val, -1, LL_EFORMAT, "alignment");
  CASE("alignment 3", align_val, 3, LL_EFORMAT, "alignment");
  memset(&o, 0, sizeof o), o.align_val = 64, o.align_as_u64 = 1, refuse("alignment as u64", &o, LL_EFORMAT, "alignment");
  CASE("n_dims 0", zero_ndims, 1, LL_EFORMAT, "n_dims");
  CASE("n_dims 5", ndims, 5, LL_EFORMAT, "n_dims");
  CASE("dim 0", zero_dim, 1, LL_EFORMAT, "dim");
  CASE("dim 2^63", dim0, 1ull << 63, LL_EFORMAT, "dim");
  CASE("element count overflow", overflow_dims, 1, LL_EOVERFLOW, "overflow");
  CASE("row bytes wrap around (found by fuzzing)", dim0, 1ull << 61, LL_ELIMIT, "row");
  CASE("unknown tensor type", bad_ttype, 1, LL_EUNSUPPORTED, "tensor type");
  CASE("row not a multiple of the block", ragged_row, 1, LL_EFORMAT, "block size");
  CASE("misaligned data offset", misaligned_off, 1, LL_EFORMAT, "alignment");
  CASE("data out of range", out_of_range, 1, LL_ETRUNC, "exceeds");
#undef CASE
}

static void test_real_files(void) {
  char path[4096], err[512], dir[256], out[300];
  CHECK(ll_test_tmpdir(dir, sizeof dir) != NULL);
  snprintf(out, sizeof out, "%s/rt.gguf", dir);
  const char *files[8];
  int nf = 0;
  static char bufs[8][4096];
  if (ll_test_smollm2_path(bufs[nf], sizeof bufs[nf])) files[nf] = bufs[nf], nf++;
  else printf("SmolLM2 not cached: skipping it\n");
  static const char *vocabs[] = {"gpt-2", "llama-spm", "falcon", "starcoder", "deepseek-coder"};
  for (int i = 0; i < 5; i++) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/vocab/ggml-vocab-%s.gguf", vocabs[i]);
    if (ll_test_shared_path(rel, bufs[nf], sizeof bufs[nf])) files[nf] = bufs[nf], nf++;
  }
  for (int i = 0; i < nf; i++) {
    struct ll_modelfile mf;
    int rc = ll_gguf_open(files[i], &mf, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc) continue;
    if (strstr(files[i], "SmolLM2")) {
      const char *arch;
      int64_t blocks;
      const struct ll_tensor_info *te = ll_mf_find_tensor(&mf, "token_embd.weight");
      CHECK(ll_mf_get_str(&mf, "general.architecture", &arch) == 0 && strcmp(arch, "llama") == 0);
      CHECK(ll_mf_get_int(&mf, "llama.block_count", &blocks) == 0 && blocks == 30);
      CHECK(mf.n_tensors == 272 && te && te->ne[0] == 576 && te->ne[1] == 49152);
    }
    CHECKF(ll_gguf_write(out, &mf, err, sizeof err) == 0, "%s", err);
    size_t a, b;
    unsigned char *x = ll_test_read_file(files[i], &a), *y = ll_test_read_file(out, &b);
    CHECKF(x && y && a == b && memcmp(x, y, a) == 0, "%s: GGUF -> GGUF not byte-identical", files[i]);
    free(x);
    free(y);
    ll_modelfile_free(&mf);
  }
  (void)path;
  remove(out);
  remove(dir);
  printf("%d real GGUF files round-tripped\n", nf);
}

// ll_cache_prune: the newest `keep` entries stay, older ones and dead writers' temporaries go,
// a live writer's temporary and other names stay.
static void test_cache_prune(void) {
  char dir[] = "/tmp/ll-prune-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char p[256];
  const char *names[] = {"opencl-a.bin", "opencl-b.bin", "opencl-c.bin", "opencl-d.bin", "other.bin", "opencl-e.txt",
                         "opencl-a.bin.tmp.Ab3xYz", "opencl-b.bin.tmp.Qq1234"};
  for (int i = 0; i < 8; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) fputs("x", f), fclose(f);
    struct timespec ts[2] = {{1000000 + i * 10, 0}, {1000000 + i * 10, 0}}; // a is the oldest, d the newest
    CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
  }
  snprintf(p, sizeof p, "%s/opencl-b.bin.tmp.Qq1234", dir);
  int fd = open(p, O_RDONLY);
  int hold = ll_tmp_hold(fd); // a writer still at work
  CHECK(ll_cache_prune(dir, "opencl-", ".bin", 2) == 3); // a, b (the oldest two) and a's dead temporary
  const int stays[] = {0, 0, 1, 1, 1, 1, 0, 1};
  for (int i = 0; i < 8; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    CHECKF((access(p, F_OK) == 0) == stays[i], "%s %s", names[i], stays[i] ? "removed" : "kept");
  }
  ll_tmp_release(hold);
  close(fd);
  CHECK(ll_cache_prune(dir, "opencl-", ".bin", 2) == 1); // the writer is gone: its temporary too
  CHECK(ll_cache_prune("/nonexistent-dir", "opencl-", ".bin", 2) == 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  test_cache_prune();
  test_valid();
  test_malformed();
  test_real_files();
  return ll_test_summary();
}
