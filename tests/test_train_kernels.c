// test_train_kernels.c - the backend's training members (kernels/cpu/train_ref.c, train.c).
//
// 1. Every backward op against central finite differences of a double-precision forward
//    written here (not the backend's), on small ragged shapes, for the scalar references and
//    the CPU backend's fast versions. Error measure: normalized error
//    max_i |analytic_i - fd_i| / max_i |fd_i|, tolerance FD_TOL. Each check was shown to fail
//    with one term of its backward dropped (see the comment above each test: the mutation
//    made in train_ref.c and the error this test then printed).
// 2. Every fast version against its scalar reference: all weight types for matmul_backward,
//    ragged T; normalized error within FAST_TOL (summation order differs: sgemm, lanes), or
//    equal bits where both compute each element with the same expression.
// 3. AdamW against a two-step example computed by hand; dropout's mask a function of the seed
//    alone (the same for 1, 2 and 3 threads); every fast op bit for bit repeatable, and
//    (their work split depends on the shapes only) the same for 1, 2 and 3 threads.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_cpu_dot.h"
#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "testutil.h"

#define FD_TOL 1e-5   // float backward vs double central differences (observed <= 2e-7)
#define FAST_TOL 1e-5 // fast vs reference where the summation order differs (observed <= ~1e-6)
#define FD_H 1e-4     // central-difference step (inputs are O(1); truncation ~h², rounding ~1e-16/h)

static uint64_t rs;
static float rnd(void) { return ll_test_randf(&rs); }
static void fill(float *x, size_t n, float amp) {
  for (size_t i = 0; i < n; i++) x[i] = amp * rnd();
}
static double *to_d(const float *x, size_t n) {
  double *d = malloc((n ? n : 1) * sizeof *d);
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

// max |a - b| / max |b|
static double nerr_fd(const float *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}
static double nerr(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs((double)b[i]));
  }
  return den > 0 ? num / den : num;
}

// Central differences of L() with respect to every element of arr (n), into g.
typedef double (*loss_fn)(void *ctx);
static void fd_grad(double *arr, size_t n, loss_fn L, void *ctx, double *g) {
  for (size_t i = 0; i < n; i++) {
    const double x0 = arr[i];
    arr[i] = x0 + FD_H;
    const double lp = L(ctx);
    arr[i] = x0 - FD_H;
    const double lm = L(ctx);
    arr[i] = x0;
    g[i] = (lp - lm) / (2 * FD_H);
  }
}

static double worst_fd; // the largest finite-difference error seen, printed at the end
static void check_fd(const char *what, const char *impl, const float *got, const double *fd, size_t n) {
  const double e = nerr_fd(got, fd, n);
  if (e > worst_fd) worst_fd = e;
  printf("  fd %-28s %-4s normalized error %.2e\n", what, impl, e);
  CHECKF(e < FD_TOL, "%s (%s): normalized error %.3e vs finite differences", what, impl, e);
}

struct impl {
  const char *name;
  struct ll_backend *b;         // passed to the members (NULL for the references)
  const struct ll_backend_i *i; // whose members are called
};

// ---------------------------------------------------------------- matmul
// Mutations tried in train_ref.c: dx's loop over W's rows starting at n = 1 (row 0's term dropped)
// -> "fd matmul dx f32 ref normalized error 2.36e-01" (q4_1 2.46e-01, q6_K 4.64e-01); dw's loop
// over tokens stopping at T - 1 -> "fd matmul dw f32 ref normalized error 3.92e-01".
struct mm_ctx {
  int T, N, K;
  double *x, *w, *r; // (T, K), (N, K), (T, N) the loss weights
};
static double mm_loss(void *vc) { // L = Σ r ⊙ (x · Wᵀ)
  const struct mm_ctx *c = vc;
  double L = 0;
  for (int t = 0; t < c->T; t++)
    for (int n = 0; n < c->N; n++) {
      double s = 0;
      for (int k = 0; k < c->K; k++) s += c->x[(size_t)t * c->K + k] * c->w[(size_t)n * c->K + k];
      L += c->r[(size_t)t * c->N + n] * s;
    }
  return L;
}

// Random weights of a type: quantized from random floats where we have a quantizer, else random
// bytes with a sane fp16 scale patched in (K-quants).
static void random_weight(int type, void *dst, int64_t n, int64_t k) {
  const size_t rsz = ll_row_size(type, k);
  float *x = malloc((size_t)k * sizeof *x);
  for (int64_t r = 0; r < n; r++) {
    unsigned char *row = (unsigned char *)dst + (size_t)r * rsz;
    fill(x, (size_t)k, 1.0f);
    if (ll_quantize_row(type, x, row, k) == 0) continue;
    for (size_t i = 0; i < rsz; i++) row[i] = (unsigned char)ll_test_rand(&rs);
    const ll_fp16 d = ll_fp32_to_fp16(0.01f), dm = ll_fp32_to_fp16(0.002f);
    const size_t bs = ll_type_traits_get(type)->type_size;
    for (size_t o = 0; o < rsz; o += bs) {
      if (type == LL_TYPE_Q6_K) memcpy(row + o + 208, &d, 2);
      else memcpy(row + o, &d, 2), memcpy(row + o + 2, &dm, 2);
    }
  }
  free(x);
}

static void test_fd_matmul(const struct impl *im) {
  const int types[] = {LL_TYPE_F32, LL_TYPE_Q4_1, LL_TYPE_Q6_K};
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
    const int type = types[ti];
    const int T = 5, N = 7, K = type == LL_TYPE_Q6_K ? 256 : 64;
    const size_t rsz = ll_row_size(type, K);
    void *wq = malloc(rsz * N);
    random_weight(type, wq, N, K);
    struct ll_weight w = {type, K, N, wq, NULL, NULL};
    float *x = malloc(sizeof(float) * T * K), *r = malloc(sizeof(float) * T * N), *wf = malloc(sizeof(float) * N * K);
    float *dx = malloc(sizeof(float) * T * K), *dx0 = malloc(sizeof(float) * T * K), *dw = malloc(sizeof(float) * N * K);
    for (int n = 0; n < N; n++) ll_dequantize_row(type, (char *)wq + (size_t)n * rsz, wf + (size_t)n * K, K);
    fill(x, (size_t)T * K, 1), fill(r, (size_t)T * N, 1), fill(dx0, (size_t)T * K, 1);
    memcpy(dx, dx0, sizeof(float) * T * K); // dx accumulates: starts from dx0
    memset(dw, 0, sizeof(float) * N * K);
    const int rc = im->i->matmul_backward(im->b, dx, type == LL_TYPE_F32 ? dw : NULL, r, x, &w, T);
    CHECK(rc == 0);
    struct mm_ctx c = {T, N, K, to_d(x, (size_t)T * K), to_d(wf, (size_t)N * K), to_d(r, (size_t)T * N)};
    double *g = malloc(sizeof(double) * (size_t)(T * K > N * K ? T * K : N * K));
    fd_grad(c.x, (size_t)T * K, mm_loss, &c, g);
    for (int i = 0; i < T * K; i++) g[i] += dx0[i];
    char what[64];
    snprintf(what, sizeof what, "matmul dx %s", ll_type_name(type));
    check_fd(what, im->name, dx, g, (size_t)T * K);
    if (type == LL_TYPE_F32) {
      fd_grad(c.w, (size_t)N * K, mm_loss, &c, g);
      check_fd("matmul dw f32", im->name, dw, g, (size_t)N * K);
    } else { // dw only for F32 weights
      CHECK(im->i->matmul_backward(im->b, dx, dw, r, x, &w, T) == LL_EINVAL);
    }
    free(c.x), free(c.w), free(c.r), free(g);
    free(wq), free(x), free(r), free(wf), free(dx), free(dx0), free(dw);
  }
}

// ---------------------------------------------------------------- rmsnorm
// Mutations tried: dx without the normalizer's term ("- xt[i] * c3" dropped) -> "fd rmsnorm dx
// ref normalized error 1.22e-01"; dg without the factor s -> "fd rmsnorm dg ref ... 1.48e-01".
struct rn_ctx {
  int T, C;
  double eps, *x, *g, *r;
};
static double rn_loss(void *vc) {
  const struct rn_ctx *c = vc;
  double L = 0;
  for (int t = 0; t < c->T; t++) {
    const double *x = c->x + (size_t)t * c->C;
    double ss = 0;
    for (int i = 0; i < c->C; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / c->C + c->eps);
    for (int i = 0; i < c->C; i++) L += c->r[(size_t)t * c->C + i] * x[i] * s * c->g[i];
  }
  return L;
}
static void test_fd_rmsnorm(const struct impl *im) {
  const int T = 3, C = 37;
  const float eps = 1e-5f;
  float *x = malloc(sizeof(float) * T * C), *g = malloc(sizeof(float) * C), *r = malloc(sizeof(float) * T * C);
  float *dx = malloc(sizeof(float) * T * C), *dg = malloc(sizeof(float) * C), *dx0 = malloc(sizeof(float) * T * C);
  fill(x, (size_t)T * C, 2), fill(g, C, 1.5f), fill(r, (size_t)T * C, 1), fill(dx0, (size_t)T * C, 1);
  memcpy(dx, dx0, sizeof(float) * T * C);
  memset(dg, 0, sizeof(float) * C);
  CHECK(im->i->rmsnorm_backward(im->b, dx, dg, r, x, g, T, C, eps) == 0);
  struct rn_ctx c = {T, C, eps, to_d(x, (size_t)T * C), to_d(g, C), to_d(r, (size_t)T * C)};
  double *fd = malloc(sizeof(double) * T * C);
  fd_grad(c.x, (size_t)T * C, rn_loss, &c, fd);
  for (int i = 0; i < T * C; i++) fd[i] += dx0[i];
  check_fd("rmsnorm dx", im->name, dx, fd, (size_t)T * C);
  fd_grad(c.g, C, rn_loss, &c, fd);
  check_fd("rmsnorm dg", im->name, dg, fd, C);
  free(c.x), free(c.g), free(c.r), free(fd);
  free(x), free(g), free(r), free(dx), free(dg), free(dx0);
}

// ---------------------------------------------------------------- rope
// Mutation tried: the backward rotating by +th (v[a] = da cs - dc sn; v[c] = da sn + dc cs: the
// forward's rotation, not its transpose) -> "fd rope dx normal ref normalized error 1.67e+00"
// (neox+factors 1.69e+00).
struct rope_ctx {
  int T, H, hd, n_rot, neox;
  const int32_t *pos;
  double base, fscale;
  const float *ff;
  double *x, *r;
  double mscale; // LongRoPE's attention factor: cos and sin times it
};
static double rope_loss(void *vc) { // angles in double from the formula, not from ll_rope_angles
  const struct rope_ctx *c = vc;
  double L = 0;
  const int n = c->n_rot / 2;
  for (int t = 0; t < c->T; t++)
    for (int h = 0; h < c->H; h++) {
      const double *x = c->x + ((size_t)t * c->H + h) * c->hd, *r = c->r + ((size_t)t * c->H + h) * c->hd;
      for (int e = c->n_rot; e < c->hd; e++) L += r[e] * x[e]; // not rotated
      for (int i = 0; i < n; i++) {
        const double th = c->fscale * c->pos[t] * pow(c->base, -2.0 * i / c->n_rot) / (c->ff ? c->ff[i] : 1.0);
        const int a = c->neox ? i : 2 * i, b = c->neox ? i + n : 2 * i + 1;
        L += c->mscale * (r[a] * (x[a] * cos(th) - x[b] * sin(th)) + r[b] * (x[a] * sin(th) + x[b] * cos(th)));
      }
    }
  return L;
}
static void test_fd_rope(const struct impl *im) {
  const int T = 4, H = 3, hd = 10;
  const int32_t pos[4] = {0, 3, 17, 41};
  const float ff[4] = {1.0f, 1.5f, 2.0f, 4.0f};
  for (int mode = 0; mode < 2; mode++) {
    // mode 1: NeoX with freq factors and an attention factor (Phi-3's LongRoPE) and a scale
    struct ll_rope_params p = {mode ? LL_ROPE_NEOX : LL_ROPE_NORMAL, 8, 10000.0f, mode ? 0.5f : 1.0f, mode ? ff : NULL, mode ? 1.2247449f : 1.0f};
    const size_t n = (size_t)T * H * hd;
    float *x = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n);
    fill(x, n, 1), fill(r, n, 1);
    memcpy(d, r, sizeof(float) * n);
    CHECK(im->i->rope_backward(im->b, d, pos, T, H, hd, &p) == 0);
    struct rope_ctx c = {T, H, hd, p.n_rot, mode, pos, p.freq_base, p.freq_scale, p.freq_factors, to_d(x, n), to_d(r, n), p.attn_factor};
    double *fd = malloc(sizeof(double) * n);
    fd_grad(c.x, n, rope_loss, &c, fd);
    check_fd(mode ? "rope dx neox+factors+attn_factor" : "rope dx normal", im->name, d, fd, n);
    // The forward op, then its backward: the identity (a rotation's transpose is its inverse),
    // times the attention factor squared on the rotated dims (y = m R x, dx = m R^T dy).
    if (im->b) {
      memcpy(d, x, sizeof(float) * n);
      CHECK(im->b->i->rope(im->b, d, pos, T, H, hd, &p) == 0);
      CHECK(im->i->rope_backward(im->b, d, pos, T, H, hd, &p) == 0);
      float *want = malloc(sizeof(float) * n);
      const float m2 = p.attn_factor * p.attn_factor;
      for (size_t e = 0; e < n; e++) want[e] = (int)(e % (size_t)hd) < p.n_rot ? x[e] * m2 : x[e];
      CHECKF(nerr(d, want, n) < 1e-6, "rope_backward(rope(x)) != m^2 x: %.3e", nerr(d, want, n));
      free(want);
    }
    free(c.x), free(c.r), free(fd), free(x), free(r), free(d);
  }
}

// ---------------------------------------------------------------- swiglu
// Mutation tried: dgate without σ' (dgate = dout up σ: the "gate (1 - σ)" term dropped) ->
// "fd swiglu dgate ref normalized error 1.29e-01".
struct sw_ctx {
  size_t n;
  double *g, *u, *r;
};
static double sw_loss(void *vc) {
  const struct sw_ctx *c = vc;
  double L = 0;
  for (size_t i = 0; i < c->n; i++) L += c->r[i] * c->g[i] / (1 + exp(-c->g[i])) * c->u[i];
  return L;
}
static void test_fd_swiglu(const struct impl *im) {
  const size_t n = 29;
  float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n);
  float *dg = malloc(sizeof(float) * n), *du = malloc(sizeof(float) * n);
  fill(g, n, 4), fill(u, n, 1), fill(r, n, 1);
  CHECK(im->i->swiglu_backward(im->b, dg, du, r, g, u, (int64_t)n) == 0);
  struct sw_ctx c = {n, to_d(g, n), to_d(u, n), to_d(r, n)};
  double *fd = malloc(sizeof(double) * n);
  fd_grad(c.g, n, sw_loss, &c, fd);
  check_fd("swiglu dgate", im->name, dg, fd, n);
  fd_grad(c.u, n, sw_loss, &c, fd);
  check_fd("swiglu dup", im->name, du, fd, n);
  free(c.g), free(c.u), free(c.r), free(fd), free(g), free(u), free(r), free(dg), free(du);
}

// ---------------------------------------------------------------- geglu
// The double forward here is the tanh form (what the backward differentiates; the engine's
// ggml_math forward reads it from an f16 table, within f16 rounding of it). Gates over [-5, 5]
// cover the curve's bend and both tails.
// Mutations tried: gelu' without its tanh' term (dgate = dout up ½ (1 + tanh u)) ->
// "fd geglu dgate ref normalized error 1.85e-01"; the 3 a gate² term dropped ->
// "fd geglu dgate ref normalized error 4.21e-02".
static double ge_loss(void *vc) {
  const struct sw_ctx *c = vc;
  double L = 0;
  for (size_t i = 0; i < c->n; i++) {
    const double x = c->g[i];
    L += c->r[i] * 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * c->u[i];
  }
  return L;
}
static void test_fd_geglu(const struct impl *im) {
  const size_t n = 37;
  float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n);
  float *dg = malloc(sizeof(float) * n), *du = malloc(sizeof(float) * n);
  fill(g, n, 5), fill(u, n, 1), fill(r, n, 1);
  CHECK(im->i->geglu_backward(im->b, dg, du, r, g, u, (int64_t)n) == 0);
  struct sw_ctx c = {n, to_d(g, n), to_d(u, n), to_d(r, n)};
  double *fd = malloc(sizeof(double) * n);
  fd_grad(c.g, n, ge_loss, &c, fd);
  check_fd("geglu dgate", im->name, dg, fd, n);
  fd_grad(c.u, n, ge_loss, &c, fd);
  check_fd("geglu dup", im->name, du, fd, n);
  free(c.g), free(c.u), free(c.r), free(fd), free(g), free(u), free(r), free(dg), free(du);
}

// ---------------------------------------------------------------- attention
// Mutations tried: ds without the softmax Jacobian's row term (ds = p dp scale, "- D" dropped) ->
// "fd attention dq S7 H6/2 ref normalized error 8.76e-01", dk 1.02e+00 (dv unaffected, passing);
// dv without the factor p -> "fd attention dv S7 H6/2 ref normalized error 1.47e+00".
// attention_train_swa with the window ignored (lo = 0) -> "fd attention out S9 H6/2 w3 ref normalized
// error 1.08e+00" (att 7.3e-01, dq 6.4e-01, dk 1.4e+00).
struct at_ctx {
  int S, H, Hkv, hd, window; // window > 0: query i sees keys (i - window, i] (attention_train_swa)
  double scale, *q, *k, *v, *r;
  double *out, *att; // the forward's results (out (S, H, hd), att (H, S, S))
};
static void at_forward(struct at_ctx *c) {
  const int S = c->S, H = c->H, Hkv = c->Hkv, hd = c->hd;
  for (int h = 0; h < H; h++) {
    const int kh = h / (H / Hkv);
    for (int i = 0; i < S; i++) {
      double *p = c->att + ((size_t)h * S + i) * S, mx = -INFINITY, sum = 0;
      const int lo = c->window > 0 && i + 1 > c->window ? i + 1 - c->window : 0;
      for (int j = 0; j < S; j++) {
        p[j] = 0;
        if (j > i || j < lo) continue;
        for (int e = 0; e < hd; e++) p[j] += c->q[((size_t)i * H + h) * hd + e] * c->k[((size_t)j * Hkv + kh) * hd + e];
        p[j] *= c->scale;
        mx = fmax(mx, p[j]);
      }
      for (int j = lo; j <= i; j++) sum += p[j] = exp(p[j] - mx);
      for (int j = lo; j <= i; j++) p[j] /= sum;
      for (int e = 0; e < hd; e++) {
        double o = 0;
        for (int j = 0; j <= i; j++) o += p[j] * c->v[((size_t)j * Hkv + kh) * hd + e];
        c->out[((size_t)i * H + h) * hd + e] = o;
      }
    }
  }
}
static double at_loss(void *vc) {
  struct at_ctx *c = vc;
  at_forward(c);
  double L = 0;
  for (size_t i = 0; i < (size_t)c->S * c->H * c->hd; i++) L += c->r[i] * c->out[i];
  return L;
}
static void test_fd_attention(const struct impl *im) {
  const int cfg[3][5] = {{7, 6, 2, 5, 0}, {5, 3, 3, 4, 0}, {9, 6, 2, 5, 3}}; // S, H, Hkv, hd, window (attention_train_swa)
  for (int ci = 0; ci < 3; ci++) {
    const int S = cfg[ci][0], H = cfg[ci][1], Hkv = cfg[ci][2], hd = cfg[ci][3], win = cfg[ci][4];
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    float *r = malloc(sizeof(float) * nq), *out = malloc(sizeof(float) * nq), *att = malloc(sizeof(float) * na);
    float *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk), *dv = malloc(sizeof(float) * nk);
    fill(q, nq, 2), fill(k, nk, 2), fill(v, nk, 1), fill(r, nq, 1);
    fill(att, na, 9); // garbage: the op must write every element (zeros above the diagonal)
    if (win) CHECK(im->i->attention_train_swa(im->b, out, att, q, k, v, S, H, Hkv, hd, scale, win) == 0);
    else CHECK(im->i->attention_train(im->b, out, att, q, k, v, S, H, Hkv, hd, scale) == 0);
    struct at_ctx c = {S, H, Hkv, hd, win, scale, to_d(q, nq), to_d(k, nk), to_d(v, nk), to_d(r, nq), malloc(sizeof(double) * nq),
                       malloc(sizeof(double) * na)};
    at_forward(&c);
    char what[64];
    snprintf(what, sizeof what, "attention out S%d H%d/%d w%d", S, H, Hkv, win);
    check_fd(what, im->name, out, c.out, nq); // the forward itself against the double one
    snprintf(what, sizeof what, "attention att S%d H%d/%d w%d", S, H, Hkv, win);
    check_fd(what, im->name, att, c.att, na);
    fill(dq, nq, 9), fill(dk, nk, 9), fill(dv, nk, 9); // overwritten, not accumulated
    CHECK(im->i->attention_backward(im->b, dq, dk, dv, r, q, k, v, att, S, H, Hkv, hd, scale) == 0);
    double *fd = malloc(sizeof(double) * nq);
    fd_grad(c.q, nq, at_loss, &c, fd);
    snprintf(what, sizeof what, "attention dq S%d H%d/%d w%d", S, H, Hkv, win);
    check_fd(what, im->name, dq, fd, nq);
    fd_grad(c.k, nk, at_loss, &c, fd);
    snprintf(what, sizeof what, "attention dk S%d H%d/%d w%d", S, H, Hkv, win);
    check_fd(what, im->name, dk, fd, nk);
    fd_grad(c.v, nk, at_loss, &c, fd);
    snprintf(what, sizeof what, "attention dv S%d H%d/%d w%d", S, H, Hkv, win);
    check_fd(what, im->name, dv, fd, nk);
    free(c.q), free(c.k), free(c.v), free(c.r), free(c.out), free(c.att), free(fd);
    free(q), free(k), free(v), free(r), free(out), free(att), free(dq), free(dk), free(dv);
  }
}

// ---------------------------------------------------------------- cross-entropy
// Mutation tried: dlogits without the one-hot term (d[j] = softmax_j grad_scale) -> "fd xent
// dlogits ref normalized error 1.00e+00".
struct xe_ctx {
  int T, V;
  const int32_t *y;
  double *l;
};
static double xe_loss(void *vc) {
  const struct xe_ctx *c = vc;
  double L = 0;
  for (int t = 0; t < c->T; t++) {
    if (c->y[t] < 0) continue;
    const double *l = c->l + (size_t)t * c->V;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < c->V; j++) mx = fmax(mx, l[j]);
    for (int j = 0; j < c->V; j++) s += exp(l[j] - mx);
    L += log(s) + mx - l[c->y[t]];
  }
  return L;
}
static void test_fd_xent(const struct impl *im) {
  const int T = 6, V = 37;
  const int32_t y[6] = {3, -1, 0, 36, -100, 17};
  const size_t n = (size_t)T * V;
  float *l = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n), *d2 = malloc(sizeof(float) * n);
  fill(l, n, 3);
  double loss = 0, loss2 = 0;
  CHECK(im->i->softmax_xent(im->b, &loss, d, l, y, T, V, 1.0f) == 0);
  struct xe_ctx c = {T, V, y, to_d(l, n)};
  const double want = xe_loss(&c);
  CHECKF(fabs(loss - want) < 1e-5 * fabs(want), "xent loss %.9g, want %.9g", loss, want);
  double *fd = malloc(sizeof(double) * n);
  fd_grad(c.l, n, xe_loss, &c, fd);
  check_fd("xent dlogits", im->name, d, fd, n);
  // Masked rows are exactly zero; grad_scale scales; NULL dlogits gives the loss alone; dlogits
  // aliasing logits gives the same values.
  int zero = 1;
  for (int j = 0; j < V; j++) zero &= d[(size_t)1 * V + j] == 0.0f && d[(size_t)4 * V + j] == 0.0f;
  CHECK(zero);
  CHECK(im->i->softmax_xent(im->b, &loss2, NULL, l, y, T, V, 1.0f) == 0);
  CHECK(loss2 == loss);
  memcpy(d2, l, sizeof(float) * n);
  CHECK(im->i->softmax_xent(im->b, &loss2, d2, d2, y, T, V, 0.25f) == 0);
  CHECK(loss2 == loss);
  double e = 0;
  for (size_t i = 0; i < n; i++) e = fmax(e, fabs(d2[i] - 0.25 * d[i]));
  CHECKF(e < 1e-7, "xent aliased, grad_scale 0.25: max diff %.3e", e);
  const int32_t bad[6] = {3, -1, 0, 37, 1, 1}; // a target past the vocabulary
  CHECK(im->i->softmax_xent(im->b, &loss2, d2, l, bad, T, V, 1.0f) == LL_EINVAL);
  free(c.l), free(fd), free(l), free(d), free(d2);
}

// ---------------------------------------------------------------- embedding
// Mutation tried: a row overwritten instead of accumulated (row[c] = dout[...]: the earlier
// tokens' and the initial dw's terms dropped) -> "fd get_rows dw ref normalized error 8.04e-01".
struct gr_ctx {
  int T, C;
  const int32_t *ids;
  double *w, *r;
};
static double gr_loss(void *vc) {
  const struct gr_ctx *c = vc;
  double L = 0;
  for (int t = 0; t < c->T; t++)
    for (int j = 0; j < c->C; j++) L += c->r[(size_t)t * c->C + j] * c->w[(size_t)c->ids[t] * c->C + j];
  return L;
}
static void test_fd_get_rows(const struct impl *im) {
  const int rows = 5, C = 9, T = 7;
  const int32_t ids[7] = {1, 4, 1, 0, 4, 4, 2};
  float *w = malloc(sizeof(float) * rows * C), *r = malloc(sizeof(float) * T * C), *dw = malloc(sizeof(float) * rows * C);
  float *dw0 = malloc(sizeof(float) * rows * C);
  fill(w, (size_t)rows * C, 1), fill(r, (size_t)T * C, 1), fill(dw0, (size_t)rows * C, 1);
  memcpy(dw, dw0, sizeof(float) * rows * C);
  CHECK(im->i->get_rows_backward(im->b, dw, r, ids, T, C) == 0);
  struct gr_ctx c = {T, C, ids, to_d(w, (size_t)rows * C), to_d(r, (size_t)T * C)};
  double *fd = malloc(sizeof(double) * rows * C);
  fd_grad(c.w, (size_t)rows * C, gr_loss, &c, fd);
  for (int i = 0; i < rows * C; i++) fd[i] += dw0[i];
  check_fd("get_rows dw", im->name, dw, fd, (size_t)rows * C);
  const int32_t neg[2] = {0, -1};
  CHECK(im->i->get_rows_backward(im->b, dw, r, neg, 2, C) == LL_EINVAL);
  free(c.w), free(c.r), free(fd), free(w), free(r), free(dw), free(dw0);
}

// ---------------------------------------------------------------- dropout
// The forward's mask (read off its output) must be the backward's: dropout(dout) with the same
// seed is the gradient of Σ dout ⊙ dropout(x).
// Mutation tried: the scale 1/(1-p) left out -> "fd dropout dx ref normalized error 3.00e-01".
struct dr_ctx {
  size_t n;
  double p, *x, *r;
  const unsigned char *keep;
};
static double dr_loss(void *vc) {
  const struct dr_ctx *c = vc;
  double L = 0;
  for (size_t i = 0; i < c->n; i++) L += c->keep[i] ? c->r[i] * c->x[i] / (1 - c->p) : 0;
  return L;
}
static void test_fd_dropout(const struct impl *im) {
  const size_t n = 1001;
  const float p = 0.3f;
  float *x = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n);
  unsigned char *keep = malloc(n);
  for (size_t i = 0; i < n; i++) x[i] = 1.0f + (float)i; // never 0: a zero output means dropped
  fill(r, n, 1);
  CHECK(im->i->dropout(im->b, out, x, p, 42, (int64_t)n) == 0);
  size_t dropped = 0, bad = 0;
  for (size_t i = 0; i < n; i++) {
    keep[i] = out[i] != 0.0f;
    dropped += !keep[i];
    bad += keep[i] && fabsf(out[i] - x[i] / (1 - p)) > 1e-6f * x[i];
  }
  CHECKF(bad == 0 && dropped > n / 5 && dropped < n * 2 / 5, "dropout: %zu dropped of %zu, %zu bad values", dropped, n, bad);
  CHECK(im->i->dropout(im->b, d, r, p, 42, (int64_t)n) == 0);
  fill(x, n, 1); // any point: the loss is linear
  struct dr_ctx c = {n, p, to_d(x, n), to_d(r, n), keep};
  double *fd = malloc(sizeof(double) * n);
  fd_grad(c.x, n, dr_loss, &c, fd);
  check_fd("dropout dx", im->name, d, fd, n);
  CHECK(im->i->dropout(im->b, d, r, 1.0f, 42, (int64_t)n) == LL_EINVAL);
  CHECK(im->i->dropout(im->b, d, r, -0.1f, 42, (int64_t)n) == LL_EINVAL);
  CHECK(im->i->dropout(im->b, d, r, 0.0f, 42, (int64_t)n) == 0 && !memcmp(d, r, sizeof(float) * n));
  free(c.x), free(c.r), free(fd), free(x), free(r), free(out), free(d), free(keep);
}

// ---------------------------------------------------------------- vector helpers and AdamW
static void test_vec(const struct impl *im) {
  const size_t n = 1003;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *y0 = malloc(sizeof(float) * n);
  fill(x, n, 3), fill(y0, n, 1);
  double s = 0, want = 0;
  for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
  CHECK(im->i->sumsq(im->b, &s, x, (int64_t)n) == 0);
  CHECKF(fabs(s - want) <= 1e-12 * want, "sumsq %.17g want %.17g", s, want);
  memcpy(y, y0, sizeof(float) * n);
  CHECK(im->i->axpy(im->b, y, x, -0.5f, (int64_t)n) == 0);
  int ok = 1;
  for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] + -0.5f * x[i];
  CHECK(ok);
  memcpy(y, y0, sizeof(float) * n);
  CHECK(im->i->axpy(im->b, y, y, 1.0f, (int64_t)n) == 0); // x aliasing out: out *= 2
  for (size_t i = 0; i < n; i++) ok &= y[i] == 2 * y0[i];
  CHECK(ok);
  memcpy(y, y0, sizeof(float) * n);
  CHECK(im->i->scale(im->b, y, 0.125f, (int64_t)n) == 0);
  for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] * 0.125f;
  CHECK(ok);
  free(x), free(y), free(y0);
}

// AdamW, two steps by hand (lr 0.1, b1 0.9, b2 0.999, eps 1e-8, wd 0.01), three parameters:
//  p0 = 1, g = 0.5 then -1:
//   step 1: m = 0.05, v = 0.00025, m̂ = 0.05/0.1 = 0.5, v̂ = 0.00025/0.001 = 0.25, m̂/(√v̂+eps) = 1 - 2e-8
//           p = 1 - 0.1 (1 - 2e-8 + 0.01 · 1) = 0.899000002
//   step 2: m = 0.045 - 0.1 = -0.055, v = 0.00024975 + 0.001 = 0.00124975, m̂ = -0.055/0.19,
//           v̂ = 0.00124975/0.001999, p = 0.899000002 - 0.1 (-0.3661019 + 0.00899) = 0.934711354
//  p1 = -2, g = 0 then 0.25: step 1 moves only by decay: p = -2 - 0.1 (0 + 0.01 · -2) = -1.998;
//   step 2: m = 0.025, v = 6.25e-5, m̂/√v̂ = (0.025/0.19)/√(6.25e-5/0.001999) = 0.7441337,
//           p = -1.998 - 0.1 (0.7441337 - 0.01998) = -2.070415678
//  p2 = 0, g = -3 twice: m̂ = -3, v̂ = 9 both steps, so the step is lr (1 + wd p):
//   step 1: p = 0 - 0.1 (-1 + 0) = 0.1;  step 2: p = 0.1 - 0.1 (-1 + 0.001) = 0.1999
static void test_adamw(const struct impl *im) {
  float p[3] = {1, -2, 0}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  const float g1[3] = {0.5f, 0, -3}, g2[3] = {-1, 0.25f, -3};
  CHECK(im->i->adamw(im->b, p, g1, m, v, 3, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1) == 0);
  CHECKF(fabs(p[0] - 0.899000002) < 1e-6 && fabs(p[1] + 1.998) < 1e-6 && fabs(p[2] - 0.1) < 1e-6, "adamw step 1: %.9g %.9g %.9g (%s)",
         p[0], p[1], p[2], im->name);
  // 1 - b1 and 1 - b2 of the float betas are 2e-7 and 1.3e-5 off 0.1 and 0.001: 1e-4 relative
  CHECK(fabs(m[0] - 0.05) < 5e-6 && fabs(v[0] - 0.00025) < 2.5e-8 && m[1] == 0 && v[1] == 0);
  CHECK(im->i->adamw(im->b, p, g2, m, v, 3, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2) == 0);
  CHECKF(fabs(p[0] - 0.934711354) < 1e-6 && fabs(p[1] + 2.070415678) < 1e-6 && fabs(p[2] - 0.1999) < 1e-6,
         "adamw step 2: %.9g %.9g %.9g (%s)", p[0], p[1], p[2], im->name);
  CHECK(fabs(m[0] + 0.055) < 5.5e-6 && fabs(v[0] - 0.00124975) < 1.3e-7);
  CHECK(im->i->adamw(im->b, p, g2, m, v, 3, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 0) == LL_EINVAL); // step counts from 1
}


// ---------------------------------------------------------------- fast versions vs references
// Each fast op runs on backends of 1, 2 and 3 threads: the three results must be the same bits
// (the work split depends on the shapes only), and within FAST_TOL of the reference (or equal to
// it where both compute each element with the same expression).
static struct ll_backend *bk[3];
static double worst_fast;

static void same3(const char *what, float *const r[3], size_t n) {
  CHECKF(!memcmp(r[0], r[1], n * sizeof(float)) && !memcmp(r[0], r[2], n * sizeof(float)), "%s: 1, 2, 3 threads differ", what);
}
static void close_ref(const char *what, const float *fast, const float *ref, size_t n) {
  const double e = nerr(fast, ref, n);
  if (e > worst_fast) worst_fast = e;
  CHECKF(e < FAST_TOL, "%s: fast vs reference normalized error %.3e", what, e);
}
static void bits_ref(const char *what, const float *fast, const float *ref, size_t n) {
  CHECKF(!memcmp(fast, ref, n * sizeof(float)), "%s: fast differs from the reference (normalized %.3e)", what, nerr(fast, ref, n));
}
static float *dup_f(const float *x, size_t n) {
  float *d = malloc((n ? n : 1) * sizeof *d);
  memcpy(d, x, n * sizeof *d);
  return d;
}

static void test_fast_matmul(void) {
  const int types[] = {LL_TYPE_F32, LL_TYPE_F16, LL_TYPE_BF16, LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q5_0,
                       LL_TYPE_Q5_1, LL_TYPE_Q8_0, LL_TYPE_Q4_K, LL_TYPE_Q5_K, LL_TYPE_Q6_K};
  const int Ts[] = {1, 7, 33, 70};
  double worst_type[sizeof types / sizeof *types] = {0};
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
    const int type = types[ti], bs = ll_type_traits_get(type)->blck_size;
    for (int trial = 0; trial < 2; trial++) {
      // ragged: K not a multiple of the column slices, N over one panel of 256 rows, T odd
      const int K = bs == 256 ? 256 * (1 + trial * 2) : bs == 32 ? 32 * (3 + trial * 8) : 300 - 260 * trial; // f32: 16 x 300 splits dw in columns
      const int N = trial ? 300 : 45 - 29 * (type == LL_TYPE_F32), T = Ts[(trial * 2 + ll_test_rand(&rs) % 2) % 4]; // f32: N 16 (LoRA A)
      const size_t rsz = ll_row_size(type, K);
      void *wq = malloc(rsz * N);
      random_weight(type, wq, N, K);
      struct ll_weight w = {type, K, N, wq, NULL, NULL};
      float *x = malloc(sizeof(float) * T * K), *dout = malloc(sizeof(float) * T * N), *dx0 = malloc(sizeof(float) * T * K);
      float *dw0 = malloc(sizeof(float) * N * K);
      fill(x, (size_t)T * K, 1), fill(dout, (size_t)T * N, 1), fill(dx0, (size_t)T * K, 1), fill(dw0, (size_t)N * K, 1);
      const int f32 = type == LL_TYPE_F32;
      float *rdx = dup_f(dx0, (size_t)T * K), *rdw = dup_f(dw0, (size_t)N * K), *fdx[3], *fdw[3];
      CHECK(ll_train_ref_matmul_backward(NULL, rdx, f32 ? rdw : NULL, dout, x, &w, T) == 0);
      for (int b = 0; b < 3; b++) {
        fdx[b] = dup_f(dx0, (size_t)T * K), fdw[b] = dup_f(dw0, (size_t)N * K);
        CHECK(bk[b]->i->matmul_backward(bk[b], fdx[b], f32 ? fdw[b] : NULL, dout, x, &w, T) == 0);
      }
      char what[96];
      snprintf(what, sizeof what, "matmul_backward dx %s T%d N%d K%d", ll_type_name(type), T, N, K);
      same3(what, fdx, (size_t)T * K);
      close_ref(what, fdx[1], rdx, (size_t)T * K);
      const double e = nerr(fdx[1], rdx, (size_t)T * K);
      if (e > worst_type[ti]) worst_type[ti] = e;
      if (f32) {
        snprintf(what, sizeof what, "matmul_backward dw f32 T%d N%d K%d", T, N, K);
        same3(what, fdw, (size_t)N * K);
        close_ref(what, fdw[1], rdw, (size_t)N * K);
      }
      // dx NULL: only dw (or nothing) is written
      if (f32) CHECK(bk[1]->i->matmul_backward(bk[1], NULL, fdw[0], dout, x, &w, T) == 0);
      for (int b = 0; b < 3; b++) free(fdx[b]), free(fdw[b]);
      free(wq), free(x), free(dout), free(dx0), free(dw0), free(rdx), free(rdw);
    }
  }
  // A tall weight (the vocabulary's shape, scaled down): dx goes through many dequantized
  // panels of rows, added in row order - the same bits for 1, 2, 3 threads.
  {
    const int K = 2048, N = (1 << 21) / K * 2 + 77, T = 9;
    void *wq = malloc(ll_row_size(LL_TYPE_Q4_0, K) * N);
    random_weight(LL_TYPE_Q4_0, wq, N, K);
    struct ll_weight w = {LL_TYPE_Q4_0, K, N, wq, NULL, NULL};
    float *dout = malloc(sizeof(float) * T * N), *dx0 = malloc(sizeof(float) * T * K), *fdx[3];
    fill(dout, (size_t)T * N, 1), fill(dx0, (size_t)T * K, 1);
    float *rdx = dup_f(dx0, (size_t)T * K);
    CHECK(ll_train_ref_matmul_backward(NULL, rdx, NULL, dout, NULL, &w, T) == 0);
    for (int b = 0; b < 3; b++) {
      fdx[b] = dup_f(dx0, (size_t)T * K);
      CHECK(bk[b]->i->matmul_backward(bk[b], fdx[b], NULL, dout, NULL, &w, T) == 0);
    }
    same3("matmul_backward dx q4_0 in panels", fdx, (size_t)T * K);
    close_ref("matmul_backward dx q4_0 in panels", fdx[1], rdx, (size_t)T * K);
    for (int b = 0; b < 3; b++) free(fdx[b]);
    free(wq), free(dout), free(dx0), free(rdx);
  }
  printf("  matmul_backward fast vs reference, normalized error per type:");
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) printf(" %s %.1e", ll_type_name(types[ti]), worst_type[ti]);
  printf("\n");
  // a type without a dequantizer is refused, not guessed
  struct ll_weight q2 = {LL_TYPE_Q2_K, 256, 1, NULL, NULL, NULL};
  float d1[256] = {0}, o1[1] = {1};
  CHECK(bk[0]->i->matmul_backward(bk[0], d1, NULL, o1, NULL, &q2, 1) == LL_EUNSUPPORTED);
}

static void test_fast_rows(void) {
  // rmsnorm_backward: dx the reference's bits, dg within tolerance (block partial sums)
  {
    const int T = 37, C = 200;
    float *x = malloc(sizeof(float) * T * C), *g = malloc(sizeof(float) * C), *d = malloc(sizeof(float) * T * C);
    float *dx0 = malloc(sizeof(float) * T * C), *dg0 = malloc(sizeof(float) * C);
    fill(x, (size_t)T * C, 2), fill(g, C, 1), fill(d, (size_t)T * C, 1), fill(dx0, (size_t)T * C, 1), fill(dg0, C, 1);
    float *rdx = dup_f(dx0, (size_t)T * C), *rdg = dup_f(dg0, C), *fdx[3], *fdg[3];
    CHECK(ll_train_ref_rmsnorm_backward(NULL, rdx, rdg, d, x, g, T, C, 1e-5f) == 0);
    for (int b = 0; b < 3; b++) {
      fdx[b] = dup_f(dx0, (size_t)T * C), fdg[b] = dup_f(dg0, C);
      CHECK(bk[b]->i->rmsnorm_backward(bk[b], fdx[b], fdg[b], d, x, g, T, C, 1e-5f) == 0);
    }
    same3("rmsnorm_backward dx", fdx, (size_t)T * C);
    same3("rmsnorm_backward dg", fdg, C);
    bits_ref("rmsnorm_backward dx", fdx[1], rdx, (size_t)T * C);
    close_ref("rmsnorm_backward dg", fdg[1], rdg, C);
    for (int b = 0; b < 3; b++) free(fdx[b]), free(fdg[b]);
    free(x), free(g), free(d), free(dx0), free(dg0), free(rdx), free(rdg);
  }
  // rope_backward: the reference's bits
  {
    const int T = 29, H = 5, hd = 64;
    int32_t pos[29];
    for (int t = 0; t < T; t++) pos[t] = 3 * t + 1;
    struct ll_rope_params p = {LL_ROPE_NEOX, 48, 10000.0f, 1.0f, NULL, 1.0f};
    const size_t n = (size_t)T * H * hd;
    float *d = malloc(sizeof(float) * n), *r, *f[3];
    fill(d, n, 1);
    r = dup_f(d, n);
    CHECK(ll_train_ref_rope_backward(NULL, r, pos, T, H, hd, &p) == 0);
    for (int b = 0; b < 3; b++) {
      f[b] = dup_f(d, n);
      CHECK(bk[b]->i->rope_backward(bk[b], f[b], pos, T, H, hd, &p) == 0);
    }
    same3("rope_backward", f, n);
    bits_ref("rope_backward", f[1], r, n);
    for (int b = 0; b < 3; b++) free(f[b]);
    free(d), free(r);
  }
  // get_rows_backward: the reference's bits (repeated ids, ragged columns)
  {
    const int rows = 11, C = 200, T = 50;
    int32_t ids[50];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(ll_test_rand(&rs) % rows);
    float *d = malloc(sizeof(float) * T * C), *dw0 = malloc(sizeof(float) * rows * C), *r, *f[3];
    fill(d, (size_t)T * C, 1), fill(dw0, (size_t)rows * C, 1);
    r = dup_f(dw0, (size_t)rows * C);
    CHECK(ll_train_ref_get_rows_backward(NULL, r, d, ids, T, C) == 0);
    for (int b = 0; b < 3; b++) {
      f[b] = dup_f(dw0, (size_t)rows * C);
      CHECK(bk[b]->i->get_rows_backward(bk[b], f[b], d, ids, T, C) == 0);
    }
    same3("get_rows_backward", f, (size_t)rows * C);
    bits_ref("get_rows_backward", f[1], r, (size_t)rows * C);
    for (int b = 0; b < 3; b++) free(f[b]);
    free(d), free(dw0), free(r);
  }
}

static void test_fast_elementwise(void) {
  const int64_t n = 50001; // four chunks and a tail
  float *a = malloc(sizeof(float) * n), *c = malloc(sizeof(float) * n), *d = malloc(sizeof(float) * n);
  fill(a, (size_t)n, 4), fill(c, (size_t)n, 1), fill(d, (size_t)n, 1);
  float *r1 = malloc(sizeof(float) * n), *r2 = malloc(sizeof(float) * n), *f1[3], *f2[3];
  // swiglu_backward
  CHECK(ll_train_ref_swiglu_backward(NULL, r1, r2, d, a, c, n) == 0);
  for (int b = 0; b < 3; b++) {
    f1[b] = malloc(sizeof(float) * n), f2[b] = malloc(sizeof(float) * n);
    CHECK(bk[b]->i->swiglu_backward(bk[b], f1[b], f2[b], d, a, c, n) == 0);
  }
  same3("swiglu_backward dgate", f1, (size_t)n);
  same3("swiglu_backward dup", f2, (size_t)n);
  close_ref("swiglu_backward dgate", f1[1], r1, (size_t)n); // ggml's exp vs libm's: an ulp or two
  close_ref("swiglu_backward dup", f2[1], r2, (size_t)n);
  // geglu_backward: the reference's expressions in chunks (the same bits)
  CHECK(ll_train_ref_geglu_backward(NULL, r1, r2, d, a, c, n) == 0);
  for (int b = 0; b < 3; b++) CHECK(bk[b]->i->geglu_backward(bk[b], f1[b], f2[b], d, a, c, n) == 0);
  same3("geglu_backward dgate", f1, (size_t)n);
  same3("geglu_backward dup", f2, (size_t)n);
  bits_ref("geglu_backward dgate", f1[1], r1, (size_t)n);
  bits_ref("geglu_backward dup", f2[1], r2, (size_t)n);
  // dropout: the mask is the seed's, whatever the threads; another seed, another mask
  CHECK(ll_train_ref_dropout(NULL, r1, a, 0.1f, 7, n) == 0);
  for (int b = 0; b < 3; b++) CHECK(bk[b]->i->dropout(bk[b], f1[b], a, 0.1f, 7, n) == 0);
  same3("dropout", f1, (size_t)n);
  bits_ref("dropout", f1[1], r1, (size_t)n);
  CHECK(bk[1]->i->dropout(bk[1], f2[0], a, 0.1f, 8, n) == 0);
  int64_t differ = 0, zeros = 0;
  for (int64_t i = 0; i < n; i++) differ += (f2[0][i] == 0) != (f1[1][i] == 0), zeros += f1[1][i] == 0;
  CHECKF(differ > n / 10 && zeros > n / 20 && zeros < n * 3 / 20, "dropout: %lld masks differ between seeds, %lld dropped of %lld",
         (long long)differ, (long long)zeros, (long long)n);
  // axpy, scale
  for (int b = 0; b < 3; b++) {
    memcpy(f1[b], c, sizeof(float) * n);
    CHECK(bk[b]->i->axpy(bk[b], f1[b], a, 0.3f, n) == 0);
    CHECK(bk[b]->i->scale(bk[b], f1[b], -1.7f, n) == 0);
  }
  memcpy(r1, c, sizeof(float) * n);
  CHECK(ll_train_ref_axpy(NULL, r1, a, 0.3f, n) == 0);
  CHECK(ll_train_ref_scale(NULL, r1, -1.7f, n) == 0);
  same3("axpy+scale", f1, (size_t)n);
  bits_ref("axpy+scale", f1[1], r1, (size_t)n);
  // sumsq: chunks' partial sums in double, added in chunk order
  double rs_ = 0, fs[3];
  CHECK(ll_train_ref_sumsq(NULL, &rs_, a, n) == 0);
  for (int b = 0; b < 3; b++) CHECK(bk[b]->i->sumsq(bk[b], &fs[b], a, n) == 0);
  CHECK(fs[0] == fs[1] && fs[1] == fs[2]);
  CHECKF(fabs(fs[1] - rs_) <= 1e-12 * rs_, "sumsq fast %.17g ref %.17g", fs[1], rs_);
  // adamw: three steps, the reference's bits
  float *m[4], *v[4], *p[4];
  for (int b = 0; b < 4; b++) {
    m[b] = calloc((size_t)n, sizeof(float)), v[b] = calloc((size_t)n, sizeof(float)), p[b] = dup_f(c, (size_t)n);
    for (int step = 1; step <= 3; step++) {
      const float *g = step == 2 ? d : a;
      if (b == 3) CHECK(ll_train_ref_adamw(NULL, p[b], g, m[b], v[b], n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step) == 0);
      else CHECK(bk[b]->i->adamw(bk[b], p[b], g, m[b], v[b], n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step) == 0);
    }
  }
  same3("adamw p", p, (size_t)n);
  same3("adamw m", m, (size_t)n);
  same3("adamw v", v, (size_t)n);
  bits_ref("adamw p", p[1], p[3], (size_t)n);
  bits_ref("adamw v", v[1], v[3], (size_t)n);
  for (int b = 0; b < 4; b++) free(m[b]), free(v[b]), free(p[b]);
  for (int b = 0; b < 3; b++) free(f1[b]), free(f2[b]);
  free(a), free(c), free(d), free(r1), free(r2);
}

static void test_fast_xent(void) {
  const int T = 9, V = 5003;
  int32_t y[9];
  for (int t = 0; t < T; t++) y[t] = t % 4 == 1 ? -1 : (int32_t)(ll_test_rand(&rs) % V);
  const size_t n = (size_t)T * V;
  float *l = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n), *f[3];
  fill(l, n, 8);
  double rl = 0, fl[3], fl2 = 0;
  CHECK(ll_train_ref_softmax_xent(NULL, &rl, r, l, y, T, V, 0.5f) == 0);
  for (int b = 0; b < 3; b++) {
    f[b] = malloc(sizeof(float) * n);
    CHECK(bk[b]->i->softmax_xent(bk[b], &fl[b], f[b], l, y, T, V, 0.5f) == 0);
  }
  same3("softmax_xent dlogits", f, n);
  CHECK(fl[0] == fl[1] && fl[1] == fl[2]);
  CHECKF(fabs(fl[1] - rl) < 1e-6 * fabs(rl), "softmax_xent loss fast %.10g ref %.10g", fl[1], rl);
  close_ref("softmax_xent dlogits", f[1], r, n);
  CHECK(bk[1]->i->softmax_xent(bk[1], &fl2, NULL, l, y, T, V, 0.5f) == 0); // the loss alone (thread rows)
  CHECK(fl2 == fl[1]);
  memcpy(f[0], l, sizeof(float) * n); // in place
  CHECK(bk[1]->i->softmax_xent(bk[1], &fl2, f[0], f[0], y, T, V, 0.5f) == 0);
  CHECK(fl2 == fl[1] && !memcmp(f[0], f[1], sizeof(float) * n));
  for (int b = 0; b < 3; b++) free(f[b]);
  free(l), free(r);
}

static void test_fast_attention(void) {
  // S, H, Hkv, hd, window (attention_train_swa: a window inside one block, across blocks, longer than S)
  const int cfg[][5] = {{1, 4, 4, 20, 0}, {63, 4, 2, 20, 0}, {65, 4, 1, 20, 0}, {130, 9, 3, 64, 0}, {257, 9, 3, 64, 0},
                        {130, 4, 2, 20, 17}, {257, 9, 3, 64, 100}, {65, 4, 1, 20, 80}};
  for (size_t ci = 0; ci < sizeof cfg / sizeof *cfg; ci++) {
    const int S = cfg[ci][0], H = cfg[ci][1], Hkv = cfg[ci][2], hd = cfg[ci][3], win = cfg[ci][4];
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk), *d = malloc(sizeof(float) * nq);
    fill(q, nq, 2), fill(k, nk, 2), fill(v, nk, 1), fill(d, nq, 1);
    float *ro = malloc(sizeof(float) * nq), *ra = malloc(sizeof(float) * na), *rq = malloc(sizeof(float) * nq);
    float *rk = malloc(sizeof(float) * nk), *rv = malloc(sizeof(float) * nk);
    CHECK(ll_train_ref_attention_train_swa(NULL, ro, ra, q, k, v, S, H, Hkv, hd, scale, win) == 0);
    CHECK(ll_train_ref_attention_backward(NULL, rq, rk, rv, d, q, k, v, ra, S, H, Hkv, hd, scale) == 0);
    float *fo[3], *fa[3], *fq[3], *fk[3], *fv[3];
    for (int b = 0; b < 3; b++) {
      fo[b] = malloc(sizeof(float) * nq), fa[b] = malloc(sizeof(float) * na), fq[b] = malloc(sizeof(float) * nq);
      fk[b] = malloc(sizeof(float) * nk), fv[b] = malloc(sizeof(float) * nk);
      fill(fa[b], na, 5);
      if (win) CHECK(bk[b]->i->attention_train_swa(bk[b], fo[b], fa[b], q, k, v, S, H, Hkv, hd, scale, win) == 0);
      else CHECK(bk[b]->i->attention_train(bk[b], fo[b], fa[b], q, k, v, S, H, Hkv, hd, scale) == 0);
      // the backward from the reference's probabilities: its own error alone
      CHECK(bk[b]->i->attention_backward(bk[b], fq[b], fk[b], fv[b], d, q, k, v, ra, S, H, Hkv, hd, scale) == 0);
    }
    char what[96];
#define ATT_CMP(name, f, r, n)                                                  \
  snprintf(what, sizeof what, "attention %s S%d H%d/%d hd%d w%d", name, S, H, Hkv, hd, win); \
  same3(what, f, n);                                                            \
  close_ref(what, f[1], r, n)
    ATT_CMP("out", fo, ro, nq);
    ATT_CMP("att", fa, ra, na);
    ATT_CMP("dq", fq, rq, nq);
    ATT_CMP("dk", fk, rk, nk);
    ATT_CMP("dv", fv, rv, nk);
#undef ATT_CMP
    for (int b = 0; b < 3; b++) free(fo[b]), free(fa[b]), free(fq[b]), free(fk[b]), free(fv[b]);
    free(q), free(k), free(v), free(d), free(ro), free(ra), free(rq), free(rk), free(rv);
  }
}

// ll_backend.train_sgemm: where it applies (no AVX-512 VNNI) the forward is the exact f32 product of
// the dequantized weights; elsewhere it changes nothing (the same bits as without it).
static void test_train_sgemm(void) {
  const int T = 40, N = 70, K = 96;
  const size_t rsz = ll_row_size(LL_TYPE_Q4_1, K);
  void *wq = malloc(rsz * N);
  random_weight(LL_TYPE_Q4_1, wq, N, K);
  struct ll_weight w = {LL_TYPE_Q4_1, K, N, wq, NULL, NULL};
  float *x = malloc(sizeof(float) * T * K), *wf = malloc(sizeof(float) * N * K), *o0 = malloc(sizeof(float) * T * N);
  float *o1 = malloc(sizeof(float) * T * N), *r = malloc(sizeof(float) * T * N);
  fill(x, (size_t)T * K, 1);
  for (int n = 0; n < N; n++) ll_dequantize_row(LL_TYPE_Q4_1, (char *)wq + (size_t)n * rsz, wf + (size_t)n * K, K);
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)x[t * K + k] * wf[n * K + k];
      r[t * N + n] = (float)s;
    }
  struct ll_backend *b = bk[1];
  const int bi = b->batch_invariant;
  b->batch_invariant = 0, b->train_sgemm = 0;
  CHECK(b->i->matmul(b, o0, x, &w, T, 0) == 0);
  b->train_sgemm = 1;
  CHECK(b->i->matmul(b, o1, x, &w, T, 0) == 0);
  b->train_sgemm = 0, b->batch_invariant = bi;
  if (strcmp(ll_cpu_isa(), "avx512vnni") != 0) CHECKF(nerr(o1, r, (size_t)T * N) < 1e-5, "train_sgemm: %.3e", nerr(o1, r, (size_t)T * N));
  else CHECK(!memcmp(o0, o1, sizeof(float) * T * N));
  free(wq), free(x), free(wf), free(o0), free(o1), free(r);
}

// alloc/free_buf: zeroed, aligned, counted in get_info's mem_used
static void test_alloc(void) {
  struct ll_backend_info info;
  bk[0]->i->get_info(bk[0], &info);
  const int64_t before = info.mem_used;
  float *p = ll_backend_alloc(bk[0], 1000 * sizeof(float));
  CHECK(p && ((uintptr_t)p & 63) == 0);
  int zero = 1;
  for (int i = 0; p && i < 1000; i++) zero &= p[i] == 0;
  CHECK(zero);
  bk[0]->i->get_info(bk[0], &info);
  CHECKF(info.mem_used >= before + 4000, "mem_used %lld after 4000 bytes (before %lld)", (long long)info.mem_used, (long long)before);
  ll_backend_free_buf(bk[0], p);
  bk[0]->i->get_info(bk[0], &info);
  CHECK(info.mem_used == before);
}

int main(void) {
  rs = ll_test_seed();
  struct ll_backend *b1 = NULL, *b2 = NULL, *b3 = NULL;
  char err[256];
  CHECK(ll_backend_cpu_create(&b1, 1, err, sizeof err) == 0);
  CHECK(ll_backend_cpu_create(&b2, 2, err, sizeof err) == 0);
  CHECK(ll_backend_cpu_create(&b3, 3, err, sizeof err) == 0);
  if (!b1 || !b2 || !b3) return ll_test_summary();
  const struct impl impls[2] = {{"ref", NULL, ll_cpu_train_ref()}, {"cpu", b2, b2->i}};
  for (int i = 0; i < 2; i++) {
    const struct impl *im = &impls[i];
    test_fd_matmul(im);
    test_fd_rmsnorm(im);
    test_fd_rope(im);
    test_fd_swiglu(im);
    test_fd_geglu(im);
    test_fd_attention(im);
    test_fd_xent(im);
    test_fd_get_rows(im);
    test_fd_dropout(im);
    test_vec(im);
    test_adamw(im);
  }
  bk[0] = b1, bk[1] = b2, bk[2] = b3;
  test_fast_matmul();
  test_fast_rows();
  test_fast_elementwise();
  test_fast_xent();
  test_fast_attention();
  test_alloc();
  test_train_sgemm();
  printf("largest finite-difference error: %.2e (tolerance %.0e)\n", worst_fd, FD_TOL);
  printf("largest fast vs reference error: %.2e (tolerance %.0e)\n", worst_fast, FAST_TOL);
  ll_backend_free(b1);
  ll_backend_free(b2);
  ll_backend_free(b3);
  return ll_test_summary();
}
