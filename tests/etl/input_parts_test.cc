// The input cut into parts (etl/input_parts.h) as `dlrec etl` under mpirun uses it, in one
// process: every part parsed, settled with the earlier parts' line counts, serialized and
// appended in order, then run_etl on those rows (EtlOptions::parsed_input) writes the same
// bytes as run_etl on the files; malformed rows are reported at the file and line that one
// reader names. (tests/dist/etl_ranks_test.cc runs the same through mpirun.)
#include "dlrec/etl/input_parts.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/etl/run.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::error_of;
using dlrec::testing::list_dir;
using dlrec::testing::read_all;
using dlrec::testing::TempDir;
using dlrec::testing::write_file;

// Criteo-shaped rows with repeated keys (Categorify's frequency order has ties), missing values
// and multi-hot-free columns; `seed` varies the files.
std::string criteo_text(int rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s;
  char buf[32];
  for (int i = 0; i < rows; ++i) {
    s += std::to_string(rng() % 2);
    for (int d = 0; d < 13; ++d)
      s += rng() % 9 == 0 ? std::string("\t") : "\t" + std::to_string(rng() % 1000);
    for (int c = 0; c < 26; ++c) {
      if (rng() % 11 == 0) {
        s += "\t";
        continue;
      }
      std::snprintf(buf, sizeof buf, "\t%08x", static_cast<unsigned>(rng() % (50 + 40 * c)));
      s += buf;
    }
    s += '\n';
  }
  return s;
}

EtlOptions base_options(const std::vector<std::string>& inputs, const std::string& out) {
  EtlOptions o;
  o.inputs = inputs;
  o.schema = io::Schema::criteo();
  // Every kind of fitted statistic: moments (Normalize), a median, min/max, vocabularies
  // with frequency ties, per-key label means over folds, per-key sums, a row filter.
  o.workflow = json::parse(R"({"pipeline": [
    {"columns": ["I1", "I5", "I6", "I7", "I8", "I9", "I10", "I11", "I12", "I13"],
     "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0}, {"op": "LogOp"},
             {"op": "Normalize"}]},
    {"columns": ["I2"], "ops": [{"op": "FillMedian"}, {"op": "NormalizeMinMax"}]},
    {"columns": ["I3"], "ops": [{"op": "FillMissing", "value": 0},
                                {"op": "Bucketize", "boundaries": [1, 10, 100]}]},
    {"columns": ["I4"], "ops": [{"op": "Filter", "max": 990, "keep_missing": true},
                                {"op": "FillMissing", "value": 0}]},
    {"columns": ["C1", "C2"], "ops": [{"op": "TargetEncoding", "smoothing": 20, "kfold": 3,
                                       "seed": 7}]},
    {"columns": ["C3"], "ops": [{"op": "JoinGroupby", "cont_cols": ["I1"],
                                 "stats": ["count", "sum", "mean"]}]},
    {"columns": ["C4", "C5"], "ops": [{"op": "HashedCross", "num_buckets": 1000}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]})");
  o.valid_ratio = 0.1;
  o.shard_rows = 700;
  o.block_rows = 128;
  o.output_dir = out;
  return o;
}

// What the ranks of a job do, in turn: parse each part, settle its lines, gather in order.
// Returns the rows, or throws the first failed part's message (in input order).
// Pieces of 2 KB or more on the threads of each part (a few lines each).
std::shared_ptr<ParsedInput> gather_parts(const EtlOptions& o, int parts) {
  const size_t files = o.inputs.size();
  std::vector<InputPart> p;
  for (int r = 0; r < parts; ++r)
    p.push_back(parse_input_part(o.inputs, o.schema, o.read, r, parts, 2048));
  std::vector<int64_t> before(files, 0);
  auto in = std::make_shared<ParsedInput>();
  std::vector<std::string> bytes;
  for (int r = 0; r < parts; ++r) {
    const std::string msg = settle_part(p[r], o.inputs, before);
    if (p[r].failed) fail(msg);
    for (size_t f = 0; f < files; ++f) before[f] += p[r].file_lines[f];
    bytes.push_back(serialize_parsed(p[r].parsed));
  }
  for (const auto& b : bytes) append_serialized(b.data(), b.size(), *in);
  return in;
}

// Every file of two dataset directories, byte for byte.
void expect_same_dirs(const std::string& a, const std::string& b) {
  const auto names = list_dir(a);
  ASSERT_EQ(names, list_dir(b));
  ASSERT_GT(names.size(), 3u);
  for (const auto& n : names) EXPECT_TRUE(read_all(a + "/" + n) == read_all(b + "/" + n)) << n;
}

void expect_parts_same_output(const EtlOptions& plain, const std::string& tmp, int parts) {
  EtlOptions o = plain;
  o.output_dir = tmp + "/parts" + std::to_string(parts);
  o.parsed_input = gather_parts(o, parts);
  run_etl(o);
  expect_same_dirs(plain.output_dir, o.output_dir);
}

TEST(InputPartsTest, PartsGiveTheSingleReadersBytesOneFile) {
  TempDir tmp("parts_one");
  const std::string in = write_file(tmp.path, "in.tsv", criteo_text(5003, 1));
  EtlOptions plain = base_options({in}, tmp.path + "/plain");
  plain.shuffle = true;
  plain.ranks = 2;
  plain.seed = 5;
  run_etl(plain);
  for (int parts : {1, 2, 3, 7}) expect_parts_same_output(plain, tmp.path, parts);
}

TEST(InputPartsTest, PartsGiveTheSingleReadersBytesSeveralFilesAndAnEmptyOne) {
  TempDir tmp("parts_files");
  const std::string a = write_file(tmp.path, "a.tsv", criteo_text(2100, 2));
  const std::string e = write_file(tmp.path, "empty.tsv", "");
  const std::string b = write_file(tmp.path, "b.tsv", criteo_text(37, 3));
  const std::string c = write_file(tmp.path, "c.tsv", criteo_text(1500, 4));
  EtlOptions plain = base_options({a, e, b, c}, tmp.path + "/plain");
  plain.train_rows = 3000;
  plain.valid_ratio = 0;
  run_etl(plain);
  for (int parts : {2, 3, 5, 16}) expect_parts_same_output(plain, tmp.path, parts);
}

// A CSV with what a reader consumes before the rows: byte order mark, skip_lines, comment
// lines before the header, the header; CRLF line ends and comment and blank lines among rows.
TEST(InputPartsTest, PreambleHeaderCommentsAndCrlfAsTheReaderSeesThem) {
  TempDir tmp("parts_csv");
  io::Schema schema = io::Schema::from_json(json::parse(R"({"format": "csv", "header": true,
    "skip_lines": 1, "comment": "#", "columns": [{"name": "y", "kind": "label"},
    {"name": "x", "kind": "dense"}, {"name": "k", "kind": "categorical"}]})"));
  std::string text = "\xEF\xBB\xBFgenerated by a tool\n# a comment\n\nk,x,y\r\n";
  std::mt19937_64 rng(7);
  for (int i = 0; i < 900; ++i) {
    text += "k" + std::to_string(rng() % 30) + "," + std::to_string(rng() % 50) + "," +
            std::to_string(rng() % 2) + "\r\n";
    if (i % 97 == 0) text += "# note\r\n\n";
  }
  const std::string in = write_file(tmp.path, "in.csv", text);
  EtlOptions plain = base_options({in}, tmp.path + "/plain");
  plain.schema = schema;
  plain.workflow = json::parse(R"({"pipeline": [
    {"columns": ["x"], "ops": [{"op": "Normalize"}]},
    {"columns": ["k"], "ops": [{"op": "Categorify"}]}]})");
  run_etl(plain);
  for (int parts : {2, 3, 11}) expect_parts_same_output(plain, tmp.path, parts);
}

// --on-error=fail: the job reports the first malformed row in input order, at the file and
// line a single reader names, whichever part holds it; skip: the same rows and skip counts.
TEST(InputPartsTest, MalformedRowsNamedAtTheSingleReadersLine) {
  TempDir tmp("parts_bad");
  std::string a_text = criteo_text(800, 5), b_text = criteo_text(800, 6);
  // Line 601 of b.tsv (in the last part of 2 and of 3) loses its fields.
  size_t at = 0;
  for (int l = 0; l < 600; ++l) at = b_text.find('\n', at) + 1;
  b_text.replace(at, b_text.find('\n', at) - at, "1\t2\t3");
  const std::string a = write_file(tmp.path, "a.tsv", a_text);
  const std::string b = write_file(tmp.path, "b.tsv", b_text);
  EtlOptions plain = base_options({a, b}, tmp.path + "/plain");
  const std::string single = error_of([&] { run_etl(plain); });
  ASSERT_NE(single.find("b.tsv:601: "), std::string::npos) << single;
  for (int parts : {2, 3}) {
    const std::string e = error_of([&] { gather_parts(plain, parts); });
    EXPECT_EQ(e, single) << parts << " parts";
  }
  // Skipped: the same rows, counts and first message.
  plain.read.on_error = io::OnError::Skip;
  const EtlResult r = run_etl(plain);
  EXPECT_EQ(r.skipped_rows, 1);
  for (int parts : {2, 3}) {
    EtlOptions o = plain;
    o.output_dir = tmp.path + "/skip" + std::to_string(parts);
    o.parsed_input = gather_parts(o, parts);
    EXPECT_EQ(o.parsed_input->stats.skipped_rows, 1);
    EXPECT_NE(o.parsed_input->stats.first_skip_reason.find("b.tsv:601: "), std::string::npos)
        << o.parsed_input->stats.first_skip_reason;
    const EtlResult rp = run_etl(o);
    EXPECT_EQ(rp.skipped_rows, 1);
    expect_same_dirs(plain.output_dir, o.output_dir);
  }
}

TEST(InputPartsTest, ParquetAndBadPartBytesAreErrors) {
  TempDir tmp("parts_errors");
  const std::string p = write_file(tmp.path, "x.parquet", "PAR1");
  EtlOptions o = base_options({p}, tmp.path + "/out");
  EXPECT_NE(error_of([&] {
              parse_input_part(o.inputs, o.schema, o.read, 0, 2);
            }).find("Parquet: a job of several processes cuts text inputs only"),
            std::string::npos);
  ParsedInput in;
  in.chunks.resize(1);
  in.chunks[0].reset(13, 26);
  const std::string bytes = serialize_parsed(in);
  ParsedInput back;
  EXPECT_NE(
      error_of([&] { append_serialized(bytes.data(), bytes.size() - 3, back); }).find("cut short"),
      std::string::npos);
  EXPECT_NE(error_of([&] { append_serialized("not a part", 10, back); }).find("do not start"),
            std::string::npos);
}

}  // namespace
}  // namespace dlrec::etl
