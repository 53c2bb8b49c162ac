// ll_engine.h - the inference engine as the rest of the server sees it.
//
// An engine = one loaded model (weights stay quantized) + a compute backend + a thread pool
// + a paged KV cache shared by up to n_parallel sequences. It is driven from ONE thread at a
// time (the scheduler's compute thread); the engine parallelises internally on its pool.
//
// Sequences: ll_engine_seq_new() hands out a sequence slot; each decode call appends tokens
// at the sequence's current length (positions are implicit); ll_engine_seq_free() returns
// its KV blocks to the pool at once.
#ifndef LL_ENGINE_H
#define LL_ENGINE_H

#include <stddef.h>
#include <stdint.h>

struct ll_engine;
struct ll_tokenizer;

struct ll_engine_params {
  const char *model_path;  // any format ll_model_open() reads
  int n_threads;           // compute workers (0: number of online CPUs)
  int n_ctx;               // max positions per sequence (0: model's context length, capped 4096)
  int n_parallel;          // max live sequences (>= 1)
  int kv_blocks;           // KV pool size in blocks of LL_KV_BLOCK positions (0: n_ctx*n_parallel/LL_KV_BLOCK)
  int kv_f16;              // 1: K/V stored as f16 (llama.cpp's default), 0: f32, -1 (default): auto,
                           // f32 for a llama2.c model (as run.c keeps it, so greedy ids match run.c),
                           // f16 for every other source
  const char *device;      // "auto", "cpu", "opencl[:P[:D]]" (NULL = auto)
  int batch_invariant;     // 1: outputs independent of batch composition (the server; see ll_backend)
  const char *cache_dir;   // OpenCL program binary cache (e.g. <state_dir>/opencl), NULL: none
  int repack;              // 1 (default): on the CPU backend, interleaved copies of the matrices whose
                           // kernels have one, for decode (info.packed_bytes more memory); 0: none
};

#define LL_KV_BLOCK 16

struct ll_engine_info {
  char arch[32];            // "llama", "qwen2", "qwen2moe", "qwen3moe", "olmoe"
  char name[128];           // general.name or file name
  char quant[16];           // dominant weight type ("q4_1")
  char backend[16];         // "cpu", "opencl"
  char device_name[128];    // CPU model / GPU name
  char device_reason[1024];  // why this device was chosen ("no OpenCL GPU platform found")
  // Device details (OpenCL backend; empty / 0 on the CPU): see struct ll_backend_info.
  char device_vendor[64], device_driver[64], device_version[64];
  int device_fp16, device_subgroups;
  char device_dot[12];      // the fast tier's integer dots: "ptx", "khr", "portable", "off"; "" on the CPU (LL_OPENCL_DOT)
  int64_t device_mem_total, device_mem_used, device_max_alloc; // bytes; used = our allocations
  int64_t n_params;
  int64_t weight_bytes;
  // Mixture of experts (0 experts: dense): expert weights counted apart, and the parameters
  // one token computes with (the router, its k experts, the rest; the token embedding's one row)
  int n_expert, n_expert_used;
  int64_t n_params_expert, n_params_active;
  int64_t packed_bytes;     // the CPU kernels' interleaved copies of matrices (decode), 0 if none
  int packed_failed;        // repack was on but the copies could not be allocated (served without)
  int64_t kv_bytes;         // whole pool
  int n_vocab, n_ctx_train, n_ctx, n_embd, n_layer, n_head, n_head_kv, n_parallel, n_threads;
  int kv_blocks_total;
  int kv_f16;               // the K/V storage chosen (kv_f16 resolved)
};

void ll_engine_params_default(struct ll_engine_params *p);
int ll_engine_open(struct ll_engine **out, const struct ll_engine_params *p, char *err, size_t errlen);
void ll_engine_close(struct ll_engine *e); // accepts NULL

void ll_engine_get_info(const struct ll_engine *e, struct ll_engine_info *info);
// NULL for a model without a tokenizer (llama2.c .bin): then only ids are accepted.
const struct ll_tokenizer *ll_engine_tokenizer(const struct ll_engine *e);
int ll_engine_n_vocab(const struct ll_engine *e);
int ll_engine_kv_blocks_used(const struct ll_engine *e);

// ---- sequences ----
int ll_engine_seq_new(struct ll_engine *e);          // slot id >= 0, or LL_EBUSY
void ll_engine_seq_free(struct ll_engine *e, int seq);
int ll_engine_seq_len(const struct ll_engine *e, int seq);

// ---- LoRA adapters (ll_lora.h) ----
struct ll_lora;
struct ll_lora_dims;
// The shapes an adapter for this model must have.
void ll_engine_lora_dims(const struct ll_engine *e, struct ll_lora_dims *d);
// Sequence `seq` computes with adapter a (NULL: the base model) from its next decode on:
// every adapted matrix W of a layer gives W·x + (alpha/r)·B·(A·x) for this sequence's rows
// only, so sequences of one batch may use different adapters. The adapter must outlive its
// use (until another is set or the sequence is freed); seq_new/seq_free reset it to NULL.
// Errors: LL_EINVAL (bad sequence, adapter of another shape: message says which), LL_ENOMEM.
int ll_engine_seq_set_adapter(struct ll_engine *e, int seq, const struct ll_lora *a, char *err, size_t errlen);
// The sequence's next sampled token: the next ll_engine_decode whose item for seq asks for an
// argmax writes there the sampler's choice for d (ll_sampler_dev_next) instead, taken where the
// logits are (a device backend with the sample member reads back only the id), then forgets d.
// d NULL: forget it now. Errors: LL_EINVAL (bad sequence).
struct ll_sample_dev;
int ll_engine_seq_set_sample(struct ll_engine *e, int seq, const struct ll_sample_dev *d);

// ---- one forward step over a batch of sequences ----
// Item i appends tokens[0..n_tokens) to sequence seq. Logits (n_vocab floats per row):
//   logits_mode 0: none; 1: for the last token only (1 row); 2: for every token (n_tokens rows).
// Rows are written to `logits`, which the caller sizes. Items must name distinct sequences.
// Errors: LL_ELIMIT (sequence would exceed n_ctx, or KV pool exhausted: nothing is appended
// for that call), LL_EINVAL.
struct ll_batch_item {
  int seq;
  int n_tokens;
  const int32_t *tokens;
  int logits_mode;
  float *logits;
  // (optional) receives the argmax of the item's last logits row (the lowest id on ties: greedy
  // sampling's choice). A backend with the argmax member computes it where the logits are, and
  // then logits may be NULL: a device reads back 4 bytes for the item instead of the row.
  int32_t *argmax;
};
int ll_engine_decode(struct ll_engine *e, struct ll_batch_item *items, int n_items, char *err, size_t errlen);

// ---- decode steps queued one behind the other (a device backend: no wait between steps) ----
// 1 when this engine can queue a decode step before the previous one's ids reach the host: a
// device backend with read_async whose info.queue_ahead is 1 (LL_OPENCL_QUEUE_AHEAD unset or not
// 0), a dense model (a mixture of experts routes on the host), an output no wider than the embedding.
int ll_engine_queue_ok(const struct ll_engine *e);
// Queue one decode step of one token for each of seqs[0..n) (distinct sequences) whose only
// output is each sequence's choice: the argmax of its logits, or the sampling step given by
// ll_engine_seq_set_sample (then spent). Sequence seqs[i]'s token is tokens[i], or, with tokens
// NULL, the id the previous queued step chose for it, read on the device (that step must have
// had the same sequences in the same order, with no ll_engine_decode, seq_free or seq_truncate
// since). Returns without waiting for the device; each sequence's length grows by 1 at once. At
// most 2 steps outstanding (LL_EBUSY). LL_EUNSUPPORTED where ll_engine_queue_ok is 0: decode with
// ll_engine_decode instead. Other errors as ll_engine_decode's.
int ll_engine_decode_queue(struct ll_engine *e, const int *seqs, const int32_t *tokens, int n, char *err, size_t errlen);
// Wait for the oldest queued step's ids (n of them, in its order) into ids (cap): returns n or LL_E*.
int ll_engine_decode_collect(struct ll_engine *e, int32_t *ids, int cap, char *err, size_t errlen);
int ll_engine_decode_pending(const struct ll_engine *e); // queued steps not collected
// Keep the first len positions of seq (len <= its length): a step queued past a stop condition
// is undone - its positions are written again before anything reads them, and blocks past len
// go back to the pool. May be called with steps outstanding. LL_EINVAL: bad sequence or len.
int ll_engine_seq_truncate(struct ll_engine *e, int seq, int len);

#endif
