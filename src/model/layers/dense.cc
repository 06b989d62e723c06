// Layer "dense": the batch's dense features, [B, num_dense], one field.
#include <cstring>

#include "dlrec/nn/param.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

class DenseNode final : public cpu_graph::Node {
 public:
  const Tensor& forward(const std::vector<const Tensor*>&, const io::Batch& b, bool) override {
    nn::ensure_buffer(out_, {b.rows, shape.width});
    if (b.rows * shape.width > 0)
      std::memcpy(out_.data<float>(), b.dense.data(), b.rows * shape.width * sizeof(float));
    return out_;
  }
  void backward(const Tensor&, const std::vector<bool>&, std::vector<Tensor>&) override {}

 private:
  Tensor out_;
};

// The batch's dense features are the graph's input "dense".
std::string dense_to_onnx(OnnxEmit& e) { return e.dense(); }

}  // namespace

const LayerType& dense_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "dense";
    t.arity = 0;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec&, const std::vector<ValueShape>&, const io::ShardLayout& l) {
      if (l.num_dense <= 0) fail("the data has no dense features");
      return ValueShape{l.num_dense, {l.num_dense}};
    };
    t.make_cpu = [](cpu_graph::Build&) { return std::make_unique<DenseNode>(); };
    t.cuda_unsupported = [](const CudaQuery&) { return std::string(); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_dense);
    t.to_onnx = dense_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
