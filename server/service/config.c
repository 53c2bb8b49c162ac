// config.c - the one option table, and everything that reads it: defaults, the YAML loader
// (libyaml events, errors as file:line:col), the command line, --help, the man page section
// and the resolved-config printer. Adding an option = one line in ll_options[] + a field.
#include "ll_config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "ll_error.h"

#define OFF(f) offsetof(struct ll_config, f)
#define KIB 1024.0
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

const struct ll_option ll_options[] = {
    // general
    {"model", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(model), "PATH",
     "Model file (GGUF, .ckpt, llama2.c .bin, safetensors directory); unset: the demo model under state_dir."},
    {"adapter", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(adapter), "PATHS",
     "LoRA adapters to serve (GGUF LoRA, .ckpt, PEFT directory), comma-separated; each is named by its file stem; the first is used by requests that name none."},
    {"adapter_dir", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(adapter_dir), "DIR",
     "Watched directory of LoRA adapters (*.gguf, *.ckpt, each named by its file stem): a new or changed file is loaded and served without a restart (requests in flight finish on the version they began with), a removed one unloaded."},
    {"adapter_dir_poll", LL_OPT_DURATION, 0.1, 3600, "2s", NULL, OFF(adapter_dir_poll), "TIME", "How often adapter_dir is scanned for changes."},
    {"chat_template", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(chat_template), "NAME|FILE",
     "Chat template for CHAT requests and chat training records, over the model's own: chatml, llama2, llama3, zephyr, gemma, phi3, qwen3, or a template file (Jinja text of one of those formats); unset: the model's."},
    {"reasoning_format", LL_OPT_ENUM, 0, 0, "none", "none|auto|deepseek", OFF(reasoning_format), "FMT",
     "HTTP chat completions of a thinking model (Qwen3): none returns the answer as generated; auto or deepseek moves its <think>...</think> reasoning to reasoning_content, as llama-server splits it (a request's reasoning_format overrides)."},
    {"device", LL_OPT_STRING, 0, 0, "auto", NULL, OFF(device), "DEV", "Compute device: auto (the best OpenCL GPU that passes its self-test, else the CPU), cpu, opencl, opencl:P or opencl:P:D (llsrv(1), DEVICES)."},
    {"threads", LL_OPT_INT, 0, 256, "0", NULL, OFF(threads), "N", "Compute threads; 0 uses every online CPU."},
    {"ctx", LL_OPT_INT, 16, 131072, "2048", NULL, OFF(ctx), "N", "Context positions per sequence."},
    {"parallel", LL_OPT_INT, 1, 256, "8", NULL, OFF(parallel), "N", "Sequences decoded together in one pass over the weights."},
    {"kv_f16", LL_OPT_BOOL, 0, 1, "auto", "auto", OFF(kv_f16), NULL,
     "Store the KV cache as f16 (else f32); auto: f32 for a llama2.c model (as run.c), f16 otherwise (as llama.cpp)."},
    {"repack", LL_OPT_BOOL, 0, 1, "true", NULL, OFF(repack), NULL,
     "On the CPU, keep an interleaved copy of the matrices whose kernels read one (Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K on x86 with AVX2), so decode streams each in one pass; costs their size again in memory (one block, in 2 MiB pages where Linux grants transparent huge pages on request)."},
    {"prefill_chunk", LL_OPT_INT, 1, 512, "256", NULL, OFF(prefill_chunk), "N",
     "Prompt tokens read per sequence per step, so long prompts do not stall streams."},
    {"state_dir", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(state_dir), "DIR",
     "State (demo model, training runs, checkpoints); unset: $XDG_STATE_HOME/llsrv or ~/.local/state/llsrv."},
    {"log_level", LL_OPT_ENUM, 0, 0, "info", "error|warn|info|debug", OFF(log_level), "LEVEL", "Log verbosity on standard error."},
    // network and limits
    {"listen", LL_OPT_STRING, 0, 0, "127.0.0.1:8478", NULL, OFF(listen), "HOST:PORT",
     "TCP address of the line protocol (port 0: any free port; off: no TCP)."},
    {"http", LL_OPT_STRING, 0, 0, "127.0.0.1:8480", NULL, OFF(http), "HOST:PORT",
     "TCP address of the OpenAI-compatible HTTP API, llsrv-http(7) (port 0: any free port; off: no HTTP)."},
    {"socket", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(socket), "PATH",
     "Monitor socket; unset: $XDG_RUNTIME_DIR/llsrv/llsrv.sock or /tmp/llsrv-$UID/llsrv.sock."},
    {"auth_token", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(auth_token), "TOKEN",
     "Clients must send AUTH with this token first (HTTP: Authorization: Bearer TOKEN); required to listen on a non-loopback address."},
    {"max_clients", LL_OPT_INT, 1, 65536, "256", NULL, OFF(max_clients), "N", "Simultaneous TCP connections."},
    {"max_line", LL_OPT_SIZE, 64, 64 * MIB, "1M", NULL, OFF(max_line), "BYTES", "Longest request line; a longer one closes the connection."},
    {"max_upload", LL_OPT_SIZE, 1 * KIB, 1 * GIB, "16M", NULL, OFF(max_upload), "BYTES",
     "Largest HTTP upload (POST /v1/files, a fine-tuning file); other HTTP bodies stop at max_line."},
    {"max_queued", LL_OPT_INT, 0, 65536, "64", NULL, OFF(max_queued), "N",
     "Requests that may wait beyond the parallel running ones before new ones get ERR busy."},
    {"max_tokens", LL_OPT_INT, 1, 131072, "4096", NULL, OFF(max_tokens), "N", "Largest max_tokens a request may ask for."},
    {"default_max_tokens", LL_OPT_INT, 1, 131072, "256", NULL, OFF(default_max_tokens), "N", "max_tokens of a request that gives none."},
    {"idle_timeout", LL_OPT_DURATION, 0.1, 86400, "300s", NULL, OFF(idle_timeout), "TIME",
     "Close a connection silent this long with nothing in flight."},
    {"line_timeout", LL_OPT_DURATION, 0.1, 86400, "30s", NULL, OFF(line_timeout), "TIME",
     "Close a connection whose started line stays unfinished this long (slow writers)."},
    {"output_buffer", LL_OPT_SIZE, 4 * KIB, 1 * GIB, "4M", NULL, OFF(output_buffer), "BYTES",
     "Output queued to a client that does not read before it is dropped."},
    {"monitor_hz", LL_OPT_FLOAT, 0.1, 100, "4", NULL, OFF(monitor_hz), "HZ", "Snapshots per second on the monitor socket."},
    // training
    {"train.enabled", LL_OPT_BOOL, 0, 1, "false", NULL, OFF(train_enabled), NULL, "Fine-tune LoRA adapters in the background while serving."},
    {"train.data", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(train_data), "PATH",
     "Training text: a file, a directory, or a comma-separated list of them; unset: the demo corpus (the project's sources and docs)."},
    {"train.lora_rank", LL_OPT_INT, 1, 256, "16", NULL, OFF(train_lora_rank), "N", "LoRA rank."},
    {"train.lora_alpha", LL_OPT_FLOAT, 0.01, 1e4, "32", NULL, OFF(train_lora_alpha), "X", "LoRA alpha (scale alpha/rank)."},
    {"train.lora_targets", LL_OPT_LIST, 0, 0, "q,k,v,o,gate,up,down", "q|k|v|o|gate|up|down", OFF(train_lora_targets), "LIST",
     "Matrices that get adapters: a list of q, k, v, o, gate, up, down."},
    {"train.lora_experts", LL_OPT_LIST, 0, 0, NULL, "gate|up|down|gate_shexp|up_shexp|down_shexp", OFF(train_lora_experts), "LIST",
     "Mixture-of-experts models: the experts' matrices that get adapters too, one pair per expert (ffn_gate_exps, ffn_up_exps, ffn_down_exps), "
     "and qwen2moe's shared expert's (ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp): a list of gate, up, down, gate_shexp, up_shexp, down_shexp; "
     "unset: none. The router is never adapted."},
    {"train.lora_dropout", LL_OPT_FLOAT, 0, 0.95, "0", NULL, OFF(train_lora_dropout), "P", "Dropout on the adapters' input (PEFT's lora_dropout), the experts' adapters' too (each expert's rows, its own mask)."},
    {"train.mode", LL_OPT_ENUM, 0, 0, "lora", "lora|full", OFF(train_mode), "MODE",
     "lora: adapters on the frozen weights; full: every weight (float models only)."},
    {"train.lr", LL_OPT_FLOAT, 1e-7, 1, "1e-3", NULL, OFF(train_lr), "X", "AdamW learning rate."},
    {"train.steps", LL_OPT_INT, 1, 1e9, "1000", NULL, OFF(train_steps), "N", "Optimizer steps."},
    {"train.batch", LL_OPT_INT, 1, 1024, "8", NULL, OFF(train_batch), "N", "Sequences per optimizer step."},
    {"train.seq_len", LL_OPT_INT, 8, 8192, "128", NULL, OFF(train_seq_len), "N", "Tokens per training sequence."},
    {"train.checkpoint_every", LL_OPT_INT, 0, 1e9, "100", NULL, OFF(train_checkpoint_every), "N", "Steps between checkpoints (0: only at the end, on demand and on shutdown)."},
    {"train.checkpoint_dir", LL_OPT_STRING, 0, 0, NULL, NULL, OFF(train_checkpoint_dir), "DIR", "Checkpoints; unset: <state_dir>/runs."},
    {"train.warmup", LL_OPT_INT, 0, 1e9, "0", NULL, OFF(train_warmup), "N", "Steps of linear learning-rate warmup."},
    {"train.schedule", LL_OPT_ENUM, 0, 0, "cosine", "cosine|linear|constant", OFF(train_schedule), "NAME",
     "Learning-rate decay after the warmup, down to min_lr_ratio * lr at the last step."},
    {"train.min_lr_ratio", LL_OPT_FLOAT, 0, 1, "0", NULL, OFF(train_min_lr_ratio), "X", "Final learning rate as a fraction of lr."},
    {"train.grad_accum", LL_OPT_INT, 1, 65536, "1", NULL, OFF(train_grad_accum), "N", "Micro-batches of `batch` sequences per optimizer step."},
    {"train.clip", LL_OPT_FLOAT, 0, 1e6, "1", NULL, OFF(train_clip), "X", "Global gradient-norm limit (0: no clipping)."},
    {"train.moe_aux_coef", LL_OPT_FLOAT, 0, 100, "0.01", NULL, OFF(train_moe_aux_coef), "X",
     "Mixture-of-experts models in full mode: the coefficient of the Switch-style load-balancing loss (0: none)."},
    {"train.weight_decay", LL_OPT_FLOAT, 0, 10, "0", NULL, OFF(train_weight_decay), "X", "AdamW's decoupled weight decay."},
    {"train.seed", LL_OPT_INT, 0, 9007199254740992.0, "42", NULL, OFF(train_seed), "N",
     "Adapter init, dropout masks and data order; with the thread count it fixes the run bit for bit."},
    {"train.eval_every", LL_OPT_INT, 0, 1e9, "50", NULL, OFF(train_eval_every), "N", "Steps between validation losses (0: never)."},
    {"train.eval_seqs", LL_OPT_INT, 0, 1e9, "32", NULL, OFF(train_eval_seqs), "N", "Validation sequences per evaluation (0: all)."},
    {"train.val_fraction", LL_OPT_FLOAT, 0, 0.5, "0.05", NULL, OFF(train_val_fraction), "X", "Share of documents held out for validation."},
    {"train.shuffle", LL_OPT_ENUM, 0, 0, "files", "files|pieces", OFF(train_shuffle), "HOW",
     "What each epoch shuffles in text files: files (each read in order, for fine-tuning on documents) or pieces (of about 4 KiB, so consecutive sequences come from different files: pre-training from scratch)."},
    {"train.on_thinking", LL_OPT_BOOL, 0, 1, "false", NULL, OFF(train_on_thinking), NULL,
     "Chat records: the assistant turns' <think>...</think> blocks (Qwen3's reasoning) count in the loss; by default they and the whitespace after them are left out, and the turn is learned from what follows them."},
    {"train.keep", LL_OPT_INT, 0, 1e6, "3", NULL, OFF(train_keep), "N", "Step checkpoints kept besides last.ckpt and best.ckpt (the newest on disk, earlier processes' too)."},
    {"train.max_skipped_steps", LL_OPT_INT, 0, 1e9, "50", NULL, OFF(train_max_skipped_steps), "N",
     "Steps skipped in a row for a non-finite loss or gradient that stop the run with an error, its checkpoints as they were (0: never)."},
    {"train.recompute", LL_OPT_BOOL, 0, 1, "false", NULL, OFF(train_recompute), NULL,
     "Recompute each layer's activations in the backward pass (less memory, more compute)."},
    {"train.share", LL_OPT_FLOAT, 0.01, 1, "0.25", NULL, OFF(train_share), "X",
     "Server: the share of the time training runs while requests are in flight (it pauses between layers for the rest; its threads also run at a lower priority, nice 5 at 0.25, 0 from 0.5); with no requests it takes all idle compute."},
    {NULL, 0, 0, 0, NULL, NULL, 0, NULL, NULL},
};

static const struct ll_option *find_opt(const char *name) {
  for (const struct ll_option *o = ll_options; o->name; o++)
    if (strcmp(o->name, name) == 0) return o;
  return NULL;
}

// ---- values ----

// Strict decimal number: [+-]digits[.digits][e[+-]digits], no leading blanks, no hex, no
// nan/inf (strtod alone would take all of those). *suffix points after the number; the caller
// decides which suffixes its type allows.
static int parse_number(const char *s, double *out, const char **suffix) {
  const char *p = s;
  size_t digits = 0;
  if (*p == '+' || *p == '-') p++;
  while (isdigit((unsigned char)*p)) p++, digits++;
  if (*p == '.')
    for (p++; isdigit((unsigned char)*p); p++) digits++;
  if (!digits) return -1;
  if ((*p == 'e' || *p == 'E') &&
      (isdigit((unsigned char)p[1]) || ((p[1] == '+' || p[1] == '-') && isdigit((unsigned char)p[2])))) {
    p += 2;
    while (isdigit((unsigned char)*p)) p++;
  }
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  // end != p: strtod read something else (a hex prefix "0x", a locale's decimal comma).
  if (end != p || errno == ERANGE || !isfinite(v)) return -1;
  *out = v;
  *suffix = p;
  return 0;
}

static int set_value(struct ll_config *c, const struct ll_option *o, const char *value, char *err, size_t errlen) {
  char *base = (char *)c + o->offset;
  const char *name = o->name;
  switch (o->type) {
  case LL_OPT_LIST: {
    // Comma-separated words of `choices` (spaces around them allowed), each at most once;
    // stored joined by commas in the order given.
    char out[256];
    size_t k = 0, vl = strlen(value);
    if (vl > 200) return ll_errf(err, errlen, LL_ELIMIT, "option '%s': list longer than 200 bytes", name);
    for (const char *p = value; *p;) {
      while (*p == ' ') p++;
      const char *e = p;
      while (*e && *e != ',') e++;
      const char *w = e;
      while (w > p && w[-1] == ' ') w--;
      const size_t l = (size_t)(w - p);
      int ok = 0;
      for (const char *ch = o->choices; *ch;) {
        const char *bar = strchr(ch, '|');
        size_t cl = bar ? (size_t)(bar - ch) : strlen(ch);
        if (cl == l && l && strncmp(ch, p, l) == 0) ok = 1;
        ch += cl + (bar ? 1 : 0);
      }
      if (!ok) return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%.*s' is not one of %s", name, (int)l, p, o->choices);
      for (const char *q = out; k && q < out + k;) { // a repeated word
        const char *qe = memchr(q, ',', (size_t)(out + k - q));
        if (!qe) qe = out + k;
        if ((size_t)(qe - q) == l && !strncmp(q, p, l)) return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%.*s' is listed twice", name, (int)l, p);
        q = qe + 1;
      }
      if (k) out[k++] = ',';
      memcpy(out + k, p, l);
      k += l;
      out[k] = 0;
      p = *e ? e + 1 : e;
      if (*e == ',' && !*p) return ll_errf(err, errlen, LL_EINVAL, "option '%s': empty item at the end of '%s'", name, value);
    }
    if (!k) return ll_errf(err, errlen, LL_EINVAL, "option '%s': the list is empty (choose from %s)", name, o->choices);
    char *dup = strdup(out);
    if (!dup) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
    free(*(char **)((char *)c + o->offset));
    *(char **)((char *)c + o->offset) = dup;
    return 0;
  }
  case LL_OPT_STRING:
  case LL_OPT_ENUM: {
    if (o->type == LL_OPT_ENUM) {
      int ok = 0;
      size_t vl = strlen(value);
      for (const char *p = o->choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == vl && strncmp(p, value, l) == 0) ok = 1;
        p += l + (bar ? 1 : 0);
      }
      if (!ok) return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%s' is not one of %s", name, value, o->choices);
    }
    if (strlen(value) > 4096) return ll_errf(err, errlen, LL_ELIMIT, "option '%s': value longer than 4096 bytes", name);
    char *dup;
    const char *home = getenv("HOME");
    // Paths: a leading "~/" is the home directory, as in a shell (YAML files cannot expand it).
    if (o->argname && (!strcmp(o->argname, "PATH") || !strcmp(o->argname, "DIR")) && !strncmp(value, "~/", 2) && home && *home) {
      size_t n = strlen(home) + strlen(value);
      if ((dup = malloc(n)) != NULL) snprintf(dup, n, "%s%s", home, value + 1);
    } else {
      dup = strdup(value);
    }
    if (!dup) return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
    free(*(char **)base);
    *(char **)base = dup;
    return 0;
  }
  case LL_OPT_BOOL: {
    static const char *t[] = {"true", "yes", "on", "1"}, *f[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
      if (strcasecmp(value, t[i]) == 0) return *(int *)base = 1, 0;
      if (strcasecmp(value, f[i]) == 0) return *(int *)base = 0, 0;
    }
    // A boolean with choices "auto" also takes that word: -1, decided later (e.g. by the model).
    if (o->choices && strcasecmp(value, o->choices) == 0) return *(int *)base = -1, 0;
    return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%s' is not a boolean (true/false%s%s)", name, value,
                   o->choices ? "/" : "", o->choices ? o->choices : "");
  }
  case LL_OPT_INT:
  case LL_OPT_FLOAT:
  case LL_OPT_SIZE:
  case LL_OPT_DURATION: {
    double v;
    const char *suf;
    if (parse_number(value, &v, &suf) != 0) {
      const char *what = o->type == LL_OPT_SIZE ? "a size (e.g. 4096, 64K, 1M)"
                         : o->type == LL_OPT_DURATION ? "a duration (e.g. 30, 500ms, 30s, 5m)"
                         : o->type == LL_OPT_INT ? "an integer" : "a number";
      return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%s' is not %s", name, value, what);
    }
    double mul = 1;
    if (o->type == LL_OPT_SIZE) {
      if (!*suf || !strcmp(suf, "B")) mul = 1;
      else if (!strcasecmp(suf, "K") || !strcasecmp(suf, "KiB") || !strcasecmp(suf, "KB")) mul = KIB;
      else if (!strcasecmp(suf, "M") || !strcasecmp(suf, "MiB") || !strcasecmp(suf, "MB")) mul = MIB;
      else if (!strcasecmp(suf, "G") || !strcasecmp(suf, "GiB") || !strcasecmp(suf, "GB")) mul = GIB;
      else return ll_errf(err, errlen, LL_EINVAL, "option '%s': unknown size suffix '%s' (K, M, G, KiB, MiB, GiB)", name, suf);
    } else if (o->type == LL_OPT_DURATION) {
      if (!*suf || !strcmp(suf, "s")) mul = 1;
      else if (!strcmp(suf, "ms")) mul = 1e-3;
      else if (!strcmp(suf, "m")) mul = 60;
      else if (!strcmp(suf, "h")) mul = 3600;
      else return ll_errf(err, errlen, LL_EINVAL, "option '%s': unknown time unit '%s' (ms, s, m, h)", name, suf);
    } else if (*suf) {
      return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%s' has trailing characters '%s'", name, value, suf);
    }
    v *= mul;
    if ((o->type == LL_OPT_INT || o->type == LL_OPT_SIZE) && v != floor(v))
      return ll_errf(err, errlen, LL_EINVAL, "option '%s': '%s' is not a whole number", name, value);
    if (v < o->min || v > o->max) {
      if (o->type == LL_OPT_SIZE || o->type == LL_OPT_INT)
        return ll_errf(err, errlen, LL_EINVAL, "option '%s': value %s out of range %.0f..%.0f", name, value, o->min, o->max);
      return ll_errf(err, errlen, LL_EINVAL, "option '%s': value %s out of range %g..%g", name, value, o->min, o->max);
    }
    if (o->type == LL_OPT_INT || o->type == LL_OPT_SIZE) *(int64_t *)base = (int64_t)v;
    else *(double *)base = v;
    return 0;
  }
  }
  return LL_EINVAL;
}

void ll_config_init(struct ll_config *c) {
  memset(c, 0, sizeof *c);
  char err[256];
  for (const struct ll_option *o = ll_options; o->name; o++)
    if (o->def) set_value(c, o, o->def, err, sizeof err); // the table's defaults are valid (tested)
}

void ll_config_free(struct ll_config *c) {
  for (const struct ll_option *o = ll_options; o->name; o++)
    if (o->type == LL_OPT_STRING || o->type == LL_OPT_ENUM || o->type == LL_OPT_LIST) {
      char **p = (char **)((char *)c + o->offset);
      free(*p);
      *p = NULL;
    }
}

int ll_config_set(struct ll_config *c, const char *name, const char *value, char *err, size_t errlen) {
  const struct ll_option *o = find_opt(name);
  if (!o) return ll_errf(err, errlen, LL_ENOTFOUND, "unknown option '%s'", name);
  return set_value(c, o, value, err, errlen);
}

// ---- YAML ----

// Closest option name (edit distance <= 3), for "did you mean".
static const char *suggest(const char *key) {
  const char *best = NULL;
  int bestd = 4;
  for (const struct ll_option *o = ll_options; o->name; o++) {
    const char *a = key, *b = o->name;
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) continue;
    int d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
      for (size_t j = 1; j <= lb; j++) {
        int m = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
        if (d[i - 1][j] + 1 < m) m = d[i - 1][j] + 1;
        if (d[i][j - 1] + 1 < m) m = d[i][j - 1] + 1;
        d[i][j] = m;
      }
    if (d[la][lb] < bestd) bestd = d[la][lb], best = o->name;
  }
  return best;
}

#define N_OPTIONS (sizeof ll_options / sizeof ll_options[0])

// Is `key` a section, i.e. do options "key.*" exist?
static int is_section(const char *key) {
  size_t kl = strlen(key);
  for (const struct ll_option *o = ll_options; o->name; o++)
    if (strncmp(o->name, key, kl) == 0 && o->name[kl] == '.') return 1;
  return 0;
}

static int is_null_scalar(const yaml_event_t *ev) {
  const char *v = (const char *)ev->data.scalar.value;
  return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && (!v[0] || !strcmp(v, "~") || !strcmp(v, "null"));
}

static int unknown_key(char *err, size_t errlen, const char *fname, size_t line, size_t col, const char *key) {
  const char *s = suggest(key);
  return ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: unknown key '%s'%s%s%s", fname, line, col, key, s ? " (did you mean '" : "",
                 s ? s : "", s ? "'?)" : "");
}

// A section may appear once, like any key (YAML forbids duplicate keys).
static int section_seen(char seen[][72], int *n, const char *key, char *err, size_t errlen, const char *fname, size_t line, size_t col) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(seen[i], key)) return ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: duplicate key '%s'", fname, line, col, key);
  if (*n < 8) snprintf(seen[(*n)++], 72, "%.71s", key);
  return 0;
}

// libyaml's event parser: no tree is built, and we stop at the first mapping deeper than a
// section or at any sequence/alias, so memory and nesting stay bounded whatever the input.
int ll_config_load_yaml(struct ll_config *c, const char *buf, size_t len, const char *fname, char *err, size_t errlen) {
  yaml_parser_t p;
  yaml_event_t ev;
  if (!fname) fname = "(config)";
  if (!yaml_parser_initialize(&p)) return ll_errf(err, errlen, LL_ENOMEM, "%s: cannot initialise the YAML parser", fname);
  yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
  int rc = 0, depth = 0, done = 0;   // depth: 0 stream/doc, 1 top mapping, 2 section mapping
  int expect_key = 1;
  char section[72] = "", key[160] = "";
  size_t key_line = 0, key_col = 0;
  unsigned char seen[N_OPTIONS] = {0}; // duplicate keys, by option index
  char seen_sec[8][72];                // duplicate sections ("train:" twice)
  int n_seen_sec = 0, n_docs = 0;
  int in_list = 0;          // inside the sequence of a list option
  char list_buf[256];
  size_t list_len = 0;
  while (!done) {
    if (!yaml_parser_parse(&p, &ev)) {
      size_t line = p.problem_mark.line + 1, col = p.problem_mark.column + 1;
      if (p.error == YAML_READER_ERROR) { // bad encoding: only a byte offset is known
        line = 1, col = 1;
        for (size_t i = 0; i < p.problem_offset && i < len; i++)
          if (buf[i] == '\n') line++, col = 1;
          else col++;
      }
      rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", fname, line, col, p.problem ? p.problem : "unknown",
                   p.context ? " " : "", p.context ? p.context : "");
      break;
    }
    size_t line = ev.start_mark.line + 1, col = ev.start_mark.column + 1;
    if (in_list) { // items of a list option: plain words until the sequence ends
      if (ev.type == YAML_SCALAR_EVENT) {
        const char *val = (const char *)ev.data.scalar.value;
        const size_t vl = ev.data.scalar.length;
        if (strlen(val) != vl || strchr(val, ',') || vl == 0 || list_len + vl + 2 > sizeof list_buf)
          rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s': bad list item '%.64s'", fname, line, col, key, val);
        else {
          if (list_len) list_buf[list_len++] = ',';
          memcpy(list_buf + list_len, val, vl + 1);
          list_len += vl;
        }
      } else if (ev.type == YAML_SEQUENCE_END_EVENT) {
        in_list = 0;
        expect_key = 1;
        char msg[512];
        if (set_value(c, find_opt(key), list_buf, msg, sizeof msg) != 0) rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: %s", fname, key_line, key_col, msg);
      } else {
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s': list items must be plain words", fname, line, col, key);
      }
      yaml_event_delete(&ev);
      if (rc) break;
      continue;
    }
    switch (ev.type) {
    case YAML_STREAM_END_EVENT:
      done = 1;
      break;
    case YAML_DOCUMENT_START_EVENT:
      if (++n_docs > 1) rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: only one YAML document is allowed", fname, line, col);
      break;
    case YAML_MAPPING_START_EVENT:
      if (depth == 0) {
        depth = 1;
        expect_key = 1;
      } else if (depth == 1 && !expect_key) {
        if (!is_section(key)) {
          if (find_opt(key))
            rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s' takes a single value, not a mapping", fname, key_line, key_col, key);
          else
            rc = unknown_key(err, errlen, fname, key_line, key_col, key);
          break;
        }
        if ((rc = section_seen(seen_sec, &n_seen_sec, key, err, errlen, fname, key_line, key_col)) != 0) break;
        snprintf(section, sizeof section, "%.63s", key);
        depth = 2;
        expect_key = 1;
      } else if (expect_key) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: a key must be a plain word, not a mapping", fname, line, col);
      } else {
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s' takes a single value, not a mapping (sections nest one level: 'train: {lora_rank: 8}')",
                     fname, key_line, key_col, key);
      }
      break;
    case YAML_MAPPING_END_EVENT:
      if (depth == 2) {
        depth = 1;
        section[0] = 0;
        expect_key = 1;
      } else {
        depth = 0;
      }
      break;
    case YAML_SEQUENCE_START_EVENT:
      if (depth > 0 && !expect_key && find_opt(key) && find_opt(key)->type == LL_OPT_LIST) {
        const size_t idx = (size_t)(find_opt(key) - ll_options);
        if (seen[idx]) {
          rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: duplicate key '%s'", fname, key_line, key_col, key);
          break;
        }
        seen[idx] = 1;
        in_list = 1;
        list_len = 0;
        list_buf[0] = 0;
      } else if (depth == 0 || expect_key)
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: lists are not allowed here (expected key: value)", fname, line, col);
      else if (!find_opt(key))
        rc = unknown_key(err, errlen, fname, key_line, key_col, key);
      else
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s': lists are not allowed here", fname, line, col, key);
      break;
    case YAML_ALIAS_EVENT:
      rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: YAML aliases are not supported", fname, line, col);
      break;
    case YAML_SCALAR_EVENT: {
      const char *val = (const char *)ev.data.scalar.value;
      if (depth == 0) {
        if (is_null_scalar(&ev)) break; // an empty document: nothing set
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: expected a mapping of options (key: value)", fname, line, col);
        break;
      }
      if (expect_key) {
        // Bounded: no option name is this long, so a longer key is simply unknown.
        if (ev.data.scalar.length >= 64 || strlen(val) != ev.data.scalar.length) {
          rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: unknown key '%.64s'", fname, line, col, val);
          break;
        }
        snprintf(key, sizeof key, "%.63s%s%.63s", section, section[0] ? "." : "", val);
        key_line = line, key_col = col;
        expect_key = 0;
        break;
      }
      expect_key = 1;
      const struct ll_option *o = find_opt(key);
      if (!o && depth == 1 && is_section(key)) {
        if (is_null_scalar(&ev)) { // "train:" with nothing under it sets nothing
          rc = section_seen(seen_sec, &n_seen_sec, key, err, errlen, fname, key_line, key_col);
          break;
        }
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: '%s' is a section; its keys go below it (%s: {key: value})", fname, line, col, key,
                     key);
        break;
      }
      if (!o) {
        rc = unknown_key(err, errlen, fname, key_line, key_col, key);
        break;
      }
      size_t idx = (size_t)(o - ll_options);
      if (seen[idx]) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: duplicate key '%s'", fname, key_line, key_col, key);
        break;
      }
      seen[idx] = 1;
      if (is_null_scalar(&ev)) {
        if (o->type != LL_OPT_STRING && o->type != LL_OPT_LIST) { // a list without a default may be unset (~) too
          rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s' needs a value", fname, line, col, key);
          break;
        }
        char **ps = (char **)((char *)c + o->offset);
        free(*ps);
        *ps = NULL;
        break;
      }
      if (strlen(val) != ev.data.scalar.length) {
        rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: option '%s': NUL byte in the value", fname, line, col, key);
        break;
      }
      char msg[512];
      if (set_value(c, o, val, msg, sizeof msg) != 0) rc = ll_errf(err, errlen, LL_EFORMAT, "%s:%zu:%zu: %s", fname, line, col, msg);
      break;
    }
    default:
      break;
    }
    yaml_event_delete(&ev);
    if (rc) break;
  }
  yaml_parser_delete(&p);
  return rc;
}

int ll_config_load_file(struct ll_config *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  char *buf = malloc((1u << 20) + 1);
  if (!buf) {
    fclose(f);
    return ll_errf(err, errlen, LL_ENOMEM, "out of memory");
  }
  size_t n = fread(buf, 1, (1u << 20) + 1, f);
  int rerr = ferror(f) ? (errno ? errno : EIO) : 0; // e.g. EISDIR: fopen opens a directory
  fclose(f);
  int rc;
  if (rerr) rc = ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(rerr));
  else if (n > (1u << 20)) rc = ll_errf(err, errlen, LL_ELIMIT, "%s: larger than 1 MiB; not a configuration file", path);
  else rc = ll_config_load_yaml(c, buf, n, path, err, errlen);
  free(buf);
  return rc;
}

// ---- command line ----

static void flag_of(const struct ll_option *o, char *out, size_t cap) {
  size_t k = 0;
  for (const char *p = o->name; *p && k + 1 < cap; p++) out[k++] = (*p == '.' || *p == '_') ? '-' : *p;
  out[k] = 0;
}

static const struct ll_option *opt_by_flag(const char *flag) { // flag without the leading "--"
  char f[96];
  for (const struct ll_option *o = ll_options; o->name; o++) {
    flag_of(o, f, sizeof f);
    if (!strcmp(f, flag)) return o;
  }
  return NULL;
}

int ll_config_parse_args(struct ll_config *c, int argc, char **argv, int *help, int *version, int *check, char *err, size_t errlen) {
  int dummy;
  if (!help) help = &dummy;
  if (!version) version = &dummy;
  if (!check) check = &dummy;
  // --config first, so the command line overrides the file whatever the order.
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *path = NULL;
    if (!strcmp(a, "--config")) {
      if (i + 1 >= argc) return ll_errf(err, errlen, LL_EINVAL, "option '--config' needs a value");
      path = argv[++i];
    } else if (!strncmp(a, "--config=", 9)) {
      path = a + 9;
    }
    if (path) {
      int rc = ll_config_load_file(c, path, err, errlen);
      if (rc) return rc;
    }
  }
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--config")) {
      i++;
      continue;
    }
    if (!strncmp(a, "--config=", 9)) continue;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      *help = 1;
      continue;
    }
    if (!strcmp(a, "--version")) {
      *version = 1;
      continue;
    }
    if (!strcmp(a, "--check-config")) {
      *check = 1;
      continue;
    }
    const char *name = NULL, *val = NULL;
    char flag[96];
    if (!strcmp(a, "-m")) name = "model";
    else if (!strcmp(a, "-t")) name = "threads";
    else if (!strcmp(a, "-c")) name = "ctx";
    else if (a[0] == '-' && a[1] == '-' && a[2]) {
      snprintf(flag, sizeof flag, "%s", a + 2);
      char *eq = strchr(flag, '=');
      if (eq) *eq = 0, val = a + 2 + (eq - flag) + 1;
      const struct ll_option *o = opt_by_flag(flag);
      if (!o && !strncmp(flag, "no-", 3) && (o = opt_by_flag(flag + 3)) && o->type == LL_OPT_BOOL && !val) {
        int rc = set_value(c, o, "false", err, errlen);
        if (rc) return rc;
        continue;
      }
      if (!o) return ll_errf(err, errlen, LL_EINVAL, "unknown option '%s' (see llsrv --help)", a);
      if (o->type == LL_OPT_BOOL && !val) {
        int rc = set_value(c, o, "true", err, errlen);
        if (rc) return rc;
        continue;
      }
      name = o->name;
    } else if (a[0] == '-' && a[1]) {
      return ll_errf(err, errlen, LL_EINVAL, "unknown option '%s' (see llsrv --help)", a);
    } else {
      return ll_errf(err, errlen, LL_EINVAL, "unexpected argument '%s' (options start with --; see llsrv --help)", a);
    }
    if (!val) {
      if (i + 1 >= argc) return ll_errf(err, errlen, LL_EINVAL, "option '%s' needs a value", a);
      val = argv[++i];
    }
    int rc = ll_config_set(c, name, val, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

// ---- help, man page, YAML out ----

static const char *type_name(const struct ll_option *o) {
  switch (o->type) {
  case LL_OPT_STRING: return "string";
  case LL_OPT_INT: return "integer";
  case LL_OPT_FLOAT: return "number";
  case LL_OPT_BOOL: return o->choices ? "boolean or auto" : "boolean";
  case LL_OPT_SIZE: return "size";
  case LL_OPT_DURATION: return "duration";
  case LL_OPT_ENUM: return "choice";
  case LL_OPT_LIST: return "list";
  }
  return "?";
}

static void range_text(const struct ll_option *o, char *out, size_t cap) {
  out[0] = 0;
  if (o->type == LL_OPT_ENUM || o->type == LL_OPT_LIST) snprintf(out, cap, "%s", o->choices);
  else if (o->type == LL_OPT_INT) snprintf(out, cap, "%.0f..%.0f", o->min, o->max);
  else if (o->type == LL_OPT_FLOAT) snprintf(out, cap, "%g..%g", o->min, o->max);
  else if (o->type == LL_OPT_SIZE) snprintf(out, cap, "%.0f..%.0f bytes", o->min, o->max);
  else if (o->type == LL_OPT_DURATION) snprintf(out, cap, "%g..%g s", o->min, o->max);
}

static const char *group_of(const struct ll_option *o) {
  if (!strncmp(o->name, "train.", 6)) return "training";
  if (o->offset >= OFF(listen) && o->offset <= OFF(monitor_hz)) return "network and limits";
  return "general";
}

void ll_config_print_help(FILE *f) {
  fprintf(f, "usage: llsrv [--model PATH] [--config FILE] [options]\n"
             "       llsrv COMMAND [options]   (generate, bench, perplexity, convert, tokenize, detokenize; llsrv help)\n\n"
             "Serves a model over the TCP line protocol (man 7 llsrv-protocol) with a monitor socket for lltop.\n"
             "Every option is also a YAML key of the --config file (man 5 llsrv.yaml); the command line wins.\n\n"
             "  --config FILE             load options from a YAML file\n"
             "  --check-config            print the resolved configuration and exit\n"
             "  -h, --help, --version\n");
  const char *groups[] = {"general", "network and limits", "training"};
  for (int g = 0; g < 3; g++) {
    fprintf(f, "\n%s:\n", groups[g]);
    for (const struct ll_option *o = ll_options; o->name; o++) {
      if (strcmp(group_of(o), groups[g])) continue;
      char flag[96], left[160], range[96];
      flag_of(o, flag, sizeof flag);
      snprintf(left, sizeof left, "--%s%s%s", flag, o->argname ? " " : "", o->argname ? o->argname : "");
      range_text(o, range, sizeof range);
      fprintf(f, "  %-28s %s", left, o->help);
      if (o->def || range[0]) {
        fprintf(f, " [");
        if (o->def) fprintf(f, "default %s", o->def);
        if (o->def && range[0] && o->type != LL_OPT_BOOL) fprintf(f, "; ");
        if (range[0] && o->type != LL_OPT_BOOL) fprintf(f, "%s", range);
        fprintf(f, "]");
      }
      fprintf(f, "\n");
    }
  }
  fprintf(f, "\nShort forms: -m = --model, -t = --threads, -c = --ctx. Booleans: --kv-f16, --no-kv-f16, --kv-f16=false.\n");
}

static void roff_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\e", f);
    else if (*s == '-') fputs("\\-", f);
    else fputc(*s, f);
  }
}

void ll_config_print_man_options(FILE *f) {
  const char *groups[] = {"general", "network and limits", "training"};
  for (int g = 0; g < 3; g++) {
    fprintf(f, ".SS %c%s\n", toupper((unsigned char)groups[g][0]), groups[g] + 1);
    for (const struct ll_option *o = ll_options; o->name; o++) {
      if (strcmp(group_of(o), groups[g])) continue;
      char flag[96], range[96];
      flag_of(o, flag, sizeof flag);
      range_text(o, range, sizeof range);
      fprintf(f, ".TP\n.B ");
      roff_escape(f, o->name);
      fprintf(f, "\n.RB ( \\-\\-");
      roff_escape(f, flag);
      fprintf(f, ") %s", type_name(o));
      if (range[0] && o->type != LL_OPT_BOOL) {
        fprintf(f, ", ");
        roff_escape(f, range);
      }
      fprintf(f, ", default ");
      if (o->def) roff_escape(f, o->def);
      else fprintf(f, "unset");
      fprintf(f, ".\n");
      roff_escape(f, o->help);
      fprintf(f, "\n");
    }
  }
}

// A double-quoted YAML scalar that libyaml reads back as the same string: quotes, backslashes,
// control characters and the code points YAML forbids or treats as line breaks are escaped.
// Bytes that are not UTF-8 (possible from the command line) become \xHH: loadable, if not equal.
static void yaml_scalar(FILE *f, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  fputc('"', f);
  while (*p) {
    unsigned ch = *p;
    uint32_t cp = ch;
    int n = ch < 0x80 ? 1 : (ch & 0xE0) == 0xC0 ? 2 : (ch & 0xF0) == 0xE0 ? 3 : (ch & 0xF8) == 0xF0 ? 4 : 0;
    int ok = n > 0;
    if (n > 1) cp = ch & (0x7F >> n);
    for (int i = 1; ok && i < n; i++) {
      if ((p[i] & 0xC0) != 0x80) ok = 0;
      else cp = cp << 6 | (p[i] & 0x3F);
    }
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)))
      ok = 0;
    if (!ok) {
      fprintf(f, "\\x%02x", ch);
      p++;
      continue;
    }
    int printable = (cp >= 0x20 && cp <= 0x7E) || (cp >= 0xA0 && cp <= 0xD7FF && cp != 0x2028 && cp != 0x2029) ||
                    (cp >= 0xE000 && cp <= 0xFFFD && cp != 0xFEFF) || cp >= 0x10000;
    if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (int)cp);
    else if (printable) fwrite(p, 1, (size_t)n, f);
    else if (cp <= 0xFF) fprintf(f, "\\x%02x", (unsigned)cp);
    else if (cp <= 0xFFFF) fprintf(f, "\\u%04x", (unsigned)cp);
    else fprintf(f, "\\U%08x", (unsigned)cp);
    p += n;
  }
  fputc('"', f);
}

// The shortest text that reads back as exactly v (0.001, not 0.0010000000000000000).
static void print_double(FILE *f, double v) {
  char b[40];
  if (v == floor(v) && fabs(v) < 1e15) { // whole numbers as such: 300, not 3e+02
    fprintf(f, "%.0f", v);
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(b, sizeof b, "%.*g", prec, v);
    if (strtod(b, NULL) == v) break;
  }
  fputs(b, f);
}

void ll_config_print_yaml(FILE *f, const struct ll_config *c) {
  int in_section = 0;
  for (const struct ll_option *o = ll_options; o->name; o++) {
    const char *dot = strchr(o->name, '.');
    const char *key = dot ? dot + 1 : o->name;
    if (dot && !in_section) {
      fprintf(f, "%.*s:\n", (int)(dot - o->name), o->name);
      in_section = 1;
    }
    const char *ind = dot ? "  " : "";
    const char *base = (const char *)c + o->offset;
    if (!strcmp(o->name, "auth_token")) { // never print a secret
      fprintf(f, "# %sauth_token: %s\n", ind, *(char *const *)base ? "(set)" : "~");
      continue;
    }
    fprintf(f, "%s%s: ", ind, key);
    switch (o->type) {
    case LL_OPT_STRING:
    case LL_OPT_ENUM: {
      const char *s = *(char *const *)base;
      if (s) yaml_scalar(f, s);
      else fputs("~", f);
      break;
    }
    case LL_OPT_LIST: { // [a, b]
      const char *s = *(char *const *)base;
      if (!s) { // unset (a list without a default)
        fputs("~", f);
        break;
      }
      fputc('[', f);
      for (; s && *s; s++) fputs(*s == ',' ? ", " : (char[2]){*s, 0}, f);
      fputc(']', f);
      break;
    }
    case LL_OPT_BOOL: fputs(*(const int *)base < 0 ? o->choices : *(const int *)base ? "true" : "false", f); break;
    case LL_OPT_INT:
    case LL_OPT_SIZE: fprintf(f, "%lld", (long long)*(const int64_t *)base); break;
    case LL_OPT_FLOAT:
    case LL_OPT_DURATION: print_double(f, *(const double *)base); break;
    }
    fputc('\n', f);
  }
}
