// The per-layer kernel choice of compressed models on the CUDA engine, CPU side
// (dlrec/nn/kernel_choice.h): the candidates a layer gets, the choice under each policy (dense
// whenever a candidate is unavailable or slower, e.g. without cuSPARSELt), the 2:4 mask check
// and the policy names.
#include "dlrec/nn/kernel_choice.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/nn/cusparselt_version.h"
#include "test_errors.h"

using namespace dlrec::nn::kernel_choice;

namespace {

void expect_error(const std::function<void()>& fn, const std::string& part) {
  dlrec::testing::expect_error(fn, {part});
}

std::vector<Kernel> kernels(const std::vector<Candidate>& c) {
  std::vector<Kernel> k;
  for (const auto& x : c) k.push_back(x.kernel);
  return k;
}

}  // namespace

TEST(KernelChoice, CandidatesFollowTheRecords) {
  EXPECT_EQ(kernels(candidates(false, false, true, true, "")), std::vector<Kernel>{Kernel::Dense});
  EXPECT_EQ(kernels(candidates(true, false, true, true, "")),
            (std::vector<Kernel>{Kernel::Dense, Kernel::Sparse24}));
  EXPECT_EQ(kernels(candidates(false, true, true, true, "")),
            (std::vector<Kernel>{Kernel::Dense, Kernel::Int8}));
  const auto both = candidates(true, true, true, true, "");
  EXPECT_EQ(kernels(both), (std::vector<Kernel>{Kernel::Dense, Kernel::Sparse24, Kernel::Int8,
                                                Kernel::Sparse24Int8}));
  for (const auto& c : both) EXPECT_TRUE(c.available) << kernel_name(c.kernel);
  // fp32 engine: 2:4 in 16 bits would change the arithmetic; int8 kernels stay.
  const auto fp32 = candidates(true, true, false, true, "");
  EXPECT_FALSE(fp32[1].available);
  EXPECT_NE(fp32[1].why.find("fp32"), std::string::npos);
  EXPECT_TRUE(fp32[2].available);
  EXPECT_TRUE(fp32[3].available);
}

TEST(KernelChoice, WithoutCusparseltTheSparseKernelsAreUnavailableAndDenseIsKept) {
  auto c = candidates(true, false, true, false, "libcusparseLt.so.0 not found");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_FALSE(c[1].available);
  EXPECT_EQ(c[1].why, "libcusparseLt.so.0 not found");
  c[0].ms = 1.0;  // only dense was timed
  EXPECT_EQ(choose(c, Policy::Fastest), 0u);
  EXPECT_EQ(choose(c, Policy::Compressed), 0u);  // nothing compressed is available: dense
  // Masked and quantized without cuSPARSELt: int8 is what remains.
  auto q = candidates(true, true, true, false, "no library");
  EXPECT_EQ(choose(q, Policy::Compressed), 2u);
  EXPECT_EQ(q[choose(q, Policy::Compressed)].kernel, Kernel::Int8);
  EXPECT_NE(describe("top.0.weight", 2048, q, 0).find("2:4 n/a (no library)"), std::string::npos);
}

TEST(KernelChoice, FastestKeepsTheFastestAndNeverASlowerOne) {
  auto c = candidates(true, true, true, true, "");
  c[0].ms = 1.0;   // dense
  c[1].ms = 0.8;   // 2:4
  c[2].ms = 0.6;   // int8
  c[3].ms = 0.45;  // 2:4-int8
  EXPECT_EQ(c[choose(c, Policy::Fastest)].kernel, Kernel::Sparse24Int8);
  EXPECT_EQ(choose(c, Policy::Dense), 0u);
  EXPECT_EQ(c[choose(c, Policy::Compressed)].kernel, Kernel::Sparse24Int8);
  // Slower than dense (small batches): dense; a tie keeps dense.
  c[1].ms = 1.2;
  c[2].ms = 1.0;
  c[3].ms = 1.5;
  EXPECT_EQ(choose(c, Policy::Fastest), 0u);
  // Faster than dense by less than kMinGain (5 %): dense; by more: the compressed kernel.
  c[2].ms = 0.96;
  EXPECT_EQ(choose(c, Policy::Fastest), 0u);
  c[2].ms = 0.94;
  EXPECT_EQ(c[choose(c, Policy::Fastest)].kernel, Kernel::Int8);
  c[2].ms = 1.0;
  // An unavailable candidate is never chosen, however fast it was said to be.
  c[3].ms = 0.1;
  c[3].available = false;
  EXPECT_EQ(choose(c, Policy::Fastest), 0u);
  // Dense not timed (not measured): dense, never an unmeasured comparison.
  c[0].ms = -1;
  c[2].ms = 0.1;
  EXPECT_EQ(choose(c, Policy::Fastest), 0u);
  const std::string line = describe("top.0.weight", 32768, c, 0);
  EXPECT_NE(line.find("top.0.weight [B=32768]: dense *"), std::string::npos) << line;
  // The first candidate must be dense.
  std::vector<Candidate> bad{{Kernel::Int8, true, "", 1.0}};
  expect_error([&] { choose(bad, Policy::Fastest); },
               "first candidate must be the available dense");
}

TEST(KernelChoice, MaskCheckNamesTheLayerRowAndGroup) {
  // 2 rows of 8: row 0 is 2:4; row 1 keeps 3 of columns 4..7.
  std::vector<float> m = {1, 0, 1, 0, 0, 1, 1, 0,  //
                          0, 0, 1, 1, 1, 1, 0, 1};
  expect_error([&] { check_mask_2_4("top.1.weight", m.data(), 2, 8); },
               "'top.1.weight': its mask is not 2:4 (row 1, the group of columns 4..7 keeps 3");
  m[15] = 0;
  check_mask_2_4("top.1.weight", m.data(), 2, 8);
  // A last partial group (in = 6): at most 2 of its 2 values.
  std::vector<float> p = {1, 1, 0, 0, 1, 1};
  check_mask_2_4("bottom.0.weight", p.data(), 1, 6);
  std::vector<float> all = {1, 1, 1, 1};
  expect_error([&] { check_mask_2_4("cross.0.v.weight", all.data(), 1, 4); },
               "'cross.0.v.weight': its mask is not 2:4 (row 0, the group of columns 0..3 keeps 4");
}

TEST(KernelChoice, PolicyNames) {
  EXPECT_EQ(parse_policy("fastest", "x"), Policy::Fastest);
  EXPECT_EQ(parse_policy("compressed", "x"), Policy::Compressed);
  EXPECT_EQ(parse_policy("dense", "x"), Policy::Dense);
  EXPECT_STREQ(policy_name(Policy::Compressed), "compressed");
  expect_error([] { parse_policy("sparse", "--kernels"); },
               "--kernels: unknown kernel policy 'sparse' (choose fastest, compressed or dense)");
}

TEST(KernelChoice, CusparseltVersionCheckNamesTheFoundAndTheRequiredVersion) {
  EXPECT_EQ(cusparselt_version_error(0, 8, 0, "libcusparseLt.so.0"), "");
  EXPECT_EQ(cusparselt_version_error(0, 9, 2, "x"), "");
  EXPECT_EQ(cusparselt_version_error(0, 7, 1, "/opt/lib/libcusparseLt.so.0"),
            "cuSPARSELt at /opt/lib/libcusparseLt.so.0 is version 0.7.1; the 2:4 kernels need "
            "0.8 or a later 0.x");
  EXPECT_NE(cusparselt_version_error(1, 0, 0, "y").find("is version 1.0.0"), std::string::npos);
}
