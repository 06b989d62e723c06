// Per model version counters behind the statistics extension (ModelStatistics) and the
// Prometheus endpoint. Lock-free to update; a registry keeps them across reloads so that the
// counts a client sees never go backwards.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dlrec/store/embedding_store.h"

namespace dlrec::serve {

struct Duration {
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> ns{0};
  void add(uint64_t n) {
    count.fetch_add(1, std::memory_order_relaxed);
    ns.fetch_add(n, std::memory_order_relaxed);
  }
};

// Successful requests by duration, as a Prometheus histogram (cumulative `le` buckets in
// microseconds): the server's own p50/p99 for a load, from two scrapes. One relaxed atomic
// increment per request.
struct LatencyHistogram {
  static constexpr uint32_t kBoundsUs[] = {10,   20,   30,   40,   50,    60,    80,    100,
                                           125,  150,  175,  200,  250,   300,   400,   500,
                                           750,  1000, 1500, 2000, 3000,  5000,  7500,  10000,
                                           20000, 50000, 100000, 250000, 1000000};
  static constexpr size_t kBuckets = sizeof(kBoundsUs) / sizeof(kBoundsUs[0]) + 1;  // + Inf
  std::atomic<uint64_t> counts[kBuckets] = {};  // per bucket (not cumulative)
  void add(uint64_t ns);
};

struct ModelStats {
  std::string name, version;
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  LatencyHistogram success_us;  // the durations of `success`
  std::atomic<uint64_t> inference_count{0};  // rows scored
  std::atomic<uint64_t> execution_count{0};  // merged executions
  std::atomic<uint64_t> last_inference_ms{0};
  // Executions by merged batch size (rows): count and compute nanoseconds.
  void add_execution(int64_t rows, uint64_t ns);
  std::vector<std::pair<int64_t, std::pair<uint64_t, uint64_t>>> batch_stats() const;
  // The tiered embedding store's per-tier counters of the version's instances (Prometheus
  // dlrec_embedding_store_*): set by the ServedModel that owns the stores, cleared by it before
  // they go (a reload's new model sets its own first, so clearing names the owner).
  using StoreTiers = std::vector<std::pair<std::string, const store::TierStats*>>;
  void set_store_tiers(const void* owner, StoreTiers tiers);
  void clear_store_tiers(const void* owner);
  // Calls fn with the tiers (under the lock that clear_store_tiers takes).
  template <class F>
  void with_store_tiers(F&& fn) const {
    std::lock_guard<std::mutex> lock(store_mu_);
    fn(store_tiers_);
  }
  // Per tier name: hits and misses summed over the instances (the model statistics' hit rate).
  std::map<std::string, std::pair<int64_t, int64_t>> store_hits_misses() const {
    std::map<std::string, std::pair<int64_t, int64_t>> out;
    with_store_tiers([&](const StoreTiers& ts) {
      for (const auto& [tier, st] : ts) {
        out[tier].first += st->hits.load();
        out[tier].second += st->misses.load();
      }
    });
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<int64_t, std::pair<uint64_t, uint64_t>> batches_;
  mutable std::mutex store_mu_;
  const void* store_owner_ = nullptr;
  StoreTiers store_tiers_;
};

class StatsRegistry {
 public:
  std::shared_ptr<ModelStats> get(const std::string& name, const std::string& version);
  // All entries, sorted by name then version; `name`/`version` filter when non-empty.
  std::vector<std::shared_ptr<ModelStats>> list(const std::string& name = "",
                                                const std::string& version = "") const;
  // Prometheus text exposition (Triton's metric names, labels model and version).
  std::string prometheus() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<ModelStats>> map_;
};

uint64_t now_ns();  // steady clock
uint64_t wall_ms();  // milliseconds since the epoch

}  // namespace dlrec::serve
