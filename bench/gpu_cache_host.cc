// The GPU cache tier's host path without a GPU (issue 22): GpuCache::run over the same setup as
// bench/serve_gpu_cache.cc (T tables of R rows x D, a fraction of them cached, power-law ids,
// rows generated from (table, id) by the tier below), with host arrays standing in for the
// device tables and a forward that only reads the remapped rows. Prints, per alpha and batch
// size, the hit rates (per distinct id of a batch and per id looked up) and where run()'s time
// goes (remap, fetch, write), p50/p99 of run(): what the host adds to a GPU forward.
//   gpu_cache_host [--tables 8] [--rows 4194304] [--dim 64] [--fraction 0.1] [--eviction lfu]
//                  [--threshold 0.9] [--iters 300] [--warmup-batches 2000] [--alpha 1.05,1.2]
//                  [--batch 1,2048,32768] [--threads N: the host threads]
//                  [--cache-threads N: the batch's workers, caller included; 0 = the default]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/store/gpu_cache.h"
#include "gpu_cache_bench.h"

using namespace dlrec;
using namespace dlrec::bench;

namespace {

// Host arrays for the device tables: a memcpy per row, as a device write's host side would be.
class HostRows final : public store::DeviceRows {
 public:
  HostRows(int64_t tables, int64_t rows, int64_t dim)
      : dim_(dim), data_(static_cast<size_t>(tables)) {
    for (auto& d : data_) d.assign(static_cast<size_t>(rows * dim), 0.f);
  }
  void write(int table, const int64_t* rows, int64_t n, const float* src) override {
    float* base = data_[static_cast<size_t>(table)].data();
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(base + rows[i] * dim_, src + i * dim_, sizeof(float) * dim_);
  }
  float sum_rows(int table, const std::vector<int64_t>& rows) const {
    float s = 0;
    for (int64_t r : rows) s += data_[static_cast<size_t>(table)][r * dim_];
    return s;
  }

 private:
  int64_t dim_;
  std::vector<std::vector<float>> data_;
};

using Args = BenchArgs;

int run(const Args& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  std::vector<store::TableInfo> tables;
  for (int t = 0; t < a.tables; ++t)
    tables.push_back({"emb." + std::to_string(t) + ".weight", t, a.rows, a.dim});
  store::StoreConfig sc;
  sc.rocksdb = true;  // (only the checks of from_json need it; the tier here is generated)
  sc.gpu_cache = true;
  sc.gpu_cache_fraction = a.fraction;
  sc.gpu_cache_eviction = a.eviction;
  sc.gpu_cache_insert_threshold = a.threshold;
  sc.gpu_cache_threads = a.cache_threads;
  sc.staging_rows = 32768;
  std::vector<std::unique_ptr<store::Tier>> tiers;
  tiers.push_back(std::make_unique<GeneratedTier>(tables));
  store::EmbeddingStore es(tables, std::move(tiers));
  store::GpuCache cache(es, sc, store::size_gpu_cache(sc, tables, -1, -1));
  HostRows* rows = nullptr;
  auto bind = [&](int64_t staging) {
    auto r = std::make_unique<HostRows>(a.tables, cache.sizing().cache_rows[0] + staging, a.dim);
    rows = r.get();
    cache.bind(std::move(r), staging);
  };
  std::printf(
      "setup: %d tables x %lld rows x %d, cache %.3g of the rows (%lld per table), %s, "
      "insert_threshold %.2f, %d threads (the cache's %d), no GPU (host arrays for the device "
      "tables)\n",
      a.tables, static_cast<long long>(a.rows), a.dim, a.fraction,
      static_cast<long long>(cache.sizing().cache_rows[0]), a.eviction.c_str(), a.threshold,
      num_threads(), cache.threads());
  float sink = 0;
  auto forward = [&](const io::Batch& m) {  // reads one float of every row of table 0
    sink += rows->sum_rows(0, m.cat_indices[0]);
  };
  auto cached = [&](const io::Batch& b) {
    for (;;) {
      const int64_t need = cache.run(b, forward);
      if (need == 0) return;
      bind(std::max(need, 2 * cache.staging_rows()));
    }
  };
  bind(sc.staging_rows);
  for (double alpha : split_d(a.alphas)) {
    const PowerLaw pl(a.rows, alpha);
    std::mt19937_64 rng(static_cast<uint64_t>(alpha * 1000));
    bind(cache.staging_rows());  // a cold cache per alpha
    for (int i = 0; i < a.warmup_batches; ++i) cached(make_batch(pl, a.tables, 2048, rng));
    cache.drain();
    for (double bd : split_d(a.batches)) {
      const auto B = static_cast<int64_t>(bd);
      const int iters = B >= 32768 ? std::max(20, a.iters / 10) : a.iters;
      std::vector<io::Batch> batches;
      for (int i = 0; i < iters; ++i) batches.push_back(make_batch(pl, a.tables, B, rng));
      cached(batches[0]);
      cache.drain();
      const CacheCounters c0 = CacheCounters::of(cache);
      std::vector<double> us;
      for (const io::Batch& b : batches) {
        const auto s = std::chrono::steady_clock::now();
        cached(b);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s)
                         .count());
      }
      std::printf("alpha=%.2f batch=%lld iters=%d %s | run() p50_us=%.1f p99_us=%.1f\n", alpha,
                  static_cast<long long>(B), iters, CacheCounters::of(cache).since(c0).c_str(),
                  quantile(us, 0.5), quantile(us, 0.99));
      std::fflush(stdout);
    }
  }
  std::printf("(checksum %g)\n", static_cast<double>(sink));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_bench_args(argc, argv, "gpu_cache_host", a)) return 2;
  if (!a.rocksdb.empty() || a.phases != 0 || a.tier != "generated") {
    std::fprintf(stderr, "gpu_cache_host: --rocksdb, --phases and --tier are serve_gpu_cache's "
                         "(this bench times the generated tier only)\n");
    return 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_cache_host: %s\n", e.what());
    return 1;
  }
}
