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
// One block of rows of a multi-table write (offsets into the uploaded rows and floats).
struct BlockDesc {
  int64_t n, row_offset, src_offset;
  int32_t table, pad;
};
// Every block of a write: blockIdx.y is the block, the x blocks stride over its n x dim values;
// a value goes to its row, and to its `also` row where that is >= 0.
__global__ void scatter_blocks_kernel(float* const* __restrict__ tables,
                                      const int64_t* __restrict__ dims,
                                      const BlockDesc* __restrict__ descs,
                                      const int64_t* __restrict__ rows,
                                      const int64_t* __restrict__ also,
                                      const float* __restrict__ src) {
  const BlockDesc d = descs[blockIdx.y];
  const int64_t dim = dims[d.table];
  float* table = tables[d.table];
  const int64_t* r = rows + d.row_offset;
  const int64_t* a = also + d.row_offset;
  const float* s = src + d.src_offset;
  const int64_t total = d.n * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = i / dim, c = i - k * dim;
    const float v = s[i];
    table[r[k] * dim + c] = v;
    if (a[k] >= 0) table[a[k] * dim + c] = v;
  }
}

class CudaRows final : public DeviceRows {
 public:
  CudaRows(int device, std::vector<float*> tables, std::vector<int64_t> dims,
           std::vector<int64_t> table_rows, cudaStream_t model_stream)
      : device_(device),
        tables_(std::move(tables)),
        dims_(std::move(dims)),
        table_rows_(std::move(table_rows)),
        stream_(model_stream),
        own_stream_(model_stream == nullptr) {
    DLREC_CHECK(tables_.size() == dims_.size() && dims_.size() == table_rows_.size(),
                "gpu cache: tables, dims and rows differ in count (bug)");
    Guard g(device_);
    if (own_stream_) DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The tables' pointers and dims on the device, once (the multi-table kernel reads them).
    const size_t T = tables_.size();
    DLREC_CUDA_CHECK(cudaMalloc(&d_tables_, T * (sizeof(float*) + sizeof(int64_t)) + 16));
    d_dims_ = reinterpret_cast<int64_t*>(d_tables_ + T);
    DLREC_CUDA_CHECK(
        cudaMemcpy(d_tables_, tables_.data(), T * sizeof(float*), cudaMemcpyHostToDevice));
    DLREC_CUDA_CHECK(
        cudaMemcpy(d_dims_, dims_.data(), T * sizeof(int64_t), cudaMemcpyHostToDevice));
    // Landed before a kernel on stream_ (non-blocking: it does not wait for these copies).
    DLREC_CUDA_CHECK(cudaStreamSynchronize(0));
  }
  ~CudaRows() override {
    Guard g(device_);
    if (own_stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    } else if (pending_) {
      cudaDeviceSynchronize();  // the model (and its stream) may be gone before the buffers
    }
    if (host_) cudaFreeHost(host_);
    if (dev_) cudaFree(dev_);
    if (d_tables_) cudaFree(d_tables_);
    if (values_host_) cudaFreeHost(values_host_);
    if (values_dev_) cudaFree(values_dev_);
  }

  void write(int table, const int64_t* rows, int64_t n, const float* data) override {
    DLREC_CHECK(table >= 0 && table < static_cast<int>(tables_.size()), "gpu cache: table ", table,
                " of ", tables_.size());
    write(std::vector<RowBlock>{{table, n, dims_[table], rows, data}});
  }

  float* values_buffer(int64_t floats) override {
    Guard g(device_);
    settle();  // a write_ahead may still read the buffer
    reserve_values(sizeof(float) * static_cast<size_t>(std::max<int64_t>(floats, 1)));
    return values_host_;
  }

  // All blocks in one copy (descriptors, rows, also-rows, then the row values) and one kernel;
  // synchronous like the single-table write.
  void write(const std::vector<RowBlock>& blocks) override {
    enqueue(blocks);
    settle();
  }
  // On the model's stream: enqueued, not waited for (the model's forward follows it there).
  void write_ahead(const std::vector<RowBlock>& blocks) override {
    enqueue(blocks);
    if (own_stream_) settle();
  }
  void settle() override {
    if (!pending_) return;
    Guard g(device_);
    pending_ = false;
    DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void enqueue(const std::vector<RowBlock>& blocks) {
    std::vector<BlockDesc> descs;
    int64_t n_rows = 0, n_floats = 0;
    for (const RowBlock& b : blocks) {
      if (b.n <= 0) continue;
      DLREC_CHECK(b.table >= 0 && b.table < static_cast<int>(tables_.size()), "gpu cache: table ",
                  b.table, " of ", tables_.size());
      DLREC_CHECK(b.dim == dims_[b.table], "gpu cache: ", b.dim, " floats per row for table ",
                  b.table, " of ", dims_[b.table], " (bug)");
      const int64_t limit = table_rows_[b.table];
      for (int64_t i = 0; i < b.n; ++i)
        DLREC_CHECK(b.rows[i] >= 0 && b.rows[i] < limit && (!b.also || b.also[i] < limit),
                    "gpu cache: device row ", b.rows[i], " or ", b.also ? b.also[i] : -1,
                    " beyond the ", limit, " rows of table ", b.table, " (bug)");
      descs.push_back({b.n, n_rows, n_floats, b.table, 0});
      n_rows += b.n;
      n_floats += b.n * b.dim;
    }
    if (descs.empty()) return;
    settle();  // the previous write's host buffers are about to be reused
    auto round16 = [](size_t x) { return (x + 15) / 16 * 16; };
    const size_t desc_bytes = round16(sizeof(BlockDesc) * descs.size());
    const size_t idx_bytes = round16(sizeof(int64_t) * static_cast<size_t>(n_rows));
    const size_t meta_bytes = desc_bytes + 2 * idx_bytes;
    const size_t value_bytes = sizeof(float) * static_cast<size_t>(n_floats);
    Guard g(device_);
    reserve(meta_bytes);
    char* h = static_cast<char*>(host_);
    std::memcpy(h, descs.data(), sizeof(BlockDesc) * descs.size());
    auto* h_rows = reinterpret_cast<int64_t*>(h + desc_bytes);
    auto* h_also = reinterpret_cast<int64_t*>(h + desc_bytes + idx_bytes);
    // The values: where the caller fetched them into values_buffer() block after block, as
    // they are; else copied there.
    bool in_place = values_cap_ >= value_bytes;
    {
      size_t k = 0;
      for (const RowBlock& b : blocks)
        if (b.n > 0) in_place = in_place && b.data == values_host_ + descs[k++].src_offset;
    }
    if (!in_place) reserve_values(value_bytes);
    size_t k = 0;
    for (const RowBlock& b : blocks) {
      if (b.n <= 0) continue;
      const BlockDesc& d = descs[k++];
      std::memcpy(h_rows + d.row_offset, b.rows, sizeof(int64_t) * static_cast<size_t>(b.n));
      if (b.also)
        std::memcpy(h_also + d.row_offset, b.also, sizeof(int64_t) * static_cast<size_t>(b.n));
      else
        std::fill_n(h_also + d.row_offset, b.n, int64_t{-1});
      if (!in_place)  // (memmove: a caller's block may lie in the buffer elsewhere)
        std::memmove(values_host_ + d.src_offset, b.data,
                     sizeof(float) * static_cast<size_t>(b.n * b.dim));
    }
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, meta_bytes, cudaMemcpyHostToDevice, stream_));
    DLREC_CUDA_CHECK(
        cudaMemcpyAsync(values_dev_, values_host_, value_bytes, cudaMemcpyHostToDevice, stream_));
    char* dv = static_cast<char*>(dev_);
    int64_t widest = 0;
    for (const BlockDesc& d : descs) widest = std::max(widest, d.n * dims_[d.table]);
    const int threads = 256;
    const dim3 grid(
        static_cast<unsigned>(std::min<int64_t>((widest + threads - 1) / threads, 1024)),
        static_cast<unsigned>(descs.size()));
    scatter_blocks_kernel<<<grid, threads, 0, stream_>>>(
        d_tables_, d_dims_, reinterpret_cast<const BlockDesc*>(dv),
        reinterpret_cast<const int64_t*>(dv + desc_bytes),
        reinterpret_cast<const int64_t*>(dv + desc_bytes + idx_bytes), values_dev_);
    DLREC_CUDA_CHECK(cudaGetLastError());
    pending_ = true;
  }
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
  void reserve_values(size_t bytes) {
    if (bytes <= values_cap_) return;
    size_t cap = values_cap_ ? values_cap_ : (size_t{1} << 20);
    while (cap < bytes) cap *= 2;
    if (values_host_) DLREC_CUDA_CHECK(cudaFreeHost(values_host_));
    if (values_dev_) DLREC_CUDA_CHECK(cudaFree(values_dev_));
    values_host_ = values_dev_ = nullptr;
    values_cap_ = 0;
    DLREC_CUDA_CHECK(cudaMallocHost(&values_host_, cap));
    DLREC_CUDA_CHECK(cudaMalloc(&values_dev_, cap));
    values_cap_ = cap;
  }
  int device_;
  std::vector<float*> tables_;
  std::vector<int64_t> dims_, table_rows_;
  cudaStream_t stream_ = nullptr;  // the model's serving stream, or one of its own
  bool own_stream_ = true;
  bool pending_ = false;  // a write enqueued and not yet waited for
  void* host_ = nullptr;  // pinned: ids then rows of one write
  void* dev_ = nullptr;
  size_t cap_ = 0;
  float* values_host_ = nullptr;  // pinned: the row values of one write
  float* values_dev_ = nullptr;
  size_t values_cap_ = 0;
  float** d_tables_ = nullptr;  // the tables' pointers, then d_dims_ (one allocation)
  int64_t* d_dims_ = nullptr;
};
}  // namespace

std::unique_ptr<DeviceRows> make_cuda_rows(int device, std::vector<float*> tables,
                                           std::vector<int64_t> dims,
                                           std::vector<int64_t> table_rows, void* stream) {
  return std::make_unique<CudaRows>(device, std::move(tables), std::move(dims),
                                    std::move(table_rows), static_cast<cudaStream_t>(stream));
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
