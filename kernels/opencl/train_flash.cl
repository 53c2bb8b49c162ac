// train_flash.cl - flash-style training attention (issue 30), the fast tier's optional members
// attention_train_flash / attention_backward_flash (ll_backend.h). Embedded after train_fast.cl
// (one program). Not the CPU's bits: sums in tile order with mad; tests/test_opencl_train_fast.c
// states the tolerances.
//
// The forward keeps out and one logsumexp per (head, query) row, lse (H, S), instead of the
// probabilities (H, S, S): a work-group of 16 x 16 takes 16 queries of one head, its q rows in
// local memory, and walks the key tiles from the first its window reaches to the causal
// diagonal's (the tiles right of it are never visited), 16 keys at a time: scores through local
// memory (K 16 x 16 at a time), an online softmax (running max m and sum l per row; the
// accumulated out rescaled by exp(m_old - m_new)), P·V added to 16 columns per work item.
// The backward (FlashAttention-2's) recomputes each tile's probabilities from q, k and lse:
//   p = exp(scale q·k - lse), dp = dout·v, D_i = Σ_e dout_i out_i (= Σ_j p dp), ds = p (dp - D) scale
// in two kernels: dq per query block (which also writes D), then dk, dv per key block and kv
// head, the query heads sharing it summed in head order inside the work-group (no atomics).
// The window (Gemma 3's local layers) is a parameter: query i sees keys lo_i .. i, lo_i =
// max(0, i + 1 - window) (window 0: all of 0 .. i); the tiles wholly outside it are skipped.

#define FB 16                // the query / key tile's side (work-group 16 x 16)
#define FD_MAX 256           // head_dim at most (train_ops.c refuses larger: LL_EUNSUPPORTED)
#define FC (FD_MAX / FB)     // output columns per work item (e = c 16 + lx)

inline int flash_lo(int i, int window) { return window > 0 && i + 1 > window ? i + 1 - window : 0; }

// out (S, H, hd), lse (H, S) from q (S, H, hd), k, v (S, Hkv, hd). Work-group (16, 16) over
// (lx, ly): row ly of query block get_group_id(0), head get_group_id(1); lx the key of a tile's
// scores, then the output columns lx + 16 c.
kernel void attn_flash_fwd(global float *out, global float *lse, global const float *q, global const float *k, global const float *v, int S,
                           int H, int Hkv, int hd, float scale, int window) {
  local float lq[FB][FD_MAX + 1], lt[FB][FB + 1], lp[FB][FB + 1]; // q rows; a K / V tile (16 x 16); scores, then probabilities
  const int lx = get_local_id(0), ly = get_local_id(1), i0 = get_group_id(0) * FB, h = get_group_id(1), kh = h / (H / Hkv);
  const int i = i0 + ly, lo = flash_lo(i, window), hdr = (hd + FB - 1) / FB * FB;
  const long qs = (long)H * hd, ks = (long)Hkv * hd;
  global const float *kb = k + (long)kh * hd, *vb = v + (long)kh * hd;
  for (int e = lx; e < hdr; e += FB) lq[ly][e] = i < S && e < hd ? q[i * qs + (long)h * hd + e] : 0.0f;
  float o[FC], m = -INFINITY, l = 0.0f;
  for (int c = 0; c < FC; c++) o[c] = 0.0f;
  for (int j0 = flash_lo(i0, window) / FB * FB; j0 <= i0; j0 += FB) {
    float s = 0.0f; // q_i · k_j, j = j0 + lx
    for (int e0 = 0; e0 < hd; e0 += FB) {
      barrier(CLK_LOCAL_MEM_FENCE);
      lt[ly][lx] = j0 + ly < S && e0 + lx < hd ? kb[(j0 + ly) * ks + e0 + lx] : 0.0f;
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int t = 0; t < FB; t++) s = mad(lq[ly][e0 + t], lt[lx][t], s);
    }
    const int j = j0 + lx;
    s = i < S && j <= i && j >= lo ? s * scale : -INFINITY;
    lp[ly][lx] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    float mt = m;
    for (int t = 0; t < FB; t++) mt = fmax(mt, lp[ly][t]);
    // a row with nothing visible so far (a tile left of its window, a row past S) keeps m = -inf
    const float alpha = mt == -INFINITY ? 1.0f : exp(m - mt), p = mt == -INFINITY ? 0.0f : exp(s - mt);
    barrier(CLK_LOCAL_MEM_FENCE);
    lp[ly][lx] = p;
    barrier(CLK_LOCAL_MEM_FENCE);
    float ps = 0.0f;
    for (int t = 0; t < FB; t++) ps += lp[ly][t];
    l = mad(l, alpha, ps), m = mt;
    for (int c = 0; c < FC && c * FB < hd; c++) { // out_i = alpha out_i + Σ_j p_ij v_j, 16 columns at a time
      const int e = c * FB + lx;
      barrier(CLK_LOCAL_MEM_FENCE);
      lt[ly][lx] = j0 + ly < S && c * FB + lx < hd ? vb[(j0 + ly) * ks + c * FB + lx] : 0.0f;
      barrier(CLK_LOCAL_MEM_FENCE);
      float a = o[c] * alpha;
      for (int t = 0; t < FB; t++) a = mad(lp[ly][t], lt[t][lx], a);
      o[c] = e < hd ? a : 0.0f;
    }
  }
  if (i >= S) return; // after the last barrier
  const float inv = 1.0f / l;
  for (int c = 0; c < FC && c * FB + lx < hd; c++) out[i * qs + (long)h * hd + c * FB + lx] = o[c] * inv;
  if (lx == 0) lse[(long)h * S + i] = m + log(l);
}

// dq (S, H, hd) overwritten, dd (H, S) = D per row (for attn_flash_bwd_dkv), from dout, out,
// q (S, H, hd), k, v (S, Hkv, hd), lse (H, S). Work-group as attn_flash_fwd's (row ly of a
// query block, head get_group_id(1)); dq_i = Σ_j ds_ij k_j over the same key tiles.
kernel void attn_flash_bwd_dq(global float *dq, global float *dd, global const float *dout, global const float *out, global const float *q,
                              global const float *k, global const float *v, global const float *lse, int S, int H, int Hkv, int hd,
                              float scale, int window) {
  local float lq[FB][FD_MAX + 1], ldo[FB][FD_MAX + 1], lt[FB][FB + 1], lu[FB][FB + 1], lds[FB][FB + 1];
  const int lx = get_local_id(0), ly = get_local_id(1), i0 = get_group_id(0) * FB, h = get_group_id(1), kh = h / (H / Hkv);
  const int i = i0 + ly, lo = flash_lo(i, window), hdr = (hd + FB - 1) / FB * FB;
  const long qs = (long)H * hd, ks = (long)Hkv * hd, qo = i * qs + (long)h * hd;
  global const float *kb = k + (long)kh * hd, *vb = v + (long)kh * hd;
  float d = 0.0f;
  for (int e = lx; e < hdr; e += FB) {
    const int in = i < S && e < hd;
    lq[ly][e] = in ? q[qo + e] : 0.0f;
    ldo[ly][e] = in ? dout[qo + e] : 0.0f;
    if (in) d = mad(dout[qo + e], out[qo + e], d);
  }
  lt[ly][lx] = d;
  barrier(CLK_LOCAL_MEM_FENCE);
  float D = 0.0f; // Σ_e dout_i out_i, the row's 16 partial sums in lx order
  for (int t = 0; t < FB; t++) D += lt[ly][t];
  if (lx == 0 && i < S) dd[(long)h * S + i] = D;
  const float L = i < S ? lse[(long)h * S + i] : 0.0f;
  float acc[FC];
  for (int c = 0; c < FC; c++) acc[c] = 0.0f;
  for (int j0 = flash_lo(i0, window) / FB * FB; j0 <= i0; j0 += FB) {
    float s = 0.0f, dp = 0.0f; // q_i · k_j and dout_i · v_j, j = j0 + lx
    for (int e0 = 0; e0 < hd; e0 += FB) {
      barrier(CLK_LOCAL_MEM_FENCE);
      const int in = j0 + ly < S && e0 + lx < hd;
      lt[ly][lx] = in ? kb[(j0 + ly) * ks + e0 + lx] : 0.0f;
      lu[ly][lx] = in ? vb[(j0 + ly) * ks + e0 + lx] : 0.0f;
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int t = 0; t < FB; t++) s = mad(lq[ly][e0 + t], lt[lx][t], s), dp = mad(ldo[ly][e0 + t], lu[lx][t], dp);
    }
    const int j = j0 + lx;
    const float p = i < S && j <= i && j >= lo ? exp(s * scale - L) : 0.0f;
    lds[ly][lx] = p * (dp - D) * scale;
    for (int c = 0; c < FC && c * FB < hd; c++) { // dq_i += Σ_j ds_ij k_j, 16 columns at a time
      barrier(CLK_LOCAL_MEM_FENCE);
      lt[ly][lx] = j0 + ly < S && c * FB + lx < hd ? kb[(j0 + ly) * ks + c * FB + lx] : 0.0f;
      barrier(CLK_LOCAL_MEM_FENCE);
      float a = acc[c];
      for (int t = 0; t < FB; t++) a = mad(lds[ly][t], lt[t][lx], a);
      acc[c] = a;
    }
  }
  if (i >= S) return;
  for (int c = 0; c < FC && c * FB + lx < hd; c++) dq[qo + c * FB + lx] = acc[c];
}

// dk, dv (S, Hkv, hd) overwritten, from dout, q (S, H, hd), k, v, lse and dd (H, S). Work-group
// (16, 16): key row ly of key block get_group_id(0), kv head get_group_id(1); lx the query of a
// tile, then the output columns lx + 16 c. The query heads of the kv head in order, each over
// the query tiles from the diagonal's to the last its window reaches:
//   dv_j += Σ_i p_ij dout_i;  dk_j += Σ_i ds_ij q_i
kernel void attn_flash_bwd_dkv(global float *dk, global float *dv, global const float *dout, global const float *q, global const float *k,
                               global const float *v, global const float *lse, global const float *dd, int S, int H, int Hkv, int hd,
                               float scale, int window) {
  local float lk[FB][FD_MAX + 1], lv[FB][FD_MAX + 1], lt[FB][FB + 1], lu[FB][FB + 1], lp[FB][FB + 1], lds[FB][FB + 1];
  const int lx = get_local_id(0), ly = get_local_id(1), j0 = get_group_id(0) * FB, kh = get_group_id(1), grp = H / Hkv;
  const int j = j0 + ly, hdr = (hd + FB - 1) / FB * FB;
  const long qs = (long)H * hd, ks = (long)Hkv * hd, ko = j * ks + (long)kh * hd;
  for (int e = lx; e < hdr; e += FB) {
    const int in = j < S && e < hd;
    lk[ly][e] = in ? k[ko + e] : 0.0f;
    lv[ly][e] = in ? v[ko + e] : 0.0f;
  }
  const int iend = window > 0 ? min(S, j0 + FB - 1 + window) : S; // past the last query that sees a key of the block
  float ak[FC], av[FC];
  for (int c = 0; c < FC; c++) ak[c] = av[c] = 0.0f;
  for (int h = kh * grp; h < (kh + 1) * grp; h++) {
    global const float *qb = q + (long)h * hd, *ob = dout + (long)h * hd;
    for (int i0 = j0; i0 < iend; i0 += FB) {
      const int i = i0 + lx;
      float s = 0.0f, dp = 0.0f; // q_i · k_j and dout_i · v_j, the forward's products in the same order
      for (int e0 = 0; e0 < hd; e0 += FB) {
        barrier(CLK_LOCAL_MEM_FENCE);
        const int in = i0 + ly < S && e0 + lx < hd;
        lt[ly][lx] = in ? qb[(i0 + ly) * qs + e0 + lx] : 0.0f;
        lu[ly][lx] = in ? ob[(i0 + ly) * qs + e0 + lx] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int t = 0; t < FB; t++) s = mad(lt[lx][t], lk[ly][e0 + t], s), dp = mad(lu[lx][t], lv[ly][e0 + t], dp);
      }
      const int live = i < S && j < S && j <= i && j >= flash_lo(i, window);
      const float p = live ? exp(s * scale - lse[(long)h * S + i]) : 0.0f;
      lp[ly][lx] = p;
      lds[ly][lx] = live ? p * (dp - dd[(long)h * S + i]) * scale : 0.0f;
      for (int c = 0; c < FC && c * FB < hd; c++) {
        barrier(CLK_LOCAL_MEM_FENCE);
        const int in = i0 + ly < S && c * FB + lx < hd;
        lt[ly][lx] = in ? qb[(i0 + ly) * qs + c * FB + lx] : 0.0f;
        lu[ly][lx] = in ? ob[(i0 + ly) * qs + c * FB + lx] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        float a = av[c], b = ak[c];
        for (int t = 0; t < FB; t++) a = mad(lp[ly][t], lu[t][lx], a), b = mad(lds[ly][t], lt[t][lx], b);
        av[c] = a, ak[c] = b;
      }
    }
  }
  if (j >= S) return;
  for (int c = 0; c < FC && c * FB + lx < hd; c++) dk[ko + c * FB + lx] = ak[c], dv[ko + c * FB + lx] = av[c];
}
