// The CUDA graph engine's serving path, predict() (graph_cuda_impl.h): host packing into pinned
// buckets, one CUDA graph per power-of-two bucket of rows (copy in on the copy stream, forward,
// sigmoid, copy out), chunks of big batches through two alternating buckets.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "dlrec/core/spin_team.h"
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {
namespace {

// The packing team of predict(), shared by all models of the process (model instances serving
// at once take turns: a packing lasts microseconds), so that no more than `size` threads spin.
// Created on first use with the size asked for then (GraphCudaOptions::infer_pack_threads).
SpinTeam& pack_team(int size) {
  static SpinTeam team(size);
  return team;
}

PinnedPtr mapped_alloc(size_t bytes) {
  void* q = nullptr;
  DLREC_CUDA_CHECK(cudaHostAlloc(&q, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  return PinnedPtr(q);
}

// Spins on the event rather than sleeping in a sync: serving wants the latency.
void spin_wait(cudaEvent_t e) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) DLREC_CUDA_CHECK(q);
  }
}

float sigmoid_host(float z) {
  const double x = z;
  return static_cast<float>(x >= 0 ? 1.0 / (1.0 + std::exp(-x))
                                   : std::exp(x) / (1.0 + std::exp(x)));
}

}  // namespace

void GraphCuda::predict_eager(const io::Batch& batch, float* probs) {
  const std::vector<float> z = forward(batch, false).to_vector<float>();
  for (size_t i = 0; i < z.size(); ++i) probs[i] = sigmoid_host(z[i]);
}

GraphCuda::InferBucket& GraphCuda::infer_bucket(int64_t R, int parity) {
  int lg = 0;
  while ((int64_t{1} << lg) < R) ++lg;
  const size_t i = static_cast<size_t>(2 * lg + parity);
  if (buckets_.size() <= i) buckets_.resize(i + 1);
  auto& bkp = buckets_[i];
  if (bkp) return *bkp;
  auto bk = std::make_unique<InferBucket>();
  bk->rows = R;
  const size_t in_bytes = sizeof(float) * R * num_dense_ + sizeof(uint32_t) * R * T_ + 64;
  // Mapped, so that the fused small-batch kernel reads the inputs and writes the
  // probabilities in place.
  bk->in = mapped_alloc(in_bytes);
  std::memset(bk->in.get(), 0, in_bytes);
  bk->dense = static_cast<float*>(bk->in.get());
  bk->keys = reinterpret_cast<uint32_t*>(bk->dense + R * num_dense_);
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
  bk->d_in = Tensor::empty({static_cast<int64_t>(in_bytes)}, DType::U8, dev_);
  bk->d_probs = Tensor::empty({R}, DType::F32, dev_);
  bk->done = gpu::Event(dev_index_);
  bk->copied = gpu::Event(dev_index_);
  bkp = std::move(bk);
  return *bkp;
}

void GraphCuda::infer_body(InferBucket& bk) {
  const int64_t R = bk.rows;
  e_.B = R;
  e_.nnz = R * T_;
  e_.dense = static_cast<const float*>(bk.d_in.raw());
  e_.keys = reinterpret_cast<const uint32_t*>(e_.dense + R * num_dense_);
  e_.offsets = bk.d_offsets.data<int32_t>();
  e_.serving = true;
  try {
    run_forward();
  } catch (...) {
    e_.serving = false;
    throw;
  }
  e_.serving = false;
  cd::sigmoid(logits(), bk.d_probs.data<float>(), R, e_.st);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(bk.probs, bk.d_probs.raw(), sizeof(float) * R,
                                   cudaMemcpyDeviceToHost, e_.st));
}

// The inputs go over on the copy stream (outside the graph, so that the next chunk's copy
// overlaps this chunk's forward); the first launch of a bucket runs eagerly (cuBLAS/cuBLASLt
// plans, tuning and lazy loading outside the capture), then it is captured once.
void GraphCuda::infer_launch(InferBucket& bk, bool copy_aside) {
  const size_t bytes = sizeof(float) * bk.rows * num_dense_ + sizeof(uint32_t) * bk.rows * T_;
  if (bytes) {
    cudaStream_t cs = copy_aside ? copy_.get() : e_.st;
    DLREC_CUDA_CHECK(
        cudaMemcpyAsync(bk.d_in.raw(), bk.in.get(), bytes, cudaMemcpyHostToDevice, cs));
    if (cs != e_.st) {
      DLREC_CUDA_CHECK(cudaEventRecord(bk.copied, cs));
      DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, bk.copied, 0));
    }
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
  check_batch(batch);
  const int64_t B = batch.rows;
  if (B == 0) return;
  hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr;
  if (profile_ || !graphs_ || hashed) return predict_eager(batch, probs);
  have_training_forward_ = false;
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
  int64_t pending[2] = {-1, -1};  // the chunk waiting in the bucket of parity p
  auto finish = [&](int p) {
    if (pending[p] < 0) return;
    InferBucket& bk = infer_bucket(R, p);
    spin_wait(bk.done);
    const int64_t r0 = pending[p] * chunk, n = std::min(chunk, B - r0);
    std::memcpy(probs + r0, bk.probs, sizeof(float) * n);
    pending[p] = -1;
  };
  auto finish_all = [&] {
    finish(0);
    finish(1);
  };
  for (int64_t c = 0; c < nchunks; ++c) {
    const int p = static_cast<int>(c & 1);
    finish(p);  // the bucket's previous chunk must be out before repacking it
    InferBucket& bk = infer_bucket(R, p);
    const int64_t r0 = c * chunk, n = std::min(chunk, B - r0);
    bool one_hot = false;
    try {
      one_hot = infer_pack(batch, r0, n, bk);
    } catch (...) {
      finish_all();
      throw;
    }
    if (!one_hot) {
      finish_all();
      return predict_eager(batch, probs);
    }
    const bool fuse = nchunks == 1 && n <= opts_.infer_fused_rows && e_.lowp &&
                      fused_ != Fused::Off;
    if (fuse && fused_launch(bk, n)) DLREC_CUDA_CHECK(cudaEventRecord(bk.done, e_.st));
    else infer_launch(bk, nchunks > 1);
    pending[p] = c;
  }
  finish_all();
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
        f.y = mlp->ys[k];
        f.out = static_cast<int>(l.out);
        f.k = static_cast<int>(l.in_pad);
        f.relu = l.relu;
        f.f32_out = f32_out;
      }
    return fi::unsupported(p);
  }();
  if (!why.empty()) {
    if (dlrm_shape)
      std::fprintf(stderr, "[dlrec] fused small-batch inference off for this model: %s\n",
                   why.c_str());
    return;
  }
  fused_params_ = p;
  fused_ = Fused::On;
}

bool GraphCuda::fused_launch(InferBucket& bk, int64_t n) {
  if (fused_ == Fused::Unplanned) plan_fused();
  if (fused_ != Fused::On) return false;
  fused_infer::Params p = fused_params_;
  p.dense = static_cast<const float*>(bk.dev_in);
  p.keys = reinterpret_cast<const uint32_t*>(p.dense + bk.rows * num_dense_);
  p.probs = bk.dev_probs;
  p.rows = static_cast<int>(n);
  p.ld_keys = static_cast<int>(bk.rows);
  if (!fused_barrier_.defined()) {
    fused_barrier_ = Tensor::empty({8}, DType::U8, dev_);
    DLREC_CUDA_CHECK(cudaMemsetAsync(fused_barrier_.raw(), 0, 8, e_.st));
  }
  p.barrier = static_cast<unsigned*>(fused_barrier_.raw());
  fused_infer::launch(p, e_.half == DType::F16, opts_.infer_fused_blocks, res_->sm_count(),
                      &fused_counter_, e_.st);
  return true;
}

}  // namespace dlrec::model::graph_cuda_impl
