// ll_config.h - llsrv's options: ONE table (name, type, range, default, help) that the YAML
// loader, the command line, `--help` and the man page llsrv.yaml(5) all read.
//
// YAML keys nest one level for sections: `train: {lora_rank: 8}` is the option
// "train.lora_rank"; its command-line flag is `--train-lora-rank` (dots and underscores become
// dashes). The command line overrides the file given with --config.
#ifndef LL_CONFIG_H
#define LL_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum ll_opt_type {
  LL_OPT_STRING,   // char *         (may be NULL = unset)
  LL_OPT_INT,      // int64_t        (range min..max)
  LL_OPT_FLOAT,    // double         (range min..max)
  LL_OPT_BOOL,     // int 0/1        (true/false/yes/no/on/off/1/0)
  LL_OPT_SIZE,     // int64_t bytes  (accepts 4096, 64K, 1M, 2G, 1MiB; range min..max in bytes)
  LL_OPT_DURATION, // double seconds (accepts 30, 1.5, 500ms, 30s, 5m, 1h; range min..max in seconds)
  LL_OPT_ENUM,     // char * one of the '|'-separated words in `choices`
  LL_OPT_LIST,     // char * comma-joined words of `choices`, each at most once, at least one
                   // (YAML: a flow or block sequence `[q, k, v]`; command line: q,k,v)
};

struct ll_option {
  const char *name;     // "listen", "train.lora_rank"
  enum ll_opt_type type;
  double min, max;      // numeric types only
  const char *def;      // default as text, parsed like a YAML value (NULL = unset)
  const char *choices;  // LL_OPT_ENUM: "error|warn|info|debug"; LL_OPT_BOOL: "auto" (-1) or NULL
  size_t offset;        // into struct ll_config
  const char *argname;  // metavar for --help ("HOST:PORT"), NULL for bool flags
  const char *help;     // one sentence
};

struct ll_config {
  // model and engine
  char *model;          // path; NULL: the demo model under state_dir
  char *adapter;        // comma-separated LoRA adapter paths; NULL: none
  char *adapter_dir;    // watched directory of adapters (hot-loaded); NULL: none
  double adapter_dir_poll; // seconds between scans of adapter_dir
  char *chat_template;  // built-in name or template file; NULL: the model's
  char *reasoning_format; // none|auto|deepseek: HTTP chat's default (http.c; a request's overrides)
  char *device;         // auto|cpu|opencl[:P[:D]]
  int64_t threads;      // 0 = online CPUs
  int64_t ctx;          // positions per sequence
  int64_t parallel;     // sequences decoded together
  int kv_f16;           // 1 f16, 0 f32, -1 auto (f32 for llama2.c models, else f16)
  int64_t prefill_chunk;// prompt tokens per sequence per step
  int repack;           // 1: interleaved copies of the matrices that have them, for CPU decode
  char *state_dir;      // NULL: $XDG_STATE_HOME/llsrv or ~/.local/state/llsrv
  // network
  char *listen;         // HOST:PORT ("127.0.0.1:8478"); "" or "off" disables TCP
  char *http;           // HOST:PORT of the HTTP API ("127.0.0.1:8480"); "" or "off" disables it
  char *socket;         // monitor socket path; NULL: $XDG_RUNTIME_DIR/llsrv/llsrv.sock or /tmp/llsrv-$UID/llsrv.sock
  char *auth_token;     // NULL: no AUTH (then only loopback addresses may be bound)
  int64_t max_clients;
  int64_t max_line;         // bytes
  int64_t max_upload;       // bytes of an HTTP upload (POST /v1/files)
  int64_t max_queued;       // requests waiting beyond the `parallel` active ones
  int64_t max_tokens;       // per-request cap on max_tokens
  int64_t default_max_tokens;
  double idle_timeout;      // seconds without a byte and without a request in flight
  double line_timeout;      // seconds a started line may stay unfinished (slowloris)
  int64_t output_buffer;    // bytes queued to a client before it is dropped
  double monitor_hz;
  char *log_level;          // error|warn|info|debug
  // training (the trainer arrives with the training issue; the keys are validated now)
  int train_enabled;
  char *train_data;         // corpus file or directory; NULL: the demo corpus
  int64_t train_lora_rank;
  double train_lora_alpha;
  double train_lr;
  int64_t train_steps;
  int64_t train_batch;
  int64_t train_seq_len;
  int64_t train_checkpoint_every;
  char *train_checkpoint_dir;// NULL: <state_dir>/runs
  char *train_lora_targets;  // "q,k,v,o,gate,up,down" (LL_OPT_LIST)
  char *train_lora_experts;  // "gate,up,down" or "" (LL_OPT_LIST): adapters on the experts
  double train_lora_dropout;
  char *train_mode;          // lora|full
  int64_t train_warmup;
  char *train_schedule;      // cosine|linear|constant
  char *train_shuffle;       // files|pieces
  double train_min_lr_ratio;
  int64_t train_grad_accum;
  double train_clip;
  double train_moe_aux_coef;
  double train_weight_decay;
  int64_t train_seed;
  int64_t train_eval_every;
  int64_t train_eval_seqs;
  double train_val_fraction;
  int64_t train_keep;
  int64_t train_max_skipped_steps;
  int train_recompute;
  int train_on_thinking;     // chat records: <think> blocks in the loss (ll_data_params.train_on_thinking)
  double train_share;        // server: largest share of compute time training may take
};

// The table (terminated by an entry with name == NULL).
extern const struct ll_option ll_options[];

void ll_config_init(struct ll_config *c);  // every field = its default from the table
void ll_config_free(struct ll_config *c);   // frees strings; c is left reusable after init

// Set one option from text (YAML scalar or command-line value). Error names the option, the
// value and the allowed range/choices. LL_ENOTFOUND for an unknown name.
int ll_config_set(struct ll_config *c, const char *name, const char *value, char *err, size_t errlen);

// Load YAML text (a mapping; sections one level deep). `fname` only labels messages, which
// read "fname:line:col: message" (1-based) for unknown keys, wrong types, out-of-range values,
// duplicate keys and YAML syntax errors. On error the config may be partly updated: callers
// treat it as fatal ("nothing starts").
int ll_config_load_yaml(struct ll_config *c, const char *buf, size_t len, const char *fname, char *err, size_t errlen);
int ll_config_load_file(struct ll_config *c, const char *path, char *err, size_t errlen);

// Command line: `--config FILE` is loaded first, then every `--name value` / `--name=value` /
// bare `--bool-flag` / `--no-bool-flag` overrides it. Flags handled by the caller
// (--help, --version, --check-config) are reported through *help / *version / *check (may be NULL).
// Positional arguments are an error. Returns 0 or an LL_E* code with a message.
int ll_config_parse_args(struct ll_config *c, int argc, char **argv, int *help, int *version,
                         int *check, char *err, size_t errlen);

void ll_config_print_help(FILE *f);         // `llsrv --help`: generated from the table
void ll_config_print_man_options(FILE *f);  // roff OPTIONS section of llsrv.yaml(5), from the table
void ll_config_print_yaml(FILE *f, const struct ll_config *c); // resolved config (--check-config); auth_token shown as "(set)"

#endif
