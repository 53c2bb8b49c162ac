// ll_trainer.h - training a loaded Llama-family model: LoRA adapters on frozen (quantized)
// weights, or every parameter of a small float model.
//
// The forward and backward passes are composed only from backend calls (struct ll_backend_i,
// training members; a backend without them trains through the CPU scalar references), and every
// activation, gradient, adapter and optimizer buffer comes from ll_backend_alloc, so a device
// backend can keep them resident. The trainer reads the model the engine loaded (ll_model.h);
// in LoRA mode the base weights stay in their file type and gradients flow through them with
// matmul_backward (dx only).
//
// One optimizer step = grad_accum micro-batches of `batch` sequences of seq_len tokens. The loss
// of a step is the mean over every counted target token of all its micro-batches (targets < 0 do
// not count: prompts, padding). Then: NaN/Inf check (a non-finite loss or gradient skips the
// step: counted, weights and moments untouched), global-norm clipping, AdamW with warmup then
// cosine/linear decay. Dropout on the LoRA input (PEFT semantics) draws its masks from
// (seed, micro-batch counter, layer, target), so a fixed seed and thread count give the same run
// bit for bit, and a resumed run continues the interrupted one exactly.
//
// Thread safety: one trainer is driven by one thread at a time (the caller's, or the server's
// compute thread between decode steps).
#ifndef LL_TRAINER_H
#define LL_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "ll_backend.h"
#include "ll_model.h"

struct ll_trainer;
struct ll_lora;

enum ll_train_mode { LL_TRAIN_LORA = 0, LL_TRAIN_FULL = 1 };
enum ll_train_schedule { LL_SCHED_COSINE = 0, LL_SCHED_LINEAR = 1, LL_SCHED_CONSTANT = 2 };

struct ll_trainer_params {
  int mode;              // enum ll_train_mode
  const char *arch;      // base model's general.architecture (recorded in adapters), "llama"
  const char *model_path;// full mode: the model file (its metadata goes into checkpoints)
  // LoRA
  int rank;              // r >= 1
  float alpha;           // scale = alpha / r
  unsigned targets;      // bitmask of 1u << enum ll_lora_target (ll_lora.h), non-zero
  float dropout;         // on the adapter's input, [0, 1)
  // batch
  int batch;             // sequences per micro-batch
  int seq_len;           // tokens per sequence
  int grad_accum;        // micro-batches per optimizer step
  int64_t steps;         // total optimizer steps (schedule length)
  // optimizer
  double lr;             // peak learning rate
  int64_t warmup;        // linear warmup steps (from lr/warmup to lr)
  int schedule;          // enum ll_train_schedule (after warmup, down to min_lr_ratio * lr)
  double min_lr_ratio;
  double weight_decay;   // decoupled (AdamW); not applied to norm weights in full mode
  double clip;           // global gradient norm limit; 0: off
  double beta1, beta2, adam_eps;
  uint64_t seed;         // adapter init and dropout masks
  int recompute;         // 1: keep only each layer's input; recompute the layer in backward
  double moe_aux_coef;   // mixture of experts, full mode: the load-balancing loss's coefficient (ll_moe.h)
};
void ll_trainer_params_init(struct ll_trainer_params *p); // LoRA r=16 alpha=32, all targets, ...
const char *ll_train_schedule_name(int s); // "cosine", "linear", "constant"

// Where training sequences come from (server/train/data.c adapts ll_data to it; tests feed
// arrays). next: one sequence, ids (S) and targets (S, -1 = not counted); returns >= 0 (epoch)
// or a negative LL_E* code. val_next: 1 with a sequence, 0 after the last. cursor_*: the position
// as LL_TRAIN_CURSOR_WORDS u64 words, stored in run checkpoints (may be NULL: not resumable).
#define LL_TRAIN_CURSOR_WORDS 8
struct ll_train_source {
  void *user;
  int (*next)(void *user, int32_t *ids, int32_t *targets, char *err, size_t errlen);
  int (*val_next)(void *user, int32_t *ids, int32_t *targets, char *err, size_t errlen); // (optional)
  void (*val_reset)(void *user);                                                        // (optional)
  void (*cursor_get)(void *user, uint64_t w[LL_TRAIN_CURSOR_WORDS]);                    // (optional)
  int (*cursor_set)(void *user, const uint64_t w[LL_TRAIN_CURSOR_WORDS], char *err, size_t errlen); // (optional)
};

struct ll_train_step_info {
  int64_t step;          // steps done after this one
  double loss;           // mean over counted tokens (NaN when skipped for non-finite values)
  double aux_loss;       // MoE, full mode: the load-balancing loss added to loss in the objective (0: none)
  double grad_norm;      // before clipping
  double lr;             // learning rate used
  int skipped;           // 1: non-finite loss or gradient, no update
  int64_t tokens;        // tokens processed (batch * seq_len * grad_accum)
  int epoch;             // epoch of the last sequence read
};

// Memory the trainer allocates (bytes), for the pre-flight estimate and the monitor.
struct ll_train_memory {
  int64_t weights;       // the model's weights (as loaded; full mode adds its f32 copies)
  int64_t adapters;      // trainable parameters
  int64_t grads;         // their gradients
  int64_t optimizer;     // AdamW moments
  int64_t activations;   // saved activations + backward scratch at this batch and seq_len
};

// Creates a trainer for model m on backend be (both must outlive it). LoRA mode: a fresh
// adapter (A Kaiming-uniform from seed, B zero). Full mode: f32 copies of every weight (float
// models only). Refuses bad parameters with a message naming the parameter.
int ll_trainer_create(struct ll_trainer **out, const struct ll_model *m, struct ll_backend *be, const struct ll_trainer_params *p,
                      char *err, size_t errlen);
void ll_trainer_free(struct ll_trainer *tr); // accepts NULL
// A CPU backend for training beside a serving backend `like`: its transcendentals (ggml_math),
// and training's products rather than batch invariance (train_sgemm; only requests need their
// answer independent of the batch, and on CPUs without AVX-512 VNNI the dequantize+sgemm
// forward is 1.3-2x the integer tiles'). Used where a device cannot train (llsrv train, the
// server's training job).
int ll_trainer_cpu_backend(struct ll_backend **out, const struct ll_backend *like, int n_threads, char *err, size_t errlen);

// Computes what ll_trainer_create would allocate (no allocation; the activations as without a
// backend's flash-style attention, which keeps one float per head and query instead of S).
void ll_trainer_estimate(const struct ll_model *m, const struct ll_trainer_params *p, struct ll_train_memory *mem);
void ll_trainer_memory(const struct ll_trainer *tr, struct ll_train_memory *mem);

// One optimizer step (reads batch * grad_accum sequences from src). A data error is returned
// as is (the trainer's parameters are unchanged).
int ll_trainer_step(struct ll_trainer *tr, struct ll_train_source *src, struct ll_train_step_info *info, char *err, size_t errlen);
// Mean validation loss over up to max_seqs validation sequences (0: all); LL_ENOTFOUND when the
// source has none. No dropout, no gradient.
int ll_trainer_eval(struct ll_trainer *tr, struct ll_train_source *src, int64_t max_seqs, double *loss, char *err, size_t errlen);

// Loss (sum over counted tokens, in *loss_sum; *n_counted tokens) of n_seq sequences (n_seq <=
// batch), and when grad != 0 its gradient (scaled by grad_scale) added to the gradient buffer.
// Used by the step and by tests (finite differences); dropout as in training when grad != 0.
int ll_trainer_forward_backward(struct ll_trainer *tr, const int32_t *ids, const int32_t *targets, int n_seq, int grad, float grad_scale,
                                double *loss_sum, int64_t *n_counted, char *err, size_t errlen);
// The trainable parameters, their gradients and moments as one vector each (n floats), in
// the backend's buffers (host memory on the CPU; on a device, through ll_backend_copy).
// Tests read and perturb them; zero_grad clears the gradient.
// A mixture-of-experts model in full mode: the load-balancing losses (ll_moe.h, summed over
// layers) of the backward passes since the last call, which resets the sum. The objective
// ll_trainer_forward_backward differentiates is its loss_sum · grad_scale plus this.
double ll_trainer_aux_take(struct ll_trainer *tr);
void ll_trainer_vectors(struct ll_trainer *tr, float **params, float **grads, int64_t *n);
int ll_trainer_zero_grad(struct ll_trainer *tr);
// The host copy of the parameters (what ll_trainer_lora / ll_trainer_model name) made current:
// on a device backend it is refreshed after every update only when an update hook is set.
int ll_trainer_sync(struct ll_trainer *tr, char *err, size_t errlen);

// The adapter (LoRA mode; NULL in full mode), in host memory: the parameter vector itself
// on a host-buffer backend, its host copy on a device (see ll_trainer_sync).
const struct ll_lora *ll_trainer_lora(const struct ll_trainer *tr);
// Full mode: the model with the trained weights (valid while the trainer lives); NULL in LoRA mode.
const struct ll_model *ll_trainer_model(const struct ll_trainer *tr);

struct ll_trainer_state {
  int64_t step, opt_step, skipped, micro;
  double best_val;       // +inf until a validation
  double last_loss, last_val;
};
void ll_trainer_state(const struct ll_trainer *tr, struct ll_trainer_state *st);
void ll_trainer_set_best_val(struct ll_trainer *tr, double v);

// Run checkpoint (.ckpt, atomic): trainable tensors (adapter lora_a/lora_b, or every weight in
// full mode, then with the model's metadata so it loads as a model), AdamW moments (.adam_m,
// .adam_v), step counters, RNG counter, data cursor (from src, may be NULL), best val loss and
// the parameters as text. ll_trainer_resume reads one back into a trainer created with the same
// mode, rank, targets and model shapes (anything else is refused, naming what differs) and moves
// src to the recorded cursor.
int ll_trainer_save(struct ll_trainer *tr, const char *path, struct ll_train_source *src, char *err, size_t errlen);
int ll_trainer_resume(struct ll_trainer *tr, const char *path, struct ll_train_source *src, char *err, size_t errlen);

// Data parallelism (server/train/ll_train_comm.h makes one over MPI). With a communicator of
// size N > 1, every rank runs the same trainer on the same data source; one optimizer step
// reads N x grad_accum micro-batches from the source (the same cursor on every rank) and rank
// r computes micro-batches r·grad_accum .. (r+1)·grad_accum - 1 of them, with their global
// dropout seeds. The token count, the micro-batch losses and the gradient are combined across
// ranks (sum_f32 on the gradient, gather_f64 on the rest, summed in rank order), so every rank
// takes the same AdamW update: the step equals one process's with grad_accum N x grad_accum
// (bit for bit when sum_f32 adds in rank order and each parameter gets one addition per
// micro-batch - LoRA; within float rounding otherwise). Evaluation splits the validation
// batches round-robin and sums their losses in batch order (the single process's order).
struct ll_train_comm {
  int rank, size;
  void *user;
  // buf (n floats) := the sum of every rank's buf, on every rank
  int (*sum_f32)(void *user, float *buf, int64_t n, char *err, size_t errlen);
  // out (size x n) := every rank's in (n doubles), rank 0's first, on every rank
  int (*gather_f64)(void *user, const double *in, int n, double *out, char *err, size_t errlen);
};
// c (copied; NULL or size 1: alone) must be set before the first step.
int ll_trainer_set_comm(struct ll_trainer *tr, const struct ll_train_comm *c, char *err, size_t errlen);
// A hash of the parameters (the host copy, made current): equal on every rank of a run.
uint64_t ll_trainer_param_hash(struct ll_trainer *tr);

// Tests: the next step's gradient gets a NaN (exercises the skip path on real data).
void ll_trainer_inject_nan(struct ll_trainer *tr);

// Where the optimizer update runs. The update (AdamW on the parameters and moments) is the only
// write to the trained weights, which a server also reads while it serves them (adapter=live, or
// the model itself in full mode). With a hook, ll_trainer_step hands the update to fn, which must
// call update(arg) exactly once, on whatever thread serves those weights, and return what it
// returned; the trainer's thread waits meanwhile, so nothing else touches its backend. NULL
// (the default): in place. The arithmetic is the same either way.
typedef int (*ll_trainer_update_fn)(void *user, int (*update)(void *arg), void *arg);
void ll_trainer_set_update_hook(struct ll_trainer *tr, ll_trainer_update_fn fn, void *user);
// fn(user) is called before each layer of the forward and of the backward pass (every ~1/60 of
// a SmolLM2 step): where a server lets training pause for requests. It may sleep; it must not
// touch the trainer. NULL (the default): none.
void ll_trainer_set_yield_hook(struct ll_trainer *tr, void (*fn)(void *user), void *user);

#endif
