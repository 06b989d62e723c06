// Categorify's frequency summary (stats.json "frequency", for the planner's hybrid embedding):
// ids are numbered by descending count (ties by ascending key), so the values below each bound
// are a prefix sum of the sorted counts; the same after a fit split in parts and merged (the
// multi-process ETL), with max_size, with num_buckets, and absent for a joint vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

std::unique_ptr<CategoricalEncoder> make(const json& spec) {
  auto op = OpRegistry::global().create(spec, "test", /*fitted=*/false);
  auto* enc = dynamic_cast<CategoricalEncoder*>(op.get());
  EXPECT_NE(enc, nullptr);
  op.release();
  return std::unique_ptr<CategoricalEncoder>(enc);
}

// Power-law keys: key k (0..999) with probability ~ 1 / (k + 1), shuffled key values.
std::vector<uint64_t> keys_of(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys;
  for (int i = 0; i < n; ++i) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto k = static_cast<uint64_t>(std::pow(1000.0, u)) - 1;
    keys.push_back(k * 7919 % 1009 + 5);  // distinct, not in frequency order
  }
  return keys;
}

// The summary as it must be: the counts sorted descending (ties by key) after ids 0 and 1.
void expect_summary(const json& f, const std::vector<uint64_t>& keys, int64_t max_size,
                    int64_t num_buckets, int64_t freq_threshold = 0) {
  std::map<uint64_t, int64_t> count;
  for (uint64_t k : keys) ++count[k];
  std::vector<std::pair<int64_t, uint64_t>> kept;
  for (auto [k, c] : count)
    if (c >= std::max<int64_t>(1, freq_threshold)) kept.push_back({c, k});
  std::sort(kept.begin(), kept.end(), [](auto a, auto b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (max_size > 0 && static_cast<int64_t>(kept.size()) > max_size) kept.resize(max_size);
  const int64_t values = static_cast<int64_t>(keys.size());
  int64_t in_vocab = 0;
  for (auto& kc : kept) in_vocab += kc.first;
  // Per id: its values (id 1: out of vocabulary, unless buckets take them).
  std::vector<int64_t> per_id = {0, num_buckets > 0 ? 0 : values - in_vocab};
  for (auto& kc : kept) per_id.push_back(kc.first);
  const int64_t vocab_end = static_cast<int64_t>(per_id.size());
  ASSERT_TRUE(f.is_object()) << f.dump();
  EXPECT_EQ(f.at("values").get<int64_t>(), values);
  const auto ids = f.at("ids").get<std::vector<int64_t>>();
  const auto below = f.at("values_below").get<std::vector<int64_t>>();
  ASSERT_EQ(ids.size(), below.size());
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids.back(), vocab_end + num_buckets);  // the cardinality
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) {
      EXPECT_GT(ids[i], ids[i - 1]);
    }
    int64_t want = 0;
    for (int64_t id = 0; id < std::min(ids[i], vocab_end); ++id) want += per_id[id];
    if (ids[i] > vocab_end) want = values;
    EXPECT_EQ(below[i], want) << "ids below " << ids[i];
  }
  // About two bounds per doubling: compact.
  EXPECT_LE(ids.size(), 2 * static_cast<size_t>(std::log2(double(vocab_end + num_buckets))) + 3);
}

json fit(const json& spec, const std::vector<std::vector<uint64_t>>& parts) {
  auto first = make(spec);
  first->fit_begin();
  first->fit_chunk(parts[0].data(), static_cast<int64_t>(parts[0].size()));
  for (size_t p = 1; p < parts.size(); ++p) {  // as fit_merge does: partial fits added in order
    auto other = make(spec);
    other->fit_begin();
    other->fit_chunk(parts[p].data(), static_cast<int64_t>(parts[p].size()));
    EXPECT_TRUE(other->partial_fit_mergeable());
    std::string bytes;
    other->save_partial_fit(bytes);
    first->add_partial_fit(bytes.data(), bytes.size());
  }
  first->fit_end();
  return first->fit_summary();
}

TEST(CategorifyFrequency, SummaryIsThePrefixSumOfTheSortedCounts) {
  const std::vector<uint64_t> keys = keys_of(20000, 1);
  const json spec = {{"op", "Categorify"}};
  const json s = fit(spec, {keys});
  expect_summary(s.at("frequency"), keys, 0, 0);
  // The ids are in that order: the most frequent key is id 2.
  std::map<uint64_t, int64_t> count;
  for (uint64_t k : keys) ++count[k];
  uint64_t top = 0;
  int64_t most = 0;
  for (auto [k, c] : count)
    if (c > most) most = c, top = k;
  auto enc = make(spec);
  enc->fit_begin();
  enc->fit_chunk(keys.data(), static_cast<int64_t>(keys.size()));
  enc->fit_end();
  int64_t id = -1;
  enc->encode(&top, 1, &id);
  EXPECT_EQ(id, 2);
  // The frequent prefix holds most values (power law): ids < 64 hold more than half.
  const auto ids = s["frequency"]["ids"].get<std::vector<int64_t>>();
  const auto below = s["frequency"]["values_below"].get<std::vector<int64_t>>();
  bool checked = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != 64) continue;
    EXPECT_GT(below[i] * 2, static_cast<int64_t>(keys.size()));
    checked = true;
  }
  EXPECT_TRUE(checked);
}

TEST(CategorifyFrequency, MergedPartsGiveTheSameSummary) {
  const std::vector<uint64_t> keys = keys_of(9000, 2);
  const std::vector<std::vector<uint64_t>> parts = {{keys.begin(), keys.begin() + 1000},
                                                    {keys.begin() + 1000, keys.begin() + 5000},
                                                    {keys.begin() + 5000, keys.end()}};
  const json spec = {{"op", "Categorify"}, {"freq_threshold", 2}};
  EXPECT_EQ(fit(spec, {keys}).dump(), fit(spec, parts).dump());
  expect_summary(fit(spec, parts).at("frequency"), keys, 0, 0, 2);
}

TEST(CategorifyFrequency, MaxSizeAndBuckets) {
  const std::vector<uint64_t> keys = keys_of(5000, 3);
  expect_summary(fit({{"op", "Categorify"}, {"max_size", 50}}, {keys}).at("frequency"), keys, 50,
                 0);
  expect_summary(
      fit({{"op", "Categorify"}, {"max_size", 50}, {"num_buckets", 16}}, {keys}).at("frequency"),
      keys, 50, 16);
}

TEST(CategorifyFrequency, NoSummaryWithoutAFit) {
  // A workflow loaded fitted (workflow.json) has its vocabulary but no counts.
  auto op = OpRegistry::global().create({{"op", "Categorify"}, {"vocab", {5, 7}}}, "test", true);
  const json s = op->fit_summary();
  EXPECT_FALSE(s.is_object() && s.contains("frequency")) << s.dump();
}

}  // namespace
}  // namespace dlrec::etl
