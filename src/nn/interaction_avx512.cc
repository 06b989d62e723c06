// DotInteraction's forward with AVX-512 (interaction_avx512.h). Built with -ffp-contract=off
// (CMakeLists.txt): every product and sum is rounded on its own, as in the scalar loop.
#include "nn/interaction_avx512.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DLREC_DOT_X86 1
#endif

namespace dlrec::nn {

namespace {

#ifdef DLREC_DOT_X86
#define DLREC_DOT_TARGET __attribute__((target("avx512f")))

// Rows i0 .. i0 + G - 1 of the triangle, their columns [16 v, 16 v + 16) (those below i): one
// accumulator per row, over k in order. zt [d, np]: Z^T of one sample, zero-padded to np columns.
template <int G>
DLREC_DOT_TARGET void rows_block(const float* zt, int64_t d, int64_t np, int64_t i0, int64_t v,
                                 float* tri) {
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (int64_t k = 0; k < d; ++k) {
    const float* ztk = zt + k * np;
    const __m512 zj = _mm512_loadu_ps(ztk + 16 * v);
    for (int g = 0; g < G; ++g)
      acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(_mm512_set1_ps(ztk[i0 + g]), zj));
  }
  for (int g = 0; g < G; ++g) {
    const int64_t i = i0 + g;
    const int64_t n = std::min<int64_t>(16, i - 16 * v);  // columns j < i in this vector
    const __mmask16 m = static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
    _mm512_mask_storeu_ps(tri + i * (i - 1) / 2 + 16 * v, m, acc[g]);
  }
}

DLREC_DOT_TARGET void forward_rows(const float* xd, const float* xe, int64_t lo, int64_t hi,
                                   int64_t tables, int64_t d, float* out) {
  const int64_t n = tables + 1, np = (n + 15) / 16 * 16, F = d + n * (n - 1) / 2;
  std::vector<float> zt(static_cast<size_t>(d * np), 0.f);
  for (int64_t b = lo; b < hi; ++b) {
    const float* zd = xd + b * d;
    const float* ze = xe + b * tables * d;
    for (int64_t k = 0; k < d; ++k) {
      float* ztk = zt.data() + k * np;
      ztk[0] = zd[k];
      for (int64_t t = 0; t < tables; ++t) ztk[t + 1] = ze[t * d + k];
    }
    float* o = out + b * F;
    std::memcpy(o, zd, static_cast<size_t>(d) * sizeof(float));
    float* tri = o + d;
    // Column vector v holds j in [16 v, 16 v + 16); rows i > 16 v have entries there. Up to 12
    // rows per pass over k (12 accumulators; the rest of the registers hold loads).
    for (int64_t v = 0; 16 * v < n - 1; ++v) {
      int64_t i = std::max<int64_t>(1, 16 * v + 1);
      while (i < n) {
        const int64_t left = n - i;
        if (left >= 12) rows_block<12>(zt.data(), d, np, i, v, tri), i += 12;
        else if (left >= 8) rows_block<8>(zt.data(), d, np, i, v, tri), i += 8;
        else if (left >= 4) rows_block<4>(zt.data(), d, np, i, v, tri), i += 4;
        else if (left >= 2) rows_block<2>(zt.data(), d, np, i, v, tri), i += 2;
        else rows_block<1>(zt.data(), d, np, i, v, tri), i += 1;
      }
    }
  }
}
#endif

}  // namespace

bool dot_avx512_available() {
#ifdef DLREC_DOT_X86
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

void dot_forward_avx512(const float* xd, const float* xe, int64_t B, int64_t tables, int64_t d,
                        float* out) {
#ifdef DLREC_DOT_X86
  DLREC_CHECK(dot_avx512_available(), "DotInteraction: this CPU has no AVX-512");
  parallel_for(0, B, 32, [&](int64_t lo, int64_t hi) { forward_rows(xd, xe, lo, hi, tables, d, out); });
#else
  (void)xd, (void)xe, (void)B, (void)tables, (void)d, (void)out;
  fail("DotInteraction: the AVX-512 forward needs an x86-64 build");
#endif
}

}  // namespace dlrec::nn
