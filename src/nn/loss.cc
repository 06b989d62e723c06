#include "dlrec/nn/loss.h"

#include <algorithm>
#include <cmath>

#include "dlrec/core/error.h"
#include "dlrec/nn/param.h"

namespace dlrec::nn {

double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits) {
  if (n <= 0) return 0.0;
  // Serial on purpose: n is a batch (thousands) and a fixed summation order keeps the loss
  // identical on any thread count.
  double sum = 0.0;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double z = logits[i], y = labels[i];
    sum += std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::fabs(z)));
    if (dlogits) {
      const double s = z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
      dlogits[i] = static_cast<float>((s - y) * inv_n);
    }
  }
  return sum * inv_n;
}

double mse(const float* outputs, const float* labels, int64_t n, float* dout) {
  if (n <= 0) return 0.0;
  // Serial, like the BCE: a fixed summation order whatever the thread count.
  double sum = 0.0;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(outputs[i]) - labels[i];
    sum += d * d;
    if (dout) dout[i] = static_cast<float>(2.0 * d * inv_n);
  }
  return sum * inv_n;
}

LossKind parse_loss(const std::string& name) {
  if (name == "bce") return LossKind::Bce;
  if (name == "mse") return LossKind::Mse;
  fail("unknown loss '", name, "' (use \"bce\" or \"mse\")");
}

const char* loss_name(LossKind k) { return k == LossKind::Mse ? "mse" : "bce"; }

double loss_and_grad(LossKind k, const float* outputs, const float* labels, int64_t n,
                     float* dout) {
  return k == LossKind::Mse ? mse(outputs, labels, n, dout)
                            : bce_with_logits(outputs, labels, n, dout);
}

double bce_with_logits(const Tensor& logits, const float* labels, Tensor* dlogits) {
  DLREC_CHECK(logits.dtype() == DType::F32 && !logits.device().is_cuda(),
              "bce_with_logits: expected f32 CPU logits");
  float* dl = nullptr;
  if (dlogits) {
    ensure_buffer(*dlogits, logits.shape());
    dl = dlogits->data<float>();
  }
  return bce_with_logits(logits.data<float>(), labels, logits.numel(), dl);
}

}  // namespace dlrec::nn
