// Categorical encoders: Categorify, HashBucket (docs/ETL.md).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/key_map.h"
#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

constexpr int64_t kMissingId = 0;
constexpr int64_t kOovId = 1;
constexpr int64_t kFirstVocabId = 2;

// The vocabulary's key -> id table for encode() when every key is below 2^32 - 1 (Criteo's
// 8-hex-digit keys) and the ids fit 32 bits: one 8-byte slot per entry (key << 32 | id; all
// ones marks an empty slot, which no such key matches), load factor at most 1/4. The same
// memory as KeyMap<int64_t>'s 16-byte slots at load 1/2, but half the cache lines per probe
// run and shorter runs: a key not in the vocabulary (a quarter of some Criteo columns' values)
// probes until an empty slot. Any key of 2^32 - 1 or more is not in such a vocabulary.
class NarrowLookup {
 public:
  bool usable() const { return !slots_.empty(); }

  // Builds the table from the vocabulary (key vocab[i] -> id first_id + i), or leaves it
  // unusable when a key or an id does not fit. The keys are distinct (checked by the caller).
  void build(const std::vector<uint64_t>& vocab) {
    slots_.clear();
    if (vocab.size() > (size_t{1} << 30)) return;
    for (uint64_t k : vocab)
      if (k >= kEmptyKey) return;
    size_t cap = 16;
    while (cap < 4 * vocab.size()) cap <<= 1;
    slots_.assign(cap, ~uint64_t{0});
    mask_ = cap - 1;
    for (size_t i = 0; i < vocab.size(); ++i) {
      size_t at = static_cast<size_t>(KeyMap<int64_t>::hash(vocab[i])) & mask_;
      while (slots_[at] != ~uint64_t{0}) at = (at + 1) & mask_;
      slots_[at] = vocab[i] << 32 | static_cast<uint64_t>(kFirstVocabId + static_cast<int64_t>(i));
    }
  }

  // ids[i] = the id of keys[i], or kOovId. Each key hashed once (a ring of the hashes of the
  // 16 keys ahead, used for the prefetch and then the probe).
  void encode(const uint64_t* keys, int64_t n, int64_t* ids) const {
    constexpr int64_t kAhead = 16;
    const uint64_t* slots = slots_.data();
    uint64_t ring[kAhead];
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) ring[i] = KeyMap<int64_t>::hash(keys[i]);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t h = ring[i % kAhead];
      if (i + kAhead < n) {
        const uint64_t ahead = KeyMap<int64_t>::hash(keys[i + kAhead]);
        ring[i % kAhead] = ahead;
        __builtin_prefetch(slots + (static_cast<size_t>(ahead) & mask_));
      }
      const uint64_t key = keys[i];
      int64_t id = kOovId;
      if (key < kEmptyKey) {
        for (size_t at = static_cast<size_t>(h) & mask_;; at = (at + 1) & mask_) {
          const uint64_t s = slots[at];
          if (s >> 32 == key) {
            id = static_cast<int64_t>(s & 0xFFFFFFFFu);
            break;
          }
          if (s == ~uint64_t{0}) break;
        }
      }
      ids[i] = id;
    }
  }

 private:
  static constexpr uint64_t kEmptyKey = 0xFFFFFFFFu;
  std::vector<uint64_t> slots_;
  size_t mask_ = 0;
};

// The fit's key -> count table while every key so far is below 2^32 - 1 (Criteo's 8-hex-digit
// keys) and every count below 2^32 - 1: one 8-byte slot per key (key << 32 | count; all ones
// marks an empty slot), load factor at most 1/2. Half the bytes of KeyMap<uint64_t>'s 16-byte
// slots: the count tables of Criteo's large columns (~100k keys per million rows, 4 MB wide)
// fit a 2 MB L2 cache. add() refuses a key or count that does not fit (the caller moves the
// counts to the wide table then and goes on there).
class NarrowCounts {
 public:
  size_t size() const { return size_; }
  void prefetch_hashed(uint64_t h) const { __builtin_prefetch(slots_.data() + (h & mask_)); }

  // Counts `key` (hash h) once; false (nothing counted) when it does not fit the table.
  bool add(uint64_t key, uint64_t h) {
    if (key >= kEmptyKey) return false;
    size_t at = static_cast<size_t>(h) & mask_;
    for (;; at = (at + 1) & mask_) {
      const uint64_t s = slots_[at];
      if (s >> 32 == key) {
        if ((s & 0xFFFFFFFFu) >= kMaxCount) return false;
        slots_[at] = s + 1;
        return true;
      }
      if (s == ~uint64_t{0}) break;
    }
    if (2 * (size_ + 1) > slots_.size()) {
      grow();
      at = static_cast<size_t>(h) & mask_;
      while (slots_[at] != ~uint64_t{0}) at = (at + 1) & mask_;
    }
    ++size_;
    slots_[at] = key << 32 | 1;
    return true;
  }
  // Calls f(key, count) for every key, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (uint64_t s : slots_)
      if (s != ~uint64_t{0}) f(s >> 32, s & 0xFFFFFFFFu);
  }
  void clear() {
    std::vector<uint64_t>(16, ~uint64_t{0}).swap(slots_);
    mask_ = 15;
    size_ = 0;
  }

 private:
  static constexpr uint64_t kEmptyKey = 0xFFFFFFFFu;
  static constexpr uint64_t kMaxCount = 0xFFFFFFFEu;
  void grow() {
    std::vector<uint64_t> old(slots_.size() * 2, ~uint64_t{0});
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (uint64_t s : old) {
      if (s == ~uint64_t{0}) continue;
      size_t at = static_cast<size_t>(KeyMap<uint64_t>::hash(s >> 32)) & mask_;
      while (slots_[at] != ~uint64_t{0}) at = (at + 1) & mask_;
      slots_[at] = s;
    }
  }
  std::vector<uint64_t> slots_ = std::vector<uint64_t>(16, ~uint64_t{0});
  size_t mask_ = 15;
  size_t size_ = 0;
};

// {"op": "Categorify", "freq_threshold": 15, "max_size": 100000}
// Vocabulary = the training keys seen at least freq_threshold times, the most frequent first
// (ties by ascending key), at most max_size of them (0 = no limit). Key vocab[i] gets id i + 2;
// any other key gets id 1 (out of vocabulary / rare); id 0 is a missing value.
// With num_buckets = B > 0, an out-of-vocabulary key gets id 2 + V + mix64(key) % B instead
// (V = vocabulary size); id 1 is then never produced, but stays reserved so that vocabulary
// ids do not depend on B. Cardinality = 2 + V + B.
class Categorify final : public CategoricalEncoder {
 public:
  Categorify(int64_t freq_threshold, int64_t max_size, int64_t num_buckets, bool joint)
      : joint_wanted_(joint),
        freq_threshold_(freq_threshold),
        max_size_(max_size),
        num_buckets_(num_buckets) {}

  bool joint() const override { return joint_wanted_; }
  void join_fit(CategoricalEncoder& first) override {
    auto* f = dynamic_cast<Categorify*>(&first);
    DLREC_CHECK(f && f->joint_wanted_, "Categorify: joint vocabulary with a different encoder");
    if (!f->joint_) f->joint_ = std::make_shared<Joint>();
    joint_ = f->joint_;
  }

  std::string name() const override { return "Categorify"; }
  bool needs_fit() const override { return true; }
  bool fitted() const override { return fitted_; }

  json to_json() const override {
    json j = {{"op", name()}, {"freq_threshold", freq_threshold_}};
    if (joint_wanted_) j["encode_type"] = "joint";
    if (max_size_ > 0) j["max_size"] = max_size_;
    if (num_buckets_ > 0) j["num_buckets"] = num_buckets_;
    if (fitted_) j["vocab"] = vocab_;
    return j;
  }
  json fit_summary() const override {
    json j = {{"distinct_values", distinct_},
              {"values", values_},
              {"vocab_size", static_cast<int64_t>(vocab_.size())},
              {"oov_values", oov_values_},
              {"cardinality", cardinality()}};
    if (!freq_ids_.empty())
      j["frequency"] = {{"ids", freq_ids_}, {"values_below", freq_below_}, {"values", values_}};
    return j;
  }

  ~Categorify() override { remove_runs(); }

  void set_fit_memory(std::shared_ptr<FitMemory> memory) override { memory_ = std::move(memory); }

  void fit_begin() override {
    counts_.clear();
    narrow_counts_.clear();
    counting_narrow_ = !memory_;
    remove_runs();
    fitted_ = false;
    if (joint_) {  // every column of the group resets it, before any chunk
      std::lock_guard<std::mutex> g(joint_->mu);
      joint_->counts.clear();
      joint_->finished = false;
    }
  }
  void fit_chunk(const uint64_t* keys, int64_t n) override {
    constexpr int64_t kAhead = 16;
    if (joint_) {  // the group's columns count into one table (in memory)
      std::lock_guard<std::mutex> g(joint_->mu);
      for (int64_t i = 0; i < n; ++i) ++joint_->counts[keys[i]];
      return;
    }
    // Each key is hashed once: the hashes of the next kAhead keys wait in a ring (the prefetch
    // and the count use the same one).
    uint64_t ring[kAhead];
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) ring[i] = KeyMap<uint64_t>::hash(keys[i]);
    int64_t i = 0;
    if (memory_) widen_counts();  // under a budget only counts_ (it spills)
    // The narrow table while every key and count fits it.
    if (counting_narrow_) {
      for (; i < n; ++i) {
        // Counted before the ring moves on: a key that the table refuses is counted by the
        // loop below, which reads its hash from the ring.
        if (!narrow_counts_.add(keys[i], ring[i % kAhead])) {
          widen_counts();
          break;
        }
        if (i + kAhead < n) {
          const uint64_t ahead = KeyMap<uint64_t>::hash(keys[i + kAhead]);
          ring[i % kAhead] = ahead;
          narrow_counts_.prefetch_hashed(ahead);
        }
      }
    }
    for (; i < n; ++i) {
      const uint64_t h = ring[i % kAhead];
      if (i + kAhead < n) {
        const uint64_t ahead = KeyMap<uint64_t>::hash(keys[i + kAhead]);
        ring[i % kAhead] = ahead;
        counts_.prefetch_hashed(ahead);
      }
      // Under a memory budget the table doubles only when the budget has room for it;
      // otherwise its keys go to disk as a sorted run (merged by fit_end).
      if (memory_ && counts_.full() && !counts_.find_hashed(keys[i], h)) {
        const int64_t grow = static_cast<int64_t>(counts_.table_bytes());
        if (memory_->take(grow))
          reserved_ += grow;
        else
          spill();
      }
      ++counts_.at_hashed(keys[i], h);
    }
  }
  void fit_end() override {
    if (joint_) {  // the first column to finish builds the group's vocabulary
      std::lock_guard<std::mutex> g(joint_->mu);
      if (!joint_->finished) {
        std::swap(counts_, joint_->counts);
        finish_counts();
        joint_->vocab = vocab_;
        joint_->distinct = distinct_;
        joint_->values = values_;
        joint_->oov_values = oov_values_;
        joint_->finished = true;
      } else {
        vocab_ = joint_->vocab;
        distinct_ = joint_->distinct;
        values_ = joint_->values;
        oov_values_ = joint_->oov_values;
      }
      build_lookup();
      return;
    }
    finish_counts();
    build_lookup();
  }

  // The vocabulary depends on the counts only (by count, ties by key), so counts of parts of
  // the rows add up to those of all of them: (key, count) pairs. Not for a joint vocabulary
  // (one table of the group) nor under a memory budget (spilled runs).
  bool partial_fit_mergeable() const override { return !joint_wanted_ && !memory_; }
  void save_partial_fit(std::string& out) const override {
    DLREC_CHECK(partial_fit_mergeable() && runs_.empty(), "Categorify: no partial fit to save");
    DLREC_CHECK(!counting_narrow_ || counts_.size() == 0, "Categorify: counts in two tables");
    auto append = [&out](const auto& table) {  // (key, count) pairs, 8 bytes each
      const size_t at = out.size();
      out.resize(at + table.size() * 16);
      char* p = out.data() + at;
      table.for_each([&](uint64_t key, uint64_t count) {
        std::memcpy(p, &key, 8);
        std::memcpy(p + 8, &count, 8);
        p += 16;
      });
    };
    append(narrow_counts_);
    append(counts_);
  }
  size_t partial_fit_bytes() const override {
    return 16 * (narrow_counts_.size() + counts_.size());
  }
  void add_partial_fit(const char* data, size_t size) override {
    DLREC_CHECK(partial_fit_mergeable(), "Categorify: no partial fit to add to");
    DLREC_CHECK(size % 16 == 0, "Categorify: a partial fit of ", size,
                " bytes is not (key, count) pairs");
    widen_counts();
    counts_.reserve(std::max(counts_.size(), size / 16));  // at least the larger of the two
    for (size_t i = 0; i < size; i += 16) {
      uint64_t key, count;
      std::memcpy(&key, data + i, 8);
      std::memcpy(&count, data + i + 8, 8);
      counts_[key] += count;
    }
  }

  // Moves the narrow table's counts into counts_ (a key or count that it cannot hold came, or
  // another part's counts are added) and counts there from then on.
  void widen_counts() {
    if (!counting_narrow_) return;
    counts_.reserve(counts_.size() + narrow_counts_.size());
    narrow_counts_.for_each([&](uint64_t key, uint64_t count) { counts_[key] += count; });
    narrow_counts_ = NarrowCounts();
    counting_narrow_ = false;
  }

  // Turns the counts (in counts_, narrow_counts_ or spilled) into vocab_ and the statistics.
  void finish_counts() {
    std::vector<std::pair<uint64_t, uint64_t>> kept;  // (count, key)
    const uint64_t threshold = static_cast<uint64_t>(std::max<int64_t>(1, freq_threshold_));
    distinct_ = 0;
    values_ = 0;
    auto add = [&](uint64_t key, uint64_t count) {
      ++distinct_;
      values_ += static_cast<int64_t>(count);
      if (count >= threshold) kept.emplace_back(count, key);
    };
    if (runs_.empty()) {
      narrow_counts_.for_each(add);  // kept in (count, key) order below: no order matters
      counts_.for_each(add);
    } else {
      if (counts_.size() > 0) spill();
      merge_runs(add);
    }
    auto order = [](const std::pair<uint64_t, uint64_t>& a, const std::pair<uint64_t, uint64_t>& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    if (max_size_ > 0 && static_cast<int64_t>(kept.size()) > max_size_) {
      std::nth_element(kept.begin(), kept.begin() + max_size_, kept.end(), order);
      kept.resize(max_size_);
    }
    std::sort(kept.begin(), kept.end(), order);
    int64_t in_vocab = 0;
    vocab_.resize(kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      vocab_[i] = kept[i].second;
      in_vocab += static_cast<int64_t>(kept[i].first);
    }
    oov_values_ = values_ - in_vocab;
    summarize_frequency(kept);
    counts_ = KeyMap<uint64_t>();  // frees the counts
    narrow_counts_ = NarrowCounts();
    counting_narrow_ = false;
    if (memory_) memory_->give_back(reserved_);
    reserved_ = 0;
  }

  // The vocabulary is numbered by descending count, so the frequent ids are a prefix: for the
  // planner's hybrid embedding (docs/DISTRIBUTED.md), the values (ids >= 1; missing values,
  // id 0, are the column's "nulls") with an id below each bound of 1, 2, 3, 4, 6, 8, 12, ...
  // (about 2 log2(cardinality) bounds) up to the cardinality. With num_buckets the
  // out-of-vocabulary values spread over the buckets (above the vocabulary), else they are id 1.
  // Not for a joint vocabulary (its counts are the group's, not the column's).
  void summarize_frequency(const std::vector<std::pair<uint64_t, uint64_t>>& kept) {
    freq_ids_.clear();
    freq_below_.clear();
    if (joint_wanted_) return;
    const int64_t vocab_end = kFirstVocabId + static_cast<int64_t>(kept.size());
    std::vector<int64_t> bounds;
    for (int64_t b = 1; b < vocab_end; b *= 2) {
      bounds.push_back(b);
      if (b >= 2 && b + b / 2 < vocab_end) bounds.push_back(b + b / 2);
    }
    bounds.push_back(vocab_end);
    if (cardinality() > vocab_end) bounds.push_back(cardinality());
    int64_t below = 0, next_id = 0;  // values with an id below next_id
    for (int64_t b : bounds) {
      for (; next_id < b; ++next_id) {
        if (next_id == kOovId && num_buckets_ == 0) below += oov_values_;
        if (next_id >= kFirstVocabId && next_id < vocab_end)
          below += static_cast<int64_t>(kept[next_id - kFirstVocabId].first);
      }
      if (b > vocab_end) below = values_;  // the buckets hold the rest
      freq_ids_.push_back(b);
      freq_below_.push_back(below);
    }
  }

  void set_vocab(std::vector<uint64_t> vocab) {
    vocab_ = std::move(vocab);
    build_lookup();
  }

  int64_t cardinality() const override {
    return kFirstVocabId + static_cast<int64_t>(vocab_.size()) + num_buckets_;
  }

  void encode(const uint64_t* keys, int64_t n, int64_t* ids) const override {
    if (narrow_.usable()) {
      narrow_.encode(keys, n, ids);
    } else {
      constexpr int64_t kAhead = 16;
      uint64_t ring[kAhead];  // as in fit_chunk: each key hashed once
      for (int64_t i = 0; i < std::min(n, kAhead); ++i) ring[i] = KeyMap<int64_t>::hash(keys[i]);
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t h = ring[i % kAhead];
        if (i + kAhead < n) {
          const uint64_t ahead = KeyMap<int64_t>::hash(keys[i + kAhead]);
          ring[i % kAhead] = ahead;
          lookup_.prefetch_hashed(ahead);
        }
        const int64_t* id = lookup_.find_hashed(keys[i], h);
        ids[i] = id ? *id : kOovId;
      }
    }
    if (num_buckets_ > 0) {
      const int64_t first = kFirstVocabId + static_cast<int64_t>(vocab_.size());
      const uint64_t b = static_cast<uint64_t>(num_buckets_);
      for (int64_t i = 0; i < n; ++i)
        if (ids[i] == kOovId) ids[i] = first + static_cast<int64_t>(mix64(keys[i]) % b);
    }
  }

 private:
  void build_lookup() {
    lookup_ = KeyMap<int64_t>(vocab_.size());
    for (size_t i = 0; i < vocab_.size(); ++i) {
      int64_t& id = lookup_[vocab_[i]];
      if (id != 0) fail("Categorify: vocabulary holds key ", vocab_[i], " twice");
      id = kFirstVocabId + static_cast<int64_t>(i);
    }
    narrow_.build(vocab_);
    if (narrow_.usable()) lookup_ = KeyMap<int64_t>();  // encode() uses the narrow table
    fitted_ = true;
  }

  // A new run file's path, listed in runs_ (so that remove_runs() removes it whatever happens).
  std::string new_run_path() {
    const std::string path = memory_->spill_dir + "/.dlrec-spill-" + std::to_string(::getpid()) +
                             "-" + std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                             std::to_string(next_run_++) + ".tmp";
    runs_.push_back(path);
    return path;
  }

  // Writes the (key, count) pairs that `produce(put)` gives (ascending keys) as a run file at
  // `path`; returns the pairs written.
  template <class P>
  int64_t write_run(const std::string& path, P&& produce) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("Categorify: cannot create spill file '", path, "': ", std::strerror(errno));
    std::vector<uint64_t> buf;
    buf.reserve(kSpillBuffer);
    bool ok = true;
    int err = 0;
    int64_t pairs = 0;
    auto put = [&](uint64_t key, uint64_t count) {
      ++pairs;
      buf.push_back(key);
      buf.push_back(count);
      if (buf.size() >= kSpillBuffer) {
        if (ok && std::fwrite(buf.data(), 8, buf.size(), f) != buf.size()) {
          ok = false;
          err = errno;
        }
        buf.clear();
      }
    };
    try {
      produce(put);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    if (ok && std::fwrite(buf.data(), 8, buf.size(), f) != buf.size()) {
      ok = false;
      err = errno;
    }
    if (std::fclose(f) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (!ok) fail("Categorify: writing spill file '", path, "' failed: ", std::strerror(err));
    return pairs;
  }

  // Writes the table's (key, count) pairs, ascending keys, as a run file; empties the table.
  void spill() {
    const int64_t pairs =
        write_run(new_run_path(), [&](auto& put) { counts_.drain_sorted(put); });
    memory_->spilled_runs += 1;
    memory_->spilled_bytes += pairs * 16;
  }

  // Run files one merge may hold open: the descriptors the process may open (RLIMIT_NOFILE,
  // less 64 for everything else) shared by the columns merging at the same time (one per
  // thread), 8 to 4096.
  static size_t merge_fan_in() {
    rlimit rl{};
    size_t limit = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0)
      limit = rl.rlim_cur == RLIM_INFINITY ? size_t{1} << 20 : static_cast<size_t>(rl.rlim_cur);
    const size_t per_thread =
        limit > 64 ? (limit - 64) / static_cast<size_t>(std::max(1, num_threads())) : 0;
    return std::clamp<size_t>(per_thread > 0 ? per_thread - 1 : 0, 8, 4096);  // - the output
  }

  // Merges the runs by key, summing counts: add(key, total) once per distinct key. At most
  // merge_fan_in() runs are open at once: more are first merged in groups into fewer, larger
  // runs (a tiny budget makes thousands of runs, and the columns merge at the same time; all
  // of them open at once ran out of file descriptors: "Too many open files").
  template <class F>
  void merge_runs(F&& add) {
    const size_t fan_in = merge_fan_in();
    while (runs_.size() > fan_in) {
      const std::vector<std::string> level = runs_;
      for (size_t g = 0; g < level.size(); g += fan_in) {
        const std::vector<std::string> group(
            level.begin() + g, level.begin() + std::min(level.size(), g + fan_in));
        if (group.size() == 1) continue;  // stays as it is
        write_run(new_run_path(), [&](auto& put) { merge_files(group, put); });
        for (const auto& p : group) {
          std::remove(p.c_str());
          runs_.erase(std::find(runs_.begin(), runs_.end(), p));
        }
      }
    }
    merge_files(runs_, add);
    remove_runs();
  }

  // The k-way merge of the run files `paths`: add(key, total) once per distinct key, ascending.
  template <class F>
  static void merge_files(const std::vector<std::string>& paths, F&& add) {
    struct Run {
      FILE* f = nullptr;
      std::vector<uint64_t> buf;
      size_t pos = 0, len = 0;
      uint64_t key = 0, count = 0;
      std::string path;
      bool next() {
        if (pos == len) {
          len = std::fread(buf.data(), 8, buf.size(), f);
          if (std::ferror(f)) fail("Categorify: reading spill file '", path, "' failed");
          if (len % 2) fail("Categorify: spill file '", path, "' is truncated");
          pos = 0;
          if (len == 0) return false;
        }
        key = buf[pos];
        count = buf[pos + 1];
        pos += 2;
        return true;
      }
    };
    std::vector<Run> runs(paths.size());
    struct Closer {
      std::vector<Run>& r;
      ~Closer() {
        for (auto& x : r)
          if (x.f) std::fclose(x.f);
      }
    } closer{runs};
    // Read buffers share about 8 MB: 512 KB each at most, less with many runs.
    const size_t per_run =  // (key, count) pairs
        std::max<size_t>(512, std::min<size_t>(size_t{1} << 15, (size_t{8} << 20) / 16 / runs.size()));
    using Head = std::pair<uint64_t, size_t>;  // (key, run)
    std::vector<Head> heap;
    auto cmp = [](const Head& a, const Head& b) { return a.first > b.first; };
    for (size_t i = 0; i < runs.size(); ++i) {
      Run& r = runs[i];
      r.path = paths[i];
      r.f = std::fopen(r.path.c_str(), "rb");
      if (!r.f) fail("Categorify: cannot open spill file '", r.path, "': ", std::strerror(errno));
      r.buf.resize(per_run * 2);
      if (r.next()) heap.emplace_back(r.key, i);
    }
    std::make_heap(heap.begin(), heap.end(), cmp);
    bool have = false;
    uint64_t key = 0, total = 0;
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      const size_t i = heap.back().second;
      heap.pop_back();
      Run& r = runs[i];
      if (have && r.key == key) {
        total += r.count;
      } else {
        if (have) add(key, total);
        have = true;
        key = r.key;
        total = r.count;
      }
      if (r.next()) {
        heap.emplace_back(r.key, i);
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
    if (have) add(key, total);
  }

  void remove_runs() {
    for (const auto& p : runs_) std::remove(p.c_str());
    runs_.clear();
  }

  static constexpr size_t kSpillBuffer = size_t{1} << 16;  // u64 words per write


  // The shared state of a joint group (one vocabulary for several columns).
  struct Joint {
    std::mutex mu;
    KeyMap<uint64_t> counts;
    bool finished = false;
    std::vector<uint64_t> vocab;
    int64_t distinct = 0, values = 0, oov_values = 0;
  };
  bool joint_wanted_;
  std::shared_ptr<Joint> joint_;  // set by join_fit on every column of the group

  std::shared_ptr<FitMemory> memory_;  // null: no budget, everything in memory
  int64_t reserved_ = 0;               // bytes of memory_ taken by counts_
  std::vector<std::string> runs_;      // spill files of this fit
  int64_t next_run_ = 0;               // numbers the run files

  int64_t freq_threshold_, max_size_, num_buckets_;
  std::vector<uint64_t> vocab_;  // keys in id order (id = index + 2)
  KeyMap<int64_t> lookup_;  // key -> id, when narrow_ cannot hold the vocabulary
  NarrowLookup narrow_;
  KeyMap<uint64_t> counts_;  // during fit only
  // During fit without a memory budget, the counts while every key and count fits 32 bits;
  // counts_ holds them once one does not (widen_counts).
  NarrowCounts narrow_counts_;
  bool counting_narrow_ = false;
  int64_t distinct_ = 0, values_ = 0, oov_values_ = 0;
  std::vector<int64_t> freq_ids_, freq_below_;  // summarize_frequency's, after a fit
  bool fitted_ = false;
};

// {"op": "HashBucket", "num_buckets": 1000}: id = 1 + mix64(key) % num_buckets, no fit.
// Cardinality = num_buckets + 1 (id 0 = missing).
class HashBucket final : public CategoricalEncoder {
 public:
  explicit HashBucket(int64_t num_buckets) : num_buckets_(num_buckets) {}
  std::string name() const override { return "HashBucket"; }
  json to_json() const override { return {{"op", name()}, {"num_buckets", num_buckets_}}; }
  int64_t cardinality() const override { return num_buckets_ + 1; }
  void encode(const uint64_t* keys, int64_t n, int64_t* ids) const override {
    const uint64_t b = static_cast<uint64_t>(num_buckets_);
    for (int64_t i = 0; i < n; ++i) ids[i] = 1 + static_cast<int64_t>(mix64(keys[i]) % b);
  }

 private:
  int64_t num_buckets_;
};

static_assert(kMissingId == 0, "id 0 is the missing value for every encoder");

}  // namespace

void register_categorical_ops(OpRegistry& reg) {
  reg.add("Categorify", ColumnType::Categorical,
          [](ConfigReader& r, bool fitted) -> std::unique_ptr<Op> {
            const int64_t big = std::numeric_limits<int64_t>::max() / 4;
            int64_t threshold = r.get_int_range("freq_threshold", 0, 0, big);
            int64_t max_size = r.get_int_range("max_size", 0, 0, big);
            int64_t num_buckets = r.get_int_range("num_buckets", 0, 0, big);
            const std::string encode = r.get<std::string>("encode_type", "column");
            if (encode != "column" && encode != "joint") {
              std::string near = nearest_name(encode, {"column", "joint"});
              fail("'", r.key_path("encode_type"), "' must be \"column\" or \"joint\", got '",
                   encode, "'", near.empty() ? "" : " (did you mean '" + near + "'?)");
            }
            auto op = std::make_unique<Categorify>(threshold, max_size, num_buckets,
                                                   encode == "joint");
            if (fitted) {
              const json& v = r.raw("vocab");
              if (!v.is_array()) fail("'", r.key_path("vocab"), "' must be an array of keys");
              std::vector<uint64_t> vocab;
              vocab.reserve(v.size());
              for (const auto& k : v) {
                if (!k.is_number_unsigned() && !(k.is_number_integer() && k.get<int64_t>() >= 0))
                  fail("'", r.key_path("vocab"), "' holds ", k.dump(),
                       ", expected a non-negative integer key");
                vocab.push_back(k.get<uint64_t>());
              }
              op->set_vocab(std::move(vocab));
            }
            return op;
          });
  reg.add("HashBucket", ColumnType::Categorical, [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    if (!r.has("num_buckets")) fail("config key '", r.key_path("num_buckets"), "' is required");
    return std::make_unique<HashBucket>(
        r.get_int_range("num_buckets", 1, 1, std::numeric_limits<int64_t>::max() / 4));
  });
}

}  // namespace dlrec::etl
