// cmd_convert.c - placeholder until the owning work lands (replaced, not kept).
#include <stdio.h>
#include "ll_cmd.h"
int ll_cmd_convert(int argc, char **argv) {
  (void)argc; (void)argv;
  fprintf(stderr, "llsrv convert: not built in this revision\n");
  return 2;
}
