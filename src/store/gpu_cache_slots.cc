// The GPU cache tier's slot maps (SlotMap, include/dlrec/store/gpu_cache.h): ids -> cache
// slots with O(1) LFU/LRU eviction.
#include <algorithm>

#include "dlrec/core/error.h"
#include "dlrec/store/gpu_cache.h"

namespace dlrec::store {

namespace {
int64_t checked_slots(int64_t capacity) {
  DLREC_CHECK(capacity >= 1 && capacity < (int64_t{1} << 31), "gpu cache: ", capacity,
              " slots (1 .. 2^31 - 1 per feature)");
  return capacity;
}
}  // namespace

SlotMap::SlotMap(int64_t capacity, bool lfu, int64_t id_limit)
    : lfu_(lfu),
      where_(checked_slots(capacity),
             id_limit - 1 <= static_cast<int64_t>(FlatIdIndexT<uint32_t>::kMaxId)) {
  const auto c = static_cast<size_t>(capacity);
  slot_.assign(c, Slot{});
  clear();
}

void SlotMap::clear() {
  where_.clear();
  std::fill(slot_.begin(), slot_.end(), Slot{});
  free_slots_.clear();
  for (int64_t s = capacity() - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
  buckets_.clear();
  free_buckets_.clear();
  first_ = -1;
}

int32_t SlotMap::new_bucket(int64_t count, int32_t after) {
  int32_t b;
  if (!free_buckets_.empty()) {
    b = free_buckets_.back();
    free_buckets_.pop_back();
  } else {
    b = static_cast<int32_t>(buckets_.size());
    buckets_.push_back({});
  }
  Bucket& n = buckets_[b];
  n.count = count;
  n.head = n.tail = -1;
  n.prev = after;
  n.next = after < 0 ? first_ : buckets_[after].next;
  if (n.next >= 0) buckets_[n.next].prev = b;
  if (after < 0)
    first_ = b;
  else
    buckets_[after].next = b;
  return b;
}

void SlotMap::unlink(int32_t s) {
  const int32_t b = slot_[s].bucket;
  Bucket& k = buckets_[b];
  if (slot_[s].prev >= 0)
    slot_[slot_[s].prev].next = slot_[s].next;
  else
    k.head = slot_[s].next;
  if (slot_[s].next >= 0)
    slot_[slot_[s].next].prev = slot_[s].prev;
  else
    k.tail = slot_[s].prev;
  slot_[s].prev = slot_[s].next = slot_[s].bucket = -1;
  if (k.head < 0) {  // empty: out of the bucket list
    if (k.prev >= 0)
      buckets_[k.prev].next = k.next;
    else
      first_ = k.next;
    if (k.next >= 0) buckets_[k.next].prev = k.prev;
    free_buckets_.push_back(b);
  }
}

void SlotMap::push_back(int32_t s, int32_t b) {
  Bucket& k = buckets_[b];
  slot_[s].prev = k.tail;
  slot_[s].next = -1;
  if (k.tail >= 0)
    slot_[k.tail].next = s;
  else
    k.head = s;
  k.tail = s;
  slot_[s].bucket = b;
}

void SlotMap::relink(int32_t s) {
  const int32_t b = slot_[s].bucket;
  if (!lfu_) {  // one list: to its tail
    if (buckets_[b].tail != s) {
      unlink(s);  // never empties the bucket: s was not its only slot
      push_back(s, b);
    }
    return;
  }
  const int64_t count = buckets_[b].count + 1;
  int32_t nb = buckets_[b].next;
  if (nb < 0 || buckets_[nb].count != count) nb = new_bucket(count, b);
  unlink(s);  // may free b (nb is linked after it, so stays)
  push_back(s, nb);
}

int64_t SlotMap::insert(int64_t id, uint64_t stamp, int64_t* evicted, const uint64_t* in_use) {
  *evicted = -1;
  int32_t s = -1;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    // The least valuable slot the batch does not use: from the first bucket's head on.
    int scanned = 0;
    for (int32_t b = first_; b >= 0 && s < 0 && scanned < kMaxScan; b = buckets_[b].next)
      for (int32_t c = buckets_[b].head; c >= 0 && scanned < kMaxScan; c = slot_[c].next, ++scanned)
        if (slot_[c].stamp != stamp &&
            !(in_use && (in_use[static_cast<uint32_t>(c) >> 6] >> (c & 63) & 1))) {
          s = c;
          break;
        }
    if (s < 0) return -1;
    *evicted = slot_[s].id;
    where_.erase(slot_[s].id);
    unlink(s);
  }
  slot_[s].id = id;
  slot_[s].stamp = stamp;
  where_.insert(id, s);
  const int64_t count = 1;
  int32_t b = first_;
  if (b < 0 || buckets_[b].count != count) b = new_bucket(count, -1);
  push_back(s, b);
  return s;
}

bool SlotMap::erase(int64_t id) {
  const int32_t s = where_.find(id);
  if (s < 0) return false;
  where_.erase(id);
  unlink(s);
  slot_[s].id = -1;
  slot_[s].stamp = 0;
  free_slots_.push_back(s);
  return true;
}

}  // namespace dlrec::store
