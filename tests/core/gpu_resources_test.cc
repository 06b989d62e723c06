// GPU resources (include/dlrec/core/gpu_resources.h): one owner each, pooled cuBLAS handles,
// and a clear error without CUDA.
#include "dlrec/core/gpu_resources.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/error.h"

namespace dlrec::gpu {
namespace {

bool have_gpu() { return cuda::built_with_cuda() && cuda::device_count() > 0; }

TEST(GpuResources, WithoutCudaEveryCreationSaysWhy) {
  if (cuda::built_with_cuda()) GTEST_SKIP() << "CUDA build: the stub is not compiled in";
  for (auto make : std::vector<std::function<void()>>{[] { DeviceResources::get(0); },
                                                      [] { Stream s(0); }, [] { Event e(0); }}) {
    try {
      make();
      FAIL() << "no error without CUDA";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
    }
  }
  // Empty objects need no device.
  Stream s;
  Event e;
  GraphExec g;
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_FALSE(static_cast<bool>(e));
  EXPECT_FALSE(static_cast<bool>(g));
}

TEST(GpuResources, BadDeviceIsAClearError) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  EXPECT_THROW(DeviceResources::get(cuda::device_count()), Error);
  EXPECT_THROW(Stream(-1), Error);
}

TEST(GpuResources, StreamsAndEventsAreCountedAndReleased) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const LiveCounts before = live_counts();
  {
    Stream a(0), b(0);
    Event e(0), t(0, /*timing=*/true);
    EXPECT_EQ(live_counts().streams, before.streams + 2);
    EXPECT_EQ(live_counts().events, before.events + 2);
    Stream c = std::move(a);  // moved: one owner, nothing doubled
    EXPECT_FALSE(static_cast<bool>(a));
    EXPECT_TRUE(static_cast<bool>(c));
    b = std::move(c);  // b's old stream released
    EXPECT_EQ(live_counts().streams, before.streams + 1);
  }
  EXPECT_EQ(live_counts().streams, before.streams);
  EXPECT_EQ(live_counts().events, before.events);
}

TEST(GpuResources, OnePerDeviceAndHandlesArePooled) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto r1 = DeviceResources::get(0);
  auto r2 = DeviceResources::get(0);
  EXPECT_EQ(r1.get(), r2.get());
  EXPECT_GT(r1->sm_count(), 0);
  Stream s(0);
  const size_t pool0 = r1->blas_pool_size();
  {
    BlasLease a = r1->blas(s, false);
    BlasLease b = r1->blas(s, true);
    EXPECT_NE(a.get(), b.get());  // two live lessees never share a handle
    LtLease l = r1->blas_lt();
    EXPECT_TRUE(static_cast<bool>(l));
    EXPECT_EQ(l.workspace_bytes(), DeviceResources::kWorkspaceBytes);
  }
  const size_t pool1 = r1->blas_pool_size();
  EXPECT_LE(pool1, pool0 + 2);
  for (int i = 0; i < 100; ++i) {  // returned handles are reused: the pool does not grow
    BlasLease a = r1->blas(s, false);
    BlasLease b = r1->blas(s, false);
  }
  EXPECT_EQ(r1->blas_pool_size(), pool1);
}

TEST(GpuResources, GetIsThreadSafe) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::shared_ptr<DeviceResources>> got(8);
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i) th.emplace_back([&got, i] { got[i] = DeviceResources::get(0); });
  for (auto& t : th) t.join();
  for (auto& g : got) EXPECT_EQ(g.get(), got[0].get());
}

}  // namespace
}  // namespace dlrec::gpu
