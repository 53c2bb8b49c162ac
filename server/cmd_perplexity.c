// cmd_perplexity.c - placeholder until the owning work lands (replaced, not kept).
#include <stdio.h>
#include "ll_cmd.h"
int ll_cmd_perplexity(int argc, char **argv) {
  (void)argc; (void)argv;
  fprintf(stderr, "llsrv perplexity: not built in this revision\n");
  return 2;
}
