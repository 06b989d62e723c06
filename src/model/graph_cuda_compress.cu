// Compression fine-tuning on the CUDA graph engine (docs/COMPRESSION.md): QAT and distillation
// in the training step (the 2:4 masks: graph_cuda_masks.cu).
//
// QAT ("QAT on the GPU"). The QAT
// code (compress/qat.h) attaches its records to the weights' parameters as on the CPU engine;
// here those are host shells (GraphCuda::prunable_weights). Before each upload the engine takes
// the records up (attach_qat): a record new to a weight gives its layer a device QAT state
// (nn/qat_cuda.h) starting from the record's running range and decay, a record gone removes it;
// either drops the captured steps. The device's running range goes back into the records
// whenever prunable_weights() hands them out (checkpoints and exports read them there).
#include "model/graph_cuda_impl.h"

#include <algorithm>
#include <cmath>

namespace dlrec::model::graph_cuda_impl {

void GraphCuda::attach_qat() {
  // Every upload and predict() comes here: a model without QAT records (no shell holds a hook)
  // and without QAT layers returns before building anything.
  if (!qat_on_) {
    bool any = false;
    for (const auto& [name, p] : shells_) any |= p.quant != nullptr;
    if (!any) return;
  }
  bool changed = false;
  for (const WeightLin& w : weight_lins()) {
    auto it = shells_.find(w.name);
    nn::LinearHook* h = it == shells_.end() ? nullptr : it->second.quant.get();
    const nn::LinearHook::QatRange r = h ? h->qat_range() : nn::LinearHook::QatRange{};
    if (h && !r.on)
      fail("graph model on ", dev_.str(), ": weight '", w.name, "' carries a ",
           h->kernel().empty() ? std::string("calibration") : h->kernel(),
           " record; the CUDA engine trains with QAT records only (calibrate and quantize on "
           "the CPU engine)");
    const void* rec = r.on ? h : nullptr;
    QatSeen& seen = qat_seen_[w.name];
    Lin& l = *w.lin;
    if (seen.record == rec && (!rec || seen.decay == r.decay)) continue;
    synchronize();
    // The same record with another decay goes on from the device's range.
    const double amax = rec && seen.record == rec && l.qat ? l.qat->amax(e_.st) : r.amax;
    seen = {rec, r.decay};
    changed = true;
    l.qat.reset();
    if (!rec) continue;
    l.qat = std::make_shared<nn::cuda_qat::QatLayer>(w.name, l.out, l.in, l.in_pad,
                                                     e_.lowp ? e_.half : DType::F32, amax,
                                                     r.decay, e_.st);
    l.qat->reserve(cap_b_);
  }
  if (!changed) return;
  drop_graphs();
  qat_on_ = false;
  for (const WeightLin& w : weight_lins()) qat_on_ |= w.lin->qat != nullptr;
}

void GraphCuda::check_qat_flags() {
  if (!qat_on_) return;
  for (const WeightLin& w : weight_lins()) {
    if (!w.lin->qat) continue;
    const int f = w.lin->qat->take_flags(e_.st);
    if (f & 1)
      fail("QAT: the layer input of '", w.name, "' holds a non-finite value (training "
           "diverged? lower the learning rate)");
    if (f & 2) fail("QAT: weight '", w.name, "' holds a non-finite value (training diverged?)");
    DLREC_CHECK(!(f & 4), "QAT: '", w.name, "' was quantized with a running range it does not "
                "have (bug)");
  }
}

void GraphCuda::qat_ranges_to_records() {
  for (const WeightLin& w : weight_lins()) {
    auto it = shells_.find(w.name);
    if (!w.lin->qat || it == shells_.end() || !it->second.quant ||
        qat_seen_[w.name].record != it->second.quant.get())
      continue;
    it->second.quant->set_qat_range(w.lin->qat->amax(e_.st));
  }
}

// Distillation: the teacher's logits copied to the device, the step's loss kernel
// cd::distill_with_logits (src/nn/distill_cuda.cu) in place of the BCE one (step_body).
double GraphCuda::train_step_distill(const io::Batch& batch, const float* teacher_logits,
                                     double alpha, double temperature, double lr_scale,
                                     bool want_loss) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(!e_.dp.comm, "graph model: distillation steps run on one GPU");
  DLREC_CHECK(alpha >= 0 && alpha <= 1 && temperature > 0 && std::isfinite(temperature),
              "graph model: distillation alpha ", alpha, " must be in [0, 1] and the temperature ",
              temperature, " > 0");
  DLREC_CHECK(loss() == nn::LossKind::Bce, "graph model: distillation needs the BCE loss");
  DLREC_CHECK(teacher_logits || batch.rows == 0, "graph model: no teacher logits");
  loss_rows_ = 0;
  if (teacher_.numel() < std::max<int64_t>(batch.rows, 1)) {
    synchronize();  // the captured steps read the old buffer
    teacher_ = Tensor::empty({std::max<int64_t>(std::max(batch.rows, cap_b_), 1)}, DType::F32,
                             dev_);
    drop_graphs();
  }
  if (alpha != graphs_alpha_ || temperature != graphs_t_) {
    drop_graphs();  // the loss kernel's arguments are in the captured steps
    graphs_alpha_ = alpha;
    graphs_t_ = temperature;
  }
  // Ordered after the previous step on the main stream, before this step's graph.
  if (batch.rows)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(teacher_.raw(), teacher_logits, sizeof(float) * batch.rows,
                                     cudaMemcpyHostToDevice, e_.st));
  distill_alpha_ = alpha;
  distill_t_ = temperature;
  try {
    const double loss = run_train_step(batch, lr_scale, want_loss);
    distill_alpha_ = -1;
    return loss;
  } catch (...) {
    distill_alpha_ = -1;
    throw;
  }
}

}  // namespace dlrec::model::graph_cuda_impl
