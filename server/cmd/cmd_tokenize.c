// cmd_tokenize.c - `llsrv tokenize` / `llsrv detokenize`: the tokenizer from the command line.
//
//   llsrv tokenize --model FILE [--ids|--pieces] [--no-bos] [--no-special]   text on stdin
//   llsrv detokenize --model FILE [--special]                               ids on stdin
// FILE: any model file ll_model_open() reads (a vocabulary-only GGUF too).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_cmd.h"
#include "ll_error.h"
#include "ll_modelfile.h"
#include "ll_tokenizer.h"

#define MAX_INPUT (64u << 20)

static char *read_stdin(size_t *len) {
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, stdin);
    n += got;
    if (got == 0) break;
    if (n == cap) {
      if (cap >= MAX_INPUT) {
        free(buf);
        return NULL;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        return NULL;
      }
      buf = nb;
      cap *= 2;
    }
  }
  if (buf) *len = n;
  return buf;
}

static int open_tokenizer(const char *path, struct ll_modelfile *mf, struct ll_tokenizer **tok, const char *cmd) {
  char err[512];
  if (ll_model_open(path, mf, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv %s: %s\n", cmd, err);
    return 1;
  }
  if (ll_tokenizer_from_mf(mf, tok, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv %s: %s: %s\n", cmd, path, err);
    ll_modelfile_free(mf);
    return 1;
  }
  return 0;
}

int ll_cmd_tokenize(int argc, char **argv) {
  const char *model = NULL;
  int pieces = 0, bos = -1, special = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
    else if (strcmp(argv[i], "--ids") == 0) pieces = 0;
    else if (strcmp(argv[i], "--pieces") == 0) pieces = 1;
    else if (strcmp(argv[i], "--no-bos") == 0) bos = 0;
    else if (strcmp(argv[i], "--bos") == 0) bos = 1;
    else if (strcmp(argv[i], "--no-special") == 0) special = 0;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: llsrv tokenize --model FILE [--ids|--pieces] [--no-bos|--bos] [--no-special] < text\n"
             "Prints the token ids of stdin's UTF-8 text space-separated on one line (--pieces: one\n"
             "id<TAB>piece per line). BOS is added when the model asks for it unless --no-bos;\n"
             "special-token texts such as <|im_start|> are recognised unless --no-special.\n");
      return 0;
    } else {
      fprintf(stderr, "llsrv tokenize: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (!model) {
    fprintf(stderr, "llsrv tokenize: --model FILE is required\n");
    return 2;
  }
  struct ll_modelfile mf;
  struct ll_tokenizer *tok;
  if (open_tokenizer(model, &mf, &tok, "tokenize")) return 1;
  size_t len = 0;
  char *text = read_stdin(&len);
  int rc = 1;
  if (!text) {
    fprintf(stderr, "llsrv tokenize: cannot read stdin (limit %u MiB)\n", MAX_INPUT >> 20);
    goto out;
  }
  int add_bos = bos < 0 ? ll_tokenizer_add_bos(tok) : bos;
  int n = ll_tokenize(tok, text, len, add_bos, special, NULL, 0);
  int32_t *ids = n >= 0 ? malloc(((size_t)n + 1) * sizeof *ids) : NULL;
  if (n < 0 || !ids || ll_tokenize(tok, text, len, add_bos, special, ids, n) != n) {
    fprintf(stderr, "llsrv tokenize: %s\n", ll_strerror(n < 0 ? n : LL_ENOMEM));
    free(ids);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (pieces) {
      char piece[4200];
      int pl = ll_token_to_piece(tok, ids[i], piece, sizeof piece, 1);
      printf("%d\t%.*s\n", ids[i], pl > 0 ? (pl < (int)sizeof piece ? pl : (int)sizeof piece) : 0, piece);
    } else {
      printf(i ? " %d" : "%d", ids[i]);
    }
  }
  if (!pieces) printf("\n");
  free(ids);
  rc = 0;
out:
  free(text);
  ll_tokenizer_free(tok);
  ll_modelfile_free(&mf);
  return rc;
}

int ll_cmd_detokenize(int argc, char **argv) {
  const char *model = NULL;
  int special = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
    else if (strcmp(argv[i], "--special") == 0) special = 1;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: llsrv detokenize --model FILE [--special] < ids\n"
             "Reads whitespace-separated token ids on stdin and prints their text (--special: render\n"
             "control tokens too).\n");
      return 0;
    } else {
      fprintf(stderr, "llsrv detokenize: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (!model) {
    fprintf(stderr, "llsrv detokenize: --model FILE is required\n");
    return 2;
  }
  struct ll_modelfile mf;
  struct ll_tokenizer *tok;
  if (open_tokenizer(model, &mf, &tok, "detokenize")) return 1;
  size_t len = 0;
  char *text = read_stdin(&len);
  int rc = 1, n = 0;
  int32_t *ids = text ? malloc((len / 2 + 1) * sizeof *ids) : NULL;
  if (!ids) {
    fprintf(stderr, "llsrv detokenize: cannot read stdin\n");
    goto out;
  }
  for (char *p = text, *end = text + len; p < end;) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',')) p++;
    if (p >= end) break;
    char *q;
    long v = strtol(p, &q, 10);
    if (q == p || v < 0 || v >= ll_tokenizer_n_vocab(tok)) {
      fprintf(stderr, "llsrv detokenize: bad token id at byte %ld (vocabulary has %d tokens)\n", (long)(p - text), ll_tokenizer_n_vocab(tok));
      goto out;
    }
    ids[n++] = (int32_t)v;
    p = q;
  }
  int need = ll_detokenize(tok, ids, n, NULL, 0, special);
  char *out = need >= 0 ? malloc((size_t)need + 1) : NULL;
  if (!out) goto out;
  ll_detokenize(tok, ids, n, out, (size_t)need, special);
  fwrite(out, 1, (size_t)need, stdout);
  free(out);
  rc = 0;
out:
  free(ids);
  free(text);
  ll_tokenizer_free(tok);
  ll_modelfile_free(&mf);
  return rc;
}
