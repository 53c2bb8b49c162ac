// dot.c - scalar reference dot products (the definition the SIMD versions are tested against)
// and run-time selection of the best implementation.
#include <math.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ll_cpu_dot.h"
#include "ll_quant.h"

#define H2F(x) ll_fp16_to_fp32(x)

// Q4_0 in the order llama.cpp computes it on x86 (AVX2 and up): it repacks every Q4_0 matrix whose
// row count is a multiple of 8 into interleaved rows, and its GEMV/GEMM there take each block's
// exact integer sum, then sum = fma(float(si), d_w * d_a, sum) block by block (d_w * d_a of
// two halves is exact in float). Every ISA here computes exactly this, so all are
// bit-identical to this reference.
static void dot_q4_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_0 *x = w;
  const ll_block_q8_0 *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    int si = 0;
    for (int j = 0; j < 16; j++) {
      si += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
      si += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    }
    sum = fmaf((float)si, H2F(x[i].d) * H2F(y[i].d), sum);
  }
  *s = sum;
}

static void dot_q4_1_q8_1(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_1 *x = w;
  const ll_block_q8_1 *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    int si = 0;
    for (int j = 0; j < 16; j++) si += (x[i].qs[j] & 0x0F) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
    sum += (H2F(x[i].d) * H2F(y[i].d)) * si + H2F(x[i].m) * H2F(y[i].s);
  }
  *s = sum;
}

static void dot_q5_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q5_0 *x = w;
  const ll_block_q8_0 *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    int si = 0;
    for (int j = 0; j < 16; j++) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      si += (((x[i].qs[j] & 0x0F) | h0) - 16) * y[i].qs[j] + (((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + 16];
    }
    sum += si * H2F(x[i].d) * H2F(y[i].d);
  }
  *s = sum;
}

static void dot_q5_1_q8_1(int n, float *s, const void *w, const void *a) {
  const ll_block_q5_1 *x = w;
  const ll_block_q8_1 *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    int si = 0;
    for (int j = 0; j < 16; j++) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      si += ((x[i].qs[j] & 0x0F) | h0) * y[i].qs[j] + ((x[i].qs[j] >> 4) | h1) * y[i].qs[j + 16];
    }
    sum += (H2F(x[i].d) * H2F(y[i].d)) * si + H2F(x[i].m) * H2F(y[i].s);
  }
  *s = sum;
}

static void dot_q8_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q8_0 *x = w, *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    int si = 0;
    for (int j = 0; j < 32; j++) si += x[i].qs[j] * y[i].qs[j];
    sum += si * (H2F(x[i].d) * H2F(y[i].d));
  }
  *s = sum;
}

// K-quants: dequantize one 256-block of weights and dot with the Q8_K activations
// (d * Σ q·w_int); exact integer sums per sub-block as the reference definition.

static void dot_q4_K_q8_K(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_K *x = w;
  const ll_block_q8_K *y = a;
  float sum = 0;
  for (int i = 0; i < n / 256; i++) {
    int isum = 0, msum = 0;
    const uint8_t *q = x[i].qs;
    for (int j = 0; j < 4; j++, q += 32) { // 64 elements per step: low nibbles then high
      int sc0, m0, sc1, m1, s0 = 0, s1 = 0;
      k_scale_min(2 * j, x[i].scales, &sc0, &m0);
      k_scale_min(2 * j + 1, x[i].scales, &sc1, &m1);
      for (int l = 0; l < 32; l++) {
        s0 += (q[l] & 0x0F) * y[i].qs[64 * j + l];
        s1 += (q[l] >> 4) * y[i].qs[64 * j + 32 + l];
      }
      isum += sc0 * s0 + sc1 * s1;
      msum += m0 * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) + m1 * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
    }
    sum += y[i].d * (H2F(x[i].d) * isum - H2F(x[i].dmin) * msum);
  }
  *s = sum;
}

static void dot_q5_K_q8_K(int n, float *s, const void *w, const void *a) {
  const ll_block_q5_K *x = w;
  const ll_block_q8_K *y = a;
  float sum = 0;
  for (int i = 0; i < n / 256; i++) {
    int isum = 0, msum = 0;
    const uint8_t *q = x[i].qs, *qh = x[i].qh;
    for (int j = 0; j < 4; j++, q += 32) {
      int sc0, m0, sc1, m1, s0 = 0, s1 = 0;
      k_scale_min(2 * j, x[i].scales, &sc0, &m0);
      k_scale_min(2 * j + 1, x[i].scales, &sc1, &m1);
      for (int l = 0; l < 32; l++) {
        s0 += ((q[l] & 0x0F) + ((qh[l] >> (2 * j)) & 1) * 16) * y[i].qs[64 * j + l];
        s1 += ((q[l] >> 4) + ((qh[l] >> (2 * j + 1)) & 1) * 16) * y[i].qs[64 * j + 32 + l];
      }
      isum += sc0 * s0 + sc1 * s1;
      msum += m0 * (y[i].bsums[4 * j] + y[i].bsums[4 * j + 1]) + m1 * (y[i].bsums[4 * j + 2] + y[i].bsums[4 * j + 3]);
    }
    sum += y[i].d * (H2F(x[i].d) * isum - H2F(x[i].dmin) * msum);
  }
  *s = sum;
}

static void dot_q6_K_q8_K(int n, float *s, const void *w, const void *a) {
  const ll_block_q6_K *x = w;
  const ll_block_q8_K *y = a;
  float sum = 0;
  for (int i = 0; i < n / 256; i++) {
    int isum = 0;
    for (int half = 0; half < 2; half++) {
      const uint8_t *ql = x[i].ql + 64 * half, *qh = x[i].qh + 32 * half;
      const int8_t *sc = x[i].scales + 8 * half, *q8 = y[i].qs + 128 * half;
      for (int l = 0; l < 32; l++) {
        const int is = l / 16;
        const int q1 = (int)((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = (int)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        isum += sc[is] * q1 * q8[l] + sc[is + 2] * q2 * q8[l + 32] + sc[is + 4] * q3 * q8[l + 64] + sc[is + 6] * q4 * q8[l + 96];
      }
    }
    sum += H2F(x[i].d) * y[i].d * isum;
  }
  *s = sum;
}

static void dot_f32(int n, float *s, const void *w, const void *a) {
  const float *x = w, *y = a;
  double sum = 0; // reference: accumulate in double
  for (int i = 0; i < n; i++) sum += (double)x[i] * y[i];
  *s = (float)sum;
}

static void dot_f16(int n, float *s, const void *w, const void *a) {
  const ll_fp16 *x = w, *y = a;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (double)H2F(x[i]) * H2F(y[i]);
  *s = (float)sum;
}

static void dot_bf16(int n, float *s, const void *w, const void *a) {
  const ll_bf16 *x = w, *y = a;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (double)ll_bf16_to_fp32(x[i]) * ll_bf16_to_fp32(y[i]);
  *s = (float)sum;
}

#define FROM(T)                                                                                    \
  static void from_##T(const float *x, void *y, int64_t n) { ll_quantize_row(LL_TYPE_##T, x, y, n); }
FROM(Q8_K)

// Activation quantizers as llama.cpp's CPU backend computes them on x86 (its SIMD path, not
// ggml's *_ref): scale d = amax/127 stored as fp16, multiplier 127/amax, round half to even,
// s = d * Σq. Written in scalar C so every ISA (and the scalar fallback) produces these bytes.
// Round half to even for |v| <= 127.5 (adding and removing 1.5 * 2^23 leaves the integer that
// the default rounding mode picks; cheaper than nearbyintf, which saves the FP environment).
static inline float round_even(float v) {
  volatile float big = 12582912.0f; // volatile: keep the compiler from folding the round trip
  return (v + big) - big;
}

void ll_act_quantize_q8_0(const float *x, void *vy, int64_t n) {
  ll_block_q8_0 *y = vy;
  for (int64_t i = 0; i < n / 32; i++, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = ll_fp32_to_fp16(d);
    for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)round_even(x[j] * id);
  }
}

void ll_act_quantize_q8_1(const float *x, void *vy, int64_t n) {
  ll_block_q8_1 *y = vy;
  for (int64_t i = 0; i < n / 32; i++, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = ll_fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += y[i].qs[j] = (int8_t)round_even(x[j] * id);
    y[i].s = ll_fp32_to_fp16(d * (float)sum);
  }
}
#define from_Q8_0 ll_act_quantize_q8_0
#define from_Q8_1 ll_act_quantize_q8_1
FROM(F16)
FROM(BF16)
FROM(F32)

static const struct ll_type_kernels ref_table[LL_TYPE_COUNT] = {
    [LL_TYPE_F32] = {LL_TYPE_F32, from_F32, dot_f32, "scalar", NULL},
    [LL_TYPE_F16] = {LL_TYPE_F16, from_F16, dot_f16, "scalar", NULL},
    [LL_TYPE_BF16] = {LL_TYPE_BF16, from_BF16, dot_bf16, "scalar", NULL},
    [LL_TYPE_Q4_0] = {LL_TYPE_Q8_0, from_Q8_0, dot_q4_0_q8_0, "scalar", NULL},
    [LL_TYPE_Q4_1] = {LL_TYPE_Q8_1, from_Q8_1, dot_q4_1_q8_1, "scalar", NULL},
    [LL_TYPE_Q5_0] = {LL_TYPE_Q8_0, from_Q8_0, dot_q5_0_q8_0, "scalar", NULL},
    [LL_TYPE_Q5_1] = {LL_TYPE_Q8_1, from_Q8_1, dot_q5_1_q8_1, "scalar", NULL},
    [LL_TYPE_Q8_0] = {LL_TYPE_Q8_0, from_Q8_0, dot_q8_0_q8_0, "scalar", NULL},
    [LL_TYPE_Q4_K] = {LL_TYPE_Q8_K, from_Q8_K, dot_q4_K_q8_K, "scalar", NULL},
    [LL_TYPE_Q5_K] = {LL_TYPE_Q8_K, from_Q8_K, dot_q5_K_q8_K, "scalar", NULL},
    [LL_TYPE_Q6_K] = {LL_TYPE_Q8_K, from_Q8_K, dot_q6_K_q8_K, "scalar", NULL},
};

const struct ll_type_kernels *ll_cpu_kernels_ref(int t) {
  if (t < 0 || t >= LL_TYPE_COUNT || !ref_table[t].vec_dot) return NULL;
  return &ref_table[t];
}

static int have_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
  static int cached = -1;
  if (cached < 0) {
    // F16C is CPUID.1:ECX bit 29 (older compilers do not know it in __builtin_cpu_supports).
    unsigned a, b, c, d;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }
  return cached;
#else
  return 0;
#endif
}

static int have_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
  static int cached = -1;
  if (cached < 0) {
    // LL_CPU_ISA=avx2 pins the AVX2 kernels (benchmarks and tests compare the two levels).
    const char *pin = getenv("LL_CPU_ISA");
    cached = have_avx2() && !(pin && (!strcmp(pin, "avx2") || !strcmp(pin, "scalar"))) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return cached;
#else
  return 0;
#endif
}

// NEON is part of every AArch64 CPU, so there it is a build-time choice, not a cpuid one.
#if defined(__aarch64__) && defined(__ARM_NEON)
const char *ll_cpu_isa(void) { return "neon"; }
#else
const char *ll_cpu_isa(void) { return have_avx512() ? "avx512vnni" : have_avx2() ? "avx2" : "scalar"; }
// (dot_neon.c is compiled to nothing here; the stub keeps callers and tests portable.)
const struct ll_type_kernels *ll_cpu_kernels_neon(int t) { (void)t; return NULL; }
#endif

#if !(defined(__x86_64__) || defined(__i386__))
const struct ll_type_kernels *ll_cpu_kernels_avx512(int t) { (void)t; return NULL; }
const struct ll_type_kernels *ll_cpu_kernels_avx2(int t) { (void)t; return NULL; }
const struct ll_f16_ops *ll_cpu_f16_ops_avx2(void) { return NULL; }
const struct ll_vec_ops *ll_cpu_vec_ops_avx2(void) { return NULL; }
#endif

// Same lane structure as the AVX2 version (and ggml's f16 dot): 32 lanes accumulated with
// fused multiply-add, reduced pairwise in a fixed tree, the tail added in double. The scalar
// reference therefore gives bit-identical results to the SIMD path.
static float ref_dot_f32_f16(const float *q, const uint16_t *k, int n) {
  float lane[32] = {0};
  const int np = n - n % 32;
  for (int i = 0; i < np; i += 32)
    for (int j = 0; j < 32; j++) lane[j] = fmaf(q[i + j], ll_fp16_to_fp32(k[i + j]), lane[j]);
  float x[8];
  for (int e = 0; e < 8; e++) x[e] = (lane[e] + lane[16 + e]) + (lane[8 + e] + lane[24 + e]);
  const float t0 = x[0] + x[4], t1 = x[1] + x[5], t2 = x[2] + x[6], t3 = x[3] + x[7];
  double sum = (t0 + t1) + (t2 + t3);
  for (int i = np; i < n; i++) sum += (double)(q[i] * ll_fp16_to_fp32(k[i]));
  return (float)sum;
}

static void ref_axpy_f16(float *o, const uint16_t *v, float w, int n) {
  for (int i = 0; i < n; i++) o[i] = fmaf(w, ll_fp16_to_fp32(v[i]), o[i]); // fused, as the SIMD path
}

static void ref_from_f32(uint16_t *dst, const float *src, int n) {
  for (int i = 0; i < n; i++) dst[i] = ll_fp32_to_fp16(src[i]);
}

static void ref_round_f16(float *dst, const float *src, float mul, int n) {
  for (int i = 0; i < n; i++) dst[i] = ll_fp16_to_fp32(ll_fp32_to_fp16(src[i] * mul));
}

static void ref_dot_rows_f16(float *s, const float *q, const uint16_t *const *k, int rows, int n) {
  for (int p = 0; p < rows; p++) s[p] = ref_dot_f32_f16(q, k[p], n);
}

// The weighted sum as llama.cpp computes it (V^T · probabilities through ggml's f16 dot):
// 32 lanes, position p fused into lane p % 32, then the fixed reduction tree per element.
static void ref_wsum_rows_f16(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes) {
  memset(lanes, 0, (size_t)32 * n * sizeof *lanes);
  for (int p = 0; p < rows; p++) ref_axpy_f16(lanes + (size_t)(p % 32) * n, v[p], w[p], n);
  for (int i = 0; i < n; i++) {
    float x[8];
    for (int e = 0; e < 8; e++)
      x[e] = (lanes[(size_t)e * n + i] + lanes[(size_t)(16 + e) * n + i]) + (lanes[(size_t)(8 + e) * n + i] + lanes[(size_t)(24 + e) * n + i]);
    o[i] = ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
  }
}

static float hsum8_tree(const float *l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

static void ref_dot_rows8_f16(float *s, const float *q, const uint16_t *const *k, int rows, int n) {
  for (int p = 0; p < rows; p++) {
    float l[8] = {0};
    for (int i = 0; i < n; i += 8)
      for (int e = 0; e < 8; e++) l[e] = fmaf(q[i + e], ll_fp16_to_fp32(k[p][i + e]), l[e]);
    s[p] = hsum8_tree(l);
  }
}

static void ref_wsum_rows8_f16(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes) {
  (void)lanes;
  for (int i = 0; i < n; i++) {
    float l[8] = {0};
    for (int p = 0; p < rows; p++) l[p % 8] = fmaf(ll_fp16_to_fp32(v[p][i]), w[p], l[p % 8]);
    o[i] = hsum8_tree(l);
  }
}

static const struct ll_f16_ops f16_ref = {ref_dot_f32_f16, ref_axpy_f16, ref_from_f32, ref_round_f16, ref_dot_rows_f16, ref_wsum_rows_f16,
                                          ref_dot_rows8_f16, ref_wsum_rows8_f16};
const struct ll_f16_ops *ll_cpu_f16_ops_ref(void) { return &f16_ref; }
const struct ll_f16_ops *ll_cpu_f16_ops(void) {
  const struct ll_f16_ops *o = have_avx2() ? ll_cpu_f16_ops_avx2() : NULL;
  return o ? o : &f16_ref;
}

// ---- ggml_v_expf (AVX2 version), one lane ----
static float ggml_expf_lane(float x) {
  const float r = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  const uint32_t e = f32_bits(z) << 23;
  const float k = f32_from(e + f32_bits(1.0f));
  const float u = b * b;
  const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u, 0x1.ffffecp-1f * b);
  const float an = fabsf(n);
  if (!(an > 126.0f)) return fmaf(j, k, k); // (NaN compares false, as _CMP_GT_OQ)
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = f32_from(g + 0x7f000000u), s2 = f32_from(e - g);
  if (an > 192.0f) return s1 * s1;
  return fmaf(s2, j, s2) * s1;
}

static double ref_softmax(float *y, const float *x, float max, int n) {
  double sum = 0;
  for (int i = 0; i < n; i += 8) {
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = i + l < n ? ggml_expf_lane(x[i + l] - max) : 0.0f; // masked lanes: exactly 0
    for (int l = 0; l < 8 && i + l < n; l++) y[i + l] = v[l];
    const float a0 = v[4] + v[0], a1 = v[5] + v[1], a2 = v[6] + v[2], a3 = v[7] + v[3];
    sum += (double)((a0 + a2) + (a1 + a3));
  }
  return sum;
}

static void ref_swiglu(float *out, const float *g, const float *up, int64_t n) {
  const int64_t n8 = n - n % 8; // ggml: groups of 8 with ggml_v_silu, then libm for the tail
  int64_t i = 0;
  for (; i < n8; i++) out[i] = (g[i] / (1.0f + ggml_expf_lane(0.0f - g[i]))) * up[i];
  for (; i < n; i++) out[i] = (g[i] / (1.0f + expf(-g[i]))) * up[i];
}

// GeGLU's gelu as ggml's CPU reads it (GGML_GELU_FP16): a table of f16(gelu(h)) for every f16
// h, looked up at f16(x); built on first use the way ggml builds it.
static float gelu_tanh_f(float x) {
  const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f; // ggml's constants
  return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}
static float gelu_table[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;
static void gelu_table_init(void) {
  for (int i = 0; i < 1 << 16; i++) gelu_table[i] = ll_fp16_to_fp32(ll_fp32_to_fp16(gelu_tanh_f(ll_fp16_to_fp32((ll_fp16)i))));
}
const float *ll_cpu_gelu_f16_table(void) {
  pthread_once(&gelu_once, gelu_table_init);
  return gelu_table;
}
static void ref_geglu_f16(float *out, const float *g, const float *up, int64_t n) {
  const float *tab = ll_cpu_gelu_f16_table();
  for (int64_t i = 0; i < n; i++) {
    const float x = g[i];
    out[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x * up[i] : tab[ll_fp32_to_fp16(x)] * up[i];
  }
}

static void ref_rope_pairs(float *v, const float *cs, const float *sn, int n_pairs, int neox) { ll_rope_pairs_impl(v, cs, sn, n_pairs, neox); }

// Scalar references of llama.cpp's F32 dot orders (ll_cpu_dot.h); fmaf is the fused step.
static float ggml_f32_tail(const float *x, const float *y, int i, int n, float sum) {
  if (n - i > 7) {
    for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; l++) sum += x[i + l] * y[i + l];
    if (n - i >= 4) {
      for (int l = 0; l < 4; l++) sum += x[i + l] * y[i + l];
      i += 4;
    }
  }
  for (; i < n; i++) sum = fmaf(x[i], y[i], sum);
  return sum;
}
static float ref_dot_f32_ggml(const float *x, const float *y, int n) {
  float a[4][8] = {{0}};
  const int np = n & ~31;
  for (int i = 0; i < np; i += 32)
    for (int j = 0; j < 4; j++)
      for (int l = 0; l < 8; l++) a[j][l] = fmaf(x[i + j * 8 + l], y[i + j * 8 + l], a[j][l]);
  float v[8], t[4];
  for (int l = 0; l < 8; l++) v[l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
  for (int l = 0; l < 4; l++) t[l] = v[l + 4] + v[l];
  return ggml_f32_tail(x, y, np, n, (t[0] + t[1]) + (t[2] + t[3]));
}
static float ref_dot_f32_tile8(const float *x, const float *y, int n) {
  float l[8] = {0};
  for (int e = 0; e < n; e++) l[e % 8] = fmaf(x[e], y[e], l[e % 8]);
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
float ll_cpu_ggml_f32_tail(const float *x, const float *y, int i, int n, float sum) { return ggml_f32_tail(x, y, i, n, sum); }

static const struct ll_vec_ops vec_ref = {ref_softmax, ref_swiglu, ref_rope_pairs, ref_dot_f32_ggml, ref_dot_f32_tile8, ll_dequantize_row,
                                          ref_geglu_f16};
const struct ll_vec_ops *ll_cpu_vec_ops_ref(void) { return &vec_ref; }
const struct ll_vec_ops *ll_cpu_vec_ops(void) {
  const struct ll_vec_ops *o = have_avx2() ? ll_cpu_vec_ops_avx2() : NULL;
  return o ? o : &vec_ref;
}

void ll_act_t16_q8_0(const void *act, size_t a_stride, int ng, int64_t k, void *out) {
  const int64_t nb = k / 32;
  uint8_t *o = out;
  for (int g = 0; g < ng; g++)
    for (int64_t i = 0; i < nb; i++)
      for (int t = 0; t < 16; t++) {
        const ll_block_q8_0 *b = (const ll_block_q8_0 *)(const void *)((const char *)act + (size_t)(16 * g + t) * a_stride) + i;
        for (int e = 0; e < 32; e++) o[(((size_t)g * (size_t)nb + (size_t)i) * 8 + (size_t)(e / 4)) * 64 + 4 * (size_t)t + (size_t)(e % 4)] = (uint8_t)(b->qs[e] ^ 0x80);
      }
}

void ll_act_t16_q8_K(const void *act, size_t a_stride, int ng, int64_t k, void *out) {
  const int64_t nsb = k / 256;
  for (int g = 0; g < ng; g++)
    for (int64_t i = 0; i < nsb; i++) {
      uint8_t *o = (uint8_t *)out + ((size_t)g * (size_t)nsb + (size_t)i) * LL_T16_Q8K_BYTES;
      for (int t = 0; t < 16; t++) {
        const ll_block_q8_K *b = (const ll_block_q8_K *)(const void *)((const char *)act + (size_t)(16 * g + t) * a_stride) + i;
        for (int e = 0; e < 256; e++) o[(e / 4) * 64 + 4 * t + e % 4] = (uint8_t)(b->qs[e] ^ 0x80);
        for (int j = 0; j < 16; j++) {
          const int32_t v = b->bsums[j];
          memcpy(o + 4096 + 64 * j + 4 * t, &v, 4);
        }
        memcpy(o + 4096 + 1024 + 4 * t, &b->d, 4);
      }
    }
}

int ll_act_side(int act_type, const void *row, int64_t n, float *sc, int32_t *ss, size_t stride) {
  if (act_type == LL_TYPE_Q8_0) {
    const ll_block_q8_0 *b = row;
    for (int64_t i = 0; i < n / 32; i++) {
      int32_t s = 0;
      for (int j = 0; j < 32; j++) s += b[i].qs[j];
      sc[(size_t)i * stride] = ll_fp16_to_fp32(b[i].d);
      ss[(size_t)i * stride] = -8 * s;
    }
    return 0;
  }
  if (act_type == LL_TYPE_Q8_1) {
    const ll_block_q8_1 *b = row;
    for (int64_t i = 0; i < n / 32; i++) {
      const float s = ll_fp16_to_fp32(b[i].s);
      sc[(size_t)i * stride] = ll_fp16_to_fp32(b[i].d);
      memcpy(&ss[(size_t)i * stride], &s, sizeof s);
    }
    return 0;
  }
  return -1;
}

// Groups of 8 interleaved rows (ll_cpu_dot.h): per block, the rows' scales (Q4_0 and Q5_0 in
// the kernel's lane order 0 2 4 6 1 3 5 7; Q4_1 and Q8_0 in row order; then Q4_1's mins or
// Q5_0's qh in row order), then each row's quants.
enum { PACK_ROWS = 8 };
static const int pack_q4_0_order[PACK_ROWS] = {0, 2, 4, 6, 1, 3, 5, 7};

// The block size, the bytes of quants per row and block, and where the scales end (0: not packed).
static size_t pack_shape(int type, size_t *nq, size_t *qoff) {
  switch (type) {
  case LL_TYPE_Q4_0: *nq = 16, *qoff = 2 * PACK_ROWS; return sizeof(ll_block_q4_0);
  case LL_TYPE_Q4_1: *nq = 16, *qoff = 4 * PACK_ROWS; return sizeof(ll_block_q4_1);
  case LL_TYPE_Q8_0: *nq = 32, *qoff = 2 * PACK_ROWS; return sizeof(ll_block_q8_0);
  case LL_TYPE_Q5_0: *nq = 16, *qoff = 6 * PACK_ROWS; return sizeof(ll_block_q5_0);
  // whole super-blocks (nothing before the quants: *nq is the block)
  case LL_TYPE_Q4_K: *nq = sizeof(ll_block_q4_K), *qoff = 0; return sizeof(ll_block_q4_K);
  case LL_TYPE_Q5_K: *nq = sizeof(ll_block_q5_K), *qoff = 0; return sizeof(ll_block_q5_K);
  case LL_TYPE_Q6_K: *nq = sizeof(ll_block_q6_K), *qoff = 0; return sizeof(ll_block_q6_K);
  default: return 0;
  }
}

// Q5_0's fifth bits in bit planes, 32 bytes per block for the 8 rows: row r = 2k + h (pair k,
// half h) puts element j's bit (j < 16) in bit 2k of byte 16h + j and element 16 + j's in bit
// 2k + 1 of the same byte. That byte is where the kernel's pair k holds the element's nibble
// (low nibbles of rows 2k | 2k+1 in one ymm, high nibbles in another), so one shift and one
// and per ymm put the bits in place, where bytes_from_bits needed five operations.
static void pack_q5_0_qh(uint8_t *h, int r, const uint8_t qh4[4]) {
  const uint32_t qh = (uint32_t)qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 | (uint32_t)qh4[3] << 24;
  const int k = r / 2, half = r % 2;
  for (int j = 0; j < 16; j++) {
    uint8_t *byte = &h[16 * half + j];
    *byte = (uint8_t)(*byte | ((qh >> j) & 1u) << 2 * k | ((qh >> (16 + j)) & 1u) << (2 * k + 1));
  }
}
static void unpack_q5_0_qh(const uint8_t *h, int r, uint8_t qh4[4]) {
  const int k = r / 2, half = r % 2;
  uint32_t qh = 0;
  for (int j = 0; j < 16; j++) {
    const unsigned byte = h[16 * half + j];
    qh |= ((byte >> 2 * k) & 1u) << j | ((byte >> (2 * k + 1)) & 1u) << (16 + j);
  }
  for (int i = 0; i < 4; i++) qh4[i] = (uint8_t)(qh >> 8 * i);
}

int ll_pack_rows(int type, const void *rows, size_t row_stride, int64_t nrows, int64_t k, void *out) {
  size_t nq, qs;
  const size_t bs = pack_shape(type, &nq, &qs);
  const int64_t blk = bs && nq == bs ? 256 : 32; // elements per block
  if (!bs || k <= 0 || k % blk != 0 || nrows < 0 || nrows % PACK_ROWS != 0) return -1;
  const int q41 = type == LL_TYPE_Q4_1;
  const int64_t nb = k / blk;
  for (int64_t g = 0; g < nrows / PACK_ROWS; g++)
    for (int64_t i = 0; i < nb; i++) {
      uint8_t *o = (uint8_t *)out + ((size_t)g * (size_t)nb + (size_t)i) * PACK_ROWS * bs;
      for (int j = 0; j < PACK_ROWS && qs > 0; j++) {
        const int r = type == LL_TYPE_Q4_0 || type == LL_TYPE_Q5_0 ? pack_q4_0_order[j] : j;
        const char *b = (const char *)rows + (size_t)(PACK_ROWS * g + r) * row_stride + (size_t)i * bs;
        memcpy(o + 2 * j, b, 2); // d
        if (q41) memcpy(o + 2 * PACK_ROWS + 2 * j, b + offsetof(ll_block_q4_1, m), 2);
      }
      if (type == LL_TYPE_Q5_0) memset(o + 2 * PACK_ROWS, 0, 4 * PACK_ROWS); // each row ors its bits in
      for (int r = 0; r < PACK_ROWS; r++) { // in row order: Q5_0's qh, and the quants (which end each block)
        const char *b = (const char *)rows + (size_t)(PACK_ROWS * g + r) * row_stride + (size_t)i * bs;
        if (type == LL_TYPE_Q5_0) pack_q5_0_qh(o + 2 * PACK_ROWS, r, (const uint8_t *)b + offsetof(ll_block_q5_0, qh));
        memcpy(o + qs + nq * r, b + bs - nq, nq);
      }
    }
  return 0;
}

int ll_unpack_row(int type, const void *packed, int64_t r, int64_t k, void *row) {
  size_t nq, qs;
  const size_t bs = pack_shape(type, &nq, &qs);
  const int64_t blk = bs && nq == bs ? 256 : 32;
  if (!bs || k <= 0 || k % blk != 0 || r < 0) return -1;
  const int64_t nb = k / blk, g = r / PACK_ROWS;
  const int rr = (int)(r % PACK_ROWS), lane = type == LL_TYPE_Q4_0 || type == LL_TYPE_Q5_0;
  const int slot = lane ? rr / 2 + (rr % 2) * 4 : rr; // Q4_0, Q5_0: the inverse of pack_q4_0_order
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *o = (const uint8_t *)packed + ((size_t)g * (size_t)nb + (size_t)i) * PACK_ROWS * bs;
    char *b = (char *)row + (size_t)i * bs;
    if (qs > 0) memcpy(b, o + 2 * slot, 2);
    if (type == LL_TYPE_Q4_1) memcpy(b + offsetof(ll_block_q4_1, m), o + 2 * PACK_ROWS + 2 * slot, 2);
    if (type == LL_TYPE_Q5_0) unpack_q5_0_qh(o + 2 * PACK_ROWS, rr, (uint8_t *)b + offsetof(ll_block_q5_0, qh));
    memcpy(b + bs - nq, o + qs + nq * rr, nq);
  }
  return 0;
}

const struct ll_type_kernels *ll_cpu_kernels(int t) {
  const struct ll_type_kernels *kn = ll_cpu_kernels_neon(t); // NULL off AArch64
  if (kn) return kn;
  if (have_avx512()) {
    const struct ll_type_kernels *k = ll_cpu_kernels_avx512(t);
    if (k) return k;
  }
  if (have_avx2()) {
    const struct ll_type_kernels *k = ll_cpu_kernels_avx2(t);
    if (k) return k;
  }
  return ll_cpu_kernels_ref(t);
}

double ll_cpu_softmax(float *y, const float *x, float max, int n) { return ll_cpu_vec_ops()->softmax(y, x, max, n); }
