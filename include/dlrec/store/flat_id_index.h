// A flat open-addressing map from non-negative ids to 32-bit values, for the GPU cache tier's
// host side (include/dlrec/store/gpu_cache.h): the slot map of a feature (id -> cache slot, up
// to 2^31 - 1 entries) and the per-batch de-duplication of its ids.
//
// Why not std::unordered_map: a lookup there follows a bucket pointer to a heap node (two
// dependent cache misses) and every insert allocates; here the keys and values sit in one array
// of cells, a lookup is one probe sequence from hash(id) (linear probing, the table at most
// 70 % full), and prefetch() lets a caller start the probe's memory access ahead. Erase shifts
// the following entries back (no tombstones), so lookups never slow down as entries come and
// go. The slot map of a large cache is still far larger than the caches, so each lookup costs
// a trip to memory and, unless the table sits in huge pages, a TLB miss: hence Key. With
// 32-bit keys (ids below 2^32 - 1, tables of fewer rows) a cell is 8 bytes, not 16, and the
// table is sized to its capacity exactly (not to a power of two): 419,430 slots take 4.8 MB,
// not 16 MB.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
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

template <class Key>
class FlatIdIndexT {
  static_assert(std::is_unsigned<Key>::value && sizeof(Key) >= 4, "keys: uint32_t or uint64_t");

 public:
  static constexpr int32_t kAbsent = -1;
  // Ids must be below this (the empty cell's key).
  static constexpr uint64_t kMaxId = static_cast<Key>(~Key{0}) - uint64_t{1};
  // Room for `capacity` entries.
  explicit FlatIdIndexT(int64_t capacity = 0) { reserve(capacity); }
  // Grows to hold `capacity` entries (rehashing what is there).
  void reserve(int64_t capacity) {
    const size_t cells = cells_for(capacity);
    if (cells <= cells_.size()) return;
    Cells old;
    old.swap(cells_);
    allocate(cells);
    for (const Cell& c : old)
      if (c.key != kEmpty) insert(static_cast<int64_t>(c.key), c.value);
  }
  // Empties the map and sizes it for `capacity` entries exactly (shrinking too): the per-batch
  // use, where clearing costs what the batch's ids cost.
  void reset(int64_t capacity) {
    const size_t cells = cells_for(capacity);
    if (cells == cells_.size())
      clear();
    else
      allocate(cells);
  }
  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(cells_.size() * 7 / 10); }
  // Starts loading the cell `id` hashes to (a lookup of it soon after is then cheaper).
  void prefetch(int64_t id) const { __builtin_prefetch(cell_of(id)); }
  // Where the probe for `id` starts (to prefetch).
  const void* cell_of(int64_t id) const { return &cells_[home(id)]; }
  // The value of `id` (>= 0), or kAbsent.
  int32_t find(int64_t id) const {
    const Key k = static_cast<Key>(id);
    for (size_t i = home(id);; i = next(i)) {
      const Cell& c = cells_[i];
      if (c.key == k) return c.value;
      if (c.key == kEmpty) return kAbsent;
    }
  }
  // The value of `id`, inserted as kAbsent when absent (*added says which): the caller sets it.
  // The pointer is valid until the next insert.
  int32_t* emplace(int64_t id, bool* added) {
    if (size_ >= capacity()) reserve(2 * size_ + 1);
    const Key k = static_cast<Key>(id);
    size_t i = home(id);
    for (;; i = next(i)) {
      Cell& c = cells_[i];
      if (c.key == k) {
        *added = false;
        return &c.value;
      }
      if (c.key == kEmpty) break;
    }
    cells_[i] = Cell{k, kAbsent};
    ++size_;
    *added = true;
    return &cells_[i].value;
  }
  // Sets the value of `id` (inserted when absent).
  void insert(int64_t id, int32_t value) {
    bool added = false;
    *emplace(id, &added) = value;
  }
  // Removes `id`; whether it was there. The entries after it in its probe run move back into
  // the hole when their home allows, so every remaining id stays reachable from its home.
  bool erase(int64_t id) {
    const Key k = static_cast<Key>(id);
    size_t i = home(id);
    for (;; i = next(i)) {
      if (cells_[i].key == k) break;
      if (cells_[i].key == kEmpty) return false;
    }
    for (size_t j = next(i);; j = next(j)) {
      if (cells_[j].key == kEmpty) break;
      const size_t h = home(static_cast<int64_t>(cells_[j].key));
      // cells_[j] may fill the hole at i unless its home lies cyclically in (i, j].
      if (distance(h, j) >= distance(i, j)) {
        cells_[i] = cells_[j];
        i = j;
      }
    }
    cells_[i].key = kEmpty;
    --size_;
    return true;
  }
  void clear() {
    for (Cell& c : cells_) c.key = kEmpty;
    size_ = 0;
  }

 private:
  static constexpr Key kEmpty = static_cast<Key>(~Key{0});
  struct Cell {
    Key key;
    int32_t value;
  };
  using Cells = std::vector<Cell, HugePageAllocator<Cell>>;
  // At most 70 % full; at least 16 cells.
  static size_t cells_for(int64_t capacity) {
    const auto c = static_cast<size_t>(capacity < 0 ? 0 : capacity);
    return std::max<size_t>(16, (c * 10 + 6) / 7 + 1);
  }
  void allocate(size_t cells) {
    cells_.assign(cells, Cell{kEmpty, 0});
    size_ = 0;
  }
  size_t next(size_t i) const { return i + 1 == cells_.size() ? 0 : i + 1; }
  size_t distance(size_t from, size_t to) const {  // cyclically, from -> to
    return to >= from ? to - from : to + cells_.size() - from;
  }
  // Fibonacci hashing (id x 2^64/phi), then the high bits scaled to the table's size
  // (multiply-shift), so any size works and consecutive ids land far apart.
  size_t home(int64_t id) const {
    const uint64_t h = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>((static_cast<unsigned __int128>(h) * cells_.size()) >> 64);
  }
  Cells cells_;
  int64_t size_ = 0;
};

// Ids of any size (below 2^64 - 1): 16-byte cells.
using FlatIdIndex = FlatIdIndexT<uint64_t>;

}  // namespace dlrec::store
