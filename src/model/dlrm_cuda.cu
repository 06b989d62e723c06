// DLRM on a CUDA device. Same architecture, parameter names, shapes and initial values as the
// CPU model (src/model/dlrm.cc): the MLPs are initialised on the CPU by nn::MLP and copied, the
// tables are initialised on the device by a kernel that computes the CPU's values bit for bit.
//
// A step: the host packs the batch into a pinned staging slot (ids become rows of the
// concatenation of all tables, uint32; offsets int32) and copies it asynchronously; the bottom
// MLP (cuBLAS SGEMM + bias/ReLU kernel), the embedding bags, the interaction and the top MLP run
// on the model's stream; backward computes all gradients, then the dense optimizer steps and the
// embedding update (sorted de-duplication, optimizer fused into the row update) run.
// fp32 throughout (no TF32): this path is the parity reference on the GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/model/dlrm_cuda.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "nn/dense_cuda.h"
#include "nn/embedding_cuda.h"

namespace dlrec::model {
namespace {

namespace ce = nn::cuda_emb;
namespace cd = nn::cuda_dense;

#define DLREC_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                    \
    cublasStatus_t _s = (expr);                                                           \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                      \
      ::dlrec::fail("cuBLAS error ", static_cast<int>(_s), " in ", #expr, " at ", __FILE__, \
                    ":", __LINE__);                                                       \
  } while (0)

struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int d) {
    DLREC_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != d) DLREC_CUDA_CHECK(cudaSetDevice(d));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};

// Pinned host memory that frees itself.
struct PinnedDeleter {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using PinnedPtr = std::unique_ptr<void, PinnedDeleter>;
PinnedPtr pinned_alloc(size_t bytes) {
  void* p = nullptr;
  DLREC_CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
  return PinnedPtr(p);
}

struct DenseLayer {
  int64_t in = 0, out = 0;
  bool relu = false;
  Tensor w, b, dw, db, sw, sb;  // device; sw/sb: Adagrad state (undefined for SGD)
  Tensor y, dz, dx;             // activations and gradients [capB, ...]
  const float* x = nullptr;     // input of the last forward
};

class DlrmCuda final : public CudaModel {
 public:
  DlrmCuda(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
           Device device, uint64_t seed);
  ~DlrmCuda() override;
  Tensor forward(const io::Batch& batch, bool training) override;
  void backward_and_update(const Tensor& dlogits, double lr_scale) override;
  std::vector<NamedTensor> parameters() override;
  std::vector<NamedTensor> optimizer_state() override;
  Device device() const override { return dev_; }
  double train_step(const io::Batch& batch, double lr_scale, bool want_loss) override;
  void synchronize() override;

 private:
  void check_batch(const io::Batch& b) const;
  void ensure_capacity(int64_t B, int64_t nnz);
  void upload(const io::Batch& b);     // pack + async copy into the device inputs
  void run_forward(bool training);     // from the device inputs to logits (top_.back().y)
  void run_backward_update(float lr, float emb_lr);
  void mlp_forward(std::vector<DenseLayer>& mlp, const float* x, int64_t B);
  // dy [B, out of last] -> gradients of every layer; returns dx of the first layer (or null).
  const float* mlp_backward(std::vector<DenseLayer>& mlp, const float* dy, int64_t B,
                            bool need_dx);
  Tensor dev_tensor(Shape s, DType t = DType::F32) { return Tensor::empty(std::move(s), t, dev_); }

  ModelConfig mc_;
  OptimizerConfig oc_;
  io::ShardLayout layout_;
  Device dev_;
  int dev_index_;
  int64_t dim_, T_, num_dense_, dense_dim_, inter_out_;
  bool dot_, mean_, adagrad_;
  float eps_, init_acc_;
  int key_bits_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  Tensor blas_workspace_;

  std::vector<DenseLayer> bottom_, top_;
  std::vector<Tensor> tables_, table_states_;
  std::vector<uint32_t> row_base_host_;
  Tensor table_ptrs_, state_ptrs_, row_base_;  // device arrays for the kernels
  ce::Tables tab_;

  // Inputs and activations, sized for cap_b_ rows and cap_nnz_ ids.
  int64_t cap_b_ = 0, cap_nnz_ = 0;
  Tensor dense_in_, labels_, offsets_, keys_, emb_out_, inter_, d_dense_, d_emb_, dlogits_,
      bgrad_partial_, loss_, scratch_mem_;
  ce::Scratch scratch_;
  struct Slot {
    PinnedPtr mem;
    float* dense = nullptr;
    float* labels = nullptr;
    int32_t* offsets = nullptr;
    uint32_t* keys = nullptr;
    cudaEvent_t copied = nullptr;
    bool pending = false;
  };
  Slot slots_[2];
  int slot_ = 0;

  int64_t fwd_rows_ = 0, fwd_nnz_ = 0;
  bool have_training_forward_ = false;

  // DLREC_PROFILE=1: device time per phase of train_step from events between the phases (one
  // host sync per step, so steps no longer overlap the host's packing), printed at destruction.
  void mark(const char* phase);
  void flush_profile();
  bool profile_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> mark_names_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  int64_t profiled_steps_ = 0, seen_steps_ = 0;
  double host_pack_ms_ = 0;
};

void DlrmCuda::mark(const char* phase) {
  if (!profile_) return;
  const size_t i = mark_names_.size();
  if (i == events_.size()) {
    cudaEvent_t e;
    DLREC_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  DLREC_CUDA_CHECK(cudaEventRecord(events_[i], stream_));
  mark_names_.push_back(phase);
}

void DlrmCuda::flush_profile() {
  if (!profile_ || mark_names_.empty()) return;
  DLREC_CUDA_CHECK(cudaEventSynchronize(events_[mark_names_.size() - 1]));
  if (++seen_steps_ > 3) {  // the first steps pay for cuBLAS' heuristics and lazy loading
    ++profiled_steps_;
    for (size_t i = 1; i < mark_names_.size(); ++i) {
      float ms = 0;
      DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      auto it = std::find_if(phase_ms_.begin(), phase_ms_.end(),
                             [&](const auto& p) { return p.first == mark_names_[i]; });
      if (it == phase_ms_.end()) phase_ms_.emplace_back(mark_names_[i], ms);
      else it->second += ms;
    }
  }
  mark_names_.clear();
}

DlrmCuda::DlrmCuda(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
                   Device device, uint64_t seed)
    : mc_(mc), oc_(oc), layout_(layout), dev_(device), dev_index_(device.index),
      dim_(mc.embedding_dim) {
  cuda::require_device(dev_index_);
  DeviceGuard g(dev_index_);
  DLREC_CHECK(layout.num_dense >= 0, "DLRM: negative number of dense features");
  DLREC_CHECK(dim_ > 0, "DLRM: embedding_dim must be positive");
  DLREC_CHECK(!mc.top_mlp.empty() && mc.top_mlp.back() == 1,
              "DLRM: the top MLP must end in 1 output (the logit)");
  T_ = static_cast<int64_t>(layout.cardinalities.size());
  num_dense_ = layout.num_dense;
  DLREC_CHECK(T_ + num_dense_ > 0, "DLRM: the data has no features");
  dot_ = mc.interaction == "dot";
  DLREC_CHECK(dot_ || mc.interaction == "cat", "unknown interaction '", mc.interaction,
              "' (expected dot or cat)");
  if (dot_)
    DLREC_CHECK(num_dense_ > 0,
                "DLRM: the dot interaction needs dense features (the data has none); use "
                "\"interaction\": \"cat\"");
  mean_ = nn::parse_pooling(mc.pooling) == nn::Pooling::Mean;
  adagrad_ = nn::parse_optimizer(oc.type) == nn::OptimizerKind::Adagrad;
  eps_ = static_cast<float>(oc.adagrad_eps);
  init_acc_ = static_cast<float>(oc.adagrad_init);
  DLREC_CHECK(eps_ >= 0 && init_acc_ >= 0,
              "Optimizer: eps and the initial accumulator must be >= 0");

  DLREC_CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: ordered with legacy-stream copies
  DLREC_CUBLAS_CHECK(cublasCreate(&blas_));
  DLREC_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  // fp32 (no TF32) unless DLREC_TF32=1 asks for the tensor cores' reduced-precision fp32.
  const char* tf32 = std::getenv("DLREC_TF32");
  DLREC_CUBLAS_CHECK(cublasSetMathMode(
      blas_, (tf32 && tf32[0] == '1') ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  blas_workspace_ = dev_tensor({32 << 20}, DType::U8);
  DLREC_CUBLAS_CHECK(cublasSetWorkspace(blas_, blas_workspace_.raw(), blas_workspace_.nbytes()));
  for (auto& s : slots_) DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  const char* prof = std::getenv("DLREC_PROFILE");
  profile_ = prof && prof[0] == '1';

  // Dense layers: initialised on the CPU exactly as the CPU model does, then copied.
  auto make_mlp = [&](int64_t in, const std::vector<int64_t>& sizes, bool relu_last,
                      uint64_t s, std::vector<DenseLayer>& out) {
    nn::MLP cpu(in, sizes, relu_last);
    cpu.init(s);
    for (auto& l : cpu.layers()) {
      DenseLayer d;
      d.in = l.in_features();
      d.out = l.out_features();
      d.relu = l.activation() == nn::Activation::ReLU;
      d.w = l.weight().value.to(dev_);
      d.b = l.bias().value.to(dev_);
      d.dw = dev_tensor({d.out, d.in});
      d.db = dev_tensor({d.out});
      if (adagrad_) {
        d.sw = dev_tensor({d.out, d.in});
        d.sb = dev_tensor({d.out});
        ce::fill(d.sw.data<float>(), d.sw.numel(), init_acc_, stream_);
        ce::fill(d.sb.data<float>(), d.sb.numel(), init_acc_, stream_);
      }
      out.push_back(std::move(d));
    }
  };
  dense_dim_ = num_dense_;
  if (num_dense_ > 0 && !mc.bottom_mlp.empty()) {
    make_mlp(num_dense_, mc.bottom_mlp, true, nn::derive_seed(seed, 1), bottom_);
    dense_dim_ = bottom_.back().out;
  }
  if (dot_ && dense_dim_ != dim_)
    fail("DLRM: the dot interaction needs the bottom MLP to output embedding_dim = ", dim_,
         " values, but it outputs ", dense_dim_,
         mc.bottom_mlp.empty() ? " (no bottom MLP: the dense feature count)"
                               : " (set the last bottom_mlp size to embedding_dim)");
  const int64_t n = T_ + 1;
  inter_out_ = dot_ ? dim_ + n * (n - 1) / 2 : dense_dim_ + T_ * dim_;
  make_mlp(inter_out_, mc.top_mlp, false, nn::derive_seed(seed, 2), top_);

  // Tables: initialised on the device, identical to EmbeddingBag::init.
  const uint64_t emb_seed = nn::derive_seed(seed, 3);
  uint64_t total_rows = 0;
  std::vector<float*> wp, sp;
  for (int64_t t = 0; t < T_; ++t) {
    const int64_t rows = layout.cardinalities[t];
    DLREC_CHECK(rows > 0, "DLRM: categorical feature ", t, " has cardinality ", rows,
                "; every table needs rows");
    row_base_host_.push_back(static_cast<uint32_t>(total_rows));
    total_rows += static_cast<uint64_t>(rows);
    DLREC_CHECK(total_rows < (uint64_t{1} << 32), "CUDA DLRM: more than 2^32 embedding rows in "
                "all tables together are not supported");
    Tensor w = dev_tensor({rows, dim_});
    ce::init_uniform(w.data<float>(), w.numel(), nn::derive_seed(emb_seed, t),
                     std::sqrt(1.0 / static_cast<double>(rows)), stream_);
    wp.push_back(w.data<float>());
    tables_.push_back(w);
    if (adagrad_) {
      Tensor s = dev_tensor({rows, dim_});
      ce::fill(s.data<float>(), s.numel(), init_acc_, stream_);
      sp.push_back(s.data<float>());
      table_states_.push_back(s);
    }
  }
  key_bits_ = 1;
  while (key_bits_ < 32 && (uint64_t{1} << key_bits_) < total_rows) ++key_bits_;
  auto upload_vec = [&](const void* src, size_t bytes) {
    Tensor t = dev_tensor({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8);
    if (bytes) copy_bytes(t.raw(), dev_, src, Device::cpu(), bytes);
    return t;
  };
  table_ptrs_ = upload_vec(wp.data(), wp.size() * sizeof(float*));
  state_ptrs_ = upload_vec(sp.data(), sp.size() * sizeof(float*));
  row_base_ = upload_vec(row_base_host_.data(), row_base_host_.size() * sizeof(uint32_t));
  tab_.weights = static_cast<float* const*>(table_ptrs_.raw());
  tab_.states = adagrad_ ? static_cast<float* const*>(state_ptrs_.raw()) : nullptr;
  tab_.row_base = static_cast<const uint32_t*>(row_base_.raw());
  tab_.num_tables = static_cast<int>(T_);
  tab_.dim = static_cast<int>(dim_);
  loss_ = dev_tensor({8}, DType::U8);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

DlrmCuda::~DlrmCuda() {
  cudaStreamSynchronize(stream_);
  if (profile_ && profiled_steps_ > 0) {
    double total = 0;
    for (auto& p : phase_ms_) total += p.second;
    std::fprintf(stderr, "[profile] %lld steps of batch %lld, device ms per step by phase:\n",
                 static_cast<long long>(profiled_steps_), static_cast<long long>(fwd_rows_));
    for (auto& p : phase_ms_)
      std::fprintf(stderr, "[profile]   %-24s %8.3f ms  %5.1f%%\n", p.first.c_str(),
                   p.second / profiled_steps_, 100.0 * p.second / std::max(total, 1e-9));
    std::fprintf(stderr, "[profile]   %-24s %8.3f ms (host packing, inside h2d)\n", "host pack",
                 host_pack_ms_ / profiled_steps_);
    std::fprintf(stderr, "[profile]   %-24s %8.3f ms\n", "total", total / profiled_steps_);
  }
  for (auto e : events_) cudaEventDestroy(e);
  for (auto& s : slots_)
    if (s.copied) cudaEventDestroy(s.copied);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void DlrmCuda::check_batch(const io::Batch& b) const {
  DLREC_CHECK(b.rows >= 0, "DLRM: negative batch size");
  DLREC_CHECK(b.num_dense == num_dense_, "DLRM: the batch has ", b.num_dense,
              " dense features, the model was built for ", num_dense_);
  DLREC_CHECK(b.num_cat() == T_ && static_cast<int64_t>(b.cat_indices.size()) == T_,
              "DLRM: the batch has ", b.num_cat(),
              " categorical features, the model was built for ", T_);
  DLREC_CHECK(static_cast<int64_t>(b.dense.size()) == b.rows * b.num_dense,
              "DLRM: the batch has ", b.dense.size(), " dense values for ", b.rows, " rows x ",
              b.num_dense, " features");
  DLREC_CHECK(static_cast<int64_t>(b.labels.size()) >= b.rows || b.labels.empty(),
              "DLRM: the batch has ", b.labels.size(), " labels for ", b.rows, " rows");
  for (int64_t t = 0; t < T_; ++t) {
    const auto& off = b.cat_offsets[t];
    DLREC_CHECK(static_cast<int64_t>(off.size()) == b.rows + 1, "DLRM: categorical feature ", t,
                " has ", off.size(), " offsets for ", b.rows, " rows");
    DLREC_CHECK(off.front() >= 0 && off.back() <= static_cast<int64_t>(b.cat_indices[t].size()),
                "DLRM: categorical feature ", t, ": offsets do not fit its ",
                b.cat_indices[t].size(), " ids");
  }
}

void DlrmCuda::ensure_capacity(int64_t B, int64_t nnz) {
  if (B <= cap_b_ && nnz <= cap_nnz_) return;
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int64_t nb = std::max(B, cap_b_), nn_ = std::max<int64_t>(std::max(nnz, cap_nnz_), 1);
  DLREC_CHECK(nn_ < (int64_t{1} << 31) && nb * T_ < (int64_t{1} << 31),
              "CUDA DLRM: a batch with ", nn_, " ids is too large (int32 offsets)");
  cap_b_ = nb;
  cap_nnz_ = nn_;
  const int64_t cb = std::max<int64_t>(nb, 1);
  dense_in_ = dev_tensor({cb, std::max<int64_t>(num_dense_, 1)});
  labels_ = dev_tensor({cb});
  offsets_ = dev_tensor({cb * T_ + 1}, DType::I32);
  keys_ = dev_tensor({nn_}, DType::I32);
  emb_out_ = dev_tensor({cb, std::max<int64_t>(T_, 1), dim_});
  d_emb_ = dev_tensor({cb, std::max<int64_t>(T_, 1), dim_});
  inter_ = dev_tensor({cb, inter_out_});
  d_dense_ = dev_tensor({cb, std::max<int64_t>(dense_dim_, 1)});
  dlogits_ = dev_tensor({cb});
  int64_t max_out = 1;
  for (auto* mlp : {&bottom_, &top_})
    for (auto& l : *mlp) {
      max_out = std::max(max_out, l.out);
      l.y = dev_tensor({cb, l.out});
      l.dz = l.relu ? dev_tensor({cb, l.out}) : Tensor();
      l.dx = dev_tensor({cb, l.in});
    }
  bgrad_partial_ = dev_tensor({std::max<int64_t>(cd::bias_grad_chunks(cb), 1), max_out});
  const size_t sb = ce::scratch_bytes(nn_, key_bits_, static_cast<int>(dim_));
  scratch_mem_ = dev_tensor({static_cast<int64_t>(sb)}, DType::U8);
  scratch_ = ce::carve(scratch_mem_.raw(), nn_, key_bits_, static_cast<int>(dim_));
  ce::prepare(scratch_, stream_);
  const size_t host_bytes = sizeof(float) * cb * (num_dense_ + 1) +
                            sizeof(int32_t) * (cb * T_ + 1) + sizeof(uint32_t) * nn_ + 256;
  for (auto& s : slots_) {
    if (s.pending) DLREC_CUDA_CHECK(cudaEventSynchronize(s.copied));
    s.pending = false;
    s.mem = pinned_alloc(host_bytes);
    char* p = static_cast<char*>(s.mem.get());
    s.dense = reinterpret_cast<float*>(p);
    p += sizeof(float) * cb * num_dense_;
    s.labels = reinterpret_cast<float*>(p);
    p += sizeof(float) * cb;
    s.offsets = reinterpret_cast<int32_t*>(p);
    p += sizeof(int32_t) * (cb * T_ + 1);
    s.keys = reinterpret_cast<uint32_t*>(p);
  }
}

void DlrmCuda::upload(const io::Batch& b) {
  const int64_t B = b.rows;
  int64_t nnz = 0;
  for (int64_t t = 0; t < T_; ++t) nnz += b.cat_offsets[t][B] - b.cat_offsets[t][0];
  ensure_capacity(B, nnz);
  Slot& s = slots_[slot_];
  slot_ ^= 1;
  // The slot's previous copy must have left the pinned buffer before we overwrite it.
  if (s.pending) DLREC_CUDA_CHECK(cudaEventSynchronize(s.copied));
  if (B * num_dense_ > 0) std::memcpy(s.dense, b.dense.data(), sizeof(float) * B * num_dense_);
  if (b.labels.empty()) std::memset(s.labels, 0, sizeof(float) * B);
  else std::memcpy(s.labels, b.labels.data(), sizeof(float) * B);
  // Tables are packed in parallel (each into its own range); ids are range-checked here.
  std::vector<int32_t> start(T_ + 1, 0);
  for (int64_t t = 0; t < T_; ++t)
    start[t + 1] = start[t] + static_cast<int32_t>(b.cat_offsets[t][B] - b.cat_offsets[t][0]);
  parallel_for(0, T_, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const auto& off = b.cat_offsets[t];
      const auto& idx = b.cat_indices[t];
      const int64_t rows = layout_.cardinalities[t];
      const uint32_t base = row_base_host_[t];
      const int32_t pos = start[t];
      int32_t* o = s.offsets + t * B;
      for (int64_t r = 0; r < B; ++r) {
        DLREC_CHECK(off[r] <= off[r + 1], "EmbeddingBag::forward: offsets decrease at row ", r);
        o[r] = pos + static_cast<int32_t>(off[r] - off[0]);
      }
      const int64_t* ids = idx.data() + off[0];
      uint32_t* keys = s.keys + pos;
      const int64_t m = off[B] - off[0];
      bool bad = false;
      for (int64_t p = 0; p < m; ++p) {
        const int64_t id = ids[p];
        bad |= (id < 0) | (id >= rows);
        keys[p] = base + static_cast<uint32_t>(id);
      }
      if (bad)
        for (int64_t p = 0; p < m; ++p)
          if (ids[p] < 0 || ids[p] >= rows)
            fail("EmbeddingBag: id ", ids[p], " of table ", t, " is out of range [0, ", rows,
                 ")");
    }
  });
  s.offsets[T_ * B] = start[T_];
  auto h2d = [&](void* dst, const void* src, size_t bytes) {
    if (bytes) DLREC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  };
  h2d(dense_in_.raw(), s.dense, sizeof(float) * B * num_dense_);
  h2d(labels_.raw(), s.labels, sizeof(float) * B);
  h2d(offsets_.raw(), s.offsets, sizeof(int32_t) * (T_ * B + 1));
  h2d(keys_.raw(), s.keys, sizeof(uint32_t) * nnz);
  DLREC_CUDA_CHECK(cudaEventRecord(s.copied, stream_));
  s.pending = true;
  fwd_rows_ = B;
  fwd_nnz_ = nnz;
}

void DlrmCuda::mlp_forward(std::vector<DenseLayer>& mlp, const float* x, int64_t B) {
  const float one = 1.f, zero = 0.f;
  for (auto& l : mlp) {
    l.x = x;
    float* y = l.y.data<float>();
    // Row-major y [B, out] = x [B, in] W^T, i.e. column-major y^T = W x^T.
    DLREC_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(l.out),
                                   static_cast<int>(B), static_cast<int>(l.in), &one,
                                   l.w.data<float>(), static_cast<int>(l.in), x,
                                   static_cast<int>(l.in), &zero, y, static_cast<int>(l.out)));
    cd::bias_act(y, l.b.data<float>(), B, l.out, l.relu, stream_);
    x = y;
  }
}

const float* DlrmCuda::mlp_backward(std::vector<DenseLayer>& mlp, const float* dy, int64_t B,
                                    bool need_dx) {
  const float one = 1.f, zero = 0.f;
  for (size_t k = mlp.size(); k-- > 0;) {
    DenseLayer& l = mlp[k];
    // ReLU mask and bias gradient in one pass over dy.
    cd::mask_bias_grad(dy, l.relu ? l.y.data<float>() : nullptr,
                       l.relu ? l.dz.data<float>() : nullptr, bgrad_partial_.data<float>(),
                       l.db.data<float>(), B, l.out, stream_);
    const float* dz = l.relu ? l.dz.data<float>() : dy;
    const int in = static_cast<int>(l.in), out = static_cast<int>(l.out), b = static_cast<int>(B);
    // dW [out, in] = dz^T x: column-major dW^T [in, out] = x^T [in, B] dz [B, out].
    DLREC_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one, l.x, in, dz,
                                   out, &zero, l.dw.data<float>(), in));
    if (k > 0 || need_dx) {
      // dx [B, in] = dz W: column-major dx^T [in, B] = W^T [in, out] dz^T [out, B].
      DLREC_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one,
                                     l.w.data<float>(), in, dz, out, &zero, l.dx.data<float>(),
                                     in));
      dy = l.dx.data<float>();
    } else {
      dy = nullptr;
    }
  }
  return dy;
}

void DlrmCuda::run_forward(bool training) {
  const int64_t B = fwd_rows_;
  have_training_forward_ = training;
  if (B == 0) return;
  const float* dense = dense_in_.data<float>();
  if (!bottom_.empty()) {
    mlp_forward(bottom_, dense, B);
    dense = bottom_.back().y.data<float>();
  }
  mark("bottom mlp fwd");
  ce::forward(tab_, offsets_.data<int32_t>(), reinterpret_cast<const uint32_t*>(keys_.raw()), B,
              mean_, emb_out_.data<float>(), stream_);
  mark("embedding fwd");
  if (dot_)
    cd::dot_forward(dense, emb_out_.data<float>(), B, static_cast<int>(T_), static_cast<int>(dim_),
                    inter_.data<float>(), stream_);
  else
    cd::cat_forward(dense, emb_out_.data<float>(), B, static_cast<int>(dense_dim_), T_ * dim_,
                    inter_.data<float>(), stream_);
  mark("interaction fwd");
  mlp_forward(top_, inter_.data<float>(), B);
  mark("top mlp fwd");
}

void DlrmCuda::run_backward_update(float lr, float emb_lr) {
  const int64_t B = fwd_rows_;
  if (B == 0) return;
  const float* dinter = mlp_backward(top_, dlogits_.data<float>(), B, true);
  mark("top mlp bwd");
  const float* dense = bottom_.empty() ? dense_in_.data<float>() : bottom_.back().y.data<float>();
  if (dot_)
    cd::dot_backward(dense, emb_out_.data<float>(), dinter, B, static_cast<int>(T_),
                     static_cast<int>(dim_), d_dense_.data<float>(), d_emb_.data<float>(),
                     stream_);
  else
    cd::cat_backward(dinter, B, static_cast<int>(dense_dim_), T_ * dim_, d_dense_.data<float>(),
                     d_emb_.data<float>(), stream_);
  mark("interaction bwd");
  if (!bottom_.empty()) mlp_backward(bottom_, d_dense_.data<float>(), B, false);
  mark("bottom mlp bwd");
  for (auto* mlp : {&bottom_, &top_})
    for (auto& l : *mlp) {
      cd::optimizer_step(l.w.data<float>(), l.dw.data<float>(),
                         adagrad_ ? l.sw.data<float>() : nullptr, l.w.numel(), lr, eps_, stream_);
      cd::optimizer_step(l.b.data<float>(), l.db.data<float>(),
                         adagrad_ ? l.sb.data<float>() : nullptr, l.b.numel(), lr, eps_, stream_);
    }
  mark("dense optimizer");
  ce::backward_update(tab_, offsets_.data<int32_t>(), reinterpret_cast<const uint32_t*>(keys_.raw()),
                      B, fwd_nnz_, mean_, d_emb_.data<float>(),
                      adagrad_ ? ce::Update::Adagrad : ce::Update::SGD, emb_lr, eps_, key_bits_,
                      scratch_, stream_);
  mark("embedding bwd+update");
}

Tensor DlrmCuda::forward(const io::Batch& batch, bool training) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  have_training_forward_ = false;
  upload(batch);
  run_forward(training);
  mark_names_.clear();  // phases are profiled in train_step only
  const int64_t B = fwd_rows_;
  // A copy: callers may keep logits across steps, the buffer is reused.
  Tensor logits = dev_tensor({B});
  if (B)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(logits.raw(), top_.back().y.raw(), sizeof(float) * B,
                                     cudaMemcpyDeviceToDevice, stream_));
  return logits;
}

void DlrmCuda::backward_and_update(const Tensor& dlogits, double lr_scale) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(have_training_forward_,
              "DLRM: backward_and_update needs a forward(batch, training = true) before it");
  DLREC_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == fwd_rows_,
              "DLRM: dlogits must be f32 with ", fwd_rows_, " values, got ",
              dtype_name(dlogits.dtype()), " ", shape_str(dlogits.shape()));
  DLREC_CHECK(!dlogits.device().is_cuda() || dlogits.device() == dev_,
              "DLRM: dlogits on ", dlogits.device().str(), ", the model is on ", dev_.str());
  DLREC_CHECK(lr_scale >= 0, "DLRM: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  if (fwd_rows_)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dlogits_.raw(), dlogits.raw(), sizeof(float) * fwd_rows_,
                                     dlogits.device().is_cuda() ? cudaMemcpyDeviceToDevice
                                                                : cudaMemcpyHostToDevice,
                                     stream_));
  const float lr = static_cast<float>(oc_.lr * lr_scale);
  const float emb_lr =
      static_cast<float>((oc_.embedding_lr >= 0 ? oc_.embedding_lr : oc_.lr) * lr_scale);
  run_backward_update(lr, emb_lr);
  mark_names_.clear();
}

double DlrmCuda::train_step(const io::Batch& batch, double lr_scale, bool want_loss) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows,
              "DLRM: train_step needs one label per row");
  DLREC_CHECK(lr_scale >= 0, "DLRM: lr_scale must be >= 0, got ", lr_scale);
  mark("begin");
  const auto t0 = std::chrono::steady_clock::now();
  upload(batch);
  if (profile_)
    host_pack_ms_ +=
        (seen_steps_ >= 3) *
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  mark("h2d (+host packing)");
  run_forward(true);
  have_training_forward_ = false;
  cd::bce_with_logits(top_.back().y.data<float>(), labels_.data<float>(), fwd_rows_,
                      dlogits_.data<float>(), static_cast<double*>(loss_.raw()), stream_);
  const float lr = static_cast<float>(oc_.lr * lr_scale);
  const float emb_lr =
      static_cast<float>((oc_.embedding_lr >= 0 ? oc_.embedding_lr : oc_.lr) * lr_scale);
  mark("bce");
  run_backward_update(lr, emb_lr);
  flush_profile();
  if (!want_loss) return std::numeric_limits<double>::quiet_NaN();
  double loss = 0;
  DLREC_CUDA_CHECK(
      cudaMemcpyAsync(&loss, loss_.raw(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return loss;
}

void DlrmCuda::synchronize() {
  DeviceGuard g(dev_index_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<NamedTensor> DlrmCuda::parameters() {
  synchronize();
  std::vector<NamedTensor> out;
  auto add = [&](std::vector<DenseLayer>& mlp, const std::string& prefix) {
    for (size_t k = 0; k < mlp.size(); ++k) {
      out.emplace_back(prefix + "." + std::to_string(k) + ".weight", mlp[k].w);
      out.emplace_back(prefix + "." + std::to_string(k) + ".bias", mlp[k].b);
    }
  };
  add(bottom_, "bottom");
  add(top_, "top");
  for (size_t t = 0; t < tables_.size(); ++t)
    out.emplace_back("emb." + std::to_string(t) + ".weight", tables_[t]);
  return out;
}

std::vector<NamedTensor> DlrmCuda::optimizer_state() {
  synchronize();
  std::vector<NamedTensor> out;
  if (!adagrad_) return out;
  const char* suffix = ".adagrad";
  auto add = [&](std::vector<DenseLayer>& mlp, const std::string& prefix) {
    for (size_t k = 0; k < mlp.size(); ++k) {
      out.emplace_back(prefix + "." + std::to_string(k) + ".weight" + suffix, mlp[k].sw);
      out.emplace_back(prefix + "." + std::to_string(k) + ".bias" + suffix, mlp[k].sb);
    }
  };
  add(bottom_, "bottom");
  add(top_, "top");
  for (size_t t = 0; t < table_states_.size(); ++t)
    out.emplace_back("emb." + std::to_string(t) + ".weight" + suffix, table_states_[t]);
  return out;
}

}  // namespace

std::unique_ptr<CudaModel> make_dlrm_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                          const io::ShardLayout& layout, Device device,
                                          uint64_t seed) {
  DLREC_CHECK(device.is_cuda(), "make_dlrm_cuda: ", device.str(), " is not a CUDA device");
  return std::make_unique<DlrmCuda>(model, opt, layout, device, seed);
}

}  // namespace dlrec::model
