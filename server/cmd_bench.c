// cmd_bench.c - placeholder until the owning work lands (replaced, not kept).
#include <stdio.h>
#include "ll_cmd.h"
int ll_cmd_bench(int argc, char **argv) {
  (void)argc; (void)argv;
  fprintf(stderr, "llsrv bench: not built in this revision\n");
  return 2;
}
