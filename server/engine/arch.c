// arch.c - the model families, one row each (ll_arch.h). What a row says was read from
// llama.cpp 0c1e5709 (src/models/<arch>.cpp: the graph each family builds) and its converter
// (convert_hf_to_gguf.py: the tensor names and metadata keys a GGUF of that family carries).
#include "ll_arch.h"

#include <string.h>

#include "ll_backend.h"

static const struct ll_arch arches[] = {
    // Llama, Mistral (llama with attention.sliding_window: a window on every layer), SmolLM2,
    // llama2.c checkpoints (their readers say llama); Mixtral (llama with experts).
    {"llama", LL_ROPE_NORMAL, LL_ACT_SILU, LL_ARCH_QKV_BIAS | LL_ARCH_SWA, 1, 0.0f, 1, LL_ARCH_QKV_BIAS},
    // Qwen2 / 2.5: biases on q, k, v; NeoX rotation.
    {"qwen2", LL_ROPE_NEOX, LL_ACT_SILU, LL_ARCH_QKV_BIAS, 0, 0.0f, 0, LL_ARCH_QKV_BIAS},
    // Qwen3: per-head RMSNorm of q and k, no biases; head_dim from attention.key_length (the
    // trainer differentiates the norms, and their weights in full mode).
    {"qwen3", LL_ROPE_NEOX, LL_ACT_SILU, LL_ARCH_QK_NORM, 0, 0.0f, 0, LL_ARCH_QK_NORM}, // LoRA: trainer.c's per-head norm backward
    // Gemma 3: embeddings * sqrt(C), GeGLU, post-attention and post-FFN norms, q/k norms, q
    // prescaled, 5 local (sliding-window, RoPE base 10000) layers to 1 global. Its norm
    // weights are (1 + w) in the model's terms; llama.cpp's converter folds the 1 in
    // (conversion/gemma.py, Gemma3Model.norm_shift: 1.0 for every *norm.weight), so the GGUF's
    // are used as they are by the plain RMSNorm.
    // LoRA training: trainer.c's GeGLU and post-norm backward, the embedding scale, q prescale as
    // attention's scale, local layers' RoPE base and window (attention_train_swa).
    {"gemma3", LL_ROPE_NEOX, LL_ACT_GELU_TANH, LL_ARCH_QK_NORM | LL_ARCH_POST_NORMS | LL_ARCH_EMBD_SCALE | LL_ARCH_Q_PRESCALE | LL_ARCH_SWA, 6,
     10000.0f, 0, LL_ARCH_QK_NORM | LL_ARCH_POST_NORMS | LL_ARCH_EMBD_SCALE | LL_ARCH_Q_PRESCALE | LL_ARCH_TRAIN_ACT},
    // Phi-3 / 3.5: fused qkv and gate|up, NeoX rotation, q prescaled. (llama.cpp ignores its
    // sliding_window - "Phi SWA is currently disabled" - and so do we, to give its results.)
    // LoRA: the fused matrices are row slices (engine.c), so their backward is the members'
    // (dx summed); q, k, v and gate, up adapt as one module each (ll_lora.h); full training
    // keeps attn_qkv and ffn_up whole in P; the prescale by 1/sqrt(hd) is the trainer's
    // attention scale.
    {"phi3", LL_ROPE_NEOX, LL_ACT_SILU, LL_ARCH_FUSED_QKV | LL_ARCH_FUSED_UP | LL_ARCH_Q_PRESCALE, 0, 0.0f, 0,
     LL_ARCH_FUSED_QKV | LL_ARCH_FUSED_UP | LL_ARCH_Q_PRESCALE},
    // Mixtures of experts (moe.c): qwen2moe (biases, a shared expert), qwen3moe (per-head q/k
    // norms), olmoe (q/k norms over whole rows).
    // All three train (moe.c's ll_moe_backward; trainer.c's q/k norms, per head or whole rows):
    // LoRA on attention and, configurably, the experts; every weight in full mode (float models).
    {"qwen2moe", LL_ROPE_NEOX, LL_ACT_SILU, LL_ARCH_QKV_BIAS | LL_ARCH_MOE, 0, 0.0f, 0, LL_ARCH_QKV_BIAS | LL_ARCH_MOE},
    {"qwen3moe", LL_ROPE_NEOX, LL_ACT_SILU, LL_ARCH_QK_NORM | LL_ARCH_MOE, 0, 0.0f, 1, LL_ARCH_QK_NORM | LL_ARCH_MOE},
    {"olmoe", LL_ROPE_NEOX, LL_ACT_SILU, LL_ARCH_QK_NORM | LL_ARCH_QK_NORM_ROWS | LL_ARCH_MOE, 0, 0.0f, 0, LL_ARCH_QK_NORM | LL_ARCH_MOE},
};

const struct ll_arch *ll_arch_find(const char *name) {
  for (size_t i = 0; name && i < sizeof arches / sizeof arches[0]; i++)
    if (strcmp(arches[i].name, name) == 0) return &arches[i];
  return NULL;
}

const char *ll_arch_names(void) { return "llama (and Mistral, Mixtral), qwen2, qwen3, gemma3, phi3, qwen2moe, qwen3moe, olmoe"; }

int ll_arch_trainable(const struct ll_arch *a, const char **what) {
  static const struct {
    unsigned flag;
    const char *name;
  } hooks[] = {{LL_ARCH_MOE, "the routed experts"}, {LL_ARCH_QK_NORM, "q/k norms"},        {LL_ARCH_POST_NORMS, "post-norms"},  {LL_ARCH_EMBD_SCALE, "embedding scale"},
               {LL_ARCH_Q_PRESCALE, "q prescale"}, {LL_ARCH_FUSED_QKV, "fused qkv"},    {LL_ARCH_FUSED_UP, "fused gate/up"}};
  *what = NULL;
  if (a->act != LL_ACT_SILU && !(a->train_hooks & LL_ARCH_TRAIN_ACT)) {
    *what = "the GeGLU activation";
    return 0;
  }
  for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
    if ((a->flags & hooks[i].flag) && !(a->train_hooks & hooks[i].flag)) {
      *what = hooks[i].name;
      return 0;
    }
  return 1;
}
