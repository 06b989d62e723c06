// Layer "concat": the inputs side by side, their fields kept.
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

class ConcatNode final : public cpu_graph::Node {
 public:
  explicit ConcatNode(const std::vector<ValueShape>& in) {
    for (const auto& s : in) widths_.push_back(s.width);
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    cpu_graph::concat_cols(in, out_);
    return out_;
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    cpu_graph::split_cols(dout, widths_, need, bufs_, dins);
  }

 private:
  std::vector<int64_t> widths_;
  Tensor out_;
  std::vector<Tensor> bufs_;
};

std::string concat_to_onnx(OnnxEmit& e) { return onnx_concat(e.g, e.inputs, e.spec.name); }

}  // namespace

const LayerType& concat_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "concat";
    t.arity = -1;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec&, const std::vector<ValueShape>& in, const io::ShardLayout&) {
      ValueShape out;
      for (const auto& s : in) {
        out.width += s.width;
        out.fields.insert(out.fields.end(), s.fields.begin(), s.fields.end());
      }
      return out;
    };
    t.make_cpu = [](cpu_graph::Build& b) { return std::make_unique<ConcatNode>(b.in); };
    t.cuda_unsupported = [](const CudaQuery&) { return std::string(); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_concat);
    t.to_onnx = concat_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
