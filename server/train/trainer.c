// trainer.c - training forward/backward of the Llama model, AdamW, run checkpoints (ll_trainer.h).
//
// Forward (per micro-batch of B sequences of S tokens, T = B·S rows; shapes as (rows, cols)):
//   x0 = E[ids] [· sqrt(C): Gemma]                                  // (T, C)
//   per layer l (x = x_l):
//     n1 = rmsnorm(x)·g1;  q = lin_q(n1) (T, qd), k = lin_k(n1), v = lin_v(n1) (T, kvd) [+ biases]
//     [q, k = per-head rmsnorm(q, k): Qwen3, Gemma 3]
//     q, k = rope(q), rope(k) (a local layer's RoPE base where it has one);
//     a = attention(q, k, v) per sequence (saves probabilities)
//     m = x + lin_o(a) [Gemma 3: m = x + rmsnorm(po)·gpa, po = lin_o(a) kept]
//     n2 = rmsnorm(m)·g2;  g = lin_gate(n2), u = lin_up(n2) (T, F)
//     h = silu(g)·u [gelu_tanh(g)·u: GeGLU];  x_{l+1} = m + lin_down(h) [m + rmsnorm(pf)·gpf, pf = lin_down(h) kept]
//   logits = rmsnorm(x_L)·g_out · Wout^T (T, V);  loss = Σ_counted xent(logits, targets)
// where lin(x) = x·W^T + scale · (drop(x)·A^T)·B^T for an adapted target (PEFT: dropout on the
// adapter's input only; scale = alpha/r). We save axs = scale·drop(x)·A^T (T, r): then
//   y = W x + axs·B^T  =>  dB += dy^T·axs,  daxs = dy·B,  dax = scale·daxs,
//                          dA += dax^T·drop(x),  dx += drop(dax·A)   (+ dy·W through the base)
// and the dropout mask is the same call (same seed) in backward, so drop(x) is recomputed, not kept.
//
// Backward mirrors each forward line in reverse (layer_forward / layer_backward side by side).
// Every op is a backend call; the trainer itself only clears and copies buffers (zero/copy),
// the two host-side operations a device backend would turn into fills and copies.
#include "ll_trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ll_ckpt.h"
#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_lora.h"
#include "ll_moe.h"
#include "ll_modelfile.h"
#include "ll_quant.h"

#define MAX_BUFS 64

// One trainable tensor in the parameter vector (names as in checkpoints).
struct ptensor {
  char name[96];
  int64_t off, n;
  int n_dims;
  int64_t ne[3];
};

// One layer's saved activations (all layers, or one with recomputation).
struct lacts {
  float *n1, *q, *k, *v, *att, *a, *m, *n2, *g, *u, *h; // see the forward above (n1, n2, h: all tr->nh, recomputed)
  float *lse;                                           // (B, H, S) with flash-style attention (tr->flash; att is NULL), else NULL
  float *qp, *kp;                                        // q, k before their norms (LL_ARCH_QK_NORM), else NULL
  float *po, *pf;                                        // (T, C) attention and FFN outputs before their post-norms (LL_ARCH_POST_NORMS), else NULL
  float *axs[LL_LORA_N_TARGETS];                         // (T, r) scale·drop(x)·A^T
};

// Full mode: gradient pointers of one layer's weights.
struct lgrad {
  float *attn_norm, *ffn_norm, *wq, *wk, *wv, *wo, *gate, *up, *down;
  float *q_norm, *k_norm; // LL_ARCH_QK_NORM
  float *post_attn_norm, *post_ffn_norm; // LL_ARCH_POST_NORMS
};

// q/k norms (LL_ARCH_QK_NORM): rows and width of q's and k's normed vectors, per head (qwen3,
// qwen3moe: T·H rows of hd) or whole rows (olmoe, LL_ARCH_QK_NORM_ROWS: T rows of qd / kvd).
static void qk_norm_shape(const struct ll_model *m, int T, int *qr, int *qw, int *kr, int *kw) {
  const int whole = m->arch && (m->arch->flags & LL_ARCH_QK_NORM_ROWS), qd = m->qd > 0 ? m->qd : m->C;
  *qr = whole ? T : T * m->H, *qw = whole ? qd : m->hd, *kr = whole ? T : T * m->Hkv, *kw = whole ? m->kvd : m->hd;
}

struct ll_trainer {
  struct ll_trainer_params p;
  char arch[32];
  const struct ll_model *m; // the model computed on (base, or fm in full mode)
  struct ll_model fm;       // full mode: weights pointing into P
  struct ll_layer *flayers;
  struct lgrad *lg;
  struct ll_moe_layer *fmoe;  // full mode, (L): the MoE layers over P
  struct ll_weight *fexp;     // (L, 3, E) their experts' gate, up, down
  struct ll_moe_grads *mg;    // (L) their gradients (ll_moe.h)
  double aux_sum;             // auxiliary losses of the step's micro-batches
  float *g_tok, *g_out, *g_onorm;
  struct ll_modelfile meta; // full mode: the model file (metadata and frozen tensors for checkpoints)
  struct ll_backend *be;
  struct ll_backend_i ops; // the backend's members, training ones filled from the CPU references
  struct ll_moe_ctx *moe;  // mixture-of-experts layers: their FFN's scratch (ll_moe.h)
  struct ll_lora *lora;
  float *P, *G, *M, *V; // parameters, gradients, AdamW moments (n_par each; backend buffers)
  // The parameters' host copy: what the server serves and checkpoints write. P itself where
  // the backend's buffers are host memory; on a device (dev), refreshed from P after each
  // update when an update hook is set (the server), else on demand (host_stale).
  float *Ph;
  int dev, host_stale;
  int flash; // the backend's flash-style attention runs this model: each layer keeps lse (B, H, S), not the probabilities (B, H, S, S)
  struct ll_lora_pair *dpairs; // dev, LoRA: the adapter's pairs over P (the host's are over Ph)
  unsigned fused;              // LoRA: the target groups adapted as one module (phi3: ll_lora_fused)
  struct ll_model fmh;         // dev, full mode: the trained model over Ph (fm is over P)
  struct ll_layer *fhlayers;
  struct ll_moe_layer *fhmoe;  // dev, full mode, (L): fmoe's layers over Ph
  struct ll_weight *fhexp;     // (L, 3, E) their experts
  int64_t n_par, n_decay; // [0, n_decay) gets weight decay
  struct ptensor *pt;
  int n_pt;
  int B, S, T;
  int32_t *pos;           // (T) position of each row in its sequence
  int32_t *ids, *tg;      // (grad_accum·T) one step's inputs and targets
  float **xs;             // (L+1) layer inputs (T, C)
  struct lacts *acts;
  int n_acts;
  float *xf, *logits;     // (T, C), (XENT_ROWS, V): one chunk of rows of the head at a time
  double *xparts;         // (grad_accum, T / XENT_ROWS rounded up) each chunk's loss, summed after the sync
  float *dx, *dn, *da, *dq, *dk, *dv, *dkn, *dh, *dg, *du, *dax, *dxd, *xd; // backward scratch (da, dq: (T, qd); dkn: k before its norm)
  float *nh;              // (T, max(C, F)) every layer's n1, n2 and h, one after another (not saved)
  int train;              // 1: dropout on (training), 0: evaluation
  int geglu;              // the FFN's activation is GeGLU (gelu_tanh), else SwiGLU
  float embd_scale;       // x0 = E[ids] times this (sqrt(C): Gemma; else 1)
  uint64_t seed_now;      // dropout seed base of the current micro-batch
  int64_t step, opt_step, skipped, micro;
  double best_val, last_loss, last_val;
  int inject_nan;
  ll_trainer_update_fn update_fn; // (optional) where the optimizer update runs
  void *update_user;
  void (*yield_fn)(void *user);   // (optional) called before each layer, forward and backward
  void *yield_user;
  struct ll_train_comm comm; // data parallelism (size 1: alone)
  float *gh;              // (n_par) host copy of the gradient for sum_f32 on a device backend
  void *bufs[MAX_BUFS];
  int n_bufs;
  int64_t act_bytes;
};

void ll_trainer_params_init(struct ll_trainer_params *p) {
  memset(p, 0, sizeof *p);
  p->mode = LL_TRAIN_LORA;
  p->arch = "llama";
  p->rank = 16;
  p->alpha = 32.0f;
  p->targets = LL_LORA_ALL_TARGETS;
  p->dropout = 0.0f;
  p->batch = 1;
  p->seq_len = 256;
  p->grad_accum = 1;
  p->steps = 1000;
  p->lr = 2e-4;
  p->warmup = 0;
  p->schedule = LL_SCHED_COSINE;
  p->min_lr_ratio = 0.0;
  p->weight_decay = 0.0;
  p->clip = 1.0;
  p->beta1 = 0.9, p->beta2 = 0.999, p->adam_eps = 1e-8;
  p->seed = 42;
  p->moe_aux_coef = 0.01;
}

const char *ll_train_schedule_name(int s) {
  return s == LL_SCHED_COSINE ? "cosine" : s == LL_SCHED_LINEAR ? "linear" : s == LL_SCHED_CONSTANT ? "constant" : "?";
}

// ---------------------------------------------------------------- helpers

// "device memory" where the backend's buffers are a device's, for the messages.
static const char *mem_of(const struct ll_trainer *tr) { return tr->dev ? "device memory" : "memory"; }

static float *balloc(struct ll_trainer *tr, int64_t n_floats) {
  if (tr->n_bufs >= MAX_BUFS || n_floats <= 0) return NULL;
  float *p = ll_backend_alloc(tr->be, (size_t)n_floats * sizeof(float));
  if (p) tr->bufs[tr->n_bufs++] = p;
  return p;
}

// Buffer contents through the backend (its buffers may be device memory): a fill and a copy.
static int zero(struct ll_trainer *tr, float *p, int64_t n) { return ll_backend_zero(tr->be, p, (size_t)n * sizeof *p); }
static int copy(struct ll_trainer *tr, float *dst, const float *src, int64_t n) {
  return ll_backend_copy(tr->be, dst, src, (size_t)n * sizeof *dst);
}

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

#define XENT_ROWS 64 // rows of the output head and the loss per chunk (forward_backward)

#define BK(call, what)                                                                                                       \
  do {                                                                                                                       \
    int rc_ = (call);                                                                                                        \
    if (rc_) return ll_errf(err, errlen, rc_, "trainer: backend %s failed: %s", what, ll_strerror(rc_));                     \
  } while (0)

static const struct ll_lora_pair *pair_of(const struct ll_trainer *tr, int l, int t) {
  if (!tr->lora) return NULL;
  const struct ll_lora_pair *pr = tr->dpairs ? &tr->dpairs[l * LL_LORA_N_SLOTS + t] : ll_lora_at(tr->lora, l, t);
  return pr->a.data ? pr : NULL;
}
static float *grad_of(const struct ll_trainer *tr, const void *param) { return param ? tr->G + ((const float *)param - tr->P) : NULL; }
// Layer l's view of the adapter for moe.c: its expert slots (on a device: dpairs name them),
// where their gradients go, and their dropout (training only) with the layer's mask seed.
static struct ll_moe_lora moe_lora(const struct ll_trainer *tr, int l) {
  const int drop = tr->train && tr->p.dropout > 0;
  return (struct ll_moe_lora){NULL, tr->lora, l, tr->P, tr->G, tr->dpairs, drop ? tr->p.dropout : 0.0f,
                              drop ? tr->seed_now ^ mix64(((uint64_t)1 << 40) | (uint64_t)l) : 0};
}

// ---------------------------------------------------------------- adapted linear layer

// y (T, out) = x·W^T [+= when acc] + scale·drop(x)·A^T·B^T;  axs (T, r) saved for backward.
static int lin_forward(struct ll_trainer *tr, float *y, const float *x, const struct ll_weight *w, int l, int t, float *axs, int acc,
                       char *err, size_t errlen) {
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const int T = tr->T;
  const struct ll_lora_pair *pr = pair_of(tr, l, t);
  if (!pr) {
    BK(B->matmul(be, y, x, w, T, acc), "matmul");
    return 0;
  }
  const float *xd = x;
  if (tr->train && tr->p.dropout > 0) {
    BK(B->dropout(be, tr->xd, x, tr->p.dropout, tr->seed_now ^ mix64((uint64_t)(l * LL_LORA_N_TARGETS + t)), (int64_t)T * w->k), "dropout");
    xd = tr->xd;
  }
  if (B->matmul_lora) { // a device's fast tier: the base product and the LoRA term in one pass
    const int rc = B->matmul_lora(be, y, axs, x, xd, w, &pr->a, &pr->b, ll_lora_scale(tr->lora), T, acc);
    if (rc != LL_EUNSUPPORTED) {
      BK(rc, "matmul_lora");
      return 0;
    }
  }
  BK(B->matmul(be, y, x, w, T, acc), "matmul");
  BK(B->matmul(be, axs, xd, &pr->a, T, 0), "matmul lora_a");                 // (T, r)
  BK(B->scale(be, axs, ll_lora_scale(tr->lora), (int64_t)T * tr->lora->rank), "scale");
  BK(B->matmul(be, y, axs, &pr->b, T, 1), "matmul lora_b");                  // y += axs·B^T
  return 0;
}

// Given dy (T, out): dx (T, in) += dy·W + drop(scale·(dy·B)·A); dA, dB (and dW in full mode) +=.
static int lin_backward(struct ll_trainer *tr, float *dx, const float *dy, const float *x, const struct ll_weight *w, float *dw, int l, int t,
                        const float *axs, char *err, size_t errlen) {
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const int T = tr->T;
  BK(B->matmul_backward(be, dx, dw, dy, x, w, T), "matmul_backward");
  const struct ll_lora_pair *pr = pair_of(tr, l, t);
  if (!pr) return 0;
  const int r = tr->lora->rank;
  BK(zero(tr, tr->dax, (int64_t)T * r), "zero");
  BK(B->matmul_backward(be, tr->dax, grad_of(tr, pr->b.data), dy, axs, &pr->b, T), "matmul_backward lora_b"); // daxs, dB
  BK(B->scale(be, tr->dax, ll_lora_scale(tr->lora), (int64_t)T * r), "scale");                                 // dax
  const int64_t nin = (int64_t)T * w->k;
  if (tr->train && tr->p.dropout > 0) {
    const uint64_t seed = tr->seed_now ^ mix64((uint64_t)(l * LL_LORA_N_TARGETS + t));
    BK(B->dropout(be, tr->xd, x, tr->p.dropout, seed, nin), "dropout"); // drop(x) again: the same mask
    BK(zero(tr, tr->dxd, nin), "zero");
    BK(B->matmul_backward(be, tr->dxd, grad_of(tr, pr->a.data), tr->dax, tr->xd, &pr->a, T), "matmul_backward lora_a");
    BK(B->dropout(be, tr->dxd, tr->dxd, tr->p.dropout, seed, nin), "dropout backward");
    BK(B->axpy(be, dx, tr->dxd, 1.0f, nin), "axpy");
  } else {
    BK(B->matmul_backward(be, dx, grad_of(tr, pr->a.data), tr->dax, x, &pr->a, T), "matmul_backward lora_a");
  }
  return 0;
}

// ---------------------------------------------------------------- one layer, forward and backward

static int add_bias(struct ll_trainer *tr, float *y, const float *bias, int n, char *err, size_t errlen) {
  for (int t = 0; bias && t < tr->T; t++) BK(tr->ops.add(tr->be, y + (size_t)t * n, y + (size_t)t * n, bias, n), "add");
  return 0;
}

// h (n) = act(g)·u: SwiGLU, or GeGLU (gelu_tanh; the backend's, with ggml_math llama.cpp's f16 table)
static int act_forward(struct ll_trainer *tr, float *h, const float *g, const float *u, int64_t n) {
  return tr->geglu ? tr->ops.geglu(tr->be, h, g, u, n) : tr->ops.swiglu(tr->be, h, g, u, n);
}

// Attention's score scale: the model's (Gemma's q prescale folded in: (s·q)·k = s·(q·k)).
static float attn_scale_of(const struct ll_model *m) { return m->attn_scale > 0 ? m->attn_scale : 1.0f / sqrtf((float)m->hd); }

static int layer_forward(struct ll_trainer *tr, int l, const float *x, float *xout, struct lacts *a, char *err, size_t errlen) {
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const struct ll_model *m = tr->m;
  const struct ll_layer *y = &m->layers[l];
  const int T = tr->T, S = tr->S, C = m->C, kvd = m->kvd, qd = m->qd > 0 ? m->qd : m->C;
  const float scale = attn_scale_of(m);
  const struct ll_rope_params *rope = y->swa ? &m->rope_swa : &m->rope; // local layers: their own base
  const int window = y->swa && m->window > 0 && m->window < S ? m->window : 0; // a window shorter than the sequence masks
  int rc;
  BK(B->rmsnorm(be, a->n1, x, y->attn_norm, T, C, m->eps), "rmsnorm");                       // n1 (T, C)
  if ((rc = lin_forward(tr, a->q, a->n1, &y->wq, l, LL_LORA_Q, a->axs[LL_LORA_Q], 0, err, errlen))) return rc; // (T, qd)
  if ((rc = lin_forward(tr, a->k, a->n1, &y->wk, l, LL_LORA_K, a->axs[LL_LORA_K], 0, err, errlen))) return rc; // (T, kvd)
  if ((rc = lin_forward(tr, a->v, a->n1, &y->wv, l, LL_LORA_V, a->axs[LL_LORA_V], 0, err, errlen))) return rc; // (T, kvd)
  if ((rc = add_bias(tr, a->q, y->bq, qd, err, errlen)) || (rc = add_bias(tr, a->k, y->bk, kvd, err, errlen)) ||
      (rc = add_bias(tr, a->v, y->bv, kvd, err, errlen)))
    return rc;
  if (y->q_norm) { // q, k = rmsnorm(q, k) per head (Qwen3, qwen3moe, Gemma 3) or row (olmoe); their inputs kept for the backward
    BK(copy(tr, a->qp, a->q, (int64_t)T * qd), "copy");
    BK(copy(tr, a->kp, a->k, (int64_t)T * kvd), "copy");
    int qr, qw, kr, kw;
    qk_norm_shape(m, T, &qr, &qw, &kr, &kw);
    BK(B->rmsnorm(be, a->q, a->qp, y->q_norm, qr, qw, m->eps), "rmsnorm q");
    BK(B->rmsnorm(be, a->k, a->kp, y->k_norm, kr, kw, m->eps), "rmsnorm k");
  }
  BK(B->rope(be, a->q, tr->pos, T, m->H, m->hd, rope), "rope q");
  BK(B->rope(be, a->k, tr->pos, T, m->Hkv, m->hd, rope), "rope k");
  for (int b = 0; b < tr->B; b++) { // per sequence: a (S, qd), probabilities (H, S, S) (0 outside a window: the backward needs no window)
    float *ao = a->a + (size_t)b * S * qd;
    const float *q = a->q + (size_t)b * S * qd, *k = a->k + (size_t)b * S * kvd, *v = a->v + (size_t)b * S * kvd;
    if (tr->flash) { // or only the rows' logsumexps (H, S)
      BK(B->attention_train_flash(be, ao, a->lse + (size_t)b * m->H * S, q, k, v, S, m->H, m->Hkv, m->hd, scale, window), "attention_train_flash");
      continue;
    }
    float *att = a->att + (size_t)b * m->H * S * S;
    if (window) BK(B->attention_train_swa(be, ao, att, q, k, v, S, m->H, m->Hkv, m->hd, scale, window), "attention_train_swa");
    else BK(B->attention_train(be, ao, att, q, k, v, S, m->H, m->Hkv, m->hd, scale), "attention_train");
  }
  if (y->post_attn_norm) { // m = x + rmsnorm(po), po = o(a); the norm's output in n2 (free until n2 below)
    if ((rc = lin_forward(tr, a->po, a->a, &y->wo, l, LL_LORA_O, a->axs[LL_LORA_O], 0, err, errlen))) return rc; // po (T, C)
    BK(B->rmsnorm(be, a->n2, a->po, y->post_attn_norm, T, C, m->eps), "rmsnorm post-attention");
    BK(B->add(be, a->m, x, a->n2, (int64_t)T * C), "add");
  } else {
    BK(copy(tr, a->m, x, (int64_t)T * C), "copy");
    if ((rc = lin_forward(tr, a->m, a->a, &y->wo, l, LL_LORA_O, a->axs[LL_LORA_O], 1, err, errlen))) return rc; // m = x + o(a)
  }
  BK(B->rmsnorm(be, a->n2, a->m, y->ffn_norm, T, C, m->eps), "rmsnorm");                     // n2 (T, C)
  if (y->moe) { // x' = m + moe(n2)
    BK(copy(tr, xout, a->m, (int64_t)T * C), "copy");
    const struct ll_moe_lora lo = moe_lora(tr, l); // the adapter's expert slots, if any
    // the training kernels, the products kept per layer (one slot when layers are recomputed)
    // for the backward; evaluations too, so a loss is the same whether a backward follows or not
    return ll_moe_forward(tr->moe, y->moe, &lo, tr->n_acts > 1 ? l : 0, xout, a->n2, T, err, errlen);
  }
  if ((rc = lin_forward(tr, a->g, a->n2, &y->gate, l, LL_LORA_GATE, a->axs[LL_LORA_GATE], 0, err, errlen))) return rc; // (T, F)
  if ((rc = lin_forward(tr, a->u, a->n2, &y->up, l, LL_LORA_UP, a->axs[LL_LORA_UP], 0, err, errlen))) return rc;       // (T, F)
  BK(act_forward(tr, a->h, a->g, a->u, (int64_t)T * m->F), tr->geglu ? "geglu" : "swiglu");  // h (T, F)
  if (y->post_ffn_norm) { // x' = m + rmsnorm(pf), pf = down(h); the norm's output in h's buffer (h is used up)
    if ((rc = lin_forward(tr, a->pf, a->h, &y->down, l, LL_LORA_DOWN, a->axs[LL_LORA_DOWN], 0, err, errlen))) return rc; // pf (T, C)
    BK(B->rmsnorm(be, a->h, a->pf, y->post_ffn_norm, T, C, m->eps), "rmsnorm post-ffn");
    BK(B->add(be, xout, a->m, a->h, (int64_t)T * C), "add");
    return 0;
  }
  BK(copy(tr, xout, a->m, (int64_t)T * C), "copy");
  return lin_forward(tr, xout, a->h, &y->down, l, LL_LORA_DOWN, a->axs[LL_LORA_DOWN], 1, err, errlen); // x' = m + down(h)
}

// dx (T, C): in, the gradient of the layer's output; out, of its input x.
static int layer_backward(struct ll_trainer *tr, int l, const float *x, struct lacts *a, float *dx, char *err, size_t errlen) {
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const struct ll_model *m = tr->m;
  const struct ll_layer *y = &m->layers[l];
  const struct lgrad *gw = tr->lg ? &tr->lg[l] : &(struct lgrad){0};
  const int T = tr->T, S = tr->S, C = m->C, kvd = m->kvd, F = m->F, qd = m->qd > 0 ? m->qd : m->C;
  const float scale = attn_scale_of(m);
  const struct ll_rope_params *rope = y->swa ? &m->rope_swa : &m->rope;
  int rc;
  // n1, n2 and h are not saved (they share one buffer, tr->nh): each is recomputed from what is
  // saved (x, m, g and u) with the forward's kernel, so it has the same bits, just before its use.
  if (y->moe) { // x' = m + moe(n2): dn = moe'(n2)ᵀ dx
    BK(B->rmsnorm(be, a->n2, a->m, y->ffn_norm, T, C, m->eps), "rmsnorm");
    BK(zero(tr, tr->dn, (int64_t)T * C), "zero");
    const struct ll_moe_lora lo = moe_lora(tr, l);
    if ((rc = ll_moe_backward(tr->moe, B, y->moe, tr->mg ? &tr->mg[l] : NULL, &lo, tr->n_acts > 1 ? l : 0, tr->dn, a->n2, dx, T, err, errlen))) return rc;
    goto ffn_norm;
  }
  // x' = m + down(h)   [Gemma 3: x' = m + rmsnorm(pf), pf = down(h): dpf in dn (free until the gate/up below)]
  const float *dd = dx;
  if (y->post_ffn_norm) {
    BK(zero(tr, tr->dn, (int64_t)T * C), "zero");
    BK(B->rmsnorm_backward(be, tr->dn, gw->post_ffn_norm, dx, a->pf, y->post_ffn_norm, T, C, m->eps), "rmsnorm_backward post-ffn");
    dd = tr->dn;
  }
  BK(act_forward(tr, a->h, a->g, a->u, (int64_t)T * F), tr->geglu ? "geglu" : "swiglu");
  BK(zero(tr, tr->dh, (int64_t)T * F), "zero");
  if ((rc = lin_backward(tr, tr->dh, dd, a->h, &y->down, gw->down, l, LL_LORA_DOWN, a->axs[LL_LORA_DOWN], err, errlen))) return rc;
  // h = silu(g)·u   [gelu_tanh(g)·u]
  if (tr->geglu) BK(B->geglu_backward(be, tr->dg, tr->du, tr->dh, a->g, a->u, (int64_t)T * F), "geglu_backward");
  else BK(B->swiglu_backward(be, tr->dg, tr->du, tr->dh, a->g, a->u, (int64_t)T * F), "swiglu_backward");
  // g, u = gate(n2), up(n2)
  BK(B->rmsnorm(be, a->n2, a->m, y->ffn_norm, T, C, m->eps), "rmsnorm");
  BK(zero(tr, tr->dn, (int64_t)T * C), "zero");
  if ((rc = lin_backward(tr, tr->dn, tr->dg, a->n2, &y->gate, gw->gate, l, LL_LORA_GATE, a->axs[LL_LORA_GATE], err, errlen)) ||
      (rc = lin_backward(tr, tr->dn, tr->du, a->n2, &y->up, gw->up, l, LL_LORA_UP, a->axs[LL_LORA_UP], err, errlen)))
    return rc;
ffn_norm: // n2 = rmsnorm(m): dx becomes dm (the residual path plus the norm's)
  BK(B->rmsnorm_backward(be, dx, gw->ffn_norm, tr->dn, a->m, y->ffn_norm, T, C, m->eps), "rmsnorm_backward");
  // m = x + o(a)   [Gemma 3: m = x + rmsnorm(po), po = o(a): dpo in dn (free until q, k, v below)]
  const float *dpo = dx;
  if (y->post_attn_norm) {
    BK(zero(tr, tr->dn, (int64_t)T * C), "zero");
    BK(B->rmsnorm_backward(be, tr->dn, gw->post_attn_norm, dx, a->po, y->post_attn_norm, T, C, m->eps), "rmsnorm_backward post-attention");
    dpo = tr->dn;
  }
  BK(zero(tr, tr->da, (int64_t)T * qd), "zero");
  if ((rc = lin_backward(tr, tr->da, dpo, a->a, &y->wo, gw->wo, l, LL_LORA_O, a->axs[LL_LORA_O], err, errlen))) return rc;
  // a = attention(q, k, v) per sequence
  const int window = y->swa && m->window > 0 && m->window < S ? m->window : 0; // as the forward's
  for (int b = 0; b < tr->B && tr->flash; b++) // the probabilities recomputed from q, k and the rows' logsumexps
    BK(B->attention_backward_flash(be, tr->dq + (size_t)b * S * qd, tr->dk + (size_t)b * S * kvd, tr->dv + (size_t)b * S * kvd,
                                   tr->da + (size_t)b * S * qd, a->q + (size_t)b * S * qd, a->k + (size_t)b * S * kvd, a->v + (size_t)b * S * kvd,
                                   a->a + (size_t)b * S * qd, a->lse + (size_t)b * m->H * S, S, m->H, m->Hkv, m->hd, scale, window),
       "attention_backward_flash");
  for (int b = 0; b < tr->B && !tr->flash; b++)
    BK(B->attention_backward(be, tr->dq + (size_t)b * S * qd, tr->dk + (size_t)b * S * kvd, tr->dv + (size_t)b * S * kvd, tr->da + (size_t)b * S * qd,
                             a->q + (size_t)b * S * qd, a->k + (size_t)b * S * kvd, a->v + (size_t)b * S * kvd, a->att + (size_t)b * m->H * S * S, S,
                             m->H, m->Hkv, m->hd, scale),
       "attention_backward");
  // q, k = rope(q), rope(k)
  BK(B->rope_backward(be, tr->dq, tr->pos, T, m->H, m->hd, rope), "rope_backward q");
  BK(B->rope_backward(be, tr->dk, tr->pos, T, m->Hkv, m->hd, rope), "rope_backward k");
  float *dq = tr->dq, *dk = tr->dk;
  if (y->q_norm) { // through the q/k norms (their weights' gradients in full mode) into da, dkn (free now)
    int qr, qw, kr, kw;
    qk_norm_shape(m, T, &qr, &qw, &kr, &kw);
    BK(zero(tr, tr->da, (int64_t)T * qd), "zero");
    BK(zero(tr, tr->dkn, (int64_t)T * kvd), "zero");
    BK(B->rmsnorm_backward(be, tr->da, gw->q_norm, tr->dq, a->qp, y->q_norm, qr, qw, m->eps), "rmsnorm_backward q");
    BK(B->rmsnorm_backward(be, tr->dkn, gw->k_norm, tr->dk, a->kp, y->k_norm, kr, kw, m->eps), "rmsnorm_backward k");
    dq = tr->da, dk = tr->dkn;
  }
  // q, k, v = lin(n1)   (biases are frozen: no gradient)
  BK(B->rmsnorm(be, a->n1, x, y->attn_norm, T, C, m->eps), "rmsnorm");
  BK(zero(tr, tr->dn, (int64_t)T * C), "zero");
  if ((rc = lin_backward(tr, tr->dn, dq, a->n1, &y->wq, gw->wq, l, LL_LORA_Q, a->axs[LL_LORA_Q], err, errlen)) ||
      (rc = lin_backward(tr, tr->dn, dk, a->n1, &y->wk, gw->wk, l, LL_LORA_K, a->axs[LL_LORA_K], err, errlen)) ||
      (rc = lin_backward(tr, tr->dn, tr->dv, a->n1, &y->wv, gw->wv, l, LL_LORA_V, a->axs[LL_LORA_V], err, errlen)))
    return rc;
  // n1 = rmsnorm(x): dx becomes the gradient of the layer's input
  BK(B->rmsnorm_backward(be, dx, gw->attn_norm, tr->dn, x, y->attn_norm, T, C, m->eps), "rmsnorm_backward");
  return 0;
}

// ---------------------------------------------------------------- whole model

static int n_chunks(const struct ll_trainer *tr) { return (tr->T + XENT_ROWS - 1) / XENT_ROWS; }

// A micro-batch's loss from its chunks' parts, in order (after the backend's sync).
static double parts_sum(const double *parts, int n) {
  double loss = 0;
  for (int i = 0; i < n; i++) loss += parts[i];
  return loss;
}

// Forward (and with grad, backward) of one micro-batch, queued: each chunk's loss goes to
// parts[0 .. n_chunks), which a device backend may fill only at its next sync (ll_backend.h).
static int fb(struct ll_trainer *tr, const int32_t *ids, const int32_t *targets, int n_seq, int grad, float grad_scale, double *parts,
              int64_t *n_counted, char *err, size_t errlen);

int ll_trainer_forward_backward(struct ll_trainer *tr, const int32_t *ids, const int32_t *targets, int n_seq, int grad, float grad_scale,
                                double *loss_sum, int64_t *n_counted, char *err, size_t errlen) {
  int rc = fb(tr, ids, targets, n_seq, grad, grad_scale, tr->xparts, n_counted, err, errlen);
  if (rc) return rc;
  BK(ll_backend_sync(tr->be), "sync");
  *loss_sum = parts_sum(tr->xparts, n_chunks(tr));
  return 0;
}

static int fb(struct ll_trainer *tr, const int32_t *ids, const int32_t *targets, int n_seq, int grad, float grad_scale, double *parts,
              int64_t *n_counted, char *err, size_t errlen) {
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const struct ll_model *m = tr->m;
  const int S = tr->S, C = m->C, L = m->L;
  if (n_seq < 1 || n_seq > tr->B) return ll_errf(err, errlen, LL_EINVAL, "trainer: %d sequences, the batch holds 1..%d", n_seq, tr->B);
  // Rows past n_seq (a short last validation batch) repeat the first sequence with no targets.
  int32_t *id = tr->ids, *tg = tr->tg; // first T entries: this micro-batch's copy
  if (ids != id) memcpy(id, ids, (size_t)n_seq * S * sizeof *id);
  if (targets != tg) memcpy(tg, targets, (size_t)n_seq * S * sizeof *tg);
  for (int b = n_seq; b < tr->B; b++) {
    memcpy(id + (size_t)b * S, ids, (size_t)S * sizeof *id);
    for (int t = 0; t < S; t++) tg[(size_t)b * S + t] = -1;
  }
  int64_t cnt = 0;
  for (int i = 0; i < tr->T; i++) {
    if (id[i] < 0 || id[i] >= m->n_vocab) return ll_errf(err, errlen, LL_EINVAL, "trainer: token id %d out of range (vocabulary %d)", id[i], m->n_vocab);
    if (tg[i] >= m->n_vocab) return ll_errf(err, errlen, LL_EINVAL, "trainer: target id %d out of range (vocabulary %d)", tg[i], m->n_vocab);
    cnt += tg[i] >= 0;
  }
  const int saved_train = tr->train;
  if (!grad) tr->train = 0;
  int rc = 0;
  // forward
  BK(B->get_rows(be, tr->xs[0], &m->tok_embd, id, tr->T), "get_rows"); // x0 (T, C)
  if (tr->embd_scale != 1.0f) BK(B->scale(be, tr->xs[0], tr->embd_scale, (int64_t)tr->T * C), "scale"); // Gemma: x0 *= sqrt(C)
  for (int l = 0; l < L && !rc; l++) {
    if (tr->yield_fn) tr->yield_fn(tr->yield_user);
    rc = layer_forward(tr, l, tr->xs[l], tr->xs[l + 1], &tr->acts[tr->n_acts > 1 ? l : 0], err, errlen);
  }
  tr->train = saved_train;
  if (rc) return rc;
  BK(B->rmsnorm(be, tr->xf, tr->xs[L], m->output_norm, tr->T, C, m->eps), "rmsnorm");     // xf (T, C)
  // The head, the loss and the head's backward, XENT_ROWS rows at a time: the whole (T, V)
  // logits would be the largest buffer (48 MiB at T = 256, V = 49152), a chunk's is 1/4 of it.
  // Each row's logits, gradient and dn row are the same whatever the chunk (row-wise ops).
  //   logits_c = xf_c·Wout^T (Tc, V);  dlogits_c in place;  dn_c = dlogits_c·Wout (Tc, C)
  // Each chunk's loss may arrive only with the sync (ll_backend.h): summed by the caller, in
  // order, after it, so a training step waits for the device once, at its end.
  if (grad) BK(zero(tr, tr->dn, (int64_t)tr->T * C), "zero");
  for (int t0 = 0; t0 < tr->T; t0 += XENT_ROWS) {
    const int nt = tr->T - t0 < XENT_ROWS ? tr->T - t0 : XENT_ROWS;
    const float *xf = tr->xf + (size_t)t0 * C;
    double *part = &parts[t0 / XENT_ROWS];
    *part = 0;
    BK(B->matmul(be, tr->logits, xf, &m->output, nt, 0), "matmul output"); // logits (Tc, V)
    BK(B->softmax_xent(be, part, grad ? tr->logits : NULL, tr->logits, tg + t0, nt, m->n_vocab, grad_scale), "softmax_xent");
    if (grad) BK(B->matmul_backward(be, tr->dn + (size_t)t0 * C, tr->g_out, tr->logits, xf, &m->output, nt), "matmul_backward output");
  }
  if (n_counted) *n_counted = cnt;
  if (!grad) return 0;
  // backward: xf = rmsnorm(x_L)
  BK(zero(tr, tr->dx, (int64_t)tr->T * C), "zero");
  BK(B->rmsnorm_backward(be, tr->dx, tr->g_onorm, tr->dn, tr->xs[L], m->output_norm, tr->T, C, m->eps), "rmsnorm_backward");
  for (int l = L - 1; l >= 0; l--) {
    if (tr->yield_fn) tr->yield_fn(tr->yield_user);
    struct lacts *a = &tr->acts[tr->n_acts > 1 ? l : 0];
    // Recomputation: the layer's activations again from its saved input (same dropout masks);
    // its output goes to xf, which the backward no longer needs.
    if (tr->n_acts == 1 && (rc = layer_forward(tr, l, tr->xs[l], tr->xf, a, err, errlen))) return rc;
    if ((rc = layer_backward(tr, l, tr->xs[l], a, tr->dx, err, errlen))) return rc;
  }
  if (tr->g_tok) { // x0 = E[ids] (· embd_scale)
    if (tr->embd_scale != 1.0f) BK(B->scale(be, tr->dx, tr->embd_scale, (int64_t)tr->T * C), "scale");
    BK(B->get_rows_backward(be, tr->g_tok, tr->dx, id, tr->T, C), "get_rows_backward");
  }
  if (tr->moe) tr->aux_sum += ll_moe_aux_take(tr->moe);
  return 0;
}

// ---------------------------------------------------------------- creation

static int64_t act_floats(const struct ll_model *m, const struct ll_trainer_params *p, int flash, int64_t *per_layer, int64_t *fixed) {
  const int64_t T = (int64_t)p->batch * p->seq_len, C = m->C, kvd = m->kvd, F = m->F, S = p->seq_len, qd = m->qd > 0 ? m->qd : m->C;
  const int qkn = m->layers && m->L > 0 && m->layers[0].q_norm, pn = m->layers && m->L > 0 && m->layers[0].post_attn_norm;
  int64_t r = p->mode == LL_TRAIN_LORA ? p->rank : 0, nt = 0;
  for (int t = 0; t < LL_LORA_N_TARGETS; t++) nt += p->mode == LL_TRAIN_LORA && ((p->targets >> t) & 1);
  // saved per layer: q, a (T, qd), m (T, C), k, v (T, kvd), g, u (T, F), probabilities (B, H, S, S)
  // or with flash-style attention the rows' logsumexps (B, H, S), LoRA x·A^T; with q/k norms q
  // and k before them too
  *per_layer = T * (2 * qd + C + 2 * kvd + 2 * F) + (int64_t)p->batch * m->H * S * (flash ? 1 : S) + nt * T * r + (qkn ? T * (qd + kvd) : 0) + (pn ? 2 * T * C : 0); // + po, pf
  if (m->n_expert > 0) { // moe.c's kept forward: routes, g, u, ye of the T·k routed rows (and the experts' adapters' x·Aᵀ)
    const int64_t Tk = T * m->n_expert_used;
    int nx = 0;
    for (int t = LL_LORA_GATE_EXPS; t <= LL_LORA_DOWN_EXPS; t++) nx += p->mode == LL_TRAIN_LORA && ((p->targets >> t) & 1);
    *per_layer += T * m->n_expert + Tk * (1 + 2 * (int64_t)m->F_exp + C + (nx ? 3 * r : 0));
  }
  int64_t maxin = C > F ? C : F;
  maxin = maxin > qd ? maxin : qd;
  *fixed = T * C * (int64_t)(m->L + 1) /* xs */ + T * C /* xf */ + (T < XENT_ROWS ? T : XENT_ROWS) * m->n_vocab /* logits */ +
           T * (2 * C + 2 * qd + 3 * kvd + 3 * F) /* dx dn da dq dk dv dkn dh dg du */ + T * (r > 0 ? r : 1) + 3 * T * maxin /* dxd xd nh */;
  return *fixed + *per_layer * (p->recompute ? 1 : m->L);
}

static int64_t weight_bytes(const struct ll_weight *w) { return (int64_t)ll_row_size(w->type, w->k) * w->n; }

static int64_t model_bytes(const struct ll_model *m) {
  int64_t b = weight_bytes(&m->tok_embd) + (m->tied ? 0 : weight_bytes(&m->output)) + (int64_t)m->C * 4;
  for (int l = 0; l < m->L; l++) {
    const struct ll_layer *y = &m->layers[l];
    b += weight_bytes(&y->wq) + weight_bytes(&y->wk) + weight_bytes(&y->wv) + weight_bytes(&y->wo) + weight_bytes(&y->gate) +
         weight_bytes(&y->up) + weight_bytes(&y->down) + 2 * (int64_t)m->C * 4;
    const struct ll_moe_layer *x = y->moe; // a mixture of experts: the router, every expert, the shared one
    for (int e = 0; x && e < m->n_expert; e++) b += weight_bytes(&x->gate[e]) + weight_bytes(&x->up[e]) + weight_bytes(&x->down[e]);
    if (x)
      b += weight_bytes(&x->router) + (x->sh_gate.data ? weight_bytes(&x->sh_gate) + weight_bytes(&x->sh_up) + weight_bytes(&x->sh_down) +
                                                             weight_bytes(&x->sh_router)
                                                       : 0);
  }
  return b;
}

static int64_t n_trainable(const struct ll_model *m, const struct ll_trainer_params *p) {
  int64_t n = 0;
  if (p->mode == LL_TRAIN_LORA) {
    const int64_t qd = m->qd > 0 ? m->qd : m->C;
    const int64_t in[LL_LORA_N_TARGETS] = {m->C, m->C, m->C, qd, m->C, m->C, m->F};
    const int64_t out[LL_LORA_N_TARGETS] = {qd, m->kvd, m->kvd, m->C, m->F, m->F, m->C};
    for (int t = 0; t < LL_LORA_N_TARGETS; t++)
      if ((p->targets >> t) & 1) n += (int64_t)p->rank * (in[t] + out[t]);
    for (int t = LL_LORA_GATE_EXPS; t <= LL_LORA_DOWN_EXPS; t++) // one pair per expert: in + out = C + F_exp for each
      if ((p->targets >> t) & 1) n += (int64_t)p->rank * (m->C + m->F_exp) * m->n_expert;
    for (int t = LL_LORA_GATE_SHEXP; t <= LL_LORA_DOWN_SHEXP; t++) // the shared expert's: in + out = C + F_sh
      if ((p->targets >> t) & 1) n += (int64_t)p->rank * (m->C + m->F_sh);
    return n * m->L;
  }
  n = (int64_t)m->n_vocab * m->C * (m->tied ? 1 : 2) + m->C;
  int64_t ffn = m->n_expert > 0 ? (int64_t)m->n_expert * (m->C + 3 * (int64_t)m->F_exp * m->C) : 3 * (int64_t)m->F * m->C; // router + experts
  if (m->n_expert > 0 && m->F_sh > 0) ffn += 3 * (int64_t)m->F_sh * m->C + m->C; // qwen2moe's shared expert and its gate
  int qr = 0, qw = 0, kr = 0, kw = 0;
  if (m->L > 0 && m->layers && m->layers[0].q_norm) qk_norm_shape(m, 1, &qr, &qw, &kr, &kw);
  const int64_t qd = m->qd > 0 ? m->qd : m->C, pn = m->L > 0 && m->layers && m->layers[0].post_attn_norm ? 2 * (int64_t)m->C : 0; // Gemma's post-norms
  return n + (int64_t)m->L * (2 * m->C + 2 * qd * m->C + 2 * (int64_t)m->kvd * m->C + ffn + qw + kw + pn);
}

int ll_trainer_cpu_backend(struct ll_backend **out, const struct ll_backend *like, int n_threads, char *err, size_t errlen) {
  const int rc = ll_backend_cpu_create(out, n_threads, err, errlen);
  if (rc) return rc;
  (*out)->ggml_math = like->ggml_math;
  (*out)->batch_invariant = 0;
  (*out)->train_sgemm = 1;
  return 0;
}

void ll_trainer_estimate(const struct ll_model *m, const struct ll_trainer_params *p, struct ll_train_memory *mem) {
  int64_t pl, fx;
  const int64_t np = n_trainable(m, p);
  mem->weights = model_bytes(m);
  mem->adapters = np * 4;
  mem->grads = np * 4;
  mem->optimizer = np * 8;
  mem->activations = act_floats(m, p, 0, &pl, &fx) * 4; // an upper bound: without flash-style attention
}

void ll_trainer_memory(const struct ll_trainer *tr, struct ll_train_memory *mem) {
  ll_trainer_estimate(tr->m, &tr->p, mem);
  mem->activations = tr->act_bytes;
}

static int check_params(const struct ll_model *m, const struct ll_trainer_params *p, char *err, size_t errlen) {
  if (p->mode != LL_TRAIN_LORA && p->mode != LL_TRAIN_FULL) return ll_errf(err, errlen, LL_EINVAL, "trainer: unknown mode %d", p->mode);
  if (m->n_expert > 0) { // LoRA on attention through frozen experts and router, or every weight (ll_moe_backward)
    if (p->mode == LL_TRAIN_FULL && !(p->moe_aux_coef >= 0 && p->moe_aux_coef <= 100))
      return ll_errf(err, errlen, LL_EINVAL, "trainer: moe_aux_coef %g must be in [0, 100]", p->moe_aux_coef);
    if (p->mode == LL_TRAIN_LORA && p->targets & ((1u << LL_LORA_GATE) | (1u << LL_LORA_UP) | (1u << LL_LORA_DOWN)))
      return ll_errf(err, errlen, LL_EUNSUPPORTED,
                     "trainer: lora_targets names gate/up/down, but the model's FFN is a mixture of %d experts: use q,k,v,o (and train.lora_experts for "
                     "the experts' own adapters)",
                     m->n_expert);
  } else if (p->mode == LL_TRAIN_LORA && (p->targets & (LL_LORA_EXPERT_TARGETS | LL_LORA_SHEXP_TARGETS))) {
    return ll_errf(err, errlen, LL_EINVAL, "trainer: lora_experts names expert matrices, but the model has no mixture of experts");
  }
  if (p->mode == LL_TRAIN_LORA && (p->targets & LL_LORA_SHEXP_TARGETS) && m->F_sh <= 0)
    return ll_errf(err, errlen, LL_EINVAL, "trainer: lora_experts names the shared expert's matrices (*_shexp), but the model has no shared expert");
  if (p->mode == LL_TRAIN_LORA) {
    if (p->rank < 1 || p->rank > 4096) return ll_errf(err, errlen, LL_EINVAL, "trainer: lora_rank %d must be 1..4096", p->rank);
    if (!(p->alpha > 0) || !isfinite(p->alpha)) return ll_errf(err, errlen, LL_EINVAL, "trainer: lora_alpha must be positive");
    if (!p->targets || (p->targets & ~(LL_LORA_ALL_TARGETS | LL_LORA_EXPERT_TARGETS | LL_LORA_SHEXP_TARGETS)))
      return ll_errf(err, errlen, LL_EINVAL, "trainer: lora_targets names no known target");
  }
  if (!(p->dropout >= 0 && p->dropout < 1)) return ll_errf(err, errlen, LL_EINVAL, "trainer: lora_dropout %g must be in [0, 1)", p->dropout);
  if (p->batch < 1 || p->batch > 4096) return ll_errf(err, errlen, LL_EINVAL, "trainer: batch %d must be 1..4096", p->batch);
  if (p->seq_len < 2 || p->seq_len > 65536) return ll_errf(err, errlen, LL_EINVAL, "trainer: seq_len %d must be 2..65536", p->seq_len);
  if ((int64_t)p->batch * p->seq_len > (1 << 20)) return ll_errf(err, errlen, LL_ELIMIT, "trainer: batch x seq_len exceeds 1M tokens");
  if (p->grad_accum < 1 || p->grad_accum > 65536) return ll_errf(err, errlen, LL_EINVAL, "trainer: grad_accum %d must be 1..65536", p->grad_accum);
  if (p->steps < 1) return ll_errf(err, errlen, LL_EINVAL, "trainer: steps must be >= 1");
  if (!(p->lr > 0) || !isfinite(p->lr)) return ll_errf(err, errlen, LL_EINVAL, "trainer: lr must be positive");
  if (p->warmup < 0) return ll_errf(err, errlen, LL_EINVAL, "trainer: warmup must be >= 0");
  if (p->schedule < 0 || p->schedule > LL_SCHED_CONSTANT) return ll_errf(err, errlen, LL_EINVAL, "trainer: unknown schedule %d", p->schedule);
  if (!(p->clip >= 0) || !(p->weight_decay >= 0) || !(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1) || !(p->adam_eps > 0) ||
      !(p->min_lr_ratio >= 0 && p->min_lr_ratio <= 1))
    return ll_errf(err, errlen, LL_EINVAL, "trainer: clip, weight_decay, betas, eps or min_lr_ratio out of range");
  if (m->L < 1 || m->C < 1 || m->n_vocab < 1) return ll_errf(err, errlen, LL_EINVAL, "trainer: empty model");
  // What this trainer differentiates: the Llama/Qwen2 forward (ll_arch.h's train_hooks say which
  // other hooks it has). Another family is refused, naming what is missing, rather than trained wrong.
  const char *what;
  if (m->arch && !ll_arch_trainable(m->arch, &what))
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "trainer: %s models cannot be trained yet (no backward for %s)", m->arch->name, what);
  return 0;
}

static void fill_ops(struct ll_trainer *tr) {
  tr->ops = *tr->be->i;
  const struct ll_backend_i *r = ll_cpu_train_ref();
#define FILL(x) if (!tr->ops.x) tr->ops.x = r->x
  FILL(matmul_backward); FILL(rmsnorm_backward); FILL(rope_backward); FILL(swiglu_backward); FILL(attention_train);
  FILL(attention_backward); FILL(softmax_xent); FILL(get_rows_backward); FILL(dropout); FILL(sumsq); FILL(axpy); FILL(scale);
  FILL(adamw); FILL(geglu); FILL(geglu_backward); FILL(attention_train_swa);
#undef FILL
}

static int add_pt3(struct ll_trainer *tr, const char *name, int64_t off, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
  struct ptensor *np = realloc(tr->pt, (size_t)(tr->n_pt + 1) * sizeof *np);
  if (!np) return LL_ENOMEM;
  tr->pt = np;
  struct ptensor *t = &tr->pt[tr->n_pt++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->off = off, t->n = ne0 * ne1 * ne2, t->n_dims = n_dims, t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2;
  return 0;
}
static int add_pt(struct ll_trainer *tr, const char *name, int64_t off, int n_dims, int64_t ne0, int64_t ne1) {
  return add_pt3(tr, name, off, n_dims, ne0, ne1, 1);
}

static int setup_lora(struct ll_trainer *tr, char *err, size_t errlen) {
  const struct ll_model *m = tr->m;
  struct ll_lora_dims d;
  memset(&d, 0, sizeof d);
  snprintf(d.arch, sizeof d.arch, "%s", tr->arch);
  d.n_layer = m->L, d.n_embd = m->C, d.n_embd_q = m->qd != m->C ? m->qd : 0, d.n_embd_kv = m->kvd, d.n_ff = m->F, d.n_head = m->H, d.n_head_kv = m->Hkv;
  d.n_expert = m->n_expert, d.n_ff_exp = m->F_exp, d.n_ff_sh = m->F_sh;
  int rc = ll_lora_create(&tr->lora, &d, tr->p.rank, tr->p.alpha, tr->p.targets, tr->p.seed, tr->be, err, errlen);
  if (rc) return rc;
  tr->fused = ll_lora_fused(d.arch);
  tr->Ph = tr->lora->storage; // host memory (ll_lora_alloc)
  tr->n_par = tr->n_decay = tr->lora->n_params;
  if (!tr->dev) {
    tr->P = tr->Ph;
  } else { // the parameters on the device, and pairs that name them there
    const int np = tr->lora->n_layer * LL_LORA_N_SLOTS;
    if (!(tr->P = balloc(tr, tr->n_par)) || !(tr->dpairs = calloc((size_t)np, sizeof *tr->dpairs)))
      return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of %s for %lld adapter parameters", mem_of(tr), (long long)tr->n_par);
    if ((rc = copy(tr, tr->P, tr->Ph, tr->n_par))) return ll_errf(err, errlen, rc, "trainer: adapter upload: %s", ll_strerror(rc));
    for (int i = 0; i < np; i++) {
      tr->dpairs[i] = tr->lora->pairs[i];
      if (!tr->dpairs[i].a.data) continue;
      tr->dpairs[i].a.data = tr->P + ((const float *)tr->dpairs[i].a.data - tr->Ph);
      tr->dpairs[i].b.data = tr->P + ((const float *)tr->dpairs[i].b.data - tr->Ph);
    }
  }
  // Tensor names exactly as the adapter's files name them (one list for save and resume).
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  rc = ll_lora_to_mf(tr->lora, &mf, err, errlen);
  for (uint64_t i = 0; rc == 0 && i < mf.n_tensors; i++) {
    const struct ll_tensor_info *t = &mf.tensors[i];
    const float *d0 = t->data;
    if (d0 < tr->Ph || d0 >= tr->Ph + tr->n_par) continue;
    rc = add_pt3(tr, t->name.ptr, d0 - tr->Ph, (int)t->n_dims, t->ne[0], t->ne[1], t->n_dims > 2 ? t->ne[2] : 1); // experts' pairs: 3-D
  }
  ll_modelfile_free(&mf);
  return rc;
}

// P's address -> the same parameter in the host copy.
static float *host_of(const struct ll_trainer *tr, const float *p) { return tr->Ph + (p - tr->P); }
static int to_host(struct ll_weight *w, void *arg) {
  const struct ll_trainer *tr = arg;
  const float *d = w->data;
  if (d >= tr->P && d < tr->P + tr->n_par) w->data = host_of(tr, d);
  return 0;
}

// Full mode: every weight as an f32 copy in P (matrices first: they get weight decay; norms last).
static int setup_full(struct ll_trainer *tr, const struct ll_model *base, char *err, size_t errlen) {
  const int L = base->L;
  const int64_t C = base->C;
  tr->n_par = n_trainable(base, &tr->p);
  if (!(tr->P = balloc(tr, tr->n_par)))
    return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of %s for %lld parameters", mem_of(tr), (long long)tr->n_par);
  // The f32 weights are made on the host (Ph), then uploaded where P is device memory.
  tr->Ph = tr->dev ? malloc((size_t)tr->n_par * sizeof(float)) : tr->P;
  if (!tr->Ph) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory for the host copy of %lld parameters", (long long)tr->n_par);
  tr->flayers = calloc((size_t)L, sizeof *tr->flayers);
  tr->lg = calloc((size_t)L, sizeof *tr->lg);
  const size_t E = (size_t)base->n_expert;
  if (E > 0) {
    tr->fmoe = calloc((size_t)L, sizeof *tr->fmoe);
    tr->fexp = calloc((size_t)L * 3 * E, sizeof *tr->fexp);
    tr->mg = calloc((size_t)L, sizeof *tr->mg);
    if (!tr->fmoe || !tr->fexp || !tr->mg) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  }
  if (!tr->flayers || !tr->lg) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  tr->fm = *base;
  tr->fm.layers = tr->flayers;
  int64_t off = 0;
  // A matrix: dequantized f32 copy, its name and its place.
  struct mat {
    const struct ll_weight *src;
    struct ll_weight *dst;
    char name[64];
    int pt;        // 0: no tensor of its own (an expert after the first of a 3-D tensor, a fused
                   // matrix's slice after the first); 1: its own 2-D shape; 2, 3: the tensor's
                   // shape is ne (2-D, 3-D); 4: a vector (1-D: qwen2moe's shared expert gate)
    int64_t ne[3]; // the checkpoint tensor's shape where 3-D (experts: ne[2] = E) or fused
  } *mats = calloc(2 + 7 * (size_t)L + (size_t)L * (5 + 3 * E), sizeof *mats);
  int nm = 0, rc = 0;
  if (!mats) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
#define MAT(s, d, ...) (mats[nm].src = (s), mats[nm].dst = (d), mats[nm].pt = 1, snprintf(mats[nm].name, sizeof mats[nm].name, __VA_ARGS__), nm++)
  MAT(&base->tok_embd, &tr->fm.tok_embd, "token_embd.weight");
  if (!base->tied) MAT(&base->output, &tr->fm.output, "output.weight");
  for (int l = 0; l < L; l++) {
    const struct ll_layer *y = &base->layers[l];
    struct ll_layer *z = &tr->flayers[l];
    *z = *y;
    // phi3: q, k, v are consecutive row slices of attn_qkv (engine.c) and so are their copies
    // here, in that order: one tensor of the file's name and shape, the slices views into it
    const int fqkv = base->arch && (base->arch->flags & LL_ARCH_FUSED_QKV), fgu = base->arch && (base->arch->flags & LL_ARCH_FUSED_UP);
    MAT(&y->wq, &z->wq, fqkv ? "blk.%d.attn_qkv.weight" : "blk.%d.attn_q.weight", l);
    if (fqkv) mats[nm - 1].pt = 2, mats[nm - 1].ne[0] = y->wq.k, mats[nm - 1].ne[1] = y->wq.n + y->wk.n + y->wv.n;
    MAT(&y->wk, &z->wk, "blk.%d.attn_k.weight", l);
    mats[nm - 1].pt = !fqkv;
    MAT(&y->wv, &z->wv, "blk.%d.attn_v.weight", l);
    mats[nm - 1].pt = !fqkv;
    MAT(&y->wo, &z->wo, "blk.%d.attn_output.weight", l);
    if (y->moe) { // the router, then each 3-D expert tensor as the file holds it: expert e's matrix at e·F_exp·C
      struct ll_moe_layer *x = &tr->fmoe[l];
      *x = *y->moe, z->moe = x;
      x->gate = tr->fexp + (size_t)l * 3 * E, x->up = x->gate + E, x->down = x->up + E;
      MAT(&y->moe->router, &x->router, "blk.%d.ffn_gate_inp.weight", l);
      static const char *const xn[3] = {"gate", "up", "down"};
      for (int j = 0; j < 3; j++)
        for (size_t e = 0; e < E; e++) {
          const struct ll_weight *s = j == 0 ? &y->moe->gate[e] : j == 1 ? &y->moe->up[e] : &y->moe->down[e];
          MAT(s, (j == 0 ? x->gate : j == 1 ? x->up : x->down) + e, "blk.%d.ffn_%s_exps.weight", l, xn[j]);
          mats[nm - 1].pt = e == 0 ? 3 : 0;
          mats[nm - 1].ne[0] = s->k, mats[nm - 1].ne[1] = s->n, mats[nm - 1].ne[2] = (int64_t)E;
        }
      if (y->moe->sh_gate.data) { // qwen2moe's shared expert and its sigmoid gate (a vector of C)
        MAT(&y->moe->sh_gate, &x->sh_gate, "blk.%d.ffn_gate_shexp.weight", l);
        MAT(&y->moe->sh_up, &x->sh_up, "blk.%d.ffn_up_shexp.weight", l);
        MAT(&y->moe->sh_down, &x->sh_down, "blk.%d.ffn_down_shexp.weight", l);
        MAT(&y->moe->sh_router, &x->sh_router, "blk.%d.ffn_gate_inp_shexp.weight", l);
        mats[nm - 1].pt = 4;
      }
      continue;
    }
    MAT(&y->gate, &z->gate, fgu ? "blk.%d.ffn_up.weight" : "blk.%d.ffn_gate.weight", l); // phi3: gate, then up, in ffn_up
    if (fgu) mats[nm - 1].pt = 2, mats[nm - 1].ne[0] = y->gate.k, mats[nm - 1].ne[1] = y->gate.n + y->up.n;
    MAT(&y->up, &z->up, "blk.%d.ffn_up.weight", l);
    mats[nm - 1].pt = !fgu;
    MAT(&y->down, &z->down, "blk.%d.ffn_down.weight", l);
  }
#undef MAT
  for (int i = 0; i < nm && rc == 0; i++) {
    const struct ll_weight *s = mats[i].src;
    if (s->type != LL_TYPE_F32 && s->type != LL_TYPE_F16 && s->type != LL_TYPE_BF16) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "trainer: full-parameter training needs float weights; '%s' is %s (train LoRA adapters instead)",
                   mats[i].name, ll_type_name(s->type));
      break;
    }
    float *dst = tr->Ph + off;
    const size_t rs = ll_row_size(s->type, s->k);
    for (int64_t r = 0; r < s->n && rc == 0; r++)
      if (ll_dequantize_row(s->type, (const char *)s->data + (size_t)r * rs, dst + r * s->k, s->k) != 0)
        rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "trainer: cannot convert '%s'", mats[i].name);
    *mats[i].dst = (struct ll_weight){LL_TYPE_F32, s->k, s->n, tr->P + off, NULL, NULL};
    if (rc == 0 && mats[i].pt &&
        (mats[i].pt == 3   ? add_pt3(tr, mats[i].name, off, 3, mats[i].ne[0], mats[i].ne[1], mats[i].ne[2])
         : mats[i].pt == 2 ? add_pt(tr, mats[i].name, off, 2, mats[i].ne[0], mats[i].ne[1])
                           : add_pt(tr, mats[i].name, off, mats[i].pt == 4 ? 1 : 2, s->k, s->n)))
      rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
    off += s->k * s->n;
  }
  free(mats);
  if (rc) return rc;
  if (base->tied) tr->fm.output = tr->fm.tok_embd;
  tr->n_decay = off;
  // Norm weights (no weight decay).
  char nm1[64];
  for (int l = 0; l <= L; l++) {
    const float *src[2] = {l < L ? base->layers[l].attn_norm : base->output_norm, l < L ? base->layers[l].ffn_norm : NULL};
    for (int j = 0; j < 2 && src[j]; j++) {
      if (l < L) snprintf(nm1, sizeof nm1, "blk.%d.%s.weight", l, j ? "ffn_norm" : "attn_norm");
      else snprintf(nm1, sizeof nm1, "output_norm.weight");
      memcpy(tr->Ph + off, src[j], (size_t)C * sizeof(float));
      if (l < L && j == 0) tr->flayers[l].attn_norm = tr->P + off;
      else if (l < L) tr->flayers[l].ffn_norm = tr->P + off;
      else tr->fm.output_norm = tr->P + off;
      if (add_pt(tr, nm1, off, 1, C, 1)) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
      off += C;
    }
  }
  // q/k norm weights (qwen3, qwen3moe: one head's width; olmoe: whole rows)
  int qr, qw = 0, kr, kw = 0;
  if (L > 0 && base->layers[0].q_norm) qk_norm_shape(base, 1, &qr, &qw, &kr, &kw);
  for (int l = 0; qw > 0 && l < L; l++)
    for (int j = 0; j < 2; j++) {
      const int n = j ? kw : qw;
      snprintf(nm1, sizeof nm1, "blk.%d.%s.weight", l, j ? "attn_k_norm" : "attn_q_norm");
      memcpy(tr->Ph + off, j ? base->layers[l].k_norm : base->layers[l].q_norm, (size_t)n * sizeof(float));
      if (j) tr->flayers[l].k_norm = tr->P + off;
      else tr->flayers[l].q_norm = tr->P + off;
      if (add_pt(tr, nm1, off, 1, n, 1)) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
      off += n;
    }
  // Gemma 3's post-attention and post-FFN norm weights (C each). The file holds (1 + w) for every
  // norm of Gemma 3 (llama.cpp's conversion/gemma.py, Gemma3Model.norm_shift, adds the 1 to each
  // *norm.weight) and the forward multiplies by what it holds, so the gradient of a stored weight
  // is rmsnorm_backward's dg as for any norm (d(1 + w)/dw = 1: the same for w); the checkpoint
  // keeps the file's convention.
  const int pn = L > 0 && base->layers[0].post_attn_norm;
  for (int l = 0; pn && l < L; l++)
    for (int j = 0; j < 2; j++) {
      snprintf(nm1, sizeof nm1, "blk.%d.%s.weight", l, j ? "post_ffw_norm" : "post_attention_norm");
      memcpy(tr->Ph + off, j ? base->layers[l].post_ffn_norm : base->layers[l].post_attn_norm, (size_t)C * sizeof(float));
      if (j) tr->flayers[l].post_ffn_norm = tr->P + off;
      else tr->flayers[l].post_attn_norm = tr->P + off;
      if (add_pt(tr, nm1, off, 1, C, 1)) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
      off += C;
    }
  if (off != tr->n_par) return ll_errf(err, errlen, LL_EINVAL, "trainer: internal: %lld of %lld parameters placed", (long long)off, (long long)tr->n_par);
  tr->m = &tr->fm;
  if (!tr->dev) return 0;
  if ((rc = copy(tr, tr->P, tr->Ph, tr->n_par))) return ll_errf(err, errlen, rc, "trainer: weights upload: %s", ll_strerror(rc));
  // The model the server serves: fm's layout over the host copy.
  if (!(tr->fhlayers = calloc((size_t)L, sizeof *tr->fhlayers))) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  memcpy(tr->fhlayers, tr->flayers, (size_t)L * sizeof *tr->fhlayers);
  if (E > 0) { // the MoE layers' own copies (fhlayers' moe would otherwise share fmoe's weights)
    tr->fhmoe = calloc((size_t)L, sizeof *tr->fhmoe);
    tr->fhexp = calloc((size_t)L * 3 * E, sizeof *tr->fhexp);
    if (!tr->fhmoe || !tr->fhexp) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
    memcpy(tr->fhexp, tr->fexp, (size_t)L * 3 * E * sizeof *tr->fhexp);
    for (int l = 0; l < L; l++) {
      if (!tr->flayers[l].moe) continue;
      struct ll_moe_layer *x = &tr->fhmoe[l];
      *x = tr->fmoe[l], tr->fhlayers[l].moe = x;
      x->gate = tr->fhexp + (size_t)l * 3 * E, x->up = x->gate + E, x->down = x->up + E;
    }
  }
  tr->fmh = tr->fm;
  tr->fmh.layers = tr->fhlayers;
  ll_model_each_matrix(&tr->fmh, to_host, tr);
  for (int l = 0; l < L; l++) {
    tr->fhlayers[l].attn_norm = host_of(tr, tr->flayers[l].attn_norm);
    tr->fhlayers[l].ffn_norm = host_of(tr, tr->flayers[l].ffn_norm);
    if (qw > 0) tr->fhlayers[l].q_norm = host_of(tr, tr->flayers[l].q_norm), tr->fhlayers[l].k_norm = host_of(tr, tr->flayers[l].k_norm);
    if (pn) tr->fhlayers[l].post_attn_norm = host_of(tr, tr->flayers[l].post_attn_norm), tr->fhlayers[l].post_ffn_norm = host_of(tr, tr->flayers[l].post_ffn_norm);
  }
  tr->fmh.output_norm = host_of(tr, tr->fm.output_norm);
  return 0;
}

// Gradient pointers of full mode (same offsets in G as the weights in P).
static void full_grads(struct ll_trainer *tr) {
  tr->g_tok = grad_of(tr, tr->fm.tok_embd.data);
  tr->g_out = grad_of(tr, tr->fm.output.data); // == g_tok when tied: both products add into it
  tr->g_onorm = grad_of(tr, tr->fm.output_norm);
  for (int l = 0; l < tr->fm.L; l++) {
    const struct ll_layer *y = &tr->flayers[l];
    tr->lg[l] = (struct lgrad){grad_of(tr, y->attn_norm), grad_of(tr, y->ffn_norm), grad_of(tr, y->wq.data), grad_of(tr, y->wk.data),
                               grad_of(tr, y->wv.data), grad_of(tr, y->wo.data), grad_of(tr, y->gate.data), grad_of(tr, y->up.data),
                               grad_of(tr, y->down.data), grad_of(tr, y->q_norm), grad_of(tr, y->k_norm), grad_of(tr, y->post_attn_norm),
                               grad_of(tr, y->post_ffn_norm)};
    if (tr->mg && y->moe)
      tr->mg[l] = (struct ll_moe_grads){grad_of(tr, y->moe->router.data),  grad_of(tr, y->moe->gate[0].data), grad_of(tr, y->moe->up[0].data),
                                        grad_of(tr, y->moe->down[0].data), (float)tr->p.moe_aux_coef,     1.0f / (float)tr->p.grad_accum,
                                        grad_of(tr, y->moe->sh_gate.data), grad_of(tr, y->moe->sh_up.data), grad_of(tr, y->moe->sh_down.data),
                                        grad_of(tr, y->moe->sh_router.data)};
  }
}

int ll_trainer_create(struct ll_trainer **out, const struct ll_model *m, struct ll_backend *be, const struct ll_trainer_params *p, char *err,
                      size_t errlen) {
  *out = NULL;
  int rc = check_params(m, p, err, errlen);
  if (rc) return rc;
  struct ll_trainer *tr = calloc(1, sizeof *tr);
  if (!tr) return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  tr->p = *p;
  tr->p.arch = NULL, tr->p.model_path = NULL; // not kept (the caller's strings)
  snprintf(tr->arch, sizeof tr->arch, "%s", m->arch ? m->arch->name : p->arch ? p->arch : "llama"); // the model says best
  tr->be = be;
  tr->dev = !ll_backend_host_buffers(be);
  tr->m = m;
  tr->best_val = INFINITY, tr->last_loss = NAN, tr->last_val = NAN;
  ll_modelfile_init(&tr->meta);
  fill_ops(tr);
  tr->geglu = m->arch && m->arch->act == LL_ACT_GELU_TANH;
  tr->embd_scale = m->embd_scale > 0 ? m->embd_scale : 1.0f;
  if (tr->dev && tr->geglu && (!be->i->geglu || !be->i->geglu_backward)) { // the references read host memory
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "trainer: this device's backend has no GeGLU forward/backward (%s): train on the CPU (train.device cpu)",
                 m->arch->name);
    goto fail;
  }
  int any_swa = 0; // local layers whose window is shorter than the sequences: a windowed training attention
  for (int l = 0; l < m->L; l++) any_swa |= m->layers[l].swa && m->window > 0 && m->window < p->seq_len;
  if (tr->dev && any_swa && !be->i->attention_train_swa) {
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED,
                 "trainer: this device's backend has no windowed training attention: use train.seq_len <= %d (the sliding window) or train on the CPU",
                 m->window);
    goto fail;
  }
  tr->B = p->batch, tr->S = p->seq_len, tr->T = p->batch * p->seq_len;
  // Flash-style attention where the backend runs this shape (its S = 0 probe; the OpenCL
  // reference tier and the CPU have none): a layer keeps lse (B, H, S), not (B, H, S, S).
  tr->flash = tr->ops.attention_train_flash && tr->ops.attention_backward_flash &&
              tr->ops.attention_train_flash(be, NULL, NULL, NULL, NULL, NULL, 0, m->H, m->Hkv, m->hd, 1.0f, 0) == 0 &&
              tr->ops.attention_backward_flash(be, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, m->H, m->Hkv, m->hd, 1.0f, 0) == 0;
  tr->comm.size = 1;
  if (m->n_expert > 0 && (rc = ll_moe_ctx_new(&tr->moe, be, m, tr->T, err, errlen))) goto fail;
  if (m->n_expert > 0 && tr->dev && (!be->i->axpy || !be->i->scale || !be->i->matmul_backward || !be->i->swiglu_backward)) { // the references read host memory
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "trainer: this device's backend lacks the training ops a mixture of experts needs: train on the CPU (train.device cpu)");
    goto fail;
  }
  if (p->mode == LL_TRAIN_LORA) {
    rc = setup_lora(tr, err, errlen);
  } else {
    rc = setup_full(tr, m, err, errlen);
    if (rc == 0 && p->model_path) rc = ll_model_open(p->model_path, &tr->meta, err, errlen);
  }
  if (rc) goto fail;
  const int64_t n = tr->n_par;
  if (!(tr->G = balloc(tr, n)) || !(tr->M = balloc(tr, n)) || !(tr->V = balloc(tr, n))) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of %s for gradients and optimizer state (%lld parameters)", mem_of(tr), (long long)n);
    goto fail;
  }
  if (p->mode == LL_TRAIN_FULL) full_grads(tr);
  // Activations.
  const struct ll_model *mm = tr->m;
  const int64_t T = tr->T, C = mm->C, kvd = mm->kvd, F = mm->F, r = tr->lora ? tr->lora->rank : 1, qd = mm->qd > 0 ? mm->qd : mm->C;
  const int qkn = mm->L > 0 && mm->layers[0].q_norm, pn = mm->L > 0 && mm->layers[0].post_attn_norm;
  int64_t maxin = C > F ? C : F;
  maxin = maxin > qd ? maxin : qd;
  tr->n_acts = p->recompute ? 1 : mm->L;
  tr->xs = calloc((size_t)mm->L + 1, sizeof *tr->xs);
  tr->acts = calloc((size_t)tr->n_acts, sizeof *tr->acts);
  tr->pos = malloc((size_t)T * sizeof *tr->pos);
  tr->xparts = malloc((size_t)p->grad_accum * ((T + XENT_ROWS - 1) / XENT_ROWS) * sizeof *tr->xparts); // a step's micro-batches
  tr->ids = malloc((size_t)T * p->grad_accum * sizeof *tr->ids);
  tr->tg = malloc((size_t)T * p->grad_accum * sizeof *tr->tg);
  if (!tr->xs || !tr->acts || !tr->pos || !tr->ids || !tr->tg || !tr->xparts) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
    goto fail;
  }
  for (int64_t t = 0; t < T; t++) tr->pos[t] = (int32_t)(t % tr->S);
  // One allocation for the layer inputs and one per layer of saved activations (MAX_BUFS).
  int64_t pl, fx;
  act_floats(mm, p, tr->flash, &pl, &fx);
  float *xs = balloc(tr, T * C * (mm->L + 1));
  if (!xs) goto oom;
  for (int l = 0; l <= mm->L; l++) tr->xs[l] = xs + (size_t)l * T * C;
  const int64_t TV = (T < XENT_ROWS ? T : XENT_ROWS) * (int64_t)mm->n_vocab;
  const int64_t scr_floats = T * C + TV + T * (2 * C + 2 * qd + 3 * kvd + 3 * F) + T * r + 3 * T * maxin; // what TAKE hands out below
  float *scr = balloc(tr, scr_floats);
  if (!scr) goto oom;
  float *s = scr;
#define TAKE(ptr, cnt) (ptr = s, s += (cnt))
  TAKE(tr->xf, T * C); TAKE(tr->logits, TV);
  TAKE(tr->dx, T * C); TAKE(tr->dn, T * C); TAKE(tr->da, T * qd); TAKE(tr->dq, T * qd); TAKE(tr->dk, T * kvd); TAKE(tr->dv, T * kvd);
  TAKE(tr->dkn, T * kvd);
  TAKE(tr->dh, T * F); TAKE(tr->dg, T * F); TAKE(tr->du, T * F); TAKE(tr->dax, T * r); TAKE(tr->dxd, T * maxin); TAKE(tr->xd, T * maxin);
  TAKE(tr->nh, T * maxin);
  for (int l = 0; l < tr->n_acts; l++) {
    float *blk = l < MAX_BUFS - 8 ? balloc(tr, pl) : NULL;
    if (!blk) goto oom;
    s = blk;
    struct lacts *a = &tr->acts[l];
    a->n1 = a->n2 = a->h = tr->nh;
    TAKE(a->q, T * qd); TAKE(a->k, T * kvd); TAKE(a->v, T * kvd);
    a->att = a->lse = NULL;
    if (tr->flash) TAKE(a->lse, (int64_t)p->batch * mm->H * tr->S);
    else TAKE(a->att, (int64_t)p->batch * mm->H * tr->S * tr->S);
    TAKE(a->a, T * qd); TAKE(a->m, T * C); TAKE(a->g, T * F); TAKE(a->u, T * F);
    a->qp = a->kp = NULL;
    if (qkn) { TAKE(a->qp, T * qd); TAKE(a->kp, T * kvd); }
    a->po = a->pf = NULL;
    if (pn) { TAKE(a->po, T * C); TAKE(a->pf, T * C); }
    for (int t = 0; t < LL_LORA_N_TARGETS; t++)
      if (tr->lora && ((p->targets >> t) & 1)) TAKE(a->axs[t], T * r);
  }
#undef TAKE
  tr->act_bytes = 4 * (T * C * (mm->L + 1) + scr_floats + pl * tr->n_acts);
  tr->train = 1;
  *out = tr;
  return 0;
oom:
  rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of %s for activations (batch %d x seq_len %d)", mem_of(tr), p->batch, p->seq_len);
fail:
  ll_trainer_free(tr);
  return rc;
}

void ll_trainer_free(struct ll_trainer *tr) {
  if (!tr) return;
  ll_backend_sync(tr->be); // deferred results (ll_backend.h) land in xparts before it goes
  for (int i = 0; i < tr->n_bufs; i++) ll_backend_free_buf(tr->be, tr->bufs[i]);
  ll_lora_free(tr->lora);
  ll_moe_ctx_free(tr->moe);
  if (tr->dev && tr->p.mode == LL_TRAIN_FULL) free(tr->Ph);
  free(tr->dpairs), free(tr->fhlayers);
  ll_modelfile_free(&tr->meta);
  free(tr->fmoe), free(tr->fexp), free(tr->mg), free(tr->fhmoe), free(tr->fhexp);
  free(tr->pt), free(tr->flayers), free(tr->lg), free(tr->xs), free(tr->acts), free(tr->pos), free(tr->ids), free(tr->tg), free(tr->xparts);
  free(tr->gh);
  free(tr);
}

const struct ll_lora *ll_trainer_lora(const struct ll_trainer *tr) { return tr->lora; }
const struct ll_model *ll_trainer_model(const struct ll_trainer *tr) {
  return tr->p.mode != LL_TRAIN_FULL ? NULL : tr->dev ? &tr->fmh : &tr->fm;
}
// The host copy from P (a download on a device; nothing where P is host memory).
int ll_trainer_sync(struct ll_trainer *tr, char *err, size_t errlen) {
  if (!tr->dev || !tr->host_stale) return 0;
  int rc = copy(tr, tr->Ph, tr->P, tr->n_par);
  if (rc) return ll_errf(err, errlen, rc, "trainer: reading the parameters back from the device: %s", ll_strerror(rc));
  tr->host_stale = 0;
  return 0;
}
double ll_trainer_aux_take(struct ll_trainer *tr) {
  const double a = tr->aux_sum;
  tr->aux_sum = 0;
  return a;
}

void ll_trainer_vectors(struct ll_trainer *tr, float **params, float **grads, int64_t *n) {
  if (params) *params = tr->P;
  if (grads) *grads = tr->G;
  if (n) *n = tr->n_par;
}
int ll_trainer_zero_grad(struct ll_trainer *tr) { return zero(tr, tr->G, tr->n_par); }
void ll_trainer_inject_nan(struct ll_trainer *tr) { tr->inject_nan = 1; }

int ll_trainer_set_comm(struct ll_trainer *tr, const struct ll_train_comm *c, char *err, size_t errlen) {
  if (!c || c->size <= 1) {
    memset(&tr->comm, 0, sizeof tr->comm);
    tr->comm.size = 1;
    return 0;
  }
  if (c->rank < 0 || c->rank >= c->size || !c->sum_f32 || !c->gather_f64)
    return ll_errf(err, errlen, LL_EINVAL, "trainer: bad communicator (rank %d of %d)", c->rank, c->size);
  if (tr->dev && !tr->gh && !(tr->gh = malloc((size_t)tr->n_par * sizeof *tr->gh)))
    return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory for the gradient's host copy (%lld floats)", (long long)tr->n_par);
  tr->comm = *c;
  return 0;
}

uint64_t ll_trainer_param_hash(struct ll_trainer *tr) {
  if (ll_trainer_sync(tr, NULL, 0) != 0) return 0;
  const float *p = tr->dev ? tr->Ph : tr->P;
  uint64_t h = mix64((uint64_t)tr->n_par);
  for (int64_t i = 0; i < tr->n_par; i++) {
    uint32_t w;
    memcpy(&w, &p[i], sizeof w);
    h = mix64(h ^ w);
  }
  return h;
}

// The gradient summed over the ranks (through the host on a device backend).
static int grad_allsum(struct ll_trainer *tr, char *err, size_t errlen) {
  const struct ll_train_comm *c = &tr->comm;
  if (!tr->dev) return c->sum_f32(c->user, tr->G, tr->n_par, err, errlen);
  int rc = copy(tr, tr->gh, tr->G, tr->n_par);
  if (rc) return ll_errf(err, errlen, rc, "trainer: reading the gradient back from the device: %s", ll_strerror(rc));
  if ((rc = c->sum_f32(c->user, tr->gh, tr->n_par, err, errlen))) return rc;
  if ((rc = copy(tr, tr->G, tr->gh, tr->n_par))) return ll_errf(err, errlen, rc, "trainer: writing the gradient to the device: %s", ll_strerror(rc));
  return 0;
}

void ll_trainer_set_update_hook(struct ll_trainer *tr, ll_trainer_update_fn fn, void *user) {
  tr->update_fn = fn;
  tr->update_user = user;
}

void ll_trainer_set_yield_hook(struct ll_trainer *tr, void (*fn)(void *user), void *user) {
  tr->yield_fn = fn;
  tr->yield_user = user;
}

// The optimizer update of one step: AdamW over the decayed parameters, then the rest without
// decay (elementwise: the same bits on whichever thread runs it); one call (adamw_split) where
// the backend has it.
struct update_args {
  struct ll_trainer *tr;
  float lr;
  int st;
};
static int update_run(void *arg) {
  const struct update_args *u = arg;
  struct ll_trainer *tr = u->tr;
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const float b1 = (float)tr->p.beta1, b2 = (float)tr->p.beta2, eps = (float)tr->p.adam_eps;
  // a device's one launch over the whole arena where it has one, else two calls
  int rc = B->adamw_split ? B->adamw_split(be, tr->P, tr->G, tr->M, tr->V, tr->n_par, tr->n_decay, u->lr, b1, b2, eps, (float)tr->p.weight_decay, u->st)
                          : LL_EUNSUPPORTED;
  if (rc == LL_EUNSUPPORTED) {
    rc = B->adamw(be, tr->P, tr->G, tr->M, tr->V, tr->n_decay, u->lr, b1, b2, eps, (float)tr->p.weight_decay, u->st);
    if (rc == 0 && tr->n_par > tr->n_decay)
      rc = B->adamw(be, tr->P + tr->n_decay, tr->G + tr->n_decay, tr->M + tr->n_decay, tr->V + tr->n_decay, tr->n_par - tr->n_decay, u->lr, b1,
                    b2, eps, 0.0f, u->st);
  }
  if (rc == 0 && tr->dev) {
    tr->host_stale = 1;
    // The server reads the host copy (it serves it) once the hook returns: refresh it here,
    // where the hook holds whatever keeps requests off it.
    if (tr->update_fn) rc = ll_trainer_sync(tr, NULL, 0);
  }
  return rc;
}
void ll_trainer_set_best_val(struct ll_trainer *tr, double v) { tr->best_val = v; }
void ll_trainer_state(const struct ll_trainer *tr, struct ll_trainer_state *st) {
  st->step = tr->step, st->opt_step = tr->opt_step, st->skipped = tr->skipped, st->micro = tr->micro;
  st->best_val = tr->best_val, st->last_loss = tr->last_loss, st->last_val = tr->last_val;
}

// ---------------------------------------------------------------- optimizer step

static double lr_at(const struct ll_trainer_params *p, int64_t step) {
  if (step < p->warmup) return p->lr * (double)(step + 1) / (double)p->warmup;
  const double lo = p->lr * p->min_lr_ratio;
  const int64_t span = p->steps - p->warmup;
  double x = span > 0 ? (double)(step - p->warmup) / (double)span : 1.0;
  if (x > 1) x = 1;
  if (p->schedule == LL_SCHED_COSINE) return lo + (p->lr - lo) * 0.5 * (1.0 + cos(M_PI * x));
  if (p->schedule == LL_SCHED_LINEAR) return lo + (p->lr - lo) * (1.0 - x);
  return p->lr;
}

// A fused module (phi3's attn_qkv, ffn_up: ll_lora.h) has one A, which its members' pairs hold
// equal copies of; its gradient is the sum of theirs (each member's product reads A), given to
// every copy, so that the optimizer (elementwise, the same inputs) keeps them equal. The
// gradient norm counts the shared A once per member.
static int tie_grads(struct ll_trainer *tr, char *err, size_t errlen) {
  for (int l = 0; tr->fused && l < tr->m->L; l++)
    for (int pass = 0; pass < 2; pass++) // sums into the lead's, then copies back
      for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
        const int lead = ll_lora_group_lead(tr->lora, tr->fused, l, t);
        const struct ll_lora_pair *p = pair_of(tr, l, t), *lp = pair_of(tr, l, lead);
        if (lead == t || !p || !lp) continue;
        float *g = grad_of(tr, p->a.data), *lg = grad_of(tr, lp->a.data);
        const int64_t n = p->a.k * p->a.n;
        if (pass == 0) BK(tr->ops.axpy(tr->be, lg, g, 1.0f, n), "axpy");
        else BK(copy(tr, g, lg, n), "copy");
      }
  return 0;
}

int ll_trainer_step(struct ll_trainer *tr, struct ll_train_source *src, struct ll_train_step_info *info, char *err, size_t errlen) {
  const struct ll_backend_i *B = &tr->ops;
  struct ll_backend *be = tr->be;
  const int A = tr->p.grad_accum, T = tr->T, S = tr->S;
  const int N = tr->comm.size, R = tr->comm.rank; // data parallel: N ranks, this one R (1, 0 alone)
  memset(info, 0, sizeof *info);
  tr->aux_sum = 0; // this step's micro-batches only
  // Read the whole step's data first: the loss is a mean over every counted token of the step,
  // so each micro-batch's gradient is scaled by 1 / (the step's count) before it is summed.
  // With N ranks the step is N x A micro-batches read from the one cursor; this rank keeps
  // its own A (the others' sequences are read past into one sequence's scratch).
  int32_t *ids = malloc((size_t)(A * T + S) * sizeof *ids), *tg = malloc((size_t)(A * T + S) * sizeof *tg);
  if (!ids || !tg) {
    free(ids), free(tg);
    return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  }
  int rc = 0, epoch = 0;
  int64_t count = 0;
  const int per = A * tr->B; // sequences per rank and step
  for (int i = 0; i < N * per && rc == 0; i++) {
    const size_t o = i / per == R ? (size_t)(i - R * per) * S : (size_t)A * T; // others' into the scratch
    int e = src->next(src->user, ids + o, tg + o, err, errlen);
    if (e < 0) rc = e;
    else epoch = e;
  }
  for (int64_t i = 0; rc == 0 && i < (int64_t)A * T; i++) count += tg[i] >= 0;
  double *rk = NULL; // N > 1: every rank's count, then every micro-batch's loss (N x A)
  if (rc == 0 && N > 1) {
    if (!(rk = malloc((size_t)(N + 1) * A * sizeof *rk))) rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
    double mine = (double)count; // exact below 2^53
    if (rc == 0) rc = tr->comm.gather_f64(tr->comm.user, &mine, 1, rk, err, errlen);
    count = 0;
    for (int k = 0; rc == 0 && k < N; k++) count += (int64_t)rk[k];
  }
  const float gscale = count > 0 ? 1.0f / (float)count : 0.0f;
  const int nc = n_chunks(tr);
  // Every micro-batch queued back to back (on a device, no wait in between); the losses are
  // read with the gradient norm, the step's one wait for the device. A micro-batch's dropout
  // seed is its index in the whole step, whichever rank computes it.
  for (int a = 0; a < A && rc == 0; a++) {
    tr->seed_now = mix64(tr->p.seed ^ mix64((uint64_t)(tr->micro + (int64_t)R * A) + 1));
    rc = fb(tr, ids + (size_t)a * T, tg + (size_t)a * T, tr->B, 1, gscale, tr->xparts + (size_t)a * nc, NULL, err, errlen);
    tr->micro++;
  }
  tr->micro += (int64_t)(N - 1) * A;
  free(ids), free(tg);
  if (rc) {
    free(rk);
    zero(tr, tr->G, tr->n_par); // the error reported is rc's
    return rc;
  }
  if (tr->inject_nan) {
    const float nan_v = NAN; // test hook: a poisoned gradient must be caught below
    BK(copy(tr, tr->G, &nan_v, 1), "copy");
    tr->inject_nan = 0;
  }
  double loss_sum = 0;
  if (N > 1) {
    // Micro-batch losses in the step's order, then the gradient summed: every rank holds the
    // same G, so the norm, the skip decision and the update below agree on every rank.
    double *mine = rk + (size_t)N * A;
    rc = ll_backend_sync(be);
    if (rc) rc = ll_errf(err, errlen, rc, "trainer: sync: %s", ll_strerror(rc));
    for (int a = 0; a < A; a++) mine[a] = parts_sum(tr->xparts + (size_t)a * nc, nc);
    if (rc == 0) rc = tr->comm.gather_f64(tr->comm.user, mine, A, rk, err, errlen);
    for (int k = 0; rc == 0 && k < N * A; k++) loss_sum += rk[k];
    free(rk);
    if (rc == 0) rc = grad_allsum(tr, err, errlen);
    if (rc) return rc;
  }
  if ((rc = tie_grads(tr, err, errlen))) return rc;
  double ss = 0;
  BK(B->sumsq(be, &ss, tr->G, tr->n_par), "sumsq");
  BK(ll_backend_sync(be), "sync"); // the losses (sumsq's read has drained the queue already)
  if (N == 1)
    for (int a = 0; a < A; a++) loss_sum += parts_sum(tr->xparts + (size_t)a * nc, nc); // as micro-batch sums, in order
  const double loss = count > 0 ? loss_sum / (double)count : NAN;
  info->grad_norm = sqrt(ss);
  info->tokens = (int64_t)N * A * T;
  info->epoch = epoch;
  info->lr = lr_at(&tr->p, tr->step);
  info->loss = loss;
  info->aux_loss = tr->aux_sum / A; // the auxiliary loss's part of the objective (MoE, full mode)
  tr->aux_sum = 0;
  if (!isfinite(loss) || !isfinite(ss)) {
    // Skip: the weights and the moments stay exactly as they were.
    tr->skipped++;
    info->skipped = 1;
  } else {
    if (tr->p.clip > 0 && info->grad_norm > tr->p.clip) BK(B->scale(be, tr->G, (float)(tr->p.clip / info->grad_norm), tr->n_par), "scale");
    tr->opt_step++;
    struct update_args u = {tr, (float)info->lr, (int)(tr->opt_step > 0x7fffffff ? 0x7fffffff : tr->opt_step)};
    BK(tr->update_fn ? tr->update_fn(tr->update_user, update_run, &u) : update_run(&u), "adamw");
    tr->last_loss = loss;
  }
  BK(zero(tr, tr->G, tr->n_par), "zero");
  tr->step++;
  info->step = tr->step;
  return 0;
}

int ll_trainer_eval(struct ll_trainer *tr, struct ll_train_source *src, int64_t max_seqs, double *loss, char *err, size_t errlen) {
  *loss = NAN;
  if (!src->val_next) return ll_errf(err, errlen, LL_ENOTFOUND, "trainer: no validation data");
  if (src->val_reset) src->val_reset(src->user);
  const int S = tr->S, N = tr->comm.size, R = tr->comm.rank;
  int32_t *ids = malloc((size_t)tr->T * sizeof *ids), *tg = malloc((size_t)tr->T * sizeof *tg);
  if (!ids || !tg) {
    free(ids), free(tg);
    return ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  }
  double sum = 0;
  int64_t cnt = 0, seen = 0;
  int rc = 0, done = 0;
  // N > 1: batch k is computed by rank k % N; each batch's (loss sum, count) is kept, gathered,
  // and summed in batch order below, as one process sums them.
  double *bl = NULL;
  int nb = 0, cap = 0;
  while (!done && rc == 0 && (max_seqs <= 0 || seen < max_seqs)) {
    int n = 0;
    while (n < tr->B && (max_seqs <= 0 || seen < max_seqs)) {
      int r = src->val_next(src->user, ids + (size_t)n * S, tg + (size_t)n * S, err, errlen);
      if (r < 0) { rc = r; break; }
      if (r == 0) { done = 1; break; }
      n++, seen++;
    }
    if (rc || n == 0) break;
    double ls = 0;
    int64_t c = 0;
    if (N == 1 || nb % N == R) rc = ll_trainer_forward_backward(tr, ids, tg, n, 0, 1.0f, &ls, &c, err, errlen);
    if (N == 1) {
      sum += ls, cnt += c;
      continue;
    }
    if (nb == cap) {
      double *nbl = realloc(bl, (size_t)(cap = cap ? 2 * cap : 64) * 2 * sizeof *bl);
      if (!nbl) { rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory"); break; }
      bl = nbl;
    }
    bl[2 * nb] = ls, bl[2 * nb + 1] = (double)c;
    nb++;
  }
  free(ids), free(tg);
  if (rc == 0 && N > 1 && nb > 0) {
    double *all = malloc((size_t)N * nb * 2 * sizeof *all);
    rc = all ? tr->comm.gather_f64(tr->comm.user, bl, 2 * nb, all, err, errlen) : ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
    for (int k = 0; rc == 0 && k < nb; k++) {
      const double *b = all + ((size_t)(k % N) * nb + k) * 2;
      sum += b[0], cnt += (int64_t)b[1];
    }
    free(all);
  }
  free(bl);
  if (rc) return rc;
  if (cnt == 0) return ll_errf(err, errlen, LL_ENOTFOUND, "trainer: the validation split has no counted tokens");
  *loss = sum / (double)cnt;
  tr->last_val = *loss;
  return 0;
}

// ---------------------------------------------------------------- run checkpoints

static int copy_meta_kv(struct ll_modelfile *dst, const struct ll_modelfile *src) {
  if (!src->n_kv) return 0;
  dst->kv = calloc(src->n_kv, sizeof *dst->kv);
  if (!dst->kv) return LL_ENOMEM;
  for (uint64_t i = 0; i < src->n_kv; i++) {
    struct ll_kv *d = &dst->kv[i];
    const struct ll_kv *s = &src->kv[i];
    if (!(d->key.ptr = malloc(s->key.len + 1))) return LL_ENOMEM;
    memcpy(d->key.ptr, s->key.ptr, s->key.len + 1);
    d->key.len = s->key.len;
    dst->n_kv = i + 1;
    int rc = ll_kv_value_copy(&d->value, &s->value);
    if (rc) {
      d->value.type = LL_KV_U8; // freed as a scalar
      return rc;
    }
  }
  dst->gguf_version = src->gguf_version;
  dst->alignment = src->alignment;
  return 0;
}

static void params_text(const struct ll_trainer *tr, char *buf, size_t cap) {
  const struct ll_trainer_params *p = &tr->p;
  snprintf(buf, cap,
           "mode=%s rank=%d alpha=%g targets=0x%x dropout=%g batch=%d seq_len=%d grad_accum=%d steps=%lld lr=%g warmup=%lld schedule=%s "
           "min_lr_ratio=%g weight_decay=%g clip=%g beta1=%g beta2=%g eps=%g seed=%llu recompute=%d",
           p->mode == LL_TRAIN_LORA ? "lora" : "full", p->rank, p->alpha, p->targets, p->dropout, p->batch, p->seq_len, p->grad_accum,
           (long long)p->steps, p->lr, (long long)p->warmup, ll_train_schedule_name(p->schedule), p->min_lr_ratio, p->weight_decay, p->clip,
           p->beta1, p->beta2, p->adam_eps, (unsigned long long)p->seed, p->recompute);
}

int ll_trainer_save(struct ll_trainer *tr, const char *path, struct ll_train_source *src, char *err, size_t errlen) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  int rc = ll_trainer_sync(tr, err, errlen);
  if (rc) return rc;
  char name[128];
  // The moments as host memory: read back from the device for the write.
  float *Mh = tr->M, *Vh = tr->V;
  if (tr->dev) {
    Mh = malloc((size_t)tr->n_par * sizeof *Mh), Vh = malloc((size_t)tr->n_par * sizeof *Vh);
    if (!Mh || !Vh) rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory for the optimizer state's host copy");
    if (rc == 0 && ((rc = copy(tr, Mh, tr->M, tr->n_par)) || (rc = copy(tr, Vh, tr->V, tr->n_par))))
      rc = ll_errf(err, errlen, rc, "trainer: reading the optimizer state back from the device: %s", ll_strerror(rc));
  }
  if (rc == 0 && tr->lora) {
    rc = ll_lora_to_mf(tr->lora, &mf, err, errlen);
  } else if (rc == 0) {
    // The model as a model: its metadata and every tensor (trained ones from P, frozen ones as loaded).
    if ((rc = copy_meta_kv(&mf, &tr->meta))) rc = ll_errf(err, errlen, rc, "trainer: out of memory");
    for (uint64_t i = 0; rc == 0 && i < tr->meta.n_tensors; i++) {
      const struct ll_tensor_info *t = &tr->meta.tensors[i];
      const void *data = t->data;
      int type = t->type;
      for (int j = 0; j < tr->n_pt; j++)
        if (!strcmp(tr->pt[j].name, t->name.ptr)) data = tr->Ph + tr->pt[j].off, type = LL_TYPE_F32;
      if ((rc = ll_mf_add_tensor(&mf, t->name.ptr, type, t->n_dims, t->ne, data))) rc = ll_errf(err, errlen, rc, "trainer: %s", t->name.ptr);
    }
    if (rc == 0 && !tr->meta.n_tensors) rc = ll_errf(err, errlen, LL_EINVAL, "trainer: full-mode checkpoints need the model file (model_path)");
    if (rc == 0) rc = ll_mf_set_u32(&mf, "general.file_type", 0) ? LL_ENOMEM : 0; // every trained tensor is f32 now
  }
  // AdamW moments beside each trainable tensor.
  for (int j = 0; rc == 0 && j < tr->n_pt; j++) {
    const struct ptensor *t = &tr->pt[j];
    snprintf(name, sizeof name, "%s.adam_m", t->name);
    rc = ll_mf_add_tensor(&mf, name, LL_TYPE_F32, t->n_dims, t->ne, Mh + t->off);
    snprintf(name, sizeof name, "%s.adam_v", t->name);
    if (rc == 0) rc = ll_mf_add_tensor(&mf, name, LL_TYPE_F32, t->n_dims, t->ne, Vh + t->off);
    if (rc) rc = ll_errf(err, errlen, rc, "trainer: %s", name);
  }
  uint64_t cur[LL_TRAIN_CURSOR_WORDS] = {0};
  if (src && src->cursor_get) src->cursor_get(src->user, cur);
  char cfg[1024];
  params_text(tr, cfg, sizeof cfg);
  if (rc == 0) {
    int e = 0;
    e |= ll_mf_set_str(&mf, "training.mode", tr->lora ? "lora" : "full");
    e |= ll_mf_set_u64(&mf, "training.step", (uint64_t)tr->step);
    e |= ll_mf_set_u64(&mf, "training.opt_step", (uint64_t)tr->opt_step);
    e |= ll_mf_set_u64(&mf, "training.skipped", (uint64_t)tr->skipped);
    e |= ll_mf_set_u64(&mf, "training.rng_micro", (uint64_t)tr->micro);
    e |= ll_mf_set_u64(&mf, "training.seed", tr->p.seed);
    e |= ll_mf_set_u64(&mf, "training.total_steps", (uint64_t)tr->p.steps);
    e |= ll_mf_set_u32(&mf, "training.has_cursor", src && src->cursor_get ? 1u : 0u);
    e |= ll_mf_set_arr(&mf, "training.data_cursor", LL_KV_U64, cur, LL_TRAIN_CURSOR_WORDS);
    e |= ll_mf_set_f32(&mf, "training.best_val_loss", (float)tr->best_val);
    e |= ll_mf_set_f32(&mf, "training.last_loss", (float)tr->last_loss);
    e |= ll_mf_set_str(&mf, "training.params", cfg);
    if (tr->lora) e |= ll_mf_set_u32(&mf, "adapter.lora.rank", (uint32_t)tr->lora->rank);
    if (e) rc = ll_errf(err, errlen, LL_ENOMEM, "trainer: out of memory");
  }
  if (rc == 0) {
    struct ll_ckpt_write_opts o;
    ll_ckpt_write_opts_init(&o);
    struct ll_ckpt_training t = {1, (uint64_t)tr->step, lr_at(&tr->p, tr->step), tr->p.seed, cur[7]};
    o.training = &t;
    // Shards of 4 MiB: the writer holds about two shards raw and compressed at once, and a
    // LoRA run's state is tens of MiB of f32 that zstd barely shrinks: 16 MiB shards (the
    // model default) made the save the peak of a --recompute run's resident memory.
    o.shard_target = 4u << 20;
    o.source_format = "llsrv-train";
    o.note = cfg;
    rc = ll_ckpt_write(path, &mf, &o, err, errlen);
  }
  ll_modelfile_free(&mf);
  if (tr->dev) free(Mh), free(Vh);
  return rc;
}

int ll_trainer_resume(struct ll_trainer *tr, const char *path, struct ll_train_source *src, char *err, size_t errlen) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  int rc = ll_ckpt_open(path, &mf, 1, err, errlen);
  if (rc) return rc;
  const char *mode;
  uint64_t step = 0, opt_step = 0, skipped = 0, micro = 0, has_cur = 0;
  const struct ll_kv_array *cur = NULL;
  if (ll_mf_get_str(&mf, "training.mode", &mode) != 0 || ll_mf_get_uint(&mf, "training.step", &step) != 0 ||
      ll_mf_get_uint(&mf, "training.opt_step", &opt_step) != 0 || ll_mf_get_uint(&mf, "training.skipped", &skipped) != 0 ||
      ll_mf_get_uint(&mf, "training.rng_micro", &micro) != 0 || ll_mf_get_uint(&mf, "training.has_cursor", &has_cur) != 0 ||
      ll_mf_get_arr(&mf, "training.data_cursor", &cur) != 0 || cur->elem_type != LL_KV_U64 || cur->n != LL_TRAIN_CURSOR_WORDS) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s: not a run checkpoint (training.* state is missing or malformed)", path);
    goto out;
  }
  if (strcmp(mode, tr->lora ? "lora" : "full") != 0) {
    rc = ll_errf(err, errlen, LL_EINVAL, "%s: a %s run checkpoint, this run trains %s", path, mode, tr->lora ? "lora" : "full");
    goto out;
  }
  if (step > (uint64_t)INT64_MAX / 2 || opt_step > step || skipped > step || micro > (uint64_t)INT64_MAX / 2) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s: training counters out of range", path);
    goto out;
  }
  int64_t rank = 0;
  if (tr->lora && (ll_mf_get_int(&mf, "adapter.lora.rank", &rank) != 0 || rank != tr->lora->rank)) {
    rc = ll_errf(err, errlen, LL_EINVAL, "%s: adapter rank %lld, this run uses rank %d", path, (long long)rank, tr->lora->rank);
    goto out;
  }
  // Every trainable tensor and its two moments, by name, with the same shape; nothing extra
  // trainable (a checkpoint with other targets would silently train a different adapter).
  char name[128];
  const char *suffix[3] = {"", ".adam_m", ".adam_v"};
  float *dst[3] = {tr->P, tr->M, tr->V};
  for (int j = 0; j < tr->n_pt && rc == 0; j++)
    for (int s = 0; s < 3 && rc == 0; s++) {
      snprintf(name, sizeof name, "%s%s", tr->pt[j].name, suffix[s]);
      const struct ll_tensor_info *t = ll_mf_find_tensor(&mf, name);
      if (!t) rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s' is missing (other targets or model?)", path, name);
      else if (t->type != LL_TYPE_F32 || t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] != tr->pt[j].n || t->ne[0] != tr->pt[j].ne[0])
        rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s' has type %s and shape (%lld, %lld), expected f32 (%lld, %lld)", path, name,
                     ll_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1], (long long)tr->pt[j].ne[0], (long long)tr->pt[j].ne[1]);
    }
  if (rc == 0 && tr->lora) {
    int n_lora = 0;
    for (uint64_t i = 0; i < mf.n_tensors; i++) {
      const char *nm = mf.tensors[i].name.ptr;
      size_t l = strlen(nm);
      n_lora += l > 7 && (!strcmp(nm + l - 7, ".lora_a") || !strcmp(nm + l - 7, ".lora_b"));
    }
    if (n_lora != tr->n_pt) rc = ll_errf(err, errlen, LL_EINVAL, "%s: %d adapter tensors, this run trains %d (other lora_targets?)", path, n_lora, tr->n_pt);
  }
  if (rc == 0) { // values are checked before anything is changed
    for (int j = 0; j < tr->n_pt && rc == 0; j++) {
      const float *d = ll_mf_find_tensor(&mf, tr->pt[j].name)->data;
      for (int64_t i = 0; i < tr->pt[j].n; i++)
        if (!isfinite(d[i])) {
          rc = ll_errf(err, errlen, LL_EFORMAT, "%s: tensor '%s' holds a non-finite value at %lld", path, tr->pt[j].name, (long long)i);
          break;
        }
    }
  }
  if (rc == 0 && has_cur && src && src->cursor_set) rc = src->cursor_set(src->user, cur->data, err, errlen);
  if (rc) goto out;
  for (int j = 0; j < tr->n_pt && rc == 0; j++)
    for (int s = 0; s < 3 && rc == 0; s++) {
      snprintf(name, sizeof name, "%s%s", tr->pt[j].name, suffix[s]);
      const float *v = ll_mf_find_tensor(&mf, name)->data;
      rc = copy(tr, dst[s] + tr->pt[j].off, v, tr->pt[j].n);
      if (rc == 0 && s == 0 && tr->dev) memcpy(tr->Ph + tr->pt[j].off, v, (size_t)tr->pt[j].n * sizeof(float)); // the host copy too
    }
  if (rc) {
    rc = ll_errf(err, errlen, rc, "%s: loading the state onto the device: %s", path, ll_strerror(rc));
    goto out;
  }
  tr->step = (int64_t)step, tr->opt_step = (int64_t)opt_step, tr->skipped = (int64_t)skipped, tr->micro = (int64_t)micro;
  double d;
  if (ll_mf_get_float(&mf, "training.best_val_loss", &d) == 0) tr->best_val = d;
  if (ll_mf_get_float(&mf, "training.last_loss", &d) == 0) tr->last_loss = d;
  if ((rc = zero(tr, tr->G, tr->n_par))) rc = ll_errf(err, errlen, rc, "trainer: %s", ll_strerror(rc));
out:
  ll_modelfile_free(&mf);
  return rc;
}
