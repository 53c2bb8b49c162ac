// ll_demo.h - the embedded default model: a tiny Llama-architecture model with a byte-level
// vocabulary, created once under the state directory so `llsrv` runs with no model given.
#ifndef LL_DEMO_H
#define LL_DEMO_H

#include <stddef.h>

// Resolve the state directory: `configured` if non-NULL/non-empty, else $XDG_STATE_HOME/llsrv,
// else $HOME/.local/state/llsrv. Creates it (and parents) with mode 0700. Writes the path to out.
int ll_state_dir_resolve(const char *configured, char *out, size_t cap, char *err, size_t errlen);

// Ensure <state_dir>/models/demo.ckpt exists (create it atomically if missing: tmp, fsync,
// rename, fsync dir) and write its path to path_out. An existing file is reused as is (the
// trainer updates it later). Deterministic: the same weights on every machine (fixed seed).
int ll_demo_model_ensure(const char *state_dir, char *path_out, size_t cap, char *err, size_t errlen);

#endif
