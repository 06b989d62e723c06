// DLRM on the CPU: bottom MLP over the dense features, one EmbeddingBag per categorical feature,
// dot (or cat) interaction, top MLP to one logit. Embedding rows are updated sparsely.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/thread_pool.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/model.h"
#include "dlrec/model/optimizer_factory.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/dlrm_cuda.h"
#include "dlrec/model/graph_cuda.h"
#endif
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/interaction.h"
#include "dlrec/nn/linear.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"

namespace dlrec::model {
namespace {

class Dlrm final : public Model {
 public:
  Dlrm(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
       uint64_t seed);
  Tensor forward(const io::Batch& batch, bool training) override;
  void backward_and_update(const Tensor& dlogits, double lr_scale) override;
  std::vector<NamedTensor> parameters() override;
  std::vector<NamedTensor> optimizer_state() override;
  Device device() const override { return Device::cpu(); }

 private:
  void check_batch(const io::Batch& b) const;
  // Runs fn(t) for every table: across tables when there are enough of them to keep the
  // threads busy (each table's own loops then run serially), else table by table with the
  // tables' own parallel loops.
  template <class F>
  void for_each_table(F&& fn) {
    const int64_t T = static_cast<int64_t>(tables_.size());
    if (T >= num_threads()) {
      parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) fn(t);
      });
    } else {
      for (int64_t t = 0; t < T; ++t) fn(t);
    }
  }

  ModelConfig mc_;
  OptimizerConfig oc_;
  io::ShardLayout layout_;
  int64_t dim_;
  std::unique_ptr<nn::MLP> bottom_;  // null when there is no bottom MLP
  std::unique_ptr<nn::MLP> top_;
  std::vector<nn::EmbeddingBag> tables_;
  std::unique_ptr<nn::Interaction> inter_;
  nn::Optimizer opt_;      // dense layers
  nn::Optimizer emb_opt_;  // embedding tables (optimizer.embedding, or the same settings)
  std::vector<std::pair<std::string, nn::Param*>> dense_params_;
  std::vector<nn::Param*> dense_ptrs_;
  // Buffers reused across steps.
  Tensor dense_in_, emb_out_;
  int64_t fwd_rows_ = 0;
  bool have_training_forward_ = false;
};

Dlrm::Dlrm(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
           uint64_t seed)
    : mc_(mc),
      oc_(oc),
      layout_(layout),
      dim_(mc.embedding_dim),
      opt_(make_dense_optimizer(oc)),
      emb_opt_(make_embedding_optimizer(oc)) {
  DLREC_CHECK(layout.num_dense >= 0, "DLRM: negative number of dense features");
  DLREC_CHECK(dim_ > 0, "DLRM: embedding_dim must be positive");
  DLREC_CHECK(!mc.top_mlp.empty() && mc.top_mlp.back() == 1,
              "DLRM: the top MLP must end in 1 output (the logit)");
  const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
  DLREC_CHECK(T + layout.num_dense > 0, "DLRM: the data has no features");
  if (mc.interaction == "dot")
    DLREC_CHECK(layout.num_dense > 0,
                "DLRM: the dot interaction needs dense features (the data has none); use "
                "\"interaction\": \"cat\"");
  const nn::Pooling pooling = nn::parse_pooling(mc.pooling);

  int64_t dense_dim = layout.num_dense;
  if (layout.num_dense > 0 && !mc.bottom_mlp.empty()) {
    bottom_ = std::make_unique<nn::MLP>(layout.num_dense, mc.bottom_mlp, /*relu_last=*/true);
    bottom_->init(nn::derive_seed(seed, 1));
    dense_dim = bottom_->out_features();
  }
  if (mc.interaction == "dot" && dense_dim != dim_)
    fail("DLRM: the dot interaction needs the bottom MLP to output embedding_dim = ", dim_,
         " values, but it outputs ", dense_dim,
         mc.bottom_mlp.empty() ? " (no bottom MLP: the dense feature count)"
                               : " (set the last bottom_mlp size to embedding_dim)");
  inter_ = nn::make_interaction(mc.interaction, dense_dim, T, dim_);
  top_ = std::make_unique<nn::MLP>(inter_->out_features(), mc.top_mlp, /*relu_last=*/false);
  top_->init(nn::derive_seed(seed, 2));

  tables_.reserve(T);
  const uint64_t emb_seed = nn::derive_seed(seed, 3);
  for (int64_t t = 0; t < T; ++t) {
    DLREC_CHECK(layout.cardinalities[t] > 0, "DLRM: categorical feature ", t,
                " has cardinality ", layout.cardinalities[t], "; every table needs rows");
    tables_.emplace_back(layout.cardinalities[t], dim_, pooling);
    tables_.back().init(nn::derive_seed(emb_seed, t));
  }

  auto add_mlp = [&](nn::MLP* m, const std::string& prefix) {
    if (!m) return;
    for (size_t k = 0; k < m->layers().size(); ++k) {
      auto& l = m->layers()[k];
      dense_params_.emplace_back(prefix + "." + std::to_string(k) + ".weight", &l.weight());
      dense_params_.emplace_back(prefix + "." + std::to_string(k) + ".bias", &l.bias());
    }
  };
  add_mlp(bottom_.get(), "bottom");
  add_mlp(top_.get(), "top");
  for (auto& p : dense_params_) {
    opt_.init_state(*p.second);
    dense_ptrs_.push_back(p.second);
  }
  for (auto& t : tables_) emb_opt_.init_state(t.weight());
}

void Dlrm::check_batch(const io::Batch& b) const {
  const int64_t T = static_cast<int64_t>(tables_.size());
  DLREC_CHECK(b.rows >= 0, "DLRM: negative batch size");
  DLREC_CHECK(b.num_dense == layout_.num_dense, "DLRM: the batch has ", b.num_dense,
              " dense features, the model was built for ", layout_.num_dense);
  DLREC_CHECK(b.num_cat() == T && static_cast<int64_t>(b.cat_indices.size()) == T,
              "DLRM: the batch has ", b.num_cat(), " categorical features, the model was built for ",
              T);
  DLREC_CHECK(static_cast<int64_t>(b.dense.size()) == b.rows * b.num_dense, "DLRM: the batch has ",
              b.dense.size(), " dense values for ", b.rows, " rows x ", b.num_dense, " features");
  for (int64_t t = 0; t < T; ++t) {
    const auto& off = b.cat_offsets[t];
    DLREC_CHECK(static_cast<int64_t>(off.size()) == b.rows + 1, "DLRM: categorical feature ", t,
                " has ", off.size(), " offsets for ", b.rows, " rows");
    DLREC_CHECK(off.front() >= 0 && off.back() <= static_cast<int64_t>(b.cat_indices[t].size()),
                "DLRM: categorical feature ", t, ": offsets do not fit its ",
                b.cat_indices[t].size(), " ids");
  }
}

Tensor Dlrm::forward(const io::Batch& batch, bool training) {
  check_batch(batch);
  have_training_forward_ = false;
  nn::use_single_threaded_blas();
  const int64_t B = batch.rows, T = static_cast<int64_t>(tables_.size());
  nn::ensure_buffer(dense_in_, {B, layout_.num_dense});
  if (B * layout_.num_dense > 0)
    std::memcpy(dense_in_.data<float>(), batch.dense.data(), B * layout_.num_dense * sizeof(float));
  const Tensor& dense_out = bottom_ ? bottom_->forward(dense_in_) : dense_in_;

  nn::ensure_buffer(emb_out_, {B, T, dim_});
  float* emb = emb_out_.data<float>();
  for_each_table([&](int64_t t) {
    tables_[t].forward(batch.cat_offsets[t].data(), batch.cat_indices[t].data(), B, emb + t * dim_,
                       T * dim_, training);
  });

  const Tensor& z = inter_->forward(dense_out, emb_out_);
  const Tensor& logits = top_->forward(z);
  fwd_rows_ = B;
  have_training_forward_ = training;
  // A copy: callers may keep logits across steps (evaluation), the buffer is reused.
  return logits.reshape({B}).clone();
}

void Dlrm::backward_and_update(const Tensor& dlogits, double lr_scale) {
  DLREC_CHECK(have_training_forward_,
              "DLRM: backward_and_update needs a forward(batch, training = true) before it");
  DLREC_CHECK(dlogits.dtype() == DType::F32 && !dlogits.device().is_cuda() &&
                  dlogits.numel() == fwd_rows_,
              "DLRM: dlogits must be f32 on the CPU with ", fwd_rows_, " values, got ",
              dtype_name(dlogits.dtype()), " ", shape_str(dlogits.shape()));
  DLREC_CHECK(lr_scale >= 0, "DLRM: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  nn::use_single_threaded_blas();
  const int64_t B = fwd_rows_, T = static_cast<int64_t>(tables_.size());

  const Tensor& dz = top_->backward(dlogits.reshape({B, 1}));
  inter_->backward(dz);
  if (bottom_) bottom_->backward(inter_->grad_dense(), /*need_dx=*/false);

  const float lr = static_cast<float>(dense_lr(oc_) * lr_scale);
  const float emb_lr = static_cast<float>(embedding_lr(oc_) * lr_scale);
  opt_.step_dense(dense_ptrs_, lr);
  const float* demb = inter_->grad_emb().data<float>();
  for_each_table([&](int64_t t) {
    const nn::SparseGrad& g = tables_[t].backward(demb + t * dim_, T * dim_);
    emb_opt_.step_sparse(tables_[t].weight(), g, emb_lr);
  });
}

std::vector<NamedTensor> Dlrm::parameters() {
  std::vector<NamedTensor> out;
  for (auto& p : dense_params_) out.emplace_back(p.first, p.second->value);
  for (size_t t = 0; t < tables_.size(); ++t)
    out.emplace_back("emb." + std::to_string(t) + ".weight", tables_[t].weight().value);
  return out;
}

std::vector<NamedTensor> Dlrm::optimizer_state() {
  std::vector<NamedTensor> out;
  if (opt_.has_state()) {
    const std::string suffix = opt_.state_suffix();
    for (auto& p : dense_params_) out.emplace_back(p.first + suffix, p.second->state);
  }
  if (emb_opt_.has_state()) {
    const std::string suffix = emb_opt_.state_suffix();
    for (size_t t = 0; t < tables_.size(); ++t)
      out.emplace_back("emb." + std::to_string(t) + ".weight" + suffix, tables_[t].weight().state);
  }
  return out;
}

}  // namespace

std::unique_ptr<Model> build_model(const ModelConfig& model, const OptimizerConfig& opt,
                                   const io::ShardLayout& layout, Device device, uint64_t seed,
                                   const std::string& precision) {
  DLREC_CHECK(precision == "fp32" || device.is_cuda(), "precision '", precision,
              "' needs a CUDA device; the CPU computes in fp32");
  if (model.arch == "graph") {
#ifdef DLREC_WITH_CUDA
    if (device.is_cuda()) return make_graph_cuda(model, opt, layout, device, seed, precision);
#endif
    return build_graph_model(model, opt, layout, device, seed);
  }
  if (model.arch != "dlrm")
    fail("unknown model arch '", model.arch, "' (this build knows: dlrm, graph)");
  if (device.is_cuda()) {
#ifdef DLREC_WITH_CUDA
    return make_dlrm_cuda(model, opt, layout, device, seed, precision);
#else
    fail("cannot build the DLRM on ", device.str(),
         ": this build of dlrec has no CUDA support (use \"device\": \"cpu\")");
#endif
  }
  return std::make_unique<Dlrm>(model, opt, layout, seed);
}

}  // namespace dlrec::model
