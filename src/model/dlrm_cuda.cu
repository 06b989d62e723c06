// DLRM on a CUDA device. Same architecture, parameter names, shapes and initial values as the
// CPU model (src/model/dlrm.cc): the MLPs are initialised on the CPU by nn::MLP and copied, the
// tables are initialised on the device by a kernel that computes the CPU's values bit for bit.
//
// A step: the host packs the batch into one of two pinned staging slots (ids become rows of the
// concatenation of all tables, uint32; offsets int32) and copies it on a copy stream into that
// slot's device inputs, so the copy of step i+1 overlaps the compute of step i. The bottom MLP
// runs on a side stream concurrently with the embedding bags; the interaction and the top MLP
// follow; backward computes all gradients, then the dense optimizer steps and the embedding
// update (sorted de-duplication, optimizer fused into the row update) run, the bottom MLP's
// backward again beside the embedding update. Learning rates live in device memory, so from
// the second step of a shape on, the whole step is one CUDA graph replay (DLREC_CUDA_GRAPH=0
// turns that off).
//
// Precision (train.precision):
//   fp32  cuBLAS SGEMM without TF32 + own epilogue kernels: the parity reference on the GPU.
//   tf32  the same with TF32 tensor-core GEMMs.
//   bf16  bf16 weights copies and activations, fp32 master weights, fp32 embedding tables and
//         gradients of the tables, fp32 accumulation; forward GEMMs through cuBLASLt with fused
//         bias+ReLU epilogues (falling back to plain GEMMs + own kernels where cuBLASLt has no
//         algorithm); backward GEMMs followed by one fused dReLU + bias-gradient pass (or
//         cuBLASLt's DRELU/BGRADB epilogues with DLREC_BWD_EPILOGUES=1); the dot interaction
//         on tensor cores.
//   fp16  the bf16 path with fp16 (half) in place of bf16, plus dynamic loss scaling: dL/dlogits
//         is multiplied by the loss scale S (2^16 at the start) before the fp16 backward; once
//         every gradient exists, one pass checks them for Inf/NaN; an overflowed step updates
//         nothing and halves S, otherwise the optimizers see the gradients times 1/S and S
//         doubles after 2000 good steps in a row. All of it is on the device (no host sync, one
//         CUDA graph); the count of skipped steps is printed when the model is destroyed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/spin_team.h"
#include "dlrec/model/dlrm_cuda.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "nn/dense_cuda.h"
#include "nn/embedding_cuda.h"
#include "nn/lt_gemm.h"
#include "model/cuda_step.h"
#include "model/infer_small_cuda.h"

namespace dlrec::model {
namespace {

namespace ce = nn::cuda_emb;
namespace cd = nn::cuda_dense;
namespace lt = nn::cuda_lt;
using bf16 = cd::bf16;

using f16 = cd::f16;
template <class H>
H* hp(const Tensor& t) { return static_cast<H*>(t.raw()); }
// Calls f with a value of the 16-bit compute type (bf16, or f16 in fp16 mode).
template <class F>
void with_half(bool fp16, F&& f) {
  if (fp16) f(f16{});
  else f(bf16{});
}
using namespace cuda_step;

struct DenseLayer {
  int64_t in = 0, in_pad = 0, out = 0;
  bool relu = false;
  bool out_f32 = true;            // 16-bit modes: only the logit layer writes f32
  Tensor w, b, dw, db, sw, sb;    // device f32; sw/sb: Adagrad state (undefined for SGD)
  Tensor wh, bh;                  // 16-bit modes: compute copies [out, in_pad], [out]
  Tensor y, dz, dx;               // activations and gradients [capB, ...] (16-bit in 16-bit modes)
  Tensor aux;                     // 16-bit modes: ReLU bit mask of y, aux_ld bits per row
  int64_t aux_ld = 0;
  bool aux_valid = false;         // the last forward wrote aux (cuBLASLt epilogue path)
  const void* x = nullptr;        // input of the last forward (rows in_pad apart)
};

class DlrmCuda final : public CudaModel {
 public:
  DlrmCuda(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
           Device device, uint64_t seed, const std::string& precision);
  ~DlrmCuda() override;
  Tensor forward(const io::Batch& batch, bool training) override;
  void backward_and_update(const Tensor& dlogits, double lr_scale) override;
  std::vector<NamedTensor> parameters() override;
  std::vector<NamedTensor> optimizer_state() override;
  Device device() const override { return dev_; }
  double train_step(const io::Batch& batch, double lr_scale, bool want_loss) override;
  void synchronize() override;
  void predict(const io::Batch& batch, float* probs) override;

 private:
  // Serving: one CUDA graph per power-of-two number of rows (one id per table).
  struct InferBucket {
    int64_t rows = 0;
    PinnedPtr in, out;
    float* dense = nullptr;    // [rows, num_dense]
    uint32_t* keys = nullptr;  // [T, rows] global rows
    float* probs = nullptr;    // [rows]
    Tensor d_in;               // device copy of `in` (dense, then keys): one copy per call
    Tensor d_offsets, d_probs;
    cudaGraphExec_t graph = nullptr;
    bool no_graph = false;  // capture failed: eager
    cudaEvent_t done = nullptr;
    cudaEvent_t copied = nullptr;  // the input copy (copy stream) finished
    // `in` and `out` as the device sees them (mapped pinned memory): the fused small-batch
    // kernel reads the inputs and writes the probabilities there directly.
    const void* dev_in = nullptr;
    float* dev_out = nullptr;
  };
  void infer_body(InferBucket& bk);
  InferBucket& infer_bucket(int64_t rows, int parity);  // created on first use
  // Copies the packed inputs (on the copy stream when copy_aside: chunked batches), then runs
  // the bucket's graph (captured on first use).
  void infer_launch(InferBucket& bk, bool copy_aside);
  // Rows 1..fused_rows_ of 16-bit inference: the whole forward as one kernel reading the
  // bucket's pinned inputs and writing its pinned probabilities (model/infer_small_cuda.h).
  // False (nothing enqueued; the path is switched off for this model) when the model's shape
  // does not fit that kernel.
  bool fused_launch(InferBucket& bk, int64_t n);
  void check_batch(const io::Batch& b) const;
  void ensure_capacity(int64_t B, int64_t nnz);
  // Packs the batch and enqueues its copy; the model stream waits for it. Sets cur_.
  void upload(const io::Batch& b, float lr, float emb_lr);
  void run_forward(bool training);     // from the device inputs to logits (top_.back().y)
  void run_backward_update();
  void step_body();                    // BCE + backward + update after run_forward(true)
  void mlp_forward(std::vector<DenseLayer>& mlp, const void* x, int64_t B, cudaStream_t s,
                   lt::Lt* l, cublasHandle_t h);
  // dy [B, out of last] -> gradients of every layer; returns dx of the first layer (or null).
  const void* mlp_backward(std::vector<DenseLayer>& mlp, const void* dy, int64_t B,
                           bool need_dx, cudaStream_t s, lt::Lt* l, cublasHandle_t h,
                           Tensor& partial);
  void dense_updates(std::vector<DenseLayer>& mlp, cudaStream_t s);
  void refresh_shadows();             // 16-bit copies from the f32 masters
  void check_gradients(cudaStream_t st);  // fp16: overflow check + loss-scale update
  const float* gscale() const { return fp16_ ? ls_.gscale : nullptr; }
  void drop_graphs();
  cudaStream_t side() const { return overlap_ ? side_ : stream_; }
  Tensor dev_tensor(Shape s, DType t = DType::F32) { return Tensor::empty(std::move(s), t, dev_); }
  const float* lr_ptr() const { return inputs_->slots[cur_].d_lr.data<float>(); }

  ModelConfig mc_;
  OptimizerConfig oc_;
  io::ShardLayout layout_;
  Device dev_;
  int dev_index_;
  Precision prec_;
  bool half_ = false;  // bf16 or fp16: 16-bit activations and weight copies
  bool fp16_ = false;  // fp16 with loss scaling
  cudaDataType_t h16_ = CUDA_R_16BF;
  DType hdt_ = DType::BF16;
  // fp16: loss-scale state (device) and the dense gradients checked for overflow.
  Tensor ls_mem_, grad_ptrs_, grad_counts_;
  cd::LossScale ls_;
  int num_grads_ = 0;
  int growth_interval_ = 2000;
  bool trained_ = false;  // a training step ran (fp16: report the loss scale at the end)
  int64_t dim_, T_, num_dense_, dense_dim_, inter_out_, inter_ld_;
  bool dot_, mean_, adagrad_;
  float eps_, init_acc_;
  int key_bits_;
  cudaStream_t stream_ = nullptr, copy_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  cublasHandle_t blas_ = nullptr, blas_side_ = nullptr;
  Tensor blas_workspace_, side_workspace_, lt_workspace_, lt_side_workspace_;
  std::unique_ptr<lt::Lt> lt_, lt_side_;
  bool overlap_ = true, graphs_ = true, shadows_stale_ = false;
  bool exposed_ = false;  // parameters()/optimizer_state() handed out tensors since last step
  void absorb_external_writes();  // waits for legacy-stream writes, refreshes bf16 copies
  bool bwd_epilogues_ = false;  // DLREC_BWD_EPILOGUES=1: cuBLASLt BGRADB/DRELU backward

  std::vector<DenseLayer> bottom_, top_;
  std::vector<Tensor> tables_, table_states_;
  std::vector<uint32_t> row_base_host_;
  Tensor table_ptrs_, state_ptrs_, row_base_;  // device arrays for the kernels
  ce::Tables tab_;

  // Activations, sized for cap_b_ rows and cap_nnz_ ids.
  int64_t cap_b_ = 0, cap_nnz_ = 0;
  Tensor dense_h_, emb_out_, inter_, d_dense_, d_emb_, dlogits_, dlogits_h_, bgrad_partial_,
      bgrad_partial_side_, loss_, scratch_mem_;
  ce::Scratch scratch_;
  std::unique_ptr<StepInputs> inputs_;  // double-buffered step inputs (cuda_step.h)
  int cur_ = 0;                          // the slot of the last upload
  std::vector<std::unique_ptr<InferBucket>> buckets_;  // by log2(rows)

  int64_t fwd_rows_ = 0, fwd_nnz_ = 0;
  // Serving: run_forward reads these bucket inputs instead of the step slot's when set.
  struct {
    const float* dense = nullptr;
    const int32_t* offsets = nullptr;
    const uint32_t* keys = nullptr;
  } infer_in_;
  int64_t infer_chunk_ = 8192;  // DLREC_INFER_CHUNK: rows per graph launch of predict()
  // predict()'s packing of big chunks runs on a team of DLREC_INFER_PACK_THREADS threads
  // (default min(8, cores / 2); 1: on the caller alone), one team per process (pack_team()).
  int pack_threads_ = 1;
  // 16-bit inference of <= 8 rows through cd::skinny_linear (DLREC_INFER_SKINNY=0: cuBLASLt).
  bool skinny_ = true;
  // predict() of 1..fused_rows_ rows in 16-bit modes: one fused kernel (DLREC_INFER_FUSED=0:
  // off, the layer-by-layer graph; DLREC_INFER_FUSED_ROWS: the largest batch it takes, 1..64,
  // default 8 (no faster than the GEMM path from 16 rows on); DLREC_INFER_FUSED_BLOCKS: its
  // grid, default and at most the SM count; DLREC_INFER_FUSED_COOP=0: a plain launch instead
  // of a cooperative one).
  bool fused_ = true;
  int64_t fused_rows_ = 8;
  int fused_blocks_ = 0;
  bool fused_coop_ = true;
  Tensor fused_barrier_;          // the kernel's grid-barrier counter (u32, zeroed once)
  uint32_t fused_counter_ = 0;    // its value when the next launch starts
  // DLREC_INFER_TIMING=1: per predict() call of one chunk, the host packing time, the device
  // time of the input copy + graph, and the wall time, averaged and printed at destruction.
  bool timing_ = false;
  int64_t timing_skip_ = 20;  // the first calls build buckets, plans and graphs
  cudaEvent_t timing_ev_[3] = {nullptr, nullptr, nullptr};  // before copy, after copy, after graph
  double timing_sum_[4] = {0, 0, 0, 0};  // packing, copy, graph, wall
  int64_t timing_calls_ = 0, timing_rows_ = 0;
  bool have_training_forward_ = false;

  // DLREC_PROFILE=1: device time per phase of train_step from events between the phases (one
  // host sync per step, everything on one stream, no graphs), printed at destruction.
  void mark(const char* phase);
  void flush_profile();
  bool profile_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> mark_names_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  int64_t profiled_steps_ = 0, seen_steps_ = 0;
  double host_pack_ms_ = 0;
};

// Keeps the GPU busy for about `ns` nanoseconds (one thread).
__global__ void gpu_sleep_kernel(long long ns) {
  const long long t0 = clock64();
  // clock64 counts SM cycles: 1.5 GHz or more on the GPUs we target, so ns cycles >= ns.
  while (clock64() - t0 < ns) __nanosleep(1000);
}

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
                   Device device, uint64_t seed, const std::string& precision)
    : mc_(mc), oc_(oc), layout_(layout), dev_(device), dev_index_(device.index),
      prec_(parse_precision(precision)), dim_(mc.embedding_dim) {
  cuda::require_device(dev_index_);
  DeviceGuard g(dev_index_);
  fp16_ = prec_ == Precision::FP16;
  half_ = prec_ == Precision::BF16 || fp16_;
  h16_ = fp16_ ? CUDA_R_16F : CUDA_R_16BF;
  hdt_ = fp16_ ? DType::F16 : DType::BF16;
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
  if (half_) {
    DLREC_CHECK(dot_ && !mc.bottom_mlp.empty(),
                precision, " precision supports DLRM with the dot interaction and a bottom MLP; "
                "use \"precision\": \"fp32\" or \"tf32\" for this model");
    auto check_sizes = [](const std::vector<int64_t>& sizes, const char* name) {
      for (size_t i = 0; i < sizes.size(); ++i)
        DLREC_CHECK((i + 1 == sizes.size() && sizes[i] == 1) || sizes[i] % 8 == 0,
                    "16-bit precision needs MLP sizes that are multiples of 8 ",
                    "(tensor-core alignment): ", name, "[", i, "] = ", sizes[i]);
    };
    check_sizes(mc.bottom_mlp, "model.bottom_mlp");
    check_sizes(mc.top_mlp, "model.top_mlp");
  }
  mean_ = nn::parse_pooling(mc.pooling) == nn::Pooling::Mean;
  const nn::OptimizerKind kind = nn::parse_optimizer(oc.type);
  DLREC_CHECK(kind == nn::OptimizerKind::SGD || kind == nn::OptimizerKind::Adagrad,
              "the CUDA DLRM supports the sgd and adagrad optimizers, not '", oc.type,
              "' (train it on the CPU)");
  adagrad_ = kind == nn::OptimizerKind::Adagrad;
  eps_ = static_cast<float>(oc.adagrad_eps);
  init_acc_ = static_cast<float>(oc.adagrad_init);
  DLREC_CHECK(eps_ >= 0 && init_acc_ >= 0,
              "Optimizer: eps and the initial accumulator must be >= 0");

  const char* prof = std::getenv("DLREC_PROFILE");
  profile_ = prof && prof[0] == '1';
  const char* gr = std::getenv("DLREC_CUDA_GRAPH");
  graphs_ = !profile_ && !(gr && gr[0] == '0');
  overlap_ = !profile_;
  if (const char* ic = std::getenv("DLREC_INFER_CHUNK")) {
    infer_chunk_ = std::atoll(ic);
    DLREC_CHECK(infer_chunk_ >= 256 && (infer_chunk_ & (infer_chunk_ - 1)) == 0,
                "DLREC_INFER_CHUNK must be a power of two >= 256, got '", ic, "'");
  }
  pack_threads_ = std::max(1, std::min(8, static_cast<int>(std::thread::hardware_concurrency()) / 2));
  if (const char* pt = std::getenv("DLREC_INFER_PACK_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(pt, &end, 10);
    DLREC_CHECK(end != pt && *end == '\0' && v >= 1 && v <= 256,
                "DLREC_INFER_PACK_THREADS must be an integer in [1, 256], got '", pt, "'");
    pack_threads_ = static_cast<int>(v);
  }
  if (const char* sk = std::getenv("DLREC_INFER_SKINNY")) skinny_ = sk[0] != '0';
  if (const char* fu = std::getenv("DLREC_INFER_FUSED")) fused_ = fu[0] != '0';
  if (const char* fc = std::getenv("DLREC_INFER_FUSED_COOP")) fused_coop_ = fc[0] != '0';
  auto env_int = [](const char* name, long lo, long hi, long& v) {
    const char* e = std::getenv(name);
    if (!e) return;
    char* end = nullptr;
    v = std::strtol(e, &end, 10);
    DLREC_CHECK(end != e && *end == '\0' && v >= lo && v <= hi, name, " must be an integer in [",
                lo, ", ", hi, "], got '", e, "'");
  };
  long fr = fused_rows_, fb = fused_blocks_;
  env_int("DLREC_INFER_FUSED_ROWS", 1, fused_infer::kMaxRows, fr);
  env_int("DLREC_INFER_FUSED_BLOCKS", 1, 1 << 16, fb);
  fused_rows_ = fr;
  fused_blocks_ = static_cast<int>(fb);
  if (const char* it = std::getenv("DLREC_INFER_TIMING"); it && it[0] == '1') {
    timing_ = true;
    for (auto& e : timing_ev_) DLREC_CUDA_CHECK(cudaEventCreate(&e));
  }
  const char* be = std::getenv("DLREC_BWD_EPILOGUES");
  bwd_epilogues_ = be && be[0] == '1';
  // Non-blocking streams: another model in the process (serving instances) may copy on the
  // legacy stream while this one captures a CUDA graph, which blocking streams turn into an
  // error. Work handed out (forward's logits, parameters()) is synchronised before it is
  // returned, and after parameters() exposed the weights, the next step first waits for the
  // legacy stream (where Tensor copies and fills run).
  DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  const cublasMath_t math = prec_ == Precision::TF32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                     : CUBLAS_DEFAULT_MATH;
  blas_workspace_ = dev_tensor({32 << 20}, DType::U8);
  side_workspace_ = dev_tensor({32 << 20}, DType::U8);
  for (auto [h, st, ws] : {std::make_tuple(&blas_, stream_, &blas_workspace_),
                           std::make_tuple(&blas_side_, side_, &side_workspace_)}) {
    DLREC_CUBLAS_CHECK(cublasCreate(h));
    DLREC_CUBLAS_CHECK(cublasSetStream(*h, st));
    DLREC_CUBLAS_CHECK(cublasSetMathMode(*h, math));
    DLREC_CUBLAS_CHECK(cublasSetWorkspace(*h, ws->raw(), ws->nbytes()));
  }
  if (half_) {
    lt_workspace_ = dev_tensor({32 << 20}, DType::U8);
    lt_side_workspace_ = dev_tensor({32 << 20}, DType::U8);
    lt_ = std::make_unique<lt::Lt>(lt_workspace_.raw(), lt_workspace_.nbytes());
    lt_side_ = std::make_unique<lt::Lt>(lt_side_workspace_.raw(), lt_side_workspace_.nbytes());
  }
  inputs_ = std::make_unique<StepInputs>(dev_);

  // Dense layers: initialised on the CPU exactly as the CPU model does, then copied.
  auto make_mlp = [&](int64_t in, const std::vector<int64_t>& sizes, bool relu_last,
                      uint64_t s, std::vector<DenseLayer>& out) {
    nn::MLP cpu(in, sizes, relu_last);
    cpu.init(s);
    for (auto& l : cpu.layers()) {
      DenseLayer d;
      d.in = l.in_features();
      d.in_pad = half_ ? round_up(d.in, 8) : d.in;
      d.out = l.out_features();
      d.relu = l.activation() == nn::Activation::ReLU;
      d.w = l.weight().value.to(dev_);
      d.b = l.bias().value.to(dev_);
      d.dw = dev_tensor({d.out, d.in_pad});
      d.db = dev_tensor({d.out});
      if (half_) {
        d.wh = dev_tensor({d.out, d.in_pad}, hdt_);
        d.bh = dev_tensor({d.out}, hdt_);
        d.aux_ld = round_up(d.out, 128);
      }
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
  inter_ld_ = half_ ? round_up(inter_out_, 8) : inter_out_;
  make_mlp(inter_out_, mc.top_mlp, false, nn::derive_seed(seed, 2), top_);
  if (half_) {
    for (auto* mlp : {&bottom_, &top_})
      for (auto& l : *mlp) l.out_f32 = false;
    top_.back().out_f32 = true;
    refresh_shadows();
  }

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
      Tensor st = dev_tensor({rows, dim_});
      ce::fill(st.data<float>(), st.numel(), init_acc_, stream_);
      sp.push_back(st.data<float>());
      table_states_.push_back(st);
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
  if (fp16_) {
    // scale, gscale (f32), overflow, good_steps (i32), skipped (i64)
    ls_mem_ = dev_tensor({32}, DType::U8);
    char* m = static_cast<char*>(ls_mem_.raw());
    ls_.scale = reinterpret_cast<float*>(m);
    ls_.gscale = reinterpret_cast<float*>(m + 4);
    ls_.overflow = reinterpret_cast<int*>(m + 8);
    ls_.good_steps = reinterpret_cast<int*>(m + 12);
    ls_.skipped = reinterpret_cast<int64_t*>(m + 16);
    float init[2] = {65536.f, 1.f / 65536.f};
    if (const char* si = std::getenv("DLREC_LOSS_SCALE_INIT")) {
      init[0] = std::strtof(si, nullptr);
      DLREC_CHECK(std::isfinite(init[0]) && init[0] >= 1.f,
                  "DLREC_LOSS_SCALE_INIT must be a number >= 1, got '", si, "'");
      init[1] = 1.f / init[0];
    }
    DLREC_CUDA_CHECK(cudaMemsetAsync(m, 0, 32, stream_));
    DLREC_CUDA_CHECK(cudaMemcpyAsync(m, init, sizeof init, cudaMemcpyHostToDevice, stream_));
    if (const char* gi = std::getenv("DLREC_LOSS_SCALE_GROWTH")) growth_interval_ = std::atoi(gi);
    DLREC_CHECK(growth_interval_ > 0, "DLREC_LOSS_SCALE_GROWTH must be a positive step count");
    // Every dense gradient (f32): the checks cover them and d_emb_ (sized per batch).
    std::vector<const float*> gp;
    std::vector<int64_t> gc;
    for (auto* mlp : {&bottom_, &top_})
      for (auto& l : *mlp) {
        gp.push_back(l.dw.data<float>());
        gc.push_back(l.dw.numel());
        gp.push_back(l.db.data<float>());
        gc.push_back(l.db.numel());
      }
    num_grads_ = static_cast<int>(gp.size());
    grad_ptrs_ = upload_vec(gp.data(), gp.size() * sizeof(float*));
    grad_counts_ = upload_vec(gc.data(), gc.size() * sizeof(int64_t));
  }
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DlrmCuda::check_gradients(cudaStream_t st) {
  if (!fp16_) return;
  cd::check_finite(static_cast<const float* const*>(grad_ptrs_.raw()),
                   static_cast<const int64_t*>(grad_counts_.raw()), num_grads_, ls_.overflow, st);
  cd::check_finite(d_emb_.data<float>(), fwd_rows_ * T_ * dim_, ls_.overflow, st);
  cd::loss_scale_update(ls_, growth_interval_, st);
}

void DlrmCuda::refresh_shadows() {
  if (!half_) return;
  for (auto* mlp : {&bottom_, &top_})
    for (auto& l : *mlp) {
      with_half(fp16_, [&](auto h) {
        using H = decltype(h);
        cd::to_half_padded(l.w.data<float>(), l.out, l.in, hp<H>(l.wh), l.in_pad, stream_);
        cd::to_half_padded(l.b.data<float>(), 1, l.out, hp<H>(l.bh), l.out, stream_);
      });
    }
  shadows_stale_ = false;
}

void DlrmCuda::absorb_external_writes() {
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
}

void DlrmCuda::drop_graphs() {
  for (auto& bk : buckets_)
    if (bk && bk->graph) {
      cudaGraphExecDestroy(bk->graph);
      bk->graph = nullptr;
    }
  if (inputs_) inputs_->drop_graphs();
}

DlrmCuda::~DlrmCuda() {
  cudaStreamSynchronize(copy_);
  cudaStreamSynchronize(side_);
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
    if (lt_)
      std::fprintf(stderr, "[profile]   cuBLASLt plans without an algorithm (fallbacks): %d\n",
                   lt_->unsupported_count() + lt_side_->unsupported_count());
  }
  if (fp16_ && trained_) {
    float scale = 0;
    int64_t skipped = 0;
    if (cudaMemcpy(&scale, ls_.scale, sizeof scale, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(&skipped, ls_.skipped, sizeof skipped, cudaMemcpyDeviceToHost) == cudaSuccess)
      std::fprintf(stderr, "[fp16] loss scale %g at the end; %lld step(s) skipped (gradient "
                   "overflow)\n", scale, static_cast<long long>(skipped));
  }
  if (timing_ && timing_calls_ > 0)
    std::fprintf(stderr, "[infer timing] %lld calls of %lld rows (after 20 warm-up calls), mean "
                 "us: host packing %.1f (%d thread(s)), device: input copy %.1f + graph %.1f, "
                 "wall %.1f\n",
                 static_cast<long long>(timing_calls_), static_cast<long long>(timing_rows_),
                 timing_sum_[0] / timing_calls_, pack_threads_, timing_sum_[1] / timing_calls_,
                 timing_sum_[2] / timing_calls_, timing_sum_[3] / timing_calls_);
  for (auto e : timing_ev_)
    if (e) cudaEventDestroy(e);
  drop_graphs();
  for (auto& bk : buckets_)
    if (bk && bk->done) cudaEventDestroy(bk->done);
  for (auto& bk : buckets_)
    if (bk && bk->copied) cudaEventDestroy(bk->copied);
  for (auto e : events_) cudaEventDestroy(e);
  inputs_.reset();
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  lt_.reset();
  lt_side_.reset();
  if (blas_) cublasDestroy(blas_);
  if (blas_side_) cublasDestroy(blas_side_);
  for (auto st : {stream_, copy_, side_})
    if (st) cudaStreamDestroy(st);
}

void DlrmCuda::check_batch(const io::Batch& b) const {
  cuda_step::check_batch(b, num_dense_, T_, "DLRM");
}

void DlrmCuda::ensure_capacity(int64_t B, int64_t nnz) {
  if (B <= cap_b_ && nnz <= cap_nnz_) return;
  for (auto st : {copy_, side_, stream_}) DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
  drop_graphs();  // they hold the old buffers
  const int64_t nb = std::max(B, cap_b_), nn_ = std::max<int64_t>(std::max(nnz, cap_nnz_), 1);
  DLREC_CHECK(nn_ < (int64_t{1} << 31) && nb * T_ < (int64_t{1} << 31),
              "CUDA DLRM: a batch with ", nn_, " ids is too large (int32 offsets)");
  cap_b_ = nb;
  cap_nnz_ = nn_;
  const int64_t cb = std::max<int64_t>(nb, 1);
  const DType act = half_ ? hdt_ : DType::F32;
  emb_out_ = dev_tensor({cb, std::max<int64_t>(T_, 1), dim_}, act);
  d_emb_ = dev_tensor({cb, std::max<int64_t>(T_, 1), dim_});  // f32: the tables' gradients
  inter_ = dev_tensor({cb, inter_ld_}, act);
  d_dense_ = dev_tensor({cb, std::max<int64_t>(dense_dim_, 1)}, act);
  dlogits_ = dev_tensor({cb});
  if (half_) {
    dlogits_h_ = dev_tensor({cb}, hdt_);
    dense_h_ = dev_tensor({cb, bottom_.front().in_pad}, hdt_);
  }
  int64_t max_out = 1;
  for (auto* mlp : {&bottom_, &top_})
    for (auto& l : *mlp) {
      max_out = std::max(max_out, l.out);
      l.y = dev_tensor({cb, l.out}, l.out_f32 ? DType::F32 : act);
      l.dz = l.relu ? dev_tensor({cb, l.out}, act) : Tensor();
      l.dx = dev_tensor({cb, l.in_pad}, act);
      if (half_ && l.relu) l.aux = dev_tensor({cb * l.aux_ld / 8}, DType::U8);
    }
  bgrad_partial_ = dev_tensor({std::max<int64_t>(cd::bias_grad_chunks(cb), 1), max_out});
  bgrad_partial_side_ = dev_tensor({std::max<int64_t>(cd::bias_grad_chunks(cb), 1), max_out});
  const size_t sb = ce::scratch_bytes(nn_, key_bits_, static_cast<int>(dim_));
  scratch_mem_ = dev_tensor({static_cast<int64_t>(sb)}, DType::U8);
  scratch_ = ce::carve(scratch_mem_.raw(), nn_, key_bits_, static_cast<int>(dim_));
  ce::prepare(scratch_, stream_);
  inputs_->allocate(cb, nn_, num_dense_, T_);
}

void DlrmCuda::upload(const io::Batch& b, float lr, float emb_lr) {
  const int64_t B = b.rows;
  int64_t nnz = 0;
  for (int64_t t = 0; t < T_; ++t) nnz += b.cat_offsets[t][B] - b.cat_offsets[t][0];
  ensure_capacity(B, nnz);
  cur_ = inputs_->upload(b, layout_.cardinalities, &row_base_host_, lr, emb_lr,
                         overlap_ ? copy_ : stream_, stream_, "DLRM");
  fwd_rows_ = B;
  fwd_nnz_ = nnz;
  absorb_external_writes();
}

void DlrmCuda::mlp_forward(std::vector<DenseLayer>& mlp, const void* x, int64_t B,
                           cudaStream_t st, lt::Lt* lth, cublasHandle_t h) {
  const float one = 1.f, zero = 0.f;
  // DLREC_PROFILE: one phase per layer ("top mlp fwd 0", ...).
  static const auto names = [] {
    std::vector<std::string> v;
    for (const char* m : {"bottom", "top"})
      for (int i = 0; i < 16; ++i) v.push_back(std::string(m) + " mlp fwd " + std::to_string(i));
    return v;
  }();
  const size_t name0 = &mlp == &top_ ? 16 : 0;
  for (auto& l : mlp) {
    if (profile_ && &l != &mlp.front() && &l - &mlp.front() < 16)
      mark(names[name0 + static_cast<size_t>(&l - &mlp.front()) - 1].c_str());
    l.x = x;
    if (!half_) {
      float* y = l.y.data<float>();
      // Row-major y [B, out] = x [B, in] W^T, i.e. column-major y^T = W x^T.
      DLREC_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(l.out),
                                     static_cast<int>(B), static_cast<int>(l.in), &one,
                                     l.w.data<float>(), static_cast<int>(l.in),
                                     static_cast<const float*>(x), static_cast<int>(l.in), &zero,
                                     y, static_cast<int>(l.out)));
      cd::bias_act(y, l.b.data<float>(), B, l.out, l.relu, st);
      x = y;
      continue;
    }
    // Inference of a few rows (serving at batch 1..8): the warp-per-output kernel instead of a
    // GEMM that streams the whole weight matrix through a few thread blocks.
    if (skinny_ && !have_training_forward_ && B <= cd::kSkinnyRows) {
      bool done = false;
      with_half(fp16_, [&](auto h) {
        using H = decltype(h);
        done = cd::skinny_linear(static_cast<const H*>(l.wh.raw()), static_cast<const H*>(x), B,
                                 l.out, l.in_pad, l.out_f32 ? l.b.raw() : l.bh.raw(), l.relu,
                                 l.y.raw(), l.out_f32, st);
      });
      if (done) {
        l.aux_valid = false;  // no ReLU mask written (a backward needs a training forward)
        x = l.y.raw();
        continue;
      }
    }
    // 16-bit: column-major y^T [out, B] = Wh^T... with Wh stored [out, in_pad] row-major.
    lt::Gemm g = lt::Gemm::shape(true, false, l.out, B, l.in_pad, l.in_pad, l.in_pad, l.out);
    g.ab_type = h16_;
    g.d_type = l.out_f32 ? CUDA_R_32F : h16_;
    g.epi = l.relu ? lt::Epi::ReluAuxBias : lt::Epi::Bias;
    g.aux_ld = l.aux_ld;
    void* bias = l.out_f32 ? l.b.raw() : l.bh.raw();
    l.aux_valid = lth->run(g, l.wh.raw(), x, l.y.raw(), bias, l.relu ? l.aux.raw() : nullptr, st);
    if (!l.aux_valid) {
      DLREC_CUBLAS_CHECK(cublasGemmEx(
          h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(l.out), static_cast<int>(B),
          static_cast<int>(l.in_pad), &one, l.wh.raw(), h16_, static_cast<int>(l.in_pad),
          x, h16_, static_cast<int>(l.in_pad), &zero, l.y.raw(), g.d_type,
          static_cast<int>(l.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      if (l.out_f32) cd::bias_act(l.y.data<float>(), l.b.data<float>(), B, l.out, l.relu, st);
      else
        with_half(fp16_, [&](auto h) {
          using H = decltype(h);
          cd::bias_act(hp<H>(l.y), hp<H>(l.bh), B, l.out, l.relu, st);
        });
    }
    l.aux_valid = l.aux_valid && l.relu;
    x = l.y.raw();
  }
}

const void* DlrmCuda::mlp_backward(std::vector<DenseLayer>& mlp, const void* dy, int64_t B,
                                   bool need_dx, cudaStream_t st, lt::Lt* lth, cublasHandle_t h,
                                   Tensor& partial) {
  const float one = 1.f, zero = 0.f;
  const int b = static_cast<int>(B);
  if (!half_) {
    for (size_t k = mlp.size(); k-- > 0;) {
      DenseLayer& l = mlp[k];
      // ReLU mask and bias gradient in one pass over dy.
      cd::mask_bias_grad(static_cast<const float*>(dy), l.relu ? l.y.data<float>() : nullptr,
                         l.relu ? l.dz.data<float>() : nullptr, partial.data<float>(),
                         l.db.data<float>(), B, l.out, st);
      const float* dz = l.relu ? l.dz.data<float>() : static_cast<const float*>(dy);
      const int in = static_cast<int>(l.in), out = static_cast<int>(l.out);
      // dW [out, in] = dz^T x: column-major dW^T [in, out] = x^T [in, B] dz [B, out].
      DLREC_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one,
                                     static_cast<const float*>(l.x), in, dz, out, &zero,
                                     l.dw.data<float>(), in));
      if (k > 0 || need_dx) {
        // dx [B, in] = dz W: column-major dx^T [in, B] = W^T [in, out] dz^T [out, B].
        DLREC_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one,
                                       l.w.data<float>(), in, dz, out, &zero, l.dx.data<float>(),
                                       in));
        dy = l.dx.raw();
      } else {
        dy = nullptr;
      }
    }
    return dy;
  }
  // 16-bit: `dy` is already the gradient of the last layer's pre-activation (its ReLU, if any,
  // was applied by whoever produced it); the previous layer's ReLU is applied to each dgrad.
  // Default: plain GEMMs, and after each dgrad one pass that masks it by the previous layer's
  // ReLU and sums that layer's bias gradient (mask_bias_grad). With DLREC_BWD_EPILOGUES=1 the
  // same is done by cuBLASLt's BGRADB (wgrad) and DRELU (dgrad) epilogues instead — measured
  // slower on an H100 (bench/RESULTS.md), hence not the default.
  const void* dz = dy;
  bool db_done = false;  // the bias gradient of layer k was summed by the pass after dgrad k+1
  for (size_t k = mlp.size(); k-- > 0;) {
    DenseLayer& l = mlp[k];
    const int in_pad = static_cast<int>(l.in_pad), out = static_cast<int>(l.out);
    // dW^T [in_pad, out] (f32) = x^T [in_pad, B] dz [B, out].
    lt::Gemm wg = lt::Gemm::shape(false, true, in_pad, out, B, in_pad, out, in_pad);
    wg.ab_type = h16_;
    wg.d_type = CUDA_R_32F;
    wg.epi = lt::Epi::BGradB;
    const bool fused_wgrad =
        bwd_epilogues_ && lth->run(wg, l.x, dz, l.dw.raw(), l.db.raw(), nullptr, st);
    if (!fused_wgrad) {
      DLREC_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, in_pad, out, b, &one, l.x,
                                      h16_, in_pad, dz, h16_, out, &zero,
                                      l.dw.raw(), CUDA_R_32F, in_pad, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
      if (!db_done)
        with_half(fp16_, [&](auto h) {
          using H = decltype(h);
          cd::mask_bias_grad(static_cast<const H*>(dz), nullptr, nullptr, partial.data<float>(),
                             l.db.data<float>(), B, l.out, st);
        });
    }
    db_done = false;
    if (k == 0 && !need_dx) return nullptr;
    // dx^T [in_pad, B] = Wh [in_pad, out] (column-major view) dz^T [out, B]; into the previous
    // layer's dz with its ReLU applied when there is one.
    DenseLayer* prev = k > 0 ? &mlp[k - 1] : nullptr;
    void* dst = prev ? prev->dz.raw() : l.dx.raw();
    lt::Gemm dg = lt::Gemm::shape(false, false, in_pad, B, out, in_pad, out, in_pad);
    dg.ab_type = h16_;
    dg.d_type = h16_;
    bool done = false;
    if (prev && prev->aux_valid && bwd_epilogues_) {
      dg.epi = lt::Epi::DRelu;
      dg.aux_ld = prev->aux_ld;
      done = lth->run(dg, l.wh.raw(), dz, dst, nullptr, prev->aux.raw(), st);
    }
    if (!done) {
      void* tmp = prev ? l.dx.raw() : dst;
      DLREC_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in_pad, b, out, &one,
                                      l.wh.raw(), h16_, in_pad, dz, h16_, out,
                                      &zero, tmp, h16_, in_pad, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
      if (prev) {
        // dReLU and the previous layer's bias gradient in one pass.
        with_half(fp16_, [&](auto h) {
          using H = decltype(h);
          cd::mask_bias_grad(hp<H>(l.dx), hp<H>(prev->y), hp<H>(prev->dz),
                             partial.data<float>(), prev->db.data<float>(), B, prev->out, st);
        });
        db_done = true;
      }
    }
    dz = dst;
  }
  return dz;
}

void DlrmCuda::dense_updates(std::vector<DenseLayer>& mlp, cudaStream_t st) {
  for (auto& l : mlp)
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::optimizer_step(l.w.data<float>(), l.dw.data<float>(),
                         adagrad_ ? l.sw.data<float>() : nullptr, l.out, l.in, l.in_pad,
                         half_ ? hp<H>(l.wh) : nullptr, l.in_pad, lr_ptr(), eps_, st, gscale());
      cd::optimizer_step(l.b.data<float>(), l.db.data<float>(),
                         adagrad_ ? l.sb.data<float>() : nullptr, 1, l.out, l.out,
                         half_ ? hp<H>(l.bh) : nullptr, l.out, lr_ptr(), eps_, st, gscale());
    });
}

void DlrmCuda::run_forward(bool training) {
  const int64_t B = fwd_rows_;
  have_training_forward_ = training;
  if (B == 0) return;
  const InputSlot& sl = inputs_->slots[cur_];
  // Bottom MLP on the side stream, beside the embedding lookup.
  cudaStream_t bs = side();
  const bool fork = bs != stream_;
  if (fork) {
    DLREC_CUDA_CHECK(cudaEventRecord(fork_, stream_));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(bs, fork_, 0));
  }
  const float* dense_in = infer_in_.dense ? infer_in_.dense : sl.d_dense.data<float>();
  const void* dense = dense_in;
  if (half_) {
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::to_half_padded(dense_in, B, num_dense_, hp<H>(dense_h_),
                         bottom_.front().in_pad, bs);
    });
    dense = dense_h_.raw();
  }
  if (!bottom_.empty()) {
    mlp_forward(bottom_, dense, B, bs, fork ? lt_side_.get() : lt_.get(),
                fork ? blas_side_ : blas_);
    dense = bottom_.back().y.raw();
  }
  if (fork) DLREC_CUDA_CHECK(cudaEventRecord(join_, bs));
  mark("bottom mlp fwd");
  const auto* offsets = infer_in_.offsets ? infer_in_.offsets : sl.d_offsets.data<int32_t>();
  const auto* keys =
      infer_in_.keys ? infer_in_.keys : static_cast<const uint32_t*>(sl.d_keys.raw());
  const int T = static_cast<int>(T_), d = static_cast<int>(dim_);
  if (half_)
    with_half(fp16_, [&](auto h) {
      ce::forward(tab_, offsets, keys, B, mean_, hp<decltype(h)>(emb_out_), stream_);
    });
  else ce::forward(tab_, offsets, keys, B, mean_, emb_out_.data<float>(), stream_);
  mark("embedding fwd");
  if (fork) DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
  if (half_)
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::dot_forward(static_cast<const H*>(dense), hp<H>(emb_out_), B, T, d, hp<H>(inter_),
                      inter_ld_, stream_);
    });
  else if (dot_)
    cd::dot_forward(static_cast<const float*>(dense), emb_out_.data<float>(), B, T, d,
                    inter_.data<float>(), inter_ld_, stream_);
  else
    cd::cat_forward(static_cast<const float*>(dense), emb_out_.data<float>(), B,
                    static_cast<int>(dense_dim_), T_ * dim_, inter_.data<float>(), stream_);
  mark("interaction fwd");
  mlp_forward(top_, inter_.raw(), B, stream_, lt_.get(), blas_);
  mark("top mlp fwd");
}

void DlrmCuda::run_backward_update() {
  const int64_t B = fwd_rows_;
  if (B == 0) return;
  trained_ = true;
  const InputSlot& sl = inputs_->slots[cur_];
  const void* dlog = half_ ? dlogits_h_.raw() : dlogits_.raw();
  const void* dinter = mlp_backward(top_, dlog, B, true, stream_, lt_.get(), blas_,
                                    bgrad_partial_);
  mark("top mlp bwd");
  const void* dense = bottom_.empty() ? sl.d_dense.raw() : bottom_.back().y.raw();
  const int T = static_cast<int>(T_), d = static_cast<int>(dim_);
  if (half_)
    with_half(fp16_, [&](auto h) {
      using H = decltype(h);
      cd::dot_backward(static_cast<const H*>(dense), hp<H>(emb_out_),
                       static_cast<const H*>(dinter), inter_ld_, B, T, d, bottom_.back().relu,
                       hp<H>(d_dense_), d_emb_.data<float>(), stream_);
    });
  else if (dot_)
    cd::dot_backward(static_cast<const float*>(dense), emb_out_.data<float>(),
                     static_cast<const float*>(dinter), inter_ld_, B, T, d, false,
                     d_dense_.data<float>(), d_emb_.data<float>(), stream_);
  else
    cd::cat_backward(static_cast<const float*>(dinter), B, static_cast<int>(dense_dim_),
                     T_ * dim_, d_dense_.data<float>(), d_emb_.data<float>(), stream_);
  mark("interaction bwd");
  // The bottom MLP's backward and update on the side stream, beside the embedding update.
  cudaStream_t bs = side();
  const bool fork = bs != stream_;
  if (fork) {
    DLREC_CUDA_CHECK(cudaEventRecord(fork_, stream_));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(bs, fork_, 0));
  }
  if (!bottom_.empty()) {
    mlp_backward(bottom_, d_dense_.raw(), B, false, bs, fork ? lt_side_.get() : lt_.get(),
                 fork ? blas_side_ : blas_, fork ? bgrad_partial_side_ : bgrad_partial_);
    if (!fp16_) dense_updates(bottom_, bs);
  }
  if (fork) DLREC_CUDA_CHECK(cudaEventRecord(join_, bs));
  if (fp16_) {
    // Every gradient exists before any update: check them, then update the scale and the
    // bottom MLP (again beside the embedding update).
    if (fork) DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
    check_gradients(stream_);
    if (fork) {
      DLREC_CUDA_CHECK(cudaEventRecord(fork_, stream_));
      DLREC_CUDA_CHECK(cudaStreamWaitEvent(bs, fork_, 0));
    }
    dense_updates(bottom_, bs);
    if (fork) DLREC_CUDA_CHECK(cudaEventRecord(join_, bs));
  }
  mark("bottom mlp bwd+update");
  dense_updates(top_, stream_);
  mark("top optimizer");
  ce::backward_update(tab_, sl.d_offsets.data<int32_t>(),
                      static_cast<const uint32_t*>(sl.d_keys.raw()), B, fwd_nnz_, mean_,
                      d_emb_.data<float>(), adagrad_ ? ce::Update::Adagrad : ce::Update::SGD,
                      lr_ptr() + 1, eps_, key_bits_, scratch_, stream_, gscale());
  mark("embedding bwd+update");
  if (fork) DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_, 0));
}

void DlrmCuda::step_body() {
  const InputSlot& sl = inputs_->slots[cur_];
  run_forward(true);
  have_training_forward_ = false;
  if (fp16_)  // dL/dlogits times the loss scale, in fp16
    cd::bce_with_logits(top_.back().y.data<float>(), sl.d_labels.data<float>(), fwd_rows_,
                        dlogits_.data<float>(), static_cast<double*>(loss_.raw()), stream_,
                        hp<f16>(dlogits_h_), ls_.scale);
  else
    cd::bce_with_logits(top_.back().y.data<float>(), sl.d_labels.data<float>(), fwd_rows_,
                        dlogits_.data<float>(), static_cast<double*>(loss_.raw()), stream_,
                        half_ ? hp<bf16>(dlogits_h_) : nullptr);
  mark("bce");
  run_backward_update();
}

Tensor DlrmCuda::forward(const io::Batch& batch, bool training) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  have_training_forward_ = false;
  // Phases are profiled in train_step, and here only in a model that never trained (the
  // serving engine's breakdown: `dlrec bench infer` with DLREC_PROFILE=1).
  const bool profile_here = profile_ && !trained_;
  if (profile_here) mark("begin");
  upload(batch, 0.f, 0.f);
  if (profile_here) {
    mark("h2d (+host packing)");
    // The GPU waits ~2 ms while the host queues the forward behind it, so that the phases
    // below measure the kernels back to back (as in a CUDA graph), not the launch gaps.
    gpu_sleep_kernel<<<1, 1, 0, stream_>>>(2000000);
    DLREC_CUDA_CHECK(cudaGetLastError());
    mark("(gpu sleep: launches queue up)");
  }
  run_forward(training);
  const int64_t B = fwd_rows_;
  // A copy: callers may keep logits across steps, the buffer is reused.
  Tensor logits = dev_tensor({B});
  if (B)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(logits.raw(), top_.back().y.raw(), sizeof(float) * B,
                                     cudaMemcpyDeviceToDevice, stream_));
  if (!training) DLREC_CUDA_CHECK(cudaEventRecord(inputs_->slots[cur_].free, stream_));
  // Callers read the logits with legacy-stream copies, which do not wait for our streams.
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profile_here) flush_profile();
  mark_names_.clear();
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
  InputSlot& sl = inputs_->slots[cur_];
  // The learning rates go through the slot's pinned buffer (its copy was waited for in
  // upload, and the next upload into it waits for this copy).
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  sl.lr[0] = static_cast<float>(oc_.lr * lr_scale);
  sl.lr[1] = static_cast<float>((oc_.embedding_lr >= 0 ? oc_.embedding_lr : oc_.lr) * lr_scale);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(sl.d_lr.raw(), sl.lr, sizeof(float) * 2,
                                   cudaMemcpyHostToDevice, stream_));
  if (fwd_rows_)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dlogits_.raw(), dlogits.raw(), sizeof(float) * fwd_rows_,
                                     dlogits.device().is_cuda() ? cudaMemcpyDeviceToDevice
                                                                : cudaMemcpyHostToDevice,
                                     stream_));
  if (fp16_ && fwd_rows_)
    cd::scale_to_f16(dlogits_.data<float>(), fwd_rows_, ls_.scale, hp<f16>(dlogits_h_), stream_);
  else if (half_ && fwd_rows_)
    cd::to_half_padded(dlogits_.data<float>(), fwd_rows_, 1, hp<bf16>(dlogits_h_), 1, stream_);
  run_backward_update();
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, stream_));
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
  const float lr = static_cast<float>(oc_.lr * lr_scale);
  const float emb_lr =
      static_cast<float>((oc_.embedding_lr >= 0 ? oc_.embedding_lr : oc_.lr) * lr_scale);
  upload(batch, lr, emb_lr);
  if (profile_)
    host_pack_ms_ +=
        (seen_steps_ >= 3) *
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  mark("h2d (+host packing)");
  InputSlot& sl = inputs_->slots[cur_];
  run_step(sl, fwd_rows_, fwd_nnz_, graphs_, stream_, [&] { step_body(); });
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, stream_));
  flush_profile();
  if (!want_loss) return std::numeric_limits<double>::quiet_NaN();
  double loss = 0;
  DLREC_CUDA_CHECK(
      cudaMemcpyAsync(&loss, loss_.raw(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return loss;
}

void DlrmCuda::infer_body(InferBucket& bk) {
  const int64_t R = bk.rows;
  cur_ = 0;
  fwd_rows_ = R;
  fwd_nnz_ = R * T_;
  // The inputs were copied into bk.d_in by infer_launch (on the copy stream, outside the
  // graph, so that the copy of the next chunk overlaps this one); the offsets (one id per bag)
  // are the bucket's constants.
  infer_in_.dense = static_cast<const float*>(bk.d_in.raw());
  infer_in_.keys = reinterpret_cast<const uint32_t*>(infer_in_.dense + R * num_dense_);
  infer_in_.offsets = bk.d_offsets.data<int32_t>();
  try {
    run_forward(false);
  } catch (...) {
    infer_in_ = {};
    throw;
  }
  infer_in_ = {};
  cd::sigmoid(top_.back().y.data<float>(), bk.d_probs.data<float>(), R, stream_);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(bk.probs, bk.d_probs.raw(), sizeof(float) * R,
                                   cudaMemcpyDeviceToHost, stream_));
}

DlrmCuda::InferBucket& DlrmCuda::infer_bucket(int64_t R, int parity) {
  int lg = 0;
  while ((int64_t{1} << lg) < R) ++lg;
  const size_t i = static_cast<size_t>(2 * lg + parity);
  if (buckets_.size() <= i) buckets_.resize(i + 1);
  if (R > cap_b_ || R * T_ > cap_nnz_) ensure_capacity(R, std::max<int64_t>(R * T_, 1));
  auto& bkp = buckets_[i];
  if (!bkp) {
    bkp = std::make_unique<InferBucket>();
    InferBucket& bk = *bkp;
    bk.rows = R;
    const size_t in_bytes = sizeof(float) * R * num_dense_ + sizeof(uint32_t) * R * T_ + 64;
    // Mapped, so that the fused small-batch kernel can read it in place.
    auto mapped_alloc = [](size_t bytes) {
      void* q = nullptr;
      DLREC_CUDA_CHECK(cudaHostAlloc(&q, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      return PinnedPtr(q);
    };
    bk.in = mapped_alloc(in_bytes);
    std::memset(bk.in.get(), 0, in_bytes);
    bk.dense = static_cast<float*>(bk.in.get());
    bk.keys = reinterpret_cast<uint32_t*>(bk.dense + R * num_dense_);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t r = 0; r < R; ++r) bk.keys[t * R + r] = row_base_host_[t];  // padding: row 0
    bk.out = mapped_alloc(sizeof(float) * R);
    void* din = nullptr;
    void* dout = nullptr;
    DLREC_CUDA_CHECK(cudaHostGetDevicePointer(&din, bk.in.get(), 0));
    DLREC_CUDA_CHECK(cudaHostGetDevicePointer(&dout, bk.out.get(), 0));
    bk.dev_in = din;
    bk.dev_out = static_cast<float*>(dout);
    bk.probs = static_cast<float*>(bk.out.get());
    std::vector<int32_t> off(R * T_ + 1);
    for (int64_t k = 0; k <= R * T_; ++k) off[k] = static_cast<int32_t>(k);
    bk.d_offsets = Tensor::from_vector(off, {R * T_ + 1}, dev_);
    bk.d_in = dev_tensor({static_cast<int64_t>(in_bytes)}, DType::U8);
    bk.d_probs = dev_tensor({R});
    DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&bk.done, cudaEventDisableTiming));
    DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&bk.copied, cudaEventDisableTiming));
  }
  return *bkp;
}

void DlrmCuda::infer_launch(InferBucket& bk, bool copy_aside) {
  const size_t bytes = sizeof(float) * bk.rows * num_dense_ + sizeof(uint32_t) * bk.rows * T_;
  if (bytes) {
    cudaStream_t cs = overlap_ && copy_aside ? copy_ : stream_;
    DLREC_CUDA_CHECK(cudaMemcpyAsync(bk.d_in.raw(), bk.in.get(), bytes, cudaMemcpyHostToDevice,
                                     cs));
    if (cs != stream_) {
      DLREC_CUDA_CHECK(cudaEventRecord(bk.copied, cs));
      DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, bk.copied, 0));
    }
  }
  if (timing_ && !copy_aside) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[1], stream_));
  if (graphs_ && !bk.graph && !bk.no_graph) {
    infer_body(bk);  // eager once: plans, tuning and lazy loading outside the capture
    DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    bk.graph = capture_graph(stream_, [&] { infer_body(bk); }, "inference step");
    bk.no_graph = bk.graph == nullptr;
  }
  if (bk.graph) DLREC_CUDA_CHECK(cudaGraphLaunch(bk.graph, stream_));
  else infer_body(bk);
  DLREC_CUDA_CHECK(cudaEventRecord(bk.done, stream_));
}

bool DlrmCuda::fused_launch(InferBucket& bk, int64_t n) {
  namespace fi = fused_infer;
  fi::Params p;
  p.nb = static_cast<int>(bottom_.size());
  p.nt = static_cast<int>(top_.size());
  std::string why;
  if (p.nb + p.nt > fi::kMaxLayers) {
    why = "more than " + std::to_string(fi::kMaxLayers) + " layers";
  } else {
    p.dense = static_cast<const float*>(bk.dev_in);
    p.keys = reinterpret_cast<const uint32_t*>(p.dense + bk.rows * num_dense_);
    p.probs = bk.dev_out;
    p.rows = static_cast<int>(n);
    p.ld_keys = static_cast<int>(bk.rows);
    p.num_dense = static_cast<int>(num_dense_);
    p.T = static_cast<int>(T_);
    p.d = static_cast<int>(dim_);
    p.inter_ld = static_cast<int>(inter_ld_);
    p.emb = emb_out_.raw();
    p.inter = inter_.raw();
    p.tables = tab_.weights;
    p.row_base = tab_.row_base;
    int i = 0;
    for (auto* mlp : {&bottom_, &top_})
      for (auto& l : *mlp) {
        fi::Layer& f = p.layer[i++];
        f.w = l.wh.raw();
        f.b = l.out_f32 ? l.b.raw() : l.bh.raw();
        f.y = l.y.raw();
        f.out = static_cast<int>(l.out);
        f.k = static_cast<int>(l.in_pad);
        f.relu = l.relu;
        f.f32_out = l.out_f32;
      }
    why = fi::unsupported(p);
  }
  if (!why.empty()) {
    std::fprintf(stderr, "[dlrec] fused small-batch inference off for this model: %s\n",
                 why.c_str());
    fused_ = false;
    return false;
  }
  if (!fused_barrier_.defined()) {
    fused_barrier_ = dev_tensor({8}, DType::U8);
    DLREC_CUDA_CHECK(cudaMemsetAsync(fused_barrier_.raw(), 0, 8, stream_));
  }
  p.barrier = static_cast<unsigned*>(fused_barrier_.raw());
  fi::launch(p, fp16_, fused_blocks_, fused_coop_, &fused_counter_, stream_);
  return true;
}

// The packing team of predict(), shared by all models of the process (model instances serving
// at once take turns: a packing lasts microseconds), so that no more than `size` threads spin.
// Created on first use with the size asked for then (DLREC_INFER_PACK_THREADS is per process).
SpinTeam& pack_team(int size) {
  static SpinTeam team(size);
  return team;
}

// Spins on the event rather than sleeping in a sync: serving wants the latency.
void spin_wait(cudaEvent_t e) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) DLREC_CUDA_CHECK(q);
  }
}

void DlrmCuda::predict(const io::Batch& batch, float* probs) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  const int64_t B = batch.rows;
  if (B == 0) return;
  auto eager = [&] {
    std::vector<float> z = forward(batch, false).to_vector<float>();
    for (int64_t i = 0; i < B; ++i) probs[i] = 1.f / (1.f + std::exp(-z[i]));
  };
  if (profile_) return eager();
  absorb_external_writes();
  const auto t_start = std::chrono::steady_clock::now();
  double pack_us = 0;  // DLREC_INFER_TIMING: host packing time of this call
  // Batches over infer_chunk_ rows (DLREC_INFER_CHUNK, default 8192) go in chunks through two
  // alternating buckets, so the host packs chunk c + 1 while the GPU runs chunk c.
  const int64_t chunk = std::min(B, infer_chunk_);
  int64_t R = 1;
  while (R < chunk) R *= 2;
  const int64_t nchunks = (B + chunk - 1) / chunk;
  int64_t pending[2] = {-1, -1};  // chunk waiting in bucket parity p
  auto finish = [&](int p) {
    if (pending[p] < 0) return;
    InferBucket& bk = infer_bucket(R, p);
    spin_wait(bk.done);
    const int64_t r0 = pending[p] * chunk, n = std::min(chunk, B - r0);
    std::memcpy(probs + r0, bk.probs, sizeof(float) * n);
    pending[p] = -1;
  };
  for (int64_t c = 0; c < nchunks; ++c) {
    const int p = static_cast<int>(c & 1);
    finish(p);  // the bucket's previous chunk must be out before repacking it
    InferBucket& bk = infer_bucket(R, p);
    const int64_t r0 = c * chunk, n = std::min(chunk, B - r0);
    // Pack rows [r0, r0 + n): dense rows, then one global row per (table, row); ids are
    // range-checked. A table with other than one id per row sends the batch to the eager
    // path. Small chunks are packed on this thread (waking threads costs more).
    std::atomic<bool> multi_hot{false};
    auto pack = [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        // One id per row: offsets o0, o0 + 1, ..., o0 + n (checked without branches, so the
        // loop vectorises; not read at all when the producer promises one id per row), then
        // ids range-checked (unsigned: negatives too) and offset.
        int64_t o0 = r0;
        if (!batch.one_id_per_row) {
          const int64_t* o = batch.cat_offsets[t].data() + r0;
          o0 = o[0];
          int64_t diff = 0;
          for (int64_t r = 1; r <= n; ++r) diff |= o[r] - o0 - r;
          if (diff != 0) {
            multi_hot = true;
            return;
          }
        }
        DLREC_CHECK(static_cast<int64_t>(batch.cat_indices[t].size()) >= o0 + n,
                    "predict: feature ", t, " has ", batch.cat_indices[t].size(), " ids for ",
                    o0 + n, " rows (a batch promising one id per row must hold one per row)");
        const int64_t* ids = batch.cat_indices[t].data() + o0;
        const int64_t rows = layout_.cardinalities[t];
        const uint32_t base = row_base_host_[t];
        uint32_t* k = bk.keys + t * R;
        // 0 <= id < rows  <=>  the sign bits of id and of ~(id - rows) are both clear: adds,
        // nots and ors only, so the loop vectorises without 64-bit compares.
        // (Unsigned arithmetic: no overflow for any id.)
        const uint64_t urows = static_cast<uint64_t>(rows);
        uint64_t sign = 0;
        for (int64_t r = 0; r < n; ++r) {
          const uint64_t id = static_cast<uint64_t>(ids[r]);
          sign |= id | ~(id - urows);
          k[r] = base + static_cast<uint32_t>(id);
        }
        if (sign >> 63) {
          for (int64_t r = 0; r < n; ++r) k[r] = base;  // padding of later calls stays valid
          for (int64_t r = 0; r < n; ++r)
            if (ids[r] < 0 || ids[r] >= rows)
              fail("EmbeddingBag: id ", ids[r], " of table ", t, " is out of range [0, ", rows,
                   ")");
        }
      }
    };
    try {
      // Up to 16384 ids on this thread; more on the packing team (threads that stay awake
      // between calls: a dispatch costs no wake-up), a contiguous range of tables each.
      constexpr int64_t kSerialIds = 16384;
      if (n * T_ <= kSerialIds || pack_threads_ == 1) {
        pack(0, T_);
      } else {
        SpinTeam& team = pack_team(pack_threads_);
        const int64_t parts = team.size();
        team.run([&](int i) { pack(T_ * i / parts, T_ * (i + 1) / parts); });
      }
    } catch (...) {
      finish(0);
      finish(1);
      throw;
    }
    if (multi_hot) {
      for (int64_t t = 0; t < T_; ++t)
        for (int64_t r = 0; r < n; ++r) bk.keys[t * R + r] = row_base_host_[t];
      finish(0);
      finish(1);
      return eager();
    }
    if (n * num_dense_ > 0)
      std::memcpy(bk.dense, batch.dense.data() + r0 * num_dense_, sizeof(float) * n * num_dense_);
    if (timing_)
      pack_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                           t_start).count();
    // Rows n..R-1 keep an earlier call's inputs: valid rows and finite values, outputs unread.
    if (timing_ && nchunks == 1) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[0], stream_));
    const bool fuse = nchunks == 1 && n <= fused_rows_ && fused_ && half_;
    if (fuse && timing_) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[1], stream_));  // no copy
    if (fuse && fused_launch(bk, n)) {
      DLREC_CUDA_CHECK(cudaEventRecord(bk.done, stream_));
    } else {
      infer_launch(bk, nchunks > 1);
    }
    if (timing_ && nchunks == 1) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[2], stream_));
    pending[p] = c;
  }
  for (int64_t c = std::max<int64_t>(0, nchunks - 2); c < nchunks; ++c) finish(static_cast<int>(c & 1));
  if (timing_ && nchunks == 1 && timing_skip_ > 0) {
    --timing_skip_;
  } else if (timing_ && nchunks == 1) {
    float copy_ms = 0, graph_ms = 0;
    // The end event was recorded after bk.done, which is all that finish() waited for.
    DLREC_CUDA_CHECK(cudaEventSynchronize(timing_ev_[2]));
    DLREC_CUDA_CHECK(cudaEventElapsedTime(&copy_ms, timing_ev_[0], timing_ev_[1]));
    DLREC_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, timing_ev_[1], timing_ev_[2]));
    timing_sum_[0] += pack_us;
    timing_sum_[1] += 1000.0 * copy_ms;
    timing_sum_[2] += 1000.0 * graph_ms;
    timing_sum_[3] += std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t_start).count();
    ++timing_calls_;
    timing_rows_ = B;
  }
}

void DlrmCuda::synchronize() {
  DeviceGuard g(dev_index_);
  for (auto st : {copy_, side_, stream_}) DLREC_CUDA_CHECK(cudaStreamSynchronize(st));
}

std::vector<NamedTensor> DlrmCuda::parameters() {
  synchronize();
  shadows_stale_ = half_;  // the caller may write into the f32 masters
  exposed_ = true;
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
  exposed_ = true;
  std::vector<NamedTensor> out;
  // fp16: the loss-scale state (f32 scale, f32 1/scale, i32 overflow flag, i32 good steps,
  // i64 skipped steps), so that a resumed run continues with the same scale.
  if (fp16_) out.emplace_back("amp.loss_scale", ls_mem_);
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
                                          uint64_t seed, const std::string& precision) {
  DLREC_CHECK(device.is_cuda(), "make_dlrm_cuda: ", device.str(), " is not a CUDA device");
  return std::make_unique<DlrmCuda>(model, opt, layout, device, seed, precision);
}

}  // namespace dlrec::model
