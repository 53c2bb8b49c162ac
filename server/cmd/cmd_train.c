// cmd_train.c - `llsrv train` (foreground training with a progress line) and `llsrv init`
// (a randomly initialised Llama .ckpt to train from scratch).
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ll_cmd.h"
#include "ll_config.h"
#include "ll_demo.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_model.h"
#include "ll_modelfile.h"
#include "ll_train_run.h"
#include "ll_train_world.h"
#include "ll_trainer.h"

static volatile sig_atomic_t g_stop;
// Who speaks in messages: "llsrv train", or with several ranks "llsrv train [rank R/N]".
static char g_who[64] = "llsrv train";
static void on_signal(int sig) { g_stop = sig; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void train_usage(FILE *f) {
  fprintf(f, "usage: llsrv train --model M --data PATH [--config lora.yaml] [-t N] [options] -o RUN_DIR\n"
             "Trains LoRA adapters (or every weight of a float model: --mode full) in the foreground.\n"
             "Options: every key of the config's train: section as --KEY VALUE (--lora-rank 8, --steps 200,\n"
             "--lr 1e-4, --lora-targets q,v, --seq-len 256, --batch 1, --grad-accum 4, --recompute, ...),\n"
             "  --dry-run       print the pre-flight check (data, steps per epoch, memory, time per step) and exit\n"
             "  --restart       start over even if RUN_DIR holds a run (default: resume from RUN_DIR/last.ckpt)\n"
             "  --log-every N   progress lines every N steps when stdout is not a terminal (default 10)\n"
             "  --device D, --ctx N (engine options)\n"
             "  --world auto|mpi|off  data parallelism over MPI (mpirun -np N llsrv train ...): auto (default)\n"
             "                  joins the MPI job when an MPI launcher started llsrv, mpi requires it\n"
             "  --reduce ordered|allreduce  how ranks sum gradients: in rank order, bit-exact (default), or\n"
             "                  MPI_Allreduce (the MPI library's order)\n"
             "  --loss-log FILE  one line per step: step, loss, validation loss, gradient norm, learning rate,\n"
             "                  at full precision (%%.17g; for comparing runs)\n"
             "  --chat-template NAME|FILE  chat records' template over the model's (chatml, llama2, llama3,\n"
             "                  zephyr, gemma, phi3, or a template file)\n"
             "RUN_DIR gets last.ckpt, best.ckpt and the last `keep` step checkpoints; SIGINT/SIGTERM save one\n"
             "and stop. See llsrv(1) TRAINING.\n");
}

static void fmt_eta(char *b, size_t cap, double s) {
  if (!isfinite(s) || s < 0) snprintf(b, cap, "?");
  else if (s >= 3600) snprintf(b, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
  else if (s >= 60) snprintf(b, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
  else snprintf(b, cap, "%.0fs", s);
}

int ll_cmd_train(int argc, char **argv) {
  struct ll_config c;
  ll_config_init(&c);
  char err[1024];
  const char *run_dir = NULL;
  int dry = 0, restart = 0, rc = 0, status = 1;
  int64_t log_every = 10;
  const char *world_opt = "auto", *reduce_opt = "ordered", *loss_log = NULL;
  FILE *loss_f = NULL;
  struct ll_train_world *world = NULL;
  // --config first, so flags override it whatever the order.
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--config") && i + 1 < argc) {
      if ((rc = ll_config_load_file(&c, argv[i + 1], err, sizeof err))) {
        fprintf(stderr, "%s: %s\n", g_who, err);
        ll_config_free(&c);
        return 2;
      }
    }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      train_usage(stdout);
      ll_config_free(&c);
      return 0;
    }
    if (!strcmp(a, "--config")) { i++; continue; }
    if (!strcmp(a, "--dry-run")) { dry = 1; continue; }
    if (!strcmp(a, "--restart")) { restart = 1; continue; }
    const char *name = NULL;
    if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && v) { run_dir = v, i++; continue; }
    if (!strcmp(a, "--world") && v) { world_opt = v, i++; continue; }
    if (!strcmp(a, "--reduce") && v) { reduce_opt = v, i++; continue; }
    if (!strcmp(a, "--loss-log") && v) { loss_log = v, i++; continue; }
    if (!strcmp(a, "--log-every") && v) { log_every = atoll(v) > 0 ? atoll(v) : 10, i++; continue; }
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) name = "model";
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) name = "threads";
    else if (!strcmp(a, "--data")) name = "train.data";
    else if (!strcmp(a, "--device")) name = "device";
    else if (!strcmp(a, "--chat-template")) name = "chat_template";
    if (!name && !strncmp(a, "--", 2)) {
      // --lora-rank -> train.lora_rank (also --train-lora-rank); a boolean may stand alone (--recompute, --no-recompute)
      char key[96];
      const char *f = a + 2;
      int neg = 0;
      if (!strncmp(f, "train-", 6)) f += 6;
      if (!strncmp(f, "no-", 3)) f += 3, neg = 1;
      snprintf(key, sizeof key, "train.%s", f);
      for (char *p = key; *p; p++) if (*p == '-') *p = '_';
      const struct ll_option *o = NULL;
      for (const struct ll_option *q = ll_options; q->name; q++) if (!strcmp(q->name, key)) o = q;
      if (o && o->type == LL_OPT_BOOL && (neg || !v || !strncmp(v, "--", 2))) {
        rc = ll_config_set(&c, key, neg ? "false" : "true", err, sizeof err);
        if (rc) goto usage_err;
        continue;
      }
      if (o && !neg) {
        if (!v) { snprintf(err, sizeof err, "option '%s' needs a value", a); goto usage_err; }
        if ((rc = ll_config_set(&c, key, v, err, sizeof err))) goto usage_err;
        i++;
        continue;
      }
      snprintf(err, sizeof err, "unknown option '%s' (llsrv train --help)", a);
      goto usage_err;
    }
    if (!name) { snprintf(err, sizeof err, "unexpected argument '%s'", a); goto usage_err; }
    if (!v) { snprintf(err, sizeof err, "option '%s' needs a value", a); goto usage_err; }
    if ((rc = ll_config_set(&c, name, v, err, sizeof err))) goto usage_err;
    i++;
  }
  if (!c.model) { snprintf(err, sizeof err, "no model (--model M)"); goto usage_err; }
  if (!c.train_data) { snprintf(err, sizeof err, "no data (--data PATH or train.data)"); goto usage_err; }
  if (!run_dir) run_dir = c.train_checkpoint_dir;
  if (!run_dir && !dry) { snprintf(err, sizeof err, "no run directory (-o RUN_DIR or train.checkpoint_dir)"); goto usage_err; }

  struct ll_trainer_params tp;
  if ((rc = ll_train_params_from_config(&c, &tp, err, sizeof err))) goto usage_err;
  // Data parallelism: join the MPI job mpirun started (or refuse to run N copies that would
  // each train alone into the same directory).
  int reduce = !strcmp(reduce_opt, "ordered") ? LL_REDUCE_ORDERED : !strcmp(reduce_opt, "allreduce") ? LL_REDUCE_ALLREDUCE : -1;
  if (reduce < 0) { snprintf(err, sizeof err, "--reduce: '%s' is not ordered or allreduce", reduce_opt); goto usage_err; }
  if (strcmp(world_opt, "auto") && strcmp(world_opt, "mpi") && strcmp(world_opt, "off")) {
    snprintf(err, sizeof err, "--world: '%s' is not auto, mpi or off", world_opt);
    goto usage_err;
  }
  char launched[96];
  const int under_mpi = ll_train_world_launched(launched, sizeof launched);
  if (!strcmp(world_opt, "mpi") || (!strcmp(world_opt, "auto") && under_mpi)) {
    if (!ll_train_world_built()) {
      fprintf(stderr, "llsrv train: --world %s%s%s: MPI is not built in (install libopenmpi-dev and rebuild: CMake's FindMPI enables it)\n",
              world_opt, under_mpi ? ", launched by MPI: " : "", under_mpi ? launched : "");
      ll_config_free(&c);
      return 2;
    }
    if ((rc = ll_train_world_open(&world, reduce, err, sizeof err))) {
      fprintf(stderr, "llsrv train: %s\n", err);
      ll_config_free(&c);
      return 1;
    }
  }
  const int rank = ll_train_world_rank(world), n_ranks = ll_train_world_size(world);
  struct ll_train_comm comm;
  ll_train_world_comm(world, &comm);
  if (n_ranks > 1) {
    snprintf(g_who, sizeof g_who, "llsrv train [rank %d/%d]", rank, n_ranks);
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "%s: pid %d on %s\n", g_who, (int)getpid(), host);
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) { // rank 0 alone prints progress
      fprintf(stderr, "%s: /dev/null: %s\n", g_who, strerror(errno));
      ll_train_world_abort(world, 1);
    }
  }

  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = c.model;
  ep.n_threads = (int)c.threads;
  ep.device = c.device;
  ep.n_ctx = (int)c.train_seq_len; // the engine's KV cache is not used by training: keep it small
  ep.repack = 0;                   // training multiplies batches (no decode to stream): no second copy
  struct ll_engine *e = NULL;
  struct ll_train_run *run = NULL;
  struct ll_backend *cpu_be = NULL; // the trainer's, when the device cannot hold its buffers
  if ((rc = ll_engine_open(&e, &ep, err, sizeof err))) {
    fprintf(stderr, "%s: %s\n", g_who, err);
    goto out;
  }
  struct ll_engine_info info;
  ll_engine_get_info(e, &info);
  if (rank == 0)
    fprintf(stderr, "model: %s (%s, %s, %lld parameters), %s: %s, %d threads\n", info.name, info.arch, info.quant, (long long)info.n_params,
          info.backend, info.device_name, info.n_threads);
  struct ll_train_run_opts ro = {run_dir ? run_dir : "(dry run)", c.train_data, c.model, info.arch, c.train_checkpoint_every, c.train_eval_every,
                                 c.train_eval_seqs, c.train_keep, c.train_val_fraction, restart || dry, c.chat_template,
                                 c.train_max_skipped_steps, c.train_shuffle && !strcmp(c.train_shuffle, "pieces"), &comm, c.train_on_thinking};
  // This backend serves nothing else: quantized products of training batches may take
  // dequantize + sgemm where that beats the integer tiles (ll_backend.train_sgemm; CPUs without
  // AVX-512 VNNI). The server's training thread sets it on its own backend too (trainjob.c); the
  // serving backend never does: it decodes batch-invariantly.
  struct ll_backend *be = ll_engine_backend(e);
  be->train_sgemm = 1;
  rc = ll_train_run_open(&run, ll_engine_model(e), be, ll_engine_tokenizer(e), &tp, &ro, err, sizeof err);
  if (rc == LL_ENOMEM && !ll_backend_host_buffers(be)) { // the device holds the weights but not the run: the CPU trains
    fprintf(stderr, "%s: on the CPU: the device cannot hold the training buffers: %s\n", g_who, err);
    char cerr[256];
    if ((rc = ll_trainer_cpu_backend(&cpu_be, be, (int)c.threads, cerr, sizeof cerr))) {
      fprintf(stderr, "%s: %s\n", g_who, cerr);
      goto out;
    }
    be = cpu_be;
    rc = ll_train_run_open(&run, ll_engine_model(e), be, ll_engine_tokenizer(e), &tp, &ro, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "%s: %s\n", g_who, err);
    goto out;
  }
  char desc[4096];
  ll_train_run_describe(run, desc, sizeof desc);
  fputs(desc, stdout);
  struct ll_trainer *tr = ll_train_run_trainer(run);
  if (dry) {
    // Time per step: one real micro-batch forward + backward (no update), times grad_accum.
    struct ll_train_source *src = ll_train_run_source(run);
    const int T = tp.batch * tp.seq_len;
    int32_t *ids = malloc((size_t)T * sizeof *ids), *tg = malloc((size_t)T * sizeof *tg);
    double loss = 0, t0 = 0, t1 = 0;
    rc = ids && tg ? 0 : LL_ENOMEM;
    for (int b = 0; b < tp.batch && rc == 0; b++) {
      int r = src->next(src->user, ids + (size_t)b * tp.seq_len, tg + (size_t)b * tp.seq_len, err, sizeof err);
      if (r < 0) rc = r;
    }
    if (rc == 0) {
      t0 = now_s();
      rc = ll_trainer_forward_backward(tr, ids, tg, tp.batch, 1, 1.0f, &loss, NULL, err, sizeof err);
      t1 = now_s();
    }
    free(ids), free(tg);
    if (rc) {
      fprintf(stderr, "%s: %s\n", g_who, err);
      goto out;
    }
    const double step_s = (t1 - t0) * tp.grad_accum;
    char eta[32];
    fmt_eta(eta, sizeof eta, step_s * (double)tp.steps);
    printf("time: %.2f s per step (one micro-batch measured: %.0f tokens/s), %s for %lld steps\n", step_s, T / (t1 - t0), eta,
           (long long)tp.steps);
    status = 0;
    goto out;
  }
  for (const char *nt = ll_train_run_notes(run); *nt;) { // skipped damaged checkpoints, stale files removed
    const size_t l = strcspn(nt, "\n");
    fprintf(stderr, "%s: %.*s\n", g_who, (int)l, nt);
    nt += l + (nt[l] == '\n');
  }
  if (ll_train_run_resumed_from(run) >= 0) printf("resuming %s at step %lld\n", ll_train_run_resumed_path(run), (long long)ll_train_run_resumed_from(run));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGXFSZ, SIG_IGN); // a file-size limit fails a checkpoint's write (EFBIG), handled as a full disk is
  const int tty = isatty(STDOUT_FILENO);
  if (loss_log && rank == 0 && !(loss_f = fopen(loss_log, "a"))) {
    fprintf(stderr, "%s: --loss-log %s: %s\n", g_who, loss_log, strerror(errno));
    goto out;
  }
  double val = NAN;
  if (ll_train_run_resumed_from(run) < 0 && c.train_eval_every > 0) { // where the curve starts
    rc = ll_train_run_eval(run, &val, err, sizeof err);
    if (isfinite(val)) printf("step 0/%lld  val %.4f\n", (long long)tp.steps, val);
    if (rc && isfinite(val)) // evaluated, but best.ckpt could not be written: as any checkpoint that fails
      fprintf(stderr, "%s: warning: %s (training goes on)\n", g_who, err);
    else if (rc && rc != LL_ENOTFOUND) {
      fprintf(stderr, "%s: %s\n", g_who, err);
      goto out;
    }
    fflush(stdout);
  }
  struct ll_train_run_event ev;
  double t_start = now_s();
  int64_t tokens = 0, steps_done = 0;
  int save_failed = 0; // the latest checkpoint failed
  struct ll_trainer_state st;
  // Host <-> device traffic of the plain steps (those that neither evaluate nor save).
  struct ll_backend_info x0, x1;
  int64_t up = 0, down = 0, waits = 0, launches = 0, tf_launches = 0, plain = 0;
  if (n_ranks > 1)
    printf("data parallel: %d ranks x %d x %d sequences per step (%s gradient sum)\n", n_ranks, tp.grad_accum, tp.batch,
           reduce == LL_REDUCE_ORDERED ? "rank-ordered, bit-exact" : "MPI_Allreduce");
  int stop = 0;
  while (!ll_train_run_done(run) && !(stop = ll_train_world_any(world, g_stop != 0))) {
    be->i->get_info(be, &x0);
    if ((rc = ll_train_run_step(run, &ev, err, sizeof err))) {
      fprintf(stderr, "%s%s: %s\n", tty ? "\n" : "", g_who, err);
      goto out;
    }
    if (ev.save_failed) // the step stands and the last good checkpoint is intact; the next one retries
      fprintf(stderr, "%s%s: warning: checkpoint at step %lld failed: %s (training goes on)\n", tty ? "\n" : "", g_who,
              (long long)ev.info.step, ev.save_error);
    save_failed = ev.save_failed;
    if (ev.diverging)
      fprintf(stderr, "%s%s: warning: the loss is diverging: %.4f on average over the %d steps to step %lld, more than twice its minimum %.4f of the last %d steps (lr too high?)\n",
              tty ? "\n" : "", g_who, ev.loss_mean, LL_TRAIN_DIVERGE_SMOOTH, (long long)ev.info.step, ev.loss_min, LL_TRAIN_DIVERGE_WINDOW);
    be->i->get_info(be, &x1);
    if (!ev.saved && !ev.evaluated && !ev.save_failed)
      up += x1.bytes_up - x0.bytes_up, down += x1.bytes_down - x0.bytes_down, waits += x1.waits - x0.waits, plain++,
      launches += x1.launches - x0.launches, tf_launches += x1.train_fast_launches - x0.train_fast_launches;
    tokens += ev.info.tokens, steps_done++;
    if (loss_f) {
      fprintf(loss_f, "%lld %.17g %.17g %.17g %.17g\n", (long long)ev.info.step, ev.info.loss, ev.evaluated ? ev.val_loss : NAN, ev.info.grad_norm,
              ev.info.lr);
      fflush(loss_f);
    }
    if (ev.evaluated) val = ev.val_loss;
    const double el = now_s() - t_start, tps = tokens / el;
    char eta[32], vs[32];
    fmt_eta(eta, sizeof eta, el / steps_done * (double)(tp.steps - ev.info.step));
    if (isfinite(val)) snprintf(vs, sizeof vs, "%.4f", val);
    else snprintf(vs, sizeof vs, "-");
    const int show = tty || ev.evaluated || ev.saved || ev.info.skipped || ev.info.step % log_every == 0 || ev.finished;
    char aux[48] = ""; // the load-balancing loss (MoE, full mode): part of the objective, not of the loss shown
    if (ev.info.aux_loss > 0) snprintf(aux, sizeof aux, "  aux %.4f (not in loss)", ev.info.aux_loss);
    if (show)
      printf("%sstep %lld/%lld  loss %.4f%s  val %s  lr %.2e  |g| %.3f  %.0f tok/s  ETA %s%s%s%s", tty ? "\r\033[K" : "", (long long)ev.info.step,
             (long long)tp.steps, ev.info.loss, aux, vs, ev.info.lr, ev.info.grad_norm, tps, eta, ev.info.skipped ? "  (skipped: non-finite)" : "",
             ev.saved ? "  saved " : "", ev.saved ? ev.path : "");
    if (show && ev.saved && n_ranks > 1) printf("  hash %016llx on %d ranks", (unsigned long long)ev.param_hash, n_ranks);
    if (show && (!tty || ev.saved || ev.evaluated)) putchar('\n');
    fflush(stdout);
  }
  ll_trainer_state(tr, &st);
  if (plain > 0 && strcmp(x1.name, "cpu") != 0)
    fprintf(stderr, "%s%s: device transfers per step: %.0f bytes up, %.0f bytes down, %.1f waits, %.0f launches (%.0f of train_fast.cl)\n",
            tty ? "\n" : "", g_who, (double)up / plain, (double)down / plain, (double)waits / plain, (double)launches / plain,
            (double)tf_launches / plain);
  if (n_ranks > 1) {
    struct ll_train_world_stats ws;
    ll_train_world_stats(world, &ws);
    if (ws.sums > 0)
      fprintf(stderr, "%s: data parallel: %d ranks, gradient sum of %lld floats (%.2f MiB) per step, %.2f ms per sum on average (%lld sums)\n",
              g_who, n_ranks, (long long)ws.floats, ws.floats * 4 / 1048576.0, ws.seconds * 1e3 / (double)ws.sums, (long long)ws.sums);
  }
  if (stop) {
    rc = ll_train_run_save(run, &ev, err, sizeof err);
    if (rc) {
      fprintf(stderr, "\n%s: stopped at step %lld but the checkpoint failed: %s\n", g_who, (long long)st.step, err);
      goto out;
    }
    printf("\nstopped by signal %d at step %lld; saved %s (run the same command to resume)\n", (int)(g_stop ? g_stop : SIGTERM), (long long)st.step, ev.path);
  } else if (save_failed) {
    fprintf(stderr, "%s: finished at step %lld but its checkpoint failed (see above); %s/last.ckpt is the last good one\n", g_who,
            (long long)st.step, run_dir);
    goto out;
  } else {
    const double el = now_s() - t_start;
    // Only the files that are there (no validation data: no best.ckpt).
    char files[2 * PATH_MAX + 64] = "", p[PATH_MAX + 16];
    for (int k = 0; k < 2; k++) {
      snprintf(p, sizeof p, "%s/%s", run_dir, k ? "best.ckpt" : "last.ckpt");
      const size_t l = strlen(files);
      if (access(p, F_OK) == 0) snprintf(files + l, sizeof files - l, "%s%s", l ? ", " : "; ", p);
    }
    printf("done: %lld steps in %.1f s, %.1f tokens/s, %lld skipped, last loss %.4f, val %.4f, best val %.4f%s\n", (long long)steps_done, el,
           tokens / (el > 0 ? el : 1), (long long)st.skipped, st.last_loss, val, st.best_val, files);
  }
  status = 0;
out:
  // One rank's error would leave the others waiting in the next sum: end the whole job, said
  // by this rank (its message is above) and by mpirun.
  if (status != 0 && n_ranks > 1) {
    fprintf(stderr, "%s: aborting the job (the last checkpoint is intact)\n", g_who);
    ll_train_world_abort(world, 1);
  }
  if (loss_f) fclose(loss_f);
  ll_train_run_close(run);
  ll_backend_free(cpu_be);
  ll_engine_close(e);
  ll_train_world_close(world);
  ll_config_free(&c);
  return status;
usage_err:
  fprintf(stderr, "%s: %s\n", g_who, err);
  train_usage(stderr);
  ll_config_free(&c);
  return 2;
}

// ---------------------------------------------------------------- llsrv init

int ll_cmd_init(int argc, char **argv) {
  const char *preset = "tiny", *out = NULL, *vocab = NULL;
  uint64_t seed = 0x6c6c7372765f6431ull;
  struct ll_init_dims d;
  int have_dims = 0, experts = -1, top_k = -1, moe = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: llsrv init [--preset tiny|small] [--vocab MODEL] [--seed N] [--dims DIM,LAYERS,HEADS,KV_HEADS,FFN,CTX]\n"
             "                  [--arch llama|moe] [--experts N] [--top-k K] -o PATH\n"
             "Writes a randomly initialised Llama .ckpt (f32, tied output head) to train from scratch\n"
             "(llsrv train --mode full). tiny: 128 dims, 4 layers (the demo model); small: 384 dims, 6 layers.\n"
             "--arch moe (or --experts): a mixture-of-experts FFN in Mixtral's layout, N experts (default 8)\n"
             "of FFN width each, K (default 2) routed per token.\n"
             "Vocabulary: byte-level (260 tokens), or every tokenizer.* key of MODEL.\n");
      return 0;
    }
    if (!v) {
      fprintf(stderr, "llsrv init: '%s' needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--preset")) preset = v;
    else if (!strcmp(a, "-o") || !strcmp(a, "--out")) out = v;
    else if (!strcmp(a, "--vocab")) vocab = v;
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--arch")) {
      if (strcmp(v, "llama") && strcmp(v, "moe")) {
        fprintf(stderr, "llsrv init: --arch %s: unknown (llama, moe)\n", v);
        return 2;
      }
      moe = !strcmp(v, "moe");
    } else if (!strcmp(a, "--experts") || !strcmp(a, "--top-k")) {
      char *end;
      const long n = strtol(v, &end, 10);
      if (*end || end == v || n < 1 || n > 256) {
        fprintf(stderr, "llsrv init: %s wants a number 1..256\n", a);
        return 2;
      }
      *(!strcmp(a, "--experts") ? &experts : &top_k) = (int)n;
      moe = 1;
    }
    else if (!strcmp(a, "--dims")) {
      if (sscanf(v, "%d,%d,%d,%d,%d,%d", &d.dim, &d.layers, &d.heads, &d.heads_kv, &d.ffn, &d.ctx) != 6) {
        fprintf(stderr, "llsrv init: --dims wants DIM,LAYERS,HEADS,KV_HEADS,FFN,CTX\n");
        return 2;
      }
      have_dims = 1;
    } else {
      fprintf(stderr, "llsrv init: unknown option '%s'\n", a);
      return 2;
    }
    i++;
  }
  if (!out) {
    fprintf(stderr, "llsrv init: no output (-o PATH)\n");
    return 2;
  }
  if (!have_dims && ll_init_preset(preset, &d) != 0) {
    fprintf(stderr, "llsrv init: unknown preset '%s' (tiny, small)\n", preset);
    return 2;
  }
  d.experts = moe ? (experts > 0 ? experts : 8) : 0;
  d.top_k = moe ? (top_k > 0 ? top_k : 2) : 0;
  char err[512];
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  int rc = vocab ? ll_model_open(vocab, &mf, err, sizeof err) : 0;
  if (rc == 0) rc = ll_init_model_write(out, &d, seed, vocab ? &mf : NULL, err, sizeof err);
  ll_modelfile_free(&mf);
  if (rc) {
    fprintf(stderr, "llsrv init: %s\n", err);
    return 1;
  }
  char ex[64] = "";
  if (d.experts > 0) snprintf(ex, sizeof ex, " x %d experts (%d per token)", d.experts, d.top_k);
  printf("wrote %s: llama, %d dims, %d layers, %d/%d heads, FFN %d%s, context %d, %s vocabulary\n", out, d.dim, d.layers, d.heads, d.heads_kv,
         d.ffn, ex, d.ctx, vocab ? vocab : "byte-level");
  return 0;
}
