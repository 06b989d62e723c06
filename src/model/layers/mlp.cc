// Layer "mlp": nn::MLP over one input, ReLU between layers (after the last with relu_last);
// parameters "<name>.<k>.weight" [out, in] and "<name>.<k>.bias", DLRM's initialisation.
#include "dlrec/nn/mlp.h"

#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

class MlpNode final : public cpu_graph::Node {
 public:
  MlpNode(const std::string& name, int64_t in, const std::vector<int64_t>& sizes, bool relu_last,
          uint64_t seed)
      : name_(name), mlp_(in, sizes, relu_last) {
    mlp_.init(seed);
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    return mlp_.forward(*in[0]);
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    const Tensor& dx = mlp_.backward(dout, need[0]);
    if (need[0]) dins[0] = dx;
  }
  void collect(std::vector<cpu_graph::DenseRef>& dense,
               std::vector<cpu_graph::TableRef>&) override {
    for (size_t k = 0; k < mlp_.layers().size(); ++k) {
      auto& l = mlp_.layers()[k];
      dense.push_back(
          {name_ + "." + std::to_string(k) + ".weight", &l.weight(), dense_opt, dense_lr});
      dense.push_back({name_ + "." + std::to_string(k) + ".bias", &l.bias(), dense_opt, dense_lr});
    }
  }

 private:
  std::string name_;
  nn::MLP mlp_;
};

// Gemm (x W^T + b) per layer, Relu between them (and after the last with relu_last).
std::string mlp_to_onnx(OnnxEmit& e) {
  std::string x = e.inputs[0];
  const size_t n = e.spec.sizes.size();
  for (size_t k = 0; k < n; ++k) {
    const std::string p = e.spec.name + "." + std::to_string(k);
    x = onnx_linear(e.g, x, e.g.constant(p + ".weight", e.param(p + ".weight")),
                    e.g.constant(p + ".bias", e.param(p + ".bias")), p + ".linear");
    if (k + 1 < n || e.spec.relu_last) x = e.g.op("Relu", {x}, p + ".relu");
  }
  return x;
}

}  // namespace

const LayerType& mlp_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "mlp";
    t.arity = 1;
    t.trainable = true;
    t.dense_params = true;
    t.parse = [](ConfigReader& r, LayerSpec& s) {
      s.sizes = read_int_list(r, "sizes", 1, 1 << 20, false);
      s.relu_last = r.get<bool>("relu_last", false);
    };
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>&, const io::ShardLayout&) {
      return ValueShape{s.sizes.back(), {s.sizes.back()}};
    };
    t.make_cpu = [](cpu_graph::Build& b) {
      return std::make_unique<MlpNode>(b.spec.name, b.in[0].width, b.spec.sizes, b.spec.relu_last,
                                       b.seed);
    };
    t.cuda_unsupported = [](const CudaQuery& q) {
      std::string why = cuda_compute_type_input(q);
      if (!why.empty()) return why;
      if (q.precision == "bf16" || q.precision == "fp16")
        for (size_t k = 0; k + 1 < q.spec.sizes.size(); ++k)
          if (q.spec.sizes[k] == 1)
            return "key 'sizes': in " + q.precision +
                   " precision hidden layers need more than one unit";
      return std::string();
    };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_mlp);
    t.to_onnx = mlp_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
