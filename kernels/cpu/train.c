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

// Work split (shapes only; see the file comment). Issue 30: every product of a training step
// gives a 16-thread pool at least 16 tasks of equal size at SmolLM2-135M's shapes (seq 256): the
// task counts below are multiples of 16 wherever the product is that large.
#define MM_SPLIT 16    // the thread count the splits are balanced for (task counts: its multiples)
#define MM_TB 16       // dx of float weights with K <= MM_KX / 2 (LoRA B): tokens per task
#define MM_KX 512      // dx: most columns of a product tile
#define MM_TT 64       // dx, shared panels: tokens per product tile
#define MM_PF (1 << 19) // dx, shared panels: most floats of W dequantized at a time (2 MiB)
#define MM_DR 16       // ... rows of W dequantized per task
#define MM_NR 256      // dx, row chunks: rows of W dequantized at a time into a thread's panel
#define MM_TALL 32     // dx: W with at least MM_TALL x T rows (the output head) goes by row chunks
#define MM_NC 32       // ... at most this many chunks (partial sums: MM_NC x T x K floats)
#define MM_WORK (1 << 24) // ... and chunks of at most about this many multiply-adds per task
#define ATT_B 64       // attention: query rows per block
#define ATT_KB 32      // attention_backward: key rows per block (12 tasks at SmolLM2's 3 kv heads with 64)
#define EW_CHUNK 16384 // element-wise ops: elements per task
#define RN_RB 16       // rmsnorm_backward: rows per task
#define GR_CB 64       // get_rows_backward: columns per task

struct ll_cpu_train {
  float *panel; // matmul_backward's dequantized W panels (shared or per thread); per-thread rows (xent, rope)
  size_t panel_cap;
  float *dxp; // matmul_backward by row chunks: (chunks, T, K) partial sums
  size_t dxp_cap;
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
  free(t->dxp);
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
// dx (T, K) += dout (T, N) · W (N, K), by one of three splits (each a function of the shapes):
//   F32 W of few columns (LoRA B: out x r): each task a block of MM_TB tokens, one sgemm.
//   Tall W (the output head: N >= MM_TALL T): row chunks. Each task a (chunk of rows, slice of
//     at most MM_KX columns in whole blocks) pair: the chunk's rows dequantized MM_NR at a time
//     into the thread's panel, its partial product P_c (T, slice) summed over them; then
//     dx += P_0 + P_1 + ... in chunk order, by token rows. Each weight is dequantized once and
//     the partial sums are small beside W (MM_NC x T x K floats against N x K).
//   Others (the layers' weights): shared panels. W in panels of whole rows (at most MM_PF
//     floats; F32 W: all of it, in place), each dequantized once into a buffer the tasks share
//     (MM_DR rows per task), then dx[t-tile, k-tile] += dout[t-tile, panel rows] · panel[:,
//     k-tile] over tiles of MM_TT tokens x a power-of-two fraction of K, panels in row order.
//   Issue 30: the split was column slices only (2 of 288 at K = 576, for all tokens): a 16-thread
//   pool ran every dx product of SmolLM2 - the vocabulary's included - on 2 of its threads. At
//   T = 256 it is now 4 x 4 = 16 tiles at K = 576 and 4 x 4 at 1536; the head (T = 64 rows a
//   chunk) 32 chunks x 2 slices. Smaller tiles cost sgemm more packing per FLOP (one thread's CPU
//   time in dx: +5% for 128 x 64 tiles from 512 KiB panels, 43614a6), row chunks a pass over the
//   partial sums.
// dw (N, K) += dout (T, N)ᵀ · x (T, K): tasks of N / MM_SPLIT rows (at least 4), or of K /
//   MM_SPLIT columns when W has fewer than 4 MM_SPLIT rows (LoRA A: r x in); one sgemm each.
struct mmb_job {
  float *dx, *dw;
  const float *dout, *x;
  const struct ll_weight *w;
  float *panel;      // shared panels: (np, K) rows n0.. of W as floats; row chunks: per thread (MM_NR, ks)
  float *part;       // row chunks: (nc, T, K) partial sums
  size_t rs;         // bytes per row of W
  int T, N, K;       //
  int tt, ks;        // tile: tokens, columns (dw: rows tt x columns ks)
  int n0, np;        // shared panels: the panel's first row and row count
  int nc, cr;        // row chunks: count, rows per chunk
  int bs;            // W's block size (elements)
  size_t bsz;        // bytes per block
  atomic_int rc;
};

static void mmb_dx_f32_task(void *vctx, int task, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  const int t0 = task * MM_TB, nt = j->T - t0 < MM_TB ? j->T - t0 : MM_TB;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nt, j->K, j->N, 1.0f, j->dout + (size_t)t0 * j->N, j->N, (const float *)j->w->data,
              j->K, 1.0f, j->dx + (size_t)t0 * j->K, j->K);
}

// Row chunks: task = chunk c x slice s.
static void mmb_dx_chunk_task(void *vctx, int task, int thread) {
  struct mmb_job *j = vctx;
  const int nsl = (j->K + j->ks - 1) / j->ks, c = task / nsl, k0 = task % nsl * j->ks, nk = j->K - k0 < j->ks ? j->K - k0 : j->ks;
  const int r0 = c * j->cr, r1 = r0 + j->cr < j->N ? r0 + j->cr : j->N;
  float *panel = j->panel + (size_t)thread * MM_NR * j->ks, *p = j->part + (size_t)c * j->T * j->K + k0;
  const size_t off = (size_t)(k0 / j->bs) * j->bsz;
  const int f32 = j->w->type == LL_TYPE_F32;
  int (*const dq)(int, const void *, float *, int64_t) = ll_cpu_vec_ops()->dequant_row;
  for (int n0 = r0; n0 < r1; n0 += MM_NR) {
    const int nr = r1 - n0 < MM_NR ? r1 - n0 : MM_NR;
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->T, nk, nr, 1.0f, j->dout + n0, j->N, wb, ldw, n0 > r0 ? 1.0f : 0.0f, p, j->K);
  }
}

// Row chunks' sum, one token row per task: dx += P_0 + P_1 + ..., in chunk order.
static void mmb_dx_sum_task(void *vctx, int t, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  float *d = j->dx + (size_t)t * j->K;
  for (int c = 0; c < j->nc; c++) {
    const float *p = j->part + ((size_t)c * j->T + t) * j->K;
    for (int k = 0; k < j->K; k++) d[k] += p[k];
  }
}

static void mmb_dq_task(void *vctx, int task, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  const int r0 = task * MM_DR, r1 = r0 + MM_DR < j->np ? r0 + MM_DR : j->np;
  int (*const dq)(int, const void *, float *, int64_t) = ll_cpu_vec_ops()->dequant_row;
  for (int r = r0; r < r1; r++) {
    const int rc = dq(j->w->type, (const char *)j->w->data + (size_t)(j->n0 + r) * j->rs, j->panel + (size_t)r * j->K, j->K);
    if (rc) atomic_store(&j->rc, rc);
  }
}

static void mmb_dx_tile_task(void *vctx, int task, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  const int nkt = (j->K + j->ks - 1) / j->ks, t0 = task / nkt * j->tt, k0 = task % nkt * j->ks;
  const int nt = j->T - t0 < j->tt ? j->T - t0 : j->tt, nk = j->K - k0 < j->ks ? j->K - k0 : j->ks;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nt, nk, j->np, 1.0f, j->dout + (size_t)t0 * j->N + j->n0, j->N, j->panel + k0, j->K,
              1.0f, j->dx + (size_t)t0 * j->K + k0, j->K);
}

static void mmb_dw_task(void *vctx, int task, int thread) {
  (void)thread;
  struct mmb_job *j = vctx;
  const int nkb = (j->K + j->ks - 1) / j->ks, nbi = task / nkb, kbi = task % nkb;
  const int n0 = nbi * j->tt, nn = j->N - n0 < j->tt ? j->N - n0 : j->tt;
  const int k0 = kbi * j->ks, nk = j->K - k0 < j->ks ? j->K - k0 : j->ks;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nn, nk, j->T, 1.0f, j->dout + n0, j->N, j->x + k0, j->K, 1.0f,
              j->dw + (size_t)n0 * j->K + k0, j->K);
}

static int div_up(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// The shared panels' tiles: MM_TT tokens x K / nk columns, nk the least power of two that makes
// at least MM_SPLIT tiles with columns of at most MM_KX (and at least 16).
static void mmb_tiles(int T, int K, int *tt, int *ks) {
  const int ntt = div_up(T, MM_TT);
  int nk = 1;
  while ((ntt * nk < MM_SPLIT || div_up(K, nk) > MM_KX) && div_up(K, 2 * nk) >= 16) nk *= 2;
  *tt = MM_TT;
  *ks = div_up(K, nk);
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
  struct mmb_job j = {.dx = dx, .dw = dw, .dout = dout, .x = x, .w = w, .rs = rs, .T = T, .N = (int)w->n, .K = (int)w->k,
                      .bs = tr->blck_size, .bsz = tr->type_size};
  atomic_init(&j.rc, 0);
  const int f32 = w->type == LL_TYPE_F32;
  if (dx && f32 && j.K <= MM_KX / 2) {
    run(b, mmb_dx_f32_task, &j, div_up(T, MM_TB));
  } else if (dx && (int64_t)j.N >= (int64_t)MM_TALL * T) {
    // Slices of at most MM_KX columns in whole blocks, a power of two of them; chunks of whole
    // MM_NR panels, as many as make MM_SPLIT tasks and tasks of about MM_WORK (at most MM_NC).
    int ns = 1;
    while (div_up(j.K, ns) > MM_KX && div_up(j.K, 2 * ns) >= j.bs) ns *= 2;
    j.ks = div_up(div_up(j.K, ns), j.bs) * j.bs;
    ns = div_up(j.K, j.ks);
    int nc = div_up(MM_SPLIT, ns);
    const int64_t work = (int64_t)T * j.N * j.K / MM_WORK;
    while (nc < MM_NC && (int64_t)nc * ns < work) nc += div_up(MM_SPLIT, ns);
    if (nc > MM_NC) nc = MM_NC;
    j.cr = div_up(div_up(j.N, nc), MM_NR) * MM_NR;
    j.nc = div_up(j.N, j.cr);
    if (grow(&st->panel, &st->panel_cap, (size_t)nthreads(b) * MM_NR * j.ks * sizeof(float)) ||
        grow(&st->dxp, &st->dxp_cap, (size_t)j.nc * T * j.K * sizeof(float)))
      return LL_ENOMEM;
    j.panel = st->panel, j.part = st->dxp;
    run(b, mmb_dx_chunk_task, &j, j.nc * ns);
    const int rc = atomic_load(&j.rc);
    if (rc) return rc;
    run(b, mmb_dx_sum_task, &j, T);
  } else if (dx) {
    int np = f32 ? j.N : MM_PF / j.K;
    if (np < MM_DR) np = MM_DR;
    if (np > j.N) np = j.N;
    if (!f32 && grow(&st->panel, &st->panel_cap, (size_t)np * j.K * sizeof(float))) return LL_ENOMEM;
    mmb_tiles(T, j.K, &j.tt, &j.ks);
    const int ntasks = div_up(T, j.tt) * div_up(j.K, j.ks);
    for (j.n0 = 0; j.n0 < j.N; j.n0 += np) {
      j.np = j.N - j.n0 < np ? j.N - j.n0 : np;
      if (f32) {
        j.panel = (float *)w->data + (size_t)j.n0 * j.K;
      } else {
        j.panel = st->panel;
        run(b, mmb_dq_task, &j, div_up(j.np, MM_DR));
        const int rc = atomic_load(&j.rc);
        if (rc) return rc;
      }
      run(b, mmb_dx_tile_task, &j, ntasks);
    }
  }
  if (dw) {
    // N / MM_SPLIT rows of dw per task (at least 4); a matrix of few rows (LoRA A: r x in) in
    // K / MM_SPLIT columns instead (at least 16), or it would be one task.
    if (j.N >= 4 * MM_SPLIT) {
      j.tt = div_up(div_up(j.N, MM_SPLIT), 4) * 4, j.ks = j.K;
    } else {
      j.tt = j.N, j.ks = div_up(j.K, MM_SPLIT);
      if (j.ks < 16) j.ks = 16;
    }
    run(b, mmb_dw_task, &j, div_up(j.N, j.tt) * div_up(j.K, j.ks));
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

// phase 2 per (kv head, key block [j0, j1) of ATT_KB keys): only queries i >= j0 see these keys, so
//   dv_rows = Σ_h att_h[j0:S, j0:j1]ᵀ · dout_h[j0:S];  dk_rows = Σ_h ds_h[j0:S, j0:j1]ᵀ · q_h[j0:S]
// the heads of the group added in head order.
static void att_bwd_kv_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct att_job *j = vctx;
  const int H = j->H, Hkv = j->Hkv, hd = j->hd, S = j->S, grp = H / Hkv;
  const int kh = task % Hkv, jb = task / Hkv; // the longest (first) blocks first
  const int j0 = jb * ATT_KB, j1 = j0 + ATT_KB < S ? j0 + ATT_KB : S, nj = j1 - j0, ni = S - j0;
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
  run(b, att_bwd_kv_task, &j, (S + ATT_KB - 1) / ATT_KB * n_head_kv);
  return 0;
}
