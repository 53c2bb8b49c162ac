// ll_ckpt.h - llsrv's checkpoint container `.ckpt` (format: man/llsrv-ckpt.5).
//
// One file = a 128-byte header + zstd-compressed shards + a JSON manifest written LAST.
// The header (written after everything else, then fsync + rename) points at the manifest
// and carries its sha256, so a file is valid only once it is complete. Every shard's
// compressed and raw bytes have a sha256 in the manifest; the reader names a damaged shard
// (index, file offset, first tensor) and refuses the whole file.
//
// Tensor data keeps GGUF layouts (quantized tensors keep their blocks) and is loaded into
// one 64-byte aligned heap block (mf->backing). The full GGUF key/value set is stored as its
// own shard (ll_gguf_kv_serialize, GGUF v3 key/value encoding), so GGUF -> .ckpt -> GGUF keeps
// every value's type.
//
// Beyond plain weights the container already carries LoRA adapters and optimizer state:
// each tensor has a role (weight / lora_a / lora_b / adam_m / adam_v) and the manifest has
// an optional "training" object (step, lr, seed, data position).
#ifndef LL_CKPT_H
#define LL_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "ll_modelfile.h"

#define LL_CKPT_MAGIC "LLCKPT\0\1" // 8 bytes
#define LL_CKPT_VERSION 1u
#define LL_CKPT_HEADER_SIZE 128u
#define LL_CKPT_ALIGN 64u                        // tensor offsets and shard raw sizes
#define LL_CKPT_MAX_MANIFEST (256u << 20)         // manifest JSON bytes
#define LL_CKPT_MAX_SHARDS 65536u
#define LL_CKPT_MAX_SHARD_RAW (4ull << 30)        // raw bytes of one shard
#define LL_CKPT_DEFAULT_SHARD (16u << 20)         // target raw bytes per tensor shard
#define LL_CKPT_MAX_STR 4096u                     // summary / provenance strings

enum ll_ckpt_role {
  LL_CKPT_ROLE_WEIGHT = 0,
  LL_CKPT_ROLE_LORA_A = 1,
  LL_CKPT_ROLE_LORA_B = 2,
  LL_CKPT_ROLE_ADAM_M = 3,
  LL_CKPT_ROLE_ADAM_V = 4,
  LL_CKPT_ROLE_COUNT
};
const char *ll_ckpt_role_name(int role);     // "weight", ... ; "?" if out of range
int ll_ckpt_role_from_name(const char *name); // -1 if unknown
// Role implied by a tensor name: suffix ".lora_a", ".lora_b", ".adam_m", ".adam_v", else weight.
int ll_ckpt_role_from_tensor_name(const char *name);

struct ll_ckpt_training {
  int present;          // 0: no "training" object
  uint64_t step;
  double lr;
  uint64_t seed;
  uint64_t data_position; // tokens (or bytes, per the data loader) consumed so far
};

// Progress: done/total in raw bytes; phase "compress", "write", "verify", "load".
typedef void (*ll_ckpt_progress_fn)(void *user, const char *phase, uint64_t done, uint64_t total);

struct ll_ckpt_write_opts {
  int zstd_level;             // 0 -> 3
  uint64_t shard_target;      // raw bytes per tensor shard; 0 -> LL_CKPT_DEFAULT_SHARD
  int n_threads;              // parallel compression; <= 0 -> 1
  ll_ckpt_progress_fn progress; // optional
  void *progress_user;
  const char *source_sha256;  // provenance; NULL -> mf->source_sha256
  const char *source_format;  // NULL -> mf->source_format
  const char *converter;      // NULL -> "llsrv <version>"
  const char *note;           // optional free text
  const int *roles;           // optional, per tensor (enum ll_ckpt_role); NULL -> from names
  const struct ll_ckpt_training *training; // optional
  int no_fsync;               // tests only: skip fsync (atomic rename still used)
};

void ll_ckpt_write_opts_init(struct ll_ckpt_write_opts *o);

// Write mf (metadata + all tensors, whose data must be loaded) to path atomically and
// durably: temp file beside path, fsync, rename, fsync directory. On error the previous
// file at path is untouched and the temp file removed.
int ll_ckpt_write(const char *path, const struct ll_modelfile *mf,
                  const struct ll_ckpt_write_opts *opts, char *err, size_t errlen);

// ---- manifest (parsed, bounded) ----
struct ll_ckpt_tensor_entry {
  char *name;
  int type;                 // enum ll_type
  int n_dims;
  int64_t ne[LL_MAX_DIMS];
  int role;                 // enum ll_ckpt_role
  uint32_t shard;
  uint64_t offset;          // within the shard's raw bytes
  uint64_t size;            // bytes
};

enum ll_ckpt_shard_kind { LL_CKPT_SHARD_METADATA = 0, LL_CKPT_SHARD_TENSORS = 1 };

struct ll_ckpt_shard_entry {
  int kind;                 // enum ll_ckpt_shard_kind
  uint64_t offset;          // in the file
  uint64_t csize;           // compressed bytes (one zstd frame)
  uint64_t rsize;           // raw bytes
  uint64_t raw_offset;      // tensors: where the raw bytes go in the tensor data block
  unsigned char csha256[32];
  unsigned char rsha256[32];
  uint32_t first_tensor;    // index of the first tensor in it (n_tensors if none)
};

struct ll_ckpt_manifest {
  uint32_t version;
  uint32_t gguf_version;
  uint64_t gguf_alignment;
  // model summary (informational; the metadata shard is authoritative)
  char *arch;
  char *name;
  int64_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx, n_vocab; // -1 if unknown
  int64_t file_type;        // general.file_type (llama.cpp LLAMA_FTYPE id), -1 if unknown
  char *tokenizer_model;    // tokenizer.ggml.model ("llama", "gpt2"); may be NULL
  int64_t n_tokens, bos_id, eos_id;
  // provenance
  char *source_sha256, *source_format, *converter, *created, *note;
  struct ll_ckpt_training training;
  uint32_t metadata_shard;
  uint64_t n_kv;
  uint64_t data_size;       // bytes of the tensor data block (sum of tensor shard rsize)
  struct ll_ckpt_shard_entry *shards;
  uint32_t n_shards;
  struct ll_ckpt_tensor_entry *tensors;
  uint64_t n_tensors;
};

// Pure parser: checks types, bounds (caps above and in ll_modelfile.h), overlaps, that every
// tensor fits its shard with the size its dtype and shape imply. `out` is zeroed first and
// must be released with ll_ckpt_manifest_free() (also after an error).
int ll_ckpt_parse_manifest(const char *buf, size_t len, struct ll_ckpt_manifest *out,
                           char *err, size_t errlen);
void ll_ckpt_manifest_free(struct ll_ckpt_manifest *m);

// Open and fully verify a .ckpt file: header, manifest checksum, every shard's checksums;
// decompress shards with n_threads pthreads into one 64-byte aligned block (mf->backing).
// mf must be zeroed/initialized; on error it is left empty.
int ll_ckpt_open(const char *path, struct ll_modelfile *mf, int n_threads, char *err, size_t errlen);
// Same, also returning the parsed manifest (roles, training state); man may be NULL.
int ll_ckpt_open_ex(const char *path, struct ll_modelfile *mf, struct ll_ckpt_manifest *man,
                    int n_threads, char *err, size_t errlen);

// 1 if the first bytes of buf are the .ckpt magic (used by format detection).
int ll_ckpt_is_ckpt(const void *buf, size_t len);

#endif
