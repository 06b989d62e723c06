// Layer "output" on CUDA (src/model/layers/output.cc).
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {
namespace {

// The logit: the input's value itself (1 wide, f32); its gradient is the model's dlogits.
class OutputNode final : public Node {
 public:
  void alloc(Engine&, int64_t) override {}
  void forward(Engine&) override {}
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    if (!e.vals[in[0]].need_grad) return;
    const bool acc = e.claim(in[0]);
    e.deliver(in[0], v.g.raw(), DType::F32, 1, 0, 0, 1, acc);
  }
};

}  // namespace

std::unique_ptr<Node> make_output(Build& b) {
  b.set_value(1, false);
  return std::make_unique<OutputNode>();
}

}  // namespace dlrec::model::gpu_graph
