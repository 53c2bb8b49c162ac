// fileio.c - see ll_fileio.h.
#include "ll_fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_error.h"

int ll_write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int ll_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

int ll_fsync_parent_dir(const char *path) {
  char *copy = strdup(path);
  if (!copy) return -1;
  int rc = ll_fsync_dir(dirname(copy));
  free(copy);
  return rc;
}

int ll_map_file(const char *path, void **map, size_t *len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ll_errf(err, errlen, LL_EIO, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ll_errf(err, errlen, LL_EIO, "%s: not a regular file", path);
  }
  if (st.st_size == 0) {
    close(fd);
    return ll_errf(err, errlen, LL_ETRUNC, "%s: empty file", path);
  }
  void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) return ll_errf(err, errlen, LL_EIO, "%s: mmap: %s", path, strerror(e));
  *map = m;
  *len = (size_t)st.st_size;
  return 0;
}
