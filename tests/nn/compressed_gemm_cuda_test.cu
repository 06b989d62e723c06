// The compressed GEMMs against a CPU reference: 2:4 sparse GEMMs through cuSPARSELt
// (nn/gemm_2_4_cuda.h: bf16, fp16, int8 -> int8 and int8 -> bf16, each layout) and int8
// operands in the cuBLASLt planner (nn/lt_gemm.h). Skips without a GPU or without cuSPARSELt.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../../src/nn/gemm_2_4_cuda.h"
#include "../../src/nn/lt_gemm.h"
#include "dlrec/core/error.h"
#include "dlrec/core/gpu_resources.h"

namespace {

namespace sp = dlrec::nn::cuda_sparse;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_SPARSE()                                                \
  do {                                                                  \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";                  \
    std::string why;                                                    \
    if (!sp::available(&why)) GTEST_SKIP() << "no cuSPARSELt: " << why; \
  } while (0)

// A device buffer that frees itself.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, n * sizeof(T)), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Integer weights in [-8, 8] with the 2 smallest |w| of each group of 4 along `in` zeroed, and
// integer activations in [-8, 8]: every product and sum is exact in bf16/fp16 inputs and fp32
// accumulation, so the references are exact too.
std::vector<float> pruned_ints(int64_t out, int64_t in, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<float> w(out * in);
  for (auto& x : w) x = static_cast<float>(d(rng));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t g = 0; g < in; g += 4) {
      float* q = &w[r * in + g];
      int a = 0, b = 1;  // the two smallest |q|
      if (std::fabs(q[b]) < std::fabs(q[a])) std::swap(a, b);
      for (int j = 2; j < 4; ++j) {
        if (std::fabs(q[j]) < std::fabs(q[a]))
          b = a, a = j;
        else if (std::fabs(q[j]) < std::fabs(q[b]))
          b = j;
      }
      q[a] = q[b] = 0.f;
    }
  return w;
}

std::vector<float> ints(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

// y [batch, out] = x [batch, in] w^T (exact on these integer values).
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                              int64_t batch, int64_t out, int64_t in) {
  std::vector<double> y(batch * out, 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += double(x[b * in + k]) * w[o * in + k];
      y[b * out + o] = s;
    }
  return y;
}

// The values of a row-major [rows, cols] matrix transposed.
template <class T>
std::vector<T> transposed(const std::vector<T>& a, int64_t rows, int64_t cols) {
  std::vector<T> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

template <class T, class F>
std::vector<T> convert(const std::vector<float>& v, F f) {
  std::vector<T> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f(v[i]);
  return o;
}

constexpr int64_t kOut = 96, kIn = 256, kBatch = 160;

// Runs the 2:4 GEMM in `layout` and returns Y [batch, out] as doubles (read back through `to`).
template <class T, class Y, class To>
std::vector<double> run_sparse(sp::Type type, sp::Layout layout, bool to_bf16,
                               const std::vector<float>& x, const std::vector<float>& w,
                               float alpha, To to) {
  auto cv = [](float f) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      return __float2bfloat16(f);
    else if constexpr (std::is_same_v<T, __half>)
      return __float2half(f);
    else
      return static_cast<int8_t>(f);
  };
  const bool in_fm = layout == sp::Layout::FeatureMajor;
  const bool out_fm = layout != sp::Layout::RowMajor;
  Dev<T> dw(convert<T>(w, cv));
  Dev<T> dx(convert<T>(in_fm ? transposed(x, kBatch, kIn) : x, cv));
  Dev<Y> dy(static_cast<size_t>(kBatch * kOut));
  sp::Gemm24 g(kOut, kIn, type, layout, to_bf16);
  g.set_weight(dw.p, nullptr);
  EXPECT_GT(g.compressed_bytes(), 0u);
  g.run(dx.p, dy.p, kBatch, nullptr, alpha);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<Y> y = dy.get();
  if (out_fm) y = transposed(y, kOut, kBatch);
  std::vector<double> r(y.size());
  for (size_t i = 0; i < y.size(); ++i) r[i] = to(y[i]);
  return r;
}

const sp::Layout kLayouts[] = {sp::Layout::RowMajor, sp::Layout::FeatureMajor,
                               sp::Layout::FeatureMajorOut};

TEST(CompressedGemmCuda, Sparse16BitMatchesTheReferenceInEveryLayout) {
  REQUIRE_SPARSE();
  std::mt19937 rng(1);
  const auto w = pruned_ints(kOut, kIn, rng);
  const auto x = ints(kBatch * kIn, rng);
  const auto ref = reference(x, w, kBatch, kOut, kIn);
  for (sp::Layout layout : kLayouts) {
    // |y| <= 256 * 64: exact in fp16 only up to 2048, so compare within the output's rounding.
    const auto bf = run_sparse<__nv_bfloat16, __nv_bfloat16>(
        sp::Type::BF16, layout, false, x, w, 1.f,
        [](__nv_bfloat16 v) { return double(__bfloat162float(v)); });
    const auto h = run_sparse<__half, __half>(sp::Type::FP16, layout, false, x, w, 1.f,
                                              [](__half v) { return double(__half2float(v)); });
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(bf[i], ref[i], std::fabs(ref[i]) * (1.0 / 128) + 1e-9)
          << "bf16, layout " << int(layout) << ", output " << i;
      ASSERT_NEAR(h[i], ref[i], std::fabs(ref[i]) * (1.0 / 1024) + 1e-9)
          << "fp16, layout " << int(layout) << ", output " << i;
    }
  }
}

TEST(CompressedGemmCuda, SparseInt8RequantizesAndScales) {
  REQUIRE_SPARSE();
  std::mt19937 rng(2);
  const auto w = pruned_ints(kOut, kIn, rng);
  const auto x = ints(kBatch * kIn, rng);
  const auto ref = reference(x, w, kBatch, kOut, kIn);
  const float alpha = 1.f / 64;
  // int8 -> int8 (row-major: the layout with int8 outputs) and int8 -> bf16 (feature-major out).
  const auto q = run_sparse<int8_t, int8_t>(sp::Type::INT8, sp::Layout::RowMajor, false, x, w,
                                            alpha, [](int8_t v) { return double(v); });
  const auto b = run_sparse<int8_t, __nv_bfloat16>(
      sp::Type::INT8, sp::Layout::FeatureMajorOut, true, x, w, alpha,
      [](__nv_bfloat16 v) { return double(__bfloat162float(v)); });
  for (size_t i = 0; i < ref.size(); ++i) {
    const double want = std::max(-128.0, std::min(127.0, std::nearbyint(ref[i] * alpha)));
    ASSERT_LE(std::fabs(q[i] - want), 1.0) << "int8 output " << i << " of " << ref[i];
    ASSERT_NEAR(b[i], ref[i] * alpha, std::fabs(ref[i] * alpha) / 128 + 1e-9) << "output " << i;
  }
}

TEST(CompressedGemmCuda, SparseRefusesBadWeightsAndShapes) {
  REQUIRE_SPARSE();
  std::mt19937 rng(3);
  auto w = pruned_ints(kOut, kIn, rng);
  w[5 * kIn + 8] = w[5 * kIn + 9] = w[5 * kIn + 10] = 3.f;  // 3 non-zeros in one group of 4
  Dev<__nv_bfloat16> dw(convert<__nv_bfloat16>(w, [](float f) { return __float2bfloat16(f); }));
  sp::Gemm24 g(kOut, kIn, sp::Type::BF16);
  try {
    g.set_weight(dw.p, nullptr);
    FAIL() << "a weight that is not 2:4 was accepted";
  } catch (const dlrec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 5, columns 8-11"), std::string::npos) << e.what();
  }
  Dev<__nv_bfloat16> x(static_cast<size_t>(kBatch * kIn)), y(static_cast<size_t>(kBatch * kOut));
  EXPECT_THROW(g.run(x.p, y.p, kBatch, nullptr), dlrec::Error);       // no weight yet
  EXPECT_THROW(sp::Gemm24(kOut, 130, sp::Type::BF16), dlrec::Error);  // 130 % 4 != 0
  EXPECT_THROW(sp::Gemm24(kOut, kIn, sp::Type::BF16, sp::Layout::RowMajor, true), dlrec::Error);
}

TEST(CompressedGemmCuda, LtInt8MatchesTheIntegerReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using dlrec::nn::cuda_lt::Gemm;
  std::mt19937 rng(4);
  const auto w = pruned_ints(kOut, kIn, rng);  // any int8 weight; pruned ones do too
  const auto x = ints(kBatch * kIn, rng);
  const auto ref = reference(x, w, kBatch, kOut, kIn);
  auto i8 = [](float f) { return static_cast<int8_t>(f); };
  Dev<int8_t> dw(convert<int8_t>(w, i8)), dx(convert<int8_t>(x, i8));
  Dev<int8_t> dy(static_cast<size_t>(kBatch * kOut));
  Dev<int32_t> dy32(static_cast<size_t>(kBatch * kOut));
  dlrec::nn::cuda_lt::Lt lt(dlrec::gpu::DeviceResources::get(0)->blas_lt(), false);
  // Column-major D [out, batch] = W^T^T X^T: Y row-major [batch, out].
  Gemm g = Gemm::shape(true, false, kOut, kBatch, kIn, kIn, kIn, kOut);
  g.ab_type = CUDA_R_8I;
  g.d_type = CUDA_R_8I;
  const float alpha = 1.f / 64;
  ASSERT_TRUE(lt.run(g, dw.p, dx.p, dy.p, nullptr, nullptr, nullptr, nullptr, alpha));
  Gemm g32 = g;
  g32.d_type = CUDA_R_32I;
  ASSERT_TRUE(lt.run(g32, dw.p, dx.p, dy32.p, nullptr, nullptr, nullptr));
  EXPECT_THROW(lt.run(g32, dw.p, dx.p, dy32.p, nullptr, nullptr, nullptr, nullptr, 0.5f),
               dlrec::Error);  // an int32 output takes an integer alpha
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto y = dy.get();
  const auto y32 = dy32.get();
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(double(y32[i]), ref[i]) << "int32 output " << i;
    const double want = std::max(-128.0, std::min(127.0, std::nearbyint(ref[i] * alpha)));
    ASSERT_LE(std::fabs(double(y[i]) - want), 1.0) << "int8 output " << i;
  }
}

}  // namespace
