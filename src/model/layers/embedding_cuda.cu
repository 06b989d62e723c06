// Layer "embedding" on CUDA (src/model/layers/embedding.cc): the class is in
// embedding_node_cuda.h; its steps here, its sharded paths' buffers in embedding_alloc_cuda.cu.
#include "model/layers/embedding_node_cuda.h"

namespace dlrec::model::gpu_graph {
namespace emb {

void EmbeddingNode::forward(Engine& e) {
  Value& v = e.vals[self];
  if (tw_ && (e.dp.step || e.dp.collective)) {  // a sharded model pools on the owners
    forward_table_wise(e);
    return;
  }
  if (hashed_) {
    // The step's row array belongs to this step's inputs; only table layers read it, and a
    // hashed embedding layer is the only one (the constructor refuses a wide layer beside it).
    uint32_t* rows = const_cast<uint32_t*>(e.keys);
    hashed_->resolve(e.offsets, rows, e.B, e.nnz, e.st, e.hashed_keys);
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
                  o.ld, ts_.order_scratch());
    });
  else
    ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, o.y.data<float>() + col, e.st, o.ld,
                ts_.order_scratch());
}

void EmbeddingNode::backward(Engine& e) {
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

ServingParts EmbeddingNode::serving_parts(Engine&) {
  ServingParts p;
  // The fused forward gathers fixed tables' rows (in direct mode into the concat's columns,
  // where the program form places this value too; the DLRM kernel never sees direct mode).
  if (hashed_) return p;
  p.kind = ServingParts::Kind::Embedding;
  p.tables = &ts_.tab;
  return p;
}

void EmbeddingNode::backward_global(Engine& e) {
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
  dp::build_global_bags(geo, off_in_.data<int32_t>(), static_cast<const uint32_t*>(keys_in_.raw()),
                        off_g_.data<int32_t>(), static_cast<uint32_t*>(keys_g_.raw()),
                        lens_.data<int32_t>(), src_.data<int64_t>(), scan_.raw(), scan_bytes_,
                        e.st);
  const int32_t* off = off_g_.data<int32_t>();
  ce::backward_ids(ts_.tab, off, static_cast<const uint32_t*>(keys_g_.raw()), d.global_rows,
                   d.global_nnz, ts_.key_bits, ts_.scratch, e.st);
  const int64_t col = into_ >= 0 ? col_ : 0;
  const ce::Update kind = e.emb_update();
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

template <class H>
void EmbeddingNode::forward_replicated(Engine& e, H* out, int64_t ld) {
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
                       lens_.data<int32_t>(), src_.data<int64_t>(), scan_.raw(), scan_bytes_, e.st,
                       rp_cap_.defined() ? static_cast<const uint32_t*>(rp_cap_.raw()) : nullptr);
  ce::forward(rp_sub_, rp_off_.data<int32_t>(), static_cast<const uint32_t*>(rp_keys_.raw()), e.B,
              mean_, out, e.st, ld);
}

// The replicas' backward id work (their ids sorted; it depends on the ids only), enqueued by
// forward_table_wise while the pooled rows travel.
void EmbeddingNode::replicated_ids(Engine& e) {
  if (e.dp.step && e.B > 0 && rp_nnz_ > 0)
    ce::backward_ids(rp_gtab_, rp_off_.data<int32_t>(),
                     static_cast<const uint32_t*>(rp_keys_.raw()), e.B, rp_nnz_, ts_.key_bits,
                     rp_scratch_, e.st);
}

template <class S>
void EmbeddingNode::replicated_grads(Engine& e, const S* grad, int64_t ld) {
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
  auto f = [&](dist::Communicator& c) { c.all_reduce(x.raw(), x.numel(), dist::elem_of(xdt_)); };
  if (!e.dp.dcomm) {
    e.comm_fork("replicas all-reduce", rp_done_, f);
    return;
  }
  // On the dense layers' communicator and stream (after the dense all-reduces and updates
  // enqueued there so far), beside the gradient all-to-all instead of queued after it on the
  // embedding's; every rank enqueues the same collectives on each communicator in the same
  // (host) order. rp_done_ is recorded there; replicated_apply joins it.
  e.dcomm_fork("replicas all-reduce", rp_done_, f);
}

void EmbeddingNode::forward_table_wise(Engine& e) {
  const DataParallel& d = e.dp;
  const int64_t T = ts_.tab.num_tables, G = d.global_rows;
  std::vector<int64_t> off_counts, key_counts, own_c, own_o, peer_c, peer_o;
  dp::RankGeometry geo = geometry(e, &off_counts, &key_counts);
  tw_counts(e, &own_c, &own_o, &peer_c, &peer_o);
  tw_nnz_ = 0;
  for (int r = 0; r < d.ranks; ++r)
    for (int64_t t : tw_mine_) tw_nnz_ += d.table_nnz[r * T + t];
  for (CwGroup& g : cw_) {
    g.nnz = 0;
    for (int r = 0; r < d.ranks; ++r)
      for (int64_t t : g.tables) g.nnz += d.table_nnz[r * T + t];
  }
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
  // the id sorts for the backward (ids only: the replicas' and the owner's) run while the
  // pooled rows travel.
  e.sub("emb fwd: (before)");
  int32_t* send = ids_send_.data<int32_t>();
  if (compact_) {  // only the travelling tables' ids
    dp::compact_ids(e.offsets, e.keys, e.B, tv_sel_, static_cast<const int32_t*>(tv_sel_dev_.raw()),
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
    if (hy_K_ > 0) hybrid_push<H>(e, geo, g_off, g_keys);
    dp::build_table_bags(geo, static_cast<const int32_t*>(tw_tabs_.raw()), tw_K_, g_off, g_keys,
                         tw_off_.data<int32_t>(), static_cast<uint32_t*>(tw_keys_.raw()),
                         lens_.data<int32_t>(), src_.data<int64_t>(), scan_.raw(), scan_bytes_,
                         e.st);
    // Each width group of this rank's column pieces: the bags of its tables (all their ids).
    for (CwGroup& g : cw_)
      dp::build_table_bags(geo, static_cast<const int32_t*>(g.tabs.raw()), g.K, g_off, g_keys,
                           g.off.data<int32_t>(), static_cast<uint32_t*>(g.keys.raw()),
                           lens_.data<int32_t>(), src_.data<int64_t>(), scan_.raw(), scan_bytes_,
                           e.st);
    e.sub("emb fwd: tw bags");
    if (has_tw_) {
      if (tw_K_ > 0 && G > 0)
        ce::forward(tw_sub_, tw_off_.data<int32_t>(), static_cast<const uint32_t*>(tw_keys_.raw()),
                    G, mean_, static_cast<H*>(tw_pool_.raw()), e.st, tw_row_);
      e.sub("emb fwd: tw pool");
      // The pieces pool into their columns of this rank's row (after its whole tables).
      for (const CwGroup& g : cw_)
        if (G > 0)
          ce::forward(g.sub, g.off.data<int32_t>(), static_cast<const uint32_t*>(g.keys.raw()), G,
                      mean_, static_cast<H*>(tw_pool_.raw()) + g.col, e.st, tw_row_);
      if (!cw_.empty()) e.sub("emb fwd: cw pool");
      e.comm_fork("pooled all-to-all", a2a_done_, [&](dist::Communicator& c) {
        c.all_to_all_v(tw_pool_.raw(), own_c, own_o, tw_recv_.raw(), peer_c, peer_o,
                       dist::elem_of(o.dt));
      });
      if (rp_K_ > 0) replicated_ids(e);
      if (e.dp.step && tw_K_ > 0 && G > 0 && tw_nnz_ > 0)
        ce::backward_ids(tw_sub_, tw_off_.data<int32_t>(),
                         static_cast<const uint32_t*>(tw_keys_.raw()), G, tw_nnz_, ts_.key_bits,
                         ts_.scratch, e.st);
      for (CwGroup& g : cw_)
        if (e.dp.step && G > 0 && g.nnz > 0)
          ce::backward_ids(g.sub, g.off.data<int32_t>(), static_cast<const uint32_t*>(g.keys.raw()),
                           G, g.nnz, ts_.key_bits, g.scratch, e.st);
      e.sub("emb fwd: tw ids (sort, for the backward)");
      e.comm_join(a2a_done_);
      dp::scatter_pooled(tw_layout_, e.B, static_cast<const H*>(tw_recv_.raw()),
                         static_cast<H*>(o.y.raw()) + col, o.ld, e.st);
      e.sub("emb fwd: tw scatter");
    } else if (rp_K_ > 0) {
      replicated_ids(e);
    }
    if (rw_K_ > 0)
      forward_row_wise(e, geo, g_off, g_keys, static_cast<H*>(o.y.raw()) + col, o.ld,
                       dist::elem_of(o.dt));
    if (hy_K_ > 0) hybrid_add(e, static_cast<H*>(o.y.raw()) + col, o.ld);
  };
  if (is_half(o.dt))
    with_half(o.dt, run);
  else
    run(static_cast<float*>(nullptr));
}

void EmbeddingNode::backward_table_wise(Engine& e) {
  const DataParallel& d = e.dp;
  const int64_t G = d.global_rows;
  std::vector<int64_t> own_c, own_o, peer_c, peer_o;
  tw_counts(e, &own_c, &own_o, &peer_c, &peer_o);
  const Value& gv = grad_value(e);
  const int64_t col = into_ >= 0 ? col_ : 0;
  const ce::Update kind = e.emb_update();
  // S: the gradient's type, W: the exchange's (xdt_: S, or the 16-bit activation type for
  // an f32 gradient of a bf16/fp16 run, rounded while packing).
  auto run = [&](auto* s, auto* w) {
    using S = std::remove_pointer_t<decltype(s)>;
    using W = std::remove_pointer_t<decltype(w)>;
    const S* grad = static_cast<const S*>(gv.g.raw()) + col;
    // Overlap: the gradients' all-to-all first, the replicas' local gradient beside it, their
    // all-reduce beside the owner's update (its ids were sorted in the forward).
    e.sub("emb bwd: (before)");
    if (hy_K_ > 0) hybrid_push_grads<S, W>(e, grad, gv.ld);
    if (has_tw_) {
      pack_grads(tw_layout_, e.B, grad, gv.ld, static_cast<W*>(tw_gsend_.raw()), e.st);
      e.sub("emb bwd: tw pack");
      e.comm_fork("grad all-to-all", a2a_done_, [&](dist::Communicator& c) {
        c.all_to_all_v(tw_gsend_.raw(), peer_c, peer_o, tw_grecv_.raw(), own_c, own_o,
                       dist::elem_of(xdt_));
      });
    }
    if (rp_K_ > 0) replicated_grads(e, grad, gv.ld);
    if (hy_K_ > 0) hybrid_apply<W>(e);
    if (rw_K_ > 0) backward_row_wise<S, W>(e, grad, gv.ld);
    if (has_tw_) {
      e.comm_join(a2a_done_);
      e.sub("emb bwd: tw all-to-all");
      if (tw_K_ > 0 && G > 0 && tw_nnz_ > 0)
        ce::backward_apply(tw_sub_, tw_off_.data<int32_t>(), G, tw_nnz_, mean_,
                           static_cast<const W*>(tw_grecv_.raw()), tw_row_, kind, e.lr + 1,
                           e.emb_eps, ts_.scratch, e.st, e.gscale);
      e.sub("emb bwd: tw apply");
      // Each piece's columns: the gradient's columns of that piece, the whole bags' lengths.
      for (const CwGroup& g : cw_)
        if (G > 0 && g.nnz > 0)
          ce::backward_apply(g.sub, g.off.data<int32_t>(), G, g.nnz, mean_,
                             static_cast<const W*>(tw_grecv_.raw()) + g.col, tw_row_, kind,
                             e.lr + 1, e.emb_eps, g.scratch, e.st, e.gscale);
      if (!cw_.empty()) e.sub("emb bwd: cw apply");
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

template <class H>
void EmbeddingNode::forward_row_wise(Engine& e, const dp::RankGeometry& geo, const int32_t* g_off,
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

template <class S, class W>
void EmbeddingNode::backward_row_wise(Engine& e, const S* grad, int64_t ld) {
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
  const ce::Update kind = e.emb_update();
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

}  // namespace emb

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
  auto node = std::make_unique<emb::EmbeddingNode>(
      b.e, s.name, b.layout, dim, nn::parse_pooling(s.pooling) == nn::Pooling::Mean, b.seed,
      std::move(hashed));
  b.embedding = node.get();
  b.row_base = &node->row_base();
  return node;
}

}  // namespace dlrec::model::gpu_graph
