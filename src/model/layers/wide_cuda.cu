// Layer "wide" on CUDA (src/model/layers/wide.cc).
#include "model/layers/graph_cuda_engine.h"
#include "model/layers/table_set_cuda.h"

namespace dlrec::model::gpu_graph {
namespace {

// Wide & Deep's linear part over the one-hot categorical features (nn::WideLinear):
// y = b + sum_t w_t[ids of feature t] (pooled), tables [cardinality_t, 1] zero-initialised and
// updated by the embedding optimizer (the fused table update, dim 1), the bias [1] (zero) by
// the dense one. Forward pools the parts [B, T] (f32) and sums them in the CPU's order;
// backward broadcasts dL/dy to every part and sums it for the bias.
class WideNode final : public Node {
 public:
  WideNode(Engine& e, const std::string& name, const io::ShardLayout& layout, bool mean)
      : name_(name), mean_(mean), T_(static_cast<int>(layout.cardinalities.size())),
        ts_(e, layout, 1, true, 0) {
    b_ = e.buf({1}, DType::F32);
    db_ = e.buf({1}, DType::F32);
    sb_ = e.dense_state({1});
  }
  void alloc(Engine& e, int64_t cap) override {
    alloc_value(e, cap);
    parts_ = e.buf({cap, T_}, DType::F32);
    if (e.vals[self].need_grad) dparts_ = e.buf({cap, T_}, DType::F32);
  }
  void alloc_scratch(Engine& e, int64_t max_nnz) override { ts_.alloc_scratch(e, max_nnz); }
  void forward(Engine& e) override {
    ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, parts_.data<float>(), e.st, 0,
                ts_.order_scratch());
    cg::wide_sum(parts_.data<float>(), b_.data<float>(), e.B, T_, e.vals[self].y.data<float>(),
                 e.st);
  }
  void backward(Engine& e) override {
    const float* dy = e.vals[self].g.data<float>();
    cd::mask_bias_grad(dy, nullptr, nullptr, e.partial.data<float>(), db_.data<float>(), e.B, 1,
                       e.st);
    cg::wide_broadcast(dy, e.B, T_, dparts_.data<float>(), e.st);
    e.check_grad(dparts_.raw(), DType::F32, e.B * T_);
    e.check_grad(db_.raw(), DType::F32, 1);
    e.update([this, &e] {
      ts_.update(e, mean_, dparts_.data<float>());
      e.dense_step(b_.data<float>(), db_.data<float>(), sb_, 1, 1, 1, static_cast<bf16*>(nullptr),
                   1, true);
    }, true);
  }
  void collect(Engine&, std::vector<NamedState>& dense, std::vector<NamedState>& tables) override {
    dense.push_back({name_ + ".bias", b_, sb_});
    ts_.collect(name_, tables);
  }
  const std::vector<uint32_t>& row_base() const { return ts_.row_base; }
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    p.kind = ServingParts::Kind::Wide;
    p.tables = &ts_.tab;
    p.bias = b_.data<float>();
    return p;
  }

 private:
  std::string name_;
  bool mean_;
  int T_;
  TableSet ts_;
  Tensor b_, db_, sb_, parts_, dparts_;
};

}  // namespace

std::unique_ptr<Node> make_wide(Build& b) {
  b.set_value(1, false);
  auto node = std::make_unique<WideNode>(b.e, b.spec.name, b.layout,
                                         nn::parse_pooling(b.spec.pooling) == nn::Pooling::Mean);
  b.row_base = &node->row_base();
  return node;
}

}  // namespace dlrec::model::gpu_graph
