// test_kernels.c - every optimized CPU kernel against its scalar reference, and the CPU
// backend's ops against naive formulas written here, on random shapes with ragged tails.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_error.h"
#include "ll_cpu_dot.h"
#include "ll_quant.h"
#include "ll_threadpool.h"
#include "testutil.h"

static uint64_t rs;

// Random weights of a type: quantized from random floats where we have a quantizer, else
// random bytes with a sane fp16 scale patched in (K-quants).
static void random_row(int type, void *dst, int k) {
  float *x = malloc((size_t)k * sizeof *x);
  for (int i = 0; i < k; i++) x[i] = ll_test_randf(&rs);
  if (ll_quantize_row(type, x, dst, k) != 0) {
    const size_t rsz = ll_row_size(type, k);
    unsigned char *b = dst;
    for (size_t i = 0; i < rsz; i++) b[i] = (unsigned char)ll_test_rand(&rs);
    const ll_fp16 d = ll_fp32_to_fp16(0.01f), dm = ll_fp32_to_fp16(0.002f);
    const size_t bs = ll_type_traits_get(type)->type_size;
    for (size_t o = 0; o < rsz; o += bs) {
      if (type == LL_TYPE_Q6_K) memcpy(b + o + 208, &d, 2);
      else memcpy(b + o, &d, 2), memcpy(b + o + 2, &dm, 2);
    }
  }
  free(x);
}

static void test_dots(void) {
  const int types[] = {LL_TYPE_F32, LL_TYPE_F16, LL_TYPE_BF16, LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q5_0,
                       LL_TYPE_Q5_1, LL_TYPE_Q8_0, LL_TYPE_Q4_K, LL_TYPE_Q5_K, LL_TYPE_Q6_K};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int t = types[ti];
    const struct ll_type_kernels *ref = ll_cpu_kernels_ref(t), *chosen = ll_cpu_kernels(t);
    CHECKF(ref && chosen, "%s: no kernels", ll_type_name(t));
    if (!ref || !chosen) continue;
    // Every SIMD level this CPU runs is tested, not only the one chosen.
    const char *isa = ll_cpu_isa();
    const struct ll_type_kernels *levels[4] = {chosen,
                                               strcmp(isa, "scalar") ? ll_cpu_kernels_avx2(t) : NULL,
                                               !strcmp(isa, "avx512vnni") ? ll_cpu_kernels_avx512(t) : NULL,
                                               ll_cpu_kernels_neon(t)}; // NULL off AArch64
    for (int lv = 0; lv < 4; lv++) {
    const struct ll_type_kernels *fast = levels[lv];
    if (!fast || (lv > 0 && fast == chosen)) continue;
    CHECK(ref->act_type == fast->act_type);
    const int bs = ll_type_traits_get(t)->blck_size, abs_ = ll_type_traits_get(ref->act_type)->blck_size;
    const int unit = bs > abs_ ? bs : abs_;
    int bad = 0;
    double worst = 0;
    for (int trial = 0; trial < 40; trial++) {
      const int k = unit * (1 + (int)(ll_test_rand(&rs) % (unit >= 256 ? 8 : 64))) + (unit == 1 ? (int)(ll_test_rand(&rs) % 31) : 0);
      void *w = malloc(ll_row_size(t, k)), *a1 = malloc(ll_row_size(ref->act_type, k)), *a2 = malloc(ll_row_size(ref->act_type, k));
      float *x = malloc((size_t)k * sizeof *x);
      random_row(t, w, k);
      for (int i = 0; i < k; i++) x[i] = ll_test_randf(&rs) * 3;
      // Quantizer corner cases: an all-zero block, tiny values, halves that tie when rounded.
      if (trial % 4 == 1) memset(x, 0, sizeof(float) * (k < 32 ? k : 32));
      if (trial % 4 == 2) for (int i = 0; i < k; i++) x[i] *= 1e-6f;
      if (trial % 4 == 3) for (int i = 0; i < k; i++) x[i] = (float)((int)(ll_test_rand(&rs) % 255) - 127) * 0.5f;
      ref->from_float(x, a1, k);
      fast->from_float(x, a2, k);
      bad += memcmp(a1, a2, ll_row_size(ref->act_type, k)) != 0; // activation quantizers bit-identical
      float s1, s2;
      ref->vec_dot(k, &s1, w, a1);
      fast->vec_dot(k, &s2, w, a1);
      // Same integer sums; only the float reduction order differs: 1e-5 relative to the sum of
      // magnitudes is the stated tolerance.
      double mag = 0;
      float *wf = malloc((size_t)k * sizeof *wf), *af = malloc((size_t)k * sizeof *af);
      ll_dequantize_row(t, w, wf, k);
      for (int i = 0; i < k; i++) mag += fabs((double)wf[i] * x[i]);
      const double diff = fabs((double)s1 - s2) / (mag + 1e-6);
      worst = diff > worst ? diff : worst;
      bad += diff > 1e-5;
      // Q4_0 follows dot.c's (llama.cpp's repacked) order on every ISA: bit for bit.
      if (t == LL_TYPE_Q4_0) bad += memcmp(&s1, &s2, sizeof s1) != 0;
      // And the reference dot agrees with the float dot of the dequantized weights within the
      // activation quantization error (8-bit: 1/127 of each block's max; stated 1%).
      double exact = 0;
      for (int i = 0; i < k; i++) exact += (double)wf[i] * x[i];
      if (trial % 4 != 2) bad += fabs(exact - s1) > 1e-2 * mag + 1e-5; // (tiny inputs: fp16 scales underflow)
      // AVX-512 kernels follow the AVX2 float order exactly (llama.cpp agreement depends on it).
      if (!strcmp(fast->isa, "avx512vnni")) {
        const struct ll_type_kernels *k2 = ll_cpu_kernels_avx2(t);
        float s3;
        if (k2) k2->vec_dot(k, &s3, w, a1);
        bad += k2 && memcmp(&s2, &s3, 4) != 0;
      }
      // NEON kernels keep the reference's float steps (dot_neon.c), so they give its bits.
      if (!strcmp(fast->isa, "neon")) bad += memcmp(&s1, &s2, 4) != 0;
      free(w), free(a1), free(a2), free(x), free(wf), free(af);
    }
    printf("%-5s kernels %-10s vs scalar: worst relative difference %.2e\n", ll_type_name(t), fast->isa, worst);
    CHECKF(bad == 0, "%s %s: %d mismatches", ll_type_name(t), fast->isa, bad);
    // Tiles: every shape gives exactly vec_dot's result (batch composition never changes a row).
    if (fast->tile) {
      const int tna = fast->tile_na > 0 ? fast->tile_na : 2;
      int tbad = 0;
      for (int trial = 0; trial < 20; trial++) {
        const int k = unit * (1 + (int)(ll_test_rand(&rs) % (unit >= 256 ? 16 : trial % 4 ? 40 : 128))); // <= 4096 (x below); some past 64 blocks
        const size_t wr = ll_row_size(t, k), ar = ll_row_size(fast->act_type, k);
        unsigned char *W = malloc(wr * 4), *A = malloc(ar * 8);
        float x[4096];
        CHECK(tna <= 8);
        for (int r = 0; r < 4; r++) random_row(t, W + wr * r, k);
        for (int q = 0; q < 8; q++) {
          for (int i = 0; i < k; i++) x[i] = ll_test_randf(&rs);
          fast->from_float(x, A + ar * q, k);
        }
        for (int nw = 1; nw <= 4; nw++)
          for (int na = 1; na <= tna; na++) {
            float out[8 * 4];
            fast->tile(k, W, wr, nw, A, ar, na, out, 4);
            for (int q = 0; q < na; q++)
              for (int r = 0; r < nw; r++) {
                float s;
                fast->vec_dot(k, &s, W + wr * r, A + ar * q);
                tbad += memcmp(&s, &out[q * 4 + r], 4) != 0;
              }
            if (fast->tile_sc) { // with the side tables (block-major, stride 8): same bits
              float sc[128 * 8], out2[8 * 4];
              int32_t ss[128 * 8];
              CHECK(k / 32 <= 128);
              for (int q = 0; q < 8; q++) tbad += ll_act_side(fast->act_type, A + ar * q, k, sc + q, ss + q, 8) != 0;
              fast->tile_sc(k, W, wr, nw, A, ar, na, sc, ss, 8, out2, 4);
              for (int q = 0; q < na; q++)
                for (int r = 0; r < nw; r++) tbad += memcmp(&out[q * 4 + r], &out2[q * 4 + r], 4) != 0;
            }
          }
        free(W), free(A);
      }
      CHECKF(tbad == 0, "%s %s: %d tile outputs differ from vec_dot", ll_type_name(t), fast->isa, tbad);
    }
    }
  }
  // f16 attention helpers: bit-identical between scalar and SIMD (same lane order, fused).
  const struct ll_f16_ops *r = ll_cpu_f16_ops_ref(), *f = ll_cpu_f16_ops();
  int bad = 0;
  for (int trial = 0; trial < 50; trial++) {
    const int n = 1 + (int)(ll_test_rand(&rs) % 300);
    float q[300], o1[300], o2[300];
    uint16_t k[300];
    for (int i = 0; i < n; i++) q[i] = ll_test_randf(&rs), k[i] = ll_fp32_to_fp16(ll_test_randf(&rs)), o1[i] = o2[i] = ll_test_randf(&rs);
    const float a = r->dot_f32_f16(q, k, n), b = f->dot_f32_f16(q, k, n);
    bad += memcmp(&a, &b, 4) != 0;
    r->axpy_f16(o1, k, 0.37f, n);
    f->axpy_f16(o2, k, 0.37f, n);
    bad += memcmp(o1, o2, (size_t)n * 4) != 0;
    // f32 -> f16 store: every finite magnitude class (subnormal halves, ties, overflow to inf).
    uint16_t h1[300], h2[300];
    for (int i = 0; i < n; i++) {
      const float m = ll_test_randf(&rs);
      const int e = (int)(ll_test_rand(&rs) % 48) - 30; // 2^-30 .. 2^17
      o1[i] = ldexpf(m, e);
      if (i % 7 == 0) o1[i] = ldexpf((float)(2 * (int)(ll_test_rand(&rs) % 1024) + 1), -25); // exact ties
    }
    r->from_f32(h1, o1, n);
    f->from_f32(h2, o1, n);
    bad += memcmp(h1, h2, (size_t)n * 2) != 0;
    r->round_f16(o2, o1, 0.37f, n);
    f->round_f16(q, o1, 0.37f, n);
    bad += memcmp(o2, q, (size_t)n * 4) != 0;
  }
  CHECKF(bad == 0, "f16 ops: %d mismatches", bad);
  // One head's attention over paged rows: scores and the lane-ordered weighted sum of V,
  // bit-identical between scalar and SIMD, for row counts below, at and above the 32 lanes
  // and head sizes with and without a 64-element remainder or an 8-element tail.
  {
    static const int ns[] = {8, 13, 64, 72, 128, 200};
    static const int rs_[] = {1, 5, 31, 32, 33, 64, 97};
    int abad = 0, checked = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
      for (size_t b = 0; b < sizeof rs_ / sizeof *rs_; b++) {
        const int n = ns[a], rows = rs_[b];
        uint16_t *kv = malloc((size_t)rows * n * 2);
        const uint16_t **ptr = malloc((size_t)rows * sizeof *ptr);
        float *q = malloc((size_t)n * 4), *w = malloc((size_t)rows * 4), *s1 = malloc((size_t)rows * 4), *s2 = malloc((size_t)rows * 4);
        float *o1 = malloc((size_t)n * 4), *o2 = malloc((size_t)n * 4), *lanes = malloc((size_t)32 * n * 4);
        CHECK(kv && ptr && q && w && s1 && s2 && o1 && o2 && lanes);
        if (!kv || !ptr || !q || !w || !s1 || !s2 || !o1 || !o2 || !lanes) return;
        for (int i = 0; i < rows * n; i++) kv[i] = ll_fp32_to_fp16(ll_test_randf(&rs));
        for (int p = 0; p < rows; p++) ptr[rows - 1 - p] = kv + (size_t)p * n, w[p] = ll_fp16_to_fp32(ll_fp32_to_fp16(ll_test_randf(&rs)));
        for (int i = 0; i < n; i++) q[i] = ll_test_randf(&rs);
        r->dot_rows_f16(s1, q, ptr, rows, n);
        f->dot_rows_f16(s2, q, ptr, rows, n);
        for (int p = 0; p < rows; p++) abad += s1[p] != f->dot_f32_f16(q, ptr[p], n); // the row op is the per-row op
        abad += memcmp(s1, s2, (size_t)rows * 4) != 0;
        for (int i = 0; i < 32 * n; i++) lanes[i] = NAN; // scratch content must not matter
        r->wsum_rows_f16(o1, ptr, w, rows, n, lanes);
        for (int i = 0; i < 32 * n; i++) lanes[i] = NAN;
        f->wsum_rows_f16(o2, ptr, w, rows, n, lanes);
        abad += memcmp(o1, o2, (size_t)n * 4) != 0;
        // The prompt-pass (8-lane) order: scalar and SIMD bit-identical too, and near the
        // 32-lane result (same sums, different rounding).
        if (n % 8 == 0) {
          float s3[128], s4[128];
          r->dot_rows8_f16(s3, q, ptr, rows, n);
          f->dot_rows8_f16(s4, q, ptr, rows, n);
          abad += memcmp(s3, s4, (size_t)rows * 4) != 0;
          for (int p = 0; p < rows; p++) abad += fabsf(s3[p] - s1[p]) > 1e-4f * (1 + fabsf(s1[p]));
        }
        {
          float *o3 = malloc((size_t)n * 4), *o4 = malloc((size_t)n * 4);
          CHECK(o3 && o4);
          if (!o3 || !o4) return;
          r->wsum_rows8_f16(o3, ptr, w, rows, n, lanes);
          f->wsum_rows8_f16(o4, ptr, w, rows, n, lanes);
          abad += memcmp(o3, o4, (size_t)n * 4) != 0;
          for (int i = 0; i < n; i++) abad += fabsf(o3[i] - o1[i]) > 1e-4f * (1 + fabsf(o1[i])) * rows;
          free(o3), free(o4);
        }
        // and against the plain sum (the order differs, the value must not by much)
        for (int i = 0; i < n; i++) {
          double e = 0;
          for (int p = 0; p < rows; p++) e += (double)w[p] * ll_fp16_to_fp32(ptr[p][i]);
          abad += fabs(e - o1[i]) > 1e-5 * (1 + fabs(e)) * rows;
        }
        checked++;
        free(kv), free(ptr), free(q), free(w), free(s1), free(s2), free(o1), free(o2), free(lanes);
      }
    CHECKF(abad == 0 && checked == 42, "attention rows: %d mismatches in %d shapes", abad, checked);
  }

  // ggml's softmax / SwiGLU: scalar emulation and AVX2 give the same bits; the exp is within
  // 2 ulp of libm (ggml's stated error: 1.45 + 0.5 ulp) over the range softmax uses.
  const struct ll_vec_ops *vr = ll_cpu_vec_ops_ref(), *vf = ll_cpu_vec_ops();
  int vbad = 0, ulp_bad = 0;
  for (int trial = 0; trial < 60; trial++) {
    const int n = 1 + (int)(ll_test_rand(&rs) % 300);
    float x[300], y1[300], y2[300], g[300], u[300], o1[300], o2[300];
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
      x[i] = ll_test_randf(&rs) * (trial % 3 == 0 ? 200.0f : 20.0f); // also beyond exp's range
      mx = x[i] > mx ? x[i] : mx;
      g[i] = ll_test_randf(&rs) * 30.0f, u[i] = ll_test_randf(&rs);
    }
    const double s1 = vr->softmax(y1, x, mx, n), s2 = vf->softmax(y2, x, mx, n);
    vbad += memcmp(&s1, &s2, sizeof s1) != 0 || memcmp(y1, y2, (size_t)n * 4) != 0;
    for (int i = 0; i < n; i++) {
      const float want = expf(x[i] - mx);
      if (want > 1e-30f && fabsf(y1[i] - want) > 2.5f * (nextafterf(want, INFINITY) - want)) ulp_bad++;
    }
    vr->swiglu(o1, g, u, n);
    vf->swiglu(o2, g, u, n);
    vbad += memcmp(o1, o2, (size_t)n * 4) != 0;
    // GeGLU with ggml's f16 table: the gates scaled to +-24 so that both ends (<= -10, >= 10)
    // and f16 ties and subnormals are crossed; the same bits
    for (int i = 0; i < n; i++) x[i] = g[i] * (trial % 3 == 0 ? 0.8f : trial % 3 == 1 ? 0.1f : 1e-6f);
    if (n > 2) x[0] = -10.0f, x[1] = 10.0f;
    vr->geglu_f16(o1, x, u, n);
    vf->geglu_f16(o2, x, u, n);
    vbad += memcmp(o1, o2, (size_t)n * 4) != 0;
    // RoPE rotation: fused as llama.cpp's GCC build computes it (both pair layouts, odd counts too)
    const int np = n / 2;
    if (np > 0) {
      memcpy(o1, u, (size_t)n * 4), memcpy(o2, u, (size_t)n * 4);
      vr->rope_pairs(o1, g, x, np, trial % 2);
      vf->rope_pairs(o2, g, x, np, trial % 2);
      vbad += memcmp(o1, o2, (size_t)n * 4) != 0;
      const float x1 = u[trial % 2 ? np : 1], want0 = fmaf(u[0], g[0], -(x1 * x[0])); // pair 0, fused
      vbad += np >= 2 && memcmp(&o1[0], &want0, 4) != 0;
    }
  }
  CHECKF(vbad == 0, "softmax/swiglu/geglu/rope: scalar and SIMD differ in %d trials", vbad);
  // Dequantization into sgemm panels (training): SIMD and ll_dequantize_row the same bits, over
  // random bytes (every nibble and int8) with random finite scales of both signs, subnormal too.
  {
    int dbad = 0, dn = 0;
    const int dtypes[] = {LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q8_0, LL_TYPE_Q4_K};
    for (int trial = 0; trial < 200; trial++) {
      const int type = dtypes[trial % 4], unit = ll_type_traits_get(type)->blck_size;
      const int n = unit * (1 + (int)(ll_test_rand(&rs) % 24));
      const size_t rsz = ll_row_size(type, n), bs = ll_type_traits_get(type)->type_size;
      unsigned char *row = malloc(rsz);
      float *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4);
      for (size_t i = 0; i < rsz; i++) row[i] = (unsigned char)ll_test_rand(&rs);
      for (size_t o = 0; o < rsz; o += bs)
        for (int h = 0; h < (type == LL_TYPE_Q4_1 || type == LL_TYPE_Q4_K ? 2 : 1); h++) {
          ll_fp16 hf = (ll_fp16)(ll_test_rand(&rs) & 0xffff);
          if ((hf & 0x7c00) == 0x7c00) hf &= 0x83ff; // Inf/NaN -> subnormal
          memcpy(row + o + 2 * h, &hf, 2);
        }
      const int r1 = ll_dequantize_row(type, row, y1, n), r2 = vf->dequant_row(type, row, y2, n);
      dbad += r1 != 0 || r2 != 0 || memcmp(y1, y2, (size_t)n * 4) != 0;
      dn++;
      free(row), free(y1), free(y2);
    }
    CHECKF(dbad == 0 && dn == 200, "dequant_row: SIMD and reference differ in %d of %d rows", dbad, dn);
  }
  // llama.cpp's F32 dot orders (LoRA factors): scalar and SIMD the same bits for every length
  // (tails of 0..31, 8/4-groups and fused singles), each within float rounding of a double sum,
  // and the two orders really are different orders (else the test could not tell them apart).
  {
    int fbad = 0, far = 0, differ = 0;
    float x[1600], y[1600];
    for (int trial = 0; trial < 200; trial++) {
      const int n = trial < 100 ? 1 + trial : 8 * (1 + (int)(ll_test_rand(&rs) % 200));
      double ref = 0, mag = 0;
      for (int i = 0; i < n; i++) {
        x[i] = ll_test_randf(&rs), y[i] = ll_test_randf(&rs) * 3.0f;
        ref += (double)x[i] * y[i], mag += fabs((double)x[i] * y[i]);
      }
      const float a1 = vr->dot_f32_ggml(x, y, n), a2 = vf->dot_f32_ggml(x, y, n);
      fbad += memcmp(&a1, &a2, 4) != 0;
      far += fabs(a1 - ref) > 1e-5 * mag + 1e-30;
      if (n % 8 == 0) {
        const float b1 = vr->dot_f32_tile8(x, y, n), b2 = vf->dot_f32_tile8(x, y, n);
        fbad += memcmp(&b1, &b2, 4) != 0;
        far += fabs(b1 - ref) > 1e-5 * mag + 1e-30;
        differ += b1 != a1;
      }
    }
    CHECKF(fbad == 0 && far == 0, "F32 dots in llama.cpp's orders: %d scalar/SIMD mismatches, %d far from the double sum", fbad, far);
    CHECKF(differ > 0, "the vec_dot and tinyBLAS orders give different bits for some lengths (%d)", differ);
  }
  CHECKF(ulp_bad == 0, "ggml exp: %d values more than 2.5 ulp from expf", ulp_bad);
}

struct sum_ctx {
  long *out;
};
static void sum_task(void *vctx, int task, int thread) {
  (void)thread;
  struct sum_ctx *c = vctx;
  c->out[task] = (long)task * task;
}

static void test_threadpool(void) {
  struct ll_threadpool *p = ll_threadpool_new(3);
  CHECK(p && ll_threadpool_size(p) == 3);
  long out[1000];
  struct sum_ctx c = {out};
  int bad = 0;
  for (int job = 0; job < 2000; job++) { // many small jobs back to back
    const int n = 1 + job % 1000;
    memset(out, 0xff, sizeof out);
    ll_threadpool_run(p, sum_task, &c, n);
    for (int i = 0; i < n; i++) bad += out[i] != (long)i * i;
  }
  CHECKF(bad == 0, "%d wrong task results", bad);
  ll_threadpool_free(p);
}

static void test_backend_ops(void) {
  struct ll_backend *b;
  char err[256];
  CHECK(ll_backend_cpu_create(&b, 2, err, sizeof err) == 0);
  const struct ll_backend_i *B = b->i;
  // matmul (T, N) = x (T, K) · W (N, K)ᵀ against per-row reference dots, ragged N and T (up to
  // three 8-token tiles and a tail; batches use the side-table tiles where a type has them).
  static const int mm_types[] = {LL_TYPE_Q4_1, LL_TYPE_Q8_0, LL_TYPE_Q4_0, LL_TYPE_Q5_0, LL_TYPE_Q4_K, LL_TYPE_Q6_K};
  for (int trial = 0; trial < 24; trial++) {
    const int t = mm_types[trial % 6], unit = ll_type_traits_get(t)->blck_size;
    const int K = unit * (1 + (int)(ll_test_rand(&rs) % (unit >= 256 ? 4 : 24))), N = 1 + (int)(ll_test_rand(&rs) % 77),
              T = 1 + (int)(ll_test_rand(&rs) % 20);
    const size_t rsz = ll_row_size(t, K);
    unsigned char *W = malloc(rsz * N);
    for (int n = 0; n < N; n++) random_row(t, W + rsz * n, K);
    float *x = malloc(sizeof(float) * T * K), *out = malloc(sizeof(float) * T * N);
    for (int i = 0; i < T * K; i++) x[i] = ll_test_randf(&rs);
    struct ll_weight w = {t, K, N, W, NULL, NULL};
    CHECK(B->matmul(b, out, x, &w, T, 0) == 0);
    const struct ll_type_kernels *k = ll_cpu_kernels(t);
    void *act = malloc(ll_row_size(k->act_type, K));
    int bad = 0;
    for (int tt = 0; tt < T; tt++) {
      k->from_float(x + (size_t)tt * K, act, K);
      for (int n = 0; n < N; n++) {
        float s;
        k->vec_dot(K, &s, W + rsz * n, act);
        bad += s != out[(size_t)tt * N + n]; // same kernel, same inputs: identical
      }
    }
    CHECKF(bad == 0, "matmul %s K=%d N=%d T=%d: %d differences", ll_type_name(t), K, N, T, bad);
    free(W), free(x), free(out), free(act);
  }
  // Prompts through gemm16 (16 tokens to a vector, where the ISA has it: Q5_0, Q4_K and Q6_K on AVX-512 VNNI):
  // every output the dot's bits, with and without accumulation, over K of more than one chunk
  // of blocks (32), T with a tail past the groups, and more groups than one call takes (33).
  for (int trial = 0; trial < 24; trial++) {
    const int t = trial < 8 ? LL_TYPE_Q5_0 : trial < 16 ? LL_TYPE_Q4_K : LL_TYPE_Q6_K, tr = trial % 8, unit = t == LL_TYPE_Q5_0 ? 32 : 256;
    const int K = unit * (tr < 2 ? 1 + tr : (unit == 32 ? 20 : 1) + (int)(ll_test_rand(&rs) % (unit == 32 ? 60 : 10))), N = 4 + (int)(ll_test_rand(&rs) % 40),
              T = tr == 7 ? 16 * (LL_GEMM16_MAX_GROUPS + 1) + 5 : 16 + (int)(ll_test_rand(&rs) % 40);
    const size_t rsz = ll_row_size(t, K);
    unsigned char *W = malloc(rsz * N);
    float *x = malloc(sizeof(float) * T * K), *out = malloc(sizeof(float) * T * N);
    CHECK(W && x && out);
    if (!W || !x || !out) return;
    for (int n = 0; n < N; n++) random_row(t, W + rsz * n, K);
    for (int i = 0; i < T * K; i++) x[i] = ll_test_randf(&rs) * (trial % 3 == 0 ? 30.0f : 1.0f);
    for (int i = 0; i < T * N; i++) out[i] = 0.5f;
    struct ll_weight w = {t, K, N, W, NULL, NULL};
    CHECK(B->matmul(b, out, x, &w, T, trial & 1) == 0);
    const struct ll_type_kernels *k = ll_cpu_kernels(t);
    void *act = malloc(ll_row_size(k->act_type, K));
    int bad = 0;
    for (int tt = 0; tt < T; tt++) {
      k->from_float(x + (size_t)tt * K, act, K);
      for (int n = 0; n < N; n++) {
        float s;
        k->vec_dot(K, &s, W + rsz * n, act);
        if (trial & 1) s = 0.5f + s;
        bad += memcmp(&s, &out[(size_t)tt * N + n], 4) != 0;
      }
    }
    CHECKF(bad == 0, "prompt matmul %s (%s) K=%d N=%d T=%d: %d differences", ll_type_name(t), k->gemm16 ? "gemm16" : "tiles", K, N, T, bad);
    if (k->act_t16) { // the vectorised transposition: the scalar one's bytes (random quants, scales, bsums)
      const size_t ar = ll_row_size(k->act_type, K), grp = k->act_type == LL_TYPE_Q8_0 ? 16 * (size_t)K : (size_t)(K / 256) * LL_T16_Q8K_BYTES;
      unsigned char *A = malloc(ar * 32), *o1 = malloc(grp * 2), *o2 = malloc(grp * 2);
      CHECK(A && o1 && o2);
      if (!A || !o1 || !o2) return;
      for (size_t i = 0; i < ar * 32; i++) A[i] = (unsigned char)ll_test_rand(&rs);
      if (k->act_type == LL_TYPE_Q8_0) ll_act_t16_q8_0(A, ar, 2, K, o1);
      else ll_act_t16_q8_K(A, ar, 2, K, o1);
      k->act_t16(A, ar, 2, K, o2);
      CHECKF(memcmp(o1, o2, grp * 2) == 0, "act_t16 %s: not the scalar transposition's bytes", ll_type_name(t));
      free(A), free(o1), free(o2);
    }
    free(W), free(x), free(out), free(act);
  }
  // Float weights x a batch of >= LL_BLAS_MIN_T tokens go through OpenBLAS sgemm (a different
  // summation order): within 1e-5 of the double-precision product relative to the sum of
  // magnitudes, with and without accumulation, for ragged N (several row blocks per task);
  // in batch-invariant mode (the server) every row is bit-identical to the single-token path.
  for (int trial = 0; trial < 6; trial++) {
    const int t = trial % 3 == 0 ? LL_TYPE_F32 : trial % 3 == 1 ? LL_TYPE_F16 : LL_TYPE_BF16;
    const int K = 8 * (1 + (int)(ll_test_rand(&rs) % 40)), N = 1 + (int)(ll_test_rand(&rs) % 300), T = LL_BLAS_MIN_T + (int)(ll_test_rand(&rs) % 20);
    const size_t rsz = ll_row_size(t, K);
    unsigned char *W = malloc(rsz * N);
    float *wf = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * T * K), *out = malloc(sizeof(float) * T * N),
          *out2 = malloc(sizeof(float) * T * N), *one = malloc(sizeof(float) * N);
    CHECK(W && wf && x && out && out2 && one);
    if (!W || !wf || !x || !out || !out2 || !one) return;
    for (int i = 0; i < N * K; i++) wf[i] = ll_test_randf(&rs);
    for (int n = 0; n < N; n++) ll_quantize_row(t, wf + (size_t)n * K, W + rsz * n, K), ll_dequantize_row(t, W + rsz * n, wf + (size_t)n * K, K);
    for (int i = 0; i < T * K; i++) x[i] = ll_test_randf(&rs);
    struct ll_weight w = {t, K, N, W, NULL, NULL};
    for (int i = 0; i < T * N; i++) out[i] = 0.5f;
    b->batch_invariant = 0;
    CHECK(B->matmul(b, out, x, &w, T, trial & 1) == 0);
    int bad = 0;
    for (int tt = 0; tt < T; tt++)
      for (int n = 0; n < N; n++) {
        double e = (trial & 1) ? 0.5 : 0, mag = 0;
        for (int i = 0; i < K; i++) e += (double)x[(size_t)tt * K + i] * wf[(size_t)n * K + i], mag += fabs((double)x[(size_t)tt * K + i] * wf[(size_t)n * K + i]);
        bad += fabs(e - out[(size_t)tt * N + n]) > 1e-5 * (mag + 1);
      }
    CHECKF(bad == 0, "sgemm matmul %s K=%d N=%d T=%d: %d outside 1e-5", ll_type_name(t), K, N, T, bad);
    b->batch_invariant = 1;
    CHECK(B->matmul(b, out2, x, &w, T, 0) == 0);
    int diff = 0;
    for (int tt = 0; tt < T; tt++) {
      CHECK(B->matmul(b, one, x + (size_t)tt * K, &w, 1, 0) == 0);
      diff += memcmp(one, out2 + (size_t)tt * N, sizeof(float) * N) != 0;
    }
    CHECKF(diff == 0, "batch-invariant matmul %s: %d token rows differ from the single-token path", ll_type_name(t), diff);
    b->batch_invariant = 0;
    free(W), free(wf), free(x), free(out), free(out2), free(one);
  }
  // rmsnorm and rope against the formulas.
  float x[3 * 64], y[3 * 64], g[64];
  for (int i = 0; i < 192; i++) x[i] = ll_test_randf(&rs);
  for (int i = 0; i < 64; i++) g[i] = ll_test_randf(&rs);
  CHECK(B->rmsnorm(b, y, x, g, 3, 64, 1e-5f) == 0);
  int bad = 0;
  for (int t = 0; t < 3; t++) {
    double ss = 0;
    for (int i = 0; i < 64; i++) ss += x[t * 64 + i] * x[t * 64 + i];
    for (int i = 0; i < 64; i++) bad += fabs(y[t * 64 + i] - x[t * 64 + i] / sqrt(ss / 64 + 1e-5) * g[i]) > 1e-5;
  }
  CHECK(bad == 0);
  // The backend keeps the last cos/sin tables: repeated positions reuse them, new positions or
  // parameters must not (same positions twice, then one position changed, then another base).
  // Calls 8..11: LongRoPE (Phi-3 128k: theta divided by a factor per pair, cos and sin times the
  // attention factor), on both rotation forms (ggml_math: ll_vec_ops rope_pairs; else run.c's);
  // 10 and 11 differ only in the attention factor (the cache must see it).
  const int gm0 = b->ggml_math;
  for (int call = 0; call < 12; call++) {
    const int mode = call % 2 ? 2 : 0;
    const float base = call >= 6 && call < 8 ? 500.0f : 10000.0f;
    static const float ff[8] = {1.0f, 1.25f, 1.5f, 2.5f, 4.0f, 9.0f, 17.5f, 41.0f};
    const int lr = call >= 8;
    const float mscale = call == 10 ? 1.2247449f : call == 11 ? 1.1547005f : call >= 8 ? 1.1547005f : 1.0f;
    b->ggml_math = lr ? call < 10 : gm0;
    memcpy(y, x, sizeof x);
    int32_t pos[3] = {call >= 4 ? 1 : 0, 7, 300};
    struct ll_rope_params rp = {mode, 16, base, 1.0f, lr ? ff : NULL, lr ? mscale : 1.0f};
    CHECK(B->rope(b, y, pos, 3, 2, 32, &rp) == 0); // 3 tokens, 2 heads of 32, 16 rotated dims
    bad = 0;
    for (int t = 0; t < 3; t++)
      for (int h = 0; h < 2; h++) {
        const float *in = x + (t * 2 + h) * 32, *o = y + (t * 2 + h) * 32;
        for (int i = 0; i < 8; i++) {
          const double th = pos[t] * pow((double)base, -2.0 * i / 16) / (lr ? ff[i] : 1.0), m = lr ? mscale : 1.0;
          const int a = mode ? i : 2 * i, c = mode ? i + 8 : 2 * i + 1;
          bad += fabs(o[a] - m * (in[a] * cos(th) - in[c] * sin(th))) > 1e-3 || fabs(o[c] - m * (in[a] * sin(th) + in[c] * cos(th))) > 1e-3;
        }
        for (int i = 16; i < 32; i++) bad += o[i] != in[i]; // beyond n_rot: untouched (ggml: not scaled either)
      }
    CHECKF(bad == 0, "rope call %d (mode %d): %d differences", call, mode, bad);
  }
  b->ggml_math = gm0;
  // attention over a paged f32 cache against a naive softmax(q·k)·v; f16 cache within 1e-2;
  // each also with a sliding window of 9 positions (a query at t sees (t - 9, t]).
  for (int run = 0; run < 4; run++) {
    const int kvt = run % 2, win = run / 2 ? 9 : 0;
    const int hd = 32, Hkv = 2, H = 4, P = 37;
    const size_t es = kvt ? 2 : 4;
    unsigned char *kp = calloc(8 * 16 * Hkv * hd, es), *vp = calloc(8 * 16 * Hkv * hd, es);
    int32_t table[3] = {5, 1, 6}, pos[P];
    struct ll_kv_view kv = {kvt ? LL_TYPE_F16 : LL_TYPE_F32, 16, Hkv, hd, kp, vp, table, win};
    float *k = malloc(sizeof(float) * P * Hkv * hd), *v = malloc(sizeof(float) * P * Hkv * hd);
    float *q = malloc(sizeof(float) * P * H * hd), *o = malloc(sizeof(float) * P * H * hd);
    for (int i = 0; i < P * Hkv * hd; i++) k[i] = ll_test_randf(&rs), v[i] = ll_test_randf(&rs);
    for (int i = 0; i < P * H * hd; i++) q[i] = ll_test_randf(&rs);
    for (int i = 0; i < P; i++) pos[i] = i;
    CHECK(B->kv_store(b, &kv, k, v, pos, P) == 0);
    CHECK(B->attention(b, o, q, &kv, pos, P, H, 1.0f / sqrtf(hd)) == 0);
    double worst = 0;
    for (int t = 0; t < P; t++)
      for (int h = 0; h < H; h++) {
        const int kh = h / (H / Hkv);
        double sc[64], mx = -1e30, z = 0;
        const int lo = win && t + 1 > win ? t + 1 - win : 0;
        for (int p = lo; p <= t; p++) {
          double s = 0;
          for (int i = 0; i < hd; i++) s += q[(t * H + h) * hd + i] * k[(p * Hkv + kh) * hd + i];
          sc[p] = s / sqrt(hd);
          mx = sc[p] > mx ? sc[p] : mx;
        }
        for (int p = lo; p <= t; p++) z += exp(sc[p] - mx);
        for (int i = 0; i < hd; i++) {
          double r = 0;
          for (int p = lo; p <= t; p++) r += exp(sc[p] - mx) / z * v[(p * Hkv + kh) * hd + i];
          const double d = fabs(r - o[(t * H + h) * hd + i]);
          worst = d > worst ? d : worst;
        }
      }
    printf("attention (%s cache, window %d): worst abs difference %.2e\n", kvt ? "f16" : "f32", win, worst);
    CHECK(worst < (kvt ? 1e-2 : 1e-5));
    free(kp), free(vp), free(k), free(v), free(q), free(o);
  }
  // GeGLU against 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) * up in double: the float formula
  // within 2e-4 relative (float tanhf); llama.cpp's f16 table (ggml_math) within f16 rounding of x and of gelu.
  for (int gm = 0; gm < 2; gm++) {
    enum { N = 4099 };
    float *gx = malloc(sizeof(float) * N), *gu = malloc(sizeof(float) * N), *go = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) gx[i] = 24.0f * (ll_test_randf(&rs) - 0.5f), gu[i] = ll_test_randf(&rs) - 0.5f;
    gx[0] = -10.0f, gx[1] = 10.0f, gx[2] = 0.0f;
    b->ggml_math = gm;
    CHECK(B->geglu && B->geglu(b, go, gx, gu, N) == 0);
    double worst = 0;
    for (int i = 0; i < N; i++) {
      const double xv = gx[i], ge = 0.5 * xv * (1 + tanh(0.7978845608028654 * (xv + 0.044715 * xv * xv * xv)));
      const double d = fabs(go[i] - ge * gu[i]) / (fabs(ge * gu[i]) + 1e-3 * fabs(gu[i]) + 1e-30);
      worst = d > worst ? d : worst;
    }
    printf("geglu (%s): worst relative difference %.2e\n", gm ? "ggml's f16 table" : "tanhf", worst);
    CHECK(worst < (gm ? 1e-2 : 2e-4));
    CHECK(go[0] == 0.0f && go[1] == 10.0f * gu[1] && go[2] == 0.0f);
    if (gm) { // split over the backend's 2 threads: the scalar reference's bits
      float *gr = malloc(sizeof(float) * N);
      ll_cpu_vec_ops_ref()->geglu_f16(gr, gx, gu, N);
      CHECK(memcmp(gr, go, sizeof(float) * N) == 0);
      free(gr);
    }
    free(gx), free(gu), free(go);
  }
  b->ggml_math = 0;
  ll_backend_free(b);
  // Device choice: a malformed device string is an error; cpu and auto always give a backend
  // and a reason (the OpenCL paths are tested in test_opencl).
  struct ll_backend_params bp = {1, "opencl:x", NULL};
  char reason[256] = "";
  CHECK(ll_backend_create(&b, &bp, reason, sizeof reason, err, sizeof err) == LL_EINVAL && strstr(err, "opencl:P:D"));
  bp.device = "cpu";
  CHECK(ll_backend_create(&b, &bp, reason, sizeof reason, err, sizeof err) == 0 && strncmp(reason, "cpu:", 4) == 0);
  ll_backend_free(b);
  bp.device = "auto";
  CHECK(ll_backend_create(&b, &bp, reason, sizeof reason, err, sizeof err) == 0 && reason[0]);
  printf("device choice: %s\n", reason);
  ll_backend_free(b);
}

// The packed decode layouts (ll_pack_rows, tile_packed; Q4_0, Q4_1, Q8_0, Q5_0): the copy
// round-trips to the rows, and the packed tile gives its kernel set's vec_dot's bits (the
// tiles' contract; vec_dot itself is held to the scalar reference in test_dots) for 1..4
// tokens, extremes included (every nibble 15 or 0 - Q5_0 with every fifth bit set or clear -,
// Q8_0 quants -127 or 127, against activations of -127 / 127, the quantizer's range: Q4_0's
// int16 reduction levels near their limits); the backend's matmul over a packed weight equals
// the one over its rows bit for bit, ragged tails included.
static void test_packed(void) {
  CHECK(ll_pack_rows(LL_TYPE_Q5_1, NULL, 0, 8, 32, NULL) == -1 && ll_pack_rows(LL_TYPE_Q4_0, NULL, 0, 12, 32, NULL) == -1);
  CHECK(ll_pack_rows(LL_TYPE_Q4_1, NULL, 0, 8, 48, NULL) == -1 && ll_unpack_row(LL_TYPE_Q5_1, NULL, 0, 256, NULL) == -1);
  CHECK(ll_pack_rows(LL_TYPE_Q6_K, NULL, 0, 8, 128, NULL) == -1 && ll_unpack_row(LL_TYPE_Q4_K, NULL, 0, 288, NULL) == -1);
  // (the K-quants' groups are their rows' super-blocks, whole)
  enum { NT = 7 };
  static const int types[NT] = {LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q8_0, LL_TYPE_Q5_0, LL_TYPE_Q4_K, LL_TYPE_Q5_K, LL_TYPE_Q6_K};
  for (int trial = 0; trial < 280; trial++) {
    const int type = types[trial % NT], unit = ll_type_traits_get(type)->blck_size; // 32, 256
    const struct ll_type_kernels *k = ll_cpu_kernels(type), *ref = ll_cpu_kernels_ref(type);
    const int K = unit * (1 + (int)(ll_test_rand(&rs) % (768 / unit))), G = 1 + (int)(ll_test_rand(&rs) % 3), N = 8 * G, nb = K / unit;
    const size_t rsz = ll_row_size(type, K), asz = ll_row_size(k->act_type, K), bs = rsz / (size_t)nb, abs_ = asz / (size_t)nb;
    unsigned char *W = malloc(rsz * N), *P = malloc(rsz * N), *back = malloc(rsz), *A = malloc(asz * 4);
    float *sc = malloc(sizeof(float) * nb * 4), out[4][24];
    int32_t *ss = malloc(sizeof(int32_t) * nb * 4);
    const int extreme = trial % 16 >= 12 && unit == 32; // the extremes above
    for (int n = 0; n < N; n++) random_row(type, W + rsz * n, K);
    float x[768];
    for (int t = 0; t < 4; t++) {
      for (int i = 0; i < K; i++) x[i] = ll_test_randf(&rs);
      ref->from_float(x, A + asz * t, K);
    }
    for (int n = 0; extreme && n < N; n++) // the nibbles end each weight block, the quants each activation block
      for (int i = 0; i < nb; i++)
        if (type == LL_TYPE_Q8_0) memset(W + rsz * n + bs * (i + 1) - 32, n % 2 ? 0x7F : 0x81, 32);
        else memset(W + rsz * n + bs * (i + 1) - (type == LL_TYPE_Q5_0 ? 20 : 16), n % 2 ? 0x00 : 0xFF, type == LL_TYPE_Q5_0 ? 20 : 16);
    for (int t = 0; extreme && t < 4; t++)
      for (int i = 0; i < nb; i++) memset(A + asz * t + abs_ * (i + 1) - 32, t % 2 ? 0x7F : 0x81, 32);
    CHECK(ll_pack_rows(type, W, rsz, N, K, P) == 0);
    int same = 1;
    for (int n = 0; n < N; n++) same &= ll_unpack_row(type, P, n, K, back) == 0 && memcmp(back, W + rsz * n, rsz) == 0;
    CHECKF(same, "%s K=%d N=%d: a packed row does not unpack to itself", ll_type_name(type), K, N);
    for (int t = 0; t < 4; t++) ll_act_side(k->act_type, A + asz * t, K, sc + t, ss + t, 4);
    for (int na = 1; k->tile_packed && na <= 4; na++) { // (the scalar set has none: the pack itself is tested above)
      int bad = 0;
      for (int g = 0; g < G; g++) {
        k->tile_packed(K, P + (size_t)g * 8 * rsz, A, asz, na, sc, ss, 4, &out[0][8 * g], 24);
        for (int t = 0; t < na; t++)
          for (int r = 0; r < 8; r++) {
            float d;
            k->vec_dot(K, &d, W + rsz * (8 * g + r), A + asz * t);
            bad += memcmp(&d, &out[t][8 * g + r], sizeof d) != 0;
          }
      }
      CHECKF(bad == 0, "tile_packed %s K=%d na=%d%s: %d outputs differ from vec_dot", ll_type_name(type), K, na,
             extreme ? " (extremes)" : "", bad);
    }
    free(W), free(P), free(back), free(A), free(sc), free(ss);
  }
  // Through the backend: the same matmul with and without the packed copy, bit for bit, T on
  // both sides of packed_max_t, ragged N (the rows past the last whole group use the row tiles),
  // with and without accumulation.
  struct ll_backend *b;
  char err[256];
  CHECK(ll_backend_cpu_create(&b, 2, err, sizeof err) == 0);
  for (int trial = 0; trial < 112; trial++) {
    const int type = types[trial % NT], unit = ll_type_traits_get(type)->blck_size;
    const struct ll_type_kernels *k = ll_cpu_kernels(type);
    const int K = unit * (1 + (int)(ll_test_rand(&rs) % (768 / unit))), N = 1 + (int)(ll_test_rand(&rs) % 90), T = 1 + (int)(ll_test_rand(&rs) % 11);
    const size_t rsz = ll_row_size(type, K);
    unsigned char *W = malloc(rsz * N);
    float *x = malloc(sizeof(float) * T * K), *o1 = malloc(sizeof(float) * T * N), *o2 = malloc(sizeof(float) * T * N);
    for (int n = 0; n < N; n++) random_row(type, W + rsz * n, K);
    for (int i = 0; i < T * K; i++) x[i] = ll_test_randf(&rs);
    struct ll_weight w = {type, K, N, W, NULL, NULL};
    for (int i = 0; i < T * N; i++) o1[i] = o2[i] = 0.25f * (float)i;
    const int acc = (trial / NT) & 1, T1 = trial % (2 * NT) < NT ? 1 : T; // half the trials decode (T = 1)
    CHECK(b->i->matmul(b, o1, x, &w, T1, acc) == 0);
    const int64_t bytes = ll_cpu_weight_pack(&w);
    CHECKF(bytes == (k->tile_packed && N >= 8 ? (int64_t)(rsz * (size_t)(N - N % 8)) : 0), "pack of %s N=%d: %lld bytes", ll_type_name(type), N,
           (long long)bytes);
    CHECK(b->i->matmul(b, o2, x, &w, T1, acc) == 0);
    CHECKF(memcmp(o1, o2, sizeof(float) * T1 * N) == 0, "matmul %s K=%d N=%d T=%d acc=%d: packed differs from the rows", ll_type_name(type),
           K, N, T1, acc);
    ll_cpu_weight_unpack(&w);
    CHECK(w.packed == NULL);
    if (bytes > 0) { // into a caller's block: too small is refused and leaves w as it was
      void *blk = ll_cpu_stream_alloc((size_t)bytes);
      CHECK(blk != NULL);
      CHECK(ll_cpu_weight_pack_into(&w, blk, bytes - 1) == LL_EINVAL && w.packed == NULL);
      CHECK(ll_cpu_weight_pack_into(&w, blk, bytes) == bytes && w.packed == blk);
      for (int i = 0; i < T * N; i++) o2[i] = 0.25f * (float)i;
      CHECK(b->i->matmul(b, o2, x, &w, T1, acc) == 0);
      CHECK(memcmp(o1, o2, sizeof(float) * T1 * N) == 0);
      w.packed = NULL;
      ll_cpu_stream_free(blk);
    }
    free(W), free(x), free(o1), free(o2);
  }
  // matmul_n (q, k, v; gate, up: one x, several matrices, one hand-off to the threads) equals
  // one matmul per matrix bit for bit: same type and K (fused; packed or not, T on both sides
  // of packed_max_t and of the sgemm threshold), and mixed types (one matmul each).
  for (int trial = 0; trial < 42; trial++) {
    const int n = 2 + trial % 3, mixed = trial % 4 == 3, kq = ll_type_traits_get(types[trial % NT])->blck_size == 256;
    const int K = (mixed || kq ? 256 * (1 + (int)(ll_test_rand(&rs) % 3)) : 32 * (1 + (int)(ll_test_rand(&rs) % 24)));
    const int T = trial % 2 ? 1 + (int)(ll_test_rand(&rs) % 4) : 1 + (int)(ll_test_rand(&rs) % 40);
    struct ll_weight ws[4];
    const struct ll_weight *wp[4];
    float *o1[4], *o2[4];
    unsigned char *W[4];
    float *x = malloc(sizeof(float) * T * K);
    for (int i = 0; i < T * K; i++) x[i] = ll_test_randf(&rs);
    for (int i = 0; i < n; i++) {
      const int type = mixed ? types[(i + trial) % NT] : types[trial % NT], N = 1 + (int)(ll_test_rand(&rs) % 70);
      const size_t rsz = ll_row_size(type, K);
      W[i] = malloc(rsz * N);
      for (int r = 0; r < N; r++) random_row(type, W[i] + rsz * r, K);
      ws[i] = (struct ll_weight){type, K, N, W[i], NULL, NULL};
      if (trial % 3) CHECK(ll_cpu_weight_pack(&ws[i]) >= 0);
      wp[i] = &ws[i];
      o1[i] = malloc(sizeof(float) * T * N), o2[i] = malloc(sizeof(float) * T * N);
      CHECK(b->i->matmul(b, o1[i], x, &ws[i], T, 0) == 0);
    }
    CHECK(ll_backend_matmul_n(b, n, o2, x, wp, T) == 0);
    int diff = 0;
    for (int i = 0; i < n; i++) diff += memcmp(o1[i], o2[i], sizeof(float) * T * (size_t)ws[i].n) != 0;
    CHECKF(diff == 0, "matmul_n of %d matrices (K=%d T=%d%s): %d differ from matmul", n, K, T, mixed ? ", mixed types" : "", diff);
    for (int i = 0; i < n; i++) ll_cpu_weight_unpack(&ws[i]), free(W[i]), free(o1[i]), free(o2[i]);
    free(x);
  }
  ll_backend_free(b);
}

int main(void) {
  rs = ll_test_seed();
  test_dots();
  test_threadpool();
  test_backend_ops();
  test_packed();
  return ll_test_summary();
}
