// train_window.cl - the training members Gemma 3 adds (train_ops.c): GeGLU's backward and the
// sliding-window training attention of local layers, both tiers. Embedded after train.cl and
// train_fast.cl (one program; their helpers, WG, acc_t, inv_sum, fdiv, FP_CONTRACT OFF).

// ---------------------------------------------------------------- geglu backward (reference)
// As kernels/cpu/train_ref.c ll_train_ref_geglu_backward, the same expressions in the same
// order (uncontracted): u = c x (1 + a x²), th = tanh u, gelu = ½ x (1 + th);
// dup = dout gelu;  dgate = dout up (½ (1 + th) + ½ x (1 - th²) c (1 + 3 a x²)).
// The device's tanh instead of libm's tanhf: within ulps (tests/test_opencl.c). Both tiers.
kernel void geglu_bwd(global float *dgate, global float *dup, global const float *dout, global const float *g, global const float *u, long n) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float c = 0.79788456080286535587989211986876f, a = 0.044715f;
  const float x = g[i], uv = u[i], d = dout[i];
  const float th = tanh(c * x * (1.0f + a * x * x));
  const float gl = 0.5f * x * (1.0f + th);
  const float dgl = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * c * (1.0f + 3.0f * a * x * x);
  dup[i] = d * gl;
  dgate[i] = d * uv * dgl;
}

// ---------------------------------------------------------------- windowed attention (reference)
// train.cl's attn_train with a window (ll_train_ref_attention_train_swa's order): query i sees
// keys lo..i, lo = max(0, i + 1 - window) (window <= 0: lo = 0); att is 0 outside them. One
// work-group per (query i, head h): scores (one work item each, e in order), softmax by one
// work item (max, then the f64 sum in j order), out_i[e] (one work item each, j in order).
kernel void attn_train_swa(global float *out, global float *att, global const float *q, global const float *k, global const float *v, int S,
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

// ---------------------------------------------------------------- windowed attention (fast tier)
// train_fast.cl's attn_rows_softmax with a window: row i of head h holds the scaled scores of
// keys 0..S-1 (gemm_tiled's); the softmax over lo..i in place (work-group reductions), 0 outside.
// P·V then sums the zeros (the products are not narrowed to the window).
kernel void attn_rows_softmax_swa(global float *att, int S, int window) {
  local float lr[WG];
  const int row = get_group_id(0), i = row % S, lid = get_local_id(0);
  const int lo = window > 0 && i + 1 > window ? i + 1 - window : 0;
  global float *p = att + (long)row * S;
  float m = -INFINITY;
  for (int j = lo + lid; j <= i; j += WG) m = fmax(m, p[j]);
  lr[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) lr[lid] = fmax(lr[lid], lr[lid + st]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = lr[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float s = 0.0f;
  for (int j = lo + lid; j <= i; j += WG) s += exp(p[j] - m);
  lr[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) lr[lid] += lr[lid + st];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / lr[0];
  for (int j = lid; j < S; j += WG) p[j] = j >= lo && j <= i ? exp(p[j] - m) * inv : 0.0f;
}
