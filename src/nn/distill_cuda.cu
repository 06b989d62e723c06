// The distillation loss on the device (nn/dense_cuda.h, distill_with_logits); the CPU
// reference is compress::distill_loss (src/compress/qat.cc), computed here the same way in
// double precision, one block.
#include "core/cuda_check.h"
#include "nn/dense_cuda.h"

namespace dlrec::nn::cuda_dense {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ double sigmoid_d(double v) {
  return v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v));
}
// Stable BCE of a logit v against a target p.
__device__ __forceinline__ double bce_d(double v, double p) {
  return fmax(v, 0.0) - v * p + log1p(exp(-fabs(v)));
}

__global__ void distill_kernel(const float* __restrict__ z, const float* __restrict__ y,
                               const float* __restrict__ t, int64_t n, double alpha, double T,
                               float* __restrict__ dz, double* loss) {
  __shared__ double part[kThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double zi = z[i], soft = sigmoid_d(static_cast<double>(t[i]) / T);
    s += alpha * bce_d(zi, y[i]) + (1 - alpha) * bce_d(zi / T, soft);
    dz[i] = static_cast<float>(
        (alpha * (sigmoid_d(zi) - y[i]) + (1 - alpha) * (sigmoid_d(zi / T) - soft) / T) / n);
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] / n;
}

}  // namespace

void distill_with_logits(const float* logits, const float* labels, const float* teacher,
                         int64_t n, double alpha, double temperature, float* dlogits,
                         double* loss, cudaStream_t stream) {
  if (n == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), stream));
    return;
  }
  distill_kernel<<<1, kThreads, 0, stream>>>(logits, labels, teacher, n, alpha, temperature,
                                             dlogits, loss);
  DLREC_CUDA_LAUNCH_CHECK();
}

}  // namespace dlrec::nn::cuda_dense
