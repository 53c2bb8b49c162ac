// fuzz_monitor.c - lltop's monitor line parser (tui/lt_model.c) on arbitrary bytes: it never
// crashes or reads outside the line; a refused line says why; every string it keeps is
// printable UTF-8 (no control byte, no C1, no bidi override can reach the terminal); folding
// the message into the model and formatting the --once text stay in bounds; the sanitizer
// itself keeps its output valid for any input; the line assembler, fed the bytes in chunks of
// every size, yields exactly the lines (and over-long lines' lengths) a plain split does.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lt_model.h"

static void check_text(const char *s, size_t cap) {
  size_t n = strnlen(s, cap);
  if (n == cap) __builtin_trap(); // NUL-terminated within its buffer
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f) __builtin_trap();
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0x9f) __builtin_trap(); // C1
    if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 && (unsigned char)s[i + 2] >= 0xAA &&
        (unsigned char)s[i + 2] <= 0xAE)
      __builtin_trap(); // bidi overrides
  }
  char again[LT_TEXT * 4];
  size_t k = lt_sanitize(s, n, again, sizeof again);
  if (k != n || memcmp(again, s, n) != 0) __builtin_trap(); // sanitized text is a fixed point
}

static void check_str(const struct lt_str *s) {
  if (s->known) check_text(s->s, sizeof s->s);
}

struct split {
  const uint8_t *data;
  size_t size, pos; // the reference: where the next expected line starts
  size_t max;
  int lines;
};

static const uint8_t *next_line(struct split *sp, size_t *len) {
  const uint8_t *p = sp->pos < sp->size ? memchr(sp->data + sp->pos, '\n', sp->size - sp->pos) : NULL;
  if (!p) __builtin_trap(); // the assembler reported a line the bytes do not have
  const uint8_t *l = sp->data + sp->pos;
  *len = (size_t)(p - l);
  sp->pos += *len + 1;
  return l;
}

static void got_line(void *user, const char *line, size_t len) {
  struct split *sp = user;
  size_t want;
  const uint8_t *l = next_line(sp, &want);
  if (len != want || want > sp->max || memcmp(line, l, len) != 0) __builtin_trap();
  sp->lines++;
}

static void got_long(void *user, size_t len) {
  struct split *sp = user;
  size_t want;
  next_line(sp, &want);
  if (len != want || want <= sp->max) __builtin_trap();
  sp->lines++;
}

static void check_linebuf(const uint8_t *data, size_t size) {
  if (size < 2) return;
  struct split sp = {data, size, 0, (size_t)data[0] % 80, 0};
  size_t chunk = 1 + data[1] % 37;
  struct lt_linebuf lb;
  lt_linebuf_init(&lb, sp.max);
  int total = 0;
  for (size_t off = 0; off < size; off += chunk) {
    size_t k = size - off < chunk ? size - off : chunk;
    int n = lt_linebuf_feed(&lb, (const char *)data + off, k, got_line, got_long, &sp);
    if (n < 0) __builtin_trap();
    total += n;
  }
  size_t nl = 0;
  for (size_t i = 0; i < size; i++) nl += data[i] == '\n';
  if ((size_t)total != nl || (size_t)sp.lines != nl) __builtin_trap(); // every line once, in order
  lt_linebuf_free(&lb);
}

static struct lt_snapshot snap;
static struct lt_model model;
static char out[1 << 17];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct lt_msg msg;
  char err[256];
  memset(&msg, 0, sizeof msg);
  msg.snap = &snap;
  err[0] = 0;
  int rc = lt_parse_line((const char *)data, size, &msg, err, sizeof err);
  if (rc < 0) {
    if (!err[0]) __builtin_trap(); // every refusal names what was wrong
    check_text(err, sizeof err);
  } else {
    if (msg.type == LT_MSG_SNAPSHOT) {
      const struct lt_snapshot *s = &snap;
      if (s->n_reqs < 0 || s->n_reqs > LT_MAX_REQS || s->n_hist < 0 || s->n_hist > LT_MSG_HIST) __builtin_trap();
      check_str(&s->version), check_str(&s->dev_name), check_str(&s->model_name), check_str(&s->tr_state);
      check_str(&s->tr_checkpoint), check_str(&s->listen), check_str(&s->model_quant);
      for (int i = 0; i < s->n_reqs; i++) check_str(&s->reqs[i].id), check_str(&s->reqs[i].client), check_str(&s->reqs[i].adapter);
      size_t n = lt_format_text(s, out, sizeof out);
      if (n < sizeof out) {
        if (strlen(out) != n) __builtin_trap();
        for (size_t i = 0; i < n; i++)
          if ((unsigned char)out[i] < 0x20 && out[i] != '\n') __builtin_trap();
      }
    } else if (msg.type == LT_MSG_EVENT) {
      check_text(msg.text, sizeof msg.text);
    } else if (msg.type == LT_MSG_REPLY) {
      check_str(&msg.command), check_str(&msg.error);
    } else {
      __builtin_trap(); // success always names a type
    }
    static int inited;
    if (!inited) lt_model_init(&model), inited = 1;
    lt_model_apply(&model, &msg, 1000.0 + size);
    if (model.n_hist < 0 || model.n_hist > LT_MAX_HIST || model.n_ev > LT_EVENTS) __builtin_trap();
    for (int i = 1; i < model.n_hist; i++)
      if (!(model.hist[i].step > model.hist[i - 1].step)) __builtin_trap(); // the chart's x stays ascending
    const struct lt_event *e = lt_model_event(&model, 0);
    if (e) check_text(e->text, sizeof e->text);
  }
  check_linebuf(data, size);
  // The sanitizer on the raw bytes.
  char san[LT_TEXT];
  size_t k = lt_sanitize((const char *)data, size, san, sizeof san);
  if (k >= sizeof san || strlen(san) != k) __builtin_trap();
  check_text(san, sizeof san);
  return 0;
}
