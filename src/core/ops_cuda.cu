// CUDA implementations of the element-wise ops in dlrec/core/ops.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "core/cuda_check.h"

namespace dlrec::ops::cuda_impl {

namespace {
__global__ void axpy_kernel(float alpha, const float* __restrict__ x, float* __restrict__ y,
                            int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += alpha * x[i];
}

__global__ void sum_kernel(const float* __restrict__ x, int64_t n, double* out) {
  __shared__ double partial[256];
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    s += x[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

int blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}
}  // namespace

void axpy(float alpha, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  axpy_kernel<<<blocks_for(n, 256), 256>>>(alpha, x, y, n);
  DLREC_CUDA_LAUNCH_CHECK();
  DLREC_CUDA_CHECK(cudaDeviceSynchronize());
}

double sum(const float* x, int64_t n) {
  double* d = nullptr;
  DLREC_CUDA_CHECK(cudaMalloc(&d, sizeof(double)));
  // Freed however this returns (the checks below throw).
  const std::unique_ptr<double, cudaError_t (*)(void*)> owner(d, cudaFree);
  DLREC_CUDA_CHECK(cudaMemset(d, 0, sizeof(double)));
  if (n > 0) {
    sum_kernel<<<blocks_for(n, 256), 256>>>(x, n, d);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  double h = 0;
  DLREC_CUDA_CHECK(cudaMemcpy(&h, d, sizeof(double), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace dlrec::ops::cuda_impl
