// cmd_generate.c - placeholder until the owning work lands (replaced, not kept).
#include <stdio.h>
#include "ll_cmd.h"
int ll_cmd_generate(int argc, char **argv) {
  (void)argc; (void)argv;
  fprintf(stderr, "llsrv generate: not built in this revision\n");
  return 2;
}
