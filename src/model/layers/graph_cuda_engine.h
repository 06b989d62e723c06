// The CUDA graph engine's layer interface (include/dlrec/model/graph_cuda.h; the engine is
// src/model/graph_cuda.cu, each layer type's CUDA node is in src/model/layers/<type>_cuda.cu).
// Everything the nodes share: values (a layer's output and gradient), the engine (streams,
// handles, precision, the step's inputs, GEMM helpers), the dense-layer helper Lin and the node
// base class. Internal to dlrec_model; CUDA builds only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/gpu_resources.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/graph_cuda.h"
#include "dlrec/nn/row_quant.h"
#include "dlrec/nn/cross.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "nn/cross_cuda.h"
#if DLREC_WITH_CUTLASS
#include "fused/cross_fused.h"
#endif
#include "nn/compressed_linear_cuda.h"
#include "nn/dense_cuda.h"
#include "nn/embedding_cuda.h"
#include "nn/graph_layers_cuda.h"
#include "nn/lt_gemm.h"
#include "nn/qat_cuda.h"
#include "model/cuda_step.h"
#include "model/graph_hashed_cuda.h"
#include "model/layers/embedding_exchange_layout.h"
#include "model/layers/layer.h"

namespace dlrec::model::gpu_graph {

namespace ce = nn::cuda_emb;
namespace cd = nn::cuda_dense;
namespace cg = nn::cuda_graph;
namespace lt = nn::cuda_lt;
using bf16 = cd::bf16;
using f16 = cd::f16;

using namespace cuda_step;

inline cg::Elem elem(DType t) {
  return t == DType::BF16 ? cg::Elem::BF16 : t == DType::F16 ? cg::Elem::F16 : cg::Elem::F32;
}
inline cudaDataType_t cuda_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}
inline bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }
// Calls f with a null pointer of the 16-bit type `t` (bf16 or f16): the layers' launches for
// either 16-bit precision, f(static_cast<H*>(nullptr)) with H deduced from the argument.
template <class F>
void with_half(DType t, F&& f) {
  if (t == DType::F16) f(static_cast<f16*>(nullptr));
  else f(static_cast<bf16*>(nullptr));
}

struct Engine;
struct Lin;
struct Value {
  int64_t width = 0, ld = 0;
  std::vector<int64_t> fields;
  DType dt = DType::F32, gdt = DType::F32;
  Tensor y, g;  // [cap, ld]
  bool need_grad = false;
  bool has_grad = false;  // during backward: some consumer wrote g
  int consumers = 0;      // inputs of other layers that name this value
  // Set by the producer: a consumer whose backward forms g with one data GEMM, g = dz W (dz rows
  // dz_ld apart, W the Lin's weights; nothing accumulated), offers it here first; true: the
  // producer ran it (g written) with its own backward's first pass fused in.
  std::function<bool(Engine&, const Lin&, const void* dz, int64_t dz_ld)> fused_dgrad;
};

// y [B, out] = x [B, in] W^T (+ b, ReLU): the master weights w [out, in] (f32), their gradient
// dw [out, in_pad], optional Adagrad state, and in bf16 the compute copies wh [out, in_pad],
// bh [out]. `in_pad` is the row stride of the input (its producer's ld); the padding columns of
// wh and dw are zero.
struct Lin {
  int64_t in = 0, in_pad = 0, out = 0, out_ld = 0;
  bool has_bias = true, relu = false;
  Tensor w, b, dw, db, sw, sb, wh, bh;
  // bf16 ReLU layers: the ReLU bit mask cuBLASLt's epilogue writes (not read: the bits are not
  // exactly y > 0, see MlpNode; the epilogue is the one that fuses bias and ReLU)
  Tensor aux;
  int64_t aux_ld = 0;
  bool aux_written = false;  // the last forward wrote aux (cuBLASLt ran the RELU_AUX epilogue)
  const void* x = nullptr;  // input of the last forward
  // Serving a compressed export (GraphCuda::set_compressed): the layer's 2:4 / int8 kernels and
  // their per-batch-size choice; null: dense only.
  std::shared_ptr<nn::cuda_compress::CompressedLinear> comp;
  // The weight's name ("top.0.weight"), set where a report needs it (the serving breakdown).
  std::string name;
  // 2:4 pruning mask (GraphCuda::set_mask): device F32 0/1 [out, in]; the update writes 0
  // where it is 0. Undefined: dense.
  Tensor mask;
  // Quantization-aware training (GraphCuda::attach_qat): the forward computes with the
  // fake-quantized input and weights, the data gradient is gated (nn/qat_cuda.h). Null: fp32.
  std::shared_ptr<nn::cuda_qat::QatLayer> qat;
};

struct NamedState {
  std::string name;
  Tensor value, state;  // state undefined without one
};

// Data-parallel training across GPUs (GraphCuda::set_gradient_reducer; docs/DISTRIBUTED.md):
// every rank runs the step on its rows of the global batch; each dense layer's gradients are
// summed over the ranks (all_reduce on the communicator's stream, inside the step's graph)
// right before its update, on the weight stream beside the rest of the backward; the embedding
// layer gathers every rank's ids and pooled-row gradients and applies the update of the whole
// global batch on every rank (replicated tables, exactly the update of one GPU).
struct DataParallel {
  dist::Communicator* comm = nullptr;  // NCCL over the ranks' GPUs; null: one GPU
  cudaStream_t cst = nullptr;          // its stream
  gpu::Event to_comm, from_comm;
  // The dense layers' all-reduces: a second communicator (Communicator::duplicate) and its
  // stream, so that they neither wait behind the embedding's exchange nor hold it up (a dense
  // layer's all-reduce waits for its weight gradient on the low-priority weight stream); null:
  // on comm.
  dist::Communicator* dcomm = nullptr;
  cudaStream_t dcst = nullptr;
  gpu::Event to_dcomm, from_dcomm;
  bool d_pending = false;  // dense updates enqueued on dcst, not yet joined (join_weights)
  int rank = 0, ranks = 1;
  // This step (host): every rank's rows and ids in rank order, their sums.
  std::vector<int64_t> rows, nnz;
  int64_t global_rows = 0, global_nnz = 0;
  // Table-wise sharding (GraphCuda::shard_tables): the owner rank of each table of the
  // embedding layer (empty: tables replicated); this step's ids of table t on rank r at
  // table_nnz[r * T + t]; `step` is set while a training step (not an evaluation) runs.
  // `collective` is set while an evaluation forward of a sharded model runs (every rank runs
  // it, its counts exchanged like a step's): the embedding pools through the owners too.
  std::vector<int> table_owner;
  // Column-wise tables (table_owner[t] == dp::kColumnWiseOwner): their pieces, every rank's.
  std::vector<dp::ColPiece> col_pieces;
  // Hybrid tables (table_owner[t] == dp::kHybridOwner): each one's owner and frequent prefix.
  std::vector<dp::HybridTable> hybrid;
  std::vector<int64_t> table_nnz;
  bool step = false, collective = false;
};

// What every layer shares: streams, handles, precision, the step's inputs and rows.
struct Engine {
  Device dev;
  Precision prec = Precision::FP32;
  bool lowp = false;  // bf16 or fp16 precision: 16-bit activations and weight copies
  bool fp16 = false;  // fp16 precision: dynamic loss scaling (below)
  DType half = DType::BF16;  // the 16-bit compute type (bf16, or f16 in fp16)
  DType act = DType::F32;
  // fp16 loss scaling (GraphCuda::step_body): dL/dlogits is multiplied by the loss scale, every
  // parameter gradient is checked for Inf/NaN as it is formed (check_grad: sets *overflow) and
  // its update deferred (update()) until all of them are checked; the deferred updates then
  // run with the gradient factor *gscale (1 / scale, or 0: the step overflowed, nothing changes).
  const float* gscale = nullptr;
  int* overflow = nullptr;
  // The deferred updates: dense parameters (run on the weight stream) and tables (beside them,
  // on the main stream).
  std::vector<std::function<void()>> deferred, deferred_tables;
  // The streams are owned by the model (gpu::Stream members); these are non-owning copies that
  // weights() and the side stream swap in and out.
  cudaStream_t st = nullptr;
  gpu::BlasLease blas;  // leased from the device's pool (gpu_resources.h), bound to st
  std::unique_ptr<lt::Lt> lt;
  // The weight-gradient stream: weights() runs a layer's weight gradients and update there,
  // beside the data-gradient chain on st (own cuBLAS handle and cuBLASLt workspace; null: off).
  cudaStream_t wst = nullptr;
  gpu::BlasLease wblas;
  std::unique_ptr<lt::Lt> wlt;
  gpu::Event wfork, wjoin;
  bool w_pending = false;
  const GraphCudaOptions* opts = nullptr;  // the model's (engine paths that tests compare)
  // predict()'s forward (GraphCuda::infer_body): no backward follows, so layers may take
  // inference-only kernels (lin_forward: the warp-per-output layer for a few rows).
  bool serving = false;
  // The int8 GEMMs of compressed layers (GraphCuda::set_compressed; own planner: in fp32
  // precision `lt` is null, and fp32 GEMMs must not move to cuBLASLt).
  lt::Lt* comp_lt = nullptr;
  // DLREC_PROFILE=1: records a named event on st (sub-phases of a layer); null otherwise.
  std::function<void(const std::string&)> mark;
  // DLREC_PROFILE=timeline: records a named event on a given stream (the communicator's, around
  // each collective: on_comm); null otherwise.
  std::function<void(const std::string&, cudaStream_t)> mark_on;
  // The serving breakdown (GraphCuda::serving_breakdown): mark also after each dense layer's
  // forward (lin_forward), labelled with its name and kernel.
  bool mark_lins = false;
  // The tables' optimizer: emb_adagrad (an accumulator per value), emb_rowwise (one per row,
  // rowwise_adagrad), emb_adam (Adam: m, v and a step count per row) or emb_momentum (SGD with
  // momentum: a velocity per value; these three across GPUs on table-wise or data-parallel
  // tables only: GraphCuda::shard_tables), else SGD; emb_update() says which to the kernels. The dense layers': dense_adagrad, dense_adam, dense_momentum, else SGD
  // (dense_state, dense_step).
  bool dense_adagrad = false, dense_adam = false, dense_momentum = false;
  bool emb_adagrad = false, emb_rowwise = false, emb_adam = false, emb_momentum = false;
  nn::cuda_emb::Update emb_update() const {
    return emb_rowwise    ? nn::cuda_emb::Update::RowWiseAdagrad
           : emb_adam     ? nn::cuda_emb::Update::Adam
           : emb_momentum ? nn::cuda_emb::Update::Momentum
           : emb_adagrad  ? nn::cuda_emb::Update::Adagrad
                          : nn::cuda_emb::Update::SGD;
  }
  // eps / emb_eps: Adagrad's or Adam's epsilon (the kind's own config key); init_acc /
  // emb_init_acc: Adagrad's initial accumulator.
  float eps = 1e-8f, init_acc = 0.f, emb_eps = 1e-8f, emb_init_acc = 0.f;
  cd::AdamParams adam;         // the dense layers' Adam (its eps: `eps` above)
  float emb_beta1 = 0.9f, emb_beta2 = 0.999f;
  float mu = 0.f, emb_mu = 0.f;  // SGD's momentum (dense, tables), and Nesterov's form
  bool nesterov = false, emb_nesterov = false;
  // Values per row of a table's optimizer state (the CPU's): 0 for plain SGD.
  int64_t emb_state_cols(int64_t dim) const {
    return emb_rowwise ? 1 : emb_adam ? 2 * dim + 1 : emb_adagrad || emb_momentum ? dim : 0;
  }
  // The CPU's names of the optimizer states: "<param><suffix>"; "" when there is none.
  std::string state_suffix(bool tables) const {
    if (tables)
      return emb_rowwise    ? ".rowwise_adagrad"
             : emb_adam     ? ".adam"
             : emb_momentum ? ".momentum"
             : emb_adagrad  ? ".adagrad"
                            : "";
    return dense_adam ? ".adam" : dense_momentum ? ".momentum" : dense_adagrad ? ".adagrad" : "";
  }
  // From a config that graph_cuda_unsupported accepted.
  void set_optimizers(const OptimizerConfig& oc) {
    const OptimizerConfig ec = oc.embedding_config();
    const nn::OptimizerKind dk = nn::parse_optimizer(oc.type), ek = nn::parse_optimizer(ec.type);
    dense_adagrad = dk == nn::OptimizerKind::Adagrad;
    dense_adam = dk == nn::OptimizerKind::Adam;
    emb_adagrad = ek == nn::OptimizerKind::Adagrad;
    emb_rowwise = ek == nn::OptimizerKind::RowWiseAdagrad;
    emb_adam = ek == nn::OptimizerKind::Adam;
    dense_momentum = dk == nn::OptimizerKind::SGD && oc.momentum > 0;
    emb_momentum = ek == nn::OptimizerKind::SGD && ec.momentum > 0;
    mu = static_cast<float>(oc.momentum);
    nesterov = oc.nesterov;
    emb_mu = static_cast<float>(ec.momentum);
    emb_nesterov = ec.nesterov;
    eps = static_cast<float>(dense_adam ? oc.adam_eps : oc.adagrad_eps);
    init_acc = static_cast<float>(oc.adagrad_init);
    emb_eps = static_cast<float>(emb_adam ? ec.adam_eps : ec.adagrad_eps);
    emb_init_acc = static_cast<float>(ec.adagrad_init);
    DLREC_CHECK(eps >= 0 && init_acc >= 0 && emb_eps >= 0 && emb_init_acc >= 0,
                "Optimizer: eps and the initial accumulator must be >= 0");
    adam.beta1 = static_cast<float>(oc.beta1);
    adam.beta2 = static_cast<float>(oc.beta2);
    adam.eps = eps;
    adam.weight_decay = static_cast<float>(oc.weight_decay);
    emb_beta1 = static_cast<float>(ec.beta1);
    emb_beta2 = static_cast<float>(ec.beta2);
    for (float b : {adam.beta1, adam.beta2, emb_beta1, emb_beta2})
      DLREC_CHECK(b >= 0.f && b < 1.f, "Optimizer: beta1 and beta2 must be in [0, 1), got ", b);
  }
  // A dense parameter's optimizer state in the CPU's shape (nn::Optimizer::init_state): Adagrad's
  // accumulator, shaped as the parameter `p`, at init_acc; the momentum's velocity, p's shape,
  // zeros; Adam's [rows, 2 * cols + 1] zeros (rows: p's first dimension); none for plain SGD.
  Tensor dense_state(const Shape& p) {
    if (dense_momentum) return buf(p, DType::F32);
    if (dense_adagrad) {
      Tensor s = Tensor::empty(p, DType::F32, dev);
      ce::fill(s.data<float>(), s.numel(), init_acc, st);
      return s;
    }
    if (!dense_adam) return Tensor();
    int64_t n = 1;
    for (int64_t d : p) n *= d;
    const int64_t rows = p.empty() ? 1 : p[0];
    return buf({rows, 2 * (rows ? n / rows : 0) + 1}, DType::F32);
  }
  // The dense optimizer's step on w [rows, cols] (gradient rows ldg apart; the 16-bit copy wh,
  // rows ldh apart, or null), its state s from dense_state; `vector`: a 1-D parameter (rows 1),
  // whose Adam state has a row per value.
  template <class H>
  void dense_step(float* w, const float* g, const Tensor& s, int64_t rows, int64_t cols,
                  int64_t ldg, H* wh, int64_t ldh, bool vector, const float* mask = nullptr) {
    float* sp = s.defined() ? s.data<float>() : nullptr;
    if (dense_momentum)
      cd::momentum_step(w, g, sp, rows, cols, ldg, wh, ldh, lr, mu, nesterov, st, gscale, mask);
    else if (!dense_adam)
      cd::optimizer_step(w, g, sp, rows, cols, ldg, wh, ldh, lr, eps, st, gscale, mask);
    else if (vector)
      cd::adam_step(w, g, sp, rows * cols, 1, 1, wh, 1, lr, adam, st, gscale, mask);
    else
      cd::adam_step(w, g, sp, rows, cols, ldg, wh, ldh, lr, adam, st, gscale, mask);
  }
  std::vector<Value> vals;
  Tensor partial;  // bias-gradient partial sums [chunks, max_cols]
  // The current step.
  int64_t B = 0, nnz = 0;
  const float* lr = nullptr;  // device [2]: dense, embedding
  const float* dense = nullptr;
  const int32_t* offsets = nullptr;
  const uint32_t* keys = nullptr;
  // predict()'s buckets of a model with hashed tables: the chunk's int64 keys on the device
  // (null: the hashed tables' own upload slot, as in training steps).
  const int64_t* hashed_keys = nullptr;
  DataParallel dp;

  Tensor buf(Shape s, DType t) {
    Tensor x = Tensor::empty(std::move(s), t, dev);
    if (x.nbytes()) DLREC_CUDA_CHECK(cudaMemsetAsync(x.raw(), 0, x.nbytes(), st));
    return x;
  }
  cudaDataType_t ab_type() const { return lowp ? cuda_type(half) : CUDA_R_32F; }

  // A parameter update: now, or in fp16 after every gradient of the step is checked (`table`:
  // a table update, which runs beside the dense ones).
  template <class F>
  void update(F&& f, bool table = false) {
    if (fp16) (table ? deferred_tables : deferred).emplace_back(std::forward<F>(f));
    else f();
  }
  // fp16: checks n gradient values (f32 or f16) at p for Inf/NaN on the current stream.
  void check_grad(const void* p, DType t, int64_t n) {
    if (!fp16 || n == 0) return;
    if (t == DType::F16) cd::check_finite(static_cast<const f16*>(p), n, overflow, st);
    else cd::check_finite(static_cast<const float*>(p), n, overflow, st);
  }

  // Column-major D [m, n] = op(A) op(B) (+ D when accumulate); A and B of the compute type.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
            const void* Bm, int64_t ldb, void* D, DType dt, int64_t ldd, bool accumulate) {
    if (m == 0 || n == 0) return;
    if (lt && !accumulate) {
      // bf16 GEMMs that overwrite D: cuBLASLt, the fastest of its candidates timed on first use.
      lt::Gemm g = lt::Gemm::shape(ta, tb, m, n, k, lda, ldb, ldd);
      g.ab_type = ab_type();
      g.d_type = cuda_type(dt);
      if (lt->run(g, A, Bm, D, nullptr, nullptr, st)) return;
    }
    const float one = 1.f, zero = 0.f;
    const cublasComputeType_t ct =
        prec == Precision::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DLREC_CUBLAS_CHECK(cublasGemmEx(
        blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, A, ab_type(),
        static_cast<int>(lda), Bm, ab_type(), static_cast<int>(ldb), accumulate ? &one : &zero,
        D, cuda_type(dt), static_cast<int>(ldd), ct, CUBLAS_GEMM_DEFAULT));
  }

  // D = op(A) op(B) + C with C != D of D's type and layout: cuBLASLt's beta = 1 with a separate
  // C in bf16, else a copy of C into D and an accumulating GEMM (the same sums).
  void gemm_c(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
              const void* Bm, int64_t ldb, const void* C, void* D, DType dt, int64_t ldd) {
    if (m == 0 || n == 0) return;
    if (lt) {
      lt::Gemm g = lt::Gemm::shape(ta, tb, m, n, k, lda, ldb, ldd);
      g.ab_type = ab_type();
      g.d_type = cuda_type(dt);
      g.accumulate_c = true;
      if (lt->run(g, A, Bm, D, nullptr, nullptr, st, C)) return;
    }
    // Column-major [m, n] with leading dimension ldd: n rows of m elements, ldd apart.
    cg::copy_cols(C, elem(dt), ldd, 0, D, elem(dt), ldd, 0, n, m, false, st);
    gemm(ta, tb, m, n, k, A, lda, Bm, ldb, D, dt, ldd, true);
  }

  // Runs f (a layer's weight gradients and update) on the weight stream, after everything
  // enqueued on st so far; joined back by join_weights(). Without that stream: f() on st.
  template <class F>
  void weights(F&& f) {
    if (!wst) {
      f();
      return;
    }
    DLREC_CUDA_CHECK(cudaEventRecord(wfork, st));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(wst, wfork, 0));
    auto swap_all = [&] {
      std::swap(st, wst);
      std::swap(blas, wblas);
      std::swap(lt, wlt);
    };
    swap_all();
    try {
      f();
    } catch (...) {
      swap_all();
      throw;
    }
    swap_all();
    w_pending = true;
  }
  // st waits for the weight stream's work (end of the backward pass).
  void join_weights() {
    if (dp.d_pending) {  // the dense updates on the dense communicator's stream (lin_update)
      DLREC_CUDA_CHECK(cudaEventRecord(dp.from_dcomm, dp.dcst));
      DLREC_CUDA_CHECK(cudaStreamWaitEvent(st, dp.from_dcomm, 0));
      dp.d_pending = false;
    }
    if (!w_pending) return;
    DLREC_CUDA_CHECK(cudaEventRecord(wjoin, wst));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(st, wjoin, 0));
    w_pending = false;
  }
  void sub(const std::string& what) {
    if (mark) mark(what);
  }

  // The weights the GEMMs read: the fake-quantized copy under QAT, else the compute copy.
  const void* wcomp(const Lin& l) const {
    return l.qat ? l.qat->wq() : lowp ? l.wh.raw() : l.w.raw();
  }

  // y [B, out] (rows out_ld apart, type ydt) = x W^T + b, ReLU when l.relu.
  void lin_forward(Lin& l, const void* x, void* y, DType ydt) {
    lin_forward_any(l, x, y, ydt);
    if (mark_lins && mark) {
      const char* k = l.comp ? l.comp->kernel_at(B) : "dense";
      mark((l.name.empty() ? std::string("linear") : l.name) + " [" + k + "]");
    }
  }
  void lin_forward_any(Lin& l, const void* x, void* y, DType ydt) {
    // QAT: the layer computes with the fake-quantized input (which the weight gradient reads
    // too) and weights (wcomp).
    if (l.qat) x = l.qat->forward(l.w.data<float>(), x, B, st);
    l.x = x;
    l.aux_written = false;
    if (B == 0) return;
    // Serving a compressed layer: its kernel for this batch size (timed on first use; false:
    // dense was chosen). Under the "fastest" policy a handful of rows stay on the warp-per-output
    // layer below (dense), which no GEMM beats there.
    if (serving && l.comp &&
        (B > cd::kSkinnyRows || l.comp->policy() != nn::kernel_choice::Policy::Fastest)) {
      const auto act_of = [](DType t) {
        using A = nn::cuda_compress::Act;
        return t == DType::BF16 ? A::BF16 : t == DType::F16 ? A::F16 : A::F32;
      };
      if (l.comp->forward(B, x, y, act_of(ydt), l.out_ld, *comp_lt, st,
                          [&] { lin_forward_dense(l, x, y, ydt); }))
        return;
    }
    lin_forward_dense(l, x, y, ydt);
  }
  // lin_forward on the dense weights.
  void lin_forward_dense(Lin& l, const void* x, void* y, DType ydt) {
    l.aux_written = false;
    // Serving a handful of rows: one warp per output instead of a GEMM that streams the whole
    // weight matrix through a few thread blocks (no ReLU mask: nothing reads one when serving).
    if (serving && lowp && l.has_bias && B <= cd::kSkinnyRows && l.out_ld == l.out) {
      bool done = false;
      with_half(half, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        done = cd::skinny_linear(static_cast<const H*>(wcomp(l)), static_cast<const H*>(x), B,
                                 l.out, l.in_pad, ydt == DType::F32 ? l.b.raw() : l.bh.raw(),
                                 l.relu, y, ydt == DType::F32, st);
      });
      if (done) return;
    }
    if (lowp && l.has_bias) {
      lt::Gemm g = lt::Gemm::shape(true, false, l.out, B, l.in_pad, l.in_pad, l.in_pad, l.out_ld);
      g.ab_type = ab_type();
      g.d_type = cuda_type(ydt);
      g.epi = l.relu ? lt::Epi::ReluAuxBias : lt::Epi::Bias;
      g.aux_ld = l.aux_ld;
      void* bias = ydt == DType::F32 ? l.b.raw() : l.bh.raw();
      if (lt->run(g, wcomp(l), x, y, bias, l.relu ? l.aux.raw() : nullptr, st)) {
        l.aux_written = l.relu;
        return;
      }
    }
    gemm(true, false, l.out, B, l.in_pad, wcomp(l), l.in_pad, x, l.in_pad, y, ydt, l.out_ld,
         false);
    if (!l.has_bias) return;
    if (ydt == DType::F32) {
      if (l.out_ld == l.out) cd::bias_act(static_cast<float*>(y), l.b.data<float>(), B, l.out,
                                          l.relu, st);
      else cg::bias_act_strided(static_cast<float*>(y), l.b.data<float>(), B, l.out, l.out_ld,
                                l.relu, st);
    } else {
      with_half(ydt, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        cg::bias_act_strided(static_cast<H*>(y), static_cast<const H*>(l.bh.raw()), B, l.out,
                             l.out_ld, l.relu, st);
      });
    }
  }
  // dw [out, in_pad] = dz^T x, dz [B, out] rows dz_ld apart (compute type). Under QAT the
  // step's input range then enters the running one (the layer's backward is done with it).
  void lin_wgrad(Lin& l, const void* dz, int64_t dz_ld) {
    gemm(false, true, l.in_pad, l.out, B, l.x, l.in_pad, dz, dz_ld, l.dw.raw(), DType::F32,
         l.in_pad, false);
    if (l.qat) l.qat->end_step(st);
  }
  // dst [B, in_pad] (+)= dz W; under QAT dz W goes through the straight-through gate first.
  void lin_dgrad(Lin& l, const void* dz, int64_t dz_ld, void* dst, DType dt, int64_t dst_ld,
                 bool accumulate) {
    if (l.qat) {
      qat_dgrad(l, dz, dz_ld);
      l.qat->gate(dt, accumulate ? dst : nullptr, dst, dst_ld, B, st);
      return;
    }
    gemm(false, false, l.in_pad, B, l.out, wcomp(l), l.in_pad, dz, dz_ld, dst, dt, dst_ld,
         accumulate);
  }
  // dst [B, in_pad] = dz W + c (c != dst, both of type dt, rows ld apart).
  void lin_dgrad_c(Lin& l, const void* dz, int64_t dz_ld, const void* c, void* dst, DType dt,
                   int64_t ld) {
    if (l.qat) {
      qat_dgrad(l, dz, dz_ld);
      l.qat->gate(dt, c, dst, ld, B, st);
      return;
    }
    gemm_c(false, false, l.in_pad, B, l.out, wcomp(l), l.in_pad, dz, dz_ld, c, dst, dt, ld);
  }
  // QAT: dz wq into the layer's f32 scratch (rows in_pad apart).
  void qat_dgrad(Lin& l, const void* dz, int64_t dz_ld) {
    gemm(false, false, l.in_pad, B, l.out, wcomp(l), l.in_pad, dz, dz_ld,
         l.qat->grad_scratch(), DType::F32, l.in_pad, false);
  }
  // Data-parallel: f(comm) enqueues collectives on the communicator's stream after the work on
  // st so far; st waits for them.
  // `what` names the collectives in DLREC_PROFILE=timeline.
  template <class F>
  void on_comm(const char* what, F&& f) {
    comm_fork(what, dp.from_comm, std::forward<F>(f));
    comm_join(dp.from_comm);
  }
  // The same in two halves: comm_fork enqueues f(comm) after the work on st so far and records
  // `done` after it on the communicator's stream, st goes on beside it; comm_join(done): st
  // waits for it (every fork is joined before the step ends).
  template <class F>
  void comm_fork(const char* what, cudaEvent_t done, F&& f) {
    fork_on(what, *dp.comm, dp.cst, dp.to_comm, done, std::forward<F>(f));
  }
  void comm_join(cudaEvent_t done) { DLREC_CUDA_CHECK(cudaStreamWaitEvent(st, done, 0)); }
  // comm_fork on the dense layers' communicator and its stream (dp.dcomm, dp.dcst), after
  // everything enqueued there so far; `done` (unless null) recorded after f there.
  template <class F>
  void dcomm_fork(const char* what, cudaEvent_t done, F&& f) {
    fork_on(what, *dp.dcomm, dp.dcst, dp.to_dcomm, done, std::forward<F>(f));
  }
  // Both forks: stream s waits for the work on st so far (through event `to`), f(c) enqueues
  // on s (marked for DLREC_PROFILE=timeline), then `done` (unless null) is recorded on s.
  template <class F>
  void fork_on(const char* what, dist::Communicator& c, cudaStream_t s, cudaEvent_t to,
               cudaEvent_t done, F&& f) {
    DLREC_CUDA_CHECK(cudaEventRecord(to, st));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(s, to, 0));
    if (mark_on) mark_on(std::string("> ") + what, s);
    f(c);
    if (mark_on) mark_on(std::string("< ") + what, s);
    if (done) DLREC_CUDA_CHECK(cudaEventRecord(done, s));
  }
  // Data-parallel: the layer's gradients summed over the ranks (one bucket per layer: its
  // weight and bias gradients), before its update. With the dense communicator (dp.dcomm) the
  // all-reduce and then the update run on its stream (the update's kernels read nothing the
  // rest of the backward writes, and nothing before the step's end reads the weights they
  // write), so the weight stream goes on to the next layer's weight gradients at once instead
  // of waiting for this layer's all-reduce; join_weights() joins that stream. The arithmetic is
  // the same either way. (fp16's deferred updates never meet this: fp16 is not data-parallel.)
  void lin_update(Lin& l) {
    const bool on_dcomm = dp.dcomm && B > 0 && !fp16;
    if (dp.comm && B > 0) {
      auto f = [&](dist::Communicator& c) {
        c.all_reduce(l.dw.raw(), l.dw.numel(), dist::Elem::F32);
        if (l.has_bias) c.all_reduce(l.db.raw(), l.db.numel(), dist::Elem::F32);
      };
      if (!dp.dcomm) {
        on_comm("dense all-reduce", f);
      } else {
        // Off it (fp16: refused for data-parallel runs before a step; kept exact), st waits.
        cudaEvent_t done = nullptr;
        if (!on_dcomm) done = dp.from_dcomm;
        dcomm_fork("dense all-reduce", done, f);
        if (done) comm_join(done);
      }
    }
    if (on_dcomm) std::swap(st, dp.dcst);  // the update's kernels after the all-reduce
    check_grad(l.dw.raw(), DType::F32, l.dw.numel());
    if (l.has_bias) check_grad(l.db.raw(), DType::F32, l.db.numel());
    update([this, &l] {
      with_half(half, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        dense_step(l.w.data<float>(), l.dw.data<float>(), l.sw, l.out, l.in, l.in_pad,
                   lowp ? static_cast<H*>(l.wh.raw()) : nullptr, l.in_pad, false,
                   l.mask.defined() ? l.mask.data<float>() : nullptr);
        if (l.has_bias)
          dense_step(l.b.data<float>(), l.db.data<float>(), l.sb, 1, l.out, l.out,
                     lowp ? static_cast<H*>(l.bh.raw()) : nullptr, l.out, true);
      });
    });
    if (on_dcomm) {
      std::swap(st, dp.dcst);
      dp.d_pending = true;
    }
  }
  void refresh(Lin& l) {
    if (!lowp) return;
    with_half(half, [&](auto* h) {
      using H = std::remove_pointer_t<decltype(h)>;
      cd::to_half_padded(l.w.data<float>(), l.out, l.in, static_cast<H*>(l.wh.raw()), l.in_pad,
                         st);
      if (l.has_bias)
        cd::to_half_padded(l.b.data<float>(), 1, l.out, static_cast<H*>(l.bh.raw()), l.out, st);
    });
  }
  // Builds the device copy of a CPU nn::Linear (its values, zeroed gradients and state).
  Lin make_lin(nn::Linear& cpu, int64_t in_pad, int64_t out_ld, bool has_bias, bool relu) {
    Lin l;
    l.in = cpu.in_features();
    l.out = cpu.out_features();
    l.in_pad = in_pad;
    l.out_ld = out_ld;
    l.has_bias = has_bias;
    l.relu = relu;
    l.w = cpu.weight().value.to(dev);
    l.dw = buf({l.out, l.in_pad}, DType::F32);
    l.sw = dense_state({l.out, l.in});
    if (has_bias) {
      l.b = cpu.bias().value.to(dev);
      l.db = buf({l.out}, DType::F32);
      l.sb = dense_state({l.out});
    }
    if (lowp) {
      l.wh = buf({l.out, l.in_pad}, half);
      if (has_bias) l.bh = buf({l.out}, half);
      l.aux_ld = round_up(l.out, 128);
    }
    refresh(l);
    return l;
  }
  void add_params(Lin& l, const std::string& wname, const std::string& bname,
                  std::vector<NamedState>& out) {
    out.push_back({wname, l.w, l.sw});
    if (l.has_bias) out.push_back({bname, l.b, l.sb});
  }

  // Value j's gradient columns [dst_col, dst_col + cols) (+)= src columns from src_col.
  void deliver(int j, const void* src, DType sdt, int64_t src_ld, int64_t src_col,
               int64_t dst_col, int64_t cols, bool accumulate) {
    Value& v = vals[j];
    cg::copy_cols(src, elem(sdt), src_ld, src_col, v.g.raw(), elem(v.gdt), v.ld, dst_col, B,
                  cols, accumulate, st);
  }
  // Marks j's gradient as written; true when an earlier consumer wrote it (then add to it).
  bool claim(int j) {
    const bool acc = vals[j].has_grad;
    vals[j].has_grad = true;
    return acc;
  }
};

// What the fused small-batch forward (GraphCuda::plan_fused, model/infer_small_cuda.h) needs
// to know of a node: its part kind, weights and device buffers. The DLRM kernel takes the DLRM
// shape (dense input -> MLP, fixed-table embedding, dot over both, MLP -> output); the program
// form (fused_infer::prog) any graph of dense inputs, fixed-table embeddings, MLPs, concats,
// cross networks, fm, wide and add. A node the fused forward cannot run: kind None (the
// model then serves through the bucketed graphs).
struct ServingParts {
  enum class Kind {
    None, DenseInput, Mlp, Embedding, Dot, Concat, Cross, Fm, Wide, Add
  } kind = Kind::None;
  // Mlp: the layers and each one's output buffer (rows out apart). Cross: per cross layer V
  // then U (low rank), or W; each Lin's output buffer (rows out_ld apart): h, then x_{l+1}.
  std::vector<const Lin*> lins;
  std::vector<void*> ys;
  const ce::Tables* tables = nullptr;  // Embedding, Wide: the device tables (fixed, not hashed)
  int64_t fields = 0, dim = 0;         // Dot, Fm: n fields of width dim
  int64_t rank = 0;                    // Cross: the low rank (0: full rank)
  const float* bias = nullptr;         // Wide: the bias (device f32 [1])
};

// What a GPU of a sharded run allocates of a fixed table (GraphCuda::shard_tables ->
// Node::materialize): nothing, the whole table (its own or a replica), its row-wise range, its
// column-wise piece or a hybrid table's frequent prefix.
enum class TableKeep : char { None, Whole, Rows, Columns, Prefix };

class Node {
 public:
  virtual ~Node() = default;
  // Allocates the activations for `cap` rows (the value's y and g included, unless noted).
  virtual void alloc(Engine& e, int64_t cap) = 0;
  virtual void forward(Engine& e) = 0;
  virtual void backward(Engine& e) = 0;
  virtual void collect(Engine&, std::vector<NamedState>&, std::vector<NamedState>&) {}
  virtual void refresh(Engine&) {}
  // Scratch sized by the batch's number of ids (table layers).
  virtual void alloc_scratch(Engine&, int64_t /*max_nnz*/) {}
  // Deferred tables (the embedding layer's fixed tables; GraphCuda::materialize_tables):
  // allocates and initialises what keep[t] says (every whole table when keep is null).
  virtual void materialize(Engine&, const std::vector<TableKeep>* /*keep*/) {}
  // Serving a compact export (GraphCuda::set_quantized_tables): the layer serves its table t
  // from row-wise codes; false when it cannot (then the caller writes their values instead).
  virtual bool set_quantized(Engine&, int64_t /*t*/, const nn::RowQuantRows&) { return false; }
  // The embedding layer (Build::embedding): its hashed tables (null: fixed), its name, and
  // the direct mode (GraphCuda::plan_direct_embedding): write into a concat's columns.
  virtual hashed_cuda::HashedTables* hashed() const { return nullptr; }
  // A hybrid table's rows >= F on its owner (value, state; undefined elsewhere).
  virtual std::pair<Tensor, Tensor> hybrid_rare(int64_t /*t*/) const { return {}; }
  virtual const std::string& layer_name() const;
  virtual void write_into(int /*into*/, int64_t /*col*/) {}
  // A concat: input value j writes its columns itself (true when the layer supports that).
  virtual bool set_direct_input(int /*j*/) { return false; }
  virtual ServingParts serving_parts(Engine&) { return {}; }
  // The layer's Linear parts by parameter name ("top.0.weight"): those a compressed export
  // may give 2:4 / int8 kernels (GraphCuda::set_compressed).
  virtual void compressible(std::vector<std::pair<std::string, Lin*>>&) {}
  // Serving: pairs (a, b) of those parts where b alone reads a's output (nothing else, the
  // fused small-batch path aside): a chain of int8 layers may pass it quantized
  // (CompressedLinear::set_next).
  virtual void chainable(std::vector<std::pair<Lin*, Lin*>>&) {}
  int self = -1;
  std::vector<int> in;
  // The value's own buffers.
  void alloc_value(Engine& e, int64_t cap) {
    Value& v = e.vals[self];
    v.y = e.buf({cap, v.ld}, v.dt);
    if (v.need_grad) v.g = e.buf({cap, v.ld}, v.gdt);
  }
};

inline const std::string& Node::layer_name() const {
  static const std::string none;
  return none;
}

// What a layer type's CUDA factory (LayerType::make_cuda) gets and sets.
struct Build {
  Engine& e;
  const LayerSpec& spec;
  const std::vector<const Value*>& ins;  // the inputs' values
  const ValueShape& shape;               // the output's (LayerType::infer)
  const io::ShardLayout& layout;
  uint64_t seed;  // the layer's stream: derive_seed(run seed, init_tag)
  Value& v;       // the layer's value; set_value() lays it out
  // Table layers set these: the global row of id 0 of each feature in the step's keys (the
  // same for every table layer: all read all features), and the embedding layer itself.
  const std::vector<uint32_t>* row_base = nullptr;
  Node* embedding = nullptr;
  // The default value layout: `width` wide, one field, 16-bit in bf16/fp16 precision unless 1
  // wide, rows padded to a multiple of 8 in 16 bits when `pad`.
  void set_value(int64_t width, bool pad) {
    v.width = width;
    v.fields = {width};
    v.dt = (e.lowp && width != 1) ? e.half : DType::F32;
    v.gdt = v.dt;
    v.ld = (is_half(v.dt) && pad) ? round_up(width, 8) : width;
  }
};

}  // namespace dlrec::model::gpu_graph
