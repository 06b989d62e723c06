// Layer "embedding": one table per selected categorical feature, the pooled rows side by side
// (one field per table). Tables are fixed (nn::EmbeddingBag) or hashed
// (embedding::HashedEmbedding, "hashed": {...}); their state is five tensors shared with
// parameters()/optimizer_state(); after those were handed out (a checkpoint load may have
// written into them) the table is re-imported before its next use.
#include <memory>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/param.h"
#include "dlrec/nn/rng.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"

namespace dlrec::model {
namespace {

using cpu_graph::TableRef;
using cpu_graph::TableSetup;

class EmbeddingNode final : public cpu_graph::Node {
 public:
  EmbeddingNode(const std::string& name, std::vector<TableSetup> setup,
                const io::ShardLayout& layout, nn::Pooling pooling, uint64_t seed)
      : name_(name), setup_(std::move(setup)) {
    const size_t T = setup_.size();
    fixed_.resize(T);
    hashed_.resize(T);
    handed_out_.reset(new bool[T]());
    int64_t width = 0;
    for (size_t k = 0; k < T; ++k) {
      const TableSetup& t = setup_[k];
      if (t.hashed) {
        hashed_[k] = std::make_unique<embedding::HashedEmbedding>(t.hashed_options);
      } else {
        fixed_[k] =
            std::make_unique<nn::EmbeddingBag>(layout.cardinalities[t.feature], t.dim, pooling);
        fixed_[k]->init(nn::derive_seed(seed, static_cast<uint64_t>(t.feature)));
      }
      offset_.push_back(width);
      width += t.dim;
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
  bool can_reduce_table_grads() const override {
    for (const auto& h : hashed_)
      if (h) return false;  // replicas of a hashed table would admit different keys
    return true;
  }
  void reduce_table_grads(GradientReducer& reducer) override {
    merged_.resize(setup_.size());
    for (size_t k = 0; k < setup_.size(); ++k) {
      reducer.reduce_sparse(*grads_[k], merged_[k]);
      grads_[k] = &merged_[k];
    }
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
  void collect(std::vector<cpu_graph::DenseRef>&, std::vector<TableRef>& tables) override {
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
  std::vector<nn::SparseGrad> merged_;  // data-parallel: the gradients summed over the ranks
  Tensor out_;
};

std::vector<int64_t> table_dims(const LayerSpec& s, size_t features) {
  std::vector<int64_t> dims = s.dims.empty() ? std::vector<int64_t>(features, s.dim) : s.dims;
  if (dims.size() != features)
    fail("key 'dims': ", dims.size(), " widths for ", features, " features");
  return dims;
}

}  // namespace

const LayerType& embedding_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "embedding";
    t.arity = 0;
    t.trainable = true;
    t.table_keys = true;
    t.hashed_tables = true;
    t.cuda_single = true;
    t.parse = [](ConfigReader& r, LayerSpec& s) {
      s.dim = r.get_int_range("dim", s.dim, 1, 1 << 16);
      if (r.has("dims")) {
        if (r.has("dim")) fail("give either 'dim' or 'dims', not both");
        s.dims = read_int_list(r, "dims", 1, 1 << 16, false);
        if (!s.all_features && s.dims.size() != s.features.size())
          fail("config key '", r.key_path("dims"), "' has ", s.dims.size(), " widths for the ",
               s.features.size(), " features of 'features'");
      }
      r.get<json>("dims", json());
      if (r.has("hashed")) s.hashed = parse_hashed(r, "hashed");
    };
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>&, const io::ShardLayout& l) {
      const std::vector<int64_t> f = table_features(s, l);
      ValueShape out;
      out.fields = table_dims(s, f.size());
      for (int64_t d : out.fields) out.width += d;
      return out;
    };
    t.make_cpu = [](cpu_graph::Build& b) {
      const std::vector<int64_t> f = table_features(b.spec, b.layout);
      return std::make_unique<EmbeddingNode>(b.spec.name, b.tables(f, table_dims(b.spec, f.size())),
                                             b.layout, nn::parse_pooling(b.spec.pooling), b.seed);
    };
    t.cuda_unsupported = [](const CudaQuery& q) {
      const std::string all = cuda_all_features(q.spec, q.layout);
      if (!all.empty()) return all;
      for (int64_t d : q.spec.dims)
        if (d != q.spec.dims[0])
          return "key 'dims': the CUDA graph model needs one width for all tables (got " +
                 std::to_string(q.spec.dims[0]) + " and " + std::to_string(d) +
                 "); train this model on the CPU";
      return std::string();
    };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_embedding);
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
