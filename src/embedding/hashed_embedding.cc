#include "dlrec/embedding/hashed_embedding.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "dlrec/core/thread_pool.h"
#include "dlrec/embedding/hash_common.h"
#include "dlrec/train/tensor_file.h"

namespace dlrec::embedding {

namespace {
constexpr uint64_t kNone = ~uint64_t{0};
constexpr uint64_t kSlotMask = 0xFFFFFFFFull;

inline uint64_t make_entry(uint64_t h, int32_t slot) {
  return (h & ~kSlotMask) | static_cast<uint64_t>(slot + 1);
}
inline int32_t entry_slot(uint64_t e) { return static_cast<int32_t>(e & kSlotMask) - 1; }
}  // namespace

float initial_value(uint64_t seed, int64_t key, int64_t k, float scale) {
  return init_value(seed, key, k, scale);
}

HashedEmbedding::HashedEmbedding(const HashedEmbeddingOptions& options)
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
  w_.resize(cap_ * dim_);
  st_.resize(cap_ * srow_);
  keys_.resize(cap_);
  prev_.resize(cap_);
  next_.resize(cap_);
  uint64_t p = 1;
  while (p < static_cast<uint64_t>(2 * cap_)) p <<= 1;
  index_.assign(p, 0);
  mask_ = p - 1;
}

int64_t HashedEmbedding::memory_bytes() const {
  return static_cast<int64_t>(w_.capacity() * sizeof(float) + st_.capacity() * sizeof(float) +
                              keys_.capacity() * sizeof(int64_t) +
                              (prev_.capacity() + next_.capacity()) * sizeof(int32_t) +
                              index_.capacity() * sizeof(uint64_t));
}

uint64_t HashedEmbedding::index_find(int64_t key, uint64_t h) const {
  uint64_t pos = h & mask_;
  for (;;) {
    const uint64_t e = index_[pos];
    if (e == 0) return kNone;
    if ((e & ~kSlotMask) == (h & ~kSlotMask) && keys_[entry_slot(e)] == key) return pos;
    pos = (pos + 1) & mask_;
  }
}

void HashedEmbedding::erase_index(uint64_t pos) {
  // Backward-shift deletion: pull later entries of the probe run into the hole when the hole is
  // on their probe path, so that lookups never need tombstones.
  uint64_t hole = pos, j = pos;
  for (;;) {
    j = (j + 1) & mask_;
    const uint64_t e = index_[j];
    if (e == 0) break;
    const uint64_t home = key_hash(keys_[entry_slot(e)]) & mask_;
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      index_[hole] = e;
      hole = j;
    }
  }
  index_[hole] = 0;
}

void HashedEmbedding::lru_unlink(int32_t s) {
  const int32_t p = prev_[s], n = next_[s];
  if (p >= 0) next_[p] = n; else head_ = n;
  if (n >= 0) prev_[n] = p; else tail_ = p;
}

void HashedEmbedding::lru_push_back(int32_t s) {
  prev_[s] = tail_;
  next_[s] = -1;
  if (tail_ >= 0) next_[tail_] = s; else head_ = s;
  tail_ = s;
}

void HashedEmbedding::init_row(int32_t s, int64_t key) {
  float* w = w_.data() + static_cast<int64_t>(s) * dim_;
  for (int64_t k = 0; k < dim_; ++k) w[k] = init_value(o_.seed, key, k, o_.init_scale);
  if (srow_ > 0) opt_.init_state_row(st_.data() + static_cast<int64_t>(s) * srow_, dim_);
}

int32_t HashedEmbedding::insert_locked(int64_t key) {
  int32_t s;
  if (size_ < cap_) {
    s = static_cast<int32_t>(size_++);
  } else {
    s = head_;  // least recently used
    const uint64_t pos = index_find(keys_[s], key_hash(keys_[s]));
    DLREC_CHECK(pos != kNone, "HashedEmbedding: index lost a key (bug)");
    erase_index(pos);
    lru_unlink(s);
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  keys_[s] = key;
  const uint64_t h = key_hash(key);
  uint64_t pos = h & mask_;
  while (index_[pos] != 0) pos = (pos + 1) & mask_;
  index_[pos] = make_entry(h, s);
  lru_push_back(s);
  init_row(s, key);
  inserts_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

int64_t HashedEmbedding::find(int64_t key) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const uint64_t pos = index_find(key, key_hash(key));
  return pos == kNone ? -1 : entry_slot(index_[pos]);
}

bool HashedEmbedding::read_row(int64_t key, float* out) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const uint64_t pos = index_find(key, key_hash(key));
  if (pos == kNone) {
    std::fill(out, out + dim_, 0.f);
    return false;
  }
  std::memcpy(out, w_.data() + static_cast<int64_t>(entry_slot(index_[pos])) * dim_,
              dim_ * sizeof(float));
  return true;
}

void HashedEmbedding::lookup_or_insert(const int64_t* keys, int64_t n, int64_t* slots) {
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
    if (pos != kNone) {
      const int32_t s = entry_slot(index_[pos]);
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

void HashedEmbedding::forward(const int64_t* offsets, const int64_t* keys, int64_t B, float* out,
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
          if (pos == kNone) continue;
          const float* w = w_.data() + static_cast<int64_t>(entry_slot(index_[pos])) * d;
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
      if (pos != kNone) {
        const int32_t s = entry_slot(index_[pos]);
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
        const float* w = w_.data() + uniq_slots_[inverse_[i - base]] * d;
        for (int64_t k = 0; k < d; ++k) o[k] += w[k];
      }
      if (scale_[r] != 1.f)
        for (int64_t k = 0; k < d; ++k) o[k] *= scale_[r];
    }
  });
  batch_rows_ = B;
  have_batch_ = true;
}

const nn::SparseGrad& HashedEmbedding::backward(const float* dout, int64_t dout_stride) {
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

void HashedEmbedding::apply(const nn::SparseGrad& g, float lr) {
  DLREC_CHECK(g.dim == dim_ && static_cast<int64_t>(g.values.size()) == g.size() * dim_,
              "HashedEmbedding::apply: malformed gradient");
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t d = dim_;
  parallel_for(0, g.size(), 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t s = g.ids[u];
      if (s < 0 || s >= size_) fail("HashedEmbedding::apply: slot ", s, " out of range");
      opt_.step_row(w_.data() + s * d, srow_ ? st_.data() + s * srow_ : nullptr,
                    g.values.data() + u * d, d, lr);
    }
  });
}

HashedEmbeddingStats HashedEmbedding::stats() const {
  HashedEmbeddingStats s;
  s.lookups = lookups_.load();
  s.hits = hits_.load();
  s.inserts = inserts_.load();
  s.evictions = evictions_.load();
  s.size = size_;
  return s;
}

std::vector<int64_t> HashedEmbedding::keys_by_recency() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<int64_t> out;
  out.reserve(size_);
  for (int32_t s = head_; s >= 0; s = next_[s]) out.push_back(keys_[s]);
  return out;
}

void HashedEmbedding::save(const std::string& path) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t n = size_, d = dim_;
  Tensor keys = Tensor::empty({n}, DType::I64);
  Tensor w = Tensor::empty({n, d}, DType::F32);
  Tensor st = srow_ ? Tensor::empty({n, srow_}, DType::F32) : Tensor();
  int64_t* kp = keys.data<int64_t>();
  float* wp = w.data<float>();
  int64_t i = 0;
  for (int32_t s = head_; s >= 0; s = next_[s], ++i) {
    kp[i] = keys_[s];
    std::memcpy(wp + i * d, w_.data() + static_cast<int64_t>(s) * d, d * sizeof(float));
    if (srow_)
      std::memcpy(st.data<float>() + i * srow_, st_.data() + static_cast<int64_t>(s) * srow_,
                  srow_ * sizeof(float));
  }
  DLREC_CHECK(i == n, "HashedEmbedding::save: LRU list out of step with the size (bug)");
  std::vector<model::NamedTensor> tensors = {{"keys", keys}, {"weights", w}};
  if (srow_) tensors.emplace_back("state", st);
  const json meta = {{"kind", "hashed_embedding"},
                     {"rows", n},
                     {"dim", d},
                     {"capacity", cap_},
                     {"seed", o_.seed},
                     {"init_scale", o_.init_scale},
                     {"optimizer", nn::optimizer_name(opt_.kind())},
                     {"state_row_size", srow_},
                     {"lookups", lookups_.load()},
                     {"hits", hits_.load()},
                     {"inserts", inserts_.load()},
                     {"evictions", evictions_.load()}};
  train::save_tensors(path, tensors, meta);
}

void HashedEmbedding::load(const std::string& path) {
  const json meta = train::read_tensor_meta(path);
  int64_t n = 0;
  try {
    DLREC_CHECK(meta.value("kind", "") == "hashed_embedding", "'", path,
                "' is not a hashed embedding table");
    n = meta.at("rows").get<int64_t>();
    const int64_t d = meta.at("dim").get<int64_t>();
    const int64_t srow = meta.at("state_row_size").get<int64_t>();
    DLREC_CHECK(d == dim_, "'", path, "' holds rows of dim ", d, ", the table has dim ", dim_);
    DLREC_CHECK(srow == srow_, "'", path, "' holds ", srow, " optimizer state values per row (",
                meta.value("optimizer", "?"), "), the table's optimizer (",
                nn::optimizer_name(opt_.kind()), ") keeps ", srow_);
    DLREC_CHECK(n >= 0 && n <= cap_, "'", path, "' holds ", n,
                " rows, more than the table's capacity of ", cap_);
  } catch (const json::exception& e) {
    fail("'", path, "': bad hashed embedding meta: ", e.what());
  }
  Tensor keys = Tensor::empty({n}, DType::I64);
  Tensor w = Tensor::empty({n, dim_}, DType::F32);
  Tensor st = srow_ ? Tensor::empty({n, srow_}, DType::F32) : Tensor();
  std::vector<model::NamedTensor> tensors = {{"keys", keys}, {"weights", w}};
  if (srow_) tensors.emplace_back("state", st);
  train::load_tensors(path, tensors);

  std::unique_lock<std::shared_mutex> lock(mu_);
  std::fill(index_.begin(), index_.end(), 0);
  head_ = tail_ = -1;
  size_ = 0;
  const int64_t* kp = keys.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = kp[i];
    const uint64_t h = key_hash(key);
    if (index_find(key, h) != kNone) fail("'", path, "': key ", key, " appears twice");
    const int32_t s = static_cast<int32_t>(size_++);
    keys_[s] = key;
    uint64_t pos = h & mask_;
    while (index_[pos] != 0) pos = (pos + 1) & mask_;
    index_[pos] = make_entry(h, s);
    lru_push_back(s);
    std::memcpy(w_.data() + static_cast<int64_t>(s) * dim_, w.data<float>() + i * dim_,
                dim_ * sizeof(float));
    if (srow_)
      std::memcpy(st_.data() + static_cast<int64_t>(s) * srow_, st.data<float>() + i * srow_,
                  srow_ * sizeof(float));
  }
  lookups_ = meta.value("lookups", int64_t{0});
  hits_ = meta.value("hits", int64_t{0});
  inserts_ = meta.value("inserts", int64_t{0});
  evictions_ = meta.value("evictions", int64_t{0});
  have_batch_ = false;
}

}  // namespace dlrec::embedding
