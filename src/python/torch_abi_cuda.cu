// The CUDA collection of torch_abi.h: fixed tables of one width and one pooling on one GPU,
// looked up and updated by the CUDA engine's fused kernels (nn/embedding_cuda.h: pooled
// forward, de-duplicated backward with the SGD, Adagrad, row-wise Adagrad or Adam update fused
// in), on the caller's stream. The only work of its own is turning PyTorch's int64 offsets and
// table-local ids into the kernels' int32 offsets and uint32 global rows, checking every id and
// offset on the way (the first bad one is reported by dlrec_emb_check).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/cuda_check.h"
#include "nn/embedding_cuda.h"
#include "python/torch_abi.h"

namespace dlrec::torch_abi {
namespace {

namespace ce = nn::cuda_emb;

// err: {code, bag, value, position}; code 1 id out of range, 2 offset outside the ids,
// 3 last offset != nnz, 4 offsets decrease. Only the first report is kept.
__device__ void report(unsigned long long* err, int code, int64_t bag, int64_t value, int64_t pos) {
  if (atomicCAS(err, 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    err[1] = static_cast<unsigned long long>(bag);
    err[2] = static_cast<unsigned long long>(value);
    err[3] = static_cast<unsigned long long>(pos);
  }
}

// One thread per bag (and one for the end offset). Positions a bag reads are written by that
// bag's thread, so bad input never leaves an unwritten key for the kernels to read.
__global__ void convert_kernel(const int64_t* off, const int64_t* ids, int64_t T, int64_t B,
                               int64_t nnz, const int64_t* rows, const uint32_t* base,
                               int32_t* off32, uint32_t* keys32, unsigned long long* err) {
  const int64_t bag = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nb = T * B;
  if (bag > nb) return;
  const int64_t o0 = off[0];
  int64_t b = off[bag] - o0;
  if (b < 0 || b > nnz) {
    report(err, 2, bag, off[bag], -1);
    b = b < 0 ? 0 : nnz;
  }
  off32[bag] = static_cast<int32_t>(b);
  if (bag == nb) {
    if (b != nnz) report(err, 3, bag, off[bag], -1);
    return;
  }
  int64_t e = off[bag + 1] - o0;
  if (e < b) {
    report(err, 4, bag, off[bag + 1], -1);
    return;
  }
  if (e > nnz) e = nnz;  // reported by the next bag's thread
  const int t = static_cast<int>(bag / B);
  for (int64_t p = b; p < e; ++p) {
    int64_t id = ids[p];
    if (id < 0 || id >= rows[t]) {
      report(err, 1, bag, id, p);
      id = 0;
    }
    keys32[p] = base[t] + static_cast<uint32_t>(id);
  }
}

// Makes the collection's GPU current for the scope, restoring the caller's.
class DeviceScope {
 public:
  explicit DeviceScope(int dev) {
    DLREC_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != dev) DLREC_CUDA_CHECK(cudaSetDevice(dev));
    dev_ = dev;
  }
  ~DeviceScope() {
    if (prev_ != dev_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0, dev_ = 0;
};

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  DLREC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CollectionConfig& c) : c_(c) {
    const TableConfig& t0 = c.tables[0];
    for (const TableConfig& t : c.tables) {
      DLREC_CHECK(!t.hashed, "table '", t.name,
                  "': hashed tables are CPU-only in dlrec.torch so far (use device='cpu')");
      DLREC_CHECK(t.dim == t0.dim, "table '", t.name, "' has dim ", t.dim, " but table '", t0.name,
                  "' has ", t0.dim, ": on CUDA all tables of a collection share one dim");
      DLREC_CHECK(t.pooling == t0.pooling, "table '", t.name,
                  "': on CUDA all tables of a collection share one pooling");
    }
    const nn::OptimizerKind k = c.optimizer.kind;
    DLREC_CHECK(k == nn::OptimizerKind::SGD || k == nn::OptimizerKind::Adagrad ||
                    k == nn::OptimizerKind::RowWiseAdagrad || k == nn::OptimizerKind::Adam,
                "optimizer '", nn::optimizer_name(k),
                "' is CPU-only in dlrec.torch; on CUDA: sgd, adagrad, rowwise_adagrad or adam");
    rowwise_ = k == nn::OptimizerKind::RowWiseAdagrad;
    adam_ = k == nn::OptimizerKind::Adam;
    stateful_ = k != nn::OptimizerKind::SGD;
    mean_ = t0.pooling == nn::Pooling::Mean;
    dim_ = t0.dim;
    // One accumulator per row: the fused update holds a row in a warp's registers.
    DLREC_CHECK(!rowwise_ || dim_ <= nn::cuda_rowwise_max_dim(dim_),
                "optimizer 'rowwise_adagrad' on CUDA takes dims up to ",
                nn::cuda_rowwise_max_dim(dim_), " (", dim_,
                dim_ % 4 ? " is not a multiple of 4" : " is wider",
                "; use adagrad, or device='cpu')");
    DeviceScope scope(c.device_index);
    const int T = static_cast<int>(c.tables.size());
    std::vector<float*> wp, sp;
    std::vector<uint32_t> base;
    std::vector<int64_t> rows;
    uint64_t total = 0;
    for (const TableConfig& t : c.tables) {
      base.push_back(static_cast<uint32_t>(total));
      rows.push_back(t.rows);
      total += static_cast<uint64_t>(t.rows);
      DLREC_CHECK(total < (uint64_t{1} << 32),
                  "more than 2^32 rows in all tables of a CUDA collection together");
      float* w = device_alloc<float>(static_cast<size_t>(t.rows * dim_));
      tables_.push_back(w);
      // Bit-identical to nn::EmbeddingBag::init(seed), the CPU collection's initialisation.
      ce::init_uniform(w, t.rows * dim_, t.seed, std::sqrt(1.0 / static_cast<double>(t.rows)),
                       nullptr);
      wp.push_back(w);
      if (stateful_) {
        const int64_t n = t.rows * state_cols();
        float* s = device_alloc<float>(static_cast<size_t>(n));
        ce::fill(s, n, adam_ ? 0.f : c.optimizer.initial_accumulator, nullptr);
        states_.push_back(s);
        sp.push_back(s);
      }
    }
    while (key_bits_ < 32 && (uint64_t{1} << key_bits_) < total) ++key_bits_;
    ptrs_ = upload(wp);
    sptrs_ = upload(sp);
    base_ = upload(base);
    rows_ = upload(rows);
    lr_ = device_alloc<float>(1);
    err_ = device_alloc<unsigned long long>(4);
    DLREC_CUDA_CHECK(cudaMemset(err_, 0, 4 * sizeof(unsigned long long)));
    DLREC_CUDA_CHECK(cudaStreamSynchronize(0));  // the kernels' streams do not wait for it
    DLREC_CUDA_CHECK(cudaMallocHost(&err_host_, 4 * sizeof(unsigned long long)));
    tab_.weights = static_cast<float* const*>(ptrs_);
    tab_.states = stateful_ ? static_cast<float* const*>(sptrs_) : nullptr;
    tab_.beta1 = c.optimizer.beta1;
    tab_.beta2 = c.optimizer.beta2;
    tab_.row_base = static_cast<const uint32_t*>(base_);
    tab_.num_tables = T;
    tab_.dim = static_cast<int>(dim_);
    DLREC_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~CudaBackend() override {
    cudaSetDevice(c_.device_index);
    cudaDeviceSynchronize();
    for (float* p : tables_) cudaFree(p);
    for (float* p : states_) cudaFree(p);
    for (void* p : {ptrs_, sptrs_, base_, rows_, static_cast<void*>(lr_), static_cast<void*>(err_),
                    static_cast<void*>(off32_), static_cast<void*>(keys32_), scratch_mem_})
      cudaFree(p);
    cudaFreeHost(err_host_);
  }
  int64_t width() const override { return c_.width; }

  void forward(const int64_t* offsets, const int64_t* ids, int64_t B, int64_t nnz, void* out,
               bool out_bf16, void* stream, bool training) override {
    DLREC_CHECK(B >= 0 && nnz >= 0, "forward: negative batch size or id count");
    DLREC_CHECK(nnz < (int64_t{1} << 31), "forward: ", nnz, " ids; at most 2^31 - 1 on CUDA");
    const int64_t T = static_cast<int64_t>(c_.tables.size());
    DLREC_CHECK(T * B < (int64_t{1} << 31), "forward: more than 2^31 bags");
    DeviceScope scope(c_.device_index);
    auto st = static_cast<cudaStream_t>(stream);
    have_batch_ = false;
    reserve(T * B + 1, nnz, st);
    const int64_t n = T * B + 1;
    convert_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, st>>>(
        offsets, ids, T, B, nnz, static_cast<const int64_t*>(rows_),
        static_cast<const uint32_t*>(base_), off32_, keys32_, err_);
    DLREC_CUDA_LAUNCH_CHECK();
    if (B > 0 && out_bf16)
      ce::forward(tab_, off32_, keys32_, B, mean_, static_cast<__nv_bfloat16*>(out), st, c_.width);
    else if (B > 0)
      ce::forward(tab_, off32_, keys32_, B, mean_, static_cast<float*>(out), st, c_.width);
    batch_ = B;
    nnz_ = nnz;
    have_batch_ = training;
  }
  void check(void* stream) override {
    DeviceScope scope(c_.device_index);
    auto st = static_cast<cudaStream_t>(stream);
    DLREC_CUDA_CHECK(
        cudaMemcpyAsync(err_host_, err_, 4 * sizeof(unsigned long long), cudaMemcpyDefault, st));
    DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
    const auto code = static_cast<int>(err_host_[0]);
    if (code == 0) return;
    const auto bag = static_cast<int64_t>(err_host_[1]);
    const auto value = static_cast<int64_t>(err_host_[2]);
    const auto pos = static_cast<int64_t>(err_host_[3]);
    DLREC_CUDA_CHECK(cudaMemsetAsync(err_, 0, 4 * sizeof(unsigned long long), st));
    have_batch_ = false;
    const int64_t B = std::max<int64_t>(batch_, 1);
    const int64_t t = std::min<int64_t>(bag / B, static_cast<int64_t>(c_.tables.size()) - 1);
    const std::string where = "table '" + c_.tables[t].name + "' (table " + std::to_string(t) +
                              "), sample " + std::to_string(bag % B);
    switch (code) {
      case 1:
        fail(where, ": id ", value, " at position ", pos, " is out of range [0, ",
             c_.tables[t].rows, ")");
      case 2:
        fail("offsets[", bag, "] = ", value, " is outside the ", nnz_, " ids");
      case 3:
        fail("offsets[", bag, "] - offsets[0] != ", nnz_, " (the number of ids given)");
      default:
        fail(where, ": offsets decrease (offsets[", bag + 1, "] = ", value, ")");
    }
  }
  void backward(const void* dout, bool dout_bf16, int64_t ld, float lr, void* stream) override {
    DLREC_CHECK(have_batch_, "backward: no training forward to take the gradient of");
    DLREC_CHECK(ld >= c_.width, "backward: gradient row stride ", ld, " < width ", c_.width);
    DLREC_CHECK(lr >= 0.f, "backward: learning rate must be >= 0, got ", lr);
    DeviceScope scope(c_.device_index);
    auto st = static_cast<cudaStream_t>(stream);
    have_batch_ = false;
    if (batch_ == 0 || nnz_ == 0) return;
    ce::fill(lr_, 1, lr, st);
    ce::backward_ids(tab_, off32_, keys32_, batch_, nnz_, key_bits_, scratch_, st);
    const ce::Update kind = rowwise_    ? ce::Update::RowWiseAdagrad
                            : adam_     ? ce::Update::Adam
                            : stateful_ ? ce::Update::Adagrad
                                        : ce::Update::SGD;
    const float eps = adam_ ? c_.optimizer.adam_eps : c_.optimizer.adagrad_eps;
    if (dout_bf16)
      ce::backward_apply(tab_, off32_, batch_, nnz_, mean_, static_cast<const __nv_bfloat16*>(dout),
                         ld, kind, lr_, eps, scratch_, st);
    else
      ce::backward_apply(tab_, off32_, batch_, nnz_, mean_, static_cast<const float*>(dout), ld,
                         kind, lr_, eps, scratch_, st);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  void table_size(int t, int which, int64_t* rows, int64_t* cols) override {
    check_table(t, which);
    *rows = c_.tables[t].rows;
    *cols = which ? state_cols() : dim_;
  }
  void copy_table(int t, int which, float* buf, bool on_device, bool read, void* stream) override {
    check_table(t, which);
    DeviceScope scope(c_.device_index);
    auto st = static_cast<cudaStream_t>(stream);
    float* table = which ? states_[t] : tables_[t];
    const size_t bytes =
        static_cast<size_t>(c_.tables[t].rows * (which ? state_cols() : dim_)) * sizeof(float);
    DLREC_CUDA_CHECK(
        cudaMemcpyAsync(read ? buf : table, read ? table : buf, bytes, cudaMemcpyDefault, st));
    if (!on_device) DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
  }

 private:
  // Values per row of the optimizer state, as the CPU collection's: one for row-wise Adagrad,
  // m, v and the row's step count for Adam.
  int64_t state_cols() const { return rowwise_ ? 1 : adam_ ? 2 * dim_ + 1 : dim_; }
  template <class T>
  void* upload(const std::vector<T>& v) {
    T* p = device_alloc<T>(v.size());
    if (!v.empty()) {
      // From pageable memory cudaMemcpy may return before the bytes land; the kernels'
      // streams do not wait for the default stream.
      DLREC_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
      DLREC_CUDA_CHECK(cudaStreamSynchronize(0));
    }
    return p;
  }
  void check_table(int t, int which) const {
    DLREC_CHECK(t >= 0 && t < static_cast<int>(c_.tables.size()), "table ", t, " out of range [0, ",
                c_.tables.size(), ")");
    DLREC_CHECK(which == 0 || (which == 1 && stateful_), "table '", c_.tables[t].name,
                "': ", which == 1 ? "the optimizer keeps no state" : "which must be 0 or 1");
  }
  // Grows the id buffers and the backward's scratch (after the stream's work on them is done).
  void reserve(int64_t offsets, int64_t nnz, cudaStream_t st) {
    if (offsets <= off_cap_ && nnz <= nnz_cap_) return;
    DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
    if (offsets > off_cap_) {
      cudaFree(off32_);
      off_cap_ = std::max(offsets, off_cap_ * 2);
      off32_ = device_alloc<int32_t>(static_cast<size_t>(off_cap_));
    }
    if (nnz > nnz_cap_) {
      cudaFree(keys32_);
      cudaFree(scratch_mem_);
      nnz_cap_ = std::max(nnz, nnz_cap_ * 2);
      keys32_ = device_alloc<uint32_t>(static_cast<size_t>(nnz_cap_));
      const size_t sb = ce::scratch_bytes(nnz_cap_, key_bits_, static_cast<int>(dim_));
      scratch_mem_ = device_alloc<unsigned char>(sb);
      scratch_ = ce::carve(scratch_mem_, nnz_cap_, key_bits_, static_cast<int>(dim_));
      ce::prepare(scratch_, st);
    }
  }

  CollectionConfig c_;
  bool stateful_ = false, rowwise_ = false, adam_ = false, mean_ = false;  // stateful_: not SGD
  int64_t dim_ = 0;
  int key_bits_ = 1;
  std::vector<float*> tables_, states_;
  void *ptrs_ = nullptr, *sptrs_ = nullptr, *base_ = nullptr, *rows_ = nullptr;
  float* lr_ = nullptr;
  unsigned long long* err_ = nullptr;
  unsigned long long* err_host_ = nullptr;
  ce::Tables tab_;
  int32_t* off32_ = nullptr;
  uint32_t* keys32_ = nullptr;
  void* scratch_mem_ = nullptr;
  ce::Scratch scratch_;
  int64_t off_cap_ = 0, nnz_cap_ = 0, batch_ = 0, nnz_ = 0;
  bool have_batch_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CollectionConfig& config) {
  return std::make_unique<CudaBackend>(config);
}

}  // namespace dlrec::torch_abi
