// llsrv.cl - OpenCL 1.2 kernels of the llsrv OpenCL backend (kernels/opencl/backend.c, ops.c).
//
// Embedded into the binary at build time (cmake/embed_cl.cmake). Written for OpenCL C 1.2
// with no extension: f16 data only through vload_half/vstore_half (core), no subgroups, so
// NVIDIA's OpenCL (which offers neither cl_khr_fp16 nor subgroups) runs it as is.
//
// Numerics reproduce the CPU backend's scalar references (kernels/cpu/dot.c, backend_cpu.c)
// bit for bit where the device has cl_khr_fp64 (NVIDIA, AMD, PoCL do): activations are
// quantized to the CPU's bytes (Q8_0, Q8_1, Q8_K), integer sums are exact, and every float
// sum the CPU makes in a fixed order (a dot's blocks, RMSNorm's f64 sum of squares, the
// attention lanes and trees, the softmax sum) is made here in that order: the parallel work
// is the integer and per-block parts, a final sequential pass adds them as the CPU does.
// Divisions and square roots go through f64 (correctly rounded, as the CPU's are; OpenCL's
// f32 ones may be off by ulps). Softmax and SiLU use ggml's exp (ggml_expf) when ggml_math is
// set, as the CPU does; libm's expf (llama2.c models) is not reproduced bit for bit.
// Why bit for bit: Q8 activation quantization turns a last-bit difference into a whole
// quantization step on an outlier channel, and greedy outputs then drift from the CPU's.

// LL_SHARED_BEGIN: from here to LL_SHARED_END, also the head of the programs built from one
// segment of the sources (llsrv_dot.cl; program.c dot_source).
#pragma OPENCL FP_CONTRACT OFF
// LL_NO_FP64 (LL_OPENCL_NO_FP64=1 in the environment): the kernels as a device without f64
// builds them, so the tests cover that path on any device.
#if defined(cl_khr_fp64) && !defined(LL_NO_FP64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define LL_FP64 1
#endif

#define WG 64 // work-group size of the products, norms and attention

// f32 -> nearest f16 (ties to even; overflow to inf) -> f32, without cl_khr_fp16: by bits, as
// formats/quant.c's ll_fp32_to_fp16 / ll_fp16_to_fp32.
inline float round_f16(float f) {
  const uint x = as_uint(f), sign = x & 0x80000000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return as_float(sign | 0x7fc00000u);
  if (ax >= 0x477ff000u) return as_float(sign | 0x7f800000u);
  if (ax >= 0x38800000u) { // normal f16 range: keep 10 mantissa bits, round to even
    uint m = ax >> 13;
    const uint rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (m & 1u))) m++;
    return as_float(sign | (m << 13));
  }
  // subnormal f16 (or zero): a multiple of 2^-24, nearest even
  const float r = rint(as_float(ax) * 0x1.0p24f) * 0x1.0p-24f;
  return as_float(sign | as_uint(r));
}

#ifdef LL_FP64
inline float fdiv(float a, float b) { return (float)((double)a / (double)b); }
inline float fsqrt(float a) { return (float)sqrt((double)a); }
#else
inline float fdiv(float a, float b) { return a / b; }
inline float fsqrt(float a) { return sqrt(a); }
#endif

inline float ldh(global const uchar *p) { return vload_half(0, (global const half *)p); }
// LL_SHARED_END

#define TT 8  // tokens per work-group in a product (the tile for T > 1)

// ---------------------------------------------------------------- helpers

inline float round_bf16(float f) {
  const uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return as_float(((u >> 16) | 64u) << 16);
  return as_float(((u + (0x7fffu + ((u >> 16) & 1u))) >> 16) << 16);
}

// ggml's fixed reduction of eight lanes (hsum of a __m256)
inline float tree8(const float *l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

// ggml's vectorised exp (ggml_v_expf), one lane, as kernels/cpu/dot.c's ggml_expf_lane.
inline float ggml_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = fma(-n, 0x1.7f7d1cp-20f, fma(-n, 0x1.62e4p-1f, x));
  const uint e = as_uint(z) << 23;
  const float k = as_float(e + as_uint(1.0f));
  const float u = b * b;
  const float j = fma(fma(fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u, 0x1.ffffecp-1f * b);
  const float an = fabs(n);
  if (!(an > 126.0f)) return fma(j, k, k);
  const uint g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = as_float(g + 0x7f000000u), s2 = as_float(e - g);
  if (an > 192.0f) return s1 * s1;
  return fma(s2, j, s2) * s1;
}

// ---------------------------------------------------------------- weight units
// Every quantized type is read in units of 32 elements: q[32] integers and two floats a, b
// such that the unit's weights are a * q[i] + b, and a unit's dot with an activation unit
// (integers xq, floats (dx, sx)) is Σ q·xq * (a * dx) + b * sx (see act_quant for sx).
// K-quant sub-block scales are folded into q (the integer sums stay exact).

inline void unpack_q4_0(global const uchar *row, int u, int *q, float *a, float *b) {
  global const uchar *blk = row + u * 18, *qs = blk + 2;
  *a = ldh(blk), *b = 0;
  for (int j = 0; j < 16; j++) q[j] = (qs[j] & 15) - 8, q[j + 16] = (qs[j] >> 4) - 8;
}
inline void unpack_q4_1(global const uchar *row, int u, int *q, float *a, float *b) {
  global const uchar *blk = row + u * 20, *qs = blk + 4;
  *a = ldh(blk), *b = ldh(blk + 2);
  for (int j = 0; j < 16; j++) q[j] = qs[j] & 15, q[j + 16] = qs[j] >> 4;
}
inline void unpack_q5_0(global const uchar *row, int u, int *q, float *a, float *b) {
  global const uchar *blk = row + u * 22, *qs = blk + 6;
  const uint qh = blk[2] | (blk[3] << 8) | (blk[4] << 16) | ((uint)blk[5] << 24);
  *a = ldh(blk), *b = 0;
  for (int j = 0; j < 16; j++) {
    q[j] = ((qs[j] & 15) | (((qh >> j) << 4) & 0x10)) - 16;
    q[j + 16] = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
  }
}
inline void unpack_q5_1(global const uchar *row, int u, int *q, float *a, float *b) {
  global const uchar *blk = row + u * 24, *qs = blk + 8;
  const uint qh = blk[4] | (blk[5] << 8) | (blk[6] << 16) | ((uint)blk[7] << 24);
  *a = ldh(blk), *b = ldh(blk + 2);
  for (int j = 0; j < 16; j++) {
    q[j] = (qs[j] & 15) | (((qh >> j) << 4) & 0x10);
    q[j + 16] = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
  }
}
inline void unpack_q8_0(global const uchar *row, int u, int *q, float *a, float *b) {
  global const uchar *blk = row + u * 34;
  global const char *qs = (global const char *)(blk + 2);
  *a = ldh(blk), *b = 0;
  for (int j = 0; j < 32; j++) q[j] = qs[j];
}
// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block.
inline void k_scale_min(int j, global const uchar *s, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63, *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
// K-quants: q holds sc * quant (the sub-block scale folded in: the integer sums stay exact),
// a = d; b carries the sub-block's integer min m (as bits) for the super-block's msum.
inline void unpack_q4_K(global const uchar *row, int u, int *q, float *a, float *b) {
  const int j = u & 7;
  global const uchar *blk = row + (u >> 3) * 144, *qs = blk + 16 + 32 * (j >> 1);
  int sc, m;
  k_scale_min(j, blk + 4, &sc, &m);
  *a = ldh(blk), *b = as_float(m);
  const int sh = (j & 1) * 4;
  for (int l = 0; l < 32; l++) q[l] = sc * ((qs[l] >> sh) & 15);
}
inline void unpack_q5_K(global const uchar *row, int u, int *q, float *a, float *b) {
  const int j = u & 7;
  global const uchar *blk = row + (u >> 3) * 176, *qh = blk + 16, *qs = blk + 48 + 32 * (j >> 1);
  int sc, m;
  k_scale_min(j, blk + 4, &sc, &m);
  *a = ldh(blk), *b = as_float(m);
  const int sh = (j & 1) * 4;
  for (int l = 0; l < 32; l++) q[l] = sc * (((qs[l] >> sh) & 15) + ((qh[l] >> j) & 1) * 16);
}
inline void unpack_q6_K(global const uchar *row, int u, int *q, float *a, float *b) {
  const int j = u & 7, h = j >> 2, c = j & 3;
  global const uchar *blk = row + (u >> 3) * 210, *ql = blk + 64 * h + 32 * (c & 1), *qh = blk + 128 + 32 * h;
  global const char *sc = (global const char *)(blk + 192) + 8 * h + 2 * c;
  *a = ldh(blk + 208), *b = 0;
  const int lsh = (c >> 1) * 4, hsh = 2 * c;
  for (int l = 0; l < 32; l++) q[l] = sc[l >> 4] * ((int)(((ql[l] >> lsh) & 15) | (((qh[l] >> hsh) & 3) << 4)) - 32);
}

// Dequantized unit u of a row, in formats/quant.c's expressions (get_rows).
inline void deq_unit(int wt, global const uchar *row, int u, global float *o) {
  int q[32];
  float a, b;
  if (wt == 12 || wt == 13) { // Q4_K, Q5_K: (d * sc) * q - dmin * m
    const int j = u & 7;
    global const uchar *blk = row + (u >> 3) * (wt == 12 ? 144 : 176);
    int sc, m;
    k_scale_min(j, blk + 4, &sc, &m);
    const float d1 = ldh(blk) * (float)sc, m1 = ldh(blk + 2) * (float)m;
    const int sh = (j & 1) * 4;
    global const uchar *qs = blk + (wt == 12 ? 16 : 48) + 32 * (j >> 1), *qh = blk + 16;
    for (int l = 0; l < 32; l++) {
      const int v = ((qs[l] >> sh) & 15) + (wt == 13 ? ((qh[l] >> j) & 1) * 16 : 0);
      o[l] = d1 * (float)v - m1;
    }
    return;
  }
  if (wt == 14) { // Q6_K: d * sc * q
    const int j = u & 7, h = j >> 2, c = j & 3;
    global const uchar *blk = row + (u >> 3) * 210, *ql = blk + 64 * h + 32 * (c & 1), *qh = blk + 128 + 32 * h;
    global const char *sc = (global const char *)(blk + 192) + 8 * h + 2 * c;
    const float d = ldh(blk + 208);
    const int lsh = (c >> 1) * 4, hsh = 2 * c;
    for (int l = 0; l < 32; l++)
      o[l] = d * (float)sc[l >> 4] * (float)((int)(((ql[l] >> lsh) & 15) | (((qh[l] >> hsh) & 3) << 4)) - 32);
    return;
  }
  switch (wt) {
  case 2: unpack_q4_0(row, u, q, &a, &b); break;
  case 3: unpack_q4_1(row, u, q, &a, &b); break;
  case 6: unpack_q5_0(row, u, q, &a, &b); break;
  case 7: unpack_q5_1(row, u, q, &a, &b); break;
  default: unpack_q8_0(row, u, q, &a, &b); break;
  }
  if (wt == 3 || wt == 7)
    for (int l = 0; l < 32; l++) o[l] = (float)q[l] * a + b;
  else
    for (int l = 0; l < 32; l++) o[l] = (float)q[l] * a;
}

// ---------------------------------------------------------------- activation quantization
// x (T, K) -> xq (T, K) int8 and xs (T, K/32) float2 per unit:
//   mode 0 (Q8_0): (d, 0)       mode 1 (Q8_1): (d, s = fp16(d_unrounded * Σq))
//   mode 2 (Q8_K): (d, Σq of the unit)   (d per 256-block, as the CPU's q_q8_K)
// Q8_0/Q8_1: one work item per unit; Q8_K: one per 256-block.
kernel void act_quant(global const float *x, global char *xq, global float2 *xs, int K, int T, int mode) {
  const int i = get_global_id(0);
  const int per = mode == 2 ? 256 : 32;
  const int nb = K / per;
  if (i >= nb * T) return;
  const int t = i / nb, bi = i % nb;
  global const float *xp = x + (size_t)t * K + (size_t)bi * per;
  global char *qp = xq + (size_t)t * K + (size_t)bi * per;
  global float2 *sp = xs + (size_t)t * (K / 32) + (size_t)bi * (per / 32);
  if (mode < 2) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(xp[j]));
    const float d = fdiv(amax, 127.f), id = amax != 0.0f ? fdiv(127.f, amax) : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
      const int v = (int)rint(xp[j] * id);
      qp[j] = (char)v;
      sum += v;
    }
    sp[0] = (float2)(round_f16(d), mode == 1 ? round_f16(d * (float)sum) : 0.0f);
    return;
  }
  float amax = 0, mx = 0;
  for (int j = 0; j < 256; j++)
    if (amax < fabs(xp[j])) amax = fabs(xp[j]), mx = xp[j];
  if (amax == 0.0f) {
    for (int j = 0; j < 256; j++) qp[j] = 0;
    for (int u = 0; u < 8; u++) sp[u] = (float2)(0.0f, 0.0f);
    return;
  }
  const float iscale = fdiv(-127.f, mx), d = fdiv(1.0f, iscale);
  for (int u = 0; u < 8; u++) {
    int sum = 0;
    for (int l = 0; l < 32; l++) {
      const int v = min((int)rint(iscale * xp[32 * u + l]), 127);
      qp[32 * u + l] = (char)v;
      sum += v;
    }
    sp[u] = (float2)(d, (float)sum); // the unit's integer sum: msum is m * it
  }
}

// x (n) rounded in place to the precision of a float weight type's activations
// (mode 1: f16, 2: bf16), as the CPU converts them before its F16/BF16 dots.
kernel void act_round(global float *x, int n, int mode) {
  const int i = get_global_id(0);
  if (i >= n) return;
  x[i] = mode == 1 ? round_f16(x[i]) : round_bf16(x[i]);
}

// ---------------------------------------------------------------- products
// out (T, N) = x (T, K) · W (N, K)ᵀ  [+= when acc]. One work-group (WG) per weight row and tile
// of TT tokens: global (WG, N, ceil(T / TT)). Work items take units u = lid, lid + WG, ...
// (unpacking each once for the TT tokens) and leave each unit's terms in local memory; then
// work item tt adds token tt's terms in unit order, in the CPU reference's expression (see
// kernels/cpu/dot.c), a chunk of CH units at a time.
#define CH 256

#define MM_UNITS(NAME, STORE)                                                                                   \
  for (int u = u0 + lid; u < u1; u += WG) {                                                                     \
    int q[32];                                                                                                  \
    float a, b;                                                                                                 \
    unpack_##NAME(row, u, q, &a, &b);                                                                           \
    for (int tt = 0; tt < TT; tt++) {                                                                           \
      if (tt >= nt) break;                                                                                      \
      global const char *xp = xq + (size_t)(t0 + tt) * K + (size_t)u * 32;                                     \
      const char16 x0 = vload16(0, xp), x1 = vload16(1, xp);                                                    \
      int si = 0;                                                                                               \
      si += q[0] * x0.s0 + q[1] * x0.s1 + q[2] * x0.s2 + q[3] * x0.s3 + q[4] * x0.s4 + q[5] * x0.s5;            \
      si += q[6] * x0.s6 + q[7] * x0.s7 + q[8] * x0.s8 + q[9] * x0.s9 + q[10] * x0.sa + q[11] * x0.sb;          \
      si += q[12] * x0.sc + q[13] * x0.sd + q[14] * x0.se + q[15] * x0.sf;                                      \
      si += q[16] * x1.s0 + q[17] * x1.s1 + q[18] * x1.s2 + q[19] * x1.s3 + q[20] * x1.s4 + q[21] * x1.s5;      \
      si += q[22] * x1.s6 + q[23] * x1.s7 + q[24] * x1.s8 + q[25] * x1.s9 + q[26] * x1.sa + q[27] * x1.sb;      \
      si += q[28] * x1.sc + q[29] * x1.sd + q[30] * x1.se + q[31] * x1.sf;                                      \
      const float2 xs_ = xs[(size_t)(t0 + tt) * nu + u];                                                        \
      const int li = tt * CH + (u - u0);                                                                        \
      STORE;                                                                                                    \
    }                                                                                                           \
  }

#define MM_KERNEL(NAME, STORE, COMBINE)                                                                         \
  kernel void mm_##NAME(global const uchar *W, ulong rb, global const char *xq, global const float2 *xs,       \
                        global float *out, int K, int N, int T, int acc) {                                      \
    local float la[TT * CH], lb[TT * CH];                                                                       \
    const int lid = get_local_id(0), n = get_group_id(1), t0 = get_group_id(2) * TT;                            \
    const int nu = K / 32, nt = min(TT, T - t0);                                                                \
    global const uchar *row = W + (size_t)n * rb;                                                               \
    float sum = 0;                                                                                              \
    for (int u0 = 0; u0 < nu; u0 += CH) {                                                                       \
      const int u1 = min(nu, u0 + CH);                                                                          \
      MM_UNITS(NAME, STORE)                                                                                     \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
      if (lid < nt) {                                                                                           \
        const int tt = lid;                                                                                     \
        COMBINE;                                                                                                \
      }                                                                                                         \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
    }                                                                                                           \
    if (lid < nt) {                                                                                             \
      global float *o = out + (size_t)(t0 + lid) * N + n;                                                       \
      *o = acc ? *o + sum : sum;                                                                                \
    }                                                                                                           \
  }

// Q4_0: sum = fma(si, d_w * d_x, sum), block by block
MM_KERNEL(q4_0, (la[li] = (float)si, lb[li] = a * xs_.x),
          for (int u = 0; u < u1 - u0; u++) sum = fma(la[tt * CH + u], lb[tt * CH + u], sum))
// Q4_1, Q5_1: sum += (d_w * d_x) * si + m_w * s_x
MM_KERNEL(q5_1, la[li] = (a * xs_.x) * (float)si + b * xs_.y, for (int u = 0; u < u1 - u0; u++) sum += la[tt * CH + u])
// Q5_0: sum += si * d_w * d_x
MM_KERNEL(q5_0, la[li] = ((float)si * a) * xs_.x, for (int u = 0; u < u1 - u0; u++) sum += la[tt * CH + u])

// Q4_1 and Q8_0 in llama.cpp's x86 order, which the CPU backend's AVX2 / AVX-512 kernels
// reproduce (dot_avx2.c): eight lanes, lane m the integer sum of elements 4m..4m+3 of each
// block, acc[m] = fma(d_w * d_x, lane_m, acc[m]) block by block, then ggml's 8-lane tree, plus
// (Q4_1) Σ m_w * s_x added block by block. Work item (token tt, lane m) = lid carries one
// lane through the blocks.
#define CH8 64
#define MM8_KERNEL(NAME, HAS_M)                                                                                 \
  kernel void mm_##NAME(global const uchar *W, ulong rb, global const char *xq, global const float2 *xs,       \
                        global float *out, int K, int N, int T, int acc) {                                      \
    local float lv[TT * 8 * CH8], ld[TT * CH8], lm[TT * CH8], red[TT * 8], rs[TT];                              \
    const int lid = get_local_id(0), n = get_group_id(1), t0 = get_group_id(2) * TT;                            \
    const int nu = K / 32, nt = min(TT, T - t0), my_t = lid >> 3, my_m = lid & 7;                                \
    global const uchar *row = W + (size_t)n * rb;                                                               \
    float lacc = 0, summs = 0;                                                                                  \
    for (int u0 = 0; u0 < nu; u0 += CH8) {                                                                      \
      const int u1 = min(nu, u0 + CH8);                                                                         \
      for (int u = u0 + lid; u < u1; u += WG) {                                                                 \
        int q[32];                                                                                              \
        float a, b;                                                                                             \
        unpack_##NAME(row, u, q, &a, &b);                                                                       \
        for (int tt = 0; tt < TT; tt++) {                                                                       \
          if (tt >= nt) break;                                                                                  \
          global const char *xp = xq + (size_t)(t0 + tt) * K + (size_t)u * 32;                                 \
          const float2 xs_ = xs[(size_t)(t0 + tt) * nu + u];                                                    \
          for (int m = 0; m < 8; m++) {                                                                         \
            const int e = 4 * m;                                                                                \
            const int ls = q[e] * xp[e] + q[e + 1] * xp[e + 1] + q[e + 2] * xp[e + 2] + q[e + 3] * xp[e + 3];   \
            lv[(tt * 8 + m) * CH8 + (u - u0)] = (float)ls;                                                      \
          }                                                                                                     \
          ld[tt * CH8 + (u - u0)] = a * xs_.x;                                                                  \
          lm[tt * CH8 + (u - u0)] = HAS_M ? b * xs_.y : 0.0f;                                                   \
        }                                                                                                       \
      }                                                                                                         \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
      if (my_t < nt)                                                                                            \
        for (int u = 0; u < u1 - u0; u++) {                                                                     \
          if (HAS_M && my_m == 0) summs += lm[my_t * CH8 + u];                                                  \
          lacc = fma(ld[my_t * CH8 + u], lv[lid * CH8 + u], lacc);                                              \
        }                                                                                                       \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                             \
    }                                                                                                           \
    red[lid] = lacc;                                                                                            \
    if (my_m == 0) rs[my_t] = summs;                                                                            \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                               \
    if (lid < nt) {                                                                                             \
      float l[8];                                                                                               \
      for (int m = 0; m < 8; m++) l[m] = red[lid * 8 + m];                                                      \
      const float r = HAS_M ? tree8(l) + rs[lid] : tree8(l);                                                    \
      global float *o = out + (size_t)(t0 + lid) * N + n;                                                      \
      *o = acc ? *o + r : r;                                                                                    \
    }                                                                                                           \
  }
MM8_KERNEL(q4_1, 1)
MM8_KERNEL(q8_0, 0)
// Q4_K, Q5_K: per super-block isum = Σ sc·s, msum = Σ m·bsum (exact integers), then
// sum += d_x * (d * isum - dmin * msum)
#define K_COMBINE(BS)                                                                                           \
  for (int u = 0; u < u1 - u0; u += 8) {                                                                        \
    int isum = 0, msum = 0;                                                                                     \
    for (int j = 0; j < 8; j++) isum += as_int(la[tt * CH + u + j]), msum += as_int(lb[tt * CH + u + j]);      \
    global const uchar *blk = row + ((u0 + u) >> 3) * BS;                                                       \
    const float dx = xs[(size_t)(t0 + tt) * nu + u0 + u].x;                                                     \
    sum += dx * (ldh(blk) * (float)isum - ldh(blk + 2) * (float)msum);                                          \
  }
MM_KERNEL(q4_K, (la[li] = as_float(si), lb[li] = as_float(as_int(b) * (int)xs_.y)), K_COMBINE(144))
MM_KERNEL(q5_K, (la[li] = as_float(si), lb[li] = as_float(as_int(b) * (int)xs_.y)), K_COMBINE(176))
// Q6_K: isum = Σ sc·q·x per super-block, sum += d * d_x * isum
MM_KERNEL(q6_K, la[li] = as_float(si), for (int u = 0; u < u1 - u0; u += 8) {
  int isum = 0;
  for (int j = 0; j < 8; j++) isum += as_int(la[tt * CH + u + j]);
  const float dx = xs[(size_t)(t0 + tt) * nu + u0 + u].x;
  sum += ldh(row + ((u0 + u) >> 3) * 210 + 208) * dx * (float)isum;
})

// Float weights (f32, f16, bf16): a tree reduction in f32, not the CPU's order (its
// reference sums in f64; float weights are not quantized, so there is no step to amplify
// the difference).
inline void mm_reduce(local float *red, float *s, int lid, int nt, global float *out, int N, int n, int t0, int acc) {
  for (int tt = 0; tt < TT; tt++) red[tt * WG + lid] = s[tt];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int st = WG / 2; st > 0; st >>= 1) {
    if (lid < st)
      for (int tt = 0; tt < TT; tt++) red[tt * WG + lid] += red[tt * WG + lid + st];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid < nt) {
    global float *o = out + (size_t)(t0 + lid) * N + n;
    *o = acc ? *o + red[lid * WG] : red[lid * WG];
  }
}

// Float weights: wt 0 = f32, 1 = f16, 2 = bf16; x already rounded (act_round).
inline float ldw(global const uchar *row, int i, int wt) {
  if (wt == 0) return ((global const float *)row)[i];
  if (wt == 1) return vload_half(i, (global const half *)row);
  return as_float((uint)((global const ushort *)row)[i] << 16);
}
kernel void mm_f(global const uchar *W, ulong rb, global const float *x, global float *out, int K, int N, int T, int acc, int wt) {
  local float red[WG * TT];
  const int lid = get_local_id(0), n = get_group_id(1), t0 = get_group_id(2) * TT;
  const int nt = min(TT, T - t0);
  global const uchar *row = W + (size_t)n * rb;
  float s[TT];
  for (int tt = 0; tt < TT; tt++) s[tt] = 0;
  for (int i = lid; i < K; i += WG) {
    const float w = ldw(row, i, wt);
    for (int tt = 0; tt < TT; tt++) {
      if (tt >= nt) break;
      s[tt] = fma(w, x[(size_t)(t0 + tt) * K + i], s[tt]);
    }
  }
  mm_reduce(red, s, lid, nt, out, N, n, t0, acc);
}

// ---------------------------------------------------------------- embedding lookup
// out (T, K) = dequantized rows ids[t] of W (wt: enum ll_type); one work item per (token, unit).
kernel void get_rows_q(global const uchar *W, ulong rb, global const int *ids, global float *out, int K, int T, int wt) {
  const int i = get_global_id(0), nu = K / 32;
  if (i >= nu * T) return;
  const int t = i / nu, u = i % nu;
  deq_unit(wt, W + (size_t)ids[t] * rb, u, out + (size_t)t * K + (size_t)u * 32);
}

kernel void get_rows_f(global const uchar *W, ulong rb, global const int *ids, global float *out, int K, int T, int wt) {
  const int i = get_global_id(0);
  if (i >= K * T) return;
  const int t = i / K, k = i % K;
  out[i] = ldw(W + (size_t)ids[t] * rb, k, wt);
}

// ---------------------------------------------------------------- element-wise and norms

// out (T, C) = x / rms(x) * g; one work-group per row. The sum of squares as the CPU makes it
// (f64, element by element, in order: one work item) where the device has f64.
kernel void rmsnorm(global float *out, global const float *x, global const float *g, int C, float eps) {
  local float scale_l;
  const int t = get_group_id(0), lid = get_local_id(0);
  global const float *xr = x + (size_t)t * C;
  if (lid == 0) {
#ifdef LL_FP64
    double sum = 0;
    for (int i = 0; i < C; i++) sum += (double)(xr[i] * xr[i]);
    const float mean = (float)(sum / C);
#else
    float sum = 0;
    for (int i = 0; i < C; i++) sum += xr[i] * xr[i];
    const float mean = sum / (float)C;
#endif
    scale_l = fdiv(1.0f, fsqrt(mean + eps));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const float scale = scale_l;
  global float *o = out + (size_t)t * C;
  for (int i = lid; i < C; i += WG) o[i] = (xr[i] * scale) * g[i];
}

// x (T, H, hd) rotated in place with the host's cos/sin tables cs, sn (T, n_pairs); one work
// item per (token, head, pair). fused: llama.cpp's fused form (ll_rope_pairs_impl).
kernel void rope(global float *x, global const float *cs, global const float *sn, int T, int H, int hd, int np, int neox,
                 int fused) {
  const int i = get_global_id(0);
  if (i >= T * H * np) return;
  const int p = i % np, h = (i / np) % H, t = i / (np * H);
  global float *v = x + ((size_t)t * H + h) * hd;
  const int a = neox ? p : 2 * p, c2 = neox ? p + np : 2 * p + 1;
  const float x0 = v[a], x1 = v[c2], c = cs[(size_t)t * np + p], s = sn[(size_t)t * np + p];
  if (fused && !(!neox && (np & 1) && p == np - 1)) {
    v[a] = fma(x0, c, -(x1 * s));
    v[c2] = fma(x0, s, x1 * c);
  } else {
    v[a] = x0 * c - x1 * s;
    v[c2] = x0 * s + x1 * c;
  }
}

kernel void swiglu(global float *out, global const float *g, global const float *u, long n, int ggml) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float gv = g[i];
  const float e = ggml && i < n - n % 8 ? ggml_expf(0.0f - gv) : exp(-gv);
  out[i] = fdiv(gv, 1.0f + e) * u[i];
}

// out = gelu_tanh(gate) * up (GeGLU; kernels/cpu/backend_cpu.c cpu_geglu): with ggml math,
// gelu at f16(x) rounded to f16 as ggml's table holds it, 0 below -10, x above 10.
inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanh(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x))); }
kernel void geglu(global float *out, global const float *gate, global const float *up, long n, int ggml) {
  const long i = get_global_id(0);
  if (i >= n) return;
  const float x = gate[i];
  if (!ggml) out[i] = gelu_tanh(x) * up[i];
  else out[i] = x <= -10.0f ? 0.0f : x >= 10.0f ? x * up[i] : round_f16(gelu_tanh(round_f16(x))) * up[i];
}

kernel void add(global float *out, global const float *a, global const float *b, long n) {
  const long i = get_global_id(0);
  if (i < n) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------- KV cache and attention
// Pool layout per layer: (blocks, block, Hkv, hd) in f16 (f16 = 1) or f32.
// tab: the block tables of the batch's sequences, concatenated; seq_of[t] the sequence of
// row t, tab_off[s] where sequence s's table starts.

kernel void kv_store(global uchar *K, global uchar *V, global const float *k, global const float *v, global const int *pos,
                     global const int *tab, int T, int block, int Hkv, int hd, int f16) {
  const int i = get_global_id(0), n = Hkv * hd;
  if (i >= T * n) return;
  const int t = i / n, e = i % n, p = pos[t];
  const size_t off = ((size_t)tab[p / block] * block + p % block) * n + e;
  if (f16) {
    vstore_half_rte(k[i], off, (global half *)K);
    vstore_half_rte(v[i], off, (global half *)V);
  } else {
    ((global float *)K)[off] = k[i];
    ((global float *)V)[off] = v[i];
  }
}

inline float kv_ld(global const uchar *P, size_t off, int f16) {
  return f16 ? vload_half(off, (global const half *)P) : ((global const float *)P)[off];
}

// One work-group per (row t, head h): scores over positions 0..pos[t] into sc (scratch of
// `stride` floats per (t, h)), softmax, weighted sum of V, each in the CPU's order
// (kernels/cpu/backend_cpu.c attn_task with dot.c's f16 lanes): with an f16 cache q and the
// probabilities are rounded to f16; a sequence with >= 2 rows in the call (a prompt chunk,
// ggml math, hd % 8 == 0) uses the 8-lane order, a single token the 32-lane one.
#ifdef LL_FP64
typedef double acc_t;
#else
typedef float acc_t;
#endif
// 1 / a softmax's denominator, as float: divided in double where the device has it, as the
// CPU does (attention here and in train.cl, the cross-entropy in train.cl).
inline float inv_sum(acc_t sum) {
#ifdef LL_FP64
  return (float)(1.0 / sum);
#else
  return 1.0f / sum;
#endif
}
inline float tree32(const float *lane) {
  float x[8];
  for (int e = 0; e < 8; e++) x[e] = (lane[e] + lane[16 + e]) + (lane[8 + e] + lane[24 + e]);
  return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}
kernel void attention(global float *out, global const float *q, global const uchar *K, global const uchar *V,
                      global const int *pos, global const int *tab, global const int *seq_of, global const int *tab_off,
                      global const int *seq_nt, global float *scratch, int H, int Hkv, int hd, int block, int f16, float scale,
                      int stride, int ggml, int window) {
  local float qv[256];
  local float inv_l;
  const int t = get_group_id(0) / H, h = get_group_id(0) % H, lid = get_local_id(0);
  // Sliding window: positions (pos - window, pos]; score i (sc[i]) is position lo + i, and the
  // lanes count from lo as the CPU's do.
  const int lo = window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0;
  const int kvh = h / (H / Hkv), n_pos = pos[t] + 1 - lo, n = Hkv * hd;
  const int prompt = ggml && seq_nt[seq_of[t]] >= 2 && hd % 8 == 0;
  global const int *tb = tab + tab_off[seq_of[t]];
  global float *sc = scratch + (size_t)get_group_id(0) * stride;
  global const float *qp = q + ((size_t)t * H + h) * hd;
  for (int i = lid; i < hd; i += WG) qv[i] = f16 ? round_f16(qp[i]) : qp[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int p = lid; p < n_pos; p += WG) {
    const size_t base = ((size_t)tb[(lo + p) / block] * block + (lo + p) % block) * n + (size_t)kvh * hd;
    float s;
    if (f16 && prompt) {
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < hd; i += 8)
        for (int e = 0; e < 8; e++) l[e] = fma(qv[i + e], kv_ld(K, base + i + e, 1), l[e]);
      s = tree8(l);
    } else if (f16) {
      float lane[32];
      for (int j = 0; j < 32; j++) lane[j] = 0;
      const int np = hd - hd % 32;
      for (int i = 0; i < np; i += 32)
        for (int j = 0; j < 32; j++) lane[j] = fma(qv[i + j], kv_ld(K, base + i + j, 1), lane[j]);
      acc_t sum = tree32(lane);
      for (int i = np; i < hd; i++) sum += (acc_t)(qv[i] * kv_ld(K, base + i, 1));
      s = (float)sum;
    } else {
      s = 0;
      for (int i = 0; i < hd; i++) s += qv[i] * kv_ld(K, base + i, 0);
    }
    sc[p] = s * scale;
  }
  barrier(CLK_GLOBAL_MEM_FENCE);
  if (lid == 0) { // softmax in the CPU's order (ggml's groups of 8 with an f64 sum)
    float mx = -INFINITY;
    for (int p = 0; p < n_pos; p++)
      if (sc[p] > mx) mx = sc[p];
    acc_t sum = 0;
    if (ggml) {
      for (int i = 0; i < n_pos; i += 8) {
        float v[8];
        for (int l = 0; l < 8; l++) v[l] = i + l < n_pos ? ggml_expf(sc[i + l] - mx) : 0.0f;
        for (int l = 0; l < 8 && i + l < n_pos; l++) sc[i + l] = v[l];
        const float a0 = v[4] + v[0], a1 = v[5] + v[1], a2 = v[6] + v[2], a3 = v[7] + v[3];
        sum += (acc_t)((a0 + a2) + (a1 + a3));
      }
    } else {
      for (int p = 0; p < n_pos; p++) {
        sc[p] = exp(sc[p] - mx);
        sum += sc[p];
      }
    }
    const float inv = inv_sum(sum);
    if (f16)
      for (int p = 0; p < n_pos; p++) sc[p] = round_f16(sc[p] * inv);
    inv_l = inv;
  }
  barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  const float inv = inv_l;
  global float *o = out + ((size_t)t * H + h) * hd;
  for (int i = lid; i < hd; i += WG) {
    const size_t off = (size_t)kvh * hd + i;
    if (f16 && prompt) {
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int p = 0; p < n_pos; p++) {
        const size_t base = ((size_t)tb[(lo + p) / block] * block + (lo + p) % block) * n;
        l[p % 8] = fma(kv_ld(V, base + off, 1), sc[p], l[p % 8]);
      }
      o[i] = tree8(l);
    } else if (f16) {
      float lane[32];
      for (int j = 0; j < 32; j++) lane[j] = 0;
      for (int p = 0; p < n_pos; p++) {
        const size_t base = ((size_t)tb[(lo + p) / block] * block + (lo + p) % block) * n;
        lane[p % 32] = fma(sc[p], kv_ld(V, base + off, 1), lane[p % 32]);
      }
      o[i] = tree32(lane);
    } else {
      float acc = 0;
      for (int p = 0; p < n_pos; p++) {
        const size_t base = ((size_t)tb[(lo + p) / block] * block + (lo + p) % block) * n;
        acc += (sc[p] * inv) * kv_ld(V, base + off, 0);
      }
      o[i] = acc;
    }
  }
}
