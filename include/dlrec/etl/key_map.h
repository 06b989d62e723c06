// KeyMap: an open-addressing hash map from 64-bit categorical keys to small values.
//
// Linear probing over one array of (key, value) slots, so a lookup touches one cache line in
// the common case; the load factor stays at or below 1/2. Every 64-bit key is allowed: the
// one key used as the empty-slot marker is stored beside the table. Lookups are const and
// thread-safe; inserts are not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <utility>
#include <vector>

namespace dlrec::etl {

template <class V>
class KeyMap {
 public:
  explicit KeyMap(size_t expected = 0) { reserve(expected); }

  size_t size() const { return size_ + (has_marker_ ? 1 : 0); }

  // Makes room for `n` keys without rehashing.
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    if (cap > slots_.size()) rehash(cap);
  }

  const V* find(uint64_t key) const {
    if (key == kEmpty) return has_marker_ ? &marker_value_ : nullptr;
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

  // Hints the CPU to fetch the slot of `key`; issue it a few keys ahead of find()/operator[]
  // to overlap the cache misses of large tables.
  void prefetch(uint64_t key) const { __builtin_prefetch(&slots_[slot_of(key)]); }

  // The same three with the key's hash(key) given, so that a loop that prefetches ahead
  // hashes each key once (the hash does not depend on the table's size: still valid after a
  // rehash).
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  void prefetch_hashed(uint64_t h) const {
    __builtin_prefetch(&slots_[static_cast<size_t>(h) & mask_]);
  }
  const V* find_hashed(uint64_t key, uint64_t h) const {
    if (key == kEmpty) return has_marker_ ? &marker_value_ : nullptr;
    for (size_t i = static_cast<size_t>(h) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  V& at_hashed(uint64_t key, uint64_t h) {
    if (key == kEmpty) return (*this)[key];
    size_t i = static_cast<size_t>(h) & mask_;
    for (;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == kEmpty) break;
    }
    if (2 * (size_ + 1) > slots_.size()) {
      rehash(slots_.size() * 2);
      return (*this)[key];
    }
    ++size_;
    slots_[i].key = key;
    slots_[i].value = V{};
    return slots_[i].value;
  }

  // The value of `key`, inserted as V{} when absent.
  V& operator[](uint64_t key) {
    if (key == kEmpty) {
      if (!has_marker_) {
        has_marker_ = true;
        marker_value_ = V{};
      }
      return marker_value_;
    }
    size_t i = slot_of(key);
    for (;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == kEmpty) break;
    }
    if (2 * (size_ + 1) > slots_.size()) {
      rehash(slots_.size() * 2);
      return (*this)[key];
    }
    ++size_;
    slots_[i].key = key;
    slots_[i].value = V{};
    return slots_[i].value;
  }

  // Calls f(key, value) for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != kEmpty) f(s.key, s.value);
    if (has_marker_) f(kEmpty, marker_value_);
  }

  // Slots in the table (the map rehashes to twice as many when size() would pass half).
  size_t capacity() const { return slots_.size(); }
  // Bytes of the table; growing it next would add as many again.
  size_t table_bytes() const { return slots_.size() * sizeof(Slot); }
  // Whether inserting one more new key would double the table.
  bool full() const { return 2 * (size_ + 1) > slots_.size(); }

  // Moves the entries to the front of the table, sorts them by key, calls f(key, value) for
  // each in ascending key order, then empties the map
  // keeping its capacity. No memory beyond the table is used.
  template <class F>
  void drain_sorted(F&& f) {
    size_t n = 0;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].key != kEmpty) slots_[n++] = slots_[i];
    std::sort(slots_.begin(), slots_.begin() + n,
              [](const Slot& a, const Slot& b) { return a.key < b.key; });
    for (size_t i = 0; i < n; ++i) f(slots_[i].key, slots_[i].value);
    if (has_marker_) f(kEmpty, marker_value_);  // the largest key, so it goes last
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
    has_marker_ = false;
  }

  void clear() {
    std::vector<Slot>(16).swap(slots_);
    mask_ = 15;
    size_ = 0;
    has_marker_ = false;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    V value{};
  };

  // Murmur3's finalizer: every key bit affects the slot (Criteo keys are hashes already, but
  // user keys may be small consecutive integers).
  size_t slot_of(uint64_t k) const { return static_cast<size_t>(hash(k)) & mask_; }

  void rehash(size_t cap) {
    std::vector<Slot> old(cap);
    old.swap(slots_);
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = slot_of(s.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_ = std::vector<Slot>(16);
  size_t mask_ = 15;
  size_t size_ = 0;  // keys in slots_
  bool has_marker_ = false;
  V marker_value_{};
};

}  // namespace dlrec::etl
