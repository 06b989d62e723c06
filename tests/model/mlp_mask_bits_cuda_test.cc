// The MLP backward's bf16 mask + bias-gradient pass (src/nn/dense_cuda.h) on the output of a
// real cuBLASLt layer forward, against a host reference, bit for bit. Without a GPU (or built
// without CUDA) it skips visibly.
#include <gtest/gtest.h>

#include "test_errors.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dlrec/core/device.h"
#ifdef DLREC_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../../src/nn/dense_cuda.h"
#include "../../src/nn/lt_gemm.h"
#endif

namespace dlrec::model {
namespace {

using dlrec::testing::expect_error;

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: mask bits test not run"; \
  } while (0)

#ifdef DLREC_WITH_CUDA
// The MLP backward's mask + bias-gradient pass on y from a real bf16 layer forward (cuBLASLt
// GEMM with the RELU_AUX_BIAS epilogue, as MlpNode runs it; inputs with all-zero rows and zero
// biases, so some pre-activations are exactly 0) equals a host reference bit for bit: dz = dy
// where y > 0, and the bias gradient summed in the documented order (per chunk of 256 rows, 8
// row sums taken every 8th row, added in order, then the chunks in order); through the
// 8-columns-per-thread kernel (widths 256, 200, 8) and the one-column kernel (100 wide), with a
// partial last chunk (1000 rows). The bit mask the epilogue writes beside y is cuBLASLt's
// (least significant bit first: bit c % 8 of byte r * aux_ld / 8 + c / 8): it differs from
// y > 0 at every exactly-zero pre-activation (bit set) and at no more than 0.1 % of other
// elements, while the other bit order would differ at a large share; the pass from those bits
// (mask_bias_grad_bits, DLREC_MLP_MASK_BITS=1) equals a host reference from the same bits bit
// for bit. A bad mask leading dimension is refused.
TEST(MlpMaskBitsCuda, Bf16MaskBiasGradPassesMatchHostReference) {
  SKIP_WITHOUT_GPU();
  using bf16 = __nv_bfloat16;
  namespace cd = nn::cuda_dense;
  namespace lt = nn::cuda_lt;
  const int64_t B = 1000, k = 72;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<void*> owned;
  auto dev_alloc = [&](size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
    owned.push_back(d);
    return d;
  };
  auto dev_copy = [&](const void* h, size_t bytes) {
    void* d = dev_alloc(bytes);
    EXPECT_EQ(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  };
  auto to_host = [](void* d, auto& v) {
    ASSERT_EQ(cudaMemcpy(v.data(), d, v.size() * sizeof(v[0]), cudaMemcpyDeviceToHost),
              cudaSuccess);
  };
  auto bits_of = [](const std::vector<bf16>& v) {
    std::vector<uint16_t> u(v.size());
    std::memcpy(u.data(), v.data(), v.size() * 2);
    return u;
  };
  lt::Lt planner(gpu::DeviceResources::get(0)->blas_lt());
  std::vector<bf16> x(B * k);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t j = 0; j < k; ++j) x[r * k + j] = __float2bfloat16(r % 37 == 5 ? 0.f : nd(rng));
  void* dx = dev_copy(x.data(), x.size() * 2);
  const int64_t before = cd::mask_bits_launches();
  for (int64_t out : {256, 200, 8, 100}) {
    SCOPED_TRACE("width " + std::to_string(out));
    const int64_t aux_ld = (out + 127) / 128 * 128;
    std::vector<bf16> w(out * k), b(out), dy(B * out);
    for (auto& v : w) v = __float2bfloat16(0.2f * nd(rng));
    for (int64_t j = 0; j < out; ++j) b[j] = __float2bfloat16(j % 5 == 0 ? 0.f : 0.3f * nd(rng));
    for (auto& v : dy) v = __float2bfloat16(nd(rng));
    void* dw = dev_copy(w.data(), w.size() * 2);
    void* dbias = dev_copy(b.data(), b.size() * 2);
    void* ddy = dev_copy(dy.data(), dy.size() * 2);
    void* dyv = dev_alloc(B * out * 2);
    void* daux = dev_alloc(B * aux_ld / 8);
    ASSERT_EQ(cudaMemset(daux, 0xA5, B * aux_ld / 8), cudaSuccess);  // no stale zeros
    void* ddz1 = dev_alloc(B * out * 2);
    void* ddz2 = dev_alloc(B * out * 2);
    void* dpart = dev_alloc(cd::bias_grad_chunks(B) * out * 4);
    void* dgb1 = dev_alloc(out * 4);
    void* dgb2 = dev_alloc(out * 4);
    // The MLP layer's forward GEMM (graph_cuda.cu lin_forward): column-major D [out, B].
    lt::Gemm g = lt::Gemm::shape(true, false, out, B, k, k, k, out);
    g.epi = lt::Epi::ReluAuxBias;
    g.aux_ld = aux_ld;
    ASSERT_TRUE(planner.run(g, dw, dx, dyv, dbias, daux, nullptr))
        << "cuBLASLt has no RELU_AUX_BIAS algorithm for this shape";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<bf16> y(B * out);
    std::vector<uint8_t> aux(B * aux_ld / 8);
    to_host(dyv, y);
    to_host(daux, aux);
    auto bit = [&](int64_t r, int64_t c) { return ((aux[r * aux_ld / 8 + c / 8] >> (c % 8)) & 1) != 0; };
    int64_t set_at_zero = 0, other_set = 0, other_clear = 0, msb_bad = 0, positive = 0;
    const int64_t zero_pre = 27 * ((out + 4) / 5);  // rows 5, 42, ... (x = 0) by columns % 5 == 0
    for (int64_t r = 0; r < B; ++r)
      for (int64_t c = 0; c < out; ++c) {
        const bool pos = __bfloat162float(y[r * out + c]) > 0.f;
        positive += pos;
        msb_bad += (((aux[r * aux_ld / 8 + c / 8] >> (7 - c % 8)) & 1) != 0) != pos;
        if (r % 37 == 5 && c % 5 == 0) {
          EXPECT_FALSE(pos);
          set_at_zero += bit(r, c);
        } else if (bit(r, c) != pos) {
          (pos ? other_clear : other_set) += 1;
        }
      }
    std::printf("[mask bits] width %lld: exactly-zero pre-activations %lld, bit set at %lld; "
                "elsewhere bit set with y = 0: %lld, bit clear with y > 0: %lld; other bit "
                "order would differ at %lld of %lld\n",
                static_cast<long long>(out), static_cast<long long>(zero_pre),
                static_cast<long long>(set_at_zero), static_cast<long long>(other_set),
                static_cast<long long>(other_clear), static_cast<long long>(msb_bad),
                static_cast<long long>(B * out));
    EXPECT_EQ(set_at_zero, zero_pre);
    EXPECT_LE((other_set + other_clear) * 1000, B * out);
    EXPECT_GT(msb_bad * 10, B * out);
    EXPECT_GT(positive, B * out / 4);
    EXPECT_LT(positive, B * out * 3 / 4);
    cd::mask_bias_grad(static_cast<const bf16*>(ddy), static_cast<const bf16*>(dyv),
                       static_cast<bf16*>(ddz1), static_cast<float*>(dpart),
                       static_cast<float*>(dgb1), B, out, nullptr);
    cd::mask_bias_grad_bits(static_cast<const bf16*>(ddy), static_cast<const uint8_t*>(daux),
                            aux_ld, static_cast<bf16*>(ddz2), static_cast<float*>(dpart),
                            static_cast<float*>(dgb2), B, out, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<bf16> dz1(B * out), dz2(B * out);
    std::vector<float> gb1(out), gb2(out);
    to_host(ddz1, dz1);
    to_host(ddz2, dz2);
    to_host(dgb1, gb1);
    to_host(dgb2, gb2);
    // Host references: the mask from y > 0, and from the bits.
    for (bool from_bits : {false, true}) {
      std::vector<bf16> dz_ref(B * out);
      std::vector<float> gb_ref(out, 0.f);
      for (int64_t c = 0; c < out; ++c) {
        float total = 0.f;
        for (int64_t r0 = 0; r0 < B; r0 += 256) {
          float sums[8] = {};
          for (int q = 0; q < 8; ++q)
            for (int64_t r = r0 + q; r < std::min(B, r0 + 256); r += 8) {
              const int64_t i = r * out + c;
              const bool on = from_bits ? bit(r, c) : __bfloat162float(y[i]) > 0.f;
              const float v = on ? __bfloat162float(dy[i]) : 0.f;
              dz_ref[i] = __float2bfloat16(v);
              sums[q] += v;
            }
          float s = sums[0];
          for (int q = 1; q < 8; ++q) s += sums[q];
          total += s;
        }
        gb_ref[c] = total;
      }
      const auto& dz = from_bits ? dz2 : dz1;
      const auto& gb = from_bits ? gb2 : gb1;
      EXPECT_TRUE(bits_of(dz) == bits_of(dz_ref)) << (from_bits ? "dz from the bits" : "dz from y");
      for (int64_t c = 0; c < out; ++c)
        ASSERT_EQ(gb[c], gb_ref[c]) << (from_bits ? "bit pass" : "y pass") << ", column " << c;
    }
  }
  EXPECT_EQ(cd::mask_bits_launches() - before, 4);
  // A mask leading dimension that is not a multiple of 128, or narrower than the layer, is
  // refused before anything runs.
  const auto* mask = static_cast<const uint8_t*>(dx);  // never read: refused first
  auto* h = static_cast<bf16*>(dx);
  expect_error([&] { cd::mask_bias_grad_bits(h, mask, 100, h, nullptr, nullptr, 4, 64, nullptr); },
               {"mask_bias_grad_bits", "100 bits", "multiple of 128"});
  expect_error([&] { cd::mask_bias_grad_bits(h, mask, 128, h, nullptr, nullptr, 4, 200, nullptr); },
               {"128 bits", "at least the width 200"});
  EXPECT_EQ(cd::mask_bits_launches() - before, 4);
  for (void* p : owned) cudaFree(p);
}

#endif

#ifndef DLREC_WITH_CUDA
TEST(MlpMaskBitsCuda, Bf16MaskBiasGradPassesMatchHostReference) {
  GTEST_SKIP() << "built without CUDA: mask bits test not run";
}
#endif

}  // namespace
}  // namespace dlrec::model
