// Tensor copies and fills on a CUDA device are complete when they return (src/core/device_cuda.cu),
// even while the default stream is busy: a kernel on a non-blocking stream (every engine's
// streams are), which does not wait for the default stream, reads what they wrote. Before, a
// fill or a device-to-device copy queued behind the default stream's work and returned at once,
// and a pageable host-to-device copy returned once staged (most likely how a distillation
// teacher's serving offsets were read before they landed while the student's step kept the GPU
// busy: an illegal address).
// Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/gpu_resources.h"
#include "dlrec/core/tensor.h"

namespace dlrec {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Keeps the default stream busy for tens of milliseconds.
void busy_default_stream() {
  spin_kernel<<<1, 1, 0, 0>>>(100'000'000LL);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

// The tensor's values as a kernel on a non-blocking stream sees them now.
std::vector<float> read_on_side_stream(const Tensor& t, const gpu::Stream& s) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  EXPECT_EQ(cudaMemcpyAsync(h.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, s.get()),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  return h;
}

TEST(DeviceCopy, CopiesAndFillsAreCompleteOnReturn) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: device copies not run";
  const Device gpu = Device::cuda(0);
  const int64_t n = 1 << 16;
  const gpu::Stream side(0);
  const Tensor ones = Tensor::from_vector(std::vector<float>(n, 1.f), {n}, gpu);
  const Tensor sevens = Tensor::from_vector(std::vector<float>(n, 7.f), {n}, gpu);

  Tensor z = ones.clone();
  busy_default_stream();
  z.zero_();
  for (float v : read_on_side_stream(z, side)) ASSERT_EQ(v, 0.f) << "zero_ returned unfinished";

  Tensor d = ones.clone();
  busy_default_stream();
  d.copy_from(sevens);  // device to device
  for (float v : read_on_side_stream(d, side)) ASSERT_EQ(v, 7.f) << "a device copy returned unfinished";

  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  Tensor h = ones.clone();
  busy_default_stream();
  h.copy_from(Tensor::from_vector(host, {n}));  // pageable host to device
  EXPECT_EQ(read_on_side_stream(h, side), host);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace dlrec
