// The tensor file: named tensors plus a JSON header, checksummed, written atomically.
// Checkpoints and exported weights use it (docs/FORMATS.md, "Tensor file").
#pragma once

#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/model/model.h"

namespace dlrec::train {

// Writes `tensors` (any device; copied to the host) and `meta` to `path` atomically.
void save_tensors(const std::string& path, const std::vector<model::NamedTensor>& tensors,
                  const json& meta);

// Reads the header of a tensor file (validates magic, version, size and checksum).
json read_tensor_meta(const std::string& path);

// Loads the file into `targets`: every target name must be present with the same shape and
// dtype (copy_from into the target's storage); extra tensors in the file are an error unless
// `allow_extra`. Returns the file's meta.
json load_tensors(const std::string& path, const std::vector<model::NamedTensor>& targets,
                  bool allow_extra = false);

}  // namespace dlrec::train
