// fileio.c - see ll_fileio.h.
#include "ll_fileio.h"

#include <errno.h>
#include <stddef.h>
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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

int ll_tmp_hold(int fd) {
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 0); // the same open file: its lock outlives close(fd)
  if (h < 0) return -1;
  if (flock(h, LOCK_EX | LOCK_NB) != 0) {
    close(h);
    return -1;
  }
  return h;
}

void ll_tmp_release(int hold) {
  if (hold >= 0) close(hold);
}

int ll_tmp_unlink_stale(const char *path) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat a, b;
  int gone = 0;
  // Unlinked only while we hold the lock and the name still names the file we locked.
  if (fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 && lstat(path, &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino)
    gone = unlink(path) == 0;
  close(fd);
  return gone;
}

static int mkstemp_suffix(const char *s) {
  static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  return strlen(s) == 6 && strspn(s, ok) == 6;
}

int ll_tmp_sweep(const char *path) {
  char *copy = strdup(path), *copy2 = strdup(path);
  if (!copy || !copy2) {
    free(copy), free(copy2);
    return 0;
  }
  const char *dir = dirname(copy), *base = basename(copy2);
  const size_t bl = strlen(base);
  int n = 0;
  DIR *d = bl ? opendir(dir) : NULL;
  for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
    const char *nm = e->d_name, *sfx = NULL;
    if (nm[0] == '.' && !strncmp(nm + 1, base, bl) && !strncmp(nm + 1 + bl, ".tmp-", 5)) sfx = nm + 1 + bl + 5; // .ckpt
    else if (!strncmp(nm, base, bl) && !strncmp(nm + bl, ".tmp.", 5)) sfx = nm + bl + 5;                   // GGUF
    if (!sfx || !mkstemp_suffix(sfx)) continue;
    char *p = malloc(strlen(dir) + strlen(nm) + 2);
    if (!p) break;
    sprintf(p, "%s/%s", dir, nm);
    n += ll_tmp_unlink_stale(p);
    free(p);
  }
  if (d) closedir(d);
  free(copy), free(copy2);
  return n;
}

struct cache_entry {
  char *path;
  struct timespec mtime;
};

static int newest_first(const void *va, const void *vb) {
  const struct cache_entry *a = va, *b = vb;
  if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec ? 1 : -1;
  if (a->mtime.tv_nsec != b->mtime.tv_nsec) return a->mtime.tv_nsec < b->mtime.tv_nsec ? 1 : -1;
  return strcmp(a->path, b->path);
}

int ll_cache_prune(const char *dir, const char *prefix, const char *suffix, int keep) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  const size_t pl = strlen(prefix), sl = strlen(suffix);
  struct cache_entry *v = NULL;
  size_t n = 0, cap = 0;
  int gone = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *nm = e->d_name;
    const size_t len = strlen(nm);
    if (len <= pl + sl || strncmp(nm, prefix, pl) != 0) continue;
    char *p = malloc(strlen(dir) + len + 2);
    if (!p) break;
    sprintf(p, "%s/%s", dir, nm);
    const char *tmp = strstr(nm + pl, ".tmp.");
    if (tmp && tmp - nm >= (ptrdiff_t)sl && strncmp(tmp - sl, suffix, sl) == 0 && mkstemp_suffix(tmp + 5)) {
      gone += ll_tmp_unlink_stale(p); // a killed writer's; a live one holds its lock
      free(p);
      continue;
    }
    struct stat st;
    if (strcmp(nm + len - sl, suffix) != 0 || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
      free(p);
      continue;
    }
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      struct cache_entry *nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        free(p);
        break;
      }
      v = nv, cap = nc;
    }
    v[n++] = (struct cache_entry){p, st.st_mtim};
  }
  closedir(d);
  if (n > 1) qsort(v, n, sizeof *v, newest_first);
  for (size_t i = 0; i < n; i++) {
    if ((int)i >= keep && unlink(v[i].path) == 0) gone++;
    free(v[i].path);
  }
  free(v);
  return gone;
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
