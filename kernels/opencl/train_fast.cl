// train_fast.cl - the fast tier's training kernels (issue 30), chosen where llsrv_fast.cl's are
// (LL_OPENCL_REFERENCE, ocl_ctx.fast): portable OpenCL 1.2, no vendor extension. Not the CPU's
// bits: sums in tile order with mad; tests/test_opencl_train_fast.c states the tolerances.
// Embedded after train.cl (one program).
//
// So far the two backward products (the reference's one-work-item-per-output loops re-read a
// row of dout and a column of W from global memory per output): 16 x 16 tiles of the output
// per work-group, the reduction dimension stepped 16 at a time through local memory (each
// operand element read from global memory once per tile row / column instead of once per
// output). Quantized W is dequantized by train.cl's deq_rows into a chunk of f32 rows first.

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
// work-group reductions (attn_rows_*). Products also sum the masked zeros right of the diagonal
// (not skipped yet).

// C[b] (M, N) = alpha A[b] (M, K) · B[b] (K, N) + beta C[b], b = get_global_id(2). Operand X of
// batch b starts at X + offX + (b / divX) bsX (a kv head serves divX query heads); ta: A is
// stored (K, M) (A(m, k) = A[k lda + m]), tb: B is stored (N, K). Work-group (16, 16) over
// (n, m); global sizes rounded up to 16.
kernel void gemm_tiled(global float *C, global const float *A, global const float *B, int M, int N, int K, int lda, int ldb, int ldc,
                       long offA, long offB, long offC, long bsA, long bsB, long bsC, int divA, int divB, int ta, int tb, float alpha,
                       float beta) {
  local float la[TT][TT + 1], lb[TT][TT + 1]; // A tile (m, k), B tile (k, n)
  const int lx = get_local_id(0), ly = get_local_id(1), n = get_global_id(0), m = get_global_id(1), bt = get_global_id(2);
  const int m0 = get_group_id(1) * TT, n0 = get_group_id(0) * TT;
  A += offA + (long)(bt / divA) * bsA;
  B += offB + (long)(bt / divB) * bsB;
  C += offC + (long)bt * bsC;
  float acc = 0.0f;
  for (int kb = 0; kb < K; kb += TT) {
    // la[ly][lx] = A(m0 + ly, kb + lx), lb[ly][lx] = B(kb + ly, n0 + lx)
    const int am = m0 + ly, ak = kb + lx, bk = kb + ly, bn = n0 + lx;
    la[ly][lx] = am < M && ak < K ? (ta ? A[(long)ak * lda + am] : A[(long)am * lda + ak]) : 0.0f;
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

// Row i of head h (one work-group of WG each, (H S) groups): p (S) holds the scaled scores;
// the causal softmax over j <= i in place, 0 right of the diagonal.
kernel void attn_rows_softmax(global float *att, int S) {
  local float lr[WG];
  const int row = get_group_id(0), i = row % S, lid = get_local_id(0);
  global float *p = att + (long)row * S;
  float m = -INFINITY;
  for (int j = lid; j <= i; j += WG) m = fmax(m, p[j]);
  lr[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) lr[lid] = fmax(lr[lid], lr[lid + st]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = lr[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float s = 0.0f;
  for (int j = lid; j <= i; j += WG) s += exp(p[j] - m);
  lr[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st) lr[lid] += lr[lid + st];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / lr[0];
  for (int j = lid; j < S; j += WG) p[j] = j <= i ? exp(p[j] - m) * inv : 0.0f;
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
