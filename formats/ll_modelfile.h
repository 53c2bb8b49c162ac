// ll_modelfile.h - one in-memory picture of a model file, whatever its format.
//
// Every reader (GGUF, llama2.c .bin, safetensors directory, our .ckpt) produces a
// struct ll_modelfile: GGUF-style typed metadata (key/value) plus a tensor table whose
// names, types and shapes follow GGUF conventions ("token_embd.weight",
// "blk.N.attn_q.weight", ... ; ne[0] is the contiguous dimension). Readers of non-GGUF
// formats synthesize the GGUF metadata keys ("general.architecture" = "llama",
// "llama.embedding_length", "tokenizer.ggml.tokens", ...), so everything above this layer
// (tokenizer, engine, writers) reads one vocabulary of keys.
//
// Ownership: the modelfile owns every key, string, array and tensor-info it holds, and
// the tensor bytes through `backing` (an mmap or a heap block). ll_modelfile_free() releases
// all of it and accepts NULL / a zeroed struct.
#ifndef LL_MODELFILE_H
#define LL_MODELFILE_H

#include <stddef.h>
#include <stdint.h>

// GGUF value type ids.
enum ll_kv_type {
  LL_KV_U8 = 0, LL_KV_I8 = 1, LL_KV_U16 = 2, LL_KV_I16 = 3, LL_KV_U32 = 4, LL_KV_I32 = 5,
  LL_KV_F32 = 6, LL_KV_BOOL = 7, LL_KV_STR = 8, LL_KV_ARR = 9, LL_KV_U64 = 10, LL_KV_I64 = 11,
  LL_KV_F64 = 12,
  LL_KV_TYPE_COUNT = 13
};

struct ll_str {
  uint64_t len;
  char *ptr; // NUL-terminated copy (len excludes the NUL); may contain inner NULs
};

struct ll_kv_value;

struct ll_kv_array {
  int elem_type;    // enum ll_kv_type
  uint64_t n;
  // elem_type scalar: packed little-endian C array of n elements (uint32_t[], float[] ...)
  // elem_type STR:    struct ll_str[n]
  // elem_type ARR:    struct ll_kv_value[n] (nested arrays, each of type LL_KV_ARR)
  void *data;
};

struct ll_kv_value {
  int type; // enum ll_kv_type
  union {
    uint64_t u64; // U8/U16/U32/U64/BOOL widened
    int64_t i64;  // I8/I16/I32/I64 widened
    double f64;   // F32/F64 widened (F32 is exactly representable)
    struct ll_str str;
    struct ll_kv_array arr;
  } v;
};

struct ll_kv {
  struct ll_str key;
  struct ll_kv_value value;
};

#define LL_MAX_DIMS 4

struct ll_tensor_info {
  struct ll_str name;
  int type;                 // enum ll_type
  int n_dims;               // 1..LL_MAX_DIMS
  int64_t ne[LL_MAX_DIMS];  // elements per dim, ne[0] contiguous; unused dims are 1
  uint64_t offset;          // offset of the data within the format's data section
  uint64_t nbytes;          // ll_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]
  const void *data;         // points into the backing memory (NULL until loaded)
};

struct ll_modelfile {
  uint32_t gguf_version;    // version read (GGUF) or to write; 3 by default
  uint64_t alignment;       // data alignment (GGUF general.alignment, default 32)
  struct ll_kv *kv;
  uint64_t n_kv;
  struct ll_tensor_info *tensors;
  uint64_t n_tensors;
  // Backing storage of tensor data, released by ll_modelfile_free().
  void *backing;            // base address
  size_t backing_len;
  int backing_is_mmap;      // 1: munmap(backing, backing_len); 0: free(backing)
  char source_sha256[65];   // hex digest of the source file if known, else ""
  char source_format[16];   // "gguf", "llama2c", "safetensors", "ckpt"
};

// Limits applied by every reader before it trusts a number from a file.
#define LL_MAX_KV 65536u                 // metadata entries
#define LL_MAX_TENSORS 65536u            // tensors
#define LL_MAX_NAME 1024u                // key / tensor name bytes
#define LL_MAX_STRING (16u << 20)        // one string value
#define LL_MAX_ARRAY (1u << 24)          // elements in one array (vocab of 16M tokens)
#define LL_MAX_ARRAY_DEPTH 4             // nested arrays
#define LL_MAX_TENSOR_BYTES (1ull << 40) // 1 TiB

void ll_modelfile_init(struct ll_modelfile *mf);
void ll_modelfile_free(struct ll_modelfile *mf);

// ---- metadata lookup (NULL / negative code when absent or of another type) ----
const struct ll_kv *ll_mf_find_kv(const struct ll_modelfile *mf, const char *key);
// Integer of any integer type (or BOOL); LL_ENOTFOUND / LL_EFORMAT (wrong type).
int ll_mf_get_int(const struct ll_modelfile *mf, const char *key, int64_t *out);
int ll_mf_get_uint(const struct ll_modelfile *mf, const char *key, uint64_t *out);
int ll_mf_get_float(const struct ll_modelfile *mf, const char *key, double *out);
int ll_mf_get_bool(const struct ll_modelfile *mf, const char *key, int *out);
// String value (borrowed pointer, NUL-terminated).
int ll_mf_get_str(const struct ll_modelfile *mf, const char *key, const char **out);
// Array value (borrowed).
int ll_mf_get_arr(const struct ll_modelfile *mf, const char *key, const struct ll_kv_array **out);
// "<arch>.<suffix>" helpers: e.g. ll_mf_get_arch_int(mf, "embedding_length", &v).
int ll_mf_get_arch_int(const struct ll_modelfile *mf, const char *suffix, int64_t *out);
int ll_mf_get_arch_float(const struct ll_modelfile *mf, const char *suffix, double *out);

const struct ll_tensor_info *ll_mf_find_tensor(const struct ll_modelfile *mf, const char *name);

// ---- building (used by non-GGUF readers and converters) ----
// Each setter copies its inputs; a key set twice replaces the earlier value.
int ll_mf_set_u32(struct ll_modelfile *mf, const char *key, uint32_t v);
int ll_mf_set_i32(struct ll_modelfile *mf, const char *key, int32_t v);
int ll_mf_set_u64(struct ll_modelfile *mf, const char *key, uint64_t v);
int ll_mf_set_f32(struct ll_modelfile *mf, const char *key, float v);
int ll_mf_set_bool(struct ll_modelfile *mf, const char *key, int v);
int ll_mf_set_str(struct ll_modelfile *mf, const char *key, const char *s);
// Array of scalars (elem_type scalar; data packed) or strings (elem_type STR; data is
// const char *const[n], NUL-terminated).
int ll_mf_set_arr(struct ll_modelfile *mf, const char *key, int elem_type, const void *data, uint64_t n);
// Append a tensor-info (data pointer borrowed; offset computed by writers).
int ll_mf_add_tensor(struct ll_modelfile *mf, const char *name, int type, int n_dims,
                     const int64_t *ne, const void *data);

// Deep copy of one value (used when converting between containers).
int ll_kv_value_copy(struct ll_kv_value *dst, const struct ll_kv_value *src);
void ll_kv_value_free(struct ll_kv_value *v);
size_t ll_kv_type_size(int type); // bytes of a scalar type, 0 for STR/ARR/unknown

// ---- opening any supported file ----
// Detects the format from content (GGUF magic, .ckpt magic, safetensors directory or file,
// else llama2.c legacy header) and loads it. err names the file and what was wrong.
int ll_model_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen);

#endif
