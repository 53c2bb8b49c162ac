// test_ckpt_convert.c - `llsrv convert` and GGUF <-> .ckpt.
//
// 1. Synthetic model (.ckpt in) -> each --quant: the output loads; kept tensors are
//    bit-exact; re-encoded ones stay within the stated per-block error bounds below.
// 2. stories260K (llama2.c .bin, ../shared) -> .ckpt with each --quant: same checks.
// 3. SmolLM2 Q4_1 GGUF -> .ckpt (keep) -> GGUF: byte-identical tensors and identical
//    metadata at every step; and -> .ckpt with each --quant: same error checks.
//
// Stated tolerances, per block of 32 source values x with amax = max|x|:
//   q8_0: |y - x| <= 0.6 * amax / 127          (half a step + fp16 rounding of the scale)
//   q4_0: |y - x| <= 1.02 * amax / 8           (a full step where the clamp at 15 bites)
//   q4_1: |y - x| <= 0.55 * (max - min) / 15 + |min| / 1024
//   f32 : exact;  and per tensor the relative RMS error is <= 0.02 (q8_0) / 0.2 (q4_x)
//   (measured on SmolLM2: 0.0065 / 0.111 (q4_0) / 0.090 (q4_1) at worst).
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "ll_cmd.h"
#include "ll_error.h"
#include "ll_gguf.h"
#include "test_ckpt_common.h"

static char g_dir[512];

static int run_convert(const char *in, const char *out, const char *quant) {
  char *argv[8] = {"convert", (char *)in, (char *)out, "--quant", (char *)quant, "--threads", "2", NULL};
  return ll_cmd_convert(7, argv);
}

static float *dequant(const struct ll_tensor_info *t, int64_t n) {
  float *f = malloc((size_t)n * sizeof *f);
  if (f && ll_dequantize_row(t->type, t->data, f, n) != 0) {
    free(f);
    return NULL;
  }
  return f;
}

// Compare converted model `b` against source `a` for --quant `quant`.
static void check_converted(const struct ll_modelfile *a, const struct ll_modelfile *b, const char *quant,
                            const char *label) {
  CHECKF(a->n_tensors == b->n_tensors, "%s: tensor count %llu vs %llu", label, (unsigned long long)a->n_tensors,
         (unsigned long long)b->n_tensors);
  int n_requant = 0, n_kept = 0;
  double worst_rel = 0;
  const char *worst = "-";
  for (uint64_t i = 0; i < a->n_tensors; i++) {
    const struct ll_tensor_info *x = &a->tensors[i], *y = ll_mf_find_tensor(b, a->tensors[i].name.ptr);
    CHECKF(y != NULL, "%s: tensor '%s' missing", label, x->name.ptr);
    if (!y) continue;
    CHECKF(memcmp(x->ne, y->ne, sizeof x->ne) == 0, "%s: '%s' shape changed", label, x->name.ptr);
    if (x->type == y->type) {
      CHECKF(x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0, "%s: kept tensor '%s' differs", label,
             x->name.ptr);
      n_kept++;
      continue;
    }
    n_requant++;
    CHECKF(strcmp(quant, "keep") != 0, "%s: '%s' changed type under --quant keep", label, x->name.ptr);
    int is_matrix = x->n_dims == 2 && x->ne[0] % 32 == 0;
    if (!is_matrix) CHECKF(y->type == LL_TYPE_F32, "%s: 1-D/odd tensor '%s' is %s, not f32", label, x->name.ptr,
                           ll_type_name(y->type));
    int64_t n = x->ne[0] * x->ne[1] * x->ne[2] * x->ne[3];
    float *fx = dequant(x, n), *fy = dequant(y, n);
    CHECKF(fx && fy, "%s: cannot dequantize '%s'", label, x->name.ptr);
    if (fx && fy) {
      double se = 0, sx = 0;
      int64_t bad = -1;
      double bad_err = 0, bad_tol = 0;
      for (int64_t b0 = 0; b0 < n; b0 += 32) {
        int64_t e = b0 + 32 < n ? b0 + 32 : n;
        float amax = 0, mn = fx[b0], mx = fx[b0];
        for (int64_t k = b0; k < e; k++) {
          amax = fmaxf(amax, fabsf(fx[k]));
          mn = fminf(mn, fx[k]);
          mx = fmaxf(mx, fx[k]);
        }
        double tol = 0;
        if (y->type == LL_TYPE_Q8_0) tol = 0.6 * amax / 127;
        else if (y->type == LL_TYPE_Q4_0) tol = 1.02 * amax / 8;
        else if (y->type == LL_TYPE_Q4_1) tol = 0.55 * (mx - mn) / 15 + fabsf(mn) / 1024;
        tol += 1e-7;
        for (int64_t k = b0; k < e; k++) {
          double err = fabs((double)fy[k] - fx[k]);
          se += err * err;
          sx += (double)fx[k] * fx[k];
          if (err > tol && bad < 0) bad = k, bad_err = err, bad_tol = tol;
        }
      }
      CHECKF(bad < 0, "%s: '%s' (%s -> %s) element %lld off by %g > tolerance %g", label, x->name.ptr,
             ll_type_name(x->type), ll_type_name(y->type), (long long)bad, bad_err, bad_tol);
      double rel = sx > 0 ? sqrt(se / sx) : sqrt(se);
      double rel_tol = y->type == LL_TYPE_Q8_0 ? 0.02 : y->type == LL_TYPE_F32 ? 0 : 0.2;
      CHECKF(rel <= rel_tol, "%s: '%s' relative RMS error %g > %g", label, x->name.ptr, rel, rel_tol);
      if (rel > worst_rel) worst_rel = rel, worst = x->name.ptr;
    }
    free(fx);
    free(fy);
  }
  printf("%s: %d tensors re-encoded (worst relative RMS error %.4f in %s), %d kept bit-exact\n", label, n_requant,
         worst_rel, worst, n_kept);
  if (strcmp(quant, "keep") != 0) CHECKF(n_requant > 0, "%s: nothing was re-encoded", label);
  // general.file_type records what we did.
  uint64_t ft = 0;
  int want = strcmp(quant, "q8_0") == 0 ? 7 : strcmp(quant, "q4_0") == 0 ? 2 : strcmp(quant, "q4_1") == 0 ? 3 : -1;
  if (want >= 0) CHECKF(ll_mf_get_uint(b, "general.file_type", &ft) == 0 && ft == (uint64_t)want,
                        "%s: general.file_type %llu, want %d", label, (unsigned long long)ft, want);
}

// Convert `in` with every --quant, open each output and compare with `src`.
static void convert_all(const char *in, const struct ll_modelfile *src, const char *label) {
  static const char *quants[] = {"keep", "q8_0", "q4_0", "q4_1"};
  for (size_t q = 0; q < sizeof quants / sizeof quants[0]; q++) {
    char out[700], err[1024], lab[128];
    snprintf(out, sizeof out, "%s/%s.%s.ckpt", g_dir, label, quants[q]);
    snprintf(lab, sizeof lab, "%s --quant %s", label, quants[q]);
    int rc = run_convert(in, out, quants[q]);
    CHECKF(rc == 0, "%s: llsrv convert exited %d", lab, rc);
    struct ll_modelfile b;
    ll_modelfile_init(&b);
    rc = ll_ckpt_open(out, &b, 2, err, sizeof err);
    CHECKF(rc == 0, "%s: output does not load: %s", lab, err);
    if (rc == 0) check_converted(src, &b, quants[q], lab);
    ll_modelfile_free(&b);
    unlink(out);
  }
}

static void test_synthetic(uint64_t *rng) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  ll_mf_set_str(&mf, "general.architecture", "llama");
  static const struct { const char *name; int type, nd; int64_t ne0, ne1; } ts[] = {
      {"token_embd.weight", LL_TYPE_F32, 2, 128, 40},  {"blk.0.attn_norm.weight", LL_TYPE_F32, 1, 128, 1},
      {"blk.0.attn_q.weight", LL_TYPE_F32, 2, 128, 128}, {"blk.0.ffn_up.weight", LL_TYPE_F16, 2, 128, 96},
      {"blk.0.ffn_down.weight", LL_TYPE_Q8_0, 2, 96, 128}, {"blk.0.odd.weight", LL_TYPE_F32, 2, 100, 3},
      {"output_norm.weight", LL_TYPE_F16, 1, 128, 1},    {"output.weight", LL_TYPE_F32, 2, 128, 40},
  };
  size_t n = sizeof ts / sizeof ts[0], total = 0;
  for (size_t i = 0; i < n; i++) total += (ll_row_size(ts[i].type, ts[i].ne0) * ts[i].ne1 + 63) / 64 * 64;
  unsigned char *data = aligned_alloc(64, total);
  mf.backing = data;
  mf.backing_len = total;
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    int64_t ne[2] = {ts[i].ne0, ts[i].ne1}, cnt = ts[i].ne0 * ts[i].ne1;
    float *f = malloc((size_t)cnt * sizeof *f);
    // Gaussian-ish weights with an occasional outlier, as in real checkpoints.
    for (int64_t k = 0; k < cnt; k++)
      f[k] = 0.05f * (ll_test_randf(rng) + ll_test_randf(rng) + ll_test_randf(rng)) * (k % 97 == 0 ? 8.0f : 1.0f);
    for (int64_t r = 0; r < ts[i].ne1; r++)
      CHECK(ll_quantize_row(ts[i].type, f + r * ts[i].ne0, data + off + r * ll_row_size(ts[i].type, ts[i].ne0),
                            ts[i].ne0) == 0);
    free(f);
    CHECK(ll_mf_add_tensor(&mf, ts[i].name, ts[i].type, ts[i].nd, ne, data + off) == 0);
    off += (ll_row_size(ts[i].type, ts[i].ne0) * ts[i].ne1 + 63) / 64 * 64;
  }
  char in[700], err[512];
  snprintf(in, sizeof in, "%s/synthetic.ckpt", g_dir);
  CHECKF(ll_ckpt_write(in, &mf, NULL, err, sizeof err) == 0, "%s", err);
  convert_all(in, &mf, "synthetic");
  // Usage errors exit 2, unreadable input exits 1.
  char *bad1[] = {"convert", in, NULL};
  CHECK(ll_cmd_convert(2, bad1) == 2);
  CHECK(run_convert(in, "/dev/null/x.ckpt", "q5_9") == 2);
  char missing[700];
  snprintf(missing, sizeof missing, "%s/missing.gguf", g_dir);
  CHECK(run_convert(missing, in, "keep") == 1);
  unlink(in);
  ll_modelfile_free(&mf);
}

static void test_stories(void) {
  char buf[1024], err[1024];
  const char *p = ll_test_shared_path("testdata/models/stories260K.bin", buf, sizeof buf);
  if (!p) {
    printf("SKIP stories260K part: ../shared/testdata/models/stories260K.bin is absent\n");
    return;
  }
  struct ll_modelfile src;
  ll_modelfile_init(&src);
  int rc = ll_model_open(p, &src, err, sizeof err);
  CHECKF(rc == 0, "ll_model_open(stories260K): %s", err);
  if (rc == 0) convert_all(p, &src, "stories260K");
  ll_modelfile_free(&src);
}

static void test_smollm2(void) {
  char buf[1024], err[1024];
  const char *p = ll_test_smollm2_path(buf, sizeof buf);
  if (!p) {
    printf("SKIP SmolLM2 part: model not in the cache (tests/fetch-smollm2.sh fetches it)\n");
    return;
  }
  struct ll_modelfile src, ck, gg;
  ll_modelfile_init(&src);
  ll_modelfile_init(&ck);
  ll_modelfile_init(&gg);
  int rc = ll_gguf_open(p, &src, err, sizeof err);
  CHECKF(rc == 0, "ll_gguf_open(SmolLM2): %s", err);
  if (rc) return;
  // GGUF -> .ckpt -> GGUF, all through the converter.
  char c1[700], g1[700];
  snprintf(c1, sizeof c1, "%s/smol.ckpt", g_dir);
  snprintf(g1, sizeof g1, "%s/smol.back.gguf", g_dir);
  CHECK(run_convert(p, c1, "keep") == 0);
  rc = ll_ckpt_open(c1, &ck, 2, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  if (rc == 0) {
    long kd = tc_kv_diff(&src, &ck), td = tc_tensor_diff(&src, &ck);
    CHECKF(kd < 0, "GGUF -> .ckpt: metadata key %ld differs (%s)", kd, kd >= 0 ? src.kv[kd].key.ptr : "");
    CHECKF(td < 0, "GGUF -> .ckpt: tensor %ld differs", td);
    char *argv[] = {"convert", c1, g1, NULL};
    CHECK(ll_cmd_convert(3, argv) == 0);
    rc = ll_gguf_open(g1, &gg, err, sizeof err);
    CHECKF(rc == 0, "re-exported GGUF does not load: %s", err);
    if (rc == 0) {
      kd = tc_kv_diff(&src, &gg);
      td = tc_tensor_diff(&src, &gg);
      CHECKF(kd < 0, ".ckpt -> GGUF: metadata key %ld differs", kd);
      CHECKF(td < 0, ".ckpt -> GGUF: tensor %ld differs", td);
      // Same metadata order and types, same tensor order and alignment: the same file.
      size_t la = 0, lb = 0;
      unsigned char *fa = ll_test_read_file(p, &la), *fb = ll_test_read_file(g1, &lb);
      CHECKF(fa && fb && la == lb && memcmp(fa, fb, la) == 0, "GGUF -> .ckpt -> GGUF is not byte-identical (%zu vs %zu bytes)",
             la, lb);
      free(fa);
      free(fb);
    }
  }
  unlink(c1);
  unlink(g1);
  convert_all(p, &src, "smollm2");
  ll_modelfile_free(&src);
  ll_modelfile_free(&ck);
  ll_modelfile_free(&gg);
}

int main(void) {
  uint64_t rng = ll_test_seed();
  if (!ll_test_tmpdir(g_dir, sizeof g_dir)) return 1;
  test_synthetic(&rng);
  test_stories();
  test_smollm2();
  rmdir(g_dir);
  CHECKF(access(g_dir, F_OK) != 0, "stray files left in %s", g_dir);
  return ll_test_summary();
}
