// ll_ref.h - definitions every backend computes with, so that their results agree bit for bit:
// dropout's counter-based RNG and the RoPE angle table. Shared by the CPU backend (kernels/cpu)
// and the OpenCL backend (kernels/opencl) without either reaching into the other's headers.
#ifndef LL_REF_H
#define LL_REF_H

#include <math.h>
#include <stdint.h>

#include "ll_backend.h"

// Dropout's counter-based RNG: element i of a call with `seed` is kept iff
// ll_dropout_bits(seed, i) >= ll_dropout_threshold(p), whatever thread computes it.
// splitmix64: the state of element i is mix(seed) + (i + 1) * golden gamma, its output mix(state).
static inline uint64_t ll_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline uint32_t ll_dropout_bits(uint64_t seed_mixed, uint64_t i) {
  return (uint32_t)(ll_mix64(seed_mixed + (i + 1) * 0x9e3779b97f4a7c15ULL) >> 40); // 24 uniform bits
}
static inline uint32_t ll_dropout_threshold(float p) { return (uint32_t)((double)p * 16777216.0); }

// RoPE angles of one position as every backend's rope, rope_kv_store and rope_backward use them
// (host tables), as ggml's rope cache computes them (ggml-cpu ops.cpp ggml_rope_cache_init /
// rope_yarn without YaRN): theta_i = pos * base^(-2i/n_rot) by repeated float products, divided
// by the freq factor, times the scale; cos and sin times the attention factor (mscale). The
// backward's transposed rotation uses the same table: y = m R x gives dx = m R^T dy.
static inline float ll_rope_mscale(const struct ll_rope_params *p) { return p->attn_factor != 0.0f ? p->attn_factor : 1.0f; }
static inline void ll_rope_angles(int32_t pos, const struct ll_rope_params *p, float *cs, float *sn) {
  const int n = p->n_rot / 2;
  const float m = ll_rope_mscale(p);
  const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
  float theta = (float)pos;
  for (int i = 0; i < n; i++) {
    const float ff = p->freq_factors ? p->freq_factors[i] : 1.0f;
    const float th = p->freq_scale * (theta / ff);
    cs[i] = cosf(th) * m;
    sn[i] = sinf(th) * m;
    theta *= theta_scale;
  }
}

#endif
