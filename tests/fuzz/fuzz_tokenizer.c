// fuzz_tokenizer.c - encode arbitrary bytes with an SPM and a BPE vocabulary built in memory
// (the BPE one under several pre-tokenizers, picked by the first input byte: digit grouping,
// empty regex matches, Gemma 4's raw UTF-8 mode, ...), then decode (whole and streamed): never
// crash, decode sizes consistent.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_modelfile.h"
#include "ll_tokenizer.h"

static const char *const pres[] = {"llama-bpe", "afmoe", "superbpe", "kimi-k2", "deepseek-llm", "tiny_aya", "gemma4", "chameleon"};
#define N_PRE (sizeof pres / sizeof pres[0])
static struct ll_tokenizer *spm, *bpe[N_PRE];
static int built;

static struct ll_tokenizer *build(int is_bpe, const char *pre) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  static char bytes[256][8];
  const char *toks[300];
  float scores[300];
  int32_t types[300];
  int n = 0;
  if (!is_bpe) {
    toks[n] = "<unk>", types[n] = 2, scores[n++] = 0;
    toks[n] = "<s>", types[n] = 3, scores[n++] = 0;
    toks[n] = "</s>", types[n] = 3, scores[n++] = 0;
    for (int b = 0; b < 256; b++) snprintf(bytes[b], 8, "<0x%02X>", b), toks[n] = bytes[b], types[n] = 6, scores[n++] = 0;
    const char *w[] = {"\xe2\x96\x81", "\xe2\x96\x81t", "he", "\xe2\x96\x81the", "a", "b", "ab"};
    for (int i = 0; i < 7; i++) toks[n] = w[i], types[n] = 1, scores[n++] = -(float)i;
    ll_mf_set_str(&mf, "tokenizer.ggml.model", "llama");
  } else {
    // Byte-level: the 256 mapped byte characters, plus merges.
    for (int b = 0, k = 0; b < 256; b++) {
      int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k++;
      char *o = bytes[b];
      if (cp < 0x80) o[0] = (char)cp, o[1] = 0;
      else o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
      toks[n] = o, types[n] = 1, scores[n++] = 0;
    }
    toks[n] = "th", types[n] = 1, scores[n++] = 0;
    toks[n] = "the", types[n] = 1, scores[n++] = 0;
    toks[n] = "<|special|>", types[n] = 3, scores[n++] = 0;
    const char *merges[] = {"t h", "th e"};
    ll_mf_set_arr(&mf, "tokenizer.ggml.merges", LL_KV_STR, merges, 2);
    ll_mf_set_str(&mf, "tokenizer.ggml.model", strcmp(pre, "gemma4") == 0 ? "gemma4" : "gpt2");
    ll_mf_set_str(&mf, "tokenizer.ggml.pre", pre);
  }
  ll_mf_set_arr(&mf, "tokenizer.ggml.tokens", LL_KV_STR, toks, (uint64_t)n);
  ll_mf_set_arr(&mf, "tokenizer.ggml.scores", LL_KV_F32, scores, (uint64_t)n);
  ll_mf_set_arr(&mf, "tokenizer.ggml.token_type", LL_KV_I32, types, (uint64_t)n);
  struct ll_tokenizer *t = NULL;
  char err[256];
  if (ll_tokenizer_from_mf(&mf, &t, err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_tokenizer: %s\n", err);
    t = NULL;
  }
  ll_modelfile_free(&mf);
  return t;
}

static void run(struct ll_tokenizer *t, const uint8_t *data, size_t size) {
  if (!t) return;
  int n = ll_tokenize(t, (const char *)data, size, 1, size & 1, NULL, 0);
  if (n < 0) return;
  int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
  if (!ids) return;
  if (ll_tokenize(t, (const char *)data, size, 1, size & 1, ids, n) != n) __builtin_trap();
  int need = ll_detokenize(t, ids, n, NULL, 0, 1);
  if (need >= 0) {
    char *buf = malloc((size_t)need + 1);
    if (buf && ll_detokenize(t, ids, n, buf, (size_t)need, 1) != need) __builtin_trap();
    free(buf);
  }
  struct ll_detok_stream s;
  ll_detok_stream_init(&s);
  char piece[8192];
  for (int i = 0; i < n; i++)
    if (ll_detok_stream_push(t, &s, ids[i], piece, sizeof piece) < 0) __builtin_trap();
  ll_detok_stream_finish(&s, piece, sizeof piece);
  free(ids);
}

// ll_tokenize_marked: one mark over the whole text is parse_special=1, no mark is
// parse_special=0; marks drawn from the bytes (the chat case) never crash.
static int same(struct ll_tokenizer *t, const char *text, size_t size, const struct ll_tok_span *mk, int nm, int special) {
  int nb = ll_tokenize(t, text, size, 1, special, NULL, 0);
  if (nb < 0) return 1;
  int32_t *a = malloc(((size_t)nb + 1) * sizeof *a), *b = malloc(((size_t)nb + 1) * sizeof *b);
  int ok = !a || !b ||
           (ll_tokenize_marked(t, text, size, 1, mk, nm, a, nb) == nb && ll_tokenize(t, text, size, 1, special, b, nb) == nb &&
            !memcmp(a, b, (size_t)nb * sizeof *a));
  free(a), free(b);
  return ok;
}

static void run_marked(struct ll_tokenizer *t, const uint8_t *data, size_t size) {
  if (!t) return;
  const char *text = (const char *)data;
  const struct ll_tok_span all = {0, size};
  if (!same(t, text, size, &all, 1, 1) || !same(t, text, size, NULL, 0, 0)) __builtin_trap();
  struct ll_tok_span mk[64];
  int nm = 0;
  for (size_t at = 0; nm < 64 && at < size; nm++) { // lengths from the bytes: gaps and marks alternate
    size_t gap = data[at] % 8, len = 1 + data[(at + 1) % size] % 16;
    if (at + gap >= size) break;
    mk[nm].start = at + gap;
    mk[nm].end = at + gap + len < size ? at + gap + len : size;
    at = mk[nm].end + 1;
  }
  if (ll_tokenize_marked(t, text, size, 0, mk, nm, NULL, 0) < 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!built) {
    spm = build(0, NULL);
    for (size_t i = 0; i < N_PRE; i++) bpe[i] = build(1, pres[i]);
    built = 1;
  }
  if (size > 4096) size = 4096;
  run(spm, data, size);
  run(bpe[size ? data[0] % N_PRE : 0], data, size);
  run_marked(spm, data, size);
  run_marked(bpe[size ? data[0] % N_PRE : 0], data, size);
  return 0;
}
