// The AVX-512 VNNI kernel of the CPU's int8 GEMM (int8_gemm_vnni.h). Compiled for the baseline
// x86-64 target like the rest, with -ffp-contract=off (CMakeLists.txt: the dequantize's product
// and sum stay two roundings, as the scalar reference's); the kernels carry their own target
// attribute and run only where the CPU reports avx512f, avx512bw, avx512vl and avx512vnni.
#include "compress/int8_gemm_vnni.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#define DLREC_VNNI_X86 1
// GCC 12's AVX-512 headers start some intrinsics from an undefined vector (_mm512_undefined_*)
// and then warn that it may be used uninitialized: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dlrec::compress {

namespace {

constexpr int kTileRows = 8;  // rows of one tile; with 2 blocks of 16 channels: 16 accumulators

#ifdef DLREC_VNNI_X86
#define DLREC_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// Rows [0, R) of xu times NB blocks of packed channels starting at wb, into acc (stride ld).
template <int R, int NB>
DLREC_VNNI_TARGET void tile(const uint8_t* xu, int64_t xs, const int8_t* wb, int64_t steps,
                            const int32_t* corr, int valid_last, int32_t* acc, int64_t ld) {
  __m512i a[R][NB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) a[r][b] = _mm512_setzero_si512();
  const int64_t bstride = steps * 64;
  for (int64_t s = 0; s < steps; ++s) {
    __m512i w[NB];
    for (int b = 0; b < NB; ++b)
      w[b] = _mm512_loadu_si512(reinterpret_cast<const void*>(wb + b * bstride + s * 64));
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, xu + r * xs + 4 * s, 4);
      const __m512i xv = _mm512_set1_epi32(quad);
      for (int b = 0; b < NB; ++b) a[r][b] = _mm512_dpbusd_epi32(a[r][b], xv, w[b]);
    }
  }
  for (int b = 0; b < NB; ++b) {
    const __m512i c = _mm512_loadu_si512(reinterpret_cast<const void*>(corr + 16 * b));
    const int valid = b == NB - 1 ? valid_last : 16;
    const __mmask16 m = static_cast<__mmask16>(valid == 16 ? 0xFFFFu : (1u << valid) - 1u);
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_epi32(acc + r * ld + 16 * b, m, _mm512_sub_epi32(a[r][b], c));
  }
}

using TileFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, const int32_t*, int,
                        int32_t*, int64_t);

template <int NB>
TileFn tile_for(int rows) {
  static const TileFn fns[kTileRows] = {tile<1, NB>, tile<2, NB>, tile<3, NB>, tile<4, NB>,
                                        tile<5, NB>, tile<6, NB>, tile<7, NB>, tile<8, NB>};
  return fns[rows - 1];
}

DLREC_VNNI_TARGET void quantize_avx512(const float* x, int64_t rows, int64_t in, int64_t in4,
                                       float inv_scale, uint8_t* xu, char* nan_rows) {
  const __m512 inv = _mm512_set1_ps(inv_scale);
  const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  const __m512i offset = _mm512_set1_epi32(128);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    uint8_t* ur = xu + r * in4;
    __mmask16 nan = 0;
    for (int64_t k = 0; k < in; k += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, in - k));
      const __mmask16 m = static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(m, xr + k);
      nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
      // Clamped before the conversion (a value beyond int32 would convert to INT_MIN), then
      // rounded half to even as nearbyint: the scalar quantize's value for every finite or
      // infinite x. A NaN's byte is whatever; its row's output is NaN.
      const __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, inv), lo), hi);
      const __m512i q = _mm512_add_epi32(
          _mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), offset);
      _mm_mask_storeu_epi8(ur + k, m, _mm512_cvtepi32_epi8(q));
    }
    std::memset(ur + in, 128, static_cast<size_t>(in4 - in));
    nan_rows[r] = nan != 0;
  }
}

DLREC_VNNI_TARGET void dequantize_avx512(const int32_t* acc, int64_t rows, int64_t out,
                                         const float* deq, const float* b, bool relu,
                                         const char* nan_rows, float* y) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * out;
    if (nan_rows[r]) {
      std::fill(yr, yr + out, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const int32_t* ar = acc + r * out;
    for (int64_t j = 0; j < out; j += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, out - j));
      const __mmask16 m = static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1u);
      const __m512 a = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, ar + j));
      __m512 v = _mm512_add_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, deq + j)),
                               _mm512_maskz_loadu_ps(m, b + j));
      // max(0, v) returns v unless 0 > v: the scalar (v < 0 ? 0 : v), -0 and NaN included.
      if (relu) v = _mm512_max_ps(zero, v);
      _mm512_mask_storeu_ps(yr + j, m, v);
    }
  }
}
#endif

}  // namespace

void dequantize_rows_vnni(const int32_t* acc, int64_t rows, int64_t out, const float* deq,
                          const float* b, bool relu, const char* nan_rows, float* y) {
#ifdef DLREC_VNNI_X86
  DLREC_CHECK(int8_vnni_available(), "int8 GEMM: this CPU has no AVX-512 VNNI");
  dequantize_avx512(acc, rows, out, deq, b, relu, nan_rows, y);
#else
  (void)acc, (void)rows, (void)out, (void)deq, (void)b, (void)relu, (void)nan_rows, (void)y;
  fail("int8 GEMM: the AVX-512 VNNI kernel needs an x86-64 build");
#endif
}

bool int8_vnni_available() {
#ifdef DLREC_VNNI_X86
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

std::shared_ptr<const Int8Packed> pack_int8_vnni(const QuantWeight& w) {
  auto p = std::make_shared<Int8Packed>();
  p->out = w.out;
  p->in = w.in;
  p->in4 = (w.in + 3) / 4 * 4;
  p->blocks = (w.out + 15) / 16;
  const int64_t steps = p->in4 / 4;
  p->w.assign(static_cast<size_t>(p->blocks * steps * 64), 0);
  p->correction.assign(static_cast<size_t>(p->blocks * 16), 0);
  for (int64_t j = 0; j < w.out; ++j) {
    const int64_t b = j / 16, c = j % 16;
    int32_t sum = 0;
    for (int64_t k = 0; k < w.in; ++k) {
      const int8_t v = w.q[static_cast<size_t>(j * w.in + k)];
      p->w[static_cast<size_t>(((b * steps + k / 4) * 16 + c) * 4 + k % 4)] = v;
      sum += v;
    }
    p->correction[static_cast<size_t>(j)] = 128 * sum;
  }
  return p;
}

void int8_gemm_vnni(const uint8_t* xu, const Int8Packed& p, int64_t rows, int32_t* acc) {
#ifdef DLREC_VNNI_X86
  DLREC_CHECK(int8_vnni_available(), "int8 GEMM: this CPU has no AVX-512 VNNI");
  const int64_t steps = p.in4 / 4;
  // Channel pairs outside, rows inside: a pair's weights (32 x in4 bytes) stay in cache while
  // the chunk's rows pass.
  for (int64_t b = 0; b < p.blocks; b += 2) {
    const int nb = static_cast<int>(std::min<int64_t>(2, p.blocks - b));
    const int valid_last = static_cast<int>(std::min<int64_t>(16, p.out - (b + nb - 1) * 16));
    const int8_t* wb = p.w.data() + b * steps * 64;
    const int32_t* corr = p.correction.data() + b * 16;
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int r = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
      const TileFn fn = nb == 2 ? tile_for<2>(r) : tile_for<1>(r);
      fn(xu + r0 * p.in4, p.in4, wb, steps, corr, valid_last, acc + r0 * p.out + b * 16, p.out);
    }
  }
#else
  (void)xu, (void)p, (void)rows, (void)acc;
  fail("int8 GEMM: the AVX-512 VNNI kernel needs an x86-64 build");
#endif
}

void quantize_rows_u8(const float* x, int64_t rows, int64_t in, int64_t in4, float inv_scale,
                      uint8_t* xu, char* nan_rows) {
#ifdef DLREC_VNNI_X86
  if (int8_vnni_available()) return quantize_avx512(x, rows, in, in4, inv_scale, xu, nan_rows);
#endif
  for (int64_t r = 0; r < rows; ++r) {
    bool nan = false;
    for (int64_t k = 0; k < in; ++k) {
      const float v = x[r * in + k];
      nan |= std::isnan(v);
      xu[r * in4 + k] = static_cast<uint8_t>(quantize_value(v, inv_scale) + 128);
    }
    std::memset(xu + r * in4 + in, 128, static_cast<size_t>(in4 - in));
    nan_rows[r] = nan;
  }
}

}  // namespace dlrec::compress
