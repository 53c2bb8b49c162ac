// device.c - choose the compute backend and say why in one line.
//
// "auto" and "opencl" look through the ICD loader for GPUs (and accelerators): discrete ones
// first (no unified host memory), then integrated, each group by global memory, then compute
// units. Each candidate is built and self-tested (ll_backend_opencl_create); one that fails
// is skipped with its reason, the next is tried. A CPU OpenCL device (PoCL) is used only when
// named: "opencl:P:D" picks exactly device D of platform P, "opencl:P" the best of platform P.
// No ICD, no platform, no device, or nothing that passes: the CPU backend, with the reason.
// Only a malformed device string is an error.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_backend.h"
#include "ll_error.h"

#define MAX_CAND 64

struct cand {
  int p, d;
  int gpu, discrete;
  cl_ulong mem;
  cl_uint cu;
  char name[96];
};

static int cand_cmp(const void *va, const void *vb) {
  const struct cand *a = va, *b = vb;
  if (a->gpu != b->gpu) return b->gpu - a->gpu;
  if (a->discrete != b->discrete) return b->discrete - a->discrete;
  if (a->mem != b->mem) return a->mem < b->mem ? 1 : -1;
  if (a->cu != b->cu) return a->cu < b->cu ? 1 : -1;
  return a->p != b->p ? a->p - b->p : a->d - b->d;
}

// Every OpenCL device (up to MAX_CAND). Returns the count, or a negative OpenCL status when
// the loader finds no platform at all.
static int enumerate(struct cand *out, int *n_plat) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int e = clGetPlatformIDs(16, plats, &np);
  *n_plat = 0;
  if (e != CL_SUCCESS) return e < 0 ? e : -1;
  if (np == 0) return CL_INVALID_PLATFORM;
  *n_plat = (int)(np < 16 ? np : 16);
  int n = 0;
  for (int p = 0; p < *n_plat; p++) {
    cl_device_id dev[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, dev, &nd) != CL_SUCCESS) continue;
    for (int d = 0; d < (int)nd && d < 16 && n < MAX_CAND; d++) {
      struct cand *c = &out[n++];
      memset(c, 0, sizeof *c);
      c->p = p, c->d = d;
      cl_device_type t = 0;
      cl_bool unified = CL_FALSE;
      clGetDeviceInfo(dev[d], CL_DEVICE_TYPE, sizeof t, &t, NULL);
      clGetDeviceInfo(dev[d], CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
      clGetDeviceInfo(dev[d], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof c->mem, &c->mem, NULL);
      clGetDeviceInfo(dev[d], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof c->cu, &c->cu, NULL);
      if (clGetDeviceInfo(dev[d], CL_DEVICE_NAME, sizeof c->name, c->name, NULL) != CL_SUCCESS) c->name[0] = 0;
      c->name[sizeof c->name - 1] = 0;
      c->gpu = (t & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0;
      c->discrete = c->gpu && !unified;
    }
  }
  return n;
}

// Parses "auto" | "cpu" | "opencl" | "opencl:P" | "opencl:P:D" into kind (0 auto, 1 cpu,
// 2 opencl) and P, D (-1 when not given).
static int parse_device(const char *s, int *kind, int *P, int *D) {
  *P = *D = -1;
  if (strcmp(s, "auto") == 0) return *kind = 0, 0;
  if (strcmp(s, "cpu") == 0) return *kind = 1, 0;
  if (strncmp(s, "opencl", 6) != 0) return -1;
  *kind = 2;
  s += 6;
  if (!*s) return 0;
  if (*s != ':') return -1;
  char *end;
  long p = strtol(s + 1, &end, 10);
  if (end == s + 1 || p < 0 || p > 15) return -1;
  *P = (int)p;
  if (!*end) return 0;
  if (*end != ':') return -1;
  const char *ds = end + 1;
  long d = strtol(ds, &end, 10);
  if (end == ds || *end || d < 0 || d > 15) return -1;
  *D = (int)d;
  return 0;
}

// ---------------------------------------------------------------- a missing ICD file

// Vendors whose driver ships an OpenCL library that the ICD loader finds only through a file
// in its vendors directory; driver images (NVIDIA's on Ubuntu, for one) often ship the library
// without that file, and then the GPU is invisible to every OpenCL program.
static const struct {
  const char *vendor, *lib, *icd;
} known_icds[] = {
    {"NVIDIA", "libnvidia-opencl.so.1", "nvidia.icd"},
    {"AMD ROCm", "libamdocl64.so", "amdocl64.icd"},
    {"Intel", "libigdrcl.so", "intel.icd"},
};

static const char *const default_lib_dirs = "/usr/lib/x86_64-linux-gnu:/usr/lib/aarch64-linux-gnu:/usr/lib64:/usr/lib:/usr/local/lib:"
                                            "/usr/lib/wsl/lib:/opt/rocm/lib:/opt/rocm/opencl/lib";

// 1 when an ICD file (one file, or the *.icd files of a directory) names lib, by its base name
// or a path that ends with it.
static int icd_names(const char *icd, const char *lib) {
  struct stat st;
  if (stat(icd, &st) != 0) return 0;
  char files[64][300];
  int nf = 0;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(icd);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d)) && nf < 64;) {
      size_t n = strlen(e->d_name);
      if (n > 4 && strcmp(e->d_name + n - 4, ".icd") == 0) snprintf(files[nf++], sizeof files[0], "%.120s/%.170s", icd, e->d_name);
    }
    closedir(d);
  } else {
    snprintf(files[nf++], sizeof files[0], "%.290s", icd);
  }
  for (int i = 0; i < nf; i++) {
    FILE *f = fopen(files[i], "r");
    if (!f) continue;
    char line[512];
    int hit = 0;
    while (!hit && fgets(line, sizeof line, f)) {
      line[strcspn(line, "\r\n")] = 0;
      size_t n = strlen(line), m = strlen(lib);
      hit = n >= m && strcmp(line + n - m, lib) == 0 && (n == m || line[n - m - 1] == '/');
    }
    fclose(f);
    if (hit) return 1;
  }
  return 0;
}

int ll_opencl_icd_hint(char *out, size_t cap, const char *lib_dirs, const char *icd) {
  if (cap) out[0] = 0;
  char dirs[2048];
  const char *ld = getenv("LD_LIBRARY_PATH");
  if (!lib_dirs) snprintf(dirs, sizeof dirs, "%s%s%s", ld ? ld : "", ld && *ld ? ":" : "", default_lib_dirs);
  else snprintf(dirs, sizeof dirs, "%s", lib_dirs);
  const char *env_icd = getenv("OCL_ICD_VENDORS");
  if (!icd) icd = env_icd && *env_icd ? env_icd : "/etc/OpenCL/vendors";
  for (size_t v = 0; v < sizeof known_icds / sizeof known_icds[0]; v++) {
    char found[600] = "";
    for (const char *p = dirs; *p && !found[0];) {
      size_t n = strcspn(p, ":");
      if (n > 0 && n < 400) {
        char path[600];
        snprintf(path, sizeof path, "%.*s/%s", (int)n, p, known_icds[v].lib);
        if (access(path, F_OK) == 0) snprintf(found, sizeof found, "%s", path);
      }
      p += n + (p[n] == ':');
    }
    if (!found[0] || icd_names(icd, known_icds[v].lib)) continue;
    struct stat st;
    const int is_dir = stat(icd, &st) != 0 || S_ISDIR(st.st_mode);
    if (is_dir)
      snprintf(out, cap, "%s's OpenCL library %s is installed but no ICD file in %s names it, so no OpenCL program sees that GPU; "
                         "fix (as root): mkdir -p %s && echo %s > %s/%s",
               known_icds[v].vendor, found, icd, icd, known_icds[v].lib, icd, known_icds[v].icd);
    else
      snprintf(out, cap, "%s's OpenCL library %s is installed but the ICD file %s (OCL_ICD_VENDORS) does not name it; "
                         "fix: point OCL_ICD_VENDORS at a file holding the line %s",
               known_icds[v].vendor, found, icd, known_icds[v].lib);
    return 1;
  }
  return 0;
}

static int cpu_with(struct ll_backend **out, int threads, char *reason, size_t rl, char *err, size_t errlen, const char *fmt, const char *a,
                    const char *b) {
  int rc = ll_backend_cpu_create(out, threads, err, errlen);
  if (rc == 0 && reason && rl) snprintf(reason, rl, fmt, a, b);
  return rc;
}

int ll_backend_create(struct ll_backend **out, const struct ll_backend_params *p, char *reason, size_t reason_len, char *err, size_t errlen) {
  const char *want = p && p->device ? p->device : "auto";
  const int threads = p ? p->n_threads : 0;
  const char *cache = p ? p->cache_dir : NULL;
  int kind, P, D;
  if (parse_device(want, &kind, &P, &D))
    return ll_errf(err, errlen, LL_EINVAL, "device '%s': expected auto, cpu, opencl, opencl:P or opencl:P:D (P, D < 16)", want);
  if (kind == 1) return cpu_with(out, threads, reason, reason_len, err, errlen, "cpu: requested with --device %s%s", want, "");
  struct cand cands[MAX_CAND];
  int n_plat;
  const int n = enumerate(cands, &n_plat);
  char why[1024];
  char hint[700] = "";
  if (n < 0) {
    if (ll_opencl_icd_hint(hint + 2, sizeof hint - 2, NULL, NULL)) memcpy(hint, "; ", 2);
    snprintf(why, sizeof why, "no OpenCL platform found (ICD loader status %d%s)%s", n, n == -1001 ? ": no usable ICD file" : "", hint);
    return cpu_with(out, threads, reason, reason_len, err, errlen, "cpu: %s%s", why, kind == 2 ? " for the requested OpenCL device" : "");
  }
  qsort(cands, (size_t)n, sizeof cands[0], cand_cmp);
  // Candidates in order of preference: the named device, the named platform's devices, or
  // every GPU.
  int order[MAX_CAND], m = 0, skipped_cpu = 0;
  for (int i = 0; i < n; i++) {
    const struct cand *c = &cands[i];
    if (P >= 0 && c->p != P) continue;
    if (D >= 0 && c->d != D) continue;
    if (P < 0 && !c->gpu) {
      skipped_cpu++;
      continue;
    }
    order[m++] = i;
  }
  if (m == 0) {
    if (P < 0 && ll_opencl_icd_hint(hint + 2, sizeof hint - 2, NULL, NULL)) memcpy(hint, "; ", 2);
    if (P >= 0) snprintf(why, sizeof why, "no OpenCL device %s (%d platform(s), %d device(s) found)", want, n_plat, n);
    else if (skipped_cpu)
      snprintf(why, sizeof why, "no OpenCL GPU; CPU OpenCL devices are used only when named (--device opencl:%d:%d is '%s')%s", cands[0].p,
               cands[0].d, cands[0].name, hint);
    else snprintf(why, sizeof why, "no OpenCL device found on %d platform(s)%s", n_plat, hint);
    return cpu_with(out, threads, reason, reason_len, err, errlen, "cpu: %s%s", why, "");
  }
  why[0] = 0;
  for (int k = 0; k < m; k++) {
    const struct cand *c = &cands[order[k]];
    char e[400];
    int rc = ll_backend_opencl_create(out, c->p, c->d, cache, e, sizeof e);
    if (rc == 0) {
      if (reason && reason_len) {
        const char *how = D >= 0 ? "requested" : P >= 0 ? "best device of the requested platform" : "best OpenCL GPU";
        snprintf(reason, reason_len, "opencl:%d:%d: %s (%s, %.1f GiB, %u CUs); kernels %s%s%s", c->p, c->d, how,
                 c->gpu ? (c->discrete ? "discrete GPU" : "integrated GPU") : "CPU device", (double)c->mem / (1 << 30), c->cu,
                 ll_backend_opencl_cache_hit(*out) ? "from the binary cache" : "built", why[0] ? "; " : "", why);
        struct ll_backend_info bi; // the fast tier's integer dots, and why not the ones asked for
        (*out)->i->get_info(*out, &bi);
        size_t l = strlen(reason);
        if (strcmp(bi.tier, "fast") == 0 && l < reason_len)
          snprintf(reason + l, reason_len - l, "; integer dots %s%s%s", bi.dot, bi.dot_note[0] ? ": " : "", bi.dot_note);
      }
      return 0;
    }
    // Reported and skipped: the next candidate, or the CPU.
    size_t l = strlen(why);
    snprintf(why + l, sizeof why - l, "%sskipped opencl:%d:%d '%s': %s", l ? "; " : "", c->p, c->d, c->name, e);
  }
  return cpu_with(out, threads, reason, reason_len, err, errlen, "cpu: %s%s", why, "");
}

void ll_backend_free(struct ll_backend *b) {
  if (b && b->i && b->i->free) b->i->free(b);
}

void *ll_backend_alloc(struct ll_backend *b, size_t n) {
  if (b && b->i && b->i->alloc) return b->i->alloc(b, n);
  // Host memory: 64-byte aligned (a cache line, a zmm register), zeroed.
  size_t sz = (n + 63) & ~(size_t)63;
  if (sz < n) return NULL;
  void *p = aligned_alloc(64, sz ? sz : 64);
  if (p) memset(p, 0, sz ? sz : 64);
  return p;
}

void ll_backend_free_buf(struct ll_backend *b, void *p) {
  if (!p) return;
  if (b && b->i && b->i->alloc) {
    if (b->i->free_buf) b->i->free_buf(b, p);
    return;
  }
  free(p);
}

int ll_backend_host_buffers(const struct ll_backend *b) { return !(b && b->i && b->i->copy); }

int ll_backend_copy(struct ll_backend *b, void *dst, const void *src, size_t n) {
  if (n == 0 || dst == src) return 0;
  if (!ll_backend_host_buffers(b)) return b->i->copy(b, dst, src, n);
  memmove(dst, src, n);
  return 0;
}

int ll_backend_sync(struct ll_backend *b) { return b && b->i && b->i->sync ? b->i->sync(b) : 0; }

int ll_backend_matmul_n(struct ll_backend *b, int n, float *const out[], const float *x, const struct ll_weight *const w[], int T) {
  if (b->i->matmul_n && n <= 4) return b->i->matmul_n(b, n, out, x, w, T);
  for (int i = 0; i < n; i++) {
    const int rc = b->i->matmul(b, out[i], x, w[i], T, 0);
    if (rc) return rc;
  }
  return 0;
}

int ll_backend_zero(struct ll_backend *b, void *dst, size_t n) {
  if (n == 0) return 0;
  if (!ll_backend_host_buffers(b)) return b->i->zero ? b->i->zero(b, dst, n) : LL_EUNSUPPORTED;
  memset(dst, 0, n);
  return 0;
}
