// ops.c - the OpenCL backend's forward ops: products (both tiers), embedding, norms, RoPE,
// SwiGLU, the KV cache and attention; the fast tier's fused members (llsrv_fast.cl) and argmax.

#include "ocl_internal.h"

// ---------------------------------------------------------------- forward ops

// ---------------------------------------------------------------- the fast tier (llsrv_fast.cl)
// Fused decode ops and products with f32 activations: what a GPU wants, checked against the CPU
// with tolerances (tests/test_opencl.c). The reference tier answers LL_EUNSUPPORTED here, and
// the engine composes the same step from the ops above.

#define FR 4 // as llsrv_fast.cl: output rows per work-group
#define FT 4 // tokens per work-group (fmm_*)
#define FTMAX 16 // ... of the prompt kernels (fmmt_*), from TILE_T tokens on
#define TILE_T 8
// From GEMM_T tokens on, the GEMM tiles (llsrv_gemm.cl: GR rows x GT tokens a work-group),
// where the device allows them (program.c). 32 fills a tile (at 32 tokens PoCL ran them 2.5x
// as fast as fmmt_*, docs/PERFORMANCE.md); a lower threshold (partly empty tiles) is unmeasured.
#define GEMM_T 32
#define GR 64
#define GT 32

int ocl_fused_matmul(struct ll_backend *b, int n, float *const out[], const float *x, const float *g, float eps,
                            const struct ll_weight *const w[], int T, int op) {
  struct ocl_ctx *c = CTX(b);
  if (!c->fast) return LL_EUNSUPPORTED;
  if (n < 1 || n > 3 || T < 0 || op < LL_FUSE_SET || op > LL_FUSE_SWIGLU || (op == LL_FUSE_SWIGLU && n != 2)) return LL_EINVAL;
  if (T == 0) return 0;
  const int type = w[0]->type;
  const int64_t K = w[0]->k;
  for (int i = 0; i < n; i++) {
    if (w[i]->type != type || w[i]->k != K) return LL_EUNSUPPORTED; // one kernel, one type and row size
    if (w[i]->n <= 0 || w[i]->n > INT_MAX / 2) return LL_EINVAL;
  }
  if (type < 0 || type >= LL_TYPE_COUNT || !c->k_fmm[type] || K <= 0 || K % 32 || K > INT_MAX / 2) return LL_EUNSUPPORTED;
  if (op == LL_FUSE_SWIGLU && w[1]->n != w[0]->n) return LL_EINVAL;
  if ((int64_t)T * K > INT_MAX) return LL_ELIMIT;
  static const int wslot[3] = {S_W, S_D, S_E}, oslot[3] = {S_OUT, S_B, S_C};
  cl_mem wm[3] = {NULL, NULL, NULL}, om[3] = {NULL, NULL, NULL};
  int N[3] = {0, 0, 0};
  int rc;
  for (int i = 0; i < n; i++) {
    N[i] = (int)w[i]->n;
    if ((rc = ocl_weight_dev_in(c, w[i], wslot[i], &wm[i]))) return rc;
  }
  const size_t xb = (size_t)T * (size_t)K * sizeof(float);
  if ((rc = ocl_put(c, S_X, x, xb))) return rc;
  if (g && (rc = ocl_put_const(c, S_A, g, (size_t)K * sizeof(float)))) return rc;
  const int nout = op == LL_FUSE_SWIGLU ? 1 : n;
  for (int i = 0; i < nout; i++) {
    const size_t ob = (size_t)T * N[i] * sizeof(float);
    if ((rc = op == LL_FUSE_ADD ? ocl_put(c, oslot[i], out[i], ob) : ocl_output(c, oslot[i], out[i], ob))) return rc;
    om[i] = c->s[oslot[i]].use;
  }
  cl_mem gm = g ? c->s[S_A].use : NULL;
  const cl_ulong rb = ll_row_size(type, K);
  const int Ki = (int)K, norm = g != NULL;
  // The kernel object: the first matrix's own, when this instance uploaded it (its arguments set
  // once: a decode step repeats them all), else the shared one with every argument set.
  // Prompts and batches of TILE_T tokens or more: the kernels that share each weight unit among
  // FTMAX tokens (their arguments change with T: set every call).
  // GEMM_T tokens or more: the GEMM tiles, when the device took them.
  const int gemm = T >= GEMM_T && c->k_gmm[type], tile = !gemm && T >= TILE_T, ft = gemm ? GT : tile ? FTMAX : FT;
  struct ocl_kargs shared = {0};
  struct ocl_kargs *ka = &shared;
  struct ocl_weight *ow = w[0]->dev;
  // Decode with a quantized type that has them: the integer-dot products (llsrv_dot.cl, the
  // program LL_OPENCL_DOT and the probe chose), else the float ones.
  const cl_kernel dk = c->k_fmmi[type] ? c->k_fmmi[type] : c->k_fmm[type];
  shared.k = gemm ? c->k_gmm[type] : tile ? c->k_fmmt[type] : dk;
  if (!tile && !gemm && ow && ow->owner == c && ow->cx == c->cx) {
    if (!ow->fk.k) {
      char name[64];
      cl_program pg = NULL;
      cl_int e0 = clGetKernelInfo(dk, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL);
      if (e0 == CL_SUCCESS) e0 = clGetKernelInfo(dk, CL_KERNEL_PROGRAM, sizeof pg, &pg, NULL);
      if (e0 == CL_SUCCESS) ow->fk.k = clCreateKernel(pg, name, &e0);
      if (!ow->fk.k) ow->fk.k = NULL;
    }
    if (ow->fk.k) ka = &ow->fk;
  }
  cl_kernel k = ka->k;
#define KA(i, v) ocl_karg(c, ka, i, sizeof(v), &(v))
  cl_int e = KA(0, wm[0]) | KA(1, wm[1]) | KA(2, wm[2]) | KA(3, rb) | KA(4, c->s[S_X].use) | KA(5, gm);
  e |= KA(6, eps) | KA(7, norm) | KA(8, om[0]) | KA(9, om[1]) | KA(10, om[2]) | KA(11, Ki);
  e |= KA(12, N[0]) | KA(13, N[1]) | KA(14, N[2]) | KA(15, T) | KA(16, op);
#undef KA
  const size_t rows = gemm ? GR : FR, wg = gemm ? OCL_GMM_WG : WG; // output rows and work items a work-group
  size_t blocks = 0;
  if (op == LL_FUSE_SWIGLU) blocks = ((size_t)N[0] + rows / 2 - 1) / (rows / 2);
  else
    for (int i = 0; i < n; i++) blocks += ((size_t)N[i] + rows - 1) / rows;
  const size_t gl[2] = {wg * blocks, ((size_t)T + ft - 1) / ft}, lo[2] = {wg, 1};
  if (e || (rc = ocl_launch(c, k, 2, gl, lo))) return e ? LL_EIO : rc;
  c->fast_launches++;
  c->gemm_launches += gemm;
  for (int i = 0; i < nout; i++)
    if ((rc = ocl_get(c, oslot[i], out[i], (size_t)T * N[i] * sizeof(float)))) return rc;
  return 0;
}

int ocl_act_type_mode(int wtype) { // activation quantization of llsrv.cl's act_quant
  switch (wtype) {
  case LL_TYPE_Q4_0: case LL_TYPE_Q5_0: case LL_TYPE_Q8_0: return 0;
  case LL_TYPE_Q4_1: case LL_TYPE_Q5_1: return 1;
  case LL_TYPE_Q4_K: case LL_TYPE_Q5_K: case LL_TYPE_Q6_K: return 2;
  default: return -1;
  }
}

int ocl_matmul(struct ll_backend *b, float *out, const float *x, const struct ll_weight *w, int T, int accumulate) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return T < 0 ? LL_EINVAL : 0;
  if (c->fast && w->type >= 0 && w->type < LL_TYPE_COUNT && c->k_fmm[w->type] && w->k % 32 == 0) { // the fast tier's product
    float *const o[1] = {out};
    const struct ll_weight *const ws[1] = {w};
    return ocl_fused_matmul(b, 1, o, x, NULL, 0.0f, ws, T, accumulate ? LL_FUSE_ADD : LL_FUSE_SET);
  }
  const int K = (int)w->k, N = (int)w->n;
  const int fl = w->type == LL_TYPE_F32 ? 0 : w->type == LL_TYPE_F16 ? 1 : w->type == LL_TYPE_BF16 ? 2 : -1;
  const int mode = ocl_act_type_mode(w->type);
  if (fl < 0 && (mode < 0 || !c->k_mm[w->type])) return LL_EUNSUPPORTED;
  if (K % 32 && fl < 0) return LL_EINVAL;
  cl_mem wm;
  int rc = ocl_weight_dev(c, w, &wm);
  if (rc) return rc;
  const size_t xb = (size_t)T * K * sizeof(float), ob = (size_t)T * N * sizeof(float);
  cl_ulong rb = ll_row_size(w->type, w->k);
  if ((rc = fl > 0 ? ocl_put_copy(c, S_X, x, xb) : ocl_put(c, S_X, x, xb))) return rc; // act_round changes it
  if (accumulate) rc = ocl_put(c, S_OUT, out, ob);
  else rc = ocl_output(c, S_OUT, out, ob);
  if (rc) return rc;
  cl_int e = 0;
  const size_t gl[3] = {WG, (size_t)N, (size_t)(T + TT - 1) / TT}, lo[3] = {WG, 1, 1};
  if (fl < 0) {
    if ((rc = ocl_stage(c, S_XQ, (size_t)T * K)) || (rc = ocl_stage(c, S_XS, (size_t)T * (K / 32) * 2 * sizeof(float)))) return rc;
    const size_t per = mode == 2 ? 256 : 32;
    if (K % (int)per) return LL_EINVAL;
    const size_t gq = (size_t)T * (K / per);
    cl_kernel k = c->k_quant;
    e |= ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_XQ].use) | ARG(k, 2, c->s[S_XS].use) | ARG(k, 3, K) | ARG(k, 4, T) | ARG(k, 5, mode);
    if (e || (rc = ocl_launch(c, k, 1, &gq, NULL))) return e ? LL_EIO : rc;
    k = c->k_mm[w->type];
    e |= ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_XQ].use) | ARG(k, 3, c->s[S_XS].use) | ARG(k, 4, c->s[S_OUT].use);
    e |= ARG(k, 5, K) | ARG(k, 6, N) | ARG(k, 7, T) | ARG(k, 8, accumulate);
    if (e || (rc = ocl_launch(c, k, 3, gl, lo))) return e ? LL_EIO : rc;
  } else {
    if (fl > 0) { // round activations as the CPU converts them to f16 / bf16
      cl_kernel k = c->k_round;
      const int n = T * K;
      const size_t g = (size_t)n;
      e |= ARG(k, 0, c->s[S_X].use) | ARG(k, 1, n) | ARG(k, 2, fl);
      if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
    }
    cl_kernel k = c->k_mm_f;
    e |= ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_X].use) | ARG(k, 3, c->s[S_OUT].use) | ARG(k, 4, K) | ARG(k, 5, N);
    e |= ARG(k, 6, T) | ARG(k, 7, accumulate) | ARG(k, 8, fl);
    if (e || (rc = ocl_launch(c, k, 3, gl, lo))) return e ? LL_EIO : rc;
  }
  return ocl_get(c, S_OUT, out, ob);
}

// ids may be a backend buffer (a decode step's input: the previous step's choice, made on the
// device): read where they are, not checked here - the caller vouches for them (the engine: ids
// an argmax or sample over at most w->n rows wrote).
int ocl_get_rows(struct ll_backend *b, float *out, const struct ll_weight *w, const int32_t *ids, int T) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return 0;
  const struct rbuf *ir;
  size_t ioff;
  const int dev_ids = ocl_resident(c, ids, (size_t)T * sizeof *ids, &ir, &ioff);
  if (dev_ids < 0) return dev_ids;
  for (int t = 0; !dev_ids && t < T; t++)
    if (ids[t] < 0 || ids[t] >= w->n) return LL_EINVAL;
  cl_mem wm;
  int rc = ocl_weight_dev(c, w, &wm);
  if (rc) return rc;
  const int K = (int)w->k;
  const int fl = w->type == LL_TYPE_F32 ? 0 : w->type == LL_TYPE_F16 ? 1 : w->type == LL_TYPE_BF16 ? 2 : -1;
  if (fl < 0 && (ocl_act_type_mode(w->type) < 0 || K % 32)) return LL_EUNSUPPORTED;
  const size_t ob = (size_t)T * K * sizeof(float);
  if ((rc = ocl_put(c, S_POS, ids, (size_t)T * sizeof *ids)) || (rc = ocl_output(c, S_OUT, out, ob))) return rc;
  cl_ulong rb = ll_row_size(w->type, w->k);
  cl_kernel k = fl < 0 ? c->k_gr_q : c->k_gr_f;
  const int wt = fl < 0 ? w->type : fl;
  cl_int e = ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_POS].use) | ARG(k, 3, c->s[S_OUT].use) | ARG(k, 4, K) | ARG(k, 5, T);
  e |= ARG(k, 6, wt);
  const size_t g = fl < 0 ? (size_t)T * (K / 32) : (size_t)T * K;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, out, ob);
}

int ocl_rmsnorm(struct ll_backend *b, float *out, const float *x, const float *g, int T, int C, float eps) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return 0;
  const size_t xb = (size_t)T * C * sizeof(float);
  int rc;
  if ((rc = ocl_put(c, S_X, x, xb)) || (rc = ocl_put_const(c, S_A, g, (size_t)C * sizeof(float))) || (rc = ocl_output(c, S_OUT, out, xb))) return rc;
  cl_kernel k = c->k_rmsnorm;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_X].use) | ARG(k, 2, c->s[S_A].use) | ARG(k, 3, C) | ARG(k, 4, eps);
  const size_t gl = (size_t)T * WG, lo = WG;
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, out, xb);
}

// cos/sin tables (T, np) of positions pos, on the host exactly as the CPU backend computes them
// (libm; ll_rope_angles, kernels/ll_ref.h), so the device rotates by the same angles (rope and
// rope_backward).
int ocl_rope_tables(struct ocl_ctx *c, const int32_t *pos, int T, const struct ll_rope_params *p, float **ct, float **st) {
  const int np = p->n_rot / 2;
  const size_t need = 2 * (size_t)T * np;
  if (need > c->rope_cap) {
    float *nt = realloc(c->rope_cs, need * sizeof *nt);
    if (!nt) return LL_ENOMEM;
    c->rope_cs = nt, c->rope_cap = need;
  }
  *ct = c->rope_cs, *st = c->rope_cs + (size_t)T * np;
  for (int t = 0; t < T; t++) ll_rope_angles(pos[t], p, *ct + (size_t)t * np, *st + (size_t)t * np);
  return 0;
}

int ocl_rope(struct ll_backend *b, float *x, const int32_t *pos, int T, int n_head, int head_dim, const struct ll_rope_params *p) {
  struct ocl_ctx *c = CTX(b);
  if (p->n_rot > head_dim || p->n_rot % 2 || p->n_rot < 0 || T < 0) return LL_EINVAL;
  const int np = p->n_rot / 2;
  if (T == 0 || np == 0) return 0;
  float *ct, *st;
  int rc0 = ocl_rope_tables(c, pos, T, p, &ct, &st);
  if (rc0) return rc0;
  const size_t xb = (size_t)T * n_head * head_dim * sizeof(float), tb = (size_t)T * np * sizeof(float);
  int rc;
  if ((rc = ocl_put(c, S_X, x, xb)) || (rc = ocl_put_const(c, S_A, ct, tb)) || (rc = ocl_put_const(c, S_B, st, tb))) return rc;
  cl_kernel k = c->k_rope;
  const int neox = p->mode == LL_ROPE_NEOX, fused = b->ggml_math;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, T) | ARG(k, 4, n_head);
  e |= ARG(k, 5, head_dim) | ARG(k, 6, np) | ARG(k, 7, neox) | ARG(k, 8, fused);
  const size_t g = (size_t)T * n_head * np;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return ocl_get(c, S_X, x, xb);
}

// SwiGLU and GeGLU: one kernel each, the same arguments.
static int glu(struct ll_backend *b, cl_kernel k, float *out, const float *gate, const float *up, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (n <= 0) return 0;
  const size_t nb = (size_t)n * sizeof(float);
  int rc;
  if ((rc = ocl_put(c, S_A, gate, nb)) || (rc = ocl_put(c, S_B, up, nb)) || (rc = ocl_output(c, S_OUT, out, nb))) return rc;
  cl_long ln = n;
  const int ggml = b->ggml_math;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, ln) | ARG(k, 4, ggml);
  const size_t g = (size_t)n;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, out, nb);
}
int ocl_swiglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n) { return glu(b, CTX(b)->k_swiglu, out, gate, up, n); }
int ocl_geglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n) { return glu(b, CTX(b)->k_geglu, out, gate, up, n); }

int ocl_add(struct ll_backend *b, float *out, const float *a, const float *x, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (n <= 0) return 0;
  const size_t nb = (size_t)n * sizeof(float);
  int rc;
  if ((rc = ocl_put(c, S_A, a, nb)) || (rc = ocl_put(c, S_B, x, nb)) || (rc = ocl_output(c, S_OUT, out, nb))) return rc;
  cl_kernel k = c->k_add;
  cl_long ln = n;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, ln);
  const size_t g = (size_t)n;
  if (e || (rc = ocl_launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, out, nb);
}

// ---------------------------------------------------------------- KV cache

// The device pool named by host pointer `host`, at least `bytes` long (grown keeping contents).
int ocl_kv_pool(struct ocl_ctx *c, const void *host, size_t bytes, cl_mem *out) {
  struct kvpool *p = NULL;
  for (int i = 0; i < c->n_kv; i++)
    if (c->kv[i].host == host) p = &c->kv[i];
  if (!p) {
    if (c->n_kv == c->cap_kv) {
      int cap = c->cap_kv ? 2 * c->cap_kv : 64;
      struct kvpool *nk = realloc(c->kv, (size_t)cap * sizeof *nk);
      if (!nk) return LL_ENOMEM;
      c->kv = nk, c->cap_kv = cap;
    }
    p = &c->kv[c->n_kv++];
    *p = (struct kvpool){host, NULL, 0};
  }
  if (p->cap < bytes) {
    size_t cap = p->cap ? p->cap : 1 << 16;
    while (cap < bytes) cap *= 2;
    cl_int e;
    cl_mem m = ocl_dev_alloc(c, cap, &e);
    if (!m) return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_ENOMEM;
    if (p->m) {
      e = clEnqueueCopyBuffer(c->q, p->m, m, 0, 0, p->cap, 0, NULL, NULL);
      if (e == CL_SUCCESS) e = clFinish(c->q), ocl_drained(c);
      if (e != CL_SUCCESS) {
        ocl_dev_release(c, m, cap);
        return ocl_cl_rc(e);
      }
      ocl_dev_release(c, p->m, p->cap);
    }
    p->m = m, p->cap = cap;
  }
  *out = p->m;
  return 0;
}

size_t ocl_kv_elem(const struct ll_kv_view *kv) { return kv->kv_type == LL_TYPE_F16 ? 2 : 4; }
size_t ocl_kv_block_bytes(const struct ll_kv_view *kv) { return (size_t)kv->block * kv->n_head_kv * kv->head_dim * ocl_kv_elem(kv); }

int ocl_kv_store(struct ll_backend *b, const struct ll_kv_view *kv, const float *k, const float *v, const int32_t *pos, int T) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return 0;
  if (kv->kv_type != LL_TYPE_F16 && kv->kv_type != LL_TYPE_F32) return LL_EUNSUPPORTED;
  int max_pos = 0, max_blk = 0;
  for (int t = 0; t < T; t++) max_pos = pos[t] > max_pos ? pos[t] : max_pos;
  const int nb = max_pos / kv->block + 1;
  for (int i = 0; i < nb; i++) max_blk = kv->block_table[i] > max_blk ? kv->block_table[i] : max_blk;
  cl_mem K, V;
  const size_t need = ((size_t)max_blk + 1) * ocl_kv_block_bytes(kv);
  int rc;
  if ((rc = ocl_kv_pool(c, kv->k, need, &K)) || (rc = ocl_kv_pool(c, kv->v, need, &V))) return rc;
  const int n = kv->n_head_kv * kv->head_dim;
  const size_t xb = (size_t)T * n * sizeof(float);
  if ((rc = ocl_put(c, S_A, k, xb)) || (rc = ocl_put(c, S_B, v, xb)) || (rc = ocl_put(c, S_POS, pos, (size_t)T * 4)) ||
      (rc = ocl_put(c, S_TAB, kv->block_table, (size_t)nb * 4)))
    return rc;
  cl_kernel kk = c->k_kv_store;
  const int f16 = kv->kv_type == LL_TYPE_F16;
  cl_int e = ARG(kk, 0, K) | ARG(kk, 1, V) | ARG(kk, 2, c->s[S_A].use) | ARG(kk, 3, c->s[S_B].use) | ARG(kk, 4, c->s[S_POS].use);
  e |= ARG(kk, 5, c->s[S_TAB].use) | ARG(kk, 6, T) | ARG(kk, 7, kv->block) | ARG(kk, 8, kv->n_head_kv) | ARG(kk, 9, kv->head_dim) | ARG(kk, 10, f16);
  const size_t g = (size_t)T * n;
  if (e || (rc = ocl_launch(c, kk, 1, &g, NULL))) return e ? LL_EIO : rc;
  return 0; // host k, v were copied (upload): they may change once we return
}

// The index arrays of n_seq sequences' rows (attention_multi's arguments), checked: one pool for
// all (the same layer) and the rows in sequence order. *idx (malloc'd, the caller frees): the
// concatenated block tables (n_tab), each row's sequence (rows), each table's offset (n_seq),
// each sequence's row count (n_seq).
int ocl_seq_tables(const struct ll_kv_view *kv, const int32_t *pos, const int *t0, const int *nt, int n_seq, int32_t **idx, int *rows_out,
                      int *n_tab_out, int *max_pos_out, int *max_blk_out) {
  const struct ll_kv_view *k0 = &kv[0];
  int rows = 0, max_pos = 0, max_blk = 0, n_tab = 0;
  *idx = NULL;
  for (int i = 0; i < n_seq; i++) {
    if (kv[i].k != k0->k || kv[i].v != k0->v || kv[i].head_dim != k0->head_dim || kv[i].n_head_kv != k0->n_head_kv ||
        kv[i].kv_type != k0->kv_type || kv[i].block != k0->block || kv[i].block <= 0 || kv[i].window != k0->window || t0[i] != rows || nt[i] < 0)
      return LL_EINVAL;
    rows += nt[i];
    int mp = 0;
    for (int t = t0[i]; t < t0[i] + nt[i]; t++) {
      if (pos[t] < 0) return LL_EINVAL;
      mp = pos[t] > mp ? pos[t] : mp;
    }
    max_pos = mp > max_pos ? mp : max_pos;
    n_tab += mp / k0->block + 1;
  }
  *rows_out = rows, *n_tab_out = n_tab, *max_pos_out = max_pos, *max_blk_out = 0;
  if (rows == 0) return 0;
  int32_t *tab = malloc(((size_t)n_tab + rows + 2 * (size_t)n_seq) * sizeof *tab);
  if (!tab) return LL_ENOMEM;
  int32_t *seq_of = tab + n_tab, *toff = seq_of + rows, *snt = toff + n_seq;
  for (int i = 0; i < n_seq; i++) snt[i] = nt[i];
  for (int i = 0, o = 0; i < n_seq; i++) {
    int mp = 0;
    for (int t = t0[i]; t < t0[i] + nt[i]; t++) mp = pos[t] > mp ? pos[t] : mp, seq_of[t] = i;
    toff[i] = o;
    for (int j = 0; j <= mp / k0->block; j++, o++) {
      tab[o] = kv[i].block_table[j];
      if (tab[o] < 0) {
        free(tab);
        return LL_EINVAL;
      }
      max_blk = tab[o] > max_blk ? tab[o] : max_blk;
    }
  }
  *idx = tab, *max_blk_out = max_blk;
  return 0;
}

// The fast tier's attention (llsrv_fast.cl attn_fast): the rows' pairs of (token, head) that
// share a KV head, AQ a work-group (blocks never span sequences), the operands staged as the
// reference's are. At a long context a decode step's blocks are split over the KV range
// (llsrv_split.cl attn_split, one launch still): see attention_split.
#define OCL_AQ 8 // as llsrv_fast.cl AQ
#define OCL_AW 8 // ints per work item of attn_split (llsrv_split.cl AW)

// Split-K's parameters (LL_OPENCL_SPLIT_KV=MIN[:MAX]): a block is split into chunks of at least
// MIN positions (default 128: the ~2 KB partial a chunk writes and its combine are then a few
// percent of the 32 KB of f16 K and V it reads at hd 64), at most MAX of them (2 .. 64; default
// 0: enough for 2 work-groups per compute unit from one sequence's KV heads, see split_count).
// MIN 0: never split. A malformed value leaves the defaults.
#define OCL_SPLIT_MIN 128
void ocl_split_params(struct ocl_ctx *c) {
  c->split_min = c->k_attn_split ? OCL_SPLIT_MIN : 0, c->split_max = 0;
  const char *e = getenv("LL_OPENCL_SPLIT_KV");
  if (c->k_attn_split && e && *e) {
    char *end;
    long mn = strtol(e, &end, 10), mx = 0;
    if (*end == ':') mx = strtol(end + 1, &end, 10);
    if (*end == 0 && mn >= 0 && mn <= (1 << 20) && (mx == 0 || (mx >= 2 && mx <= 64))) c->split_min = (int)mn, c->split_max = (int)mx;
  }
}

// How many chunks a block of a decode-like sequence (its rows in one block: a decode token's
// grouped-query heads) takes over its span of positions: 1 below 2 * split_min (the one-pass
// kernel's work), else up to split_max chunks (default: 2 * compute units / Hkv, at least 2, at
// most 64) of at least split_min positions, rounded to whole 64-position tiles. A function of
// the sequence's own span and the device alone, so a row's result does not depend on the batch
// it came in. *chunk: the chunk's positions.
static int split_count(const struct ocl_ctx *c, int span, int Hkv, int *chunk) {
  *chunk = span;
  if (c->split_min <= 0 || span < 2 * c->split_min) return 1;
  const int cu = c->info.compute_units > 0 ? c->info.compute_units : 1;
  int mx = c->split_max ? c->split_max : (2 * cu + Hkv - 1) / Hkv;
  mx = mx < 2 ? 2 : mx > 64 ? 64 : mx;
  int ns = span / c->split_min;
  ns = ns > mx ? mx : ns;
  int ch = (span + ns - 1) / ns;
  ch = (ch + 63) / 64 * 64;
  *chunk = ch;
  return (span + ch - 1) / ch;
}

// The union of n rows' position ranges (each row at p sees lo .. p, lo = p + 1 - window with a
// sliding window): its first position in *lo, its length returned.
static int seq_span(const int32_t *pos, int n, int window, int *lo) {
  int l0 = INT_MAX, hi = -1;
  for (int t = 0; t < n; t++) {
    const int p = pos[t], l = window > 0 && p + 1 > window ? p + 1 - window : 0;
    l0 = l < l0 ? l : l0, hi = p > hi ? p : hi;
  }
  *lo = l0;
  return hi - l0 + 1;
}

// A buffer of attn_split's state, grown (and, for the counters, zeroed: zero = no work-group of
// the block has finished) to hold bytes.
static int split_buf(struct ocl_ctx *c, cl_mem *m, size_t *cap, size_t bytes, int zero) {
  if (*cap >= bytes) return 0;
  size_t nc = *cap ? *cap : 4096;
  while (nc < bytes) nc *= 2;
  cl_int e;
  cl_mem nm = ocl_dev_alloc(c, nc, &e);
  if (!nm) return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_ENOMEM;
  if (zero) {
    const cl_uint z = 0;
    e = clEnqueueFillBuffer(c->q, nm, &z, sizeof z, 0, nc, 0, NULL, NULL);
    if (e != CL_SUCCESS) {
      ocl_dev_release(c, nm, nc);
      return ocl_cl_rc(e);
    }
  }
  if (*m) ocl_dev_release(c, *m, *cap); // the queue runs in order: its last users are done first
  *m = nm, *cap = nc;
  return 0;
}

static int attention_fast(struct ocl_ctx *c, float *out, cl_mem K, cl_mem V, const struct ll_kv_view *k0, int n_seq, const int32_t *pos,
                          const int *t0, const int *nt, int n_head, float scale, size_t qb) {
  const int Hkv = k0->n_head_kv, G = n_head / Hkv, hd = k0->head_dim, window = k0->window;
  // Work items of attn_split (AW ints each): t0, k0, nq, the chunk's positions clo .. chi, the
  // block's chunk count ns, its first partial slot and the chunk's index. attn_fast reads the
  // first 3 of a row of 3 (the blocks, when none splits).
  int n_blk = 0, n_item = 0, n_slot = 0;
  for (int i = 0; i < n_seq; i++) {
    const int nb = (nt[i] * G + OCL_AQ - 1) / OCL_AQ;
    n_blk += nb;
    if (nb == 1 && nt[i] > 0) { // decode-like: the sequence's rows are one block
      int lo, ch;
      const int ns = split_count(c, seq_span(pos + t0[i], nt[i], window, &lo), Hkv, &ch);
      n_item += ns, n_slot += ns > 1 ? ns : 0;
    } else {
      n_item += nb;
    }
  }
  if (n_blk == 0) return 0;
  const int split = n_slot > 0;
  const int aw = split ? OCL_AW : 3, nw = split ? n_item : n_blk;
  int32_t *blk = malloc((size_t)nw * aw * sizeof *blk);
  if (!blk) return LL_ENOMEM;
  for (int i = 0, o = 0, slot = 0; i < n_seq; i++)
    for (int k = 0; k < nt[i] * G; k += OCL_AQ) {
      const int nq = nt[i] * G - k < OCL_AQ ? nt[i] * G - k : OCL_AQ;
      int ns = 1, ch = 0, lo = 0;
      if (split && k == 0 && nt[i] * G <= OCL_AQ) ns = split_count(c, seq_span(pos + t0[i], nt[i], window, &lo), Hkv, &ch);
      for (int s = 0; s < ns; s++, o++) {
        int32_t *w = blk + (size_t)o * aw;
        w[0] = t0[i], w[1] = k, w[2] = nq;
        if (!split) continue;
        w[3] = ns > 1 ? lo + s * ch : 0, w[4] = ns > 1 ? lo + (s + 1) * ch - 1 : INT_MAX;
        w[5] = ns, w[6] = ns > 1 ? slot : 0, w[7] = s;
      }
      slot += ns > 1 ? ns : 0;
    }
  int rc = ocl_put(c, S_SCR, blk, (size_t)nw * aw * sizeof *blk);
  free(blk);
  if (rc || (rc = ocl_output(c, S_OUT, out, qb))) return rc;
  const size_t pw = (size_t)OCL_AQ * (hd + 2) * sizeof(float);
  if (split && ((rc = split_buf(c, &c->split_part, &c->split_part_cap, (size_t)n_slot * Hkv * pw, 0)) ||
                (rc = split_buf(c, &c->split_cnt, &c->split_cnt_cap, (size_t)n_slot * Hkv * sizeof(cl_uint), 1))))
    return rc;
  cl_kernel k = split ? c->k_attn_split : c->k_attn_fast;
  const int f16 = k0->kv_type == LL_TYPE_F16, block = k0->block;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_X].use) | ARG(k, 2, K) | ARG(k, 3, V) | ARG(k, 4, c->s[S_POS].use);
  e |= ARG(k, 5, c->s[S_TAB].use) | ARG(k, 6, c->s[S_SEQ].use) | ARG(k, 7, c->s[S_TOFF].use) | ARG(k, 8, c->s[S_SCR].use);
  e |= ARG(k, 9, n_head) | ARG(k, 10, Hkv) | ARG(k, 11, hd) | ARG(k, 12, block) | ARG(k, 13, f16) | ARG(k, 14, scale) | ARG(k, 15, window);
  if (split) e |= ARG(k, 16, c->split_part) | ARG(k, 17, c->split_cnt);
  const size_t gl = (size_t)nw * Hkv * WG, lo = WG;
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  c->fast_launches++, c->split_launches += split;
  return ocl_get(c, S_OUT, out, qb);
}

int ocl_attention_multi(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos,
                               const int *t0, const int *nt, int n_seq, int n_head, float scale) {
  struct ocl_ctx *c = CTX(b);
  if (n_seq < 1) return 0;
  const struct ll_kv_view *k0 = &kv[0];
  const int hd = k0->head_dim, Hkv = k0->n_head_kv;
  if (hd > 256 || Hkv <= 0 || n_head % Hkv) return LL_EUNSUPPORTED;
  int rows, n_tab, max_pos, max_blk;
  int32_t *tab;
  int rc = ocl_seq_tables(kv, pos, t0, nt, n_seq, &tab, &rows, &n_tab, &max_pos, &max_blk);
  if (rc || rows == 0) return rc;
  int32_t *seq_of = tab + n_tab, *toff = seq_of + rows, *snt = toff + n_seq;
  cl_mem K, V;
  const size_t need = ((size_t)max_blk + 1) * ocl_kv_block_bytes(k0);
  const size_t qb = (size_t)rows * n_head * hd * sizeof(float);
  const int stride = max_pos + 1, fast = c->fast && c->k_attn_fast && hd <= 256;
  if ((rc = ocl_kv_pool(c, k0->k, need, &K)) || (rc = ocl_kv_pool(c, k0->v, need, &V)) || (rc = ocl_put(c, S_X, q, qb)) ||
      (rc = ocl_put(c, S_POS, pos, (size_t)rows * 4)) || (rc = ocl_put(c, S_TAB, tab, (size_t)n_tab * 4)) ||
      (rc = ocl_put(c, S_SEQ, seq_of, (size_t)rows * 4)) || (rc = ocl_put(c, S_TOFF, toff, (size_t)n_seq * 4)) || (rc = ocl_put(c, S_SNT, snt, (size_t)n_seq * 4)) ||
      (!fast && ((rc = ocl_stage(c, S_SCR, (size_t)rows * n_head * stride * sizeof(float))) || (rc = ocl_output(c, S_OUT, out, qb))))) {
    free(tab);
    return rc;
  }
  free(tab); // the uploads copied it
  if (fast) return attention_fast(c, out, K, V, k0, n_seq, pos, t0, nt, n_head, scale, qb);
  cl_kernel k = c->k_attention;
  const int f16 = k0->kv_type == LL_TYPE_F16, ggml = b->ggml_math;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_X].use) | ARG(k, 2, K) | ARG(k, 3, V) | ARG(k, 4, c->s[S_POS].use);
  e |= ARG(k, 5, c->s[S_TAB].use) | ARG(k, 6, c->s[S_SEQ].use) | ARG(k, 7, c->s[S_TOFF].use) | ARG(k, 8, c->s[S_SNT].use);
  e |= ARG(k, 9, c->s[S_SCR].use) | ARG(k, 10, n_head) | ARG(k, 11, Hkv) | ARG(k, 12, hd) | ARG(k, 13, k0->block) | ARG(k, 14, f16);
  e |= ARG(k, 15, scale) | ARG(k, 16, stride) | ARG(k, 17, ggml) | ARG(k, 18, k0->window);
  const size_t gl = (size_t)rows * n_head * WG, lo = WG;
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, out, qb);
}

// The fast tier: rope of q and k and the kv_store of k, v in one kernel (llsrv_fast.cl rope_kv).
int ocl_rope_kv_store(struct ll_backend *b, float *q, const float *k, const float *v, const struct ll_kv_view *kv, const int32_t *pos,
                             const int *t0, const int *nt, int n_seq, int n_head, const struct ll_rope_params *p) {
  struct ocl_ctx *c = CTX(b);
  if (!c->fast) return LL_EUNSUPPORTED;
  if (n_seq < 1) return 0;
  const struct ll_kv_view *k0 = &kv[0];
  const int hd = k0->head_dim, Hkv = k0->n_head_kv;
  if (hd <= 0 || Hkv <= 0 || n_head <= 0 || p->n_rot > hd || p->n_rot % 2 || p->n_rot < 0) return LL_EINVAL;
  if (k0->kv_type != LL_TYPE_F16 && k0->kv_type != LL_TYPE_F32) return LL_EUNSUPPORTED;
  const int np = p->n_rot / 2;
  if (np == 0) return LL_EUNSUPPORTED; // nothing to rotate: the unfused ops
  int rows, n_tab, max_pos, max_blk;
  int32_t *tab;
  int rc = ocl_seq_tables(kv, pos, t0, nt, n_seq, &tab, &rows, &n_tab, &max_pos, &max_blk);
  if (rc || rows == 0) return rc;
  int32_t *seq_of = tab + n_tab, *toff = seq_of + rows;
  float *ct, *st;
  cl_mem K, V;
  const size_t need = ((size_t)max_blk + 1) * ocl_kv_block_bytes(k0);
  const size_t qb = (size_t)rows * n_head * hd * sizeof(float), kb = (size_t)rows * Hkv * hd * sizeof(float), tb = (size_t)rows * np * sizeof(float);
  if ((rc = ocl_rope_tables(c, pos, rows, p, &ct, &st)) || (rc = ocl_kv_pool(c, k0->k, need, &K)) || (rc = ocl_kv_pool(c, k0->v, need, &V)) ||
      (rc = ocl_put(c, S_X, q, qb)) || (rc = ocl_put(c, S_A, k, kb)) || (rc = ocl_put(c, S_B, v, kb)) || (rc = ocl_put_const(c, S_C, ct, tb)) ||
      (rc = ocl_put_const(c, S_D, st, tb)) || (rc = ocl_put(c, S_POS, pos, (size_t)rows * 4)) || (rc = ocl_put(c, S_TAB, tab, (size_t)n_tab * 4)) ||
      (rc = ocl_put(c, S_SEQ, seq_of, (size_t)rows * 4)) || (rc = ocl_put(c, S_TOFF, toff, (size_t)n_seq * 4))) {
    free(tab);
    return rc;
  }
  free(tab);
  cl_kernel kk = c->k_rope_kv;
  const int neox = p->mode == LL_ROPE_NEOX, fused = b->ggml_math, f16 = k0->kv_type == LL_TYPE_F16, block = k0->block;
  cl_int e = ARG(kk, 0, c->s[S_X].use) | ARG(kk, 1, c->s[S_A].use) | ARG(kk, 2, c->s[S_B].use) | ARG(kk, 3, K) | ARG(kk, 4, V);
  e |= ARG(kk, 5, c->s[S_C].use) | ARG(kk, 6, c->s[S_D].use) | ARG(kk, 7, c->s[S_POS].use) | ARG(kk, 8, c->s[S_TAB].use);
  e |= ARG(kk, 9, c->s[S_SEQ].use) | ARG(kk, 10, c->s[S_TOFF].use) | ARG(kk, 11, rows) | ARG(kk, 12, n_head) | ARG(kk, 13, Hkv);
  e |= ARG(kk, 14, hd) | ARG(kk, 15, np) | ARG(kk, 16, neox) | ARG(kk, 17, fused) | ARG(kk, 18, block) | ARG(kk, 19, f16);
  const size_t g = (size_t)rows * (size_t)(n_head + Hkv) * (size_t)((hd + 1) / 2);
  if (e || (rc = ocl_launch(c, kk, 1, &g, NULL))) return e ? LL_EIO : rc;
  c->fast_launches++;
  return ocl_get(c, S_X, q, qb);
}

// Greedy sampling where the logits are (both tiers: a comparison, no sums): rows x 4 bytes back.
int ocl_argmax(struct ll_backend *b, int32_t *ids, const float *logits, int rows, int V) {
  struct ocl_ctx *c = CTX(b);
  if (rows < 0 || V <= 0) return LL_EINVAL;
  if (rows == 0) return 0;
  const size_t lb = (size_t)rows * (size_t)V * sizeof(float), ib = (size_t)rows * sizeof(int32_t);
  int rc;
  if ((rc = ocl_put(c, S_X, logits, lb)) || (rc = ocl_output(c, S_OUT, ids, ib))) return rc;
  cl_kernel k = c->k_argmax;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_OUT].use) | ARG(k, 2, V);
  const size_t gl = (size_t)rows * WG, lo = WG;
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, ids, ib);
}

// Sampling where the logits are (both tiers, llsrv_fast.cl sample_rows): each row's step as
// SMP_W words (the chain's 8, then the penalties and where the row's penalty list starts), the
// penalty lists after them in the same upload; rows x 4 bytes back.
#define SMP_W 16
int ocl_sample(struct ll_backend *b, int32_t *ids, float *logits, int rows, int V, const struct ll_sample_dev *d) {
  struct ocl_ctx *c = CTX(b);
  if (rows < 0 || V <= 0) return LL_EINVAL;
  if (rows == 0) return 0;
  size_t npen = 0;
  for (int r = 0; r < rows; r++) {
    if (d[r].n_pen < 0 || d[r].n_pen > LL_SAMPLE_DEV_PEN || (d[r].n_pen && !d[r].pen)) return LL_EINVAL;
    npen += (size_t)d[r].n_pen;
  }
  const size_t lb = (size_t)rows * (size_t)V * sizeof(float), ib = (size_t)rows * sizeof(int32_t);
  const size_t pw = (size_t)rows * SMP_W, pb = (pw + 2 * npen) * sizeof(uint32_t);
  uint32_t *prm = malloc(pb);
  if (!prm) return LL_ENOMEM;
  size_t at = pw;
  for (int r = 0; r < rows; r++) {
    uint32_t *w = prm + (size_t)r * SMP_W;
    const float f[4] = {d[r].temperature, d[r].top_p, d[r].min_p, d[r].log_min_p}, pf[3] = {d[r].repeat_penalty, d[r].frequency_penalty,
                                                                                          d[r].presence_penalty};
    memcpy(w, f, sizeof f);
    w[4] = (uint32_t)(d[r].top_k < 1 ? 1 : d[r].top_k > LL_SAMPLE_DEV_K ? LL_SAMPLE_DEV_K : d[r].top_k);
    w[5] = d[r].u_hi, w[6] = d[r].u_lo, w[7] = 0;
    memcpy(w + 8, pf, sizeof pf);
    w[11] = (uint32_t)d[r].n_pen, w[12] = (uint32_t)at, w[13] = w[14] = w[15] = 0;
    if (d[r].n_pen) memcpy(prm + at, d[r].pen, (size_t)d[r].n_pen * 2 * sizeof(uint32_t));
    at += 2 * (size_t)d[r].n_pen;
  }
  int rc = ocl_put(c, S_X, logits, lb);
  if (!rc) rc = ocl_put(c, S_A, prm, pb);
  free(prm);
  if (rc || (rc = ocl_output(c, S_OUT, ids, ib))) return rc;
  cl_kernel k = c->k_sample;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_OUT].use) | ARG(k, 2, c->s[S_A].use) | ARG(k, 3, V);
  const size_t gl = (size_t)rows * WG, lo = WG;
  if (e || (rc = ocl_launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return ocl_get(c, S_OUT, ids, ib);
}

int ocl_attention(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos, int T, int n_head,
                         float scale) {
  const int t0 = 0;
  return ocl_attention_multi(b, out, q, kv, pos, &t0, &T, 1, n_head, scale);
}

// ---------------------------------------------------------------- reads one step behind

// A decode step's ids read without waiting (ll_backend.h read_async): an event per read, waited
// in order; its wait frees the upload arena up to where the read was queued (everything before
// it has run), so a run of queued steps never drains the queue to reuse the arena.
int ocl_read_async(struct ll_backend *b, void *dst, const void *src, size_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!c->queue_ahead) return LL_EUNSUPPORTED;
  const struct rbuf *r, *hr;
  size_t off, hoff;
  if (!n || !dst || ocl_resident(c, src, n, &r, &off) != 1 || ocl_resident(c, dst, n, &hr, &hoff) != 0) return LL_EINVAL;
  if (c->tk_next - c->tk_first >= LL_READ_TICKETS) return LL_EBUSY;
  if (c->tk_next == INT_MAX) return LL_ELIMIT;
  struct ocl_ticket *t = &c->tk[c->tk_next % LL_READ_TICKETS];
  cl_int e = clEnqueueReadBuffer(c->q, r->m, CL_FALSE, off, n, dst, 0, NULL, &t->ev);
  if (e != CL_SUCCESS) return ocl_cl_rc(e);
  c->bytes_down += (int64_t)n;
  t->mark = c->arena_used, t->lap = c->arena_lap, t->launches = c->launches;
  clFlush(c->q); // the device starts on what is queued while the host goes on
  return c->tk_next++;
}

int ocl_read_wait(struct ll_backend *b, int ticket) {
  struct ocl_ctx *c = CTX(b);
  if (ticket != c->tk_first || ticket >= c->tk_next) return LL_EINVAL;
  struct ocl_ticket *t = &c->tk[ticket % LL_READ_TICKETS];
  c->waits++;
  if (c->launches == t->launches) c->idle_waits++; // nothing queued behind it: the device runs dry
  cl_int e = clWaitForEvents(1, &t->ev);
  cl_int st = CL_COMPLETE;
  if (e == CL_SUCCESS) e = clGetEventInfo(t->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
  clReleaseEvent(t->ev);
  c->tk_first++;
  if (e == CL_SUCCESS && st < 0) e = st;
  if (e != CL_SUCCESS) return ocl_cl_rc(e);
  if (t->lap == c->arena_lap) { // the arena's bytes queued before the read have been read
    c->arena_tail = t->mark, c->arena_wrap = 0;
  } else if (t->lap + 1 == c->arena_lap && c->arena_wrap) {
    c->arena_tail = t->mark;
    if (c->arena_tail >= c->arena_end) c->arena_tail = 0, c->arena_wrap = 0;
  }
  return 0;
}
