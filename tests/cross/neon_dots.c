// neon_dots.c - the NEON dot products (kernels/cpu/dot_neon.c) against the scalar references
// (dot.c), bit for bit. Built by tests/cross/neon_check.sh with an aarch64 cross compiler and
// run under qemu-aarch64, so the NEON code is compiled and tested on an x86 build machine.
// Standalone on purpose (no test harness, no libraries): dot.c, dot_neon.c and quant.c only.
// Seed from $LL_TEST_SEED (printed, so a failure can be replayed).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ll_cpu_dot.h"
#include "ll_quant.h"

#if !(defined(__aarch64__) && defined(__ARM_NEON))
#error "neon_dots.c is built for aarch64 with NEON (tests/cross/neon_check.sh)"
#endif

static uint64_t rs;
static uint64_t rnd(void) { // xorshift64*
  rs ^= rs >> 12, rs ^= rs << 25, rs ^= rs >> 27;
  return rs * 0x2545F4914F6CDD1Dull;
}
static float rndf(void) { return (float)(rnd() >> 40) / (float)(1u << 24) * 2.0f - 1.0f; } // [-1, 1)

int main(void) {
  const char *env = getenv("LL_TEST_SEED");
  if (env && *env) {
    rs = strtoull(env, NULL, 0);
  } else { // as tests/testutil.c: a fresh seed each run
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rs = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
  }
  if (!rs) rs = 1;
  printf("neon_dots: seed: LL_TEST_SEED=%" PRIu64 "\n", rs);
#if defined(__ARM_FEATURE_DOTPROD)
  const char *path = "vdotq_s32";
#else
  const char *path = "vmull_s8+vpadalq_s16";
#endif
  int fails = 0, checks = 0;
  if (strcmp(ll_cpu_isa(), "neon") != 0) {
    fprintf(stderr, "FAIL: ll_cpu_isa() is \"%s\", expected \"neon\"\n", ll_cpu_isa());
    fails++;
  }
  const int types[] = {LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q8_0};
  // 32 (one block), odd multiples of 32 (no pairing of blocks), model sizes.
  const int lens[] = {32, 64, 96, 160, 224, 480, 576, 1024, 1056, 2048, 4128, 5632};
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
    const int t = types[ti];
    const struct ll_type_kernels *ref = ll_cpu_kernels_ref(t), *neon = ll_cpu_kernels_neon(t), *best = ll_cpu_kernels(t);
    if (!ref || !neon || !best || best != neon || strcmp(best->isa, "neon") != 0 || neon->act_type != ref->act_type ||
        neon->from_float != ref->from_float) {
      fprintf(stderr, "FAIL %s: NEON kernels missing, not chosen or with another activation type/quantizer\n",
              ll_type_name(t));
      fails++;
      continue;
    }
    int tfails = 0, tchecks = 0;
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
      for (int trial = 0; trial < 8; trial++) {
        const int k = lens[li];
        const size_t wsz = ll_row_size(t, k), asz = ll_row_size(ref->act_type, k);
        float *x = malloc((size_t)k * sizeof *x), *v = malloc((size_t)k * sizeof *v);
        unsigned char *w = malloc(wsz), *act = malloc(asz);
        if (!x || !v || !w || !act) return 2;
        for (int i = 0; i < k; i++) x[i] = rndf(), v[i] = rndf() * 3;
        if (trial == 1) memset(v, 0, 32 * sizeof *v);              // an all-zero activation block
        if (trial == 2) for (int i = 0; i < k; i++) v[i] *= 1e-6f; // fp16 scales near underflow
        if (ll_quantize_row(t, x, w, k) != 0) return 2;            // reference weight quantizer
        ref->from_float(v, act, k);                                // reference activation quantizer
        if (trial == 3) {
          // Raw bytes everywhere (-128 included: 128·128 per product is the int16 worst case),
          // scales kept finite.
          for (size_t i = 0; i < wsz; i++) w[i] = (unsigned char)rnd();
          for (size_t i = 0; i < asz; i++) act[i] = (unsigned char)rnd();
          const size_t wb = ll_type_traits_get(t)->type_size, ab = ll_type_traits_get(ref->act_type)->type_size;
          const int nhw = t == LL_TYPE_Q4_1 ? 2 : 1, nha = ref->act_type == LL_TYPE_Q8_1 ? 2 : 1;
          for (size_t o = 0; o < wsz; o += wb)
            for (int h = 0; h < nhw; h++) {
              const ll_fp16 d = ll_fp32_to_fp16(rndf() * 0.05f);
              memcpy(w + o + 2 * h, &d, 2);
            }
          for (size_t o = 0; o < asz; o += ab)
            for (int h = 0; h < nha; h++) {
              const ll_fp16 d = ll_fp32_to_fp16(rndf() * 0.05f);
              memcpy(act + o + 2 * h, &d, 2);
            }
        }
        if (trial == 4) { // every weight and activation byte at the extremes
          memset(w, t == LL_TYPE_Q8_0 ? 0x80 : t == LL_TYPE_Q4_0 ? 0x00 : 0xFF, wsz); // -128, -8 -8, 15 15
          memset(act, 0x80, asz);
          const size_t wb = ll_type_traits_get(t)->type_size, ab = ll_type_traits_get(ref->act_type)->type_size;
          const ll_fp16 d = ll_fp32_to_fp16(0.01f);
          for (size_t o = 0; o < wsz; o += wb) memcpy(w + o, &d, 2), memcpy(w + o + 2 * (t == LL_TYPE_Q4_1), &d, 2);
          for (size_t o = 0; o < asz; o += ab) memcpy(act + o, &d, 2), memcpy(act + o + 2 * (ref->act_type == LL_TYPE_Q8_1), &d, 2);
        }
        float s1, s2;
        ref->vec_dot(k, &s1, w, act);
        neon->vec_dot(k, &s2, w, act);
        tchecks++;
        if (memcmp(&s1, &s2, sizeof s1) != 0) {
          if (tfails < 5)
            fprintf(stderr, "FAIL %s k=%d trial=%d: neon %.9g != reference %.9g\n", ll_type_name(t), k, trial, (double)s2,
                    (double)s1);
          tfails++;
        }
        free(x), free(v), free(w), free(act);
      }
    printf("neon_dots: %-5s %d/%d dots bit-identical to the reference\n", ll_type_name(t), tchecks - tfails, tchecks);
    fails += tfails;
    checks += tchecks;
  }
  // Types without NEON kernels fall back to the scalar references.
  const struct ll_type_kernels *q5 = ll_cpu_kernels(LL_TYPE_Q5_0);
  if (!q5 || q5 != ll_cpu_kernels_ref(LL_TYPE_Q5_0)) fprintf(stderr, "FAIL: q5_0 does not fall back to the reference\n"), fails++;
  printf("neon_cross: %s, isa %s: %d dots, %d mismatches: %s\n", path, ll_cpu_isa(), checks, fails, fails ? "FAIL" : "OK");
  return fails ? 1 : 0;
}
