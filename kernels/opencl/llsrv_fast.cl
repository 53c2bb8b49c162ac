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
//   a decode step reads back one id per sequence;
// - attention in one pass over the cache (attn_fast): K and V tiles in local memory shared by a
//   work-group's (token, head) rows, an online softmax, no scores in global memory; at a long
//   context a decode token's pass split over the cache (attn_split, llsrv_split.cl).
// Sums are f32 trees, so results differ from the CPU's in the last bits and vary with the
// device; they do not vary with batch composition (each row's sums depend on the row alone).

// LL_SHARED_BEGIN (llsrv_dot.cl builds on these too: program.c dot_source)
#define FR 4  // output rows per work-group
#define FL 16 // work items per row (FR * FL == WG)

// The end of a product work-group (fmm_*, and llsrv_dot.cl's fmmi_*): the FL lanes' sums of
// each (row, token) added through local memory (part (FR, ft, FL)) and stored - op 0: o = r,
// op 1: o += r (the residual), op 2: gate (slots 0 .. FR/2-1) and up (the rest) of the same
// rows meet and SwiGLU is stored. acc (ft): this work item's sums; m, row, valid: its matrix
// and output row.
inline void fmm_store(local float *part, const float *acc, const int ft, const int nt, const int slot, const int lane, const int op, const int valid,
                      const int m, const int row, const int t0, global float *o0, global float *o1, global float *o2, const int N0, const int N1,
                      const int N2) {
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
// LL_SHARED_END

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
  fmm_store(part, acc, ft, nt, slot, lane, op, valid, m, row, t0, o0, o1, o2, N0, N1, N2);
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

// Attention over the paged KV cache, flash style: each work-group takes up to AQ query rows -
// (token, head) pairs of one sequence whose heads share one KV head (grouped-query heads and a
// prompt chunk's tokens together) - and walks the cache once in tiles of ATP positions, K and V
// tiles through local memory (read coalesced, shared by all its rows), with an online softmax
// (running max and sum per row, the accumulators rescaled when the max moves): no scratch of
// scores in global memory, one pass over K and V for a decode step or a whole prompt chunk.
// blk (n_blk, 3): a block's sequence's first row t0, its first pair k0 (pair k: token t0 + k / G,
// head kvh * G + k % G, G = H / Hkv) and its pair count (<= AQ); work-group = block * Hkv + kvh.
// With an f16 cache q is rounded to f16 as the CPU rounds it; the probabilities are not (the
// CPU's are: within float rounding, tests/test_opencl states how close).
#define AQ 8      // query rows per work-group
#define AKT 4160  // floats of the K tile (ATP rows of hd + 1: the padding spreads a score's lanes over banks)
#define AVT 4096  // floats of the V tile (ATP rows of hd)
#define AACC (AQ * 256 / WG) // output elements per work item (hd <= 256)
// The pass itself, over the positions clo .. chi of the rows' ranges (attn_fast: all of them;
// attn_split, llsrv_split.cl: one split's): leaves each row's running max and sum in m_run,
// l_run and the unnormalized sums of its probabilities times V in acc (element lid + jj * WG of
// the (nq, hd) block); a row with no position there has max -inf, sum 0. Called by all the
// work-group's items; the local arrays are the kernel's (OpenCL 1.2 declares them there).
inline void attn_pass(global const float *q, global const uchar *K, global const uchar *V, global const int *pos, global const int *tab,
                      global const int *seq_of, global const int *tab_off, int t0, int k0, int nq, int kvh, int clo, int chi, int H,
                      int Hkv, int hd, int block, int f16, float scale, int window, local float *qs, local float *ks, local float *vs,
                      local float *ps, local float *m_run, local float *l_run, local float *m_new, local float *alpha, local int *lo_r,
                      local int *hi_r, float *acc) {
  const int lid = get_local_id(0), G = H / Hkv;
  const int atp = min(64, min(AKT / (hd + 1), AVT / hd)), n = Hkv * hd;
  global const int *tb = tab + tab_off[seq_of[t0]];
  int plo = INT_MAX, phi = -1; // the union of the rows' position ranges (within clo .. chi)
  for (int i = 0; i < nq; i++) {
    const int p = pos[t0 + (k0 + i) / G], lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
    plo = min(plo, lo), phi = max(phi, p);
    if (lid == i) lo_r[i] = lo, hi_r[i] = p, m_run[i] = -INFINITY, l_run[i] = 0;
  }
  plo = max(plo, clo), phi = min(phi, chi);
  for (int e = lid; e < nq * hd; e += WG) {
    const int i = e / hd, d = e % hd, t = t0 + (k0 + i) / G, h = kvh * G + (k0 + i) % G;
    const float x = q[((size_t)t * H + h) * hd + d];
    qs[e] = f16 ? round_f16(x) : x;
  }
  for (int j = 0; j < AACC; j++) acc[j] = 0;
  for (int base = plo; base <= phi; base += atp) {
    const int nt = min(atp, phi + 1 - base);
    barrier(CLK_LOCAL_MEM_FENCE); // the previous tile is done with (and q, the rows' ranges are in)
    for (int e = lid; e < nt * hd; e += WG) {
      const int j = e / hd, d = e % hd, p = base + j;
      const size_t off = ((size_t)tb[p / block] * block + p % block) * n + (size_t)kvh * hd + d;
      ks[j * (hd + 1) + d] = kv_ld(K, off, f16);
      vs[e] = kv_ld(V, off, f16);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = lid; e < nq * atp; e += WG) {
      const int i = e / atp, j = e % atp, p = base + j;
      float s = -INFINITY;
      if (j < nt && p >= lo_r[i] && p <= hi_r[i]) {
        local const float *qr = qs + i * hd, *kr = ks + j * (hd + 1);
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int d = 0;
        for (; d + 4 <= hd; d += 4) a0 = fma(qr[d], kr[d], a0), a1 = fma(qr[d + 1], kr[d + 1], a1), a2 = fma(qr[d + 2], kr[d + 2], a2), a3 = fma(qr[d + 3], kr[d + 3], a3);
        for (; d < hd; d++) a0 = fma(qr[d], kr[d], a0);
        s = ((a0 + a1) + (a2 + a3)) * scale;
      }
      ps[e] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < nq) { // the row's new running max, and how much its sums so far shrink
      float mx = m_run[lid];
      for (int j = 0; j < nt; j++) mx = fmax(mx, ps[lid * atp + j]);
      m_new[lid] = mx;
      alpha[lid] = m_run[lid] == -INFINITY ? 0.0f : exp(m_run[lid] - mx);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = lid; e < nq * atp; e += WG) {
      const float s = ps[e], mx = m_new[e / atp];
      ps[e] = s == -INFINITY ? 0.0f : exp(s - mx);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < nq) {
      float sum = 0;
      for (int j = 0; j < nt; j++) sum += ps[lid * atp + j];
      l_run[lid] = l_run[lid] * alpha[lid] + sum;
      m_run[lid] = m_new[lid];
    }
    for (int jj = 0; jj < AACC; jj++) {
      const int e = lid + jj * WG;
      if (e < nq * hd) {
        const int i = e / hd, d = e % hd;
        local const float *pr = ps + i * atp;
        float a = acc[jj] * alpha[i];
        for (int j = 0; j < nt; j++) a = fma(pr[j], vs[j * hd + d], a);
        acc[jj] = a;
      }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}

kernel void attn_fast(global float *out, global const float *q, global const uchar *K, global const uchar *V, global const int *pos,
                      global const int *tab, global const int *seq_of, global const int *tab_off, global const int *blk, int H, int Hkv,
                      int hd, int block, int f16, float scale, int window) {
  local float qs[AQ * 256], ks[AKT], vs[AVT], ps[AQ * 64];
  local float m_run[AQ], l_run[AQ], m_new[AQ], alpha[AQ];
  local int lo_r[AQ], hi_r[AQ];
  const int lid = get_local_id(0), b = get_group_id(0) / Hkv, kvh = get_group_id(0) % Hkv, G = H / Hkv;
  const int t0 = blk[3 * b], k0 = blk[3 * b + 1], nq = blk[3 * b + 2];
  float acc[AACC];
  attn_pass(q, K, V, pos, tab, seq_of, tab_off, t0, k0, nq, kvh, 0, INT_MAX, H, Hkv, hd, block, f16, scale, window, qs, ks, vs, ps, m_run,
            l_run, m_new, alpha, lo_r, hi_r, acc);
  for (int jj = 0; jj < AACC; jj++) {
    const int e = lid + jj * WG;
    if (e < nq * hd) {
      const int i = e / hd, d = e % hd, t = t0 + (k0 + i) / G, h = kvh * G + (k0 + i) % G;
      out[((size_t)t * H + h) * hd + d] = acc[jj] / l_run[i];
    }
  }
}

// The work-group's argmax of row r (V): the lowest id on ties, V for a row of NaNs only; left in
// bv[0], bi[0] (local, WG each) for every work item. Called by all the work-group's items.
inline void wg_argmax(global const float *r, int V, local float *bv, local int *bi) {
  const int lid = get_local_id(0);
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
}

// ids (R) = the argmax of each row of logits (R, V), the lowest id on ties (the CPU sampler's
// greedy choice; rows with NaNs may choose differently). One work-group per row. Part of both
// tiers: it compares, it does not sum.
kernel void argmax_rows(global const float *l, global int *ids, int V) {
  local float bv[WG];
  local int bi[WG];
  wg_argmax(l + (size_t)get_group_id(0) * V, V, bv, bi);
  if (get_local_id(0) == 0) ids[get_group_id(0)] = bi[0] == V ? 0 : bi[0];
}

// ids (R) = each row's choice by its sampling step prm (R, SMP_W words: ll_sample_dev -
// temperature, top_p, min_p, log_min_p as floats, top_k, the draw's high and low words, then the
// penalties, below sample_chain): after the penalties, temperature <= 0 the argmax (argmax_rows'
// rule), else server/engine/sample.c's chain step for step - the row's
// log-softmax (the sum in acc_t), the top_k candidates by (log-probability down, id up) in k
// rounds of a work-group maximum (over each work item's SMP_P best, the whole row only once one
// item's are used up: a pass over the row, not k), then top-p, min-p, temperature and the draw over them by one
// work item in the host's order. One work-group per row; part of both tiers (its sums are not
// the CPU's order: the same ids but where a draw lands within rounding of a boundary).
inline int smp_before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); } // a ahead of b
#define SMP_P 4 // candidates listed per work item before the k rounds
// a / b rounded to float as the host's float division rounds it (through double where the device
// has it: a double quotient of two floats rounds to the same float; OpenCL's float division may
// be off by 2.5 ulp)
inline float smp_div(float a, float b) {
#ifdef LL_FP64
  return (float)((double)a / (double)b);
#else
  return a / b;
#endif
}
// sample_rows' chain for a row with temperature > 0 (the work-group's maximum in bv[0]).
inline void sample_chain(global const float *r, global int *id, global const uint *pp, int V, local float *bv, local int *bi,
                         local acc_t *zs, local float *cl, local int *ci) {
  const int lid = get_local_id(0);
  const float temp = as_float(pp[0]), top_p = as_float(pp[1]), min_p = as_float(pp[2]), lmp = as_float(pp[3]);
  const int k = clamp((int)pp[4], 1, 64);
  const float mx = bv[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  acc_t z = 0;
  for (int i = lid; i < V; i += WG) z += exp((acc_t)r[i] - (acc_t)mx);
  zs[lid] = z;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) zs[lid] += zs[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float lz = (float)((acc_t)mx + log(zs[0]));
  // Each work item's SMP_P best (in the order) of its elements; a round picks among those while
  // every item has one left untaken (an element not listed is behind its item's last listed
  // one, so behind the pick), and scans the whole row once an item's last listed one is taken.
  float tv[SMP_P];
  int ti[SMP_P];
  for (int j = 0; j < SMP_P; j++) tv[j] = -INFINITY, ti[j] = V;
  for (int i = lid; i < V; i += WG) {
    const float lp = r[i] - lz;
    if (ti[SMP_P - 1] == V || smp_before(lp, i, tv[SMP_P - 1], ti[SMP_P - 1])) {
      int j = SMP_P - 1;
      for (; j > 0 && (ti[j - 1] == V || smp_before(lp, i, tv[j - 1], ti[j - 1])); j--) tv[j] = tv[j - 1], ti[j] = ti[j - 1];
      tv[j] = lp, ti[j] = i;
    }
  }
  int full = 0; // the same in every work item (set from a value all of them read)
  // k rounds: the best candidate after the previous one in the order
  float plp = INFINITY;
  int pid = -1;
  for (int c = 0; c < k; c++) {
    float bl = -INFINITY;
    int bid = V;
    if (full) {
      for (int i = lid; i < V; i += WG) {
        const float lp = r[i] - lz;
        if (smp_before(plp, pid, lp, i) && (bid == V || smp_before(lp, i, bl, bid))) bl = lp, bid = i;
      }
    } else {
      for (int j = 0; j < SMP_P; j++)
        if (ti[j] < V && smp_before(plp, pid, tv[j], ti[j]) && (bid == V || smp_before(tv[j], ti[j], bl, bid))) bl = tv[j], bid = ti[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    bv[lid] = bl, bi[lid] = bid;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
      if (lid < s && bi[lid + s] < V && (bi[lid] == V || smp_before(bv[lid + s], bi[lid + s], bv[lid], bi[lid]))) bv[lid] = bv[lid + s], bi[lid] = bi[lid + s];
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    plp = bv[0], pid = bi[0];
    if (lid == 0) cl[c] = plp, ci[c] = pid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) bi[0] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!full && ti[SMP_P - 1] < V && ti[SMP_P - 1] == pid) bi[0] = 1; // this item's list is used up
    barrier(CLK_LOCAL_MEM_FENCE);
    full = full || bi[0];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid == 0) { // one work item, in the host's order (no early return for the others: PoCL 3.1 then lost this write)
    int n = k;
    for (int c = 0; c < k; c++)
      if (ci[c] >= V) { // fewer candidates than k (V < k)
        n = c;
        break;
      }
    acc_t zz = 0;
    for (int i = 0; i < n; i++) zz += exp((acc_t)(cl[i] - cl[0]));
    if (top_p < 1.0f) {
      acc_t cum = 0;
      for (int i = 0; i < n; i++) {
        cum += exp((acc_t)(cl[i] - cl[0])) / zz;
        if (cum >= (acc_t)top_p) {
          n = i + 1;
          break;
        }
      }
    }
    if (min_p > 0.0f) {
      const float lo = cl[0] + lmp;
      int m = 1;
      while (m < n && cl[m] >= lo) m++;
      n = m;
    }
    acc_t tot = 0;
    for (int i = 0; i < n; i++) tot += exp((acc_t)smp_div(cl[i] - cl[0], temp));
#ifdef LL_FP64
    const double u = (double)(((ulong)pp[5] << 32) | pp[6]) * (1.0 / 9007199254740992.0);
#else
    const float u = (float)(((ulong)pp[5] << 32) | pp[6]) * (1.0f / 9007199254740992.0f);
#endif
    const acc_t rr = u * tot;
    acc_t acc = 0;
    int chosen = ci[n - 1];
    for (int i = 0; i < n; i++) {
      acc += exp((acc_t)smp_div(cl[i] - cl[0], temp));
      if (rr < acc) {
        chosen = ci[i];
        break;
      }
    }
    *id = chosen;
  }
}

// A penalized logit (count n > 0 in the window): server/engine/sample.c penalty_apply's
// operations one by one, unfused, the division rounded as the host's.
inline float smp_penalty(float l, int n, float rep, float freq, float pres) {
#pragma OPENCL FP_CONTRACT OFF
  if (rep != 1.0f) l = l <= 0.0f ? l * rep : smp_div(l, rep);
  const float f = (float)n * freq, g = f + (n > 0 ? pres : 0.0f);
  return l - g;
}

// prm: SMP_W words a row (ops.c ocl_sample): the chain's 8 (above), then repetition, frequency
// and presence penalties (floats), the number of the row's penalized tokens and where their
// (id, count) pairs start in prm. The penalties change the row of l in place first (each token
// listed once: no two work items write one element).
#define SMP_W 16
kernel void sample_rows(global float *l, global int *ids, global const uint *prm, int V) {
  local float bv[WG];
  local int bi[WG];
  local acc_t zs[WG];
  local float cl[64];
  local int ci[64];
  const int lid = get_local_id(0), row = get_group_id(0);
  global const float *r = l + (size_t)row * V;
  global const uint *pp = prm + (size_t)row * SMP_W;
  const float temp = as_float(pp[0]);
  const int np = (int)pp[11];
  if (np > 0) {
    global const int *pl = (global const int *)(prm + pp[12]);
    const float rep = as_float(pp[8]), freq = as_float(pp[9]), pres = as_float(pp[10]);
    for (int i = lid; i < np; i += WG) {
      const int t = pl[2 * i];
      if (t >= 0 && t < V) l[(size_t)row * V + t] = smp_penalty(l[(size_t)row * V + t], pl[2 * i + 1], rep, freq, pres);
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
  }
  wg_argmax(r, V, bv, bi);
  if (temp <= 0.0f) { // uniform over the work-group
    if (lid == 0) ids[row] = bi[0] == V ? 0 : bi[0];
  } else {
    sample_chain(r, ids + row, pp, V, bv, bi, zs, cl, ci);
  }
}
