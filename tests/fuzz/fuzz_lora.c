// fuzz_lora.c - a LoRA adapter file (GGUF) of arbitrary bytes, read as llsrv reads adapters
// against a small phi3 (q, k, v fused in attn_qkv and gate, up in ffn_up: ll_lora.h), a small
// llama and its mixture-of-experts twin (adapters on the experts: 3-D ffn_*_exps), and with the shapes the file itself implies (ll_lora_dims_from_mf, as llsrv export does
// without a model): never a crash or a read outside the file; an adapter accepted passes
// ll_lora_check and its tensors (ll_lora_to_mf) fit its shapes; a refusal says why. The same
// bytes as a PEFT adapter_model.safetensors (ll_lora_peft_parse: experts' per-expert modules).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_gguf.h"
#include "ll_lora.h"
#include "ll_modelfile.h"

static void try_dims(const struct ll_modelfile *mf, const struct ll_lora_dims *d, int allow_other) {
  struct ll_lora *a = NULL;
  char err[512];
  err[0] = 0;
  const int rc = ll_lora_from_mf(&a, mf, d, allow_other, NULL, err, sizeof err);
  if (rc != 0) {
    if (a || !err[0]) __builtin_trap();
    return;
  }
  if (!a || ll_lora_check(a, d, err, sizeof err) != 0) __builtin_trap();
  struct ll_modelfile out;
  ll_modelfile_init(&out);
  if (ll_lora_to_mf(a, &out, err, sizeof err) == 0)
    for (uint64_t i = 0; i < out.n_tensors; i++)
      if (out.tensors[i].ne[0] <= 0 || out.tensors[i].ne[1] <= 0 || !out.tensors[i].data) __builtin_trap();
  ll_modelfile_free(&out);
  ll_lora_free(a);
}

// The bytes as a PEFT directory's adapter_model.safetensors (r 2) for the llama and its MoE twin:
// HF module names, per-expert modules stacked into the 3-D pairs (ll_lora_peft_parse).
static void try_peft(const uint8_t *data, size_t size, const struct ll_lora_dims *d) {
  static const char cfg[] = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"bias\": \"none\"}";
  struct ll_lora *a = NULL;
  char err[512];
  err[0] = 0;
  if (ll_lora_peft_parse(&a, cfg, sizeof cfg - 1, data, size, "fuzz", d, NULL, err, sizeof err) != 0) {
    if (a || !err[0]) __builtin_trap();
    return;
  }
  if (!a || ll_lora_check(a, d, err, sizeof err) != 0 || a->rank != 2) __builtin_trap();
  ll_lora_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct ll_modelfile mf;
  char err[256];
  {
    struct ll_lora_dims d = {.arch = "llama", .n_layer = 2, .n_embd = 8, .n_embd_kv = 4, .n_ff = 12, .n_head = 2, .n_head_kv = 1}, dm = d;
    dm.n_expert = 2, dm.n_ff_exp = 6;
    try_peft(data, size, &d);
    try_peft(data, size, &dm);
  }
  if (ll_gguf_parse(data, size, &mf, err, sizeof err) != 0) return 0;
  // C = 8, 2 heads of 4 (q width 8), 1 kv head (kv width 4), F = 12, 2 layers
  struct ll_lora_dims d = {.arch = "phi3", .n_layer = 2, .n_embd = 8, .n_embd_kv = 4, .n_ff = 12, .n_head = 2, .n_head_kv = 1};
  for (int ao = 0; ao < 2; ao++) try_dims(&mf, &d, ao);
  snprintf(d.arch, sizeof d.arch, "llama");
  try_dims(&mf, &d, 0);
  struct ll_lora_dims dm = d; // a mixture of 2 experts of width 6: the 3-D ffn_*_exps adapters
  dm.n_expert = 2, dm.n_ff_exp = 6;
  try_dims(&mf, &dm, 0);
  struct ll_lora_dims fd;
  if (ll_lora_dims_from_mf(&mf, &fd, err, sizeof err) == 0) try_dims(&mf, &fd, 0);
  ll_modelfile_free(&mf);
  return 0;
}
