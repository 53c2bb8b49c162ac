// cmd_serve.c - `llsrv [serve] --model PATH ...`: load the configuration (one option table,
// config.c), open the engine, start the scheduler's compute thread, adapters and the training
// job, start the service (server.c: the listeners and the monitor socket on one libuv loop),
// print one start-up summary, run until SIGINT/SIGTERM, and tear down in order.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ll_cmd.h"
#include "ll_chat.h"
#include "ll_config.h"
#include "ll_demo.h"
#include "ll_error.h"
#include "ll_ftjobs.h"
#include "ll_log.h"
#include "ll_adapters.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_server.h"
#include "ll_trainjob.h"

static int adapter_index(struct ll_lora *const *out, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(out[i]->name, name) == 0) return i;
  return -1;
}

// The adapters of the `adapter` option, registered by file stem; the first is the default.
// One that cannot be used (missing, corrupt, made for another model) is reported and left
// out: the server serves the others, and requests naming it get ERR bad_adapter.
static int load_adapters(struct ll_server *srv, const char *list, struct ll_lora **out) {
  if (!list || !*list) return 0;
  struct ll_lora_dims d;
  ll_engine_lora_dims(srv->e, &d);
  char *copy = strdup(list), *save = NULL;
  const char *paths[LL_SCHED_MAX_ADAPTERS];
  int n = 0, first = 1;
  for (char *p = copy ? strtok_r(copy, ",", &save) : NULL; p; p = strtok_r(NULL, ",", &save)) {
    char err[768];
    struct ll_lora *a = NULL;
    if (n == LL_SCHED_MAX_ADAPTERS) {
      ll_log(LL_LOG_ERROR, "adapter %s: more than %d adapters; left out", p, LL_SCHED_MAX_ADAPTERS);
      continue;
    }
    if (ll_lora_load(&a, p, &d, ll_engine_backend(srv->e), err, sizeof err) != 0) {
      ll_log(LL_LOG_ERROR, "adapter %s; serving without it", err);
      first = 0;
      continue;
    }
    // Two files with the same stem (a/dup.gguf, b/dup.ckpt): the later one is served as dup-2
    // (dup-3, ...) and the log says so, so that neither is silently unreachable.
    int prev = adapter_index(out, n, a->name);
    if (prev >= 0) {
      char alt[sizeof a->name];
      for (int k = 2;; k++) { // ends: at most n names are taken
        snprintf(alt, sizeof alt, "%.56s-%d", a->name, k % 1000);
        if (adapter_index(out, n, alt) < 0) break;
      }
      ll_log(LL_LOG_WARN, "adapter %s: the name '%s' is already taken by %s; serving this one as '%s' (adapter=%s)", p, a->name, paths[prev],
             alt, alt);
      snprintf(a->name, sizeof a->name, "%s", alt);
    }
    int rc = strcmp(a->name, "none") == 0 || strcmp(a->name, "live") == 0 ? LL_EINVAL : ll_sched_adapter_register(srv->sched, a->name, a);
    if (rc) {
      ll_log(LL_LOG_ERROR, "adapter %s: its name '%s' cannot be used (reserved, or not [A-Za-z0-9._:-]); rename the file", p, a->name);
      ll_lora_free(a);
      continue;
    }
    if (first) ll_sched_adapter_default(srv->sched, a->name);
    ll_log(LL_LOG_INFO, "adapter '%s' from %s: rank %d, alpha %g, %lld parameters%s", a->name, p, a->rank, (double)a->alpha,
           (long long)a->n_params, first ? " (default for requests that name none)" : "");
    first = 0;
    paths[n] = p;
    out[n++] = a;
  }
  free(copy);
  return n;
}

// Opening the engine, on a worker thread while the HTTP API answers 503 (ll_server_load).
struct open_args {
  struct ll_engine **e;
  const struct ll_engine_params *ep;
  char *err;
  size_t errlen;
};

static int open_engine(void *arg) {
  struct open_args *a = arg;
  return ll_engine_open(a->e, a->ep, a->err, a->errlen);
}

static void fmt_bytes(char *out, size_t cap, double b) {
  if (b >= 1 << 30) snprintf(out, cap, "%.2f GiB", b / (1 << 30));
  else snprintf(out, cap, "%.1f MiB", b / (1 << 20));
}

int ll_cmd_serve(int argc, char **argv) {
  struct ll_config cfg;
  ll_config_init(&cfg);
  char err[1024];
  int help = 0, version = 0, check = 0;
  argc--, argv++; // argv[0] is "serve" or the program name
  int rc = ll_config_parse_args(&cfg, argc, argv, &help, &version, &check, err, sizeof err);
  if (help) {
    ll_config_print_help(stdout);
    ll_config_free(&cfg);
    return 0;
  }
  if (version) {
    printf("llsrv %s\n", LL_VERSION);
    ll_config_free(&cfg);
    return 0;
  }
  if (rc != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    ll_config_free(&cfg);
    return 2;
  }
  ll_log_set_level(ll_log_level_from_name(cfg.log_level) >= 0 ? ll_log_level_from_name(cfg.log_level) : LL_LOG_INFO);
  // Network safety rule, checked before anything is loaded: both listeners.
  const char *const addrs[2] = {cfg.listen, cfg.http};
  for (int i = 0; i < 2; i++) {
    if (!addrs[i] || !*addrs[i] || !strcmp(addrs[i], "off")) continue;
    char host[100];
    int port;
    if (ll_net_parse_listen(addrs[i], host, sizeof host, &port, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv: %s%s\n", i ? "http: " : "", err);
      ll_config_free(&cfg);
      return 2;
    }
    if (!ll_net_host_is_loopback(host) && !(cfg.auth_token && *cfg.auth_token)) {
      fprintf(stderr, "llsrv: refusing to %s on non-loopback address %s without auth_token: anyone who can reach it could "
                      "use the model. Set auth_token (clients then send %s) or listen on 127.0.0.1.\n",
              i ? "serve HTTP" : "listen", addrs[i], i ? "Authorization: Bearer TOKEN" : "AUTH :TOKEN");
      ll_config_free(&cfg);
      return 2;
    }
  }
  if (cfg.auth_token && !*cfg.auth_token) {
    free(cfg.auth_token);
    cfg.auth_token = NULL;
  }
  if (cfg.chat_template) { // refused before anything is loaded (and by --check-config); read again for the scheduler
    char *t = NULL;
    rc = ll_chat_template_load(cfg.chat_template, &t, err, sizeof err);
    free(t);
    if (rc != 0) {
      fprintf(stderr, "llsrv: %s\n", err);
      ll_config_free(&cfg);
      return 2;
    }
  }
  if (check) {
    ll_config_print_yaml(stdout, &cfg);
    fprintf(stderr, "llsrv: configuration OK\n");
    ll_config_free(&cfg);
    return 0;
  }

  char state_dir[1024], model_path[1200], sock_path[256];
  if (ll_state_dir_resolve(cfg.state_dir, state_dir, sizeof state_dir, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    ll_config_free(&cfg);
    return 1;
  }
  if (cfg.model) {
    snprintf(model_path, sizeof model_path, "%s", cfg.model);
  } else {
    if (ll_demo_model_ensure(state_dir, model_path, sizeof model_path, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv: %s\n", err);
      ll_config_free(&cfg);
      return 1;
    }
    ll_log(LL_LOG_INFO, "no --model given: serving the demo model %s (tiny Llama, byte-level vocabulary)", model_path);
  }
  if (cfg.socket) snprintf(sock_path, sizeof sock_path, "%s", cfg.socket);
  else if (ll_monitor_default_path(sock_path, sizeof sock_path, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    ll_config_free(&cfg);
    return 1;
  }

  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = model_path;
  ep.n_threads = (int)cfg.threads;
  ep.n_ctx = (int)cfg.ctx;
  ep.n_parallel = (int)cfg.parallel;
  ep.kv_f16 = cfg.kv_f16;
  ep.repack = cfg.repack;
  ep.batch_invariant = 1; // greedy outputs must not depend on which requests share a step
  ep.device = cfg.device;
  char cl_cache[1100];
  ep.cache_dir = ll_cmd_opencl_cache(state_dir, cfg.device, cl_cache, sizeof cl_cache);
  struct ll_server srv;
  ll_server_init(&srv, &cfg, model_path);
  struct open_args oa = {&srv.e, &ep, err, sizeof err};
  if (ll_server_load(&srv, open_engine, &oa, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    ll_server_close(&srv);
    ll_config_free(&cfg);
    return 1;
  }
  ll_engine_get_info(srv.e, &srv.info);
  struct ll_sched_params sp = {.prefill_chunk = (int)cfg.prefill_chunk};
  int exit_code = 1, n_adapters = 0;
  struct ll_lora *adapters[LL_SCHED_MAX_ADAPTERS];
  char *chat_tmpl = NULL;
  if (cfg.chat_template && ll_chat_template_load(cfg.chat_template, &chat_tmpl, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    goto out;
  }
  sp.chat_template = chat_tmpl;
  int sc = ll_sched_create(&srv.sched, srv.e, &sp, ll_server_notify, &srv, err, sizeof err);
  free(chat_tmpl); // the scheduler keeps its own copy
  if (sc != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    goto out;
  }
  n_adapters = load_adapters(&srv, cfg.adapter, adapters);
  { // hot-loading: the monitor's adapter load/unload, and the watched adapter_dir
    struct ll_lora_dims d;
    ll_engine_lora_dims(srv.e, &d);
    if (ll_adapters_create(&srv.adapters, srv.loop, srv.sched, &d, cfg.adapter_dir, cfg.adapter_dir_poll, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv: %s\n", err);
      goto out;
    }
  }
  // Background training: a job whenever the model can train (it has a tokenizer); it starts
  // at once with train.enabled, else on `train start` from the monitor socket.
  char run_dir[1400] = "";
  if (ll_engine_tokenizer(srv.e)) {
    const char *stem = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;
    if (cfg.train_checkpoint_dir) snprintf(run_dir, sizeof run_dir, "%s", cfg.train_checkpoint_dir);
    else snprintf(run_dir, sizeof run_dir, "%s/runs/%.*s", state_dir, (int)strcspn(stem, "."), stem);
    if (ll_trainjob_create(&srv.job, srv.e, srv.sched, &cfg, model_path, cfg.train_data ? cfg.train_data : ".", run_dir, cfg.train_enabled, err,
                           sizeof err) != 0) {
      fprintf(stderr, "llsrv: %s\n", err);
      goto out;
    }
  }
  // The fine-tuning API's files and jobs: jobs run on the training job's thread, ahead of the
  // configured run; the models of earlier processes' jobs are served again.
  {
    char ft_dir[1100], base_id[128];
    snprintf(ft_dir, sizeof ft_dir, "%s/fine_tuning", state_dir);
    ll_server_model_id(model_path, base_id, sizeof base_id);
    const struct ll_ftjobs_env fe = {ft_dir, base_id, model_path, &cfg, srv.e, srv.sched, srv.job, srv.loop};
    if (ll_ftjobs_open(&srv.ft, &fe, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv: %s\n", err);
      goto out;
    }
  }
  if (ll_server_listen(&srv, sock_path, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv: %s\n", err);
    goto out;
  }

  // One start-up summary.
  const struct ll_engine_info *in = &srv.info;
  char wb[32], kb[32];
  fmt_bytes(wb, sizeof wb, (double)in->weight_bytes);
  fmt_bytes(kb, sizeof kb, (double)in->kv_bytes);
  fprintf(stderr,
          "llsrv %s\n"
          "  model     %s (%s, %s, %.1fM parameters, %s)\n"
          "  context   %d positions x %d parallel sequences, vocabulary %d\n"
          "  device    %s: %s (%s), %d threads\n"
          "  memory    weights %s + KV cache %s (%s, %d blocks of %d)\n",
          LL_VERSION, in->name, in->arch, in->quant, in->n_params / 1e6, model_path, in->n_ctx, in->n_parallel, in->n_vocab,
          in->backend, in->device_name, in->device_reason, in->n_threads, wb, kb, in->kv_f16 ? "f16" : "f32", in->kv_blocks_total,
          LL_KV_BLOCK);
  if (in->n_expert > 0)
    fprintf(stderr, "  experts   %d per layer, %d per token: %.1fM expert parameters; %.1fM active per token (of %.1fM)\n", in->n_expert,
            in->n_expert_used, in->n_params_expert / 1e6, in->n_params_active / 1e6, in->n_params / 1e6);
  if (in->packed_bytes > 0) {
    char pb[32];
    fmt_bytes(pb, sizeof pb, (double)in->packed_bytes);
    fprintf(stderr, "  repack    %s more: the Q4_0, Q4_1, Q5_0 and Q8_0 matrices interleaved for decode (repack: false saves it)\n", pb);
  } else if (in->packed_failed) {
    fprintf(stderr, "  repack    off: no memory for the interleaved copies; decode reads the matrices as they are (slower)\n");
  }
  if (strcmp(in->backend, "cpu") != 0)
    fprintf(stderr, "  opencl    %s, driver %s, %s; %d compute units, %.1f GiB global (max buffer %.1f GiB), fp16 %s, subgroups %s,"
                    " integer dots %s; %.1f MiB allocated (weights resident)\n",
            in->device_vendor, in->device_driver, in->device_version, in->n_threads, in->device_mem_total / 1073741824.0,
            in->device_max_alloc / 1073741824.0, in->device_fp16 ? "yes" : "no", in->device_subgroups ? "yes" : "no", in->device_dot,
            in->device_mem_used / 1048576.0);
  if (srv.job && cfg.train_enabled)
    fprintf(stderr, "  training  %s %s on %s, %lld steps, checkpoints in %s (monitor: train pause|resume|stop, save)\n",
            cfg.train_mode ? cfg.train_mode : "lora", strcmp(cfg.train_mode ? cfg.train_mode : "lora", "full") ? "adapters (adapter=live)" : "weights",
            cfg.train_data ? cfg.train_data : ".", (long long)cfg.train_steps, run_dir);
  else if (srv.job)
    fprintf(stderr, "  training  off (monitor: train start; data %s, checkpoints in %s)\n", cfg.train_data ? cfg.train_data : ".", run_dir);
  else if (cfg.train_enabled)
    fprintf(stderr, "  training  unavailable: the model has no tokenizer\n");
  if (srv.job) {
    char td[700];
    ll_trainjob_describe(srv.job, td, sizeof td);
    const int64_t tdb = ll_trainjob_device_bytes(srv.job);
    if (tdb >= 0) fprintf(stderr, "  trainer   %s; %.1f MiB allocated\n", td, tdb / 1048576.0);
    else fprintf(stderr, "  trainer   %s\n", td);
  }
  if (srv.listen_addr[0]) fprintf(stderr, "  listening on %s%s\n", srv.listen_addr, cfg.auth_token ? " (AUTH required)" : "");
  else fprintf(stderr, "  TCP off (listen: off)\n");
  if (srv.http_addr[0]) fprintf(stderr, "  http      http://%s/v1 (OpenAI API%s; man 7 llsrv-http)\n", srv.http_addr, cfg.auth_token ? ", Bearer token required" : "");
  else fprintf(stderr, "  http      off (http: off)\n");
  fprintf(stderr, "  monitor   %s (lltop --socket %s)\n", srv.mon_path, srv.mon_path);
  if (srv.listen_addr[0]) {
    char host[100];
    int port = 0;
    ll_net_parse_listen(srv.listen_addr, host, sizeof host, &port, err, sizeof err);
    const int chat = ll_engine_tokenizer(srv.e) && ll_sched_chat_template(srv.sched);
    const int live = srv.job && cfg.train_enabled && strcmp(cfg.train_mode ? cfg.train_mode : "lora", "full") != 0;
    if (chat && live) {
      // The point of the LoRA run: the same question to the base model and to the adapter as
      // trained so far, then a look at the run and its adapter.
      fprintf(stderr,
              "  try       printf 'CHAT max_tokens=64 temperature=0 adapter=none :What is llsrv?\\nQUIT\\n' | nc %s %d   (the base model)\n"
              "            printf 'CHAT max_tokens=64 temperature=0 adapter=live :What is llsrv?\\nQUIT\\n' | nc %s %d   (the adapter as trained so far)\n"
              "            also: How do I watch training? / What does train.share do?\n"
              "  watch     %s --socket %s   (p pause/resume, s save, t stop, q quit)\n"
              "  export    %s export %s/last.ckpt adapter.gguf   (a GGUF LoRA for llama.cpp --lora)\n",
              host, port, host, port, access("build/tui/lltop", X_OK) == 0 ? "./build/tui/lltop" : "lltop", srv.mon_path,
              access("build/server/llsrv", X_OK) == 0 ? "./build/server/llsrv" : "llsrv", run_dir);
      if (srv.http_addr[0])
        fprintf(stderr,
                "  http      curl -s http://%s/v1/chat/completions -H 'Content-Type: application/json' -d "
                "'{\"model\":\"live\",\"max_tokens\":64,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"What is llsrv?\"}]}'%s\n",
                srv.http_addr, cfg.auth_token ? " -H 'Authorization: Bearer TOKEN'" : "");
    } else if (chat) {
      fprintf(stderr, "  try       printf 'CHAT max_tokens=64 :What is a llama?\\nQUIT\\n' | nc %s %d\n", host, port);
    } else {
      fprintf(stderr, "  try       printf 'GEN max_tokens=32 :Once upon a time\\n' | nc -q 5 %s %d\n", host, port);
    }
  }
  fflush(stderr);

  ll_server_run(&srv);
  // Joins the training thread and saves a running job's checkpoint (SIGTERM keeps the work);
  // when that save fails the work is lost: an error, logged before "stopped", and exit 1.
  exit_code = ll_trainjob_stop(srv.job) == 0 ? 0 : 1;
  ll_log(exit_code ? LL_LOG_ERROR : LL_LOG_INFO, "stopped%s", exit_code ? " (the training checkpoint failed: see above)" : "");
out:
  ll_trainjob_stop(srv.job); // an error path: a job started before it (a no-op once stopped)
  ll_ftjobs_stop(srv.ft);    // after the training thread: its last records written
  ll_sched_destroy(srv.sched); // joins the compute thread before the engine goes
  srv.sched = NULL;
  ll_trainjob_destroy(srv.job); // after the compute thread: requests may still have read its adapter
  srv.job = NULL;
  for (int i = 0; i < n_adapters; i++) ll_lora_free(adapters[i]); // before the engine's backend goes
  ll_ftjobs_release_adapters(srv.ft);
  struct ll_ftjobs *ft = srv.ft;
  srv.ft = NULL;
  ll_server_close(&srv); // sockets, handles, the loop
  ll_ftjobs_free(ft);    // after the loop's handles (its uv_async) are closed
  ll_adapters_free(srv.adapters); // its loads in progress ended with the loop
  ll_engine_close(srv.e);
  ll_config_free(&cfg);
  return exit_code;
}
