// Model configuration and the Model interface the trainer, evaluator and exporter use.
//
// A run's JSON config has three sections: {"model": {...}, "optimizer": {...}, "train": {...}}
// (docs/CONFIG.md). Unknown keys anywhere are errors naming the key.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/core/tensor.h"
#include "dlrec/io/batch.h"
#include "dlrec/io/shard.h"
#include "dlrec/nn/kernel_choice.h"
#include "dlrec/nn/loss.h"
#include "dlrec/nn/row_quant.h"

namespace dlrec::nn {
struct SparseGrad;
struct Param;
}
namespace dlrec::dist {
class Communicator;
struct PlannerOptions;
}

namespace dlrec::model {

// arch "graph": the model is the `layers` list; any other arch is a preset (docs/MODELS.md,
// "Presets") whose keys below expand to such a list for the data's layout (presets.cc).
struct ModelConfig {
  std::string arch = "dlrm";
  int64_t embedding_dim = 16;
  std::vector<int64_t> bottom_mlp = {64, 16};  // hidden..output sizes; input = num_dense
  std::vector<int64_t> top_mlp = {64, 1};      // hidden..output sizes; last must be 1
  std::string interaction = "dot";             // "dot" | "cat"
  std::string pooling = "sum";                 // "sum" | "mean" (multi-hot bags)
  int64_t cross_layers = 3;    // arch "dcnv2": cross layers
  int64_t cross_low_rank = 0;  // arch "dcnv2": rank of the cross layers' weights; 0: full
  json layers;  // arch "graph": the list of named layers (docs/MODELS.md); null otherwise
  static ModelConfig from_json(ConfigReader& r);
  json to_json() const;
};

// Learning-rate schedule: a factor on the optimizer's lr at each step (0-based).
//   step < warmup_steps:            (step + 1) / warmup_steps             (linear warm-up)
//   step >= decay_start_step and decay_steps != 0:
//       t = min(1, (step - decay_start_step) / D), D = decay_steps, or the steps left until
//       the end of training when decay_steps = -1;
//       factor = end_factor + (1 - end_factor) * (1 - t)^decay_power      (polynomial decay,
//       the MLPerf DLRM schedule)
//   step >= decay_start_step and decay_every > 0:
//       factor = gamma^floor((step - decay_start_step) / decay_every)   (step decay; exclusive
//       with decay_steps != 0)
//   otherwise:                       1
struct LrSchedule {
  int64_t warmup_steps = 0;
  int64_t decay_start_step = 0;
  int64_t decay_steps = 0;  // 0: no decay; -1: decay until the last step
  double decay_power = 2.0;
  double end_factor = 0.0;
  int64_t decay_every = 0;  // step decay period; 0: off
  double gamma = 0.1;       // step decay factor per period
  double factor(int64_t step, int64_t total_steps) const;
  static LrSchedule from_json(ConfigReader& r);
  json to_json() const;
};

// The optimizer section (docs/CONFIG.md). `embedding` holds at most one entry: the optimizer of
// the embedding tables when it differs from the dense layers' one (the JSON sub-object
// "optimizer.embedding"; its missing keys take the values of the section around it).
struct OptimizerConfig {
  std::string type = "sgd";  // "sgd" | "adagrad" | "rowwise_adagrad" | "adam" | "ftrl"
  double lr = 0.1;           // dense and embedding learning rate
  double embedding_lr = -1;  // < 0: same as lr
  double momentum = 0.0;     // sgd
  bool nesterov = false;     // sgd
  double adagrad_eps = 1e-8;
  double adagrad_init = 0.0;  // initial accumulator value (adagrad, rowwise_adagrad)
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;  // adam
  double ftrl_beta = 1.0, ftrl_l1 = 0.0, ftrl_l2 = 0.0;  // ftrl (alpha = lr)
  double weight_decay = 0.0;  // dense layers only
  double clip_norm = 0.0;     // global-norm clipping of the dense gradients; 0: off
  double clip_value = 0.0;    // element-wise clipping of every gradient; 0: off
  // train.precision "fp16" (dynamic loss scaling): the starting scale, and how many good steps
  // in a row double it (an overflowed step halves it).
  double loss_scale_init = 65536.0;
  int64_t loss_scale_growth_interval = 2000;
  LrSchedule schedule;
  std::vector<OptimizerConfig> embedding;  // 0 or 1 override for the embedding tables
  // The effective configuration of the embedding tables (the override, or this one).
  OptimizerConfig embedding_config() const;
  // The embedding tables' learning rate before the schedule.
  double embedding_lr_value() const;
  static OptimizerConfig from_json(ConfigReader& r);
  json to_json() const;
};

struct TrainConfig {
  int64_t batch_size = 128;
  int64_t eval_batch_size = 16384;
  int epochs = 1;
  int64_t max_steps = -1;        // stop after this many steps (-1: epochs decide)
  int64_t eval_every = 0;        // evaluate every N steps (0: at the end only)
  int64_t log_every = 100;       // progress line every N steps
  int64_t checkpoint_every = 0;  // checkpoint every N steps (0: at the end only)
  uint64_t seed = 1234;
  std::string device = "cpu";
  std::string precision = "fp32";  // CUDA: "fp32" | "tf32" | "bf16" (mixed, f32 master weights)
  // "bce" (click labels; predictions are sigmoid(output)) | "mse" (a regression target; the
  // output is the prediction). Evaluation follows it: AUC/logloss or RMSE/MAE.
  std::string loss = "bce";
  // CUDA bf16/fp16: every cuBLASLt GEMM takes its heuristic's first algorithm instead of the
  // fastest of its candidates timed on first use, so that runs of the same seed and data give
  // the same bits (timing picks differently from run to run; docs/CONFIG.md).
  bool deterministic = false;
  static TrainConfig from_json(ConfigReader& r);
  json to_json() const;
};

struct RunConfig {
  ModelConfig model;
  OptimizerConfig optimizer;
  TrainConfig train;
  // "sharding": the embedding sharding of a job across ranks (docs/DISTRIBUTED.md; checked
  // here, read by the trainer with the job's rank count); null: tables replicated.
  json sharding;
  // The "compress" section (docs/COMPRESSION.md), kept as JSON here and validated by
  // compress::CompressConfig::from_json (src/compress) when a trainer or `dlrec compress` uses
  // it; null when absent.
  json compress;
  static RunConfig from_json(const json& j);  // strict: unknown keys throw
  static RunConfig load(const std::string& path);
  json to_json() const;
  // Sets "train" keys (the CLI's and the Python package's overrides: batch_size, epochs,
  // max_steps, device, precision) and validates them as the file's keys are.
  void override_train(const json& values);
};

// Data-parallel training (docs/DISTRIBUTED.md): after backward has computed every gradient of a
// step and before the optimizers apply them, a model with a reducer hands its gradients to it,
// which sums them over the ranks. Called on every rank in the same order (they are collectives).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Sums the dense gradients (f32, the model's device) over the ranks, in place.
  virtual void reduce_dense(const std::vector<Tensor*>& grads) = 0;
  // `merged` becomes the sum over the ranks of a table's sparse gradient `local`: the distinct
  // ids in order of first occurrence over rank 0's rows, then rank 1's, ... (the order of one
  // process's batch of every rank's rows).
  virtual void reduce_sparse(const nn::SparseGrad& local, nn::SparseGrad& merged) = 0;
  // Models that run the whole step on a GPU (the CUDA engine) exchange through these instead:
  // the communicator over the ranks' GPUs (NCCL; its collectives are captured in the step's
  // CUDA graph) and a host one (MPI) for the per-step counts. Null: no GPU data parallelism.
  virtual dist::Communicator* device_communicator() { return nullptr; }
  virtual dist::Communicator* host_communicator() { return nullptr; }
};

// A named tensor of model state (parameters and optimizer state) for checkpoints and export.
using NamedTensor = std::pair<std::string, Tensor>;

// A weight that pruning may mask (docs/COMPRESSION.md): a matrix [out, in] of an mlp or cross
// layer, reduced along `in` (its rows' contiguous values). Embeddings and biases never are.
// A compressed weight as a serving model takes it (Model::set_compressed): its 2:4 mask and/or
// its INT8 record, read from an export's weights.dlrec (docs/COMPRESSION.md).
struct CompressedWeight {
  std::string name;  // the parameter's name ("top.0.weight")
  Tensor mask;       // F32 0/1 [out, in] on the CPU; undefined: not masked
  bool int8 = false;
  std::vector<int8_t> q;       // [out, in]
  std::vector<float> wscale;   // [out]
  float xscale = 0.f;
};

// A table served from row-wise INT8 / 4-bit codes (docs/COMPRESSION.md, nn/row_quant.h): the
// table parameter's name ("emb.3.weight") and its codes, scales and biases.
struct QuantizedTable {
  std::string name;
  nn::RowQuantRows rows;
};

struct PrunableWeight {
  std::string layer;  // the graph layer's name
  std::string name;   // the parameter's name ("top.0.weight")
  Tensor weight;      // shared storage
  // The weight's parameter (its mask, and the quantization record src/compress attaches).
  nn::Param* param = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  // Logits [rows] (F32, on the model's device) for the batch. With training = true the
  // activations are kept for backward().
  virtual Tensor forward(const io::Batch& batch, bool training) = 0;
  // Back-propagates dL/dlogits [rows] of the last training forward and applies the optimizer
  // update to every parameter (embedding rows are updated sparsely).
  virtual void backward_and_update(const Tensor& dlogits, double lr_scale = 1.0) = 0;
  // The loss of train_step (TrainConfig::loss; BCE unless set). The trainer sets it once, before
  // the first step.
  void set_loss(nn::LossKind k) { loss_kind_ = k; }
  nn::LossKind loss() const { return loss_kind_; }
  // One training step: forward, the loss (loss()), backward_and_update. Returns the batch's
  // mean loss when want_loss (models that keep the loss on their device may return NaN
  // otherwise, to avoid a host synchronisation). The default runs the loss on the host.
  virtual double train_step(const io::Batch& batch, double lr_scale, bool want_loss);
  // Waits for the work the model has queued on its device (no-op on the CPU).
  virtual void synchronize() {}
  // Parameters (names like "emb.3.weight", "bottom.0.weight") — shared storage, not copies.
  virtual std::vector<NamedTensor> parameters() = 0;
  // Optimizer state (e.g. "emb.3.weight.adagrad"); empty for plain SGD.
  virtual std::vector<NamedTensor> optimizer_state() = 0;
  virtual Device device() const = 0;
  // The dynamic loss scale of train.precision "fp16" (TensorBoard's train/loss_scale); 0 when
  // the model keeps none. May wait for the device: call it at logging points only.
  virtual double loss_scale() { return 0; }
  // Data-parallel training: gradients go through `reducer` from the next step on (null: off).
  // Throws naming the layer when the model cannot (the default: not supported at all).
  virtual void set_gradient_reducer(GradientReducer* reducer);
  // Distillation (compress.distill, docs/COMPRESSION.md) inside the engine's own training step:
  // true when train_step_distill runs it (the CUDA graph engine on one GPU: the loss kernel
  // reads the teacher's logits, the step stays one captured graph); otherwise the trainer runs
  // forward, the loss on the host (compress::distill_loss) and backward_and_update.
  virtual bool distills_in_step() const { return false; }
  // One training step of the distillation loss with the teacher's logit of each row
  // (batch.rows values, host), `alpha` in [0, 1] and `temperature` > 0. Returns the loss when
  // want_loss, else NaN. Default: not supported (throws).
  virtual double train_step_distill(const io::Batch& batch, const float* teacher_logits,
                                    double alpha, double temperature, double lr_scale,
                                    bool want_loss);
  // Data-parallel steps on the device (the CUDA engine with a reducer set): true when the model
  // trains this rank's part of a global batch with train_step_part; otherwise the trainer runs
  // forward, the loss on the host and backward_and_update with the reducer.
  virtual bool trains_parts_on_device() const { return false; }
  // This rank's `batch` of a global batch of `global_rows` rows: the loss and gradients are of
  // the global batch's mean loss, summed over the ranks inside the step. Returns this rank's
  // share of that loss (the sum over the ranks is the global mean) when want_loss, else NaN.
  // Every rank calls it once per global batch (collectives). Default: not supported (throws).
  virtual double train_step_part(const io::Batch& batch, int64_t global_rows, double lr_scale,
                                 bool want_loss);
  // Sharded embeddings (docs/DISTRIBUTED.md): the fixed-size tables of the model's embedding
  // layer spread over comm's ranks by the planner, their exchanges through comm from the next
  // step on. ids_per_sample[f]: expected ids per sample of categorical feature f (empty: one).
  // The plan is printed to plan_log when not null (rank 0). Every rank calls it (the tables
  // must hold the same values everywhere, as after the same build). Throws when the model
  // cannot (the default: not supported at all).
  virtual void shard_tables(dist::Communicator& comm, const dist::PlannerOptions& options,
                            const std::vector<double>& ids_per_sample, std::FILE* plan_log);
  // A sharded model's whole tables for checkpoints: gather (a collective) puts whole copies of
  // the sharded tables (values and optimizer state) into parameters() and optimizer_state();
  // scatter (not a collective) sets the shards from those copies (after a checkpoint was loaded
  // into them) and drops them; release drops them. No-ops for a model without sharded tables.
  // The CUDA engine (tables on their owner GPUs): gather gives rank 0 host copies of the
  // tables it does not own (streamed from their owners); every rank's parameters() hold the
  // tables it owns, so a checkpoint loads into them directly (docs/DISTRIBUTED.md).
  virtual void gather_sharded_tables() {}
  virtual void scatter_sharded_tables() {}
  virtual void release_sharded_tables() {}

  // Pruning (docs/COMPRESSION.md). The weights a mask may be given to (empty for models that
  // cannot hold masks).
  virtual std::vector<PrunableWeight> prunable_weights() { return {}; }
  // Gives weight `name` the mask `mask` (F32 0/1 of its shape; shared storage, so writing into
  // it later changes the mask) and zeroes the weight where the mask is 0; the optimizer keeps
  // those values zero. The default refuses: masks exist in the CPU engine only.
  virtual void set_mask(const std::string& name, const Tensor& mask);
  // The masks given so far, named "<weight>.mask" (shared storage).
  virtual std::vector<NamedTensor> masks() { return {}; }
  // Serving a compressed export on the CUDA engine: each weight's compressed forms are built
  // once and its kernel chosen per batch size under `policy` (nn/kernel_choice.h). The default
  // refuses (the CPU engine takes masks and INT8 records through prunable_weights()).
  virtual void set_compressed(const std::vector<CompressedWeight>& weights,
                              nn::kernel_choice::Policy policy);
  virtual void set_kernel_policy(nn::kernel_choice::Policy policy);
  // Serving row-wise quantized tables (an export's records, docs/COMPRESSION.md). A layer that
  // reads codes keeps them and releases the table's fp32 values (the CPU embedding layer); any
  // other table (the default, the CUDA engine) gets the codes' values dequantized into its
  // parameter, the same values bit for bit in fp32 memory. Errors name the table: a name that
  // is not a 2-d F32 parameter of the model, a record of another shape, a bad record.
  virtual void set_quantized_tables(std::vector<QuantizedTable> tables);
  // The tables served from codes, by parameter name (the records stay the model's).
  virtual std::vector<std::pair<std::string, const nn::RowQuantRows*>> quantized_tables() {
    return {};
  }
  // One line per compressed layer (its candidates) and per layer and batch size chosen so far
  // (the candidates' times and the choice); empty without compressed layers.
  virtual std::vector<std::string> kernel_report() { return {}; }
  // A model that will only serve from now on (train::Predictor, after loading): the CPU engine
  // packs each fp32 mlp and cross weight without an INT8 record for its own kernels
  // (nn/linear_packed.h: faster than OpenBLAS, and a row's scores independent of the batch it
  // runs in). Nothing for other models, or on a CPU without AVX2. Such a model cannot train any
  // more (its packed copies would go stale): a backward step is an error.
  virtual void prepare_cpu_inference() {}

 private:
  nn::LossKind loss_kind_ = nn::LossKind::Bce;
};

// Builds a model for data of the given layout; parameters initialised from `seed`.
// `precision` ("fp32", "tf32", "bf16") selects the arithmetic of CUDA models
// (train.precision); CPU models compute in fp32 and accept only "fp32". `deterministic`
// (train.deterministic): CUDA models choose their GEMM algorithms without timing them.
std::unique_ptr<Model> build_model(const ModelConfig& model, const OptimizerConfig& opt,
                                   const io::ShardLayout& layout, Device device, uint64_t seed,
                                   const std::string& precision = "fp32",
                                   bool deterministic = false);

}  // namespace dlrec::model
