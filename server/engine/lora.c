// lora.c - LoRA adapters in memory (ll_lora.h): creation with PEFT's initialisation, release,
// and the checks an adapter passes before the engine applies it to a base model.
#include "ll_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_arch.h"
#include "ll_error.h"
#include "ll_quant.h"

static const char *const target_names[LL_LORA_N_SLOTS] = {"q",         "k",       "v",          "o",          "gate",       "up",         "down",
                                                          "gate_exps", "up_exps", "down_exps", "gate_shexp", "up_shexp", "down_shexp"};
static const char *const target_tensors[LL_LORA_N_SLOTS] = {"attn_q",        "attn_k",         "attn_v",       "attn_output",
                                                            "ffn_gate",      "ffn_up",         "ffn_down",     "ffn_gate_exps",
                                                            "ffn_up_exps",   "ffn_down_exps",  "ffn_gate_shexp", "ffn_up_shexp",
                                                            "ffn_down_shexp"};
static const char *const target_peft[LL_LORA_N_TARGETS] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

const char *ll_lora_target_name(int t) { return t >= 0 && t < LL_LORA_N_SLOTS ? target_names[t] : "?"; }
const char *ll_lora_target_tensor(int t) { return t >= 0 && t < LL_LORA_N_SLOTS ? target_tensors[t] : "?"; }
const char *ll_lora_target_peft(int t) { return t >= 0 && t < LL_LORA_N_TARGETS ? target_peft[t] : "?"; }

int ll_lora_target_from_name(const char *s) {
  for (int t = 0; t < LL_LORA_N_SLOTS; t++)
    if (strcmp(s, target_names[t]) == 0 || strcmp(s, target_tensors[t]) == 0 || (t < LL_LORA_N_TARGETS && strcmp(s, target_peft[t]) == 0)) return t;
  return -1;
}

unsigned ll_lora_fused(const char *arch) {
  const struct ll_arch *a = ll_arch_find(arch);
  if (!a) return 0;
  return ((a->flags & LL_ARCH_FUSED_QKV) ? LL_LORA_GROUP_QKV : 0) | ((a->flags & LL_ARCH_FUSED_UP) ? LL_LORA_GROUP_GU : 0);
}

int ll_lora_group_lead(const struct ll_lora *a, unsigned fused, int layer, int t) {
  const unsigned g = (fused & LL_LORA_GROUP_QKV & (1u << t)) ? LL_LORA_GROUP_QKV : (fused & LL_LORA_GROUP_GU & (1u << t)) ? LL_LORA_GROUP_GU : 0;
  for (int u = 0; u < t; u++)
    if (((g >> u) & 1) && ll_lora_at(a, layer, u)->a.data) return u;
  return t;
}

void ll_lora_target_dims(const struct ll_lora_dims *d, int t, int64_t *in, int64_t *out) {
  const int qd = d->n_embd_q > 0 ? d->n_embd_q : d->n_embd;
  switch (t) {
  case LL_LORA_Q: *in = d->n_embd, *out = qd; break;
  case LL_LORA_K:
  case LL_LORA_V: *in = d->n_embd, *out = d->n_embd_kv; break;
  case LL_LORA_O: *in = qd, *out = d->n_embd; break;
  case LL_LORA_GATE:
  case LL_LORA_UP: *in = d->n_embd, *out = d->n_ff; break;
  case LL_LORA_GATE_EXPS:
  case LL_LORA_UP_EXPS: *in = d->n_embd, *out = d->n_ff_exp; break;
  case LL_LORA_DOWN_EXPS: *in = d->n_ff_exp, *out = d->n_embd; break;
  case LL_LORA_GATE_SHEXP:
  case LL_LORA_UP_SHEXP: *in = d->n_embd, *out = d->n_ff_sh; break;
  case LL_LORA_DOWN_SHEXP: *in = d->n_ff_sh, *out = d->n_embd; break;
  default: *in = d->n_ff, *out = d->n_embd; break; // down
  }
}

void ll_lora_expert(const struct ll_lora *a, const struct ll_lora_pair *p, int e, struct ll_weight *A, struct ll_weight *B) {
  const int64_t r = a->rank, out = p->b.n / (a->n_expert > 0 ? a->n_expert : 1);
  *A = (struct ll_weight){LL_TYPE_F32, p->a.k, r, (const float *)p->a.data + (size_t)e * r * p->a.k, NULL, NULL};
  *B = (struct ll_weight){LL_TYPE_F32, r, out, (const float *)p->b.data + (size_t)e * out * r, NULL, NULL};
}

// Counter-based generator (splitmix64 of seed and index): value i of a (layer, target) matrix
// does not depend on which other targets exist, so an adapter's A for q is the same whether or
// not v is adapted too.
static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
float ll_lora_uniform(uint64_t seed, uint64_t stream, uint64_t i) { // [-1, 1)
  const uint64_t r = mix64(mix64(seed ^ mix64(stream)) + i);
  return (float)((double)(r >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

int ll_lora_alloc(struct ll_lora **out, int n_layer, int rank, float alpha, const unsigned char *present, const struct ll_lora_dims *d,
                  struct ll_backend *be, char *err, size_t errlen) {
  *out = NULL;
  if (n_layer <= 0 || n_layer > 4096) return ll_errf(err, errlen, LL_EINVAL, "lora: %d layers", n_layer);
  if (rank <= 0 || rank > 4096) return ll_errf(err, errlen, LL_EINVAL, "lora: rank %d is out of range (1..4096)", rank);
  if (!isfinite(alpha)) return ll_errf(err, errlen, LL_EINVAL, "lora: alpha is not a finite number");
  struct ll_lora *a = calloc(1, sizeof *a);
  if (!a) return ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
  // The storage is host memory the engine and the loaders read and write; a device backend's
  // buffers are not host memory (ll_backend.h), so only a host-buffer backend allocates it.
  if (!ll_backend_host_buffers(be)) be = NULL;
  a->n_layer = n_layer, a->rank = rank, a->alpha = alpha, a->be = be;
  snprintf(a->arch, sizeof a->arch, "%s", d->arch);
  a->pairs = calloc((size_t)n_layer * LL_LORA_N_SLOTS, sizeof *a->pairs);
  if (!a->pairs) {
    free(a);
    return ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
  }
  int64_t total = 0;
  for (int l = 0; l < n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      if (!present[l * LL_LORA_N_SLOTS + t]) continue;
      int64_t in, o;
      ll_lora_target_dims(d, t, &in, &o);
      if (ll_lora_is_expert(t) && (d->n_expert <= 0 || d->n_expert > 4096 || d->n_ff_exp <= 0)) {
        ll_lora_free(a);
        return ll_errf(err, errlen, LL_EINVAL, "lora: blk.%d.%s: the model has no experts to adapt", l, target_tensors[t]);
      }
      if (((LL_LORA_SHEXP_TARGETS >> t) & 1) && d->n_ff_sh <= 0) {
        ll_lora_free(a);
        return ll_errf(err, errlen, LL_EINVAL, "lora: blk.%d.%s: the model has no shared expert to adapt", l, target_tensors[t]);
      }
      total += (int64_t)rank * (in + o) * (ll_lora_is_expert(t) ? d->n_expert : 1);
      a->targets |= 1u << t;
    }
  if (a->targets & LL_LORA_EXPERT_TARGETS) a->n_expert = d->n_expert;
  if (total <= 0 || total > (INT64_C(1) << 34)) {
    ll_lora_free(a);
    return ll_errf(err, errlen, LL_EINVAL, "lora: %lld parameters (no target adapted, or too many)", (long long)total);
  }
  a->storage = ll_backend_alloc(be, (size_t)total * sizeof(float));
  if (!a->storage) {
    ll_lora_free(a);
    return ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory for %lld parameters", (long long)total);
  }
  a->n_params = total;
  float *p = a->storage;
  for (int l = 0; l < n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      if (!present[l * LL_LORA_N_SLOTS + t]) continue;
      int64_t in, o;
      ll_lora_target_dims(d, t, &in, &o);
      const int64_t ne = ll_lora_is_expert(t) ? d->n_expert : 1; // experts stacked (ll_lora_expert)
      struct ll_lora_pair *pr = ll_lora_at(a, l, t);
      pr->a = (struct ll_weight){LL_TYPE_F32, in, rank * ne, p, NULL, NULL}; // A (E·r, in)
      p += (int64_t)rank * in * ne;
      pr->b = (struct ll_weight){LL_TYPE_F32, rank, o * ne, p, NULL, NULL}; // B (E·out, r)
      p += (int64_t)rank * o * ne;
    }
  *out = a;
  return 0;
}

int ll_lora_create(struct ll_lora **out, const struct ll_lora_dims *d, int rank, float alpha, unsigned targets, uint64_t seed,
                   struct ll_backend *be, char *err, size_t errlen) {
  *out = NULL;
  if (!targets || (targets & ~(LL_LORA_ALL_TARGETS | LL_LORA_EXPERT_TARGETS | LL_LORA_SHEXP_TARGETS)))
    return ll_errf(err, errlen, LL_EINVAL, "lora: no or unknown targets (mask 0x%x)", targets);
  if (d->n_layer <= 0 || d->n_embd <= 0 || d->n_embd_kv <= 0 || d->n_ff <= 0) return ll_errf(err, errlen, LL_EINVAL, "lora: bad model dimensions");
  const unsigned fused = ll_lora_fused(d->arch);
  unsigned char *present = calloc((size_t)d->n_layer * LL_LORA_N_SLOTS, 1);
  if (!present) return ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
  for (int l = 0; l < d->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) present[l * LL_LORA_N_SLOTS + t] = (targets >> t) & 1;
  int rc = ll_lora_alloc(out, d->n_layer, rank, alpha, present, d, be, err, errlen);
  free(present);
  if (rc) return rc;
  struct ll_lora *a = *out;
  // PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)); B = 0 (the
  // backend allocation is zeroed). A fused group's members get its first member's A (one module);
  // an expert slot's E matrices are one stream.
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      struct ll_lora_pair *pr = ll_lora_at(a, l, t);
      if (!pr->a.data) continue;
      const float bound = 1.0f / sqrtf((float)pr->a.k);
      float *A = (float *)pr->a.data;
      const int64_t n = pr->a.k * pr->a.n;
      const int lead = ll_lora_group_lead(a, fused, l, t);
      // the dense targets' streams as before the expert slots existed; those past them their own
      const uint64_t stream =
          t >= LL_LORA_N_TARGETS ? (UINT64_C(1) << 40) + (uint64_t)(l * LL_LORA_N_SLOTS + t) * 2 : (uint64_t)(l * LL_LORA_N_TARGETS + lead) * 2;
      for (int64_t i = 0; i < n; i++) A[i] = bound * ll_lora_uniform(seed, stream, (uint64_t)i);
    }
  return 0;
}

void ll_lora_free(struct ll_lora *a) {
  if (!a) return;
  ll_backend_free_buf(a->be, a->storage);
  free(a->pairs);
  free(a);
}

static int check(const struct ll_lora *a, const struct ll_lora_dims *d, int values, char *err, size_t errlen) {
  const char *nm = a->name[0] ? a->name : "adapter";
  const unsigned fused = ll_lora_fused(d->arch[0] ? d->arch : a->arch);
  if (a->arch[0] && d->arch[0] && strcmp(a->arch, d->arch) != 0)
    return ll_errf(err, errlen, LL_EINVAL, "%s: made for architecture '%s', the model is '%s' (wrong base model?)", nm, a->arch, d->arch);
  if (a->n_layer != d->n_layer)
    return ll_errf(err, errlen, LL_EINVAL, "%s: has %d layers, the model %d (wrong base model?)", nm, a->n_layer, d->n_layer);
  if (a->rank <= 0) return ll_errf(err, errlen, LL_EINVAL, "%s: rank %d", nm, a->rank);
  if (!isfinite(a->alpha)) return ll_errf(err, errlen, LL_EINVAL, "%s: alpha is not finite", nm);
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      const struct ll_lora_pair *pr = ll_lora_at(a, l, t);
      if (!pr->a.data && !pr->b.data) continue;
      if (d->n_expert > 0 && (t == LL_LORA_GATE || t == LL_LORA_UP || t == LL_LORA_DOWN))
        return ll_errf(err, errlen, LL_EINVAL, "%s: blk.%d.%s: the model's FFN is a mixture of %d experts (their adapters are the ffn_*_exps ones)", nm, l,
                       target_tensors[t], d->n_expert);
      const int xe = ll_lora_is_expert(t);
      if (((LL_LORA_SHEXP_TARGETS >> t) & 1) && d->n_ff_sh <= 0)
        return ll_errf(err, errlen, LL_EINVAL, "%s: blk.%d.%s: the model has no shared expert (wrong base model?)", nm, l, target_tensors[t]);
      if (xe && d->n_expert <= 0) return ll_errf(err, errlen, LL_EINVAL, "%s: blk.%d.%s: the model has no experts (wrong base model?)", nm, l, target_tensors[t]);
      if (xe && a->n_expert != d->n_expert)
        return ll_errf(err, errlen, LL_EINVAL, "%s: blk.%d.%s: adapts %d experts, the model has %d (wrong base model?)", nm, l, target_tensors[t], a->n_expert,
                       d->n_expert);
      int64_t in, o;
      ll_lora_target_dims(d, t, &in, &o);
      const int64_t ne = xe ? d->n_expert : 1;
      if (!pr->a.data || !pr->b.data || pr->a.type != LL_TYPE_F32 || pr->b.type != LL_TYPE_F32)
        return ll_errf(err, errlen, LL_EINVAL, "%s: blk.%d.%s: A and B must both be present and F32", nm, l, target_tensors[t]);
      if (pr->a.k != in || pr->a.n != a->rank * ne || pr->b.k != a->rank || pr->b.n != o * ne)
        return ll_errf(err, errlen, LL_EINVAL,
                       "%s: blk.%d.%s: A is (%lld x %lld) and B (%lld x %lld), the model needs A (%lld x %lld) and B (%lld x %d) (wrong base model?)",
                       nm, l, target_tensors[t], (long long)pr->a.n, (long long)pr->a.k, (long long)pr->b.n, (long long)pr->b.k,
                       (long long)(a->rank * ne), (long long)in, (long long)(o * ne), a->rank);
      const int lead = ll_lora_group_lead(a, fused, l, t);
      if (lead != t) { // a fused module: one A
        const struct ll_lora_pair *lp = ll_lora_at(a, l, lead);
        if (values && lp->a.k == pr->a.k && lp->a.n == pr->a.n && memcmp(lp->a.data, pr->a.data, sizeof(float) * (size_t)(pr->a.k * pr->a.n)) != 0)
          return ll_errf(err, errlen, LL_EINVAL, "%s: blk.%d: %s and %s have different A matrices, but %s adapts them as one module (%s)", nm, l,
                         target_names[lead], target_names[t], d->arch, t <= LL_LORA_V ? "attn_qkv" : "ffn_up");
      }
      for (int w = 0; values && w < 2; w++) {
        const struct ll_weight *m = w ? &pr->b : &pr->a;
        const float *x = m->data;
        for (int64_t i = 0; i < m->k * m->n; i++)
          if (!isfinite(x[i]))
            return ll_errf(err, errlen, LL_EFORMAT, "%s: blk.%d.%s.lora_%c: value %lld is %s", nm, l, target_tensors[t], w ? 'b' : 'a',
                           (long long)i, isnan(x[i]) ? "NaN" : "infinite");
      }
    }
  return 0;
}

int ll_lora_check(const struct ll_lora *a, const struct ll_lora_dims *d, char *err, size_t errlen) { return check(a, d, 1, err, errlen); }
int ll_lora_check_shapes(const struct ll_lora *a, const struct ll_lora_dims *d, char *err, size_t errlen) { return check(a, d, 0, err, errlen); }
