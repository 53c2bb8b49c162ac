// cmd_tokenize.c - placeholder until the tokenizer lands (replaced, not kept).
#include <stdio.h>
#include "ll_cmd.h"
int ll_cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "llsrv tokenize: not built in this revision\n"); return 2; }
int ll_cmd_detokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "llsrv detokenize: not built in this revision\n"); return 2; }
