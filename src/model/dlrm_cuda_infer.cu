// The CUDA DLRM's serving path, predict(): packing on the spin team, one CUDA graph per
// power-of-two bucket, the fused small-batch kernel (model/dlrm_cuda_impl.h).
#include "model/dlrm_cuda_impl.h"

namespace dlrec::model::dlrm_cuda_impl {

void DlrmCuda::infer_body(InferBucket& bk) {
  const int64_t R = bk.rows;
  cur_ = 0;
  fwd_rows_ = R;
  fwd_nnz_ = R * T_;
  // The inputs were copied into bk.d_in by infer_launch (on the copy stream, outside the
  // graph, so that the copy of the next chunk overlaps this one); the offsets (one id per bag)
  // are the bucket's constants.
  infer_in_.dense = static_cast<const float*>(bk.d_in.raw());
  infer_in_.keys = reinterpret_cast<const uint32_t*>(infer_in_.dense + R * num_dense_);
  infer_in_.offsets = bk.d_offsets.data<int32_t>();
  try {
    run_forward(false);
  } catch (...) {
    infer_in_ = {};
    throw;
  }
  infer_in_ = {};
  cd::sigmoid(top_.back().y.data<float>(), bk.d_probs.data<float>(), R, stream_);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(bk.probs, bk.d_probs.raw(), sizeof(float) * R,
                                   cudaMemcpyDeviceToHost, stream_));
}

DlrmCuda::InferBucket& DlrmCuda::infer_bucket(int64_t R, int parity) {
  int lg = 0;
  while ((int64_t{1} << lg) < R) ++lg;
  const size_t i = static_cast<size_t>(2 * lg + parity);
  if (buckets_.size() <= i) buckets_.resize(i + 1);
  if (R > cap_b_ || R * T_ > cap_nnz_) ensure_capacity(R, std::max<int64_t>(R * T_, 1));
  auto& bkp = buckets_[i];
  if (!bkp) {
    bkp = std::make_unique<InferBucket>();
    InferBucket& bk = *bkp;
    bk.rows = R;
    const size_t in_bytes = sizeof(float) * R * num_dense_ + sizeof(uint32_t) * R * T_ + 64;
    // Mapped, so that the fused small-batch kernel can read it in place.
    auto mapped_alloc = [](size_t bytes) {
      void* q = nullptr;
      DLREC_CUDA_CHECK(cudaHostAlloc(&q, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      return PinnedPtr(q);
    };
    bk.in = mapped_alloc(in_bytes);
    std::memset(bk.in.get(), 0, in_bytes);
    bk.dense = static_cast<float*>(bk.in.get());
    bk.keys = reinterpret_cast<uint32_t*>(bk.dense + R * num_dense_);
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t r = 0; r < R; ++r) bk.keys[t * R + r] = row_base_host_[t];  // padding: row 0
    bk.out = mapped_alloc(sizeof(float) * R);
    void* din = nullptr;
    void* dout = nullptr;
    DLREC_CUDA_CHECK(cudaHostGetDevicePointer(&din, bk.in.get(), 0));
    DLREC_CUDA_CHECK(cudaHostGetDevicePointer(&dout, bk.out.get(), 0));
    bk.dev_in = din;
    bk.dev_out = static_cast<float*>(dout);
    bk.probs = static_cast<float*>(bk.out.get());
    std::vector<int32_t> off(R * T_ + 1);
    for (int64_t k = 0; k <= R * T_; ++k) off[k] = static_cast<int32_t>(k);
    bk.d_offsets = Tensor::from_vector(off, {R * T_ + 1}, dev_);
    bk.d_in = dev_tensor({static_cast<int64_t>(in_bytes)}, DType::U8);
    bk.d_probs = dev_tensor({R});
    bk.done = gpu::Event(dev_index_);
    bk.copied = gpu::Event(dev_index_);
  }
  return *bkp;
}

void DlrmCuda::infer_launch(InferBucket& bk, bool copy_aside) {
  const size_t bytes = sizeof(float) * bk.rows * num_dense_ + sizeof(uint32_t) * bk.rows * T_;
  if (bytes) {
    cudaStream_t cs = overlap_ && copy_aside ? copy_.get() : stream_.get();
    DLREC_CUDA_CHECK(cudaMemcpyAsync(bk.d_in.raw(), bk.in.get(), bytes, cudaMemcpyHostToDevice,
                                     cs));
    if (cs != stream_) {
      DLREC_CUDA_CHECK(cudaEventRecord(bk.copied, cs));
      DLREC_CUDA_CHECK(cudaStreamWaitEvent(stream_, bk.copied, 0));
    }
  }
  if (timing_ && !copy_aside) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[1], stream_));
  if (graphs_ && !bk.graph && !bk.no_graph) {
    infer_body(bk);  // eager once: plans, tuning and lazy loading outside the capture
    DLREC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    bk.graph = capture(stream_, [&] { infer_body(bk); }, "inference step");
    bk.no_graph = !bk.graph;
  }
  if (bk.graph) DLREC_CUDA_CHECK(cudaGraphLaunch(bk.graph.get(), stream_));
  else infer_body(bk);
  DLREC_CUDA_CHECK(cudaEventRecord(bk.done, stream_));
}

bool DlrmCuda::fused_launch(InferBucket& bk, int64_t n) {
  namespace fi = fused_infer;
  fi::Params p;
  p.nb = static_cast<int>(bottom_.size());
  p.nt = static_cast<int>(top_.size());
  std::string why;
  if (p.nb + p.nt > fi::kMaxLayers) {
    why = "more than " + std::to_string(fi::kMaxLayers) + " layers";
  } else {
    p.dense = static_cast<const float*>(bk.dev_in);
    p.keys = reinterpret_cast<const uint32_t*>(p.dense + bk.rows * num_dense_);
    p.probs = bk.dev_out;
    p.rows = static_cast<int>(n);
    p.ld_keys = static_cast<int>(bk.rows);
    p.num_dense = static_cast<int>(num_dense_);
    p.T = static_cast<int>(T_);
    p.d = static_cast<int>(dim_);
    p.inter_ld = static_cast<int>(inter_ld_);
    p.emb = emb_out_.raw();
    p.inter = inter_.raw();
    p.tables = tab_.weights;
    p.row_base = tab_.row_base;
    int i = 0;
    for (auto* mlp : {&bottom_, &top_})
      for (auto& l : *mlp) {
        fi::Layer& f = p.layer[i++];
        f.w = l.wh.raw();
        f.b = l.out_f32 ? l.b.raw() : l.bh.raw();
        f.y = l.y.raw();
        f.out = static_cast<int>(l.out);
        f.k = static_cast<int>(l.in_pad);
        f.relu = l.relu;
        f.f32_out = l.out_f32;
      }
    why = fi::unsupported(p);
  }
  if (!why.empty()) {
    std::fprintf(stderr, "[dlrec] fused small-batch inference off for this model: %s\n",
                 why.c_str());
    fused_ = false;
    return false;
  }
  if (!fused_barrier_.defined()) {
    fused_barrier_ = dev_tensor({8}, DType::U8);
    DLREC_CUDA_CHECK(cudaMemsetAsync(fused_barrier_.raw(), 0, 8, stream_));
  }
  p.barrier = static_cast<unsigned*>(fused_barrier_.raw());
  fi::launch(p, fp16_, fused_blocks_, res_->sm_count(), &fused_counter_, stream_);
  return true;
}

namespace {

// The packing team of predict(), shared by all models of the process (model instances serving
// at once take turns: a packing lasts microseconds), so that no more than `size` threads spin.
// Created on first use with the size asked for then (DlrmCudaOptions::infer_pack_threads).
SpinTeam& pack_team(int size) {
  static SpinTeam team(size);
  return team;
}

// Spins on the event rather than sleeping in a sync: serving wants the latency.
void spin_wait(cudaEvent_t e) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) DLREC_CUDA_CHECK(q);
  }
}

}  // namespace

void DlrmCuda::predict(const io::Batch& batch, float* probs) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  const int64_t B = batch.rows;
  if (B == 0) return;
  auto eager = [&] {
    std::vector<float> z = forward(batch, false).to_vector<float>();
    for (int64_t i = 0; i < B; ++i) probs[i] = 1.f / (1.f + std::exp(-z[i]));
  };
  if (profile_) return eager();
  absorb_external_writes();
  const auto t_start = std::chrono::steady_clock::now();
  double pack_us = 0;  // DLREC_INFER_TIMING: host packing time of this call
  // Batches over infer_chunk_ rows (DlrmCudaOptions::infer_chunk) go in chunks through two
  // alternating buckets, so the host packs chunk c + 1 while the GPU runs chunk c.
  const int64_t chunk = std::min(B, infer_chunk_);
  int64_t R = 1;
  while (R < chunk) R *= 2;
  const int64_t nchunks = (B + chunk - 1) / chunk;
  int64_t pending[2] = {-1, -1};  // chunk waiting in bucket parity p
  auto finish = [&](int p) {
    if (pending[p] < 0) return;
    InferBucket& bk = infer_bucket(R, p);
    spin_wait(bk.done);
    const int64_t r0 = pending[p] * chunk, n = std::min(chunk, B - r0);
    std::memcpy(probs + r0, bk.probs, sizeof(float) * n);
    pending[p] = -1;
  };
  for (int64_t c = 0; c < nchunks; ++c) {
    const int p = static_cast<int>(c & 1);
    finish(p);  // the bucket's previous chunk must be out before repacking it
    InferBucket& bk = infer_bucket(R, p);
    const int64_t r0 = c * chunk, n = std::min(chunk, B - r0);
    // Pack rows [r0, r0 + n): dense rows, then one global row per (table, row); ids are
    // range-checked. A table with other than one id per row sends the batch to the eager
    // path. Small chunks are packed on this thread (waking threads costs more).
    std::atomic<bool> multi_hot{false};
    auto pack = [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        // One id per row: offsets o0, o0 + 1, ..., o0 + n (checked without branches, so the
        // loop vectorises; not read at all when the producer promises one id per row), then
        // ids range-checked (unsigned: negatives too) and offset.
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
        DLREC_CHECK(static_cast<int64_t>(batch.cat_indices[t].size()) >= o0 + n,
                    "predict: feature ", t, " has ", batch.cat_indices[t].size(), " ids for ",
                    o0 + n, " rows (a batch promising one id per row must hold one per row)");
        const int64_t* ids = batch.cat_indices[t].data() + o0;
        const int64_t rows = layout_.cardinalities[t];
        const uint32_t base = row_base_host_[t];
        uint32_t* k = bk.keys + t * R;
        // 0 <= id < rows  <=>  the sign bits of id and of ~(id - rows) are both clear: adds,
        // nots and ors only, so the loop vectorises without 64-bit compares.
        // (Unsigned arithmetic: no overflow for any id.)
        const uint64_t urows = static_cast<uint64_t>(rows);
        uint64_t sign = 0;
        for (int64_t r = 0; r < n; ++r) {
          const uint64_t id = static_cast<uint64_t>(ids[r]);
          sign |= id | ~(id - urows);
          k[r] = base + static_cast<uint32_t>(id);
        }
        if (sign >> 63) {
          for (int64_t r = 0; r < n; ++r) k[r] = base;  // padding of later calls stays valid
          for (int64_t r = 0; r < n; ++r)
            if (ids[r] < 0 || ids[r] >= rows)
              fail("EmbeddingBag: id ", ids[r], " of table ", t, " is out of range [0, ", rows,
                   ")");
        }
      }
    };
    try {
      // Up to 16384 ids on this thread; more on the packing team (threads that stay awake
      // between calls: a dispatch costs no wake-up), a contiguous range of tables each.
      constexpr int64_t kSerialIds = 16384;
      if (n * T_ <= kSerialIds || pack_threads_ == 1) {
        pack(0, T_);
      } else {
        SpinTeam& team = pack_team(pack_threads_);
        const int64_t parts = team.size();
        team.run([&](int i) { pack(T_ * i / parts, T_ * (i + 1) / parts); });
      }
    } catch (...) {
      finish(0);
      finish(1);
      throw;
    }
    if (multi_hot) {
      for (int64_t t = 0; t < T_; ++t)
        for (int64_t r = 0; r < n; ++r) bk.keys[t * R + r] = row_base_host_[t];
      finish(0);
      finish(1);
      return eager();
    }
    if (n * num_dense_ > 0)
      std::memcpy(bk.dense, batch.dense.data() + r0 * num_dense_, sizeof(float) * n * num_dense_);
    if (timing_)
      pack_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                           t_start).count();
    // Rows n..R-1 keep an earlier call's inputs: valid rows and finite values, outputs unread.
    if (timing_ && nchunks == 1) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[0], stream_));
    const bool fuse = nchunks == 1 && n <= fused_rows_ && fused_ && half_;
    if (fuse && timing_) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[1], stream_));  // no copy
    if (fuse && fused_launch(bk, n)) {
      DLREC_CUDA_CHECK(cudaEventRecord(bk.done, stream_));
    } else {
      infer_launch(bk, nchunks > 1);
    }
    if (timing_ && nchunks == 1) DLREC_CUDA_CHECK(cudaEventRecord(timing_ev_[2], stream_));
    pending[p] = c;
  }
  for (int64_t c = std::max<int64_t>(0, nchunks - 2); c < nchunks; ++c) finish(static_cast<int>(c & 1));
  if (timing_ && nchunks == 1 && timing_skip_ > 0) {
    --timing_skip_;
  } else if (timing_ && nchunks == 1) {
    float copy_ms = 0, graph_ms = 0;
    // The end event was recorded after bk.done, which is all that finish() waited for.
    DLREC_CUDA_CHECK(cudaEventSynchronize(timing_ev_[2]));
    DLREC_CUDA_CHECK(cudaEventElapsedTime(&copy_ms, timing_ev_[0], timing_ev_[1]));
    DLREC_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, timing_ev_[1], timing_ev_[2]));
    timing_sum_[0] += pack_us;
    timing_sum_[1] += 1000.0 * copy_ms;
    timing_sum_[2] += 1000.0 * graph_ms;
    timing_sum_[3] += std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t_start).count();
    ++timing_calls_;
    timing_rows_ = B;
  }
}

}  // namespace dlrec::model::dlrm_cuda_impl
