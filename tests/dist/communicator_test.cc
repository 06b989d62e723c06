#include "dlrec/dist/communicator.h"

#include <gtest/gtest.h>

#include <chrono>

#include "dist/run_job.h"
#include "dlrec/core/device.h"
#include "dlrec/core/error.h"
#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::mpirun_prefix;
using dlrec::testing::run_job;

#define EXPECT_THROW_MSG(stmt, part) dlrec::testing::expect_error([&] { stmt; }, {part})

namespace {

const std::string kWorker = std::string(DLREC_BIN_DIR) + "/dist_worker";

#define SKIP_WITHOUT_MPIRUN(n)                                                             \
  if (!dist::mpi_built() || mpirun_prefix(n).empty())                                      \
  GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin " \
                  "libopenmpi-dev); the MPI communicator is not tested here"

TEST(SingleCommunicator, EveryCollectiveIsTheIdentityOrACopy) {
  auto c = dist::make_single_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_STREQ(c->kind(), "single");
  std::vector<float> f = {1, 2, 3};
  c->all_reduce(f.data(), 3);
  EXPECT_EQ(f, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(c->all_reduce_value(2.5), 2.5);
  std::vector<int64_t> g(2);
  const int64_t mine[2] = {4, 5};
  c->all_gather(mine, g.data(), 2, dist::Elem::I64);
  EXPECT_EQ(g, (std::vector<int64_t>{4, 5}));
  double rs_in[2] = {1.5, 2.5}, rs_out[2] = {0, 0};
  c->reduce_scatter(rs_in, rs_out, 2, dist::Elem::F64);
  EXPECT_EQ(rs_out[1], 2.5);
  std::vector<int32_t> send = {9, 8, 7}, recv(4, 0);
  c->all_to_all_v(send.data(), {2}, {1}, recv.data(), {2}, {2}, dist::Elem::I32);
  EXPECT_EQ(recv, (std::vector<int32_t>{0, 0, 8, 7}));
  EXPECT_EQ(c->all_gather_counts(7), (std::vector<int64_t>{7}));
  c->barrier();
  EXPECT_EQ(c->duplicate(), nullptr);  // only NCCL has a second communicator
}

TEST(SingleCommunicator, BadArgumentsAreClearErrors) {
  auto c = dist::make_single_communicator();
  int32_t x = 0;
  EXPECT_THROW_MSG(c->broadcast(&x, 1, dist::Elem::I32, 1), "broadcast from rank 1");
  EXPECT_THROW_MSG(c->all_to_all_v(&x, {1, 1}, {0, 0}, &x, {1, 1}, {0, 0}, dist::Elem::I32),
                   "1 count");
  EXPECT_THROW_MSG(c->all_to_all_v(&x, {1}, {0}, &x, {2}, {0}, dist::Elem::I32), "expects 2");
  Tensor t = Tensor::zeros({2}, DType::F32);
  EXPECT_NO_THROW(c->all_reduce(t));
}

TEST(Communicator, FactoryNamesTheKinds) {
  EXPECT_STREQ(dist::make_communicator("single")->kind(), "single");
  EXPECT_THROW_MSG(dist::make_communicator("tcp"), "unknown communicator 'tcp'");
  dist::CommOptions o;
  o.timeout_seconds = 0;
  EXPECT_THROW_MSG(dist::make_communicator("single", o), "timeout must be > 0");
}

TEST(Communicator, NcclWithoutItIsAClearError) {
  if (dist::nccl_built()) GTEST_SKIP() << "this build has NCCL (tested on a GPU host)";
  auto c = dist::make_single_communicator();
  EXPECT_THROW_MSG(dist::make_nccl_communicator(*c, 0), "no NCCL");
}

// A CUDA build with NCCL: one rank on the GPU (the host of the lead's device checks), or a
// clear error without one.
TEST(NcclCommunicator, OneRankOnTheGpuOrAClearError) {
  if (!dist::nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  auto boot = dist::make_single_communicator();
  if (cuda::device_count() == 0) {
    EXPECT_THROW_MSG(dist::make_nccl_communicator(*boot, 0), "dist (nccl)");
    GTEST_SKIP() << "no GPU here: only the error without one was checked";
  }
  auto c = dist::make_nccl_communicator(*boot, 0);
  EXPECT_STREQ(c->kind(), "nccl");
  EXPECT_NE(c->stream(), nullptr);
  Tensor t = Tensor::from_vector<float>({1.f, 2.f, 3.f}, {3}, c->device());
  c->all_reduce(t);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_EQ(c->all_gather_counts(5), (std::vector<int64_t>{5}));
  c->barrier();
  EXPECT_THROW_MSG(dist::make_nccl_communicator(*boot, 1000), "asks for GPU 1000");
}

TEST(NcclCommunicator, EveryCollectiveAcrossTheGpusOfThisNode) {
  if (!dist::nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  const int gpus = cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "fewer than 2 GPUs here (" << gpus << ")";
  SKIP_WITHOUT_MPIRUN(gpus);
  auto r = run_job(mpirun_prefix(gpus) + kWorker + " nccl", 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < gpus; ++k)
    EXPECT_NE(r.output.find("ok rank " + std::to_string(k) + " of "), std::string::npos)
        << r.output;
}

TEST(MpiCommunicator, EveryCollectiveOnTwoAndThreeRanks) {
  SKIP_WITHOUT_MPIRUN(2);
  for (int n : {2, 3}) {
    auto r = run_job(mpirun_prefix(n) + kWorker + " collectives", 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (int k = 0; k < n; ++k)
      EXPECT_NE(r.output.find("ok rank " + std::to_string(k) + " of " + std::to_string(n)),
                std::string::npos)
          << r.output;
  }
}

// Four ranks declared as 2 nodes of 2 (--ranks-per-node 2): the hierarchical all_to_all_v
// (intra-node, then inter-node) is byte-identical to the flat one on random sizes, zero-length
// parts included (tests/dist/worker: 40 exchanges of 5 element types, all_gather_v too).
TEST(MpiCommunicator, HierarchicalAllToAllMatchesFlatOnTwoDeclaredNodes) {
  SKIP_WITHOUT_MPIRUN(4);
  auto r = run_job(mpirun_prefix(4) + kWorker + " hier", 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("ok rank " + std::to_string(k) + " of 4"), std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("[dist] 4 ranks on 2 nodes (2 per node, from --ranks-per-node 2)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("all-to-all: hierarchical"), std::string::npos) << r.output;
}

// The same on NCCL (GPU hosts; CI skips): 2 declared nodes of gpus / 2, directly and in a graph.
TEST(NcclCommunicator, HierarchicalAllToAllMatchesFlatOnTwoDeclaredNodes) {
  if (!dist::nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  const int gpus = cuda::device_count();
  if (gpus < 4) GTEST_SKIP() << "fewer than 4 GPUs here (" << gpus << ")";
  SKIP_WITHOUT_MPIRUN(4);
  auto r = run_job(mpirun_prefix(4) + kWorker + " nccl-hier", 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("ok rank " + std::to_string(k) + " of 4"), std::string::npos)
        << r.output;
}

TEST(MpiCommunicator, ACollectiveWaitingPastItsTimeoutNamesTheMissingRank) {
  SKIP_WITHOUT_MPIRUN(3);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_job(mpirun_prefix(3) + kWorker + " timeout", 60);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.hung) << "the job hung: " << r.output;
  EXPECT_NE(r.output.find("all_reduce (f32 x 1, sum)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("waited more than 1 s; ranks that have not arrived: 1 (last entered "
                          "barrier #1)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("ok rank"), std::string::npos) << r.output;
  EXPECT_LT(secs, 30) << r.output;
}

TEST(MpiCommunicator, ARankKilledMidJobEndsTheJobNamingIt) {
  SKIP_WITHOUT_MPIRUN(3);
  auto r = run_job(mpirun_prefix(3) + kWorker + " die", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.hung) << "the job hung: " << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ok rank"), std::string::npos) << r.output;
}

}  // namespace
