// The SIMD kernels of the CPU's int8 Linear (int8_gemm_packed.h). Compiled for the baseline
// x86-64 target like the rest, with -ffp-contract=off (CMakeLists.txt: the dequantize's product
// and sum stay two roundings, as the scalar reference's); each kernel carries its own target
// attribute and runs only where the CPU reports those features.
#include "compress/int8_gemm_packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DLREC_SIMD_X86 1
// GCC 12's AVX-512 headers start some intrinsics from an undefined vector (_mm512_undefined_*)
// and then warn that it may be used uninitialized: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dlrec::compress {

namespace {

#ifdef DLREC_SIMD_X86
#define DLREC_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define DLREC_AVX2_TARGET __attribute__((target("avx2")))

// ---- Avx512Vnni ----

// Rows [0, R) of xu times NB blocks of 16 packed channels starting at wb, into acc (stride ld).
template <int R, int NB>
DLREC_VNNI_TARGET void vnni_tile(const uint8_t* xu, int64_t xs, const int8_t* wb, int64_t steps,
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

using VnniTile = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, const int32_t*, int,
                          int32_t*, int64_t);

template <int NB>
VnniTile vnni_tile_for(int rows) {
  static const VnniTile fns[8] = {vnni_tile<1, NB>, vnni_tile<2, NB>, vnni_tile<3, NB>,
                                  vnni_tile<4, NB>, vnni_tile<5, NB>, vnni_tile<6, NB>,
                                  vnni_tile<7, NB>, vnni_tile<8, NB>};
  return fns[rows - 1];
}

DLREC_VNNI_TARGET void vnni_gemm(const uint8_t* xu, const Int8Packed& p, int64_t rows,
                                 int32_t* acc) {
  const int64_t steps = p.in_pad / 4;
  // Channel pairs outside, rows inside: a pair's weights (32 x in bytes) stay in cache while the
  // chunk's rows pass.
  for (int64_t b = 0; b < p.blocks; b += 2) {
    const int nb = static_cast<int>(std::min<int64_t>(2, p.blocks - b));
    const int valid_last = static_cast<int>(std::min<int64_t>(16, p.out - (b + nb - 1) * 16));
    const int8_t* wb = p.w8.data() + b * steps * 64;
    const int32_t* corr = p.correction.data() + b * 16;
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
      const int r = static_cast<int>(std::min<int64_t>(8, rows - r0));
      const VnniTile fn = nb == 2 ? vnni_tile_for<2>(r) : vnni_tile_for<1>(r);
      fn(xu + r0 * p.in_pad, p.in_pad, wb, steps, corr, valid_last, acc + r0 * p.out + b * 16,
         p.out);
    }
  }
}

// xu row r = quantize_value(x[r, k]) + 128, padding 128 (x = 0); nan[r]: the row holds a NaN.
DLREC_VNNI_TARGET void vnni_quantize(const float* x, int64_t rows, int64_t in, int64_t in_pad,
                                     float inv_scale, uint8_t* xu, char* nan) {
  const __m512 inv = _mm512_set1_ps(inv_scale);
  const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  const __m512i offset = _mm512_set1_epi32(128);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    uint8_t* ur = xu + r * in_pad;
    __mmask16 bad = 0;
    for (int64_t k = 0; k < in; k += 16) {
      const int n = static_cast<int>(std::min<int64_t>(16, in - k));
      const __mmask16 m = static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(m, xr + k);
      bad |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
      // Clamped before the conversion (a value beyond int32 would convert to INT_MIN), then
      // rounded half to even as nearbyint: the scalar quantize's value for every finite or
      // infinite x. A NaN's byte is whatever; its row's output is NaN.
      const __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, inv), lo), hi);
      const __m512i q = _mm512_add_epi32(
          _mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), offset);
      _mm_mask_storeu_epi8(ur + k, m, _mm512_cvtepi32_epi8(q));
    }
    std::memset(ur + in, 128, static_cast<size_t>(in_pad - in));
    nan[r] = bad != 0;
  }
}

DLREC_VNNI_TARGET void vnni_dequantize(const int32_t* acc, int64_t rows, int64_t out,
                                       const float* deq, const float* b, bool relu,
                                       const char* nan, float* y) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * out;
    if (nan[r]) {
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

// ---- Avx2 ----

DLREC_AVX2_TARGET inline __m256i lanes_below(int n) {  // lanes [0, n) all ones
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows [0, R) of x16 times NB blocks of 8 packed channels starting at wb, into acc (stride ld).
template <int R, int NB>
DLREC_AVX2_TARGET void avx2_tile(const int16_t* x, int64_t xs, const int16_t* wb, int64_t steps,
                                 int valid_last, int32_t* acc, int64_t ld) {
  __m256i a[R][NB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) a[r][b] = _mm256_setzero_si256();
  const int64_t bstride = steps * 16;
  for (int64_t s = 0; s < steps; ++s) {
    __m256i w[NB];
    for (int b = 0; b < NB; ++b)
      w[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + b * bstride + s * 16));
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * xs + 2 * s, 4);
      const __m256i xv = _mm256_set1_epi32(pair);
      // Per channel x[k] w[k] + x[k+1] w[k+1] in int32: exact (|each| <= 127 * 127).
      for (int b = 0; b < NB; ++b)
        a[r][b] = _mm256_add_epi32(a[r][b], _mm256_madd_epi16(xv, w[b]));
    }
  }
  for (int b = 0; b < NB; ++b) {
    const __m256i m = lanes_below(b == NB - 1 ? valid_last : 8);
    for (int r = 0; r < R; ++r) _mm256_maskstore_epi32(acc + r * ld + 8 * b, m, a[r][b]);
  }
}

using Avx2Tile = void (*)(const int16_t*, int64_t, const int16_t*, int64_t, int, int32_t*,
                          int64_t);

template <int NB>
Avx2Tile avx2_tile_for(int rows) {
  static const Avx2Tile fns[4] = {avx2_tile<1, NB>, avx2_tile<2, NB>, avx2_tile<3, NB>,
                                  avx2_tile<4, NB>};
  return fns[rows - 1];
}

DLREC_AVX2_TARGET void avx2_gemm(const int16_t* x, const Int8Packed& p, int64_t rows,
                                 int32_t* acc) {
  const int64_t steps = p.in_pad / 2;
  // 4 rows x 2 blocks: 8 accumulators, 2 weights and a broadcast in AVX2's 16 registers (3
  // blocks spilled accumulators to the stack).
  for (int64_t b = 0; b < p.blocks; b += 2) {
    const int nb = static_cast<int>(std::min<int64_t>(2, p.blocks - b));
    const int valid_last = static_cast<int>(std::min<int64_t>(8, p.out - (b + nb - 1) * 8));
    const int16_t* wb = p.w16.data() + b * steps * 16;
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int r = static_cast<int>(std::min<int64_t>(4, rows - r0));
      const Avx2Tile fn = nb == 2 ? avx2_tile_for<2>(r) : avx2_tile_for<1>(r);
      fn(x + r0 * p.in_pad, p.in_pad, wb, steps, valid_last, acc + r0 * p.out + b * 8, p.out);
    }
  }
}

// x16 row r = quantize_value(x[r, k]) as int16, padding 0; nan[r]: the row holds a NaN.
DLREC_AVX2_TARGET void avx2_quantize(const float* x, int64_t rows, int64_t in, int64_t in_pad,
                                     float inv_scale, int16_t* x16, char* nan) {
  const __m256 inv = _mm256_set1_ps(inv_scale);
  const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  const int64_t in8 = in - in % 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    int16_t* qr = x16 + r * in_pad;
    int bad = 0;
    for (int64_t k = 0; k < in8; k += 8) {
      const __m256 v = _mm256_loadu_ps(xr + k);
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      // As vnni_quantize: clamp, then round half to even (the MXCSR default, as nearbyint).
      const __m256 c = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, inv), lo), hi);
      const __m256i q = _mm256_cvtps_epi32(c);
      const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(q, q), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + k), _mm256_castsi256_si128(p));
    }
    for (int64_t k = in8; k < in; ++k) {
      bad |= std::isnan(xr[k]);
      qr[k] = quantize_value(xr[k], inv_scale);
    }
    for (int64_t k = in; k < in_pad; ++k) qr[k] = 0;
    nan[r] = bad != 0;
  }
}

DLREC_AVX2_TARGET void avx2_dequantize(const int32_t* acc, int64_t rows, int64_t out,
                                       const float* deq, const float* b, bool relu,
                                       const char* nan, float* y) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * out;
    if (nan[r]) {
      std::fill(yr, yr + out, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const int32_t* ar = acc + r * out;
    for (int64_t j = 0; j < out; j += 8) {
      const __m256i m = lanes_below(static_cast<int>(std::min<int64_t>(8, out - j)));
      const __m256 a = _mm256_cvtepi32_ps(_mm256_maskload_epi32(ar + j, m));
      __m256 v = _mm256_add_ps(_mm256_mul_ps(a, _mm256_maskload_ps(deq + j, m)),
                               _mm256_maskload_ps(b + j, m));
      if (relu) v = _mm256_max_ps(zero, v);  // as vnni_dequantize's
      _mm256_maskstore_ps(yr + j, m, v);
    }
  }
}
#endif

}  // namespace

bool int8_simd_available(Int8Kernel k) {
#ifdef DLREC_SIMD_X86
  if (k == Int8Kernel::Avx2) return __builtin_cpu_supports("avx2");
  if (k == Int8Kernel::Avx512Vnni)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
  (void)k;
  return false;
}

std::shared_ptr<const Int8Packed> pack_int8(const QuantWeight& w, Int8Kernel k) {
  DLREC_CHECK(k == Int8Kernel::Avx2 || k == Int8Kernel::Avx512Vnni,
              "int8 GEMM: no packed layout for the ", int8_kernel_name(k), " kernel");
  auto p = std::make_shared<Int8Packed>();
  p->kernel = k;
  p->out = w.out;
  p->in = w.in;
  const bool vnni = k == Int8Kernel::Avx512Vnni;
  const int64_t group = vnni ? 4 : 2, width = vnni ? 16 : 8;
  p->in_pad = (w.in + group - 1) / group * group;
  p->blocks = (w.out + width - 1) / width;
  const int64_t steps = p->in_pad / group;
  const size_t total = static_cast<size_t>(p->blocks * steps * width * group);
  if (vnni) {
    p->w8.assign(total, 0);
    p->correction.assign(static_cast<size_t>(p->blocks * width), 0);
  } else {
    p->w16.assign(total, 0);
  }
  for (int64_t j = 0; j < w.out; ++j) {
    const int64_t b = j / width, c = j % width;
    int32_t sum = 0;
    for (int64_t kk = 0; kk < w.in; ++kk) {
      const int8_t v = w.q[static_cast<size_t>(j * w.in + kk)];
      const size_t at = static_cast<size_t>(((b * steps + kk / group) * width + c) * group +
                                            kk % group);
      if (vnni)
        p->w8[at] = v;
      else
        p->w16[at] = v;
      sum += v;
    }
    if (vnni) p->correction[static_cast<size_t>(j)] = 128 * sum;
  }
  return p;
}

void int8_rows_packed(const Int8Packed& p, const float* x, int64_t rows, float inv_scale,
                      const float* deq, const float* b, bool relu, float* y) {
#ifdef DLREC_SIMD_X86
  DLREC_CHECK(int8_simd_available(p.kernel), "int8 GEMM: this CPU cannot run the ",
              int8_kernel_name(p.kernel), " kernel");
  std::vector<int32_t> acc(static_cast<size_t>(rows * p.out));
  std::vector<char> nan(static_cast<size_t>(rows));
  if (p.kernel == Int8Kernel::Avx512Vnni) {
    std::vector<uint8_t> xu(static_cast<size_t>(rows * p.in_pad));
    vnni_quantize(x, rows, p.in, p.in_pad, inv_scale, xu.data(), nan.data());
    vnni_gemm(xu.data(), p, rows, acc.data());
    vnni_dequantize(acc.data(), rows, p.out, deq, b, relu, nan.data(), y);
  } else {
    std::vector<int16_t> x16(static_cast<size_t>(rows * p.in_pad));
    avx2_quantize(x, rows, p.in, p.in_pad, inv_scale, x16.data(), nan.data());
    avx2_gemm(x16.data(), p, rows, acc.data());
    avx2_dequantize(acc.data(), rows, p.out, deq, b, relu, nan.data(), y);
  }
#else
  (void)p, (void)x, (void)rows, (void)inv_scale, (void)deq, (void)b, (void)relu, (void)y;
  fail("int8 GEMM: the SIMD kernels need an x86-64 build");
#endif
}

}  // namespace dlrec::compress
