// ckpt.c - the .ckpt container: zstd shards + JSON manifest + atomic publish.
// Format reference: man/llsrv-ckpt.5. Interface: ll_ckpt.h.
#include "ll_ckpt.h"
#include "ll_fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_quant.h"

#ifndef LL_VERSION
#define LL_VERSION "0"
#endif

// Header layout (little-endian), LL_CKPT_HEADER_SIZE bytes:
//   0 magic[8]  8 u32 version  12 u32 header_size  16 u64 manifest_offset
//   24 u64 manifest_length  32 u64 file_size  40 u64 flags  48 sha256(manifest)[32]
//   80 reserved[16] (zero)  96 sha256(bytes 0..95)[32]
#define HDR_SHA_AT 96u

// A zstd block of at most 128 KiB can be stored as a 4-byte RLE block, so no frame expands
// by more than this factor; used to bound raw sizes read from a manifest before allocating.
#define ZSTD_MAX_RATIO 32768ull

// ---------------------------------------------------------------- small helpers

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static int sha256(const void *data, size_t len, unsigned char out[32]) {
  unsigned int n = 0;
  return EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32 ? 0 : LL_ENOMEM;
}

static void hex32(const unsigned char d[32], char out[65]) {
  static const char h[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = h[d[i] >> 4];
    out[2 * i + 1] = h[d[i] & 15];
  }
  out[64] = 0;
}

static int unhex32(const char *s, size_t len, unsigned char out[32]) {
  if (len != 64) return -1;
  for (int i = 0; i < 64; i++) {
    int c = s[i], v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else return -1;
    if (i & 1) out[i / 2] |= (unsigned char)v;
    else out[i / 2] = (unsigned char)(v << 4);
  }
  return 0;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
  char *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) return -2; // short file
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

// ---------------------------------------------------------------- roles

static const char *const role_names[LL_CKPT_ROLE_COUNT] = {"weight", "lora_a", "lora_b", "adam_m", "adam_v"};

const char *ll_ckpt_role_name(int role) {
  return role >= 0 && role < LL_CKPT_ROLE_COUNT ? role_names[role] : "?";
}

int ll_ckpt_role_from_name(const char *name) {
  for (int i = 0; i < LL_CKPT_ROLE_COUNT; i++)
    if (strcmp(name, role_names[i]) == 0) return i;
  return -1;
}

int ll_ckpt_role_from_tensor_name(const char *name) {
  size_t n = strlen(name);
  for (int i = 1; i < LL_CKPT_ROLE_COUNT; i++) {
    size_t k = strlen(role_names[i]);
    if (n > k + 1 && name[n - k - 1] == '.' && strcmp(name + n - k, role_names[i]) == 0) return i;
  }
  return LL_CKPT_ROLE_WEIGHT;
}

int ll_ckpt_is_ckpt(const void *buf, size_t len) {
  return len >= 8 && memcmp(buf, LL_CKPT_MAGIC, 8) == 0;
}

// ---------------------------------------------------------------- manifest parse

void ll_ckpt_manifest_free(struct ll_ckpt_manifest *m) {
  if (!m) return;
  free(m->arch);
  free(m->name);
  free(m->tokenizer_model);
  free(m->source_sha256);
  free(m->source_format);
  free(m->converter);
  free(m->created);
  free(m->note);
  if (m->tensors)
    for (uint64_t i = 0; i < m->n_tensors; i++) free(m->tensors[i].name);
  free(m->tensors);
  free(m->shards);
  memset(m, 0, sizeof *m);
}

struct mp {
  char *err;
  size_t errlen;
};

// Integer member `key` of obj in [0, max]; absent: *out = dflt unless required.
static int mp_uint(struct mp *p, json_t *obj, const char *where, const char *key, uint64_t max, int required,
                   uint64_t dflt, uint64_t *out) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) {
    if (required) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: missing \"%s\"", where, key);
    *out = dflt;
    return 0;
  }
  if (!json_is_integer(v))
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"%s\" is not an integer", where, key);
  json_int_t x = json_integer_value(v);
  if (x < 0 || (uint64_t)x > max)
    return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: %s: \"%s\" = %lld outside [0, %llu]", where, key,
                   (long long)x, (unsigned long long)max);
  *out = (uint64_t)x;
  return 0;
}

// Optional signed summary number in [-1, 2^40]; absent -> -1.
static int mp_opt_int(struct mp *p, json_t *obj, const char *where, const char *key, int64_t *out) {
  json_t *v = json_object_get(obj, key);
  *out = -1;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v))
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"%s\" is not an integer", where, key);
  json_int_t x = json_integer_value(v);
  if (x < -1 || x > (1ll << 40))
    return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: %s: \"%s\" = %lld out of range", where, key,
                   (long long)x);
  *out = x;
  return 0;
}

// Optional string (no inner NUL, <= LL_CKPT_MAX_STR bytes) -> malloc'ed copy or NULL.
static int mp_opt_str(struct mp *p, json_t *obj, const char *where, const char *key, char **out) {
  json_t *v = json_object_get(obj, key);
  *out = NULL;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v))
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"%s\" is not a string", where, key);
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  if (n > LL_CKPT_MAX_STR || strlen(s) != n)
    return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: %s: \"%s\" is too long or contains NUL", where, key);
  *out = strdup(s);
  if (!*out) return ll_errf(p->err, p->errlen, LL_ENOMEM, "ckpt manifest: out of memory");
  return 0;
}

static int mp_sha(struct mp *p, json_t *obj, const char *where, const char *key, unsigned char out[32]) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_string(v) || unhex32(json_string_value(v), json_string_length(v), out) != 0)
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"%s\" is not 64 lowercase hex digits", where,
                   key);
  return 0;
}

struct name_ref {
  const char *name;
  uint64_t idx;
};
static int name_ref_cmp(const void *a, const void *b) {
  return strcmp(((const struct name_ref *)a)->name, ((const struct name_ref *)b)->name);
}

static int parse_json(struct mp *p, json_t *root, struct ll_ckpt_manifest *m) {
  int rc;
  uint64_t u;
  if (!json_is_object(root)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: not a JSON object");
  json_t *fmt = json_object_get(root, "format");
  if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "llsrv-ckpt") != 0)
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: \"format\" is not \"llsrv-ckpt\"");
  if ((rc = mp_uint(p, root, "top level", "version", UINT32_MAX, 1, 0, &u))) return rc;
  if (u != LL_CKPT_VERSION)
    return ll_errf(p->err, p->errlen, LL_EUNSUPPORTED, "ckpt manifest: version %llu not supported (expected %u)",
                   (unsigned long long)u, LL_CKPT_VERSION);
  m->version = (uint32_t)u;

  json_t *gg = json_object_get(root, "gguf");
  if (!json_is_object(gg)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: missing object \"gguf\"");
  if ((rc = mp_uint(p, gg, "gguf", "version", 3, 1, 0, &u))) return rc;
  if (u < 1) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: gguf: \"version\" must be 1..3");
  m->gguf_version = (uint32_t)u;
  if ((rc = mp_uint(p, gg, "gguf", "alignment", 1u << 20, 1, 0, &u))) return rc;
  if (u == 0 || (u & (u - 1)))
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: gguf: \"alignment\" %llu is not a power of two",
                   (unsigned long long)u);
  m->gguf_alignment = u;

  json_t *model = json_object_get(root, "model");
  if (model && !json_is_null(model)) {
    if (!json_is_object(model)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: \"model\" is not an object");
    if ((rc = mp_opt_str(p, model, "model", "arch", &m->arch))) return rc;
    if ((rc = mp_opt_str(p, model, "model", "name", &m->name))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_layer", &m->n_layer))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_embd", &m->n_embd))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_head", &m->n_head))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_head_kv", &m->n_head_kv))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_ff", &m->n_ff))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_ctx_train", &m->n_ctx))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "n_vocab", &m->n_vocab))) return rc;
    if ((rc = mp_opt_int(p, model, "model", "file_type", &m->file_type))) return rc;
  } else {
    m->n_layer = m->n_embd = m->n_head = m->n_head_kv = m->n_ff = m->n_ctx = m->n_vocab = m->file_type = -1;
  }
  json_t *tok = json_object_get(root, "tokenizer");
  m->n_tokens = m->bos_id = m->eos_id = -1;
  if (tok && !json_is_null(tok)) {
    if (!json_is_object(tok)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: \"tokenizer\" is not an object");
    if ((rc = mp_opt_str(p, tok, "tokenizer", "model", &m->tokenizer_model))) return rc;
    if ((rc = mp_opt_int(p, tok, "tokenizer", "n_tokens", &m->n_tokens))) return rc;
    if ((rc = mp_opt_int(p, tok, "tokenizer", "bos_id", &m->bos_id))) return rc;
    if ((rc = mp_opt_int(p, tok, "tokenizer", "eos_id", &m->eos_id))) return rc;
  }
  json_t *prov = json_object_get(root, "provenance");
  if (prov && !json_is_null(prov)) {
    if (!json_is_object(prov)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: \"provenance\" is not an object");
    if ((rc = mp_opt_str(p, prov, "provenance", "source_sha256", &m->source_sha256))) return rc;
    if ((rc = mp_opt_str(p, prov, "provenance", "source_format", &m->source_format))) return rc;
    if ((rc = mp_opt_str(p, prov, "provenance", "converter", &m->converter))) return rc;
    if ((rc = mp_opt_str(p, prov, "provenance", "created", &m->created))) return rc;
    if ((rc = mp_opt_str(p, prov, "provenance", "note", &m->note))) return rc;
  }
  json_t *tr = json_object_get(root, "training");
  if (tr && !json_is_null(tr)) {
    if (!json_is_object(tr)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: \"training\" is not an object");
    m->training.present = 1;
    if ((rc = mp_uint(p, tr, "training", "step", INT64_MAX, 1, 0, &m->training.step))) return rc;
    if ((rc = mp_uint(p, tr, "training", "data_position", INT64_MAX, 0, 0, &m->training.data_position))) return rc;
    json_t *lr = json_object_get(tr, "lr");
    if (!json_is_number(lr) || !(json_number_value(lr) >= 0.0) || json_number_value(lr) > 1e6)
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: training: \"lr\" is not a number in [0, 1e6]");
    m->training.lr = json_number_value(lr);
    // seed is a decimal string: JSON integers stop at 2^63.
    json_t *sd = json_object_get(tr, "seed");
    if (sd && !json_is_null(sd)) {
      const char *s = json_string_value(sd);
      char *end = NULL;
      if (!s || !*s || json_string_length(sd) > 20 || s[0] < '0' || s[0] > '9')
        return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: training: \"seed\" is not a decimal string");
      errno = 0;
      unsigned long long x = strtoull(s, &end, 10);
      if (errno || *end)
        return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: training: \"seed\" is not a decimal u64");
      m->training.seed = x;
    }
  }

  // ---- shards
  json_t *sh = json_object_get(root, "shards");
  if (!json_is_array(sh)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: missing array \"shards\"");
  size_t ns = json_array_size(sh);
  if (ns < 1 || ns > LL_CKPT_MAX_SHARDS)
    return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: %zu shards (must be 1..%u)", ns, LL_CKPT_MAX_SHARDS);
  m->shards = calloc(ns, sizeof *m->shards);
  if (!m->shards) return ll_errf(p->err, p->errlen, LL_ENOMEM, "ckpt manifest: out of memory");
  m->n_shards = (uint32_t)ns;
  uint64_t prev_end = LL_CKPT_HEADER_SIZE, data = 0;
  int n_meta = 0;
  for (size_t i = 0; i < ns; i++) {
    char where[48];
    snprintf(where, sizeof where, "shard %zu", i);
    json_t *o = json_array_get(sh, i);
    struct ll_ckpt_shard_entry *s = &m->shards[i];
    if (!json_is_object(o)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s is not an object", where);
    json_t *kind = json_object_get(o, "kind");
    const char *k = json_string_value(kind);
    if (k && strcmp(k, "metadata") == 0) s->kind = LL_CKPT_SHARD_METADATA, n_meta++;
    else if (k && strcmp(k, "tensors") == 0) s->kind = LL_CKPT_SHARD_TENSORS;
    else return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"kind\" is not \"metadata\" or \"tensors\"", where);
    if ((rc = mp_uint(p, o, where, "offset", INT64_MAX, 1, 0, &s->offset))) return rc;
    if ((rc = mp_uint(p, o, where, "csize", INT64_MAX, 1, 0, &s->csize))) return rc;
    if ((rc = mp_uint(p, o, where, "rsize", LL_CKPT_MAX_SHARD_RAW, 1, 0, &s->rsize))) return rc;
    if ((rc = mp_sha(p, o, where, "csha256", s->csha256))) return rc;
    if ((rc = mp_sha(p, o, where, "rsha256", s->rsha256))) return rc;
    if (s->csize == 0)
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"csize\" is 0", where);
    if (s->offset != prev_end)
      return ll_errf(p->err, p->errlen, LL_EFORMAT,
                     "ckpt manifest: %s: \"offset\" %llu is not %llu (shards are contiguous from the header on)", where,
                     (unsigned long long)s->offset, (unsigned long long)prev_end);
    if (s->csize > INT64_MAX - s->offset)
      return ll_errf(p->err, p->errlen, LL_EOVERFLOW, "ckpt manifest: %s: offset + csize overflows", where);
    // Bound the raw size by what zstd can expand csize bytes into, before anyone allocates it.
    if (s->rsize / ZSTD_MAX_RATIO > s->csize)
      return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: %s: rsize %llu cannot come from %llu compressed bytes",
                     where, (unsigned long long)s->rsize, (unsigned long long)s->csize);
    prev_end = s->offset + s->csize;
    if (s->kind == LL_CKPT_SHARD_TENSORS) {
      if (s->rsize % LL_CKPT_ALIGN)
        return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: rsize %llu is not a multiple of %u", where,
                       (unsigned long long)s->rsize, LL_CKPT_ALIGN);
      s->raw_offset = data;
      data += s->rsize;
      if (data > LL_MAX_TENSOR_BYTES)
        return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: tensor data exceeds %llu bytes",
                       (unsigned long long)LL_MAX_TENSOR_BYTES);
    }
  }
  m->data_size = data;
  json_t *md = json_object_get(root, "metadata");
  if (!json_is_object(md)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: missing object \"metadata\"");
  json_t *enc = json_object_get(md, "encoding");
  if (!json_is_string(enc) || strcmp(json_string_value(enc), "gguf-kv-v3") != 0)
    return ll_errf(p->err, p->errlen, LL_EUNSUPPORTED, "ckpt manifest: metadata: \"encoding\" is not \"gguf-kv-v3\"");
  if ((rc = mp_uint(p, md, "metadata", "shard", ns - 1, 1, 0, &u))) return rc;
  m->metadata_shard = (uint32_t)u;
  if (n_meta != 1 || m->shards[u].kind != LL_CKPT_SHARD_METADATA)
    return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: metadata: \"shard\" %llu is not the one metadata shard",
                   (unsigned long long)u);
  if ((rc = mp_uint(p, md, "metadata", "n_kv", LL_MAX_KV, 1, 0, &m->n_kv))) return rc;

  // ---- tensors
  json_t *ts = json_object_get(root, "tensors");
  if (!json_is_array(ts)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: missing array \"tensors\"");
  size_t nt = json_array_size(ts);
  if (nt > LL_MAX_TENSORS)
    return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: %zu tensors exceeds %u", nt, LL_MAX_TENSORS);
  m->tensors = calloc(nt ? nt : 1, sizeof *m->tensors);
  if (!m->tensors) return ll_errf(p->err, p->errlen, LL_ENOMEM, "ckpt manifest: out of memory");
  m->n_tensors = 0;
  for (uint32_t i = 0; i < ns; i++) m->shards[i].first_tensor = (uint32_t)nt;
  uint32_t prev_shard = 0;
  uint64_t prev_tend = 0;
  for (size_t i = 0; i < nt; i++) {
    char where[64];
    snprintf(where, sizeof where, "tensor %zu", i);
    json_t *o = json_array_get(ts, i);
    struct ll_ckpt_tensor_entry *t = &m->tensors[i];
    if (!json_is_object(o)) return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s is not an object", where);
    json_t *nm = json_object_get(o, "name");
    if (!json_is_string(nm) || json_string_length(nm) == 0 || json_string_length(nm) > LL_MAX_NAME ||
        strlen(json_string_value(nm)) != json_string_length(nm))
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: %s: \"name\" missing, empty, too long or with NUL", where);
    t->name = strdup(json_string_value(nm));
    if (!t->name) return ll_errf(p->err, p->errlen, LL_ENOMEM, "ckpt manifest: out of memory");
    m->n_tensors++;
    const char *tname = t->name;
    json_t *dt = json_object_get(o, "dtype");
    int type = json_is_string(dt) ? ll_type_from_name(json_string_value(dt)) : -1;
    const struct ll_type_traits *tt = type >= 0 ? ll_type_traits_get(type) : NULL;
    if (!tt || tt->blck_size <= 0)
      return ll_errf(p->err, p->errlen, LL_EUNSUPPORTED, "ckpt manifest: tensor '%s': unknown \"dtype\"", tname);
    t->type = type;
    json_t *role = json_object_get(o, "role");
    t->role = LL_CKPT_ROLE_WEIGHT;
    if (role && !json_is_null(role)) {
      t->role = json_is_string(role) ? ll_ckpt_role_from_name(json_string_value(role)) : -1;
      if (t->role < 0)
        return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s': unknown \"role\"", tname);
    }
    json_t *shape = json_object_get(o, "shape");
    size_t nd = json_array_size(shape);
    if (!json_is_array(shape) || nd < 1 || nd > LL_MAX_DIMS)
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s': \"shape\" must have 1..%d dims", tname,
                     LL_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t rows = 1;
    for (int d = 0; d < LL_MAX_DIMS; d++) {
      t->ne[d] = 1;
      if ((size_t)d >= nd) continue;
      json_t *e = json_array_get(shape, (size_t)d);
      if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > (1ll << 40))
        return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s': shape[%d] is not in [1, 2^40]", tname, d);
      t->ne[d] = json_integer_value(e);
      if (d > 0) {
        if (rows > LL_MAX_TENSOR_BYTES / (uint64_t)t->ne[d])
          return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: tensor '%s': shape too large", tname);
        rows *= (uint64_t)t->ne[d];
      }
    }
    size_t rs = ll_row_size(type, t->ne[0]);
    if (rs == 0)
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s': shape[0] %lld is not a multiple of the %s block",
                     tname, (long long)t->ne[0], ll_type_name(type));
    if (rows > LL_MAX_TENSOR_BYTES / rs)
      return ll_errf(p->err, p->errlen, LL_ELIMIT, "ckpt manifest: tensor '%s': more than %llu bytes", tname,
                     (unsigned long long)LL_MAX_TENSOR_BYTES);
    if ((rc = mp_uint(p, o, tname, "shard", ns - 1, 1, 0, &u))) return rc;
    t->shard = (uint32_t)u;
    if ((rc = mp_uint(p, o, tname, "offset", LL_CKPT_MAX_SHARD_RAW, 1, 0, &t->offset))) return rc;
    if ((rc = mp_uint(p, o, tname, "size", LL_MAX_TENSOR_BYTES, 1, 0, &t->size))) return rc;
    const struct ll_ckpt_shard_entry *s = &m->shards[t->shard];
    if (t->size != rs * rows)
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s': \"size\" %llu but %s %s needs %llu", tname,
                     (unsigned long long)t->size, ll_type_name(type), "shape", (unsigned long long)(rs * rows));
    if (s->kind != LL_CKPT_SHARD_TENSORS)
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s': shard %u is not a tensor shard", tname, t->shard);
    if (t->offset % LL_CKPT_ALIGN || t->size > s->rsize || t->offset > s->rsize - t->size)
      return ll_errf(p->err, p->errlen, LL_EFORMAT,
                     "ckpt manifest: tensor '%s': offset %llu + size %llu misaligned or past shard %u's %llu raw bytes",
                     tname, (unsigned long long)t->offset, (unsigned long long)t->size, t->shard,
                     (unsigned long long)s->rsize);
    // Tensors are listed in (shard, offset) order without overlap: one linear check.
    if (i > 0 && (t->shard < prev_shard || (t->shard == prev_shard && t->offset < prev_tend)))
      return ll_errf(p->err, p->errlen, LL_EFORMAT, "ckpt manifest: tensor '%s' overlaps or precedes the previous tensor",
                     tname);
    prev_shard = t->shard;
    prev_tend = t->offset + t->size;
    if (m->shards[t->shard].first_tensor == nt) m->shards[t->shard].first_tensor = (uint32_t)i;
  }
  if (nt > 1) {
    struct name_ref *refs = malloc(nt * sizeof *refs);
    if (!refs) return ll_errf(p->err, p->errlen, LL_ENOMEM, "ckpt manifest: out of memory");
    for (size_t i = 0; i < nt; i++) refs[i] = (struct name_ref){m->tensors[i].name, i};
    qsort(refs, nt, sizeof *refs, name_ref_cmp);
    rc = 0;
    for (size_t i = 1; i < nt && !rc; i++)
      if (strcmp(refs[i - 1].name, refs[i].name) == 0)
        rc = ll_errf(p->err, p->errlen, LL_EEXIST, "ckpt manifest: duplicate tensor name '%s'", refs[i].name);
    free(refs);
    if (rc) return rc;
  }
  return 0;
}

int ll_ckpt_parse_manifest(const char *buf, size_t len, struct ll_ckpt_manifest *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (len > LL_CKPT_MAX_MANIFEST)
    return ll_errf(err, errlen, LL_ELIMIT, "ckpt manifest: %zu bytes exceeds %u", len, LL_CKPT_MAX_MANIFEST);
  json_error_t je;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return ll_errf(err, errlen, LL_EFORMAT, "ckpt manifest: JSON error at line %d column %d: %s", je.line, je.column,
                   je.text);
  struct mp p = {err, errlen};
  int rc = parse_json(&p, root, out);
  json_decref(root);
  return rc;
}

// ---------------------------------------------------------------- writer

void ll_ckpt_write_opts_init(struct ll_ckpt_write_opts *o) {
  memset(o, 0, sizeof *o);
  o->zstd_level = 3;
  o->shard_target = LL_CKPT_DEFAULT_SHARD;
  o->n_threads = 1;
}

struct wshard {
  int kind;
  uint64_t t0, t1;        // tensor index range [t0, t1)
  uint64_t rsize, raw_offset;
  const void *raw;        // metadata shard: the encoded blob; tensors: NULL (built by the worker)
  unsigned char *cbuf;
  size_t csize;
  uint64_t offset;
  unsigned char csha[32], rsha[32];
  int rc;
  char err[256];
};

struct wctx {
  const struct ll_modelfile *mf;
  const uint64_t *toff;   // per tensor: offset within its shard
  int level;
};

// Compression pipeline: workers claim shards in order and compress them while the calling
// thread writes finished shards in file order. A worker may run at most `window` shards
// ahead of the writer, which bounds memory at about window x (raw + compressed) shard sizes.
struct wpipe {
  struct wctx *ctx;
  struct wshard *sh;
  uint64_t ns, next, written, window;
  int abort;
  unsigned char *done; // per shard: compressed (or failed)
  pthread_mutex_t mu;
  pthread_cond_t ready, space;
};

static int compress_shard(struct wctx *c, struct wshard *s) {
  unsigned char *raw = NULL;
  const unsigned char *src = s->raw;
  if (!src) {
    // Assemble the shard's raw bytes: tensors at their 64-aligned offsets, zero padding.
    raw = calloc(1, s->rsize ? s->rsize : 1);
    if (!raw) return ll_errf(s->err, sizeof s->err, LL_ENOMEM, "out of memory for %llu raw bytes",
                             (unsigned long long)s->rsize);
    for (uint64_t i = s->t0; i < s->t1; i++)
      memcpy(raw + c->toff[i], c->mf->tensors[i].data, c->mf->tensors[i].nbytes);
    src = raw;
  }
  int rc = sha256(src, s->rsize, s->rsha);
  size_t bound = ZSTD_compressBound(s->rsize);
  s->cbuf = rc ? NULL : malloc(bound);
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  if (rc || !s->cbuf || !cc) {
    free(raw);
    ZSTD_freeCCtx(cc);
    return ll_errf(s->err, sizeof s->err, LL_ENOMEM, "out of memory compressing");
  }
  ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, c->level);
  ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
  size_t n = ZSTD_compress2(cc, s->cbuf, bound, src, s->rsize);
  ZSTD_freeCCtx(cc);
  free(raw);
  if (ZSTD_isError(n)) return ll_errf(s->err, sizeof s->err, LL_EIO, "zstd: %s", ZSTD_getErrorName(n));
  s->csize = n;
  if (sha256(s->cbuf, n, s->csha)) return ll_errf(s->err, sizeof s->err, LL_ENOMEM, "sha256 failed");
  return 0;
}

static void *compress_thread(void *arg) {
  struct wpipe *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->abort && p->next < p->ns && p->next >= p->written + p->window) pthread_cond_wait(&p->space, &p->mu);
    if (p->abort || p->next >= p->ns) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    uint64_t i = p->next++;
    pthread_mutex_unlock(&p->mu);
    p->sh[i].rc = compress_shard(p->ctx, &p->sh[i]);
    pthread_mutex_lock(&p->mu);
    p->done[i] = 1;
    pthread_cond_broadcast(&p->ready);
    pthread_mutex_unlock(&p->mu);
  }
}

static json_t *jint_or_null(const struct ll_modelfile *mf, const char *key, int arch) {
  int64_t v;
  int rc = arch ? ll_mf_get_arch_int(mf, key, &v) : ll_mf_get_int(mf, key, &v);
  return rc == 0 ? json_integer(v) : json_null();
}

static json_t *jstr_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }

static json_t *build_manifest(const struct ll_modelfile *mf, const struct ll_ckpt_write_opts *o,
                              const struct wshard *sh, uint64_t ns, const uint64_t *tshard,
                              const uint64_t *toff, char *err, size_t errlen) {
  json_t *root = json_object();
  json_object_set_new(root, "format", json_string("llsrv-ckpt"));
  json_object_set_new(root, "version", json_integer(LL_CKPT_VERSION));
  json_t *gg = json_object();
  json_object_set_new(gg, "version", json_integer(mf->gguf_version));
  json_object_set_new(gg, "alignment", json_integer((json_int_t)mf->alignment));
  json_object_set_new(root, "gguf", gg);

  const char *s = NULL;
  json_t *model = json_object();
  json_object_set_new(model, "arch", ll_mf_get_str(mf, "general.architecture", &s) == 0 ? json_string(s) : json_null());
  s = NULL;
  json_object_set_new(model, "name", ll_mf_get_str(mf, "general.name", &s) == 0 ? json_string(s) : json_null());
  json_object_set_new(model, "n_layer", jint_or_null(mf, "block_count", 1));
  json_object_set_new(model, "n_embd", jint_or_null(mf, "embedding_length", 1));
  json_object_set_new(model, "n_head", jint_or_null(mf, "attention.head_count", 1));
  json_object_set_new(model, "n_head_kv", jint_or_null(mf, "attention.head_count_kv", 1));
  json_object_set_new(model, "n_ff", jint_or_null(mf, "feed_forward_length", 1));
  json_object_set_new(model, "n_ctx_train", jint_or_null(mf, "context_length", 1));
  json_t *nv = jint_or_null(mf, "vocab_size", 1);
  const struct ll_kv_array *toks = NULL;
  int have_toks = ll_mf_get_arr(mf, "tokenizer.ggml.tokens", &toks) == 0;
  if (json_is_null(nv) && have_toks) {
    json_decref(nv);
    nv = json_integer((json_int_t)toks->n);
  }
  json_object_set_new(model, "n_vocab", nv);
  json_object_set_new(model, "file_type", jint_or_null(mf, "general.file_type", 0));
  json_object_set_new(root, "model", model);

  json_t *tok = json_object();
  s = NULL;
  json_object_set_new(tok, "model", ll_mf_get_str(mf, "tokenizer.ggml.model", &s) == 0 ? json_string(s) : json_null());
  s = NULL;
  json_object_set_new(tok, "pre", ll_mf_get_str(mf, "tokenizer.ggml.pre", &s) == 0 ? json_string(s) : json_null());
  json_object_set_new(tok, "n_tokens", have_toks ? json_integer((json_int_t)toks->n) : json_null());
  json_object_set_new(tok, "bos_id", jint_or_null(mf, "tokenizer.ggml.bos_token_id", 0));
  json_object_set_new(tok, "eos_id", jint_or_null(mf, "tokenizer.ggml.eos_token_id", 0));
  json_object_set_new(root, "tokenizer", tok);

  json_t *prov = json_object();
  char conv[64], when[32];
  snprintf(conv, sizeof conv, "llsrv %s", LL_VERSION);
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  json_object_set_new(prov, "source_sha256", jstr_or_null(o->source_sha256 ? o->source_sha256 : mf->source_sha256));
  json_object_set_new(prov, "source_format", jstr_or_null(o->source_format ? o->source_format : mf->source_format));
  json_object_set_new(prov, "converter", json_string(o->converter ? o->converter : conv));
  json_object_set_new(prov, "created", json_string(when));
  json_object_set_new(prov, "note", jstr_or_null(o->note));
  json_object_set_new(root, "provenance", prov);

  if (o->training && o->training->present) {
    json_t *tr = json_object();
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->training->seed);
    json_object_set_new(tr, "step", json_integer((json_int_t)o->training->step));
    json_object_set_new(tr, "lr", json_real(o->training->lr));
    json_object_set_new(tr, "seed", json_string(seed));
    json_object_set_new(tr, "data_position", json_integer((json_int_t)o->training->data_position));
    json_object_set_new(root, "training", tr);
  } else {
    json_object_set_new(root, "training", json_null());
  }

  json_t *md = json_object();
  json_object_set_new(md, "encoding", json_string("gguf-kv-v3"));
  json_object_set_new(md, "shard", json_integer(0));
  json_object_set_new(md, "n_kv", json_integer((json_int_t)mf->n_kv));
  json_object_set_new(root, "metadata", md);

  json_t *sa = json_array();
  for (uint64_t i = 0; i < ns; i++) {
    char h[65];
    json_t *so = json_object();
    json_object_set_new(so, "kind", json_string(sh[i].kind == LL_CKPT_SHARD_METADATA ? "metadata" : "tensors"));
    json_object_set_new(so, "offset", json_integer((json_int_t)sh[i].offset));
    json_object_set_new(so, "csize", json_integer((json_int_t)sh[i].csize));
    json_object_set_new(so, "rsize", json_integer((json_int_t)sh[i].rsize));
    hex32(sh[i].csha, h);
    json_object_set_new(so, "csha256", json_string(h));
    hex32(sh[i].rsha, h);
    json_object_set_new(so, "rsha256", json_string(h));
    json_array_append_new(sa, so);
  }
  json_object_set_new(root, "shards", sa);

  json_t *ta = json_array();
  for (uint64_t i = 0; i < mf->n_tensors; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    json_t *to = json_object();
    json_t *nm = json_stringn(t->name.ptr, t->name.len);
    if (!nm) {
      json_decref(to);
      json_decref(ta);
      json_decref(root);
      ll_errf(err, errlen, LL_EFORMAT, "ckpt: tensor %llu's name is not valid UTF-8", (unsigned long long)i);
      return NULL;
    }
    json_object_set_new(to, "name", nm);
    json_object_set_new(to, "dtype", json_string(ll_type_name(t->type)));
    json_t *shape = json_array();
    for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->ne[d]));
    json_object_set_new(to, "shape", shape);
    int role = o->roles ? o->roles[i] : ll_ckpt_role_from_tensor_name(t->name.ptr);
    json_object_set_new(to, "role", json_string(ll_ckpt_role_name(role)));
    json_object_set_new(to, "shard", json_integer((json_int_t)tshard[i]));
    json_object_set_new(to, "offset", json_integer((json_int_t)toff[i]));
    json_object_set_new(to, "size", json_integer((json_int_t)t->nbytes));
    json_array_append_new(ta, to);
  }
  json_object_set_new(root, "tensors", ta);
  return root;
}

int ll_ckpt_write(const char *path, const struct ll_modelfile *mf, const struct ll_ckpt_write_opts *opts,
                  char *err, size_t errlen) {
  struct ll_ckpt_write_opts o;
  if (opts) o = *opts;
  else ll_ckpt_write_opts_init(&o);
  if (o.zstd_level == 0) o.zstd_level = 3;
  if (o.zstd_level < ZSTD_minCLevel() || o.zstd_level > ZSTD_maxCLevel())
    return ll_errf(err, errlen, LL_EINVAL, "ckpt: zstd level %d outside [%d, %d]", o.zstd_level, ZSTD_minCLevel(),
                   ZSTD_maxCLevel());
  if (o.shard_target == 0) o.shard_target = LL_CKPT_DEFAULT_SHARD;
  if (o.shard_target > LL_CKPT_MAX_SHARD_RAW) o.shard_target = LL_CKPT_MAX_SHARD_RAW;
  if (o.n_threads <= 0) o.n_threads = 1;
  if (o.n_threads > 256) o.n_threads = 256;
  // Refuse what the reader would refuse, rather than publish a file that cannot be opened.
  if (o.training && o.training->present &&
      (!(o.training->lr >= 0.0 && o.training->lr <= 1e6) || o.training->step > INT64_MAX ||
       o.training->data_position > INT64_MAX))
    return ll_errf(err, errlen, LL_EINVAL, "ckpt: training state out of range (lr %g must be in [0, 1e6])",
                   o.training->lr);
  if (mf->gguf_version < 1 || mf->gguf_version > 3 || mf->alignment == 0 || mf->alignment > (1u << 20) ||
      (mf->alignment & (mf->alignment - 1)))
    return ll_errf(err, errlen, LL_EINVAL, "ckpt: gguf version %u / alignment %llu not writable", mf->gguf_version,
                   (unsigned long long)mf->alignment);
  if (o.roles)
    for (uint64_t i = 0; i < mf->n_tensors; i++)
      if (o.roles[i] < 0 || o.roles[i] >= LL_CKPT_ROLE_COUNT)
        return ll_errf(err, errlen, LL_EINVAL, "ckpt: tensor %llu has role %d", (unsigned long long)i, o.roles[i]);

  // ---- plan: tensor -> (shard, offset); shard 0 is the metadata shard.
  int rc = 0;
  uint64_t nt = mf->n_tensors;
  uint64_t *tshard = calloc(nt ? nt : 1, sizeof *tshard), *toff = calloc(nt ? nt : 1, sizeof *toff);
  struct wshard *sh = calloc(nt + 1, sizeof *sh); // at most one shard per tensor + metadata
  unsigned char *kvblob = NULL;
  size_t kvlen = 0;
  char *tmp = NULL, *dir = NULL, *mtext = NULL;
  int hold = -1; // the temporary file's lock (ll_tmp_hold)
  int fd = -1;
  uint64_t ns = 1, total_raw = 0, done_raw = 0;
  if (!tshard || !toff || !sh) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "ckpt: out of memory");
    goto out;
  }
  for (uint64_t i = 0; i < nt; i++) {
    const struct ll_tensor_info *t = &mf->tensors[i];
    size_t rs = ll_row_size(t->type, t->ne[0]);
    uint64_t want = rs * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    if (!t->data || rs == 0 || t->nbytes != want || t->nbytes > LL_CKPT_MAX_SHARD_RAW - LL_CKPT_ALIGN) {
      rc = ll_errf(err, errlen, LL_EINVAL, "ckpt: tensor '%s' has no data, a bad size or is too large for one shard",
                   t->name.ptr);
      goto out;
    }
    struct wshard *cur = &sh[ns - 1];
    if (cur->kind != LL_CKPT_SHARD_TENSORS || (cur->rsize > 0 && cur->rsize + t->nbytes > o.shard_target)) {
      cur = &sh[ns++];
      cur->kind = LL_CKPT_SHARD_TENSORS;
      cur->t0 = i;
      cur->raw_offset = total_raw;
    }
    tshard[i] = ns - 1;
    toff[i] = cur->rsize;
    cur->rsize = align_up(cur->rsize + t->nbytes, LL_CKPT_ALIGN);
    cur->t1 = i + 1;
    total_raw += cur->rsize - toff[i];
  }
  {
    // The full GGUF key/value set, every value's type kept (GGUF -> .ckpt -> GGUF is exact).
    void *blob = NULL;
    if ((rc = ll_gguf_kv_serialize(mf, &blob, &kvlen))) {
      rc = ll_errf(err, errlen, rc, "ckpt: cannot serialize the metadata: %s", ll_strerror(rc));
      goto out;
    }
    kvblob = blob;
  }
  sh[0].kind = LL_CKPT_SHARD_METADATA;
  sh[0].raw = kvblob;
  sh[0].rsize = kvlen;
  total_raw += kvlen;

  // ---- temp file beside the target (same filesystem, so rename is atomic)
  {
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    if (!*base) {
      rc = ll_errf(err, errlen, LL_EINVAL, "ckpt: '%s' names a directory", path);
      goto out;
    }
    dir = malloc(dl + 2);
    tmp = malloc(strlen(path) + 32);
    if (!dir || !tmp) {
      rc = ll_errf(err, errlen, LL_ENOMEM, "ckpt: out of memory");
      goto out;
    }
    if (slash) {
      memcpy(dir, path, dl ? dl : 1);
      dir[dl ? dl : 1] = 0;
    } else {
      strcpy(dir, ".");
    }
    // tmp = "<dir>/.<base>.tmp-XXXXXX" (hidden, never matched as the target name)
    sprintf(tmp, "%.*s.%s.tmp-XXXXXX", (int)(slash ? dl + 1 : 0), path, base);
    ll_tmp_sweep(path); // earlier writes of this path cut short (kill -9) left theirs: MBs each
    fd = mkstemp(tmp);
    if (fd >= 0) hold = ll_tmp_hold(fd); // until renamed: a sweep elsewhere leaves it alone
    if (fd < 0) {
      rc = ll_errf(err, errlen, LL_EIO, "ckpt: cannot create temporary file '%s': %s", tmp, strerror(errno));
      free(tmp);
      tmp = NULL;
      goto out;
    }
    fchmod(fd, 0644);
  }
  // Zero header first: until the real header lands (after everything else), the file has no
  // magic and can never load.
  {
    unsigned char zero[LL_CKPT_HEADER_SIZE] = {0};
    if (ll_write_all(fd, zero, sizeof zero)) goto ioerr;
  }
  uint64_t pos = LL_CKPT_HEADER_SIZE;
  struct wctx ctx = {mf, toff, o.zstd_level};
  // Metadata shard, then tensor shards: compressed by n_threads workers, written here in order.
  {
    struct wpipe pp;
    memset(&pp, 0, sizeof pp);
    pp.ctx = &ctx;
    pp.sh = sh;
    pp.ns = ns;
    pp.window = 2 * (uint64_t)o.n_threads;
    pp.done = calloc(ns, 1);
    if (!pp.done) {
      rc = ll_errf(err, errlen, LL_ENOMEM, "ckpt: out of memory");
      goto out;
    }
    pthread_mutex_init(&pp.mu, NULL);
    pthread_cond_init(&pp.ready, NULL);
    pthread_cond_init(&pp.space, NULL);
    pthread_t th[256];
    int nw = 0;
    for (int t = 0; t < o.n_threads; t++)
      if (pthread_create(&th[nw], NULL, compress_thread, &pp) == 0) nw++;
    int io_failed = 0, werr = 0;
    for (uint64_t i = 0; i < ns && !rc && !io_failed; i++) {
      if (nw == 0) { // no worker could start: compress here
        sh[i].rc = compress_shard(&ctx, &sh[i]);
        pp.done[i] = 1;
      }
      pthread_mutex_lock(&pp.mu);
      while (!pp.done[i]) pthread_cond_wait(&pp.ready, &pp.mu);
      pthread_mutex_unlock(&pp.mu);
      if (sh[i].rc) {
        rc = ll_errf(err, errlen, sh[i].rc, "ckpt: shard %llu: %s", (unsigned long long)i, sh[i].err);
        break;
      }
      sh[i].offset = pos;
      if (ll_write_all(fd, sh[i].cbuf, sh[i].csize)) {
        werr = errno;
        io_failed = 1;
        break;
      }
      pos += sh[i].csize;
      free(sh[i].cbuf);
      sh[i].cbuf = NULL;
      done_raw += sh[i].rsize;
      pthread_mutex_lock(&pp.mu);
      pp.written = i + 1;
      pthread_cond_broadcast(&pp.space);
      pthread_mutex_unlock(&pp.mu);
      if (o.progress) o.progress(o.progress_user, "write", done_raw, total_raw);
    }
    pthread_mutex_lock(&pp.mu);
    pp.abort = 1; // stops workers early after an error; a no-op once all shards are claimed
    pthread_cond_broadcast(&pp.space);
    pthread_mutex_unlock(&pp.mu);
    for (int t = 0; t < nw; t++) pthread_join(th[t], NULL);
    pthread_cond_destroy(&pp.ready);
    pthread_cond_destroy(&pp.space);
    pthread_mutex_destroy(&pp.mu);
    free(pp.done);
    if (rc) goto out;
    if (io_failed) {
      errno = werr;
      goto ioerr;
    }
  }
  // Manifest after the shards; the header that points at it is written last of all.
  {
    json_t *root = build_manifest(mf, &o, sh, ns, tshard, toff, err, errlen);
    if (!root) {
      rc = LL_EFORMAT;
      goto out;
    }
    mtext = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    json_decref(root);
    if (!mtext) {
      rc = ll_errf(err, errlen, LL_ENOMEM, "ckpt: out of memory serializing the manifest");
      goto out;
    }
    size_t mlen = strlen(mtext);
    if (mlen > LL_CKPT_MAX_MANIFEST) {
      rc = ll_errf(err, errlen, LL_ELIMIT, "ckpt: manifest of %zu bytes exceeds %u", mlen, LL_CKPT_MAX_MANIFEST);
      goto out;
    }
    if (ll_write_all(fd, mtext, mlen)) goto ioerr;
    unsigned char h[LL_CKPT_HEADER_SIZE] = {0};
    memcpy(h, LL_CKPT_MAGIC, 8);
    put_u32(h + 8, LL_CKPT_VERSION);
    put_u32(h + 12, LL_CKPT_HEADER_SIZE);
    put_u64(h + 16, pos);
    put_u64(h + 24, mlen);
    put_u64(h + 32, pos + mlen);
    put_u64(h + 40, 0);
    if (sha256(mtext, mlen, h + 48) || sha256(h, HDR_SHA_AT, h + HDR_SHA_AT)) {
      rc = ll_errf(err, errlen, LL_ENOMEM, "ckpt: sha256 failed");
      goto out;
    }
    // Data must be durable before the header makes the file valid.
    if (!o.no_fsync && fdatasync(fd)) goto ioerr;
    ssize_t w;
    do w = pwrite(fd, h, sizeof h, 0);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof h) goto ioerr;
    if (!o.no_fsync && fsync(fd)) goto ioerr;
  }
  if (close(fd)) {
    fd = -1;
    goto ioerr;
  }
  fd = -1;
  if (rename(tmp, path)) {
    rc = ll_errf(err, errlen, LL_EIO, "ckpt: rename '%s' -> '%s': %s", tmp, path, strerror(errno));
    goto out;
  }
  free(tmp);
  tmp = NULL;
  if (!o.no_fsync && ll_fsync_dir(dir)) {
    rc = ll_errf(err, errlen, LL_EIO, "ckpt: fsync of directory '%s': %s", dir, strerror(errno));
    goto out;
  }
  goto out;
ioerr:
  rc = ll_errf(err, errlen, LL_EIO, "ckpt: writing '%s': %s", tmp ? tmp : path, strerror(errno));
out:
  if (fd >= 0) close(fd);
  if (tmp) {
    unlink(tmp);
    free(tmp);
  }
  ll_tmp_release(hold);
  if (sh)
    for (uint64_t i = 0; i < ns; i++) free(sh[i].cbuf);
  free(sh);
  free(tshard);
  free(toff);
  free(kvblob);
  free(dir);
  free(mtext);
  return rc;
}

// ---------------------------------------------------------------- reader

struct rshard_status {
  int rc;
  char what[160];
};

struct rctx {
  int fd;
  const struct ll_ckpt_manifest *m;
  unsigned char *data;     // tensor data block
  atomic_uint next;
  struct rshard_status *st;
  atomic_int failed;
};

// Read, verify and decompress one shard into dst (capacity s->rsize).
static int load_shard(int fd, const struct ll_ckpt_shard_entry *s, unsigned char *cbuf, unsigned char *dst,
                      ZSTD_DCtx *dc, char *what, size_t wl) {
  unsigned char d[32];
  int r = pread_all(fd, cbuf, s->csize, s->offset);
  if (r == -2) return ll_errf(what, wl, LL_ETRUNC, "is truncated (file ends inside it)");
  if (r) return ll_errf(what, wl, LL_EIO, "cannot be read: %s", strerror(errno));
  if (sha256(cbuf, s->csize, d)) return ll_errf(what, wl, LL_ENOMEM, "sha256 failed");
  if (memcmp(d, s->csha256, 32) != 0) return ll_errf(what, wl, LL_ECHECKSUM, "is damaged: compressed bytes sha256 mismatch");
  size_t n = ZSTD_decompressDCtx(dc, dst, s->rsize, cbuf, s->csize);
  if (ZSTD_isError(n)) return ll_errf(what, wl, LL_EFORMAT, "does not decompress: %s", ZSTD_getErrorName(n));
  if (n != s->rsize)
    return ll_errf(what, wl, LL_EFORMAT, "decompresses to %zu bytes, manifest says %llu", n,
                   (unsigned long long)s->rsize);
  if (sha256(dst, s->rsize, d)) return ll_errf(what, wl, LL_ENOMEM, "sha256 failed");
  if (memcmp(d, s->rsha256, 32) != 0) return ll_errf(what, wl, LL_ECHECKSUM, "is damaged: raw bytes sha256 mismatch");
  return 0;
}

static void *load_thread(void *arg) {
  struct rctx *c = arg;
  ZSTD_DCtx *dc = ZSTD_createDCtx();
  unsigned char *cbuf = NULL;
  size_t cap = 0;
  for (;;) {
    unsigned i = atomic_fetch_add(&c->next, 1);
    if (i >= c->m->n_shards) break;
    const struct ll_ckpt_shard_entry *s = &c->m->shards[i];
    if (s->kind != LL_CKPT_SHARD_TENSORS) continue;
    if (atomic_load(&c->failed)) { // keep going only to find the lowest damaged index cheaply
      c->st[i].rc = 0;
      continue;
    }
    if (!dc) {
      c->st[i].rc = ll_errf(c->st[i].what, sizeof c->st[i].what, LL_ENOMEM, "out of memory");
    } else {
      if (cap < s->csize) {
        free(cbuf);
        cap = s->csize;
        cbuf = malloc(cap);
        if (!cbuf) cap = 0;
      }
      c->st[i].rc = cbuf ? load_shard(c->fd, s, cbuf, c->data + s->raw_offset, dc, c->st[i].what, sizeof c->st[i].what)
                         : ll_errf(c->st[i].what, sizeof c->st[i].what, LL_ENOMEM, "out of memory");
    }
    if (c->st[i].rc) atomic_store(&c->failed, 1);
  }
  free(cbuf);
  ZSTD_freeDCtx(dc);
  return NULL;
}

static int shard_err(char *err, size_t errlen, int code, const char *path, const struct ll_ckpt_manifest *m,
                     uint32_t i, const char *what) {
  const struct ll_ckpt_shard_entry *s = &m->shards[i];
  const char *first = s->kind == LL_CKPT_SHARD_METADATA ? "(metadata)"
                      : s->first_tensor < m->n_tensors ? m->tensors[s->first_tensor].name
                                                       : "(no tensors)";
  return ll_errf(err, errlen, code, "%s: shard %u at file offset %llu (%llu compressed bytes, first tensor '%s') %s", path,
                 i, (unsigned long long)s->offset, (unsigned long long)s->csize, first, what);
}

int ll_ckpt_open_ex(const char *path, struct ll_modelfile *mf, struct ll_ckpt_manifest *man, int n_threads,
                    char *err, size_t errlen) {
  struct ll_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  ll_modelfile_init(mf);
  if (man) memset(man, 0, sizeof *man);
  unsigned char h[LL_CKPT_HEADER_SIZE], d[32];
  char *mtext = NULL;
  unsigned char *data = NULL, *kvraw = NULL, *cbuf = NULL;
  struct rshard_status *st = NULL;
  int rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ll_errf(err, errlen, LL_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    rc = ll_errf(err, errlen, LL_EIO, "%s: not a regular file", path);
    goto out;
  }
  uint64_t fsize = (uint64_t)sb.st_size;
  if (fsize < LL_CKPT_HEADER_SIZE) {
    rc = ll_errf(err, errlen, LL_ETRUNC, "%s: truncated: %llu bytes, the header alone is %u", path,
                 (unsigned long long)fsize, LL_CKPT_HEADER_SIZE);
    goto out;
  }
  if (pread_all(fd, h, sizeof h, 0)) {
    rc = ll_errf(err, errlen, LL_EIO, "%s: cannot read the header", path);
    goto out;
  }
  if (memcmp(h, LL_CKPT_MAGIC, 8) != 0) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s: header: bad magic at offset 0 (not a .ckpt file, or never completed)", path);
    goto out;
  }
  if (sha256(h, HDR_SHA_AT, d) || memcmp(d, h + HDR_SHA_AT, 32) != 0) {
    rc = ll_errf(err, errlen, LL_ECHECKSUM, "%s: header: checksum mismatch (bytes 0..95 vs sha256 at offset 96)", path);
    goto out;
  }
  uint32_t ver = get_u32(h + 8), hsz = get_u32(h + 12);
  uint64_t moff = get_u64(h + 16), mlen = get_u64(h + 24), fsz = get_u64(h + 32);
  if (ver != LL_CKPT_VERSION || hsz != LL_CKPT_HEADER_SIZE) {
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "%s: header: version %u / header_size %u not supported", path, ver, hsz);
    goto out;
  }
  if (fsz != fsize) {
    rc = ll_errf(err, errlen, fsize < fsz ? LL_ETRUNC : LL_EFORMAT,
                 "%s: header: file_size is %llu but the file has %llu bytes (%s)", path, (unsigned long long)fsz,
                 (unsigned long long)fsize, fsize < fsz ? "truncated" : "trailing bytes");
    goto out;
  }
  if (moff < LL_CKPT_HEADER_SIZE || mlen == 0 || mlen > LL_CKPT_MAX_MANIFEST || moff > fsize || mlen != fsize - moff) {
    rc = ll_errf(err, errlen, LL_EFORMAT, "%s: header: manifest_offset %llu / manifest_length %llu do not end the %llu-byte file",
                 path, (unsigned long long)moff, (unsigned long long)mlen, (unsigned long long)fsize);
    goto out;
  }
  mtext = malloc(mlen);
  if (!mtext) {
    rc = ll_errf(err, errlen, LL_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  if (pread_all(fd, mtext, mlen, moff)) {
    rc = ll_errf(err, errlen, LL_EIO, "%s: cannot read the manifest", path);
    goto out;
  }
  if (sha256(mtext, mlen, d) || memcmp(d, h + 48, 32) != 0) {
    rc = ll_errf(err, errlen, LL_ECHECKSUM, "%s: manifest (file offset %llu, %llu bytes): checksum mismatch", path,
                 (unsigned long long)moff, (unsigned long long)mlen);
    goto out;
  }
  {
    char perr[512];
    if ((rc = ll_ckpt_parse_manifest(mtext, mlen, &m, perr, sizeof perr))) {
      ll_errf(err, errlen, rc, "%s: %s", path, perr);
      goto out;
    }
  }
  {
    const struct ll_ckpt_shard_entry *last = &m.shards[m.n_shards - 1];
    if (last->offset + last->csize != moff) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "%s: manifest: shards end at %llu, not at the manifest offset %llu", path,
                   (unsigned long long)(last->offset + last->csize), (unsigned long long)moff);
      goto out;
    }
  }
  // Metadata shard.
  {
    const struct ll_ckpt_shard_entry *s = &m.shards[m.metadata_shard];
    char what[160];
    cbuf = malloc(s->csize);
    kvraw = malloc(s->rsize ? s->rsize : 1);
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    if (!cbuf || !kvraw || !dc) {
      ZSTD_freeDCtx(dc);
      rc = ll_errf(err, errlen, LL_ENOMEM, "%s: out of memory", path);
      goto out;
    }
    rc = load_shard(fd, s, cbuf, kvraw, dc, what, sizeof what);
    ZSTD_freeDCtx(dc);
    free(cbuf);
    cbuf = NULL;
    if (rc) {
      shard_err(err, errlen, rc, path, &m, m.metadata_shard, what);
      goto out;
    }
    char kerr[512];
    if ((rc = ll_gguf_kv_deserialize(kvraw, s->rsize, mf, kerr, sizeof kerr))) {
      ll_errf(err, errlen, rc, "%s: shard %u (metadata): %s", path, m.metadata_shard, kerr);
      goto out;
    }
    if (mf->n_kv != m.n_kv) {
      rc = ll_errf(err, errlen, LL_EFORMAT, "%s: metadata holds %llu keys, manifest says %llu", path,
                   (unsigned long long)mf->n_kv, (unsigned long long)m.n_kv);
      goto out;
    }
  }
  // Tensor shards, in parallel, straight into one aligned block.
  {
    size_t cap = (size_t)align_up(m.data_size ? m.data_size : 1, LL_CKPT_ALIGN);
    data = aligned_alloc(LL_CKPT_ALIGN, cap);
    st = calloc(m.n_shards, sizeof *st);
    if (!data || !st) {
      rc = ll_errf(err, errlen, LL_ENOMEM, "%s: out of memory for %llu bytes of tensor data", path,
                   (unsigned long long)m.data_size);
      goto out;
    }
    struct rctx c = {.fd = fd, .m = &m, .data = data, .st = st};
    atomic_init(&c.next, 0);
    atomic_init(&c.failed, 0);
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;
    if ((unsigned)n_threads > m.n_shards) n_threads = (int)m.n_shards;
    pthread_t th[64];
    int nstarted = 0;
    for (int t = 1; t < n_threads; t++)
      if (pthread_create(&th[nstarted], NULL, load_thread, &c) == 0) nstarted++;
    load_thread(&c);
    for (int t = 0; t < nstarted; t++) pthread_join(th[t], NULL);
    for (uint32_t i = 0; i < m.n_shards; i++) {
      if (st[i].rc) {
        rc = shard_err(err, errlen, st[i].rc, path, &m, i, st[i].what);
        goto out;
      }
    }
  }
  for (uint64_t i = 0; i < m.n_tensors; i++) {
    const struct ll_ckpt_tensor_entry *t = &m.tensors[i];
    const unsigned char *p = data + m.shards[t->shard].raw_offset + t->offset;
    if ((rc = ll_mf_add_tensor(mf, t->name, t->type, t->n_dims, t->ne, p))) {
      ll_errf(err, errlen, rc, "%s: tensor '%s' rejected", path, t->name);
      goto out;
    }
    mf->tensors[i].offset = (uint64_t)(p - data);
  }
  mf->gguf_version = m.gguf_version;
  mf->alignment = m.gguf_alignment;
  mf->backing = data;
  mf->backing_len = (size_t)m.data_size;
  mf->backing_is_mmap = 0;
  data = NULL;
  snprintf(mf->source_format, sizeof mf->source_format, "ckpt");
  if (man) {
    *man = m;
    memset(&m, 0, sizeof m);
  }
out:
  if (rc) ll_modelfile_free(mf);
  ll_ckpt_manifest_free(&m);
  free(mtext);
  free(data);
  free(kvraw);
  free(cbuf);
  free(st);
  close(fd);
  return rc;
}

int ll_ckpt_open(const char *path, struct ll_modelfile *mf, int n_threads, char *err, size_t errlen) {
  return ll_ckpt_open_ex(path, mf, NULL, n_threads, err, errlen);
}
