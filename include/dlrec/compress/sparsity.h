// 2:4 structured sparsity for the engine's mlp and cross weights (docs/COMPRESSION.md).
//
// The config section (validated by CompressConfig::from_json):
//
//   "compress": {"sparsity": {
//       "pattern": "2:4",                  // the only pattern
//       "layers": "all_dense" | ["top", "cross"],   // graph layer names (mlp or cross)
//       "skip_incompatible": false,        // true: weights whose input size is not a multiple
//                                          // of 4 stay dense (reported); false: an error
//       "schedule": {"start_step": 0, "end_step": 1000, "every": 100}}}   // optional
//
// A mask is an F32 0/1 tensor beside its weight [out, in] (nn::Param::mask): in every group of
// 4 consecutive values of a row (along the reduction dimension `in`), at most 2 are kept. With
// a schedule, training ramps the sparsity from 0 at start_step to 50 % at end_step (cubic, as
// Zhu & Gupta's gradual pruning), recomputing the masks from the weights' magnitudes every
// `every` steps, and keeps the masks fixed from end_step on. Without one, training prunes once
// to 2:4 before its first step unless the model already holds masks (from a checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/compress/embedding_quant.h"
#include "dlrec/compress/qat.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/core/config.h"
#include "dlrec/core/tensor.h"
#include "dlrec/model/model.h"

namespace dlrec::compress {

struct SparsitySchedule {
  bool on = false;
  int64_t start_step = 0;
  int64_t end_step = 0;  // > start_step
  int64_t every = 1;     // > 0
  // The sparsity wanted before step `step` (0-based): 0 before start_step, 0.5 from end_step
  // on, 0.5 * (1 - (1 - f)^3) between, f = (step - start_step) / (end_step - start_step).
  double target(int64_t step) const;
  // Whether the masks are recomputed before step `step`.
  bool update_at(int64_t step) const;
};

struct SparsityConfig {
  bool on = false;
  bool all_dense = true;
  std::vector<std::string> layers;  // when !all_dense
  bool skip_incompatible = false;
  SparsitySchedule schedule;
  json to_json() const;
};

struct CompressConfig {
  SparsityConfig sparsity;
  QuantizeConfig quantize;  // "quantize": INT8 PTQ, run by `dlrec compress --quantize`
  QatConfig qat;            // "qat": quantization-aware training (CPU engine)
  DistillConfig distill;    // "distill": the dense teacher of a training run
  EmbeddingQuantConfig embeddings;  // "embeddings": row-wise int8/int4 tables (dlrec compress)
  // `section` is RunConfig::compress (null: nothing compressed). Unknown keys and bad values
  // are errors naming the key ("compress.sparsity.schedule.every: ...").
  static CompressConfig from_json(const json& section);
  json to_json() const;
};

// The 2:4 mask of a weight [rows, cols] (cols a multiple of 4) at `sparsity` in [0, 0.5]:
// every group of 4 values of a row offers its 2 smallest |w| (ties: the later index first) as
// candidates; the round(sparsity * numel) smallest candidates (by |w|, then index) are pruned.
// At 0.5 every candidate is: exactly 2 zeros per group, the 2 largest |w| kept. Returns the
// number of zeros in `mask` (F32 0/1, written in place; same shape as `weight`).
int64_t compute_mask_2_4(const Tensor& weight, double sparsity, Tensor& mask);

// What one prune did to one weight.
struct PruneReport {
  std::string layer, weight;
  int64_t numel = 0;
  int64_t zeroed = 0;   // mask zeros (0 for a skipped weight)
  std::string skipped;  // why the weight stayed dense ("" when pruned)
};

// Masks the selected weights of a model. Construction validates the config against the model:
// unknown layer names, layers that are not mlp or cross, input sizes not a multiple of 4
// (unless skip_incompatible) and models without prunable weights are errors.
class Pruner {
 public:
  Pruner(const SparsityConfig& config, model::Model& model);
  // Recomputes every selected weight's mask at `sparsity` from its current magnitudes.
  std::vector<PruneReport> prune(double sparsity);
  // The training hook, called before step `step` (0-based); prints a line when it prunes.
  void before_step(int64_t step);
  const std::vector<PruneReport>& skipped() const { return skipped_; }

 private:
  SparsityConfig config_;
  model::Model& model_;
  std::vector<model::PrunableWeight> targets_;  // which weights (prune() reads their values anew)
  std::vector<PruneReport> skipped_;
  bool started_ = false;
};

// A Pruner for a run config's "compress" section, or null when it prunes nothing.
std::unique_ptr<Pruner> make_pruner(const model::RunConfig& config, model::Model& model);

// Masks in tensor files (checkpoints, exported weights): the names of the masked weights go in
// the file's meta under "masks"; the tensors are "<weight>.mask".
// The names to record, from model.masks().
json mask_names(model::Model& model);
// Gives the model an (all-ones) mask for each weight named in `meta["masks"]` (absent: none, a
// file from before masks), so that loading the file fills them. `path` names the file in errors.
void prepare_masks(const json& meta, const std::string& path, model::Model& model);
// After loading: every mask holds only 0 and 1 (else an error naming the file and tensor), and
// the weights are zero where their masks are.
void apply_loaded_masks(const std::string& path, model::Model& model);

}  // namespace dlrec::compress
