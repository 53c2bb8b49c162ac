// modelfile.c - the format-neutral model container: metadata lookup and building.
#include "ll_modelfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ll_error.h"
#include "ll_quant.h"

void ll_modelfile_init(struct ll_modelfile *mf) {
  memset(mf, 0, sizeof *mf);
  mf->gguf_version = 3;
  mf->alignment = 32;
}

static void str_free(struct ll_str *s) {
  free(s->ptr);
  s->ptr = NULL;
  s->len = 0;
}

void ll_kv_value_free(struct ll_kv_value *v) {
  if (!v) return;
  if (v->type == LL_KV_STR) {
    str_free(&v->v.str);
  } else if (v->type == LL_KV_ARR) {
    struct ll_kv_array *a = &v->v.arr;
    if (a->data) {
      if (a->elem_type == LL_KV_STR) {
        struct ll_str *s = a->data;
        for (uint64_t i = 0; i < a->n; i++) str_free(&s[i]);
      } else if (a->elem_type == LL_KV_ARR) {
        struct ll_kv_value *c = a->data;
        for (uint64_t i = 0; i < a->n; i++) ll_kv_value_free(&c[i]);
      }
    }
    free(a->data);
    a->data = NULL;
    a->n = 0;
  }
  v->type = LL_KV_U8;
}

void ll_modelfile_free(struct ll_modelfile *mf) {
  if (!mf) return;
  for (uint64_t i = 0; i < mf->n_kv; i++) {
    str_free(&mf->kv[i].key);
    ll_kv_value_free(&mf->kv[i].value);
  }
  free(mf->kv);
  for (uint64_t i = 0; i < mf->n_tensors; i++) str_free(&mf->tensors[i].name);
  free(mf->tensors);
  if (mf->backing) {
    if (mf->backing_is_mmap)
      munmap(mf->backing, mf->backing_len);
    else
      free(mf->backing);
  }
  ll_modelfile_init(mf);
}

size_t ll_kv_type_size(int type) {
  switch (type) {
  case LL_KV_U8: case LL_KV_I8: case LL_KV_BOOL: return 1;
  case LL_KV_U16: case LL_KV_I16: return 2;
  case LL_KV_U32: case LL_KV_I32: case LL_KV_F32: return 4;
  case LL_KV_U64: case LL_KV_I64: case LL_KV_F64: return 8;
  default: return 0;
  }
}

// ---------------------------------------------------------------- lookup

const struct ll_kv *ll_mf_find_kv(const struct ll_modelfile *mf, const char *key) {
  for (uint64_t i = 0; i < mf->n_kv; i++)
    if (strcmp(mf->kv[i].key.ptr, key) == 0) return &mf->kv[i];
  return NULL;
}

static int is_signed_int(int t) { return t == LL_KV_I8 || t == LL_KV_I16 || t == LL_KV_I32 || t == LL_KV_I64; }
static int is_unsigned_int(int t) {
  return t == LL_KV_U8 || t == LL_KV_U16 || t == LL_KV_U32 || t == LL_KV_U64 || t == LL_KV_BOOL;
}

int ll_mf_get_int(const struct ll_modelfile *mf, const char *key, int64_t *out) {
  const struct ll_kv *kv = ll_mf_find_kv(mf, key);
  if (!kv) return LL_ENOTFOUND;
  if (is_signed_int(kv->value.type)) {
    *out = kv->value.v.i64;
    return 0;
  }
  if (is_unsigned_int(kv->value.type)) {
    if (kv->value.v.u64 > (uint64_t)INT64_MAX) return LL_ELIMIT;
    *out = (int64_t)kv->value.v.u64;
    return 0;
  }
  return LL_EFORMAT;
}

int ll_mf_get_uint(const struct ll_modelfile *mf, const char *key, uint64_t *out) {
  const struct ll_kv *kv = ll_mf_find_kv(mf, key);
  if (!kv) return LL_ENOTFOUND;
  if (is_unsigned_int(kv->value.type)) {
    *out = kv->value.v.u64;
    return 0;
  }
  if (is_signed_int(kv->value.type)) {
    if (kv->value.v.i64 < 0) return LL_ELIMIT;
    *out = (uint64_t)kv->value.v.i64;
    return 0;
  }
  return LL_EFORMAT;
}

int ll_mf_get_float(const struct ll_modelfile *mf, const char *key, double *out) {
  const struct ll_kv *kv = ll_mf_find_kv(mf, key);
  if (!kv) return LL_ENOTFOUND;
  if (kv->value.type == LL_KV_F32 || kv->value.type == LL_KV_F64) {
    *out = kv->value.v.f64;
    return 0;
  }
  if (is_signed_int(kv->value.type)) {
    *out = (double)kv->value.v.i64;
    return 0;
  }
  if (is_unsigned_int(kv->value.type)) {
    *out = (double)kv->value.v.u64;
    return 0;
  }
  return LL_EFORMAT;
}

int ll_mf_get_bool(const struct ll_modelfile *mf, const char *key, int *out) {
  const struct ll_kv *kv = ll_mf_find_kv(mf, key);
  if (!kv) return LL_ENOTFOUND;
  if (kv->value.type == LL_KV_BOOL || is_unsigned_int(kv->value.type)) {
    *out = kv->value.v.u64 != 0;
    return 0;
  }
  return LL_EFORMAT;
}

int ll_mf_get_str(const struct ll_modelfile *mf, const char *key, const char **out) {
  const struct ll_kv *kv = ll_mf_find_kv(mf, key);
  if (!kv) return LL_ENOTFOUND;
  if (kv->value.type != LL_KV_STR) return LL_EFORMAT;
  *out = kv->value.v.str.ptr;
  return 0;
}

int ll_mf_get_arr(const struct ll_modelfile *mf, const char *key, const struct ll_kv_array **out) {
  const struct ll_kv *kv = ll_mf_find_kv(mf, key);
  if (!kv) return LL_ENOTFOUND;
  if (kv->value.type != LL_KV_ARR) return LL_EFORMAT;
  *out = &kv->value.v.arr;
  return 0;
}

static int arch_key(const struct ll_modelfile *mf, const char *suffix, char *buf, size_t len) {
  const char *arch;
  if (ll_mf_get_str(mf, "general.architecture", &arch) != 0) return LL_ENOTFOUND;
  if ((size_t)snprintf(buf, len, "%s.%s", arch, suffix) >= len) return LL_ELIMIT;
  return 0;
}

int ll_mf_get_arch_int(const struct ll_modelfile *mf, const char *suffix, int64_t *out) {
  char key[256];
  int rc = arch_key(mf, suffix, key, sizeof key);
  return rc ? rc : ll_mf_get_int(mf, key, out);
}

int ll_mf_get_arch_float(const struct ll_modelfile *mf, const char *suffix, double *out) {
  char key[256];
  int rc = arch_key(mf, suffix, key, sizeof key);
  return rc ? rc : ll_mf_get_float(mf, key, out);
}

const struct ll_tensor_info *ll_mf_find_tensor(const struct ll_modelfile *mf, const char *name) {
  for (uint64_t i = 0; i < mf->n_tensors; i++)
    if (strcmp(mf->tensors[i].name.ptr, name) == 0) return &mf->tensors[i];
  return NULL;
}

// ---------------------------------------------------------------- building

static int str_set(struct ll_str *s, const char *p, size_t len) {
  s->ptr = malloc(len + 1);
  if (!s->ptr) return LL_ENOMEM;
  memcpy(s->ptr, p, len);
  s->ptr[len] = 0;
  s->len = len;
  return 0;
}

// Slot for key: the existing entry (its value freed) or a new one at the end.
static struct ll_kv *kv_slot(struct ll_modelfile *mf, const char *key) {
  for (uint64_t i = 0; i < mf->n_kv; i++) {
    if (strcmp(mf->kv[i].key.ptr, key) == 0) {
      ll_kv_value_free(&mf->kv[i].value);
      return &mf->kv[i];
    }
  }
  if (mf->n_kv >= LL_MAX_KV) return NULL;
  struct ll_kv *nkv = realloc(mf->kv, (mf->n_kv + 1) * sizeof *nkv);
  if (!nkv) return NULL;
  mf->kv = nkv;
  struct ll_kv *kv = &mf->kv[mf->n_kv];
  memset(kv, 0, sizeof *kv);
  if (str_set(&kv->key, key, strlen(key)) != 0) return NULL;
  mf->n_kv++;
  return kv;
}

static int set_scalar(struct ll_modelfile *mf, const char *key, int type, uint64_t u, int64_t i, double f) {
  struct ll_kv *kv = kv_slot(mf, key);
  if (!kv) return LL_ENOMEM;
  kv->value.type = type;
  if (type == LL_KV_F32 || type == LL_KV_F64)
    kv->value.v.f64 = f;
  else if (is_signed_int(type))
    kv->value.v.i64 = i;
  else
    kv->value.v.u64 = u;
  return 0;
}

int ll_mf_set_u32(struct ll_modelfile *mf, const char *key, uint32_t v) { return set_scalar(mf, key, LL_KV_U32, v, 0, 0); }
int ll_mf_set_i32(struct ll_modelfile *mf, const char *key, int32_t v) { return set_scalar(mf, key, LL_KV_I32, 0, v, 0); }
int ll_mf_set_u64(struct ll_modelfile *mf, const char *key, uint64_t v) { return set_scalar(mf, key, LL_KV_U64, v, 0, 0); }
int ll_mf_set_f32(struct ll_modelfile *mf, const char *key, float v) { return set_scalar(mf, key, LL_KV_F32, 0, 0, v); }
int ll_mf_set_bool(struct ll_modelfile *mf, const char *key, int v) { return set_scalar(mf, key, LL_KV_BOOL, v != 0, 0, 0); }

int ll_mf_set_str(struct ll_modelfile *mf, const char *key, const char *s) {
  struct ll_kv *kv = kv_slot(mf, key);
  if (!kv) return LL_ENOMEM;
  kv->value.type = LL_KV_STR;
  return str_set(&kv->value.v.str, s, strlen(s));
}

int ll_mf_set_arr(struct ll_modelfile *mf, const char *key, int elem_type, const void *data, uint64_t n) {
  if (n > LL_MAX_ARRAY) return LL_ELIMIT;
  size_t es = elem_type == LL_KV_STR ? sizeof(struct ll_str) : ll_kv_type_size(elem_type);
  if (es == 0) return LL_EINVAL;
  void *copy = calloc(n ? n : 1, es);
  if (!copy) return LL_ENOMEM;
  if (elem_type == LL_KV_STR) {
    const char *const *src = data;
    struct ll_str *dst = copy;
    for (uint64_t i = 0; i < n; i++) {
      if (str_set(&dst[i], src[i], strlen(src[i])) != 0) {
        for (uint64_t j = 0; j < i; j++) free(dst[j].ptr);
        free(copy);
        return LL_ENOMEM;
      }
    }
  } else if (n) {
    memcpy(copy, data, n * es);
  }
  struct ll_kv *kv = kv_slot(mf, key);
  if (!kv) {
    struct ll_kv_value tmp = {.type = LL_KV_ARR, .v.arr = {elem_type, n, copy}};
    ll_kv_value_free(&tmp);
    return LL_ENOMEM;
  }
  kv->value.type = LL_KV_ARR;
  kv->value.v.arr.elem_type = elem_type;
  kv->value.v.arr.n = n;
  kv->value.v.arr.data = copy;
  return 0;
}

int ll_mf_add_tensor(struct ll_modelfile *mf, const char *name, int type, int n_dims,
                     const int64_t *ne, const void *data) {
  if (n_dims < 1 || n_dims > LL_MAX_DIMS) return LL_EINVAL;
  if (mf->n_tensors >= LL_MAX_TENSORS) return LL_ELIMIT;
  if (!ll_type_traits_get(type)) return LL_EUNSUPPORTED;
  struct ll_tensor_info ti;
  memset(&ti, 0, sizeof ti);
  ti.type = type;
  ti.n_dims = n_dims;
  uint64_t rows = 1;
  for (int d = 0; d < LL_MAX_DIMS; d++) {
    ti.ne[d] = d < n_dims ? ne[d] : 1;
    if (ti.ne[d] <= 0) return LL_EINVAL;
    if (d > 0) {
      if (rows > UINT64_MAX / (uint64_t)ti.ne[d]) return LL_EOVERFLOW;
      rows *= (uint64_t)ti.ne[d];
    }
  }
  size_t rs = ll_row_size(type, ti.ne[0]);
  if (rs == 0) return LL_EINVAL;
  if (rows > LL_MAX_TENSOR_BYTES / rs) return LL_ELIMIT;
  ti.nbytes = rs * rows;
  ti.data = data;
  struct ll_tensor_info *nt = realloc(mf->tensors, (mf->n_tensors + 1) * sizeof *nt);
  if (!nt) return LL_ENOMEM;
  mf->tensors = nt;
  if (str_set(&ti.name, name, strlen(name)) != 0) return LL_ENOMEM;
  mf->tensors[mf->n_tensors++] = ti;
  return 0;
}

int ll_kv_value_copy(struct ll_kv_value *dst, const struct ll_kv_value *src) {
  memset(dst, 0, sizeof *dst);
  dst->type = src->type;
  if (src->type == LL_KV_STR) return str_set(&dst->v.str, src->v.str.ptr, src->v.str.len);
  if (src->type != LL_KV_ARR) {
    dst->v = src->v;
    return 0;
  }
  const struct ll_kv_array *a = &src->v.arr;
  size_t es = a->elem_type == LL_KV_STR   ? sizeof(struct ll_str)
              : a->elem_type == LL_KV_ARR ? sizeof(struct ll_kv_value)
                                          : ll_kv_type_size(a->elem_type);
  if (es == 0) return LL_EINVAL;
  void *data = calloc(a->n ? a->n : 1, es);
  if (!data) return LL_ENOMEM;
  dst->v.arr.elem_type = a->elem_type;
  dst->v.arr.data = data;
  dst->v.arr.n = 0;
  if (a->elem_type == LL_KV_STR) {
    const struct ll_str *s = a->data;
    struct ll_str *d = data;
    for (uint64_t i = 0; i < a->n; i++, dst->v.arr.n++)
      if (str_set(&d[i], s[i].ptr, s[i].len) != 0) goto fail;
  } else if (a->elem_type == LL_KV_ARR) {
    const struct ll_kv_value *s = a->data;
    struct ll_kv_value *d = data;
    for (uint64_t i = 0; i < a->n; i++, dst->v.arr.n++)
      if (ll_kv_value_copy(&d[i], &s[i]) != 0) goto fail;
  } else {
    memcpy(data, a->data, a->n * es);
    dst->v.arr.n = a->n;
  }
  return 0;
fail:
  ll_kv_value_free(dst);
  return LL_ENOMEM;
}
