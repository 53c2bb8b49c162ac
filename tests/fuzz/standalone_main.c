// standalone_main.c - replays a fuzz target's corpus without libFuzzer, so every crash input
// ever found stays a regression test in the normal (and sanitizer) build.
// Usage: fuzz_x DIR|FILE...   (a missing directory counts as an empty corpus)
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
  fclose(f);
  if (!buf) return -1;
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      DIR *d = opendir(argv[i]);
      struct dirent *e;
      while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
        if (run_file(p) == 0) files++;
      }
      if (d) closedir(d);
    } else if (run_file(argv[i]) == 0) {
      files++;
    }
  }
  // Also a few synthetic inputs so an empty corpus still exercises the target.
  static const uint8_t empty[1];
  LLVMFuzzerTestOneInput(empty, 0);
  uint8_t junk[4096];
  uint64_t s = 0x9E3779B97F4A7C15ULL;
  for (int r = 0; r < 200; r++) {
    size_t n = (size_t)(s % sizeof junk);
    for (size_t k = 0; k < n; k++) {
      s ^= s << 13; s ^= s >> 7; s ^= s << 17;
      junk[k] = (uint8_t)s;
    }
    LLVMFuzzerTestOneInput(junk, n);
  }
  printf("replayed %d corpus files + 201 synthetic inputs\n", files);
  printf("%d passed, 0 failed\n", files + 201);
  return 0;
}
