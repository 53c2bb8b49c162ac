// test_opencl_fast.c - the OpenCL fast tier end to end on SmolLM2-135M Q4_1 against the CPU
// backend (the device named by $LL_TEST_OPENCL_DEVICE, default opencl:0:0: PoCL in CI; a GPU
// when one is at hand), with LL_OPENCL_REFERENCE=0 so the fast tier runs whatever the default.
//
// Teacher-forced over a fixed English text: a prompt of P tokens in one batch (the products at
// T > 1), then D tokens one decode step at a time (the fused decode path), logits for every
// position on both backends. Exactness is not asserted (that is the reference tier's on PoCL,
// tests/scripts/test_opencl_generate.sh).
//
// How close is close: no closer than two CPU implementations of the same model are to each
// other. Any order of the sums other than the CPU backend's moves SmolLM2's logits by ~0.15 rms
// (its activations have outlier channels, so a Q8 activation block's step is large and a
// last-bit difference upstream moves some activations a whole step), and the top two of ~9% of
// rows lie within 0.1 of each other. Measured (docs/PERFORMANCE.md): llama.cpp 0c1e5709's CPU
// backend against llsrv's agrees in 95.1% of this text's rows (perplexity +0.80%), 95.0% of a
// 1219-token text and 96.9% of tests/ref/ppl.txt (1841 rows); llama.cpp with flash attention
// against itself without, 95.0 .. 96.8%; llsrv's CPU with a 1172-token prompt in a batch
// against the same tokens one at a time, 95.7%. Issue 29's targets (0.1%, 99%) are below that
// floor. The control here is llama.cpp's CPU (tests/ref/smollm2_lighthouse_llamacpp.tsv, its
// argmax and -log p per row) against llsrv's CPU backend; asserted: the fast tier's perplexity
// no farther from the CPU's than max(0.1%, 1.5 x the control's), its disagreeing rows at most
// max(1%, the control's + 3 standard deviations of a count that size (Poisson)). Also asserted:
// the device's argmax is its logits' argmax at every decode step; a decode step queues at most
// 6 kernels per layer (plus the embedding, the output product and the argmax) and, with greedy
// sampling on the device and no logits asked for, reads back at most 64 bytes. Slow on two
// cores (~3.5 min at load 10).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_engine.h"
#include "ll_model.h"
#include "ll_tokenizer.h"
#include "testutil.h"

static const char text[] =
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. He carried a lamp, a notebook and a small tin of oil, "
    "and he counted the steps as his father had taught him: one hundred and twelve, never more, never fewer. From the gallery at "
    "the top he could see the whole bay, the fishing boats coming home, the gulls circling the harbour wall, and on clear days the "
    "faint blue line of the mountains far to the north. He wrote down the weather, the ships that passed and the time the light "
    "was lit. In winter the storms came quickly, and the waves broke over the rocks below with a sound like distant thunder. On "
    "those nights he did not sleep at all; he sat by the lamp, listening to the wind, and waited for the morning. The village "
    "children thought he was the loneliest man in the world, but he did not feel lonely. He had the sea, the sky, his books and "
    "the letters his sister sent him every month from the city, full of news about her garden, her neighbours and the price of bread.";

enum { P = 96, D = 48 };

static double nll_of(const float *l, int V, int target) {
  float mx = -INFINITY;
  for (int v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
  double z = 0;
  for (int v = 0; v < V; v++) z += exp((double)l[v] - mx);
  return -((double)l[target] - mx - log(z));
}

static int argmax_of(const float *l, int V) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (l[v] > l[best]) best = v;
  return best;
}

// Runs the text through an engine on device: logits (P + D - 1 rows used: row i predicts token
// i + 1), dev_ids[i] the engine's argmax for the decode rows (-1 for the prompt rows).
static int run(const char *model, const char *device, const int32_t *ids, float *logits, int32_t *dev_ids, int V, double *launches_per_step,
               double *down_per_step, int *n_layer) {
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = model, ep.device = device, ep.n_ctx = 512, ep.n_parallel = 1, ep.n_threads = 2;
  struct ll_engine *e = NULL;
  char err[512];
  if (ll_engine_open(&e, &ep, err, sizeof err) != 0) {
    fprintf(stderr, "open %s: %s\n", device, err);
    return -1;
  }
  struct ll_engine_info info;
  ll_engine_get_info(e, &info);
  printf("%s: %s\n", device, info.device_reason);
  if (strcmp(device, "cpu") != 0 && strcmp(info.backend, "opencl") != 0) { // a silent CPU fallback would compare the CPU with itself
    ll_engine_close(e);
    return -1;
  }
  const int seq = ll_engine_seq_new(e);
  int rc = 0;
  struct ll_batch_item it = {seq, P, ids, 2, logits, NULL};
  if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) rc = -1;
  for (int i = 0; i < P - 1; i++) dev_ids[i] = -1;
  for (int i = P; rc == 0 && i < P + D - 1; i++) { // row i - 1 came with the previous call; this one gives row i
    struct ll_batch_item d = {seq, 1, ids + i, 1, logits + (size_t)i * V, dev_ids + i};
    if (ll_engine_decode(e, &d, 1, err, sizeof err) != 0) rc = -1;
  }
  dev_ids[P - 1] = argmax_of(logits + (size_t)(P - 1) * V, V);
  // Greedy steps with no logits asked for: what a step costs in launches and bytes back.
  struct ll_backend *be = ll_engine_backend(e);
  struct ll_backend_info a, b;
  be->i->get_info(be, &a);
  int32_t next = ids[P + D - 1];
  const int steps = 4;
  for (int i = 0; rc == 0 && i < steps; i++) {
    struct ll_batch_item d = {seq, 1, &next, 1, NULL, &next};
    if (ll_engine_decode(e, &d, 1, err, sizeof err) != 0) rc = -1;
  }
  be->i->get_info(be, &b);
  *launches_per_step = (double)(b.launches - a.launches) / steps;
  *down_per_step = (double)(b.bytes_down - a.bytes_down) / steps;
  *n_layer = info.n_layer;
  printf("%s: %.1f launches per decode step (%.2f per layer), %.0f bytes down, %s tier\n", device, *launches_per_step,
         *launches_per_step / info.n_layer, *down_per_step, b.tier[0] ? b.tier : "-");
  if (rc) fprintf(stderr, "%s: %s\n", device, err);
  ll_engine_close(e);
  return rc;
}

int main(void) {
  char path[4096];
  if (!ll_test_smollm2_path(path, sizeof path)) {
    CHECKF(0, "SmolLM2 is not in the cache (tests/fetch-smollm2.sh)");
    return ll_test_summary();
  }
  const char *dev = getenv("LL_TEST_OPENCL_DEVICE");
  if (!dev || !*dev) dev = "opencl:0:0";
  setenv("LL_OPENCL_REFERENCE", "0", 1);
  // Tokens of the text (the CPU engine's tokenizer).
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = path, ep.device = "cpu", ep.n_ctx = 512, ep.n_threads = 2;
  struct ll_engine *e = NULL;
  char err[512];
  CHECK(ll_engine_open(&e, &ep, err, sizeof err) == 0);
  if (!e) return ll_test_summary();
  const int V = ll_engine_n_vocab(e);
  int32_t ids[512];
  const int n = ll_tokenize(ll_engine_tokenizer(e), text, strlen(text), 1, 1, ids, 512);
  ll_engine_close(e);
  printf("text: %d tokens, %d teacher-forced (%d in one batch, %d decode steps)\n", n, P + D - 1, P, D - 1);
  CHECK(n >= P + D);
  if (n < P + D) return ll_test_summary();
  float *lc = malloc((size_t)(P + D) * V * sizeof(float)), *lf = malloc((size_t)(P + D) * V * sizeof(float));
  int32_t ic[P + D], idf[P + D];
  double lps_c = 0, down_c = 0, lps_f = 1e9, down_f = 1e9;
  int L = 1;
  CHECK(lc && lf);
  CHECK(run(path, "cpu", ids, lc, ic, V, &lps_c, &down_c, &L) == 0);
  CHECK(run(path, dev, ids, lf, idf, V, &lps_f, &down_f, &L) == 0);
  // the control: llama.cpp's CPU backend, per row its argmax and -log p of the next token
  char ref[4096];
  snprintf(ref, sizeof ref, "%s/tests/ref/smollm2_lighthouse_llamacpp.tsv", getenv("LL_SOURCE_DIR") ? getenv("LL_SOURCE_DIR") : ".");
  size_t rlen = 0;
  char *rt = (char *)ll_test_read_file(ref, &rlen);
  CHECKF(rt != NULL, "%s unreadable", ref);
  int32_t amx[P + D];
  double nlx[P + D];
  int nref = 0;
  for (char *line = rt ? strtok(rt, "\n") : NULL; line && nref < P + D - 1; line = strtok(NULL, "\n")) {
    int row, next, am;
    double nl;
    if (line[0] == '#') continue;
    if (sscanf(line, "%d %d %d %lf", &row, &next, &am, &nl) != 4 || row != nref) break;
    CHECKF(next == ids[row + 1], "row %d: llama.cpp's text has %d next, this tokenizer %d", row, next, ids[row + 1]);
    amx[nref] = am, nlx[nref] = nl, nref++;
  }
  free(rt);
  const int rows = P + D - 1;
  CHECKF(nref == rows, "%s: %d rows of %d", ref, nref, rows);
  double nll_c = 0, nll_f = 0, nll_x = 0;
  int agree = 0, agree_x = 0, agree_dev = 0;
  for (int i = 0; i < rows && nref == rows; i++) {
    const float *a = lc + (size_t)i * V, *b = lf + (size_t)i * V;
    nll_c += nll_of(a, V, ids[i + 1]), nll_f += nll_of(b, V, ids[i + 1]), nll_x += nlx[i];
    const int top = argmax_of(a, V);
    agree += top == argmax_of(b, V);
    agree_x += top == amx[i];
    if (i >= P) agree_dev += idf[i] == argmax_of(b, V); // the device's argmax is its logits' argmax
  }
  const double ppl_c = exp(nll_c / rows), ppl_f = exp(nll_f / rows), ppl_x = exp(nll_x / rows);
  const double rel = fabs(ppl_f / ppl_c - 1), rel_x = fabs(ppl_x / ppl_c - 1);
  printf("perplexity: cpu %.4f, opencl fast tier %.4f (%.4f%%), control (llama.cpp's cpu) %.4f (%.4f%%)\n", ppl_c, ppl_f, 100 * rel, ppl_x,
         100 * rel_x);
  printf("top-1 agreement with the cpu: fast tier %d / %d (%.2f%%), control %d / %d (%.2f%%); the device's argmax in decode steps: %d / %d\n",
         agree, rows, 100.0 * agree / rows, agree_x, rows, 100.0 * agree_x / rows, agree_dev, D - 1);
  const double dis_x = rows - agree_x, rel_lim = fmax(1e-3, 1.5 * rel_x), dis_lim = fmax(0.01 * rows, dis_x + 3 * sqrt(dis_x));
  CHECKF(rel <= rel_lim, "perplexity differs by %.4f%% (limit %.4f%%)", 100 * rel, 100 * rel_lim);
  CHECKF(rows - agree <= dis_lim, "top-1 disagreements %d of %d (limit %.1f)", rows - agree, rows, dis_lim);
  CHECKF(agree_dev == D - 1, "the device's argmax is its logits' argmax in %d of %d steps", agree_dev, D - 1);
  // 6 per layer, and per step the embedding, the output product and the argmax
  CHECKF(lps_f <= 6.0 * L + 3, "%.1f launches per decode step (at most 6 per layer + 3: %d)", lps_f, 6 * L + 3);
  CHECKF(down_f <= 64, "%.0f bytes down per decode step (at most 64)", down_f);
  free(lc), free(lf);
  return ll_test_summary();
}
