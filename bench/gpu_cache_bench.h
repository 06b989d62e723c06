// What the GPU cache benches share (bench/serve_gpu_cache.cc on a GPU, bench/gpu_cache_host.cc
// on the host alone): a complete tier generating each row from (table, id), power-law ids and
// their batches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dlrec/core/thread_pool.h"
#include "dlrec/io/batch.h"
#include "dlrec/store/embedding_store.h"
#include "dlrec/store/gpu_cache.h"

namespace dlrec::bench {

// Row value of (table, id, k): a hash to [-0.05, 0.05), exact in f32.
inline float gen_value(int t, int64_t id, int64_t k) {
  uint64_t x = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(t) << 48) ^ static_cast<uint64_t>(k) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (static_cast<float>(x >> 40) / 16777216.0f - 0.5f) * 0.1f;
}

// The complete tier: every row, generated on demand (stands for a host tier holding them).
class GeneratedTier final : public store::Tier {
 public:
  explicit GeneratedTier(std::vector<store::TableInfo> t) : tables_(std::move(t)) {}
  std::string name() const override { return "generated"; }
  bool complete() const override { return true; }
  int64_t memory_bound() const override { return 0; }
  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < dim; ++k) out[i * dim + k] = gen_value(table, ids[i], k);
      found[i] = 1;
    }
  }

 private:
  std::vector<store::TableInfo> tables_;
};

// Rows r0..r0+n-1 of table t (dim D) into out [n, D], generated on every host thread.
inline void generate_rows(int t, int64_t r0, int64_t n, int64_t D, float* out) {
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t k = 0; k < D; ++k) out[r * D + k] = gen_value(t, r0 + r, k);
  });
}

// The complete tier with every row held in host memory (--tier held): filled from the
// generator at start (the same values), a lookup copies the rows. What a host holding the
// tables does; needs rows x dim x 4 bytes of RAM per table.
class HeldTier final : public store::Tier {
 public:
  explicit HeldTier(std::vector<store::TableInfo> t) : tables_(std::move(t)) {
    for (size_t i = 0; i < tables_.size(); ++i) {
      const store::TableInfo& ti = tables_[i];
      rows_.emplace_back(new float[static_cast<size_t>(ti.rows * ti.dim)]);  // not zeroed
      generate_rows(static_cast<int>(i), 0, ti.rows, ti.dim, rows_.back().get());
      bytes_ += ti.rows * ti.dim * 4;
    }
  }
  std::string name() const override { return "held"; }
  bool complete() const override { return true; }
  int64_t memory_bound() const override { return bytes_; }
  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    const float* base = rows_[static_cast<size_t>(table)].get();
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out + i * dim, base + ids[i] * dim, sizeof(float) * dim);
      found[i] = 1;
    }
  }

 private:
  std::vector<store::TableInfo> tables_;
  std::vector<std::unique_ptr<float[]>> rows_;
  int64_t bytes_ = 0;
};

// Writes the generated rows of `tables` into a RocksDB store at `path` (serve_gpu_cache
// --rocksdb: the persistent tier measured under the GPU cache). Holds every table in host
// memory while it writes (rows x dim x 4 bytes of each).
inline void write_generated_store(const std::string& path,
                                  const std::vector<store::TableInfo>& tables) {
  std::vector<std::vector<float>> data(tables.size());
  std::vector<store::TableRows> rows;
  for (size_t t = 0; t < tables.size(); ++t) {
    data[t].resize(static_cast<size_t>(tables[t].rows * tables[t].dim));
    generate_rows(static_cast<int>(t), 0, tables[t].rows, tables[t].dim, data[t].data());
    rows.push_back({tables[t], data[t].data()});
  }
  store::write_rocksdb_store(path, rows, /*overwrite=*/false);
}

inline double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

inline std::vector<double> split_d(const std::string& s) {
  std::vector<double> v;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(std::stod(s.substr(p, q - p)));
    p = q + 1;
  }
  return v;
}

// Power-law sampler over ranks 0..R-1 (the inverse CDF, binary search). A guide table of
// kGuide entries (the first rank whose CDF reaches j / kGuide) narrows each search to the ranks
// of one 1 / kGuide of probability: the same rank as a search of the whole CDF, without its ~27
// steps through hundreds of MB for tables of 10^8 rows.
struct PowerLaw {
  static constexpr int64_t kGuide = int64_t{1} << 20;
  std::vector<double> cdf;
  std::vector<int64_t> guide;
  PowerLaw(int64_t R, double alpha) : cdf(static_cast<size_t>(R)), guide(kGuide + 1) {
    double s = 0;
    for (int64_t k = 0; k < R; ++k) cdf[k] = (s += std::pow(static_cast<double>(k + 1), -alpha));
    for (double& c : cdf) c /= s;
    int64_t k = 0;
    for (int64_t j = 0; j <= kGuide; ++j) {
      const double u = static_cast<double>(j) / static_cast<double>(kGuide);
      while (k < R - 1 && cdf[k] < u) ++k;
      guide[j] = k;
    }
  }
  int64_t operator()(std::mt19937_64& rng) const {
    const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
    const int64_t j = static_cast<int64_t>(u * static_cast<double>(kGuide));
    // The rank is in [guide[j], guide[j + 1]]: cdf[guide[j] - 1] < j / kGuide <= u, and
    // cdf[guide[j + 1]] >= (j + 1) / kGuide > u (or it is the last rank).
    const auto lo = cdf.begin() + guide[j], hi = cdf.begin() + guide[j + 1] + 1;
    return std::min<int64_t>(std::lower_bound(lo, hi, u) - cdf.begin(),
                             static_cast<int64_t>(cdf.size()) - 1);
  }
};

inline io::Batch make_batch(const PowerLaw& pl, int T, int64_t B, std::mt19937_64& rng) {
  io::Batch b;
  b.rows = B;
  b.num_dense = 13;
  b.labels.assign(B, 0.f);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < B * 13; ++i) b.dense.push_back(nd(rng));
  b.cat_indices.resize(T);
  b.cat_offsets.resize(T);
  for (int t = 0; t < T; ++t) {
    b.cat_indices[t].resize(B);
    b.cat_offsets[t].resize(B + 1);
    for (int64_t r = 0; r < B; ++r) b.cat_indices[t][r] = pl(rng);
    for (int64_t r = 0; r <= B; ++r) b.cat_offsets[t][r] = r;
  }
  b.one_id_per_row = true;
  return b;
}

// The cache's counters at one time; the difference of two describes the batches between.
struct CacheCounters {
  int64_t hits, misses, id_hits, id_lookups, sync, async, batches, wait, remap, fetch, write,
      forward, relink;
  static CacheCounters of(const store::GpuCache& c) {
    return {c.stats.hits,     c.stats.misses,   c.id_hits,        c.id_lookups,
            c.sync_batches,   c.async_batches,  c.times.batches,  c.times.wait_ns,
            c.times.remap_ns, c.times.fetch_ns, c.times.write_ns, c.times.forward_ns,
            c.times.relink_ns};
  }
  // "hit_rate=... per_id_hit_rate=... (sync/async) phases_us=wait/remap/fetch/write/forward/
  // relink"
  std::string since(const CacheCounters& o) const {
    const double h = static_cast<double>(hits - o.hits), m = static_cast<double>(misses - o.misses);
    const double ih = static_cast<double>(id_hits - o.id_hits);
    const double il = static_cast<double>(id_lookups - o.id_lookups);
    const double n = std::max<double>(1, static_cast<double>(batches - o.batches));
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "hit_rate=%.4f (distinct ids of a batch) per_id_hit_rate=%.4f (every id looked "
                  "up) sync/async batches %lld/%lld | mean us per batch: wait %.1f remap %.1f "
                  "fetch %.1f write %.1f forward %.1f relink %.1f",
                  h / std::max(1.0, h + m), ih / std::max(1.0, il),
                  static_cast<long long>(sync - o.sync), static_cast<long long>(async - o.async),
                  (wait - o.wait) / n / 1e3, (remap - o.remap) / n / 1e3,
                  (fetch - o.fetch) / n / 1e3, (write - o.write) / n / 1e3,
                  (forward - o.forward) / n / 1e3, (relink - o.relink) / n / 1e3);
    return buf;
  }
};

// The options both benches take (`--name value` pairs; --threads: the host threads, 0 = all;
// --cache-threads: the cache's gpu_cache.threads, 0 = its default;
// --baseline-rows: rows per table of serve_gpu_cache's all-GPU model, 0 = --rows: fewer where
// the tables do not fit the GPU, the comparison then being with that smaller variant;
// --rocksdb, --host-gb: below).
struct BenchArgs {
  int tables = 8, dim = 64, iters = 300, warmup_batches = 2000, threads = 0;
  int phases = 0;  // serve_gpu_cache: 1 prints the slowest 1 % of batches' phases
  int cache_threads = 0;
  int64_t rows = 1 << 22, baseline_rows = 0;
  double fraction = 0.1, threshold = 0.9, host_gb = 0, rocksdb_cache_gb = 0.008;
  std::string eviction = "lfu", alphas = "1.05,1.2", batches = "1,2048,32768";
  // --rocksdb DIR: the rows come from a RocksDB store at DIR (written from the generator if DIR
  // does not exist) instead of the generated tier; --host-gb: a host tier of that size in front;
  // --rocksdb-reads pread|mmap and --rocksdb-cache-gb: the tier's `reads` and block cache.
  std::string rocksdb, rocksdb_reads = "pread";
  // serve_gpu_cache without --rocksdb: the complete tier generates the rows on demand
  // ("generated") or holds them all in host memory ("held": HeldTier).
  std::string tier = "generated";
};
// Reads argv into `a`; false (after a message naming `prog`) on an unknown option or a
// missing value.
inline bool parse_bench_args(int argc, char** argv, const char* prog, BenchArgs& a) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", prog, k.c_str());
      return false;
    }
    const std::string v = argv[i + 1];
    if (k == "--tables")
      a.tables = std::stoi(v);
    else if (k == "--rows")
      a.rows = std::stoll(v);
    else if (k == "--dim")
      a.dim = std::stoi(v);
    else if (k == "--iters")
      a.iters = std::stoi(v);
    else if (k == "--warmup-batches")
      a.warmup_batches = std::stoi(v);
    else if (k == "--fraction")
      a.fraction = std::stod(v);
    else if (k == "--threshold")
      a.threshold = std::stod(v);
    else if (k == "--eviction")
      a.eviction = v;
    else if (k == "--alpha")
      a.alphas = v;
    else if (k == "--batch")
      a.batches = v;
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else if (k == "--baseline-rows")
      a.baseline_rows = std::stoll(v);
    else if (k == "--rocksdb")
      a.rocksdb = v;
    else if (k == "--host-gb")
      a.host_gb = std::stod(v);
    else if (k == "--rocksdb-reads")
      a.rocksdb_reads = v;
    else if (k == "--rocksdb-cache-gb")
      a.rocksdb_cache_gb = std::stod(v);
    else if (k == "--phases")
      a.phases = std::stoi(v);
    else if (k == "--cache-threads")
      a.cache_threads = std::stoi(v);
    else if (k == "--tier")
      a.tier = v;
    else {
      std::fprintf(stderr, "%s: unknown option %s\n", prog, k.c_str());
      return false;
    }
  }
  if (a.tables < 1 || a.rows < 1 || a.dim < 1 || a.iters < 1 || a.warmup_batches < 0 ||
      a.baseline_rows < 0 || !(a.fraction > 0 && a.fraction <= 1) || !(a.host_gb >= 0) ||
      !(a.rocksdb_cache_gb >= 0) || (a.rocksdb_reads != "pread" && a.rocksdb_reads != "mmap") ||
      (a.host_gb > 0 && a.rocksdb.empty()) || (a.phases != 0 && a.phases != 1) ||
      a.cache_threads < 0 || a.cache_threads > 1024 ||
      (a.tier != "generated" && a.tier != "held") || (a.tier == "held" && !a.rocksdb.empty())) {
    std::fprintf(stderr,
                 "%s: --tables, --rows, --dim and --iters must be >= 1, --warmup-batches and "
                 "--baseline-rows >= 0, --fraction in (0, 1], --host-gb and --rocksdb-cache-gb >= "
                 "0 (--host-gb with --rocksdb only), --rocksdb-reads pread or mmap, --phases 0 "
                 "or 1, --cache-threads in [0, 1024], --tier generated or held (not with "
                 "--rocksdb)\n",
                 prog);
    return false;
  }
  return true;
}

}  // namespace dlrec::bench
