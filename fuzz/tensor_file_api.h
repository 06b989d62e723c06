// The tensor-file functions the fuzz target and the seed generator call. The format is moving
// from train:: (dlrec/train/tensor_file.h) to io:: (dlrec/io/tensor_file.h, with load options);
// this header takes whichever the tree has, so that fuzz/ builds before and after that change.
// Once only the io:: header exists, call it directly and remove this file.
#pragma once

#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/model/model.h"

#if __has_include("dlrec/io/tensor_file.h")
#include "dlrec/io/tensor_file.h"
namespace dlrec::fuzz {
inline json read_tensor_meta(const std::string& path) { return io::read_tensor_meta(path); }
inline void save_tensors(const std::string& path, const std::vector<model::NamedTensor>& t,
                         const json& meta) {
  io::save_tensors(path, t, meta);
}
inline json load_tensors_allow_extra(const std::string& path,
                                     const std::vector<model::NamedTensor>& targets) {
  io::TensorLoadOptions o;
  o.allow_extra = true;
  return io::load_tensors(path, targets, o);
}
}  // namespace dlrec::fuzz
#else
#include "dlrec/train/tensor_file.h"
namespace dlrec::fuzz {
inline json read_tensor_meta(const std::string& path) { return train::read_tensor_meta(path); }
inline void save_tensors(const std::string& path, const std::vector<model::NamedTensor>& t,
                         const json& meta) {
  train::save_tensors(path, t, meta);
}
inline json load_tensors_allow_extra(const std::string& path,
                                     const std::vector<model::NamedTensor>& targets) {
  return train::load_tensors(path, targets, true);
}
}  // namespace dlrec::fuzz
#endif
