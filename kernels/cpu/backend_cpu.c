// backend_cpu.c - the CPU backend: struct ll_backend_i over our thread pool and the dot
// kernels of ll_cpu_dot.h. Reference numerics follow llama.cpp's CPU path (activation
// quantization per weight type, f16 KV cache with f16 query/probability conversion), so that
// greedy outputs can be compared token for token.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cblas.h>

#include "ll_backend.h"
#include "ll_cpu_dot.h"
#include "ll_ref.h"
#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "ll_threadpool.h"

struct cpu_ctx {
  struct ll_threadpool *pool;
  int n_threads;
  void *act;          // quantized activations (T rows)
  size_t act_cap;
  void *act16;        // the same, transposed for gemm16 (ll_act_t16_q8_0)
  size_t act16_cap;
  float *asc;         // their side tables for tile_sc, block-major: scales as floats (nb, T),
  size_t asc_cap;     //   then the second table (nb, T) (ll_act_side)
  float *wbuf;        // float weight rows for sgemm (LL_BLAS_ROWS x K per thread)
  size_t wbuf_cap;
  float *scratch;     // per-thread scratch (attention scores, rope tables)
  // RoPE's cos/sin tables (T, n_rot/2) each, kept for the positions and parameters they were
  // made for: every layer's q and k of one step rotate at the same positions, so a step
  // computes them once instead of twice per layer.
  float *rope_cs;
  size_t rope_cap;      // floats in rope_cs (cos table then sin table)
  int32_t *rope_pos;    // (rope_T) the positions of the tables
  int rope_T, rope_n;   // tokens, pairs per token (0: no tables)
  struct ll_rope_params rope_p;
  size_t scratch_per_thread;
  struct ll_cpu_train *train; // train.c's scratch and memory count (created on first use)
  char device[128];
};

static struct cpu_ctx *C(struct ll_backend *b) { return b->ctx; }
struct ll_threadpool *ll_cpu_backend_pool(struct ll_backend *b) { return C(b)->pool; }
struct ll_cpu_train **ll_cpu_backend_train(struct ll_backend *b) { return &C(b)->train; }

static int grow(void **p, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  void *np = NULL;
  if (posix_memalign(&np, 64, need) != 0) return LL_ENOMEM;
  free(*p);
  *p = np;
  *cap = need;
  return 0;
}

// ---------------------------------------------------------------- matmul

struct mm_job {
  float *out;
  const void *w;
  size_t w_row, a_row;
  const char *act;
  const struct ll_type_kernels *k;
  int T, N, K, accumulate;
  int chunk;       // rows per task (a multiple of 4, of pack_rows with packed; see plan_job)
  const float *sc;   // (nb, T) activation scales for k->tile_sc, or NULL
  const int32_t *ss; // (nb, T) the second side table for k->tile_sc
  const char *packed; // w's interleaved copy for k->tile_packed (with sc where k takes them), or NULL
  const char *at;     // the activations' first T / 16 * 16 rows for k->gemm16 (ll_act_t16_*), or NULL
  size_t at_group;    // bytes per group of 16 there
};

// out (na, nr) += tile (na, nr) with row strides os and ts: the residual adds of the O and down
// projections. Locals and restrict so that the compiler makes one vector add per token
// (the same single adds, so the same bits); through j->out it reloaded the pointer per element.
static inline void mm_add_tile(float *restrict out, size_t os, const float *restrict tile, int ts, int na, int nr) {
  for (int q = 0; q < na; q++) {
    float *restrict o = out + (size_t)q * os;
    const float *restrict x = tile + (size_t)q * ts;
    if (nr == 4)
      for (int r = 0; r < 4; r++) o[r] += x[r];
    else
      for (int r = 0; r < nr; r++) o[r] += x[r];
  }
}

// Rows [n, n1) of the packed copy, group by group (n a multiple of pack_rows; a short group at
// the end is left to the caller). Returns the first row not done.
static int mm_packed(const struct mm_job *j, int n, int n1) {
  const int PR = j->k->pack_rows, np = j->N - j->N % PR;
  float tile[4][8]; // (tokens <= 4) x (pack_rows <= 8)
  for (; n + PR <= n1 && n + PR <= np; n += PR) {
    const char *g = j->packed + (size_t)n * j->w_row; // a group takes its rows' bytes
    for (int t = 0; t < j->T; t += 4) {
      const int na = j->T - t >= 4 ? 4 : j->T - t;
      const char *at = j->act + (size_t)t * j->a_row;
      const float *sc = j->sc ? j->sc + t : NULL; // (the K-quants' kernels take no side tables)
      const int32_t *ss = j->ss ? j->ss + t : NULL;
      if (!j->accumulate) {
        j->k->tile_packed(j->K, g, at, j->a_row, na, sc, ss, (size_t)j->T, j->out + (size_t)t * j->N + n, (size_t)j->N);
        continue;
      }
      j->k->tile_packed(j->K, g, at, j->a_row, na, sc, ss, (size_t)j->T, &tile[0][0], 8);
      mm_add_tile(j->out + (size_t)t * j->N + n, (size_t)j->N, &tile[0][0], 8, na, PR);
    }
  }
  return n;
}

static void mm_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct mm_job *j = vctx;
  const int n0 = task * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
  float tile[8][4]; // (tile_na <= 8) x 4 rows
  const int tna = j->k->tile_na > 0 ? j->k->tile_na : 2;
  for (int n = j->packed ? mm_packed(j, n0, n1) : n0; n < n1;) {
    const char *wr = (const char *)j->w + (size_t)n * j->w_row;
    if (j->k->tile && n + 4 <= n1) {
      // Decode streams the weights once: ask for the next group of rows while this one is
      // computed (short rows end before the hardware prefetcher has ramped up).
      // The group PD ahead (at a chunk's start all up to it), within this chunk.
      // Four groups ahead: with the four-row kernels a group takes ~50 ns on one thread, less
      // than a DRAM miss; two groups ahead left the row heads' loads waiting (Q4_0/Q4_1 tg
      // +3-10% at 4 vs 2; 6 and 8 were no better).
      // (Batched steps need it too: without it tg64x8 fell by a third.)
      enum { PD = 4 };
      const size_t g = 4 * j->w_row, here = (size_t)n * j->w_row, stop = (size_t)n1 * j->w_row;
      const size_t to = here + (PD + 1) * g < stop ? here + (PD + 1) * g : stop;
      // Into L2 (prefetcht1), not L1 as non-temporal (prefetchnta, before): measured 2026-11-23
      // 21:25 UTC on the quiet 2-vCPU EPYC, 1 thread, tg64, AVX2 path: Q8_0 52-59 -> 103-123
      // tok/s, Q4_0 69-78 -> 117-148, Q4_1 69 -> 131-149, Q4_K_M 70 -> 84-95; AVX-512 VNNI
      // Q4_1 97-117 -> 116-126 (prefetcht0 and none: no better than nta).
      // Not for prompt-sized batches: they are compute-bound, each group is used by T/8 tiles
      // from L1, and the loop itself took 0.6% of a Q8_0 pp128 (perf, 2026-11-24, Zen 3).
      if (j->T < 32)
        for (size_t off = here + (n == n0 ? g : PD * g); off < to; off += 64) __builtin_prefetch((const char *)j->w + off, 0, 2);
      int t = 0;
      if (j->at) { // whole groups of 16 tokens, LL_GEMM16_MAX_GROUPS at a time
        const int ngr = j->T / 16;
        for (int g0 = 0; g0 < ngr; g0 += LL_GEMM16_MAX_GROUPS) {
          const int ng = ngr - g0 < LL_GEMM16_MAX_GROUPS ? ngr - g0 : LL_GEMM16_MAX_GROUPS;
          j->k->gemm16(j->K, wr, j->w_row, j->at + (size_t)g0 * j->at_group, ng, j->sc ? j->sc + 16 * g0 : NULL, (size_t)j->T,
                       j->out + (size_t)(16 * g0) * j->N + n, (size_t)j->N, j->accumulate);
        }
        t = ngr * 16;
      }
      // 4 weight rows x up to 4 tokens per pass: weights unpacked once, independent chains.
      for (; t < j->T; t += tna) {
        const int na = j->T - t >= tna ? tna : j->T - t;
        const char *at = j->act + (size_t)t * j->a_row;
        if (!j->accumulate) { // straight into the output rows
          if (j->sc) j->k->tile_sc(j->K, wr, j->w_row, 4, at, j->a_row, na, j->sc + t, j->ss + t, (size_t)j->T, j->out + (size_t)t * j->N + n, (size_t)j->N);
          else j->k->tile(j->K, wr, j->w_row, 4, at, j->a_row, na, j->out + (size_t)t * j->N + n, (size_t)j->N);
          continue;
        }
        float *o = j->out + (size_t)t * j->N + n;
        // The output rows are a residual (the whole batch's, up to a few hundred KiB): ask for
        // this tile's lines now, so that the adds after it do not wait on L2 (the adds' loads
        // were 1.8% of a Q8_0 pp128, perf, 2026-11-24, Zen 3).
        for (int q = 0; q < na; q++) __builtin_prefetch(o + (size_t)q * j->N, 1, 3);
        if (j->sc) j->k->tile_sc(j->K, wr, j->w_row, 4, at, j->a_row, na, j->sc + t, j->ss + t, (size_t)j->T, &tile[0][0], 4);
        else j->k->tile(j->K, wr, j->w_row, 4, at, j->a_row, na, &tile[0][0], 4);
        mm_add_tile(o, (size_t)j->N, &tile[0][0], 4, na, 4);
      }
      n += 4;
      continue;
    }
    for (int t = 0; t < j->T; t++) {
      float s;
      j->k->vec_dot(j->K, &s, wr, j->act + (size_t)t * j->a_row);
      float *o = &j->out[(size_t)t * j->N + n];
      *o = j->accumulate ? *o + s : s;
    }
    n++;
  }
}

struct quant_job {
  const float *x;
  void *act;
  const struct ll_type_kernels *k;
  size_t a_row;
  int64_t K;
  float *sc;   // (nb, T) block scales to fill, or NULL
  int32_t *ss; // (nb, T) the second side table to fill (with sc)
  int T;
  int group; // tokens per task
};
// Tokens [task·group, +group). Groups rather than single tokens: the side tables are
// block-major, so tokens t and t+1 share cache lines, and with one token per task the threads
// took turns writing the same lines (2 threads, Q8_0 pp128: ll_act_side 1.8% of the time
// against 0.4% with one thread, perf, 2026-11-24, Zen 3).
static void quant_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct quant_job *q = vctx;
  const int t0 = task * q->group, t1 = t0 + q->group < q->T ? t0 + q->group : q->T;
  for (int t = t0; t < t1; t++) {
    const char *row = (const char *)q->act + (size_t)t * q->a_row;
    q->k->from_float(q->x + (size_t)t * q->K, (void *)row, q->K);
    if (q->sc) ll_act_side(q->k->act_type, row, q->K, q->sc + t, q->ss + t, (size_t)q->T);
  }
}

// ---- float weights x a batch: OpenBLAS sgemm ----
// Each pool task takes a slice of the weight rows: F16/BF16 rows are widened into the
// thread's buffer LL_BLAS_ROWS at a time, then out[:, slice] (+)= x · slice^T in one
// single-threaded sgemm per block (OpenBLAS's own threads are off: our pool is the only one).
#define LL_BLAS_ROWS 256
struct blas_job {
  float *out;
  const float *x;
  const struct ll_weight *w;
  struct cpu_ctx *c;
  int T, N, K, accumulate, chunk;
};
static void blas_task(void *vctx, int task, int thread) {
  const struct blas_job *j = vctx;
  const int n0 = task * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
  const size_t rs = ll_row_size(j->w->type, j->K);
  float *buf = j->c->wbuf + (size_t)thread * LL_BLAS_ROWS * j->K;
  int (*const dq)(int, const void *, float *, int64_t) = ll_cpu_vec_ops()->dequant_row;
  // The slice in equal blocks of at most LL_BLAS_ROWS rows: sgemm packs x once per call, so
  // blocks as large as the buffer allows, and no short last one.
  const int nblk = (n1 - n0 + LL_BLAS_ROWS - 1) / LL_BLAS_ROWS, bl = (n1 - n0 + nblk - 1) / nblk;
  for (int r0 = n0; r0 < n1; r0 += bl) {
    const int nr = n1 - r0 < bl ? n1 - r0 : bl;
    const float *wb;
    if (j->w->type == LL_TYPE_F32) {
      wb = (const float *)j->w->data + (size_t)r0 * j->K;
    } else {
      for (int r = 0; r < nr; r++) dq(j->w->type, (const char *)j->w->data + (size_t)(r0 + r) * rs, buf + (size_t)r * j->K, j->K);
      wb = buf;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, nr, j->K, 1.0f, j->x, j->K, wb, j->K, j->accumulate ? 1.0f : 0.0f,
                j->out + r0, j->N);
  }
}
static int cpu_matmul_blas(struct cpu_ctx *c, float *out, const float *x, const struct ll_weight *w, int T, int accumulate) {
  if (grow((void **)&c->wbuf, &c->wbuf_cap, (size_t)c->n_threads * LL_BLAS_ROWS * (size_t)w->k * sizeof(float))) return LL_ENOMEM;
  struct blas_job j = {out, x, w, c, T, (int)w->n, (int)w->k, accumulate, 0};
  // Two slices per thread, in multiples of 16 rows: equal work (192 rows: 4 x 48, not 64 + 64 +
  // 64 over two threads), and a thread that is preempted leaves the other something to take.
  j.chunk = (int)((w->n + c->n_threads * 2 - 1) / (c->n_threads * 2));
  j.chunk = (j.chunk + 15) / 16 * 16;
  ll_threadpool_run(c->pool, blas_task, &j, (int)((w->n + j.chunk - 1) / j.chunk));
  return 0;
}

// F32 weights of a GGUF model (LoRA factors): each output in llama.cpp's order, ggml_vec_dot_f32
// for one token, tinyBLAS<8> for batches (when its shape conditions hold, as llama.cpp checks
// them), so adapted outputs match llama.cpp --lora. Rows split over the pool; the order of
// each sum depends only on (T, K, N), never on the split.
struct f32g_job {
  float *out;
  const float *x, *w;
  int T, N, K, accumulate, chunk, tile;
  float (*dot)(const float *, const float *, int);
};
static void f32g_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct f32g_job *j = vctx;
  const int n0 = task * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
  for (int t = 0; t < j->T; t++)
    for (int n = n0; n < n1; n++) {
      const float s = j->dot(j->x + (size_t)t * j->K, j->w + (size_t)n * j->K, j->K);
      float *o = j->out + (size_t)t * j->N + n;
      *o = j->accumulate ? *o + s : s;
    }
}
static int cpu_matmul_f32_ggml(struct cpu_ctx *c, int row_order, float *out, const float *x, const struct ll_weight *w, int T, int accumulate) {
  const struct ll_vec_ops *vo = ll_cpu_vec_ops();
  const int tile = T >= 2 && w->k % 8 == 0 && w->n % 4 == 0 && !row_order; // llamafile_sgemm's conditions (AVX2 build)
  struct f32g_job j = {out, x, w->data, T, (int)w->n, (int)w->k, accumulate, 0, tile, tile ? vo->dot_f32_tile8 : vo->dot_f32_ggml};
  if (!j.dot) j.dot = tile ? ll_cpu_vec_ops_ref()->dot_f32_tile8 : ll_cpu_vec_ops_ref()->dot_f32_ggml;
  const int nt = c->n_threads;
  j.chunk = (j.N + nt - 1) / nt;
  if ((int64_t)T * w->n * w->k < 65536) j.chunk = j.N; // tiny: one task
  ll_threadpool_run(c->pool, f32g_task, &j, (j.N + j.chunk - 1) / j.chunk);
  return 0;
}

// How a product is computed: OpenBLAS sgemm, ggml's F32 order, or our quantized tiles (*k
// their kernel set, NULL when the type has none).
enum mm_path { MM_BLAS, MM_F32_GGML, MM_TILES };
static enum mm_path mm_path(struct ll_backend *b, const struct ll_weight *w, int T, const struct ll_type_kernels **k) {
  *k = NULL;
  // Float weights and a batch (not in the server): sgemm beats our dot loops there.
  if (!b->batch_invariant && T >= LL_BLAS_MIN_T && (w->type == LL_TYPE_F32 || w->type == LL_TYPE_F16 || w->type == LL_TYPE_BF16)) return MM_BLAS;
  // Training's opt-in (ll_backend.train_sgemm): quantized weights through the same panels.
  if (b->train_sgemm && !b->batch_invariant && T >= LL_BLAS_MIN_T && strcmp(ll_cpu_isa(), "avx512vnni") != 0) {
    const struct ll_type_traits *tt = ll_type_traits_get(w->type);
    if (tt && tt->has_dequant) return MM_BLAS;
  }
  if (w->type == LL_TYPE_F32 && b->ggml_math && w->k <= INT32_MAX) return MM_F32_GGML;
  *k = ll_cpu_kernels(w->type);
  return MM_TILES;
}

// Quantize x (T, K) for kernel set k into c->act (and the side tables where k takes them), and
// fill the job fields that depend only on them.
static int quantize_act(struct cpu_ctx *c, const struct ll_type_kernels *k, const float *x, int64_t K, int T, struct mm_job *j) {
  const size_t a_row = ll_row_size(k->act_type, K);
  if (!a_row) return LL_EINVAL;
  if (grow(&c->act, &c->act_cap, a_row * (size_t)T)) return LL_ENOMEM;
  // Quantize the activation rows (each row independently: the same bytes however it is split).
  // Kernels that take side tables of the activation blocks get them computed here, once.
  float *sc = NULL;
  int32_t *ss = NULL;
  // (A decode step too: with them the AVX2 Q4_0/Q5_0 tiles skip recomputing -8·Σa per block.)
  if (k->tile_sc && (k->act_type == LL_TYPE_Q8_0 || k->act_type == LL_TYPE_Q8_1)) {
    const size_t nbt = (size_t)(K / 32) * (size_t)T;
    if (grow((void **)&c->asc, &c->asc_cap, nbt * (sizeof(float) + sizeof(int32_t)))) return LL_ENOMEM;
    sc = c->asc;
    ss = (int32_t *)(c->asc + nbt);
  }
  // Groups of up to 16 tokens (a cache line of a side table's floats), at least two per thread.
  int group = T / (2 * c->n_threads);
  group = group < 1 ? 1 : group > 16 ? 16 : group;
  struct quant_job qj = {x, c->act, k, a_row, K, sc, ss, T, group};
  const int n_tasks = (T + group - 1) / group;
  if (n_tasks >= 2 && c->n_threads > 1) ll_threadpool_run(c->pool, quant_task, &qj, n_tasks);
  else
    for (int i = 0; i < n_tasks; i++) quant_task(&qj, i, 0);
  *j = (struct mm_job){.a_row = a_row, .act = c->act, .k = k, .T = T, .K = (int)K, .sc = sc, .ss = ss};
  // Prompts: the activations again, 16 tokens to a vector, for the kernels that read them so
  // (one pass over T x K bytes; the products take K x N x T).
  const int q80 = k->act_type == LL_TYPE_Q8_0 && sc, q8k = k->act_type == LL_TYPE_Q8_K;
  if (k->gemm16 && T >= 16 && (q80 || q8k)) {
    const int ng = T / 16;
    j->at_group = q80 ? 16 * (size_t)K : (size_t)(K / 256) * LL_T16_Q8K_BYTES;
    if (grow(&c->act16, &c->act16_cap, (size_t)ng * j->at_group)) return LL_ENOMEM;
    if (k->act_t16) k->act_t16(c->act, a_row, ng, K, c->act16);
    else if (q80) ll_act_t16_q8_0(c->act, a_row, ng, K, c->act16);
    else ll_act_t16_q8_K(c->act, a_row, ng, K, c->act16);
    j->at = c->act16;
  }
  return 0;
}

// The rest of w's job (j from quantize_act): its rows, the packed copy where decode uses it,
// and the chunk schedule. Returns the number of tasks.
static int plan_job(const struct cpu_ctx *c, struct mm_job *j, float *out, const struct ll_weight *w, int accumulate) {
  const struct ll_type_kernels *k = j->k;
  j->out = out, j->w = w->data, j->w_row = ll_row_size(w->type, w->k), j->N = (int)w->n, j->accumulate = accumulate;
  j->packed = w->packed && (j->sc || !k->tile_sc) && k->tile_packed && j->T < k->packed_max_t ? w->packed : NULL;
  // Chunk schedule (rows in multiples of 4). A decode step's matrices take microseconds: every
  // chunk costs a contended atomic claim and a restart of the hardware prefetcher, so small
  // batches get one contiguous chunk per thread (16 chunks per matmul cost a quarter of
  // 2-thread decode speed). Large batches are compute-bound and take longer: several chunks
  // per thread, claimed dynamically, so a thread slowed by the host does not hold the rest.
  // Prompts (64 tokens and more) take 16 per thread: the last chunk leaves the other threads
  // idle for about half its time, and with 4 per thread that was 4.0-4.3% of a 2-thread Q8_0
  // pp128 in the pool's wait loops (perf, 2026-11-24, Zen 3), 2.0-2.3% with 16.
  const int N = j->N, nt = c->n_threads;
  const int per_thread = j->T < 16 ? 1 : j->T < 64 ? 4 : 16;
  j->chunk = (N + nt * per_thread - 1) / (nt * per_thread);
  const int align = j->packed ? k->pack_rows : 4; // whole groups per chunk
  j->chunk = (j->chunk + align - 1) / align * align;
  if (j->chunk < align) j->chunk = align;
  return (N + j->chunk - 1) / j->chunk;
}

// out (T, N) = x (T, K) · W (N, K)ᵀ
static int cpu_matmul(struct ll_backend *b, float *out, const float *x, const struct ll_weight *w, int T, int accumulate) {
  struct cpu_ctx *c = C(b);
  const struct ll_type_kernels *k;
  const enum mm_path path = mm_path(b, w, T, &k);
  if (path == MM_BLAS) return cpu_matmul_blas(c, out, x, w, T, accumulate);
  if (path == MM_F32_GGML) return cpu_matmul_f32_ggml(c, b->row_order, out, x, w, T, accumulate);
  if (!k) return LL_EUNSUPPORTED;
  struct mm_job j;
  int rc = quantize_act(c, k, x, w->k, T, &j);
  if (rc) return rc;
  const int n_tasks = plan_job(c, &j, out, w, accumulate);
  ll_threadpool_run(c->pool, mm_task, &j, n_tasks);
  return 0;
}

// Several products of one x (q, k, v; gate, up) of the same weight type and K: x quantized once
// and every matrix's chunks in one hand-off to the pool (claimed in order, so each thread takes
// one chunk of each matrix in turn). Anything else: one cpu_matmul each.
struct mm_multi {
  struct mm_job j[4];
  int first[5]; // task index where job i starts
};
static void mm_multi_task(void *vctx, int task, int thread) {
  const struct mm_multi *m = vctx;
  int i = 0;
  while (task >= m->first[i + 1]) i++;
  mm_task((void *)&m->j[i], task - m->first[i], thread);
}
static int cpu_matmul_n(struct ll_backend *b, int n, float *const out[], const float *x, const struct ll_weight *const w[], int T) {
  struct cpu_ctx *c = C(b);
  const struct ll_type_kernels *k = NULL, *ki;
  int fuse = n >= 1 && n <= 4;
  for (int i = 0; fuse && i < n; i++) {
    fuse = mm_path(b, w[i], T, &ki) == MM_TILES && ki && (i == 0 || (ki == k && w[i]->k == w[0]->k));
    k = i == 0 ? ki : k;
  }
  if (!fuse) {
    for (int i = 0; i < n; i++) {
      const int rc = cpu_matmul(b, out[i], x, w[i], T, 0);
      if (rc) return rc;
    }
    return 0;
  }
  struct mm_multi m;
  int rc = quantize_act(c, k, x, w[0]->k, T, &m.j[0]);
  if (rc) return rc;
  m.first[0] = 0;
  for (int i = 0; i < n; i++) {
    if (i > 0) m.j[i] = m.j[0];
    m.first[i + 1] = m.first[i] + plan_job(c, &m.j[i], out[i], w[i], 0);
  }
  ll_threadpool_run(c->pool, mm_multi_task, &m, m.first[n]);
  return 0;
}

int64_t ll_cpu_packed_bytes(int type, int64_t k, int64_t n) {
  const struct ll_type_kernels *kn = ll_cpu_kernels(type);
  if (!kn || !kn->tile_packed || !kn->pack_rows || n < kn->pack_rows || k <= 0 || k > INT32_MAX) return 0;
  return (int64_t)ll_row_size(type, k) * (n - n % kn->pack_rows);
}
int64_t ll_cpu_weight_pack_into(struct ll_weight *w, void *dst, int64_t cap) {
  const int64_t bytes = w->packed ? 0 : ll_cpu_packed_bytes(w->type, w->k, w->n);
  if (bytes <= 0) return 0;
  if (bytes > cap || !dst) return LL_EINVAL;
  const size_t rs = ll_row_size(w->type, w->k);
  if (ll_pack_rows(w->type, w->data, rs, bytes / (int64_t)rs, w->k, dst) != 0) return 0;
  w->packed = dst;
  return bytes;
}
int64_t ll_cpu_weight_pack(struct ll_weight *w) {
  const int64_t bytes = w->packed ? 0 : ll_cpu_packed_bytes(w->type, w->k, w->n);
  if (bytes <= 0) return 0;
  void *p = NULL;
  if (posix_memalign(&p, 64, (size_t)bytes) != 0) return LL_ENOMEM;
  const int64_t rc = ll_cpu_weight_pack_into(w, p, bytes);
  if (rc <= 0) free(p);
  return rc;
}

// Measured 2026-11-24 on the 2-vCPU EPYC (THP "madvise"), one AVX2 thread streaming an 85 MB
// packed Q4_0 matrix: 20.4-23.5 GB/s in 4 KiB pages, 24.3-25.1 in 2 MiB pages.
void *ll_cpu_stream_alloc(size_t bytes) {
  enum { HUGE = 2 << 20 };
  void *p = NULL;
  if (posix_memalign(&p, bytes >= HUGE ? HUGE : 64, bytes ? bytes : 1) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  // Advice only: where THP is off (or "always") this changes nothing, and a failure is ignored.
  if (bytes >= HUGE) (void)madvise(p, bytes / HUGE * HUGE, MADV_HUGEPAGE);
#endif
  return p;
}
void ll_cpu_stream_free(void *p) { free(p); }
void ll_cpu_weight_unpack(struct ll_weight *w) {
  free((void *)w->packed);
  w->packed = NULL;
}

// out (T, C) = W[ids[t], :]
static int cpu_get_rows(struct ll_backend *b, float *out, const struct ll_weight *w, const int32_t *ids, int T) {
  (void)b;
  const size_t rs = ll_row_size(w->type, w->k);
  for (int t = 0; t < T; t++) {
    if (ids[t] < 0 || ids[t] >= w->n) return LL_EINVAL;
    int rc = ll_dequantize_row(w->type, (const char *)w->data + (size_t)ids[t] * rs, out + (size_t)t * w->k, w->k);
    if (rc) return rc;
  }
  return 0;
}

// out (T, C) = x / rms(x) * g   (sum of squares in double, as ggml, element by element)
// Rows go four at a time: each row's sum keeps ggml's sequential order (so its bits), but
// four independent chains hide the add latency that one chain waits on; batches split the
// row groups over the pool.
struct norm_job {
  float *out;
  const float *x, *g;
  int T, Cn;
  float eps;
};
static void norm_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct norm_job *j = vctx;
  const int t0 = 4 * task, nr = j->T - t0 < 4 ? j->T - t0 : 4, Cn = j->Cn;
  const float *xr[4];
  double sum[4] = {0, 0, 0, 0};
  for (int r = 0; r < 4; r++) xr[r] = j->x + (size_t)(t0 + (r < nr ? r : 0)) * Cn;
  if (nr == 1) // decode: one chain (the four of a group would take the loop's slots for nothing)
    for (int i = 0; i < Cn; i++) sum[0] += (double)(xr[0][i] * xr[0][i]);
  else
    for (int i = 0; i < Cn; i++) {
      sum[0] += (double)(xr[0][i] * xr[0][i]);
      sum[1] += (double)(xr[1][i] * xr[1][i]);
      sum[2] += (double)(xr[2][i] * xr[2][i]);
      sum[3] += (double)(xr[3][i] * xr[3][i]);
    }
  const float *g = j->g;
  for (int r = 0; r < nr; r++) {
    const float mean = (float)(sum[r] / Cn);
    const float scale = 1.0f / sqrtf(mean + j->eps);
    // Locals, so that the compiler vectorizes the same two multiplies per element (through j->g
    // it reloaded the pointer after every store, one element at a time). No restrict: the
    // output norm runs in place (out == x).
    float *o = j->out + (size_t)(t0 + r) * Cn;
    const float *x = xr[r];
    for (int i = 0; i < Cn; i++) o[i] = (x[i] * scale) * g[i];
  }
}
static int cpu_rmsnorm(struct ll_backend *b, float *out, const float *x, const float *g, int T, int Cn, float eps) {
  struct norm_job j = {out, x, g, T, Cn, eps};
  const int n = (T + 3) / 4;
  if (n >= 2 && C(b)->n_threads > 1) ll_threadpool_run(C(b)->pool, norm_task, &j, n);
  else
    for (int i = 0; i < n; i++) norm_task(&j, i, 0);
  return 0;
}

// RoPE tables for positions pos (T): cs, sn (T, n_pairs), from the cache when they match.
static int rope_tables(struct cpu_ctx *c, const int32_t *pos, int T, const struct ll_rope_params *p, const float **cs, const float **sn) {
  const int n = p->n_rot / 2;
  const size_t need = 2 * (size_t)T * (size_t)n;
  const int same = c->rope_pos && c->rope_n == n && c->rope_T == T && c->rope_p.n_rot == p->n_rot && c->rope_p.freq_base == p->freq_base &&
                   c->rope_p.freq_scale == p->freq_scale && c->rope_p.freq_factors == p->freq_factors && c->rope_p.attn_factor == p->attn_factor &&
                   !memcmp(c->rope_pos, pos, (size_t)T * sizeof *pos);
  if (!same) {
    c->rope_n = 0; // invalid until filled
    if (need > c->rope_cap) {
      float *nt = realloc(c->rope_cs, need * sizeof *nt);
      if (!nt) return LL_ENOMEM;
      c->rope_cs = nt, c->rope_cap = need;
    }
    int32_t *np = realloc(c->rope_pos, (size_t)(T > 0 ? T : 1) * sizeof *np);
    if (!np) return LL_ENOMEM;
    c->rope_pos = np;
    float *ct = c->rope_cs, *st = c->rope_cs + (size_t)T * n;
    for (int t = 0; t < T; t++) ll_rope_angles(pos[t], p, ct + (size_t)t * n, st + (size_t)t * n);
    memcpy(c->rope_pos, pos, (size_t)T * sizeof *pos);
    c->rope_T = T, c->rope_p = *p, c->rope_n = n;
  }
  *cs = c->rope_cs, *sn = c->rope_cs + (size_t)T * n;
  return 0;
}

// x (T, n_head, head_dim) rotated in place at positions pos (T)
static int cpu_rope(struct ll_backend *b, float *x, const int32_t *pos, int T, int n_head, int head_dim, const struct ll_rope_params *p) {
  if (p->n_rot > head_dim || p->n_rot % 2 || p->n_rot < 0 || T < 0) return LL_EINVAL;
  const int n = p->n_rot / 2;
  const float *ct, *st;
  const int rc = rope_tables(C(b), pos, T, p, &ct, &st);
  if (rc) return rc;
  for (int t = 0; t < T; t++) {
    const float *cs = ct + (size_t)t * n, *sn = st + (size_t)t * n;
    if (b->ggml_math) { // llama.cpp's rotation, fused as its compiler fuses it (ll_rope_pairs_impl)
      const struct ll_vec_ops *vo = ll_cpu_vec_ops();
      for (int h = 0; h < n_head; h++) vo->rope_pairs(x + ((size_t)t * n_head + h) * head_dim, cs, sn, n, p->mode == LL_ROPE_NEOX);
      continue;
    }
    // llama2.c's run.c (built without FMA): both products rounded.
    for (int h = 0; h < n_head; h++) {
      float *v = x + ((size_t)t * n_head + h) * head_dim;
      for (int i = 0; i < n; i++) {
        const int a = p->mode == LL_ROPE_NEOX ? i : 2 * i, c2 = p->mode == LL_ROPE_NEOX ? i + n : 2 * i + 1;
        const float x0 = v[a], x1 = v[c2];
        v[a] = x0 * cs[i] - x1 * sn[i];
        v[c2] = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
  return 0;
}

static inline size_t kv_elem(const struct ll_kv_view *kv) { return kv->kv_type == LL_TYPE_F16 ? 2 : 4; }

// rows[p] = head kvh's vector at positions 0..n-1 of a paged f16 cache, block by block (one table
// lookup and division per block instead of per position).
static void kv_rows(const struct ll_kv_view *kv, const void *base, int kvh, int n, const uint16_t **rows) {
  const size_t el = kv_elem(kv), row = (size_t)kv->n_head_kv * kv->head_dim * el;
  const size_t off = (size_t)kvh * kv->head_dim * el;
  for (int p0 = 0, b = 0; p0 < n; p0 += kv->block, b++) {
    const char *blk = (const char *)base + (size_t)kv->block_table[b] * kv->block * row + off;
    const int m = n - p0 < kv->block ? n - p0 : kv->block;
    for (int p = 0; p < m; p++) rows[p0 + p] = (const uint16_t *)(const void *)(blk + (size_t)p * row);
  }
}

static inline void *kv_at(const struct ll_kv_view *kv, void *base, int pos) {
  const int blk = kv->block_table[pos / kv->block], off = pos % kv->block;
  const size_t row = (size_t)kv->n_head_kv * kv->head_dim * kv_elem(kv);
  return (char *)base + ((size_t)blk * kv->block + off) * row;
}

static int cpu_kv_store(struct ll_backend *b, const struct ll_kv_view *kv, const float *k, const float *v, const int32_t *pos, int T) {
  (void)b;
  const int n = kv->n_head_kv * kv->head_dim;
  for (int t = 0; t < T; t++) {
    void *kd = kv_at(kv, kv->k, pos[t]), *vd = kv_at(kv, kv->v, pos[t]);
    if (kv->kv_type == LL_TYPE_F16) {
      const struct ll_f16_ops *f16 = ll_cpu_f16_ops(); // F16C where the CPU has it
      f16->from_f32(kd, k + (size_t)t * n, n);
      f16->from_f32(vd, v + (size_t)t * n, n);
    } else {
      memcpy(kd, k + (size_t)t * n, (size_t)n * 4);
      memcpy(vd, v + (size_t)t * n, (size_t)n * 4);
    }
  }
  return 0;
}

struct attn_job {
  float *out;
  const float *q;
  const struct ll_kv_view *kv; // (n_seq)
  const int32_t *pos;          // (rows)
  const int *t0, *nt;          // (n_seq) first row and row count of each sequence
  int n_seq, n_head;
  float scale;
  struct cpu_ctx *c;
  const struct ll_f16_ops *f16;
  const struct ll_vec_ops *vec; // NULL: libm expf (b->ggml_math == 0)
  int max_pos, ggml_math;
};

// A thread's attention scratch (floats): scores (max_pos + 1, + a group of 8), q (hd), 32 V lanes
// (32 hd), slack; then max_pos + 1 row pointers, 8-byte aligned (thread strides are even).
static size_t attn_rows_off(int max_pos, int hd) {
  const size_t o = (size_t)max_pos + 1 + 8 + (size_t)hd * 33 + 16;
  return (o + 1) & ~(size_t)1;
}

// One (token, head): scores over positions 0..pos[t], softmax, weighted sum of V.
static void attn_task(void *vctx, int task, int thread) {
  const struct attn_job *j = vctx;
  const int t = task / j->n_head, h = task % j->n_head;
  int si = 0;
  while (si + 1 < j->n_seq && t >= j->t0[si + 1]) si++; // rows are in sequence order
  const struct ll_kv_view *kv = &j->kv[si];
  const int hd = kv->head_dim;
  // A prompt pass (>= 2 tokens of this sequence in the batch) follows llama.cpp's, which
  // computes these products through its tinyBLAS GEMM; a single token follows its vec_dot
  // (see ll_f16_ops). The choice depends only on the sequence's own tokens (the scheduler's
  // prompt chunks do not depend on other requests), so batching never changes its results.
  const int prompt_order = j->ggml_math && j->nt[si] >= 2 && hd % 8 == 0;
  const int kvh = h / (j->n_head / kv->n_head_kv);
  // Sliding window: positions (pos - window, pos] only, counted from lo (score p is position lo + p).
  const int lo = kv->window > 0 && j->pos[t] + 1 > kv->window ? j->pos[t] + 1 - kv->window : 0;
  const int n_pos = j->pos[t] + 1 - lo;
  float *sc = j->c->scratch + (size_t)thread * j->c->scratch_per_thread;
  float *qv = sc + n_pos; // hd floats
  const float *q = j->q + ((size_t)t * j->n_head + h) * hd;
  const int f16 = kv->kv_type == LL_TYPE_F16;
  // With an f16 cache, llama.cpp rounds q to f16 before the dot: do the same.
  if (f16) j->f16->round_f16(qv, q, 1.0f, hd);
  else memcpy(qv, q, (size_t)hd * sizeof *qv);
  float mx = -INFINITY;
  // Row pointers into the paged cache, K then V (after the V lanes in this thread's scratch).
  const uint16_t **rows = (const uint16_t **)(void *)(sc + attn_rows_off(j->max_pos, hd));
  if (f16) {
    kv_rows(kv, kv->k, kvh, lo + n_pos, rows);
    if (prompt_order) j->f16->dot_rows8_f16(sc, qv, rows + lo, n_pos, hd);
    else j->f16->dot_rows_f16(sc, qv, rows + lo, n_pos, hd);
    for (int p = 0; p < n_pos; p++) {
      sc[p] *= j->scale;
      if (sc[p] > mx) mx = sc[p];
    }
  } else {
    for (int p = 0; p < n_pos; p++) {
      const float *kk = (const float *)((const char *)kv_at(kv, kv->k, lo + p) + (size_t)kvh * hd * 4);
      float s = 0;
      for (int i = 0; i < hd; i++) s += qv[i] * kk[i];
      sc[p] = s * j->scale;
      if (sc[p] > mx) mx = sc[p];
    }
  }
  double sum = 0;
  if (j->vec) {
    sum = j->vec->softmax(sc, sc, mx, n_pos); // ggml's exp and summation order
  } else {
    for (int p = 0; p < n_pos; p++) {
      sc[p] = expf(sc[p] - mx);
      sum += sc[p];
    }
  }
  const float inv = (float)(1.0 / sum);
  float *o = j->out + ((size_t)t * j->n_head + h) * hd;
  if (f16) {
    // Weighted sum of V in llama.cpp's order: probabilities rounded to f16, position p
    // accumulated (fused) into lane p % 32, lanes reduced in ggml's fixed tree.
    float *lanes = qv + hd; // (32, hd)
    j->f16->round_f16(sc, sc, inv, n_pos); // probabilities rounded to f16, in place
    kv_rows(kv, kv->v, kvh, lo + n_pos, rows);
    if (prompt_order) j->f16->wsum_rows8_f16(o, rows + lo, sc, n_pos, hd, lanes);
    else j->f16->wsum_rows_f16(o, rows + lo, sc, n_pos, hd, lanes);
    return;
  }
  for (int i = 0; i < hd; i++) o[i] = 0;
  for (int p = 0; p < n_pos; p++) {
    const float w = sc[p] * inv;
    const float *vv = (const float *)((const char *)kv_at(kv, kv->v, lo + p) + (size_t)kvh * hd * kv_elem(kv));
    for (int i = 0; i < hd; i++) o[i] += w * vv[i];
  }
}

static int cpu_attention_multi(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos,
                               const int *t0, const int *nt, int n_seq, int n_head, float scale) {
  struct cpu_ctx *c = C(b);
  if (n_seq < 1) return 0;
  int max_pos = 0, max_hd = 0, rows = 0;
  for (int i = 0; i < n_seq; i++) {
    if (n_head % kv[i].n_head_kv || nt[i] < 0 || t0[i] != rows) return LL_EINVAL; // contiguous, in order
    rows += nt[i];
    max_hd = kv[i].head_dim > max_hd ? kv[i].head_dim : max_hd;
    for (int t = t0[i]; t < t0[i] + nt[i]; t++) max_pos = pos[t] > max_pos ? pos[t] : max_pos;
  }
  _Static_assert(sizeof(void *) <= 2 * sizeof(float), "row pointers fit two floats");
  const size_t per = attn_rows_off(max_pos, max_hd) + (size_t)(max_pos + 1) * 2;
  if (per > c->scratch_per_thread) {
    void *p = c->scratch;
    size_t cap = c->scratch_per_thread * (size_t)c->n_threads * sizeof(float);
    if (grow(&p, &cap, per * (size_t)c->n_threads * sizeof(float))) return LL_ENOMEM;
    c->scratch = p;
    c->scratch_per_thread = per;
  }
  struct attn_job j = {out, q, kv, pos, t0, nt, n_seq, n_head, scale, c, ll_cpu_f16_ops(), b->ggml_math ? ll_cpu_vec_ops() : NULL,
                       max_pos, b->ggml_math};
  ll_threadpool_run(c->pool, attn_task, &j, rows * n_head);
  return 0;
}

static int cpu_attention(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos, int T, int n_head,
                         float scale) {
  const int t0 = 0;
  return cpu_attention_multi(b, out, q, kv, pos, &t0, &T, 1, n_head, scale);
}

// GeGLU. With ggml_math llama.cpp's values: gelu from ggml's f16 table (ll_cpu_dot.h's
// geglu_f16); else the float formula.
static float gelu_tanh_ref(float x) {
  const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f; // ggml's constants
  return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}
struct geglu_job {
  float *out;
  const float *gate, *up;
  int64_t n, chunk; // chunk: a multiple of 16 (whole cache lines of floats)
};
static void geglu_task(void *vctx, int task, int thread) {
  (void)thread;
  const struct geglu_job *j = vctx;
  const int64_t i0 = (int64_t)task * j->chunk, m = j->n - i0 < j->chunk ? j->n - i0 : j->chunk;
  ll_cpu_vec_ops()->geglu_f16(j->out + i0, j->gate + i0, j->up + i0, m);
}
static int cpu_geglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n) {
  if (b->ggml_math) { // elementwise: the same values however it is split
    struct cpu_ctx *c = C(b);
    const int nt = c->n_threads;
    if (nt > 1 && n >= 4096) {
      struct geglu_job j = {out, gate, up, n, ((n + nt - 1) / nt + 15) / 16 * 16};
      ll_threadpool_run(c->pool, geglu_task, &j, (int)((n + j.chunk - 1) / j.chunk));
    } else {
      ll_cpu_vec_ops()->geglu_f16(out, gate, up, n);
    }
    return 0;
  }
  for (int64_t i = 0; i < n; i++) out[i] = gelu_tanh_ref(gate[i]) * up[i];
  return 0;
}

static int cpu_swiglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n) {
  if (b->ggml_math) {
    ll_cpu_vec_ops()->swiglu(out, gate, up, n);
    return 0;
  }
  for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
  return 0;
}

static int cpu_add(struct ll_backend *b, float *out, const float *a, const float *x, int64_t n) {
  (void)b;
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + x[i];
  return 0;
}

static void cpu_get_info(struct ll_backend *b, struct ll_backend_info *info) {
  struct cpu_ctx *c = C(b);
  memset(info, 0, sizeof *info);
  snprintf(info->name, sizeof info->name, "cpu");
  snprintf(info->device, sizeof info->device, "%s", c->device);
  info->compute_units = c->n_threads;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  info->mem_total = pages > 0 && psz > 0 ? (int64_t)pages * psz : -1;
  info->mem_used = ll_cpu_train_mem_used(c->train); // what the trainer holds through alloc
}

static void cpu_free(struct ll_backend *b) {
  if (!b) return;
  struct cpu_ctx *c = C(b);
  if (c) {
    ll_threadpool_free(c->pool);
    free(c->act);
    free(c->act16);
    free(c->asc);
    free(c->wbuf);
    free(c->rope_cs);
    free(c->rope_pos);
    free(c->scratch);
    ll_cpu_train_free(c->train);
    free(c);
  }
  free(b);
}

static const struct ll_backend_i cpu_iface = {
    .free = cpu_free,
    .get_info = cpu_get_info,
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .attention_multi = cpu_attention_multi,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .add = cpu_add,
    // training (kernels/cpu/train.c; their references in train_ref.c, ll_cpu_train.h)
    .alloc = ll_train_cpu_alloc,
    .free_buf = ll_train_cpu_free_buf,
    .matmul_backward = ll_train_cpu_matmul_backward,
    .rmsnorm_backward = ll_train_cpu_rmsnorm_backward,
    .rope_backward = ll_train_cpu_rope_backward,
    .swiglu_backward = ll_train_cpu_swiglu_backward,
    .geglu_backward = ll_train_cpu_geglu_backward,
    .attention_train = ll_train_cpu_attention_train,
    .attention_train_swa = ll_train_cpu_attention_train_swa,
    .attention_backward = ll_train_cpu_attention_backward,
    .softmax_xent = ll_train_cpu_softmax_xent,
    .get_rows_backward = ll_train_cpu_get_rows_backward,
    .dropout = ll_train_cpu_dropout,
    .sumsq = ll_train_cpu_sumsq,
    .axpy = ll_train_cpu_axpy,
    .scale = ll_train_cpu_scale,
    .adamw = ll_train_cpu_adamw,
};

static void cpu_model_name(char *out, size_t cap) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(out, cap, "CPU");
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *p = strchr(line, ':');
      if (p) {
        p += 2;
        p[strcspn(p, "\n")] = 0;
        snprintf(out, cap, "%s", p);
      }
      break;
    }
  }
  if (f) fclose(f);
}

int ll_backend_cpu_create(struct ll_backend **out, int n_threads, char *err, size_t errlen) {
  if (n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  if (n_threads > 512) return ll_errf(err, errlen, LL_EINVAL, "cpu backend: %d threads is more than 512", n_threads);
  struct ll_backend *b = calloc(1, sizeof *b);
  struct cpu_ctx *c = calloc(1, sizeof *c);
  if (!b || !c || !(c->pool = ll_threadpool_new(n_threads))) {
    free(b);
    free(c);
    return ll_errf(err, errlen, LL_ENOMEM, "cpu backend: out of memory");
  }
  c->n_threads = ll_threadpool_size(c->pool);
  // sgemm runs inside our pool's tasks: OpenBLAS must not start threads of its own (they would
  // compete with ours for the same cores).
  openblas_set_num_threads(1);
  char model[96];
  cpu_model_name(model, sizeof model);
  snprintf(c->device, sizeof c->device, "%s (%d threads, %s)", model, c->n_threads, ll_cpu_isa());
  b->i = &cpu_iface;
  b->ctx = c;
  *out = b;
  return 0;
}
