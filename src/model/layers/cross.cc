// Layer "cross": DCNv2's cross network over one input x0 (nn::CrossNet), full or low rank;
// parameters "<name>.<l>.w.weight", "<name>.<l>.w.bias" and low rank "<name>.<l>.v.weight".
#include "dlrec/nn/cross.h"

#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

class CrossNode final : public cpu_graph::Node {
 public:
  CrossNode(const std::string& name, int64_t in, int64_t layers, int64_t rank, uint64_t seed)
      : name_(name), cross_(in, layers, rank) {
    cross_.init(seed);
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    return cross_.forward(*in[0]);
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    const Tensor& dx = cross_.backward(dout);
    if (need[0]) dins[0] = dx;
  }
  void collect(std::vector<cpu_graph::DenseRef>& dense,
               std::vector<cpu_graph::TableRef>&) override {
    for (auto& p : cross_.params())
      dense.push_back({name_ + "." + p.first, p.second, dense_opt, dense_lr});
  }

 private:
  std::string name_;
  nn::CrossNet cross_;
};

// x_{l+1} = x0 * (W_l x_l + b_l) + x_l; low rank: W_l = U_l V_l (V without bias).
std::string cross_to_onnx(OnnxEmit& e) {
  const std::string x0 = e.inputs[0];
  std::string x = x0;
  for (int64_t l = 0; l < e.spec.num_layers; ++l) {
    const std::string p = e.spec.name + "." + std::to_string(l);
    std::string h = x;
    if (e.spec.low_rank > 0)
      h = onnx_linear(e.g, x, e.g.constant(p + ".v.weight", e.param(p + ".v.weight")), "",
                      p + ".v");
    const std::string u =
        onnx_linear(e.g, h, e.g.constant(p + ".w.weight", e.param(p + ".w.weight")),
                    e.g.constant(p + ".w.bias", e.param(p + ".w.bias")), p + ".u");
    x = e.g.op("Add", {e.g.op("Mul", {x0, u}, p + ".x0u"), x}, p + ".out");
  }
  return x;
}

}  // namespace

const LayerType& cross_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "cross";
    t.arity = 1;
    t.trainable = true;
    t.dense_params = true;
    t.parse = [](ConfigReader& r, LayerSpec& s) {
      s.num_layers = r.get_int_range("num_layers", s.num_layers, 1, 1024);
      s.low_rank = r.get_int_range("low_rank", s.low_rank, 0, 1 << 20);
    };
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>& in, const io::ShardLayout&) {
      if (s.low_rank > in[0].width)
        fail("key 'low_rank': ", s.low_rank, " exceeds the input width ", in[0].width, " of '",
             s.inputs[0], "'");
      return ValueShape{in[0].width, {in[0].width}};
    };
    t.make_cpu = [](cpu_graph::Build& b) {
      return std::make_unique<CrossNode>(b.spec.name, b.in[0].width, b.spec.num_layers,
                                         b.spec.low_rank, b.seed);
    };
    t.cuda_unsupported = [](const CudaQuery& q) { return cuda_compute_type_input(q); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_cross);
    t.to_onnx = cross_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
