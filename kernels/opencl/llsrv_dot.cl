// llsrv_dot.cl - the fast tier's decode products on integer dots, and the dot probe: a program
// of its own (program.c ocl_dot_setup), built from this file's text after the shared segments
// of llsrv.cl and llsrv_fast.cl (program.c dot_source) with -DLL_DOT_PROGRAM and -DLL_DOT=0 (portable), 1 (cl_khr_integer_dot_product) or 2 (NVIDIA's PTX dp4a). In the
// main program (every .cl file is embedded and built together) it is compiled out, so a vendor
// path that does not build costs a rebuild of this small program only, never the main one.
//
// fmm_* (llsrv_fast.cl) unpacks each 32-weight unit to floats and multiplies them with the
// activations quantized as the CPU quantizes them, then multiplied back out in f32. fmmi_*
// keeps both as integers - 4 signed bytes a word, dotted 4 at a time with ll_dot4 and summed in
// int, the block's sum then scaled as kernels/cpu/dot.c's dot_<w>_q8_<0|1> scale theirs - so its
// per-block sums are the CPU's exactly; only the order of the block sums differs (FL lanes, then
// a tree). Q4_0 / Q5_0 weights are kept unsigned (0..15, 0..31) and their zero point comes off
// the integer sum as z * Σ xq (exact). K-quants (Q4_K, Q5_K, Q6_K against Q8_K) the same way
// per 32-weight unit, each unit's integers (scales, mins and Q6_K's zero point 32 applied in
// int) scaled and added in f32 (the CPU adds a 256-block's integers first: within float
// rounding, not its order). Decode only (up to FT tokens a work-group; prompts keep
// fmmt_*), the same arguments, grid and fusions as fmm_* (ops.c chooses).
#ifdef LL_DOT_PROGRAM
// After llsrv.cl's and llsrv_fast.cl's shared segments (the pragmas, f64, WG, FR, FL,
// round_f16, fdiv, fsqrt, ldh and fmm_store): program.c dot_source.
#define FT 4   // tokens per work-group (== FR: the norm pass gives each token FL work items)
#define KC 512 // activations staged per pass (a multiple of 32)

// ll_dot4(a, b, acc): acc + the dot product of the four signed bytes of a and of b (byte 0 the
// least significant). The portable form is always here: the probe compares the chosen one to it.
inline int ll_dot4_portable(uint a, uint b, int acc) {
  const char4 x = as_char4(a), y = as_char4(b);
  return acc + (int)x.s0 * (int)y.s0 + (int)x.s1 * (int)y.s1 + (int)x.s2 * (int)y.s2 + (int)x.s3 * (int)y.s3;
}
#if LL_DOT == 2
// NVIDIA (sm_61 and later): one dp4a instruction through inline PTX, which NVIDIA's OpenCL
// compiler accepts (others reject asm: the build fails and program.c falls back).
inline int ll_dot4(uint a, uint b, int acc) {
  int r;
  asm volatile("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
  return r;
}
#elif LL_DOT == 1
#pragma OPENCL EXTENSION cl_khr_integer_dot_product : enable
inline int ll_dot4(uint a, uint b, int acc) { return acc + dot_4x8packed_ss_int(a, b); }
#else
#define ll_dot4 ll_dot4_portable
#endif

// Bits 0..3 of n moved to bit 4 of bytes 0..3 (a Q5 unit's fifth bits, four weights a word).
inline uint q5_hi(uint n) { return ((n & 1u) << 4) | ((n & 2u) << 11) | ((n & 4u) << 18) | ((n & 8u) << 25); }

// Unit u (32 weights) of a row as 8 words of 4 bytes (weights 4j .. 4j + 3 in word j), its
// scale *d, offset *m (Q4_1, Q5_1: weight d * q + m; else 0) and zero point *z (Q4_0: 8,
// Q5_0: 16, else 0: weight d * (q - z)). wt is a literal at every call: the branches fold away.
inline void du_unit(const int wt, global const uchar *row, int u, uint *q, float *d, float *m, int *z) {
  *m = 0, *z = 0;
  if (wt == 8) { // Q8_0: signed bytes as they are
    global const uchar *blk = row + u * 34;
    *d = ldh(blk);
    const uint4 a = as_uint4(vload16(0, blk + 2)), b = as_uint4(vload16(1, blk + 2));
    q[0] = a.s0, q[1] = a.s1, q[2] = a.s2, q[3] = a.s3, q[4] = b.s0, q[5] = b.s1, q[6] = b.s2, q[7] = b.s3;
    return;
  }
  const int q5 = wt == 6 || wt == 7, one = wt == 3 || wt == 7;
  global const uchar *blk = row + u * (wt == 2 ? 18 : wt == 3 ? 20 : wt == 6 ? 22 : 24);
  *d = ldh(blk);
  if (one) *m = ldh(blk + 2);
  *z = one ? 0 : q5 ? 16 : 8;
  global const uchar *qs = blk + (one ? 4 : 2) + (q5 ? 4 : 0);
  const uint4 w = as_uint4(vload16(0, qs));
  const uint wv[4] = {w.s0, w.s1, w.s2, w.s3};
  uint qh = 0;
  if (q5) {
    global const uchar *hp = blk + (one ? 4 : 2);
    qh = hp[0] | (hp[1] << 8) | (hp[2] << 16) | ((uint)hp[3] << 24);
  }
  for (int j = 0; j < 4; j++) {
    q[j] = wv[j] & 0x0f0f0f0fu, q[j + 4] = (wv[j] >> 4) & 0x0f0f0f0fu;
    if (q5) q[j] |= q5_hi(qh >> (4 * j)), q[j + 4] |= q5_hi(qh >> (16 + 4 * j));
  }
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (llsrv.cl's k_scale_min).
inline void k_scale_min(int j, global const uchar *s, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63, *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Unit u (sub-block u & 7 of super-block u >> 3) of a K-quant row as 8 words of unsigned bytes
// (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63: its weight d * sc * (q - 32)), the super-block's *d and
// *dmin (Q4_K, Q5_K), the scales of the unit's halves *s0, *s1 (Q4_K, Q5_K: one for both) and
// the min *mn (Q4_K, Q5_K: weight d * sc * q - dmin * mn).
inline void dk_unit(const int wt, global const uchar *row, int u, uint *q, float *d, float *dmin, int *s0, int *s1, int *mn) {
  const int j = u & 7;
  if (wt == 14) {
    const int h = j >> 2, c = j & 3;
    global const uchar *blk = row + (u >> 3) * 210, *qlp = blk + 64 * h + 32 * (c & 1), *qhp = blk + 128 + 32 * h;
    global const char *sc = (global const char *)(blk + 192) + 8 * h + 2 * c;
    *d = ldh(blk + 208), *dmin = 0, *s0 = sc[0], *s1 = sc[1], *mn = 0;
    const int lsh = (c >> 1) * 4, hsh = 2 * c;
    const uint8 l = (uint8)(as_uint4(vload16(0, qlp)), as_uint4(vload16(1, qlp))), hh = (uint8)(as_uint4(vload16(0, qhp)), as_uint4(vload16(1, qhp)));
    const uint8 v = ((l >> (uint)lsh) & 0x0f0f0f0fu) | (((hh >> (uint)hsh) & 0x03030303u) << 4);
    vstore8(v, 0, q);
    return;
  }
  global const uchar *blk = row + (u >> 3) * (wt == 12 ? 144 : 176);
  int sc, m;
  k_scale_min(j, blk + 4, &sc, &m);
  *d = ldh(blk), *dmin = ldh(blk + 2), *s0 = *s1 = sc, *mn = m;
  global const uchar *qp = blk + (wt == 12 ? 16 : 48) + 32 * (j >> 1);
  uint8 v = ((uint8)(as_uint4(vload16(0, qp)), as_uint4(vload16(1, qp))) >> (uint)((j & 1) * 4)) & 0x0f0f0f0fu;
  if (wt == 13) v |= (((uint8)(as_uint4(vload16(0, blk + 16)), as_uint4(vload16(1, blk + 16))) >> (uint)j) & 0x01010101u) << 4;
  vstore8(v, 0, q);
}

inline float xn_at(global const float *xr, global const float *g, float s, int norm, int i) { return norm ? (xr[i] * s) * g[i] : xr[i]; }

// out[m] (T, N_m) (op) xn (T, K) · W_m (N_m, K)ᵀ: fmm_body's contract (llsrv_fast.cl), for
// T <= FT a work-group's tokens, with integer dots. Staged per token and unit in local memory:
// the Q8 quantization of the 32 activations as the CPU makes it (act_quant's expressions) as 8
// packed words, its scale d (f16; Q8_K: its 256-block's, f32), the integer sums of its two
// halves and its f16 sum s (Q8_1, for the offsets).
inline void fmmi_body(const int wt, global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x,
                      global const float *g, float eps, int norm, global float *o0, global float *o1, global float *o2, int K, int N0, int N1,
                      int N2, int T, int op, local float *part, local float *inv, local uint *xq, local float *xd, local float *xs,
                      local int *xsm) {
  const int lid = get_local_id(0), slot = lid / FL, lane = lid % FL;
  const int t0 = get_group_id(1) * FT, nt = min(FT, T - t0), blk = get_group_id(0);
  if (norm) { // 1/rms of token t0 + slot: FL work items over its K floats
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
  }
  int m, row, valid;
  if (op == 2) {
    m = slot / (FR / 2), row = blk * (FR / 2) + slot % (FR / 2), valid = row < N0;
  } else {
    const int b0 = (N0 + FR - 1) / FR, b1 = (N1 + FR - 1) / FR;
    m = blk < b0 ? 0 : blk < b0 + b1 ? 1 : 2;
    row = (blk - (m == 0 ? 0 : m == 1 ? b0 : b0 + b1)) * FR + slot;
    valid = row < (m == 0 ? N0 : m == 1 ? N1 : N2);
  }
  global const uchar *wr = (m == 0 ? W0 : m == 1 ? W1 : W2) + (size_t)row * rb;
  float acc[FT];
  for (int tt = 0; tt < FT; tt++) acc[tt] = 0;
  for (int k0 = 0; k0 < K; k0 += KC) {
    const int nuc = min(KC, K - k0) / 32, u0 = k0 / 32;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = lid; i < FT * nuc; i += FR * FL) {
      const int tt = i / nuc, uu = i % nuc;
      if (tt < nt) {
        global const float *xr = x + (size_t)(t0 + tt) * K;
        const float s = norm ? inv[tt] : 1.0f;
        float xv[32], amax = 0, mx = 0;
        for (int j = 0; j < 32; j++) xv[j] = xn_at(xr, g, s, norm, (u0 + uu) * 32 + j), amax = fmax(amax, fabs(xv[j]));
        float d0 = fdiv(amax, 127.f), id = amax != 0.0f ? fdiv(127.f, amax) : 0.0f;
        if (wt >= 12) { // Q8_K: the scale of the unit's 256-block, from its element of largest magnitude
          amax = 0;
          const int b0 = ((u0 + uu) & ~7) * 32;
          for (int j = 0; j < 256; j++) {
            const float v = xn_at(xr, g, s, norm, b0 + j);
            if (amax < fabs(v)) amax = fabs(v), mx = v;
          }
          id = amax != 0.0f ? fdiv(-127.f, mx) : 0.0f, d0 = amax != 0.0f ? fdiv(1.0f, id) : 0.0f;
        }
        int h[2] = {0, 0};
        local uint *qp = xq + tt * (KC / 4) + uu * 8;
        for (int j = 0; j < 32; j += 4) {
          int a = (int)rint(xv[j] * id), b = (int)rint(xv[j + 1] * id), c = (int)rint(xv[j + 2] * id), e = (int)rint(xv[j + 3] * id);
          if (wt >= 12) a = min(a, 127), b = min(b, 127), c = min(c, 127), e = min(e, 127);
          h[j >> 4] += a + b + c + e;
          qp[j / 4] = ((uint)a & 255u) | (((uint)b & 255u) << 8) | (((uint)c & 255u) << 16) | ((uint)e << 24);
        }
        const int at = tt * (KC / 32) + uu, sum = h[0] + h[1];
        xd[at] = wt >= 12 ? d0 : round_f16(d0), xsm[2 * at] = h[0], xsm[2 * at + 1] = h[1], xs[at] = round_f16(d0 * (float)sum);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (valid) {
      for (int uu = lane; uu < nuc; uu += FL) {
        uint q[8];
        float dw, mw, dmin = 0;
        int z = 0, s0 = 0, s1 = 0, mn = 0;
        if (wt >= 12) dk_unit(wt, wr, u0 + uu, q, &dw, &dmin, &s0, &s1, &mn);
        else du_unit(wt, wr, u0 + uu, q, &dw, &mw, &z);
        for (int tt = 0; tt < nt; tt++) {
          local const uint *xp = xq + tt * (KC / 4) + uu * 8;
          const int at = tt * (KC / 32) + uu;
          int si = 0, sj = 0;
          for (int j = 0; j < 4; j++) si = ll_dot4(q[j], xp[j], si);
          for (int j = 4; j < 8; j++) sj = ll_dot4(q[j], xp[j], sj);
          const float dx = xd[at];
          // each type's block term as kernels/cpu/dot.c writes it (K-quants: per unit, where
          // the CPU adds a super-block's integers first)
          if (wt == 12 || wt == 13) {
            acc[tt] += dx * (dw * (float)(s0 * (si + sj)) - dmin * (float)(mn * (xsm[2 * at] + xsm[2 * at + 1])));
            continue;
          }
          if (wt == 14) {
            acc[tt] += (dw * dx) * (float)(s0 * (si - 32 * xsm[2 * at]) + s1 * (sj - 32 * xsm[2 * at + 1]));
            continue;
          }
          si += sj - z * (xsm[2 * at] + xsm[2 * at + 1]);
          if (wt == 2) acc[tt] = fma((float)si, dw * dx, acc[tt]);
          else if (wt == 3 || wt == 7) acc[tt] += (dw * dx) * (float)si + mw * xs[at];
          else if (wt == 6) acc[tt] += ((float)si * dw) * dx;
          else acc[tt] += (float)si * (dw * dx);
        }
      }
    }
  }
  fmm_store(part, acc, FT, nt, slot, lane, op, valid, m, row, t0, o0, o1, o2, N0, N1, N2);
}

#define FMMI_KERNEL(NAME, WT)                                                                                                      \
  kernel void fmmi_##NAME(global const uchar *W0, global const uchar *W1, global const uchar *W2, ulong rb, global const float *x,   \
                          global const float *g, float eps, int norm, global float *o0, global float *o1, global float *o2, int K,   \
                          int N0, int N1, int N2, int T, int op) {                                                              \
    local float part[FR * FT * FL];                                                                                           \
    local float inv[FT];                                                                                                      \
    local uint xq[FT * KC / 4];                                                                                               \
    local float xd[FT * (KC / 32)], xs[FT * (KC / 32)];                                                                       \
    local int xsm[2 * FT * (KC / 32)];                                                                                          \
    fmmi_body(WT, W0, W1, W2, rb, x, g, eps, norm, o0, o1, o2, K, N0, N1, N2, T, op, part, inv, xq, xd, xs, xsm);             \
  }
FMMI_KERNEL(q4_0, 2)
FMMI_KERNEL(q4_1, 3)
FMMI_KERNEL(q5_0, 6)
FMMI_KERNEL(q5_1, 7)
FMMI_KERNEL(q8_0, 8)
FMMI_KERNEL(q4_K, 12)
FMMI_KERNEL(q5_K, 13)
FMMI_KERNEL(q6_K, 14)

// The probe (program.c ocl_dot_probe): row i of a and b (n, 8 words) dotted from acc = i - n / 2
// through ll_dot4 into out[i] and through the portable form into out[n + i]; the host checks
// both against its own byte-wise sums, exactly.
kernel void dot_probe(global const uint *a, global const uint *b, global int *out, int n) {
  const int i = get_global_id(0);
  if (i >= n) return;
  int s = i - n / 2, p = s;
  for (int j = 0; j < 8; j++) s = ll_dot4(a[i * 8 + j], b[i * 8 + j], s), p = ll_dot4_portable(a[i * 8 + j], b[i * 8 + j], p);
  out[i] = s, out[n + i] = p;
}
#endif // LL_DOT_PROGRAM
