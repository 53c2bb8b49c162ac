// train_fast.cl - the fast tier's training kernels (issue 30), chosen where llsrv_fast.cl's are
// (LL_OPENCL_REFERENCE, ocl_ctx.fast): portable OpenCL 1.2, no vendor extension. Not the CPU's
// bits: sums in tile order with mad; tests/test_opencl_train_fast.c states the tolerances.
// Embedded after train.cl (one program).
//
// The two backward products (the reference's one-work-item-per-output loops re-read a row of
// dout and a column of W from global memory per output): 16 x 16 tiles of the output per
// work-group, the reduction dimension stepped 16 at a time through local memory (each operand
// element read from global memory once per tile row / column instead of once per output).
// dx through a quantized or f16/bf16 W dequantizes each 16 x 16 tile of W straight into local
// memory (mm_bwd_dx_qtiled: no f32 copy of W in global memory, one launch per product). The
// adapted linear layer's forward (lora_fwd_tiled) adds the LoRA term to the base product in the
// same kernel; the training attention skips the tiles right of the causal diagonal.

#undef TT // llsrv.cl's tokens per work-group of its products; here the tile's side
#define TT 16

// dx (T, K) += dout[:, n0 .. n0 + nc] (T, nc; row stride N) · wf (nc, K). Work-group (16, 16)
// over (k, t); global sizes rounded up to 16 (the edges load zeros).
kernel void mm_bwd_dx_tiled(global float *dx, global const float *dout, global const float *wf, int T, int N, int K, int n0, int nc) {
  local float ld[TT][TT + 1], lw[TT][TT + 1]; // dout tile (t, n), W tile (n, k); +1 against bank conflicts
  const int lk = get_local_id(0), lt = get_local_id(1), k = get_global_id(0), t = get_global_id(1);
  float acc = 0.0f;
  for (int nb = 0; nb < nc; nb += TT) {
    ld[lt][lk] = t < T && nb + lk < nc ? dout[(size_t)t * N + n0 + nb + lk] : 0.0f;
    lw[lt][lk] = k < K && nb + lt < nc ? wf[(size_t)(nb + lt) * K + k] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TT; i++) acc = mad(ld[lt][i], lw[i][lk], acc);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (k < K && t < T) dx[(size_t)t * K + k] += acc;
}

// Element i of a row of W: fl >= 0 a float type (0 f32, 1 f16, 2 bf16), else quantized type wt
// (enum ll_type), in deq_unit's expressions (llsrv.cl: formats/quant.c's), one element at a time.
inline float deq_elem(int wt, int fl, global const uchar *row, int i) {
  if (fl >= 0) return ldw(row, i, fl);
  const int u = i >> 5, l = i & 31;
  if (wt == 12 || wt == 13) { // Q4_K, Q5_K: (d * sc) * q - dmin * m
    const int j = u & 7;
    global const uchar *blk = row + (u >> 3) * (wt == 12 ? 144 : 176);
    int sc, m;
    k_scale_min(j, blk + 4, &sc, &m);
    const float d1 = ldh(blk) * (float)sc, m1 = ldh(blk + 2) * (float)m;
    global const uchar *qs = blk + (wt == 12 ? 16 : 48) + 32 * (j >> 1), *qh = blk + 16;
    const int v = ((qs[l] >> ((j & 1) * 4)) & 15) + (wt == 13 ? ((qh[l] >> j) & 1) * 16 : 0);
    return d1 * (float)v - m1;
  }
  if (wt == 14) { // Q6_K: d * sc * q
    const int j = u & 7, h = j >> 2, c = j & 3;
    global const uchar *blk = row + (u >> 3) * 210, *ql = blk + 64 * h + 32 * (c & 1), *qh = blk + 128 + 32 * h;
    global const char *sc = (global const char *)(blk + 192) + 8 * h + 2 * c;
    return ldh(blk + 208) * (float)sc[l >> 4] * (float)((int)(((ql[l] >> ((c >> 1) * 4)) & 15) | (((qh[l] >> (2 * c)) & 3) << 4)) - 32);
  }
  global const uchar *blk;
  int q;
  float a, b = 0.0f;
  switch (wt) {
  case 2: // Q4_0
    blk = row + u * 18, a = ldh(blk);
    q = (l < 16 ? blk[2 + l] & 15 : blk[2 + l - 16] >> 4) - 8;
    break;
  case 3: // Q4_1
    blk = row + u * 20, a = ldh(blk), b = ldh(blk + 2);
    q = l < 16 ? blk[4 + l] & 15 : blk[4 + l - 16] >> 4;
    break;
  case 6: { // Q5_0: the fifth bit of element l is bit l of qh
    blk = row + u * 22, a = ldh(blk);
    const uint qh = blk[2] | (blk[3] << 8) | (blk[4] << 16) | ((uint)blk[5] << 24);
    q = ((l < 16 ? blk[6 + l] & 15 : blk[6 + l - 16] >> 4) | (((qh >> l) & 1) << 4)) - 16;
    break;
  }
  case 7: { // Q5_1
    blk = row + u * 24, a = ldh(blk), b = ldh(blk + 2);
    const uint qh = blk[4] | (blk[5] << 8) | (blk[6] << 16) | ((uint)blk[7] << 24);
    q = (l < 16 ? blk[8 + l] & 15 : blk[8 + l - 16] >> 4) | (((qh >> l) & 1) << 4);
    break;
  }
  default: // Q8_0
    blk = row + u * 34, a = ldh(blk);
    q = ((global const char *)(blk + 2))[l];
    break;
  }
  return wt == 3 || wt == 7 ? (float)q * a + b : (float)q * a;
}

// dx (T, K) += dout (T, N) · W (N, K), W of any type other than f32 (rows of rb bytes): as
// mm_bwd_dx_tiled over all N rows, each 16 x 16 tile of W dequantized into local memory by the
// work-group that multiplies it (one element per work item) instead of a chunk of f32 rows
// written to and read back from global memory. A work-group covers RT x 16 tokens (each work
// item RT outputs, t = t0 + lt + 16 j), so each tile of W is dequantized once per 64 tokens:
// on a CPU device (PoCL) the decoding is ALU work that 16-token tiles repeated 4x as often.
#define RT 4
kernel void mm_bwd_dx_qtiled(global float *dx, global const float *dout, global const uchar *W, ulong rb, int T, int N, int K, int wt, int fl) {
  local float ld[RT * TT][TT + 1], lw[TT][TT + 1]; // dout tile (t, n), W tile (n, k)
  const int lk = get_local_id(0), lt = get_local_id(1), k = get_global_id(0), t0 = get_group_id(1) * RT * TT;
  float acc[RT];
  for (int j = 0; j < RT; j++) acc[j] = 0.0f;
  for (int nb = 0; nb < N; nb += TT) {
    for (int j = 0; j < RT; j++) {
      const int t = t0 + lt + TT * j;
      ld[lt + TT * j][lk] = t < T && nb + lk < N ? dout[(size_t)t * N + nb + lk] : 0.0f;
    }
    lw[lt][lk] = k < K && nb + lt < N ? deq_elem(wt, fl, W + (size_t)(nb + lt) * rb, k) : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TT; i++) {
      const float wv = lw[i][lk];
      for (int j = 0; j < RT; j++) acc[j] = mad(ld[lt + TT * j][i], wv, acc[j]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int j = 0; j < RT; j++) {
    const int t = t0 + lt + TT * j;
    if (k < K && t < T) dx[(size_t)t * K + k] += acc[j];
  }
}

// The adapted linear layer's forward (LoRA): y (T, N) (= or += with acc) x (T, K) · Wᵀ + axs
// (T, r) · Bᵀ, W (N, K) of any type (rows of rb bytes, tiles dequantized into local memory),
// B (N, r) f32, axs = scale · x_a · Aᵀ from gemm_tiled before it (the backward keeps it).
// Work-group (16, 16) over (n, t), RT x 16 tokens as mm_bwd_dx_qtiled; the LoRA term (r terms)
// is added to each output's sum before it is stored: one write of y instead of the base
// product's and a second pass's.
kernel void lora_fwd_tiled(global float *y, global const float *x, global const uchar *W, ulong rb, global const float *axs, global const float *B,
                           int T, int N, int K, int r, int wt, int fl, int acc_y) {
  local float lx[RT * TT][TT + 1], lw[TT][TT + 1]; // x tile (t, k), W tile (n, k)
  const int ln = get_local_id(0), lt = get_local_id(1), n = get_global_id(0), t0 = get_group_id(1) * RT * TT;
  const int n0 = get_group_id(0) * TT;
  float acc[RT];
  for (int j = 0; j < RT; j++) acc[j] = 0.0f;
  for (int kb = 0; kb < K; kb += TT) {
    for (int j = 0; j < RT; j++) {
      const int t = t0 + lt + TT * j;
      lx[lt + TT * j][ln] = t < T && kb + ln < K ? x[(size_t)t * K + kb + ln] : 0.0f;
    }
    lw[lt][ln] = n0 + lt < N && kb + ln < K ? deq_elem(wt, fl, W + (size_t)(n0 + lt) * rb, kb + ln) : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TT; i++) {
      const float wv = lw[ln][i];
      for (int j = 0; j < RT; j++) acc[j] = mad(lx[lt + TT * j][i], wv, acc[j]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (n >= N) return;
  for (int j = 0; j < RT; j++) {
    const int t = t0 + lt + TT * j;
    if (t >= T) continue;
    float a = acc[j];
    for (int q = 0; q < r; q++) a = mad(axs[(size_t)t * r + q], B[(size_t)n * r + q], a);
    global float *o = y + (size_t)t * N + n;
    *o = acc_y ? *o + a : a;
  }
}

// dw (N, K) += dout (T, N)ᵀ · x (T, K). Work-group (16, 16) over (k, n), t stepped 16 at a time.
kernel void mm_bwd_dw_tiled(global float *dw, global const float *dout, global const float *x, int T, int N, int K) {
  local float ld[TT][TT + 1], lx[TT][TT + 1]; // dout tile (t, n), x tile (t, k)
  const int lk = get_local_id(0), ln = get_local_id(1), k = get_global_id(0), n = get_global_id(1);
  const int nbase = get_group_id(1) * TT;
  float acc = 0.0f;
  for (int tb = 0; tb < T; tb += TT) {
    // work item (lk, ln) loads row tb + ln of both tiles: dout's columns nbase + lk, x's k
    ld[ln][lk] = tb + ln < T && nbase + lk < N ? dout[(size_t)(tb + ln) * N + nbase + lk] : 0.0f;
    lx[ln][lk] = tb + ln < T && k < K ? x[(size_t)(tb + ln) * K + k] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TT; i++) acc = mad(ld[i][ln], lx[i][lk], acc);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (k < K && n < N) dw[(size_t)n * K + k] += acc;
}

// ---------------------------------------------------------------- attention (training)
// Causal attention as products over whole heads instead of train.cl's work-group per query row
// (whose softmax and sums ran on one work item each): scores, P·V, dout·Vᵀ, ds·K, Pᵀ·dout and
// dsᵀ·q are gemm_tiled launches batched over heads, the row softmax and the row backward are
// work-group reductions (attn_rows_*). The causal mask (argument causal) skips the tiles right
// of the diagonal: 1, the scores / dp products (M = N = S): work-groups wholly right of it
// return (the row kernels never read there); 2, a product whose reduction index is the key j of
// row m (P·V, ds·K): k runs to the diagonal's tile only and A's elements k > m load as 0;
// 3, a reduction over the query i of key row m (Pᵀ·dout, dsᵀ·q): k starts at the diagonal's
// tile and A's elements k < m load as 0. So the masked probabilities are never read (a NaN
// there changes nothing: tests/test_opencl_train_fast.c) and about half the tiles are skipped.

// C[b] (M, N) = alpha A[b] (M, K) · B[b] (K, N) + beta C[b], b = get_global_id(2). Operand X of
// batch b starts at X + offX + (b / divX) bsX (a kv head serves divX query heads); ta: A is
// stored (K, M) (A(m, k) = A[k lda + m]), tb: B is stored (N, K). Work-group (16, 16) over
// (n, m); global sizes rounded up to 16.
kernel void gemm_tiled(global float *C, global const float *A, global const float *B, int M, int N, int K, int lda, int ldb, int ldc,
                       long offA, long offB, long offC, long bsA, long bsB, long bsC, int divA, int divB, int ta, int tb, float alpha,
                       float beta, int causal) {
  local float la[TT][TT + 1], lb[TT][TT + 1]; // A tile (m, k), B tile (k, n)
  const int lx = get_local_id(0), ly = get_local_id(1), n = get_global_id(0), m = get_global_id(1), bt = get_global_id(2);
  const int m0 = get_group_id(1) * TT, n0 = get_group_id(0) * TT;
  A += offA + (long)(bt / divA) * bsA;
  B += offB + (long)(bt / divB) * bsB;
  C += offC + (long)bt * bsC;
  if (causal == 1 && n0 > m0 + TT - 1) return; // the whole work-group: no barrier is left waiting
  const int kend = causal == 2 ? min(K, m0 + TT) : K;
  float acc = 0.0f;
  for (int kb = causal == 3 ? m0 : 0; kb < kend; kb += TT) {
    // la[ly][lx] = A(m0 + ly, kb + lx), lb[ly][lx] = B(kb + ly, n0 + lx)
    const int am = m0 + ly, ak = kb + lx, bk = kb + ly, bn = n0 + lx;
    const int live = am < M && ak < K && (causal != 2 || ak <= am) && (causal != 3 || ak >= am);
    la[ly][lx] = live ? (ta ? A[(long)ak * lda + am] : A[(long)am * lda + ak]) : 0.0f;
    lb[ly][lx] = bk < K && bn < N ? (tb ? B[(long)bn * ldb + bk] : B[(long)bk * ldb + bn]) : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TT; i++) acc = mad(la[ly][i], lb[i][lx], acc);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (m < M && n < N) {
    global float *o = C + (long)m * ldc + n;
    *o = beta == 0.0f ? alpha * acc : alpha * acc + beta * *o;
  }
}

// Row i of head h (one work-group of WG each, (H S) groups): p (S) holds the scaled scores of
// keys 0..S-1; the softmax over lo..i in place (lo = max(0, i + 1 - window), window <= 0: 0, the
// causal softmax), 0 outside them. With a window P·V then sums the zeros (the products are not
// narrowed to it).
kernel void attn_rows_softmax(global float *att, int S, int window) {
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

// Row i of head h: ds (S) holds dp = dout_i · v_j; with D = Σ_{j<=i} p dp,
// ds = p (dp - D) scale for j <= i, 0 right of the diagonal.
kernel void attn_rows_ds(global float *ds, global const float *att, int S, float scale) {
  local float lr[WG];
  const int row = get_group_id(0), i = row % S, lid = get_local_id(0);
  global float *d = ds + (long)row * S;
  global const float *p = att + (long)row * S;
  float s = 0.0f;
  for (int j = lid; j <= i; j += WG) s = mad(p[j], d[j], s);
  lr[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) lr[lid] += lr[lid + st];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float D = lr[0];
  for (int j = lid; j < S; j += WG) d[j] = j <= i ? p[j] * (d[j] - D) * scale : 0.0f;
}
