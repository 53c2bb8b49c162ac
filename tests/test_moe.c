// test_moe.c - the mixture-of-experts FFN (server/engine/moe.c): routing against a plain
// reference, a model whose experts are all one dense FFN against that dense model, a prompt
// (experts over grouped tokens) against the same tokens decoded one at a time, a prompt's
// logits the same bits with another sequence in its step (the server's batch invariance),
// malformed MoE files refused with the tensor or key named, and LoRA training through the
// experts: every adapter gradient against finite differences (Mixtral's layout, qwen2moe's,
// qwen3moe's, olmoe's), adapters on the experts themselves served, exported and read back;
// full-parameter training: the router's, the experts', the shared expert's, the q/k norms' and
// attention's gradients, with the load-balancing loss, against finite differences; per layout,
// 40 steps of LoRA and of full training lower the validation loss, and the fully trained
// model's checkpoint serves the trainer's loss.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_engine.h"
#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_modelfile.h"
#include "ll_moe.h"
#include "ll_quant.h"
#include "ll_lora.h"
#include "ll_trainer.h"
#include "testutil.h"

enum { C = 32, H = 4, HKV = 2, L = 2, F = 40, FS = 24, V = 64, E = 4, K = 2, CTX = 64 };
#define KVD (C / H * HKV)

// ---------------------------------------------------------------- routing

static void test_route(uint64_t *rs) {
  enum { T = 64, EE = 8, KK = 3 };
  float logits[T * EE], probs[EE], w[T * KK];
  int32_t sel[T * KK];
  for (int i = 0; i < T * EE; i++) logits[i] = 3 * ll_test_randf(rs);
  for (int norm = 0; norm < 2; norm++) {
    ll_moe_route(logits, T, EE, KK, norm, 0.0f, sel, w, probs);
    int bad_set = 0, bad_w = 0, bad_order = 0, bad_sum = 0;
    for (int t = 0; t < T; t++) {
      const float *x = logits + t * EE;
      double mx = x[0], z = 0, p[EE];
      for (int i = 1; i < EE; i++) mx = x[i] > mx ? x[i] : mx;
      for (int i = 0; i < EE; i++) z += exp(x[i] - mx);
      for (int i = 0; i < EE; i++) p[i] = exp(x[i] - mx) / z;
      double ws = 0;
      for (int j = 0; j < KK; j++) ws += p[sel[t * KK + j]];
      for (int j = 0; j < KK; j++) {
        const int e = sel[t * KK + j];
        int above = 0; // experts with a larger probability than a chosen one: fewer than k
        for (int i = 0; i < EE; i++) above += x[i] > x[e];
        bad_set += above >= KK;
        bad_order += j > 0 && x[sel[t * KK + j - 1]] < x[e];
        const double want = norm ? p[e] / ws : p[e];
        bad_w += fabs(w[t * KK + j] - want) > 1e-6 * (want > 1 ? want : 1);
      }
      double s = 0;
      for (int j = 0; j < KK; j++) s += w[t * KK + j];
      bad_sum += norm && fabs(s - 1) > 1e-6;
    }
    CHECKF(bad_set == 0, "norm %d: %d chosen experts outside the top %d", norm, bad_set, KK);
    CHECKF(bad_order == 0, "norm %d: %d slots out of descending order", norm, bad_order);
    CHECKF(bad_w == 0, "norm %d: %d weights off the double-precision softmax", norm, bad_w);
    CHECKF(bad_sum == 0, "norm %d: %d tokens whose weights do not sum to 1", norm, bad_sum);
  }
  // expert_weights_scale multiplies the (renormalized) weights
  float w2[T * KK];
  int32_t sel2[T * KK];
  ll_moe_route(logits, T, EE, KK, 1, 2.5f, sel2, w2, probs);
  ll_moe_route(logits, T, EE, KK, 1, 0.0f, sel, w, probs);
  int bad = 0;
  for (int i = 0; i < T * KK; i++) bad += sel2[i] != sel[i] || w2[i] != w[i] * 2.5f;
  CHECKF(bad == 0, "%d weights not scaled by expert_weights_scale", bad);
}

// ---------------------------------------------------------------- model files

struct model {
  struct ll_modelfile mf;
  float *mem;
  size_t used, cap;
};

static float *take(struct model *m, size_t n) {
  float *p = m->mem + m->used;
  m->used += n;
  if (m->used > m->cap) abort();
  return p;
}
static void add(struct model *m, const char *name, int nd, int64_t n0, int64_t n1, int64_t n2, const float *data) {
  const int64_t ne[3] = {n0, n1, n2};
  CHECK(ll_mf_add_tensor(&m->mf, name, LL_TYPE_F32, nd, ne, data) == 0);
}
static float *rnd(struct model *m, size_t n, float scale, uint64_t *rs) {
  float *p = take(m, n);
  for (size_t i = 0; i < n; i++) p[i] = scale * ll_test_randf(rs);
  return p;
}

// A llama model: dense (experts 0), or MoE whose expert e is (same_experts ? the dense FFN :
// random); the router random. Weights from the seed, the dense ones first, so a dense model
// and its MoE twin of the same seed share every non-FFN tensor and the FFN.
static int write_model(const char *path, int experts, int used, int same_experts, uint64_t seed, const char *break_what) {
  struct model m = {.cap = 1u << 22};
  ll_modelfile_init(&m.mf);
  m.mem = malloc(m.cap * sizeof(float));
  uint64_t rs = seed, rs2 = seed ^ 0x9e3779b97f4a7c15ull;
  // break_what "shared": qwen2moe's layout with a shared expert (width FS) beside the experts;
  // "qwen3moe": per-head q/k norms; "olmoe": q/k norms over whole rows (norm weights random
  // around 1, so that their gradients are checked where they are trained)
  const int shared = break_what && !strcmp(break_what, "shared");
  const int q3 = break_what && !strcmp(break_what, "qwen3moe"), ol = break_what && !strcmp(break_what, "olmoe");
  const char *arch = shared ? "qwen2moe" : q3 ? "qwen3moe" : ol ? "olmoe" : "llama";
  char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
  ll_mf_set_str(&m.mf, "general.architecture", arch);
  ll_mf_set_u32(&m.mf, KEY("context_length"), CTX);
  ll_mf_set_u32(&m.mf, KEY("embedding_length"), C);
  ll_mf_set_u32(&m.mf, KEY("block_count"), L);
  ll_mf_set_u32(&m.mf, KEY("feed_forward_length"), F);
  ll_mf_set_u32(&m.mf, KEY("attention.head_count"), H);
  ll_mf_set_u32(&m.mf, KEY("attention.head_count_kv"), HKV);
  ll_mf_set_f32(&m.mf, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
  if (experts) {
    ll_mf_set_u32(&m.mf, KEY("expert_count"), (uint32_t)experts);
    ll_mf_set_u32(&m.mf, KEY("expert_used_count"), (uint32_t)(break_what && !strcmp(break_what, "used") ? experts + 1 : used));
    if (shared) ll_mf_set_u32(&m.mf, KEY("expert_feed_forward_length"), F), ll_mf_set_u32(&m.mf, KEY("expert_shared_feed_forward_length"), FS);
    if (q3) ll_mf_set_u32(&m.mf, KEY("expert_feed_forward_length"), F);
  }
  if (q3) ll_mf_set_u32(&m.mf, KEY("attention.key_length"), C / H), ll_mf_set_u32(&m.mf, KEY("attention.value_length"), C / H);
#undef KEY
  add(&m, "token_embd.weight", 2, C, V, 1, rnd(&m, (size_t)C * V, 1.0f, &rs));
  float *on = take(&m, C);
  for (int i = 0; i < C; i++) on[i] = 1.0f;
  add(&m, "output_norm.weight", 1, C, 1, 1, on);
  add(&m, "output.weight", 2, C, V, 1, rnd(&m, (size_t)C * V, 0.3f, &rs));
  char n[96];
  for (int l = 0; l < L; l++) {
#define NM(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
    add(&m, NM("attn_norm.weight"), 1, C, 1, 1, on);
    add(&m, NM("ffn_norm.weight"), 1, C, 1, 1, on);
    add(&m, NM("attn_q.weight"), 2, C, C, 1, rnd(&m, (size_t)C * C, 0.3f, &rs));
    add(&m, NM("attn_k.weight"), 2, C, KVD, 1, rnd(&m, (size_t)C * KVD, 0.3f, &rs));
    add(&m, NM("attn_v.weight"), 2, C, KVD, 1, rnd(&m, (size_t)C * KVD, 0.3f, &rs));
    add(&m, NM("attn_output.weight"), 2, C, C, 1, rnd(&m, (size_t)C * C, 0.3f, &rs));
    if (q3 || ol) { // after the dense tensors' stream, so the FFN's values are those of the other layouts
      const int qn = q3 ? C / H : C, kn = q3 ? C / H : KVD;
      float *qw = take(&m, (size_t)qn), *kw = take(&m, (size_t)kn);
      for (int i = 0; i < qn; i++) qw[i] = 1.0f + 0.3f * ll_test_randf(&rs2);
      for (int i = 0; i < kn; i++) kw[i] = 1.0f + 0.3f * ll_test_randf(&rs2);
      add(&m, NM("attn_q_norm.weight"), 1, qn, 1, 1, qw);
      add(&m, NM("attn_k_norm.weight"), 1, kn, 1, 1, kw);
    }
    float *g = rnd(&m, (size_t)C * F, 0.3f, &rs), *u = rnd(&m, (size_t)C * F, 0.3f, &rs), *d = rnd(&m, (size_t)F * C, 0.3f, &rs);
    if (!experts) {
      add(&m, NM("ffn_gate.weight"), 2, C, F, 1, g);
      add(&m, NM("ffn_up.weight"), 2, C, F, 1, u);
      add(&m, NM("ffn_down.weight"), 2, F, C, 1, d);
      continue;
    }
    add(&m, NM("ffn_gate_inp.weight"), 2, C, experts, 1, rnd(&m, (size_t)C * experts, 1.0f, &rs2)); // its own stream
    float *ge = take(&m, (size_t)experts * C * F), *ue = take(&m, (size_t)experts * C * F), *de = take(&m, (size_t)experts * F * C);
    for (int e = 0; e < experts; e++) {
      for (size_t i = 0; i < (size_t)C * F; i++) {
        ge[e * C * F + i] = same_experts ? g[i] : 0.3f * ll_test_randf(&rs2);
        ue[e * C * F + i] = same_experts ? u[i] : 0.3f * ll_test_randf(&rs2);
        de[e * C * F + i] = same_experts ? d[i] : 0.3f * ll_test_randf(&rs2);
      }
    }
    const int bad = break_what && !strcmp(break_what, "shape") && l == 1;
    add(&m, NM("ffn_gate_exps.weight"), 3, C, F, experts, ge);
    add(&m, NM("ffn_up_exps.weight"), 3, C, F, bad ? experts - 1 : experts, ue);
    add(&m, NM("ffn_down_exps.weight"), 3, F, C, experts, de);
    if (shared) {
      add(&m, NM("ffn_gate_inp_shexp.weight"), 1, C, 1, 1, rnd(&m, C, 0.5f, &rs2));
      add(&m, NM("ffn_gate_shexp.weight"), 2, C, FS, 1, rnd(&m, (size_t)C * FS, 0.3f, &rs2));
      add(&m, NM("ffn_up_shexp.weight"), 2, C, FS, 1, rnd(&m, (size_t)C * FS, 0.3f, &rs2));
      add(&m, NM("ffn_down_shexp.weight"), 2, FS, C, 1, rnd(&m, (size_t)FS * C, 0.3f, &rs2));
    }
#undef NM
  }
  char err[256];
  int rc = ll_gguf_write(path, &m.mf, err, sizeof err);
  CHECKF(rc == 0, "write %s: %s", path, err);
  ll_modelfile_free(&m.mf);
  free(m.mem);
  return rc;
}

static struct ll_engine *open_model(const char *path, char *err, size_t errlen) {
  struct ll_engine_params p;
  ll_engine_params_default(&p);
  p.model_path = path;
  p.n_threads = 2;
  p.device = "cpu";
  p.batch_invariant = 1;
  p.n_ctx = CTX;
  p.n_parallel = 4;
  p.kv_f16 = 0; // f32: an f16 cache's rounding steps would magnify the 1e-7 differences compared here
  struct ll_engine *e = NULL;
  if (ll_engine_open(&e, &p, err, errlen) != 0) return NULL;
  return e;
}

// Logits (n, V) of tokens[0..n) on a fresh sequence with adapter a (or none): as one prompt
// (all rows), or decoded one token at a time.
static int run_a(struct ll_engine *e, const struct ll_lora *a, const int32_t *tokens, int n, int one_by_one, float *logits) {
  char err[256];
  int s = ll_engine_seq_new(e), rc = 0;
  if (a) {
    rc = ll_engine_seq_set_adapter(e, s, a, err, sizeof err);
    CHECKF(rc == 0, "adapter: %s", err);
  }
  if (one_by_one) {
    for (int t = 0; t < n && rc == 0; t++) {
      struct ll_batch_item it = {s, 1, tokens + t, 1, logits + (size_t)t * V, NULL};
      rc = ll_engine_decode(e, &it, 1, err, sizeof err);
    }
  } else {
    struct ll_batch_item it = {s, n, tokens, 2, logits, NULL};
    rc = ll_engine_decode(e, &it, 1, err, sizeof err);
  }
  CHECKF(rc == 0, "decode: %s", err);
  ll_engine_seq_free(e, s);
  return rc;
}
static int run(struct ll_engine *e, const int32_t *tokens, int n, int one_by_one, float *logits) { return run_a(e, NULL, tokens, n, one_by_one, logits); }

// Σ cross-entropy of logits (n, V) against targets.
static double xent_sum(const float *logits, const int32_t *tg, int n) {
  double s = 0;
  for (int t = 0; t < n; t++) {
    const float *x = logits + (size_t)t * V;
    double mx = x[0], z = 0;
    for (int i = 1; i < V; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < V; i++) z += exp(x[i] - mx);
    s += mx + log(z) - x[tg[t]];
  }
  return s;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

static double max_abs(const float *a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
  return m;
}

static void test_models(const char *dir, uint64_t *rs) {
  char dense[4200], same[4200], moe[4200], err[512];
  snprintf(dense, sizeof dense, "%s/dense.gguf", dir);
  snprintf(same, sizeof same, "%s/same.gguf", dir);
  snprintf(moe, sizeof moe, "%s/moe.gguf", dir);
  const uint64_t seed = ll_test_rand(rs);
  if (write_model(dense, 0, 0, 0, seed, NULL) || write_model(same, E, K, 1, seed, NULL) || write_model(moe, E, K, 0, seed, NULL)) return;
  enum { N = 24 };
  int32_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (int32_t)(ll_test_rand(rs) % V);
  float *a = malloc((size_t)N * V * sizeof(float)), *b = malloc((size_t)N * V * sizeof(float));
  // 1. every expert the dense FFN: Σ renormalized weights = 1, so the dense model's logits
  struct ll_engine *ed = open_model(dense, err, sizeof err), *es = open_model(same, err, sizeof err);
  CHECKF(ed && es, "open: %s", err);
  if (ed && es) {
    struct ll_engine_info info;
    ll_engine_get_info(es, &info);
    CHECK(info.n_expert == E && info.n_expert_used == K);
    CHECKF(info.n_params_expert == (int64_t)L * 3 * E * C * F, "expert params %lld", (long long)info.n_params_expert);
    CHECKF(info.n_params_active == info.n_params - info.n_params_expert / E * (E - K) - (int64_t)(V - 1) * C, "active params %lld of %lld",
           (long long)info.n_params_active, (long long)info.n_params);
    run(ed, tok, N, 0, a);
    run(ed, tok, N, 1, b);
    printf("dense: prompt vs decode %g\n", max_diff(a, b, (size_t)N * V));
    for (int mode = 0; mode < 2; mode++) {
      run(ed, tok, N, mode, a);
      run(es, tok, N, mode, b);
      const double d = max_diff(a, b, (size_t)N * V);
      CHECKF(d < 1e-5 * max_abs(a, (size_t)N * V), "%s: experts that are all the dense FFN give logits %g away from the dense model's", mode ? "decode" : "prompt", d);
    }
  }
  ll_engine_close(ed);
  ll_engine_close(es);
  // 2. distinct experts: a prompt (one product per expert over its tokens) against one token
  // at a time (only the routed experts) - the same model to float rounding
  struct ll_engine *em = open_model(moe, err, sizeof err);
  CHECKF(em != NULL, "open: %s", err);
  if (em) {
    run(em, tok, N, 0, a);
    run(em, tok, N, 1, b);
    // relative to the logits' size: products summed in other orders (tiles for the prompt's
    // dense products) move logits of ~10 by ~1e-4 through two layers
    const double d = max_diff(a, b, (size_t)N * V), scale = max_abs(a, (size_t)N * V);
    CHECKF(d < 1e-5 * scale, "prompt and decode logits differ by %g (largest logit %g)", d, scale);
    // batch invariance (the server's contract, ll_engine_params.batch_invariant): a sequence's
    // logits are the same bits whether other sequences share its steps, which regroups every
    // expert's rows
    {
      char e2[256];
      float *solo = malloc((size_t)N * V * sizeof(float)), *both = malloc((size_t)(N + 8) * V * sizeof(float));
      run(em, tok, N, 0, solo);
      int32_t other[8];
      for (int i = 0; i < 8; i++) other[i] = (int32_t)(ll_test_rand(rs) % V);
      const int s1 = ll_engine_seq_new(em), s2 = ll_engine_seq_new(em);
      struct ll_batch_item its[2] = {{s2, 8, other, 2, both + (size_t)N * V, NULL}, {s1, N, tok, 2, both, NULL}};
      int rc2 = s1 >= 0 && s2 >= 0 ? ll_engine_decode(em, its, 2, e2, sizeof e2) : -1;
      CHECKF(rc2 == 0, "two sequences in one step: %s", rc2 == -1 ? "no second sequence" : e2);
      // then one more token each, together (decode with other sequences' tokens beside)
      float last1[V], last2[V], alone[V];
      const int32_t t1 = 5, t2 = 9;
      struct ll_batch_item st[2] = {{s1, 1, &t1, 1, last1, NULL}, {s2, 1, &t2, 1, last2, NULL}};
      if (rc2 == 0) rc2 = ll_engine_decode(em, st, 2, e2, sizeof e2);
      CHECKF(rc2 == 0, "decode step of two: %s", e2);
      CHECKF(rc2 == 0 && memcmp(solo, both, (size_t)N * V * sizeof(float)) == 0, "a prompt's logits changed with another sequence in its step (max %g)",
             max_diff(solo, both, (size_t)N * V));
      ll_engine_seq_free(em, s1), ll_engine_seq_free(em, s2);
      int32_t tk[N + 1];
      memcpy(tk, tok, sizeof tok), tk[N] = t1;
      const int s3 = ll_engine_seq_new(em);
      struct ll_batch_item a1 = {s3, N, tok, 0, NULL, NULL}, a2 = {s3, 1, &t1, 1, alone, NULL};
      rc2 = ll_engine_decode(em, &a1, 1, e2, sizeof e2);
      if (rc2 == 0) rc2 = ll_engine_decode(em, &a2, 1, e2, sizeof e2);
      // (F32 dense products sum a lone token as ggml_vec_dot_f32 and two as tinyBLAS tiles, as
      // llama.cpp does: a step of one token and a step of two differ there by float rounding,
      // the dense model as much as this one, so here a tolerance, not bits)
      CHECKF(rc2 == 0 && max_diff(alone, last1, V) < 1e-5 * max_abs(alone, V), "a decode step's logits changed with another sequence beside it (max %g)",
             max_diff(alone, last1, V));
      ll_engine_seq_free(em, s3);
      free(solo), free(both);
    }
    // and the experts matter: the MoE model is not the dense one
    struct ll_engine *e2 = open_model(dense, err, sizeof err);
    if (e2) {
      float *c = malloc((size_t)N * V * sizeof(float));
      run(e2, tok, N, 0, c);
      CHECKF(max_diff(a, c, (size_t)N * V) > 1e-2, "the MoE model's logits equal the dense model's");
      free(c);
      ll_engine_close(e2);
    }
    ll_engine_close(em);
  }
  free(a);
  free(b);
  // 3. malformed files: refused naming the key or the tensor
  char bad[4200];
  snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
  if (write_model(bad, E, K, 0, seed, "used") == 0) {
    struct ll_engine *x = open_model(bad, err, sizeof err);
    CHECKF(!x && strstr(err, "expert_used_count"), "expert_used_count > expert_count: %s", x ? "accepted" : err);
    ll_engine_close(x);
  }
  if (write_model(bad, E, K, 0, seed, "shape") == 0) {
    struct ll_engine *x = open_model(bad, err, sizeof err);
    CHECKF(!x && strstr(err, "blk.1.ffn_up_exps.weight"), "a short 3-D tensor: %s", x ? "accepted" : err);
    ll_engine_close(x);
  }
  unlink(dense), unlink(same), unlink(moe), unlink(bad);
}

// ---------------------------------------------------------------- training through experts

// LoRA on q, k, v, o of an MoE model: every adapter gradient against central differences of
// the summed loss. The gradient reaches the lower layer's adapters through the upper layer's
// experts, their routing weights (softmax, renormalization, per layout: renormalized top k in
// Mixtral's and qwen3moe's, not in qwen2moe's and olmoe's), qwen2moe's sigmoid-gated shared
// expert, and the q/k norms (qwen3moe per head, olmoe whole rows; frozen in LoRA mode):
// ll_moe_backward and the trainer's norms. With `experts`, adapters on every expert's
// gate, up and down too (one pair per expert, most of the parameters): their gradients through
// the routed products, then the adapter served (ll_engine with it on a sequence: the loss of
// its logits equals the trainer's, a prompt equals its tokens decoded one at a time), written
// as a GGUF LoRA (3-D ffn_*_exps tensors) and read back to the same logits' bits.
// The layouts (write_model's break_what): Mixtral's llama, qwen2moe, qwen3moe, olmoe.
static const char *const layout_name[4] = {"mixtral", "qwen2moe", "qwen3moe", "olmoe"};
static const char *const layout_what[4] = {NULL, "shared", "qwen3moe", "olmoe"};

static void serve_expert_adapter(struct ll_engine *e, struct ll_trainer *tr, const char *dir, uint64_t *rs);
static void test_kept(struct ll_engine *e, const struct ll_lora *a, const float *P, int64_t n, uint64_t *rs);
static void test_grads(const char *dir, int layout, int experts, uint64_t *rs) {
  char path[4200], err[256];
  snprintf(path, sizeof path, "%s/train-%d-%d.gguf", dir, layout, experts);
  if (write_model(path, E, K, 0, ll_test_rand(rs), layout_what[layout])) return;
  struct ll_engine *e = open_model(path, err, sizeof err);
  CHECKF(e != NULL, "open: %s", err);
  if (!e) return;
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.rank = 4, p.alpha = 8, p.batch = 2, p.seq_len = 8, p.lr = 1e-2, p.steps = 10, p.seed = 7;
  p.targets = (1u << LL_LORA_Q) | (1u << LL_LORA_K) | (1u << LL_LORA_V) | (1u << LL_LORA_O) | (experts ? LL_LORA_EXPERT_TARGETS : 0);
  p.arch = layout ? layout_name[layout] : "llama";
  struct ll_trainer *tr = NULL;
  int rc = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  CHECKF(rc == 0, "trainer: %s", err);
  if (rc == 0) {
    const struct ll_lora *lo = ll_trainer_lora(tr);
    uint64_t bs = 99;
    CHECK(!experts || (lo->targets & LL_LORA_EXPERT_TARGETS) == LL_LORA_EXPERT_TARGETS);
    for (int l = 0; l < lo->n_layer; l++) // B starts at zero (every A gradient zero): values first
      for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
        struct ll_lora_pair *pr = ll_lora_at(lo, l, t);
        for (int64_t i = 0; pr->b.data && i < pr->b.k * pr->b.n; i++) ((float *)pr->b.data)[i] = 0.3f * ll_test_randf(&bs);
      }
    // A batch whose tokens sit on a routing tie (two experts' probabilities within what a step
    // of h moves them) makes most parameters kinks: then another batch, up to 4.
    int kinks = 0, bad = 0, lower = 0;
    double max_err = 0, max_g = 0;
    float *P, *G;
    int64_t n;
    ll_trainer_vectors(tr, &P, &G, &n);
    float *g = malloc((size_t)n * sizeof *g);
    for (int attempt = 0; attempt < 4 && rc == 0; attempt++) {
      int32_t ids[16], tg[16];
      for (int i = 0; i < 16; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = (int32_t)(ll_test_rand(rs) % V);
      ll_trainer_zero_grad(tr);
      double loss, lp, lm;
      rc = ll_trainer_forward_backward(tr, ids, tg, 2, 1, 1.0f, &loss, NULL, err, sizeof err);
      CHECKF(rc == 0, "%s", err);
      memcpy(g, G, (size_t)n * sizeof *g);
      kinks = bad = lower = 0, max_err = max_g = 0;
      const double h = 1e-3;
      for (int c = 0; c < 80 && rc == 0; c++) {
        // half of the checks in layer 0's adapters: their gradient crossed layer 1's experts
        const int64_t i = c % 2 ? (int64_t)(ll_test_rand(rs) % (uint64_t)(n / 2)) : (int64_t)(ll_test_rand(rs) % (uint64_t)n);
        lower += i < n / 2;
        const float keep = P[i];
        P[i] = (float)(keep + h);
        rc |= ll_trainer_forward_backward(tr, ids, tg, 2, 0, 1.0f, &lp, NULL, err, sizeof err);
        P[i] = (float)(keep - h);
        rc |= ll_trainer_forward_backward(tr, ids, tg, 2, 0, 1.0f, &lm, NULL, err, sizeof err);
        P[i] = keep;
        // top-k routing is piecewise: a step that changes a token's experts jumps the loss. Such
        // a kink shows as one-sided differences that disagree; those parameters are not checked.
        const double up = (lp - loss) / ((double)(float)(keep + h) - keep), dn = (loss - lm) / (keep - (double)(float)(keep - h));
        if (fabs(up - dn) > 0.1 * fmax(fabs(up), fabs(dn)) + 0.05) {
          kinks++;
          continue;
        }
        const double fd = (lp - lm) / ((double)(float)(keep + h) - (double)(float)(keep - h)), d = fabs(fd - g[i]);
        max_err = fmax(max_err, d), max_g = fmax(max_g, fabs(fd));
        if (d > 2e-3 + 3e-2 * fabs(fd) && bad++ < 5) fprintf(stderr, "param %lld: analytic %.6g, finite differences %.6g\n", (long long)i, g[i], fd);
      }
      printf("%s%s: batch %d, 80 adapter gradients (%d in layer 0; %d at a routing kink, not checked), max |g_fd| %.4g, max |error| %.3g\n",
             layout_name[layout], experts ? " (adapters on attention and experts)" : "", attempt, lower, kinks, max_g, max_err);
      if (kinks <= 4) break;
    }
    CHECKF(kinks <= 4, "%d of 80 parameters at routing kinks", kinks);
    CHECKF(rc == 0, "%s", err);
    CHECKF(bad == 0, "%d of 80 gradients off the finite differences", bad);
    CHECK(max_g > 1e-3);
    free(g);
    if (experts) serve_expert_adapter(e, tr, dir, rs);
    test_kept(e, experts ? lo : NULL, P, n, rs);
    ll_trainer_free(tr);
  }
  // what is refused: FFN targets, full-parameter training
  p.targets = LL_LORA_ALL_TARGETS;
  rc = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  CHECKF(rc == LL_EUNSUPPORTED && strstr(err, "gate/up/down"), "FFN targets on an MoE model: %s", rc ? err : "accepted");
  if (rc == 0) ll_trainer_free(tr);
  ll_engine_close(e);
  unlink(path);
}

static void serve_shexp_adapter(struct ll_engine *e, struct ll_trainer *tr, const char *dir, uint64_t *rs);

// LoRA dropout on the experts' adapters, or on qwen2moe's shared expert's (targets: only those
// adapted, so that what dropout changes is theirs): a training forward's loss differs from the
// evaluation one's (the mask is applied), and the gradient with dropout on equals central
// differences of the training loss (the same mask every call: the trainer's seed does not move
// between them). The shared expert's adapter is then served, exported and read back.
static void test_dropout_grads(const char *dir, int layout, unsigned targets, uint64_t *rs) {
  char path[4200], err[256];
  snprintf(path, sizeof path, "%s/drop-%d.gguf", dir, layout);
  if (write_model(path, E, K, 0, ll_test_rand(rs), layout_what[layout])) return;
  struct ll_engine *e = open_model(path, err, sizeof err);
  CHECKF(e != NULL, "open: %s", err);
  if (!e) return;
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.rank = 4, p.alpha = 8, p.batch = 2, p.seq_len = 8, p.lr = 1e-2, p.steps = 10, p.seed = 7, p.dropout = 0.3f;
  p.targets = targets;
  p.arch = layout ? layout_name[layout] : "llama";
  struct ll_trainer *tr = NULL;
  int rc = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  CHECKF(rc == 0, "trainer with dropout on expert adapters: %s", err);
  const char *what = targets == LL_LORA_SHEXP_TARGETS ? "the shared expert's adapters" : "the expert adapters";
  if (rc == 0) {
    float *P, *G;
    int64_t n;
    ll_trainer_vectors(tr, &P, &G, &n);
    uint64_t bs = 98;
    for (int64_t i = 0; i < n; i++) P[i] = 0.3f * ll_test_randf(&bs); // B nonzero: A's gradients too
    float *g = malloc((size_t)n * sizeof *g);
    int kinks = 0, bad = 0;
    double max_err = 0, max_g = 0, l_train = 0, l_eval = 0;
    for (int attempt = 0; attempt < 4 && rc == 0; attempt++) {
      int32_t ids[16], tg[16];
      for (int i = 0; i < 16; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = (int32_t)(ll_test_rand(rs) % V);
      ll_trainer_zero_grad(tr);
      double loss, lp, lm;
      rc = ll_trainer_forward_backward(tr, ids, tg, 2, 0, 1.0f, &l_eval, NULL, err, sizeof err);
      if (rc == 0) rc = ll_trainer_forward_backward(tr, ids, tg, 2, 1, 1.0f, &loss, NULL, err, sizeof err);
      CHECKF(rc == 0, "%s", err);
      l_train = loss;
      memcpy(g, G, (size_t)n * sizeof *g);
      kinks = bad = 0, max_err = max_g = 0;
      const double h = 1e-3;
      for (int c = 0; c < 60 && rc == 0; c++) {
        const int64_t i = (int64_t)(ll_test_rand(rs) % (uint64_t)n);
        const float keep = P[i];
        P[i] = (float)(keep + h);
        rc |= ll_trainer_forward_backward(tr, ids, tg, 2, 1, 1.0f, &lp, NULL, err, sizeof err);
        P[i] = (float)(keep - h);
        rc |= ll_trainer_forward_backward(tr, ids, tg, 2, 1, 1.0f, &lm, NULL, err, sizeof err);
        P[i] = keep;
        const double up = (lp - loss) / ((double)(float)(keep + h) - keep), dn = (loss - lm) / (keep - (double)(float)(keep - h));
        if (fabs(up - dn) > 0.1 * fmax(fabs(up), fabs(dn)) + 0.05) { // a routing kink (test_grads)
          kinks++;
          continue;
        }
        const double fd = (lp - lm) / ((double)(float)(keep + h) - (double)(float)(keep - h)), d = fabs(fd - g[i]);
        max_err = fmax(max_err, d), max_g = fmax(max_g, fabs(fd));
        if (d > 2e-3 + 3e-2 * fabs(fd) && bad++ < 5) fprintf(stderr, "dropout: param %lld: analytic %.6g, finite differences %.6g\n", (long long)i, g[i], fd);
      }
      printf("%s, dropout 0.3 on %s: batch %d, loss %.6f (evaluation, no dropout: %.6f); 60 gradients (%d at a routing kink), "
             "max |g_fd| %.4g, max |error| %.3g\n",
             layout_name[layout], what, attempt, l_train, l_eval, kinks, max_g, max_err);
      if (kinks <= 3) break;
    }
    CHECKF(rc == 0, "%s", err);
    // Without dropout the two losses are the same bits; with it they differ by ~1e-2 relative for
    // most seeds but by as little as 9e-5 for some (LL_TEST_SEED=1795775076303264), so the bound
    // only asks that they differ by more than rounding.
    CHECKF(fabs(l_train - l_eval) > 1e-7 * fabs(l_eval), "dropout did not change the training loss (%.9g vs %.9g)", l_train, l_eval);
    CHECKF(kinks <= 3, "%d of 60 parameters at routing kinks", kinks);
    CHECKF(bad == 0, "%d of 60 gradients with dropout off the finite differences", bad);
    CHECK(max_g > 1e-3);
    free(g);
    if (targets == LL_LORA_SHEXP_TARGETS) serve_shexp_adapter(e, tr, dir, rs);
    ll_trainer_free(tr);
  }
  ll_engine_close(e);
  unlink(path);
}

// qwen2moe's shared expert's adapter served per sequence: a prompt's loss equals the trainer's
// (no dropout), decoding one token at a time gives the prompt's logits, it changes the logits;
// exported as GGUF (2-D blk.N.ffn_*_shexp.weight.lora_a/b, llama.cpp's names) it reads back to
// the same logits, also without the base model's dimensions (the width from the tensors).
static void serve_shexp_adapter(struct ll_engine *e, struct ll_trainer *tr, const char *dir, uint64_t *rs) {
  char err[256], f[4200];
  const struct ll_lora *lo = ll_trainer_lora(tr);
  CHECK(lo->targets == LL_LORA_SHEXP_TARGETS && lo->n_params == (int64_t)L * lo->rank * 3 * (C + FS));
  int32_t ids[16], tg[16];
  for (int i = 0; i < 16; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = (int32_t)(ll_test_rand(rs) % V);
  double ltr = 0, lsv = 0;
  int rc = ll_trainer_forward_backward(tr, ids, tg, 2, 0, 1.0f, &ltr, NULL, err, sizeof err);
  CHECKF(rc == 0, "trainer forward: %s", err);
  float *lg = malloc(sizeof(float) * 8 * V * 4), *lg1 = lg + 8 * V, *lg2 = lg1 + 8 * V, *lg3 = lg2 + 8 * V;
  double dmax = 0, amax = 0, emax = 0;
  for (int b = 0; b < 2; b++) {
    run_a(e, lo, ids + 8 * b, 8, 0, lg);
    run_a(e, lo, ids + 8 * b, 8, 1, lg1);
    run_a(e, NULL, ids + 8 * b, 8, 0, lg2);
    lsv += xent_sum(lg, tg + 8 * b, 8);
    dmax = fmax(dmax, max_diff(lg, lg1, 8 * V)), amax = fmax(amax, max_abs(lg, 8 * V)), emax = fmax(emax, max_diff(lg, lg2, 8 * V));
  }
  printf("shared expert's adapter served: loss %.6f (trainer %.6f); prompt vs decode max |diff| %.3g of max |logit| %.3g; it moves logits by up to %.3g\n",
         lsv, ltr, dmax, amax, emax);
  CHECKF(fabs(lsv - ltr) < 1e-4 * fabs(ltr), "served loss %.7g, trainer's %.7g", lsv, ltr);
  CHECKF(emax > 1e-2 * amax, "the shared expert's adapter changes nothing (%.3g of %.3g)", emax, amax);
  CHECKF(dmax <= 1e-5 * amax, "prompt vs one-by-one: %.3g", dmax);
  snprintf(f, sizeof f, "%s/shexp.gguf", dir);
  CHECKF(ll_lora_save_gguf(lo, f, err, sizeof err) == 0, "%s", err);
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  if (ll_gguf_open(f, &mf, err, sizeof err) == 0) {
    const struct ll_tensor_info *ta = ll_mf_find_tensor(&mf, "blk.1.ffn_down_shexp.weight.lora_a"), *tb = ll_mf_find_tensor(&mf, "blk.0.ffn_up_shexp.weight.lora_b");
    CHECK(ta && ta->n_dims == 2 && ta->ne[0] == FS && ta->ne[1] == lo->rank); // {in, r}
    CHECK(tb && tb->n_dims == 2 && tb->ne[0] == lo->rank && tb->ne[1] == FS); // {r, out}
    ll_modelfile_free(&mf);
  } else {
    CHECKF(0, "%s", err);
  }
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  struct ll_lora *back = NULL, *inferred = NULL;
  CHECKF(ll_lora_load(&back, f, &d, NULL, err, sizeof err) == 0, "%s", err);
  CHECKF(ll_lora_load(&inferred, f, NULL, NULL, err, sizeof err) == 0, "%s", err);
  if (inferred) {
    CHECK(inferred->n_params == lo->n_params && inferred->targets == lo->targets);
    ll_lora_free(inferred);
  }
  if (back) {
    CHECK(back->targets == lo->targets && back->n_params == lo->n_params);
    run_a(e, lo, ids, 8, 0, lg);
    run_a(e, back, ids, 8, 0, lg3);
    CHECK(memcmp(lg, lg3, sizeof(float) * 8 * V) == 0);
    ll_lora_free(back);
  }
  d.n_ff_sh = 0; // a base model without a shared expert refuses it
  CHECKF(ll_lora_load(&back, f, &d, NULL, err, sizeof err) != 0 && strstr(err, "ffn_gate_shexp"), "%s", back ? "accepted" : err);
  if (back) ll_lora_free(back);
  unlink(f);
  free(lg);
}

// ll_moe_backward with the forward kept (ll_moe_forward's keep) against the same backward
// recomputing it (a kept slot is used once): the same input gradient and adapter gradients, bit
// for bit, on one layer with adapter a on its experts (or none).
static void test_kept(struct ll_engine *e, const struct ll_lora *a, const float *P, int64_t n, uint64_t *rs) {
  char err[256];
  const struct ll_model *m = ll_engine_model(e);
  struct ll_backend *be = ll_engine_backend(e);
  struct ll_moe_ctx *c = NULL;
  const int T = 12;
  int rc = ll_moe_ctx_new(&c, be, m, T, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  if (rc) return;
  float *xn = malloc(sizeof(float) * T * C * 4), *x = xn + T * C, *dy = x + T * C, *dx = dy + T * C;
  float *g1 = calloc((size_t)n * 2, sizeof(float)), *g2 = g1 + n;
  for (int i = 0; i < T * C; i++) xn[i] = ll_test_randf(rs), dy[i] = ll_test_randf(rs), x[i] = 0;
  const struct ll_moe_lora lo1 = {NULL, a, 1, P, g1, NULL, 0, 0}, lo2 = {NULL, a, 1, P, g2, NULL, 0, 0};
  float *dx2 = malloc(sizeof(float) * T * C);
  memset(dx, 0, sizeof(float) * T * C), memset(dx2, 0, sizeof(float) * T * C);
  rc = ll_moe_forward(c, m->layers[1].moe, a ? &lo1 : NULL, 3, x, xn, T, err, sizeof err);
  if (rc == 0) rc = ll_moe_backward(c, be->i, m->layers[1].moe, NULL, a ? &lo1 : NULL, 3, dx, xn, dy, T, err, sizeof err);  // kept
  if (rc == 0) rc = ll_moe_backward(c, be->i, m->layers[1].moe, NULL, a ? &lo2 : NULL, 3, dx2, xn, dy, T, err, sizeof err); // used: recomputed
  CHECKF(rc == 0, "%s", err);
  double mx = 0;
  for (int i = 0; i < T * C; i++) mx = fmax(mx, fabs(dx[i]));
  CHECKF(mx > 0 && memcmp(dx, dx2, sizeof(float) * T * C) == 0, "kept forward vs recomputed: input gradients differ (max |dx| %g)", mx);
  CHECKF(memcmp(g1, g2, sizeof(float) * (size_t)n) == 0, "kept forward vs recomputed: adapter gradients differ");
  free(dx2), free(g1), free(xn);
  ll_moe_ctx_free(c);
}

// Adapter a as a PEFT directory (issue 32), F32, HF names: attention's q/k/v/o_proj (on llama
// q/k lora_B rows in HF order, the inverse of llama.cpp's permutation) and one 2-D pair per
// expert - Mixtral's block_sparse_moe.experts.N.w1/w3/w2 on llama, mlp.experts.N.gate_proj/
// up_proj/down_proj on qwen2moe, qwen3moe, olmoe. skip_expert >= 0 leaves that expert's gate
// lora_A out of layer 0; router 1 adds a LoRA pair on the router (mlp.gate / block_sparse_moe.gate).
static int write_peft_moe(const char *dir, const struct ll_lora *a, const struct ll_lora_dims *d, int skip_expert, int router) {
  static const char *const mixtral[3] = {"w1", "w3", "w2"}, *const hf[3] = {"gate_proj", "up_proj", "down_proj"};
  const int llama = !strcmp(d->arch, "llama");
  char p[4300];
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  FILE *f = fopen(p, "w");
  if (!f) return -1;
  fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %g, \"bias\": \"none\"}\n", a->rank, (double)a->alpha);
  fclose(f);
  // the tensors in file order: (name, data, rows, cols, HF-permuted rows of heads)
  struct ent {
    char name[128];
    const float *data;
    int64_t rows, cols;
    int heads;
  } *ents = calloc(4096, sizeof *ents);
  int n = 0;
  float *rz = calloc((size_t)a->rank * C, sizeof(float));
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      const struct ll_lora_pair *pr = ll_lora_at(a, l, t);
      if (!pr->a.data) continue;
      const int ne = ll_lora_is_expert(t) ? a->n_expert : 1;
      for (int x = 0; x < ne; x++)
        for (int w = 0; w < 2 && n < 4096; w++) {
          const struct ll_weight *m = w ? &pr->b : &pr->a;
          const int64_t rows = m->n / ne;
          if (!w && l == 0 && t == LL_LORA_GATE_EXPS && x == skip_expert) continue;
          struct ent *en = &ents[n++];
          if (ll_lora_is_expert(t))
            snprintf(en->name, sizeof en->name, "base_model.model.model.layers.%d.%s.experts.%d.%s.lora_%c.weight", l, llama ? "block_sparse_moe" : "mlp",
                     x, (llama ? mixtral : hf)[(t - LL_LORA_GATE_EXPS) % 3], w ? 'B' : 'A');
          else
            snprintf(en->name, sizeof en->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l, t <= LL_LORA_O ? "self_attn" : "mlp",
                     ll_lora_target_peft(t), w ? 'B' : 'A');
          en->data = (const float *)m->data + (size_t)x * (size_t)(rows * m->k);
          en->rows = rows, en->cols = m->k;
          en->heads = w && llama && (t == LL_LORA_Q || t == LL_LORA_K) ? (t == LL_LORA_Q ? d->n_head : d->n_head_kv) : 0;
        }
    }
  if (router && n + 2 <= 4096) {
    for (int w = 0; w < 2; w++) {
      struct ent *en = &ents[n++];
      snprintf(en->name, sizeof en->name, "base_model.model.model.layers.0.%s.gate.lora_%c.weight", llama ? "block_sparse_moe" : "mlp", w ? 'B' : 'A');
      en->data = rz, en->rows = w ? E : a->rank, en->cols = w ? a->rank : C, en->heads = 0;
    }
  }
  size_t cap = 1 << 20, hl = 0;
  char *h = malloc(cap);
  uint64_t off = 0;
  hl += (size_t)snprintf(h + hl, cap - hl, "{");
  for (int i = 0; i < n; i++) {
    const uint64_t nb = (uint64_t)(ents[i].rows * ents[i].cols) * 4;
    hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld], \"data_offsets\": [%llu, %llu]}", i ? ", " : "",
                           ents[i].name, (long long)ents[i].rows, (long long)ents[i].cols, (unsigned long long)off, (unsigned long long)(off + nb));
    off += nb;
  }
  hl += (size_t)snprintf(h + hl, cap - hl, "}");
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  f = fopen(p, "wb");
  int rc = f ? 0 : -1;
  if (f) {
    const uint64_t hn = hl;
    fwrite(&hn, 8, 1, f);
    fwrite(h, 1, hl, f);
    for (int i = 0; i < n; i++) {
      const struct ent *en = &ents[i];
      if (!en->heads) {
        fwrite(en->data, 4, (size_t)(en->rows * en->cols), f);
        continue;
      }
      const int64_t hd = en->rows / en->heads;
      for (int64_t hr = 0; hr < en->rows; hr++) { // HF row h*hd + i*hd/2 + j <- GGUF row h*hd + 2j + i
        const int64_t hh = hr / hd, rem = hr % hd, ii = rem / (hd / 2), j = rem % (hd / 2);
        fwrite(en->data + (hh * hd + 2 * j + ii) * en->cols, 4, (size_t)en->cols, f);
      }
    }
    rc = fclose(f);
  }
  free(h), free(ents), free(rz);
  return rc;
}

static void rm_peft(const char *dir) {
  char p[4300];
  snprintf(p, sizeof p, "%s/adapter_config.json", dir), unlink(p);
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir), unlink(p);
  rmdir(dir);
}

// The trainer's adapter on attention and every expert, written as PEFT writes it for the HF
// model, imported: the engine's logits with it are the same bits as with the adapter itself;
// an expert left out and a router adapter are refused with the tensor named.
static void peft_experts(struct ll_engine *e, const struct ll_lora *lo, const char *dir, const int32_t *ids, const float *want) {
  char err[512], pd[4200];
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  snprintf(pd, sizeof pd, "%s/peft-%s", dir, d.arch);
  CHECK(write_peft_moe(pd, lo, &d, -1, 0) == 0);
  struct ll_lora *pf = NULL;
  int rc = ll_lora_load(&pf, pd, &d, NULL, err, sizeof err);
  CHECKF(rc == 0, "%s: PEFT import: %s", d.arch, err);
  if (pf) {
    float *lg = malloc(sizeof(float) * 8 * V);
    CHECK(pf->targets == lo->targets && pf->n_expert == E && pf->n_params == lo->n_params);
    run_a(e, pf, ids, 8, 0, lg);
    CHECKF(memcmp(lg, want, sizeof(float) * 8 * V) == 0, "%s: logits with the PEFT import differ from the adapter's", d.arch);
    printf("%s: PEFT adapter with per-expert modules imported (%lld parameters), logits equal the adapter's\n", d.arch, (long long)pf->n_params);
    free(lg);
    ll_lora_free(pf), pf = NULL;
  }
  rm_peft(pd);
  CHECK(write_peft_moe(pd, lo, &d, 1, 0) == 0);
  rc = ll_lora_load(&pf, pd, &d, NULL, err, sizeof err);
  CHECKF(rc != 0 && !pf && strstr(err, "expert 1 is missing"), "%s: an expert left out: %s", d.arch, rc ? err : "accepted");
  rm_peft(pd);
  CHECK(write_peft_moe(pd, lo, &d, -1, 1) == 0);
  rc = ll_lora_load(&pf, pd, &d, NULL, err, sizeof err);
  CHECKF(rc != 0 && !pf && strstr(err, "router") && strstr(err, ".gate.lora_A"), "%s: a router adapter: %s", d.arch, rc ? err : "accepted");
  if (pf) ll_lora_free(pf);
  rm_peft(pd);
}

static void serve_expert_adapter(struct ll_engine *e, struct ll_trainer *tr, const char *dir, uint64_t *rs) {
  char err[256], f[4200];
  const struct ll_lora *lo = ll_trainer_lora(tr);
  int32_t ids[16], tg[16];
  for (int i = 0; i < 16; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = (int32_t)(ll_test_rand(rs) % V);
  double ltr = 0, lsv = 0, lbase = 0;
  int64_t nc = 0;
  int rc = ll_trainer_forward_backward(tr, ids, tg, 2, 0, 1.0f, &ltr, &nc, err, sizeof err);
  CHECKF(rc == 0 && nc == 16, "trainer forward: %s", err);
  float *lg = malloc(sizeof(float) * 8 * V * 4), *lg1 = lg + 8 * V, *lg2 = lg1 + 8 * V, *lg3 = lg2 + 8 * V;
  double dmax = 0, amax = 0, emax = 0;
  for (int b = 0; b < 2; b++) {
    run_a(e, lo, ids + 8 * b, 8, 0, lg);  // a prompt: the experts' adapters over grouped rows
    run_a(e, lo, ids + 8 * b, 8, 1, lg1); // decoded one token at a time (k routed experts per token)
    run_a(e, NULL, ids + 8 * b, 8, 0, lg2);
    lsv += xent_sum(lg, tg + 8 * b, 8), lbase += xent_sum(lg2, tg + 8 * b, 8);
    dmax = fmax(dmax, max_diff(lg, lg1, 8 * V)), amax = fmax(amax, max_abs(lg, 8 * V));
    emax = fmax(emax, max_diff(lg, lg2, 8 * V));
  }
  printf("expert adapter served: loss %.6f (trainer %.6f, without the adapter %.6f); prompt vs decode max |diff| %.3g of max |logit| %.3g;"
         " the adapter moves logits by up to %.3g\n", lsv, ltr, lbase, dmax, amax, emax);
  CHECKF(fabs(lsv - ltr) < 1e-4 * fabs(ltr), "served loss %.7g, trainer's %.7g", lsv, ltr);
  // The summed loss may move either way by chance (76.637 -> 76.633 for one seed), so the
  // adapter's effect is asserted on the logits themselves.
  CHECKF(emax > 1e-2 * amax, "the adapter changes nothing (logits move by %.3g of %.3g)", emax, amax);
  CHECKF(dmax <= 1e-5 * amax, "prompt vs one-by-one: %.3g", dmax);
  // export / import: 3-D ffn_*_exps tensors, read back to the same bits
  snprintf(f, sizeof f, "%s/experts.gguf", dir);
  CHECKF(ll_lora_save_gguf(lo, f, err, sizeof err) == 0, "%s", err);
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  rc = ll_gguf_open(f, &mf, err, sizeof err);
  CHECKF(rc == 0, "%s", err);
  if (rc == 0) {
    const struct ll_tensor_info *ta = ll_mf_find_tensor(&mf, "blk.1.ffn_down_exps.weight.lora_a"), *tb = ll_mf_find_tensor(&mf, "blk.0.ffn_gate_exps.weight.lora_b");
    CHECK(ta && ta->n_dims == 3 && ta->ne[0] == F && ta->ne[1] == lo->rank && ta->ne[2] == E); // {in, r, E}
    CHECK(tb && tb->n_dims == 3 && tb->ne[0] == lo->rank && tb->ne[1] == F && tb->ne[2] == E); // {r, out, E}
    ll_modelfile_free(&mf);
  }
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  struct ll_lora *back = NULL;
  CHECKF(ll_lora_load(&back, f, &d, NULL, err, sizeof err) == 0, "%s", err);
  struct ll_lora *inferred = NULL; // without the base model: the experts' count and width from the tensors
  CHECKF(ll_lora_load(&inferred, f, NULL, NULL, err, sizeof err) == 0, "%s", err);
  if (inferred) {
    CHECK(inferred->n_expert == E && inferred->n_params == lo->n_params);
    ll_lora_free(inferred);
  }
  if (back) {
    CHECK(back->targets == lo->targets && back->n_expert == E && back->n_params == lo->n_params);
    run_a(e, lo, ids, 8, 0, lg);
    run_a(e, back, ids, 8, 0, lg3);
    CHECK(memcmp(lg, lg3, sizeof(float) * 8 * V) == 0);
    ll_lora_free(back);
    peft_experts(e, lo, dir, ids, lg);
  }
  // a base model with other experts refuses it
  d.n_expert = E + 1;
  CHECKF(ll_lora_load(&back, f, &d, NULL, err, sizeof err) != 0 && strstr(err, "expert"), "an adapter for %d experts on %d: %s", E, E + 1,
         back ? "accepted" : err);
  if (back) ll_lora_free(back);
  unlink(f);
  free(lg);
}

// Full-parameter training of an MoE model: the objective is the summed LM loss plus the
// load-balancing loss (ll_trainer_aux_take); every checked gradient against central
// differences of it. Groups: each layer's router, its three expert tensors (only the routed
// rows of an expert get a gradient), attention's q. aux_only: no counted targets, so the
// objective is the auxiliary loss alone (its gradient reaches the router and, through xn,
// everything below).
static double objective(struct ll_trainer *tr, const int32_t *ids, const int32_t *tg, int *rc, char *err, size_t errlen) {
  double loss = 0;
  *rc |= ll_trainer_forward_backward(tr, ids, tg, 2, 1, 1.0f, &loss, NULL, err, errlen);
  return loss + ll_trainer_aux_take(tr);
}

static void test_full_grads(const char *dir, int layout, int aux_only, uint64_t *rs) {
  char path[4200], err[256];
  snprintf(path, sizeof path, "%s/full-%d-%d.gguf", dir, layout, aux_only);
  if (write_model(path, E, K, 0, ll_test_rand(rs), layout_what[layout])) return;
  struct ll_engine *e = open_model(path, err, sizeof err);
  CHECKF(e != NULL, "open: %s", err);
  if (!e) return;
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.mode = LL_TRAIN_FULL, p.batch = 2, p.seq_len = 8, p.lr = 1e-2, p.steps = 10, p.seed = 7, p.moe_aux_coef = 0.5;
  p.arch = layout ? layout_name[layout] : "llama";
  struct ll_trainer *tr = NULL;
  int rc = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  CHECKF(rc == 0, "full-mode trainer on an MoE model: %s", err);
  if (rc) {
    ll_engine_close(e);
    unlink(path);
    return;
  }
  float *P, *G;
  int64_t n;
  ll_trainer_vectors(tr, &P, &G, &n);
  const struct ll_model *m = ll_trainer_model(tr);
  // (group, first parameter, count): per layer the router, gate, up, down experts, q; then
  // where the layout has them, the shared expert's gate and its gate logit's weights
  // (qwen2moe), the q and k norms' weights (qwen3moe: a head's, olmoe: whole rows)
  const char *gname[9] = {"router", "gate_exps", "up_exps", "down_exps", "attn_q", "ffn_gate_shexp", "ffn_gate_inp_shexp", "attn_q_norm", "attn_k_norm"};
  int64_t g0[L][9], gn[9] = {(int64_t)E * C, (int64_t)E * F * C, (int64_t)E * F * C, (int64_t)E * F * C, (int64_t)C * C, (int64_t)FS * C, C, 0, 0};
  int grp[9], ng = 0;
  for (int j = 0; j < 5; j++) grp[ng++] = j;
  if (layout == 1) grp[ng++] = 5, grp[ng++] = 6;
  if (layout >= 2) grp[ng++] = 7, grp[ng++] = 8, gn[7] = layout == 2 ? C / H : C, gn[8] = layout == 2 ? C / H : KVD;
  for (int l = 0; l < L; l++) {
    const struct ll_moe_layer *x = m->layers[l].moe;
    CHECK(x != NULL);
    if (!x) return;
    const float *base[9] = {x->router.data,  x->gate[0].data,      x->up[0].data,         x->down[0].data,      m->layers[l].wq.data,
                            x->sh_gate.data, x->sh_router.data, m->layers[l].q_norm, m->layers[l].k_norm};
    for (int j = 0; j < 9; j++) g0[l][j] = base[j] ? base[j] - P : -1;
    for (int i = 0; i < ng; i++) CHECKF(g0[l][grp[i]] >= 0 && g0[l][grp[i]] + gn[grp[i]] <= n, "layer %d %s is not in the parameters", l, gname[grp[i]]);
    CHECK(g0[l][1] + gn[1] == (const float *)x->gate[E - 1].data - P + (int64_t)F * C); // experts one after another
  }
  float *g = malloc((size_t)n * sizeof *g);
  int kinks = 0, bad = 0, checked = 0;
  double max_g[9] = {0}, max_err = 0;
  for (int attempt = 0; attempt < 4 && rc == 0; attempt++) {
    int32_t ids[16], tg[16];
    for (int i = 0; i < 16; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = aux_only ? -1 : (int32_t)(ll_test_rand(rs) % V);
    ll_trainer_zero_grad(tr);
    ll_trainer_aux_take(tr);
    const double f0 = objective(tr, ids, tg, &rc, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    memcpy(g, G, (size_t)n * sizeof *g);
    kinks = bad = checked = 0, max_err = 0;
    memset(max_g, 0, sizeof max_g);
    const double h = 1e-3;
    for (int c = 0; c < 20 * ng && rc == 0; c++) {
      const int l = c % L, j = grp[(c / L) % ng];
      // experts: half the checks on rows with a gradient (a routed token), the others anywhere
      int64_t i = g0[l][j] + (int64_t)(ll_test_rand(rs) % (uint64_t)gn[j]);
      for (int tries = 0; j >= 1 && j <= 3 && c % 4 < 2 && g[i] == 0 && tries < 200; tries++) i = g0[l][j] + (int64_t)(ll_test_rand(rs) % (uint64_t)gn[j]);
      const float keep = P[i];
      P[i] = (float)(keep + h);
      const double fp = objective(tr, ids, tg, &rc, err, sizeof err);
      P[i] = (float)(keep - h);
      const double fm = objective(tr, ids, tg, &rc, err, sizeof err);
      P[i] = keep;
      const double up = (fp - f0) / ((double)(float)(keep + h) - keep), dn = (f0 - fm) / (keep - (double)(float)(keep - h));
      if (fabs(up - dn) > 0.1 * fmax(fabs(up), fabs(dn)) + 0.05 * (aux_only ? 0.01 : 1)) {
        kinks++;
        continue;
      }
      const double fd = (fp - fm) / ((double)(float)(keep + h) - (double)(float)(keep - h)), d = fabs(fd - g[i]);
      checked++;
      max_err = fmax(max_err, d), max_g[j] = fmax(max_g[j], fabs(fd));
      const double tol = aux_only ? 1e-4 + 3e-2 * fabs(fd) : 2e-3 + 3e-2 * fabs(fd);
      if (d > tol && bad++ < 5)
        fprintf(stderr, "layer %d %s param %lld: analytic %.6g, finite differences %.6g\n", l, gname[j], (long long)(i - g0[l][j]), g[i], fd);
    }
    printf("full mode, %s%s: batch %d, %d gradients checked (%d at a routing kink), max |g_fd| router %.3g gate %.3g up %.3g down %.3g q %.3g", layout_name[layout],
           aux_only ? " (aux loss only)" : "", attempt, checked, kinks, max_g[0], max_g[1], max_g[2], max_g[3], max_g[4]);
    for (int i = 5; i < ng; i++) printf(" %s %.3g", gname[grp[i]], max_g[grp[i]]);
    printf(", max |error| %.3g\n", max_err);
    if (kinks <= ng) break;
  }
  CHECKF(rc == 0, "%s", err);
  CHECKF(kinks <= ng, "%d of %d parameters at routing kinks", kinks, 20 * ng);
  CHECKF(bad == 0, "%d of %d gradients off the finite differences", bad, checked);
  CHECKF(max_g[0] > (aux_only ? 1e-5 : 1e-3), "router gradient %g", max_g[0]); // the router learns (from the aux loss alone, too)
  if (!aux_only) CHECK(max_g[1] > 1e-3 && max_g[2] > 1e-3 && max_g[3] > 1e-3);
  for (int i = 5; !aux_only && i < ng; i++) CHECKF(max_g[grp[i]] > 1e-4, "%s: gradient %g", gname[grp[i]], max_g[grp[i]]); // each reached
  // Layers recomputed in the backward (train.recompute: one kept slot reused by every layer)
  // give the same gradient, bit for bit, as the forward kept per layer.
  if (!aux_only) {
    struct ll_trainer *tr2 = NULL;
    p.recompute = 1;
    rc = ll_trainer_create(&tr2, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc == 0) {
      float *P2, *G2;
      int64_t n2;
      ll_trainer_vectors(tr2, &P2, &G2, &n2);
      int32_t ids[16], tg[16];
      for (int i = 0; i < 16; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = (int32_t)(ll_test_rand(rs) % V);
      double l1 = 0, l2 = 0;
      ll_trainer_zero_grad(tr), ll_trainer_zero_grad(tr2);
      rc = ll_trainer_forward_backward(tr, ids, tg, 2, 1, 1.0f, &l1, NULL, err, sizeof err);
      if (rc == 0) rc = ll_trainer_forward_backward(tr2, ids, tg, 2, 1, 1.0f, &l2, NULL, err, sizeof err);
      CHECKF(rc == 0, "%s", err);
      CHECKF(n2 == n && l1 == l2 && memcmp(G, G2, (size_t)n * sizeof *G) == 0, "%s: recomputed layers' gradient differs (loss %.9g vs %.9g)",
             layout_name[layout], l1, l2);
      ll_trainer_aux_take(tr), ll_trainer_aux_take(tr2);
      ll_trainer_free(tr2);
    }
  }
  // The aux loss itself: coef·E·Σ f_i·P_i is coef at perfect balance and at most coef·E.
  {
    int32_t ids[16], tg[16];
    for (int i = 0; i < 16; i++) ids[i] = (int32_t)(i % V), tg[i] = -1;
    const double a = objective(tr, ids, tg, &rc, err, sizeof err);
    CHECKF(rc == 0 && a > 0 && a <= 0.5 * E * L + 1e-9, "aux loss %g (coef 0.5, %d layers)", a, L);
  }
  free(g);
  ll_trainer_free(tr);
  ll_engine_close(e);
  unlink(path);
}

// ---------------------------------------------------------------- the loss falls, per layout

// Sequences of a fixed successor rule (id -> (5·id + 3) mod V from a random start: something to
// learn); the validation sequences start elsewhere in the same rule.
struct rule_src {
  uint64_t rs;
  int S, vpos;
};
static void rule_seq(int32_t *ids, int32_t *tg, int S, int32_t start) {
  int32_t x = start;
  for (int t = 0; t < S; t++) ids[t] = x, x = (5 * x + 3) % V, tg[t] = x;
}
static int rule_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  struct rule_src *s = u;
  rule_seq(ids, tg, s->S, (int32_t)(ll_test_rand(&s->rs) % V));
  return 0;
}
static int rule_val_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  struct rule_src *s = u;
  if (s->vpos >= 8) return 0;
  rule_seq(ids, tg, s->S, (int32_t)((s->vpos++ * 37 + 11) % V));
  return 1;
}
static void rule_val_reset(void *u) { ((struct rule_src *)u)->vpos = 0; }

// 40 AdamW steps on each layout: LoRA on attention and every expert (router frozen), or every
// weight (full mode with the load-balancing loss): the validation loss falls.
static void test_loss_falls(const char *dir, int layout, int mode, uint64_t *rs) {
  char path[4200], err[256];
  snprintf(path, sizeof path, "%s/falls-%d-%d.gguf", dir, layout, mode);
  if (write_model(path, E, K, 0, ll_test_rand(rs), layout_what[layout])) return;
  struct ll_engine *e = open_model(path, err, sizeof err);
  CHECKF(e != NULL, "open: %s", err);
  if (!e) return;
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.mode = mode, p.batch = 4, p.seq_len = 16, p.steps = 40, p.seed = 3, p.arch = layout ? layout_name[layout] : "llama", p.model_path = path;
  p.lr = mode == LL_TRAIN_FULL ? 3e-3 : 1e-2, p.rank = 4, p.alpha = 8;
  p.targets = (1u << LL_LORA_Q) | (1u << LL_LORA_K) | (1u << LL_LORA_V) | (1u << LL_LORA_O) | LL_LORA_EXPERT_TARGETS;
  struct ll_trainer *tr = NULL;
  int rc = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  CHECKF(rc == 0, "%s, %s: %s", layout_name[layout], mode == LL_TRAIN_FULL ? "full" : "lora", err);
  if (rc == 0) {
    struct rule_src rsrc = {ll_test_rand(rs), p.seq_len, 0};
    struct ll_train_source src = {&rsrc, rule_next, rule_val_next, rule_val_reset, NULL, NULL};
    double v0 = 0, v1 = 0, aux = 0;
    rc = ll_trainer_eval(tr, &src, 0, &v0, err, sizeof err);
    struct ll_train_step_info info;
    for (int i = 0; i < p.steps && rc == 0; i++) rc = ll_trainer_step(tr, &src, &info, err, sizeof err), aux = info.aux_loss;
    if (rc == 0) rc = ll_trainer_eval(tr, &src, 0, &v1, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    printf("%s, %s: validation loss %.4f -> %.4f after %lld steps%s", layout_name[layout], mode == LL_TRAIN_FULL ? "full mode" : "LoRA (attention + experts)", v0,
           v1, (long long)p.steps, mode == LL_TRAIN_FULL ? "" : "\n");
    if (mode == LL_TRAIN_FULL) printf(" (aux loss %.4f)\n", aux);
    CHECKF(v1 < v0 - 0.5, "%s: the validation loss did not fall (%.4f -> %.4f)", layout_name[layout], v0, v1);
    CHECK(mode != LL_TRAIN_FULL || (aux > 0 && aux < 0.01 * E * L));
    if (mode == LL_TRAIN_FULL && rc == 0) { // the trained model, saved as a checkpoint, serves what the trainer computes
      char ck[4300];
      snprintf(ck, sizeof ck, "%s/falls-%d.ckpt", dir, layout);
      rc = ll_trainer_save(tr, ck, &src, err, sizeof err);
      CHECKF(rc == 0, "save: %s", err);
      struct ll_engine *e2 = rc == 0 ? open_model(ck, err, sizeof err) : NULL;
      CHECKF(e2 != NULL, "open the trained %s: %s", layout_name[layout], err);
      if (e2) {
        int32_t ids[32], tg[32];
        float *lg = malloc(sizeof(float) * 16 * V);
        rule_seq(ids, tg, 16, 7), rule_seq(ids + 16, tg + 16, 16, 41);
        double lt = 0, ls = 0;
        rc = ll_trainer_forward_backward(tr, ids, tg, 2, 0, 1.0f, &lt, NULL, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        for (int b = 0; b < 2; b++) run(e2, ids + 16 * b, 16, 0, lg), ls += xent_sum(lg, tg + 16 * b, 16);
        printf("  served from its checkpoint: loss %.6f, the trainer's %.6f\n", ls, lt);
        CHECKF(fabs(ls - lt) < 1e-4 * fabs(lt) + 1e-4, "%s: the saved model's loss %.7g, the trainer's %.7g", layout_name[layout], ls, lt);
        free(lg);
        ll_engine_close(e2);
      }
      unlink(ck);
    }
    ll_trainer_free(tr);
  }
  ll_engine_close(e);
  unlink(path);
}

// ---------------------------------------------------------------- training on a device

// An engine on device; cache: the OpenCL program binaries' directory (built once, not per engine).
static struct ll_engine *open_on(const char *path, const char *device, const char *cache, char *err, size_t errlen) {
  struct ll_engine_params p;
  ll_engine_params_default(&p);
  p.model_path = path, p.n_threads = 2, p.device = device, p.n_ctx = CTX, p.n_parallel = 1, p.cache_dir = cache;
  struct ll_engine *e = NULL;
  return ll_engine_open(&e, &p, err, errlen) == 0 ? e : NULL;
}

// Per layout and mode (LoRA on attention and every expert; full-parameter with the
// load-balancing loss): one forward/backward's gradient on the device against the CPU's (the
// routed experts' backward: every adapter or weight gradient, the router's included), then 6
// AdamW steps whose losses (and aux losses) follow the CPU's. Tolerances: rel_g on the gradient
// (max |diff| over max |g|), rel_l on each step's loss.
static void test_device_train(const char *dir, const char *device, int layout, int mode, double rel_g, double rel_l, uint64_t *rs) {
  char path[4200], err[512];
  snprintf(path, sizeof path, "%s/dev-%d-%d.gguf", dir, layout, mode);
  if (write_model(path, E, K, 0, ll_test_rand(rs), layout_what[layout])) return;
  char cache[4300];
  snprintf(cache, sizeof cache, "%s/ocl", dir);
  mkdir(cache, 0700);
  struct ll_engine *ec = open_on(path, "cpu", NULL, err, sizeof err), *ed = ec ? open_on(path, device, cache, err, sizeof err) : NULL;
  CHECKF(ec && ed, "open on %s: %s", device, err);
  struct ll_trainer *tc = NULL, *td = NULL;
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.mode = mode, p.batch = 2, p.seq_len = 16, p.steps = 6, p.seed = 5, p.arch = layout ? layout_name[layout] : "llama", p.model_path = path;
  p.lr = mode == LL_TRAIN_FULL ? 3e-3 : 1e-2, p.rank = 4, p.alpha = 8, p.warmup = 0, p.dropout = mode == LL_TRAIN_FULL ? 0.0f : 0.1f;
  p.targets = (1u << LL_LORA_Q) | (1u << LL_LORA_K) | (1u << LL_LORA_V) | (1u << LL_LORA_O) | LL_LORA_EXPERT_TARGETS | (layout == 1 ? LL_LORA_SHEXP_TARGETS : 0);
  int rc = ed ? ll_trainer_create(&tc, ll_engine_model(ec), ll_engine_backend(ec), &p, err, sizeof err) : -1;
  if (rc == 0) rc = ll_trainer_create(&td, ll_engine_model(ed), ll_engine_backend(ed), &p, err, sizeof err);
  CHECKF(!ed || rc == 0, "%s, %s trainer: %s", layout_name[layout], mode == LL_TRAIN_FULL ? "full" : "lora", err);
  if (rc == 0) {
    CHECK(!ll_backend_host_buffers(ll_engine_backend(ed))); // the device's own memory: a CPU fallback would compare the CPU with itself
    float *Pc, *Gc, *Pd, *Gd;
    int64_t nc, nd;
    ll_trainer_vectors(tc, &Pc, &Gc, &nc), ll_trainer_vectors(td, &Pd, &Gd, &nd);
    CHECK(nc == nd);
    // The same parameters on both (LoRA's B is zero at the start: random values so that the
    // experts' adapters carry a gradient through A too).
    float *h = malloc((size_t)nc * sizeof *h), *gd = malloc((size_t)nc * sizeof *gd);
    for (int64_t i = 0; i < nc; i++) h[i] = mode == LL_TRAIN_FULL ? Pc[i] : 0.05f * ll_test_randf(rs);
    if (mode == LL_TRAIN_FULL) CHECK(ll_backend_copy(ll_engine_backend(ed), h, Pd, (size_t)nc * sizeof *h) == 0 && memcmp(h, Pc, (size_t)nc * sizeof *h) == 0);
    else memcpy(Pc, h, (size_t)nc * sizeof *h), ll_backend_copy(ll_engine_backend(ed), Pd, h, (size_t)nc * sizeof *h);
    int32_t ids[32], tg[32];
    for (int i = 0; i < 32; i++) ids[i] = (int32_t)(ll_test_rand(rs) % V), tg[i] = (int32_t)(ll_test_rand(rs) % V);
    double lc = 0, ld = 0;
    ll_trainer_zero_grad(tc), ll_trainer_zero_grad(td);
    rc = ll_trainer_forward_backward(tc, ids, tg, 2, 1, 1.0f, &lc, NULL, err, sizeof err);
    if (rc == 0) rc = ll_trainer_forward_backward(td, ids, tg, 2, 1, 1.0f, &ld, NULL, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    const double ac = ll_trainer_aux_take(tc), ad = ll_trainer_aux_take(td);
    ll_backend_copy(ll_engine_backend(ed), gd, Gd, (size_t)nc * sizeof *gd);
    double gmax = 0, dmax = 0;
    for (int64_t i = 0; i < nc; i++) gmax = fmax(gmax, fabs(Gc[i])), dmax = fmax(dmax, fabs(Gc[i] - gd[i]));
    printf("%s on %s, %s: loss %.7f (cpu %.7f), aux %.6f (cpu %.6f); gradient of %lld max |diff| %.3g of max |g| %.3g\n", layout_name[layout], device,
           mode == LL_TRAIN_FULL ? "full" : "LoRA (attention + experts)", ld, lc, ad, ac, (long long)nc, dmax, gmax);
    CHECKF(rc == 0 && fabs(ld - lc) <= rel_l * fabs(lc) && fabs(ad - ac) <= rel_l * fabs(ac) + 1e-9, "%s: loss %.9g vs %.9g", layout_name[layout], ld, lc);
    CHECKF(gmax > 0 && dmax <= rel_g * gmax, "%s: device gradient off the CPU's by %.3g of %.3g", layout_name[layout], dmax, gmax);
    // Steps on the same data: the loss curves agree.
    struct rule_src sc = {99, p.seq_len, 0}, sd = {99, p.seq_len, 0};
    struct ll_train_source srcc = {&sc, rule_next, rule_val_next, rule_val_reset, NULL, NULL}, srcd = {&sd, rule_next, rule_val_next, rule_val_reset, NULL, NULL};
    double worst = 0, first = 0, last = 0, v0c = 0, v0d = 0, v1c = 0, v1d = 0;
    rc = ll_trainer_eval(tc, &srcc, 0, &v0c, err, sizeof err);
    if (rc == 0) rc = ll_trainer_eval(td, &srcd, 0, &v0d, err, sizeof err);
    for (int i = 0; i < p.steps && rc == 0; i++) {
      struct ll_train_step_info ic, id;
      rc = ll_trainer_step(tc, &srcc, &ic, err, sizeof err);
      if (rc == 0) rc = ll_trainer_step(td, &srcd, &id, err, sizeof err);
      if (rc == 0) worst = fmax(worst, fabs(id.loss - ic.loss) / fabs(ic.loss)), first = i ? first : ic.loss, last = ic.loss;
      if (rc == 0 && mode == LL_TRAIN_FULL) worst = fmax(worst, fabs(id.aux_loss - ic.aux_loss) / fabs(ic.aux_loss));
    }
    if (rc == 0) rc = ll_trainer_eval(tc, &srcc, 0, &v1c, err, sizeof err);
    if (rc == 0) rc = ll_trainer_eval(td, &srcd, 0, &v1d, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    worst = fmax(worst, fmax(fabs(v0d - v0c) / v0c, fabs(v1d - v1c) / v1c));
    printf("  %lld steps: loss %.4f -> %.4f, validation %.4f -> %.4f (cpu %.4f -> %.4f), worst relative difference %.3g\n", (long long)p.steps, first,
           last, v0d, v1d, v0c, v1c, worst);
    CHECKF(worst <= rel_l, "%s: the device's losses differ from the CPU's by %.3g relative", layout_name[layout], worst);
    CHECKF(v1d < v0d - 0.05, "%s: the validation loss did not fall on the device", layout_name[layout]); // it trained something
    free(h), free(gd);
  }
  ll_trainer_free(tc), ll_trainer_free(td);
  ll_engine_close(ec), ll_engine_close(ed);
  unlink(path);
}

// usage: test_moe [DEVICE]: with DEVICE (opencl:0:0), training on that device against the CPU
// only, on its reference tier (LL_OPENCL_REFERENCE=1) then its fast tier.
int main(int argc, char **argv) {
  uint64_t rs = ll_test_seed();
  char dir[4096];
  if (argc > 1) {
    if (!ll_test_tmpdir(dir, sizeof dir)) {
      CHECKF(0, "no temporary directory");
      return ll_test_summary();
    }
    for (int tier = 1; tier >= 0; tier--) {
      setenv("LL_OPENCL_REFERENCE", tier ? "1" : "0", 1);
      printf("%s tier:\n", tier ? "reference" : "fast");
      for (int layout = 0; layout < 4; layout++)
        for (int mode = LL_TRAIN_LORA; mode <= LL_TRAIN_FULL; mode++) test_device_train(dir, argv[1], layout, mode, tier ? 1e-5 : 1e-3, tier ? 1e-5 : 1e-3, &rs);
    }
    char cache[4300];
    snprintf(cache, sizeof cache, "%s/ocl", dir);
    DIR *d = opendir(cache);
    for (struct dirent *de; d && (de = readdir(d));) {
      char f[4600];
      snprintf(f, sizeof f, "%s/%s", cache, de->d_name);
      if (de->d_name[0] != '.') unlink(f);
    }
    if (d) closedir(d);
    rmdir(cache), rmdir(dir);
    return ll_test_summary();
  }
  test_route(&rs);
  if (ll_test_tmpdir(dir, sizeof dir)) {
    test_models(dir, &rs);
    test_grads(dir, 0, 0, &rs);
    test_grads(dir, 1, 0, &rs);
    for (int layout = 0; layout < 4; layout++) test_grads(dir, layout, 1, &rs);
    test_dropout_grads(dir, 0, LL_LORA_EXPERT_TARGETS, &rs), test_dropout_grads(dir, 1, LL_LORA_EXPERT_TARGETS, &rs);
    test_dropout_grads(dir, 1, LL_LORA_SHEXP_TARGETS, &rs);
    test_full_grads(dir, 0, 0, &rs);
    test_full_grads(dir, 0, 1, &rs);
    for (int layout = 1; layout < 4; layout++) test_full_grads(dir, layout, 0, &rs);
    for (int layout = 0; layout < 4; layout++) test_loss_falls(dir, layout, LL_TRAIN_LORA, &rs), test_loss_falls(dir, layout, LL_TRAIN_FULL, &rs);
    rmdir(dir);
  } else {
    CHECKF(0, "no temporary directory");
  }
  return ll_test_summary();
}
