// llsrv_fast.cl - the fast tier of the OpenCL backend's forward kernels (after llsrv.cl, whose
// helpers it uses; embedded with it).
//
// The reference tier (llsrv.cl) sums in the CPU's order so that PoCL reproduces the CPU bit for
// bit; that costs a launch per step of each op and one work-group per output row. These kernels
// are what a GPU wants instead, and are checked against the CPU with tolerances, not bits
// (tests/test_opencl.c: normalized MSE per op; end to end by perplexity and teacher-forced top-1
// agreement on SmolLM2):
// - activations are quantized as the CPU quantizes them (Q8_0, Q8_1, Q8_K; f16/bf16 rounding for
//   float weights) inside the product, unit by unit, and multiplied back out in f32: no
//   quantization pass of its own (one launch fewer per product), and the results stay within
//   float rounding of the CPU's (f32 activations would be nearer the exact product but farther
//   from the CPU's: SmolLM2's perplexity moved 0.2% that way);
// - RMSNorm is fused into the product that reads its output (each work-group recomputes the
//   1/rms of its tokens: a pass over K floats, against the FR rows of weights it reads), the
//   residual add into the product before it (out +=), gate, up and SwiGLU into one kernel, and
//   the q, k, v products of one input into one launch (up to three matrices of one type);
// - FR output rows per work-group, FL work items per row, each unit of 32 weights unpacked once
//   with vector loads of the block's bytes and applied to FT tokens, whose activations the
//   work-group normalizes and quantizes once into local memory, KC at a time, for all its rows;
// - RoPE of q and k with the KV store in one kernel; greedy sampling (argmax) on the device, so
//   a decode step reads back one id per sequence.
// Sums are f32 trees, so results differ from the CPU's in the last bits and vary with the
// device; they do not vary with batch composition (each row's sums depend on the row alone).

#define FR 4  // output rows per work-group
#define FL 16 // work items per row (FR * FL == WG)
#define FT 4  // tokens per work-group (== FR: the norm pass gives each token FL work items)
#define KC 512 // activations staged in local memory per pass: FT x KC floats (a multiple of 256)
// Prompts and batches (fmmt_*): FTMAX tokens a work-group share each unpacked weight unit (the
// weights are read once per FTMAX tokens; acc[FTMAX] the register block), KCT activations a pass.
#define FTMAX 16 // <= FL: a lane per token when the lanes' sums are added
#define KCT 256

// Unit u (32 weights) of a row as floats. wt is a literal at every call (one kernel per type),
// so the switch folds away.
// *m: the unit's offset (Q4_1, Q5_1: every weight is d * q + m), 0 for the other types.
inline void fu_unit(const int wt, global const uchar *row, int u, float *w, float *mo) {
  *mo = 0;
  if (wt == 0) { // F32
    global const float *p = (global const float *)row + (size_t)u * 32;
    for (int j = 0; j < 32; j += 4) vstore4(vload4(0, p + j), 0, w + j);
    return;
  }
  if (wt == 1) { // F16
    global const half *p = (global const half *)row + (size_t)u * 32;
    for (int j = 0; j < 32; j += 4) vstore4(vload_half4(0, p + j), 0, w + j);
    return;
  }
  if (wt == 30) { // BF16
    global const ushort *p = (global const ushort *)row + (size_t)u * 32;
    for (int j = 0; j < 32; j += 8) {
      const uint8 v = convert_uint8(vload8(0, p + j)) << 16;
      vstore8(as_float8(v), 0, w + j);
    }
    return;
  }
  if (wt == 2 || wt == 3) { // Q4_0: d * (q - 8); Q4_1: d * q + m
    global const uchar *blk = row + u * (wt == 2 ? 18 : 20);
    const float d = ldh(blk), m = wt == 3 ? ldh(blk + 2) : -8.0f * d;
    if (wt == 3) *mo = m;
    uchar qs[16];
    vstore16(vload16(0, blk + (wt == 2 ? 2 : 4)), 0, qs);
    for (int j = 0; j < 16; j++) w[j] = fma(d, (float)(qs[j] & 15), m), w[j + 16] = fma(d, (float)(qs[j] >> 4), m);
    return;
  }
  if (wt == 6 || wt == 7) { // Q5_0: d * (q - 16); Q5_1: d * q + m
    global const uchar *blk = row + u * (wt == 6 ? 22 : 24), *hp = blk + (wt == 6 ? 2 : 4);
    const float d = ldh(blk), m = wt == 7 ? ldh(blk + 2) : -16.0f * d;
    if (wt == 7) *mo = m;
    const uint qh = hp[0] | (hp[1] << 8) | (hp[2] << 16) | ((uint)hp[3] << 24);
    uchar qs[16];
    vstore16(vload16(0, hp + 4), 0, qs);
    for (int j = 0; j < 16; j++) {
      w[j] = fma(d, (float)((qs[j] & 15) | (((qh >> j) << 4) & 0x10)), m);
      w[j + 16] = fma(d, (float)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)), m);
    }
    return;
  }
  if (wt == 8) { // Q8_0: d * q
    global const uchar *blk = row + u * 34;
    const float d = ldh(blk);
    char qs[32];
    vstore16(vload16(0, (global const char *)(blk + 2)), 0, qs);
    vstore16(vload16(1, (global const char *)(blk + 2)), 0, qs + 16);
    for (int j = 0; j < 32; j++) w[j] = d * (float)qs[j];
    return;
  }
  if (wt == 12 || wt == 13) { // Q4_K, Q5_K: (d * sc) * q - dmin * m, sub-block u & 7
    const int j = u & 7;
    global const uchar *blk = row + (u >> 3) * (wt == 12 ? 144 : 176);
    int sc, m;
    k_scale_min(j, blk + 4, &sc, &m);
    const float d1 = ldh(blk) * (float)sc, m1 = ldh(blk + 2) * (float)m;
    const int sh = (j & 1) * 4;
    uchar qs[32], qh[32];
    global const uchar *qp = blk + (wt == 12 ? 16 : 48) + 32 * (j >> 1);
    vstore16(vload16(0, qp), 0, qs), vstore16(vload16(1, qp), 0, qs + 16);
    if (wt == 13) vstore16(vload16(0, blk + 16), 0, qh), vstore16(vload16(1, blk + 16), 0, qh + 16);
    for (int l = 0; l < 32; l++) {
      const int v = ((qs[l] >> sh) & 15) + (wt == 13 ? ((qh[l] >> j) & 1) * 16 : 0);
      w[l] = d1 * (float)v - m1;
    }
    return;
  }
  { // Q6_K: d * sc * (q - 32)
    const int j = u & 7, h = j >> 2, c = j & 3;
    global const uchar *blk = row + (u >> 3) * 210, *qlp = blk + 64 * h + 32 * (c & 1), *qhp = blk + 128 + 32 * h;
    global const char *sc = (global const char *)(blk + 192) + 8 * h + 2 * c;
    const float d = ldh(blk + 208), s0 = d * (float)sc[0], s1 = d * (float)sc[1];
    const int lsh = (c >> 1) * 4, hsh = 2 * c;
    uchar ql[32], qh[32];
    vstore16(vload16(0, qlp), 0, ql), vstore16(vload16(1, qlp), 0, ql + 16);
    vstore16(vload16(0, qhp), 0, qh), vstore16(vload16(1, qhp), 0, qh + 16);
    for (int l = 0; l < 32; l++)
      w[l] = (l < 16 ? s0 : s1) * (float)((int)(((ql[l] >> lsh) & 15) | (((qh[l] >> hsh) & 3) << 4)) - 32);
  }
}

// Activation unit u (32 floats) of row xr as the CPU's quantization of it for weight type wt
// gives it back: x (times s * g when norm: the RMSNorm) -> Q8_0 / Q8_1 (d = amax / 127 in f16),
// Q8_K (per 256-block, d = 1 / (-127 / the element of largest magnitude)), f16 / bf16 rounding,
// or f32 as is; each value its integer times d (act_quant's expressions, llsrv.cl). Returns, for
// Q8_1 (Q4_1, Q5_1 weights), the CPU's f16 unit sum s less the one the values imply (d * Σq):
// a weight unit's offset m multiplies s on the CPU, so m * that is added to the dot.
inline float xn_at(global const float *xr, global const float *g, float s, int norm, int i) { return norm ? (xr[i] * s) * g[i] : xr[i]; }
inline float act_unit(const int wt, global const float *xr, global const float *g, float s, int norm, int u, float *xv) {
  for (int j = 0; j < 32; j++) xv[j] = xn_at(xr, g, s, norm, u * 32 + j);
  if (wt == 0) return 0;
  if (wt == 1 || wt == 30) {
    for (int j = 0; j < 32; j++) xv[j] = wt == 1 ? round_f16(xv[j]) : round_bf16(xv[j]);
    return 0;
  }
  if (wt == 12 || wt == 13 || wt == 14) {
    float amax = 0, mx = 0;
    const int b0 = (u & ~7) * 32;
    for (int j = 0; j < 256; j++) {
      const float v = xn_at(xr, g, s, norm, b0 + j);
      if (amax < fabs(v)) amax = fabs(v), mx = v;
    }
    if (amax == 0.0f) {
      for (int j = 0; j < 32; j++) xv[j] = 0;
      return 0;
    }
    const float iscale = fdiv(-127.f, mx), d = fdiv(1.0f, iscale);
    for (int j = 0; j < 32; j++) xv[j] = d * (float)min((int)rint(iscale * xv[j]), 127);
    return 0;
  }
  float amax = 0;
  for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(xv[j]));
  const float d0 = fdiv(amax, 127.f), d = round_f16(d0), id = amax != 0.0f ? fdiv(127.f, amax) : 0.0f;
  int sum = 0;
  for (int j = 0; j < 32; j++) {
    const float q = rint(xv[j] * id);
    sum += (int)q;
    xv[j] = d * q;
  }
  return wt == 3 || wt == 7 ? round_f16(d0 * (float)sum) - d * (float)sum : 0;
}

// out[m] (T, N_m) (op) xn (T, K) · W_m (N_m, K)ᵀ for the nm <= 3 matrices W0, W1, W2 (one type,
// one row size rb), xn = x / rms(x) * g when norm, else x.
//   op 0: out = ..., op 1: out += ... (the residual), op 2 (nm == 2): o0 = silu(xn·W0ᵀ) * (xn·W1ᵀ)
//   (gate, up; N1 == N0).
// global (WG * blocks, ceil(T / FT)), local (WG, 1). Block b covers FR rows (op 2: FR / 2 rows of
// each matrix), the matrices' blocks one after another.
inline void fmm_body(const int wt, const int ft, const int kc, global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x,
                     global const float *g, float eps, int norm, global float *o0, global float *o1, global float *o2, int K, int N0, int N1,
                     int N2, int T, int op, local float *part, local float *inv, local float *xs, local float *dss) {
  const int lid = get_local_id(0), slot = lid / FL, lane = lid % FL;
  const int t0 = get_group_id(1) * ft, nt = min(ft, T - t0), blk = get_group_id(0);
  if (norm && ft == FR) { // 1/rms of token t0 + slot: FL work items over its K floats
    float s = 0;
    if (slot < nt) {
      global const float *xr = x + (size_t)(t0 + slot) * K;
      for (int i = lane; i < K; i += FL) s = fma(xr[i], xr[i], s);
    }
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lane == 0) {
      float tot = 0;
      for (int i = 0; i < FL; i++) tot += part[slot * FL + i];
      inv[slot] = fdiv(1.0f, fsqrt(tot / (float)K + eps));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  } else if (norm) { // token by token, all work items over its K floats
    for (int tt = 0; tt < ft; tt++) {
      float s = 0;
      if (tt < nt) {
        global const float *xr = x + (size_t)(t0 + tt) * K;
        for (int i = lid; i < K; i += FR * FL) s = fma(xr[i], xr[i], s);
      }
      part[lid] = s;
      barrier(CLK_LOCAL_MEM_FENCE);
      if (lid == 0) {
        float tot = 0;
        for (int i = 0; i < FR * FL; i++) tot += part[i];
        inv[tt] = fdiv(1.0f, fsqrt(tot / (float)K + eps));
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
  }
  // This work item's matrix and row.
  int m, row, valid;
  if (op == 2) {
    m = slot / (FR / 2), row = blk * (FR / 2) + slot % (FR / 2), valid = row < N0;
  } else {
    const int b0 = (N0 + FR - 1) / FR, b1 = (N1 + FR - 1) / FR;
    m = blk < b0 ? 0 : blk < b0 + b1 ? 1 : 2;
    row = (blk - (m == 0 ? 0 : m == 1 ? b0 : b0 + b1)) * FR + slot;
    valid = row < (m == 0 ? N0 : m == 1 ? N1 : N2);
  }
  global const uchar *Wm = m == 0 ? W0 : m == 1 ? W1 : W2;
  float acc[FTMAX];
  for (int tt = 0; tt < ft; tt++) acc[tt] = 0;
  global const uchar *wr = Wm + (size_t)row * rb;
  for (int k0 = 0; k0 < K; k0 += kc) {
    const int nuc = min(kc, K - k0) / 32, u0 = k0 / 32;
    // Stage: the chunk's activation units of the ft tokens, normalized and quantized once.
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = lid; i < ft * nuc; i += FR * FL) {
      const int tt = i / nuc, uu = i % nuc;
      if (tt < nt) {
        float xv[32];
        dss[tt * (kc / 32) + uu] = act_unit(wt, x + (size_t)(t0 + tt) * K, g, norm ? inv[tt] : 1.0f, norm, u0 + uu, xv);
        for (int j = 0; j < 32; j += 4) vstore4(vload4(0, xv + j), 0, xs + tt * kc + uu * 32 + j);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (valid) {
      for (int uu = lane; uu < nuc; uu += FL) {
        float w[32], mo;
        fu_unit(wt, wr, u0 + uu, w, &mo);
        for (int tt = 0; tt < nt; tt++) {
          local const float *xv = xs + tt * kc + uu * 32;
          float4 s4 = 0;
          for (int j = 0; j < 32; j += 4) s4 = fma(vload4(0, w + j), vload4(0, xv + j), s4);
          acc[tt] += ((s4.x + s4.y) + (s4.z + s4.w)) + mo * dss[tt * (kc / 32) + uu];
        }
      }
    }
  }
  // Sum the FL lanes of each (row, token): part (FR, ft, FL) in local memory.
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int tt = 0; tt < ft; tt++) part[(slot * ft + tt) * FL + lane] = acc[tt];
  barrier(CLK_LOCAL_MEM_FENCE);
  float r = 0;
  if (lane < nt) {
    local const float *pp = part + (slot * ft + lane) * FL;
    for (int i = 0; i < FL; i++) r += pp[i];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (op == 2) { // gate (slots 0 .. FR/2-1) and up (the rest) of the same rows meet in local memory
    if (lane < ft) part[slot * ft + lane] = lane < nt ? r : 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (slot < FR / 2 && lane < nt && valid) {
      const float gv = r, uv = part[(slot + FR / 2) * ft + lane];
      o0[(size_t)(t0 + lane) * N0 + row] = gv / (1.0f + exp(-gv)) * uv;
    }
    return;
  }
  if (lane < nt && valid) {
    const int N = m == 0 ? N0 : m == 1 ? N1 : N2;
    global float *o = (m == 0 ? o0 : m == 1 ? o1 : o2) + (size_t)(t0 + lane) * N + row;
    *o = op == 1 ? *o + r : r;
  }
}

#define FMM_KERNEL(NAME, WT)                                                                                                      \
  kernel void fmm_##NAME(global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x,    \
                         global const float *g, float eps, int norm, global float *o0, global float *o1, global float *o2, int K,    \
                         int N0, int N1, int N2, int T, int op) {                                                               \
    local float part[FR * FT * FL];                                                                                           \
    local float inv[FT];                                                                                                      \
    local float xs[FT * KC];                                                                                                  \
    local float dss[FT * (KC / 32)];                                                                                          \
    fmm_body(WT, FT, KC, W0, W1, W2, rb, x, g, eps, norm, o0, o1, o2, K, N0, N1, N2, T, op, part, inv, xs, dss);              \
  }                                                                                                                           \
  kernel void fmmt_##NAME(global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x,   \
                          global const float *g, float eps, int norm, global float *o0, global float *o1, global float *o2, int K,   \
                          int N0, int N1, int N2, int T, int op) {                                                              \
    local float part[FR * FTMAX * FL];                                                                                        \
    local float inv[FTMAX];                                                                                                   \
    local float xs[FTMAX * KCT];                                                                                              \
    local float dss[FTMAX * (KCT / 32)];                                                                                      \
    fmm_body(WT, FTMAX, KCT, W0, W1, W2, rb, x, g, eps, norm, o0, o1, o2, K, N0, N1, N2, T, op, part, inv, xs, dss);          \
  }
FMM_KERNEL(f32, 0)
FMM_KERNEL(f16, 1)
FMM_KERNEL(bf16, 30)
FMM_KERNEL(q4_0, 2)
FMM_KERNEL(q4_1, 3)
FMM_KERNEL(q5_0, 6)
FMM_KERNEL(q5_1, 7)
FMM_KERNEL(q8_0, 8)
FMM_KERNEL(q4_K, 12)
FMM_KERNEL(q5_K, 13)
FMM_KERNEL(q6_K, 14)

// q (T, H, hd) rotated in place; k (T, Hkv, hd) rotated and stored, with v, into the caches K, V
// at pos (rows' sequences and block tables as attention's: tab, seq_of, tab_off). The same
// rotation as rope (cs, sn (T, np) from the host), the same stores as kv_store. One work item
// per (token, head: H of q then Hkv of k, pair); pairs past the rotated ones (n_rot < hd) carry
// two elements through unrotated.
kernel void rope_kv(global float *q, global const float *k, global const float *v, global uchar *K, global uchar *V,
                    global const float *cs, global const float *sn, global const int *pos, global const int *tab,
                    global const int *seq_of, global const int *tab_off, int T, int H, int Hkv, int hd, int np, int neox, int fused,
                    int block, int f16) {
  const int npair = (hd + 1) / 2, HH = H + Hkv;
  const int i = get_global_id(0);
  if (i >= T * HH * npair) return;
  const int p = i % npair, h = (i / npair) % HH, t = i / (npair * HH);
  int a, c2;
  if (p < np) {
    a = neox ? p : 2 * p, c2 = neox ? p + np : 2 * p + 1;
  } else {
    a = 2 * np + 2 * (p - np), c2 = a + 1;
  }
  global const float *src = h < H ? q + ((size_t)t * H + h) * hd : k + ((size_t)t * Hkv + (h - H)) * hd;
  const float x0 = src[a], x1 = c2 < hd ? src[c2] : 0;
  float y0 = x0, y1 = x1;
  if (p < np) {
    const float c = cs[(size_t)t * np + p], s = sn[(size_t)t * np + p];
    if (fused && !(!neox && (np & 1) && p == np - 1)) {
      y0 = fma(x0, c, -(x1 * s)), y1 = fma(x0, s, x1 * c);
    } else {
      y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    }
  }
  if (h < H) {
    if (p < np) {
      global float *d = q + ((size_t)t * H + h) * hd;
      d[a] = y0, d[c2] = y1;
    }
    return;
  }
  const int kh = h - H, n = Hkv * hd, ps = pos[t];
  const size_t base = ((size_t)tab[tab_off[seq_of[t]] + ps / block] * block + ps % block) * n + (size_t)kh * hd;
  global const float *vr = v + ((size_t)t * Hkv + kh) * hd;
  if (f16) {
    vstore_half_rte(y0, base + a, (global half *)K), vstore_half_rte(vr[a], base + a, (global half *)V);
    if (c2 < hd) vstore_half_rte(y1, base + c2, (global half *)K), vstore_half_rte(vr[c2], base + c2, (global half *)V);
  } else {
    ((global float *)K)[base + a] = y0, ((global float *)V)[base + a] = vr[a];
    if (c2 < hd) ((global float *)K)[base + c2] = y1, ((global float *)V)[base + c2] = vr[c2];
  }
}

// ids (R) = the argmax of each row of logits (R, V), the lowest id on ties (the CPU sampler's
// greedy choice; rows with NaNs may choose differently). One work-group per row. Part of both
// tiers: it compares, it does not sum.
kernel void argmax_rows(global const float *l, global int *ids, int V) {
  local float bv[WG];
  local int bi[WG];
  const int lid = get_local_id(0);
  global const float *r = l + (size_t)get_group_id(0) * V;
  float best = -INFINITY;
  int at = V;
  for (int i = lid; i < V; i += WG)
    if (at == V || r[i] > best) best = r[i], at = i;
  bv[lid] = best, bi[lid] = at;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) {
      const float ov = bv[lid + s];
      const int oi = bi[lid + s];
      if (oi < V && (bi[lid] == V || ov > bv[lid] || (ov == bv[lid] && oi < bi[lid]))) bv[lid] = ov, bi[lid] = oi;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) ids[get_group_id(0)] = bi[0] == V ? 0 : bi[0];
}
