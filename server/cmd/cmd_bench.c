// cmd_bench.c - `llsrv bench`: prompt processing (pp: a prompt of p tokens in one batch) and
// text generation (tg: n tokens one at a time) in tokens per second, with llama-bench's
// meaning, so the two tables can be read side by side.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_cmd.h"
#include "ll_engine.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// pp tokens of toks into sequence seq in batches of 512 (logits for the last when last).
static int prefill(struct ll_engine *e, int seq, int pp, int32_t *toks, float *logits, int last) {
  char err[256];
  for (int off = 0; off < pp; off += 512) {
    struct ll_batch_item it = {seq, pp - off < 512 ? pp - off : 512, toks + off, last && off + 512 >= pp, logits, NULL};
    if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) return fprintf(stderr, "llsrv bench: %s\n", err), -1;
  }
  return 0;
}

// One repetition: a fresh sequence (or seq >= 0, one prefilled to the depth), then pp or tg;
// returns seconds (negative on error).
static double run_once(struct ll_engine *e, int at, int pp, int tg, int32_t *toks, float *logits) {
  char err[256];
  const int seq = at >= 0 ? at : ll_engine_seq_new(e);
  if (seq < 0) return -1;
  double t0 = now_s();
  if (pp > 0) {
    if (prefill(e, seq, pp, toks, logits, 1)) return -1;
  } else {
    for (int i = 0; i < tg; i++) {
      struct ll_batch_item it = {seq, 1, toks + i, 1, logits, NULL};
      if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) return fprintf(stderr, "llsrv bench: %s\n", err), -1;
    }
  }
  double dt = now_s() - t0;
  if (at < 0) ll_engine_seq_free(e, seq);
  return dt;
}

// tg with np sequences decoding together: every step appends one token to each sequence in
// one ll_engine_decode (one pass over the weights), logits for all - what the server's
// continuous batching does. at: np sequences prefilled to the depth, or NULL (fresh ones).
// Returns seconds for tg steps (negative on error).
static double run_parallel(struct ll_engine *e, const int *at, int np, int tg, const int32_t *toks, float *logits, int V) {
  char err[256];
  int seqs[256];
  struct ll_batch_item it[256];
  for (int s = 0; s < np; s++)
    if ((seqs[s] = at ? at[s] : ll_engine_seq_new(e)) < 0) return -1;
  double t0 = now_s();
  for (int i = 0; i < tg; i++) {
    for (int s = 0; s < np; s++) it[s] = (struct ll_batch_item){seqs[s], 1, toks + (i + s) % tg, 1, logits + (size_t)s * V, NULL};
    if (ll_engine_decode(e, it, np, err, sizeof err) != 0) return fprintf(stderr, "llsrv bench: %s\n", err), -1;
  }
  double dt = now_s() - t0;
  for (int s = 0; s < np && !at; s++) ll_engine_seq_free(e, seqs[s]);
  return dt;
}

int ll_cmd_bench(int argc, char **argv) {
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  int pp = 128, tg = 64, reps = 3, json = 0, np = 1, depth = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
    if (ARG("--model") || ARG("-m")) ep.model_path = v;
    else if (ARG("-p")) pp = atoi(v);
    else if (ARG("-n")) tg = atoi(v);
    else if (ARG("-t")) ep.n_threads = atoi(v);
    else if (ARG("-r")) reps = atoi(v);
    else if (ARG("-d")) depth = atoi(v);
    else if (ARG("--parallel") || ARG("-np")) np = atoi(v);
    else if (ARG("--device")) ep.device = v;
    else if (strcmp(a, "--no-repack") == 0) ep.repack = 0;
    else if (ARG("-o")) json = strcmp(v, "json") == 0;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("usage: llsrv bench --model M [-p 128] [-n 64] [-d 0] [-t THREADS] [-r 3] [--parallel N] [-o md|json] [--device D] [--no-repack]\n"
             "pp: one batch of p prompt tokens; tg: n tokens generated one at a time. Mean +/- stddev\n"
             "over r repetitions after one warm-up, as llama-bench reports them.\n"
             "--parallel N adds tgNxP: N sequences generating together, one token each per step\n"
             "(continuous batching), aggregate tok/s.\n"
             "-d D: tg (and tgNxP) at a depth of D tokens (tgN @ dD): each sequence's first D tokens are\n"
             "processed once, untimed; the warm-up and the repetitions then decode one after another on it.\n"
             "--no-repack: no interleaved copy of the Q4_0, Q4_1, Q5_0 and Q8_0 matrices for decode (the config's repack: false).\n");
      return 0;
    } else {
      fprintf(stderr, "llsrv bench: unknown or incomplete option '%s'\n", a);
      return 2;
    }
#undef ARG
  }
  if (reps > 64) reps = 64;
  if (!ep.model_path || pp < 0 || tg < 0 || reps < 1 || pp > 8192 || tg > 8192 || np < 1 || np > 256 || depth < 0 || depth > 65536) {
    fprintf(stderr, "llsrv bench: --model is required; -p/-n in 0..8192, -d in 0..65536, -r >= 1\n");
    return 2;
  }
  const int deep = depth > 0 ? depth + tg * (reps + 1) : 0; // a depth's sequences grow by tg each run
  ep.n_ctx = (pp > tg ? pp : tg) + 16;
  if (deep + 16 > ep.n_ctx) ep.n_ctx = deep + 16;
  ep.n_parallel = np;
  char err[512], cache[1100];
  ep.cache_dir = ll_cmd_opencl_cache(NULL, ep.device, cache, sizeof cache);
  struct ll_engine *e;
  if (ll_engine_open(&e, &ep, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv bench: %s\n", err);
    return 1;
  }
  struct ll_engine_info info;
  ll_engine_get_info(e, &info);
  fprintf(stderr, "llsrv bench: device %s\n", info.device_reason);
  const int V = ll_engine_n_vocab(e), nt = (pp > tg ? pp : tg) + depth + 1;
  int32_t *toks = malloc((size_t)nt * sizeof *toks);
  float *logits = malloc((size_t)V * (size_t)np * sizeof *logits);
  uint64_t x = 42;
  for (int i = 0; i < nt && toks; i++) toks[i] = (int32_t)((x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % V;
  if (!json) {
    printf("| model | size | params | backend | threads | test | t/s |\n");
    printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  }
  int rc = 0;
  for (int which = 0; which < 3 && toks && logits; which++) {
    const int n = which == 0 ? pp : which == 1 ? tg : tg * np;
    if (n == 0 || (which == 2 && np < 2)) continue;
    double ts[64], sum = 0, sq = 0;
    char test[48];
    if (which == 2) snprintf(test, sizeof test, "tg%dx%d", tg, np);
    else snprintf(test, sizeof test, "%s%d", which ? "tg" : "pp", n);
    int at[256], nat = 0; // -d: the sequences prefilled to the depth
    if (depth > 0 && which > 0) {
      snprintf(test + strlen(test), sizeof test - strlen(test), " @ d%d", depth);
      for (int s = 0; s < (which == 2 ? np : 1) && !rc; s++) {
        if ((at[s] = ll_engine_seq_new(e)) < 0) rc = 1;
        else nat = s + 1, rc = prefill(e, at[s], depth, toks + tg, logits, 0) != 0;
      }
      if (rc) {
        fprintf(stderr, "llsrv bench: prefilling %d sequence(s) to depth %d failed\n", which == 2 ? np : 1, depth);
        for (int s = 0; s < nat; s++) ll_engine_seq_free(e, at[s]);
        break;
      }
    }
#define RUN() (which == 2 ? run_parallel(e, nat ? at : NULL, np, tg, toks, logits, V) : run_once(e, nat ? at[0] : -1, which == 0 ? pp : 0, which == 0 ? 0 : tg, toks, logits))
    RUN(); // warm-up
    for (int r = 0; r < reps; r++) {
      double dt = RUN();
      if (dt <= 0) {
        rc = 1;
        break;
      }
      ts[r] = n / dt;
      sum += ts[r];
    }
    for (int s = 0; s < nat; s++) ll_engine_seq_free(e, at[s]);
    if (rc) break;
    const double mean = sum / reps;
    for (int r = 0; r < reps; r++) sq += (ts[r] - mean) * (ts[r] - mean);
    const double sd = reps > 1 ? sqrt(sq / (reps - 1)) : 0;
    if (json)
      printf("{\"model\":\"%s\",\"quant\":\"%s\",\"size\":%lld,\"params\":%lld,\"backend\":\"%s\",\"threads\":%d,\"test\":\"%s\",\"avg_ts\":%.3f,\"stddev_ts\":%.3f}\n",
             info.name, info.quant, (long long)info.weight_bytes, (long long)info.n_params, info.backend, info.n_threads, test, mean, sd);
    else
      printf("| %s %s | %.2f MiB | %.2f M | %s | %d | %s | %.2f ± %.2f |\n", info.name, info.quant, info.weight_bytes / 1048576.0,
             info.n_params / 1e6, info.backend, info.n_threads, test, mean, sd);
    fflush(stdout);
  }
  free(toks);
  free(logits);
  ll_engine_close(e);
  return rc;
}
