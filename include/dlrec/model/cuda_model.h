// A model whose training step and serving run entirely on its device: the CUDA graph engine
// (include/dlrec/model/graph_cuda.h) builds every architecture on CUDA. Built only when CUDA is
// (DLREC_WITH_CUDA).
#pragma once

#include <string>
#include <vector>

#include "dlrec/model/model.h"

namespace dlrec::model {

// A model whose training step can run entirely on its device.
class CudaModel : public Model {
 public:
  // forward + BCE loss on the device + backward_and_update, all enqueued on the model's stream:
  // no host synchronisation unless want_loss (then the mean loss of the batch is returned;
  // otherwise NaN). The batch may be reused by the caller as soon as the call returns.
  double train_step(const io::Batch& batch, double lr_scale, bool want_loss) override = 0;
  // Waits for all work the model has enqueued.
  void synchronize() override = 0;
  // Serving: probabilities sigmoid(logits) of the batch's rows into `probs` (host memory).
  // Batches with one id per table run as one CUDA graph per power-of-two bucket of rows
  // (pinned staging, copies, forward and sigmoid captured together; rows beyond the batch are
  // padding; bigger batches in chunks, GraphCudaOptions::infer_chunk); others run eagerly.
  // Blocks until done.
  // Not to be called concurrently with itself or with training on the same model.
  virtual void predict(const io::Batch& batch, float* probs) = 0;
  // The stream (a cudaStream_t) predict() runs its device work on: work another component
  // enqueues there before calling predict() (the GPU cache tier's write of a batch's rows)
  // completes before the forward reads, with no host synchronisation. Null: none.
  virtual void* serving_stream() { return nullptr; }
  // Where predict() spends its time on one chunk of `batch` (`dlrec bench infer --breakdown`):
  // lines of host packing, input copy, each layer's (and each dense layer's, with its kernel)
  // device time run eagerly, and the captured graph's time, in ms per chunk over `reps` runs.
  // Call predict() with the batch first (the kernels chosen, the graph captured). Empty where
  // the model has no such path.
  virtual std::vector<std::string> serving_breakdown(const io::Batch& batch, int reps) {
    (void)batch;
    (void)reps;
    return {};
  }
};

}  // namespace dlrec::model
