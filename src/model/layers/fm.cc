// Layer "fm": the factorization machine's second-order term over the inputs' fields (one
// width), [B, 1] (nn::FactorizationMachine).
#include "dlrec/nn/fm.h"

#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

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

// 0.5 * sum_k ((sum_i v_ik)^2 - sum_i v_ik^2) over the n vectors [N, n, d].
std::string fm_to_onnx(OnnxEmit& e) {
  const auto nd = interaction_fields(e.spec, e.in, "");
  const std::string& name = e.spec.name;
  const std::string x = onnx_concat(e.g, e.inputs, name + ".v");
  const std::string v =
      e.g.op("Reshape", {x, e.g.ints(name + ".vshape", {-1, nd.first, nd.second})}, name + ".v3");
  const std::string axis1 = e.g.ints(name + ".axis1", {1});
  const auto sum1 = [&](const std::string& t, const std::string& hint, int64_t keep) {
    return e.g.op("ReduceSum", {t, axis1}, hint, {OnnxAttr::integer("keepdims", keep)});
  };
  const std::string s = sum1(v, name + ".s", 0);
  const std::string q = sum1(e.g.op("Mul", {v, v}, name + ".vv"), name + ".q", 0);
  const std::string diff = e.g.op("Sub", {e.g.op("Mul", {s, s}, name + ".ss"), q}, name + ".diff");
  return e.g.op("Mul", {sum1(diff, name + ".sum", 1), e.g.scalar(name + ".half", 0.5f)}, name);
}

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
    t.to_onnx = fm_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
