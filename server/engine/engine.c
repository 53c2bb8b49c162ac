// engine.c - the inference engine behind ll_engine.h, for every family of ll_arch.h (Llama,
// Mistral, Qwen2/3, Gemma 3, Phi-3): one forward pass whose variants are the row's flags.
//
// Model: hyperparameters from GGUF-style metadata, weights kept in their file type (mmapped or
// loaded .ckpt memory) as struct ll_weight, norms as f32. Forward over a batch of
// (sequence, tokens) items composed only from backend calls: all items' tokens form one
// (T, C) activation matrix so each weight matrix is streamed once per step; attention runs per
// item against that sequence's pages of the KV cache.
// KV cache: per layer, a pool of blocks of LL_KV_BLOCK positions (f16 by default); a free
// list of block ids; each sequence holds a block table. Freeing a sequence returns its blocks.
#include "ll_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_arch.h"
#include "ll_backend.h"
#include "ll_error.h"
#include "ll_model.h"
#include "ll_moe.h"
#include "ll_lora.h"
#include "ll_modelfile.h"
#include "ll_quant.h"
#include "ll_sample.h"
#include "ll_tokenizer.h"

#define MAX_BATCH_DEFAULT 512

struct seq {
  int used, len, n_blocks;
  int32_t *blocks; // block table (max_blocks_per_seq)
  const struct ll_lora *lora; // adapter of this sequence, or NULL
  struct ll_sample_dev smp;    // ll_engine_seq_set_sample: the next argmax row's sampling step
  int has_smp;
};

struct ll_engine {
  struct ll_modelfile mf;
  struct ll_tokenizer *tok;
  struct ll_backend *be;
  struct ll_engine_info info;
  struct ll_model m; // hyperparameters and weights (ll_model.h; the trainer reads them too)
  int n_ctx;
  float *owned_f32; // dequantized norms / biases
  void *packed; // the CPU kernels' interleaved copies of the matrices (ll_cpu_weight_pack_into), one block owned here
  // KV cache
  int kv_type, n_blocks, max_blocks_per_seq, n_free;
  void **k_pool, **v_pool; // per layer
  int32_t *free_list;
  struct seq *seqs;
  int n_seqs;
  // scratch (max_batch rows)
  int max_batch;
  float *x, *xn, *q, *k, *v, *att, *tmp, *g, *u;
  int32_t *pos, *ids, *amax; // amax (max_batch): the argmax of each logits row (greedy items)
  struct ll_sample_dev *sdev; // (max_batch) each logits row's sampling step for the backend's sample member
  struct ll_token_prob *scand; // (n_vocab, on first use) the host's sampling scratch
  float *srow;                 // (n_vocab, on first use) a logits row read back for it
  struct ll_kv_view *kvv; // (n_seqs) per batch item: its cache view, first row, row count
  int *it0, *itn;
  float *logits_buf;
  size_t logits_cap;
  float *sel; // (rows needing logits, C)
  float *lora_r, *lora_o; // adapter scratch: (max_batch, lora_rank), (max_batch, max(C, F))
  int lora_rank;
  // mixture of experts (m.n_expert > 0): the layers' expert tables and the FFN's scratch
  struct ll_moe_layer *moe_layers; // (L)
  struct ll_weight *experts;       // (L, 3, E): each layer's gate, up, down slices
  struct ll_moe_ctx *moe;
  const struct ll_lora **tok_lora; // (max_batch) each row's adapter, for adapters on experts
  // Decode steps queued one behind the other (ll_engine_decode_queue): step s writes its ids to
  // dq_dev[s % 2] on the device (the next step's input, read there) and reads them back into
  // dq_host[s % 2] without waiting; dq_done of dq_steps collected. dq_seqs (n_seqs): the last
  // queued step's sequences, in order (dq_last of them; 0: the next step's ids come from the host).
  int32_t *dq_dev[2], *dq_host[2];
  int dq_ticket[2], dq_n[2];
  int64_t dq_steps, dq_done;
  int *dq_seqs, dq_last;
};

void ll_engine_params_default(struct ll_engine_params *p) {
  memset(p, 0, sizeof *p);
  p->n_parallel = 1;
  p->kv_f16 = -1;
  p->device = "auto";
  p->repack = 1;
}

// ---------------------------------------------------------------- loading

static int weight(struct ll_engine *e, const char *name, int64_t k, int64_t n, struct ll_weight *w, int optional, char *err, size_t errlen) {
  const struct ll_tensor_info *t = ll_mf_find_tensor(&e->mf, name);
  memset(w, 0, sizeof *w);
  if (!t) return optional ? 1 : ll_errf(err, errlen, LL_ENOTFOUND, "model: tensor '%s' is missing", name);
  if (t->n_dims > 2 || t->ne[0] != k || t->ne[1] != n)
    return ll_errf(err, errlen, LL_EFORMAT, "model: tensor '%s' has shape (%lld, %lld), expected (%lld, %lld)", name, (long long)t->ne[0],
                   (long long)t->ne[1], (long long)k, (long long)n);
  if (!ll_type_traits_get(t->type) || !ll_type_traits_get(t->type)->has_dequant)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "model: tensor '%s' has type %s, which has no kernels", name, ll_type_name(t->type));
  w->type = t->type;
  w->k = k;
  w->n = n;
  w->data = t->data;
  return 0;
}

// A 1-D tensor as f32 (dequantized into owned memory when stored in another type).
static int vec(struct ll_engine *e, const char *name, int64_t n, const float **out, float **arena, int optional, char *err, size_t errlen) {
  const struct ll_tensor_info *t = ll_mf_find_tensor(&e->mf, name);
  *out = NULL;
  if (!t) return optional ? 0 : ll_errf(err, errlen, LL_ENOTFOUND, "model: tensor '%s' is missing", name);
  if (t->ne[0] != n || t->ne[1] != 1) return ll_errf(err, errlen, LL_EFORMAT, "model: tensor '%s' should have %lld elements", name, (long long)n);
  if (t->type == LL_TYPE_F32) {
    *out = t->data;
    return 0;
  }
  if (ll_dequantize_row(t->type, t->data, *arena, n) != 0)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "model: tensor '%s' type %s", name, ll_type_name(t->type));
  *out = *arena;
  *arena += n;
  return 0;
}

// Phi-3's LongRoPE (128k variants), as llama.cpp 0c1e5709 reads it: rope_factors_long.weight and
// rope_factors_short.weight (n_rot/2 F32 divisors of theta each, shared by every layer), the long
// ones when the context per sequence exceeds rope.scaling.original_context_length (default: the
// training context; llama_model::get_rope_factors), rope_freqs.weight winning where a file has it;
// and rope.scaling.attn_factor (the converter's sqrt(1 + ln(scale) / ln(original context))),
// multiplying cos and sin of every rotation whichever factors are chosen (ggml's mscale).
static int longrope(struct ll_engine *e, const char *arch, char *err, size_t errlen) {
  double d;
  if (ll_mf_get_arch_float(&e->mf, "rope.scaling.attn_factor", &d) == 0) {
    if (!(d > 0 && d <= 16)) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.rope.scaling.attn_factor = %g is out of range (0, 16]", arch, d);
    e->m.rope.attn_factor = (float)d;
  }
  const struct ll_tensor_info *fl = ll_mf_find_tensor(&e->mf, "rope_factors_long.weight"), *fs = ll_mf_find_tensor(&e->mf, "rope_factors_short.weight");
  const struct ll_tensor_info *two[2] = {fl, fs};
  static const char *const names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
  for (int i = 0; i < 2; i++) {
    const struct ll_tensor_info *t = two[i];
    if (!t) continue;
    const int n = e->m.rope.n_rot / 2;
    if (t->type != LL_TYPE_F32 || t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
      return ll_errf(err, errlen, LL_EFORMAT, "model: %s should be %d F32 values (rope.dimension_count / 2)", names[i], n);
    const float *f = t->data;
    for (int j = 0; j < n; j++)
      if (!(f[j] > 0 && f[j] < 1e30f)) return ll_errf(err, errlen, LL_EFORMAT, "model: %s[%d] = %g is not a positive factor", names[i], j, (double)f[j]);
  }
  int64_t orig = e->info.n_ctx_train;
  if (ll_mf_get_arch_int(&e->mf, "rope.scaling.original_context_length", &orig) == 0 && (orig <= 0 || orig > (1 << 24)))
    return ll_errf(err, errlen, LL_EFORMAT, "model: %s.rope.scaling.original_context_length = %lld is out of range", arch, (long long)orig);
  if (!e->m.rope.freq_factors && (fl || fs)) {
    const struct ll_tensor_info *t = e->n_ctx > orig ? fl : fs;
    e->m.rope.freq_factors = t ? t->data : NULL;
  }
  return 0;
}

static int load_hparams(struct ll_engine *e, const struct ll_engine_params *p, char *err, size_t errlen) {
  const char *arch;
  if (ll_mf_get_str(&e->mf, "general.architecture", &arch) != 0)
    return ll_errf(err, errlen, LL_EFORMAT, "model: general.architecture is missing");
  const struct ll_arch *A = ll_arch_find(arch);
  if (!A) return ll_errf(err, errlen, LL_EUNSUPPORTED, "model: architecture '%.64s' is not supported (supported: %s)", arch, ll_arch_names());
  e->m.arch = A;
  e->m.moe_norm_w = A->moe_norm_w;
  snprintf(e->info.arch, sizeof e->info.arch, "%s", arch);
  int64_t v[6];
  static const char *const keys[6] = {"embedding_length", "block_count", "attention.head_count", "feed_forward_length", "context_length",
                                      "attention.head_count_kv"};
  for (int i = 0; i < 6; i++) {
    int rc = ll_mf_get_arch_int(&e->mf, keys[i], &v[i]);
    if (rc == LL_ENOTFOUND && i == 5) v[5] = v[2], rc = 0;
    if (rc) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.%s is missing or not an integer", arch, keys[i]);
    if (v[i] <= 0 || v[i] > (1 << 20)) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.%s = %lld is out of range", arch, keys[i], (long long)v[i]);
  }
  e->m.C = (int)v[0], e->m.L = (int)v[1], e->m.H = (int)v[2], e->m.F = (int)v[3], e->m.Hkv = (int)v[5];
  e->info.n_ctx_train = (int)v[4];
  if (e->m.H % e->m.Hkv) return ll_errf(err, errlen, LL_EFORMAT, "model: %d kv heads do not divide %d heads", e->m.Hkv, e->m.H);
  // The head width: attention.key_length where the GGUF has it (Gemma 3: 256 with C = 640, H = 4),
  // else C / H. Values as wide as keys (every family here).
  int64_t kl, vl;
  if (ll_mf_get_arch_int(&e->mf, "attention.key_length", &kl) == 0) {
    if (kl <= 0 || kl > 4096) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.attention.key_length = %lld is out of range", arch, (long long)kl);
    if (ll_mf_get_arch_int(&e->mf, "attention.value_length", &vl) == 0 && vl != kl)
      return ll_errf(err, errlen, LL_EUNSUPPORTED, "model: value_length %lld differs from key_length %lld", (long long)vl, (long long)kl);
    e->m.hd = (int)kl;
  } else {
    if (e->m.C % e->m.H) return ll_errf(err, errlen, LL_EFORMAT, "model: %d heads do not divide %d dims", e->m.H, e->m.C);
    e->m.hd = e->m.C / e->m.H;
  }
  if ((int64_t)e->m.hd * e->m.H > (1 << 20)) return ll_errf(err, errlen, LL_EFORMAT, "model: %d heads of %d dims are too wide", e->m.H, e->m.hd);
  e->m.qd = e->m.hd * e->m.H;
  e->m.kvd = e->m.hd * e->m.Hkv;
  // Mixture of experts: <arch>.expert_count experts, expert_used_count per token; expert width
  // expert_feed_forward_length where the converter writes it (qwen2moe, qwen3moe), else
  // feed_forward_length (Mixtral, OLMoE); qwen2moe's shared expert
  // expert_shared_feed_forward_length wide.
  int64_t ne = 0, nu = 0, fe = 0, fs = 0;
  if (ll_mf_get_arch_int(&e->mf, "expert_count", &ne) == 0 && ne > 0) {
    if (ne > 1024) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.expert_count = %lld is out of range (1..1024)", arch, (long long)ne);
    if (ll_mf_get_arch_int(&e->mf, "expert_used_count", &nu) != 0 || nu <= 0 || nu > ne)
      return ll_errf(err, errlen, LL_EFORMAT, "model: %s.expert_used_count is missing or not in 1..%lld", arch, (long long)ne);
    if (ll_mf_get_arch_int(&e->mf, "expert_feed_forward_length", &fe) != 0) fe = v[3];
    if (fe <= 0 || fe > (1 << 20)) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.expert_feed_forward_length = %lld is out of range", arch, (long long)fe);
    if (ll_mf_get_arch_int(&e->mf, "expert_shared_feed_forward_length", &fs) != 0) fs = strcmp(arch, "qwen2moe") == 0 ? v[3] : 0;
    if (fs < 0 || fs > (1 << 20)) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.expert_shared_feed_forward_length = %lld is out of range", arch, (long long)fs);
    e->m.n_expert = (int)ne, e->m.n_expert_used = (int)nu, e->m.F_exp = (int)fe, e->m.F_sh = (int)fs;
  } else if (A->flags & LL_ARCH_MOE) {
    return ll_errf(err, errlen, LL_EFORMAT, "model: %s.expert_count is missing", arch);
  }
  double d;
  e->m.moe_w_scale = ll_mf_get_arch_float(&e->mf, "expert_weights_scale", &d) == 0 ? (float)d : 0.0f;
  e->m.eps = ll_mf_get_arch_float(&e->mf, "attention.layer_norm_rms_epsilon", &d) == 0 ? (float)d : 1e-5f;
  e->m.rope.mode = A->rope_mode;
  int64_t nrot;
  e->m.rope.n_rot = ll_mf_get_arch_int(&e->mf, "rope.dimension_count", &nrot) == 0 ? (int)nrot : e->m.hd;
  if (e->m.rope.n_rot <= 0 || e->m.rope.n_rot > e->m.hd || e->m.rope.n_rot % 2) return ll_errf(err, errlen, LL_EFORMAT, "model: rope.dimension_count %d", e->m.rope.n_rot);
  e->m.rope.freq_base = ll_mf_get_arch_float(&e->mf, "rope.freq_base", &d) == 0 ? (float)d : 10000.0f;
  e->m.rope.freq_scale = 1.0f;
  char key[96];
  const char *st;
  snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
  if (ll_mf_get_str(&e->mf, key, &st) == 0 && strcmp(st, "linear") == 0 && ll_mf_get_arch_float(&e->mf, "rope.scaling.factor", &d) == 0 && d > 0)
    e->m.rope.freq_scale = (float)(1.0 / d);
  const struct ll_tensor_info *ff = ll_mf_find_tensor(&e->mf, "rope_freqs.weight");
  if (ff) {
    if (ff->type != LL_TYPE_F32 || ff->ne[0] != e->m.rope.n_rot / 2) return ll_errf(err, errlen, LL_EFORMAT, "model: rope_freqs.weight shape/type");
    e->m.rope.freq_factors = ff->data;
  }
  // The context per sequence: --ctx, else the training context up to 4096.
  e->n_ctx = p->n_ctx > 0 ? p->n_ctx : (e->info.n_ctx_train < 4096 ? e->info.n_ctx_train : 4096);
  if (e->n_ctx > (1 << 20)) return ll_errf(err, errlen, LL_EINVAL, "engine: n_ctx %d is too large", e->n_ctx);
  const int rc_lr = longrope(e, arch, err, errlen);
  if (rc_lr) return rc_lr;
  // Sliding-window layers: a window where the family honours the key; which layers from the
  // GGUF's sliding_window_pattern (an integer n: every n-th layer global) or the row's default.
  // Their RoPE: the global one, but for the base (rope.freq_base_swa, else the row's).
  e->m.rope_swa = e->m.rope;
  int64_t win = 0;
  if ((A->flags & LL_ARCH_SWA) && ll_mf_get_arch_int(&e->mf, "attention.sliding_window", &win) == 0 && win > 0) {
    if (win > (1 << 24)) return ll_errf(err, errlen, LL_EFORMAT, "model: %s.attention.sliding_window = %lld is out of range", arch, (long long)win);
    e->m.window = (int)win;
    if (ll_mf_get_arch_float(&e->mf, "rope.freq_base_swa", &d) == 0 && d > 0) e->m.rope_swa.freq_base = (float)d;
    else if (A->rope_base_swa > 0) e->m.rope_swa.freq_base = A->rope_base_swa;
    if (A->rope_base_swa > 0) e->m.rope_swa.freq_scale = 1.0f, e->m.rope_swa.freq_factors = NULL; // llama.cpp: rope_freq_scale_train_swa = 1
  }
  e->m.embd_scale = (A->flags & LL_ARCH_EMBD_SCALE) ? sqrtf((float)e->m.C) : 1.0f;
  // Gemma 3 27B scales by C / H rather than the head width (llama.cpp's gemma3.cpp, from Google's config).
  e->m.attn_scale = 1.0f / sqrtf((float)(strcmp(arch, "gemma3") == 0 && e->m.L == 62 ? e->m.C / e->m.H : e->m.hd));
  if (ll_mf_get_arch_float(&e->mf, "final_logit_softcapping", &d) == 0 && d != 0)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "model: final_logit_softcapping (%g) is not supported yet", d);
  const struct ll_tensor_info *te = ll_mf_find_tensor(&e->mf, "token_embd.weight");
  if (!te) return ll_errf(err, errlen, LL_ENOTFOUND, "model: tensor 'token_embd.weight' is missing");
  e->m.n_vocab = (int)te->ne[1];
  return 0;
}

// A 3-D tensor of E stacked matrices (ne = {K, N, E}: the experts of a mixture-of-experts
// layer, as llama.cpp's converters write ffn_*_exps) as E weights, each a slice of its bytes.
static int experts3(struct ll_engine *e, const char *name, int64_t k, int64_t n, int E, struct ll_weight *w, char *err, size_t errlen) {
  const struct ll_tensor_info *t = ll_mf_find_tensor(&e->mf, name);
  if (!t) return ll_errf(err, errlen, LL_ENOTFOUND, "model: tensor '%s' is missing", name);
  if (t->n_dims != 3 || t->ne[0] != k || t->ne[1] != n || t->ne[2] != E)
    return ll_errf(err, errlen, LL_EFORMAT, "model: tensor '%s' has shape (%lld, %lld, %lld), expected (%lld, %lld, %d)", name, (long long)t->ne[0],
                   (long long)t->ne[1], (long long)t->ne[2], (long long)k, (long long)n, E);
  if (!ll_type_traits_get(t->type) || !ll_type_traits_get(t->type)->has_dequant)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "model: tensor '%s' has type %s, which has no kernels", name, ll_type_name(t->type));
  const size_t bytes = ll_row_size(t->type, k) * (size_t)n;
  for (int i = 0; i < E; i++) w[i] = (struct ll_weight){.type = t->type, .k = k, .n = n, .data = (const char *)t->data + bytes * (size_t)i};
  return 0;
}

// A mixture-of-experts layer's tensors: the router, the experts, qwen2moe's shared expert.
static int load_moe_layer(struct ll_engine *e, int l, char *err, size_t errlen) {
  struct ll_model *m = &e->m;
  const int E = m->n_expert;
  struct ll_moe_layer *y = &e->moe_layers[l];
  struct ll_weight *xw = e->experts + (size_t)l * 3 * E;
  y->gate = xw, y->up = xw + E, y->down = xw + 2 * E;
  m->layers[l].moe = y;
  char n[96];
  int rc;
#define N(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
  if ((rc = weight(e, N("ffn_gate_inp.weight"), m->C, E, &y->router, 0, err, errlen)) ||
      (rc = experts3(e, N("ffn_gate_exps.weight"), m->C, m->F_exp, E, y->gate, err, errlen)) ||
      (rc = experts3(e, N("ffn_up_exps.weight"), m->C, m->F_exp, E, y->up, err, errlen)) ||
      (rc = experts3(e, N("ffn_down_exps.weight"), m->F_exp, m->C, E, y->down, err, errlen)))
    return rc;
  if (m->F_sh > 0 && ((rc = weight(e, N("ffn_gate_shexp.weight"), m->C, m->F_sh, &y->sh_gate, 0, err, errlen)) ||
                      (rc = weight(e, N("ffn_up_shexp.weight"), m->C, m->F_sh, &y->sh_up, 0, err, errlen)) ||
                      (rc = weight(e, N("ffn_down_shexp.weight"), m->F_sh, m->C, &y->sh_down, 0, err, errlen)) ||
                      (rc = weight(e, N("ffn_gate_inp_shexp.weight"), m->C, 1, &y->sh_router, 0, err, errlen))))
    return rc;
#undef N
  return 0;
}

// A fused matrix's rows [r0, r0 + n) as a matrix of its own (rows are contiguous in every type).
static struct ll_weight rows_of(const struct ll_weight *w, int64_t r0, int64_t n) {
  struct ll_weight s = *w;
  s.data = (const char *)w->data + (size_t)r0 * ll_row_size(w->type, w->k);
  s.n = n;
  return s;
}

static int load_weights(struct ll_engine *e, char *err, size_t errlen) {
  int rc;
  const struct ll_arch *A = e->m.arch;
  const int C = e->m.C, qd = e->m.qd, kvd = e->m.kvd, hd = e->m.hd, F = e->m.F;
  e->m.layers = calloc((size_t)e->m.L, sizeof *e->m.layers);
  // dequantized 1-D tensors: per layer 4 norms of C, biases (qd + 2 kvd), q/k norms (at most qd + kvd: olmoe's whole rows); the output norm
  e->owned_f32 = malloc(((size_t)e->m.L * (4 * (size_t)C + 2 * (size_t)qd + 3 * (size_t)kvd) + C) * sizeof(float));
  if (e->m.n_expert > 0) {
    e->moe_layers = calloc((size_t)e->m.L, sizeof *e->moe_layers);
    e->experts = calloc((size_t)e->m.L * 3 * e->m.n_expert, sizeof *e->experts);
    if (!e->moe_layers || !e->experts) return ll_errf(err, errlen, LL_ENOMEM, "model: out of memory");
  }
  if (!e->m.layers || !e->owned_f32) return ll_errf(err, errlen, LL_ENOMEM, "model: out of memory");
  float *arena = e->owned_f32;
  if ((rc = weight(e, "token_embd.weight", C, e->m.n_vocab, &e->m.tok_embd, 0, err, errlen))) return rc;
  rc = weight(e, "output.weight", C, e->m.n_vocab, &e->m.output, 1, err, errlen);
  if (rc < 0) return rc;
  if (rc == 1) e->m.output = e->m.tok_embd, e->m.tied = 1; // tied embeddings
  if ((rc = vec(e, "output_norm.weight", C, &e->m.output_norm, &arena, 0, err, errlen))) return rc;
  char n[96];
  const int qkn = (A->flags & LL_ARCH_QK_NORM) != 0, qk_rows = (A->flags & LL_ARCH_QK_NORM_ROWS) != 0, post = (A->flags & LL_ARCH_POST_NORMS) != 0, bias = (A->flags & LL_ARCH_QKV_BIAS) != 0;
  int swa_every = A->swa_every;
  int64_t pat;
  if (ll_mf_get_arch_int(&e->mf, "attention.sliding_window_pattern", &pat) == 0 && pat >= 0 && pat <= e->m.L) swa_every = (int)pat;
  for (int l = 0; l < e->m.L; l++) {
    struct ll_layer *y = &e->m.layers[l];
#define W(suffix, K, N, dst) (snprintf(n, sizeof n, "blk.%d." suffix, l), weight(e, n, K, N, dst, 0, err, errlen))
#define V(suffix, N, dst, opt) (snprintf(n, sizeof n, "blk.%d." suffix, l), vec(e, n, N, dst, &arena, opt, err, errlen))
#define HAS(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), ll_mf_find_tensor(&e->mf, n) != NULL)
    if ((rc = V("attn_norm.weight", C, &y->attn_norm, 0)) || (rc = V("ffn_norm.weight", C, &y->ffn_norm, 0)) ||
        (rc = W("attn_output.weight", qd, C, &y->wo)))
      return rc;
    if ((A->flags & LL_ARCH_FUSED_QKV) && !HAS("attn_q.weight")) { // phi3: q, k, v rows of one matrix
      struct ll_weight qkv;
      if ((rc = W("attn_qkv.weight", C, (int64_t)qd + 2 * kvd, &qkv))) return rc;
      y->wq = rows_of(&qkv, 0, qd), y->wk = rows_of(&qkv, qd, kvd), y->wv = rows_of(&qkv, (int64_t)qd + kvd, kvd);
    } else if ((rc = W("attn_q.weight", C, qd, &y->wq)) || (rc = W("attn_k.weight", C, kvd, &y->wk)) || (rc = W("attn_v.weight", C, kvd, &y->wv))) {
      return rc;
    }
    if (e->m.n_expert > 0) { // a mixture of experts in place of the dense FFN (moe.c)
      if ((rc = load_moe_layer(e, l, err, errlen))) return rc;
    } else if ((A->flags & LL_ARCH_FUSED_UP) && !HAS("ffn_gate.weight")) { // phi3: gate, then up, in ffn_up
      struct ll_weight gu;
      if ((rc = W("ffn_up.weight", C, 2 * (int64_t)F, &gu))) return rc;
      y->gate = rows_of(&gu, 0, F), y->up = rows_of(&gu, F, F);
      if ((rc = W("ffn_down.weight", F, C, &y->down))) return rc;
    } else if ((rc = W("ffn_gate.weight", C, F, &y->gate)) || (rc = W("ffn_up.weight", C, F, &y->up)) || (rc = W("ffn_down.weight", F, C, &y->down))) {
      return rc;
    }
    if (bias && ((rc = V("attn_q.bias", qd, &y->bq, 1)) || (rc = V("attn_k.bias", kvd, &y->bk, 1)) || (rc = V("attn_v.bias", kvd, &y->bv, 1))))
      return rc;
    // q/k RMSNorm after the products: per head (qwen3, qwen3moe, gemma3) or over the whole row (olmoe)
    if (qkn && ((rc = V("attn_q_norm.weight", qk_rows ? qd : hd, &y->q_norm, 0)) || (rc = V("attn_k_norm.weight", qk_rows ? kvd : hd, &y->k_norm, 0))))
      return rc;
    if (post && ((rc = V("post_attention_norm.weight", C, &y->post_attn_norm, 0)) || (rc = V("post_ffw_norm.weight", C, &y->post_ffn_norm, 0))))
      return rc;
    // llama.cpp's set_swa_pattern(n): layer il is local unless il % n == n - 1 (n = 0 or 1: all local)
    y->swa = e->m.window > 0 && (swa_every <= 1 || l % swa_every < swa_every - 1);
#undef W
#undef V
#undef HAS
  }
  // A NaN or Inf weight poisons every output (and makes every training step skip for ever):
  // refused here, naming the tensor, rather than found out later. Every tensor of the file, once.
  for (uint64_t i = 0; i < e->mf.n_tensors; i++) {
    const struct ll_tensor_info *t = &e->mf.tensors[i];
    const int64_t at = ll_tensor_find_nonfinite(t->type, t->data, (size_t)t->nbytes);
    if (at >= 0)
      return ll_errf(err, errlen, LL_EFORMAT, "model: tensor '%s' (%s) holds a non-finite value (NaN or Inf) at element %lld%s", t->name.ptr,
                     ll_type_name(t->type), (long long)at, t->type == LL_TYPE_F32 || t->type == LL_TYPE_F16 || t->type == LL_TYPE_BF16 ? "" : " (a block scale)");
  }
  // Statistics for the start-up summary.
  int64_t bytes = 0, counts[LL_TYPE_COUNT] = {0};
  for (uint64_t i = 0; i < e->mf.n_tensors; i++) {
    const struct ll_tensor_info *t = &e->mf.tensors[i];
    bytes += (int64_t)t->nbytes;
    if (t->n_dims >= 2 && t->type < LL_TYPE_COUNT) counts[t->type] += (int64_t)t->nbytes;
  }
  int best = 0;
  for (int i = 0; i < LL_TYPE_COUNT; i++) best = counts[i] > counts[best] ? i : best;
  e->info.weight_bytes = bytes;
  // parameters: all, the experts', one token's (ll_moe.h)
  ll_moe_param_counts(&e->mf, &e->info.n_params, &e->info.n_params_expert, &e->info.n_params_active, &e->info.n_expert, &e->info.n_expert_used);
  snprintf(e->info.quant, sizeof e->info.quant, "%s", ll_type_name(best));
  return 0;
}

static int alloc_kv(struct ll_engine *e, const struct ll_engine_params *p, char *err, size_t errlen) {
  // auto: a llama2.c model gets run.c's f32 cache (greedy ids then match run.c token for
  // token); everything else llama.cpp's f16 default.
  int f16 = p->kv_f16 >= 0 ? p->kv_f16 != 0 : strcmp(e->mf.source_format, "llama2c") != 0;
  e->kv_type = f16 ? LL_TYPE_F16 : LL_TYPE_F32;
  e->n_seqs = p->n_parallel > 0 ? p->n_parallel : 1;
  e->max_blocks_per_seq = (e->n_ctx + LL_KV_BLOCK - 1) / LL_KV_BLOCK;
  e->n_blocks = p->kv_blocks > 0 ? p->kv_blocks : e->max_blocks_per_seq * e->n_seqs;
  const size_t block_bytes = (size_t)LL_KV_BLOCK * e->m.kvd * (e->kv_type == LL_TYPE_F16 ? 2 : 4);
  if ((double)block_bytes * e->n_blocks * 2 * e->m.L > 64.0 * (1ull << 30))
    return ll_errf(err, errlen, LL_ELIMIT, "engine: KV cache of %d blocks would exceed 64 GiB", e->n_blocks);
  e->k_pool = calloc((size_t)e->m.L, sizeof *e->k_pool);
  e->v_pool = calloc((size_t)e->m.L, sizeof *e->v_pool);
  e->free_list = malloc((size_t)e->n_blocks * sizeof *e->free_list);
  e->seqs = calloc((size_t)e->n_seqs, sizeof *e->seqs);
  if (!e->k_pool || !e->v_pool || !e->free_list || !e->seqs) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  for (int l = 0; l < e->m.L; l++) {
    e->k_pool[l] = calloc((size_t)e->n_blocks, block_bytes);
    e->v_pool[l] = calloc((size_t)e->n_blocks, block_bytes);
    if (!e->k_pool[l] || !e->v_pool[l]) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory for the KV cache");
  }
  for (int i = 0; i < e->n_blocks; i++) e->free_list[i] = e->n_blocks - 1 - i;
  e->n_free = e->n_blocks;
  for (int s = 0; s < e->n_seqs; s++)
    if (!(e->seqs[s].blocks = malloc((size_t)e->max_blocks_per_seq * sizeof(int32_t)))) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  e->info.kv_bytes = (int64_t)block_bytes * e->n_blocks * 2 * e->m.L;
  e->info.kv_blocks_total = e->n_blocks;
  e->info.kv_f16 = e->kv_type == LL_TYPE_F16;
  return 0;
}

// Activations live in the backend's buffers: on a device, device memory the forward pass
// computes in place, so a step uploads token ids and positions and reads back only the logits
// (ll_backend.h). On the CPU, plain host memory (not counted as the trainer's).
static struct ll_backend *buf_owner(const struct ll_engine *e) { return ll_backend_host_buffers(e->be) ? NULL : e->be; }
static float *abuf(const struct ll_engine *e, size_t n_floats) { return ll_backend_alloc(buf_owner(e), n_floats * sizeof(float)); }

static void free_scratch(struct ll_engine *e) {
  float **bufs[] = {&e->x, &e->xn, &e->q, &e->k, &e->v, &e->att, &e->tmp, &e->g, &e->u, &e->sel, &e->logits_buf, &e->lora_r, &e->lora_o};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    ll_backend_free_buf(buf_owner(e), *bufs[i]);
    *bufs[i] = NULL;
  }
  e->logits_cap = 0, e->lora_rank = 0;
}

static int alloc_scratch(struct ll_engine *e, char *err, size_t errlen) {
  e->max_batch = MAX_BATCH_DEFAULT > e->n_seqs ? MAX_BATCH_DEFAULT : e->n_seqs;
  const size_t B = (size_t)e->max_batch;
  float **bufs[] = {&e->x, &e->xn, &e->tmp, &e->sel, &e->q, &e->att}; // (B, C), then q and att (B, qd)
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!(*bufs[i] = abuf(e, B * (i < 4 ? e->m.C : e->m.qd)))) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory for activations");
  e->k = abuf(e, B * e->m.kvd);
  e->v = abuf(e, B * e->m.kvd);
  e->g = abuf(e, B * e->m.F);
  e->u = abuf(e, B * e->m.F);
  if (!e->k || !e->v || !e->g || !e->u) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory for activations");
  return 0;
}

static int alloc_index(struct ll_engine *e, char *err, size_t errlen) {
  const size_t B = (size_t)e->max_batch;
  e->pos = malloc(B * sizeof(int32_t));
  e->ids = malloc(B * sizeof(int32_t));
  e->amax = malloc(B * sizeof(int32_t));
  e->sdev = malloc(B * sizeof *e->sdev);
  e->kvv = malloc((size_t)e->n_seqs * sizeof *e->kvv); // a batch has each sequence at most once
  e->it0 = malloc((size_t)e->n_seqs * sizeof *e->it0);
  e->itn = malloc((size_t)e->n_seqs * sizeof *e->itn);
  e->tok_lora = malloc(B * sizeof *e->tok_lora);
  if (!e->pos || !e->ids || !e->amax || !e->sdev || !e->kvv || !e->it0 || !e->itn || !e->tok_lora) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  return 0;
}

void ll_engine_close(struct ll_engine *e) {
  if (!e) return;
  for (; e->dq_done < e->dq_steps; e->dq_done++) // queued reads still to land in dq_host
    e->be->i->read_wait(e->be, e->dq_ticket[e->dq_done % 2]);
  free_scratch(e);
  for (int i = 0; i < 2; i++) ll_backend_free_buf(buf_owner(e), e->dq_dev[i]), free(e->dq_host[i]);
  free(e->dq_seqs);
  ll_moe_ctx_free(e->moe); // its buffers are the backend's
  e->moe = NULL;
  ll_backend_free(e->be);
  ll_tokenizer_free(e->tok);
  for (int l = 0; e->k_pool && l < e->m.L; l++) free(e->k_pool[l]);
  for (int l = 0; e->v_pool && l < e->m.L; l++) free(e->v_pool[l]);
  free(e->k_pool);
  free(e->v_pool);
  for (int s = 0; e->seqs && s < e->n_seqs; s++) free(e->seqs[s].blocks);
  free(e->seqs);
  free(e->free_list);
  free(e->moe_layers);
  free(e->experts);
  free(e->m.layers);
  free(e->owned_f32);
  ll_cpu_stream_free(e->packed);
  free(e->pos), free(e->ids), free(e->amax), free(e->tok_lora), free(e->sdev), free(e->scand), free(e->srow);
  free(e->kvv), free(e->it0), free(e->itn);
  ll_modelfile_free(&e->mf);
  free(e);
}

int ll_model_each_matrix(struct ll_model *m, int (*fn)(struct ll_weight *w, void *arg), void *arg) {
  int rc = fn(&m->tok_embd, arg);
  if (rc == 0) rc = fn(&m->output, arg);
  for (int l = 0; rc == 0 && l < m->L; l++) {
    struct ll_layer *y = &m->layers[l];
    struct ll_weight *ws[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down};
    for (size_t i = 0; rc == 0 && i < sizeof ws / sizeof ws[0]; i++)
      if (ws[i]->data) rc = fn(ws[i], arg); // a mixture-of-experts layer has no dense FFN
    struct ll_moe_layer *x = y->moe;
    if (!x) continue;
    struct ll_weight *xs[] = {&x->router, &x->sh_gate, &x->sh_up, &x->sh_down, &x->sh_router};
    for (size_t i = 0; rc == 0 && i < sizeof xs / sizeof xs[0]; i++)
      if (xs[i]->data) rc = fn(xs[i], arg);
    for (int i = 0; rc == 0 && i < m->n_expert; i++) {
      rc = fn(&x->gate[i], arg);
      if (rc == 0) rc = fn(&x->up[i], arg);
      if (rc == 0) rc = fn(&x->down[i], arg);
    }
  }
  return rc;
}

static int upload_one(struct ll_weight *w, void *be) { return ((struct ll_backend *)be)->i->weight_upload(be, w); }
static int forget_dev(struct ll_weight *w, void *arg) {
  (void)arg;
  w->dev = NULL;
  return 0;
}

// Device backends keep the weights resident: upload every matrix once. A device that runs out
// of memory is given up for the CPU backend, with the reason saying so (never an error).
static int upload_weights(struct ll_engine *e, const struct ll_engine_params *p, char *err, size_t errlen) {
  struct ll_backend *be = e->be;
  struct ll_model *m = &e->m;
  int rc = ll_model_each_matrix(m, upload_one, be);
  if (rc == 0) rc = alloc_scratch(e, err, errlen);
  if (rc == 0) return 0;
  struct ll_backend_info bi;
  be->i->get_info(be, &bi);
  char why[320];
  snprintf(why, sizeof why, "cpu: %s could not hold the weights and activations (%s; %.0f MiB of %.0f MiB allocated)", bi.device, ll_strerror(rc),
           (double)bi.mem_used / (1 << 20), (double)bi.mem_total / (1 << 20));
  free_scratch(e);
  ll_backend_free(be); // releases its device copies
  e->be = NULL;
  ll_model_each_matrix(m, forget_dev, NULL);
  rc = ll_backend_cpu_create(&e->be, p->n_threads, err, errlen);
  if (rc == 0) snprintf(e->info.device_reason, sizeof e->info.device_reason, "%s", why);
  if (rc == 0) rc = alloc_scratch(e, err, errlen);
  return rc;
}

// On the CPU backend: the interleaved copies that decode reads as one stream (Q4_0, Q4_1,
// Q5_0, Q8_0 and the K-quants on x86 with AVX2; ll_cpu_weight_pack_into), all in one block of
// ll_cpu_stream_alloc (huge pages where the OS gives them). The token embeddings are only
// gathered from, and stay as they are (tied output: its own struct, packed as the head).
// Costs memory: the packed matrices' bytes again (info.packed_bytes).
struct pack_state {
  struct ll_engine *e;
  int64_t total, used; // bytes of the block (each copy 64-byte aligned), bytes given out
};
static int64_t pack_slot(int64_t bytes) { return (bytes + 63) / 64 * 64; }
static int size_one(struct ll_weight *w, void *arg) {
  struct pack_state *ps = arg;
  if (w != &ps->e->m.tok_embd && !w->packed) ps->total += pack_slot(ll_cpu_packed_bytes(w->type, w->k, w->n));
  return 0;
}
static int pack_one(struct ll_weight *w, void *arg) {
  struct pack_state *ps = arg;
  if (w == &ps->e->m.tok_embd) return 0;
  const int64_t rc = ll_cpu_weight_pack_into(w, (char *)ps->e->packed + ps->used, ps->total - ps->used);
  if (rc < 0) return (int)rc;
  ps->used += pack_slot(rc), ps->e->info.packed_bytes += rc;
  return 0;
}
// The copies only speed decode up: without the memory for all of them, none (the matrices
// are read as they are, at the old speed; info.packed_failed says so).
static int unpack_each(struct ll_weight *w, void *arg) {
  (void)arg;
  w->packed = NULL;
  return 0;
}
static void pack_weights(struct ll_engine *e) {
  struct pack_state ps = {e, 0, 0};
  ll_model_each_matrix(&e->m, size_one, &ps);
  if (ps.total == 0) return; // no type here has a packed form on this CPU
  e->packed = ll_cpu_stream_alloc((size_t)ps.total);
  if (e->packed && ll_model_each_matrix(&e->m, pack_one, &ps) == 0) return;
  ll_model_each_matrix(&e->m, unpack_each, NULL);
  ll_cpu_stream_free(e->packed);
  e->packed = NULL, e->info.packed_bytes = 0, e->info.packed_failed = 1;
}

int ll_engine_open(struct ll_engine **out, const struct ll_engine_params *p, char *err, size_t errlen) {
  *out = NULL;
  if (!p || !p->model_path) return ll_errf(err, errlen, LL_EINVAL, "engine: no model path");
  struct ll_engine *e = calloc(1, sizeof *e);
  if (!e) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  ll_modelfile_init(&e->mf);
  int rc = ll_model_open(p->model_path, &e->mf, err, errlen);
  if (rc == 0) rc = load_hparams(e, p, err, errlen);
  if (rc == 0) rc = load_weights(e, err, errlen);
  if (rc == 0) {
    char terr[256];
    int trc = ll_tokenizer_from_mf(&e->mf, &e->tok, terr, sizeof terr);
    if (trc != 0 && trc != LL_ENOTFOUND) rc = ll_errf(err, errlen, trc, "%s: %s", p->model_path, terr);
  }
  if (rc == 0) rc = alloc_kv(e, p, err, errlen);
  if (rc == 0) {
    struct ll_backend_params bp = {p->n_threads, p->device, p->cache_dir};
    rc = ll_backend_create(&e->be, &bp, e->info.device_reason, sizeof e->info.device_reason, err, errlen);
    // Weights, then activations, on the backend: a device that cannot hold them is given up.
    if (rc == 0) rc = e->be->i->weight_upload ? upload_weights(e, p, err, errlen) : alloc_scratch(e, err, errlen);
    if (rc == 0) rc = alloc_index(e, err, errlen);
    if (rc == 0 && e->m.n_expert > 0) rc = ll_moe_ctx_new(&e->moe, e->be, &e->m, e->max_batch, err, errlen);
    if (rc == 0 && p->repack && !e->be->i->weight_upload) pack_weights(e);
    // llama2.c checkpoints are compared with run.c (libm expf); everything else with llama.cpp.
    if (rc == 0) e->be->ggml_math = strcmp(e->mf.source_format, "llama2c") != 0;
    if (rc == 0) e->be->batch_invariant = p->batch_invariant;
  }
  if (rc) {
    ll_engine_close(e);
    return rc;
  }
  struct ll_backend_info bi;
  e->be->i->get_info(e->be, &bi);
  snprintf(e->info.backend, sizeof e->info.backend, "%s", bi.name);
  snprintf(e->info.device_name, sizeof e->info.device_name, "%s", bi.device);
  snprintf(e->info.device_vendor, sizeof e->info.device_vendor, "%s", bi.vendor);
  snprintf(e->info.device_driver, sizeof e->info.device_driver, "%s", bi.driver);
  snprintf(e->info.device_version, sizeof e->info.device_version, "%s", bi.version);
  e->info.device_fp16 = bi.fp16, e->info.device_subgroups = bi.subgroups;
  snprintf(e->info.device_dot, sizeof e->info.device_dot, "%s", bi.dot);
  e->info.device_mem_total = bi.mem_total, e->info.device_mem_used = bi.mem_used, e->info.device_max_alloc = bi.max_alloc;
  const char *name;
  snprintf(e->info.name, sizeof e->info.name, "%s", ll_mf_get_str(&e->mf, "general.name", &name) == 0 ? name : p->model_path);
  e->info.n_vocab = e->m.n_vocab, e->info.n_ctx = e->n_ctx, e->info.n_embd = e->m.C, e->info.n_layer = e->m.L;
  e->info.n_head = e->m.H, e->info.n_head_kv = e->m.Hkv, e->info.n_parallel = e->n_seqs, e->info.n_threads = bi.compute_units;
  *out = e;
  return 0;
}

void ll_engine_get_info(const struct ll_engine *e, struct ll_engine_info *info) {
  *info = e->info;
  if (strcmp(info->backend, "cpu") != 0) { // device memory as allocated now (the KV pool grows on use)
    struct ll_backend_info bi;
    e->be->i->get_info(e->be, &bi);
    info->device_mem_used = bi.mem_used;
  }
}
const struct ll_tokenizer *ll_engine_tokenizer(const struct ll_engine *e) { return e->tok; }
int ll_engine_n_vocab(const struct ll_engine *e) { return e->m.n_vocab; }
const struct ll_model *ll_engine_model(const struct ll_engine *e) { return &e->m; }
struct ll_backend *ll_engine_backend(const struct ll_engine *e) { return e->be; }

int ll_engine_use_weights(struct ll_engine *e, const struct ll_model *m) {
  if (m->n_vocab != e->m.n_vocab || m->C != e->m.C || m->L != e->m.L || m->H != e->m.H || m->Hkv != e->m.Hkv || m->F != e->m.F)
    return LL_EINVAL;
  e->m.tok_embd = m->tok_embd;
  e->m.output = m->output;
  e->m.output_norm = m->output_norm;
  for (int l = 0; l < e->m.L; l++) e->m.layers[l] = m->layers[l];
  return 0;
}
int ll_engine_kv_blocks_used(const struct ll_engine *e) { return e->n_blocks - e->n_free; }

// ---------------------------------------------------------------- sequences

int ll_engine_seq_new(struct ll_engine *e) {
  for (int s = 0; s < e->n_seqs; s++)
    if (!e->seqs[s].used) {
      e->seqs[s].used = 1;
      e->seqs[s].len = 0;
      e->seqs[s].n_blocks = 0;
      e->seqs[s].lora = NULL;
      e->seqs[s].has_smp = 0;
      return s;
    }
  return LL_EBUSY;
}

void ll_engine_seq_free(struct ll_engine *e, int s) {
  if (s < 0 || s >= e->n_seqs || !e->seqs[s].used) return;
  struct seq *q = &e->seqs[s];
  e->dq_last = 0; // the next queued step's ids come from the host
  for (int i = q->n_blocks - 1; i >= 0; i--) e->free_list[e->n_free++] = q->blocks[i];
  q->used = 0;
  q->len = 0;
  q->n_blocks = 0;
  q->lora = NULL;
  q->has_smp = 0;
}

int ll_engine_seq_len(const struct ll_engine *e, int s) { return s >= 0 && s < e->n_seqs && e->seqs[s].used ? e->seqs[s].len : LL_EINVAL; }

int ll_engine_seq_truncate(struct ll_engine *e, int s, int len) {
  if (s < 0 || s >= e->n_seqs || !e->seqs[s].used || len < 0 || len > e->seqs[s].len) return LL_EINVAL;
  struct seq *q = &e->seqs[s];
  q->len = len;
  const int keep = (len + LL_KV_BLOCK - 1) / LL_KV_BLOCK; // the positions past len are written again before any query reads them
  while (q->n_blocks > keep) e->free_list[e->n_free++] = q->blocks[--q->n_blocks];
  e->dq_last = 0;
  return 0;
}

void ll_engine_lora_dims(const struct ll_engine *e, struct ll_lora_dims *d) {
  memset(d, 0, sizeof *d);
  snprintf(d->arch, sizeof d->arch, "%s", e->info.arch);
  d->n_layer = e->m.L, d->n_embd = e->m.C, d->n_embd_q = e->m.qd, d->n_embd_kv = e->m.kvd, d->n_ff = e->m.F, d->n_head = e->m.H, d->n_head_kv = e->m.Hkv;
  d->n_expert = e->m.n_expert, d->n_ff_exp = e->m.F_exp, d->n_ff_sh = e->m.F_sh;
}

int ll_engine_seq_set_sample(struct ll_engine *e, int s, const struct ll_sample_dev *d) {
  if (s < 0 || s >= e->n_seqs || !e->seqs[s].used) return LL_EINVAL;
  e->seqs[s].has_smp = d != NULL;
  if (d) e->seqs[s].smp = *d;
  return 0;
}

int ll_engine_seq_set_adapter(struct ll_engine *e, int s, const struct ll_lora *a, char *err, size_t errlen) {
  if (s < 0 || s >= e->n_seqs || !e->seqs[s].used) return ll_errf(err, errlen, LL_EINVAL, "engine: bad sequence %d", s);
  if (a) {
    struct ll_lora_dims d;
    ll_engine_lora_dims(e, &d);
    int rc = ll_lora_check_shapes(a, &d, err, errlen);
    if (rc) return rc;
    if (a->rank > e->lora_rank) { // scratch grows to the largest rank seen
      size_t wide = (size_t)(e->m.C > e->m.F ? e->m.C : e->m.F);
      wide = wide > (size_t)e->m.qd ? wide : (size_t)e->m.qd;
      float *r = abuf(e, (size_t)e->max_batch * (size_t)a->rank);
      float *o = e->lora_o ? e->lora_o : abuf(e, (size_t)e->max_batch * wide);
      if (!r || !o) {
        ll_backend_free_buf(buf_owner(e), r);
        if (o != e->lora_o) ll_backend_free_buf(buf_owner(e), o);
        return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory for adapter scratch");
      }
      ll_backend_free_buf(buf_owner(e), e->lora_r);
      e->lora_r = r, e->lora_o = o, e->lora_rank = a->rank;
    }
  }
  e->seqs[s].lora = a;
  return 0;
}

// ---------------------------------------------------------------- forward

static int fail_bk(int rc, char *err, size_t errlen, const char *op) { return ll_errf(err, errlen, rc, "engine: backend %s failed: %s", op, ll_strerror(rc)); }
#define BK(call, op) do { int rc_ = (call); if (rc_) return fail_bk(rc_, err, errlen, op); } while (0)

// Adapters, per sequence: y (rows of item i, out) += scale · B·(A·x) for the items whose
// sequence has an adapter covering (layer l, target t); x (T, in). Backend calls only:
// two products on that item's rows, then an axpy (ggml's order: B·(A·x), scaled, added).
static int lora_apply(struct ll_engine *e, const struct ll_batch_item *items, int n_items, int l, int t, const float *x, int64_t in,
                      float *y, int64_t out, char *err, size_t errlen) {
  const struct ll_backend_i *B = e->be->i;
  for (int i = 0, t0 = 0; i < n_items; t0 += items[i].n_tokens, i++) {
    const struct ll_lora *a = e->seqs[items[i].seq].lora;
    if (!a) continue;
    const struct ll_lora_pair *p = ll_lora_at(a, l, t);
    if (!p->a.data) continue;
    const int n = items[i].n_tokens;
    // The factors are small: always the batch-invariant kernels (which for F32 weights of GGUF
    // models follow llama.cpp's summation orders), never the sgemm path of large batches.
    const int bi = e->be->batch_invariant;
    e->be->batch_invariant = 1;
    int rc = B->matmul(e->be, e->lora_r, x + (size_t)t0 * in, &p->a, n, 0); // (n, r)
    if (rc == 0) rc = B->matmul(e->be, e->lora_o, e->lora_r, &p->b, n, 0); // (n, out)
    e->be->batch_invariant = bi;
    if (rc) return fail_bk(rc, err, errlen, "matmul lora");
    float *dst = y + (size_t)t0 * out;
    const float sc = ll_lora_scale(a);
    if (B->axpy) {
      BK(B->axpy(e->be, dst, e->lora_o, sc, (int64_t)n * out), "axpy");
    } else { // backends without the training members (the CPU backend's reference, inline)
      for (int64_t j = 0; j < (int64_t)n * out; j++) dst[j] += sc * e->lora_o[j];
    }
  }
  return 0;
}
#define LORA(t, x, in, y, out) do { int rc_ = lora_apply(e, items, n_items, l, t, x, in, y, out, err, errlen); if (rc_) return rc_; } while (0)

// One forward step. dev_in (a backend buffer, or NULL): the items' token ids (one per item) as
// the previous queued step chose them, read on the device instead of items' tokens. dev_out (a
// backend buffer, or NULL): where each item's choice goes (one logits row per item), left on
// the device (ll_engine_decode_queue reads it back one step behind).
static int decode_step(struct ll_engine *e, struct ll_batch_item *items, int n_items, const int32_t *dev_in, int32_t *dev_out, char *err,
                       size_t errlen) {
  const struct ll_backend_i *B = e->be->i;
  struct ll_backend *be = e->be;
  int T = 0, rows = 0;
  // Validate everything before touching any state.
  for (int i = 0; i < n_items; i++) {
    struct ll_batch_item *it = &items[i];
    if (it->seq < 0 || it->seq >= e->n_seqs || !e->seqs[it->seq].used) return ll_errf(err, errlen, LL_EINVAL, "engine: item %d: bad sequence %d", i, it->seq);
    for (int j = 0; j < i; j++)
      if (items[j].seq == it->seq) return ll_errf(err, errlen, LL_EINVAL, "engine: sequence %d appears twice in one batch", it->seq);
    if (it->n_tokens <= 0 || (!it->tokens && !dev_in)) return ll_errf(err, errlen, LL_EINVAL, "engine: item %d has no tokens", i);
    if (e->seqs[it->seq].len + it->n_tokens > e->n_ctx)
      return ll_errf(err, errlen, LL_ELIMIT, "engine: sequence %d would reach %d positions (context %d)", it->seq, e->seqs[it->seq].len + it->n_tokens, e->n_ctx);
    for (int t = 0; !dev_in && t < it->n_tokens; t++)
      if (it->tokens[t] < 0 || it->tokens[t] >= e->m.n_vocab) return ll_errf(err, errlen, LL_EINVAL, "engine: token id %d out of range (vocabulary %d)", it->tokens[t], e->m.n_vocab);
    T += it->n_tokens;
    rows += it->logits_mode == 2 ? it->n_tokens : it->logits_mode == 1 ? 1 : 0;
  }
  if (T > e->max_batch) return ll_errf(err, errlen, LL_ELIMIT, "engine: batch of %d tokens exceeds the maximum %d", T, e->max_batch);
  // Reserve KV blocks (all or nothing).
  int need = 0;
  for (int i = 0; i < n_items; i++) {
    const struct seq *q = &e->seqs[items[i].seq];
    need += (q->len + items[i].n_tokens + LL_KV_BLOCK - 1) / LL_KV_BLOCK - q->n_blocks;
  }
  if (need > e->n_free) return ll_errf(err, errlen, LL_ELIMIT, "engine: KV cache full (%d blocks needed, %d free)", need, e->n_free);
  for (int i = 0; i < n_items; i++) {
    struct seq *q = &e->seqs[items[i].seq];
    while (q->n_blocks * LL_KV_BLOCK < q->len + items[i].n_tokens) q->blocks[q->n_blocks++] = e->free_list[--e->n_free];
  }
  // Token ids and positions of the whole batch.
  for (int i = 0, t = 0; i < n_items; i++)
    for (int j = 0; j < items[i].n_tokens; j++, t++) {
      e->ids[t] = dev_in ? 0 : items[i].tokens[j];
      e->pos[t] = e->seqs[items[i].seq].len + j;
    }
  const struct ll_model *m = &e->m;
  const int C = m->C, qd = m->qd, kvd = m->kvd, hd = m->hd, F = m->F;
  const int prescale = (m->arch->flags & LL_ARCH_Q_PRESCALE) != 0, silu = m->arch->act == LL_ACT_SILU;
  const float scale = prescale ? 1.0f : m->attn_scale; // attention's own scale (1 where q was scaled first)
  int any_lora = 0;
  for (int i = 0, t = 0; i < n_items; i++) {
    any_lora |= e->seqs[items[i].seq].lora != NULL;
    for (int j = 0; j < items[i].n_tokens; j++) e->tok_lora[t++] = e->seqs[items[i].seq].lora; // the experts' adapters, per row
  }
  // A device's fast tier fuses the step's ops (ll_backend.h, fused decode ops): each fused call
  // answers LL_EUNSUPPORTED for what it does not cover, and the ops below do it instead.
  // Adapters read the normed input and add to the products: with one, nothing is fused.
  const int fuse = !any_lora && B->fused_matmul;
#define FUSED(call) (fuse ? (call) : LL_EUNSUPPORTED)
  BK(B->get_rows(be, e->x, &m->tok_embd, dev_in ? dev_in : e->ids, T), "get_rows"); // x (T, C)
  if (m->embd_scale != 1.0f) { // Gemma: x *= sqrt(C)
    if (!B->scale) return ll_errf(err, errlen, LL_EUNSUPPORTED, "engine: the %s backend has no scale op (%s needs it)", e->info.backend, m->arch->name);
    BK(B->scale(be, e->x, m->embd_scale, (int64_t)T * C), "scale");
  }
  for (int l = 0; l < m->L; l++) {
    const struct ll_layer *y = &m->layers[l];
    const struct ll_rope_params *rope = y->swa ? &m->rope_swa : &m->rope;
    { // q (T, qd), k (T, kvd), v (T, kvd): one product of xn = rmsnorm(x) by three matrices
      const struct ll_weight *const w3[3] = {&y->wq, &y->wk, &y->wv};
      float *const o3[3] = {e->q, e->k, e->v};
      int rc = FUSED(B->fused_matmul(be, 3, o3, e->x, y->attn_norm, m->eps, w3, T, LL_FUSE_SET));
      if (rc == LL_EUNSUPPORTED) {
        BK(B->rmsnorm(be, e->xn, e->x, y->attn_norm, T, C, m->eps), "rmsnorm"); // xn (T, C)
        rc = ll_backend_matmul_n(be, 3, o3, e->xn, w3, T);
      }
      BK(rc, "matmul q, k, v");
    }
    if (any_lora) { // adapters before biases, as llama.cpp's build_lora_mm
      LORA(LL_LORA_Q, e->xn, C, e->q, qd);
      LORA(LL_LORA_K, e->xn, C, e->k, kvd);
      LORA(LL_LORA_V, e->xn, C, e->v, kvd);
    }
    for (int t = 0; y->bq && t < T; t++) B->add(be, e->q + (size_t)t * qd, e->q + (size_t)t * qd, y->bq, qd);
    for (int t = 0; y->bk && t < T; t++) B->add(be, e->k + (size_t)t * kvd, e->k + (size_t)t * kvd, y->bk, kvd);
    for (int t = 0; y->bv && t < T; t++) B->add(be, e->v + (size_t)t * kvd, e->v + (size_t)t * kvd, y->bv, kvd);
    if (y->q_norm) { // q/k RMSNorm before RoPE: each head (rows of hd: Qwen3, Gemma 3), or olmoe's whole rows
      const int whole = (m->arch->flags & LL_ARCH_QK_NORM_ROWS) != 0;
      BK(B->rmsnorm(be, e->q, e->q, y->q_norm, whole ? T : T * m->H, whole ? qd : hd, m->eps), "rmsnorm q");
      BK(B->rmsnorm(be, e->k, e->k, y->k_norm, whole ? T : T * m->Hkv, whole ? kvd : hd, m->eps), "rmsnorm k");
    }
    for (int i = 0, t0 = 0; i < n_items; t0 += items[i].n_tokens, i++) {
      e->kvv[i] = (struct ll_kv_view){e->kv_type, LL_KV_BLOCK, m->Hkv, hd, e->k_pool[l], e->v_pool[l], e->seqs[items[i].seq].blocks, y->swa ? m->window : 0};
      e->it0[i] = t0, e->itn[i] = items[i].n_tokens;
    }
    int rc_rk = fuse && B->rope_kv_store ? B->rope_kv_store(be, e->q, e->k, e->v, e->kvv, e->pos, e->it0, e->itn, n_items, m->H, rope)
                                         : LL_EUNSUPPORTED;
    if (rc_rk == LL_EUNSUPPORTED) {
      BK(B->rope(be, e->q, e->pos, T, m->H, hd, rope), "rope q");
      BK(B->rope(be, e->k, e->pos, T, m->Hkv, hd, rope), "rope k");
      for (int i = 0; i < n_items; i++)
        BK(B->kv_store(be, &e->kvv[i], e->k + (size_t)e->it0[i] * kvd, e->v + (size_t)e->it0[i] * kvd, e->pos + e->it0[i], e->itn[i]), "kv_store");
      rc_rk = 0;
    }
    BK(rc_rk, "rope, kv_store");
    if (prescale) { // Gemma 3, Phi-3: q *= the attention scale, then attention scales by 1 (llama.cpp's order)
      if (!B->scale) return ll_errf(err, errlen, LL_EUNSUPPORTED, "engine: the %s backend has no scale op (%s needs it)", e->info.backend, m->arch->name);
      BK(B->scale(be, e->q, m->attn_scale, (int64_t)T * qd), "scale q");
    }
    if (B->attention_multi) { // all sequences in one dispatch: att (T, qd)
      BK(B->attention_multi(be, e->att, e->q, e->kvv, e->pos, e->it0, e->itn, n_items, m->H, scale), "attention");
    } else {
      for (int i = 0; i < n_items; i++)
        BK(B->attention(be, e->att + (size_t)e->it0[i] * qd, e->q + (size_t)e->it0[i] * qd, &e->kvv[i], e->pos + e->it0[i], e->itn[i], m->H, scale),
           "attention"); // att (n, qd)
    }
    if (!any_lora && !y->post_attn_norm) {
      BK(B->matmul(be, e->x, e->att, &y->wo, T, 1), "matmul o"); // x += att · Woᵀ
    } else { // x += (att · Woᵀ + scale · B·(A·att)): llama.cpp's association, bit for bit; post-normed (Gemma 3)
      BK(B->matmul(be, e->tmp, e->att, &y->wo, T, 0), "matmul o");
      if (any_lora) LORA(LL_LORA_O, e->att, qd, e->tmp, C);
      if (y->post_attn_norm) BK(B->rmsnorm(be, e->tmp, e->tmp, y->post_attn_norm, T, C, m->eps), "rmsnorm post-attention");
      BK(B->add(be, e->x, e->x, e->tmp, (int64_t)T * C), "add");
    }
    if (y->moe) { // x += the routed experts' outputs (moe.c)
      BK(B->rmsnorm(be, e->xn, e->x, y->ffn_norm, T, C, m->eps), "rmsnorm");
      const struct ll_moe_lora lo = {e->tok_lora, NULL, l, NULL, NULL, NULL, 0, 0};
      int rc = ll_moe_forward(e->moe, y->moe, any_lora ? &lo : NULL, -1, e->x, e->xn, T, err, errlen);
      if (rc) return rc;
      continue;
    }
    { // g (T, F) = act(xn · Wgateᵀ) * (xn · Wupᵀ), xn = rmsnorm(x); act silu (SwiGLU) or gelu (GeGLU)
      const struct ll_weight *const w2[2] = {&y->gate, &y->up};
      float *const o2[2] = {e->g, e->u};
      int rc = silu ? FUSED(B->fused_matmul(be, 2, o2, e->x, y->ffn_norm, m->eps, w2, T, LL_FUSE_SWIGLU)) : LL_EUNSUPPORTED;
      if (rc == LL_EUNSUPPORTED) {
        BK(B->rmsnorm(be, e->xn, e->x, y->ffn_norm, T, C, m->eps), "rmsnorm");
        BK(ll_backend_matmul_n(be, 2, o2, e->xn, w2, T), "matmul gate, up"); // g, u (T, F)
        if (any_lora) {
          LORA(LL_LORA_GATE, e->xn, C, e->g, F);
          LORA(LL_LORA_UP, e->xn, C, e->u, F);
        }
        if (silu) rc = B->swiglu(be, e->g, e->g, e->u, (int64_t)T * F);
        else rc = B->geglu ? B->geglu(be, e->g, e->g, e->u, (int64_t)T * F) : LL_EUNSUPPORTED;
      }
      BK(rc, silu ? "gate, up, swiglu" : "gate, up, geglu");
    }
    if (!any_lora && !y->post_ffn_norm) {
      BK(B->matmul(be, e->x, e->g, &y->down, T, 1), "matmul down"); // x += g · Wdownᵀ
    } else {
      BK(B->matmul(be, e->tmp, e->g, &y->down, T, 0), "matmul down");
      if (any_lora) LORA(LL_LORA_DOWN, e->g, F, e->tmp, C);
      if (y->post_ffn_norm) BK(B->rmsnorm(be, e->tmp, e->tmp, y->post_ffn_norm, T, C, m->eps), "rmsnorm post-ffn");
      BK(B->add(be, e->x, e->x, e->tmp, (int64_t)T * C), "add");
    }
  }
  for (int i = 0; i < n_items; i++) e->seqs[items[i].seq].len += items[i].n_tokens;
  if (rows == 0) return 0;
  // Final norm and output head only for the rows whose logits are wanted: when that is every
  // row (decode), x itself, without a copy, where the norm is fused into the product.
  int r = 0, gather = rows != T || !fuse;
  float *sel = gather ? e->sel : e->x;
  for (int i = 0, t0 = 0; gather && i < n_items; t0 += items[i].n_tokens, i++) {
    const int n = items[i].n_tokens;
    const int first = items[i].logits_mode == 2 ? t0 : t0 + n - 1, cnt = items[i].logits_mode == 2 ? n : items[i].logits_mode == 1 ? 1 : 0;
    if (cnt) BK(ll_backend_copy(be, e->sel + (size_t)r * C, e->x + (size_t)first * C, (size_t)cnt * C * sizeof(float)), "copy");
    r += cnt;
  }
  const size_t need_bytes = (size_t)rows * e->m.n_vocab * sizeof(float);
  if (need_bytes > e->logits_cap) { // grows only for a larger batch of logits rows than ever before
    float *nb = abuf(e, need_bytes / sizeof(float));
    if (!nb) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory for %d rows of logits", rows);
    ll_backend_free_buf(buf_owner(e), e->logits_buf);
    e->logits_buf = nb;
    e->logits_cap = need_bytes;
  }
  { // logits (rows, V) = rmsnorm(sel) · Woutᵀ
    float *const o1[1] = {e->logits_buf};
    const struct ll_weight *const w1[1] = {&e->m.output};
    int rc = FUSED(B->fused_matmul(be, 1, o1, sel, e->m.output_norm, e->m.eps, w1, rows, LL_FUSE_SET));
    if (rc == LL_EUNSUPPORTED) {
      if (!gather) BK(ll_backend_copy(be, e->sel, e->x, (size_t)rows * C * sizeof(float)), "copy");
      BK(B->rmsnorm(be, e->sel, e->sel, e->m.output_norm, rows, C, e->m.eps), "rmsnorm");
      rc = B->matmul(be, e->logits_buf, e->sel, &e->m.output, rows, 0);
    }
    BK(rc, "matmul output");
  }
#undef FUSED
  // Greedy items: the argmax of their last row; sampled items (ll_engine_seq_set_sample): the
  // sampler's choice. On the device where it has the member (only the ids come back), else from
  // the logits on the host.
  int any_amax = 0, any_smp = 0;
  for (int i = 0; i < n_items; i++) {
    any_amax |= items[i].argmax != NULL && items[i].logits_mode != 0;
    any_smp |= items[i].argmax != NULL && e->seqs[items[i].seq].has_smp && items[i].logits_mode != 0;
  }
  if (any_smp && B->sample) {
    for (int i = 0, rr = 0; i < n_items; i++) {
      const int nr = items[i].logits_mode == 2 ? items[i].n_tokens : items[i].logits_mode == 1 ? 1 : 0;
      for (int j = 0; j < nr; j++) e->sdev[rr + j] = (struct ll_sample_dev){0};
      if (nr && items[i].argmax && e->seqs[items[i].seq].has_smp) e->sdev[rr + nr - 1] = e->seqs[items[i].seq].smp;
      rr += nr;
    }
    BK(B->sample(be, dev_out ? dev_out : e->amax, e->logits_buf, rows, e->m.n_vocab, e->sdev), "sample");
  } else if (any_amax && B->argmax) {
    BK(B->argmax(be, dev_out ? dev_out : e->amax, e->logits_buf, rows, e->m.n_vocab), "argmax");
  }
  if (dev_out) { // the ids stay on the device (ll_engine_decode_queue): each sampling step is spent
    for (int i = 0; i < n_items; i++) e->seqs[items[i].seq].has_smp = 0;
    return 0;
  }
  r = 0;
  for (int i = 0; i < n_items; i++) {
    const int nr = items[i].logits_mode == 2 ? items[i].n_tokens : items[i].logits_mode == 1 ? 1 : 0;
    const int V = e->m.n_vocab;
    if (nr && items[i].logits) // the step's one read back (a device backend's queue drains here)
      BK(ll_backend_copy(be, items[i].logits, e->logits_buf + (size_t)r * V, (size_t)nr * V * sizeof(float)), "copy");
    if (nr && items[i].argmax) {
      const struct ll_sample_dev *smp = e->seqs[items[i].seq].has_smp ? &e->seqs[items[i].seq].smp : NULL;
      e->seqs[items[i].seq].has_smp = 0; // one step
      if (smp ? B->sample != NULL : B->argmax != NULL) {
        *items[i].argmax = e->amax[r + nr - 1];
      } else { // the CPU sampler's rules, on the host
        float *lr = ll_backend_host_buffers(be) ? e->logits_buf + (size_t)(r + nr - 1) * V
                          : items[i].logits         ? items[i].logits + (size_t)(nr - 1) * V
                                                    : NULL;
        if (!lr) { // a device without the member: the row comes back
          if (!e->srow && !(e->srow = malloc((size_t)V * sizeof *e->srow))) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
          BK(ll_backend_copy(be, e->srow, e->logits_buf + (size_t)(r + nr - 1) * V, (size_t)V * sizeof(float)), "copy");
          lr = e->srow;
        }
        if (smp) {
          if (!e->scand && !(e->scand = malloc((size_t)V * sizeof *e->scand))) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
          *items[i].argmax = ll_sample_dev_choose(smp, e->scand, lr, V);
        } else { // greedy: the lowest id of the largest logit
          int32_t best = 0;
          for (int v = 1; v < V; v++)
            if (lr[v] > lr[best]) best = v;
          *items[i].argmax = best;
        }
      }
    }
    r += nr;
  }
  return 0;
}

int ll_engine_decode(struct ll_engine *e, struct ll_batch_item *items, int n_items, char *err, size_t errlen) {
  e->dq_last = 0; // a queued step after this one takes its ids from the host
  return decode_step(e, items, n_items, NULL, NULL, err, errlen);
}

// ---------------------------------------------------------------- decode steps queued ahead

int ll_engine_queue_ok(const struct ll_engine *e) {
  const struct ll_backend_i *B = e->be->i;
  if (!B->read_async || !B->read_wait || !B->argmax || ll_backend_host_buffers(e->be) || e->m.n_expert > 0) return 0;
  if (e->m.output.n > e->m.tok_embd.n) return 0; // a chosen id must name an embedding row
  struct ll_backend_info bi;
  B->get_info(e->be, &bi);
  return bi.queue_ahead != 0;
}

int ll_engine_decode_queue(struct ll_engine *e, const int *seqs, const int32_t *tokens, int n, char *err, size_t errlen) {
  const struct ll_backend_i *B = e->be->i;
  if (!ll_engine_queue_ok(e)) return ll_errf(err, errlen, LL_EUNSUPPORTED, "engine: this backend decodes step by step");
  if (n < 1 || n > e->n_seqs || !seqs) return ll_errf(err, errlen, LL_EINVAL, "engine: a queued step of %d sequences", n);
  if (e->dq_steps - e->dq_done >= 2) return ll_errf(err, errlen, LL_EBUSY, "engine: two queued steps not collected");
  for (int i = 0; i < n; i++) {
    if (seqs[i] < 0 || seqs[i] >= e->n_seqs || !e->seqs[seqs[i]].used) return ll_errf(err, errlen, LL_EINVAL, "engine: bad sequence %d", seqs[i]);
    if (e->seqs[seqs[i]].has_smp && !B->sample) return ll_errf(err, errlen, LL_EUNSUPPORTED, "engine: this backend samples on the host");
  }
  if (!tokens) { // the ids the previous queued step chose: the same sequences, in the same order
    int same = e->dq_last == n && e->dq_steps > 0;
    for (int i = 0; same && i < n; i++) same = e->dq_seqs[i] == seqs[i];
    if (!same) return ll_errf(err, errlen, LL_EINVAL, "engine: a step taking the previous step's ids must follow a queued step of the same sequences");
  }
  if (!e->dq_seqs && !(e->dq_seqs = malloc((size_t)e->n_seqs * sizeof *e->dq_seqs)))
    return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  for (int i = 0; i < 2; i++) {
    if (!e->dq_dev[i] && !(e->dq_dev[i] = ll_backend_alloc(e->be, (size_t)e->n_seqs * sizeof(int32_t))))
      return ll_errf(err, errlen, LL_ENOMEM, "engine: out of device memory for queued ids");
    if (!e->dq_host[i] && !(e->dq_host[i] = malloc((size_t)e->n_seqs * sizeof(int32_t)))) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  }
  struct ll_batch_item *items = malloc((size_t)n * sizeof *items);
  if (!items) return ll_errf(err, errlen, LL_ENOMEM, "engine: out of memory");
  int32_t dummy = 0;
  for (int i = 0; i < n; i++) items[i] = (struct ll_batch_item){seqs[i], 1, tokens ? tokens + i : NULL, 1, NULL, &dummy};
  const int slot = (int)(e->dq_steps % 2);
  int rc = decode_step(e, items, n, tokens ? NULL : e->dq_dev[1 - slot], e->dq_dev[slot], err, errlen);
  free(items);
  if (rc) {
    e->dq_last = 0;
    return rc;
  }
  const int t = B->read_async(e->be, e->dq_host[slot], e->dq_dev[slot], (size_t)n * sizeof(int32_t));
  if (t < 0) {
    e->dq_last = 0;
    return ll_errf(err, errlen, t, "engine: backend read_async failed: %s", ll_strerror(t));
  }
  e->dq_ticket[slot] = t, e->dq_n[slot] = n;
  memcpy(e->dq_seqs, seqs, (size_t)n * sizeof *seqs);
  e->dq_last = n;
  e->dq_steps++;
  return 0;
}

int ll_engine_decode_collect(struct ll_engine *e, int32_t *ids, int cap, char *err, size_t errlen) {
  if (e->dq_done == e->dq_steps) return ll_errf(err, errlen, LL_EINVAL, "engine: no queued step to collect");
  const int slot = (int)(e->dq_done % 2), n = e->dq_n[slot];
  if (cap < n) return ll_errf(err, errlen, LL_EINVAL, "engine: %d ids do not fit %d", n, cap);
  int rc = e->be->i->read_wait(e->be, e->dq_ticket[slot]);
  e->dq_done++;
  if (rc) return ll_errf(err, errlen, rc, "engine: backend read_wait failed: %s", ll_strerror(rc));
  memcpy(ids, e->dq_host[slot], (size_t)n * sizeof *ids);
  return n;
}

int ll_engine_decode_pending(const struct ll_engine *e) { return (int)(e->dq_steps - e->dq_done); }
