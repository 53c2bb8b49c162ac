// model_open.c - open any supported model file, detected by content rather than by name.
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_ckpt.h"
#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_modelfile.h"
#include "ll_readers.h"

int ll_model_open(const char *path, struct ll_modelfile *mf, char *err, size_t errlen) {
  ll_modelfile_init(mf);
  struct stat st;
  if (stat(path, &st) != 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return ll_safetensors_open(path, mf, err, errlen);
  size_t plen = strlen(path);
  if (plen > 12 && strcmp(path + plen - 12, ".safetensors") == 0) return ll_safetensors_open(path, mf, err, errlen);

  unsigned char head[64];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  ssize_t n = read(fd, head, sizeof head);
  close(fd);
  if (n < 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  if (n >= 4 && memcmp(head, "GGUF", 4) == 0) return ll_gguf_open(path, mf, err, errlen);
  if (ll_ckpt_is_ckpt(head, (size_t)n)) { // shards decompress in parallel: one thread per CPU
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return ll_ckpt_open(path, mf, cpus > 0 ? (int)(cpus < 16 ? cpus : 16) : 1, err, errlen);
  }
  // llama2.c has no magic: accept it only if its header and size are consistent.
  char e2[384] = "";
  int rc = ll_llama2c_open(path, mf, e2, sizeof e2);
  if (rc == 0) return 0;
  return ll_errf(err, errlen, LL_EFORMAT, "%s: unrecognised model file (not GGUF, .ckpt, safetensors or llama2.c: %s)", path, e2);
}
