// Layer "add" on CUDA (src/model/layers/add.cc).
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {
namespace {

class AddNode final : public Node {
 public:
  void alloc(Engine& e, int64_t cap) override { alloc_value(e, cap); }
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    p.kind = ServingParts::Kind::Add;
    return p;
  }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    for (size_t i = 0; i < in.size(); ++i) {
      const Value& x = e.vals[in[i]];
      cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, 0, v.y.raw(), elem(v.dt), v.ld, 0, e.B, v.width,
                    i > 0, e.st);
    }
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    for (int j : in) {
      if (!e.vals[j].need_grad) continue;
      const bool acc = e.claim(j);
      e.deliver(j, v.g.raw(), v.gdt, v.ld, 0, 0, v.width, acc);
    }
  }
};

}  // namespace

std::unique_ptr<Node> make_add(Build& b) {
  b.set_value(b.shape.width, true);
  return std::make_unique<AddNode>();
}

}  // namespace dlrec::model::gpu_graph
