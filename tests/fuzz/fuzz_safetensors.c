// fuzz_safetensors.c - the safetensors header parser on arbitrary bytes.
#include <stdint.h>

#include "ll_readers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct ll_modelfile mf;
  char err[256];
  ll_modelfile_init(&mf);
  ll_safetensors_parse_header(data, size, size, &mf, err, sizeof err);
  ll_modelfile_free(&mf);
  return 0;
}
