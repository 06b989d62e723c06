#include "dlrec/io/schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bitset>
#include <string>
#include <unordered_set>

#include "dlrec/core/error.h"

namespace dlrec::io {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::string& text) {
  try {
    Schema::from_json(json::parse(text));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_same(const Schema& a, const Schema& b) {
  ASSERT_EQ(a.columns.size(), b.columns.size());
  for (size_t i = 0; i < a.columns.size(); ++i) {
    EXPECT_EQ(a.columns[i].name, b.columns[i].name);
    EXPECT_EQ(a.columns[i].kind, b.columns[i].kind);
    EXPECT_EQ(a.columns[i].multi_hot, b.columns[i].multi_hot);
  }
  EXPECT_EQ(a.delimiter, b.delimiter);
  EXPECT_EQ(a.header, b.header);
  EXPECT_EQ(a.list_sep, b.list_sep);
  EXPECT_EQ(a.cat_encoding, b.cat_encoding);
}

TEST(Schema, Criteo) {
  Schema s = Schema::criteo();
  ASSERT_EQ(s.columns.size(), 40u);
  EXPECT_EQ(s.columns[0].kind, ColumnKind::Label);
  EXPECT_EQ(s.columns[1].name, "I1");
  EXPECT_EQ(s.columns[13].name, "I13");
  EXPECT_EQ(s.columns[14].name, "C1");
  EXPECT_EQ(s.columns[39].name, "C26");
  EXPECT_EQ(s.num_dense(), 13);
  EXPECT_EQ(s.num_cat(), 26);
  EXPECT_TRUE(s.has_label());
  EXPECT_EQ(s.delimiter, '\t');
  EXPECT_FALSE(s.header);
  EXPECT_EQ(s.cat_encoding, CatEncoding::Hex);
  EXPECT_EQ(s.dense_names().front(), "I1");
  EXPECT_EQ(s.cat_names().back(), "C26");
  EXPECT_EQ(s.cat_multi_hot(), std::vector<bool>(26, false));
  Schema small = Schema::criteo(2, 3);
  EXPECT_EQ(small.columns.size(), 6u);
}

TEST(Schema, JsonDefaultsAndRoundTrip) {
  expect_same(Schema::from_json(json::parse(R"({})")), Schema::criteo());
  expect_same(Schema::from_json(json::parse(R"({"format": "criteo"})")), Schema::criteo());
  expect_same(Schema::from_json(json::parse(R"({"num_dense": 2, "num_cat": 3})")),
              Schema::criteo(2, 3));
  Schema c = Schema::criteo(3, 4);
  c.columns[6].multi_hot = true;
  expect_same(Schema::from_json(c.to_json()), c);

  Schema csv = Schema::from_json(json::parse(R"({
    "format": "csv", "list_sep": "|",
    "columns": [{"name": "y", "kind": "label"}, {"name": "id", "kind": "skip"},
                {"name": "price", "kind": "dense"},
                {"name": "tags", "kind": "categorical", "multi_hot": true}]})"));
  EXPECT_EQ(csv.delimiter, ',');
  EXPECT_TRUE(csv.header);
  EXPECT_EQ(csv.list_sep, '|');
  EXPECT_EQ(Schema::from_json(json::parse(R"({"format": "csv", "columns": [{"name": "a"}]})"))
                .list_sep,
            '|');
  EXPECT_EQ(csv.cat_encoding, CatEncoding::String);
  EXPECT_EQ(csv.num_dense(), 1);
  EXPECT_EQ(csv.num_cat(), 1);
  EXPECT_EQ(csv.cat_multi_hot(), std::vector<bool>{true});
  expect_same(Schema::from_json(csv.to_json()), csv);
  // A tab-separated file with a header is "csv" with explicit settings; it round-trips too.
  Schema tsv = csv;
  tsv.delimiter = '\t';
  expect_same(Schema::from_json(tsv.to_json()), tsv);
  expect_same(Schema::from_json(json::parse(
                  R"({"format": "csv", "delimiter": "tab", "columns": [{"name": "a", "kind": "dense"}]})")),
              [] {
                Schema s;
                s.columns = {{"a", ColumnKind::Dense, false}};
                s.delimiter = '\t';
                s.header = true;
                s.list_sep = '|';
                s.cat_encoding = CatEncoding::String;
                return s;
              }());
}

TEST(Schema, StrictJson) {
  EXPECT_THAT(error_of(R"({"format": "criteo", "delimeter": ","})"),
              HasSubstr("unknown config key 'schema.delimeter' (did you mean 'delimiter'?)"));
  EXPECT_THAT(error_of(R"({"format": "csv", "columns": [{"name": "a", "knd": "dense"}]})"),
              HasSubstr("unknown config key 'schema.columns[0].knd'"));
  EXPECT_THAT(error_of(R"({"format": "tsv"})"), HasSubstr("'schema.format' = 'tsv'"));
  EXPECT_THAT(error_of(R"({"format": "csv", "columns": [{"name": "a", "kind": "dens"}]})"),
              HasSubstr("did you mean 'dense'"));
  EXPECT_THAT(error_of(R"({"format": "csv"})"), HasSubstr("'schema.columns' is required"));
  EXPECT_THAT(error_of(R"({"format": "csv", "columns": [{"kind": "dense"}]})"),
              HasSubstr("'schema.columns[0].name' is required"));
  EXPECT_THAT(
      error_of(R"({"format": "csv", "columns": [{"name": "a", "kind": "dense", "multi_hot": true}]})"),
      HasSubstr("only categorical columns can be multi-hot"));
  EXPECT_THAT(error_of(R"({"format": "csv", "columns": [{"name": "a", "kind": "dense"},
                                                       {"name": "a", "kind": "dense"}]})"),
              HasSubstr("'a' appears twice"));
  EXPECT_THAT(error_of(R"({"format": "csv", "columns": [{"name": "a", "kind": "label"},
                                                       {"name": "b", "kind": "label"}]})"),
              HasSubstr("more than one label"));
  EXPECT_THAT(error_of(R"({"delimiter": ",,"})"), HasSubstr("must be one character"));
  EXPECT_EQ(error_of(R"({"delimiter": ","})"), "(no error)");
  EXPECT_THAT(error_of(R"({"format": "csv", "list_sep": ",", "columns": [
                           {"name": "t", "kind": "categorical", "multi_hot": true}]})"),
              HasSubstr("needs list_sep to differ from the delimiter"));
  EXPECT_THAT(error_of(R"({"format": "csv", "num_cat": 3, "columns": [{"name": "a"}]})"),
              HasSubstr("unknown config key 'schema.num_cat'"));
  EXPECT_THAT(error_of(R"({"num_cat": 3, "columns": [{"name": "a"}]})"),
              HasSubstr("cannot be combined"));
  EXPECT_THAT(error_of(R"({"header": "yes"})"), HasSubstr("'schema.header' has the wrong type"));
  EXPECT_THAT(error_of(R"({"cat_encoding": "hexa"})"), HasSubstr("did you mean 'hex'"));
}

TEST(HashCategory, FrozenValues) {
  // These values are part of the on-disk contract (vocabularies are keyed by them).
  EXPECT_EQ(hash_category(""), hash_category(std::string_view()));
  const uint64_t a = hash_category("a"), abc = hash_category("abc"),
                 long_s = hash_category("the quick brown fox jumps over the lazy dog");
  EXPECT_EQ(a, 0x289ACD24FA5BBD54ull);
  EXPECT_EQ(abc, 0x4545B0ECAC3CBD7Cull);
  EXPECT_EQ(long_s, 0x30DC73CAD930B397ull);
}

TEST(HashCategory, DistinguishesAndMixes) {
  EXPECT_NE(hash_category("a"), hash_category(std::string("a\0", 2)));
  EXPECT_NE(hash_category("ab"), hash_category("ba"));
  EXPECT_NE(hash_category("12345678a"), hash_category("12345678b"));
  EXPECT_NE(hash_category("abcdefgh12345678"), hash_category("12345678abcdefgh"));
  // No collisions among many similar strings.
  std::unordered_set<uint64_t> seen;
  for (int i = 0; i < 200000; ++i) seen.insert(hash_category("user_" + std::to_string(i)));
  EXPECT_EQ(seen.size(), 200000u);
  // Avalanche: flipping one input bit flips about half of the output bits.
  double flipped = 0;
  int trials = 0;
  for (int i = 0; i < 200; ++i) {
    std::string s = "key" + std::to_string(i * 7919);
    const uint64_t h = hash_category(s);
    for (size_t byte = 0; byte < s.size(); ++byte)
      for (int bit = 0; bit < 8; ++bit) {
        std::string t = s;
        t[byte] = static_cast<char>(t[byte] ^ (1 << bit));
        flipped += std::bitset<64>(h ^ hash_category(t)).count();
        ++trials;
      }
  }
  EXPECT_NEAR(flipped / trials, 32.0, 1.0);
  // Low bits are uniform (tables index by h % size).
  std::vector<int> buckets(16, 0);
  for (int i = 0; i < 16000; ++i) ++buckets[hash_category(std::to_string(i)) & 15];
  for (int b : buckets) EXPECT_NEAR(b, 1000, 150);
}

}  // namespace
}  // namespace dlrec::io
