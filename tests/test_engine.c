// test_engine.c - the inference engine against llama2.c's run.c (stories260K greedy ids), batch
// invariance, KV block accounting, error paths; the real SmolLM2 model when cached.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ll_engine.h"
#include "ll_error.h"
#include "ll_sample.h"
#include "testutil.h"

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

// Greedy ids from BOS; returns how many of the reference ids matched in a row.
static int greedy_match(struct ll_engine *e, const int32_t *ref, int n_ref) {
  const int V = ll_engine_n_vocab(e);
  float *logits = malloc((size_t)V * sizeof *logits);
  char err[256];
  int seq = ll_engine_seq_new(e), ok = 0;
  int32_t tok = 1;
  for (int i = 0; i < n_ref; i++) {
    struct ll_batch_item it = {seq, 1, &tok, 1, logits, NULL};
    if (ll_engine_decode(e, &it, 1, err, sizeof err) != 0) break;
    tok = argmax(logits, V);
    if (tok != ref[i]) {
      printf("first difference at step %d: ours %d, reference %d\n", i, tok, ref[i]);
      break;
    }
    ok++;
  }
  ll_engine_seq_free(e, seq);
  free(logits);
  return ok;
}

static void test_stories(void) {
  char path[4096], ref[4096], err[512];
  if (!ll_test_shared_path("testdata/models/stories260K.bin", path, sizeof path)) {
    printf("../shared/testdata/models/stories260K.bin absent: skipping the llama2.c comparison\n");
    return;
  }
  snprintf(ref, sizeof ref, "%s/tests/ref/stories260K_greedy256.ids", getenv("LL_SOURCE_DIR"));
  size_t len;
  char *txt = (char *)ll_test_read_file(ref, &len);
  CHECKF(txt != NULL, "reference ids %s missing", ref);
  if (!txt) return;
  int32_t ids[512];
  int n = 0;
  for (char *p = txt; n < 512;) {
    char *q;
    long v = strtol(p, &q, 10);
    if (q == p) break;
    ids[n++] = (int32_t)v;
    p = q;
  }
  free(txt);
  CHECK(n == 256);
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = path;
  ep.n_threads = 2;
  // Default parameters: a llama2.c model gets run.c's f32 cache without asking (kv_f16 auto).
  CHECK(ep.kv_f16 == -1);
  struct ll_engine *e;
  CHECKF(ll_engine_open(&e, &ep, err, sizeof err) == 0, "%s", err);
  struct ll_engine_info in;
  ll_engine_get_info(e, &in);
  CHECK(in.kv_f16 == 0);
  const int ok = greedy_match(e, ids, n);
  printf("stories260K: %d/%d greedy ids equal llama2.c run.c's\n", ok, n);
  CHECK(ok == n);
  { // ll_engine_seq_set_sample: the next argmax row gets the sampler's step instead (once), the
    // same ids as sampling from the logits with the same seed
    struct ll_sampler_params sp;
    ll_sampler_params_default(&sp);
    sp.seed = 5, sp.temperature = 1.2f;
    struct ll_sampler *h = ll_sampler_new(&sp, in.n_vocab), *dv = ll_sampler_new(&sp, in.n_vocab);
    float *lg = malloc(sizeof(float) * in.n_vocab);
    const int s1 = ll_engine_seq_new(e);
    int32_t t = 1, am = -1;
    int same = 0;
    for (int i = 0; i < 24; i++) { // one step: the logits for the host's sampler, the id for the engine's
      struct ll_batch_item it = {s1, 1, &t, 1, lg, &am};
      struct ll_sample_dev d;
      CHECK(ll_sampler_dev_next(dv, &d) == 1 && ll_engine_seq_set_sample(e, s1, &d) == 0);
      CHECK(ll_engine_decode(e, &it, 1, err, sizeof err) == 0);
      t = ll_sampler_sample(h, lg, NULL);
      same += t == am;
    }
    // forgotten after one step: the next argmax is the argmax again
    struct ll_batch_item it = {s1, 1, &t, 1, lg, &am};
    CHECK(ll_engine_decode(e, &it, 1, err, sizeof err) == 0);
    int32_t best = 0;
    for (int v = 1; v < in.n_vocab; v++) best = lg[v] > lg[best] ? v : best;
    CHECKF(same == 24 && am == best, "seq_set_sample: %d / 24 ids as the host sampler's, then argmax %d (%d)", same, am, best);
    CHECK(ll_engine_seq_set_sample(e, -1, NULL) == LL_EINVAL);
    ll_engine_seq_free(e, s1);
    ll_sampler_free(h), ll_sampler_free(dv);
    free(lg);
  }
  ll_engine_close(e);
  // An explicit choice wins over the model's origin.
  ep.kv_f16 = 1;
  CHECKF(ll_engine_open(&e, &ep, err, sizeof err) == 0, "%s", err);
  ll_engine_get_info(e, &in);
  CHECK(in.kv_f16 == 1);
  printf("stories260K with an f16 cache: %d/%d greedy ids equal run.c's\n", greedy_match(e, ids, n), n);
  ll_engine_close(e);
}

// Several sequences decoded in one batch give bit-identical logits to each decoded alone
// (rows of every matmul are computed independently), and KV blocks are accounted exactly.
static void test_batching(const char *path) {
  char err[512];
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = path;
  ep.n_parallel = 3;
  ep.n_ctx = 64;
  ep.n_threads = 2;
  struct ll_engine *e;
  CHECKF(ll_engine_open(&e, &ep, err, sizeof err) == 0, "%s", err);
  const int V = ll_engine_n_vocab(e);
  float *solo = malloc(sizeof(float) * V * 3), *batch = malloc(sizeof(float) * V * 3);
  const int32_t p0[] = {1, 5, 9, 22}, p1[] = {1, 300}, p2[] = {1, 7, 7, 7, 7, 7, 40};
  const int32_t *ps[3] = {p0, p1, p2};
  const int ns[3] = {4, 2, 7};
  for (int i = 0; i < 3; i++) { // alone
    int s = ll_engine_seq_new(e);
    struct ll_batch_item it = {s, ns[i], ps[i], 1, solo + (size_t)i * V, NULL};
    CHECK(ll_engine_decode(e, &it, 1, err, sizeof err) == 0);
    ll_engine_seq_free(e, s);
  }
  CHECK(ll_engine_kv_blocks_used(e) == 0);
  int s[3];
  struct ll_batch_item items[3];
  for (int i = 0; i < 3; i++) {
    s[i] = ll_engine_seq_new(e);
    items[i] = (struct ll_batch_item){s[i], ns[i], ps[i], 1, batch + (size_t)i * V, NULL};
  }
  CHECK(ll_engine_seq_new(e) == LL_EBUSY); // all 3 slots in use
  CHECK(ll_engine_decode(e, items, 3, err, sizeof err) == 0);
  CHECK(memcmp(solo, batch, sizeof(float) * V * 3) == 0);
  CHECK(ll_engine_kv_blocks_used(e) == 3); // each sequence < 16 positions: one block each
  CHECK(ll_engine_seq_len(e, s[2]) == 7);
  // Errors leave state untouched: context overflow, bad token, same sequence twice.
  int32_t many[80];
  for (int i = 0; i < 80; i++) many[i] = 1;
  struct ll_batch_item big = {s[0], 61, many, 0, NULL, NULL};
  CHECK(ll_engine_decode(e, &big, 1, err, sizeof err) == LL_ELIMIT && strstr(err, "context"));
  int32_t bad = V + 5;
  struct ll_batch_item bt = {s[0], 1, &bad, 0, NULL, NULL};
  CHECK(ll_engine_decode(e, &bt, 1, err, sizeof err) == LL_EINVAL);
  struct ll_batch_item twice[2] = {{s[1], 1, many, 0, NULL, NULL}, {s[1], 1, many, 0, NULL, NULL}};
  CHECK(ll_engine_decode(e, twice, 2, err, sizeof err) == LL_EINVAL);
  CHECK(ll_engine_seq_len(e, s[0]) == 4);
  for (int i = 0; i < 3; i++) ll_engine_seq_free(e, s[i]);
  CHECK(ll_engine_kv_blocks_used(e) == 0);
  free(solo);
  free(batch);
  ll_engine_close(e);
  // A KV pool smaller than the sequences need is reported, not overrun.
  ep.kv_blocks = 1;
  CHECK(ll_engine_open(&e, &ep, err, sizeof err) == 0);
  int a = ll_engine_seq_new(e);
  struct ll_batch_item fill = {a, 17, many, 0, NULL, NULL};
  CHECK(ll_engine_decode(e, &fill, 1, err, sizeof err) == LL_ELIMIT && strstr(err, "KV cache full"));
  CHECK(ll_engine_kv_blocks_used(e) == 0);
  ll_engine_close(e);
}

static void test_sampler(void) {
  const int V = 1000;
  float *l = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
  uint64_t rs = 7;
  struct ll_sampler_params p;
  ll_sampler_params_default(&p);
  p.seed = 1234;
  struct ll_sampler *a = ll_sampler_new(&p, V), *b = ll_sampler_new(&p, V);
  int same = 1, distinct = 0, prev = -1;
  for (int i = 0; i < 200; i++) {
    for (int j = 0; j < V; j++) l[j] = l2[j] = ll_test_randf(&rs) * 4;
    int x = ll_sampler_sample(a, l, NULL), y = ll_sampler_sample(b, l2, NULL);
    same &= x == y;
    distinct += x != prev;
    prev = x;
    ll_sampler_accept(a, x);
    ll_sampler_accept(b, y);
  }
  CHECK(same);          // same seed, same output
  CHECK(distinct > 50); // and it does sample
  ll_sampler_free(a), ll_sampler_free(b);
  { // the step a device takes (ll_sampler_dev_next + the chain from the logits) chooses as
    // ll_sampler_sample does, draw for draw, over the top-k settings it takes, with penalties
    // (and greedy with penalties); reported probabilities and top-k off (or beyond
    // LL_SAMPLE_DEV_K) stay on the host
    struct ll_token_prob *cand = malloc(sizeof *cand * V);
    static const int ks[] = {1, 7, 40, 64};
    int agree = 0, n = 0, pen = 0;
    for (int c = 0; c < 14; c++) {
      struct ll_sampler_params q = p;
      q.top_k = ks[c % 4], q.temperature = c < 4 ? 0.8f : 1.7f, q.top_p = c & 1 ? 0.9f : 1.0f, q.min_p = c & 2 ? 0.05f : 0.0f, q.seed = 99 + c;
      if (c >= 8) // penalties over a short window (tokens repeat in it), the last two greedy
        q.repeat_penalty = c & 1 ? 1.3f : 1.0f, q.frequency_penalty = c % 3 ? 0.2f : 0.0f, q.presence_penalty = c % 3 != 1 ? 0.4f : 0.0f,
        q.repeat_last_n = 8 + c, q.temperature = c >= 12 ? 0.0f : q.temperature;
      struct ll_sampler *h = ll_sampler_new(&q, V), *dv = ll_sampler_new(&q, V);
      CHECK(ll_sampler_dev_ok(dv));
      for (int i = 0; i < 50; i++, n++) {
        for (int j = 0; j < V; j++) l[j] = l2[j] = ll_test_randf(&rs) * 4;
        struct ll_sample_dev d;
        CHECK(ll_sampler_dev_next(dv, &d) == 1);
        pen += d.n_pen > 0;
        for (int j = 0; j < d.n_pen; j++) l[d.pen[2 * j]] = l2[d.pen[2 * j]] += 3; // make the penalized tokens contenders
        const int x = ll_sampler_sample(h, l, NULL), y = ll_sample_dev_choose(&d, cand, l2, V);
        agree += x == y;
        ll_sampler_accept(h, x), ll_sampler_accept(dv, y);
      }
      ll_sampler_free(h), ll_sampler_free(dv);
    }
    CHECKF(agree == n && pen >= 6 * 49, "device-step sampling: %d / %d as the host's (%d steps with penalties)", agree, n, pen);
    struct ll_sampler_params q = p;
    struct ll_sample_dev d;
    q.top_k = 0;
    struct ll_sampler *h = ll_sampler_new(&q, V);
    CHECK(!ll_sampler_dev_ok(h) && ll_sampler_dev_next(h, &d) == 0);
    ll_sampler_free(h);
    q.top_k = 40, q.repeat_penalty = 1.1f; // penalties: on the device too
    h = ll_sampler_new(&q, V);
    CHECK(ll_sampler_dev_ok(h));
    ll_sampler_free(h);
    q.repeat_penalty = 1.0f, q.n_probs = 2;
    h = ll_sampler_new(&q, V);
    CHECK(!ll_sampler_dev_ok(h));
    ll_sampler_free(h);
    free(cand);
  }
  // Greedy = argmax (lowest id on ties); top_k 1 = greedy; min_p 1 keeps only the best.
  for (int j = 0; j < V; j++) l[j] = (float)(j % 97);
  p.temperature = 0;
  a = ll_sampler_new(&p, V);
  memcpy(l2, l, sizeof(float) * V);
  CHECK(ll_sampler_sample(a, l2, NULL) == 96);
  ll_sampler_free(a);
  p.temperature = 1.5f, p.top_k = 1;
  a = ll_sampler_new(&p, V);
  memcpy(l2, l, sizeof(float) * V);
  CHECK(ll_sampler_sample(a, l2, NULL) == 96);
  ll_sampler_free(a);
  // Repetition penalty pushes a repeated token below the runner-up.
  p.temperature = 0, p.top_k = 0, p.repeat_penalty = 2.0f;
  a = ll_sampler_new(&p, V);
  ll_sampler_accept(a, 96);
  for (int j = 0; j < V; j++) l2[j] = 0;
  l2[96] = 10, l2[5] = 6;
  CHECK(ll_sampler_sample(a, l2, NULL) == 5);
  ll_sampler_free(a);
  // Top-n logprobs are sorted and normalised.
  p.repeat_penalty = 1, p.n_probs = 3;
  a = ll_sampler_new(&p, V);
  struct ll_token_prob pr[3];
  for (int j = 0; j < V; j++) l2[j] = 0;
  l2[10] = 3, l2[11] = 2, l2[12] = 1;
  CHECK(ll_sampler_sample(a, l2, pr) == 10 && pr[0].id == 10 && pr[1].id == 11 && pr[2].id == 12 && pr[0].logprob < 0 && pr[0].logprob > pr[1].logprob);
  ll_sampler_free(a);
  free(l), free(l2);
  // Stop strings split across pushes: text before the stop is emitted, the rest withheld.
  const char *stops[] = {"END", "\n\n"};
  struct ll_stop_matcher *m = ll_stop_new(stops, 2);
  char out[64], acc[64] = "";
  int st = 0;
  const char *pieces[] = {"Hello E", "N", "o world", " E", "ND and more"};
  for (int i = 0; i < 5 && !st; i++) {
    size_t k = ll_stop_push(m, pieces[i], strlen(pieces[i]), out, sizeof out, &st);
    strncat(acc, out, k);
  }
  CHECK(st && strcmp(acc, "Hello ENo world ") == 0);
  ll_stop_free(m);
  m = ll_stop_new(stops, 2);
  size_t k = ll_stop_push(m, "abc\n", 4, out, sizeof out, &st);
  CHECK(!st && k == 3);                                   // "\n" held: it may start "\n\n"
  CHECK(ll_stop_flush(m, out, sizeof out) == 1 && out[0] == '\n'); // released at the end
  ll_stop_free(m);
}

int main(void) {
  char path[4096];
  test_sampler();
  test_stories();
  if (ll_test_shared_path("testdata/models/stories260K.bin", path, sizeof path)) test_batching(path);
  return ll_test_summary();
}
