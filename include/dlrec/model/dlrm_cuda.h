// The DLRM on a CUDA device: the same parameters (names, shapes, initial values from the same
// seed) as the CPU model, trained with CUDA kernels and cuBLAS. Built only when CUDA is
// (DLREC_WITH_CUDA); build_model() dispatches here for Device::cuda(i).
#pragma once

#include <memory>
#include <string>

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
  // Batches with one id per table and at most 65536 rows run as one CUDA graph per
  // power-of-two bucket of rows (pinned staging, copies, forward and sigmoid captured
  // together; rows beyond the batch are padding); others run eagerly. Blocks until done.
  // Not to be called concurrently with itself or with training on the same model.
  virtual void predict(const io::Batch& batch, float* probs) = 0;
};

// Throws dlrec::Error when the device is unusable or the configuration is invalid.
// precision: "fp32" (parity reference), "tf32" (TF32 GEMMs) or "bf16" (mixed precision with
// f32 master weights and f32 tables; see src/model/dlrm_cuda.cu).
std::unique_ptr<CudaModel> make_dlrm_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                          const io::ShardLayout& layout, Device device,
                                          uint64_t seed, const std::string& precision = "fp32");

}  // namespace dlrec::model
