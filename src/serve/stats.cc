#include "dlrec/serve/stats.h"

#include <algorithm>
#include <chrono>
#include <sstream>

namespace dlrec::serve {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

uint64_t wall_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

void LatencyHistogram::add(uint64_t ns) {
  const uint64_t us = (ns + 999) / 1000;  // a bucket holds durations <= its bound
  const uint32_t* end = kBoundsUs + (kBuckets - 1);
  const size_t b = static_cast<size_t>(std::lower_bound(kBoundsUs, end, us) - kBoundsUs);
  counts[b].fetch_add(1, std::memory_order_relaxed);
}

void ModelStats::add_execution(int64_t rows, uint64_t ns) {
  execution_count.fetch_add(1, std::memory_order_relaxed);
  inference_count.fetch_add(static_cast<uint64_t>(rows), std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(mu_);
  auto& b = batches_[rows];
  b.first += 1;
  b.second += ns;
}

std::vector<std::pair<int64_t, std::pair<uint64_t, uint64_t>>> ModelStats::batch_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {batches_.begin(), batches_.end()};
}

std::shared_ptr<ModelStats> StatsRegistry::get(const std::string& name,
                                               const std::string& version) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& p = map_[{name, version}];
  if (!p) {
    p = std::make_shared<ModelStats>();
    p->name = name;
    p->version = version;
  }
  return p;
}

std::vector<std::shared_ptr<ModelStats>> StatsRegistry::list(const std::string& name,
                                                             const std::string& version) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<ModelStats>> out;
  for (auto& [k, v] : map_)
    if ((name.empty() || k.first == name) && (version.empty() || k.second == version))
      out.push_back(v);
  return out;
}

namespace {

std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o.push_back('\\');
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o.push_back(c);
  }
  return o;
}

}  // namespace

void ModelStats::set_store_tiers(const void* owner, StoreTiers tiers) {
  std::lock_guard<std::mutex> lock(store_mu_);
  store_owner_ = owner;
  store_tiers_ = std::move(tiers);
}

void ModelStats::clear_store_tiers(const void* owner) {
  std::lock_guard<std::mutex> lock(store_mu_);
  if (store_owner_ != owner) return;
  store_owner_ = nullptr;
  store_tiers_.clear();
}

namespace {
// dlrec_embedding_store_*{model, version, tier}: each tier's counters summed over the instances.
void store_metrics(std::ostringstream& os, const std::vector<std::shared_ptr<ModelStats>>& all) {
  enum class Over { Sum, Min, Max };  // how the instances' values combine
  struct Family {
    const char *name, *type, *help;
    int64_t (*value)(const store::TierStats&);
    bool updates_only = false;  // the update tier's (online updates) families
    Over over = Over::Sum;
  };
  static const Family families[] = {
      {"dlrec_embedding_store_hits", "counter", "Rows found in the tier",
       [](const store::TierStats& t) { return t.hits.load(); }},
      {"dlrec_embedding_store_misses", "counter", "Rows asked of the tier and not found there",
       [](const store::TierStats& t) { return t.misses.load(); }},
      {"dlrec_embedding_store_evictions", "counter", "Rows the tier dropped to stay in its bound",
       [](const store::TierStats& t) { return t.evictions.load(); }},
      {"dlrec_embedding_store_bytes", "gauge", "Bytes the tier holds in this process",
       [](const store::TierStats& t) { return t.bytes.load(); }},
      {"dlrec_embedding_store_lookups", "counter", "Batched lookups the tier answered",
       [](const store::TierStats& t) { return t.lookups.load(); }},
      {"dlrec_embedding_store_lookup_duration_us", "counter",
       "Cumulative duration of the tier's lookups in microseconds",
       [](const store::TierStats& t) { return t.lookup_ns.load() / 1000; }},
      {"dlrec_embedding_store_bad_values", "counter",
       "Values the tier held that were not a row of their table (read as misses, overwritten)",
       [](const store::TierStats& t) { return t.bad_values.load(); }},
      {"dlrec_embedding_store_failures", "counter",
       "Lookups and fills the tier failed (Redis down); their rows were read from the tiers below",
       [](const store::TierStats& t) { return t.failures.load(); }},
      {"dlrec_embedding_store_failing", "gauge",
       "1 while the tier's last request failed (summed over the instances)",
       [](const store::TierStats& t) { return t.failing.load(); }},
      {"dlrec_embedding_store_update_version", "gauge",
       "The online-update version every instance serves (the least of theirs; 1: the export)",
       [](const store::TierStats& t) { return t.update_version.load(); }, true, Over::Min},
      {"dlrec_embedding_store_update_rows", "counter", "Rows applied by online updates",
       [](const store::TierStats& t) { return t.update_rows.load(); }, true},
      {"dlrec_embedding_store_updates_applied", "counter", "Online-update versions applied",
       [](const store::TierStats& t) { return t.updates_applied.load(); }, true},
      {"dlrec_embedding_store_updates_rejected", "counter",
       "Online-update versions rejected (bad entries, gaps; the error is logged)",
       [](const store::TierStats& t) { return t.updates_rejected.load(); }, true},
      {"dlrec_embedding_store_update_lag_ms", "gauge",
       "Milliseconds from the last applied version's push to its application (the most of the "
       "instances')",
       [](const store::TierStats& t) { return t.update_lag_ms.load(); }, true, Over::Max},
  };
  for (const Family& f : families) {
    bool header = false;
    for (auto& s : all)
      s->with_store_tiers([&](const ModelStats::StoreTiers& tiers) {
        std::map<std::string, int64_t> sum;  // per tier name, over the instances
        for (const auto& [tier, st] : tiers) {
          if (f.updates_only && tier != "updates") continue;
          const int64_t v = f.value(*st);
          auto ins = sum.emplace(tier, v);
          if (ins.second) continue;
          int64_t& have = ins.first->second;
          have = f.over == Over::Sum   ? have + v
                 : f.over == Over::Min ? std::min(have, v)
                                       : std::max(have, v);
        }
        for (const auto& [tier, v] : sum) {
          if (!header) {
            os << "# HELP " << f.name << ' ' << f.help << "\n# TYPE " << f.name << ' ' << f.type
               << '\n';
            header = true;
          }
          os << f.name << "{model=\"" << escape_label(s->name) << "\",version=\""
             << escape_label(s->version) << "\",tier=\"" << tier << "\"} " << v << '\n';
        }
      });
  }
}
}  // namespace

std::string StatsRegistry::prometheus() const {
  auto all = list();
  std::ostringstream os;
  auto family = [&](const char* name, const char* help, auto value) {
    os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n";
    for (auto& s : all)
      os << name << "{model=\"" << escape_label(s->name) << "\",version=\""
         << escape_label(s->version) << "\"} " << value(*s) << '\n';
  };
  auto us = [](const Duration& d) { return d.ns.load() / 1000; };
  family("nv_inference_request_success", "Number of successful inference requests",
         [](const ModelStats& s) { return s.success.count.load(); });
  family("nv_inference_request_failure", "Number of failed inference requests",
         [](const ModelStats& s) { return s.fail.count.load(); });
  family("nv_inference_count", "Number of inferences performed (rows scored)",
         [](const ModelStats& s) { return s.inference_count.load(); });
  family("nv_inference_exec_count", "Number of model executions performed (merged batches)",
         [](const ModelStats& s) { return s.execution_count.load(); });
  family("nv_inference_request_duration_us",
         "Cumulative inference request duration in microseconds (successful requests)",
         [&](const ModelStats& s) { return us(s.success); });
  family("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
         [&](const ModelStats& s) { return us(s.queue); });
  family("nv_inference_compute_input_duration_us",
         "Cumulative compute input duration in microseconds (decoding, ETL workflow)",
         [&](const ModelStats& s) { return us(s.compute_input); });
  family("nv_inference_compute_infer_duration_us",
         "Cumulative compute inference duration in microseconds (per request)",
         [&](const ModelStats& s) { return us(s.compute_infer); });
  family("nv_inference_compute_output_duration_us",
         "Cumulative inference compute output duration in microseconds",
         [&](const ModelStats& s) { return us(s.compute_output); });
  const char* h = "dlrec_inference_request_duration_us";
  os << "# HELP " << h
     << " Successful inference requests by duration in microseconds (from the request's "
        "decoding to its scored output; the RPC layer not included)\n# TYPE "
     << h << " histogram\n";
  for (auto& s : all) {
    const std::string labels =
        "model=\"" + escape_label(s->name) + "\",version=\"" + escape_label(s->version) + "\"";
    uint64_t cum = 0;
    for (size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
      cum += s->success_us.counts[b].load(std::memory_order_relaxed);
      os << h << "_bucket{" << labels << ",le=\"";
      if (b + 1 < LatencyHistogram::kBuckets) os << LatencyHistogram::kBoundsUs[b];
      else os << "+Inf";
      os << "\"} " << cum << '\n';
    }
    os << h << "_sum{" << labels << "} " << us(s->success) << '\n';
    os << h << "_count{" << labels << "} " << cum << '\n';
  }
  store_metrics(os, all);
  return os.str();
}

}  // namespace dlrec::serve
