// Layer "embedding": one table per selected categorical feature, the pooled rows side by side
// (one field per table). Tables are fixed (nn::EmbeddingBag) or hashed
// (embedding::HashedEmbedding, "hashed": {...}); their state is five tensors shared with
// parameters()/optimizer_state(); after those were handed out (a checkpoint load may have
// written into them) the table is re-imported before its next use.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "dlrec/core/thread_pool.h"
#include "dlrec/dist/sharded_embedding.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/param.h"
#include "dlrec/nn/rng.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

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
    if (sharded_) {  // a collective: every rank's tables exchange ids and pooled rows
      std::vector<dist::BagsView> bags(setup_.size());
      for (size_t k = 0; k < setup_.size(); ++k)
        bags[k] = {b.cat_offsets[setup_[k].feature].data(),
                   b.cat_indices[setup_[k].feature].data()};
      sharded_->forward(bags, B, out, W, training);
      return out_;
    }
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
    if (sharded_) {  // a collective: the pooled gradients go to the tables' owners
      sharded_->backward(g, shape.width);
      return;
    }
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
    if (sharded_) return;  // the owners' gradients are of the global batch already
    merged_.resize(setup_.size());
    for (size_t k = 0; k < setup_.size(); ++k) {
      reducer.reduce_sparse(*grads_[k], merged_[k]);
      grads_[k] = &merged_[k];
    }
  }
  void step_tables(double lr_scale) override {
    if (sharded_) {
      std::vector<float> lr(setup_.size());
      for (size_t k = 0; k < setup_.size(); ++k)
        lr[k] = static_cast<float>(setup_[k].lr * lr_scale);
      sharded_->step(lr);
      return;
    }
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
        t.bag = fixed_[k].get();
        t.opt = setup_[k].opt;
      }
      tables.push_back(std::move(t));
    }
  }

  bool shard_tables(const cpu_graph::ShardingRequest& req) override;
  // The whole tables live in fixed_[k]->weight() only between gather and scatter/release.
  void gather_sharded_tables() override {
    if (!sharded_) return;
    for (size_t k = 0; k < setup_.size(); ++k) {
      nn::Param& p = fixed_[k]->weight();
      p.value = sharded_->gather_table(static_cast<int>(k));
      p.state = sharded_->gather_table(static_cast<int>(k), true);
    }
  }
  void scatter_sharded_tables() override {
    if (!sharded_) return;
    for (size_t k = 0; k < setup_.size(); ++k) {
      nn::Param& p = fixed_[k]->weight();
      sharded_->load_table(static_cast<int>(k), p.value, p.state);
    }
    release_sharded_tables();
  }
  void release_sharded_tables() override {
    if (!sharded_) return;
    for (size_t k = 0; k < setup_.size(); ++k) fixed_[k]->weight() = nn::Param();
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
  std::unique_ptr<dist::ShardedEmbedding> sharded_;  // sharded: the tables live here
  Tensor out_;
};

// The layer's fixed tables become one ShardedEmbedding with their current values and state (so
// the same as on one rank), planned over the job's ranks; the whole tables are then dropped.
bool EmbeddingNode::shard_tables(const cpu_graph::ShardingRequest& req) {
  for (size_t k = 0; k < setup_.size(); ++k)
    if (hashed_[k])
      fail("table '", name_, ".", setup_[k].feature,
           "' is hashed; hashed tables are not sharded yet (use fixed tables)");
  const dist::PlannerOptions& o = *req.options;
  std::vector<dist::ShardedTableConfig> cfg;
  std::vector<dist::TableSpec> specs;
  for (size_t k = 0; k < setup_.size(); ++k) {
    const nn::EmbeddingBag& bag = *fixed_[k];
    const nn::Optimizer* opt = setup_[k].opt;
    dist::TableSpec s;
    s.name = name_ + "." + std::to_string(setup_[k].feature);
    s.rows = bag.rows();
    s.dim = bag.dim();
    s.value_bytes = 4;
    s.state_bytes_per_row = 4 * opt->state_row_size(bag.dim());
    s.state_splits_by_column = opt->kind() != nn::OptimizerKind::RowWiseAdagrad;
    const auto f = static_cast<size_t>(setup_[k].feature);
    const double ids = f < req.ids_per_sample->size() ? (*req.ids_per_sample)[f] : 1.0;
    s.lookups_per_step =
        ids * static_cast<double>(std::max<int64_t>(1, o.batch_per_rank)) * o.ranks;
    specs.push_back(s);
    // The optimizer belongs to the model, which outlives the layer: a non-owning pointer.
    cfg.push_back(
        {s, 0, bag.pooling(),
         std::shared_ptr<const nn::Optimizer>(std::shared_ptr<const nn::Optimizer>(), opt)});
  }
  dist::Plan plan = dist::plan_sharding(specs, o);
  if (req.plan_log) {
    std::ostringstream os;
    dist::print_plan(plan, specs, os);
    std::fputs(os.str().c_str(), req.plan_log);
    std::fflush(req.plan_log);
  }
  sharded_ = std::make_unique<dist::ShardedEmbedding>(cfg, std::move(plan), *req.comm);
  for (size_t k = 0; k < setup_.size(); ++k) {
    const nn::Param& p = fixed_[k]->weight();
    sharded_->load_table(static_cast<int>(k), p.value, p.state);
  }
  release_sharded_tables();
  return true;
}

std::vector<int64_t> table_dims(const LayerSpec& s, size_t features) {
  std::vector<int64_t> dims = s.dims.empty() ? std::vector<int64_t>(features, s.dim) : s.dims;
  if (dims.size() != features)
    fail("key 'dims': ", dims.size(), " widths for ", features, " features");
  return dims;
}

// One Gather (pooled with ScatterND for multi-hot bags) per table, side by side.
std::string embedding_to_onnx(OnnxEmit& e) {
  const std::vector<int64_t> f = table_features(e.spec, e.layout);
  const std::vector<int64_t> dims = table_dims(e.spec, f.size());
  std::vector<std::string> parts;
  for (size_t k = 0; k < f.size(); ++k) parts.push_back(onnx_table_lookup(e, f[k], dims[k]));
  return onnx_concat(e.g, parts, e.spec.name);
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
    t.to_onnx = embedding_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
