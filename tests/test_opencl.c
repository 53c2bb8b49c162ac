// test_opencl.c - the OpenCL backend against the CPU backend (the reference), on whatever
// OpenCL device is named by $LL_TEST_OPENCL_DEVICE (default: the first CPU OpenCL device,
// PoCL in CI; setup.sh installs pocl-opencl-icd), and the device choice's fallbacks.
//
// On a device with cl_khr_fp64 the kernels reproduce the CPU backend bit for bit (see
// kernels/opencl/llsrv.cl) for quantized products, get_rows, rmsnorm, rope, attention (f16
// and f32 caches) and swiglu with ggml's exp: asserted exactly (normalized MSE 0).
// Elsewhere, and for what is not reproduced (float-weight products: a tree in f32 against
// the CPU's f64 sums; exp in swiglu where the CPU uses libm's expf: llama2.c models and the
// last n % 8 elements), tolerances in normalized MSE, Σ(dev - cpu)² / Σ cpu²: products 1e-10,
// get_rows 1e-12, rmsnorm 1e-10, rope 1e-12, swiglu 1e-10, attention 1e-8 (f32 cache) / 1e-6
// (f16 cache: a probability rounded to f16 after a sum in another order may land one f16
// step away); add exact.
// The device-choice cases run in child processes started before this process touches
// OpenCL, since the ICD loader reads OCL_ICD_VENDORS once per process.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ll_backend.h"
#include "ll_error.h"
#include "ll_quant.h"
#include "testutil.h"

static uint64_t rs;
static int exact; // the device has f64: bit-exact agreement expected
static char dev_name[32] = "opencl:0:0";

static double nmse(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = (double)a[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

static void randf(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = ll_test_randf(&rs) * scale;
}

// Weights of any type: floats quantized where our quantizer covers the type; K-quants as
// random bytes with sane fp16 scales (every bit pattern of scales and quants is exercised).
static void *make_weight(int type, int64_t k, int64_t n) {
  const size_t rsz = ll_row_size(type, k), bytes = rsz * (size_t)n;
  unsigned char *w = malloc(bytes);
  if (type == LL_TYPE_Q4_K || type == LL_TYPE_Q5_K || type == LL_TYPE_Q6_K) {
    for (size_t i = 0; i < bytes; i++) w[i] = (unsigned char)(ll_test_rand(&rs) >> 24);
    const size_t bs = ll_type_traits_get(type)->type_size;
    for (size_t b = 0; b < bytes / bs; b++) {
      unsigned char *blk = w + b * bs;
      const ll_fp16 d = ll_fp32_to_fp16(0.002f + 0.001f * ll_test_randf(&rs)), dm = ll_fp32_to_fp16(0.001f);
      if (type == LL_TYPE_Q6_K) memcpy(blk + 208, &d, 2);
      else memcpy(blk, &d, 2), memcpy(blk + 2, &dm, 2);
    }
    return w;
  }
  float *f = malloc((size_t)k * sizeof *f);
  for (int64_t r = 0; r < n; r++) {
    randf(f, (size_t)k, 0.5f);
    ll_quantize_row(type, f, w + (size_t)r * rsz, k);
  }
  free(f);
  return w;
}

static void test_matmul(struct ll_backend *cpu, struct ll_backend *cl) {
  static const struct {
    int type, k[2];
  } cases[] = {{LL_TYPE_Q4_0, {160, 2080}}, {LL_TYPE_Q4_1, {160, 2080}}, {LL_TYPE_Q5_0, {160, 2080}}, {LL_TYPE_Q5_1, {160, 2080}},
               {LL_TYPE_Q8_0, {160, 2080}}, {LL_TYPE_Q4_K, {256, 2304}}, {LL_TYPE_Q5_K, {256, 2304}}, {LL_TYPE_Q6_K, {256, 2304}},
               {LL_TYPE_F32, {77, 1100}},   {LL_TYPE_F16, {77, 1100}},   {LL_TYPE_BF16, {77, 1100}}};
  static const int Ts[] = {1, 3, 11};
  const int N = 37;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    double worst = 0;
    for (int ki = 0; ki < 2; ki++) {
      const int K = cases[ci].k[ki], type = cases[ci].type;
      void *wd = make_weight(type, K, N);
      struct ll_weight w = {type, K, N, wd, NULL};
      CHECK(cl->i->weight_upload(cl, &w) == 0 && w.dev);
      for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int T = Ts[ti];
        float *x = malloc((size_t)T * K * 4), *o1 = malloc((size_t)T * N * 4), *o2 = malloc((size_t)T * N * 4);
        randf(x, (size_t)T * K, 1.0f);
        for (int acc = 0; acc < 2; acc++) {
          randf(o1, (size_t)T * N, 1.0f);
          memcpy(o2, o1, (size_t)T * N * 4);
          CHECK(cpu->i->matmul(cpu, o1, x, &w, T, acc) == 0);
          CHECK(cl->i->matmul(cl, o2, x, &w, T, acc) == 0);
          const double e = nmse(o2, o1, (size_t)T * N);
          const int fl = type == LL_TYPE_F32 || type == LL_TYPE_F16 || type == LL_TYPE_BF16;
          CHECKF(exact && !fl ? e == 0 : e < 1e-10, "matmul %s K=%d T=%d acc=%d: nmse %.3g", ll_type_name(type), K, T, acc, e);
          worst = e > worst ? e : worst;
        }
        free(x), free(o1), free(o2);
      }
      // get_rows of the same matrix, ids repeated and out of order
      const int32_t ids[5] = {36, 0, 5, 5, 17};
      float *g1 = malloc((size_t)5 * K * 4), *g2 = malloc((size_t)5 * K * 4);
      CHECK(cpu->i->get_rows(cpu, g1, &w, ids, 5) == 0);
      CHECK(cl->i->get_rows(cl, g2, &w, ids, 5) == 0);
      const double ge = nmse(g2, g1, (size_t)5 * K);
      CHECKF(exact ? ge == 0 : ge < 1e-12, "get_rows %s K=%d: nmse %.3g", ll_type_name(type), K, ge);
      const int32_t bad = N;
      CHECK(cl->i->get_rows(cl, g2, &w, &bad, 1) == LL_EINVAL);
      free(g1), free(g2);
      // a weight never uploaded goes through a per-call copy, same results
      if (ki == 0) {
        struct ll_weight w2 = {type, K, N, wd, NULL};
        float *x = malloc((size_t)K * 4), *a = malloc((size_t)N * 4), *b = malloc((size_t)N * 4);
        randf(x, (size_t)K, 1.0f);
        CHECK(cl->i->matmul(cl, a, x, &w, 1, 0) == 0 && cl->i->matmul(cl, b, x, &w2, 1, 0) == 0);
        CHECK(memcmp(a, b, (size_t)N * 4) == 0);
        free(x), free(a), free(b);
      }
      cl->i->weight_release(cl, &w);
      CHECK(w.dev == NULL);
      free(wd);
    }
    printf("matmul + get_rows %-5s: worst nmse %.3g\n", ll_type_name(cases[ci].type), worst);
  }
}

static void test_elementwise(struct ll_backend *cpu, struct ll_backend *cl) {
  // rmsnorm, ragged C, out aliasing x
  {
    const int T = 5, C = 77;
    float *x = malloc(T * C * 4), *g = malloc(C * 4), *a = malloc(T * C * 4), *b = malloc(T * C * 4);
    randf(x, T * C, 3.0f), randf(g, C, 1.0f);
    CHECK(cpu->i->rmsnorm(cpu, a, x, g, T, C, 1e-5f) == 0);
    memcpy(b, x, T * C * 4);
    CHECK(cl->i->rmsnorm(cl, b, b, g, T, C, 1e-5f) == 0);
    const double e = nmse(b, a, T * C);
    printf("rmsnorm: nmse %.3g\n", e);
    CHECK(exact ? e == 0 : e < 1e-10);
    free(x), free(g), free(a), free(b);
  }
  // rope: normal and neox, partial rotation, odd pair count, freq_factors, both math modes
  for (int v = 0; v < 8; v++) {
    const int T = 4, H = 3, hd = 20;
    const float ff[9] = {1, 1.5f, 2, 4, 8, 1, 1, 3, 1};
    struct ll_rope_params p = {(v & 1) ? LL_ROPE_NEOX : LL_ROPE_NORMAL, (v & 2) ? 18 : 20, 10000.0f, (v & 4) ? 0.5f : 1.0f, (v & 2) ? ff : NULL};
    const int32_t pos[4] = {0, 7, 100, 3000};
    float *a = malloc(T * H * hd * 4), *b = malloc(T * H * hd * 4);
    randf(a, T * H * hd, 1.0f);
    memcpy(b, a, T * H * hd * 4);
    cpu->ggml_math = cl->ggml_math = v < 4;
    CHECK(cpu->i->rope(cpu, a, pos, T, H, hd, &p) == 0);
    CHECK(cl->i->rope(cl, b, pos, T, H, hd, &p) == 0);
    const double e = nmse(b, a, T * H * hd);
    CHECKF(exact ? e == 0 : e < 1e-12, "rope variant %d: nmse %.3g", v, e);
    free(a), free(b);
  }
  // swiglu (ggml's exp for groups of 8, libm for the tail) and add, ragged n
  for (int gm = 0; gm < 2; gm++) {
    const int n = 1003;
    float *g = malloc(n * 4), *u = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    randf(g, n, 6.0f), randf(u, n, 2.0f);
    cpu->ggml_math = cl->ggml_math = gm;
    CHECK(cpu->i->swiglu(cpu, a, g, u, n) == 0);
    CHECK(cl->i->swiglu(cl, b, g, u, n) == 0);
    // ggml's exp covers groups of 8 (bit-exact); the tail of n % 8 uses libm's expf on the
    // CPU and the device's exp here (within tolerance).
    const int n8 = n - n % 8;
    const double e = nmse(b, a, n), e8 = nmse(b, a, n8);
    printf("swiglu (ggml_math %d): nmse %.3g (first %d: %.3g)\n", gm, e, n8, e8);
    CHECK(e < 1e-10);
    CHECK(exact && gm ? e8 == 0 : e8 < 1e-10);
    CHECK(cpu->i->add(cpu, a, g, u, n) == 0);
    CHECK(cl->i->add(cl, b, g, u, n) == 0);
    CHECK(memcmp(a, b, n * 4) == 0);
    free(g), free(u), free(a), free(b);
  }
  cpu->ggml_math = cl->ggml_math = 1;
}

// Paged KV cache: three sequences with scattered block tables, filled by a prompt chunk and
// single tokens, then attention of a batch (attention_multi) and of one sequence.
static void test_attention(struct ll_backend *cpu, struct ll_backend *cl) {
  for (int f16 = 0; f16 < 2; f16++) {
    const int H = 6, Hkv = 2, hd = 40, block = 16, nblk = 12, kvd = Hkv * hd;
    const size_t pool = (size_t)nblk * block * kvd * (f16 ? 2 : 4);
    void *kc = calloc(1, pool), *vc = calloc(1, pool), *kd = calloc(1, pool), *vd = calloc(1, pool);
    int32_t tabs[3][4] = {{7, 2, 9, 0}, {1, 11, 4, 3}, {5, 10, 6, 8}};
    const int len[3] = {40, 17, 1}; // positions already stored per sequence
    struct ll_kv_view vcpu[3], vcl[3];
    for (int s = 0; s < 3; s++) {
      vcpu[s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kc, vc, tabs[s]};
      vcl[s] = (struct ll_kv_view){f16 ? LL_TYPE_F16 : LL_TYPE_F32, block, Hkv, hd, kd, vd, tabs[s]};
      float *k = malloc((size_t)len[s] * kvd * 4), *v = malloc((size_t)len[s] * kvd * 4);
      int32_t *pos = malloc((size_t)len[s] * 4);
      randf(k, (size_t)len[s] * kvd, 1.0f), randf(v, (size_t)len[s] * kvd, 1.0f);
      for (int t = 0; t < len[s]; t++) pos[t] = t;
      CHECK(cpu->i->kv_store(cpu, &vcpu[s], k, v, pos, len[s]) == 0);
      CHECK(cl->i->kv_store(cl, &vcl[s], k, v, pos, len[s]) == 0);
      free(k), free(v), free(pos);
    }
    // the batch: seq 0 one token (pos 40), seq 1 a chunk of 5 (17..21), seq 2 one (pos 1)
    const int nt[3] = {1, 5, 1}, t0[3] = {0, 1, 6}, T = 7;
    int32_t pos[7] = {40, 17, 18, 19, 20, 21, 1};
    float *k = malloc(T * kvd * 4), *v = malloc(T * kvd * 4), *q = malloc(T * H * hd * 4);
    randf(k, T * kvd, 1.0f), randf(v, T * kvd, 1.0f), randf(q, T * H * hd, 2.0f);
    for (int s = 0; s < 3; s++) {
      CHECK(cpu->i->kv_store(cpu, &vcpu[s], k + t0[s] * kvd, v + t0[s] * kvd, pos + t0[s], nt[s]) == 0);
      CHECK(cl->i->kv_store(cl, &vcl[s], k + t0[s] * kvd, v + t0[s] * kvd, pos + t0[s], nt[s]) == 0);
    }
    float *a = malloc(T * H * hd * 4), *b = malloc(T * H * hd * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    CHECK(cpu->i->attention_multi(cpu, a, q, vcpu, pos, t0, nt, 3, H, scale) == 0);
    CHECK(cl->i->attention_multi(cl, b, q, vcl, pos, t0, nt, 3, H, scale) == 0);
    const double e = nmse(b, a, (size_t)T * H * hd);
    printf("attention_multi (%s cache): nmse %.3g\n", f16 ? "f16" : "f32", e);
    CHECK(exact ? e == 0 : e < (f16 ? 1e-6 : 1e-8));
    // one sequence alone gives what the batch gave it
    float *c = malloc(5 * H * hd * 4);
    CHECK(cl->i->attention(cl, c, q + 1 * H * hd, &vcl[1], pos + 1, 5, H, scale) == 0);
    CHECK(memcmp(c, b + 1 * H * hd, 5 * H * hd * 4) == 0);
    // the host pools are names only: the device never wrote them
    int zero = 1;
    for (size_t i = 0; i < pool; i++) zero &= ((unsigned char *)kd)[i] == 0;
    CHECK(zero);
    free(c), free(a), free(b), free(k), free(v), free(q), free(kc), free(vc), free(kd), free(vd);
  }
}

static void test_info(struct ll_backend *cl) {
  struct ll_backend_info in;
  cl->i->get_info(cl, &in);
  printf("device: %s | %s | driver %s | %s | %d CUs | %.1f GiB (max alloc %.1f GiB) | fp16 %d subgroups %d | used %.1f MiB\n", in.device,
         in.vendor, in.driver, in.version, in.compute_units, in.mem_total / 1073741824.0, in.max_alloc / 1073741824.0, in.fp16, in.subgroups,
         in.mem_used / 1048576.0);
  CHECK(strcmp(in.name, "opencl") == 0 && in.device[0] && strncmp(in.version, "OpenCL ", 7) == 0);
  exact = in.fp64;
  printf("f64: %s (%s)\n", exact ? "yes" : "no", exact ? "bit-exact agreement asserted" : "tolerances");
  CHECK(in.mem_total > 0 && in.max_alloc > 0 && in.mem_used > 0 && in.mem_used < in.mem_total);
  // Accounting follows uploads and releases exactly.
  const int64_t before = in.mem_used;
  void *wd = make_weight(LL_TYPE_Q8_0, 1024, 64);
  struct ll_weight w = {LL_TYPE_Q8_0, 1024, 64, wd, NULL}, w2 = w;
  CHECK(cl->i->weight_upload(cl, &w) == 0 && cl->i->weight_upload(cl, &w2) == 0 && w.dev == w2.dev); // tied: one copy
  cl->i->get_info(cl, &in);
  CHECK(in.mem_used == before + (int64_t)ll_row_size(LL_TYPE_Q8_0, 1024) * 64);
  cl->i->weight_release(cl, &w);
  cl->i->get_info(cl, &in);
  CHECK(in.mem_used == before + (int64_t)ll_row_size(LL_TYPE_Q8_0, 1024) * 64); // w2 still holds it
  cl->i->weight_release(cl, &w2);
  cl->i->get_info(cl, &in);
  CHECK(in.mem_used == before);
  free(wd);
}

// ---- device choice, each case in a fresh process (the ICD loader reads its environment once)

static int choice_child(const char *env_vendors, const char *env_fault, const char *env_limit, const char *device, const char *expect_prefix,
                        const char *expect_sub) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 0;
  if (pid == 0) {
    if (env_vendors) setenv("OCL_ICD_VENDORS", env_vendors, 1);
    if (env_fault) setenv("LL_OPENCL_FAULT", env_fault, 1);
    if (env_limit) setenv("LL_OPENCL_MEM_LIMIT", env_limit, 1);
    struct ll_backend *b = NULL;
    struct ll_backend_params p = {1, device, NULL};
    char reason[512] = "", err[256] = "";
    int rc = ll_backend_create(&b, &p, reason, sizeof reason, err, sizeof err);
    printf("  %s (%s%s%s): rc %d, reason: %s\n", device, env_vendors ? "OCL_ICD_VENDORS=" : "", env_vendors ? env_vendors : "",
           env_fault ? " LL_OPENCL_FAULT" : "", rc, reason);
    int ok = rc == 0 && b && strncmp(reason, expect_prefix, strlen(expect_prefix)) == 0 && strstr(reason, expect_sub) != NULL;
    ll_backend_free(b);
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_choice(void) {
  char empty[] = "/tmp/ll_ocl_empty_XXXXXX", broken[] = "/tmp/ll_ocl_broken_XXXXXX";
  CHECK(mkdtemp(empty) != NULL && mkdtemp(broken) != NULL);
  char icd[128];
  snprintf(icd, sizeof icd, "%s/broken.icd", broken);
  FILE *f = fopen(icd, "w");
  CHECK(f != NULL);
  if (f) fputs("/nonexistent/libOpenCL-vendor-that-is-not-there.so\n", f), fclose(f);
  printf("device choice:\n");
  CHECK(choice_child(empty, NULL, NULL, "auto", "cpu: no OpenCL platform", "ICD"));
  CHECK(choice_child(empty, NULL, NULL, dev_name, "cpu: no OpenCL platform", "requested"));
  CHECK(choice_child(broken, NULL, NULL, "opencl", "cpu: no OpenCL platform", "ICD"));
  CHECK(choice_child(NULL, NULL, NULL, "opencl:0:9", "cpu: no OpenCL device opencl:0:9", "found"));
  CHECK(choice_child(NULL, NULL, NULL, "cpu", "cpu: requested", "cpu"));
  CHECK(choice_child(NULL, "selftest", NULL, dev_name, "cpu: skipped", "self-test failed"));
  CHECK(choice_child(NULL, NULL, "1000", dev_name, "cpu: skipped", "out of memory"));
  unlink(icd);
  rmdir(empty), rmdir(broken);
}

// The device under test: $LL_TEST_OPENCL_DEVICE, or the first CPU OpenCL device (PoCL).
static int find_device(void) {
  const char *env = getenv("LL_TEST_OPENCL_DEVICE");
  if (env && *env) {
    snprintf(dev_name, sizeof dev_name, "%s", env);
    return 1;
  }
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
      if (t & CL_DEVICE_TYPE_CPU) {
        snprintf(dev_name, sizeof dev_name, "opencl:%u:%u", p, i);
        return 1;
      }
    }
  }
  return 0;
}

int main(void) {
  rs = ll_test_seed();
  // Which device: decided in a child so that this process has not touched OpenCL before the
  // device-choice children set their environments.
  int fd[2];
  if (pipe(fd) == 0) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      int found = find_device();
      if (found && write(fd[1], dev_name, strlen(dev_name)) < 0) found = 0;
      _exit(found ? 0 : 1);
    }
    close(fd[1]);
    char buf[32] = "";
    ssize_t n = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0 && n > 0)) {
      fprintf(stderr, "test_opencl: no OpenCL device to test (install pocl-opencl-icd, or set LL_TEST_OPENCL_DEVICE)\n");
      CHECK(0);
      return ll_test_summary();
    }
    buf[n] = 0;
    snprintf(dev_name, sizeof dev_name, "%s", buf);
  }
  printf("testing on %s\n", dev_name);
  test_choice();

  struct ll_backend *cpu = NULL, *cl = NULL;
  char err[512], reason[512];
  CHECK(ll_backend_cpu_create(&cpu, 1, err, sizeof err) == 0);
  char cache[] = "/tmp/ll_ocl_cache_XXXXXX";
  CHECK(mkdtemp(cache) != NULL);
  struct ll_backend_params p = {1, dev_name, cache};
  CHECK(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0);
  printf("%s\n", reason);
  if (!cl || strncmp(reason, "opencl:", 7) != 0) {
    CHECK(0);
    ll_backend_free(cl), ll_backend_free(cpu);
    return ll_test_summary();
  }
  CHECK(strstr(reason, "kernels built") != NULL);
  cpu->ggml_math = cl->ggml_math = 1;
  test_info(cl);
  test_matmul(cpu, cl);
  test_elementwise(cpu, cl);
  test_attention(cpu, cl);
  ll_backend_free(cl);
  // The second start loads the program from the binary cache.
  cl = NULL;
  CHECK(ll_backend_create(&cl, &p, reason, sizeof reason, err, sizeof err) == 0);
  printf("%s\n", reason);
  CHECK(strstr(reason, "from the binary cache") != NULL);
  ll_backend_free(cl);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  CHECK(system(cmd) == 0);
  ll_backend_free(cpu);
  return ll_test_summary();
}
