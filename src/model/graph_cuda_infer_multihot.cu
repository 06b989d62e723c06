// predict() of batches with several ids per row (graph_cuda_impl.h): chunks through buckets of
// R rows and a power-of-two id capacity, one CUDA graph each. A chunk's offsets and ids travel
// with it (the one-hot buckets' offsets are constant): the embedding's forward reads the bags
// from the offsets alone, so one graph serves every chunk whose ids fit its capacity, and the
// rows past a chunk are empty bags. Like the MLPerf DCNv2 model's 214 ids per row.
#include <algorithm>
#include <cstring>

#include "dlrec/core/spin_team.h"
#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {

GraphCuda::InferBucket& GraphCuda::multihot_bucket(int64_t R, int64_t id_cap, int parity) {
  auto& bkp = mh_buckets_[{log2_ceil(R), log2_ceil(id_cap), parity}];
  if (bkp) return *bkp;
  auto bk = std::make_unique<InferBucket>();
  bk->rows = R;
  bk->id_cap = id_cap;
  bk->offsets_at = align16(sizeof(float) * R * num_dense_);
  bk->keys_at = align16(bk->offsets_at + sizeof(int32_t) * (R * T_ + 1));
  size_t in_bytes = bk->keys_at + sizeof(uint32_t) * id_cap;
  if (emb_ && emb_->hashed()) {
    bk->keys64_at = align16(in_bytes);
    in_bytes = bk->keys64_at + sizeof(int64_t) * id_cap;
  }
  bk->in = mapped_alloc(in_bytes);
  std::memset(bk->in.get(), 0, in_bytes);
  char* in = static_cast<char*>(bk->in.get());
  bk->dense = reinterpret_cast<float*>(in);
  bk->offsets = reinterpret_cast<int32_t*>(in + bk->offsets_at);
  bk->keys = reinterpret_cast<uint32_t*>(in + bk->keys_at);
  if (bk->keys64_at) bk->keys64 = reinterpret_cast<int64_t*>(in + bk->keys64_at);
  bk->out = mapped_alloc(sizeof(float) * R);
  bk->probs = static_cast<float*>(bk->out.get());
  bucket_device_side(*bk, in_bytes);
  bkp = std::move(bk);
  return *bkp;
}

std::vector<int64_t> GraphCuda::multihot_starts(const io::Batch& batch, int64_t r0,
                                                int64_t n) const {
  std::vector<int64_t> start(T_ + 1, 0);
  for (int64_t t = 0; t < T_; ++t) {  // the chunk's ids of each table lie in its array
    const int64_t lo = batch.cat_offsets[t][r0], hi = batch.cat_offsets[t][r0 + n];
    DLREC_CHECK(0 <= lo && lo <= hi && hi <= static_cast<int64_t>(batch.cat_indices[t].size()),
                "predict: categorical feature ", t, ": offsets decrease or leave its ",
                batch.cat_indices[t].size(), " ids between rows ", r0, " and ", r0 + n);
    start[t + 1] = start[t] + hi - lo;
  }
  DLREC_CHECK(start[T_] < (int64_t{1} << 31), "predict: a chunk of ", n, " rows holds ",
              start[T_], " ids, more than int32 offsets address");
  return start;
}

GraphCuda::InferBucket& GraphCuda::multihot_bucket_for(int64_t R, int64_t ids, int parity) {
  return multihot_bucket(R, int64_t{1} << log2_ceil(std::max<int64_t>(ids, 1)), parity);
}

void GraphCuda::multihot_pack(const io::Batch& batch, int64_t r0, int64_t n,
                              const std::vector<int64_t>& start, InferBucket& bk,
                              cudaStream_t copy_on) {
  const int64_t R = bk.rows;
  DLREC_CHECK(start[T_] <= bk.id_cap, "predict: a chunk of ", start[T_], " ids in a bucket for ",
              bk.id_cap, " (bug)");
  auto pack_offsets = [&](int64_t t_lo, int64_t t_hi) {
    for (int64_t t = t_lo; t < t_hi; ++t) {
      const int64_t* off = batch.cat_offsets[t].data() + r0;
      const int32_t pos = static_cast<int32_t>(start[t]);
      int32_t* o = bk.offsets + t * R;
      for (int64_t r = 0; r < n; ++r) {
        DLREC_CHECK(off[r] <= off[r + 1], "predict: categorical feature ", t,
                    ": offsets decrease at row ", r0 + r);
        o[r] = pos + static_cast<int32_t>(off[r] - off[0]);
      }
      const int32_t end = static_cast<int32_t>(start[t + 1]);
      for (int64_t r = n; r < R; ++r) o[r] = end;  // empty bags
      if (bk.keys64 && end > pos)  // hashed tables: the keys as they are
        std::memcpy(bk.keys64 + pos, batch.cat_indices[t].data() + off[0],
                    sizeof(int64_t) * (end - pos));
    }
  };
  const int64_t N = start[T_];
  if (n * num_dense_ > 0)
    std::memcpy(bk.dense, batch.dense.data() + r0 * num_dense_, sizeof(float) * n * num_dense_);
  bk.offsets[T_ * R] = static_cast<int32_t>(N);
  bk.nnz = N;
  char* host = static_cast<char*>(bk.in.get());
  char* dev = static_cast<char*>(bk.d_in.raw());
  auto copy = [&](size_t from, size_t to) {  // bytes [from, to) of the inputs, when asked
    if (copy_on && to > from)
      DLREC_CUDA_CHECK(
          cudaMemcpyAsync(dev + from, host + from, to - from, cudaMemcpyHostToDevice, copy_on));
  };
  auto ids_at = [&](int64_t i) { return bk.keys_at + sizeof(uint32_t) * i; };
  if (N + T_ * n <= 16384 || pack_threads_ == 1) {  // small chunks on this thread
    pack_offsets(0, T_);
    pack_ids(batch, r0, start, 0, N, layout_.cardinalities, row_base_, bk.keys);
    copy(0, ids_at(N));
    if (bk.keys64) copy(bk.keys64_at, bk.keys64_at + sizeof(int64_t) * N);
    return;
  }
  // On the serving packing team (awake between calls), each member an equal share of the ids
  // (MLPerf DCNv2's table 20 holds 100 of a row's 214: by table one member would pack half),
  // in up to 4 phases of at least 65,536 ids, each phase's bytes copied while the team packs
  // the next (the dense rows and offsets, a range of tables per member, with the first).
  SpinTeam& team = pack_team(pack_threads_);
  const int64_t parts = team.size();
  const int64_t phases = std::clamp<int64_t>(N / 65536, 1, 4);
  try {
    for (int64_t k = 0; k < phases; ++k) {
      const int64_t lo = N * k / phases, hi = N * (k + 1) / phases;
      team.run([&](int i) {
        if (k == 0) pack_offsets(T_ * i / parts, T_ * (i + 1) / parts);
        pack_ids(batch, r0, start, lo + (hi - lo) * i / parts, lo + (hi - lo) * (i + 1) / parts,
                 layout_.cardinalities, row_base_, bk.keys);
      });
      copy(k == 0 ? 0 : ids_at(lo), ids_at(hi));
      if (k == 0 && bk.keys64) copy(bk.keys64_at, bk.keys64_at + sizeof(int64_t) * N);
    }
  } catch (...) {
    // A bad id in a later phase: the earlier phases' copies still read this bucket, which the
    // next call may repack.
    if (copy_on) cudaStreamSynchronize(copy_on);
    throw;
  }
}

void GraphCuda::predict_multihot(const io::Batch& batch, float* probs) {
  const int64_t B = batch.rows;
  const int64_t chunk = std::min(B, opts_.infer_chunk);
  const int64_t R = int64_t{1} << log2_ceil(chunk);
  const bool copy_aside = B > chunk;
  run_chunks(B, chunk, probs, [&](int64_t r0, int64_t n, int p) {
    const std::vector<int64_t> start = multihot_starts(batch, r0, n);
    InferBucket& bk = multihot_bucket_for(R, start[T_], p);
    multihot_pack(batch, r0, n, start, bk, copy_aside ? copy_.get() : e_.st);
    infer_launch(bk, copy_aside, /*copied=*/true);
    return &bk;
  });
}

}  // namespace dlrec::model::graph_cuda_impl
