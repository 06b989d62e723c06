// Model repository: <root>/<model>/<version>/ with each version a `dlrec export` directory and
// an optional <root>/<model>/config.json (model_config.h). Versions are positive integers.
//
// A loaded model is a set of ServedModel versions behind a shared_ptr: load() builds the new set
// completely, then swaps it in; requests already running keep the version they started with,
// and the old set is released when the last of them finishes (no request is dropped).
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlrec/serve/batcher.h"
#include "dlrec/serve/inference.h"
#include "dlrec/serve/model_config.h"
#include "dlrec/serve/stats.h"
#include "dlrec/train/export.h"

namespace dlrec::serve {

struct TensorInfo {
  std::string name, datatype;
  std::vector<int64_t> shape;  // -1: variable
};

// One loaded model version: the predictor, its fitted workflow and its batcher.
class ServedModel {
 public:
  ServedModel(std::string name, int64_t version, const std::string& dir,
              const BatchingConfig& batching, std::shared_ptr<ModelStats> stats,
              const InstanceGroup& instances = InstanceGroup());
  ~ServedModel();

  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  std::string version_str() const { return std::to_string(version_); }
  const BatchingConfig& batching() const { return batching_; }
  ModelStats& stats() { return *stats_; }

  // Raw inputs (one per schema column) as advertised in the model metadata, and the encoded
  // alternative ("dense", "cat_<t>").
  std::vector<TensorInfo> raw_inputs() const;
  std::vector<TensorInfo> encoded_inputs() const;
  std::vector<TensorInfo> outputs() const;

  // Validates the request's tensors and encodes them into model inputs (applies the fitted
  // workflow to raw features). Throws RequestError(InvalidArgument) with the reason.
  io::Batch encode(const InferRequest& req) const;
  // encode into `batch`, reusing its buffers (its previous contents are replaced; on an error
  // it is left in a state the next encode_into overwrites).
  void encode_into(const InferRequest& req, io::Batch& batch) const;
  // Where encode_into(req, batch) reads an encoded input from when its data already lies there:
  // for "dense" (FP32) and "cat_<t>" (INT64) of `bytes` bytes matching their shape, the batch's
  // own buffer for it (resized, as encode_into would), else null. A front end that must copy a
  // tensor anyway (gRPC: one that spans transport slices) copies it there and points the
  // input's data at it; encode_into then checks it in place (no second copy).
  char* input_buffer(io::Batch& batch, const InputTensor& t, size_t bytes) const;
  // encode + dynamic batching + scoring; updates the statistics (success or failure).
  InferResponse infer(const InferRequest& req);

  // Called once per infer_async request: `response` set and `error` null, or `error` set (a
  // RequestError or what the model threw) and `response` null. The response may be moved from.
  using InferDone = std::function<void(InferResponse* response, std::exception_ptr error)>;
  // infer without waiting: validates and encodes `req` on this thread (`req` may be released
  // when the call returns), then submits it to the batcher (DynamicBatcher::submit; a request
  // of fewer than `inline_max_rows` rows may be scored on this thread). `done` runs on the
  // thread that scored the request, or on this one before infer_async returns (invalid request,
  // queue full, inline scoring). The statistics are those of infer(). The caller keeps this
  // model alive until `done` has run, and `done` must not drop the last reference to it (the
  // model's destructor joins the worker that runs `done`). With `reuse` the request is encoded
  // into *reuse (encode_into: no allocation when it served a request of as many rows before)
  // and scored from there: the caller keeps *reuse untouched until `done` has run.
  void infer_async(const InferRequest& req, InferDone done, int64_t inline_max_rows = INT64_MAX,
                   io::Batch* reuse = nullptr);

 private:
  std::string name_;
  int64_t version_;
  BatchingConfig batching_;
  std::shared_ptr<ModelStats> stats_;
  std::unique_ptr<train::Predictor> predictor_;  // instance 0 (also the workflow's owner)
  std::vector<std::unique_ptr<train::Predictor>> more_;  // instances 1..count-1
  io::ShardLayout layout_;
  // Raw-contract input names: schema column -> dense index (>= 0) or ~categorical index.
  std::unordered_map<std::string, int> raw_col_;
  std::unique_ptr<DynamicBatcher> batcher_;
};

struct RepositoryEntry {
  std::string name, version, state, reason;  // state: READY | UNAVAILABLE
};

class ModelRepository {
 public:
  ModelRepository(std::string root, BatchingConfig defaults, std::shared_ptr<StatsRegistry> stats);
  ~ModelRepository();

  const std::string& root() const { return root_; }
  // Model directories present on disk (valid names only), sorted.
  std::vector<std::string> models_on_disk() const;
  // Loads every model on disk; failures are recorded (index() shows them) and returned as
  // "name: reason" lines, not thrown.
  std::vector<std::string> load_all();
  // (Re)loads one model per its config.json and version policy. Throws RequestError: NotFound
  // if the directory is absent, InvalidArgument for a bad name, config or model.
  void load(const std::string& name);
  // Unloads; requests in flight finish on their versions, and until they have (and the
  // versions are destroyed, at most 60 s) the model answers Unavailable, not NotFound. Returns
  // then. Not loaded: nothing to do; not in the repository: NotFound.
  void unload(const std::string& name);

  // The version to serve: `version` empty means the highest loaded. NotFound when the model or
  // version is not loaded; InvalidArgument for a malformed name or version.
  std::shared_ptr<ServedModel> get(const std::string& name, const std::string& version) const;
  bool ready(const std::string& name, const std::string& version) const;
  std::vector<int64_t> loaded_versions(const std::string& name) const;
  std::vector<RepositoryEntry> index(bool ready_only = false) const;

 private:
  using VersionMap = std::map<int64_t, std::shared_ptr<ServedModel>>;
  std::string root_;
  BatchingConfig defaults_;
  std::shared_ptr<StatsRegistry> stats_;
  std::mutex load_mu_;        // one load/unload at a time
  mutable std::mutex mu_;     // guards models_ and failures_
  std::map<std::string, std::shared_ptr<const VersionMap>> models_;
  std::map<std::string, std::string> failures_;  // last load error per model
  std::set<std::string> unloading_;              // unload() waits for their versions to go
};

}  // namespace dlrec::serve
