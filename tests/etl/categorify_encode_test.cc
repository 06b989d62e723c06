// Categorify's encode: the narrow vocabulary table (every key below 2^32 - 1) and the general
// one give each key the id of its vocabulary position (+2), else the out-of-vocabulary id 1
// (or its hash bucket), at the edges of the narrow form too (keys 2^32 - 2, 2^32 - 1, 2^32,
// 2^64 - 1, 0). The fit's counts: the narrow count table (every key below 2^32 - 1 so far) and
// its move to the general one when a wider key comes give the vocabulary of a plain count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

std::unique_ptr<CategoricalEncoder> fitted_categorify(const std::vector<uint64_t>& vocab,
                                                      int64_t num_buckets = 0) {
  json spec = {{"op", "Categorify"}, {"vocab", vocab}};
  if (num_buckets > 0) spec["num_buckets"] = num_buckets;
  auto op = OpRegistry::global().create(spec, "test", /*fitted=*/true);
  auto* enc = dynamic_cast<CategoricalEncoder*>(op.get());
  EXPECT_NE(enc, nullptr);
  op.release();
  return std::unique_ptr<CategoricalEncoder>(enc);
}

// Encodes `keys` (in one call, and one key per call) and checks every id against the
// vocabulary's positions.
void expect_ids(const std::vector<uint64_t>& vocab, const std::vector<uint64_t>& keys) {
  auto enc = fitted_categorify(vocab);
  ASSERT_TRUE(enc);
  std::unordered_map<uint64_t, int64_t> want;
  for (size_t i = 0; i < vocab.size(); ++i) want[vocab[i]] = static_cast<int64_t>(i) + 2;
  std::vector<int64_t> ids(keys.size(), -7);
  enc->encode(keys.data(), static_cast<int64_t>(keys.size()), ids.data());
  int64_t in_vocab = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto it = want.find(keys[i]);
    const int64_t w = it == want.end() ? 1 : it->second;
    in_vocab += w > 1;
    ASSERT_EQ(ids[i], w) << "key " << keys[i];
    int64_t one = -7;
    enc->encode(&keys[i], 1, &one);
    ASSERT_EQ(one, w) << "key " << keys[i] << " alone";
  }
  EXPECT_GT(in_vocab, 0);
  EXPECT_LT(in_vocab, static_cast<int64_t>(keys.size()));
}

const std::vector<uint64_t> kEdgeKeys = {0,
                                         1,
                                         5,
                                         0xFFFFFFFEu,
                                         0xFFFFFFFFu,
                                         uint64_t{1} << 32,
                                         ~uint64_t{0},
                                         ~uint64_t{0} - 1,
                                         0x7FFFFFFFu,
                                         0x80000000u,
                                         1234567,
                                         (uint64_t{5} << 32) | 5};

TEST(CategorifyEncodeTest, NarrowVocabularyEdges) {
  // Every key below 2^32 - 1: the narrow table. Wider keys (and 2^32 - 1) are not in it.
  expect_ids({5, 0xFFFFFFFEu, 0, 1234567, 0x80000000u}, kEdgeKeys);
}

TEST(CategorifyEncodeTest, WideVocabularyEdges) {
  // A key of 2^32 - 1 or more: the general table, with the same ids.
  expect_ids({5, 0xFFFFFFFFu, 0, ~uint64_t{0}, uint64_t{1} << 32}, kEdgeKeys);
  expect_ids({(uint64_t{5} << 32) | 5, 7}, kEdgeKeys);
}

TEST(CategorifyEncodeTest, ManyKeysBothTables) {
  // Thousands of keys (probe runs, collisions), keys in and out of the vocabulary mixed.
  std::mt19937_64 rng(11);
  for (const uint64_t high_bit : {uint64_t{0}, uint64_t{1} << 40}) {
    SCOPED_TRACE(high_bit ? "wide" : "narrow");
    std::vector<uint64_t> vocab;
    std::unordered_map<uint64_t, bool> seen;
    while (vocab.size() < 5000) {
      const uint64_t k = rng() & 0xFFFFFFF0u;  // below 2^32 - 1
      if (seen.emplace(k, true).second) vocab.push_back(k);
    }
    vocab.push_back(high_bit | 3);  // wide: one key past 32 bits sends it to the general table
    std::vector<uint64_t> keys;
    for (int i = 0; i < 20000; ++i)
      keys.push_back(i % 3 == 0 ? (rng() & 0xFFFFFFFFu) : vocab[rng() % vocab.size()]);
    keys.push_back(high_bit | 3);
    expect_ids(vocab, keys);
  }
}

TEST(CategorifyEncodeTest, BucketsAfterTheNarrowTable) {
  // num_buckets: out-of-vocabulary keys go to 2 + V + hash % B, the same with either table
  // (the wide vocabulary differs only by a key that none of the probes below holds).
  const std::vector<uint64_t> keys = {9, 10, 11, 0xFFFFFFFFu, uint64_t{1} << 33, 5};
  auto narrow = fitted_categorify({5, 6}, 4);
  std::vector<int64_t> a(keys.size()), b(keys.size());
  narrow->encode(keys.data(), static_cast<int64_t>(keys.size()), a.data());
  EXPECT_EQ(a.back(), 2);
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    EXPECT_GE(a[i], 4) << keys[i];
    EXPECT_LT(a[i], 8) << keys[i];
  }
  auto wide = fitted_categorify({5, 6, ~uint64_t{0}}, 4);
  wide->encode(keys.data(), static_cast<int64_t>(keys.size()), b.data());
  for (size_t i = 0; i + 1 < keys.size(); ++i) EXPECT_EQ(b[i] - 1, a[i]) << keys[i];  // V + 1
  EXPECT_EQ(b.back(), 2);
}

std::unique_ptr<CategoricalEncoder> unfitted_categorify(int64_t freq_threshold) {
  auto op = OpRegistry::global().create({{"op", "Categorify"}, {"freq_threshold", freq_threshold}},
                                        "test", /*fitted=*/false);
  auto* enc = dynamic_cast<CategoricalEncoder*>(op.get());
  EXPECT_NE(enc, nullptr);
  op.release();
  return std::unique_ptr<CategoricalEncoder>(enc);
}

// The vocabulary of `keys` by a plain count: keys seen at least `threshold` times, the most
// frequent first, ties by ascending key.
std::vector<uint64_t> vocab_by_count(const std::vector<uint64_t>& keys, int64_t threshold) {
  std::map<uint64_t, int64_t> count;
  for (uint64_t k : keys) ++count[k];
  std::vector<std::pair<int64_t, uint64_t>> kept;
  for (const auto& [k, n] : count)
    if (n >= threshold) kept.emplace_back(-n, k);
  std::sort(kept.begin(), kept.end());
  std::vector<uint64_t> v;
  for (const auto& e : kept) v.push_back(e.second);
  return v;
}

// Fits `keys` in chunks of `chunk` keys and returns the fitted vocabulary.
std::vector<uint64_t> fitted_vocab(const std::vector<uint64_t>& keys, int64_t chunk,
                                   int64_t threshold) {
  auto enc = unfitted_categorify(threshold);
  enc->fit_begin();
  for (size_t i = 0; i < keys.size(); i += static_cast<size_t>(chunk))
    enc->fit_chunk(keys.data() + i,
                   std::min<int64_t>(chunk, static_cast<int64_t>(keys.size() - i)));
  enc->fit_end();
  return enc->to_json()["vocab"].get<std::vector<uint64_t>>();
}

TEST(CategorifyFitTest, NarrowCountsThenWideKeysGiveThePlainCount) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> narrow;
  for (int i = 0; i < 30000; ++i) narrow.push_back(rng() % 3000);  // repeats: counts > 1
  for (const uint64_t wide : {uint64_t{0xFFFFFFFFu}, uint64_t{1} << 32, ~uint64_t{0}}) {
    SCOPED_TRACE(wide);
    // The wider key in the middle of a chunk (the rest of the chunk and the later chunks are
    // counted in the general table, on top of the narrow counts), and as the very first key.
    std::vector<uint64_t> keys = narrow;
    keys.insert(keys.begin() + 10001, {wide, wide, 7});
    for (const int64_t chunk : {int64_t{4096}, int64_t{1}, int64_t{100000}})
      EXPECT_EQ(fitted_vocab(keys, chunk, 2), vocab_by_count(keys, 2)) << "chunk " << chunk;
    keys.insert(keys.begin(), wide);
    EXPECT_EQ(fitted_vocab(keys, 4096, 1), vocab_by_count(keys, 1));
  }
  EXPECT_EQ(fitted_vocab(narrow, 4096, 3), vocab_by_count(narrow, 3));  // narrow only
  EXPECT_EQ(fitted_vocab({}, 4096, 1), std::vector<uint64_t>{});
}

TEST(CategorifyFitTest, PartialFitsFromTheNarrowTableAddUp) {
  // Part A counted in the narrow table, part B with a wide key; B's saved counts added to A's
  // and A's to B's both give the fit of all keys.
  std::mt19937_64 rng(9);
  std::vector<uint64_t> a, b;
  for (int i = 0; i < 5000; ++i) a.push_back(rng() % 700);
  for (int i = 0; i < 5000; ++i) b.push_back(i == 2500 ? uint64_t{1} << 40 : rng() % 900);
  std::vector<uint64_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  const std::vector<uint64_t> want = vocab_by_count(all, 2);
  for (const bool a_first : {true, false}) {
    auto x = unfitted_categorify(2), y = unfitted_categorify(2);
    ASSERT_TRUE(x->partial_fit_mergeable());
    x->fit_begin();
    y->fit_begin();
    x->fit_chunk((a_first ? a : b).data(), 5000);
    y->fit_chunk((a_first ? b : a).data(), 5000);
    std::string saved;
    y->save_partial_fit(saved);
    x->add_partial_fit(saved.data(), saved.size());
    x->fit_end();
    EXPECT_EQ(x->to_json()["vocab"].get<std::vector<uint64_t>>(), want) << a_first;
  }
}

}  // namespace
}  // namespace dlrec::etl
