// The predictor's staging of store rows (src/train/export_store.h).
#include "train/export_store.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "dlrec/core/error.h"

namespace dlrec::train::detail {

std::vector<store::TableInfo> find_store_tables(const model::RunConfig& cfg,
                                                const io::ShardLayout& layout) {
  // Two tiny builds: every feature of cardinality 1, then feature f of cardinality 2 + f. A
  // parameter [1, d] in the first and [2 + f, d] in the second is feature f's table.
  io::ShardLayout one = layout, tagged = layout;
  for (size_t f = 0; f < layout.cardinalities.size(); ++f) {
    one.cardinalities[f] = 1;
    tagged.cardinalities[f] = 2 + static_cast<int64_t>(f);
  }
  auto a = model::build_model(cfg.model, cfg.optimizer, one, Device::cpu(), 0);
  auto b = model::build_model(cfg.model, cfg.optimizer, tagged, Device::cpu(), 0);
  std::map<std::string, Shape> shape_a;
  for (const auto& [name, t] : a->parameters()) shape_a[name] = t.shape();
  std::vector<store::TableInfo> out;
  for (const auto& [name, t] : b->parameters()) {
    const Shape& sa = shape_a.at(name);
    const Shape& sb = t.shape();
    if (sb.size() != 2 || sa.size() != 2 || sa[0] != 1 || sb[0] == 1 || sa[1] != sb[1]) continue;
    const int64_t f = sb[0] - 2;
    DLREC_CHECK(
        f >= 0 && f < static_cast<int64_t>(layout.cardinalities.size()) && t.dtype() == DType::F32,
        "embedding store: cannot tell the table of parameter '", name, "'");
    out.push_back({name, f, layout.cardinalities[f], sb[1]});
  }
  DLREC_CHECK(!out.empty(), "embedding store: the model has no fixed embedding table");
  return out;
}

StagedTables::StagedTables(std::unique_ptr<store::EmbeddingStore> store,
                           const io::ShardLayout& layout, int64_t capacity)
    : store_(std::move(store)), layout_(layout), capacity_(capacity) {
  for (const store::TableInfo& t : store_->tables())
    if (std::find(features_.begin(), features_.end(), t.feature) == features_.end())
      features_.push_back(t.feature);
  uniq_.resize(features_.size());
}

io::ShardLayout StagedTables::staging_layout() const {
  io::ShardLayout l = layout_;
  for (int64_t f : features_) l.cardinalities[f] = capacity_;
  return l;
}

void StagedTables::bind(model::Model& m) {
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : m.parameters()) params[name] = t;
  std::vector<float*> data;  // assigned only when every table is found
  for (const store::TableInfo& t : store_->tables()) {
    auto it = params.find(t.name);
    DLREC_CHECK(it != params.end() && it->second.shape() == Shape({capacity_, t.dim}),
                "embedding store: the model has no staged table '", t.name, "'");
    data.push_back(it->second.data<float>());
  }
  table_data_ = std::move(data);
}

bool StagedTables::is_table(const std::string& name) const {
  for (const store::TableInfo& t : store_->tables())
    if (t.name == name) return true;
  return false;
}

int64_t StagedTables::staging_bytes() const {
  int64_t w = 0;
  for (const store::TableInfo& t : store_->tables()) w += t.dim;
  return capacity_ * w * 4;
}

int64_t StagedTables::prepare(const io::Batch& b) {
  staged_ = b;
  int64_t most = 0;
  std::unordered_map<int64_t, int64_t> pos;
  for (size_t k = 0; k < features_.size(); ++k) {
    const auto f = static_cast<size_t>(features_[k]);
    DLREC_CHECK(f < b.cat_indices.size(), "embedding store: the batch has ", b.cat_indices.size(),
                " categorical features, the model ", layout_.cardinalities.size());
    std::vector<int64_t>& ids = staged_.cat_indices[f];
    std::vector<int64_t>& uniq = uniq_[k];
    uniq.clear();
    pos.clear();
    pos.reserve(ids.size());
    for (int64_t& id : ids) {
      auto ins = pos.emplace(id, static_cast<int64_t>(uniq.size()));
      if (ins.second) uniq.push_back(id);
      id = ins.first->second;
    }
    most = std::max(most, static_cast<int64_t>(uniq.size()));
  }
  return most;
}

const io::Batch& StagedTables::fill() {
  const auto& tables = store_->tables();
  // One update snapshot for the whole batch: it sees all of an online update's rows or none.
  const auto pinned = store_->pin();
  for (size_t t = 0; t < tables.size(); ++t) {
    const size_t k = static_cast<size_t>(
        std::find(features_.begin(), features_.end(), tables[t].feature) - features_.begin());
    const std::vector<int64_t>& uniq = uniq_[k];
    DLREC_CHECK(static_cast<int64_t>(uniq.size()) <= capacity_, "embedding store: ", uniq.size(),
                " distinct ids exceed the staging capacity ", capacity_);
    store_->lookup(static_cast<int>(t), uniq.data(), static_cast<int64_t>(uniq.size()),
                   table_data_[t], pinned.get());
  }
  return staged_;
}

}  // namespace dlrec::train::detail
