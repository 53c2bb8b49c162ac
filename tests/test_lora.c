// test_lora.c - LoRA adapters (server/engine/lora.c, lora_io.c) and their use in the engine, on
// stories260K (../shared/testdata): PEFT initialisation, GGUF export/import round trip, PEFT
// directory import equal to the GGUF one (q/k lora_B rows permuted as llama.cpp's converter
// does), per-sequence adapters in one batch equal to each sequence alone, and corrupt or
// mismatched adapters refused with messages naming what was wrong.
//
// Also the test-only generator of the deterministic adapter whose llama.cpp output is the
// reference in tests/ref (tests/ref/README.md, section "LoRA"):
//   test_lora --make-adapter MODEL OUT.gguf RANK ALPHA SEED AMP    (AMP "nan": one B value NaN)
// A = PEFT init from SEED, B = AMP * uniform[-1, 1) from SEED + 1 (counter-based: the same on
// every machine).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_ckpt.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_lora.h"
#include "ll_modelfile.h"
#include "testutil.h"

static void fill_b(struct ll_lora *a, uint64_t seed, float amp) {
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      struct ll_lora_pair *p = ll_lora_at(a, l, t);
      if (!p->b.data) continue;
      float *b = (float *)p->b.data;
      for (int64_t i = 0; i < p->b.k * p->b.n; i++) b[i] = amp * ll_lora_uniform(seed, (uint64_t)(l * LL_LORA_N_TARGETS + t), (uint64_t)i);
    }
}

static int make_adapter(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: test_lora --make-adapter MODEL OUT.gguf RANK ALPHA SEED AMP\n");
    return 2;
  }
  char err[512];
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = argv[2];
  ep.n_threads = 1;
  ep.n_ctx = 64;
  struct ll_engine *e;
  if (ll_engine_open(&e, &ep, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  struct ll_lora *a;
  const uint64_t seed = strtoull(argv[6], NULL, 10);
  if (ll_lora_create(&a, &d, atoi(argv[4]), (float)atof(argv[5]), LL_LORA_ALL_TARGETS, seed, NULL, err, sizeof err))
    return fprintf(stderr, "%s\n", err), 1;
  const int nan = strcmp(argv[7], "nan") == 0; // a corrupt adapter for the server test
  fill_b(a, seed + 1, nan ? 0.02f : (float)atof(argv[7]));
  if (nan) ((float *)ll_lora_at(a, 0, LL_LORA_Q)->b.data)[3] = NAN;
  snprintf(a->name, sizeof a->name, "test-adapter");
  int rc = ll_lora_save_gguf(a, argv[3], err, sizeof err);
  if (rc) fprintf(stderr, "%s\n", err);
  ll_lora_free(a);
  ll_engine_close(e);
  return rc ? 1 : 0;
}

// Greedy ids: prompt `p` then n tokens, sequence using adapter a (or none).
static int greedy(struct ll_engine *e, const struct ll_lora *a, const int32_t *p, int np, int n, int32_t *out) {
  char err[256];
  int s = ll_engine_seq_new(e);
  if (s < 0) return -1;
  if (ll_engine_seq_set_adapter(e, s, a, err, sizeof err)) return fprintf(stderr, "%s\n", err), ll_engine_seq_free(e, s), -1;
  const int V = ll_engine_n_vocab(e);
  float *lg = malloc((size_t)V * sizeof *lg);
  int32_t tok[64];
  memcpy(tok, p, (size_t)np * sizeof *tok);
  int nt = np, rc = 0;
  for (int i = 0; i < n; i++) {
    struct ll_batch_item it = {s, nt, tok, 1, lg, NULL};
    if (ll_engine_decode(e, &it, 1, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      rc = -1;
      break;
    }
    int best = 0;
    for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
    out[i] = best;
    tok[0] = best, nt = 1;
  }
  free(lg);
  ll_engine_seq_free(e, s);
  return rc;
}

static int lora_equal(const struct ll_lora *x, const struct ll_lora *y) {
  if (x->n_layer != y->n_layer || x->rank != y->rank || x->alpha != y->alpha || x->targets != y->targets || x->n_params != y->n_params) return 0;
  for (int l = 0; l < x->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      const struct ll_lora_pair *p = ll_lora_at(x, l, t), *q = ll_lora_at(y, l, t);
      if (!p->a.data != !q->a.data) return 0;
      if (!p->a.data) continue;
      if (memcmp(p->a.data, q->a.data, (size_t)(p->a.k * p->a.n) * 4) || memcmp(p->b.data, q->b.data, (size_t)(p->b.k * p->b.n) * 4)) return 0;
    }
  return 1;
}

// A PEFT directory holding adapter a: HF names and shapes, lora_B of q/k in HF row order
// (the inverse of llama.cpp's permutation). dtype F32.
static int write_peft(const char *dir, const struct ll_lora *a, const struct ll_lora_dims *d, const char *extra_cfg) {
  char p[512];
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  FILE *f = fopen(p, "w");
  if (!f) return -1;
  fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %g, \"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", "
             "\"gate_proj\", \"up_proj\", \"down_proj\"], \"bias\": \"none\"%s}\n", a->rank, (double)a->alpha, extra_cfg ? extra_cfg : "");
  fclose(f);
  // header JSON
  size_t cap = 1 << 20, hl = 0;
  char *h = malloc(cap);
  hl += (size_t)snprintf(h + hl, cap - hl, "{");
  uint64_t off = 0;
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      const struct ll_lora_pair *pr = ll_lora_at(a, l, t);
      if (!pr->a.data) continue;
      for (int w = 0; w < 2; w++) {
        const struct ll_weight *m = w ? &pr->b : &pr->a;
        const uint64_t nb = (uint64_t)(m->k * m->n) * 4;
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"base_model.model.model.layers.%d.%s.%s.lora_%c.weight\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld], \"data_offsets\": [%llu, %llu]}",
                               off ? ", " : "", l, t <= LL_LORA_O ? "self_attn" : "mlp", ll_lora_target_peft(t), w ? 'B' : 'A', (long long)m->n,
                               (long long)m->k, (unsigned long long)off, (unsigned long long)(off + nb));
        off += nb;
      }
    }
  hl += (size_t)snprintf(h + hl, cap - hl, "}");
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  f = fopen(p, "wb");
  uint64_t n = hl;
  fwrite(&n, 8, 1, f);
  fwrite(h, 1, hl, f);
  free(h);
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
      const struct ll_lora_pair *pr = ll_lora_at(a, l, t);
      if (!pr->a.data) continue;
      fwrite(pr->a.data, 4, (size_t)(pr->a.k * pr->a.n), f);
      const float *b = pr->b.data;
      const int64_t rows = pr->b.n, r = pr->b.k;
      if (t == LL_LORA_Q || t == LL_LORA_K) {
        const int heads = t == LL_LORA_Q ? d->n_head : d->n_head_kv;
        const int64_t hd = rows / heads;
        for (int64_t hr = 0; hr < rows; hr++) { // HF row hr = h*hd + i*hd/2 + j  <- GGUF row h*hd + 2j + i
          const int64_t hh = hr / hd, rem = hr % hd, i = rem / (hd / 2), j = rem % (hd / 2);
          fwrite(b + (hh * hd + 2 * j + i) * r, 4, (size_t)r, f);
        }
      } else {
        fwrite(b, 4, (size_t)(rows * r), f);
      }
    }
  fclose(f);
  return 0;
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--make-adapter") == 0) return make_adapter(argc, argv);
  char path[1024], err[1024], tmp[512], f1[600], f2[600];
  if (!ll_test_shared_path("testdata/models/stories260K.bin", path, sizeof path)) {
    printf("../shared/testdata/models/stories260K.bin absent: nothing to test the adapters on\n");
    return ll_test_summary();
  }
  struct ll_engine_params ep;
  ll_engine_params_default(&ep);
  ep.model_path = path;
  ep.n_threads = 1;
  ep.n_ctx = 128;
  ep.n_parallel = 4;
  ep.batch_invariant = 1;
  struct ll_engine *e;
  CHECKF(ll_engine_open(&e, &ep, err, sizeof err) == 0, "%s", err);
  struct ll_lora_dims d;
  ll_engine_lora_dims(e, &d);
  CHECK(strcmp(d.arch, "llama") == 0 && d.n_layer == 5 && d.n_embd == 64 && d.n_embd_kv == 32 && d.n_ff == 172 && d.n_head == 8 && d.n_head_kv == 4);
  ll_test_tmpdir(tmp, sizeof tmp);

  // ---- creation: PEFT init, B zero, deterministic per seed
  struct ll_lora *a, *a2, *zero;
  CHECKF(ll_lora_create(&a, &d, 4, 8.0f, LL_LORA_ALL_TARGETS, 7, NULL, err, sizeof err) == 0, "%s", err);
  CHECK(ll_lora_create(&a2, &d, 4, 8.0f, LL_LORA_ALL_TARGETS, 7, NULL, err, sizeof err) == 0);
  CHECK(ll_lora_create(&zero, &d, 4, 8.0f, LL_LORA_ALL_TARGETS, 8, NULL, err, sizeof err) == 0);
  CHECK(a->n_params == 5 * 4 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 172) * 3));
  CHECK(lora_equal(a, a2));
  CHECK(!lora_equal(a, zero)); // another seed, another A
  {
    const struct ll_lora_pair *p = ll_lora_at(a, 2, LL_LORA_DOWN);
    const float *A = p->a.data, *B = p->b.data, bound = 1.0f / sqrtf(172.0f);
    int inb = 1, bz = 1;
    double s2 = 0;
    for (int64_t i = 0; i < p->a.k * p->a.n; i++) inb &= fabsf(A[i]) <= bound, s2 += (double)A[i] * A[i];
    for (int64_t i = 0; i < p->b.k * p->b.n; i++) bz &= B[i] == 0.0f;
    const double var = s2 / (double)(p->a.k * p->a.n), want = bound * bound / 3.0; // U(-b, b): b^2/3
    CHECKF(inb && bz && fabs(var - want) < 0.15 * want, "A within +-1/sqrt(in) (%d), variance %g vs %g, B zero (%d)", inb, var, want, bz);
    CHECK(fabsf(ll_lora_scale(a) - 2.0f) < 1e-7f);
  }
  CHECK(ll_lora_check(a, &d, err, sizeof err) == 0);
  ll_lora_free(a2); // the copy made for the determinism check; a2 is reused below
  a2 = NULL;
  CHECK(ll_lora_create(&a2, &d, 0, 8.0f, LL_LORA_ALL_TARGETS, 7, NULL, err, sizeof err) == LL_EINVAL && contains(err, "rank"));
  ll_lora_free(a2);

  // ---- engine: a fresh (B = 0) adapter changes nothing; a non-zero one changes the text
  const int32_t prompt[3] = {1, 400, 261};
  int32_t base[24], fresh[24], ad[24], ad2[24];
  CHECK(greedy(e, NULL, prompt, 3, 24, base) == 0);
  CHECK(greedy(e, zero, prompt, 3, 24, fresh) == 0);
  CHECK(memcmp(base, fresh, sizeof base) == 0);
  fill_b(a, 99, 0.05f);
  fill_b(zero, 98, 0.05f);
  CHECK(greedy(e, a, prompt, 3, 24, ad) == 0);
  CHECK(greedy(e, zero, prompt, 3, 24, ad2) == 0);
  int diff = 0, diff2 = 0;
  for (int i = 0; i < 24; i++) diff += ad[i] != base[i], diff2 += ad2[i] != ad[i];
  CHECKF(diff > 0 && diff2 > 0, "adapted greedy ids differ from the base in %d, between adapters in %d of 24", diff, diff2);

  // ---- per-sequence adapters in one batch = each sequence alone (bit for bit)
  {
    const int V = ll_engine_n_vocab(e);
    const struct ll_lora *which[3] = {a, NULL, zero};
    const int32_t *want[3] = {ad, base, ad2};
    int s[3];
    float *lg = malloc((size_t)3 * V * sizeof *lg);
    int32_t tk[3][4];
    int nt[3], ok = 1;
    for (int k = 0; k < 3; k++) {
      s[k] = ll_engine_seq_new(e);
      CHECK(ll_engine_seq_set_adapter(e, s[k], which[k], err, sizeof err) == 0);
      memcpy(tk[k], prompt, sizeof prompt), nt[k] = 3;
    }
    for (int i = 0; i < 24 && ok; i++) {
      struct ll_batch_item it[3];
      for (int k = 0; k < 3; k++) it[k] = (struct ll_batch_item){s[k], nt[k], tk[k], 1, lg + (size_t)k * V, NULL};
      if (ll_engine_decode(e, it, 3, err, sizeof err)) {
        ok = 0;
        break;
      }
      for (int k = 0; k < 3; k++) {
        int best = 0;
        for (int v = 1; v < V; v++) best = lg[(size_t)k * V + v] > lg[(size_t)k * V + best] ? v : best;
        ok &= best == want[k][i];
        tk[k][0] = best, nt[k] = 1;
      }
    }
    CHECKF(ok, "three sequences (adapter a, none, adapter b) in one batch give each one's own greedy ids");
    for (int k = 0; k < 3; k++) ll_engine_seq_free(e, s[k]);
    free(lg);
  }

  // ---- GGUF round trip
  snprintf(a->name, sizeof a->name, "mine");
  snprintf(f1, sizeof f1, "%s/my-adapter.gguf", tmp);
  CHECKF(ll_lora_save_gguf(a, f1, err, sizeof err) == 0, "%s", err);
  struct ll_lora *g = NULL;
  CHECKF(ll_lora_load(&g, f1, &d, NULL, err, sizeof err) == 0, "%s", err);
  if (g) {
    CHECK(lora_equal(a, g));
    CHECK(strcmp(g->name, "my-adapter") == 0 && strcmp(g->arch, "llama") == 0);
  }
  {
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    CHECK(ll_gguf_open(f1, &mf, err, sizeof err) == 0);
    const char *s;
    double al;
    const struct ll_tensor_info *ta = ll_mf_find_tensor(&mf, "blk.3.ffn_down.weight.lora_a"), *tb = ll_mf_find_tensor(&mf, "blk.3.ffn_down.weight.lora_b");
    CHECK(ll_mf_get_str(&mf, "general.type", &s) == 0 && strcmp(s, "adapter") == 0);
    CHECK(ll_mf_get_str(&mf, "adapter.type", &s) == 0 && strcmp(s, "lora") == 0);
    CHECK(ll_mf_find_kv(&mf, "adapter.lora.alpha") && ll_mf_find_kv(&mf, "adapter.lora.alpha")->value.type == LL_KV_F32);
    CHECK(ll_mf_get_float(&mf, "adapter.lora.alpha", &al) == 0 && al == 8.0);
    CHECK(ta && tb && ta->ne[0] == 172 && ta->ne[1] == 4 && tb->ne[0] == 4 && tb->ne[1] == 64 && ta->type == 0);
    CHECK(mf.n_tensors == 5 * 7 * 2);
    ll_modelfile_free(&mf);
  }

  // ---- a run checkpoint (.ckpt) holding the adapter (ll_lora_to_mf, as the trainer writes it)
  // plus AdamW moments and training keys: read back as the same adapter, with or without dims
  {
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    CHECK(ll_lora_to_mf(a, &mf, err, sizeof err) == 0);
    const struct ll_lora_pair *p = ll_lora_at(a, 0, LL_LORA_Q);
    const int64_t ne[2] = {p->a.k, p->a.n};
    CHECK(ll_mf_add_tensor(&mf, "blk.0.attn_q.weight.lora_a.adam_m", 0, 2, ne, p->a.data) == 0);
    CHECK(ll_mf_set_u64(&mf, "training.step", 100) == 0);
    struct ll_ckpt_write_opts o;
    ll_ckpt_write_opts_init(&o);
    o.no_fsync = 1;
    snprintf(f2, sizeof f2, "%s/step-100.ckpt", tmp);
    CHECKF(ll_ckpt_write(f2, &mf, &o, err, sizeof err) == 0, "%s", err);
    ll_modelfile_free(&mf);
    for (int k = 0; k < 2; k++) {
      struct ll_lora *c = NULL;
      CHECKF(ll_lora_load(&c, f2, k ? NULL : &d, NULL, err, sizeof err) == 0, "%s", err);
      CHECK(c && lora_equal(a, c) && strcmp(c->name, "step-100") == 0);
      ll_lora_free(c);
    }
  }

  // ---- PEFT directory = the same adapter
  snprintf(f2, sizeof f2, "%s/peft-adapter", tmp);
  CHECK(write_peft(f2, a, &d, NULL) == 0);
  struct ll_lora *pf = NULL;
  CHECKF(ll_lora_load(&pf, f2, &d, NULL, err, sizeof err) == 0, "%s", err);
  if (pf) {
    CHECKF(lora_equal(a, pf), "PEFT import equals the GGUF adapter (q/k lora_B rows permuted)");
    CHECK(strcmp(pf->name, "peft-adapter") == 0);
    int32_t ids[24];
    CHECK(greedy(e, pf, prompt, 3, 24, ids) == 0 && memcmp(ids, ad, sizeof ids) == 0);
  }
  ll_lora_free(pf), pf = NULL;
  {
    char f3[700];
    snprintf(f3, sizeof f3, "%s/rs", tmp);
    CHECK(write_peft(f3, a, &d, ", \"use_rslora\": true") == 0);
    CHECK(ll_lora_load(&pf, f3, &d, NULL, err, sizeof err) == 0 && pf && fabsf(ll_lora_scale(pf) - 8.0f / 2.0f) < 1e-6f); // alpha/sqrt(r)
    ll_lora_free(pf), pf = NULL;
    snprintf(f3, sizeof f3, "%s/dora", tmp);
    CHECK(write_peft(f3, a, &d, ", \"use_dora\": true") == 0);
    CHECK(ll_lora_load(&pf, f3, &d, NULL, err, sizeof err) == LL_EUNSUPPORTED && contains(err, "DoRA"));
    snprintf(f3, sizeof f3, "%s/r8", tmp);
    a->rank = 8; // the config says r=8, the tensors have 4
    CHECK(write_peft(f3, a, &d, NULL) == 0);
    a->rank = 4;
    CHECK(ll_lora_load(&pf, f3, &d, NULL, err, sizeof err) == LL_EINVAL && contains(err, "r=8"));
    printf("PEFT rank mismatch: %s\n", err);
  }

  // ---- bad adapters: each refused with a message saying what
  {
    struct ll_lora_dims other = d;
    other.n_embd = 48, other.n_ff = 100, other.n_embd_kv = 24;
    struct ll_lora *o;
    CHECK(ll_lora_create(&o, &other, 4, 8.0f, LL_LORA_ALL_TARGETS, 1, NULL, err, sizeof err) == 0);
    snprintf(f2, sizeof f2, "%s/other.gguf", tmp);
    CHECK(ll_lora_save_gguf(o, f2, err, sizeof err) == 0);
    CHECK(ll_lora_load(&pf, f2, &d, NULL, err, sizeof err) == LL_EINVAL && contains(err, "wrong base") && contains(err, "other.gguf"));
    printf("wrong shapes: %s\n", err);
    CHECK(ll_engine_seq_set_adapter(e, 0, o, err, sizeof err) == LL_EINVAL); // (sequence 0 is free: bad sequence)
    int s = ll_engine_seq_new(e);
    CHECK(ll_engine_seq_set_adapter(e, s, o, err, sizeof err) == LL_EINVAL && contains(err, "wrong base"));
    ll_engine_seq_free(e, s);
    snprintf(o->arch, sizeof o->arch, "qwen2");
    CHECK(ll_lora_save_gguf(o, f2, err, sizeof err) == 0);
    CHECK(ll_lora_load(&pf, f2, &d, NULL, err, sizeof err) == LL_EINVAL && contains(err, "architecture 'qwen2'"));
    printf("wrong architecture: %s\n", err);
    ll_lora_free(o);
    // NaN
    float *bv = (float *)ll_lora_at(a, 1, LL_LORA_V)->b.data, keep = bv[5];
    bv[5] = NAN;
    snprintf(f2, sizeof f2, "%s/nan.gguf", tmp);
    CHECK(ll_lora_save_gguf(a, f2, err, sizeof err) == 0);
    CHECK(ll_lora_load(&pf, f2, &d, NULL, err, sizeof err) == LL_EFORMAT && contains(err, "blk.1.attn_v.lora_b") && contains(err, "NaN"));
    printf("NaN: %s\n", err);
    bv[5] = INFINITY;
    CHECK(ll_lora_check(a, &d, err, sizeof err) == LL_EFORMAT && contains(err, "infinite"));
    bv[5] = keep;
    // truncated
    size_t len;
    unsigned char *buf = ll_test_read_file(f1, &len);
    snprintf(f2, sizeof f2, "%s/trunc.gguf", tmp);
    FILE *f = fopen(f2, "wb");
    fwrite(buf, 1, len * 2 / 3, f);
    fclose(f);
    CHECK(ll_lora_load(&pf, f2, &d, NULL, err, sizeof err) < 0 && contains(err, "trunc.gguf"));
    printf("truncated: %s\n", err);
    // a model, not an adapter
    CHECK(ll_lora_load(&pf, path, &d, NULL, err, sizeof err) == LL_EFORMAT);
    printf("not an adapter: %s\n", err);
    free(buf);
    // lora_a without lora_b
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    ll_mf_set_str(&mf, "general.architecture", "llama");
    ll_mf_set_str(&mf, "general.type", "adapter");
    ll_mf_set_str(&mf, "adapter.type", "lora");
    const struct ll_lora_pair *p = ll_lora_at(a, 0, LL_LORA_Q);
    int64_t ne[2] = {64, 4};
    ll_mf_add_tensor(&mf, "blk.0.attn_q.weight.lora_a", 0, 2, ne, p->a.data);
    CHECK(ll_lora_from_mf(&pf, &mf, &d, 0, NULL, err, sizeof err) == LL_EFORMAT && contains(err, "not lora_b"));
    ll_mf_add_tensor(&mf, "output.weight.lora_b", 0, 2, ne, p->a.data);
    CHECK(ll_lora_from_mf(&pf, &mf, &d, 0, NULL, err, sizeof err) == LL_EUNSUPPORTED && contains(err, "output.weight"));
    ll_modelfile_free(&mf);
    CHECK(pf == NULL);
  }
  // The engine still works after all of that.
  int32_t again[24];
  CHECK(greedy(e, a, prompt, 3, 24, again) == 0 && memcmp(again, ad, sizeof again) == 0);

  ll_lora_free(g);
  ll_lora_free(a);
  ll_lora_free(zero);
  ll_engine_close(e);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  return ll_test_summary();
}
