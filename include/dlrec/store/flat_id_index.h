// A flat open-addressing map from non-negative 64-bit ids to 32-bit values, for the GPU cache
// tier's host side (include/dlrec/store/gpu_cache.h): the slot map of a feature (id -> cache
// slot, up to 2^31 - 1 entries) and the per-batch de-duplication of its ids.
//
// Why not std::unordered_map: a lookup there follows a bucket pointer to a heap node (two
// dependent cache misses) and every insert allocates; here the keys and values sit in one array
// of 16-byte entries, a lookup is one probe sequence from hash(id) (linear probing, kept short
// by a load factor of at most 1/2), and prefetch() lets a caller start the probe's memory
// access a few ids ahead. Erase shifts the following entries back (no tombstones), so lookups
// never slow down as entries come and go.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace dlrec::store {

// Memory for large random-access arrays (the slot maps): blocks of 2 MiB or more are 2 MiB
// aligned and advised into huge pages, since with 4 KiB pages nearly every random access to a
// table of hundreds of MiB would also miss the TLB. A hint: where huge pages are refused, the
// memory is ordinary.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    constexpr size_t kHuge = size_t{2} << 20;
    size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (bytes >= kHuge) {
      bytes = (bytes + kHuge - 1) / kHuge * kHuge;
      p = std::aligned_alloc(kHuge, bytes);
#ifdef MADV_HUGEPAGE
      if (p) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    } else {
      p = std::malloc(bytes ? bytes : 1);
    }
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

class FlatIdIndex {
 public:
  static constexpr int32_t kAbsent = -1;
  // Room for `capacity` entries (the table has at least twice as many cells).
  explicit FlatIdIndex(int64_t capacity = 0) { reserve(capacity); }
  // Grows to hold `capacity` entries (rehashing what is there).
  void reserve(int64_t capacity) {
    size_t cells = 16;
    while (cells < 2 * static_cast<size_t>(capacity < 0 ? 0 : capacity)) cells *= 2;
    if (cells <= n_cells_) return;
    Cells old;
    old.swap(cells_);
    allocate(cells);
    for (const Cell& c : old)
      if (c.key != kEmpty) insert(c.key, c.value);
  }
  // Empties the map and sizes it for `capacity` entries exactly (shrinking too): the per-batch
  // use, where clearing costs what the batch's ids cost.
  void reset(int64_t capacity) {
    size_t cells = 16;
    while (cells < 2 * static_cast<size_t>(capacity < 0 ? 0 : capacity)) cells *= 2;
    if (cells == n_cells_)
      clear();
    else
      allocate(cells);
  }
  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(n_cells_ / 2); }
  // Starts loading the cell `id` hashes to (a lookup of it soon after is then cheaper).
  void prefetch(int64_t id) const { __builtin_prefetch(&cells_[home(id)]); }
  // The value of `id` (>= 0), or kAbsent.
  int32_t find(int64_t id) const {
    for (size_t i = home(id);; i = (i + 1) & mask_) {
      const Cell& c = cells_[i];
      if (c.key == id) return c.value;
      if (c.key == kEmpty) return kAbsent;
    }
  }
  // The value of `id`, inserted as kAbsent when absent (*added says which): the caller sets it.
  // The pointer is valid until the next insert.
  int32_t* emplace(int64_t id, bool* added) {
    if (size_ >= capacity()) reserve(2 * size_ + 1);
    size_t i = home(id);
    for (;; i = (i + 1) & mask_) {
      Cell& c = cells_[i];
      if (c.key == id) {
        *added = false;
        return &c.value;
      }
      if (c.key == kEmpty) break;
    }
    cells_[i] = Cell{id, kAbsent};
    ++size_;
    *added = true;
    return &cells_[i].value;
  }
  // Sets the value of `id` (inserted when absent).
  void insert(int64_t id, int32_t value) {
    if (size_ >= capacity()) reserve(2 * size_ + 1);
    size_t i = home(id);
    for (;; i = (i + 1) & mask_) {
      Cell& c = cells_[i];
      if (c.key == id) {
        c.value = value;
        return;
      }
      if (c.key == kEmpty) break;
    }
    cells_[i] = Cell{id, value};
    ++size_;
  }
  // Removes `id`; whether it was there. The entries after it in its probe run move back into
  // the hole when their home allows, so every remaining id stays reachable from its home.
  bool erase(int64_t id) {
    size_t i = home(id);
    for (;; i = (i + 1) & mask_) {
      if (cells_[i].key == id) break;
      if (cells_[i].key == kEmpty) return false;
    }
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (cells_[j].key == kEmpty) break;
      const size_t h = home(cells_[j].key);
      // cells_[j] may fill the hole at i unless its home lies cyclically in (i, j].
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        cells_[i] = cells_[j];
        i = j;
      }
    }
    cells_[i].key = kEmpty;
    --size_;
    return true;
  }
  void clear() {
    for (size_t i = 0; i < n_cells_; ++i) cells_[i].key = kEmpty;
    size_ = 0;
  }

 private:
  static constexpr int64_t kEmpty = -1;  // ids are >= 0
  struct Cell {
    int64_t key;
    int32_t value;
  };
  using Cells = std::vector<Cell, HugePageAllocator<Cell>>;
  void allocate(size_t cells) {  // a power of two >= 16
    cells_.assign(cells, Cell{kEmpty, 0});
    n_cells_ = cells;
    mask_ = cells - 1;
    shift_ = 64;
    for (size_t c = cells; c > 1; c >>= 1) --shift_;
    size_ = 0;
  }
  // Fibonacci hashing: the top bits of id x 2^64/phi (consecutive ids land far apart).
  size_t home(int64_t id) const {
    return static_cast<size_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  Cells cells_;
  size_t n_cells_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
  int64_t size_ = 0;
};

}  // namespace dlrec::store
