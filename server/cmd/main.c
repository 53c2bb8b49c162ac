// main.c - llsrv: dispatch to a subcommand; with none, serve (llsrv --model M ...).
#include <stdio.h>
#include <string.h>

#include "ll_cmd.h"
#include "ll_config.h"
#include "ll_demo.h"

struct ll_subcommand {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
};

static const struct ll_subcommand ll_subcommands[] = {
    {"serve", ll_cmd_serve, "serve generate requests over TCP and train in the background (default)"},
    {"generate", ll_cmd_generate, "one-shot generation to stdout"},
    {"bench", ll_cmd_bench, "prompt-processing and generation speed (like llama-bench pp/tg)"},
    {"perplexity", ll_cmd_perplexity, "perplexity of a text file (like llama-perplexity)"},
    {"train", ll_cmd_train, "fine-tune LoRA adapters (or a small model) in the foreground"},
    {"init", ll_cmd_init, "write a randomly initialised Llama .ckpt to train from scratch"},
    {"plan", ll_cmd_plan, "device memory plan of a config (weights, KV, training) and its adaptation, without loading"},
    {"convert", ll_cmd_convert, "convert GGUF / llama2.c / safetensors to .ckpt (or .ckpt to GGUF)"},
    {"export", ll_cmd_export, "LoRA adapter -> GGUF LoRA for llama.cpp --lora, or --merge into the base"},
    {"tokenize", ll_cmd_tokenize, "text on stdin -> token ids"},
    {"detokenize", ll_cmd_detokenize, "token ids on stdin -> text"},
};

const char *ll_cmd_opencl_cache(const char *state_dir_cfg, const char *device, char *buf, size_t cap) {
  char dir[1024], err[256];
  if (device && strcmp(device, "cpu") == 0) return NULL;
  if (ll_state_dir_resolve(state_dir_cfg, dir, sizeof dir, err, sizeof err) != 0) return NULL;
  int n = snprintf(buf, cap, "%s/opencl", dir);
  return n > 0 && (size_t)n < cap ? buf : NULL;
}

static void usage(FILE *f) {
  fprintf(f, "usage: llsrv [serve] --model PATH [options]   (llsrv --help for server options)\n"
             "       llsrv COMMAND [options]                (llsrv COMMAND --help)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof ll_subcommands / sizeof ll_subcommands[0]; i++)
    fprintf(f, "  %-11s %s\n", ll_subcommands[i].name, ll_subcommands[i].summary);
}

int main(int argc, char **argv) {
  if (argc >= 2 && argv[1][0] != '-') {
    for (size_t i = 0; i < sizeof ll_subcommands / sizeof ll_subcommands[0]; i++)
      if (strcmp(argv[1], ll_subcommands[i].name) == 0) return ll_subcommands[i].fn(argc - 1, argv + 1);
    if (strcmp(argv[1], "help") == 0) {
      usage(stdout);
      return 0;
    }
    fprintf(stderr, "llsrv: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    ll_config_print_help(stdout); // the server's options, from the one option table
    printf("\ncommands:\n");
    for (size_t i = 0; i < sizeof ll_subcommands / sizeof ll_subcommands[0]; i++)
      printf("  %-11s %s\n", ll_subcommands[i].name, ll_subcommands[i].summary);
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
    printf("llsrv %s\n", LL_VERSION);
    return 0;
  }
  return ll_cmd_serve(argc, argv);
}
