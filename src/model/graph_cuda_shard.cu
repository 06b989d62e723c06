// Table-wise sharding of the CUDA graph engine's embedding tables over the GPUs of a
// data-parallel job (docs/DISTRIBUTED.md, "Across GPUs"). The exchange itself is the embedding
// layer's (src/model/layers/embedding_cuda.cu); here: the plan and the copies' refresh.
#include <limits>
#include <sstream>

#include "dlrec/dist/communicator.h"
#include "dlrec/dist/planner.h"
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {

void GraphCuda::shard_tables(dist::Communicator&, const dist::PlannerOptions& options,
                             const std::vector<double>& ids_per_sample, std::FILE* plan_log) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(e_.dp.comm, "sharding: the tables of a model on ", dev_.str(),
              " are sharded over the GPUs of a data-parallel job (dlrec train --gpus N)");
  DLREC_CHECK(emb_, "sharding: the model has no embedding layer with tables to shard");
  const std::string layer = emb_->layer_name();
  // On the GPUs every table is placed whole on one GPU: no replication of small tables (each
  // is pooled by its owner like the others) and no splits to balance memory; a split the plan
  // needs to fit is an error below (row- and column-wise are CPU-only so far).
  dist::PlannerOptions o = options;
  o.replicate_max_bytes = 0;
  o.max_memory_imbalance = std::numeric_limits<double>::max();
  o.dense_bytes = 0;
  for (const NamedState& d : dense_)
    o.dense_bytes += 4 * (2 * d.value.numel() + (d.state.defined() ? d.state.numel() : 0));
  std::vector<dist::TableSpec> specs;
  std::vector<NamedState*> tabs;
  for (int64_t t = 0; t < T_; ++t) {
    const std::string name = layer + "." + std::to_string(t);
    NamedState* p = nullptr;
    for (NamedState& s : tables_)
      if (s.name == name + ".weight") p = &s;
    DLREC_CHECK(p, "sharding: table '", name, "' not found in the model (bug)");
    dist::TableSpec s;
    s.name = name;
    s.rows = p->value.shape()[0];
    s.dim = p->value.shape()[1];
    s.value_bytes = 4;
    s.state_bytes_per_row = p->state.defined() ? 4 * p->state.shape()[1] : 0;
    const double ids = t < static_cast<int64_t>(ids_per_sample.size()) ? ids_per_sample[t] : 1.0;
    s.lookups_per_step =
        ids * static_cast<double>(std::max<int64_t>(1, o.batch_per_rank)) * e_.dp.ranks;
    specs.push_back(s);
    tabs.push_back(p);
  }
  for (const auto& [name, ov] : o.overrides)
    if (ov.kind == dist::ShardingKind::Replicated)
      fail("sharding.tables.", name, ".kind: \"replicated\" is not supported on the GPUs yet ",
           "(their tables are table-wise; drop the override)");
  dist::Plan plan = dist::plan_sharding(specs, o);
  std::vector<int> owner(T_, -1);
  for (int64_t t = 0; t < T_; ++t) {
    const dist::TablePlan& tp = plan.tables[t];
    DLREC_CHECK(tp.kind == dist::ShardingKind::TableWise, "sharding: table '", tp.name,
                "' is planned ", dist::sharding_kind_name(tp.kind), " (",
                dist::format_bytes(static_cast<double>(specs[t].bytes())),
                "); on the GPUs tables are sharded table-wise only so far (a table that needs "
                "more than one GPU's memory cannot train across GPUs yet)");
    owner[t] = tp.owner();
  }
  if (plan_log) {
    std::ostringstream os;
    dist::print_plan(plan, specs, os);
    std::fputs(os.str().c_str(), plan_log);
    std::fflush(plan_log);
  }
  synchronize();
  drop_graphs();
  dp_shape_[0].clear();
  dp_shape_[1].clear();
  cap_b_ = cap_nnz_ = 0;  // the exchange's buffers are allocated anew for the plan
  e_.dp.table_owner = std::move(owner);
  sharded_tables_ = std::move(tabs);
}

void GraphCuda::gather_sharded_tables() {
  if (e_.dp.table_owner.empty() || !e_.dp.comm) return;
  DeviceGuard g(dev_index_);
  synchronize();  // the last step's updates are done (the broadcasts run on the comm stream)
  for (size_t t = 0; t < sharded_tables_.size(); ++t) {
    const int root = e_.dp.table_owner[t];
    NamedState& p = *sharded_tables_[t];
    e_.dp.comm->broadcast(p.value.raw(), p.value.numel(), dist::Elem::F32, root);
    if (p.state.defined())
      e_.dp.comm->broadcast(p.state.raw(), p.state.numel(), dist::Elem::F32, root);
  }
}

}  // namespace dlrec::model::graph_cuda_impl
