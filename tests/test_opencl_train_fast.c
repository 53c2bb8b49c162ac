// test_opencl_train_fast.c - the OpenCL fast tier's training kernels (kernels/opencl/
// train_fast.cl, issue 30) against the CPU's scalar references (kernels/cpu/train_ref.c), on the
// device named by $LL_TEST_OPENCL_DEVICE (default opencl:0:0: PoCL in CI), with
// LL_OPENCL_REFERENCE=0 so the fast tier runs whatever the device's default.
//
// The tiled products sum in tile order with mad, not in the reference's order: asserted within
// normalized MSE 1e-10 (f32 sums of <= 1100 terms land near 1e-13 .. 1e-12; a wrong tile, edge
// or stride gives > 1e-3), for weights of every type the backend takes, shapes not multiples
// of 16 (edge tiles), T = 1 .. 37, dx and dw together, and dx through several dequantized
// chunks of W; the same tolerance for attention's forward (out and the kept probabilities) and
// backward (dq, dk, dv), batched over heads with grouped kv heads; the backward never reads the
// probabilities right of the causal diagonal (NaN there, results finite: the masked tiles are
// skipped); dx through quantized W in one launch per product (tiles dequantized in local
// memory); the fused LoRA forward (matmul_lora, two launches) against a double-precision
// product of the dequantized weights; AdamW over a whole arena in one launch (adamw_split); the
// flash-style attention (train_flash.cl: lse kept, P recomputed per tile) against the references,
// windows included. Each counts its launches (ll_backend_info.
// train_fast_launches). Also asserted: the backend says it runs the fast tier (ll_backend_info.tier), and
// the results are not the reference's bits (the reference tier's products give the CPU's bits
// on an f64 device such as PoCL: an error of exactly 0 everywhere would mean they ran).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_error.h"
#include "ll_cpu_train.h"
#include "ll_quant.h"
#include "testutil.h"

#define TOL 1e-10

static uint64_t rs;

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
// random bytes with sane fp16 scales.
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
    randf(f, (size_t)k, 0.1f);
    ll_quantize_row(type, f, w + (size_t)r * rsz, k);
  }
  free(f);
  return w;
}

static double worst_dx, worst_dw;

static void test_matmul_backward(struct ll_backend *cl) {
  const struct ll_backend_i *ref = ll_cpu_train_ref();
  static const struct {
    int type, k, n;
  } cases[] = {{LL_TYPE_Q4_0, 160, 37}, {LL_TYPE_Q4_1, 160, 37}, {LL_TYPE_Q5_0, 160, 37}, {LL_TYPE_Q5_1, 160, 37},
               {LL_TYPE_Q8_0, 160, 37}, {LL_TYPE_Q4_K, 256, 37}, {LL_TYPE_Q5_K, 256, 37}, {LL_TYPE_Q6_K, 256, 37},
               {LL_TYPE_F32, 77, 37},   {LL_TYPE_F16, 77, 37},   {LL_TYPE_BF16, 77, 37},
               {LL_TYPE_F32, 576, 16}, // LoRA A's shape (r x in): dw of few rows
               {LL_TYPE_F32, 16, 200}, // LoRA B's shape (out x r)
               // 1100 rows of 2080: two chunks of the dequantized scratch (8 MiB each)
               {LL_TYPE_Q4_0, 2080, 1100}};
  static const int Ts[] = {1, 5, 37};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int K = cases[ci].k, N = cases[ci].n, type = cases[ci].type;
    void *wd = make_weight(type, K, N);
    struct ll_weight w = {type, K, N, wd, NULL, NULL}, wc = w;
    CHECK(cl->i->weight_upload(cl, &w) == 0);
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
      const int T = Ts[ti];
      const size_t nx = (size_t)T * K, nw = (size_t)N * K;
      float *dout = malloc((size_t)T * N * 4), *x = malloc(nx * 4), *a = malloc(nx * 4), *b = malloc(nx * 4);
      float *ga = malloc(nw * 4), *gb = malloc(nw * 4);
      randf(dout, (size_t)T * N, 1.0f), randf(x, nx, 1.0f), randf(a, nx, 1.0f), randf(ga, nw, 1.0f);
      memcpy(b, a, nx * 4), memcpy(gb, ga, nw * 4); // dx and dw accumulate
      const int f32 = type == LL_TYPE_F32;
      CHECK(ref->matmul_backward(NULL, a, f32 ? ga : NULL, dout, x, &wc, T) == 0);
      struct ll_backend_info i0, i1;
      cl->i->get_info(cl, &i0);
      CHECK(cl->i->matmul_backward(cl, b, f32 ? gb : NULL, dout, x, &w, T) == 0);
      cl->i->get_info(cl, &i1);
      // one tiled launch for dx (a quantized or f16/bf16 W's tiles dequantized in local memory,
      // no deq_rows pass), one more for dw
      const int64_t want = f32 ? 2 : 1;
      CHECKF(i1.launches - i0.launches == want && i1.train_fast_launches - i0.train_fast_launches == want,
             "matmul_backward %s: %lld launches, %lld of train_fast.cl (want %lld)", ll_type_name(type), (long long)(i1.launches - i0.launches),
             (long long)(i1.train_fast_launches - i0.train_fast_launches), (long long)want);
      const double e = nmse(b, a, nx);
      CHECKF(e < TOL, "matmul_backward dx %s K=%d N=%d T=%d: nmse %.3g", ll_type_name(type), K, N, T, e);
      if (e > worst_dx) worst_dx = e;
      if (f32) {
        const double ew = nmse(gb, ga, nw);
        CHECKF(ew < TOL, "matmul_backward dw K=%d N=%d T=%d: nmse %.3g", K, N, T, ew);
        if (ew > worst_dw) worst_dw = ew;
      }
      free(dout), free(x), free(a), free(b), free(ga), free(gb);
    }
    cl->i->weight_release(cl, &w);
    free(wd);
  }
  // a training batch's shape: dx and dw of T = 256 through a 576 x 576 F32 weight
  {
    const int T = 256, K = 576, N = 576;
    void *wd = make_weight(LL_TYPE_F32, K, N);
    struct ll_weight w = {LL_TYPE_F32, K, N, wd, NULL, NULL}, wc = w;
    CHECK(cl->i->weight_upload(cl, &w) == 0);
    const size_t nx = (size_t)T * K, nw = (size_t)N * K;
    float *dout = malloc((size_t)T * N * 4), *x = malloc(nx * 4), *a = calloc(nx, 4), *b = calloc(nx, 4), *ga = calloc(nw, 4), *gb = calloc(nw, 4);
    randf(dout, (size_t)T * N, 1.0f), randf(x, nx, 1.0f);
    CHECK(ref->matmul_backward(NULL, a, ga, dout, x, &wc, T) == 0);
    CHECK(cl->i->matmul_backward(cl, b, gb, dout, x, &w, T) == 0);
    const double e = nmse(b, a, nx), ew = nmse(gb, ga, nw);
    CHECKF(e < TOL && ew < TOL, "matmul_backward T=256 576x576: dx nmse %.3g, dw %.3g", e, ew);
    if (e > worst_dx) worst_dx = e;
    if (ew > worst_dw) worst_dw = ew;
    cl->i->weight_release(cl, &w);
    free(wd), free(dout), free(x), free(a), free(b), free(ga), free(gb);
  }
  CHECKF(worst_dx > 0 && worst_dw > 0, "the tiled products ran (dx %.3g, dw %.3g: 0 is the reference tier's bits)", worst_dx, worst_dw);
  printf("matmul_backward, fast tier vs the CPU's reference: worst nmse dx %.3g, dw %.3g (tolerance %.0e)\n", worst_dx, worst_dw, TOL);
}

// Causal attention forward (out, the probabilities kept) and backward (dq, dk, dv) against the
// references: grouped kv heads, S and hd not multiples of 16, S over one 64-wide row reduction.
static void test_attention(struct ll_backend *cl) {
  static const struct {
    int S, H, Hkv, hd;
  } cases[] = {{1, 2, 1, 8}, {37, 4, 2, 20}, {70, 6, 2, 16}, {129, 3, 3, 64}};
  double worst[5] = {0};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int S = cases[ci].S, H = cases[ci].H, Hkv = cases[ci].Hkv, hd = cases[ci].hd;
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *o[2], *att[2], *dq[2], *dk[2], *dv[2];
    randf(q, nq, 2.0f), randf(k, nk, 2.0f), randf(v, nk, 1.0f), randf(dout, nq, 1.0f);
    for (int i = 0; i < 2; i++) {
      o[i] = malloc(nq * 4), att[i] = malloc(na * 4), dq[i] = malloc(nq * 4), dk[i] = malloc(nk * 4), dv[i] = malloc(nk * 4);
      memset(att[i], 0x7f, na * 4); // garbage the op must overwrite (right of the diagonal too)
    }
    CHECK(ll_train_ref_attention_train(NULL, o[0], att[0], q, k, v, S, H, Hkv, hd, scale) == 0);
    CHECK(cl->i->attention_train(cl, o[1], att[1], q, k, v, S, H, Hkv, hd, scale) == 0);
    // NaN right of the diagonal: the reference never reads there, nor may the fast tier's
    // products (the masked tiles skipped, the diagonal tiles' masked elements loaded as 0)
    float *attp = malloc(na * 4);
    memcpy(attp, att[0], na * 4);
    for (int h = 0; h < H; h++)
      for (int i = 0; i < S; i++)
        for (int j = i + 1; j < S; j++) attp[((size_t)h * S + i) * S + j] = NAN;
    CHECK(ll_train_ref_attention_backward(NULL, dq[0], dk[0], dv[0], dout, q, k, v, attp, S, H, Hkv, hd, scale) == 0);
    struct ll_backend_info i0, i1;
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->attention_backward(cl, dq[1], dk[1], dv[1], dout, q, k, v, attp, S, H, Hkv, hd, scale) == 0);
    free(attp);
    cl->i->get_info(cl, &i1);
    const int64_t want = 3 + 2 * (H / Hkv); // dp, the rows' ds, dq; dv and dk per query head of a group
    CHECKF(i1.train_fast_launches - i0.train_fast_launches == want && i1.launches - i0.launches == want,
           "attention_backward: %lld launches, %lld of train_fast.cl (want %lld)", (long long)(i1.launches - i0.launches),
           (long long)(i1.train_fast_launches - i0.train_fast_launches), (long long)want);
    const double e[5] = {nmse(o[1], o[0], nq), nmse(att[1], att[0], na), nmse(dq[1], dq[0], nq), nmse(dk[1], dk[0], nk), nmse(dv[1], dv[0], nk)};
    CHECKF(e[0] < TOL && e[1] < TOL && e[2] < TOL && e[3] < TOL && e[4] < TOL,
           "attention S=%d H=%d/%d hd=%d: nmse out %.3g att %.3g dq %.3g dk %.3g dv %.3g", S, H, Hkv, hd, e[0], e[1], e[2], e[3], e[4]);
    for (int i = 0; i < 5; i++) worst[i] = e[i] > worst[i] ? e[i] : worst[i];
    for (int i = 0; i < 2; i++) free(o[i]), free(att[i]), free(dq[i]), free(dk[i]), free(dv[i]);
    free(q), free(k), free(v), free(dout);
  }
  printf("attention, fast tier vs the CPU's reference: worst nmse out %.3g att %.3g dq %.3g dk %.3g dv %.3g (tolerance %.0e)\n", worst[0],
         worst[1], worst[2], worst[3], worst[4], TOL);
}

// Gemma 3's local layers: attention_train_swa (scores and P·V as the causal case's batched tiled
// products, attn_rows_softmax with the window between them) against the reference, windows
// shorter than S (1, 17, 64) and one of S (the causal results), the same tolerance; the
// probabilities outside each row's window written 0; three launches per call, all counted as
// the fast tier's (two products and the row softmax: not the reference kernel's one); and the backward
// (attention_backward, reading the window from att's zeros) against the reference's.
static void test_attention_window(struct ll_backend *cl) {
  static const struct {
    int S, H, Hkv, hd, window;
  } cases[] = {{37, 4, 2, 20, 1}, {70, 6, 2, 16, 17}, {129, 4, 1, 32, 64}, {40, 2, 2, 8, 40}};
  double worst[5] = {0};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int S = cases[ci].S, H = cases[ci].H, Hkv = cases[ci].Hkv, hd = cases[ci].hd, W = cases[ci].window;
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *o[2], *att[2], *dq[2], *dk[2], *dv[2];
    randf(q, nq, 2.0f), randf(k, nk, 2.0f), randf(v, nk, 1.0f), randf(dout, nq, 1.0f);
    for (int i = 0; i < 2; i++) {
      o[i] = malloc(nq * 4), att[i] = malloc(na * 4), dq[i] = malloc(nq * 4), dk[i] = malloc(nk * 4), dv[i] = malloc(nk * 4);
      memset(att[i], 0x7f, na * 4); // garbage the op must overwrite (outside the window too)
    }
    struct ll_backend_info i0, i1;
    CHECK(ll_train_ref_attention_train_swa(NULL, o[0], att[0], q, k, v, S, H, Hkv, hd, scale, W) == 0);
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->attention_train_swa && cl->i->attention_train_swa(cl, o[1], att[1], q, k, v, S, H, Hkv, hd, scale, W) == 0);
    cl->i->get_info(cl, &i1);
    CHECK(ll_train_ref_attention_backward(NULL, dq[0], dk[0], dv[0], dout, q, k, v, att[0], S, H, Hkv, hd, scale) == 0);
    CHECK(cl->i->attention_backward(cl, dq[1], dk[1], dv[1], dout, q, k, v, att[1], S, H, Hkv, hd, scale) == 0);
    const double e[5] = {nmse(o[1], o[0], nq), nmse(att[1], att[0], na), nmse(dq[1], dq[0], nq), nmse(dk[1], dk[0], nk), nmse(dv[1], dv[0], nk)};
    int outside_zero = 1;
    for (int h = 0; h < H; h++)
      for (int i = 0; i < S; i++)
        for (int j = 0; j < S; j++) outside_zero &= (j > i || j <= i - W) ? att[1][((size_t)h * S + i) * S + j] == 0.0f : 1;
    CHECKF(e[0] < TOL && e[1] < TOL && e[2] < TOL && e[3] < TOL && e[4] < TOL && outside_zero,
           "attention window %d S=%d H=%d/%d hd=%d: nmse out %.3g att %.3g dq %.3g dk %.3g dv %.3g, zeros outside %d", W, S, H, Hkv, hd, e[0], e[1],
           e[2], e[3], e[4], outside_zero);
    CHECKF(i1.launches - i0.launches == 3 && i1.train_fast_launches - i0.train_fast_launches == 3,
           "attention_train_swa: %lld launches, %lld of the fast tier's (the tiled path makes 3)", (long long)(i1.launches - i0.launches),
           (long long)(i1.train_fast_launches - i0.train_fast_launches));
    for (int i = 0; i < 5; i++) worst[i] = e[i] > worst[i] ? e[i] : worst[i];
    for (int i = 0; i < 2; i++) free(o[i]), free(att[i]), free(dq[i]), free(dk[i]), free(dv[i]);
    free(q), free(k), free(v), free(dout);
  }
  CHECKF(worst[0] > 0, "the tiled products ran (out nmse %.3g: 0 is the reference's bits)", worst[0]);
  printf("windowed attention, fast tier vs the CPU's reference: worst nmse out %.3g att %.3g dq %.3g dk %.3g dv %.3g (tolerance %.0e)\n",
         worst[0], worst[1], worst[2], worst[3], worst[4], TOL);
}

// The flash-style members (train_flash.cl): out and lse from attention_train_flash, dq, dk, dv
// from attention_backward_flash (the probabilities recomputed from q, k and lse) against the
// references' attention_train_swa + attention_backward (which keep the probabilities), within
// TOL; lse against the logsumexp of the scaled scores in double. S not a multiple of the 16-wide
// tiles, grouped kv heads, windows 0 (causal), 1, 17, 70 and the widest head (256); one launch
// forward and two backward, all the fast tier's; S = 0 with no buffers answers 0 (the
// trainer's probe), a head past 256 LL_EUNSUPPORTED.
static void test_attention_flash(struct ll_backend *cl) {
  static const struct {
    int S, H, Hkv, hd, window;
  } cases[] = {{1, 2, 1, 8, 0}, {37, 4, 2, 20, 0}, {129, 3, 3, 64, 0}, {37, 4, 2, 20, 1}, {70, 6, 2, 16, 17},
               {150, 4, 1, 24, 70}, {45, 2, 1, 256, 17}, {33, 9, 3, 64, 0}};
  CHECK(cl->i->attention_train_flash && cl->i->attention_backward_flash);
  if (!cl->i->attention_train_flash || !cl->i->attention_backward_flash) return;
  CHECK(cl->i->attention_train_flash(cl, NULL, NULL, NULL, NULL, NULL, 0, 9, 3, 64, 0.125f, 0) == 0);
  CHECK(cl->i->attention_backward_flash(cl, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 9, 3, 64, 0.125f, 0) == 0);
  CHECK(cl->i->attention_train_flash(cl, NULL, NULL, NULL, NULL, NULL, 0, 2, 1, 512, 0.125f, 0) == LL_EUNSUPPORTED);
  CHECK(cl->i->attention_train_flash(cl, NULL, NULL, NULL, NULL, NULL, 0, 3, 2, 64, 0.125f, 0) == LL_EINVAL); // 3 heads over 2
  double worst[5] = {0};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int S = cases[ci].S, H = cases[ci].H, Hkv = cases[ci].Hkv, hd = cases[ci].hd, W = cases[ci].window;
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4), *att = malloc(na * 4);
    float *lse = malloc((size_t)H * S * 4), *lref = malloc((size_t)H * S * 4);
    float *o[2], *dq[2], *dk[2], *dv[2];
    randf(q, nq, 2.0f), randf(k, nk, 2.0f), randf(v, nk, 1.0f), randf(dout, nq, 1.0f);
    for (int i = 0; i < 2; i++) {
      o[i] = malloc(nq * 4), dq[i] = malloc(nq * 4), dk[i] = malloc(nk * 4), dv[i] = malloc(nk * 4);
      memset(o[i], 0x7f, nq * 4), memset(dq[i], 0x7f, nq * 4), memset(dk[i], 0x7f, nk * 4), memset(dv[i], 0x7f, nk * 4); // overwritten
    }
    memset(lse, 0x7f, (size_t)H * S * 4);
    for (int h = 0; h < H; h++) // lse in double: log Σ_j exp(scale q_i·k_j) over the keys row i sees
      for (int i = 0; i < S; i++) {
        const int lo = W > 0 && i + 1 > W ? i + 1 - W : 0, kh = h / (H / Hkv);
        double mx = -INFINITY, sc[150];
        for (int j = lo; j <= i; j++) {
          double d = 0;
          for (int e = 0; e < hd; e++) d += (double)q[((size_t)i * H + h) * hd + e] * k[((size_t)j * Hkv + kh) * hd + e];
          sc[j] = d * scale, mx = sc[j] > mx ? sc[j] : mx;
        }
        double sum = 0;
        for (int j = lo; j <= i; j++) sum += exp(sc[j] - mx);
        lref[(size_t)h * S + i] = (float)(mx + log(sum));
      }
    CHECK(ll_train_ref_attention_train_swa(NULL, o[0], att, q, k, v, S, H, Hkv, hd, scale, W) == 0);
    CHECK(ll_train_ref_attention_backward(NULL, dq[0], dk[0], dv[0], dout, q, k, v, att, S, H, Hkv, hd, scale) == 0);
    struct ll_backend_info i0, i1, i2;
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->attention_train_flash(cl, o[1], lse, q, k, v, S, H, Hkv, hd, scale, W) == 0);
    cl->i->get_info(cl, &i1);
    CHECK(cl->i->attention_backward_flash(cl, dq[1], dk[1], dv[1], dout, q, k, v, o[1], lse, S, H, Hkv, hd, scale, W) == 0);
    cl->i->get_info(cl, &i2);
    CHECKF(i1.launches - i0.launches == 1 && i1.train_fast_launches - i0.train_fast_launches == 1 && i2.launches - i1.launches == 2 &&
               i2.train_fast_launches - i1.train_fast_launches == 2,
           "flash attention: %lld + %lld launches, %lld + %lld of the fast tier's (want 1 + 2)", (long long)(i1.launches - i0.launches),
           (long long)(i2.launches - i1.launches), (long long)(i1.train_fast_launches - i0.train_fast_launches),
           (long long)(i2.train_fast_launches - i1.train_fast_launches));
    const double e[5] = {nmse(o[1], o[0], nq), nmse(lse, lref, (size_t)H * S), nmse(dq[1], dq[0], nq), nmse(dk[1], dk[0], nk), nmse(dv[1], dv[0], nk)};
    CHECKF(e[0] < TOL && e[1] < TOL && e[2] < TOL && e[3] < TOL && e[4] < TOL,
           "flash attention window %d S=%d H=%d/%d hd=%d: nmse out %.3g lse %.3g dq %.3g dk %.3g dv %.3g", W, S, H, Hkv, hd, e[0], e[1], e[2], e[3], e[4]);
    for (int i = 0; i < 5; i++) worst[i] = e[i] > worst[i] ? e[i] : worst[i];
    for (int i = 0; i < 2; i++) free(o[i]), free(dq[i]), free(dk[i]), free(dv[i]);
    free(q), free(k), free(v), free(dout), free(att), free(lse), free(lref);
  }
  CHECKF(worst[0] > 0 && worst[2] > 0, "the flash kernels ran (out nmse %.3g, dq %.3g: 0 would be the reference's bits)", worst[0], worst[2]);
  printf("flash attention, fast tier vs the CPU's reference: worst nmse out %.3g lse %.3g dq %.3g dk %.3g dv %.3g (tolerance %.0e)\n", worst[0],
         worst[1], worst[2], worst[3], worst[4], TOL);
}

// The fused LoRA forward: y (=, +=) x·Wᵀ + (scale xa·Aᵀ)·Bᵀ and axs against the same product
// in double of the dequantized weights (the CPU's matmul quantizes activations for quantized W;
// the fast tier does not, so the double product is the fair reference for both terms).
static void test_matmul_lora(struct ll_backend *cl) {
  static const struct {
    int type, k, n, r;
  } cases[] = {{LL_TYPE_Q4_0, 160, 37, 16}, {LL_TYPE_Q4_1, 160, 37, 8}, {LL_TYPE_Q5_0, 96, 20, 4}, {LL_TYPE_Q5_1, 96, 20, 4},
               {LL_TYPE_Q8_0, 160, 37, 16}, {LL_TYPE_Q4_K, 256, 37, 16}, {LL_TYPE_Q5_K, 256, 19, 3}, {LL_TYPE_Q6_K, 256, 37, 16},
               {LL_TYPE_F32, 77, 37, 5},    {LL_TYPE_F16, 77, 37, 16},   {LL_TYPE_BF16, 77, 21, 16}};
  static const int Ts[] = {1, 19, 40};
  double worst_y = 0, worst_a = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int K = cases[ci].k, N = cases[ci].n, R = cases[ci].r, type = cases[ci].type;
    void *wd = make_weight(type, K, N);
    float *wf = malloc((size_t)N * K * 4), *A = malloc((size_t)R * K * 4), *Bm = malloc((size_t)N * R * 4);
    const size_t rsz = ll_row_size(type, K);
    for (int n = 0; n < N; n++) CHECK(ll_dequantize_row(type, (const unsigned char *)wd + (size_t)n * rsz, wf + (size_t)n * K, K) == 0);
    randf(A, (size_t)R * K, 0.1f), randf(Bm, (size_t)N * R, 0.1f);
    struct ll_weight w = {type, K, N, wd, NULL, NULL}, wa = {LL_TYPE_F32, K, R, A, NULL, NULL}, wb = {LL_TYPE_F32, R, N, Bm, NULL, NULL};
    CHECK(cl->i->weight_upload(cl, &w) == 0);
    const float scale = 2.0f;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
      const int T = Ts[ti], acc = (int)(ti & 1);
      float *x = malloc((size_t)T * K * 4), *xa = malloc((size_t)T * K * 4), *y = malloc((size_t)T * N * 4), *yr = malloc((size_t)T * N * 4);
      float *ax = malloc((size_t)T * R * 4), *axr = malloc((size_t)T * R * 4);
      randf(x, (size_t)T * K, 1.0f), randf(xa, (size_t)T * K, 1.0f), randf(y, (size_t)T * N, 1.0f);
      memcpy(yr, y, (size_t)T * N * 4);
      memset(ax, 0x7f, (size_t)T * R * 4); // overwritten
      for (int t = 0; t < T; t++) {
        for (int j = 0; j < R; j++) {
          double s = 0;
          for (int k = 0; k < K; k++) s += (double)xa[(size_t)t * K + k] * A[(size_t)j * K + k];
          axr[(size_t)t * R + j] = (float)(scale * s);
        }
        for (int n = 0; n < N; n++) {
          double s = 0;
          for (int k = 0; k < K; k++) s += (double)x[(size_t)t * K + k] * wf[(size_t)n * K + k];
          for (int j = 0; j < R; j++) s += (double)axr[(size_t)t * R + j] * Bm[(size_t)n * R + j];
          yr[(size_t)t * N + n] = (float)(acc ? yr[(size_t)t * N + n] + s : s);
        }
      }
      struct ll_backend_info i0, i1;
      cl->i->get_info(cl, &i0);
      CHECK(cl->i->matmul_lora(cl, y, ax, x, xa, &w, &wa, &wb, scale, T, acc) == 0);
      cl->i->get_info(cl, &i1);
      CHECKF(i1.launches - i0.launches == 2 && i1.train_fast_launches - i0.train_fast_launches == 2, "matmul_lora %s: %lld launches, %lld of train_fast.cl (want 2)",
             ll_type_name(type), (long long)(i1.launches - i0.launches), (long long)(i1.train_fast_launches - i0.train_fast_launches));
      const double ey = nmse(y, yr, (size_t)T * N), ea = nmse(ax, axr, (size_t)T * R);
      CHECKF(ey < TOL && ea < TOL, "matmul_lora %s K=%d N=%d r=%d T=%d acc=%d: nmse y %.3g, axs %.3g", ll_type_name(type), K, N, R, T, acc, ey, ea);
      if (ey > worst_y) worst_y = ey;
      if (ea > worst_a) worst_a = ea;
      free(x), free(xa), free(y), free(yr), free(ax), free(axr);
    }
    cl->i->weight_release(cl, &w);
    free(wd), free(wf), free(A), free(Bm);
  }
  { // bad shapes are refused before anything runs
    float z[64] = {0};
    struct ll_weight w = {LL_TYPE_F32, 8, 4, z, NULL, NULL}, wa = {LL_TYPE_F32, 8, 2, z, NULL, NULL}, wb = {LL_TYPE_F32, 3, 4, z, NULL, NULL};
    CHECK(cl->i->matmul_lora(cl, z, z, z, z, &w, &wa, &wb, 1.0f, 1, 0) == LL_EINVAL); // B's rank 3, A's 2
    wb.k = 2, wa.type = LL_TYPE_F16;
    CHECK(cl->i->matmul_lora(cl, z, z, z, z, &w, &wa, &wb, 1.0f, 1, 0) == LL_EINVAL); // A not F32
  }
  printf("matmul_lora, fast tier vs double: worst nmse y %.3g, axs %.3g (tolerance %.0e)\n", worst_y, worst_a, TOL);
}

// AdamW over a whole arena in one launch (adamw_split: the weight decay on the first n_decay
// values) against the reference's two calls, three steps.
static void test_adamw_split(struct ll_backend *cl) {
  const struct ll_backend_i *ref = ll_cpu_train_ref();
  const int64_t n = 1000, nd = 613;
  float *p[2], *m[2], *v[2], *g = malloc(n * 4);
  for (int i = 0; i < 2; i++) p[i] = malloc(n * 4), m[i] = calloc(n, 4), v[i] = calloc(n, 4);
  randf(p[0], n, 1.0f), memcpy(p[1], p[0], n * 4);
  double worst = 0;
  for (int step = 1; step <= 3; step++) {
    randf(g, n, 1.0f);
    CHECK(ref->adamw(NULL, p[0], g, m[0], v[0], nd, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step) == 0);
    CHECK(ref->adamw(NULL, p[0] + nd, g + nd, m[0] + nd, v[0] + nd, n - nd, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, step) == 0);
    struct ll_backend_info i0, i1;
    cl->i->get_info(cl, &i0);
    CHECK(cl->i->adamw_split && cl->i->adamw_split(cl, p[1], g, m[1], v[1], n, nd, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step) == 0);
    cl->i->get_info(cl, &i1);
    CHECKF(i1.launches - i0.launches == 1 && i1.train_fast_launches - i0.train_fast_launches == 1, "adamw_split: %lld launches (want 1)",
           (long long)(i1.launches - i0.launches));
    const double e[3] = {nmse(p[1], p[0], n), nmse(m[1], m[0], n), nmse(v[1], v[0], n)};
    CHECKF(e[0] < TOL && e[1] < TOL && e[2] < TOL, "adamw_split step %d: nmse p %.3g m %.3g v %.3g", step, e[0], e[1], e[2]);
    for (int i = 0; i < 3; i++) worst = e[i] > worst ? e[i] : worst;
  }
  CHECK(cl->i->adamw_split(cl, p[1], g, m[1], v[1], n, n + 1, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1) == LL_EINVAL); // n_decay > n
  printf("adamw_split, fast tier vs the reference's two calls: worst nmse %.3g (tolerance %.0e)\n", worst, TOL);
  for (int i = 0; i < 2; i++) free(p[i]), free(m[i]), free(v[i]);
  free(g);
}

int main(void) {
  rs = ll_test_seed();
  const char *dev = getenv("LL_TEST_OPENCL_DEVICE");
  if (!dev || !*dev) dev = "opencl:0:0";
  setenv("LL_OPENCL_REFERENCE", "0", 1);
  struct ll_backend_params p = {1, dev, NULL};
  struct ll_backend *cl = NULL;
  char reason[256], err[512];
  CHECKF(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0, "%s", err);
  if (!cl || strncmp(reason, "opencl:", 7) != 0) {
    CHECKF(0, "no OpenCL device (%s): setup.sh installs PoCL", reason);
    ll_backend_free(cl);
    return ll_test_summary();
  }
  struct ll_backend_info in;
  cl->i->get_info(cl, &in);
  printf("%s, %s tier\n", in.device, in.tier);
  CHECK(strcmp(in.tier, "fast") == 0);
  test_matmul_backward(cl);
  test_attention(cl);
  test_attention_window(cl);
  test_attention_flash(cl);
  test_matmul_lora(cl);
  test_adamw_split(cl);
  ll_backend_free(cl);
  return ll_test_summary();
}
