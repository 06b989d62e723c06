// The CUDA graph engine's serving path, predict() (graph_cuda_impl.h): host packing into pinned
// buckets, one CUDA graph per power-of-two bucket of rows (copy in on the copy stream, forward,
// sigmoid, copy out), chunks of big batches through two alternating buckets.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>

#include "dlrec/core/spin_team.h"
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {
namespace {

float sigmoid_host(float z) {
  const double x = z;
  return static_cast<float>(x >= 0 ? 1.0 / (1.0 + std::exp(-x))
                                   : std::exp(x) / (1.0 + std::exp(x)));
}

}  // namespace

SpinTeam& pack_team(int size) {
  static SpinTeam team(size);
  return team;
}

PinnedPtr mapped_alloc(size_t bytes) {
  void* q = nullptr;
  DLREC_CUDA_CHECK(cudaHostAlloc(&q, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  return PinnedPtr(q);
}

void spin_wait(cudaEvent_t e) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) DLREC_CUDA_CHECK(q);
  }
}

// Batches the captured buckets do not take (QAT layers, profiling, graphs off): the forward
// run eagerly, as a serving forward (compressed layers on their kernels: before, such a batch
// ran the dense weights of a compressed export, found by the parity harness's compressed cases).
void GraphCuda::predict_eager(const io::Batch& batch, float* probs) {
  serve_eager_ = true;
  std::vector<float> z;
  try {
    z = forward(batch, false).to_vector<float>();
  } catch (...) {
    serve_eager_ = false;
    throw;
  }
  serve_eager_ = false;
  for (size_t i = 0; i < z.size(); ++i) probs[i] = sigmoid_host(z[i]);
}

GraphCuda::InferBucket& GraphCuda::infer_bucket(int64_t R, int parity) {
  const size_t i = static_cast<size_t>(2 * log2_ceil(R) + parity);
  if (buckets_.size() <= i) buckets_.resize(i + 1);
  auto& bkp = buckets_[i];
  if (bkp) return *bkp;
  auto bk = std::make_unique<InferBucket>();
  bk->rows = R;
  size_t in_bytes = sizeof(float) * R * num_dense_ + sizeof(uint32_t) * R * T_ + 64;
  if (emb_ && emb_->hashed()) {
    bk->keys64_at = align16(sizeof(float) * R * num_dense_ + sizeof(uint32_t) * R * T_);
    in_bytes = bk->keys64_at + sizeof(int64_t) * R * T_;
  }
  // Mapped, so that the fused small-batch kernel reads the inputs and writes the
  // probabilities in place.
  bk->in = mapped_alloc(in_bytes);
  std::memset(bk->in.get(), 0, in_bytes);
  bk->dense = static_cast<float*>(bk->in.get());
  bk->keys = reinterpret_cast<uint32_t*>(bk->dense + R * num_dense_);
  if (bk->keys64_at)
    bk->keys64 = reinterpret_cast<int64_t*>(static_cast<char*>(bk->in.get()) + bk->keys64_at);
  for (int64_t t = 0; t < T_; ++t)  // padding: row 0 of each table
    for (int64_t r = 0; r < R; ++r) bk->keys[t * R + r] = row_base_ ? (*row_base_)[t] : 0;
  bk->out = mapped_alloc(sizeof(float) * R);
  bk->probs = static_cast<float*>(bk->out.get());
  void* din = nullptr;
  void* dout = nullptr;
  DLREC_CUDA_CHECK(cudaHostGetDevicePointer(&din, bk->in.get(), 0));
  DLREC_CUDA_CHECK(cudaHostGetDevicePointer(&dout, bk->out.get(), 0));
  bk->dev_in = din;
  bk->dev_probs = static_cast<float*>(dout);
  // Bag t * R + r holds id position t * R + r (the step's layout: offsets per table, R apart).
  std::vector<int32_t> off(R * T_ + 1);
  for (int64_t k = 0; k <= R * T_; ++k) off[k] = static_cast<int32_t>(k);
  bk->d_offsets = Tensor::from_vector(off, {R * T_ + 1}, dev_);
  bucket_device_side(*bk, in_bytes);
  bkp = std::move(bk);
  return *bkp;
}

void GraphCuda::bucket_device_side(InferBucket& bk, size_t in_bytes) {
  bk.d_in = Tensor::empty({static_cast<int64_t>(in_bytes)}, DType::U8, dev_);
  bk.d_in.zero_();  // hashed tables resolve every id position, the chunk's or not
  bk.d_probs = Tensor::empty({bk.rows}, DType::F32, dev_);
  bk.done = gpu::Event(dev_index_);
  bk.copied = gpu::Event(dev_index_);
}

void GraphCuda::infer_body(InferBucket& bk) {
  const int64_t R = bk.rows;
  e_.B = R;
  e_.dense = static_cast<const float*>(bk.d_in.raw());
  if (bk.id_cap) {  // multi-hot: the chunk's offsets and ids in d_in
    const char* in = static_cast<const char*>(bk.d_in.raw());
    e_.nnz = bk.id_cap;
    e_.offsets = reinterpret_cast<const int32_t*>(in + bk.offsets_at);
    e_.keys = reinterpret_cast<const uint32_t*>(in + bk.keys_at);
  } else {
    e_.nnz = R * T_;
    e_.keys = reinterpret_cast<const uint32_t*>(e_.dense + R * num_dense_);
    e_.offsets = bk.d_offsets.data<int32_t>();
  }
  e_.hashed_keys = bk.keys64_at ? reinterpret_cast<const int64_t*>(
                                      static_cast<const char*>(bk.d_in.raw()) + bk.keys64_at)
                                : nullptr;
  e_.serving = true;
  try {
    run_forward();
  } catch (...) {
    e_.serving = false;
    e_.hashed_keys = nullptr;
    throw;
  }
  e_.serving = false;
  e_.hashed_keys = nullptr;
  cd::sigmoid(logits(), bk.d_probs.data<float>(), R, e_.st);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(bk.probs, bk.d_probs.raw(), sizeof(float) * R,
                                   cudaMemcpyDeviceToHost, e_.st));
}

// The inputs go over on the copy stream (outside the graph, so that the next chunk's copy
// overlaps this chunk's forward); the first launch of a bucket runs eagerly (cuBLAS/cuBLASLt
// plans, tuning and lazy loading outside the capture), then it is captured once.
size_t GraphCuda::bucket_copy_bytes(const InferBucket& bk) const {
  // One-hot: the dense rows and the ids; multi-hot: the dense rows and offsets, then the ids;
  // then the int64 keys of hashed tables.
  if (bk.keys64_at)
    return bk.keys64_at + sizeof(int64_t) * (bk.id_cap ? bk.nnz : bk.rows * T_);
  return bk.id_cap ? bk.keys_at + sizeof(uint32_t) * bk.nnz
                   : sizeof(float) * bk.rows * num_dense_ + sizeof(uint32_t) * bk.rows * T_;
}

void GraphCuda::infer_launch(InferBucket& bk, bool copy_aside, bool copied) {
  cudaStream_t cs = copy_aside ? copy_.get() : e_.st;
  const size_t bytes = bucket_copy_bytes(bk);
  if (bytes && !copied)
    DLREC_CUDA_CHECK(
        cudaMemcpyAsync(bk.d_in.raw(), bk.in.get(), bytes, cudaMemcpyHostToDevice, cs));
  if (cs != e_.st) {
    DLREC_CUDA_CHECK(cudaEventRecord(bk.copied, cs));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, bk.copied, 0));
  }
  if (!bk.graph && !bk.no_graph) {
    infer_body(bk);
    DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
    bk.graph = capture(e_.st, [&] { infer_body(bk); }, "inference step");
    bk.no_graph = !bk.graph;
  }
  if (bk.graph) DLREC_CUDA_CHECK(cudaGraphLaunch(bk.graph.get(), e_.st));
  else infer_body(bk);
  DLREC_CUDA_CHECK(cudaEventRecord(bk.done, e_.st));
}

bool GraphCuda::infer_pack(const io::Batch& batch, int64_t r0, int64_t n, InferBucket& bk) {
  const int64_t R = bk.rows;
  std::atomic<bool> multi_hot{false};
  auto pack = [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      // One id per row: offsets o0, o0 + 1, ..., o0 + n (not read when the producer promises
      // it), then the ids range-checked and offset to global rows.
      int64_t o0 = r0;
      if (!batch.one_id_per_row) {
        const int64_t* o = batch.cat_offsets[t].data() + r0;
        o0 = o[0];
        int64_t diff = 0;
        for (int64_t r = 1; r <= n; ++r) diff |= o[r] - o0 - r;
        if (diff != 0) {
          multi_hot = true;
          return;
        }
      }
      DLREC_CHECK(static_cast<int64_t>(batch.cat_indices[t].size()) >= o0 + n, "predict: feature ",
                  t, " has ", batch.cat_indices[t].size(), " ids for ", o0 + n,
                  " rows (a batch promising one id per row must hold one per row)");
      const int64_t* ids = batch.cat_indices[t].data() + o0;
      if (bk.keys64) std::memcpy(bk.keys64 + t * R, ids, sizeof(int64_t) * n);
      const int64_t rows = layout_.cardinalities[t];
      const uint32_t base = row_base_ ? (*row_base_)[t] : 0;
      uint32_t* k = bk.keys + t * R;
      // 0 <= id < rows  <=>  the sign bits of id and of ~(id - rows) are both clear: adds, nots
      // and ors only, so the loop vectorises without 64-bit compares (unsigned: no overflow).
      const uint64_t urows = static_cast<uint64_t>(rows);
      uint64_t sign = 0;
      for (int64_t r = 0; r < n; ++r) {
        const uint64_t id = static_cast<uint64_t>(ids[r]);
        sign |= id | ~(id - urows);
        k[r] = base + static_cast<uint32_t>(id);
      }
      if (sign >> 63) {
        for (int64_t r = 0; r < n; ++r) k[r] = base;  // later calls' padding stays valid
        for (int64_t r = 0; r < n; ++r)
          if (ids[r] < 0 || ids[r] >= rows)
            fail("EmbeddingBag: id ", ids[r], " of table ", t, " is out of range [0, ", rows,
                 ")");
      }
    }
  };
  // Up to 16384 ids on this thread; more on the packing team (threads that stay awake between
  // calls: a dispatch costs no wake-up, unlike the thread pool's), a range of tables each.
  constexpr int64_t kSerialIds = 16384;
  if (n * T_ <= kSerialIds || pack_threads_ == 1) {
    pack(0, T_);
  } else {
    SpinTeam& team = pack_team(pack_threads_);
    const int64_t parts = team.size();
    team.run([&](int i) { pack(T_ * i / parts, T_ * (i + 1) / parts); });
  }
  if (multi_hot) {
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t r = 0; r < n; ++r) bk.keys[t * R + r] = row_base_ ? (*row_base_)[t] : 0;
    return false;
  }
  if (n * num_dense_ > 0)
    std::memcpy(bk.dense, batch.dense.data() + r0 * num_dense_, sizeof(float) * n * num_dense_);
  return true;
}

void GraphCuda::predict(const io::Batch& batch, float* probs) {
  DeviceGuard g(dev_index_);
  materialize_tables();  // the embedding's tables are allocated on first use
  check_batch(batch);
  const int64_t B = batch.rows;
  if (B == 0) return;
  hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr;
  attach_qat();
  // QAT layers (a model in training) run eagerly: their forward is the training engine's.
  if (profile_ || !graphs_ || qat_on_) return predict_eager(batch, probs);
  // Hashed tables: the keys checked (>= 0), the state rebuilt if it was handed out, lookups
  // only (the buckets' graphs resolve each chunk's int64 keys).
  if (hashed) hashed->prepare(batch, false, /*own_slot=*/false);
  have_training_forward_ = false;
  // Compressed exports too: one 32768-row chunk (more rows per int8 / 2:4 GEMM) lost the host
  // packing's overlap with the GPU and measured 1.39x slower end to end (bench/RESULTS.md).
  const int64_t chunk = std::min(B, opts_.infer_chunk);
  int64_t R = 1;
  while (R < chunk) R *= 2;
  ensure_capacity(R, R * T_);  // drops the captured graphs when the buffers grow
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
  const int64_t nchunks = (B + chunk - 1) / chunk;
  const bool one_hot = run_chunks(B, chunk, probs, [&](int64_t r0, int64_t n, int p) {
    InferBucket& bk = infer_bucket(R, p);
    if (!infer_pack(batch, r0, n, bk)) return static_cast<InferBucket*>(nullptr);
    // Under the compressed policy the fused kernel runs the layers' INT8 forms (plan_fused) and
    // the 2:4 ones' pruned weights.
    const bool fuse = nchunks == 1 && n <= opts_.infer_fused_rows && e_.lowp &&
                      fused_ != Fused::Off && !hashed;
    if (fuse && fused_launch(bk, n)) {
      DLREC_CUDA_CHECK(cudaEventRecord(bk.done, e_.st));
      if (kernel_policy_ == nn::kernel_choice::Policy::Compressed)
        for (Lin* l : compressed_) l->comp->note_fused(n);
    } else {
      infer_launch(bk, nchunks > 1);
    }
    return &bk;
  });
  if (!one_hot) predict_multihot(batch, probs);  // several ids per row somewhere
}

bool GraphCuda::run_chunks(int64_t B, int64_t chunk, float* probs,
                           const std::function<InferBucket*(int64_t, int64_t, int)>& launch) {
  struct Pending {
    InferBucket* bk = nullptr;
    int64_t r0 = 0, n = 0;
  } pending[2];
  auto finish = [&](int p) {
    Pending& q = pending[p];
    if (!q.bk) return;
    spin_wait(q.bk->done);
    std::memcpy(probs + q.r0, q.bk->probs, sizeof(float) * q.n);
    q.bk = nullptr;
  };
  auto finish_all = [&] {
    finish(0);
    finish(1);
  };
  const int64_t nchunks = (B + chunk - 1) / chunk;
  for (int64_t c = 0; c < nchunks; ++c) {
    const int p = static_cast<int>(c & 1);
    finish(p);  // the parity's previous chunk must be out before its bucket is repacked
    const int64_t r0 = c * chunk, n = std::min(chunk, B - r0);
    InferBucket* bk = nullptr;
    try {
      bk = launch(r0, n, p);
    } catch (...) {
      finish_all();
      throw;
    }
    if (!bk) {
      finish_all();
      return false;
    }
    pending[p] = {bk, r0, n};
  }
  finish_all();
  return true;
}

void GraphCuda::check_serving_options(const GraphCudaOptions& o) {
  DLREC_CHECK(o.infer_chunk >= 256 && o.infer_chunk <= 65536 &&
                  (o.infer_chunk & (o.infer_chunk - 1)) == 0,
              "graph model: infer_chunk must be a power of two in [256, 65536], got ",
              o.infer_chunk);
  DLREC_CHECK(o.infer_pack_threads >= 0 && o.infer_pack_threads <= 256,
              "graph model: infer_pack_threads must be in [0, 256], got ", o.infer_pack_threads);
  DLREC_CHECK(o.infer_fused_rows >= 0 && o.infer_fused_rows <= fused_infer::kMaxRows,
              "graph model: infer_fused_rows must be in [0, ", fused_infer::kMaxRows, "], got ",
              o.infer_fused_rows);
  DLREC_CHECK(o.infer_fused_blocks >= 0 && o.infer_fused_blocks <= 65536,
              "graph model: infer_fused_blocks must be in [0, 65536], got ",
              o.infer_fused_blocks);
}

// The DLRM shape, followed back from the output: output <- MLP (top) <- dot read in place <-
// [MLP (bottom) <- the dense features, fixed embedding tables over every feature]. The
// kernel's parameters point at the engine's own weights and activation buffers (sized for the
// bucket's rows by ensure_capacity before any launch). Other shapes (DCNv2, DeepFM, ...) take
// the layer-by-layer path silently; a DLRM shape the kernel refuses (widths, layer count) says
// why once, on stderr.
fused_infer::Int8Form GraphCuda::fused_int8_form(const Lin& l) const {
  fused_infer::Int8Form f;
  if (kernel_policy_ != nn::kernel_choice::Policy::Compressed || !l.comp) return f;
  // A 2:4 layer without an INT8 record keeps its 16-bit weights, pruned: the 2:4 sums.
  const auto v = l.comp->int8_view();
  if (!v.q) return f;
  f.q = v.q;
  f.deq = v.deq;
  f.bias = v.bias;
  f.inv_x = v.inv_x;
  f.qk = static_cast<int>(v.ld);
  return f;
}

void GraphCuda::plan_fused() {
  namespace fi = fused_infer;
  using K = ServingParts::Kind;
  fused_ = Fused::Off;
  fi::Params p;
  bool dlrm_shape = false;  // the graph is the DLRM shape: a refusal is worth a line on stderr
  const std::string why = [&]() -> std::string {
    const std::vector<int>& out_in = spec_.layers[spec_.output].input_ids;
    if (out_in.size() != 1) return "the output has other than one input";
    const int top_i = out_in[0];
    const ServingParts top = nodes_[top_i]->serving_parts(e_);
    if (top.kind != K::Mlp || spec_.layers[top_i].input_ids.size() != 1)
      return "the output is not an MLP's";
    const int dot_i = spec_.layers[top_i].input_ids[0];
    const ServingParts dot = nodes_[dot_i]->serving_parts(e_);
    const std::vector<int>& dot_in = spec_.layers[dot_i].input_ids;
    if (dot.kind != K::Dot || dot_in.size() != 2)
      return "the top MLP's input is not a dot interaction over two inputs";
    const ServingParts bottom = nodes_[dot_in[0]]->serving_parts(e_);
    const ServingParts emb = nodes_[dot_in[1]]->serving_parts(e_);
    if (bottom.kind != K::Mlp || emb.kind != K::Embedding)
      return "the dot's inputs are not an MLP and fixed embedding tables";
    const std::vector<int>& bottom_in = spec_.layers[dot_in[0]].input_ids;
    if (bottom_in.size() != 1 || nodes_[bottom_in[0]]->serving_parts(e_).kind != K::DenseInput)
      return "the bottom MLP does not read the dense features";
    dlrm_shape = true;
    if (!e_.vals[dot_in[1]].y.defined()) return "the embedding rows have no buffer";
    if (dot.fields != T_ + 1 || emb.tables->num_tables != T_ || emb.tables->dim != dot.dim)
      return "the embedding tables do not cover every feature at the dot's width";
    if (bottom.lins.size() + top.lins.size() > static_cast<size_t>(fi::kMaxLayers))
      return "more than " + std::to_string(fi::kMaxLayers) + " layers";
    p.nb = static_cast<int>(bottom.lins.size());
    p.nt = static_cast<int>(top.lins.size());
    p.num_dense = static_cast<int>(num_dense_);
    p.T = static_cast<int>(T_);
    p.d = static_cast<int>(dot.dim);
    p.inter_ld = static_cast<int>(e_.vals[dot_i].ld);
    p.emb = e_.vals[dot_in[1]].y.raw();
    p.inter = e_.vals[dot_i].y.raw();
    p.tables = emb.tables->weights;
    p.row_base = emb.tables->row_base;
    p.codes = emb.tables->codes;
    p.qbits = emb.tables->qbits;
    int i = 0;
    for (const ServingParts* mlp : {&bottom, &top})
      for (size_t k = 0; k < mlp->lins.size(); ++k) {
        const Lin& l = *mlp->lins[k];
        fi::Layer& f = p.layer[i++];
        const bool f32_out = mlp == &top && k + 1 == mlp->lins.size() &&
                             e_.vals[top_i].dt == DType::F32;
        if (!l.has_bias || l.out_ld != l.out) return "a layer without bias or with padded rows";
        f.w = l.wh.raw();
        f.b = f32_out ? l.b.raw() : l.bh.raw();
        f.int8 = fused_int8_form(l);
        f.y = mlp->ys[k];
        f.out = static_cast<int>(l.out);
        f.k = static_cast<int>(l.in_pad);
        f.relu = l.relu;
        f.f32_out = f32_out;
      }
    return fi::unsupported(p);
  }();
  if (why.empty()) {
    fused_params_ = p;
    fused_is_program_ = false;
    fused_ = Fused::On;
    return;
  }
  if (dlrm_shape) {
    std::fprintf(stderr, "[dlrec] fused small-batch inference off for this model: %s\n",
                 why.c_str());
    return;
  }
  // Other shapes: the program form, or the bucketed graphs (silently: a graph with a part the
  // program has no op for, e.g. a dot over three inputs, is an expected case).
  if (!plan_program().empty()) return;
  fused_is_program_ = true;
  fused_ = Fused::On;
}

namespace {

// Where the program form finds a value: its own buffer, or (placed) a concat's columns.
struct Loc {
  void* p = nullptr;
  int64_t ld = 0;
  DType dt = DType::F32;
  bool placed = false;
  int ready = 0;  // the first stage that may read it
};

size_t elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

}  // namespace

// The program form (fused_infer::prog) of any graph of the parts ServingParts lists: each
// value gets a location (a concat's columns when that concat is among its readers, so that
// nothing is copied; else its own buffer), each layer its ops, each op the first stage after
// its inputs are written (an MLP's or a cross network's layers one stage each). The last op
// must be the one-output Linear behind the output (directly, or through an add whose other
// inputs are 1-wide values: added to the logit). Returns why not ("" when planned). Over 150
// lines: one pass over the layers with a case per part kind, all sharing the locations, the
// stages and the op list; split, each case would take all of them as arguments.
std::string GraphCuda::plan_program() {
  namespace fp = fused_infer::prog;
  using K = ServingParts::Kind;
  const int n = static_cast<int>(spec_.layers.size());
  std::vector<ServingParts> parts(n);
  std::vector<std::vector<int>> users(n);
  std::vector<Loc> loc(n);
  for (int i = 0; i < n; ++i) {
    parts[i] = nodes_[i]->serving_parts(e_);
    for (int j : spec_.layers[i].input_ids) {
      if (j >= i) return "layers out of order";
      users[j].push_back(i);
    }
    const Value& v = e_.vals[i];
    loc[i] = {v.y.raw(), v.ld, v.dt, false, 0};
  }
  // Placement: a concat's inputs are written into its columns.
  for (int c = 0; c < n; ++c) {
    if (parts[c].kind != K::Concat) continue;
    if (!loc[c].p || !is_half(loc[c].dt)) return "a concat without a 16-bit buffer";
    int64_t col = 0;
    for (int j : spec_.layers[c].input_ids) {
      if (loc[j].placed || parts[j].kind == K::Concat)
        return "a value read by two concats, or a concat of a concat";
      if (e_.vals[j].dt != loc[c].dt) return "a concat input of another type";
      loc[j] = {static_cast<char*>(loc[c].p) + col * elem_bytes(loc[c].dt), loc[c].ld,
                loc[c].dt, true, 0};
      col += e_.vals[j].width;
    }
  }
  std::vector<fp::Op> ops;
  std::vector<int> last_op(n, -1);  // a layer's last op
  std::vector<bool> host_dense(n, false);
  int max_k = 8;
  // A Linear from a Lin: x (16-bit, rows x_ld apart, or the caller's dense rows) -> y.
  auto linear = [&](const Lin& l, const void* x, int64_t x_ld, bool host_x, void* y,
                    int64_t y_ld, bool f32_out, int stage) -> std::string {
    if (!l.wh.defined()) return "a layer without 16-bit weights";
    fp::Op o;
    o.kind = fp::OpKind::Linear;
    o.stage = stage;
    o.w = l.wh.raw();
    o.b = !l.has_bias ? nullptr : f32_out ? l.b.raw() : l.bh.raw();
    o.int8 = fused_int8_form(l);
    o.x = x;
    o.x_ld = static_cast<int>(x_ld);
    o.host_x = host_x;
    o.y = y;
    o.y_ld = static_cast<int>(y_ld);
    o.out = static_cast<int>(l.out);
    o.k = static_cast<int>(l.in_pad);
    o.relu = l.relu;
    o.f32_out = f32_out;
    max_k = std::max(max_k, o.k);
    ops.push_back(o);
    return "";
  };
  for (int i = 0; i < n; ++i) {
    const ServingParts& sp = parts[i];
    const std::vector<int>& in = spec_.layers[i].input_ids;
    const std::string what = "layer '" + spec_.layers[i].name + "' (" + spec_.layers[i].type + ")";
    const size_t ops_before = ops.size();
    switch (sp.kind) {
      case K::DenseInput: {
        bool all_mlp = !loc[i].placed;
        for (int u : users[i]) all_mlp = all_mlp && parts[u].kind == K::Mlp;
        if (all_mlp) {  // the MLPs' first layers read the caller's rows themselves
          host_dense[i] = true;
          break;
        }
        if (!loc[i].p || !is_half(loc[i].dt)) return what + ": no 16-bit buffer";
        fp::Op o;
        o.kind = fp::OpKind::DenseIn;
        o.y = loc[i].p;
        o.y_ld = static_cast<int>(loc[i].ld);
        ops.push_back(o);
        loc[i].ready = 1;
        break;
      }
      case K::Embedding:
      case K::Wide: {
        if (sp.tables->num_tables != T_) return what + ": not over every feature";
        fp::Op o;
        o.kind = sp.kind == K::Wide ? fp::OpKind::Wide : fp::OpKind::Gather;
        o.tables = sp.tables->weights;
        o.row_base = sp.tables->row_base;
        o.codes = sp.tables->codes;
        o.qbits = sp.tables->qbits;
        o.T = sp.tables->num_tables;
        o.d = sp.tables->dim;
        o.b = sp.bias;
        o.y = loc[i].p;
        o.y_ld = static_cast<int>(loc[i].ld);
        if (!o.y || (sp.kind == K::Embedding) != is_half(loc[i].dt))
          return what + ": no buffer of the expected type";
        ops.push_back(o);
        loc[i].ready = 1;
        break;
      }
      case K::Mlp: {
        const int j = in[0];
        int stage = loc[j].ready;
        for (size_t k = 0; k < sp.lins.size(); ++k) {
          const Lin& l = *sp.lins[k];
          const bool last = k + 1 == sp.lins.size();
          if (l.out_ld != l.out) return what + ": padded rows";
          const void* x = k == 0 ? loc[j].p : sp.ys[k - 1];
          const int64_t x_ld = k == 0 ? loc[j].ld : sp.lins[k - 1]->out;
          if (k == 0 && !host_dense[j] &&
              (!is_half(loc[j].dt) || (loc[j].placed && l.in_pad != e_.vals[j].width)))
            return what + ": its input is not a 16-bit buffer it can read whole";
          void* y = last ? loc[i].p : sp.ys[k];
          const bool f32_out = last && loc[i].dt == DType::F32;
          const std::string why = linear(l, x, x_ld, k == 0 && host_dense[j], y,
                                         last ? loc[i].ld : l.out, f32_out, stage++);
          if (!why.empty()) return what + ": " + why;
        }
        loc[i].ready = stage;
        break;
      }
      case K::Cross: {
        const int j = in[0];
        if (loc[j].placed || loc[i].placed || !is_half(loc[j].dt) || loc[j].ld != loc[i].ld)
          return what + ": x0 or the output not in a buffer of its own at the same stride";
        int stage = loc[j].ready;
        const void* xl = loc[j].p;
        for (size_t k = 0; k < sp.lins.size(); ++k) {
          const Lin& l = *sp.lins[k];
          const bool v_layer = sp.rank > 0 && k % 2 == 0;  // h = V x_l
          const void* x = v_layer || sp.rank == 0 ? xl : sp.ys[k - 1];
          const int64_t x_ld = v_layer || sp.rank == 0 ? loc[i].ld : sp.lins[k - 1]->out_ld;
          const std::string why = linear(l, x, x_ld, false, sp.ys[k], l.out_ld, false, stage++);
          if (!why.empty()) return what + ": " + why;
          if (!v_layer) {
            ops.back().x0 = loc[j].p;
            ops.back().xl = xl;
            xl = sp.ys[k];
          }
        }
        loc[i].ready = stage;
        break;
      }
      case K::Fm: {
        const int j = in[0];
        if (!is_half(loc[j].dt) || sp.fields * sp.dim != e_.vals[j].width || !loc[i].p)
          return what + ": its input is not 16-bit fields";
        fp::Op o;
        o.kind = fp::OpKind::Fm;
        o.stage = loc[j].ready;
        o.x = loc[j].p;
        o.x_ld = static_cast<int>(loc[j].ld);
        o.T = static_cast<int>(sp.fields);
        o.d = static_cast<int>(sp.dim);
        o.y = loc[i].p;
        o.y_ld = static_cast<int>(loc[i].ld);
        ops.push_back(o);
        loc[i].ready = o.stage + 1;
        break;
      }
      case K::Concat:
        for (int j : in) loc[i].ready = std::max(loc[i].ready, loc[j].ready);
        break;
      case K::Add:  // only as the output's input (below)
        if (users[i].size() != 1 || users[i][0] != spec_.output) return what + ": not the logit";
        break;
      default:
        if (i != spec_.output) return what + ": no fused op";
    }
    if (ops.size() > ops_before) last_op[i] = static_cast<int>(ops.size()) - 1;
  }
  // The logit: an MLP's one-output last layer, plus the add's other (1-wide) inputs.
  const int top = spec_.layers[spec_.output].input_ids.at(0);
  std::vector<int> deep, addends;
  if (parts[top].kind == K::Add)
    for (int j : spec_.layers[top].input_ids)
      (parts[j].kind == K::Mlp ? deep : addends).push_back(j);
  else
    deep.push_back(top);
  if (deep.size() != 1 || parts[deep[0]].kind != K::Mlp || addends.size() > fp::kMaxAddends)
    return "the logit is not one MLP's output (plus at most " +
           std::to_string(fp::kMaxAddends) + " 1-wide values)";
  fp::Op& last = ops.at(last_op[deep[0]]);
  if (last.out != 1 || !last.f32_out) return "the logit's layer has other than one f32 output";
  for (int a : addends) {
    if (e_.vals[a].width != 1 || e_.vals[a].dt != DType::F32 || last_op[a] < 0)
      return "an add input other than a 1-wide f32 value";
    last.addend[last.naddend++] = static_cast<const float*>(loc[a].p);
    last.stage = std::max(last.stage, loc[a].ready);
  }
  last.to_probs = true;
  // Ops in stage order (the logit last, alone in its stage), stages renumbered 0, 1, ...
  const fp::Op logit = last;
  ops.erase(ops.begin() + last_op[deep[0]]);
  for (const fp::Op& o : ops)
    if (o.stage >= logit.stage) return "an op that the logit does not wait for";
  std::stable_sort(ops.begin(), ops.end(),
                   [](const fp::Op& a, const fp::Op& b) { return a.stage < b.stage; });
  ops.push_back(logit);
  int stages = 0, prev = -1;
  for (fp::Op& o : ops) {
    if (o.stage != prev) ++stages;
    prev = o.stage;
    o.stage = stages - 1;
  }
  const std::string why = fp::unsupported(ops.data(), static_cast<int>(ops.size()));
  if (!why.empty()) return why;
  const size_t bytes = sizeof(fp::Op) * ops.size();
  fused_ops_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, dev_);
  copy_bytes(fused_ops_.raw(), dev_, ops.data(), Device::cpu(), bytes);
  fused_prog_ = fp::Program{};
  fused_prog_.num_dense = static_cast<int>(num_dense_);
  fused_prog_.ops = static_cast<const fp::Op*>(fused_ops_.raw());
  fused_prog_.nops = static_cast<int>(ops.size());
  fused_prog_.stages = stages;
  fused_prog_.max_k = max_k;
  return "";
}


bool GraphCuda::fused_launch(InferBucket& bk, int64_t n) {
  if (fused_ == Fused::Unplanned) plan_fused();
  if (fused_ != Fused::On) return false;
  if (!fused_barrier_.defined()) {
    fused_barrier_ = Tensor::empty({8}, DType::U8, dev_);
    DLREC_CUDA_CHECK(cudaMemsetAsync(fused_barrier_.raw(), 0, 8, e_.st));
  }
  if (fused_is_program_) {
    if (n > fused_infer::prog::rows_limit(fused_prog_.max_k)) return false;
    fused_infer::prog::Program p = fused_prog_;
    p.dense = static_cast<const float*>(bk.dev_in);
    p.keys = reinterpret_cast<const uint32_t*>(p.dense + bk.rows * num_dense_);
    p.probs = bk.dev_probs;
    p.rows = static_cast<int>(n);
    p.ld_keys = static_cast<int>(bk.rows);
    p.barrier = static_cast<unsigned*>(fused_barrier_.raw());
    fused_infer::prog::launch(p, e_.half == DType::F16, opts_.infer_fused_blocks,
                              res_->sm_count(), &fused_counter_, e_.st);
    return true;
  }
  fused_infer::Params p = fused_params_;
  p.dense = static_cast<const float*>(bk.dev_in);
  p.keys = reinterpret_cast<const uint32_t*>(p.dense + bk.rows * num_dense_);
  p.probs = bk.dev_probs;
  p.rows = static_cast<int>(n);
  p.ld_keys = static_cast<int>(bk.rows);
  p.barrier = static_cast<unsigned*>(fused_barrier_.raw());
  fused_infer::launch(p, e_.half == DType::F16, opts_.infer_fused_blocks, res_->sm_count(),
                      &fused_counter_, e_.st);
  return true;
}

// Compressed layers: each named weight's Lin gets a CompressedLinear (its 2:4 and int8 forms
// built once, here) that lin_forward asks for the kernel of each batch size; the choice is
// made on a bucket's first, eager run (before its capture). The masks are checked 2:4 here, so
// a bad one is an error naming its layer before anything is built.
void GraphCuda::set_compressed(const std::vector<CompressedWeight>& weights,
                               nn::kernel_choice::Policy policy) {
  if (weights.empty()) return;
  DeviceGuard g(dev_index_);
  materialize_tables();
  // The 2:4 forms are built from the 16-bit copies: bring them up to date with the f32 masters
  // the loader just wrote through parameters() (predict() would only do it on its first call).
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  std::map<std::string, Lin*> lins;
  for (const WeightLin& w : weight_lins()) lins[w.name] = w.lin;
  using nn::cuda_compress::Act;
  const Act act = !e_.lowp ? Act::F32 : e_.half == DType::F16 ? Act::F16 : Act::BF16;
  for (const CompressedWeight& w : weights) {
    auto it = lins.find(w.name);
    DLREC_CHECK(it != lins.end(), "compressed layers: '", w.name,
                "' is not an mlp or cross weight of this model");
    Lin& l = *it->second;
    const bool masked = w.mask.defined();
    if (masked) {
      DLREC_CHECK(w.mask.ndim() == 2 && w.mask.dim(0) == l.out && w.mask.dim(1) == l.in &&
                      w.mask.dtype() == DType::F32,
                  "compressed layers: the mask of '", w.name, "' is not F32 [", l.out, ", ",
                  l.in, "]");
      nn::kernel_choice::check_mask_2_4(w.name, w.mask.data<float>(), l.out, l.in);
    }
    nn::cuda_compress::Int8Weight q;
    if (w.int8) {
      q.q = w.q;
      q.wscale = w.wscale;
      q.xscale = w.xscale;
    }
    l.comp = std::make_shared<nn::cuda_compress::CompressedLinear>(
        w.name, l.out, l.in, l.in_pad, l.relu, act, e_.lowp ? l.wh.raw() : nullptr, masked,
        w.int8 ? &q : nullptr, l.has_bias ? l.b.data<float>() : nullptr, policy, e_.st);
    if (cap_b_ > 0) l.comp->reserve(cap_b_);
    compressed_.push_back(&l);
  }
  // Chains of int8 layers (16-bit engines): a layer whose output only the next reads hands it
  // over quantized where both run int8 kernels.
  for (auto& n : nodes_) {
    std::vector<std::pair<Lin*, Lin*>> pairs;
    n->chainable(pairs);
    for (auto& [a, b] : pairs)
      // The hand-over writes a's outputs as b's whole input row: not where b's input is padded
      // (a low-rank cross of rank 3 in a bf16 engine reads rows of 8); b then quantizes its
      // own input (the parity harness's compressed cases found it refused instead).
      if (a->comp && b->comp && b->in_pad == a->out) a->comp->set_next(b->comp.get(), e_.st);
  }
  if (!comp_lt_) comp_lt_ = std::make_unique<lt::Lt>(res_->blas_lt(), opts_.lt_tune);
  e_.comp_lt = comp_lt_.get();
  kernel_policy_ = policy;
  drop_graphs();  // captured with the dense kernels
  fused_ = Fused::Unplanned;  // the fused kernel's INT8 forms depend on the policy
}

void GraphCuda::set_kernel_policy(nn::kernel_choice::Policy policy) {
  kernel_policy_ = policy;
  for (Lin* l : compressed_) l->comp->set_policy(policy);
  drop_graphs();
  fused_ = Fused::Unplanned;
}

std::vector<std::string> GraphCuda::kernel_report() {
  std::vector<std::string> out;
  if (compressed_.empty()) return out;
  out.push_back(std::string("kernel policy ") + nn::kernel_choice::policy_name(kernel_policy_) +
                (kernel_policy_ == nn::kernel_choice::Policy::Fastest
                     ? "; batches of up to " + std::to_string(opts_.infer_fused_rows) +
                           " rows take the fused small-batch kernel and up to " +
                           std::to_string(cd::kSkinnyRows) +
                           " rows the warp-per-output layer (dense weights)"
                 : kernel_policy_ == nn::kernel_choice::Policy::Compressed && e_.lowp
                     ? "; batches of up to " + std::to_string(opts_.infer_fused_rows) +
                           " rows take the fused small-batch kernel with the INT8 layers in "
                           "int8 and the 2:4 ones on their pruned weights"
                     : ""));
  for (Lin* l : compressed_) out.push_back(l->comp->describe_load());
  for (Lin* l : compressed_)
    for (auto& line : l->comp->describe_choices()) out.push_back(line);
  return out;
}

}  // namespace dlrec::model::graph_cuda_impl
