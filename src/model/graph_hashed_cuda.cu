// Hashed embedding tables of the CUDA graph model; see graph_hashed_cuda.h.
#include "model/graph_hashed_cuda.h"
#include "model/graph_hashed_cuda_internal.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/embedding/hash_common.h"

namespace dlrec::model::hashed_cuda {
namespace {

using namespace state_layout;

struct Dev {
  const int64_t* cap;
  const int64_t* sbase;
  const int64_t* ibase;
  const int64_t* pmask;
  const uint64_t* seed;
  const float* scale;
  int64_t* slot_key;
  int64_t* stamp;
  int32_t* fl;
  int64_t* ikey;
  int32_t* islot;
  int64_t* ctl;
  int64_t* glob;
  uint32_t* hist;
  int T;
};

using ull = unsigned long long;

__device__ __forceinline__ void add64(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<ull*>(p), static_cast<ull>(v));
}

// The table of id position p: the last t with offsets[t * B] <= p (empty tables skipped).
__device__ __forceinline__ int table_of(const int32_t* off, int64_t B, int T, int64_t p) {
  int lo = 0, hi = T - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (off[mid * B] <= p) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ int64_t index_pos(const Dev& d, int t, int64_t key) {
  const int64_t base = d.ibase[t];
  const uint64_t mask = static_cast<uint64_t>(d.pmask[t]);
  uint64_t pos = embedding::key_hash(key) & mask;
  for (;;) {
    const int64_t k = d.ikey[base + pos];
    if (k == key) return base + static_cast<int64_t>(pos);
    if (k == kEmpty) return -1;
    pos = (pos + 1) & mask;
  }
}

// Inserts a key that the index does not hold (no other thread inserts the same key); true when
// it took a never-used position.
__device__ __forceinline__ bool index_insert(const Dev& d, int t, int64_t key, int32_t g) {
  const int64_t base = d.ibase[t];
  const uint64_t mask = static_cast<uint64_t>(d.pmask[t]);
  uint64_t pos = embedding::key_hash(key) & mask;
  for (;;) {
    ull* p = reinterpret_cast<ull*>(d.ikey + base + pos);
    const int64_t k = static_cast<int64_t>(*reinterpret_cast<volatile ull*>(p));
    if (k == kEmpty || k == kTomb) {
      if (atomicCAS(p, static_cast<ull>(k), static_cast<ull>(key)) == static_cast<ull>(k)) {
        d.islot[base + pos] = g;
        return k == kEmpty;
      }
      continue;  // lost the position to another insert: look at it again
    }
    pos = (pos + 1) & mask;
  }
}

// De-duplication of the batch's (table, key) pairs: a scratch hash of batch positions. Each
// position finds or claims the entry of its pair; the entry ends up holding the pair's first
// position (atomicMin) and its number of occurrences.
__global__ void dedup_kernel(Dev d, const int64_t* __restrict__ keys, const int32_t* off,
                             int64_t B, int64_t nnz, int32_t* owner, int32_t* cnt, int32_t* dpos,
                             uint64_t dmask) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p >= nnz) return;
  const int t = table_of(off, B, d.T, p);
  const int64_t key = keys[p];
  uint64_t pos = embedding::mix64(embedding::key_hash(key) + static_cast<uint64_t>(t)) & dmask;
  for (;;) {
    int32_t o = atomicCAS(owner + pos, -1, static_cast<int32_t>(p));
    if (o == -1) break;  // claimed
    if (keys[o] == key && table_of(off, B, d.T, o) == t) break;
    pos = (pos + 1) & dmask;
  }
  atomicMin(owner + pos, static_cast<int32_t>(p));
  atomicAdd(cnt + pos, 1);
  dpos[p] = static_cast<int32_t>(pos);
}

__global__ void first_kernel(const int32_t* owner, const int32_t* dpos, int64_t nnz,
                             int32_t* flag) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p < nnz) flag[p] = owner[dpos[p]] == p ? 1 : 0;
}

// Distinct keys (first occurrences) looked up: a hit gets its new stamp (sequence + rank of
// first occurrence) and counts its occurrences as hits; a miss is flagged.
__global__ void probe_kernel(Dev d, const int64_t* __restrict__ keys, const int32_t* off,
                             int64_t B, int64_t nnz, const int32_t* flag, const int32_t* rank,
                             const int32_t* dpos, const int32_t* cnt, int32_t* rowslot,
                             int32_t* miss, int32_t* hitocc) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p >= nnz) return;
  miss[p] = 0;
  hitocc[p] = 0;
  if (!flag[p]) return;
  const int t = table_of(off, B, d.T, p);
  const int64_t pos = index_pos(d, t, keys[p]);
  if (pos >= 0) {
    const int32_t g = d.islot[pos];
    d.stamp[g] = d.glob[kSeq] + rank[p];
    rowslot[p] = g;
    hitocc[p] = cnt[dpos[p]];
  } else {
    rowslot[p] = -1;
    miss[p] = 1;
  }
}

// One block per table: this step's lookups, hits and misses; the rows to evict; whether the
// index is rebuilt before the inserts.
__global__ void need_kernel(Dev d, const int32_t* off, int64_t B, const int32_t* miss,
                            const int32_t* mrank, const int32_t* hitocc) {
  const int t = blockIdx.x;
  const int64_t s = off[int64_t(t) * B], e = off[int64_t(t + 1) * B];
  long long h = 0, m = 0;
  for (int64_t p = s + threadIdx.x; p < e; p += blockDim.x) {
    h += hitocc[p];
    m += miss[p];
  }
  using Reduce = cub::BlockReduce<long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  h = Reduce(tmp).Sum(h);
  __syncthreads();
  m = Reduce(tmp).Sum(m);
  if (threadIdx.x != 0) return;
  int64_t* c = d.ctl + int64_t(t) * kNF;
  c[kLookups] += e - s;
  c[kHits] += h;
  c[kM] = m;
  c[kMBase] = e > s ? mrank[s] : 0;
  const int64_t k = std::max<int64_t>(0, c[kSize] + m - d.cap[t]);
  c[kK] = k;
  c[kKRem] = k;
  c[kPrefix] = 0;
  c[kPush] = 0;
  c[kInserts] += m;
  c[kEvictions] += k;
  if (k > 0) d.glob[kAnyEvict] = 1;
  // Rebuild when the never-used positions would fall under a quarter of the index (probe runs
  // stay short; a lookup always finds an empty position).
  const int64_t P = d.pmask[t] + 1;
  c[kRebuild] = (c[kUsed] + m) * 4 > 3 * P ? 1 : 0;
  if (c[kRebuild]) {
    c[kUsed] = 0;
    d.glob[kAnyRebuild] = 1;
  }
}

// Radix select, one pass: per table that evicts, the histogram of the 8-bit digit at `shift`
// of the stamps of old rows (stamp < this step's sequence start) that match the prefix chosen so
// far. Blocks (x) stride over the table's (y) rows.
__global__ void hist_kernel(Dev d, int shift) {
  if (!d.glob[kAnyEvict]) return;
  const int t = blockIdx.y;
  const int64_t* c = d.ctl + int64_t(t) * kNF;
  if (c[kK] == 0) return;
  __shared__ uint32_t h[256];
  h[threadIdx.x] = 0;
  __syncthreads();
  const int64_t prefix = c[kPrefix], seq0 = d.glob[kSeq], base = d.sbase[t], C = d.cap[t];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x & 31;
  for (int64_t i0 = int64_t(blockIdx.x) * blockDim.x; i0 < C; i0 += stride) {
    const int64_t i = i0 + threadIdx.x;
    int bin = -1;
    if (i < C) {
      const int64_t s = d.stamp[base + i];
      if (s < seq0 && (s >> (shift + 8)) == prefix) bin = static_cast<int>((s >> shift) & 255);
    }
    // Lanes with the same digit add once (stamps of one step share their high digits).
    const unsigned same = __match_any_sync(0xFFFFFFFFu, bin);
    if (bin >= 0 && lane == __ffs(same) - 1) atomicAdd(&h[bin], __popc(same));
  }
  __syncthreads();
  if (h[threadIdx.x]) atomicAdd(d.hist + int64_t(t) * 256 + threadIdx.x, h[threadIdx.x]);
}

// Radix select, one pass: the digit holding the kRem-th smallest stamp (one block per table).
__global__ void select_kernel(Dev d) {
  if (!d.glob[kAnyEvict]) return;
  const int t = blockIdx.x;
  int64_t* c = d.ctl + int64_t(t) * kNF;
  if (c[kK] == 0) return;
  const int64_t krem = c[kKRem], prefix = c[kPrefix];
  uint32_t* h = d.hist + int64_t(t) * 256;
  const uint32_t v = h[threadIdx.x];
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  uint32_t incl = 0;
  Scan(tmp).InclusiveSum(v, incl);
  __syncthreads();
  const int64_t excl = static_cast<int64_t>(incl) - v;
  if (v > 0 && excl < krem && krem <= static_cast<int64_t>(incl)) {
    c[kPrefix] = (prefix << 8) | threadIdx.x;
    c[kKRem] = krem - excl;
  }
  h[threadIdx.x] = 0;
}

// Evicts the rows whose stamps are <= the selected one (exactly kK rows: stamps are unique):
// index entry to a tombstone, row freed and pushed on the free stack.
__global__ void evict_kernel(Dev d) {
  if (!d.glob[kAnyEvict]) return;
  const int t = blockIdx.y;
  int64_t* c = d.ctl + int64_t(t) * kNF;
  if (c[kK] == 0) return;
  const int64_t thr = c[kPrefix], seq0 = d.glob[kSeq], base = d.sbase[t], C = d.cap[t];
  const int64_t top = c[kTop];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < C;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = d.stamp[base + i];
    if (s >= seq0 || s > thr) continue;
    const int64_t pos = index_pos(d, t, d.slot_key[base + i]);
    if (pos >= 0) d.ikey[pos] = kTomb;
    d.stamp[base + i] = kFree;
    const int64_t j = static_cast<int64_t>(atomicAdd(reinterpret_cast<ull*>(c + kPush), 1ull));
    d.fl[base + top + j] = static_cast<int32_t>(i);
  }
}

// Index rebuild (tables flagged kRebuild): clear, then re-insert every row in use.
__global__ void clear_kernel(Dev d) {
  if (!d.glob[kAnyRebuild]) return;
  const int t = blockIdx.y;
  if (!d.ctl[int64_t(t) * kNF + kRebuild]) return;
  const int64_t base = d.ibase[t], P = d.pmask[t] + 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < P;
       i += int64_t(gridDim.x) * blockDim.x)
    d.ikey[base + i] = kEmpty;
}

__global__ void reinsert_kernel(Dev d) {
  if (!d.glob[kAnyRebuild]) return;
  const int t = blockIdx.y;
  int64_t* c = d.ctl + int64_t(t) * kNF;
  if (!c[kRebuild]) return;
  const int64_t base = d.sbase[t], C = d.cap[t];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < C;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (d.stamp[base + i] == kFree) continue;
    if (index_insert(d, t, d.slot_key[base + i], static_cast<int32_t>(base + i)))
      add64(c + kUsed, 1);
  }
}

// The misses take free rows in order of first occurrence (the top of the stack first), enter
// the index, and get their initial rows (the CPU table's values) and a fresh optimizer state.
__global__ void insert_kernel(Dev d, nn::cuda_emb::Tables tab, int scols, float init_acc,
                              const int64_t* __restrict__ keys, const int32_t* off, int64_t B,
                              int64_t nnz, const int32_t* miss, const int32_t* mrank,
                              const int32_t* rank, int32_t* rowslot) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p >= nnz || !miss[p]) return;
  const int t = table_of(off, B, d.T, p);
  int64_t* c = d.ctl + int64_t(t) * kNF;
  const int64_t key = keys[p], base = d.sbase[t];
  const int64_t r = mrank[p] - c[kMBase];
  const int64_t top = c[kTop] + c[kK];
  const int32_t local = d.fl[base + top - 1 - r];
  const int32_t g = static_cast<int32_t>(base + local);
  if (index_insert(d, t, key, g)) add64(c + kUsed, 1);
  d.slot_key[g] = key;
  d.stamp[g] = d.glob[kSeq] + rank[p];
  rowslot[p] = g;
  const int dim = tab.dim;
  float* w = tab.weights[t] + int64_t(local) * dim;
  const uint64_t seed = d.seed[t];
  const float scale = d.scale[t];
  for (int k = 0; k < dim; ++k) w[k] = embedding::init_value(seed, key, k, scale);
  if (tab.states) {
    float* s = tab.states[t] + int64_t(local) * scols;
    for (int k = 0; k < scols; ++k) s[k] = init_acc;
  }
}

__global__ void finalize_kernel(Dev d, const int32_t* flag, const int32_t* rank, int64_t nnz) {
  for (int t = threadIdx.x; t < d.T; t += blockDim.x) {
    int64_t* c = d.ctl + int64_t(t) * kNF;
    c[kTop] += c[kK] - c[kM];
    c[kSize] += c[kM] - c[kK];
    c[kRebuild] = 0;
  }
  if (threadIdx.x == 0) d.glob[kSeq] += rank[nnz - 1] + flag[nnz - 1];
}

__global__ void rows_kernel(const int32_t* owner, const int32_t* dpos, const int32_t* rowslot,
                            int64_t nnz, uint32_t* rows) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p < nnz) rows[p] = static_cast<uint32_t>(rowslot[owner[dpos[p]]]);
}

// Evaluation: a key's row, or kMissing; nothing changes.
__global__ void find_kernel(Dev d, const int64_t* __restrict__ keys, const int32_t* off,
                            int64_t B, int64_t nnz, uint32_t* rows) {
  const int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p >= nnz) return;
  const int t = table_of(off, B, d.T, p);
  const int64_t pos = index_pos(d, t, keys[p]);
  rows[p] = pos >= 0 ? static_cast<uint32_t>(d.islot[pos]) : HashedTables::kMissing;
}

__global__ void clear_rebuild_kernel(Dev d) {
  for (int t = threadIdx.x; t < d.T; t += blockDim.x) d.ctl[int64_t(t) * kNF + kRebuild] = 0;
  if (threadIdx.x == 0) d.glob[kAnyRebuild] = 0;
}

__device__ __forceinline__ void store1(float* o, float v) { *o = v; }
__device__ __forceinline__ void store1(__nv_bfloat16* o, float v) { *o = __float2bfloat16(v); }

// One warp per bag, as nn::cuda_emb::forward (the same order of additions and scaling), rows
// that are kMissing skipped.
template <class O>
__global__ void pool_eval_kernel(nn::cuda_emb::Tables tab, const int32_t* __restrict__ offsets,
                                 const uint32_t* __restrict__ rows, int64_t B, bool mean,
                                 O* __restrict__ out) {
  const int64_t bag = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int T = tab.num_tables, dim = tab.dim;
  if (bag >= B * T) return;
  const int t = static_cast<int>(bag / B);
  const int64_t b = bag - int64_t(t) * B;
  const int32_t beg = offsets[bag], end = offsets[bag + 1];
  const float* __restrict__ w = tab.weights[t];
  const uint32_t base = tab.row_base[t];
  O* o = out + (b * T + t) * dim;
  const float s = (mean && end - beg > 1) ? 1.f / static_cast<float>(end - beg) : 1.f;
  for (int k = lane; k < dim; k += 32) {
    float acc = 0.f;
    bool first = true;
    for (int32_t p = beg; p < end; ++p) {
      const uint32_t r = rows[p];
      if (r == HashedTables::kMissing) continue;
      const float x = w[int64_t(r - base) * dim + k];
      acc = first ? x : acc + x;
      first = false;
    }
    if (s != 1.f) acc *= s;
    store1(o + k, acc);
  }
}

int blocks(int64_t n) { return static_cast<int>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads)); }
// Blocks per table of the per-table (2-D) kernels.
int blocks_per_table(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + 4 * kThreads - 1) / (4 * kThreads), 1, 128));
}

template <class T>
Tensor upload_vec(const std::vector<T>& v, DType dt, Device dev) {
  Tensor t = Tensor::empty({static_cast<int64_t>(std::max<size_t>(v.size(), 1))}, dt, dev);
  if (!v.empty()) copy_bytes(t.raw(), dev, v.data(), Device::cpu(), v.size() * sizeof(T));
  return t;
}

}  // namespace

HashedTables::HashedTables(std::vector<TableOptions> tables, int64_t dim, int64_t state_cols,
                           float init_acc, Device dev, cudaStream_t stream)
    : opts_(std::move(tables)), dim_(dim), state_cols_(state_cols), init_acc_(init_acc), dev_(dev),
      st_(stream) {
  const int64_t T = num_tables();
  DLREC_CHECK(T > 0, "hashed tables: no tables");
  for (const TableOptions& o : opts_) {
    DLREC_CHECK(o.capacity > 0 && o.capacity < (int64_t{1} << 31), "hashed table '", o.name,
                "': capacity must be in 1 .. 2^31 - 1 rows, got ", o.capacity);
    caps_.push_back(o.capacity);
    sbase_.push_back(total_rows_);
    total_rows_ += o.capacity;
    int64_t p = 16;
    while (p < 2 * o.capacity) p <<= 1;
    ibase_.push_back(total_index_);
    psize_.push_back(p);
    total_index_ += p;
    max_cap_ = std::max(max_cap_, o.capacity);
    max_p_ = std::max(max_p_, p);
  }
  sbase_.push_back(total_rows_);
  DLREC_CHECK(total_rows_ < (int64_t{1} << 31), "hashed tables: ", total_rows_,
              " rows in all tables of the layer together; the CUDA graph model takes at most "
              "2^31 - 1");
  std::vector<int64_t> pmask;
  std::vector<uint64_t> seeds;
  std::vector<float> scales;
  for (int64_t t = 0; t < T; ++t) {
    pmask.push_back(psize_[t] - 1);
    seeds.push_back(opts_[t].seed);
    scales.push_back(opts_[t].init_scale);
  }
  d_caps_ = upload_vec(caps_, DType::I64, dev_);
  d_sbase_ = upload_vec(sbase_, DType::I64, dev_);
  d_ibase_ = upload_vec(ibase_, DType::I64, dev_);
  d_pmask_ = upload_vec(pmask, DType::I64, dev_);
  d_seed_ = upload_vec(seeds, DType::I64, dev_);
  d_scale_ = upload_vec(scales, DType::F32, dev_);
  d_slot_key_ = Tensor::zeros({total_rows_}, DType::I64, dev_);
  d_stamp_ = Tensor::empty({total_rows_}, DType::I64, dev_);
  d_free_ = Tensor::empty({total_rows_}, DType::I32, dev_);
  d_ikey_ = Tensor::empty({total_index_}, DType::I64, dev_);
  d_islot_ = Tensor::zeros({total_index_}, DType::I32, dev_);
  d_ctl_ = Tensor::zeros({T * kNF}, DType::I64, dev_);
  d_glob_ = Tensor::zeros({kNG}, DType::I64, dev_);
  d_hist_ = Tensor::zeros({T * 256}, DType::I32, dev_);
  for (auto& s : slots_) s.copied = gpu::Event(dev_.index);
  // The empty state, through the import path (host tensors as a fresh CPU table writes them).
  host_.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    HostState& h = host_[t];
    h.keys = Tensor::zeros({caps_[t]}, DType::I64);
    h.lru = Tensor::empty({2, caps_[t]}, DType::I32);
    std::fill(h.lru.data<int32_t>(), h.lru.data<int32_t>() + 2 * caps_[t], -1);
    h.meta = Tensor::zeros({8}, DType::I64);
    h.meta.data<int64_t>()[1] = h.meta.data<int64_t>()[2] = -1;
    h.meta.data<int64_t>()[7] = caps_[t];
  }
  handed_out_ = true;
  import_state();
}

HashedTables::~HashedTables() {
  for (auto& s : slots_) {
    if (s.pending) cudaEventSynchronize(s.copied);
  }
}

void HashedTables::alloc(int64_t max_nnz) {
  max_nnz = std::max<int64_t>(max_nnz, 1);
  if (max_nnz <= max_nnz_) return;
  for (auto& s : slots_) {
    if (s.pending) DLREC_CUDA_CHECK(cudaEventSynchronize(s.copied));
    s.pending = false;
    s.host = cuda_step::pinned_alloc(sizeof(int64_t) * max_nnz);
    s.dev = Tensor::empty({max_nnz}, DType::I64, dev_);
  }
  max_nnz_ = max_nnz;
  dedup_size_ = 16;
  while (dedup_size_ < 2 * max_nnz) dedup_size_ <<= 1;
  d_owner_ = Tensor::empty({dedup_size_}, DType::I32, dev_);
  d_cnt_ = Tensor::empty({dedup_size_}, DType::I32, dev_);
  for (Tensor* t : {&d_dpos_, &d_flag_, &d_rank_, &d_miss_, &d_mrank_, &d_hitocc_, &d_rowslot_})
    *t = Tensor::empty({max_nnz}, DType::I32, dev_);
  size_t bytes = 0;
  DLREC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, d_flag_.data<int32_t>(),
                                                 d_rank_.data<int32_t>(),
                                                 static_cast<int>(max_nnz), st_));
  cub_bytes_ = std::max<size_t>(bytes, 16);
  d_cub_ = Tensor::empty({static_cast<int64_t>(cub_bytes_)}, DType::U8, dev_);
}

namespace {
// The distinct values of keys[0, n) (all >= 0), counted in a flat open-addressing set (this
// thread's scratch), up to `stop`: the count returned is min(distinct, stop).
int64_t count_distinct_keys(const int64_t* keys, int64_t n, int64_t stop) {
  thread_local std::vector<int64_t> set;
  size_t size = 16;
  while (size < 2 * static_cast<size_t>(n)) size *= 2;
  set.assign(size, -1);
  const size_t mask = size - 1;
  int64_t count = 0;
  for (int64_t i = 0; i < n && count < stop; ++i) {
    size_t h = static_cast<size_t>(embedding::key_hash(keys[i])) & mask;
    while (set[h] >= 0 && set[h] != keys[i]) h = (h + 1) & mask;
    if (set[h] < 0) {
      set[h] = keys[i];
      ++count;
    }
  }
  return count;
}
}  // namespace

void HashedTables::prepare(const io::Batch& b, bool training, bool own_slot) {
  DLREC_CHECK(own_slot || !training, "hashed tables: a training step uploads its own keys");
  if (handed_out_) import_state();
  const int64_t T = num_tables(), B = b.rows;
  std::vector<int64_t> start(T + 1, 0);
  for (int64_t t = 0; t < T; ++t)
    start[t + 1] = start[t] + (b.cat_offsets[t][B] - b.cat_offsets[t][0]);
  const int64_t nnz = start[T];
  DLREC_CHECK(!own_slot || nnz <= max_nnz_, "hashed tables: ", nnz, " keys, scratch for ",
              max_nnz_, " (alloc first)");
  // Checks first, a table per task: keys >= 0; a training batch's distinct keys of a table must
  // fit it (as on the CPU: a training forward holds all the keys of a batch at once), counted
  // when it has more keys than rows (a std::unordered_set there took 14 ms a step for 26 tables
  // of 38,461 rows at 65,536 keys each).
  // The errors are raised after, the first table's first.
  std::vector<int64_t> negative(T, -1), distinct(T, 0);
  parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t* ids = b.cat_indices[t].data() + b.cat_offsets[t][0];
      const int64_t n = start[t + 1] - start[t];
      int64_t lowest = 0;
      for (int64_t i = 0; i < n; ++i) lowest = std::min(lowest, ids[i]);
      if (lowest < 0) {
        negative[t] = std::find_if(ids, ids + n, [](int64_t k) { return k < 0; }) - ids;
        continue;
      }
      if (training && n > caps_[t]) distinct[t] = count_distinct_keys(ids, n, caps_[t] + 1);
    }
  });
  for (int64_t t = 0; t < T; ++t) {
    if (negative[t] >= 0)
      fail("hashed table '", opts_[t].name, "': key ",
           b.cat_indices[t][b.cat_offsets[t][0] + negative[t]], " (position ", negative[t],
           " of the batch's feature ", t, ") is negative; hashed tables on CUDA take keys >= 0");
    if (distinct[t] > caps_[t])
      fail("hashed table '", opts_[t].name, "': ", distinct[t],
           " distinct keys in one batch exceed the capacity of ", caps_[t], " rows");
  }
  if (training) {
    seq_bound_ += static_cast<uint64_t>(nnz);
    DLREC_CHECK(seq_bound_ < (uint64_t{1} << 47), "hashed tables: more than 2^47 keys looked "
                "up since the model was built or loaded (the recency stamps would overflow)");
  }
  training_ = training;
}

void HashedTables::upload(const io::Batch& b, int slot, cudaStream_t copy,
                          cudaStream_t compute) {
  const int64_t T = num_tables(), B = b.rows;
  std::vector<int64_t> start(T + 1, 0);
  for (int64_t t = 0; t < T; ++t)
    start[t + 1] = start[t] + (b.cat_offsets[t][B] - b.cat_offsets[t][0]);
  const int64_t nnz = start[T];
  Slot& s = slots_[slot];
  if (s.pending) DLREC_CUDA_CHECK(cudaEventSynchronize(s.copied));
  int64_t* host = static_cast<int64_t*>(s.host.get());
  parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      if (start[t + 1] > start[t])
        std::memcpy(host + start[t], b.cat_indices[t].data() + b.cat_offsets[t][0],
                    sizeof(int64_t) * (start[t + 1] - start[t]));
  });
  if (nnz)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(s.dev.raw(), host, sizeof(int64_t) * nnz,
                                     cudaMemcpyHostToDevice, copy));
  DLREC_CUDA_CHECK(cudaEventRecord(s.copied, copy));
  s.pending = true;
  DLREC_CUDA_CHECK(cudaStreamWaitEvent(compute, s.copied, 0));
  cur_ = slot;
}

namespace {
Dev make_dev(Tensor& caps, Tensor& sbase, Tensor& ibase, Tensor& pmask, Tensor& seed,
             Tensor& scale, Tensor& slot_key, Tensor& stamp, Tensor& fl, Tensor& ikey,
             Tensor& islot, Tensor& ctl, Tensor& glob, Tensor& hist, int T) {
  Dev d;
  d.cap = caps.data<int64_t>();
  d.sbase = sbase.data<int64_t>();
  d.ibase = ibase.data<int64_t>();
  d.pmask = pmask.data<int64_t>();
  d.seed = static_cast<const uint64_t*>(seed.raw());
  d.scale = scale.data<float>();
  d.slot_key = slot_key.data<int64_t>();
  d.stamp = stamp.data<int64_t>();
  d.fl = fl.data<int32_t>();
  d.ikey = ikey.data<int64_t>();
  d.islot = islot.data<int32_t>();
  d.ctl = ctl.data<int64_t>();
  d.glob = glob.data<int64_t>();
  d.hist = static_cast<uint32_t*>(hist.raw());
  d.T = T;
  return d;
}
}  // namespace

#define DLREC_HASHED_DEV                                                                       \
  make_dev(d_caps_, d_sbase_, d_ibase_, d_pmask_, d_seed_, d_scale_, d_slot_key_, d_stamp_,   \
           d_free_, d_ikey_, d_islot_, d_ctl_, d_glob_, d_hist_, static_cast<int>(num_tables()))

void HashedTables::resolve(const int32_t* offsets, uint32_t* rows, int64_t B, int64_t nnz,
                           cudaStream_t st, const int64_t* eval_keys) {
  if (nnz == 0) return;
  const Dev d = DLREC_HASHED_DEV;
  DLREC_CHECK(!(eval_keys && training_), "hashed tables: keys of their own in a training step");
  const int64_t* keys = eval_keys ? eval_keys : slots_[cur_].dev.data<int64_t>();
  const int nb = blocks(nnz);
  const int T = static_cast<int>(num_tables());
  if (!training_) {
    find_kernel<<<nb, kThreads, 0, st>>>(d, keys, offsets, B, nnz, rows);
    DLREC_CUDA_LAUNCH_CHECK();
    return;
  }
  int32_t* owner = d_owner_.data<int32_t>();
  int32_t* cnt = d_cnt_.data<int32_t>();
  int32_t *dpos = d_dpos_.data<int32_t>(), *flag = d_flag_.data<int32_t>(),
          *rank = d_rank_.data<int32_t>(), *miss = d_miss_.data<int32_t>(),
          *mrank = d_mrank_.data<int32_t>(), *hitocc = d_hitocc_.data<int32_t>(),
          *rowslot = d_rowslot_.data<int32_t>();
  DLREC_CUDA_CHECK(cudaMemsetAsync(owner, 0xFF, sizeof(int32_t) * dedup_size_, st));
  DLREC_CUDA_CHECK(cudaMemsetAsync(cnt, 0, sizeof(int32_t) * dedup_size_, st));
  DLREC_CUDA_CHECK(cudaMemsetAsync(d.glob + kAnyEvict, 0, sizeof(int64_t), st));
  dedup_kernel<<<nb, kThreads, 0, st>>>(d, keys, offsets, B, nnz, owner, cnt, dpos,
                                        static_cast<uint64_t>(dedup_size_ - 1));
  DLREC_CUDA_LAUNCH_CHECK();
  first_kernel<<<nb, kThreads, 0, st>>>(owner, dpos, nnz, flag);
  DLREC_CUDA_LAUNCH_CHECK();
  size_t bytes = cub_bytes_;
  DLREC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(d_cub_.raw(), bytes, flag, rank,
                                                 static_cast<int>(nnz), st));
  probe_kernel<<<nb, kThreads, 0, st>>>(d, keys, offsets, B, nnz, flag, rank, dpos, cnt,
                                        rowslot, miss, hitocc);
  DLREC_CUDA_LAUNCH_CHECK();
  bytes = cub_bytes_;
  DLREC_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(d_cub_.raw(), bytes, miss, mrank,
                                                 static_cast<int>(nnz), st));
  need_kernel<<<T, kThreads, 0, st>>>(d, offsets, B, miss, mrank, hitocc);
  DLREC_CUDA_LAUNCH_CHECK();
  const dim3 rows_grid(blocks_per_table(max_cap_), T), index_grid(blocks_per_table(max_p_), T);
  for (int shift = 40; shift >= 0; shift -= 8) {
    hist_kernel<<<rows_grid, kThreads, 0, st>>>(d, shift);
    DLREC_CUDA_LAUNCH_CHECK();
    select_kernel<<<T, kThreads, 0, st>>>(d);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  evict_kernel<<<rows_grid, kThreads, 0, st>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
  clear_kernel<<<index_grid, kThreads, 0, st>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
  reinsert_kernel<<<rows_grid, kThreads, 0, st>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
  insert_kernel<<<nb, kThreads, 0, st>>>(d, tab_, static_cast<int>(state_cols_), init_acc_, keys,
                                         offsets, B, nnz, miss, mrank, rank, rowslot);
  DLREC_CUDA_LAUNCH_CHECK();
  finalize_kernel<<<1, kThreads, 0, st>>>(d, flag, rank, nnz);
  DLREC_CUDA_LAUNCH_CHECK();
  rows_kernel<<<nb, kThreads, 0, st>>>(owner, dpos, rowslot, nnz, rows);
  DLREC_CUDA_LAUNCH_CHECK();
}

template <class O>
void HashedTables::pool_eval(const int32_t* offsets, const uint32_t* rows, int64_t B, bool mean,
                             O* out, cudaStream_t st) const {
  const int64_t warps = B * tab_.num_tables;
  if (warps == 0) return;
  const int64_t nblocks = (warps * 32 + kThreads - 1) / kThreads;
  pool_eval_kernel<O><<<static_cast<unsigned>(nblocks), kThreads, 0, st>>>(tab_, offsets, rows,
                                                                           B, mean, out);
  DLREC_CUDA_LAUNCH_CHECK();
}
template void HashedTables::pool_eval<float>(const int32_t*, const uint32_t*, int64_t, bool,
                                             float*, cudaStream_t) const;
template void HashedTables::pool_eval<__nv_bfloat16>(const int32_t*, const uint32_t*, int64_t,
                                                     bool, __nv_bfloat16*, cudaStream_t) const;

void HashedTables::rebuild_index_all(cudaStream_t st) {
  const Dev d = DLREC_HASHED_DEV;
  const int T = static_cast<int>(num_tables());
  const dim3 rows_grid(blocks_per_table(max_cap_), T), index_grid(blocks_per_table(max_p_), T);
  clear_kernel<<<index_grid, kThreads, 0, st>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
  reinsert_kernel<<<rows_grid, kThreads, 0, st>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
  clear_rebuild_kernel<<<1, kThreads, 0, st>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
}

}  // namespace dlrec::model::hashed_cuda
