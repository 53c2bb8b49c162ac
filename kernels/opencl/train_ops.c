// train_ops.c - the OpenCL backend's training members (train.cl): every backward op, attention
// train, softmax_xent, dropout, sumsq, axpy, scale, AdamW, and sync.

#include "ocl_internal.h"

// ---------------------------------------------------------------- training ops (train.cl)
// As the forward ops: backend buffers are computed on in place; host operands are uploaded
// into staging buffers and host results read back (blocking). Accumulating outputs (dx, dw,
// dg, ...) are in-out operands (put).

// An op's error return: uploads enqueued before the failure still read the caller's memory
// (they are non-blocking), so wait for them before the caller may reuse or free it.
int ocl_fail(struct ocl_ctx *c, int rc) {
  ocl_finish(c);
  return rc;
}

// a * b floats in bytes, checked in int64 before any size_t use: negative counts are
// LL_EINVAL, more than one device allocation LL_ENOMEM.
int ocl_fbytes(const struct ocl_ctx *c, int64_t a, int64_t b, size_t *out) {
  if (a < 0 || b < 0) return LL_EINVAL;
  if (a && b > INT64_MAX / 4 / a) return LL_ENOMEM;
  const int64_t n = a * b * 4;
  if (n > c->max_alloc) return LL_ENOMEM;
  *out = (size_t)n;
  return 0;
}

int ocl_float_type(int type) { return type == LL_TYPE_F32 ? 0 : type == LL_TYPE_F16 ? 1 : type == LL_TYPE_BF16 ? 2 : -1; }

// The fast tier's tiled products (train_fast.cl): work-groups of 16 x 16, global sizes rounded up.
#define RUP16(n) (((size_t)(n) + 15) / 16 * 16)
// mm_bwd_dx_qtiled's and lora_fwd_tiled's second global size: 16 work items per 64 tokens (RT 4)
#define TOK64(n) (((size_t)(n) + 63) / 64 * 16)
static const size_t TILE16[2] = {16, 16};

// A launch of one of train_fast.cl's kernels, counted (ll_backend_info.train_fast_launches: the
// tests' proof that the fast tier's training kernels ran).
static int tf_launch(struct ocl_ctx *c, cl_kernel k, cl_uint dims, const size_t *gl, const size_t *lo) {
  const int rc = ocl_launch(c, k, dims, gl, lo);
  if (rc == 0) c->train_fast_launches++;
  return rc;
}

// Rows of W dequantized per chunk of dx's product (f32 scratch of at most this many bytes).
#define DEQ_CHUNK_BYTES ((size_t)8 << 20)

int ocl_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x, const struct ll_weight *w,
                               int T) {
  struct ocl_ctx *c = CTX(b);
  if (!w || !dout || T < 0 || w->k <= 0 || w->n <= 0 || w->k > INT_MAX || w->n > INT_MAX) return LL_EINVAL;
  if (dw && (w->type != LL_TYPE_F32 || !x)) return LL_EINVAL;
  const int K = (int)w->k, N = (int)w->n, fl = ocl_float_type(w->type);
  if (fl < 0 && (ocl_act_type_mode(w->type) < 0 || K % 32)) return LL_EUNSUPPORTED;
  if (T == 0 || (!dx && !dw)) return 0;
  size_t ob, xb, wb = 0;
  int rc;
  // wb (dw's bytes) only when dw is asked for: a quantized W's f32 size may exceed one buffer.
  if ((rc = ocl_fbytes(c, T, N, &ob)) || (rc = ocl_fbytes(c, T, K, &xb)) || (dw && (rc = ocl_fbytes(c, N, K, &wb)))) return ocl_fail(c, rc);
  if ((rc = ocl_put(c, S_B, dout, ob))) return ocl_fail(c, rc); // (T, N)
  cl_int e = 0;
  if (dx) {
    cl_mem wm;
    if ((rc = ocl_weight_dev(c, w, &wm)) || (rc = ocl_put(c, S_A, dx, xb))) return ocl_fail(c, rc); // dx (T, K) accumulates
    cl_ulong rb = ll_row_size(w->type, w->k);
    if (c->train_tiled && fl != 0) { // the fast tier: W's tiles dequantized in local memory, one launch
      const int wt = w->type;
      cl_kernel k = c->k_mm_dx_qt;
      e |= ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, wm) | ARG(k, 3, rb) | ARG(k, 4, T) | ARG(k, 5, N) | ARG(k, 6, K);
      e |= ARG(k, 7, wt) | ARG(k, 8, fl);
      const size_t gl[2] = {RUP16(K), TOK64(T)};
      if (e || (rc = tf_launch(c, k, 2, gl, TILE16))) return ocl_fail(c, e ? LL_EIO : rc);
      goto dx_done;
    }
    // F32 rows are read in place (one chunk of all N); other types are dequantized nc rows at a
    // time into S_SCR, each chunk's product continuing the sums in dx (the reference's n order).
    int nc = N;
    if (fl != 0) {
      const size_t per = DEQ_CHUNK_BYTES / ((size_t)K * 4);
      nc = per < 1 ? 1 : per < (size_t)N ? (int)per : N;
      if ((rc = ocl_stage(c, S_SCR, (size_t)nc * K * 4))) return ocl_fail(c, rc);
    }
    const int wt = w->type;
    for (int n0 = 0; n0 < N; n0 += nc) {
      const int cnt = N - n0 < nc ? N - n0 : nc;
      cl_mem wf = wm;
      if (fl != 0) {
        cl_kernel k = c->k_deq;
        e |= ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_SCR].use) | ARG(k, 3, K) | ARG(k, 4, n0) | ARG(k, 5, cnt) | ARG(k, 6, wt) | ARG(k, 7, fl);
        const size_t g = fl > 0 ? (size_t)cnt * K : (size_t)cnt * (K / 32);
        if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
        wf = c->s[S_SCR].use;
      }
      cl_kernel k = c->train_tiled ? c->k_mm_dx_t : c->k_mm_dx;
      e |= ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, wf) | ARG(k, 3, T) | ARG(k, 4, N) | ARG(k, 5, K) | ARG(k, 6, n0);
      e |= ARG(k, 7, cnt);
      const size_t gl[2] = {c->train_tiled ? RUP16(K) : (size_t)K, c->train_tiled ? RUP16(T) : (size_t)T};
      if (e || (rc = c->train_tiled ? tf_launch(c, k, 2, gl, TILE16) : ocl_launch(c, k, 2, gl, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
    }
  }
dx_done:
  if (dw) {
    if ((rc = ocl_put(c, S_X, x, xb)) || (rc = ocl_put(c, S_C, dw, wb))) return ocl_fail(c, rc); // x (T, K), dw (N, K) accumulates
    cl_kernel k = c->train_tiled ? c->k_mm_dw_t : c->k_mm_dw;
    e |= ARG(k, 0, c->s[S_C].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, c->s[S_X].use) | ARG(k, 3, T) | ARG(k, 4, N) | ARG(k, 5, K);
    const size_t gl[2] = {c->train_tiled ? RUP16(K) : (size_t)K, c->train_tiled ? RUP16(N) : (size_t)N};
    if (e || (rc = c->train_tiled ? tf_launch(c, k, 2, gl, TILE16) : ocl_launch(c, k, 2, gl, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  }
  if (dx && (rc = ocl_get(c, S_A, dx, xb))) return ocl_fail(c, rc);
  if (dw && (rc = ocl_get(c, S_C, dw, wb))) return ocl_fail(c, rc);
  return 0;
}

int ocl_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g, int T, int C,
                                float eps) {
  struct ocl_ctx *c = CTX(b);
  if (!dout || !x || !g || T < 0 || C <= 0) return LL_EINVAL;
  if (T == 0 || (!dx && !dg)) return 0;
  size_t xb, gb, sb;
  int rc;
  if ((rc = ocl_fbytes(c, T, C, &xb)) || (rc = ocl_fbytes(c, C, 1, &gb)) || (rc = ocl_fbytes(c, T, 1, &sb))) return ocl_fail(c, rc);
  if ((rc = ocl_put(c, S_X, x, xb)) || (rc = ocl_put(c, S_B, dout, xb)) || (rc = ocl_put_const(c, S_C, g, gb)) || (rc = ocl_stage(c, S_D, sb))) return ocl_fail(c, rc);
  if (dx && (rc = ocl_put(c, S_A, dx, xb))) return ocl_fail(c, rc);                                 // (T, C) accumulates
  if (!dx && (rc = ocl_stage(c, S_A, 16))) return ocl_fail(c, rc);                                  // unused argument
  const int want_dx = dx != NULL;
  cl_kernel k = c->k_rms_bwd;
  cl_int e = ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_D].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, c->s[S_X].use) | ARG(k, 4, c->s[S_C].use);
  e |= ARG(k, 5, C) | ARG(k, 6, eps) | ARG(k, 7, want_dx);
  const size_t gl = (size_t)T * WG, lo = WG;
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo))) return ocl_fail(c, e ? LL_EIO : rc);
  if (dg) { // (C) accumulates; needs every row's s_t (S_D) from the kernel above
    if ((rc = ocl_put(c, S_E, dg, gb))) return ocl_fail(c, rc);
    k = c->k_rms_dg;
    e = ARG(k, 0, c->s[S_E].use) | ARG(k, 1, c->s[S_D].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, c->s[S_X].use) | ARG(k, 4, T) | ARG(k, 5, C);
    const size_t g1 = (size_t)C;
    if (e || (rc = ocl_launch(c, k, 1, &g1, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  }
  if (dx && (rc = ocl_get(c, S_A, dx, xb))) return ocl_fail(c, rc);
  if (dg && (rc = ocl_get(c, S_E, dg, gb))) return ocl_fail(c, rc);
  return 0;
}

int ocl_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim,
                             const struct ll_rope_params *p) {
  struct ocl_ctx *c = CTX(b);
  if (!dx || !pos || !p || T < 0 || n_head <= 0 || p->n_rot < 0 || p->n_rot % 2 || p->n_rot > head_dim) return LL_EINVAL;
  const int np = p->n_rot / 2;
  if (T == 0 || np == 0) return 0;
  size_t xb, tb;
  int rc;
  if ((rc = ocl_fbytes(c, (int64_t)T * n_head, head_dim, &xb)) || (rc = ocl_fbytes(c, T, np, &tb))) return ocl_fail(c, rc);
  float *ct, *st;
  if ((rc = ocl_rope_tables(c, pos, T, p, &ct, &st))) return ocl_fail(c, rc);
  if ((rc = ocl_put(c, S_X, dx, xb)) || (rc = ocl_put_const(c, S_A, ct, tb)) || (rc = ocl_put_const(c, S_B, st, tb))) return ocl_fail(c, rc);
  cl_kernel k = c->k_rope_bwd;
  const int neox = p->mode == LL_ROPE_NEOX;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, T) | ARG(k, 4, n_head);
  e |= ARG(k, 5, head_dim) | ARG(k, 6, np) | ARG(k, 7, neox);
  const size_t g = (size_t)T * n_head * np;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  return ocl_get(c, S_X, dx, xb);
}

// dgate, dup (n) of a gated activation's out = act(gate) up: kernel k (swiglu_bwd, geglu_bwd)
static int glu_backward(struct ll_backend *b, cl_kernel k, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                        int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!dgate || !dup || !dout || !gate || !up || n < 0) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = ocl_fbytes(c, n, 1, &nb))) return ocl_fail(c, rc);
  // Outputs in their own buffers: dgate / dup may alias the inputs (element-wise).
  if ((rc = ocl_put(c, S_A, gate, nb)) || (rc = ocl_put(c, S_B, up, nb)) || (rc = ocl_put(c, S_C, dout, nb)) || (rc = ocl_output(c, S_D, dgate, nb)) ||
      (rc = ocl_output(c, S_E, dup, nb)))
    return ocl_fail(c, rc);
  cl_long ln = n;
  cl_int e = ARG(k, 0, c->s[S_D].use) | ARG(k, 1, c->s[S_E].use) | ARG(k, 2, c->s[S_C].use) | ARG(k, 3, c->s[S_A].use) | ARG(k, 4, c->s[S_B].use);
  e |= ARG(k, 5, ln);
  const size_t g = (size_t)n;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_D, dgate, nb))) return ocl_fail(c, rc);
  return ocl_get(c, S_E, dup, nb);
}
int ocl_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n) {
  return glu_backward(b, CTX(b)->k_swiglu_bwd, dgate, dup, dout, gate, up, n);
}
// Gemma 3's GeGLU (train_window.cl): the same on both tiers (element-wise, nothing to tile)
int ocl_geglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n) {
  return glu_backward(b, CTX(b)->k_geglu_bwd, dgate, dup, dout, gate, up, n);
}

int ocl_attn_check(int S, int H, int Hkv, int hd) { return S < 0 || H <= 0 || Hkv <= 0 || hd <= 0 || H % Hkv ? LL_EINVAL : 0; }
// Bytes of training attention's q/out (S, H, hd), k/v (S, Hkv, hd) and probabilities (H, S, S).
int ocl_attn_bytes(const struct ocl_ctx *c, int S, int H, int Hkv, int hd, size_t *qb, size_t *kb, size_t *ab) {
  int rc;
  if ((rc = ocl_fbytes(c, (int64_t)S * H, hd, qb)) || (rc = ocl_fbytes(c, (int64_t)S * Hkv, hd, kb)) || (rc = ocl_fbytes(c, (int64_t)H * S, S, ab))) return rc;
  return 0;
}

// The fast tier's attention (train_fast.cl): C[b] = alpha A[b] · B[b] + beta C[b] over `batch`
// heads (gemm_tiled's arguments: element offsets, per-batch strides, kv-head sharing, transposes).
struct gemm_op {
  cl_mem C, A, B;
  int M, N, K, lda, ldb, ldc;
  cl_long offA, offB, offC, bsA, bsB, bsC;
  int divA, divB, ta, tb;
  float alpha, beta;
  int causal; // train_fast.cl gemm_tiled's: 0 none, 1 skip tiles right of the diagonal, 2 k <= m, 3 k >= m
};
static int gemm_tiled(struct ocl_ctx *c, const struct gemm_op *g, int batch) {
  cl_kernel k = c->k_gemm_t;
  cl_int e = ARG(k, 0, g->C) | ARG(k, 1, g->A) | ARG(k, 2, g->B) | ARG(k, 3, g->M) | ARG(k, 4, g->N) | ARG(k, 5, g->K) | ARG(k, 6, g->lda);
  e |= ARG(k, 7, g->ldb) | ARG(k, 8, g->ldc) | ARG(k, 9, g->offA) | ARG(k, 10, g->offB) | ARG(k, 11, g->offC) | ARG(k, 12, g->bsA);
  e |= ARG(k, 13, g->bsB) | ARG(k, 14, g->bsC) | ARG(k, 15, g->divA) | ARG(k, 16, g->divB) | ARG(k, 17, g->ta) | ARG(k, 18, g->tb);
  e |= ARG(k, 19, g->alpha) | ARG(k, 20, g->beta) | ARG(k, 21, g->causal);
  const size_t gl[3] = {RUP16(g->N), RUP16(g->M), (size_t)batch}, lo[3] = {16, 16, 1};
  return e ? LL_EIO : tf_launch(c, k, 3, gl, lo);
}
// attn_rows_softmax (window: 0 causal) or attn_rows_ds (b: the probabilities) over the (H S) rows of a
static int attn_rows(struct ocl_ctx *c, cl_kernel k, cl_mem a, cl_mem b, int S, int H, float scale, int window) {
  cl_int e = ARG(k, 0, a);
  if (b) e |= ARG(k, 1, b) | ARG(k, 2, S) | ARG(k, 3, scale);
  else e |= ARG(k, 1, S) | ARG(k, 2, window);
  const size_t gl = (size_t)H * S * WG, lo = WG;
  return e ? LL_EIO : tf_launch(c, k, 1, &gl, &lo);
}

// window > 0 (attention_train_swa, a local layer's): query i sees keys (i - window, i] only, on
// both tiers (a parameter of attn_train and attn_rows_softmax); else causal over 0..i.
static int attention_train_win(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S, int n_head,
                               int n_head_kv, int head_dim, float scale, int window) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !att || !q || !k || !v || ocl_attn_check(S, n_head, n_head_kv, head_dim)) return LL_EINVAL;
  if (S == 0) return 0;
  size_t qb, kb, ab;
  int rc;
  if ((rc = ocl_attn_bytes(c, S, n_head, n_head_kv, head_dim, &qb, &kb, &ab))) return ocl_fail(c, rc);
  if ((rc = ocl_put(c, S_X, q, qb)) || (rc = ocl_put(c, S_A, k, kb)) || (rc = ocl_put(c, S_B, v, kb)) || (rc = ocl_output(c, S_OUT, out, qb)) ||
      (rc = ocl_output(c, S_SCR, att, ab)))
    return ocl_fail(c, rc);
  if (c->train_tiled) {
    // att[h] = scale q_h · k_khᵀ; causal softmax per row; out_h = att[h] · v_kh
    const int H = n_head, Hkv = n_head_kv, hd = head_dim, grp = H / Hkv;
    const cl_long SS = (cl_long)S * S;
    const struct gemm_op sc = {c->s[S_SCR].use, c->s[S_X].use, c->s[S_A].use, S, S, hd, H * hd, Hkv * hd, S, 0, 0, 0, hd, hd, SS, 1, grp, 0, 1,
                               scale, 0.0f, 1};
    const struct gemm_op pv = {c->s[S_OUT].use, c->s[S_SCR].use, c->s[S_B].use, S, hd, S, S, Hkv * hd, H * hd, 0, 0, 0, SS, hd, hd, 1, grp, 0, 0,
                               1.0f, 0.0f, 2};
    if ((rc = gemm_tiled(c, &sc, H)) || (rc = attn_rows(c, c->k_attn_rows_sm, c->s[S_SCR].use, NULL, S, H, 0, window)) ||
        (rc = gemm_tiled(c, &pv, H)))
      return ocl_fail(c, rc);
    if ((rc = ocl_get(c, S_OUT, out, qb))) return ocl_fail(c, rc);
    return ocl_get(c, S_SCR, att, ab);
  }
  cl_kernel kk = c->k_attn_train;
  cl_int e = ARG(kk, 0, c->s[S_OUT].use) | ARG(kk, 1, c->s[S_SCR].use) | ARG(kk, 2, c->s[S_X].use) | ARG(kk, 3, c->s[S_A].use) | ARG(kk, 4, c->s[S_B].use);
  e |= ARG(kk, 5, S) | ARG(kk, 6, n_head) | ARG(kk, 7, n_head_kv) | ARG(kk, 8, head_dim) | ARG(kk, 9, scale) | ARG(kk, 10, window);
  const size_t gl = (size_t)S * n_head * WG, lo = WG;
  if (e || (rc = ocl_launch(c, kk, 1, &gl, &lo))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_OUT, out, qb))) return ocl_fail(c, rc);
  return ocl_get(c, S_SCR, att, ab);
}
int ocl_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S, int n_head,
                        int n_head_kv, int head_dim, float scale) {
  return attention_train_win(b, out, att, q, k, v, S, n_head, n_head_kv, head_dim, scale, 0);
}
int ocl_attention_train_swa(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S, int n_head,
                            int n_head_kv, int head_dim, float scale, int window) {
  return attention_train_win(b, out, att, q, k, v, S, n_head, n_head_kv, head_dim, scale, window > 0 && window < S ? window : 0);
}

int ocl_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                  const float *v, const float *att, int S, int n_head, int n_head_kv, int head_dim, float scale) {
  struct ocl_ctx *c = CTX(b);
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !att || ocl_attn_check(S, n_head, n_head_kv, head_dim)) return LL_EINVAL;
  if (S == 0) return 0;
  size_t qb, kb, ab;
  int rc;
  if ((rc = ocl_attn_bytes(c, S, n_head, n_head_kv, head_dim, &qb, &kb, &ab))) return ocl_fail(c, rc);
  // dout (S, H, hd) in S_C, q in S_X, k, v (S, Hkv, hd) in S_A, S_B, att (H, S, S) in S_SCR;
  // ds (H, S, S) scratch in S_D; dq, dk, dv (all overwritten) in S_OUT, S_E, S_F.
  if ((rc = ocl_put(c, S_C, dout, qb)) || (rc = ocl_put(c, S_X, q, qb)) || (rc = ocl_put(c, S_A, k, kb)) || (rc = ocl_put(c, S_B, v, kb)) ||
      (rc = ocl_put(c, S_SCR, att, ab)) || (rc = ocl_stage(c, S_D, ab)) || (rc = ocl_output(c, S_OUT, dq, qb)) || (rc = ocl_output(c, S_E, dk, kb)) ||
      (rc = ocl_output(c, S_F, dv, kb)))
    return ocl_fail(c, rc);
  if (c->train_tiled) {
    // ds[h] = dout_h · v_khᵀ, then per row p (ds - D) scale; dq_h = ds[h] · k_kh;
    // dv_kh = Σ_g att[h]ᵀ · dout_h, dk_kh = Σ_g ds[h]ᵀ · q_h (h = kh grp + g, in head order)
    const int H = n_head, Hkv = n_head_kv, hd = head_dim, grp = H / Hkv;
    const cl_long SS = (cl_long)S * S;
    const struct gemm_op dp = {c->s[S_D].use, c->s[S_C].use, c->s[S_B].use, S, S, hd, H * hd, Hkv * hd, S, 0, 0, 0, hd, hd, SS, 1, grp, 0, 1,
                               1.0f, 0.0f, 1};
    const struct gemm_op gq = {c->s[S_OUT].use, c->s[S_D].use, c->s[S_A].use, S, hd, S, S, Hkv * hd, H * hd, 0, 0, 0, SS, hd, hd, 1, grp, 0, 0,
                               1.0f, 0.0f, 2};
    if ((rc = gemm_tiled(c, &dp, H)) || (rc = attn_rows(c, c->k_attn_rows_ds, c->s[S_D].use, c->s[S_SCR].use, S, H, scale, 0)) ||
        (rc = gemm_tiled(c, &gq, H)))
      return ocl_fail(c, rc);
    for (int g = 0; g < grp; g++) {
      const struct gemm_op gv = {c->s[S_F].use, c->s[S_SCR].use, c->s[S_C].use, S, hd, S, S, H * hd, Hkv * hd, g * SS, (cl_long)g * hd, 0,
                                 grp * SS, (cl_long)grp * hd, hd, 1, 1, 1, 0, 1.0f, g ? 1.0f : 0.0f, 3};
      struct gemm_op gk = gv;
      gk.C = c->s[S_E].use, gk.A = c->s[S_D].use, gk.B = c->s[S_X].use;
      if ((rc = gemm_tiled(c, &gv, Hkv)) || (rc = gemm_tiled(c, &gk, Hkv))) return ocl_fail(c, rc);
    }
    if ((rc = ocl_get(c, S_OUT, dq, qb)) || (rc = ocl_get(c, S_E, dk, kb))) return ocl_fail(c, rc);
    return ocl_get(c, S_F, dv, kb);
  }
  cl_kernel kk = c->k_attn_bwd_q;
  cl_int e = ARG(kk, 0, c->s[S_OUT].use) | ARG(kk, 1, c->s[S_D].use) | ARG(kk, 2, c->s[S_C].use) | ARG(kk, 3, c->s[S_X].use) | ARG(kk, 4, c->s[S_A].use);
  e |= ARG(kk, 5, c->s[S_B].use) | ARG(kk, 6, c->s[S_SCR].use) | ARG(kk, 7, S) | ARG(kk, 8, n_head) | ARG(kk, 9, n_head_kv) | ARG(kk, 10, head_dim);
  e |= ARG(kk, 11, scale);
  const size_t gl = (size_t)S * n_head * WG, lo = WG;
  if (e || (rc = ocl_launch(c, kk, 1, &gl, &lo))) return ocl_fail(c, e ? LL_EIO : rc);
  kk = c->k_attn_bwd_kv;
  e = ARG(kk, 0, c->s[S_E].use) | ARG(kk, 1, c->s[S_F].use) | ARG(kk, 2, c->s[S_D].use) | ARG(kk, 3, c->s[S_C].use) | ARG(kk, 4, c->s[S_X].use);
  e |= ARG(kk, 5, c->s[S_SCR].use) | ARG(kk, 6, S) | ARG(kk, 7, n_head) | ARG(kk, 8, n_head_kv) | ARG(kk, 9, head_dim);
  const size_t g2 = (size_t)S * n_head_kv * head_dim;
  if (e || (rc = ocl_launch(c, kk, 1, &g2, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_OUT, dq, qb)) || (rc = ocl_get(c, S_E, dk, kb))) return ocl_fail(c, rc);
  return ocl_get(c, S_F, dv, kb);
}

// Flash-style training attention (train_flash.cl): one launch forward, two backward; the
// probabilities never reach memory. window <= 0 or >= S: causal over 0..i.
#define FLASH_HD_MAX 256 // train_flash.cl's FD_MAX
static int flash_check(const struct ocl_ctx *c, int S, int H, int Hkv, int hd) {
  if (ocl_attn_check(S, H, Hkv, hd)) return LL_EINVAL;
  return !c->train_tiled || !c->k_flash_fwd || hd > FLASH_HD_MAX ? LL_EUNSUPPORTED : 0;
}
// the kernels' common tail: S, H, Hkv, hd, scale, window from argument i0 on
static cl_int flash_args(struct ocl_ctx *c, cl_kernel k, cl_uint i0, int S, int H, int Hkv, int hd, float scale, int window) {
  return ARG(k, i0, S) | ARG(k, i0 + 1, H) | ARG(k, i0 + 2, Hkv) | ARG(k, i0 + 3, hd) | ARG(k, i0 + 4, scale) | ARG(k, i0 + 5, window);
}

int ocl_attention_train_flash(struct ll_backend *b, float *out, float *lse, const float *q, const float *k, const float *v, int S, int n_head,
                              int n_head_kv, int head_dim, float scale, int window) {
  struct ocl_ctx *c = CTX(b);
  int rc = flash_check(c, S, n_head, n_head_kv, head_dim);
  if (rc || S == 0) return rc;
  if (!out || !lse || !q || !k || !v) return LL_EINVAL;
  window = window > 0 && window < S ? window : 0;
  size_t qb, kb, lb;
  if ((rc = ocl_fbytes(c, (int64_t)S * n_head, head_dim, &qb)) || (rc = ocl_fbytes(c, (int64_t)S * n_head_kv, head_dim, &kb)) ||
      (rc = ocl_fbytes(c, n_head, S, &lb)))
    return ocl_fail(c, rc);
  // q (S, H, hd) in S_X, k, v (S, Hkv, hd) in S_A, S_B; out in S_OUT, lse (H, S) in S_SCR
  if ((rc = ocl_put(c, S_X, q, qb)) || (rc = ocl_put(c, S_A, k, kb)) || (rc = ocl_put(c, S_B, v, kb)) || (rc = ocl_output(c, S_OUT, out, qb)) ||
      (rc = ocl_output(c, S_SCR, lse, lb)))
    return ocl_fail(c, rc);
  cl_kernel kk = c->k_flash_fwd;
  cl_int e = ARG(kk, 0, c->s[S_OUT].use) | ARG(kk, 1, c->s[S_SCR].use) | ARG(kk, 2, c->s[S_X].use) | ARG(kk, 3, c->s[S_A].use) | ARG(kk, 4, c->s[S_B].use);
  e |= flash_args(c, kk, 5, S, n_head, n_head_kv, head_dim, scale, window);
  const size_t gl[2] = {RUP16(S), (size_t)16 * n_head};
  if (e || (rc = tf_launch(c, kk, 2, gl, TILE16))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_OUT, out, qb))) return ocl_fail(c, rc);
  return ocl_get(c, S_SCR, lse, lb);
}

int ocl_attention_backward_flash(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                 const float *v, const float *out, const float *lse, int S, int n_head, int n_head_kv, int head_dim, float scale,
                                 int window) {
  struct ocl_ctx *c = CTX(b);
  int rc = flash_check(c, S, n_head, n_head_kv, head_dim);
  if (rc || S == 0) return rc;
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse) return LL_EINVAL;
  window = window > 0 && window < S ? window : 0;
  size_t qb, kb, lb;
  if ((rc = ocl_fbytes(c, (int64_t)S * n_head, head_dim, &qb)) || (rc = ocl_fbytes(c, (int64_t)S * n_head_kv, head_dim, &kb)) ||
      (rc = ocl_fbytes(c, n_head, S, &lb)))
    return ocl_fail(c, rc);
  // dout, out (S, H, hd) in S_C, S_D, q in S_X, k, v (S, Hkv, hd) in S_A, S_B, lse (H, S) in
  // S_SCR; D (H, S) scratch in S_TAB; dq, dk, dv (all overwritten) in S_OUT, S_E, S_F.
  if ((rc = ocl_put(c, S_C, dout, qb)) || (rc = ocl_put(c, S_D, out, qb)) || (rc = ocl_put(c, S_X, q, qb)) || (rc = ocl_put(c, S_A, k, kb)) ||
      (rc = ocl_put(c, S_B, v, kb)) || (rc = ocl_put(c, S_SCR, lse, lb)) || (rc = ocl_stage(c, S_TAB, lb)) || (rc = ocl_output(c, S_OUT, dq, qb)) ||
      (rc = ocl_output(c, S_E, dk, kb)) || (rc = ocl_output(c, S_F, dv, kb)))
    return ocl_fail(c, rc);
  cl_kernel kk = c->k_flash_dq;
  cl_int e = ARG(kk, 0, c->s[S_OUT].use) | ARG(kk, 1, c->s[S_TAB].use) | ARG(kk, 2, c->s[S_C].use) | ARG(kk, 3, c->s[S_D].use) | ARG(kk, 4, c->s[S_X].use);
  e |= ARG(kk, 5, c->s[S_A].use) | ARG(kk, 6, c->s[S_B].use) | ARG(kk, 7, c->s[S_SCR].use) | flash_args(c, kk, 8, S, n_head, n_head_kv, head_dim, scale, window);
  const size_t gq[2] = {RUP16(S), (size_t)16 * n_head}, gk[2] = {RUP16(S), (size_t)16 * n_head_kv};
  if (e || (rc = tf_launch(c, kk, 2, gq, TILE16))) return ocl_fail(c, e ? LL_EIO : rc);
  kk = c->k_flash_dkv; // after dq's: reads its D
  e = ARG(kk, 0, c->s[S_E].use) | ARG(kk, 1, c->s[S_F].use) | ARG(kk, 2, c->s[S_C].use) | ARG(kk, 3, c->s[S_X].use) | ARG(kk, 4, c->s[S_A].use);
  e |= ARG(kk, 5, c->s[S_B].use) | ARG(kk, 6, c->s[S_SCR].use) | ARG(kk, 7, c->s[S_TAB].use) | flash_args(c, kk, 8, S, n_head, n_head_kv, head_dim, scale, window);
  if (e || (rc = tf_launch(c, kk, 2, gk, TILE16))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_OUT, dq, qb)) || (rc = ocl_get(c, S_E, dk, kb))) return ocl_fail(c, rc);
  return ocl_get(c, S_F, dv, kb);
}

int ocl_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets, int T, int V,
                            float grad_scale) {
  struct ocl_ctx *c = CTX(b);
  if (!loss || !logits || !targets || T < 0 || V <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (targets[t] >= V) return LL_EINVAL; // before anything is written
  if (T == 0) {
    *loss = 0;
    return 0;
  }
  size_t lb, rb;
  int rc;
  if ((rc = ocl_fbytes(c, T, V, &lb)) || (rc = ocl_fbytes(c, T, 4, &rb))) return ocl_fail(c, rc);
  float *rs = malloc(rb); // (T, 4): per row max, sum as hi + lo, the target's logit
  if (!rs) return LL_ENOMEM;
  const int want_d = dlogits != NULL;
  const struct rbuf *dr;
  size_t doff;
  // dlogits in a backend buffer (a training step): the statistics come back without a wait and
  // the loss is completed at the next drain (sync); otherwise now, with a blocking read.
  const int defer = want_d && ocl_resident(c, dlogits, lb, &dr, &doff) == 1;
  int32_t *tg = NULL;
  if (defer && c->n_pend == c->cap_pend) {
    const int cap = c->cap_pend ? 2 * c->cap_pend : 16;
    struct pending_loss *np = realloc(c->pend, (size_t)cap * sizeof *np);
    if (!np) {
      free(rs);
      return LL_ENOMEM;
    }
    c->pend = np, c->cap_pend = cap;
  }
  if (defer && !(tg = malloc((size_t)T * sizeof *tg))) {
    free(rs);
    return LL_ENOMEM;
  }
  if ((rc = ocl_put(c, S_X, logits, lb)) || (rc = ocl_put(c, S_POS, targets, (size_t)T * 4)) || (rc = want_d ? ocl_output(c, S_OUT, dlogits, lb) : ocl_stage(c, S_OUT, 16)) ||
      (rc = ocl_stage(c, S_TAB, rb))) {
    ocl_finish(c);
    free(rs), free(tg);
    return rc;
  }
  cl_kernel k = c->k_xent;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_TAB].use) | ARG(k, 2, c->s[S_X].use) | ARG(k, 3, c->s[S_POS].use) | ARG(k, 4, V);
  e |= ARG(k, 5, grad_scale) | ARG(k, 6, want_d);
  const size_t gl = (size_t)T * WG, lo = WG;
  if (!e && !(rc = ocl_launch(c, k, 1, &gl, &lo)) && defer) {
    c->bytes_down += (int64_t)rb;
    e = clEnqueueReadBuffer(c->q, c->s[S_TAB].use, CL_FALSE, 0, rb, rs, 0, NULL, NULL);
    if (e == CL_SUCCESS) {
      memcpy(tg, targets, (size_t)T * sizeof *tg);
      c->pend[c->n_pend++] = (struct pending_loss){loss, rs, tg, T};
      return ocl_get(c, S_OUT, dlogits, lb); // in place: nothing to do
    }
  }
  if (e || rc || (rc = ocl_get(c, S_TAB, rs, rb))) {
    ocl_finish(c);
    free(rs), free(tg);
    return ocl_fail(c, e ? LL_EIO : rc);
  }
  const double total = ocl_xent_loss(rs, targets, T);
  free(rs);
  // dlogits (it may alias logits: the kernel read each row before writing it)
  if (want_d && (rc = ocl_get(c, S_OUT, dlogits, lb))) return ocl_fail(c, rc);
  *loss = total;
  return 0;
}

int ocl_cmp_pair(const void *a, const void *b) {
  const int32_t *x = a, *y = b;
  return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

int ocl_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C) {
  struct ocl_ctx *c = CTX(b);
  if (!dw || !dout || !ids || T < 0 || C <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (ids[t] < 0) return LL_EINVAL;
  if (T == 0) return 0;
  size_t ob;
  int rc;
  if ((rc = ocl_fbytes(c, T, C, &ob))) return ocl_fail(c, rc);
  int max_id = 0;
  for (int t = 0; t < T; t++) max_id = ids[t] > max_id ? ids[t] : max_id;
  size_t wb;
  const struct rbuf *r;
  size_t off;
  if ((rc = ocl_fbytes(c, (int64_t)max_id + 1, C, &wb))) return ocl_fail(c, rc);
  const int in = ocl_resident(c, dw, wb, &r, &off);
  if (in < 0) return in;
  cl_kernel k = c->k_gr_bwd;
  cl_int e = 0;
  if (in) { // dw lives on the device: the kernel adds into its rows in place (slot[t] = ids[t])
    if ((rc = ocl_put(c, S_A, dw, wb)) || (rc = ocl_put(c, S_B, dout, ob)) || (rc = ocl_put(c, S_POS, ids, (size_t)T * 4))) return ocl_fail(c, rc);
    e = ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, c->s[S_POS].use) | ARG(k, 3, T) | ARG(k, 4, C);
    const size_t g = (size_t)C;
    if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
    return ocl_get(c, S_A, dw, wb);
  }
  // Host dw: its row count is not in the interface: only the distinct rows ids name go to the device,
  // (U, C) gathered here, slot[t] the row of token t, scattered back after.
  int32_t *pr = malloc((size_t)T * 2 * sizeof *pr), *slot = malloc((size_t)T * sizeof *slot), *row_of = malloc((size_t)T * sizeof *row_of);
  float *rows = malloc(ob);
  if (!pr || !slot || !row_of || !rows) {
    free(pr), free(slot), free(row_of), free(rows);
    return LL_ENOMEM;
  }
  for (int t = 0; t < T; t++) pr[2 * t] = ids[t], pr[2 * t + 1] = t;
  qsort(pr, (size_t)T, 2 * sizeof *pr, ocl_cmp_pair);
  int U = 0;
  for (int i = 0; i < T; i++) {
    if (i == 0 || pr[2 * i] != pr[2 * i - 2]) row_of[U++] = pr[2 * i];
    slot[pr[2 * i + 1]] = U - 1;
  }
  for (int u = 0; u < U; u++) memcpy(rows + (size_t)u * C, dw + (size_t)row_of[u] * C, (size_t)C * 4);
  const size_t ub = (size_t)U * C * 4;
  if (!(rc = ocl_put(c, S_A, rows, ub)) && !(rc = ocl_put(c, S_B, dout, ob)) && !(rc = ocl_put(c, S_POS, slot, (size_t)T * 4))) {
    e = ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, c->s[S_POS].use) | ARG(k, 3, T) | ARG(k, 4, C);
    const size_t g = (size_t)C;
    if (e) rc = LL_EIO;
    if (!rc) rc = ocl_launch(c, k, 1, &g, NULL);
    if (!rc) rc = ocl_get(c, S_A, rows, ub);
  }
  ocl_finish(c); // the read above blocked, except on an error path
  if (!rc)
    for (int u = 0; u < U; u++) memcpy(dw + (size_t)row_of[u] * C, rows + (size_t)u * C, (size_t)C * 4);
  free(pr), free(slot), free(row_of), free(rows);
  return rc;
}

int ocl_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !x || n < 0 || !(p >= 0.0f && p < 1.0f)) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = ocl_fbytes(c, n, 1, &nb)) || (rc = ocl_put(c, S_A, x, nb)) || (rc = ocl_output(c, S_OUT, out, nb))) return ocl_fail(c, rc);
  // The mask's parameters as the reference computes them (ll_cpu_train.h).
  cl_ulong sm = ll_mix64(seed);
  cl_uint th = ll_dropout_threshold(p);
  const float sc = 1.0f / (1.0f - p);
  cl_long ln = n;
  cl_kernel k = c->k_dropout;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, sm) | ARG(k, 3, th) | ARG(k, 4, sc) | ARG(k, 5, ln);
  const size_t g = (size_t)n;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  return ocl_get(c, S_OUT, out, nb);
}

#define SUMSQ_GROUPS 256 // partial sums read back (the host adds them in double)

int ocl_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !x || n < 0) return LL_EINVAL;
  if (n == 0) {
    *out = 0;
    return 0;
  }
  size_t nb;
  int rc;
  if ((rc = ocl_fbytes(c, n, 1, &nb)) || (rc = ocl_put(c, S_A, x, nb)) || (rc = ocl_stage(c, S_TAB, SUMSQ_GROUPS * 2 * sizeof(float)))) return ocl_fail(c, rc);
  const int64_t need = (n + WG - 1) / WG;
  const size_t ng = need < SUMSQ_GROUPS ? (size_t)need : SUMSQ_GROUPS;
  cl_long ln = n;
  cl_kernel k = c->k_sumsq;
  cl_int e = ARG(k, 0, c->s[S_TAB].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, ln);
  const size_t gl = ng * WG, lo = WG;
  float part[SUMSQ_GROUPS * 2];
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo)) || (rc = ocl_get(c, S_TAB, part, ng * 2 * sizeof(float)))) return ocl_fail(c, e ? LL_EIO : rc);
  double s = 0;
  for (size_t i = 0; i < ng; i++) s += (double)part[2 * i] + (double)part[2 * i + 1];
  *out = s;
  return 0;
}

int ocl_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !x || n < 0) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  // x may be out: both are uploaded from the caller's memory before the kernel writes.
  if ((rc = ocl_fbytes(c, n, 1, &nb)) || (rc = ocl_put(c, S_OUT, out, nb)) || (rc = ocl_put(c, S_A, x, nb))) return ocl_fail(c, rc);
  cl_long ln = n;
  cl_kernel k = c->k_axpy;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, alpha) | ARG(k, 3, ln);
  const size_t g = (size_t)n;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  return ocl_get(c, S_OUT, out, nb);
}

int ocl_scale(struct ll_backend *b, float *x, float alpha, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!x || n < 0) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = ocl_fbytes(c, n, 1, &nb)) || (rc = ocl_put(c, S_OUT, x, nb))) return ocl_fail(c, rc);
  cl_long ln = n;
  cl_kernel k = c->k_scale;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, alpha) | ARG(k, 2, ln);
  const size_t g = (size_t)n;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  return ocl_get(c, S_OUT, x, nb);
}

// AdamW (train.cl adamw) over n values, the weight decay on the first n_decay; fast: counted
// as the fast tier's launch (adamw_split's, the whole arena at once)
static int adamw_run(struct ocl_ctx *c, int fast, float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, float lr, float beta1,
                     float beta2, float eps, float wd, int step) {
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = ocl_fbytes(c, n, 1, &nb)) || (rc = ocl_put(c, S_X, p, nb)) || (rc = ocl_put(c, S_A, g, nb)) || (rc = ocl_put(c, S_B, m, nb)) ||
      (rc = ocl_put(c, S_C, v, nb)))
    return ocl_fail(c, rc);
  // Bias corrections on the host, as the reference computes them (pow in double).
  const float bc1 = (float)(1.0 - pow(beta1, step)), bc2 = (float)(1.0 - pow(beta2, step));
  cl_long ln = n, ld = n_decay;
  cl_kernel k = c->k_adamw;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, c->s[S_C].use) | ARG(k, 4, ln) | ARG(k, 5, ld);
  e |= ARG(k, 6, lr) | ARG(k, 7, beta1) | ARG(k, 8, beta2) | ARG(k, 9, eps) | ARG(k, 10, wd) | ARG(k, 11, bc1) | ARG(k, 12, bc2);
  const size_t gs = (size_t)n;
  if (e || (rc = fast ? tf_launch(c, k, 1, &gs, NULL) : ocl_launch(c, k, 1, &gs, NULL))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_X, p, nb)) || (rc = ocl_get(c, S_B, m, nb))) return ocl_fail(c, rc);
  return ocl_get(c, S_C, v, nb);
}

int ocl_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                     float eps, float wd, int step) {
  if (!p || !g || !m || !v || n < 0 || step < 1) return LL_EINVAL;
  return adamw_run(CTX(b), 0, p, g, m, v, n, n, lr, beta1, beta2, eps, wd, step);
}

// The fast tier: one launch over the decayed and the undecayed parameters; the reference tier
// answers LL_EUNSUPPORTED (two adamw calls).
int ocl_adamw_split(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, float lr, float beta1,
                    float beta2, float eps, float wd, int step) {
  struct ocl_ctx *c = CTX(b);
  if (!p || !g || !m || !v || n < 0 || n_decay < 0 || n_decay > n || step < 1) return LL_EINVAL;
  if (!c->fast) return LL_EUNSUPPORTED;
  return adamw_run(c, 1, p, g, m, v, n, n_decay, lr, beta1, beta2, eps, wd, step);
}

int ocl_sync(struct ll_backend *b) { return ocl_finish(CTX(b)); }

// The fast tier's adapted linear layer (train_fast.cl): axs = scale · x_a · Aᵀ (gemm_tiled), then
// y (=, +=) x · Wᵀ + axs · Bᵀ in one kernel (lora_fwd_tiled): two launches where matmul, matmul,
// scale and matmul took four. The reference tier answers LL_EUNSUPPORTED (the trainer composes it).
int ocl_matmul_lora(struct ll_backend *b, float *y, float *axs, const float *x, const float *xa, const struct ll_weight *w,
                    const struct ll_weight *a, const struct ll_weight *bw, float scale, int T, int acc) {
  struct ocl_ctx *c = CTX(b);
  if (!y || !axs || !x || !xa || !w || !a || !bw || !a->data || !bw->data || T < 0) return LL_EINVAL;
  if (w->k <= 0 || w->n <= 0 || w->k > INT_MAX || w->n > INT_MAX || a->type != LL_TYPE_F32 || bw->type != LL_TYPE_F32 || a->k != w->k ||
      bw->n != w->n || a->n != bw->k || a->n <= 0 || a->n > INT_MAX)
    return LL_EINVAL;
  if (!c->train_tiled) return LL_EUNSUPPORTED;
  const int K = (int)w->k, N = (int)w->n, r = (int)a->n, fl = ocl_float_type(w->type), wt = w->type;
  if (fl < 0 && (ocl_act_type_mode(w->type) < 0 || K % 32)) return LL_EUNSUPPORTED;
  if (T == 0) return 0;
  size_t xb, yb, ab, Ab, Bb;
  int rc;
  if ((rc = ocl_fbytes(c, T, K, &xb)) || (rc = ocl_fbytes(c, T, N, &yb)) || (rc = ocl_fbytes(c, T, r, &ab)) || (rc = ocl_fbytes(c, r, K, &Ab)) ||
      (rc = ocl_fbytes(c, N, r, &Bb)))
    return ocl_fail(c, rc);
  cl_mem wm;
  // x (T, K) in S_X, x_a (T, K) in S_A, A (r, K) in S_B, B (N, r) in S_C; axs (T, r) in S_D, y (T, N) in S_OUT
  if ((rc = ocl_weight_dev(c, w, &wm)) || (rc = ocl_put(c, S_X, x, xb)) || (rc = ocl_put(c, S_A, xa, xb)) || (rc = ocl_put(c, S_B, a->data, Ab)) ||
      (rc = ocl_put(c, S_C, bw->data, Bb)) || (rc = ocl_output(c, S_D, axs, ab)) ||
      (rc = acc ? ocl_put(c, S_OUT, y, yb) : ocl_output(c, S_OUT, y, yb)))
    return ocl_fail(c, rc);
  const struct gemm_op ga = {c->s[S_D].use, c->s[S_A].use, c->s[S_B].use, T, r, K, K, K, r, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, scale, 0.0f, 0};
  if ((rc = gemm_tiled(c, &ga, 1))) return ocl_fail(c, rc);
  const cl_ulong rb = ll_row_size(w->type, w->k);
  cl_kernel k = c->k_lora_fwd;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_X].use) | ARG(k, 2, wm) | ARG(k, 3, rb) | ARG(k, 4, c->s[S_D].use) | ARG(k, 5, c->s[S_C].use);
  e |= ARG(k, 6, T) | ARG(k, 7, N) | ARG(k, 8, K) | ARG(k, 9, r) | ARG(k, 10, wt) | ARG(k, 11, fl) | ARG(k, 12, acc);
  const size_t gl[2] = {RUP16(N), TOK64(T)};
  if (e || (rc = tf_launch(c, k, 2, gl, TILE16))) return ocl_fail(c, e ? LL_EIO : rc);
  if ((rc = ocl_get(c, S_D, axs, ab))) return ocl_fail(c, rc);
  return ocl_get(c, S_OUT, y, yb);
}
