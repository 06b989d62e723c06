// Layer "fm": the factorization machine's second-order term over the inputs' fields (one
// width), [B, 1] (nn::FactorizationMachine).
#include "dlrec/nn/fm.h"

#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"

namespace dlrec::model {
namespace {

class FmNode final : public cpu_graph::Node {
 public:
  FmNode(const std::vector<ValueShape>& in, int64_t n, int64_t d) : fm_(n, d) {
    for (const auto& s : in) widths_.push_back(s.width);
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    if (in.size() == 1) return fm_.forward(*in[0]);
    cpu_graph::concat_cols(in, z_);
    return fm_.forward(z_);
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    const Tensor& dv = fm_.backward(dout);
    if (widths_.size() == 1) {
      if (need[0]) dins[0] = dv;
      return;
    }
    cpu_graph::split_cols(dv, widths_, need, bufs_, dins);
  }

 private:
  nn::FactorizationMachine fm_;
  std::vector<int64_t> widths_;
  Tensor z_;
  std::vector<Tensor> bufs_;
};

}  // namespace

const LayerType& fm_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "fm";
    t.arity = -1;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>& in, const io::ShardLayout&) {
      interaction_fields(s, in, "");
      return ValueShape{1, {1}};
    };
    t.make_cpu = [](cpu_graph::Build& b) {
      const auto nd = interaction_fields(b.spec, b.in, "");
      return std::make_unique<FmNode>(b.in, nd.first, nd.second);
    };
    t.cuda_unsupported = [](const CudaQuery& q) { return cuda_compute_type_input(q); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_fm);
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
