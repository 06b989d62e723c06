// A CUDA model whose build fails late (after it created streams, events, cuBLAS/cuBLASLt
// handles, device buffers) leaks nothing: 1,000 failed builds leave the live resource counts
// (include/dlrec/core/gpu_resources.h), the caching pool's bytes and the device's free memory
// as they were. Models built and destroyed (a server loading and unloading) likewise. For the
// DLRM (the preset's graph), DCNv2- and DeepFM-like graphs on the CUDA graph engine, which
// builds every model on CUDA. Without a GPU every test skips visibly.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/error.h"
#include "dlrec/core/config.h"
#include "dlrec/core/gpu_resources.h"
#include "dlrec/model/model.h"
#include "model/test_batches.h"
#ifdef DLREC_WITH_CUDA
#include <cuda_runtime.h>

#include "dlrec/model/graph_cuda.h"
#include "model/graph_cases.h"
#endif

namespace dlrec::model {
namespace {

#ifdef DLREC_WITH_CUDA

struct Snapshot {
  gpu::LiveCounts counts;
  size_t pool_live = 0, pool_held = 0, device_free = 0;
};

Snapshot snapshot() {
  cuda::synchronize(0);
  Snapshot s;
  s.counts = gpu::live_counts();
  s.pool_live = gpu::pool_bytes_live(0);
  s.pool_held = cuda::pool_bytes_in_use(0);
  size_t total = 0;
  EXPECT_EQ(cudaMemGetInfo(&s.device_free, &total), cudaSuccess);
  return s;
}

void expect_flat(const Snapshot& a, const Snapshot& b, const char* what) {
  EXPECT_EQ(b.counts.streams, a.counts.streams) << what;
  EXPECT_EQ(b.counts.events, a.counts.events) << what;
  EXPECT_EQ(b.counts.graphs, a.counts.graphs) << what;
  EXPECT_EQ(b.counts.blas, a.counts.blas) << what;
  EXPECT_EQ(b.counts.blas_lt, a.counts.blas_lt) << what;
  EXPECT_EQ(b.pool_live, a.pool_live) << what << ": device buffers still held";
  EXPECT_EQ(b.pool_held, a.pool_held) << what << ": the caching pool grew";
  // The driver's figure moves with things outside dlrec (cuBLAS' own caches, the CUDA
  // runtime); a leak of the smallest model here (two 32 MiB cuBLAS workspaces per build)
  // would be GiBs after 1,000 builds.
  EXPECT_LE(a.device_free - std::min(a.device_free, b.device_free), size_t{16} << 20)
      << what << ": device free memory fell from " << a.device_free << " to " << b.device_free;
}

// Graph models on the CUDA graph engine (src/model/graph_cuda.cu). The bad layout's last table
// has 2^32 - 100 rows: the layouts and layers pass every check made before the build, and the
// build throws in the table layer (more than 2^32 rows in all tables together), after the four
// streams (main, copy, side, weights), the events, the leased cuBLAS (and in bf16 cuBLASLt)
// handles, the bottom MLP's weights and the first tables exist.
struct GraphLeakCase {
  RunConfig cfg;
  io::ShardLayout good = testing::make_layout(4, {50, 7, 100, 3});
  io::ShardLayout bad = testing::make_layout(4, {50, 7, 100, (int64_t{1} << 32) - 100});
  explicit GraphLeakCase(const char* layers)
      : cfg(RunConfig::from_json(json::parse(R"({"model": {"arch": "graph", "layers": [)" +
                                             std::string(layers) + R"(]}, "optimizer": )" +
                                             testing::kAdagrad + "}"))) {}
  void fail_once(int i) {
    const char* precision = i % 2 ? "bf16" : "fp32";
    try {
      make_graph_cuda(cfg.model, cfg.optimizer, bad, Device::cuda(0), static_cast<uint64_t>(i),
                      precision);
      ADD_FAILURE() << "tables of more than 2^32 rows were accepted";
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("2^32 rows"), std::string::npos) << e.what();
    }
  }
  void build_use_destroy(int i) {
    const char* precision = i % 2 ? "bf16" : "fp32";
    auto m = make_graph_cuda(cfg.model, cfg.optimizer, good, Device::cuda(0), 7, precision);
    for (int step = 0; step < 3; ++step)
      m->train_step(testing::make_batch(good, 64, 10 + step, true), 1.0, false);
    io::Batch b = testing::make_batch(good, 5, 99, false);
    EXPECT_EQ(m->forward(b, false).numel(), 5);
    // Serving too: the bucketed graphs, in bf16 the fused small-batch kernel for the DLRM.
    std::vector<float> p(5);
    m->predict(b, p.data());
  }
};

TEST(GpuResourcesLeak, ThousandFailedGraphBuildsLeakNothing) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: the leak test needs a GPU";
  auto res = gpu::DeviceResources::get(0);
  for (const char* layers : {testing::kDlrm, testing::kDcnStacked, testing::kDeepFmGathered}) {
    GraphLeakCase s(layers);
    for (int i = 0; i < 4; ++i) s.build_use_destroy(i);
    for (int i = 0; i < 10; ++i) s.fail_once(i);
    const Snapshot before = snapshot();
    for (int i = 0; i < 1000; ++i) {
      s.fail_once(i);
      if (HasFatalFailure()) return;
    }
    const Snapshot after = snapshot();
    expect_flat(before, after, (std::string("1000 failed builds of ") + layers).c_str());
    // Four streams per build, created before it threw: the failure was late.
    EXPECT_EQ(after.counts.streams_created - before.counts.streams_created, 4000);
    EXPECT_LE(res->blas_pool_size(), 4u) << "failed builds must return their cuBLAS handles";
    EXPECT_LE(res->lt_pool_size(), 4u) << "failed builds must return their cuBLASLt handles";
  }
}

TEST(GpuResourcesLeak, GraphModelsBuiltAndDestroyedLeakNothing) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: the leak test needs a GPU";
  auto res = gpu::DeviceResources::get(0);
  for (const char* layers : {testing::kDlrm, testing::kDcnStacked, testing::kDeepFmGathered}) {
    GraphLeakCase s(layers);
    // A longer warm-up: run alone in a fresh process (compute-sanitizer, H200,
    // 2026-11-26), 4 builds left the pool 1 KiB short of its fixed point (cached bytes +1024
    // after the 40 builds, live bytes exact): its best-fit free lists take a few rounds of both
    // precisions to settle.
    for (int i = 0; i < 12; ++i) s.build_use_destroy(i);
    const Snapshot before = snapshot();
    for (int i = 0; i < 40; ++i) s.build_use_destroy(i);
    expect_flat(before, snapshot(), "40 graph models built, trained and destroyed");
  }
}

TEST(GpuResourcesLeak, LastHolderReleasesTheDeviceResources) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: the leak test needs a GPU";
  GraphLeakCase s(testing::kDlrm);
  s.build_use_destroy(1);
  // Nobody holds the device's resources now (this test runs alone in its process or after
  // tests that let theirs go): the handles are gone, also after failed builds.
  const gpu::LiveCounts idle = gpu::live_counts();
  for (int i = 0; i < 50; ++i) s.fail_once(i);
  GraphLeakCase g(testing::kDcnStacked);
  for (int i = 0; i < 50; ++i) g.fail_once(i);
  const gpu::LiveCounts after = gpu::live_counts();
  EXPECT_EQ(after.blas, idle.blas);
  EXPECT_EQ(after.blas_lt, idle.blas_lt);
  EXPECT_EQ(after.streams, idle.streams);
  EXPECT_EQ(after.events, idle.events);
}

#else

TEST(GpuResourcesLeak, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA: the leak test needs a GPU";
}

#endif

}  // namespace
}  // namespace dlrec::model
