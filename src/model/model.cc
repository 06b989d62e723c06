#include "dlrec/model/model.h"

#include "dlrec/nn/loss.h"

namespace dlrec::model {

double Model::train_step(const io::Batch& batch, double lr_scale, bool /*want_loss*/) {
  // The loss is the CPU reference's BCE; for a model on a GPU the logits come over and
  // dL/dlogits goes back (a few KB per step).
  Tensor logits = forward(batch, true).to(Device::cpu());
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows,
              "train_step: the batch has ", batch.labels.size(), " labels for ", batch.rows,
              " rows");
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const double loss = nn::bce_with_logits(logits.data<float>(), batch.labels.data(), batch.rows,
                                          dlogits.data<float>());
  if (device().is_cuda()) dlogits = dlogits.to(device());
  backward_and_update(dlogits, lr_scale);
  return loss;
}

}  // namespace dlrec::model
