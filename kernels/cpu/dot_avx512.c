// dot_avx512.c - AVX-512 (F, BW, VL) + VNNI dot products for Q4_0, Q4_1, Q5_0 and Q8_0 weights
// (compiled with -mavx512*; chosen at run time only on CPUs that have them).
//
// vpdpbusd multiplies unsigned bytes by signed bytes and sums groups of four into int32 lanes,
// exactly (no int16 saturation as in maddubs). One side is made unsigned and the offset's
// contribution removed in integers:
//   Q4_0 / Q5_0:  Σ (q−8)·a = Σ q·a − 8·Σa  (q−16 and 16·Σa for Q5_0)
//   Q8_0:         Σ w·a = Σ w·(a+128) − 128·Σw   (per lane, from the weights: once per block)
//   Q4_1:         d_w·d_a·Σ q·a  +  m_w·s_a
// Q4_0 and Q5_0 follow dot.c's block-sum order (llama.cpp's repacked Q4_0 order), Q4_1 and
// Q8_0 dot_avx2.c's 8-lane order (ggml on AVX2). The lanes of a zmm hold different weight rows
// (four for the 4/5-bit types, two for Q8_0), each with the same integer groups and float
// steps as those references, block by block, so every path gives bit-identical results
// (tested) and greedy outputs stay identical to llama.cpp's. Tiles compute up to 4 weight rows
// x 8 activation rows per pass, sharing the unpacked weights across tokens; with tile_sc the
// activation blocks' scales (and offsets) come from side tables the caller fills once per
// matrix product. Every output is computed with the same operation sequence whatever the tile
// shape (vec_dot is the 1x1 tile), so results do not depend on batch composition.
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "ll_cpu_dot.h"
#include "ll_quant.h"

#define AI __attribute__((always_inline)) static inline



AI float h2f(ll_fp16 h) { return _cvtsh_ss(h); }
// Lane-indexed insert/extract whose immediates must be constants: in the optimized build the
// loops are unrolled and the switch folds away; unoptimized (sanitizer) builds still compile.
AI __m128i ins16(__m128i v, int x, int lane) {
  switch (lane) {
  case 0: return _mm_insert_epi16(v, x, 0);
  case 1: return _mm_insert_epi16(v, x, 1);
  case 2: return _mm_insert_epi16(v, x, 2);
  default: return _mm_insert_epi16(v, x, 3);
  }
}
AI __m128i ins32(__m128i v, int x, int lane) {
  switch (lane) {
  case 0: return _mm_insert_epi32(v, x, 0);
  case 1: return _mm_insert_epi32(v, x, 1);
  case 2: return _mm_insert_epi32(v, x, 2);
  default: return _mm_insert_epi32(v, x, 3);
  }
}
AI __m128 lane128(__m512 v, int i) {
  switch (i) {
  case 0: return _mm512_extractf32x4_ps(v, 0);
  case 1: return _mm512_extractf32x4_ps(v, 1);
  case 2: return _mm512_extractf32x4_ps(v, 2);
  default: return _mm512_extractf32x4_ps(v, 3);
  }
}
// ---- Q4_1 x Q8_1: four weight rows per zmm ----
// The nibbles of one block of four rows fill a zmm's four 128-bit lanes; masking gives the
// low halves (elements 0..15) of all four rows, shifting the high halves (16..31). Against
// the token's matching 16 activation bytes broadcast to every lane, vpdpbusd then yields,
// per row, exactly the 8 int32 lanes of the AVX2 path split in two: lanes 0..3 ("L") and
// 4..7 ("H"). Each float lane gets the same fma(d_w*d_a, float(isum), acc) per block, in
// block order, as in dot_avx2.c, so results stay bit-identical; but one conversion and one
// FMA now serve four rows of a single token, which halves decode's instruction count (an
// earlier layout with two tokens per zmm left half of every instruction idle in decode). The horizontal sum at the end is
// ggml's hsum_float_8 sequence (as in dot_avx2.c) for the four rows at once: (L+H), then lanes (0+2)+(1+3).
AI __m512i q4_quad_load(const void *w, size_t ws, size_t blk, size_t off, const int NW) {
  __m512i y = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)((const char *)w + blk + off)));
  if (NW > 1) y = _mm512_inserti32x4(y, _mm_loadu_si128((const __m128i *)((const char *)w + ws + blk + off)), 1);
  if (NW > 2) y = _mm512_inserti32x4(y, _mm_loadu_si128((const __m128i *)((const char *)w + 2 * ws + blk + off)), 2);
  if (NW > 3) y = _mm512_inserti32x4(y, _mm_loadu_si128((const __m128i *)((const char *)w + 3 * ws + blk + off)), 3);
  return y;
}
// hsum_float_8 of row r's 8 lanes (L_r, H_r) for the four rows -> lane r.
AI __m128 q4_quad_hsum(__m512 l, __m512 h) {
  const __m512 v = _mm512_add_ps(l, h);
  const __m512 t = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 u = _mm512_add_ps(t, _mm512_movehdup_ps(t));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

// Up to 8 tokens. The row scales and offsets come from one vpermw over the rows' block heads
// (d_r to lanes 4r+j, m_r to lanes 4t+r); the tokens' d_a and s_a from the caller's side
// tables (tile_sc: sc = d_a, ss = s_a as float bits; SIDE 1) or converted from the blocks.
AI void q4_1_quad_impl(int n, const void *w, size_t ws, const void *a, size_t as, const float *sca, const int32_t *ssa, size_t scs,
                      float *out, size_t os, const int NW, const int NA, const int SIDE) {
  const int nb = n / 32;
  const size_t ba = sizeof(ll_block_q8_1), aoff = offsetof(ll_block_q8_1, qs);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // Words 0..15 <- d of row k/4 (word 8(k/4) of the heads), words 16..31 <- m of row k%4 (word 8(k%4)+1).
  const __m512i hidx = _mm512_setr_epi32(0, 0, 0x00080008, 0x00080008, 0x00100010, 0x00100010, 0x00180018, 0x00180018, //
                                         0x00090001, 0x00190011, 0x00090001, 0x00190011, 0x00090001, 0x00190011, 0x00090001, 0x00190011);
  const __m512i sidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 accl[8], acch[8];
  __m512 sm[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}; // lane 4(t%4) + r: token t's Σ m_r·s_t
  _Pragma("GCC unroll 8")
  for (int t = 0; t < NA; t++) accl[t] = acch[t] = _mm512_setzero_ps();
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * sizeof(ll_block_q4_1);
    const __m512i q = q4_quad_load(w, ws, blk, offsetof(ll_block_q4_1, qs), NW);
    const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    const __m512i hw = _mm512_permutexvar_epi16(hidx, q4_quad_load(w, ws, blk, 0, NW));
    const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(hw)), mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hw, 1));
    __m128 d4[2]; // the tokens' d_a, four per group
    _Pragma("GCC unroll 2")
    for (int g = 0; 4 * g < NA; g++) { // m·s: mul, then add, as dot_avx2.c's scalar (the product of two halves is exact)
      const int ng = NA - 4 * g < 4 ? NA - 4 * g : 4;
      __m128 s4;
      if (SIDE) {
        const __mmask8 m = (__mmask8)((1u << ng) - 1);
        const float *sp = (const float *)(const void *)(ssa + (size_t)i * scs + 4 * g);
        s4 = ng == 4 ? _mm_loadu_ps(sp) : _mm_maskz_loadu_ps(m, sp);
      } else { // [d0 s0 d1 s1 ...] of the group's blocks, converted together
        __m128i uv = _mm_setzero_si128();
        _Pragma("GCC unroll 4")
        for (int t = 0; t < ng; t++) {
          uint32_t u;
          memcpy(&u, (const char *)a + (size_t)(4 * g + t) * as + (size_t)i * ba, 4);
          uv = ins32(uv, (int)u, t);
        }
        const __m256 ds = _mm256_cvtph_ps(uv);
        d4[g] = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(ds, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)));
        s4 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(ds, _mm256_setr_epi32(1, 3, 5, 7, 0, 0, 0, 0)));
      }
      sm[g] = _mm512_add_ps(sm[g], _mm512_mul_ps(mw, _mm512_permutexvar_ps(sidx, _mm512_castps128_ps512(s4))));
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NA; t++) {
      const char *y = (const char *)a + (size_t)t * as + (size_t)i * ba;
      const __m512i al = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y + aoff)));
      const __m512i ah = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y + aoff + 16)));
      const __m512 da = SIDE ? _mm512_set1_ps(sca[(size_t)i * scs + t]) : _mm512_permutexvar_ps(_mm512_set1_epi32(t % 4), _mm512_castps128_ps512(d4[t / 4]));
      const __m512 sc = _mm512_mul_ps(dw, da);
      accl[t] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, al)), accl[t]);
      acch[t] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, ah)), acch[t]);
    }
  }
  _Pragma("GCC unroll 8")
  for (int t = 0; t < NA; t++) {
    const __m128 res = _mm_add_ps(q4_quad_hsum(accl[t], acch[t]), lane128(sm[t / 4], t % 4));
    float o[4];
    _mm_storeu_ps(o, res);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NW; r++) out[(size_t)t * os + r] = o[r];
  }
}

// ---- Q4_0 x Q8_0: dot.c's order (llama.cpp's repacked one), four rows per zmm ----
// Weights as in the quad kernel above, left unsigned (0..15) against the signed activation
// bytes; per token one chain of two vpdpbusd (low then high halves) gives row r's four int32
// partials of Σ q·a in lanes 4r..4r+3; the four tokens' partials are then reduced and
// transposed so that lane 4r + t holds row r and token t, and the -8·Σa of each token (the
// weights' offset, exact in integers) is added there: lane 4r + t = Σ (q-8)·a, the exact block
// sum. One conversion and one FMA per block then serve all 16 (row, token) pairs:
// sum = fma(float(si), d_w * d_a, sum), as in dot.c, bit for bit.
// With the caller's side tables (tile_sc) the tokens' -8·Σa and d_a are loaded four at a
// time, and the reduction runs in 16 bits: a partial is at most 8·15·128 = 15360 in
// magnitude, two of them still fit, so pack + pmaddwd (then vpdpwssd adding -8·Σa) do in 6
// instructions what takes 9 in 32 bits. Without the tables each token computes its own Σa
// (two more vpdpbusd) and starts its chain from -8·Σa, which no longer fits 16 bits: the
// reduction stays in 32 bits there.
AI __m512i q40_rows_tokens(const __m512i *s, const int NA) {
  if (NA == 1) { // every lane of row r's 128 bits becomes the row's total
    const __m512i v = _mm512_add_epi32(s[0], _mm512_shuffle_epi32(s[0], (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_add_epi32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)_MM_SHUFFLE(2, 3, 0, 1)));
  }
  const __m512i z = _mm512_setzero_si512();
  const __m512i s1 = s[1], s2 = NA > 2 ? s[2] : z, s3 = NA > 3 ? s[3] : z;
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s1), _mm512_unpackhi_epi32(s[0], s1));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(s2, s3), _mm512_unpackhi_epi32(s2, s3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

// The same for Σ q·a partials that fit 16 bits (see above), plus c (lane 4r + t: token t's
// correction) in the last step.
AI __m512i q40_rows_tokens16(const __m512i *s, const int NA, __m512i c) {
  const __m512i z = _mm512_setzero_si512(), ones = _mm512_set1_epi16(1);
  const __m512i s1 = NA > 1 ? s[1] : z, s2 = NA > 2 ? s[2] : z, s3 = NA > 3 ? s[3] : z;
  const __m512i ab = _mm512_madd_epi16(_mm512_packs_epi32(s[0], s1), ones); // [a01 a23 b01 b23] per row
  const __m512i cd = NA > 2 ? _mm512_madd_epi16(_mm512_packs_epi32(s2, s3), ones) : z;
  return _mm512_dpwssd_epi32(c, _mm512_packs_epi32(ab, cd), ones); // [a b c d] + c per row
}

// The four rows' block scales d_r (the fp16 at each block's start) -> lane 4r + j, j < 4.
AI __m512 q40_quad_d(const void *w, size_t ws, size_t blk, const int NW) {
  const __m512i h = q4_quad_load(w, ws, blk, 0, NW); // row r's first 16 bytes in lane r
  // word k < 16 <- word 8 * (k / 4): the d of row k / 4 (two words per int32 below)
  const __m512i idx = _mm512_setr_epi32(0, 0, 0x00080008, 0x00080008, 0x00100010, 0x00100010, 0x00180018, 0x00180018, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, h)));
}

// ---- Q5_0 x Q8_0 (Q5 = 1 below) ----
// dot.c's order: each block's exact integer sum, then sum += (si * d_w) * d_a (ISO C, no
// contraction). Four rows per zmm as for Q4_0: q = nibble | fifth bit << 4 (0..31) unsigned
// against the signed activations, the fifth bits expanded from two 64-bit masks (16 bits of
// each row's qh per half); the offset is -16·Σa = 2 x the side table's -8·Σa. The partials
// can reach 8·31·128, so the reduction stays in 32 bits.
AI void qblk_quad_impl(int n, const void *w, size_t ws, const void *a, size_t as, const float *sca, const int32_t *ssa, size_t scs,
                      float *out, size_t os, const int NW, const int NA, const int SIDE, const int Q5) {
  const int nb = n / 32;
  const size_t bsz = Q5 ? sizeof(ll_block_q5_0) : sizeof(ll_block_q4_0);
  const __m512i m4 = _mm512_set1_epi8(0x0F), off = _mm512_set1_epi8(Q5 ? 16 : 8);
  // Q5_0: words 0..15 <- d of row k/4 (word 8(k/4)); words 16..19 <- qh bits 0..15 of rows
  // 0..3 (word 8r+1), words 20..23 <- qh bits 16..31 (word 8r+2).
  const __m512i hidx = _mm512_setr_epi32(0, 0, 0x00080008, 0x00080008, 0x00100010, 0x00100010, 0x00180018, 0x00180018, //
                                         0x00090001, 0x00190011, 0x000a0002, 0x001a0012, 0, 0, 0, 0);
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}; // tokens 0-3 / 4-7, lane 4r + t%4
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * bsz;
    const __m512i q = q4_quad_load(w, ws, blk, Q5 ? offsetof(ll_block_q5_0, qs) : offsetof(ll_block_q4_0, qs), NW);
    __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    __m512 dw; // d_r
    if (Q5) {
      const __m512i hw = _mm512_permutexvar_epi16(hidx, q4_quad_load(w, ws, blk, 0, NW));
      const __m128i qh = _mm512_extracti32x4_epi32(hw, 2);
      dw = _mm512_cvtph_ps(_mm512_castsi512_si256(hw));
      lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(_cvtu64_mask64((unsigned long long)_mm_cvtsi128_si64(qh)), off));
      hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(_cvtu64_mask64((unsigned long long)_mm_extract_epi64(qh, 1)), off));
    } else {
      dw = q40_quad_d(w, ws, blk, NW);
    }
    __m512i sum[8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NA; t++) {
      const char *y = (const char *)a + (size_t)t * as + (size_t)i * sizeof(ll_block_q8_0) + offsetof(ll_block_q8_0, qs);
      const __m512i al = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)y));
      const __m512i ah = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(y + 16)));
      __m512i s0 = _mm512_setzero_si512();
      if (!SIDE) // -off·Σa spread over each row's four lanes: dpbusd's start value
        s0 = _mm512_sub_epi32(s0, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), off, al), off, ah));
      sum[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s0, lo, al), hi, ah);
    }
    _Pragma("GCC unroll 2")
    for (int g = 0; 4 * g < NA; g++) {
      const int ng = NA - 4 * g < 4 ? NA - 4 * g : 4;
      const __mmask8 m = (__mmask8)((1u << ng) - 1);
      __m512i si;
      __m128 da; // the tokens' d_a
      if (SIDE) {
        const size_t at = (size_t)i * scs + 4 * g;
        const __m512i c = _mm512_broadcast_i32x4(ng == 4 ? _mm_loadu_si128((const __m128i *)(ssa + at)) : _mm_maskz_loadu_epi32(m, ssa + at));
        si = Q5 ? _mm512_add_epi32(q40_rows_tokens(sum + 4 * g, ng), _mm512_slli_epi32(c, 1)) : q40_rows_tokens16(sum + 4 * g, ng, c);
        da = ng == 4 ? _mm_loadu_ps(sca + at) : _mm_maskz_loadu_ps(m, sca + at);
      } else {
        si = q40_rows_tokens(sum + 4 * g, ng);
        __m128i uv = _mm_setzero_si128();
        _Pragma("GCC unroll 4")
        for (int t = 0; t < ng; t++) {
          ll_fp16 h;
          memcpy(&h, (const char *)a + (size_t)(4 * g + t) * as + (size_t)i * sizeof(ll_block_q8_0), sizeof h);
          uv = ins16(uv, h, t);
        }
        da = _mm_cvtph_ps(uv);
      }
      if (Q5) // sum + (si * d_w) * d_a
        acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(si), dw), _mm512_broadcast_f32x4(da)));
      else // fma(si, d_w * d_a, sum); the product of two halves is exact
        acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_mul_ps(dw, _mm512_broadcast_f32x4(da)), acc[g]);
    }
  }
  float o[2][16];
  _mm512_storeu_ps(o[0], acc[0]);
  if (NA > 4) _mm512_storeu_ps(o[1], acc[1]);
  _Pragma("GCC unroll 8")
  for (int t = 0; t < NA; t++)
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NW; r++) out[(size_t)t * os + r] = o[t / 4][4 * r + t % 4];
}

// ---- Q8_0 x Q8_0: two weight rows per zmm ----
// One block of rows r, r+1 fills a zmm [w_r | w_r1]; the token's block is broadcast to both
// halves, so vpdpbusd gives row r's 8 int32 lanes in the low half and row r+1's in the high
// half, the AVX2 path's lanes exactly. The activations are made unsigned (a+128, one xor per
// token and block) and the weights stay signed, so each lane's offset 128·Σw depends on the
// weights only: computed once per block for all tokens, removed through dpbusd's start value.
// Per lane the float steps are dot_avx2.c's (fma(d_w*d_a, float(isum), acc) per block in
// block order), so results stay bit-identical; one conversion and FMA serve two rows.
AI __m512i q8_pair_load(const void *w, size_t ws, size_t blk, int r, const int NW) {
  const char *p = (const char *)w + (size_t)r * ws + blk + offsetof(ll_block_q8_0, qs);
  const __m512i lo = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p));
  return r + 1 < NW ? _mm512_inserti64x4(lo, _mm256_loadu_si256((const __m256i *)(p + ws)), 1) : lo;
}
// hsum_float_8 of each 256-bit half of p0 and p1 -> [p0.lo, p0.hi, p1.lo, p1.hi].
AI __m128 q8_pair_hsum(__m512 p0, __m512 p1) {
  const __m512 v0 = _mm512_add_ps(p0, _mm512_shuffle_f32x4(p0, p0, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 v1 = _mm512_add_ps(p1, _mm512_shuffle_f32x4(p1, p1, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 t0 = _mm512_add_ps(v0, _mm512_permute_ps(v0, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 t1 = _mm512_add_ps(v1, _mm512_permute_ps(v1, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 u0 = _mm512_add_ps(t0, _mm512_movehdup_ps(t0)), u1 = _mm512_add_ps(t1, _mm512_movehdup_ps(t1));
  return _mm512_castps512_ps128(
      _mm512_permutex2var_ps(u0, _mm512_setr_epi32(0, 8, 16, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u1));
}

// Up to 8 tokens; d_a from the caller's scale table (tile_sc: sc = d_a, SIDE 1) or converted.
AI void q8_pair_impl(int n, const void *w, size_t ws, const void *a, size_t as, const float *sca, size_t scs, float *out, size_t os,
                    const int NW, const int NA, const int SIDE) {
  const int nb = n / 32;
  const int NP = (NW + 1) / 2; // row pairs
  const __m512i off = _mm512_set1_epi8((char)0x80);
  // Words 0..15 <- d of rows 0, 1 (8 each), words 16..31 <- d of rows 2, 3: word 8r of the heads.
  const __m512i hidx = _mm512_setr_epi32(0, 0, 0, 0, 0x00080008, 0x00080008, 0x00080008, 0x00080008, //
                                         0x00100010, 0x00100010, 0x00100010, 0x00100010, 0x00180018, 0x00180018, 0x00180018, 0x00180018);
  __m512 acc[8][2];
  _Pragma("GCC unroll 8")
  for (int t = 0; t < NA; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * sizeof(ll_block_q8_0);
    __m512i wv[2], cw[2];
    _Pragma("GCC unroll 2")
    for (int p = 0; p < NP; p++) {
      wv[p] = q8_pair_load(w, ws, blk, 2 * p, NW);
      cw[p] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, wv[p])); // -128·Σw per lane
    }
    const __m512i hw = _mm512_permutexvar_epi16(hidx, q4_quad_load(w, ws, blk, 0, NW));
    const __m512 dw[2] = {_mm512_cvtph_ps(_mm512_castsi512_si256(hw)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hw, 1))};
    _Pragma("GCC unroll 8")
    for (int t = 0; t < NA; t++) {
      const char *y = (const char *)a + (size_t)t * as + blk;
      const __m512i av = _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(y + offsetof(ll_block_q8_0, qs)))), off); // a + 128
      __m512 da;
      if (SIDE) {
        da = _mm512_set1_ps(sca[(size_t)i * scs + t]);
      } else {
        ll_fp16 h;
        memcpy(&h, y, sizeof h);
        da = _mm512_set1_ps(h2f(h));
      }
      _Pragma("GCC unroll 2")
      for (int p = 0; p < NP; p++)
        acc[t][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], da), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cw[p], av, wv[p])), acc[t][p]);
    }
  }
  _Pragma("GCC unroll 8")
  for (int t = 0; t < NA; t++) {
    float o[4];
    _mm_storeu_ps(o, q8_pair_hsum(acc[t][0], NP > 1 ? acc[t][1] : acc[t][0]));
    _Pragma("GCC unroll 4")
    for (int r = 0; r < NW; r++) out[(size_t)t * os + r] = o[r];
  }
}

// ---- instantiation: one function per (rows, tokens) so accumulators stay in registers ----
typedef void (*tile_fn)(int n, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os);
#define INST(NAME, CALL, NW, NA)                                                                     \
  static void NAME##_##NW##x##NA(int n, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os) { \
    CALL(NW, NA);                                                                                    \
  }

#define CALL_Q41(NW, NA) q4_1_quad_impl(n, w, ws, a, as, NULL, NULL, 0, out, os, NW, NA, 0)
#define CALL_Q80(NW, NA) q8_pair_impl(n, w, ws, a, as, NULL, 0, out, os, NW, NA, 0)
#define CALL_Q40(NW, NA) qblk_quad_impl(n, w, ws, a, as, NULL, NULL, 0, out, os, NW, NA, 0, 0)
#define CALL_Q40S(NW, NA) qblk_quad_impl(n, w, ws, a, as, sc, ss, scs, out, os, NW, NA, 1, 0)

// Tiles take up to 8 tokens (the weight-side work per block is shared by more tokens).
#define INST_ROW8(NAME, CALL, NW)                                                                  \
  INST(NAME, CALL, NW, 1) INST(NAME, CALL, NW, 2) INST(NAME, CALL, NW, 3) INST(NAME, CALL, NW, 4)     \
  INST(NAME, CALL, NW, 5) INST(NAME, CALL, NW, 6) INST(NAME, CALL, NW, 7) INST(NAME, CALL, NW, 8)
#define ROW8(NAME, NW) {NAME##_##NW##x1, NAME##_##NW##x2, NAME##_##NW##x3, NAME##_##NW##x4, NAME##_##NW##x5, NAME##_##NW##x6, NAME##_##NW##x7, NAME##_##NW##x8}
#define TILES8(NAME, CALL)                                                                         \
  INST_ROW8(NAME, CALL, 1) INST_ROW8(NAME, CALL, 2) INST_ROW8(NAME, CALL, 3) INST_ROW8(NAME, CALL, 4) \
  static const tile_fn NAME##_tiles[4][8] = {ROW8(NAME, 1), ROW8(NAME, 2), ROW8(NAME, 3), ROW8(NAME, 4)}; \
  static void tile_##NAME(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os) { \
    NAME##_tiles[nw - 1][na - 1](n, w, ws, a, as, out, os);                                          \
  }                                                                                                \
  static void dot_##NAME(int n, float *s, const void *w, const void *a) { NAME##_1x1(n, w, 0, a, 0, s, 1); }
#define CALL_Q50(NW, NA) qblk_quad_impl(n, w, ws, a, as, NULL, NULL, 0, out, os, NW, NA, 0, 1)
TILES8(q4_1, CALL_Q41)
TILES8(q4_0, CALL_Q40)
TILES8(q5_0, CALL_Q50)
TILES8(q8_0, CALL_Q80)
// The same with the caller's side tables of the activation blocks (ll_type_kernels.tile_sc).
typedef void (*tile_sc_fn)(int n, const void *w, size_t ws, const void *a, size_t as, const float *sc, const int32_t *ss, size_t scs,
                           float *out, size_t os);
#define INST_S(NAME, CALL, NW, NA)                                                                   \
  static void NAME##_##NW##x##NA(int n, const void *w, size_t ws, const void *a, size_t as, const float *sc, const int32_t *ss,     \
                                 size_t scs, float *out, size_t os) {                             \
    (void)ss;                                                                                      \
    CALL(NW, NA);                                                                                  \
  }
#define INST_S_ROW8(NAME, CALL, NW)                                                                  \
  INST_S(NAME, CALL, NW, 1) INST_S(NAME, CALL, NW, 2) INST_S(NAME, CALL, NW, 3) INST_S(NAME, CALL, NW, 4) \
  INST_S(NAME, CALL, NW, 5) INST_S(NAME, CALL, NW, 6) INST_S(NAME, CALL, NW, 7) INST_S(NAME, CALL, NW, 8)
#define TILES8_SC(NAME, CALL)                                                                      \
  INST_S_ROW8(NAME##s, CALL, 1) INST_S_ROW8(NAME##s, CALL, 2) INST_S_ROW8(NAME##s, CALL, 3) INST_S_ROW8(NAME##s, CALL, 4) \
  static const tile_sc_fn NAME##s_tiles[4][8] = {ROW8(NAME##s, 1), ROW8(NAME##s, 2), ROW8(NAME##s, 3), ROW8(NAME##s, 4)}; \
  static void tile_sc_##NAME(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, const float *sc,        \
                             const int32_t *ss, size_t scs, float *out, size_t os) {                \
    NAME##s_tiles[nw - 1][na - 1](n, w, ws, a, as, sc, ss, scs, out, os);                            \
  }
#define CALL_Q80S(NW, NA) q8_pair_impl(n, w, ws, a, as, sc, scs, out, os, NW, NA, 1)
#define CALL_Q50S(NW, NA) qblk_quad_impl(n, w, ws, a, as, sc, ss, scs, out, os, NW, NA, 1, 1)
#define CALL_Q41S(NW, NA) q4_1_quad_impl(n, w, ws, a, as, sc, ss, scs, out, os, NW, NA, 1)
TILES8_SC(q4_0, CALL_Q40S)
TILES8_SC(q4_1, CALL_Q41S)
TILES8_SC(q5_0, CALL_Q50S)
TILES8_SC(q8_0, CALL_Q80S)

// ---- Q5_0 x Q8_0 for prompts: 16 tokens to a zmm (ll_type_kernels.gemm16) ----
// The tiles above hold 4 rows x 4 tokens' partial sums per zmm and must reduce them, per
// block, before the float step (that reduction and its float work were most of a Gemma 3
// prompt's Q5_0 time). Here lane t is token t: the activations come transposed
// (ll_act_t16_q8_0: word w of 16 tokens' block in one zmm, as a + 128 unsigned), the weights
// are the signed side (q - 16, broadcast a word at a time from an unpacked copy), so 8
// vpdpbusd give each lane its token's whole block sum Σ (q - 16)(a + 128), and the weights'
// offset 128·Σ (q - 16) is removed through the start value. Then per block the dot's float
// step, (si · d_w) · d_a added to the sum (dot.c's order), on 16 tokens at once: bit-identical.
// Four rows per call: each activation load serves four chains.
static void gemm16_q5_0(int n, const void *w, size_t ws, const void *at, int ng, const float *sc, size_t scs, float *out, size_t os,
                        int accumulate) {
  enum { CB = 32 }; // blocks unpacked at a time (4 KiB of weights)
  const int nb = n / 32;
  int32_t wq[4][CB * 8] __attribute__((aligned(64))); // the rows' q - 16, as words of 4
  int32_t corr[4][CB];                                // -128 · Σ (q - 16) of each block
  float dw[4][CB];
  float S[LL_GEMM16_MAX_GROUPS][4][16] __attribute__((aligned(64))); // (group, row, token) sums between chunks
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256i x10 = _mm256_set1_epi8(0x10), off = _mm256_set1_epi8(16);
  for (int i0 = 0; i0 < nb; i0 += CB) {
    const int cb = nb - i0 < CB ? nb - i0 : CB;
    for (int r = 0; r < 4; r++)
      for (int i = 0; i < cb; i++) {
        const ll_block_q5_0 *x = (const ll_block_q5_0 *)(const void *)((const char *)w + (size_t)r * ws) + i0 + i;
        const __m128i qs = _mm_loadu_si128((const __m128i *)x->qs);
        uint32_t qh;
        memcpy(&qh, x->qh, 4);
        // elements 0..15: low nibbles, 16..31: high nibbles, the fifth bits (bit j of qh) as 16
        __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
        q = _mm256_or_si256(q, _mm256_maskz_mov_epi8((__mmask32)qh, x10));
        const __m256i sad = _mm256_sad_epu8(q, _mm256_setzero_si256()); // Σ q in four 64-bit lanes
        const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        const int sq = _mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2)));
        _mm256_store_si256((__m256i *)&wq[r][8 * i], _mm256_sub_epi8(q, off));
        corr[r][i] = -128 * (sq - 16 * 32);
        dw[r][i] = h2f(x->d);
      }
    for (int g = 0; g < ng; g++) {
      __m512 s[4];
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) s[r] = i0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(S[g][r]);
      const char *ag = (const char *)at + ((size_t)g * (size_t)nb + (size_t)i0) * 512;
      for (int i = 0; i < cb; i++) {
        __m512i acc[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) acc[r] = _mm512_set1_epi32(corr[r][i]);
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 8; k++) {
          const __m512i av = _mm512_loadu_si512((const void *)(ag + (size_t)i * 512 + 64 * k));
          _Pragma("GCC unroll 4")
          for (int r = 0; r < 4; r++) acc[r] = _mm512_dpbusd_epi32(acc[r], av, _mm512_set1_epi32(wq[r][8 * i + k]));
        }
        const __m512 da = _mm512_loadu_ps(sc + (size_t)(i0 + i) * scs + 16 * (size_t)g);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) s[r] = _mm512_add_ps(s[r], _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_set1_ps(dw[r][i])), da));
      }
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) _mm512_store_ps(S[g][r], s[r]);
    }
  }
  for (int g = 0; g < ng; g++)
    for (int t = 0; t < 16; t++) {
      float *o = out + (size_t)(16 * g + t) * os;
      for (int r = 0; r < 4; r++) o[r] = accumulate ? o[r] + S[g][r][t] : S[g][r][t];
    }
}

// The transpositions for gemm16 (ll_act_t16_q8_0 / _q8_K, dot.c, the same bytes): one gather
// per word of the 16 tokens (the scalar loops were 5.5% of a Gemma 3 prompt).
static void act_t16_q8_0(const void *act, size_t as, int ng, int64_t k, void *out) {
  const int64_t nb = k / 32;
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)as));
  const __m512i x80 = _mm512_set1_epi8((char)0x80);
  char *o = out;
  for (int g = 0; g < ng; g++)
    for (int64_t i = 0; i < nb; i++) {
      const char *b = (const char *)act + (size_t)(16 * g) * as + (size_t)i * sizeof(ll_block_q8_0) + offsetof(ll_block_q8_0, qs);
      _Pragma("GCC unroll 8")
      for (int w = 0; w < 8; w++, o += 64) _mm512_storeu_si512((void *)o, _mm512_xor_si512(_mm512_i32gather_epi32(rows, b + 4 * w, 1), x80));
    }
}
static void act_t16_q8_K(const void *act, size_t as, int ng, int64_t k, void *out) {
  const int64_t nsb = k / 256;
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)as));
  const __m512i x80 = _mm512_set1_epi8((char)0x80);
  for (int g = 0; g < ng; g++)
    for (int64_t i = 0; i < nsb; i++) {
      char *o = (char *)out + ((size_t)g * (size_t)nsb + (size_t)i) * LL_T16_Q8K_BYTES;
      const char *b = (const char *)act + (size_t)(16 * g) * as + (size_t)i * sizeof(ll_block_q8_K);
      for (int w = 0; w < 64; w++)
        _mm512_storeu_si512((void *)(o + 64 * w), _mm512_xor_si512(_mm512_i32gather_epi32(rows, b + offsetof(ll_block_q8_K, qs) + 4 * w, 1), x80));
      for (int j = 0; j < 16; j++) { // int16 bsum_j, sign-extended (its word is the low half of the gathered 32 bits)
        const __m512i v = _mm512_i32gather_epi32(rows, b + offsetof(ll_block_q8_K, bsums) + 2 * j, 1);
        _mm512_storeu_si512((void *)(o + 4096 + 64 * j), _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16));
      }
      _mm512_storeu_si512((void *)(o + 4096 + 1024), _mm512_i32gather_epi32(rows, b + offsetof(ll_block_q8_K, d), 1));
    }
}

// ---- Q4_K x Q8_K for prompts: 16 tokens to a zmm, as gemm16_q5_0 ----
// Activations from ll_act_t16_q8_K. Per 32-element sub-block j, 8 vpdpbusd give each token's
// Σ q·(a + 128), started at -128·Σ q (the weights' part, from the unpacked copy): Σ q·a
// exactly; times the sub-block's 6-bit scale and summed, the dot's isum; Σ min_j·(bsum_2j +
// bsum_2j+1) its msum; then per super-block the dot's float step,
// sum += d_a · (d · isum - dmin · msum), on 16 tokens at once (bit-identical).
static void gemm16_q4_K(int n, const void *w, size_t ws, const void *at, int ng, const float *sc, size_t scs, float *out, size_t os,
                        int accumulate) {
  (void)sc, (void)scs;
  const int nsb = n / 256;
  float S[LL_GEMM16_MAX_GROUPS][4][16] __attribute__((aligned(64)));
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int i = 0; i < nsb; i++) {
    int32_t wq[4][64] __attribute__((aligned(64))); // the rows' 256 q (0..15) as words of 4, element order
    int32_t corr[4][8], scl[4][8], mn[4][8];
    float d[4], dmin[4];
    for (int r = 0; r < 4; r++) {
      const ll_block_q4_K *x = (const ll_block_q4_K *)(const void *)((const char *)w + (size_t)r * ws) + i;
      const uint8_t *q = x->scales;
      for (int j = 0; j < 8; j++) { // ggml's get_scale_min_k4
        scl[r][j] = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mn[r][j] = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
      }
      for (int jj = 0; jj < 4; jj++) { // sub-blocks 2jj (low nibbles) and 2jj + 1 (high) of 32 bytes
        const __m256i b = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * jj));
        const __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
        _mm256_store_si256((__m256i *)&wq[r][16 * jj], lo);
        _mm256_store_si256((__m256i *)&wq[r][16 * jj + 8], hi);
        const __m256i sl = _mm256_sad_epu8(lo, _mm256_setzero_si256()), sh = _mm256_sad_epu8(hi, _mm256_setzero_si256());
        const __m256i s2 = _mm256_add_epi64(_mm256_unpacklo_epi64(sl, sh), _mm256_unpackhi_epi64(sl, sh)); // [l h | l h]
        const __m128i s1 = _mm_add_epi64(_mm256_castsi256_si128(s2), _mm256_extracti128_si256(s2, 1));
        corr[r][2 * jj] = -128 * _mm_cvtsi128_si32(s1);
        corr[r][2 * jj + 1] = -128 * _mm_extract_epi32(s1, 2);
      }
      d[r] = h2f(x->d), dmin[r] = h2f(x->dmin);
    }
    for (int g = 0; g < ng; g++) {
      const char *ag = (const char *)at + ((size_t)g * (size_t)nsb + (size_t)i) * LL_T16_Q8K_BYTES;
      __m512i isum[4], msum[4];
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) isum[r] = msum[r] = _mm512_setzero_si512();
      for (int j = 0; j < 8; j++) {
        __m512i acc[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) acc[r] = _mm512_set1_epi32(corr[r][j]);
        _Pragma("GCC unroll 8")
        for (int k = 0; k < 8; k++) {
          const __m512i av = _mm512_loadu_si512((const void *)(ag + 64 * (8 * j + k)));
          _Pragma("GCC unroll 4")
          for (int r = 0; r < 4; r++) acc[r] = _mm512_dpbusd_epi32(acc[r], av, _mm512_set1_epi32(wq[r][8 * j + k]));
        }
        const __m512i bs = _mm512_add_epi32(_mm512_loadu_si512((const void *)(ag + 4096 + 64 * (2 * j))),
                                            _mm512_loadu_si512((const void *)(ag + 4096 + 64 * (2 * j + 1))));
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) {
          isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(acc[r], _mm512_set1_epi32(scl[r][j])));
          msum[r] = _mm512_add_epi32(msum[r], _mm512_mullo_epi32(bs, _mm512_set1_epi32(mn[r][j])));
        }
      }
      const __m512 da = _mm512_loadu_ps((const void *)(ag + 4096 + 1024));
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) {
        const __m512 v = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d[r]), _mm512_cvtepi32_ps(isum[r])),
                                       _mm512_mul_ps(_mm512_set1_ps(dmin[r]), _mm512_cvtepi32_ps(msum[r])));
        const __m512 prev = i == 0 ? _mm512_setzero_ps() : _mm512_load_ps(S[g][r]);
        _mm512_store_ps(S[g][r], _mm512_add_ps(prev, _mm512_mul_ps(da, v)));
      }
    }
  }
  for (int g = 0; g < ng; g++)
    for (int t = 0; t < 16; t++) {
      float *o = out + (size_t)(16 * g + t) * os;
      for (int r = 0; r < 4; r++) o[r] = accumulate ? o[r] + S[g][r][t] : S[g][r][t];
    }
}
// ---- Q6_K x Q8_K for prompts: 16 tokens to a zmm, as gemm16_q4_K ----
// Per 16-element sub-block j: 4 vpdpbusd from -128·Σ q give Σ q·a (q = 0..63), less 32·bsum_j
// the exact Σ (q - 32)·a, times the int8 scale into isum; per super-block the dot's float step
// sum += (d · d_a) · isum on 16 tokens at once (bit-identical).
static void gemm16_q6_K(int n, const void *w, size_t ws, const void *at, int ng, const float *sc, size_t scs, float *out, size_t os,
                        int accumulate) {
  (void)sc, (void)scs;
  const int nsb = n / 256;
  float S[LL_GEMM16_MAX_GROUPS][4][16] __attribute__((aligned(64)));
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (int i = 0; i < nsb; i++) {
    int32_t wq[4][64] __attribute__((aligned(64))); // the rows' 256 q (0..63) as words of 4, element order
    int32_t corr[4][16], scl[4][16];
    float d[4];
    for (int r = 0; r < 4; r++) {
      const ll_block_q6_K *x = (const ll_block_q6_K *)(const void *)((const char *)w + (size_t)r * ws) + i;
      for (int j = 0; j < 16; j++) scl[r][j] = x->scales[j];
      for (int h = 0; h < 2; h++) { // elements 128 h + 32 k + l, as k6_q
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h)), l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        for (int k = 0; k < 4; k++) {
          _mm256_store_si256((__m256i *)&wq[r][32 * h + 8 * k], q[k]);
          const __m256i sd = _mm256_sad_epu8(q[k], _mm256_setzero_si256()); // [s0 s1 | s2 s3]: 8 bytes each
          const __m256i s2 = _mm256_add_epi64(sd, _mm256_srli_si256(sd, 8));  // s0+s1 | s2+s3
          const int j = 8 * h + 2 * k; // the two 16-element sub-blocks of these 32
          corr[r][j] = -128 * _mm256_extract_epi32(s2, 0);
          corr[r][j + 1] = -128 * _mm256_extract_epi32(s2, 4);
        }
      }
      d[r] = h2f(x->d);
    }
    for (int g = 0; g < ng; g++) {
      const char *ag = (const char *)at + ((size_t)g * (size_t)nsb + (size_t)i) * LL_T16_Q8K_BYTES;
      __m512i isum[4];
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) isum[r] = _mm512_setzero_si512();
      for (int j = 0; j < 16; j++) {
        const __m512i b32 = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(ag + 4096 + 64 * j)), 5); // 32·bsum_j
        __m512i acc[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) acc[r] = _mm512_sub_epi32(_mm512_set1_epi32(corr[r][j]), b32);
        _Pragma("GCC unroll 4")
        for (int k = 0; k < 4; k++) {
          const __m512i av = _mm512_loadu_si512((const void *)(ag + 64 * (4 * j + k)));
          _Pragma("GCC unroll 4")
          for (int r = 0; r < 4; r++) acc[r] = _mm512_dpbusd_epi32(acc[r], av, _mm512_set1_epi32(wq[r][4 * j + k]));
        }
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(acc[r], _mm512_set1_epi32(scl[r][j])));
      }
      const __m512 da = _mm512_loadu_ps((const void *)(ag + 4096 + 1024));
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) {
        const __m512 prev = i == 0 ? _mm512_setzero_ps() : _mm512_load_ps(S[g][r]);
        _mm512_store_ps(S[g][r], _mm512_add_ps(prev, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d[r]), da), _mm512_cvtepi32_ps(isum[r]))));
      }
    }
  }
  for (int g = 0; g < ng; g++)
    for (int t = 0; t < 16; t++) {
      float *o = out + (size_t)(16 * g + t) * os;
      for (int r = 0; r < 4; r++) o[r] = accumulate ? o[r] + S[g][r][t] : S[g][r][t];
    }
}
// The K-quants' other kernels are the AVX2 ones, with these for prompts.
static struct ll_type_kernels avx512_q4_K, avx512_q6_K;
static pthread_once_t avx512_k_once = PTHREAD_ONCE_INIT;
static void avx512_k_init(void) {
  avx512_q4_K = *ll_cpu_kernels_avx2(LL_TYPE_Q4_K);
  avx512_q4_K.isa = "avx512vnni";
  avx512_q4_K.gemm16 = gemm16_q4_K;
  avx512_q4_K.act_t16 = act_t16_q8_K;
  avx512_q6_K = *ll_cpu_kernels_avx2(LL_TYPE_Q6_K);
  avx512_q6_K.isa = "avx512vnni";
  avx512_q6_K.gemm16 = gemm16_q6_K;
  avx512_q6_K.act_t16 = act_t16_q8_K;
}

static const struct ll_type_kernels avx512_table[LL_TYPE_COUNT] = {
    [LL_TYPE_Q4_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0_avx2, dot_q4_0, "avx512vnni", tile_q4_0, 8, tile_sc_q4_0, 8, 8, ll_q4_0_tile_packed_avx2},
    [LL_TYPE_Q4_1] = {LL_TYPE_Q8_1, ll_act_quantize_q8_1_avx2, dot_q4_1, "avx512vnni", tile_q4_1, 8, tile_sc_q4_1, 8, 4, ll_q4_1_tile_packed_avx2},
    [LL_TYPE_Q8_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0_avx2, dot_q8_0, "avx512vnni", tile_q8_0, 8, tile_sc_q8_0, 8, 4, ll_q8_0_tile_packed_avx2},
    [LL_TYPE_Q5_0] = {LL_TYPE_Q8_0, ll_act_quantize_q8_0_avx2, dot_q5_0, "avx512vnni", tile_q5_0, 8, tile_sc_q5_0, 8, 8, ll_q5_0_tile_packed_avx2, gemm16_q5_0, act_t16_q8_0},
};

const struct ll_type_kernels *ll_cpu_kernels_avx512(int t) {
  if ((t == LL_TYPE_Q4_K || t == LL_TYPE_Q6_K) && ll_cpu_kernels_avx2(LL_TYPE_Q4_K) && ll_cpu_kernels_avx2(LL_TYPE_Q6_K)) {
    pthread_once(&avx512_k_once, avx512_k_init);
    return t == LL_TYPE_Q4_K ? &avx512_q4_K : &avx512_q6_K;
  }
  if (t < 0 || t >= LL_TYPE_COUNT || !avx512_table[t].vec_dot) return NULL;
  return &avx512_table[t];
}
