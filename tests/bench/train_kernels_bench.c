// train_kernels_bench.c - speed of the CPU backend's training members at SmolLM2-135M's shapes
// (T = 256 tokens, d 576, ffn 1536, vocab 49152, 9 heads / 3 kv heads of 64), next to OpenBLAS
// sgemm's peak on the same machine, measured in the same run (best of several repetitions, so a
// loaded machine shows in the spread, not in a ratio).
//
//   build/tests/train_kernels_bench [-t THREADS] [-r REPS] [--quick]
//
// Prints, per product: GFLOP/s of matmul_backward's dx (Q4_1 and F32 weights) and dw (F32),
// the forward matmul at T = 256 with the integer tiles (what `matmul` does for quantized
// weights) against dequantize-in-panels + sgemm (the alternative for training batches), and the
// fast/reference speedup of every training op. Not a test: numbers only.
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_backend.h"
#include "ll_cpu_train.h"
#include "ll_quant.h"
#include "ll_threadpool.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static uint64_t rng = 88172645463325252ULL;
static float rnd(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2 - 1;
}
static float *randv(size_t n, float amp) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = amp * rnd();
  return x;
}
static void *quant_weight(int type, int N, int K) {
  const size_t rs = ll_row_size(type, K);
  char *w = malloc(rs * N);
  float *row = malloc((size_t)K * sizeof *row);
  for (int n = 0; n < N; n++) {
    for (int k = 0; k < K; k++) row[k] = rnd() * 0.05f;
    ll_quantize_row(type, row, w + (size_t)n * rs, K);
  }
  free(row);
  return w;
}

static int reps = 5;
#define BEST(var, expr)                                \
  do {                                                 \
    var = 1e30;                                        \
    for (int r_ = 0; r_ < reps; r_++) {                \
      const double t0_ = now();                        \
      expr;                                            \
      const double dt_ = now() - t0_;                  \
      if (dt_ < var) var = dt_;                        \
    }                                                  \
  } while (0)

// ---- the forward alternative: W dequantized in 256-row panels per task, out[:, panel] = x · panelᵀ
struct fwd_job {
  float *out;
  const float *x;
  const char *w;
  size_t rs;
  int type, T, N, K;
  float *scratch; // per thread 256 x K
};
static void fwd_task(void *vctx, int task, int thread) {
  const struct fwd_job *j = vctx;
  const int n0 = task * 256, nr = j->N - n0 < 256 ? j->N - n0 : 256;
  float *p = j->scratch + (size_t)thread * 256 * j->K;
  for (int r = 0; r < nr; r++) ll_dequantize_row(j->type, j->w + (size_t)(n0 + r) * j->rs, p + (size_t)r * j->K, j->K);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, nr, j->K, 1.0f, j->x, j->K, p, j->K, 0.0f, j->out + n0, j->N);
}

int main(int argc, char **argv) {
  int nt = 2, quick = 0, peak_only = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-t") && i + 1 < argc) nt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--peak")) peak_only = 1; // the sgemm line only (tests/bench/train_vs_peft.sh)
    else {
      fprintf(stderr, "usage: %s [-t THREADS] [-r REPS] [--quick] [--peak]\n", argv[0]);
      return 2;
    }
  }
  char err[256];
  struct ll_backend *b = NULL;
  if (ll_backend_cpu_create(&b, nt, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  b->batch_invariant = 0; // as training runs it
  struct ll_backend_info info;
  b->i->get_info(b, &info);
  printf("cpu backend: %s, %d repetitions, best time\n", info.device, reps);
  const int T = 256;

  // ---- sgemm peak: OpenBLAS with its own nt threads on 1024^3, and one thread
  {
    const int n = 1024;
    float *A = randv((size_t)n * n, 1), *B = randv((size_t)n * n, 1), *Cm = randv((size_t)n * n, 1);
    double t1 = 1e30, tn = 1e30, ts = 1e30;
    for (int r = 0; r < 3 * reps; r++) { // interleaved, best of each
      openblas_set_num_threads(1);
      double t0 = now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, A, n, B, n, 0, Cm, n);
      double t = now() - t0;
      t1 = t < t1 ? t : t1;
      t0 = now(); // the gate/up product's shape: (256 x 1536) = (256 x 576) · (576 x 1536)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 256, 1536, 576, 1, A, 576, B, 1536, 0, Cm, 1536);
      t = now() - t0;
      ts = t < ts ? t : ts;
      openblas_set_num_threads(nt);
      t0 = now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, A, n, B, n, 0, Cm, n);
      t = now() - t0;
      tn = t < tn ? t : tn;
    }
    openblas_set_num_threads(1); // back to the backend's setting
    const double fl = 2.0 * n * n * n;
    printf("sgemm peak: 1024^3 1 thread %.1f GFLOP/s, %d threads (OpenBLAS's) %.1f GFLOP/s; 256x1536x576 1 thread %.1f GFLOP/s\n",
           fl / t1 * 1e-9, nt, fl / tn * 1e-9, 2.0 * 256 * 1536 * 576 / ts * 1e-9);
    free(A), free(B), free(Cm);
  }
  if (peak_only) {
    ll_backend_free(b);
    return 0;
  }

  // ---- products at SmolLM2's shapes
  static const struct {
    const char *name;
    int N, K;
  } mm[] = {{"q/o 576x576", 576, 576}, {"k/v 192x576", 192, 576}, {"gate/up 1536x576", 1536, 576}, {"down 576x1536", 576, 1536},
            {"head 49152x576", 49152, 576}};
  const int nmm = quick ? 4 : 5;
  printf("\n%-18s %10s %10s %10s %10s %10s %8s %12s %12s %6s\n", "W (N x K), T=256", "dx q4_1", "dx ref", "speedup", "dx f32", "dw f32",
         "", "fwd tiles", "fwd deq+gemm", "ratio");
  double tot_fl = 0, tot_t = 0;
  for (int m = 0; m < nmm; m++) {
    const int N = mm[m].N, K = mm[m].K;
    const double fl = 2.0 * T * N * K;
    void *wq = quant_weight(LL_TYPE_Q4_1, N, K);
    float *wf = randv((size_t)N * K, 0.05f), *x = randv((size_t)T * K, 1), *d = randv((size_t)T * N, 1);
    float *dx = calloc((size_t)T * K, sizeof *dx), *dw = calloc((size_t)N * K, sizeof *dw), *out = calloc((size_t)T * N, sizeof *out);
    struct ll_weight wQ = {LL_TYPE_Q4_1, K, N, wq, NULL, NULL}, wF = {LL_TYPE_F32, K, N, wf, NULL, NULL};
    double tq = 1e30, tr = 0, tf = 1e30, tw = 1e30, tfwd = 1e30, tdeq = 1e30;
    float *scratch = malloc((size_t)nt * 256 * K * sizeof *scratch);
    struct fwd_job fj = {out, x, wq, ll_row_size(LL_TYPE_Q4_1, K), LL_TYPE_Q4_1, T, N, K, scratch};
    // The variants interleaved in every repetition, so they share the machine's state.
    const int rr = N > 4096 ? (reps + 2) / 3 : reps * 2;
    for (int r = 0; r < rr; r++) {
      double t0 = now();
      b->i->matmul_backward(b, dx, NULL, d, x, &wQ, T);
      double t1 = now();
      tq = t1 - t0 < tq ? t1 - t0 : tq;
      b->i->matmul_backward(b, dx, NULL, d, x, &wF, T);
      t0 = now();
      tf = t0 - t1 < tf ? t0 - t1 : tf;
      b->i->matmul_backward(b, NULL, dw, d, x, &wF, T);
      t1 = now();
      tw = t1 - t0 < tw ? t1 - t0 : tw;
      b->i->matmul(b, out, x, &wQ, T, 0);
      t0 = now();
      tfwd = t0 - t1 < tfwd ? t0 - t1 : tfwd;
      ll_threadpool_run(ll_cpu_backend_pool(b), fwd_task, &fj, (N + 255) / 256);
      t1 = now();
      tdeq = t1 - t0 < tdeq ? t1 - t0 : tdeq;
    }
    tot_fl += fl, tot_t += tq;
    if (N * (double)K <= 1536.0 * 576) { // the scalar reference, once (seconds at the head)
      const double t0 = now();
      ll_train_ref_matmul_backward(NULL, dx, NULL, d, x, &wQ, T);
      tr = now() - t0;
    }
    char sp[32] = "-", rf[32] = "-";
    if (tr > 0) snprintf(sp, sizeof sp, "%.0fx", tr / tq), snprintf(rf, sizeof rf, "%.2f", fl / tr * 1e-9);
    printf("%-18s %10.1f %10s %10s %10.1f %10.1f %8s %12.1f %12.1f %6.2f\n", mm[m].name, fl / tq * 1e-9, rf, sp, fl / tf * 1e-9,
           fl / tw * 1e-9, "", fl / tfwd * 1e-9, fl / tdeq * 1e-9, tfwd / tdeq);
    free(wq), free(wf), free(x), free(d), free(dx), free(dw), free(out), free(scratch);
  }
  printf("(GFLOP/s; 'ratio' = time of the integer tiles / time of dequantize+sgemm: > 1 means sgemm is faster)\n");
  printf("dx q4_1 over these products: %.1f GFLOP/s\n", tot_fl / tot_t * 1e-9);

  // ---- the other ops: fast vs reference
  printf("\n%-34s %12s %12s %8s\n", "op (SmolLM2 shapes)", "fast ms", "ref ms", "speedup");
  const struct ll_backend_i *R = ll_cpu_train_ref();
  {
    const int S = 256, H = 9, Hkv = 3, hd = 64;
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd;
    float *q = randv(nq, 1), *k = randv(nk, 1), *v = randv(nk, 1), *d = randv(nq, 1), *o = malloc(nq * 4), *att = malloc((size_t)H * S * S * 4);
    float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    double tf, tr;
    BEST(tf, b->i->attention_train(b, o, att, q, k, v, S, H, Hkv, hd, 0.125f));
    BEST(tr, R->attention_train(b, o, att, q, k, v, S, H, Hkv, hd, 0.125f));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "attention_train S256 H9/3 hd64", tf * 1e3, tr * 1e3, tr / tf);
    BEST(tf, b->i->attention_backward(b, dq, dk, dv, d, q, k, v, att, S, H, Hkv, hd, 0.125f));
    BEST(tr, R->attention_backward(b, dq, dk, dv, d, q, k, v, att, S, H, Hkv, hd, 0.125f));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "attention_backward", tf * 1e3, tr * 1e3, tr / tf);
    free(q), free(k), free(v), free(d), free(o), free(att), free(dq), free(dk), free(dv);
  }
  {
    const int V = 49152, Tt = quick ? 64 : T;
    float *l = randv((size_t)Tt * V, 5), *d = malloc((size_t)Tt * V * 4);
    int32_t *y = malloc(Tt * sizeof *y);
    for (int t = 0; t < Tt; t++) y[t] = (int32_t)(t * 7919 % V);
    double loss, tf, tr;
    BEST(tf, b->i->softmax_xent(b, &loss, d, l, y, Tt, V, 1.0f));
    BEST(tr, R->softmax_xent(b, &loss, d, l, y, Tt, V, 1.0f));
    printf("softmax_xent T%d V49152              %12.3f %12.3f %7.1fx\n", Tt, tf * 1e3, tr * 1e3, tr / tf);
    free(l), free(d), free(y);
  }
  {
    const int C = 576;
    float *x = randv((size_t)T * C, 1), *g = randv(C, 1), *d = randv((size_t)T * C, 1), *dx = calloc((size_t)T * C, 4), *dg = calloc(C, 4);
    double tf, tr;
    BEST(tf, b->i->rmsnorm_backward(b, dx, dg, d, x, g, T, C, 1e-5f));
    BEST(tr, R->rmsnorm_backward(b, dx, dg, d, x, g, T, C, 1e-5f));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "rmsnorm_backward 256x576", tf * 1e3, tr * 1e3, tr / tf);
    int32_t pos[256];
    for (int t = 0; t < T; t++) pos[t] = t;
    struct ll_rope_params p = {LL_ROPE_NORMAL, 64, 100000.0f, 1.0f, NULL, 1.0f};
    float *qd = randv((size_t)T * 9 * 64, 1);
    BEST(tf, b->i->rope_backward(b, qd, pos, T, 9, 64, &p));
    BEST(tr, R->rope_backward(b, qd, pos, T, 9, 64, &p));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "rope_backward 256x9x64", tf * 1e3, tr * 1e3, tr / tf);
    free(x), free(g), free(d), free(dx), free(dg), free(qd);
  }
  {
    const int64_t n = (int64_t)T * 1536;
    float *g = randv(n, 3), *u = randv(n, 1), *d = randv(n, 1), *dg = malloc(n * 4), *du = malloc(n * 4);
    double tf, tr;
    BEST(tf, b->i->swiglu_backward(b, dg, du, d, g, u, n));
    BEST(tr, R->swiglu_backward(b, dg, du, d, g, u, n));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "swiglu_backward 256x1536", tf * 1e3, tr * 1e3, tr / tf);
    BEST(tf, b->i->dropout(b, dg, d, 0.1f, 1, n));
    BEST(tr, R->dropout(b, dg, d, 0.1f, 1, n));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "dropout 256x1536", tf * 1e3, tr * 1e3, tr / tf);
    free(g), free(u), free(d), free(dg), free(du);
  }
  {
    const int64_t n = 4884480; // SmolLM2 LoRA r=16 on all seven targets
    float *p = randv(n, 1), *g = randv(n, 1), *m = calloc(n, 4), *v = calloc(n, 4);
    double s, tf, tr;
    BEST(tf, b->i->adamw(b, p, g, m, v, n, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1));
    BEST(tr, R->adamw(b, p, g, m, v, n, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "adamw 4.88M (LoRA r16, 7 targets)", tf * 1e3, tr * 1e3, tr / tf);
    BEST(tf, b->i->sumsq(b, &s, g, n));
    BEST(tr, R->sumsq(b, &s, g, n));
    printf("%-34s %12.3f %12.3f %7.1fx\n", "sumsq 4.88M", tf * 1e3, tr * 1e3, tr / tf);
    free(p), free(g), free(m), free(v);
  }
  ll_backend_free(b);
  return 0;
}
