// ll_gguf.h - GGUF v2/v3 reader and writer on struct ll_modelfile.
#ifndef LL_GGUF_H
#define LL_GGUF_H

#include <stddef.h>

#include "ll_modelfile.h"

#define LL_GGUF_MAGIC "GGUF"
#define LL_GGUF_DEFAULT_ALIGNMENT 32
#define LL_GGUF_MAX_ALIGNMENT (1u << 16)

// Parse a whole GGUF file held in memory. Pure function of (buf, len): every count, length,
// offset and size is checked against limits and len before use. Tensor data pointers point
// into buf; mf->backing stays NULL (the caller keeps buf alive). On error mf is left empty
// and err names the field and byte offset.
int ll_gguf_parse(const void *buf, size_t len, struct ll_modelfile *mf, char *err, size_t errlen);

// mmap `path` read-only and parse it; the mapping becomes mf->backing. Messages name path.
int ll_gguf_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen);

// Write mf as GGUF v3 (metadata in mf order with each value's type, tensor infos, data
// aligned to general.alignment or mf->alignment). Atomic and durable: temp file in the same
// directory, fsync, rename, fsync directory. Tensor bytes come from each tensor's `data`.
int ll_gguf_write(const char *path, const struct ll_modelfile *mf, char *err, size_t errlen);

// Metadata section alone (u64 n_kv, then the kv pairs in GGUF encoding), for containers
// that carry GGUF metadata (.ckpt). serialize: *out is malloc'ed, caller frees.
int ll_gguf_kv_serialize(const struct ll_modelfile *mf, void **out, size_t *out_len);
// Appends the kv pairs in buf to mf (a key already in mf is an error). Pure (buf, len).
int ll_gguf_kv_deserialize(const void *buf, size_t len, struct ll_modelfile *mf, char *err, size_t errlen);

#endif
