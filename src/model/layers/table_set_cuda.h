// Device tables of the CUDA table layers (embedding, wide): one width over all categorical
// features. Internal; CUDA builds only.
#pragma once

#include <algorithm>
#include <cmath>

#include "dlrec/nn/row_quant.h"
#include "model/layers/embedding_dp_cuda.h"
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {

// Device tables of one width over all categorical features (table t: [cardinality_t, dim]),
// with the pointer arrays the embedding kernels read (nn/embedding_cuda.h), optional Adagrad
// accumulators and the backward's scratch. Rows are initialised like EmbeddingBag::init
// (uniform, a = sqrt(1 / rows), seed derived per table) or zero (the wide layer's tables).
// Hashed tables (`capacities` given) have capacity_t rows, zero with zero state until a key is
// inserted (graph_hashed_cuda.h initialises a row then).
struct TableSet {
  std::vector<Tensor> tables, states;
  std::vector<uint32_t> row_base;
  std::vector<int64_t> rows;  // per table
  int key_bits = 1;
  int64_t dim = 0;
  Tensor ptrs, sptrs, base, scratch_mem;
  Tensor order;  // multi-hot layouts: ce::forward's order scratch (order_scratch())
  ce::Tables tab;
  ce::Scratch scratch;
  // Deferred (the embedding layer's fixed tables): the constructor allocates nothing, and
  // materialize() allocates and initialises the tables, all of them or those a sharded run's
  // GPU owns (GraphCuda::materialize_tables). Each table's initial values depend on its own
  // seed only (derived per table), so a table generated on its owner equals one GPU's.
  bool deferred = false, materialized = false;
  uint64_t seed = 0;
  // Row-wise quantized tables (serving a compact export; set_quantized): table t's rows of
  // codes, scale and bias (U8, ce::pack_quant_rows' layout), undefined for fp32 tables; such a
  // table's fp32 rows are never allocated (tables[t] stays undefined).
  std::vector<Tensor> qcodes;
  std::vector<int32_t> qbits;
  Tensor cptrs, bptrs;
  bool quantized(int64_t t) const { return !qcodes.empty() && qcodes[t].defined(); }
  int32_t* order_scratch() { return order.defined() ? order.data<int32_t>() : nullptr; }
  bool any_quantized() const {
    for (const Tensor& c : qcodes)
      if (c.defined()) return true;
    return false;
  }

  TableSet(Engine& e, const io::ShardLayout& layout, int64_t d, bool zero, uint64_t seed_,
           const std::vector<int64_t>& capacities = {}, bool defer = false)
      : dim(d), seed(seed_) {
    const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
    const bool hashed = !capacities.empty();
    if (hashed) zero = true;
    deferred = defer && !zero;
    uint64_t total = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = hashed ? capacities[t] : layout.cardinalities[t];
      rows.push_back(r);
      row_base.push_back(static_cast<uint32_t>(total));
      total += static_cast<uint64_t>(r);
      DLREC_CHECK(total < (uint64_t{1} << 32),
                  "key 'features': more than 2^32 rows in all "
                  "tables of a layer together are not supported on CUDA");
    }
    while (key_bits < 32 && (uint64_t{1} << key_bits) < total) ++key_bits;
    tab.num_tables = static_cast<int>(T);
    tab.dim = static_cast<int>(dim);
    if (std::any_of(layout.multi_hot.begin(), layout.multi_hot.end(), [](bool m) { return m; })) {
      order = Tensor::empty({T}, DType::I32, e.dev);
    }
    tables.resize(T);
    tab.beta1 = e.emb_beta1;
    tab.beta2 = e.emb_beta2;
    tab.momentum = e.emb_mu;
    tab.nesterov = e.emb_nesterov;
    if (has_state(e)) states.resize(T);
    if (deferred) return;
    for (int64_t t = 0; t < T; ++t) {
      if (zero) {
        tables[t] = e.buf({rows[t], dim}, DType::F32);
        if (has_state(e) && hashed) {
          // Zero until a key is inserted; [capacity, state_cols] (row-wise Adagrad too: the CPU
          // hashed table's state shape).
          states[t] = e.buf({rows[t], state_cols(e)}, DType::F32);
        } else if (has_state(e)) {
          states[t] = Tensor::empty(state_shape(e, rows[t]), DType::F32, e.dev);
          ce::fill(states[t].data<float>(), states[t].numel(), state_init(e), e.st);
        }
      } else {
        make(e, t);
      }
    }
    upload_pointers(e);
    materialized = true;
  }
  // Allocates and initialises table t (uniform, a = sqrt(1 / rows), seed derived per table;
  // the Adagrad accumulator at its initial value).
  void make(Engine& e, int64_t t) {
    if (quantized(t)) return;
    Tensor w = Tensor::empty({rows[t], dim}, DType::F32, e.dev);
    ce::init_uniform(w.data<float>(), w.numel(), nn::derive_seed(seed, static_cast<uint64_t>(t)),
                     std::sqrt(1.0 / static_cast<double>(rows[t])), e.st);
    tables[t] = w;
    if (has_state(e)) {
      Tensor s = Tensor::empty(state_shape(e, rows[t]), DType::F32, e.dev);
      ce::fill(s.data<float>(), s.numel(), state_init(e), e.st);
      states[t] = s;
    }
  }
  // A table's optimizer state, the CPU engine's shapes (so checkpoints move between the
  // engines): Adagrad's accumulator per weight, rowwise_adagrad's one per row ([rows]; hashed
  // tables [capacity, 1]), Adam's m, v and step count per row ([rows, 2 * dim + 1], zeros), the
  // momentum's velocity per weight (zeros).
  static bool has_state(const Engine& e) {
    return e.emb_adagrad || e.emb_rowwise || e.emb_adam || e.emb_momentum;
  }
  int64_t state_cols(const Engine& e) const { return e.emb_state_cols(dim); }
  float state_init(const Engine& e) const {
    return e.emb_adam || e.emb_momentum ? 0.f : e.emb_init_acc;
  }
  Shape state_shape(const Engine& e, int64_t r) const {
    return e.emb_rowwise ? Shape{r} : Shape{r, state_cols(e)};
  }
  // Row-wise sharding: this rank's piece of table t, its contiguous range [lo, hi) of rows
  // (dp::row_range over e.dp.ranks) with the values one GPU gives those rows, plus one zero
  // row after them (the outside row of dp::build_row_bags); the Adagrad accumulator of the
  // piece, outside row included, at its initial value.
  void make_piece(Engine& e, int64_t t) {
    int64_t lo = 0, hi = 0;
    dp::row_range(rows[t], e.dp.ranks, e.dp.rank, &lo, &hi);
    Tensor w = Tensor::empty({hi - lo + 1, dim}, DType::F32, e.dev);
    dp::init_uniform_range(w.data<float>(), (hi - lo) * dim, lo * dim,
                           nn::derive_seed(seed, static_cast<uint64_t>(t)),
                           std::sqrt(1.0 / static_cast<double>(rows[t])), e.st);
    DLREC_CUDA_CHECK(
        cudaMemsetAsync(w.data<float>() + (hi - lo) * dim, 0, sizeof(float) * dim, e.st));
    tables[t] = w;
    if (e.emb_adagrad) {
      Tensor s = Tensor::empty({hi - lo + 1, dim}, DType::F32, e.dev);
      ce::fill(s.data<float>(), s.numel(), e.emb_init_acc, e.st);
      states[t] = s;
    }
  }
  // Column-wise sharding: this rank's piece of table t, columns [c0, c1) of every row (its entry
  // in e.dp.col_pieces) with the values one GPU gives them; the accumulator at its initial value.
  void make_columns(Engine& e, int64_t t) {
    const dp::ColPiece* mine = nullptr;
    for (const dp::ColPiece& p : e.dp.col_pieces)
      if (p.table == t && p.rank == e.dp.rank) mine = &p;
    DLREC_CHECK(mine, "column-wise sharding: rank ", e.dp.rank, " has no piece of table ", t,
                " (bug)");
    const int64_t w = mine->c1 - mine->c0;
    Tensor x = Tensor::empty({rows[t], w}, DType::F32, e.dev);
    dp::init_uniform_cols(x.data<float>(), rows[t], dim, mine->c0, w,
                          nn::derive_seed(seed, static_cast<uint64_t>(t)),
                          std::sqrt(1.0 / static_cast<double>(rows[t])), e.st);
    tables[t] = x;
    if (e.emb_adagrad) {
      Tensor s = Tensor::empty({rows[t], w}, DType::F32, e.dev);
      ce::fill(s.data<float>(), s.numel(), e.emb_init_acc, e.st);
      states[t] = s;
    }
  }
  // A hybrid table (e.dp.hybrid: F, its owner): on every GPU its frequent prefix, rows [0, F),
  // plus one zero row (the one its other ids are pooled from: EmbeddingNode's replicated path);
  // on the owner also `rare[t]`, rows [F, rows) plus one zero row (the outside row of a row-wise
  // piece). Values as one GPU gives those rows; the accumulators at their initial value.
  std::vector<Tensor> rare, rare_states;
  void make_prefix(Engine& e, int64_t t) {
    const dp::HybridTable* h = nullptr;
    for (const dp::HybridTable& x : e.dp.hybrid)
      if (x.table == t) h = &x;
    DLREC_CHECK(h && h->frequent > 0 && h->frequent < rows[t], "hybrid table ", t,
                " has no frequent prefix (bug)");
    const uint64_t s = nn::derive_seed(seed, static_cast<uint64_t>(t));
    const double a = std::sqrt(1.0 / static_cast<double>(rows[t]));
    auto piece = [&](int64_t lo, int64_t hi, Tensor& w, Tensor* st) {
      w = Tensor::empty({hi - lo + 1, dim}, DType::F32, e.dev);
      dp::init_uniform_range(w.data<float>(), (hi - lo) * dim, lo * dim, s, a, e.st);
      DLREC_CUDA_CHECK(
          cudaMemsetAsync(w.data<float>() + (hi - lo) * dim, 0, sizeof(float) * dim, e.st));
      if (!e.emb_adagrad) return;
      *st = Tensor::empty({hi - lo + 1, dim}, DType::F32, e.dev);
      ce::fill(st->data<float>(), st->numel(), e.emb_init_acc, e.st);
    };
    piece(0, h->frequent, tables[t], e.emb_adagrad ? &states[t] : nullptr);
    if (h->owner != e.dp.rank) return;
    rare.resize(tables.size());
    rare_states.resize(tables.size());
    piece(h->frequent, rows[t], rare[t], &rare_states[t]);
  }
  // Deferred tables: allocates what keep[t] says (every whole table when keep is null): Whole,
  // this rank's row-wise piece (Rows: make_piece), its column-wise piece (Columns:
  // make_columns), a hybrid table's prefix (Prefix: make_prefix); the others (None) stay
  // unallocated, with null pointers in the kernels' arrays (only the owners' sub-sets are pooled
  // then: EmbeddingNode's sharded paths).
  void materialize(Engine& e, const std::vector<TableKeep>* keep) {
    if (materialized) return;
    for (size_t t = 0; t < tables.size(); ++t) {
      const TableKeep k = keep ? (*keep)[t] : TableKeep::Whole;
      if (k == TableKeep::Rows)
        make_piece(e, static_cast<int64_t>(t));
      else if (k == TableKeep::Columns)
        make_columns(e, static_cast<int64_t>(t));
      else if (k == TableKeep::Prefix)
        make_prefix(e, static_cast<int64_t>(t));
      else if (k == TableKeep::Whole)
        make(e, static_cast<int64_t>(t));
    }
    upload_pointers(e);
    materialized = true;
  }
  void upload_pointers(Engine& e) {
    std::vector<float*> wp, sp;
    std::vector<const void*> cp;
    for (size_t t = 0; t < tables.size(); ++t) {
      wp.push_back(tables[t].defined() ? tables[t].data<float>() : nullptr);
      if (!states.empty()) sp.push_back(states[t].defined() ? states[t].data<float>() : nullptr);
      cp.push_back(quantized(t) ? qcodes[t].raw() : nullptr);
    }
    auto upload = [&](const void* src, size_t bytes) {
      Tensor t = Tensor::empty({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8, e.dev);
      if (bytes) copy_bytes(t.raw(), e.dev, src, Device::cpu(), bytes);
      return t;
    };
    ptrs = upload(wp.data(), wp.size() * sizeof(float*));
    sptrs = upload(sp.data(), sp.size() * sizeof(float*));
    base = upload(row_base.data(), row_base.size() * sizeof(uint32_t));
    tab.weights = static_cast<float* const*>(ptrs.raw());
    tab.states = !states.empty() ? static_cast<float* const*>(sptrs.raw()) : nullptr;
    tab.row_base = static_cast<const uint32_t*>(base.raw());
    tab.codes = nullptr;
    tab.qbits = nullptr;
    tab.quant_bits = 0;
    if (!any_quantized()) return;
    tab.quant_bits = qbits.empty() ? 0 : qbits[0];
    for (size_t t = 0; t < tables.size(); ++t)
      if (!quantized(t) || qbits[t] != tab.quant_bits) tab.quant_bits = 0;
    cptrs = upload(cp.data(), cp.size() * sizeof(void*));
    bptrs = upload(qbits.data(), qbits.size() * sizeof(int32_t));
    tab.codes = static_cast<const uint8_t* const*>(cptrs.raw());
    tab.qbits = static_cast<const int32_t*>(bptrs.raw());
  }
  // Serves table t from its row-wise codes (checked by the caller: nn::check_row_quant, the
  // table's shape): its rows packed (codes, scale, bias) and uploaded a block at a time, the fp32
  // rows and optimizer state released (or never allocated). Serving only: the layer refuses to
  // train afterwards.
  void set_quantized(Engine& e, int64_t t, const nn::RowQuantRows& q) {
    if (qcodes.empty()) {
      qcodes.resize(tables.size());
      qbits.assign(tables.size(), 0);
    }
    const int64_t stride = ce::quant_row_stride(q.dim, q.bits);
    qcodes[t] = Tensor::empty({q.rows * stride}, DType::U8, e.dev);
    const int64_t block = std::max<int64_t>(1, (int64_t{64} << 20) / stride);
    std::vector<uint8_t> buf(static_cast<size_t>(std::min(block, q.rows) * stride));
    for (int64_t r0 = 0; r0 < q.rows; r0 += block) {
      const int64_t n = std::min(block, q.rows - r0);
      ce::pack_quant_rows(q, r0, n, buf.data());
      copy_bytes(static_cast<uint8_t*>(qcodes[t].raw()) + r0 * stride, e.dev, buf.data(),
                 Device::cpu(), static_cast<size_t>(n * stride));
    }
    qbits[t] = q.bits;
    tables[t] = Tensor();
    if (!states.empty()) states[t] = Tensor();
    if (materialized) upload_pointers(e);
  }
  void alloc_scratch(Engine& e, int64_t max_nnz) {
    const size_t sb = ce::scratch_bytes(max_nnz, key_bits, static_cast<int>(dim));
    scratch_mem = Tensor::empty({static_cast<int64_t>(sb)}, DType::U8, e.dev);
    scratch = ce::carve(scratch_mem.raw(), max_nnz, key_bits, static_cast<int>(dim));
    ce::prepare(scratch, e.st);
  }
  // The fused de-duplicated update from dL/dpooled [B, T, dim] (f32), embedding optimizer.
  void update(Engine& e, bool mean, const float* dpooled) {
    ce::backward_update(tab, e.offsets, e.keys, e.B, e.nnz, mean, dpooled,
                        e.emb_update(), e.lr + 1, e.emb_eps,
                        key_bits, scratch, e.st, e.gscale);
  }
  // The same in two halves: the id work of the step's batch (sort by row, runs), then the
  // update from dL/dpooled (f32, bf16 or f16, rows ld apart). Both read Engine::gscale (fp16
  // loss scaling; null otherwise).
  void ids(Engine& e) {
    ce::backward_ids(tab, e.offsets, e.keys, e.B, e.nnz, key_bits, scratch, e.st);
  }
  template <class G>
  void apply(Engine& e, bool mean, const G* dpooled, int64_t ld) {
    ce::backward_apply(tab, e.offsets, e.B, e.nnz, mean, dpooled, ld,
                       e.emb_update(), e.lr + 1, e.emb_eps,
                       scratch, e.st, e.gscale);
  }
  void collect(const std::string& name, std::vector<NamedState>& out) {
    for (size_t t = 0; t < tables.size(); ++t)
      out.push_back({name + "." + std::to_string(t) + ".weight", tables[t],
                     states.empty() ? Tensor() : states[t]});  // undefined until materialized
  }
};

}  // namespace dlrec::model::gpu_graph
