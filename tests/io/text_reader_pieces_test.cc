// TextReader on mapped files: many small pieces parsed ahead by the reader's threads and handed
// out in input order (io::ReadOptions::parse_ahead). Rows, line numbers, errors, skipped rows and
// the max_rows cut must be what a line-by-line parse gives, whatever the thread count, the window
// and the order in which the pieces happen to finish.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/text_reader.h"
#include "test_files.h"

namespace dlrec::io {
namespace {

std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string d = ::testing::TempDir() + "/dlrec_pieces_" + info->name() + "_" +
                  std::to_string(::getpid());
  make_dirs(d);
  return d;
}

using dlrec::testing::write_file;

// A valid Criteo line whose I1 holds `tag`, and (varying the line length) a category whose
// length depends on it.
std::string tagged_line(int64_t tag) {
  std::string s = tag % 3 == 0 ? "1" : "0";
  s += "\t" + std::to_string(tag) + "\t-1\t\t3";
  for (int i = 4; i < 13; ++i) s += "\t";
  for (int c = 0; c < 26; ++c) {
    s += "\t";
    if (c == 0) s += "0000abcd";
    if (c == 5) s += std::string(1 + tag % 11, 'f');
  }
  return s;
}

const std::string kBadLine = "0\t1\t2";  // 3 fields instead of 40

struct Threads {
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(0); }
};

// Reads everything; checks that rows come in order with exact first lines. `tag_of_line`
// gives the I1 tag of each 1-based line (0: no row there).
struct ReadResult {
  int64_t rows = 0, chunks = 0;
  std::vector<int64_t> tags;
  ReadStats stats;
  std::string error;
};

ReadResult read_tags(const std::string& file, ReadOptions opt,
                     const std::vector<int64_t>& line_of_tag = {}) {
  ReadResult res;
  try {
    TextReader reader({file}, Schema::criteo(), opt);
    RawChunk c;
    while (reader.next(c)) {
      EXPECT_GT(c.rows, 0);
      ++res.chunks;
      for (int64_t r = 0; r < c.rows; ++r) {
        const auto tag = static_cast<int64_t>(c.dense[r * 13]);
        if (r == 0 && !line_of_tag.empty()) {
          EXPECT_EQ(c.first_line, line_of_tag[tag]) << "first row of a chunk, tag " << tag;
        }
        res.tags.push_back(tag);
      }
      res.rows += c.rows;
    }
    res.stats = reader.stats();
  } catch (const Error& e) {
    res.error = e.what();
  }
  return res;
}

// Lines 1..n tagged 1..n, with blank lines after every 10th (line numbers keep counting).
struct Text {
  std::string text;
  std::vector<int64_t> line_of_tag{0};
  int64_t lines = 0;
  void add(const std::string& l, int64_t tag = 0) {
    text += l + "\n";
    ++lines;
    if (tag > 0) line_of_tag.push_back(lines);
  }
};
Text tagged_text(int n, const std::vector<int>& bad_before = {}) {
  Text t;
  for (int i = 1; i <= n; ++i) {
    for (int b : bad_before)
      if (b == i) t.add(kBadLine);
    t.add(tagged_line(i), i);
    if (i % 10 == 0) t.add("");
  }
  return t;
}

TEST(TextReaderPieces, ManyPiecesInOrder) {
  const int n = 6000;
  Text t = tagged_text(n);
  auto f = write_file(test_dir(), "many.tsv", t.text);
  for (int threads : {1, 2, 3, 8}) {
    Threads th(threads);
    for (int ahead : {1, 2, 5, 64, 0}) {
      ReadOptions opt;
      opt.chunk_rows = 37;  // ~180 pieces
      opt.parse_ahead = ahead;
      ReadResult r = read_tags(f, opt, t.line_of_tag);
      ASSERT_EQ(r.error, "");
      ASSERT_EQ(r.rows, n) << threads << " threads, ahead " << ahead;
      for (int i = 0; i < n; ++i) ASSERT_EQ(r.tags[i], i + 1);
      EXPECT_GT(r.chunks, 100);
      EXPECT_EQ(r.stats.rows, n);
      EXPECT_EQ(r.stats.bytes, static_cast<int64_t>(t.text.size()));
      EXPECT_EQ(r.stats.skipped_rows, 0);
    }
  }
}

TEST(TextReaderPieces, FirstErrorInInputOrderFromLatePieces) {
  const int n = 6000;
  // Bad lines before tags 5100 and 5900: with ~37 rows a piece they lie in late pieces, and
  // the later one may well be parsed first.
  Text t = tagged_text(n, {5100, 5900});
  auto f = write_file(test_dir(), "bad.tsv", t.text);
  const int64_t bad_line = t.line_of_tag[5100] - 1;
  for (int threads : {1, 2, 4, 8}) {
    Threads th(threads);
    for (int ahead : {1, 3, 64}) {
      ReadOptions opt;
      opt.chunk_rows = 37;
      opt.parse_ahead = ahead;
      ReadResult r = read_tags(f, opt, t.line_of_tag);
      EXPECT_EQ(r.error, f + ":" + std::to_string(bad_line) + ": expected 40 fields, got 3")
          << threads << " threads, ahead " << ahead;
      // The chunks before the failing piece came, in order, and none after the bad line.
      ASSERT_LT(r.rows, 5100);
      EXPECT_GT(r.rows, 5000);
      for (int64_t i = 0; i < r.rows; ++i) ASSERT_EQ(r.tags[i], i + 1);
      // A cut before the first bad line: no error; at it, the error.
      opt.max_rows = 5099;
      r = read_tags(f, opt);
      EXPECT_EQ(r.error, "");
      EXPECT_EQ(r.rows, 5099);
      EXPECT_EQ(r.tags.back(), 5099);
      opt.max_rows = 5100;
      EXPECT_NE(read_tags(f, opt).error, "");
      // Skip mode: both skipped, the first named.
      opt.max_rows = -1;
      opt.on_error = OnError::Skip;
      r = read_tags(f, opt, t.line_of_tag);
      EXPECT_EQ(r.error, "");
      EXPECT_EQ(r.rows, n);
      EXPECT_EQ(r.stats.skipped_rows, 2);
      EXPECT_EQ(r.stats.first_skip_reason,
                f + ":" + std::to_string(bad_line) + ": expected 40 fields, got 3");
      EXPECT_EQ(r.stats.bytes, static_cast<int64_t>(t.text.size()));
    }
  }
}

TEST(TextReaderPieces, MaxRowsCut) {
  const int n = 3000;
  Text t = tagged_text(n);
  auto f = write_file(test_dir(), "cut.tsv", t.text);
  for (int threads : {1, 3, 8}) {
    Threads th(threads);
    for (int64_t max_rows : {int64_t{1}, int64_t{36}, int64_t{37}, int64_t{38}, int64_t{1500},
                             int64_t{2999}, int64_t{3000}, int64_t{5000}}) {
      for (int ahead : {1, 4, 0}) {
        ReadOptions opt;
        opt.chunk_rows = 37;
        opt.parse_ahead = ahead;
        opt.max_rows = max_rows;
        ReadResult r = read_tags(f, opt, t.line_of_tag);
        const int64_t want = std::min<int64_t>(max_rows, n);
        ASSERT_EQ(r.error, "");
        ASSERT_EQ(r.rows, want) << threads << " threads, max_rows " << max_rows;
        EXPECT_EQ(r.stats.rows, want);
        EXPECT_EQ(r.tags.back(), want);
      }
    }
  }
}

// Mostly blank lines: the rows guessed for a piece at its cut (by the average line length) are
// far more than it holds, so the max_rows guard holds back the cut until the counts come in; it
// must not stall.
TEST(TextReaderPieces, MaxRowsWithMisleadingGuesses) {
  Text t;
  const int n = 400;
  for (int i = 1; i <= n; ++i) {
    t.add(tagged_line(i), i);
    for (int k = 0; k < (i > 50 ? 40 : 0); ++k) t.add("");
  }
  auto f = write_file(test_dir(), "blank.tsv", t.text);
  for (int threads : {1, 2, 8}) {
    Threads th(threads);
    for (int64_t max_rows : {int64_t{60}, int64_t{399}, int64_t{1000}}) {
      ReadOptions opt;
      opt.chunk_rows = 16;
      opt.parse_ahead = 3;
      opt.max_rows = max_rows;
      ReadResult r = read_tags(f, opt, t.line_of_tag);
      ASSERT_EQ(r.error, "");
      EXPECT_EQ(r.rows, std::min<int64_t>(max_rows, n));
      for (int64_t i = 0; i < r.rows; ++i) ASSERT_EQ(r.tags[i], i + 1);
    }
  }
}

TEST(TextReaderPieces, SkipModeAcrossManyPieces) {
  const int n = 4000;
  std::vector<int> bad;
  for (int i = 1; i <= n; i += 97) bad.push_back(i);  // the first line too
  Text t = tagged_text(n, bad);
  auto f = write_file(test_dir(), "skip.tsv", t.text);
  for (int threads : {1, 4, 8}) {
    Threads th(threads);
    ReadOptions opt;
    opt.chunk_rows = 29;
    opt.parse_ahead = 5;
    opt.on_error = OnError::Skip;
    ReadResult r = read_tags(f, opt, t.line_of_tag);
    ASSERT_EQ(r.error, "");
    ASSERT_EQ(r.rows, n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(r.tags[i], i + 1);
    EXPECT_EQ(r.stats.skipped_rows, static_cast<int64_t>(bad.size()));
    EXPECT_EQ(r.stats.first_skip_reason, f + ":1: expected 40 fields, got 3");
    // Cut between bad lines: only the bad lines before the last row wanted count.
    opt.max_rows = 1000;  // bad lines before tags 1, 98, ..., 971: 11 of them
    r = read_tags(f, opt);
    EXPECT_EQ(r.rows, 1000);
    EXPECT_EQ(r.stats.skipped_rows, 11);
  }
}

// Several files, and readers dropped part-way while their threads parse ahead.
TEST(TextReaderPieces, SeveralFilesAndEarlyStop) {
  auto dir = test_dir();
  Text a = tagged_text(700), b;
  for (int i = 701; i <= 1500; ++i) b.add(tagged_line(i), i);
  auto fa = write_file(dir, "a.tsv", a.text), fb = write_file(dir, "b.tsv", b.text);
  auto fe = write_file(dir, "empty.tsv", "");
  for (int threads : {1, 3, 8}) {
    Threads th(threads);
    ReadOptions opt;
    opt.chunk_rows = 23;
    opt.parse_ahead = 4;
    TextReader reader({fa, fe, fb}, Schema::criteo(), opt);
    RawChunk c;
    int64_t rows = 0;
    while (reader.next(c)) {
      const auto tag = static_cast<int64_t>(c.dense[0]);
      EXPECT_EQ(tag, rows + 1);
      // Line numbers restart in each file.
      EXPECT_EQ(c.first_line, tag <= 700 ? a.line_of_tag[tag] : tag - 700);
      rows += c.rows;
    }
    EXPECT_EQ(rows, 1500);
    EXPECT_EQ(reader.stats().bytes, static_cast<int64_t>(a.text.size() + b.text.size()));
    for (int stop_after : {0, 1, 5}) {
      TextReader early({fa, fb}, Schema::criteo(), opt);
      for (int k = 0; k < stop_after; ++k) ASSERT_TRUE(early.next(c));
    }  // destroyed with pieces in flight
  }
}

TEST(TextReaderPieces, BadParseAhead) {
  ReadOptions opt;
  opt.parse_ahead = -1;
  try {
    TextReader reader({"x.tsv"}, Schema::criteo(), opt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parse_ahead must be >= 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dlrec::io
