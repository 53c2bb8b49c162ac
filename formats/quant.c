// quant.c - element types, fp16/bf16 conversion, scalar reference (de)quantizers.
//
// Layouts and rounding follow GGUF/ggml exactly so that quantized tensors move bit-exactly
// between GGUF, .ckpt and the kernels, and so that activations quantized here match what
// llama.cpp computes (the engine's outputs are compared token by token with llama.cpp's).
// These are the plain references; SIMD versions live in kernels/cpu/ and are tested
// against them.
#include "ll_quant.h"

#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "ll_error.h"

// ---------------------------------------------------------------- type table

static const struct ll_type_traits type_table[LL_TYPE_COUNT] = {
    [LL_TYPE_F32] = {"f32", 1, 4, 1},
    [LL_TYPE_F16] = {"f16", 1, 2, 1},
    [LL_TYPE_Q4_0] = {"q4_0", LL_QK4_0, sizeof(ll_block_q4_0), 1},
    [LL_TYPE_Q4_1] = {"q4_1", LL_QK4_1, sizeof(ll_block_q4_1), 1},
    [LL_TYPE_Q5_0] = {"q5_0", LL_QK5_0, sizeof(ll_block_q5_0), 1},
    [LL_TYPE_Q5_1] = {"q5_1", LL_QK5_1, sizeof(ll_block_q5_1), 1},
    [LL_TYPE_Q8_0] = {"q8_0", LL_QK8_0, sizeof(ll_block_q8_0), 1},
    [LL_TYPE_Q8_1] = {"q8_1", LL_QK8_1, sizeof(ll_block_q8_1), 0},
    [LL_TYPE_Q2_K] = {"q2_K", LL_QK_K, 84, 0},
    [LL_TYPE_Q3_K] = {"q3_K", LL_QK_K, 110, 0},
    [LL_TYPE_Q4_K] = {"q4_K", LL_QK_K, sizeof(ll_block_q4_K), 1},
    [LL_TYPE_Q5_K] = {"q5_K", LL_QK_K, sizeof(ll_block_q5_K), 1},
    [LL_TYPE_Q6_K] = {"q6_K", LL_QK_K, sizeof(ll_block_q6_K), 1},
    [LL_TYPE_Q8_K] = {"q8_K", LL_QK_K, sizeof(ll_block_q8_K), 0},
    [LL_TYPE_I8] = {"i8", 1, 1, 0},
    [LL_TYPE_I16] = {"i16", 1, 2, 0},
    [LL_TYPE_I32] = {"i32", 1, 4, 0},
    [LL_TYPE_BF16] = {"bf16", 1, 2, 1},
};

const struct ll_type_traits *ll_type_traits_get(int type) {
  if (type < 0 || type >= LL_TYPE_COUNT || type_table[type].name == NULL) return NULL;
  return &type_table[type];
}

const char *ll_type_name(int type) {
  const struct ll_type_traits *t = ll_type_traits_get(type);
  return t ? t->name : "?";
}

int ll_type_from_name(const char *name) {
  for (int i = 0; i < LL_TYPE_COUNT; i++)
    if (type_table[i].name && strcasecmp(type_table[i].name, name) == 0) return i;
  return -1;
}

size_t ll_row_size(int type, int64_t n) {
  const struct ll_type_traits *t = ll_type_traits_get(type);
  if (!t || n <= 0 || n % t->blck_size != 0) return 0;
  uint64_t blocks = (uint64_t)n / (uint64_t)t->blck_size;
  if (blocks > SIZE_MAX / t->type_size) return 0;
  return (size_t)(blocks * t->type_size);
}

// ---------------------------------------------------------------- NaN / Inf

// Scans n elements of width w (bytes) at stride `stride` from p, at byte offsets off[0..n_off),
// for exponent bits all set (Inf or NaN: IEEE f32, f16 and bf16 alike) under mask.
static int64_t first_nonfinite(const uint8_t *p, size_t n, size_t stride, const size_t *off, int n_off, int w, uint32_t mask) {
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < n_off; k++) {
      uint32_t v = 0;
      if (w == 4) {
        memcpy(&v, p + i * stride + off[k], 4);
      } else {
        uint16_t h;
        memcpy(&h, p + i * stride + off[k], 2);
        v = h;
      }
      if ((v & mask) == mask) return (int64_t)i;
    }
  return -1;
}

// Plain arrays (f32: w 4; f16 / bf16: w 2) in chunks without an early exit, which the compiler
// vectorizes (a 7B f16 model is 7e9 values); the chunk that has one is searched again.
static int64_t first_nonfinite_dense(const uint8_t *p, size_t n, int w, uint32_t mask) {
  enum { CH = 4096 };
  static const size_t o0[1] = {0};
  for (size_t c = 0; c < n; c += CH) {
    const size_t m = n - c < CH ? n - c : CH;
    int bad = 0;
    if (w == 4) {
      const uint8_t *q = p + c * 4;
      for (size_t i = 0; i < m; i++) {
        uint32_t v;
        memcpy(&v, q + i * 4, 4);
        bad |= (v & mask) == mask;
      }
    } else {
      const uint8_t *q = p + c * 2;
      for (size_t i = 0; i < m; i++) {
        uint16_t v;
        memcpy(&v, q + i * 2, 2);
        bad |= (v & mask) == mask;
      }
    }
    if (bad) return (int64_t)c + first_nonfinite(p + c * (size_t)w, m, (size_t)w, o0, 1, w, mask);
  }
  return -1;
}

int64_t ll_tensor_find_nonfinite(int type, const void *data, size_t nbytes) {
  const uint8_t *p = data;
  static const size_t o0[1] = {0}, o01[2] = {0, 2};
  if (!p) return -1;
  int64_t i = -1;
  switch (type) {
  case LL_TYPE_F32:
    return first_nonfinite_dense(p, nbytes / 4, 4, 0x7f800000u);
  case LL_TYPE_F16:
    return first_nonfinite_dense(p, nbytes / 2, 2, 0x7c00u);
  case LL_TYPE_BF16:
    return first_nonfinite_dense(p, nbytes / 2, 2, 0x7f80u);
  case LL_TYPE_Q4_0: case LL_TYPE_Q5_0: case LL_TYPE_Q8_0: // d first
  case LL_TYPE_Q4_1: case LL_TYPE_Q5_1: case LL_TYPE_Q4_K: case LL_TYPE_Q5_K: { // d, m / dmin first
    const struct ll_type_traits *t = ll_type_traits_get(type);
    const int two = type == LL_TYPE_Q4_1 || type == LL_TYPE_Q5_1 || type == LL_TYPE_Q4_K || type == LL_TYPE_Q5_K;
    i = first_nonfinite(p, nbytes / t->type_size, t->type_size, two ? o01 : o0, two ? 2 : 1, 2, 0x7c00u);
    return i < 0 ? -1 : i * t->blck_size;
  }
  case LL_TYPE_Q6_K: { // d last
    static const size_t od[1] = {offsetof(ll_block_q6_K, d)};
    i = first_nonfinite(p, nbytes / sizeof(ll_block_q6_K), sizeof(ll_block_q6_K), od, 1, 2, 0x7c00u);
    return i < 0 ? -1 : i * LL_QK_K;
  }
  case LL_TYPE_Q2_K: case LL_TYPE_Q3_K: { // d (and dmin) at the end: ggml's layouts
    const struct ll_type_traits *t = ll_type_traits_get(type);
    const size_t offs[2] = {t->type_size - (type == LL_TYPE_Q2_K ? 4 : 2), t->type_size - 2};
    i = first_nonfinite(p, nbytes / t->type_size, t->type_size, offs, type == LL_TYPE_Q2_K ? 2 : 1, 2, 0x7c00u);
    return i < 0 ? -1 : i * LL_QK_K;
  }
  default:
    return -1;
  }
}

// ---------------------------------------------------------------- fp16 / bf16


float ll_fp16_to_fp32(ll_fp16 h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return f32_from(sign | 0x7f800000u | (man << 13)); // inf / nan (payload kept)
  if (exp != 0) return f32_from(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return f32_from(sign);
  // subnormal half: value = man * 2^-24, exact in float
  float v = (float)man * 0x1.0p-24f;
  return f32_from(sign | f32_bits(v));
}

// Round to nearest even; overflow to inf; NaN stays NaN (quiet, as ggml: 0x7e00).
ll_fp16 ll_fp32_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (ll_fp16)(sign | 0x7e00);
  if (ax >= 0x477ff000u) return (ll_fp16)(sign | 0x7c00); // rounds to >= 65520 -> inf
  if (ax >= 0x38800000u) {                                // normal half range (>= 2^-14)
    uint32_t mant = ax & 0x7fffff;
    uint32_t exp = (ax >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; // carry may roll into the exponent: correct
    return (ll_fp16)(sign | h);
  }
  // subnormal half (or zero): value / 2^-24, rounded to nearest even integer
  float v = f32_from(ax) * 0x1.0p24f; // exact scaling
  float r = nearbyintf(v);            // default rounding mode: nearest even
  return (ll_fp16)(sign | (uint32_t)r);
}

float ll_bf16_to_fp32(ll_bf16 h) { return f32_from((uint32_t)h << 16); }

ll_bf16 ll_fp32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ll_bf16)((u >> 16) | 64); // quiet NaN
  return (ll_bf16)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#define H2F(x) ll_fp16_to_fp32(x)
#define F2H(x) ll_fp32_to_fp16(x)

// ---------------------------------------------------------------- dequantizers

static void dq_q4_0(const ll_block_q4_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    const float d = H2F(b[i].d);
    for (int j = 0; j < 16; j++) {
      y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
      y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

static void dq_q4_1(const ll_block_q4_1 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    const float d = H2F(b[i].d), m = H2F(b[i].m);
    for (int j = 0; j < 16; j++) {
      y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
      y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
    }
  }
}

static void dq_q5_0(const ll_block_q5_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    const float d = H2F(b[i].d);
    uint32_t qh;
    memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < 16; j++) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[j] = (float)(((b[i].qs[j] & 0x0f) | h0) - 16) * d;
      y[j + 16] = (float)(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

static void dq_q5_1(const ll_block_q5_1 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    const float d = H2F(b[i].d), m = H2F(b[i].m);
    uint32_t qh;
    memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < 16; j++) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[j] = (float)((b[i].qs[j] & 0x0f) | h0) * d + m;
      y[j + 16] = (float)((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

static void dq_q8_0(const ll_block_q8_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    const float d = H2F(b[i].d);
    for (int j = 0; j < 32; j++) y[j] = (float)b[i].qs[j] * d;
  }
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
static inline void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

static void dq_q4_K(const ll_block_q4_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = H2F(b[i].d), min = H2F(b[i].dmin);
    const uint8_t *q = b[i].qs;
    for (int j = 0, is = 0; j < LL_QK_K; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      k_scale_min(is, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      k_scale_min(is + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

static void dq_q5_K(const ll_block_q5_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = H2F(b[i].d), min = H2F(b[i].dmin);
    const uint8_t *ql = b[i].qs, *qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < LL_QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      k_scale_min(is, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      k_scale_min(is + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

static void dq_q6_K(const ll_block_q6_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const float d = H2F(b[i].d);
    const uint8_t *ql = b[i].ql, *qh = b[i].qh;
    const int8_t *sc = b[i].scales;
    for (int n = 0; n < LL_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; l++) {
        const int is = l / 16;
        const int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

int ll_dequantize_row(int type, const void *src, float *dst, int64_t n) {
  const struct ll_type_traits *t = ll_type_traits_get(type);
  if (!t || !t->has_dequant) return LL_EUNSUPPORTED;
  if (n < 0 || n % t->blck_size != 0) return LL_EINVAL;
  const int64_t nb = n / t->blck_size;
  switch (type) {
  case LL_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
  case LL_TYPE_F16: {
    const ll_fp16 *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ll_fp16_to_fp32(s[i]);
    return 0;
  }
  case LL_TYPE_BF16: {
    const ll_bf16 *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = ll_bf16_to_fp32(s[i]);
    return 0;
  }
  case LL_TYPE_Q4_0: dq_q4_0(src, dst, nb); return 0;
  case LL_TYPE_Q4_1: dq_q4_1(src, dst, nb); return 0;
  case LL_TYPE_Q5_0: dq_q5_0(src, dst, nb); return 0;
  case LL_TYPE_Q5_1: dq_q5_1(src, dst, nb); return 0;
  case LL_TYPE_Q8_0: dq_q8_0(src, dst, nb); return 0;
  case LL_TYPE_Q4_K: dq_q4_K(src, dst, nb); return 0;
  case LL_TYPE_Q5_K: dq_q5_K(src, dst, nb); return 0;
  case LL_TYPE_Q6_K: dq_q6_K(src, dst, nb); return 0;
  default: return LL_EUNSUPPORTED;
  }
}

// ---------------------------------------------------------------- quantizers

// Value of largest magnitude in x[0..n) (first one on ties), and that magnitude.
static inline float signed_absmax(const float *x, int n, float *amax_out) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; j++) {
    const float v = x[j];
    if (amax < fabsf(v)) {
      amax = fabsf(v);
      max = v;
    }
  }
  *amax_out = amax;
  return max;
}

static void q_q4_0(const float *x, ll_block_q4_0 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax;
    const float max = signed_absmax(x, 32, &amax);
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < 16; j++) {
      const float x0 = x[j] * id, x1 = x[16 + j] * id;
      int8_t t0 = (int8_t)(x0 + 8.5f), t1 = (int8_t)(x1 + 8.5f);
      const uint8_t xi0 = (uint8_t)(t0 < 15 ? t0 : 15), xi1 = (uint8_t)(t1 < 15 ? t1 : 15);
      y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
    }
  }
}

static void q_q4_1(const float *x, ll_block_q4_1 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float min = INFINITY, max = -INFINITY;
    for (int j = 0; j < 32; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    y[i].m = F2H(min);
    for (int j = 0; j < 16; j++) {
      const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
      int8_t t0 = (int8_t)(x0 + 0.5f), t1 = (int8_t)(x1 + 0.5f);
      const uint8_t xi0 = (uint8_t)(t0 < 15 ? t0 : 15), xi1 = (uint8_t)(t1 < 15 ? t1 : 15);
      y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
    }
  }
}

static void q_q5_0(const float *x, ll_block_q5_0 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax;
    const float max = signed_absmax(x, 32, &amax);
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
      const float x0 = x[j] * id, x1 = x[16 + j] * id;
      int8_t t0 = (int8_t)(x0 + 16.5f), t1 = (int8_t)(x1 + 16.5f);
      const uint8_t xi0 = (uint8_t)(t0 < 31 ? t0 : 31), xi1 = (uint8_t)(t1 < 31 ? t1 : 31);
      y[i].qs[j] = (uint8_t)((xi0 & 0x0f) | ((xi1 & 0x0f) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    memcpy(y[i].qh, &qh, 4);
  }
}

static void q_q5_1(const float *x, ll_block_q5_1 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float min = INFINITY, max = -INFINITY;
    for (int j = 0; j < 32; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    y[i].m = F2H(min);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
      const float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
      const uint8_t xi0 = (uint8_t)(x0 + 0.5f), xi1 = (uint8_t)(x1 + 0.5f);
      y[i].qs[j] = (uint8_t)((xi0 & 0x0f) | ((xi1 & 0x0f) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    memcpy(y[i].qh, &qh, 4);
  }
}

static void q_q8_0(const float *x, ll_block_q8_0 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
  }
}

static void q_q8_1(const float *x, ll_block_q8_1 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = F2H(d);
    int sum = 0;
    for (int j = 0; j < 16; j++) {
      y[i].qs[j] = (int8_t)roundf(x[j] * id);
      y[i].qs[16 + j] = (int8_t)roundf(x[16 + j] * id);
      sum += y[i].qs[j] + y[i].qs[16 + j];
    }
    y[i].s = F2H((float)sum * d);
  }
}

// Round half to even, as ggml's nearest_int (valid for |v| < 2^22).
static inline int nearest_int(float v) { return (int)lrintf(v); }

static void q_q8_K(const float *x, ll_block_q8_K *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += LL_QK_K) {
    float amax;
    const float max = signed_absmax(x, LL_QK_K, &amax);
    if (amax == 0.0f) {
      y[i].d = 0;
      memset(y[i].qs, 0, sizeof y[i].qs);
      memset(y[i].bsums, 0, sizeof y[i].bsums);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < LL_QK_K; j++) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < LL_QK_K / 16; j++) {
      int sum = 0;
      for (int k = 0; k < 16; k++) sum += y[i].qs[j * 16 + k];
      y[i].bsums[j] = (int16_t)sum;
    }
    y[i].d = 1 / iscale;
  }
}

int ll_quantize_row(int type, const float *src, void *dst, int64_t n) {
  const struct ll_type_traits *t = ll_type_traits_get(type);
  if (!t) return LL_EUNSUPPORTED;
  if (n < 0 || n % t->blck_size != 0) return LL_EINVAL;
  const int64_t nb = n / t->blck_size;
  switch (type) {
  case LL_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return 0;
  case LL_TYPE_F16: {
    ll_fp16 *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = ll_fp32_to_fp16(src[i]);
    return 0;
  }
  case LL_TYPE_BF16: {
    ll_bf16 *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = ll_fp32_to_bf16(src[i]);
    return 0;
  }
  case LL_TYPE_Q4_0: q_q4_0(src, dst, nb); return 0;
  case LL_TYPE_Q4_1: q_q4_1(src, dst, nb); return 0;
  case LL_TYPE_Q5_0: q_q5_0(src, dst, nb); return 0;
  case LL_TYPE_Q5_1: q_q5_1(src, dst, nb); return 0;
  case LL_TYPE_Q8_0: q_q8_0(src, dst, nb); return 0;
  case LL_TYPE_Q8_1: q_q8_1(src, dst, nb); return 0;
  case LL_TYPE_Q8_K: q_q8_K(src, dst, nb); return 0;
  default: return LL_EUNSUPPORTED;
  }
}
