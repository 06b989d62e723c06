// The GPU cache tier's device writes (include/dlrec/store/gpu_cache.h): rows fetched from the
// tiers below go into the model's device tables by slot, in one copy and one scatter kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/cuda_check.h"
#include "dlrec/core/error.h"
#include "dlrec/store/gpu_cache.h"

namespace dlrec::store {

namespace {
// table[rows[i]] = src[i] for i < n (rows of `dim` floats): one thread per float of a row
// (grid-stride over the n x dim values).
__global__ void scatter_rows_kernel(float* __restrict__ table, const int64_t* __restrict__ rows,
                                    const float* __restrict__ src, int64_t n, int64_t dim) {
  const int64_t total = n * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, c = i - r * dim;
    table[rows[r] * dim + c] = src[i];
  }
}

class CudaRows final : public DeviceRows {
 public:
  CudaRows(int device, std::vector<float*> tables, std::vector<int64_t> dims,
           std::vector<int64_t> table_rows)
      : device_(device),
        tables_(std::move(tables)),
        dims_(std::move(dims)),
        table_rows_(std::move(table_rows)) {
    DLREC_CHECK(tables_.size() == dims_.size() && dims_.size() == table_rows_.size(),
                "gpu cache: tables, dims and rows differ in count (bug)");
    Guard g(device_);
    DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaRows() override {
    Guard g(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    if (host_) cudaFreeHost(host_);
    if (dev_) cudaFree(dev_);
  }

  // Synchronous: the rows are on the device when it returns (the engine's next forward, on its
  // own stream, reads them).
  void write(int table, const int64_t* rows, int64_t n, const float* data) override {
    if (n <= 0) return;
    DLREC_CHECK(table >= 0 && table < static_cast<int>(tables_.size()), "gpu cache: table ", table,
                " of ", tables_.size());
    const int64_t dim = dims_[table], limit = table_rows_[table];
    for (int64_t i = 0; i < n; ++i)
      DLREC_CHECK(rows[i] >= 0 && rows[i] < limit, "gpu cache: device row ", rows[i],
                  " beyond the ", limit, " rows of table ", table, " (bug)");
    const size_t idx_bytes = sizeof(int64_t) * static_cast<size_t>(n);
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(n * dim);
    const size_t bytes = idx_bytes + row_bytes;
    Guard g(device_);
    reserve(bytes);
    std::memcpy(host_, rows, idx_bytes);
    std::memcpy(static_cast<char*>(host_) + idx_bytes, data, row_bytes);
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, bytes, cudaMemcpyHostToDevice, stream_));
    const auto* d_rows = static_cast<const int64_t*>(dev_);
    const auto* d_src = reinterpret_cast<const float*>(static_cast<char*>(dev_) + idx_bytes);
    const int64_t total = n * dim;
    const int threads = 256;
    const auto blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads, 4096));
    scatter_rows_kernel<<<blocks, threads, 0, stream_>>>(tables_[table], d_rows, d_src, n, dim);
    DLREC_CUDA_CHECK(cudaGetLastError());
    DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  struct Guard {
    int prev = 0;
    explicit Guard(int d) {
      cudaGetDevice(&prev);
      cudaSetDevice(d);
    }
    ~Guard() { cudaSetDevice(prev); }
  };
  void reserve(size_t bytes) {
    if (bytes <= cap_) return;
    size_t cap = cap_ ? cap_ : (size_t{1} << 20);
    while (cap < bytes) cap *= 2;
    if (host_) DLREC_CUDA_CHECK(cudaFreeHost(host_));
    if (dev_) DLREC_CUDA_CHECK(cudaFree(dev_));
    host_ = nullptr;
    dev_ = nullptr;
    cap_ = 0;
    DLREC_CUDA_CHECK(cudaMallocHost(&host_, cap));
    DLREC_CUDA_CHECK(cudaMalloc(&dev_, cap));
    cap_ = cap;
  }
  int device_;
  std::vector<float*> tables_;
  std::vector<int64_t> dims_, table_rows_;
  cudaStream_t stream_ = nullptr;
  void* host_ = nullptr;  // pinned: ids then rows of one write
  void* dev_ = nullptr;
  size_t cap_ = 0;
};
}  // namespace

std::unique_ptr<DeviceRows> make_cuda_rows(int device, std::vector<float*> tables,
                                           std::vector<int64_t> dims,
                                           std::vector<int64_t> table_rows) {
  return std::make_unique<CudaRows>(device, std::move(tables), std::move(dims),
                                    std::move(table_rows));
}

void cuda_memory_info(int device, int64_t* free_bytes, int64_t* total_bytes) {
  int prev = 0;
  DLREC_CUDA_CHECK(cudaGetDevice(&prev));
  DLREC_CUDA_CHECK(cudaSetDevice(device));
  size_t f = 0, t = 0;
  const cudaError_t e = cudaMemGetInfo(&f, &t);
  cudaSetDevice(prev);
  DLREC_CUDA_CHECK(e);
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
}

}  // namespace dlrec::store
