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

// Temporary files of the atomic writers. A writer holds an exclusive flock on its temporary
// file from creation until it has been renamed into place (or removed), on a descriptor kept
// open past the write's close: ll_tmp_hold after mkstemp, ll_tmp_release at the end. A
// temporary file nobody holds is a dead writer's (kill -9, power loss): ll_tmp_unlink_stale
// removes such a file (a regular file only; one a live writer holds stays) and returns 1, else 0.
int ll_tmp_hold(int fd);          // the holding descriptor (close it with ll_tmp_release), or -1
void ll_tmp_release(int hold);    // accepts -1
int ll_tmp_unlink_stale(const char *path);
// Removes the stale temporaries of a target path that the writers name "<dir>/.<base>.tmp-XXXXXX"
// (.ckpt) or "<path>.tmp.XXXXXX" (GGUF), XXXXXX being mkstemp's 6 characters, and nothing else.
// Returns how many went. Each write calls it first, so interrupted writes of a path do not pile up.
int ll_tmp_sweep(const char *path);

// A cache directory whose keys change with every build or driver (OpenCL program binaries):
// keeps the `keep` newest (by mtime) regular files named prefix*suffix, removes the older
// ones, and the stale temporaries prefix*suffix.tmp.XXXXXX (ll_tmp_unlink_stale: not one a
// live writer holds). Nothing else is touched. Returns how many files went.
int ll_cache_prune(const char *dir, const char *prefix, const char *suffix, int keep);

// Map a whole non-empty regular file read-only (MAP_PRIVATE). 0, or LL_EIO / LL_ETRUNC with
// a message naming the path. Release with munmap(*map, *len).
int ll_map_file(const char *path, void **map, size_t *len, char *err, size_t errlen);

#endif
