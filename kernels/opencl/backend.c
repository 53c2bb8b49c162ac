// backend_opencl.c - the OpenCL backend: struct ll_backend_i on one OpenCL 1.2 device.
//
// What lives where (see ll_backend.h):
// - Weights are resident on the device: weight_upload copies a matrix once (w->dev); a weight
//   that was never uploaded is copied for each call (correct, slow). A tied matrix (two
//   ll_weights over the same data) is uploaded once. A weight whose data is a backend buffer
//   (the trainer's f32 weights in full mode) is used where it is.
// - The KV cache is resident on the device: a pool pointer (ll_kv_view.k/v) names a device
//   buffer, grown (with its contents) when a block beyond its end is first stored. Its host
//   memory is never written.
// - Activations, gradients, adapters and optimizer state are backend buffers (alloc): device
//   memory named by a reserved host address range (struct rbuf). Each op binds its operands
//   to slots: a backend buffer (or a pointer into one) is used in place, as itself or as a
//   sub-buffer at the offset (a device-side copy where the device cannot start a sub-buffer
//   there); host memory is uploaded into the slot's staging buffer and results read back, as
//   before buffers were resident. So the engine's decode step uploads token ids, positions
//   and index arrays and reads back the logits, and a training step reads back only the
//   loss's and the gradient norm's partial sums; ops queue without a wait in between.
// - Host uploads are copied into an arena first (non-blocking writes from memory we own), so
//   the caller's memory may change as soon as an op returns; small operands that repeat
//   (norm weights, rope tables) stay cached on the device (struct cconst).
// - Training: every training member of the interface (matmul_backward with dx for every
//   weight type the forward supports and dw for F32, rmsnorm/rope/swiglu backward, attention
//   train + backward, softmax_xent, get_rows_backward, dropout, sumsq, axpy, scale, adamw) runs
//   here too (kernels/opencl/train.cl).
// Every allocation is counted (mem_used) against the device's global memory, so get_info
// reports what we hold, and an allocation that would not fit fails with LL_ENOMEM before the
// driver is asked.
// Numerics: see kernels/opencl/llsrv.cl (activations quantized as the CPU quantizes them) and
// train.cl (the training references' sums in their order).
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll_backend.h"
#include "ll_cpu_dot.h"
#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_quant.h"

extern const char ll_opencl_source[]; // kernels/opencl/*.cl, embedded by cmake/embed_cl.cmake

#define WG 64 // as llsrv.cl
#define TT 8

// Staging buffers (device memory reused across calls; each op names what it puts where).
// S_C .. S_F: the training ops' extra operands (attention_backward has nine).
enum { S_W, S_X, S_XQ, S_XS, S_OUT, S_A, S_B, S_POS, S_TAB, S_SEQ, S_TOFF, S_SNT, S_SCR, S_C, S_D, S_E, S_F, S_COUNT };

struct sbuf {
  cl_mem m;     // the staging buffer (device memory reused across calls)
  size_t cap;
  cl_mem use;   // what this op's kernels read and write for the slot: m, a backend buffer, or sub
  cl_mem sub;   // a sub-buffer made for this binding (released at the next one)
  const struct rbuf *res; // the backend buffer bound (NULL: staging)
  size_t off, len; // ... at this byte offset, this many bytes
  int copied;   // 1: res's bytes were copied into m (an offset sub-buffers cannot start at)
};

// A backend buffer (alloc): device memory named by an address range reserved in the host's
// address space with no memory behind it (PROT_NONE), so every buffer has a unique address,
// pointers into it can be offset as host arrays are, and a stray host access faults at once
// instead of reading stale bytes.
struct rbuf {
  char *base;
  size_t n;     // bytes (the reservation and the device buffer)
  cl_mem m;
};

struct ocl_weight {
  cl_mem m;
  size_t bytes;
  const void *host; // the ll_weight's data this copies
  int refs;         // ll_weights naming it (tied embeddings share one copy)
  const void *owner; // the ocl_ctx holding it (it releases the copy)
  cl_context cx;     // cl_mems are bound to their context: instances sharing it share the copy
};

// A small host operand that most calls repeat (a norm's weights, the rope tables of a step's
// positions): kept on the device with a copy of its bytes, and uploaded again only when the
// host bytes differ from the copy (compared on every call: correct even if they change).
struct cconst {
  const void *host;
  size_t bytes;
  cl_mem m;
  void *copy;
  uint64_t used; // tick of the last call: the least recently used entry is replaced
};
#define N_CONST 256
#define CONST_MAX_BYTES ((size_t)1 << 20)   // larger operands are staged per call
#define CONST_TOTAL_BYTES ((size_t)8 << 20) // the cache's device memory (and as much host)

// A loss softmax_xent left for the next drain (its row statistics still on their way).
struct pending_loss {
  double *loss;
  float *rs;      // (T, 4): max, sum hi, sum lo, target logit (read back non-blocking)
  int32_t *tg;    // (T) targets, copied
  int T;
};

struct kvpool {
  const void *host; // the pool's name (ll_kv_view.k or .v)
  cl_mem m;
  size_t cap;
};

// Device memory held by every instance on one context (ll_backend_opencl_create_beside): each
// allocation is checked against the device's memory with all of them counted.
struct ocl_share {
  _Atomic int64_t used;
  _Atomic int refs;
};

struct ocl_ctx {
  cl_platform_id plat;
  cl_device_id dev;
  cl_context cx;
  cl_command_queue q;
  cl_program prog;
  cl_kernel k_quant, k_round, k_mm[LL_TYPE_COUNT], k_mm_f, k_gr_f, k_gr_q, k_rmsnorm, k_rope, k_swiglu, k_add, k_kv_store,
      k_attention;
  // the fast tier (llsrv_fast.cl); k_argmax serves both tiers
  cl_kernel k_fmm[LL_TYPE_COUNT], k_rope_kv, k_argmax;
  int fast; // 1: the fast tier's kernels (fused ops, f32 activations); 0: the reference tier
  // training (train.cl)
  cl_kernel k_deq, k_mm_dx, k_mm_dw, k_rms_bwd, k_rms_dg, k_rope_bwd, k_swiglu_bwd, k_attn_train, k_attn_bwd_q, k_attn_bwd_kv, k_xent,
      k_gr_bwd, k_dropout, k_sumsq, k_axpy, k_scale, k_adamw;
  struct sbuf s[S_COUNT];
  struct ocl_weight **w; // every device weight (uploaded or copied on first use)
  int n_w, cap_w;
  struct kvpool *kv;
  int n_kv, cap_kv;
  float *rope_cs;
  size_t rope_cap;
  struct cconst cc[N_CONST];
  int n_cc;
  size_t cc_bytes;
  uint64_t cc_tick;
  struct rbuf *rb; // backend buffers
  int n_rb, cap_rb;
  size_t addr_align; // CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: where a sub-buffer may start
  // Host bytes of queued uploads: copied here so the caller's memory may change once an op
  // returns, without waiting for the device. Reset whenever the queue has drained.
  unsigned char *arena;
  size_t arena_cap, arena_used;
  int64_t bytes_up, bytes_down, waits, launches;
  struct pending_loss *pend; // completed by drained()
  int n_pend, cap_pend;
  int64_t mem_used, mem_total, max_alloc; // mem_used: this instance's
  struct ocl_share *share;
  struct ll_backend_info info;
  int cache_hit; // the program came from the binary cache
  int no_alloc;  // LL_OPENCL_FAULT=train_alloc on an instance opened beside another: alloc fails
  int no_fp64;   // LL_OPENCL_NO_FP64=1: kernels built without f64 (see build_opts)
};

#define CTX(b) ((struct ocl_ctx *)(b)->ctx)

static const char *cl_errname(cl_int e) {
  switch (e) {
  case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
  case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
  case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
  case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
  case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
  case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
  case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
  case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
  case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
  case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
  case CL_INVALID_BINARY: return "CL_INVALID_BINARY";
  case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no usable ICD)";
  default: return "OpenCL error";
  }
}

// OpenCL status -> LL_E*: allocation failures are out-of-memory, the rest device errors.
static int cl_rc(cl_int e) {
  if (e == CL_SUCCESS) return 0;
  if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_OUT_OF_HOST_MEMORY) return LL_ENOMEM;
  return LL_EIO;
}

// ---------------------------------------------------------------- memory accounting

static cl_mem dev_alloc(struct ocl_ctx *c, size_t bytes, cl_int *e) {
  if (bytes == 0) bytes = 16;
  // Counted first (atomically: the server's trainer allocates on its own thread), then asked for.
  const int64_t before = atomic_fetch_add(&c->share->used, (int64_t)bytes);
  if ((int64_t)bytes > c->max_alloc || before + (int64_t)bytes > c->mem_total) {
    atomic_fetch_sub(&c->share->used, (int64_t)bytes);
    *e = CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return NULL;
  }
  cl_mem m = clCreateBuffer(c->cx, CL_MEM_READ_WRITE, bytes, NULL, e);
  if (m) c->mem_used += (int64_t)bytes;
  else atomic_fetch_sub(&c->share->used, (int64_t)bytes);
  return m;
}

static void dev_release(struct ocl_ctx *c, cl_mem m, size_t bytes) {
  if (!m) return;
  clReleaseMemObject(m);
  c->mem_used -= (int64_t)(bytes ? bytes : 16);
  atomic_fetch_sub(&c->share->used, (int64_t)(bytes ? bytes : 16));
}

// ---------------------------------------------------------------- host <-> device

// The loss from softmax_xent's row statistics, on the host in double as the reference computes
// it: log Σ - (l_y - m) per counted row.
static double xent_loss(const float *rs, const int32_t *targets, int T) {
  double total = 0;
  for (int t = 0; t < T; t++) {
    if (targets[t] < 0) continue;
    const float m = rs[4 * t], ly = rs[4 * t + 3];
    total += log((double)rs[4 * t + 1] + (double)rs[4 * t + 2]) - ((double)ly - m);
  }
  return total;
}

// The queue has drained (a blocking read or a finish returned): the arena's bytes are free,
// and the deferred losses' statistics have arrived.
static void drained(struct ocl_ctx *c) {
  c->arena_used = 0;
  for (int i = 0; i < c->n_pend; i++) {
    *c->pend[i].loss = xent_loss(c->pend[i].rs, c->pend[i].tg, c->pend[i].T);
    free(c->pend[i].rs), free(c->pend[i].tg);
  }
  c->n_pend = 0;
}

static int finish(struct ocl_ctx *c) {
  c->waits++;
  cl_int e = clFinish(c->q);
  drained(c);
  return cl_rc(e);
}

#define ARENA_MAX ((size_t)64 << 20) // larger uploads block instead

// Queue a write of host bytes to dst at off; src may change as soon as this returns.
static int upload(struct ocl_ctx *c, cl_mem dst, size_t off, const void *src, size_t bytes) {
  if (!bytes) return 0;
  c->bytes_up += (int64_t)bytes;
  if (bytes > ARENA_MAX) return cl_rc(clEnqueueWriteBuffer(c->q, dst, CL_TRUE, off, bytes, src, 0, NULL, NULL));
  const size_t need = (bytes + 63) & ~(size_t)63;
  if (c->arena_used + need > c->arena_cap) {
    int rc = finish(c); // the queued uploads have read their bytes: the arena may move
    if (rc) return rc;
    if (need > c->arena_cap) {
      size_t cap = c->arena_cap ? c->arena_cap : (size_t)1 << 20;
      while (cap < need) cap *= 2;
      unsigned char *na = realloc(c->arena, cap);
      if (!na) return LL_ENOMEM;
      c->arena = na, c->arena_cap = cap;
    }
  }
  unsigned char *h = c->arena + c->arena_used;
  memcpy(h, src, bytes);
  c->arena_used += need;
  return cl_rc(clEnqueueWriteBuffer(c->q, dst, CL_FALSE, off, bytes, h, 0, NULL, NULL));
}

// Blocking read of device bytes into host memory.
static int download(struct ocl_ctx *c, void *dst, cl_mem src, size_t off, size_t bytes) {
  if (!bytes) return 0;
  c->bytes_down += (int64_t)bytes;
  c->waits++;
  cl_int e = clEnqueueReadBuffer(c->q, src, CL_TRUE, off, bytes, dst, 0, NULL, NULL);
  drained(c);
  return cl_rc(e);
}

// The backend buffer holding [p, p + bytes): 1 and *r, *off when p is in one, 0 for host
// memory, LL_EINVAL for a range that starts in a buffer and runs past its end.
static int resident(const struct ocl_ctx *c, const void *p, size_t bytes, const struct rbuf **r, size_t *off) {
  const char *q = p;
  for (int i = 0; i < c->n_rb; i++) {
    const struct rbuf *b = &c->rb[i];
    if (q < b->base || q >= b->base + b->n) continue;
    const size_t o = (size_t)(q - b->base);
    if (bytes > b->n - o) return LL_EINVAL;
    *r = b, *off = o;
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------- staging slots

// Grow slot's staging buffer to at least `bytes` (by doubling; contents not kept).
static int grow(struct ocl_ctx *c, int slot, size_t bytes) {
  struct sbuf *s = &c->s[slot];
  if (s->m && s->cap >= bytes) return 0;
  size_t cap = s->cap ? s->cap : 4096;
  while (cap < bytes) cap *= 2;
  if ((int64_t)cap > c->max_alloc && (int64_t)bytes <= c->max_alloc) cap = bytes;
  dev_release(c, s->m, s->cap);
  s->m = NULL, s->cap = 0;
  cl_int e;
  s->m = dev_alloc(c, cap, &e);
  if (!s->m) return cl_rc(e) ? cl_rc(e) : LL_ENOMEM;
  s->cap = cap;
  return 0;
}

static void unbind(struct sbuf *s) {
  if (s->sub) clReleaseMemObject(s->sub);
  s->sub = NULL, s->res = NULL, s->off = s->len = 0, s->copied = 0, s->use = s->m;
}

// Slot as scratch of at least `bytes` (its staging buffer).
static int stage(struct ocl_ctx *c, int slot, size_t bytes) {
  unbind(&c->s[slot]);
  int rc = grow(c, slot, bytes);
  c->s[slot].use = c->s[slot].m;
  return rc;
}

// Slot's staging buffer as the operand's copy (bytes), filled when load: by a device-side
// copy from backend buffer r at off, or (r NULL) by an upload from host memory at p.
static int stage_copy(struct ocl_ctx *c, int slot, const void *p, size_t bytes, const struct rbuf *r, size_t off, int load) {
  struct sbuf *s = &c->s[slot];
  const int rc = grow(c, slot, bytes);
  if (rc) return rc;
  s->use = s->m;
  if (!load) return 0;
  return r ? cl_rc(clEnqueueCopyBuffer(c->q, r->m, s->m, off, 0, bytes, 0, NULL, NULL)) : upload(c, s->m, 0, p, bytes);
}

// Slot for the operand at p (bytes): a backend buffer is used where it is (itself, or a
// sub-buffer at the offset; where the device cannot start one there, a device-side copy in
// the staging buffer); host memory gets the staging buffer, filled from p when load.
static int bind(struct ocl_ctx *c, int slot, const void *p, size_t bytes, int load) {
  struct sbuf *s = &c->s[slot];
  unbind(s);
  const struct rbuf *r = NULL;
  size_t off = 0;
  int in = bytes ? resident(c, p, bytes, &r, &off) : 0;
  if (in < 0) return in;
  if (in && off == 0) {
    s->res = r, s->len = bytes, s->use = r->m;
    return 0;
  }
  if (in && off % c->addr_align == 0) {
    for (int j = 0; j < S_COUNT; j++) // the same range in another slot: the same object
      if (c->s[j].res == r && c->s[j].off == off && c->s[j].len == bytes && c->s[j].sub && j != slot) {
        clRetainMemObject(c->s[j].sub);
        s->res = r, s->off = off, s->len = bytes, s->sub = s->use = c->s[j].sub;
        return 0;
      }
    cl_buffer_region reg = {off, bytes};
    cl_int e;
    cl_mem sub = clCreateSubBuffer(r->m, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e);
    if (sub) {
      s->res = r, s->off = off, s->len = bytes, s->sub = s->use = sub;
      return 0;
    }
  }
  const int rc = stage_copy(c, slot, p, bytes, in ? r : NULL, off, load);
  if (rc == 0 && in) s->res = r, s->off = off, s->len = bytes, s->copied = 1; // get() copies it back
  return rc;
}

// An input the op's kernels change (act_round rounds its x): always the slot's own copy, and
// not remembered as the range's (get() must not copy the changed bytes back).
static int put_copy(struct ocl_ctx *c, int slot, const void *src, size_t bytes) {
  unbind(&c->s[slot]);
  const struct rbuf *r = NULL;
  size_t off = 0;
  const int in = bytes ? resident(c, src, bytes, &r, &off) : 0;
  if (in < 0) return in;
  return stage_copy(c, slot, src, bytes, in ? r : NULL, off, 1);
}

// An input that repeats across calls (struct cconst): a backend buffer as put; host bytes from
// the constant cache, uploaded only when they changed; put's staging when the cache is full.
static int put_const(struct ocl_ctx *c, int slot, const void *src, size_t bytes) {
  const struct rbuf *r;
  size_t off;
  const int in = bytes ? resident(c, src, bytes, &r, &off) : 1;
  if (in < 0) return in;
  if (in || bytes > CONST_MAX_BYTES) return bind(c, slot, src, bytes, 1);
  struct cconst *k = NULL;
  for (int i = 0; i < c->n_cc && !k; i++)
    if (c->cc[i].host == src && c->cc[i].bytes == bytes) k = &c->cc[i];
  if (k && memcmp(k->copy, src, bytes) != 0) {
    memcpy(k->copy, src, bytes);
    int rc = upload(c, k->m, 0, src, bytes); // queued after the kernels that read the old bytes
    if (rc) return rc;
  }
  if (!k) {
    while (c->n_cc && (c->n_cc == N_CONST || c->cc_bytes + bytes > CONST_TOTAL_BYTES)) { // evict the least recently used
      int lru = 0;
      for (int i = 1; i < c->n_cc; i++) lru = c->cc[i].used < c->cc[lru].used ? i : lru;
      for (int j = 0; j < S_COUNT; j++) // a slot still naming it: unbound (its memory goes)
        if (c->s[j].use == c->cc[lru].m) unbind(&c->s[j]);
      dev_release(c, c->cc[lru].m, c->cc[lru].bytes);
      free(c->cc[lru].copy);
      c->cc_bytes -= c->cc[lru].bytes;
      c->cc[lru] = c->cc[--c->n_cc];
    }
    cl_int e;
    void *copy = malloc(bytes);
    cl_mem m = copy ? dev_alloc(c, bytes, &e) : NULL;
    if (!m) {
      free(copy);
      return bind(c, slot, src, bytes, 1);
    }
    memcpy(copy, src, bytes);
    int rc = upload(c, m, 0, src, bytes);
    if (rc) {
      dev_release(c, m, bytes);
      free(copy);
      return rc;
    }
    k = &c->cc[c->n_cc++];
    *k = (struct cconst){src, bytes, m, copy, 0};
    c->cc_bytes += bytes;
  }
  k->used = ++c->cc_tick;
  unbind(&c->s[slot]);
  c->s[slot].use = k->m;
  return 0;
}

// An input (or an in-out operand): its bytes are in the slot when the op's kernels run.
static int put(struct ocl_ctx *c, int slot, const void *src, size_t bytes) { return bind(c, slot, src, bytes, 1); }
// An output the kernels overwrite.
static int output(struct ocl_ctx *c, int slot, void *dst, size_t bytes) { return bind(c, slot, dst, bytes, 0); }

// The slot's result to dst: nothing to do where the kernels wrote dst in place; a queued
// device copy into a backend buffer; a blocking read into host memory.
static int get(struct ocl_ctx *c, int slot, void *dst, size_t bytes) {
  struct sbuf *s = &c->s[slot];
  if (!bytes) return 0;
  if (s->res && s->res->base + s->off == (char *)dst && !s->copied) return 0;
  const struct rbuf *r = NULL;
  size_t off = 0;
  int in = resident(c, dst, bytes, &r, &off);
  if (in < 0) return in;
  if (in) return cl_rc(clEnqueueCopyBuffer(c->q, s->use, r->m, 0, off, bytes, 0, NULL, NULL));
  return download(c, dst, s->use, 0, bytes);
}

static int launch(struct ocl_ctx *c, cl_kernel k, cl_uint dims, const size_t *global, const size_t *local) {
  for (cl_uint i = 0; i < dims; i++)
    if (global[i] == 0) return 0;
  c->launches++;
  return cl_rc(clEnqueueNDRangeKernel(c->q, k, dims, NULL, global, local, 0, NULL, NULL));
}

#define ARG(k, i, v) clSetKernelArg(k, i, sizeof(v), &(v))

// ---------------------------------------------------------------- weights

static int weight_upload_impl(struct ocl_ctx *c, const struct ll_weight *w, struct ocl_weight **out) {
  const size_t bytes = ll_row_size(w->type, w->k) * (size_t)w->n;
  if (!bytes) return LL_EINVAL;
  if (c->n_w == c->cap_w) {
    int cap = c->cap_w ? 2 * c->cap_w : 64;
    struct ocl_weight **nw = realloc(c->w, (size_t)cap * sizeof *nw);
    if (!nw) return LL_ENOMEM;
    c->w = nw, c->cap_w = cap;
  }
  struct ocl_weight *ow = calloc(1, sizeof *ow);
  if (!ow) return LL_ENOMEM;
  cl_int e;
  ow->m = dev_alloc(c, bytes, &e);
  if (!ow->m) {
    free(ow);
    return cl_rc(e) ? cl_rc(e) : LL_ENOMEM;
  }
  ow->bytes = bytes, ow->host = w->data, ow->refs = 1, ow->owner = c, ow->cx = c->cx;
  // Blocking: drivers that allocate on first use report an out-of-memory here, not later.
  e = clEnqueueWriteBuffer(c->q, ow->m, CL_TRUE, 0, bytes, w->data, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    dev_release(c, ow->m, bytes);
    free(ow);
    return cl_rc(e);
  }
  c->w[c->n_w++] = ow;
  *out = ow;
  return 0;
}

static int ocl_weight_upload(struct ll_backend *b, struct ll_weight *w) {
  struct ocl_ctx *c = CTX(b);
  if (w->dev) return 0;
  for (int i = 0; i < c->n_w; i++) // the same matrix under another name (tied embeddings)
    if (c->w[i]->host == w->data && c->w[i]->bytes == ll_row_size(w->type, w->k) * (size_t)w->n) {
      w->dev = c->w[i];
      c->w[i]->refs++;
      return 0;
    }
  struct ocl_weight *ow = NULL;
  int rc = weight_upload_impl(c, w, &ow);
  if (rc == 0) w->dev = ow;
  return rc;
}

static void ocl_weight_release(struct ll_backend *b, struct ll_weight *w) {
  struct ocl_ctx *c = CTX(b);
  struct ocl_weight *ow = w->dev;
  if (ow && ow->owner != c) return; // another instance's copy: its owner releases it
  w->dev = NULL;
  if (!ow || --ow->refs > 0) return;
  for (int i = 0; i < c->n_w; i++)
    if (c->w[i] == ow) {
      c->w[i] = c->w[--c->n_w];
      dev_release(c, ow->m, ow->bytes);
      free(ow);
      return;
    }
}

// The device copy of w: its resident copy (weight_upload, by this instance or one sharing
// its context: ll_backend_opencl_create_beside), or, for a weight never uploaded, a copy made
// for this call in a staging buffer (correct, but a transfer per call). A copy in another
// context is a buffer this queue must not use: staged like a weight never uploaded.
static int weight_dev_in(struct ocl_ctx *c, const struct ll_weight *w, int slot, cl_mem *out) {
  if (w->dev && ((const struct ocl_weight *)w->dev)->cx == c->cx) {
    *out = ((struct ocl_weight *)w->dev)->m;
    return 0;
  }
  const size_t bytes = ll_row_size(w->type, w->k) * (size_t)w->n;
  int rc = put(c, slot, w->data, bytes);
  if (rc == 0) *out = c->s[slot].use;
  return rc;
}
static int weight_dev(struct ocl_ctx *c, const struct ll_weight *w, cl_mem *out) { return weight_dev_in(c, w, S_W, out); }

// ---------------------------------------------------------------- forward ops

// ---------------------------------------------------------------- the fast tier (llsrv_fast.cl)
// Fused decode ops and products with f32 activations: what a GPU wants, checked against the CPU
// with tolerances (tests/test_opencl.c). The reference tier answers LL_EUNSUPPORTED here, and
// the engine composes the same step from the ops above.

#define FR 4 // as llsrv_fast.cl: output rows per work-group
#define FT 4 // tokens per work-group

static int ocl_fused_matmul(struct ll_backend *b, int n, float *const out[], const float *x, const float *g, float eps,
                            const struct ll_weight *const w[], int T, int op) {
  struct ocl_ctx *c = CTX(b);
  if (!c->fast) return LL_EUNSUPPORTED;
  if (n < 1 || n > 3 || T < 0 || op < LL_FUSE_SET || op > LL_FUSE_SWIGLU || (op == LL_FUSE_SWIGLU && n != 2)) return LL_EINVAL;
  if (T == 0) return 0;
  const int type = w[0]->type;
  const int64_t K = w[0]->k;
  for (int i = 0; i < n; i++) {
    if (w[i]->type != type || w[i]->k != K) return LL_EUNSUPPORTED; // one kernel, one type and row size
    if (w[i]->n <= 0 || w[i]->n > INT_MAX / 2) return LL_EINVAL;
  }
  if (type < 0 || type >= LL_TYPE_COUNT || !c->k_fmm[type] || K <= 0 || K % 32 || K > INT_MAX / 2) return LL_EUNSUPPORTED;
  if (op == LL_FUSE_SWIGLU && w[1]->n != w[0]->n) return LL_EINVAL;
  if ((int64_t)T * K > INT_MAX) return LL_ELIMIT;
  static const int wslot[3] = {S_W, S_D, S_E}, oslot[3] = {S_OUT, S_B, S_C};
  cl_mem wm[3] = {NULL, NULL, NULL}, om[3] = {NULL, NULL, NULL};
  int N[3] = {0, 0, 0};
  int rc;
  for (int i = 0; i < n; i++) {
    N[i] = (int)w[i]->n;
    if ((rc = weight_dev_in(c, w[i], wslot[i], &wm[i]))) return rc;
  }
  const size_t xb = (size_t)T * (size_t)K * sizeof(float);
  if ((rc = put(c, S_X, x, xb))) return rc;
  if (g && (rc = put_const(c, S_A, g, (size_t)K * sizeof(float)))) return rc;
  const int nout = op == LL_FUSE_SWIGLU ? 1 : n;
  for (int i = 0; i < nout; i++) {
    const size_t ob = (size_t)T * N[i] * sizeof(float);
    if ((rc = op == LL_FUSE_ADD ? put(c, oslot[i], out[i], ob) : output(c, oslot[i], out[i], ob))) return rc;
    om[i] = c->s[oslot[i]].use;
  }
  cl_mem gm = g ? c->s[S_A].use : NULL;
  const cl_ulong rb = ll_row_size(type, K);
  const int Ki = (int)K, norm = g != NULL;
  cl_kernel k = c->k_fmm[type];
  cl_int e = ARG(k, 0, wm[0]) | ARG(k, 1, wm[1]) | ARG(k, 2, wm[2]) | ARG(k, 3, rb) | ARG(k, 4, c->s[S_X].use) | ARG(k, 5, gm);
  e |= ARG(k, 6, eps) | ARG(k, 7, norm) | ARG(k, 8, om[0]) | ARG(k, 9, om[1]) | ARG(k, 10, om[2]) | ARG(k, 11, Ki);
  e |= ARG(k, 12, N[0]) | ARG(k, 13, N[1]) | ARG(k, 14, N[2]) | ARG(k, 15, T) | ARG(k, 16, op);
  size_t blocks = 0;
  if (op == LL_FUSE_SWIGLU) blocks = ((size_t)N[0] + FR / 2 - 1) / (FR / 2);
  else
    for (int i = 0; i < n; i++) blocks += ((size_t)N[i] + FR - 1) / FR;
  const size_t gl[2] = {WG * blocks, ((size_t)T + FT - 1) / FT}, lo[2] = {WG, 1};
  if (e || (rc = launch(c, k, 2, gl, lo))) return e ? LL_EIO : rc;
  for (int i = 0; i < nout; i++)
    if ((rc = get(c, oslot[i], out[i], (size_t)T * N[i] * sizeof(float)))) return rc;
  return 0;
}

static int act_type_mode(int wtype) { // activation quantization of llsrv.cl's act_quant
  switch (wtype) {
  case LL_TYPE_Q4_0: case LL_TYPE_Q5_0: case LL_TYPE_Q8_0: return 0;
  case LL_TYPE_Q4_1: case LL_TYPE_Q5_1: return 1;
  case LL_TYPE_Q4_K: case LL_TYPE_Q5_K: case LL_TYPE_Q6_K: return 2;
  default: return -1;
  }
}

static int ocl_matmul(struct ll_backend *b, float *out, const float *x, const struct ll_weight *w, int T, int accumulate) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return T < 0 ? LL_EINVAL : 0;
  if (c->fast && w->type >= 0 && w->type < LL_TYPE_COUNT && c->k_fmm[w->type] && w->k % 32 == 0) { // the fast tier's product
    float *const o[1] = {out};
    const struct ll_weight *const ws[1] = {w};
    return ocl_fused_matmul(b, 1, o, x, NULL, 0.0f, ws, T, accumulate ? LL_FUSE_ADD : LL_FUSE_SET);
  }
  const int K = (int)w->k, N = (int)w->n;
  const int fl = w->type == LL_TYPE_F32 ? 0 : w->type == LL_TYPE_F16 ? 1 : w->type == LL_TYPE_BF16 ? 2 : -1;
  const int mode = act_type_mode(w->type);
  if (fl < 0 && (mode < 0 || !c->k_mm[w->type])) return LL_EUNSUPPORTED;
  if (K % 32 && fl < 0) return LL_EINVAL;
  cl_mem wm;
  int rc = weight_dev(c, w, &wm);
  if (rc) return rc;
  const size_t xb = (size_t)T * K * sizeof(float), ob = (size_t)T * N * sizeof(float);
  cl_ulong rb = ll_row_size(w->type, w->k);
  if ((rc = fl > 0 ? put_copy(c, S_X, x, xb) : put(c, S_X, x, xb))) return rc; // act_round changes it
  if (accumulate) rc = put(c, S_OUT, out, ob);
  else rc = output(c, S_OUT, out, ob);
  if (rc) return rc;
  cl_int e = 0;
  const size_t gl[3] = {WG, (size_t)N, (size_t)(T + TT - 1) / TT}, lo[3] = {WG, 1, 1};
  if (fl < 0) {
    if ((rc = stage(c, S_XQ, (size_t)T * K)) || (rc = stage(c, S_XS, (size_t)T * (K / 32) * 2 * sizeof(float)))) return rc;
    const size_t per = mode == 2 ? 256 : 32;
    if (K % (int)per) return LL_EINVAL;
    const size_t gq = (size_t)T * (K / per);
    cl_kernel k = c->k_quant;
    e |= ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_XQ].use) | ARG(k, 2, c->s[S_XS].use) | ARG(k, 3, K) | ARG(k, 4, T) | ARG(k, 5, mode);
    if (e || (rc = launch(c, k, 1, &gq, NULL))) return e ? LL_EIO : rc;
    k = c->k_mm[w->type];
    e |= ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_XQ].use) | ARG(k, 3, c->s[S_XS].use) | ARG(k, 4, c->s[S_OUT].use);
    e |= ARG(k, 5, K) | ARG(k, 6, N) | ARG(k, 7, T) | ARG(k, 8, accumulate);
    if (e || (rc = launch(c, k, 3, gl, lo))) return e ? LL_EIO : rc;
  } else {
    if (fl > 0) { // round activations as the CPU converts them to f16 / bf16
      cl_kernel k = c->k_round;
      const int n = T * K;
      const size_t g = (size_t)n;
      e |= ARG(k, 0, c->s[S_X].use) | ARG(k, 1, n) | ARG(k, 2, fl);
      if (e || (rc = launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
    }
    cl_kernel k = c->k_mm_f;
    e |= ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_X].use) | ARG(k, 3, c->s[S_OUT].use) | ARG(k, 4, K) | ARG(k, 5, N);
    e |= ARG(k, 6, T) | ARG(k, 7, accumulate) | ARG(k, 8, fl);
    if (e || (rc = launch(c, k, 3, gl, lo))) return e ? LL_EIO : rc;
  }
  return get(c, S_OUT, out, ob);
}

static int ocl_get_rows(struct ll_backend *b, float *out, const struct ll_weight *w, const int32_t *ids, int T) {
  struct ocl_ctx *c = CTX(b);
  for (int t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= w->n) return LL_EINVAL;
  if (T <= 0) return 0;
  cl_mem wm;
  int rc = weight_dev(c, w, &wm);
  if (rc) return rc;
  const int K = (int)w->k;
  const int fl = w->type == LL_TYPE_F32 ? 0 : w->type == LL_TYPE_F16 ? 1 : w->type == LL_TYPE_BF16 ? 2 : -1;
  if (fl < 0 && (act_type_mode(w->type) < 0 || K % 32)) return LL_EUNSUPPORTED;
  const size_t ob = (size_t)T * K * sizeof(float);
  if ((rc = put(c, S_POS, ids, (size_t)T * sizeof *ids)) || (rc = output(c, S_OUT, out, ob))) return rc;
  cl_ulong rb = ll_row_size(w->type, w->k);
  cl_kernel k = fl < 0 ? c->k_gr_q : c->k_gr_f;
  const int wt = fl < 0 ? w->type : fl;
  cl_int e = ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_POS].use) | ARG(k, 3, c->s[S_OUT].use) | ARG(k, 4, K) | ARG(k, 5, T);
  e |= ARG(k, 6, wt);
  const size_t g = fl < 0 ? (size_t)T * (K / 32) : (size_t)T * K;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return get(c, S_OUT, out, ob);
}

static int ocl_rmsnorm(struct ll_backend *b, float *out, const float *x, const float *g, int T, int C, float eps) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return 0;
  const size_t xb = (size_t)T * C * sizeof(float);
  int rc;
  if ((rc = put(c, S_X, x, xb)) || (rc = put_const(c, S_A, g, (size_t)C * sizeof(float))) || (rc = output(c, S_OUT, out, xb))) return rc;
  cl_kernel k = c->k_rmsnorm;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_X].use) | ARG(k, 2, c->s[S_A].use) | ARG(k, 3, C) | ARG(k, 4, eps);
  const size_t gl = (size_t)T * WG, lo = WG;
  if (e || (rc = launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return get(c, S_OUT, out, xb);
}

// cos/sin tables (T, np) of positions pos, on the host exactly as the CPU backend computes them
// (libm; ll_rope_angles), so the device rotates by the same angles (rope and rope_backward).
static int rope_tables(struct ocl_ctx *c, const int32_t *pos, int T, const struct ll_rope_params *p, float **ct, float **st) {
  const int np = p->n_rot / 2;
  const size_t need = 2 * (size_t)T * np;
  if (need > c->rope_cap) {
    float *nt = realloc(c->rope_cs, need * sizeof *nt);
    if (!nt) return LL_ENOMEM;
    c->rope_cs = nt, c->rope_cap = need;
  }
  const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
  *ct = c->rope_cs, *st = c->rope_cs + (size_t)T * np;
  for (int t = 0; t < T; t++) {
    float theta = (float)pos[t];
    for (int i = 0; i < np; i++) {
      const float ff = p->freq_factors ? p->freq_factors[i] : 1.0f;
      const float th = p->freq_scale * (theta / ff);
      (*ct)[(size_t)t * np + i] = cosf(th);
      (*st)[(size_t)t * np + i] = sinf(th);
      theta *= theta_scale;
    }
  }
  return 0;
}

static int ocl_rope(struct ll_backend *b, float *x, const int32_t *pos, int T, int n_head, int head_dim, const struct ll_rope_params *p) {
  struct ocl_ctx *c = CTX(b);
  if (p->n_rot > head_dim || p->n_rot % 2 || p->n_rot < 0 || T < 0) return LL_EINVAL;
  const int np = p->n_rot / 2;
  if (T == 0 || np == 0) return 0;
  float *ct, *st;
  int rc0 = rope_tables(c, pos, T, p, &ct, &st);
  if (rc0) return rc0;
  const size_t xb = (size_t)T * n_head * head_dim * sizeof(float), tb = (size_t)T * np * sizeof(float);
  int rc;
  if ((rc = put(c, S_X, x, xb)) || (rc = put_const(c, S_A, ct, tb)) || (rc = put_const(c, S_B, st, tb))) return rc;
  cl_kernel k = c->k_rope;
  const int neox = p->mode == LL_ROPE_NEOX, fused = b->ggml_math;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, T) | ARG(k, 4, n_head);
  e |= ARG(k, 5, head_dim) | ARG(k, 6, np) | ARG(k, 7, neox) | ARG(k, 8, fused);
  const size_t g = (size_t)T * n_head * np;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return get(c, S_X, x, xb);
}

static int ocl_swiglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (n <= 0) return 0;
  const size_t nb = (size_t)n * sizeof(float);
  int rc;
  if ((rc = put(c, S_A, gate, nb)) || (rc = put(c, S_B, up, nb)) || (rc = output(c, S_OUT, out, nb))) return rc;
  cl_kernel k = c->k_swiglu;
  cl_long ln = n;
  const int ggml = b->ggml_math;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, ln) | ARG(k, 4, ggml);
  const size_t g = (size_t)n;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return get(c, S_OUT, out, nb);
}

static int ocl_add(struct ll_backend *b, float *out, const float *a, const float *x, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (n <= 0) return 0;
  const size_t nb = (size_t)n * sizeof(float);
  int rc;
  if ((rc = put(c, S_A, a, nb)) || (rc = put(c, S_B, x, nb)) || (rc = output(c, S_OUT, out, nb))) return rc;
  cl_kernel k = c->k_add;
  cl_long ln = n;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, ln);
  const size_t g = (size_t)n;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return e ? LL_EIO : rc;
  return get(c, S_OUT, out, nb);
}

// ---------------------------------------------------------------- KV cache

// The device pool named by host pointer `host`, at least `bytes` long (grown keeping contents).
static int kv_pool(struct ocl_ctx *c, const void *host, size_t bytes, cl_mem *out) {
  struct kvpool *p = NULL;
  for (int i = 0; i < c->n_kv; i++)
    if (c->kv[i].host == host) p = &c->kv[i];
  if (!p) {
    if (c->n_kv == c->cap_kv) {
      int cap = c->cap_kv ? 2 * c->cap_kv : 64;
      struct kvpool *nk = realloc(c->kv, (size_t)cap * sizeof *nk);
      if (!nk) return LL_ENOMEM;
      c->kv = nk, c->cap_kv = cap;
    }
    p = &c->kv[c->n_kv++];
    *p = (struct kvpool){host, NULL, 0};
  }
  if (p->cap < bytes) {
    size_t cap = p->cap ? p->cap : 1 << 16;
    while (cap < bytes) cap *= 2;
    cl_int e;
    cl_mem m = dev_alloc(c, cap, &e);
    if (!m) return cl_rc(e) ? cl_rc(e) : LL_ENOMEM;
    if (p->m) {
      e = clEnqueueCopyBuffer(c->q, p->m, m, 0, 0, p->cap, 0, NULL, NULL);
      if (e == CL_SUCCESS) e = clFinish(c->q), drained(c);
      if (e != CL_SUCCESS) {
        dev_release(c, m, cap);
        return cl_rc(e);
      }
      dev_release(c, p->m, p->cap);
    }
    p->m = m, p->cap = cap;
  }
  *out = p->m;
  return 0;
}

static size_t kv_elem(const struct ll_kv_view *kv) { return kv->kv_type == LL_TYPE_F16 ? 2 : 4; }
static size_t kv_block_bytes(const struct ll_kv_view *kv) { return (size_t)kv->block * kv->n_head_kv * kv->head_dim * kv_elem(kv); }

static int ocl_kv_store(struct ll_backend *b, const struct ll_kv_view *kv, const float *k, const float *v, const int32_t *pos, int T) {
  struct ocl_ctx *c = CTX(b);
  if (T <= 0) return 0;
  if (kv->kv_type != LL_TYPE_F16 && kv->kv_type != LL_TYPE_F32) return LL_EUNSUPPORTED;
  int max_pos = 0, max_blk = 0;
  for (int t = 0; t < T; t++) max_pos = pos[t] > max_pos ? pos[t] : max_pos;
  const int nb = max_pos / kv->block + 1;
  for (int i = 0; i < nb; i++) max_blk = kv->block_table[i] > max_blk ? kv->block_table[i] : max_blk;
  cl_mem K, V;
  const size_t need = ((size_t)max_blk + 1) * kv_block_bytes(kv);
  int rc;
  if ((rc = kv_pool(c, kv->k, need, &K)) || (rc = kv_pool(c, kv->v, need, &V))) return rc;
  const int n = kv->n_head_kv * kv->head_dim;
  const size_t xb = (size_t)T * n * sizeof(float);
  if ((rc = put(c, S_A, k, xb)) || (rc = put(c, S_B, v, xb)) || (rc = put(c, S_POS, pos, (size_t)T * 4)) ||
      (rc = put(c, S_TAB, kv->block_table, (size_t)nb * 4)))
    return rc;
  cl_kernel kk = c->k_kv_store;
  const int f16 = kv->kv_type == LL_TYPE_F16;
  cl_int e = ARG(kk, 0, K) | ARG(kk, 1, V) | ARG(kk, 2, c->s[S_A].use) | ARG(kk, 3, c->s[S_B].use) | ARG(kk, 4, c->s[S_POS].use);
  e |= ARG(kk, 5, c->s[S_TAB].use) | ARG(kk, 6, T) | ARG(kk, 7, kv->block) | ARG(kk, 8, kv->n_head_kv) | ARG(kk, 9, kv->head_dim) | ARG(kk, 10, f16);
  const size_t g = (size_t)T * n;
  if (e || (rc = launch(c, kk, 1, &g, NULL))) return e ? LL_EIO : rc;
  return 0; // host k, v were copied (upload): they may change once we return
}

// The index arrays of n_seq sequences' rows (attention_multi's arguments), checked: one pool for
// all (the same layer) and the rows in sequence order. *idx (malloc'd, the caller frees): the
// concatenated block tables (n_tab), each row's sequence (rows), each table's offset (n_seq),
// each sequence's row count (n_seq).
static int seq_tables(const struct ll_kv_view *kv, const int32_t *pos, const int *t0, const int *nt, int n_seq, int32_t **idx, int *rows_out,
                      int *n_tab_out, int *max_pos_out, int *max_blk_out) {
  const struct ll_kv_view *k0 = &kv[0];
  int rows = 0, max_pos = 0, max_blk = 0, n_tab = 0;
  *idx = NULL;
  for (int i = 0; i < n_seq; i++) {
    if (kv[i].k != k0->k || kv[i].v != k0->v || kv[i].head_dim != k0->head_dim || kv[i].n_head_kv != k0->n_head_kv ||
        kv[i].kv_type != k0->kv_type || kv[i].block != k0->block || kv[i].block <= 0 || t0[i] != rows || nt[i] < 0)
      return LL_EINVAL;
    rows += nt[i];
    int mp = 0;
    for (int t = t0[i]; t < t0[i] + nt[i]; t++) {
      if (pos[t] < 0) return LL_EINVAL;
      mp = pos[t] > mp ? pos[t] : mp;
    }
    max_pos = mp > max_pos ? mp : max_pos;
    n_tab += mp / k0->block + 1;
  }
  *rows_out = rows, *n_tab_out = n_tab, *max_pos_out = max_pos, *max_blk_out = 0;
  if (rows == 0) return 0;
  int32_t *tab = malloc(((size_t)n_tab + rows + 2 * (size_t)n_seq) * sizeof *tab);
  if (!tab) return LL_ENOMEM;
  int32_t *seq_of = tab + n_tab, *toff = seq_of + rows, *snt = toff + n_seq;
  for (int i = 0; i < n_seq; i++) snt[i] = nt[i];
  for (int i = 0, o = 0; i < n_seq; i++) {
    int mp = 0;
    for (int t = t0[i]; t < t0[i] + nt[i]; t++) mp = pos[t] > mp ? pos[t] : mp, seq_of[t] = i;
    toff[i] = o;
    for (int j = 0; j <= mp / k0->block; j++, o++) {
      tab[o] = kv[i].block_table[j];
      if (tab[o] < 0) {
        free(tab);
        return LL_EINVAL;
      }
      max_blk = tab[o] > max_blk ? tab[o] : max_blk;
    }
  }
  *idx = tab, *max_blk_out = max_blk;
  return 0;
}

static int ocl_attention_multi(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos,
                               const int *t0, const int *nt, int n_seq, int n_head, float scale) {
  struct ocl_ctx *c = CTX(b);
  if (n_seq < 1) return 0;
  const struct ll_kv_view *k0 = &kv[0];
  const int hd = k0->head_dim, Hkv = k0->n_head_kv;
  if (hd > 256 || Hkv <= 0 || n_head % Hkv) return LL_EUNSUPPORTED;
  int rows, n_tab, max_pos, max_blk;
  int32_t *tab;
  int rc = seq_tables(kv, pos, t0, nt, n_seq, &tab, &rows, &n_tab, &max_pos, &max_blk);
  if (rc || rows == 0) return rc;
  int32_t *seq_of = tab + n_tab, *toff = seq_of + rows, *snt = toff + n_seq;
  cl_mem K, V;
  const size_t need = ((size_t)max_blk + 1) * kv_block_bytes(k0);
  const size_t qb = (size_t)rows * n_head * hd * sizeof(float);
  const int stride = max_pos + 1;
  if ((rc = kv_pool(c, k0->k, need, &K)) || (rc = kv_pool(c, k0->v, need, &V)) || (rc = put(c, S_X, q, qb)) ||
      (rc = put(c, S_POS, pos, (size_t)rows * 4)) || (rc = put(c, S_TAB, tab, (size_t)n_tab * 4)) ||
      (rc = put(c, S_SEQ, seq_of, (size_t)rows * 4)) || (rc = put(c, S_TOFF, toff, (size_t)n_seq * 4)) || (rc = put(c, S_SNT, snt, (size_t)n_seq * 4)) ||
      (rc = stage(c, S_SCR, (size_t)rows * n_head * stride * sizeof(float))) || (rc = output(c, S_OUT, out, qb))) {
    free(tab);
    return rc;
  }
  free(tab); // the uploads copied it
  cl_kernel k = c->k_attention;
  const int f16 = k0->kv_type == LL_TYPE_F16, ggml = b->ggml_math;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_X].use) | ARG(k, 2, K) | ARG(k, 3, V) | ARG(k, 4, c->s[S_POS].use);
  e |= ARG(k, 5, c->s[S_TAB].use) | ARG(k, 6, c->s[S_SEQ].use) | ARG(k, 7, c->s[S_TOFF].use) | ARG(k, 8, c->s[S_SNT].use);
  e |= ARG(k, 9, c->s[S_SCR].use) | ARG(k, 10, n_head) | ARG(k, 11, Hkv) | ARG(k, 12, hd) | ARG(k, 13, k0->block) | ARG(k, 14, f16);
  e |= ARG(k, 15, scale) | ARG(k, 16, stride) | ARG(k, 17, ggml);
  const size_t gl = (size_t)rows * n_head * WG, lo = WG;
  if (e || (rc = launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return get(c, S_OUT, out, qb);
}

// The fast tier: rope of q and k and the kv_store of k, v in one kernel (llsrv_fast.cl rope_kv).
static int ocl_rope_kv_store(struct ll_backend *b, float *q, const float *k, const float *v, const struct ll_kv_view *kv, const int32_t *pos,
                             const int *t0, const int *nt, int n_seq, int n_head, const struct ll_rope_params *p) {
  struct ocl_ctx *c = CTX(b);
  if (!c->fast) return LL_EUNSUPPORTED;
  if (n_seq < 1) return 0;
  const struct ll_kv_view *k0 = &kv[0];
  const int hd = k0->head_dim, Hkv = k0->n_head_kv;
  if (hd <= 0 || Hkv <= 0 || n_head <= 0 || p->n_rot > hd || p->n_rot % 2 || p->n_rot < 0) return LL_EINVAL;
  if (k0->kv_type != LL_TYPE_F16 && k0->kv_type != LL_TYPE_F32) return LL_EUNSUPPORTED;
  const int np = p->n_rot / 2;
  if (np == 0) return LL_EUNSUPPORTED; // nothing to rotate: the unfused ops
  int rows, n_tab, max_pos, max_blk;
  int32_t *tab;
  int rc = seq_tables(kv, pos, t0, nt, n_seq, &tab, &rows, &n_tab, &max_pos, &max_blk);
  if (rc || rows == 0) return rc;
  int32_t *seq_of = tab + n_tab, *toff = seq_of + rows;
  float *ct, *st;
  cl_mem K, V;
  const size_t need = ((size_t)max_blk + 1) * kv_block_bytes(k0);
  const size_t qb = (size_t)rows * n_head * hd * sizeof(float), kb = (size_t)rows * Hkv * hd * sizeof(float), tb = (size_t)rows * np * sizeof(float);
  if ((rc = rope_tables(c, pos, rows, p, &ct, &st)) || (rc = kv_pool(c, k0->k, need, &K)) || (rc = kv_pool(c, k0->v, need, &V)) ||
      (rc = put(c, S_X, q, qb)) || (rc = put(c, S_A, k, kb)) || (rc = put(c, S_B, v, kb)) || (rc = put_const(c, S_C, ct, tb)) ||
      (rc = put_const(c, S_D, st, tb)) || (rc = put(c, S_POS, pos, (size_t)rows * 4)) || (rc = put(c, S_TAB, tab, (size_t)n_tab * 4)) ||
      (rc = put(c, S_SEQ, seq_of, (size_t)rows * 4)) || (rc = put(c, S_TOFF, toff, (size_t)n_seq * 4))) {
    free(tab);
    return rc;
  }
  free(tab);
  cl_kernel kk = c->k_rope_kv;
  const int neox = p->mode == LL_ROPE_NEOX, fused = b->ggml_math, f16 = k0->kv_type == LL_TYPE_F16, block = k0->block;
  cl_int e = ARG(kk, 0, c->s[S_X].use) | ARG(kk, 1, c->s[S_A].use) | ARG(kk, 2, c->s[S_B].use) | ARG(kk, 3, K) | ARG(kk, 4, V);
  e |= ARG(kk, 5, c->s[S_C].use) | ARG(kk, 6, c->s[S_D].use) | ARG(kk, 7, c->s[S_POS].use) | ARG(kk, 8, c->s[S_TAB].use);
  e |= ARG(kk, 9, c->s[S_SEQ].use) | ARG(kk, 10, c->s[S_TOFF].use) | ARG(kk, 11, rows) | ARG(kk, 12, n_head) | ARG(kk, 13, Hkv);
  e |= ARG(kk, 14, hd) | ARG(kk, 15, np) | ARG(kk, 16, neox) | ARG(kk, 17, fused) | ARG(kk, 18, block) | ARG(kk, 19, f16);
  const size_t g = (size_t)rows * (size_t)(n_head + Hkv) * (size_t)((hd + 1) / 2);
  if (e || (rc = launch(c, kk, 1, &g, NULL))) return e ? LL_EIO : rc;
  return get(c, S_X, q, qb);
}

// Greedy sampling where the logits are (both tiers: a comparison, no sums): rows x 4 bytes back.
static int ocl_argmax(struct ll_backend *b, int32_t *ids, const float *logits, int rows, int V) {
  struct ocl_ctx *c = CTX(b);
  if (rows < 0 || V <= 0) return LL_EINVAL;
  if (rows == 0) return 0;
  const size_t lb = (size_t)rows * (size_t)V * sizeof(float), ib = (size_t)rows * sizeof(int32_t);
  int rc;
  if ((rc = put(c, S_X, logits, lb)) || (rc = output(c, S_OUT, ids, ib))) return rc;
  cl_kernel k = c->k_argmax;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_OUT].use) | ARG(k, 2, V);
  const size_t gl = (size_t)rows * WG, lo = WG;
  if (e || (rc = launch(c, k, 1, &gl, &lo))) return e ? LL_EIO : rc;
  return get(c, S_OUT, ids, ib);
}

static int ocl_attention(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos, int T, int n_head,
                         float scale) {
  const int t0 = 0;
  return ocl_attention_multi(b, out, q, kv, pos, &t0, &T, 1, n_head, scale);
}

// ---------------------------------------------------------------- training ops (train.cl)
// As the forward ops: backend buffers are computed on in place; host operands are uploaded
// into staging buffers and host results read back (blocking). Accumulating outputs (dx, dw,
// dg, ...) are in-out operands (put).

// An op's error return: uploads enqueued before the failure still read the caller's memory
// (they are non-blocking), so wait for them before the caller may reuse or free it.
static int fail(struct ocl_ctx *c, int rc) {
  finish(c);
  return rc;
}

// a * b floats in bytes, checked in int64 before any size_t use: negative counts are
// LL_EINVAL, more than one device allocation LL_ENOMEM.
static int fbytes(const struct ocl_ctx *c, int64_t a, int64_t b, size_t *out) {
  if (a < 0 || b < 0) return LL_EINVAL;
  if (a && b > INT64_MAX / 4 / a) return LL_ENOMEM;
  const int64_t n = a * b * 4;
  if (n > c->max_alloc) return LL_ENOMEM;
  *out = (size_t)n;
  return 0;
}

static int float_type(int type) { return type == LL_TYPE_F32 ? 0 : type == LL_TYPE_F16 ? 1 : type == LL_TYPE_BF16 ? 2 : -1; }

// Rows of W dequantized per chunk of dx's product (f32 scratch of at most this many bytes).
#define DEQ_CHUNK_BYTES ((size_t)8 << 20)

static int ocl_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x, const struct ll_weight *w,
                               int T) {
  struct ocl_ctx *c = CTX(b);
  if (!w || !dout || T < 0 || w->k <= 0 || w->n <= 0 || w->k > INT_MAX || w->n > INT_MAX) return LL_EINVAL;
  if (dw && (w->type != LL_TYPE_F32 || !x)) return LL_EINVAL;
  const int K = (int)w->k, N = (int)w->n, fl = float_type(w->type);
  if (fl < 0 && (act_type_mode(w->type) < 0 || K % 32)) return LL_EUNSUPPORTED;
  if (T == 0 || (!dx && !dw)) return 0;
  size_t ob, xb, wb = 0;
  int rc;
  // wb (dw's bytes) only when dw is asked for: a quantized W's f32 size may exceed one buffer.
  if ((rc = fbytes(c, T, N, &ob)) || (rc = fbytes(c, T, K, &xb)) || (dw && (rc = fbytes(c, N, K, &wb)))) return fail(c, rc);
  if ((rc = put(c, S_B, dout, ob))) return fail(c, rc); // (T, N)
  cl_int e = 0;
  if (dx) {
    cl_mem wm;
    if ((rc = weight_dev(c, w, &wm)) || (rc = put(c, S_A, dx, xb))) return fail(c, rc); // dx (T, K) accumulates
    cl_ulong rb = ll_row_size(w->type, w->k);
    // F32 rows are read in place (one chunk of all N); other types are dequantized nc rows at a
    // time into S_SCR, each chunk's product continuing the sums in dx (the reference's n order).
    int nc = N;
    if (fl != 0) {
      const size_t per = DEQ_CHUNK_BYTES / ((size_t)K * 4);
      nc = per < 1 ? 1 : per < (size_t)N ? (int)per : N;
      if ((rc = stage(c, S_SCR, (size_t)nc * K * 4))) return fail(c, rc);
    }
    const int wt = w->type;
    for (int n0 = 0; n0 < N; n0 += nc) {
      const int cnt = N - n0 < nc ? N - n0 : nc;
      cl_mem wf = wm;
      if (fl != 0) {
        cl_kernel k = c->k_deq;
        e |= ARG(k, 0, wm) | ARG(k, 1, rb) | ARG(k, 2, c->s[S_SCR].use) | ARG(k, 3, K) | ARG(k, 4, n0) | ARG(k, 5, cnt) | ARG(k, 6, wt) | ARG(k, 7, fl);
        const size_t g = fl > 0 ? (size_t)cnt * K : (size_t)cnt * (K / 32);
        if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
        wf = c->s[S_SCR].use;
      }
      cl_kernel k = c->k_mm_dx;
      e |= ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, wf) | ARG(k, 3, T) | ARG(k, 4, N) | ARG(k, 5, K) | ARG(k, 6, n0);
      e |= ARG(k, 7, cnt);
      const size_t gl[2] = {(size_t)K, (size_t)T};
      if (e || (rc = launch(c, k, 2, gl, NULL))) return fail(c, e ? LL_EIO : rc);
    }
  }
  if (dw) {
    if ((rc = put(c, S_X, x, xb)) || (rc = put(c, S_C, dw, wb))) return fail(c, rc); // x (T, K), dw (N, K) accumulates
    cl_kernel k = c->k_mm_dw;
    e |= ARG(k, 0, c->s[S_C].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, c->s[S_X].use) | ARG(k, 3, T) | ARG(k, 4, N) | ARG(k, 5, K);
    const size_t gl[2] = {(size_t)K, (size_t)N};
    if (e || (rc = launch(c, k, 2, gl, NULL))) return fail(c, e ? LL_EIO : rc);
  }
  if (dx && (rc = get(c, S_A, dx, xb))) return fail(c, rc);
  if (dw && (rc = get(c, S_C, dw, wb))) return fail(c, rc);
  return 0;
}

static int ocl_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g, int T, int C,
                                float eps) {
  struct ocl_ctx *c = CTX(b);
  if (!dout || !x || !g || T < 0 || C <= 0) return LL_EINVAL;
  if (T == 0 || (!dx && !dg)) return 0;
  size_t xb, gb, sb;
  int rc;
  if ((rc = fbytes(c, T, C, &xb)) || (rc = fbytes(c, C, 1, &gb)) || (rc = fbytes(c, T, 1, &sb))) return fail(c, rc);
  if ((rc = put(c, S_X, x, xb)) || (rc = put(c, S_B, dout, xb)) || (rc = put_const(c, S_C, g, gb)) || (rc = stage(c, S_D, sb))) return fail(c, rc);
  if (dx && (rc = put(c, S_A, dx, xb))) return fail(c, rc);                                 // (T, C) accumulates
  if (!dx && (rc = stage(c, S_A, 16))) return fail(c, rc);                                  // unused argument
  const int want_dx = dx != NULL;
  cl_kernel k = c->k_rms_bwd;
  cl_int e = ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_D].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, c->s[S_X].use) | ARG(k, 4, c->s[S_C].use);
  e |= ARG(k, 5, C) | ARG(k, 6, eps) | ARG(k, 7, want_dx);
  const size_t gl = (size_t)T * WG, lo = WG;
  if (e || (rc = launch(c, k, 1, &gl, &lo))) return fail(c, e ? LL_EIO : rc);
  if (dg) { // (C) accumulates; needs every row's s_t (S_D) from the kernel above
    if ((rc = put(c, S_E, dg, gb))) return fail(c, rc);
    k = c->k_rms_dg;
    e = ARG(k, 0, c->s[S_E].use) | ARG(k, 1, c->s[S_D].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, c->s[S_X].use) | ARG(k, 4, T) | ARG(k, 5, C);
    const size_t g1 = (size_t)C;
    if (e || (rc = launch(c, k, 1, &g1, NULL))) return fail(c, e ? LL_EIO : rc);
  }
  if (dx && (rc = get(c, S_A, dx, xb))) return fail(c, rc);
  if (dg && (rc = get(c, S_E, dg, gb))) return fail(c, rc);
  return 0;
}

static int ocl_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim,
                             const struct ll_rope_params *p) {
  struct ocl_ctx *c = CTX(b);
  if (!dx || !pos || !p || T < 0 || n_head <= 0 || p->n_rot < 0 || p->n_rot % 2 || p->n_rot > head_dim) return LL_EINVAL;
  const int np = p->n_rot / 2;
  if (T == 0 || np == 0) return 0;
  size_t xb, tb;
  int rc;
  if ((rc = fbytes(c, (int64_t)T * n_head, head_dim, &xb)) || (rc = fbytes(c, T, np, &tb))) return fail(c, rc);
  float *ct, *st;
  if ((rc = rope_tables(c, pos, T, p, &ct, &st))) return fail(c, rc);
  if ((rc = put(c, S_X, dx, xb)) || (rc = put_const(c, S_A, ct, tb)) || (rc = put_const(c, S_B, st, tb))) return fail(c, rc);
  cl_kernel k = c->k_rope_bwd;
  const int neox = p->mode == LL_ROPE_NEOX;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, T) | ARG(k, 4, n_head);
  e |= ARG(k, 5, head_dim) | ARG(k, 6, np) | ARG(k, 7, neox);
  const size_t g = (size_t)T * n_head * np;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
  return get(c, S_X, dx, xb);
}

static int ocl_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                               int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!dgate || !dup || !dout || !gate || !up || n < 0) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = fbytes(c, n, 1, &nb))) return fail(c, rc);
  // Outputs in their own buffers: dgate / dup may alias the inputs (element-wise).
  if ((rc = put(c, S_A, gate, nb)) || (rc = put(c, S_B, up, nb)) || (rc = put(c, S_C, dout, nb)) || (rc = output(c, S_D, dgate, nb)) ||
      (rc = output(c, S_E, dup, nb)))
    return fail(c, rc);
  cl_kernel k = c->k_swiglu_bwd;
  cl_long ln = n;
  cl_int e = ARG(k, 0, c->s[S_D].use) | ARG(k, 1, c->s[S_E].use) | ARG(k, 2, c->s[S_C].use) | ARG(k, 3, c->s[S_A].use) | ARG(k, 4, c->s[S_B].use);
  e |= ARG(k, 5, ln);
  const size_t g = (size_t)n;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
  if ((rc = get(c, S_D, dgate, nb))) return fail(c, rc);
  return get(c, S_E, dup, nb);
}

static int attn_check(int S, int H, int Hkv, int hd) { return S < 0 || H <= 0 || Hkv <= 0 || hd <= 0 || H % Hkv ? LL_EINVAL : 0; }
// Bytes of training attention's q/out (S, H, hd), k/v (S, Hkv, hd) and probabilities (H, S, S).
static int attn_bytes(const struct ocl_ctx *c, int S, int H, int Hkv, int hd, size_t *qb, size_t *kb, size_t *ab) {
  int rc;
  if ((rc = fbytes(c, (int64_t)S * H, hd, qb)) || (rc = fbytes(c, (int64_t)S * Hkv, hd, kb)) || (rc = fbytes(c, (int64_t)H * S, S, ab))) return rc;
  return 0;
}

static int ocl_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S,
                               int n_head, int n_head_kv, int head_dim, float scale) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !att || !q || !k || !v || attn_check(S, n_head, n_head_kv, head_dim)) return LL_EINVAL;
  if (S == 0) return 0;
  size_t qb, kb, ab;
  int rc;
  if ((rc = attn_bytes(c, S, n_head, n_head_kv, head_dim, &qb, &kb, &ab))) return fail(c, rc);
  if ((rc = put(c, S_X, q, qb)) || (rc = put(c, S_A, k, kb)) || (rc = put(c, S_B, v, kb)) || (rc = output(c, S_OUT, out, qb)) ||
      (rc = output(c, S_SCR, att, ab)))
    return fail(c, rc);
  cl_kernel kk = c->k_attn_train;
  cl_int e = ARG(kk, 0, c->s[S_OUT].use) | ARG(kk, 1, c->s[S_SCR].use) | ARG(kk, 2, c->s[S_X].use) | ARG(kk, 3, c->s[S_A].use) | ARG(kk, 4, c->s[S_B].use);
  e |= ARG(kk, 5, S) | ARG(kk, 6, n_head) | ARG(kk, 7, n_head_kv) | ARG(kk, 8, head_dim) | ARG(kk, 9, scale);
  const size_t gl = (size_t)S * n_head * WG, lo = WG;
  if (e || (rc = launch(c, kk, 1, &gl, &lo))) return fail(c, e ? LL_EIO : rc);
  if ((rc = get(c, S_OUT, out, qb))) return fail(c, rc);
  return get(c, S_SCR, att, ab);
}

static int ocl_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                  const float *v, const float *att, int S, int n_head, int n_head_kv, int head_dim, float scale) {
  struct ocl_ctx *c = CTX(b);
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !att || attn_check(S, n_head, n_head_kv, head_dim)) return LL_EINVAL;
  if (S == 0) return 0;
  size_t qb, kb, ab;
  int rc;
  if ((rc = attn_bytes(c, S, n_head, n_head_kv, head_dim, &qb, &kb, &ab))) return fail(c, rc);
  // dout (S, H, hd) in S_C, q in S_X, k, v (S, Hkv, hd) in S_A, S_B, att (H, S, S) in S_SCR;
  // ds (H, S, S) scratch in S_D; dq, dk, dv (all overwritten) in S_OUT, S_E, S_F.
  if ((rc = put(c, S_C, dout, qb)) || (rc = put(c, S_X, q, qb)) || (rc = put(c, S_A, k, kb)) || (rc = put(c, S_B, v, kb)) ||
      (rc = put(c, S_SCR, att, ab)) || (rc = stage(c, S_D, ab)) || (rc = output(c, S_OUT, dq, qb)) || (rc = output(c, S_E, dk, kb)) ||
      (rc = output(c, S_F, dv, kb)))
    return fail(c, rc);
  cl_kernel kk = c->k_attn_bwd_q;
  cl_int e = ARG(kk, 0, c->s[S_OUT].use) | ARG(kk, 1, c->s[S_D].use) | ARG(kk, 2, c->s[S_C].use) | ARG(kk, 3, c->s[S_X].use) | ARG(kk, 4, c->s[S_A].use);
  e |= ARG(kk, 5, c->s[S_B].use) | ARG(kk, 6, c->s[S_SCR].use) | ARG(kk, 7, S) | ARG(kk, 8, n_head) | ARG(kk, 9, n_head_kv) | ARG(kk, 10, head_dim);
  e |= ARG(kk, 11, scale);
  const size_t gl = (size_t)S * n_head * WG, lo = WG;
  if (e || (rc = launch(c, kk, 1, &gl, &lo))) return fail(c, e ? LL_EIO : rc);
  kk = c->k_attn_bwd_kv;
  e = ARG(kk, 0, c->s[S_E].use) | ARG(kk, 1, c->s[S_F].use) | ARG(kk, 2, c->s[S_D].use) | ARG(kk, 3, c->s[S_C].use) | ARG(kk, 4, c->s[S_X].use);
  e |= ARG(kk, 5, c->s[S_SCR].use) | ARG(kk, 6, S) | ARG(kk, 7, n_head) | ARG(kk, 8, n_head_kv) | ARG(kk, 9, head_dim);
  const size_t g2 = (size_t)S * n_head_kv * head_dim;
  if (e || (rc = launch(c, kk, 1, &g2, NULL))) return fail(c, e ? LL_EIO : rc);
  if ((rc = get(c, S_OUT, dq, qb)) || (rc = get(c, S_E, dk, kb))) return fail(c, rc);
  return get(c, S_F, dv, kb);
}

static int ocl_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets, int T, int V,
                            float grad_scale) {
  struct ocl_ctx *c = CTX(b);
  if (!loss || !logits || !targets || T < 0 || V <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (targets[t] >= V) return LL_EINVAL; // before anything is written
  if (T == 0) {
    *loss = 0;
    return 0;
  }
  size_t lb, rb;
  int rc;
  if ((rc = fbytes(c, T, V, &lb)) || (rc = fbytes(c, T, 4, &rb))) return fail(c, rc);
  float *rs = malloc(rb); // (T, 4): per row max, sum as hi + lo, the target's logit
  if (!rs) return LL_ENOMEM;
  const int want_d = dlogits != NULL;
  const struct rbuf *dr;
  size_t doff;
  // dlogits in a backend buffer (a training step): the statistics come back without a wait and
  // the loss is completed at the next drain (sync); otherwise now, with a blocking read.
  const int defer = want_d && resident(c, dlogits, lb, &dr, &doff) == 1;
  int32_t *tg = NULL;
  if (defer && c->n_pend == c->cap_pend) {
    const int cap = c->cap_pend ? 2 * c->cap_pend : 16;
    struct pending_loss *np = realloc(c->pend, (size_t)cap * sizeof *np);
    if (!np) {
      free(rs);
      return LL_ENOMEM;
    }
    c->pend = np, c->cap_pend = cap;
  }
  if (defer && !(tg = malloc((size_t)T * sizeof *tg))) {
    free(rs);
    return LL_ENOMEM;
  }
  if ((rc = put(c, S_X, logits, lb)) || (rc = put(c, S_POS, targets, (size_t)T * 4)) || (rc = want_d ? output(c, S_OUT, dlogits, lb) : stage(c, S_OUT, 16)) ||
      (rc = stage(c, S_TAB, rb))) {
    finish(c);
    free(rs), free(tg);
    return rc;
  }
  cl_kernel k = c->k_xent;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_TAB].use) | ARG(k, 2, c->s[S_X].use) | ARG(k, 3, c->s[S_POS].use) | ARG(k, 4, V);
  e |= ARG(k, 5, grad_scale) | ARG(k, 6, want_d);
  const size_t gl = (size_t)T * WG, lo = WG;
  if (!e && !(rc = launch(c, k, 1, &gl, &lo)) && defer) {
    c->bytes_down += (int64_t)rb;
    e = clEnqueueReadBuffer(c->q, c->s[S_TAB].use, CL_FALSE, 0, rb, rs, 0, NULL, NULL);
    if (e == CL_SUCCESS) {
      memcpy(tg, targets, (size_t)T * sizeof *tg);
      c->pend[c->n_pend++] = (struct pending_loss){loss, rs, tg, T};
      return get(c, S_OUT, dlogits, lb); // in place: nothing to do
    }
  }
  if (e || rc || (rc = get(c, S_TAB, rs, rb))) {
    finish(c);
    free(rs), free(tg);
    return fail(c, e ? LL_EIO : rc);
  }
  const double total = xent_loss(rs, targets, T);
  free(rs);
  // dlogits (it may alias logits: the kernel read each row before writing it)
  if (want_d && (rc = get(c, S_OUT, dlogits, lb))) return fail(c, rc);
  *loss = total;
  return 0;
}

static int cmp_pair(const void *a, const void *b) {
  const int32_t *x = a, *y = b;
  return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

static int ocl_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C) {
  struct ocl_ctx *c = CTX(b);
  if (!dw || !dout || !ids || T < 0 || C <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (ids[t] < 0) return LL_EINVAL;
  if (T == 0) return 0;
  size_t ob;
  int rc;
  if ((rc = fbytes(c, T, C, &ob))) return fail(c, rc);
  int max_id = 0;
  for (int t = 0; t < T; t++) max_id = ids[t] > max_id ? ids[t] : max_id;
  size_t wb;
  const struct rbuf *r;
  size_t off;
  if ((rc = fbytes(c, (int64_t)max_id + 1, C, &wb))) return fail(c, rc);
  const int in = resident(c, dw, wb, &r, &off);
  if (in < 0) return in;
  cl_kernel k = c->k_gr_bwd;
  cl_int e = 0;
  if (in) { // dw lives on the device: the kernel adds into its rows in place (slot[t] = ids[t])
    if ((rc = put(c, S_A, dw, wb)) || (rc = put(c, S_B, dout, ob)) || (rc = put(c, S_POS, ids, (size_t)T * 4))) return fail(c, rc);
    e = ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, c->s[S_POS].use) | ARG(k, 3, T) | ARG(k, 4, C);
    const size_t g = (size_t)C;
    if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
    return get(c, S_A, dw, wb);
  }
  // Host dw: its row count is not in the interface: only the distinct rows ids name go to the device,
  // (U, C) gathered here, slot[t] the row of token t, scattered back after.
  int32_t *pr = malloc((size_t)T * 2 * sizeof *pr), *slot = malloc((size_t)T * sizeof *slot), *row_of = malloc((size_t)T * sizeof *row_of);
  float *rows = malloc(ob);
  if (!pr || !slot || !row_of || !rows) {
    free(pr), free(slot), free(row_of), free(rows);
    return LL_ENOMEM;
  }
  for (int t = 0; t < T; t++) pr[2 * t] = ids[t], pr[2 * t + 1] = t;
  qsort(pr, (size_t)T, 2 * sizeof *pr, cmp_pair);
  int U = 0;
  for (int i = 0; i < T; i++) {
    if (i == 0 || pr[2 * i] != pr[2 * i - 2]) row_of[U++] = pr[2 * i];
    slot[pr[2 * i + 1]] = U - 1;
  }
  for (int u = 0; u < U; u++) memcpy(rows + (size_t)u * C, dw + (size_t)row_of[u] * C, (size_t)C * 4);
  const size_t ub = (size_t)U * C * 4;
  if (!(rc = put(c, S_A, rows, ub)) && !(rc = put(c, S_B, dout, ob)) && !(rc = put(c, S_POS, slot, (size_t)T * 4))) {
    e = ARG(k, 0, c->s[S_A].use) | ARG(k, 1, c->s[S_B].use) | ARG(k, 2, c->s[S_POS].use) | ARG(k, 3, T) | ARG(k, 4, C);
    const size_t g = (size_t)C;
    if (e) rc = LL_EIO;
    if (!rc) rc = launch(c, k, 1, &g, NULL);
    if (!rc) rc = get(c, S_A, rows, ub);
  }
  finish(c); // the read above blocked, except on an error path
  if (!rc)
    for (int u = 0; u < U; u++) memcpy(dw + (size_t)row_of[u] * C, rows + (size_t)u * C, (size_t)C * 4);
  free(pr), free(slot), free(row_of), free(rows);
  return rc;
}

static int ocl_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !x || n < 0 || !(p >= 0.0f && p < 1.0f)) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = fbytes(c, n, 1, &nb)) || (rc = put(c, S_A, x, nb)) || (rc = output(c, S_OUT, out, nb))) return fail(c, rc);
  // The mask's parameters as the reference computes them (ll_cpu_train.h).
  cl_ulong sm = ll_mix64(seed);
  cl_uint th = ll_dropout_threshold(p);
  const float sc = 1.0f / (1.0f - p);
  cl_long ln = n;
  cl_kernel k = c->k_dropout;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, sm) | ARG(k, 3, th) | ARG(k, 4, sc) | ARG(k, 5, ln);
  const size_t g = (size_t)n;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
  return get(c, S_OUT, out, nb);
}

#define SUMSQ_GROUPS 256 // partial sums read back (the host adds them in double)

static int ocl_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !x || n < 0) return LL_EINVAL;
  if (n == 0) {
    *out = 0;
    return 0;
  }
  size_t nb;
  int rc;
  if ((rc = fbytes(c, n, 1, &nb)) || (rc = put(c, S_A, x, nb)) || (rc = stage(c, S_TAB, SUMSQ_GROUPS * 2 * sizeof(float)))) return fail(c, rc);
  const int64_t need = (n + WG - 1) / WG;
  const size_t ng = need < SUMSQ_GROUPS ? (size_t)need : SUMSQ_GROUPS;
  cl_long ln = n;
  cl_kernel k = c->k_sumsq;
  cl_int e = ARG(k, 0, c->s[S_TAB].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, ln);
  const size_t gl = ng * WG, lo = WG;
  float part[SUMSQ_GROUPS * 2];
  if (e || (rc = launch(c, k, 1, &gl, &lo)) || (rc = get(c, S_TAB, part, ng * 2 * sizeof(float)))) return fail(c, e ? LL_EIO : rc);
  double s = 0;
  for (size_t i = 0; i < ng; i++) s += (double)part[2 * i] + (double)part[2 * i + 1];
  *out = s;
  return 0;
}

static int ocl_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!out || !x || n < 0) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  // x may be out: both are uploaded from the caller's memory before the kernel writes.
  if ((rc = fbytes(c, n, 1, &nb)) || (rc = put(c, S_OUT, out, nb)) || (rc = put(c, S_A, x, nb))) return fail(c, rc);
  cl_long ln = n;
  cl_kernel k = c->k_axpy;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, alpha) | ARG(k, 3, ln);
  const size_t g = (size_t)n;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
  return get(c, S_OUT, out, nb);
}

static int ocl_scale(struct ll_backend *b, float *x, float alpha, int64_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!x || n < 0) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = fbytes(c, n, 1, &nb)) || (rc = put(c, S_OUT, x, nb))) return fail(c, rc);
  cl_long ln = n;
  cl_kernel k = c->k_scale;
  cl_int e = ARG(k, 0, c->s[S_OUT].use) | ARG(k, 1, alpha) | ARG(k, 2, ln);
  const size_t g = (size_t)n;
  if (e || (rc = launch(c, k, 1, &g, NULL))) return fail(c, e ? LL_EIO : rc);
  return get(c, S_OUT, x, nb);
}

static int ocl_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                     float eps, float wd, int step) {
  struct ocl_ctx *c = CTX(b);
  if (!p || !g || !m || !v || n < 0 || step < 1) return LL_EINVAL;
  if (n == 0) return 0;
  size_t nb;
  int rc;
  if ((rc = fbytes(c, n, 1, &nb)) || (rc = put(c, S_X, p, nb)) || (rc = put(c, S_A, g, nb)) || (rc = put(c, S_B, m, nb)) ||
      (rc = put(c, S_C, v, nb)))
    return fail(c, rc);
  // Bias corrections on the host, as the reference computes them (pow in double).
  const float bc1 = (float)(1.0 - pow(beta1, step)), bc2 = (float)(1.0 - pow(beta2, step));
  cl_long ln = n;
  cl_kernel k = c->k_adamw;
  cl_int e = ARG(k, 0, c->s[S_X].use) | ARG(k, 1, c->s[S_A].use) | ARG(k, 2, c->s[S_B].use) | ARG(k, 3, c->s[S_C].use) | ARG(k, 4, ln);
  e |= ARG(k, 5, lr) | ARG(k, 6, beta1) | ARG(k, 7, beta2) | ARG(k, 8, eps) | ARG(k, 9, wd) | ARG(k, 10, bc1) | ARG(k, 11, bc2);
  const size_t gs = (size_t)n;
  if (e || (rc = launch(c, k, 1, &gs, NULL))) return fail(c, e ? LL_EIO : rc);
  if ((rc = get(c, S_X, p, nb)) || (rc = get(c, S_B, m, nb))) return fail(c, rc);
  return get(c, S_C, v, nb);
}

static int ocl_sync(struct ll_backend *b) { return finish(CTX(b)); }

// ---------------------------------------------------------------- backend buffers

static void *ocl_alloc(struct ll_backend *b, size_t n) {
  struct ocl_ctx *c = CTX(b);
  const size_t sz = n ? (n + 63) & ~(size_t)63 : 64;
  if (sz < n || c->no_alloc) return NULL;
  if (c->n_rb == c->cap_rb) {
    for (int j = 0; j < S_COUNT; j++) unbind(&c->s[j]); // bindings point into rb, which moves
    int cap = c->cap_rb ? 2 * c->cap_rb : 32;
    struct rbuf *nr = realloc(c->rb, (size_t)cap * sizeof *nr);
    if (!nr) return NULL;
    c->rb = nr, c->cap_rb = cap;
  }
  void *base = mmap(NULL, sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return NULL;
  cl_int e;
  cl_mem m = dev_alloc(c, sz, &e);
  const unsigned char zero = 0;
  if (m) e = clEnqueueFillBuffer(c->q, m, &zero, 1, 0, sz, 0, NULL, NULL);
  if (!m || e != CL_SUCCESS) {
    if (m) dev_release(c, m, sz);
    munmap(base, sz);
    return NULL;
  }
  c->rb[c->n_rb++] = (struct rbuf){base, sz, m};
  return base;
}

static void ocl_free_buf(struct ll_backend *b, void *p) {
  struct ocl_ctx *c = CTX(b);
  for (int i = 0; i < c->n_rb; i++) {
    struct rbuf *r = &c->rb[i];
    if (r->base != (char *)p) continue;
    for (int j = 0; j < S_COUNT; j++) unbind(&c->s[j]); // bindings point into rb, which changes
    dev_release(c, r->m, r->n); // the driver keeps it until queued work that uses it is done
    munmap(r->base, r->n);
    c->rb[i] = c->rb[--c->n_rb];
    return;
  }
}

static int ocl_copy(struct ll_backend *b, void *dst, const void *src, size_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!n) return 0;
  const struct rbuf *rd = NULL, *rs = NULL;
  size_t od = 0, os = 0;
  const int id = resident(c, dst, n, &rd, &od), is = resident(c, src, n, &rs, &os);
  if (id < 0 || is < 0) return LL_EINVAL;
  if (id && is) return cl_rc(clEnqueueCopyBuffer(c->q, rs->m, rd->m, os, od, n, 0, NULL, NULL));
  if (id) return upload(c, rd->m, od, src, n);
  if (is) return download(c, dst, rs->m, os, n);
  memmove(dst, src, n);
  return 0;
}

static int ocl_zero(struct ll_backend *b, void *dst, size_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!n) return 0;
  const struct rbuf *r = NULL;
  size_t off = 0;
  const int in = resident(c, dst, n, &r, &off);
  if (in < 0) return LL_EINVAL;
  if (!in) {
    memset(dst, 0, n);
    return 0;
  }
  const unsigned char zero = 0;
  return cl_rc(clEnqueueFillBuffer(c->q, r->m, &zero, 1, off, n, 0, NULL, NULL));
}

// ---------------------------------------------------------------- info, free

static void ocl_get_info(struct ll_backend *b, struct ll_backend_info *info) {
  struct ocl_ctx *c = CTX(b);
  *info = c->info;
  info->mem_used = c->mem_used;
  info->bytes_up = c->bytes_up, info->bytes_down = c->bytes_down, info->waits = c->waits;
  info->launches = c->launches;
  snprintf(info->tier, sizeof info->tier, "%s", c->fast ? "fast" : "reference");
}

static void ocl_free(struct ll_backend *b) {
  if (!b) return;
  struct ocl_ctx *c = CTX(b);
  if (c) {
    if (c->q) clFinish(c->q);
    for (int i = 0; i < c->n_w; i++) {
      clReleaseMemObject(c->w[i]->m);
      free(c->w[i]);
    }
    free(c->w);
    for (int i = 0; i < c->n_kv; i++)
      if (c->kv[i].m) clReleaseMemObject(c->kv[i].m);
    free(c->kv);
    for (int i = 0; i < S_COUNT; i++) {
      if (c->s[i].sub) clReleaseMemObject(c->s[i].sub);
      if (c->s[i].m) clReleaseMemObject(c->s[i].m);
    }
    for (int i = 0; i < c->n_cc; i++) {
      clReleaseMemObject(c->cc[i].m);
      free(c->cc[i].copy);
    }
    for (int i = 0; i < c->n_rb; i++) { // buffers the caller did not free
      clReleaseMemObject(c->rb[i].m);
      munmap(c->rb[i].base, c->rb[i].n);
    }
    free(c->rb);
    free(c->arena);
    for (int i = 0; i < c->n_pend; i++) free(c->pend[i].rs), free(c->pend[i].tg); // never read: the queue failed
    free(c->pend);
    cl_kernel ks[] = {c->k_quant, c->k_round, c->k_mm_f, c->k_gr_f, c->k_gr_q, c->k_rmsnorm, c->k_rope, c->k_swiglu, c->k_add, c->k_kv_store,
                      c->k_attention, c->k_deq, c->k_mm_dx, c->k_mm_dw, c->k_rms_bwd, c->k_rms_dg, c->k_rope_bwd, c->k_swiglu_bwd,
                      c->k_attn_train, c->k_attn_bwd_q, c->k_attn_bwd_kv, c->k_xent, c->k_gr_bwd, c->k_dropout, c->k_sumsq, c->k_axpy,
                      c->k_scale, c->k_adamw};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
      if (ks[i]) clReleaseKernel(ks[i]);
    for (int t = 0; t < LL_TYPE_COUNT; t++) {
      if (c->k_mm[t]) clReleaseKernel(c->k_mm[t]);
      if (c->k_fmm[t]) clReleaseKernel(c->k_fmm[t]);
    }
    if (c->k_rope_kv) clReleaseKernel(c->k_rope_kv);
    if (c->k_argmax) clReleaseKernel(c->k_argmax);
    if (c->prog) clReleaseProgram(c->prog);
    if (c->q) clReleaseCommandQueue(c->q);
    if (c->cx) clReleaseContext(c->cx);
    if (c->share && atomic_fetch_sub(&c->share->refs, 1) == 1) free(c->share);
    free(c->rope_cs);
    free(c);
  }
  free(b);
}

static const struct ll_backend_i ocl_iface = {
    .free = ocl_free,
    .get_info = ocl_get_info,
    .weight_upload = ocl_weight_upload,
    .weight_release = ocl_weight_release,
    .matmul = ocl_matmul,
    .get_rows = ocl_get_rows,
    .rmsnorm = ocl_rmsnorm,
    .rope = ocl_rope,
    .kv_store = ocl_kv_store,
    .attention = ocl_attention,
    .attention_multi = ocl_attention_multi,
    .swiglu = ocl_swiglu,
    .add = ocl_add,
    .matmul_backward = ocl_matmul_backward,
    .rmsnorm_backward = ocl_rmsnorm_backward,
    .rope_backward = ocl_rope_backward,
    .swiglu_backward = ocl_swiglu_backward,
    .attention_train = ocl_attention_train,
    .attention_backward = ocl_attention_backward,
    .softmax_xent = ocl_softmax_xent,
    .get_rows_backward = ocl_get_rows_backward,
    .dropout = ocl_dropout,
    .sumsq = ocl_sumsq,
    .axpy = ocl_axpy,
    .scale = ocl_scale,
    .adamw = ocl_adamw,
    .alloc = ocl_alloc,
    .free_buf = ocl_free_buf,
    .copy = ocl_copy,
    .zero = ocl_zero,
    .sync = ocl_sync,
    .fused_matmul = ocl_fused_matmul,
    .rope_kv_store = ocl_rope_kv_store,
    .argmax = ocl_argmax,
};

// ---------------------------------------------------------------- program build and cache

#define BUILD_OPTS "-cl-std=CL1.2"
#define BUILD_OPTS_NO_FP64 BUILD_OPTS " -DLL_NO_FP64"
// The build options: LL_OPENCL_NO_FP64=1 builds the kernels as for a device without f64 (the
// tests' way to cover that path on devices that have it); info.fp64 then reports 0.
static const char *build_opts(const struct ocl_ctx *c) { return c->no_fp64 ? BUILD_OPTS_NO_FP64 : BUILD_OPTS; }

// Cache key: sha256 of device name, vendor, driver and platform versions, build options and
// source, so a new driver or changed kernels rebuild.
static void cache_path(struct ocl_ctx *c, const char *dir, const char *src, char *out, size_t cap) {
  char plat[256] = "";
  clGetPlatformInfo(c->plat, CL_PLATFORM_VERSION, sizeof plat, plat, NULL);
  EVP_MD_CTX *h = EVP_MD_CTX_new();
  unsigned char d[32];
  unsigned int dn = 0;
  out[0] = 0;
  if (!h) return;
  const char *parts[] = {c->info.device, c->info.vendor, c->info.driver, c->info.version, plat, build_opts(c), src};
  int ok = EVP_DigestInit_ex(h, EVP_sha256(), NULL) == 1;
  for (size_t i = 0; ok && i < sizeof parts / sizeof parts[0]; i++) ok = EVP_DigestUpdate(h, parts[i], strlen(parts[i]) + 1) == 1;
  ok = ok && EVP_DigestFinal_ex(h, d, &dn) == 1;
  EVP_MD_CTX_free(h);
  if (!ok) return;
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
  snprintf(out, cap, "%s/opencl-%s.bin", dir, hex);
}

static unsigned char *read_file(const char *path, size_t *len) {
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

// Write the built program's binary atomically (temp file + rename); failures only cost the
// next start a rebuild, so they are ignored.
static void cache_store(struct ocl_ctx *c, const char *path) {
  size_t n = 0;
  if (clGetProgramInfo(c->prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || n == 0) return;
  unsigned char *bin = malloc(n);
  if (!bin) return;
  unsigned char *bins[1] = {bin};
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f;
  if (clGetProgramInfo(c->prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS && (f = fopen(tmp, "wb"))) {
    int ok = fwrite(bin, 1, n, f) == n;
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
  }
  free(bin);
}

static int build_program(struct ocl_ctx *c, const char *cache_dir, char *err, size_t errlen) {
  char path[1024] = "";
  if (cache_dir && *cache_dir) {
    mkdir(cache_dir, 0755); // one level; an existing directory is fine
    cache_path(c, cache_dir, ll_opencl_source, path, sizeof path);
  }
  cl_int e;
  if (path[0]) {
    size_t len = 0;
    unsigned char *bin = read_file(path, &len);
    if (bin) {
      const unsigned char *bins[1] = {bin};
      cl_int st;
      c->prog = clCreateProgramWithBinary(c->cx, 1, &c->dev, &len, bins, &st, &e);
      free(bin);
      if (c->prog && (e != CL_SUCCESS || st != CL_SUCCESS || clBuildProgram(c->prog, 1, &c->dev, build_opts(c), NULL, NULL) != CL_SUCCESS)) {
        clReleaseProgram(c->prog); // a stale or foreign binary: rebuild from source
        c->prog = NULL;
      }
      if (c->prog) {
        c->cache_hit = 1;
        return 0;
      }
    }
  }
  const char *src = ll_opencl_source;
  c->prog = clCreateProgramWithSource(c->cx, 1, &src, NULL, &e);
  if (!c->prog) return ll_errf(err, errlen, cl_rc(e), "opencl: clCreateProgramWithSource: %s (%d)", cl_errname(e), e);
  e = clBuildProgram(c->prog, 1, &c->dev, build_opts(c), NULL, NULL);
  if (e != CL_SUCCESS) {
    char log[1500] = "";
    size_t n = 0;
    clGetProgramBuildInfo(c->prog, c->dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &n);
    log[sizeof log - 1] = 0;
    for (char *p = log; *p; p++)
      if (*p == '\n') *p = ' ';
    return ll_errf(err, errlen, LL_EUNSUPPORTED, "opencl: building the kernels failed (%s): %s", cl_errname(e), log);
  }
  if (path[0]) cache_store(c, path);
  return 0;
}

static int make_kernels(struct ocl_ctx *c, char *err, size_t errlen) {
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
      return ll_errf(err, errlen, LL_EIO, "opencl: kernel %s: %s (%d)", (nm), cl_errname(e), e);             \
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
  MK(c->k_add, "add");
  MK(c->k_kv_store, "kv_store");
  MK(c->k_attention, "attention");
  MK(c->k_deq, "deq_rows");
  MK(c->k_mm_dx, "mm_bwd_dx");
  MK(c->k_mm_dw, "mm_bwd_dw");
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
  static const struct {
    int type;
    const char *name;
  } f[] = {{LL_TYPE_F32, "f32"},   {LL_TYPE_F16, "f16"},   {LL_TYPE_BF16, "bf16"}, {LL_TYPE_Q4_0, "q4_0"},
           {LL_TYPE_Q4_1, "q4_1"}, {LL_TYPE_Q5_0, "q5_0"}, {LL_TYPE_Q5_1, "q5_1"}, {LL_TYPE_Q8_0, "q8_0"},
           {LL_TYPE_Q4_K, "q4_K"}, {LL_TYPE_Q5_K, "q5_K"}, {LL_TYPE_Q6_K, "q6_K"}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    snprintf(name, sizeof name, "fmm_%s", f[i].name);
    MK(c->k_fmm[f[i].type], name);
  }
  MK(c->k_rope_kv, "rope_kv");
  MK(c->k_argmax, "argmax_rows");
#undef MK
  return 0;
}

// Warm-up and self-test: a small Q8_0 product (3 tokens, 5 rows of 64, two unit groups) and
// its accumulate form against the CPU's scalar reference (the fast tier's too: it quantizes the
// activations as the CPU does, and its sums are within float rounding). A device that computes
// it wrong is not used.
static int self_test(struct ll_backend *b, char *err, size_t errlen) {
  enum { K = 64, N = 5, T = 3 };
  float wf[N * K], x[T * K], out[T * N], ref[T * N];
  ll_block_q8_0 wq[N * K / 32], xq[K / 32];
  uint32_t s = 12345;
  for (int i = 0; i < N * K; i++) s = s * 1664525u + 1013904223u, wf[i] = (float)(s >> 8) / (float)(1 << 24) - 0.5f;
  for (int i = 0; i < T * K; i++) s = s * 1664525u + 1013904223u, x[i] = (float)(s >> 8) / (float)(1 << 24) - 0.5f;
  for (int r = 0; r < N; r++) ll_quantize_row(LL_TYPE_Q8_0, wf + r * K, wq + r * (K / 32), K);
  const struct ll_type_kernels *kr = ll_cpu_kernels_ref(LL_TYPE_Q8_0);
  for (int t = 0; t < T; t++) {
    kr->from_float(x + t * K, xq, K);
    for (int r = 0; r < N; r++) kr->vec_dot(K, &ref[t * N + r], wq + r * (K / 32), xq);
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

// A device string, truncated to cap (drivers' version strings can be long: PoCL's names its
// build options; a too-small buffer would be an error, not a truncation).
static void dev_str(cl_device_id d, cl_device_info what, char *out, size_t cap) {
  char buf[1024];
  out[0] = 0;
  if (clGetDeviceInfo(d, what, sizeof buf, buf, NULL) != CL_SUCCESS) return;
  buf[sizeof buf - 1] = 0;
  const size_t n = strnlen(buf, cap - 1);
  memcpy(out, buf, n);
  out[n] = 0;
}

// A backend with an empty context, counting its device memory in share (NULL: a new count).
static struct ll_backend *instance_new(struct ocl_share *share) {
  struct ll_backend *b = calloc(1, sizeof *b);
  struct ocl_ctx *c = calloc(1, sizeof *c);
  if (!share && (share = calloc(1, sizeof *share))) atomic_init(&share->used, 0), atomic_init(&share->refs, 0);
  if (!b || !c || !share) {
    if (share && !atomic_load(&share->refs)) free(share);
    free(b), free(c);
    return NULL;
  }
  atomic_fetch_add(&share->refs, 1);
  b->i = &ocl_iface, b->ctx = c, c->share = share;
  return b;
}

int ll_backend_opencl_create(struct ll_backend **out, int plat, int dev, const char *cache_dir, char *err, size_t errlen) {
  *out = NULL;
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int e = clGetPlatformIDs(16, plats, &np);
  if (e != CL_SUCCESS || np == 0) return ll_errf(err, errlen, LL_ENOTFOUND, "opencl: no platform (%s)", cl_errname(e));
  if (plat < 0 || (cl_uint)plat >= np || plat >= 16) return ll_errf(err, errlen, LL_ENOTFOUND, "opencl: no platform %d (%u found)", plat, np);
  cl_device_id devs[16];
  cl_uint nd = 0;
  e = clGetDeviceIDs(plats[plat], CL_DEVICE_TYPE_ALL, 16, devs, &nd);
  if (e != CL_SUCCESS || dev < 0 || (cl_uint)dev >= nd || dev >= 16)
    return ll_errf(err, errlen, LL_ENOTFOUND, "opencl: platform %d has no device %d (%u found)", plat, dev, e == CL_SUCCESS ? nd : 0);
  struct ll_backend *b = instance_new(NULL);
  if (!b) return ll_errf(err, errlen, LL_ENOMEM, "opencl: out of memory");
  struct ocl_ctx *c = CTX(b);
  c->plat = plats[plat], c->dev = devs[dev];
  struct ll_backend_info *in = &c->info;
  snprintf(in->name, sizeof in->name, "opencl");
  dev_str(c->dev, CL_DEVICE_NAME, in->device, sizeof in->device);
  dev_str(c->dev, CL_DEVICE_VENDOR, in->vendor, sizeof in->vendor);
  dev_str(c->dev, CL_DRIVER_VERSION, in->driver, sizeof in->driver);
  dev_str(c->dev, CL_DEVICE_VERSION, in->version, sizeof in->version);
  cl_uint cu = 0;
  cl_ulong gm = 0, ma = 0;
  clGetDeviceInfo(c->dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
  clGetDeviceInfo(c->dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gm, &gm, NULL);
  clGetDeviceInfo(c->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ma, &ma, NULL);
  in->compute_units = (int)cu;
  in->cl_platform = plat, in->cl_device = dev;
  in->mem_total = c->mem_total = (int64_t)gm;
  // LL_OPENCL_MEM_LIMIT=bytes: use at most this much of the device (sharing a GPU; also how
  // the tests make an allocation run out).
  const char *lim = getenv("LL_OPENCL_MEM_LIMIT");
  if (lim && *lim) {
    char *end;
    long long v = strtoll(lim, &end, 10);
    if (*end == 0 && v > 0 && v < c->mem_total) in->mem_total = c->mem_total = v;
  }
  in->max_alloc = c->max_alloc = (int64_t)ma;
  cl_uint align_bits = 0; // sub-buffers start at multiples of it (1.2: at least a long16, 1024 bits)
  clGetDeviceInfo(c->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
  c->addr_align = align_bits >= 8 ? align_bits / 8 : 128;
  size_t ext_len = 0;
  if (clGetDeviceInfo(c->dev, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_len) == CL_SUCCESS && ext_len) {
    char *ext = malloc(ext_len + 1);
    if (ext && clGetDeviceInfo(c->dev, CL_DEVICE_EXTENSIONS, ext_len, ext, NULL) == CL_SUCCESS) {
      ext[ext_len] = 0;
      in->fp16 = strstr(ext, "cl_khr_fp16") != NULL;
      const char *nf = getenv("LL_OPENCL_NO_FP64");
      c->no_fp64 = nf && strcmp(nf, "1") == 0;
      in->fp64 = strstr(ext, "cl_khr_fp64") != NULL && !c->no_fp64;
      in->subgroups = strstr(ext, "cl_khr_subgroups") != NULL || strstr(ext, "cl_intel_subgroups") != NULL;
    }
    free(ext);
  }
  // The tier: LL_OPENCL_REFERENCE=1 the reference kernels, =0 the fast ones; unset, the fast
  // tier on GPUs and accelerators, the reference tier on CPU devices (PoCL), where it is bit
  // for bit the CPU backend's and the fast tier would buy little.
  cl_device_type dtype = 0;
  clGetDeviceInfo(c->dev, CL_DEVICE_TYPE, sizeof dtype, &dtype, NULL);
  const char *tier = getenv("LL_OPENCL_REFERENCE");
  c->fast = tier && *tier ? strcmp(tier, "0") == 0 : (dtype & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0;
  int rc = 0;
  if (strncmp(in->version, "OpenCL ", 7) != 0 || (in->version[7] == '1' && in->version[9] < '2'))
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "opencl: %s reports '%s'; OpenCL 1.2 or later is needed", in->device, in->version);
  if (rc == 0) {
    c->cx = clCreateContext(NULL, 1, &c->dev, NULL, NULL, &e);
    if (!c->cx) rc = ll_errf(err, errlen, cl_rc(e) ? cl_rc(e) : LL_EIO, "opencl: clCreateContext: %s (%d)", cl_errname(e), e);
  }
  if (rc == 0) {
    c->q = clCreateCommandQueue(c->cx, c->dev, 0, &e);
    if (!c->q) rc = ll_errf(err, errlen, cl_rc(e) ? cl_rc(e) : LL_EIO, "opencl: clCreateCommandQueue: %s (%d)", cl_errname(e), e);
  }
  size_t wg = 0;
  if (rc == 0 && (clGetDeviceInfo(c->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) != CL_SUCCESS || wg < WG))
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "opencl: %s allows work-groups of %zu, %d are needed", in->device, wg, WG);
  if (rc == 0) rc = build_program(c, cache_dir, err, errlen);
  if (rc == 0) rc = make_kernels(c, err, errlen);
  if (rc == 0) rc = self_test(b, err, errlen);
  if (rc) {
    ocl_free(b);
    return rc;
  }
  *out = b;
  return 0;
}

int ll_backend_opencl_create_beside(struct ll_backend **out, struct ll_backend *peer, char *err, size_t errlen) {
  *out = NULL;
  if (!peer || peer->i != &ocl_iface) return ll_errf(err, errlen, LL_EINVAL, "opencl: no OpenCL instance to open another beside");
  const struct ocl_ctx *pc = CTX(peer);
  struct ll_backend *b = instance_new(pc->share);
  if (!b) return ll_errf(err, errlen, LL_ENOMEM, "opencl: out of memory");
  struct ocl_ctx *c = CTX(b);
  // The peer's device, context (its buffers), program and accounting; a queue, kernels (their
  // arguments are per object), staging and buffers of its own.
  c->plat = pc->plat, c->dev = pc->dev, c->info = pc->info, c->info.mem_used = 0;
  c->mem_total = pc->mem_total, c->max_alloc = pc->max_alloc, c->addr_align = pc->addr_align;
  c->no_fp64 = pc->no_fp64, c->cache_hit = pc->cache_hit, c->fast = pc->fast;
  // Testing aid: the server's trainer instance out of memory for its buffers (the weights fit).
  const char *fault = getenv("LL_OPENCL_FAULT");
  c->no_alloc = fault && strcmp(fault, "train_alloc") == 0;
  c->cx = pc->cx, clRetainContext(c->cx);
  c->prog = pc->prog, clRetainProgram(c->prog);
  cl_int e;
  int rc = 0;
  c->q = clCreateCommandQueue(c->cx, c->dev, 0, &e);
  if (!c->q) rc = ll_errf(err, errlen, cl_rc(e) ? cl_rc(e) : LL_EIO, "opencl: clCreateCommandQueue: %s (%d)", cl_errname(e), e);
  if (rc == 0) rc = make_kernels(c, err, errlen);
  if (rc) {
    ocl_free(b);
    return rc;
  }
  *out = b;
  return 0;
}

int ll_backend_opencl_cache_hit(const struct ll_backend *b) { return b && b->i == &ocl_iface ? CTX(b)->cache_hit : 0; }
