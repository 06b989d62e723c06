#include "dlrec/io/datagen.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::io {
namespace {

using ::testing::HasSubstr;

std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string d = ::testing::TempDir() + "/dlrec_io_" + info->test_suite_name() + "_" +
                  info->name() + "_" + std::to_string(::getpid());
  make_dirs(d);
  return d;
}

std::string generate_string(const DatagenConfig& c, DatagenResult* res = nullptr) {
  std::ostringstream os;
  DatagenResult r = generate(c, os);
  if (res) *res = r;
  return os.str();
}

RawChunk read_back(const std::string& path, const Schema& schema) {
  TextReader reader({path}, schema);
  RawChunk all, chunk;
  all.reset(schema.num_dense(), schema.num_cat());
  while (reader.next(chunk)) all.append(chunk);
  return all;
}

double auc_of(std::vector<std::pair<double, int>> v) {
  std::sort(v.begin(), v.end());
  double neg = 0, pos = 0, sum = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    double gp = 0, gn = 0;
    for (; j < v.size() && v[j].first == v[i].first; ++j) (v[j].second ? gp : gn) += 1;
    sum += gp * (neg + 0.5 * gn);
    neg += gn;
    pos += gp;
    i = j;
  }
  return sum / (pos * neg);
}

TEST(Datagen, DeterministicAcrossThreadCounts) {
  DatagenConfig c;
  c.rows = 20000;  // several blocks
  c.seed = 7;
  c.num_multi_hot = 2;
  set_num_threads(1);
  DatagenResult r1;
  const std::string one = generate_string(c, &r1);
  set_num_threads(3);
  DatagenResult r3;
  const std::string three = generate_string(c, &r3);
  set_num_threads(0);
  EXPECT_EQ(one, three);
  EXPECT_EQ(r1.signal_auc, r3.signal_auc);
  EXPECT_EQ(r1.positive_rate, r3.positive_rate);
  EXPECT_EQ(r1.bytes, static_cast<int64_t>(one.size()));
  EXPECT_EQ(generate_string(c), one);
  c.seed = 8;
  EXPECT_NE(generate_string(c), one);
  // A prefix of the rows does not depend on the total: rows are made in fixed blocks.
  c.seed = 7;
  c.rows = 9000;
  const std::string prefix = generate_string(c);
  EXPECT_EQ(one.compare(0, prefix.size(), prefix), 0);
}

TEST(Datagen, ReadsBackWithExpectedShapeAndRates) {
  auto dir = test_dir();
  DatagenConfig c;
  c.rows = 60000;
  c.seed = 3;
  c.dense_missing = 0.2;
  c.cat_missing = 0.05;
  c.base_ctr = 0.3;
  const std::string path = dir + "/g.tsv";
  DatagenResult res = generate_file(c, path);
  EXPECT_EQ(res.rows, c.rows);
  EXPECT_EQ(res.bytes, static_cast<int64_t>(file_size(path)));
  // Every line has 40 tab-separated fields and categories are 8 hex digits.
  {
    std::ifstream in(path);
    std::string line;
    int64_t lines = 0;
    while (std::getline(in, line) && lines < 2000) {
      ++lines;
      ASSERT_EQ(std::count(line.begin(), line.end(), '\t'), 39) << line;
      size_t pos = 0;
      for (int f = 0; f < 14; ++f) pos = line.find('\t', pos) + 1;
      const std::string c1 = line.substr(pos, line.find('\t', pos) - pos);
      if (!c1.empty()) {
        EXPECT_EQ(c1.size(), 8u);
        EXPECT_EQ(c1.find_first_not_of("0123456789abcdef"), std::string::npos);
      }
    }
  }
  RawChunk ch = read_back(path, c.schema());
  ASSERT_EQ(ch.rows, c.rows);
  double pos = 0, dense_missing = 0, cat_missing = 0, negatives = 0;
  for (float l : ch.label) pos += l;
  for (float v : ch.dense) dense_missing += is_missing(v), negatives += v < 0;
  for (int col = 0; col < 26; ++col)
    for (int64_t r = 0; r < ch.rows; ++r)
      cat_missing += ch.cat_offsets[col][r] == ch.cat_offsets[col][r + 1];
  EXPECT_NEAR(pos / c.rows, res.positive_rate, 1e-12);
  EXPECT_NEAR(res.positive_rate, 0.3, 0.02);
  EXPECT_NEAR(dense_missing / (13.0 * c.rows), 0.2, 0.006);
  EXPECT_NEAR(cat_missing / (26.0 * c.rows), 0.05, 0.003);
  EXPECT_GT(negatives, 0);  // like Criteo's I2
  // All dense values are integers.
  for (float v : ch.dense) {
    if (!is_missing(v)) {
      ASSERT_EQ(v, std::floor(v));
    }
  }
  // Cardinalities hold: column C9 (cardinality 3) and C20 (4).
  for (int col : {8, 19}) {
    std::map<uint64_t, int> distinct;
    for (uint64_t v : ch.cat_values[col]) ++distinct[v];
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), c.cardinality(col)) << "C" << col + 1;
  }
  EXPECT_GT(res.signal_auc, 0.74);
  EXPECT_LT(res.signal_auc, 0.88);
}

TEST(Datagen, FrequenciesFollowAPowerLaw) {
  DatagenConfig c;
  c.rows = 50000;
  c.num_dense = 0;
  c.num_cat = 2;
  c.cardinalities = {100000, 50};
  c.cat_missing = 0;
  auto dir = test_dir();
  generate_file(c, dir + "/z.tsv");
  RawChunk ch = read_back(dir + "/z.tsv", c.schema());
  std::unordered_map<uint64_t, int> counts;
  for (uint64_t v : ch.cat_values[0]) ++counts[v];
  std::vector<int> sorted;
  for (auto& kv : counts) sorted.push_back(kv.second);
  std::sort(sorted.rbegin(), sorted.rend());
  const int top = sorted[0], median = sorted[sorted.size() / 2];
  EXPECT_GT(top, 50 * median) << "top " << top << " median " << median;
  // Zipf(1.1) over 1e5 ranks: rank 1 holds 1 / sum_k k^-1.1 of the mass, rank 2 2^-1.1 of that.
  double z = 0;
  for (int k = 1; k <= 100000; ++k) z += std::pow(k, -1.1);
  EXPECT_NEAR(top / 50000.0, 1 / z, 0.01);
  EXPECT_NEAR(static_cast<double>(sorted[1]) / top, std::pow(2.0, -1.1), 0.05);
  EXPECT_GT(counts.size(), 5000u);  // a long tail of rare categories
  // Small column: all 50 values, the most frequent first.
  std::unordered_map<uint64_t, int> small;
  for (uint64_t v : ch.cat_values[1]) ++small[v];
  EXPECT_EQ(small.size(), 50u);
}

TEST(Datagen, MultiHotColumns) {
  DatagenConfig c;
  c.rows = 5000;
  c.num_multi_hot = 3;
  c.max_hotness = 3;
  c.cat_missing = 0.1;
  auto dir = test_dir();
  generate_file(c, dir + "/m.tsv");
  Schema s = c.schema();
  EXPECT_EQ(s.cat_multi_hot(), [] {
    std::vector<bool> v(26, false);
    v[23] = v[24] = v[25] = true;
    return v;
  }());
  RawChunk ch = read_back(dir + "/m.tsv", s);
  ASSERT_EQ(ch.rows, c.rows);
  std::map<int64_t, int> lengths;
  for (int col = 23; col < 26; ++col)
    for (int64_t r = 0; r < ch.rows; ++r)
      ++lengths[ch.cat_offsets[col][r + 1] - ch.cat_offsets[col][r]];
  EXPECT_EQ(lengths.size(), 4u);  // 0 (missing), 1, 2, 3
  EXPECT_EQ(lengths.begin()->first, 0);
  EXPECT_EQ(lengths.rbegin()->first, 3);
  EXPECT_NEAR(lengths[0] / (3.0 * c.rows), 0.1, 0.02);
  for (int64_t r = 0; r < ch.rows; ++r)
    ASSERT_EQ(ch.cat_offsets[0][r + 1] - ch.cat_offsets[0][r] <= 1, true);
}

TEST(Datagen, SignalStrength) {
  DatagenConfig c;
  c.rows = 30000;
  c.signal_strength = 0;
  DatagenResult none;
  generate_string(c, &none);
  EXPECT_NEAR(none.signal_auc, 0.5, 0.02);
  EXPECT_NEAR(none.positive_rate, c.base_ctr, 0.015);
  c.signal_strength = 2;
  DatagenResult strong;
  generate_string(c, &strong);
  c.signal_strength = 1;
  DatagenResult normal;
  generate_string(c, &normal);
  EXPECT_GT(strong.signal_auc, normal.signal_auc + 0.03);
  EXPECT_NEAR(strong.positive_rate, c.base_ctr, 0.02);
  c.base_ctr = 0.03;
  DatagenResult rare;
  generate_string(c, &rare);
  EXPECT_NEAR(rare.positive_rate, 0.03, 0.005);
}

// The planted signal is learnable: logistic regression on hashed one-hot features, trained on
// one seed for one pass, ranks the rows of another seed far above chance.
TEST(Datagen, SignalIsLearnable) {
  auto dir = test_dir();
  DatagenConfig c;
  c.rows = 150000;
  c.seed = 1;
  generate_file(c, dir + "/train.tsv");
  DatagenConfig v = c;
  v.seed = 2;
  v.rows = 30000;
  DatagenResult vres = generate_file(v, dir + "/valid.tsv");
  const int kBuckets = 1 << 21;
  std::vector<float> w(kBuckets, 0), g2(kBuckets, 0);
  auto features = [&](const RawChunk& ch, int64_t r, std::vector<uint32_t>& f) {
    f.clear();
    for (int col = 0; col < ch.num_cat; ++col)
      for (int64_t o = ch.cat_offsets[col][r]; o < ch.cat_offsets[col][r + 1]; ++o)
        f.push_back(static_cast<uint32_t>(
            ((ch.cat_values[col][o] + 0x100000000ull * (col + 1)) * 0x9E3779B97F4A7C15ull) >> 43));
    for (int d = 0; d < ch.num_dense; ++d) {
      float x = ch.dense[r * ch.num_dense + d];
      int b = is_missing(x) ? 99 : static_cast<int>(std::log1p(std::max(x, 0.f)) * 4);
      f.push_back(static_cast<uint32_t>(((d + 1) * 1000003ull + b) * 0x9E3779B97F4A7C15ull >> 43));
    }
  };
  std::vector<uint32_t> f;
  double bias = 0;
  RawChunk ch = read_back(dir + "/train.tsv", c.schema());
  for (int64_t r = 0; r < ch.rows; ++r) {
    features(ch, r, f);
    double z = bias;
    for (uint32_t i : f) z += w[i];
    const double g = 1 / (1 + std::exp(-z)) - ch.label[r];
    bias -= 0.01 * g;
    for (uint32_t i : f) {
      g2[i] += static_cast<float>(g * g);
      w[i] -= static_cast<float>(0.05 * g / std::sqrt(g2[i] + 0.01));
    }
  }
  RawChunk vc = read_back(dir + "/valid.tsv", c.schema());
  std::vector<std::pair<double, int>> scored;
  for (int64_t r = 0; r < vc.rows; ++r) {
    features(vc, r, f);
    double z = bias;
    for (uint32_t i : f) z += w[i];
    scored.emplace_back(z, static_cast<int>(vc.label[r]));
  }
  const double auc = auc_of(scored);
  EXPECT_GT(auc, 0.74) << "ceiling " << vres.signal_auc;
  EXPECT_LE(auc, vres.signal_auc + 0.01);
}

TEST(Datagen, ConfigJson) {
  DatagenConfig c = DatagenConfig::from_json(json::parse(
      R"({"rows": 123, "seed": 9, "num_dense": 2, "num_cat": 3, "cardinalities": [10, 20],
          "zipf_s": 1.3, "num_multi_hot": 1, "max_hotness": 2, "base_ctr": 0.1})"));
  EXPECT_EQ(c.rows, 123);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.cardinality(0), 10);
  EXPECT_EQ(c.cardinality(2), 20);  // shorter lists repeat their last value
  EXPECT_DOUBLE_EQ(c.zipf_s, 1.3);
  DatagenConfig d = DatagenConfig::from_json(c.to_json());
  EXPECT_EQ(d.to_json(), c.to_json());
  EXPECT_EQ(DatagenConfig::from_json(json::object()).to_json(), DatagenConfig().to_json());
  EXPECT_EQ(DatagenConfig().cardinalities.size(), 26u);
  auto err = [](const char* text) {
    try {
      DatagenConfig::from_json(json::parse(text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_THAT(err(R"({"rowz": 5})"), HasSubstr("unknown config key 'datagen.rowz' (did you mean 'rows'?)"));
  EXPECT_THAT(err(R"({"base_ctr": 1.5})"), HasSubstr("'datagen.base_ctr' = 1.5 is out of range"));
  EXPECT_THAT(err(R"({"cardinalities": [0]})"), HasSubstr("cardinalities"));
  EXPECT_THAT(err(R"({"num_cat": 2, "num_multi_hot": 3})"), HasSubstr("num_multi_hot"));
  EXPECT_THAT(err(R"({"seed": -1})"), HasSubstr("non-negative integer"));
  // The generated schema matches the config.
  Schema s = c.schema();
  EXPECT_EQ(s.num_dense(), 2);
  EXPECT_EQ(s.num_cat(), 3);
  EXPECT_EQ(s.cat_multi_hot(), (std::vector<bool>{false, false, true}));
}

TEST(Datagen, TinyAndEmpty) {
  DatagenConfig c;
  c.rows = 0;
  DatagenResult r;
  EXPECT_EQ(generate_string(c, &r), "");
  EXPECT_EQ(r.rows, 0);
  c.rows = 1;
  c.num_dense = 0;
  c.num_cat = 1;
  c.cardinalities = {1};
  std::string one = generate_string(c, &r);
  EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 1);
  EXPECT_EQ(r.rows, 1);
}

}  // namespace
}  // namespace dlrec::io
