// testutil.h - tiny test harness: CHECK macros that count failures, a printed seed,
// helpers to find test data. Every test program ends with `return ll_test_summary();`,
// which prints "N passed, N failed" and returns nonzero on any failure.
#ifndef LL_TESTUTIL_H
#define LL_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int ll_test_passed, ll_test_failed;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (cond) {                                                                          \
      ll_test_passed++;                                                                  \
    } else {                                                                             \
      ll_test_failed++;                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);           \
    }                                                                                    \
  } while (0)

#define CHECKF(cond, ...)                                                                \
  do {                                                                                   \
    if (cond) {                                                                          \
      ll_test_passed++;                                                                  \
    } else {                                                                             \
      ll_test_failed++;                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
    }                                                                                    \
  } while (0)

int ll_test_summary(void);

// Seed from $LL_TEST_SEED or the clock; always printed so a failure can be replayed.
uint64_t ll_test_seed(void);
uint64_t ll_test_rand(uint64_t *state); // xorshift64*
float ll_test_randf(uint64_t *state);   // uniform [-1, 1)

// $LL_SHARED_DIR/<rel>, or NULL if the shared folder is absent (then the test says so and
// skips only the part that needs it). Returned string is static per call (copy it).
const char *ll_test_shared_path(const char *rel, char *buf, size_t buflen);
// Path of the cached SmolLM2 Q4_1 GGUF (fetched by tests/fetch-smollm2.sh), or NULL.
const char *ll_test_smollm2_path(char *buf, size_t buflen);
// Read a whole file; caller frees. NULL on error.
unsigned char *ll_test_read_file(const char *path, size_t *len);
// A fresh temporary directory (mkdtemp under $TMPDIR or /tmp); caller removes it.
const char *ll_test_tmpdir(char *buf, size_t buflen);

#endif
