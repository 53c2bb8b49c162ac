// data_files.h - which files of a data path the training data pipeline reads (internal to
// server/train; exposed for tests): a single file, a git work tree's tracked files, or a
// directory walk that honours .gitignore; members that are binary, generated, empty or too large
// are skipped and counted (enum ll_data_skip).
#ifndef LL_DATA_FILES_H
#define LL_DATA_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "ll_data.h"

struct ll_data_file {
  char *path;   // for open()
  char *rel;    // relative to the data directory (a single file: its base name); names it in
                // messages and seeds its documents' validation hash
  int64_t size; // at listing time
  int jsonl;    // *.jsonl
};

struct ll_ignore;
struct ll_data_filelist {
  struct ll_data_file *v;
  size_t n, cap;
  int64_t skipped[LL_DATA_SKIP_N];
  char example[LL_DATA_SKIP_N][128];
  int is_dir;
  int git;          // the tracked files of a git work tree
  char note[256];   // why a work tree was walked instead (git failed), or ""
  const struct ll_ignore *gen; // while listing: the root .gitattributes' linguist-generated rules
};

// Lists path (a file or a directory) sorted by rel. Refuses a missing path, a named file that
// is not a readable regular text file, and unreadable directory members, naming them.
int ll_data_list_files(const char *path, int64_t max_file_bytes, struct ll_data_filelist *out, char *err,
                       size_t errlen);
void ll_data_filelist_free(struct ll_data_filelist *l);

// gitignore globs (git's wildmatch with WM_PATHNAME): '*' and '?' stop at '/', "[a-z]" and "[!x]"
// classes, '\' escapes, "**/" zero or more directories, "/**" everything inside. 1 on a match.
int ll_wildmatch(const char *pat, const char *s);

// A parsed .gitignore (one directory's rules). Rules of outer directories come first; the last
// rule that matches decides.
struct ll_ignore_rule {
  char *pat;    // without '!', trailing '/' and leading '/'
  char *base;   // directory of the .gitignore, relative to the walk's root ("" at the root)
  int negate, dir_only, anchored;
};
struct ll_ignore {
  struct ll_ignore_rule *v;
  size_t n, cap;
};
// Appends the rules of one .gitignore text (buf, len) found in directory base.
int ll_ignore_parse(struct ll_ignore *ig, const char *buf, size_t len, const char *base);
// 1 when rel (relative to the walk's root; is_dir for directories) is ignored.
int ll_ignore_match(const struct ll_ignore *ig, const char *rel, int is_dir);
void ll_ignore_truncate(struct ll_ignore *ig, size_t n); // drop rules after the first n
void ll_ignore_free(struct ll_ignore *ig);
// Appends rules for the lines of a .gitattributes text that set or unset linguist-generated.
int ll_attr_generated_parse(struct ll_ignore *ig, const char *buf, size_t len);

// Classification of a directory member: by its base name (lock files, *.min.js, ...) and by its
// first bytes.
int ll_data_generated_name(const char *base);
// head: the first bytes of a file (n of them; whole_file when the file is no longer).
int ll_data_head_is_binary(const unsigned char *head, size_t n, int whole_file);
int ll_data_head_is_generated(const unsigned char *head, size_t n);

#endif
