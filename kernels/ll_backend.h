// ll_backend.h - the compute backend interface (one struct of function pointers per backend).
//
// The model code (server/engine/engine.c) composes a Llama forward/backward pass from these calls and
// knows nothing of how a backend computes. The CPU backend (kernels/cpu/) is the first
// implementation and the reference; the OpenCL backend (kernels/opencl/) slots in later.
//
// Conventions
// - Activations are f32, row-major; shape comments give (rows, cols) with cols contiguous.
// - Weights are `struct ll_weight`: a 2-D matrix (N rows of K elements, GGUF ne = {K, N}) in any
//   supported ll_type, kept quantized; backends dequantize on the fly.
// - Buffers: activations, gradients, adapters and optimizer state live in backend buffers
//   (ll_backend_alloc). On the CPU backend they are host memory. On a device backend (one
//   with the `copy` member) a buffer is device memory named by a host address that the host
//   must never dereference: its bytes move only through ll_backend_copy / ll_backend_zero,
//   and every op takes such a pointer (or one inside such a buffer) and computes in place on
//   the device, so ops queue one after another with no host round trip. An op also accepts
//   plain host memory for any float operand (uploaded, and results read back, per call: the
//   convention before buffers were device-resident, still used by the tests' reference
//   comparisons). Index arrays (ids, pos, targets, block tables), norm weights passed as
//   `const float *g` that are not backend buffers, and scalar results (loss, sumsq) are host
//   memory. The OpenCL backend keeps weights (weight_upload) and the KV cache on the device
//   too: for it a KV pool pointer (ll_kv_view.k/v) only names a device pool, whose contents
//   never return to the host.
// - Every op returns 0 or a negative LL_E* code; ops are synchronous unless `sync` is provided.
//   An op may also take index arrays (get_rows' ids) in a backend buffer, and argmax / sample
//   may write their ids into one: then nothing is read back, and a decode step can take its
//   input ids from the previous step's choice on the device (read_async, ll_engine_decode_queue).
// - Members marked (optional) may be NULL; callers check and fall back to the CPU backend.
#ifndef LL_BACKEND_H
#define LL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct ll_backend;

struct ll_weight {
  int type;           // enum ll_type
  int64_t k;          // elements per row (ne[0]); multiple of the type's block size
  int64_t n;          // rows (ne[1])
  const void *data;   // n * ll_row_size(type, k) bytes
  void *dev;          // backend-private handle (device copy), NULL on CPU
  // (optional) The CPU kernels' interleaved copy of the first n - n % 8 rows (ll_cpu_weight_pack),
  // read by decode-sized products instead of data; NULL when the type or the CPU has none.
  const void *packed;
};

enum ll_rope_mode { LL_ROPE_NORMAL = 0, LL_ROPE_NEOX = 2 }; // ggml's numbering

struct ll_rope_params {
  int mode;            // LL_ROPE_NORMAL: rotate (x[2i], x[2i+1]); NEOX: (x[i], x[i + n_rot/2])
  int n_rot;           // rotated dims per head (<= head_dim, even)
  float freq_base;     // theta
  float freq_scale;    // 1 / linear scaling factor
  const float *freq_factors; // (n_rot/2) per-frequency divisors of theta (llama-3 rope_freqs, Phi-3's
                             // LongRoPE rope_factors_long/short), or NULL
  float attn_factor;   // cos and sin multiplied by it (ggml's mscale: Phi-3's rope.scaling.attn_factor);
                       // 0 (left unset) reads as 1
};

// Paged KV cache view for one layer. Each block stores LL_KV_BLOCK positions:
//   k: (n_blocks, block, n_head_kv, head_dim) in kv_type (f16 or f32), same for v.
struct ll_kv_view {
  int kv_type;         // LL_TYPE_F16 or LL_TYPE_F32
  int block;           // positions per block
  int n_head_kv, head_dim;
  void *k, *v;         // pool base for this layer
  const int32_t *block_table; // logical block -> physical block, for this sequence
  int window;          // sliding-window attention: a query at pos attends to (pos - window, pos]; 0: [0, pos]
};

struct ll_backend_info {
  char name[16];          // "cpu", "opencl"
  char device[128];       // "AMD Ryzen ... (2 threads, AVX-512)" / GPU name
  int compute_units;
  int64_t mem_total;      // bytes, -1 if unknown
  int64_t mem_used;       // bytes, -1 if unknown (OpenCL: our own allocations, counted)
  // Device details (OpenCL; empty / 0 for the CPU backend).
  char vendor[64];
  char driver[64];        // driver version
  char version[64];       // "OpenCL 3.0 CUDA"
  int64_t max_alloc;      // largest single buffer, bytes
  int fp16, subgroups;    // cl_khr_fp16, cl_khr_subgroups reported (not required)
  int fp64;               // cl_khr_fp64: the kernels then reproduce the CPU's results bit for bit
  int cl_platform, cl_device; // OpenCL: P and D of opencl:P:D (another instance on the same device)
  int64_t bytes_up, bytes_down; // host -> device and device -> host bytes moved so far (0 on the CPU)
  int64_t waits;                // times the host waited for the device (blocking reads, finishes)
  int64_t idle_waits;           // of those, waits with no kernel queued behind what they waited for: the
                                // device ran dry while the host waited (every blocking read; a read_wait
                                // whose step had no next step queued behind it)
  int queue_ahead;              // 1: read_async / read_wait serve (a decode step may be queued behind the
                                // previous one before its ids reach the host); 0: off (LL_OPENCL_QUEUE_AHEAD; default on GPUs)
  int64_t launches;             // kernels queued so far (0 on the CPU)
  int64_t arg_sets;             // kernel arguments set so far (clSetKernelArg; the fast tier's products keep theirs)
  int64_t fast_launches;        // of those, the fast tier's kernels (llsrv_fast.cl: products, rope_kv, attention)
  int64_t train_fast_launches;  // of those, the fast tier's training kernels (train_fast.cl: tiled products, attention, LoRA forward)
  int64_t split_launches;       // of the fast ones, split-K decode attention (llsrv_split.cl attn_split)
  int64_t gemm_launches;        // of the fast ones, the prompt products' GEMM tiles (llsrv_gemm.cl)
  char tier[12];                // OpenCL: "reference" or "fast" (LL_OPENCL_REFERENCE); "" on the CPU
  char dot[12];                 // OpenCL: the fast tier's integer dots - "ptx", "khr", "portable" or "off" (LL_OPENCL_DOT); "" on the CPU
  char dot_note[512];           // why dot is not what was asked for or what the device offers ("" when it is)
};

// A sampling step a device takes where the logits are (ll_backend_i.sample): top-k (1 ..
// LL_SAMPLE_DEV_K), top-p, min-p, temperature and the draw, made by the host's sampler
// (server/engine/ll_sample.h ll_sampler_dev_next).
#define LL_SAMPLE_DEV_K 64
struct ll_sample_dev {
  float temperature;    // <= 0: the argmax
  float top_p, min_p;   // 1, 0: off
  float log_min_p;      // logf(min_p), as the host computes it
  int top_k;            // 1 .. LL_SAMPLE_DEV_K
  uint32_t u_hi, u_lo;  // the draw: u = (u_hi << 32 | u_lo) / 2^53, in [0, 1)
  // Penalties before the chain (the host's order: repetition, frequency, presence), applied to
  // the row's logits in place, as the host sampler does; none where n_pen is 0. pen (n_pen, 2):
  // each token of the window once, with its count in the window (the caller's memory, valid
  // until the step has run; n_pen <= LL_SAMPLE_DEV_PEN).
  float repeat_penalty, frequency_penalty, presence_penalty;
  int n_pen;
  const int32_t *pen;
};
#define LL_SAMPLE_DEV_PEN 4096

// fused_matmul's op: how the product meets out
enum ll_fuse_op { LL_FUSE_SET = 0, LL_FUSE_ADD = 1, LL_FUSE_SWIGLU = 2 };

struct ll_backend_i {
  void (*free)(struct ll_backend *b);
  void (*get_info)(struct ll_backend *b, struct ll_backend_info *info);

  // ---- weights ----
  // (optional) make a weight resident on the device (fills w->dev); CPU: NULL.
  int (*weight_upload)(struct ll_backend *b, struct ll_weight *w);
  void (*weight_release)(struct ll_backend *b, struct ll_weight *w); // (optional)

  // ---- forward ops ----
  // out (T, N) = x (T, K) · W (N, K)ᵀ     [+= when accumulate]
  int (*matmul)(struct ll_backend *b, float *out, const float *x, const struct ll_weight *w,
                int T, int accumulate);
  // (optional) out[i] (T, w[i]->n) = x (T, K) · w[i] (N_i, K)ᵀ for i < n (<= 4): the same
  // results as n matmul calls (bit for bit), in one call so that a backend can share the work
  // of the same input (q, k, v; gate, up): the CPU backend quantizes x once and hands all the
  // rows to its threads at once. NULL: ll_backend_matmul_n makes the n calls.
  int (*matmul_n)(struct ll_backend *b, int n, float *const out[], const float *x, const struct ll_weight *const w[], int T);
  // out (T, C) = W[ids[t], :] dequantized   (embedding lookup)
  int (*get_rows)(struct ll_backend *b, float *out, const struct ll_weight *w, const int32_t *ids, int T);
  // out (T, C) = x / rms(x) * g            (out may alias x)
  int (*rmsnorm)(struct ll_backend *b, float *out, const float *x, const float *g, int T, int C, float eps);
  // x (T, n_head, head_dim) rotated in place at positions pos (T)
  int (*rope)(struct ll_backend *b, float *x, const int32_t *pos, int T, int n_head, int head_dim,
              const struct ll_rope_params *p);
  // Store k, v (T, n_head_kv, head_dim) at positions pos (T) of a sequence into the cache.
  int (*kv_store)(struct ll_backend *b, const struct ll_kv_view *kv, const float *k, const float *v,
                  const int32_t *pos, int T);
  // Causal attention of one sequence: q (T, n_head, head_dim) at positions pos (T) attends to
  // cache positions [0, pos[t]] (or the window of kv->window); out (T, n_head, head_dim); scores times scale.
  // Grouped-query: head h reads kv head h / (n_head / n_head_kv).
  int (*attention)(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv,
                   const int32_t *pos, int T, int n_head, float scale);
  // (optional) The same for n_seq sequences in one call (one dispatch instead of one per
  // sequence in a batched decode step): sequence i owns rows [t0[i], t0[i] + nt[i]) of q, out
  // and pos, and its cache view kv[i]. Each sequence's results are those attention gives it.
  int (*attention_multi)(struct ll_backend *b, float *out, const float *q, const struct ll_kv_view *kv, const int32_t *pos,
                         const int *t0, const int *nt, int n_seq, int n_head, float scale);
  // out (T, F) = silu(gate) * up
  int (*swiglu)(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n);
  // (optional) out (T, F) = gelu_tanh(gate) * up (GeGLU). With ggml_math, llama.cpp's CPU
  // values: gelu read at f16(gate) from a table of f16(gelu(h)) (ggml's GGML_GELU_FP16), 0
  // below -10, gate itself above 10; else 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  int (*geglu)(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n);
  // out = a + b (n)
  int (*add)(struct ll_backend *b, float *out, const float *a, const float *x, int64_t n);

  // ---- memory ----
  // (optional) n bytes of backend memory for activations, gradients, adapters and optimizer
  // state, zeroed, 64-byte aligned; NULL when out of memory. Host memory on the CPU, device
  // memory on a backend with `copy` (see Buffers above). Through ll_backend_alloc() /
  // ll_backend_free_buf() (kernels/device.c), which fall back to aligned host memory. The
  // trainer and the engine allocate every buffer they compute on this way, never with malloc.
  void *(*alloc)(struct ll_backend *b, size_t n);
  void (*free_buf)(struct ll_backend *b, void *p);                                         // (optional)

  // ---- training (optional: a backend without them trains through the CPU backend's
  //      scalar references in kernels/cpu/train_ref.c; fast versions beside them) ----
  // dx (T, K) += dout (T, N) · W (N, K)          (dx may be NULL; W of any type, dequantized)
  // dw (N, K) += dout (T, N)ᵀ · x (T, K)         (dw may be NULL; only for F32 W)
  int (*matmul_backward)(struct ll_backend *b, float *dx, float *dw, const float *dout,
                         const float *x, const struct ll_weight *w, int T);              // (optional)
  // dx (T, C) += ∂/∂x of out = x / rms(x) * g;  dg (C) += ∂/∂g (dg may be NULL)
  int (*rmsnorm_backward)(struct ll_backend *b, float *dx, float *dg, const float *dout,
                          const float *x, const float *g, int T, int C, float eps);       // (optional)
  // dx (T, n_head, head_dim) in place: the transposed (inverse) rotation of rope at pos
  int (*rope_backward)(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head,
                       int head_dim, const struct ll_rope_params *p);                      // (optional)
  // dgate, dup (n) = gradients of out = silu(gate) * up given dout (n)   (overwritten)
  int (*swiglu_backward)(struct ll_backend *b, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, int64_t n);                   // (optional)
  // dgate, dup (n) = gradients of out = gelu_tanh(gate) * up given dout (n)   (overwritten):
  // the analytic derivative of the tanh form (the f16 table of geglu's ggml_math forward is
  // that function within f16 rounding: a backward of the table itself would be 0 almost everywhere)
  int (*geglu_backward)(struct ll_backend *b, float *dgate, float *dup, const float *dout,
                        const float *gate, const float *up, int64_t n);                    // (optional)
  // Causal self-attention of one sequence of S tokens, no cache (training):
  //   q (S, n_head, hd), k, v (S, n_head_kv, hd) -> out (S, n_head, hd);
  //   att (n_head, S, S) receives the softmax probabilities (row i covers 0..i, the rest 0),
  //   kept for the backward pass. Grouped-query as attention. scale = 1/sqrt(hd).
  int (*attention_train)(struct ll_backend *b, float *out, float *att, const float *q,
                         const float *k, const float *v, int S, int n_head, int n_head_kv,
                         int head_dim, float scale);                                        // (optional)
  // The same with a sliding window (a local layer's): query i sees keys (i - window, i] only, and
  // att is 0 outside them (window <= 0: all of 0..i, attention_train's results). The backward is
  // attention_backward's: it reads the window from att's zeros.
  int (*attention_train_swa)(struct ll_backend *b, float *out, float *att, const float *q,
                             const float *k, const float *v, int S, int n_head, int n_head_kv,
                             int head_dim, float scale, int window);                        // (optional)
  // Its backward: dq (S, n_head, hd) overwritten; dk, dv (S, n_head_kv, hd) overwritten
  // (each kv head sums the gradients of the query heads that share it).
  int (*attention_backward)(struct ll_backend *b, float *dq, float *dk, float *dv,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *att, int S, int n_head, int n_head_kv, int head_dim,
                            float scale);                                                   // (optional)
  // Flash-style training attention (optional; a device's fast tier): as attention_train_swa
  // (window <= 0 or >= S: causal over 0..i), but instead of the probabilities it keeps
  // lse (n_head, S), each row's logsumexp of its scaled scores (log Σ_j exp(scale q_i·k_j) over
  // the keys it sees): S floats per head where att took S x S. The backward recomputes the
  // probabilities from q, k and lse, with out (the forward's) for D_i = Σ dout_i·out_i; dq, dk,
  // dv as attention_backward's. Both answer LL_EUNSUPPORTED where the backend cannot run the
  // shape (the OpenCL reference tier, head_dim past the kernels' limit), also for S = 0, which
  // reads no pointer: the trainer's probe before it sizes its saved activations.
  int (*attention_train_flash)(struct ll_backend *b, float *out, float *lse, const float *q,
                               const float *k, const float *v, int S, int n_head, int n_head_kv,
                               int head_dim, float scale, int window);                      // (optional)
  int (*attention_backward_flash)(struct ll_backend *b, float *dq, float *dk, float *dv,
                                  const float *dout, const float *q, const float *k,
                                  const float *v, const float *out, const float *lse, int S,
                                  int n_head, int n_head_kv, int head_dim, float scale,
                                  int window);                                              // (optional)
  // Cross-entropy with a mask: rows t with targets[t] < 0 do not count.
  //   *loss = Σ_counted -log softmax(logits[t])[targets[t]]   (a sum, in double), written by
  //   the time sync returns: a device backend computing dlogits in its own buffer may finish
  //   it then (so a training step waits for the device once), the others before returning.
  //   dlogits (T, V) (if non-NULL; may alias logits) = (softmax - onehot) * grad_scale for
  //   counted rows, 0 for the others.
  int (*softmax_xent)(struct ll_backend *b, double *loss, float *dlogits, const float *logits,
                      const int32_t *targets, int T, int V, float grad_scale);             // (optional)
  // dw[ids[t], :] += dout[t, :]   (embedding backward; dw (rows, C) f32)
  int (*get_rows_backward)(struct ll_backend *b, float *dw, const float *dout,
                           const int32_t *ids, int T, int C);                               // (optional)
  // out (n) = x * keep / (1 - p), keep drawn from a counter-based RNG of (seed, index): the
  // same seed gives the same mask, so the backward pass is the same call on dout.
  int (*dropout)(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed,
                 int64_t n);                                                                // (optional)
  // *out = Σ x² (accumulated in double; for the global gradient norm)
  int (*sumsq)(struct ll_backend *b, double *out, const float *x, int64_t n);              // (optional)
  // out (n) += alpha * x   (x may be out: then out *= 1 + alpha)
  int (*axpy)(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n);   // (optional)
  // x (n) *= alpha
  int (*scale)(struct ll_backend *b, float *x, float alpha, int64_t n);                    // (optional)
  // AdamW (decoupled weight decay), step >= 1 for bias correction:
  //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  p -= lr * (m/(1-b1^step) / (sqrt(v/(1-b2^step)) + eps) + wd * p)
  int (*adamw)(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n,
               float lr, float beta1, float beta2, float eps, float wd, int step);        // (optional)
  // adamw over all n trainable values in one call, weight decay wd on the first n_decay only
  // (the trainer's packed arenas: decayed tensors first): adamw's expression per element.
  // NULL: two adamw calls.
  int (*adamw_split)(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n,
                     int64_t n_decay, float lr, float beta1, float beta2, float eps, float wd,
                     int step);                                                           // (optional)
  // The adapted linear layer's forward (LoRA), a device's fast tier: axs (T, r) = scale · xa
  // (T, K) · aᵀ (written: the backward keeps it); y (T, N) = (acc: +=) x (T, K) · wᵀ + axs · bwᵀ.
  // w (N, K) any type, a (r, K) and bw (N, r) F32; xa is x or its dropout. NULL, or
  // LL_EUNSUPPORTED for a case it does not cover: the trainer composes it from matmul and scale.
  int (*matmul_lora)(struct ll_backend *b, float *y, float *axs, const float *x, const float *xa,
                     const struct ll_weight *w, const struct ll_weight *a,
                     const struct ll_weight *bw, float scale, int T, int acc);           // (optional)

  // ---- buffer contents (optional; NULL: backend buffers are host memory and memcpy /
  //      memset do, which ll_backend_copy / ll_backend_zero then call) ----
  // n bytes from src to dst; each a backend buffer (or a pointer into one) or host memory.
  // Returns once a host dst holds the bytes and a host src may change (a device-to-device
  // copy is only queued).
  int (*copy)(struct ll_backend *b, void *dst, const void *src, size_t n);                 // (optional)
  // dst (n bytes, backend buffer or host memory) = 0
  int (*zero)(struct ll_backend *b, void *dst, size_t n);                                   // (optional)

  int (*sync)(struct ll_backend *b); // (optional) wait for queued work and complete deferred results

  // ---- fused decode ops (optional: a device's fast tier; NULL, or LL_EUNSUPPORTED for a case
  //      they do not cover, and the engine composes the same step from the ops above) ----
  // out[i] (T, w[i]->n) (op) xn (T, K) · w[i] (N_i, K)ᵀ for i < n (1..3), xn = x / rms(x) * g
  // (g (K), eps as rmsnorm), or xn = x where g is NULL. op LL_FUSE_SET: =; LL_FUSE_ADD: += (the
  // residual); LL_FUSE_SWIGLU (n == 2, w[0] gate and w[1] up of one shape): out[0] (T, N) =
  // silu(xn · w[0]ᵀ) * (xn · w[1]ᵀ), out[1] unused. Tolerances, not bits: see each backend.
  int (*fused_matmul)(struct ll_backend *b, int n, float *const out[], const float *x, const float *g, float eps,
                      const struct ll_weight *const w[], int T, int op);                     // (optional)
  // rope of q (T, n_head, hd) in place and of k (T, n_head_kv, hd) with the kv_store of k, v, for
  // n_seq sequences in one call (rows, views and positions as attention_multi); k is not changed.
  int (*rope_kv_store)(struct ll_backend *b, float *q, const float *k, const float *v, const struct ll_kv_view *kv,
                       const int32_t *pos, const int *t0, const int *nt, int n_seq, int n_head,
                       const struct ll_rope_params *p);                                       // (optional)
  // ids (rows) = the argmax of each row of logits (rows, V), the lowest id on ties: greedy
  // sampling's choice, made where the logits are (a device reads back only the ids).
  int (*argmax)(struct ll_backend *b, int32_t *ids, const float *logits, int rows, int V);  // (optional)
  // ids (rows) = each row's choice by d[row] (rows): d's penalties applied to the row (logits
  // changed in place), then the argmax where d's temperature is <= 0, else the host sampler's
  // chain for those settings and draw (server/engine/sample.c ll_sample_dev_choose), so only the
  // ids come back.
  int (*sample)(struct ll_backend *b, int32_t *ids, float *logits, int rows, int V, const struct ll_sample_dev *d); // (optional)

  // ---- reading results one step behind (optional: a device backend; NULL, or LL_EUNSUPPORTED
  //      where turned off (info.queue_ahead 0), and the engine decodes step by step) ----
  // Queue a read of n bytes of backend buffer src into host memory dst and return at once: a
  // ticket >= 0 (at most LL_READ_TICKETS outstanding: LL_EBUSY beyond), or LL_E*. dst must stay
  // valid and unread until read_wait(ticket) returns; work queued after it runs behind it.
  int (*read_async)(struct ll_backend *b, void *dst, const void *src, size_t n);                // (optional)
  // Wait for ticket's read (and all work queued before it): 0 or LL_E*. Tickets are waited in
  // the order read_async gave them (LL_EINVAL otherwise).
  int (*read_wait)(struct ll_backend *b, int ticket);                                          // (optional)
};
#define LL_READ_TICKETS 8

#define LL_BLAS_MIN_T 32

struct ll_backend {
  const struct ll_backend_i *i;
  void *ctx; // backend-private state
  // Transcendentals as the reference implementation of the model's origin computes them:
  // 1 (GGUF models, compared with llama.cpp): ggml's vectorised exp in softmax and SiLU;
  // 0 (llama.cpp's llama2.c models, compared with run.c): libm expf, one value at a time.
  int ggml_math;
  // 1 (the server): a token's results must not depend on which other tokens share its batch,
  // so batched products use the same kernels as single tokens. 0 (generate, perplexity, bench,
  // training): float weights (F32/F16/BF16) multiply batches of >= LL_BLAS_MIN_T tokens
  // through OpenBLAS sgemm, a different summation order.
  int batch_invariant;
  // 1 (the trainer may set it; 0 everywhere else): with batch_invariant 0, quantized weights
  // also multiply batches of >= LL_BLAS_MIN_T tokens by dequantize + sgemm where that beats the
  // integer tiles (CPUs without AVX-512 VNNI: 1.3-2x at T = 256, docs/PERFORMANCE.md); exact f32
  // products of the dequantized weights, as matmul_backward's. Never the serving path.
  int train_sgemm;
  // 1 (the engine sets it around a mixture-of-experts layer's expert products): every row of a
  // product summed as a one-token product is (F32 weights: ggml_vec_dot_f32, not tinyBLAS
  // tiles), as llama.cpp's mul_mat_id computes each token of an expert's batch. sgemm still
  // takes large batches where batch_invariant is 0 (as it does for the dense products).
  int row_order;
};

// ---- creation and device choice (kernels/device.c) ----
struct ll_backend_params {
  int n_threads;       // CPU worker threads (0: online CPUs)
  const char *device;  // "auto" | "cpu" | "opencl[:P[:D]]" (NULL = auto)
  const char *cache_dir; // OpenCL program binaries cached here (NULL: not cached)
};
// Creates the best backend for params->device. `reason` receives one line saying what was
// chosen and why ("cpu: no OpenCL GPU platform found"). A device that cannot be used (no ICD,
// no platform, no such device, failed build or self-test, out of memory) is a CPU fallback
// with the reason saying so, never an error; errors only for a malformed device string.
int ll_backend_create(struct ll_backend **out, const struct ll_backend_params *p, char *reason,
                      size_t reason_len, char *err, size_t errlen);
void ll_backend_free(struct ll_backend *b); // accepts NULL
// When a known vendor's OpenCL library (NVIDIA's libnvidia-opencl.so.1, ...) is installed but
// no ICD file names it: 1, with one line in out saying so and how to write the file; else 0.
// lib_dirs: ':'-separated (NULL: $LD_LIBRARY_PATH and the usual library directories); icd: the
// vendors directory or one ICD file (NULL: $OCL_ICD_VENDORS, else /etc/OpenCL/vendors).
// ll_backend_create adds it to its reason when it finds no OpenCL GPU.
int ll_opencl_icd_hint(char *out, size_t cap, const char *lib_dirs, const char *icd);
// Backend memory (see alloc above); host memory when the backend has no allocator.
void *ll_backend_alloc(struct ll_backend *b, size_t n);
void ll_backend_free_buf(struct ll_backend *b, void *p); // accepts NULL
// 1 when b's buffers are host memory the caller may read and write (the CPU backend, or b NULL).
int ll_backend_host_buffers(const struct ll_backend *b);
// Buffer contents (see copy / zero above); memcpy / memset on a host-buffer backend.
int ll_backend_copy(struct ll_backend *b, void *dst, const void *src, size_t n);
int ll_backend_sync(struct ll_backend *b); // 0 where the backend has nothing queued (no sync member)
int ll_backend_zero(struct ll_backend *b, void *dst, size_t n);
// matmul_n where the backend has it, else n matmul calls.
int ll_backend_matmul_n(struct ll_backend *b, int n, float *const out[], const float *x, const struct ll_weight *const w[], int T);

// CPU backend (always available).
int ll_backend_cpu_create(struct ll_backend **out, int n_threads, char *err, size_t errlen);
// The CPU kernels' interleaved copy of w's rows for decode (w->packed; see ll_cpu_dot.h), made
// where this CPU's kernels for w's type have one (x86 with AVX2: Q4_0, Q4_1, Q5_0, Q8_0 and
// the K-quants). Returns its size in bytes (0 when none is made), or LL_ENOMEM. The caller
// owns w->packed: ll_cpu_weight_unpack frees it.
int64_t ll_cpu_weight_pack(struct ll_weight *w);
// The same into dst (64-byte aligned, cap bytes, owned by the caller; w->packed points into
// it): 0 when none is made, LL_EINVAL when it does not fit.
int64_t ll_cpu_weight_pack_into(struct ll_weight *w, void *dst, int64_t cap);
// The bytes ll_cpu_weight_pack would make for a matrix of n rows of k elements of type (0: none).
int64_t ll_cpu_packed_bytes(int type, int64_t k, int64_t n);
void ll_cpu_weight_unpack(struct ll_weight *w);
// ggml's soft_max exponentials on the CPU (ggml_vec_soft_max_f32, its AVX2 order): y[i] =
// exp(x[i] - max) for host memory; returns their sum (double). A mixture-of-experts router
// softmax is computed on the host with it, so routing matches llama.cpp's on every backend.
double ll_cpu_softmax(float *y, const float *x, float max, int n);
// Memory for weights that decode streams (the packed copies of a whole model in one block):
// 2 MiB aligned and, where the OS has transparent huge pages on request (Linux "madvise"
// mode), in huge pages - decode reads every weight once per token, and in 4 KiB pages that
// is a TLB miss every 4 KiB. NULL when out of memory; free with ll_cpu_stream_free.
void *ll_cpu_stream_alloc(size_t bytes);
void ll_cpu_stream_free(void *p);

// OpenCL backend (kernels/opencl/backend.c) on device D of platform P (indices as the
// ICD loader lists them): builds the kernels (or loads them from the binary cache in
// cache_dir), runs a warm-up and a self-test against the CPU reference. Errors name the step.
int ll_backend_opencl_create(struct ll_backend **out, int plat, int dev, const char *cache_dir, char *err, size_t errlen);
// Another instance on peer's device and context (the server's trainer beside the serving
// engine): a queue, staging and buffers of its own; weights peer uploaded are used where
// they are (one copy on the device); device memory is checked with both instances counted.
// peer must outlive it.
int ll_backend_opencl_create_beside(struct ll_backend **out, struct ll_backend *peer, char *err, size_t errlen);
// 1 when b is an OpenCL backend whose program came from the binary cache (0 otherwise).
int ll_backend_opencl_cache_hit(const struct ll_backend *b);

#endif
