// HashTableCuda: open addressing with atomicCAS, lookup-or-insert kernel, sweep eviction.
#include "dlrec/embedding/hash_table_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <numeric>

#include "core/cuda_check.h"
#include "dlrec/core/device.h"
#include "dlrec/embedding/hash_common.h"

namespace dlrec::embedding {

namespace {

constexpr long long kEmptyKey = LLONG_MIN;  // reserved key value: an empty index position
constexpr int kUnpublished = -1;            // a claimed position whose slot is being written
constexpr int kNoRow = -2;                  // a claimed position that got no row (table full)

struct Dev {
  unsigned long long* idx_keys;  // [P]
  int* idx_slots;                // [P]
  unsigned long long mask;
  float* rows;                   // [cap, dim]
  float* state;                  // [cap, dim] or null
  long long* row_keys;           // [cap]
  unsigned int* last_used;       // [cap]
  unsigned long long* counter;   // rows handed out (may pass cap: failed claims)
  unsigned long long* stats;     // lookups, hits, inserts
  long long cap;
  int dim;
  unsigned long long seed;
  float scale, init_acc;
};

__global__ void k_clear_index(Dev d) {
  const unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x;
  if (i > d.mask) return;
  d.idx_keys[i] = static_cast<unsigned long long>(kEmptyKey);
  d.idx_slots[i] = kUnpublished;
}

__global__ void k_lookup_insert(Dev d, const int64_t* keys, long long n, int* out,
                                unsigned int step) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const long long key = keys[i];
  atomicAdd(&d.stats[0], 1ull);
  if (key == kEmptyKey) {
    out[i] = -1;
    return;
  }
  unsigned long long pos = key_hash(key) & d.mask;
  for (unsigned long long probe = 0; probe <= d.mask; ++probe) {
    const unsigned long long prev =
        atomicCAS(&d.idx_keys[pos], static_cast<unsigned long long>(kEmptyKey),
                  static_cast<unsigned long long>(key));
    if (prev == static_cast<unsigned long long>(kEmptyKey)) {
      // This thread claimed the position: take a row, initialise it, publish its slot.
      const unsigned long long s = atomicAdd(d.counter, 1ull);
      int slot = kNoRow;
      if (s < static_cast<unsigned long long>(d.cap)) {
        slot = static_cast<int>(s);
        d.row_keys[slot] = key;
        float* w = d.rows + static_cast<long long>(slot) * d.dim;
        for (int k = 0; k < d.dim; ++k) w[k] = init_value(d.seed, key, k, d.scale);
        if (d.state) {
          float* a = d.state + static_cast<long long>(slot) * d.dim;
          for (int k = 0; k < d.dim; ++k) a[k] = d.init_acc;
        }
        d.last_used[slot] = step;
        atomicAdd(&d.stats[2], 1ull);
      }
      __threadfence();
      atomicExch(&d.idx_slots[pos], slot);
      out[i] = slot >= 0 ? slot : -1;
      return;
    }
    if (prev == static_cast<unsigned long long>(key)) {
      int slot;
      while ((slot = atomicAdd(&d.idx_slots[pos], 0)) == kUnpublished) __nanosleep(64);
      __threadfence();
      if (slot >= 0) {
        d.last_used[slot] = step;
        atomicAdd(&d.stats[1], 1ull);
        out[i] = slot;
      } else {
        out[i] = -1;
      }
      return;
    }
    pos = (pos + 1) & d.mask;
  }
  out[i] = -1;  // the index is full (cannot happen at a load factor <= 1/2)
}

__global__ void k_find(Dev d, const int64_t* keys, long long n, int* out) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const long long key = keys[i];
  out[i] = -1;
  if (key == kEmptyKey) return;
  unsigned long long pos = key_hash(key) & d.mask;
  for (unsigned long long probe = 0; probe <= d.mask; ++probe) {
    const unsigned long long k = d.idx_keys[pos];
    if (k == static_cast<unsigned long long>(kEmptyKey)) return;
    if (k == static_cast<unsigned long long>(key)) {
      const int s = d.idx_slots[pos];
      out[i] = s >= 0 ? s : -1;
      return;
    }
    pos = (pos + 1) & d.mask;
  }
}

// Re-inserts the compacted rows [0, n) into a cleared index.
__global__ void k_reinsert(Dev d, long long n) {
  const long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  const long long key = d.row_keys[j];
  unsigned long long pos = key_hash(key) & d.mask;
  for (;;) {
    const unsigned long long prev =
        atomicCAS(&d.idx_keys[pos], static_cast<unsigned long long>(kEmptyKey),
                  static_cast<unsigned long long>(key));
    if (prev == static_cast<unsigned long long>(kEmptyKey)) {
      d.idx_slots[pos] = static_cast<int>(j);
      return;
    }
    pos = (pos + 1) & d.mask;
  }
}

__global__ void k_gather(const float* src, int dim, const int* slots, long long n, float* out) {
  const long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (t >= n * dim) return;
  const long long i = t / dim;
  const int k = static_cast<int>(t % dim);
  const int s = slots[i];
  out[t] = s >= 0 ? src[static_cast<long long>(s) * dim + k] : 0.f;
}

// The CPU's arithmetic, operation by operation (no contraction into FMAs).
__global__ void k_apply(Dev d, const int* slots, const float* grads, long long n, float lr,
                        float eps) {
  const long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (t >= n * d.dim) return;
  const long long i = t / d.dim;
  const int k = static_cast<int>(t % d.dim);
  const int s = slots[i];
  if (s < 0) return;
  const long long at = static_cast<long long>(s) * d.dim + k;
  const float g = grads[t];
  if (d.state) {
    const float a = __fadd_rn(d.state[at], __fmul_rn(g, g));
    d.state[at] = a;
    d.rows[at] = __fsub_rn(d.rows[at], __fdiv_rn(__fmul_rn(lr, g), __fadd_rn(__fsqrt_rn(a), eps)));
  } else {
    d.rows[at] = __fsub_rn(d.rows[at], __fmul_rn(lr, g));
  }
}

// dst[j] = src[kept[j]] for rows of `width` floats (compaction into a scratch buffer).
__global__ void k_compact_rows(const float* src, float* dst, int width, const int* kept,
                               long long n) {
  const long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (t >= n * width) return;
  const long long j = t / width;
  const int k = static_cast<int>(t % width);
  dst[t] = src[static_cast<long long>(kept[j]) * width + k];
}

__global__ void k_compact_meta(const long long* keys_src, const unsigned int* used_src,
                               long long* keys_dst, unsigned int* used_dst, const int* kept,
                               long long n) {
  const long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  keys_dst[j] = keys_src[kept[j]];
  used_dst[j] = used_src[kept[j]];
}

unsigned int blocks_for(long long n, int threads = 256) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

template <class T>
T* dev_alloc(size_t count, int64_t* total) {
  void* p = nullptr;
  if (count == 0) return nullptr;
  DLREC_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
  *total += static_cast<int64_t>(count * sizeof(T));
  return static_cast<T*>(p);
}

// Makes `device` current for a scope.
struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int device) {
    DLREC_CUDA_CHECK(cudaGetDevice(&prev));
    DLREC_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};

}  // namespace

struct HashTableCuda::Impl {
  HashedEmbeddingOptions o;
  int device = 0;
  cudaStream_t stream = nullptr;
  Dev d{};
  float eps = 0.f;
  unsigned int step = 0;
  int64_t evictions = 0;
  int64_t bytes = 0;
  // Reused host-API staging buffers.
  int64_t* d_keys = nullptr;
  int* d_slots = nullptr;
  float* d_buf = nullptr;
  int64_t staged = 0, staged_buf = 0;

  void stage(int64_t n) {
    if (n <= staged) return;
    cudaFree(d_keys);
    cudaFree(d_slots);
    DLREC_CUDA_CHECK(cudaMalloc(&d_keys, n * sizeof(int64_t)));
    DLREC_CUDA_CHECK(cudaMalloc(&d_slots, n * sizeof(int)));
    staged = n;
  }
  void stage_buf(int64_t n) {
    if (n <= staged_buf) return;
    cudaFree(d_buf);
    DLREC_CUDA_CHECK(cudaMalloc(&d_buf, n * sizeof(float)));
    staged_buf = n;
  }
  int64_t counter() const {
    unsigned long long c = 0;
    DLREC_CUDA_CHECK(cudaMemcpyAsync(&c, d.counter, sizeof(c), cudaMemcpyDeviceToHost, stream));
    DLREC_CUDA_CHECK(cudaStreamSynchronize(stream));
    return static_cast<int64_t>(c);
  }
  void sync() const { DLREC_CUDA_CHECK(cudaStreamSynchronize(stream)); }
  std::vector<float> read_from(const float* src, const std::vector<int64_t>& keys,
                               std::vector<bool>* found);
};

std::vector<float> HashTableCuda::Impl::read_from(const float* src,
                                                  const std::vector<int64_t>& keys,
                                                  std::vector<bool>* found) {
  Impl& m = *this;
  DeviceGuard g(m.device);
  const int64_t n = static_cast<int64_t>(keys.size());
  m.stage(std::max<int64_t>(n, 1));
  m.stage_buf(std::max<int64_t>(n * m.d.dim, 1));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d_keys, keys.data(), n * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, m.stream));
  if (n > 0) {
    k_find<<<blocks_for(n), 256, 0, m.stream>>>(m.d, m.d_keys, n, m.d_slots);
    DLREC_CUDA_LAUNCH_CHECK();
    k_gather<<<blocks_for(n * m.d.dim), 256, 0, m.stream>>>(src, m.d.dim, m.d_slots, n, m.d_buf);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  std::vector<float> out(n * m.d.dim);
  std::vector<int32_t> slots(n);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.d_buf, out.size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, m.stream));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(slots.data(), m.d_slots, n * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, m.stream));
  m.sync();
  if (found) {
    found->assign(n, false);
    for (int64_t i = 0; i < n; ++i) (*found)[i] = slots[i] >= 0;
  }
  return out;
}

HashTableCuda::HashTableCuda(const HashedEmbeddingOptions& options, int device)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.o = options;
  m.device = device;
  const auto& oo = options.optimizer;
  DLREC_CHECK(oo.kind == nn::OptimizerKind::Adagrad ||
                  (oo.kind == nn::OptimizerKind::SGD && oo.momentum == 0.f),
              "HashTableCuda: only sgd (without momentum) and adagrad are implemented on the GPU, "
              "got ", nn::optimizer_name(oo.kind));
  DLREC_CHECK(options.dim > 0 && options.dim <= (1 << 16), "HashTableCuda: bad dim ", options.dim);
  DLREC_CHECK(options.capacity > 0 && options.capacity < (int64_t{1} << 31),
              "HashTableCuda: capacity must be in 1 .. 2^31 - 1, got ", options.capacity);
  cuda::require_device(device);
  DeviceGuard g(device);
  DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  unsigned long long p = 1;
  while (p < static_cast<unsigned long long>(2 * options.capacity)) p <<= 1;
  Dev& d = m.d;
  d.mask = p - 1;
  d.cap = options.capacity;
  d.dim = static_cast<int>(options.dim);
  d.seed = options.seed;
  d.scale = options.init_scale;
  d.init_acc = oo.initial_accumulator;
  m.eps = oo.adagrad_eps;
  d.idx_keys = dev_alloc<unsigned long long>(p, &m.bytes);
  d.idx_slots = dev_alloc<int>(p, &m.bytes);
  d.rows = dev_alloc<float>(options.capacity * options.dim, &m.bytes);
  d.state = oo.kind == nn::OptimizerKind::Adagrad
                ? dev_alloc<float>(options.capacity * options.dim, &m.bytes)
                : nullptr;
  d.row_keys = dev_alloc<long long>(options.capacity, &m.bytes);
  d.last_used = dev_alloc<unsigned int>(options.capacity, &m.bytes);
  d.counter = dev_alloc<unsigned long long>(1, &m.bytes);
  d.stats = dev_alloc<unsigned long long>(3, &m.bytes);
  DLREC_CUDA_CHECK(cudaMemsetAsync(d.counter, 0, sizeof(unsigned long long), m.stream));
  DLREC_CUDA_CHECK(cudaMemsetAsync(d.stats, 0, 3 * sizeof(unsigned long long), m.stream));
  k_clear_index<<<blocks_for(static_cast<long long>(p)), 256, 0, m.stream>>>(d);
  DLREC_CUDA_LAUNCH_CHECK();
  m.sync();
}

HashTableCuda::~HashTableCuda() {
  Impl& m = *impl_;
  cudaSetDevice(m.device);
  cudaStreamSynchronize(m.stream);
  for (void* p : {static_cast<void*>(m.d.idx_keys), static_cast<void*>(m.d.idx_slots),
                  static_cast<void*>(m.d.rows), static_cast<void*>(m.d.state),
                  static_cast<void*>(m.d.row_keys), static_cast<void*>(m.d.last_used),
                  static_cast<void*>(m.d.counter), static_cast<void*>(m.d.stats),
                  static_cast<void*>(m.d_keys), static_cast<void*>(m.d_slots),
                  static_cast<void*>(m.d_buf)})
    if (p) cudaFree(p);
  cudaStreamDestroy(m.stream);
}

void HashTableCuda::lookup_or_insert_device(const int64_t* d_keys, int64_t n, int32_t* d_slots) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  ++m.step;
  if (n > 0) {
    k_lookup_insert<<<blocks_for(n), 256, 0, m.stream>>>(m.d, d_keys, n, d_slots, m.step);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  m.sync();
}

void HashTableCuda::gather_device(const int32_t* d_slots, int64_t n, float* d_out) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  if (n > 0) {
    k_gather<<<blocks_for(n * m.d.dim), 256, 0, m.stream>>>(m.d.rows, m.d.dim, d_slots, n, d_out);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  m.sync();
}

void HashTableCuda::apply_device(const int32_t* d_slots, const float* d_grads, int64_t n,
                                 float lr) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  if (n > 0) {
    k_apply<<<blocks_for(n * m.d.dim), 256, 0, m.stream>>>(m.d, d_slots, d_grads, n, lr, m.eps);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  m.sync();
}

std::vector<int32_t> HashTableCuda::lookup_or_insert(const std::vector<int64_t>& keys) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<int32_t> out(n);
  m.stage(std::max<int64_t>(n, 1));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d_keys, keys.data(), n * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, m.stream));
  lookup_or_insert_device(m.d_keys, n, m.d_slots);
  DLREC_CUDA_CHECK(cudaMemcpy(out.data(), m.d_slots, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<float> HashTableCuda::gather(const std::vector<int32_t>& slots) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  const int64_t n = static_cast<int64_t>(slots.size());
  std::vector<float> out(n * m.d.dim);
  m.stage(std::max<int64_t>(n, 1));
  m.stage_buf(std::max<int64_t>(n * m.d.dim, 1));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d_slots, slots.data(), n * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, m.stream));
  gather_device(m.d_slots, n, m.d_buf);
  DLREC_CUDA_CHECK(cudaMemcpy(out.data(), m.d_buf, out.size() * sizeof(float),
                              cudaMemcpyDeviceToHost));
  return out;
}

void HashTableCuda::apply(const std::vector<int32_t>& slots, const std::vector<float>& grads,
                          float lr) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  const int64_t n = static_cast<int64_t>(slots.size());
  DLREC_CHECK(static_cast<int64_t>(grads.size()) == n * m.d.dim,
              "HashTableCuda::apply: ", grads.size(), " gradient values for ", n, " rows of dim ",
              m.d.dim);
  m.stage(std::max<int64_t>(n, 1));
  m.stage_buf(std::max<int64_t>(n * m.d.dim, 1));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d_slots, slots.data(), n * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, m.stream));
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d_buf, grads.data(), grads.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, m.stream));
  apply_device(m.d_slots, m.d_buf, n, lr);
}

std::vector<float> HashTableCuda::read_rows(const std::vector<int64_t>& keys,
                                            std::vector<bool>* found) {
  return impl_->read_from(impl_->d.rows, keys, found);
}

std::vector<float> HashTableCuda::read_state(const std::vector<int64_t>& keys) {
  DLREC_CHECK(impl_->d.state, "HashTableCuda::read_state: sgd keeps no state");
  return impl_->read_from(impl_->d.state, keys, nullptr);
}


int64_t HashTableCuda::sweep(int64_t keep) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  DLREC_CHECK(keep >= 0, "HashTableCuda::sweep: keep must be >= 0");
  const int64_t size = std::min<int64_t>(m.counter(), m.d.cap);
  const int64_t failed = m.counter() - size;  // claims that got no row
  if (keep >= size && failed == 0) return 0;
  keep = std::min(keep, size);
  // The `keep` most recently used rows (ties: lower slot first), in slot order.
  std::vector<unsigned int> used(size);
  DLREC_CUDA_CHECK(cudaMemcpy(used.data(), m.d.last_used, size * sizeof(unsigned int),
                              cudaMemcpyDeviceToHost));
  std::vector<int32_t> order(size);
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    return used[a] != used[b] ? used[a] > used[b] : a < b;
  });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  int* d_kept = nullptr;
  float *t_rows = nullptr, *t_state = nullptr;
  long long* t_keys = nullptr;
  unsigned int* t_used = nullptr;
  const int dim = m.d.dim;
  if (keep > 0) {
    DLREC_CUDA_CHECK(cudaMalloc(&d_kept, keep * sizeof(int)));
    DLREC_CUDA_CHECK(cudaMalloc(&t_rows, keep * dim * sizeof(float)));
    if (m.d.state) DLREC_CUDA_CHECK(cudaMalloc(&t_state, keep * dim * sizeof(float)));
    DLREC_CUDA_CHECK(cudaMalloc(&t_keys, keep * sizeof(long long)));
    DLREC_CUDA_CHECK(cudaMalloc(&t_used, keep * sizeof(unsigned int)));
    DLREC_CUDA_CHECK(cudaMemcpyAsync(d_kept, order.data(), keep * sizeof(int),
                                     cudaMemcpyHostToDevice, m.stream));
    k_compact_rows<<<blocks_for(keep * dim), 256, 0, m.stream>>>(m.d.rows, t_rows, dim, d_kept, keep);
    if (m.d.state)
      k_compact_rows<<<blocks_for(keep * dim), 256, 0, m.stream>>>(m.d.state, t_state, dim, d_kept,
                                                                   keep);
    k_compact_meta<<<blocks_for(keep), 256, 0, m.stream>>>(m.d.row_keys, m.d.last_used, t_keys,
                                                           t_used, d_kept, keep);
    DLREC_CUDA_LAUNCH_CHECK();
    DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d.rows, t_rows, keep * dim * sizeof(float),
                                     cudaMemcpyDeviceToDevice, m.stream));
    if (m.d.state)
      DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d.state, t_state, keep * dim * sizeof(float),
                                       cudaMemcpyDeviceToDevice, m.stream));
    DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d.row_keys, t_keys, keep * sizeof(long long),
                                     cudaMemcpyDeviceToDevice, m.stream));
    DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d.last_used, t_used, keep * sizeof(unsigned int),
                                     cudaMemcpyDeviceToDevice, m.stream));
  }
  k_clear_index<<<blocks_for(static_cast<long long>(m.d.mask + 1)), 256, 0, m.stream>>>(m.d);
  DLREC_CUDA_LAUNCH_CHECK();
  if (keep > 0) {
    k_reinsert<<<blocks_for(keep), 256, 0, m.stream>>>(m.d, keep);
    DLREC_CUDA_LAUNCH_CHECK();
  }
  const unsigned long long c = static_cast<unsigned long long>(keep);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(m.d.counter, &c, sizeof(c), cudaMemcpyHostToDevice, m.stream));
  m.sync();
  for (void* p : {static_cast<void*>(d_kept), static_cast<void*>(t_rows),
                  static_cast<void*>(t_state), static_cast<void*>(t_keys),
                  static_cast<void*>(t_used)})
    if (p) cudaFree(p);
  m.evictions += size - keep;
  return size - keep;
}

int64_t HashTableCuda::maybe_sweep(double high, double low) {
  DLREC_CHECK(low >= 0 && low <= high && high <= 1, "HashTableCuda::maybe_sweep: need 0 <= low <= high <= 1");
  const int64_t cap = impl_->d.cap;
  const int64_t c = impl_->counter();
  if (c <= static_cast<int64_t>(high * static_cast<double>(cap)) && c <= cap) return 0;
  return sweep(static_cast<int64_t>(low * static_cast<double>(cap)));
}

HashedEmbeddingStats HashTableCuda::stats() const {
  const Impl& m = *impl_;
  DeviceGuard g(m.device);
  unsigned long long s[3];
  DLREC_CUDA_CHECK(cudaMemcpyAsync(s, m.d.stats, sizeof(s), cudaMemcpyDeviceToHost, m.stream));
  m.sync();
  HashedEmbeddingStats r;
  r.lookups = static_cast<int64_t>(s[0]);
  r.hits = static_cast<int64_t>(s[1]);
  r.inserts = static_cast<int64_t>(s[2]);
  r.evictions = m.evictions;
  r.size = size();
  return r;
}

int64_t HashTableCuda::size() const {
  DeviceGuard g(impl_->device);
  return std::min<int64_t>(impl_->counter(), impl_->d.cap);
}
int64_t HashTableCuda::capacity() const { return impl_->d.cap; }
int64_t HashTableCuda::dim() const { return impl_->d.dim; }
int64_t HashTableCuda::memory_bytes() const { return impl_->bytes; }

}  // namespace dlrec::embedding
