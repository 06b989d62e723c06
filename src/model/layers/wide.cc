// Layer "wide": Wide & Deep's linear part over one-hot categorical features (nn::WideLinear):
// b + sum_t pool(w_t[ids of feature t]), [B, 1]. Tables [cardinality, 1] take the embedding
// optimizer (sparse rows), the bias the dense one (or the layer's override, without decay).
#include "dlrec/nn/wide.h"

#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

namespace dlrec::model {
namespace {

using cpu_graph::TableRef;
using cpu_graph::TableSetup;

class WideNode final : public cpu_graph::Node {
 public:
  WideNode(const std::string& name, std::vector<TableSetup> setup, const io::ShardLayout& layout,
           nn::Pooling pooling)
      : name_(name),
        setup_(std::move(setup)),
        features_(features_of(setup_)),
        wide_(cards(features_, layout), pooling) {}
  const Tensor& forward(const std::vector<const Tensor*>&, const io::Batch& b,
                        bool training) override {
    bags_.clear();
    for (int64_t f : features_) bags_.push_back({b.cat_offsets[f].data(), b.cat_indices[f].data()});
    return wide_.forward(bags_, b.rows, training);
  }
  void backward(const Tensor& dout, const std::vector<bool>&, std::vector<Tensor>&) override {
    wide_.backward(dout);
  }
  void step_tables(double lr_scale) override {
    for (size_t k = 0; k < features_.size(); ++k)
      setup_[k].opt->step_sparse(wide_.tables()[k].weight(), wide_.grad(k),
                                 static_cast<float>(setup_[k].lr * lr_scale));
  }
  void collect(std::vector<cpu_graph::DenseRef>& dense, std::vector<TableRef>& tables) override {
    dense.push_back({name_ + ".bias", &wide_.bias(), dense_opt, dense_lr});
    for (size_t k = 0; k < features_.size(); ++k) {
      TableRef t;
      t.name = name_ + "." + std::to_string(features_[k]);
      t.p = &wide_.tables()[k].weight();
      t.opt = setup_[k].opt;
      tables.push_back(std::move(t));
    }
  }

 private:
  static std::vector<int64_t> features_of(const std::vector<TableSetup>& s) {
    std::vector<int64_t> f;
    for (const auto& t : s) f.push_back(t.feature);
    return f;
  }
  static std::vector<int64_t> cards(const std::vector<int64_t>& f, const io::ShardLayout& l) {
    std::vector<int64_t> c;
    for (int64_t x : f) c.push_back(l.cardinalities[x]);
    return c;
  }
  std::string name_;
  std::vector<TableSetup> setup_;
  std::vector<int64_t> features_;
  nn::WideLinear wide_;
  std::vector<nn::Bags> bags_;
};

// b + the sum of each feature's pooled 1-wide table.
std::string wide_to_onnx(OnnxEmit& e) {
  std::vector<std::string> parts;
  for (int64_t f : table_features(e.spec, e.layout)) parts.push_back(onnx_table_lookup(e, f, 1));
  parts.push_back(e.g.constant(e.spec.name + ".bias", e.param(e.spec.name + ".bias")));
  return e.g.op("Sum", parts, e.spec.name);
}

}  // namespace

const LayerType& wide_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "wide";
    t.arity = 0;
    t.trainable = true;
    t.table_keys = true;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>&, const io::ShardLayout& l) {
      table_features(s, l);
      return ValueShape{1, {1}};
    };
    t.make_cpu = [](cpu_graph::Build& b) {
      const std::vector<int64_t> f = table_features(b.spec, b.layout);
      return std::make_unique<WideNode>(b.spec.name, b.tables(f, std::vector<int64_t>(f.size(), 1)),
                                        b.layout, nn::parse_pooling(b.spec.pooling));
    };
    t.cuda_unsupported = [](const CudaQuery& q) { return cuda_all_features(q.spec, q.layout); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_wide);
    t.to_onnx = wide_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
