// ll_train_run.h - one training run: the trainer, its data and its run directory, driven a
// step at a time by `llsrv train` (foreground) and by the server's compute thread (background).
//
// RUN_DIR holds step-NNNNNNNN.ckpt (the last `keep`), last.ckpt (the newest checkpoint) and
// best.ckpt (the weights of the lowest validation loss so far); last.ckpt is a hard link made
// under a temporary name and renamed into place, so it always names a complete checkpoint;
// best.ckpt is such a link when the record falls on a checkpoint step, else written there and then.
// Opening a run whose RUN_DIR has a last.ckpt (or step checkpoints) resumes it (same parameters
// required), from the newest checkpoint that loads: a damaged last.ckpt is kept as
// last.ckpt.damaged and skipped (ll_train_run_notes says so). Opening also removes the
// temporary files of writes cut short (kill -9) and applies `keep` to every step checkpoint on
// disk, earlier processes' too; each save applies it again.
#ifndef LL_TRAIN_RUN_H
#define LL_TRAIN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "ll_trainer.h"

// Divergence: a loss more than twice the lowest of the last this many steps (and 1 nat above it).
#define LL_TRAIN_DIVERGE_WINDOW 50
#define LL_TRAIN_DIVERGE_SMOOTH 8
// The divergence check's state (zeroed to start): the last LL_TRAIN_DIVERGE_WINDOW losses.
struct ll_train_diverge {
  double win[LL_TRAIN_DIVERGE_WINDOW];
  int n, i;
  int high; // warned, and the mean has not come back below the line since
};
// Feeds one step's loss; 1 when the loss has just started to diverge: the mean of the last
// LL_TRAIN_DIVERGE_SMOOTH losses (*mean) over twice, and more than 1 nat above, the lowest
// earlier such mean of the window (*min; at a run's start the means of its first losses count).
int ll_train_diverge_feed(struct ll_train_diverge *d, double loss, double *mean, double *min);

struct ll_config;
struct ll_tokenizer;
struct ll_train_run;

struct ll_train_run_opts {
  const char *run_dir;          // required
  const char *data_path;        // required
  const char *model_path;       // recorded; full mode reads the model's metadata from it
  const char *arch;             // base architecture ("llama")
  int64_t checkpoint_every;     // steps; 0: only on demand / at the end
  int64_t eval_every;           // steps; 0: never
  int64_t eval_seqs;            // validation sequences per evaluation (0: all)
  int64_t keep;                 // step checkpoints kept
  double val_fraction;
  int restart;                  // 1: ignore an existing last.ckpt (start over)
  const char *chat_template;    // chat records: a chat_template setting (built-in name or template
                                // file, ll_chat_template_load); NULL: the model's
  int64_t max_skipped;          // this many skipped steps in a row stop the run (an error); 0: never
  int shuffle_pieces;           // ll_data_params.shuffle_pieces (train.shuffle: pieces)
  // Data parallelism (NULL: alone): every rank opens the same run; rank 0 alone writes the run
  // directory (checkpoints, best.ckpt, the sweep of stale files), and at each checkpoint every
  // rank checks that its parameters hash as rank 0's (LL_ESTATE naming the rank if not).
  const struct ll_train_comm *comm;
  int train_on_thinking;        // ll_data_params.train_on_thinking (train.on_thinking)
};

// What one ll_train_run_step did (for progress lines, monitor fields and events).
struct ll_train_run_event {
  struct ll_train_step_info info;
  int evaluated;                // val_loss below is new
  double val_loss;              // NaN until the first evaluation
  int saved;                    // a checkpoint was written: path
  char path[4160];
  int best;                     // ... and it is the new best.ckpt
  int finished;                 // the run reached its last step
  // The step's checkpoint failed (full disk, I/O error): the step itself stands and the
  // previous checkpoints are intact; the next checkpoint tries again.
  int save_failed;
  char save_error[512];
  // The loss has just risen far above its running minimum: the mean of the last
  // LL_TRAIN_DIVERGE_SMOOTH losses (loss_mean) over twice the lowest such mean of the last
  // LL_TRAIN_DIVERGE_WINDOW steps (loss_min): warn (once, until it comes back down).
  int diverging;
  double loss_mean, loss_min;
  uint64_t param_hash;          // with a checkpoint: the parameters' hash (the same on every rank)
};

// Trainer parameters from the config's train: section (targets parsed, names checked).
int ll_train_params_from_config(const struct ll_config *c, struct ll_trainer_params *p, char *err, size_t errlen);

int ll_train_run_open(struct ll_train_run **out, const struct ll_model *m, struct ll_backend *be, const struct ll_tokenizer *tok,
                      const struct ll_trainer_params *p, const struct ll_train_run_opts *o, char *err, size_t errlen);
void ll_train_run_close(struct ll_train_run *r); // accepts NULL

// The pre-flight report (data, steps per epoch, memory estimate); lines ending in '\n'.
int ll_train_run_describe(const struct ll_train_run *r, char *buf, size_t cap);
// One optimizer step, then an evaluation and/or a checkpoint when due (and both at the last step).
// LL_ESTATE after max_skipped skipped steps in a row (the step ran; nothing was saved).
int ll_train_run_step(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen);
// Validation loss now (LL_ENOTFOUND without validation data); also recorded for the next events.
// A record (the first evaluation is one) writes best.ckpt: when that fails, the error is
// returned with *val set (finite): a warning, as for any checkpoint that fails.
int ll_train_run_eval(struct ll_train_run *r, double *val, char *err, size_t errlen);
// A checkpoint now (on demand, on shutdown).
int ll_train_run_save(struct ll_train_run *r, struct ll_train_run_event *ev, char *err, size_t errlen);
int ll_train_run_done(const struct ll_train_run *r); // 1 when every step has run
struct ll_trainer *ll_train_run_trainer(struct ll_train_run *r);
struct ll_train_source *ll_train_run_source(struct ll_train_run *r);
// Steps per epoch (sequences per epoch / sequences per step), 0 if unknown.
int64_t ll_train_run_steps_per_epoch(const struct ll_train_run *r);
int64_t ll_train_run_resumed_from(const struct ll_train_run *r); // step of the resumed checkpoint, -1 for a fresh run
const char *ll_train_run_resumed_path(const struct ll_train_run *r); // its path ("" for a fresh run)
// What opening did to RUN_DIR that the user should hear of (newer checkpoints skipped as damaged,
// stale temporary files removed): lines ending in '\n', "" when nothing.
const char *ll_train_run_notes(const struct ll_train_run *r);

#endif
