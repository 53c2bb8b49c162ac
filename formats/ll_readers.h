// ll_readers.h - readers of model formats other than GGUF and .ckpt.
#ifndef LL_READERS_H
#define LL_READERS_H

#include <stddef.h>
#include <stdint.h>

#include "ll_modelfile.h"

// llama.2c legacy .bin (7 int32 header + fp32 weights). Pure (buf, len): tensor data points
// into buf. Tensors get GGUF names and shapes; metadata is synthesized (architecture "llama",
// no tokenizer: the .bin carries none).
int ll_llama2c_parse(const void *buf, size_t len, struct ll_modelfile *mf, char *err, size_t errlen);
// mmap + parse; also records the file's sha256.
int ll_llama2c_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen);

// Hugging Face safetensors: a directory (config.json, model.safetensors or sharded
// model-*.safetensors with the index, optional tokenizer.json / tokenizer_config.json) or a
// single .safetensors file beside a config.json. F32/F16/BF16 tensors; HF Llama names are mapped
// to GGUF names, q/k rows permuted as llama.cpp's converter does; data copied to the heap.
int ll_safetensors_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen);
// Pure parser of a safetensors header (8-byte length + JSON) against a file of file_len bytes.
int ll_safetensors_parse_header(const void *buf, size_t len, uint64_t file_len, struct ll_modelfile *mf, char *err, size_t errlen);

// sha256 of a memory range as 64 hex chars + NUL.
int ll_sha256_hex(const void *buf, size_t len, char out[65]);

#endif
