// test_arch_train.c - LoRA training of a family beyond llama/qwen2 on a small random F32 model
// (tests/scripts/make_arch_models.py): Qwen3 (per-head q/k norms, q width 128 != C = 64), Phi-3
// (fused qkv and gate/up) or Gemma 3 (q/k norms, plus GeGLU, post-attention/post-FFN norms,
// embeddings * sqrt(C), q prescale, local layers with their own RoPE base):
//  - the adapters' gradient against central finite differences of the loss, along the gradient
//    and along a random direction (F32 weights: the loss is smooth in the adapter; agreement
//    within 0.5% at the best step size). Gemma's GeGLU runs on libm's tanh for this check (the
//    engine's ggml_math forward reads gelu from llama.cpp's f16 table, a staircase that finite
//    differences cannot see through; the backward is the tanh form's derivative either way);
//  - 40 steps on one fixed batch lower its loss by more than half; then 110 over sequences of the
//    same rule (next id = id + 37 mod 256) lower a held-out sequence's loss below 0.8x (observed
//    gemma3 0.60, qwen3 0.63, phi3 0.72) (gemma3: with the engine's own f16-table forward, as
//    `llsrv train` runs it);
//  - gemma3: sequences longer than the sliding window (window_checks: the windowed training attention);
//  - a family with fused modules (phi3, ll_lora.h): a step's gradient of a module's one A is the
//    sum of its members' and every copy gets it (and central differences along that A agree);
//    training on a token pattern lowers the validation loss, the copies of A stay equal, and the
//    adapter exported as GGUF holds attn_qkv / ffn_up (llama.cpp's names) and reads back the same
//    (also as a PEFT directory); full-parameter training: gradient against central differences,
//    validation loss falls, the checkpoint holds attn_qkv / ffn_up and opens as a phi3 model.
//  - gemma3, full-parameter (gemma_full_checks): each weight gradient Gemma adds against central
//    differences, the validation loss falls, the checkpoint serves the trainer's loss.
// With DEVICE (opencl:0:0): the training on the pattern on that device against the CPU's; gemma3:
// LoRA and full training past the window on both tiers (gemma_device_checks).
// --ctx: the engine's context per sequence (default 128; Phi-3's LongRoPE picks its factors by it).
// usage: test_arch_train MODEL [DEVICE] [--ctx N]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_backend.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_ckpt.h"
#include "ll_gguf.h"
#include "ll_modelfile.h"
#include "ll_quant.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_trainer.h"
#include "testutil.h"

enum { S = 24 };

// A token pattern: next = (5 * t + 3) mod 251 with a position-dependent twist, from a start
// that is the sequence's own; training and validation sequences start in disjoint ranges.
struct pat {
  int64_t n, v;
};
static void pat_seq(int64_t k, int32_t *ids, int32_t *tg) {
  int32_t t = (int32_t)((k * 97 + 13) % 251);
  for (int i = 0; i <= S; i++) {
    if (i < S) ids[i] = t;
    if (i > 0) tg[i - 1] = t;
    t = (5 * t + 3 + (i % 3 == 2 ? 7 : 0)) % 251;
  }
}
static int pat_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  pat_seq(((struct pat *)u)->n++ % 64, ids, tg);
  return 0;
}
static int pat_val_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  struct pat *p = u;
  if (p->v >= 8) return 0;
  pat_seq(1000 + p->v++, ids, tg);
  return 1;
}
static void pat_val_reset(void *u) { ((struct pat *)u)->v = 0; }
// A PEFT directory (adapter_config.json, adapter_model.safetensors, F32) holding the adapter
// tensors of a GGUF LoRA file mf under Hugging Face's names: attn_qkv -> self_attn.qkv_proj,
// ffn_up -> mlp.gate_up_proj (Phi-3's fused modules), attn_output -> o_proj, ffn_down -> down_proj.
static int write_peft(const char *dir, const struct ll_modelfile *mf, int r, float alpha) {
  char p[700];
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  FILE *f = fopen(p, "w");
  if (!f) return -1;
  fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %g, \"target_modules\": [\"qkv_proj\", \"o_proj\", \"gate_up_proj\", "
             "\"down_proj\"], \"bias\": \"none\"}\n", r, (double)alpha);
  fclose(f);
  static const char *const map[][3] = {{"attn_qkv", "self_attn", "qkv_proj"}, {"attn_output", "self_attn", "o_proj"}, {"ffn_up", "mlp", "gate_up_proj"},
                                       {"ffn_down", "mlp", "down_proj"}};
  size_t cap = 1 << 16, hl = 0;
  char *h = malloc(cap);
  if (!h) return -1;
  hl += (size_t)snprintf(h + hl, cap - hl, "{");
  uint64_t off = 0;
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    int l;
    char stem[32], ab;
    if (sscanf(t->name.ptr, "blk.%d.%31[a-z_].weight.lora_%c", &l, stem, &ab) != 3) continue;
    for (int k = 0; k < 4; k++)
      if (!strcmp(stem, map[k][0])) {
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"base_model.model.model.layers.%d.%s.%s.lora_%c.weight\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld], "
                               "\"data_offsets\": [%llu, %llu]}", off ? ", " : "", l, map[k][1], map[k][2], ab == 'a' ? 'A' : 'B', (long long)t->ne[1],
                               (long long)t->ne[0], (unsigned long long)off, (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
      }
  }
  hl += (size_t)snprintf(h + hl, cap - hl, "}");
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  f = fopen(p, "wb");
  if (!f) return free(h), -1;
  const uint64_t n = hl;
  fwrite(&n, 8, 1, f);
  fwrite(h, 1, hl, f);
  free(h);
  for (uint64_t i = 0; i < mf->n_tensors; i++) { // the same order as the header
    const struct ll_tensor_info *t = &mf->tensors[i];
    int l;
    char stem[32], ab;
    if (sscanf(t->name.ptr, "blk.%d.%31[a-z_].weight.lora_%c", &l, stem, &ab) != 3) continue;
    for (int k = 0; k < 4; k++)
      if (!strcmp(stem, map[k][0])) fwrite(t->data, 1, t->nbytes, f);
  }
  return fclose(f) == 0 ? 0 : -1;
}

// One fixed sequence, for the step whose gradient is inspected.
static int fixed_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)u, (void)err, (void)errlen;
  pat_seq(5, ids, tg);
  return 0;
}
static float *g_tied; // the gradient the update hook saw (tied, unclipped)
static int64_t g_n;
static struct ll_trainer *g_tr;
static int grab(void *user, int (*update)(void *arg), void *arg) {
  (void)user;
  float *P, *G;
  ll_trainer_vectors(g_tr, &P, &G, &g_n);
  g_tied = malloc(sizeof(float) * (size_t)g_n);
  if (g_tied) memcpy(g_tied, G, sizeof(float) * (size_t)g_n);
  return update(arg);
}

// 40 steps of 4 sequences on the pattern from a fresh adapter: the validation loss before (*v0)
// and after (*v1) falls by more than half, and every fused module's copies of A are still equal
// (ll_lora_check). Returns the trainer (its host copy current), or NULL.
static struct ll_trainer *train_pattern(struct ll_engine *e, double *v0, double *v1) {
  char err[512];
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.batch = 4, p.seq_len = S, p.rank = 4, p.alpha = 8, p.lr = 2e-2, p.warmup = 0, p.steps = 40, p.dropout = 0, p.clip = 1;
  struct ll_trainer *tr = NULL;
  CHECKF(ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err) == 0, "%s", err);
  if (!tr) return NULL;
  struct pat ps = {0, 0};
  struct ll_train_source src = {&ps, pat_next, pat_val_next, pat_val_reset, NULL, NULL};
  struct ll_train_step_info info = {0};
  *v0 = *v1 = NAN;
  CHECKF(ll_trainer_eval(tr, &src, 0, v0, err, sizeof err) == 0, "%s", err);
  for (int s = 0; s < p.steps; s++) CHECKF(ll_trainer_step(tr, &src, &info, err, sizeof err) == 0, "%s", err);
  CHECKF(ll_trainer_eval(tr, &src, 0, v1, err, sizeof err) == 0, "%s", err);
  printf("validation loss %.4f -> %.4f after %lld steps (last training loss %.4f)\n", *v0, *v1, (long long)p.steps, info.loss);
  CHECK(*v1 < 0.5 * *v0);
  CHECKF(ll_trainer_sync(tr, err, sizeof err) == 0, "%s", err);
  CHECKF(ll_lora_check(ll_trainer_lora(tr), &d, err, sizeof err) == 0, "after training: %s", err);
  return tr;
}

static void fused_checks(struct ll_engine *e, const char *model) {
  char err[512];
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  const unsigned fused = ll_lora_fused(d.arch);
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.batch = 1, p.seq_len = S, p.rank = 4, p.alpha = 8, p.lr = 1e-2, p.warmup = 0, p.steps = 60, p.dropout = 0, p.clip = 0;
  struct ll_trainer *tr = NULL;
  CHECKF(ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err) == 0, "%s", err);
  if (!tr) return;
  const struct ll_lora *lo = ll_trainer_lora(tr);
  float *P, *G;
  int64_t n;
  ll_trainer_vectors(tr, &P, &G, &n);
  uint64_t rs = 7;
  for (int l = 0; l < lo->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      struct ll_lora_pair *pr = ll_lora_at(lo, l, t);
      for (int64_t i = 0; i < pr->b.k * pr->b.n; i++) ((float *)pr->b.data)[i] = 0.05f * (ll_test_randf(&rs) - 0.5f);
    }
  // the fresh adapter: one A per module (q, k, v share q's; gate, up share gate's)
  CHECKF(ll_lora_check(lo, &d, err, sizeof err) == 0, "%s", err);
  const struct ll_lora_pair *q0 = ll_lora_at(lo, 0, LL_LORA_Q), *k0 = ll_lora_at(lo, 0, LL_LORA_K), *v0 = ll_lora_at(lo, 0, LL_LORA_V);
  const struct ll_lora_pair *g0 = ll_lora_at(lo, 0, LL_LORA_GATE), *u0 = ll_lora_at(lo, 0, LL_LORA_UP);
  const int64_t na = q0->a.k * q0->a.n, nga = g0->a.k * g0->a.n;
  CHECK(fused == (LL_LORA_GROUP_QKV | LL_LORA_GROUP_GU));
  CHECK(!memcmp(q0->a.data, k0->a.data, sizeof(float) * (size_t)na) && !memcmp(q0->a.data, v0->a.data, sizeof(float) * (size_t)na));
  CHECK(!memcmp(g0->a.data, u0->a.data, sizeof(float) * (size_t)nga));
  const int64_t oq = (const float *)q0->a.data - P, ok_ = (const float *)k0->a.data - P, ov = (const float *)v0->a.data - P;
  const int64_t og = (const float *)g0->a.data - P, ou = (const float *)u0->a.data - P;
  // the members' own gradients (untied), as the step computes them: the sum over counted tokens / count
  int32_t ids[S], tg[S];
  pat_seq(5, ids, tg);
  double loss, lp, lm;
  int64_t cnt = 0;
  CHECK(ll_trainer_zero_grad(tr) == 0);
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f / S, &loss, &cnt, err, sizeof err) == 0 && cnt == S);
  float *gu = malloc(sizeof(float) * (size_t)n), *keep = malloc(sizeof(float) * (size_t)n);
  memcpy(gu, G, sizeof(float) * (size_t)n);
  memcpy(keep, P, sizeof(float) * (size_t)n);
  CHECK(ll_trainer_zero_grad(tr) == 0);
  // one step on that sequence; the update hook sees the gradient the optimizer gets
  struct ll_train_source fx = {NULL, fixed_next, NULL, NULL, NULL, NULL};
  struct ll_train_step_info info;
  g_tr = tr;
  ll_trainer_set_update_hook(tr, grab, NULL);
  CHECKF(ll_trainer_step(tr, &fx, &info, err, sizeof err) == 0, "%s", err);
  ll_trainer_set_update_hook(tr, NULL, NULL);
  CHECK(g_tied && g_n == n);
  if (g_tied) {
    double worst = 0, scale = 0;
    int same = 1;
    for (int64_t i = 0; i < na; i++) {
      const double want = (double)gu[oq + i] + gu[ok_ + i] + gu[ov + i];
      worst = fmax(worst, fabs(g_tied[oq + i] - want)), scale = fmax(scale, fabs(want));
      same &= g_tied[oq + i] == g_tied[ok_ + i] && g_tied[oq + i] == g_tied[ov + i];
    }
    for (int64_t i = 0; i < nga; i++) {
      const double want = (double)gu[og + i] + gu[ou + i];
      worst = fmax(worst, fabs(g_tied[og + i] - want)), scale = fmax(scale, fabs(want));
      same &= g_tied[og + i] == g_tied[ou + i];
    }
    printf("tied A gradients: every copy the same %d, against the members' sum %.2e (largest %.2e)\n", same, worst, scale);
    CHECK(same);
    CHECK(worst <= 1e-6 * scale);
    // central differences along layer 0's qkv A moved as one (its three copies together)
    memcpy(P, keep, sizeof(float) * (size_t)n);
    float *dir = malloc(sizeof(float) * (size_t)na);
    double dd = 0, gd = 0, best = 1e9;
    for (int64_t i = 0; i < na; i++) dir[i] = ll_test_randf(&rs) - 0.5f, dd += (double)dir[i] * dir[i];
    for (int64_t i = 0; i < na; i++) dir[i] = (float)(dir[i] / sqrt(dd)), gd += (double)g_tied[oq + i] * dir[i];
    for (int k = 0; k < 3; k++) {
      const double eps = k == 0 ? 1e-2 : k == 1 ? 3e-3 : 1e-3;
      for (int sg = -1; sg <= 1; sg += 2) {
        for (int64_t i = 0; i < na; i++) P[oq + i] = P[ok_ + i] = P[ov + i] = keep[oq + i] + (float)(sg * eps) * dir[i];
        CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, sg < 0 ? &lm : &lp, NULL, err, sizeof err) == 0);
      }
      const double fd = (lp - lm) / (2 * eps) / S, rel = fabs(fd - gd) / (fabs(gd) + 1e-9);
      printf("shared A eps %.0e: g.d %+.6f finite differences %+.6f (relative %.2e)\n", eps, gd, fd, rel);
      best = fmin(best, rel);
    }
    CHECKF(best < 2e-2, "the shared A's gradient and finite differences differ by %.3g", best);
    free(dir);
  }
  memcpy(P, keep, sizeof(float) * (size_t)n);
  free(g_tied), g_tied = NULL;
  free(gu), free(keep);
  ll_trainer_free(tr);

  // training on the pattern: the validation loss falls; every module's A copies stay equal
  double v0l, v1l;
  if (!(tr = train_pattern(e, &v0l, &v1l))) return;
  lo = ll_trainer_lora(tr);
  // exported: llama.cpp's tensor names and shapes, and the same adapter read back
  char dir[512], path[600];
  if (ll_test_tmpdir(dir, sizeof dir)) {
    snprintf(path, sizeof path, "%s/phi3-lora.gguf", dir);
    CHECKF(ll_lora_save_gguf(lo, path, err, sizeof err) == 0, "%s", err);
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    CHECKF(ll_gguf_open(path, &mf, err, sizeof err) == 0, "%s", err);
    const struct ll_tensor_info *qa = ll_mf_find_tensor(&mf, "blk.0.attn_qkv.weight.lora_a"), *qb = ll_mf_find_tensor(&mf, "blk.0.attn_qkv.weight.lora_b");
    const struct ll_tensor_info *ua = ll_mf_find_tensor(&mf, "blk.0.ffn_up.weight.lora_a"), *ub = ll_mf_find_tensor(&mf, "blk.0.ffn_up.weight.lora_b");
    const int qd = d.n_embd_q > 0 ? d.n_embd_q : d.n_embd;
    CHECK(qa && qa->ne[0] == d.n_embd && qa->ne[1] == 4 && qb && qb->ne[0] == 4 && qb->ne[1] == qd + 2 * d.n_embd_kv);
    CHECK(ua && ua->ne[0] == d.n_embd && ub && ub->ne[1] == 2 * d.n_ff);
    CHECK(!ll_mf_find_tensor(&mf, "blk.0.attn_q.weight.lora_a") && !ll_mf_find_tensor(&mf, "blk.0.ffn_gate.weight.lora_a"));
    CHECK(mf.n_tensors == (uint64_t)d.n_layer * 4 * 2); // attn_qkv, attn_output, ffn_up, ffn_down: a and b
    // the same as a PEFT directory, as PEFT saves Phi-3's: qkv_proj and gate_up_proj fused (HF's
    // rows are the GGUF's: Phi-3's converter permutes nothing)
    char peft[600];
    snprintf(peft, sizeof peft, "%s/peft", dir);
    CHECK(write_peft(peft, &mf, 4, 8.0f) == 0);
    ll_modelfile_free(&mf);
    struct ll_lora *back = NULL;
    CHECKF(ll_lora_load(&back, path, &d, NULL, err, sizeof err) == 0, "%s", err);
    int same = back && back->rank == lo->rank && back->alpha == lo->alpha && back->targets == lo->targets;
    for (int l = 0; same && l < lo->n_layer; l++)
      for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
        const struct ll_lora_pair *a = ll_lora_at(lo, l, t), *b = ll_lora_at(back, l, t);
        same &= !memcmp(a->a.data, b->a.data, sizeof(float) * (size_t)(a->a.k * a->a.n)) &&
                !memcmp(a->b.data, b->b.data, sizeof(float) * (size_t)(a->b.k * a->b.n));
      }
    CHECKF(same, "the adapter read back from %s differs", path);
    struct ll_lora *pa = NULL;
    CHECKF(ll_lora_load(&pa, peft, &d, NULL, err, sizeof err) == 0, "%s", err);
    same = pa && pa->targets == lo->targets;
    for (int l = 0; same && l < lo->n_layer; l++)
      for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
        const struct ll_lora_pair *a = ll_lora_at(lo, l, t), *b = ll_lora_at(pa, l, t);
        same &= !memcmp(a->a.data, b->a.data, sizeof(float) * (size_t)(a->a.k * a->a.n)) &&
                !memcmp(a->b.data, b->b.data, sizeof(float) * (size_t)(a->b.k * a->b.n));
      }
    CHECKF(same, "the PEFT directory %s read back differs", peft);
    ll_lora_free(pa);
    // without the model: the dims the fused file implies, and the same bytes written again
    struct ll_lora *bare = NULL;
    CHECKF(ll_lora_load(&bare, path, NULL, NULL, err, sizeof err) == 0, "%s", err);
    char path2[640];
    snprintf(path2, sizeof path2, "%s/again.gguf", dir);
    if (bare) snprintf(bare->name, sizeof bare->name, "%s", lo->name); // the file stem otherwise
    CHECKF(bare && ll_lora_save_gguf(bare, path2, err, sizeof err) == 0, "%s", err);
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path2, "rb");
    int eq = f1 && f2;
    for (int c1 = 0, c2 = 0; eq && c1 != EOF;) c1 = fgetc(f1), c2 = fgetc(f2), eq = c1 == c2;
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    CHECKF(eq, "%s written again without the model differs", path);
    ll_lora_free(bare);
    ll_lora_free(back);
    // part of a module adapted (q and v, not k; o too): k's rows of attn_qkv are zeros, and the
    // adapter read back (k now adapted by them) computes the same logits, bit for bit
    struct ll_lora *qv = NULL, *qv2 = NULL;
    CHECKF(ll_lora_create(&qv, &d, 4, 8.0f, (1u << LL_LORA_Q) | (1u << LL_LORA_V) | (1u << LL_LORA_O), 3, NULL, err, sizeof err) == 0, "%s", err);
    for (int l = 0; qv && l < qv->n_layer; l++)
      for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
        struct ll_lora_pair *pr = ll_lora_at(qv, l, t);
        for (int64_t i = 0; pr->b.data && i < pr->b.k * pr->b.n; i++) ((float *)pr->b.data)[i] = 0.05f * (ll_test_randf(&rs) - 0.5f);
      }
    CHECKF(qv && ll_lora_save_gguf(qv, path2, err, sizeof err) == 0, "%s", err);
    CHECKF(ll_lora_load(&qv2, path2, &d, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(qv2 && qv2->targets == ((1u << LL_LORA_Q) | (1u << LL_LORA_K) | (1u << LL_LORA_V) | (1u << LL_LORA_O)));
    if (qv && qv2) {
      const int V = ll_engine_n_vocab(e);
      float *l1 = malloc(sizeof(float) * (size_t)V * S), *l2 = malloc(sizeof(float) * (size_t)V * S);
      const struct ll_lora *ad[2] = {qv, qv2};
      for (int k = 0; k < 2; k++) {
        const int sq = ll_engine_seq_new(e);
        CHECK(sq >= 0 && ll_engine_seq_set_adapter(e, sq, ad[k], err, sizeof err) == 0);
        struct ll_batch_item it = {sq, S, ids, 2, k ? l2 : l1, NULL};
        CHECKF(ll_engine_decode(e, &it, 1, err, sizeof err) == 0, "%s", err);
        ll_engine_seq_free(e, sq);
      }
      CHECK(!memcmp(l1, l2, sizeof(float) * (size_t)V * S));
      free(l1), free(l2);
    }
    ll_lora_free(qv), ll_lora_free(qv2);
    char pf[700];
    snprintf(pf, sizeof pf, "%s/adapter_config.json", peft), remove(pf);
    snprintf(pf, sizeof pf, "%s/adapter_model.safetensors", peft), remove(pf);
    rmdir(peft), remove(path), remove(path2), rmdir(dir);
  }
  ll_trainer_free(tr);

  // Full-parameter training (F32 weights): q, k, v are views into one attn_qkv of P, gate and up
  // into one ffn_up. The gradient against central differences along a random direction of every
  // weight; the validation loss falls; the checkpoint holds the file's own tensors (attn_qkv,
  // ffn_up, no attn_q / ffn_gate), equal to the trained weights, and opens as a phi3 model.
  ll_trainer_params_init(&p);
  p.mode = LL_TRAIN_FULL, p.model_path = model, p.batch = 4, p.seq_len = S, p.lr = 5e-3, p.warmup = 0, p.steps = 30, p.dropout = 0, p.clip = 1;
  tr = NULL;
  CHECKF(ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err) == 0, "%s", err);
  if (!tr) return;
  ll_trainer_vectors(tr, &P, &G, &n);
  gu = malloc(sizeof(float) * (size_t)n), keep = malloc(sizeof(float) * (size_t)n);
  memcpy(keep, P, sizeof(float) * (size_t)n);
  CHECK(ll_trainer_zero_grad(tr) == 0);
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
  // along the gradient, and along a random direction (its error against the gradient's norm:
  // g.d is small there, and the loss's float rounding is not)
  double gg = 0;
  for (int64_t i = 0; i < n; i++) gg += (double)G[i] * G[i];
  for (int dn = 0; dn < 2; dn++) {
    double dd = 0, gd = 0, best = 1e9;
    for (int64_t i = 0; i < n; i++) gu[i] = dn == 0 ? G[i] : ll_test_randf(&rs) - 0.5f, dd += (double)gu[i] * gu[i];
    for (int64_t i = 0; i < n; i++) gu[i] = (float)(gu[i] / sqrt(dd)), gd += (double)G[i] * gu[i];
    for (int k = 0; k < 3; k++) {
      const double eps = k == 0 ? 1e-2 : k == 1 ? 3e-3 : 1e-3;
      for (int sg = -1; sg <= 1; sg += 2) {
        for (int64_t i = 0; i < n; i++) P[i] = keep[i] + (float)(sg * eps) * gu[i];
        CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, sg < 0 ? &lm : &lp, NULL, err, sizeof err) == 0);
      }
      const double fd = (lp - lm) / (2 * eps), rel = fabs(fd - gd) / sqrt(gg);
      printf("full: direction %s eps %.0e: g.d %+.6f finite differences %+.6f (error / |g| %.2e)\n", dn ? "random" : "grad", eps, gd, fd, rel);
      best = fmin(best, rel);
    }
    CHECKF(best < 2e-3, "full: gradient and finite differences differ by %.3g of |g| (direction %d)", best, dn);
    memcpy(P, keep, sizeof(float) * (size_t)n);
  }
  memcpy(P, keep, sizeof(float) * (size_t)n);
  free(gu), free(keep);
  CHECK(ll_trainer_zero_grad(tr) == 0);
  struct pat ps = {0, 0};
  struct ll_train_source src = {&ps, pat_next, pat_val_next, pat_val_reset, NULL, NULL};
  double f0 = NAN, f1 = NAN;
  CHECKF(ll_trainer_eval(tr, &src, 0, &f0, err, sizeof err) == 0, "%s", err);
  for (int s = 0; s < p.steps; s++) CHECKF(ll_trainer_step(tr, &src, &info, err, sizeof err) == 0, "%s", err);
  CHECKF(ll_trainer_eval(tr, &src, 0, &f1, err, sizeof err) == 0, "%s", err);
  printf("full: validation loss %.4f -> %.4f after %lld steps\n", f0, f1, (long long)p.steps);
  CHECK(f1 < 0.5 * f0);
  char fdir[512], fpath[600];
  if (ll_test_tmpdir(fdir, sizeof fdir)) {
    snprintf(fpath, sizeof fpath, "%s/full.ckpt", fdir);
    CHECKF(ll_trainer_save(tr, fpath, NULL, err, sizeof err) == 0, "%s", err);
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    CHECKF(ll_ckpt_open(fpath, &mf, 1, err, sizeof err) == 0, "%s", err);
    const struct ll_tensor_info *qkv = ll_mf_find_tensor(&mf, "blk.1.attn_qkv.weight"), *up = ll_mf_find_tensor(&mf, "blk.1.ffn_up.weight");
    const struct ll_layer *y = &ll_trainer_model(tr)->layers[1];
    const int64_t nq = y->wq.k * (y->wq.n + y->wk.n + y->wv.n), nu = y->gate.k * (y->gate.n + y->up.n);
    CHECK(qkv && qkv->type == LL_TYPE_F32 && qkv->ne[0] == y->wq.k && qkv->ne[1] == y->wq.n + y->wk.n + y->wv.n &&
          !memcmp(qkv->data, y->wq.data, sizeof(float) * (size_t)nq));
    CHECK(up && up->type == LL_TYPE_F32 && up->ne[1] == y->gate.n + y->up.n && !memcmp(up->data, y->gate.data, sizeof(float) * (size_t)nu));
    CHECK(!ll_mf_find_tensor(&mf, "blk.1.attn_q.weight") && !ll_mf_find_tensor(&mf, "blk.1.attn_k.weight") && !ll_mf_find_tensor(&mf, "blk.1.ffn_gate.weight"));
    ll_modelfile_free(&mf);
    struct ll_engine_params ep;
    ll_engine_params_default(&ep);
    ep.model_path = fpath, ep.n_threads = 1, ep.n_ctx = 64, ep.device = "cpu";
    struct ll_engine *fe = NULL;
    CHECKF(ll_engine_open(&fe, &ep, err, sizeof err) == 0, "the trained checkpoint as a model: %s", err);
    struct ll_engine_info fi;
    if (fe) ll_engine_get_info(fe, &fi);
    CHECK(fe && !strcmp(fi.arch, "phi3"));
    // LongRoPE kept: the checkpoint's model has the factors (n_ctx 64: the short ones, as the
    // source file's) and the attention factor
    const struct ll_rope_params *r0 = &ll_trainer_model(tr)->rope, *r1 = fe ? &ll_engine_model(fe)->rope : NULL;
    if (r1 && r0->attn_factor != 0) {
      CHECK(r1->attn_factor == r0->attn_factor && r1->freq_factors && r1->n_rot == r0->n_rot);
      ll_modelfile_init(&mf);
      CHECKF(ll_model_open(model, &mf, err, sizeof err) == 0, "%s", err);
      const struct ll_tensor_info *sf = ll_mf_find_tensor(&mf, "rope_factors_short.weight");
      CHECK(sf && r1->freq_factors && !memcmp(sf->data, r1->freq_factors, sizeof(float) * (size_t)(r0->n_rot / 2)));
      ll_modelfile_free(&mf);
    }
    ll_engine_close(fe);
    remove(fpath), rmdir(fdir);
  }
  ll_trainer_free(tr);
}

// Gemma's local layers with a window (64) shorter than the sequences (SW = 80): the trainer's loss
// on a sequence is the engine's (whose cached attention applies the window) within 5e-5, and the
// adapters' gradient agrees with central differences along it (attention_train_swa's
// probabilities, zero outside the window, through attention_backward).
enum { SW = 80 };
static int mdl_is(struct ll_engine *e, const char *arch) {
  const struct ll_model *m = ll_engine_model(e);
  return m->arch && strcmp(m->arch->name, arch) == 0;
}
static void window_checks(struct ll_engine *e, const struct ll_trainer_params *p0) {
  const struct ll_model *mdl = ll_engine_model(e);
  struct ll_backend *be = ll_engine_backend(e);
  char err[512];
  CHECKF(mdl->window > 0 && mdl->window < SW, "the model's window %d is shorter than %d", mdl->window, SW);
  struct ll_trainer_params p = *p0;
  p.seq_len = SW;
  struct ll_trainer *tr = NULL;
  const int rc = ll_trainer_create(&tr, mdl, be, &p, err, sizeof err);
  CHECKF(rc == 0, "trainer at seq_len %d: %s", SW, err);
  if (rc) return;
  int32_t ids[SW], tg[SW];
  for (int i = 0; i < SW; i++) ids[i] = (int32_t)((i * 37 + 5) % 256);
  for (int i = 0; i < SW; i++) tg[i] = i + 1 < SW ? ids[i + 1] : -1;
  // B = 0 (PEFT's init): the adapters add nothing yet, so the engine without them is the reference
  double lt, le = 0;
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lt, NULL, err, sizeof err) == 0);
  const int V = mdl->n_vocab, s = ll_engine_seq_new(e);
  float *logits = malloc(sizeof(float) * (size_t)SW * V);
  struct ll_batch_item it = {s, SW, ids, 2, logits, NULL};
  CHECKF(s >= 0 && ll_engine_decode(e, &it, 1, err, sizeof err) == 0, "engine decode: %s", err);
  for (int t = 0; t + 1 < SW; t++) {
    const float *row = logits + (size_t)t * V;
    double mx = row[0], sum = 0;
    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
    le += mx + log(sum) - row[tg[t]];
  }
  ll_engine_seq_free(e, s);
  free(logits);
  printf("seq_len %d over window %d: trainer loss %.6f, engine %.6f\n", SW, mdl->window, lt, le);
  // observed 2.3e-6 relative; with attention_train for attention_train_swa in trainer.c (the
  // window ignored) 4512.090 against 4509.711, 5.3e-4
  CHECKF(fabs(lt - le) <= 5e-5 * fabs(le), "trainer %.6f vs engine %.6f", lt, le);
  // central differences along the gradient, B nonzero, libm's gelu
  const int gm = be->ggml_math;
  be->ggml_math = 0;
  const struct ll_lora *lo = ll_trainer_lora(tr);
  uint64_t rs = 7;
  for (int l = 0; l < lo->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      struct ll_lora_pair *pr = ll_lora_at(lo, l, t);
      for (int64_t i = 0; pr->b.data && i < pr->b.k * pr->b.n; i++) ((float *)pr->b.data)[i] = 0.05f * (ll_test_randf(&rs) - 0.5f);
    }
  float *P, *G;
  int64_t n;
  ll_trainer_vectors(tr, &P, &G, &n);
  double loss, lp, lm, gg = 0;
  CHECK(ll_trainer_zero_grad(tr) == 0);
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
  float *keep = malloc(sizeof(float) * (size_t)n), *d = malloc(sizeof(float) * (size_t)n);
  memcpy(keep, P, sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) gg += (double)G[i] * G[i];
  for (int64_t i = 0; i < n; i++) d[i] = (float)(G[i] / sqrt(gg));
  const double eps = 1e-2, gd = sqrt(gg);
  for (int64_t i = 0; i < n; i++) P[i] = keep[i] + (float)eps * d[i];
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lp, NULL, err, sizeof err) == 0);
  for (int64_t i = 0; i < n; i++) P[i] = keep[i] - (float)eps * d[i];
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lm, NULL, err, sizeof err) == 0);
  const double fd = (lp - lm) / (2 * eps), rel = fabs(fd - gd) / gd;
  printf("seq_len %d, window %d: |g| %.6f, central differences along g %.6f (relative %.2e)\n", SW, mdl->window, gd, fd, rel);
  // observed 3.7e-5 (the window ignored, it still agrees - with the unwindowed model's loss: the
  // loss check above is what sees the window)
  CHECKF(rel < 5e-3, "windowed gradient vs central differences: %.3g", rel);
  free(keep), free(d);
  be->ggml_math = gm;
  ll_trainer_free(tr);
}

// The engine's loss (a sum over rows with a target) on one sequence of n tokens.
static double engine_loss(struct ll_engine *e, const int32_t *ids, const int32_t *tg, int n) {
  char err[512];
  const int V = ll_engine_n_vocab(e), s = ll_engine_seq_new(e);
  float *logits = malloc(sizeof(float) * (size_t)n * V);
  struct ll_batch_item it = {s, n, ids, 2, logits, NULL};
  double loss = 0;
  CHECKF(s >= 0 && ll_engine_decode(e, &it, 1, err, sizeof err) == 0, "engine decode: %s", err);
  for (int t = 0; t < n; t++) {
    if (tg[t] < 0) continue;
    const float *row = logits + (size_t)t * V;
    double mx = row[0], sum = 0;
    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
    loss += mx + log(sum) - row[tg[t]];
  }
  ll_engine_seq_free(e, s);
  free(logits);
  return loss;
}

// Sequences of SW tokens (longer than Gemma's window) of the rule next = id + 37 mod 256, from
// start k (training: k < 64; validation: 1000 + v).
static void rule_seq(int64_t k, int32_t *ids, int32_t *tg) {
  for (int i = 0; i < SW; i++) ids[i] = (int32_t)(((k * 29 + i) * 37 + 11) % 256);
  for (int i = 0; i < SW; i++) tg[i] = i + 1 < SW ? ids[i + 1] : -1;
}
static int rule_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  rule_seq(((struct pat *)u)->n++ % 64, ids, tg);
  return 0;
}
static int rule_val_next(void *u, int32_t *ids, int32_t *tg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  struct pat *p = u;
  if (p->v >= 2) return 0;
  rule_seq(1000 + p->v++, ids, tg);
  return 1;
}

// Full-parameter training of Gemma 3 (F32 weights), on the CPU backend:
//  - each weight gradient Gemma adds against central differences of the loss along that
//    gradient (post-attention norms, post-FFN norms, q/k norms, the embedding that is scaled by
//    sqrt(C) on the way in and tied to the output), then along a random direction of every
//    weight; libm's gelu for these (as for LoRA above);
//  - 30 steps on the pattern lower the validation loss below 0.5x;
//  - the checkpoint holds the trained post-norms (the file's tensor names, F32) and, opened as
//    a model, serves the trainer's loss.
// The GGUF's norm weights are (1 + w) already (llama.cpp's converter adds the 1; engine.c
// multiplies by them as loaded), so the gradient of a stored norm weight is rmsnorm's dg.
static void gemma_full_checks(struct ll_engine *e, const char *model) {
  char err[512];
  struct ll_backend *be = ll_engine_backend(e);
  const int gm = be->ggml_math;
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.mode = LL_TRAIN_FULL, p.model_path = model, p.batch = 4, p.seq_len = S, p.lr = 5e-3, p.warmup = 0, p.steps = 30, p.dropout = 0, p.clip = 1;
  struct ll_trainer *tr = NULL;
  CHECKF(ll_trainer_create(&tr, ll_engine_model(e), be, &p, err, sizeof err) == 0, "gemma3 full mode: %s", err);
  if (!tr) return;
  be->ggml_math = 0;
  float *P, *G;
  int64_t n;
  ll_trainer_vectors(tr, &P, &G, &n);
  const struct ll_model *fm = ll_trainer_model(tr);
  const int L = fm->L, C = fm->C, hd = fm->hd;
  int32_t ids[S], tg[S];
  pat_seq(5, ids, tg);
  double loss, lp, lm;
  CHECK(ll_trainer_zero_grad(tr) == 0);
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
  float *g = malloc(sizeof(float) * (size_t)n), *keep = malloc(sizeof(float) * (size_t)n), *d = malloc(sizeof(float) * (size_t)n);
  unsigned char *in = malloc((size_t)n);
  memcpy(g, G, sizeof(float) * (size_t)n), memcpy(keep, P, sizeof(float) * (size_t)n);
  static const char *const gname[5] = {"post-attention norms", "post-FFN norms", "q/k norms", "token embedding (scaled, tied)", "every weight (random)"};
  uint64_t rs = 3;
  for (int grp = 0; grp < 5; grp++) {
    memset(in, grp == 4, (size_t)n);
    for (int l = 0; grp < 4 && l < L; l++) {
      const struct ll_layer *y = &fm->layers[l];
      const float *v0 = grp == 0 ? y->post_attn_norm : grp == 1 ? y->post_ffn_norm : grp == 2 ? y->q_norm : l == 0 ? fm->tok_embd.data : NULL;
      const int64_t len = grp == 3 ? (int64_t)fm->n_vocab * C : grp == 2 ? hd : C;
      CHECK(grp == 3 || v0);
      if (v0) memset(in + (v0 - P), 1, (size_t)len);
      if (grp == 2) memset(in + (y->k_norm - P), 1, (size_t)hd);
    }
    double dd = 0, gd = 0, gg = 0, best = 1e9;
    for (int64_t i = 0; i < n; i++) d[i] = !in[i] ? 0.0f : grp == 4 ? ll_test_randf(&rs) - 0.5f : g[i], dd += (double)d[i] * d[i];
    for (int64_t i = 0; i < n; i++) d[i] = (float)(d[i] / sqrt(dd)), gd += (double)g[i] * d[i], gg += (double)g[i] * g[i] * in[i];
    for (int k = 0; k < 3; k++) {
      const double eps = k == 0 ? 1e-2 : k == 1 ? 3e-3 : 1e-3;
      for (int64_t i = 0; i < n; i++) P[i] = keep[i] + (float)eps * d[i];
      CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lp, NULL, err, sizeof err) == 0);
      for (int64_t i = 0; i < n; i++) P[i] = keep[i] - (float)eps * d[i];
      CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lm, NULL, err, sizeof err) == 0);
      const double fd = (lp - lm) / (2 * eps), rel = fabs(fd - gd) / sqrt(gg); // the error against the gradient's norm
      printf("full, %s: eps %.0e: g.d %+.6f finite differences %+.6f (error / |g| %.2e)\n", gname[grp], eps, gd, fd, rel);
      best = fmin(best, rel);
    }
    memcpy(P, keep, sizeof(float) * (size_t)n);
    // observed (best of the three steps): post-attention norms 8e-5, post-FFN 1.2e-4, q/k norms
    // 1.3e-4, embedding 3e-6, random 9e-6. Mutations of trainer.c: the embedding's sqrt(C) left
    // out of its backward: embedding 9.4e-2 (random 2.7e-5: it takes this group's check); the
    // post-FFN norm's dg given to the post-attention norm's call: post-attention |g| = 0 (fails
    // below), post-FFN 0.55.
    CHECKF(gg > 0, "full, %s: no gradient", gname[grp]);
    CHECKF(best < 5e-3, "full, %s: gradient and finite differences differ by %.3g of |g|", gname[grp], best);
  }
  free(g), free(keep), free(d), free(in);
  be->ggml_math = gm;
  CHECK(ll_trainer_zero_grad(tr) == 0);
  struct pat ps = {0, 0};
  struct ll_train_source src = {&ps, pat_next, pat_val_next, pat_val_reset, NULL, NULL};
  struct ll_train_step_info info = {0};
  double f0 = NAN, f1 = NAN;
  CHECKF(ll_trainer_eval(tr, &src, 0, &f0, err, sizeof err) == 0, "%s", err);
  for (int st = 0; st < p.steps; st++) CHECKF(ll_trainer_step(tr, &src, &info, err, sizeof err) == 0, "%s", err);
  CHECKF(ll_trainer_eval(tr, &src, 0, &f1, err, sizeof err) == 0, "%s", err);
  printf("gemma3 full: validation loss %.4f -> %.4f after %lld steps\n", f0, f1, (long long)p.steps);
  CHECK(f1 < 0.5 * f0);
  char fdir[512], fpath[600];
  if (ll_test_tmpdir(fdir, sizeof fdir)) {
    snprintf(fpath, sizeof fpath, "%s/full.ckpt", fdir);
    CHECKF(ll_trainer_save(tr, fpath, NULL, err, sizeof err) == 0, "%s", err);
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    CHECKF(ll_ckpt_open(fpath, &mf, 1, err, sizeof err) == 0, "%s", err);
    const struct ll_layer *y = &ll_trainer_model(tr)->layers[1];
    const struct ll_tensor_info *pa = ll_mf_find_tensor(&mf, "blk.1.post_attention_norm.weight"), *pf = ll_mf_find_tensor(&mf, "blk.1.post_ffw_norm.weight");
    CHECK(pa && pa->type == LL_TYPE_F32 && pa->ne[0] == C && !memcmp(pa->data, y->post_attn_norm, sizeof(float) * (size_t)C));
    CHECK(pf && pf->type == LL_TYPE_F32 && pf->ne[0] == C && !memcmp(pf->data, y->post_ffn_norm, sizeof(float) * (size_t)C));
    ll_modelfile_free(&mf);
    struct ll_engine_params ep;
    ll_engine_params_default(&ep);
    ep.model_path = fpath, ep.n_threads = 1, ep.n_ctx = 128, ep.device = "cpu";
    struct ll_engine *fe = NULL;
    CHECKF(ll_engine_open(&fe, &ep, err, sizeof err) == 0, "the trained checkpoint as a model: %s", err);
    if (fe) { // the trainer's loss on a sequence of S tokens (its seq_len), and the engine's
      int32_t si[SW], stg[SW];
      rule_seq(3, si, stg);
      double lt = 0;
      stg[S - 1] = -1;
      CHECK(ll_trainer_forward_backward(tr, si, stg, 1, 0, 1.0f, &lt, NULL, err, sizeof err) == 0);
      const double ls = engine_loss(fe, si, stg, S);
      printf("gemma3 full: served from its checkpoint: loss %.6f, the trainer's %.6f\n", ls, lt);
      CHECKF(fabs(ls - lt) <= 5e-5 * fabs(lt), "the saved model's loss %.7g, the trainer's %.7g", ls, lt);
      struct ll_engine_info fi;
      ll_engine_get_info(fe, &fi);
      CHECK(!strcmp(fi.arch, "gemma3"));
    }
    ll_engine_close(fe);
    remove(fpath), rmdir(fdir);
  }
  ll_trainer_free(tr);
}

// Gemma 3 on a device against the CPU backend, at seq_len SW (past the window: the local layers'
// attention_train_swa on the device), the same data and initial parameters: LoRA (batch 2, 6
// steps) and full-parameter (batch 2, 4 steps): each step's training loss and the validation
// loss after, relative to the CPU's: the reference tier within 1e-5 (observed 4.7e-7: not the
// same bits, the CPU backend's training products are sgemm's and its exp ggml's), the fast tier
// within 1e-4 (observed 8.2e-6; 6.4e-7 with the fused LoRA forward; 5.0e-6 with flash-style attention, whose
// saved logsumexps instead of the probabilities are asserted in the trainer's memory). The window ignored would be 5e-4 off
// (window_checks). The device-trained full model, saved, serves the device trainer's loss on the CPU (same tolerance).
static void gemma_device_checks(struct ll_engine *ce, struct ll_engine *de, const char *model, const char *tier, double tol) {
  char err[512];
  for (int mode = 0; mode < 2; mode++) {
    struct ll_trainer_params p;
    ll_trainer_params_init(&p);
    p.batch = 2, p.seq_len = SW, p.rank = 4, p.alpha = 8, p.lr = mode ? 3e-3 : 2e-2, p.warmup = 0, p.steps = mode ? 4 : 6, p.dropout = 0, p.clip = 1;
    if (mode) p.mode = LL_TRAIN_FULL, p.model_path = model;
    struct ll_trainer *tr[2] = {NULL, NULL};
    double l[2][8] = {{0}}, v[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
      struct ll_engine *e = k ? de : ce;
      CHECKF(ll_trainer_create(&tr[k], ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err) == 0, "%s: %s", k ? "device" : "cpu", err);
      if (!tr[k]) break;
      struct pat ps = {0, 0};
      struct ll_train_source src = {&ps, rule_next, rule_val_next, pat_val_reset, NULL, NULL};
      struct ll_train_step_info info = {0};
      if (k && !strcmp(tier, "fast")) { // flash-style attention: lse (B, H, S) per layer where the estimate counts (B, H, S, S)
        struct ll_train_memory mu, me;
        ll_trainer_memory(tr[k], &mu), ll_trainer_estimate(ll_engine_model(e), &p, &me);
        const struct ll_model *mm = ll_engine_model(e);
        const int64_t saved = (int64_t)4 * (p.recompute ? 1 : mm->L) * p.batch * mm->H * SW * (SW - 1);
        CHECKF(me.activations - mu.activations == saved, "the fast tier's trainer keeps %lld bytes of activations, the probabilities' %lld: %lld less, want %lld",
               (long long)mu.activations, (long long)me.activations, (long long)(me.activations - mu.activations), (long long)saved);
      }
      for (int st = 0; st < p.steps; st++) {
        CHECKF(ll_trainer_step(tr[k], &src, &info, err, sizeof err) == 0, "%s", err);
        l[k][st] = info.loss;
      }
      CHECKF(ll_trainer_eval(tr[k], &src, 0, &v[k], err, sizeof err) == 0, "%s", err);
    }
    double worst = 0;
    for (int st = 0; st < p.steps; st++) worst = fmax(worst, fabs(l[1][st] - l[0][st]) / fabs(l[0][st]));
    const double rv = fabs(v[1] - v[0]) / fabs(v[0]);
    printf("gemma3 %s on the device (%s tier), seq_len %d: loss %.6f -> %.6f (cpu %.6f -> %.6f), worst step relative difference %.3g; "
           "validation %.6f (cpu %.6f, relative %.3g); first step's loss %.17g (cpu %.17g)\n",
           mode ? "full" : "LoRA", tier, SW, l[1][0], l[1][p.steps - 1], l[0][0], l[0][p.steps - 1], worst, v[1], v[0], rv, l[1][0], l[0][0]);
    CHECKF(worst <= tol && rv <= tol, "gemma3 %s, %s tier: relative differences %.3g, %.3g (tolerance %.0e)", mode ? "full" : "LoRA", tier, worst, rv, tol);
    CHECK(l[0][p.steps - 1] < l[0][0]); // it trains
    char fdir[512], fpath[600];
    if (mode && tr[1] && ll_test_tmpdir(fdir, sizeof fdir)) { // the device-trained model, saved, served on the CPU: the device trainer's loss
      snprintf(fpath, sizeof fpath, "%s/full.ckpt", fdir);
      CHECKF(ll_trainer_save(tr[1], fpath, NULL, err, sizeof err) == 0, "%s", err);
      struct ll_engine_params ep;
      ll_engine_params_default(&ep);
      ep.model_path = fpath, ep.n_threads = 1, ep.n_ctx = 128, ep.device = "cpu";
      struct ll_engine *fe = NULL;
      CHECKF(ll_engine_open(&fe, &ep, err, sizeof err) == 0, "the device-trained checkpoint as a model: %s", err);
      if (fe) {
        int32_t si[2 * SW], stg[2 * SW];
        rule_seq(1001, si, stg), rule_seq(1002, si + SW, stg + SW);
        double lt = 0;
        CHECK(ll_trainer_forward_backward(tr[1], si, stg, 2, 0, 1.0f, &lt, NULL, err, sizeof err) == 0);
        const double ls = engine_loss(fe, si, stg, SW) + engine_loss(fe, si + SW, stg + SW, SW);
        printf("gemma3 full, trained on the device (%s tier): served from its checkpoint on the CPU: loss %.6f, the device trainer's %.6f\n", tier, ls,
               lt);
        CHECKF(fabs(ls - lt) <= tol * fabs(lt), "the saved model's loss %.7g, the device trainer's %.7g", ls, lt);
      }
      ll_engine_close(fe);
      remove(fpath), rmdir(fdir);
    }
    ll_trainer_free(tr[0]), ll_trainer_free(tr[1]);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int n_ctx = 128;
  if (argc > 3 && !strcmp(argv[argc - 2], "--ctx")) n_ctx = atoi(argv[argc - 1]), argc -= 2;
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = argv[1];
  ep.n_threads = 1;
  ep.n_ctx = n_ctx;
  ep.device = "cpu";
  char err[512];
  struct ll_engine *e = NULL;
  if (ll_engine_open(&e, &ep, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    CHECK(!"engine opens");
    return ll_test_summary();
  }
  if (argc > 2) { // on a device: the pattern's training there against the CPU's (same steps, same data)
    struct ll_engine_params dp = ep;
    dp.device = argv[2];
    struct ll_engine *de = NULL;
    CHECKF(ll_engine_open(&de, &dp, err, sizeof err) == 0, "%s", err);
    if (de && mdl_is(e, "gemma3")) { // the reference tier (PoCL's default), then the fast one
      gemma_device_checks(e, de, argv[1], "reference", 1e-5);
      ll_engine_close(de), de = NULL;
      setenv("LL_OPENCL_REFERENCE", "0", 1);
      CHECKF(ll_engine_open(&de, &dp, err, sizeof err) == 0, "%s", err);
      if (de) gemma_device_checks(e, de, argv[1], "fast", 1e-4);
      ll_engine_close(de);
      ll_engine_close(e);
      return ll_test_summary();
    }
    double c0 = 0, c1 = 0, d0 = 0, d1 = 0;
    struct ll_trainer *tc = de ? train_pattern(e, &c0, &c1) : NULL, *td = de ? train_pattern(de, &d0, &d1) : NULL;
    if (tc && td) {
      struct ll_engine_info info;
      ll_engine_get_info(de, &info);
      printf("validation loss before and after training: %s (%s, %s) %.6f %.6f, cpu %.6f %.6f\n", argv[2], info.backend, info.device_name, d0, d1, c0, c1);
      CHECK(!ll_backend_host_buffers(ll_engine_backend(de))); // the device's own memory
      CHECK(fabs(d0 - c0) <= 1e-4 * c0 && fabs(d1 - c1) <= 2e-2 * c1);
    }
    ll_trainer_free(tc), ll_trainer_free(td);
    ll_engine_close(de);
    ll_engine_close(e);
    return ll_test_summary();
  }
  struct ll_trainer_params p;
  ll_trainer_params_init(&p);
  p.batch = 1, p.seq_len = S, p.rank = 4, p.alpha = 8, p.lr = 3e-2, p.warmup = 0, p.steps = 1000, p.dropout = 0;
  const struct ll_model *mdl = ll_engine_model(e);
  const int gemma = mdl->arch && strcmp(mdl->arch->name, "gemma3") == 0;
  struct ll_backend *be = ll_engine_backend(e);
  const int ggml_math = be->ggml_math;
  struct ll_trainer *tr = NULL;
  if (gemma) { // sequences past the window (64): the local layers' windowed training attention
    window_checks(e, &p);
    be->ggml_math = 0; // finite differences through libm's tanh, not the f16 table
  }
  const int rc0 = ll_trainer_create(&tr, ll_engine_model(e), ll_engine_backend(e), &p, err, sizeof err);
  if (rc0) fprintf(stderr, "%s\n", err);
  CHECK(rc0 == 0);
  if (rc0) return ll_test_summary();
  // B nonzero, so that A has gradients too
  const struct ll_lora *lo = ll_trainer_lora(tr);
  uint64_t rs = 99;
  for (int l = 0; l < lo->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      struct ll_lora_pair *pr = ll_lora_at(lo, l, t);
      for (int64_t i = 0; i < pr->b.k * pr->b.n; i++) ((float *)pr->b.data)[i] = 0.05f * (ll_test_randf(&rs) - 0.5f);
    }
  // The rule's sequences: position j of the cycle is id (37 j + 11) mod 256 (every id once per 256).
  // Training sequences start at cycle positions 0, 24, 48, ... (11 of them: every transition of
  // the cycle); the held-out one at 12 (the same transitions, other contexts and positions).
  int32_t ids[S], tg[S], vids[S], vtg[S];
  for (int i = 0; i < S; i++) ids[i] = (int32_t)((i * 37 + 11) % 256), vids[i] = (int32_t)(((i + 12) * 37 + 11) % 256);
  for (int i = 0; i < S; i++) tg[i] = i + 1 < S ? ids[i + 1] : -1, vtg[i] = i + 1 < S ? vids[i + 1] : -1;
  float *P, *G;
  int64_t n;
  ll_trainer_vectors(tr, &P, &G, &n);
  double loss, lp, lm;
  CHECK(ll_trainer_zero_grad(tr) == 0);
  CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
  float *g = malloc(sizeof(float) * (size_t)n), *keep = malloc(sizeof(float) * (size_t)n), *d = malloc(sizeof(float) * (size_t)n);
  memcpy(g, G, sizeof(float) * (size_t)n);
  memcpy(keep, P, sizeof(float) * (size_t)n);
  for (int dir = 0; dir < 2; dir++) {
    double dd = 0, gd = 0;
    for (int64_t i = 0; i < n; i++) d[i] = dir == 0 ? g[i] : ll_test_randf(&rs) - 0.5f, dd += (double)d[i] * d[i];
    for (int64_t i = 0; i < n; i++) d[i] = (float)(d[i] / sqrt(dd)), gd += (double)g[i] * d[i];
    double best = 1e9;
    for (int k = 0; k < 3; k++) {
      const double eps = k == 0 ? 1e-2 : k == 1 ? 3e-3 : 1e-3;
      for (int64_t i = 0; i < n; i++) P[i] = keep[i] + (float)eps * d[i];
      CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lp, NULL, err, sizeof err) == 0);
      for (int64_t i = 0; i < n; i++) P[i] = keep[i] - (float)eps * d[i];
      CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 0, 1.0f, &lm, NULL, err, sizeof err) == 0);
      const double fd = (lp - lm) / (2 * eps), rel = fabs(fd - gd) / (fabs(gd) + 1e-6);
      printf("direction %s eps %.0e: g.d %+.6f finite differences %+.6f (relative %.2e)\n", dir ? "random" : "grad", eps, gd, fd, rel);
      best = rel < best ? rel : best;
    }
    memcpy(P, keep, sizeof(float) * (size_t)n);
    // observed: qwen3 2e-6 (gradient) and 9e-6 (random), gemma3 7e-7 and 1.6e-3 (the f32 loss's
    // rounding over a small g.d). Mutations of trainer.c on gemma3 print (gradient / random):
    // post-attention norm's backward skipped 1.2e-1 / 1.0e-1, post-FFN norm's 1.2e-1 / 2.2e-1,
    // SwiGLU's backward for GeGLU 2.0e-2 / 6.1e-2, the global RoPE base in local layers' backward
    // 3.0e-2 / 3.0e-2.
    CHECKF(best < 5e-3, "direction %d: gradient and finite differences differ by %.3g", dir, best);
  }
  free(g), free(keep), free(d);
  // training on one batch: its loss falls, and a held-out sequence's
  be->ggml_math = ggml_math;
  double vfirst, vlast;
  CHECK(ll_trainer_forward_backward(tr, vids, vtg, 1, 0, 1.0f, &vfirst, NULL, err, sizeof err) == 0);
  double first = 0, last = 0;
  for (int step = 0; step < 40; step++) {
    CHECK(ll_trainer_zero_grad(tr) == 0);
    CHECK(ll_trainer_forward_backward(tr, ids, tg, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
    if (step == 0) first = loss;
    last = loss;
    // plain SGD on the adapter (the optimizer is the trainer's own business, tested elsewhere)
    for (int64_t i = 0; i < n; i++) P[i] -= 0.02f * G[i];
  }
  printf("loss over one batch: %.4f -> %.4f after 40 steps\n", first, last);
  CHECK(last < 0.5 * first);
  // then 110 steps (10 passes) over the 11 training sequences in turn: the held-out sequence's loss falls
  for (int step = 0; step < 110; step++) {
    int32_t si[S], st[S];
    for (int i = 0; i < S; i++) si[i] = (int32_t)(((step % 11) * S + i) * 37 + 11) % 256;
    for (int i = 0; i < S; i++) st[i] = i + 1 < S ? si[i + 1] : -1;
    CHECK(ll_trainer_zero_grad(tr) == 0);
    CHECK(ll_trainer_forward_backward(tr, si, st, 1, 1, 1.0f, &loss, NULL, err, sizeof err) == 0);
    double gg = 0; // SGD with the gradient clipped to norm 1 (these losses are sums of large logits' errors)
    for (int64_t i = 0; i < n; i++) gg += (double)G[i] * G[i];
    const float lr = (float)(0.1 / (sqrt(gg) > 1 ? sqrt(gg) : 1));
    for (int64_t i = 0; i < n; i++) P[i] -= lr * G[i];
  }
  CHECK(ll_trainer_forward_backward(tr, vids, vtg, 1, 0, 1.0f, &vlast, NULL, err, sizeof err) == 0);
  printf("held-out sequence: loss %.4f -> %.4f\n", vfirst, vlast);
  CHECKF(vlast < 0.8 * vfirst, "held-out loss %.4f -> %.4f", vfirst, vlast);
  ll_trainer_free(tr);
  struct ll_lora_dims dm;
  ll_engine_lora_dims(e, &dm);
  if (ll_lora_fused(dm.arch)) fused_checks(e, argv[1]);
  if (gemma) gemma_full_checks(e, argv[1]);
  ll_engine_close(e);
  return ll_test_summary();
}
