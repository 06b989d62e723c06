// Trainer: the training loop over a dataset produced by `dlrec etl`, with evaluation,
// progress and resumable checkpoints.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlrec/dist/communicator.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/model.h"
#include "dlrec/train/metrics.h"

namespace dlrec::train {

struct TrainerOptions {
  std::string data_dir;  // holds dataset.json and the shards
  std::string run_dir;   // checkpoints: <run_dir>/checkpoint.dlrec (latest), run.json
  bool resume = false;   // continue from <run_dir>/checkpoint.dlrec when it exists
  // Stops this process after this many steps without a final checkpoint, as a crash would
  // (used by tests of resumption). -1: off.
  int64_t stop_after_steps = -1;
  // Set by another thread (the Python package, when a progress callback raised): training
  // stops at the next step boundary as stop_after_steps does (stopped_early; no final
  // checkpoint or evaluation). Not owned; null: never. Single process only (with several ranks,
  // each would stop at a different step).
  const std::atomic<bool>* cancel = nullptr;
  // Data-parallel rank: with rank >= 0, train on rank `rank` of `ranks` only (its shards from
  // <data_dir>/ranks.json, io::load_rank_shards). -1: every training shard.
  int rank = -1, ranks = 1;
  // Data-parallel training across the communicator's ranks (docs/DISTRIBUTED.md) when it has
  // more than one: global batch = train.batch_size x ranks, read in the order of one process
  // with that batch; gradients summed over the ranks; exact evaluation over all validation
  // rows; rank 0 alone prints progress and writes run.json and checkpoints. Not owned.
  dist::Communicator* comm = nullptr;
  // A model on a GPU trains data-parallel through an NCCL communicator that the trainer makes
  // over comm's ranks (one GPU per rank); its collectives time out after this many seconds.
  double comm_timeout_seconds = 300;
  // When set, rank 0 appends one JSON line per logged step ({"step": S, "loss": L}) and one for
  // the final evaluation ({"step": S, "auc": A, "logloss": L, "rows": N}) to this file.
  std::string metrics_log;
};

struct TrainResult {
  int64_t steps = 0;       // total steps done (including before a resume)
  int64_t samples = 0;     // samples processed by this process
  double seconds = 0;      // wall time of this process's training loop
  double last_loss = 0;    // mean training loss over the last logging window
  bool stopped_early = false;
  EvalResult eval;         // final evaluation (rows == 0 when there is no validation split)
  std::vector<std::pair<int64_t, double>> logged_losses;  // (step, mean loss) per log window
};

class Trainer {
 public:
  Trainer(model::RunConfig config, TrainerOptions options);
  ~Trainer();
  TrainResult train();
  // Evaluates on the validation shards; fills `probs` (in row order) when given.
  EvalResult evaluate(std::vector<float>* probs = nullptr);
  model::Model& model();
  int64_t step() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The dataset directory of a training run, from its run.json (`run`). dlrec writes it as an
// absolute path; a run.json of an older dlrec holds it relative to the directory training ran
// in, which is looked for as given (relative to the current directory) and then relative to
// the run directory's parent; neither holding a dataset.json is an error naming both.
std::string run_data_dir(const std::string& run_dir, const json& run);

// A run's run.json and its config; errors name the file. Its data directory: run_data_dir.
struct RunInfo {
  json run;
  model::RunConfig config;
};
RunInfo load_run_info(const std::string& run_dir);

// Runs `model` over the shards and computes AUC/logloss; probabilities in row order.
EvalResult evaluate_shards(model::Model& model, const std::vector<std::string>& shards,
                           int64_t batch_size, std::vector<float>* probs = nullptr);

// Checkpoint = tensor file with the parameters, optimizer state and the training position.
struct CheckpointState {
  int64_t step = 0;
  int64_t position = 0;  // training rows consumed since the start (across epochs)
  // The data layout the checkpoint was trained on (absent in a meta without "layout").
  std::optional<io::ShardLayout> layout;
};
void save_checkpoint(const std::string& path, model::Model& model, const model::RunConfig& config,
                     const io::ShardLayout& layout, const CheckpointState& state);
// allow_extra_tensors: tensors of the file the model does not hold are skipped (a GPU of a
// sharded run loads the tables it owns).
CheckpointState load_checkpoint(const std::string& path, model::Model& model,
                                bool allow_extra_tensors = false);
// Throws unless the checkpoint at `path` (state `st`) was trained on `data_layout` (the layout
// of the dataset in `data_dir`): tensor shapes alone do not tell, e.g., a multi-hot flag apart.
void check_checkpoint_layout(const std::string& path, const CheckpointState& st,
                             const io::ShardLayout& data_layout, const std::string& data_dir);

}  // namespace dlrec::train
