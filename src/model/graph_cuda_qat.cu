// Quantization-aware training on the CUDA graph engine (docs/COMPRESSION.md, "QAT"). The QAT
// code (compress/qat.h) attaches its records to the weights' parameters as on the CPU engine;
// here those are host shells (GraphCuda::prunable_weights). Before each upload the engine takes
// the records up (attach_qat): a record new to a weight gives its layer a device QAT state
// (nn/qat_cuda.h) starting from the record's running range and decay, a record gone removes it;
// either drops the captured steps. The device's running range goes back into the records
// whenever prunable_weights() hands them out (checkpoints and exports read them there).
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {

void GraphCuda::attach_qat() {
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

}  // namespace dlrec::model::graph_cuda_impl
