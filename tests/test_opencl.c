// test_opencl.c - the OpenCL backend against the CPU backend (the reference), on whatever
// OpenCL device is named by $LL_TEST_OPENCL_DEVICE (default: the first CPU OpenCL device,
// PoCL in CI; setup.sh installs pocl-opencl-icd), and the device choice's fallbacks.
//
// On a device with cl_khr_fp64 the kernels reproduce the CPU backend bit for bit (see
// kernels/opencl/llsrv.cl) for quantized products, get_rows, rmsnorm, rope, attention (f16
// and f32 caches) and swiglu with ggml's exp: asserted exactly (normalized MSE 0).
// Elsewhere, and for what is not reproduced (float-weight products: a tree in f32 against
// the CPU's f64 sums; exp in swiglu where the CPU uses libm's expf: llama2.c models and the
// last n % 8 elements), tolerances in normalized MSE, Σ(dev - cpu)² / Σ cpu²: products 1e-10,
// get_rows 1e-12, rmsnorm 1e-10, rope 1e-12, swiglu 1e-10, attention 1e-8 (f32 cache) / 1e-6
// (f16 cache: a probability rounded to f16 after a sum in another order may land one f16
// step away); add exact.
// The training members are compared with the CPU's scalar references (ll_cpu_train_ref()):
// tolerances above test_matmul_backward.
// Everything runs twice: as the device builds the kernels, then built as for a device
// without f64 (LL_OPENCL_NO_FP64=1), whose f32 fallbacks are held to the tolerances.
// The fast tier (LL_OPENCL_REFERENCE=0; the default on GPUs, not on CPU devices such as PoCL)
// runs too (test_fast), against the CPU with tolerances in normalized MSE, never bits: its
// products quantize the activations as the CPU does but sum in f32 trees: 1e-9 for a product
// (measured 1e-15 .. 1e-13 on PoCL), 1e-4 where RMSNorm is fused in: a norm summed in another
// order moves an activation across a Q8 rounding boundary now and then (in 5 of 40 runs, 1e-7 ..
// 9e-7), and one such step costs up to (amax / 127)² / (K rms²) ~ 1e-5 on the smallest case here,
// K = 160 (llama.cpp's test-backend-ops allows 5e-4 for a product); otherwise 1e-15 .. 1e-12; float
// weights at T >= 32, 3e-5 (the CPU's sgemm path there does not round activations to f16 /
// bf16 as its decode path and the device do: measured 2e-6 for bf16); RoPE with the KV store exact against rope + kv_store
// (the same expressions, no sum); argmax always exact (the lowest id on ties). Launches are
// counted: one per fused call, 6 per layer for a decode step's ops; a product's kernel arguments
// are set once and reused. Products of 32 tokens or more run as GEMM tiles (llsrv_gemm.cl; their
// launches counted, gemm_launches) under the same tolerances; the pass without f64 runs the fast
// tier without them (LL_OPENCL_FAULT=nogemm), as on a device whose limits refuse them: fmmt_*.
// The device-choice cases run in child processes started before this process touches
// OpenCL, since the ICD loader reads OCL_ICD_VENDORS once per process.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ll_backend.h"
#include "ll_sample.h"
#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "testutil.h"

static uint64_t rs;
static int exact; // the device has f64: bit-exact agreement expected
static char dev_name[32] = "opencl:0:0";

static double nmse(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)a[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

static void randf(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = ll_test_randf(&rs) * scale;
}

// Weights of any type: floats quantized where our quantizer covers the type; K-quants as
// random bytes with sane fp16 scales (every bit pattern of scales and quants is exercised).
static void *make_weight(int type, int64_t k, int64_t n) {
  const size_t rsz = ll_row_size(type, k), bytes = rsz * (size_t)n;
  unsigned char *w = malloc(bytes);
  if (type == LL_TYPE_Q4_K || type == LL_TYPE_Q5_K || type == LL_TYPE_Q6_K) {
    for (size_t i = 0; i < bytes; i++) w[i] = (unsigned char)(ll_test_rand(&rs) >> 24);
    const size_t bs = ll_type_traits_get(type)->type_size;
    for (size_t b = 0; b < bytes / bs; b++) {
      unsigned char *blk = w + b * bs;
      const ll_fp16 d = ll_fp32_to_fp16(0.002f + 0.001f * ll_test_randf(&rs)), dm = ll_fp32_to_fp16(0.001f);
      if (type == LL_TYPE_Q6_K) memcpy(blk + 208, &d, 2);
      else memcpy(blk, &d, 2), memcpy(blk + 2, &dm, 2);
    }
    return w;
  }
  float *f = malloc((size_t)k * sizeof *f);
  for (int64_t r = 0; r < n; r++) {
    randf(f, (size_t)k, 0.5f);
    ll_quantize_row(type, f, w + (size_t)r * rsz, k);
  }
  free(f);
  return w;
}

static void test_matmul(struct ll_backend *cpu, struct ll_backend *cl) {
  static const struct {
    int type, k[2];
  } cases[] = {{LL_TYPE_Q4_0, {160, 2080}}, {LL_TYPE_Q4_1, {160, 2080}}, {LL_TYPE_Q5_0, {160, 2080}}, {LL_TYPE_Q5_1, {160, 2080}},
               {LL_TYPE_Q8_0, {160, 2080}}, {LL_TYPE_Q4_K, {256, 2304}}, {LL_TYPE_Q5_K, {256, 2304}}, {LL_TYPE_Q6_K, {256, 2304}},
               {LL_TYPE_F32, {77, 1100}},   {LL_TYPE_F16, {77, 1100}},   {LL_TYPE_BF16, {77, 1100}}};
  static const int Ts[] = {1, 3, 11};
  const int N = 37;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    double worst = 0;
    for (int ki = 0; ki < 2; ki++) {
      const int K = cases[ci].k[ki], type = cases[ci].type;
      void *wd = make_weight(type, K, N);
      struct ll_weight w = {type, K, N, wd, NULL, NULL};
      CHECK(cl->i->weight_upload(cl, &w) == 0 && w.dev);
      for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int T = Ts[ti];
        float *x = malloc((size_t)T * K * 4), *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
        randf(x, (size_t)T * K, 1.0f);
        for (int acc = 0; acc < 2; acc++) {
          randf(o1, (size_t)T * N, 1.0f);
          memcpy(o2, o1, (size_t)T * N * 4);
          CHECK(cpu->i->matmul(cpu, o1, x, &w, T, acc) == 0);
          CHECK(cl->i->matmul(cl, o2, x, &w, T, acc) == 0);
          const double e = nmse(o2, o1, (size_t)T * N);
          const int fl = type == LL_TYPE_F32 || type == LL_TYPE_F16 || type == LL_TYPE_BF16;
          CHECKF(exact && !fl ? e == 0 : e < 1e-10, "matmul %s K=%d T=%d acc=%d: nmse %.3g", ll_type_name(type), K, T, acc, e);
          worst = e > worst ? e : worst;
        }
        free(x), free(o1), free(o2);
      }
      // get_rows of the same matrix, ids repeated and out of order
      const int32_t ids[5] = {36, 0, 5, 5, 17};
      float *g1 = malloc((size_t)5 * K * 4), *g2 = malloc((size_t)5 * K * 4);
      CHECK(cpu->i->get_rows(cpu, g1, &w, ids, 5) == 0);
      CHECK(cl->i->get_rows(cl, g2, &w, ids, 5) == 0);
      const double ge = nmse(g2, g1, (size_t)5 * K);
      CHECKF(exact ? ge == 0 : ge < 1e-12, "get_rows %s K=%d: nmse %.3g", ll_type_name(type), K, ge);
      const int32_t bad = N;
      CHECK(cl->i->get_rows(cl, g2, &w, &bad, 1) == LL_EINVAL);
      free(g1), free(g2);
      // a weight never uploaded goes through a per-call copy, same results
      if (ki == 0) {
        struct ll_weight w2 = {type, K, N, wd, NULL, NULL};
        float *x = malloc((size_t)K * 4), *a = malloc((size_t)N * 4), *b = malloc((size_t)N * 4);
        randf(x, (size_t)K, 1.0f);
        CHECK(cl->i->matmul(cl, a, x, &w, 1, 0) == 0 && cl->i->matmul(cl, b, x, &w2, 1, 0) == 0);
        CHECK(memcmp(a, b, (size_t)N * 4) == 0);
        free(x), free(a), free(b);
      }
      cl->i->weight_release(cl, &w);
      CHECK(w.dev == NULL);
      free(wd);
    }
    printf("matmul + get_rows %-5s: worst nmse %.3g\n", ll_type_name(cases[ci].type), worst);
  }
}

static void test_elementwise(struct ll_backend *cpu, struct ll_backend *cl) {
  // rmsnorm, ragged C, out aliasing x
  {
    const int T = 5, C = 77;
    float *x = malloc(T * C * 4), *g = malloc(C * 4), *a = malloc(T * C * 4), *b = malloc(T * C * 4);
    randf(x, T * C, 3.0f), randf(g, C, 1.0f);
    CHECK(cpu->i->rmsnorm(cpu, a, x, g, T, C, 1e-5f) == 0);
    memcpy(b, x, T * C * 4);
    CHECK(cl->i->rmsnorm(cl, b, b, g, T, C, 1e-5f) == 0);
    const double e = nmse(b, a, T * C);
    printf("rmsnorm: nmse %.3g\n", e);
    CHECK(exact ? e == 0 : e < 1e-10);
    free(x), free(g), free(a), free(b);
  }
  // rope: normal and neox, partial rotation, odd pair count, freq_factors with an attention
  // factor (LongRoPE), both math modes
  for (int v = 0; v < 8; v++) {
    const int T = 4, H = 3, hd = 20;
    const float ff[9] = {1, 1.5f, 2, 4, 8, 1, 1, 3, 1};
    struct ll_rope_params p = {(v & 1) ? LL_ROPE_NEOX : LL_ROPE_NORMAL, (v & 2) ? 18 : 20, 10000.0f, (v & 4) ? 0.5f : 1.0f, (v & 2) ? ff : NULL, (v & 2) ? 1.2247449f : 1.0f};
    const int32_t pos[4] = {0, 7, 100, 3000};
    float *a = malloc(T * H * hd * 4), *b = malloc(T * H * hd * 4);
    randf(a, T * H * hd, 1.0f);
    memcpy(b, a, T * H * hd * 4);
    cpu->ggml_math = cl->ggml_math = v < 4;
    CHECK(cpu->i->rope(cpu, a, pos, T, H, hd, &p) == 0);
    CHECK(cl->i->rope(cl, b, pos, T, H, hd, &p) == 0);
    const double e = nmse(b, a, T * H * hd);
    CHECKF(exact ? e == 0 : e < 1e-12, "rope variant %d: nmse %.3g", v, e);
    free(a), free(b);
  }
  // swiglu (ggml's exp for groups of 8, libm for the tail) and add, ragged n
  for (int gm = 0; gm < 2; gm++) {
    const int n = 1003;
    float *g = malloc(n * 4), *u = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    randf(g, n, 6.0f), randf(u, n, 2.0f);
    cpu->ggml_math = cl->ggml_math = gm;
    CHECK(cpu->i->swiglu(cpu, a, g, u, n) == 0);
    CHECK(cl->i->swiglu(cl, b, g, u, n) == 0);
    // ggml's exp covers groups of 8 (bit-exact); the tail of n % 8 uses libm's expf on the
    // CPU and the device's exp here (within tolerance).
    const int n8 = n - n % 8;
    const double e = nmse(b, a, n), e8 = nmse(b, a, n8);
    printf("swiglu (ggml_math %d): nmse %.3g (first %d: %.3g)\n", gm, e, n8, e8);
    CHECK(e < 1e-10);
    CHECK(exact && gm ? e8 == 0 : e8 < 1e-10);
    CHECK(cpu->i->add(cpu, a, g, u, n) == 0);
    CHECK(cl->i->add(cl, b, g, u, n) == 0);
    CHECK(memcmp(a, b, n * 4) == 0);
    free(g), free(u), free(a), free(b);
  }
  cpu->ggml_math = cl->ggml_math = 1;
}

// Paged KV cache: three sequences with scattered block tables, filled by a prompt chunk and
// single tokens, then attention of a batch (attention_multi) and of one sequence.
static void test_attention(struct ll_backend *cpu, struct ll_backend *cl) {
  for (int f16 = 0; f16 < 2; f16++) {
    const int H = 6, Hkv = 2, hd = 40, block = 16, nblk = 12, kvd = Hkv * hd;
    const size_t pool = (size_t)nblk * block * kvd * (f16 ? 2 : 4);
    void *kc = calloc(1, pool), *vc = calloc(1, pool), *kd = calloc(1, pool), *vd = calloc(1, pool);
    int32_t tabs[3][4] = {{7, 2, 9, 0}, {1, 11, 4, 3}, {5, 10, 6, 8}};
    const int len[3] = {40, 17, 1}; // positions already stored per sequence
    struct ll_kv_view vcpu[3], vcl[3];
    for (int s = 0; s < 3; s++) {
      vcpu[s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kc, vc, tabs[s], 0};
      vcl[s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kd, vd, tabs[s], 0};
      float *k = malloc((size_t)len[s] * kvd * 4), *v = malloc((size_t)len[s] * kvd * 4);
      int32_t *pos = malloc((size_t)len[s] * 4);
      randf(k, (size_t)len[s] * kvd, 1.0f), randf(v, (size_t)len[s] * kvd, 1.0f);
      for (int t = 0; t < len[s]; t++) pos[t] = t;
      CHECK(cpu->i->kv_store(cpu, &vcpu[s], k, v, pos, len[s]) == 0);
      CHECK(cl->i->kv_store(cl, &vcl[s], k, v, pos, len[s]) == 0);
      free(k), free(v), free(pos);
    }
    // the batch: seq 0 one token (pos 40), seq 1 a chunk of 5 (17..21), seq 2 one (pos 1)
    const int nt[3] = {1, 5, 1}, t0[3] = {0, 1, 6}, T = 7;
    int32_t pos[7] = {40, 17, 18, 19, 20, 21, 1};
    float *k = malloc(T * kvd * 4), *v = malloc(T * kvd * 4), *q = malloc(T * H * hd * 4);
    randf(k, T * kvd, 1.0f), randf(v, T * kvd, 1.0f), randf(q, T * H * hd, 2.0f);
    for (int s = 0; s < 3; s++) {
      CHECK(cpu->i->kv_store(cpu, &vcpu[s], k + t0[s] * kvd, v + t0[s] * kvd, pos + t0[s], nt[s]) == 0);
      CHECK(cl->i->kv_store(cl, &vcl[s], k + t0[s] * kvd, v + t0[s] * kvd, pos + t0[s], nt[s]) == 0);
    }
    float *a = malloc(T * H * hd * 4), *b = malloc(T * H * hd * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    CHECK(cpu->i->attention_multi(cpu, a, q, vcpu, pos, t0, nt, 3, H, scale) == 0);
    CHECK(cl->i->attention_multi(cl, b, q, vcl, pos, t0, nt, 3, H, scale) == 0);
    const double e = nmse(b, a, (size_t)T * H * hd);
    printf("attention_multi (%s cache): nmse %.3g\n", f16 ? "f16" : "f32", e);
    CHECK(exact ? e == 0 : e < (f16 ? 1e-6 : 1e-8));
    // one sequence alone gives what the batch gave it
    float *c = malloc(5 * H * hd * 4);
    CHECK(cl->i->attention(cl, c, q + 1 * H * hd, &vcl[1], pos + 1, 5, H, scale) == 0);
    CHECK(memcmp(c, b + 1 * H * hd, 5 * H * hd * 4) == 0);
    // the host pools are names only: the device never wrote them
    int zero = 1;
    for (size_t i = 0; i < pool; i++) zero &= ((unsigned char *)kd)[i] == 0;
    CHECK(zero);
    free(c), free(a), free(b), free(k), free(v), free(q), free(kc), free(vc), free(kd), free(vd);
  }
}

// ---- training members against the CPU's scalar references (kernels/cpu/train_ref.c)
//
// Tolerances (normalized MSE unless said otherwise). On an f64 device the kernels add every
// sum in the reference's order (see kernels/opencl/train.cl): matmul_backward (dx for every
// weight type, dw), rmsnorm_backward, rope_backward, attention_backward, adamw are asserted
// bit-exact there, 1e-10 elsewhere (f32 instead of f64 sums; no quantization follows to
// amplify it). Always exact (no sum, or one in the reference's order, and no f64 involved):
// get_rows_backward, dropout, axpy, scale. Through the device's exp instead of libm's expf
// (within a few ulps, 1e-7 relative): swiglu_backward 1e-11, attention_train out and att 1e-10,
// softmax_xent dlogits 1e-11 and the loss (a sum of T logs) 1e-6 relative. sumsq: per-group
// partials instead of the reference's one running sum, whose own rounding error over n
// positive terms is bounded by (n - 1) 2^-53 relative (1.1e-11 for the n = 100003 here):
// 3e-11 relative with f64, 1e-6 without.
static const struct ll_backend_i *ref_i;
static int64_t launches(struct ll_backend *b);

static void fill_same(float *a, float *b, size_t n, float scale) {
  randf(a, n, scale);
  memcpy(b, a, n * 4);
}

static void test_matmul_backward(struct ll_backend *cl) {
  static const struct {
    int type, k;
  } cases[] = {{LL_TYPE_Q4_0, 160}, {LL_TYPE_Q4_1, 160}, {LL_TYPE_Q5_0, 160}, {LL_TYPE_Q5_1, 160}, {LL_TYPE_Q8_0, 160}, {LL_TYPE_Q4_K, 256},
               {LL_TYPE_Q5_K, 256}, {LL_TYPE_Q6_K, 256}, {LL_TYPE_F32, 77},   {LL_TYPE_F16, 77},   {LL_TYPE_BF16, 77},
               // 1100 rows of 2080: two chunks of the dequantized scratch (8 MiB each)
               {LL_TYPE_Q4_0, 2080}};
  static const int Ts[] = {1, 3, 11};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int K = cases[ci].k, type = cases[ci].type, N = K == 2080 ? 1100 : 37;
    void *wd = make_weight(type, K, N);
    struct ll_weight w = {type, K, N, wd, NULL, NULL}, wc = w;
    CHECK(cl->i->weight_upload(cl, &w) == 0);
    double worst = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
      const int T = Ts[ti];
      float *dout = malloc((size_t)T * N * 4), *x = malloc((size_t)T * K * 4), *a = malloc((size_t)T * K * 4), *b = malloc((size_t)T * K * 4);
      randf(dout, (size_t)T * N, 1.0f), randf(x, (size_t)T * K, 1.0f);
      fill_same(a, b, (size_t)T * K, 1.0f); // dx accumulates
      CHECK(ref_i->matmul_backward(NULL, a, NULL, dout, x, &wc, T) == 0);
      // uploaded weight for T > 1, a per-call copy for T = 1 (both paths)
      CHECK(cl->i->matmul_backward(cl, b, NULL, dout, x, T == 1 ? &wc : &w, T) == 0);
      const double e = nmse(b, a, (size_t)T * K);
      CHECKF(exact ? e == 0 : e < 1e-10, "matmul_backward dx %s K=%d N=%d T=%d: nmse %.3g", ll_type_name(type), K, N, T, e);
      worst = e > worst ? e : worst;
      if (type == LL_TYPE_F32) { // dw alone, then dx and dw in one call
        float *ga = malloc((size_t)N * K * 4), *gb = malloc((size_t)N * K * 4);
        fill_same(ga, gb, (size_t)N * K, 0.5f);
        CHECK(ref_i->matmul_backward(NULL, NULL, ga, dout, x, &wc, T) == 0);
        CHECK(cl->i->matmul_backward(cl, NULL, gb, dout, x, &w, T) == 0);
        const double ew = nmse(gb, ga, (size_t)N * K);
        CHECKF(exact ? ew == 0 : ew < 1e-10, "matmul_backward dw T=%d: nmse %.3g", T, ew);
        CHECK(ref_i->matmul_backward(NULL, a, ga, dout, x, &wc, T) == 0);
        CHECK(cl->i->matmul_backward(cl, b, gb, dout, x, &w, T) == 0);
        const double e2 = nmse(b, a, (size_t)T * K), ew2 = nmse(gb, ga, (size_t)N * K);
        CHECKF(exact ? e2 == 0 && ew2 == 0 : e2 < 1e-10 && ew2 < 1e-10, "matmul_backward dx+dw T=%d: nmse %.3g %.3g", T, e2, ew2);
        printf("matmul_backward dw f32 T=%d: nmse %.3g\n", T, ew > ew2 ? ew : ew2);
        free(ga), free(gb);
      } else if (ti == 0) {
        float g1[4];
        CHECK(cl->i->matmul_backward(cl, NULL, g1, dout, x, &w, T) == LL_EINVAL); // dw only for F32 weights
      }
      free(dout), free(x), free(a), free(b);
    }
    printf("matmul_backward dx %-5s K=%d N=%d: worst nmse %.3g\n", ll_type_name(type), K, N, worst);
    cl->i->weight_release(cl, &w);
    free(wd);
  }
}

static void test_train_ops(struct ll_backend *cl) {
  // rmsnorm_backward: odd C (above and below the work-group), ragged T; dx and dg accumulate;
  // either may be NULL
  for (int cfg = 0; cfg < 2; cfg++) {
    const int T = 7, C = cfg ? 5 : 77;
    float *x = malloc(T * C * 4), *g = malloc(C * 4), *d = malloc(T * C * 4), *a = malloc(T * C * 4), *b = malloc(T * C * 4);
    float ga[77], gb[77];
    randf(x, T * C, 3.0f), randf(g, C, 1.0f), randf(d, T * C, 1.0f);
    for (int v = 0; v < 3; v++) {
      fill_same(a, b, T * C, 1.0f), fill_same(ga, gb, C, 1.0f);
      float *pa = v == 2 ? NULL : a, *pb = v == 2 ? NULL : b, *qa = v == 1 ? NULL : ga, *qb = v == 1 ? NULL : gb;
      CHECK(ref_i->rmsnorm_backward(NULL, pa, qa, d, x, g, T, C, 1e-5f) == 0);
      CHECK(cl->i->rmsnorm_backward(cl, pb, qb, d, x, g, T, C, 1e-5f) == 0);
      const double e = nmse(b, a, T * C), eg = nmse(gb, ga, C);
      printf("rmsnorm_backward C=%d (%s): nmse dx %.3g dg %.3g\n", C, v == 0 ? "dx, dg" : v == 1 ? "dx" : "dg", e, eg);
      CHECK(exact ? e == 0 && eg == 0 : e < 1e-10 && eg < 1e-10);
    }
    free(x), free(g), free(d), free(a), free(b);
  }
  // rope_backward: normal and neox, partial rotation, odd pair count, freq_factors with an
  // attention factor (LongRoPE)
  for (int v = 0; v < 8; v++) {
    const int T = 5, H = 3, hd = 20;
    const float ff[9] = {1, 1.5f, 2, 4, 8, 1, 1, 3, 1};
    struct ll_rope_params p = {(v & 1) ? LL_ROPE_NEOX : LL_ROPE_NORMAL, (v & 2) ? 18 : 20, 10000.0f, (v & 4) ? 0.5f : 1.0f, (v & 2) ? ff : NULL, (v & 2) ? 1.2247449f : 1.0f};
    const int32_t pos[5] = {0, 7, 100, 3000, 1};
    float a[5 * 3 * 20], b[5 * 3 * 20];
    fill_same(a, b, T * H * hd, 1.0f);
    CHECK(ref_i->rope_backward(NULL, a, pos, T, H, hd, &p) == 0);
    CHECK(cl->i->rope_backward(cl, b, pos, T, H, hd, &p) == 0);
    const double e = nmse(b, a, T * H * hd);
    CHECKF(exact ? e == 0 : e < 1e-10, "rope_backward variant %d: nmse %.3g", v, e);
  }
  // swiglu_backward, ragged n
  {
    const int n = 1003;
    float *g = malloc(n * 4), *u = malloc(n * 4), *d = malloc(n * 4), *a1 = malloc(n * 4), *a2 = malloc(n * 4), *b1 = malloc(n * 4),
          *b2 = malloc(n * 4);
    randf(g, n, 6.0f), randf(u, n, 2.0f), randf(d, n, 1.0f);
    CHECK(ref_i->swiglu_backward(NULL, a1, a2, d, g, u, n) == 0);
    CHECK(cl->i->swiglu_backward(cl, b1, b2, d, g, u, n) == 0);
    const double e1 = nmse(b1, a1, n), e2 = nmse(b2, a2, n);
    printf("swiglu_backward: nmse dgate %.3g dup %.3g\n", e1, e2);
    CHECK(e1 < 1e-11 && e2 < 1e-11);
    free(g), free(u), free(d), free(a1), free(a2), free(b1), free(b2);
  }
  // attention_train + attention_backward: S > the work-group (70), GQA 6/2, odd head_dim; then
  // head_dim > the work-group (130), no grouping, a short sequence
  for (int cfg = 0; cfg < 2; cfg++) {
    const int S = cfg ? 5 : 70, H = cfg ? 4 : 6, Hkv = cfg ? 4 : 2, hd = cfg ? 130 : 37;
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *oa = malloc(nq * 4), *ob = malloc(nq * 4), *aa = malloc(na * 4),
          *ab = malloc(na * 4);
    randf(q, nq, 2.0f), randf(k, nk, 2.0f), randf(v, nk, 1.0f);
    for (size_t i = 0; i < na; i++) ab[i] = 1.0f; // the op must write every entry, zeros included
    CHECK(ref_i->attention_train(NULL, oa, aa, q, k, v, S, H, Hkv, hd, scale) == 0);
    CHECK(cl->i->attention_train(cl, ob, ab, q, k, v, S, H, Hkv, hd, scale) == 0);
    const double eo = nmse(ob, oa, nq), ea = nmse(ab, aa, na);
    int upper_zero = 1;
    for (int h = 0; h < H; h++)
      for (int i = 0; i < S; i++)
        for (int j = i + 1; j < S; j++) upper_zero &= ab[((size_t)h * S + i) * S + j] == 0.0f;
    printf("attention_train S=%d H=%d/%d hd=%d: nmse out %.3g att %.3g\n", S, H, Hkv, hd, eo, ea);
    CHECK(eo < 1e-10 && ea < 1e-10 && upper_zero);
    // the backward from the same inputs (the reference's att): dq, dk, dv overwritten
    float *d = malloc(nq * 4), *dqa = malloc(nq * 4), *dqb = malloc(nq * 4), *dka = malloc(nk * 4), *dkb = malloc(nk * 4),
          *dva = malloc(nk * 4), *dvb = malloc(nk * 4);
    randf(d, nq, 1.0f), randf(dqb, nq, 1.0f), randf(dkb, nk, 1.0f), randf(dvb, nk, 1.0f);
    CHECK(ref_i->attention_backward(NULL, dqa, dka, dva, d, q, k, v, aa, S, H, Hkv, hd, scale) == 0);
    CHECK(cl->i->attention_backward(cl, dqb, dkb, dvb, d, q, k, v, aa, S, H, Hkv, hd, scale) == 0);
    const double eq = nmse(dqb, dqa, nq), ek = nmse(dkb, dka, nk), ev = nmse(dvb, dva, nk);
    printf("attention_backward: nmse dq %.3g dk %.3g dv %.3g\n", eq, ek, ev);
    CHECK(exact ? eq == 0 && ek == 0 && ev == 0 : eq < 1e-10 && ek < 1e-10 && ev < 1e-10);
    CHECK(cl->i->attention_backward(cl, dqb, dkb, dvb, d, q, k, v, aa, S, 5, 2, hd, scale) == LL_EINVAL); // 5 % 2
    free(q), free(k), free(v), free(oa), free(ob), free(aa), free(ab);
    free(d), free(dqa), free(dqb), free(dka), free(dkb), free(dva), free(dvb);
  }
  // Gemma 3's ops (train_window.cl). geglu_backward, ragged n, gates past +-10 too: the
  // reference's expressions with the device's tanh for libm's tanhf, ulps apart; 1 + tanh u
  // cancels for gates below about -4, where that ulp is most of gelu' (dgate 1e-9: observed
  // 3.7e-11 on PoCL; dup 1e-12: observed 8e-16).
  {
    const int n = 1003;
    float *g = malloc(n * 4), *u = malloc(n * 4), *d = malloc(n * 4), *a1 = malloc(n * 4), *a2 = malloc(n * 4), *b1 = malloc(n * 4),
          *b2 = malloc(n * 4);
    randf(g, n, 12.0f), randf(u, n, 2.0f), randf(d, n, 1.0f);
    CHECK(ref_i->geglu_backward(NULL, a1, a2, d, g, u, n) == 0);
    const int64_t l0 = launches(cl);
    CHECK(cl->i->geglu_backward && cl->i->geglu_backward(cl, b1, b2, d, g, u, n) == 0);
    const double e1 = nmse(b1, a1, n), e2 = nmse(b2, a2, n);
    printf("geglu_backward: nmse dgate %.3g dup %.3g (%lld launch)\n", e1, e2, (long long)(launches(cl) - l0));
    CHECK(e1 < 1e-9 && e2 < 1e-12 && launches(cl) - l0 == 1);
    free(g), free(u), free(d), free(a1), free(a2), free(b1), free(b2);
  }
  // attention_train_swa: windows 1, 17 (< S) and 70 (= S: attention_train's results), S past the
  // work-group, GQA; every entry outside a row's window written 0. Sums and the f64 softmax sum
  // in the reference's order, the device's exp for libm's expf: attention_train's 1e-10
  // (observed 1.5e-15 on PoCL).
  {
    const int S = 70, H = 6, Hkv = 2, hd = 37;
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *oa = malloc(nq * 4), *ob = malloc(nq * 4), *aa = malloc(na * 4),
          *ab = malloc(na * 4), *oc = malloc(nq * 4), *ac = malloc(na * 4);
    randf(q, nq, 2.0f), randf(k, nk, 2.0f), randf(v, nk, 1.0f);
    CHECK(ref_i->attention_train(NULL, oc, ac, q, k, v, S, H, Hkv, hd, scale) == 0); // unwindowed
    static const int wins[] = {1, 17, 70};
    for (size_t wi = 0; wi < sizeof wins / sizeof wins[0]; wi++) {
      const int W = wins[wi];
      for (size_t i = 0; i < na; i++) ab[i] = 1.0f;
      CHECK(ref_i->attention_train_swa(NULL, oa, aa, q, k, v, S, H, Hkv, hd, scale, W) == 0);
      CHECK(cl->i->attention_train_swa && cl->i->attention_train_swa(cl, ob, ab, q, k, v, S, H, Hkv, hd, scale, W) == 0);
      const double eo = nmse(ob, oa, nq), ea = nmse(ab, aa, na), dw = nmse(ob, oc, nq);
      int outside_zero = 1;
      for (int h = 0; h < H; h++)
        for (int i = 0; i < S; i++)
          for (int j = 0; j < S; j++) outside_zero &= (j > i || j <= i - W) ? ab[((size_t)h * S + i) * S + j] == 0.0f : 1;
      printf("attention_train_swa S=%d window %d: nmse out %.3g att %.3g (against the unwindowed %.3g)\n", S, W, eo, ea, dw);
      CHECK(eo < 1e-10 && ea < 1e-10 && outside_zero);
      CHECK(W < S ? dw > 1e-4 : dw < 1e-10); // the window changed the results (and a full one did not)
    }
    free(q), free(k), free(v), free(oa), free(ob), free(aa), free(ab), free(oc), free(ac);
  }
  // softmax_xent: odd V, masked rows, dlogits aliasing logits, and the loss alone; then V
  // smaller than the work-group
  for (int cfg = 0; cfg < 2; cfg++) {
    const int T = 9, V = cfg ? 5 : 1001;
    int32_t tg[9] = {5, -1, 1000, 0, 17, -1, 999, 3, 500};
    for (int t = 0; t < T; t++) tg[t] = tg[t] < 0 ? -1 : tg[t] % V;
    float *l = malloc(T * V * 4), *da = malloc(T * V * 4), *db = malloc(T * V * 4);
    randf(l, T * V, 8.0f);
    double la = 0, lb = 0, lc = 0;
    CHECK(ref_i->softmax_xent(NULL, &la, da, l, tg, T, V, 0.25f) == 0);
    memcpy(db, l, T * V * 4);
    CHECK(cl->i->softmax_xent(cl, &lb, db, db, tg, T, V, 0.25f) == 0); // aliasing
    CHECK(cl->i->softmax_xent(cl, &lc, NULL, l, tg, T, V, 0.25f) == 0);
    const double e = nmse(db, da, T * V), rl = fabs(lb - la) / fabs(la);
    printf("softmax_xent V=%d: loss %.9f (cpu %.9f, rel %.3g), nmse dlogits %.3g\n", V, lb, la, rl, e);
    CHECK(rl < 1e-6 && lc == lb && e < 1e-11);
    int zero = 1;
    for (int j = 0; j < V; j++) zero &= db[1 * V + j] == 0.0f && db[5 * V + j] == 0.0f;
    CHECK(zero);
    const int32_t bad[1] = {V};
    CHECK(cl->i->softmax_xent(cl, &lc, NULL, l, bad, 1, V, 1.0f) == LL_EINVAL);
    free(l), free(da), free(db);
  }
  // get_rows_backward: repeated, out-of-order ids accumulate in t order (exact everywhere)
  {
    const int R = 50, C = 77, T = 13;
    const int32_t ids[13] = {3, 49, 3, 0, 17, 3, 49, 8, 8, 0, 21, 3, 1};
    float *d = malloc(T * C * 4), *a = malloc(R * C * 4), *b = malloc(R * C * 4);
    randf(d, T * C, 1.0f), fill_same(a, b, R * C, 1.0f);
    CHECK(ref_i->get_rows_backward(NULL, a, d, ids, T, C) == 0);
    CHECK(cl->i->get_rows_backward(cl, b, d, ids, T, C) == 0);
    CHECKF(memcmp(a, b, R * C * 4) == 0, "get_rows_backward: nmse %.3g", nmse(b, a, R * C));
    const int32_t neg = -1;
    CHECK(cl->i->get_rows_backward(cl, b, d, &neg, 1, C) == LL_EINVAL);
    free(d), free(a), free(b);
  }
  // dropout: the CPU's mask bit for bit (and its scaling), two seeds, p = 0
  {
    const int64_t n = 10007;
    float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    randf(x, n, 1.0f);
    const float ps[3] = {0.1f, 0.5f, 0.0f};
    for (int i = 0; i < 3; i++) {
      const uint64_t seed = 0x1234567890abcdefULL + (uint64_t)i * 7919;
      CHECK(ref_i->dropout(NULL, a, x, ps[i], seed, n) == 0);
      CHECK(cl->i->dropout(cl, b, x, ps[i], seed, n) == 0);
      int64_t zeros = 0;
      for (int64_t j = 0; j < n; j++) zeros += b[j] == 0.0f;
      printf("dropout p=%.1f: %lld of %lld dropped\n", ps[i], (long long)zeros, (long long)n);
      CHECK(memcmp(a, b, n * 4) == 0);
    }
    CHECK(cl->i->dropout(cl, b, x, 1.0f, 1, n) == LL_EINVAL);
    free(x), free(a), free(b);
  }
  // sumsq, axpy (x aliasing out too), scale
  {
    const int64_t n = 100003;
    float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    randf(x, n, 2.0f);
    double sa = 0, sb = 0;
    CHECK(ref_i->sumsq(NULL, &sa, x, n) == 0);
    CHECK(cl->i->sumsq(cl, &sb, x, n) == 0);
    const double r = fabs(sb - sa) / sa;
    printf("sumsq: %.17g (cpu %.17g, rel %.3g)\n", sb, sa, r);
    CHECK(r < (exact ? 3e-11 : 1e-6));
    CHECK(cl->i->sumsq(cl, &sb, x, 5) == 0 && ref_i->sumsq(NULL, &sa, x, 5) == 0 && fabs(sb - sa) <= (exact ? 1e-12 : 1e-6) * sa); // fewer than a group
    fill_same(a, b, n, 1.0f);
    CHECK(ref_i->axpy(NULL, a, x, -0.3f, n) == 0 && cl->i->axpy(cl, b, x, -0.3f, n) == 0);
    CHECK(memcmp(a, b, n * 4) == 0);
    CHECK(ref_i->axpy(NULL, a, a, 0.7f, n) == 0 && cl->i->axpy(cl, b, b, 0.7f, n) == 0);
    CHECK(memcmp(a, b, n * 4) == 0);
    CHECK(ref_i->scale(NULL, a, 1.0f / 3, n) == 0 && cl->i->scale(cl, b, 1.0f / 3, n) == 0);
    CHECK(memcmp(a, b, n * 4) == 0);
    free(x), free(a), free(b);
  }
  // adamw: three steps (bias correction changes), weight decay on
  {
    const int64_t n = 1003;
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *g = malloc(n * 4), *m1 = calloc(n, 4), *m2 = calloc(n, 4), *v1 = calloc(n, 4),
          *v2 = calloc(n, 4);
    fill_same(p1, p2, n, 1.0f);
    for (int step = 1; step <= 3; step++) {
      randf(g, n, 0.1f);
      CHECK(ref_i->adamw(NULL, p1, g, m1, v1, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step) == 0);
      CHECK(cl->i->adamw(cl, p2, g, m2, v2, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step) == 0);
    }
    const double ep = nmse(p2, p1, n), em = nmse(m2, m1, n), ev = nmse(v2, v1, n);
    printf("adamw: nmse p %.3g m %.3g v %.3g\n", ep, em, ev);
    CHECK(exact ? ep == 0 && em == 0 && ev == 0 : ep < 1e-10 && em < 1e-10 && ev < 1e-10);
    CHECK(cl->i->adamw(cl, p2, g, m2, v2, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0) == LL_EINVAL);
    free(p1), free(p2), free(g), free(m1), free(m2), free(v1), free(v2);
  }
}

// Backend buffers (device-resident, ll_backend.h): a chain of forward and training ops on
// buffers the device owns gives the same bits as the same ops on host memory, including
// operands at offsets inside a buffer (aligned: sub-buffers; unaligned: device-side copies)
// and outputs aliasing inputs; only scalar results come back while it runs.
static int64_t moved(struct ll_backend *b, int what) { // 0 up, 1 down, 2 device memory held
  struct ll_backend_info in;
  b->i->get_info(b, &in);
  return what == 0 ? in.bytes_up : what == 1 ? in.bytes_down : in.mem_used;
}
static int64_t rounded(int64_t floats) { return (floats * 4 + 63) / 64 * 64; }

static void test_resident(struct ll_backend *cl) {
  const struct ll_backend_i *B = cl->i;
  CHECK(!ll_backend_host_buffers(cl));
  const int T = 6, K = 256, N = 96, S = 3, H = 4, hd = 16, V = 300; // N * 4 bytes: row offsets of 384 B
  void *wd = make_weight(LL_TYPE_Q4_0, K, N);
  struct ll_weight w = {LL_TYPE_Q4_0, K, N, wd, NULL, NULL};
  CHECK(B->weight_upload(cl, &w) == 0);
  float *x = malloc((size_t)T * K * 4), *g = malloc((size_t)N * 4), *lg = malloc((size_t)T * V * 4), *wf = malloc((size_t)N * K * 4);
  randf(x, (size_t)T * K, 1.0f), randf(g, N, 1.0f), randf(lg, (size_t)T * V, 4.0f), randf(wf, (size_t)N * K, 0.1f);
  const int32_t tg[6] = {3, -1, 299, 0, 17, 17}, ids[4] = {5, 1, 5, 2};
  // Host path: the same calls on host memory (uploaded and read back per call).
  float *h_o = calloc((size_t)T * N, 4), *h_h = calloc((size_t)T * N, 4), *h_l = malloc((size_t)T * V * 4), *h_dw = calloc((size_t)8 * N, 4);
  float *h_att = calloc((size_t)H * S * S, 4), *h_ao = calloc((size_t)S * H * hd, 4), *h_f = calloc((size_t)T * N, 4);
  memcpy(h_l, lg, (size_t)T * V * 4);
  double h_loss = 0, h_ss = 0;
  struct ll_weight wfh = {LL_TYPE_F32, K, N, wf, NULL, NULL};
  CHECK(B->matmul(cl, h_o, x, &w, T, 0) == 0);
  CHECK(B->matmul(cl, h_o, x, &w, T, 1) == 0);                      // accumulate
  CHECK(B->rmsnorm(cl, h_o + N, h_o + N, g, T - 1, N, 1e-5f) == 0); // in place, one row in
  CHECK(B->swiglu(cl, h_h, h_o, h_o + N, (int64_t)(T - 1) * N) == 0);
  CHECK(B->axpy(cl, h_h, h_h, 0.5f, (int64_t)T * N) == 0);           // x is out
  CHECK(B->dropout(cl, h_h + 3, h_h + 3, 0.25f, 99, (int64_t)T * N - 3) == 0); // 12 bytes in
  CHECK(B->softmax_xent(cl, &h_loss, h_l, h_l, tg, T, V, 0.5f) == 0); // dlogits over logits
  CHECK(B->get_rows_backward(cl, h_dw, h_h, ids, 4, N) == 0);
  CHECK(B->sumsq(cl, &h_ss, h_h, (int64_t)T * N) == 0);
  CHECK(B->attention_train(cl, h_ao, h_att, h_o, h_o + S * H * hd, h_o + 2 * S * H * hd, S, H, H, hd, 0.25f) == 0);
  // Device path.
  const int64_t up0 = moved(cl, 0), mem0 = moved(cl, 2);
  float *d_x = ll_backend_alloc(cl, (size_t)T * K * 4), *d_o = ll_backend_alloc(cl, (size_t)T * N * 4), *d_h = ll_backend_alloc(cl, (size_t)T * N * 4);
  float *d_l = ll_backend_alloc(cl, (size_t)T * V * 4), *d_dw = ll_backend_alloc(cl, (size_t)8 * N * 4), *d_att = ll_backend_alloc(cl, (size_t)H * S * S * 4);
  float *d_ao = ll_backend_alloc(cl, (size_t)S * H * hd * 4), *d_g = ll_backend_alloc(cl, (size_t)N * 4);
  CHECK(d_x && d_o && d_h && d_l && d_dw && d_att && d_ao && d_g);
  const int64_t held = rounded(T * K) + 2 * rounded(T * N) + rounded(T * V) + rounded(8 * N) + rounded(H * S * S) + rounded(S * H * hd) + rounded(N);
  CHECKF(moved(cl, 2) - mem0 == held, "backend buffers: %lld bytes counted, %lld allocated", (long long)(moved(cl, 2) - mem0), (long long)held);
  CHECK(ll_backend_copy(cl, d_x, x, (size_t)T * K * 4) == 0 && ll_backend_copy(cl, d_l, lg, (size_t)T * V * 4) == 0);
  CHECK(ll_backend_copy(cl, d_g, g, (size_t)N * 4) == 0);
  const int64_t up1 = moved(cl, 0), down1 = moved(cl, 1);
  CHECKF(up1 - up0 == (int64_t)(T * K + T * V + N) * 4, "uploads: %lld bytes", (long long)(up1 - up0));
  double d_loss = 0, d_ss = 0;
  CHECK(B->matmul(cl, d_o, d_x, &w, T, 0) == 0);
  CHECK(B->matmul(cl, d_o, d_x, &w, T, 1) == 0);
  CHECK(B->rmsnorm(cl, d_o + N, d_o + N, d_g, T - 1, N, 1e-5f) == 0);
  CHECK(B->swiglu(cl, d_h, d_o, d_o + N, (int64_t)(T - 1) * N) == 0);
  CHECK(B->axpy(cl, d_h, d_h, 0.5f, (int64_t)T * N) == 0);
  CHECK(B->dropout(cl, d_h + 3, d_h + 3, 0.25f, 99, (int64_t)T * N - 3) == 0);
  CHECK(B->softmax_xent(cl, &d_loss, d_l, d_l, tg, T, V, 0.5f) == 0);
  CHECK(B->get_rows_backward(cl, d_dw, d_h, ids, 4, N) == 0);
  CHECK(B->sumsq(cl, &d_ss, d_h, (int64_t)T * N) == 0);
  CHECK(B->attention_train(cl, d_ao, d_att, d_o, d_o + S * H * hd, d_o + 2 * S * H * hd, S, H, H, hd, 0.25f) == 0);
  // Only the loss's and the norm's partial sums came back; uploads were index arrays only.
  const int64_t down = moved(cl, 1) - down1, up = moved(cl, 0) - up1;
  printf("resident chain: %lld bytes down, %lld up (data %lld bytes)\n", (long long)down, (long long)up, (long long)(T * V + T * N) * 4);
  CHECKF(down <= (int64_t)T * 16 + 256 * 8, "resident chain read back %lld bytes", (long long)down);
  CHECKF(up <= 64, "resident chain uploaded %lld bytes", (long long)up);
  CHECK(d_loss == h_loss && d_ss == h_ss);
  // Results, read back, equal the host path's bit for bit.
  float *r = malloc((size_t)T * V * 4);
  struct {
    const float *d, *h;
    size_t n;
    const char *what;
  } cmp[] = {{d_o, h_o, (size_t)T * N, "matmul/rmsnorm"}, {d_h, h_h, (size_t)T * N, "swiglu/axpy/dropout"}, {d_l, h_l, (size_t)T * V, "dlogits"},
             {d_dw, h_dw, (size_t)8 * N, "get_rows_backward"}, {d_att, h_att, (size_t)H * S * S, "att"}, {d_ao, h_ao, (size_t)S * H * hd, "attention"}};
  for (size_t c = 0; c < sizeof cmp / sizeof cmp[0]; c++) {
    CHECK(ll_backend_copy(cl, r, cmp[c].d, cmp[c].n * 4) == 0);
    CHECKF(memcmp(r, cmp[c].h, cmp[c].n * 4) == 0, "resident %s differs from the host path", cmp[c].what);
  }
  // A weight whose data is a backend buffer (the trainer's f32 weights) multiplies as the same
  // weight in host memory; zero and device-to-device copy; a range past a buffer's end.
  float *d_wf = ll_backend_alloc(cl, (size_t)N * K * 4);
  CHECK(d_wf && ll_backend_copy(cl, d_wf, wf, (size_t)N * K * 4) == 0);
  struct ll_weight wfd = {LL_TYPE_F32, K, N, d_wf, NULL, NULL};
  CHECK(B->matmul(cl, h_f, x, &wfh, T, 0) == 0);
  CHECK(B->matmul(cl, d_o, d_x, &wfd, T, 0) == 0);
  CHECK(ll_backend_copy(cl, r, d_o, (size_t)T * N * 4) == 0);
  CHECK(memcmp(r, h_f, (size_t)T * N * 4) == 0);
  CHECK(ll_backend_copy(cl, d_h + 1, d_o + 2, 40 * 4) == 0 && ll_backend_zero(cl, d_h + 50, 7 * 4) == 0);
  CHECK(ll_backend_copy(cl, r, d_h, (size_t)T * N * 4) == 0);
  int ok = 1;
  for (int j = 0; j < 40; j++) ok &= r[1 + j] == h_f[2 + j];
  for (int j = 50; j < 57; j++) ok &= r[j] == 0.0f;
  CHECK(ok);
  CHECK(B->matmul(cl, d_o + N, d_x, &w, T, 0) == LL_EINVAL); // T rows from row 1 run past d_o
  CHECK(ll_backend_copy(cl, r, d_o + 1, (size_t)T * N * 4) == LL_EINVAL);
  float *bufs[] = {d_x, d_o, d_h, d_l, d_dw, d_att, d_ao, d_g, d_wf};
  const int64_t mem1 = moved(cl, 2);
  for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) ll_backend_free_buf(cl, bufs[j]);
  CHECKF(mem1 - moved(cl, 2) == held + rounded(N * K), "freeing the buffers returned %lld bytes", (long long)(mem1 - moved(cl, 2)));
  B->weight_release(cl, &w);
  free(r), free(x), free(g), free(lg), free(wf), free(wd), free(h_o), free(h_h), free(h_l), free(h_dw), free(h_att), free(h_ao), free(h_f);
}

// Whether OpenCL device (plat, dev) is a CPU device (PoCL): the only kind where exactness is
// asserted (NVIDIA reports f64 and is not bit-exact: issue 29).
static int cpu_device(int plat, int dev) {
  cl_platform_id ps[16];
  cl_device_id ds[16];
  cl_uint np = 0, nd = 0;
  cl_device_type t = 0;
  if (clGetPlatformIDs(16, ps, &np) != CL_SUCCESS || plat < 0 || (cl_uint)plat >= np) return 0;
  if (clGetDeviceIDs(ps[plat], CL_DEVICE_TYPE_ALL, 16, ds, &nd) != CL_SUCCESS || dev < 0 || (cl_uint)dev >= nd) return 0;
  return clGetDeviceInfo(ds[dev], CL_DEVICE_TYPE, sizeof t, &t, NULL) == CL_SUCCESS && (t & CL_DEVICE_TYPE_CPU);
}

static void test_info(struct ll_backend *cl) {
  struct ll_backend_info in;
  cl->i->get_info(cl, &in);
  printf("device: %s | %s | driver %s | %s | %d CUs | %.1f GiB (max alloc %.1f GiB) | fp16 %d subgroups %d | used %.1f MiB\n", in.device,
         in.vendor, in.driver, in.version, in.compute_units, in.mem_total / 1073741824.0, in.max_alloc / 1073741824.0, in.fp16, in.subgroups,
         in.mem_used / 1048576.0);
  CHECK(strcmp(in.name, "opencl") == 0 && in.device[0] && strncmp(in.version, "OpenCL ", 7) == 0);
  exact = in.fp64 && cpu_device(in.cl_platform, in.cl_device) && strcmp(in.tier, "reference") == 0;
  printf("f64: %s, %s tier (%s)\n", in.fp64 ? "yes" : "no", in.tier, exact ? "bit-exact agreement asserted" : "tolerances");
  CHECK(in.mem_total > 0 && in.max_alloc > 0 && in.mem_used > 0 && in.mem_used < in.mem_total);
  // Accounting follows uploads and releases exactly.
  const int64_t before = in.mem_used;
  void *wd = make_weight(LL_TYPE_Q8_0, 1024, 64);
  struct ll_weight w = {LL_TYPE_Q8_0, 1024, 64, wd, NULL, NULL}, w2 = w;
  CHECK(cl->i->weight_upload(cl, &w) == 0 && cl->i->weight_upload(cl, &w2) == 0 && w.dev == w2.dev); // tied: one copy
  cl->i->get_info(cl, &in);
  CHECK(in.mem_used == before + (int64_t)ll_row_size(LL_TYPE_Q8_0, 1024) * 64);
  cl->i->weight_release(cl, &w);
  cl->i->get_info(cl, &in);
  CHECK(in.mem_used == before + (int64_t)ll_row_size(LL_TYPE_Q8_0, 1024) * 64); // w2 still holds it
  cl->i->weight_release(cl, &w2);
  cl->i->get_info(cl, &in);
  CHECK(in.mem_used == before);
  free(wd);
}

// ---- device choice, each case in a fresh process (the ICD loader reads its environment once)

static int choice_child(const char *env_vendors, const char *env_fault, const char *env_limit, const char *device, const char *expect_prefix,
                        const char *expect_sub) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 0;
  if (pid == 0) {
    if (env_vendors) setenv("OCL_ICD_VENDORS", env_vendors, 1);
    if (env_fault) setenv("LL_OPENCL_FAULT", env_fault, 1);
    if (env_limit) setenv("LL_OPENCL_MEM_LIMIT", env_limit, 1);
    struct ll_backend *b = NULL;
    struct ll_backend_params p = {1, device, NULL};
    char reason[512] = "", err[256] = "";
    int rc = ll_backend_create(&b, &p, reason, sizeof reason, err, sizeof err);
    printf("  %s (%s%s%s): rc %d, reason: %s\n", device, env_vendors ? "OCL_ICD_VENDORS=" : "", env_vendors ? env_vendors : "",
           env_fault ? " LL_OPENCL_FAULT" : "", rc, reason);
    int ok = rc == 0 && b && strncmp(reason, expect_prefix, strlen(expect_prefix)) == 0 && strstr(reason, expect_sub) != NULL;
    ll_backend_free(b);
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_choice(void) {
  char empty[] = "/tmp/ll_ocl_empty_XXXXXX", broken[] = "/tmp/ll_ocl_broken_XXXXXX";
  CHECK(mkdtemp(empty) != NULL && mkdtemp(broken) != NULL);
  char icd[128];
  snprintf(icd, sizeof icd, "%s/broken.icd", broken);
  FILE *f = fopen(icd, "w");
  CHECK(f != NULL);
  if (f) fputs("/nonexistent/libOpenCL-vendor-that-is-not-there.so\n", f), fclose(f);
  printf("device choice:\n");
  CHECK(choice_child(empty, NULL, NULL, "auto", "cpu: no OpenCL platform", "ICD"));
  CHECK(choice_child(empty, NULL, NULL, dev_name, "cpu: no OpenCL platform", "requested"));
  CHECK(choice_child(broken, NULL, NULL, "opencl", "cpu: no OpenCL platform", "ICD"));
  CHECK(choice_child(NULL, NULL, NULL, "opencl:0:9", "cpu: no OpenCL device opencl:0:9", "found"));
  CHECK(choice_child(NULL, NULL, NULL, "cpu", "cpu: requested", "cpu"));
  CHECK(choice_child(NULL, "selftest", NULL, dev_name, "cpu: skipped", "self-test failed"));
  CHECK(choice_child(NULL, NULL, "1000", dev_name, "cpu: skipped", "out of memory"));
  unlink(icd);
  rmdir(empty), rmdir(broken);
}

// The device under test: $LL_TEST_OPENCL_DEVICE, or the first CPU OpenCL device (PoCL).
static int find_device(void) {
  const char *env = getenv("LL_TEST_OPENCL_DEVICE");
  if (env && *env) {
    snprintf(dev_name, sizeof dev_name, "%s", env);
    return 1;
  }
  cl_platform_id plats[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) return 0;
  for (cl_uint p = 0; p < np && p < 16; p++) {
    cl_device_id d[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, d, &nd) != CL_SUCCESS) continue;
    for (cl_uint i = 0; i < nd && i < 16; i++) {
      cl_device_type t = 0;
      clGetDeviceInfo(d[i], CL_DEVICE_TYPE, sizeof t, &t, NULL);
      if (t & CL_DEVICE_TYPE_CPU) {
        snprintf(dev_name, sizeof dev_name, "opencl:%u:%u", p, i);
        return 1;
      }
    }
  }
  return 0;
}

// Two instances on one device (the server's serving and training backends): each reports the
// device's indices (opencl:P:D, how the trainer names the serving device), and a weight one
// uploaded is a buffer of its context, which the other stages per call instead of using (the
// same results) and does not release.
static void test_two_instances(struct ll_backend *a, struct ll_backend *b) {
  struct ll_backend_info ia, ib;
  a->i->get_info(a, &ia);
  b->i->get_info(b, &ib);
  char name[32];
  snprintf(name, sizeof name, "opencl:%d:%d", ia.cl_platform, ia.cl_device);
  CHECKF(strcmp(name, dev_name) == 0 && ia.cl_platform == ib.cl_platform && ia.cl_device == ib.cl_device, "instances report %s for %s", name,
         dev_name);
  const int K = 160, N = 37, T = 3;
  void *wd = make_weight(LL_TYPE_Q4_1, K, N);
  struct ll_weight w = {LL_TYPE_Q4_1, K, N, wd, NULL, NULL};
  CHECK(a->i->weight_upload(a, &w) == 0 && w.dev);
  float *x = malloc((size_t)T * K * 4), *oa = malloc((size_t)T * N * 4), *ob = malloc((size_t)T * N * 4);
  randf(x, (size_t)T * K, 1.0f);
  CHECK(a->i->matmul(a, oa, x, &w, T, 0) == 0);
  CHECK(b->i->matmul(b, ob, x, &w, T, 0) == 0);
  CHECK(memcmp(oa, ob, (size_t)T * N * 4) == 0);
  void *dev = w.dev;
  b->i->weight_release(b, &w); // not b's: left alone
  CHECK(w.dev == dev);
  a->i->weight_release(a, &w);
  CHECK(w.dev == NULL);
  free(x), free(oa), free(ob), free(wd);
}


// ---- the fast tier (llsrv_fast.cl) against the CPU, with tolerances (see the top)
static int64_t launches(struct ll_backend *b) {
  struct ll_backend_info in;
  b->i->get_info(b, &in);
  return in.launches;
}

// The fast tier's attention (llsrv_fast.cl attn_fast: K/V tiles in local memory, online softmax)
// against the CPU's, nmse: an f32 cache 1e-11 (sums and exp in another order; PoCL: 2e-14 ..
// 4e-14), an f16 cache 1e-6 (the CPU rounds the probabilities to f16 before the V sum, the fast
// kernel does not: up to 2^-11 relative per weight; PoCL: 3e-8 .. 4e-8). Shapes: grouped-query (G = 1, 3, 4), head dims 40, 64, 128, 256
// (tiles of 64, 32, 16 positions), a sliding window; a batch of a decode token past a tile
// boundary (pos 70), a chunk of 13 after 17 stored positions and a 20-token prompt from 0.
#define FAST_ATT_TOL_F32 1e-11
#define FAST_ATT_TOL_F16 1e-6
static void test_fast_attention(struct ll_backend *cpu, struct ll_backend *cl) {
  static const struct {
    int H, Hkv, hd, f16, window;
  } cs[] = {{6, 2, 40, 1, 0}, {9, 3, 64, 1, 0}, {4, 4, 128, 0, 0}, {8, 2, 64, 1, 8}, {2, 1, 256, 0, 0}, {8, 2, 64, 0, 30}};
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
    const int H = cs[ci].H, Hkv = cs[ci].Hkv, hd = cs[ci].hd, f16 = cs[ci].f16, block = 16, nblk = 16, kvd = Hkv * hd;
    const size_t pool = (size_t)nblk * block * kvd * (f16 ? 2 : 4);
    void *kc = calloc(1, pool), *vc = calloc(1, pool), *kd = calloc(1, pool), *vd = calloc(1, pool);
    int32_t tabs[3][5] = {{7, 2, 9, 0, 15}, {1, 11, 4, 3, 13}, {5, 10, 6, 8, 12}};
    const int len[3] = {70, 17, 0}; // positions already stored per sequence
    struct ll_kv_view vcpu[3], vcl[3];
    for (int s = 0; s < 3; s++) {
      vcpu[s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kc, vc, tabs[s], cs[ci].window};
      vcl[s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kd, vd, tabs[s], cs[ci].window};
      if (!len[s]) continue;
      float *k = malloc((size_t)len[s] * kvd * 4), *v = malloc((size_t)len[s] * kvd * 4);
      int32_t *pos = malloc((size_t)len[s] * 4);
      randf(k, (size_t)len[s] * kvd, 1.0f), randf(v, (size_t)len[s] * kvd, 1.0f);
      for (int t = 0; t < len[s]; t++) pos[t] = t;
      CHECK(cpu->i->kv_store(cpu, &vcpu[s], k, v, pos, len[s]) == 0);
      CHECK(cl->i->kv_store(cl, &vcl[s], k, v, pos, len[s]) == 0);
      free(k), free(v), free(pos);
    }
    const int nt[3] = {1, 13, 20}, t0[3] = {0, 1, 14}, T = 34;
    int32_t pos[34];
    pos[0] = 70;
    for (int t = 0; t < 13; t++) pos[1 + t] = 17 + t;
    for (int t = 0; t < 20; t++) pos[14 + t] = t;
    float *k = malloc((size_t)T * kvd * 4), *v = malloc((size_t)T * kvd * 4), *q = malloc((size_t)T * H * hd * 4);
    randf(k, (size_t)T * kvd, 1.0f), randf(v, (size_t)T * kvd, 1.0f), randf(q, (size_t)T * H * hd, 2.0f);
    for (int s = 0; s < 3; s++) {
      CHECK(cpu->i->kv_store(cpu, &vcpu[s], k + t0[s] * kvd, v + t0[s] * kvd, pos + t0[s], nt[s]) == 0);
      CHECK(cl->i->kv_store(cl, &vcl[s], k + t0[s] * kvd, v + t0[s] * kvd, pos + t0[s], nt[s]) == 0);
    }
    float *a = malloc((size_t)T * H * hd * 4), *b = malloc((size_t)T * H * hd * 4), *c = malloc((size_t)13 * H * hd * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    CHECK(cpu->i->attention_multi(cpu, a, q, vcpu, pos, t0, nt, 3, H, scale) == 0);
    struct ll_backend_info i0, i1;
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->attention_multi(cl, b, q, vcl, pos, t0, nt, 3, H, scale) == 0);
    cl->i->get_info(cl, &i1);
    CHECKF(i1.launches - i0.launches == 1 && i1.fast_launches - i0.fast_launches == 1, "fast attention: %lld launches, %lld of the fast tier",
           (long long)(i1.launches - i0.launches), (long long)(i1.fast_launches - i0.fast_launches));
    const double e = nmse(b, a, (size_t)T * H * hd);
    printf("fast attention H=%d Hkv=%d hd=%d %s cache window %d: nmse %.3g\n", H, Hkv, hd, f16 ? "f16" : "f32", cs[ci].window, e);
    CHECKF(e < (f16 ? FAST_ATT_TOL_F16 : FAST_ATT_TOL_F32), "fast attention case %zu: nmse %.3g", ci, e);
    // a sequence alone gives what the batch gave it (a work-group never spans sequences)
    CHECK(cl->i->attention(cl, c, q + 1 * H * hd, &vcl[1], pos + 1, 13, H, scale) == 0);
    CHECK(memcmp(c, b + 1 * H * hd, (size_t)13 * H * hd * 4) == 0);
    free(a), free(b), free(c), free(k), free(v), free(q), free(kc), free(vc), free(kd), free(vd);
  }
}

// Sampling on the device (the sample member, both tiers) against the host sampler's chain for
// the same step (server/engine/sample.c ll_sample_dev_choose): random logits with ties, top-k
// 1 .. 64 (and more than the vocabulary), top-p, min-p, temperatures, rows of argmax among
// them, and in half the trials repetition / frequency / presence penalties over up to 24 tokens
// (the row's top pair among them); the same ids where the device has f64 (its sums differ from the host's only in order,
// which moves a choice only if a draw lands within ~1e-16 of a boundary), 90% of them without
// (f32 sums and a 24-bit draw: 96.9-97.5% on PoCL built so). One launch, 4 bytes back per row.
static void test_sample(struct ll_backend *cl) {
  const int R = 8;
  struct ll_token_prob *cand = malloc(1000 * sizeof *cand);
  float *l = malloc((size_t)R * 1000 * 4), *l0 = malloc((size_t)R * 1000 * 4);
  int32_t pen[8 * 48];
  struct ll_sample_dev d[8];
  int same = 0, total = 0, same_pen = 0, total_pen = 0;
  for (int trial = 0; trial < 40; trial++) {
    const int V = trial % 5 == 4 ? 40 : 1000;
    randf(l, (size_t)R * V, 1.0f + (float)(trial % 4) * 2.0f);
    for (int r = 0; r < R; r++) {
      if (trial & 1) l[(size_t)r * V + 7] = l[(size_t)r * V + 9] = 20.0f; // a tie at the top
      const uint64_t u = ll_test_rand(&rs) >> 11;
      static const float temps[] = {0.0f, 0.3f, 0.8f, 1.5f}, tops[] = {1.0f, 0.95f, 0.5f}, mins[] = {0.0f, 0.05f, 0.2f};
      static const int ks[] = {1, 5, 40, 64};
      const float mp = mins[ll_test_rand(&rs) % 3];
      d[r] = (struct ll_sample_dev){temps[ll_test_rand(&rs) % 4], tops[ll_test_rand(&rs) % 3], mp, mp > 0 ? logf(mp) : 0.0f,
                                    ks[ll_test_rand(&rs) % 4], (uint32_t)(u >> 32), (uint32_t)u, 1.0f, 0.0f, 0.0f, 0, NULL};
      if (trial >= 20) { // penalties: up to 24 distinct tokens (the tied top pair among them), counts 1 .. 4
        static const float reps[] = {1.0f, 1.1f, 1.5f}, freqs[] = {0.0f, 0.1f}, pres[] = {0.0f, 0.5f};
        int32_t *pl = pen + (size_t)r * 48;
        const int n = 1 + (int)(ll_test_rand(&rs) % 24);
        for (int j = 0; j < n; j++) pl[2 * j] = j < 2 ? 7 + 2 * j : (int32_t)(10 + j * 37 % (V - 10)), pl[2 * j + 1] = 1 + (int32_t)(ll_test_rand(&rs) % 4);
        for (int j = 2; j < n; j++) // distinct: 37 is prime to V - 10 (990, 30)
          for (int m = 0; m < j; m++) CHECK(pl[2 * j] != pl[2 * m]);
        d[r].repeat_penalty = reps[ll_test_rand(&rs) % 3], d[r].frequency_penalty = freqs[ll_test_rand(&rs) % 2];
        d[r].presence_penalty = pres[ll_test_rand(&rs) % 2], d[r].n_pen = n, d[r].pen = pl;
      }
    }
    memcpy(l0, l, (size_t)R * V * 4);
    int32_t ids[8];
    struct ll_backend_info i0, i1;
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->sample(cl, ids, l, R, V, d) == 0);
    cl->i->get_info(cl, &i1);
    CHECK(i1.launches - i0.launches == 1 && i1.bytes_down - i0.bytes_down == R * 4);
    for (int r = 0; r < R; r++) {
      const int32_t want = ll_sample_dev_choose(&d[r], cand, l0 + (size_t)r * V, V); // penalties applied to the copy
      same += ids[r] == want, total++;
      if (d[r].n_pen) same_pen += ids[r] == want, total_pen++;
    }
  }
  printf("sample on the device: %d / %d ids as the host's (with penalties: %d / %d)\n", same, total, same_pen, total_pen);
  CHECKF(exact ? same == total : same >= total * 90 / 100, "sample: %d / %d ids as the host's", same, total);
  CHECKF(exact ? same_pen == total_pen : same_pen >= total_pen * 90 / 100, "sample with penalties: %d / %d ids as the host's", same_pen, total_pen);
  free(cand), free(l), free(l0);
}

static int64_t gemm_launches(struct ll_backend *b) {
  struct ll_backend_info in;
  b->i->get_info(b, &in);
  return in.gemm_launches;
}

// Products at T tokens: fmm_* below 8, fmmt_* below 32, from 32 on the GEMM tiles (llsrv_gemm.cl:
// 64 rows x 32 tokens a work-group) where the device takes them (gemm: asserted by their
// launch counter), else fmmt_*. The shapes are ragged against every tile: T = 19, 77 (2 tiles of
// 32 + 13), N = 70 (a tile of 64 + 6: the q, k, v launch's matrix 0 spans two blocks), 40 (gate,
// up: 32 rows of each a tile, + 8), K = 96, 160 (K % 64 == 32: a last chunk of one unit).
static void test_fast(struct ll_backend *cpu, struct ll_backend *cl, struct ll_backend *ref, int gemm) {
  struct ll_backend_info in;
  cl->i->get_info(cl, &in);
  CHECKF(strcmp(in.tier, "fast") == 0, "tier '%s'", in.tier);
  ref->i->get_info(ref, &in);
  CHECKF(strcmp(in.tier, "reference") == 0, "tier '%s'", in.tier);
  static const struct {
    int type, k;
  } cases[] = {{LL_TYPE_Q4_0, 160}, {LL_TYPE_Q4_1, 576}, {LL_TYPE_Q5_0, 160}, {LL_TYPE_Q5_1, 160}, {LL_TYPE_Q8_0, 576}, {LL_TYPE_Q4_K, 512},
               {LL_TYPE_Q5_K, 256}, {LL_TYPE_Q6_K, 768}, {LL_TYPE_F32, 96},  {LL_TYPE_F16, 96},   {LL_TYPE_BF16, 96}};
  static const int Ts[] = {1, 5, 19, 77};
  const int N[3] = {70, 40, 40};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int K = cases[ci].k, type = cases[ci].type;
    const int fl = type == LL_TYPE_F32 || type == LL_TYPE_F16 || type == LL_TYPE_BF16;
    void *wd[3];
    struct ll_weight w[3];
    for (int i = 0; i < 3; i++) {
      wd[i] = make_weight(type, K, N[i]);
      w[i] = (struct ll_weight){type, K, N[i], wd[i], NULL, NULL};
    }
    CHECK(cl->i->weight_upload(cl, &w[0]) == 0); // w[1], w[2] staged per call
    double worst_mm = 0, worst_fused = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
      const int T = Ts[ti];
      float *x = malloc((size_t)T * K * 4), *g = malloc((size_t)K * 4), *xn = malloc((size_t)T * K * 4);
      float *a[3], *b[3];
      for (int i = 0; i < 3; i++) a[i] = malloc((size_t)T * N[i] * 4), b[i] = malloc((size_t)T * N[i] * 4);
      randf(x, (size_t)T * K, 2.0f), randf(g, (size_t)K, 1.0f);
      // matmul (= and +=): one launch
      for (int acc = 0; acc < 2; acc++) {
        randf(a[0], (size_t)T * N[0], 1.0f);
        memcpy(b[0], a[0], (size_t)T * N[0] * 4);
        CHECK(cpu->i->matmul(cpu, a[0], x, &w[0], T, acc) == 0);
        const int64_t l0 = launches(cl), g0 = gemm_launches(cl);
        CHECK(cl->i->matmul(cl, b[0], x, &w[0], T, acc) == 0);
        CHECKF(launches(cl) - l0 == 1, "fast matmul: %lld launches", (long long)(launches(cl) - l0));
        CHECKF(gemm_launches(cl) - g0 == (gemm && T >= 32), "fast matmul T=%d: %lld GEMM tiles", T, (long long)(gemm_launches(cl) - g0));
        const double e = nmse(b[0], a[0], (size_t)T * N[0]);
        CHECKF(e < (fl && T >= 32 ? 3e-5 : 1e-9), "fast matmul %s K=%d T=%d acc=%d: nmse %.3g", ll_type_name(type), K, T, acc, e);
        worst_mm = e > worst_mm ? e : worst_mm;
      }
      // rmsnorm fused into three products (q, k, v), one launch
      CHECK(cpu->i->rmsnorm(cpu, xn, x, g, T, K, 1e-5f) == 0);
      for (int i = 0; i < 3; i++) CHECK(cpu->i->matmul(cpu, a[i], xn, &w[i], T, 0) == 0);
      const double tol = 1e-4;
      const struct ll_weight *const w3[3] = {&w[0], &w[1], &w[2]};
      float *const b3[3] = {b[0], b[1], b[2]};
      int64_t l0 = launches(cl), g0 = gemm_launches(cl);
      CHECK(cl->i->fused_matmul(cl, 3, b3, x, g, 1e-5f, w3, T, LL_FUSE_SET) == 0);
      CHECK(launches(cl) - l0 == 1 && gemm_launches(cl) - g0 == (gemm && T >= 32));
      for (int i = 0; i < 3; i++) {
        const double e = nmse(b[i], a[i], (size_t)T * N[i]);
        CHECKF(e < tol, "fused rmsnorm + product %s K=%d T=%d matrix %d: nmse %.3g", ll_type_name(type), K, T, i, e);
        worst_fused = e > worst_fused ? e : worst_fused;
      }
      // gate, up and SwiGLU (w[1], w[2]: one shape), one launch
      CHECK(cpu->i->swiglu(cpu, a[1], a[1], a[2], (int64_t)T * N[1]) == 0);
      const struct ll_weight *const w2[2] = {&w[1], &w[2]};
      float *const b2[2] = {b[1], b[2]};
      l0 = launches(cl), g0 = gemm_launches(cl);
      CHECK(cl->i->fused_matmul(cl, 2, b2, x, g, 1e-5f, w2, T, LL_FUSE_SWIGLU) == 0);
      CHECK(launches(cl) - l0 == 1 && gemm_launches(cl) - g0 == (gemm && T >= 32));
      const double es = nmse(b[1], a[1], (size_t)T * N[1]);
      CHECKF(es < tol, "fused gate, up, swiglu %s K=%d T=%d: nmse %.3g", ll_type_name(type), K, T, es);
      worst_fused = es > worst_fused ? es : worst_fused;
      // mixed shapes or types are not fused: the engine composes them
      const struct ll_weight *const wbad[2] = {&w[0], &w[1]};
      CHECK(cl->i->fused_matmul(cl, 2, b2, x, g, 1e-5f, wbad, T, LL_FUSE_SWIGLU) == LL_EINVAL);
      CHECK(ref->i->fused_matmul(ref, 2, b2, x, g, 1e-5f, w2, T, LL_FUSE_SWIGLU) == LL_EUNSUPPORTED);
      free(x), free(g), free(xn);
      for (int i = 0; i < 3; i++) free(a[i]), free(b[i]);
    }
    cl->i->weight_release(cl, &w[0]);
    for (int i = 0; i < 3; i++) free(wd[i]);
    printf("fast tier %-5s: worst nmse product %.3g, fused %.3g\n", ll_type_name(type), worst_mm, worst_fused);
  }
  { // kernel arguments set once: a product repeated on the same resident buffers sets none again
    const int K = 256, NR = 40;
    void *wd = make_weight(LL_TYPE_Q4_1, K, NR);
    struct ll_weight w = {LL_TYPE_Q4_1, K, NR, wd, NULL, NULL};
    float *x = cl->i->alloc(cl, (size_t)K * 4), *o = cl->i->alloc(cl, (size_t)NR * 4), *g = malloc((size_t)K * 4), *h = malloc((size_t)K * 4);
    randf(h, (size_t)K, 1.0f), randf(g, (size_t)K, 1.0f);
    CHECK(x && o && cl->i->weight_upload(cl, &w) == 0 && cl->i->copy(cl, x, h, (size_t)K * 4) == 0);
    const struct ll_weight *const w1[1] = {&w};
    float *const o1[1] = {o};
    struct ll_backend_info i0, i1, i2;
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->fused_matmul(cl, 1, o1, x, g, 1e-5f, w1, 1, LL_FUSE_ADD) == 0);
    cl->i->get_info(cl, &i1);
    CHECK(cl->i->fused_matmul(cl, 1, o1, x, g, 1e-5f, w1, 1, LL_FUSE_ADD) == 0);
    cl->i->get_info(cl, &i2);
    CHECKF(i1.arg_sets - i0.arg_sets == 17 && i2.arg_sets == i1.arg_sets && i2.launches - i1.launches == 1,
           "arguments set: %lld, then %lld", (long long)(i1.arg_sets - i0.arg_sets), (long long)(i2.arg_sets - i1.arg_sets));
    cl->i->weight_release(cl, &w);
    cl->i->free_buf(cl, x), cl->i->free_buf(cl, o);
    free(wd), free(g), free(h);
  }
  // RoPE with the KV store (two sequences, f16 and f32 caches, normal and neox, partial
  // rotation with LongRoPE's factors and attention factor) against rope + kv_store, read back
  // through attention on both.
  for (int v = 0; v < 4; v++) {
    const int f16 = v & 1, H = 4, Hkv = 2, hd = 20, block = 16, nblk = 6, kvd = Hkv * hd, T = 4;
    static const float lr_ff[8] = {1, 1.25f, 2, 3.5f, 6, 11, 23, 40};
    struct ll_rope_params rp = {(v & 2) ? LL_ROPE_NEOX : LL_ROPE_NORMAL, (v & 2) ? 16 : 20, 10000.0f, 1.0f, (v & 2) ? lr_ff : NULL, (v & 2) ? 1.1547005f : 1.0f};
    const size_t pool = (size_t)nblk * block * kvd * (f16 ? 2 : 4);
    void *kc = calloc(1, pool), *vc = calloc(1, pool), *kd = calloc(1, pool), *vd = calloc(1, pool);
    int32_t tabs[2][3] = {{4, 1, 0}, {2, 5, 3}};
    const int t0[2] = {0, 3}, nt[2] = {3, 1};
    int32_t pos[4] = {0, 1, 2, 20};
    struct ll_kv_view vcpu[2], vcl[2];
    for (int s2 = 0; s2 < 2; s2++) {
      vcpu[s2] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kc, vc, tabs[s2], 0};
      vcl[s2] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kd, vd, tabs[s2], 0};
    }
    float *q = malloc(T * H * hd * 4), *k = malloc(T * kvd * 4), *vv = malloc(T * kvd * 4), *q2 = malloc(T * H * hd * 4);
    float *k2 = malloc(T * kvd * 4), *oa = malloc(T * H * hd * 4), *ob = malloc(T * H * hd * 4);
    randf(q, T * H * hd, 1.0f), randf(k, T * kvd, 1.0f), randf(vv, T * kvd, 1.0f);
    memcpy(q2, q, T * H * hd * 4), memcpy(k2, k, T * kvd * 4);
    { // positions 0 .. 19 of sequence 1 first (kv_store on both): its token at 20 attends to them
      float *k0 = malloc(20 * kvd * 4), *v0 = malloc(20 * kvd * 4);
      int32_t p0[20];
      for (int t = 0; t < 20; t++) p0[t] = t;
      randf(k0, 20 * kvd, 1.0f), randf(v0, 20 * kvd, 1.0f);
      CHECK(cpu->i->kv_store(cpu, &vcpu[1], k0, v0, p0, 20) == 0 && cl->i->kv_store(cl, &vcl[1], k0, v0, p0, 20) == 0);
      free(k0), free(v0);
    }
    CHECK(cpu->i->rope(cpu, q, pos, T, H, hd, &rp) == 0 && cpu->i->rope(cpu, k, pos, T, Hkv, hd, &rp) == 0);
    for (int s2 = 0; s2 < 2; s2++) CHECK(cpu->i->kv_store(cpu, &vcpu[s2], k + t0[s2] * kvd, vv + t0[s2] * kvd, pos + t0[s2], nt[s2]) == 0);
    const int64_t l0 = launches(cl);
    CHECK(cl->i->rope_kv_store(cl, q2, k2, vv, vcl, pos, t0, nt, 2, H, &rp) == 0);
    CHECK(launches(cl) - l0 == 1);
    CHECKF(nmse(q2, q, T * H * hd) < 1e-12, "rope_kv_store variant %d: q nmse %.3g", v, nmse(q2, q, T * H * hd));
    const float scale = 1.0f / sqrtf((float)hd);
    CHECK(cpu->i->attention_multi(cpu, oa, q, vcpu, pos, t0, nt, 2, H, scale) == 0);
    CHECK(cl->i->attention_multi(cl, ob, q, vcl, pos, t0, nt, 2, H, scale) == 0);
    const double e = nmse(ob, oa, (size_t)T * H * hd);
    CHECKF(e < (f16 ? FAST_ATT_TOL_F16 : FAST_ATT_TOL_F32), "rope_kv_store variant %d: attention over the stored cache: nmse %.3g", v, e);
    free(q), free(k), free(vv), free(q2), free(k2), free(oa), free(ob), free(kc), free(vc), free(kd), free(vd);
  }
  test_fast_attention(cpu, cl);
  test_sample(cl);
  test_sample(ref);
  // argmax on both tiers: the lowest id among equal maxima, -inf rows give 0, 4 bytes per row back
  {
    const int R = 3, V = 1000;
    float *l = malloc((size_t)R * V * 4);
    randf(l, (size_t)R * V, 5.0f);
    l[0 * V + 700] = 9, l[0 * V + 300] = 9, l[0 * V + 999] = 9; // ties: 300
    l[1 * V + 999] = 10;
    for (int i = 0; i < V; i++) l[2 * V + i] = -INFINITY;
    struct ll_backend *bs[2] = {cl, ref};
    for (int bi = 0; bi < 2; bi++) {
      int32_t ids[3] = {-1, -1, -1};
      struct ll_backend_info i0, i1;
      bs[bi]->i->get_info(bs[bi], &i0);
      CHECK(bs[bi]->i->argmax(bs[bi], ids, l, R, V) == 0);
      bs[bi]->i->get_info(bs[bi], &i1);
      CHECKF(ids[0] == 300 && ids[1] == 999 && ids[2] == 0, "argmax: %d %d %d", ids[0], ids[1], ids[2]);
      CHECK(i1.bytes_down - i0.bytes_down == R * 4 && i1.launches - i0.launches == 1);
    }
    free(l);
  }
}

int main(void) {
  rs = ll_test_seed();
  // Which device: decided in a child so that this process has not touched OpenCL before the
  // device-choice children set their environments.
  int fd[2];
  if (pipe(fd) == 0) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      int found = find_device();
      if (found && write(fd[1], dev_name, strlen(dev_name)) < 0) found = 0;
      _exit(found ? 0 : 1);
    }
    close(fd[1]);
    char buf[32] = "";
    ssize_t n = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0 && n > 0)) {
      fprintf(stderr, "test_opencl: no OpenCL device to test (install pocl-opencl-icd, or set LL_TEST_OPENCL_DEVICE)\n");
      CHECK(0);
      return ll_test_summary();
    }
    buf[n] = 0;
    snprintf(dev_name, sizeof dev_name, "%s", buf);
  }
  printf("testing on %s\n", dev_name);
  test_choice();

  struct ll_backend *cpu = NULL, *cl = NULL;
  char err[512], reason[512];
  CHECK(ll_backend_cpu_create(&cpu, 1, err, sizeof err) == 0);
  char cache[] = "/tmp/ll_ocl_cache_XXXXXX";
  CHECK(mkdtemp(cache) != NULL);
  // Binaries of earlier kernels and drivers (a day old) and a killed writer's temp file: the
  // store of a new binary prunes the cache to its newest 8 and removes the temp file.
  char old_bin[600];
  for (int i = 0; i < 10; i++) {
    snprintf(old_bin, sizeof old_bin, "%s/opencl-%016x.bin", cache, i);
    FILE *f = fopen(old_bin, "w");
    if (f) fputs("stale", f), fclose(f);
    struct timespec ts[2] = {{time(NULL) - 86400 + i, 0}, {time(NULL) - 86400 + i, 0}};
    utimensat(AT_FDCWD, old_bin, ts, 0);
  }
  snprintf(old_bin, sizeof old_bin, "%s/opencl-%016x.bin.tmp.Ab12Cd", cache, 3);
  FILE *tf = fopen(old_bin, "w");
  if (tf) fclose(tf);
  struct ll_backend_params p = {1, dev_name, cache};
  // The default tier: reference on a CPU device, fast on a GPU (LL_OPENCL_REFERENCE unset).
  unsetenv("LL_OPENCL_REFERENCE");
  CHECK(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0);
  {
    int bins = 0, oldest_left = 0;
    DIR *d = opendir(cache);
    for (struct dirent *e; d && (e = readdir(d));) {
      size_t l = strlen(e->d_name);
      bins += l > 4 && !strcmp(e->d_name + l - 4, ".bin");
      oldest_left |= !strcmp(e->d_name, "opencl-0000000000000000.bin");
    }
    if (d) closedir(d);
    CHECKF(bins == 8 && !oldest_left && access(old_bin, F_OK) != 0, "binary cache pruned to 8 (%d), oldest gone (%d), dead temp gone",
           bins, !oldest_left);
  }
  if (cl && strncmp(reason, "opencl:", 7) == 0) {
    struct ll_backend_info in;
    cl->i->get_info(cl, &in);
    printf("default tier: %s\n", in.tier);
    CHECK(strcmp(in.tier, cpu_device(in.cl_platform, in.cl_device) ? "reference" : "fast") == 0);
    CHECK(strstr(reason, "kernels built") != NULL);
  }
  ll_backend_free(cl);
  cl = NULL;
  // Everything below on the reference tier, except test_fast's instances.
  setenv("LL_OPENCL_REFERENCE", "1", 1);
  CHECK(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0);
  printf("%s\n", reason);
  if (!cl || strncmp(reason, "opencl:", 7) != 0) {
    CHECK(0);
    ll_backend_free(cl), ll_backend_free(cpu);
    return ll_test_summary();
  }
  cpu->ggml_math = cl->ggml_math = 1;
  test_info(cl);
  test_matmul(cpu, cl);
  test_elementwise(cpu, cl);
  test_attention(cpu, cl);
  ref_i = ll_cpu_train_ref();
  test_matmul_backward(cl);
  test_train_ops(cl);
  test_resident(cl);
  { // the fast tier on this device (LL_OPENCL_REFERENCE=0), beside the reference one
    struct ll_backend *fast = NULL;
    setenv("LL_OPENCL_REFERENCE", "0", 1);
    CHECK(ll_backend_create(&fast, &p, reason, sizeof reason, err, sizeof err) == 0);
    setenv("LL_OPENCL_REFERENCE", "1", 1);
    if (fast && strncmp(reason, "opencl:", 7) == 0) {
      fast->ggml_math = 1;
      test_fast(cpu, fast, cl, 1);
    } else {
      CHECK(0);
    }
    ll_backend_free(fast);
  }
  // The second start loads the program from the binary cache; while the first instance is
  // still open, as the server's trainer opens one beside the serving one.
  struct ll_backend *cl2 = NULL;
  CHECK(ll_backend_create(&cl2, &p, reason, sizeof reason, err, sizeof err) == 0);
  printf("%s\n", reason);
  CHECK(strstr(reason, "from the binary cache") != NULL);
  if (cl2 && strncmp(reason, "opencl:", 7) == 0) test_two_instances(cl, cl2);
  else CHECK(0);
  ll_backend_free(cl2);
  ll_backend_free(cl);
  // Again with the kernels built as for a device without f64 (LL_OPENCL_NO_FP64): the f32
  // fallbacks of the f64 sums, divisions and square roots, against the tolerances.
  setenv("LL_OPENCL_NO_FP64", "1", 1);
  cl = NULL;
  CHECK(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0);
  printf("without f64: %s\n", reason);
  CHECK(strstr(reason, "kernels built") != NULL); // the build options are in the cache key
  if (cl && strncmp(reason, "opencl:", 7) == 0) {
    struct ll_backend_info in;
    cl->i->get_info(cl, &in);
    CHECK(in.fp64 == 0);
    exact = 0;
    cl->ggml_math = 1;
    test_matmul(cpu, cl);
    test_elementwise(cpu, cl);
    test_attention(cpu, cl);
    test_matmul_backward(cl);
    test_train_ops(cl);
    test_resident(cl);
    struct ll_backend *fast = NULL;
    setenv("LL_OPENCL_REFERENCE", "0", 1);
    setenv("LL_OPENCL_FAULT", "nogemm", 1); // as a device whose limits refuse the GEMM tiles
    CHECK(ll_backend_create(&fast, &p, reason, sizeof reason, err, sizeof err) == 0);
    unsetenv("LL_OPENCL_FAULT");
    setenv("LL_OPENCL_REFERENCE", "1", 1);
    if (fast && strncmp(reason, "opencl:", 7) == 0) {
      fast->ggml_math = 1;
      test_fast(cpu, fast, cl, 0);
    } else {
      CHECK(0);
    }
    ll_backend_free(fast);
  } else {
    CHECK(0);
  }
  ll_backend_free(cl);
  unsetenv("LL_OPENCL_NO_FP64");
  // A training op whose operands do not fit the device (capped at 8 MB) fails with LL_ENOMEM
  // before the driver is asked, and the backend goes on working.
  setenv("LL_OPENCL_MEM_LIMIT", "8000000", 1);
  cl = NULL;
  CHECK(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0);
  if (cl && strncmp(reason, "opencl:", 7) == 0) {
    const int S = 600, H = 8, hd = 8; // att (H, S, S): 11.5 MB
    float *q = calloc((size_t)S * H * hd, 4), *o = malloc((size_t)S * H * hd * 4), *att = malloc((size_t)H * S * S * 4);
    const int rc = cl->i->attention_train(cl, o, att, q, q, q, S, H, H, hd, 0.35f);
    CHECKF(rc == LL_ENOMEM, "attention_train over the memory limit: %d", rc);
    float a[3] = {1, 2, 3}, x[3] = {1, 1, 1};
    CHECK(cl->i->axpy(cl, a, x, 2.0f, 3) == 0 && a[0] == 3 && a[1] == 4 && a[2] == 5);
    free(q), free(o), free(att);
  } else {
    CHECK(0);
  }
  ll_backend_free(cl);
  unsetenv("LL_OPENCL_MEM_LIMIT");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  CHECK(system(cmd) == 0);
  ll_backend_free(cpu);
  return ll_test_summary();
}
