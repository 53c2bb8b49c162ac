// train_ref.c - scalar references of the backend's training members (llm.c style): each
// backward op beside the forward it differentiates, one element at a time, in the order the
// formula reads. They are the definition the fast versions (train.c) are tested against and
// the fallback of any backend that lacks a member; `b` is never used.
//
// Shapes are (rows, cols) with cols contiguous, as in ll_backend.h.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ll_cpu_train.h"
#include "ll_error.h"
#include "ll_quant.h"

// ---------------------------------------------------------------- matmul
// forward:  out (T, N) = x (T, K) · W (N, K)ᵀ          out[t,n] = Σ_k x[t,k] W[n,k]
// backward: dx (T, K) += dout (T, N) · W (N, K)         dx[t,k] += Σ_n dout[t,n] W[n,k]
//           dw (N, K) += dout (T, N)ᵀ · x (T, K)        dw[n,k] += Σ_t dout[t,n] x[t,k]
// W of any type is dequantized row by row (the frozen base weights of LoRA are quantized);
// dw only for F32 weights (adapters, full-parameter training).
int ll_train_ref_matmul_backward(struct ll_backend *b, float *dx, float *dw, const float *dout, const float *x,
                                 const struct ll_weight *w, int T) {
  (void)b;
  if (!w || !dout || T < 0 || w->k <= 0 || w->n <= 0) return LL_EINVAL;
  if (dw && (w->type != LL_TYPE_F32 || !x)) return LL_EINVAL;
  const int64_t K = w->k, N = w->n;
  const size_t rs = ll_row_size(w->type, K);
  if (!rs) return LL_EINVAL;
  if (dx) {
    float *row = malloc((size_t)K * sizeof *row); // (K) row n of W
    if (!row) return LL_ENOMEM;
    for (int64_t n = 0; n < N; n++) {
      const int rc = ll_dequantize_row(w->type, (const char *)w->data + (size_t)n * rs, row, K);
      if (rc) {
        free(row);
        return rc;
      }
      for (int t = 0; t < T; t++) {
        const float d = dout[(size_t)t * N + n];
        float *dxt = dx + (size_t)t * K;
        for (int64_t k = 0; k < K; k++) dxt[k] += d * row[k];
      }
    }
    free(row);
  }
  if (dw) {
    for (int64_t n = 0; n < N; n++) {
      float *dwn = dw + (size_t)n * K;
      for (int t = 0; t < T; t++) {
        const float d = dout[(size_t)t * N + n];
        const float *xt = x + (size_t)t * K;
        for (int64_t k = 0; k < K; k++) dwn[k] += d * xt[k];
      }
    }
  }
  return 0;
}

// ---------------------------------------------------------------- rmsnorm
// forward:  s_t = 1 / sqrt(Σ_i x[t,i]² / C + eps);   out[t,i] = x[t,i] s_t g[i]
// backward: ∂s_t/∂x[t,j] = -s_t³ x[t,j] / C, so
//           dx[t,j] += s_t g[j] dout[t,j] - x[t,j] s_t³ / C · Σ_i dout[t,i] g[i] x[t,i]
//           dg[i]   += Σ_t dout[t,i] x[t,i] s_t
int ll_train_ref_rmsnorm_backward(struct ll_backend *b, float *dx, float *dg, const float *dout, const float *x, const float *g,
                                  int T, int C, float eps) {
  (void)b;
  if (!dout || !x || !g || T < 0 || C <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * C, *dt = dout + (size_t)t * C;
    double ss = 0;
    for (int i = 0; i < C; i++) ss += (double)(xt[i] * xt[i]); // the forward's sum
    const float s = 1.0f / sqrtf((float)(ss / C) + eps);
    double dot = 0; // Σ_i dout g x
    for (int i = 0; i < C; i++) dot += (double)dt[i] * g[i] * xt[i];
    const float c3 = (float)(dot * s * s * s / C);
    if (dx) {
      float *dxt = dx + (size_t)t * C;
      for (int i = 0; i < C; i++) dxt[i] += s * g[i] * dt[i] - xt[i] * c3;
    }
    if (dg)
      for (int i = 0; i < C; i++) dg[i] += dt[i] * xt[i] * s;
  }
  return 0;
}

// ---------------------------------------------------------------- rope
// forward (per head, pair (a, c) = (2i, 2i+1) or NEOX (i, i + n_rot/2), angle th_i(pos)):
//   y_a = x_a cos - x_c sin;   y_c = x_a sin + x_c cos        (dims >= n_rot pass through)
// backward: the transposed rotation (a rotation by -th):
//   dx_a = dy_a cos + dy_c sin;   dx_c = -dy_a sin + dy_c cos
int ll_train_ref_rope_backward(struct ll_backend *b, float *dx, const int32_t *pos, int T, int n_head, int head_dim,
                               const struct ll_rope_params *p) {
  (void)b;
  if (!dx || !pos || !p || T < 0 || n_head <= 0 || p->n_rot < 0 || p->n_rot % 2 || p->n_rot > head_dim) return LL_EINVAL;
  const int n = p->n_rot / 2;
  float *cs = malloc((size_t)(n + 1) * 2 * sizeof *cs), *sn = cs ? cs + n + 1 : NULL;
  if (!cs) return LL_ENOMEM;
  for (int t = 0; t < T; t++) {
    ll_rope_angles(pos[t], p, cs, sn);
    for (int h = 0; h < n_head; h++) {
      float *v = dx + ((size_t)t * n_head + h) * head_dim; // (head_dim)
      for (int i = 0; i < n; i++) {
        const int a = p->mode == LL_ROPE_NEOX ? i : 2 * i, c = p->mode == LL_ROPE_NEOX ? i + n : 2 * i + 1;
        const float da = v[a], dc = v[c];
        v[a] = da * cs[i] + dc * sn[i];
        v[c] = -da * sn[i] + dc * cs[i];
      }
    }
  }
  free(cs);
  return 0;
}

// ---------------------------------------------------------------- swiglu
// forward:  σ = 1 / (1 + e^-gate);  out = gate σ up          (silu(gate) = gate σ)
// backward: dup = dout gate σ;  dgate = dout up σ (1 + gate (1 - σ))   (σ' = σ (1 - σ))
// Element by element, so dgate/dup may alias gate/up/dout.
int ll_train_ref_swiglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, int64_t n) {
  (void)b;
  if (!dgate || !dup || !dout || !gate || !up || n < 0) return LL_EINVAL;
  for (int64_t i = 0; i < n; i++) {
    const float gt = gate[i], u = up[i], d = dout[i];
    const float sg = 1.0f / (1.0f + expf(-gt));
    dup[i] = d * gt * sg;
    dgate[i] = d * u * sg * (1.0f + gt * (1.0f - sg));
  }
  return 0;
}

// ---------------------------------------------------------------- geglu
// forward:  u = c (gate + a gate³), c = sqrt(2/π), a = 0.044715 (ggml's constants);
//           gelu = ½ gate (1 + tanh u);  out = gelu up
// backward: dup = dout gelu;  dgate = dout up gelu',
//           gelu' = ½ (1 + tanh u) + ½ gate (1 - tanh² u) c (1 + 3 a gate²)
// Element by element, so dgate/dup may alias gate/up/dout.
#define GELU_C 0.79788456080286535587989211986876f
#define GELU_A 0.044715f
int ll_train_ref_geglu(struct ll_backend *b, float *out, const float *gate, const float *up, int64_t n) {
  (void)b;
  if (!out || !gate || !up || n < 0) return LL_EINVAL;
  for (int64_t i = 0; i < n; i++) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_C * x * (1.0f + GELU_A * x * x))) * up[i];
  }
  return 0;
}
int ll_train_ref_geglu_backward(struct ll_backend *b, float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n) {
  (void)b;
  if (!dgate || !dup || !dout || !gate || !up || n < 0) return LL_EINVAL;
  for (int64_t i = 0; i < n; i++) {
    const float x = gate[i], u = up[i], d = dout[i];
    const float th = tanhf(GELU_C * x * (1.0f + GELU_A * x * x));
    const float gl = 0.5f * x * (1.0f + th);
    const float dgl = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_C * (1.0f + 3.0f * GELU_A * x * x);
    dup[i] = d * gl;
    dgate[i] = d * u * dgl;
  }
  return 0;
}

// ---------------------------------------------------------------- attention (training)
// q (S, H, hd), k, v (S, Hkv, hd); head h reads kv head h / (H / Hkv).
// forward, per head h and query i (keys lo <= j <= i; lo = 0, or i + 1 - window in a window):
//   s_ij = scale q_i · k_j;   p_ij = e^(s_ij - max_j s) / Σ_j e^(s_ij - max);   out_i = Σ_j p_ij v_j
//   att[h, i, j] = p_ij (0 for j < lo and j > i), kept for the backward pass.
static int attn_check(int S, int H, int Hkv, int hd) { return S < 0 || H <= 0 || Hkv <= 0 || hd <= 0 || H % Hkv ? LL_EINVAL : 0; }

int ll_train_ref_attention_train(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v,
                                 int S, int n_head, int n_head_kv, int head_dim, float scale) {
  return ll_train_ref_attention_train_swa(b, out, att, q, k, v, S, n_head, n_head_kv, head_dim, scale, 0);
}
int ll_train_ref_attention_train_swa(struct ll_backend *b, float *out, float *att, const float *q, const float *k, const float *v,
                                     int S, int n_head, int n_head_kv, int head_dim, float scale, int window) {
  (void)b;
  if (!out || !att || !q || !k || !v || attn_check(S, n_head, n_head_kv, head_dim)) return LL_EINVAL;
  const int H = n_head, Hkv = n_head_kv, hd = head_dim, grp = H / Hkv;
  for (int h = 0; h < H; h++) {
    const int kh = h / grp;
    for (int i = 0; i < S; i++) {
      const float *qi = q + ((size_t)i * H + h) * hd;
      float *p = att + ((size_t)h * S + i) * S; // (S) row i of head h
      const int lo = window > 0 && i + 1 > window ? i + 1 - window : 0;
      float mx = -INFINITY;
      for (int j = 0; j < lo; j++) p[j] = 0;
      for (int j = lo; j <= i; j++) {
        const float *kj = k + ((size_t)j * Hkv + kh) * hd;
        float s = 0;
        for (int e = 0; e < hd; e++) s += qi[e] * kj[e];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      double sum = 0;
      for (int j = lo; j <= i; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
      }
      const float inv = (float)(1.0 / sum);
      for (int j = lo; j <= i; j++) p[j] *= inv;
      for (int j = i + 1; j < S; j++) p[j] = 0;
      float *oi = out + ((size_t)i * H + h) * hd;
      for (int e = 0; e < hd; e++) oi[e] = 0;
      for (int j = lo; j <= i; j++) {
        const float *vj = v + ((size_t)j * Hkv + kh) * hd;
        for (int e = 0; e < hd; e++) oi[e] += p[j] * vj[e];
      }
    }
  }
  return 0;
}

// backward, per head h and query i (keys j <= i):
//   dv_j += p_ij dout_i                          (out_i = Σ_j p_ij v_j)
//   dp_ij = dout_i · v_j
//   ds_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij')       (softmax Jacobian)
//   dq_i += scale Σ_j ds_ij k_j;   dk_j += scale ds_ij q_i
// dk, dv of a kv head sum over the query heads sharing it.
int ll_train_ref_attention_backward(struct ll_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *att, int S, int n_head, int n_head_kv,
                                    int head_dim, float scale) {
  (void)b;
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !att || attn_check(S, n_head, n_head_kv, head_dim)) return LL_EINVAL;
  const int H = n_head, Hkv = n_head_kv, hd = head_dim, grp = H / Hkv;
  memset(dq, 0, (size_t)S * H * hd * sizeof *dq);
  memset(dk, 0, (size_t)S * Hkv * hd * sizeof *dk);
  memset(dv, 0, (size_t)S * Hkv * hd * sizeof *dv);
  float *dp = malloc((size_t)(S > 0 ? S : 1) * sizeof *dp); // (S) dp_ij then ds_ij of one row
  if (!dp) return LL_ENOMEM;
  for (int h = 0; h < H; h++) {
    const int kh = h / grp;
    for (int i = 0; i < S; i++) {
      const float *p = att + ((size_t)h * S + i) * S;
      const float *doi = dout + ((size_t)i * H + h) * hd, *qi = q + ((size_t)i * H + h) * hd;
      double D = 0; // Σ_j p_ij dp_ij
      for (int j = 0; j <= i; j++) {
        const float *vj = v + ((size_t)j * Hkv + kh) * hd;
        float *dvj = dv + ((size_t)j * Hkv + kh) * hd;
        float s = 0;
        for (int e = 0; e < hd; e++) {
          s += doi[e] * vj[e];
          dvj[e] += p[j] * doi[e];
        }
        dp[j] = s;
        D += (double)p[j] * s;
      }
      float *dqi = dq + ((size_t)i * H + h) * hd;
      for (int j = 0; j <= i; j++) {
        const float ds = p[j] * (dp[j] - (float)D) * scale;
        const float *kj = k + ((size_t)j * Hkv + kh) * hd;
        float *dkj = dk + ((size_t)j * Hkv + kh) * hd;
        for (int e = 0; e < hd; e++) {
          dqi[e] += ds * kj[e];
          dkj[e] += ds * qi[e];
        }
      }
    }
  }
  free(dp);
  return 0;
}

// ---------------------------------------------------------------- cross-entropy
// forward:  loss = Σ_{t: target_t >= 0} -log softmax(logits_t)[target_t]
//           = Σ_t (log Σ_j e^(l_tj - m_t) - (l_t,y - m_t))     (m_t = max_j l_tj; sum in double)
// backward: dlogits[t,j] = (softmax_tj - [j == y_t]) grad_scale; 0 for rows not counted.
// dlogits may alias logits: a row's max, sum and target logit are read before it is written.
int ll_train_ref_softmax_xent(struct ll_backend *b, double *loss, float *dlogits, const float *logits, const int32_t *targets,
                              int T, int V, float grad_scale) {
  (void)b;
  if (!loss || !logits || !targets || T < 0 || V <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (targets[t] >= V) return LL_EINVAL; // before anything is written
  double total = 0;
  for (int t = 0; t < T; t++) {
    const float *l = logits + (size_t)t * V;
    float *d = dlogits ? dlogits + (size_t)t * V : NULL;
    const int y = targets[t];
    if (y < 0) {
      if (d) memset(d, 0, (size_t)V * sizeof *d);
      continue;
    }
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
    double sum = 0;
    for (int j = 0; j < V; j++) sum += expf(l[j] - m);
    const float ly = l[y];
    total += log(sum) - ((double)ly - m);
    if (d) {
      const float inv = (float)(1.0 / sum);
      for (int j = 0; j < V; j++) d[j] = (expf(l[j] - m) * inv - (j == y ? 1.0f : 0.0f)) * grad_scale;
    }
  }
  *loss = total;
  return 0;
}

// ---------------------------------------------------------------- embedding
// forward:  out[t, :] = W[ids[t], :]
// backward: dw[ids[t], :] += dout[t, :]       (repeated ids accumulate, in t order)
int ll_train_ref_get_rows_backward(struct ll_backend *b, float *dw, const float *dout, const int32_t *ids, int T, int C) {
  (void)b;
  if (!dw || !dout || !ids || T < 0 || C <= 0) return LL_EINVAL;
  for (int t = 0; t < T; t++)
    if (ids[t] < 0) return LL_EINVAL;
  for (int t = 0; t < T; t++) {
    float *row = dw + (size_t)ids[t] * C;
    for (int c = 0; c < C; c++) row[c] += dout[(size_t)t * C + c];
  }
  return 0;
}

// ---------------------------------------------------------------- dropout
// out_i = keep_i ? x_i / (1 - p) : 0, keep_i = ll_dropout_bits(seed, i) >= threshold(p).
// The mask is a function of (seed, i): the backward pass is the same call on dout.
int ll_train_ref_dropout(struct ll_backend *b, float *out, const float *x, float p, uint64_t seed, int64_t n) {
  (void)b;
  if (!out || !x || n < 0 || !(p >= 0.0f && p < 1.0f)) return LL_EINVAL;
  const uint64_t sm = ll_mix64(seed);
  const uint32_t th = ll_dropout_threshold(p);
  const float sc = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; i++) out[i] = ll_dropout_bits(sm, (uint64_t)i) >= th ? x[i] * sc : 0.0f;
  return 0;
}

// ---------------------------------------------------------------- vector helpers
int ll_train_ref_sumsq(struct ll_backend *b, double *out, const float *x, int64_t n) {
  (void)b;
  if (!out || !x || n < 0) return LL_EINVAL;
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  *out = s;
  return 0;
}

int ll_train_ref_axpy(struct ll_backend *b, float *out, const float *x, float alpha, int64_t n) {
  (void)b;
  if (!out || !x || n < 0) return LL_EINVAL;
  for (int64_t i = 0; i < n; i++) out[i] += alpha * x[i];
  return 0;
}

int ll_train_ref_scale(struct ll_backend *b, float *x, float alpha, int64_t n) {
  (void)b;
  if (!x || n < 0) return LL_EINVAL;
  for (int64_t i = 0; i < n; i++) x[i] *= alpha;
  return 0;
}

// ---------------------------------------------------------------- AdamW
// m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  m̂ = m / (1 - b1^step);  v̂ = v / (1 - b2^step)
// p -= lr (m̂ / (sqrt(v̂) + eps) + wd p)          (decoupled weight decay: on p, not on g)
// The per-element expression is shared with the fast version (same bits).
int ll_train_ref_adamw(struct ll_backend *b, float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float wd, int step) {
  (void)b;
  if (!p || !g || !m || !v || n < 0 || step < 1) return LL_EINVAL;
  const float bc1 = (float)(1.0 - pow(beta1, step)), bc2 = (float)(1.0 - pow(beta2, step));
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float mh = m[i] / bc1, vh = v[i] / bc2;
    p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
  }
  return 0;
}

static const struct ll_backend_i train_ref_iface = {
    .matmul_backward = ll_train_ref_matmul_backward,
    .rmsnorm_backward = ll_train_ref_rmsnorm_backward,
    .rope_backward = ll_train_ref_rope_backward,
    .swiglu_backward = ll_train_ref_swiglu_backward,
    .geglu = ll_train_ref_geglu,
    .geglu_backward = ll_train_ref_geglu_backward,
    .attention_train = ll_train_ref_attention_train,
    .attention_train_swa = ll_train_ref_attention_train_swa,
    .attention_backward = ll_train_ref_attention_backward,
    .softmax_xent = ll_train_ref_softmax_xent,
    .get_rows_backward = ll_train_ref_get_rows_backward,
    .dropout = ll_train_ref_dropout,
    .sumsq = ll_train_ref_sumsq,
    .axpy = ll_train_ref_axpy,
    .scale = ll_train_ref_scale,
    .adamw = ll_train_ref_adamw,
};
const struct ll_backend_i *ll_cpu_train_ref(void) { return &train_ref_iface; }
