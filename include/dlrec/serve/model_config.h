// Per-model serving configuration: <repo>/<model>/config.json (optional; docs/SERVING.md).
//   {"version_policy": {"latest": {"num_versions": 1}} | {"all": {}} |
//                      {"specific": {"versions": [1, 3]}},
//    "max_batch_size": 65536,
//    "dynamic_batching": {"preferred_batch_size": [4096], "max_queue_delay_microseconds": 200,
//                         "max_queue_size": 1024},
//    "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
//    "precision": "bf16",
//    "embedding_store": {"host": {"bytes": 1073741824}, "rocksdb": {"path": "tables"}}}
// Names follow Triton's model configuration where the meaning is the same. Unknown keys are
// errors naming the nearest valid key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/store/embedding_store.h"

namespace dlrec::serve {

struct VersionPolicy {
  enum class Kind { Latest, All, Specific };
  Kind kind = Kind::Latest;
  int64_t num_versions = 1;       // Latest
  std::vector<int64_t> versions;  // Specific
  // The versions to serve out of those present on disk (ascending).
  std::vector<int64_t> select(std::vector<int64_t> available) const;
};

struct BatchingConfig {
  // Rows one request may carry and rows one merged execution may hold.
  int64_t max_batch_size = 65536;
  // A merged batch executes as soon as it reaches the largest preferred size (rows); empty:
  // max_batch_size.
  std::vector<int64_t> preferred_batch_size;
  // How long the first queued request waits for others to merge with.
  int64_t max_queue_delay_us = 100;
  // Queued requests beyond this are rejected (overload: HTTP 429 / RESOURCE_EXHAUSTED).
  int64_t max_queue_size = 1024;
  int64_t preferred_rows() const;
};

// Where a version runs: `count` instances (each a copy of the model and a worker taking
// merged batches from the version's queue), on the CPU or on the listed GPUs (round robin).
struct InstanceGroup {
  bool gpu = false;            // "KIND_CPU" (default) | "KIND_GPU"
  int64_t count = 1;
  std::vector<int64_t> gpus;   // KIND_GPU: device indices (default [0])
  std::string precision = "fp32";  // GPU arithmetic: fp32 | tf32 | bf16 (dlrec extension)
  // "embedding_store" (dlrec extension; docs/SERVING.md, "Tiered embedding store"): the tables
  // are looked up through these tiers (CPU instances). Null: model.json's store, if any, else
  // the tables in memory.
  std::shared_ptr<const store::StoreConfig> store;
};

struct ModelConfig {
  VersionPolicy version_policy;
  BatchingConfig batching;
  InstanceGroup instances;
  // Reads config.json's object; `defaults` supplies the batching values it leaves out.
  // `model_dir` (<repo>/<model>) resolves the relative paths of "embedding_store".
  static ModelConfig from_json(const json& j, const BatchingConfig& defaults,
                               const std::string& model_dir = "");
};

// Model names are one path component: non-empty, at most 255 bytes, no '/', '\\' or NUL, not
// "." or "..", and no control characters. Returns an empty string when valid, else the reason.
std::string model_name_problem(const std::string& name);
// Throws RequestError(InvalidArgument) when the name is not valid.
void check_model_name(const std::string& name);

}  // namespace dlrec::serve
