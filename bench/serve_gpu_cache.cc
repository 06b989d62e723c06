// The GPU cache tier against the same model with its tables fully on the GPU (issue 22's
// "tables twice the GPU" setup, at the size given): a DLRM whose T tables of R rows x D are
// served through the GPU cache (a fraction of the rows, LFU/LRU, sync/async inserts) over a
// complete tier that generates each row from (table, id) in host memory, so no table is
// written to disk or held twice (--tier held: every row held in host memory instead, filled from
// the generator at start); the all-in-GPU model holds the same rows (filled from the
// same generator) and the same dense weights. Power-law ids (P(rank k) ~ k^-alpha). Prints,
// per alpha and batch size: the cache's hit rates over the timed batches (per distinct id of a
// batch and per id looked up), where the cache's host time goes (bench/gpu_cache_bench.h),
// p50/p99 latency and throughput of both, and whether their predictions were bit for bit equal
// on the batches checked; with --phases 1, the phases of the slowest 1 % of batches beside the
// median one's (GpuCache::keep_phases). With --rocksdb DIR the rows come from a RocksDB store
// instead (written from the generator when DIR does not exist), optionally behind a host tier
// (--host-gb). Run by bench/serve_gpu_cache.sh (one GPU).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/core/device.h"
#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/model/cuda_model.h"
#include "dlrec/model/model.h"
#include "dlrec/store/gpu_cache.h"
#include "gpu_cache_bench.h"

using namespace dlrec;
using namespace dlrec::bench;

namespace {

using Args = BenchArgs;
using Phases = store::GpuCache::BatchPhases;

// --phases 1: the slowest 1 % of the timed batches (at least 3) with their phases, next to the
// median batch's, and the mean latency of the batches during which a thread of the cache was
// preempted or an async insert was pending against the rest.
void print_phases(const std::vector<double>& us, const std::vector<Phases>& ph) {
  std::vector<size_t> order(us.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return us[a] < us[b]; });
  auto u = [](int64_t ns) { return ns / 1e3; };
  auto line = [&](const char* what, size_t i) {
    const Phases& p = ph[i];
    std::printf("  %-8s #%-4zu %7.1f | %6.1f %6.1f %6.1f %5.1f %6.1f %5.1f %6.1f %5.1f |", what,
                i, us[i], u(p.wait_ns), u(p.lookup_ns), u(p.remap_ns), u(p.settle_ns),
                u(p.fetch_ns), u(p.write_ns), u(p.forward_ns), u(p.relink_ns));
    for (const auto& t : p.team)
      std::printf(" %5.1f %5.1f %5.1f %5.1f %5.1f %2d %d %d %lld |", u(t.wall_ns),
                  u(t.max_task_ns), u(t.last_start_ns), u(t.last_work_end_ns), u(t.last_end_ns),
                  t.workers, t.preempted, t.slept, static_cast<long long>(t.faults));
    std::printf(" %lld %lld %lld | %5lld %c %d %lld %.1f\n",
                static_cast<long long>(p.caller_preempted), static_cast<long long>(p.caller_slept),
                static_cast<long long>(p.caller_faults), static_cast<long long>(p.misses),
                p.sync ? 's' : 'a', p.inserter_busy ? 1 : 0, static_cast<long long>(p.inserts),
                u(p.insert_ns));
  };
  std::printf(
      "phases (us): latency | wait lookup remap settle fetch write forward relink | per team job "
      "(lookup with the remaps, fetch): wall max_task last_start last_work_end last_end workers "
      "preempted slept faults | caller preempted slept faults | misses sync/async inserter_busy inserts "
      "insert_us\n");
  line("median", order[order.size() / 2]);
  const size_t slow = std::max<size_t>(3, us.size() / 100);
  for (size_t j = 0; j < slow && j < order.size(); ++j)
    line("slow", order[order.size() - 1 - j]);
  double a_sum = 0, b_sum = 0, i_sum = 0, n_sum = 0;
  int a_n = 0, b_n = 0, i_n = 0, n_n = 0;
  for (size_t i = 0; i < us.size(); ++i) {
    const Phases& p = ph[i];
    int64_t pre = p.caller_preempted;
    for (const auto& t : p.team) pre += t.preempted;
    (pre > 0 ? a_sum : b_sum) += us[i];
    ++(pre > 0 ? a_n : b_n);
    const bool ins = p.inserter_busy || p.inserts > 0;
    (ins ? i_sum : n_sum) += us[i];
    ++(ins ? i_n : n_n);
  }
  std::printf(
      "phases: preempted batches %d (mean %.1f us) vs %d (mean %.1f); with an async insert "
      "pending %d (mean %.1f) vs %d (mean %.1f)\n",
      a_n, a_n ? a_sum / a_n : 0.0, b_n, b_n ? b_sum / b_n : 0.0, i_n, i_n ? i_sum / i_n : 0.0,
      n_n, n_n ? n_sum / n_n : 0.0);
}

int run(const Args& a) {
  DLREC_CHECK(cuda::device_count() > 0, "no CUDA device");
  if (a.threads > 0) set_num_threads(a.threads);
  const Device dev = Device::cuda(0);
  const json cfg_json =
      parse_json(R"({"model": {"arch": "dlrm", "embedding_dim": )" + std::to_string(a.dim) +
                     R"(, "bottom_mlp": [256, )" + std::to_string(a.dim) +
                     R"(], "top_mlp": [512, 256, 1], "interaction": "dot"},
          "optimizer": {"type": "sgd", "lr": 0.01}})",
                 "bench config");
  const model::RunConfig cfg = model::RunConfig::from_json(cfg_json);
  // The all-GPU model's rows per table: --rows, or fewer (--baseline-rows) where the tables
  // do not fit the GPU; then it serves batches of its own ids and predictions are not compared.
  const int64_t brows = a.baseline_rows > 0 ? a.baseline_rows : a.rows;
  DLREC_CHECK(brows <= a.rows, "serve_gpu_cache: --baseline-rows ", brows, " exceeds --rows ",
              a.rows);
  const bool same_tables = brows == a.rows;
  io::ShardLayout full;
  full.num_dense = 13;
  for (int t = 0; t < a.tables; ++t) {
    full.cardinalities.push_back(brows);
    full.multi_hot.push_back(false);
  }
  std::vector<store::TableInfo> tables;
  for (int t = 0; t < a.tables; ++t)
    tables.push_back({"emb." + std::to_string(t) + ".weight", t, a.rows, a.dim});
  const double table_gb = static_cast<double>(a.tables) * a.rows * a.dim * 4 / 1e9;
  std::printf(
      "setup: %d tables x %lld rows x %d = %.2f GB fp32; cache %.3g of the rows, %s, "
      "insert_threshold %.2f\n",
      a.tables, static_cast<long long>(a.rows), a.dim, table_gb, a.fraction, a.eviction.c_str(),
      a.threshold);
  if (!same_tables)
    std::printf("setup: the all-GPU model has %lld rows per table (%.2f GB): a smaller variant\n",
                static_cast<long long>(brows),
                static_cast<double>(a.tables) * brows * a.dim * 4 / 1e9);
  // The all-in-GPU model, its tables filled from the generator in chunks.
  auto base = model::build_model(cfg.model, cfg.optimizer, full, dev, 1, "fp32");
  {
    std::vector<float> chunk;
    for (auto& [name, t] : base->parameters()) {
      const auto it = std::find_if(tables.begin(), tables.end(),
                                   [&](const store::TableInfo& i) { return i.name == name; });
      if (it == tables.end()) continue;
      const int ti = static_cast<int>(it - tables.begin());
      const int64_t step = int64_t{1} << 20;
      for (int64_t r0 = 0; r0 < brows; r0 += step) {
        const int64_t n = std::min(step, brows - r0);
        chunk.resize(static_cast<size_t>(n * a.dim));
        generate_rows(ti, r0, n, a.dim, chunk.data());
        copy_bytes(static_cast<char*>(t.raw()) + r0 * a.dim * 4, dev, chunk.data(), Device::cpu(),
                   chunk.size() * 4);
      }
    }
  }
  // The cached model: the same dense weights; tables of cache + staging rows.
  store::StoreConfig sc;
  sc.rocksdb = true;  // (only the checks of from_json need it; the tier here is generated)
  sc.gpu_cache = true;
  sc.gpu_cache_fraction = a.fraction;
  sc.gpu_cache_eviction = a.eviction;
  sc.gpu_cache_insert_threshold = a.threshold;
  sc.gpu_cache_threads = a.cache_threads;
  sc.staging_rows = 32768;
  int64_t free_b = 0, total_b = 0;
  store::cuda_memory_info(0, &free_b, &total_b);
  std::vector<std::unique_ptr<store::Tier>> tiers;
  if (a.rocksdb.empty() && a.tier == "held") {
    const auto t0 = std::chrono::steady_clock::now();
    tiers.push_back(std::make_unique<HeldTier>(tables));
    std::printf("setup: tier held: %.2f GB of rows in host memory, filled in %.1f s\n",
                tiers.back()->memory_bound() / 1e9,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else if (a.rocksdb.empty()) {
    tiers.push_back(std::make_unique<GeneratedTier>(tables));
  } else {
    if (!std::filesystem::exists(a.rocksdb)) {
      const auto t0 = std::chrono::steady_clock::now();
      write_generated_store(a.rocksdb, tables);
      std::printf("setup: wrote the RocksDB store %s in %.1f s\n", a.rocksdb.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (a.host_gb > 0)
      tiers.push_back(store::make_host_tier(tables, static_cast<int64_t>(a.host_gb * 1e9), 64,
                                            "lfu"));
    tiers.push_back(store::open_rocksdb_tier(
        a.rocksdb, tables, static_cast<int64_t>(a.rocksdb_cache_gb * 1e9), "", a.rocksdb_reads));
    std::printf("setup: tiers %srocksdb (%.2f GB on disk, reads %s, block cache %.3g GB)\n",
                a.host_gb > 0 ? "host, " : "", tiers.back()->disk_bytes() / 1e9,
                a.rocksdb_reads.c_str(), a.rocksdb_cache_gb);
  }
  store::EmbeddingStore es(tables, std::move(tiers));
  store::GpuCache cache(es, sc, store::size_gpu_cache(sc, tables, free_b, total_b));
  std::unique_ptr<model::Model> cm_model;
  auto build_cached = [&](int64_t staging) {
    cache.drain();  // no background insert may write into the model about to be replaced
    io::ShardLayout l = full;  // (the dense layers are the same at any table size)
    for (int t = 0; t < a.tables; ++t) l.cardinalities[t] = cache.sizing().cache_rows[t] + staging;
    cm_model = model::build_model(cfg.model, cfg.optimizer, l, dev, 1, "fp32");
    std::map<std::string, Tensor> bp;
    for (auto& [name, t] : base->parameters()) bp[name] = t;
    std::vector<float*> ptrs;
    std::vector<int64_t> dims, rows;
    for (auto& [name, t] : cm_model->parameters()) {
      const auto it = std::find_if(tables.begin(), tables.end(),
                                   [&](const store::TableInfo& i) { return i.name == name; });
      if (it == tables.end()) {
        t.copy_from(bp.at(name));
        continue;
      }
      ptrs.push_back(t.data<float>());
      dims.push_back(a.dim);
      rows.push_back(t.dim(0));
    }
    cache.bind(store::make_cuda_rows(0, ptrs, dims, rows,
                                     dynamic_cast<model::CudaModel&>(*cm_model).serving_stream()),
               staging);
  };
  build_cached(sc.staging_rows);
  std::printf("setup: cache %lld rows per table (%.2f GB), staging %lld rows, %d threads\n",
              static_cast<long long>(cache.sizing().cache_rows[0]),
              cache.sizing().cache_bytes / 1e9, static_cast<long long>(cache.staging_rows()),
              cache.threads());
  auto* base_cm = dynamic_cast<model::CudaModel*>(base.get());
  DLREC_CHECK(base_cm, "serve_gpu_cache: the model is not a CUDA model");
  auto cached_predict = [&](const io::Batch& b, float* out) {
    for (;;) {
      const int64_t need = cache.run(b, [&](const io::Batch& m) {
        dynamic_cast<model::CudaModel&>(*cm_model).predict(m, out);
      });
      if (need == 0) return;
      build_cached(std::max(need, 2 * cache.staging_rows()));
    }
  };
  std::vector<int64_t> sizes;
  for (double d : split_d(a.batches)) sizes.push_back(static_cast<int64_t>(d));
  for (double alpha : split_d(a.alphas)) {
    const PowerLaw pl(a.rows, alpha);
    std::unique_ptr<PowerLaw> bpl;  // the smaller variant's ids
    if (!same_tables) bpl = std::make_unique<PowerLaw>(brows, alpha);
    std::mt19937_64 rng(static_cast<uint64_t>(alpha * 1000));
    build_cached(cache.staging_rows());  // a cold cache per alpha
    {                                    // warm-up: the cache's steady state
      std::vector<float> out(2048);
      for (int i = 0; i < a.warmup_batches; ++i)
        cached_predict(make_batch(pl, a.tables, 2048, rng), out.data());
      cache.drain();
    }
    for (int64_t B : sizes) {
      const int iters = B >= 32768 ? std::max(20, a.iters / 10) : a.iters;
      std::vector<io::Batch> batches, own;
      for (int i = 0; i < iters; ++i) batches.push_back(make_batch(pl, a.tables, B, rng));
      if (!same_tables)
        for (int i = 0; i < iters; ++i) own.push_back(make_batch(*bpl, a.tables, B, rng));
      const std::vector<io::Batch>& base_batches = same_tables ? batches : own;
      std::vector<float> pb(B), pc(B);
      // Bit for bit on 5 batches of their own, not timed (a timed batch checked first would
      // run as all hits; these also warm both engines' buckets).
      int64_t diff = 0;
      for (int i = 0; i < 5; ++i) {
        const io::Batch check = make_batch(pl, a.tables, B, rng);
        base_cm->predict(same_tables ? check : make_batch(*bpl, a.tables, B, rng), pb.data());
        cached_predict(check, pc.data());
        if (same_tables)
          for (int64_t r = 0; r < B; ++r) diff += std::memcmp(&pb[r], &pc[r], 4) != 0;
      }
      cache.drain();
      std::vector<double> ub, uc;
      auto t0 = std::chrono::steady_clock::now();
      for (const io::Batch& b : base_batches) {
        const auto s = std::chrono::steady_clock::now();
        base_cm->predict(b, pb.data());
        ub.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s)
                         .count());
      }
      const double tb =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const CacheCounters c0 = CacheCounters::of(cache);
      std::vector<Phases> phases;
      phases.reserve(batches.size());
      uc.reserve(batches.size());
      cache.keep_phases(a.phases == 1);
      t0 = std::chrono::steady_clock::now();
      for (const io::Batch& b : batches) {
        const auto s = std::chrono::steady_clock::now();
        cached_predict(b, pc.data());
        uc.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s)
                         .count());
        if (a.phases == 1) phases.push_back(cache.last_phases());
      }
      cache.keep_phases(false);
      const double tc =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf(
          "alpha=%.2f batch=%lld iters=%d %s | cached p50_us=%.1f p99_us=%.1f samples/s=%.0f | "
          "all-gpu p50_us=%.1f p99_us=%.1f samples/s=%.0f | p99 ratio %.2f, throughput ratio "
          "%.2f | bit-for-bit rows differing: %s\n",
          alpha, static_cast<long long>(B), iters, CacheCounters::of(cache).since(c0).c_str(),
          quantile(uc, 0.5), quantile(uc, 0.99), B * iters / tc, quantile(ub, 0.5),
          quantile(ub, 0.99), B * iters / tb, quantile(uc, 0.99) / quantile(ub, 0.99), tb / tc,
          same_tables ? std::to_string(diff).c_str() : "not compared (smaller all-GPU variant)");
      if (a.phases == 1) print_phases(uc, phases);
      std::fflush(stdout);
    }
  }
  cache.drain();  // before the model goes (it is destroyed before the cache)
  std::printf("cache: %s", es.stats_text().c_str());
  std::printf(
      "gpu: hits %lld misses %lld evictions %lld bytes %lld async_inserted %lld "
      "async_dropped %lld\n",
      static_cast<long long>(cache.stats.hits), static_cast<long long>(cache.stats.misses),
      static_cast<long long>(cache.stats.evictions), static_cast<long long>(cache.stats.bytes),
      static_cast<long long>(cache.async_inserted), static_cast<long long>(cache.async_dropped));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_bench_args(argc, argv, "serve_gpu_cache", a)) return 2;
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_gpu_cache: %s\n", e.what());
    return 1;
  }
}
