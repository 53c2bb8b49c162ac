// train.cl - OpenCL 1.2 kernels of the training members of struct ll_backend_i (train_ops.c).
//
// Embedded after llsrv.cl (cmake globs kernels/opencl/*.cl in name order, one source): it uses
// llsrv.cl's helpers (fdiv, fsqrt, acc_t, inv_sum, LL_FP64) and its FP_CONTRACT OFF.
//
// Numerics follow the CPU's scalar references (kernels/cpu/train_ref.c): every float sum the
// reference makes in a fixed order is made here in that order by one work item (the parallel
// work is over the outputs, not the terms), products are not contracted into fma, divisions
// and square roots go through f64 where the device has it. So on an f64 device the products,
// norms, rope, attention backward, embedding backward, dropout, axpy, scale and AdamW give the
// reference's bits; what calls exp (swiglu, softmax, attention's softmax) differs from libm's
// expf by ulps, and sums of squares are made in another order (within tolerances, see
// tests/test_opencl.c).

// ---------------------------------------------------------------- matmul backward
// Rows n0 .. n0 + nc of W (N rows of rb bytes) dequantized to wf (nc, K): fl >= 0 a float type
// (0 f32, 1 f16, 2 bf16; one work item per element), else quantized type wt (one work item
// per unit of 32, formats/quant.c's expressions as get_rows_q).
kernel void deq_rows(global const uchar *W, ulong rb, global float *wf, int K, int n0, int nc, int wt, int fl) {
  const int i = get_global_id(0);
  if (fl >= 0) {
    if (i >= nc * K) return;
    wf[i] = ldw(W + (size_t)(n0 + i / K) * rb, i % K, fl);
    return;
  }
  const int nu = K / 32;
  if (i >= nc * nu) return;
  deq_unit(wt, W + (size_t)(n0 + i / nu) * rb, i % nu, wf + (size_t)i * 32);
}

// dx (T, K) += dout (T, N) · Wf (nc, K) for rows n0 .. n0 + nc of W (dequantized to f32 by
// get_rows_*; a chunk at a time, so dx carries the sum between chunks); one work item per
// (k, t), adding n in order as the reference does.
kernel void mm_bwd_dx(global float *dx, global const float *dout, global const float *wf, int T, int N, int K, int n0, int nc) {
  const int k = get_global_id(0), t = get_global_id(1);
  if (k >= K || t >= T) return;
  global const float *d = dout + (size_t)t * N + n0;
  float acc = dx[(size_t)t * K + k];
  for (int n = 0; n < nc; n++) acc += d[n] * wf[(size_t)n * K + k];
  dx[(size_t)t * K + k] = acc;
}

// dw (N, K) += dout (T, N)ᵀ · x (T, K); one work item per (k, n), adding t in order.
kernel void mm_bwd_dw(global float *dw, global const float *dout, global const float *x, int T, int N, int K) {
  const int k = get_global_id(0), n = get_global_id(1);
  if (k >= K || n >= N) return;
  float acc = dw[(size_t)n * K + k];
  for (int t = 0; t < T; t++) acc += dout[(size_t)t * N + n] * x[(size_t)t * K + k];
  dw[(size_t)n * K + k] = acc;
}

// ---------------------------------------------------------------- rmsnorm backward
// s_t = 1 / sqrt(Σ x² / C + eps);  c3_t = Σ_i dout g x · s³ / C
// dx[t,j] += s g[j] dout[t,j] - x[t,j] c3;  st (T) receives s_t for rmsnorm_bwd_dg.
// One work-group per row; the two sums by one work item in the reference's order (f64 where
// the device has it).
kernel void rmsnorm_bwd(global float *dx, global float *st, global const float *dout, global const float *x, global const float *g,
                        int C, float eps, int want_dx) {
  local float s_l, c3_l;
  const int t = get_group_id(0), lid = get_local_id(0);
  global const float *xr = x + (size_t)t * C, *dr = dout + (size_t)t * C;
  if (lid == 0) {
    acc_t ss = 0, dot = 0;
    for (int i = 0; i < C; i++) ss += (acc_t)(xr[i] * xr[i]);
#ifdef LL_FP64
    const float s = fdiv(1.0f, fsqrt((float)(ss / C) + eps));
    for (int i = 0; i < C; i++) dot += (double)dr[i] * g[i] * xr[i];
    c3_l = (float)(dot * s * s * s / C);
#else
    const float s = 1.0f / sqrt(ss / (float)C + eps);
    for (int i = 0; i < C; i++) dot += dr[i] * g[i] * xr[i];
    c3_l = dot * s * s * s / (float)C;
#endif
    s_l = s;
    st[t] = s;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (want_dx) {
    const float s = s_l, c3 = c3_l;
    global float *o = dx + (size_t)t * C;
    for (int i = lid; i < C; i += WG) o[i] += s * g[i] * dr[i] - xr[i] * c3;
  }
}

// dg (C) += Σ_t dout[t,i] x[t,i] s_t; one work item per i, t in order.
kernel void rmsnorm_bwd_dg(global float *dg, global const float *st, global const float *dout, global const float *x, int T, int C) {
  const int i = get_global_id(0);
  if (i >= C) return;
  float acc = dg[i];
  for (int t = 0; t < T; t++) acc += dout[(size_t)t * C + i] * x[(size_t)t * C + i] * st[t];
  dg[i] = acc;
}

// ---------------------------------------------------------------- rope backward
// dx (T, H, hd) in place: the rotation by -th, with the host's cos/sin tables (T, np).
kernel void rope_bwd(global float *x, global const float *cs, global const float *sn, int T, int H, int hd, int np, int neox) {
  const int i = get_global_id(0);
  if (i >= T * H * np) return;
  const int p = i % np, h = (i / np) % H, t = i / (np * H);
  global float *v = x + ((size_t)t * H + h) * hd;
  const int a = neox ? p : 2 * p, c2 = neox ? p + np : 2 * p + 1;
  const float da = v[a], dc = v[c2], c = cs[(size_t)t * np + p], s = sn[(size_t)t * np + p];
  v[a] = da * c + dc * s;
  v[c2] = -da * s + dc * c;
}

// ---------------------------------------------------------------- swiglu backward
// σ = 1 / (1 + e^-gate);  dup = dout gate σ;  dgate = dout up σ (1 + gate (1 - σ))
kernel void swiglu_bwd(global float *dgate, global float *dup, global const float *dout, global const float *g, global const float *u, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float gt = g[i], uv = u[i], d = dout[i];
  const float sg = fdiv(1.0f, 1.0f + exp(-gt));
  dup[i] = d * gt * sg;
  dgate[i] = d * uv * sg * (1.0f + gt * (1.0f - sg));
}

// ---------------------------------------------------------------- attention (training)
// q (S, H, hd), k, v (S, Hkv, hd); att (H, S, S). Query i sees keys lo..i, lo = max(0, i + 1 -
// window) (window <= 0: lo = 0, causal; a local layer's window: ll_train_ref_attention_train_swa's
// order); att is 0 outside them. One work-group per (query i, head h): scores (one work item
// each, e in order), softmax by one work item (max, then the f64 sum in j order), out_i[e] (one
// work item each, j in order).
kernel void attn_train(global float *out, global float *att, global const float *q, global const float *k, global const float *v, int S,
                       int H, int Hkv, int hd, float scale, int window) {
  const int i = get_group_id(0) / H, h = get_group_id(0) % H, lid = get_local_id(0);
  const int kh = h / (H / Hkv), lo = window > 0 && i + 1 > window ? i + 1 - window : 0;
  global const float *qi = q + ((size_t)i * H + h) * hd;
  global float *p = att + ((size_t)h * S + i) * S; // (S) row i of head h
  for (int j = lid; j < S; j += WG) {
    if (j < lo || j > i) {
      p[j] = 0;
      continue;
    }
    global const float *kj = k + ((size_t)j * Hkv + kh) * hd;
    float s = 0;
    for (int e = 0; e < hd; e++) s += qi[e] * kj[e];
    p[j] = s * scale;
  }
  barrier(CLK_GLOBAL_MEM_FENCE);
  if (lid == 0) {
    float mx = -INFINITY;
    for (int j = lo; j <= i; j++)
      if (p[j] > mx) mx = p[j];
    acc_t sum = 0;
    for (int j = lo; j <= i; j++) {
      p[j] = exp(p[j] - mx);
      sum += p[j];
    }
    const float inv = inv_sum(sum);
    for (int j = lo; j <= i; j++) p[j] *= inv;
  }
  barrier(CLK_GLOBAL_MEM_FENCE);
  global float *oi = out + ((size_t)i * H + h) * hd;
  for (int e = lid; e < hd; e += WG) {
    float acc = 0;
    for (int j = lo; j <= i; j++) acc += p[j] * v[((size_t)j * Hkv + kh) * hd + e];
    oi[e] = acc;
  }
}

// Backward, first pass: one work-group per (query i, head h).
//   dp_ij = dout_i · v_j;  D = Σ_j p_ij dp_ij (f64, j in order);  ds_ij = p_ij (dp_ij - D) scale
//   dq_i[e] = Σ_j ds_ij k_j[e]
// ds (H, S, S) is kept for the second pass (dk, dv).
kernel void attn_bwd_q(global float *dq, global float *ds, global const float *dout, global const float *q, global const float *k,
                       global const float *v, global const float *att, int S, int H, int Hkv, int hd, float scale) {
  local float D_l;
  const int i = get_group_id(0) / H, h = get_group_id(0) % H, lid = get_local_id(0);
  const int kh = h / (H / Hkv);
  global const float *p = att + ((size_t)h * S + i) * S, *doi = dout + ((size_t)i * H + h) * hd;
  global float *dsr = ds + ((size_t)h * S + i) * S;
  for (int j = lid; j <= i; j += WG) {
    global const float *vj = v + ((size_t)j * Hkv + kh) * hd;
    float s = 0;
    for (int e = 0; e < hd; e++) s += doi[e] * vj[e];
    dsr[j] = s; // dp_ij for now
  }
  barrier(CLK_GLOBAL_MEM_FENCE);
  if (lid == 0) {
    acc_t D = 0;
    for (int j = 0; j <= i; j++) D += (acc_t)p[j] * dsr[j];
    D_l = (float)D;
  }
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  const float D = D_l;
  for (int j = lid; j < S; j += WG) dsr[j] = j <= i ? p[j] * (dsr[j] - D) * scale : 0.0f;
  barrier(CLK_GLOBAL_MEM_FENCE);
  global float *dqi = dq + ((size_t)i * H + h) * hd;
  for (int e = lid; e < hd; e += WG) {
    float acc = 0;
    for (int j = 0; j <= i; j++) acc += dsr[j] * k[((size_t)j * Hkv + kh) * hd + e];
    dqi[e] = acc;
  }
}

// Second pass: one work item per (key j, kv head kh, e); the query heads sharing kh in
// order, then queries i >= j in order, as the reference accumulates.
//   dv_j[e] = Σ_h Σ_i p_hij dout_i[e];   dk_j[e] = Σ_h Σ_i ds_hij q_i[e]
kernel void attn_bwd_kv(global float *dk, global float *dv, global const float *ds, global const float *dout, global const float *q,
                        global const float *att, int S, int H, int Hkv, int hd) {
  const int gid = get_global_id(0);
  if (gid >= S * Hkv * hd) return;
  const int e = gid % hd, kh = (gid / hd) % Hkv, j = gid / (hd * Hkv), grp = H / Hkv;
  float ak = 0, av = 0;
  for (int h = kh * grp; h < (kh + 1) * grp; h++)
    for (int i = j; i < S; i++) {
      const size_t pi = ((size_t)h * S + i) * S + j, oi = ((size_t)i * H + h) * hd + e;
      av += att[pi] * dout[oi];
      ak += ds[pi] * q[oi];
    }
  dk[gid] = ak;
  dv[gid] = av;
}

// ---------------------------------------------------------------- cross-entropy
// One work-group per row t of logits (T, V): the max, then Σ e^(l - m) (per-lane partials in
// f64 where the device has it, else f32, summed in a fixed tree); rs[t] = (m, hi, lo) with
// hi + lo the sum (lo carries what f32 drops of an f64 sum) for the host's loss in double;
// then dlogits (if want_d) = (softmax - onehot) * grad_scale, 0 for rows with targets < 0.
// No early return: every work item reaches every barrier (a masked row computes its softmax
// and discards it; PoCL crashed on the early-return form when V < WG).
kernel void xent(global float *d, global float4 *rs, global const float *l, global const int *targets, int V, float grad_scale,
                 int want_d) {
  local float lm[WG];
  local acc_t ls[WG];
  const int t = get_group_id(0), lid = get_local_id(0), y = targets[t];
  global const float *lr = l + (size_t)t * V;
  // The target's logit, read before any work item of the row can overwrite it (d may be l).
  const float ly = lid == 0 && y >= 0 ? lr[y] : 0.0f;
  float m = -INFINITY;
  for (int j = lid; j < V; j += WG) m = fmax(m, lr[j]);
  lm[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) lm[lid] = fmax(lm[lid], lm[lid + st]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = lm[0];
  acc_t s = 0;
  for (int j = lid; j < V; j += WG) s += (acc_t)exp(lr[j] - m);
  ls[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) ls[lid] += ls[lid + st];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const acc_t sum = ls[0];
  if (lid == 0) {
    const float hi = (float)sum;
    rs[t] = y < 0 ? (float4)(0, 0, 0, 0) : (float4)(m, hi, (float)(sum - (acc_t)hi), ly);
  }
  if (want_d) {
    const float inv = inv_sum(sum);
    for (int j = lid; j < V; j += WG)
      d[(size_t)t * V + j] = y < 0 ? 0.0f : (exp(lr[j] - m) * inv - (j == y ? 1.0f : 0.0f)) * grad_scale;
  }
}

// ---------------------------------------------------------------- embedding backward
// rows (U, C): the distinct rows of dw that ids name, slot[t] the row of token t;
// rows[slot[t], c] += dout[t, c], one work item per c, t in order (repeated ids accumulate
// as the reference's loop does).
kernel void get_rows_bwd(global float *rows, global const float *dout, global const int *slot, int T, int C) {
  const int c = get_global_id(0);
  if (c >= C) return;
  for (int t = 0; t < T; t++) rows[(size_t)slot[t] * C + c] += dout[(size_t)t * C + c];
}

// ---------------------------------------------------------------- dropout
// The CPU's counter-based mask (kernels/cpu/ll_cpu_train.h): splitmix64 of
// mix(seed) + (i + 1) * golden gamma, its top 24 bits against the threshold.
inline ulong ll_mix64(ulong z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9UL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebUL;
  return z ^ (z >> 31);
}
kernel void dropout(global float *out, global const float *x, ulong seed_mixed, uint th, float sc, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const uint bits = (uint)(ll_mix64(seed_mixed + (ulong)(i + 1) * 0x9e3779b97f4a7c15UL) >> 40);
  out[i] = bits >= th ? x[i] * sc : 0.0f;
}

// ---------------------------------------------------------------- vector helpers
// Σ x² per work-group (grid-stride over n, then a tree), in f64 where the device has it:
// part[g] = (hi, lo) with hi + lo the group's sum; the host adds the groups in double.
kernel void sumsq(global float2 *part, global const float *x, long n) {
  local acc_t ls[WG];
  const int lid = get_local_id(0);
  acc_t s = 0;
  for (long i = get_global_id(0); i < n; i += get_global_size(0)) s += (acc_t)x[i] * x[i];
  ls[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) ls[lid] += ls[lid + st];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) {
    const float hi = (float)ls[0];
    part[get_group_id(0)] = (float2)(hi, (float)(ls[0] - (acc_t)hi));
  }
}

kernel void axpy(global float *out, global const float *x, float alpha, long n) {
  const long i = get_global_id(0);
  if (i < n) out[i] += alpha * x[i];
}

kernel void scale(global float *x, float alpha, long n) {
  const long i = get_global_id(0);
  if (i < n) x[i] *= alpha;
}

// AdamW, the reference's expression (bc1, bc2 from the host as it computes them), the weight
// decay on the first n_decay elements only (n_decay = n: one tensor's update; the fast tier's
// adamw_split: the trainer's whole arena in one launch, its decayed tensors first).
kernel void adamw(global float *p, global const float *g, global float *m, global float *v, long n, long n_decay, float lr, float b1,
                  float b2, float eps, float wd, float bc1, float bc2) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float gi = g[i], wdi = i < n_decay ? wd : 0.0f;
  const float mi = b1 * m[i] + (1.0f - b1) * gi;
  const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
  m[i] = mi, v[i] = vi;
  const float mh = fdiv(mi, bc1), vh = fdiv(vi, bc2);
  p[i] -= lr * (fdiv(mh, fsqrt(vh) + eps) + wdi * p[i]);
}
