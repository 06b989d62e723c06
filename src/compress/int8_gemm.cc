// The INT8 arithmetic of a quantized Linear on the CPU (docs/COMPRESSION.md): weight
// quantization, the int8 x int8 -> int32 GEMM (the scalar reference here; the AVX2 and AVX-512
// VNNI kernels on packed weights in int8_gemm_packed.cc), and the layer's forward with
// dequantize, bias and ReLU fused per row chunk.
//
// Why an own kernel rather than oneDNN: the layers are small (DLRM/DCNv2 widths of 16..1024),
// the exact int32 sums make the SIMD kernels bit-identical to the scalar reference (which the
// parity harness can take for the GPU), and no new build dependency is needed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "compress/int8_gemm_packed.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::compress {

namespace {

// The most rows per parallel chunk (the chunking does not change any result: every row is
// independent).
constexpr int64_t kChunkRows = 256;

}  // namespace

bool int8_kernel_available(Int8Kernel k) {
  if (k == Int8Kernel::Reference || k == Int8Kernel::Auto) return true;
  return int8_simd_available(k);
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
  const float* xs = x.data<float>();
  const float* b = bias.data<float>();
  float* ys = y.data<float>();
  // A chunk per thread at least where the batch allows, in multiples of 8 rows (the VNNI tile),
  // and a chunk's quantized input within ~128 KiB, so that it stays in cache while every block
  // of channels passes over it.
  const int64_t per_thread = (B + num_threads() - 1) / num_threads();
  const int64_t in_bytes = kernel == Int8Kernel::Avx2 ? 2 * in : in;
  const int64_t max_rows = std::clamp<int64_t>((131072 / in_bytes) / 8 * 8, 8, kChunkRows);
  const int64_t chunk = std::clamp<int64_t>((per_thread + 7) / 8 * 8, 8, max_rows);
  const int64_t chunks = (B + chunk - 1) / chunk;
  if (kernel != Int8Kernel::Reference) {
    std::shared_ptr<const Int8Packed> packed = w.packed;
    if (!packed || packed->kernel != kernel) packed = pack_int8(w, kernel);
    parallel_for(0, chunks, 1, [&](int64_t clo, int64_t chi) {
      for (int64_t c = clo; c < chi; ++c) {
        const int64_t lo = c * chunk, rows = std::min(B, lo + chunk) - lo;
        int8_rows_packed(*packed, xs + lo * in, rows, inv, deq.data(), b, relu, ys + lo * out);
      }
    });
    return;
  }
  parallel_for(0, chunks, 1, [&](int64_t clo, int64_t chi) {
    std::vector<int8_t> qx(static_cast<size_t>(chunk * in));
    std::vector<int32_t> acc(static_cast<size_t>(chunk * out));
    std::vector<char> nan(static_cast<size_t>(chunk));
    for (int64_t c = clo; c < chi; ++c) {
      const int64_t lo = c * chunk, rows = std::min(B, lo + chunk) - lo;
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
  const Int8Kernel k = int8_best_kernel();
  if (k != Int8Kernel::Reference && (!w_.packed || w_.packed->kernel != k))
    w_.packed = pack_int8(w_, k);
}

std::string Int8Linear::kernel() const {
  return std::string("int8 ") + int8_kernel_name(int8_best_kernel());
}

bool Int8Linear::forward(const Tensor& x, const Tensor& bias, bool relu, Tensor& y) {
  int8_linear(x, x_scale_, w_, bias, relu, y);
  return true;
}

}  // namespace dlrec::compress
