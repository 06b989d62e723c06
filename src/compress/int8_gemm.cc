// The INT8 arithmetic of a quantized Linear on the CPU (docs/COMPRESSION.md): weight
// quantization, the int8 x int8 -> int32 GEMM (the scalar reference, an AVX2 kernel, and the
// AVX-512 VNNI kernel of int8_gemm_vnni.cc), and the layer's forward with dequantize, bias and
// ReLU fused per row chunk.
//
// Why an own kernel rather than oneDNN: the layers are small (DLRM/DCNv2 widths of 16..1024),
// the exact int32 sums make the AVX2 kernel bit-identical to the scalar reference (which the
// parity harness can take for the GPU), and no new build dependency is needed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "compress/int8_gemm_vnni.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/core/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DLREC_INT8_X86 1
#endif

namespace dlrec::compress {

namespace {

// The most rows per parallel chunk (the chunking does not change any result: every row is
// independent).
constexpr int64_t kChunkRows = 256;

#ifdef DLREC_INT8_X86
__attribute__((target("avx2"))) inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_hadd_epi32(s, s);
  s = _mm_hadd_epi32(s, s);
  return _mm_cvtsi128_si32(s);
}

// 16 int8 -> 16 int16 lanes.
__attribute__((target("avx2"))) inline __m256i load16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Sign-extends to int16 and uses madd (pairwise int16 products summed into int32): exact for
// int8 inputs (|a*b + c*d| <= 2 * 127 * 128), so the sums are those of the reference in any
// order. Four output channels per pass share the loads of the input row.
__attribute__((target("avx2"))) void gemm_avx2(const int8_t* qx, const int8_t* qw, int64_t rows,
                                               int64_t out, int64_t in, int32_t* acc) {
  const int64_t in16 = in - in % 16;
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* xr = qx + r * in;
    int32_t* ar = acc + r * out;
    int64_t j = 0;
    for (; j + 4 <= out; j += 4) {
      const int8_t* w0 = qw + j * in;
      const int8_t* w1 = w0 + in;
      const int8_t* w2 = w1 + in;
      const int8_t* w3 = w2 + in;
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t k = 0; k < in16; k += 16) {
        const __m256i xv = load16(xr + k);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(xv, load16(w0 + k)));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(xv, load16(w1 + k)));
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(xv, load16(w2 + k)));
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(xv, load16(w3 + k)));
      }
      int32_t s0 = hsum_epi32(a0), s1 = hsum_epi32(a1), s2 = hsum_epi32(a2), s3 = hsum_epi32(a3);
      for (int64_t k = in16; k < in; ++k) {
        const int32_t xv = xr[k];
        s0 += xv * w0[k];
        s1 += xv * w1[k];
        s2 += xv * w2[k];
        s3 += xv * w3[k];
      }
      ar[j] = s0;
      ar[j + 1] = s1;
      ar[j + 2] = s2;
      ar[j + 3] = s3;
    }
    for (; j < out; ++j) {
      const int8_t* wj = qw + j * in;
      __m256i a = _mm256_setzero_si256();
      for (int64_t k = 0; k < in16; k += 16)
        a = _mm256_add_epi32(a, _mm256_madd_epi16(load16(xr + k), load16(wj + k)));
      int32_t s = hsum_epi32(a);
      for (int64_t k = in16; k < in; ++k) s += static_cast<int32_t>(xr[k]) * wj[k];
      ar[j] = s;
    }
  }
}
#endif

}  // namespace

bool int8_kernel_available(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::Reference:
    case Int8Kernel::Auto:
      return true;
    case Int8Kernel::Avx2:
#ifdef DLREC_INT8_X86
      return __builtin_cpu_supports("avx2");
#else
      return false;
#endif
    case Int8Kernel::Avx512Vnni:
      return int8_vnni_available();
  }
  return false;
}

const char* int8_kernel_name(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::Reference: return "reference";
    case Int8Kernel::Avx2: return "avx2";
    case Int8Kernel::Avx512Vnni: return "avx512-vnni";
    case Int8Kernel::Auto: return "auto";
  }
  return "?";
}

Int8Kernel int8_best_kernel() {
  if (int8_kernel_available(Int8Kernel::Avx512Vnni)) return Int8Kernel::Avx512Vnni;
  if (int8_kernel_available(Int8Kernel::Avx2)) return Int8Kernel::Avx2;
  return Int8Kernel::Reference;
}

void int8_gemm_reference(const int8_t* qx, const int8_t* qw, int64_t rows, int64_t out, int64_t in,
                         int32_t* acc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < out; ++j) {
      int32_t s = 0;
      for (int64_t k = 0; k < in; ++k)
        s += static_cast<int32_t>(qx[r * in + k]) * static_cast<int32_t>(qw[j * in + k]);
      acc[r * out + j] = s;
    }
}

int8_t quantize_value(float x, float inv_scale) {
  const float q = std::nearbyint(x * inv_scale);  // the default rounding: half to even
  return static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
}

QuantWeight quantize_weight(const Tensor& weight) {
  DLREC_CHECK(weight.ndim() == 2 && weight.dtype() == DType::F32 && !weight.device().is_cuda(),
              "int8 weight: expected a 2-d F32 CPU tensor, got ", shape_str(weight.shape()));
  QuantWeight q;
  q.out = weight.dim(0);
  q.in = weight.dim(1);
  q.q.resize(static_cast<size_t>(q.out * q.in));
  q.scales.resize(static_cast<size_t>(q.out));
  const float* w = weight.data<float>();
  for (int64_t j = 0; j < q.out; ++j) {
    float amax = 0.f;
    for (int64_t k = 0; k < q.in; ++k) amax = std::max(amax, std::fabs(w[j * q.in + k]));
    DLREC_CHECK(std::isfinite(amax), "int8 weight: row ", j, " holds a non-finite value");
    // At least the smallest normal float: a row of subnormal weights would round to scale 0,
    // which the export's load check refuses.
    const float s = amax > 0.f ? std::max(amax / 127.f, std::numeric_limits<float>::min()) : 1.f;
    q.scales[j] = s;
    for (int64_t k = 0; k < q.in; ++k) {
      const float v = std::nearbyint(w[j * q.in + k] / s);
      q.q[j * q.in + k] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
    }
  }
  return q;
}

void int8_linear(const Tensor& x, float x_scale, const QuantWeight& w, const Tensor& bias,
                 bool relu, Tensor& y, Int8Kernel kernel) {
  const int64_t B = nn::check_matrix(x, w.in, "int8 Linear input");
  DLREC_CHECK(bias.defined() && bias.dtype() == DType::F32 && bias.numel() == w.out,
              "int8 Linear: the bias must be F32 of ", w.out, " values");
  DLREC_CHECK(x_scale > 0.f && std::isfinite(x_scale), "int8 Linear: bad input scale ", x_scale);
  DLREC_CHECK(int8_kernel_available(kernel), "int8 Linear: this CPU cannot run the ",
              int8_kernel_name(kernel), " kernel");
  if (kernel == Int8Kernel::Auto) kernel = int8_best_kernel();
  nn::ensure_buffer(y, {B, w.out});
  if (B == 0) return;
  const int64_t in = w.in, out = w.out;
  const float inv = 1.f / x_scale;
  std::vector<float> deq(static_cast<size_t>(out));
  for (int64_t j = 0; j < out; ++j) deq[j] = x_scale * w.scales[j];
  std::shared_ptr<const Int8Packed> packed = w.packed;
  if (kernel == Int8Kernel::Avx512Vnni && !packed) packed = pack_int8_vnni(w);
  const int64_t in4 = (in + 3) / 4 * 4;
  const float* xs = x.data<float>();
  const float* b = bias.data<float>();
  float* ys = y.data<float>();
  // A chunk per thread at least where the batch allows (multiples of 8 rows, the VNNI tile).
  const int64_t per_thread = (B + num_threads() - 1) / num_threads();
  const int64_t chunk = std::clamp<int64_t>((per_thread + 7) / 8 * 8, 8, kChunkRows);
  const int64_t chunks = (B + chunk - 1) / chunk;
  parallel_for(0, chunks, 1, [&](int64_t clo, int64_t chi) {
    std::vector<int8_t> qx;
    std::vector<uint8_t> xu;
    if (kernel == Int8Kernel::Avx512Vnni)
      xu.resize(static_cast<size_t>(chunk * in4));
    else
      qx.resize(static_cast<size_t>(chunk * in));
    std::vector<int32_t> acc(static_cast<size_t>(chunk * out));
    std::vector<char> nan(static_cast<size_t>(chunk));
    for (int64_t c = clo; c < chi; ++c) {
      const int64_t lo = c * chunk, rows = std::min(B, lo + chunk) - lo;
      if (kernel == Int8Kernel::Avx512Vnni) {
        quantize_rows_u8(xs + lo * in, rows, in, in4, inv, xu.data(), nan.data());
        int8_gemm_vnni(xu.data(), *packed, rows, acc.data());
        dequantize_rows_vnni(acc.data(), rows, out, deq.data(), b, relu, nan.data(), ys + lo * out);
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) {
        // A NaN input has no int8 value (quantize_value would clamp it to -127).
        const float* xr = xs + (lo + r) * in;
        bool has_nan = false;
        for (int64_t k = 0; k < in; ++k) {
          has_nan |= std::isnan(xr[k]);
          qx[r * in + k] = quantize_value(xr[k], inv);
        }
        nan[r] = has_nan;
      }
#ifdef DLREC_INT8_X86
      if (kernel == Int8Kernel::Avx2)
        gemm_avx2(qx.data(), w.q.data(), rows, out, in, acc.data());
      else
#endif
        int8_gemm_reference(qx.data(), w.q.data(), rows, out, in, acc.data());
      for (int64_t r = 0; r < rows; ++r) {
        float* yr = ys + (lo + r) * out;
        // A row with a NaN input is NaN, as the fp32 layer's would be, never a finite score.
        if (nan[r]) {
          std::fill(yr, yr + out, std::numeric_limits<float>::quiet_NaN());
          continue;
        }
        const int32_t* ar = acc.data() + r * out;
        for (int64_t j = 0; j < out; ++j) {
          const float v = static_cast<float>(ar[j]) * deq[j] + b[j];
          yr[j] = relu ? std::max(v, 0.f) : v;
        }
      }
    }
  });
}

Int8Linear::Int8Linear(QuantWeight w, float x_scale) : w_(std::move(w)), x_scale_(x_scale) {
  if (int8_best_kernel() == Int8Kernel::Avx512Vnni && !w_.packed) w_.packed = pack_int8_vnni(w_);
}

bool Int8Linear::forward(const Tensor& x, const Tensor& bias, bool relu, Tensor& y) {
  int8_linear(x, x_scale_, w_, bias, relu, y);
  return true;
}

}  // namespace dlrec::compress
