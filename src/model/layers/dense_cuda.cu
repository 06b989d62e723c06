// Layer "dense" on CUDA (src/model/layers/dense.cc): the batch's dense features, in bf16/fp16
// converted with padded rows.
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {
namespace {

class DenseNode final : public Node {
 public:
  void alloc(Engine& e, int64_t cap) override { alloc_value(e, cap); }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    if (is_half(v.dt))
      with_half(v.dt, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        cd::to_half_padded(e.dense, e.B, v.width, static_cast<H*>(v.y.raw()), v.ld, e.st);
      });
    else
      cg::copy_cols(e.dense, cg::Elem::F32, v.width, 0, v.y.raw(), cg::Elem::F32, v.ld, 0, e.B,
                    v.width, false, e.st);
  }
  void backward(Engine&) override {}
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    p.kind = ServingParts::Kind::DenseInput;
    return p;
  }
};

}  // namespace

std::unique_ptr<Node> make_dense(Build& b) {
  b.set_value(b.shape.width, true);
  return std::make_unique<DenseNode>();
}

}  // namespace dlrec::model::gpu_graph
