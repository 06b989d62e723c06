// Layer "concat" on CUDA (src/model/layers/concat.cc).
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {
namespace {

// Concatenates its inputs' columns. An input that writes its columns itself (`direct`, the
// embedding layer in direct mode) is neither copied forward nor handed its gradient backward
// (it reads it from ours); it is only marked as having one.
class ConcatNode final : public Node {
 public:
  int direct = -1;  // the input value that writes into our columns itself
  bool set_direct_input(int j) override {
    direct = j;
    return true;
  }
  void alloc(Engine& e, int64_t cap) override { alloc_value(e, cap); }
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    p.kind = ServingParts::Kind::Concat;
    return p;
  }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    int64_t c = 0;
    for (int j : in) {
      const Value& x = e.vals[j];
      if (j == direct) {
        c += x.width;
        continue;
      }
      cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, 0, v.y.raw(), elem(v.dt), v.ld, c, e.B, x.width,
                    false, e.st);
      c += x.width;
    }
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    int64_t c = 0;
    for (int j : in) {
      const int64_t w = e.vals[j].width;
      if (e.vals[j].need_grad) {
        const bool acc = e.claim(j);
        if (j != direct) e.deliver(j, v.g.raw(), v.gdt, v.ld, c, 0, w, acc);
      }
      c += w;
    }
  }
};

}  // namespace

std::unique_ptr<Node> make_concat(Build& b) {
  b.set_value(b.shape.width, true);
  b.v.fields = b.shape.fields;
  return std::make_unique<ConcatNode>();
}

}  // namespace dlrec::model::gpu_graph
