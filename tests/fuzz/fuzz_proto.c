// fuzz_proto.c - request lines of arbitrary bytes: parse never crashes or reads outside the
// line; every parsed value/text re-escapes and unescapes to the same bytes; escaping any
// bytes gives valid UTF-8 without control bytes that unescapes to the input.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ll_proto.h"

static int valid_line(const char *s, size_t n) { // no raw control bytes; the escaper output is UTF-8 by construction
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f) return 0;
  return ll_utf8_complete_prefix(s, n) == n;
}

static void roundtrip(const char *p, size_t n, int for_value) {
  size_t cap = 4 * n + 1;
  char *e = malloc(cap), *d = malloc(cap);
  if (!e || !d) __builtin_trap();
  size_t k = ll_proto_escape(p, n, for_value, e, cap);
  if (k > 4 * n) __builtin_trap();
  if (!valid_line(e, k)) __builtin_trap();
  if (for_value && memchr(e, ' ', k)) __builtin_trap();
  char err[128];
  int64_t m = ll_proto_unescape(e, k, d, err, sizeof err);
  if (m != (int64_t)n || memcmp(d, p, n) != 0) __builtin_trap();
  free(e);
  free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *line = malloc(size + 1); // the parser may write line[size]
  if (!line) return 0;
  memcpy(line, data, size);
  struct ll_proto_req q;
  const char *code;
  char err[256];
  if (ll_proto_parse(line, size, &q, &code, err, sizeof err) == 0) {
    if (!q.verb[0]) __builtin_trap();
    for (int i = 0; i < q.n_params; i++) {
      const struct ll_proto_param *p = &q.params[i];
      if (p->val < line || p->val + p->val_len > line + size) __builtin_trap();
      roundtrip(p->val, p->val_len, 1);
      int64_t iv;
      double dv;
      int bv;
      ll_proto_int(p, INT64_MIN, INT64_MAX, &iv, err, sizeof err);
      ll_proto_float(p, -1e300, 1e300, &dv, err, sizeof err);
      ll_proto_bool(p, &bv, err, sizeof err);
      char name[64];
      if (ll_proto_name(p, name, sizeof name, err, sizeof err) == 0 && (strlen(name) != p->val_len || memcmp(name, p->val, p->val_len))) __builtin_trap();
    }
    if (q.has_text) {
      if (q.text < line || q.text + q.text_len > line + size) __builtin_trap();
      roundtrip(q.text, q.text_len, 0);
    }
  } else if (!code || !err[0]) {
    __builtin_trap(); // every error names its code and what was wrong
  }
  roundtrip((const char *)data, size, 0);
  roundtrip((const char *)data, size, 1);
  free(line);
  return 0;
}
