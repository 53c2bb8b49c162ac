// ll_demo.h - the embedded default model: a tiny Llama-architecture model with a byte-level
// vocabulary, created once under the state directory so `llsrv` runs with no model given.
#ifndef LL_DEMO_H
#define LL_DEMO_H

#include <stddef.h>
#include <stdint.h>

// Resolve the state directory: `configured` if non-NULL/non-empty, else $XDG_STATE_HOME/llsrv,
// else $HOME/.local/state/llsrv. Creates it (and parents) with mode 0700. Writes the path to out.
int ll_state_dir_resolve(const char *configured, char *out, size_t cap, char *err, size_t errlen);

// Ensure <state_dir>/models/demo.ckpt exists (create it atomically if missing: tmp, fsync,
// rename, fsync dir) and write its path to path_out. An existing file is reused as is (the
// trainer updates it later). Deterministic: the same weights on every machine (fixed seed).
int ll_demo_model_ensure(const char *state_dir, char *path_out, size_t cap, char *err, size_t errlen);

// ---- llsrv init: randomly initialised Llama models (the demo model is the "tiny" preset) ----
struct ll_modelfile;
struct ll_init_dims {
  int dim, layers, heads, heads_kv, ffn, ctx;
  int experts, top_k; // experts > 0: a mixture-of-experts FFN (Mixtral's layout), ffn wide each, top_k per token
};
// "tiny" (the demo model's shape: 128 dims, 4 layers) or "small" (384 dims, 6 layers, GQA 6/2,
// FFN 1024); LL_EINVAL for another name.
int ll_init_preset(const char *name, struct ll_init_dims *d);
// Writes a Llama .ckpt (f32, output head tied to the embeddings) initialised as the demo model
// (fixed-seed, libm-free, the same bits everywhere) to path, atomically. Vocabulary: the demo's
// byte-level one, or every tokenizer.* key of vocab_from (then n_vocab is its token count).
int ll_init_model_write(const char *path, const struct ll_init_dims *d, uint64_t seed, const struct ll_modelfile *vocab_from, char *err,
                        size_t errlen);

#endif
