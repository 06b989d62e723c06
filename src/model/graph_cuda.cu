// The graph engine on a CUDA device (include/dlrec/model/graph_cuda.h): the model (streams,
// the step, parameters); each layer type's node is in src/model/layers/<type>_cuda.cu. Same layers, parameter
// names, shapes and initial values as the CPU graph model (src/model/graph_model.cc): dense
// layers are initialised on the CPU by nn::MLP / nn::CrossNet with the layer's seed and copied,
// tables are initialised on the device by the kernel that computes EmbeddingBag::init's values
// bit for bit.
//
// Values. Every layer's output is a device matrix [B, width] with rows `ld` elements apart, and
// (when a parameter lies upstream) a gradient buffer of the same shape. In bf16 precision
// outputs are bf16 except 1-wide ones (logits, kept in f32), and embedding gradients are f32
// (the table update reads them; an embedding layer written into a concat has none and reads
// the concat's, widened on load); the rows of bf16 values other than embeddings and MLP outputs
// are padded to a multiple of 8 elements (tensor-core alignment of the GEMMs that read them);
// padding is zero from allocation on and never written with anything else. A layer's
// gradient is complete once every consumer (later in the topological order) has run its
// backward: the first one writes it, the others add to it (GEMMs with beta = 1, copies that
// accumulate). Each layer applies the optimizer to its own parameters as soon as its gradients
// are known (no global-norm clipping, so the order does not matter).
//
// A step: the batch is packed into one of two pinned slots and
// copied on a copy stream (overlapping the previous step), learning rates live in device memory,
// and from the second step of a shape on the whole step (forward, BCE, backward, updates) is one
// CUDA graph replay (GraphCudaOptions::cuda_graphs off: eager, for comparisons). The embedding layer's lookup and its
// fused update run on a side stream beside the dense layers that do not depend on them. When a
// concat is the embedding layer's only consumer, the lookup writes into the concat's columns
// and the update reads its gradient from the concat's gradient (no copies;
// GraphCudaOptions::embedding_direct).
// fp16 (Engine::fp16): as bf16 with f16 in its place, plus dynamic loss scaling inside the step
// (run_backward): dL/dlogits times the scale, each parameter gradient checked for Inf/NaN as it
// is formed (Engine::check_grad), every update deferred (Engine::update) until one kernel has
// set the step's gradient factor (1 / scale, or 0 after an overflow: nothing changes) and the
// next scale; then the dense updates run on the weight stream beside the table updates.
// predict() is in graph_cuda_infer.cu.
// bf16 GEMMs without an epilogue that overwrite their output go through cuBLASLt with the
// fastest of its candidates (GraphCudaOptions::lt_tune off: the heuristic's first choice).
// DLREC_PROFILE=1 (a diagnostic; graph_cuda_timeline.cu) prints the device time per layer and,
// for MLP and cross layers, per kind of work (no graphs, no side streams).
//
// GPU resources (include/dlrec/core/gpu_resources.h): the streams and events are gpu::Stream /
// gpu::Event members, the cuBLAS and cuBLASLt handles with their workspaces are leased from the
// device's DeviceResources; a build that throws part-way releases all of them.
//
// The cross layer (DCNv2): forward per layer h = x_l V^T (low rank), u = h U^T + b (or x_l W^T + b)
// through cuBLASLt's bias epilogue in bf16, then x_{l+1} = x0 * u + x_l in one pass; in bf16 builds
// with CUTLASS the second GEMM and that pass are one kernel (src/fused/cross_fused.h;
// GraphCudaOptions::cross_fused). Backward per layer, g = dL/dx_{l+1}: one pass writes du = g * x0 and
// sums the bias gradient; then the data GEMMs dh = du U and dL/dx_l = g + dh V (into a new buffer:
// cuBLASLt's beta = 1 with C != D). The dL/dx0 sum, sum_l g_{l+1} * u_l + g_1 (+ dh_0 V_0 by the
// last GEMM, beta = 1 in place), is formed once, by layer 0's pass, from the kept g's and u's
// (GraphCudaOptions::cross_defer_dx0 off, or more than 8 layers: added layer by layer into an accumulator, each pass
// reading and writing it). It has the compute type (bf16 in bf16, as autograd's would) and is the
// input's gradient buffer itself when the cross layer is its first consumer.
//
// Weight gradients and updates (every MLP and cross layer) run on a weight stream beside the
// data-gradient chain (Engine::weights: forked after the layer's dgrad, which reads the
// weights; joined at the end of the backward pass; own cuBLAS handle and cuBLASLt workspace;
// GraphCudaOptions::weight_stream off: in order on the main stream). The main stream and the embedding's side
// stream have the device's greatest priority, the weight stream the least.
//
// The fm layer (DeepFM) and the wide layer (Wide&Deep's linear part) write 1-wide f32 values
// (src/nn/graph_layers_cuda.h): fm reads its fields in the compute type, sums in f32 (the last
// sum in double, as the CPU), and writes its input's gradient in place or through an f32
// buffer; wide pools its [cardinality, 1] tables with the embedding kernels (dim 1, zero
// initial values, the fused de-duplicated update with the embedding optimizer) and updates its
// bias [1] with the dense optimizer.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "model/graph_cuda_impl.h"
#include "model/layers/embedding_dp_cuda.h"

namespace dlrec::model {
namespace graph_cuda_impl {
namespace {

// The CPU graph model's default init tag: FNV-1a of the layer name (graph_model.cc).
uint64_t name_tag(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

GraphCuda::GraphCuda(const ModelConfig& mc, const OptimizerConfig& oc,
                     const io::ShardLayout& layout, Device device, uint64_t seed,
                     const std::string& precision, const GraphCudaOptions& opts)
    : opts_(opts), oc_(oc), layout_(layout), spec_(GraphSpec::parse(mc.layers, "model.layers")),
      dev_(device), dev_index_(device.index) {
  e_.prec = parse_precision(precision);
  // Everything that needs no device is checked first: the precision, optimizers and each
  // layer's LayerType::cuda_unsupported (graph_support.cc).
  const std::string why = graph_cuda_unsupported(spec_, oc, layout, precision);
  if (!why.empty()) fail(why);
  e_.fp16 = e_.prec == Precision::FP16;
  e_.lowp = e_.prec == Precision::BF16 || e_.fp16;
  e_.half = e_.fp16 ? DType::F16 : DType::BF16;
  e_.act = e_.lowp ? e_.half : DType::F32;
  DLREC_CHECK(std::isfinite(oc.loss_scale_init) && oc.loss_scale_init >= 1 &&
                  oc.loss_scale_init <= 1e38,
              "optimizer.loss_scale_init must be a number in [1, 1e38], got ", oc.loss_scale_init);
  DLREC_CHECK(oc.loss_scale_growth_interval >= 1 &&
                  oc.loss_scale_growth_interval <= std::numeric_limits<int>::max(),
              "optimizer.loss_scale_growth_interval must be a positive step count, got ",
              oc.loss_scale_growth_interval);
  growth_interval_ = static_cast<int>(oc.loss_scale_growth_interval);
  check_serving_options(opts);
  pack_threads_ = opts.infer_pack_threads > 0
                      ? opts.infer_pack_threads
                      : std::max(1, std::min(8, static_cast<int>(
                                                     std::thread::hardware_concurrency()) / 2));
  e_.dev = device;
  e_.opts = &opts_;
  e_.set_optimizers(oc);
  lr_ = static_cast<float>(oc.lr);
  emb_lr_ = static_cast<float>(oc.embedding_lr_value());
  T_ = static_cast<int64_t>(layout.cardinalities.size());
  num_dense_ = layout.num_dense;
  DLREC_CHECK(num_dense_ >= 0, "graph model: negative number of dense features");

  cuda::require_device(dev_index_);
  DeviceGuard guard(dev_index_);
  const char* prof = std::getenv("DLREC_PROFILE");
  profile_ = prof && prof[0] == '1';
  timeline_ = prof && std::string(prof) == "timeline";
  graphs_ = !profile_ && opts_.cuda_graphs;
  // Non-blocking streams: with several serving instances in a process,
  // another model's legacy-stream copy during this one's graph capture would otherwise fail the
  // capture. forward() synchronises before returning; Tensor copies and fills are complete when
  // they return (core/device_cuda.cu); after parameters()/optimizer_state() handed out tensors,
  // the next step first waits for the default stream (a caller's kernels there, PyTorch's).
  // Priorities: the main stream and the embedding's side stream (the critical path) get the
  // device's greatest priority, the weight-gradient stream the least, so that waiting blocks
  // of the critical path go first. They hold for eager work only: the step's graph is
  // instantiated without cudaGraphInstantiateFlagUseNodePriority (cuda_step.cu), so its kernels
  // run at the launch stream's priority; with the flag, 2 GPUs ran 1.8 % slower (RESULTS.md).
  res_ = gpu::DeviceResources::get(dev_index_);
  const int greatest = res_->greatest_priority(), least = res_->least_priority();
  st_ = gpu::Stream(dev_index_, greatest);
  e_.st = st_;
  copy_ = gpu::Stream(dev_index_);
  side_ = gpu::Stream(dev_index_, greatest);
  fork_ = gpu::Event(dev_index_);
  join_ = gpu::Event(dev_index_);
  overlap_ = !profile_;
  // A pooled cuBLAS handle bound to the stream (its own workspace), and in bf16 a cuBLASLt
  // planner on another pooled handle and workspace (the main stream's and the weight stream's).
  const bool tf32 = e_.prec == Precision::TF32;
  e_.blas = res_->blas(e_.st, tf32);
  if (e_.lowp) e_.lt = std::make_unique<lt::Lt>(res_->blas_lt(), opts_.lt_tune);
  // The weight-gradient stream (Engine::weights), off when profiling
  // (GraphCudaOptions::weight_stream: off for comparisons).
  if (overlap_ && opts_.weight_stream) {
    wst_ = gpu::Stream(dev_index_, least);
    e_.wst = wst_;
    e_.wfork = gpu::Event(dev_index_);
    e_.wjoin = gpu::Event(dev_index_);
    e_.wblas = res_->blas(e_.wst, tf32);
    if (e_.lowp) e_.wlt = std::make_unique<lt::Lt>(res_->blas_lt(), opts_.lt_tune);
  }
  if (profile_ || timeline_) e_.mark = [this](const std::string& what) { mark(what); };
  if (timeline_)
    e_.mark_on = [this](const std::string& what, cudaStream_t s) {
      if (in_body_) timeline_mark(what, s);
    };
  inputs_ = std::make_unique<StepInputs>(dev_);

  const size_t n = spec_.layers.size();
  nodes_.resize(n);
  e_.vals.resize(n);
  for (int i : spec_.order) {
    const LayerSpec& s = spec_.layers[i];
    const uint64_t tag = s.has_init_tag ? s.init_tag : name_tag(s.name);
    try {
      nodes_[i] = make_node(s, i, nn::derive_seed(seed, tag));
    } catch (const Error& err) {
      fail(s.where, ": ", err.what());
    }
    nodes_[i]->self = i;
    nodes_[i]->in = s.input_ids;
    for (int j : s.input_ids) ++e_.vals[j].consumers;
    std::vector<NamedState> d, t;
    nodes_[i]->collect(e_, d, t);
    bool need = !d.empty() || !t.empty();
    for (int j : s.input_ids) need = need || e_.vals[j].need_grad;
    e_.vals[i].need_grad = need;
  }
  for (size_t i = 0; i < n; ++i) nodes_[i]->collect(e_, dense_, tables_);
  plan_direct_embedding();
  loss_ = Tensor::empty({8}, DType::U8, dev_);
  if (e_.fp16) init_loss_scale();
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

// The layer's CUDA node from its registry entry (src/model/layers/<type>_cuda.cu), with the
// shape its LayerType::infer gives (graph_cuda_unsupported already asked the type whether it
// runs on CUDA).
std::unique_ptr<Node> GraphCuda::make_node(const LayerSpec& s, int idx, uint64_t seed) {
  const LayerType& type = layer_type(s.type);
  DLREC_CHECK(type.make_cuda, "layer type '", s.type, "' has no CUDA implementation (bug: its "
              "cuda_unsupported accepted it)");
  std::vector<const Value*> ins;
  std::vector<ValueShape> in_shapes;
  for (int j : s.input_ids) {
    ins.push_back(&e_.vals[j]);
    in_shapes.push_back({e_.vals[j].width, e_.vals[j].fields});
  }
  const ValueShape shape = type.infer(s, in_shapes, layout_);
  Build b{e_, s, ins, shape, layout_, seed, e_.vals[idx]};
  std::unique_ptr<Node> node = type.make_cuda(b);
  if (b.embedding) {
    emb_ = b.embedding;
    emb_idx_ = idx;
  }
  if (b.row_base) row_base_ = b.row_base;
  return node;
}

// The embedding layer writes its pooled rows straight into a concat's columns (and reads its
// gradient from there) when that concat is its only consumer, reading it once, and has its
// type (EmbeddingNode::write_into). Off for hashed tables (their evaluation pooling writes
// packed rows) and with GraphCudaOptions::embedding_direct off.
void GraphCuda::plan_direct_embedding() {
  if (emb_idx_ < 0 || emb_->hashed()) return;
  if (!opts_.embedding_direct) return;
  int uses = 0, consumer = -1;
  for (size_t i = 0; i < spec_.layers.size(); ++i)
    for (int j : spec_.layers[i].input_ids)
      if (j == emb_idx_) {
        ++uses;
        consumer = static_cast<int>(i);
      }
  if (uses != 1) return;
  const Value& x = e_.vals[emb_idx_];
  const Value& c = e_.vals[consumer];
  if (x.dt != c.dt || (x.need_grad && (!c.need_grad || c.gdt != c.dt))) return;
  int64_t col = 0;
  for (int j : spec_.layers[consumer].input_ids) {
    if (j == emb_idx_) break;
    col += e_.vals[j].width;
  }
  if (!nodes_[consumer]->set_direct_input(emb_idx_)) return;  // not a concat
  emb_->write_into(consumer, col);
}

void GraphCuda::init_loss_scale() {
  // scale, gscale (f32), overflow, good_steps (i32), skipped (i64)
  ls_mem_ = Tensor::empty({32}, DType::U8, dev_);
  char* m = static_cast<char*>(ls_mem_.raw());
  ls_.scale = reinterpret_cast<float*>(m);
  ls_.gscale = reinterpret_cast<float*>(m + 4);
  ls_.overflow = reinterpret_cast<int*>(m + 8);
  ls_.good_steps = reinterpret_cast<int*>(m + 12);
  ls_.skipped = reinterpret_cast<int64_t*>(m + 16);
  const float scale = static_cast<float>(oc_.loss_scale_init);
  const float init[2] = {scale, 1.f / scale};
  DLREC_CUDA_CHECK(cudaMemsetAsync(m, 0, 32, e_.st));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m, init, sizeof init, cudaMemcpyHostToDevice, e_.st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));  // `init` is on the stack
  e_.gscale = ls_.gscale;
  e_.overflow = ls_.overflow;
}

void GraphCuda::refresh_shadows() {
  for (auto& n : nodes_) n->refresh(e_);
  shadows_stale_ = false;
}

void GraphCuda::drop_graphs() {
  if (inputs_) inputs_->drop_graphs();
  // predict()'s graphs and the fused kernel's parameters point at the value buffers that a
  // larger batch replaces.
  if (fused_ == Fused::On) fused_ = Fused::Unplanned;
  for (auto& bk : buckets_)
    if (bk) {
      bk->graph.reset();
      bk->no_graph = false;
    }
  for (auto& [key, bk] : mh_buckets_) {
    bk->graph.reset();
    bk->no_graph = false;
  }
}

GraphCuda::~GraphCuda() {
  if (copy_) cudaStreamSynchronize(copy_);
  if (side_) cudaStreamSynchronize(side_);
  if (e_.wst) cudaStreamSynchronize(e_.wst);
  if (e_.st) cudaStreamSynchronize(e_.st);
  if (timeline_) timeline_print();
  if (profile_ && profiled_steps_ > 0) profile_print();
  if (e_.fp16 && trained_) {
    float scale = 0;
    int64_t skipped = 0;
    if (cudaMemcpy(&scale, ls_.scale, sizeof scale, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(&skipped, ls_.skipped, sizeof skipped, cudaMemcpyDeviceToHost) == cudaSuccess)
      std::fprintf(stderr, "[fp16] loss scale %g at the end; %lld step(s) skipped (gradient "
                   "overflow)\n", scale, static_cast<long long>(skipped));
  }
}

void GraphCuda::check_batch(const io::Batch& b) const {
  cuda_step::check_batch(b, num_dense_, T_, "graph model");
}

void GraphCuda::ensure_capacity(int64_t B, int64_t nnz) {
  if (B <= cap_b_ && nnz <= cap_nnz_) return;
  DLREC_CUDA_CHECK(cudaStreamSynchronize(copy_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(side_));
  if (e_.wst) DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.wst));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  drop_graphs();
  const int64_t nb = std::max(B, cap_b_), nn_ = std::max<int64_t>(std::max(nnz, cap_nnz_), 1);
  DLREC_CHECK(nn_ < (int64_t{1} << 31) && nb * std::max<int64_t>(T_, 1) < (int64_t{1} << 31),
              "CUDA graph model: a batch with ", nn_, " ids is too large (int32 offsets)");
  cap_b_ = nb;
  cap_nnz_ = nn_;
  const int64_t cb = std::max<int64_t>(nb, 1);
  int64_t max_cols = 1;
  for (const Value& v : e_.vals) max_cols = std::max(max_cols, v.ld);
  for (const LayerSpec& s : spec_.layers)
    for (int64_t z : s.sizes) max_cols = std::max(max_cols, z);
  e_.partial = Tensor::empty(
      {std::max<int64_t>(std::max(cd::bias_grad_chunks(cb), cg::cross_grad_chunks(cb)), 1),
       max_cols},
      DType::F32, dev_);
  for (int i : spec_.order) nodes_[i]->alloc(e_, cb);
  dlogits_ = e_.buf({cb}, DType::F32);
  e_.vals[spec_.output].g = dlogits_;
  for (int i : spec_.order) nodes_[i]->alloc_scratch(e_, nn_);
  for (const WeightLin& w : weight_lins())
    if (w.lin->qat) w.lin->qat->reserve(cb);
  inputs_->allocate(cb, nn_, num_dense_, T_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

void GraphCuda::upload(const io::Batch& b, float lr, float emb_lr, bool training) {
  DLREC_CHECK(!(training && quantized_tables_), "graph model: layer '", emb_->layer_name(),
              "' serves tables from row-wise quantized codes, which cannot train");
  attach_qat();
  materialize_tables();
  const int64_t B = b.rows;
  int64_t nnz = 0;
  for (int64_t t = 0; t < T_; ++t) nnz += b.cat_offsets[t][B] - b.cat_offsets[t][0];
  ensure_capacity(B, nnz);
  // Hashed tables: their state is rebuilt if it was handed out, their keys checked, before the
  // common upload (which would reject a negative key with a fixed table's message); their int64
  // keys follow on the copy stream after it (ordered after its wait for the slot to be free).
  hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr;
  if (hashed) hashed->prepare(b, training);
  cur_ = inputs_->upload(b, layout_.cardinalities, row_base_, lr,
                         emb_lr, copy_, e_.st, "graph model");
  if (hashed) hashed->upload(b, cur_, copy_, e_.st);
  fwd_rows_ = B;
  fwd_nnz_ = nnz;
  bind_slot();
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
}

void GraphCuda::bind_slot() {
  const InputSlot& s = inputs_->slots[cur_];
  e_.B = fwd_rows_;
  e_.nnz = fwd_nnz_;
  e_.lr = s.d_lr.data<float>();
  e_.dense = s.d_dense.data<float>();
  e_.offsets = s.d_offsets.data<int32_t>();
  e_.keys = static_cast<const uint32_t*>(s.d_keys.raw());
}

// Runs node i's forward or backward on the side stream, forked from and joined to the main one.
void GraphCuda::on_side(int i, bool fwd) {
  cudaStream_t main = e_.st;
  DLREC_CUDA_CHECK(cudaEventRecord(fork_, main));
  DLREC_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
  e_.st = side_;
  try {
    if (fwd) nodes_[i]->forward(e_);
    else nodes_[i]->backward(e_);
  } catch (...) {
    e_.st = main;
    throw;
  }
  e_.st = main;
  DLREC_CUDA_CHECK(cudaEventRecord(join_, side_));
}

void GraphCuda::run_forward() {
  if (e_.B == 0) {
    // A sharded model's evaluation: a rank without rows still pools for the others.
    if (e_.dp.collective && emb_idx_ >= 0) nodes_[emb_idx_]->forward(e_);
    return;
  }
  // The embedding lookup (no inputs) runs on the side stream beside the dense layers before
  // its first consumer.
  const bool ov = overlap_ && emb_idx_ >= 0;
  bool pending = false;
  if (ov) {
    on_side(emb_idx_, true);
    pending = true;
  }
  for (int i : spec_.order) {
    if (ov && i == emb_idx_) continue;
    if (pending)
      for (int j : spec_.layers[i].input_ids)
        if (j == emb_idx_ && pending) {
          DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, join_, 0));
          pending = false;
        }
    nodes_[i]->forward(e_);
    if (e_.mark_lins) e_.mark(spec_.layers[i].name);  // the serving breakdown
    else mark(spec_.layers[i].name + " fwd");
  }
  if (pending) DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, join_, 0));
}

// In fp16 (loss scaling), dL/dlogits is first multiplied by the scale, every update is deferred
// (Engine::update) while the gradients are checked as they are formed, and after the backward
// one kernel sets the step's gradient factor (0 on overflow: the deferred updates change
// nothing) and the next scale; then the dense updates run on the weight stream beside the table
// updates on the main stream.
void GraphCuda::run_backward() {
  if (e_.B == 0) return;
  e_.deferred.clear();
  e_.deferred_tables.clear();
  if (e_.fp16) {
    cd::scale_inplace(dlogits_.data<float>(), e_.B, ls_.scale, e_.st);
    trained_ = true;
  }
  for (auto& v : e_.vals) v.has_grad = false;
  e_.vals[spec_.output].has_grad = true;
  // The embedding update (its gradient is complete when its turn comes) runs on the side
  // stream beside the backward of the layers before it (the bottom MLP).
  bool pending = false;
  for (size_t k = spec_.order.size(); k-- > 0;) {
    const int i = spec_.order[k];
    if (!e_.vals[i].need_grad || !e_.vals[i].has_grad) continue;
    if (overlap_ && i == emb_idx_) {
      on_side(i, false);
      pending = true;
      continue;
    }
    nodes_[i]->backward(e_);
    mark(spec_.layers[i].name + " bwd+update");
  }
  e_.join_weights();
  if (pending) DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, join_, 0));
  if (!e_.fp16) return;
  cd::loss_scale_update(ls_, growth_interval_, e_.st);
  // The dense updates on the weight stream (forked after the scale update), the table updates
  // beside them on the main stream.
  e_.weights([&] {
    for (auto& f : e_.deferred) f();
  });
  for (auto& f : e_.deferred_tables) f();
  e_.join_weights();
  e_.deferred.clear();
  e_.deferred_tables.clear();
  mark("fp16 check + updates");
}

void GraphCuda::step_body() {
  if (timeline_) {
    marks_.clear();
    in_body_ = true;
    mark("step start");
    timeline_align();
  }
  run_forward();
  if (distill_alpha_ >= 0)
    cd::distill_with_logits(logits(), inputs_->slots[cur_].d_labels.data<float>(),
                            teacher_.data<float>(), fwd_rows_, distill_alpha_, distill_t_,
                            dlogits_.data<float>(), static_cast<double*>(loss_.raw()), e_.st);
  else
    cd::bce_with_logits(logits(), inputs_->slots[cur_].d_labels.data<float>(), fwd_rows_,
                        dlogits_.data<float>(), static_cast<double*>(loss_.raw()), e_.st,
                        nullptr, loss() == nn::LossKind::Mse, loss_rows_);
  mark(distill_alpha_ >= 0 ? "distill loss" : "bce");
  run_backward();
  if (timeline_) {
    mark("step end");
    in_body_ = false;
  }
}

Tensor GraphCuda::forward(const io::Batch& batch, bool training) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  have_training_forward_ = false;
  // A sharded model's forward is a collective (its tables live on their owners): every rank
  // runs it for each evaluation batch, with rows or without, counts exchanged first.
  const bool collective = e_.dp.comm && !e_.dp.table_owner.empty();
  DLREC_CHECK(!collective || !training, "graph model: a model with sharded tables trains with "
              "train_step_part (forward(training = true) is not a collective)");
  if (collective) exchange_counts(batch, false);
  upload(batch, 0.f, 0.f, training);
  e_.dp.collective = collective;
  e_.serving = serve_eager_ && !training;
  try {
    run_forward();
  } catch (...) {
    e_.dp.collective = false;
    e_.serving = false;
    throw;
  }
  e_.dp.collective = false;
  e_.serving = false;
  if (!timeline_) marks_.clear();  // phases are profiled in train_step only
  const int64_t B = fwd_rows_;
  Tensor out = Tensor::empty({B}, DType::F32, dev_);
  if (B)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(out.raw(), logits(), sizeof(float) * B,
                                     cudaMemcpyDeviceToDevice, e_.st));
  if (!training) DLREC_CUDA_CHECK(cudaEventRecord(inputs_->slots[cur_].free, e_.st));
  have_training_forward_ = training;
  // Callers read the logits with legacy-stream copies, which do not wait for our streams.
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  check_qat_flags();
  return out;
}

void GraphCuda::backward_and_update(const Tensor& dlogits, double lr_scale) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(have_training_forward_,
              "graph model: backward_and_update needs a forward(batch, training = true) before it");
  DLREC_CHECK(!e_.dp.comm, "graph model: a data-parallel model trains with train_step_part");
  DLREC_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == fwd_rows_,
              "graph model: dlogits must be f32 with ", fwd_rows_, " values, got ",
              dtype_name(dlogits.dtype()), " ", shape_str(dlogits.shape()));
  DLREC_CHECK(!dlogits.device().is_cuda() || dlogits.device() == dev_, "graph model: dlogits on ",
              dlogits.device().str(), ", the model is on ", dev_.str());
  DLREC_CHECK(lr_scale >= 0, "graph model: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  InputSlot& sl = inputs_->slots[cur_];
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  sl.lr[0] = static_cast<float>(lr_ * lr_scale);
  sl.lr[1] = static_cast<float>(emb_lr_ * lr_scale);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(sl.d_lr.raw(), sl.lr, sizeof(float) * 2,
                                   cudaMemcpyHostToDevice, e_.st));
  if (fwd_rows_)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dlogits_.raw(), dlogits.raw(), sizeof(float) * fwd_rows_,
                                     dlogits.device().is_cuda() ? cudaMemcpyDeviceToDevice
                                                                : cudaMemcpyHostToDevice,
                                     e_.st));
  run_backward();
  marks_.clear();
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, e_.st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));  // the host lr buffer and dlogits are reused
}

double GraphCuda::train_step(const io::Batch& batch, double lr_scale, bool want_loss) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(!e_.dp.comm, "graph model: a data-parallel model trains with train_step_part "
              "(every rank's part of the global batch)");
  loss_rows_ = 0;
  return run_train_step(batch, lr_scale, want_loss);
}

double GraphCuda::run_train_step(const io::Batch& batch, double lr_scale, bool want_loss) {
  // BCE steps after distillation ones (or the reverse): the captured steps hold the other loss.
  if (distill_alpha_ < 0 && graphs_alpha_ >= 0) {
    drop_graphs();
    graphs_alpha_ = -1;
  }
  check_batch(batch);
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows,
              "graph model: train_step needs one label per row");
  DLREC_CHECK(lr_scale >= 0, "graph model: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  mark("begin");
  upload(batch, static_cast<float>(lr_ * lr_scale), static_cast<float>(emb_lr_ * lr_scale),
         true);
  mark("h2d (+host packing)");
  InputSlot& sl = inputs_->slots[cur_];
  if (e_.dp.comm) {
    // The other ranks' counts are in the graph too: a graph of other counts is captured anew.
    std::vector<int64_t> shape = e_.dp.rows;
    shape.insert(shape.end(), e_.dp.nnz.begin(), e_.dp.nnz.end());
    if (!e_.dp.table_owner.empty())  // the owners' updates are sized by the ids per table
      shape.insert(shape.end(), e_.dp.table_nnz.begin(), e_.dp.table_nnz.end());
    if (shape != dp_shape_[cur_]) {
      sl.graph.reset();
      sl.eager_steps = 0;
      dp_shape_[cur_] = std::move(shape);
    }
  }
  e_.dp.step = e_.dp.comm != nullptr;  // the embedding's exchanges run in training steps only
  try {
    run_step(sl, fwd_rows_, fwd_nnz_, graphs_, e_.st, [&] { step_body(); });
  } catch (...) {
    e_.dp.step = false;
    throw;
  }
  e_.dp.step = false;
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, e_.st));
  flush_profile();
  if (!want_loss) return std::numeric_limits<double>::quiet_NaN();
  double loss = 0;
  DLREC_CUDA_CHECK(
      cudaMemcpyAsync(&loss, loss_.raw(), sizeof(double), cudaMemcpyDeviceToHost, e_.st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  check_qat_flags();
  return loss;
}

void GraphCuda::set_gradient_reducer(GradientReducer* reducer) {
  DeviceGuard g(dev_index_);
  synchronize();
  if (e_.dp.comm && e_.dp.cst) DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.dp.cst));
  if (e_.dp.dcst) DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.dp.dcst));
  drop_graphs();  // they hold the old exchanges (or none)
  dp_shape_[0].clear();
  dp_shape_[1].clear();
  cap_b_ = cap_nnz_ = 0;  // the buffers are sized anew (the exchange's, for every rank's batch)
  e_.dp = DataParallel{};
  dense_comm_.reset();
  host_comm_ = nullptr;
  if (!reducer) return;
  dist::Communicator* comm = reducer->device_communicator();
  DLREC_CHECK(comm && reducer->host_communicator(),
              "graph model on ", dev_.str(), ": data-parallel training across GPUs needs the "
              "NCCL communicator (dlrec train --gpus N, also under mpirun -np N)");
  DLREC_CHECK(comm->device() == dev_, "graph model on ", dev_.str(),
              ": the NCCL communicator is on ", comm->device().str());
  DLREC_CHECK(comm->size() <= gpu_graph::dp::kMaxRanks, "data-parallel training on ",
              comm->size(), " GPUs: at most ", gpu_graph::dp::kMaxRanks, " are supported");
  DLREC_CHECK(!e_.fp16, "train.precision \"fp16\": dynamic loss scaling across GPUs is not "
              "supported yet (bf16, tf32 and fp32 are)");
  DLREC_CHECK(!emb_ || !emb_->hashed(), "layer '", emb_ ? emb_->layer_name() : "",
              "': hashed tables are not supported across GPUs yet (fixed tables are)");
  for (const LayerSpec& s : spec_.layers)
    DLREC_CHECK(s.type != "wide", s.where, ": the wide layer's tables are not supported across "
                "GPUs yet (the embedding layer's are)");
  e_.dp.comm = comm;
  e_.dp.cst = static_cast<cudaStream_t>(comm->stream());
  e_.dp.to_comm = gpu::Event(dev_index_);
  e_.dp.from_comm = gpu::Event(dev_index_);
  e_.dp.rank = comm->rank();
  e_.dp.ranks = comm->size();
  host_comm_ = reducer->host_communicator();
  // The dense all-reduces on their own communicator (every rank makes it here, in step).
  dense_comm_ = comm->duplicate();
  if (dense_comm_) {
    e_.dp.dcomm = dense_comm_.get();
    e_.dp.dcst = static_cast<cudaStream_t>(dense_comm_->stream());
    e_.dp.to_dcomm = gpu::Event(dev_index_);
    e_.dp.from_dcomm = gpu::Event(dev_index_);
  }
  if (timeline_) timeline_setup();
}

// Every rank's rows and ids are exchanged on the host first (the embedding exchange's sizes;
// a small MPI all-gather, no device synchronisation), then the step runs with the loss of the
// global batch's mean.
double GraphCuda::train_step_part(const io::Batch& batch, int64_t global_rows, double lr_scale,
                                  bool want_loss) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(e_.dp.comm, "graph model: train_step_part without a data-parallel reducer");
  check_batch(batch);
  exchange_counts(batch, true);
  DLREC_CHECK(e_.dp.global_rows == global_rows, "data-parallel step: the ranks hold ",
              e_.dp.global_rows, " rows of a global batch of ", global_rows);
  loss_rows_ = global_rows;
  return run_train_step(batch, lr_scale, want_loss);
}

void GraphCuda::synchronize() {
  DeviceGuard g(dev_index_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(copy_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(side_));
  if (e_.wst) DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.wst));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

std::vector<NamedTensor> GraphCuda::parameters() {
  materialize_tables();
  synchronize();
  shadows_stale_ = e_.lowp;  // the caller may write into the f32 masters
  exposed_ = true;
  std::vector<NamedTensor> out;
  for (auto& p : dense_) out.emplace_back(p.name, p.value);
  hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr;
  if (!hashed) {
    // A sharded model: the tables this GPU owns, and whole host copies of the others while
    // gather_sharded_tables made them (rank 0, for a checkpoint or an export).
    // A row-wise table's piece (its range of rows) is not the table: it is handed out only as
    // the whole host copy.
    for (size_t k = 0; k < tables_.size(); ++k) {
      const Tensor* h = host_table(k, false);
      if (h) out.emplace_back(tables_[k].name, *h);
      else if (tables_[k].value.defined() && !split_piece(k))
        out.emplace_back(tables_[k].name, tables_[k].value);
    }
    return out;
  }
  // Hashed tables as the CPU graph model hands them out (names, order, shapes and meaning):
  // per table "<t>.weight" (the device rows by slot), then host tensors "<t>.keys", "<t>.lru"
  // and "<t>.hash_meta" built from the device state; the caller may write into all of them (a
  // checkpoint load), and the next step rebuilds the device state from them.
  report_hashed(*hashed);
  const auto& st = hashed->export_state();
  DLREC_CHECK(st.size() == tables_.size(), "graph model: ", st.size(), " hashed tables for ",
              tables_.size(), " tables (bug)");
  for (size_t t = 0; t < tables_.size(); ++t) {
    const std::string base = emb_->layer_name() + "." + std::to_string(t);
    out.emplace_back(tables_[t].name, tables_[t].value);
    out.emplace_back(base + ".keys", st[t].keys);
    out.emplace_back(base + ".lru", st[t].lru);
    out.emplace_back(base + ".hash_meta", st[t].meta);
  }
  return out;
}

// One "[hashed]" line per table on stderr when lookups happened since the last report, as the
// CPU graph model prints at checkpoints and exports.
void GraphCuda::report_hashed(hashed_cuda::HashedTables& h) {
  const auto st = h.stats();
  int64_t total = 0;
  for (const auto& s : st) total += s.lookups;
  if (total == hashed_reported_lookups_) return;
  hashed_reported_lookups_ = total;
  for (size_t t = 0; t < st.size(); ++t) {
    const auto& s = st[t];
    std::fprintf(stderr,
                 "[hashed] %s.%zu: %lld/%lld rows, %lld lookups, hit rate %.4f, %lld inserts, "
                 "%lld evictions\n",
                 emb_->layer_name().c_str(), t, static_cast<long long>(s.size),
                 static_cast<long long>(h.capacities()[t]), static_cast<long long>(s.lookups),
                 s.lookups ? static_cast<double>(s.hits) / s.lookups : 0.0,
                 static_cast<long long>(s.inserts), static_cast<long long>(s.evictions));
  }
}

double GraphCuda::loss_scale() {
  if (!e_.fp16) return 0;
  float scale = 0;
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  DLREC_CUDA_CHECK(cudaMemcpy(&scale, ls_.scale, sizeof scale, cudaMemcpyDeviceToHost));
  return scale;
}

std::vector<NamedTensor> GraphCuda::optimizer_state() {
  materialize_tables();
  synchronize();
  exposed_ = true;
  std::vector<NamedTensor> out;
  if (const std::string suffix = e_.state_suffix(false); !suffix.empty())
    for (auto& p : dense_) out.emplace_back(p.name + suffix, p.state);
  if (const std::string suffix = e_.state_suffix(true); !suffix.empty()) {
    for (size_t k = 0; k < tables_.size(); ++k) {  // as in parameters()
      const Tensor* h = host_table(k, true);
      if (h) out.emplace_back(tables_[k].name + suffix, *h);
      else if (tables_[k].state.defined() && !split_piece(k))
        out.emplace_back(tables_[k].name + suffix, tables_[k].state);
    }
  }
  if (e_.fp16) out.emplace_back("amp.loss_scale", ls_mem_);
  return out;
}

}  // namespace graph_cuda_impl

std::unique_ptr<CudaModel> make_graph_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                           const io::ShardLayout& layout, Device device,
                                           uint64_t seed, const std::string& precision,
                                           const GraphCudaOptions& opts) {
  DLREC_CHECK(device.is_cuda(), "make_graph_cuda: ", device.str(), " is not a CUDA device");
  DLREC_CHECK(model.arch == "graph", "make_graph_cuda: model.arch is '", model.arch,
              "', expected \"graph\"");
  return std::make_unique<graph_cuda_impl::GraphCuda>(model, opt, layout, device, seed,
                                                      precision, opts);
}

}  // namespace dlrec::model

