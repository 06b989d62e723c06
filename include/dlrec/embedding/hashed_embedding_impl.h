// Inline definitions of HashedEmbedding (included by hashed_embedding.h; see there). save()
// and load() are in src/embedding/hashed_embedding.cc.
#pragma once
#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "dlrec/core/thread_pool.h"
#include "dlrec/embedding/hash_common.h"

namespace dlrec::embedding {

namespace hashed_detail {
constexpr uint64_t kNone = ~uint64_t{0};
constexpr uint64_t kSlotMask = 0xFFFFFFFFull;

inline uint64_t make_entry(uint64_t h, int32_t slot) {
  return (h & ~kSlotMask) | static_cast<uint64_t>(slot + 1);
}
inline int32_t entry_slot(uint64_t e) { return static_cast<int32_t>(e & kSlotMask) - 1; }
}  // namespace hashed_detail

inline float initial_value(uint64_t seed, int64_t key, int64_t k, float scale) {
  return init_value(seed, key, k, scale);
}

inline HashedEmbedding::HashedEmbedding(const HashedEmbeddingOptions& options)
    : o_(options),
      dim_(options.dim),
      cap_(options.capacity),
      srow_(0),
      opt_(options.optimizer) {
  DLREC_CHECK(dim_ > 0 && dim_ <= (1 << 16), "HashedEmbedding: dim must be in 1 .. 65536, got ",
              dim_);
  DLREC_CHECK(cap_ > 0 && cap_ < (int64_t{1} << 31),
              "HashedEmbedding: capacity must be in 1 .. 2^31 - 1 rows, got ", cap_);
  DLREC_CHECK(o_.init_scale >= 0, "HashedEmbedding: init_scale must be >= 0");
  srow_ = opt_.state_row_size(dim_);
  t_.keys = Tensor::zeros({cap_}, DType::I64);
  t_.weights = Tensor::zeros({cap_, dim_}, DType::F32);
  if (srow_ > 0) t_.state = Tensor::zeros({cap_, srow_}, DType::F32);
  t_.links = Tensor::empty({2, cap_}, DType::I32);
  t_.meta = Tensor::zeros({kMetaSize}, DType::I64);
  keys_ = t_.keys.data<int64_t>();
  w_ = t_.weights.data<float>();
  st_ = srow_ > 0 ? t_.state.data<float>() : nullptr;
  prev_ = t_.links.data<int32_t>();
  next_ = prev_ + cap_;
  std::fill(prev_, prev_ + 2 * cap_, -1);
  uint64_t p = 1;
  while (p < static_cast<uint64_t>(2 * cap_)) p <<= 1;
  index_.assign(p, 0);
  mask_ = p - 1;
}

inline int64_t HashedEmbedding::memory_bytes() const {
  return cap_ * (dim_ * 4 + srow_ * 4 + 8 + 8) + kMetaSize * 8 +
         static_cast<int64_t>(index_.capacity() * sizeof(uint64_t));
}

inline uint64_t HashedEmbedding::index_find(int64_t key, uint64_t h) const {
  uint64_t pos = h & mask_;
  for (;;) {
    const uint64_t e = index_[pos];
    if (e == 0) return hashed_detail::kNone;
    if ((e & ~hashed_detail::kSlotMask) == (h & ~hashed_detail::kSlotMask) && keys_[hashed_detail::entry_slot(e)] == key) return pos;
    pos = (pos + 1) & mask_;
  }
}

inline void HashedEmbedding::erase_index(uint64_t pos) {
  // Backward-shift deletion: pull later entries of the probe run into the hole when the hole is
  // on their probe path, so that lookups never need tombstones.
  uint64_t hole = pos, j = pos;
  for (;;) {
    j = (j + 1) & mask_;
    const uint64_t e = index_[j];
    if (e == 0) break;
    const uint64_t home = key_hash(keys_[hashed_detail::entry_slot(e)]) & mask_;
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      index_[hole] = e;
      hole = j;
    }
  }
  index_[hole] = 0;
}

inline void HashedEmbedding::lru_unlink(int32_t s) {
  const int32_t p = prev_[s], n = next_[s];
  if (p >= 0) next_[p] = n; else head_ = n;
  if (n >= 0) prev_[n] = p; else tail_ = p;
}

inline void HashedEmbedding::lru_push_back(int32_t s) {
  prev_[s] = tail_;
  next_[s] = -1;
  if (tail_ >= 0) next_[tail_] = s; else head_ = s;
  tail_ = s;
}

inline void HashedEmbedding::init_row(int32_t s, int64_t key) {
  float* w = w_ + static_cast<int64_t>(s) * dim_;
  for (int64_t k = 0; k < dim_; ++k) w[k] = init_value(o_.seed, key, k, o_.init_scale);
  if (srow_ > 0) opt_.init_state_row(st_ + static_cast<int64_t>(s) * srow_, dim_);
}

inline int32_t HashedEmbedding::insert_locked(int64_t key) {
  int32_t s;
  if (size_ < cap_) {
    s = static_cast<int32_t>(size_++);
  } else {
    s = head_;  // least recently used
    const uint64_t pos = index_find(keys_[s], key_hash(keys_[s]));
    DLREC_CHECK(pos != hashed_detail::kNone, "HashedEmbedding: index lost a key (bug)");
    erase_index(pos);
    lru_unlink(s);
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  keys_[s] = key;
  const uint64_t h = key_hash(key);
  uint64_t pos = h & mask_;
  while (index_[pos] != 0) pos = (pos + 1) & mask_;
  index_[pos] = hashed_detail::make_entry(h, s);
  lru_push_back(s);
  init_row(s, key);
  inserts_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

inline int64_t HashedEmbedding::find(int64_t key) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const uint64_t pos = index_find(key, key_hash(key));
  return pos == hashed_detail::kNone ? -1 : hashed_detail::entry_slot(index_[pos]);
}

inline bool HashedEmbedding::read_row(int64_t key, float* out) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const uint64_t pos = index_find(key, key_hash(key));
  if (pos == hashed_detail::kNone) {
    std::fill(out, out + dim_, 0.f);
    return false;
  }
  std::memcpy(out, w_ + static_cast<int64_t>(hashed_detail::entry_slot(index_[pos])) * dim_,
              dim_ * sizeof(float));
  return true;
}

inline void HashedEmbedding::lookup_or_insert(const int64_t* keys, int64_t n, int64_t* slots) {
  if (n > cap_) {
    std::unordered_set<int64_t> distinct(keys, keys + n);
    if (static_cast<int64_t>(distinct.size()) > cap_)
      fail("HashedEmbedding: ", distinct.size(), " distinct keys in one lookup exceed the capacity of ",
           cap_, " rows");
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t pos = index_find(keys[i], key_hash(keys[i]));
    if (pos != hashed_detail::kNone) {
      const int32_t s = hashed_detail::entry_slot(index_[pos]);
      lru_unlink(s);
      lru_push_back(s);
      slots[i] = s;
      ++hits;
    } else {
      slots[i] = insert_locked(keys[i]);
    }
  }
  lookups_.fetch_add(n, std::memory_order_relaxed);
  hits_.fetch_add(hits, std::memory_order_relaxed);
}

inline void HashedEmbedding::forward(const int64_t* offsets, const int64_t* keys, int64_t B, float* out,
                              int64_t out_stride, bool training) {
  DLREC_CHECK(B >= 0 && out_stride >= dim_, "HashedEmbedding::forward: bad batch or stride");
  const int64_t base = B > 0 ? offsets[0] : 0;
  const int64_t nnz = B > 0 ? offsets[B] - base : 0;
  const bool mean = o_.pooling == nn::Pooling::Mean;
  const int64_t d = dim_;
  if (!training) {
    // Readers only: no member is written here (concurrent evaluation threads are fine).
    std::shared_lock<std::shared_mutex> lock(mu_);
    parallel_for(0, B, 64, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        float* o = out + r * out_stride;
        std::fill(o, o + d, 0.f);
        const int64_t len = offsets[r + 1] - offsets[r];
        for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
          const uint64_t pos = index_find(keys[i], key_hash(keys[i]));
          if (pos == hashed_detail::kNone) continue;
          const float* w = w_ + static_cast<int64_t>(hashed_detail::entry_slot(index_[pos])) * d;
          for (int64_t k = 0; k < d; ++k) o[k] += w[k];
        }
        if (mean && len > 0)
          for (int64_t k = 0; k < d; ++k) o[k] *= 1.f / static_cast<float>(len);
      }
    });
    return;
  }

  // De-duplicate the batch's keys (order of first occurrence), then resolve them in one
  // exclusive section.
  std::vector<int64_t> uniq_keys;
  inverse_.resize(nnz);
  {
    uint64_t p = 16;
    while (p < static_cast<uint64_t>(2 * nnz)) p <<= 1;
    std::vector<int64_t> local(p, -1);
    for (int64_t i = 0; i < nnz; ++i) {
      const int64_t key = keys[base + i];
      uint64_t pos = key_hash(key) & (p - 1);
      for (;;) {
        const int64_t u = local[pos];
        if (u < 0) {
          local[pos] = static_cast<int64_t>(uniq_keys.size());
          inverse_[i] = local[pos];
          uniq_keys.push_back(key);
          break;
        }
        if (uniq_keys[u] == key) {
          inverse_[i] = u;
          break;
        }
        pos = (pos + 1) & (p - 1);
      }
    }
  }
  const int64_t U = static_cast<int64_t>(uniq_keys.size());
  if (U > cap_)
    fail("HashedEmbedding: ", U, " distinct keys in one batch exceed the capacity of ", cap_,
         " rows");
  // Occurrences per unique key (CSR, in order of occurrence) with their samples.
  uniq_ptr_.assign(U + 1, 0);
  for (int64_t i = 0; i < nnz; ++i) ++uniq_ptr_[inverse_[i] + 1];
  for (int64_t u = 0; u < U; ++u) uniq_ptr_[u + 1] += uniq_ptr_[u];
  occ_sample_.resize(nnz);
  {
    std::vector<int64_t> cursor(uniq_ptr_.begin(), uniq_ptr_.end() - 1);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i)
        occ_sample_[cursor[inverse_[i - base]]++] = r;
  }
  scale_.resize(B);
  for (int64_t r = 0; r < B; ++r) {
    const int64_t len = offsets[r + 1] - offsets[r];
    scale_[r] = (mean && len > 0) ? 1.f / static_cast<float>(len) : 1.f;
  }

  uniq_slots_.resize(U);
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    int64_t hits = 0;
    // The index positions of the keys a few iterations ahead are prefetched: the probes are
    // random accesses into an index much larger than the caches.
    constexpr int64_t kAhead = 8;
    std::vector<uint64_t> hashes(U);
    for (int64_t u = 0; u < U; ++u) hashes[u] = key_hash(uniq_keys[u]);
    for (int64_t u = 0; u < std::min(U, kAhead); ++u)
      __builtin_prefetch(&index_[hashes[u] & mask_]);
    for (int64_t u = 0; u < U; ++u) {
      if (u + kAhead < U) __builtin_prefetch(&index_[hashes[u + kAhead] & mask_]);
      const uint64_t pos = index_find(uniq_keys[u], hashes[u]);
      if (pos != hashed_detail::kNone) {
        const int32_t s = hashed_detail::entry_slot(index_[pos]);
        lru_unlink(s);
        lru_push_back(s);
        uniq_slots_[u] = s;
        hits += uniq_ptr_[u + 1] - uniq_ptr_[u];
      } else {
        uniq_slots_[u] = insert_locked(uniq_keys[u]);
      }
    }
    lookups_.fetch_add(nnz, std::memory_order_relaxed);
    hits_.fetch_add(hits, std::memory_order_relaxed);
  }

  // Pool (read-only on the rows; each sample is written by one piece).
  parallel_for(0, B, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* o = out + r * out_stride;
      std::fill(o, o + d, 0.f);
      for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
        const float* w = w_ + uniq_slots_[inverse_[i - base]] * d;
        for (int64_t k = 0; k < d; ++k) o[k] += w[k];
      }
      if (scale_[r] != 1.f)
        for (int64_t k = 0; k < d; ++k) o[k] *= scale_[r];
    }
  });
  batch_rows_ = B;
  have_batch_ = true;
}

inline const nn::SparseGrad& HashedEmbedding::backward(const float* dout, int64_t dout_stride) {
  DLREC_CHECK(have_batch_, "HashedEmbedding::backward needs a training forward before it");
  have_batch_ = false;
  const int64_t U = static_cast<int64_t>(uniq_slots_.size()), d = dim_;
  grad_.dim = d;
  grad_.ids = uniq_slots_;
  grad_.values.assign(U * d, 0.f);
  parallel_for(0, U, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      float* g = grad_.values.data() + u * d;
      for (int64_t j = uniq_ptr_[u]; j < uniq_ptr_[u + 1]; ++j) {
        const int64_t r = occ_sample_[j];
        const float* dy = dout + r * dout_stride;
        const float s = scale_[r];
        for (int64_t k = 0; k < d; ++k) g[k] += s * dy[k];
      }
    }
  });
  return grad_;
}

inline void HashedEmbedding::apply(const nn::SparseGrad& g, float lr) {
  DLREC_CHECK(g.dim == dim_ && static_cast<int64_t>(g.values.size()) == g.size() * dim_,
              "HashedEmbedding::apply: malformed gradient");
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t d = dim_;
  parallel_for(0, g.size(), 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t s = g.ids[u];
      if (s < 0 || s >= size_) fail("HashedEmbedding::apply: slot ", s, " out of range");
      opt_.step_row(w_ + s * d, srow_ ? st_ + s * srow_ : nullptr,
                    g.values.data() + u * d, d, lr);
    }
  });
}

inline HashedEmbeddingStats HashedEmbedding::stats() const {
  HashedEmbeddingStats s;
  s.lookups = lookups_.load();
  s.hits = hits_.load();
  s.inserts = inserts_.load();
  s.evictions = evictions_.load();
  s.size = size_;
  return s;
}

inline std::vector<int64_t> HashedEmbedding::keys_by_recency() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<int64_t> out;
  out.reserve(size_);
  for (int32_t s = head_; s >= 0; s = next_[s]) out.push_back(keys_[s]);
  return out;
}

inline HashedEmbedding::StateTensors HashedEmbedding::tensors(bool update_meta) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (!update_meta) return t_;
  int64_t* m = t_.meta.data<int64_t>();
  m[0] = size_;
  m[1] = head_;
  m[2] = tail_;
  m[3] = lookups_.load();
  m[4] = hits_.load();
  m[5] = inserts_.load();
  m[6] = evictions_.load();
  m[7] = cap_;
  return t_;
}

inline void HashedEmbedding::import_tensors(const std::string& what) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t* m = t_.meta.data<int64_t>();
  auto bad = [&](auto&&... why) {
    std::fill(index_.begin(), index_.end(), 0);  // the table is left empty, never half-built
    size_ = 0;
    head_ = tail_ = -1;
    fail(what, ": ", why..., " (not a state this table wrote: a corrupt or mismatched file)");
  };
  if (m[7] != cap_) bad("capacity ", m[7], " in the file, the table has ", cap_);
  const int64_t n = m[0];
  if (n < 0 || n > cap_) bad("size ", n, " is outside 0 .. ", cap_);
  for (int k = 3; k < 7; ++k)
    if (m[k] < 0) bad("a negative counter");
  if (m[4] > m[3]) bad("more hits than lookups");
  // The LRU list must visit every used slot exactly once, front to back.
  std::vector<char> seen(static_cast<size_t>(n), 0);
  int64_t count = 0;
  int64_t prev = -1;
  for (int64_t s = n > 0 ? m[1] : -1; s >= 0; s = next_[s]) {
    if (s >= n || seen[s]) bad("the LRU list is broken at slot ", s);
    if (prev_[s] != prev) bad("the LRU list's back link of slot ", s, " is wrong");
    seen[s] = 1;
    prev = s;
    ++count;
  }
  if (count != n || (n > 0 ? m[2] != prev : (m[1] != -1 || m[2] != -1)))
    bad("the LRU list holds ", count, " slots, the size is ", n);
  // Rebuilt from scratch: on an error the table is left empty (no stale index entries).
  std::fill(index_.begin(), index_.end(), 0);
  size_ = 0;
  head_ = tail_ = -1;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t key = keys_[s];
    const uint64_t h = key_hash(key);
    if (index_find(key, h) != hashed_detail::kNone) bad("key ", key, " has two rows");
    uint64_t pos = h & mask_;
    while (index_[pos] != 0) pos = (pos + 1) & mask_;
    index_[pos] = hashed_detail::make_entry(h, static_cast<int32_t>(s));
  }
  size_ = n;
  head_ = static_cast<int32_t>(m[1]);
  tail_ = static_cast<int32_t>(m[2]);
  lookups_ = m[3];
  hits_ = m[4];
  inserts_ = m[5];
  evictions_ = m[6];
  have_batch_ = false;
}

}  // namespace dlrec::embedding
