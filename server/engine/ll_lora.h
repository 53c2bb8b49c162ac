// ll_lora.h - one LoRA adapter in memory: what the trainer updates, the engine applies per
// sequence, and the importers/exporters (GGUF LoRA, PEFT, .ckpt) read and write.
//
// For each (layer, target) that is adapted: A (r, in) and B (out, r), both F32 ll_weights whose
// data lives in backend memory (ll_backend_alloc), so the OpenCL backend can keep them on the
// device. The adapted product is
//     y = W·x + scale · B·(A·x),   scale = alpha / r          // x (T, in), y (T, out)
// B starts at zero (a fresh adapter changes nothing); A from a seeded Kaiming-uniform init as
// PEFT does. Shapes follow GGUF: A has ne = {in, r} (r rows of `in` floats), B ne = {r, out}.
//
// A mixture-of-experts model's experts take adapters of their own (the expert slots below):
// one pair per expert, stacked as llama.cpp's GGUF LoRA stores them for ffn_*_exps (lora_a
// ne {in, r, E}, lora_b ne {r, out, E}): expert e's A is rows [e·r, (e+1)·r) of the pair's a,
// its B rows [e·out, (e+1)·out) of b. The router is never adapted.
#ifndef LL_LORA_H
#define LL_LORA_H

#include <stdint.h>

#include "ll_backend.h"

enum ll_lora_target {
  LL_LORA_Q, LL_LORA_K, LL_LORA_V, LL_LORA_O, LL_LORA_GATE, LL_LORA_UP, LL_LORA_DOWN,
  LL_LORA_N_TARGETS, // the dense targets end here; the experts' slots follow
  LL_LORA_GATE_EXPS = LL_LORA_N_TARGETS, LL_LORA_UP_EXPS, LL_LORA_DOWN_EXPS,
  // qwen2moe's shared expert (ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp): one 2-D pair each,
  // as llama.cpp's build_ffn adapts them (its gate_inp_shexp vector is not adapted here)
  LL_LORA_GATE_SHEXP, LL_LORA_UP_SHEXP, LL_LORA_DOWN_SHEXP,
  LL_LORA_N_SLOTS
};
#define LL_LORA_ALL_TARGETS ((1u << LL_LORA_N_TARGETS) - 1) // the dense ones
#define LL_LORA_EXPERT_TARGETS ((1u << LL_LORA_GATE_EXPS) | (1u << LL_LORA_UP_EXPS) | (1u << LL_LORA_DOWN_EXPS)) // gate_exps, up_exps, down_exps
#define LL_LORA_SHEXP_TARGETS ((1u << LL_LORA_GATE_SHEXP) | (1u << LL_LORA_UP_SHEXP) | (1u << LL_LORA_DOWN_SHEXP)) // the shared expert's
static inline int ll_lora_is_expert(int t) { return t >= LL_LORA_GATE_EXPS && t <= LL_LORA_DOWN_EXPS; }

struct ll_lora_pair {
  struct ll_weight a; // F32 (r rows of in): data NULL when this target is not adapted
  struct ll_weight b; // F32 (out rows of r)
};

struct ll_lora {
  char name[64];            // "live", a checkpoint's name, a file's stem
  char arch[32];            // base model's general.architecture ("" when unknown)
  int n_layer, rank;
  float alpha;              // scale = alpha / rank
  unsigned targets;         // bitmask of 1u << enum ll_lora_target
  int n_expert;             // experts of the expert slots' pairs (0: none adapted)
  struct ll_lora_pair *pairs; // (n_layer * LL_LORA_N_SLOTS), pairs[l * LL_LORA_N_SLOTS + t]
  float *storage;           // every A and B in one allocation (host memory)
  int64_t n_params;         // floats in storage
  struct ll_backend *be;    // owner of storage (a host-buffer backend, or NULL)
};

static inline float ll_lora_scale(const struct ll_lora *a) { return a->alpha / (float)a->rank; }
static inline struct ll_lora_pair *ll_lora_at(const struct ll_lora *a, int layer, int target) {
  return &a->pairs[layer * LL_LORA_N_SLOTS + target];
}
// Expert e's matrices of an expert slot's pair: A_e (r, in), B_e (out, r) as views.
void ll_lora_expert(const struct ll_lora *a, const struct ll_lora_pair *p, int e, struct ll_weight *A, struct ll_weight *B);

// The base model's shapes an adapter must fit (ll_engine_lora_dims() fills it from an engine).
struct ll_lora_dims {
  char arch[32];          // general.architecture
  int n_layer, n_embd, n_embd_kv, n_ff, n_head, n_head_kv;
  int n_expert;           // > 0: a mixture-of-experts model, whose FFN has no dense gate/up/down
  int n_ff_exp;           // one expert's feed-forward width (the expert slots' widths)
  int n_embd_q;           // q's output and o's input width (head_dim * n_head); 0: n_embd
  int n_ff_sh;            // qwen2moe: the shared expert's width (its slots'); 0: none
};

// Fused modules. Phi-3 keeps q, k, v in one matrix (attn_qkv) and gate, up in one (ffn_up,
// gate rows then up rows), and its adapters adapt each as one module - PEFT's qkv_proj and
// gate_up_proj, llama.cpp's blk.N.attn_qkv.weight.lora_a/b: one A (r, C) for the group, B the
// members' rows stacked (q, k, v; gate, up). In memory the members stay pairs of their own (the
// engine and the trainer apply them one by one, on row slices of the fused matrix) holding equal
// A's; the trainer sums the members' A gradients (ll_lora_group_*) so that they stay equal.
// GGUF files (ll_lora_save_gguf) hold the fused tensors; .ckpt the members' (ll_lora_to_mf).
#define LL_LORA_GROUP_QKV ((1u << LL_LORA_Q) | (1u << LL_LORA_K) | (1u << LL_LORA_V))
#define LL_LORA_GROUP_GU ((1u << LL_LORA_GATE) | (1u << LL_LORA_UP))
// A group's members not adapted are zero rows of the fused B (q and v alone on phi3: attn_qkv
// with k's rows zero).
// The groups adapted as one for this architecture (general.architecture; 0: none, NULL: none).
unsigned ll_lora_fused(const char *arch);
// The target whose A target t shares in layer l of a (the first adapted member of t's fused
// group; t itself when it is in none).
int ll_lora_group_lead(const struct ll_lora *a, unsigned fused, int layer, int t);

// Target names: "q".."down" (configs, protocol), GGUF tensor stems "attn_q".., PEFT modules "q_proj"..;
// the expert slots: "gate_exps".., "ffn_gate_exps".. (no PEFT name: "?").
const char *ll_lora_target_name(int t);
const char *ll_lora_target_tensor(int t);
const char *ll_lora_target_peft(int t);
int ll_lora_target_from_name(const char *s); // any of the three spellings; -1 if unknown
// in/out features of target t for a model of these dims (an expert slot: of one expert).
void ll_lora_target_dims(const struct ll_lora_dims *d, int t, int64_t *in, int64_t *out);
// Deterministic uniform value in [-1, 1) for (seed, stream, index) (adapter init, tests).
float ll_lora_uniform(uint64_t seed, uint64_t stream, uint64_t i);

// A fresh adapter for every layer and each target in `targets`: A Kaiming-uniform as PEFT
// (U(-1/sqrt(in), 1/sqrt(in)), seeded, counter-based), B zero. Storage from ll_backend_alloc(be).
int ll_lora_create(struct ll_lora **out, const struct ll_lora_dims *d, int rank, float alpha, unsigned targets,
                   uint64_t seed, struct ll_backend *be, char *err, size_t errlen);
// Zeroed adapter with the pairs marked in present[l * LL_LORA_N_SLOTS + t] (importers); expert
// slots get d->n_expert experts each.
int ll_lora_alloc(struct ll_lora **out, int n_layer, int rank, float alpha, const unsigned char *present,
                  const struct ll_lora_dims *d, struct ll_backend *be, char *err, size_t errlen);
void ll_lora_free(struct ll_lora *a); // accepts NULL
// Fits the base model? Architecture, layer count, every pair's shapes, finite values. The
// message names the tensor and says what was wrong.
int ll_lora_check(const struct ll_lora *a, const struct ll_lora_dims *d, char *err, size_t errlen);
// The same without scanning the values (cheap: per request).
int ll_lora_check_shapes(const struct ll_lora *a, const struct ll_lora_dims *d, char *err, size_t errlen);

// ---- files (lora_io.c) ----
struct ll_modelfile;
// Adds the adapter's tensors `blk.N.<attn_q|...>.weight.lora_a` (ne {in, r}) and `.lora_b`
// (ne {r, out}; the expert slots' ffn_*_exps: {in, r, E} and {r, out, E}), F32, data borrowed from a, plus general.type=adapter, general.architecture,
// adapter.type=lora, adapter.lora.alpha (f32): the llama.cpp GGUF LoRA layout. The trainer's
// .ckpt uses the same names (roles lora_a / lora_b follow from the suffix).
int ll_lora_to_mf(const struct ll_lora *a, struct ll_modelfile *mf, char *err, size_t errlen);
// Reads an adapter from a modelfile holding such tensors (GGUF LoRA or .ckpt; F32, F16 or BF16),
// checked against d (ll_lora_check). Tensors that are not adapter tensors are ignored only when
// allow_other (a .ckpt carrying optimizer state or weights), else refused.
int ll_lora_from_mf(struct ll_lora **out, const struct ll_modelfile *mf, const struct ll_lora_dims *d, int allow_other,
                    struct ll_backend *be, char *err, size_t errlen);
// The dims an adapter file implies (architecture, layers, the widths its matrices show; the
// others 0), for tools that read an adapter without its base model (llsrv export).
int ll_lora_dims_from_mf(const struct ll_modelfile *mf, struct ll_lora_dims *d, char *err, size_t errlen);
// Writes a GGUF LoRA adapter that llama.cpp loads with --lora (atomic); a fused architecture's
// groups as one tensor pair each (attn_qkv, ffn_up: see above). ll_lora_from_mf reads both forms.
int ll_lora_save_gguf(const struct ll_lora *a, const char *path, char *err, size_t errlen);
// PEFT directory (adapter_config.json + adapter_model.safetensors): HF module names mapped to
// GGUF, lora_B rows of q_proj/k_proj permuted as llama.cpp's converter does for llama; Phi-3's
// qkv_proj and gate_up_proj read as attn_qkv and ffn_up (no permutation, as its converter);
// the experts' modules, one 2-D pair per expert (Mixtral's block_sparse_moe.experts.E.w1/w3/w2,
// Qwen2-MoE / Qwen3-MoE / OLMoE's mlp.experts.E.gate_proj/up_proj/down_proj), stacked into the
// 3-D ffn_*_exps pairs (every expert of an adapted module present, same type and shape). The
// router and qwen2moe's shared expert are refused with a message saying so.
int ll_lora_load_peft(struct ll_lora **out, const char *dir, const struct ll_lora_dims *d, struct ll_backend *be,
                      char *err, size_t errlen);
// The same from the two files' bytes (cfg_text: adapter_config.json, at most 1 MiB; map:
// adapter_model.safetensors); dir only names them in messages. Hostile input: every size and
// name checked (fuzz_lora).
int ll_lora_peft_parse(struct ll_lora **out, const char *cfg_text, size_t cfg_len, const void *map, size_t maplen, const char *dir,
                       const struct ll_lora_dims *d, struct ll_backend *be, char *err, size_t errlen);
// Any of: a GGUF LoRA file, a .ckpt holding adapter tensors, a PEFT directory. The adapter's
// name is the file stem (directory name for PEFT). d NULL: shapes taken from the file itself
// (ll_lora_dims_from_mf; not for PEFT directories, whose q/k permutation needs the heads).
int ll_lora_load(struct ll_lora **out, const char *path, const struct ll_lora_dims *d, struct ll_backend *be,
                 char *err, size_t errlen);

#endif
