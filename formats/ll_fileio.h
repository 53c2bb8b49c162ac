// ll_fileio.h - small POSIX helpers shared by the file writers (GGUF, .ckpt).
#ifndef LL_FILEIO_H
#define LL_FILEIO_H

#include <stddef.h>

// write(2) until all n bytes are written (EINTR retried, at most 1 GiB per call); 0 or -1 (errno).
int ll_write_all(int fd, const void *buf, size_t n);
// fsync the directory `dir` (makes a rename inside it durable); 0 or -1 (errno).
int ll_fsync_dir(const char *dir);
// fsync the directory that contains `path`; 0 or -1 (errno).
int ll_fsync_parent_dir(const char *path);

// Map a whole non-empty regular file read-only (MAP_PRIVATE). 0, or LL_EIO / LL_ETRUNC with
// a message naming the path. Release with munmap(*map, *len).
int ll_map_file(const char *path, void **map, size_t *len, char *err, size_t errlen);

#endif
