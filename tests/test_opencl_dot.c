// test_opencl_dot.c - the fast tier's integer-dot decode products (kernels/opencl/llsrv_dot.cl)
// and the choice of ll_dot4 behind its probe (program.c ocl_dot_setup, LL_OPENCL_DOT), on the
// device of $LL_TEST_OPENCL_DEVICE (default: the first CPU OpenCL device, PoCL in CI).
//
// - Products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants (T = 1, 3, 6 tokens) against the CPU backend:
//   each 32-weight block's integer sum is the CPU's exactly and is scaled by the CPU's
//   expression, so only the order of the block sums can differ. Up to 512 columns a work item
//   holds one block and the lanes are added in order: for Q5_0 and Q5_1 the CPU's order
//   (kernels/cpu/dot.c: block after block), so on a device with IEEE f32 and f64 (a CPU
//   device: PoCL) their results are the CPU's bits, asserted. Q4_0 (the CPU fuses each block's
//   multiply into the running sum), Q4_1 and Q8_0 (the CPU keeps llama.cpp's eight lanes of 4
//   elements through the blocks, then a tree), wider rows (576 columns) and every case on other
//   devices: nmse < 1e-11 (measured 1e-14 on PoCL, as the float products'). Q4_K, Q5_K, Q6_K
//   (256, 512, 768 columns; random bytes with sane scales): the unit's integers are the CPU's,
//   added per unit in f32 where the CPU adds a 256-block's integers first: nmse < 1e-11.
//   The float products (LL_OPENCL_DOT=off, fmm_*) are run beside for contrast (printed).
//   RMSNorm fused in: 1e-4, as test_opencl (the norm's own sum order can move an activation
//   across a Q8 rounding step).
// - The choice: auto gives ptx on NVIDIA, khr where the device advertises
//   cl_khr_integer_dot_product, else portable; forcing ptx or khr on a device without them
//   (PoCL) falls back to portable with one line saying why; a probe that fails
//   (LL_OPENCL_FAULT=dotcheck) leaves integer dots off; an unknown value is named. The
//   device-choice reason names the dots.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "testutil.h"

static uint64_t rs;
static char dev_name[32] = "opencl:0:0";
static char cache[64];

static double nmse(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)a[i] - ref[i];
    num += d * d, den += (double)ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

static void randf(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = ll_test_randf(&rs) * scale;
}

static int find_device(void) {
  const char *env = getenv("LL_TEST_OPENCL_DEVICE");
  if (env && *env) return snprintf(dev_name, sizeof dev_name, "%s", env), 1;
  cl_platform_id plats[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) return 0;
  for (cl_uint p = 0; p < np && p < 16; p++) {
    cl_device_id d[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, d, &nd) != CL_SUCCESS) continue;
    for (cl_uint i = 0; i < nd && i < 16; i++) {
      cl_device_type t = 0;
      clGetDeviceInfo(d[i], CL_DEVICE_TYPE, sizeof t, &t, NULL);
      if (t & CL_DEVICE_TYPE_CPU) return snprintf(dev_name, sizeof dev_name, "opencl:%u:%u", p, i), 1;
    }
  }
  return 0;
}

// The fast tier with LL_OPENCL_DOT=dot (NULL: unset) and LL_OPENCL_FAULT=fault; its reason in
// reason.
static struct ll_backend *open_fast(const char *dot, const char *fault, struct ll_backend_info *in, char *reason, size_t rl) {
  setenv("LL_OPENCL_REFERENCE", "0", 1);
  if (dot) setenv("LL_OPENCL_DOT", dot, 1);
  else unsetenv("LL_OPENCL_DOT");
  if (fault) setenv("LL_OPENCL_FAULT", fault, 1);
  else unsetenv("LL_OPENCL_FAULT");
  struct ll_backend_params p = {1, dev_name, cache};
  struct ll_backend *b = NULL;
  char err[512];
  const int rc = ll_backend_create(&b, &p, reason, rl, err, sizeof err);
  unsetenv("LL_OPENCL_FAULT");
  if (rc != 0 || !b || strncmp(reason, "opencl:", 7) != 0) {
    fprintf(stderr, "test_opencl_dot: no fast-tier instance on %s: %s %s\n", dev_name, rc ? err : "", reason);
    CHECK(0);
    ll_backend_free(b);
    return NULL;
  }
  b->i->get_info(b, in);
  printf("LL_OPENCL_DOT=%s%s: dots %s%s%s\n", dot ? dot : "(unset)", fault ? " LL_OPENCL_FAULT=dotcheck" : "", in->dot, in->dot_note[0] ? "; " : "",
         in->dot_note);
  return b;
}

static void test_products(struct ll_backend *cpu, struct ll_backend *cl, struct ll_backend *fl, int exact) {
  static const int types[] = {LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q5_0, LL_TYPE_Q5_1, LL_TYPE_Q8_0, LL_TYPE_Q4_K, LL_TYPE_Q5_K, LL_TYPE_Q6_K};
  static const int Ks0[] = {32, 160, 512, 576}, KsK[] = {256, 512, 768}, Ts[] = {1, 3, 6};
  const int N = 37;
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    double worst = 0, worst_fl = 0, worst_fused = 0;
    int same = 0, total = 0, same_fl = 0;
    const int kq = type == LL_TYPE_Q4_K || type == LL_TYPE_Q5_K || type == LL_TYPE_Q6_K;
    for (size_t ki = 0; ki < (kq ? 3 : 4); ki++) {
      const int K = kq ? KsK[ki] : Ks0[ki];
      const size_t rsz = ll_row_size(type, K);
      unsigned char *wd = malloc(rsz * N);
      float *f = malloc((size_t)K * N * sizeof *f), *g = malloc((size_t)K * sizeof *g);
      randf(f, (size_t)K * N, 0.5f), randf(g, (size_t)K, 1.0f);
      if (kq) { // K-quants: random bytes (every pattern of scales, mins and quants) with sane f16 scales, as test_opencl
        for (size_t i = 0; i < rsz * N; i++) wd[i] = (unsigned char)(ll_test_rand(&rs) >> 24);
        const size_t bs = ll_type_traits_get(type)->type_size;
        for (size_t bi = 0; bi < rsz * N / bs; bi++) {
          unsigned char *blk = wd + bi * bs;
          const ll_fp16 d = ll_fp32_to_fp16(0.002f + 0.001f * ll_test_randf(&rs)), dm = ll_fp32_to_fp16(0.001f);
          if (type == LL_TYPE_Q6_K) memcpy(blk + 208, &d, 2);
          else memcpy(blk, &d, 2), memcpy(blk + 2, &dm, 2);
        }
      } else {
        for (int r = 0; r < N; r++) ll_quantize_row(type, f + (size_t)r * K, wd + (size_t)r * rsz, K);
      }
      struct ll_weight w = {type, K, N, wd, NULL, NULL};
      for (size_t tj = 0; tj < sizeof Ts / sizeof Ts[0]; tj++) {
        const int T = Ts[tj];
        float *x = malloc((size_t)T * K * 4), *xn = malloc((size_t)T * K * 4), *a = malloc((size_t)T * N * 4), *b = malloc((size_t)T * N * 4),
              *c = malloc((size_t)T * N * 4);
        randf(x, (size_t)T * K, 2.0f);
        CHECK(cpu->i->matmul(cpu, a, x, &w, T, 0) == 0);
        CHECK(cl->i->matmul(cl, b, x, &w, T, 0) == 0);
        CHECK(fl->i->matmul(fl, c, x, &w, T, 0) == 0);
        const double e = nmse(b, a, (size_t)T * N), efl = nmse(c, a, (size_t)T * N);
        int s = 0, sf = 0;
        for (int i = 0; i < T * N; i++) s += memcmp(&a[i], &b[i], 4) == 0, sf += memcmp(&a[i], &c[i], 4) == 0;
        same += s, same_fl += sf, total += T * N;
        worst = e > worst ? e : worst, worst_fl = efl > worst_fl ? efl : worst_fl;
        if (exact && K <= 512 && (type == LL_TYPE_Q5_0 || type == LL_TYPE_Q5_1))
          CHECKF(s == T * N, "%s K=%d T=%d: %d of %d outputs the CPU's bits (nmse %.3g)", ll_type_name(type), K, T, s, T * N, e);
        else CHECKF(e < 1e-11, "%s K=%d T=%d: nmse %.3g", ll_type_name(type), K, T, e);
        // += (the residual), and RMSNorm fused into the product
        memcpy(c, b, (size_t)T * N * 4);
        CHECK(cl->i->matmul(cl, c, x, &w, T, 1) == 0);
        int twice = 1;
        for (int i = 0; i < T * N; i++) twice &= c[i] == b[i] + b[i];
        CHECKF(twice, "%s K=%d T=%d: the accumulate form adds the product", ll_type_name(type), K, T);
        CHECK(cpu->i->rmsnorm(cpu, xn, x, g, T, K, 1e-5f) == 0);
        CHECK(cpu->i->matmul(cpu, a, xn, &w, T, 0) == 0);
        const struct ll_weight *const w1[1] = {&w};
        float *const o1[1] = {b};
        CHECK(cl->i->fused_matmul(cl, 1, o1, x, g, 1e-5f, w1, T, LL_FUSE_SET) == 0);
        const double ef = nmse(b, a, (size_t)T * N);
        CHECKF(ef < 1e-4, "%s K=%d T=%d: fused RMSNorm + product nmse %.3g", ll_type_name(type), K, T, ef);
        worst_fused = ef > worst_fused ? ef : worst_fused;
        free(x), free(xn), free(a), free(b), free(c);
      }
      free(wd), free(f), free(g);
    }
    printf("%-5s integer dots: %4d / %d outputs the CPU's bits, worst nmse %.3g (fused RMSNorm %.3g); float products: %4d / %d, worst %.3g\n",
           ll_type_name(type), same, total, worst, worst_fused, same_fl, total, worst_fl);
  }
}

int main(void) {
  rs = ll_test_seed();
  if (!find_device()) {
    fprintf(stderr, "test_opencl_dot: no OpenCL device to test (install pocl-opencl-icd, or set LL_TEST_OPENCL_DEVICE)\n");
    CHECK(0);
    return ll_test_summary();
  }
  snprintf(cache, sizeof cache, "/tmp/ll_ocl_dot_XXXXXX");
  CHECK(mkdtemp(cache) != NULL);
  struct ll_backend *cpu = NULL;
  char err[256], reason[1024];
  CHECK(ll_backend_cpu_create(&cpu, 1, err, sizeof err) == 0);
  struct ll_backend_info in, fin;
  struct ll_backend *cl = open_fast(NULL, NULL, &in, reason, sizeof reason);
  struct ll_backend *fl = open_fast("off", NULL, &fin, reason + 512, 512);
  if (cl && fl) {
    // auto: what the device offers
    const int nvidia = strstr(in.vendor, "NVIDIA") != NULL;
    CHECKF(strcmp(in.dot, nvidia ? "ptx" : "portable") == 0 || (!nvidia && strcmp(in.dot, "khr") == 0), "auto chose '%s' (%s)", in.dot, in.dot_note);
    CHECKF(in.dot_note[0] == 0, "auto: note '%s'", in.dot_note);
    char want[64];
    snprintf(want, sizeof want, "; integer dots %s", in.dot);
    CHECKF(strstr(reason, want) != NULL, "the reason names the dots: %s", reason);
    CHECKF(strcmp(fin.dot, "off") == 0 && fin.dot_note[0] == 0, "off: '%s' '%s'", fin.dot, fin.dot_note);
    const int exact = in.fp64 && strstr(in.version, "PoCL") != NULL;
    printf("on %s (%s, %s): exactness %s\n", dev_name, in.device, in.version, exact ? "asserted" : "not asserted");
    test_products(cpu, cl, fl, exact);
  }
  ll_backend_free(cl), ll_backend_free(fl);
  // Forced paths: where the device lacks them, the portable dots with the reason in one line.
  {
    struct ll_backend *b = open_fast("ptx", NULL, &in, reason, sizeof reason);
    if (b && !strstr(in.vendor, "NVIDIA")) {
      CHECKF(strcmp(in.dot, "portable") == 0, "forced ptx: '%s'", in.dot);
      CHECKF(strstr(in.dot_note, "LL_OPENCL_DOT=ptx dots (the device is not NVIDIA's): its program did not build") && strstr(in.dot_note, "the portable ones instead"),
             "forced ptx: note '%s'", in.dot_note);
      CHECKF(strstr(reason, "integer dots portable: LL_OPENCL_DOT=ptx") != NULL, "forced ptx: reason '%s'", reason);
    } else if (b) {
      CHECKF(strcmp(in.dot, "ptx") == 0, "forced ptx on NVIDIA: '%s' (%s)", in.dot, in.dot_note);
    }
    ll_backend_free(b);
    char ext[4096] = "";
    b = open_fast("khr", NULL, &in, reason, sizeof reason);
    if (b) {
      cl_platform_id ps[16];
      cl_device_id ds[16];
      cl_uint np = 0, nd = 0;
      if (clGetPlatformIDs(16, ps, &np) == CL_SUCCESS && (cl_uint)in.cl_platform < np &&
          clGetDeviceIDs(ps[in.cl_platform], CL_DEVICE_TYPE_ALL, 16, ds, &nd) == CL_SUCCESS && (cl_uint)in.cl_device < nd)
        clGetDeviceInfo(ds[in.cl_device], CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
      if (!strstr(ext, "cl_khr_integer_dot_product")) {
        CHECKF(strcmp(in.dot, "portable") == 0, "forced khr: '%s'", in.dot);
        CHECKF(strstr(in.dot_note, "LL_OPENCL_DOT=khr dots (the device does not advertise cl_khr_integer_dot_product)") != NULL,
               "forced khr: note '%s'", in.dot_note);
      } else { // the extension's built-ins: the products as the portable dots give them
        CHECKF(strcmp(in.dot, "khr") == 0, "forced khr on a device with the extension: '%s' (%s)", in.dot, in.dot_note);
        struct ll_backend *p = open_fast("portable", NULL, &fin, reason, sizeof reason);
        if (p) test_products(cpu, b, p, 0);
        ll_backend_free(p);
      }
    }
    ll_backend_free(b);
  }
  { // a probe that fails: no integer dots (the float products), and why
    struct ll_backend *b = open_fast("portable", "dotcheck", &in, reason, sizeof reason);
    if (b) {
      CHECKF(strcmp(in.dot, "off") == 0, "failed probe: '%s'", in.dot);
      CHECKF(strstr(in.dot_note, "portable integer dots: its self-check gave") && strstr(in.dot_note, "integer dots off"), "failed probe: note '%s'",
             in.dot_note);
      float x[64], o[2];
      randf(x, 64, 1.0f);
      unsigned char wd[2 * 68];
      ll_quantize_row(LL_TYPE_Q8_0, x, wd, 64), ll_quantize_row(LL_TYPE_Q8_0, x, wd + 68, 64);
      struct ll_weight w = {LL_TYPE_Q8_0, 64, 2, wd, NULL, NULL};
      CHECK(b->i->matmul(b, o, x, &w, 1, 0) == 0 && o[0] == o[1] && o[0] > 0); // x · x
    }
    ll_backend_free(b);
    b = open_fast("fast", NULL, &in, reason, sizeof reason);
    if (b) CHECKF(strstr(in.dot_note, "LL_OPENCL_DOT='fast' is not auto, portable, khr, ptx or off: auto") != NULL, "unknown value: note '%s'", in.dot_note);
    ll_backend_free(b);
    setenv("LL_OPENCL_REFERENCE", "1", 1);
    unsetenv("LL_OPENCL_DOT");
    struct ll_backend_params p = {1, dev_name, cache};
    b = NULL;
    CHECK(ll_backend_create(&b, &p, reason, sizeof reason, err, sizeof err) == 0 && b);
    if (b) {
      b->i->get_info(b, &in);
      CHECKF(strcmp(in.dot, "off") == 0 && !strstr(reason, "integer dots"), "reference tier: dots '%s', reason '%s'", in.dot, reason);
    }
    ll_backend_free(b);
  }
  ll_backend_free(cpu);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
  if (system(cmd) != 0) fprintf(stderr, "test_opencl_dot: could not remove %s\n", cache);
  return ll_test_summary();
}
