// Layer "output": the model's logit; its input must be 1 wide. Exactly one per graph
// (GraphSpec::parse finds it by LayerType::is_output).
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

class OutputNode final : public cpu_graph::Node {
 public:
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    return *in[0];
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    if (need[0]) dins[0] = dout;
  }
};

// The logit is its input (the exporter adds the sigmoid).
std::string output_to_onnx(OnnxEmit& e) { return e.inputs[0]; }

}  // namespace

const LayerType& output_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "output";
    t.arity = 1;
    t.is_output = true;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>& in, const io::ShardLayout&) {
      if (in[0].width != 1)
        fail("key '", s.input_key, "': the output must be one logit per sample, but '", s.inputs[0],
             "' is ", in[0].width, " wide (end it with a layer of size 1)");
      return ValueShape{1, {1}};
    };
    t.make_cpu = [](cpu_graph::Build&) { return std::make_unique<OutputNode>(); };
    t.cuda_unsupported = [](const CudaQuery&) { return std::string(); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_output);
    t.to_onnx = output_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
