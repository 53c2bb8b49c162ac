// dot_avx512.c - AVX-512 (F, BW, VL) + VNNI dot products for Q4_0, Q4_1 and Q8_0 weights
// (compiled with -mavx512*; chosen at run time only on CPUs that have them).
//
// One zmm holds TWO 32-element blocks; vpdpbusd multiplies unsigned weight bytes by signed
// activation bytes and sums groups of four into int32 lanes, exactly (no int16 saturation as
// in maddubs). Signed weights are made unsigned by an offset whose contribution is removed
// with a per-token correction computed once per tile (dpbusd starts from it):
//   Q8_0:  Σ w·a = Σ (w+128)·a − 128·Σa        Q4_0:  Σ (q−8)·a = Σ q·a − 8·Σa
//   Q4_1:  d_w·d_a·Σ q·a  +  m_w·s_a
// The float accumulation then follows dot_avx2.c block by block, so both paths give
// bit-identical results (tested) and greedy outputs stay identical to llama.cpp's.
// Tiles compute up to 4 weight rows x 4 activation rows per pass, sharing the unpacked weights
// across tokens and the activation loads across rows. Every output is computed with the same
// operation sequence whatever the tile shape (vec_dot is the 1x1 tile), so results do not
// depend on batch composition.
#include <immintrin.h>
#include <string.h>

#include "ll_cpu_dot.h"
#include "ll_quant.h"

#define AI __attribute__((always_inline)) static inline



// Nibbles of blocks i, i+1 (16 bytes each) -> 128-bit lanes [lo_i, lo_i1, hi_i, hi_i1]
// (lo = elements 0..15, hi = 16..31). A missing second block reads as zeros.
AI __m512i q4_pair(const uint8_t *qs0, const uint8_t *qs1) {
  const __m128i x0 = _mm_loadu_si128((const __m128i *)qs0);
  const __m128i x1 = qs1 ? _mm_loadu_si128((const __m128i *)qs1) : _mm_setzero_si128();
  const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(x0), x1, 1);
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(y), _mm256_srli_epi16(y, 4), 1);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}


// Natural layout [x_i[0:32], x_i1[0:32]].
AI __m512i pair_q8(const int8_t *a0, const int8_t *a1) {
  const __m256i p = _mm256_loadu_si256((const __m256i *)a0);
  const __m256i q = a1 ? _mm256_loadu_si256((const __m256i *)a1) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(p), q, 1);
}


#define ROW(T, base, stride, r) ((const T *)((const char *)(base) + (size_t)(r) * (stride)))

// The same horizontal sum as dot_avx2.c (and ggml's hsum_float_8).
AI float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
AI float h2f(ll_fp16 h) { return _cvtsh_ss(h); }
// The half as a float in lane 0, other lanes zero.
AI __m128 h2v(ll_fp16 h) { return _mm_cvtph_ps(_mm_cvtsi32_si128(h)); }
// [v0[0], v1[0], v2[0], v3[0]] from the first n vectors (lane 0 each, the rest zero), the
// missing ones zero.
AI __m128 lanes4(const __m128 *v, const int n) {
  const __m128 z = _mm_setzero_ps();
  const __m128 lo = _mm_unpacklo_ps(v[0], n > 1 ? v[1] : z);
  if (n <= 2) return lo;
  return _mm_movelh_ps(lo, _mm_unpacklo_ps(v[2], n > 3 ? v[3] : z));
}

// Weight nibbles of blocks i, i+1 in natural element order [q_i[0:32], q_i1[0:32]].
AI __m512i q4_pair_natural(const uint8_t *qs0, const uint8_t *qs1) {
  const __m512i z = q4_pair(qs0, qs1); // [lo_i, lo_i1, hi_i, hi_i1]
  return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

// Float accumulation exactly as dot_avx2.c (hence as ggml on AVX2): per block, in block order,
// acc8 += (d_w * d_a) * float(Σ of the block's 8 lanes of 4 products); vpdpbusd gives the
// same exact integers as maddubs + madd. So the AVX-512 and AVX2 paths are bit-identical
// (tested), which keeps greedy outputs identical to llama.cpp's; VNNI and 512-bit loads cut
// the instruction count, and the tiles share unpacked weights and activations.
#define STEP2(acc, r32, dw, da, two)                                                                   \
  do {                                                                                                 \
    const __m512 f_ = _mm512_cvtepi32_ps(r32);                                                         \
    acc = _mm256_fmadd_ps(_mm256_mul_ps(dw[0], _mm256_set1_ps(da[0])), _mm512_castps512_ps256(f_), acc); \
    if (two) acc = _mm256_fmadd_ps(_mm256_mul_ps(dw[1], _mm256_set1_ps(da[1])), _mm512_extractf32x8_ps(f_, 1), acc); \
  } while (0)

// Two tokens share one zmm accumulator: [acc(t0) | acc(t1)]. The block-i halves of both
// tokens' integer sums are brought together (one shuffle), converted and scaled in one go;
// per output this is still acc8 = fma(d_w*d_a, float(isum8), acc8) per block in block order,
// so the results are bit-identical to the 256-bit path while the conversions, products and
// FMAs are done for two outputs per instruction.
#define PAIR_STEP(accz, r0, r1, dwz, dap, two)                                                          \
  do {                                                                                                  \
    accz = _mm512_fmadd_ps(_mm512_mul_ps(dwz[0], dap[0]),                                               \
                           _mm512_cvtepi32_ps(_mm512_shuffle_i64x2(r0, r1, _MM_SHUFFLE(1, 0, 1, 0))), accz); \
    if (two)                                                                                            \
      accz = _mm512_fmadd_ps(_mm512_mul_ps(dwz[1], dap[1]),                                             \
                             _mm512_cvtepi32_ps(_mm512_shuffle_i64x2(r0, r1, _MM_SHUFFLE(3, 2, 3, 2))), accz); \
  } while (0)
// [a x8 | b x8]
AI __m512 two_scales(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }

// ---- Q4_1 x Q8_1 ----
// The m·s term: per row one 4-lane vector whose lanes are the tokens; mul then add per block,
// element for element what dot_avx2.c does in scalar (no fused multiply-add there either).
AI void q4_1_impl(int n, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os, const int NW, const int NA) {
  const int nb = n / 32;
  __m512 accp[4][2]; // token pairs (0,1), (2,3)
  __m256 acc1[4];    // the last token when NA is odd
  __m128 sm[4];
  _Pragma("GCC unroll 4")
  for (int r = 0; r < NW; r++) {
    sm[r] = _mm_setzero_ps();
    accp[r][0] = accp[r][1] = _mm512_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  for (int i = 0; i < nb; i += 2) {
    const int two = i + 1 < nb;
    __m512i av[4];
    float da[4][2];
    __m128 s0[4], s1[4];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) {
      const ll_block_q8_1 *y = ROW(ll_block_q8_1, a, as, t);
      av[t] = pair_q8(y[i].qs, two ? y[i + 1].qs : NULL);
      da[t][0] = h2f(y[i].d), s0[t] = h2v(y[i].s);
      da[t][1] = two ? h2f(y[i + 1].d) : 0.0f, s1[t] = two ? h2v(y[i + 1].s) : _mm_setzero_ps();
    }
    // Lane t = token t's s, built in registers: filling a float[4] on the stack and loading it
    // as a vector stalled every block on a failed store-to-load forward (~40% of a decode tile).
    const __m128 sav0 = lanes4(s0, NA), sav1 = lanes4(s1, NA);
    __m512 dap[2][2];
    _Pragma("GCC unroll 2")
    for (int k = 0; 2 * k + 1 < NA; k++) dap[k][0] = two_scales(da[2 * k][0], da[2 * k + 1][0]), dap[k][1] = two_scales(da[2 * k][1], da[2 * k + 1][1]);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NW; r++) {
      const ll_block_q4_1 *x = ROW(ll_block_q4_1, w, ws, r);
      const __m512i wv = q4_pair_natural(x[i].qs, two ? x[i + 1].qs : NULL);
      const __m512 dwz[2] = {_mm512_set1_ps(h2f(x[i].d)), _mm512_set1_ps(two ? h2f(x[i + 1].d) : 0.0f)};
      const __m256 dw[2] = {_mm512_castps512_ps256(dwz[0]), _mm512_castps512_ps256(dwz[1])};
      sm[r] = _mm_add_ps(sm[r], _mm_mul_ps(_mm_set1_ps(h2f(x[i].m)), sav0));
      if (two) sm[r] = _mm_add_ps(sm[r], _mm_mul_ps(_mm_set1_ps(h2f(x[i + 1].m)), sav1));
      _Pragma("GCC unroll 2")
      for (int k = 0; 2 * k + 1 < NA; k++) {
        const __m512i r0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, av[2 * k]);
        const __m512i r1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, av[2 * k + 1]);
        PAIR_STEP(accp[r][k], r0, r1, dwz, dap[k], two);
      }
      if (NA & 1) STEP2(acc1[r], _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, av[NA - 1]), dw, da[NA - 1], two);
    }
  }
  _Pragma("GCC unroll 4")
  for (int r = 0; r < NW; r++) {
    float smr[4];
    _mm_storeu_ps(smr, sm[r]);
    _Pragma("GCC unroll 2")
    for (int k = 0; 2 * k + 1 < NA; k++) {
      out[(size_t)(2 * k) * os + r] = hsum256(_mm512_castps512_ps256(accp[r][k])) + smr[2 * k];
      out[(size_t)(2 * k + 1) * os + r] = hsum256(_mm512_extractf32x8_ps(accp[r][k], 1)) + smr[2 * k + 1];
    }
    if (NA & 1) out[(size_t)(NA - 1) * os + r] = hsum256(acc1[r]) + smr[NA - 1];
  }
}

// ---- Q8_0 / Q4_0 x Q8_0 ----
AI void q80_impl(int n, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os, const int NW, const int NA,
                 const int Q4) {
  const int nb = n / 32;
  __m512 accp[4][2]; // token pairs (0,1), (2,3)
  __m256 acc1[4];    // the last token when NA is odd
  _Pragma("GCC unroll 4")
  for (int r = 0; r < NW; r++) accp[r][0] = accp[r][1] = _mm512_setzero_ps(), acc1[r] = _mm256_setzero_ps();
  // Offset removed through dpbusd's start value: -off·Σa per lane group, once per token and pair.
  const __m512i offv = _mm512_set1_epi8(Q4 ? 8 : (char)0x80);
  for (int i = 0; i < nb; i += 2) {
    const int two = i + 1 < nb;
    __m512i av[4], corr[4];
    float da[4][2];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) {
      const ll_block_q8_0 *y = ROW(ll_block_q8_0, a, as, t);
      av[t] = pair_q8(y[i].qs, two ? y[i + 1].qs : NULL);
      corr[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, av[t]));
      da[t][0] = h2f(y[i].d), da[t][1] = two ? h2f(y[i + 1].d) : 0.0f;
    }
    __m512 dap[2][2];
    _Pragma("GCC unroll 2")
    for (int k = 0; 2 * k + 1 < NA; k++) dap[k][0] = two_scales(da[2 * k][0], da[2 * k + 1][0]), dap[k][1] = two_scales(da[2 * k][1], da[2 * k + 1][1]);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NW; r++) {
      __m512i wv;
      __m512 dwz[2];
      if (Q4) {
        const ll_block_q4_0 *x = ROW(ll_block_q4_0, w, ws, r);
        wv = q4_pair_natural(x[i].qs, two ? x[i + 1].qs : NULL);
        dwz[0] = _mm512_set1_ps(h2f(x[i].d)), dwz[1] = _mm512_set1_ps(two ? h2f(x[i + 1].d) : 0.0f);
      } else {
        const ll_block_q8_0 *x = ROW(ll_block_q8_0, w, ws, r);
        // A missing second block: its activation lanes are zero, so its products are zero.
        wv = _mm512_xor_si512(pair_q8(x[i].qs, two ? x[i + 1].qs : NULL), offv);
        dwz[0] = _mm512_set1_ps(h2f(x[i].d)), dwz[1] = _mm512_set1_ps(two ? h2f(x[i + 1].d) : 0.0f);
      }
      const __m256 dw[2] = {_mm512_castps512_ps256(dwz[0]), _mm512_castps512_ps256(dwz[1])};
      _Pragma("GCC unroll 2")
      for (int k = 0; 2 * k + 1 < NA; k++) {
        const __m512i r0 = _mm512_dpbusd_epi32(corr[2 * k], wv, av[2 * k]);
        const __m512i r1 = _mm512_dpbusd_epi32(corr[2 * k + 1], wv, av[2 * k + 1]);
        PAIR_STEP(accp[r][k], r0, r1, dwz, dap[k], two);
      }
      if (NA & 1) STEP2(acc1[r], _mm512_dpbusd_epi32(corr[NA - 1], wv, av[NA - 1]), dw, da[NA - 1], two);
    }
  }
  _Pragma("GCC unroll 4")
  for (int r = 0; r < NW; r++) {
    _Pragma("GCC unroll 2")
    for (int k = 0; 2 * k + 1 < NA; k++) {
      out[(size_t)(2 * k) * os + r] = hsum256(_mm512_castps512_ps256(accp[r][k]));
      out[(size_t)(2 * k + 1) * os + r] = hsum256(_mm512_extractf32x8_ps(accp[r][k], 1));
    }
    if (NA & 1) out[(size_t)(NA - 1) * os + r] = hsum256(acc1[r]);
  }
}

// ---- instantiation: one function per (rows, tokens) so accumulators stay in registers ----
typedef void (*tile_fn)(int n, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os);
#define INST(NAME, CALL, NW, NA)                                                                     \
  static void NAME##_##NW##x##NA(int n, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os) { \
    CALL(NW, NA);                                                                                    \
  }
#define INST_ALL(NAME, CALL)                                                                         \
  INST(NAME, CALL, 1, 1) INST(NAME, CALL, 1, 2) INST(NAME, CALL, 1, 3) INST(NAME, CALL, 1, 4)         \
  INST(NAME, CALL, 2, 1) INST(NAME, CALL, 2, 2) INST(NAME, CALL, 2, 3) INST(NAME, CALL, 2, 4)         \
  INST(NAME, CALL, 3, 1) INST(NAME, CALL, 3, 2) INST(NAME, CALL, 3, 3) INST(NAME, CALL, 3, 4)         \
  INST(NAME, CALL, 4, 1) INST(NAME, CALL, 4, 2) INST(NAME, CALL, 4, 3) INST(NAME, CALL, 4, 4)         \
  static const tile_fn NAME##_tiles[4][4] = {                                                        \
      {NAME##_1x1, NAME##_1x2, NAME##_1x3, NAME##_1x4}, {NAME##_2x1, NAME##_2x2, NAME##_2x3, NAME##_2x4}, \
      {NAME##_3x1, NAME##_3x2, NAME##_3x3, NAME##_3x4}, {NAME##_4x1, NAME##_4x2, NAME##_4x3, NAME##_4x4}}; \
  static void tile_##NAME(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os) { \
    NAME##_tiles[nw - 1][na - 1](n, w, ws, a, as, out, os);                                          \
  }                                                                                                  \
  static void dot_##NAME(int n, float *s, const void *w, const void *a) { NAME##_1x1(n, w, 0, a, 0, s, 1); }

#define CALL_Q41(NW, NA) q4_1_impl(n, w, ws, a, as, out, os, NW, NA)
#define CALL_Q80(NW, NA) q80_impl(n, w, ws, a, as, out, os, NW, NA, 0)
#define CALL_Q40(NW, NA) q80_impl(n, w, ws, a, as, out, os, NW, NA, 1)
INST_ALL(q4_1, CALL_Q41)
INST_ALL(q8_0, CALL_Q80)
INST_ALL(q4_0, CALL_Q40)

static const struct ll_type_kernels avx512_table[LL_TYPE_COUNT] = {
    [LL_TYPE_Q4_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0_avx2, dot_q4_0, "avx512vnni", tile_q4_0, 4},
    [LL_TYPE_Q4_1] = {LL_TYPE_Q8_1, ll_act_quantize_q8_1_avx2, dot_q4_1, "avx512vnni", tile_q4_1, 4},
    [LL_TYPE_Q8_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0_avx2, dot_q8_0, "avx512vnni", tile_q8_0, 4},
};

const struct ll_type_kernels *ll_cpu_kernels_avx512(int t) {
  if (t < 0 || t >= LL_TYPE_COUNT || !avx512_table[t].vec_dot) return NULL;
  return &avx512_table[t];
}
