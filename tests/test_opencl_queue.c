// test_opencl_queue.c - decode steps queued one behind the other on the OpenCL backend
// (ll_engine_decode_queue: step n + 1 takes its ids from step n's choice on the device, and is
// queued before step n's ids reach the host), on stories260K (the device of
// $LL_TEST_OPENCL_DEVICE, default opencl:0:0: PoCL in CI), against the same engine stepping one
// at a time (ll_engine_decode):
// - greedy ids and seeded sampled ids are the same, for one sequence and for two in one step;
// - the queued run waited for no step with nothing queued behind it but the last (the backend's
//   idle_waits), where the step-by-step run's every wait left the device idle; so too over 24
//   runs back to back (the upload arena wraps as a ring instead of draining the queue);
// - a stop on token k leaves one step queued past it; undone (ll_engine_seq_truncate), the
//   sequence has the length and KV blocks of one that never took it, and a different token
//   decoded at that position continues as in a sequence that never took the step;
// - the engine refuses a step that takes the device's ids after the batch changed.
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_model.h"
#include "ll_sample.h"
#include "testutil.h"

#define N 24 // generated tokens per run

static struct ll_backend_info info_of(struct ll_engine *e) {
  struct ll_backend *be = ll_engine_backend(e);
  struct ll_backend_info i;
  be->i->get_info(be, &i);
  return i;
}

// Step by step: n sequences from BOS, N tokens each (ids (n, N)); smp[i] non-NULL: sampled.
static int run_sync(struct ll_engine *e, int n, struct ll_sampler **smp, int32_t *ids) {
  char err[256];
  int seqs[2];
  int32_t tok[2], am[2];
  struct ll_batch_item it[2];
  for (int i = 0; i < n; i++) seqs[i] = ll_engine_seq_new(e), tok[i] = 1;
  for (int s = 0; s < N; s++) {
    for (int i = 0; i < n; i++) {
      struct ll_sample_dev d;
      if (smp[i] && (!ll_sampler_dev_next(smp[i], &d) || ll_engine_seq_set_sample(e, seqs[i], &d))) return -1;
      it[i] = (struct ll_batch_item){seqs[i], 1, &tok[i], 1, NULL, &am[i]};
    }
    if (ll_engine_decode(e, it, n, err, sizeof err)) return fprintf(stderr, "decode: %s\n", err), -1;
    for (int i = 0; i < n; i++) tok[i] = ids[i * N + s] = am[i];
  }
  for (int i = 0; i < n; i++) ll_engine_seq_free(e, seqs[i]);
  return 0;
}

// Queued: the same, each step queued behind the previous one before its ids are collected (as
// llsrv generate does); stop_at >= 0: the host "stops" on token stop_at of sequence 0 (n 1),
// undoes the step queued past it and leaves the sequence open (*seq_out).
static int run_queued(struct ll_engine *e, int n, struct ll_sampler **smp, int32_t *ids, int stop_at, int *seq_out) {
  char err[256];
  int seqs[2];
  int32_t tok[2] = {1, 1}, got[2];
  for (int i = 0; i < n; i++) seqs[i] = ll_engine_seq_new(e);
  for (int s = 0; s < N; s++) { // queue step s (the first from the host's BOS, then from the device's ids)
    for (int i = 0; i < n; i++) {
      struct ll_sample_dev d;
      if (smp[i] && (!ll_sampler_dev_next(smp[i], &d) || ll_engine_seq_set_sample(e, seqs[i], &d))) return -1;
    }
    if (ll_engine_decode_queue(e, seqs, s == 0 ? tok : NULL, n, err, sizeof err)) return fprintf(stderr, "queue: %s\n", err), -1;
    if (s == 0) continue;
    if (ll_engine_decode_collect(e, got, 2, err, sizeof err) != n) return fprintf(stderr, "collect: %s\n", err), -1; // step s - 1
    for (int i = 0; i < n; i++) ids[i * N + s - 1] = got[i];
    if (stop_at == s - 1) { // token s - 1 is a stop: step s (queued, it consumed that token) is undone
      if (ll_engine_decode_collect(e, got, 2, err, sizeof err) != n) return -1;
      if (ll_engine_seq_truncate(e, seqs[0], ll_engine_seq_len(e, seqs[0]) - 1)) return -1;
      *seq_out = seqs[0];
      return 0;
    }
  }
  if (ll_engine_decode_collect(e, got, 2, err, sizeof err) != n) return -1;
  for (int i = 0; i < n; i++) ids[i * N + N - 1] = got[i];
  for (int i = 0; i < n; i++) ll_engine_seq_free(e, seqs[i]);
  return 0;
}

static int same(const int32_t *a, const int32_t *b, int n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

// Greedy continuation of seq after token first: k ids.
static int continue_greedy(struct ll_engine *e, int seq, int32_t first, int32_t *out, int k) {
  char err[256];
  int32_t tok = first, am;
  for (int s = 0; s < k; s++) {
    struct ll_batch_item it = {seq, 1, &tok, 1, NULL, &am};
    if (ll_engine_decode(e, &it, 1, err, sizeof err)) return fprintf(stderr, "decode: %s\n", err), -1;
    out[s] = tok = am;
  }
  return 0;
}

int main(void) {
  char path[4096], err[512];
  if (!ll_test_shared_path("testdata/models/stories260K.bin", path, sizeof path)) {
    printf("../shared/testdata/models/stories260K.bin absent: nothing to run\n");
    return ll_test_summary();
  }
  const char *dev = getenv("LL_TEST_OPENCL_DEVICE");
  setenv("LL_OPENCL_QUEUE_AHEAD", "1", 1); // the default on GPUs only; asked for here (PoCL is a CPU device)
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = path, ep.device = dev && *dev ? dev : "opencl:0:0", ep.n_ctx = 256, ep.n_parallel = 3, ep.n_threads = 2;
  struct ll_engine *e;
  CHECKF(ll_engine_open(&e, &ep, err, sizeof err) == 0, "%s", err);
  struct ll_engine_info in;
  ll_engine_get_info(e, &in);
  printf("device: %s\n", in.device_reason);
  CHECKF(strcmp(in.backend, "opencl") == 0, "not on OpenCL: %s", in.device_reason); // a CPU fallback would test nothing
  if (strcmp(in.backend, "opencl") != 0) {
    ll_engine_close(e);
    return ll_test_summary();
  }
  CHECK(ll_engine_queue_ok(e) == 1 && info_of(e).queue_ahead == 1);
  struct ll_sampler *none[2] = {NULL, NULL};
  int32_t a[2 * N], b[2 * N];

  // Greedy, one sequence: the same ids; waits counted.
  struct ll_backend_info i0 = info_of(e);
  CHECK(run_sync(e, 1, none, a) == 0);
  struct ll_backend_info i1 = info_of(e);
  CHECK(run_queued(e, 1, none, b, -1, NULL) == 0);
  struct ll_backend_info i2 = info_of(e);
  CHECKF(same(a, b, N), "greedy ids queued differ from step by step (first %d / %d)", a[0], b[0]);
  const long sync_idle = (long)(i1.idle_waits - i0.idle_waits), q_idle = (long)(i2.idle_waits - i1.idle_waits);
  const long q_waits = (long)(i2.waits - i1.waits);
  printf("greedy: step by step %ld waits, %ld with the device idle; queued %ld waits, %ld idle\n", (long)(i1.waits - i0.waits), sync_idle, q_waits,
         q_idle);
  CHECKF(sync_idle >= N, "step by step: %ld idle waits for %d steps", sync_idle, N);
  CHECKF(q_waits == N && q_idle == 1, "queued: %ld waits (%d steps), %ld with nothing queued behind (only the last may)", q_waits, N, q_idle);
  CHECKF(i2.bytes_down - i1.bytes_down == 4 * N, "queued: %lld bytes down for %d steps", (long long)(i2.bytes_down - i1.bytes_down), N);

  { // Many queued runs back to back, nothing drained between them: the upload arena wraps (a
    // waited read frees what was queued before it), never waiting with the device idle but at
    // each run's last step, and every run's ids the same.
    const int runs = 24;
    int ok = 0;
    for (int r = 0; r < runs; r++) ok += run_queued(e, 1, none, b, -1, NULL) == 0 && same(a, b, N);
    struct ll_backend_info i3 = info_of(e);
    printf("%d queued runs of %d steps: %ld idle waits, %lld bytes up\n", runs, N, (long)(i3.idle_waits - i2.idle_waits), (long long)(i3.bytes_up - i2.bytes_up));
    CHECKF(ok == runs, "%d of %d queued runs gave the step-by-step ids", ok, runs);
    CHECKF(i3.idle_waits - i2.idle_waits == runs, "%lld idle waits in %d queued runs (one each: the last step's)", (long long)(i3.idle_waits - i2.idle_waits), runs);
  }

  // Seeded top-k sampling, two sequences in one step (different seeds): the same ids.
  struct ll_sampler_params sp;
  ll_sampler_params_default(&sp);
  struct ll_sampler *s1[2], *s2[2];
  for (int i = 0; i < 2; i++) {
    sp.seed = 11 + (uint64_t)i;
    s1[i] = ll_sampler_new(&sp, in.n_vocab), s2[i] = ll_sampler_new(&sp, in.n_vocab);
    CHECK(s1[i] && s2[i] && ll_sampler_dev_ok(s1[i]) && ll_sampler_dev_ahead(s1[i]));
  }
  CHECK(run_sync(e, 2, s1, a) == 0);
  CHECK(run_queued(e, 2, s2, b, -1, NULL) == 0);
  CHECKF(same(a, b, 2 * N), "sampled ids (two sequences) queued differ from step by step");
  CHECKF(!same(a, a + N, N), "the two seeds gave the same ids: the rows may be swapped unnoticed");
  for (int i = 0; i < 2; i++) ll_sampler_free(s1[i]), ll_sampler_free(s2[i]);

  // A stop on token k undone (k 15: the undone step is position 16, the first of a second KV block).
  const int k = 15;
  CHECK(run_sync(e, 1, none, a) == 0);
  int sq = -1;
  CHECK(run_queued(e, 1, none, b, k, &sq) == 0 && sq >= 0);
  CHECKF(same(a, b, k + 1), "queued ids up to the stop differ");
  CHECKF(ll_engine_seq_len(e, sq) == 1 + k, "after the undone step: length %d, expected %d", ll_engine_seq_len(e, sq), 1 + k);
  const int used_q = ll_engine_kv_blocks_used(e);
  int fresh = ll_engine_seq_new(e);
  { // the same tokens step by step: BOS, then ids 0 .. k - 1 (token k is the stop, never fed)
    int32_t tok = 1, am;
    for (int s = 0; s <= k; s++) {
      struct ll_batch_item it = {fresh, 1, &tok, 1, NULL, &am};
      CHECK(ll_engine_decode(e, &it, 1, err, sizeof err) == 0);
      if (s < k) tok = a[s];
    }
  }
  CHECKF(ll_engine_kv_blocks_used(e) == 2 * used_q, "KV blocks: %d with both, %d with the queued one alone", ll_engine_kv_blocks_used(e), used_q);
  // Not the stop token: a position the undone step wrote must not show.
  const int32_t other = (a[k] + 1) % in.n_vocab;
  int32_t c1[8], c2[8];
  CHECK(continue_greedy(e, sq, other, c1, 8) == 0 && continue_greedy(e, fresh, other, c2, 8) == 0);
  CHECKF(same(c1, c2, 8), "continuation after the undone step differs from a sequence that never took it");
  ll_engine_seq_free(e, sq), ll_engine_seq_free(e, fresh);

  { // refusals: the device's ids after the batch changed; a third step outstanding
    int s = ll_engine_seq_new(e), t = ll_engine_seq_new(e), pair[2] = {s, t};
    int32_t bos[2] = {1, 1}, got[2];
    CHECK(ll_engine_decode_queue(e, &s, bos, 1, err, sizeof err) == 0);
    CHECK(ll_engine_decode_queue(e, pair, NULL, 2, err, sizeof err) == LL_EINVAL && strstr(err, "same sequences"));
    CHECK(ll_engine_decode_queue(e, &s, NULL, 1, err, sizeof err) == 0);
    CHECK(ll_engine_decode_queue(e, &s, NULL, 1, err, sizeof err) == LL_EBUSY);
    CHECK(ll_engine_decode_collect(e, got, 2, err, sizeof err) == 1 && ll_engine_decode_collect(e, got, 2, err, sizeof err) == 1);
    CHECK(ll_engine_decode_collect(e, got, 2, err, sizeof err) == LL_EINVAL);
    CHECK(ll_engine_seq_truncate(e, s, ll_engine_seq_len(e, s) + 1) == LL_EINVAL);
    ll_engine_seq_free(e, s), ll_engine_seq_free(e, t);
    CHECK(ll_engine_decode_queue(e, &s, bos, 1, err, sizeof err) == LL_EINVAL); // a freed sequence
    s = ll_engine_seq_new(e);
    CHECK(ll_engine_decode_queue(e, &s, bos, 1, err, sizeof err) == 0); // left queued: close waits for its read
  }
  ll_engine_close(e);

  // LL_OPENCL_QUEUE_AHEAD=0: the engine says it cannot (callers step one at a time).
  setenv("LL_OPENCL_QUEUE_AHEAD", "0", 1);
  CHECKF(ll_engine_open(&e, &ep, err, sizeof err) == 0, "%s", err);
  CHECK(ll_engine_queue_ok(e) == 0 && info_of(e).queue_ahead == 0);
  int s = ll_engine_seq_new(e);
  int32_t bos = 1;
  CHECK(ll_engine_decode_queue(e, &s, &bos, 1, err, sizeof err) == LL_EUNSUPPORTED);
  ll_engine_close(e);
  return ll_test_summary();
}
