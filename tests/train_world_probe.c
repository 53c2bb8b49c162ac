// train_world_probe - data-parallel training on a model without a tokenizer (llama2.c's
// stories260K.bin): `llsrv train` needs one to read text, this feeds the trainer token ids
// instead (tests/ref/stories260K_greedy256.ids, sliding windows). Run alone it trains with
// grad_accum A; under mpirun -np N it joins the MPI world (ll_train_world.h) and trains with
// grad_accum A/N per rank. Prints one line per step, "step LOSS GRAD_NORM" at full precision,
// then "eval VAL" and "hash H" (rank 0 only); tests/scripts/test_train_mpi.sh compares the runs.
// usage: train_world_probe MODEL IDS_FILE DEVICE GRAD_ACCUM STEPS [allreduce]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_engine.h"
#include "ll_error.h"
#include "ll_train_world.h"
#include "ll_trainer.h"

#define S 32 // tokens per sequence

struct ids_src {
  int32_t *tok;
  int n, cur, val_cur;
};
// Training sequence k: the window at (k * 7) mod (n - S - 1); validation: the last 4 windows.
static int src_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  struct ids_src *s = u;
  const int o = (s->cur++ * 7) % (s->n - S - 1 - 4 * S);
  for (int t = 0; t < S; t++) ids[t] = s->tok[o + t], tg[t] = s->tok[o + t + 1];
  return 0;
}
static int src_val_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  struct ids_src *s = u;
  if (s->val_cur >= 4) return 0;
  const int o = s->n - S - 1 - (s->val_cur++) * S;
  for (int t = 0; t < S; t++) ids[t] = s->tok[o + t], tg[t] = s->tok[o + t + 1];
  return 1;
}
static void src_val_reset(void *u) { ((struct ids_src *)u)->val_cur = 0; }

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s MODEL IDS_FILE DEVICE GRAD_ACCUM STEPS [allreduce]\n", argv[0]);
    return 2;
  }
  char err[512];
  struct ll_train_world *w = NULL;
  if (ll_train_world_launched(NULL, 0) && ll_train_world_open(&w, argc > 6 ? LL_REDUCE_ALLREDUCE : LL_REDUCE_ORDERED, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const int N = ll_train_world_size(w), rank = ll_train_world_rank(w), A = atoi(argv[4]), steps = atoi(argv[5]);
  if (A % N) {
    fprintf(stderr, "grad_accum %d is not a multiple of %d ranks\n", A, N);
    ll_train_world_abort(w, 2);
    return 2;
  }
  struct ids_src src = {0};
  FILE *f = fopen(argv[2], "r");
  src.tok = malloc(4096 * sizeof *src.tok);
  while (f && src.n < 4096 && fscanf(f, "%d", &src.tok[src.n]) == 1) src.n++;
  if (f) fclose(f);
  if (src.n < 8 * S) {
    fprintf(stderr, "%s: %d ids, want %d\n", argv[2], src.n, 8 * S);
    return 1;
  }
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = argv[1], ep.device = argv[3], ep.n_threads = 1, ep.n_ctx = S, ep.repack = 0;
  struct ll_engine *e = NULL;
  struct ll_trainer *tr = NULL;
  int rc = ll_engine_open(&e, &ep, err, sizeof err);
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.rank = 4, p.alpha = 8, p.dropout = 0.1f, p.batch = 1, p.seq_len = S, p.grad_accum = A / N, p.steps = steps, p.lr = 3e-3, p.warmup = 1;
  if (rc == 0) rc = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  struct ll_train_comm c;
  ll_train_world_comm(w, &c);
  if (rc == 0) rc = ll_trainer_set_comm(tr, &c, err, sizeof err);
  struct ll_train_source ts = {&src, src_next, src_val_next, src_val_reset, NULL, NULL};
  for (int s = 0; s < steps && rc == 0; s++) {
    struct ll_train_step_info in;
    rc = ll_trainer_step(tr, &ts, &in, err, sizeof err);
    if (rc == 0 && rank == 0) printf("step %.17g %.17g\n", in.loss, in.grad_norm);
  }
  double val = 0;
  if (rc == 0) rc = ll_trainer_eval(tr, &ts, 0, &val, err, sizeof err);
  const uint64_t h = rc == 0 ? ll_trainer_param_hash(tr) : 0;
  if (rc == 0 && rank == 0) printf("eval %.17g\nhash %016llx\n", val, (unsigned long long)h);
  if (rc == 0 && rank != 0) fprintf(stderr, "rank %d hash %016llx\n", rank, (unsigned long long)h);
  if (rc) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    ll_train_world_abort(w, 1);
  }
  ll_trainer_free(tr);
  ll_engine_close(e);
  ll_train_world_close(w);
  free(src.tok);
  return rc ? 1 : 0;
}
