// fuzz_gguf.c - the GGUF parser on arbitrary bytes; a parsed file's metadata must also
// survive serialize -> deserialize.
#include <stdint.h>
#include <stdlib.h>

#include "ll_gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct ll_modelfile mf;
  char err[256];
  if (ll_gguf_parse(data, size, &mf, err, sizeof err) != 0) return 0;
  void *blob;
  size_t len;
  if (ll_gguf_kv_serialize(&mf, &blob, &len) == 0) {
    struct ll_modelfile m2;
    ll_modelfile_init(&m2);
    if (ll_gguf_kv_deserialize(blob, len, &m2, err, sizeof err) != 0) __builtin_trap(); // our own output must parse
    ll_modelfile_free(&m2);
    free(blob);
  }
  ll_modelfile_free(&mf);
  return 0;
}
