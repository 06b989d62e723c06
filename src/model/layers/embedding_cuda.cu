// Layer "embedding" on CUDA (src/model/layers/embedding.cc).
#include "model/layers/graph_cuda_engine.h"
#include "model/layers/table_set_cuda.h"

namespace dlrec::model::gpu_graph {
namespace {

// The embedding layer. Hashed (`hashed` non-empty: one table's options per feature): before
// the pooling, the batch's keys are resolved to rows on the device (graph_hashed_cuda.h), which
// overwrites the step's row array; an evaluation forward pools with keys no table holds as zeros.
//
// Direct (write_into(): a concat is its only consumer, see GraphCuda::plan_direct_embedding):
// the pooled rows are written straight into the concat's columns [col, col + T * dim) (its
// row stride and type), and the backward reads its gradient from the same columns of the
// concat's gradient (bf16/f16 widened on load), so the layer has no buffers of its own and the
// concat neither copies nor splits it.
class EmbeddingNode final : public Node {
 public:
  EmbeddingNode(Engine& e, const std::string& name, const io::ShardLayout& layout, int64_t dim,
                bool mean, uint64_t seed, std::vector<hashed_cuda::TableOptions> hashed = {})
      : name_(name), mean_(mean), ts_(e, layout, dim, false, seed, capacities(hashed)) {
    if (hashed.empty()) return;
    hashed_ = std::make_unique<hashed_cuda::HashedTables>(std::move(hashed), dim, e.emb_adagrad,
                                                          e.emb_init_acc, e.dev, e.st);
    hashed_->bind(ts_.tab);
  }
  void alloc(Engine& e, int64_t cap) override {
    if (into_ < 0) alloc_value(e, cap);
  }
  void alloc_scratch(Engine& e, int64_t max_nnz) override {
    ts_.alloc_scratch(e, max_nnz);
    if (hashed_) hashed_->alloc(max_nnz);
  }
  void write_into(int into, int64_t col) override {
    into_ = into;
    col_ = col;
  }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    if (hashed_) {
      // The step's row array belongs to this step's inputs; only table layers read it, and a
      // hashed embedding layer is the only one (the constructor refuses a wide layer beside it).
      uint32_t* rows = const_cast<uint32_t*>(e.keys);
      hashed_->resolve(e.offsets, rows, e.B, e.nnz, e.st);
      if (!hashed_->training()) {
        if (v.dt == DType::BF16)
          hashed_->pool_eval(e.offsets, rows, e.B, mean_, static_cast<bf16*>(v.y.raw()), e.st);
        else
          hashed_->pool_eval(e.offsets, rows, e.B, mean_, v.y.data<float>(), e.st);
        return;
      }
    }
    // Direct: the concat's columns (same type: checked by the plan), else our own rows.
    const Value& o = into_ >= 0 ? e.vals[into_] : v;
    const int64_t col = into_ >= 0 ? col_ : 0;
    if (is_half(o.dt))
      with_half(o.dt, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, static_cast<H*>(o.y.raw()) + col,
                    e.st, o.ld);
      });
    else
      ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, o.y.data<float>() + col, e.st, o.ld);
  }
  // The id work now; the update now, or in fp16 once every gradient is checked (Engine::update;
  // the gradient read stays untouched until then).
  void backward(Engine& e) override {
    ts_.ids(e);
    const Value& c = into_ >= 0 ? e.vals[into_] : e.vals[self];
    e.check_grad(c.g.raw(), c.gdt, e.B * c.ld);
    e.update([this, &e] {
      if (into_ < 0) {
        ts_.apply(e, mean_, e.vals[self].g.data<float>(), e.vals[self].ld);
        return;
      }
      const Value& c = e.vals[into_];
      if (is_half(c.gdt))
        with_half(c.gdt, [&](auto* h) {
          using H = std::remove_pointer_t<decltype(h)>;
          ts_.apply(e, mean_, static_cast<const H*>(c.g.raw()) + col_, c.ld);
        });
      else
        ts_.apply(e, mean_, c.g.data<float>() + col_, c.ld);
    }, true);
  }
  void collect(Engine&, std::vector<NamedState>&, std::vector<NamedState>& tables) override {
    ts_.collect(name_, tables);
  }
  const std::vector<uint32_t>& row_base() const { return ts_.row_base; }
  hashed_cuda::HashedTables* hashed() const override { return hashed_.get(); }
  const std::string& layer_name() const override { return name_; }
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    // The fused forward gathers fixed tables' rows (in direct mode into the concat's columns,
    // where the program form places this value too; the DLRM kernel never sees direct mode).
    if (hashed_) return p;
    p.kind = ServingParts::Kind::Embedding;
    p.tables = &ts_.tab;
    return p;
  }

 private:
  static std::vector<int64_t> capacities(const std::vector<hashed_cuda::TableOptions>& h) {
    std::vector<int64_t> c;
    for (const auto& o : h) c.push_back(o.capacity);
    return c;
  }
  std::string name_;
  bool mean_;
  TableSet ts_;
  std::unique_ptr<hashed_cuda::HashedTables> hashed_;
  int into_ = -1;    // direct: the concat value written into (else -1)
  int64_t col_ = 0;  // and the first of its columns
};

}  // namespace

std::unique_ptr<Node> make_embedding(Build& b) {
  const LayerSpec& s = b.spec;
  const int64_t T = static_cast<int64_t>(b.layout.cardinalities.size());
  // One width for all tables (LayerType::cuda_unsupported refused others).
  const int64_t dim = b.shape.fields.at(0);
  b.set_value(T * dim, false);
  b.v.fields.assign(T, dim);
  b.v.gdt = DType::F32;
  // Hashed: the CPU layer's table options (graph_model.cc): capacity clamped to the feature's
  // cardinality, seed per feature, init_scale or sqrt(1 / capacity).
  std::vector<hashed_cuda::TableOptions> hashed;
  if (s.hashed.on)
    for (int64_t f = 0; f < T; ++f) {
      hashed_cuda::TableOptions o;
      o.name = s.name + "." + std::to_string(f);
      o.capacity = std::min<int64_t>(s.hashed.capacity, b.layout.cardinalities[f]);
      o.seed = nn::derive_seed(b.seed, static_cast<uint64_t>(f));
      o.init_scale = static_cast<float>(s.hashed.init_scale >= 0
                                            ? s.hashed.init_scale
                                            : std::sqrt(1.0 / static_cast<double>(o.capacity)));
      hashed.push_back(std::move(o));
    }
  auto node = std::make_unique<EmbeddingNode>(b.e, s.name, b.layout, dim,
                                              nn::parse_pooling(s.pooling) == nn::Pooling::Mean,
                                              b.seed, std::move(hashed));
  b.embedding = node.get();
  b.row_base = &node->row_base();
  return node;
}

}  // namespace dlrec::model::gpu_graph
