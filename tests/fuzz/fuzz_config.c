// fuzz_config.c - the YAML config loader on arbitrary bytes: never crashes or leaks; an error
// always names file:line:col; an accepted config prints as YAML that loads back.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct ll_config c;
  char err[512];
  ll_config_init(&c);
  if (ll_config_load_yaml(&c, (const char *)data, size, "f.yaml", err, sizeof err) != 0) {
    if (strncmp(err, "f.yaml:", 7) != 0) __builtin_trap();
  } else {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m) {
      ll_config_print_yaml(m, &c);
      fclose(m);
      struct ll_config d;
      ll_config_init(&d);
      if (ll_config_load_yaml(&d, buf, len, "printed", err, sizeof err) != 0) __builtin_trap(); // our output must load
      ll_config_free(&d);
      free(buf);
    }
  }
  ll_config_free(&c);
  return 0;
}
