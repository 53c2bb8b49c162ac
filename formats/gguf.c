// gguf.c - GGUF v2/v3 reader (pure parse of (buf, len), mmap open) and atomic writer.
//
// The reader trusts nothing: counts are checked against the bytes that remain (each element
// needs at least its minimum encoded size), lengths against the caps in ll_modelfile.h,
// shapes against overflow, tensor ranges against the data section. Errors name the field
// and the byte offset where it was read.
#include "ll_gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_error.h"
#include "ll_fileio.h"
#include "ll_quant.h"

// ---------------------------------------------------------------- bounded reader

struct rd {
  const unsigned char *p;
  size_t len, off;
  char *err;
  size_t errlen;
};

static int rd_need(struct rd *r, uint64_t n, const char *what) {
  if (n > r->len - r->off)
    return ll_errf(r->err, r->errlen, LL_ETRUNC, "gguf: truncated reading %s at offset %zu (need %llu bytes, %zu left)",
                   what, r->off, (unsigned long long)n, r->len - r->off);
  return 0;
}

static int rd_bytes(struct rd *r, void *dst, size_t n, const char *what) {
  int rc = rd_need(r, n, what);
  if (rc) return rc;
  memcpy(dst, r->p + r->off, n);
  r->off += n;
  return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what) { return rd_bytes(r, v, 4, what); }
static int rd_u64(struct rd *r, uint64_t *v, const char *what) { return rd_bytes(r, v, 8, what); }

// GGUF string: u64 length + bytes (no NUL). Copied NUL-terminated.
static int rd_str(struct rd *r, struct ll_str *s, uint64_t cap, const char *what) {
  uint64_t n;
  size_t at = r->off;
  int rc = rd_u64(r, &n, what);
  if (rc) return rc;
  if (n > cap)
    return ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: %s length %llu at offset %zu exceeds the limit %llu", what,
                   (unsigned long long)n, at, (unsigned long long)cap);
  if ((rc = rd_need(r, n, what))) return rc;
  s->ptr = malloc((size_t)n + 1);
  if (!s->ptr) return LL_ENOMEM;
  memcpy(s->ptr, r->p + r->off, (size_t)n);
  s->ptr[n] = 0;
  s->len = n;
  r->off += (size_t)n;
  return 0;
}

static const char *kv_type_name(int t) {
  static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  return t >= 0 && t < LL_KV_TYPE_COUNT ? names[t] : "?";
}

// Minimum encoded size of one element of a type (bounds array counts before allocating).
static uint64_t min_elem_size(int t) {
  if (t == LL_KV_STR) return 8;
  if (t == LL_KV_ARR) return 12;
  return ll_kv_type_size(t);
}

static int rd_scalar(struct rd *r, struct ll_kv_value *v, int type, const char *key) {
  unsigned char b[8];
  size_t n = ll_kv_type_size(type);
  int rc = rd_bytes(r, b, n, key);
  if (rc) return rc;
  v->type = type;
  switch (type) {
  case LL_KV_U8: v->v.u64 = b[0]; break;
  case LL_KV_I8: v->v.i64 = (int8_t)b[0]; break;
  case LL_KV_BOOL:
    if (b[0] > 1) return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: key '%s': bool value %u at offset %zu is not 0 or 1", key, b[0], r->off - 1);
    v->v.u64 = b[0];
    break;
  case LL_KV_U16: { uint16_t x; memcpy(&x, b, 2); v->v.u64 = x; break; }
  case LL_KV_I16: { int16_t x; memcpy(&x, b, 2); v->v.i64 = x; break; }
  case LL_KV_U32: { uint32_t x; memcpy(&x, b, 4); v->v.u64 = x; break; }
  case LL_KV_I32: { int32_t x; memcpy(&x, b, 4); v->v.i64 = x; break; }
  case LL_KV_F32: { float x; memcpy(&x, b, 4); v->v.f64 = x; break; }
  case LL_KV_U64: { uint64_t x; memcpy(&x, b, 8); v->v.u64 = x; break; }
  case LL_KV_I64: { int64_t x; memcpy(&x, b, 8); v->v.i64 = x; break; }
  case LL_KV_F64: { double x; memcpy(&x, b, 8); v->v.f64 = x; break; }
  default: return LL_EINVAL;
  }
  return 0;
}

static int rd_value(struct rd *r, struct ll_kv_value *v, int type, int depth, const char *key);

static int rd_array(struct rd *r, struct ll_kv_value *v, int depth, const char *key) {
  uint32_t et;
  uint64_t n;
  size_t at = r->off;
  int rc;
  if (depth >= LL_MAX_ARRAY_DEPTH)
    return ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: key '%s': arrays nested deeper than %d at offset %zu", key, LL_MAX_ARRAY_DEPTH, at);
  if ((rc = rd_u32(r, &et, "array element type")) || (rc = rd_u64(r, &n, "array length"))) return rc;
  if (et >= LL_KV_TYPE_COUNT)
    return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: key '%s': bad array element type %u at offset %zu", key, et, at);
  if (n > LL_MAX_ARRAY)
    return ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: key '%s': array length %llu at offset %zu exceeds the limit %u", key,
                   (unsigned long long)n, at + 4, LL_MAX_ARRAY);
  if (n > (r->len - r->off) / min_elem_size((int)et))
    return ll_errf(r->err, r->errlen, LL_ETRUNC, "gguf: key '%s': array of %llu %s at offset %zu does not fit in the %zu bytes left", key,
                   (unsigned long long)n, kv_type_name((int)et), at, r->len - r->off);
  v->type = LL_KV_ARR;
  v->v.arr.elem_type = (int)et;
  v->v.arr.n = 0;
  if (et == LL_KV_STR || et == LL_KV_ARR) {
    size_t es = et == LL_KV_STR ? sizeof(struct ll_str) : sizeof(struct ll_kv_value);
    v->v.arr.data = calloc(n ? n : 1, es);
    if (!v->v.arr.data) return LL_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
      if (et == LL_KV_STR)
        rc = rd_str(r, &((struct ll_str *)v->v.arr.data)[i], LL_MAX_STRING, "array string");
      else
        rc = rd_array(r, &((struct ll_kv_value *)v->v.arr.data)[i], depth + 1, key);
      v->v.arr.n = i + (rc == 0 || et == LL_KV_ARR); // nested: free what was partly built
      if (rc) return rc;
    }
  } else {
    size_t es = ll_kv_type_size((int)et);
    v->v.arr.data = malloc(n ? n * es : 1);
    if (!v->v.arr.data) return LL_ENOMEM;
    if ((rc = rd_bytes(r, v->v.arr.data, (size_t)(n * es), "array data"))) return rc;
    if (et == LL_KV_BOOL) {
      const uint8_t *b = v->v.arr.data;
      for (uint64_t i = 0; i < n; i++)
        if (b[i] > 1) return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: key '%s': bool array element %llu is %u", key, (unsigned long long)i, b[i]);
    }
    v->v.arr.n = n;
  }
  return 0;
}

static int rd_value(struct rd *r, struct ll_kv_value *v, int type, int depth, const char *key) {
  if (type == LL_KV_STR) {
    v->type = LL_KV_STR;
    return rd_str(r, &v->v.str, LL_MAX_STRING, "string value");
  }
  if (type == LL_KV_ARR) return rd_array(r, v, depth, key);
  return rd_scalar(r, v, type, key);
}

// ---------------------------------------------------------------- string hash set (duplicates)

struct strset {
  const char **slot;
  size_t cap;
};

static uint64_t str_hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h;
}

static int strset_init(struct strset *s, size_t n) {
  s->cap = 16;
  while (s->cap < n * 2) s->cap <<= 1;
  s->slot = calloc(s->cap, sizeof *s->slot);
  return s->slot ? 0 : LL_ENOMEM;
}

// 1 if inserted, 0 if already present.
static int strset_add(struct strset *s, const char *str) {
  size_t i = (size_t)str_hash(str, strlen(str)) & (s->cap - 1);
  while (s->slot[i]) {
    if (strcmp(s->slot[i], str) == 0) return 0;
    i = (i + 1) & (s->cap - 1);
  }
  s->slot[i] = str;
  return 1;
}

// ---------------------------------------------------------------- metadata section

static int parse_kvs(struct rd *r, struct ll_modelfile *mf, uint64_t n_kv, size_t n_kv_at) {
  int rc;
  if (n_kv > LL_MAX_KV)
    return ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: n_kv %llu at offset %zu exceeds the limit %u", (unsigned long long)n_kv, n_kv_at, LL_MAX_KV);
  if (n_kv > (r->len - r->off) / 13)
    return ll_errf(r->err, r->errlen, LL_ETRUNC, "gguf: n_kv %llu at offset %zu cannot fit in the %zu bytes left", (unsigned long long)n_kv,
                   n_kv_at, r->len - r->off);
  uint64_t base = mf->n_kv;
  struct ll_kv *kv = realloc(mf->kv, (size_t)(base + n_kv + 1) * sizeof *kv);
  if (!kv) return LL_ENOMEM;
  mf->kv = kv;
  struct strset seen;
  if ((rc = strset_init(&seen, (size_t)(base + n_kv)))) return rc;
  for (uint64_t i = 0; i < base; i++) strset_add(&seen, mf->kv[i].key.ptr);
  for (uint64_t i = 0; i < n_kv; i++) {
    struct ll_kv *e = &mf->kv[mf->n_kv];
    memset(e, 0, sizeof *e);
    size_t at = r->off;
    uint32_t type;
    if ((rc = rd_str(r, &e->key, LL_MAX_NAME, "key"))) break;
    mf->n_kv++; // owned from here on (freed with mf)
    if (e->key.len == 0 || strlen(e->key.ptr) != e->key.len) {
      rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: kv %llu at offset %zu: empty key or key with a NUL byte", (unsigned long long)i, at);
      break;
    }
    if (!strset_add(&seen, e->key.ptr)) {
      rc = ll_errf(r->err, r->errlen, LL_EEXIST, "gguf: duplicate key '%s' at offset %zu", e->key.ptr, at);
      break;
    }
    size_t tat = r->off;
    if ((rc = rd_u32(r, &type, "value type"))) break;
    if (type >= LL_KV_TYPE_COUNT) {
      rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: key '%s': bad value type %u at offset %zu", e->key.ptr, type, tat);
      break;
    }
    if ((rc = rd_value(r, &e->value, (int)type, 0, e->key.ptr))) break;
  }
  free(seen.slot);
  return rc;
}

// ---------------------------------------------------------------- parse

static int gguf_parse(struct rd *r, struct ll_modelfile *mf) {
  char magic[4];
  uint32_t version;
  uint64_t n_tensors, n_kv;
  int rc;
  if ((rc = rd_bytes(r, magic, 4, "magic"))) return rc;
  if (memcmp(magic, LL_GGUF_MAGIC, 4) != 0) return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: bad magic at offset 0 (not a GGUF file)");
  if ((rc = rd_u32(r, &version, "version"))) return rc;
  if (version == 1) return ll_errf(r->err, r->errlen, LL_EUNSUPPORTED, "gguf: version 1 files are not supported (re-convert to v3)");
  if (version < 2 || version > 3)
    return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: bad version %u at offset 4 (expected 2 or 3)", version);
  mf->gguf_version = version;
  if ((rc = rd_u64(r, &n_tensors, "n_tensors"))) return rc;
  size_t n_kv_at = r->off;
  if ((rc = rd_u64(r, &n_kv, "n_kv"))) return rc;
  if (n_tensors > LL_MAX_TENSORS)
    return ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: n_tensors %llu at offset 8 exceeds the limit %u", (unsigned long long)n_tensors, LL_MAX_TENSORS);
  if ((rc = parse_kvs(r, mf, n_kv, n_kv_at))) return rc;

  // Alignment: general.alignment (u32, power of two) or the default.
  uint64_t align = LL_GGUF_DEFAULT_ALIGNMENT;
  const struct ll_kv *ak = ll_mf_find_kv(mf, "general.alignment");
  if (ak) {
    if (ak->value.type != LL_KV_U32)
      return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: general.alignment has type %s, expected u32", kv_type_name(ak->value.type));
    align = ak->value.v.u64;
    if (align == 0 || (align & (align - 1)) || align > LL_GGUF_MAX_ALIGNMENT)
      return ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: general.alignment %llu is not a power of two <= %u", (unsigned long long)align,
                     LL_GGUF_MAX_ALIGNMENT);
  }
  mf->alignment = align;

  // Tensor infos: each needs at least 8 (name len) + 4 (n_dims) + 8 (ne) + 4 (type) + 8 (offset).
  if (n_tensors > (r->len - r->off) / 32)
    return ll_errf(r->err, r->errlen, LL_ETRUNC, "gguf: %llu tensor infos cannot fit in the %zu bytes left at offset %zu",
                   (unsigned long long)n_tensors, r->len - r->off, r->off);
  mf->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *mf->tensors);
  if (!mf->tensors) return LL_ENOMEM;
  struct strset seen;
  if ((rc = strset_init(&seen, (size_t)n_tensors))) return rc;
  for (uint64_t i = 0; i < n_tensors && rc == 0; i++) {
    struct ll_tensor_info *t = &mf->tensors[i];
    size_t at = r->off;
    uint32_t nd, type;
    if ((rc = rd_str(r, &t->name, LL_MAX_NAME, "tensor name"))) break;
    mf->n_tensors++;
    if (t->name.len == 0 || strlen(t->name.ptr) != t->name.len) {
      rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: tensor %llu at offset %zu: empty name or name with a NUL byte", (unsigned long long)i, at);
      break;
    }
    if (!strset_add(&seen, t->name.ptr)) {
      rc = ll_errf(r->err, r->errlen, LL_EEXIST, "gguf: duplicate tensor name '%s' at offset %zu", t->name.ptr, at);
      break;
    }
    size_t dat = r->off;
    if ((rc = rd_u32(r, &nd, "n_dims"))) break;
    if (nd < 1 || nd > LL_MAX_DIMS) {
      rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: tensor '%s': n_dims %u at offset %zu is not in 1..%d", t->name.ptr, nd, dat, LL_MAX_DIMS);
      break;
    }
    t->n_dims = (int)nd;
    uint64_t nel = 1;
    for (int d = 0; d < LL_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd && rc == 0; d++) {
      uint64_t ne;
      size_t nat = r->off;
      if ((rc = rd_u64(r, &ne, "tensor dim"))) break;
      if (ne == 0 || ne > (uint64_t)INT64_MAX) {
        rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: tensor '%s': dim %u = %llu at offset %zu is out of range", t->name.ptr, d,
                     (unsigned long long)ne, nat);
        break;
      }
      if (nel > (uint64_t)INT64_MAX / ne) {
        rc = ll_errf(r->err, r->errlen, LL_EOVERFLOW, "gguf: tensor '%s': element count overflows at dim %u (offset %zu)", t->name.ptr, d, nat);
        break;
      }
      nel *= ne;
      t->ne[d] = (int64_t)ne;
    }
    if (rc) break;
    size_t tat = r->off;
    if ((rc = rd_u32(r, &type, "tensor type"))) break;
    const struct ll_type_traits *tt = ll_type_traits_get((int)type);
    if (!tt) {
      rc = ll_errf(r->err, r->errlen, LL_EUNSUPPORTED, "gguf: tensor '%s': unknown tensor type %u at offset %zu", t->name.ptr, type, tat);
      break;
    }
    t->type = (int)type;
    if (t->ne[0] % tt->blck_size != 0) {
      rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: tensor '%s': row of %lld elements is not a multiple of the %s block size %d",
                   t->name.ptr, (long long)t->ne[0], tt->name, tt->blck_size);
      break;
    }
    uint64_t rows = nel / (uint64_t)t->ne[0];
    const uint64_t blocks = (uint64_t)t->ne[0] / (uint64_t)tt->blck_size;
    // Bound the row before multiplying: a row of 2^62 f32 elements must not wrap to 0 bytes.
    if (blocks > LL_MAX_TENSOR_BYTES / tt->type_size) {
      rc = ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: tensor '%s': a row of %lld elements exceeds the limit of %llu bytes", t->name.ptr,
                   (long long)t->ne[0], (unsigned long long)LL_MAX_TENSOR_BYTES);
      break;
    }
    uint64_t rs = blocks * tt->type_size;
    if (rows > LL_MAX_TENSOR_BYTES / rs) {
      rc = ll_errf(r->err, r->errlen, LL_ELIMIT, "gguf: tensor '%s': size exceeds the limit of %llu bytes", t->name.ptr,
                   (unsigned long long)LL_MAX_TENSOR_BYTES);
      break;
    }
    t->nbytes = rows * rs;
    size_t oat = r->off;
    if ((rc = rd_u64(r, &t->offset, "tensor offset"))) break;
    if (t->offset % align != 0) {
      rc = ll_errf(r->err, r->errlen, LL_EFORMAT, "gguf: tensor '%s': data offset %llu at offset %zu is not a multiple of the alignment %llu",
                   t->name.ptr, (unsigned long long)t->offset, oat, (unsigned long long)align);
      break;
    }
  }
  free(seen.slot);
  if (rc) return rc;

  // Data section starts at the next multiple of the alignment.
  uint64_t data_start = ((uint64_t)r->off + align - 1) / align * align;
  if (n_tensors > 0 && data_start > r->len)
    return ll_errf(r->err, r->errlen, LL_ETRUNC, "gguf: file ends at %zu before the data section at %llu", r->len, (unsigned long long)data_start);
  uint64_t data_len = data_start <= r->len ? r->len - data_start : 0;
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    struct ll_tensor_info *t = &mf->tensors[i];
    if (t->offset > data_len || t->nbytes > data_len - t->offset)
      return ll_errf(r->err, r->errlen, LL_ETRUNC,
                     "gguf: tensor '%s': data offset %llu + size %llu exceeds the data section (%llu bytes from file offset %llu)", t->name.ptr,
                     (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)data_len, (unsigned long long)data_start);
    t->data = r->p + data_start + t->offset;
  }
  return 0;
}

int ll_gguf_parse(const void *buf, size_t len, struct ll_modelfile *mf, char *err, size_t errlen) {
  struct rd r = {buf, len, 0, err, errlen};
  ll_modelfile_init(mf);
  int rc = gguf_parse(&r, mf);
  if (rc) {
    if (rc == LL_ENOMEM) ll_errf(err, errlen, rc, "gguf: out of memory at offset %zu", r.off);
    ll_modelfile_free(mf);
    return rc;
  }
  snprintf(mf->source_format, sizeof mf->source_format, "gguf");
  return 0;
}

int ll_gguf_kv_deserialize(const void *buf, size_t len, struct ll_modelfile *mf, char *err, size_t errlen) {
  struct rd r = {buf, len, 0, err, errlen};
  uint64_t n_kv;
  int rc = rd_u64(&r, &n_kv, "n_kv");
  if (rc) return rc;
  if ((rc = parse_kvs(&r, mf, n_kv, 0))) return rc;
  if (r.off != len) return ll_errf(err, errlen, LL_EFORMAT, "gguf metadata: %zu trailing bytes after %llu entries", len - r.off, (unsigned long long)n_kv);
  return 0;
}

int ll_gguf_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen) {
  ll_modelfile_init(mf);
  void *map;
  size_t len;
  int mrc = ll_map_file(path, &map, &len, err, errlen);
  if (mrc) return mrc;
  char e2[384] = "";
  int rc = ll_gguf_parse(map, len, mf, e2, sizeof e2);
  if (rc) {
    munmap(map, len);
    return ll_errf(err, errlen, rc, "%s: %s", path, e2);
  }
  mf->backing = map;
  mf->backing_len = len;
  mf->backing_is_mmap = 1;
  return 0;
}

// ---------------------------------------------------------------- writer

struct wb {
  unsigned char *p;
  size_t len, cap;
  int oom;
};

static void wb_put(struct wb *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->len + n > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + n) nc *= 2;
    unsigned char *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
}
static void wb_u32(struct wb *b, uint32_t v) { wb_put(b, &v, 4); }
static void wb_u64(struct wb *b, uint64_t v) { wb_put(b, &v, 8); }
static void wb_str(struct wb *b, const struct ll_str *s) {
  wb_u64(b, s->len);
  wb_put(b, s->ptr, (size_t)s->len);
}

static void wb_scalar(struct wb *b, int type, const struct ll_kv_value *v) {
  switch (type) {
  case LL_KV_U8: case LL_KV_BOOL: { uint8_t x = (uint8_t)v->v.u64; wb_put(b, &x, 1); break; }
  case LL_KV_I8: { int8_t x = (int8_t)v->v.i64; wb_put(b, &x, 1); break; }
  case LL_KV_U16: { uint16_t x = (uint16_t)v->v.u64; wb_put(b, &x, 2); break; }
  case LL_KV_I16: { int16_t x = (int16_t)v->v.i64; wb_put(b, &x, 2); break; }
  case LL_KV_U32: { uint32_t x = (uint32_t)v->v.u64; wb_put(b, &x, 4); break; }
  case LL_KV_I32: { int32_t x = (int32_t)v->v.i64; wb_put(b, &x, 4); break; }
  case LL_KV_F32: { float x = (float)v->v.f64; wb_put(b, &x, 4); break; }
  case LL_KV_U64: wb_put(b, &v->v.u64, 8); break;
  case LL_KV_I64: wb_put(b, &v->v.i64, 8); break;
  case LL_KV_F64: wb_put(b, &v->v.f64, 8); break;
  default: break;
  }
}

static void wb_value(struct wb *b, const struct ll_kv_value *v) {
  if (v->type == LL_KV_STR) {
    wb_str(b, &v->v.str);
  } else if (v->type == LL_KV_ARR) {
    const struct ll_kv_array *a = &v->v.arr;
    wb_u32(b, (uint32_t)a->elem_type);
    wb_u64(b, a->n);
    if (a->elem_type == LL_KV_STR) {
      for (uint64_t i = 0; i < a->n; i++) wb_str(b, &((const struct ll_str *)a->data)[i]);
    } else if (a->elem_type == LL_KV_ARR) {
      for (uint64_t i = 0; i < a->n; i++) wb_value(b, &((const struct ll_kv_value *)a->data)[i]);
    } else if (a->n) {
      wb_put(b, a->data, (size_t)(a->n * ll_kv_type_size(a->elem_type))); // packed as read
    }
  } else {
    wb_scalar(b, v->type, v);
  }
}

static void wb_kvs(struct wb *b, const struct ll_modelfile *mf) {
  for (uint64_t i = 0; i < mf->n_kv; i++) {
    wb_str(b, &mf->kv[i].key);
    wb_u32(b, (uint32_t)mf->kv[i].value.type);
    wb_value(b, &mf->kv[i].value);
  }
}

int ll_gguf_kv_serialize(const struct ll_modelfile *mf, void **out, size_t *out_len) {
  struct wb b = {0};
  wb_u64(&b, mf->n_kv);
  wb_kvs(&b, mf);
  if (b.oom) {
    free(b.p);
    return LL_ENOMEM;
  }
  *out = b.p;
  *out_len = b.len;
  return 0;
}

int ll_gguf_write(const char *path, const struct ll_modelfile *mf, char *err, size_t errlen) {
  uint64_t align = mf->alignment ? mf->alignment : LL_GGUF_DEFAULT_ALIGNMENT;
  const struct ll_kv *ak = ll_mf_find_kv(mf, "general.alignment");
  if (ak && ak->value.type == LL_KV_U32) align = ak->value.v.u64;
  if (align == 0 || (align & (align - 1)) || align > LL_GGUF_MAX_ALIGNMENT)
    return ll_errf(err, errlen, LL_EINVAL, "%s: alignment %llu is not a power of two", path, (unsigned long long)align);

  struct wb b = {0};
  wb_put(&b, LL_GGUF_MAGIC, 4);
  wb_u32(&b, 3);
  wb_u64(&b, mf->n_tensors);
  wb_u64(&b, mf->n_kv);
  wb_kvs(&b, mf);
  uint64_t off = 0;
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    if (!t->data && t->nbytes) {
      free(b.p);
      return ll_errf(err, errlen, LL_EINVAL, "%s: tensor '%s' has no data", path, t->name.ptr);
    }
    wb_str(&b, &t->name);
    wb_u32(&b, (uint32_t)t->n_dims);
    for (int d = 0; d < t->n_dims; d++) wb_u64(&b, (uint64_t)t->ne[d]);
    wb_u32(&b, (uint32_t)t->type);
    wb_u64(&b, off);
    off = (off + t->nbytes + align - 1) / align * align;
  }
  static const unsigned char zeros[LL_GGUF_MAX_ALIGNMENT];
  // Vocabulary-only files (no tensors) end right after the metadata, as llama.cpp writes them.
  if (mf->n_tensors > 0) wb_put(&b, zeros, (size_t)((align - b.len % align) % align));
  if (b.oom) {
    free(b.p);
    return ll_errf(err, errlen, LL_ENOMEM, "%s: out of memory building the header", path);
  }

  size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  if (!tmp) {
    free(b.p);
    return LL_ENOMEM;
  }
  snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
  ll_tmp_sweep(path); // earlier writes of this path cut short (kill -9) left theirs
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(b.p);
    free(tmp);
    return ll_errf(err, errlen, LL_EIO, "%s: cannot create temp file: %s", path, strerror(e));
  }
  const int hold = ll_tmp_hold(fd); // until renamed: a sweep elsewhere leaves it alone
  int ok = ll_write_all(fd, b.p, b.len) == 0;
  free(b.p);
  for (uint64_t i = 0; ok && i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    ok = ll_write_all(fd, t->data, (size_t)t->nbytes) == 0;
    size_t tpad = (size_t)((align - t->nbytes % align) % align);
    if (ok && i + 1 < mf->n_tensors) ok = ll_write_all(fd, zeros, tpad) == 0;
  }
  int e = errno;
  if (ok && fsync(fd) != 0) ok = 0, e = errno;
  if (ok) fchmod(fd, 0644);
  if (close(fd) != 0 && ok) ok = 0, e = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
  if (!ok) {
    unlink(tmp);
    ll_tmp_release(hold);
    free(tmp);
    return ll_errf(err, errlen, LL_EIO, "%s: write failed: %s", path, strerror(e));
  }
  ll_tmp_release(hold);
  free(tmp);
  if (ll_fsync_parent_dir(path) != 0) return ll_errf(err, errlen, LL_EIO, "%s: fsync of the directory failed: %s", path, strerror(errno));
  return 0;
}
