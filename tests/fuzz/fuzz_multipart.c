// fuzz_multipart.c - multipart/form-data bodies and Content-Type values of arbitrary bytes:
// never a crash or a read outside the input; every part lies inside the body, in order.
#include <stdint.h>
#include <string.h>

#include "ll_multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // The first line is the Content-Type value, the rest the body.
  const char *p = (const char *)data;
  const char *nl = memchr(p, '\n', size);
  size_t ctl = nl ? (size_t)(nl - p) : size;
  const char *body = nl ? nl + 1 : p + size;
  size_t blen = nl ? size - ctl - 1 : 0;
  const char *b;
  size_t bl;
  char err[256];
  if (ll_multipart_boundary(p, ctl, &b, &bl, err, sizeof err) != 0) {
    b = "B", bl = 1; // still parse the body with a fixed boundary
  } else if (b < p || b + bl > p + ctl) {
    __builtin_trap();
  }
  struct ll_multipart_part parts[LL_MULTIPART_MAX_PARTS];
  int n = 0;
  if (ll_multipart_parse(body, blen, b, bl, parts, &n, err, sizeof err) == 0) {
    const char *last = body;
    if (n < 1 || n > LL_MULTIPART_MAX_PARTS) __builtin_trap();
    for (int i = 0; i < n; i++) {
      if (parts[i].data < last || parts[i].data + parts[i].len > body + blen) __builtin_trap();
      if (parts[i].name < body || parts[i].name + parts[i].name_len > body + blen) __builtin_trap();
      if (parts[i].filename && (parts[i].filename < body || parts[i].filename + parts[i].filename_len > body + blen)) __builtin_trap();
      last = parts[i].data + parts[i].len;
    }
    (void)ll_multipart_find(parts, n, "file");
  }
  return 0;
}
