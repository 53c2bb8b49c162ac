// cmd_generate.c - `llsrv generate`: one-shot generation to stdout, streamed as tokens come.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_chat.h"
#include "ll_cmd.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_sample.h"
#include "ll_tokenizer.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void usage(FILE *f) {
  fprintf(f, "usage: llsrv generate --model M [-p TEXT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
             "                      [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--ids] [--no-bos]\n"
             "                      [-t THREADS] [--ctx N] [--kv-f32|--kv-f16] [--device D] [--ignore-eos] [--dump-logits K] [--chat]\n"
             "                      [--chat-template NAME|FILE] [--adapter A.gguf|A.ckpt|PEFT_DIR]\n"
             "Greedy when --temp 0. --ids prints token ids instead of text. A model without a tokenizer\n"
             "(llama2.c .bin) generates from BOS (id 1) when no prompt is given; -p then takes ids.\n"
             "--chat sends -p as a user message through the model's chat template (its text stays text);\n"
             "--chat-template (implies --chat) uses chatml, llama2, llama3, zephyr, gemma, phi3, qwen3 or a template file.\n"
             "--adapter applies a LoRA adapter (GGUF LoRA file, .ckpt with adapter tensors, PEFT directory).\n"
             "--dump-logits K prints the prompt ids and the K largest logits after the prompt to stderr.\n");
}

// Parses "1 2 3" into ids (for models without a tokenizer).
static int parse_ids(const char *s, int32_t *ids, int cap) {
  int n = 0;
  while (*s && n < cap) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s) break;
    ids[n++] = (int32_t)v;
    s = end;
  }
  return n;
}

// Prints the `generated`-th token: its id (ds NULL: --ids, or no tokenizer), else its text as
// far as the stream has whole UTF-8 characters.
static void print_token(const struct ll_tokenizer *tok, struct ll_detok_stream *ds, int32_t id, int generated) {
  char piece[1024];
  if (!ds || !tok) {
    printf(generated ? " %d" : "%d", id);
  } else {
    int k = ll_detok_stream_push(tok, ds, id, piece, sizeof piece);
    if (k > 0) fwrite(piece, 1, (size_t)k, stdout);
  }
  fflush(stdout);
}

int ll_cmd_generate(int argc, char **argv) {
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  struct ll_sampler_params sp;
  ll_sampler_params_default(&sp);
  const char *prompt = NULL, *adapter_path = NULL, *chat_template = NULL;
  struct ll_lora *adapter = NULL;
  int n_predict = 128, print_ids = 0, no_bos = 0, ignore_eos = 0, dump_logits = 0, chat = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
    if (ARG("--model") || ARG("-m")) ep.model_path = v;
    else if (ARG("-p") || ARG("--prompt")) prompt = v;
    else if (ARG("-n")) n_predict = atoi(v);
    else if (ARG("--temp")) sp.temperature = (float)atof(v);
    else if (ARG("--top-k")) sp.top_k = atoi(v);
    else if (ARG("--top-p")) sp.top_p = (float)atof(v);
    else if (ARG("--min-p")) sp.min_p = (float)atof(v);
    else if (ARG("--repeat-penalty")) sp.repeat_penalty = (float)atof(v);
    else if (ARG("--repeat-last-n")) sp.repeat_last_n = atoi(v);
    else if (ARG("--seed")) sp.seed = strtoull(v, NULL, 0);
    else if (ARG("-t") || ARG("--threads")) ep.n_threads = atoi(v);
    else if (ARG("--ctx") || ARG("-c")) ep.n_ctx = atoi(v);
    else if (ARG("--device")) ep.device = v;
    else if (ARG("--dump-logits")) dump_logits = atoi(v);
    else if (ARG("--adapter")) adapter_path = v;
    else if (ARG("--chat-template")) chat_template = v, chat = 1;
    else if (strcmp(a, "--ids") == 0) print_ids = 1;
    else if (strcmp(a, "--chat") == 0) chat = 1;
    else if (strcmp(a, "--no-bos") == 0) no_bos = 1;
    else if (strcmp(a, "--kv-f32") == 0) ep.kv_f16 = 0;
    else if (strcmp(a, "--kv-f16") == 0) ep.kv_f16 = 1;
    else if (strcmp(a, "--ignore-eos") == 0) ignore_eos = 1;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 0;
    else {
      fprintf(stderr, "llsrv generate: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef ARG
  }
  if (!ep.model_path || n_predict < 0) {
    usage(stderr);
    return 2;
  }
  char err[512], cache[1100];
  ep.cache_dir = ll_cmd_opencl_cache(NULL, ep.device, cache, sizeof cache);
  struct ll_engine *e;
  if (ll_engine_open(&e, &ep, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv generate: %s\n", err);
    return 1;
  }
  struct ll_engine_info info;
  ll_engine_get_info(e, &info);
  fprintf(stderr, "llsrv generate: device %s\n", info.device_reason);
  const struct ll_tokenizer *tok = ll_engine_tokenizer(e);
  const int V = ll_engine_n_vocab(e);
  int32_t *ids = malloc((size_t)info.n_ctx * sizeof *ids);
  float *logits = malloc((size_t)V * sizeof *logits);
  struct ll_sampler *smp = ll_sampler_new(&sp, V);
  int n_prompt = 0, rc = 1;
  char *rendered = NULL, *tmpl_text = NULL;
  struct ll_tok_span *marks = NULL;
  int n_marks = 0;
  if (!ids || !logits || !smp) goto out;
  if (chat) {
    // The same rendering as the server's CHAT: -p is one user message, and it stays text (only
    // the template's markers become control tokens).
    if (!tok) {
      fprintf(stderr, "llsrv generate: --chat needs a model with a tokenizer\n");
      goto out;
    }
    if (chat_template && ll_chat_template_load(chat_template, &tmpl_text, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv generate: %s\n", err);
      goto out;
    }
    const struct ll_chat_msg msg = {"user", prompt ? prompt : "", NULL};
    if (ll_chat_render_marked(tmpl_text ? tmpl_text : ll_tokenizer_chat_template(tok), &msg, 1, &rendered, &marks, &n_marks, err,
                              sizeof err) != 0) {
      fprintf(stderr, "llsrv generate: --chat: %s\n", err);
      goto out;
    }
    prompt = rendered;
  }
  if (tok) {
    const char *text = prompt ? prompt : "";
    int add_bos = !no_bos && ll_tokenizer_add_bos(tok);
    n_prompt = chat ? ll_tokenize_marked(tok, text, strlen(text), add_bos, marks, n_marks, ids, info.n_ctx)
                    : ll_tokenize(tok, text, strlen(text), add_bos, 1, ids, info.n_ctx);
    if (n_prompt < 0 || n_prompt > info.n_ctx) {
      fprintf(stderr, "llsrv generate: prompt of %d tokens does not fit the context of %d\n", n_prompt, info.n_ctx);
      goto out;
    }
    if (n_prompt == 0) ids[n_prompt++] = ll_tokenizer_bos(tok) >= 0 ? ll_tokenizer_bos(tok) : 0;
  } else {
    if (!no_bos || !prompt) ids[n_prompt++] = 1; // llama2.c convention: BOS = 1 (--no-bos: the given ids only)
    if (prompt) n_prompt += parse_ids(prompt, ids + n_prompt, info.n_ctx - 1);
  }
  if (n_prompt + n_predict > info.n_ctx) n_predict = info.n_ctx - n_prompt;
  int seq = ll_engine_seq_new(e);
  if (adapter_path) {
    struct ll_lora_dims d;
    ll_engine_lora_dims(e, &d);
    if (ll_lora_load(&adapter, adapter_path, &d, ll_engine_backend(e), err, sizeof err) != 0 ||
        ll_engine_seq_set_adapter(e, seq, adapter, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv generate: adapter %s\n", err);
      goto out;
    }
    fprintf(stderr, "llsrv generate: adapter '%s': rank %d, alpha %g, %lld parameters\n", adapter->name, adapter->rank, (double)adapter->alpha,
            (long long)adapter->n_params);
  }
  // Plain greedy: the argmax is taken where the logits are (on a device, only the id comes back).
  const int greedy = ll_sampler_is_greedy(smp) && dump_logits <= 0;
  // Top-k sampling and penalties (ll_sampler_dev_ok): the sampler's chain where the logits are too,
  // its draw and penalty list made here before the step (ll_sampler_dev_next); the same ids as
  // sampling from the logits.
  const int devs = !greedy && dump_logits <= 0 && ll_sampler_dev_ok(smp), by_id = greedy || devs;
  struct ll_sample_dev sd;
  int32_t am = 0;
  double t0 = now_ms();
  for (int i = 0; i < n_prompt; i++) ll_sampler_accept(smp, ids[i]);
  for (int off = 0; off < n_prompt; off += 512) {
    int n = n_prompt - off < 512 ? n_prompt - off : 512;
    if (devs && off + n == n_prompt && (!ll_sampler_dev_next(smp, &sd) || ll_engine_seq_set_sample(e, seq, &sd) != 0)) goto out;
    struct ll_batch_item it = {seq, n, ids + off, off + n == n_prompt ? 1 : 0, by_id ? NULL : logits, by_id ? &am : NULL};
    if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv generate: %s\n", err);
      goto out;
    }
  }
  double t1 = now_ms();
  struct ll_backend_info x1;
  ll_engine_backend(e)->i->get_info(ll_engine_backend(e), &x1);
  if (dump_logits > 0) {
    fprintf(stderr, "prompt_ids:");
    for (int i = 0; i < n_prompt; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\ntop_logits:");
    for (int r = 0; r < dump_logits && r < V; r++) { // selection: K is small
      int best = -1;
      for (int v = 0; v < V; v++)
        if (logits[v] > -INFINITY && (best < 0 || logits[v] > logits[best])) best = v;
      if (best < 0) break;
      fprintf(stderr, " %d:%.6f", best, logits[best]);
      logits[best] = -INFINITY; // restored below
    }
    fprintf(stderr, "\n");
    rc = 0;
    goto out; // logits were consumed: the dump is a diagnostic run only
  }
  struct ll_detok_stream ds;
  ll_detok_stream_init(&ds);
  int generated = 0;
  char piece[1024];
  // Decode steps queued one behind the other (ll_engine_decode_queue, a device backend): step g
  // takes token g from the device, where step g - 1 chose it, so step g + 1 is queued before step
  // g's id reaches the host and the device never waits for the host between steps. The host
  // handles each id one step behind: a stop (EOS) leaves one step queued past it, undone
  // (ll_engine_seq_truncate). Not with penalties (the next step's window needs this step's id).
  const int ahead = by_id && (greedy || ll_sampler_dev_ahead(smp)) && ll_engine_queue_ok(e);
  int32_t cur = am;
  if (ahead && n_predict > 1) {
    if ((devs && (!ll_sampler_dev_next(smp, &sd) || ll_engine_seq_set_sample(e, seq, &sd) != 0)) || ll_engine_decode_queue(e, &seq, &cur, 1, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv generate: %s\n", err);
      goto out;
    }
  }
  for (; ahead && generated < n_predict; generated++) { // step `generated` is queued (unless it is the last token)
    const int32_t next = cur;
    ll_sampler_accept(smp, next);
    if (!ignore_eos && tok && ll_tokenizer_is_eog(tok, next)) break;
    print_token(tok, print_ids ? NULL : &ds, next, generated);
    if (generated + 1 == n_predict) {
      generated++;
      break;
    }
    if (generated + 2 < n_predict) { // the step after, behind this one (not for the last token)
      if (devs && (!ll_sampler_dev_next(smp, &sd) || ll_engine_seq_set_sample(e, seq, &sd) != 0)) goto out;
      if (ll_engine_decode_queue(e, &seq, NULL, 1, err, sizeof err) != 0) {
        fprintf(stderr, "\nllsrv generate: %s\n", err);
        goto out;
      }
    }
    if (ll_engine_decode_collect(e, &cur, 1, err, sizeof err) != 1) {
      fprintf(stderr, "\nllsrv generate: %s\n", err);
      goto out;
    }
  }
  if (ahead && ll_engine_decode_pending(e) > 0) { // the step queued past the stop: undone
    int32_t drop;
    if (ll_engine_decode_collect(e, &drop, 1, err, sizeof err) != 1 || ll_engine_seq_truncate(e, seq, ll_engine_seq_len(e, seq) - 1) != 0) {
      fprintf(stderr, "\nllsrv generate: %s\n", err);
      goto out;
    }
  }
  for (; !ahead && generated < n_predict; generated++) {
    int32_t next = by_id ? am : ll_sampler_sample(smp, logits, NULL);
    ll_sampler_accept(smp, next);
    if (!ignore_eos && tok && ll_tokenizer_is_eog(tok, next)) break;
    print_token(tok, print_ids ? NULL : &ds, next, generated);
    if (generated + 1 == n_predict) {
      generated++;
      break;
    }
    if (devs && (!ll_sampler_dev_next(smp, &sd) || ll_engine_seq_set_sample(e, seq, &sd) != 0)) goto out;
    struct ll_batch_item it = {seq, 1, &next, 1, by_id ? NULL : logits, by_id ? &am : NULL};
    if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) {
      fprintf(stderr, "\nllsrv generate: %s\n", err);
      goto out;
    }
  }
  if (tok && !print_ids) {
    int k = ll_detok_stream_finish(&ds, piece, sizeof piece);
    if (k > 0) fwrite(piece, 1, (size_t)k, stdout);
  }
  printf("\n");
  fflush(stdout); // the text ends before the timing line on stderr
  double t2 = now_ms();
  fprintf(stderr, "llsrv generate: prompt %d tokens in %.1f ms (%.1f tok/s), generated %d tokens in %.1f ms (%.1f tok/s)\n", n_prompt,
          t1 - t0, n_prompt * 1000.0 / (t1 - t0 + 1e-9), generated, t2 - t1, generated > 1 ? (generated - 1) * 1000.0 / (t2 - t1 + 1e-9) : 0.0);
  struct ll_backend_info x2;
  ll_engine_backend(e)->i->get_info(ll_engine_backend(e), &x2);
  if (generated > 1 && strcmp(x2.name, "cpu") != 0) // a decode step's traffic between host and device
    fprintf(stderr,
            "llsrv generate: device transfers per decode step: %.0f bytes up, %.0f bytes down, %.1f waits, %.1f launches (%.2f per layer; %s tier, integer dots %s, "
            "sampling %s), %.0f kernel arguments set, %.2f idle waits (steps %s)\n",
            (double)(x2.bytes_up - x1.bytes_up) / (generated - 1), (double)(x2.bytes_down - x1.bytes_down) / (generated - 1),
            (double)(x2.waits - x1.waits) / (generated - 1), (double)(x2.launches - x1.launches) / (generated - 1),
            (double)(x2.launches - x1.launches) / (generated - 1) / (info.n_layer > 0 ? info.n_layer : 1), x2.tier, x2.dot,
            greedy ? "greedy on the device" : devs ? "by the chain on the device" : "on the host", (double)(x2.arg_sets - x1.arg_sets) / (generated - 1),
            (double)(x2.idle_waits - x1.idle_waits) / (generated - 1), ahead ? "queued ahead" : "one at a time");
  rc = 0;
out:
  free(rendered);
  free(tmpl_text);
  free(marks);
  ll_sampler_free(smp);
  free(ids);
  free(logits);
  ll_lora_free(adapter); // before the engine: its memory belongs to the engine's backend
  ll_engine_close(e);
  return rc;
}
