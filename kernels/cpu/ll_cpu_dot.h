// ll_cpu_dot.h - quantized dot products: one weight row · one quantized activation row.
//
// Activations are quantized the way llama.cpp does before its integer dot products, so that
// outputs agree with it: Q4_0/Q5_0/Q8_0 weights -> Q8_0 activations; Q4_1/Q5_1 -> Q8_1;
// Q4_K/Q5_K/Q6_K -> Q8_K; F16 -> F16; BF16 -> BF16; F32 -> F32.
// Every kernel has a scalar reference (dot.c); optimized versions (dot_avx2.c, ...) are chosen
// at run time and tested against the reference.
#ifndef LL_CPU_DOT_H
#define LL_CPU_DOT_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>

// s = w (n elements, weight type) · a (n elements, activation type)
typedef void (*ll_vec_dot_fn)(int n, float *s, const void *w, const void *a);
// Quantize n floats of x into the activation type.
typedef void (*ll_from_float_fn)(const float *x, void *y, int64_t n);

// A tile of dots: out[a * ostride + r] = w_r · a_a for r < nw (<= 4) weight rows (w_stride bytes
// apart) and a < na (<= tile_na of the kernel set) activation rows (a_stride bytes apart). Each output is computed with
// exactly the operations of vec_dot (bit-identical); the tile only shares loads and hides latency.
typedef void (*ll_vec_dot_tile_fn)(int n, const void *w, size_t w_stride, int nw, const void *a, size_t a_stride, int na,
                                   float *out, size_t ostride);

// ll_type_kernels.tile_packed (below).
typedef void ll_tile_packed_fn(int n, const void *group, const void *a, size_t a_stride, int na, const float *sc, const int32_t *ss,
                               size_t sc_stride, float *out, size_t ostride);

struct ll_type_kernels {
  int act_type;              // enum ll_type of the quantized activations
  ll_from_float_fn from_float;
  ll_vec_dot_fn vec_dot;
  const char *isa;           // "scalar", "avx2", ...
  ll_vec_dot_tile_fn tile;   // (optional) NULL: callers loop over vec_dot
  int tile_na;               // (optional) most activation rows per tile call (<= 8); 0 means 2
  // (optional) The tile given side tables of the activation blocks, block-major:
  // sc[i * sc_stride + a] is the scale of block i of activation row a as a float, ss[i *
  // sc_stride + a] for Q8_0 -8 * the sum of its quants, for Q8_1 the bits of its s as a float
  // (ll_act_side fills both).
  // Same results as tile; the caller computes these once per matrix product instead of every
  // row group computing them again.
  void (*tile_sc)(int n, const void *w, size_t w_stride, int nw, const void *a, size_t a_stride, int na, const float *sc,
                  const int32_t *ss, size_t sc_stride, float *out, size_t ostride);
  // (optional) Decode over re-laid weights: groups of pack_rows rows interleaved block by block
  // (the layout of ll_pack_rows), read as one stream instead of pack_rows row streams.
  // tile_packed computes out[a * ostride + r] = row r · a_a for the group's pack_rows rows and
  // a < na (<= 4) activation rows, given tile_sc's side tables (Q8_0/Q8_1 activations; the
  // K-quants' take none); bit-identical to vec_dot.
  // Used for batches of fewer than packed_max_t tokens (larger ones share more work per weight
  // block in the tiles over the rows).
  int pack_rows;
  int packed_max_t;
  ll_tile_packed_fn *tile_packed;
  // (optional) Prompts, 16 tokens to a vector: out[(16 g + t) * ostride + r] = (or += with
  // accumulate) w_r · token 16 g + t, for 4 weight rows r (w_stride bytes apart), t < 16 and
  // g < ng <= LL_GEMM16_MAX_GROUPS groups, from the activations in ll_act_t16_q8_0's layout
  // (at: group 0's) and tile_sc's scale table (sc: group 0's first token, block-major,
  // sc_stride apart), or for the K-quants ll_act_t16_q8_K's (sc NULL). Bit-identical to
  // vec_dot (the same block sums and float steps).
  void (*gemm16)(int n, const void *w, size_t w_stride, const void *at, int ng, const float *sc, size_t sc_stride, float *out,
                 size_t ostride, int accumulate);
  // (optional, with gemm16) ll_act_t16_q8_0 / _q8_K for act_type, vectorised: the same bytes.
  void (*act_t16)(const void *act, size_t a_stride, int ng, int64_t k, void *out);
};
#define LL_GEMM16_MAX_GROUPS 32

// Q8_0 activation rows (a_stride bytes apart, k elements) of ng groups of 16 tokens laid out
// for gemm16: per group, per block i, per 4-element word w (0..7) of the block, the 16 tokens'
// words (64 bytes), each byte the quant + 128 (unsigned). 16 * k bytes per group.
void ll_act_t16_q8_0(const void *act, size_t a_stride, int ng, int64_t k, void *out);
// The same for Q8_K rows (the K-quants): per group, per super-block, LL_T16_Q8K_BYTES: its 64
// words of 16 tokens (quant + 128, unsigned; 4096 B), then its 16 bsums of the 16 tokens as
// int32 (16 x 64 B), then the tokens' d (64 B).
#define LL_T16_Q8K_BYTES (4096 + 1024 + 64)
void ll_act_t16_q8_K(const void *act, size_t a_stride, int ng, int64_t k, void *out);

// The interleaved layouts of tile_packed, groups of 8 rows taking exactly their rows' bytes.
// Q4_0: block i of a group is 144 bytes, the eight rows' fp16 scales in the order of rows
// 0 2 4 6 1 3 5 7 (16 B; the lane order of the kernel's reduction, so one vcvtph2ps loads
// them), then their 16 bytes of nibbles, rows 0..7 (8 x 16 B). Q4_1: 160 bytes, the scales d
// of rows 0..7 (16 B), their mins m (16 B), then the nibbles as for Q4_0. Q8_0: 272 bytes,
// the scales of rows 0..7 (16 B), then their 32 quants each (8 x 32 B). Q5_0: 176 bytes, the
// scales as Q4_0's (16 B), the rows' fifth bits in bit planes (32 B: row 2k+h's bit for
// element j < 16 is bit 2k of byte 16h + j, for element 16 + j bit 2k + 1), then the nibbles
// as Q4_0's. Q4_K, Q5_K, Q6_K: the 8 rows' super-blocks i, whole, one after the other.
// ll_pack_rows packs rows 0..nrows-1 (nrows a multiple of 8) of k elements, row_stride bytes
// apart, into out (nrows * ll_row_size(type, k) bytes). Returns 0, or -1 for another type or
// shape.
int ll_pack_rows(int type, const void *rows, size_t row_stride, int64_t nrows, int64_t k, void *out);
// Row r of a packed matrix back in its own layout (the inverse, for tests and checks).
int ll_unpack_row(int type, const void *packed, int64_t r, int64_t k, void *row);

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (shared by every ISA's dots).
static inline void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Activation quantizers (llama.cpp's x86 semantics; see dot.c).
void ll_act_quantize_q8_0(const float *x, void *y, int64_t n);
void ll_act_quantize_q8_1(const float *x, void *y, int64_t n);
// The same, vectorised (dot_avx2.c; only call where the CPU has AVX2/F16C).
void ll_act_quantize_q8_0_avx2(const float *x, void *y, int64_t n);
void ll_act_quantize_q8_1_avx2(const float *x, void *y, int64_t n);
void ll_act_quantize_q8_K_avx2(const float *x, void *y, int64_t n);
// The AVX2 tile_packed kernels (dot_avx2.c). The AVX-512 set takes the Q4_0, Q4_1, Q5_0 and
// Q8_0 ones too: at one token they beat its VNNI row tiles (measured, docs/PERFORMANCE.md);
// it has no K-quant kernels of its own.
ll_tile_packed_fn ll_q4_0_tile_packed_avx2, ll_q4_1_tile_packed_avx2, ll_q5_0_tile_packed_avx2, ll_q8_0_tile_packed_avx2;
ll_tile_packed_fn ll_q4_K_tile_packed_avx2, ll_q5_K_tile_packed_avx2, ll_q6_K_tile_packed_avx2;

// The side tables of ll_type_kernels.tile_sc for one row of n activations of type act_type
// (Q8_0 or Q8_1; row a of T): sc[i * stride] = f32 of block i's d, ss[i * stride] = Q8_0:
// -8 * the sum of its quants, Q8_1: f32 of its s (bits). Returns 0, or -1 for another type.
int ll_act_side(int act_type, const void *row, int64_t n, float *sc, int32_t *ss, size_t stride);

// Best kernels for a weight type on this CPU (NULL if unsupported).
const struct ll_type_kernels *ll_cpu_kernels(int weight_type);
// The scalar references (always available; used by tests and as the fallback).
const struct ll_type_kernels *ll_cpu_kernels_ref(int weight_type);
// "avx512vnni" / "avx2" / "neon" / "scalar": the best SIMD level of this CPU (per type the best
// kernel written for it is used).
const char *ll_cpu_isa(void);

// AVX2 versions (dot_avx2.c), NULL entries where not written.
const struct ll_type_kernels *ll_cpu_kernels_avx2(int weight_type);
// AVX-512 F/BW/VL + VNNI versions (dot_avx512.c): Q4_0, Q4_1, Q5_0, Q8_0.
const struct ll_type_kernels *ll_cpu_kernels_avx512(int weight_type);
// AArch64 NEON versions (dot_neon.c): Q4_0, Q4_1, Q8_0, bit-identical to the scalar
// references; NULL on other architectures.
const struct ll_type_kernels *ll_cpu_kernels_neon(int weight_type);

// Attention helpers over an f16 cache (scalar in dot.c, AVX2+F16C in dot_avx2.c):
//   s = Σ q[i] * k[i]                 (q f32, k f16)
//   o[i] += w * v[i]                  (v f16)
//   dst[i] = f16(src[i])               (round to nearest even; the KV-cache store)
//   dst[i] = f32(f16(src[i] * mul))    (values rounded through f16, as llama.cpp does in attention)
struct ll_f16_ops {
  float (*dot_f32_f16)(const float *q, const uint16_t *k, int n);
  void (*axpy_f16)(float *o, const uint16_t *v, float w, int n);
  void (*from_f32)(uint16_t *dst, const float *src, int n); // bit-identical for non-NaN inputs
  void (*round_f16)(float *dst, const float *src, float mul, int n); // dst[i] = f32(f16(src[i] * mul))
  // One head's attention over `rows` cached positions (rows given by pointer: the cache is paged):
  //   s[p] = dot_f32_f16(q, k[p], n)
  //   o[i] = Σ_p w[p] * v[p][i] in llama.cpp's order: position p accumulated (fused) into lane
  //          p % 32, the 32 lanes reduced in ggml's fixed tree (lanes: scratch of 32 * n floats)
  void (*dot_rows_f16)(float *s, const float *q, const uint16_t *const *k, int rows, int n);
  void (*wsum_rows_f16)(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes);
  // The same two in the order llama.cpp's prompt pass uses (its llamafile tinyBLAS F16 GEMM,
  // taken for batches of >= 2 tokens): 8 lanes, element/position e fused into lane e % 8 in
  // order, then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). n % 8 == 0 for dot_rows8_f16.
  void (*dot_rows8_f16)(float *s, const float *q, const uint16_t *const *k, int rows, int n);
  void (*wsum_rows8_f16)(float *o, const uint16_t *const *v, const float *w, int rows, int n, float *lanes);
};
const struct ll_f16_ops *ll_cpu_f16_ops(void);

// ggml's CPU math (ggml-cpu/vec.{h,cpp}, its AVX2 path) reproduced bit for bit:
//   softmax: y[i] = exp(x[i] - max) with ggml_v_expf, lanes of 8 from i = 0 (a short last
//            group is padded with masked lanes, which ggml computes as exactly 0); returns
//            Σ over groups of (double)(float sum of the group in ggml's order).
//   swiglu:  out[i] = x/(1+exp(-x)) * up with ggml_v_silu per 8, then libm expf for a tail.
// The scalar versions emulate the vector instructions lane by lane (fmaf, bit operations),
// so both give the same bits (tested).
struct ll_vec_ops {
  double (*softmax)(float *y, const float *x, float max, int n);
  void (*swiglu)(float *out, const float *gate, const float *up, int64_t n);
  // RoPE rotation of one head's n_pairs pairs (NEOX: (v[i], v[i + n_pairs]); else (v[2i], v[2i+1]))
  void (*rope_pairs)(float *v, const float *cs, const float *sn, int n_pairs, int neox);
  // F32 x F32 dot products in llama.cpp's orders (its AVX2 build), for F32 weights of GGUF
  // models (LoRA factors) so that adapted outputs match llama.cpp --lora bit for bit:
  // dot_f32_ggml = ggml_vec_dot_f32 (one token): elements 32 at a time fused into 4 x 8 lanes,
  //   lanes ((a0+a2)+(a1+a3)), halves added, then two horizontal adds; the tail (n % 32) added
  //   in order: 8 and 4 at a time as rounded products, the last 1..3 (or all, when n % 32 < 8)
  //   fused - as GCC compiled ggml's leftover loop.
  // dot_f32_tile8 = llamafile tinyBLAS<8> (batches of >= 2 tokens, n % 8 == 0): element e fused
  //   into lane e % 8, then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
  float (*dot_f32_ggml)(const float *x, const float *y, int n);
  float (*dot_f32_tile8)(const float *x, const float *y, int n);
  // Dequantize n weights of one row (ll_dequantize_row's contract and bits: the reference is
  // that function; Q4_0, Q4_1 and Q8_0 have SIMD versions, the other types go to it). Training
  // dequantizes every frozen weight twice a step into sgemm panels (train.c, backend_cpu.c).
  int (*dequant_row)(int type, const void *src, float *dst, int64_t n);
  // out = gelu(gate) * up as ggml's CPU (GGML_GELU_FP16): gelu read at f16(gate), rounded to
  // nearest even, from ll_cpu_gelu_f16_table(); 0 for gate <= -10, gate * up for gate >= 10.
  // Every version the same bits (a table lookup and one product).
  void (*geglu_f16)(float *out, const float *gate, const float *up, int64_t n);
};

// f16(gelu_tanh(h)) as float for every f16 h, built once (libm tanhf, ggml's constants).
const float *ll_cpu_gelu_f16_table(void);

// llama.cpp's rotate_pairs (ggml-cpu/ops.cpp) is GNU C++ built with -mfma and the default
// -ffp-contract=fast: GCC fuses the first product of each rotated value, x0*c - x1*s becomes
// fma(x0, c, -(x1*s)) and x0*s + x1*c becomes fma(x0, s, x1*c), in its vectorised (vfmaddsub)
// and scalar loops alike. Only NORMAL mode's epilogue for an odd pair count (vaddsubps) is unfused.
// Included by dot.c (fmaf from libm) and dot_avx2.c (-mfma: inline vfmadd), same bits.
static inline void ll_rope_pairs_impl(float *v, const float *cs, const float *sn, int n_pairs, int neox) {
  const int unfused_last = !neox && n_pairs % 2;
  for (int i = 0; i < n_pairs; i++) {
    const int a = neox ? i : 2 * i, c2 = neox ? i + n_pairs : 2 * i + 1;
    const float x0 = v[a], x1 = v[c2];
    if (unfused_last && i == n_pairs - 1) {
      v[a] = x0 * cs[i] - x1 * sn[i];
      v[c2] = x0 * sn[i] + x1 * cs[i];
    } else {
      v[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
      v[c2] = fmaf(x0, sn[i], x1 * cs[i]);
    }
  }
}
const struct ll_vec_ops *ll_cpu_vec_ops(void);
const struct ll_vec_ops *ll_cpu_vec_ops_ref(void);
const struct ll_vec_ops *ll_cpu_vec_ops_avx2(void);
const struct ll_f16_ops *ll_cpu_f16_ops_ref(void);
const struct ll_f16_ops *ll_cpu_f16_ops_avx2(void);

#endif
