// CUDA kernels for the dense layers of the DLRM; see dense_cuda.h.
#include "nn/dense_cuda.h"

#include "core/cuda_check.h"

namespace dlrec::nn::cuda_dense {
namespace {

int grid_for(int64_t n, int threads, int cap = 65536) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

__global__ void bias_act_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t n,
                                int64_t out, bool relu) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = y[i] + b[i % out];
    y[i] = relu ? fmaxf(v, 0.f) : v;
  }
}

// float4 version for out % 4 == 0 and fewer than 2^31 vectors (32-bit index arithmetic).
__global__ void bias_act4_kernel(float4* __restrict__ y, const float4* __restrict__ b, int n4,
                                 int out4, bool relu) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    float4 v = y[i];
    const float4 c = b[i % out4];
    v.x += c.x; v.y += c.y; v.z += c.z; v.w += c.w;
    if (relu) {
      v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    }
    y[i] = v;
  }
}

// dz = dy masked by y > 0 (when y is given) and, per chunk of kBgradRows rows, the column sums
// of dz: block (32, 8) covers 32 columns of one chunk, rows summed in a fixed order.
constexpr int kBgradRows = 256;
__global__ void mask_bgrad_kernel(const float* __restrict__ dy, const float* __restrict__ y,
                                  float* __restrict__ dz, float* __restrict__ partial, int64_t B,
                                  int out) {
  __shared__ float red[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kBgradRows;
  const int64_t r1 = min(B, r0 + kBgradRows);
  float acc = 0.f;
  if (col < out) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * out + col;
      float v = dy[i];
      if (y) {
        v = y[i] > 0.f ? v : 0.f;
        dz[i] = v;
      }
      acc += v;
    }
  }
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    float s = red[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) s += red[k][threadIdx.x];
    partial[int64_t(blockIdx.y) * out + col] = s;
  }
}

__global__ void sum_partials_kernel(const float* __restrict__ partial, int chunks, int out,
                                    float* __restrict__ db) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= out) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partial[int64_t(c) * out + col];
  db[col] = s;
}

__global__ void relu_mask_kernel(const float* __restrict__ dy, const float* __restrict__ y,
                                 float* __restrict__ dz, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dz[i] = y[i] > 0.f ? dy[i] : 0.f;
}

// Row i, column j (j < i) of pair q of the strict lower triangle in row-major order.
__device__ __forceinline__ void pair_of(int q, int& i, int& j) {
  i = static_cast<int>((1.f + sqrtf(8.f * q + 1.f)) * 0.5f);
  while (i * (i - 1) / 2 > q) --i;
  while ((i + 1) * i / 2 <= q) ++i;
  j = q - i * (i - 1) / 2;
}

// One block per sample; Z in shared memory with rows padded by one float (no bank conflicts
// between threads reading different rows at the same k).
__global__ void dot_forward_kernel(const float* __restrict__ dense, const float* __restrict__ emb,
                                   int T, int d, float* __restrict__ out) {
  extern __shared__ float z[];
  const int64_t b = blockIdx.x;
  const int n = T + 1, ld = d + 1;
  const int64_t F = d + int64_t(n) * (n - 1) / 2;
  const float* zd = dense + b * d;
  const float* ze = emb + b * int64_t(T) * d;
  float* o = out + b * F;
  for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
    const int r = e / d, k = e - r * d;
    const float v = r == 0 ? zd[k] : ze[(r - 1) * d + k];
    z[r * ld + k] = v;
    if (r == 0) o[k] = v;
  }
  __syncthreads();
  const int pairs = n * (n - 1) / 2;
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    int i, j;
    pair_of(q, i, j);
    const float* zi = z + i * ld;
    const float* zj = z + j * ld;
    float acc = 0.f;
    for (int k = 0; k < d; ++k) acc = __fadd_rn(acc, __fmul_rn(zi[k], zj[k]));
    o[d + q] = acc;
  }
}

__global__ void dot_backward_kernel(const float* __restrict__ dense, const float* __restrict__ emb,
                                    const float* __restrict__ dout, int T, int d,
                                    float* __restrict__ d_dense, float* __restrict__ d_emb) {
  extern __shared__ float sm[];
  const int64_t b = blockIdx.x;
  const int n = T + 1, ld = d + 1;
  float* z = sm;
  float* g = sm + n * ld;  // [n, n] symmetric, zero diagonal
  const int64_t F = d + int64_t(n) * (n - 1) / 2;
  const float* zd = dense + b * d;
  const float* ze = emb + b * int64_t(T) * d;
  const float* gb = dout + b * F;
  for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
    const int r = e / d, k = e - r * d;
    z[r * ld + k] = r == 0 ? zd[k] : ze[(r - 1) * d + k];
  }
  for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
    const int i = e / n, j = e - i * n;
    float v = 0.f;
    if (j < i) v = gb[d + i * (i - 1) / 2 + j];
    else if (i < j) v = gb[d + j * (j - 1) / 2 + i];
    g[e] = v;
  }
  __syncthreads();
  // dZ_m = sum_{j != m} G_mj Z_j, j ascending (the CPU's order of accumulation).
  for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
    const int m = e / d, k = e - m * d;
    float acc = 0.f;
    for (int j = 0; j < n; ++j)
      if (j != m) acc = __fadd_rn(acc, __fmul_rn(g[m * n + j], z[j * ld + k]));
    if (m == 0) d_dense[b * d + k] = gb[k] + acc;
    else d_emb[(b * T + (m - 1)) * int64_t(d) + k] = acc;
  }
}

__global__ void cat_forward_kernel(const float* __restrict__ dense, const float* __restrict__ emb,
                                   int64_t B, int dd, int64_t E, float* __restrict__ out) {
  const int64_t F = dd + E, n = B * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / F, c = i - b * F;
    out[i] = c < dd ? dense[b * dd + c] : emb[b * E + (c - dd)];
  }
}

__global__ void cat_backward_kernel(const float* __restrict__ dout, int64_t B, int dd, int64_t E,
                                    float* __restrict__ d_dense, float* __restrict__ d_emb) {
  const int64_t F = dd + E, n = B * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / F, c = i - b * F;
    if (c < dd) d_dense[b * dd + c] = dout[i];
    else d_emb[b * E + (c - dd)] = dout[i];
  }
}

constexpr int kBceThreads = 1024;

// One block: deterministic (fixed tree) reduction of the loss in double.
__global__ void bce_kernel(const float* __restrict__ logits, const float* __restrict__ labels,
                           int64_t n, float* __restrict__ dlogits, double* loss) {
  __shared__ double part[kBceThreads];
  const double inv_n = 1.0 / static_cast<double>(n);
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double z = logits[i], y = labels[i];
    s += fmax(z, 0.0) - z * y + log1p(exp(-fabs(z)));
    const double p = z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
    dlogits[i] = static_cast<float>((p - y) * inv_n);
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] * inv_n;
}

__global__ void sgd_kernel(float* __restrict__ w, const float* __restrict__ g, int64_t n,
                           float lr) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, g[i]));
}

__global__ void adagrad_kernel(float* __restrict__ w, const float* __restrict__ g,
                               float* __restrict__ a, int64_t n, float lr, float eps) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float acc = __fadd_rn(a[i], __fmul_rn(gi, gi));
    a[i] = acc;
    w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr, gi), __fadd_rn(sqrtf(acc), eps)));
  }
}

}  // namespace

void bias_act(float* y, const float* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  const int64_t n = B * out;
  if (n == 0) return;
  if (out % 4 == 0 && n / 4 < (int64_t{1} << 31)) {
    const int n4 = static_cast<int>(n / 4);
    bias_act4_kernel<<<grid_for(n4, 256), 256, 0, stream>>>(
        reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(b), n4,
        static_cast<int>(out / 4), relu);
  } else {
    bias_act_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, b, n, out, relu);
  }
  DLREC_CUDA_LAUNCH_CHECK();
}

int64_t bias_grad_chunks(int64_t B) { return (B + kBgradRows - 1) / kBgradRows; }

void mask_bias_grad(const float* dy, const float* y, float* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  if (out == 0) return;
  const int64_t chunks = bias_grad_chunks(B);
  if (chunks == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * out, stream));
    return;
  }
  DLREC_CHECK(chunks < 65536, "mask_bias_grad: batch of ", B, " rows is too large");
  dim3 grid(static_cast<unsigned>((out + 31) / 32), static_cast<unsigned>(chunks));
  mask_bgrad_kernel<<<grid, dim3(32, 8), 0, stream>>>(dy, y, dz, partial, B,
                                                       static_cast<int>(out));
  DLREC_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<static_cast<unsigned>((out + 127) / 128), 128, 0, stream>>>(
      partial, static_cast<int>(chunks), static_cast<int>(out), db);
  DLREC_CUDA_LAUNCH_CHECK();
}

void relu_mask(const float* dy, const float* y, float* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}

namespace {
// Kernels needing more than 48 KB of dynamic shared memory must opt in.
int smem_limit_checked(size_t bytes, const void* fn) {
  if (bytes > 48 * 1024)
    DLREC_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
  return static_cast<int>(bytes);
}
}  // namespace

void dot_forward(const float* dense, const float* emb, int64_t B, int T, int d, float* out,
                 cudaStream_t stream) {
  if (B == 0) return;
  const size_t smem = sizeof(float) * size_t(T + 1) * (d + 1);
  smem_limit_checked(smem, reinterpret_cast<const void*>(dot_forward_kernel));
  dot_forward_kernel<<<static_cast<unsigned>(B), 128, smem, stream>>>(dense, emb, T, d, out);
  DLREC_CUDA_LAUNCH_CHECK();
}

void dot_backward(const float* dense, const float* emb, const float* dout, int64_t B, int T, int d,
                  float* d_dense, float* d_emb, cudaStream_t stream) {
  if (B == 0) return;
  const size_t n = T + 1;
  const size_t smem = sizeof(float) * (n * (d + 1) + n * n);
  smem_limit_checked(smem, reinterpret_cast<const void*>(dot_backward_kernel));
  dot_backward_kernel<<<static_cast<unsigned>(B), 128, smem, stream>>>(dense, emb, dout, T, d,
                                                                       d_dense, d_emb);
  DLREC_CUDA_LAUNCH_CHECK();
}

void cat_forward(const float* dense, const float* emb, int64_t B, int dd, int64_t E, float* out,
                 cudaStream_t stream) {
  const int64_t n = B * (dd + E);
  if (n == 0) return;
  cat_forward_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dense, emb, B, dd, E, out);
  DLREC_CUDA_LAUNCH_CHECK();
}

void cat_backward(const float* dout, int64_t B, int dd, int64_t E, float* d_dense, float* d_emb,
                  cudaStream_t stream) {
  const int64_t n = B * (dd + E);
  if (n == 0) return;
  cat_backward_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dout, B, dd, E, d_dense, d_emb);
  DLREC_CUDA_LAUNCH_CHECK();
}

void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream) {
  if (n == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), stream));
    return;
  }
  bce_kernel<<<1, kBceThreads, 0, stream>>>(logits, labels, n, dlogits, loss);
  DLREC_CUDA_LAUNCH_CHECK();
}

void optimizer_step(float* w, const float* g, float* state, int64_t n, float lr, float eps,
                    cudaStream_t stream) {
  if (n == 0) return;
  if (state)
    adagrad_kernel<<<grid_for(n, 256), 256, 0, stream>>>(w, g, state, n, lr, eps);
  else
    sgd_kernel<<<grid_for(n, 256), 256, 0, stream>>>(w, g, n, lr);
  DLREC_CUDA_LAUNCH_CHECK();
}

}  // namespace dlrec::nn::cuda_dense
