// fuzz_ckpt_manifest.c - the .ckpt manifest parser on arbitrary bytes: it must return 0 or an
// error code with a message, never crash, leak or read out of bounds; a manifest it accepts
// must satisfy the invariants the loader relies on. (The metadata shard is decoded by
// ll_gguf_kv_deserialize, fuzzed with the GGUF parser.)
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ll_ckpt.h"
#include "ll_quant.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct ll_ckpt_manifest m;
  char err[512];
  err[0] = 0;
  int rc = ll_ckpt_parse_manifest((const char *)data, size, &m, err, sizeof err);
  if (rc != 0) {
    if (err[0] == 0) abort(); // every refusal says why
  } else {
    // Accepted: every tensor lies inside its tensor shard, sizes agree with dtype and shape.
    uint64_t data_size = 0;
    for (uint32_t i = 0; i < m.n_shards; i++)
      if (m.shards[i].kind == LL_CKPT_SHARD_TENSORS) data_size += m.shards[i].rsize;
    if (data_size != m.data_size || m.metadata_shard >= m.n_shards) abort();
    for (uint64_t i = 0; i < m.n_tensors; i++) {
      const struct ll_ckpt_tensor_entry *t = &m.tensors[i];
      if (t->shard >= m.n_shards) abort();
      const struct ll_ckpt_shard_entry *s = &m.shards[t->shard];
      if (s->kind != LL_CKPT_SHARD_TENSORS || t->offset + t->size > s->rsize) abort();
      if (s->raw_offset + t->offset + t->size > m.data_size) abort();
      if (ll_row_size(t->type, t->ne[0]) == 0) abort();
    }
  }
  ll_ckpt_manifest_free(&m);
  return 0;
}
