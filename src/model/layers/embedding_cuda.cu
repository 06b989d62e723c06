// Layer "embedding" on CUDA (src/model/layers/embedding.cc).
#include "model/layers/embedding_dp_cuda.h"
#include "model/layers/graph_cuda_engine.h"
#include "model/layers/table_set_cuda.h"

namespace dlrec::model::gpu_graph {
namespace {

// The embedding layer. Hashed (`hashed` non-empty: one table's options per feature): before
// the pooling, the batch's keys are resolved to rows on the device (graph_hashed_cuda.h), which
// overwrites the step's row array; an evaluation forward pools with keys no table holds as zeros.
//
// Direct (write_into(): a concat is its only consumer, see GraphCuda::plan_direct_embedding):
// the pooled rows are written straight into the concat's columns [col, col + T * dim) (its
// row stride and type), and the backward reads its gradient from the same columns of the
// concat's gradient (bf16/f16 widened on load), so the layer has no buffers of its own and the
// concat neither copies nor splits it.
class EmbeddingNode final : public Node {
 public:
  EmbeddingNode(Engine& e, const std::string& name, const io::ShardLayout& layout, int64_t dim,
                bool mean, uint64_t seed, std::vector<hashed_cuda::TableOptions> hashed = {})
      : name_(name),
        mean_(mean),
        ts_(e, layout, dim, false, seed, capacities(hashed), /*defer=*/hashed.empty()) {
    if (hashed.empty()) return;
    hashed_ = std::make_unique<hashed_cuda::HashedTables>(std::move(hashed), dim, e.emb_adagrad,
                                                          e.emb_init_acc, e.dev, e.st);
    hashed_->bind(ts_.tab);
  }
  void alloc(Engine& e, int64_t cap) override {
    cap_ = cap;
    if (into_ < 0) alloc_value(e, cap);
  }
  // Data-parallel: the backward sorts the ids of the whole global batch (every rank's).
  void alloc_scratch(Engine& e, int64_t max_nnz) override {
    ts_.alloc_scratch(e, max_nnz * e.dp.ranks);
    if (hashed_) hashed_->alloc(max_nnz);
    if (e.dp.comm) alloc_exchange(e, max_nnz);
    tw_ = false;
    if (e.dp.comm && !e.dp.table_owner.empty()) alloc_table_wise(e, max_nnz);
  }
  void materialize(Engine& e, const std::vector<char>* keep) override { ts_.materialize(e, keep); }
  void write_into(int into, int64_t col) override {
    into_ = into;
    col_ = col;
  }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    if (tw_ && (e.dp.step || e.dp.collective)) {  // a sharded model pools on the owners
      forward_table_wise(e);
      return;
    }
    if (hashed_) {
      // The step's row array belongs to this step's inputs; only table layers read it, and a
      // hashed embedding layer is the only one (the constructor refuses a wide layer beside it).
      uint32_t* rows = const_cast<uint32_t*>(e.keys);
      hashed_->resolve(e.offsets, rows, e.B, e.nnz, e.st);
      if (!hashed_->training()) {
        if (v.dt == DType::BF16)
          hashed_->pool_eval(e.offsets, rows, e.B, mean_, static_cast<bf16*>(v.y.raw()), e.st);
        else
          hashed_->pool_eval(e.offsets, rows, e.B, mean_, v.y.data<float>(), e.st);
        return;
      }
    }
    // Direct: the concat's columns (same type: checked by the plan), else our own rows.
    const Value& o = into_ >= 0 ? e.vals[into_] : v;
    const int64_t col = into_ >= 0 ? col_ : 0;
    if (is_half(o.dt))
      with_half(o.dt, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, static_cast<H*>(o.y.raw()) + col, e.st,
                    o.ld);
      });
    else
      ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, o.y.data<float>() + col, e.st, o.ld);
  }
  // The id work now; the update now, or in fp16 once every gradient is checked (Engine::update;
  // the gradient read stays untouched until then).
  void backward(Engine& e) override {
    if (tw_ && e.dp.step) {
      backward_table_wise(e);
      return;
    }
    if (e.dp.comm) {
      backward_global(e);
      return;
    }
    ts_.ids(e);
    const Value& c = into_ >= 0 ? e.vals[into_] : e.vals[self];
    e.check_grad(c.g.raw(), c.gdt, e.B * c.ld);
    e.update(
        [this, &e] {
          if (into_ < 0) {
            ts_.apply(e, mean_, e.vals[self].g.data<float>(), e.vals[self].ld);
            return;
          }
          const Value& c = e.vals[into_];
          if (is_half(c.gdt))
            with_half(c.gdt, [&](auto* h) {
              using H = std::remove_pointer_t<decltype(h)>;
              ts_.apply(e, mean_, static_cast<const H*>(c.g.raw()) + col_, c.ld);
            });
          else
            ts_.apply(e, mean_, c.g.data<float>() + col_, c.ld);
        },
        true);
  }
  void collect(Engine&, std::vector<NamedState>&, std::vector<NamedState>& tables) override {
    ts_.collect(name_, tables);
  }
  const std::vector<uint32_t>& row_base() const { return ts_.row_base; }
  hashed_cuda::HashedTables* hashed() const override { return hashed_.get(); }
  const std::string& layer_name() const override { return name_; }
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    // The fused forward gathers fixed tables' rows (in direct mode into the concat's columns,
    // where the program form places this value too; the DLRM kernel never sees direct mode).
    if (hashed_) return p;
    p.kind = ServingParts::Kind::Embedding;
    p.tables = &ts_.tab;
    return p;
  }

 private:
  // Data-parallel (Engine::dp; fixed tables, no loss scaling: GraphCuda::set_gradient_reducer
  // refuses the others): every rank's offsets, keys and pooled-row gradients gathered in rank
  // order, the global batch's bags built from them, and the update of the whole global batch
  // applied on every rank. The ids and rows are those one GPU would see on the global batch,
  // in the same order, so the de-duplicated update sums the same values in the same order and
  // the replicas stay equal to one GPU's tables.
  const Value& grad_value(Engine& e) const { return into_ >= 0 ? e.vals[into_] : e.vals[self]; }
  void alloc_exchange(Engine& e, int64_t max_nnz) {
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
  void backward_global(Engine& e) {
    const DataParallel& d = e.dp;
    const int n = d.ranks;
    const int64_t T = ts_.tab.num_tables;
    const Value& gv = grad_value(e);
    std::vector<int64_t> off_counts, key_counts, grad_counts(n);
    const dp::RankGeometry geo = dp::gathered_geometry(d.rows, d.nnz, T, &off_counts, &key_counts);
    for (int r = 0; r < n; ++r) grad_counts[r] = d.rows[r] * gv.ld;
    e.on_comm("replicated-mode gathers", [&](dist::Communicator& c) {
      c.all_gather_v(e.offsets, off_in_.raw(), off_counts, dist::Elem::I32);
      c.all_gather_v(e.keys, keys_in_.raw(), key_counts, dist::Elem::I32);
      c.all_gather_v(gv.g.raw(), grad_g_.raw(), grad_counts, dist::elem_of(gv.gdt));
    });
    dp::build_global_bags(geo, off_in_.data<int32_t>(),
                          static_cast<const uint32_t*>(keys_in_.raw()), off_g_.data<int32_t>(),
                          static_cast<uint32_t*>(keys_g_.raw()), lens_.data<int32_t>(),
                          src_.data<int64_t>(), scan_.raw(), scan_bytes_, e.st);
    const int32_t* off = off_g_.data<int32_t>();
    ce::backward_ids(ts_.tab, off, static_cast<const uint32_t*>(keys_g_.raw()), d.global_rows,
                     d.global_nnz, ts_.key_bits, ts_.scratch, e.st);
    const int64_t col = into_ >= 0 ? col_ : 0;
    const ce::Update kind = e.emb_adagrad ? ce::Update::Adagrad : ce::Update::SGD;
    if (is_half(gv.gdt))
      with_half(gv.gdt, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        ce::backward_apply(ts_.tab, off, d.global_rows, d.global_nnz, mean_,
                           static_cast<const H*>(grad_g_.raw()) + col, gv.ld, kind, e.lr + 1,
                           e.emb_eps, ts_.scratch, e.st, e.gscale);
      });
    else
      ce::backward_apply(ts_.tab, off, d.global_rows, d.global_nnz, mean_,
                         grad_g_.data<float>() + col, gv.ld, kind, e.lr + 1, e.emb_eps, ts_.scratch,
                         e.st, e.gscale);
  }
  int64_t cap_ = 0;
  Tensor off_in_, keys_in_, off_g_, keys_g_, lens_, src_, scan_, grad_g_;
  // Table-wise sharding (Engine::dp.table_owner; docs/DISTRIBUTED.md, "Across GPUs"): each
  // table is pooled and updated by its owner only. Forward: every rank's offsets and ids of the
  // travelling tables are all-gathered (one block per rank), the owner builds its tables'
  // bags of the global batch in global row order, pools them into [G, K, dim] in the
  // activation's type and one all-to-all sends each rank its rows' pooled vectors, which it puts
  // into its columns. Backward: one all-to-all sends the pooled rows' gradients to the owners,
  // arriving as [G, K, dim] in global row order, and the owner runs the fused de-duplicated
  // update of its tables over the global batch: the ids, gradients and order one GPU has.
  // A GPU holds only the tables it owns (the others are never allocated: TableSet::materialize);
  // evaluation runs this exchange too (Engine::dp.collective), and checkpoints stream the
  // tables from their owners (GraphCuda::gather_sharded_tables).
  void alloc_table_wise(Engine& e, int64_t max_nnz) {
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
    }
    tw_count_.assign(n, 0);
    tw_first_.assign(n, 0);
    has_tw_ = false;
    for (int o : own) {
      DLREC_CHECK(o >= dp::kReplicatedOwner && o < n, "table-wise sharding: owner ", o, " of ", n,
                  " ranks (bug)");
      if (o >= 0) ++tw_count_[o], has_tw_ = true;
    }
    for (int r = 1; r < n; ++r) tw_first_[r] = tw_first_[r - 1] + tw_count_[r - 1];
    std::vector<int32_t> lay;  // table, first, count, index: one per table-wise table each
    std::vector<int32_t> table, first, count, index, mine;
    for (int r = 0; r < n; ++r)
      for (int64_t t = 0; t < T; ++t) {
        if (own[t] != r) continue;
        index.push_back(static_cast<int32_t>(table.size() - tw_first_[r]));
        table.push_back(static_cast<int32_t>(t));
        first.push_back(static_cast<int32_t>(tw_first_[r]));
        count.push_back(static_cast<int32_t>(tw_count_[r]));
        if (r == e.dp.rank) mine.push_back(static_cast<int32_t>(t));
      }
    for (auto* a : {&table, &first, &count, &index}) lay.insert(lay.end(), a->begin(), a->end());
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
    for (int32_t t : mine) mine_pos.push_back(static_cast<int32_t>(tv_pos_[t]));
    tw_K_ = static_cast<int64_t>(mine.size());
    tw_mine_.assign(mine.begin(), mine.end());
    std::vector<float*> wp, sp;
    std::vector<uint32_t> base;
    for (int32_t t : mine) {
      wp.push_back(ts_.tables[t].data<float>());
      if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
      base.push_back(ts_.row_base[t]);
    }
    auto upload = [&](const void* src, size_t bytes) {
      Tensor t = Tensor::empty({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8, e.dev);
      if (bytes) copy_bytes(t.raw(), e.dev, src, Device::cpu(), bytes);
      return t;
    };
    tw_layout_mem_ = upload(lay.data(), lay.size() * sizeof(int32_t));
    const auto* l = static_cast<const int32_t*>(tw_layout_mem_.raw());
    // The table-wise tables only (row-wise ones have no owner and are not in these arrays).
    const int64_t Ttw = static_cast<int64_t>(table.size());
    tw_layout_ = dp::TwLayout{l, l + Ttw, l + 2 * Ttw, l + 3 * Ttw, Ttw, dim};
    tw_tabs_ = upload(mine_pos.data(), mine_pos.size() * sizeof(int32_t));  // gathered order
    tv_sel_dev_ = upload(sel32.data(), sel32.size() * sizeof(int32_t));
    tw_ptrs_ = upload(wp.data(), wp.size() * sizeof(float*));
    tw_sptrs_ = upload(sp.data(), sp.size() * sizeof(float*));
    tw_base_ = upload(base.data(), base.size() * sizeof(uint32_t));
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
    tw_pool_ = Tensor::empty({one(G * tw_K_ * dim)}, act, e.dev);
    tw_recv_ = Tensor::empty({one(cap_ * T * dim)}, act, e.dev);
    tw_gsend_ = Tensor::empty({one(cap_ * T * dim)}, xdt_, e.dev);
    tw_grecv_ = Tensor::empty({one(G * tw_K_ * dim)}, xdt_, e.dev);
    // The ids' all-gather: one block [offsets | keys] per rank (forward_table_wise).
    const int64_t block = static_cast<int64_t>(tv_sel_.size()) * cap_ + 1 + max_nnz;
    ids_send_ = Tensor::empty({block}, DType::I32, e.dev);
    ids_in_ = Tensor::empty({n * block}, DType::I32, e.dev);
    alloc_row_wise(e, max_nnz);
    alloc_replicated(e, max_nnz);
  }
  // Replicated tables (Engine::dp.table_owner[t] == dp::kReplicatedOwner; docs/DISTRIBUTED.md,
  // "Replicated tables on the GPUs"): every GPU holds the whole table (the same values: one GPU's
  // initialisation, the same updates). Forward: each rank pools its own rows' bags of these
  // tables (no exchange). Backward: each rank turns its rows' pooled gradients into the table's
  // dense f32 gradient (the fused update's SGD with lr -1 on a zeroed gradient table: the same
  // de-duplicated, deterministic sums; a bf16 run rounds it to bf16, dp::round_dense), one
  // all-reduce sums them over the ranks, and every rank applies the optimizer to the elements
  // with a gradient (dp::dense_update; the f32 gradient is zero again for the next step). Costs
  // 2 (N - 1) / N x rows x dim x 4 (bf16: 2) bytes per rank and step instead of the exchange of
  // B x dim pooled rows and gradients: the planner's cost rule picks these tables.
  void alloc_replicated(Engine& e, int64_t max_nnz) {
    const int64_t T = ts_.tab.num_tables, dim = ts_.dim;
    rp_mine_.clear();
    for (int64_t t = 0; t < T; ++t)
      if (e.dp.table_owner[t] == dp::kReplicatedOwner) rp_mine_.push_back(t);
    rp_K_ = static_cast<int64_t>(rp_mine_.size());
    if (rp_K_ == 0) return;
    int64_t total = 0;
    for (int64_t t : rp_mine_) total += ts_.rows[t] * dim;
    rp_grad_ = e.buf({total}, DType::F32);  // zero: dense_update keeps it so between steps
    if (is_half(xdt_)) rp_grad16_ = Tensor::empty({total}, xdt_, e.dev);  // all-reduced in 16 bits
    std::vector<int32_t> table;
    std::vector<float*> wp, sp, gp;
    std::vector<uint32_t> base;
    int64_t at = 0;
    for (int64_t k = 0; k < rp_K_; ++k) {
      const int64_t t = rp_mine_[k];
      DLREC_CHECK(ts_.tables[t].defined() && ts_.tables[t].shape()[0] == ts_.rows[t],
                  "replicated table ", t, " is not allocated whole (bug)");
      table.push_back(static_cast<int32_t>(t));
      wp.push_back(ts_.tables[t].data<float>());
      if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
      gp.push_back(rp_grad_.data<float>() + at);
      base.push_back(ts_.row_base[t]);
      at += ts_.rows[t] * dim;
    }
    auto upload = [&](const void* src, size_t bytes) {
      Tensor x = Tensor::empty({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8, e.dev);
      if (bytes) copy_bytes(x.raw(), e.dev, src, Device::cpu(), bytes);
      return x;
    };
    rp_tabs_ = upload(table.data(), table.size() * sizeof(int32_t));
    rp_ptrs_ = upload(wp.data(), wp.size() * sizeof(float*));
    rp_sptrs_ = upload(sp.data(), sp.size() * sizeof(float*));
    rp_gptrs_ = upload(gp.data(), gp.size() * sizeof(float*));
    rp_base_ = upload(base.data(), base.size() * sizeof(uint32_t));
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
    rp_scratch_ = ce::carve(rp_scratch_mem_.raw(), one(max_nnz), ts_.key_bits,
                            static_cast<int>(dim));
    ce::prepare(rp_scratch_, e.st);
  }
  // This rank's rows' bags of the replicated tables (bag k * B + b), pooled straight into the
  // layer's columns (rp_sub_.col).
  template <class H>
  void forward_replicated(Engine& e, H* out, int64_t ld) {
    const int64_t T = ts_.tab.num_tables;
    rp_nnz_ = 0;
    for (int64_t t : rp_mine_) rp_nnz_ += e.dp.table_nnz[e.dp.rank * T + t];
    if (e.B == 0) return;
    dp::RankGeometry g;
    g.ranks = 1;
    g.tables = T;
    g.global_rows = e.B;
    g.rows[0] = e.B;
    g.row_begin[0] = g.off_begin[0] = g.key_begin[0] = 0;
    dp::build_table_bags(g, static_cast<const int32_t*>(rp_tabs_.raw()), rp_K_, e.offsets, e.keys,
                         rp_off_.data<int32_t>(), static_cast<uint32_t*>(rp_keys_.raw()),
                         lens_.data<int32_t>(), src_.data<int64_t>(), scan_.raw(), scan_bytes_,
                         e.st);
    ce::forward(rp_sub_, rp_off_.data<int32_t>(), static_cast<const uint32_t*>(rp_keys_.raw()), e.B,
                mean_, out, e.st, ld);
    // The backward's id work (it depends on the ids only), here beside the exchanges.
    if (e.dp.step && rp_nnz_ > 0)
      ce::backward_ids(rp_gtab_, rp_off_.data<int32_t>(),
                       static_cast<const uint32_t*>(rp_keys_.raw()), e.B, rp_nnz_, ts_.key_bits,
                       rp_scratch_, e.st);
  }
  // This rank's dense gradient of the replicated tables; the all-reduce that sums it over the
  // ranks is forked (rp_done_), replicated_apply joins it and applies it.
  template <class S>
  void replicated_grads(Engine& e, const S* grad, int64_t ld) {
    if (e.B > 0 && rp_nnz_ > 0) {
      ce::backward_apply(rp_gtab_, rp_off_.data<int32_t>(), e.B, rp_nnz_, mean_, grad, ld,
                         ce::Update::SGD, rp_minus_one_.data<float>(), 0.f, rp_scratch_, e.st,
                         nullptr);
    }
    e.sub("emb bwd: rp local grads");
    Tensor& x = is_half(xdt_) ? rp_grad16_ : rp_grad_;
    if (is_half(xdt_))
      with_half(xdt_, [&](auto* h) {
        dp::round_dense(rp_grad_.data<float>(), static_cast<decltype(h)>(x.raw()), x.numel(), e.st);
      });
    e.comm_fork("replicas all-reduce", rp_done_, [&](dist::Communicator& c) {
      c.all_reduce(x.raw(), x.numel(), dist::elem_of(xdt_));
    });
  }
  void replicated_apply(Engine& e) {
    const int64_t dim = ts_.dim;
    e.comm_join(rp_done_);
    int64_t at = 0;
    for (int64_t t : rp_mine_) {
      const int64_t n = ts_.rows[t] * dim;
      float* w = ts_.tables[t].data<float>();
      float* a = ts_.states.empty() ? nullptr : ts_.states[t].data<float>();
      if (is_half(xdt_))
        with_half(xdt_, [&](auto* h) {
          dp::dense_update(w, a, static_cast<decltype(h)>(rp_grad16_.raw()) + at, n, e.lr + 1,
                           e.emb_eps, e.st);
        });
      else
        dp::dense_update(w, a, rp_grad_.data<float>() + at, n, e.lr + 1, e.emb_eps, e.st);
      at += n;
    }
  }
  // Rank geometry of this step and the element counts of the pooled rows' all-to-all: what
  // this owner sends each rank (K * B_s * dim at K * R_s * dim) and receives from each owner
  // (K_o * B * dim at first_o * B * dim). The backward swaps the two.
  dp::RankGeometry geometry(const Engine& e, std::vector<int64_t>* off_counts,
                            std::vector<int64_t>* key_counts) const {
    const DataParallel& d = e.dp;
    const int64_t T = ts_.tab.num_tables;
    std::vector<int64_t> keys = d.nnz;
    if (compact_)
      for (int r = 0; r < d.ranks; ++r) {
        keys[r] = 0;
        for (int64_t t : tv_sel_) keys[r] += d.table_nnz[r * T + t];
      }
    return dp::gathered_geometry(d.rows, keys, static_cast<int64_t>(tv_sel_.size()),
                                 off_counts, key_counts);
  }
  void tw_counts(const Engine& e, std::vector<int64_t>* own_c, std::vector<int64_t>* own_o,
                 std::vector<int64_t>* peer_c, std::vector<int64_t>* peer_o) const {
    const DataParallel& d = e.dp;
    const int64_t dim = ts_.dim;
    own_c->assign(d.ranks, 0);
    own_o->assign(d.ranks, 0);
    peer_c->assign(d.ranks, 0);
    peer_o->assign(d.ranks, 0);
    int64_t R = 0;
    for (int s = 0; s < d.ranks; ++s) {
      (*own_c)[s] = tw_K_ * d.rows[s] * dim;
      (*own_o)[s] = tw_K_ * R * dim;
      (*peer_c)[s] = tw_count_[s] * e.B * dim;
      (*peer_o)[s] = tw_first_[s] * e.B * dim;
      R += d.rows[s];
    }
  }
  void forward_table_wise(Engine& e) {
    const DataParallel& d = e.dp;
    const int64_t T = ts_.tab.num_tables, dim = ts_.dim, G = d.global_rows;
    std::vector<int64_t> off_counts, key_counts, own_c, own_o, peer_c, peer_o;
    dp::RankGeometry geo = geometry(e, &off_counts, &key_counts);
    tw_counts(e, &own_c, &own_o, &peer_c, &peer_o);
    tw_nnz_ = 0;
    for (int r = 0; r < d.ranks; ++r)
      for (int64_t t : tw_mine_) tw_nnz_ += d.table_nnz[r * T + t];
    // One NCCL all-gather of every rank's block [offsets | keys], padded to the largest rank's
    // counts: rank r's gathered offsets and keys start at r * block and r * block + off_max.
    const int64_t off_max = *std::max_element(off_counts.begin(), off_counts.end());
    const int64_t key_max = *std::max_element(key_counts.begin(), key_counts.end());
    const int64_t block = off_max + key_max;
    for (int r = 0; r < d.ranks; ++r) {
      geo.off_begin[r] = r * block;
      geo.key_begin[r] = r * block + off_max;
    }
    // Overlap: the replicated tables pool (no exchange) while the ids are all-gathered, and
    // the owner's id sort for the backward (ids only) runs while the pooled rows travel.
    e.sub("emb fwd: (before)");
    int32_t* send = ids_send_.data<int32_t>();
    if (compact_) {  // only the travelling tables' ids
      dp::compact_ids(e.offsets, e.keys, e.B, tv_sel_,
                      static_cast<const int32_t*>(tv_sel_dev_.raw()),
                      d.table_nnz.data() + d.rank * T, send,
                      reinterpret_cast<uint32_t*>(send + off_max), e.st);
    } else {
      DLREC_CUDA_CHECK(cudaMemcpyAsync(send, e.offsets, off_counts[d.rank] * sizeof(int32_t),
                                       cudaMemcpyDeviceToDevice, e.st));
      if (key_counts[d.rank] > 0)
        DLREC_CUDA_CHECK(cudaMemcpyAsync(send + off_max, e.keys,
                                         key_counts[d.rank] * sizeof(uint32_t),
                                         cudaMemcpyDeviceToDevice, e.st));
    }
    e.comm_fork("ids all-gather", ids_done_, [&](dist::Communicator& c) {
      c.all_gather(send, ids_in_.raw(), block, dist::Elem::I32);
    });
    const int32_t* g_off = ids_in_.data<int32_t>();
    const auto* g_keys = reinterpret_cast<const uint32_t*>(g_off);
    const Value& o = into_ >= 0 ? e.vals[into_] : e.vals[self];
    const int64_t col = into_ >= 0 ? col_ : 0;
    auto run = [&](auto* h) {
      using H = std::remove_pointer_t<decltype(h)>;
      if (rp_K_ > 0) forward_replicated(e, static_cast<H*>(o.y.raw()) + col, o.ld);
      if (rp_K_ > 0) e.sub("emb fwd: replicated");
      e.comm_join(ids_done_);
      dp::build_table_bags(geo, static_cast<const int32_t*>(tw_tabs_.raw()), tw_K_, g_off, g_keys,
                           tw_off_.data<int32_t>(), static_cast<uint32_t*>(tw_keys_.raw()),
                           lens_.data<int32_t>(), src_.data<int64_t>(), scan_.raw(), scan_bytes_,
                           e.st);
      e.sub("emb fwd: tw bags");
      if (has_tw_) {
        if (tw_K_ > 0 && G > 0)
          ce::forward(tw_sub_, tw_off_.data<int32_t>(),
                      static_cast<const uint32_t*>(tw_keys_.raw()), G, mean_,
                      static_cast<H*>(tw_pool_.raw()), e.st, tw_K_ * dim);
        e.sub("emb fwd: tw pool");
        e.comm_fork("pooled all-to-all", a2a_done_, [&](dist::Communicator& c) {
          c.all_to_all_v(tw_pool_.raw(), own_c, own_o, tw_recv_.raw(), peer_c, peer_o,
                         dist::elem_of(o.dt));
        });
        if (e.dp.step && tw_K_ > 0 && G > 0 && tw_nnz_ > 0)
          ce::backward_ids(tw_sub_, tw_off_.data<int32_t>(),
                           static_cast<const uint32_t*>(tw_keys_.raw()), G, tw_nnz_,
                           ts_.key_bits, ts_.scratch, e.st);
        e.sub("emb fwd: tw ids (sort, for the backward)");
        e.comm_join(a2a_done_);
        dp::scatter_pooled(tw_layout_, e.B, static_cast<const H*>(tw_recv_.raw()),
                           static_cast<H*>(o.y.raw()) + col, o.ld, e.st);
        e.sub("emb fwd: tw scatter");
      }
      if (rw_K_ > 0)
        forward_row_wise(e, geo, g_off, g_keys, static_cast<H*>(o.y.raw()) + col, o.ld,
                         dist::elem_of(o.dt));
    };
    if (is_half(o.dt))
      with_half(o.dt, run);
    else
      run(static_cast<float*>(nullptr));
  }
  void backward_table_wise(Engine& e) {
    const DataParallel& d = e.dp;
    const int64_t dim = ts_.dim, G = d.global_rows;
    std::vector<int64_t> own_c, own_o, peer_c, peer_o;
    tw_counts(e, &own_c, &own_o, &peer_c, &peer_o);
    const Value& gv = grad_value(e);
    const int64_t col = into_ >= 0 ? col_ : 0;
    const ce::Update kind = e.emb_adagrad ? ce::Update::Adagrad : ce::Update::SGD;
    // S: the gradient's type, W: the exchange's (xdt_: S, or the 16-bit activation type for
    // an f32 gradient of a bf16/fp16 run, rounded while packing).
    auto run = [&](auto* s, auto* w) {
      using S = std::remove_pointer_t<decltype(s)>;
      using W = std::remove_pointer_t<decltype(w)>;
      const S* grad = static_cast<const S*>(gv.g.raw()) + col;
      // Overlap: the gradients' all-to-all first, the replicas' local gradient beside it, their
      // all-reduce beside the owner's update (its ids were sorted in the forward).
      e.sub("emb bwd: (before)");
      if (has_tw_) {
        pack_grads(tw_layout_, e.B, grad, gv.ld, static_cast<W*>(tw_gsend_.raw()), e.st);
        e.sub("emb bwd: tw pack");
        e.comm_fork("grad all-to-all", a2a_done_, [&](dist::Communicator& c) {
          c.all_to_all_v(tw_gsend_.raw(), peer_c, peer_o, tw_grecv_.raw(), own_c, own_o,
                         dist::elem_of(xdt_));
        });
      }
      if (rp_K_ > 0) replicated_grads(e, grad, gv.ld);
      if (rw_K_ > 0) backward_row_wise<S, W>(e, grad, gv.ld);
      if (has_tw_) {
        e.comm_join(a2a_done_);
        e.sub("emb bwd: tw all-to-all");
        if (tw_K_ > 0 && G > 0 && tw_nnz_ > 0)
          ce::backward_apply(tw_sub_, tw_off_.data<int32_t>(), G, tw_nnz_, mean_,
                             static_cast<const W*>(tw_grecv_.raw()), tw_K_ * dim, kind, e.lr + 1,
                             e.emb_eps, ts_.scratch, e.st, e.gscale);
        e.sub("emb bwd: tw apply");
      }
      if (rp_K_ > 0) replicated_apply(e);
      if (rp_K_ > 0) e.sub("emb bwd: replicated");
    };
    if (is_half(gv.gdt))
      with_half(gv.gdt, [&](auto* h) { run(h, h); });
    else if (is_half(xdt_))
      with_half(xdt_, [&](auto* h) { run(static_cast<float*>(nullptr), h); });
    else
      run(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
  }
  // The send blocks from the gradient's columns, rounded to 16 bits when W is (S is f32 then).
  template <class S, class W>
  static void pack_grads(const dp::TwLayout& l, int64_t B, const S* grad, int64_t ld, W* send,
                         cudaStream_t st) {
    if constexpr (std::is_same_v<S, W>) {
      dp::gather_grads(l, B, grad, ld, send, st);
    } else {
      static_assert(std::is_same_v<S, float>, "only an f32 gradient is rounded");
      dp::gather_grads_rounded(l, B, grad, ld, send, st);
    }
  }
  // Row-wise sharding (Engine::dp.table_owner[t] == -1; docs/DISTRIBUTED.md, "Row-wise tables
  // on the GPUs"): every rank holds a contiguous range of the table's rows (TableSet::make_piece:
  // [lo, hi) and a zero outside row). Forward: from the all-gathered ids each rank builds the
  // bags of the whole global batch in a padded geometry (dp::build_row_bags: ids outside its
  // range go to the outside row), pools its partial sums [n * bmax, K, dim] with the fused
  // kernel and one reduce-scatter (sum) leaves each rank the pooled rows of its own samples.
  // Backward: the pooled rows' gradients of these tables are all-gathered, and each rank runs
  // the fused de-duplicated update of its range over the global batch (the outside row takes
  // the other ranges' ids' updates and is zeroed again after).
  void alloc_row_wise(Engine& e, int64_t max_nnz) {
    const int n = e.dp.ranks;
    const int64_t T = ts_.tab.num_tables, dim = ts_.dim;
    std::vector<int64_t> info;
    std::vector<int32_t> table, first, count, index;
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
      table.push_back(static_cast<int32_t>(t));
      first.push_back(0);
      count.push_back(static_cast<int32_t>(rw_K_));
      index.push_back(static_cast<int32_t>(k));
      wp.push_back(ts_.tables[t].data<float>());
      if (!ts_.states.empty()) sp.push_back(ts_.states[t].data<float>());
    }
    rw_key_bits_ = 1;
    while (rw_key_bits_ < 32 && (uint64_t{1} << rw_key_bits_) < total) ++rw_key_bits_;
    auto upload = [&](const void* src, size_t bytes) {
      Tensor x = Tensor::empty({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8, e.dev);
      if (bytes) copy_bytes(x.raw(), e.dev, src, Device::cpu(), bytes);
      return x;
    };
    rw_info_ = upload(info.data(), info.size() * sizeof(int64_t));
    rw_rl_ = dp::RwLayout{static_cast<const int64_t*>(rw_info_.raw()), rw_K_};
    std::vector<int32_t> lay;
    for (auto* a : {&table, &first, &count, &index}) lay.insert(lay.end(), a->begin(), a->end());
    rw_layout_mem_ = upload(lay.data(), lay.size() * sizeof(int32_t));
    const auto* l = static_cast<const int32_t*>(rw_layout_mem_.raw());
    rw_layout_ = dp::TwLayout{l, l + rw_K_, l + 2 * rw_K_, l + 3 * rw_K_, rw_K_, dim};
    rw_ptrs_ = upload(wp.data(), wp.size() * sizeof(float*));
    rw_sptrs_ = upload(sp.data(), sp.size() * sizeof(float*));
    rw_base_ = upload(local_base.data(), local_base.size() * sizeof(uint32_t));
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
  // The padded geometry's rows per rank this step: the most rows of any rank.
  static int64_t padded_rows(const DataParallel& d) {
    return d.rows.empty() ? 0 : *std::max_element(d.rows.begin(), d.rows.end());
  }
  template <class H>
  void forward_row_wise(Engine& e, const dp::RankGeometry& geo, const int32_t* g_off,
                        const uint32_t* g_keys, H* out, int64_t ld, dist::Elem el) {
    const DataParallel& d = e.dp;
    const int64_t T = ts_.tab.num_tables, dim = ts_.dim, bmax = padded_rows(d);
    if (bmax == 0) return;  // no rank has rows (the same on every rank)
    const int64_t Gp = d.ranks * bmax;
    rw_nnz_ = 0;
    for (int r = 0; r < d.ranks; ++r)
      for (int64_t t : rw_mine_) rw_nnz_ += d.table_nnz[r * T + t];
    dp::build_row_bags(geo, bmax, rw_rl_, g_off, g_keys, rw_off_.data<int32_t>(),
                       static_cast<uint32_t*>(rw_keys_.raw()), lens_.data<int32_t>(),
                       src_.data<int64_t>(), scan_.raw(), scan_bytes_, e.st);
    e.sub("emb fwd: rw bags");
    ce::forward(rw_sub_, rw_off_.data<int32_t>(), static_cast<const uint32_t*>(rw_keys_.raw()), Gp,
                mean_, static_cast<H*>(rw_pool_.raw()), e.st, rw_K_ * dim);
    e.sub("emb fwd: rw pool");
    e.on_comm("row-wise reduce-scatter", [&](dist::Communicator& c) {
      c.reduce_scatter(rw_pool_.raw(), rw_recv_.raw(), bmax * rw_K_ * dim, el);
    });
    e.sub("emb fwd: rw reduce-scatter");
    dp::scatter_pooled(rw_layout_, e.B, static_cast<const H*>(rw_recv_.raw()), out, ld, e.st);
  }
  // S: the gradient's type, W: the exchange's (backward_table_wise).
  template <class S, class W>
  void backward_row_wise(Engine& e, const S* grad, int64_t ld) {
    const DataParallel& d = e.dp;
    const int64_t dim = ts_.dim, bmax = padded_rows(d);
    if (bmax == 0) return;
    const int64_t Gp = d.ranks * bmax;
    pack_grads(rw_layout_, e.B, grad, ld, static_cast<W*>(rw_gsend_.raw()), e.st);
    e.on_comm("row-wise grad all-gather", [&](dist::Communicator& c) {
      c.all_gather(rw_gsend_.raw(), rw_grecv_.raw(), bmax * rw_K_ * dim, dist::elem_of(xdt_));
    });
    e.sub("emb bwd: rw pack+all-gather");
    if (rw_nnz_ == 0) return;
    const ce::Update kind = e.emb_adagrad ? ce::Update::Adagrad : ce::Update::SGD;
    const int32_t* off = rw_off_.data<int32_t>();
    ce::backward_ids(rw_sub_, off, static_cast<const uint32_t*>(rw_keys_.raw()), Gp, rw_nnz_,
                     rw_key_bits_, rw_scratch_, e.st);
    e.sub("emb bwd: rw ids (sort)");
    ce::backward_apply(rw_sub_, off, Gp, rw_nnz_, mean_, static_cast<const W*>(rw_grecv_.raw()),
                       rw_K_ * dim, kind, e.lr + 1, e.emb_eps, rw_scratch_, e.st, e.gscale);
    // The outside rows took the other ranges' updates: zero again (values; the accumulator of
    // an outside row is never read for a real row).
    for (int64_t k = 0; k < rw_K_; ++k)
      DLREC_CUDA_CHECK(
          cudaMemsetAsync(ts_.tables[rw_mine_[k]].data<float>() + rw_local_rows_[k] * dim, 0,
                          sizeof(float) * dim, e.st));
    e.sub("emb bwd: rw apply");
  }
  dp::RwLayout rw_rl_;
  dp::TwLayout rw_layout_;
  ce::Tables rw_sub_;
  ce::Scratch rw_scratch_;
  int64_t rw_K_ = 0, rw_nnz_ = 0;
  int rw_key_bits_ = 1;
  std::vector<int64_t> rw_mine_, rw_local_rows_;  // row-wise tables; their pieces' real rows
  Tensor rw_info_, rw_layout_mem_, rw_ptrs_, rw_sptrs_, rw_base_, rw_scratch_mem_;
  Tensor rw_off_, rw_keys_, rw_pool_, rw_recv_, rw_gsend_, rw_grecv_;
  bool has_tw_ = false;  // some table is table-wise (its all-to-alls run)

  // Replicated tables (alloc_replicated).
  int64_t rp_K_ = 0, rp_nnz_ = 0;
  std::vector<int64_t> rp_mine_;
  Tensor rp_grad_, rp_grad16_, rp_tabs_, rp_ptrs_, rp_sptrs_, rp_gptrs_, rp_base_;
  Tensor rp_off_, rp_keys_, rp_minus_one_;
  ce::Tables rp_sub_, rp_gtab_;
  ce::Scratch rp_scratch_;
  Tensor rp_scratch_mem_;
  // The tables whose ids are all-gathered (not replicated; alloc_table_wise), their positions
  // in the gathered layout (-1: replicated); compact_: some table stays home (compact_ids).
  std::vector<int64_t> tv_sel_, tv_pos_;
  bool compact_ = false;
  Tensor tv_sel_dev_, ids_send_, ids_in_;
  // The forked collectives' ends (Engine::comm_fork): ids all-gather, an all-to-all, the
  // replicas' all-reduce.
  gpu::Event ids_done_, a2a_done_, rp_done_;

  bool tw_ = false;
  DType xdt_ = DType::F32;         // the gradients' type in the exchange (alloc_table_wise)
  int64_t tw_K_ = 0, tw_nnz_ = 0;  // tables this rank owns; their ids this step
  std::vector<int64_t> tw_count_, tw_first_;  // per rank: tables owned, first position
  std::vector<int64_t> tw_mine_;              // the tables this rank owns
  Tensor tw_layout_mem_, tw_tabs_, tw_ptrs_, tw_sptrs_, tw_base_;
  Tensor tw_off_, tw_keys_, tw_pool_, tw_recv_, tw_gsend_, tw_grecv_;
  ce::Tables tw_sub_;  // the owned tables (their global row keys as in the whole set)
  dp::TwLayout tw_layout_;
  size_t scan_bytes_ = 0;

  static std::vector<int64_t> capacities(const std::vector<hashed_cuda::TableOptions>& h) {
    std::vector<int64_t> c;
    for (const auto& o : h) c.push_back(o.capacity);
    return c;
  }
  std::string name_;
  bool mean_;
  TableSet ts_;
  std::unique_ptr<hashed_cuda::HashedTables> hashed_;
  int into_ = -1;    // direct: the concat value written into (else -1)
  int64_t col_ = 0;  // and the first of its columns
};

}  // namespace

std::unique_ptr<Node> make_embedding(Build& b) {
  const LayerSpec& s = b.spec;
  const int64_t T = static_cast<int64_t>(b.layout.cardinalities.size());
  // One width for all tables (LayerType::cuda_unsupported refused others).
  const int64_t dim = b.shape.fields.at(0);
  b.set_value(T * dim, false);
  b.v.fields.assign(T, dim);
  b.v.gdt = DType::F32;
  // Hashed: the CPU layer's table options (graph_model.cc): capacity clamped to the feature's
  // cardinality, seed per feature, init_scale or sqrt(1 / capacity).
  std::vector<hashed_cuda::TableOptions> hashed;
  if (s.hashed.on)
    for (int64_t f = 0; f < T; ++f) {
      hashed_cuda::TableOptions o;
      o.name = s.name + "." + std::to_string(f);
      o.capacity = std::min<int64_t>(s.hashed.capacity, b.layout.cardinalities[f]);
      o.seed = nn::derive_seed(b.seed, static_cast<uint64_t>(f));
      o.init_scale = static_cast<float>(s.hashed.init_scale >= 0
                                            ? s.hashed.init_scale
                                            : std::sqrt(1.0 / static_cast<double>(o.capacity)));
      hashed.push_back(std::move(o));
    }
  auto node = std::make_unique<EmbeddingNode>(b.e, s.name, b.layout, dim,
                                              nn::parse_pooling(s.pooling) == nn::Pooling::Mean,
                                              b.seed, std::move(hashed));
  b.embedding = node.get();
  b.row_base = &node->row_base();
  return node;
}

}  // namespace dlrec::model::gpu_graph
