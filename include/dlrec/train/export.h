// Exported model directory (docs/FORMATS.md, "Exported model directory"):
//   model.json     {"format": "dlrec-model", "version": 1, "config", "layout", "step"}
//   workflow.json  the fitted ETL workflow (raw features -> model inputs)
//   weights.dlrec  tensor file with the model parameters (no optimizer state)
//   model.onnx     with `onnx`: the model as ONNX (onnx_export.h, docs/EXPORT.md), its weights
//                  in model.onnx.data beside it when they exceed 1 GiB or when asked for
// The directory is written under a temporary name and renamed into place, so a reader never
// sees a half-written model. Predictor loads it and scores raw log rows.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dlrec/etl/workflow.h"
#include "dlrec/io/raw_chunk.h"
#include "dlrec/model/model.h"
#include "dlrec/store/embedding_store.h"

namespace dlrec::store {
class GpuCache;  // dlrec/store/gpu_cache.h
}

namespace dlrec::train {

// model.json's "version": 3 when weights.dlrec holds row-wise quantized tables, 2 when it holds
// 2:4 masks or INT8 records (docs/COMPRESSION.md) or the tables are in an embedding store, 1
// otherwise (what builds before them read). A reader accepts kModelFormatOldest ..
// kModelFormatVersion and refuses newer files with a version error.
constexpr int kModelFormatVersion = 3;  // row-wise quantized tables
constexpr int kModelFormatMasks = 2;    // masks, INT8 layers, tables in an embedding store
constexpr int kModelFormatOldest = 1;

// Whether export writes model.onnx too (dlrec export --onnx, --onnx-external-data): no; yes,
// with the weights inside unless they exceed 1 GiB; yes, with the weights in model.onnx.data.
enum class OnnxExport { None, Auto, ExternalData };

// Tiers that export writes the tables into (dlrec export --tiers rocksdb=DIR; docs/EXPORT.md,
// "Tables in RocksDB"). With a RocksDB directory, the fixed tables go there, weights.dlrec
// holds the rest, and model.json's "embedding_store" names the directory (the model's default
// store config).
struct TierExport {
  std::string rocksdb_dir;
  bool any() const { return !rocksdb_dir.empty(); }
  // Parses one --tiers value "rocksdb=DIR" into this.
  void add(const std::string& spec);
};

// Exports the latest checkpoint of `run_dir` (written by dlrec train) with the fitted workflow
// of its dataset. `out_dir` must not exist unless `overwrite`.
void export_model(const std::string& run_dir, const std::string& out_dir, bool overwrite = false,
                  OnnxExport onnx = OnnxExport::None, const TierExport& tiers = {});
// An untrained model (parameters initialised from `seed` as training would start) for the
// config and an ETL output's layout and workflow: for load tests and serving benchmarks of
// full-size models without a training run.
void export_initialized(const std::string& config_path, const std::string& data_dir,
                        const std::string& out_dir, uint64_t seed, bool overwrite = false,
                        OnnxExport onnx = OnnxExport::None, const TierExport& tiers = {});

// Exports a model held in memory (dlrec compress --quantize: its INT8 records go into
// weights.dlrec): `config`, `layout` and `step` go into model.json, as export_model writes them.
void export_loaded_model(model::Model& model, const model::RunConfig& config,
                         const io::ShardLayout& layout, int64_t step, const etl::Workflow& wf,
                         const std::string& out_dir, bool overwrite = false);

class Predictor {
 public:
  // On a CUDA device the model computes in `precision` ("fp32", "tf32", "bf16"; see
  // train.precision) and predict(Batch) uses the model's serving path (CUDA graphs per batch
  // bucket, pinned staging).
  // With `store` (or, without it, when model.json names one: a model exported with --tiers),
  // the fixed tables are looked up through the tiered embedding store (CPU models only); the
  // predictions are bit for bit those of the all-in-memory model.
  explicit Predictor(const std::string& model_dir, Device device = Device::cpu(),
                     const std::string& precision = "fp32",
                     const store::StoreConfig* store = nullptr);
  ~Predictor();
  const etl::Workflow& workflow() const;
  const model::RunConfig& config() const;
  // Probabilities for raw rows (the workflow is applied first); for a model trained with
  // train.loss "mse", the predicted values.
  std::vector<float> predict(const io::RawChunk& raw);
  // Probabilities for already-encoded rows.
  std::vector<float> predict(const io::Batch& batch);
  Device device() const;
  // The embedding store the tables are looked up in; null for an all-in-memory model.
  store::EmbeddingStore* store();
  // The GPU cache tier above it (a GPU model with a store); null otherwise.
  store::GpuCache* gpu_cache();
  // Compressed exports on a CUDA device (docs/COMPRESSION.md): how each compressed layer picks
  // its kernel ("fastest": timed per batch size, "compressed", "dense"), and the report of the
  // candidates and choices made so far (empty for other models).
  void set_kernel_policy(const std::string& policy);
  std::vector<std::string> kernel_report();
  // A CUDA model's breakdown of predict() on one chunk of `batch` (CudaModel::serving_breakdown;
  // `dlrec bench infer --breakdown`); empty for other models and behind the GPU cache.
  std::vector<std::string> serving_breakdown(const io::Batch& batch, int reps);
  // What each tier and the model will hold in memory (dlrec predict --plan), one line each.
  std::string memory_plan();
  // Parses raw text lines (as in the logs, the schema's format) and scores them; `source`
  // names the input in errors. Lines are scored in batches of `batch_rows`.
  std::vector<float> predict_lines(const std::vector<std::string>& lines,
                                   const std::string& source, int64_t batch_rows = 4096);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::train
