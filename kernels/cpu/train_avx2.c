// train_avx2.c - AVX2 versions of train.c's element-wise loops that the compiler leaves scalar
// (sqrtf keeps errno semantics, so AdamW's loop is not vectorised for the baseline ISA).
// Same operations in the same order as the scalar expression, no fused multiply-add: the
// IEEE square root, division, products and sums of 8 lanes give the scalar loop's bits.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "ll_cpu_train.h"

// p, m, v (n) updated as ll_train_ref_adamw's loop body, bc1/bc2 its bias corrections.
void ll_train_adamw_avx2(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2, float eps, float wd,
                         float bc1, float bc2) {
  const __m256 b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2), o1 = _mm256_set1_ps(1.0f - beta1), o2 = _mm256_set1_ps(1.0f - beta2);
  const __m256 c1 = _mm256_set1_ps(bc1), c2 = _mm256_set1_ps(bc2), vlr = _mm256_set1_ps(lr), ve = _mm256_set1_ps(eps), vwd = _mm256_set1_ps(wd);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(o1, gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(o2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 mh = _mm256_div_ps(mi, c1), vh = _mm256_div_ps(vi, c2);
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 upd = _mm256_add_ps(_mm256_div_ps(mh, _mm256_add_ps(_mm256_sqrt_ps(vh), ve)), _mm256_mul_ps(vwd, pi));
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(vlr, upd)));
  }
  for (; i < n; i++) {
    const float gi = g[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float mh = m[i] / bc1, vh = v[i] / bc2;
    p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
  }
}
