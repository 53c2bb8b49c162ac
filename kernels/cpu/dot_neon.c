// dot_neon.c - AArch64 NEON dot products for Q4_0 (x Q8_0), Q4_1 (x Q8_1) and Q8_0 (x Q8_0)
// weights (compiled on aarch64 only; kernels/CMakeLists.txt leaves *_neon.c out elsewhere).
//
// Bit-identical to the scalar references in dot.c, by construction: NEON computes each block's
// integer sum Σ w·a, which is exact whatever the order (at most 32 products of |w| <= 128 and
// |a| <= 128, far from int32 overflow), and the per-block float step is the reference's own C
// expression in the reference's block order. Both files are built with the same flags
// (ISO C11: GCC does not contract a*b+c into fma there), so the same expression gives the
// same bits (Q4_0's step is an explicit fmaf in both). Do not reorder the float step here: the test (tests/cross)
// demands equality bit for bit, not a tolerance.
//
// Integer sums: baseline armv8-a has no 8-bit dot instruction, so products are widened with
// vmull_s8 (one product per int16 lane: |w·a| <= 128·128 = 16384 fits; two summed could
// overflow, so every product goes straight into int32 lanes with vpadalq_s16). With the
// dot-product extension (armv8.2-a+dotprod and later; __ARM_FEATURE_DOTPROD) vdotq_s32 sums
// groups of four into int32 lanes directly.
#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>
#include <math.h>
#include <stddef.h>

#include "ll_cpu_dot.h"
#include "ll_quant.h"

#define H2F(x) ll_fp16_to_fp32(x)

// Σ a[i]·b[i] over 16 signed bytes, added to the int32 lanes of acc.
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// One block of packed nibbles: elements 0..15 are the low nibbles, 16..31 the high ones
// (GGML's Q4 layout), as bytes 0..15 each.
static inline int block_q4(const uint8_t *qs, const int8_t *a, int8x16_t offset) {
  const uint8x16_t q = vld1q_u8(qs);
  const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), offset);
  const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), offset);
  int32x4_t acc = vdupq_n_s32(0);
  acc = dot16(acc, lo, vld1q_s8(a));
  acc = dot16(acc, hi, vld1q_s8(a + 16));
  return vaddvq_s32(acc);
}

static void neon_dot_q4_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_0 *x = w;
  const ll_block_q8_0 *y = a;
  const int8x16_t eight = vdupq_n_s8(8);
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    const int si = block_q4(x[i].qs, y[i].qs, eight);
    sum = fmaf((float)si, H2F(x[i].d) * H2F(y[i].d), sum); // dot.c's expression, unchanged
  }
  *s = sum;
}

static void neon_dot_q4_1_q8_1(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_1 *x = w;
  const ll_block_q8_1 *y = a;
  const int8x16_t zero = vdupq_n_s8(0); // nibbles 0..15 stay as they are (the min is m·s below)
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    const int si = block_q4(x[i].qs, y[i].qs, zero);
    sum += (H2F(x[i].d) * H2F(y[i].d)) * si + H2F(x[i].m) * H2F(y[i].s); // dot.c's expression
  }
  *s = sum;
}

static void neon_dot_q8_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q8_0 *x = w, *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    int32x4_t acc = vdupq_n_s32(0);
    acc = dot16(acc, vld1q_s8(x[i].qs), vld1q_s8(y[i].qs));
    acc = dot16(acc, vld1q_s8(x[i].qs + 16), vld1q_s8(y[i].qs + 16));
    const int si = vaddvq_s32(acc);
    sum += si * (H2F(x[i].d) * H2F(y[i].d)); // dot.c's expression
  }
  *s = sum;
}

// Same activation types and quantizers as the scalar table (the activation bytes are part of
// what must match the reference and llama.cpp).
static const struct ll_type_kernels neon_table[LL_TYPE_COUNT] = {
    [LL_TYPE_Q4_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0, neon_dot_q4_0_q8_0, "neon", NULL, 0},
    [LL_TYPE_Q4_1] = {LL_TYPE_Q8_1, ll_act_quantize_q8_1, neon_dot_q4_1_q8_1, "neon", NULL, 0},
    [LL_TYPE_Q8_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0, neon_dot_q8_0_q8_0, "neon", NULL, 0},
};

const struct ll_type_kernels *ll_cpu_kernels_neon(int t) {
  if (t < 0 || t >= LL_TYPE_COUNT || !neon_table[t].vec_dot) return NULL;
  return &neon_table[t];
}

#endif
