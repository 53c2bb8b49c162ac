// train.c - the CPU backend's training members, fast versions of train_ref.c: the products go
// through OpenBLAS sgemm (single-threaded, inside our pool's tasks, as backend_cpu.c's float
// matmul), everything else over the pool in chunks.
//
// Every op splits its work by the shapes alone (fixed row/column blocks and chunk sizes, never
// by the thread count) and combines partial results in a fixed order, so its results are the
// same bit for bit for any thread count. Element-wise ops use the references' expressions and
// give their bits (rmsnorm's dx, rope, get_rows, dropout, axpy, scale, AdamW); products and
// reductions differ from the references by the summation order, swiglu and softmax_xent by
// ggml's vectorised exp instead of libm's (tested within a stated tolerance).
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "ll_cpu_dot.h"
#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "ll_threadpool.h"

// Work split (shapes only; see the file comment).
#define MM_TB 32       // dx of float weights with K <= MM_KX / 2: tokens per task
#define MM_KX 512      // dx of other weights: most columns of W per task (rounded to its blocks)
#define MM_NR 256      // ... rows of W dequantized per panel (MM_NR x MM_KX floats: 512 KiB)
#define MM_NB 64       // dw: rows of W per task
#define MM_KS 128      // dw: columns per task when W has few rows
#define ATT_B 64       // attention: query rows (and key rows) per block
#define EW_CHUNK 16384 // element-wise ops: elements per task
#define RN_RB 16       // rmsnorm_backward: rows per task
#define GR_CB 64       // get_rows_backward: columns per task

struct ll_cpu_train {
  float *panel; // per-thread dequantized W panels (MM_NR x ks), then per-thread rows (xent, rope)
  size_t panel_cap;
  float *ds; // attention_backward: (H, S, S) softmax gradients, scaled
  size_t ds_cap;
  double *part; // per-task partial sums / per-row losses
  size_t part_cap;
  float *dgp; // rmsnorm_backward: per-task partial dg (tasks, C)
  size_t dgp_cap;
  atomic_llong mem_used; // bytes held through alloc
};

static int grow(void *pp, size_t *cap, size_t need) {
  void **p = pp;
  if (need <= *cap) return 0;
  void *np = NULL;
  if (posix_memalign(&np, 64, need) != 0) return LL_ENOMEM;
  free(*p);
  *p = np;
  *cap = need;
  return 0;
}

static struct ll_cpu_train *state(struct ll_backend *b) {
  struct ll_cpu_train **t = ll_cpu_backend_train(b);
  if (!*t) *t = calloc(1, sizeof **t);
  return *t;
}

void ll_cpu_train_free(struct ll_cpu_train *t) {
  if (!t) return;
  free(t->panel);
  free(t->ds);
  free(t->part);
  free(t->dgp);
  free(t);
}

static int nthreads(struct ll_backend *b) { return ll_threadpool_size(ll_cpu_backend_pool(b)); }
static void run(struct ll_backend *b, ll_task_fn fn, void *ctx, int n) { ll_threadpool_run(ll_cpu_backend_pool(b), fn, ctx, n); }

// ---------------------------------------------------------------- memory
// Host memory, 64-byte aligned and zeroed, with its size in a 64-byte header so the backend can
// say how much the trainer holds (get_info's mem_used).
void *ll_train_cpu_alloc(struct ll_backend *b, size_t n) {
  struct ll_cpu_train *t = state(b);
  if (!t || n > SIZE_MAX - 128) return NULL;
  const size_t sz = ((n + 63) & ~(size_t)63) + 64;
  char *p = NULL;
  if (posix_memalign((void **)&p, 64, sz) != 0) return NULL;
  memset(p, 0, sz);
  memcpy(p, &sz, sizeof sz);
  atomic_fetch_add(&t->mem_used, (long long)sz);
  return p + 64;
}
void ll_train_cpu_free_buf(struct ll_backend *b, void *p) {
  if (!p) return;
  char *base = (char *)p - 64;
  size_t sz;
  memcpy(&sz, base, sizeof sz);
  struct ll_cpu_train *t = state(b);
  if (t) atomic_fetch_sub(&t->mem_used, (long long)sz);
  free(base);
}
int64_t ll_cpu_train_mem_used(struct ll_cpu_train *t) { return t ? (int64_t)atomic_load(&t->mem_used) : 0; }

// ---------------------------------------------------------------- matmul_backward
// dx (T, K) += dout (T, N) · W (N, K)
//   F32 W of few columns (LoRA B: out x r): each task a block of MM_TB tokens, one sgemm.
//   others: each task a slice of up to MM_KX columns of W (whole blocks), for all tokens: W's
//   rows dequantized MM_NR at a time into the thread's panel (F32: used in place), then
//   dx[:, slice] += dout[:, rows] · panel. Every weight is dequantized once per call, and tasks
//   write disjoint columns of dx. Wide slices amortise sgemm's packing of dout's panel (at
//   SmolLM2's K = 576, 2 slices of 288 ran 5-10% faster than 6 of 96).
// dw (N, K) += dout (T, N)ᵀ · x (T, K): each task MM_NB rows of dw (and MM_KS columns when N is
//   small), one sgemm.
struct mmb_job {
  float *dx, *dw;
  const float *dout, *x;
  const struct ll_weight *w;
  struct ll_cpu_train *st;
  size_t rs;         // bytes per row of W
  int T, N, K, ks;   // ks: columns per task (dx of quantized W)
  int bs;            // W's block size (elements)
  size_t bsz;        // bytes per block
  int panel_floats;  // per thread
  atomic_int rc;
};

static void mmb_dx_f32_task(void *vctx, int task, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  const int t0 = task * MM_TB, nt = j->T - t0 < MM_TB ? j->T - t0 : MM_TB;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nt, j->K, j->N, 1.0f, j->dout + (size_t)t0 * j->N, j->N, (const float *)j->w->data,
              j->K, 1.0f, j->dx + (size_t)t0 * j->K, j->K);
}

static void mmb_dx_q_task(void *vctx, int task, int thread) {
  struct mmb_job *j = vctx;
  const int k0 = task * j->ks, nk = j->K - k0 < j->ks ? j->K - k0 : j->ks;
  float *panel = j->st->panel + (size_t)thread * j->panel_floats; // (MM_NR, nk)
  const size_t off = (size_t)(k0 / j->bs) * j->bsz;
  const int f32 = j->w->type == LL_TYPE_F32;
  int (*const dq)(int, const void *, float *, int64_t) = ll_cpu_vec_ops()->dequant_row;
  for (int n0 = 0; n0 < j->N; n0 += MM_NR) {
    const int nr = j->N - n0 < MM_NR ? j->N - n0 : MM_NR;
    const float *wb = (const float *)j->w->data + (size_t)n0 * j->K + k0; // F32: in place
    int ldw = j->K;
    if (!f32) {
      for (int r = 0; r < nr; r++) {
        const int rc = dq(j->w->type, (const char *)j->w->data + (size_t)(n0 + r) * j->rs + off, panel + (size_t)r * nk, nk);
        if (rc) {
          atomic_store(&j->rc, rc);
          return;
        }
      }
      wb = panel, ldw = nk;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->T, nk, nr, 1.0f, j->dout + n0, j->N, wb, ldw, 1.0f, j->dx + k0, j->K);
  }
}

static void mmb_dw_task(void *vctx, int task, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  const int nkb = (j->K + j->ks - 1) / j->ks, nbi = task / nkb, kbi = task % nkb;
  const int n0 = nbi * MM_NB, nn = j->N - n0 < MM_NB ? j->N - n0 : MM_NB;
  const int k0 = kbi * j->ks, nk = j->K - k0 < j->ks ? j->K - k0 : j->ks;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nn, nk, j->T, 1.0f, j->dout + n0, j->N, j->x + k0, j->K, 1.0f,
              j->dw + (size_t)n0 * j->K + k0, j->K);
}

int ll_train_cpu_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x, const struct ll_weight *w,
                                 int T) {
  if (!w || !dout || T < 0 || w->k <= 0 || w->n <= 0 || w->k > INT32_MAX || w->n > INT32_MAX) return LL_EINVAL;
  if (dw && (w->type != LL_TYPE_F32 || !x)) return LL_EINVAL;
  const struct ll_type_traits *tr = ll_type_traits_get(w->type);
  const size_t rs = ll_row_size(w->type, w->k);
  if (!rs || !tr || !tr->has_dequant) return rs ? LL_EUNSUPPORTED : LL_EINVAL;
  struct ll_cpu_train *st = state(b);
  if (!st) return LL_ENOMEM;
  if (T == 0) return 0;
  struct mmb_job j = {.dx = dx, .dw = dw, .dout = dout, .x = x, .w = w, .st = st, .rs = rs, .T = T, .N = (int)w->n, .K = (int)w->k,
                      .bs = tr->blck_size, .bsz = tr->type_size};
  atomic_init(&j.rc, 0);
  if (dx && w->type == LL_TYPE_F32 && j.K <= MM_KX / 2) {
    run(b, mmb_dx_f32_task, &j, (T + MM_TB - 1) / MM_TB);
  } else if (dx) {
    // Slices of at most MM_KX columns in whole blocks, an even number of them (two threads
    // finish together): K = 576 gives 2 x 288, 1536 gives 4 x 384.
    int ns = (j.K + MM_KX - 1) / MM_KX;
    ns += ns & 1;
    j.ks = ((j.K + ns - 1) / ns + j.bs - 1) / j.bs * j.bs;
    if (j.ks < j.bs) j.ks = j.bs;
    j.panel_floats = MM_NR * j.ks;
    if (grow(&st->panel, &st->panel_cap, (size_t)nthreads(b) * j.panel_floats * sizeof(float))) return LL_ENOMEM;
    run(b, mmb_dx_q_task, &j, (j.K + j.ks - 1) / j.ks);
    const int rc = atomic_load(&j.rc);
    if (rc) return rc;
  }
  if (dw) {
    // MM_NB rows of dw per task; a matrix of few rows (LoRA A: r x in) also split in columns of
    // MM_KS, or it would be one task.
    const int nnb = (j.N + MM_NB - 1) / MM_NB;
    j.ks = nnb >= 4 ? j.K : MM_KS;
    run(b, mmb_dw_task, &j, nnb * ((j.K + j.ks - 1) / j.ks));
  }
  return 0;
}

// ---------------------------------------------------------------- rmsnorm_backward
// Rows in blocks of RN_RB: dx per row as the reference (same bits); dg's per-block partial sums
// added up in block order afterwards.
struct rnb_job {
  float *dx, *dgp;
  const float *dout, *x, *g;
  int T, C;
  float eps;
};
static void rnb_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct rnb_job *j = vctx;
  const int C = j->C, t0 = task * RN_RB, t1 = t0 + RN_RB < j->T ? t0 + RN_RB : j->T;
  float *dg = j->dgp ? j->dgp + (size_t)task * C : NULL;
  if (dg) memset(dg, 0, (size_t)C * sizeof *dg);
  for (int t = t0; t < t1; t++) {
    const float *xt = j->x + (size_t)t * C, *dt = j->dout + (size_t)t * C;
    double ss = 0, dot = 0;
    for (int i = 0; i < C; i++) ss += (double)(xt[i] * xt[i]);
    const float s = 1.0f / sqrtf((float)(ss / C) + j->eps);
    for (int i = 0; i < C; i++) dot += (double)dt[i] * j->g[i] * xt[i];
    const float c3 = (float)(dot * s * s * s / C);
    if (j->dx) {
      float *dxt = j->dx + (size_t)t * C;
      for (int i = 0; i < C; i++) dxt[i] += s * j->g[i] * dt[i] - xt[i] * c3;
    }
    if (dg)
      for (int i = 0; i < C; i++) dg[i] += dt[i] * xt[i] * s;
  }
}
int ll_train_cpu_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g, int T, int C,
                                  float eps) {
  if (!dout || !x || !g || T < 0 || C <= 0) return LL_EINVAL;
  struct ll_cpu_train *st = state(b);
  if (!st) return LL_ENOMEM;
  const int nt = (T + RN_RB - 1) / RN_RB;
  if (dg && grow(&st->dgp, &st->dgp_cap, (size_t)(nt ? nt : 1) * C * sizeof(float))) return LL_ENOMEM;
  struct rnb_job j = {dx, dg ? st->dgp : NULL, dout, x, g, T, C, eps};
  run(b, rnb_task, &j, nt);
  if (dg)
    for (int t = 0; t < nt; t++)
      for (int i = 0; i < C; i++) dg[i] += st->dgp[(size_t)t * C + i];
  return 0;
}

// ---------------------------------------------------------------- rope_backward
// One task per token (angles as the forward computes them; the reference's expression).
struct rpb_job {
  float *dx;
  const int32_t *pos;
  int H, hd;
  const struct ll_rope_params *p;
  float *tab; // per thread (n_rot) floats: cos then sin
};
static void rpb_task(void *vctx, int t, int thread) {
  const struct rpb_job *j = vctx;
  const int n = j->p->n_rot / 2, neox = j->p->mode == LL_ROPE_NEOX;
  float *cs = j->tab + (size_t)thread * 2 * (n + 1), *sn = cs + n + 1;
  ll_rope_angles(j->pos[t], j->p, cs, sn);
  for (int h = 0; h < j->H; h++) {
    float *v = j->dx + ((size_t)t * j->H + h) * j->hd;
    for (int i = 0; i < n; i++) {
      const int a = neox ? i : 2 * i, c = neox ? i + n : 2 * i + 1;
      const float da = v[a], dc = v[c];
      v[a] = da * cs[i] + dc * sn[i];
      v[c] = -da * sn[i] + dc * cs[i];
    }
  }
}
int ll_train_cpu_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim,
                               const struct ll_rope_params *p) {
  if (!dx || !pos || !p || T < 0 || n_head <= 0 || p->n_rot < 0 || p->n_rot % 2 || p->n_rot > head_dim) return LL_EINVAL;
  struct ll_cpu_train *st = state(b);
  if (!st) return LL_ENOMEM;
  if (grow(&st->panel, &st->panel_cap, (size_t)nthreads(b) * 2 * (p->n_rot / 2 + 1) * sizeof(float))) return LL_ENOMEM;
  struct rpb_job j = {dx, pos, n_head, head_dim, p, st->panel};
  run(b, rpb_task, &j, T);
  return 0;
}

// ---------------------------------------------------------------- element-wise ops
// Chunks of EW_CHUNK elements, the references' expressions (same bits; swiglu's exp excepted).
struct ew_job {
  float *out, *y, *m, *v;
  const float *x, *g, *u;
  double *part;
  int64_t n;
  float a, b1, b2, eps, lr, wd, bc1, bc2;
  uint64_t seed;
  uint32_t th;
  const struct ll_vec_ops *vo;
  int avx2; // adamw: the CPU has AVX2
};
#define EW_RANGE(j, task) \
  const int64_t i0 = (int64_t)(task) * EW_CHUNK, i1 = i0 + EW_CHUNK < (j)->n ? i0 + EW_CHUNK : (j)->n
static int ew_tasks(int64_t n) { return (int)((n + EW_CHUNK - 1) / EW_CHUNK); }

// e^-gate 256 at a time through ggml's vectorised exp (ll_vec_ops softmax with max 0: element by
// element, so the same bits however the range is cut), then the reference's expressions.
static void swb_task(void *vctx, int task, int thread) { // out = dgate, y = dup, x = dout, g = gate, u = up
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  float e[256];
  for (int64_t c0 = i0; c0 < i1; c0 += 256) {
    const int nc = i1 - c0 < 256 ? (int)(i1 - c0) : 256;
    for (int k = 0; k < nc; k++) e[k] = -j->g[c0 + k];
    j->vo->softmax(e, e, 0.0f, nc);
    for (int k = 0; k < nc; k++) {
      const int64_t i = c0 + k;
      const float gt = j->g[i], u = j->u[i], d = j->x[i];
      const float sg = 1.0f / (1.0f + e[k]);
      j->y[i] = d * gt * sg;
      j->out[i] = d * u * sg * (1.0f + gt * (1.0f - sg));
    }
  }
}
int ll_train_cpu_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                 int64_t n) {
  if (!dgate || !dup || !dout || !gate || !up || n < 0 || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ew_job j = {.out = dgate, .y = dup, .x = dout, .g = gate, .u = up, .n = n, .vo = ll_cpu_vec_ops()};
  run(b, swb_task, &j, ew_tasks(n));
  return 0;
}

// GeGLU's backward: the reference's expressions, element by element (the same bits).
static void gb_task(void *vctx, int task, int thread) { // out = dgate, y = dup, x = dout, g = gate, u = up
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  ll_train_ref_geglu_backward(NULL, j->out + i0, j->y + i0, j->x + i0, j->g + i0, j->u + i0, i1 - i0);
}
int ll_train_cpu_geglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                int64_t n) {
  if (!dgate || !dup || !dout || !gate || !up || n < 0 || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ew_job j = {.out = dgate, .y = dup, .x = dout, .g = gate, .u = up, .n = n};
  run(b, gb_task, &j, ew_tasks(n));
  return 0;
}

static void drop_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  for (int64_t i = i0; i < i1; i++) j->out[i] = ll_dropout_bits(j->seed, (uint64_t)i) >= j->th ? j->x[i] * j->a : 0.0f;
}
int ll_train_cpu_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n) {
  if (!out || !x || n < 0 || !(p >= 0.0f && p < 1.0f) || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ew_job j = {.out = out, .x = x, .n = n, .a = 1.0f / (1.0f - p), .seed = ll_mix64(seed), .th = ll_dropout_threshold(p)};
  run(b, drop_task, &j, ew_tasks(n));
  return 0;
}

// Σ x² per chunk in double (four chains: the adds do not wait on each other), chunks in order.
static void sumsq_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  double s[4] = {0, 0, 0, 0};
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4)
    for (int l = 0; l < 4; l++) s[l] += (double)j->x[i + l] * j->x[i + l];
  for (; i < i1; i++) s[0] += (double)j->x[i] * j->x[i];
  j->part[task] = (s[0] + s[1]) + (s[2] + s[3]);
}
int ll_train_cpu_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n) {
  if (!out || !x || n < 0 || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ll_cpu_train *st = state(b);
  const int nt = ew_tasks(n);
  if (!st || grow(&st->part, &st->part_cap, (size_t)(nt ? nt : 1) * sizeof(double))) return LL_ENOMEM;
  struct ew_job j = {.x = x, .n = n, .part = st->part};
  run(b, sumsq_task, &j, nt);
  double s = 0;
  for (int t = 0; t < nt; t++) s += st->part[t];
  *out = s;
  return 0;
}

static void axpy_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  for (int64_t i = i0; i < i1; i++) j->out[i] += j->a * j->x[i];
}
int ll_train_cpu_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n) {
  if (!out || !x || n < 0 || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ew_job j = {.out = out, .x = x, .n = n, .a = alpha};
  run(b, axpy_task, &j, ew_tasks(n));
  return 0;
}

static void scale_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  for (int64_t i = i0; i < i1; i++) j->out[i] *= j->a;
}
int ll_train_cpu_scale(struct ll_backend *b, float *x, float alpha, int64_t n) {
  if (!x || n < 0 || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ew_job j = {.out = x, .n = n, .a = alpha};
  run(b, scale_task, &j, ew_tasks(n));
  return 0;
}

static void adamw_task(void *vctx, int task, int thread) { // out = p, m, v, g
  (void)thread;
  const struct ew_job *j = vctx;
  EW_RANGE(j, task);
  const float beta1 = j->b1, beta2 = j->b2, bc1 = j->bc1, bc2 = j->bc2, lr = j->lr, eps = j->eps, wd = j->wd;
  float *p = j->out, *m = j->m, *v = j->v;
#if defined(__x86_64__)
  if (j->avx2) { // the same bits, 8 at a time
    ll_train_adamw_avx2(p + i0, j->g + i0, m + i0, v + i0, i1 - i0, lr, beta1, beta2, eps, wd, bc1, bc2);
    return;
  }
#endif
  for (int64_t i = i0; i < i1; i++) {
    const float gi = j->g[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float mh = m[i] / bc1, vh = v[i] / bc2;
    p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
  }
}
int ll_train_cpu_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                       float eps, float wd, int step) {
  if (!p || !g || !m || !v || n < 0 || step < 1 || n / EW_CHUNK >= INT32_MAX) return LL_EINVAL;
  struct ew_job j = {.out = p, .g = g, .m = m, .v = v, .n = n, .b1 = beta1, .b2 = beta2, .eps = eps, .lr = lr, .wd = wd,
                     .bc1 = (float)(1.0 - pow(beta1, step)), .bc2 = (float)(1.0 - pow(beta2, step)),
                     .avx2 = strcmp(ll_cpu_isa(), "scalar") != 0};
  run(b, adamw_task, &j, ew_tasks(n));
  return 0;
}

// ---------------------------------------------------------------- get_rows_backward
// Tasks own column slices of GR_CB: every token's row goes in token order (the reference's bits),
// repeated ids never race.
struct grb_job {
  float *dw;
  const float *dout;
  const int32_t *ids;
  int T, C;
};
static void grb_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct grb_job *j = vctx;
  const int c0 = task * GR_CB, c1 = c0 + GR_CB < j->C ? c0 + GR_CB : j->C;
  for (int t = 0; t < j->T; t++) {
    float *row = j->dw + (size_t)j->ids[t] * j->C;
    const float *d = j->dout + (size_t)t * j->C;
    for (int c = c0; c < c1; c++) row[c] += d[c];
  }
}
int ll_train_cpu_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C) {
  if (!dw || !dout || !ids || T < 0 || C <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (ids[t] < 0) return LL_EINVAL;
  struct grb_job j = {dw, dout, ids, T, C};
  run(b, grb_task, &j, (C + GR_CB - 1) / GR_CB);
  return 0;
}

// ---------------------------------------------------------------- softmax_xent
// One task per row: max, e^(l - max) and their sum with ggml's vectorised exp (ll_vec_ops
// softmax, into dlogits' row or the thread's scratch row), then the row's gradient in place.
// Row losses are summed in row order afterwards.
struct xe_job {
  double *loss_rows;
  float *d;
  const float *l;
  const int32_t *y;
  int V;
  float gs;
  float *rows; // per thread (V) when d is NULL
  const struct ll_vec_ops *vo;
};
static float row_max(const float *l, int V) {
  float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int j = 0;
  for (; j + 8 <= V; j += 8)
    for (int q = 0; q < 8; q++) m[q] = l[j + q] > m[q] ? l[j + q] : m[q];
  for (; j < V; j++) m[0] = l[j] > m[0] ? l[j] : m[0];
  float r = m[0];
  for (int q = 1; q < 8; q++) r = m[q] > r ? m[q] : r;
  return r;
}
static void xe_task(void *vctx, int t, int thread) {
  const struct xe_job *j = vctx;
  const int V = j->V, y = j->y[t];
  const float *l = j->l + (size_t)t * V;
  float *d = j->d ? j->d + (size_t)t * V : NULL;
  if (y < 0) {
    j->loss_rows[t] = 0;
    if (d) memset(d, 0, (size_t)V * sizeof *d);
    return;
  }
  const float m = row_max(l, V), ly = l[y];
  float *e = d ? d : j->rows + (size_t)thread * V;
  const double sum = j->vo->softmax(e, l, m, V); // e may be l (d aliasing the logits)
  j->loss_rows[t] = log(sum) - ((double)ly - m);
  if (!d) return;
  const float inv = (float)(1.0 / sum), gs = j->gs, ey = e[y]; // (e is d: read e[y] first)
  for (int i = 0; i < V; i++) d[i] = e[i] * inv * gs;
  d[y] = (ey * inv - 1.0f) * gs;
}
int ll_train_cpu_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets, int T, int V,
                              float grad_scale) {
  if (!loss || !logits || !targets || T < 0 || V <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (targets[t] >= V) return LL_EINVAL;
  struct ll_cpu_train *st = state(b);
  if (!st || grow(&st->part, &st->part_cap, (size_t)(T ? T : 1) * sizeof(double))) return LL_ENOMEM;
  if (!dlogits && grow(&st->panel, &st->panel_cap, (size_t)nthreads(b) * V * sizeof(float))) return LL_ENOMEM;
  struct xe_job j = {st->part, dlogits, logits, targets, V, grad_scale, st->panel, ll_cpu_vec_ops()};
  run(b, xe_task, &j, T);
  double s = 0;
  for (int t = 0; t < T; t++) s += st->part[t];
  *loss = s;
  return 0;
}

// ---------------------------------------------------------------- attention (training)
// Blocks of ATT_B query rows per head; a block's rows see keys [0, i1) only (causal), so the
// products skip the upper triangle block by block. Head h's q, out rows are strided views
// (leading dimension H hd) and kv head kh's k, v rows too (Hkv hd): sgemm reads them in place.
struct att_job {
  float *out, *att, *dq, *dk, *dv, *ds;
  const float *q, *k, *v, *dout;
  int S, H, Hkv, hd, nb, window;
  float scale;
  const struct ll_vec_ops *vo;
};

// forward: scores (nr, i1) = scale q_rows · k[0:i1]ᵀ into att's rows; causal softmax per row;
// out_rows = att_rows (nr, i1) · v[0:i1].
static void att_fwd_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct att_job *j = vctx;
  const int H = j->H, Hkv = j->Hkv, hd = j->hd, S = j->S;
  const int h = task % H, ib = j->nb - 1 - task / H; // the longest blocks first
  const int kh = h / (H / Hkv), i0 = ib * ATT_B, i1 = i0 + ATT_B < S ? i0 + ATT_B : S, nr = i1 - i0;
  float *a = j->att + ((size_t)h * S + i0) * S; // (nr, S), ld S
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, i1, hd, j->scale, j->q + ((size_t)i0 * H + h) * hd, H * hd, j->k + (size_t)kh * hd,
              Hkv * hd, 0.0f, a, S);
  for (int r = 0; r < nr; r++) {
    float *p = a + (size_t)r * S;
    const int n = i0 + r + 1, lo = j->window > 0 && n > j->window ? n - j->window : 0; // keys lo..i
    float mx = -INFINITY;
    for (int c = lo; c < n; c++) mx = p[c] > mx ? p[c] : mx;
    const float inv = (float)(1.0 / j->vo->softmax(p + lo, p + lo, mx, n - lo));
    for (int c = lo; c < n; c++) p[c] *= inv;
    memset(p, 0, (size_t)lo * sizeof *p);
    memset(p + n, 0, (size_t)(S - n) * sizeof *p);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hd, i1, 1.0f, a, S, j->v + (size_t)kh * hd, Hkv * hd, 0.0f,
              j->out + ((size_t)i0 * H + h) * hd, H * hd);
}

int ll_train_cpu_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S,
                                 int n_head, int n_head_kv, int head_dim, float scale) {
  return ll_train_cpu_attention_train_swa(b, out, att, q, k, v, S, n_head, n_head_kv, head_dim, scale, 0);
}
// With a window: each row's softmax over its keys lo..i, zeros left of lo (the products still
// span the block's [0, i1): a window's saving is not taken).
int ll_train_cpu_attention_train_swa(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S,
                                     int n_head, int n_head_kv, int head_dim, float scale, int window) {
  if (!out || !att || !q || !k || !v || S < 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_head % n_head_kv) return LL_EINVAL;
  const int nb = (S + ATT_B - 1) / ATT_B;
  struct att_job j = {.out = out, .att = att, .q = q, .k = k, .v = v, .S = S, .H = n_head, .Hkv = n_head_kv, .hd = head_dim, .nb = nb,
                      .window = window, .scale = scale, .vo = ll_cpu_vec_ops()};
  run(b, att_fwd_task, &j, nb * n_head);
  return 0;
}

// backward, phase 1 per (head, query block): dp (nr, i1) = dout_rows · v[0:i1]ᵀ into ds; per row
// ds = p (dp - Σ p dp) scale (0 right of the diagonal); dq_rows = ds (nr, i1) · k[0:i1].
static void att_bwd_q_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct att_job *j = vctx;
  const int H = j->H, Hkv = j->Hkv, hd = j->hd, S = j->S;
  const int h = task % H, ib = j->nb - 1 - task / H;
  const int kh = h / (H / Hkv), i0 = ib * ATT_B, i1 = i0 + ATT_B < S ? i0 + ATT_B : S, nr = i1 - i0;
  float *ds = j->ds + ((size_t)h * S + i0) * S;
  const float *pa = j->att + ((size_t)h * S + i0) * S;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, i1, hd, 1.0f, j->dout + ((size_t)i0 * H + h) * hd, H * hd, j->v + (size_t)kh * hd,
              Hkv * hd, 0.0f, ds, S);
  for (int r = 0; r < nr; r++) {
    float *d = ds + (size_t)r * S;
    const float *p = pa + (size_t)r * S;
    const int n = i0 + r + 1;
    double D = 0;
    for (int c = 0; c < n; c++) D += (double)p[c] * d[c];
    const float Df = (float)D;
    for (int c = 0; c < n; c++) d[c] = p[c] * (d[c] - Df) * j->scale;
    for (int c = n; c < i1; c++) d[c] = 0;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hd, i1, 1.0f, ds, S, j->k + (size_t)kh * hd, Hkv * hd, 0.0f,
              j->dq + ((size_t)i0 * H + h) * hd, H * hd);
}

// phase 2 per (kv head, key block [j0, j1)): only queries i >= j0 see these keys, so
//   dv_rows = Σ_h att_h[j0:S, j0:j1]ᵀ · dout_h[j0:S];  dk_rows = Σ_h ds_h[j0:S, j0:j1]ᵀ · q_h[j0:S]
// the heads of the group added in head order.
static void att_bwd_kv_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct att_job *j = vctx;
  const int H = j->H, Hkv = j->Hkv, hd = j->hd, S = j->S, grp = H / Hkv;
  const int kh = task % Hkv, jb = task / Hkv; // the longest (first) blocks first
  const int j0 = jb * ATT_B, j1 = j0 + ATT_B < S ? j0 + ATT_B : S, nj = j1 - j0, ni = S - j0;
  float *dv = j->dv + ((size_t)j0 * Hkv + kh) * hd, *dk = j->dk + ((size_t)j0 * Hkv + kh) * hd;
  for (int g = 0; g < grp; g++) {
    const int h = kh * grp + g;
    const float beta = g ? 1.0f : 0.0f;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nj, hd, ni, 1.0f, j->att + ((size_t)h * S + j0) * S + j0, S,
                j->dout + ((size_t)j0 * H + h) * hd, H * hd, beta, dv, Hkv * hd);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nj, hd, ni, 1.0f, j->ds + ((size_t)h * S + j0) * S + j0, S,
                j->q + ((size_t)j0 * H + h) * hd, H * hd, beta, dk, Hkv * hd);
  }
}

int ll_train_cpu_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                    const float *v, const float *att, int S, int n_head, int n_head_kv, int head_dim, float scale) {
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !att || S < 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 ||
      n_head % n_head_kv)
    return LL_EINVAL;
  if (S == 0) return 0;
  struct ll_cpu_train *st = state(b);
  if (!st || grow(&st->ds, &st->ds_cap, (size_t)n_head * S * S * sizeof(float))) return LL_ENOMEM;
  const int nb = (S + ATT_B - 1) / ATT_B;
  struct att_job j = {.dq = dq, .dk = dk, .dv = dv, .ds = st->ds, .att = (float *)att, .q = q, .k = k, .v = v, .dout = dout, .S = S,
                      .H = n_head, .Hkv = n_head_kv, .hd = head_dim, .nb = nb, .scale = scale};
  run(b, att_bwd_q_task, &j, nb * n_head);
  run(b, att_bwd_kv_task, &j, nb * n_head_kv);
  return 0;
}
