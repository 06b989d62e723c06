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
#include <algorithm>
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
#include "dlrec/nn/linear.h"
#include "dlrec/nn/linear_packed.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"

namespace dlrec::model {
namespace {

using cpu_graph::DenseRef;
using cpu_graph::Node;
using cpu_graph::TableRef;
using cpu_graph::TableSetup;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
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
  void set_gradient_reducer(GradientReducer* reducer) override;
  void shard_tables(dist::Communicator& comm, const dist::PlannerOptions& options,
                    const std::vector<double>& ids_per_sample, std::FILE* plan_log) override;
  void gather_sharded_tables() override {
    for (auto& n : nodes_) n->gather_sharded_tables();
  }
  void scatter_sharded_tables() override {
    for (auto& n : nodes_) n->scatter_sharded_tables();
  }
  void release_sharded_tables() override {
    for (auto& n : nodes_) n->release_sharded_tables();
  }
  std::vector<PrunableWeight> prunable_weights() override;
  std::vector<std::string> kernel_report() override;
  void prepare_cpu_inference() override;
  void set_mask(const std::string& name, const Tensor& mask) override;
  std::vector<NamedTensor> masks() override;
  void set_quantized_tables(std::vector<QuantizedTable> tables) override;
  std::vector<std::pair<std::string, const nn::RowQuantRows*>> quantized_tables() override;

 private:
  std::unique_ptr<Node> make_node(const LayerSpec& s, const std::vector<ValueShape>& in,
                                  uint64_t seed);
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
  GradientReducer* reducer_ = nullptr;  // data-parallel training
  std::vector<bool> has_tables_;        // by layer index
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
    std::vector<ValueShape> in;
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
        const bool dense = layer_type(s.type).dense_params;
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

std::unique_ptr<Node> GraphModel::make_node(const LayerSpec& s, const std::vector<ValueShape>& in,
                                            uint64_t seed) {
  const LayerType& type = layer_type(s.type);
  const ValueShape shape = type.infer(s, in, layout_);
  cpu_graph::Build b{s, in, shape, layout_, seed, nullptr};
  b.tables = [&](const std::vector<int64_t>& features, const std::vector<int64_t>& dims) {
    return table_setup(s, features, dims, seed);
  };
  std::unique_ptr<Node> node = type.make_cpu(b);
  node->shape = shape;
  return node;
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
  if (reducer_) {  // data-parallel: the gradients summed over the ranks, in a fixed order
    std::vector<Tensor*> dense;
    for (nn::Param* p : dense_ptrs_) dense.push_back(&p->grad);
    reducer_->reduce_dense(dense);
    for (int i : spec_.order)
      if (need_grad_[i] && has_tables_[i]) nodes_[i]->reduce_table_grads(*reducer_);
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

void GraphModel::set_gradient_reducer(GradientReducer* reducer) {
  if (reducer) {
    has_tables_.assign(nodes_.size(), false);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      std::vector<DenseRef> d;
      std::vector<TableRef> t;
      nodes_[i]->collect(d, t);
      has_tables_[i] = !t.empty();
      if (has_tables_[i] && !nodes_[i]->can_reduce_table_grads())
        fail("data-parallel training: layer '", spec_.layers[i].name, "' (type '",
             spec_.layers[i].type, "') cannot sum its tables' gradients over the ranks yet",
             " (fixed-size tables of an embedding layer can)");
    }
  }
  reducer_ = reducer;
}

void GraphModel::shard_tables(dist::Communicator& comm, const dist::PlannerOptions& options,
                              const std::vector<double>& ids_per_sample, std::FILE* plan_log) {
  // Every rank keeps the dense layers whole: their weights, gradients and optimizer state.
  dist::PlannerOptions o = options;
  o.dense_bytes = 0;
  for (const auto& d : dense_)
    o.dense_bytes += 4 * (2 * d.p->value.numel() + (d.p->state.defined() ? d.p->state.numel() : 0));
  cpu_graph::ShardingRequest req;
  req.comm = &comm;
  req.options = &o;
  req.ids_per_sample = &ids_per_sample;
  req.plan_log = plan_log;
  // The first embedding layer's tables are sharded (one plan, one memory budget); the tables of
  // other layers (a wide part, a second embedding layer) stay replicated on every rank.
  for (size_t i = 0; i < nodes_.size(); ++i) {
    try {
      if (nodes_[i]->shard_tables(req)) return;
    } catch (const Error& e) {
      fail("sharding: layer '", spec_.layers[i].name, "': ", e.what());
    }
  }
  fail("sharding: the model has no embedding layer with tables to shard");
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

// Prunable: the matrices ([out, in], 2-d) of the mlp and cross layers, in layer order.
std::vector<PrunableWeight> GraphModel::prunable_weights() {
  std::vector<PrunableWeight> out;
  for (size_t i = 0; i < spec_.layers.size(); ++i) {
    const LayerSpec& s = spec_.layers[i];
    if (s.type != "mlp" && s.type != "cross") continue;
    std::vector<DenseRef> dense;
    std::vector<TableRef> tables;
    nodes_[i]->collect(dense, tables);
    for (const DenseRef& d : dense)
      if (d.p->value.ndim() == 2) out.push_back({s.name, d.name, d.p->value, d.p});
  }
  return out;
}

// The CPU engine's compressed layers: the kernel of each weight with an inference hook.
std::vector<std::string> GraphModel::kernel_report() {
  std::vector<std::string> out;
  for (const PrunableWeight& w : prunable_weights())
    if (w.param->quant && !w.param->quant->kernel().empty())
      out.push_back(w.name + ": " + w.param->quant->kernel() + " (cpu)");
  return out;
}

void GraphModel::prepare_cpu_inference() {
  if (nn::fp32_best_kernel() == nn::Fp32Kernel::Reference) return;  // OpenBLAS is faster
  for (const PrunableWeight& w : prunable_weights())
    if (!w.param->quant) w.param->quant = std::make_shared<nn::PackedLinear>(w.weight);
}

void GraphModel::set_mask(const std::string& name, const Tensor& mask) {
  for (const PrunableWeight& w : prunable_weights()) {
    if (w.name != name) continue;
    DLREC_CHECK(mask.defined() && mask.dtype() == DType::F32 && !mask.device().is_cuda() &&
                    mask.shape() == w.weight.shape(),
                "the mask of '", name, "' must be an F32 CPU tensor of the weight's shape");
    for (DenseRef& d : dense_) {
      if (d.name != name) continue;
      d.p->mask = mask;
      float* v = d.p->value.data<float>();
      const float* m = mask.data<float>();
      for (int64_t k = 0; k < mask.numel(); ++k)
        if (m[k] == 0.f) v[k] = 0.f;
    }
    return;
  }
  fail("'", name, "' is not a prunable weight of this model (mlp and cross weights are)");
}

std::vector<NamedTensor> GraphModel::masks() {
  std::vector<NamedTensor> out;
  for (auto& d : dense_)
    if (d.p->mask.defined()) out.emplace_back(d.name + ".mask", d.p->mask);
  return out;
}

// The embedding layer's fixed tables read the codes; other tables (wide) take their values.
void GraphModel::set_quantized_tables(std::vector<QuantizedTable> tables) {
  std::vector<QuantizedTable> rest;
  for (QuantizedTable& q : tables) {
    auto t = std::find_if(tables_.begin(), tables_.end(),
                          [&](const TableRef& r) { return r.bag && r.name + ".weight" == q.name; });
    if (t == tables_.end())
      rest.push_back(std::move(q));
    else
      t->bag->set_quantized(std::move(q.rows), "quantized table '" + q.name + "'");
  }
  Model::set_quantized_tables(std::move(rest));
}

std::vector<std::pair<std::string, const nn::RowQuantRows*>> GraphModel::quantized_tables() {
  std::vector<std::pair<std::string, const nn::RowQuantRows*>> out;
  for (const TableRef& t : tables_)
    if (t.bag && t.bag->quantized()) out.emplace_back(t.name + ".weight", t.bag->quantized());
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
