// testutil.c - see testutil.h.
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int ll_test_passed, ll_test_failed;

int ll_test_summary(void) {
  printf("%d passed, %d failed\n", ll_test_passed, ll_test_failed);
  return ll_test_failed ? 1 : 0;
}

uint64_t ll_test_seed(void) {
  const char *s = getenv("LL_TEST_SEED");
  uint64_t seed;
  if (s && *s) {
    seed = strtoull(s, NULL, 0);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
  }
  if (seed == 0) seed = 1;
  printf("seed: LL_TEST_SEED=%llu\n", (unsigned long long)seed);
  fflush(stdout);
  return seed;
}

uint64_t ll_test_rand(uint64_t *st) {
  uint64_t x = *st;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *st = x;
  return x * 0x2545F4914F6CDD1DULL;
}

float ll_test_randf(uint64_t *st) {
  return (float)((ll_test_rand(st) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

const char *ll_test_shared_path(const char *rel, char *buf, size_t buflen) {
  const char *dir = getenv("LL_SHARED_DIR");
  struct stat st;
  if (!dir || !*dir) return NULL;
  snprintf(buf, buflen, "%s/%s", dir, rel);
  if (stat(buf, &st) != 0) return NULL;
  return buf;
}

const char *ll_test_smollm2_path(char *buf, size_t buflen) {
  const char *dir = getenv("LL_MODEL_CACHE");
  struct stat st;
  if (!dir || !*dir) return NULL;
  snprintf(buf, buflen, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
  if (stat(buf, &st) != 0) return NULL;
  return buf;
}

unsigned char *ll_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  unsigned char *buf = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (buf) {
    buf[n] = 0;
    *len = (size_t)n;
  }
  fclose(f);
  return buf;
}

const char *ll_test_tmpdir(char *buf, size_t buflen) {
  const char *t = getenv("TMPDIR");
  snprintf(buf, buflen, "%s/lltest.XXXXXX", (t && *t) ? t : "/tmp");
  return mkdtemp(buf);
}
