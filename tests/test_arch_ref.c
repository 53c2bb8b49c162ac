// test_arch_ref.c - the engine against llama.cpp's greedy ids on a model of one of the families
// of ll_arch.h (tests/ref/README.md says how the references were made).
//
// usage: test_arch_ref MODEL REF.tsv [--prompts PROMPTS.txt] [--min-tf FRACTION] [--exact]
//                      [--device D] [--threads N] [--adapter LORA.gguf] [--ctx N]
// REF.tsv rows: index \t prompt ids \t greedy ids (llama.cpp, one thread, CPU).
//  - with --prompts, the prompt line's text (\n escapes) tokenizes to the reference's prompt ids;
//  - teacher forcing: prompt + the reference's greedy ids decoded in one pass, every row's
//    argmax compared with the id llama.cpp chose next (agreement >= --min-tf, default 0.99);
//  - free-running greedy from the prompt: with --exact every id equals llama.cpp's; else the
//    length of the common prefix is printed (a near tie can send two correct engines apart);
//  - with --adapter, every sequence computes with that LoRA adapter (llama.cpp's --lora, scale 1);
//  - --ctx: the context per sequence (default 512, the reference's n_ctx; Phi-3's LongRoPE picks
//    its factors by it).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_engine.h"
#include "ll_error.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_tokenizer.h"
#include "testutil.h"

enum { MAXT = 1024 };

static int parse_ids(char *s, int32_t *ids, int cap) {
  int n = 0;
  for (char *tok = strtok(s, " "); tok && n < cap; tok = strtok(NULL, " ")) ids[n++] = (int32_t)atoi(tok);
  return n;
}

static void unescape(char *s) {
  char *o = s;
  for (char *p = s; *p; p++) {
    if (p[0] == '\\' && p[1] == 'n') *o++ = '\n', p++;
    else *o++ = *p;
  }
  *o = 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_arch_ref MODEL REF.tsv [--prompts F] [--min-tf X] [--exact] [--device D] [--threads N] [--adapter F] [--ctx N]\n");
    return 2;
  }
  const char *prompts_path = NULL, *device = "cpu", *adapter = NULL;
  double min_tf = 0.99;
  int exact = 0, threads = 1, n_ctx = 512;
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--prompts") == 0 && i + 1 < argc) prompts_path = argv[++i];
    else if (strcmp(argv[i], "--min-tf") == 0 && i + 1 < argc) min_tf = atof(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--adapter") == 0 && i + 1 < argc) adapter = argv[++i];
    else if (strcmp(argv[i], "--ctx") == 0 && i + 1 < argc) n_ctx = atoi(argv[++i]);
    else if (strcmp(argv[i], "--exact") == 0) exact = 1;
  }
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = argv[1];
  ep.n_threads = threads;
  ep.n_ctx = n_ctx;
  ep.device = device;
  char err[1024];
  struct ll_engine *e;
  if (ll_engine_open(&e, &ep, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    CHECK(!"engine opens");
    return ll_test_summary();
  }
  const int V = ll_engine_n_vocab(e);
  struct ll_lora *lora = NULL;
  if (adapter) {
    struct ll_lora_dims d;
    ll_engine_lora_dims(e, &d);
    const int rc = ll_lora_load(&lora, adapter, &d, ll_engine_backend(e), err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    CHECK(rc == 0);
  }
  FILE *rf = fopen(argv[2], "r"), *pf = prompts_path ? fopen(prompts_path, "r") : NULL;
  CHECK(rf && (!prompts_path || pf));
  static char line[1 << 16], pline[1 << 14];
  static int32_t prompt[MAXT], gen[MAXT], all[2 * MAXT], ours[MAXT];
  float *logits = malloc(sizeof(float) * (size_t)V * 2 * MAXT);
  int64_t tf_ok = 0, tf_n = 0;
  while (rf && logits && fgets(line, sizeof line, rf)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, '\t'), *c2 = c1 ? strchr(c1 + 1, '\t') : NULL;
    if (!c2) continue;
    *c1 = *c2 = 0;
    const int idx = atoi(line), np = parse_ids(c1 + 1, prompt, MAXT), ng = parse_ids(c2 + 1, gen, MAXT);
    if (pf && fgets(pline, sizeof pline, pf)) {
      pline[strcspn(pline, "\n")] = 0;
      unescape(pline);
      const struct ll_tokenizer *tok = ll_engine_tokenizer(e);
      int32_t mine[MAXT];
      const int n = tok ? ll_tokenize(tok, pline, strlen(pline), ll_tokenizer_add_bos(tok), 1, mine, MAXT) : -1;
      CHECKF(n == np && memcmp(mine, prompt, sizeof(int32_t) * (size_t)np) == 0, "prompt %d: our %d ids differ from llama.cpp's %d", idx, n, np);
    }
    // teacher forcing: one pass over prompt + gen[0..ng-2], logits of every row
    memcpy(all, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(all + np, gen, sizeof(int32_t) * (size_t)(ng - 1));
    int s = ll_engine_seq_new(e);
    if (lora) CHECK(ll_engine_seq_set_adapter(e, s, lora, err, sizeof err) == 0);
    struct ll_batch_item it = {s, np + ng - 1, all, 2, logits, NULL};
    CHECK(ll_engine_decode(e, &it, 1, err, sizeof err) == 0);
    int agree = 0;
    for (int k = 0; k < ng; k++) {
      const float *row = logits + (size_t)(np - 1 + k) * V;
      int best = 0;
      for (int v = 1; v < V; v++)
        if (row[v] > row[best]) best = v;
      agree += best == gen[k];
    }
    ll_engine_seq_free(e, s);
    tf_ok += agree, tf_n += ng;
    // free-running greedy, one token at a time after the prompt
    s = ll_engine_seq_new(e);
    if (lora) CHECK(ll_engine_seq_set_adapter(e, s, lora, err, sizeof err) == 0);
    struct ll_batch_item p = {s, np, prompt, 1, NULL, &ours[0]};
    int same = 0, rc = ll_engine_decode(e, &p, 1, err, sizeof err);
    for (int k = 1; rc == 0 && k < ng; k++) {
      struct ll_batch_item d = {s, 1, &ours[k - 1], 1, NULL, &ours[k]};
      rc = ll_engine_decode(e, &d, 1, err, sizeof err);
    }
    CHECK(rc == 0);
    while (same < ng && ours[same] == gen[same]) same++;
    ll_engine_seq_free(e, s);
    printf("prompt %d: teacher-forced top-1 %d/%d, greedy %d/%d identical to llama.cpp\n", idx, agree, ng, same, ng);
    if (exact) CHECKF(same == ng, "prompt %d: greedy ids differ from llama.cpp's at %d", idx, same);
  }
  const double frac = tf_n ? (double)tf_ok / (double)tf_n : 0;
  printf("teacher-forced top-1 agreement: %lld/%lld = %.4f (need >= %.4f)\n", (long long)tf_ok, (long long)tf_n, frac, min_tf);
  CHECK(tf_n > 0 && frac >= min_tf);
  if (rf) fclose(rf);
  if (pf) fclose(pf);
  free(logits);
  ll_lora_free(lora); // before the engine: its memory is the engine's backend's
  ll_engine_close(e);
  return ll_test_summary();
}
