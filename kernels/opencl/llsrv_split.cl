// llsrv_split.cl - the fast tier's split-K ("flash-decoding") attention for decode at long
// contexts (after llsrv_fast.cl, whose attn_pass it runs; embedded with it).
//
// attn_fast gives a work-group a block of up to AQ (token, head) rows of one sequence and KV
// head and walks that block's whole range of cache positions. A decode step of few sequences
// has few blocks (SmolLM2, one sequence: 3 work-groups), so at a long context a handful of
// work-groups each read thousands of K and V rows while the rest of the device idles. Here a
// block's range is split into ns chunks (ops.c chooses ns per sequence from its span and the
// device's compute units); each chunk's work-group runs the same pass over its positions and
// leaves a partial - per row the running max m, sum l and the unnormalized acc[hd] - and the
// partials of a block are combined:
//   M = max_s m_s, out = Σ_s e^(m_s - M) acc_s / Σ_s e^(m_s - M) l_s.
// The combine runs in the same launch, by the block's last work-group to finish: each work-
// group publishes its partial, fences, and bumps the block's counter (a global atomic); the one
// that sees ns - 1 combines and sets the counter back to 0 for the next launch. So attention
// stays one launch (a decode step's 6 per layer) and needs no second kernel; the alternative,
// folding the combine into the output product that reads attention's result, would give the
// products' kernel (llsrv_fast.cl fmm_*) an attention-shaped input for one case. The partials
// are read back through volatile pointers after the atomic (not through a cache that may hold
// no copy of another work-group's writes: OpenCL 1.2 promises cross-work-group visibility only
// through atomics and fences, which is what this uses; counters and partials are per backend
// instance, and a queue runs one launch at a time).
// A block of ns 1 is attn_fast's work-group exactly (the same pass, the same stores): a launch
// with any split block runs every block here, and the others get attn_fast's bits.
//
// items (n_item, AW): a work-group's block (its sequence's first row t0, first pair k0, pair
// count nq, as attn_fast's blk), the chunk's positions clo .. chi, the block's ns, the first
// partial slot g0 of the block (also its counter's index; its chunk s has slot g0 + s) and s.
// Work-group = item * Hkv + kvh. part (slots, Hkv, AQ * (hd + 2)): m (AQ), l (AQ), acc (AQ, hd).
// cnt (slots, Hkv): zero between launches.
#define AW 8
kernel void attn_split(global float *out, global const float *q, global const uchar *K, global const uchar *V, global const int *pos,
                       global const int *tab, global const int *seq_of, global const int *tab_off, global const int *items, int H,
                       int Hkv, int hd, int block, int f16, float scale, int window, global float *part, global uint *cnt) {
  local float qs[AQ * 256], ks[AKT], vs[AVT], ps[AQ * 64];
  local float m_run[AQ], l_run[AQ], m_new[AQ], alpha[AQ];
  local int lo_r[AQ], hi_r[AQ];
  local int last;
  const int lid = get_local_id(0), it = get_group_id(0) / Hkv, kvh = get_group_id(0) % Hkv, G = H / Hkv;
  global const int *w = items + AW * it;
  const int t0 = w[0], k0 = w[1], nq = w[2], clo = w[3], chi = w[4], ns = w[5], g0 = w[6], s = w[7];
  float acc[AACC];
  attn_pass(q, K, V, pos, tab, seq_of, tab_off, t0, k0, nq, kvh, clo, chi, H, Hkv, hd, block, f16, scale, window, qs, ks, vs, ps, m_run,
            l_run, m_new, alpha, lo_r, hi_r, acc);
  if (ns == 1) { // attn_fast's store
    for (int jj = 0; jj < AACC; jj++) {
      const int e = lid + jj * WG;
      if (e < nq * hd) {
        const int i = e / hd, d = e % hd, t = t0 + (k0 + i) / G, h = kvh * G + (k0 + i) % G;
        out[((size_t)t * H + h) * hd + d] = acc[jj] / l_run[i];
      }
    }
    return;
  }
  const int pw = AQ * (hd + 2); // floats of a partial
  global float *mine = part + ((size_t)(g0 + s) * Hkv + kvh) * pw;
  if (lid < nq) mine[lid] = m_run[lid], mine[AQ + lid] = l_run[lid];
  for (int jj = 0; jj < AACC; jj++) {
    const int e = lid + jj * WG;
    if (e < nq * hd) mine[2 * AQ + e] = acc[jj];
  }
  // Publish: every item's stores before the work-group's count (fence, then the barrier that
  // lets item 0 count), then only the last work-group of the block goes on.
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  global uint *c = cnt + (size_t)g0 * Hkv + kvh;
  if (lid == 0) last = atomic_inc(c) == (uint)(ns - 1);
  barrier(CLK_LOCAL_MEM_FENCE);
  if (!last) return;
  mem_fence(CLK_GLOBAL_MEM_FENCE);
  if (lid == 0) atomic_xchg(c, 0u); // every work-group of the block has counted: ready for the next launch
  // The combine: each row's max over the chunks and its sum rescaled to it (m_new, l_run),
  // then each output element's chunks rescaled the same way.
  volatile global const float *pb = part + (size_t)g0 * Hkv * pw + (size_t)kvh * pw; // chunk s' at pb + s' * Hkv * pw
  const size_t cs = (size_t)Hkv * pw;
  if (lid < nq) {
    float mx = -INFINITY;
    for (int j = 0; j < ns; j++) mx = fmax(mx, pb[j * cs + lid]);
    float l = 0;
    for (int j = 0; j < ns; j++) {
      const float mj = pb[j * cs + lid];
      if (mj != -INFINITY) l += exp(mj - mx) * pb[j * cs + AQ + lid];
    }
    m_new[lid] = mx, l_run[lid] = l;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int e = lid; e < nq * hd; e += WG) {
    const int i = e / hd, d = e % hd, t = t0 + (k0 + i) / G, h = kvh * G + (k0 + i) % G;
    const float mx = m_new[i];
    float a = 0;
    for (int j = 0; j < ns; j++) {
      const float mj = pb[j * cs + i];
      if (mj != -INFINITY) a = fma(exp(mj - mx), pb[j * cs + 2 * AQ + e], a);
    }
    out[((size_t)t * H + h) * hd + d] = a / l_run[i];
  }
}
