// test_tokenizer.c - tokenizers against llama.cpp's conformance vectors (../shared), decode
// round trips, UTF-8-safe streaming, special tokens, and the real SmolLM2 vocabulary.
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_modelfile.h"
#include "ll_tokenizer.h"
#include "testutil.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

// Every case of one vocabulary: ids equal the .out line exactly (no BOS, no special parsing,
// as llama.cpp's test-tokenizer-0); for BPE also detokenize(tokenize(text)) == text.
// vectors: path of the .inp/.out pair without the suffix (NULL: beside the .gguf). Returns the
// number of cases read.
static int check_vocab(const char *gguf, const char *vectors) {
  char err[512], path[8300];
  if (!vectors) vectors = gguf;
  struct ll_modelfile mf;
  struct ll_tokenizer *t = NULL;
  int rc = ll_gguf_open(gguf, &mf, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  if (rc) return 0;
  rc = ll_tokenizer_from_mf(&mf, &t, err, sizeof err);
  CHECKF(rc == 0, "%s: %s", gguf, err);
  if (rc) {
    ll_modelfile_free(&mf);
    return 0;
  }
  const char *model = "";
  ll_mf_get_str(&mf, "tokenizer.ggml.model", &model);
  int is_bpe = strcmp(model, "gpt2") == 0 || strcmp(model, "gemma4") == 0;
  size_t ni, no;
  snprintf(path, sizeof path, "%s.inp", vectors);
  char *inp = (char *)ll_test_read_file(path, &ni);
  snprintf(path, sizeof path, "%s.out", vectors);
  char *out = (char *)ll_test_read_file(path, &no);
  CHECKF(inp && out, "%s: .inp/.out missing", vectors);
  int cases = 0, ok = 0;
  char *p = inp, *o = out;
  // As llama.cpp's reader: texts are separated by SEP; the file may or may not end with one.
  while (inp && out && p < inp + ni) {
    char *e = strstr(p, SEP), *ol = strchr(o, '\n');
    if (!e) e = inp + ni;
    if (!ol) break;
    *ol = 0;
    // Older .out files start each line with a space, newer ones do not: compare the ids only.
    while (*o == ' ') o++;
    for (char *q = ol; q > o && (q[-1] == ' ' || q[-1] == '\r'); q--) q[-1] = 0;
    size_t len = (size_t)(e - p);
    int n = ll_tokenize(t, p, len, 0, 0, NULL, 0);
    int32_t *ids = malloc(((size_t)(n > 0 ? n : 0) + 1) * sizeof *ids);
    CHECK(n >= 0 && ll_tokenize(t, p, len, 0, 0, ids, n) == n);
    char *got = malloc((size_t)(n > 0 ? n : 0) * 12 + 2);
    size_t gl = 0;
    got[0] = 0;
    for (int i = 0; i < n; i++) gl += (size_t)sprintf(got + gl, " %d", ids[i]);
    cases++;
    const char *g = got[0] ? got + 1 : got; // without the leading space
    if (strcmp(g, o) == 0) ok++;
    else fprintf(stderr, "%s case %d: text [%.*s]\n  expected %s\n  got      %s\n", gguf, cases, (int)len, p, o, g);
    CHECK(strcmp(g, o) == 0);
    if (is_bpe && n >= 0) {
      char *back = malloc(len + 64);
      int bl = ll_detokenize(t, ids, n, back, len + 64, 0);
      // Invalid UTF-8 in the input is replaced by U+FFFD on encode, so compare valid texts only.
      int valid = 1;
      for (size_t i = 0; i < len; i++) valid &= (unsigned char)p[i] < 0x80 || (unsigned char)p[i] >= 0xC2;
      if (valid) CHECKF(bl == (int)len && memcmp(back, p, len) == 0, "%s case %d: decode(encode(text)) != text", gguf, cases);
      free(back);
    }
    free(ids);
    free(got);
    p = e + (e < inp + ni ? strlen(SEP) : 0);
    o = ol + 1;
  }
  printf("%s: %d/%d cases match llama.cpp\n", strrchr(gguf, '/') + 1, ok, cases);
  CHECKF(cases >= 40, "%s: only %d cases read", gguf, cases);
  free(inp);
  free(out);
  ll_tokenizer_free(t);
  ll_modelfile_free(&mf);
  return cases;
}

// Streaming decode never emits half a UTF-8 character, and the concatenation is the text.
static void check_stream(struct ll_tokenizer *t, const char *text) {
  int32_t ids[512];
  int n = ll_tokenize(t, text, strlen(text), 0, 0, ids, 512);
  CHECK(n > 0 && n <= 512);
  struct ll_detok_stream s;
  ll_detok_stream_init(&s);
  char acc[4096];
  size_t al = 0;
  for (int i = 0; i < n; i++) {
    char piece[512];
    int k = ll_detok_stream_push(t, &s, ids[i], piece, sizeof piece);
    CHECK(k >= 0);
    // Each emitted chunk is complete UTF-8: it never ends inside a multi-byte character.
    int bad = 0;
    for (int j = 0; j < k;) {
      unsigned char c = (unsigned char)piece[j];
      int need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
      if (j + need > k) bad = 1;
      j += need;
    }
    CHECKF(!bad, "chunk %d ends inside a character", i);
    memcpy(acc + al, piece, (size_t)k);
    al += (size_t)k;
  }
  al += (size_t)ll_detok_stream_finish(&s, acc + al, sizeof acc - al);
  CHECKF(al == strlen(text) && memcmp(acc, text, al) == 0, "stream decode of [%s] gave [%.*s]", text, (int)al, acc);
}

static void check_smollm2(void) {
  char path[4096], err[512];
  if (!ll_test_smollm2_path(path, sizeof path)) {
    printf("SmolLM2 not cached (fixture fetch_smollm2 did not run): skipping its checks\n");
    return;
  }
  struct ll_modelfile mf;
  struct ll_tokenizer *t;
  CHECK(ll_gguf_open(path, &mf, err, sizeof err) == 0);
  CHECKF(ll_tokenizer_from_mf(&mf, &t, err, sizeof err) == 0, "%s", err);
  CHECK(ll_tokenizer_n_vocab(t) == 49152);
  // Ids produced by llama.cpp's llama-tokenize (0.3.36 vendored tree) on the same file.
  const char *text = "Hello world, it's <|im_start|>user\n";
  int32_t ids[64];
  int n = ll_tokenize(t, text, strlen(text), 0, 1, ids, 64);
  const int32_t expect[] = {19556, 905, 28, 357, 506, 216, 1, 4093, 198};
  CHECK(n == 9 && memcmp(ids, expect, sizeof expect) == 0);
  // Without special parsing the marker is ordinary text (several tokens, none is id 1).
  n = ll_tokenize(t, text, strlen(text), 0, 0, ids, 64);
  int has1 = 0;
  for (int i = 0; i < n; i++) has1 |= ids[i] == 1;
  CHECK(n > 9 && !has1);
  CHECK(ll_tokenizer_is_eog(t, 2)); // <|im_end|>
  // Marked: the template's <|im_start|> (in the mark) is id 1, the message's is text.
  const char *two = "<|im_start|>user\n<|im_start|>";
  const struct ll_tok_span mk = {0, 17};
  n = ll_tokenize_marked(t, two, strlen(two), 0, &mk, 1, ids, 64);
  int ones = 0;
  for (int i = 0; i < n; i++) ones += ids[i] == 1;
  CHECKF(n > 4 && ids[0] == 1 && ones == 1, "%d ids, %d <|im_start|>", n, ones);
  CHECK(ll_tokenizer_chat_template(t) != NULL);
  const char *texts[] = {"The quick brown fox jumps over the lazy dog.", "naïve café — 日本語のテキスト 🦙🚀 end",
                         "  leading spaces\n\n\ttabs and\r\nCRLF  ", "emoji pair 👨‍👩‍👧 and ‰ ½"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    char back[512];
    int k = ll_tokenize(t, texts[i], strlen(texts[i]), 0, 0, ids, 64);
    CHECK(k > 0);
    int bl = ll_detokenize(t, ids, k, back, sizeof back, 0);
    CHECKF(bl == (int)strlen(texts[i]) && memcmp(back, texts[i], (size_t)bl) == 0, "round trip of [%s]", texts[i]);
    check_stream(t, texts[i]);
  }
  ll_tokenizer_free(t);
  ll_modelfile_free(&mf);
}

// A vocabulary built by hand: checks the error paths and SPM byte fallback without files.
static void check_handmade(void) {
  struct ll_modelfile mf;
  struct ll_tokenizer *t;
  char err[256];
  ll_modelfile_init(&mf);
  CHECK(ll_tokenizer_from_mf(&mf, &t, err, sizeof err) == LL_ENOTFOUND); // no tokenizer: ids only
  const char *toks[3 + 256 + 6];
  char bytes[256][8];
  float scores[3 + 256 + 6];
  int32_t types[3 + 256 + 6];
  int n = 0;
  toks[n] = "<unk>", types[n] = 2, scores[n++] = 0;
  toks[n] = "<s>", types[n] = 3, scores[n++] = 0;
  toks[n] = "</s>", types[n] = 3, scores[n++] = 0;
  for (int b = 0; b < 256; b++) snprintf(bytes[b], 8, "<0x%02X>", b), toks[n] = bytes[b], types[n] = 6, scores[n++] = 0;
  toks[n] = "\xe2\x96\x81h", types[n] = 1, scores[n++] = -1;
  toks[n] = "i", types[n] = 1, scores[n++] = -2;
  toks[n] = "\xe2\x96\x81hi", types[n] = 1, scores[n++] = -0.5f;
  toks[n] = "\xe2\x96\x81", types[n] = 1, scores[n++] = -3;
  toks[n] = "<eot>", types[n] = 4, scores[n++] = 0; // user-defined: a turn marker (as Gemma's can be)
  toks[n] = "<tab>", types[n] = 4, scores[n++] = 0; // user-defined: an ordinary word
  const int32_t EOT = 3 + 256 + 4, TAB = 3 + 256 + 5;
  ll_mf_set_str(&mf, "tokenizer.ggml.model", "llama");
  ll_mf_set_arr(&mf, "tokenizer.ggml.tokens", LL_KV_STR, toks, (uint64_t)n);
  ll_mf_set_arr(&mf, "tokenizer.ggml.scores", LL_KV_F32, scores, (uint64_t)n);
  ll_mf_set_arr(&mf, "tokenizer.ggml.token_type", LL_KV_I32, types, (uint64_t)n);
  CHECKF(ll_tokenizer_from_mf(&mf, &t, err, sizeof err) == 0, "%s", err);
  int32_t ids[16];
  int k = ll_tokenize(t, "hi\xc3\xa9", 4, 1, 0, ids, 16);
  // BOS, "▁hi", then é as two byte-fallback tokens <0xC3> <0xA9>.
  CHECK(k == 4 && ids[0] == 1 && ids[1] == 3 + 256 + 2 && ids[2] == 3 + 0xC3 && ids[3] == 3 + 0xA9);
  char back[16];
  int bl = ll_detokenize(t, ids, k, back, sizeof back, 0);
  CHECK(bl == 4 && memcmp(back, "hi\xc3\xa9", 4) == 0);
  CHECK(ll_tokenize(t, "hi", 2, 1, 0, ids, 1) == 2); // reports the size needed
  CHECK(ll_token_to_piece(t, 99999, back, sizeof back, 0) == LL_EINVAL);
  // Control texts only inside the marks (a chat template's markup): "</s>" in [0, 4) is EOS,
  // the same text outside, or straddling a mark's edge, is bytes (issue 28).
  {
    const char *txt = "</s>a</s></s>";
    struct ll_tok_span mk[] = {{0, 4}, {7, 13}}; // the 3rd "</s>" starts at 9, straddling [5, 9) is outside
    int32_t v[32];
    int nv = ll_tokenize_marked(t, txt, strlen(txt), 0, mk, 2, v, 32);
    // </s> | "a</s>" as text | </s>
    int eos = 0;
    for (int i = 0; i < nv; i++) eos += v[i] == 2;
    CHECKF(nv > 6 && v[0] == 2 && eos == 2 && v[nv - 1] == 2, "%d ids, %d EOS", nv, eos);
    struct ll_tok_span mid[] = {{2, 11}}; // "s>a</s></" : holds the 2nd "</s>" (5..9) only
    nv = ll_tokenize_marked(t, txt, strlen(txt), 0, mid, 1, v, 32);
    eos = 0;
    for (int i = 0; i < nv; i++) eos += v[i] == 2;
    CHECKF(eos == 1 && v[0] != 2 && v[nv - 1] != 2, "%d ids, %d EOS", nv, eos);
    nv = ll_tokenize_marked(t, txt, strlen(txt), 0, NULL, 0, v, 32); // no marks: all text
    eos = 0;
    for (int i = 0; i < nv; i++) eos += v[i] == 2;
    CHECK(nv > 12 && eos == 0);
    // User-defined tokens: parsed anywhere (llama.cpp), unless the marks use them - then a
    // message's copy is text too.
    const char *ud = "<eot>x<tab><eot>";
    const struct ll_tok_span tail = {11, 16};
    nv = ll_tokenize_marked(t, ud, strlen(ud), 0, &tail, 1, v, 32);
    int eots = 0, tabs = 0;
    for (int i = 0; i < nv; i++) eots += v[i] == EOT, tabs += v[i] == TAB;
    CHECKF(eots == 1 && v[nv - 1] == EOT && tabs == 1, "%d ids: %d <eot>, %d <tab>", nv, eots, tabs);
    nv = ll_tokenize_marked(t, ud, strlen(ud), 0, NULL, 0, v, 32);
    eots = tabs = 0;
    for (int i = 0; i < nv; i++) eots += v[i] == EOT, tabs += v[i] == TAB;
    CHECKF(v[0] == EOT && eots == 2 && tabs == 1, "no marks: %d ids: %d <eot>, %d <tab>", nv, eots, tabs);
    struct ll_tok_span bad1[] = {{4, 2}}, bad2[] = {{0, 14}}, bad3[] = {{0, 5}, {4, 6}};
    CHECK(ll_tokenize_marked(t, txt, strlen(txt), 0, bad1, 1, v, 32) == LL_EINVAL);
    CHECK(ll_tokenize_marked(t, txt, strlen(txt), 0, bad2, 1, v, 32) == LL_EINVAL);
    CHECK(ll_tokenize_marked(t, txt, strlen(txt), 0, bad3, 2, v, 32) == LL_EINVAL);
  }
  ll_tokenizer_free(t);
  // Unknown model / pre-tokenizer are refused with a message.
  ll_mf_set_str(&mf, "tokenizer.ggml.model", "gpt2");
  CHECK(ll_tokenizer_from_mf(&mf, &t, err, sizeof err) == LL_EFORMAT); // no merges
  const char *merges[] = {"\xe2\x96\x81 h"};
  ll_mf_set_arr(&mf, "tokenizer.ggml.merges", LL_KV_STR, merges, 1);
  ll_mf_set_str(&mf, "tokenizer.ggml.pre", "no-such-pre");
  CHECK(ll_tokenizer_from_mf(&mf, &t, err, sizeof err) == LL_EUNSUPPORTED && strstr(err, "no-such-pre"));
  ll_mf_set_str(&mf, "tokenizer.ggml.model", "t5");
  CHECK(ll_tokenizer_from_mf(&mf, &t, err, sizeof err) == LL_EUNSUPPORTED);
  ll_modelfile_free(&mf);
}

// Every vocabulary of llama.cpp's tests/ (fetched by tests/fetch-llama-vocab.sh into gguf_dir)
// against the vectors committed in vec_dir: each with .inp/.out must match case for case,
// except bert-bge (WordPiece), which must be refused with a message naming it.
static void check_llama_vocab(const char *gguf_dir, const char *vec_dir) {
  DIR *d = opendir(vec_dir);
  CHECKF(d != NULL, "cannot open %s", vec_dir);
  if (!d) return;
  struct dirent *e;
  int vocabs = 0, cases = 0, refused = 0;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l < 10 || strcmp(e->d_name + l - 9, ".gguf.inp") != 0) continue;
    char gguf[8192], vec[8192], err[512];
    snprintf(gguf, sizeof gguf, "%s/%.*s", gguf_dir, (int)(l - 4), e->d_name);
    snprintf(vec, sizeof vec, "%s/%.*s", vec_dir, (int)(l - 4), e->d_name);
    if (strstr(e->d_name, "bert-bge")) {
      struct ll_modelfile mf;
      struct ll_tokenizer *t = NULL;
      CHECKF(ll_gguf_open(gguf, &mf, err, sizeof err) == 0, "%s", err);
      int rc = ll_tokenizer_from_mf(&mf, &t, err, sizeof err);
      CHECKF(rc == LL_EUNSUPPORTED && strstr(err, "'bert'") && strstr(err, "WordPiece"), "bert-bge: rc %d, '%s'", rc, err);
      printf("bert-bge refused: %s\n", err);
      refused++;
      ll_tokenizer_free(t);
      ll_modelfile_free(&mf);
      continue;
    }
    cases += check_vocab(gguf, vec);
    vocabs++;
  }
  closedir(d);
  printf("%d vocabularies, %d cases\n", vocabs, cases);
  CHECK(vocabs >= 14 && cases >= 14 * 46 && refused == 1);
}

// Every pre-tokenizer llama.cpp 0c1e5709 names, run on llama-bpe's vocabulary with
// tokenizer.ggml.pre replaced: pretok.out holds llama.cpp's ids for the texts of pretok.inp under
// each name ("## name name ..." heads the block of names giving the same ids).
static void check_pretokenizers(const char *gguf_dir, const char *vec_dir) {
  char path[8192], err[512];
  size_t ni, no;
  snprintf(path, sizeof path, "%s/pretok.inp", vec_dir);
  char *inp = (char *)ll_test_read_file(path, &ni);
  snprintf(path, sizeof path, "%s/pretok.out", vec_dir);
  char *out = (char *)ll_test_read_file(path, &no);
  snprintf(path, sizeof path, "%s/ggml-vocab-llama-bpe.gguf", gguf_dir);
  struct ll_modelfile mf;
  CHECKF(inp && out, "%s/pretok.inp/.out missing", vec_dir);
  CHECKF(ll_gguf_open(path, &mf, err, sizeof err) == 0, "%s", err);
  if (!inp || !out) return;
  // The texts.
  const char *text[256];
  size_t tlen[256];
  int nt = 0;
  for (char *p = inp; p < inp + ni && nt < 256;) {
    char *e = strstr(p, SEP);
    if (!e) e = inp + ni;
    text[nt] = p, tlen[nt++] = (size_t)(e - p);
    p = e + (e < inp + ni ? strlen(SEP) : 0);
  }
  int names = 0, bad = 0;
  int32_t *ids = malloc(65536 * sizeof *ids);
  char *got = malloc(65536 * 12);
  for (char *line = out; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    CHECKF(strncmp(line, "## ", 3) == 0, "pretok.out: expected a '## names' line, got [%.40s]", line);
    char *block = nl ? nl + 1 : NULL;
    char *save = NULL;
    for (char *name = strtok_r(line + 3, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
      struct ll_tokenizer *t = NULL;
      ll_mf_set_str(&mf, "tokenizer.ggml.pre", name);
      int rc = ll_tokenizer_from_mf(&mf, &t, err, sizeof err);
      CHECKF(rc == 0, "pre-tokenizer %s: %s", name, err);
      char *o = block;
      for (int i = 0; i < nt && o && rc == 0; i++) {
        char *ol = strchr(o, '\n');
        size_t want_len = ol ? (size_t)(ol - o) : strlen(o);
        int n = ll_tokenize(t, text[i], tlen[i], 0, 0, ids, 65536);
        size_t gl = 0;
        got[0] = 0;
        for (int k = 0; k < n && gl < 65536 * 11; k++) gl += (size_t)sprintf(got + gl, " %d", ids[k]);
        if (n < 0 || gl != want_len || memcmp(got, o, gl) != 0) {
          if (bad++ < 10) fprintf(stderr, "pre-tokenizer %s, text %d [%.*s]:\n  expected %.*s\n  got      %s\n", name, i, (int)tlen[i], text[i], (int)want_len, o, got);
        }
        o = ol ? ol + 1 : NULL;
      }
      ll_tokenizer_free(t);
      names++;
    }
    for (int i = 0; i < nt && block; i++) { // to the next header
      char *ol = strchr(block, '\n');
      block = ol ? ol + 1 : NULL;
    }
    line = block;
  }
  printf("%d pre-tokenizers x %d texts: %d differ from llama.cpp\n", names, nt, bad);
  CHECK(bad == 0 && names >= 80 && nt >= 60);
  free(ids);
  free(got);
  free(inp);
  free(out);
  ll_modelfile_free(&mf);
}

// test_tokenizer [GGUF_DIR VECTOR_DIR]: with arguments, only llama.cpp's vocabularies (in
// GGUF_DIR, from tests/fetch-llama-vocab.sh) against tests/data/vocab.
int main(int argc, char **argv) {
  if (argc == 3) {
    check_llama_vocab(argv[1], argv[2]);
    check_pretokenizers(argv[1], argv[2]);
    return ll_test_summary();
  }
  char dir[4096];
  check_handmade();
  if (ll_test_shared_path("testdata/vocab", dir, sizeof dir)) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int files = 0;
    while (d && (e = readdir(d))) {
      size_t l = strlen(e->d_name);
      if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        check_vocab(p, NULL);
        files++;
      }
    }
    if (d) closedir(d);
    CHECK(files >= 5);
  } else {
    printf("../shared/testdata/vocab is absent: skipping the llama.cpp conformance vectors\n");
  }
  check_smollm2();
  return ll_test_summary();
}
