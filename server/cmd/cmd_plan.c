// cmd_plan.c - llsrv plan: the device memory a config needs, and how it would be adapted to
// fit, printed without loading the model (its metadata and tensor table only).
//
// Components (bytes):
//   weights    every matrix (2-D tensor), resident on the device (norms: cached as used, small)
//   repack     on the CPU with repack on, the interleaved copies of the matrices decode reads
//              (ll_cpu_packed_bytes: Q4_0, Q4_1, Q5_0, Q8_0, K-quants where the CPU has AVX2; not
//              token_embd unless it is also the output head)
//   KV cache   2 * layers * ctx (in blocks of LL_KV_BLOCK) * parallel * kv_dim * (2 f16 | 4 f32)
//   compute    the engine's activations and the OpenCL backend's staging buffers for one
//              step of up to 512 tokens (4 of 512 x max(dim, ffn) floats), their Q8 form,
//              logits for `parallel` rows and the attention scores (512 x heads x ctx floats)
//   training   (train.enabled) LoRA adapters on every projection (q, k, v, o, gate, up, down)
//              with their gradients and two AdamW moments (4 copies, f32), and the
//              activations of one step of batch x seq_len tokens: per layer ~(6 dim + 2 kv_dim
//              + 3 ffn) floats per token plus the attention probabilities (heads x seq_len²
//              per sequence); with recomputation only each layer's input is kept, plus one
//              layer's full set; logits and their gradient for one chunk of the head (64 rows
//              x vocab: trainer.c's XENT_ROWS). The server's trainer computes on an OpenCL
//              instance of its own beside the serving one (trainjob.c), which reads the served
//              weights where they are: it adds its staging buffers (as compute); full-parameter
//              training its f32 weights, gradients and two moments instead of adapters
// Budget: 90% of the device's global memory (the driver and other users keep the rest).
// Adaptation order when the total exceeds it: parallel sequences (halved down to 1), context
// (halved down to max(256, train.seq_len)), training batch (halved down to 1), activation
// recomputation on. If nothing fits: the CPU, with the numbers.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ll_backend.h"
#include "ll_cmd.h"
#include "ll_config.h"
#include "ll_engine.h"
#include "ll_modelfile.h"
#include "ll_moe.h"

struct shape {
  int64_t C, L, H, Hkv, F, V, kvd, qd; // qd: q width, head_dim (attention.key_length, else C / H) * H
  int64_t weights;
  int64_t packed; // the CPU kernels' interleaved copies (repack)
};

struct plan {
  int64_t ctx, parallel, batch, seq_len, rank;
  int recompute, train, kv_f16;
  int full; // train.mode full
};

static double mib(int64_t b) { return (double)b / 1048576.0; }

static int64_t kv_bytes(const struct shape *s, const struct plan *p) {
  const int64_t ctx = (p->ctx + LL_KV_BLOCK - 1) / LL_KV_BLOCK * LL_KV_BLOCK;
  return 2 * s->L * ctx * p->parallel * s->kvd * (p->kv_f16 ? 2 : 4);
}

static int64_t compute_bytes(const struct shape *s, const struct plan *p) {
  const int64_t B = 512, wide = s->F > s->C ? s->F : s->C;
  return 4 * B * wide * 4 + B * wide + B * (wide / 32) * 8 + p->parallel * s->V * 4 + B * s->H * p->ctx * 4;
}

// Parameters of every matrix (full-parameter training trains them all, in f32).
static int64_t matrix_params(const struct shape *s) {
  return s->L * (s->C * s->qd * 2 + s->C * s->kvd * 2 + s->C * s->F * 3) + s->V * s->C;
}

// *own: the trainer instance's staging buffers (it shares the served weights).
static int64_t train_bytes(const struct shape *s, const struct plan *p, int64_t *adapters, int64_t *acts, int64_t *own) {
  *adapters = *acts = *own = 0;
  if (!p->train) return 0;
  const int64_t r = p->rank, C = s->C, F = s->F, kvd = s->kvd;
  const int64_t per_layer = r * ((C + s->qd) * 2 + (C + kvd) * 2 + (C + F) * 2 + (F + C));
  // weights, gradients, two moments: of the adapters, or (full) of every matrix in f32
  *adapters = p->full ? 4 * matrix_params(s) * 4 : 4 * s->L * per_layer * 4;
  const int64_t tok = p->batch * p->seq_len, head_rows = tok < 64 ? tok : 64;
  const int64_t layer_acts = tok * (6 * C + 2 * kvd + 3 * F) * 4 + p->batch * s->H * p->seq_len * p->seq_len * 4;
  *acts = (p->recompute ? s->L * tok * C * 4 + layer_acts : s->L * layer_acts) + 2 * head_rows * s->V * 4;
  *own = compute_bytes(s, p);
  return *adapters + *acts + *own;
}

static int64_t total(const struct shape *s, const struct plan *p) {
  int64_t a, b, c;
  return s->weights + s->packed + kv_bytes(s, p) + compute_bytes(s, p) + train_bytes(s, p, &a, &b, &c);
}

static void print_plan(const struct shape *s, const struct plan *p, int64_t budget) {
  int64_t ad, ac, own;
  const int64_t tr = train_bytes(s, p, &ad, &ac, &own), t = total(s, p);
  printf("  weights    %10.1f MiB  (%lld matrices' bytes, resident)\n", mib(s->weights), (long long)s->weights);
  if (s->packed) printf("  repack     %10.1f MiB  (interleaved copies for decode; repack: false saves them)\n", mib(s->packed));
  printf("  KV cache   %10.1f MiB  (ctx %lld x %lld parallel, %s)\n", mib(kv_bytes(s, p)), (long long)p->ctx, (long long)p->parallel,
         p->kv_f16 ? "f16" : "f32");
  printf("  compute    %10.1f MiB  (staging for a 512-token step, attention scores over ctx)\n", mib(compute_bytes(s, p)));
  if (p->train && p->full)
    printf("  training   %10.1f MiB  (full: f32 weights with gradients and moments %.1f MiB; activations of %lld x %lld tokens%s %.1f MiB; "
           "the trainer's staging %.1f MiB)\n",
           mib(tr), mib(ad), (long long)p->batch, (long long)p->seq_len, p->recompute ? ", recomputed" : "", mib(ac), mib(own));
  else if (p->train)
    printf("  training   %10.1f MiB  (LoRA rank %lld with gradients and moments %.1f MiB; activations of %lld x %lld tokens%s %.1f MiB; "
           "the trainer's staging %.1f MiB)\n",
           mib(tr), (long long)p->rank, mib(ad), (long long)p->batch, (long long)p->seq_len, p->recompute ? ", recomputed" : "", mib(ac), mib(own));
  else printf("  training   %10.1f MiB  (train.enabled is off)\n", 0.0);
  printf("  total      %10.1f MiB  of a %.1f MiB budget: %s\n", mib(t), mib(budget), t <= budget ? "fits" : "does not fit");
}

static void usage(FILE *f) {
  fprintf(f, "usage: llsrv plan --model M [--config C] [--device D] [any server option]\n"
             "Prints the device memory plan (weights, KV cache for ctx x parallel, compute buffers, training)\n"
             "and, when it does not fit, the adaptation order applied: parallel, ctx, train.batch, recompute.\n");
}

int ll_cmd_plan(int argc, char **argv) {
  struct ll_config cfg;
  ll_config_init(&cfg);
  char err[1024];
  int help = 0;
  if (ll_config_parse_args(&cfg, argc - 1, argv + 1, &help, NULL, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv plan: %s\n", err);
    ll_config_free(&cfg);
    return 2;
  }
  if (help || !cfg.model) {
    usage(help ? stdout : stderr);
    ll_config_free(&cfg);
    return help ? 0 : 2;
  }
  int status = 1;
  struct ll_modelfile mf;
  ll_modelfile_init(&mf);
  struct ll_backend *be = NULL;
  struct shape s = {0};
  int64_t v[6] = {0};
  static const char *const keys[6] = {"embedding_length", "block_count", "attention.head_count", "feed_forward_length", "attention.head_count_kv",
                                      "context_length"};
  if (ll_model_open(cfg.model, &mf, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv plan: %s\n", err);
    goto out;
  }
  for (int i = 0; i < 6; i++)
    if (ll_mf_get_arch_int(&mf, keys[i], &v[i]) != 0 || v[i] <= 0 || v[i] > (1 << 20)) {
      if (i == 4) {
        v[4] = v[2];
        continue;
      }
      fprintf(stderr, "llsrv plan: %s: %s is missing or out of range\n", cfg.model, keys[i]);
      goto out;
    }
  const struct ll_tensor_info *te = ll_mf_find_tensor(&mf, "token_embd.weight");
  int64_t hd = 0; // the head width as the engine reads it: attention.key_length (Gemma 3, Qwen3), else C / H
  if (ll_mf_get_arch_int(&mf, "attention.key_length", &hd) != 0) hd = v[2] && v[0] % v[2] == 0 ? v[0] / v[2] : 0;
  if (!te || hd <= 0 || hd > 4096 || v[2] % v[4]) {
    fprintf(stderr, "llsrv plan: %s: token_embd.weight missing or head counts inconsistent\n", cfg.model);
    goto out;
  }
  s.C = v[0], s.L = v[1], s.H = v[2], s.F = v[3], s.Hkv = v[4], s.V = te->ne[1], s.kvd = hd * v[4], s.qd = hd * v[2];
  for (uint64_t i = 0; i < mf.n_tensors; i++)
    if (mf.tensors[i].n_dims >= 2) s.weights += (int64_t)mf.tensors[i].nbytes;

  // The device, chosen as the server would choose it (kernels built and self-tested).
  struct ll_backend_params bp = {(int)cfg.threads, cfg.device, NULL};
  char reason[1024], cache[1100];
  bp.cache_dir = ll_cmd_opencl_cache(cfg.state_dir, cfg.device, cache, sizeof cache);
  if (ll_backend_create(&be, &bp, reason, sizeof reason, err, sizeof err) != 0) {
    fprintf(stderr, "llsrv plan: %s\n", err);
    goto out;
  }
  struct ll_backend_info bi;
  be->i->get_info(be, &bi);
  if (cfg.repack && !be->i->weight_upload) { // the CPU backend: the engine packs what the kernels read packed
    const int tied = !ll_mf_find_tensor(&mf, "output.weight");
    for (uint64_t i = 0; i < mf.n_tensors; i++) {
      const struct ll_tensor_info *t = &mf.tensors[i];
      if (t->n_dims == 2 && (t != te || tied)) s.packed += ll_cpu_packed_bytes(t->type, t->ne[0], t->ne[1]);
      if (t->n_dims == 3) s.packed += ll_cpu_packed_bytes(t->type, t->ne[0], t->ne[1]) * t->ne[2]; // experts: each its own matrix
    }
  }
  const int64_t budget = bi.mem_total > 0 ? bi.mem_total / 10 * 9 : 0;
  struct plan p = {cfg.ctx > 0 ? cfg.ctx : (v[5] < 4096 ? v[5] : 4096), cfg.parallel, cfg.train_batch, cfg.train_seq_len, cfg.train_lora_rank,
                   0, cfg.train_enabled, cfg.kv_f16, cfg.train_mode && strcmp(cfg.train_mode, "full") == 0};
  printf("model   %s: %lld layers, dim %lld, ffn %lld, %lld heads (%lld kv), vocabulary %lld\n", cfg.model, (long long)s.L, (long long)s.C,
         (long long)s.F, (long long)s.H, (long long)s.Hkv, (long long)s.V);
  {
    int64_t all, ex, act;
    int ne, nu;
    ll_moe_param_counts(&mf, &all, &ex, &act, &ne, &nu);
    if (ne > 0)
      printf("experts %d per layer, %d per token: %lld expert parameters of %lld; %lld active per token (the router's k experts, one embedding row)\n",
             ne, nu, (long long)ex, (long long)all, (long long)act);
    else printf("params  %lld; %lld active per token (one embedding row)\n", (long long)all, (long long)act);
  }
  printf("device  %s: %s, %.1f MiB global memory (budget 90%%: %.1f MiB)\n", bi.name, bi.device, mib(bi.mem_total), mib(budget));
  printf("        %s\n", reason);
  printf("plan as configured:\n");
  print_plan(&s, &p, budget);
  if (total(&s, &p) <= budget) {
    printf("adaptation: none needed\n");
    status = 0;
    goto out;
  }
  printf("adaptation (parallel, then ctx, then train.batch, then recomputation):\n");
  const int64_t min_ctx = p.train && p.seq_len > 256 ? p.seq_len : 256;
  while (total(&s, &p) > budget) {
    char what[128];
    if (p.parallel > 1) {
      snprintf(what, sizeof what, "parallel %lld -> %lld", (long long)p.parallel, (long long)(p.parallel / 2));
      p.parallel /= 2;
    } else if (p.ctx / 2 >= min_ctx) {
      snprintf(what, sizeof what, "ctx %lld -> %lld", (long long)p.ctx, (long long)(p.ctx / 2));
      p.ctx /= 2;
    } else if (p.train && p.batch > 1) {
      snprintf(what, sizeof what, "train.batch %lld -> %lld", (long long)p.batch, (long long)(p.batch / 2));
      p.batch /= 2;
    } else if (p.train && !p.recompute) {
      snprintf(what, sizeof what, "activation recomputation on");
      p.recompute = 1;
    } else {
      break;
    }
    printf("  %-34s total %.1f MiB\n", what, mib(total(&s, &p)));
  }
  if (total(&s, &p) <= budget) {
    printf("plan after adaptation:\n");
    print_plan(&s, &p, budget);
    status = 0;
  } else {
    printf("nothing fits: the smallest plan needs %.1f MiB, the device offers %.1f MiB: the CPU backend would be used\n", mib(total(&s, &p)),
           mib(budget));
    status = 0; // a plan was printed; the fallback is the answer, not an error
  }
out:
  ll_backend_free(be);
  ll_modelfile_free(&mf);
  ll_config_free(&cfg);
  return status;
}
