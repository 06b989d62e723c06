#include "dlrec/dist/sharded_embedding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "dist/sharded_embedding_layout.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/rng.h"

namespace dlrec::dist {

namespace {

using detail::Piece;
using detail::row_wise_rows;
using detail::StateLayout;

}  // namespace

namespace {

void check_bags(const std::vector<ShardedTableConfig>& tables, const std::vector<BagsView>& bags,
                int64_t batch, int rank) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const BagsView& b = bags[t];
    const int64_t rows = tables[t].spec.rows;
    for (int64_t r = 0; r < batch; ++r) {
      DLREC_CHECK(b.offsets[r] <= b.offsets[r + 1], "table '", tables[t].spec.name,
                  "': offsets decrease at sample ", r, " of rank ", rank);
      for (int64_t p = b.offsets[r]; p < b.offsets[r + 1]; ++p)
        if (b.indices[p] < 0 || b.indices[p] >= rows)
          fail("table '", tables[t].spec.name, "': id ", b.indices[p], " of sample ", r,
               " on rank ", rank, " is out of range [0, ", rows, ")");
    }
  }
}

}  // namespace

detail::Piece detail::piece_of(const Plan& plan, const std::vector<ShardedTableConfig>& tables,
                               int t, int rank) {
  const TablePlan& tp = plan.tables[t];
  for (const Shard& s : tp.shards)
    if (s.rank == rank) {
      Piece p;
      p.row_wise = tp.kind == ShardingKind::RowWise || tp.kind == ShardingKind::Hybrid;
      p.rank = rank;
      p.ranks = plan.ranks;
      p.row_base = tp.kind == ShardingKind::Hybrid ? tp.frequent_rows : 0;
      p.local_rows = p.row_wise ? row_wise_rows(tables[t].spec.rows - p.row_base, rank, plan.ranks)
                                : tables[t].spec.rows;
      p.c0 = s.col_begin;
      p.c1 = s.col_end;
      return p;
    }
  fail("sharding: table '", tables[t].spec.name, "' has no shard on rank ", rank);
}

void accumulate_sparse_grad(const int64_t* offsets, const int64_t* indices, int64_t samples,
                            const float* dout, int64_t stride, int64_t dim, nn::SparseGrad& out) {
  out.dim = dim;
  out.ids.clear();
  out.values.clear();
  std::unordered_map<int64_t, int64_t> slot;
  for (int64_t r = 0; r < samples; ++r) {
    const float* g = dout + r * stride;
    for (int64_t p = offsets[r]; p < offsets[r + 1]; ++p) {
      auto [it, fresh] = slot.emplace(indices[p], static_cast<int64_t>(out.ids.size()));
      if (fresh) {
        out.ids.push_back(indices[p]);
        out.values.resize(out.values.size() + dim, 0.f);
      }
      float* gr = out.values.data() + it->second * dim;
      for (int64_t k = 0; k < dim; ++k) gr[k] += 1.f * g[k];  // as EmbeddingBag: s * g, s = 1
    }
  }
}

// This rank's part of the tables and the state of the current step.
struct ShardedEmbedding::Local {
  // A shard this rank holds of a table sharded over ranks (table_wise, row_wise, column_wise,
  // hybrid's rare rows).
  struct Owned {
    int table = 0;
    int64_t rows = 0, c0 = 0, c1 = 0;
    std::unique_ptr<nn::EmbeddingBag> bag;  // sum pooling; null for a row-wise shard of 0 rows
    std::vector<float> pooled;              // [global batch, c1 - c0]
    const nn::SparseGrad* grad = nullptr;   // of the last backward
    int64_t cols() const { return c1 - c0; }
  };
  // served[d]: the sharded tables rank d holds a shard of (ascending), with that shard's columns.
  // sparse (hybrid): pooled rows and their gradients travel only for the bags that sent the
  // shard at least one id (a bag of frequent ids only costs no exchange); else for every bag.
  struct Served {
    int table;
    int64_t c0, c1;
    bool sparse;
  };
  // The replicated prefix [0, rows) of a hybrid table.
  struct Frequent {
    int table = 0;
    int64_t rows = 0;
    std::unique_ptr<nn::EmbeddingBag> bag;  // [rows, dim]; null when rows = 0
    std::vector<int64_t> off, idx;          // the last training forward's local frequent ids
    nn::SparseGrad grad;
    bool have_grad = false;
  };
  std::vector<std::vector<Served>> served;
  std::vector<Owned> owned;  // this rank's shards, in the order of served[rank]
  std::vector<int> replicated;
  std::vector<std::unique_ptr<nn::EmbeddingBag>> rep_bags;  // per replicated table, whole
  std::vector<nn::SparseGrad> rep_grads;
  std::vector<char> rep_have_grad;
  std::vector<Frequent> frequent;

  // The last training forward.
  bool have_batch = false;
  int64_t batch = 0;
  std::vector<int64_t> batches;               // every rank's batch
  std::vector<std::vector<float>> scale;      // per table, per local sample: 1 or 1/len (mean)
  std::vector<std::vector<int64_t>> rep_off;  // per replicated table: local bags from 0
  std::vector<std::vector<int64_t>> rep_idx;
  // Bag lengths sent to (lens, block of rank d at len_off[d]) and received from (rlens, block
  // of rank s at rlen_off[s]) the other ranks: one per bag of every served table in order.
  std::vector<int64_t> lens, len_off, rlens, rlen_off;

  ExchangeBytes bytes;  // sent by this rank since the last reset

  // Whether bag r of a served block with lengths `ln` travels.
  static bool travels(const int64_t* ln, int64_t r, bool sparse) { return !sparse || ln[r] > 0; }
  // Values received from rank d for this rank's `batch` bags of served[d].
  int64_t values_from(int d, int64_t batch) const {
    int64_t v = 0;
    for (size_t k = 0; k < served[d].size(); ++k) {
      const Served& sv = served[d][k];
      const int64_t* ln = lens.data() + len_off[d] + static_cast<int64_t>(k) * batch;
      for (int64_t r = 0; r < batch; ++r) v += travels(ln, r, sv.sparse) ? sv.c1 - sv.c0 : 0;
    }
    return v;
  }
  // Values this rank's shards exchange with rank s (its `bs` bags of every owned shard).
  int64_t values_with(int s, int me, int64_t bs) const {
    int64_t v = 0;
    for (size_t j = 0; j < owned.size(); ++j) {
      const int64_t* ln = rlens.data() + rlen_off[s] + static_cast<int64_t>(j) * bs;
      for (int64_t r = 0; r < bs; ++r)
        v += travels(ln, r, served[me][j].sparse) ? owned[j].cols() : 0;
    }
    return v;
  }
};

// The collectives of a step, counting the bytes this rank sends to the others.
void ShardedEmbedding::exchange(const void* send, const std::vector<int64_t>& scnt,
                                const std::vector<int64_t>& soff, void* recv,
                                const std::vector<int64_t>& rcnt, const std::vector<int64_t>& roff,
                                Elem type) {
  for (int d = 0; d < comm_.size(); ++d)
    if (d != comm_.rank())
      local_->bytes.all_to_all += scnt[d] * static_cast<int64_t>(elem_size(type));
  comm_.all_to_all_v(send, scnt, soff, recv, rcnt, roff, type);
}

void ShardedEmbedding::gather(const void* send, void* recv, const std::vector<int64_t>& counts,
                              Elem type) {
  local_->bytes.all_gather +=
      counts[comm_.rank()] * (comm_.size() - 1) * static_cast<int64_t>(elem_size(type));
  comm_.all_gather_v(send, recv, counts, type);
}

std::vector<int64_t> ShardedEmbedding::gather_counts(int64_t count) {
  local_->bytes.all_gather += 8 * (comm_.size() - 1);
  return comm_.all_gather_counts(count);
}

const ExchangeBytes& ShardedEmbedding::exchange_bytes() const { return local_->bytes; }
void ShardedEmbedding::reset_exchange_bytes() { local_->bytes = ExchangeBytes{}; }

int64_t ShardedEmbedding::frequent_rows(int t) const {
  return plan_.tables.at(t).kind == ShardingKind::Hybrid ? plan_.tables[t].frequent_rows : 0;
}

ShardedEmbedding::ShardedEmbedding(std::vector<ShardedTableConfig> tables, Plan plan,
                                   Communicator& comm)
    : tables_(std::move(tables)), plan_(std::move(plan)), comm_(comm), local_(new Local) {
  const int n = comm_.size(), me = comm_.rank();
  const int T = num_tables();
  DLREC_CHECK(plan_.ranks == n, "ShardedEmbedding: the plan is for ", plan_.ranks,
              " rank(s), the job has ", n);
  DLREC_CHECK(static_cast<int>(plan_.tables.size()) == T, "ShardedEmbedding: the plan has ",
              plan_.tables.size(), " tables, the model ", T);
  Local& L = *local_;
  L.served.assign(n, {});
  for (int t = 0; t < T; ++t) {
    const ShardedTableConfig& c = tables_[t];
    DLREC_CHECK(plan_.tables[t].name == c.spec.name, "ShardedEmbedding: table ", t, " is '",
                c.spec.name, "' but the plan's is '", plan_.tables[t].name, "'");
    DLREC_CHECK(c.spec.value_bytes == 4, "ShardedEmbedding: table '", c.spec.name,
                "' must be fp32 on the CPU (", c.spec.value_bytes, " bytes per value)");
    DLREC_CHECK(c.optimizer != nullptr, "ShardedEmbedding: table '", c.spec.name,
                "' has no optimizer");
    col_offset_.push_back(width_);
    width_ += c.spec.dim;
    const TablePlan& tp = plan_.tables[t];
    if (tp.kind == ShardingKind::Replicated) {
      L.replicated.push_back(t);
      L.rep_bags.push_back(
          std::make_unique<nn::EmbeddingBag>(c.spec.rows, c.spec.dim, nn::Pooling::Sum));
      continue;
    }
    DLREC_CHECK(tp.kind != ShardingKind::ColumnWise ||
                    c.optimizer->kind() != nn::OptimizerKind::RowWiseAdagrad,
                "ShardedEmbedding: table '", c.spec.name,
                "' is column_wise but rowwise_adagrad keeps one state value per whole row");
    const bool hybrid = tp.kind == ShardingKind::Hybrid;
    const int64_t f = hybrid ? tp.frequent_rows : 0;
    if (hybrid) {
      DLREC_CHECK(f >= 0 && f <= c.spec.rows, "ShardedEmbedding: hybrid table '", c.spec.name,
                  "' has frequent_rows ", f, ", out of [0, ", c.spec.rows, "]");
      DLREC_CHECK(static_cast<int>(tp.shards.size()) == n, "ShardedEmbedding: hybrid table '",
                  c.spec.name, "' needs a shard on each of the ", n, " ranks, the plan has ",
                  tp.shards.size());
      Local::Frequent fq;
      fq.table = t;
      fq.rows = f;
      if (f > 0) fq.bag = std::make_unique<nn::EmbeddingBag>(f, c.spec.dim, nn::Pooling::Sum);
      L.frequent.push_back(std::move(fq));
    }
    for (const Shard& s : tp.shards) {
      DLREC_CHECK(s.rank >= 0 && s.rank < n, "ShardedEmbedding: table '", c.spec.name,
                  "' has a shard on rank ", s.rank, " of ", n);
      DLREC_CHECK(!hybrid || (s.col_begin == 0 && s.col_end == c.spec.dim),
                  "ShardedEmbedding: hybrid table '", c.spec.name, "' is split by columns");
      L.served[s.rank].push_back({t, s.col_begin, s.col_end, hybrid});
      if (s.rank != me) continue;
      Local::Owned o;
      o.table = t;
      o.rows = tp.kind == ShardingKind::RowWise || hybrid ? row_wise_rows(c.spec.rows - f, me, n)
                                                          : c.spec.rows;
      o.c0 = s.col_begin;
      o.c1 = s.col_end;
      if (o.rows > 0)
        o.bag = std::make_unique<nn::EmbeddingBag>(o.rows, o.cols(), nn::Pooling::Sum);
      L.owned.push_back(std::move(o));
    }
  }
  L.rep_grads.resize(L.replicated.size());
  L.rep_have_grad.assign(L.replicated.size(), 0);
  for (int t = 0; t < T; ++t) load_table(t, Tensor(), Tensor());  // initial values and state
}

ShardedEmbedding::~ShardedEmbedding() = default;

// Values: as nn::EmbeddingBag::init(seed) gives them for the whole table, taken at the shard's
// rows and columns. `values` undefined: initialise; else copy from the whole table.
void ShardedEmbedding::load_table(int t, const Tensor& values, const Tensor& state) {
  const ShardedTableConfig& c = tables_[t];
  const int64_t rows = c.spec.rows, dim = c.spec.dim;
  const nn::Optimizer& opt = *c.optimizer;
  if (values.defined())
    DLREC_CHECK(values.dtype() == DType::F32 && values.ndim() == 2 && values.dim(0) == rows &&
                    values.dim(1) == dim,
                "ShardedEmbedding: table '", c.spec.name, "' loads values of shape ",
                values.ndim() == 2 ? values.dim(0) : -1, " x ",
                values.ndim() == 2 ? values.dim(1) : -1, ", expected ", rows, " x ", dim);
  const StateLayout sl(opt);
  if (state.defined())
    DLREC_CHECK(state.dtype() == DType::F32 && state.numel() == rows * sl.row(dim),
                "ShardedEmbedding: table '", c.spec.name, "' loads an optimizer state of ",
                state.numel(), " values, expected ", rows * sl.row(dim));
  auto fill = [&](nn::Param& p, const Piece& piece) {
    if (values.defined()) {
      detail::take_piece(values.data<float>(), p.value.data<float>(), piece, dim, false, sl);
    } else {
      const int64_t cols = piece.c1 - piece.c0;
      float* w = p.value.data<float>();
      const double a = std::sqrt(1.0 / static_cast<double>(rows));
      parallel_for(0, piece.local_rows, 1024, [&](int64_t lo, int64_t hi) {
        for (int64_t lr = lo; lr < hi; ++lr)
          for (int64_t k = 0; k < cols; ++k) {
            const auto i = static_cast<uint64_t>(piece.global_row(lr) * dim + piece.c0 + k);
            w[lr * cols + k] = static_cast<float>(-a + 2.0 * a * nn::uniform_at(c.seed, i));
          }
      });
    }
    opt.init_state(p);
    if (state.defined() && p.state.defined())
      detail::take_piece(state.data<float>(), p.state.data<float>(), piece, dim, true, sl);
  };
  Local& L = *local_;
  for (size_t i = 0; i < L.replicated.size(); ++i)
    if (L.replicated[i] == t) fill(L.rep_bags[i]->weight(), Piece{false, 0, 1, rows, 0, dim});
  for (Local::Owned& o : L.owned)
    if (o.table == t && o.bag)
      fill(o.bag->weight(), detail::piece_of(plan_, tables_, t, comm_.rank()));
  for (Local::Frequent& fq : L.frequent)
    if (fq.table == t && fq.bag) fill(fq.bag->weight(), detail::frequent_piece(fq.rows, dim));
}

void ShardedEmbedding::forward(const std::vector<BagsView>& bags, int64_t batch, float* out,
                               int64_t out_stride, bool training) {
  Local& L = *local_;
  const int n = comm_.size(), me = comm_.rank(), T = num_tables();
  L.have_batch = false;
  DLREC_CHECK(static_cast<int>(bags.size()) == T, "ShardedEmbedding::forward: ", bags.size(),
              " bag sets for ", T, " tables");
  DLREC_CHECK(batch >= 0, "ShardedEmbedding::forward: negative batch");
  // This rank's ids first: an owner could not say which sample an id came from.
  check_bags(tables_, bags, batch, me);
  L.batches = gather_counts(batch);
  L.batch = batch;
  int64_t global = 0;
  std::vector<int64_t> first(n);  // global index of each rank's first sample
  for (int s = 0; s < n; ++s) first[s] = global, global += L.batches[s];

  // 1. Bag lengths and ids to the ranks holding the rows (a hybrid table's ids >= F as a row
  // split of the ids from F: rank (id - F) % N, local row (id - F) / N; ids < F stay here).
  std::vector<int64_t> ids, len_cnt(n), id_cnt(n), id_off(n);
  L.lens.clear();
  L.len_off.assign(n, 0);
  for (int d = 0; d < n; ++d) {
    L.len_off[d] = static_cast<int64_t>(L.lens.size());
    id_off[d] = static_cast<int64_t>(ids.size());
    for (const Local::Served& sv : L.served[d]) {
      const BagsView& b = bags[sv.table];
      const ShardingKind kind = plan_.tables[sv.table].kind;
      const bool split = kind == ShardingKind::RowWise || kind == ShardingKind::Hybrid;
      const int64_t base = frequent_rows(sv.table);
      for (int64_t r = 0; r < batch; ++r) {
        int64_t cnt = 0;
        for (int64_t p = b.offsets[r]; p < b.offsets[r + 1]; ++p) {
          const int64_t id = b.indices[p] - base;
          if (id < 0 || (split && id % n != d)) continue;
          ids.push_back(split ? id / n : id);
          ++cnt;
        }
        L.lens.push_back(cnt);
      }
    }
    len_cnt[d] = static_cast<int64_t>(L.lens.size()) - L.len_off[d];
    id_cnt[d] = static_cast<int64_t>(ids.size()) - id_off[d];
  }
  const int64_t mine = static_cast<int64_t>(L.served[me].size());
  std::vector<int64_t> rlen_cnt(n);
  L.rlen_off.assign(n, 0);
  int64_t rlen_total = 0;
  for (int s = 0; s < n; ++s) {
    L.rlen_off[s] = rlen_total;
    rlen_cnt[s] = L.batches[s] * mine;
    rlen_total += rlen_cnt[s];
  }
  L.rlens.assign(rlen_total, 0);
  exchange(L.lens.data(), len_cnt, L.len_off, L.rlens.data(), rlen_cnt, L.rlen_off, Elem::I64);
  std::vector<int64_t> rid_cnt(n, 0), rid_off(n);
  int64_t rid_total = 0;
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < rlen_cnt[s]; ++i) rid_cnt[s] += L.rlens[L.rlen_off[s] + i];
    rid_off[s] = rid_total;
    rid_total += rid_cnt[s];
  }
  std::vector<int64_t> rids(rid_total);
  exchange(ids.data(), id_cnt, id_off, rids.data(), rid_cnt, rid_off, Elem::I64);

  // 2. Each shard pools the bags of the global batch, in rank order.
  std::vector<int64_t> cursor(rid_off);  // per source: its next unread id
  std::vector<int64_t> off, idx;
  for (int64_t j = 0; j < mine; ++j) {
    Local::Owned& o = L.owned[j];
    off.assign(1, 0);
    idx.clear();
    for (int s = 0; s < n; ++s) {
      const int64_t* ln = L.rlens.data() + L.rlen_off[s] + j * L.batches[s];
      for (int64_t r = 0; r < L.batches[s]; ++r) {
        idx.insert(idx.end(), rids.begin() + cursor[s], rids.begin() + cursor[s] + ln[r]);
        cursor[s] += ln[r];
        off.push_back(static_cast<int64_t>(idx.size()));
      }
    }
    o.pooled.assign(global * o.cols(), 0.f);
    if (o.bag) o.bag->forward(off.data(), idx.data(), global, o.pooled.data(), o.cols(), training);
  }
  pooled_back(first, out, out_stride);
  finish_forward(bags, batch, out, out_stride, training);
}

// 3. Pooled rows back to the ranks the samples belong to (of a sparse shard, only the bags that
// sent it ids); row-wise and hybrid partial sums are added in rank order.
void ShardedEmbedding::pooled_back(const std::vector<int64_t>& first, float* out,
                                   int64_t out_stride) {
  Local& L = *local_;
  const int n = comm_.size(), me = comm_.rank(), T = num_tables();
  const int64_t batch = L.batch;
  std::vector<float> send, recv;
  std::vector<int64_t> scnt(n), soff(n), rcnt(n), roff(n);
  for (int s = 0; s < n; ++s) {
    soff[s] = static_cast<int64_t>(send.size());
    for (size_t j = 0; j < L.owned.size(); ++j) {
      const Local::Owned& o = L.owned[j];
      const int64_t* ln = L.rlens.data() + L.rlen_off[s] + static_cast<int64_t>(j) * L.batches[s];
      for (int64_t r = 0; r < L.batches[s]; ++r) {
        if (!Local::travels(ln, r, L.served[me][j].sparse)) continue;
        const float* p = o.pooled.data() + (first[s] + r) * o.cols();
        send.insert(send.end(), p, p + o.cols());
      }
    }
    scnt[s] = static_cast<int64_t>(send.size()) - soff[s];
  }
  int64_t rtotal = 0;
  for (int d = 0; d < n; ++d) {
    roff[d] = rtotal;
    rcnt[d] = L.values_from(d, batch);
    rtotal += rcnt[d];
  }
  recv.resize(rtotal);
  exchange(send.data(), scnt, soff, recv.data(), rcnt, roff, Elem::F32);

  auto adds = [&](int t) {
    const ShardingKind k = plan_.tables[t].kind;
    return k == ShardingKind::RowWise || k == ShardingKind::Hybrid;
  };
  for (int t = 0; t < T; ++t)
    if (adds(t))
      for (int64_t r = 0; r < batch; ++r)
        std::memset(out + r * out_stride + col_offset_[t], 0, tables_[t].spec.dim * sizeof(float));
  for (int d = 0; d < n; ++d) {
    const float* p = recv.data() + roff[d];
    for (size_t k = 0; k < L.served[d].size(); ++k) {
      const Local::Served& sv = L.served[d][k];
      const int64_t cols = sv.c1 - sv.c0;
      const int64_t* ln = L.lens.data() + L.len_off[d] + static_cast<int64_t>(k) * batch;
      const bool add = adds(sv.table);
      for (int64_t r = 0; r < batch; ++r) {
        if (!Local::travels(ln, r, sv.sparse)) continue;
        float* o = out + r * out_stride + col_offset_[sv.table] + sv.c0;
        if (add) {
          for (int64_t c = 0; c < cols; ++c) o[c] += p[c];
        } else {
          std::memcpy(o, p, cols * sizeof(float));
        }
        p += cols;
      }
    }
  }
}

// Replicated tables, hybrid tables' frequent ids, mean pooling and what backward() needs.
void ShardedEmbedding::finish_forward(const std::vector<BagsView>& bags, int64_t batch, float* out,
                                      int64_t out_stride, bool training) {
  Local& L = *local_;
  const int T = num_tables();
  // Replicated tables pool locally.
  for (size_t i = 0; i < L.replicated.size(); ++i) {
    const int t = L.replicated[i];
    L.rep_bags[i]->forward(bags[t].offsets, bags[t].indices, batch, out + col_offset_[t],
                           out_stride, false);
  }
  // A hybrid table's frequent ids are added to the partial sums of its rare ones (and kept, by
  // a training forward, for backward()).
  for (Local::Frequent& fq : L.frequent) {
    const BagsView& b = bags[fq.table];
    const int64_t dim = tables_[fq.table].spec.dim;
    const float* w = fq.bag ? fq.bag->weight().value.data<float>() : nullptr;
    if (training) {
      fq.off.assign(1, 0);
      fq.idx.clear();
    }
    for (int64_t r = 0; r < batch; ++r) {
      float* o = out + r * out_stride + col_offset_[fq.table];
      for (int64_t p = b.offsets[r]; p < b.offsets[r + 1]; ++p) {
        const int64_t id = b.indices[p];
        if (id >= fq.rows) continue;
        for (int64_t k = 0; k < dim; ++k) o[k] += w[id * dim + k];
        if (training) fq.idx.push_back(id);
      }
      if (training) fq.off.push_back(static_cast<int64_t>(fq.idx.size()));
    }
  }
  // Mean pooling, as nn::EmbeddingBag applies it (after the sum, for bags of two ids or more).
  L.scale.assign(T, {});
  for (int t = 0; t < T; ++t) {
    if (tables_[t].pooling != nn::Pooling::Mean) continue;
    L.scale[t].assign(batch, 1.f);
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t len = bags[t].offsets[r + 1] - bags[t].offsets[r];
      if (len > 0) L.scale[t][r] = 1.f / static_cast<float>(len);
      if (len <= 1) continue;
      float* o = out + r * out_stride + col_offset_[t];
      for (int64_t k = 0; k < tables_[t].spec.dim; ++k) o[k] *= L.scale[t][r];
    }
  }
  if (!training) return;
  L.rep_off.assign(L.replicated.size(), {});
  L.rep_idx.assign(L.replicated.size(), {});
  for (size_t i = 0; i < L.replicated.size(); ++i) {
    const BagsView& b = bags[L.replicated[i]];
    const int64_t base = batch > 0 ? b.offsets[0] : 0;
    for (int64_t r = 0; r <= batch; ++r) L.rep_off[i].push_back(b.offsets[r] - base);
    L.rep_idx[i].assign(b.indices + base, b.indices + base + L.rep_off[i].back());
  }
  L.have_batch = true;
}

void ShardedEmbedding::backward(const float* dout, int64_t dout_stride) {
  Local& L = *local_;
  DLREC_CHECK(L.have_batch, "ShardedEmbedding::backward needs a training forward first");
  const int n = comm_.size(), me = comm_.rank();
  const int64_t batch = L.batch;
  // The gradient row of sample r of table t, columns [c0, c1), with mean pooling's scale.
  auto grad_row = [&](int t, int64_t r, int64_t c0, int64_t c1, std::vector<float>& dst) {
    const float* g = dout + r * dout_stride + col_offset_[t];
    const float s = L.scale[t].empty() ? 1.f : L.scale[t][r];
    for (int64_t k = c0; k < c1; ++k) dst.push_back(s * g[k]);
  };
  // 4. Gradients of the pooled rows to the shards' owners (the rows that came back forward).
  std::vector<float> send;
  std::vector<int64_t> scnt(n), soff(n), rcnt(n), roff(n);
  for (int d = 0; d < n; ++d) {
    soff[d] = static_cast<int64_t>(send.size());
    for (size_t k = 0; k < L.served[d].size(); ++k) {
      const Local::Served& sv = L.served[d][k];
      const int64_t* ln = L.lens.data() + L.len_off[d] + static_cast<int64_t>(k) * batch;
      for (int64_t r = 0; r < batch; ++r)
        if (Local::travels(ln, r, sv.sparse)) grad_row(sv.table, r, sv.c0, sv.c1, send);
    }
    scnt[d] = static_cast<int64_t>(send.size()) - soff[d];
  }
  int64_t rtotal = 0, global = 0;
  for (int s = 0; s < n; ++s) {
    roff[s] = rtotal;
    rcnt[s] = L.values_with(s, me, L.batches[s]);
    rtotal += rcnt[s];
    global += L.batches[s];
  }
  std::vector<float> recv(rtotal);
  exchange(send.data(), scnt, soff, recv.data(), rcnt, roff, Elem::F32);
  std::vector<const float*> from(n);  // per source: its next unread gradient row
  for (int s = 0; s < n; ++s) from[s] = recv.data() + roff[s];
  std::vector<float> g;
  for (size_t j = 0; j < L.owned.size(); ++j) {
    Local::Owned& o = L.owned[j];
    const int64_t cols = o.cols();
    g.assign(global * cols, 0.f);  // a bag that sent no id here has no gradient here
    int64_t row = 0;
    for (int s = 0; s < n; ++s) {
      const int64_t* ln = L.rlens.data() + L.rlen_off[s] + static_cast<int64_t>(j) * L.batches[s];
      for (int64_t r = 0; r < L.batches[s]; ++r, ++row) {
        if (!Local::travels(ln, r, L.served[me][j].sparse)) continue;
        std::memcpy(g.data() + row * cols, from[s], cols * sizeof(float));
        from[s] += cols;
      }
    }
    o.grad = o.bag ? &o.bag->backward(g.data(), cols) : nullptr;
  }
  frequent_backward(dout, dout_stride);
  replicated_backward(dout, dout_stride);
}

// Hybrid tables' frequent rows: every rank sums its samples' gradients into a dense [F, dim + 1]
// block (the last column counts the lookups, so that exactly the rows looked up in the global
// batch are updated, as one process does); one all-reduce makes it the global sum on every
// rank. Dense rather than sparse: its size is F rows whatever the batch, the cost the planner
// weighs against the exchange those lookups would need; a sparse gather would grow with the
// batch like the replicated kind's.
void ShardedEmbedding::frequent_backward(const float* dout, int64_t dout_stride) {
  Local& L = *local_;
  const int n = comm_.size();
  for (Local::Frequent& fq : L.frequent) {
    fq.have_grad = false;
    if (fq.rows == 0) continue;
    const int t = fq.table;
    const int64_t dim = tables_[t].spec.dim, w = dim + 1;
    std::vector<float> sum(fq.rows * w, 0.f);
    for (int64_t r = 0; r < L.batch; ++r) {
      const float* g = dout + r * dout_stride + col_offset_[t];
      const float s = L.scale[t].empty() ? 1.f : L.scale[t][r];
      for (int64_t p = fq.off[r]; p < fq.off[r + 1]; ++p) {
        float* row = sum.data() + fq.idx[p] * w;
        for (int64_t k = 0; k < dim; ++k) row[k] += 1.f * (s * g[k]);
        row[dim] += 1.f;
      }
    }
    L.bytes.all_reduce += 2 * (n - 1) * fq.rows * w * 4 / n;  // a ring all-reduce's share
    comm_.all_reduce(sum.data(), fq.rows * w, Elem::F32);
    fq.grad.dim = dim;
    fq.grad.ids.clear();
    fq.grad.values.clear();
    for (int64_t id = 0; id < fq.rows; ++id) {
      const float* row = sum.data() + id * w;
      if (row[dim] == 0.f) continue;
      fq.grad.ids.push_back(id);
      fq.grad.values.insert(fq.grad.values.end(), row, row + dim);
    }
    fq.have_grad = true;
  }
}

// Replicated tables: every rank's bags and gradients, so that all compute the global one.
void ShardedEmbedding::replicated_backward(const float* dout, int64_t dout_stride) {
  Local& L = *local_;
  const int n = comm_.size();
  const int64_t batch = L.batch;
  if (L.replicated.empty()) return;
  int64_t global = 0;
  for (int64_t b : L.batches) global += b;
  std::vector<int64_t> lens, ids;
  std::vector<float> grads;
  int64_t rep_width = 0;
  for (size_t i = 0; i < L.replicated.size(); ++i) {
    const int t = L.replicated[i];
    rep_width += tables_[t].spec.dim;
    const float* g0 = dout + col_offset_[t];
    for (int64_t r = 0; r < batch; ++r) {
      lens.push_back(L.rep_off[i][r + 1] - L.rep_off[i][r]);
      const float s = L.scale[t].empty() ? 1.f : L.scale[t][r];
      for (int64_t k = 0; k < tables_[t].spec.dim; ++k)
        grads.push_back(s * g0[r * dout_stride + k]);
    }
    ids.insert(ids.end(), L.rep_idx[i].begin(), L.rep_idx[i].end());
  }
  const int64_t R = static_cast<int64_t>(L.replicated.size());
  std::vector<int64_t> len_counts(n), grad_counts(n);
  for (int s = 0; s < n; ++s) {
    len_counts[s] = L.batches[s] * R;
    grad_counts[s] = L.batches[s] * rep_width;
  }
  const std::vector<int64_t> id_counts = gather_counts(static_cast<int64_t>(ids.size()));
  std::vector<int64_t> all_lens(global * R), all_ids;
  int64_t total_ids = 0;
  for (int64_t c : id_counts) total_ids += c;
  all_ids.resize(total_ids);
  std::vector<float> all_grads(global * rep_width);
  gather(lens.data(), all_lens.data(), len_counts, Elem::I64);
  gather(ids.data(), all_ids.data(), id_counts, Elem::I64);
  gather(grads.data(), all_grads.data(), grad_counts, Elem::F32);
  // Per table, the global bags and gradient rows in rank order.
  std::vector<int64_t> id_cursor(n), len_base(n), grad_base(n);
  for (int64_t s = 0, li = 0, gi = 0, ii = 0; s < n; ++s) {
    len_base[s] = li, grad_base[s] = gi, id_cursor[s] = ii;
    li += len_counts[s], gi += grad_counts[s], ii += id_counts[s];
  }
  int64_t dim_before = 0;
  for (size_t i = 0; i < L.replicated.size(); ++i) {
    const int64_t dim = tables_[L.replicated[i]].spec.dim;
    std::vector<int64_t> off(1, 0), idx;
    std::vector<float> gg;
    gg.reserve(global * dim);
    for (int s = 0; s < n; ++s) {
      const int64_t B = L.batches[s];
      const int64_t* ln = all_lens.data() + len_base[s] + static_cast<int64_t>(i) * B;
      for (int64_t r = 0; r < B; ++r) {
        idx.insert(idx.end(), all_ids.begin() + id_cursor[s],
                   all_ids.begin() + id_cursor[s] + ln[r]);
        id_cursor[s] += ln[r];
        off.push_back(static_cast<int64_t>(idx.size()));
      }
      const float* gs = all_grads.data() + grad_base[s] + dim_before * B;
      gg.insert(gg.end(), gs, gs + B * dim);
    }
    accumulate_sparse_grad(off.data(), idx.data(), global, gg.data(), dim, dim, L.rep_grads[i]);
    L.rep_have_grad[i] = 1;
    dim_before += dim;
  }
}

void ShardedEmbedding::step(const std::vector<float>& lr) {
  Local& L = *local_;
  DLREC_CHECK(static_cast<int>(lr.size()) == num_tables(), "ShardedEmbedding::step: ", lr.size(),
              " learning rates for ", num_tables(), " tables");
  for (Local::Owned& o : L.owned) {
    if (o.grad) tables_[o.table].optimizer->step_sparse(o.bag->weight(), *o.grad, lr[o.table]);
    o.grad = nullptr;
  }
  for (Local::Frequent& fq : L.frequent) {
    if (fq.have_grad)
      tables_[fq.table].optimizer->step_sparse(fq.bag->weight(), fq.grad, lr[fq.table]);
    fq.have_grad = false;
  }
  for (size_t i = 0; i < L.replicated.size(); ++i) {
    if (!L.rep_have_grad[i]) continue;
    const int t = L.replicated[i];
    tables_[t].optimizer->step_sparse(L.rep_bags[i]->weight(), L.rep_grads[i], lr[t]);
    L.rep_have_grad[i] = 0;
  }
}

nn::Param& ShardedEmbedding::replicated_param(int t) {
  Local& L = *local_;
  for (size_t i = 0; i < L.replicated.size(); ++i)
    if (L.replicated[i] == t) return L.rep_bags[i]->weight();
  fail("ShardedEmbedding: table '", tables_[t].spec.name, "' is not replicated");
}

nn::Param* ShardedEmbedding::frequent_param(int t) {
  for (Local::Frequent& fq : local_->frequent)
    if (fq.table == t && fq.bag) return &fq.bag->weight();
  return nullptr;
}

nn::Param* ShardedEmbedding::owned_param(int t) {
  for (Local::Owned& o : local_->owned)
    if (o.table == t && o.bag) return &o.bag->weight();
  return nullptr;
}

Tensor ShardedEmbedding::gather_table(int t, bool state) {
  DLREC_CHECK(t >= 0 && t < num_tables(), "ShardedEmbedding::gather_table: no table ", t);
  Local& L = *local_;
  const ShardedTableConfig& c = tables_[t];
  const nn::Optimizer& opt = *c.optimizer;
  const int64_t rows = c.spec.rows, dim = c.spec.dim;
  if (state && !opt.has_state()) return Tensor();
  for (size_t i = 0; i < L.replicated.size(); ++i)
    if (L.replicated[i] == t) {
      const nn::Param& p = L.rep_bags[i]->weight();
      return (state ? p.state : p.value).clone();
    }
  const int n = comm_.size();
  const StateLayout sl(opt);
  std::vector<float> mine;  // this rank's piece (of a hybrid table: its rare rows)
  for (const Local::Owned& o : L.owned)
    if (o.table == t && o.bag) {
      const Tensor& x = state ? o.bag->weight().state : o.bag->weight().value;
      mine.assign(x.data<float>(), x.data<float>() + x.numel());
    }
  const std::vector<int64_t> counts = gather_counts(static_cast<int64_t>(mine.size()));
  std::vector<int64_t> base(n);
  int64_t total = 0;
  for (int s = 0; s < n; ++s) base[s] = total, total += counts[s];
  std::vector<float> all(total);
  gather(mine.data(), all.data(), counts, Elem::F32);
  Tensor full =
      Tensor::zeros(state ? detail::state_shape(opt, rows, dim) : Shape{rows, dim}, DType::F32);
  for (const Shard& s : plan_.tables[t].shards)
    detail::place_piece(full.data<float>(), all.data() + base[s.rank],
                        detail::piece_of(plan_, tables_, t, s.rank), dim, state, sl);
  for (const Local::Frequent& fq : L.frequent)  // the replicated prefix, the same on every rank
    if (fq.table == t && fq.bag) {
      const nn::Param& p = fq.bag->weight();
      detail::place_piece(full.data<float>(), (state ? p.state : p.value).data<float>(),
                          detail::frequent_piece(fq.rows, dim), dim, state, sl);
    }
  return full;
}

}  // namespace dlrec::dist
