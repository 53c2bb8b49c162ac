// readbw.c - the machine's read bandwidth, the ceiling of token generation (each decoded token
// streams every weight once): a buffer far larger than the caches, read by 1..N threads with
// the widest loads the CPU has (AVX-512, else AVX2, else 8-byte words), best of several passes.
// Every speed figure in docs/PERFORMANCE.md names this measurement, taken the same minute.
//
//   build/tests/readbw [-t MAX_THREADS] [-m MIB] [-r PASSES] [-p 4k|huge|both]
//
// Prints one line per page size and thread count: "read bandwidth: T threads X.X GB/s (isa,
// MIB MiB, best of R, 4 KiB pages)", then the same in 2 MiB pages where the kernel grants
// transparent huge pages on request (madvise; llsrv keeps its packed weights there, so that
// is the ceiling to compare decode with; "(2 MiB pages requested, N% granted)" says how many
// it got). Not a test: numbers only.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Each reader sums its slice (so the loads are not optimized away) and returns the sum.
static uint64_t read_scalar(const uint64_t *p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) a ^= p[i], b ^= p[i + 1], c ^= p[i + 2], d ^= p[i + 3];
  return a ^ b ^ c ^ d;
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 4)));
    c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 8)));
    d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 12)));
  }
  a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint64_t *p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 8));
    c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 16));
    d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 24));
  }
  a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  return (uint64_t)_mm512_reduce_or_epi64(a);
}
#endif

// The process's anonymous memory in transparent huge pages now (0 where not reported).
static size_t anon_huge_bytes(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  size_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %zu kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb << 10;
}

typedef uint64_t (*read_fn)(const uint64_t *, size_t);
static read_fn g_read = read_scalar;
static const char *g_isa = "scalar";

struct job {
  const uint64_t *p;
  size_t n;
  uint64_t sum;
  pthread_barrier_t *bar;
  double t0, t1; // the reader's own clock readings around its pass
};

// Each reader times itself: with as many readers as CPUs a timing thread of its own may be
// descheduled across the start (measured on a 2-vCPU VM: 2 threads "65 GB/s" timed from the
// main thread, against 1 thread's 21), so a pass runs from the first reader's start to the
// last one's end.
static void *reader(void *u) {
  struct job *j = u;
  pthread_barrier_wait(j->bar); // all start together
  j->t0 = now();
  j->sum = g_read(j->p, j->n);
  j->t1 = now();
  return NULL;
}

int main(int argc, char **argv) {
  int max_t = 2, reps = 7;
  const char *pages = "both";
  size_t mib = 512;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-t") && i + 1 < argc) max_t = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-m") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-p") && i + 1 < argc) pages = argv[++i];
    else {
      fprintf(stderr, "usage: %s [-t MAX_THREADS] [-m MIB] [-r PASSES] [-p 4k|huge|both]\n", argv[0]);
      return 2;
    }
  }
  if (max_t < 1 || max_t > 256 || mib < 64 || mib > 65536 || reps < 1 || reps > 1000 ||
      (strcmp(pages, "4k") && strcmp(pages, "huge") && strcmp(pages, "both"))) {
    fprintf(stderr, "readbw: -t in 1..256, -m in 64..65536, -r in 1..1000, -p 4k, huge or both\n");
    return 2;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) g_read = read_avx512, g_isa = "avx512";
  else if (__builtin_cpu_supports("avx2")) g_read = read_avx2, g_isa = "avx2";
#endif
  const size_t bytes = mib << 20, n = bytes / 8;
  uint64_t sink = 0;
  for (int huge = 0; huge < 2; huge++) {
    if (huge ? !strcmp(pages, "4k") : !strcmp(pages, "huge")) continue;
    uint64_t *buf = aligned_alloc(2u << 20, bytes);
    if (!buf) return fprintf(stderr, "readbw: cannot allocate %zu MiB\n", mib), 1;
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE); // (4 KiB even where THP is "always")
#endif
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9E3779B97F4A7C15ull; // touch every page
    char what[64] = "4 KiB pages";
    if (huge) snprintf(what, sizeof what, "2 MiB pages requested, %.0f%% granted", 100.0 * (double)anon_huge_bytes() / (double)bytes);
    for (int t = 1; t <= max_t; t++) {
      double best = 1e30;
      for (int r = 0; r < reps; r++) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)t);
        struct job js[256];
        pthread_t th[256];
        const size_t per = (n / (size_t)t) & ~(size_t)31; // whole 256-byte groups per thread
        for (int k = 0; k < t; k++) {
          js[k] = (struct job){buf + (size_t)k * per, per, 0, &bar, 0, 0};
          pthread_create(&th[k], NULL, reader, &js[k]);
        }
        double t0 = 1e300, t1 = 0;
        for (int k = 0; k < t; k++) {
          pthread_join(th[k], NULL), sink ^= js[k].sum;
          if (js[k].t0 < t0) t0 = js[k].t0;
          if (js[k].t1 > t1) t1 = js[k].t1;
        }
        const double dt = t1 - t0;
        pthread_barrier_destroy(&bar);
        if (dt < best) best = dt;
      }
      const size_t per = (n / (size_t)t) & ~(size_t)31;
      printf("read bandwidth: %d thread%s %.1f GB/s (%s loads, %zu MiB, best of %d, %s)\n", t, t > 1 ? "s" : "", (double)per * 8 * t / best * 1e-9,
             g_isa, mib, reps, what);
    }
    free(buf);
  }
  return sink == 0x1234567 ? 3 : 0; // keeps the sums alive
}
