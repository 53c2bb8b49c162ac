// ll_quant.h - tensor element types and quantized block layouts.
//
// Type ids and block layouts are GGUF's (ggml's) so that quantized tensors can be carried
// bit-exactly between GGUF files, our .ckpt container and the compute kernels.
// Every layout below is a packed array of blocks; a row of n elements of a block type holds
// n / blck_size blocks (n must be a multiple of blck_size).
#ifndef LL_QUANT_H
#define LL_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum ll_type {
  LL_TYPE_F32 = 0,
  LL_TYPE_F16 = 1,
  LL_TYPE_Q4_0 = 2,
  LL_TYPE_Q4_1 = 3,
  LL_TYPE_Q5_0 = 6,
  LL_TYPE_Q5_1 = 7,
  LL_TYPE_Q8_0 = 8,
  LL_TYPE_Q8_1 = 9,   // activation-side only (kernels)
  LL_TYPE_Q2_K = 10,  // known to the table for naming; no dequantizer
  LL_TYPE_Q3_K = 11,  // known to the table for naming; no dequantizer
  LL_TYPE_Q4_K = 12,
  LL_TYPE_Q5_K = 13,
  LL_TYPE_Q6_K = 14,
  LL_TYPE_Q8_K = 15,  // activation-side only (kernels)
  LL_TYPE_I8 = 24,
  LL_TYPE_I16 = 25,
  LL_TYPE_I32 = 26,
  LL_TYPE_BF16 = 30,
  LL_TYPE_COUNT = 41, // ids are < LL_TYPE_COUNT; unknown ids in that range have blck_size 0
};

typedef uint16_t ll_fp16; // IEEE half, stored bits
typedef uint16_t ll_bf16; // bfloat16, stored bits

#define LL_QK4_0 32
#define LL_QK4_1 32
#define LL_QK5_0 32
#define LL_QK5_1 32
#define LL_QK8_0 32
#define LL_QK8_1 32
#define LL_QK_K 256
#define LL_K_SCALE_SIZE 12

typedef struct { ll_fp16 d; uint8_t qs[LL_QK4_0 / 2]; } ll_block_q4_0;                    // 18 B
typedef struct { ll_fp16 d, m; uint8_t qs[LL_QK4_1 / 2]; } ll_block_q4_1;                 // 20 B
typedef struct { ll_fp16 d; uint8_t qh[4]; uint8_t qs[LL_QK5_0 / 2]; } ll_block_q5_0;     // 22 B
typedef struct { ll_fp16 d, m; uint8_t qh[4]; uint8_t qs[LL_QK5_1 / 2]; } ll_block_q5_1;  // 24 B
typedef struct { ll_fp16 d; int8_t qs[LL_QK8_0]; } ll_block_q8_0;                         // 34 B
typedef struct { ll_fp16 d, s; int8_t qs[LL_QK8_1]; } ll_block_q8_1;                      // 36 B, s = d * sum(qs)
typedef struct {
  ll_fp16 d, dmin;
  uint8_t scales[LL_K_SCALE_SIZE]; // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[LL_QK_K / 2];
} ll_block_q4_K; // 144 B
typedef struct {
  ll_fp16 d, dmin;
  uint8_t scales[LL_K_SCALE_SIZE];
  uint8_t qh[LL_QK_K / 8];
  uint8_t qs[LL_QK_K / 2];
} ll_block_q5_K; // 176 B
typedef struct {
  uint8_t ql[LL_QK_K / 2];
  uint8_t qh[LL_QK_K / 4];
  int8_t scales[LL_QK_K / 16];
  ll_fp16 d;
} ll_block_q6_K; // 210 B
typedef struct {
  float d;
  int8_t qs[LL_QK_K];
  int16_t bsums[LL_QK_K / 16];
} ll_block_q8_K; // 292 B

_Static_assert(sizeof(ll_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(ll_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(ll_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(ll_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(ll_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(ll_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(ll_block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(ll_block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(ll_block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(ll_block_q8_K) == 292, "q8_K layout");

struct ll_type_traits {
  const char *name;   // "q4_1", as llama.cpp names it (NULL: unknown id)
  int blck_size;      // elements per block (1 for plain types, 0 if unknown)
  size_t type_size;   // bytes per block
  int has_dequant;    // 1 if ll_dequantize_row supports it (weights we can load)
};

// Traits of a type id; returns NULL for ids out of range or unknown.
const struct ll_type_traits *ll_type_traits_get(int type);
const char *ll_type_name(int type); // "?" for unknown
int ll_type_from_name(const char *name); // -1 if unknown (case-insensitive)

// Bytes for a row of n elements; 0 and *ok = 0 if n is not a multiple of the block size
// or the type is unknown. Overflow-safe.
size_t ll_row_size(int type, int64_t n);

// Index of the first element that is NaN or Inf in nbytes of tensor data: of a float type
// (f32, f16, bf16) the element itself; of a block type the first element of the first block
// whose f16 scale d (or m / dmin, where the layout has one) is. -1 when all are finite, and for
// types without float fields (integers). A bit test per value: a model's load checks each
// tensor once.
int64_t ll_tensor_find_nonfinite(int type, const void *data, size_t nbytes);

// ---- scalar element conversions (reference, bit-exact with ggml) ----
float ll_fp16_to_fp32(ll_fp16 h);
ll_fp16 ll_fp32_to_fp16(float f);  // round to nearest even, as ggml's GGML_FP32_TO_FP16
float ll_bf16_to_fp32(ll_bf16 h);
ll_bf16 ll_fp32_to_bf16(float f);  // round to nearest even, NaN kept quiet (as ggml)

// ---- scalar reference (de)quantizers ----
// Dequantize n elements (multiple of the block size) of `type` from src into dst.
// Returns 0 or LL_EUNSUPPORTED / LL_EINVAL.
int ll_dequantize_row(int type, const void *src, float *dst, int64_t n);
// Quantize n floats into `type` (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_1, Q8_K, F16, BF16, F32);
// reference rounding identical to ggml's quantize_row_*_ref. Returns 0 or an error.
int ll_quantize_row(int type, const float *src, void *dst, int64_t n);

// The bits of a float and back (no aliasing: memcpy compiles to a register move).
static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float f32_from(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
