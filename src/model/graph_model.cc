// The graph model on the CPU: layers from GraphSpec, run in topological order; backward in
// reverse order with gradients summed where a layer's output feeds several consumers. Each
// layer applies the optimizer to its own parameters once its gradients are known.
//
// Optimizers: every parameter has one. Dense parameters take the optimizer section's dense
// optimizer, or their layer's "optimizer" override; tables take the embedding optimizer, their
// layer's override, or their table's ("tables": {"<f>": {"optimizer": ...}}). Global-norm
// clipping covers all dense gradients together whatever their optimizer.
// Hashed tables (embedding::HashedEmbedding) replace fixed ones per table; their state is five
// tensors shared with parameters()/optimizer_state(); after those were handed out (a checkpoint
// load may have written into them) the table is re-imported before its next use.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/thread_pool.h"
#include "dlrec/embedding/hashed_embedding.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/optimizer_factory.h"
#include "dlrec/nn/cross.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/fm.h"
#include "dlrec/nn/interaction.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "dlrec/nn/wide.h"

namespace dlrec::model {
namespace {

// A dense parameter with its optimizer and learning rate (before the schedule).
struct DenseRef {
  std::string name;
  nn::Param* p;
  const nn::Optimizer* opt;
  double lr;
};
// A table: fixed (p) or hashed (h, with the flag that says its tensors were handed out).
struct TableRef {
  std::string name;  // "<layer>.<feature>"
  nn::Param* p = nullptr;
  embedding::HashedEmbedding* h = nullptr;
  bool* handed_out = nullptr;
  const nn::Optimizer* opt = nullptr;  // fixed tables (hashed ones keep theirs)
};
// How one table of an embedding or wide layer is set up.
struct TableSetup {
  int64_t feature = 0, dim = 1;
  const nn::Optimizer* opt = nullptr;
  double lr = 0;
  bool hashed = false;
  embedding::HashedEmbeddingOptions hashed_options;
};

// What a layer outputs: [B, width], made of fields (vectors) of the given widths. Embedding
// layers output one field per table; concat keeps its inputs' fields; the rest output one.
struct Shape2 {
  int64_t width = 0;
  std::vector<int64_t> fields;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Copies each input [B, w_i] side by side into out [B, sum w_i].
void concat_cols(const std::vector<const Tensor*>& in, Tensor& out) {
  const int64_t B = in[0]->dim(0);
  int64_t W = 0;
  for (auto* t : in) W += t->dim(1);
  nn::ensure_buffer(out, {B, W});
  float* o = out.data<float>();
  parallel_for(0, B, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t c = 0;
      for (auto* t : in) {
        const int64_t w = t->dim(1);
        std::memcpy(o + r * W + c, t->data<float>() + r * w, w * sizeof(float));
        c += w;
      }
    }
  });
}

// Copies columns [c0, c0 + w) of src [B, Ws] into dst [B, w].
void slice_cols(const Tensor& src, int64_t c0, int64_t w, Tensor& dst) {
  const int64_t B = src.dim(0), Ws = src.dim(1);
  nn::ensure_buffer(dst, {B, w});
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  parallel_for(0, B, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) std::memcpy(d + r * w, s + r * Ws + c0, w * sizeof(float));
  });
}

// Splits dout [B, sum w_i] into the needed inputs' gradients (buffers owned by the caller).
void split_cols(const Tensor& dout, const std::vector<int64_t>& widths,
                const std::vector<bool>& need, std::vector<Tensor>& bufs,
                std::vector<Tensor>& dins) {
  bufs.resize(widths.size());
  int64_t c = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    if (need[i]) {
      slice_cols(dout, c, widths[i], bufs[i]);
      dins[i] = bufs[i];
    }
    c += widths[i];
  }
}

class Node {
 public:
  virtual ~Node() = default;
  // in: the inputs' outputs. Returns [B, shape.width] (a buffer valid until the next forward).
  virtual const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch& b,
                                bool training) = 0;
  // dout [B, width] -> dins[i] for the inputs with need[i]; the parameters' gradients (dense
  // grads in Param::grad, sparse ones kept by the tables).
  virtual void backward(const Tensor& dout, const std::vector<bool>& need,
                        std::vector<Tensor>& dins) = 0;
  // Applies the tables' optimizers to their rows of the last backward (lr times lr_scale).
  virtual void step_tables(double lr_scale) {}
  // Dense parameters (the model steps them) and tables (step_tables).
  virtual void collect(std::vector<DenseRef>& dense, std::vector<TableRef>& tables) {}
  Shape2 shape;
  // The optimizer of the layer's dense parameters (set by the model after construction).
  const nn::Optimizer* dense_opt = nullptr;
  double dense_lr = 0;
};

class DenseNode final : public Node {
 public:
  explicit DenseNode(int64_t nd) { shape = {nd, {nd}}; }
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

class EmbeddingNode final : public Node {
 public:
  EmbeddingNode(const std::string& name, std::vector<TableSetup> setup,
                const io::ShardLayout& layout, nn::Pooling pooling, uint64_t seed)
      : name_(name), setup_(std::move(setup)) {
    const size_t T = setup_.size();
    fixed_.resize(T);
    hashed_.resize(T);
    handed_out_.reset(new bool[T]());
    for (size_t k = 0; k < T; ++k) {
      const TableSetup& t = setup_[k];
      if (t.hashed) {
        hashed_[k] = std::make_unique<embedding::HashedEmbedding>(t.hashed_options);
      } else {
        fixed_[k] =
            std::make_unique<nn::EmbeddingBag>(layout.cardinalities[t.feature], t.dim, pooling);
        fixed_[k]->init(nn::derive_seed(seed, static_cast<uint64_t>(t.feature)));
      }
      offset_.push_back(shape.width);
      shape.width += t.dim;
      shape.fields.push_back(t.dim);
    }
  }
  const Tensor& forward(const std::vector<const Tensor*>&, const io::Batch& b,
                        bool training) override {
    const int64_t B = b.rows, W = shape.width;
    nn::ensure_buffer(out_, {B, W});
    float* out = out_.data<float>();
    for_each_table([&](size_t k) {
      const int64_t f = setup_[k].feature;
      if (hashed_[k]) {
        refresh(k);
        hashed_[k]->forward(b.cat_offsets[f].data(), b.cat_indices[f].data(), B, out + offset_[k],
                            W, training);
      } else {
        fixed_[k]->forward(b.cat_offsets[f].data(), b.cat_indices[f].data(), B, out + offset_[k], W,
                           training);
      }
    });
    return out_;
  }
  void backward(const Tensor& dout, const std::vector<bool>&, std::vector<Tensor>&) override {
    const float* g = dout.data<float>();
    grads_.resize(setup_.size());
    for_each_table([&](size_t k) {
      grads_[k] = hashed_[k] ? &hashed_[k]->backward(g + offset_[k], shape.width)
                             : &fixed_[k]->backward(g + offset_[k], shape.width);
    });
  }
  void step_tables(double lr_scale) override {
    for_each_table([&](size_t k) {
      const float lr = static_cast<float>(setup_[k].lr * lr_scale);
      if (hashed_[k])
        hashed_[k]->apply(*grads_[k], lr);
      else
        setup_[k].opt->step_sparse(fixed_[k]->weight(), *grads_[k], lr);
    });
  }
  void collect(std::vector<DenseRef>&, std::vector<TableRef>& tables) override {
    for (size_t k = 0; k < setup_.size(); ++k) {
      TableRef t;
      t.name = name_ + "." + std::to_string(setup_[k].feature);
      if (hashed_[k]) {
        t.h = hashed_[k].get();
        t.handed_out = &handed_out_[k];
      } else {
        t.p = &fixed_[k]->weight();
        t.opt = setup_[k].opt;
      }
      tables.push_back(std::move(t));
    }
  }

 private:
  // A hashed table whose tensors were handed out is rebuilt from them before its next use.
  // A state that fails the checks leaves the table empty, its tensors saying so.
  void refresh(size_t k) {
    if (!handed_out_[k]) return;
    handed_out_[k] = false;
    try {
      hashed_[k]->import_tensors("hashed table '" + name_ + "." +
                                 std::to_string(setup_[k].feature) + "'");
    } catch (...) {
      hashed_[k]->tensors();
      throw;
    }
  }
  // Across tables when there are enough to keep the threads busy (each table's own loops then
  // run serially), else table by table with the tables' own parallel loops.
  template <class F>
  void for_each_table(F&& fn) {
    const int64_t T = static_cast<int64_t>(setup_.size());
    if (T >= num_threads()) {
      parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) fn(static_cast<size_t>(t));
      });
    } else {
      for (int64_t t = 0; t < T; ++t) fn(static_cast<size_t>(t));
    }
  }

  std::string name_;
  std::vector<TableSetup> setup_;
  std::vector<int64_t> offset_;
  std::vector<std::unique_ptr<nn::EmbeddingBag>> fixed_;
  std::vector<std::unique_ptr<embedding::HashedEmbedding>> hashed_;
  std::unique_ptr<bool[]> handed_out_;
  std::vector<const nn::SparseGrad*> grads_;
  Tensor out_;
};

class WideNode final : public Node {
 public:
  WideNode(const std::string& name, std::vector<TableSetup> setup, const io::ShardLayout& layout,
           nn::Pooling pooling)
      : name_(name),
        setup_(std::move(setup)),
        features_(features_of(setup_)),
        wide_(cards(features_, layout), pooling) {
    shape = {1, {1}};
  }
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
  void collect(std::vector<DenseRef>& dense, std::vector<TableRef>& tables) override {
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

class MlpNode final : public Node {
 public:
  MlpNode(const std::string& name, int64_t in, const std::vector<int64_t>& sizes, bool relu_last,
          uint64_t seed)
      : name_(name), mlp_(in, sizes, relu_last) {
    mlp_.init(seed);
    shape = {mlp_.out_features(), {mlp_.out_features()}};
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    return mlp_.forward(*in[0]);
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    const Tensor& dx = mlp_.backward(dout, need[0]);
    if (need[0]) dins[0] = dx;
  }
  void collect(std::vector<DenseRef>& dense, std::vector<TableRef>&) override {
    for (size_t k = 0; k < mlp_.layers().size(); ++k) {
      auto& l = mlp_.layers()[k];
      dense.push_back(
          {name_ + "." + std::to_string(k) + ".weight", &l.weight(), dense_opt, dense_lr});
      dense.push_back({name_ + "." + std::to_string(k) + ".bias", &l.bias(), dense_opt, dense_lr});
    }
  }

 private:
  std::string name_;
  nn::MLP mlp_;
};

class CrossNode final : public Node {
 public:
  CrossNode(const std::string& name, int64_t in, int64_t layers, int64_t rank, uint64_t seed)
      : name_(name), cross_(in, layers, rank) {
    cross_.init(seed);
    shape = {in, {in}};
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    return cross_.forward(*in[0]);
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    const Tensor& dx = cross_.backward(dout);
    if (need[0]) dins[0] = dx;
  }
  void collect(std::vector<DenseRef>& dense, std::vector<TableRef>&) override {
    for (auto& p : cross_.params())
      dense.push_back({name_ + "." + p.first, p.second, dense_opt, dense_lr});
  }

 private:
  std::string name_;
  nn::CrossNet cross_;
};

class ConcatNode final : public Node {
 public:
  explicit ConcatNode(const std::vector<Shape2>& in) {
    for (const auto& s : in) {
      widths_.push_back(s.width);
      shape.width += s.width;
      shape.fields.insert(shape.fields.end(), s.fields.begin(), s.fields.end());
    }
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    concat_cols(in, out_);
    return out_;
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    split_cols(dout, widths_, need, bufs_, dins);
  }

 private:
  std::vector<int64_t> widths_;
  Tensor out_;
  std::vector<Tensor> bufs_;
};

// DLRM's dot interaction over all fields of the inputs (n vectors of width d): the first vector
// followed by the n(n-1)/2 pairwise dot products (nn::DotInteraction).
class DotNode final : public Node {
 public:
  DotNode(const std::vector<Shape2>& in, int64_t n, int64_t d) : n_(n), d_(d), dot_(n - 1, d) {
    for (const auto& s : in) widths_.push_back(s.width);
    // Inputs [one field of d, then anything]: no copies (the DLRM layout).
    direct_ = in.size() == 2 && in[0].width == d;
    shape = {dot_.out_features(), {dot_.out_features()}};
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch& b, bool) override {
    const int64_t B = b.rows;
    if (direct_) return dot_.forward(*in[0], in[1]->reshape({B, n_ - 1, d_}));
    concat_cols(in, z_);
    slice_cols(z_, 0, d_, first_);
    slice_cols(z_, d_, (n_ - 1) * d_, rest_);
    return dot_.forward(first_, rest_.reshape({B, n_ - 1, d_}));
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    dot_.backward(dout);
    const int64_t B = dout.dim(0);
    if (direct_) {
      if (need[0]) dins[0] = dot_.grad_dense();
      if (need[1]) dins[1] = dot_.grad_emb().reshape({B, (n_ - 1) * d_});
      return;
    }
    concat_cols({&dot_.grad_dense(), &rest_grad(B)}, dz_);
    split_cols(dz_, widths_, need, bufs_, dins);
  }

 private:
  const Tensor& rest_grad(int64_t B) {
    flat_ = dot_.grad_emb().reshape({B, (n_ - 1) * d_});
    return flat_;
  }
  int64_t n_, d_;
  nn::DotInteraction dot_;
  std::vector<int64_t> widths_;
  bool direct_;
  Tensor z_, first_, rest_, dz_, flat_;
  std::vector<Tensor> bufs_;
};

class FmNode final : public Node {
 public:
  FmNode(const std::vector<Shape2>& in, int64_t n, int64_t d) : fm_(n, d) {
    for (const auto& s : in) widths_.push_back(s.width);
    shape = {1, {1}};
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    if (in.size() == 1) return fm_.forward(*in[0]);
    concat_cols(in, z_);
    return fm_.forward(z_);
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    const Tensor& dv = fm_.backward(dout);
    if (widths_.size() == 1) {
      if (need[0]) dins[0] = dv;
      return;
    }
    split_cols(dv, widths_, need, bufs_, dins);
  }

 private:
  nn::FactorizationMachine fm_;
  std::vector<int64_t> widths_;
  Tensor z_;
  std::vector<Tensor> bufs_;
};

class AddNode final : public Node {
 public:
  explicit AddNode(int64_t width) { shape = {width, {width}}; }
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

class OutputNode final : public Node {
 public:
  OutputNode() { shape = {1, {1}}; }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch&, bool) override {
    return *in[0];
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    if (need[0]) dins[0] = dout;
  }
};

std::string fields_str(const Shape2& s) {
  std::string out;
  for (size_t i = 0; i < s.fields.size() && i < 8; ++i)
    out += (i ? ", " : "") + std::to_string(s.fields[i]);
  if (s.fields.size() > 8) out += ", ...";
  return "[" + out + "]";
}

class GraphModel final : public Model {
 public:
  GraphModel(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
             uint64_t seed);
  Tensor forward(const io::Batch& batch, bool training) override;
  void backward_and_update(const Tensor& dlogits, double lr_scale) override;
  std::vector<NamedTensor> parameters() override;
  std::vector<NamedTensor> optimizer_state() override;
  Device device() const override { return Device::cpu(); }

 private:
  std::unique_ptr<Node> make_node(const LayerSpec& s, const std::vector<Shape2>& in, uint64_t seed);
  // The tables of an embedding or wide layer: features, widths, optimizers, hashed or fixed.
  std::vector<TableSetup> table_setup(const LayerSpec& s, const std::vector<int64_t>& features,
                                      const std::vector<int64_t>& dims, uint64_t seed);
  // Keeps an optimizer alive for the model's lifetime (stable address).
  const nn::Optimizer* keep(const OptimizerConfig& c, bool dense);
  void check_batch(const io::Batch& b) const;
  // A "[hashed]" line per hashed table on stderr (when they were used since the last one).
  void report_hashed();

  OptimizerConfig oc_;
  io::ShardLayout layout_;
  GraphSpec spec_;
  std::deque<nn::Optimizer> opts_;  // [0]: dense, [1]: embedding (the section's), then overrides
  std::vector<std::unique_ptr<Node>> nodes_;  // by layer index
  std::vector<std::vector<int>> inputs_;
  std::vector<bool> need_grad_;   // the layer's output gradient leads to parameters
  std::vector<DenseRef> dense_;   // in layer order
  std::vector<TableRef> tables_;  // in layer order
  std::vector<nn::Param*> dense_ptrs_;
  int64_t hashed_reported_lookups_ = 0;
  std::vector<Tensor> outs_, grads_, acc_;
  std::vector<bool> has_grad_, owns_grad_;
  int64_t fwd_rows_ = 0;
  bool have_training_forward_ = false;
};

GraphModel::GraphModel(const ModelConfig& mc, const OptimizerConfig& oc,
                       const io::ShardLayout& layout, uint64_t seed)
    : oc_(oc), layout_(layout), spec_(GraphSpec::parse(mc.layers, "model.layers")) {
  opts_.push_back(make_dense_optimizer(oc));
  opts_.push_back(make_embedding_optimizer(oc));
  const size_t n = spec_.layers.size();
  nodes_.resize(n);
  inputs_.resize(n);
  need_grad_.assign(n, false);
  for (int i : spec_.order) {
    const LayerSpec& s = spec_.layers[i];
    std::vector<Shape2> in;
    inputs_[i] = s.input_ids;
    for (int j : s.input_ids) in.push_back(nodes_[j]->shape);
    const uint64_t tag = s.has_init_tag ? s.init_tag : fnv1a(s.name);
    try {
      nodes_[i] = make_node(s, in, nn::derive_seed(seed, tag));
      // The dense parameters' optimizer: the layer's override, or the section's (the wide
      // part's bias follows the wide layer's override, without weight decay).
      nodes_[i]->dense_opt = &opts_[0];
      nodes_[i]->dense_lr = dense_lr(oc_);
      if (!s.optimizer.is_null()) {
        const bool dense = s.type == "mlp" || s.type == "cross";
        const OptimizerConfig c =
            layer_optimizer(dense ? oc_ : oc_.embedding_config(), s.optimizer, "optimizer", dense);
        nodes_[i]->dense_opt = keep(c, dense);
        nodes_[i]->dense_lr = c.lr;
      }
    } catch (const Error& e) {
      fail(s.where, ": ", e.what());
    }
    std::vector<DenseRef> dense;
    std::vector<TableRef> tables;
    nodes_[i]->collect(dense, tables);
    bool need = !dense.empty() || !tables.empty();
    for (int j : inputs_[i]) need = need || need_grad_[j];
    need_grad_[i] = need;
  }
  // Parameters in the order the layers are listed.
  for (size_t i = 0; i < n; ++i) nodes_[i]->collect(dense_, tables_);
  for (auto& d : dense_) {
    d.opt->init_state(*d.p);
    dense_ptrs_.push_back(d.p);
  }
  for (auto& t : tables_)
    if (t.p) t.opt->init_state(*t.p);
  outs_.resize(n);
  grads_.resize(n);
  acc_.resize(n);
  has_grad_.assign(n, false);
  owns_grad_.assign(n, false);
}

const nn::Optimizer* GraphModel::keep(const OptimizerConfig& c, bool dense) {
  opts_.push_back(dense ? make_dense_optimizer(c) : make_embedding_optimizer(c));
  return &opts_.back();
}

std::vector<TableSetup> GraphModel::table_setup(const LayerSpec& s,
                                                const std::vector<int64_t>& features,
                                                const std::vector<int64_t>& dims, uint64_t seed) {
  for (const auto& kv : s.tables)
    if (std::find(features.begin(), features.end(), kv.first) == features.end())
      fail("key 'tables': feature ", kv.first, " is not one of the layer's ", features.size(),
           " features");
  const OptimizerConfig layer_cfg =
      s.optimizer.is_null()
          ? oc_.embedding_config()
          : layer_optimizer(oc_.embedding_config(), s.optimizer, "optimizer", false);
  const nn::Optimizer* layer_opt = s.optimizer.is_null() ? &opts_[1] : keep(layer_cfg, false);
  std::vector<TableSetup> out;
  for (size_t k = 0; k < features.size(); ++k) {
    const int64_t f = features[k];
    TableSetup t;
    t.feature = f;
    t.dim = dims[k];
    t.opt = layer_opt;
    t.lr = layer_cfg.lr;
    auto it = s.tables.find(f);
    const HashedSpec* h = s.hashed.on ? &s.hashed : nullptr;
    if (it != s.tables.end()) {
      if (!it->second.optimizer.is_null()) {
        const std::string key = "tables." + std::to_string(f) + ".optimizer";
        const OptimizerConfig c = layer_optimizer(layer_cfg, it->second.optimizer, key, false);
        t.opt = keep(c, false);
        t.lr = c.lr;
      }
      if (it->second.hashed.on) h = &it->second.hashed;
    }
    if (h) {
      // More rows than the feature has ids would never fill: the capacity is clamped.
      const int64_t cap = std::min<int64_t>(h->capacity, layout_.cardinalities[f]);
      embedding::HashedEmbeddingOptions& o = t.hashed_options;
      t.hashed = true;
      o.dim = t.dim;
      o.capacity = cap;
      o.seed = nn::derive_seed(seed, static_cast<uint64_t>(f));
      o.init_scale = static_cast<float>(
          h->init_scale >= 0 ? h->init_scale : std::sqrt(1.0 / static_cast<double>(cap)));
      o.pooling = nn::parse_pooling(s.pooling);
      o.optimizer = t.opt->options();
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::unique_ptr<Node> GraphModel::make_node(const LayerSpec& s, const std::vector<Shape2>& in,
                                            uint64_t seed) {
  const int64_t T = static_cast<int64_t>(layout_.cardinalities.size());
  auto features = [&]() {
    std::vector<int64_t> f;
    if (s.all_features) {
      for (int64_t t = 0; t < T; ++t) f.push_back(t);
      if (f.empty()) fail("the data has no categorical features");
    } else {
      for (int64_t x : s.features)
        if (x >= T)
          fail("key 'features': feature ", x, " does not exist (the data has ", T,
               " categorical features, 0 .. ", T - 1, ")");
      f = s.features;
    }
    for (int64_t x : f)
      if (layout_.cardinalities[x] <= 0)
        fail("key 'features': categorical feature ", x, " has cardinality ",
             layout_.cardinalities[x], "; every table needs rows");
    return f;
  };
  const std::string& t = s.type;
  if (t == "dense") {
    if (layout_.num_dense <= 0) fail("the data has no dense features");
    return std::make_unique<DenseNode>(layout_.num_dense);
  }
  if (t == "embedding") {
    std::vector<int64_t> f = features();
    std::vector<int64_t> dims = s.dims.empty() ? std::vector<int64_t>(f.size(), s.dim) : s.dims;
    if (dims.size() != f.size())
      fail("key 'dims': ", dims.size(), " widths for ", f.size(), " features");
    return std::make_unique<EmbeddingNode>(s.name, table_setup(s, f, dims, seed), layout_,
                                           nn::parse_pooling(s.pooling), seed);
  }
  if (t == "wide") {
    std::vector<int64_t> f = features();
    return std::make_unique<WideNode>(s.name,
                                      table_setup(s, f, std::vector<int64_t>(f.size(), 1), seed),
                                      layout_, nn::parse_pooling(s.pooling));
  }
  if (t == "mlp") return std::make_unique<MlpNode>(s.name, in[0].width, s.sizes, s.relu_last, seed);
  if (t == "cross") {
    if (s.low_rank > in[0].width)
      fail("key 'low_rank': ", s.low_rank, " exceeds the input width ", in[0].width, " of '",
           s.inputs[0], "'");
    return std::make_unique<CrossNode>(s.name, in[0].width, s.num_layers, s.low_rank, seed);
  }
  if (t == "concat") return std::make_unique<ConcatNode>(in);
  if (t == "dot" || t == "fm") {
    int64_t nf = 0;
    const int64_t d = in[0].fields.at(0);
    for (size_t k = 0; k < in.size(); ++k)
      for (int64_t w : in[k].fields) {
        if (w != d)
          fail("key '", s.input_key, "': the ", t, " interaction needs vectors of one width, but '",
               s.inputs[0], "' starts with width ", d, " and '", s.inputs[k],
               "' has vectors of widths ", fields_str(in[k]),
               t == "dot" ? " (make the MLP's last size equal the embedding dim)" : "");
        ++nf;
      }
    if (nf < 2)
      fail("key '", s.input_key, "': the ", t,
           " interaction needs at least 2 vectors, its inputs give ", nf);
    if (t == "dot") return std::make_unique<DotNode>(in, nf, d);
    return std::make_unique<FmNode>(in, nf, d);
  }
  if (t == "add") {
    for (size_t k = 1; k < in.size(); ++k)
      if (in[k].width != in[0].width)
        fail("key '", s.input_key, "': add needs inputs of one width, but '", s.inputs[0], "' is ",
             in[0].width, " wide and '", s.inputs[k], "' is ", in[k].width);
    return std::make_unique<AddNode>(in[0].width);
  }
  if (t == "output") {
    if (in[0].width != 1)
      fail("key '", s.input_key, "': the output must be one logit per sample, but '", s.inputs[0],
           "' is ", in[0].width, " wide (end it with a layer of size 1)");
    return std::make_unique<OutputNode>();
  }
  fail("unknown layer type '", t, "'");
}

void GraphModel::check_batch(const io::Batch& b) const {
  const int64_t T = static_cast<int64_t>(layout_.cardinalities.size());
  DLREC_CHECK(b.rows >= 0, "graph model: negative batch size");
  DLREC_CHECK(b.num_dense == layout_.num_dense, "graph model: the batch has ", b.num_dense,
              " dense features, the model was built for ", layout_.num_dense);
  DLREC_CHECK(b.num_cat() == T && static_cast<int64_t>(b.cat_indices.size()) == T,
              "graph model: the batch has ", b.num_cat(),
              " categorical features, the model was built for ", T);
  DLREC_CHECK(static_cast<int64_t>(b.dense.size()) == b.rows * b.num_dense,
              "graph model: the batch has ", b.dense.size(), " dense values for ", b.rows,
              " rows x ", b.num_dense, " features");
  for (int64_t t = 0; t < T; ++t) {
    const auto& off = b.cat_offsets[t];
    DLREC_CHECK(static_cast<int64_t>(off.size()) == b.rows + 1, "graph model: categorical feature ",
                t, " has ", off.size(), " offsets for ", b.rows, " rows");
    DLREC_CHECK(off.front() >= 0 && off.back() <= static_cast<int64_t>(b.cat_indices[t].size()),
                "graph model: categorical feature ", t, ": offsets do not fit its ",
                b.cat_indices[t].size(), " ids");
  }
}

Tensor GraphModel::forward(const io::Batch& batch, bool training) {
  check_batch(batch);
  have_training_forward_ = false;
  nn::use_single_threaded_blas();
  std::vector<const Tensor*> in;
  for (int i : spec_.order) {
    in.clear();
    for (int j : inputs_[i]) in.push_back(&outs_[j]);
    // A handle on the layer's buffer: valid until the layer's next forward.
    outs_[i] = nodes_[i]->forward(in, batch, training);
  }
  fwd_rows_ = batch.rows;
  have_training_forward_ = training;
  return outs_[spec_.output].reshape({batch.rows}).clone();
}

void GraphModel::backward_and_update(const Tensor& dlogits, double lr_scale) {
  DLREC_CHECK(have_training_forward_,
              "graph model: backward_and_update needs a forward(batch, training = true) before it");
  DLREC_CHECK(
      dlogits.dtype() == DType::F32 && !dlogits.device().is_cuda() && dlogits.numel() == fwd_rows_,
      "graph model: dlogits must be f32 on the CPU with ", fwd_rows_, " values, got ",
      dtype_name(dlogits.dtype()), " ", shape_str(dlogits.shape()));
  DLREC_CHECK(lr_scale >= 0, "graph model: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  nn::use_single_threaded_blas();
  std::fill(has_grad_.begin(), has_grad_.end(), false);
  std::fill(owns_grad_.begin(), owns_grad_.end(), false);
  grads_[spec_.output] = dlogits.reshape({fwd_rows_, 1});
  has_grad_[spec_.output] = true;
  std::vector<bool> need;
  std::vector<Tensor> dins;
  for (size_t k = spec_.order.size(); k-- > 0;) {
    const int i = spec_.order[k];
    if (!need_grad_[i] || !has_grad_[i]) continue;
    need.clear();
    for (int j : inputs_[i]) need.push_back(need_grad_[j]);
    dins.assign(inputs_[i].size(), Tensor());
    nodes_[i]->backward(grads_[i], need, dins);
    for (size_t m = 0; m < inputs_[i].size(); ++m) {
      if (!need[m]) continue;
      const int j = inputs_[i][m];
      if (!has_grad_[j]) {  // the first consumer's gradient: a handle, no copy
        grads_[j] = dins[m];
        has_grad_[j] = true;
        continue;
      }
      // More consumers: sum into a buffer the model owns (never into a layer's buffer).
      if (!owns_grad_[j]) {
        nn::ensure_buffer(acc_[j], grads_[j].shape());
        std::memcpy(acc_[j].data<float>(), grads_[j].data<float>(), grads_[j].nbytes());
        grads_[j] = acc_[j];
        owns_grad_[j] = true;
      }
      DLREC_CHECK(dins[m].numel() == acc_[j].numel(), "graph model: gradient of '",
                  spec_.layers[j].name, "' has the wrong size");
      float* a = acc_[j].data<float>();
      const float* g = dins[m].data<float>();
      const int64_t cnt = acc_[j].numel();
      parallel_for(0, cnt, 1 << 15, [&](int64_t lo, int64_t hi) {
        for (int64_t e = lo; e < hi; ++e) a[e] += g[e];
      });
    }
  }
  // Every gradient is known: the dense step (global-norm clipping over all dense gradients,
  // whatever their optimizer), then the rows.
  float scale = 1.f;
  const float clip_norm = opts_[0].options().clip_norm;  // as nn::Optimizer::step_dense does
  if (clip_norm > 0.f) {
    const double norm = nn::Optimizer::grad_norm(dense_ptrs_);
    if (norm > clip_norm) scale = static_cast<float>(clip_norm / norm);
  }
  for (auto& d : dense_) d.opt->step(*d.p, static_cast<float>(d.lr * lr_scale), scale);
  for (int i : spec_.order)
    if (need_grad_[i]) nodes_[i]->step_tables(lr_scale);
}

void GraphModel::report_hashed() {
  int64_t total = 0;
  for (auto& t : tables_)
    if (t.h) total += t.h->stats().lookups;
  if (total == hashed_reported_lookups_) return;
  hashed_reported_lookups_ = total;
  for (auto& t : tables_) {
    if (!t.h) continue;
    const auto st = t.h->stats();
    std::fprintf(stderr,
                 "[hashed] %s: %lld/%lld rows, %lld lookups, hit rate %.4f, %lld inserts, %lld "
                 "evictions\n",
                 t.name.c_str(), static_cast<long long>(st.size),
                 static_cast<long long>(t.h->capacity()), static_cast<long long>(st.lookups),
                 st.hit_rate(), static_cast<long long>(st.inserts),
                 static_cast<long long>(st.evictions));
  }
}

// Hashed tables: the tensors are handed out as they are (shared storage), and the table is
// marked to be re-imported from them before its next use, since the caller may write into them
// (a checkpoint load); until then, further calls leave the tensors as the caller left them.
// Names: "<t>.weight" [capacity, dim], "<t>.keys" I64 [capacity], "<t>.lru" I32
// [2, capacity] and "<t>.hash_meta" I64 [8] (size, LRU ends, counters, capacity); their
// optimizer state "<t>.weight<suffix>" [capacity, S] (docs/EMBEDDINGS.md).
std::vector<NamedTensor> GraphModel::parameters() {
  report_hashed();  // checkpoints and exports call this: the training log gets the counters
  std::vector<NamedTensor> out;
  for (auto& d : dense_) out.emplace_back(d.name, d.p->value);
  for (auto& t : tables_) {
    if (t.p) {
      out.emplace_back(t.name + ".weight", t.p->value);
      continue;
    }
    const auto st = t.h->tensors(/*update_meta=*/!*t.handed_out);
    *t.handed_out = true;
    out.emplace_back(t.name + ".weight", st.weights);
    out.emplace_back(t.name + ".keys", st.keys);
    out.emplace_back(t.name + ".lru", st.links);
    out.emplace_back(t.name + ".hash_meta", st.meta);
  }
  return out;
}

std::vector<NamedTensor> GraphModel::optimizer_state() {
  std::vector<NamedTensor> out;
  for (auto& d : dense_)
    if (d.opt->has_state()) out.emplace_back(d.name + d.opt->state_suffix(), d.p->state);
  for (auto& t : tables_) {
    if (t.p && t.opt->has_state())
      out.emplace_back(t.name + ".weight" + t.opt->state_suffix(), t.p->state);
    if (t.h && t.h->optimizer().has_state()) {
      const auto st = t.h->tensors(/*update_meta=*/!*t.handed_out);
      *t.handed_out = true;
      out.emplace_back(t.name + ".weight" + t.h->optimizer().state_suffix(), st.state);
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Model> build_graph_model(const ModelConfig& model, const OptimizerConfig& opt,
                                         const io::ShardLayout& layout, Device device,
                                         uint64_t seed) {
  if (device.is_cuda())
    fail(
        "the graph model (arch \"graph\") runs on the CPU only in this build; use "
        "\"device\": \"cpu\" (",
        device.str(), " was asked for)");
  return std::make_unique<GraphModel>(model, opt, layout, seed);
}

}  // namespace dlrec::model
