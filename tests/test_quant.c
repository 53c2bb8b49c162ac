// test_quant.c - block layouts and scalar (de)quantizers against independent formulas.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ll_error.h"
#include "ll_quant.h"
#include "testutil.h"

// Independent fp16 decode (direct formula, not bit tricks).
static double half_value(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

static void test_fp16(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ll_fp16_to_fp32((uint16_t)h);
    double want = half_value((uint16_t)h);
    if (isnan(want)) {
      bad += !isnan(f) || !isnan(ll_fp16_to_fp32(ll_fp32_to_fp16(f)));
      continue;
    }
    bad += (double)f != want;
    bad += ll_fp32_to_fp16(f) != (uint16_t)h; // exact round trip
  }
  CHECKF(bad == 0, "%d fp16 mismatches", bad);
  // Rounding: ties to even, overflow, subnormals.
  CHECK(ll_fp32_to_fp16(1.0f + 0x1p-11f) == 0x3C00);              // tie -> even (down)
  CHECK(ll_fp32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3C02);          // tie -> even (up)
  CHECK(ll_fp32_to_fp16(65504.0f) == 0x7BFF);
  CHECK(ll_fp32_to_fp16(65519.0f) == 0x7BFF);
  CHECK(ll_fp32_to_fp16(65520.0f) == 0x7C00);                     // rounds to inf
  CHECK(ll_fp32_to_fp16(0x1p-24f) == 0x0001);                     // smallest subnormal
  CHECK(ll_fp32_to_fp16(0x1p-25f) == 0x0000);                     // tie -> even (zero)
  CHECK(ll_fp32_to_fp16(-0.0f) == 0x8000);
  // bf16: round to nearest even on the upper 16 bits; NaN stays NaN.
  CHECK(ll_fp32_to_bf16(1.0f) == 0x3F80 && ll_bf16_to_fp32(0x3F80) == 1.0f);
  uint32_t u = 0x3F808000; // exactly halfway between 0x3F80 and 0x3F81 -> even (0x3F80)
  float f;
  memcpy(&f, &u, 4);
  CHECK(ll_fp32_to_bf16(f) == 0x3F80);
  u = 0x3F818000;
  memcpy(&f, &u, 4);
  CHECK(ll_fp32_to_bf16(f) == 0x3F82);
  CHECK(isnan(ll_bf16_to_fp32(ll_fp32_to_bf16(NAN))));
}

static void test_traits(void) {
  CHECK(ll_row_size(LL_TYPE_Q4_0, 64) == 36);
  CHECK(ll_row_size(LL_TYPE_Q6_K, 256) == 210);
  CHECK(ll_row_size(LL_TYPE_Q4_0, 33) == 0);   // not a multiple of the block
  CHECK(ll_row_size(LL_TYPE_F32, 0) == 0);
  CHECK(ll_row_size(99, 32) == 0);
  CHECK(ll_row_size(LL_TYPE_F32, INT64_MAX) == 0); // overflow
  CHECK(ll_type_from_name("Q4_K") == LL_TYPE_Q4_K && ll_type_from_name("nope") == -1);
  CHECK(strcmp(ll_type_name(LL_TYPE_BF16), "bf16") == 0);
}

// ll_tensor_find_nonfinite: each float type's NaN and Inf, each block type's scale fields
// (offsets written out here from ggml's layouts), nothing else of a block.
static void test_nonfinite(void) {
  float f[8] = {0, 1, -2, 3e38f, -3e38f, 1e-45f, 0, 5};
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F32, f, sizeof f) == -1);
  f[6] = NAN;
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F32, f, sizeof f) == 6);
  f[6] = 0, f[2] = -INFINITY;
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F32, f, sizeof f) == 2);
  static float big[10000]; // past the first 4096-value chunk of the dense scan
  big[9001] = INFINITY;
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F32, big, sizeof big) == 9001);
  static uint16_t bigh[10000];
  bigh[4096] = 0x7E00;
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F16, bigh, sizeof bigh) == 4096);
  uint16_t h[4] = {0x3C00, 0x7BFF, 0xFBFF, 0x0001}; // 1, +-65504, the smallest subnormal
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F16, h, sizeof h) == -1);
  h[3] = 0xFC00; // -inf
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F16, h, sizeof h) == 3);
  uint16_t b[3] = {0x3F80, 0x7F7F, 0x0001};
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_BF16, b, sizeof b) == -1);
  b[1] = 0x7FC0; // NaN
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_BF16, b, sizeof b) == 1);
  // Per block type: the byte offsets of its f16 scales; a 0xFF-filled quant body is no NaN.
  static const struct { int type; int n_off; size_t off[2]; } bt[] = {
      {LL_TYPE_Q4_0, 1, {0}},  {LL_TYPE_Q4_1, 2, {0, 2}},  {LL_TYPE_Q5_0, 1, {0}},   {LL_TYPE_Q5_1, 2, {0, 2}},
      {LL_TYPE_Q8_0, 1, {0}},  {LL_TYPE_Q4_K, 2, {0, 2}},  {LL_TYPE_Q5_K, 2, {0, 2}}, {LL_TYPE_Q6_K, 1, {208}},
      {LL_TYPE_Q2_K, 2, {80, 82}}, {LL_TYPE_Q3_K, 1, {108}},
  };
  for (size_t t = 0; t < sizeof bt / sizeof bt[0]; t++) {
    const struct ll_type_traits *tt = ll_type_traits_get(bt[t].type);
    const size_t bs = tt->type_size;
    uint8_t *blk = malloc(3 * bs);
    CHECK(blk != NULL);
    if (!blk) continue;
    for (int k = 0; k < bt[t].n_off; k++) {
      memset(blk, 0xFF, 3 * bs);
      for (int j = 0; j < 3; j++)
        for (int m = 0; m < bt[t].n_off; m++) blk[j * bs + bt[t].off[m]] = 0x00, blk[j * bs + bt[t].off[m] + 1] = 0x3C; // 1.0
      CHECKF(ll_tensor_find_nonfinite(bt[t].type, blk, 3 * bs) == -1, "%s: finite scales", tt->name);
      blk[2 * bs + bt[t].off[k]] = 0x00, blk[2 * bs + bt[t].off[k] + 1] = 0x7E; // NaN in block 2's scale k
      CHECKF(ll_tensor_find_nonfinite(bt[t].type, blk, 3 * bs) == 2 * tt->blck_size, "%s: NaN in scale %d of block 2", tt->name, k);
    }
    free(blk);
  }
  int32_t ints[2] = {-1, 0x7FFFFFFF}; // integers hold no NaN
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_I32, ints, sizeof ints) == -1);
  CHECK(ll_tensor_find_nonfinite(LL_TYPE_F32, NULL, 16) == -1);
}

// Hand-built blocks decoded with the layout written out here, element by element.
static void test_dequant_layouts(uint64_t *rs) {
  unsigned char raw[512];
  float out[256];
  for (int trial = 0; trial < 50; trial++) {
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (unsigned char)ll_test_rand(rs);
    const uint16_t dh = 0x3800 | (uint16_t)(ll_test_rand(rs) & 0x3FF), mh = 0xB400 | (uint16_t)(ll_test_rand(rs) & 0x3FF);
    const double d = half_value(dh), m = half_value(mh);
    int bad = 0;
    // q4_0: d, 16 bytes; element j: low nibble (j<16) or high nibble of byte j-16, minus 8.
    memcpy(raw, &dh, 2);
    ll_dequantize_row(LL_TYPE_Q4_0, raw, out, 32);
    for (int j = 0; j < 32; j++) {
      int q = j < 16 ? (raw[2 + j] & 15) : (raw[2 + j - 16] >> 4);
      bad += fabs(out[j] - (q - 8) * d) > 1e-6;
    }
    // q4_1: d, m, 16 bytes; x = q*d + m.
    memcpy(raw, &dh, 2), memcpy(raw + 2, &mh, 2);
    ll_dequantize_row(LL_TYPE_Q4_1, raw, out, 32);
    for (int j = 0; j < 32; j++) {
      int q = j < 16 ? (raw[4 + j] & 15) : (raw[4 + j - 16] >> 4);
      bad += fabs(out[j] - (q * d + m)) > 1e-5;
    }
    // q5_0: d, qh (32 bits: bit j = 5th bit of element j), 16 bytes; minus 16.
    memcpy(raw, &dh, 2);
    ll_dequantize_row(LL_TYPE_Q5_0, raw, out, 32);
    for (int j = 0; j < 32; j++) {
      uint32_t qh = (uint32_t)raw[2] | (uint32_t)raw[3] << 8 | (uint32_t)raw[4] << 16 | (uint32_t)raw[5] << 24;
      int q = (j < 16 ? (raw[6 + j] & 15) : (raw[6 + j - 16] >> 4)) | (int)((qh >> j) & 1) << 4;
      bad += fabs(out[j] - (q - 16) * d) > 1e-6;
    }
    // q5_1: d, m, qh, 16 bytes.
    memcpy(raw, &dh, 2), memcpy(raw + 2, &mh, 2);
    ll_dequantize_row(LL_TYPE_Q5_1, raw, out, 32);
    for (int j = 0; j < 32; j++) {
      uint32_t qh = (uint32_t)raw[4] | (uint32_t)raw[5] << 8 | (uint32_t)raw[6] << 16 | (uint32_t)raw[7] << 24;
      int q = (j < 16 ? (raw[8 + j] & 15) : (raw[8 + j - 16] >> 4)) | (int)((qh >> j) & 1) << 4;
      bad += fabs(out[j] - (q * d + m)) > 1e-5;
    }
    // q8_0: d, 32 signed bytes.
    memcpy(raw, &dh, 2);
    ll_dequantize_row(LL_TYPE_Q8_0, raw, out, 32);
    for (int j = 0; j < 32; j++) bad += fabs(out[j] - (int8_t)raw[2 + j] * d) > 1e-6;
    // q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes; 8 sub-blocks of 32.
    memcpy(raw, &dh, 2), memcpy(raw + 2, &mh, 2);
    ll_dequantize_row(LL_TYPE_Q4_K, raw, out, 256);
    for (int j = 0; j < 256; j++) {
      int sb = j / 32, sc, mn;
      const unsigned char *s = raw + 4;
      if (sb < 4) sc = s[sb] & 63, mn = s[sb + 4] & 63;
      else sc = (s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4), mn = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
      int chunk = j / 64, l = j % 32, hi = (j / 32) % 2;
      int q = hi ? raw[16 + chunk * 32 + l] >> 4 : raw[16 + chunk * 32 + l] & 15;
      bad += fabs(out[j] - (d * sc * q - m * mn)) > 1e-4 * (1 + fabs(out[j]));
    }
    // q5_K: as q4_K plus qh[32]: bit (2*chunk + hi) of qh[l] is the 5th bit.
    memcpy(raw, &dh, 2), memcpy(raw + 2, &mh, 2);
    ll_dequantize_row(LL_TYPE_Q5_K, raw, out, 256);
    for (int j = 0; j < 256; j++) {
      int sb = j / 32, sc, mn;
      const unsigned char *s = raw + 4;
      if (sb < 4) sc = s[sb] & 63, mn = s[sb + 4] & 63;
      else sc = (s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4), mn = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
      int chunk = j / 64, l = j % 32, hi = (j / 32) % 2;
      int q = hi ? raw[48 + chunk * 32 + l] >> 4 : raw[48 + chunk * 32 + l] & 15;
      q += ((raw[16 + l] >> (2 * chunk + hi)) & 1) << 4;
      bad += fabs(out[j] - (d * sc * q - m * mn)) > 1e-4 * (1 + fabs(out[j]));
    }
    // q6_K: ql[128], qh[64], int8 scales[16], d; 2 halves of 128, 4 quarters of 32 each.
    memcpy(raw + 208, &dh, 2);
    ll_dequantize_row(LL_TYPE_Q6_K, raw, out, 256);
    for (int j = 0; j < 256; j++) {
      int half = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
      const unsigned char *ql = raw + 64 * half, *qh = raw + 128 + 32 * half;
      const int8_t *sc = (const int8_t *)(raw + 192 + 8 * half);
      int lo = quarter == 0 ? ql[l] & 15 : quarter == 1 ? ql[l + 32] & 15 : quarter == 2 ? ql[l] >> 4 : ql[l + 32] >> 4;
      int h2 = (qh[l] >> (2 * quarter)) & 3;
      int q = (lo | h2 << 4) - 32;
      bad += fabs(out[j] - d * sc[l / 16 + 2 * quarter] * q) > 1e-4 * (1 + fabs(out[j]));
    }
    CHECKF(bad == 0, "trial %d: %d dequantized elements differ from the layout formulas", trial, bad);
  }
  CHECK(ll_dequantize_row(LL_TYPE_Q8_1, raw, out, 32) == LL_EUNSUPPORTED); // activation type
  CHECK(ll_dequantize_row(LL_TYPE_Q4_0, raw, out, 31) == LL_EINVAL);
}

// Quantize -> dequantize error bounds. For a block with scale d (and min m), every element is
// within d/2 of its original, plus the rounding of d and m to fp16 (relative 2^-11) times the
// largest magnitude in the block: |x - x'| <= d/2 + 2^-10 * max|x| (stated bound).
static void test_round_trip(uint64_t *rs) {
  const int types[] = {LL_TYPE_Q8_0, LL_TYPE_Q4_0, LL_TYPE_Q4_1, LL_TYPE_Q5_0, LL_TYPE_Q5_1};
  const int levels[] = {127, 8, 15, 16, 31};
  float x[4096], y[4096];
  unsigned char q[8192];
  for (int t = 0; t < 5; t++) {
    int bad = 0;
    for (int trial = 0; trial < 20; trial++) {
      float scale = 0.01f + 10.0f * (ll_test_randf(rs) + 1.0f);
      for (int i = 0; i < 4096; i++) x[i] = scale * ll_test_randf(rs) + (t == 2 || t == 4 ? scale : 0);
      CHECK(ll_quantize_row(types[t], x, q, 4096) == 0);
      CHECK(ll_dequantize_row(types[t], q, y, 4096) == 0);
      for (int b = 0; b < 4096 / 32; b++) {
        float mx = 0, mn = INFINITY, amax = 0;
        for (int j = 0; j < 32; j++) {
          mx = fmaxf(mx, x[b * 32 + j]), mn = fminf(mn, x[b * 32 + j]), amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        }
        float d = (t == 2 || t == 4) ? (mx - mn) / levels[t] : amax / levels[t];
        // q4_0/q5_0 map the signed max to -8/-16: the step is amax/8 (16) but the positive side
        // reaches only 7/8 (15/16) of it, so the worst case there is one full step.
        float bound = ((t == 1 || t == 3) ? d : d / 2) + 0x1p-10f * amax + 1e-6f;
        for (int j = 0; j < 32; j++) bad += fabsf(y[b * 32 + j] - x[b * 32 + j]) > bound;
      }
    }
    CHECKF(bad == 0, "%s: %d elements outside the stated bound", ll_type_name(types[t]), bad);
  }
  // q8_1: s = d * sum(qs); q8_K: bsums are sums of 16.
  for (int i = 0; i < 256; i++) x[i] = ll_test_randf(rs);
  ll_block_q8_1 b1;
  ll_quantize_row(LL_TYPE_Q8_1, x, &b1, 32);
  int sum = 0;
  for (int j = 0; j < 32; j++) sum += b1.qs[j];
  CHECK(fabsf(ll_fp16_to_fp32(b1.s) - sum * ll_fp16_to_fp32(b1.d)) <= 1e-3f * (1 + fabsf(sum * ll_fp16_to_fp32(b1.d))));
  ll_block_q8_K bk;
  ll_quantize_row(LL_TYPE_Q8_K, x, &bk, 256);
  int okb = 1;
  for (int g = 0; g < 16; g++) {
    int s2 = 0;
    for (int j = 0; j < 16; j++) s2 += bk.qs[g * 16 + j];
    okb &= s2 == bk.bsums[g];
  }
  CHECK(okb);
  for (int j = 0; j < 256; j++) okb &= fabsf(bk.qs[j] * bk.d - x[j]) <= fabsf(bk.d) * 0.5f + 1e-6f;
  CHECK(okb);
}

int main(void) {
  uint64_t rs = ll_test_seed();
  test_fp16();
  test_traits();
  test_nonfinite();
  test_dequant_layouts(&rs);
  test_round_trip(&rs);
  return ll_test_summary();
}
