// The tensor file: named tensors plus a JSON header, checksummed, written atomically.
// Checkpoints, exported weights and hashed-table exports use it (docs/FORMATS.md, "Tensor
// files"). It is a file format like the shards, so it lives in io: any module that stores
// tensors (train, embedding) uses it without depending on the trainer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/core/tensor.h"

namespace dlrec::io {

// The same type as model::NamedTensor: a name and a tensor (shared storage).
using NamedTensor = std::pair<std::string, Tensor>;

// Writes `tensors` (any device; copied to the host) and `meta` to `path` atomically.
void save_tensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                  const json& meta);

// Reads the header of a tensor file. The whole file is verified first (size, end marker,
// checksum), then the header (JSON limits, every tensor's dtype, shape, byte count and offset
// inside the payload, no two tensors overlapping, no name twice).
json read_tensor_meta(const std::string& path);

struct TensorLoadOptions {
  // Tensors in the file that no target names are accepted (otherwise an error).
  bool allow_extra = false;
  // Floating-point tensors must hold finite values only (NaN or infinity: an error naming the
  // tensor and the element). For weights that are served.
  bool require_finite = false;
};

// Loads the file (verified as read_tensor_meta does) into `targets`: every target name must be
// present with the same shape and dtype (copied into the target's storage). Returns the meta.
json load_tensors(const std::string& path, const std::vector<NamedTensor>& targets,
                  const TensorLoadOptions& options = {});

}  // namespace dlrec::io
