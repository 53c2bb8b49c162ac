// cmd_export.c - `llsrv export`: a LoRA adapter (a run checkpoint's adapter tensors, a GGUF LoRA
// file or a PEFT directory) written as the GGUF LoRA file llama.cpp loads with --lora, or, with
// --merge, the base model with the adapter merged into its weights and re-quantized to each
// weight's own type (.ckpt or GGUF by the output's extension).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ll_ckpt.h"
#include "ll_cmd.h"
#include "ll_engine.h"
#include "ll_error.h"
#include "ll_gguf.h"
#include "ll_lora.h"
#include "ll_model.h"
#include "ll_modelfile.h"
#include "ll_quant.h"

static void usage(FILE *f) {
  fprintf(f, "usage: llsrv export ADAPTER OUT.gguf [--model BASE] [--name NAME]\n"
             "       llsrv export --merge --model BASE ADAPTER OUT.ckpt|OUT.gguf\n"
             "ADAPTER: a run checkpoint (RUN/best.ckpt), a GGUF LoRA file or a PEFT directory (needs --model).\n"
             "Without --merge: a GGUF LoRA adapter for llama.cpp --lora (general.type=adapter, adapter.lora.alpha,\n"
             "tensors <base tensor>.lora_a ne {in, r} / .lora_b ne {r, out}, F32; experts: {in, r, E} / {r, out, E}); --model checks it fits BASE.\n"
             "--merge: BASE with W += alpha/r * B*A in f32, each weight re-quantized to its own type.\n");
}

static int ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && strcmp(s + n - m, suf) == 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// W (out rows of in) += scale * B (out, r) · A (r, in), row by row in f32, then back to W's type.
// Rows [row0, row0 + B's rows) of t (all of it, or a fused member's slice: phi3's attn_qkv,
// ffn_up) become W + scale·B·A, re-quantized to t's type; the other rows keep their bytes.
// t's rows [row0, row0 + B's rows) += scale · B·A in f32, re-quantized to t's type. A pair of an
// expert slot (ll_lora.h) holds one (A_e, B_e) per expert, stacked, for a 3-D tensor whose rows
// run expert after expert: row n takes the A of its expert, (n - row0) / per rows in.
static int merge_weight(struct ll_tensor_info *t, int64_t row0, const struct ll_lora_pair *p, int64_t r, int64_t per, float scale, void **owned,
                        char *err, size_t errlen) {
  const int64_t K = t->ne[0], N = t->ne[1] * (t->n_dims == 3 ? t->ne[2] : 1);
  const size_t rs = ll_row_size(t->type, K);
  unsigned char *dst = malloc((size_t)N * rs);
  float *row = malloc((size_t)K * sizeof *row);
  if (!dst || !row) {
    free(dst), free(row);
    return ll_errf(err, errlen, LL_ENOMEM, "merge: out of memory");
  }
  const float *A = p->a.data, *B = p->b.data;
  for (int64_t n = 0; n < N; n++) {
    if (n < row0 || n >= row0 + p->b.n) {
      memcpy(dst + (size_t)n * rs, (const unsigned char *)t->data + (size_t)n * rs, rs);
      continue;
    }
    if (ll_dequantize_row(t->type, (const unsigned char *)t->data + (size_t)n * rs, row, K) != 0) {
      free(dst), free(row);
      return ll_errf(err, errlen, LL_EUNSUPPORTED, "merge: %s: type %s cannot be dequantized", t->name.ptr, ll_type_name(t->type));
    }
    const float *Ae = A + (size_t)((n - row0) / per) * (size_t)(r * K);
    for (int64_t j = 0; j < r; j++) {
      const float b = scale * B[(n - row0) * r + j];
      const float *a = Ae + j * K;
      for (int64_t k = 0; k < K; k++) row[k] += b * a[k];
    }
    if (ll_quantize_row(t->type, row, dst + (size_t)n * rs, K) != 0) {
      free(dst), free(row);
      return ll_errf(err, errlen, LL_EUNSUPPORTED, "merge: %s: cannot re-quantize to %s (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)",
                     t->name.ptr, ll_type_name(t->type));
    }
  }
  free(row);
  t->data = dst;
  *owned = dst;
  return 0;
}

int ll_cmd_export(int argc, char **argv) {
  const char *model = NULL, *name = NULL, *pos[2] = {NULL, NULL};
  int merge = 0, n_pos = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if ((strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) && v) model = v, i++;
    else if (strcmp(a, "--name") == 0 && v) name = v, i++;
    else if (strcmp(a, "--merge") == 0) merge = 1;
    else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 0;
    else if (a[0] != '-' && n_pos < 2) pos[n_pos++] = a;
    else {
      fprintf(stderr, "llsrv export: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (n_pos != 2 || (merge && !model)) {
    usage(stderr);
    return 2;
  }
  const char *in = pos[0], *out = pos[1];
  if (!merge && !ends_with(out, ".gguf")) {
    fprintf(stderr, "llsrv export: the adapter is written as GGUF: name the output *.gguf (or use --merge)\n");
    return 2;
  }
  if (merge && !ends_with(out, ".gguf") && !ends_with(out, ".ckpt")) {
    fprintf(stderr, "llsrv export: --merge writes .ckpt or .gguf (by the output's extension)\n");
    return 2;
  }
  char err[1024];
  double t0 = now_s();
  struct ll_engine *e = NULL;
  struct ll_lora_dims d, *dp = NULL;
  if (model) { // the base: its shapes check the adapter (and --merge needs its weights)
    struct ll_engine_params ep;
    ll_engine_params_default(&ep);
    ep.model_path = model;
    ep.n_ctx = 16;
    ep.n_threads = 1;
    ep.device = "cpu";
    if (ll_engine_open(&e, &ep, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv export: %s\n", err);
      return 1;
    }
    ll_engine_lora_dims(e, &d);
    dp = &d;
  }
  struct ll_lora *a = NULL;
  int rc = 1;
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  void **owned = NULL;
  int n_owned = 0;
  if (ll_lora_load(&a, in, dp, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv export: %s\n", err);
    goto out;
  }
  if (name) snprintf(a->name, sizeof a->name, "%s", name);
  if (!merge) {
    if (ll_lora_save_gguf(a, out, err, sizeof err) != 0) {
      fprintf(stderr, "llsrv export: %s\n", err);
      goto out;
    }
    fprintf(stderr, "llsrv export: %s -> %s: LoRA adapter '%s' for %s, %d layers, rank %d, alpha %g, %lld parameters, %.2f s\n", in, out, a->name,
            a->arch, a->n_layer, a->rank, (double)a->alpha, (long long)a->n_params, now_s() - t0);
    rc = 0;
    goto out;
  }
  // --merge: the base's own tensors, the adapted ones replaced by merged copies.
  if (ll_model_open(model, &mf, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv export: %s\n", err);
    goto out;
  }
  owned = calloc((size_t)a->n_layer * LL_LORA_N_SLOTS + 1, sizeof *owned);
  if (!owned) goto out;
  const float scale = ll_lora_scale(a);
  for (int l = 0; l < a->n_layer; l++)
    for (int t = 0; t < LL_LORA_N_SLOTS; t++) {
      const struct ll_lora_pair *p = ll_lora_at(a, l, t);
      if (!p->a.data) continue;
      char tn[96];
      // the experts' 3-D tensor (ne {in, out, E}): each expert's rows with its own pair
      const int xe = ll_lora_is_expert(t);
      const int64_t per = xe && a->n_expert > 0 ? p->b.n / a->n_expert : p->b.n;
      snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, ll_lora_target_tensor(t));
      // phi3: q, k, v are row slices of attn_qkv, gate and up of ffn_up (ll_lora.h)
      int64_t row0 = 0, rows = p->b.n;
      if ((ll_lora_fused(a->arch) >> t) & 1) {
        const int64_t qd = d.n_embd_q > 0 ? d.n_embd_q : d.n_embd, kvd = d.n_embd_kv, F = d.n_ff;
        snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, t <= LL_LORA_V ? "attn_qkv" : "ffn_up");
        row0 = t == LL_LORA_K ? qd : t == LL_LORA_V ? qd + kvd : t == LL_LORA_UP ? F : 0;
        rows = t <= LL_LORA_V ? qd + 2 * kvd : 2 * F;
      }
      struct ll_tensor_info *ti = (struct ll_tensor_info *)ll_mf_find_tensor(&mf, tn);
      if (!ti || ti->ne[0] != p->a.k || (xe ? ti->n_dims != 3 || ti->ne[1] != per || ti->ne[2] != a->n_expert : ti->ne[1] != rows)) {
        fprintf(stderr, "llsrv export: %s: the base has no tensor %s of the adapter's shape\n", model, tn);
        goto out;
      }
      if (merge_weight(ti, row0, p, a->rank, per, scale, &owned[n_owned], err, sizeof err) != 0) {
        fprintf(stderr, "llsrv export: %s\n", err);
        goto out;
      }
      n_owned++;
    }
  char note[160];
  snprintf(note, sizeof note, "llsrv export --merge: LoRA '%s' rank %d alpha %g merged", a->name, a->rank, (double)a->alpha);
  if (ends_with(out, ".gguf")) {
    rc = ll_gguf_write(out, &mf, err, sizeof err);
  } else {
    struct ll_ckpt_write_opts o;
    ll_ckpt_write_opts_init(&o);
    o.note = note;
    o.n_threads = 2;
    rc = ll_ckpt_write(out, &mf, &o, err, sizeof err);
  }
  if (rc) {
    fprintf(stderr, "llsrv export: %s\n", err);
    rc = 1;
    goto out;
  }
  fprintf(stderr, "llsrv export: %s + %s -> %s: %d weights merged (scale %g) and re-quantized to their types, %.2f s\n", model, in, out, n_owned,
          (double)scale, now_s() - t0);
  rc = 0;
out:
  for (int i = 0; i < n_owned; i++) free(owned[i]);
  free(owned);
  ll_modelfile_free(&mf);
  ll_lora_free(a);
  ll_engine_close(e);
  return rc;
}
