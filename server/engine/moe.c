// moe.c - the mixture-of-experts FFN behind ll_moe.h.
//
// Routing runs on the host (T·E logits come back; on a device that is the layer's one read);
// the experts run as ordinary backend products on the rows routed to them, so every backend
// that multiplies matrices runs MoE models, and the CPU backend's fast kernels (packed
// decode copies, threads, SIMD) serve the experts as they serve a dense FFN.
//
// Bits: llama.cpp computes an expert's tokens with mul_mat_id, one token's product at a time
// (ggml_vec_dot_*), so the expert products here run with ll_backend.row_order set; the
// weighted outputs are added in slot order (descending router probability), then the shared
// expert, then the residual: ggml's graph order, so F32 models match llama.cpp's ids.
//
// Training (ll_moe_backward) runs on any backend with the training ops. On a device the
// activations stay in its memory; the routing and its backward (softmax, top k,
// renormalization: a few floats per token) run on the host, which is the simplest correct
// way: the T·E router logits come back as in serving, and so do the T·k routing-weight
// gradients dy·ye (one-row products on the device) and qwen2moe's T shared-gate values.
#include "ll_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"
#include "ll_lora.h"
#include "ll_modelfile.h"
#include "ll_quant.h"

struct ll_moe_ctx {
  struct ll_backend *be;
  const struct ll_model *m;
  int max_batch, host; // host: the backend's buffers are host memory (the CPU backend)
  // backend buffers
  float *logits;       // (max_batch, E) router logits
  float *xg;           // (max_batch·k, C) inputs gathered by expert
  float *g, *u;        // (max_batch·k, F_exp) gate, up (g then SwiGLU's output)
  float *ye;           // (max_batch·k, C) expert outputs, then weighted, then summed per token
  float *sg, *su, *sy; // shared expert: (max_batch, F_sh), (max_batch, F_sh), (max_batch, C)
  float *sgate;        // (max_batch) shared expert's gate logit
  // host
  float *hlog, *hsg;   // (max_batch, E), (max_batch): logits and shared gates read back
  float *probs, *w;    // (E), (max_batch·k)
  int32_t *sel;        // (max_batch·k) expert of (token, slot)
  int *rowof, *src;    // (max_batch·k): row of (token, slot) in the grouped buffers; token of a row
  int *cnt, *off;      // (E) rows per expert, first row
  // training (made on first use): backend buffers
  float *h, *dh, *d2, *dye; // (max_batch·k, F_exp) x3, (max_batch·k, C)
  float *sh, *dsh, *dsg, *dsu, *dsy; // shared expert: (max_batch, F_sh) x4, (max_batch, C)
  float *dwd;                        // device only: (max_batch·k + max_batch) the per-row dot products dw, then the shared gate's
  // training: host memory (the routing's backward runs on the host; dlog and dv go to
  // matmul_backward as host operands, which ll_backend.h lets every op take)
  float *dlog, *dw, *dv; // (max_batch, E), (max_batch·k + max_batch), (max_batch)
  double aux;       // auxiliary losses summed by the backward (ll_moe_aux_take)
  // adapters on the experts (made on first use, grown to the largest rank seen)
  int lrank;
  float *lr, *lo;             // backend buffers: (max_batch·k, lrank) A·x, (max_batch·k, max(F_exp, C)) B·(A·x)
  int trank;                  // training: rank of
  float *axs[3], *dax;        // backend buffers (max_batch·k, trank) scale·x·A_eᵀ of each expert slot's rows, its gradient
  float *sax[3];              // backend buffers (max_batch, trank): the same of the shared expert's slots (gate, up, down)
  float *xdrop, *dxdrop;      // with LoRA dropout: (max_batch·k, max(C, F_exp)) an adapter's dropped input rows, their gradient
  // training's forward kept for the backward (ll_moe_forward's keep): one per layer slot
  struct moe_kept *kept;
  int n_kept;
};

// A training forward's routes and products (max_batch rows): what ll_moe_backward would
// otherwise recompute. Valid for (y, T) until that backward uses it.
struct moe_kept {
  const struct ll_moe_layer *y;
  int T, rank;              // rank: the adapter's whose axs are kept (0: none)
  float *mem;               // host: hlog (B, E), w (Bk)
  float *dmem;              // a backend buffer: g, u (Bk, F_exp), ye (Bk, C), axs (3, Bk, rank)
  int32_t *imem;            // host: sel, rowof, src (Bk each), cnt, off (E each)
};

double ll_moe_aux_take(struct ll_moe_ctx *c) {
  const double a = c->aux;
  c->aux = 0;
  return a;
}

void ll_moe_route(const float *logits, int T, int E, int k, int norm_w, float w_scale, int32_t *sel, float *w, float *probs) {
  for (int t = 0; t < T; t++) {
    const float *x = logits + (size_t)t * E;
    // ggml_soft_max: max, exponentials with their double sum, scaled by float(1 / sum)
    float mx = -INFINITY;
    for (int i = 0; i < E; i++) mx = x[i] > mx ? x[i] : mx;
    const double sum = ll_cpu_softmax(probs, x, mx, E);
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < E; i++) probs[i] *= inv;
    // argsort descending, the first k (selection: O(E·k), E is small)
    int32_t *s = sel + (size_t)t * k;
    float *wt = w + (size_t)t * k;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int i = 0; i < E; i++) {
        int taken = 0;
        for (int q = 0; q < j; q++) taken |= s[q] == i;
        if (!taken && (best < 0 || probs[i] > probs[best])) best = i;
      }
      s[j] = best;
      wt[j] = probs[best];
    }
    if (norm_w) { // ggml_sum_rows (double sum), clamped to f16's smallest normal, ggml_div
      double ws = 0;
      for (int j = 0; j < k; j++) ws += (double)wt[j];
      float wsf = (float)ws;
      wsf = wsf < 6.103515625e-5f ? 6.103515625e-5f : wsf;
      for (int j = 0; j < k; j++) wt[j] = wt[j] / wsf;
    }
    if (w_scale != 0.0f && w_scale != 1.0f)
      for (int j = 0; j < k; j++) wt[j] *= w_scale;
  }
}

void ll_moe_ctx_free(struct ll_moe_ctx *c) {
  if (!c) return;
  struct ll_backend *o = c->host ? NULL : c->be;
  float *bufs[] = {c->logits, c->xg, c->g, c->u, c->ye, c->sg, c->su, c->sy, c->sgate};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ll_backend_free_buf(o, bufs[i]);
  free(c->hlog), free(c->hsg), free(c->probs), free(c->w), free(c->sel), free(c->rowof), free(c->src), free(c->cnt), free(c->off);
  ll_backend_free_buf(o, c->lr), ll_backend_free_buf(o, c->lo);
  float *tb[] = {c->h,  c->dh,     c->d2,     c->dye,    c->sh,  c->dsh,   c->dsg,    c->dsu,
                 c->dsy, c->dwd, c->axs[0], c->axs[1], c->axs[2], c->dax, c->xdrop, c->dxdrop, c->sax[0], c->sax[1], c->sax[2]};
  for (size_t i = 0; i < sizeof tb / sizeof tb[0]; i++) ll_backend_free_buf(o, tb[i]);
  free(c->dv), free(c->dlog), free(c->dw);
  for (int i = 0; i < c->n_kept; i++) free(c->kept[i].mem), free(c->kept[i].imem), ll_backend_free_buf(o, c->kept[i].dmem);
  free(c->kept);
  free(c);
}

int ll_moe_ctx_new(struct ll_moe_ctx **out, struct ll_backend *be, const struct ll_model *m, int max_batch, char *err, size_t errlen) {
  *out = NULL;
  struct ll_moe_ctx *c = calloc(1, sizeof *c);
  if (!c) return ll_errf(err, errlen, LL_ENOMEM, "moe: out of memory");
  c->be = be, c->m = m, c->max_batch = max_batch, c->host = ll_backend_host_buffers(be);
  struct ll_backend *o = c->host ? NULL : be;
  const size_t B = (size_t)max_batch, Bk = B * (size_t)m->n_expert_used, E = (size_t)m->n_expert;
  c->logits = ll_backend_alloc(o, B * E * sizeof(float));
  c->xg = ll_backend_alloc(o, Bk * m->C * sizeof(float));
  c->g = ll_backend_alloc(o, Bk * m->F_exp * sizeof(float));
  c->u = ll_backend_alloc(o, Bk * m->F_exp * sizeof(float));
  c->ye = ll_backend_alloc(o, Bk * m->C * sizeof(float));
  int ok = c->logits && c->xg && c->g && c->u && c->ye;
  if (m->F_sh > 0) {
    c->sg = ll_backend_alloc(o, B * m->F_sh * sizeof(float));
    c->su = ll_backend_alloc(o, B * m->F_sh * sizeof(float));
    c->sy = ll_backend_alloc(o, B * m->C * sizeof(float));
    c->sgate = ll_backend_alloc(o, B * sizeof(float));
    c->hsg = malloc(B * sizeof(float));
    ok = ok && c->sg && c->su && c->sy && c->sgate && c->hsg;
  }
  c->hlog = malloc(B * E * sizeof(float));
  c->probs = malloc(E * sizeof(float));
  c->w = malloc(Bk * sizeof(float));
  c->sel = malloc(Bk * sizeof(int32_t));
  c->rowof = malloc(Bk * sizeof(int));
  c->src = malloc(Bk * sizeof(int));
  c->cnt = malloc(E * sizeof(int));
  c->off = malloc(E * sizeof(int));
  if (!ok || !c->hlog || !c->probs || !c->w || !c->sel || !c->rowof || !c->src || !c->cnt || !c->off) {
    ll_moe_ctx_free(c);
    return ll_errf(err, errlen, LL_ENOMEM, "moe: out of memory for the expert scratch (%d tokens x %d experts)", max_batch, m->n_expert_used);
  }
  *out = c;
  return 0;
}

static int fail(int rc, char *err, size_t errlen, const char *op) { return ll_errf(err, errlen, rc, "moe: backend %s failed: %s", op, ll_strerror(rc)); }
#define BK(call, op) do { int rc_ = (call); if (rc_) return fail(rc_, err, errlen, op); } while (0)

// dst (n) = a + b, element by element: host loops on the CPU backend, else the backend's add
static int row_add(struct ll_moe_ctx *c, float *dst, const float *a, const float *b, int n) {
  if (c->host) {
    for (int i = 0; i < n; i++) dst[i] = a[i] + b[i];
    return 0;
  }
  return c->be->i->add(c->be, dst, a, b, n);
}
// x (n) *= s
static int row_scale(struct ll_moe_ctx *c, float *x, float s, int n) {
  if (c->host) {
    for (int i = 0; i < n; i++) x[i] *= s;
    return 0;
  }
  return c->be->i->scale ? c->be->i->scale(c->be, x, s, n) : LL_EUNSUPPORTED;
}

static int route_group(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const float *xn, int T, char *err, size_t errlen);

// The adapter of the token of grouped row r and its pair for (layer, slot), or NULL.
static const struct ll_lora_pair *row_pair(const struct ll_moe_ctx *c, const struct ll_moe_lora *lo, int r, int slot, const struct ll_lora **a) {
  *a = lo->tok ? lo->tok[c->src[r]] : lo->one;
  if (!*a || !((*a)->targets >> slot & 1)) return NULL;
  const struct ll_lora_pair *p = ll_lora_at(*a, lo->layer, slot);
  return p->a.data ? p : NULL;
}

// Does any of the T tokens' adapters reach the experts?
static int any_expert_lora(const struct ll_moe_lora *lo, int T) {
  if (!lo) return 0;
  for (int t = 0; t < (lo->tok ? T : 1); t++) {
    const struct ll_lora *a = lo->tok ? lo->tok[t] : lo->one;
    if (a && (a->targets & (LL_LORA_EXPERT_TARGETS | LL_LORA_SHEXP_TARGETS))) return 1;
  }
  return 0;
}

// d (len, out) += sc · B·(A·x) for len rows x (len, in): ggml's order (B·(A·x), scaled, added)
// with the batch-invariant kernels, through c->lr (len, r) and c->lo (len, out).
static int lora_rows_add(struct ll_moe_ctx *c, const float *x, const struct ll_weight *A, const struct ll_weight *B, float sc, float *d, int64_t out,
                         int len, const char *what, char *err, size_t errlen) {
  struct ll_backend *be = c->be;
  const int bi = be->batch_invariant;
  be->batch_invariant = 1;
  int rc = be->i->matmul(be, c->lr, x, A, len, 0);          // (len, r)
  if (rc == 0) rc = be->i->matmul(be, c->lo, c->lr, B, len, 0); // (len, out)
  be->batch_invariant = bi;
  if (rc) return fail(rc, err, errlen, "matmul lora");
  if (c->host) {
    for (int64_t j = 0; j < (int64_t)len * out; j++) d[j] += sc * c->lo[j];
  } else if (be->i->axpy) {
    BK(be->i->axpy(be, d, c->lo, sc, (int64_t)len * out), "axpy");
  } else {
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "moe: the backend has no axpy for adapters on %s", what);
  }
  return 0;
}

// Serving: dst's grouped rows [r0, r0 + n) (of out floats) += scale · B_e·(A_e·x) for the rows
// whose token's adapter has the slot; x the same rows (of in floats). Runs of rows with the same
// adapter (a sequence's tokens are consecutive within an expert's block) are one pair of
// products each, in ggml's order (B·(A·x), scaled, added) with the batch-invariant kernels.
static int expert_lora(struct ll_moe_ctx *c, const struct ll_moe_lora *lo, int slot, int e, const float *x, int64_t in, float *dst, int64_t out, int r0,
                       int n, char *err, size_t errlen) {
  for (int r = r0; r < r0 + n;) {
    const struct ll_lora *a;
    const struct ll_lora_pair *p = row_pair(c, lo, r, slot, &a);
    int len = 1;
    if (!p) {
      r++;
      continue;
    }
    for (const struct ll_lora *b; r + len < r0 + n && row_pair(c, lo, r + len, slot, &b) == p; len++) {}
    struct ll_weight A, B;
    ll_lora_expert(a, p, e, &A, &B);
    int rc = lora_rows_add(c, x + (size_t)r * in, &A, &B, ll_lora_scale(a), dst + (size_t)r * out, out, len, "experts", err, errlen);
    if (rc) return rc;
    r += len;
  }
  return 0;
}

// The serving scratch for adapters of rank up to the tokens' largest.
static int lora_scratch(struct ll_moe_ctx *c, const struct ll_moe_lora *lo, int T, char *err, size_t errlen) {
  int rank = 0;
  for (int t = 0; t < (lo->tok ? T : 1); t++) {
    const struct ll_lora *a = lo->tok ? lo->tok[t] : lo->one;
    if (a && (a->targets & (LL_LORA_EXPERT_TARGETS | LL_LORA_SHEXP_TARGETS)) && a->rank > rank) rank = a->rank;
  }
  if (rank <= c->lrank) return 0;
  struct ll_backend *o = c->host ? NULL : c->be;
  const size_t Bk = (size_t)c->max_batch * (size_t)c->m->n_expert_used;
  size_t w = (size_t)(c->m->F_exp > c->m->C ? c->m->F_exp : c->m->C);
  w = w > (size_t)c->m->F_sh ? w : (size_t)c->m->F_sh; // the shared expert's rows (T <= Bk of them)
  float *lr = ll_backend_alloc(o, Bk * (size_t)rank * sizeof(float)), *lb = c->lo ? c->lo : ll_backend_alloc(o, Bk * w * sizeof(float));
  if (!lr || !lb) {
    ll_backend_free_buf(o, lr);
    if (lb != c->lo) ll_backend_free_buf(o, lb);
    return ll_errf(err, errlen, LL_ENOMEM, "moe: out of memory for the experts' adapter scratch (rank %d)", rank);
  }
  ll_backend_free_buf(o, c->lr);
  c->lr = lr, c->lo = lb, c->lrank = rank;
  return 0;
}

// The experts' products over the grouped rows: g, u (rows, F_exp) then SwiGLU, ye (rows, C).
static int experts(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const struct ll_moe_lora *lo, const float *xn, int T, char *err, size_t errlen) {
  struct ll_backend *be = c->be;
  const struct ll_model *m = c->m;
  const int E = m->n_expert, k = m->n_expert_used, C = m->C, Fe = m->F_exp;
  if (T == 1) { // decode: the k experts read the same row; gate and up of two experts per call
    for (int j0 = 0; j0 < k; j0 += 2) {
      float *o[4];
      const struct ll_weight *w[4];
      int n = 0;
      for (int j = j0; j < k && j < j0 + 2; j++) {
        const int e = c->sel[j], r = c->rowof[j];
        o[n] = c->g + (size_t)r * Fe, w[n++] = &y->gate[e];
        o[n] = c->u + (size_t)r * Fe, w[n++] = &y->up[e];
      }
      BK(ll_backend_matmul_n(be, n, o, xn, w, 1), "matmul expert gate, up");
    }
  } else {
    for (int e = 0; e < E; e++) {
      if (!c->cnt[e]) continue;
      const size_t r = (size_t)c->off[e];
      float *const o[2] = {c->g + r * Fe, c->u + r * Fe};
      const struct ll_weight *const w[2] = {&y->gate[e], &y->up[e]};
      BK(ll_backend_matmul_n(be, 2, o, c->xg + r * C, w, c->cnt[e]), "matmul expert gate, up");
    }
  }
  if (lo) { // adapters on gate and up: their input rows gathered (decode's experts read xn's one row)
    for (int r = 0; T == 1 && r < k; r++) BK(ll_backend_copy(be, c->xg + (size_t)r * C, xn, (size_t)C * sizeof(float)), "copy");
    for (int e = 0; e < E; e++) {
      if (!c->cnt[e]) continue;
      int rc = expert_lora(c, lo, LL_LORA_GATE_EXPS, e, c->xg, C, c->g, Fe, c->off[e], c->cnt[e], err, errlen);
      if (rc == 0) rc = expert_lora(c, lo, LL_LORA_UP_EXPS, e, c->xg, C, c->u, Fe, c->off[e], c->cnt[e], err, errlen);
      if (rc) return rc;
    }
  }
  const int rows = T * k;
  if (Fe % 8 == 0) { // row by row otherwise: ggml's SwiGLU runs lanes of 8 from each row's start
    BK(be->i->swiglu(be, c->g, c->g, c->u, (int64_t)rows * Fe), "swiglu");
  } else {
    for (int r = 0; r < rows; r++) BK(be->i->swiglu(be, c->g + (size_t)r * Fe, c->g + (size_t)r * Fe, c->u + (size_t)r * Fe, Fe), "swiglu");
  }
  for (int e = 0; e < E; e++) {
    if (!c->cnt[e]) continue;
    const size_t r = (size_t)c->off[e];
    BK(be->i->matmul(be, c->ye + r * C, c->g + r * Fe, &y->down[e], c->cnt[e], 0), "matmul expert down");
    if (lo) {
      const int rc = expert_lora(c, lo, LL_LORA_DOWN_EXPS, e, c->g, Fe, c->ye, C, c->off[e], c->cnt[e], err, errlen);
      if (rc) return rc;
    }
  }
  return 0;
}

// Serving: dst (T, out) += scale · B·(A·x) of the shared expert's slot for the tokens whose
// adapter has it (x (T, in)): runs of tokens with one adapter, ggml's order as expert_lora.
static int shared_lora(struct ll_moe_ctx *c, const struct ll_moe_lora *lo, int slot, const float *x, int64_t in, float *dst, int64_t out, int T,
                       char *err, size_t errlen) {
  for (int t = 0; t < T;) {
    const struct ll_lora *a = lo->tok ? lo->tok[t] : lo->one;
    const struct ll_lora_pair *p = a && ((a->targets >> slot) & 1) ? ll_lora_at(a, lo->layer, slot) : NULL;
    if (!p || !p->a.data) {
      t++;
      continue;
    }
    int len = 1;
    while (t + len < T && (lo->tok ? lo->tok[t + len] : lo->one) == a) len++;
    int rc = lora_rows_add(c, x + (size_t)t * in, &p->a, &p->b, ll_lora_scale(a), dst + (size_t)t * out, out, len, "the shared expert", err, errlen);
    if (rc) return rc;
    t += len;
  }
  return 0;
}

static int xlora_fwd(struct ll_moe_ctx *c, const struct ll_backend_i *ops, const struct ll_moe_lora *lo, int slot, int e, const float *x, int64_t in,
                     float *dst, int64_t out, int r0, int n, char *err, size_t errlen);

// qwen2moe's shared expert: sy (T, C) = sigmoid(xn · sh_routerᵀ) · down(silu(gate) * up) of
// every token; the gate computed as ggml does, silu(v) / v. lo: adapters on its gate, up and
// down (the *_shexp slots), or NULL; train: lo->one's, in the training order (xlora_fwd).
static int shared_expert(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const struct ll_moe_lora *lo, int train, const float *xn, int T, char *err,
                         size_t errlen) {
  struct ll_backend *be = c->be;
  const int C = c->m->C, Fs = c->m->F_sh;
  float *const o[2] = {c->sg, c->su};
  const struct ll_weight *const w[2] = {&y->sh_gate, &y->sh_up};
  BK(ll_backend_matmul_n(be, 2, o, xn, w, T), "matmul shared gate, up");
  int rc = 0;
  if (lo && train) {
    if ((rc = xlora_fwd(c, be->i, lo, LL_LORA_GATE_SHEXP, 0, xn, C, c->sg, Fs, 0, T, err, errlen)) ||
        (rc = xlora_fwd(c, be->i, lo, LL_LORA_UP_SHEXP, 0, xn, C, c->su, Fs, 0, T, err, errlen)))
      return rc;
  } else if (lo) {
    if ((rc = shared_lora(c, lo, LL_LORA_GATE_SHEXP, xn, C, c->sg, Fs, T, err, errlen)) ||
        (rc = shared_lora(c, lo, LL_LORA_UP_SHEXP, xn, C, c->su, Fs, T, err, errlen)))
      return rc;
  }
  BK(be->i->swiglu(be, c->sg, c->sg, c->su, (int64_t)T * Fs), "swiglu");
  BK(be->i->matmul(be, c->sy, c->sg, &y->sh_down, T, 0), "matmul shared down");
  if (lo && (rc = train ? xlora_fwd(c, be->i, lo, LL_LORA_DOWN_SHEXP, 0, c->sg, Fs, c->sy, C, 0, T, err, errlen)
                        : shared_lora(c, lo, LL_LORA_DOWN_SHEXP, c->sg, Fs, c->sy, C, T, err, errlen)))
    return rc;
  BK(be->i->matmul(be, c->sgate, xn, &y->sh_router, T, 0), "matmul shared gate logit");
  BK(ll_backend_copy(be, c->hsg, c->sgate, (size_t)T * sizeof(float)), "copy");
  for (int t = 0; t < T; t++) {
    const float v = c->hsg[t];
    const float s = v / (1.0f + expf(-v)); // ggml_silu_f32 (a row of one value takes the scalar tail)
    BK(row_scale(c, c->sy + (size_t)t * C, s / v, C), "scale");
  }
  return 0;
}

static int train_forward(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const struct ll_moe_lora *lo, int keep, float *x, const float *xn, int T,
                         char *err, size_t errlen);

int ll_moe_forward(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const struct ll_moe_lora *lo, int keep, float *x, const float *xn, int T,
                   char *err, size_t errlen) {
  struct ll_backend *be = c->be;
  const struct ll_model *m = c->m;
  const int k = m->n_expert_used, C = m->C;
  if (T > c->max_batch) return ll_errf(err, errlen, LL_ELIMIT, "moe: batch of %d tokens exceeds %d", T, c->max_batch);
  if (!any_expert_lora(lo, T)) lo = NULL;
  if (keep >= 0 && (!lo || !lo->tok)) return train_forward(c, y, lo, keep, x, xn, T, err, errlen);
  int rc = lo ? lora_scratch(c, lo, T, err, errlen) : 0;
  if (rc == 0) rc = route_group(c, y, xn, T, err, errlen);
  if (rc) return rc;
  const int ro = be->row_order;
  be->row_order = 1;
  rc = experts(c, y, lo, xn, T, err, errlen);
  be->row_order = ro;
  if (rc) return rc;
  if (y->sh_gate.data && (rc = shared_expert(c, y, lo, 0, xn, T, err, errlen))) return rc;
  // Weighted, summed in slot order into the first slot's row, + shared, + the residual.
  for (int i = 0; i < T * k; i++) BK(row_scale(c, c->ye + (size_t)c->rowof[i] * C, c->w[i], C), "scale");
  for (int t = 0; t < T; t++) {
    float *acc = c->ye + (size_t)c->rowof[t * k] * C;
    for (int j = 1; j < k; j++) BK(row_add(c, acc, acc, c->ye + (size_t)c->rowof[t * k + j] * C, C), "add");
    if (y->sh_gate.data) BK(row_add(c, acc, acc, c->sy + (size_t)t * C, C), "add");
    BK(row_add(c, x + (size_t)t * C, acc, x + (size_t)t * C, C), "add");
  }
  return 0;
}

// Router logits (T, E) to the host, routed; the (token, slot) pairs grouped by expert and, for
// a batch, xn's rows gathered in that order into xg.
static int route_group(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const float *xn, int T, char *err, size_t errlen) {
  struct ll_backend *be = c->be;
  const struct ll_model *m = c->m;
  const int E = m->n_expert, k = m->n_expert_used, C = m->C;
  BK(be->i->matmul(be, c->logits, xn, &y->router, T, 0), "matmul router");
  BK(ll_backend_copy(be, c->hlog, c->logits, (size_t)T * E * sizeof(float)), "copy");
  ll_moe_route(c->hlog, T, E, k, m->moe_norm_w, m->moe_w_scale, c->sel, c->w, c->probs);
  // Rows grouped by expert: expert e owns rows [off[e], off[e] + cnt[e]), tokens in order.
  memset(c->cnt, 0, (size_t)E * sizeof(int));
  for (int i = 0; i < T * k; i++) c->cnt[c->sel[i]]++;
  for (int e = 0, o = 0; e < E; o += c->cnt[e], e++) c->off[e] = o;
  for (int i = 0; i < T * k; i++) {
    const int r = c->off[c->sel[i]]++;
    c->rowof[i] = r, c->src[r] = i / k;
  }
  for (int e = 0; e < E; e++) c->off[e] -= c->cnt[e];
  if (T > 1) // the inputs gathered (decode's experts all read xn's one row)
    for (int r = 0; r < T * k; r++) BK(ll_backend_copy(be, c->xg + (size_t)r * C, xn + (size_t)c->src[r] * C, (size_t)C * sizeof(float)), "copy");
  return 0;
}

void ll_moe_param_counts(const struct ll_modelfile *mf, int64_t *total, int64_t *expert, int64_t *active, int *n_expert, int *n_used) {
  int64_t all = 0, ex = 0, ne = 0, nu = 0;
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    const int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    all += n;
    if (t->n_dims == 3 && strstr(t->name.ptr, "_exps.")) ex += n;
  }
  if (ll_mf_get_arch_int(mf, "expert_count", &ne) != 0 || ll_mf_get_arch_int(mf, "expert_used_count", &nu) != 0 || ne <= 0 || nu <= 0 || nu > ne)
    ne = nu = 0;
  int64_t act = all - (ne > 0 ? ex - ex / ne * nu : 0);
  const struct ll_tensor_info *te = ll_mf_find_tensor(mf, "token_embd.weight");
  if (te && ll_mf_find_tensor(mf, "output.weight")) act -= (te->ne[1] - 1) * te->ne[0]; // an untied embedding: one row per token
  *total = all, *expert = ex, *active = act, *n_expert = (int)ne, *n_used = (int)nu;
}

// ---------------------------------------------------------------- backward (training)

static float *grab(float **p, size_t n, int *ok) {
  if (!*p) *p = calloc(n, sizeof(float));
  *ok = *ok && *p;
  return *p;
}
// The same in c's backend's buffers (zeroed).
static float *grab_b(struct ll_moe_ctx *c, float **p, size_t n, int *ok) {
  if (!*p) *p = ll_backend_alloc(c->host ? NULL : c->be, n * sizeof(float));
  *ok = *ok && *p;
  return *p;
}

// Device training: out[i] = x[i] · w[i] (rows of n floats, backend buffers) for the m pairs,
// as m one-row products (x (1, n) · W (1, n)ᵀ, W the row of w): the backend has no dot op, and
// the host reads back only the m results (the host computes them in double on the CPU backend).
static int row_dots(struct ll_moe_ctx *c, const struct ll_backend_i *ops, float *out, float *const *x, float *const *w, int m, int n) {
  for (int i = 0; i < m; i++) {
    const struct ll_weight W = {LL_TYPE_F32, n, 1, w[i], NULL, NULL};
    const int rc = ops->matmul(c->be, c->dwd + i, x[i], &W, 1, 0);
    if (rc) return rc;
  }
  return ll_backend_copy(c->be, out, c->dwd, (size_t)m * sizeof(float));
}

// The dropout mask's seed of (slot, expert e): splitmix64 of the layer's seed and both.
static uint64_t drop_seed(const struct ll_moe_lora *lo, int slot, int e) {
  uint64_t z = lo->seed ^ ((uint64_t)(unsigned)slot << 32 | (unsigned)e);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Training: slot's A, B (expert e's of an expert slot; the shared expert's pair as it is) and
// where its rows' scale·x·Aᵀ are saved; 0 when the adapter lacks the slot.
static int train_pair(struct ll_moe_ctx *c, const struct ll_moe_lora *lo, int slot, int e, struct ll_weight *A, struct ll_weight *B, float **axs) {
  const struct ll_lora *a = lo->one;
  const struct ll_lora_pair *p = lo->pairs ? &lo->pairs[lo->layer * LL_LORA_N_SLOTS + slot] : ll_lora_at(a, lo->layer, slot);
  if (!p->a.data) return 0;
  if (ll_lora_is_expert(slot)) ll_lora_expert(a, p, e, A, B), *axs = c->axs[slot - LL_LORA_GATE_EXPS];
  else *A = p->a, *B = p->b, *axs = c->sax[slot - LL_LORA_GATE_SHEXP];
  return 1;
}

// Training: the adapter's product on expert e's rows [r0, r0 + n): axs (rows, r) = scale·drop(x)·A_eᵀ,
// dst += axs·B_eᵀ (the trainer's order).
static int xlora_fwd(struct ll_moe_ctx *c, const struct ll_backend_i *ops, const struct ll_moe_lora *lo, int slot, int e, const float *x, int64_t in,
                     float *dst, int64_t out, int r0, int n, char *err, size_t errlen) {
  const struct ll_lora *a = lo->one;
  struct ll_weight A, B;
  float *axs;
  if (!train_pair(c, lo, slot, e, &A, &B, &axs)) return 0;
  axs += (size_t)r0 * a->rank;
  const float *xa = x + (size_t)r0 * in;
  if (lo->dropout > 0) { // PEFT's lora_dropout on the adapter's input
    BK(ops->dropout(c->be, c->xdrop, xa, lo->dropout, drop_seed(lo, slot, e), (int64_t)n * in), "dropout");
    xa = c->xdrop;
  }
  BK(ops->matmul(c->be, axs, xa, &A, n, 0), "matmul expert lora_a");
  BK(ops->scale(c->be, axs, ll_lora_scale(a), (int64_t)n * a->rank), "scale");
  BK(ops->matmul(c->be, dst + (size_t)r0 * out, axs, &B, n, 1), "matmul expert lora_b");
  return 0;
}

// Its backward given dy (rows of out): dx (rows of in) += scale·(dy·B_e)·A_e; dB_e += dyᵀ·axs,
// dA_e += daxᵀ·x into lo->G.
static int xlora_bwd(struct ll_moe_ctx *c, const struct ll_backend_i *ops, const struct ll_moe_lora *lo, int slot, int e, float *dx, const float *dy,
                     const float *x, int64_t in, int64_t out, int r0, int n, char *err, size_t errlen) {
  const struct ll_lora *a = lo->one;
  struct ll_weight A, B;
  float *axs;
  if (!train_pair(c, lo, slot, e, &A, &B, &axs)) return 0;
  const int r = a->rank;
  float *dA = lo->G ? lo->G + ((const float *)A.data - lo->P) : NULL, *dB = lo->G ? lo->G + ((const float *)B.data - lo->P) : NULL;
  float *dax = c->dax + (size_t)r0 * r;
  BK(ll_backend_zero(c->be, dax, (size_t)n * r * sizeof(float)), "zero");
  BK(ops->matmul_backward(c->be, dax, dB, dy + (size_t)r0 * out, axs + (size_t)r0 * r, &B, n), "matmul_backward expert lora_b");
  BK(ops->scale(c->be, dax, ll_lora_scale(a), (int64_t)n * r), "scale");
  if (lo->dropout > 0) { // through the same mask: dA from the dropped input, dx = drop'(dax·A)
    const uint64_t seed = drop_seed(lo, slot, e);
    const int64_t nin = (int64_t)n * in;
    BK(ops->dropout(c->be, c->xdrop, x + (size_t)r0 * in, lo->dropout, seed, nin), "dropout");
    BK(ll_backend_zero(c->be, c->dxdrop, (size_t)nin * sizeof(float)), "zero");
    BK(ops->matmul_backward(c->be, c->dxdrop, dA, dax, c->xdrop, &A, n), "matmul_backward expert lora_a");
    BK(ops->dropout(c->be, c->dxdrop, c->dxdrop, lo->dropout, seed, nin), "dropout backward");
    BK(ops->axpy(c->be, dx + (size_t)r0 * in, c->dxdrop, 1.0f, nin), "axpy");
    return 0;
  }
  BK(ops->matmul_backward(c->be, dx + (size_t)r0 * in, dA, dax, x + (size_t)r0 * in, &A, n), "matmul_backward expert lora_a");
  return 0;
}

// The training scratch (backend buffers, dlog, dw and dv on the host): made on first use, the
// adapters' saved products at lo's rank.
static int train_scratch(struct ll_moe_ctx *c, const struct ll_moe_lora *lo, char *err, size_t errlen) {
  const struct ll_model *m = c->m;
  const int E = m->n_expert, k = m->n_expert_used, C = m->C, Fe = m->F_exp, Fs = m->F_sh;
  const size_t B = (size_t)c->max_batch, Bk = B * (size_t)k;
  struct ll_backend *o = c->host ? NULL : c->be;
  int ok = 1;
  grab_b(c, &c->h, Bk * Fe, &ok), grab_b(c, &c->dh, Bk * Fe, &ok), grab_b(c, &c->d2, Bk * Fe, &ok), grab_b(c, &c->dye, Bk * C, &ok);
  grab(&c->dlog, B * E, &ok), grab(&c->dw, Bk + B, &ok);
  if (!c->host) grab_b(c, &c->dwd, Bk + B, &ok);
  if (Fs > 0)
    grab_b(c, &c->sh, B * Fs, &ok), grab_b(c, &c->dsh, B * Fs, &ok), grab_b(c, &c->dsg, B * Fs, &ok), grab_b(c, &c->dsu, B * Fs, &ok),
        grab_b(c, &c->dsy, B * C, &ok), grab(&c->dv, B, &ok);
  if (lo && lo->one->rank != c->trank) { // the adapter's saved products, per expert slot
    for (int i = 0; i < 3; i++) ll_backend_free_buf(o, c->axs[i]), ll_backend_free_buf(o, c->sax[i]), c->axs[i] = c->sax[i] = NULL;
    ll_backend_free_buf(o, c->dax), c->dax = NULL;
    c->trank = lo->one->rank;
  }
  if (lo)
    grab_b(c, &c->axs[0], Bk * c->trank, &ok), grab_b(c, &c->axs[1], Bk * c->trank, &ok), grab_b(c, &c->axs[2], Bk * c->trank, &ok),
        grab_b(c, &c->dax, Bk * c->trank, &ok);
  if (lo && Fs > 0)
    grab_b(c, &c->sax[0], B * c->trank, &ok), grab_b(c, &c->sax[1], B * c->trank, &ok), grab_b(c, &c->sax[2], B * c->trank, &ok);
  if (lo && lo->dropout > 0) {
    if (!c->be->i->dropout || !c->be->i->axpy) return ll_errf(err, errlen, LL_EUNSUPPORTED, "moe: the backend has no dropout for the experts' adapters");
    size_t w = (size_t)(C > Fe ? C : Fe);
    w = w > (size_t)Fs ? w : (size_t)Fs; // the shared expert's T <= Bk rows
    grab_b(c, &c->xdrop, Bk * w, &ok), grab_b(c, &c->dxdrop, Bk * w, &ok);
  }
  return ok ? 0 : ll_errf(err, errlen, LL_ENOMEM, "moe: out of memory for training's scratch");
}

// Training's forward of the routed experts: routes (on the host), then g, u (+ the adapters, their
// axs saved), h = SwiGLU and ye (unweighted) of every (token, slot) over the grouped rows, with
// the training kernels (no ggml row order: nothing here is compared with llama.cpp's bits).
static int train_experts(struct ll_moe_ctx *c, const struct ll_backend_i *ops, const struct ll_moe_layer *y, const struct ll_moe_lora *lo,
                         const float *xn, int T, char *err, size_t errlen) {
  struct ll_backend *be = c->be;
  const struct ll_model *m = c->m;
  const int E = m->n_expert, k = m->n_expert_used, C = m->C, Fe = m->F_exp;
  int rc = route_group(c, y, xn, T, err, errlen);
  if (rc) return rc;
  for (int r = 0; T == 1 && r < k; r++) BK(ll_backend_copy(be, c->xg + (size_t)r * C, xn, (size_t)C * sizeof(float)), "copy");
  for (int e = 0; e < E; e++) {
    if (!c->cnt[e]) continue;
    const size_t r = (size_t)c->off[e];
    float *const o[2] = {c->g + r * Fe, c->u + r * Fe};
    const struct ll_weight *const w[2] = {&y->gate[e], &y->up[e]};
    BK(ll_backend_matmul_n(be, 2, o, c->xg + r * C, w, c->cnt[e]), "matmul expert gate, up");
    if (lo && ((rc = xlora_fwd(c, ops, lo, LL_LORA_GATE_EXPS, e, c->xg, C, c->g, Fe, c->off[e], c->cnt[e], err, errlen)) ||
               (rc = xlora_fwd(c, ops, lo, LL_LORA_UP_EXPS, e, c->xg, C, c->u, Fe, c->off[e], c->cnt[e], err, errlen))))
      return rc;
  }
  BK(ops->swiglu(be, c->h, c->g, c->u, (int64_t)T * k * Fe), "swiglu");
  for (int e = 0; e < E; e++) {
    if (!c->cnt[e]) continue;
    BK(ops->matmul(be, c->ye + (size_t)c->off[e] * C, c->h + (size_t)c->off[e] * Fe, &y->down[e], c->cnt[e], 0), "matmul expert down");
    if (lo && (rc = xlora_fwd(c, ops, lo, LL_LORA_DOWN_EXPS, e, c->h, Fe, c->ye, C, c->off[e], c->cnt[e], err, errlen))) return rc;
  }
  return 0;
}

// Keep (dir 0) train_experts' results in slot i, or bring them back (dir 1; xg regathered from xn).
static int kept_io(struct ll_moe_ctx *c, int i, int dir, const struct ll_moe_layer *y, int T, int rank, const float *xn, char *err, size_t errlen) {
  struct ll_backend *be = c->be, *o = c->host ? NULL : be;
  const struct ll_model *m = c->m;
  const size_t E = (size_t)m->n_expert, k = (size_t)m->n_expert_used, C = (size_t)m->C, Fe = (size_t)m->F_exp;
  const size_t B = (size_t)c->max_batch, Bk = B * k, Tk = (size_t)T * k;
  if (dir == 0 && i >= c->n_kept) {
    struct moe_kept *nk = realloc(c->kept, (size_t)(i + 1) * sizeof *nk);
    if (!nk) return ll_errf(err, errlen, LL_ENOMEM, "moe: out of memory");
    memset(nk + c->n_kept, 0, (size_t)(i + 1 - c->n_kept) * sizeof *nk);
    c->kept = nk, c->n_kept = i + 1;
  }
  struct moe_kept *s = &c->kept[i];
  if (dir == 0 && (!s->mem || s->rank != rank)) {
    free(s->mem), free(s->imem), ll_backend_free_buf(o, s->dmem);
    s->mem = malloc((B * E + Bk) * sizeof(float));
    s->dmem = ll_backend_alloc(o, (2 * Bk * Fe + Bk * C + 3 * Bk * (size_t)rank) * sizeof(float));
    s->imem = malloc((3 * Bk + 2 * E) * sizeof(int32_t));
    s->y = NULL, s->rank = rank;
    if (!s->mem || !s->dmem || !s->imem) return ll_errf(err, errlen, LL_ENOMEM, "moe: out of memory for the kept forward of %d tokens", c->max_batch);
  }
  float *f = s->mem, *d = s->dmem;
  int32_t *q = s->imem;
  struct {
    void *a, *b;
    size_t n;
  } parts[] = {{f, c->hlog, (size_t)T * E * sizeof(float)},
               {f + B * E, c->w, Tk * sizeof(float)},
               {q, c->sel, Tk * sizeof(int32_t)},
               {q + Bk, c->rowof, Tk * sizeof(int)},
               {q + 2 * Bk, c->src, Tk * sizeof(int)},
               {q + 3 * Bk, c->cnt, E * sizeof(int)},
               {q + 3 * Bk + E, c->off, E * sizeof(int)}};
  for (size_t j = 0; j < sizeof parts / sizeof parts[0]; j++) memcpy(dir ? parts[j].b : parts[j].a, dir ? parts[j].a : parts[j].b, parts[j].n);
  struct {
    float *a, *b;
    size_t n;
  } dparts[] = {{d, c->g, Tk * Fe}, {d + Bk * Fe, c->u, Tk * Fe}, {d + 2 * Bk * Fe, c->ye, Tk * C}};
  for (size_t j = 0; j < sizeof dparts / sizeof dparts[0]; j++)
    BK(ll_backend_copy(be, dir ? dparts[j].b : dparts[j].a, dir ? dparts[j].a : dparts[j].b, dparts[j].n * sizeof(float)), "copy");
  float *ax = d + 2 * Bk * Fe + Bk * C;
  for (int j = 0; j < 3 && rank > 0; j++)
    BK(ll_backend_copy(be, dir ? c->axs[j] : ax + (size_t)j * Bk * rank, dir ? ax + (size_t)j * Bk * rank : c->axs[j], Tk * (size_t)rank * sizeof(float)),
       "copy");
  if (dir == 0) s->y = y, s->T = T;
  else {
    s->y = NULL; // used once
    for (size_t r = 0; r < Tk; r++) BK(ll_backend_copy(be, c->xg + r * C, xn + (size_t)c->src[r] * C, C * sizeof(float)), "copy");
  }
  return 0;
}

// Training's forward: train_experts, kept in slot `keep`, then x += Σ_slot w·ye (+ the shared
// expert) in the serving order of the sums, without weighting ye in place (the backward's dw
// needs it as it is). On a device the same sums as backend ops (copy, scale, axpy, add).
static int train_forward(struct ll_moe_ctx *c, const struct ll_moe_layer *y, const struct ll_moe_lora *lo, int keep, float *x, const float *xn, int T,
                         char *err, size_t errlen) {
  const struct ll_model *m = c->m;
  const int k = m->n_expert_used, C = m->C;
  int rc = train_scratch(c, lo, err, errlen);
  if (rc == 0) rc = train_experts(c, c->be->i, y, lo, xn, T, err, errlen);
  if (rc == 0) rc = kept_io(c, keep, 0, y, T, lo ? lo->one->rank : 0, xn, err, errlen);
  if (rc == 0 && y->sh_gate.data) rc = shared_expert(c, y, lo, 1, xn, T, err, errlen);
  if (rc) return rc;
  float *acc = c->dye; // (C) scratch: the backward's, free until then
  for (int t = 0; !c->host && t < T; t++) {
    struct ll_backend *be = c->be;
    for (int j = 0; j < k; j++) {
      const float *ye = c->ye + (size_t)c->rowof[t * k + j] * C, w = c->w[t * k + j];
      if (j == 0) {
        BK(ll_backend_copy(be, acc, ye, (size_t)C * sizeof(float)), "copy");
        BK(be->i->scale(be, acc, w, C), "scale");
      } else {
        BK(be->i->axpy(be, acc, ye, w, C), "axpy");
      }
    }
    if (y->sh_gate.data) BK(be->i->add(be, acc, acc, c->sy + (size_t)t * C, C), "add");
    BK(be->i->add(be, x + (size_t)t * C, acc, x + (size_t)t * C, C), "add");
  }
  for (int t = 0; c->host && t < T; t++) {
    for (int j = 0; j < k; j++) {
      const float *ye = c->ye + (size_t)c->rowof[t * k + j] * C, w = c->w[t * k + j];
      for (int i = 0; i < C; i++) acc[i] = j ? acc[i] + ye[i] * w : ye[i] * w;
    }
    const float *sy = y->sh_gate.data ? c->sy + (size_t)t * C : NULL;
    float *xr = x + (size_t)t * C;
    for (int i = 0; i < C; i++) xr[i] = (sy ? acc[i] + sy[i] : acc[i]) + xr[i];
  }
  return 0;
}

int ll_moe_backward(struct ll_moe_ctx *c, const struct ll_backend_i *ops, const struct ll_moe_layer *y, const struct ll_moe_grads *gr,
                    const struct ll_moe_lora *lo, int keep, float *dxn, const float *xn, const float *dy, int T, char *err, size_t errlen) {
  struct ll_backend *be = c->be;
  const struct ll_model *m = c->m;
  const int E = m->n_expert, k = m->n_expert_used, C = m->C, Fe = m->F_exp, Fs = m->F_sh;
  if (!c->host && (!ops->axpy || !ops->scale || !ops->matmul_backward || !ops->swiglu_backward))
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "moe: the device's backend lacks a training op (axpy, scale, matmul_backward, swiglu_backward)");
  if (T > c->max_batch) return ll_errf(err, errlen, LL_ELIMIT, "moe: batch of %d tokens exceeds %d", T, c->max_batch);
  if (E > 1024) return ll_errf(err, errlen, LL_ELIMIT, "moe: %d experts exceed the backward's 1024", E);
  const size_t FC = (size_t)Fe * C;
  if (lo && lo->tok) return ll_errf(err, errlen, LL_EINVAL, "moe: the backward takes one adapter for the batch (lo->one)");
  if (lo && (!lo->one || !(lo->one->targets & (LL_LORA_EXPERT_TARGETS | LL_LORA_SHEXP_TARGETS)))) lo = NULL;
  int rc = train_scratch(c, lo, err, errlen);
  if (rc) return rc;
  // The forward's routes and products: kept by ll_moe_forward for this layer and batch, or
  // computed again (deterministic: the same routes).
  const int rank = lo ? lo->one->rank : 0;
  if (keep >= 0 && keep < c->n_kept && c->kept[keep].y == y && c->kept[keep].T == T && c->kept[keep].rank == rank) {
    if ((rc = kept_io(c, keep, 1, y, T, rank, xn, err, errlen))) return rc;
    BK(ops->swiglu(be, c->h, c->g, c->u, (int64_t)T * k * Fe), "swiglu");
  } else if ((rc = train_experts(c, ops, y, lo, xn, T, err, errlen))) {
    return rc;
  }
  // out[t] = Σ_j w_j ye_j: dw_j = dy[t]·ye_j, dye_j = w_j dy[t]
  if (!c->host) { // on the device: dye by copies and scales, dw as one-row products read back (T·k floats)
    float *xs[1024], *ws[1024];
    for (int i0 = 0; i0 < T * k; i0 += 1024) {
      const int n = T * k - i0 < 1024 ? T * k - i0 : 1024;
      for (int i = i0; i < i0 + n; i++) {
        float *d = (float *)dy + (size_t)(i / k) * C, *g = c->dye + (size_t)c->rowof[i] * C;
        BK(ll_backend_copy(be, g, d, (size_t)C * sizeof(float)), "copy");
        BK(ops->scale(be, g, c->w[i], C), "scale");
        xs[i - i0] = d, ws[i - i0] = c->ye + (size_t)c->rowof[i] * C;
      }
      BK(row_dots(c, ops, c->dw + i0, xs, ws, n, C), "matmul dw");
    }
  }
  for (int i = 0; c->host && i < T * k; i++) {
    const float *d = dy + (size_t)(i / k) * C, *ye = c->ye + (size_t)c->rowof[i] * C;
    float *g = c->dye + (size_t)c->rowof[i] * C;
    double s = 0;
    for (int j = 0; j < C; j++) s += (double)d[j] * ye[j], g[j] = c->w[i] * d[j];
    c->dw[i] = (float)s;
  }
  // through the experts: dh = dye·down, (dg, du) = swiglu', dxg = dg·gate + du·up
  BK(ll_backend_zero(be, c->dh, (size_t)T * k * Fe * sizeof(float)), "zero");
  for (int e = 0; e < E; e++) {
    if (!c->cnt[e]) continue;
    BK(ops->matmul_backward(be, c->dh + (size_t)c->off[e] * Fe, gr && gr->down ? gr->down + e * FC : NULL, c->dye + (size_t)c->off[e] * C,
                            c->h + (size_t)c->off[e] * Fe, &y->down[e], c->cnt[e]),
       "matmul_backward expert down");
    if (lo && (rc = xlora_bwd(c, ops, lo, LL_LORA_DOWN_EXPS, e, c->dh, c->dye, c->h, Fe, C, c->off[e], c->cnt[e], err, errlen))) return rc;
  }
  BK(ops->swiglu_backward(be, c->h, c->d2, c->dh, c->g, c->u, (int64_t)T * k * Fe), "swiglu_backward"); // dg in h, du in d2
  BK(ll_backend_zero(be, c->dye, (size_t)T * k * C * sizeof(float)), "zero"); // now dxg
  for (int e = 0; e < E; e++) {
    if (!c->cnt[e]) continue;
    const size_t r = (size_t)c->off[e];
    BK(ops->matmul_backward(be, c->dye + r * C, gr && gr->gate ? gr->gate + e * FC : NULL, c->h + r * Fe, c->xg + r * C, &y->gate[e], c->cnt[e]),
       "matmul_backward expert gate");
    BK(ops->matmul_backward(be, c->dye + r * C, gr && gr->up ? gr->up + e * FC : NULL, c->d2 + r * Fe, c->xg + r * C, &y->up[e], c->cnt[e]),
       "matmul_backward expert up");
    if (lo && ((rc = xlora_bwd(c, ops, lo, LL_LORA_GATE_EXPS, e, c->dye, c->h, c->xg, C, Fe, c->off[e], c->cnt[e], err, errlen)) ||
               (rc = xlora_bwd(c, ops, lo, LL_LORA_UP_EXPS, e, c->dye, c->d2, c->xg, C, Fe, c->off[e], c->cnt[e], err, errlen))))
      return rc;
  }
  for (int r = 0; !c->host && r < T * k; r++) BK(ops->axpy(be, dxn + (size_t)c->src[r] * C, c->dye + (size_t)r * C, 1.0f, C), "axpy");
  for (int r = 0; c->host && r < T * k; r++) { // scattered back to the tokens
    float *d = dxn + (size_t)c->src[r] * C;
    const float *g = c->dye + (size_t)r * C;
    for (int j = 0; j < C; j++) d[j] += g[j];
  }
  // through the routing weights to the router's logits:
  // w_j = sc·p_j / S (S = Σ_chosen p, when renormalized), p = softmax(logits)
  // and (full mode) the auxiliary loss coef·E·Σ_i f_i·P_i, P_i = Σ_t p_t,i / T: ∂/∂p_t,i = coef·E·f_i / T
  const float sc = m->moe_w_scale != 0.0f && m->moe_w_scale != 1.0f ? m->moe_w_scale : 1.0f;
  const int aux = gr && gr->aux_coef > 0;
  double Pm[1024] = {0};
  for (int t = 0; t < T; t++) {
    const float *x = c->hlog + (size_t)t * E;
    float mx = -INFINITY;
    for (int i = 0; i < E; i++) mx = x[i] > mx ? x[i] : mx;
    const double z = ll_cpu_softmax(c->probs, x, mx, E);
    double S = 0, dS = 0, dp[1024] = {0}, pd = 0;
    for (int i = 0; i < E; i++) c->probs[i] = (float)(c->probs[i] / z);
    for (int j = 0; j < k; j++) S += c->probs[c->sel[t * k + j]];
    const int norm = m->moe_norm_w && S >= 6.103515625e-5;
    for (int j = 0; j < k; j++) dS += (double)c->dw[t * k + j] * c->probs[c->sel[t * k + j]];
    for (int j = 0; j < k; j++) dp[c->sel[t * k + j]] = sc * (norm ? c->dw[t * k + j] / S - dS / (S * S) : (m->moe_norm_w ? c->dw[t * k + j] / 6.103515625e-5 : c->dw[t * k + j]));
    for (int i = 0; aux && i < E; i++) { // f_i = cnt_i / (T·k)
      const double f = (double)c->cnt[i] / ((double)T * k);
      dp[i] += (double)gr->aux_w * gr->aux_coef * E * f / T;
      Pm[i] += c->probs[i];
    }
    for (int i = 0; i < E; i++) pd += c->probs[i] * dp[i];
    for (int i = 0; i < E; i++) c->dlog[(size_t)t * E + i] = (float)(c->probs[i] * (dp[i] - pd));
  }
  if (aux) {
    double a = 0;
    for (int i = 0; i < E; i++) a += (double)c->cnt[i] / ((double)T * k) * (Pm[i] / T);
    c->aux += gr->aux_coef * E * a;
  }
  BK(ops->matmul_backward(be, dxn, gr ? gr->router : NULL, c->dlog, xn, &y->router, T), "matmul_backward router");
  if (Fs <= 0 || !y->sh_gate.data) return 0;
  // qwen2moe's shared expert: out += σ(v) s, s = down(silu(g)·u), v = xn·r
  float *const o[2] = {c->sg, c->su};
  const struct ll_weight *const w[2] = {&y->sh_gate, &y->sh_up};
  BK(ll_backend_matmul_n(be, 2, o, xn, w, T), "matmul shared gate, up");
  if (lo && ((rc = xlora_fwd(c, ops, lo, LL_LORA_GATE_SHEXP, 0, xn, C, c->sg, Fs, 0, T, err, errlen)) ||
             (rc = xlora_fwd(c, ops, lo, LL_LORA_UP_SHEXP, 0, xn, C, c->su, Fs, 0, T, err, errlen))))
    return rc;
  BK(ops->swiglu(be, c->sh, c->sg, c->su, (int64_t)T * Fs), "swiglu");
  BK(ops->matmul(be, c->sy, c->sh, &y->sh_down, T, 0), "matmul shared down");
  if (lo && (rc = xlora_fwd(c, ops, lo, LL_LORA_DOWN_SHEXP, 0, c->sh, Fs, c->sy, C, 0, T, err, errlen))) return rc;
  BK(ops->matmul(be, c->sgate, xn, &y->sh_router, T, 0), "matmul shared gate logit");
  if (!c->host) { // the gate logits and ds = dy[t]·s[t] read back (2·T floats); dsy = σ dy[t] by copies and scales
    BK(ll_backend_copy(be, c->hsg, c->sgate, (size_t)T * sizeof(float)), "copy");
    float *xs[1024], *ws[1024];
    for (int t0 = 0; t0 < T; t0 += 1024) {
      const int n = T - t0 < 1024 ? T - t0 : 1024;
      for (int t = t0; t < t0 + n; t++) {
        const float v = c->hsg[t], sig = 1.0f / (1.0f + expf(-v));
        float *d = (float *)dy + (size_t)t * C;
        BK(ll_backend_copy(be, c->dsy + (size_t)t * C, d, (size_t)C * sizeof(float)), "copy");
        BK(ops->scale(be, c->dsy + (size_t)t * C, sig, C), "scale");
        xs[t - t0] = d, ws[t - t0] = c->sy + (size_t)t * C;
      }
      BK(row_dots(c, ops, c->dw + t0, xs, ws, n, C), "matmul dv");
    }
    for (int t = 0; t < T; t++) {
      const float v = c->hsg[t], sig = 1.0f / (1.0f + expf(-v));
      c->dv[t] = (float)((double)c->dw[t] * sig * (1.0f - sig));
    }
  }
  for (int t = 0; c->host && t < T; t++) {
    const float v = c->sgate[t], sig = 1.0f / (1.0f + expf(-v));
    const float *d = dy + (size_t)t * C, *s = c->sy + (size_t)t * C;
    double ds = 0;
    for (int j = 0; j < C; j++) ds += (double)d[j] * s[j], c->dsy[(size_t)t * C + j] = sig * d[j];
    c->dv[t] = (float)(ds * sig * (1.0f - sig));
  }
  BK(ll_backend_zero(be, c->dsh, (size_t)T * Fs * sizeof(float)), "zero");
  BK(ops->matmul_backward(be, c->dsh, gr ? gr->sh_down : NULL, c->dsy, c->sh, &y->sh_down, T), "matmul_backward shared down");
  if (lo && (rc = xlora_bwd(c, ops, lo, LL_LORA_DOWN_SHEXP, 0, c->dsh, c->dsy, c->sh, Fs, C, 0, T, err, errlen))) return rc;
  BK(ops->swiglu_backward(be, c->dsg, c->dsu, c->dsh, c->sg, c->su, (int64_t)T * Fs), "swiglu_backward");
  BK(ops->matmul_backward(be, dxn, gr ? gr->sh_gate : NULL, c->dsg, xn, &y->sh_gate, T), "matmul_backward shared gate");
  BK(ops->matmul_backward(be, dxn, gr ? gr->sh_up : NULL, c->dsu, xn, &y->sh_up, T), "matmul_backward shared up");
  if (lo && ((rc = xlora_bwd(c, ops, lo, LL_LORA_GATE_SHEXP, 0, dxn, c->dsg, xn, C, Fs, 0, T, err, errlen)) ||
             (rc = xlora_bwd(c, ops, lo, LL_LORA_UP_SHEXP, 0, dxn, c->dsu, xn, C, Fs, 0, T, err, errlen))))
    return rc;
  BK(ops->matmul_backward(be, dxn, gr ? gr->sh_router : NULL, c->dv, xn, &y->sh_router, T), "matmul_backward shared gate logit");
  return 0;
}
