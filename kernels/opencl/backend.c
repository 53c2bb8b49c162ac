// backend.c - the OpenCL backend: struct ll_backend_i on one OpenCL 1.2 device.
//
// Files: backend.c (this: memory accounting, host <-> device transfers, staging slots,
// weights, backend buffers, the interface table, devices and instances), ops.c (the forward
// ops of both tiers and the KV cache), train_ops.c (the training members), program.c (build,
// binary cache, kernel objects, self-test), ocl_internal.h (what they share); kernels in
// llsrv.cl (reference tier), llsrv_fast.cl (fast tier), train.cl.
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
#include "ocl_internal.h"


const char *ocl_cl_errname(cl_int e) {
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
int ocl_cl_rc(cl_int e) {
  if (e == CL_SUCCESS) return 0;
  if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_OUT_OF_HOST_MEMORY) return LL_ENOMEM;
  return LL_EIO;
}

// ---------------------------------------------------------------- memory accounting

cl_mem ocl_dev_alloc(struct ocl_ctx *c, size_t bytes, cl_int *e) {
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

void ocl_dev_release(struct ocl_ctx *c, cl_mem m, size_t bytes) {
  if (!m) return;
  ocl_release_mem(m);
  c->mem_used -= (int64_t)(bytes ? bytes : 16);
  atomic_fetch_sub(&c->share->used, (int64_t)(bytes ? bytes : 16));
}

// ---------------------------------------------------------------- host <-> device

// The loss from softmax_xent's row statistics, on the host in double as the reference computes
// it: log Σ - (l_y - m) per counted row.
double ocl_xent_loss(const float *rs, const int32_t *targets, int T) {
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
void ocl_drained(struct ocl_ctx *c) {
  c->arena_used = c->arena_tail = c->arena_end = 0, c->arena_wrap = 0, c->arena_lap++;
  for (int i = 0; i < c->n_pend; i++) {
    *c->pend[i].loss = ocl_xent_loss(c->pend[i].rs, c->pend[i].tg, c->pend[i].T);
    free(c->pend[i].rs), free(c->pend[i].tg);
  }
  c->n_pend = 0;
}

int ocl_finish(struct ocl_ctx *c) {
  c->waits++, c->idle_waits++;
  cl_int e = clFinish(c->q);
  ocl_drained(c);
  return ocl_cl_rc(e);
}

#define ARENA_MAX ((size_t)64 << 20) // larger uploads block instead

// Queue a write of host bytes to dst at off; src may change as soon as this returns.
int ocl_upload(struct ocl_ctx *c, cl_mem dst, size_t off, const void *src, size_t bytes) {
  if (!bytes) return 0;
  c->bytes_up += (int64_t)bytes;
  if (bytes > ARENA_MAX) return ocl_cl_rc(clEnqueueWriteBuffer(c->q, dst, CL_TRUE, off, bytes, src, 0, NULL, NULL));
  const size_t need = (bytes + 63) & ~(size_t)63;
  size_t at;
  if (!c->arena_wrap && c->arena_used + need <= c->arena_cap) {
    at = c->arena_used;
  } else if (!c->arena_wrap && need < c->arena_tail) { // wrap: [0, tail) was read by waited work
    c->arena_end = c->arena_used, c->arena_wrap = 1, c->arena_lap++;
    at = 0;
  } else if (c->arena_wrap && c->arena_used + need < c->arena_tail) {
    at = c->arena_used;
  } else {
    int rc = ocl_finish(c); // the queued uploads have read their bytes: the arena may move
    if (rc) return rc;
    if (need > c->arena_cap) {
      size_t cap = c->arena_cap ? c->arena_cap : (size_t)1 << 20;
      while (cap < need) cap *= 2;
      unsigned char *na = realloc(c->arena, cap);
      if (!na) return LL_ENOMEM;
      c->arena = na, c->arena_cap = cap;
    }
    at = 0;
  }
  unsigned char *h = c->arena + at;
  memcpy(h, src, bytes);
  c->arena_used = at + need;
  return ocl_cl_rc(clEnqueueWriteBuffer(c->q, dst, CL_FALSE, off, bytes, h, 0, NULL, NULL));
}

// Blocking read of device bytes into host memory.
int ocl_download(struct ocl_ctx *c, void *dst, cl_mem src, size_t off, size_t bytes) {
  if (!bytes) return 0;
  c->bytes_down += (int64_t)bytes;
  c->waits++, c->idle_waits++;
  cl_int e = clEnqueueReadBuffer(c->q, src, CL_TRUE, off, bytes, dst, 0, NULL, NULL);
  ocl_drained(c);
  return ocl_cl_rc(e);
}

// The backend buffer holding [p, p + bytes): 1 and *r, *off when p is in one, 0 for host
// memory, LL_EINVAL for a range that starts in a buffer and runs past its end.
int ocl_resident(const struct ocl_ctx *c, const void *p, size_t bytes, const struct rbuf **r, size_t *off) {
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
int ocl_grow(struct ocl_ctx *c, int slot, size_t bytes) {
  struct sbuf *s = &c->s[slot];
  if (s->m && s->cap >= bytes) return 0;
  size_t cap = s->cap ? s->cap : 4096;
  while (cap < bytes) cap *= 2;
  if ((int64_t)cap > c->max_alloc && (int64_t)bytes <= c->max_alloc) cap = bytes;
  ocl_dev_release(c, s->m, s->cap);
  s->m = NULL, s->cap = 0;
  cl_int e;
  s->m = ocl_dev_alloc(c, cap, &e);
  if (!s->m) return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_ENOMEM;
  s->cap = cap;
  return 0;
}

void ocl_unbind(struct sbuf *s) {
  if (s->sub) ocl_release_mem(s->sub);
  s->sub = NULL, s->res = NULL, s->off = s->len = 0, s->copied = 0, s->use = s->m;
}

// Slot as scratch of at least `bytes` (its staging buffer).
int ocl_stage(struct ocl_ctx *c, int slot, size_t bytes) {
  ocl_unbind(&c->s[slot]);
  int rc = ocl_grow(c, slot, bytes);
  c->s[slot].use = c->s[slot].m;
  return rc;
}

// Slot's staging buffer as the operand's copy (bytes), filled when load: by a device-side
// copy from backend buffer r at off, or (r NULL) by an upload from host memory at p.
int ocl_stage_copy(struct ocl_ctx *c, int slot, const void *p, size_t bytes, const struct rbuf *r, size_t off, int load) {
  struct sbuf *s = &c->s[slot];
  const int rc = ocl_grow(c, slot, bytes);
  if (rc) return rc;
  s->use = s->m;
  if (!load) return 0;
  return r ? ocl_cl_rc(clEnqueueCopyBuffer(c->q, r->m, s->m, off, 0, bytes, 0, NULL, NULL)) : ocl_upload(c, s->m, 0, p, bytes);
}

// Slot for the operand at p (bytes): a backend buffer is used where it is (itself, or a
// sub-buffer at the offset; where the device cannot start one there, a device-side copy in
// the staging buffer); host memory gets the staging buffer, filled from p when load.
int ocl_bind(struct ocl_ctx *c, int slot, const void *p, size_t bytes, int load) {
  struct sbuf *s = &c->s[slot];
  ocl_unbind(s);
  const struct rbuf *r = NULL;
  size_t off = 0;
  int in = bytes ? ocl_resident(c, p, bytes, &r, &off) : 0;
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
  const int rc = ocl_stage_copy(c, slot, p, bytes, in ? r : NULL, off, load);
  if (rc == 0 && in) s->res = r, s->off = off, s->len = bytes, s->copied = 1; // ocl_get() copies it back
  return rc;
}

// An input the op's kernels change (act_round rounds its x): always the slot's own copy, and
// not remembered as the range's (ocl_get() must not copy the changed bytes back).
int ocl_put_copy(struct ocl_ctx *c, int slot, const void *src, size_t bytes) {
  ocl_unbind(&c->s[slot]);
  const struct rbuf *r = NULL;
  size_t off = 0;
  const int in = bytes ? ocl_resident(c, src, bytes, &r, &off) : 0;
  if (in < 0) return in;
  return ocl_stage_copy(c, slot, src, bytes, in ? r : NULL, off, 1);
}

// An input that repeats across calls (struct cconst): a backend buffer as put; host bytes from
// the constant cache, uploaded only when they changed; put's staging when the cache is full.
int ocl_put_const(struct ocl_ctx *c, int slot, const void *src, size_t bytes) {
  const struct rbuf *r;
  size_t off;
  const int in = bytes ? ocl_resident(c, src, bytes, &r, &off) : 1;
  if (in < 0) return in;
  if (in || bytes > CONST_MAX_BYTES) return ocl_bind(c, slot, src, bytes, 1);
  struct cconst *k = NULL;
  for (int i = 0; i < c->n_cc && !k; i++)
    if (c->cc[i].host == src && c->cc[i].bytes == bytes) k = &c->cc[i];
  if (k && memcmp(k->copy, src, bytes) != 0) {
    memcpy(k->copy, src, bytes);
    int rc = ocl_upload(c, k->m, 0, src, bytes); // queued after the kernels that read the old bytes
    if (rc) return rc;
  }
  if (!k) {
    while (c->n_cc && (c->n_cc == N_CONST || c->cc_bytes + bytes > CONST_TOTAL_BYTES)) { // evict the least recently used
      int lru = 0;
      for (int i = 1; i < c->n_cc; i++) lru = c->cc[i].used < c->cc[lru].used ? i : lru;
      for (int j = 0; j < S_COUNT; j++) // a slot still naming it: unbound (its memory goes)
        if (c->s[j].use == c->cc[lru].m) ocl_unbind(&c->s[j]);
      ocl_dev_release(c, c->cc[lru].m, c->cc[lru].bytes);
      free(c->cc[lru].copy);
      c->cc_bytes -= c->cc[lru].bytes;
      c->cc[lru] = c->cc[--c->n_cc];
    }
    cl_int e;
    void *copy = malloc(bytes);
    cl_mem m = copy ? ocl_dev_alloc(c, bytes, &e) : NULL;
    if (!m) {
      free(copy);
      return ocl_bind(c, slot, src, bytes, 1);
    }
    memcpy(copy, src, bytes);
    int rc = ocl_upload(c, m, 0, src, bytes);
    if (rc) {
      ocl_dev_release(c, m, bytes);
      free(copy);
      return rc;
    }
    k = &c->cc[c->n_cc++];
    *k = (struct cconst){src, bytes, m, copy, 0};
    c->cc_bytes += bytes;
  }
  k->used = ++c->cc_tick;
  ocl_unbind(&c->s[slot]);
  c->s[slot].use = k->m;
  return 0;
}

// An input (or an in-out operand): its bytes are in the slot when the op's kernels run.
int ocl_put(struct ocl_ctx *c, int slot, const void *src, size_t bytes) { return ocl_bind(c, slot, src, bytes, 1); }
// An output the kernels overwrite.
int ocl_output(struct ocl_ctx *c, int slot, void *dst, size_t bytes) { return ocl_bind(c, slot, dst, bytes, 0); }

// The slot's result to dst: nothing to do where the kernels wrote dst in place; a queued
// device copy into a backend buffer; a blocking read into host memory.
int ocl_get(struct ocl_ctx *c, int slot, void *dst, size_t bytes) {
  struct sbuf *s = &c->s[slot];
  if (!bytes) return 0;
  if (s->res && s->res->base + s->off == (char *)dst && !s->copied) return 0;
  const struct rbuf *r = NULL;
  size_t off = 0;
  int in = ocl_resident(c, dst, bytes, &r, &off);
  if (in < 0) return in;
  if (in) return ocl_cl_rc(clEnqueueCopyBuffer(c->q, s->use, r->m, 0, off, bytes, 0, NULL, NULL));
  return ocl_download(c, dst, s->use, 0, bytes);
}

_Atomic uint64_t ocl_mem_gen;

cl_int ocl_setarg(struct ocl_ctx *c, cl_kernel k, cl_uint i, size_t sz, const void *v) {
  c->arg_sets++;
  return clSetKernelArg(k, i, sz, v);
}

cl_int ocl_karg(struct ocl_ctx *c, struct ocl_kargs *a, cl_uint i, size_t sz, const void *v) {
  if (i >= OCL_KARGS || sz > 8) return CL_INVALID_ARG_INDEX;
  const uint64_t gen = atomic_load(&ocl_mem_gen);
  if (a->gen != gen) memset(a->set, 0, sizeof a->set), a->gen = gen;
  if (a->set[i] && a->sz[i] == sz && memcmp(a->v[i], v, sz) == 0) return CL_SUCCESS;
  const cl_int e = ocl_setarg(c, a->k, i, sz, v);
  if (e == CL_SUCCESS) a->set[i] = 1, a->sz[i] = (unsigned char)sz, memcpy(a->v[i], v, sz);
  else a->set[i] = 0;
  return e;
}

int ocl_launch(struct ocl_ctx *c, cl_kernel k, cl_uint dims, const size_t *global, const size_t *local) {
  for (cl_uint i = 0; i < dims; i++)
    if (global[i] == 0) return 0;
  c->launches++;
  return ocl_cl_rc(clEnqueueNDRangeKernel(c->q, k, dims, NULL, global, local, 0, NULL, NULL));
}


// ---------------------------------------------------------------- weights

int ocl_weight_upload_impl(struct ocl_ctx *c, const struct ll_weight *w, struct ocl_weight **out) {
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
  ow->m = ocl_dev_alloc(c, bytes, &e);
  if (!ow->m) {
    free(ow);
    return ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_ENOMEM;
  }
  ow->bytes = bytes, ow->host = w->data, ow->refs = 1, ow->owner = c, ow->cx = c->cx;
  // Blocking: drivers that allocate on first use report an out-of-memory here, not later.
  e = clEnqueueWriteBuffer(c->q, ow->m, CL_TRUE, 0, bytes, w->data, 0, NULL, NULL);
  if (e != CL_SUCCESS) {
    ocl_dev_release(c, ow->m, bytes);
    free(ow);
    return ocl_cl_rc(e);
  }
  c->w[c->n_w++] = ow;
  *out = ow;
  return 0;
}

int ocl_weight_upload(struct ll_backend *b, struct ll_weight *w) {
  struct ocl_ctx *c = CTX(b);
  if (w->dev) return 0;
  for (int i = 0; i < c->n_w; i++) // the same matrix under another name (tied embeddings)
    if (c->w[i]->host == w->data && c->w[i]->bytes == ll_row_size(w->type, w->k) * (size_t)w->n) {
      w->dev = c->w[i];
      c->w[i]->refs++;
      return 0;
    }
  struct ocl_weight *ow = NULL;
  int rc = ocl_weight_upload_impl(c, w, &ow);
  if (rc == 0) w->dev = ow;
  return rc;
}

void ocl_weight_release(struct ll_backend *b, struct ll_weight *w) {
  struct ocl_ctx *c = CTX(b);
  struct ocl_weight *ow = w->dev;
  if (ow && ow->owner != c) return; // another instance's copy: its owner releases it
  w->dev = NULL;
  if (!ow || --ow->refs > 0) return;
  for (int i = 0; i < c->n_w; i++)
    if (c->w[i] == ow) {
      c->w[i] = c->w[--c->n_w];
      ocl_dev_release(c, ow->m, ow->bytes);
      if (ow->fk.k) clReleaseKernel(ow->fk.k);
      free(ow);
      return;
    }
}

// The device copy of w: its resident copy (weight_upload, by this instance or one sharing
// its context: ll_backend_opencl_create_beside), or, for a weight never uploaded, a copy made
// for this call in a staging buffer (correct, but a transfer per call). A copy in another
// context is a buffer this queue must not use: staged like a weight never uploaded.
int ocl_weight_dev_in(struct ocl_ctx *c, const struct ll_weight *w, int slot, cl_mem *out) {
  if (w->dev && ((const struct ocl_weight *)w->dev)->cx == c->cx) {
    *out = ((struct ocl_weight *)w->dev)->m;
    return 0;
  }
  const size_t bytes = ll_row_size(w->type, w->k) * (size_t)w->n;
  int rc = ocl_put(c, slot, w->data, bytes);
  if (rc == 0) *out = c->s[slot].use;
  return rc;
}
int ocl_weight_dev(struct ocl_ctx *c, const struct ll_weight *w, cl_mem *out) { return ocl_weight_dev_in(c, w, S_W, out); }

// ---------------------------------------------------------------- backend buffers

void *ocl_alloc(struct ll_backend *b, size_t n) {
  struct ocl_ctx *c = CTX(b);
  const size_t sz = n ? (n + 63) & ~(size_t)63 : 64;
  if (sz < n || c->no_alloc) return NULL;
  if (c->n_rb == c->cap_rb) {
    for (int j = 0; j < S_COUNT; j++) ocl_unbind(&c->s[j]); // bindings point into rb, which moves
    int cap = c->cap_rb ? 2 * c->cap_rb : 32;
    struct rbuf *nr = realloc(c->rb, (size_t)cap * sizeof *nr);
    if (!nr) return NULL;
    c->rb = nr, c->cap_rb = cap;
  }
  void *base = mmap(NULL, sz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return NULL;
  cl_int e;
  cl_mem m = ocl_dev_alloc(c, sz, &e);
  const unsigned char zero = 0;
  if (m) e = clEnqueueFillBuffer(c->q, m, &zero, 1, 0, sz, 0, NULL, NULL);
  if (!m || e != CL_SUCCESS) {
    if (m) ocl_dev_release(c, m, sz);
    munmap(base, sz);
    return NULL;
  }
  c->rb[c->n_rb++] = (struct rbuf){base, sz, m};
  return base;
}

void ocl_free_buf(struct ll_backend *b, void *p) {
  struct ocl_ctx *c = CTX(b);
  for (int i = 0; i < c->n_rb; i++) {
    struct rbuf *r = &c->rb[i];
    if (r->base != (char *)p) continue;
    for (int j = 0; j < S_COUNT; j++) ocl_unbind(&c->s[j]); // bindings point into rb, which changes
    ocl_dev_release(c, r->m, r->n); // the driver keeps it until queued work that uses it is done
    munmap(r->base, r->n);
    c->rb[i] = c->rb[--c->n_rb];
    return;
  }
}

int ocl_copy(struct ll_backend *b, void *dst, const void *src, size_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!n) return 0;
  const struct rbuf *rd = NULL, *rs = NULL;
  size_t od = 0, os = 0;
  const int id = ocl_resident(c, dst, n, &rd, &od), is = ocl_resident(c, src, n, &rs, &os);
  if (id < 0 || is < 0) return LL_EINVAL;
  if (id && is) return ocl_cl_rc(clEnqueueCopyBuffer(c->q, rs->m, rd->m, os, od, n, 0, NULL, NULL));
  if (id) return ocl_upload(c, rd->m, od, src, n);
  if (is) return ocl_download(c, dst, rs->m, os, n);
  memmove(dst, src, n);
  return 0;
}

int ocl_zero(struct ll_backend *b, void *dst, size_t n) {
  struct ocl_ctx *c = CTX(b);
  if (!n) return 0;
  const struct rbuf *r = NULL;
  size_t off = 0;
  const int in = ocl_resident(c, dst, n, &r, &off);
  if (in < 0) return LL_EINVAL;
  if (!in) {
    memset(dst, 0, n);
    return 0;
  }
  const unsigned char zero = 0;
  return ocl_cl_rc(clEnqueueFillBuffer(c->q, r->m, &zero, 1, off, n, 0, NULL, NULL));
}

// ---------------------------------------------------------------- info, free

void ocl_get_info(struct ll_backend *b, struct ll_backend_info *info) {
  struct ocl_ctx *c = CTX(b);
  *info = c->info;
  info->mem_used = c->mem_used;
  info->bytes_up = c->bytes_up, info->bytes_down = c->bytes_down, info->waits = c->waits;
  info->idle_waits = c->idle_waits, info->queue_ahead = c->queue_ahead;
  info->launches = c->launches, info->arg_sets = c->arg_sets, info->fast_launches = c->fast_launches;
  info->train_fast_launches = c->train_fast_launches, info->split_launches = c->split_launches;
  info->gemm_launches = c->gemm_launches;
  snprintf(info->tier, sizeof info->tier, "%s", c->fast ? "fast" : "reference");
}

void ocl_free(struct ll_backend *b) {
  if (!b) return;
  struct ocl_ctx *c = CTX(b);
  if (c) {
    if (c->q) clFinish(c->q);
    for (int t = c->tk_first; t < c->tk_next; t++) clReleaseEvent(c->tk[t % LL_READ_TICKETS].ev);
    for (int i = 0; i < c->n_w; i++) {
      ocl_release_mem(c->w[i]->m);
      if (c->w[i]->fk.k) clReleaseKernel(c->w[i]->fk.k);
      free(c->w[i]);
    }
    free(c->w);
    for (int i = 0; i < c->n_kv; i++)
      if (c->kv[i].m) ocl_release_mem(c->kv[i].m);
    free(c->kv);
    for (int i = 0; i < S_COUNT; i++) {
      if (c->s[i].sub) ocl_release_mem(c->s[i].sub);
      if (c->s[i].m) ocl_release_mem(c->s[i].m);
    }
    for (int i = 0; i < c->n_cc; i++) {
      ocl_release_mem(c->cc[i].m);
      free(c->cc[i].copy);
    }
    for (int i = 0; i < c->n_rb; i++) { // buffers the caller did not free
      ocl_release_mem(c->rb[i].m);
      munmap(c->rb[i].base, c->rb[i].n);
    }
    free(c->rb);
    free(c->arena);
    for (int i = 0; i < c->n_pend; i++) free(c->pend[i].rs), free(c->pend[i].tg); // never read: the queue failed
    free(c->pend);
    cl_kernel ks[] = {c->k_quant, c->k_round, c->k_mm_f, c->k_gr_f, c->k_gr_q, c->k_rmsnorm, c->k_rope, c->k_swiglu, c->k_geglu, c->k_add, c->k_kv_store,
                      c->k_attention, c->k_deq, c->k_mm_dx, c->k_mm_dw, c->k_mm_dx_t, c->k_mm_dw_t, c->k_gemm_t, c->k_attn_rows_sm, c->k_attn_rows_ds, c->k_mm_dx_qt, c->k_lora_fwd,
                      c->k_rms_bwd, c->k_rms_dg, c->k_rope_bwd, c->k_swiglu_bwd,
                      c->k_attn_train, c->k_attn_bwd_q, c->k_attn_bwd_kv, c->k_xent, c->k_gr_bwd, c->k_dropout, c->k_sumsq, c->k_axpy,
                      c->k_scale, c->k_adamw, c->k_geglu_bwd,
                      c->k_flash_fwd, c->k_flash_dq, c->k_flash_dkv};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
      if (ks[i]) clReleaseKernel(ks[i]);
    for (int t = 0; t < LL_TYPE_COUNT; t++) {
      if (c->k_mm[t]) clReleaseKernel(c->k_mm[t]);
      if (c->k_fmm[t]) clReleaseKernel(c->k_fmm[t]);
      if (c->k_fmmt[t]) clReleaseKernel(c->k_fmmt[t]);
      if (c->k_gmm[t]) clReleaseKernel(c->k_gmm[t]);
    }
    if (c->k_rope_kv) clReleaseKernel(c->k_rope_kv);
    if (c->k_argmax) clReleaseKernel(c->k_argmax);
    if (c->k_attn_fast) clReleaseKernel(c->k_attn_fast);
    if (c->k_attn_split) clReleaseKernel(c->k_attn_split);
    if (c->split_part) ocl_release_mem(c->split_part);
    if (c->split_cnt) ocl_release_mem(c->split_cnt);
    if (c->k_sample) clReleaseKernel(c->k_sample);
    for (int t = 0; t < LL_TYPE_COUNT; t++)
      if (c->k_fmmi[t]) clReleaseKernel(c->k_fmmi[t]);
    if (c->k_dot_probe) clReleaseKernel(c->k_dot_probe);
    if (c->dprog) clReleaseProgram(c->dprog);
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
    .geglu = ocl_geglu,
    .add = ocl_add,
    .matmul_backward = ocl_matmul_backward,
    .rmsnorm_backward = ocl_rmsnorm_backward,
    .rope_backward = ocl_rope_backward,
    .swiglu_backward = ocl_swiglu_backward,
    .attention_train = ocl_attention_train,
    .geglu_backward = ocl_geglu_backward,
    .attention_train_swa = ocl_attention_train_swa,
    .attention_backward = ocl_attention_backward,
    .attention_train_flash = ocl_attention_train_flash,
    .attention_backward_flash = ocl_attention_backward_flash,
    .softmax_xent = ocl_softmax_xent,
    .get_rows_backward = ocl_get_rows_backward,
    .dropout = ocl_dropout,
    .sumsq = ocl_sumsq,
    .axpy = ocl_axpy,
    .scale = ocl_scale,
    .adamw = ocl_adamw,
    .matmul_lora = ocl_matmul_lora,
    .adamw_split = ocl_adamw_split,
    .alloc = ocl_alloc,
    .free_buf = ocl_free_buf,
    .copy = ocl_copy,
    .zero = ocl_zero,
    .sync = ocl_sync,
    .fused_matmul = ocl_fused_matmul,
    .rope_kv_store = ocl_rope_kv_store,
    .argmax = ocl_argmax,
    .sample = ocl_sample,
    .read_async = ocl_read_async,
    .read_wait = ocl_read_wait,
};

// A device string, truncated to cap (drivers' version strings can be long: PoCL's names its
// build options; a too-small buffer would be an error, not a truncation).
void ocl_dev_str(cl_device_id d, cl_device_info what, char *out, size_t cap) {
  char buf[1024];
  out[0] = 0;
  if (clGetDeviceInfo(d, what, sizeof buf, buf, NULL) != CL_SUCCESS) return;
  buf[sizeof buf - 1] = 0;
  const size_t n = strnlen(buf, cap - 1);
  memcpy(out, buf, n);
  out[n] = 0;
}

// A backend with an empty context, counting its device memory in share (NULL: a new count).
struct ll_backend *ocl_instance_new(struct ocl_share *share) {
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
  if (e != CL_SUCCESS || np == 0) return ll_errf(err, errlen, LL_ENOTFOUND, "opencl: no platform (%s)", ocl_cl_errname(e));
  if (plat < 0 || (cl_uint)plat >= np || plat >= 16) return ll_errf(err, errlen, LL_ENOTFOUND, "opencl: no platform %d (%u found)", plat, np);
  cl_device_id devs[16];
  cl_uint nd = 0;
  e = clGetDeviceIDs(plats[plat], CL_DEVICE_TYPE_ALL, 16, devs, &nd);
  if (e != CL_SUCCESS || dev < 0 || (cl_uint)dev >= nd || dev >= 16)
    return ll_errf(err, errlen, LL_ENOTFOUND, "opencl: platform %d has no device %d (%u found)", plat, dev, e == CL_SUCCESS ? nd : 0);
  struct ll_backend *b = ocl_instance_new(NULL);
  if (!b) return ll_errf(err, errlen, LL_ENOMEM, "opencl: out of memory");
  struct ocl_ctx *c = CTX(b);
  c->plat = plats[plat], c->dev = devs[dev];
  struct ll_backend_info *in = &c->info;
  snprintf(in->name, sizeof in->name, "opencl");
  ocl_dev_str(c->dev, CL_DEVICE_NAME, in->device, sizeof in->device);
  ocl_dev_str(c->dev, CL_DEVICE_VENDOR, in->vendor, sizeof in->vendor);
  ocl_dev_str(c->dev, CL_DRIVER_VERSION, in->driver, sizeof in->driver);
  ocl_dev_str(c->dev, CL_DEVICE_VERSION, in->version, sizeof in->version);
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
  // LL_OPENCL_QUEUE_AHEAD=0: no read one step behind (read_async answers LL_EUNSUPPORTED), so
  // every decode step waits for its ids before the next is queued; 1: reads one step behind.
  // Unset: on GPUs and accelerators; off on CPU devices (PoCL), where the host's queueing and
  // the device's kernels share the same cores (SmolLM2 on two busy cores: 5-20% slower queued).
  const char *qa = getenv("LL_OPENCL_QUEUE_AHEAD");
  c->queue_ahead = qa && *qa ? strcmp(qa, "0") != 0 : (dtype & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0;
  int rc = 0;
  if (strncmp(in->version, "OpenCL ", 7) != 0 || (in->version[7] == '1' && in->version[9] < '2'))
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "opencl: %s reports '%s'; OpenCL 1.2 or later is needed", in->device, in->version);
  if (rc == 0) {
    c->cx = clCreateContext(NULL, 1, &c->dev, NULL, NULL, &e);
    if (!c->cx) rc = ll_errf(err, errlen, ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_EIO, "opencl: clCreateContext: %s (%d)", ocl_cl_errname(e), e);
  }
  if (rc == 0) {
    c->q = clCreateCommandQueue(c->cx, c->dev, 0, &e);
    if (!c->q) rc = ll_errf(err, errlen, ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_EIO, "opencl: clCreateCommandQueue: %s (%d)", ocl_cl_errname(e), e);
  }
  size_t wg = 0;
  if (rc == 0 && (clGetDeviceInfo(c->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) != CL_SUCCESS || wg < WG))
    rc = ll_errf(err, errlen, LL_EUNSUPPORTED, "opencl: %s allows work-groups of %zu, %d are needed", in->device, wg, WG);
  if (rc == 0) rc = ocl_build_program(c, cache_dir, err, errlen);
  if (rc == 0) rc = ocl_make_kernels(c, err, errlen);
  if (rc == 0) ocl_dot_setup(c, cache_dir); // never fails: falls back to portable dots, or none
  if (rc == 0) rc = ocl_self_test(b, err, errlen);
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
  struct ll_backend *b = ocl_instance_new(pc->share);
  if (!b) return ll_errf(err, errlen, LL_ENOMEM, "opencl: out of memory");
  struct ocl_ctx *c = CTX(b);
  // The peer's device, context (its buffers), program and accounting; a queue, kernels (their
  // arguments are per object), staging and buffers of its own.
  c->plat = pc->plat, c->dev = pc->dev, c->info = pc->info, c->info.mem_used = 0;
  c->mem_total = pc->mem_total, c->max_alloc = pc->max_alloc, c->addr_align = pc->addr_align;
  c->no_fp64 = pc->no_fp64, c->cache_hit = pc->cache_hit, c->fast = pc->fast, c->queue_ahead = pc->queue_ahead;
  // Testing aid: the server's trainer instance out of memory for its buffers (the weights fit).
  const char *fault = getenv("LL_OPENCL_FAULT");
  c->no_alloc = fault && strcmp(fault, "train_alloc") == 0;
  c->cx = pc->cx, clRetainContext(c->cx);
  c->prog = pc->prog, clRetainProgram(c->prog);
  c->dot = pc->dot, c->dprog = pc->dprog; // the integer-dot program the peer chose (its kernels: ocl_make_kernels)
  if (c->dprog) clRetainProgram(c->dprog);
  cl_int e;
  int rc = 0;
  c->q = clCreateCommandQueue(c->cx, c->dev, 0, &e);
  if (!c->q) rc = ll_errf(err, errlen, ocl_cl_rc(e) ? ocl_cl_rc(e) : LL_EIO, "opencl: clCreateCommandQueue: %s (%d)", ocl_cl_errname(e), e);
  if (rc == 0) rc = ocl_make_kernels(c, err, errlen);
  if (rc) {
    ocl_free(b);
    return rc;
  }
  *out = b;
  return 0;
}

int ll_backend_opencl_cache_hit(const struct ll_backend *b) { return b && b->i == &ocl_iface ? CTX(b)->cache_hit : 0; }
