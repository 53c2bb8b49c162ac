// ocl_internal.h - what the OpenCL backend's files share (kernels/opencl/*.c): the context,
// the staging slots, and every helper, named ocl_*. Not a public header: the backend's only
// entry points are ll_backend_opencl_create / _create_beside / _cache_hit (ll_backend.h).
#ifndef LL_OCL_INTERNAL_H
#define LL_OCL_INTERNAL_H
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
#include "ll_error.h"
#include "ll_quant.h"
#include "ll_ref.h"

extern const char ll_opencl_source[]; // kernels/opencl/*.cl, embedded by cmake/embed_cl.cmake

#define WG 64 // as llsrv.cl

// How the integer-dot program makes ll_dot4 (llsrv_dot.cl LL_DOT); OFF: no integer dots (the
// reference tier, LL_OPENCL_DOT=off, or no variant passed its probe).
enum { OCL_DOT_OFF = -1, OCL_DOT_PORTABLE, OCL_DOT_KHR, OCL_DOT_PTX };
#define TT 8
#define OCL_GMM_WG 128 // work items of llsrv_gemm.cl's tiles (GWG there)

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

// A kernel object with the values of its arguments as last set: ocl_karg sets an argument only
// when its value changed, so a kernel object used for one thing (a matrix's fast-tier product)
// has its arguments set once and reused step after step.
#define OCL_KARGS 20
// A released cl_mem's handle may come back as a new object's: every release (ocl_release_mem)
// bumps ocl_mem_gen, and a kernel object whose arguments were set before sets them all again.
extern _Atomic uint64_t ocl_mem_gen;
static inline cl_int ocl_release_mem(cl_mem m) {
  atomic_fetch_add(&ocl_mem_gen, 1);
  return clReleaseMemObject(m);
}
struct ocl_kargs {
  cl_kernel k;
  uint64_t gen; // ocl_mem_gen when the arguments were set
  unsigned char set[OCL_KARGS], sz[OCL_KARGS];
  unsigned char v[OCL_KARGS][8]; // every argument of these kernels is a cl_mem or a scalar of <= 8 bytes
};

struct ocl_weight {
  struct ocl_kargs fk; // the fast tier's product kernel for this matrix (its owner's instance only)
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
  cl_kernel k_quant, k_round, k_mm[LL_TYPE_COUNT], k_mm_f, k_gr_f, k_gr_q, k_rmsnorm, k_rope, k_swiglu, k_geglu, k_add, k_kv_store,
      k_attention;
  // the fast tier (llsrv_fast.cl); k_argmax serves both tiers
  cl_kernel k_fmm[LL_TYPE_COUNT], k_fmmt[LL_TYPE_COUNT], k_gmm[LL_TYPE_COUNT], k_rope_kv, k_argmax,
      k_sample, // sampling on the device (both tiers)
      k_attn_fast, // NULL where the device's local memory cannot hold its tiles (the reference's attention then)
      k_attn_split; // split-K decode attention (llsrv_split.cl); NULL with k_attn_fast
  // attn_split's state: partials (m, l, acc) and the blocks' counters (zero between launches),
  // grown as needed; split_min: positions per chunk at least (0: never split), split_max:
  // chunks per block at most (0: from the compute units); LL_OPENCL_SPLIT_KV (ops.c ocl_split_params)
  cl_mem split_part, split_cnt;
  size_t split_part_cap, split_cnt_cap;
  int split_min, split_max;
  // The fast tier's integer-dot decode products (llsrv_dot.cl, a program of its own: dprog),
  // NULL for the types without one and where dot is OCL_DOT_OFF; k_dot_probe its self-check.
  cl_program dprog;
  cl_kernel k_fmmi[LL_TYPE_COUNT], k_dot_probe;
  int dot; // OCL_DOT_*: how ll_dot4 is made (program.c ocl_dot_setup, LL_OPENCL_DOT)
  int fast; // 1: the fast tier's kernels (fused ops, f32 activations); 0: the reference tier
  int train_tiled; // fast, and the device runs train_fast.cl's 16 x 16 work-groups (ocl_make_kernels)
  // training (train.cl)
  cl_kernel k_deq, k_mm_dx, k_mm_dw, k_mm_dx_t, k_mm_dw_t, // (_t: the fast tier's tiled ones, train_fast.cl)
      k_gemm_t, k_attn_rows_sm, k_attn_rows_ds, // (train_fast.cl: attention as batched tiled products)
      k_mm_dx_qt, k_lora_fwd, // (train_fast.cl: dx through W's tiles dequantized in local memory; the LoRA forward)
       k_rms_bwd, k_rms_dg, k_rope_bwd, k_swiglu_bwd, k_attn_train, k_attn_bwd_q, k_attn_bwd_kv, k_xent,
      k_gr_bwd, k_dropout, k_sumsq, k_axpy, k_scale, k_adamw;
  // Gemma 3's (train_window.cl): GeGLU's backward (the window is attn_train's and
  // attn_rows_softmax's parameter)
  cl_kernel k_geglu_bwd;
  // flash-style training attention (train_flash.cl, the fast tier's): NULL where the device's
  // local memory cannot hold their tiles or its work-groups 256 items (attention_train_flash
  // then answers LL_EUNSUPPORTED)
  cl_kernel k_flash_fwd, k_flash_dq, k_flash_dkv;
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
  // A ring once reads are waited one step behind (ocl_read_wait): live bytes [tail, used), or
  // after a wrap [tail, end) and [0, used); a waited read frees what was queued before it.
  unsigned char *arena;
  size_t arena_cap, arena_used, arena_tail, arena_end;
  int arena_wrap;
  uint64_t arena_lap; // wraps and drains so far (a read's mark names its lap)
  // Reads queued by read_async (ll_backend.h), waited in order: ticket t in slot t % LL_READ_TICKETS.
  struct ocl_ticket {
    cl_event ev;
    size_t mark;       // arena_used when it was queued ...
    uint64_t lap;      // ... in this lap
    int64_t launches;  // launches when it was queued: none since at its wait = the device ran dry
  } tk[LL_READ_TICKETS];
  int tk_first, tk_next; // oldest outstanding ticket, next to give
  int queue_ahead;       // 0: LL_OPENCL_QUEUE_AHEAD=0 (read_async answers LL_EUNSUPPORTED)
  int64_t idle_waits;
  int64_t bytes_up, bytes_down, waits, launches, arg_sets, fast_launches, train_fast_launches, split_launches, gemm_launches;
  struct pending_loss *pend; // completed by ocl_drained()
  int n_pend, cap_pend;
  int64_t mem_used, mem_total, max_alloc; // mem_used: this instance's
  struct ocl_share *share;
  struct ll_backend_info info;
  int cache_hit; // the program came from the binary cache
  int no_alloc;  // LL_OPENCL_FAULT=train_alloc on an instance opened beside another: alloc fails
  int no_fp64;   // LL_OPENCL_NO_FP64=1: kernels built without f64 (see build_opts)
};

#define CTX(b) ((struct ocl_ctx *)(b)->ctx)

#define ARG(k, i, v) ocl_setarg(c, k, i, sizeof(v), &(v)) // counted (arg_sets)

// ---- the helpers and ops, by file

const char *ocl_cl_errname(cl_int e);
int ocl_cl_rc(cl_int e);
cl_mem ocl_dev_alloc(struct ocl_ctx *c, size_t bytes, cl_int *e);
void ocl_dev_release(struct ocl_ctx *c, cl_mem m, size_t bytes);
double ocl_xent_loss(const float *rs, const int32_t *targets, int T);
void ocl_drained(struct ocl_ctx *c);
int ocl_finish(struct ocl_ctx *c);
int ocl_upload(struct ocl_ctx *c, cl_mem dst, size_t off, const void *src, size_t bytes);
int ocl_download(struct ocl_ctx *c, void *dst, cl_mem src, size_t off, size_t bytes);
int ocl_resident(const struct ocl_ctx *c, const void *p, size_t bytes, const struct rbuf **r, size_t *off);
int ocl_grow(struct ocl_ctx *c, int slot, size_t bytes);
void ocl_unbind(struct sbuf *s);
int ocl_stage(struct ocl_ctx *c, int slot, size_t bytes);
int ocl_stage_copy(struct ocl_ctx *c, int slot, const void *p, size_t bytes, const struct rbuf *r, size_t off, int load);
int ocl_bind(struct ocl_ctx *c, int slot, const void *p, size_t bytes, int load);
int ocl_put_copy(struct ocl_ctx *c, int slot, const void *src, size_t bytes);
int ocl_put_const(struct ocl_ctx *c, int slot, const void *src, size_t bytes);
int ocl_put(struct ocl_ctx *c, int slot, const void *src, size_t bytes);
int ocl_output(struct ocl_ctx *c, int slot, void *dst, size_t bytes);
int ocl_get(struct ocl_ctx *c, int slot, void *dst, size_t bytes);
int ocl_launch(struct ocl_ctx *c, cl_kernel k, cl_uint dims, const size_t *global, const size_t *local);
cl_int ocl_karg(struct ocl_ctx *c, struct ocl_kargs *a, cl_uint i, size_t sz, const void *v);
cl_int ocl_setarg(struct ocl_ctx *c, cl_kernel k, cl_uint i, size_t sz, const void *v);
int ocl_weight_upload_impl(struct ocl_ctx *c, const struct ll_weight *w, struct ocl_weight **out);
int ocl_weight_upload(struct ll_backend *b, struct ll_weight *w);
void ocl_weight_release(struct ll_backend *b, struct ll_weight *w);
int ocl_weight_dev_in(struct ocl_ctx *c, const struct ll_weight *w, int slot, cl_mem *out);
int ocl_weight_dev(struct ocl_ctx *c, const struct ll_weight *w, cl_mem *out);
int ocl_fused_matmul(struct ll_backend *b, int n, float *const out[], const float *x, const float *g, float eps, const struct ll_weight *const w[], int T, int op);
int ocl_act_type_mode(int wtype);
int ocl_matmul(struct ll_backend *b, float *out, const float *x, const struct ll_weight *w, int T, int accumulate);
int ocl_get_rows(struct ll_backend *b, float *out, const struct ll_weight *w, const int32_t *ids, int T);
int ocl_rmsnorm(struct ll_backend *b, float *out, const float *x, const float *g, int T, int C, float eps);
int ocl_rope_tables(struct ocl_ctx *c, const int32_t *pos, int T, const struct ll_rope_params *p, float **ct, float **st);
int ocl_rope(struct ll_backend *b, float *x, const int32_t *pos, int T, int n_head, int head_dim, const struct ll_rope_params *p);
int ocl_swiglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n);
int ocl_geglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n);
int ocl_add(struct ll_backend *b, float *out, const float *a, const float *x, int64_t n);
int ocl_kv_pool(struct ocl_ctx *c, const void *host, size_t bytes, cl_mem *out);
size_t ocl_kv_elem(const struct ll_kv_view *kv);
size_t ocl_kv_block_bytes(const struct ll_kv_view *kv);
int ocl_kv_store(struct ll_backend *b, const struct ll_kv_view *kv, const float *k, const float *v, const int32_t *pos, int T);
int ocl_seq_tables(const struct ll_kv_view *kv, const int32_t *pos, const int *t0, const int *nt, int n_seq, int32_t **idx, int *rows_out, int *n_tab_out, int *max_pos_out, int *max_blk_out);
void ocl_split_params(struct ocl_ctx *c);
int ocl_attention_multi(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos, const int *t0, const int *nt, int n_seq, int n_head, float scale);
int ocl_rope_kv_store(struct ll_backend *b, float *q, const float *k, const float *v, const struct ll_kv_view *kv, const int32_t *pos, const int *t0, const int *nt, int n_seq, int n_head, const struct ll_rope_params *p);
int ocl_argmax(struct ll_backend *b, int32_t *ids, const float *logits, int rows, int V);
int ocl_sample(struct ll_backend *b, int32_t *ids, float *logits, int rows, int V, const struct ll_sample_dev *d);
int ocl_read_async(struct ll_backend *b, void *dst, const void *src, size_t n);
int ocl_read_wait(struct ll_backend *b, int ticket);
int ocl_attention(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos, int T, int n_head, float scale);
int ocl_fail(struct ocl_ctx *c, int rc);
int ocl_fbytes(const struct ocl_ctx *c, int64_t a, int64_t b, size_t *out);
int ocl_float_type(int type);
int ocl_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x, const struct ll_weight *w, int T);
int ocl_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g, int T, int C, float eps);
int ocl_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim, const struct ll_rope_params *p);
int ocl_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
int ocl_geglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
int ocl_attention_train_swa(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S, int n_head, int n_head_kv, int head_dim, float scale, int window);
int ocl_attn_check(int S, int H, int Hkv, int hd);
int ocl_attn_bytes(const struct ocl_ctx *c, int S, int H, int Hkv, int hd, size_t *qb, size_t *kb, size_t *ab);
int ocl_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v, int S, int n_head, int n_head_kv, int head_dim, float scale);
int ocl_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *att, int S, int n_head, int n_head_kv, int head_dim, float scale);
int ocl_attention_train_flash(struct ll_backend *b, float *out, float *lse, const float *q, const float *k, const float *v, int S, int n_head, int n_head_kv, int head_dim, float scale, int window);
int ocl_attention_backward_flash(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *out, const float *lse, int S, int n_head, int n_head_kv, int head_dim, float scale, int window);
int ocl_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets, int T, int V, float grad_scale);
int ocl_cmp_pair(const void *a, const void *b);
int ocl_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C);
int ocl_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n);
int ocl_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n);
int ocl_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n);
int ocl_scale(struct ll_backend *b, float *x, float alpha, int64_t n);
int ocl_matmul_lora(struct ll_backend *b, float *y, float *axs, const float *x, const float *xa, const struct ll_weight *w,
                    const struct ll_weight *a, const struct ll_weight *bw, float scale, int T, int acc);
int ocl_adamw_split(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, float lr, float beta1,
                    float beta2, float eps, float wd, int step);
int ocl_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps, float wd, int step);
int ocl_sync(struct ll_backend *b);
void *ocl_alloc(struct ll_backend *b, size_t n);
void ocl_free_buf(struct ll_backend *b, void *p);
int ocl_copy(struct ll_backend *b, void *dst, const void *src, size_t n);
int ocl_zero(struct ll_backend *b, void *dst, size_t n);
void ocl_get_info(struct ll_backend *b, struct ll_backend_info *info);
void ocl_free(struct ll_backend *b);
const char *ocl_build_opts(const struct ocl_ctx *c);
void ocl_cache_path(struct ocl_ctx *c, const char *dir, const char *src, const char *opts, char *out, size_t cap);
unsigned char *ocl_read_file(const char *path, size_t *len);
void ocl_cache_store(cl_program prog, const char *path);
void ocl_dot_setup(struct ocl_ctx *c, const char *cache_dir);
int ocl_dot_kernels(struct ocl_ctx *c);
int ocl_build_program(struct ocl_ctx *c, const char *cache_dir, char *err, size_t errlen);
int ocl_make_kernels(struct ocl_ctx *c, char *err, size_t errlen);
int ocl_self_test(struct ll_backend *b, char *err, size_t errlen);
void ocl_dev_str(cl_device_id d, cl_device_info what, char *out, size_t cap);
struct ll_backend *ocl_instance_new(struct ocl_share *share);

#endif
