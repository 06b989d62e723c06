// The embedding layer's buffers and exchange layouts for the sharded data-parallel paths
// (table-wise, replicated, row-wise; embedding_node_cuda.h).
#include "model/layers/embedding_node_cuda.h"

namespace dlrec::model::gpu_graph::emb {

Tensor upload_bytes(Engine& e, const void* src, size_t bytes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8, e.dev);
  if (bytes) copy_bytes(t.raw(), e.dev, src, Device::cpu(), bytes);
  return t;
}

void EmbeddingNode::alloc_exchange(Engine& e, int64_t max_nnz) {
  const int64_t n = e.dp.ranks, T = ts_.tab.num_tables, bags = T * n * cap_;
  const Value& gv = grad_value(e);
  lens_ = Tensor::empty({std::max<int64_t>(bags, 1)}, DType::I32, e.dev);
  src_ = Tensor::empty({std::max<int64_t>(bags, 1)}, DType::I64, e.dev);
  scan_bytes_ = dp::scan_bytes(bags);
  scan_ = Tensor::empty({static_cast<int64_t>(scan_bytes_)}, DType::U8, e.dev);
  if (!e.dp.table_owner.empty()) return;  // table-wise: the owners' buffers instead
  off_in_ = Tensor::empty({n * (T * cap_ + 1)}, DType::I32, e.dev);
  keys_in_ = Tensor::empty({std::max<int64_t>(n * max_nnz, 1)}, DType::I32, e.dev);
  off_g_ = Tensor::empty({bags + 1}, DType::I32, e.dev);
  keys_g_ = Tensor::empty({std::max<int64_t>(n * max_nnz, 1)}, DType::I32, e.dev);
  grad_g_ = e.buf({n * cap_, gv.ld}, gv.gdt);
}

void EmbeddingNode::alloc_table_wise(Engine& e, int64_t max_nnz) {
  const int n = e.dp.ranks;
  const int64_t T = ts_.tab.num_tables, dim = ts_.dim;
  const std::vector<int>& own = e.dp.table_owner;
  DLREC_CHECK(static_cast<int64_t>(own.size()) == T, "table-wise sharding: ", own.size(),
              " owners for ", T, " tables (bug)");
  tw_ = true;
  if (!ids_done_) {
    ids_done_ = gpu::Event(e.dev.index);
    a2a_done_ = gpu::Event(e.dev.index);
    rp_done_ = gpu::Event(e.dev.index);
    hy_done_ = gpu::Event(e.dev.index);
  }
  for (int o : own)
    DLREC_CHECK((o >= dp::kColumnWiseOwner || o == dp::kHybridOwner) && o < n,
                "table-wise sharding: owner ", o, " of ", n, " ranks (bug)");
  // The exchange's positions (every field in values): the table-wise tables and the column
  // pieces (row-wise and replicated tables have no owner and are not in these arrays).
  const dp::ExchangeLayout x = dp::plan_exchange(own, e.dp.col_pieces, dim, n, e.dp.rank);
  tw_W_ = x.W;
  tw_F_ = x.F;
  tw_row_ = x.W[e.dp.rank];
  has_tw_ = x.positions() > 0;
  const std::vector<int64_t>& mine = x.tw_mine;
  // The tables whose ids travel (all but the replicated ones) and their positions among them.
  tv_sel_.clear();
  tv_pos_.assign(T, -1);
  for (int64_t t = 0; t < T; ++t)
    if (own[t] != dp::kReplicatedOwner) {
      tv_pos_[t] = static_cast<int64_t>(tv_sel_.size());
      tv_sel_.push_back(t);
    }
  compact_ = static_cast<int64_t>(tv_sel_.size()) < T;
  std::vector<int32_t> sel32(tv_sel_.begin(), tv_sel_.end()), mine_pos;
  for (int64_t t : mine) mine_pos.push_back(static_cast<int32_t>(tv_pos_[t]));
  tw_K_ = static_cast<int64_t>(mine.size());
  tw_mine_ = mine;
  std::vector<float*> wp, sp;
  std::vector<uint32_t> base;
  for (int64_t t : mine) {
    wp.push_back(ts_.tables[t].data<float>());
    if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
    base.push_back(ts_.row_base[t]);
  }
  const std::vector<int32_t> lay = x.packed();
  tw_layout_mem_ = upload_bytes(e, lay.data(), lay.size() * sizeof(int32_t));
  tw_layout_ = dp::device_layout(static_cast<const int32_t*>(tw_layout_mem_.raw()), x);
  tw_tabs_ = upload_bytes(e, mine_pos.data(), mine_pos.size() * sizeof(int32_t));  // gathered order
  tv_sel_dev_ = upload_bytes(e, sel32.data(), sel32.size() * sizeof(int32_t));
  tw_ptrs_ = upload_bytes(e, wp.data(), wp.size() * sizeof(float*));
  tw_sptrs_ = upload_bytes(e, sp.data(), sp.size() * sizeof(float*));
  tw_base_ = upload_bytes(e, base.data(), base.size() * sizeof(uint32_t));
  tw_sub_ = ts_.tab;
  tw_sub_.weights = static_cast<float* const*>(tw_ptrs_.raw());
  tw_sub_.states = ts_.tab.states ? static_cast<float* const*>(tw_sptrs_.raw()) : nullptr;
  tw_sub_.row_base = static_cast<const uint32_t*>(tw_base_.raw());
  tw_sub_.num_tables = static_cast<int>(tw_K_);
  // Buffers for the largest global batch (every rank at the capacity).
  const int64_t G = n * cap_;
  const DType act = (into_ >= 0 ? e.vals[into_] : e.vals[self]).dt;
  // The gradients travel in the model's precision: an f32 gradient (the DLRM's, written by
  // the dot interaction in f32) is rounded to the 16-bit activation type before the exchange
  // in bf16/fp16 runs (half the bytes); fp32 runs send f32 as before.
  const DType gdt = grad_value(e).gdt;
  xdt_ = gdt == DType::F32 && is_half(act) ? act : gdt;
  auto one = [](int64_t x) { return std::max<int64_t>(x, 1); };
  tw_off_ = Tensor::empty({tw_K_ * G + 1}, DType::I32, e.dev);
  tw_keys_ = Tensor::empty({one(n * max_nnz)}, DType::I32, e.dev);
  // Pooled rows and gradients [G, tw_row_] on the owner; [B, sum_r W[r]] (at most T * dim) on
  // every rank.
  tw_pool_ = Tensor::empty({one(G * tw_row_)}, act, e.dev);
  tw_recv_ = Tensor::empty({one(cap_ * T * dim)}, act, e.dev);
  tw_gsend_ = Tensor::empty({one(cap_ * T * dim)}, xdt_, e.dev);
  tw_grecv_ = Tensor::empty({one(G * tw_row_)}, xdt_, e.dev);
  // The ids' all-gather: one block [offsets | keys] per rank (forward_table_wise).
  const int64_t block = static_cast<int64_t>(tv_sel_.size()) * cap_ + 1 + max_nnz;
  ids_send_ = Tensor::empty({block}, DType::I32, e.dev);
  ids_in_ = Tensor::empty({n * block}, DType::I32, e.dev);
  alloc_column_wise(e, max_nnz, x.groups);
  alloc_row_wise(e, max_nnz);
  alloc_replicated(e, max_nnz);
  alloc_hybrid(e, max_nnz);
}

void EmbeddingNode::alloc_column_wise(Engine& e, int64_t max_nnz,
                                      const std::vector<dp::ExchangeLayout::Group>& groups) {
  const int64_t n = e.dp.ranks, G = n * cap_, ids = std::max<int64_t>(n * max_nnz, 1);
  cw_.clear();
  for (const dp::ExchangeLayout::Group& gr : groups) {
    CwGroup g;
    g.width = gr.width;
    g.col = gr.col;
    g.tables = gr.tables;
    g.K = static_cast<int64_t>(gr.tables.size());
    std::vector<int32_t> pos;
    std::vector<float*> wp, sp;
    std::vector<uint32_t> base;
    for (int64_t t : gr.tables) {
      DLREC_CHECK(ts_.tables[t].defined() && ts_.tables[t].shape()[0] == ts_.rows[t] &&
                      ts_.tables[t].shape()[1] == gr.width,
                  "column-wise sharding: table ", t, "'s piece is not allocated (bug)");
      pos.push_back(static_cast<int32_t>(tv_pos_[t]));
      wp.push_back(ts_.tables[t].data<float>());
      if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
      base.push_back(ts_.row_base[t]);
    }
    g.tabs = upload_bytes(e, pos.data(), pos.size() * sizeof(int32_t));
    g.ptrs = upload_bytes(e, wp.data(), wp.size() * sizeof(float*));
    g.sptrs = upload_bytes(e, sp.data(), sp.size() * sizeof(float*));
    g.base = upload_bytes(e, base.data(), base.size() * sizeof(uint32_t));
    g.sub = ts_.tab;
    g.sub.weights = static_cast<float* const*>(g.ptrs.raw());
    g.sub.states = ts_.tab.states ? static_cast<float* const*>(g.sptrs.raw()) : nullptr;
    g.sub.row_base = static_cast<const uint32_t*>(g.base.raw());
    g.sub.num_tables = static_cast<int>(g.K);
    g.sub.dim = static_cast<int>(g.width);
    g.off = Tensor::empty({g.K * G + 1}, DType::I32, e.dev);
    g.keys = Tensor::empty({ids}, DType::I32, e.dev);
    // Its own sort: read by the backward while the whole tables' sort sits in ts_.scratch.
    const size_t sb = ce::scratch_bytes(ids, ts_.key_bits, static_cast<int>(g.width));
    g.scratch_mem = Tensor::empty({static_cast<int64_t>(sb)}, DType::U8, e.dev);
    g.scratch = ce::carve(g.scratch_mem.raw(), ids, ts_.key_bits, static_cast<int>(g.width));
    ce::prepare(g.scratch, e.st);
    cw_.push_back(std::move(g));
  }
}

void EmbeddingNode::alloc_replicated(Engine& e, int64_t max_nnz) {
  const int64_t T = ts_.tab.num_tables, dim = ts_.dim;
  rp_mine_.clear();
  std::vector<uint32_t> cap;  // each entry's largest key (a hybrid prefix: its zero row)
  // The replicas, and the hybrid tables' frequent prefixes (their ids >= F capped to the
  // prefix's zero row, row F).
  bool capped = false;
  for (int64_t t = 0; t < T; ++t) {
    const int o = e.dp.table_owner[t];
    if (o != dp::kReplicatedOwner && o != dp::kHybridOwner) continue;
    rp_mine_.push_back(t);
    int64_t last = ts_.rows[t] - 1;
    for (const dp::HybridTable& h : e.dp.hybrid)
      if (h.table == t) last = h.frequent, capped = true;
    cap.push_back(ts_.row_base[t] + static_cast<uint32_t>(last));
  }
  rp_K_ = static_cast<int64_t>(rp_mine_.size());
  if (rp_K_ == 0) return;
  rp_cap_ = capped ? upload_bytes(e, cap.data(), cap.size() * sizeof(uint32_t))
                   : Tensor();
  int64_t total = 0;
  for (int64_t t : rp_mine_) total += ts_.tables[t].defined() ? ts_.tables[t].numel() : 0;
  rp_grad_ = e.buf({total}, DType::F32);  // zero: dense_update keeps it so between steps
  if (is_half(xdt_)) rp_grad16_ = Tensor::empty({total}, xdt_, e.dev);  // all-reduced in 16 bits
  std::vector<int32_t> table;
  std::vector<float*> wp, sp, gp;
  std::vector<uint32_t> base;
  int64_t at = 0;
  for (int64_t k = 0; k < rp_K_; ++k) {
    const int64_t t = rp_mine_[k];
    const bool hybrid = e.dp.table_owner[t] == dp::kHybridOwner;
    const int64_t rows = hybrid ? cap[k] - ts_.row_base[t] + 1 : ts_.rows[t];
    DLREC_CHECK(ts_.tables[t].defined() && ts_.tables[t].shape()[0] == rows,
                hybrid ? "hybrid table " : "replicated table ", t,
                hybrid ? "'s prefix is not allocated (bug)" : " is not allocated whole (bug)");
    table.push_back(static_cast<int32_t>(t));
    wp.push_back(ts_.tables[t].data<float>());
    if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
    gp.push_back(rp_grad_.data<float>() + at);
    base.push_back(ts_.row_base[t]);
    at += rows * dim;
  }
  rp_tabs_ = upload_bytes(e, table.data(), table.size() * sizeof(int32_t));
  rp_ptrs_ = upload_bytes(e, wp.data(), wp.size() * sizeof(float*));
  rp_sptrs_ = upload_bytes(e, sp.data(), sp.size() * sizeof(float*));
  rp_gptrs_ = upload_bytes(e, gp.data(), gp.size() * sizeof(float*));
  rp_base_ = upload_bytes(e, base.data(), base.size() * sizeof(uint32_t));
  rp_sub_ = ts_.tab;
  rp_sub_.weights = static_cast<float* const*>(rp_ptrs_.raw());
  rp_sub_.states = ts_.tab.states ? static_cast<float* const*>(rp_sptrs_.raw()) : nullptr;
  rp_sub_.row_base = static_cast<const uint32_t*>(rp_base_.raw());
  rp_sub_.num_tables = static_cast<int>(rp_K_);
  // Pooled into, and their gradient read from, the layer's own columns (no copy pass).
  rp_sub_.col = static_cast<const int32_t*>(rp_tabs_.raw());
  rp_gtab_ = rp_sub_;  // the gradient "tables": SGD with lr -1 writes the summed gradient
  rp_gtab_.weights = static_cast<float* const*>(rp_gptrs_.raw());
  rp_gtab_.states = nullptr;
  auto one = [](int64_t x) { return std::max<int64_t>(x, 1); };
  rp_off_ = Tensor::empty({rp_K_ * cap_ + 1}, DType::I32, e.dev);
  rp_keys_ = Tensor::empty({one(max_nnz)}, DType::I32, e.dev);
  rp_minus_one_ = Tensor::empty({1}, DType::F32, e.dev);
  ce::fill(rp_minus_one_.data<float>(), 1, -1.f, e.st);
  // Own scratch: the ids are sorted in the forward (forward_replicated) and read by the
  // backward while the table-wise tables' sort sits in ts_.scratch.
  const size_t sb = ce::scratch_bytes(one(max_nnz), ts_.key_bits, static_cast<int>(dim));
  rp_scratch_mem_ = Tensor::empty({static_cast<int64_t>(sb)}, DType::U8, e.dev);
  rp_scratch_ = ce::carve(rp_scratch_mem_.raw(), one(max_nnz), ts_.key_bits, static_cast<int>(dim));
  ce::prepare(rp_scratch_, e.st);
}

void EmbeddingNode::replicated_apply(Engine& e) {
  const int64_t dim = ts_.dim;
  e.comm_join(rp_done_);
  int64_t at = 0;
  for (int64_t t : rp_mine_) {
    const int64_t n = ts_.tables[t].numel();
    float* w = ts_.tables[t].data<float>();
    float* a = ts_.states.empty() ? nullptr : ts_.states[t].data<float>();
    if (is_half(xdt_))
      with_half(xdt_, [&](auto* h) {
        dp::dense_update(w, a, static_cast<decltype(h)>(rp_grad16_.raw()) + at, n, e.lr + 1,
                         e.emb_eps, e.st);
      });
    else
      dp::dense_update(w, a, rp_grad_.data<float>() + at, n, e.lr + 1, e.emb_eps, e.st);
    // A hybrid prefix's zero row took the gradients of the ids >= F: zero again.
    if (e.dp.table_owner[t] == dp::kHybridOwner)
      DLREC_CUDA_CHECK(cudaMemsetAsync(w + n - dim, 0, sizeof(float) * dim, e.st));
    at += n;
  }
}

dp::RankGeometry EmbeddingNode::geometry(const Engine& e, std::vector<int64_t>* off_counts,
                                         std::vector<int64_t>* key_counts) const {
  const DataParallel& d = e.dp;
  const int64_t T = ts_.tab.num_tables;
  std::vector<int64_t> keys = d.nnz;
  if (compact_)
    for (int r = 0; r < d.ranks; ++r) {
      keys[r] = 0;
      for (int64_t t : tv_sel_) keys[r] += d.table_nnz[r * T + t];
    }
  return dp::gathered_geometry(d.rows, keys, static_cast<int64_t>(tv_sel_.size()), off_counts,
                               key_counts);
}

void EmbeddingNode::tw_counts(const Engine& e, std::vector<int64_t>* own_c,
                              std::vector<int64_t>* own_o, std::vector<int64_t>* peer_c,
                              std::vector<int64_t>* peer_o) const {
  const DataParallel& d = e.dp;
  own_c->assign(d.ranks, 0);
  own_o->assign(d.ranks, 0);
  peer_c->assign(d.ranks, 0);
  peer_o->assign(d.ranks, 0);
  int64_t R = 0;
  for (int s = 0; s < d.ranks; ++s) {
    (*own_c)[s] = tw_row_ * d.rows[s];
    (*own_o)[s] = tw_row_ * R;
    (*peer_c)[s] = tw_W_[s] * e.B;
    (*peer_o)[s] = tw_F_[s] * e.B;
    R += d.rows[s];
  }
}

void EmbeddingNode::alloc_row_wise(Engine& e, int64_t max_nnz) {
  const int n = e.dp.ranks;
  const int64_t T = ts_.tab.num_tables, dim = ts_.dim;
  std::vector<int64_t> info;
  std::vector<float*> wp, sp;
  std::vector<uint32_t> local_base;
  rw_mine_.clear();
  rw_local_rows_.clear();
  uint64_t total = 0;
  for (int64_t t = 0; t < T; ++t)
    if (e.dp.table_owner[t] == -1) rw_mine_.push_back(t);
  rw_K_ = static_cast<int64_t>(rw_mine_.size());
  if (rw_K_ == 0) return;
  for (int64_t k = 0; k < rw_K_; ++k) {
    const int64_t t = rw_mine_[k];
    int64_t lo = 0, hi = 0;
    dp::row_range(ts_.rows[t], n, e.dp.rank, &lo, &hi);
    DLREC_CHECK(ts_.tables[t].defined() && ts_.tables[t].shape()[0] == hi - lo + 1,
                "row-wise sharding: table ", t, "'s piece is not allocated (bug)");
    info.insert(info.end(), {tv_pos_[t], static_cast<int64_t>(ts_.row_base[t]), lo, hi,
                             static_cast<int64_t>(total)});
    local_base.push_back(static_cast<uint32_t>(total));
    total += static_cast<uint64_t>(hi - lo + 1);
    rw_local_rows_.push_back(hi - lo);
    wp.push_back(ts_.tables[t].data<float>());
    if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
  }
  rw_key_bits_ = 1;
  while (rw_key_bits_ < 32 && (uint64_t{1} << rw_key_bits_) < total) ++rw_key_bits_;
  rw_info_ = upload_bytes(e, info.data(), info.size() * sizeof(int64_t));
  rw_rl_ = dp::RwLayout{static_cast<const int64_t*>(rw_info_.raw()), rw_K_};
  const dp::ExchangeLayout x = dp::local_layout(rw_mine_, dim);
  const std::vector<int32_t> lay = x.packed();
  rw_layout_mem_ = upload_bytes(e, lay.data(), lay.size() * sizeof(int32_t));
  rw_layout_ = dp::device_layout(static_cast<const int32_t*>(rw_layout_mem_.raw()), x);
  rw_ptrs_ = upload_bytes(e, wp.data(), wp.size() * sizeof(float*));
  rw_sptrs_ = upload_bytes(e, sp.data(), sp.size() * sizeof(float*));
  rw_base_ = upload_bytes(e, local_base.data(), local_base.size() * sizeof(uint32_t));
  rw_sub_ = ts_.tab;
  rw_sub_.weights = static_cast<float* const*>(rw_ptrs_.raw());
  rw_sub_.states = ts_.tab.states ? static_cast<float* const*>(rw_sptrs_.raw()) : nullptr;
  rw_sub_.row_base = static_cast<const uint32_t*>(rw_base_.raw());
  rw_sub_.num_tables = static_cast<int>(rw_K_);
  // Buffers for the largest padded global batch (every rank at the capacity).
  const int64_t G = n * cap_;
  const DType act = (into_ >= 0 ? e.vals[into_] : e.vals[self]).dt;
  const DType gdt = xdt_;  // the exchange's gradient type (alloc_table_wise)
  auto one = [](int64_t x) { return std::max<int64_t>(x, 1); };
  rw_off_ = Tensor::empty({rw_K_ * G + 1}, DType::I32, e.dev);
  rw_keys_ = Tensor::empty({one(n * max_nnz)}, DType::I32, e.dev);
  rw_pool_ = Tensor::empty({one(G * rw_K_ * dim)}, act, e.dev);
  rw_recv_ = Tensor::empty({one(cap_ * rw_K_ * dim)}, act, e.dev);
  rw_gsend_ = e.buf({one(cap_ * rw_K_ * dim)}, gdt);  // zero: its padding rows are sent too
  rw_grecv_ = Tensor::empty({one(G * rw_K_ * dim)}, gdt, e.dev);
  const int64_t ids = one(n * max_nnz);
  const size_t sb = ce::scratch_bytes(ids, rw_key_bits_, static_cast<int>(dim));
  rw_scratch_mem_ = Tensor::empty({static_cast<int64_t>(sb)}, DType::U8, e.dev);
  rw_scratch_ = ce::carve(rw_scratch_mem_.raw(), ids, rw_key_bits_, static_cast<int>(dim));
  ce::prepare(rw_scratch_, e.st);
}

}  // namespace dlrec::model::gpu_graph::emb
