#include "dlrec/io/text_reader.h"
#include "test_files.h"

#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "../src/io/text_line_parser.h"

namespace dlrec::io {
namespace {

using ::testing::HasSubstr;

// A fresh directory per test under the gtest temp dir.
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string d = ::testing::TempDir() + "/dlrec_io_" + info->test_suite_name() + "_" +
                  info->name() + "_" + std::to_string(::getpid());
  make_dirs(d);
  return d;
}

using dlrec::testing::write_file;

// A Criteo line: label, 13 dense, 26 categorical; the fields are given as text.
std::string criteo_line(const std::string& label, std::vector<std::string> dense,
                        std::vector<std::string> cats) {
  dense.resize(13);
  cats.resize(26);
  std::string s = label;
  for (auto& d : dense) s += "\t" + d;
  for (auto& c : cats) s += "\t" + c;
  return s;
}

// A valid Criteo line whose I1 holds `tag` (used to check the order of rows).
std::string tagged_line(int64_t tag) {
  std::vector<std::string> cats(26, "");
  cats[0] = "0000abcd";
  cats[3] = "68fd1e64";
  return criteo_line(tag % 3 == 0 ? "1" : "0", {std::to_string(tag), "-1", "", "3"}, cats);
}

RawChunk read_all(const std::vector<std::string>& files, const Schema& schema,
                  ReadOptions opt = {}, ReadStats* stats = nullptr) {
  TextReader reader(files, schema, opt);
  RawChunk all, chunk;
  all.reset(schema.num_dense(), schema.num_cat());
  while (reader.next(chunk)) {
    EXPECT_GT(chunk.rows, 0);
    EXPECT_LE(chunk.rows, opt.chunk_rows);
    all.append(chunk);
  }
  if (stats) *stats = reader.stats();
  return all;
}

std::string read_error(const std::vector<std::string>& files, const Schema& schema,
                       ReadOptions opt = {}) {
  try {
    read_all(files, schema, opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<uint64_t> cats_of(const RawChunk& c, int col, int64_t row) {
  return std::vector<uint64_t>(c.cat_values[col].begin() + c.cat_offsets[col][row],
                               c.cat_values[col].begin() + c.cat_offsets[col][row + 1]);
}

TEST(TextReader, CriteoRoundTrip) {
  auto dir = test_dir();
  std::vector<std::string> cats1(26, "deadbeef");
  cats1[1] = "";
  cats1[25] = "00000001";
  std::string text = criteo_line("1", {"5", "-3", "", "1000000"}, cats1) + "\n" +
                     criteo_line("0", {"", "", "", "", "", "", "", "", "", "", "", "", "7"},
                                 {"FFFFFFFF", "0", "ffffffffffffffff"}) +
                     "\n";
  auto f = write_file(dir, "a.tsv", text);
  ReadStats st;
  RawChunk c = read_all({f}, Schema::criteo(), {}, &st);
  ASSERT_EQ(c.rows, 2);
  EXPECT_EQ(st.rows, 2);
  EXPECT_EQ(st.bytes, static_cast<int64_t>(text.size()));
  EXPECT_EQ(c.first_line, 1);
  EXPECT_EQ(c.label, (std::vector<float>{1, 0}));
  ASSERT_EQ(c.dense.size(), 26u);
  EXPECT_EQ(c.dense[0], 5);
  EXPECT_EQ(c.dense[1], -3);
  EXPECT_TRUE(is_missing(c.dense[2]));
  EXPECT_EQ(c.dense[3], 1000000);
  EXPECT_TRUE(is_missing(c.dense[4]));
  EXPECT_TRUE(is_missing(c.dense[13]));
  EXPECT_EQ(c.dense[13 + 12], 7);
  EXPECT_EQ(cats_of(c, 0, 0), std::vector<uint64_t>{0xdeadbeef});
  EXPECT_TRUE(cats_of(c, 1, 0).empty());
  EXPECT_EQ(cats_of(c, 25, 0), std::vector<uint64_t>{1});
  EXPECT_EQ(cats_of(c, 0, 1), std::vector<uint64_t>{0xffffffffull});
  EXPECT_EQ(cats_of(c, 1, 1), std::vector<uint64_t>{0});
  EXPECT_EQ(cats_of(c, 2, 1), std::vector<uint64_t>{~0ull});
  EXPECT_TRUE(cats_of(c, 3, 1).empty());
}

TEST(TextReader, DecimalsAndSigns) {
  Schema s = Schema::criteo(6, 0);
  RawChunk c;
  std::vector<int> map = field_mapping(s, "", "x");
  std::string line = "0\t1.5\t-2.25\t+7\t1e3\t.5\t-0";
  parse_line(line.data(), line.data() + line.size(), s, map, c, "x:1");
  ASSERT_EQ(c.rows, 1);
  EXPECT_EQ(c.dense, (std::vector<float>{1.5f, -2.25f, 7, 1000, 0.5f, 0}));
}

TEST(TextReader, CsvHeaderReorderedQuotedMultiHot) {
  auto dir = test_dir();
  Schema s = Schema::from_json(json::parse(R"({
    "format": "csv", "list_sep": "|",
    "columns": [{"name": "clicked", "kind": "label"},
                {"name": "price", "kind": "dense"},
                {"name": "city", "kind": "categorical"},
                {"name": "tags", "kind": "categorical", "multi_hot": true},
                {"name": "age", "kind": "dense"}]})"));
  // File order differs from the schema's, and has a column the schema does not name.
  std::string text =
      "\xEF\xBB\xBF" "city,age,comment,tags,clicked,price\r\n"
      "\"New York, NY\",31,\"said \"\"hi\"\"\",a|b|c,1,9.99\r\n"
      "Paris,,,,0,\r\n"
      "\"\",40,x,\"solo\",0,-1\r\n";
  auto f = write_file(dir, "a.csv", text);
  RawChunk c = read_all({f}, s);
  ASSERT_EQ(c.rows, 3);
  EXPECT_EQ(c.first_line, 2);
  EXPECT_EQ(c.label, (std::vector<float>{1, 0, 0}));
  // dense columns in schema order: price, age
  EXPECT_FLOAT_EQ(c.dense[0], 9.99f);
  EXPECT_EQ(c.dense[1], 31);
  EXPECT_TRUE(is_missing(c.dense[2]));
  EXPECT_TRUE(is_missing(c.dense[3]));
  EXPECT_EQ(c.dense[4], -1);
  EXPECT_EQ(c.dense[5], 40);
  EXPECT_EQ(cats_of(c, 0, 0), std::vector<uint64_t>{hash_category("New York, NY")});
  EXPECT_EQ(cats_of(c, 0, 1), std::vector<uint64_t>{hash_category("Paris")});
  EXPECT_TRUE(cats_of(c, 0, 2).empty());  // "" is missing
  EXPECT_EQ(cats_of(c, 1, 0), (std::vector<uint64_t>{hash_category("a"), hash_category("b"),
                                                     hash_category("c")}));
  EXPECT_TRUE(cats_of(c, 1, 1).empty());
  EXPECT_EQ(cats_of(c, 1, 2), std::vector<uint64_t>{hash_category("solo")});
}

TEST(TextReader, CsvHeaderErrors) {
  Schema s = Schema::from_json(json::parse(R"({"format": "csv",
    "columns": [{"name": "label", "kind": "label"}, {"name": "price", "kind": "dense"},
                {"name": "unused", "kind": "skip"}]})"));
  try {
    field_mapping(s, "label,prize", "p.csv");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("p.csv:1: the header has no column 'price' (did you mean "
                                    "'prize'?)"));
  }
  EXPECT_THROW(field_mapping(s, "label,price,price", "p.csv"), Error);
  // Skip columns need not be present; unknown header columns are ignored (-1).
  EXPECT_EQ(field_mapping(s, "x,price,label", "p.csv"), (std::vector<int>{-1, 1, 0}));
  EXPECT_EQ(field_mapping(s, "\"price\",label", "p.csv"), (std::vector<int>{1, 0}));
  EXPECT_THROW(field_mapping(s, "\"price,label", "p.csv"), Error);
}

TEST(TextReader, MultiHotHex) {
  auto dir = test_dir();
  Schema s = Schema::criteo(1, 2);
  s.columns[3].multi_hot = true;
  auto f = write_file(dir, "m.tsv", "1\t3\tab\t1,2,ff\n0\t\t\t\n1\t4\tcd\t10\n0\t\tef\t7,,8\n");
  RawChunk c = read_all({f}, s);
  ASSERT_EQ(c.rows, 4);
  EXPECT_EQ(cats_of(c, 1, 0), (std::vector<uint64_t>{1, 2, 0xff}));
  EXPECT_TRUE(cats_of(c, 1, 1).empty());
  EXPECT_TRUE(cats_of(c, 0, 1).empty());
  EXPECT_EQ(cats_of(c, 1, 2), (std::vector<uint64_t>{0x10}));
  EXPECT_EQ(cats_of(c, 1, 3), (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(cats_of(c, 0, 3), (std::vector<uint64_t>{0xef}));
}

TEST(TextReader, EmptyAndHeaderOnlyFiles) {
  auto dir = test_dir();
  Schema csv = Schema::from_json(json::parse(
      R"({"format": "csv", "columns": [{"name": "y", "kind": "label"}, {"name": "x", "kind": "dense"}]})"));
  std::vector<std::string> files = {write_file(dir, "empty.tsv", "")};
  ReadStats st;
  RawChunk c = read_all(files, Schema::criteo(), {}, &st);
  EXPECT_EQ(c.rows, 0);
  EXPECT_EQ(st.rows, 0);
  EXPECT_EQ(read_all({write_file(dir, "empty.csv", "")}, csv).rows, 0);
  EXPECT_EQ(read_all({write_file(dir, "h1.csv", "y,x\n")}, csv).rows, 0);
  EXPECT_EQ(read_all({write_file(dir, "h2.csv", "y,x")}, csv).rows, 0);
  EXPECT_EQ(read_all({write_file(dir, "h3.csv", "x,y\r\n")}, csv).rows, 0);
  // Blank lines carry no rows; a last line without newline is fine when complete.
  RawChunk d = read_all({write_file(dir, "b.csv", "x,y\n\n1,0\n\r\n2,1")}, csv);
  ASSERT_EQ(d.rows, 2);
  EXPECT_EQ(d.dense, (std::vector<float>{1, 2}));
  EXPECT_EQ(d.label, (std::vector<float>{0, 1}));
}

TEST(TextReader, WindowsLineEndings) {
  auto dir = test_dir();
  auto f = write_file(dir, "w.tsv", tagged_line(1) + "\r\n" + tagged_line(2) + "\r\n");
  RawChunk c = read_all({f}, Schema::criteo());
  ASSERT_EQ(c.rows, 2);
  EXPECT_EQ(c.dense[13], 2);
  // The last categorical column is empty: a '\r' must not end up in it.
  EXPECT_TRUE(cats_of(c, 25, 1).empty());
}

// ---- errors: exact file, line and column ----------------------------------------------------

struct ErrorCase {
  const char* what;
  std::string bad_line;
  std::string expected;  // after "<file>:3: "
};

TEST(TextReader, ErrorsNameFileLineAndColumn) {
  auto dir = test_dir();
  std::vector<std::string> cats(26, "1234abcd");
  auto good = criteo_line("0", {"1", "2"}, cats);
  std::vector<std::string> bad_hex = cats;
  bad_hex[0] = "xyz";
  std::vector<std::string> long_hex = cats;
  long_hex[2] = "12345678901234567";
  std::string fields39 = good.substr(0, good.rfind('\t'));
  std::vector<ErrorCase> cases = {
      {"39 fields", fields39, "expected 40 fields, got 39"},
      {"41 fields", good + "\t", "expected 40 fields, got 41"},
      {"non-hex", criteo_line("0", {"1"}, bad_hex),
       "column 15 (C1): 'xyz' is not a hexadecimal category"},
      {"17 hex digits", criteo_line("0", {"1"}, long_hex),
       "column 17 (C3): '12345678901234567' is not a hexadecimal category (more than 16 digits)"},
      {"bad integer", criteo_line("0", {"1", "12a"}, cats), "column 3 (I2): '12a' is not a number"},
      {"label 2", criteo_line("2", {"1"}, cats), "column 1 (label): label must be 0 or 1, got '2'"},
      {"missing label", criteo_line("", {"1"}, cats), "column 1 (label): the label is missing"},
      {"nan", criteo_line("0", {"nan"}, cats), "column 2 (I1): 'nan' is not a finite number"},
      {"inf", criteo_line("1", {"1", "2", "-inf"}, cats),
       "column 4 (I3): '-inf' is not a finite number"},
      {"huge", criteo_line("1", {"1e999"}, cats), "column 2 (I1): '1e999' is out of range"},
      {"space", criteo_line("1", {" 1"}, cats), "column 2 (I1): ' 1' is not a number"},
  };
  for (const auto& c : cases) {
    auto f = write_file(dir, "e.tsv", good + "\n" + good + "\n" + c.bad_line + "\n" + good + "\n");
    EXPECT_EQ(read_error({f}, Schema::criteo()), f + ":3: " + c.expected) << c.what;
  }
}

TEST(TextReader, TruncatedFile) {
  auto dir = test_dir();
  std::string text;
  for (int i = 1; i <= 5; ++i) text += tagged_line(i) + "\n";
  text += tagged_line(6).substr(0, 20);  // the file ends in the middle of row 6
  auto f = write_file(dir, "cut.tsv", text);
  std::string msg = read_error({f}, Schema::criteo());
  EXPECT_THAT(msg, HasSubstr(f + ":6: expected 40 fields, got "));
  EXPECT_THAT(msg, HasSubstr("(the last line is truncated: no newline at end of file)"));
  // Cut inside the last field: the field count is right, so the row is accepted as is.
  auto g = write_file(dir, "cut2.tsv", tagged_line(1) + "\n" + tagged_line(2));
  EXPECT_EQ(read_all({g}, Schema::criteo()).rows, 2);
}

TEST(TextReader, SkipModeCountsBadRows) {
  auto dir = test_dir();
  std::string text;
  std::vector<int> bad = {4, 9, 10, 17};
  for (int i = 1; i <= 20; ++i) {
    if (std::find(bad.begin(), bad.end(), i) != bad.end())
      text += criteo_line("0", {"x"}, {}) + "\n";
    else
      text += tagged_line(i) + "\n";
  }
  auto f = write_file(dir, "s.tsv", text);
  ReadOptions opt;
  opt.on_error = OnError::Skip;
  opt.chunk_rows = 6;
  ReadStats st;
  RawChunk c = read_all({f}, Schema::criteo(), opt, &st);
  EXPECT_EQ(c.rows, 16);
  EXPECT_EQ(st.rows, 16);
  EXPECT_EQ(st.skipped_rows, 4);
  EXPECT_EQ(st.first_skip_reason, f + ":4: column 2 (I1): 'x' is not a number");
  EXPECT_EQ(st.bytes, static_cast<int64_t>(text.size()));
  int r = 0;
  for (int i = 1; i <= 20; ++i) {
    if (std::find(bad.begin(), bad.end(), i) != bad.end()) continue;
    EXPECT_EQ(c.dense[r * 13], i);
    ++r;
  }
  EXPECT_EQ(parse_on_error("skip"), OnError::Skip);
  EXPECT_EQ(parse_on_error("fail"), OnError::Fail);
  EXPECT_THROW(parse_on_error("skp"), Error);
}

// Tiny blocks and several threads: rows keep their order and errors their exact line.
TEST(TextReader, LineNumbersExactAcrossBlocksAndThreads) {
  auto dir = test_dir();
  const int n = 3000;
  std::string text;
  for (int i = 1; i <= n; ++i) text += tagged_line(i) + (i % 7 == 0 ? "\r\n" : "\n");
  auto f = write_file(dir, "big.tsv", text);
  for (int threads : {1, 2, 3, 4}) {
    set_num_threads(threads);
    for (size_t block : {size_t{64}, size_t{1000}, size_t{1} << 20}) {
      ReadOptions opt;
      opt.block_bytes = block;
      opt.chunk_rows = 1100;
      TextReader reader({f}, Schema::criteo(), opt);
      RawChunk c;
      int64_t expect = 1;
      while (reader.next(c)) {
        ASSERT_LE(c.rows, 1100);
        EXPECT_EQ(c.first_line, expect);
        for (int64_t r = 0; r < c.rows; ++r) ASSERT_EQ(c.dense[r * 13], expect + r);
        expect += c.rows;
      }
      EXPECT_EQ(expect, n + 1) << threads << " threads, block " << block;
      EXPECT_EQ(reader.stats().bytes, static_cast<int64_t>(text.size()));
    }
    // An error deep in the file, and a second one later: the first is reported.
    std::string bad = text;
    size_t at = 0;
    for (int i = 1; i < 2777; ++i) at = bad.find('\n', at) + 1;
    bad.insert(at, "1\t2\n");  // now line 2777 has 2 fields
    size_t at2 = bad.rfind('\n', bad.size() - 2) + 1;
    bad.insert(at2, "zz\n");
    auto g = write_file(dir, "bad.tsv", bad);
    ReadOptions opt;
    opt.block_bytes = 100;
    EXPECT_EQ(read_error({g}, Schema::criteo(), opt), g + ":2777: expected 40 fields, got 2")
        << threads << " threads";
    opt.on_error = OnError::Skip;
    ReadStats st;
    RawChunk c = read_all({g}, Schema::criteo(), opt, &st);
    EXPECT_EQ(c.rows, n);
    EXPECT_EQ(st.skipped_rows, 2);
    EXPECT_EQ(st.first_skip_reason, g + ":2777: expected 40 fields, got 2");
  }
  set_num_threads(0);
}

TEST(TextReader, MaxRowsAndSeveralFiles) {
  auto dir = test_dir();
  std::string a, b;
  for (int i = 1; i <= 10; ++i) a += tagged_line(i) + "\n";
  for (int i = 11; i <= 25; ++i) b += tagged_line(i) + "\n";
  auto fa = write_file(dir, "a.tsv", a), fb = write_file(dir, "b.tsv", b);
  RawChunk all = read_all({fa, fb}, Schema::criteo());
  ASSERT_EQ(all.rows, 25);
  for (int r = 0; r < 25; ++r) EXPECT_EQ(all.dense[r * 13], r + 1);
  ReadOptions opt;
  opt.max_rows = 13;
  opt.chunk_rows = 4;
  ReadStats st;
  EXPECT_EQ(read_all({fa, fb}, Schema::criteo(), opt, &st).rows, 13);
  EXPECT_EQ(st.rows, 13);
  // Line numbers restart in each file; the message names the file.
  auto fc = write_file(dir, "c.tsv", tagged_line(1) + "\n" + "1\t2\n");
  EXPECT_EQ(read_error({fa, fc}, Schema::criteo()), fc + ":2: expected 40 fields, got 2");
  EXPECT_THAT(read_error({dir + "/nope.tsv"}, Schema::criteo()),
              HasSubstr("cannot open '" + dir + "/nope.tsv'"));
}

TEST(TextReader, ParseLineThrowsWithWhere) {
  Schema s = Schema::criteo(2, 1);
  std::vector<int> map = field_mapping(s, "", "req");
  RawChunk c;
  std::string good = "1\t2\t\tab12\n", bad = "1\t2\t3\tq";
  parse_line(good.data(), good.data() + good.size(), s, map, c, "req:1");
  EXPECT_EQ(c.rows, 1);
  try {
    parse_line(bad.data(), bad.data() + bad.size(), s, map, c, "request 7");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "request 7: column 4 (C1): 'q' is not a hexadecimal category");
  }
  // The failed line left the chunk as it was.
  EXPECT_EQ(c.rows, 1);
  EXPECT_EQ(c.dense.size(), 2u);
  EXPECT_EQ(c.cat_values[0].size(), 1u);
  EXPECT_EQ(c.cat_offsets[0].size(), 2u);
}

TEST(TextReader, QuotedFieldErrors) {
  Schema s;
  s.columns = {{"a", ColumnKind::Dense, false}, {"b", ColumnKind::Categorical, false}};
  s.delimiter = ',';
  s.cat_encoding = CatEncoding::String;
  std::vector<int> map = field_mapping(s, "", "q");
  RawChunk c;
  auto parse = [&](const std::string& line) {
    try {
      parse_line(line.data(), line.data() + line.size(), s, map, c, "q:1");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("ok");
  };
  EXPECT_EQ(parse("\"1\",x"), "ok");
  EXPECT_EQ(parse("2,\"a,\"\"b\"\"\""), "ok");
  ASSERT_EQ(c.rows, 2);
  EXPECT_EQ(c.dense, (std::vector<float>{1, 2}));
  EXPECT_EQ(cats_of(c, 0, 1), std::vector<uint64_t>{hash_category("a,\"b\"")});
  EXPECT_THAT(parse("1,\"x\"y"),
              ::testing::StartsWith("q:1: column 2 (b): unexpected character after the closing "
                                    "quote"));
  EXPECT_THAT(parse("1,\"xy"),
              ::testing::StartsWith("q:1: column 2 (b): unterminated quoted field"));
  EXPECT_EQ(parse("\"1.5e\",x"), "q:1: column 1 (a): '1.5e' is not a number");
  EXPECT_EQ(parse("1,x,\"y\""), "q:1: expected 2 fields, got 3");
  EXPECT_EQ(c.rows, 2);
}

// The real Criteo sample, when the shared data is present.
TEST(TextReader, CriteoSample) {
  const std::string path = DLREC_SOURCE_DIR "/../shared/data/criteo/day_0.part.tsv";
  if (!file_exists(path)) GTEST_SKIP() << path << " is absent";
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    ReadOptions opt;
    opt.chunk_rows = 3000;
    opt.block_bytes = 1 << 16;
    ReadStats st;
    RawChunk c = read_all({path}, Schema::criteo(), opt, &st);
    ASSERT_EQ(c.rows, 10000);
    EXPECT_EQ(st.skipped_rows, 0);
    EXPECT_EQ(st.bytes, static_cast<int64_t>(file_size(path)));
    double pos = 0;
    for (float l : c.label) pos += l;
    EXPECT_EQ(pos, 265);
    // First row: 1 5 110 <missing> 16 ... C1 = 62770d79, C26 = ed10571d.
    EXPECT_EQ(c.dense[0], 5);
    EXPECT_EQ(c.dense[1], 110);
    EXPECT_TRUE(is_missing(c.dense[2]));
    EXPECT_EQ(c.dense[3], 16);
    EXPECT_EQ(cats_of(c, 0, 0), std::vector<uint64_t>{0x62770d79});
    EXPECT_EQ(cats_of(c, 25, 0), std::vector<uint64_t>{0xed10571d});
    // Every present category is a 32-bit hash.
    for (int col = 0; col < 26; ++col)
      for (uint64_t v : c.cat_values[col]) ASSERT_LE(v, 0xffffffffull);
  }
  set_num_threads(0);
}

// transpose64 against the bit-by-bit definition, on random matrices.
TEST(TextParse, Transpose64) {
  uint64_t state = 7;
  for (int n = 0; n < 20; ++n) {
    uint64_t a[64], t[64];
    for (auto& x : a) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      x = state ^ (state << 17);
    }
    std::copy(a, a + 64, t);
    text_detail::transpose64(t);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 64; ++c) ASSERT_EQ((t[c] >> r) & 1, (a[r] >> c) & 1) << r << " " << c;
  }
}

// Lines that take the fast path with deferred offsets, mixed with lines the general parser
// takes (a decimal, a quoted key) and with bad lines that the fast path rolls back after some
// of their keys were appended (a bad key late in the line, too few fields): one chunk parsed
// line after line with one Scratch and finished at the end equals the lines parsed one by
// one (parse_line: finished after each line), value for value and offset for offset.
TEST(TextParse, DeferredOffsetsMatchLineByLine) {
  const Schema s = Schema::criteo();
  const std::vector<int> map = field_mapping(s, "", "x");
  text_detail::LineParser parser(s, map);
  ASSERT_TRUE(parser.deferred_offsets());
  uint64_t state = 99;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  std::vector<std::string> lines;
  std::vector<std::vector<std::string>> keys;  // each line's categorical fields
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::string> cats(26);
    for (auto& c : cats) {
      const uint64_t k = next();
      char buf[32];
      if (k % 4 == 0) continue;  // missing
      std::snprintf(buf, sizeof buf, k % 7 == 1 ? "%llx" : "%08llx",
                    static_cast<unsigned long long>(k % 7 == 1 ? k * 977 : k & 0xffffffffu));
      c = buf;
    }
    std::vector<std::string> dense = {std::to_string(i), "", "-4"};
    const uint64_t kind = next() % 16;
    if (kind == 0) dense[1] = "2.5";                    // the general path
    if (kind == 1) cats[20] = "\"" + cats[20] + "\"";   // a quote: the general path
    if (kind == 2) cats[17] = "zz";                     // bad key after 17 columns
    std::string line = criteo_line(next() % 2 ? "1" : "0", dense, cats);
    if (kind == 3) line = line.substr(0, line.rfind('\t'));  // 39 fields
    lines.push_back(line);
    keys.push_back(cats);
  }
  RawChunk chunk, want;
  chunk.reset(s.num_dense(), s.num_cat());
  want.reset(s.num_dense(), s.num_cat());
  text_detail::LineParser::Scratch scratch;
  text_detail::LineError err;
  int bad = 0;
  // The keys of the lines taken, from their text (not from the parser).
  std::vector<std::vector<uint64_t>> values(26);
  std::vector<std::vector<int64_t>> offsets(26, std::vector<int64_t>{0});
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    const bool ok = parser.parse(l.data(), l.data() + l.size(), chunk, scratch, err);
    for (int c = 0; ok && c < 26; ++c) {
      std::string k = keys[i][c];
      k.erase(std::remove(k.begin(), k.end(), '"'), k.end());
      if (!k.empty()) values[c].push_back(std::stoull(k, nullptr, 16));
      offsets[c].push_back(static_cast<int64_t>(values[c].size()));
    }
    RawChunk one;
    bool ok_one = true;
    try {
      parse_line(l.data(), l.data() + l.size(), s, map, one, "x");
    } catch (const Error&) {
      ok_one = false;
    }
    ASSERT_EQ(ok, ok_one) << l;
    if (ok_one) want.append(one);
    bad += !ok;
  }
  parser.finish(chunk, scratch);
  EXPECT_GT(bad, 300);
  EXPECT_TRUE(scratch.pending.empty());
  ASSERT_EQ(chunk.rows, want.rows);
  EXPECT_EQ(chunk.label, want.label);
  ASSERT_EQ(chunk.dense.size(), want.dense.size());
  for (size_t i = 0; i < chunk.dense.size(); ++i)
    ASSERT_TRUE(chunk.dense[i] == want.dense[i] || (is_missing(chunk.dense[i]) && is_missing(want.dense[i])));
  EXPECT_EQ(chunk.cat_values, values);
  EXPECT_EQ(chunk.cat_offsets, offsets);
  EXPECT_EQ(want.cat_values, values);
  EXPECT_EQ(want.cat_offsets, offsets);
}

// A chunk of fast-path lines only gets RawChunk::CatFacts from finish(): each column's count,
// its presence bits (bit r: row r has a value, over several 64-row words and a partial one) and
// the narrow columns (a key of 2^32 or more clears a column's bit, also one of a line rolled
// back after it). A line of the general path, a cut or reset() leave no facts to use.
TEST(TextParse, FinishRecordsTheFactsOfAFastPathChunk) {
  const Schema s = Schema::criteo();
  const std::vector<int> map = field_mapping(s, "", "x");
  text_detail::LineParser parser(s, map);
  ASSERT_TRUE(parser.deferred_offsets());
  RawChunk chunk;
  chunk.reset(s.num_dense(), s.num_cat());
  text_detail::LineParser::Scratch scratch;
  text_detail::LineError err;
  const int rows = 200;
  for (int i = 0; i < rows + 1; ++i) {
    std::vector<std::string> cats(26);
    for (int c = 0; c < 26; ++c) {
      if ((i + c) % (c % 5 + 2) == 0) continue;  // missing
      char buf[32];
      std::snprintf(buf, sizeof buf, c == 3 ? "%x" : "%08x", static_cast<unsigned>(i * 977 + c));
      cats[c] = buf;
    }
    if (i == 70) cats[5] = "123456789";   // 9 digits: column 5 is wide
    if (i == 120) cats[9] = "ffffffff";   // the largest narrow key
    if (i == rows) {                      // a wide key in column 7, then a bad key: rolled back
      cats[7] = "abcdef012";
      cats[20] = "zz";
    }
    const std::string l = criteo_line("1", {std::to_string(i)}, cats);
    ASSERT_EQ(parser.parse(l.data(), l.data() + l.size(), chunk, scratch, err), i < rows) << i;
    if (i == 10) EXPECT_EQ(chunk.facts(), nullptr);  // not before finish()
  }
  parser.finish(chunk, scratch);  // (the bad line's general parse finished the rows already)
  const RawChunk::CatFacts* f = chunk.facts();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->rows, rows);
  const int64_t words = (rows + 63) / 64;
  for (int c = 0; c < 26; ++c) {
    EXPECT_EQ(f->counts[c], static_cast<int64_t>(chunk.cat_values[c].size())) << c;
    for (int64_t r = 0; r < words * 64; ++r) {
      const bool has = r < rows && chunk.cat_offsets[c][r + 1] > chunk.cat_offsets[c][r];
      ASSERT_EQ((f->present[c * words + r / 64] >> (r % 64)) & 1, has ? 1u : 0u) << c << " " << r;
    }
    EXPECT_EQ((f->narrow >> c) & 1, c == 5 || c == 7 ? 0u : 1u) << c;
  }
  RawChunk copy = chunk;
  EXPECT_NE(copy.facts(), nullptr);
  copy.rows -= 1;  // a cut
  EXPECT_EQ(copy.facts(), nullptr);
  copy = chunk;
  copy.cat_values[4].pop_back();  // a count that no longer matches
  EXPECT_EQ(copy.facts(), nullptr);
  copy.reset(s.num_dense(), s.num_cat());
  EXPECT_EQ(copy.facts(), nullptr);

  // A general-path line (a decimal) after the fast ones: the chunk's facts no longer hold, and
  // a later finish() over fast lines that do not start the chunk records none.
  std::vector<std::string> cats(26, "0000abcd");
  const std::string general = criteo_line("0", {"2.5"}, cats);
  const std::string fast = criteo_line("0", {"2"}, cats);
  ASSERT_TRUE(parser.parse(general.data(), general.data() + general.size(), chunk, scratch, err));
  EXPECT_EQ(chunk.facts(), nullptr);
  ASSERT_TRUE(parser.parse(fast.data(), fast.data() + fast.size(), chunk, scratch, err));
  parser.finish(chunk, scratch);
  EXPECT_EQ(chunk.rows, rows + 2);
  EXPECT_EQ(chunk.facts(), nullptr);
}

// A layout whose rows may hold several values in a column (multi-hot) keeps the offsets as
// it goes; rows left pending for one chunk are refused for another, and finish() refuses a
// chunk that is not theirs or whose row count no longer fits them.
TEST(TextParse, DeferredOffsetsOnlyWhereTheyHoldAndMisuseIsAnError) {
  Schema multi = Schema::criteo(2, 2);
  multi.columns.back().multi_hot = true;
  EXPECT_FALSE(text_detail::LineParser(multi, field_mapping(multi, "", "x")).deferred_offsets());
  const Schema s = Schema::criteo(2, 2);
  const std::vector<int> map = field_mapping(s, "", "x");
  text_detail::LineParser parser(s, map);
  ASSERT_TRUE(parser.deferred_offsets());
  const std::string line = "1\t3\t\tdeadbeef\t";
  RawChunk a, b;
  a.reset(2, 2);
  b.reset(2, 2);
  text_detail::LineParser::Scratch scratch;
  text_detail::LineError err;
  ASSERT_TRUE(parser.parse(line.data(), line.data() + line.size(), a, scratch, err));
  EXPECT_THAT([&] { parser.parse(line.data(), line.data() + line.size(), b, scratch, err); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rows of another chunk wait for finish()")));
  EXPECT_THAT([&] { parser.finish(b, scratch); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the pending rows are another chunk's")));
  a.rows = 5;  // rows added behind the parser's back
  EXPECT_THAT([&] { parser.finish(a, scratch); },
              ::testing::ThrowsMessage<Error>(HasSubstr("pending rows for a chunk of 5 rows")));
  a.rows = 1;
  parser.finish(a, scratch);
  EXPECT_EQ(a.cat_offsets[0], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(a.cat_offsets[1], (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(a.cat_values[0], std::vector<uint64_t>{0xdeadbeef});
}

}  // namespace
}  // namespace dlrec::io
