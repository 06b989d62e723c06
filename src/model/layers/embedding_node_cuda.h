// Internal: the CUDA graph engine's embedding layer (layer "embedding", src/model/layers/
// embedding.cc). The class is shared by embedding_cuda.cu (steps, exchange paths) and
// embedding_alloc_cuda.cu (buffers and layouts of the sharded paths). CUDA builds only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/layers/embedding_dp_cuda.h"
#include "model/layers/graph_cuda_engine.h"
#include "model/layers/table_set_cuda.h"

namespace dlrec::model::gpu_graph::emb {

// A device copy of `bytes` host bytes (at least one byte allocated).
Tensor upload_bytes(Engine& e, const void* src, size_t bytes);

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
    hashed_ = std::make_unique<hashed_cuda::HashedTables>(std::move(hashed), dim, ts_.state_cols(e),
                                                          ts_.state_init(e), e.dev, e.st);
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
  void materialize(Engine& e, const std::vector<TableKeep>* keep) override {
    ts_.materialize(e, keep);
  }
  // Fixed tables of a model on one GPU only (hashed or sharded tables take the values).
  bool set_quantized(Engine& e, int64_t t, const nn::RowQuantRows& q) override {
    if (hashed_ || !ts_.deferred || e.dp.comm) return false;
    ts_.set_quantized(e, t, q);
    return true;
  }
  void write_into(int into, int64_t col) override {
    into_ = into;
    col_ = col;
  }
  void forward(Engine& e) override;
  // The id work now; the update now, or in fp16 once every gradient is checked (Engine::update;
  // the gradient read stays untouched until then).
  void backward(Engine& e) override;
  void collect(Engine&, std::vector<NamedState>&, std::vector<NamedState>& tables) override {
    ts_.collect(name_, tables);
  }
  const std::vector<uint32_t>& row_base() const { return ts_.row_base; }
  hashed_cuda::HashedTables* hashed() const override { return hashed_.get(); }
  std::pair<Tensor, Tensor> hybrid_rare(int64_t t) const override {
    if (t >= static_cast<int64_t>(ts_.rare.size())) return {};
    return {ts_.rare[t], ts_.rare_states.empty() ? Tensor() : ts_.rare_states[t]};
  }
  const std::string& layer_name() const override { return name_; }
  ServingParts serving_parts(Engine&) override;

 private:
  // Data-parallel (Engine::dp; fixed tables, no loss scaling: GraphCuda::set_gradient_reducer
  // refuses the others): every rank's offsets, keys and pooled-row gradients gathered in rank
  // order, the global batch's bags built from them, and the update of the whole global batch
  // applied on every rank. The ids and rows are those one GPU would see on the global batch,
  // in the same order, so the de-duplicated update sums the same values in the same order and
  // the replicas stay equal to one GPU's tables.
  const Value& grad_value(Engine& e) const { return into_ >= 0 ? e.vals[into_] : e.vals[self]; }
  void alloc_exchange(Engine& e, int64_t max_nnz);
  void backward_global(Engine& e);
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
  void alloc_table_wise(Engine& e, int64_t max_nnz);
  // The groups of this rank's column pieces (alloc_table_wise, after the travelling tables'
  // positions tv_pos_ are known).
  void alloc_column_wise(Engine& e, int64_t max_nnz,
                         const std::vector<dp::ExchangeLayout::Group>& groups);
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
  void alloc_replicated(Engine& e, int64_t max_nnz);
  // This rank's rows' bags of the replicated tables (bag k * B + b), pooled and put into the
  // layer's columns.
  template <class H>
  void forward_replicated(Engine& e, H* out, int64_t ld);
  void replicated_ids(Engine& e);
  // This rank's dense gradient of the replicated tables; the all-reduce that sums it over the
  // ranks is forked (rp_done_), replicated_apply joins it and applies it.
  template <class S>
  void replicated_grads(Engine& e, const S* grad, int64_t ld);
  void replicated_apply(Engine& e);
  // Rank geometry of this step and the element counts of the pooled rows' all-to-all: what
  // this owner sends each rank (K * B_s * dim at K * R_s * dim) and receives from each owner
  // (K_o * B * dim at first_o * B * dim). The backward swaps the two.
  dp::RankGeometry geometry(const Engine& e, std::vector<int64_t>* off_counts,
                            std::vector<int64_t>* key_counts) const;
  void tw_counts(const Engine& e, std::vector<int64_t>* own_c, std::vector<int64_t>* own_o,
                 std::vector<int64_t>* peer_c, std::vector<int64_t>* peer_o) const;
  void forward_table_wise(Engine& e);
  void backward_table_wise(Engine& e);
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
  void alloc_row_wise(Engine& e, int64_t max_nnz);
  // The padded geometry's rows per rank this step: the most rows of any rank.
  static int64_t padded_rows(const DataParallel& d) {
    return d.rows.empty() ? 0 : *std::max_element(d.rows.begin(), d.rows.end());
  }
  template <class H>
  void forward_row_wise(Engine& e, const dp::RankGeometry& geo, const int32_t* g_off,
                        const uint32_t* g_keys, H* out, int64_t ld, dist::Elem el);
  // S: the gradient's type, W: the exchange's (backward_table_wise).
  template <class S, class W>
  void backward_row_wise(Engine& e, const S* grad, int64_t ld);
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
  int64_t tw_row_ = 0;  // values per row of this rank's exchange block (its tables' columns)
  std::vector<int64_t> tw_W_, tw_F_;  // per rank: values per row, values of the ranks before
  std::vector<int64_t> tw_mine_;      // the tables this rank owns
  Tensor tw_layout_mem_, tw_tabs_, tw_ptrs_, tw_sptrs_, tw_base_;
  Tensor tw_off_, tw_keys_, tw_pool_, tw_recv_, tw_gsend_, tw_grecv_;
  ce::Tables tw_sub_;  // the owned tables (their global row keys as in the whole set)
  // Column-wise sharding (Engine::dp.col_pieces; docs/DISTRIBUTED.md, "Column-wise tables on
  // the GPUs"): a column piece is a table-wise position of its own width. This rank's pieces of
  // one width form a group (ce::Tables has one dim, a Scratch is carved per dim): the bags of its
  // tables over the global batch (every id: each piece owner sorts all of a table's ids), pooled
  // into columns [col, col + K * width) of this rank's row of the exchange and updated from the
  // same columns of the gradients received.
  struct CwGroup {
    int64_t width = 0, col = 0, K = 0, nnz = 0;
    std::vector<int64_t> tables;
    ce::Tables sub;
    ce::Scratch scratch;
    Tensor tabs, ptrs, sptrs, base, off, keys, scratch_mem;
  };
  std::vector<CwGroup> cw_;
  // Hybrid tables (Engine::dp.hybrid; docs/DISTRIBUTED.md, "Hybrid tables on the GPUs",
  // embedding_hybrid_cuda.cu): the frequent ids [0, F) of each are pooled and updated on every
  // GPU as a replicated table of F rows (the replicated path, its other ids pooled from a zero
  // row), the others by the table's owner, as a row-wise piece [F, rows) over the global batch
  // (its frequent ids pooled from the piece's zero row). Only the rows that hold some of those
  // ids travel: the owner writes each such pooled row straight into its rank's receive buffer
  // over NVLink (CUDA IPC), which adds it to its column; backward, each rank writes the
  // gradients of those rows into the owner's buffer and the owner runs the fused update. A
  // one-value all-reduce after the writes is the barrier that orders them before the reads.
  struct PeerBuffer {  // a device buffer every rank of the job maps (CUDA IPC, one host)
    void* mine = nullptr;
    size_t bytes = 0;         // of `mine`, counted in the device pool's use and peak
    std::vector<void*> peer;  // rank r's buffer as mapped here (own: mine)
    Tensor dev;               // the same pointers in a device array
    int device = 0;
    PeerBuffer() = default;
    PeerBuffer(const PeerBuffer&) = delete;
    PeerBuffer& operator=(const PeerBuffer&) = delete;
    ~PeerBuffer();
  };
  std::unique_ptr<PeerBuffer> open_peer_buffer(Engine& e, size_t bytes);
  void alloc_hybrid(Engine& e, int64_t max_nnz);
  // Forward: hybrid_push (the owner's pooling and writes, the barrier forked), later
  // hybrid_add (joins it, adds the received rows). Backward: hybrid_push_grads (the writes, the
  // barrier forked), later hybrid_apply (joins it; the owner's update). W: the exchange's type.
  template <class H>
  void hybrid_push(Engine& e, const dp::RankGeometry& geo, const int32_t* g_off,
                   const uint32_t* g_keys);
  template <class H>
  void hybrid_add(Engine& e, H* out, int64_t ld);
  template <class S, class W>
  void hybrid_push_grads(Engine& e, const S* grad, int64_t ld);
  template <class W>
  void hybrid_apply(Engine& e);
  void hybrid_barrier(Engine& e, const char* what);  // forked; hy_done_ after it
  gpu::Event hy_done_;
  std::vector<dp::HybridTable> hy_all_;  // every hybrid table (slot k = its index)
  std::vector<int64_t> hy_mine_;         // the slots of those this rank owns
  int64_t hy_K_ = 0, hy_M_ = 0, hy_nnz_ = 0, hy_bmax_ = 0;
  int hy_key_bits_ = 1;
  dp::RwLayout hy_rl_;
  ce::Tables hy_sub_;
  ce::Scratch hy_scratch_;
  Tensor hy_info_, hy_rinfo_, hy_ptrs_, hy_sptrs_, hy_base_, hy_off_, hy_keys_, hy_pool_;
  Tensor hy_scratch_mem_, hy_flag_;
  std::unique_ptr<PeerBuffer> hy_recv_, hy_grecv_;
  Tensor rp_cap_;
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

}  // namespace dlrec::model::gpu_graph::emb
