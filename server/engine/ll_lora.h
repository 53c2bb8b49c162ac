// ll_lora.h - one LoRA adapter in memory: what the trainer updates, the engine applies per
// sequence, and the importers/exporters (GGUF LoRA, PEFT, .ckpt) read and write.
//
// For each (layer, target) that is adapted: A (r, in) and B (out, r), both F32 ll_weights whose
// data lives in backend memory (ll_backend_alloc), so the OpenCL backend can keep them on the
// device. The adapted product is
//     y = W·x + scale · B·(A·x),   scale = alpha / r          // x (T, in), y (T, out)
// B starts at zero (a fresh adapter changes nothing); A from a seeded Kaiming-uniform init as
// PEFT does. Shapes follow GGUF: A has ne = {in, r} (r rows of `in` floats), B ne = {r, out}.
#ifndef LL_LORA_H
#define LL_LORA_H

#include <stdint.h>

#include "ll_backend.h"

enum ll_lora_target {
  LL_LORA_Q, LL_LORA_K, LL_LORA_V, LL_LORA_O, LL_LORA_GATE, LL_LORA_UP, LL_LORA_DOWN,
  LL_LORA_N_TARGETS
};
#define LL_LORA_ALL_TARGETS ((1u << LL_LORA_N_TARGETS) - 1)

struct ll_lora_pair {
  struct ll_weight a; // F32 (r rows of in): data NULL when this target is not adapted
  struct ll_weight b; // F32 (out rows of r)
};

struct ll_lora {
  char name[64];            // "live", a checkpoint's name, a file's stem
  int n_layer, rank;
  float alpha;              // scale = alpha / rank
  unsigned targets;         // bitmask of 1u << enum ll_lora_target
  struct ll_lora_pair *pairs; // (n_layer * LL_LORA_N_TARGETS), pairs[l * LL_LORA_N_TARGETS + t]
  float *storage;           // every A and B in one backend allocation
  int64_t n_params;         // floats in storage
  struct ll_backend *be;    // owner of storage
};

static inline float ll_lora_scale(const struct ll_lora *a) { return a->alpha / (float)a->rank; }
static inline struct ll_lora_pair *ll_lora_at(const struct ll_lora *a, int layer, int target) {
  return &a->pairs[layer * LL_LORA_N_TARGETS + target];
}

#endif
