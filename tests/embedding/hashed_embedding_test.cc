// HashedEmbedding (CPU): insert on first sight, LRU eviction against a reference model,
// deterministic rows, counters, training steps, export/import, concurrent readers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <list>
#include <map>
#include <thread>
#include <unordered_map>

#include "dlrec/embedding/hash_common.h"
#include "dlrec/embedding/hashed_embedding.h"
#include "dlrec/nn/rng.h"

namespace dlrec::embedding {
namespace {

HashedEmbeddingOptions opts(int64_t dim, int64_t cap, nn::OptimizerKind kind = nn::OptimizerKind::SGD) {
  HashedEmbeddingOptions o;
  o.dim = dim;
  o.capacity = cap;
  o.seed = 42;
  o.init_scale = 0.5f;
  o.optimizer.kind = kind;
  return o;
}

std::vector<float> row_of(const HashedEmbedding& t, int64_t key) {
  std::vector<float> r(t.dim());
  EXPECT_TRUE(t.read_row(key, r.data())) << "key " << key << " has no row";
  return r;
}

std::vector<float> initial_row(uint64_t seed, int64_t key, int64_t dim, float scale) {
  std::vector<float> r(dim);
  for (int64_t k = 0; k < dim; ++k) r[k] = initial_value(seed, key, k, scale);
  return r;
}

TEST(HashedEmbedding, InsertOnFirstSightWithDeterministicRows) {
  HashedEmbedding t(opts(4, 8));
  const int64_t key = -7123456789012345678LL;
  EXPECT_EQ(t.find(key), -1);
  int64_t slot = -2;
  t.lookup_or_insert(&key, 1, &slot);
  EXPECT_EQ(slot, 0);
  EXPECT_EQ(t.find(key), 0);
  auto r = row_of(t, key);
  EXPECT_EQ(r, initial_row(42, key, 4, 0.5f));
  for (float v : r) {
    EXPECT_GE(v, -0.5f);
    EXPECT_LT(v, 0.5f);
  }
  // Another key, another row; the same key in another table with the same seed: same row.
  EXPECT_NE(initial_row(42, key + 1, 4, 0.5f), r);
  HashedEmbedding t2(opts(4, 3));
  t2.lookup_or_insert(&key, 1, &slot);
  EXPECT_EQ(row_of(t2, key), r);
  auto s = t.stats();
  EXPECT_EQ(s.lookups, 1);
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.inserts, 1);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.size, 1);
  t.lookup_or_insert(&key, 1, &slot);
  s = t.stats();
  EXPECT_EQ(s.lookups, 2);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.inserts, 1);
  float buf[4];
  EXPECT_FALSE(t.read_row(99, buf));
  EXPECT_EQ(buf[0], 0.f);
}

TEST(HashedEmbedding, EvictsLeastRecentlyUsed) {
  HashedEmbedding t(opts(2, 3));
  std::vector<int64_t> keys = {10, 20, 30, 10, 40};
  std::vector<int64_t> slots(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) t.lookup_or_insert(&keys[i], 1, &slots[i]);
  // 20 was the least recently used when 40 arrived; 40 took its slot.
  EXPECT_EQ(t.find(20), -1);
  EXPECT_EQ(slots[4], slots[1]);
  EXPECT_EQ(t.keys_by_recency(), (std::vector<int64_t>{30, 10, 40}));
  auto s = t.stats();
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.inserts, 4);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.size, 3);
}

// A long random stream against a reference LRU (std::list + map): the same resident set and
// recency order after every lookup, the capacity never exceeded, every resident key findable.
TEST(HashedEmbedding, MatchesReferenceLruOnRandomStream) {
  const int64_t cap = 97;
  HashedEmbedding t(opts(1, cap));
  std::list<int64_t> ref;
  std::unordered_map<int64_t, std::list<int64_t>::iterator> where;
  nn::Rng rng(5);
  int64_t evictions = 0, hits = 0;
  for (int i = 0; i < 20000; ++i) {
    // Skewed: half the draws from 64 hot keys, half from 4096.
    const int64_t key = static_cast<int64_t>(rng.next() % 2 ? rng.below(64) : rng.below(4096)) *
                        0x9E3779B97F4A7C15LL;
    int64_t slot;
    t.lookup_or_insert(&key, 1, &slot);
    auto it = where.find(key);
    if (it != where.end()) {
      ++hits;
      ref.erase(it->second);
    } else if (static_cast<int64_t>(ref.size()) == cap) {
      where.erase(ref.front());
      ref.pop_front();
      ++evictions;
    }
    ref.push_back(key);
    where[key] = std::prev(ref.end());
    ASSERT_LE(t.size(), cap);
    if (i % 997 == 0) {
      ASSERT_EQ(t.keys_by_recency(), std::vector<int64_t>(ref.begin(), ref.end())) << "at " << i;
      for (int64_t k : ref) ASSERT_GE(t.find(k), 0);
    }
  }
  EXPECT_EQ(t.keys_by_recency(), std::vector<int64_t>(ref.begin(), ref.end()));
  const auto s = t.stats();
  EXPECT_EQ(s.evictions, evictions);
  EXPECT_EQ(s.hits, hits);
  EXPECT_EQ(s.lookups, 20000);
  EXPECT_EQ(s.size, cap);
  EXPECT_GT(evictions, 1000);
}

TEST(HashedEmbedding, ReinsertedKeyRestartsFromItsInitialRowAndState) {
  HashedEmbedding t(opts(3, 2, nn::OptimizerKind::Adagrad));
  const int64_t a = 1234, b = 5678, c = 91011;
  int64_t slot;
  t.lookup_or_insert(&a, 1, &slot);
  nn::SparseGrad g;
  g.dim = 3;
  g.ids = {slot};
  g.values = {1.f, -2.f, 0.5f};
  t.apply(g, 0.1f);
  EXPECT_NE(row_of(t, a), initial_row(42, a, 3, 0.5f));
  EXPECT_FLOAT_EQ(t.state_row(slot)[1], 4.f);
  t.lookup_or_insert(&b, 1, &slot);
  t.lookup_or_insert(&c, 1, &slot);  // evicts a
  EXPECT_EQ(t.find(a), -1);
  t.lookup_or_insert(&a, 1, &slot);  // evicts b
  EXPECT_EQ(row_of(t, a), initial_row(42, a, 3, 0.5f));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(t.state_row(slot)[k], 0.f);
  EXPECT_EQ(t.stats().evictions, 2);
}

TEST(HashedEmbedding, TooManyDistinctKeysInOneBatchThrow) {
  HashedEmbedding t(opts(2, 3));
  std::vector<int64_t> keys = {1, 2, 3, 4}, slots(4);
  EXPECT_THROW(t.lookup_or_insert(keys.data(), 4, slots.data()), Error);
  std::vector<int64_t> dup = {1, 2, 1, 2, 3}, s5(5);
  t.lookup_or_insert(dup.data(), 5, s5.data());  // 3 distinct: fine
  EXPECT_EQ(t.size(), 3);
  std::vector<int64_t> off = {0, 4};
  std::vector<float> out(2);
  EXPECT_THROW(t.forward(off.data(), keys.data(), 1, out.data(), 2, true), Error);
}

// Pooling, sparse gradient and SGD update against hand computation (sum and mean pooling).
TEST(HashedEmbedding, ForwardBackwardApply) {
  for (nn::Pooling pooling : {nn::Pooling::Sum, nn::Pooling::Mean}) {
    HashedEmbeddingOptions o = opts(2, 16);
    o.pooling = pooling;
    HashedEmbedding t(o);
    const int64_t A = 1LL << 60, B = -3, C = 777;
    // Sample 0: {A, B, A}; sample 1: {}; sample 2: {C, B}.
    std::vector<int64_t> offsets = {0, 3, 3, 5}, keys = {A, B, A, C, B};
    std::vector<float> out(3 * 2, -1.f);
    t.forward(offsets.data(), keys.data(), 3, out.data(), 2, true);
    auto ia = initial_row(42, A, 2, 0.5f), ib = initial_row(42, B, 2, 0.5f),
         ic = initial_row(42, C, 2, 0.5f);
    const float s0 = pooling == nn::Pooling::Mean ? 1.f / 3 : 1.f;
    const float s2 = pooling == nn::Pooling::Mean ? 0.5f : 1.f;
    for (int k = 0; k < 2; ++k) {
      EXPECT_FLOAT_EQ(out[k], s0 * (ia[k] + ib[k] + ia[k]));
      EXPECT_EQ(out[2 + k], 0.f);
      EXPECT_FLOAT_EQ(out[4 + k], s2 * (ic[k] + ib[k]));
    }
    const auto st = t.stats();
    EXPECT_EQ(st.lookups, 5);
    EXPECT_EQ(st.hits, 0);
    EXPECT_EQ(st.inserts, 3);
    std::vector<float> dout = {1.f, 2.f, 100.f, 100.f, -1.f, 0.5f};
    const nn::SparseGrad& g = t.backward(dout.data(), 2);
    ASSERT_EQ(g.size(), 3);
    // Order of first occurrence: A, B, C.
    EXPECT_EQ(g.ids[0], t.find(A));
    EXPECT_EQ(g.ids[1], t.find(B));
    EXPECT_EQ(g.ids[2], t.find(C));
    EXPECT_FLOAT_EQ(g.values[0], 2 * s0 * 1.f);
    EXPECT_FLOAT_EQ(g.values[1], 2 * s0 * 2.f);
    EXPECT_FLOAT_EQ(g.values[2], s0 * 1.f + s2 * -1.f);
    EXPECT_FLOAT_EQ(g.values[3], s0 * 2.f + s2 * 0.5f);
    EXPECT_FLOAT_EQ(g.values[4], s2 * -1.f);
    EXPECT_FLOAT_EQ(g.values[5], s2 * 0.5f);
    const std::vector<float> gv = g.values;
    t.apply(g, 0.1f);
    auto ra = row_of(t, A), rc = row_of(t, C);
    EXPECT_FLOAT_EQ(ra[0], ia[0] - 0.1f * gv[0]);
    EXPECT_FLOAT_EQ(rc[1], ic[1] - 0.1f * gv[5]);
    // A second forward: all hits.
    t.forward(offsets.data(), keys.data(), 3, out.data(), 2, true);
    EXPECT_EQ(t.stats().hits, 5);
    // Evaluation forward of an unknown key pools zeros and inserts nothing.
    std::vector<int64_t> off1 = {0, 2}, unk = {A, 424242};
    std::vector<float> o1(2);
    t.forward(off1.data(), unk.data(), 1, o1.data(), 2, false);
    const float s = pooling == nn::Pooling::Mean ? 0.5f : 1.f;
    EXPECT_FLOAT_EQ(o1[0], s * ra[0]);
    EXPECT_EQ(t.find(424242), -1);
    EXPECT_EQ(t.size(), 3);
  }
}

void train_steps(HashedEmbedding& t, uint64_t seed, int steps) {
  nn::Rng rng(seed);
  const int64_t B = 32, d = t.dim();
  std::vector<int64_t> offsets(B + 1), keys;
  std::vector<float> out(B * d), dout(B * d);
  for (int s = 0; s < steps; ++s) {
    keys.clear();
    for (int64_t r = 0; r < B; ++r) {
      offsets[r] = static_cast<int64_t>(keys.size());
      const int64_t len = rng.below(3);
      for (int64_t i = 0; i < len; ++i) keys.push_back(static_cast<int64_t>(rng.below(300)) * 1000003);
    }
    offsets[B] = static_cast<int64_t>(keys.size());
    t.forward(offsets.data(), keys.data(), B, out.data(), d, true);
    for (auto& v : dout) v = static_cast<float>(rng.uniform(-1, 1));
    t.apply(t.backward(dout.data(), d), 0.05f);
  }
}

TEST(HashedEmbedding, ExportImportRoundTripIsExact) {
  const std::string path = ::testing::TempDir() + "/hashed_roundtrip.dlrec";
  for (auto kind : {nn::OptimizerKind::SGD, nn::OptimizerKind::RowWiseAdagrad, nn::OptimizerKind::Adam}) {
    HashedEmbedding a(opts(4, 128, kind));
    train_steps(a, 1, 40);  // 300 keys through 128 rows: evictions
    ASSERT_GT(a.stats().evictions, 0);
    a.save(path);
    HashedEmbedding b(opts(4, 200, kind));
    b.load(path);
    EXPECT_EQ(b.keys_by_recency(), a.keys_by_recency());
    const auto sa = a.stats(), sb = b.stats();
    EXPECT_EQ(sb.lookups, sa.lookups);
    EXPECT_EQ(sb.hits, sa.hits);
    EXPECT_EQ(sb.inserts, sa.inserts);
    EXPECT_EQ(sb.evictions, sa.evictions);
    EXPECT_EQ(sb.size, sa.size);
    const int64_t S = a.optimizer().state_row_size(4);
    for (int64_t key : a.keys_by_recency()) {
      EXPECT_EQ(row_of(b, key), row_of(a, key));
      const float* x = a.state_row(a.find(key));
      const float* y = b.state_row(b.find(key));
      for (int64_t k = 0; k < S; ++k) ASSERT_EQ(x[k], y[k]);
    }
    // Same capacity: training on continues bit-identically.
    HashedEmbedding c(opts(4, 128, kind));
    c.load(path);
    train_steps(a, 2, 10);
    train_steps(c, 2, 10);
    EXPECT_EQ(c.keys_by_recency(), a.keys_by_recency());
    for (int64_t key : a.keys_by_recency()) ASSERT_EQ(row_of(c, key), row_of(a, key));
    EXPECT_EQ(c.stats().evictions, a.stats().evictions);
  }
  // Mismatches are errors naming the problem.
  HashedEmbedding a(opts(4, 128, nn::OptimizerKind::Adagrad));
  train_steps(a, 1, 5);
  a.save(path);
  HashedEmbedding wrong_dim(opts(8, 128, nn::OptimizerKind::Adagrad));
  EXPECT_THROW(wrong_dim.load(path), Error);
  HashedEmbedding wrong_opt(opts(4, 128, nn::OptimizerKind::Adam));
  EXPECT_THROW(wrong_opt.load(path), Error);
  HashedEmbedding too_small(opts(4, 2, nn::OptimizerKind::Adagrad));
  try {
    too_small.load(path);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(HashedEmbedding, ConcurrentReadersSeeConsistentRows) {
  HashedEmbedding t(opts(8, 1000));
  std::vector<int64_t> keys(800), slots(800);
  for (int64_t i = 0; i < 800; ++i) keys[i] = i * 7919 + 3;
  t.lookup_or_insert(keys.data(), 800, slots.data());
  std::vector<int64_t> offsets(801);
  for (int64_t i = 0; i <= 800; ++i) offsets[i] = i;
  std::vector<float> serial(800 * 8);
  t.forward(offsets.data(), keys.data(), 800, serial.data(), 8, false);
  std::vector<std::thread> threads;
  std::vector<int> ok(6, 0);
  for (int th = 0; th < 6; ++th)
    threads.emplace_back([&, th] {
      std::vector<float> out(800 * 8);
      bool good = true;
      for (int rep = 0; rep < 20; ++rep) {
        t.forward(offsets.data(), keys.data(), 800, out.data(), 8, false);
        good = good && out == serial;
        good = good && t.find(keys[(rep * 37 + th) % 800]) >= 0;
      }
      ok[th] = good;
    });
  for (auto& th : threads) th.join();
  for (int th = 0; th < 6; ++th) EXPECT_TRUE(ok[th]) << "thread " << th;
}

TEST(HashedEmbedding, MemoryIsFixedAtConstruction) {
  HashedEmbedding t(opts(16, 1000, nn::OptimizerKind::Adagrad));
  const int64_t before = t.memory_bytes();
  // weights + adagrad state + key + links + the 8 counters + index (2048 slots of 8 bytes)
  EXPECT_EQ(before, 1000 * (16 * 4 + 16 * 4 + 8 + 8) + 8 * 8 + 2048 * 8);
  train_steps(t, 3, 30);
  EXPECT_EQ(t.memory_bytes(), before);
}

}  // namespace
}  // namespace dlrec::embedding
