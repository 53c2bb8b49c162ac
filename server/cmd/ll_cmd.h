// ll_cmd.h - llsrv subcommands. Each returns the process exit status
// (0 success, 1 runtime failure, 2 usage error) and prints its own errors to stderr.
#ifndef LL_CMD_H
#define LL_CMD_H

#include <stddef.h>

int ll_cmd_serve(int argc, char **argv);      // cmd_serve.c   (default: `llsrv --model M`)
int ll_cmd_convert(int argc, char **argv);    // cmd_convert.c
int ll_cmd_tokenize(int argc, char **argv);   // cmd_tokenize.c
int ll_cmd_detokenize(int argc, char **argv); // cmd_tokenize.c
int ll_cmd_generate(int argc, char **argv);   // cmd_generate.c
int ll_cmd_bench(int argc, char **argv);      // cmd_bench.c
int ll_cmd_perplexity(int argc, char **argv); // cmd_perplexity.c
int ll_cmd_export(int argc, char **argv);     // cmd_export.c
int ll_cmd_train(int argc, char **argv);      // cmd_train.c
int ll_cmd_init(int argc, char **argv);       // cmd_train.c
int ll_cmd_plan(int argc, char **argv);       // cmd_plan.c

// The OpenCL program binary cache, <state_dir>/opencl, in buf; NULL (no cache) for
// --device cpu or when the state directory cannot be had (main.c).
const char *ll_cmd_opencl_cache(const char *state_dir_cfg, const char *device, char *buf, size_t cap);

#endif
