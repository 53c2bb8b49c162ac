// llsrv_gemm.cl - the fast tier's prompt products as GEMM tiles (after llsrv_fast.cl, whose
// fu_unit and act_unit it uses; embedded with it).
//
// fmmt_* (llsrv_fast.cl) gives each output row to one lane that unpacks the row's weight units
// and applies each to 16 tokens: every activation is loaded from local memory once per weight
// (two loads per multiply-add) and every work-group of 4 rows stages and quantizes its tokens'
// activations again. gmm_* is a real GEMM tile: a work-group computes GR output rows x GT tokens;
// K goes in chunks of GK; per chunk the weight tile (GR x GK) is dequantized into local memory
// once (each unit of 32 weights by one work item, fu_unit) and the activation tile (GT x GK) is
// normalized and quantized as the CPU quantizes it (act_unit, the same as fmm's: the numerics
// are the fast tier's), then each work item accumulates a GBR x GBT register block of float4
// partial sums: GBR + GBT vector loads per GBR * GBT vector multiply-adds.
// The fusions are fmm's, so the launches per layer stay: RMSNorm (each work-group computes the
// 1/rms of its tokens), out += (the residual), up to three matrices of one type in one launch
// (q, k, v), gate + up + SwiGLU (a tile's first GR / 2 rows are gate rows, the next GR / 2 the
// same rows of up: a work item holds both of its outputs in registers).
// Q4_1 / Q5_1: a unit's offset m times the CPU's f16 activation-unit sum less the one the
// quantized values imply (act_unit's return) is added per unit, as fmm adds it.
// Sums are f32 (four partial sums per output, in K order, added at the end): the results
// differ from the CPU's and fmm's in the last bits and vary with the device, not with the batch.

// Tile sizes. GR x GT = 64 x 32 outputs from 128 work items of 4 x 4: a GPU's work-group of
// 128 fills four warps, 16 float4 accumulators stay in registers (64 of 255 on NVIDIA), and the
// tiles (GR + GT) x GKP floats + the unit offsets take 27.5 KB of local memory, under the 32 KB
// every OpenCL 1.2 device has. GK = 64 (two units of 32): one weight unit per work item per
// chunk (GR * GK / 32 == GWG). A work item's rows are lr + GRL * i and tokens lt + GTL * j
// (interleaved, not blocked): neighbouring work items read neighbouring local words.
// On PoCL's CPU device the same tile halves the loads per multiply-add against fmmt (the
// figures: docs/PERFORMANCE.md).
#define GR 64
#define GT 32
#define GK 64
#define GKP (GK + 4) // a local row padded by one float4: rows start on other banks
#define GRL 16       // row lanes
#define GTL 8        // token lanes
#define GBR (GR / GRL) // register block: 4 rows
#define GBT (GT / GTL) // x 4 tokens
#define GWG (GRL * GTL) // 128 work items (ops.c checks the device allows them)
#define GU (GK / 32)    // units per chunk

// out[m] (T, N_m) (op) xn (T, K) · W_m (N_m, K)ᵀ, as fmm_body (llsrv_fast.cl): op 0 =, op 1 +=,
// op 2 (nm == 2) o0 = silu(xn·W0ᵀ) * (xn·W1ᵀ).
// global (GWG * blocks, ceil(T / GT)), local (GWG, 1). Block b: GR rows of one matrix (op 2:
// GR / 2 rows of gate and the same of up), the matrices' blocks one after another.
inline void gmm_body(const int wt, global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x,
                     global const float *g, float eps, int norm, global float *o0, global float *o1, global float *o2, int K, int N0, int N1,
                     int N2, int T, int op, local float *ws, local float *xs, local float *wmo, local float *xd, local float *part,
                     local float *inv) {
  const int lid = get_local_id(0), lr = lid % GRL, lt = lid / GRL;
  const int t0 = get_group_id(1) * GT, nt = min(GT, T - t0), blk = get_group_id(0);
  const int off = wt == 3 || wt == 7; // Q4_1, Q5_1: the offsets' correction
  if (norm) { // 1/rms of each token: GWG / GT work items over its K floats
    const int tt = lid / (GWG / GT), q = lid % (GWG / GT);
    float s = 0;
    if (tt < nt) {
      global const float *xr = x + (size_t)(t0 + tt) * K;
      for (int i = q; i < K; i += GWG / GT) s = fma(xr[i], xr[i], s);
    }
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (q == 0) {
      float tot = 0;
      for (int i = 0; i < GWG / GT; i++) tot += part[tt * (GWG / GT) + i];
      inv[tt] = fdiv(1.0f, fsqrt(tot / (float)K + eps));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  // The tile row this work item dequantizes (sr, unit su of the chunk): its matrix and row.
  const int sr = lid % GR, su = lid / GR;
  int sm, srow, svalid;
  if (op == 2) {
    sm = sr / (GR / 2), srow = blk * (GR / 2) + sr % (GR / 2), svalid = srow < N0;
  } else {
    const int b0 = (N0 + GR - 1) / GR, b1 = (N1 + GR - 1) / GR;
    sm = blk < b0 ? 0 : blk < b0 + b1 ? 1 : 2;
    srow = (blk - (sm == 0 ? 0 : sm == 1 ? b0 : b0 + b1)) * GR + sr;
    svalid = srow < (sm == 0 ? N0 : sm == 1 ? N1 : N2);
  }
  global const uchar *swr = (sm == 0 ? W0 : sm == 1 ? W1 : W2) + (size_t)(svalid ? srow : 0) * rb;
  float4 acc[GBR][GBT];
  for (int i = 0; i < GBR; i++)
    for (int j = 0; j < GBT; j++) acc[i][j] = 0;
  for (int k0 = 0; k0 < K; k0 += GK) {
    const int nuc = min(GK, K - k0) / 32, u0 = k0 / 32;
    barrier(CLK_LOCAL_MEM_FENCE); // the previous chunk's tiles are read
    { // the weight tile: one unit per work item (zeros past N or K: the sums skip nothing)
      float w[32], mo = 0;
      if (svalid && su < nuc) fu_unit(wt, swr, u0 + su, w, &mo);
      else
        for (int j = 0; j < 32; j++) w[j] = 0;
      local float *d = ws + sr * GKP + su * 32;
      for (int j = 0; j < 32; j += 4) vstore4(vload4(0, w + j), 0, d + j);
      if (off) wmo[sr * GU + su] = mo;
    }
    for (int i = lid; i < GT * GU; i += GWG) { // the activation tile: GT x GU units
      const int tt = i / GU, uu = i % GU;
      float xv[32], dss = 0;
      if (tt < nt && uu < nuc) dss = act_unit(wt, x + (size_t)(t0 + tt) * K, g, norm ? inv[tt] : 1.0f, norm, u0 + uu, xv);
      else
        for (int j = 0; j < 32; j++) xv[j] = 0;
      local float *d = xs + tt * GKP + uu * 32;
      for (int j = 0; j < 32; j += 4) vstore4(vload4(0, xv + j), 0, d + j);
      if (off) xd[tt * GU + uu] = dss;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < nuc * 32; kk += 4) {
      float4 wv[GBR], xv[GBT];
      for (int i = 0; i < GBR; i++) wv[i] = vload4(0, ws + (lr + GRL * i) * GKP + kk);
      for (int j = 0; j < GBT; j++) xv[j] = vload4(0, xs + (lt + GTL * j) * GKP + kk);
      for (int i = 0; i < GBR; i++)
        for (int j = 0; j < GBT; j++) acc[i][j] = fma(wv[i], xv[j], acc[i][j]);
    }
    if (off)
      for (int uu = 0; uu < nuc; uu++)
        for (int i = 0; i < GBR; i++)
          for (int j = 0; j < GBT; j++) acc[i][j].x = fma(wmo[(lr + GRL * i) * GU + uu], xd[(lt + GTL * j) * GU + uu], acc[i][j].x);
  }
  for (int j = 0; j < GBT; j++) {
    const int tt = lt + GTL * j;
    if (tt >= nt) continue;
    const size_t t = (size_t)(t0 + tt);
    if (op == 2) { // rows i < GBR / 2: gate; i + GBR / 2: the same rows of up
      for (int i = 0; i < GBR / 2; i++) {
        const int row = blk * (GR / 2) + lr + GRL * i;
        if (row >= N0) continue;
        const float4 a = acc[i][j], b = acc[i + GBR / 2][j];
        const float gv = (a.x + a.y) + (a.z + a.w), uv = (b.x + b.y) + (b.z + b.w);
        o0[t * N0 + row] = gv / (1.0f + exp(-gv)) * uv;
      }
      continue;
    }
    for (int i = 0; i < GBR; i++) {
      const int r = lr + GRL * i;
      const int b0 = (N0 + GR - 1) / GR, b1 = (N1 + GR - 1) / GR;
      const int m = blk < b0 ? 0 : blk < b0 + b1 ? 1 : 2;
      const int row = (blk - (m == 0 ? 0 : m == 1 ? b0 : b0 + b1)) * GR + r, N = m == 0 ? N0 : m == 1 ? N1 : N2;
      if (row >= N) continue;
      const float4 a = acc[i][j];
      const float v = (a.x + a.y) + (a.z + a.w);
      global float *o = (m == 0 ? o0 : m == 1 ? o1 : o2) + t * N + row;
      *o = op == 1 ? *o + v : v;
    }
  }
}

#define GMM_KERNEL(NAME, WT)                                                                                                    \
  kernel __attribute__((reqd_work_group_size(GWG, 1, 1))) void gmm_##NAME(                                                   \
      global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x, global const float *g, \
      float eps, int norm, global float *o0, global float *o1, global float *o2, int K, int N0, int N1, int N2, int T, int op) {  \
    local float ws[GR * GKP];                                                                                                   \
    local float xs[GT * GKP];                                                                                                   \
    local float wmo[GR * GU];                                                                                                   \
    local float xd[GT * GU];                                                                                                    \
    local float part[GWG];                                                                                                      \
    local float inv[GT];                                                                                                        \
    gmm_body(WT, W0, W1, W2, rb, x, g, eps, norm, o0, o1, o2, K, N0, N1, N2, T, op, ws, xs, wmo, xd, part, inv);                \
  }
GMM_KERNEL(f32, 0)
GMM_KERNEL(f16, 1)
GMM_KERNEL(bf16, 30)
GMM_KERNEL(q4_0, 2)
GMM_KERNEL(q4_1, 3)
GMM_KERNEL(q5_0, 6)
GMM_KERNEL(q5_1, 7)
GMM_KERNEL(q8_0, 8)
GMM_KERNEL(q4_K, 12)
GMM_KERNEL(q5_K, 13)
GMM_KERNEL(q6_K, 14)
