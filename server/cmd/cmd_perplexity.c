// cmd_perplexity.c - `llsrv perplexity`, computed as llama-perplexity does: the file is
// tokenized once (with BOS), cut into chunks of ctx tokens whose first token is replaced by BOS,
// and only the second half of each chunk is scored (each scored token then has at least ctx/2
// tokens of context).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_cmd.h"
#include "ll_engine.h"
#include "ll_tokenizer.h"

int ll_cmd_perplexity(int argc, char **argv) {
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  const char *file = NULL;
  int ctx = 512, batch = 512;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
    if (ARG("--model") || ARG("-m")) ep.model_path = v;
    else if (ARG("-f")) file = v;
    else if (ARG("--ctx") || ARG("-c")) ctx = atoi(v);
    else if (ARG("-b")) batch = atoi(v);
    else if (ARG("-t")) ep.n_threads = atoi(v);
    else if (ARG("--device")) ep.device = v;
    else if (strcmp(a, "--kv-f32") == 0) ep.kv_f16 = 0;
    else if (strcmp(a, "--kv-f16") == 0) ep.kv_f16 = 1;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("usage: llsrv perplexity --model M -f FILE [--ctx 512] [-b 512] [-t THREADS] [--kv-f32|--kv-f16]\n");
      return 0;
    } else {
      fprintf(stderr, "llsrv perplexity: unknown or incomplete option '%s'\n", a);
      return 2;
    }
#undef ARG
  }
  if (!ep.model_path || !file || ctx < 8 || ctx > 8192 || batch < 1) {
    fprintf(stderr, "llsrv perplexity: --model and -f are required; --ctx in 8..8192\n");
    return 2;
  }
  if (batch > 512) batch = 512;
  FILE *f = fopen(file, "rb");
  if (!f) return fprintf(stderr, "llsrv perplexity: cannot open %s\n", file), 1;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (len < 0 || len > (256l << 20)) return fclose(f), fprintf(stderr, "llsrv perplexity: %s is empty or larger than 256 MiB\n", file), 1;
  char *text = malloc((size_t)len + 1);
  size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
  fclose(f);
  ep.n_ctx = ctx;
  char err[512];
  struct ll_engine *e;
  if (!text || ll_engine_open(&e, &ep, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv perplexity: %s\n", text ? err : "out of memory");
    free(text);
    return 1;
  }
  const struct ll_tokenizer *tok = ll_engine_tokenizer(e);
  int rc = 1;
  int32_t *ids = NULL;
  float *logits = NULL;
  if (!tok) {
    fprintf(stderr, "llsrv perplexity: the model has no tokenizer\n");
    goto out;
  }
  int n = ll_tokenize(tok, text, got, ll_tokenizer_add_bos(tok), 0, NULL, 0);
  ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
  if (!ids || ll_tokenize(tok, text, got, ll_tokenizer_add_bos(tok), 0, ids, n) != n) goto out;
  const int n_chunk = n / ctx, V = ll_engine_n_vocab(e), first = ctx / 2;
  if (n_chunk == 0) {
    fprintf(stderr, "llsrv perplexity: %d tokens; need at least %d (2 x ctx / 2)\n", n, ctx);
    goto out;
  }
  logits = malloc((size_t)batch * V * sizeof *logits);
  if (!logits) goto out;
  fprintf(stderr, "perplexity: tokenized %d tokens, %d chunks of %d\n", n, n_chunk, ctx);
  double nll = 0, nll2 = 0;
  long count = 0;
  const int32_t bos = ll_tokenizer_bos(tok);
  for (int c = 0; c < n_chunk; c++) {
    int32_t *chunk = ids + (size_t)c * ctx;
    const int32_t saved = chunk[0];
    if (bos >= 0 && ll_tokenizer_add_bos(tok)) chunk[0] = bos;
    int seq = ll_engine_seq_new(e);
    for (int off = 0; off < ctx; off += batch) {
      const int nb = ctx - off < batch ? ctx - off : batch;
      struct ll_batch_item it = {seq, nb, chunk + off, 2, logits, NULL};
      if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) {
        fprintf(stderr, "llsrv perplexity: %s\n", err);
        goto out;
      }
      for (int j = 0; j < nb; j++) {
        const int p = off + j; // logits at p predict token p + 1
        if (p < first || p + 1 >= ctx) continue;
        const float *lg = logits + (size_t)j * V;
        float mx = lg[0];
        for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
        double z = 0;
        for (int v = 0; v < V; v++) z += exp((double)lg[v] - mx);
        const double lp = (double)lg[chunk[p + 1]] - mx - log(z);
        nll -= lp;
        nll2 += lp * lp;
        count++;
      }
    }
    chunk[0] = saved;
    ll_engine_seq_free(e, seq);
    printf("[%d]%.4f,", c + 1, exp(nll / count));
    fflush(stdout);
  }
  const double mean = nll / count, var = nll2 / count - mean * mean;
  const double ppl = exp(mean), err_ppl = var > 0 && count > 1 ? ppl * sqrt(var / (count - 1)) : 0;
  printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, err_ppl);
  rc = 0;
out:
  free(ids);
  free(logits);
  free(text);
  ll_engine_close(e);
  return rc;
}
