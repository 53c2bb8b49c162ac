// program.c - the OpenCL backend's program: build options, the binary cache (<state_dir>/opencl,
// keyed by device, driver and source hash), the kernel objects, and the self-test.

#include "ll_fileio.h"
#include "ocl_internal.h"

// ---------------------------------------------------------------- program build and cache

#define BUILD_OPTS "-cl-std=CL1.2"
#define BUILD_OPTS_NO_FP64 BUILD_OPTS " -DLL_NO_FP64"
// The build options: LL_OPENCL_NO_FP64=1 builds the kernels as for a device without f64 (the
// tests' way to cover that path on devices that have it); info.fp64 then reports 0.
const char *ocl_build_opts(const struct ocl_ctx *c) { return c->no_fp64 ? BUILD_OPTS_NO_FP64 : BUILD_OPTS; }

// Cache key: sha256 of device name, vendor, driver and platform versions, build options and
// source, so a new driver or changed kernels rebuild.
void ocl_cache_path(struct ocl_ctx *c, const char *dir, const char *src, const char *opts, char *out, size_t cap) {
  char plat[256] = "";
  clGetPlatformInfo(c->plat, CL_PLATFORM_VERSION, sizeof plat, plat, NULL);
  EVP_MD_CTX *h = EVP_MD_CTX_new();
  unsigned char d[32];
  unsigned int dn = 0;
  out[0] = 0;
  if (!h) return;
  const char *parts[] = {c->info.device, c->info.vendor, c->info.driver, c->info.version, plat, opts, src};
  int ok = EVP_DigestInit_ex(h, EVP_sha256(), NULL) == 1;
  for (size_t i = 0; ok && i < sizeof parts / sizeof parts[0]; i++) ok = EVP_DigestUpdate(h, parts[i], strlen(parts[i]) + 1) == 1;
  ok = ok && EVP_DigestFinal_ex(h, d, &dn) == 1;
  EVP_MD_CTX_free(h);
  if (!ok) return;
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
  snprintf(out, cap, "%s/opencl-%s.bin", dir, hex);
}

unsigned char *ocl_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n > 0 && n < (64L << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n))) {
      if (fread(buf, 1, (size_t)n, f) != (size_t)n) free(buf), buf = NULL;
      else *len = (size_t)n;
    }
  }
  fclose(f);
  return buf;
}

// Write the built program's binary atomically (a locked temp file + rename), then prune the
// cache: its key changes with every kernel edit and driver update, so old binaries would pile
// up for ever (the newest OCL_CACHE_KEEP stay: enough for every device of a machine). Failures
// only cost the next start a rebuild, so they are ignored.
#define OCL_CACHE_KEEP 8
void ocl_cache_store(cl_program prog, const char *path) {
  size_t n = 0;
  if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || n == 0) return;
  unsigned char *bin = malloc(n);
  if (!bin) return;
  unsigned char *bins[1] = {bin};
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
  int fd = -1, hold = -1;
  if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS && (fd = mkstemp(tmp)) >= 0) {
    hold = ll_tmp_hold(fd); // a concurrent prune leaves a temp file someone is writing
    int ok = ll_write_all(fd, bin, n) == 0 && fchmod(fd, 0644) == 0;
    ok = fsync(fd) == 0 && ok;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
    ll_tmp_release(hold);
  }
  free(bin);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0, ll_cache_prune(dir, "opencl-", ".bin", OCL_CACHE_KEEP);
}

// Build src with opts into *out, from the binary cache in cache_dir when it holds it (*hit = 1),
// else from source (and stored there). A failed build leaves its log, one line, in log.
static int build_src(struct ocl_ctx *c, const char *cache_dir, const char *src, const char *opts, cl_program *out, int *hit, char *log,
                     size_t loglen) {
  char path[1024] = "";
  *out = NULL, *hit = 0, log[0] = 0;
  if (cache_dir && *cache_dir) {
    mkdir(cache_dir, 0755); // one level; an existing directory is fine
    ocl_cache_path(c, cache_dir, src, opts, path, sizeof path);
  }
  cl_int e;
  if (path[0]) {
    size_t len = 0;
    unsigned char *bin = ocl_read_file(path, &len);
    if (bin) {
      const unsigned char *bins[1] = {bin};
      cl_int st;
      cl_program p = clCreateProgramWithBinary(c->cx, 1, &c->dev, &len, bins, &st, &e);
      free(bin);
      if (p && (e != CL_SUCCESS || st != CL_SUCCESS || clBuildProgram(p, 1, &c->dev, opts, NULL, NULL) != CL_SUCCESS)) {
        clReleaseProgram(p); // a stale or foreign binary: rebuild from source
        p = NULL;
      }
      if (p) {
        *out = p, *hit = 1;
        return 0;
      }
    }
  }
  cl_program p = clCreateProgramWithSource(c->cx, 1, &src, NULL, &e);
  if (!p) {
    snprintf(log, loglen, "clCreateProgramWithSource: %s (%d)", ocl_cl_errname(e), e);
    return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_EIO;
  }
  e = clBuildProgram(p, 1, &c->dev, opts, NULL, NULL);
  if (e != CL_SUCCESS) {
    size_t n = 0;
    int k = snprintf(log, loglen, "%s: ", ocl_cl_errname(e));
    if (k > 0 && (size_t)k < loglen) {
      clGetProgramBuildInfo(p, c->dev, CL_PROGRAM_BUILD_LOG, loglen - (size_t)k - 1, log + k, &n);
      log[loglen - 1] = 0;
      for (char *q = log; *q; q++)
        if (*q == '\n' || *q == '\r') *q = ' ';
    }
    clReleaseProgram(p);
    return LL_EUNSUPPORTED;
  }
  if (path[0]) ocl_cache_store(p, path);
  *out = p;
  return 0;
}

int ocl_build_program(struct ocl_ctx *c, const char *cache_dir, char *err, size_t errlen) {
  char log[1500];
  const int rc = build_src(c, cache_dir, ll_opencl_source, ocl_build_opts(c), &c->prog, &c->cache_hit, log, sizeof log);
  if (rc) return ll_errf(err, errlen, rc, "opencl: building the kernels failed (%s)", log);
  return 0;
}

int ocl_make_kernels(struct ocl_ctx *c, char *err, size_t errlen) {
  static const struct {
    int type;
    const char *name;
  } q[] = {{LL_TYPE_Q4_0, "q4_0"}, {LL_TYPE_Q4_1, "q4_1"}, {LL_TYPE_Q5_0, "q5_0"}, {LL_TYPE_Q5_1, "q5_1"},
           {LL_TYPE_Q8_0, "q8_0"}, {LL_TYPE_Q4_K, "q4_K"}, {LL_TYPE_Q5_K, "q5_K"}, {LL_TYPE_Q6_K, "q6_K"}};
  cl_int e;
  char name[64];
#define MK(dst, nm)                                                                                           \
  do {                                                                                                        \
    if (!((dst) = clCreateKernel(c->prog, (nm), &e)))                                                         \
      return ll_errf(err, errlen, LL_EIO, "opencl: kernel %s: %s (%d)", (nm), ocl_cl_errname(e), e);             \
  } while (0)
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
    snprintf(name, sizeof name, "mm_%s", q[i].name);
    MK(c->k_mm[q[i].type], name);
  }
  MK(c->k_quant, "act_quant");
  MK(c->k_round, "act_round");
  MK(c->k_mm_f, "mm_f");
  MK(c->k_gr_f, "get_rows_f");
  MK(c->k_gr_q, "get_rows_q");
  MK(c->k_rmsnorm, "rmsnorm");
  MK(c->k_rope, "rope");
  MK(c->k_swiglu, "swiglu");
  MK(c->k_geglu, "geglu");
  MK(c->k_add, "add");
  MK(c->k_kv_store, "kv_store");
  MK(c->k_attention, "attention");
  MK(c->k_deq, "deq_rows");
  MK(c->k_mm_dx, "mm_bwd_dx");
  MK(c->k_mm_dw, "mm_bwd_dw");
  MK(c->k_mm_dx_t, "mm_bwd_dx_tiled");
  MK(c->k_mm_dw_t, "mm_bwd_dw_tiled");
  MK(c->k_gemm_t, "gemm_tiled");
  MK(c->k_attn_rows_sm, "attn_rows_softmax");
  MK(c->k_attn_rows_ds, "attn_rows_ds");
  MK(c->k_mm_dx_qt, "mm_bwd_dx_qtiled");
  MK(c->k_lora_fwd, "lora_fwd_tiled");
  MK(c->k_rms_bwd, "rmsnorm_bwd");
  MK(c->k_rms_dg, "rmsnorm_bwd_dg");
  MK(c->k_rope_bwd, "rope_bwd");
  MK(c->k_swiglu_bwd, "swiglu_bwd");
  MK(c->k_attn_train, "attn_train");
  MK(c->k_attn_bwd_q, "attn_bwd_q");
  MK(c->k_attn_bwd_kv, "attn_bwd_kv");
  MK(c->k_xent, "xent");
  MK(c->k_gr_bwd, "get_rows_bwd");
  MK(c->k_dropout, "dropout");
  MK(c->k_sumsq, "sumsq");
  MK(c->k_axpy, "axpy");
  MK(c->k_scale, "scale");
  MK(c->k_adamw, "adamw");
  MK(c->k_geglu_bwd, "geglu_bwd");
  MK(c->k_flash_fwd, "attn_flash_fwd");
  MK(c->k_flash_dq, "attn_flash_bwd_dq");
  MK(c->k_flash_dkv, "attn_flash_bwd_dkv");
  static const struct {
    int type;
    const char *name;
  } f[] = {{LL_TYPE_F32, "f32"},   {LL_TYPE_F16, "f16"},   {LL_TYPE_BF16, "bf16"}, {LL_TYPE_Q4_0, "q4_0"},
           {LL_TYPE_Q4_1, "q4_1"}, {LL_TYPE_Q5_0, "q5_0"}, {LL_TYPE_Q5_1, "q5_1"}, {LL_TYPE_Q8_0, "q8_0"},
           {LL_TYPE_Q4_K, "q4_K"}, {LL_TYPE_Q5_K, "q5_K"}, {LL_TYPE_Q6_K, "q6_K"}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    snprintf(name, sizeof name, "fmm_%s", f[i].name);
    MK(c->k_fmm[f[i].type], name);
    snprintf(name, sizeof name, "fmmt_%s", f[i].name);
    MK(c->k_fmmt[f[i].type], name);
    snprintf(name, sizeof name, "gmm_%s", f[i].name);
    MK(c->k_gmm[f[i].type], name);
  }
  MK(c->k_rope_kv, "rope_kv");
  MK(c->k_argmax, "argmax_rows");
  MK(c->k_sample, "sample_rows");
  MK(c->k_attn_fast, "attn_fast");
  MK(c->k_attn_split, "attn_split");
#undef MK
  { // attn_fast's and attn_split's tiles (about 43 KB of local memory): where the device's cannot
    // hold them, the fast tier keeps the reference's attention
    cl_ulong lm = 0, klm = 0, slm = 0;
    if (clGetDeviceInfo(c->dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lm, &lm, NULL) != CL_SUCCESS ||
        clGetKernelWorkGroupInfo(c->k_attn_fast, c->dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof klm, &klm, NULL) != CL_SUCCESS || klm > lm ||
        clGetKernelWorkGroupInfo(c->k_attn_split, c->dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof slm, &slm, NULL) != CL_SUCCESS || slm > lm) {
      clReleaseKernel(c->k_attn_fast), clReleaseKernel(c->k_attn_split);
      c->k_attn_fast = c->k_attn_split = NULL;
    }
  }
  ocl_split_params(c);
  // The prompt products' GEMM tiles (llsrv_gemm.cl) take work-groups of OCL_GMM_WG and about
  // 28 KB of local memory: where the device (or the compiled kernel) allows less, the fast tier
  // keeps fmmt_* for prompts.
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    cl_kernel *k = &c->k_gmm[f[i].type];
    size_t kwg = 0, dwg = 0;
    cl_ulong lm = 0, klm = 0;
    if (clGetKernelWorkGroupInfo(*k, c->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) != CL_SUCCESS || kwg < OCL_GMM_WG ||
        clGetDeviceInfo(c->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof dwg, &dwg, NULL) != CL_SUCCESS || dwg < OCL_GMM_WG ||
        clGetDeviceInfo(c->dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lm, &lm, NULL) != CL_SUCCESS ||
        clGetKernelWorkGroupInfo(*k, c->dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof klm, &klm, NULL) != CL_SUCCESS || klm > lm ||
        (getenv("LL_OPENCL_FAULT") && strcmp(getenv("LL_OPENCL_FAULT"), "nogemm") == 0)) {
      clReleaseKernel(*k);
      *k = NULL;
    }
  }
  // The tiled training products take work-groups of 16 x 16: only where both kernels allow
  // 256 work items (else the fast tier keeps the reference's products).
  const cl_kernel tiled[] = {c->k_mm_dx_t, c->k_mm_dw_t, c->k_gemm_t, c->k_mm_dx_qt, c->k_lora_fwd};
  c->train_tiled = c->fast;
  for (size_t i = 0; i < sizeof tiled / sizeof tiled[0]; i++) {
    size_t kwg = 0;
    if (clGetKernelWorkGroupInfo(tiled[i], c->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) != CL_SUCCESS || kwg < 256) c->train_tiled = 0;
  }
  { // the flash-style training attention's: 16 x 16 work-groups and up to ~37 KB of local
    // memory (two 16 x 256 row blocks); else the fast tier's attention keeps the probabilities
    cl_ulong lm = 0;
    int ok = c->train_tiled && clGetDeviceInfo(c->dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lm, &lm, NULL) == CL_SUCCESS;
    cl_kernel *fl[] = {&c->k_flash_fwd, &c->k_flash_dq, &c->k_flash_dkv};
    for (size_t i = 0; ok && i < sizeof fl / sizeof fl[0]; i++) {
      cl_ulong klm = 0;
      size_t kwg = 0;
      ok = clGetKernelWorkGroupInfo(*fl[i], c->dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof klm, &klm, NULL) == CL_SUCCESS && klm <= lm &&
           clGetKernelWorkGroupInfo(*fl[i], c->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) == CL_SUCCESS && kwg >= 256;
    }
    for (size_t i = 0; !ok && i < sizeof fl / sizeof fl[0]; i++) {
      clReleaseKernel(*fl[i]);
      *fl[i] = NULL;
    }
  }
  // An instance opened beside another has the integer-dot program its peer chose (dprog).
  if (c->dprog && (e = ocl_dot_kernels(c)) != 0) return ll_errf(err, errlen, e, "opencl: the integer-dot kernels: %s", ll_strerror(e));
  return 0;
}

// ---------------------------------------------------------------- integer dots (llsrv_dot.cl)

static const char *const dot_names[] = {"portable", "khr", "ptx"};

// The integer-dot program's text out of the embedded sources, NUL-terminated (malloc'd): the
// shared segments of llsrv.cl and llsrv_fast.cl (each from a line "// LL_SHARED_BEGIN" to one
// "// LL_SHARED_END": the pragmas, f64, helpers and fmm_store, written once for both programs)
// in their order, then llsrv_dot.cl's text (its #ifdef LL_DOT_PROGRAM to #endif //
// LL_DOT_PROGRAM). NULL if a marker is missing or unpaired.
static char *dot_source(void) {
  static const char sb[] = "\n// LL_SHARED_BEGIN", se[] = "\n// LL_SHARED_END\n", b[] = "#ifdef LL_DOT_PROGRAM\n", e[] = "#endif // LL_DOT_PROGRAM\n";
  const char *p = strstr(ll_opencl_source, b), *q = p ? strstr(p, e) : NULL;
  if (!q) return NULL;
  const size_t n = (size_t)(q - p) + sizeof e - 1;
  size_t total = n, segs = 0;
  for (const char *a = strstr(ll_opencl_source, sb), *z; a; a = strstr(z, sb), segs++) {
    if (!(z = strstr(a, se))) return NULL;
    z += sizeof se - 1, total += (size_t)(z - a);
  }
  if (segs == 0) return NULL;
  char *s = malloc(total + 1), *o = s;
  if (!s) return NULL;
  for (const char *a = strstr(ll_opencl_source, sb), *z; a; a = strstr(z, sb)) {
    z = strstr(a, se) + sizeof se - 1;
    memcpy(o, a, (size_t)(z - a)), o += z - a;
  }
  memcpy(o, p, n), o[n] = 0;
  return s;
}

int ocl_dot_kernels(struct ocl_ctx *c) {
  static const struct {
    int type;
    const char *name;
  } k[] = {{LL_TYPE_Q4_0, "fmmi_q4_0"}, {LL_TYPE_Q4_1, "fmmi_q4_1"}, {LL_TYPE_Q5_0, "fmmi_q5_0"}, {LL_TYPE_Q5_1, "fmmi_q5_1"}, {LL_TYPE_Q8_0, "fmmi_q8_0"},
           {LL_TYPE_Q4_K, "fmmi_q4_K"}, {LL_TYPE_Q5_K, "fmmi_q5_K"}, {LL_TYPE_Q6_K, "fmmi_q6_K"}};
  if (!c->dprog) return 0;
  cl_int e;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (!(c->k_fmmi[k[i].type] = clCreateKernel(c->dprog, k[i].name, &e))) return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_EIO;
  if (!(c->k_dot_probe = clCreateKernel(c->dprog, "dot_probe", &e))) return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_EIO;
  return 0;
}

static void dot_release(struct ocl_ctx *c) {
  for (int t = 0; t < LL_TYPE_COUNT; t++)
    if (c->k_fmmi[t]) clReleaseKernel(c->k_fmmi[t]), c->k_fmmi[t] = NULL;
  if (c->k_dot_probe) clReleaseKernel(c->k_dot_probe), c->k_dot_probe = NULL;
  if (c->dprog) clReleaseProgram(c->dprog), c->dprog = NULL;
}

// The probe: 64 rows of 8 words (random bytes, and rows of the extremes -128 and 127, where a
// wrong sign extension shows) dotted by ll_dot4 and by the portable form on the device, both
// compared with the host's byte-wise sums: integer sums are exact, so any difference fails.
// LL_OPENCL_FAULT=dotcheck: the tests' way to see the probe fail.
static int dot_probe(struct ocl_ctx *c, char *why, size_t cap) {
  enum { N = 64 };
  uint32_t a[N * 8], b[N * 8];
  int32_t out[2 * N], want[N];
  uint32_t s = 2463534242u;
  for (int i = 0; i < N * 8; i++) {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5, a[i] = s;
    s ^= s << 13, s ^= s >> 17, s ^= s << 5, b[i] = s;
  }
  for (int j = 0; j < 8; j++) a[j] = b[j] = 0x80808080u, a[8 + j] = 0x80808080u, b[8 + j] = 0x7f7f7f7fu, a[16 + j] = b[16 + j] = 0x7f7f7f7fu;
  for (int i = 0; i < N; i++) {
    int32_t acc = i - N / 2;
    for (int j = 0; j < 32; j++) {
      const int8_t x = (int8_t)(uint8_t)(a[i * 8 + j / 4] >> (8 * (j % 4))), y = (int8_t)(uint8_t)(b[i * 8 + j / 4] >> (8 * (j % 4)));
      acc += (int32_t)x * y;
    }
    want[i] = acc;
  }
  cl_int e = CL_SUCCESS;
  cl_mem ma = clCreateBuffer(c->cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof a, a, &e);
  cl_mem mb = ma ? clCreateBuffer(c->cx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof b, b, &e) : NULL;
  cl_mem mo = mb ? clCreateBuffer(c->cx, CL_MEM_WRITE_ONLY, sizeof out, NULL, &e) : NULL;
  const int n = N;
  const size_t gl = N;
  if (mo) {
    cl_kernel k = c->k_dot_probe;
    e = clSetKernelArg(k, 0, sizeof ma, &ma) | clSetKernelArg(k, 1, sizeof mb, &mb) | clSetKernelArg(k, 2, sizeof mo, &mo) | clSetKernelArg(k, 3, sizeof n, &n);
    if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(c->q, k, 1, NULL, &gl, NULL, 0, NULL, NULL);
    if (e == CL_SUCCESS) e = clEnqueueReadBuffer(c->q, mo, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL);
  }
  if (ma) clReleaseMemObject(ma);
  if (mb) clReleaseMemObject(mb);
  if (mo) clReleaseMemObject(mo);
  if (e != CL_SUCCESS) return snprintf(why, cap, "its self-check did not run (%s)", ocl_cl_errname(e)), -1;
  const char *fault = getenv("LL_OPENCL_FAULT");
  if (fault && strcmp(fault, "dotcheck") == 0) out[3] += 1;
  for (int i = 0; i < N; i++)
    if (out[i] != want[i] || out[N + i] != want[i])
      return snprintf(why, cap, "its self-check gave %d (portable form %d) where the sum is %d (row %d)", out[i], out[N + i], want[i], i), -1;
  return 0;
}

// Build the integer-dot program for path (OCL_DOT_*) and check it; 0, or -1 with why.
static int dot_try(struct ocl_ctx *c, const char *cache_dir, const char *src, int path, char *why, size_t cap) {
  char opts[256], log[400];
  // cl_khr_integer_dot_product's built-ins are OpenCL C 3.0 features: that language where the
  // device has it.
  char cv[64] = "";
  clGetDeviceInfo(c->dev, CL_DEVICE_OPENCL_C_VERSION, sizeof cv - 1, cv, NULL);
  const int cl3 = path == OCL_DOT_KHR && strncmp(cv, "OpenCL C 3", 10) == 0;
  snprintf(opts, sizeof opts, "%s%s -DLL_DOT_PROGRAM -DLL_DOT=%d", cl3 ? "-cl-std=CL3.0" : ocl_build_opts(c), cl3 && c->no_fp64 ? " -DLL_NO_FP64" : "", path);
  int hit = 0;
  if (build_src(c, cache_dir, src, opts, &c->dprog, &hit, log, sizeof log)) return snprintf(why, cap, "its program did not build (%.240s)", log), -1;
  if (ocl_dot_kernels(c)) {
    dot_release(c);
    return snprintf(why, cap, "its kernels could not be made"), -1;
  }
  if (dot_probe(c, why, cap)) {
    dot_release(c);
    return -1;
  }
  c->dot = path;
  return 0;
}

// The fast tier's integer dots: LL_OPENCL_DOT=auto (unset) takes dp4a through PTX on NVIDIA's
// devices, cl_khr_integer_dot_product's built-ins where the device advertises it, else the
// portable byte-wise form; =portable|khr|ptx asks for one (tried even where the device does
// not advertise it: the build and the probe decide), =off keeps the float products (fmm_*).
// A variant that fails to build or to pass the probe falls back to the portable one, the
// portable one to off; info.dot_note says why, in one line. Never fails the device.
void ocl_dot_setup(struct ocl_ctx *c, const char *cache_dir) {
  static const char *const vals[] = {"auto", "portable", "khr", "ptx", "off"};
  struct ll_backend_info *in = &c->info;
  c->dot = OCL_DOT_OFF, in->dot_note[0] = 0;
  snprintf(in->dot, sizeof in->dot, "off");
  if (!c->fast) return; // the reference tier's products have integer sums of their own
  const char *env = getenv("LL_OPENCL_DOT");
  int want = 0; // index in vals
  if (env && *env) {
    want = -1;
    for (int i = 0; i < (int)(sizeof vals / sizeof vals[0]); i++)
      if (strcmp(env, vals[i]) == 0) want = i;
    if (want < 0) {
      snprintf(in->dot_note, sizeof in->dot_note, "LL_OPENCL_DOT='%.40s' is not auto, portable, khr, ptx or off: auto", env);
      want = 0;
    }
  }
  if (want == 4) return;
  char plat[128] = "", ext[4096] = "";
  clGetPlatformInfo(c->plat, CL_PLATFORM_NAME, sizeof plat - 1, plat, NULL);
  clGetDeviceInfo(c->dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
  const int nvidia = strstr(in->vendor, "NVIDIA") != NULL || strstr(plat, "NVIDIA") != NULL;
  const int khr = strstr(ext, "cl_khr_integer_dot_product") != NULL;
  const int path = want == 0 ? (nvidia ? OCL_DOT_PTX : khr ? OCL_DOT_KHR : OCL_DOT_PORTABLE) : want - 1;
  char *src = dot_source();
  if (!src) {
    snprintf(in->dot_note, sizeof in->dot_note, "integer dots off: llsrv_dot.cl's text is missing from the embedded sources");
    return;
  }
  char why[300] = "";
  int rc = dot_try(c, cache_dir, src, path, why, sizeof why);
  if (rc && path != OCL_DOT_PORTABLE) {
    const char *lacks = path == OCL_DOT_PTX && !nvidia ? " (the device is not NVIDIA's)"
                        : path == OCL_DOT_KHR && !khr ? " (the device does not advertise cl_khr_integer_dot_product)"
                                                      : "";
    char w2[300] = "";
    rc = dot_try(c, cache_dir, src, OCL_DOT_PORTABLE, w2, sizeof w2);
    snprintf(in->dot_note, sizeof in->dot_note, "%s%s dots%s: %.300s; %s%.60s%s", want ? "LL_OPENCL_DOT=" : "integer dots: ", dot_names[path], lacks,
             why, rc ? "the portable ones failed too (" : "the portable ones instead", rc ? w2 : "", rc ? "): integer dots off" : "");
  } else if (rc) {
    snprintf(in->dot_note, sizeof in->dot_note, "portable integer dots: %.300s; integer dots off", why);
  }
  free(src);
  if (c->dot != OCL_DOT_OFF) snprintf(in->dot, sizeof in->dot, "%s", dot_names[c->dot]);
}

// Warm-up and self-test: a small Q8_0 product (3 tokens, 5 rows of 64, two unit groups) and
// its accumulate form against the CPU's scalar reference (the fast tier's too: it quantizes the
// activations as the CPU does, and its sums are within float rounding). A device that computes
// it wrong is not used.
int ocl_self_test(struct ll_backend *b, char *err, size_t errlen) {
  enum { K = 64, N = 5, T = 3 };
  float wf[N * K], x[T * K], out[T * N], ref[T * N];
  ll_block_q8_0 wq[N * K / 32], xq[K / 32];
  float wd[K], xd[K];
  uint32_t s = 12345;
  for (int i = 0; i < N * K; i++) s = s * 1664525u + 1013904223u, wf[i] = (float)(s >> 8) / (float)(1 << 24) - 0.5f;
  for (int i = 0; i < T * K; i++) s = s * 1664525u + 1013904223u, x[i] = (float)(s >> 8) / (float)(1 << 24) - 0.5f;
  for (int r = 0; r < N; r++) ll_quantize_row(LL_TYPE_Q8_0, wf + r * K, wq + r * (K / 32), K);
  // The reference: the activations quantized to Q8_0 as the CPU quantizes them (formats/quant.c),
  // the product of the dequantized values in double (any order is within the tolerance below).
  for (int t = 0; t < T; t++) {
    if (ll_quantize_row(LL_TYPE_Q8_0, x + t * K, xq, K) != 0 || ll_dequantize_row(LL_TYPE_Q8_0, xq, xd, K) != 0)
      return ll_errf(err, errlen, LL_EIO, "opencl: self-test: quantize");
    for (int r = 0; r < N; r++) {
      if (ll_dequantize_row(LL_TYPE_Q8_0, wq + r * (K / 32), wd, K) != 0) return ll_errf(err, errlen, LL_EIO, "opencl: self-test: dequantize");
      double sum = 0;
      for (int i = 0; i < K; i++) sum += (double)wd[i] * xd[i];
      ref[t * N + r] = (float)sum;
    }
  }
  struct ll_weight w = {LL_TYPE_Q8_0, K, N, wq, NULL, NULL};
  int rc = b->i->weight_upload(b, &w);
  if (rc == 0) rc = b->i->matmul(b, out, x, &w, T, 0);
  if (rc == 0) rc = b->i->matmul(b, out, x, &w, T, 1); // out = 2 * product
  b->i->weight_release(b, &w);
  if (rc) return ll_errf(err, errlen, rc, "opencl: self-test product failed to run: %s", ll_strerror(rc));
  // LL_OPENCL_FAULT=selftest: the tests' way to see a device fail its self-test.
  const char *fault = getenv("LL_OPENCL_FAULT");
  if (fault && strcmp(fault, "selftest") == 0) out[T * N - 1] += 1.0f;
  for (int i = 0; i < T * N; i++)
    if (!(fabsf(out[i] - 2 * ref[i]) <= 1e-4f * (1 + fabsf(ref[i]))))
      return ll_errf(err, errlen, LL_EIO, "opencl: self-test failed: product element %d is %g, the CPU reference gives %g", i, out[i], 2 * ref[i]);
  return 0;
}
