// dot_avx2.c - AVX2 + FMA + F16C dot products (compiled with -mavx2 -mfma -mf16c; chosen at
// run time only on CPUs that have them). Same block math as the scalar references in dot.c;
// only the order of the float reduction differs (tested against them).
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "ll_cpu_dot.h"
#include "ll_quant.h"

// The halves added, then lanes 0,1 + 2,3, then lane 0 + lane 1: ggml's and tinyBLAS's hsum
// (theirs add hi + lo; the same bits).
static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// hsum256 of eight vectors at once, into one vector (lane r: x[r]'s sum): the same adds in
// the same order per vector.
static inline __m256 hsum256_x8(const __m256 x[8]) {
  __m256 s[4], u[2];
  for (int p = 0; p < 4; p++) // [x(2p): lo + hi | x(2p+1): lo + hi]
    s[p] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * p], x[2 * p + 1], 0x31), _mm256_permute2f128_ps(x[2 * p], x[2 * p + 1], 0x20));
  for (int p = 0; p < 2; p++) // [x(4p): l0+l2, l1+l3, x(4p+2): .., .. | x(4p+1): .., .., x(4p+3): .., ..]
    u[p] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)), // [x0 x2 x4 x6 | x1 x3 x5 x7]
                                 _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// fp16 -> fp32 through a 256 KiB table (built once): a load instead of the vpinsrw+vcvtph2ps
// pair, which competes for the shuffle port with the nibble unpacking in the dot loops.
static float fp16_table[65536];
static pthread_once_t fp16_once = PTHREAD_ONCE_INIT;
static void fp16_table_init(void) {
  for (int i = 0; i < 65536; i++) fp16_table[i] = _cvtsh_ss((unsigned short)i);
}
static inline float h2f(ll_fp16 h) { return fp16_table[h]; }

// The packed decode kernels (tile_packed) read their group as one stream and, on CPUs without
// AVX-512, prefetch it PACKED_PF bytes ahead: every line of the block `bytes` long at
// p + PACKED_PF. Measured 2026-11-24 on a 2-vCPU Zen 3 EPYC (AVX2 only, 1 thread, 256 MiB packed
// matrices in 2 MiB pages, read bandwidth 20-21 GB/s): Q8_0 14.5 GB/s without, 19.5-20.1 with
// 3-16 KiB ahead, Q4_0 15.1 -> 18.7, Q5_0 13.2 -> 18.7: with its loads spread among the
// arithmetic the kernel alone does not keep enough lines in flight for the hardware
// prefetcher. On the Zen 4 (AVX-512) VM the same prefetch, 1-8 KiB ahead, cost one thread
// 5-30% (its prefetcher keeps up: 24.5-27.4 GB/s against a read bandwidth of 24.9), so CPUs
// with AVX-512 go without; LL_CPU_PREFETCH=0 or 1 overrides either way. Past the end of a
// group the next group follows (one matrix is one run of groups); past the end of the matrix
// a prefetch only wastes a few lines (it never faults).
#define PACKED_PF 4096
static atomic_int packed_pf = -1; // 1: prefetch, 0: not, -1: not decided yet (any thread may decide: same answer)
static int packed_pf_on(void) {
  int v = atomic_load_explicit(&packed_pf, memory_order_relaxed);
  if (v < 0) {
    const char *e = getenv("LL_CPU_PREFETCH");
    v = e && *e ? atoi(e) != 0 : !__builtin_cpu_supports("avx512f");
    atomic_store_explicit(&packed_pf, v, memory_order_relaxed);
  }
  return v;
}
__attribute__((always_inline)) static inline void packed_prefetch(const int on, const char *p, const size_t bytes) {
  if (on)
    for (size_t l = 0; l < bytes; l += 64) // (as an integer: the address may lie past the matrix)
      _mm_prefetch((const char *)((uintptr_t)p + PACKED_PF + l), _MM_HINT_T0);
}

// Row r of a tile's weights.
#define W_ROW(T, r) const T *w##r = (const T *)((const char *)w + (size_t)(r) * w_stride)

// 16 bytes of packed nibbles -> 32 bytes: low nibbles first (elements 0..15), then high.
// (broadcast load + shift + blend: no shuffle-port work)
static inline __m256i unpack_nibbles(const uint8_t *qs) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
  const __m256i both = _mm256_blend_epi32(b, _mm256_srli_epi16(b, 4), 0xF0);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Σ unsigned(a) * signed(b) over 32 bytes, as 8 floats.
static inline __m256 mul_sum_us8(__m256i a, __m256i b) {
  const __m256i dot16 = _mm256_maddubs_epi16(a, b);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot16, _mm256_set1_epi16(1)));
}

// Σ signed(a) * signed(b): make a unsigned by moving its sign onto b.
static inline __m256 mul_sum_i8(__m256i a, __m256i b) {
  return mul_sum_us8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// Q4_0: dot.c's order (llama.cpp's repacked one): exact integer sum per block, then one fused
// multiply-add per block.
static inline __m256i isum_i8(__m256i a, __m256i b) { // 8 int32 lanes of Σ signed(a)·signed(b)
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)), _mm256_set1_epi16(1));
}
static inline int hsum_i32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}
static void dot_q4_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_0 *x = w;
  const ll_block_q8_0 *y = a;
  float sum = 0;
  const __m256i off = _mm256_set1_epi8(8);
  for (int i = 0; i < n / 32; i++) {
    const __m256i qx = _mm256_sub_epi8(unpack_nibbles(x[i].qs), off);
    const int si = hsum_i32(isum_i8(qx, _mm256_loadu_si256((const __m256i *)y[i].qs)));
    sum = fmaf((float)si, h2f(x[i].d) * h2f(y[i].d), sum);
  }
  *s = sum;
}

static void dot_q4_1_q8_1(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_1 *x = w;
  const ll_block_q8_1 *y = a;
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int i = 0; i < n / 32; i++) {
    summs += h2f(x[i].m) * h2f(y[i].s);
    const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
    const __m256i qx = unpack_nibbles(x[i].qs);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, mul_sum_us8(qx, qy), acc);
  }
  *s = hsum256(acc) + summs;
}

static void dot_q8_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q8_0 *x = w, *y = a;
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n / 32; i++) {
    const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
    const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    acc = _mm256_fmadd_ps(d, mul_sum_i8(qx, qy), acc);
  }
  *s = hsum256(acc);
}

static void dot_f32(int n, float *s, const void *w, const void *a) {
  const float *x = w, *y = a;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
  }
  float sum = hsum256(_mm256_add_ps(a0, a1));
  for (; i < n; i++) sum += x[i] * y[i];
  *s = sum;
}

static void dot_f16(int n, float *s, const void *w, const void *a) {
  const ll_fp16 *x = w, *y = a;
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
    const __m256 yv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));
    acc = _mm256_fmadd_ps(xv, yv, acc);
  }
  float sum = hsum256(acc);
  for (; i < n; i++) sum += h2f(x[i]) * h2f(y[i]);
  *s = sum;
}


// ---- Q5_0 / Q5_1 / K-quants: the exact integer sums of the scalar references (dot.c) with
// SIMD, then the very same float expression, so results are bit-identical to them (tested).

// 32 bits -> 32 bytes, byte e = 0x10 if bit e is set (the fifth bit of Q5 weights).
static inline __m256i bits_to_0x10(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
  b = _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

// Σ u(a)·b over 32 bytes as an exact int (u8 x s8 pairs stay far below int16 limits here).
static inline int isum_us8(__m256i a, __m256i b) {
  return hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}

static void dot_q5_0_q8_0(int n, float *s, const void *w, const void *a) {
  const ll_block_q5_0 *x = w;
  const ll_block_q8_0 *y = a;
  float sum = 0;
  for (int i = 0; i < n / 32; i++) {
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    const __m256i q = _mm256_or_si256(unpack_nibbles(x[i].qs), bits_to_0x10(qh)); // 0..31
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y[i].qs);
    const int si = isum_us8(q, yv) - 16 * isum_us8(_mm256_set1_epi8(1), yv); // Σ (q-16)·y
    sum += si * h2f(x[i].d) * h2f(y[i].d);
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
    const __m256i q = _mm256_or_si256(unpack_nibbles(x[i].qs), bits_to_0x10(qh));
    const int si = isum_us8(q, _mm256_loadu_si256((const __m256i *)y[i].qs));
    sum += (h2f(x[i].d) * h2f(y[i].d)) * si + h2f(x[i].m) * h2f(y[i].s);
  }
  *s = sum;
}


// Q4_K / Q5_K: per 64 elements, low then high nibbles (+ the fifth bit for Q5_K) times the
// Q8_K bytes, scaled by the 6-bit sub-block scales in int32. Every sum here is an exact
// integer, so how it is formed is free; only the float step (in the dots and tiles) is fixed.
// The 8 scales (bytes 0-7) and 8 mins (bytes 8-15) of a super-block, as k_scale_min decodes
// them one by one (ggml's bit shuffle, four words at once).
static inline __m128i k4_scales_mins(const uint8_t *scales) {
  uint32_t u[4];
  memcpy(u, scales, 12);
  const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
  u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4); // mins 4..7
  const uint32_t mins03 = u[1] & m1;
  u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4); // scales 4..7
  u[2] = mins03;
  u[0] &= m1; // scales 0..3
  return _mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]);
}
// int16 lane pattern for _mm256_shuffle_epi8: word j of each 128-bit half in all 8 words.
static inline __m256i k_word_bcast(int j) { return _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))); }
// A super-block's weights unpacked (scales and values), shared by every token of a tile.
struct k4_unpacked {
  __m256i q[8];  // sub-blocks 2j (low nibbles) and 2j+1 (high), 32 bytes each, 0..15 (0..31 for Q5_K)
  __m256i sc[8]; // their 6-bit scales as int16 lanes
  __m128i mn;    // their 6-bit mins, int16
};
// Sub-block j's 32 weights (0..15, or 0..31 with Q5_K's fifth bits from qhv).
static inline __m256i k4_q(const uint8_t *qs, __m256i qhv, int has_qh, int j) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
  __m256i q = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4) : _mm256_and_si256(qb, m4);
  if (has_qh) q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, j), one), 4));
  return q;
}
static inline void k4_unpack(const uint8_t *qs, const uint8_t *qh, const uint8_t *scales, struct k4_unpacked *u) {
  const __m256i qhv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
  const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins(scales)); // scales 0..7 | mins 0..7
  const __m256i scv = _mm256_permute2x128_si256(sm, sm, 0x00);
  u->mn = _mm256_extracti128_si256(sm, 1);
  for (int j = 0; j < 8; j++) {
    u->sc[j] = _mm256_shuffle_epi8(scv, k_word_bcast(j));
    u->q[j] = k4_q(qs, qhv, qh != NULL, j);
  }
}
// Σ min·bsum of one token's super-block: the bsums (per 16) summed in pairs (per sub-block),
// times the mins, exact in int16 / int32 (|bsum pair| <= 32·128, min <= 63).
static inline int k4_msum(const ll_block_q8_K *y, __m128i mn) {
  const __m128i b = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums), _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
  __m128i x = _mm_madd_epi16(mn, b);
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}
// The exact Σ scale·q·y and Σ min·bsum of one token's super-block.
static inline void k4_isum(const ll_block_q8_K *y, const struct k4_unpacked *u, int *isum, int *msum) {
  __m256i acc = _mm256_setzero_si256();
  for (int j = 0; j < 8; j++)
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[j], _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j))), u->sc[j]));
  *isum = hsum_i32(acc);
  *msum = k4_msum(y, u->mn);
}
// The same sums for one token without the unpacked copy (a decode step: nothing to share):
// Σ scale·q·y in 8 int32 lanes, and the super-block's mins (*mn, int16) for Σ min·bsum.
static inline __m256i k4_lanes1(const ll_block_q8_K *y, const uint8_t *qs, const uint8_t *qh, const uint8_t *scales, __m128i *mn) {
  const __m256i qhv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
  const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins(scales));
  const __m256i scv = _mm256_permute2x128_si256(sm, sm, 0x00);
  __m256i acc = _mm256_setzero_si256();
  for (int j = 0; j < 8; j++) {
    const __m256i p = _mm256_maddubs_epi16(k4_q(qs, qhv, qh != NULL, j), _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(scv, k_word_bcast(j))));
  }
  *mn = _mm256_extracti128_si256(sm, 1);
  return acc;
}
static inline void k4_sums(const ll_block_q8_K *y, const uint8_t *qs, const uint8_t *qh, const uint8_t *scales, int *isum, int *msum) {
  __m128i mn;
  *isum = hsum_i32(k4_lanes1(y, qs, qh, scales, &mn));
  *msum = k4_msum(y, mn);
}

static void dot_q4_K_q8_K(int n, float *s, const void *w, const void *a) {
  const ll_block_q4_K *x = w;
  const ll_block_q8_K *y = a;
  float sum = 0;
  for (int i = 0; i < n / 256; i++) {
    int isum, msum;
    k4_sums(&y[i], x[i].qs, NULL, x[i].scales, &isum, &msum);
    sum += y[i].d * (h2f(x[i].d) * isum - h2f(x[i].dmin) * msum);
  }
  *s = sum;
}

static void dot_q5_K_q8_K(int n, float *s, const void *w, const void *a) {
  const ll_block_q5_K *x = w;
  const ll_block_q8_K *y = a;
  float sum = 0;
  for (int i = 0; i < n / 256; i++) {
    int isum, msum;
    k4_sums(&y[i], x[i].qs, x[i].qh, x[i].scales, &isum, &msum);
    sum += y[i].d * (h2f(x[i].d) * isum - h2f(x[i].dmin) * msum);
  }
  *s = sum;
}

// Q6_K: 6-bit values q (0..63) from ql/qh; Σ (q-32)·y·scale per 16 elements, exact in int32,
// taken as Σ q·y·scale - 32·Σ scale·bsum (Q8_K's bsums are its 16-element sums): the same
// integer, one multiply per 32 values fewer.
struct k6_unpacked {
  __m256i q[8];  // 32 values each: half h, part k at 4h + k
  __m256i sc[8]; // their two 16-element scales as int16 lanes (elements 0-15 | 16-31)
  __m256i sc16;  // the 16 scales as int16 (for the bsums)
};
// Part k (0..3) of half h's 32 values, from that half's ql (l0, l1) and qh (h).
// The high bits 2k, 2k+1 of each qh byte go to bits 4, 5 with one 16-bit shift and one and
// (bits crossing between the bytes of a word land outside 0x30).
static inline __m256i k6_q(__m256i l0, __m256i l1, __m256i h, int k) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i l = k & 1 ? l1 : l0;
  const __m256i lo = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
  const __m256i hs = k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2) : k == 2 ? h : _mm256_srli_epi16(h, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hs, m30));
}
// Pattern for _mm256_shuffle_epi8 on [scales as int16 | the same]: word a in the low half's 8
// words, word b in the high half's.
static inline __m256i k6_word_pair(int a, int b) {
  return _mm256_setr_m128i(_mm_set1_epi16((short)(((2 * a + 1) << 8) | (2 * a))), _mm_set1_epi16((short)(((2 * b + 1) << 8) | (2 * b))));
}
static inline void k6_unpack(const ll_block_q6_K *x, struct k6_unpacked *u) {
  u->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
  for (int half = 0; half < 2; half++) {
    const uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    // this half's 8 scales, both halves (literal immediates: an unoptimised build does not fold)
    const __m256i s8 = half ? _mm256_permute2x128_si256(u->sc16, u->sc16, 0x11) : _mm256_permute2x128_si256(u->sc16, u->sc16, 0x00);
    for (int k = 0; k < 4; k++) {
      u->q[4 * half + k] = k6_q(l0, l1, h, k);
      u->sc[4 * half + k] = _mm256_shuffle_epi8(s8, k6_word_pair(2 * k, 2 * k + 1));
    }
  }
}
// -32·Σ scale·bsum (|scale·bsum| <= 128·2048: exact in int32 lanes).
static inline __m256i k6_offset(const ll_block_q8_K *y, __m256i sc16) {
  return _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y->bsums)), 5);
}
static inline int k6_isum(const ll_block_q8_K *y, const struct k6_unpacked *u) {
  __m256i acc = _mm256_setzero_si256();
  for (int j = 0; j < 8; j++) {
    const __m256i yv = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u->q[j], yv), u->sc[j])); // q·y pairs <= 2·63·128
  }
  return hsum_i32(_mm256_sub_epi32(acc, k6_offset(y, u->sc16)));
}
// The same for one token without the unpacked copy: its 8 int32 lanes, then their sum.
static inline __m256i k6_lanes1(const ll_block_q8_K *y, const ll_block_q6_K *x) {
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
  __m256i acc = _mm256_setzero_si256();
  for (int half = 0; half < 2; half++) {
    const uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    const __m256i s8 = half ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
    for (int k = 0; k < 4; k++) {
      const __m256i yv = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * half + 32 * k));
      const __m256i p = _mm256_maddubs_epi16(k6_q(l0, l1, h, k), yv);
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(s8, k6_word_pair(2 * k, 2 * k + 1))));
    }
  }
  return _mm256_sub_epi32(acc, k6_offset(y, sc16));
}
static inline int k6_isum1(const ll_block_q8_K *y, const ll_block_q6_K *x) { return hsum_i32(k6_lanes1(y, x)); }
static void dot_q6_K_q8_K(int n, float *s, const void *w, const void *a) {
  const ll_block_q6_K *x = w;
  const ll_block_q8_K *y = a;
  float sum = 0;
  for (int i = 0; i < n / 256; i++) {
    const int isum = k6_isum1(&y[i], &x[i]);
    sum += h2f(x[i].d) * y[i].d * isum;
  }
  *s = sum;
}

// ---- K-quant tiles: each weight row's super-block unpacked once for up to 8 tokens ----
// Per token the integer sums are the dot's (exact) and the float step the same C expression
// (ISO C: no contraction), so every output has the dot's bits.

// The four rows' int32 lanes (a[r], 8 each) summed per row: [r0 r1 r2 r3].
static inline __m128i hsum4_i32(const __m256i a[4]) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
// Decode (one token) over 4 rows at once: the token's blocks are loaded once for the 4 rows,
// the rows' lane sums reduce together, and the float step runs on 4 lanes - per lane the
// dot's expression, operation by operation, so each output keeps the dot's bits. One row at
// a time this was compute-bound at 14-16 GB/s on one AVX2 thread.
// k4_block4 adds super-block y's terms of rows at x, x + rs, x + 2rs, x + 3rs to sum.
static inline __m128 k4_block4(const char *x0, size_t rs, const ll_block_q8_K *y, __m128 sum, int q5) {
  const __m128i b = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums), _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
  __m256i acc[4];
  __m128i ms[4];
  float d[4], dmin[4];
  for (int r = 0; r < 4; r++) {
    const uint8_t *qs, *qh = NULL, *scales;
    if (q5) {
      const ll_block_q5_K *x = (const ll_block_q5_K *)(const void *)(x0 + (size_t)r * rs);
      qs = x->qs, qh = x->qh, scales = x->scales, d[r] = h2f(x->d), dmin[r] = h2f(x->dmin);
    } else {
      const ll_block_q4_K *x = (const ll_block_q4_K *)(const void *)(x0 + (size_t)r * rs);
      qs = x->qs, scales = x->scales, d[r] = h2f(x->d), dmin[r] = h2f(x->dmin);
    }
    __m128i mn;
    acc[r] = k4_lanes1(y, qs, qh, scales, &mn);
    ms[r] = _mm_madd_epi16(mn, b);
  }
  const __m128 isum = _mm_cvtepi32_ps(hsum4_i32(acc));
  const __m128 msum = _mm_cvtepi32_ps(_mm_hadd_epi32(_mm_hadd_epi32(ms[0], ms[1]), _mm_hadd_epi32(ms[2], ms[3])));
  // sum += y->d * (d * isum - dmin * msum)
  const __m128 t = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(d), isum), _mm_mul_ps(_mm_loadu_ps(dmin), msum));
  return _mm_add_ps(sum, _mm_mul_ps(_mm_set1_ps(y->d), t));
}
// A prompt's super-block i: the four rows unpacked once (k4_unpack), then per token the four
// rows' sums together and the float step on four lanes, k4_block4's (so the dot's bits); one
// row at a time each (row, token) paid a horizontal sum, the mins' sum and a scalar step
// (Q4_K was 27% of a Gemma 3 270M prompt, 2026-11-27).
__attribute__((always_inline)) static inline void sum_k4_rows4(__m128 *sum, const char *x0, size_t rs, const char *a, size_t as, int na, int q5) {
  struct k4_unpacked u[4];
  __m128 d, dmin;
  float dv[4], mv[4];
  for (int r = 0; r < 4; r++) {
    const char *xr = x0 + (size_t)r * rs;
    if (q5) {
      const ll_block_q5_K *x = (const ll_block_q5_K *)(const void *)xr;
      k4_unpack(x->qs, x->qh, x->scales, &u[r]), dv[r] = h2f(x->d), mv[r] = h2f(x->dmin);
    } else {
      const ll_block_q4_K *x = (const ll_block_q4_K *)(const void *)xr;
      k4_unpack(x->qs, NULL, x->scales, &u[r]), dv[r] = h2f(x->d), mv[r] = h2f(x->dmin);
    }
  }
  d = _mm_loadu_ps(dv), dmin = _mm_loadu_ps(mv);
  for (int t = 0; t < na; t++) {
    const ll_block_q8_K *y = (const ll_block_q8_K *)(const void *)(a + (size_t)t * as);
    const __m128i b = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums), _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++) {
      const __m256i yv = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j));
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u[r].q[j], yv), u[r].sc[j]));
    }
    __m128i ms[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) ms[r] = _mm_madd_epi16(u[r].mn, b);
    const __m128 isum = _mm_cvtepi32_ps(hsum4_i32(acc));
    const __m128 msum = _mm_cvtepi32_ps(_mm_hadd_epi32(_mm_hadd_epi32(ms[0], ms[1]), _mm_hadd_epi32(ms[2], ms[3])));
    // sum += y->d * (d * isum - dmin * msum)
    const __m128 v = _mm_sub_ps(_mm_mul_ps(d, isum), _mm_mul_ps(dmin, msum));
    sum[t] = _mm_add_ps(sum[t], _mm_mul_ps(_mm_set1_ps(y->d), v));
  }
}
__attribute__((always_inline)) static inline void tile_k4(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os, int q5) {
  if (na == 1 && nw == 4) {
    const size_t bs = q5 ? sizeof(ll_block_q5_K) : sizeof(ll_block_q4_K);
    __m128 sum = _mm_setzero_ps();
    for (int i = 0; i < n / 256; i++) sum = k4_block4((const char *)w + (size_t)i * bs, ws, (const ll_block_q8_K *)a + i, sum, q5);
    _mm_storeu_ps(out, sum);
    return;
  }
  if (nw == 4 && na > 1) { // a prompt: 4 rows x na tokens, as k4_block4 per token
    const size_t bs = q5 ? sizeof(ll_block_q5_K) : sizeof(ll_block_q4_K);
    __m128 sum[8];
    for (int t = 0; t < na; t++) sum[t] = _mm_setzero_ps();
    for (int i = 0; i < n / 256; i++)
      sum_k4_rows4(sum, (const char *)w + (size_t)i * bs, ws, (const char *)a + (size_t)i * sizeof(ll_block_q8_K), as, na, q5);
    for (int t = 0; t < na; t++) _mm_storeu_ps(out + (size_t)t * os, sum[t]);
    return;
  }
  for (int r = 0; r < nw; r++) {
    float sum[8] = {0};
    for (int i = 0; i < n / 256; i++) {
      struct k4_unpacked u;
      float d, dmin;
      const uint8_t *qs, *qh = NULL, *scales;
      if (q5) {
        const ll_block_q5_K *x = (const ll_block_q5_K *)(const void *)((const char *)w + (size_t)r * ws) + i;
        qs = x->qs, qh = x->qh, scales = x->scales, d = h2f(x->d), dmin = h2f(x->dmin);
      } else {
        const ll_block_q4_K *x = (const ll_block_q4_K *)(const void *)((const char *)w + (size_t)r * ws) + i;
        qs = x->qs, scales = x->scales, d = h2f(x->d), dmin = h2f(x->dmin);
      }
      if (na == 1) { // one token: the sums straight from the block
        const ll_block_q8_K *y = (const ll_block_q8_K *)a + i;
        int isum, msum;
        k4_sums(y, qs, qh, scales, &isum, &msum);
        sum[0] += y->d * (d * isum - dmin * msum);
        continue;
      }
      k4_unpack(qs, qh, scales, &u);
      for (int t = 0; t < na; t++) {
        const ll_block_q8_K *y = (const ll_block_q8_K *)(const void *)((const char *)a + (size_t)t * as) + i;
        int isum, msum;
        k4_isum(y, &u, &isum, &msum);
        sum[t] += y->d * (d * isum - dmin * msum);
      }
    }
    for (int t = 0; t < na; t++) out[(size_t)t * os + r] = sum[t];
  }
}
static void tile_q4_K(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os) {
  tile_k4(n, w, ws, nw, a, as, na, out, os, 0);
}
static void tile_q5_K(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os) {
  tile_k4(n, w, ws, nw, a, as, na, out, os, 1);
}
// Decode over 4 rows at once, as k4_block4.
static inline __m128 k6_block4(const char *x0, size_t rs, const ll_block_q8_K *y, __m128 sum) {
  __m256i acc[4];
  float d[4];
  _Pragma("GCC unroll 4")
  for (int r = 0; r < 4; r++) {
    const ll_block_q6_K *x = (const ll_block_q6_K *)(const void *)(x0 + (size_t)r * rs);
    d[r] = h2f(x->d);
    acc[r] = k6_lanes1(y, x);
  }
  // sum += h2f(x->d) * y->d * isum
  return _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(d), _mm_set1_ps(y->d)), _mm_cvtepi32_ps(hsum4_i32(acc))));
}
// A prompt's super-block i for four rows: unpacked once (k6_unpack), then per token the four
// rows' sums together and k6_block4's float step on four lanes (the dot's bits).
__attribute__((always_inline)) static inline void sum_k6_rows4(__m128 *sum, const char *x0, size_t rs, const char *a, size_t as, int na) {
  struct k6_unpacked u[4];
  float dv[4];
  for (int r = 0; r < 4; r++) {
    const ll_block_q6_K *x = (const ll_block_q6_K *)(const void *)(x0 + (size_t)r * rs);
    k6_unpack(x, &u[r]), dv[r] = h2f(x->d);
  }
  const __m128 d = _mm_loadu_ps(dv);
  for (int t = 0; t < na; t++) {
    const ll_block_q8_K *y = (const ll_block_q8_K *)(const void *)(a + (size_t)t * as);
    __m256i acc[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) acc[r] = _mm256_sub_epi32(_mm256_setzero_si256(), k6_offset(y, u[r].sc16));
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++) {
      const __m256i yv = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j));
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u[r].q[j], yv), u[r].sc[j]));
    }
    // sum += h2f(x->d) * y->d * isum
    sum[t] = _mm_add_ps(sum[t], _mm_mul_ps(_mm_mul_ps(d, _mm_set1_ps(y->d)), _mm_cvtepi32_ps(hsum4_i32(acc))));
  }
}
static void tile_q6_K(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os) {
  if (na == 1 && nw == 4) {
    __m128 sum = _mm_setzero_ps();
    for (int i = 0; i < n / 256; i++) sum = k6_block4((const char *)w + (size_t)i * sizeof(ll_block_q6_K), ws, (const ll_block_q8_K *)a + i, sum);
    _mm_storeu_ps(out, sum);
    return;
  }
  if (nw == 4) { // a prompt: 4 rows x na tokens
    __m128 sum[8];
    for (int t = 0; t < na; t++) sum[t] = _mm_setzero_ps();
    for (int i = 0; i < n / 256; i++)
      sum_k6_rows4(sum, (const char *)w + (size_t)i * sizeof(ll_block_q6_K), ws, (const char *)a + (size_t)i * sizeof(ll_block_q8_K), as, na);
    for (int t = 0; t < na; t++) _mm_storeu_ps(out + (size_t)t * os, sum[t]);
    return;
  }
  for (int r = 0; r < nw; r++) {
    float sum[8] = {0};
    for (int i = 0; i < n / 256; i++) {
      const ll_block_q6_K *x = (const ll_block_q6_K *)(const void *)((const char *)w + (size_t)r * ws) + i;
      if (na == 1) { // one token: straight from the block
        const ll_block_q8_K *y = (const ll_block_q8_K *)a + i;
        sum[0] += h2f(x->d) * y->d * k6_isum1(y, x);
        continue;
      }
      struct k6_unpacked u;
      k6_unpack(x, &u);
      for (int t = 0; t < na; t++) {
        const ll_block_q8_K *y = (const ll_block_q8_K *)(const void *)((const char *)a + (size_t)t * as) + i;
        const int isum = k6_isum(y, &u);
        sum[t] += h2f(x->d) * y->d * isum;
      }
    }
    for (int t = 0; t < na; t++) out[(size_t)t * os + r] = sum[t];
  }
}

// K-quants over packed groups of 8 rows (ll_pack_rows: the rows' super-blocks interleaved,
// whole, block by block), so a group is one stream: each super-block's two halves of 4 rows
// go through k4_block4 / k6_block4, the rows' dot bits. Tokens one at a time (decode: the
// row tiles unpack a block once for several tokens).
// (Always inlined, as tile_k4: with q5 a constant per caller; a call with it at run time ran
// Q4_K at 14.5 GB/s from L3 instead of 20.3.)
__attribute__((always_inline)) static inline void k4_packed(int n, const void *g, const void *a, size_t as, int na, float *out, size_t os, int q5) {
  const size_t bs = q5 ? sizeof(ll_block_q5_K) : sizeof(ll_block_q4_K);
  const int pf = packed_pf_on();
  for (int t = 0; t < na; t++) {
    const ll_block_q8_K *y = (const ll_block_q8_K *)(const void *)((const char *)a + (size_t)t * as);
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
    for (int i = 0; i < n / 256; i++) {
      const char *p = (const char *)g + (size_t)i * 8 * bs;
      packed_prefetch(pf && t == 0, p, 8 * bs);
      s0 = k4_block4(p, bs, y + i, s0, q5);
      s1 = k4_block4(p + 4 * bs, bs, y + i, s1, q5);
    }
    _mm_storeu_ps(out + (size_t)t * os, s0);
    _mm_storeu_ps(out + (size_t)t * os + 4, s1);
  }
}
void ll_q4_K_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  (void)sc, (void)ss, (void)scs;
  k4_packed(n, g, a, as, na, out, os, 0);
}
void ll_q5_K_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  (void)sc, (void)ss, (void)scs;
  k4_packed(n, g, a, as, na, out, os, 1);
}
void ll_q6_K_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  (void)sc, (void)ss, (void)scs;
  const size_t bs = sizeof(ll_block_q6_K);
  const int pf = packed_pf_on();
  for (int t = 0; t < na; t++) {
    const ll_block_q8_K *y = (const ll_block_q8_K *)(const void *)((const char *)a + (size_t)t * as);
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
    for (int i = 0; i < n / 256; i++) {
      const char *p = (const char *)g + (size_t)i * 8 * bs;
      packed_prefetch(pf && t == 0, p, 8 * bs);
      s0 = k6_block4(p, bs, y + i, s0);
      s1 = k6_block4(p + 4 * bs, bs, y + i, s1);
    }
    _mm_storeu_ps(out + (size_t)t * os, s0);
    _mm_storeu_ps(out + (size_t)t * os + 4, s1);
  }
}

// ---- tiles of up to 4 weight rows x 8 tokens (the layout of dot_avx512.c, in 256 bits) ----
// Every output gets exactly the operations of the dot above for its (row, token): the same
// exact integer sums and the same float steps in the same order, so tiles, vec_dot and the
// scalar references agree bit for bit (tested) whatever the batch composition. What the tiles
// share is the work per weight block (unpacked once for all tokens) and, with tile_sc, the
// activation blocks' scales and offsets from side tables the caller fills once per product.
#define AI __attribute__((always_inline)) static inline

// Rows r and r+1's 16 bytes at offset off of block blk: row r in the low 128 bits, r+1 high
// (zero when r+1 is past the tile).
AI __m256i pair16(const void *w, size_t ws, size_t off, int r, const int NW) {
  const char *p = (const char *)w + (size_t)r * ws + off;
  const __m128i lo = _mm_loadu_si128((const __m128i *)p);
  return r + 1 < NW ? _mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128((const __m128i *)(p + ws)), 1)
                    : _mm256_zextsi128_si256(lo);
}
// The fp16 at offset off of rows r, r+1 as floats: [x_r x4 | x_r+1 x4].
AI __m256 pair_h(const void *w, size_t ws, size_t off, int r, const int NW) {
  ll_fp16 h0, h1 = 0;
  memcpy(&h0, (const char *)w + (size_t)r * ws + off, 2);
  if (r + 1 < NW) memcpy(&h1, (const char *)w + (size_t)(r + 1) * ws + off, 2);
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(&fp16_table[h0])), _mm_broadcast_ss(&fp16_table[h1]), 1);
}
// n (<= 4, a constant) floats / int32 of a side table, the rest 0, in both 128-bit halves.
AI __m256 side4_ps(const float *p, const int n) {
  const __m128 v = n == 4 ? _mm_loadu_ps(p) : _mm_maskload_ps(p, _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3)));
  return _mm256_set_m128(v, v);
}
AI __m256i side4_epi32(const int32_t *p, const int n) {
  const __m128i v = n == 4 ? _mm_loadu_si128((const __m128i *)p)
                           : _mm_maskload_epi32((const int *)p, _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3)));
  return _mm256_set_m128i(v, v);
}
// The fp16 at offset off of up to 4 tokens' blocks (a + t * as) as floats, in both halves
// (built in registers: a store to a stack array reloaded as a vector stalls every block).
AI float tok_h(const void *a, size_t as, size_t off, int t, const int n) {
  if (t >= n) return 0;
  ll_fp16 h;
  memcpy(&h, (const char *)a + (size_t)t * as + off, 2);
  return fp16_table[h];
}
AI __m256 tok4_h(const void *a, size_t as, size_t off, const int n) {
  if (n == 1) return _mm256_set1_ps(tok_h(a, as, off, 0, n));
  const __m128 v = _mm_setr_ps(tok_h(a, as, off, 0, n), tok_h(a, as, off, 1, n), tok_h(a, as, off, 2, n), tok_h(a, as, off, 3, n));
  return _mm256_set_m128(v, v);
}

// ---- Q4_0 / Q5_0 x Q8_0 (Q5 = 1): two weight rows per ymm ----
// Row r's 16 bytes of nibbles in one 128-bit half, r+1's in the other; masking gives
// elements 0..15 of both rows, shifting 16..31. The weights stay unsigned (0..15, 0..31 with
// the fifth bits) against the signed activation bytes broadcast to both halves, so maddubs
// never saturates (a pair is at most 2·31·128). Per token, maddubs(lo)+maddubs(hi) holds
// each row's 32 products in 8 int16 lanes; four tokens' lanes are then summed and
// transposed together (pmaddwd by 1 widens and adds pairs, packssdw brings two tokens'
// partials into one register; every partial fits: at most 16·15·128 = 30720 for Q4_0, 8·31·128
// for Q5_0, whose last level adds in 32 bits) so that lane 4h + j holds row r+h and token j.
// Adding the offset (-8·Σa, or -16·Σa: the side table, or computed from the activations
// without one) gives the exact block sum si of dot.c; one conversion then serves 8 (row,
// token) pairs, with dot.c's float step: Q4_0 fma(si, d_w·d_a, sum), Q5_0 sum + (si·d_w)·d_a.
AI void qblk_pair_impl(int n, const void *w, size_t ws, const void *a, size_t as, const float *sca, const int32_t *ssa, size_t scs,
                       float *out, size_t os, const int NW, const int NA, const int SIDE, const int Q5) {
  const int nb = n / 32, NP = (NW + 1) / 2, NG = (NA + 3) / 4;
  const size_t bsz = Q5 ? sizeof(ll_block_q5_0) : sizeof(ll_block_q4_0), qoff = Q5 ? offsetof(ll_block_q5_0, qs) : offsetof(ll_block_q4_0, qs);
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), offb = _mm256_set1_epi8(Q5 ? 16 : 8), z = _mm256_setzero_si256();
  // Q5_0: qh byte k of each row to bytes 8k..8k+7 of its half (lo: bytes 0, 1; hi: 2, 3)
  const __m256i shl = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m256i shh = _mm256_add_epi8(shl, _mm256_set1_epi8(2)), sel = _mm256_set1_epi64x(0x8040201008040201LL);
  __m256 acc[2][2]; // [row pair][token group]
  _Pragma("GCC unroll 2")
  for (int p = 0; p < NP; p++) acc[p][0] = acc[p][1] = _mm256_setzero_ps();
  // One token and 3-4 rows (a decode step): both pairs' partials share one reduction and one
  // float step, lanes [r0 r2 . . | r1 r3 . .] (see below); acc1 holds them.
  const int ONE = NA == 1 && NP == 2;
  __m256 acc1 = _mm256_setzero_ps();
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * bsz;
    __m256i lo[2], hi[2];
    __m256 dw[2];
    _Pragma("GCC unroll 2")
    for (int p = 0; p < NP; p++) {
      const __m256i q = pair16(w, ws, blk + qoff, 2 * p, NW);
      lo[p] = _mm256_and_si256(q, m4), hi[p] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if (Q5) {
        // Each row's 4 qh bytes in the low dword of its half (the shuffles read bytes 0-3).
        const char *hp = (const char *)w + (size_t)(2 * p) * ws + blk + offsetof(ll_block_q5_0, qh);
        const __m128i h0 = _mm_loadu_si32(hp), h1 = 2 * p + 1 < NW ? _mm_loadu_si32(hp + ws) : _mm_setzero_si128();
        const __m256i hv = _mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1);
        const __m256i bl = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(hv, shl), sel), sel);
        const __m256i bh = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(hv, shh), sel), sel);
        lo[p] = _mm256_or_si256(lo[p], _mm256_and_si256(bl, offb));
        hi[p] = _mm256_or_si256(hi[p], _mm256_and_si256(bh, offb));
      }
      dw[p] = pair_h(w, ws, blk, 2 * p, NW);
    }
    _Pragma("GCC unroll 2")
    for (int g = 0; g < NG; g++) {
      const int ng = NA - 4 * g < 4 ? NA - 4 * g : 4;
      __m256i m[2][4];
      _Pragma("GCC unroll 4")
      for (int t = 0; t < ng; t++) {
        const char *y = (const char *)a + (size_t)(4 * g + t) * as + (size_t)i * sizeof(ll_block_q8_0) + offsetof(ll_block_q8_0, qs);
        const __m256i al = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)y));
        const __m256i ah = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y + 16)));
        __m256i e = z; // without side tables: the offset's partials, off·a in the same lanes
        if (!SIDE) e = _mm256_add_epi16(_mm256_maddubs_epi16(offb, al), _mm256_maddubs_epi16(offb, ah));
        _Pragma("GCC unroll 2")
        for (int p = 0; p < NP; p++) {
          __m256i v = _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], al), _mm256_maddubs_epi16(hi[p], ah));
          if (!SIDE) v = _mm256_sub_epi16(v, e);
          m[p][t] = _mm256_madd_epi16(v, ones); // row's 4 int32 partials (8 products each)
        }
      }
      if (ONE) {
        // The same integer sums as the per-pair path below, in other lanes: packs brings rows
        // r0, r2 (low half) and r1, r3 (high half) together, each level adds the same pairs.
        const __m256i q = _mm256_madd_epi16(_mm256_packs_epi32(m[0][0], m[1][0]), ones); // [r0 r0 r2 r2 | r1 r1 r3 r3]
        __m256i si = Q5 ? _mm256_hadd_epi32(q, z) : _mm256_madd_epi16(_mm256_packs_epi32(q, z), ones); // [r0 r2 0 0 | r1 r3 0 0]
        const __m256 dwo = _mm256_blend_ps(dw[0], dw[1], 0x22); // [d0 d2 d0 d0 | d1 d3 d1 d1]
        __m256 da;
        if (SIDE) {
          da = _mm256_broadcast_ss(sca + (size_t)i * scs);
          const __m256i c = _mm256_set1_epi32(ssa[(size_t)i * scs]);
          si = _mm256_add_epi32(si, Q5 ? _mm256_slli_epi32(c, 1) : c);
        } else {
          da = _mm256_set1_ps(tok_h((const char *)a + (size_t)i * sizeof(ll_block_q8_0), as, 0, 0, 1));
        }
        const __m256 f = _mm256_cvtepi32_ps(si);
        acc1 = Q5 ? _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_mul_ps(f, dwo), da)) : _mm256_fmadd_ps(f, _mm256_mul_ps(dwo, da), acc1);
        continue;
      }
      __m256 da;
      __m256i c = z;
      if (SIDE) {
        da = side4_ps(sca + (size_t)i * scs + 4 * g, ng);
        c = side4_epi32(ssa + (size_t)i * scs + 4 * g, ng);
        if (Q5) c = _mm256_slli_epi32(c, 1);
      } else {
        da = tok4_h((const char *)a + (size_t)(4 * g) * as + (size_t)i * sizeof(ll_block_q8_0), as, 0, ng);
      }
      _Pragma("GCC unroll 2")
      for (int p = 0; p < NP; p++) {
        const __m256i q01 = _mm256_madd_epi16(_mm256_packs_epi32(m[p][0], ng > 1 ? m[p][1] : z), ones); // [t0 t0 t1 t1]
        const __m256i q23 = ng > 2 ? _mm256_madd_epi16(_mm256_packs_epi32(m[p][2], ng > 3 ? m[p][3] : z), ones) : z;
        __m256i si = Q5 ? _mm256_hadd_epi32(q01, q23) : _mm256_madd_epi16(_mm256_packs_epi32(q01, q23), ones); // [t0 t1 t2 t3]
        if (SIDE) si = _mm256_add_epi32(si, c);
        const __m256 f = _mm256_cvtepi32_ps(si);
        if (Q5) // sum + (si * d_w) * d_a
          acc[p][g] = _mm256_add_ps(acc[p][g], _mm256_mul_ps(_mm256_mul_ps(f, dw[p]), da));
        else // fma(si, d_w * d_a, sum); the product of two halves is exact
          acc[p][g] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw[p], da), acc[p][g]);
      }
    }
  }
  if (ONE) {
    float o[8];
    _mm256_storeu_ps(o, acc1);
    out[0] = o[0], out[1] = o[4], out[2] = o[1];
    if (NW > 3) out[3] = o[5];
    return;
  }
  _Pragma("GCC unroll 2")
  for (int p = 0; p < NP; p++)
    _Pragma("GCC unroll 2")
    for (int g = 0; g < NG; g++) {
      float o[8];
      _mm256_storeu_ps(o, acc[p][g]);
      const int ng = NA - 4 * g < 4 ? NA - 4 * g : 4;
      _Pragma("GCC unroll 4")
      for (int j = 0; j < ng; j++) {
        out[(size_t)(4 * g + j) * os + 2 * p] = o[j];
        if (2 * p + 1 < NW) out[(size_t)(4 * g + j) * os + 2 * p + 1] = o[4 + j];
      }
    }
}

// ---- Q4_0 / Q5_0 x Q8_0 over packed groups of 8 rows (ll_pack_rows): one stream per group ----
// The decode kernel. Each block of a group is contiguous (Q4_0 144 bytes, Q5_0 176): the 8
// scales in lane order, (Q5_0: the rows' fifth bits in bit planes, 32 bytes,) then rows (0,1), (2,3), (4,5),
// (6,7)'s nibbles, one 256-bit load per pair (row r in the low half, r+1 in the high). Per token
// the integer work is qblk_pair_impl's (maddubs of the unsigned nibbles, with Q5_0's fifth bits
// or-ed in - a shift and an and per ymm from the bit planes - against the signed activations, pmaddwd by 1), and the four pairs' partials reduce
// together to lanes [r0 r2 r4 r6 | r1 r3 r5 r7], the order the scales are stored in: packs /
// pmaddwd levels within int16 as there (at most 16·15·128 = 30720 before Q4_0's last level;
// Q5_0's last level adds in 32 bits with phaddd). Adding the offset from the side table
// (-8·Σa, Q5_0 -16·Σa) gives dot.c's exact block sum si, and one float step per block serves
// the group's 8 rows: Q4_0 fma(si, d_w·d_a, sum), Q5_0 sum + (si·d_w)·d_a.
// Read as one stream (measured 2026-11-24 on a 2-vCPU Zen 4 EPYC, AVX2 path, 1 thread, a
// 42 MB Q4_0 matrix: 24.5-27.4 GB/s against 17.7-18.8 for the 4-row tile over the rows, read
// bandwidth 24.9 GB/s), prefetched PACKED_PF ahead on CPUs without AVX-512 (a Zen 3 needs it:
// 15.1 -> 18.7 GB/s; packed_prefetch).
AI void qblk_packed_impl(int n, const void *g, const void *a, size_t as, const float *sca, const int32_t *ssa, size_t scs, float *out,
                         size_t os, const int NA, const int Q5) {
  const int nb = n / 32;
  const size_t bsz = Q5 ? 8 * sizeof(ll_block_q5_0) : 8 * sizeof(ll_block_q4_0), qoff = Q5 ? 48 : 16;
  const int pf = packed_pf_on();
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i b5 = _mm256_set1_epi8(16), z = _mm256_setzero_si256();
  __m256 acc[4];
  _Pragma("GCC unroll 4")
  for (int t = 0; t < NA; t++) acc[t] = _mm256_setzero_ps();
  for (int i = 0; i < nb; i++) {
    const char *p = (const char *)g + (size_t)i * bsz;
    packed_prefetch(pf, p, bsz);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); // [d0 d2 d4 d6 | d1 d3 d5 d7]
    const __m256i hb = Q5 ? _mm256_loadu_si256((const __m256i *)(p + 16)) : z; // Q5_0's bit planes
    __m256i lo[4], hi[4];
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++) {
      const __m256i q = _mm256_loadu_si256((const __m256i *)(p + qoff + 32 * k));
      lo[k] = _mm256_and_si256(q, m4), hi[k] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if (Q5) { // bits 2k (low nibbles) and 2k+1 (high nibbles) of each byte to bit 4
        const __m256i l = k < 3 ? _mm256_slli_epi16(hb, 4 - 2 * k) : _mm256_srli_epi16(hb, 2);
        const __m256i h = k < 2 ? _mm256_slli_epi16(hb, 3 - 2 * k) : _mm256_srli_epi16(hb, 2 * k - 3);
        lo[k] = _mm256_or_si256(lo[k], _mm256_and_si256(l, b5));
        hi[k] = _mm256_or_si256(hi[k], _mm256_and_si256(h, b5));
      }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) {
      const char *y = (const char *)a + (size_t)t * as + (size_t)i * sizeof(ll_block_q8_0) + offsetof(ll_block_q8_0, qs);
      const __m256i al = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)y));
      const __m256i ah = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y + 16)));
      __m256i m[4];
      _Pragma("GCC unroll 4")
      for (int k = 0; k < 4; k++) // [row 2k: 4 partials | row 2k+1: 4 partials]
        m[k] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo[k], al), _mm256_maddubs_epi16(hi[k], ah)), ones);
      const __m256i q01 = _mm256_madd_epi16(_mm256_packs_epi32(m[0], m[1]), ones); // [r0 r0 r2 r2 | r1 r1 r3 r3]
      const __m256i q23 = _mm256_madd_epi16(_mm256_packs_epi32(m[2], m[3]), ones); // [r4 r4 r6 r6 | r5 r5 r7 r7]
      __m256i si = Q5 ? _mm256_hadd_epi32(q01, q23) : _mm256_madd_epi16(_mm256_packs_epi32(q01, q23), ones); // [r0 r2 r4 r6 | r1 r3 r5 r7]
      const __m256i c = _mm256_set1_epi32(ssa[(size_t)i * scs + t]);
      si = _mm256_add_epi32(si, Q5 ? _mm256_slli_epi32(c, 1) : c);
      const __m256 da = _mm256_broadcast_ss(sca + (size_t)i * scs + t), f = _mm256_cvtepi32_ps(si);
      if (Q5) acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(f, dw), da));
      else acc[t] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw, da), acc[t]); // the product of two halves is exact
    }
  }
  _Pragma("GCC unroll 4")
  for (int t = 0; t < NA; t++) {
    float o[8];
    _mm256_storeu_ps(o, acc[t]);
    float *ot = out + (size_t)t * os;
    ot[0] = o[0], ot[2] = o[1], ot[4] = o[2], ot[6] = o[3], ot[1] = o[4], ot[3] = o[5], ot[5] = o[6], ot[7] = o[7];
  }
}
#define PACKED_INST(NA)                                                                                                        \
  static void q4_0_packed_##NA(int n, const void *g, const void *a, size_t as, const float *sc, const int32_t *ss, size_t scs,   \
                               float *out, size_t os) {                                                                        \
    qblk_packed_impl(n, g, a, as, sc, ss, scs, out, os, NA, 0);                                                                \
  }                                                                                                                            \
  static void q5_0_packed_##NA(int n, const void *g, const void *a, size_t as, const float *sc, const int32_t *ss, size_t scs,   \
                               float *out, size_t os) {                                                                        \
    qblk_packed_impl(n, g, a, as, sc, ss, scs, out, os, NA, 1);                                                                \
  }
PACKED_INST(1)
PACKED_INST(2)
PACKED_INST(3)
PACKED_INST(4)
typedef void (*packed_fn)(int, const void *, const void *, size_t, const float *, const int32_t *, size_t, float *, size_t);
void ll_q4_0_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  static const packed_fn fn[4] = {q4_0_packed_1, q4_0_packed_2, q4_0_packed_3, q4_0_packed_4};
  fn[na - 1](n, g, a, as, sc, ss, scs, out, os);
}
void ll_q5_0_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  static const packed_fn fn[4] = {q5_0_packed_1, q5_0_packed_2, q5_0_packed_3, q5_0_packed_4};
  fn[na - 1](n, g, a, as, sc, ss, scs, out, os);
}

// ---- Q4_1 x Q8_1: two weight rows per ymm, ggml's 8-lane order per (row, token) ----
// As above the rows' nibbles share a ymm; per token, pmaddwd(maddubs(lo, a[0..15])) gives
// each row's int32 lanes 0..3 of dot_q4_1_q8_1 and the high nibbles its lanes 4..7, so each
// float lane gets the dot's fma(d_w·d_a, float(isum), acc) per block, in block order; the
// m·s sum runs per (row, token) lane (mul then add, as the dot's scalar), and the end is
// hsum256's sequence. Two rows x up to 4 tokens per pass (16 accumulators would not fit).
AI void q4_1_pair_impl(int n, const void *w, size_t ws, const void *a, size_t as, const float *sca, const int32_t *ssa, size_t scs,
                       float *out, size_t os, const int r0, const int NW, const int t0, const int NA, const int SIDE) {
  const int nb = n / 32;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 accl[4], acch[4], sm = _mm256_setzero_ps(); // sm lane 4h + t: row r0+h, token t's Σ m·s
  _Pragma("GCC unroll 4")
  for (int t = 0; t < NA; t++) accl[t] = acch[t] = _mm256_setzero_ps();
  w = (const char *)w + (size_t)r0 * ws;
  a = (const char *)a + (size_t)t0 * as;
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * sizeof(ll_block_q4_1);
    const __m256i q = pair16(w, ws, blk + offsetof(ll_block_q4_1, qs), 0, NW);
    const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    const __m256 dw = pair_h(w, ws, blk + offsetof(ll_block_q4_1, d), 0, NW);
    const __m256 mw = pair_h(w, ws, blk + offsetof(ll_block_q4_1, m), 0, NW);
    const size_t ab = (size_t)i * sizeof(ll_block_q8_1);
    const __m256 s4 = SIDE ? side4_ps((const float *)(const void *)(ssa + (size_t)i * scs + t0), NA)
                           : tok4_h((const char *)a + ab, as, offsetof(ll_block_q8_1, s), NA);
    sm = _mm256_add_ps(sm, _mm256_mul_ps(mw, s4));
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) {
      const char *y = (const char *)a + (size_t)t * as + ab;
      const __m256i al = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y + offsetof(ll_block_q8_1, qs))));
      const __m256i ah = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y + offsetof(ll_block_q8_1, qs) + 16)));
      __m256 da;
      if (SIDE) {
        da = _mm256_broadcast_ss(sca + (size_t)i * scs + t0 + t);
      } else {
        ll_fp16 h;
        memcpy(&h, y, 2);
        da = _mm256_broadcast_ss(&fp16_table[h]);
      }
      const __m256 sc = _mm256_mul_ps(dw, da);
      accl[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), ones)), accl[t]);
      acch[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), ones)), acch[t]);
    }
  }
  float o[8], s[8];
  _mm256_storeu_ps(s, sm);
  _Pragma("GCC unroll 4")
  for (int t = 0; t < NA; t++) {
    // hsum256 of [L | H] for both rows: (L + H), then lanes (0 + 2) + (1 + 3)
    const __m256 v = _mm256_add_ps(accl[t], acch[t]);
    const __m256 u = _mm256_add_ps(v, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    _mm256_storeu_ps(o, _mm256_add_ps(u, _mm256_movehdup_ps(u)));
    out[(size_t)(t0 + t) * os + r0] = o[0] + s[t];
    if (NW > 1) out[(size_t)(t0 + t) * os + r0 + 1] = o[4] + s[4 + t];
  }
}

// ---- Q4_1 x Q8_1 over packed groups of 8 rows (ll_pack_rows), one token ----
// q4_1_pair_impl's arithmetic per (row, token), in the same lanes (a row pair's low nibbles in
// accl, high in acch; its d·d_a broadcast to the pair's halves), so the same bits; what the
// layout saves is the per-row work: the 8 rows' scales and mins come in with one load and one
// vcvtph2ps each (instead of a table lookup per row and block), the m·s products of all 8 rows
// take one multiply and one add, and the group is one stream (measured 2026-11-24, AVX2 path,
// 1 thread, a 24 MB matrix: 25.4-26.1 GB/s against 15.3-15.6 for the 4-row tile).
AI void q4_1_packed1(int n, const void *g, const void *a, const float *sca, const int32_t *ssa, size_t scs, float *out, const int pf) {
  const int nb = n / 32;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 accl[4], acch[4], sm = _mm256_setzero_ps(); // sm lane r: row r's Σ m·s
  _Pragma("GCC unroll 4")
  for (int k = 0; k < 4; k++) accl[k] = acch[k] = _mm256_setzero_ps();
  for (int i = 0; i < nb; i++) {
    const char *p = (const char *)g + (size_t)i * 160;
    packed_prefetch(pf, p, 160);
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));        // d of rows 0..7
    const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))); // m of rows 0..7
    sm = _mm256_add_ps(sm, _mm256_mul_ps(mv, _mm256_broadcast_ss((const float *)(const void *)(ssa + (size_t)i * scs))));
    const char *y = (const char *)a + (size_t)i * sizeof(ll_block_q8_1) + offsetof(ll_block_q8_1, qs);
    const __m256i al = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)y));
    const __m256i ah = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(y + 16)));
    const __m256 dd = _mm256_mul_ps(dv, _mm256_broadcast_ss(sca + (size_t)i * scs)); // d·d_a of rows 0..7 (one multiply)
    _Pragma("GCC unroll 4")
    for (int k = 0; k < 4; k++) {
      const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * k));
      const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256 sc = _mm256_permutevar8x32_ps(dd, _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1));
      accl[k] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), ones)), accl[k]);
      acch[k] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), ones)), acch[k]);
    }
  }
  float s[8];
  _mm256_storeu_ps(s, sm);
  _Pragma("GCC unroll 4")
  for (int k = 0; k < 4; k++) { // hsum256 of [L | H] for both rows, as q4_1_pair_impl ends
    float o[8];
    const __m256 v = _mm256_add_ps(accl[k], acch[k]);
    const __m256 u = _mm256_add_ps(v, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    _mm256_storeu_ps(o, _mm256_add_ps(u, _mm256_movehdup_ps(u)));
    out[2 * k] = o[0] + s[2 * k];
    out[2 * k + 1] = o[4] + s[2 * k + 1];
  }
}
// Token by token, the group's later tokens reading it from L1 (packed_max_t 4: measured
// 2026-11-24, AVX2 path, 1 thread, SmolLM2 Q4_1 decoding 2 sequences 260 tok/s against 213
// with the row tiles, 4 sequences 280 against 287: from 4 tokens the tiles, which unpack a
// block once for several tokens, are as fast).
void ll_q4_1_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  // Only the first token's pass prefetches: the later ones find the group in L1/L2.
  const int pf = packed_pf_on();
  for (int t = 0; t < na; t++) q4_1_packed1(n, g, (const char *)a + (size_t)t * as, sc + t, ss + t, scs, out + (size_t)t * os, pf && t == 0);
}

// ---- Q8_0 x Q8_0 over packed groups of 8 rows (ll_pack_rows), one token ----
// dot_q8_0_q8_0's steps per row (|w|, the activations' signs moved onto it, maddubs, pmaddwd
// by 1, fma(d_w·d_a, float(lanes), acc), hsum256 at the end), so the same bits; the 8 rows'
// d_w·d_a come from one vcvtph2ps and one multiply per block, and the group is one stream
// (measured 2026-11-24, AVX2 path, 1 thread, the 30 MB SmolLM2 output head: 26.7 GB/s
// against 21.7 for the row tile).
AI void q8_0_packed1(int n, const void *g, const void *a, const float *sca, size_t scs, float *out, const int pf) {
  const int nb = n / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[8];
  _Pragma("GCC unroll 8")
  for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
  for (int i = 0; i < nb; i++) {
    const char *p = (const char *)g + (size_t)i * 272;
    packed_prefetch(pf, p, 272);
    const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_broadcast_ss(sca + (size_t)i * scs));
    const __m256i qy = _mm256_loadu_si256((const __m256i *)((const char *)a + (size_t)i * sizeof(ll_block_q8_0) + offsetof(ll_block_q8_0, qs)));
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) {
      const __m256i qx = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * r));
      const __m256i d16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
      acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(r)), _mm256_cvtepi32_ps(_mm256_madd_epi16(d16, ones)), acc[r]);
    }
  }
  _Pragma("GCC unroll 8")
  for (int r = 0; r < 8; r++) out[r] = hsum256(acc[r]);
}
void ll_q8_0_tile_packed_avx2(int n, const void *g, const void *a, size_t as, int na, const float *sc, const int32_t *ss, size_t scs,
                              float *out, size_t os) {
  (void)ss;
  const int pf = packed_pf_on(); // the first token's pass only, as for Q4_1
  for (int t = 0; t < na; t++) q8_0_packed1(n, g, (const char *)a + (size_t)t * as, sc + t, scs, out + (size_t)t * os, pf && t == 0);
}

// ---- Q8_0 x Q8_0: one row per ymm (a block is 32 bytes), 2 rows x up to 4 tokens per pass ----
// dot_q8_0_q8_0's steps per (row, token): |w| (once per row and block, shared by the
// tokens), the activations' signs moved onto them, maddubs, pmaddwd by 1, and
// fma(d_w·d_a, float(lanes), acc); hsum256 at the end.
AI void q8_0_tile_impl(int n, const void *w, size_t ws, const void *a, size_t as, const float *sca, size_t scs, float *out, size_t os,
                       const int r0, const int NW, const int t0, const int NA, const int SIDE) {
  const int nb = n / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2][4];
  _Pragma("GCC unroll 2")
  for (int r = 0; r < NW; r++)
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) acc[r][t] = _mm256_setzero_ps();
  w = (const char *)w + (size_t)r0 * ws;
  a = (const char *)a + (size_t)t0 * as;
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * sizeof(ll_block_q8_0);
    __m256i wv[2], wa[2];
    __m256 dw[2];
    _Pragma("GCC unroll 2")
    for (int r = 0; r < NW; r++) {
      const ll_block_q8_0 *x = (const ll_block_q8_0 *)(const void *)((const char *)w + (size_t)r * ws + blk);
      wv[r] = _mm256_loadu_si256((const __m256i *)x->qs);
      wa[r] = _mm256_sign_epi8(wv[r], wv[r]);
      dw[r] = _mm256_broadcast_ss(&fp16_table[x->d]);
    }
    // With side tables the 2 x 4 scale products d_w·d_a take one multiply (lane 4r + t),
    // stored and broadcast back from memory: the load ports are idle, the multipliers are not.
    // (One token: the two products in registers, as without side tables.)
    float scl[8] __attribute__((aligned(32)));
    const int SCL = SIDE && NA > 1;
    if (SCL) _mm256_store_ps(scl, _mm256_mul_ps(_mm256_permute2f128_ps(dw[0], dw[NW - 1], 0x20), side4_ps(sca + (size_t)i * scs + t0, NA)));
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) {
      const ll_block_q8_0 *y = (const ll_block_q8_0 *)(const void *)((const char *)a + (size_t)t * as + blk);
      const __m256i av = _mm256_loadu_si256((const __m256i *)y->qs);
      const __m256 da = SCL ? _mm256_setzero_ps() : _mm256_broadcast_ss(SIDE ? sca + (size_t)i * scs + t0 + t : &fp16_table[y->d]);
      _Pragma("GCC unroll 2")
      for (int r = 0; r < NW; r++) {
        const __m256i d16 = _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(av, wv[r]));
        const __m256 sc = SCL ? _mm256_broadcast_ss(&scl[4 * r + t]) : _mm256_mul_ps(dw[r], da);
        acc[r][t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_madd_epi16(d16, ones)), acc[r][t]);
      }
    }
  }
  _Pragma("GCC unroll 2")
  for (int r = 0; r < NW; r++)
    _Pragma("GCC unroll 4")
    for (int t = 0; t < NA; t++) out[(size_t)(t0 + t) * os + r0 + r] = hsum256(acc[r][t]);
}

// ---- Q8_0 x Q8_0 with side tables, a full tile (4 rows x 8 tokens: prompts) ----
// The same four passes of 2 rows x 4 tokens as q8_0_tile_impl, but the tile's 32 scale
// products d_w·d_a of a block are made once, 8 at a time, into a table in L1 that the passes
// read: q8_0_tile_impl makes its 8 in each pass (two fp16 lookups, a multiply, a store, per
// block). Blocks go in chunks of 64 (an 8 KiB table), the passes' accumulators kept between
// chunks; per block and output the dot's fma in block order, so the dot's bits. Measured
// 2026-11-24 on the 2-vCPU EPYC, AVX2 path, 128 tokens x 1536 rows x 576: 5% faster.
// One block's 32 products d_w·d_a (4 rows x 8 tokens) into the table.
AI void q8_0_tab_block(const char *w, size_t ws, const float *sc, float *S) {
  const __m256 da = _mm256_loadu_ps(sc); // the 8 tokens' scales
  _Pragma("GCC unroll 4")
  for (int r = 0; r < 4; r++) {
    const ll_block_q8_0 *x = (const ll_block_q8_0 *)(const void *)(w + (size_t)r * ws);
    _mm256_store_ps(S + 8 * r, _mm256_mul_ps(_mm256_broadcast_ss(&fp16_table[x->d]), da));
  }
}
// BUILD (the first pass): also fills the table one block ahead (block i + 1 while block i is
// computed), so that its loads, multiplies and stores run beside the integer products, which
// leave those ports idle; as a loop of its own before the passes it could not overlap them
// (3-4% of the tile, 128 tokens x 1536 x 576 and 576 x 1536, 2026-11-24, Zen 3).
AI void q8_0_pass_tab(int nb, const char *w, size_t ws, const char *a, size_t as, float *S, const int r0, const int t0, __m256 *accp,
                      const float *sc, size_t scs, const int BUILD) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2][4];
  _Pragma("GCC unroll 2")
  for (int r = 0; r < 2; r++)
    _Pragma("GCC unroll 4")
    for (int t = 0; t < 4; t++) acc[r][t] = accp[4 * r + t];
  for (int i = 0; i < nb; i++) {
    const size_t blk = (size_t)i * sizeof(ll_block_q8_0) + offsetof(ll_block_q8_0, qs);
    __m256i wv[2], wa[2];
    _Pragma("GCC unroll 2")
    for (int r = 0; r < 2; r++) {
      wv[r] = _mm256_loadu_si256((const __m256i *)(w + (size_t)(r0 + r) * ws + blk));
      wa[r] = _mm256_sign_epi8(wv[r], wv[r]);
    }
    if (BUILD && i + 1 < nb)
      q8_0_tab_block(w + (size_t)(i + 1) * sizeof(ll_block_q8_0), ws, sc + (size_t)(i + 1) * scs, S + (size_t)(i + 1) * 32);
    const float *si = S + (size_t)i * 32;
    _Pragma("GCC unroll 4")
    for (int t = 0; t < 4; t++) {
      const __m256i av = _mm256_loadu_si256((const __m256i *)(a + (size_t)(t0 + t) * as + blk));
      _Pragma("GCC unroll 2")
      for (int r = 0; r < 2; r++) {
        const __m256i d16 = _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(av, wv[r]));
        acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&si[8 * (r0 + r) + t0 + t]), _mm256_cvtepi32_ps(_mm256_madd_epi16(d16, ones)), acc[r][t]);
      }
    }
  }
  _Pragma("GCC unroll 2")
  for (int r = 0; r < 2; r++)
    _Pragma("GCC unroll 4")
    for (int t = 0; t < 4; t++) accp[4 * r + t] = acc[r][t];
}
static void q8_0s_4x8_tab(int n, const void *w, size_t ws, const void *a, size_t as, const float *sc, size_t scs, float *out, size_t os) {
  enum { CB = 64 };
  float S[CB * 32] __attribute__((aligned(32))); // (block, row, token) products
  __m256 acc[4][8];                               // pass (rows 2(p/2).., tokens 4(p%2)..): (row, token)
  for (int p = 0; p < 4; p++)
    for (int q = 0; q < 8; q++) acc[p][q] = _mm256_setzero_ps();
  const int nb = n / 32;
  for (int i0 = 0; i0 < nb; i0 += CB) {
    const int cb = nb - i0 < CB ? nb - i0 : CB;
    const size_t off = (size_t)i0 * sizeof(ll_block_q8_0);
    const char *wc = (const char *)w + off, *ac = (const char *)a + off;
    const float *scc = sc + (size_t)i0 * scs;
    q8_0_tab_block(wc, ws, scc, S); // the chunk's first block; the first pass makes the rest
    q8_0_pass_tab(cb, wc, ws, ac, as, S, 0, 0, acc[0], scc, scs, 1);
    for (int p = 1; p < 4; p++) q8_0_pass_tab(cb, wc, ws, ac, as, S, 2 * (p / 2), 4 * (p % 2), acc[p], NULL, 0, 0);
  }
  // Tokens 2u and 2u + 1, rows 0..3 (pass 2 (r / 2) + t / 4, accumulator 4 (r % 2) + t % 4):
  // eight sums in one reduction, two stores.
  _Pragma("GCC unroll 4")
  for (int u = 0; u < 4; u++) {
    __m256 x[8];
    _Pragma("GCC unroll 2")
    for (int e = 0; e < 2; e++)
      _Pragma("GCC unroll 4")
      for (int r = 0; r < 4; r++) x[4 * e + r] = acc[2 * (r / 2) + (2 * u + e) / 4][4 * (r % 2) + (2 * u + e) % 4];
    const __m256 s = hsum256_x8(x);
    _mm_storeu_ps(out + (size_t)(2 * u) * os, _mm256_castps256_ps128(s));
    _mm_storeu_ps(out + (size_t)(2 * u + 1) * os, _mm256_extractf128_ps(s, 1));
  }
}

// ---- instantiation: one function per shape so that accumulators stay in registers ----
typedef void (*tile_fn)(int n, const void *w, size_t ws, const void *a, size_t as, const float *sc, const int32_t *ss, size_t scs,
                        float *out, size_t os);
#define INST(NAME, CALL, NW, NA)                                                                                               \
  static void NAME##_##NW##x##NA(int n, const void *w, size_t ws, const void *a, size_t as, const float *sc, const int32_t *ss,   \
                                 size_t scs, float *out, size_t os) {                                                          \
    (void)sc, (void)ss, (void)scs;                                                                                             \
    CALL(NW, NA);                                                                                                              \
  }
#define INST_ROW8(NAME, CALL, NW)                                                                                              \
  INST(NAME, CALL, NW, 1) INST(NAME, CALL, NW, 2) INST(NAME, CALL, NW, 3) INST(NAME, CALL, NW, 4)                               \
  INST(NAME, CALL, NW, 5) INST(NAME, CALL, NW, 6) INST(NAME, CALL, NW, 7) INST(NAME, CALL, NW, 8)
#define ROW8(NAME, NW) {NAME##_##NW##x1, NAME##_##NW##x2, NAME##_##NW##x3, NAME##_##NW##x4, NAME##_##NW##x5, NAME##_##NW##x6, NAME##_##NW##x7, NAME##_##NW##x8}
#define TILES(NAME, CALL)                                                                                                      \
  INST_ROW8(NAME, CALL, 1) INST_ROW8(NAME, CALL, 2) INST_ROW8(NAME, CALL, 3) INST_ROW8(NAME, CALL, 4)                           \
  static const tile_fn NAME##_tiles[4][8] = {ROW8(NAME, 1), ROW8(NAME, 2), ROW8(NAME, 3), ROW8(NAME, 4)};
// Q4_1 / Q8_0: passes of (2 rows) x (4 tokens) over the tile.
#define PASSES(IMPL, NW, NA, ...)                                                                                              \
  do {                                                                                                                         \
    _Pragma("GCC unroll 2") for (int r0_ = 0; r0_ < (NW); r0_ += 2)                                                            \
      _Pragma("GCC unroll 2") for (int t0_ = 0; t0_ < (NA); t0_ += 4)                                                          \
        IMPL(__VA_ARGS__, r0_, (NW) - r0_ < 2 ? (NW) - r0_ : 2, t0_, (NA) - t0_ < 4 ? (NA) - t0_ : 4, SIDE_);                  \
  } while (0)
#define CALL_Q40(NW, NA) qblk_pair_impl(n, w, ws, a, as, NULL, NULL, 0, out, os, NW, NA, 0, 0)
#define CALL_Q40S(NW, NA) qblk_pair_impl(n, w, ws, a, as, sc, ss, scs, out, os, NW, NA, 1, 0)
#define CALL_Q50(NW, NA) qblk_pair_impl(n, w, ws, a, as, NULL, NULL, 0, out, os, NW, NA, 0, 1)
#define CALL_Q50S(NW, NA) qblk_pair_impl(n, w, ws, a, as, sc, ss, scs, out, os, NW, NA, 1, 1)
#define CALL_Q41(NW, NA) do { enum { SIDE_ = 0 }; PASSES(q4_1_pair_impl, NW, NA, n, w, ws, a, as, NULL, NULL, 0, out, os); } while (0)
#define CALL_Q41S(NW, NA) do { enum { SIDE_ = 1 }; PASSES(q4_1_pair_impl, NW, NA, n, w, ws, a, as, sc, ss, scs, out, os); } while (0)
#define CALL_Q80(NW, NA) do { enum { SIDE_ = 0 }; PASSES(q8_0_tile_impl, NW, NA, n, w, ws, a, as, NULL, 0, out, os); } while (0)
#define CALL_Q80S(NW, NA) do { enum { SIDE_ = 1 }; PASSES(q8_0_tile_impl, NW, NA, n, w, ws, a, as, sc, scs, out, os); } while (0)
TILES(q4_0, CALL_Q40)
TILES(q4_0s, CALL_Q40S)
TILES(q5_0, CALL_Q50)
TILES(q5_0s, CALL_Q50S)
TILES(q4_1, CALL_Q41)
TILES(q4_1s, CALL_Q41S)
TILES(q8_0, CALL_Q80)
TILES(q8_0s, CALL_Q80S)
#define ENTRY(NAME)                                                                                                            \
  static void tile_##NAME(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, float *out, size_t os) {   \
    NAME##_tiles[nw - 1][na - 1](n, w, ws, a, as, NULL, NULL, 0, out, os);                                                     \
  }                                                                                                                            \
  static void tile_sc_##NAME(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, const float *sc,       \
                             const int32_t *ss, size_t scs, float *out, size_t os) {                                           \
    NAME##s_tiles[nw - 1][na - 1](n, w, ws, a, as, sc, ss, scs, out, os);                                                      \
  }
ENTRY(q4_0)
ENTRY(q5_0)
ENTRY(q4_1)
ENTRY(q8_0)
static void tile_sc_q8_0_tab(int n, const void *w, size_t ws, int nw, const void *a, size_t as, int na, const float *sc, const int32_t *ss,
                             size_t scs, float *out, size_t os) {
  if (nw == 4 && na == 8) q8_0s_4x8_tab(n, w, ws, a, as, sc, scs, out, os);
  else tile_sc_q8_0(n, w, ws, nw, a, as, na, sc, ss, scs, out, os);
}
// Activation quantizers: the shared scalar ones of dot.c (a few thousand elements per token,
// negligible next to the weight stream), identical on every ISA.
// Activation quantizers, vectorised: the same bytes as ll_act_quantize_q8_0/_q8_1 in dot.c
// (max of |x| - identical to fmaxf for non-NaN input -, the same d and 127/amax, round to
// nearest even, fp16 by vcvtps2ph with RNE; tested bit for bit).
static inline float block_amax(const float *x, __m256 v[4]) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// 32 floats * id -> 32 int8 (round to nearest even) stored at qs; returns the integer sum.
static inline int block_q8(const __m256 v[4], float id, int8_t *qs) {
  const __m256 mul = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i *)qs, p);
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
  return _mm_cvtsi128_si32(t);
}

void ll_act_quantize_q8_0_avx2(const float *x, void *vy, int64_t n) {
  ll_block_q8_0 *y = vy;
  for (int64_t i = 0; i < n / 32; i++, x += 32) {
    __m256 v[4];
    const float amax = block_amax(x, v);
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    block_q8(v, id, y[i].qs);
  }
}

void ll_act_quantize_q8_1_avx2(const float *x, void *vy, int64_t n) {
  ll_block_q8_1 *y = vy;
  for (int64_t i = 0; i < n / 32; i++, x += 32) {
    __m256 v[4];
    const float amax = block_amax(x, v);
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    const int sum = block_q8(v, id, y[i].qs);
    y[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
  }
}

// Q8_K (the K-quants' activations): quant.c's q_q8_K vectorised, the same bytes for finite
// input: d = 1/iscale with iscale = -127/max, max the first element of the largest magnitude
// (its sign matters), each value round-to-nearest-even(iscale·x) capped at 127, and the
// 16-element sums. (The scalar one was 2-3% of a Q4_K_M decode step.)
void ll_act_quantize_q8_K_avx2(const float *x, void *vy, int64_t n) {
  ll_block_q8_K *y = vy;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / 256; i++, x += 256) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; k++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    if (amax == 0.0f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    int first = 0; // the first j with |x[j]| == amax
    const __m256 am = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; k++) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)), am, _CMP_EQ_OQ));
      if (mask) {
        first = 8 * k + __builtin_ctz((unsigned)mask);
        break;
      }
    }
    const float iscale = -127.f / x[first];
    const __m256 is = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127), ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i quad[8]; // per 32 values: their sums by 4
    for (int c = 0; c < 8; c++) {
      __m256i q[4];
      for (int k = 0; k < 4; k++) // cvtps2dq rounds to nearest even, as lrintf
        q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * c + 8 * k), is)), cap);
      __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * c), p);
      quad[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
    }
    for (int c = 0; c < 8; c += 4) { // [b0 b2 b4 b6 | b1 b3 b5 b7] of these 128 values, in order
      const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(quad[c], quad[c + 1]), _mm256_hadd_epi32(quad[c + 2], quad[c + 3]));
      int32_t b[8];
      _mm256_storeu_si256((__m256i *)b, _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      for (int j = 0; j < 8; j++) y[i].bsums[2 * c + j] = (int16_t)b[j];
    }
    y[i].d = 1 / iscale;
  }
}
#define quantize_q8_K ll_act_quantize_q8_K_avx2
#define quantize_q8_0 ll_act_quantize_q8_0_avx2
#define quantize_q8_1 ll_act_quantize_q8_1_avx2

static void from_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * 4); }
static void from_f16(const float *x, void *vy, int64_t n) {
  ll_fp16 *y = vy;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) y[i] = ll_fp32_to_fp16(x[i]);
}

static const struct ll_type_kernels avx2_table[LL_TYPE_COUNT] = {
    [LL_TYPE_F32] = {LL_TYPE_F32, from_f32, dot_f32, "avx2", NULL},
    [LL_TYPE_F16] = {LL_TYPE_F16, from_f16, dot_f16, "avx2", NULL},
    [LL_TYPE_Q4_0] = {LL_TYPE_Q8_0, quantize_q8_0, dot_q4_0_q8_0, "avx2", tile_q4_0, 8, tile_sc_q4_0, 8, 8, ll_q4_0_tile_packed_avx2},
    [LL_TYPE_Q4_1] = {LL_TYPE_Q8_1, quantize_q8_1, dot_q4_1_q8_1, "avx2", tile_q4_1, 8, tile_sc_q4_1, 8, 4, ll_q4_1_tile_packed_avx2},
    [LL_TYPE_Q8_0] = {LL_TYPE_Q8_0, quantize_q8_0, dot_q8_0_q8_0, "avx2", tile_q8_0, 8, tile_sc_q8_0_tab, 8, 4, ll_q8_0_tile_packed_avx2},
    [LL_TYPE_Q5_0] = {LL_TYPE_Q8_0, quantize_q8_0, dot_q5_0_q8_0, "avx2", tile_q5_0, 8, tile_sc_q5_0, 8, 8, ll_q5_0_tile_packed_avx2},
    [LL_TYPE_Q5_1] = {LL_TYPE_Q8_1, quantize_q8_1, dot_q5_1_q8_1, "avx2", NULL},
    [LL_TYPE_Q4_K] = {LL_TYPE_Q8_K, quantize_q8_K, dot_q4_K_q8_K, "avx2", tile_q4_K, 8, NULL, 8, 2, ll_q4_K_tile_packed_avx2},
    [LL_TYPE_Q5_K] = {LL_TYPE_Q8_K, quantize_q8_K, dot_q5_K_q8_K, "avx2", tile_q5_K, 8, NULL, 8, 2, ll_q5_K_tile_packed_avx2},
    [LL_TYPE_Q6_K] = {LL_TYPE_Q8_K, quantize_q8_K, dot_q6_K_q8_K, "avx2", tile_q6_K, 8, NULL, 8, 2, ll_q6_K_tile_packed_avx2},
};

const struct ll_type_kernels *ll_cpu_kernels_avx2(int t) {
  pthread_once(&fp16_once, fp16_table_init);
  if (t < 0 || t >= LL_TYPE_COUNT || !avx2_table[t].vec_dot) return NULL;
  return &avx2_table[t];
}

// ---- attention over an f16 cache ----
// (Always inlined into the rows loop below, its accumulators unrolled into registers: called
// once per position it took ~22 cycles a row of 64, inlined ~12-15; 2026-11-24, Zen 3.)
AI float dot_f32_f16_body(const float *q, const uint16_t *k, int n) {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const int np = n - n % 32;
  for (int i = 0; i < np; i += 32)
    _Pragma("GCC unroll 4")
    for (int j = 0; j < 4; j++)
      a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8 * j), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8 * j))), a[j]);
  a[0] = _mm256_add_ps(a[0], a[2]);
  a[1] = _mm256_add_ps(a[1], a[3]);
  a[0] = _mm256_add_ps(a[0], a[1]);
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a[0]), _mm256_extractf128_ps(a[0], 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  const float f = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
  if (np == n) return f; // (float)(double)f == f: no tail, no round trip through double
  double sum = f;
  for (int i = np; i < n; i++) sum += (double)(q[i] * _cvtsh_ss(k[i]));
  return (float)sum;
}
static float avx2_dot_f32_f16(const float *q, const uint16_t *k, int n) { return dot_f32_f16_body(q, k, n); }

static void avx2_axpy_f16(float *o, const uint16_t *v, float w, int n) {
  const __m256 wv = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), _mm256_loadu_ps(o + i)));
  for (; i < n; i++) o[i] = fmaf(w, _cvtsh_ss(v[i]), o[i]);
}

// vcvtps2ph with round-to-nearest-even: the same bits as ll_fp32_to_fp16 for every non-NaN
// input (a NaN keeps its payload here; the scalar version returns the canonical quiet NaN).
static void avx2_from_f32(uint16_t *dst, const float *src, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

static void avx2_round_f16(float *dst, const float *src, float mul, int n) {
  const __m256 m = _mm256_set1_ps(mul);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), m), _MM_FROUND_TO_NEAREST_INT)));
  for (; i < n; i++) dst[i] = _cvtsh_ss(_cvtss_sh(src[i] * mul, _MM_FROUND_TO_NEAREST_INT));
}

// ---- ggml_v_expf / ggml_v_silu (ggml-cpu/vec.h, AVX2+FMA), instruction for instruction ----
static inline __m256 ggml_v_expf(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
  const __m256i c = _mm256_castps_si256(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (!_mm256_movemask_ps(_mm256_castsi256_ps(c))) return _mm256_fmadd_ps(j, k, k);
  const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)), _mm256_set1_epi32((int)0x82000000u));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256i d = _mm256_castps_si256(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ));
  return _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
                      _mm256_andnot_ps(_mm256_castsi256_ps(d),
                                       _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(c), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                                    _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}

static double avx2_softmax(float *y, const float *x, float max, int n) {
  double sum = 0;
  const __m256 mx = _mm256_set1_ps(max);
  int i = 0;
  for (; i < n; i += 8) {
    __m256 v;
    if (i + 8 <= n) {
      v = ggml_v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i), mx));
      _mm256_storeu_ps(y + i, v);
    } else { // the last short group: the lanes beyond n are masked positions, exactly 0
      float t[8] = {0};
      memcpy(t, x + i, (size_t)(n - i) * sizeof *t);
      const __m256 lanes = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
      v = _mm256_and_ps(ggml_v_expf(_mm256_sub_ps(_mm256_loadu_ps(t), mx)), lanes);
      _mm256_storeu_ps(t, v);
      memcpy(y + i, t, (size_t)(n - i) * sizeof *t);
    }
    __m128 v2 = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    v2 = _mm_add_ps(v2, _mm_movehl_ps(v2, v2));
    v2 = _mm_add_ss(v2, _mm_movehdup_ps(v2));
    sum += (double)_mm_cvtss_f32(v2);
  }
  return sum;
}

static void avx2_swiglu(float *out, const float *g, const float *up, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, ggml_v_expf(_mm256_sub_ps(zero, x))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; i++) out[i] = (g[i] / (1.0f + expf(-g[i]))) * up[i];
}

// GeGLU with ggml's f16 gelu table (ll_cpu_dot.h): vcvtps2ph rounds to nearest even as
// ll_fp32_to_fp16, the 8 lookups one gather; the ends (<= -10: 0, >= 10: x) by masks.
// (The scalar loop was 9% of a Gemma 3 270M prompt, its f16 conversion in software.)
static void avx2_geglu_f16(float *out, const float *g, const float *up, int64_t n) {
  const float *tab = ll_cpu_gelu_f16_table();
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m256 ge = _mm256_i32gather_ps(tab, idx, 4);
    ge = _mm256_blendv_ps(ge, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
    const __m256 r = _mm256_mul_ps(ge, _mm256_loadu_ps(up + i));
    _mm256_storeu_ps(out + i, _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LE_OQ), r));
  }
  for (; i < n; i++) {
    const float x = g[i];
    out[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x * up[i] : tab[ll_fp32_to_fp16(x)] * up[i];
  }
}

static void avx2_rope_pairs(float *v, const float *cs, const float *sn, int n_pairs, int neox) { ll_rope_pairs_impl(v, cs, sn, n_pairs, neox); }

// llama.cpp's F32 dot orders (ll_cpu_dot.h), the same steps as the scalar references.
float ll_cpu_ggml_f32_tail(const float *x, const float *y, int i, int n, float sum);
static float avx2_dot_f32_ggml(const float *x, const float *y, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int np = n & ~31;
  for (int i = 0; i < np; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
  }
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  return ll_cpu_ggml_f32_tail(x, y, np, n, _mm_cvtss_f32(_mm_hadd_ps(t1, t1)));
}
static float avx2_dot_f32_tile8(const float *x, const float *y, int n) {
  __m256 acc = _mm256_setzero_ps();
  for (int e = 0; e < n; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + e), _mm256_loadu_ps(y + e), acc);
  __m128 h = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// Dequantization for sgemm panels: the reference's (q - 8)·d, q·d + m and q·d. The products
// are exact (a 4- or 8-bit integer times an fp16 value's 11-bit significand), so only the add
// rounds, as in formats/quant.c: the same bits, fused or not. A Q4 block's 16 bytes hold
// elements 0..15 in their low nibbles, 16..31 in the high.
static inline void dq4_block(float *y, const uint8_t *qs16, __m256 d, const __m256 *m, __m256i off) {
  const __m128i qs = _mm_loadu_si128((const __m128i *)qs16), mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(qs, mask), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
  const __m128i v[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; k++) {
    const __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v[k]), off)), d);
    _mm256_storeu_ps(y + 8 * k, m ? _mm256_add_ps(p, *m) : p);
  }
}
static int avx2_dequant_row(int type, const void *src, float *y, int64_t n) {
  if ((type != LL_TYPE_Q4_0 && type != LL_TYPE_Q4_1 && type != LL_TYPE_Q8_0) || n < 0 || n % 32 != 0)
    return ll_dequantize_row(type, src, y, n);
  const int64_t nb = n / 32;
  if (type == LL_TYPE_Q4_0) { // (q - 8)·d
    const ll_block_q4_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) dq4_block(y, b[i].qs, _mm256_set1_ps(_cvtsh_ss(b[i].d)), NULL, _mm256_set1_epi32(8));
  } else if (type == LL_TYPE_Q4_1) { // q·d + m
    const ll_block_q4_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
      const __m256 m = _mm256_set1_ps(_cvtsh_ss(b[i].m));
      dq4_block(y, b[i].qs, _mm256_set1_ps(_cvtsh_ss(b[i].d)), &m, _mm256_setzero_si256());
    }
  } else { // Q8_0: q·d
    const ll_block_q8_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
      for (int k = 0; k < 4; k++) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + 8 * k)));
        _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
      }
    }
  }
  return 0;
}

static const struct ll_vec_ops vec_avx2 = {avx2_softmax, avx2_swiglu, avx2_rope_pairs, avx2_dot_f32_ggml, avx2_dot_f32_tile8, avx2_dequant_row,
                                           avx2_geglu_f16};
const struct ll_vec_ops *ll_cpu_vec_ops_avx2(void) { return &vec_avx2; }

static void avx2_dot_rows_f16(float *s, const float *q, const uint16_t *const *k, int rows, int n) {
  for (int p = 0; p < rows; p++) s[p] = dot_f32_f16_body(q, k[p], n);
}

// Head sizes that are a multiple of 8: lane L's positions L, L+32, ... are accumulated in
// registers, 64 elements (nv = 8 chunks of 8) at a time, and stored once (the reference
// updates a lane in memory per position): the same fused steps in the same order per element,
// so bit-identical. Whole 64-element chunks run with nv fixed at 8 (no branches on the
// chunk's width); the reduction reads every lane through a pointer, lanes no position reaches
// pointing at 8 zeros (+0, as in the reference's zeroed scratch) at offset 0 - a select per
// load rather than a branch per lane.
// 2.4x faster than with those branches at 32-64 positions, 1.25x at 1000 (n = 64, 2026-11-24,
// Zen 3).
AI void wsum_lane_chunk(float *dst, const uint16_t *const *v, const float *w, int rows, int L, int c, const int nv) {
  __m256 acc[8];
  _Pragma("GCC unroll 8")
  for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
  for (int p = L; p < rows; p += 32) {
    const __m256 wv = _mm256_set1_ps(w[p]);
    const uint16_t *vp = v[p] + c;
    _Pragma("GCC unroll 8")
    for (int u = 0; u < nv; u++) acc[u] = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vp + 8 * u))), acc[u]);
  }
  _Pragma("GCC unroll 8")
  for (int u = 0; u < nv; u++) _mm256_storeu_ps(dst + 8 * u, acc[u]);
}
static const float zero8_f32[8] __attribute__((aligned(32)));
static void wsum_rows_f16_lanes(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes) {
  const int nl = rows < 32 ? rows : 32;
  for (int c = 0; c < n; c += 64)
    for (int L = 0; L < nl; L++) {
      float *dst = lanes + (size_t)L * n + c;
      if (n - c >= 64) wsum_lane_chunk(dst, v, w, rows, L, c, 8);
      else wsum_lane_chunk(dst, v, w, rows, L, c, (n - c) / 8);
    }
  const float *lp[32];
  for (int L = 0; L < 32; L++) lp[L] = L < nl ? lanes + (size_t)L * n : zero8_f32;
  for (int i = 0; i < n; i += 8) {
    __m256 x[8];
    _Pragma("GCC unroll 8")
    for (int e = 0; e < 8; e++) {
#define LD(l) _mm256_loadu_ps(lp[l] + ((l) < nl ? i : 0))
      x[e] = _mm256_add_ps(_mm256_add_ps(LD(e), LD(16 + e)), _mm256_add_ps(LD(8 + e), LD(24 + e)));
#undef LD
    }
    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x[0], x[4]), _mm256_add_ps(x[1], x[5])),
                                          _mm256_add_ps(_mm256_add_ps(x[2], x[6]), _mm256_add_ps(x[3], x[7]))));
  }
}

// Other head sizes: the reference's steps, each position's axpy vectorized.
static void avx2_wsum_rows_f16(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes) {
  if (n % 8 == 0) {
    wsum_rows_f16_lanes(o, v, w, rows, n, lanes);
    return;
  }
  memset(lanes, 0, (size_t)32 * n * sizeof *lanes);
  for (int p = 0; p < rows; p++) avx2_axpy_f16(lanes + (size_t)(p % 32) * n, v[p], w[p], n);
  for (int i = 0; i < n; i++) {
    float x[8];
    for (int e = 0; e < 8; e++)
      x[e] = (lanes[(size_t)e * n + i] + lanes[(size_t)(16 + e) * n + i]) + (lanes[(size_t)(8 + e) * n + i] + lanes[(size_t)(24 + e) * n + i]);
    o[i] = ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
  }
}

// Eight positions at a time (then four, then one): independent FMA chains (one chain of hd/8
// dependent FMAs per position was latency-bound), and the eight scores reduced together and
// stored with one store (one position at a time the reductions were half the time: 8 at once
// measured 27% faster, 128 queries x 1-128 positions x 64, 2026-11-24, Zen 3). Each
// position's lane order and reduction tree are unchanged.
static void avx2_dot_rows8_f16(float *s, const float *q, const uint16_t *const *k, int rows, int n) {
  int p = 0;
  for (; p + 8 <= rows; p += 8) {
    __m256 a[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      _Pragma("GCC unroll 8")
      for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[p + r] + i))), a[r]);
    }
    _mm256_storeu_ps(s + p, hsum256_x8(a));
  }
  for (; p + 4 <= rows; p += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const uint16_t *k0 = k[p], *k1 = k[p + 1], *k2 = k[p + 2], *k3 = k[p + 3];
    for (int i = 0; i < n; i += 8) {
      const __m256 qv = _mm256_loadu_ps(q + i);
      a0 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k0 + i))), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k1 + i))), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k2 + i))), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k3 + i))), a3);
    }
    s[p] = hsum256(a0), s[p + 1] = hsum256(a1), s[p + 2] = hsum256(a2), s[p + 3] = hsum256(a3);
  }
  for (; p < rows; p++) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[p] + i))), acc);
    s[p] = hsum256(acc);
  }
}

// Lanes are positions here (p % 8) and the vector runs over output elements: lane L of 8
// elements accumulates positions L, L+8, ... in order, then the lanes meet in hsum's tree.
// C (1 or 2) chunks of 8 elements per pass over the positions, 8 lane accumulators each, all
// in registers: with two, each weight's broadcast serves both (12-22% faster than one,
// 128 queries x 1-128 positions x 64, 2026-11-24, Zen 3).
AI void wsum8_chunks(float *o, const uint16_t *const *v, const float *w, int rows, int i, const int C) {
  const int full = rows & ~7;
  __m256 l[2][8];
  for (int c = 0; c < C; c++)
    _Pragma("GCC unroll 8")
    for (int L = 0; L < 8; L++) l[c][L] = _mm256_setzero_ps();
  for (int p = 0; p < rows; p += 8) {
    _Pragma("GCC unroll 8")
    for (int L = 0; L < 8; L++) {
      if (p == full && full + L >= rows) break; // the tail group: positions up to rows
      const __m256 b = _mm256_broadcast_ss(w + p + L);
      for (int c = 0; c < C; c++)
        l[c][L] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v[p + L] + i + 8 * c))), b, l[c][L]);
    }
  }
  for (int c = 0; c < C; c++)
    _mm256_storeu_ps(o + i + 8 * c, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[c][0], l[c][4]), _mm256_add_ps(l[c][2], l[c][6])),
                                                  _mm256_add_ps(_mm256_add_ps(l[c][1], l[c][5]), _mm256_add_ps(l[c][3], l[c][7]))));
}
static void avx2_wsum_rows8_f16(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes) {
  if (n % 8) {
    ll_cpu_f16_ops_ref()->wsum_rows8_f16(o, v, w, rows, n, lanes);
    return;
  }
  int i = 0;
  for (; i + 16 <= n; i += 16) wsum8_chunks(o, v, w, rows, i, 2);
  if (i < n) wsum8_chunks(o, v, w, rows, i, 1); // an 8-element tail
}

static const struct ll_f16_ops f16_avx2 = {avx2_dot_f32_f16, avx2_axpy_f16, avx2_from_f32, avx2_round_f16, avx2_dot_rows_f16, avx2_wsum_rows_f16,
                                           avx2_dot_rows8_f16, avx2_wsum_rows8_f16};
const struct ll_f16_ops *ll_cpu_f16_ops_avx2(void) { return &f16_avx2; }
