// ll_model.h - a loaded model's hyperparameters and weights (any family of ll_arch.h), as the
// engine reads them from the file. The engine's forward pass and the trainer's forward/backward passes both
// read this one picture (the trainer through ll_engine_model()), so the two cannot disagree on
// shapes, tied heads or RoPE parameters.
//
// Weights stay in their file type (struct ll_weight, GGUF layout: N rows of K elements);
// norms and biases are f32. Pointers are owned by the engine (mmapped file or .ckpt memory,
// plus the engine's arena for dequantized 1-D tensors) and live as long as the engine.
#ifndef LL_MODEL_H
#define LL_MODEL_H

#include "ll_arch.h"
#include "ll_backend.h"

// A mixture-of-experts FFN (moe.c): the router ffn_gate_inp picks n_expert_used of n_expert
// experts per token; each expert is a SwiGLU FFN of width F_exp. The file's 3-D tensors
// ffn_{gate,up,down}_exps (ne = {K, N, E}) are held as one 2-D weight per expert, a slice of
// the tensor's bytes (no copy), so every backend call takes an expert as it takes a matrix.
struct ll_moe_layer {
  struct ll_weight router;             // (E, C) ffn_gate_inp
  struct ll_weight *gate, *up, *down;  // (E) each: (F_exp, C), (F_exp, C), (C, F_exp)
  // qwen2moe's shared expert, every token, scaled by sigmoid(xn · sh_router): .data NULL if none
  struct ll_weight sh_gate, sh_up, sh_down; // (F_sh, C), (F_sh, C), (C, F_sh)
  struct ll_weight sh_router;               // (1, C) ffn_gate_inp_shexp
};

struct ll_layer {
  const float *attn_norm, *ffn_norm; // (C)
  const float *bq, *bk, *bv;         // (qd), (kvd), (kvd) or NULL (Qwen2 has them)
  const float *q_norm, *k_norm;      // RMSNorm of q and k after the products (LL_ARCH_QK_NORM): (hd) per head,
                                     // or (qd)/(kvd) whole rows (olmoe); NULL: none
  const float *post_attn_norm, *post_ffn_norm; // (C), or NULL (LL_ARCH_POST_NORMS)
  struct ll_weight wq, wk, wv, wo;   // (qd, C), (kvd, C), (kvd, C), (C, qd); rows of attn_qkv (phi3)
  struct ll_weight gate, up, down;   // (F, C), (F, C), (C, F); gate and up rows of one ffn_up (phi3);
                                     // unused (.data NULL) where moe
  struct ll_moe_layer *moe;          // NULL: the dense FFN above
  int swa;                           // 1: a sliding-window (local) layer: window m.window, RoPE m.rope_swa
};

struct ll_model {
  // hyperparameters
  int n_vocab;  // rows of tok_embd
  int C;        // embedding width
  int L;        // layers
  int H, Hkv;   // query heads, key/value heads (grouped-query: H % Hkv == 0)
  int hd, kvd;  // head dim (attention.key_length, else C / H), key/value width (hd * Hkv)
  int qd;       // query width hd * H (C, except where key_length says otherwise: Gemma 3, Qwen3)
  int F;        // feed-forward width
  float eps;    // RMSNorm epsilon
  // Mixture of experts (n_expert 0: dense). Routing as llama.cpp's build_moe_ffn: softmax over
  // the router's logits, the top n_expert_used, then (moe_norm_w) renormalized to sum 1.
  int n_expert, n_expert_used;
  int F_exp, F_sh;      // expert width; shared expert width (0: none)
  int moe_norm_w;       // 1: the chosen weights divided by their sum (llama/Mixtral, qwen3moe)
  float moe_w_scale;    // expert_weights_scale (0 or 1: none)
  struct ll_rope_params rope;     // the global layers'
  struct ll_rope_params rope_swa; // the sliding-window layers' (the same, but for Gemma 3's base)
  const struct ll_arch *arch;     // the family's row (ll_arch.h)
  float embd_scale;  // token embeddings times this (sqrt(C) for LL_ARCH_EMBD_SCALE, else 1)
  float attn_scale;  // attention's score scale (1/sqrt(hd))
  int window;        // sliding window of the layers with swa (positions pos - window < p <= pos), 0: none
  // weights
  struct ll_weight tok_embd;  // (n_vocab, C)
  struct ll_weight output;    // (n_vocab, C); the same matrix as tok_embd when tied
  int tied;                   // 1: output is tok_embd (no output.weight in the file)
  const float *output_norm;   // (C)
  struct ll_layer *layers;    // (L)
};

// Calls fn on every matrix of m - the token embedding, the output head, then each layer's
// q, k, v, o, gate, up, down - until one returns non-zero, and returns that (0 when all did).
int ll_model_each_matrix(struct ll_model *m, int (*fn)(struct ll_weight *w, void *arg), void *arg);

struct ll_engine;
// The engine's model and backend (valid while the engine is open). The trainer computes on
// the same backend so that its buffers and the engine's weights live in one place.
const struct ll_model *ll_engine_model(const struct ll_engine *e);
struct ll_backend *ll_engine_backend(const struct ll_engine *e);

// Serve other weights of the same shapes (full-parameter training: the trainer's f32 copies,
// so answers follow the training). Called on the thread that drives the engine; m must
// outlive the engine's use of it. LL_EINVAL when the shapes differ.
int ll_engine_use_weights(struct ll_engine *e, const struct ll_model *m);

#endif
