// The fp32 Linear on packed weights (dlrec/nn/linear_packed.h): every kernel gives the scalar
// reference's bits, a row's outputs do not depend on its batch or the thread count, and the
// values are the Linear's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/linear.h"
#include "dlrec/nn/linear_packed.h"
#include "nn/grad_check.h"

namespace dlrec::nn {
namespace {

using testing::random_tensor;

// Equal bits, or NaN in both (a NaN's payload is not part of the contract).
::testing::AssertionResult same_value(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return ::testing::AssertionSuccess();
  if (std::memcmp(&a, &b, sizeof a) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " vs " << b;
}

Tensor run(const Tensor& x, const PackedWeight& w, const Tensor& b, bool relu) {
  Tensor y = Tensor::zeros({x.dim(0), w.out}, DType::F32);
  packed_linear(x, w, b, relu, y);
  return y;
}

// Shapes with tails in every blocked dimension: rows (tiles of 8 / 6, tasks of 48), channels
// (panels of 32 / 16, groups of up to 4 panels) and k (blocks of 256); inputs with an infinity,
// a NaN, -0 and large values.
void expect_kernel_equals_reference(Fp32Kernel kernel) {
  for (auto [B, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 1},
                            {1, 1024, 1024},
                            {2, 300, 70},
                            {7, 16, 4},
                            {9, 5, 33},
                            {17, 479, 50},
                            {64, 1024, 6},
                            {100, 13, 512},
                            {300, 37, 13},
                            {513, 600, 64}}) {
    Tensor x = random_tensor({B, in}, static_cast<uint64_t>(1 + in));
    float* xs = x.data<float>();
    xs[0] = 1e30f;
    if (x.numel() > 3) {
      xs[1] = -std::numeric_limits<float>::infinity();
      xs[2] = -0.f;
      xs[3] = std::numeric_limits<float>::quiet_NaN();
    }
    const Tensor w = random_tensor({out, in}, static_cast<uint64_t>(2 + out));
    const Tensor b = random_tensor({out}, 3);
    const auto ref = pack_weight(w, Fp32Kernel::Reference);
    const auto packed = pack_weight(w, kernel);
    for (const bool relu : {true, false}) {
      const Tensor y_ref = run(x, *ref, b, relu), y = run(x, *packed, b, relu);
      for (int64_t i = 0; i < y.numel(); ++i)
        ASSERT_TRUE(same_value(y.data<float>()[i], y_ref.data<float>()[i]))
            << fp32_kernel_name(kernel) << " B=" << B << " in=" << in << " out=" << out
            << " relu=" << relu << " element " << i;
    }
  }
}

TEST(PackedLinear, Avx2KernelEqualsTheScalarReferenceBitForBit) {
  if (!fp32_kernel_available(Fp32Kernel::Avx2)) GTEST_SKIP() << "this CPU has no AVX2 and FMA";
  expect_kernel_equals_reference(Fp32Kernel::Avx2);
}

TEST(PackedLinear, Avx512KernelEqualsTheScalarReferenceBitForBit) {
  if (!fp32_kernel_available(Fp32Kernel::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  expect_kernel_equals_reference(Fp32Kernel::Avx512);
  EXPECT_EQ(fp32_best_kernel(), Fp32Kernel::Avx512);
}

// A row's outputs alone, inside batches of other sizes and offsets, and on 1 or 2 threads: the
// same bits (an OpenBLAS GEMM does not promise this).
TEST(PackedLinear, ARowsOutputDoesNotDependOnItsBatchOrTheThreads) {
  const int64_t in = 300, out = 70, B = 200;
  const Tensor w = random_tensor({out, in}, 5);
  const Tensor b = random_tensor({out}, 6);
  const Tensor x = random_tensor({B, in}, 7);
  const auto p = pack_weight(w);
  const int threads = num_threads();
  const Tensor full = run(x, *p, b, true);
  set_num_threads(1);
  const Tensor one_thread = run(x, *p, b, true);
  set_num_threads(threads);
  for (int64_t i = 0; i < full.numel(); ++i)
    ASSERT_TRUE(same_value(full.data<float>()[i], one_thread.data<float>()[i])) << i;
  for (auto [lo, n] : {std::pair<int64_t, int64_t>{0, 1}, {5, 1}, {199, 1}, {3, 7}, {40, 50},
                       {100, 100}}) {
    Tensor part = Tensor::zeros({n, in}, DType::F32);
    std::memcpy(part.data<float>(), x.data<float>() + lo * in, n * in * sizeof(float));
    const Tensor y = run(part, *p, b, true);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < out; ++j)
        ASSERT_TRUE(
            same_value(y.data<float>()[r * out + j], full.data<float>()[(lo + r) * out + j]))
            << "rows [" << lo << ", " << lo + n << "), row " << r << " channel " << j;
  }
}

// Attached to a Linear (what Model::prepare_cpu_inference does): the Linear's values within
// rounding, the kernel named, and no training any more.
TEST(PackedLinear, ServesALinearAndRefusesItsBackward) {
  Linear l(129, 45, Activation::ReLU);
  l.init(3);
  const Tensor x = random_tensor({37, 129}, 8);
  const Tensor y_blas = l.forward(x).clone();
  l.weight().quant = std::make_shared<PackedLinear>(l.weight().value);
  EXPECT_EQ(l.weight().quant->kernel(),
            std::string("fp32 ") + fp32_kernel_name(fp32_best_kernel()) + " (packed)");
  const Tensor& y = l.forward(x);
  ASSERT_EQ(y.shape(), y_blas.shape());
  double worst = 0;
  for (int64_t i = 0; i < y.numel(); ++i)
    worst = std::max(worst, std::fabs(double(y.data<float>()[i]) - y_blas.data<float>()[i]));
  EXPECT_LT(worst, 1e-5);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_GE(y.data<float>()[i], 0.f);
  const Tensor dy = random_tensor({37, 45}, 9);
  try {
    l.backward(dy);
    FAIL() << "backward ran on a packed (inference-only) layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inference only"), std::string::npos) << e.what();
  }
}

TEST(PackedLinear, RejectsWrongShapes) {
  const auto p = pack_weight(random_tensor({8, 16}, 1));
  const Tensor b = random_tensor({8}, 2);
  Tensor y = Tensor::zeros({4, 8}, DType::F32);
  EXPECT_THROW(packed_linear(random_tensor({4, 15}, 3), *p, b, false, y), Error);
  Tensor y_bad = Tensor::zeros({4, 7}, DType::F32);
  EXPECT_THROW(packed_linear(random_tensor({4, 16}, 3), *p, b, false, y_bad), Error);
  EXPECT_THROW(packed_linear(random_tensor({4, 16}, 3), *p, random_tensor({7}, 4), false, y),
               Error);
  EXPECT_THROW(pack_weight(random_tensor({8}, 1)), Error);
}

}  // namespace
}  // namespace dlrec::nn
