// test_opencl_splitk.c - the fast tier's split-K decode attention (kernels/opencl/llsrv_split.cl
// attn_split, dispatched by ops.c attention_fast) against the CPU backend's attention, on the
// OpenCL device of $LL_TEST_OPENCL_DEVICE (default opencl:0:0: PoCL in CI).
//
// Three instances on one device (the same program): "forced" splits from 32 positions into up
// to 8 chunks (LL_OPENCL_SPLIT_KV=32:8: small caches take the split path), "default" (the
// shipped choice: chunks of >= 128 positions, splitting from 256), "off" (LL_OPENCL_SPLIT_KV=0:
// attn_fast alone). A batch of decode rows over caches of 1 .. 2900 positions (and a 5-token
// prompt chunk beside them, which never splits) per shape: grouped-query G = 1, 3, 4, head dims
// 64, 80 (tiles of 51 positions: chunks are not whole tiles) and 128, f16 and f32 caches,
// sliding windows of 700 and 100. Asserted:
// - normalized MSE against the CPU below attn_fast's own bounds (tests/test_opencl.c: 1e-11 for
//   an f32 cache, 1e-6 for f16: the CPU rounds probabilities to f16, the device does not);
// - one launch per call (a decode step's 6 per layer stay 6), counted as a split launch exactly
//   when some sequence's span reaches the threshold;
// - rows of blocks that do not split (one position; 37 positions; a prompt chunk of several
//   blocks) give attn_fast's bits, the 2900-position row does not (its chunks were combined), and a sequence's rows are the same
//   bits alone as in the batch (the split count depends on the sequence, not the batch);
// - a second call after the first (the blocks' counters were reset by the launch) gives the
//   same bits.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "testutil.h"

static uint64_t rs;

static double nmse(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), den += (double)ref[i] * ref[i];
  return den > 0 ? num / den : num;
}

static void randf(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = scale * (2.0f * ll_test_randf(&rs) - 1.0f);
}

static void info(struct ll_backend *b, struct ll_backend_info *in) { b->i->get_info(b, in); }

// The positions n rows at pos see together (a row at p: p + 1 - window .. p).
static int span(const int32_t *pos, int n, int window) {
  int lo = pos[0], hi = 0;
  for (int t = 0; t < n; t++) {
    const int l = window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0;
    lo = l < lo ? l : lo, hi = pos[t] > hi ? pos[t] : hi;
  }
  return hi - lo + 1;
}

#define TOL_F32 1e-11
#define TOL_F16 1e-6
enum { NB = 4, NSEQ = 6 };

static void test_split(struct ll_backend *cpu, struct ll_backend *forced, struct ll_backend *dflt, struct ll_backend *off) {
  static const struct {
    int H, Hkv, hd, f16, window;
  } cs[] = {{6, 2, 64, 1, 0}, {9, 3, 64, 0, 0}, {8, 8, 128, 0, 0}, {8, 2, 80, 1, 0}, {8, 2, 64, 0, 700}, {4, 1, 128, 1, 100}};
  // sequences: positions already stored (the decode row is at that position: n_kv = len + 1);
  // the last one takes a 5-token prompt chunk
  static const int len[NSEQ] = {0, 37, 300, 1000, 2899, 90}, ntok[NSEQ] = {1, 1, 1, 1, 1, 5};
  struct ll_backend *cl[3] = {forced, dflt, off};
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
    const int H = cs[ci].H, Hkv = cs[ci].Hkv, hd = cs[ci].hd, f16 = cs[ci].f16, block = 16, kvd = Hkv * hd;
    int nblk = 0, tmax = 0;
    for (int s = 0; s < NSEQ; s++) nblk += (len[s] + ntok[s] + block - 1) / block, tmax = len[s] > tmax ? len[s] : tmax;
    // block tables: the pool's blocks dealt out in a shuffled order
    int32_t *perm = malloc((size_t)nblk * 4), *tabs[NSEQ];
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) {
      const int j = (int)(ll_test_rand(&rs) % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    const size_t pool = (size_t)nblk * block * kvd * (f16 ? 2 : 4);
    void *kc[4], *vc[4]; // the CPU's pool, then each instance's (a pool pointer names its device buffer)
    for (int b = 0; b < 4; b++) kc[b] = calloc(1, pool), vc[b] = calloc(1, pool);
    struct ll_kv_view v[4][NSEQ];
    float *k = malloc(((size_t)tmax + 5) * kvd * 4), *vv = malloc(((size_t)tmax + 5) * kvd * 4);
    int32_t *pos = malloc(((size_t)tmax + 5) * 4);
    for (int s = 0, o = 0; s < NSEQ; s++) {
      tabs[s] = perm + o, o += (len[s] + ntok[s] + block - 1) / block;
      for (int b = 0; b < 4; b++) v[b][s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kc[b], vc[b], tabs[s], cs[ci].window};
      const int n = len[s] + ntok[s]; // the batch's rows' k, v stored too, as the engine does before attention
      randf(k, (size_t)n * kvd, 1.0f), randf(vv, (size_t)n * kvd, 1.0f);
      for (int t = 0; t < n; t++) pos[t] = t;
      CHECK(cpu->i->kv_store(cpu, &v[0][s], k, vv, pos, n) == 0);
      for (int b = 0; b < 3; b++) CHECK(cl[b]->i->kv_store(cl[b], &v[1 + b][s], k, vv, pos, n) == 0);
    }
    int t0[NSEQ], nt[NSEQ], T = 0;
    int32_t bpos[NSEQ + 4];
    for (int s = 0; s < NSEQ; s++) {
      t0[s] = T, nt[s] = ntok[s];
      for (int t = 0; t < ntok[s]; t++) bpos[T++] = len[s] + t;
    }
    const size_t qn = (size_t)T * H * hd;
    float *q = malloc(qn * 4), *ref = malloc(qn * 4), *o[3], *again = malloc(qn * 4), *alone = malloc(qn * 4);
    for (int b = 0; b < 3; b++) o[b] = malloc(qn * 4);
    randf(q, qn, 2.0f);
    const float scale = 1.0f / sqrtf((float)hd);
    CHECK(cpu->i->attention_multi(cpu, ref, q, v[0], bpos, t0, nt, NSEQ, H, scale) == 0);
    const char *name[3] = {"forced", "default", "off"};
    for (int b = 0; b < 3; b++) {
      struct ll_backend_info i0, i1;
      info(cl[b], &i0);
      CHECK(cl[b]->i->attention_multi(cl[b], o[b], q, v[1 + b], bpos, t0, nt, NSEQ, H, scale) == 0);
      info(cl[b], &i1);
      const double e = nmse(o[b], ref, qn);
      // which instance splits here: forced where a sequence whose rows are one block spans 64
      // positions or more, default from 256 (the sequences at 300 .. 2899, the window allowing), off never
      int want = 0;
      for (int s = 0; s < NSEQ && b < 2; s++) want |= nt[s] * (H / Hkv) <= 8 && span(bpos + t0[s], nt[s], cs[ci].window) >= (b ? 256 : 64);
      printf("split-K H=%d Hkv=%d hd=%d %s cache window %d, %s: nmse %.3g, %lld launch(es), %lld split\n", H, Hkv, hd, f16 ? "f16" : "f32",
             cs[ci].window, name[b], e, (long long)(i1.launches - i0.launches), (long long)(i1.split_launches - i0.split_launches));
      CHECKF(e < (f16 ? TOL_F16 : TOL_F32), "split-K case %zu (%s): nmse %.3g", ci, name[b], e);
      CHECKF(i1.launches - i0.launches == 1 && i1.fast_launches - i0.fast_launches == 1 && i1.split_launches - i0.split_launches == want,
             "split-K case %zu (%s): %lld launches, %lld fast, %lld split (want %d)", ci, name[b], (long long)(i1.launches - i0.launches),
             (long long)(i1.fast_launches - i0.fast_launches), (long long)(i1.split_launches - i0.split_launches), want);
    }
    // the forced instance's rows that did not split (the first sequence: 1 position; the prompt
    // chunk: 15 .. 20 rows) are attn_fast's; sequences alone as in the batch; a second call the same
    int same_short = 1;
    for (int s = 0; s < NSEQ; s++)
      if (nt[s] * (H / Hkv) > 8 || span(bpos + t0[s], nt[s], cs[ci].window) < 64)
        same_short &= memcmp(o[0] + (size_t)t0[s] * H * hd, o[2] + (size_t)t0[s] * H * hd, (size_t)nt[s] * H * hd * 4) == 0;
    CHECKF(same_short, "split-K case %zu: blocks that do not split differ from attn_fast's", ci);
    // ... and those that split do not (their sums were combined from chunks: another order)
    const size_t lng = (size_t)t0[4] * H * hd;
    CHECKF(memcmp(o[0] + lng, o[2] + lng, (size_t)H * hd * 4) != 0, "split-K case %zu: the 2900-position row is attn_fast's bits", ci);
    CHECK(forced->i->attention_multi(forced, again, q, v[1], bpos, t0, nt, NSEQ, H, scale) == 0);
    CHECKF(memcmp(again, o[0], qn * 4) == 0, "split-K case %zu: a second call differs (counters not reset?)", ci);
    for (int s = 0; s < NSEQ; s++) {
      const size_t at = (size_t)t0[s] * H * hd;
      CHECK(forced->i->attention(forced, alone, q + at, &v[1][s], bpos + t0[s], nt[s], H, scale) == 0);
      CHECKF(memcmp(alone, o[0] + at, (size_t)nt[s] * H * hd * 4) == 0, "split-K case %zu: sequence %d alone differs from the batch", ci, s);
    }
    for (int b = 0; b < 3; b++) free(o[b]);
    for (int b = 0; b < 4; b++) free(kc[b]), free(vc[b]);
    free(q), free(ref), free(again), free(alone), free(k), free(vv), free(pos), free(perm);
  }
}

int main(void) {
  rs = ll_test_seed();
  const char *dev = getenv("LL_TEST_OPENCL_DEVICE");
  if (!dev || !*dev) dev = "opencl:0:0";
  setenv("LL_OPENCL_REFERENCE", "0", 1);
  setenv("LL_OPENCL_SPLIT_KV", "32:8", 1);
  struct ll_backend_params p = {1, dev, NULL};
  struct ll_backend *cpu = NULL, *forced = NULL, *dflt = NULL, *off = NULL;
  char reason[256], err[512];
  CHECK(ll_backend_cpu_create(&cpu, 1, err, sizeof err) == 0);
  CHECKF(ll_backend_create(&forced, &p, reason, sizeof reason, err, sizeof err) == 0, "%s", err);
  if (!forced || strncmp(reason, "opencl:", 7) != 0) {
    CHECKF(0, "no OpenCL device (%s): setup.sh installs PoCL", reason);
    ll_backend_free(forced), ll_backend_free(cpu);
    return ll_test_summary();
  }
  unsetenv("LL_OPENCL_SPLIT_KV");
  CHECKF(ll_backend_opencl_create_beside(&dflt, forced, err, sizeof err) == 0, "%s", err);
  setenv("LL_OPENCL_SPLIT_KV", "0", 1);
  CHECKF(ll_backend_opencl_create_beside(&off, forced, err, sizeof err) == 0, "%s", err);
  unsetenv("LL_OPENCL_SPLIT_KV");
  struct ll_backend_info in;
  info(forced, &in);
  printf("%s, %s tier, %d compute units\n", in.device, in.tier, in.compute_units);
  CHECK(strcmp(in.tier, "fast") == 0);
  if (cpu && dflt && off) {
    cpu->ggml_math = forced->ggml_math = dflt->ggml_math = off->ggml_math = 1;
    test_split(cpu, forced, dflt, off);
  }
  ll_backend_free(off), ll_backend_free(dflt), ll_backend_free(forced), ll_backend_free(cpu);
  return ll_test_summary();
}
