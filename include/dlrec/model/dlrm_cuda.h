// The DLRM on a CUDA device: the same parameters (names, shapes, initial values from the same
// seed) as the CPU model, trained with CUDA kernels and cuBLAS. Built only when CUDA is
// (DLREC_WITH_CUDA); build_model() dispatches here for Device::cuda(i).
#pragma once

#include <memory>

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
};

// Throws dlrec::Error when the device is unusable or the configuration is invalid.
std::unique_ptr<CudaModel> make_dlrm_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                          const io::ShardLayout& layout, Device device,
                                          uint64_t seed);

}  // namespace dlrec::model
