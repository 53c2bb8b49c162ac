// train_window.cl - the training member Gemma 3 adds (train_ops.c): GeGLU's backward, both
// tiers (the local layers' sliding window is a parameter of train.cl's attn_train, train_fast.cl's
// attn_rows_softmax and train_flash.cl's kernels). Embedded after train.cl and train_fast.cl (one
// program; their helpers, WG, acc_t, inv_sum, fdiv, FP_CONTRACT OFF).

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
