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
