// fuzz_llama2c.c - the llama2.c header/size validation on arbitrary bytes.
#include <stdint.h>

#include "ll_readers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct ll_modelfile mf;
  char err[256];
  if (ll_llama2c_parse(data, size, &mf, err, sizeof err) == 0) ll_modelfile_free(&mf);
  return 0;
}
