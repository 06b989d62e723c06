// Data-parallel training over a communicator (docs/DISTRIBUTED.md): the gradient reducer the
// trainer gives the model, and the row pieces of a global batch.
#pragma once

#include <cstdint>
#include <vector>

#include "dlrec/dist/communicator.h"
#include "dlrec/model/model.h"

namespace dlrec::train {

// Dense gradients: packed into buckets of up to kBucketFloats values, each summed by one
// all_reduce. Sparse table gradients: every rank's ids and rows gathered (all_gather_v) and
// merged in rank order, so every replica applies the same update.
class DataParallelReducer final : public model::GradientReducer {
 public:
  // `gpu`: the NCCL communicator over the same ranks, for models that run the step on their
  // GPU (they exchange through it inside the step; `comm` carries the per-step counts).
  explicit DataParallelReducer(dist::Communicator& comm, dist::Communicator* gpu = nullptr)
      : comm_(comm), gpu_(gpu) {}
  void reduce_dense(const std::vector<Tensor*>& grads) override;
  void reduce_sparse(const nn::SparseGrad& local, nn::SparseGrad& merged) override;
  dist::Communicator* device_communicator() override { return gpu_; }
  dist::Communicator* host_communicator() override { return gpu_ ? &comm_ : nullptr; }
  static constexpr int64_t kBucketFloats = 1 << 20;  // 4 MB

 private:
  dist::Communicator& comm_;
  dist::Communicator* gpu_ = nullptr;
  std::vector<float> bucket_, values_;
  std::vector<int64_t> ids_;
};

// The rows [begin, end) of part `part` of a global batch of `global_rows` rows, when full
// global batches have `per_part * parts` rows (io::ShardLoader's parts).
struct RowPiece {
  int64_t begin = 0, end = 0;
};
RowPiece batch_piece(int64_t global_rows, int64_t per_part, int part, int parts);

}  // namespace dlrec::train
