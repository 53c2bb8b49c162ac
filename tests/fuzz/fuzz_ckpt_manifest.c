// fuzz_ckpt_manifest.c - the .ckpt manifest parser on arbitrary bytes: it must return 0 or an
// error code with a message, never crash, leak or read out of bounds; a manifest it accepts
// must satisfy the invariants the loader relies on. The same bytes also go through the
// metadata-shard decoder (ll_ckpt_kv_decode), the other parser of untrusted .ckpt content.
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

  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  err[0] = 0;
  rc = ll_ckpt_kv_decode(data, size, &mf, err, sizeof err);
  if (rc != 0 && (err[0] == 0 || mf.n_kv != 0)) abort(); // refused: says why, leaves mf empty
  if (rc == 0) {
    // Accepted: re-encoding gives back exactly the input (the codec is a bijection on valid blobs).
    unsigned char *enc = NULL;
    size_t enclen = 0;
    if (ll_ckpt_kv_encode(&mf, &enc, &enclen, err, sizeof err) != 0) abort();
    if (enclen != size || memcmp(enc, data, size) != 0) abort();
    free(enc);
  }
  ll_modelfile_free(&mf);
  return 0;
}
