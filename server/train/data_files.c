// data_files.c - the files a training data path stands for (data_files.h).
//
// A directory inside a git work tree is read as git sees it: `git ls-files -z` (spawned with
// posix_spawnp, no shell) lists the tracked files, so build outputs and other ignored or
// untracked files never count. Where git is absent or refuses (not a work tree, "dubious
// ownership", no git installed) the tree is walked and the .gitignore files met on the way down
// are applied (globs, "dir/", "!negation", "/anchored", "**"), as git would. Symbolic links are
// not followed (a link to a directory could loop; a link to a file is counted as "other").

#include "data_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ll_error.h"

extern char **environ;

#define LL_DATA_MAX_FILES (1 << 20)        // members of one data directory
#define LL_DATA_MAX_DEPTH 128              // directory levels
#define LL_DATA_MAX_LSFILES (256u << 20)   // bytes of `git ls-files -z` output
#define LL_DATA_HEAD 8192                  // bytes read to classify a file

// ---------------------------------------------------------------- wildmatch

static int class_match(const char **pp, unsigned char c) {
  const char *p = *pp + 1; // after '['
  int neg = 0, ok = 0;
  if (*p == '!' || *p == '^') neg = 1, p++;
  int first = 1;
  for (; *p && (*p != ']' || first); p++, first = 0) {
    unsigned char lo = (unsigned char)*p;
    if (*p == '\\' && p[1]) lo = (unsigned char)*++p;
    if (p[1] == '-' && p[2] && p[2] != ']') {
      unsigned char hi = (unsigned char)p[2];
      if (p[2] == '\\' && p[3]) hi = (unsigned char)p[3], p++;
      p += 2;
      if (c >= lo && c <= hi) ok = 1;
    } else if (c == lo) {
      ok = 1;
    }
  }
  if (*p != ']') return -1; // unterminated: '[' is literal
  *pp = p;
  return ok != neg;
}

static int wm(const char *start, const char *p, const char *s, int depth) {
  if (depth > 64) return 0; // hostile patterns: many stars
  for (; *p; p++, s++) {
    switch (*p) {
    case '?':
      if (!*s || *s == '/') return 0;
      break;
    case '[': {
      if (!*s || *s == '/') return 0;
      const char *q = p;
      int r = class_match(&q, (unsigned char)*s);
      if (r < 0) {
        if (*s != '[') return 0;
        break;
      }
      if (!r) return 0;
      p = q;
      break;
    }
    case '*': {
      const char *q = p;
      while (*q == '*') q++;
      if (q - p >= 2 && (p == start || p[-1] == '/') && (*q == '/' || !*q)) {
        if (!*q) return 1; // "/**" at the end: everything inside
        // "**/": zero or more directories
        if (wm(start, q + 1, s, depth + 1)) return 1;
        for (; *s; s++)
          if (*s == '/' && wm(start, q + 1, s + 1, depth + 1)) return 1;
        return 0;
      }
      if (!*q) return strchr(s, '/') == NULL;
      for (;; s++) {
        if (wm(start, q, s, depth + 1)) return 1;
        if (!*s || *s == '/') return 0;
      }
    }
    case '\\':
      if (p[1]) p++;
      /* fall through */
    default:
      if (*s != *p) return 0;
    }
  }
  return *s == '\0';
}

int ll_wildmatch(const char *pat, const char *s) { return wm(pat, pat, s, 0); }

// ---------------------------------------------------------------- .gitignore

static char *dupn(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n), d[n] = '\0';
  return d;
}

int ll_ignore_parse(struct ll_ignore *ig, const char *buf, size_t len, const char *base) {
  size_t i = 0;
  while (i < len) {
    size_t e = i;
    while (e < len && buf[e] != '\n') e++;
    const char *l = buf + i;
    size_t n = e - i;
    i = e + 1;
    if (n && l[n - 1] == '\r') n--;
    // trailing spaces go unless escaped with a backslash
    while (n && l[n - 1] == ' ' && !(n >= 2 && l[n - 2] == '\\')) n--;
    if (n == 0 || l[0] == '#' || n > 4096) continue;
    struct ll_ignore_rule r = {0};
    if (l[0] == '!') r.negate = 1, l++, n--;
    else if (l[0] == '\\' && n >= 2 && (l[1] == '!' || l[1] == '#')) l++, n--;
    if (n && l[n - 1] == '/') r.dir_only = 1, n--;
    if (n == 0) continue;
    if (memchr(l, '/', n)) r.anchored = 1; // a slash at the start or in the middle anchors it
    if (l[0] == '/') l++, n--;
    if (n == 0) continue;
    if (memchr(l, '\0', n)) continue;
    if (ig->n == ig->cap) {
      size_t nc = ig->cap ? ig->cap * 2 : 16;
      struct ll_ignore_rule *v = realloc(ig->v, nc * sizeof *v);
      if (!v) return LL_ENOMEM;
      ig->v = v, ig->cap = nc;
    }
    r.pat = dupn(l, n);
    r.base = dupn(base, strlen(base));
    if (!r.pat || !r.base) {
      free(r.pat), free(r.base);
      return LL_ENOMEM;
    }
    ig->v[ig->n++] = r;
  }
  return 0;
}

int ll_ignore_match(const struct ll_ignore *ig, const char *rel, int is_dir) {
  int ignored = 0;
  for (size_t k = 0; k < ig->n; k++) {
    const struct ll_ignore_rule *r = &ig->v[k];
    if (r->dir_only && !is_dir) continue;
    const char *sub = rel; // rel relative to the rule's directory
    size_t bl = strlen(r->base);
    if (bl) {
      if (strncmp(rel, r->base, bl) != 0 || rel[bl] != '/') continue;
      sub = rel + bl + 1;
    }
    int m;
    if (r->anchored) {
      m = ll_wildmatch(r->pat, sub);
    } else {
      const char *slash = strrchr(sub, '/');
      m = ll_wildmatch(r->pat, slash ? slash + 1 : sub);
    }
    if (m) ignored = !r->negate;
  }
  return ignored;
}

void ll_ignore_truncate(struct ll_ignore *ig, size_t n) {
  while (ig->n > n) {
    ig->n--;
    free(ig->v[ig->n].pat);
    free(ig->v[ig->n].base);
  }
}

void ll_ignore_free(struct ll_ignore *ig) {
  ll_ignore_truncate(ig, 0);
  free(ig->v);
  ig->v = NULL;
  ig->cap = 0;
}

// .gitattributes lines that mark files generated ("*.pb.go linguist-generated"), as GitHub's
// linguist reads them; "-linguist-generated" or "=false" unmarks (the last matching line wins).
int ll_attr_generated_parse(struct ll_ignore *ig, const char *buf, size_t len) {
  size_t i = 0;
  while (i < len) {
    size_t e = i;
    while (e < len && buf[e] != '\n') e++;
    const char *l = buf + i;
    size_t n = e - i;
    i = e + 1;
    if (n == 0 || l[0] == '#' || n > 4096) continue;
    size_t k = 0;
    while (k < n && l[k] != ' ' && l[k] != '\t') k++;
    size_t plen = k;
    int mark = -1;
    while (k < n) {
      while (k < n && (l[k] == ' ' || l[k] == '\t' || l[k] == '\r')) k++;
      size_t a = k;
      while (k < n && l[k] != ' ' && l[k] != '\t' && l[k] != '\r') k++;
      size_t al = k - a;
      if ((al == 18 && !memcmp(l + a, "linguist-generated", 18)) || (al == 23 && !memcmp(l + a, "linguist-generated=true", 23)))
        mark = 1;
      else if ((al == 19 && !memcmp(l + a, "-linguist-generated", 19)) ||
               (al == 24 && !memcmp(l + a, "linguist-generated=false", 24)))
        mark = 0;
    }
    if (mark < 0 || plen == 0) continue;
    // the same pattern rules as .gitignore, without "!" and "dir/" (they mean nothing here)
    char line[4100];
    size_t o = 0;
    if (!mark) line[o++] = '!';
    if (l[0] == '!' || l[0] == '#') line[o++] = '\\';
    memcpy(line + o, l, plen);
    o += plen;
    int rc = ll_ignore_parse(ig, line, o, "");
    if (rc) return rc;
  }
  return 0;
}

// ---------------------------------------------------------------- classification

int ll_data_generated_name(const char *base) {
  static const char *const pats[] = {
      "*.min.js", "*.min.css", "*.min.mjs", "*.js.map", "*.css.map", "*.map",
      "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lockb",
      "Cargo.lock", "poetry.lock", "Pipfile.lock", "Gemfile.lock", "composer.lock", "flake.lock",
      "go.sum", "uv.lock", "pdm.lock", "mix.lock", "Podfile.lock", "packages.lock.json",
      "*.pb.go", "*.pb.cc", "*.pb.h", "*_pb2.py", "*_pb2_grpc.py", "*.generated.*", "*.g.dart",
  };
  for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
    if (fnmatch(pats[i], base, 0) == 0) return 1;
  return 0;
}

// Length of the valid UTF-8 sequence at s (n bytes available), 0 if invalid, -1 if it is cut
// off by the end of the buffer.
static int utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  int k;
  unsigned min;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) k = 2, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) k = 3, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) k = 4, min = 0x10000;
  else return 0;
  if ((size_t)k > n) {
    for (size_t i = 1; i < n; i++)
      if ((s[i] & 0xC0) != 0x80) return 0;
    return -1;
  }
  unsigned cp = c & (0x7F >> k);
  for (int i = 1; i < k; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return k;
}

int ll_data_head_is_binary(const unsigned char *head, size_t n, int whole_file) {
  if (memchr(head, 0, n)) return 1;
  for (size_t i = 0; i < n;) {
    int k = utf8_seq(head + i, n - i);
    if (k == 0) return 1;
    if (k < 0) return whole_file; // cut by the 8 KiB window: fine unless the file ends there
    i += (size_t)k;
  }
  return 0;
}

// Markers generators put in the first lines (checked case-insensitively in the first 5 lines).
int ll_data_head_is_generated(const unsigned char *head, size_t n) {
  char low[1024];
  size_t m = 0;
  int lines = 0;
  for (size_t i = 0; i < n && m < sizeof low - 1 && lines < 5; i++) {
    unsigned char c = head[i];
    if (c == '\n') lines++;
    low[m++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
  }
  low[m] = '\0';
  static const char *const marks[] = {"@generated", "do not edit", "code generated by", "auto-generated",
                                      "autogenerated", "this file is generated", "this file was generated",
                                      "automatically generated"};
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
    if (strstr(low, marks[i])) return 1;
  return 0;
}

// ---------------------------------------------------------------- the list

static void note_skip(struct ll_data_filelist *l, int reason, const char *rel) {
  l->skipped[reason]++;
  if (!l->example[reason][0]) {
    size_t n = strlen(rel), cap = sizeof l->example[reason];
    if (n >= cap) n = cap - 1; // a long path is cut (an example in a message)
    memcpy(l->example[reason], rel, n);
    l->example[reason][n] = '\0';
  }
}

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static int push_file(struct ll_data_filelist *l, const char *path, const char *rel, int64_t size) {
  if (l->n >= LL_DATA_MAX_FILES) return LL_ELIMIT;
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 64;
    struct ll_data_file *v = realloc(l->v, nc * sizeof *v);
    if (!v) return LL_ENOMEM;
    l->v = v, l->cap = nc;
  }
  struct ll_data_file *f = &l->v[l->n];
  f->path = strdup(path);
  f->rel = strdup(rel);
  if (!f->path || !f->rel) {
    free(f->path), free(f->rel);
    return LL_ENOMEM;
  }
  f->size = size;
  f->jsonl = ends_with(rel, ".jsonl");
  l->n++;
  return 0;
}

// Reads the head of path (opened without following a final symlink). -errno on failure.
static ssize_t read_head(const char *path, unsigned char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  size_t got = 0;
  while (got < cap) {
    ssize_t r = read(fd, buf + got, cap - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      return -e;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  return (ssize_t)got;
}

// One directory member: counted as skipped or added. Errors only for unreadable files.
static int consider(struct ll_data_filelist *l, const char *path, const char *rel, int64_t max_bytes, char *err,
                    size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) { // tracked by git but deleted from the work tree
      note_skip(l, LL_DATA_SKIP_OTHER, rel);
      return 0;
    }
    return ll_errf(err, errlen, LL_EIO, "data: cannot stat '%s': %s", path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    note_skip(l, LL_DATA_SKIP_OTHER, rel);
    return 0;
  }
  if (st.st_size == 0) {
    note_skip(l, LL_DATA_SKIP_EMPTY, rel);
    return 0;
  }
  if (st.st_size > max_bytes) {
    note_skip(l, LL_DATA_SKIP_TOO_LARGE, rel);
    return 0;
  }
  const char *slash = strrchr(rel, '/');
  if (ll_data_generated_name(slash ? slash + 1 : rel) || (l->gen && ll_ignore_match(l->gen, rel, 0))) {
    note_skip(l, LL_DATA_SKIP_GENERATED, rel);
    return 0;
  }
  unsigned char head[LL_DATA_HEAD];
  ssize_t n = read_head(path, head, sizeof head);
  if (n < 0)
    return ll_errf(err, errlen, LL_EIO, "data: cannot read '%s': %s", path, strerror((int)-n));
  if (n == 0) {
    note_skip(l, LL_DATA_SKIP_EMPTY, rel);
    return 0;
  }
  if (ll_data_head_is_binary(head, (size_t)n, (int64_t)n >= st.st_size)) {
    note_skip(l, LL_DATA_SKIP_BINARY, rel);
    return 0;
  }
  if (ll_data_head_is_generated(head, (size_t)n)) {
    note_skip(l, LL_DATA_SKIP_GENERATED, rel);
    return 0;
  }
  int rc = push_file(l, path, rel, (int64_t)st.st_size);
  if (rc == LL_ELIMIT)
    return ll_errf(err, errlen, rc, "data: more than %d files under the data directory", LL_DATA_MAX_FILES);
  if (rc) return ll_errf(err, errlen, rc, "data: out of memory listing files");
  return 0;
}

static int join(char *out, size_t cap, const char *a, const char *b) {
  int k = (!a[0]) ? snprintf(out, cap, "%s", b) : snprintf(out, cap, "%s/%s", a, b);
  return k >= 0 && (size_t)k < cap ? 0 : LL_ELIMIT;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int read_small_file(const char *path, char **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) {
    close(fd);
    return -EINVAL; // a .gitignore over 1 MiB or not a file: not read
  }
  char *b = malloc((size_t)st.st_size + 1);
  if (!b) {
    close(fd);
    return -ENOMEM;
  }
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  *buf = b;
  *len = got;
  return 0;
}

// Walks root/rel (rel "" at the root) depth first, applying the .gitignore rules in ig.
static int walk(struct ll_data_filelist *l, struct ll_ignore *ig, const char *root, const char *rel, int depth,
                int64_t max_bytes, char *err, size_t errlen) {
  if (depth > LL_DATA_MAX_DEPTH)
    return ll_errf(err, errlen, LL_ELIMIT, "data: '%s/%s' is more than %d directories deep", root, rel,
                   LL_DATA_MAX_DEPTH);
  char dir[PATH_MAX], path[PATH_MAX], sub[PATH_MAX];
  if (join(dir, sizeof dir, root, rel))
    return ll_errf(err, errlen, LL_ELIMIT, "data: path '%s/%s' is too long", root, rel);
  if (!rel[0]) snprintf(dir, sizeof dir, "%s", root);
  size_t rules_before = ig->n;
  if (join(path, sizeof path, dir, ".gitignore") == 0) {
    char *buf;
    size_t len;
    if (read_small_file(path, &buf, &len) == 0) {
      int rc = ll_ignore_parse(ig, buf, len, rel);
      free(buf);
      if (rc) return ll_errf(err, errlen, rc, "data: out of memory reading '%s'", path);
    }
  }
  DIR *dh = opendir(dir);
  if (!dh) return ll_errf(err, errlen, LL_EIO, "data: cannot open directory '%s': %s", dir, strerror(errno));
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(dh))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".git")) continue;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 64;
      char **v = realloc(names, nc * sizeof *v);
      if (!v) {
        rc = LL_ENOMEM;
        break;
      }
      names = v, cap = nc;
    }
    if (!(names[n] = strdup(e->d_name))) {
      rc = LL_ENOMEM;
      break;
    }
    n++;
  }
  closedir(dh);
  if (rc) ll_errf(err, errlen, rc, "data: out of memory listing '%s'", dir);
  if (!rc && n > 1) qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n && !rc; i++) {
    if (join(sub, sizeof sub, rel, names[i]) || join(path, sizeof path, dir, names[i])) {
      rc = ll_errf(err, errlen, LL_ELIMIT, "data: path '%s/%s' is too long", dir, names[i]);
      break;
    }
    struct stat st;
    if (lstat(path, &st) != 0) continue; // vanished while listing
    int is_dir = S_ISDIR(st.st_mode);
    if (ll_ignore_match(ig, sub, is_dir)) {
      note_skip(l, LL_DATA_SKIP_IGNORED, sub);
      continue;
    }
    if (is_dir) rc = walk(l, ig, root, sub, depth + 1, max_bytes, err, errlen);
    else rc = consider(l, path, sub, max_bytes, err, errlen);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  ll_ignore_truncate(ig, rules_before);
  return rc;
}

// Is dir inside a git work tree (a .git entry in it or an ancestor)?
static int in_git_tree(const char *dir) {
  char p[PATH_MAX];
  if (!realpath(dir, p)) return 0;
  for (;;) {
    char g[PATH_MAX + 8];
    struct stat st;
    snprintf(g, sizeof g, "%s/.git", p[1] ? p : "");
    if (stat(g, &st) == 0) return 1;
    char *s = strrchr(p, '/');
    if (!s || s == p) {
      if (p[1] == '\0') return 0;
      p[1] = '\0'; // try "/"
      continue;
    }
    *s = '\0';
  }
}

// `git -C dir ls-files -z`: 0 with the NUL-separated paths, or a negative code with a note.
static int git_ls_files(const char *dir, char **out, size_t *outlen, char *note, size_t notelen) {
  *out = NULL;
  *outlen = 0;
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) return ll_errf(note, notelen, LL_EIO, "pipe: %s", strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  char *argv[] = {"git", "-C", (char *)dir, "ls-files", "-z", "--cached", NULL};
  pid_t pid;
  int e = posix_spawnp(&pid, "git", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pfd[1]);
  if (e != 0) {
    close(pfd[0]);
    return ll_errf(note, notelen, LL_EIO, "cannot run git: %s", strerror(e));
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  int rc = buf ? 0 : LL_ENOMEM;
  while (!rc) {
    if (n == cap) {
      if (cap >= LL_DATA_MAX_LSFILES) {
        rc = ll_errf(note, notelen, LL_ELIMIT, "git ls-files printed more than %u MiB", LL_DATA_MAX_LSFILES >> 20);
        break;
      }
      char *b = realloc(buf, cap * 2);
      if (!b) {
        rc = LL_ENOMEM;
        break;
      }
      buf = b, cap *= 2;
    }
    ssize_t r = read(pfd[0], buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = ll_errf(note, notelen, LL_EIO, "reading git's output: %s", strerror(errno));
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(pfd[0]); // a git still writing gets SIGPIPE
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    rc = ll_errf(note, notelen, LL_EIO, "git ls-files failed (exit status %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  *outlen = n;
  return 0;
}

static int cmp_file(const void *a, const void *b) {
  return strcmp(((const struct ll_data_file *)a)->rel, ((const struct ll_data_file *)b)->rel);
}

static int list_one(const char *path, int64_t max_bytes, struct ll_data_filelist *l, char *err, size_t errlen) {
  memset(l, 0, sizeof *l);
  if (!path || !path[0]) return ll_errf(err, errlen, LL_EINVAL, "data: no data path given");
  struct stat st;
  if (stat(path, &st) != 0)
    return ll_errf(err, errlen, errno == ENOENT ? LL_ENOTFOUND : LL_EIO, "data: '%s': %s", path, strerror(errno));
  if (S_ISREG(st.st_mode)) {
    if (st.st_size == 0) return ll_errf(err, errlen, LL_EFORMAT, "data: '%s' is empty", path);
    unsigned char head[LL_DATA_HEAD];
    ssize_t n = read_head(path, head, sizeof head);
    if (n == -ELOOP) { // the named file may be a symlink: follow it
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      n = fd < 0 ? -errno : read(fd, head, sizeof head);
      if (fd >= 0) close(fd);
    }
    if (n < 0) return ll_errf(err, errlen, LL_EIO, "data: cannot read '%s': %s", path, strerror((int)-n));
    if (ll_data_head_is_binary(head, (size_t)n, (int64_t)n >= st.st_size))
      return ll_errf(err, errlen, LL_EFORMAT, "data: '%s' is not UTF-8 text (a NUL byte or invalid UTF-8 in its first %d bytes)",
                     path, LL_DATA_HEAD);
    const char *base = strrchr(path, '/');
    int rc = push_file(l, path, base ? base + 1 : path, (int64_t)st.st_size);
    if (rc) return ll_errf(err, errlen, rc, "data: out of memory");
    return 0;
  }
  if (!S_ISDIR(st.st_mode)) return ll_errf(err, errlen, LL_EFORMAT, "data: '%s' is neither a file nor a directory", path);
  l->is_dir = 1;
  char root[PATH_MAX];
  size_t pl = strlen(path);
  while (pl > 1 && path[pl - 1] == '/') pl--; // "docs/" names the same directory as "docs"
  if (pl >= sizeof root) return ll_errf(err, errlen, LL_ELIMIT, "data: path '%s' is too long", path);
  memcpy(root, path, pl);
  root[pl] = '\0';
  int rc = 0;
  struct ll_ignore gen = {0};
  char ga[PATH_MAX + 16];
  snprintf(ga, sizeof ga, "%s/.gitattributes", root);
  char *gbuf;
  size_t glen;
  if (read_small_file(ga, &gbuf, &glen) == 0) {
    rc = ll_attr_generated_parse(&gen, gbuf, glen);
    free(gbuf);
    if (rc) {
      ll_ignore_free(&gen);
      return ll_errf(err, errlen, rc, "data: out of memory reading '%s'", ga);
    }
  }
  l->gen = &gen;
  if (in_git_tree(root)) {
    char *out;
    size_t n;
    char note[200];
    rc = git_ls_files(root, &out, &n, note, sizeof note);
    if (rc == 0) {
      l->git = 1;
      char full[PATH_MAX];
      for (size_t i = 0; i < n && !rc;) {
        size_t e = i;
        while (e < n && out[e]) e++;
        if (e == n) break; // a last entry without its NUL: cut output
        const char *rel = out + i;
        i = e + 1;
        if (join(full, sizeof full, root, rel)) {
          rc = ll_errf(err, errlen, LL_ELIMIT, "data: path '%s/%s' is too long", root, rel);
          break;
        }
        rc = consider(l, full, rel, max_bytes, err, errlen);
      }
      free(out);
      if (rc) {
        ll_ignore_free(&gen);
        ll_data_filelist_free(l);
        return rc;
      }
    } else {
      snprintf(l->note, sizeof l->note, "%s; walked the tree applying .gitignore", note);
      rc = 1;
    }
  } else {
    rc = 1;
  }
  if (rc == 1) { // walk
    struct ll_ignore ig = {0};
    rc = walk(l, &ig, root, "", 0, max_bytes, err, errlen);
    ll_ignore_free(&ig);
  }
  ll_ignore_free(&gen);
  l->gen = NULL;
  if (rc) {
    ll_data_filelist_free(l);
    return rc;
  }
  if (l->n > 1) qsort(l->v, l->n, sizeof *l->v, cmp_file);
  return 0;
}

void ll_data_filelist_free(struct ll_data_filelist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i].path), free(l->v[i].rel);
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

// A comma-separated list ("README.md,man,docs"): the union of what each part lists, each file
// named by the part it came from ("man/llsrv.1"), so that the same file met twice counts once
// and a split decided by those names does not depend on the order of the parts. A path that
// exists as written is one path, commas and all.
int ll_data_list_files(const char *path, int64_t max_bytes, struct ll_data_filelist *l, char *err, size_t errlen) {
  struct stat st;
  if (!path || !strchr(path, ',') || stat(path, &st) == 0) return list_one(path, max_bytes, l, err, errlen);
  memset(l, 0, sizeof *l);
  l->is_dir = 1, l->git = 1;
  const char *p = path;
  int rc = 0, parts = 0;
  while (!rc && *p) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    while (n && (*p == ' ' || *p == '\t')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    while (n > 1 && p[n - 1] == '/') n--;
    if (n >= PATH_MAX) {
      rc = ll_errf(err, errlen, LL_ELIMIT, "data: path '%.64s...' is too long", p);
      break;
    }
    if (n) {
      char part[PATH_MAX];
      memcpy(part, p, n);
      part[n] = '\0';
      struct ll_data_filelist one;
      rc = list_one(part, max_bytes, &one, err, errlen);
      for (size_t i = 0; !rc && i < one.n; i++) {
        char rel[PATH_MAX];
        int k = one.is_dir ? snprintf(rel, sizeof rel, "%s/%s", part, one.v[i].rel) : snprintf(rel, sizeof rel, "%s", part);
        if (k < 0 || (size_t)k >= sizeof rel) rc = ll_errf(err, errlen, LL_ELIMIT, "data: path '%s/%s' is too long", part, one.v[i].rel);
        else if ((rc = push_file(l, one.v[i].path, rel, one.v[i].size)) != 0)
          rc = ll_errf(err, errlen, rc, rc == LL_ELIMIT ? "data: more than %d files" : "data: out of memory (%d files)", LL_DATA_MAX_FILES);
      }
      for (int r = 0; !rc && r < LL_DATA_SKIP_N; r++) {
        l->skipped[r] += one.skipped[r];
        if (!l->example[r][0]) snprintf(l->example[r], sizeof l->example[r], "%s", one.example[r]);
      }
      if (!rc && !l->note[0]) snprintf(l->note, sizeof l->note, "%s", one.note);
      l->git = l->git && one.git;
      ll_data_filelist_free(&one);
      parts++;
    }
    p = e ? e + 1 : p + strlen(p);
  }
  if (!rc && !parts) rc = ll_errf(err, errlen, LL_EINVAL, "data: no data path given");
  if (rc) {
    ll_data_filelist_free(l);
    return rc;
  }
  if (l->n > 1) qsort(l->v, l->n, sizeof *l->v, cmp_file);
  size_t k = 0; // the same file through two parts ("man,man/llsrv.1") counts once
  for (size_t i = 0; i < l->n; i++) {
    if (k && strcmp(l->v[k - 1].rel, l->v[i].rel) == 0) {
      free(l->v[i].path), free(l->v[i].rel);
      continue;
    }
    l->v[k++] = l->v[i];
  }
  l->n = k;
  return 0;
}
