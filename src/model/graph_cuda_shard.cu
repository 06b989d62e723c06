// Sharding of the CUDA graph engine's embedding tables over the GPUs of a data-parallel job
// (table-wise, row-wise, column-wise, replicated; docs/DISTRIBUTED.md, "Across GPUs"). The
// exchange itself is the embedding layer's (src/model/layers/embedding_cuda.cu); here: the plan,
// the owned tables' and pieces' allocation (a GPU never allocates a table it does not own) and the
// streaming of the tables to host copies for checkpoints; the per-step count exchange of a
// data-parallel step or a sharded evaluation. Also the tables' allocation on one GPU and the
// row-wise quantized tables a compact export serves from their codes.
#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "dlrec/core/device.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/planner.h"
#include "model/graph_cuda_impl.h"
#include "model/layers/embedding_dp_cuda.h"

namespace dlrec::model::graph_cuda_impl {

void GraphCuda::shard_tables(dist::Communicator& host, const dist::PlannerOptions& options,
                             const std::vector<double>& ids_per_sample, std::FILE* plan_log) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(e_.dp.comm, "sharding: the tables of a model on ", dev_.str(),
              " are sharded over the GPUs of a data-parallel job (dlrec train --gpus N)");
  DLREC_CHECK(emb_, "sharding: the model has no embedding layer with tables to shard");
  DLREC_CHECK(!emb_->hashed(), "sharding: layer '", emb_->layer_name(),
              "' has hashed tables, which are not sharded");
  DLREC_CHECK(!tables_ready_, "sharding: the tables of layer '", emb_->layer_name(),
              "' were allocated before shard_tables (bug: shard a model right after "
              "set_gradient_reducer, before any step)");
  DLREC_CHECK(host.size() == e_.dp.ranks && host.rank() == e_.dp.rank,
              "sharding: the host communicator (rank ", host.rank(), " of ", host.size(),
              ") is not the NCCL one's (rank ", e_.dp.rank, " of ", e_.dp.ranks, ") (bug)");
  const std::string layer = emb_->layer_name();
  const int64_t dim = e_.vals[emb_idx_].fields.at(0);
  const int n = e_.dp.ranks;
  // The specs from the layout (the tables are not allocated yet).
  std::vector<dist::TableSpec> specs;
  double ids_total = 0;
  for (int64_t t = 0; t < T_; ++t) {
    dist::TableSpec s;
    s.name = layer + "." + std::to_string(t);
    s.rows = layout_.cardinalities[t];
    s.dim = dim;
    s.value_bytes = 4;
    s.state_bytes_per_row = 4 * e_.emb_state_cols(dim);
    const double ids = t < static_cast<int64_t>(ids_per_sample.size()) ? ids_per_sample[t] : 1.0;
    ids_total += ids;
    s.lookups_per_step =
        ids * static_cast<double>(std::max<int64_t>(1, options.batch_per_rank)) * n;
    specs.push_back(s);
  }
  // The memory a GPU has: the least free device memory over the ranks now (the dense part is
  // built, the tables are not), its dense parameters and the exchange's buffers for the
  // configured batch (an owner of all tables at worst: the plan is not known yet).
  dist::GpuMemory mem;
  for (const NamedState& d : dense_)
    mem.dense_bytes += 4 * (2 * d.value.numel() + (d.state.defined() ? d.state.numel() : 0));
  // The exchange moves pooled rows and their gradients in the model's precision.
  const int act = e_.lowp ? 2 : 4;
  dist::PlannerOptions opts = options;
  for (int64_t t = 0; t < T_ && t < static_cast<int64_t>(options.frequency_by_feature.size()); ++t)
    if (!options.frequency_by_feature[t].empty())
      opts.frequency[layer + "." + std::to_string(t)] = options.frequency_by_feature[t];
  opts.exchange_value_bytes = act;
  opts.exchange_grad_bytes = act;
  opts.replica_reduce_bytes = act;  // the replicas' gradient all-reduce too (embedding_cuda.cu)
  mem.exchange_bytes = dist::gpu_exchange_bytes(n, options.batch_per_rank, T_, T_, dim,
                                                T_ > 0 ? ids_total / T_ : 1.0, act, act);
  // A column-wise table's piece owners build its bags and sort all its ids once more (their
  // own keys and sort scratch: ~36 bytes per id of the global batch).
  for (int64_t t = 0; t < T_; ++t) {
    auto it = options.overrides.find(specs[t].name);
    if (it != options.overrides.end() && it->second.kind == dist::ShardingKind::ColumnWise)
      mem.exchange_bytes += static_cast<int64_t>(
          36.0 * (t < static_cast<int64_t>(ids_per_sample.size()) ? ids_per_sample[t] : 1.0) *
          static_cast<double>(std::max<int64_t>(1, options.batch_per_rank)) * n);
  }
  size_t free_b = 0, total_b = 0;
  DLREC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  std::vector<int64_t> free_all(n);
  const int64_t mine = static_cast<int64_t>(free_b);
  host.all_gather(&mine, free_all.data(), 1, dist::Elem::I64);
  mem.free_bytes = *std::min_element(free_all.begin(), free_all.end());
  // The optimizers with a row's own state (rowwise_adagrad, adam) and momentum must step only
  // the rows a batch touches, as one GPU does: the replicas' update from their all-reduced dense
  // gradient steps every row, and the pieces (row-wise, column-wise, hybrid) keep Adagrad's
  // per-value state only. With them every table is table-wise (no replicas by the cost rule).
  const bool whole_only = !e_.emb_adagrad && e_.emb_state_cols(dim) > 0;
  if (whole_only) {
    opts.replicate_auto = opts.replicate_by_cost = false;
    opts.replicate_max_bytes = 0;
  }
  const dist::Plan plan = dist::plan_gpu_tables(specs, opts, mem);
  for (int64_t t = 0; t < T_ && whole_only; ++t) {
    const dist::ShardingKind k = plan.tables[t].kind;
    if (k != dist::ShardingKind::TableWise)
      fail("sharding: table '", specs[t].name, "' is ", dist::sharding_kind_name(k),
           "; optimizer.embedding \"", e_.state_suffix(true).substr(1),
           "\" trains across GPUs with table-wise tables only, or without a sharding section "
           "(every table data-parallel); set the table's \"kind\" to \"table_wise\", or use "
           "\"adagrad\" or \"sgd\"");
  }
  std::vector<int> owner(T_, -1);
  std::vector<TableKeep> keep(T_, TableKeep::None);
  std::vector<gpu_graph::dp::ColPiece> pieces;
  std::vector<gpu_graph::dp::HybridTable> hybrid;
  int64_t own_bytes = 0, own_rows = 0, own_tables = 0;
  for (int64_t t = 0; t < T_; ++t) {
    if (plan.tables[t].kind == dist::ShardingKind::Hybrid) {  // a prefix on every GPU
      const dist::TablePlan& tp = plan.tables[t];
      DLREC_CHECK(tp.rare_owner >= 0 && tp.rare_owner < n, "sharding: hybrid table ", t,
                  " has no owner (bug)");
      owner[t] = gpu_graph::dp::kHybridOwner;
      keep[t] = TableKeep::Prefix;
      hybrid.push_back({t, tp.rare_owner, tp.frequent_rows});
      if (const dist::Shard* sh = plan.shard_of(static_cast<int>(t), e_.dp.rank)) {
        own_bytes += sh->bytes;
        own_rows += sh->rows;
        ++own_tables;
      }
      continue;
    }
    if (plan.tables[t].kind == dist::ShardingKind::Replicated) {  // whole on every GPU
      owner[t] = gpu_graph::dp::kReplicatedOwner;
      keep[t] = TableKeep::Whole;
      own_bytes += specs[t].bytes() + 4 * specs[t].rows * dim;  // + its dense gradient
      own_rows += specs[t].rows;
      ++own_tables;
      continue;
    }
    if (plan.tables[t].kind == dist::ShardingKind::RowWise) {  // a range on every GPU
      owner[t] = gpu_graph::dp::kRowWiseOwner;
      keep[t] = TableKeep::Rows;
      int64_t lo = 0, hi = 0;
      gpu_graph::dp::row_range(specs[t].rows, n, e_.dp.rank, &lo, &hi);
      own_bytes += (hi - lo + 1) * (specs[t].bytes() / std::max<int64_t>(specs[t].rows, 1));
      own_rows += hi - lo;
      ++own_tables;
      continue;
    }
    if (plan.tables[t].kind == dist::ShardingKind::ColumnWise) {  // column pieces
      owner[t] = gpu_graph::dp::kColumnWiseOwner;
      for (const dist::Shard& sh : plan.tables[t].shards) {
        pieces.push_back({t, sh.rank, sh.col_begin, sh.col_end});
        if (sh.rank != e_.dp.rank) continue;
        keep[t] = TableKeep::Columns;
        const int64_t w = sh.col_end - sh.col_begin;
        own_bytes += specs[t].rows * w * 4 * (e_.emb_adagrad ? 2 : 1);
        own_rows += specs[t].rows;
        ++own_tables;
      }
      continue;
    }
    owner[t] = plan.tables[t].owner();
    if (owner[t] == e_.dp.rank) {
      keep[t] = TableKeep::Whole;
      own_bytes += specs[t].bytes();
      own_rows += specs[t].rows;
      ++own_tables;
    }
  }
  if (plan_log) {
    std::ostringstream os;
    dist::print_plan(plan, specs, os);
    std::fputs(os.str().c_str(), plan_log);
    std::fflush(plan_log);
  }
  synchronize();
  // This GPU's tables only, initialised as one GPU initialises them (per-table seeds); a column
  // piece finds its columns in e_.dp.col_pieces.
  e_.dp.col_pieces = std::move(pieces);
  e_.dp.hybrid = std::move(hybrid);
  materialize_tables(&keep);
  sharded_index_.assign(T_, -1);
  for (int64_t t = 0; t < T_; ++t) {
    const std::string name = layer + "." + std::to_string(t) + ".weight";
    for (size_t k = 0; k < tables_.size(); ++k)
      if (tables_[k].name == name) sharded_index_[t] = static_cast<int>(k);
    DLREC_CHECK(sharded_index_[t] >= 0, "sharding: table '", name, "' not found (bug)");
  }
  host_tables_.assign(T_, {});
  // Each GPU's tables and memory, printed once by rank 0.
  DLREC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t row[5] = {own_tables, own_rows, own_bytes, static_cast<int64_t>(total_b - free_b),
                          static_cast<int64_t>(total_b)};
  std::vector<int64_t> rows_all(5 * n);
  host.all_gather(row, rows_all.data(), 5, dist::Elem::I64);
  if (plan_log) {
    for (int r = 0; r < n; ++r) {
      const int64_t* x = &rows_all[5 * r];
      std::fprintf(
          plan_log,
          "[shard] GPU %d: %lld tables or row ranges, %lld rows, %s of tables and optimizer state "
          "allocated; device memory in use %s of %s\n",
          r, static_cast<long long>(x[0]), static_cast<long long>(x[1]),
          dist::format_bytes(static_cast<double>(x[2])).c_str(),
          dist::format_bytes(static_cast<double>(x[3])).c_str(),
          dist::format_bytes(static_cast<double>(x[4])).c_str());
    }
    std::fflush(plan_log);
  }
  drop_graphs();
  dp_shape_[0].clear();
  dp_shape_[1].clear();
  cap_b_ = cap_nnz_ = 0;  // the exchange's buffers are allocated anew for the plan
  e_.dp.table_owner = std::move(owner);
}

// Rank 0 receives a host copy of every table it does not own (values, then the optimizer
// state), streamed from the owner through NCCL broadcasts of at most kChunk values into a
// staging buffer: no GPU ever holds another GPU's tables. A row-wise table is streamed range by
// range from each range's GPU, and every rank keeps the host copy (a resume loads into it and
// release_sharded_tables puts each rank's range back on its GPU).
void GraphCuda::gather_sharded_tables() {
  if (e_.dp.table_owner.empty() || !e_.dp.comm) return;
  DeviceGuard g(dev_index_);
  synchronize();  // the last step's updates are done (the broadcasts run on the comm stream)
  constexpr int64_t kChunk = int64_t{16} << 20;  // 64 MB of f32
  const int me = e_.dp.rank, n = e_.dp.ranks;
  int64_t largest = 0;
  const int64_t width = std::max(e_.vals[emb_idx_].fields.at(0),
                                 e_.emb_state_cols(e_.vals[emb_idx_].fields.at(0)));
  for (size_t t = 0; t < sharded_index_.size(); ++t)
    largest = std::max(largest, layout_.cardinalities[t] * width);
  Tensor stage = Tensor::empty({std::max<int64_t>(std::min(largest, kChunk), 1)}, DType::F32, dev_);
  host_tables_.assign(sharded_index_.size(), {});
  for (size_t t = 0; t < sharded_index_.size(); ++t) {
    const int owner = e_.dp.table_owner[t];
    if (owner == 0 || owner == gpu_graph::dp::kReplicatedOwner) continue;  // rank 0 has it
    const bool row_wise = owner == gpu_graph::dp::kRowWiseOwner;
    const bool col_wise = owner == gpu_graph::dp::kColumnWiseOwner;
    NamedState& p = tables_[sharded_index_[t]];
    const int64_t rows = layout_.cardinalities[t], dim = e_.vals[emb_idx_].fields.at(0);
    // Streams rows [lo, hi) of the table (or of its state: rows of `w` values) from `root`
    // (whose device tensor holds them from its row `dev_row`) into the host copy of the ranks
    // that keep one.
    auto stream_rows = [&](Tensor& dev, Tensor& host, int root, int64_t lo, int64_t hi,
                           int64_t dev_row, bool keep, int64_t w) {
      const int64_t total = (hi - lo) * w;
      for (int64_t at = 0; at < total; at += kChunk) {
        const int64_t c = std::min(kChunk, total - at);
        float* buf = me == root ? dev.data<float>() + dev_row * w + at : stage.data<float>();
        e_.dp.comm->broadcast(buf, c, dist::Elem::F32, root);
        if (keep)
          copy_bytes(host.data<float>() + lo * w + at, Device::cpu(), buf, dev_,
                     sizeof(float) * c);
      }
    };
    // Streams piece p's columns (its device tensor [rows, w] on its rank) into every rank's
    // host copy, whole rows of the piece at a time.
    auto stream_cols = [&](Tensor& dev, Tensor& host, const gpu_graph::dp::ColPiece& p) {
      const int64_t w = p.c1 - p.c0, step = std::max<int64_t>(1, kChunk / w);
      for (int64_t lo = 0; lo < rows; lo += step) {
        const int64_t c = std::min(step, rows - lo);
        float* buf = me == p.rank ? dev.data<float>() + lo * w : stage.data<float>();
        e_.dp.comm->broadcast(buf, c * w, dist::Elem::F32, p.rank);
        DLREC_CUDA_CHECK(cudaMemcpy2D(host.data<float>() + lo * dim + p.c0, sizeof(float) * dim,
                                      buf, sizeof(float) * w, sizeof(float) * w, c,
                                      cudaMemcpyDeviceToHost));
      }
    };
    auto stream_one = [&](Tensor& dev, Tensor& host) {
      if (col_wise) {
        host = Tensor::empty({rows, dim}, DType::F32, Device::cpu());
        for (const gpu_graph::dp::ColPiece& p : e_.dp.col_pieces)
          if (p.table == static_cast<int64_t>(t)) stream_cols(dev, host, p);
        return;
      }
      if (!row_wise) {
        if (me == 0) host = Tensor::empty({rows, dim}, DType::F32, Device::cpu());
        stream_rows(dev, host, owner, 0, rows, 0, me == 0, dim);
        return;
      }
      host = Tensor::empty({rows, dim}, DType::F32, Device::cpu());
      for (int r = 0; r < n; ++r) {
        int64_t lo = 0, hi = 0;
        gpu_graph::dp::row_range(rows, n, r, &lo, &hi);
        stream_rows(dev, host, r, lo, hi, 0, true, dim);
      }
    };
    if (owner == gpu_graph::dp::kHybridOwner) {
      // Every rank keeps the whole copy: rows [0, F) from the owner's prefix, the others from
      // its piece (release_sharded_tables puts them back after a resume loaded into it).
      const gpu_graph::dp::HybridTable h = hybrid_of(t);
      auto [rare, rare_state] = emb_->hybrid_rare(static_cast<int64_t>(t));
      auto stream_hybrid = [&](Tensor& prefix, Tensor& piece, Tensor& host) {
        host = Tensor::empty({rows, dim}, DType::F32, Device::cpu());
        stream_rows(prefix, host, h.owner, 0, h.frequent, 0, true, dim);
        stream_rows(piece, host, h.owner, h.frequent, rows, 0, true, dim);
      };
      stream_hybrid(p.value, rare, host_tables_[t].first);
      if (e_.emb_adagrad) stream_hybrid(p.state, rare_state, host_tables_[t].second);
      continue;
    }
    stream_one(p.value, host_tables_[t].first);
    if (e_.emb_adagrad) {
      stream_one(p.state, host_tables_[t].second);
    } else if (const int64_t sc = e_.emb_state_cols(dim); sc > 0) {
      // A whole table's state of another width (the pieces refused it): rows of sc values, in
      // the CPU's shape ([rows] for rowwise_adagrad).
      Tensor& host = host_tables_[t].second;
      if (me == 0)
        host = Tensor::empty(e_.emb_rowwise ? Shape{rows} : Shape{rows, sc}, DType::F32,
                             Device::cpu());
      stream_rows(p.state, host, owner, 0, rows, 0, me == 0, sc);
    }
  }
}

gpu_graph::dp::HybridTable GraphCuda::hybrid_of(size_t t) const {
  for (const gpu_graph::dp::HybridTable& h : e_.dp.hybrid)
    if (h.table == static_cast<int64_t>(t)) return h;
  fail("table ", t, " is not hybrid (bug)");
}

// Drops the host copies; a row-wise table's copy first gives this rank its range back (the
// values a resume loaded into it; after a checkpoint, the values it already has).
void GraphCuda::release_sharded_tables() {
  for (size_t t = 0; t < host_tables_.size(); ++t) {
    const bool row_wise =
        t < e_.dp.table_owner.size() && e_.dp.table_owner[t] == gpu_graph::dp::kRowWiseOwner;
    const bool col_wise =
        t < e_.dp.table_owner.size() && e_.dp.table_owner[t] == gpu_graph::dp::kColumnWiseOwner;
    if (col_wise && host_tables_[t].first.defined()) {
      DeviceGuard g(dev_index_);
      NamedState& p = tables_[sharded_index_[t]];
      const int64_t rows = layout_.cardinalities[t], dim = e_.vals[emb_idx_].fields.at(0);
      for (const gpu_graph::dp::ColPiece& c : e_.dp.col_pieces) {
        if (c.table != static_cast<int64_t>(t) || c.rank != e_.dp.rank) continue;
        const int64_t w = c.c1 - c.c0;
        DLREC_CUDA_CHECK(cudaMemcpy2D(
            p.value.data<float>(), sizeof(float) * w, host_tables_[t].first.data<float>() + c.c0,
            sizeof(float) * dim, sizeof(float) * w, rows, cudaMemcpyHostToDevice));
        if (e_.emb_adagrad && host_tables_[t].second.defined())
          DLREC_CUDA_CHECK(cudaMemcpy2D(
              p.state.data<float>(), sizeof(float) * w, host_tables_[t].second.data<float>() + c.c0,
              sizeof(float) * dim, sizeof(float) * w, rows, cudaMemcpyHostToDevice));
      }
    }
    const bool hybrid =
        t < e_.dp.table_owner.size() && e_.dp.table_owner[t] == gpu_graph::dp::kHybridOwner;
    if (hybrid && host_tables_[t].first.defined()) {  // the prefix on every GPU, the piece
      DeviceGuard g(dev_index_);
      NamedState& p = tables_[sharded_index_[t]];
      const int64_t dim = e_.vals[emb_idx_].fields.at(0), rows = layout_.cardinalities[t];
      const gpu_graph::dp::HybridTable h = hybrid_of(t);
      auto [rare, rare_state] = emb_->hybrid_rare(static_cast<int64_t>(t));
      auto put = [&](Tensor& prefix, Tensor& piece, const Tensor& host) {
        if (!host.defined()) return;
        copy_bytes(prefix.data<float>(), dev_, host.data<float>(), Device::cpu(),
                   sizeof(float) * h.frequent * dim);
        if (h.owner == e_.dp.rank)
          copy_bytes(piece.data<float>(), dev_, host.data<float>() + h.frequent * dim,
                     Device::cpu(), sizeof(float) * (rows - h.frequent) * dim);
      };
      put(p.value, rare, host_tables_[t].first);
      if (e_.emb_adagrad) put(p.state, rare_state, host_tables_[t].second);
    }
    if (row_wise && host_tables_[t].first.defined()) {
      DeviceGuard g(dev_index_);
      NamedState& p = tables_[sharded_index_[t]];
      const int64_t rows = layout_.cardinalities[t], dim = e_.vals[emb_idx_].fields.at(0);
      int64_t lo = 0, hi = 0;
      gpu_graph::dp::row_range(rows, e_.dp.ranks, e_.dp.rank, &lo, &hi);
      copy_bytes(p.value.data<float>(), dev_, host_tables_[t].first.data<float>() + lo * dim,
                 Device::cpu(), sizeof(float) * (hi - lo) * dim);
      if (e_.emb_adagrad && host_tables_[t].second.defined())
        copy_bytes(p.state.data<float>(), dev_, host_tables_[t].second.data<float>() + lo * dim,
                   Device::cpu(), sizeof(float) * (hi - lo) * dim);
    }
    host_tables_[t] = {};
  }
}

void GraphCuda::set_quantized_tables(std::vector<QuantizedTable> tables) {
  if (tables.empty()) return;
  DeviceGuard g(dev_index_);
  std::vector<QuantizedTable> rest;
  std::map<std::string, int64_t> index;  // the embedding layer's tables by parameter name
  for (int64_t t = 0; emb_ && t < T_; ++t)
    index[emb_->layer_name() + "." + std::to_string(t) + ".weight"] = t;
  for (QuantizedTable& q : tables) {
    const std::string what = "quantized table '" + q.name + "'";
    auto it = index.find(q.name);
    if (it == index.end()) {
      rest.push_back(std::move(q));
      continue;
    }
    const int64_t t = it->second;
    nn::check_row_quant(q.rows, what);
    const int64_t dim = e_.vals[emb_idx_].fields.at(0);
    DLREC_CHECK(q.rows.rows == layout_.cardinalities[static_cast<size_t>(t)] && q.rows.dim == dim,
                what, ": the record is [", q.rows.rows, ", ", q.rows.dim,
                "], the model's table is [", layout_.cardinalities[static_cast<size_t>(t)], ", ",
                dim, "]");
    if (!emb_->set_quantized(e_, t, q.rows)) {
      rest.push_back(std::move(q));
      continue;
    }
    quantized_tables_ = true;
  }
  if (tables_ready_) {  // the handed-out list drops the released fp32 tables
    std::vector<NamedState> dense, tabs;
    for (auto& n : nodes_) n->collect(e_, dense, tabs);
    tables_ = std::move(tabs);
  }
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  drop_graphs();  // captured with the old table pointers
  Model::set_quantized_tables(std::move(rest));
}

void GraphCuda::materialize_tables(const std::vector<TableKeep>* keep) {
  if (tables_ready_) return;
  DeviceGuard g(dev_index_);
  for (int i : spec_.order) nodes_[i]->materialize(e_, keep);
  std::vector<NamedState> dense, tables;  // the tables' tensors, now allocated (the dense ones
  for (auto& n : nodes_) n->collect(e_, dense, tables);  // are unchanged)
  tables_ = std::move(tables);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  tables_ready_ = true;
}

void GraphCuda::exchange_counts(const io::Batch& batch, bool need_rows) {
  check_batch(batch);
  int64_t nnz = 0;
  for (int64_t t = 0; t < T_; ++t)
    nnz += batch.cat_offsets[t][batch.rows] - batch.cat_offsets[t][0];
  const int n = e_.dp.ranks;
  // Rows, ids and ids per table (table-wise sharding sizes its owners' updates by them).
  const int64_t w = 2 + T_;
  std::vector<int64_t> mine(w), all(w * n);
  mine[0] = batch.rows;
  mine[1] = nnz;
  for (int64_t t = 0; t < T_; ++t)
    mine[2 + t] = batch.cat_offsets[t][batch.rows] - batch.cat_offsets[t][0];
  host_comm_->all_gather(mine.data(), all.data(), w, dist::Elem::I64);
  DataParallel& d = e_.dp;
  d.rows.assign(n, 0);
  d.nnz.assign(n, 0);
  d.table_nnz.assign(n * T_, 0);
  d.global_rows = d.global_nnz = 0;
  for (int r = 0; r < n; ++r) {
    d.rows[r] = all[w * r];
    d.nnz[r] = all[w * r + 1];
    for (int64_t t = 0; t < T_; ++t) d.table_nnz[r * T_ + t] = all[w * r + 2 + t];
    DLREC_CHECK(!need_rows || d.rows[r] > 0, "data-parallel step: rank ", r,
                " has no rows "
                "(every rank needs some rows of each global batch)");
    d.global_rows += d.rows[r];
    d.global_nnz += d.nnz[r];
  }
  DLREC_CHECK(d.global_nnz < (int64_t{1} << 31) &&
                  d.global_rows * std::max<int64_t>(T_, 1) < (int64_t{1} << 31),
              "data-parallel step: the global batch's ", d.global_nnz, " ids and ", d.global_rows,
              " rows are too many (int32 offsets)");
  // The exchange's buffers hold every rank's part: sized for the largest.
  materialize_tables();
  ensure_capacity(*std::max_element(d.rows.begin(), d.rows.end()),
                  *std::max_element(d.nnz.begin(), d.nnz.end()));
}

bool GraphCuda::split_piece(size_t k) const {
  for (size_t t = 0; t < sharded_index_.size() && t < e_.dp.table_owner.size(); ++t)
    if (sharded_index_[t] == static_cast<int>(k))
      return e_.dp.table_owner[t] == gpu_graph::dp::kRowWiseOwner ||
             e_.dp.table_owner[t] == gpu_graph::dp::kColumnWiseOwner ||
             e_.dp.table_owner[t] == gpu_graph::dp::kHybridOwner;
  return false;
}

const Tensor* GraphCuda::host_table(size_t k, bool state) const {
  for (size_t t = 0; t < sharded_index_.size() && t < host_tables_.size(); ++t)
    if (sharded_index_[t] == static_cast<int>(k)) {
      const Tensor& h = state ? host_tables_[t].second : host_tables_[t].first;
      return h.defined() ? &h : nullptr;
    }
  return nullptr;
}

}  // namespace dlrec::model::graph_cuda_impl
