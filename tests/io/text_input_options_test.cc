// Text input options: the schema's comment prefix and skip_lines, a UTF-8 byte order mark, and
// RFC 4180 quoting (quoted delimiters and doubled quotes read; malformed quotes are errors
// naming file, line and column) — on mapped files and on streams (a FIFO).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "dlrec/core/file_util.h"
#include "dlrec/io/text_reader.h"
#include "test_errors.h"

namespace dlrec::io {
namespace {

namespace fs = std::filesystem;
using dlrec::testing::error_of;
using dlrec::testing::expect_error;

struct Scratch {
  std::string dir;
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = ::testing::TempDir() + "dlrec_textopt_" + info->name() + "_" + std::to_string(::getpid());
    fs::remove_all(dir);
    make_dirs(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
    return dir + "/" + name;
  }
};

// user (categorical), rating (dense); CSV with a header.
Schema csv_schema(const std::string& extra = "") {
  return Schema::from_json(json::parse(R"({"format": "csv")" + extra + R"(, "columns": [
      {"name": "user", "kind": "categorical"}, {"name": "rating", "kind": "dense"}]})"));
}

// Every row of `path`, read as a mapped file and, through a FIFO, as a stream; both must agree.
RawChunk read_both(const Scratch& s, const std::string& path, const Schema& schema) {
  auto read = [&](const std::string& p) {
    TextReader r({p}, schema, ReadOptions{2});  // chunks of 2 rows: several pieces
    RawChunk all, c;
    all.reset(schema.num_dense(), schema.num_cat());
    while (r.next(c)) all.append(c);
    return all;
  };
  RawChunk mapped = read(path);
  const std::string fifo = s.dir + "/fifo";
  fs::remove(fifo);
  EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ifstream in(path, std::ios::binary);
    std::ofstream out(fifo, std::ios::binary);
    out << in.rdbuf();
  });
  RawChunk streamed;
  try {
    streamed = read(fifo);
  } catch (...) {
    // The writer may still wait for a reader to open the FIFO: give it one, then wait for it.
    const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    writer.join();
    if (fd >= 0) ::close(fd);
    throw;
  }
  writer.join();
  EXPECT_EQ(mapped.rows, streamed.rows);
  EXPECT_EQ(mapped.dense, streamed.dense);
  EXPECT_EQ(mapped.cat_values, streamed.cat_values);
  return mapped;
}

TEST(TextInputOptions, CommentLinesAreNotRows) {
  Scratch s;
  const std::string path = s.write("r.csv",
                                   "# a ratings log\n# exported 2026-11-26\n"
                                   "user,rating\n"
                                   "a,5\n# a comment between rows\nb,3\n\n#\nc,1\n");
  RawChunk c = read_both(s, path, csv_schema(R"(, "comment": "#")"));
  ASSERT_EQ(c.rows, 3);
  EXPECT_EQ(c.dense, (std::vector<float>{5, 3, 1}));
  EXPECT_EQ(c.cat_values[0], (std::vector<uint64_t>{hash_category("a"), hash_category("b"),
                                                     hash_category("c")}));
  // Without the option the comment is the header: refused, naming what is missing.
  expect_error([&] { read_both(s, path, csv_schema()); }, {"the header has no column"});
  // Line numbers still count the comment lines.
  const std::string bad = s.write("bad.csv", "# c\nuser,rating\n# c\na,1\nb,x\n");
  expect_error([&] { read_both(s, bad, csv_schema(R"(, "comment": "#")")); },
               {"bad.csv:5: column 2 (rating)", "'x' is not a number"});
}

TEST(TextInputOptions, SkipLinesAndByteOrderMark) {
  Scratch s;
  // Three lines of junk (malformed as rows), then the header.
  const std::string path =
      s.write("r.csv", "\xEF\xBB\xBF" "exported by tool X\n\"unbalanced\n\nuser,rating\na,4\nb,2\n");
  RawChunk c = read_both(s, path, csv_schema(R"(, "skip_lines": 3)"));
  EXPECT_EQ(c.dense, (std::vector<float>{4, 2}));
  // A byte order mark before the header: the first column's name matches.
  const std::string bom = s.write("bom.csv", "\xEF\xBB\xBFuser,rating\na,4\n");
  EXPECT_EQ(read_both(s, bom, csv_schema()).dense, std::vector<float>{4});
  // And before a first row (no header): the label parses.
  const std::string tsv = s.write("bom.tsv", "\xEF\xBB\xBF" "1\t7\tab\n0\t8\tcd\n");
  Schema criteo = Schema::from_json(json::parse(R"({"format": "criteo", "num_dense": 1,
                                                   "num_cat": 1})"));
  RawChunk t = read_both(s, tsv, criteo);
  EXPECT_EQ(t.label, (std::vector<float>{1, 0}));
  // An error's line number counts the skipped lines.
  const std::string bad = s.write("bad.csv", "x\ny\nuser,rating\na,1\nb,?\n");
  expect_error([&] { read_both(s, bad, csv_schema(R"(, "skip_lines": 2)")); },
               {"bad.csv:5: column 2 (rating)"});
  // More lines to skip than the file holds: no rows, no error.
  const std::string short_file = s.write("short.csv", "x\n");
  EXPECT_EQ(read_both(s, short_file, csv_schema(R"(, "skip_lines": 5)")).rows, 0);
}

TEST(TextInputOptions, Rfc4180Quoting) {
  Scratch s;
  const std::string good = s.write(
      "q.csv", "user,rating\n\"smith, j\",4\n\"say \"\"hi\"\"\",\"3\"\n\"\",5\nplain,1\n");
  RawChunk c = read_both(s, good, csv_schema());
  ASSERT_EQ(c.rows, 4);
  EXPECT_EQ(c.cat_values[0][0], hash_category("smith, j"));
  EXPECT_EQ(c.cat_values[0][1], hash_category("say \"hi\""));
  EXPECT_EQ(c.cat_offsets[0][3] - c.cat_offsets[0][2], 0);  // "" is an empty (missing) field
  EXPECT_EQ(c.dense, (std::vector<float>{4, 3, 5, 1}));

  struct Bad {
    std::string line, message;
  };
  const std::vector<Bad> bad = {
      {"o'neil \"jr\",3", "column 1 (user): a '\"' inside an unquoted field"},
      {"x,3\"", "column 2 (rating): a '\"' inside an unquoted field"},
      {"\"abc\"d,3", "column 1 (user): unexpected character after the closing quote"},
      {"\"abc,3", "column 1 (user): unterminated quoted field"},
  };
  for (const auto& b : bad) {
    const std::string path = s.write("bad.csv", "user,rating\nok,1\n" + b.line + "\n");
    expect_error([&] { read_both(s, path, csv_schema()); }, {"bad.csv:3: " + b.message});
    // Skipped as malformed with OnError::Skip.
    ReadOptions skip;
    skip.on_error = OnError::Skip;
    TextReader r({path}, csv_schema(), skip);
    RawChunk all;
    ASSERT_TRUE(r.next(all));
    EXPECT_EQ(all.rows, 1);
    EXPECT_EQ(r.stats().skipped_rows, 1);
  }
  // A quoted field spanning lines is refused (not read as two broken rows).
  const std::string multi = s.write("multi.csv", "user,rating\n\"two\nlines\",3\n");
  expect_error([&] { read_both(s, multi, csv_schema()); },
               {"multi.csv:2: column 1 (user): unterminated quoted field", "spans lines"});
}

TEST(TextInputOptions, SchemaKeys) {
  Schema sc = csv_schema(R"(, "comment": "//", "skip_lines": 2)");
  EXPECT_EQ(sc.comment, "//");
  EXPECT_EQ(sc.skip_lines, 2);
  Schema back = Schema::from_json(sc.to_json());
  EXPECT_EQ(back.comment, "//");
  EXPECT_EQ(back.skip_lines, 2);
  EXPECT_FALSE(csv_schema().to_json().contains("comment"));  // older files unchanged
  expect_error([] { csv_schema(R"(, "skip_lines": -1)"); }, {"skip_lines"});
  expect_error([] { csv_schema(R"(, "comment": "a\nb")"); }, {"comment", "line break"});
  expect_error([] { csv_schema(R"(, "comment": "\"")"); }, {"comment", "quoted field"});
  expect_error([] { csv_schema(R"(, "comment": 3)"); }, {"comment"});
  expect_error([] { csv_schema(R"(, "coment": "#")"); }, {"did you mean 'comment'"});
}

}  // namespace
}  // namespace dlrec::io
