// test_arch_train.c - LoRA training of a family beyond llama/qwen2 (Qwen3: per-head q/k norms,
// q width 128 != C = 64) on a small random F32 model (tests/scripts/make_arch_models.py):
//  - the adapters' gradient against central finite differences of the loss, along the gradient
//    and along a random direction (F32 weights: the loss is smooth in the adapter; agreement
//    within 2% at the best step size);
//  - 40 steps on one fixed batch lower its loss by more than half.
// usage: test_arch_train MODEL
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_engine.h"
#include "ll_error.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_trainer.h"
#include "testutil.h"

enum { S = 24 };

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = argv[1];
  ep.n_threads = 1;
  ep.n_ctx = 128;
  ep.device = "cpu";
  char err[512];
  struct ll_engine *e = NULL;
  if (ll_engine_open(&e, &ep, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    CHECK(!"engine opens");
    return ll_test_summary();
  }
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.batch = 1, p.seq_len = S, p.rank = 4, p.alpha = 8, p.lr = 3e-2, p.warmup = 0, p.steps = 1000, p.dropout = 0;
  struct ll_trainer *tr = NULL;
  const int rc0 = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  if (rc0) fprintf(stderr, "%s\n", err);
  CHECK(rc0 == 0);
  if (rc0) return ll_test_summary();
  // B nonzero, so that A has gradients too
  const struct ll_lora *lo = ll_trainer_lora(tr);
  uint64_t rs = 99;
  for (int l = 0; l < lo->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      struct ll_lora_pair *pr = ll_lora_at(lo, l, t);
      for (int64_t i = 0; i < pr->b.k * pr->b.n; i++) ((float *)pr->b.data)[i] = 0.05f * (ll_test_randf(&rs) - 0.5f);
    }
  int32_t ids[S], tg[S];
  for (int i = 0; i < S; i++) ids[i] = (int32_t)((i * 37 + 11) % 256);
  for (int i = 0; i < S; i++) tg[i] = i + 1 < S ? ids[i + 1] : -1;
  float *P, *G;
  int64_t n;
  ll_trainer_vectors(tr, &P, &G, &n);
  double loss, lp, lm;
  CHECK(ll_trainer_zero_grad(tr) == 0);
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
  float *g = malloc(sizeof(float) * (size_t)n), *keep = malloc(sizeof(float) * (size_t)n), *d = malloc(sizeof(float) * (size_t)n);
  memcpy(g, G, sizeof(float) * (size_t)n);
  memcpy(keep, P, sizeof(float) * (size_t)n);
  for (int dir = 0; dir < 2; dir++) {
    double dd = 0, gd = 0;
    for (int64_t i = 0; i < n; i++) d[i] = dir == 0 ? g[i] : ll_test_randf(&rs) - 0.5f, dd += (double)d[i] * d[i];
    for (int64_t i = 0; i < n; i++) d[i] = (float)(d[i] / sqrt(dd)), gd += (double)g[i] * d[i];
    double best = 1e9;
    for (int k = 0; k < 3; k++) {
      const double eps = k == 0 ? 1e-2 : k == 1 ? 3e-3 : 1e-3;
      for (int64_t i = 0; i < n; i++) P[i] = keep[i] + (float)eps * d[i];
      CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lp, NULL, err, sizeof err) == 0);
      for (int64_t i = 0; i < n; i++) P[i] = keep[i] - (float)eps * d[i];
      CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lm, NULL, err, sizeof err) == 0);
      const double fd = (lp - lm) / (2 * eps), rel = fabs(fd - gd) / (fabs(gd) + 1e-6);
      printf("direction %s eps %.0e: g.d %+.6f finite differences %+.6f (relative %.2e)\n", dir ? "random" : "grad", eps, gd, fd, rel);
      best = rel < best ? rel : best;
    }
    memcpy(P, keep, sizeof(float) * (size_t)n);
    CHECKF(best < 2e-2, "direction %d: gradient and finite differences differ by %.3g", dir, best);
  }
  free(g), free(keep), free(d);
  // training on one batch: its loss falls
  double first = 0, last = 0;
  for (int step = 0; step < 40; step++) {
    CHECK(ll_trainer_zero_grad(tr) == 0);
    CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
    if (step == 0) first = loss;
    last = loss;
    // plain SGD on the adapter (the optimizer is the trainer's own business, tested elsewhere)
    for (int64_t i = 0; i < n; i++) P[i] -= 0.02f * G[i];
  }
  printf("loss over one batch: %.4f -> %.4f after 40 steps\n", first, last);
  CHECK(last < 0.5 * first);
  ll_trainer_free(tr);
  ll_engine_close(e);
  return ll_test_summary();
}
