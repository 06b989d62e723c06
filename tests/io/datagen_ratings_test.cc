// `dlrec datagen --schema ratings` (io::generate_ratings): the ratings log and its side tables.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "dlrec/io/datagen.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::io {
namespace {

using dlrec::testing::expect_error;
using dlrec::testing::read_all;
using dlrec::testing::TempDir;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::stringstream s(text);
  for (std::string l; std::getline(s, l);) v.push_back(l);
  return v;
}

RatingsConfig small() {
  RatingsConfig c;
  c.rows = 20000;
  c.users = 500;
  c.items = 300;
  return c;
}

TEST(DatagenRatings, WritesTheLogAndBothSideTables) {
  TempDir dir("ratings_files");
  RatingsConfig c = small();
  c.comment_lines = 2;
  const RatingsResult r = generate_ratings(c, dir.path + "/out");
  const auto log = lines_of(read_all(r.ratings));
  ASSERT_EQ(log.size(), 2u + 1 + 20000);
  EXPECT_EQ(log[0].substr(0, 2), "# ");
  EXPECT_EQ(log[1].substr(0, 2), "# ");
  EXPECT_EQ(log[2], "user,item,rating,timestamp");
  int positives = 0;
  std::set<std::string> items_in_log;
  for (size_t i = 3; i < log.size(); ++i) {
    std::stringstream s(log[i]);
    std::string u, it, rating, ts;
    std::getline(s, u, ',');
    std::getline(s, it, ',');
    std::getline(s, rating, ',');
    std::getline(s, ts, ',');
    ASSERT_EQ(u[0], 'u') << log[i];
    ASSERT_EQ(it[0], 'i') << log[i];
    const int v = std::stoi(rating);
    ASSERT_TRUE(v >= 1 && v <= 5) << log[i];
    positives += v > 3;
    items_in_log.insert(it);
    ASSERT_GE(std::stoll(ts), 1700000000);
  }
  EXPECT_NEAR(static_cast<double>(positives) / 20000, r.positive_rate, 1e-12);
  const auto users = lines_of(read_all(r.users));
  EXPECT_EQ(users[0], "user,age,country");
  EXPECT_EQ(users.size(), 1u + 500);
  // One item in missing_item_every is left out of items.csv (the left join's missing values),
  // though the log rates it.
  const auto items = lines_of(read_all(r.items));
  EXPECT_EQ(items[0], "item,category,price");
  EXPECT_EQ(items.size(), 1u + 300 - 3);
  EXPECT_EQ(read_all(r.items).find("\ni99,"), std::string::npos);
  EXPECT_TRUE(items_in_log.count("i99") || items_in_log.count("i199") || items_in_log.count("i299"));
  // A signal worth learning, computed on the rows written.
  EXPECT_GT(r.signal_auc, 0.7);
  EXPECT_LT(r.signal_auc, 0.9);
  EXPECT_NEAR(r.signal_auc_last_tenth, r.signal_auc, 0.03);
}

TEST(DatagenRatings, SameSeedSameBytes) {
  TempDir dir("ratings_seed");
  const RatingsConfig c = small();
  generate_ratings(c, dir.path + "/a");
  generate_ratings(c, dir.path + "/b");
  RatingsConfig other = c;
  other.seed = 7;
  generate_ratings(other, dir.path + "/c");
  for (const char* f : {"/ratings.csv", "/users.csv", "/items.csv"}) {
    EXPECT_EQ(read_all(dir.path + "/a" + f), read_all(dir.path + "/b" + f)) << f;
    EXPECT_NE(read_all(dir.path + "/a" + f), read_all(dir.path + "/c" + f)) << f;
  }
}

TEST(DatagenRatings, BadConfigsAreErrors) {
  TempDir dir("ratings_bad");
  RatingsConfig c = small();
  c.rows = 0;
  expect_error([&] { generate_ratings(c, dir.path); }, {"rows must be >= 1"});
  c = small();
  c.users = 0;
  expect_error([&] { generate_ratings(c, dir.path); }, {"users and items"});
  c = small();
  c.missing_item_every = 1;
  expect_error([&] { generate_ratings(c, dir.path); }, {"missing_item_every"});
  c = small();
  c.comment_lines = -1;
  expect_error([&] { generate_ratings(c, dir.path); }, {"comment_lines"});
}

}  // namespace
}  // namespace dlrec::io
