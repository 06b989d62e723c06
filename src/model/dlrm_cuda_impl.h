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
// the second step of a shape on, the whole step is one CUDA graph replay (DlrmCudaOptions::
// cuda_graphs false turns that off).
//
// Precision (train.precision):
//   fp32  cuBLAS SGEMM without TF32 + own epilogue kernels: the parity reference on the GPU.
//   tf32  the same with TF32 tensor-core GEMMs.
//   bf16  bf16 weights copies and activations, fp32 master weights, fp32 embedding tables and
//         gradients of the tables, fp32 accumulation; forward GEMMs through cuBLASLt with fused
//         bias+ReLU epilogues (falling back to plain GEMMs + own kernels where cuBLASLt has no
//         algorithm); backward GEMMs followed by one fused dReLU + bias-gradient pass (faster
//         on an H100 than cuBLASLt's DRELU/BGRADB epilogues, bench/RESULTS.md); the dot
//         interaction on tensor cores.
//   fp16  the bf16 path with fp16 (half) in place of bf16, plus dynamic loss scaling: dL/dlogits
//         is multiplied by the loss scale S (optimizer.loss_scale_init, 2^16 by default)
//         before the fp16 backward; once every gradient exists, one pass checks them for
//         Inf/NaN; an overflowed step updates nothing and halves S, otherwise the optimizers see
//         the gradients times 1/S and S doubles after optimizer.loss_scale_growth_interval
//         (2000) good steps in a row. All of it is on the device (no host sync, one
//         CUDA graph); the count of skipped steps is printed when the model is destroyed.
//
// This header (internal) declares the model class; its definitions are in three files:
// dlrm_cuda.cu (building the model, buffers, inputs, state), dlrm_cuda_step.cu (forward,
// backward, updates, the training step) and dlrm_cuda_infer.cu (predict()).
#pragma once

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
#include "dlrec/core/gpu_resources.h"
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

namespace dlrec::model::dlrm_cuda_impl {

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
           Device device, uint64_t seed, const std::string& precision,
           const DlrmCudaOptions& options);
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
    gpu::GraphExec graph;
    bool no_graph = false;  // capture failed: eager
    gpu::Event done;
    gpu::Event copied;  // the input copy (copy stream) finished
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
  // Creates the streams, events, cuBLAS handles and cuBLASLt planners (all RAII members).
  void create_gpu_resources();
  // The MLPs (initialised on the CPU as the CPU model does, then copied), the tables
  // (initialised on the device), the fp16 loss-scale state; enqueued on stream_.
  void build_parameters(uint64_t seed);
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
  int growth_interval_ = 2000;  // optimizer.loss_scale_growth_interval
  bool trained_ = false;  // a training step ran (fp16: report the loss scale at the end)
  int64_t dim_, T_, num_dense_, dense_dim_, inter_out_, inter_ld_;
  bool dot_, mean_, adagrad_;
  float eps_, init_acc_;
  int key_bits_;
  // The device's shared resources (pooled cuBLAS/cuBLASLt handles with workspaces); the
  // streams and events are the last members (see there).
  std::shared_ptr<gpu::DeviceResources> res_;
  gpu::BlasLease blas_, blas_side_;
  std::unique_ptr<lt::Lt> lt_, lt_side_;
  bool overlap_ = true, graphs_ = true, shadows_stale_ = false;
  bool exposed_ = false;  // parameters()/optimizer_state() handed out tensors since last step
  void absorb_external_writes();  // waits for legacy-stream writes, refreshes bf16 copies

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
  int64_t infer_chunk_ = 8192;  // DlrmCudaOptions::infer_chunk: rows per graph launch
  // predict()'s packing of big chunks runs on a team of this many threads (1: on the caller
  // alone), one team per process (pack_team()).
  int pack_threads_ = 1;
  // predict() of 1..fused_rows_ rows in 16-bit modes: one fused kernel (DlrmCudaOptions; off
  // for this model once the kernel turned out not to take its shape); its grid (0: SM count).
  bool fused_ = true;
  int64_t fused_rows_ = 8;
  int fused_blocks_ = 0;
  Tensor fused_barrier_;          // the kernel's grid-barrier counter (u32, zeroed once)
  uint32_t fused_counter_ = 0;    // its value when the next launch starts
  // DLREC_INFER_TIMING=1: per predict() call of one chunk, the host packing time, the device
  // time of the input copy + graph, and the wall time, averaged and printed at destruction.
  bool timing_ = false;
  int64_t timing_skip_ = 20;  // the first calls build buckets, plans and graphs
  gpu::Event timing_ev_[3];  // before copy, after copy, after graph
  double timing_sum_[4] = {0, 0, 0, 0};  // packing, copy, graph, wall
  int64_t timing_calls_ = 0, timing_rows_ = 0;
  bool have_training_forward_ = false;

  // DLREC_PROFILE=1: device time per phase of train_step from events between the phases (one
  // host sync per step, everything on one stream, no graphs), printed at destruction.
  void mark(const char* phase);
  void flush_profile();
  bool profile_ = false;
  std::vector<gpu::Event> events_;
  std::vector<const char*> mark_names_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  int64_t profiled_steps_ = 0, seen_steps_ = 0;
  double host_pack_ms_ = 0;

  // Streams and events last: destroyed first (a Stream waits for its work when destroyed), so
  // that whatever the model enqueued is done before its buffers go back to the pool, also when
  // the constructor throws half-way.
  gpu::Event fork_, join_;
  gpu::Stream stream_, copy_, side_;
};

}  // namespace dlrec::model::dlrm_cuda_impl

