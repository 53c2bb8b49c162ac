// ll_cpu_train.h - the training members of struct ll_backend_i on the CPU.
//
// Two implementations of every member, same signatures as the members:
// - ll_train_ref_*: plain scalar references (train_ref.c), forward and backward side by side,
//   one element at a time. They do not use `b` (pass any backend or NULL), so a backend without a
//   member trains through them: `(b->i->x ? b->i : ll_cpu_train_ref())->x(b, ...)`.
// - ll_train_cpu_*: the fast versions (train.c) over the CPU backend's thread pool and OpenBLAS;
//   `b` must be a CPU backend. They are what cpu_iface holds, tested against the references.
// Results of both are deterministic bit for bit for a fixed thread count; the fast versions'
// work split depends on the shapes only, so they are also independent of the thread count.
#ifndef LL_CPU_TRAIN_H
#define LL_CPU_TRAIN_H

#include <stdint.h>

#include "ll_backend.h"

// A table holding only the training members (references) and geglu (the trainer's fallback); the others are NULL.
const struct ll_backend_i *ll_cpu_train_ref(void);

// ---- scalar references (train_ref.c) ----
int ll_train_ref_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x,
                                 const struct ll_weight *w, int T);
int ll_train_ref_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g,
                                  int T, int C, float eps);
int ll_train_ref_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim,
                               const struct ll_rope_params *p);
int ll_train_ref_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, int64_t n);
int ll_train_ref_geglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n);
// out = gelu_tanh(gate) * up with libm's tanhf (the trainer's geglu where a backend has none)
int ll_train_ref_geglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n);
int ll_train_ref_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v,
                                 int S, int n_head, int n_head_kv, int head_dim, float scale);
int ll_train_ref_attention_train_swa(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v,
                                     int S, int n_head, int n_head_kv, int head_dim, float scale, int window);
int ll_train_ref_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *att, int S, int n_head, int n_head_kv,
                                    int head_dim, float scale);
int ll_train_ref_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets,
                              int T, int V, float grad_scale);
int ll_train_ref_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C);
int ll_train_ref_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n);
int ll_train_ref_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n);
int ll_train_ref_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n);
int ll_train_ref_scale(struct ll_backend *b, float *x, float alpha, int64_t n);
int ll_train_ref_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float wd, int step);

// ---- fast versions (train.c; b is a CPU backend) ----
int ll_train_cpu_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x,
                                 const struct ll_weight *w, int T);
int ll_train_cpu_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g,
                                  int T, int C, float eps);
int ll_train_cpu_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim,
                               const struct ll_rope_params *p);
int ll_train_cpu_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, int64_t n);
int ll_train_cpu_geglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n);
int ll_train_cpu_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v,
                                 int S, int n_head, int n_head_kv, int head_dim, float scale);
int ll_train_cpu_attention_train_swa(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v,
                                     int S, int n_head, int n_head_kv, int head_dim, float scale, int window);
int ll_train_cpu_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *att, int S, int n_head, int n_head_kv,
                                    int head_dim, float scale);
int ll_train_cpu_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets,
                              int T, int V, float grad_scale);
int ll_train_cpu_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C);
int ll_train_cpu_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n);
int ll_train_cpu_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n);
int ll_train_cpu_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n);
int ll_train_cpu_scale(struct ll_backend *b, float *x, float alpha, int64_t n);
int ll_train_cpu_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float wd, int step);
void *ll_train_cpu_alloc(struct ll_backend *b, size_t n);
void ll_train_cpu_free_buf(struct ll_backend *b, void *p);

// The CPU backend's pieces train.c works with (backend_cpu.c).
struct ll_threadpool;
struct ll_cpu_train; // train.c's scratch (per-thread panels, attention gradients)
struct ll_threadpool *ll_cpu_backend_pool(struct ll_backend *b);
struct ll_cpu_train **ll_cpu_backend_train(struct ll_backend *b); // lazily created by train.c
void ll_cpu_train_free(struct ll_cpu_train *t);                   // accepts NULL
int64_t ll_cpu_train_mem_used(struct ll_cpu_train *t);            // bytes held through alloc (NULL: 0)

// AdamW's loop 8 at a time (train_avx2.c; only where the CPU has AVX2), the scalar loop's bits.
void ll_train_adamw_avx2(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps, float wd,
                         float bc1, float bc2);

// ---- shared definitions: kernels/ll_ref.h (dropout's RNG, RoPE angles; the OpenCL backend's too)
#include "ll_ref.h"

#endif
