// test_ckpt_common.h - synthetic model files and comparisons shared by the .ckpt tests.
#ifndef TEST_CKPT_COMMON_H
#define TEST_CKPT_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "ll_ckpt.h"
#include "ll_modelfile.h"
#include "ll_quant.h"
#include "testutil.h"

// Deep equality of two metadata values, types included (bit-exact for floats).
static inline int tc_value_eq(const struct ll_kv_value *a, const struct ll_kv_value *b) {
  if (a->type != b->type) return 0;
  switch (a->type) {
  case LL_KV_STR: return a->v.str.len == b->v.str.len && memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len) == 0;
  case LL_KV_F32: case LL_KV_F64: return memcmp(&a->v.f64, &b->v.f64, sizeof(double)) == 0;
  case LL_KV_I8: case LL_KV_I16: case LL_KV_I32: case LL_KV_I64: return a->v.i64 == b->v.i64;
  case LL_KV_ARR: {
    const struct ll_kv_array *x = &a->v.arr, *y = &b->v.arr;
    if (x->elem_type != y->elem_type || x->n != y->n) return 0;
    if (x->elem_type == LL_KV_STR) {
      const struct ll_str *s = x->data, *t = y->data;
      for (uint64_t i = 0; i < x->n; i++)
        if (s[i].len != t[i].len || memcmp(s[i].ptr, t[i].ptr, s[i].len) != 0) return 0;
      return 1;
    }
    if (x->elem_type == LL_KV_ARR) {
      const struct ll_kv_value *s = x->data, *t = y->data;
      for (uint64_t i = 0; i < x->n; i++)
        if (!tc_value_eq(&s[i], &t[i])) return 0;
      return 1;
    }
    return x->n == 0 || memcmp(x->data, y->data, x->n * ll_kv_type_size(x->elem_type)) == 0;
  }
  default: return a->v.u64 == b->v.u64;
  }
}

// Same keys in the same order with equal values; returns the index of the first difference or -1.
static inline long tc_kv_diff(const struct ll_modelfile *a, const struct ll_modelfile *b) {
  if (a->n_kv != b->n_kv) return (long)(a->n_kv < b->n_kv ? a->n_kv : b->n_kv);
  for (uint64_t i = 0; i < a->n_kv; i++)
    if (strcmp(a->kv[i].key.ptr, b->kv[i].key.ptr) != 0 || !tc_value_eq(&a->kv[i].value, &b->kv[i].value))
      return (long)i;
  return -1;
}

// Same tensors (name, type, shape, bytes); index of the first difference or -1.
static inline long tc_tensor_diff(const struct ll_modelfile *a, const struct ll_modelfile *b) {
  if (a->n_tensors != b->n_tensors) return (long)(a->n_tensors < b->n_tensors ? a->n_tensors : b->n_tensors);
  for (uint64_t i = 0; i < a->n_tensors; i++) {
    const struct ll_tensor_info *x = &a->tensors[i], *y = &b->tensors[i];
    if (strcmp(x->name.ptr, y->name.ptr) != 0 || x->type != y->type || x->n_dims != y->n_dims ||
        memcmp(x->ne, y->ne, sizeof x->ne) != 0 || x->nbytes != y->nbytes || !x->data || !y->data ||
        memcmp(x->data, y->data, x->nbytes) != 0)
      return (long)i;
  }
  return -1;
}

// A synthetic model file: every metadata value type (nested arrays, strings with NUL) and one
// tensor of every type with a known block size, random bytes, `scale` rows per tensor.
static inline int tc_make_model(struct ll_modelfile *mf, uint64_t *rng, int scale, uint32_t marker) {
  ll_modelfile_init(mf);
  int rc = 0;
  rc |= ll_mf_set_str(mf, "general.architecture", "llama");
  rc |= ll_mf_set_str(mf, "general.name", "synthetic");
  rc |= ll_mf_set_u32(mf, "llama.block_count", 2);
  rc |= ll_mf_set_u32(mf, "llama.embedding_length", 256);
  rc |= ll_mf_set_u32(mf, "test.marker", marker);
  rc |= ll_mf_set_i32(mf, "test.i32", -123456);
  rc |= ll_mf_set_u64(mf, "test.u64", 0xfedcba9876543210ull);
  rc |= ll_mf_set_f32(mf, "test.f32", 0.1f);
  rc |= ll_mf_set_bool(mf, "test.bool", 1);
  float fa[3] = {1.5f, -2.25f, 3e-8f};
  rc |= ll_mf_set_arr(mf, "test.f32arr", LL_KV_F32, fa, 3);
  const char *toks[4] = {"<s>", "</s>", "a", "\xc3\xa9t\xc3\xa9"};
  rc |= ll_mf_set_arr(mf, "tokenizer.ggml.tokens", LL_KV_STR, toks, 4);
  rc |= ll_mf_set_str(mf, "tokenizer.ggml.model", "llama");
  rc |= ll_mf_set_u32(mf, "tokenizer.ggml.bos_token_id", 1);
  if (rc) return rc;
  // Types without a setter: built by hand (u8, i8, u16, i16, i64, f64, nested array, NUL string).
  static const int kinds[] = {LL_KV_U8, LL_KV_I8, LL_KV_U16, LL_KV_I16, LL_KV_I64, LL_KV_F64};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    char key[32];
    snprintf(key, sizeof key, "test.kind%d", kinds[k]);
    if ((rc = ll_mf_set_u32(mf, key, 0))) return rc;
    struct ll_kv_value *v = &mf->kv[mf->n_kv - 1].value;
    v->type = kinds[k];
    if (kinds[k] == LL_KV_I8) v->v.i64 = -7;
    else if (kinds[k] == LL_KV_I16) v->v.i64 = -30000;
    else if (kinds[k] == LL_KV_I64) v->v.i64 = INT64_MIN + 5;
    else if (kinds[k] == LL_KV_F64) v->v.f64 = 3.141592653589793;
    else v->v.u64 = kinds[k] == LL_KV_U8 ? 250 : 65000;
  }
  if ((rc = ll_mf_set_str(mf, "test.nul", "x"))) return rc;
  {
    struct ll_str *s = &mf->kv[mf->n_kv - 1].value.v.str;
    free(s->ptr);
    s->ptr = malloc(4);
    memcpy(s->ptr, "a\0b", 4);
    s->len = 3;
  }
  {
    uint32_t inner0[2] = {1, 2}, inner1[1] = {3};
    if ((rc = ll_mf_set_arr(mf, "test.nested", LL_KV_U32, inner0, 2))) return rc;
    struct ll_kv_value *v = &mf->kv[mf->n_kv - 1].value;
    struct ll_kv_value outer;
    memset(&outer, 0, sizeof outer);
    outer.type = LL_KV_ARR;
    outer.v.arr.elem_type = LL_KV_ARR;
    outer.v.arr.n = 2;
    struct ll_kv_value *c = calloc(2, sizeof *c);
    ll_kv_value_copy(&c[0], v);
    c[1] = c[0];
    c[1].v.arr.data = malloc(4);
    memcpy(c[1].v.arr.data, inner1, 4);
    c[1].v.arr.n = 1;
    outer.v.arr.data = c;
    ll_kv_value_free(v);
    *v = outer;
  }
  // Tensors: one per known type.
  size_t total = 0;
  int types[LL_TYPE_COUNT], nty = 0;
  for (int t = 0; t < LL_TYPE_COUNT; t++) {
    const struct ll_type_traits *tt = ll_type_traits_get(t);
    if (tt && tt->blck_size > 0) types[nty++] = t;
  }
  for (int i = 0; i < nty; i++) total += (ll_row_size(types[i], 256) * (size_t)scale + 63) / 64 * 64;
  total += 4 * 64 * 8 * sizeof(float);
  unsigned char *data = malloc(total);
  if (!data) return -1;
  mf->backing = data;
  mf->backing_len = total;
  size_t off = 0;
  for (int i = 0; i < nty; i++) {
    int64_t ne[2] = {256, scale};
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", i, ll_type_name(types[i]));
    size_t n = ll_row_size(types[i], 256) * (size_t)scale;
    for (size_t j = 0; j < n; j++) data[off + j] = (unsigned char)(ll_test_rand(rng) >> 32);
    if ((rc = ll_mf_add_tensor(mf, name, types[i], scale > 1 ? 2 : 1, ne, data + off))) return rc;
    off += (n + 63) / 64 * 64;
  }
  // A LoRA pair and Adam moments (roles by name).
  static const char *extra[] = {"blk.0.attn_q.weight.lora_a", "blk.0.attn_q.weight.lora_b",
                                "blk.0.attn_q.weight.adam_m", "blk.0.attn_q.weight.adam_v"};
  for (int i = 0; i < 4; i++) {
    int64_t ne[2] = {64, 8};
    float *f = (float *)(data + off);
    for (int j = 0; j < 64 * 8; j++) f[j] = ll_test_randf(rng);
    if ((rc = ll_mf_add_tensor(mf, extra[i], LL_TYPE_F32, 2, ne, f))) return rc;
    off += 64 * 8 * sizeof(float);
  }
  return 0;
}

#endif
