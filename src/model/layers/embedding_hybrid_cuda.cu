// Hybrid tables on the GPUs (embedding_node_cuda.h, docs/DISTRIBUTED.md "Hybrid tables on the
// GPUs"): the rows a table's owner pools from its ids >= F, written straight into the receiving
// rank's buffer, and their gradients written back into the owner's; the buffers are mapped
// between the ranks' processes with CUDA IPC.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "model/layers/embedding_node_cuda.h"

namespace dlrec::cuda_impl {
// device_cuda.cu: device memory allocated outside the pool, counted in its use and peak.
void count_outside_pool(int device, size_t bytes, bool allocated);
}  // namespace dlrec::cuda_impl

namespace dlrec::model::gpu_graph::emb {
namespace {

constexpr int kWarps = 8;  // warps per block; one warp per (row, table)

unsigned warp_blocks(int64_t warps) {
  return static_cast<unsigned>(std::min<int64_t>((warps + kWarps - 1) / kWarps, 1 << 20));
}

// Lane `lane` of a warp copies (or adds) a row of dim values.
template <class T>
__device__ __forceinline__ float to_f(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
}
template <class T>
__device__ __forceinline__ T from_f(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
}

// A warp's lanes copy a row of dim values (16-byte vectors when the row's bytes allow: the
// rows then start 16-byte aligned, as every buffer here does).
template <class T>
__device__ __forceinline__ void copy_row(T* dst, const T* src, int dim, int lane) {
  if ((dim * sizeof(T)) % 16 == 0) {
    const int n = dim * sizeof(T) / 16;
    for (int i = lane; i < n; i += 32)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    return;
  }
  for (int c = lane; c < dim; c += 32) dst[c] = src[c];
}

// Whether one of the `n` keys at k (a warp's lanes reading them) is not `other`.
__device__ __forceinline__ bool any_key_not(const uint32_t* k, int32_t n, uint32_t other,
                                            int lane) {
  bool hit = false;
  for (int32_t i = lane; i < n; i += 32) hit |= k[i] != other;
  return __any_sync(0xffffffffu, hit);
}

// Whether one of a bag's ids (keys row_base + id) is >= F.
__device__ __forceinline__ bool any_rare(const uint32_t* k, int32_t n, int64_t base, int64_t f,
                                         int lane) {
  bool hit = false;
  for (int32_t i = lane; i < n; i += 32) hit |= static_cast<int64_t>(k[i]) - base >= f;
  return __any_sync(0xffffffffu, hit);
}

// The owner: padded global row p = r * bmax + b (b < rows[r]) of its piece m, pooled into
// pool [Gp, M, dim], goes to rank r's receive buffer [cap, K, dim] at (b, slot) when its bag has
// some id >= F (a key other than the piece's zero row). rinfo: RwLayout's [5 M]; slots [M].
template <class H>
__global__ void push_pooled(dp::RankGeometry g, int64_t bmax, int64_t M, int64_t K, int dim,
                            const H* __restrict__ pool, const int32_t* __restrict__ off,
                            const uint32_t* __restrict__ keys, const int64_t* __restrict__ rinfo,
                            const int64_t* __restrict__ slots, void* const* __restrict__ peers) {
  const int lane = threadIdx.x & 31;
  const int64_t Gp = g.ranks * bmax, warps = Gp * M;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < warps;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t m = w / Gp, p = w - m * Gp;
    const int r = static_cast<int>(p / bmax);
    const int64_t b = p - r * bmax;
    if (b >= g.rows[r]) continue;
    const int64_t bag = m * Gp + p;
    const uint32_t zero_row =
        static_cast<uint32_t>(rinfo[5 * m + 4] + rinfo[5 * m + 3] - rinfo[5 * m + 2]);
    if (!any_key_not(keys + off[bag], off[bag + 1] - off[bag], zero_row, lane)) continue;
    const H* src = pool + (p * M + m) * dim;
    copy_row(static_cast<H*>(peers[r]) + (b * K + slots[m]) * dim, src, dim, lane);
  }
}

// Every rank: out[b, t] += recv[b, k] for its rows whose bag of table t (slot k) has an id >= F.
// info [6 K]: table, row_base, F, owner, owner's slot, owner's tables.
template <class H>
__global__ void add_received(int64_t B, int64_t K, int dim, const int32_t* __restrict__ off,
                             const uint32_t* __restrict__ keys, const int64_t* __restrict__ info,
                             const H* __restrict__ recv, H* __restrict__ out, int64_t ld) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = B * K;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < warps;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t k = w / B, b = w - k * B, t = info[6 * k];
    const int64_t bag = t * B + b;
    if (!any_rare(keys + off[bag], off[bag + 1] - off[bag], info[6 * k + 1], info[6 * k + 2], lane))
      continue;
    const H* src = recv + (b * K + k) * dim;
    H* dst = out + b * ld + t * dim;
    for (int c = lane; c < dim; c += 32) dst[c] = from_f<H>(to_f(dst[c]) + to_f(src[c]));
  }
}

// Every rank: the gradient of its row b's column of table t (slot k), when that bag has an id
// >= F, into the owner's buffer [Gp, M_o, dim] at padded row row0 + b, the owner's slot.
template <class S, class W>
__global__ void push_grads(int64_t B, int64_t K, int dim, const int32_t* __restrict__ off,
                           const uint32_t* __restrict__ keys, const int64_t* __restrict__ info,
                           int64_t row0, const S* __restrict__ grad, int64_t ld,
                           void* const* __restrict__ peers) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = B * K;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < warps;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t k = w / B, b = w - k * B;
    const int64_t* in = info + 6 * k;
    const int64_t bag = in[0] * B + b;
    if (!any_rare(keys + off[bag], off[bag + 1] - off[bag], in[1], in[2], lane)) continue;
    const S* src = grad + b * ld + in[0] * dim;
    W* dst = static_cast<W*>(peers[in[3]]) + ((row0 + b) * in[5] + in[4]) * dim;
    if constexpr (std::is_same_v<S, W>) {
      if ((ld * sizeof(S)) % 16 == 0 && reinterpret_cast<uintptr_t>(grad) % 16 == 0) {
        copy_row(dst, src, dim, lane);
        continue;
      }
    }
    if (dim % 8 == 0 && (ld % 8) == 0) {  // 8 values per lane, one 16-byte store (16-bit W)
      for (int i = lane; i < dim / 8; i += 32) {
        alignas(16) W v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = from_f<W>(to_f(src[8 * i + j]));
        for (int j = 0; j < static_cast<int>(sizeof(v) / 16); ++j)
          reinterpret_cast<uint4*>(dst + 8 * i)[j] = reinterpret_cast<const uint4*>(v)[j];
      }
      continue;
    }
    for (int c = lane; c < dim; c += 32) dst[c] = from_f<W>(to_f(src[c]));
  }
}

// The machine: its host name and the kernel's boot id (containers of one host share it).
uint64_t host_key() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string key = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (std::getline(boot, id)) key += "/" + id;
  return std::hash<std::string>{}(key);
}

}  // namespace

EmbeddingNode::PeerBuffer::~PeerBuffer() {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  for (void* p : peer)
    if (p && p != mine) cudaIpcCloseMemHandle(p);
  if (mine) {
    cudaFree(mine);
    cuda_impl::count_outside_pool(device, bytes, false);
  }
  cudaSetDevice(prev);
}

std::unique_ptr<EmbeddingNode::PeerBuffer> EmbeddingNode::open_peer_buffer(Engine& e,
                                                                           size_t bytes) {
  auto b = std::make_unique<PeerBuffer>();
  b->device = e.dev.index;
  bytes = std::max<size_t>(bytes, 256);
  // Not from the pool: cudaIpcGetMemHandle needs the base of a cudaMalloc'd block. Counted in
  // the pool's use and peak all the same, so "peak memory" includes these buffers.
  DLREC_CUDA_CHECK(cudaMalloc(&b->mine, bytes));
  b->bytes = bytes;
  cuda_impl::count_outside_pool(b->device, bytes, true);
  DLREC_CUDA_CHECK(cudaMemset(b->mine, 0, bytes));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(0));  // zero before a peer or our streams write it
  struct Record {
    cudaIpcMemHandle_t handle;
    uint64_t host;
  } rec{};
  DLREC_CUDA_CHECK(cudaIpcGetMemHandle(&rec.handle, b->mine));
  rec.host = host_key();
  const int n = e.dp.ranks;
  Tensor send = Tensor::empty({static_cast<int64_t>(sizeof rec)}, DType::U8, e.dev);
  Tensor recv = Tensor::empty({static_cast<int64_t>(n * sizeof rec)}, DType::U8, e.dev);
  copy_bytes(send.raw(), e.dev, &rec, Device::cpu(), sizeof rec);
  e.dp.comm->all_gather(send.raw(), recv.raw(), sizeof rec, dist::Elem::U8);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e.dp.cst));
  std::vector<Record> all(n);
  copy_bytes(all.data(), Device::cpu(), recv.raw(), e.dev, n * sizeof rec);
  b->peer.assign(n, nullptr);
  for (int r = 0; r < n; ++r) {
    if (r == e.dp.rank) {
      b->peer[r] = b->mine;
      continue;
    }
    DLREC_CHECK(all[r].host == rec.host, "layer '", name_,
                "': hybrid tables on the GPUs need every rank on one host (their rows move "
                "between the GPUs through CUDA IPC); rank ",
                r, " runs on another host than rank ", e.dp.rank,
                ": make these tables table_wise or row_wise");
    const cudaError_t err =
        cudaIpcOpenMemHandle(&b->peer[r], all[r].handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) cudaGetLastError();
    DLREC_CHECK(err == cudaSuccess, "layer '", name_, "': hybrid tables: rank ", e.dp.rank,
                " cannot map rank ", r,
                "'s buffer (cudaIpcOpenMemHandle: ", cudaGetErrorString(err),
                "); hybrid tables on the GPUs need GPUs of one host that reach each other "
                "(NVLink or PCIe peer access)");
  }
  b->dev = upload_bytes(e, b->peer.data(), n * sizeof(void*));
  return b;
}

void EmbeddingNode::hybrid_barrier(Engine& e, const char* what) {
  e.comm_fork(what, hy_done_,
              [&](dist::Communicator& c) { c.all_reduce(hy_flag_.raw(), 1, dist::Elem::I32); });
}

void EmbeddingNode::alloc_hybrid(Engine& e, int64_t max_nnz) {
  if (hy_recv_ || hy_grecv_) {  // a larger capacity: no rank reads the old buffers any more
    DLREC_CUDA_CHECK(cudaDeviceSynchronize());
    e.dp.comm->barrier();
    hy_recv_.reset();
    hy_grecv_.reset();
  }
  hy_all_ = e.dp.hybrid;
  std::sort(hy_all_.begin(), hy_all_.end(),
            [](const dp::HybridTable& a, const dp::HybridTable& b) { return a.table < b.table; });
  hy_K_ = static_cast<int64_t>(hy_all_.size());
  hy_M_ = 0;
  hy_mine_.clear();
  if (hy_K_ == 0) return;
  DLREC_CHECK(!mean_, "layer '", name_,
              "': hybrid tables on the GPUs pool by sum (this layer pools by mean)");
  const int n = e.dp.ranks;
  const int64_t dim = ts_.dim;
  std::vector<int64_t> owner_m(n, 0), info, rinfo, slots;
  std::vector<float*> wp, sp;
  std::vector<uint32_t> local_base;
  for (const dp::HybridTable& h : hy_all_) ++owner_m[h.owner];
  std::vector<int64_t> next(n, 0);
  uint64_t total = 0;
  for (int64_t k = 0; k < hy_K_; ++k) {
    const dp::HybridTable& h = hy_all_[k];
    const int64_t t = h.table;
    info.insert(info.end(), {t, static_cast<int64_t>(ts_.row_base[t]), h.frequent, h.owner,
                             next[h.owner]++, owner_m[h.owner]});
    if (h.owner != e.dp.rank) continue;
    DLREC_CHECK(t < static_cast<int64_t>(ts_.rare.size()) && ts_.rare[t].defined() &&
                    ts_.rare[t].shape()[0] == ts_.rows[t] - h.frequent + 1,
                "hybrid table ", t, "'s rows >= F are not allocated on its owner (bug)");
    hy_mine_.push_back(k);
    slots.push_back(k);
    rinfo.insert(rinfo.end(), {tv_pos_[t], static_cast<int64_t>(ts_.row_base[t]), h.frequent,
                               ts_.rows[t], static_cast<int64_t>(total)});
    local_base.push_back(static_cast<uint32_t>(total));
    total += static_cast<uint64_t>(ts_.rows[t] - h.frequent + 1);
    wp.push_back(ts_.rare[t].data<float>());
    if (e.emb_adagrad) sp.push_back(ts_.rare_states[t].data<float>());
  }
  hy_M_ = static_cast<int64_t>(hy_mine_.size());
  info.insert(info.end(), slots.begin(), slots.end());
  hy_info_ = upload_bytes(e, info.data(), info.size() * sizeof(int64_t));
  hy_rinfo_ = upload_bytes(e, rinfo.data(), rinfo.size() * sizeof(int64_t));
  hy_rl_ = dp::RwLayout{static_cast<const int64_t*>(hy_rinfo_.raw()), hy_M_};
  hy_key_bits_ = 1;
  while (hy_key_bits_ < 32 && (uint64_t{1} << hy_key_bits_) < total) ++hy_key_bits_;
  hy_ptrs_ = upload_bytes(e, wp.data(), wp.size() * sizeof(float*));
  hy_sptrs_ = upload_bytes(e, sp.data(), sp.size() * sizeof(float*));
  hy_base_ = upload_bytes(e, local_base.data(), local_base.size() * sizeof(uint32_t));
  hy_sub_ = ts_.tab;
  hy_sub_.weights = static_cast<float* const*>(hy_ptrs_.raw());
  hy_sub_.states = ts_.tab.states ? static_cast<float* const*>(hy_sptrs_.raw()) : nullptr;
  hy_sub_.row_base = static_cast<const uint32_t*>(hy_base_.raw());
  hy_sub_.num_tables = static_cast<int>(hy_M_);
  hy_sub_.col = nullptr;
  const int64_t G = n * cap_, ids = std::max<int64_t>(n * max_nnz, 1);
  const DType act = (into_ >= 0 ? e.vals[into_] : e.vals[self]).dt;
  hy_off_ = Tensor::empty({hy_M_ * G + 1}, DType::I32, e.dev);
  hy_keys_ = Tensor::empty({ids}, DType::I32, e.dev);
  hy_pool_ = Tensor::empty({std::max<int64_t>(G * hy_M_ * dim, 1)}, act, e.dev);
  const size_t sb = ce::scratch_bytes(ids, hy_key_bits_, static_cast<int>(dim));
  hy_scratch_mem_ = Tensor::empty({static_cast<int64_t>(sb)}, DType::U8, e.dev);
  hy_scratch_ = ce::carve(hy_scratch_mem_.raw(), ids, hy_key_bits_, static_cast<int>(dim));
  ce::prepare(hy_scratch_, e.st);
  hy_flag_ = e.buf({1}, DType::I32);
  hy_recv_ = open_peer_buffer(e, static_cast<size_t>(cap_ * hy_K_ * dim) * dtype_size(act));
  hy_grecv_ = open_peer_buffer(e, static_cast<size_t>(G * hy_M_ * dim) * dtype_size(xdt_));
}

template <class H>
void EmbeddingNode::hybrid_push(Engine& e, const dp::RankGeometry& geo, const int32_t* g_off,
                                const uint32_t* g_keys) {
  const DataParallel& d = e.dp;
  const int64_t T = ts_.tab.num_tables, dim = ts_.dim;
  hy_bmax_ = padded_rows(d);
  if (hy_bmax_ == 0) return;  // no rank has rows (the same on every rank)
  const int64_t Gp = d.ranks * hy_bmax_;
  hy_nnz_ = 0;
  for (int r = 0; r < d.ranks; ++r)
    for (int64_t k : hy_mine_) hy_nnz_ += d.table_nnz[r * T + hy_all_[k].table];
  if (hy_M_ > 0) {
    dp::build_row_bags(geo, hy_bmax_, hy_rl_, g_off, g_keys, hy_off_.data<int32_t>(),
                       static_cast<uint32_t*>(hy_keys_.raw()), lens_.data<int32_t>(),
                       src_.data<int64_t>(), scan_.raw(), scan_bytes_, e.st);
    ce::forward(hy_sub_, hy_off_.data<int32_t>(), static_cast<const uint32_t*>(hy_keys_.raw()), Gp,
                false, static_cast<H*>(hy_pool_.raw()), e.st, hy_M_ * dim);
    const int64_t* info = static_cast<const int64_t*>(hy_info_.raw());
    push_pooled<H><<<warp_blocks(Gp * hy_M_), 32 * kWarps, 0, e.st>>>(
        geo, hy_bmax_, hy_M_, hy_K_, static_cast<int>(dim), static_cast<const H*>(hy_pool_.raw()),
        hy_off_.data<int32_t>(), static_cast<const uint32_t*>(hy_keys_.raw()), hy_rl_.info,
        info + 6 * hy_K_, static_cast<void* const*>(hy_recv_->dev.raw()));
    DLREC_CUDA_LAUNCH_CHECK();
  }
  hybrid_barrier(e, "hybrid rows written");
  e.sub("emb fwd: hybrid pool + write");
  // The owner's id sort for the backward while the other ranks write.
  if (hy_M_ > 0 && d.step && hy_nnz_ > 0)
    ce::backward_ids(hy_sub_, hy_off_.data<int32_t>(), static_cast<const uint32_t*>(hy_keys_.raw()),
                     Gp, hy_nnz_, hy_key_bits_, hy_scratch_, e.st);
}

template <class H>
void EmbeddingNode::hybrid_add(Engine& e, H* out, int64_t ld) {
  if (hy_bmax_ == 0) return;
  e.comm_join(hy_done_);
  if (e.B > 0) {
    add_received<H><<<warp_blocks(e.B * hy_K_), 32 * kWarps, 0, e.st>>>(
        e.B, hy_K_, static_cast<int>(ts_.dim), e.offsets, e.keys,
        static_cast<const int64_t*>(hy_info_.raw()), static_cast<const H*>(hy_recv_->mine), out,
        ld);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  e.sub("emb fwd: hybrid add");
}

template <class S, class W>
void EmbeddingNode::hybrid_push_grads(Engine& e, const S* grad, int64_t ld) {
  if (hy_bmax_ == 0) return;
  if (e.B > 0) {
    push_grads<S, W><<<warp_blocks(e.B * hy_K_), 32 * kWarps, 0, e.st>>>(
        e.B, hy_K_, static_cast<int>(ts_.dim), e.offsets, e.keys,
        static_cast<const int64_t*>(hy_info_.raw()), e.dp.rank * hy_bmax_, grad, ld,
        static_cast<void* const*>(hy_grecv_->dev.raw()));
    DLREC_CUDA_LAUNCH_CHECK();
  }
  hybrid_barrier(e, "hybrid gradients written");
  e.sub("emb bwd: hybrid write");
}

template <class W>
void EmbeddingNode::hybrid_apply(Engine& e) {
  if (hy_bmax_ == 0) return;
  e.comm_join(hy_done_);
  if (hy_M_ == 0 || hy_nnz_ == 0) return;
  const int64_t dim = ts_.dim, Gp = e.dp.ranks * hy_bmax_;
  const ce::Update kind = e.emb_update();
  ce::backward_apply(hy_sub_, hy_off_.data<int32_t>(), Gp, hy_nnz_, false,
                     static_cast<const W*>(hy_grecv_->mine), hy_M_ * dim, kind, e.lr + 1, e.emb_eps,
                     hy_scratch_, e.st, e.gscale);
  // The pieces' zero rows took the frequent ids' (stale) gradients: zero again.
  for (int64_t k : hy_mine_) {
    const dp::HybridTable& h = hy_all_[k];
    DLREC_CUDA_CHECK(
        cudaMemsetAsync(ts_.rare[h.table].data<float>() + (ts_.rows[h.table] - h.frequent) * dim, 0,
                        sizeof(float) * dim, e.st));
  }
  e.sub("emb bwd: hybrid apply");
}

#define DLREC_HY_FWD(H)                                                                         \
  template void EmbeddingNode::hybrid_push<H>(Engine&, const dp::RankGeometry&, const int32_t*, \
                                              const uint32_t*);                                 \
  template void EmbeddingNode::hybrid_add<H>(Engine&, H*, int64_t);                             \
  template void EmbeddingNode::hybrid_apply<H>(Engine&);
DLREC_HY_FWD(float)
DLREC_HY_FWD(__nv_bfloat16)
DLREC_HY_FWD(__half)
#undef DLREC_HY_FWD
#define DLREC_HY_BWD(S, W) \
  template void EmbeddingNode::hybrid_push_grads<S, W>(Engine&, const S*, int64_t);
DLREC_HY_BWD(float, float)
DLREC_HY_BWD(float, __nv_bfloat16)
DLREC_HY_BWD(float, __half)
DLREC_HY_BWD(__nv_bfloat16, __nv_bfloat16)
DLREC_HY_BWD(__half, __half)
#undef DLREC_HY_BWD

}  // namespace dlrec::model::gpu_graph::emb
