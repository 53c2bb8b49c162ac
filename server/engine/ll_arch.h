// ll_arch.h - the model families the engine knows, as data: one row per GGUF
// general.architecture with the hooks its forward pass takes (norms, activation, attention
// variants, fused tensors). engine.c composes one forward pass from these flags, and the
// trainer refuses what it cannot differentiate yet (ll_arch.train_hooks), so a new dense family
// is a table row plus, at most, a hook - never a fork of the forward pass.
#ifndef LL_ARCH_H
#define LL_ARCH_H

#include <stddef.h>

enum ll_act {
  LL_ACT_SILU,      // SwiGLU: silu(gate) * up (llama, qwen2, qwen3, phi3)
  LL_ACT_GELU_TANH, // GeGLU: gelu_tanh(gate) * up (gemma3)
};

// Flags of struct ll_arch.flags.
#define LL_ARCH_QK_NORM     (1u << 0) // RMSNorm of each q and k head (attn_q_norm, attn_k_norm: (head_dim)) before RoPE
#define LL_ARCH_POST_NORMS  (1u << 1) // RMSNorm of the attention and FFN outputs before each residual add
                                      // (post_attention_norm, post_ffw_norm: (C))
#define LL_ARCH_EMBD_SCALE  (1u << 2) // token embeddings times sqrt(C)
#define LL_ARCH_Q_PRESCALE  (1u << 3) // q times the attention scale before attention (llama.cpp's ggml_scale on Q;
                                      // attention then scales by 1), rather than the scores after
#define LL_ARCH_FUSED_QKV   (1u << 4) // attn_qkv.weight (qd + 2 kvd rows: q, k, v) where attn_q/k/v are absent
#define LL_ARCH_FUSED_UP    (1u << 5) // ffn_up.weight (2F rows: gate, then up), no ffn_gate.weight
#define LL_ARCH_QKV_BIAS    (1u << 6) // attn_q/k/v.bias may be present (qwen2)
#define LL_ARCH_SWA         (1u << 7) // honours attention.sliding_window (layers chosen by swa_every)
#define LL_ARCH_QK_NORM_ROWS (1u << 8) // with LL_ARCH_QK_NORM: the norms span whole q and k rows ((qd), (kvd): olmoe)
#define LL_ARCH_MOE         (1u << 9) // a mixture-of-experts family: <arch>.expert_count required (moe.c)

struct ll_arch {
  const char *name;     // general.architecture
  int rope_mode;        // LL_ROPE_NORMAL or LL_ROPE_NEOX (ll_backend.h)
  enum ll_act act;      // the FFN's gate activation
  unsigned flags;       // LL_ARCH_*
  int swa_every;        // with sliding_window (and LL_ARCH_SWA): every swa_every-th layer (il % n == n - 1)
                        // attends globally, the others locally (gemma3: 6, unless the GGUF's
                        // attention.sliding_window_pattern says); 1: every layer local
  float rope_base_swa;  // RoPE base of the local layers (rope.freq_base_swa overrides); 0: the global one
  int moe_norm_w;       // mixture of experts (llama.cpp's build_moe_ffn norm_w): 1 the top-k weights renormalized to sum 1
  unsigned train_hooks; // the flags (and activation != SILU: LL_ARCH_TRAIN_ACT) trainer.c differentiates
};
#define LL_ARCH_TRAIN_ACT (1u << 31) // in train_hooks: the trainer has this row's activation

// The row of `name`, or NULL (unknown architecture).
const struct ll_arch *ll_arch_find(const char *name);
// "llama, qwen2, ..." - the supported names, for messages and documentation.
const char *ll_arch_names(void);
// Whether trainer.c can train a model of this family; when not, *what names the missing hook.
int ll_arch_trainable(const struct ll_arch *a, const char **what);

#endif
