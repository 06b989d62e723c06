// Internal: the CUDA graph engine's model class (include/dlrec/model/graph_cuda.h), defined in
// src/model/graph_cuda.cu (building, the training step, parameters) and
// src/model/graph_cuda_infer.cu (predict(): the bucketed inference graphs with host packing).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dlrec/core/spin_team.h"
#include "model/infer_small_cuda.h"
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::graph_cuda_impl {

using namespace gpu_graph;

// The packing team of predict(), shared by all models of the process (model instances serving
// at once take turns: a packing lasts microseconds), so that no more than `size` threads spin.
// Created on first use with the size asked for then (GraphCudaOptions::infer_pack_threads).
SpinTeam& pack_team(int size);

// predict()'s bucket arithmetic: the power of two >= v (as an exponent), 16-byte alignment.
inline int log2_ceil(int64_t v) {
  int lg = 0;
  while ((int64_t{1} << lg) < v) ++lg;
  return lg;
}
inline size_t align16(size_t b) { return (b + 15) / 16 * 16; }
// Pinned host memory that the device can address (graph_cuda_infer.cu).
PinnedPtr mapped_alloc(size_t bytes);
// Spins on the event rather than sleeping in a sync: serving wants the latency.
void spin_wait(cudaEvent_t e);

class GraphCuda final : public CudaModel {
 public:
  GraphCuda(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
            Device device, uint64_t seed, const std::string& precision,
            const GraphCudaOptions& opts);
  ~GraphCuda() override;
  Tensor forward(const io::Batch& batch, bool training) override;
  void backward_and_update(const Tensor& dlogits, double lr_scale) override;
  std::vector<NamedTensor> parameters() override;
  std::vector<NamedTensor> optimizer_state() override;
  double loss_scale() override;  // fp16: the dynamic loss scale (waits for the device)
  Device device() const override { return dev_; }
  double train_step(const io::Batch& batch, double lr_scale, bool want_loss) override;
  void synchronize() override;
  // Data-parallel across GPUs (Engine::dp): the reducer's NCCL communicator carries the
  // exchanges inside the step; train_step_part runs this rank's part of a global batch.
  void set_gradient_reducer(GradientReducer* reducer) override;
  bool trains_parts_on_device() const override { return e_.dp.comm != nullptr; }
  // Distillation in the step (one GPU): the teacher's logits copied to the device, the loss
  // kernel cd::distill_with_logits in place of the BCE one (graph_cuda_compress.cu).
  bool distills_in_step() const override { return e_.dp.comm == nullptr; }
  double train_step_distill(const io::Batch& batch, const float* teacher_logits, double alpha,
                            double temperature, double lr_scale, bool want_loss) override;
  double train_step_part(const io::Batch& batch, int64_t global_rows, double lr_scale,
                         bool want_loss) override;
  // Table-wise sharding of the embedding layer's tables over the GPUs (graph_cuda_shard.cu):
  // each table pooled and updated by its owner, exchanged by all-to-all inside the step.
  // A GPU allocates only the tables it owns; its parameters() and optimizer_state() hold those
  // (the device tensors themselves, so a checkpoint loads straight into them) and, on rank 0
  // after gather_sharded_tables (a collective: the others streamed from their owners in
  // chunks), host copies of the rest; release (and scatter: the owned tables are never
  // copies) drops the host copies.
  void shard_tables(dist::Communicator& comm, const dist::PlannerOptions& options,
                    const std::vector<double>& ids_per_sample, std::FILE* plan_log) override;
  void gather_sharded_tables() override;
  void scatter_sharded_tables() override { release_sharded_tables(); }
  void release_sharded_tables() override;
  // Serving (graph_cuda_infer.cu): batches with one id per table and row run as one CUDA graph
  // per power-of-two bucket of rows (copy in, forward, sigmoid, copy out), in chunks of
  // GraphCudaOptions::infer_chunk rows through two alternating buckets (the host packs one while the device runs
  // the other); batches with several ids per row somewhere likewise through multi-hot buckets
  // (graph_cuda_infer_multihot.cu); hashed tables' buckets carry the int64 keys, which their
  // graphs resolve to rows; QAT layers, DLREC_PROFILE=1 and GraphCudaOptions::cuda_graphs off
  // run eagerly (forward() and a sigmoid on the host).
  void predict(const io::Batch& batch, float* probs) override;
  void* serving_stream() override { return e_.st; }
  // Serving a compressed export (graph_cuda_infer.cu; docs/COMPRESSION.md).
  void set_compressed(const std::vector<CompressedWeight>& weights,
                      nn::kernel_choice::Policy policy) override;
  void set_kernel_policy(nn::kernel_choice::Policy policy) override;
  // Row-wise quantized tables (graph_cuda_shard.cu): the embedding layer's fixed tables are
  // served from their codes on the device (never allocated in fp32); other tables (wide) take
  // the codes' values (Model's default). A model serving codes refuses to train.
  void set_quantized_tables(std::vector<QuantizedTable> tables) override;
  std::vector<std::string> kernel_report() override;
  // 2:4 pruning masks (graph_cuda_masks.cu; docs/COMPRESSION.md): the mlp and cross weights
  // (host copies of their values: what the pruner reads; their parameters are host shells
  // whose `quant` carries QAT records, graph_cuda_compress.cu), a mask per weight kept on the host
  // (shared storage: a checkpoint loads into it) and on the device, where the dense update
  // writes 0 wherever it is 0, as the CPU's optimizer step does.
  std::vector<PrunableWeight> prunable_weights() override;
  void set_mask(const std::string& name, const Tensor& mask) override;
  std::vector<NamedTensor> masks() override;
  // Where one chunk of predict() spends its time (graph_cuda_breakdown.cu).
  std::vector<std::string> serving_breakdown(const io::Batch& batch, int reps) override;

 private:
  std::unique_ptr<Node> make_node(const LayerSpec& s, int idx, uint64_t seed);
  void check_batch(const io::Batch& b) const;
  void ensure_capacity(int64_t B, int64_t nnz);
  // `training`: hashed tables insert the batch's keys (evaluation only looks them up).
  void upload(const io::Batch& b, float lr, float emb_lr, bool training);
  void bind_slot();
  void run_forward();
  void run_backward();
  void on_side(int i, bool fwd);
  void step_body();
  void plan_direct_embedding();
  void refresh_shadows();
  void drop_graphs();
  void report_hashed(hashed_cuda::HashedTables& h);
  // predict()'s buckets: per power of two R and parity, pinned inputs (dense [R, num_dense],
  // then global table rows [T, R]; rows past a chunk keep earlier valid values), their device
  // copy, constant offsets (one id per bag), the probabilities and the captured graph.
  struct InferBucket {
    int64_t rows = 0;
    PinnedPtr in, out;
    float* dense = nullptr;
    uint32_t* keys = nullptr;
    float* probs = nullptr;
    Tensor d_in, d_offsets, d_probs;
    const void* dev_in = nullptr;  // `in` and `probs` as the device sees them (mapped memory:
    float* dev_probs = nullptr;    // the fused small-batch kernel reads and writes in place)
    gpu::Event done, copied;
    gpu::GraphExec graph;
    bool no_graph = false;  // the capture failed: eager from now on
    // Multi-hot buckets (graph_cuda_infer_multihot.cu): room for id_cap ids; the offsets
    // [T * R + 1] (`offsets_at` bytes into `in` and d_in) and the ids (`keys_at`) follow the
    // dense rows, and travel with each chunk. id_cap 0: a one-hot bucket.
    int64_t id_cap = 0, nnz = 0;  // nnz: the ids of the chunk packed last
    int32_t* offsets = nullptr;
    size_t offsets_at = 0, keys_at = 0;
    // A model with hashed tables: the chunk's keys as int64 too (`keys64_at` bytes into `in`
    // and d_in; [T, R] one-hot, in the ids' order multi-hot), which its tables resolve to rows
    // (written over the uint32 ids on the device); 0 / null otherwise.
    size_t keys64_at = 0;
    int64_t* keys64 = nullptr;
  };
  std::vector<std::unique_ptr<InferBucket>> buckets_;
  // Multi-hot buckets by (log2 R, log2 id capacity, parity).
  std::map<std::tuple<int, int, int>, std::unique_ptr<InferBucket>> mh_buckets_;
  InferBucket& infer_bucket(int64_t R, int parity);
  InferBucket& multihot_bucket(int64_t R, int64_t id_cap, int parity);
  // A new bucket's device inputs (in_bytes; zeroed), probabilities and events.
  void bucket_device_side(InferBucket& bk, size_t in_bytes);
  // The bytes of `in` a launch copies: a one-hot bucket's whole inputs, a multi-hot one's up to
  // the last chunk's ids (and int64 keys).
  size_t bucket_copy_bytes(const InferBucket& bk) const;
  // Where each table's ids begin among rows [r0, r0 + n)'s (T_ + 1 values; checked: offsets
  // inside each table's ids, fewer than 2^31 in all).
  std::vector<int64_t> multihot_starts(const io::Batch& batch, int64_t r0, int64_t n) const;
  // The multi-hot bucket of R rows with room for `ids` (the next power of two).
  InferBucket& multihot_bucket_for(int64_t R, int64_t ids, int parity);
  // Packs rows [r0, r0 + n) of a batch with several ids per row somewhere into a multi-hot
  // bucket (ids range-checked, offsets per table R apart, the rows past n empty bags) and, with
  // copy_on, copies them to the bucket's device inputs on that stream as they are packed.
  void multihot_pack(const io::Batch& batch, int64_t r0, int64_t n,
                     const std::vector<int64_t>& start, InferBucket& bk, cudaStream_t copy_on);
  // predict() of such a batch: chunks through the multi-hot buckets' captured graphs.
  void predict_multihot(const io::Batch& batch, float* probs);
  // predict()'s chunk loop: rows [0, B) in chunks of `chunk` through buckets of alternating
  // parity (the host packs one while the device runs the other). launch(r0, n, parity) packs
  // and launches a chunk and returns its bucket, whose probabilities are copied to probs once
  // done; nullptr: the chunk cannot go this way, and false returns once nothing is pending.
  bool run_chunks(int64_t B, int64_t chunk, float* probs,
                  const std::function<InferBucket*(int64_t, int64_t, int)>& launch);
  void infer_body(InferBucket& bk);
  // Copies the bucket's inputs in (on the copy stream with copy_aside; `copied`: its packing
  // did, on the stream infer_launch would use) and launches its graph.
  void infer_launch(InferBucket& bk, bool copy_aside, bool copied = false);
  // Packs rows [r0, r0 + n) of `batch` into bk; false when a table has other than one id per
  // row there (then the bucket's keys are reset to valid padding).
  bool infer_pack(const io::Batch& batch, int64_t r0, int64_t n, InferBucket& bk);
  void predict_eager(const io::Batch& batch, float* probs);
  // The masks set so far, by weight name (set_mask, masks()).
  std::map<std::string, Tensor> host_masks_;
  // QAT (graph_cuda_compress.cu): the weights' host parameter shells (prunable_weights), the record
  // each layer's device state was made from, and whether any layer trains quantized.
  std::map<std::string, nn::Param> shells_;
  struct QatSeen {
    const void* record = nullptr;
    double decay = 0;
  };
  std::map<std::string, QatSeen> qat_seen_;
  bool qat_on_ = false;
  void attach_qat();             // before each upload and predict()
  void check_qat_flags();        // at host synchronisations: a non-finite input or weight fails
  void qat_ranges_to_records();  // the device's running ranges into the shells' records
  // The mlp and cross weights' layers in graph order (Node::compressible): what the compressed
  // layers (set_compressed) and the masks (graph_cuda_masks.cu) attach to.
  struct WeightLin {
    std::string layer, name;  // the graph layer's name, the weight's ("top.0.weight")
    Lin* lin;
  };
  std::vector<WeightLin> weight_lins();
  // Set by predict_eager around forward(): the forward serves (Engine::serving: compressed
  // layers' kernels, the inference-only layers), as infer_body's does.
  bool serve_eager_ = false;
  static void check_serving_options(const GraphCudaOptions& o);
  int pack_threads_ = 1;  // GraphCudaOptions::infer_pack_threads resolved
  // The fused small-batch forward (model/infer_small_cuda.h) of a DLRM-shaped graph in 16 bits:
  // planned on first use (plan_fused: off for other shapes, with the reason printed once);
  // its layers' weights and buffers are the engine's own, read in place.
  enum class Fused { Unplanned, On, Off };
  Fused fused_ = Fused::Unplanned;
  fused_infer::Params fused_params_;
  // The program form (fused_infer::prog) when the graph is not DLRM-shaped: its ops on the
  // host and on the device (fused_prog_.ops), planned with the same buffers.
  bool fused_is_program_ = false;
  fused_infer::prog::Program fused_prog_;
  Tensor fused_ops_;
  std::string plan_program();
  Tensor fused_barrier_;        // the kernel's grid-barrier counter (u32, zeroed once)
  uint32_t fused_counter_ = 0;  // its value when the next launch starts
  void plan_fused();
  // A layer's INT8 form in the fused kernel: under the compressed policy, a compressed layer's
  // INT8 record; none otherwise (its 16-bit weights: dense, or a 2:4 layer's pruned ones).
  fused_infer::Int8Form fused_int8_form(const Lin& l) const;
  bool fused_launch(InferBucket& bk, int64_t n);
  int64_t hashed_reported_lookups_ = 0;
  // Compressed layers (set_compressed): the int8 GEMMs' planner (Engine::comp_lt), the
  // policy (under "compressed" no batch takes the fused small-batch path: every row count runs
  // the compressed kernels) and the layers.
  std::unique_ptr<lt::Lt> comp_lt_;
  nn::kernel_choice::Policy kernel_policy_ = nn::kernel_choice::Policy::Fastest;
  std::vector<Lin*> compressed_;
  const float* logits() const {
    return e_.vals[spec_.layers[spec_.output].input_ids[0]].y.data<float>();
  }

  GraphCudaOptions opts_;
  OptimizerConfig oc_;
  // The device's shared pools (cuBLAS and cuBLASLt handles with workspaces): held while the
  // model lives; its leases (Engine::blas, lt, ...) go back to them on destruction.
  std::shared_ptr<gpu::DeviceResources> res_;
  io::ShardLayout layout_;
  GraphSpec spec_;
  Device dev_;
  int dev_index_;
  Engine e_;
  int64_t T_ = 0, num_dense_ = 0;
  float lr_ = 0, emb_lr_ = 0;
  bool overlap_ = true;  // the embedding layer on a side stream (off when profiling)
  int emb_idx_ = -1;
  bool graphs_ = true, shadows_stale_ = false;
  bool exposed_ = false;  // parameters()/optimizer_state() handed out tensors since last upload
  std::vector<std::unique_ptr<Node>> nodes_;
  Node* emb_ = nullptr;  // the embedding layer (Build::embedding), if any
  // The global row of id 0 of each feature in the keys uploaded (the same for every table
  // layer: all read all features), or null without table layers.
  const std::vector<uint32_t>* row_base_ = nullptr;
  std::vector<NamedState> dense_, tables_;
  int64_t cap_b_ = 0, cap_nnz_ = 0;
  Tensor dlogits_, loss_;
  // train_step_distill: the teacher's logits of the step (device, one buffer: the copy is
  // ordered on the main stream after the previous step), the loss's alpha and temperature
  // while a distillation step runs (distill_alpha_ < 0: the BCE step), and those the slots'
  // captured graphs were made with (a change drops them).
  Tensor teacher_;
  double distill_alpha_ = -1, distill_t_ = 1;
  double graphs_alpha_ = -1, graphs_t_ = 1;
  std::unique_ptr<StepInputs> inputs_;  // double-buffered step inputs (cuda_step.h)
  // fp16 loss scaling (Engine::fp16): the device state {scale, 1/scale or 0, overflow, good
  // steps, skipped steps} ("amp.loss_scale" in optimizer_state, as checkpoints hold it).
  Tensor ls_mem_;
  cd::LossScale ls_;
  int growth_interval_ = 2000;  // optimizer.loss_scale_growth_interval
  bool trained_ = false;        // a training step ran (fp16: report the scale at the end)
  void init_loss_scale();
  int cur_ = 0;                          // the slot of the last upload
  // Data-parallel: the host communicator for the per-step counts, the loss's denominator (the
  // global batch's rows; 0: this batch's) and, per input slot, the ranks' (rows, ids) its graph
  // was captured for (the other ranks' counts are baked into the graph too).
  dist::Communicator* host_comm_ = nullptr;
  std::unique_ptr<dist::Communicator> dense_comm_;  // the dense all-reduces' (Engine::dp.dcomm)
  int64_t loss_rows_ = 0;
  std::vector<int64_t> dp_shape_[2];
  // Table-wise sharding (graph_cuda_shard.cu): the embedding layer's tables by index; a GPU
  // allocates only those it owns (materialize_tables). host_tables_[t]: a whole host copy of
  // a table this GPU does not own (values, state), made by gather_sharded_tables on rank 0 for
  // a checkpoint or export and dropped by release_sharded_tables; undefined otherwise.
  std::vector<int> sharded_index_;  // tables_ position of the embedding's table t
  std::vector<std::pair<Tensor, Tensor>> host_tables_;
  // The embedding layer's tables are allocated and initialised on first use (all of them) or
  // by shard_tables (those this GPU owns): a sharded run never allocates the others.
  bool tables_ready_ = false;
  bool quantized_tables_ = false;  // the embedding layer serves some tables from their codes
  void materialize_tables(const std::vector<TableKeep>* keep = nullptr);
  // The host copy of tables_[k] (its state with `state`) that a gather made, or null.
  const Tensor* host_table(size_t k, bool state) const;
  // Whether tables_[k] is this GPU's piece of a row-wise table (a range of its rows) or of a
  // column-wise one (a range of its columns).
  bool split_piece(size_t k) const;
  gpu_graph::dp::HybridTable hybrid_of(size_t t) const;  // table t's entry in e_.dp.hybrid
  // Every rank's rows, ids and ids per table of this batch (one host all-gather) into e_.dp,
  // the buffers sized for the largest part; `need_rows`: every rank must have rows.
  void exchange_counts(const io::Batch& batch, bool need_rows);
  double run_train_step(const io::Batch& batch, double lr_scale, bool want_loss);
  int64_t fwd_rows_ = 0, fwd_nnz_ = 0;
  bool have_training_forward_ = false;

  // DLREC_PROFILE=1: device time per layer and direction from events around each layer (no
  // CUDA graphs), summed over train_step calls after the first 3, printed at destruction.
  void mark(const std::string& what);
  void flush_profile();
  bool profile_ = false;
  int profile_rank_ = -1;  // data-parallel: this rank, for the profile's labels
  std::vector<gpu::Event> events_;
  std::vector<std::string> marks_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  int64_t profiled_steps_ = 0, seen_steps_ = 0;
  // DLREC_PROFILE=timeline: the step stays one CUDA graph with its streams; mark records an
  // external event node on the current stream (the communicator's around each collective) and
  // after each step the time of every mark from the step's start is summed (steps after the
  // first 3), printed per rank at destruction with the mark's stream.
  bool timeline_ = false, in_body_ = false;
  void timeline_mark(const std::string& what, cudaStream_t s);
  void timeline_flush();  // after a step
  void timeline_print();  // at destruction (graph_cuda_timeline.cu)
  void profile_print();   // DLREC_PROFILE=1, at destruction (graph_cuda_timeline.cu)
  // Data-parallel: a one-value all-reduce on the embedding's communicator stream right after
  // the step's first mark aligns the ranks; the marks after it are timed from its end
  // (tl_origin_, the index of its end mark; 0 on one GPU) and its own time, the ranks' launch
  // skew, is summed apart (tl_skew_ms_).
  void timeline_setup();  // set_gradient_reducer: tl_align_
  void timeline_align();
  std::vector<double> tl_ms_;
  double tl_skew_ms_ = 0;
  size_t tl_origin_ = 0;
  Tensor tl_align_;  // the all-reduce's value (f32, zeroed)

  // Events and streams last: destroyed first, before the engine, nodes, inputs and tensors (a
  // gpu::Stream waits for its work when destroyed, so no buffer is freed while in use).
  gpu::Event fork_, join_;
  // st_: the main stream (Engine::st is a non-owning copy), wst_: the weight-gradient stream
  // (Engine::wst; none without it), copy_: input copies, side_: the embedding layer.
  gpu::Stream st_, wst_, copy_, side_;
};

}  // namespace dlrec::model::graph_cuda_impl
