// Layer "add": the element-wise sum of inputs of one width (logits of several parts).
#include <cstring>

#include "dlrec/nn/param.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

class AddNode final : public cpu_graph::Node {
 public:
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch& b, bool) override {
    const int64_t n = b.rows * shape.width;
    nn::ensure_buffer(out_, {b.rows, shape.width});
    float* o = out_.data<float>();
    std::memcpy(o, in[0]->data<float>(), n * sizeof(float));
    for (size_t i = 1; i < in.size(); ++i) {
      const float* x = in[i]->data<float>();
      for (int64_t k = 0; k < n; ++k) o[k] += x[k];
    }
    return out_;
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    for (size_t i = 0; i < need.size(); ++i)
      if (need[i]) dins[i] = dout;
  }

 private:
  Tensor out_;
};

std::string add_to_onnx(OnnxEmit& e) {
  if (e.inputs.size() == 1) return e.inputs[0];
  return e.g.op("Sum", e.inputs, e.spec.name);
}

}  // namespace

const LayerType& add_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "add";
    t.arity = -1;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>& in, const io::ShardLayout&) {
      for (size_t k = 1; k < in.size(); ++k)
        if (in[k].width != in[0].width)
          fail("key '", s.input_key, "': add needs inputs of one width, but '", s.inputs[0],
               "' is ", in[0].width, " wide and '", s.inputs[k], "' is ", in[k].width);
      return ValueShape{in[0].width, {in[0].width}};
    };
    t.make_cpu = [](cpu_graph::Build&) { return std::make_unique<AddNode>(); };
    t.cuda_unsupported = [](const CudaQuery&) { return std::string(); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_add);
    t.to_onnx = add_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
