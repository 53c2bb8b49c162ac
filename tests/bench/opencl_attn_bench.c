// opencl_attn_bench.c - the OpenCL fast tier's training attention at SmolLM2-135M's heads (9 query
// heads over 3 kv heads of 64): the probabilities path (attention_train + attention_backward:
// tiled products batched over heads around row reductions, (H, S, S) kept) against the
// flash-style members (attention_train_flash + attention_backward_flash: lse (H, S) kept, P
// recomputed per tile), best of several repetitions, operands in host memory (staged per call,
// the same for both). Also the bytes each keeps per layer and sequence. Not a test: numbers only.
//
//   build/tests/opencl_attn_bench [-d opencl:P:D] [-r REPS] [S ...]   (default S: 128 512)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_backend.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static uint64_t rng = 88172645463325252ULL;
static float *randv(size_t n, float amp) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, x[i] = amp * ((float)((rng >> 40) * (1.0 / 16777216.0)) * 2 - 1);
  return x;
}

int main(int argc, char **argv) {
  const char *dev = "opencl:0:0";
  int reps = 5, Ss[16], nS = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-d") && i + 1 < argc) dev = argv[++i];
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (nS < 16 && atoi(argv[i]) > 0) Ss[nS++] = atoi(argv[i]);
  }
  if (!nS) Ss[nS++] = 128, Ss[nS++] = 512;
  setenv("LL_OPENCL_REFERENCE", "0", 1);
  struct ll_backend_params p = {1, dev, NULL};
  struct ll_backend *b = NULL;
  char reason[256], err[512];
  if (ll_backend_create(&b, &p, reason, sizeof reason, err, sizeof err) || !b || strncmp(reason, "opencl:", 7)) {
    fprintf(stderr, "no OpenCL device (%s %s)\n", reason, err);
    return 1;
  }
  struct ll_backend_info in;
  b->i->get_info(b, &in);
  const int H = 9, Hkv = 3, hd = 64;
  const float scale = 0.125f;
  if (!b->i->attention_train_flash || b->i->attention_train_flash(b, NULL, NULL, NULL, NULL, NULL, 0, H, Hkv, hd, scale, 0)) {
    fprintf(stderr, "%s: no flash-style attention on this device (%s tier)\n", in.device, in.tier);
    return 1;
  }
  FILE *la = fopen("/proc/loadavg", "r");
  char load[64] = "?";
  if (la && fgets(load, sizeof load, la)) load[strcspn(load, "\n")] = 0;
  if (la) fclose(la);
  printf("%s, %s tier, heads %d/%d of %d, best of %d; load average %s\n", in.device, in.tier, H, Hkv, hd, reps, load);
  printf("%6s  %10s %10s  %10s %10s  %12s %12s\n", "S", "fwd ms", "bwd ms", "flash fwd", "flash bwd", "kept (B)", "flash kept");
  for (int si = 0; si < nS; si++) {
    const int S = Ss[si];
    const size_t nq = (size_t)S * H * hd, nk = (size_t)S * Hkv * hd, na = (size_t)H * S * S;
    float *q = randv(nq, 2), *k = randv(nk, 2), *v = randv(nk, 1), *dout = randv(nq, 1), *o = malloc(nq * 4), *att = malloc(na * 4);
    float *lse = malloc((size_t)H * S * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    double t[4] = {1e30, 1e30, 1e30, 1e30};
    int rc = 0;
    for (int r = 0; r <= reps && !rc; r++) { // repetition 0 warms up (first launches, staging buffers)
      double t0 = now();
      rc |= b->i->attention_train(b, o, att, q, k, v, S, H, Hkv, hd, scale);
      double t1 = now();
      rc |= b->i->attention_backward(b, dq, dk, dv, dout, q, k, v, att, S, H, Hkv, hd, scale);
      double t2 = now();
      rc |= b->i->attention_train_flash(b, o, lse, q, k, v, S, H, Hkv, hd, scale, 0);
      double t3 = now();
      rc |= b->i->attention_backward_flash(b, dq, dk, dv, dout, q, k, v, o, lse, S, H, Hkv, hd, scale, 0);
      double t4 = now();
      const double d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
      for (int i = 0; r && i < 4; i++) t[i] = d[i] < t[i] ? d[i] : t[i];
    }
    if (rc) {
      fprintf(stderr, "S %d: error %d\n", S, rc);
      return 1;
    }
    printf("%6d  %10.2f %10.2f  %10.2f %10.2f  %12zu %12zu\n", S, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3, na * 4, (size_t)H * S * 4);
    free(q), free(k), free(v), free(dout), free(o), free(att), free(lse), free(dq), free(dk), free(dv);
  }
  ll_backend_free(b);
  return 0;
}
