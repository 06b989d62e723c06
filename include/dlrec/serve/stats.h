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

namespace dlrec::serve {

struct Duration {
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> ns{0};
  void add(uint64_t n) {
    count.fetch_add(1, std::memory_order_relaxed);
    ns.fetch_add(n, std::memory_order_relaxed);
  }
};

struct ModelStats {
  std::string name, version;
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::atomic<uint64_t> inference_count{0};  // rows scored
  std::atomic<uint64_t> execution_count{0};  // merged executions
  std::atomic<uint64_t> last_inference_ms{0};
  // Executions by merged batch size (rows): count and compute nanoseconds.
  void add_execution(int64_t rows, uint64_t ns);
  std::vector<std::pair<int64_t, std::pair<uint64_t, uint64_t>>> batch_stats() const;

 private:
  mutable std::mutex mu_;
  std::map<int64_t, std::pair<uint64_t, uint64_t>> batches_;
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
