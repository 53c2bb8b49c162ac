// device.c - choose the compute backend and say why in one line.
//
// "auto" looks for an OpenCL GPU through the ICD loader. The OpenCL backend itself arrives in
// a later issue, so for now every choice lands on the CPU, with a reason that says what was
// found; an explicit "opencl" request is refused with a clear message rather than silently
// downgraded.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_error.h"

static int count_gpus(char *name, size_t cap) {
  cl_uint np = 0;
  cl_platform_id plats[16];
  if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS) return -1;
  int gpus = 0;
  for (cl_uint i = 0; i < np && i < 16; i++) {
    cl_device_id dev[16];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_GPU, 16, dev, &nd) != CL_SUCCESS) continue;
    if (nd && gpus == 0) clGetDeviceInfo(dev[0], CL_DEVICE_NAME, cap, name, NULL);
    gpus += (int)nd;
  }
  return gpus;
}

int ll_backend_create(struct ll_backend **out, const struct ll_backend_params *p, char *reason, size_t reason_len, char *err, size_t errlen) {
  const char *want = p && p->device ? p->device : "auto";
  const int threads = p ? p->n_threads : 0;
  if (strncmp(want, "opencl", 6) == 0)
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "device '%s': the OpenCL backend is not built in this version (use --device cpu or auto)", want);
  if (strcmp(want, "cpu") != 0 && strcmp(want, "auto") != 0)
    return ll_errf(err, errlen, LL_EINVAL, "device '%s': expected auto, cpu or opencl[:P[:D]]", want);
  int rc = ll_backend_cpu_create(out, threads, err, errlen);
  if (rc) return rc;
  if (reason && reason_len) {
    if (strcmp(want, "cpu") == 0) {
      snprintf(reason, reason_len, "cpu: requested with --device cpu");
    } else {
      char gpu[128] = "";
      int n = count_gpus(gpu, sizeof gpu);
      if (n < 0) snprintf(reason, reason_len, "cpu: no OpenCL platform found");
      else if (n == 0) snprintf(reason, reason_len, "cpu: no OpenCL GPU found (CPU-only OpenCL platforms are not used)");
      else snprintf(reason, reason_len, "cpu: OpenCL GPU '%s' found, but the OpenCL backend is not built in this version", gpu);
    }
  }
  return 0;
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
