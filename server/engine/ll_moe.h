// ll_moe.h - the mixture-of-experts FFN (moe.c): routing on the host, the experts as backend
// products over the tokens routed to each, the weighted sum in llama.cpp's order.
//
// A layer's step (T tokens, E experts, k = n_expert_used):
//   logits (T, E) = xn · routerᵀ                      one product, read back to the host
//   route: softmax, top k (descending), renormalize    ll_moe_route, as build_moe_ffn
//   group: the T·k (token, slot) pairs sorted by expert, so expert e's tokens are one
//          block of rows: one gate+up product, one SwiGLU and one down product per expert
//          over its tokens (a prompt), or only the k routed experts' (decode: T = 1, the
//          others are never read)
//   x[t] += Σ_slot w[t, slot] · y[row(t, slot)]  (+ the shared expert's sigmoid-gated output)
#ifndef LL_MOE_H
#define LL_MOE_H

#include <stdint.h>

#include "ll_backend.h"
#include "ll_model.h"

struct ll_moe_ctx;

// Scratch for batches of up to max_batch tokens of model m on backend be (which must outlive it).
int ll_moe_ctx_new(struct ll_moe_ctx **out, struct ll_backend *be, const struct ll_model *m, int max_batch, char *err, size_t errlen);
void ll_moe_ctx_free(struct ll_moe_ctx *c); // accepts NULL

// Adapters on the experts (ll_lora.h's expert slots: gate_exps, up_exps, down_exps) for one
// layer: expert e's product W_e·x becomes W_e·x + scale · B_e·(A_e·x) for a token whose adapter
// has the slot, as llama.cpp's build_lora_mm_id. The router is never adapted.
struct ll_lora;
struct ll_moe_lora {
  const struct ll_lora *const *tok; // forward: (T) each token's adapter or NULL (a batch of sequences); NULL: `one` for all
  const struct ll_lora *one;        // the adapter of every token (training), when tok is NULL
  int layer;
  // backward: the gradient of an adapter value at p (in one's storage) is added at G + (p - P); G NULL: none
  const float *P;
  float *G;
  // training (NULL: one's own): one's pairs (n_layer, LL_LORA_N_SLOTS) as ll_lora_at lays them
  // out, naming the values where the trainer keeps them (a device's copy of one's storage, P)
  const struct ll_lora_pair *pairs;
  // training: LoRA dropout on the experts' adapters' inputs, as on the dense targets' (PEFT's
  // lora_dropout): each adapter's input rows (gate/up: the token's xn, down: the expert's
  // SwiGLU output) dropped with probability dropout (kept ones scaled by 1/(1 - dropout)) before
  // A; the mask from seed (per layer), the expert slot and the expert, the same in the backward
  // (0: none; serving and evaluation)
  float dropout;
  uint64_t seed;
};

// x (T, C) += the layer's mixture-of-experts FFN of xn (T, C), the normed x. Both backend
// buffers of c's backend. T <= max_batch. lo: adapters on the experts, or NULL.
// keep >= 0 (training, lo NULL or lo->one): the training kernels (no llama.cpp
// row order), and the routes and expert products kept in slot `keep` (grown as needed, about
// T·k·(2·F_exp + C) floats each) for ll_moe_backward's same slot, which then does not compute
// them again; -1: serving.
int ll_moe_forward(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const struct ll_moe_lora *lo, int keep, float *x, const float *xn, int T,
                   char *err, size_t errlen);

// Full-parameter training's gradients of one layer (ll_moe_backward; NULL: LoRA mode, the
// router and experts frozen). Each pointer, where not NULL, is added into:
//   router (E, C); gate, up (E, F_exp, C); down (E, C, F_exp): expert e's block at e·F_exp·C,
//   written only from the rows routed to e.
// The Switch-Transformer load-balancing loss aux = coef · E · Σ_i f_i · P_i (f_i: the fraction
// of the T·k routed (token, slot) pairs that chose expert i, no gradient; P_i: the mean router
// probability of expert i over the T tokens) is differentiated with weight aux_w (its weight in
// the objective: 1 / grad_accum) into the router's logits when coef > 0.
struct ll_moe_grads {
  float *router, *gate, *up, *down;
  float aux_coef, aux_w;
  float *sh_gate, *sh_up, *sh_down, *sh_router; // qwen2moe's shared expert: (F_sh, C) x2, (C, F_sh), (C)
};

// Training: dxn (T, C) += the gradient of the layer's MoE output with respect to xn, given the
// output's gradient dy (T, C); the routing weights differentiated (softmax, renormalization)
// with the chosen experts held. g NULL: the router and the experts frozen (no weight gradients,
// no auxiliary loss); else their gradients and the auxiliary loss's (above), whose value is
// added to the context's sum (ll_moe_aux_take). The forward is the one kept (keep) or recomputed
// (the same routes).
// ops: the backend's members with the training ones filled (the trainer's); on a device backend
// (buffers in device memory) its own axpy, scale, matmul_backward and swiglu_backward
// (LL_EUNSUPPORTED without them): the routing weights' backward runs on the host over the T·k
// dot products dy·ye read back (one-row products), the rest as backend ops. qwen2moe's shared expert: its weights' and its
// gate's gradients into g's sh_* where not NULL.
// lo (NULL: none): adapters on the experts, one for the whole batch (lo->one), differentiated
// into lo->G (dA_e += daxᵀ·x, dB_e += dyᵀ·axs per expert over its rows, axs = scale·x·A_eᵀ, as
// the trainer's adapted products); the forward recomputed with them (the training order of the
// adapter's product: (scale·x·Aᵀ)·Bᵀ, not the serving one).
// keep: the slot ll_moe_forward kept this layer's forward in (used once, when it holds this
// layer and T; else the forward is recomputed).
int ll_moe_backward(struct ll_moe_ctx *c, const struct ll_backend_i *ops, const struct ll_moe_layer *y, const struct ll_moe_grads *g,
                    const struct ll_moe_lora *lo, int keep, float *dxn, const float *xn, const float *dy, int T, char *err, size_t errlen);

// The auxiliary losses (coef · E · Σ f·P, per layer) summed by ll_moe_backward since the last
// call; resets the sum.
double ll_moe_aux_take(struct ll_moe_ctx *c);

// Routing of T tokens from their router logits (T, E) (host memory), llama.cpp's build_moe_ffn
// with the softmax gate: p = softmax(logits) (ggml's exponentials and sums), the k largest in
// descending order (ties: the lower expert), w = p[chosen]; norm_w: w / max(Σw, 2^-14);
// w_scale (not 0 or 1): w *= w_scale. sel (T, k) expert ids, w (T, k); probs (E) scratch.
void ll_moe_route(const float *logits, int T, int E, int k, int norm_w, float w_scale, int32_t *sel, float *w, float *probs);

// Parameter counts from a model's tensor table: *total (every tensor), *expert (the 3-D
// ffn_*_exps tensors), *active (what one token computes with: the expert weights scaled by
// k / E from <arch>.expert_used_count / expert_count, and one row of an untied token
// embedding). *n_expert, *n_used: 0 for a dense model.
struct ll_modelfile;
void ll_moe_param_counts(const struct ll_modelfile *mf, int64_t *total, int64_t *expert, int64_t *active, int *n_expert, int *n_used);

#endif
