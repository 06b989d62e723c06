// 2:4 pruning masks on the CUDA graph engine (docs/COMPRESSION.md, "2:4 masks"): the pruner
// (compress::Pruner) reads host copies of the mlp and cross weights, computes the masks on the
// host and hands each to set_mask, which keeps it (the host tensor: checkpoints save and load
// it), copies it to the device and zeroes the pruned weights there; from then on the layer's
// dense update (cd::optimizer_step) writes 0 wherever the mask is 0, as the CPU's
// Optimizer::step does, so a pruned weight stays exactly zero in f32 and in the 16-bit copy.
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {

std::vector<GraphCuda::WeightLin> GraphCuda::weight_lins() {
  std::vector<WeightLin> out;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    std::vector<std::pair<std::string, Lin*>> v;
    if (nodes_[i]) nodes_[i]->compressible(v);
    for (auto& [name, l] : v) out.push_back({spec_.layers[i].name, name, l});
  }
  return out;
}

std::vector<PrunableWeight> GraphCuda::prunable_weights() {
  DeviceGuard g(dev_index_);
  synchronize();
  check_qat_flags();
  qat_ranges_to_records();
  std::vector<PrunableWeight> out;
  for (const WeightLin& w : weight_lins()) {
    nn::Param& p = shells_[w.name];
    p.value = w.lin->w.to(Device::cpu());
    out.push_back({w.layer, w.name, p.value, &p});
  }
  return out;
}

void GraphCuda::set_mask(const std::string& name, const Tensor& mask) {
  DeviceGuard g(dev_index_);
  Lin* l = nullptr;
  for (const WeightLin& w : weight_lins())
    if (w.name == name) l = w.lin;
  DLREC_CHECK(l, "'", name, "' is not a prunable weight of this model (mlp and cross weights are)");
  DLREC_CHECK(mask.defined() && mask.dtype() == DType::F32 && !mask.device().is_cuda() &&
                  mask.ndim() == 2 && mask.dim(0) == l->out && mask.dim(1) == l->in,
              "the mask of '", name, "' must be an F32 CPU tensor of the weight's shape [", l->out,
              ", ", l->in, "]");
  synchronize();
  host_masks_[name] = mask;
  // A new device buffer changes the update kernels' arguments: the captured steps go.
  if (!l->mask.defined()) {
    l->mask = Tensor::empty({l->out, l->in}, DType::F32, dev_);
    drop_graphs();
  }
  l->mask.copy_from(mask);
  Tensor w = l->w.to(Device::cpu());
  float* v = w.data<float>();
  const float* m = mask.data<float>();
  for (int64_t k = 0; k < mask.numel(); ++k)
    if (m[k] == 0.f) v[k] = 0.f;
  l->w.copy_from(w);          // complete on return (core/device_cuda.cu)
  shadows_stale_ = e_.lowp;  // the next upload brings the 16-bit copies up to date
}

std::vector<NamedTensor> GraphCuda::masks() {
  std::vector<NamedTensor> out;
  for (auto& [name, m] : host_masks_) out.emplace_back(name + ".mask", m);
  return out;
}

}  // namespace dlrec::model::graph_cuda_impl
