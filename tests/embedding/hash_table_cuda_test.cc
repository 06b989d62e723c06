// The GPU hash table against the CPU HashedEmbedding: the same rows for the same keys (initial
// values and after SGD/Adagrad steps, bit for bit), the same counters, and the sweep eviction.
// Without a GPU (or in a build without CUDA) every test skips visibly.
#include <gtest/gtest.h>

#include <algorithm>
#include <unordered_map>

#include "dlrec/core/device.h"
#include "dlrec/embedding/hashed_embedding.h"
#include "dlrec/nn/rng.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/embedding/hash_table_cuda.h"
#endif

namespace dlrec::embedding {
namespace {

#ifdef DLREC_WITH_CUDA
#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU hash table not run"; \
  } while (0)
#else
#define SKIP_WITHOUT_GPU() GTEST_SKIP() << "built without CUDA: GPU hash table not run"
#endif

#ifdef DLREC_WITH_CUDA
HashedEmbeddingOptions gpu_opts(int64_t cap, nn::OptimizerKind kind) {
  HashedEmbeddingOptions o;
  o.dim = 8;
  o.capacity = cap;
  o.seed = 77;
  o.init_scale = 0.1f;
  o.optimizer.kind = kind;
  o.optimizer.initial_accumulator = 0.01f;
  return o;
}
#endif

TEST(HashTableCuda, MatchesCpuTableBitForBit) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  for (auto kind : {nn::OptimizerKind::SGD, nn::OptimizerKind::Adagrad}) {
    const auto o = gpu_opts(4096, kind);
    HashedEmbedding cpu(o);
    HashTableCuda gpu(o);
    nn::Rng rng(3);
    std::vector<int64_t> seen;
    for (int step = 0; step < 30; ++step) {
      // 512 lookups over 1500 keys spread over the 64-bit range: duplicates within the batch.
      std::vector<int64_t> keys(512);
      for (auto& k : keys) k = static_cast<int64_t>(nn::splitmix64(rng.below(1500)));
      std::vector<int64_t> cslots(keys.size());
      cpu.lookup_or_insert(keys.data(), static_cast<int64_t>(keys.size()), cslots.data());
      std::vector<int32_t> gslots = gpu.lookup_or_insert(keys);
      for (size_t i = 0; i < keys.size(); ++i) ASSERT_GE(gslots[i], 0);
      // Duplicates share a row on the GPU too.
      std::unordered_map<int64_t, int32_t> first;
      for (size_t i = 0; i < keys.size(); ++i) {
        auto [it, fresh] = first.emplace(keys[i], gslots[i]);
        ASSERT_EQ(it->second, gslots[i]) << "key " << keys[i] << " got two rows";
      }
      // One gradient per distinct key, the same on both.
      nn::SparseGrad g;
      g.dim = o.dim;
      std::vector<int32_t> gs;
      std::vector<float> gv;
      std::unordered_map<int64_t, bool> done;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (done[keys[i]]) continue;
        done[keys[i]] = true;
        seen.push_back(keys[i]);
        g.ids.push_back(cslots[i]);
        gs.push_back(gslots[i]);
        for (int64_t k = 0; k < o.dim; ++k) {
          const float v = static_cast<float>(rng.uniform(-1, 1));
          g.values.push_back(v);
          gv.push_back(v);
        }
      }
      cpu.apply(g, 0.05f);
      gpu.apply(gs, gv, 0.05f);
    }
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    std::vector<bool> found;
    const std::vector<float> rows = gpu.read_rows(seen, &found);
    for (size_t i = 0; i < seen.size(); ++i) {
      ASSERT_TRUE(found[i]);
      std::vector<float> c(o.dim);
      ASSERT_TRUE(cpu.read_row(seen[i], c.data()));
      for (int64_t k = 0; k < o.dim; ++k)
        ASSERT_EQ(rows[i * o.dim + k], c[k]) << nn::optimizer_name(kind) << " key " << seen[i];
    }
    if (kind == nn::OptimizerKind::Adagrad) {
      const std::vector<float> st = gpu.read_state(seen);
      for (size_t i = 0; i < seen.size(); ++i)
        for (int64_t k = 0; k < o.dim; ++k)
          ASSERT_EQ(st[i * o.dim + k], cpu.state_row(cpu.find(seen[i]))[k]);
    }
    const auto sc = cpu.stats(), sg = gpu.stats();
    EXPECT_EQ(sg.lookups, sc.lookups);
    EXPECT_EQ(sg.hits, sc.hits);
    EXPECT_EQ(sg.inserts, sc.inserts);
    EXPECT_EQ(sg.size, sc.size);
    EXPECT_EQ(sg.evictions, 0);
  }
#endif
}

TEST(HashTableCuda, SweepKeepsTheMostRecentRows) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  const auto o = gpu_opts(100, nn::OptimizerKind::Adagrad);
  HashTableCuda gpu(o);
  // Ten steps of ten new keys each.
  for (int step = 0; step < 10; ++step) {
    std::vector<int64_t> keys;
    for (int i = 0; i < 10; ++i) keys.push_back(step * 10 + i + 1000);
    gpu.lookup_or_insert(keys);
  }
  EXPECT_EQ(gpu.size(), 100);
  // Touch an old key so that it counts as recent.
  gpu.lookup_or_insert({1001});
  // Train key 1005 (it will be evicted): its state must go with it.
  auto s = gpu.lookup_or_insert({1005});
  gpu.apply(s, std::vector<float>(o.dim, 1.f), 0.1f);
  gpu.lookup_or_insert(std::vector<int64_t>{1070, 1071, 1072, 1073, 1074, 1075, 1076, 1077, 1078,
                                            1079, 1080, 1081, 1082, 1083, 1084, 1085, 1086, 1087,
                                            1088, 1089, 1090, 1091, 1092, 1093, 1094, 1095, 1096,
                                            1097, 1098, 1099});
  EXPECT_EQ(gpu.sweep(32), 68);
  EXPECT_EQ(gpu.size(), 32);
  // Kept: the 30 keys of the last step, 1005 and 1001; gone: everything else.
  const std::vector<int64_t> gone = {1000, 1002, 1010, 1069};
  std::vector<bool> found;
  gpu.read_rows({1001, 1005, 1070, 1099}, &found);
  EXPECT_EQ(found, (std::vector<bool>{true, true, true, true}));
  gpu.read_rows(gone, &found);
  EXPECT_EQ(found, (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(gpu.stats().evictions, 68);
  // An evicted key comes back with its initial row and a fresh accumulator.
  gpu.lookup_or_insert({1002});
  const auto row = gpu.read_rows({1002});
  for (int64_t k = 0; k < o.dim; ++k) EXPECT_EQ(row[k], initial_value(o.seed, 1002, k, o.init_scale));
  const auto st = gpu.read_state({1002});
  for (int64_t k = 0; k < o.dim; ++k) EXPECT_EQ(st[k], 0.01f);
  // Rows survive compaction with their values (1005 was trained).
  const auto r5 = gpu.read_rows({1005});
  EXPECT_NE(r5[0], initial_value(o.seed, 1005, 0, o.init_scale));
#endif
}

TEST(HashTableCuda, FullTableGivesNoRowUntilASweep) {
  SKIP_WITHOUT_GPU();
#ifdef DLREC_WITH_CUDA
  HashTableCuda gpu(gpu_opts(10, nn::OptimizerKind::SGD));
  std::vector<int64_t> keys;
  for (int i = 0; i < 15; ++i) keys.push_back(i * 1000003);
  auto slots = gpu.lookup_or_insert(keys);
  const auto with_row = std::count_if(slots.begin(), slots.end(), [](int32_t s) { return s >= 0; });
  EXPECT_EQ(with_row, 10);
  EXPECT_EQ(gpu.size(), 10);
  EXPECT_EQ(gpu.stats().inserts, 10);
  EXPECT_GT(gpu.maybe_sweep(0.9, 0.5), 0);
  EXPECT_EQ(gpu.size(), 5);
  slots = gpu.lookup_or_insert(keys);
  EXPECT_EQ(std::count_if(slots.begin(), slots.end(), [](int32_t s) { return s >= 0; }), 10);
  EXPECT_LE(gpu.size(), 10);
#endif
}

}  // namespace
}  // namespace dlrec::embedding
