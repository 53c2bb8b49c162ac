// lora_io.c - LoRA adapters in files: the GGUF LoRA layout llama.cpp reads (src/llama-adapter.cpp
// of llama.cpp 0c1e5709, written as convert_lora_to_gguf.py writes it), .ckpt run checkpoints
// (same tensor names) and PEFT adapter directories.
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_ckpt.h"
#include "ll_error.h"
#include "ll_fileio.h"
#include "ll_gguf.h"
#include "ll_lora.h"
#include "ll_modelfile.h"
#include "ll_quant.h"
#include "ll_readers.h"

// ll_lora_to_mf without the targets in skip (written by fused_to_mf instead).
static int to_mf_except(const struct ll_lora *a, struct ll_modelfile *mf, unsigned skip, char *err, size_t errlen) {
  if (!a->arch[0]) return ll_errf(err, errlen, LL_EINVAL, "lora: the adapter does not say its base architecture");
  int rc = 0;
  if (!ll_mf_find_kv(mf, "general.architecture")) rc |= ll_mf_set_str(mf, "general.architecture", a->arch);
  rc |= ll_mf_set_str(mf, "general.type", "adapter");
  rc |= ll_mf_set_str(mf, "adapter.type", "lora");
  rc |= ll_mf_set_f32(mf, "adapter.lora.alpha", a->alpha);
  if (rc) return ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
  char name[96];
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      const struct ll_lora_pair *p = ll_lora_at(a, l, t);
      if (!p->a.data || ((skip >> t) & 1)) continue;
      // {in, r}, {r, out}; an expert slot's pair as llama.cpp's ffn_*_exps adapters: {in, r, E}, {r, out, E}
      const int ne = ll_lora_is_expert(t) ? a->n_expert : 1, nd = ll_lora_is_expert(t) ? 3 : 2;
      const int64_t nea[3] = {p->a.k, p->a.n / ne, ne}, neb[3] = {p->b.k, p->b.n / ne, ne};
      snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", l, ll_lora_target_tensor(t));
      if ((rc = ll_mf_add_tensor(mf, name, LL_TYPE_F32, nd, nea, p->a.data))) return ll_errf(err, errlen, rc, "lora: %s: %s", name, ll_strerror(rc));
      snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", l, ll_lora_target_tensor(t));
      if ((rc = ll_mf_add_tensor(mf, name, LL_TYPE_F32, nd, neb, p->b.data))) return ll_errf(err, errlen, rc, "lora: %s: %s", name, ll_strerror(rc));
    }
  return 0;
}

// A fused group's tensors (ll_lora.h: attn_qkv; ffn_up with 2 n_ff rows) stand in the table of
// one layer's pairs after its LL_LORA_N_SLOTS members.
enum { FUSED_QKV = LL_LORA_N_SLOTS, FUSED_GU, SLOTS };

int ll_lora_to_mf(const struct ll_lora *a, struct ll_modelfile *mf, char *err, size_t errlen) { return to_mf_except(a, mf, 0, err, errlen); }

// "blk.N.<stem>.weight.lora_a" -> layer, target, which (0 a, 1 b). 0 ok; 1 not an adapter
// tensor; negative: an adapter tensor we cannot use (message in err).
static int parse_name(const char *name, const struct ll_lora_dims *d, int *layer, int *target, int *which, char *err, size_t errlen) {
  const size_t n = strlen(name);
  if (n < 7 || (strcmp(name + n - 7, ".lora_a") != 0 && strcmp(name + n - 7, ".lora_b") != 0)) return 1;
  *which = name[n - 1] == 'b';
  char stem[64], rest[16];
  int l, used = 0;
  if (n - 7 >= 96 || sscanf(name, "blk.%d.%63[a-z_].%15[a-z_]%n", &l, stem, rest, &used) != 3 || (size_t)used != n - 7 || strcmp(rest, "weight") != 0)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "lora: tensor '%s': only the layers' attention and feed-forward matrices can be adapted", name);
  int t = ll_lora_target_from_name(stem);
  if (t < 0 && !strcmp(stem, "attn_qkv") && (ll_lora_fused(d->arch) & LL_LORA_GROUP_QKV)) t = FUSED_QKV; // phi3's q, k, v as one
  else if (t < 0 || strcmp(stem, ll_lora_target_tensor(t)) != 0)
    return ll_errf(err, errlen, LL_EUNSUPPORTED,
                   "lora: tensor '%s': '%s' is not an adaptable matrix (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, ffn_gate_exps, "
                   "ffn_up_exps, ffn_down_exps)",
                   name, stem);
  if (l < 0 || l >= d->n_layer)
    return ll_errf(err, errlen, LL_EINVAL, "lora: tensor '%s': layer %d, the model has %d (wrong base model?)", name, l, d->n_layer);
  *layer = l, *target = t;
  return 0;
}

int ll_lora_from_mf(struct ll_lora **out, const struct ll_modelfile *mf, const struct ll_lora_dims *d, int allow_other, struct ll_backend *be,
                    char *err, size_t errlen) {
  *out = NULL;
  const char *s;
  if (!allow_other) {
    if (ll_mf_get_str(mf, "general.type", &s) != 0 || strcmp(s, "adapter") != 0)
      return ll_errf(err, errlen, LL_EFORMAT, "lora: general.type is '%s', expected 'adapter' (is this a model rather than an adapter?)",
                     ll_mf_get_str(mf, "general.type", &s) == 0 ? s : "(missing)");
    if (ll_mf_get_str(mf, "adapter.type", &s) != 0 || strcmp(s, "lora") != 0)
      return ll_errf(err, errlen, LL_EUNSUPPORTED, "lora: adapter.type is '%s', expected 'lora'", ll_mf_get_str(mf, "adapter.type", &s) == 0 ? s : "(missing)");
  }
  if (ll_mf_get_str(mf, "general.architecture", &s) != 0) return ll_errf(err, errlen, LL_EFORMAT, "lora: general.architecture is missing");
  if (d->arch[0] && strcmp(s, d->arch) != 0)
    return ll_errf(err, errlen, LL_EINVAL, "lora: adapter for architecture '%s', the model is '%s' (wrong base model)", s, d->arch);
  double alpha = 0;
  const struct ll_kv *akv = ll_mf_find_kv(mf, "adapter.lora.alpha");
  if (akv && ll_mf_get_float(mf, "adapter.lora.alpha", &alpha) != 0) return ll_errf(err, errlen, LL_EFORMAT, "lora: adapter.lora.alpha is not a number");
  if (!isfinite(alpha) || fabs(alpha) > 1e6) return ll_errf(err, errlen, LL_EFORMAT, "lora: adapter.lora.alpha %g is out of range", alpha);
  const size_t npairs = (size_t)d->n_layer * LL_LORA_N_SLOTS, nslots = (size_t)d->n_layer * SLOTS;
  const unsigned fused = ll_lora_fused(d->arch);
  const struct ll_tensor_info **ta = calloc(nslots * 2, sizeof *ta); // [(layer * SLOTS + slot) * 2 + which]
  unsigned char *present = calloc(npairs, 1);
  int64_t *row0 = calloc(npairs, sizeof *row0); // a member of a fused group: its first row in the group's B
  int rc = 0, rank = 0;
  if (!ta || !present || !row0) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
    goto out;
  }
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    int l = 0, tg = 0, w = 0;
    rc = parse_name(t->name.ptr, d, &l, &tg, &w, err, errlen);
    if (rc < 0) goto out;
    if (rc == 1) {
      rc = 0;
      const size_t n = strlen(t->name.ptr);
      if (allow_other || (n >= 12 && strcmp(t->name.ptr + n - 12, "_norm.weight") == 0)) continue; // llama.cpp skips norms too
      rc = ll_errf(err, errlen, LL_EFORMAT, "lora: tensor '%s' is neither .lora_a nor .lora_b", t->name.ptr);
      goto out;
    }
    if (t->type != LL_TYPE_F32 && t->type != LL_TYPE_F16 && t->type != LL_TYPE_BF16) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "lora: tensor '%s' has type %s (F32, F16, BF16 supported)", t->name.ptr, ll_type_name(t->type));
      goto out;
    }
    if (ll_lora_is_expert(tg) ? t->n_dims != 3 || t->ne[2] != d->n_expert : t->n_dims != 2) {
      rc = ll_lora_is_expert(tg) ? ll_errf(err, errlen, LL_EFORMAT, "lora: tensor '%s' must be 3-D, one matrix per expert (%d: the model's experts)",
                                           t->name.ptr, d->n_expert)
                                 : ll_errf(err, errlen, LL_EFORMAT, "lora: tensor '%s' must be a 2-D matrix", t->name.ptr);
      goto out;
    }
    if (!t->data) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "lora: tensor '%s' has no data", t->name.ptr);
      goto out;
    }
    // phi3's ffn_up holds gate and up: an adapter of 2 n_ff output rows is the fused module's
    // (GGUF), one of n_ff the up member's own (.ckpt)
    if (tg == LL_LORA_UP && (fused & LL_LORA_GROUP_GU) && w == 1 && t->ne[1] == 2 * (int64_t)d->n_ff) tg = FUSED_GU;
    if (tg == LL_LORA_UP && (fused & LL_LORA_GROUP_GU) && w == 0) { // A alone does not tell: where its B went
      char bn[96];
      snprintf(bn, sizeof bn, "%.*sb", (int)strlen(t->name.ptr) - 1, t->name.ptr);
      const struct ll_tensor_info *tb = ll_mf_find_tensor(mf, bn);
      if (tb && tb->n_dims == 2 && tb->ne[1] == 2 * (int64_t)d->n_ff) tg = FUSED_GU;
    }
    const size_t k = ((size_t)l * SLOTS + (size_t)tg) * 2 + (size_t)w;
    if (ta[k]) {
      rc = ll_errf(err, errlen, LL_EEXIST, "lora: tensor '%s' appears twice", t->name.ptr);
      goto out;
    }
    ta[k] = t;
  }
  for (size_t si = 0; si < nslots; si++) {
    const struct ll_tensor_info *A = ta[si * 2], *B = ta[si * 2 + 1];
    if (!A && !B) continue;
    const int l = (int)(si / SLOTS), tg = (int)(si % SLOTS);
    const char *stem = tg == FUSED_QKV ? "attn_qkv" : tg == FUSED_GU ? "ffn_up" : ll_lora_target_tensor(tg);
    if (!A || !B) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "lora: blk.%d.%s.weight has lora_%c but not lora_%c", l, stem, A ? 'a' : 'b', A ? 'b' : 'a');
      goto out;
    }
    // a fused group's members and their rows in its B (q, k, v; gate, up)
    int mem[3] = {tg, -1, -1}, nm = 1;
    if (tg == FUSED_QKV) mem[0] = LL_LORA_Q, mem[1] = LL_LORA_K, mem[2] = LL_LORA_V, nm = 3;
    if (tg == FUSED_GU) mem[0] = LL_LORA_GATE, mem[1] = LL_LORA_UP, nm = 2;
    int64_t in = 0, o = 0;
    for (int j = 0; j < nm; j++) {
      int64_t mi, mo;
      ll_lora_target_dims(d, mem[j], &mi, &mo);
      row0[(size_t)l * LL_LORA_N_SLOTS + (size_t)mem[j]] = o;
      in = mi, o += mo;
    }
    if (A->ne[0] != in || B->ne[1] != o) {
      rc = ll_errf(err, errlen, LL_EINVAL, "lora: blk.%d.%s.weight: lora_a ne {%lld, %lld} and lora_b ne {%lld, %lld} do not fit the model's (%lld in, %lld out) (wrong base model?)",
                   l, stem, (long long)A->ne[0], (long long)A->ne[1], (long long)B->ne[0], (long long)B->ne[1], (long long)in, (long long)o);
      goto out;
    }
    if (A->ne[1] != B->ne[0]) {
      rc = ll_errf(err, errlen, LL_EINVAL, "lora: blk.%d.%s.weight: lora_a has rank %lld, lora_b %lld (lora_a must be ne {in, r}, lora_b ne {r, out})", l,
                   stem, (long long)A->ne[1], (long long)B->ne[0]);
      goto out;
    }
    if (rank && A->ne[1] != rank) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "lora: blk.%d.%s.weight has rank %lld, other matrices %d (one rank per adapter is supported)", l,
                   stem, (long long)A->ne[1], rank);
      goto out;
    }
    if (A->ne[1] <= 0 || A->ne[1] > 4096) {
      rc = ll_errf(err, errlen, LL_EINVAL, "lora: blk.%d.%s.weight: rank %lld is out of range", l, stem, (long long)A->ne[1]);
      goto out;
    }
    rank = (int)A->ne[1];
    for (int j = 0; j < nm; j++) {
      unsigned char *pp = &present[(size_t)l * LL_LORA_N_SLOTS + (size_t)mem[j]];
      if (*pp) {
        rc = ll_errf(err, errlen, LL_EEXIST, "lora: blk.%d.%s.weight adapts %s, which another tensor adapts too", l, stem, ll_lora_target_name(mem[j]));
        goto out;
      }
      *pp = nm > 1 ? (unsigned char)(1 + tg) : 1; // 1: its own tensors; 1 + slot: the fused group's
    }
  }
  if (!rank) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "lora: no adapter tensors (blk.N.<matrix>.weight.lora_a / .lora_b)");
    goto out;
  }
  // llama.cpp: scale = alpha ? alpha / rank : 1.
  if ((rc = ll_lora_alloc(out, d->n_layer, rank, alpha != 0 ? (float)alpha : (float)rank, present, d, be, err, errlen))) goto out;
  for (size_t pi = 0; pi < npairs; pi++) {
    if (!present[pi]) continue;
    const int l = (int)(pi / LL_LORA_N_SLOTS), tg = (int)(pi % LL_LORA_N_SLOTS), slot = present[pi] > 1 ? present[pi] - 1 : tg;
    struct ll_lora_pair *p = ll_lora_at(*out, l, tg);
    for (int w = 0; w < 2; w++) {
      const struct ll_tensor_info *t = ta[((size_t)l * SLOTS + (size_t)slot) * 2 + (size_t)w];
      struct ll_weight *m = w ? &p->b : &p->a;
      // B of a fused group: this member's rows; A: the group's whole
      const char *src = (const char *)t->data + (w ? (size_t)row0[pi] * ll_row_size(t->type, t->ne[0]) : 0);
      if (ll_dequantize_row(t->type, src, (float *)m->data, m->k * m->n) != 0) {
        rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "lora: tensor '%s': cannot convert %s", t->name.ptr, ll_type_name(t->type));
        goto out;
      }
    }
  }
  rc = ll_lora_check(*out, d, err, errlen);
out:
  if (rc && *out) ll_lora_free(*out), *out = NULL;
  free(ta);
  free(present);
  free(row0);
  return rc;
}

// The fused groups of a's architecture as llama.cpp names them (ll_lora.h): per layer, attn_qkv's
// lora_a is the group's A (its first adapted member's: the members' are equal, ll_lora_check) and
// lora_b the members' B rows stacked, zeros for a member not adapted. *bufs (malloc'ed, *n_bufs
// of them) hold the stacked B's the modelfile borrows.
static int fused_to_mf(const struct ll_lora *a, unsigned fused, struct ll_modelfile *mf, float **bufs, int *n_bufs, char *err, size_t errlen) {
  const unsigned groups[2] = {LL_LORA_GROUP_QKV, LL_LORA_GROUP_GU};
  const char *stems[2] = {"attn_qkv", "ffn_up"};
  char name[96];
  for (int l = 0; l < a->n_layer; l++)
    for (int g = 0; g < 2; g++) {
      if (!(fused & groups[g])) continue;
      const struct ll_lora_pair *lead = NULL;
      int64_t rows = 0, nr[3] = {0, 0, 0};
      int nm = 0, mem[3];
      for (int t = 0; t < LL_LORA_N_TARGETS; t++) {
        if (!((groups[g] >> t) & 1)) continue;
        mem[nm] = t;
        const struct ll_lora_pair *p = ll_lora_at(a, l, t);
        if (p->a.data && !lead) lead = p;
        nm++;
      }
      if (!lead) continue;
      // every member's width: from its own pair, or (not adapted) from a member of the same shape
      for (int j = 0; j < nm; j++) {
        const struct ll_lora_pair *p = ll_lora_at(a, l, mem[j]);
        const struct ll_lora_pair *same = mem[j] == LL_LORA_V ? ll_lora_at(a, l, LL_LORA_K) : mem[j] == LL_LORA_K ? ll_lora_at(a, l, LL_LORA_V)
                                          : mem[j] == LL_LORA_GATE ? ll_lora_at(a, l, LL_LORA_UP) : mem[j] == LL_LORA_UP ? ll_lora_at(a, l, LL_LORA_GATE) : NULL;
        const struct ll_lora_pair *o = ll_lora_at(a, l, LL_LORA_O); // o's input is q's width
        nr[j] = p->b.data ? p->b.n : same && same->b.data ? same->b.n : mem[j] == LL_LORA_Q && o->a.data ? o->a.k : -1;
        if (nr[j] < 0) // without the model, q's width shows in q's or o's adapter, k's in k's or v's
          return ll_errf(err, errlen, LL_EUNSUPPORTED, "lora: blk.%d.%s: %s is not adapted and its width is unknown here (adapt it, or %s)", l, stems[g],
                         ll_lora_target_name(mem[j]), mem[j] == LL_LORA_Q ? "o" : "the other of k, v");
        rows += nr[j];
      }
      float *bb = calloc((size_t)(rows * a->rank), sizeof *bb); // (rows, r): the members' B rows, in order
      if (!bb) return ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
      bufs[(*n_bufs)++] = bb;
      int64_t at = 0;
      for (int j = 0; j < nm; j++) {
        const struct ll_lora_pair *p = ll_lora_at(a, l, mem[j]);
        if (p->b.data) memcpy(bb + at * a->rank, p->b.data, sizeof(float) * (size_t)(nr[j] * a->rank));
        at += nr[j];
      }
      const int64_t nea[2] = {lead->a.k, lead->a.n}, neb[2] = {a->rank, rows};
      int rc;
      snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", l, stems[g]);
      if ((rc = ll_mf_add_tensor(mf, name, LL_TYPE_F32, 2, nea, lead->a.data))) return ll_errf(err, errlen, rc, "lora: %s: %s", name, ll_strerror(rc));
      snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", l, stems[g]);
      if ((rc = ll_mf_add_tensor(mf, name, LL_TYPE_F32, 2, neb, bb))) return ll_errf(err, errlen, rc, "lora: %s: %s", name, ll_strerror(rc));
    }
  return 0;
}

int ll_lora_save_gguf(const struct ll_lora *a, const char *path, char *err, size_t errlen) {
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  const unsigned fused = ll_lora_fused(a->arch);
  float **bufs = NULL;
  int n_bufs = 0;
  int rc = ll_mf_set_str(&mf, "general.architecture", a->arch[0] ? a->arch : "llama");
  if (rc == 0 && a->name[0]) rc = ll_mf_set_str(&mf, "general.name", a->name);
  if (rc == 0 && fused && !(bufs = calloc((size_t)a->n_layer * 2, sizeof *bufs))) rc = LL_ENOMEM;
  if (rc) rc = ll_errf(err, errlen, rc, "lora: out of memory");
  if (rc == 0) rc = to_mf_except(a, &mf, fused, err, errlen);
  if (rc == 0 && fused) rc = fused_to_mf(a, fused, &mf, bufs, &n_bufs, err, errlen);
  if (rc == 0) rc = ll_gguf_write(path, &mf, err, errlen);
  ll_modelfile_free(&mf);
  for (int i = 0; i < n_bufs; i++) free(bufs[i]);
  free(bufs);
  return rc;
}

int ll_lora_dims_from_mf(const struct ll_modelfile *mf, struct ll_lora_dims *d, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  const char *arch;
  if (ll_mf_get_str(mf, "general.architecture", &arch) != 0) return ll_errf(err, errlen, LL_EFORMAT, "lora: general.architecture is missing");
  snprintf(d->arch, sizeof d->arch, "%s", arch);
  // a .ckpt names the members (ll_lora_to_mf); a GGUF the fused groups (ll_lora_save_gguf)
  const unsigned fused = strcmp(mf->source_format, "ckpt") ? ll_lora_fused(arch) : 0;
  int64_t qkv_out = 0, up_out = 0; // fused groups' B widths (attn_qkv; ffn_up, gate's width unseen)
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    const char *name = t->name.ptr;
    const size_t n = strlen(name);
    if (n < 7 || (strcmp(name + n - 7, ".lora_a") != 0 && strcmp(name + n - 7, ".lora_b") != 0)) continue;
    char stem[64];
    int l;
    if (sscanf(name, "blk.%d.%63[a-z_]", &l, stem) != 2 || l < 0 || l >= 4096) continue;
    const int tg = ll_lora_target_from_name(stem), b = name[n - 1] == 'b';
    if (!strcmp(stem, "attn_qkv") && (fused & LL_LORA_GROUP_QKV) && t->ne[0] > 0 && t->ne[1] > 0 && t->ne[0] <= (1 << 20) && t->ne[1] <= (3 << 20)) {
      if (l + 1 > d->n_layer) d->n_layer = l + 1;
      if (b) qkv_out = t->ne[1];
      else if (!d->n_embd) d->n_embd = (int)t->ne[0];
      continue;
    }
    if (tg == LL_LORA_UP && (fused & LL_LORA_GROUP_GU)) { // gate | up: n_ff is half its B's rows
      if (l + 1 > d->n_layer) d->n_layer = l + 1;
      if (b && t->ne[1] > 0 && t->ne[1] <= (2 << 20)) up_out = t->ne[1];
      else if (!b && !d->n_embd && t->ne[0] > 0 && t->ne[0] <= (1 << 20)) d->n_embd = (int)t->ne[0];
      continue;
    }
    if (tg < 0 || t->ne[0] <= 0 || t->ne[1] <= 0 || t->ne[0] > (1 << 20) || t->ne[1] > (1 << 20)) continue;
    if (l + 1 > d->n_layer) d->n_layer = l + 1;
    const int v = (int)(b ? t->ne[1] : t->ne[0]); // B: out features; A: in features
    if (ll_lora_is_expert(tg)) {
      if (t->n_dims != 3 || t->ne[2] <= 0 || t->ne[2] > 4096) continue;
      if (!d->n_expert) d->n_expert = (int)t->ne[2];
    }
    int *in_dim = tg == LL_LORA_DOWN        ? &d->n_ff
                  : tg == LL_LORA_DOWN_EXPS  ? &d->n_ff_exp
                  : tg == LL_LORA_DOWN_SHEXP ? &d->n_ff_sh
                  : tg == LL_LORA_O          ? &d->n_embd_q
                                             : &d->n_embd;
    int *out_dim = tg == LL_LORA_K || tg == LL_LORA_V                   ? &d->n_embd_kv
                   : tg == LL_LORA_GATE || tg == LL_LORA_UP             ? &d->n_ff
                   : tg == LL_LORA_GATE_EXPS || tg == LL_LORA_UP_EXPS   ? &d->n_ff_exp
                   : tg == LL_LORA_GATE_SHEXP || tg == LL_LORA_UP_SHEXP ? &d->n_ff_sh
                   : tg == LL_LORA_Q                                ? &d->n_embd_q
                                                                    : &d->n_embd;
    int *dst = b ? out_dim : in_dim;
    if (!*dst) *dst = v;
  }
  if (!d->n_layer) return ll_errf(err, errlen, LL_EFORMAT, "lora: no adapter tensors (blk.N.<matrix>.weight.lora_a / .lora_b)");
  // A fused file (phi3) does not say where q's rows end: q is taken C wide (Phi-3's), k and v
  // halves of the rest. Only the sum matters to what is read and written back (the rows stay in
  // order), so a model of another split still round-trips.
  if (qkv_out && !d->n_embd_kv && d->n_embd > 0 && qkv_out > d->n_embd && (qkv_out - d->n_embd) % 2 == 0) {
    if (!d->n_embd_q) d->n_embd_q = d->n_embd;
    d->n_embd_kv = (int)((qkv_out - d->n_embd_q) / 2);
  }
  if (up_out && !d->n_ff && up_out % 2 == 0) d->n_ff = (int)(up_out / 2); // ffn_down did not say n_ff
  if (d->n_embd_q == d->n_embd) d->n_embd_q = 0; // the usual case: says "as n_embd"
  return 0;
}

// ---------------------------------------------------------------- PEFT

#define PEFT_MAX_CONFIG (1u << 20)

// An expert's module, as PEFT names it for the HF models whose GGUF holds ffn_*_exps: Mixtral's
// "block_sparse_moe.experts.E.w1|w3|w2" (gate, up, down) and Qwen2-MoE / Qwen3-MoE / OLMoE's
// "mlp.experts.E.gate_proj|up_proj|down_proj".
static const struct {
  const char *group, *module;
  int target;
} peft_experts[] = {
    {"block_sparse_moe", "w1", LL_LORA_GATE_EXPS},   {"block_sparse_moe", "w3", LL_LORA_UP_EXPS},
    {"block_sparse_moe", "w2", LL_LORA_DOWN_EXPS},   {"mlp", "gate_proj", LL_LORA_GATE_EXPS},
    {"mlp", "up_proj", LL_LORA_UP_EXPS},             {"mlp", "down_proj", LL_LORA_DOWN_EXPS},
};

static int peft_tail_ok(const char *tail) { return !strcmp(tail, "weight") || !strcmp(tail, "default.weight"); }

// "base_model.model.model.layers.N.self_attn.q_proj.lora_A[.default].weight" -> layer, target, which,
// expert -1 (target -2: Phi-3's qkv_proj, -3: its gate_up_proj); an expert's
// "...layers.N.mlp.experts.E.up_proj.lora_B.weight" -> its ffn_*_exps slot and expert E.
// -1: not a LoRA matrix llsrv adapts; -4: a module llsrv keeps frozen or has no slot for (why in what).
static int peft_name(const char *name, int *layer, int *target, int *which, int *expert, const char **what) {
  const char *p = name;
  if (strncmp(p, "base_model.model.", 17) == 0) p += 17;
  int l, e, used = 0;
  char grp[24], mod[16], ab[8], tail[24];
  *expert = -1;
  if (sscanf(p, "model.layers.%d.%23[a-z_].experts.%d.%15[a-z0-9_].lora_%7[AB].%23[a-z.]%n", &l, grp, &e, mod, ab, tail, &used) == 6 &&
      (size_t)used == strlen(p)) {
    if (!peft_tail_ok(tail) || l < 0 || e < 0) return -1;
    for (size_t i = 0; i < sizeof peft_experts / sizeof peft_experts[0]; i++)
      if (!strcmp(grp, peft_experts[i].group) && !strcmp(mod, peft_experts[i].module)) {
        *layer = l, *target = peft_experts[i].target, *which = ab[0] == 'B', *expert = e;
        return 0;
      }
    return -1;
  }
  used = 0;
  if (sscanf(p, "model.layers.%d.%23[a-z_].%15[a-z_].lora_%7[AB].%23[a-z.]%n", &l, grp, mod, ab, tail, &used) != 5 || (size_t)used != strlen(p)) {
    if (strstr(p, ".shared_expert.") || strstr(p, ".shared_expert_gate.")) {
      *what = "a shared expert's module (qwen2moe's shared_expert is not adapted by PEFT import)";
      return -4;
    }
    return -1;
  }
  if (!peft_tail_ok(tail)) return -1;
  if (!strcmp(mod, "gate") && (!strcmp(grp, "mlp") || !strcmp(grp, "block_sparse_moe"))) {
    *what = "the router (mlp.gate / block_sparse_moe.gate: frozen, not adapted)";
    return -4;
  }
  // Phi-3's fused modules, as its GGUF names them (no row permutation: NeoX rotation)
  if (!strcmp(mod, "qkv_proj") || !strcmp(mod, "gate_up_proj")) {
    if (strcmp(grp, mod[0] == 'q' ? "self_attn" : "mlp") != 0) return -1;
    *layer = l, *target = mod[0] == 'q' ? -2 : -3, *which = ab[0] == 'B';
    return 0;
  }
  const int t = ll_lora_target_from_name(mod);
  if (t < 0 || t >= LL_LORA_N_TARGETS || strcmp(mod, ll_lora_target_peft(t)) != 0) return -1;
  if (strcmp(grp, t <= LL_LORA_O ? "self_attn" : "mlp") != 0) return -1;
  *layer = l, *target = t, *which = ab[0] == 'B';
  return 0;
}

int ll_lora_peft_parse(struct ll_lora **out, const char *cfg_text, size_t cfg_len, const void *map, size_t maplen, const char *dir,
                       const struct ll_lora_dims *d, struct ll_backend *be, char *err, size_t errlen) {
  *out = NULL;
  char path[4200];
  snprintf(path, sizeof path, "%.4000s/adapter_config.json", dir);
  if (cfg_len > PEFT_MAX_CONFIG) return ll_errf(err, errlen, LL_ELIMIT, "%s: larger than %u bytes", path, PEFT_MAX_CONFIG);
  json_error_t je;
  json_t *cfg = json_loadb(cfg_text, cfg_len, JSON_REJECT_DUPLICATES, &je);
  if (!cfg) return ll_errf(err, errlen, LL_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
  int rc = 0;
  struct ll_modelfile raw, gm;
  ll_modelfile_init(&raw);
  ll_modelfile_init(&gm);
  void **copies = NULL;
  size_t n_copies = 0;
  const struct ll_tensor_info **xt = NULL;
  json_t *r = json_object_get(cfg, "r"), *al = json_object_get(cfg, "lora_alpha"), *pt = json_object_get(cfg, "peft_type");
  if (!json_is_object(cfg) || !json_is_integer(r) || json_integer_value(r) <= 0 || json_integer_value(r) > 4096 || !json_is_number(al)) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s: needs \"r\" (1..4096) and \"lora_alpha\"", path);
    goto out;
  }
  if (pt && (!json_is_string(pt) || strcmp(json_string_value(pt), "LORA") != 0)) {
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: peft_type %s is not supported (LORA)", path, json_is_string(pt) ? json_string_value(pt) : "?");
    goto out;
  }
  if (json_is_true(json_object_get(cfg, "use_dora"))) {
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: DoRA adapters (use_dora) are not supported", path);
    goto out;
  }
  const char *pats[2] = {"rank_pattern", "alpha_pattern"};
  for (int i = 0; i < 2; i++) {
    json_t *o = json_object_get(cfg, pats[i]);
    if (o && !json_is_null(o) && (!json_is_object(o) || json_object_size(o) > 0)) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: %s is not supported (one rank and alpha per adapter)", path, pats[i]);
      goto out;
    }
  }
  json_t *bias = json_object_get(cfg, "bias");
  if (json_is_string(bias) && strcmp(json_string_value(bias), "none") != 0) {
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: bias \"%s\" is not supported (none)", path, json_string_value(bias));
    goto out;
  }
  const int rank = (int)json_integer_value(r);
  double alpha = json_number_value(al);
  if (!isfinite(alpha) || fabs(alpha) > 1e6) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s: lora_alpha is out of range", path);
    goto out;
  }
  if (json_is_true(json_object_get(cfg, "use_rslora"))) alpha *= sqrt((double)rank); // scale alpha/sqrt(r) == alpha'/r

  snprintf(path, sizeof path, "%.4000s/adapter_model.safetensors", dir);
  char e2[384] = "";
  if ((rc = ll_safetensors_parse_header(map, maplen, maplen, &raw, e2, sizeof e2))) {
    ll_errf(err, errlen, rc, "%s: %s", path, e2);
    goto out;
  }
  copies = calloc(raw.n_tensors + 1, sizeof *copies);
  if (!copies) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
    goto out;
  }
  rc |= ll_mf_set_str(&gm, "general.architecture", d->arch);
  rc |= ll_mf_set_str(&gm, "general.type", "adapter");
  rc |= ll_mf_set_str(&gm, "adapter.type", "lora");
  rc |= ll_mf_set_f32(&gm, "adapter.lora.alpha", (float)alpha);
  if (rc) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
    goto out;
  }
  const int permute = strcmp(d->arch, "llama") == 0;
  // The experts' matrices, one tensor per expert in PEFT, are gathered here and stacked into
  // llama.cpp's 3-D ffn_*_exps lora tensors ({in, r, E}, {r, out, E}) after the loop:
  // xt[((layer * 3 + slot) * 2 + which) * n_expert + expert].
  const int n_exp = d->n_expert > 0 ? d->n_expert : 0;
  const size_t nx = (size_t)d->n_layer * 3 * 2 * (size_t)n_exp;
  if (nx && !(xt = calloc(nx, sizeof *xt))) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
    goto out;
  }
  for (uint64_t i = 0; i < raw.n_tensors; i++) {
    const struct ll_tensor_info *t = &raw.tensors[i];
    int l = 0, tg = 0, w = 0, ex = -1;
    const char *why = NULL;
    if ((rc = peft_name(t->name.ptr, &l, &tg, &w, &ex, &why)) != 0) {
      if (rc == -4) rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: tensor '%s': %s", path, t->name.ptr, why);
      else
        rc = ll_errf(err, errlen, LL_EUNSUPPORTED,
                     "%s: tensor '%s' is not a LoRA matrix of q/k/v/o/gate/up/down_proj or of an expert (mlp.experts.N.gate/up/down_proj, "
                     "block_sparse_moe.experts.N.w1/w3/w2)",
                     path, t->name.ptr);
      goto out;
    }
    if (t->n_dims != 2) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "%s: tensor '%s' is not 2-D", path, t->name.ptr);
      goto out;
    }
    if ((w ? t->ne[0] : t->ne[1]) != rank) {
      rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s' has rank %lld, adapter_config.json says r=%d", path, t->name.ptr,
                   (long long)(w ? t->ne[0] : t->ne[1]), rank);
      goto out;
    }
    if (ex >= 0) {
      if (!n_exp) {
        rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s' adapts an expert; the model has no experts (wrong base model?)", path, t->name.ptr);
        goto out;
      }
      if (l >= d->n_layer || ex >= n_exp) {
        rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s': layer %d, expert %d; the model has %d layers of %d experts (wrong base model?)", path,
                     t->name.ptr, l, ex, d->n_layer, n_exp);
        goto out;
      }
      const struct ll_tensor_info **slot = &xt[(((size_t)l * 3 + (size_t)(tg - LL_LORA_GATE_EXPS)) * 2 + (size_t)w) * (size_t)n_exp + (size_t)ex];
      if (*slot) {
        rc = ll_errf(err, errlen, LL_EEXIST, "%s: tensor '%s' appears twice", path, t->name.ptr);
        goto out;
      }
      *slot = t;
      continue;
    }
    const unsigned char *src = (const unsigned char *)map + t->offset;
    const void *data = src;
    if (tg < 0 && !(ll_lora_fused(d->arch) & (tg == -2 ? LL_LORA_GROUP_QKV : LL_LORA_GROUP_GU))) {
      rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: tensor '%s': %s models have no fused %s", path, t->name.ptr, d->arch, tg == -2 ? "qkv_proj" : "gate_up_proj");
      goto out;
    }
    if (w && permute && (tg == LL_LORA_Q || tg == LL_LORA_K)) {
      // llama.cpp's converter permutes q/k rows of the base (HF rotate-half -> interleaved
      // pairs); the adapter's output rows (lora_B) must follow: HF row h*hd + i*hd/2 + j ->
      // GGUF row h*hd + 2j + i.
      const int heads = tg == LL_LORA_Q ? d->n_head : d->n_head_kv;
      const int64_t rows = t->ne[1];
      if (heads <= 0 || rows % heads || (rows / heads) % 2) {
        rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s': %lld rows do not split into %d heads (wrong base model?)", path, t->name.ptr,
                     (long long)rows, heads);
        goto out;
      }
      const size_t rowb = (size_t)(t->nbytes / (uint64_t)rows);
      unsigned char *dst = malloc(t->nbytes ? t->nbytes : 1);
      if (!dst) {
        rc = ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
        goto out;
      }
      copies[n_copies++] = dst;
      const int64_t hd = rows / heads;
      for (int64_t h = 0; h < heads; h++)
        for (int64_t ii = 0; ii < 2; ii++)
          for (int64_t j = 0; j < hd / 2; j++) memcpy(dst + (size_t)(h * hd + 2 * j + ii) * rowb, src + (size_t)(h * hd + ii * hd / 2 + j) * rowb, rowb);
      data = dst;
    }
    char gname[96];
    snprintf(gname, sizeof gname, "blk.%d.%s.weight.lora_%c", l, tg == -2 ? "attn_qkv" : tg == -3 ? "ffn_up" : ll_lora_target_tensor(tg), w ? 'b' : 'a');
    if (ll_mf_find_tensor(&gm, gname)) {
      rc = ll_errf(err, errlen, LL_EEXIST, "%s: tensor '%s' appears twice", path, t->name.ptr);
      goto out;
    }
    if ((rc = ll_mf_add_tensor(&gm, gname, t->type, 2, t->ne, data))) {
      ll_errf(err, errlen, rc, "%s: %s: %s", path, t->name.ptr, ll_strerror(rc));
      goto out;
    }
  }
  // Each expert slot adapted in a layer: all n_exp experts, of one type and shape, stacked in
  // expert order. The tensors are disjoint in the file (ll_safetensors_parse_header), so the
  // stacks together are at most its size.
  for (size_t g = 0; nx && g < nx / (size_t)n_exp; g++) {
    const struct ll_tensor_info **x = &xt[g * (size_t)n_exp], *t0 = NULL;
    int have = 0;
    for (int e = 0; e < n_exp; e++) have += x[e] != NULL, t0 = t0 ? t0 : x[e];
    if (!have) continue;
    const int l = (int)(g / 6), tg = LL_LORA_GATE_EXPS + (int)(g / 2 % 3), w = (int)(g % 2);
    for (int e = 0; e < n_exp; e++) {
      if (!x[e]) {
        rc = ll_errf(err, errlen, LL_EINVAL, "%s: layer %d, %s lora_%c: expert %d is missing (%d of the model's %d experts present; all or none)",
                     path, l, ll_lora_target_tensor(tg), w ? 'B' : 'A', e, have, n_exp);
        goto out;
      }
      if (x[e]->type != t0->type || x[e]->ne[0] != t0->ne[0] || x[e]->ne[1] != t0->ne[1]) {
        rc = ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s': type or shape differs from '%s' (one per expert of the same module)", path,
                     x[e]->name.ptr, t0->name.ptr);
        goto out;
      }
    }
    const size_t nb = (size_t)t0->nbytes;
    unsigned char *dst = malloc(nb * (size_t)n_exp + 1);
    if (!dst) {
      rc = ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory");
      goto out;
    }
    copies[n_copies++] = dst; // at most one per tensor: a stack takes n_exp >= 1 of them
    for (int e = 0; e < n_exp; e++) memcpy(dst + (size_t)e * nb, (const unsigned char *)map + x[e]->offset, nb);
    char gname[96];
    snprintf(gname, sizeof gname, "blk.%d.%s.weight.lora_%c", l, ll_lora_target_tensor(tg), w ? 'b' : 'a');
    const int64_t ne[3] = {t0->ne[0], t0->ne[1], n_exp};
    if ((rc = ll_mf_add_tensor(&gm, gname, t0->type, 3, ne, dst))) {
      ll_errf(err, errlen, rc, "%s: %s: %s", path, gname, ll_strerror(rc));
      goto out;
    }
  }
  char e3[512] = "";
  if ((rc = ll_lora_from_mf(out, &gm, d, 0, be, e3, sizeof e3))) ll_errf(err, errlen, rc, "%s: %s", dir, e3);
out:
  free(xt);
  for (size_t i = 0; i < n_copies; i++) free(copies[i]);
  free(copies);
  ll_modelfile_free(&raw);
  ll_modelfile_free(&gm);
  json_decref(cfg);
  return rc;
}

int ll_lora_load_peft(struct ll_lora **out, const char *dir, const struct ll_lora_dims *d, struct ll_backend *be, char *err, size_t errlen) {
  *out = NULL;
  char path[4200];
  snprintf(path, sizeof path, "%.4000s/adapter_config.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  char *cfg = malloc(PEFT_MAX_CONFIG + 1);
  size_t n = cfg ? fread(cfg, 1, PEFT_MAX_CONFIG + 1, f) : 0;
  const int bad = ferror(f);
  fclose(f);
  if (!cfg || bad || n > PEFT_MAX_CONFIG) {
    free(cfg);
    return !cfg ? ll_errf(err, errlen, LL_ENOMEM, "lora: out of memory")
           : bad ? ll_errf(err, errlen, LL_EIO, "%s: read error", path)
                 : ll_errf(err, errlen, LL_ELIMIT, "%s: larger than %u bytes", path, PEFT_MAX_CONFIG);
  }
  void *map = NULL;
  size_t maplen = 0;
  snprintf(path, sizeof path, "%.4000s/adapter_model.safetensors", dir);
  int rc = ll_map_file(path, &map, &maplen, err, errlen);
  if (rc) {
    char bin[4200];
    snprintf(bin, sizeof bin, "%.4000s/adapter_model.bin", dir);
    if (access(bin, F_OK) == 0) rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: only adapter_model.safetensors is read (not the pickle adapter_model.bin)", dir);
  } else {
    rc = ll_lora_peft_parse(out, cfg, n, map, maplen, dir, d, be, err, errlen);
    munmap(map, maplen);
  }
  free(cfg);
  return rc;
}

// ---------------------------------------------------------------- any file

int ll_lora_load(struct ll_lora **out, const char *path, const struct ll_lora_dims *d, struct ll_backend *be, char *err, size_t errlen) {
  *out = NULL;
  struct ll_lora_dims inferred;
  struct stat st;
  if (stat(path, &st) != 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  int rc;
  char e2[768] = "";
  if (S_ISDIR(st.st_mode)) {
    if (!d) return ll_errf(err, errlen, LL_EINVAL, "%s: a PEFT directory needs the base model (its heads, for the q/k permutation)", path);
    rc = ll_lora_load_peft(out, path, d, be, err, errlen);
  } else {
    unsigned char magic[8] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
    ssize_t got = read(fd, magic, sizeof magic);
    close(fd);
    struct ll_modelfile mf;
    ll_modelfile_init(&mf);
    int is_ckpt = got == 8 && ll_ckpt_is_ckpt(magic, 8);
    if (got >= 4 && memcmp(magic, "GGUF", 4) == 0) rc = ll_gguf_open(path, &mf, e2, sizeof e2);
    else if (is_ckpt) rc = ll_ckpt_open(path, &mf, 1, e2, sizeof e2);
    else rc = ll_errf(e2, sizeof e2, LL_EFORMAT, "not a GGUF LoRA adapter, a .ckpt or a PEFT directory");
    if (rc == 0 && !d) rc = ll_lora_dims_from_mf(&mf, &inferred, e2, sizeof e2), d = &inferred;
    if (rc == 0) rc = ll_lora_from_mf(out, &mf, d, is_ckpt, be, e2, sizeof e2);
    if (rc) ll_errf(err, errlen, rc, "%s: %s", path, e2);
    ll_modelfile_free(&mf);
  }
  if (rc == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    const char *base = strrchr(tmp, '/');
    base = base ? base + 1 : tmp;
    char stem[64]; // the adapter's name: the file's stem, cut to the name's size
    size_t bl = strlen(base);
    if (bl >= sizeof stem) bl = sizeof stem - 1;
    memcpy(stem, base, bl);
    stem[bl] = 0;
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem) *dot = 0;
    snprintf((*out)->name, sizeof (*out)->name, "%s", stem);
  }
  return rc;
}
