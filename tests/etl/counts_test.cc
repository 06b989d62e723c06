// Counts that used to come out zero without a word: the validation split of a run that skips
// malformed rows (`--on-error=skip --valid-ratio`), an empty validation split, no training rows,
// and the progress line's "0 rows" on small inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "test_errors.h"

namespace dlrec::etl {
namespace {

namespace fs = std::filesystem;
using dlrec::testing::error_of;

struct Scratch {
  std::string dir;
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = std::string(::testing::TempDir()) + "dlrec_counts_" + info->name() + "_" +
          std::to_string(::getpid());
    fs::remove_all(dir);
    make_dirs(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  }
};

io::Schema schema() {
  io::Schema s;
  s.columns = {{"label", io::ColumnKind::Label, false},
               {"I1", io::ColumnKind::Dense, false},
               {"C1", io::ColumnKind::Categorical, false}};
  return s;
}

// `rows` lines; line i (0-based) is malformed when bad_every > 0 and i % bad_every == bad_every - 1.
std::string lines(int rows, int bad_every = 0) {
  std::string s;
  for (int i = 0; i < rows; ++i) {
    if (bad_every > 0 && i % bad_every == bad_every - 1)
      s += "x\tnot a number\n";
    else
      s += std::to_string(i % 2) + "\t" + std::to_string(i) + "\t" + std::to_string(i % 7 + 10) +
           "\n";
  }
  return s;
}

EtlOptions options(const Scratch& s, const std::string& input) {
  EtlOptions o;
  o.inputs = {input};
  o.schema = schema();
  o.workflow = json::parse(R"({"pipeline": [{"columns": ["C1"], "ops": [{"op": "Categorify"}]}]})");
  o.output_dir = s.dir + "/out";
  o.overwrite = true;
  return o;
}

// Malformed rows spread through the input, skipped: the last valid_ratio of the GOOD rows
// validate (the count parses the input). Before, the split came from the line count, so the
// skipped lines moved it past the last good row and every row trained.
TEST(EtlCountsTest, SkippedRowsKeepTheValidationSplit) {
  Scratch s;
  const std::string input = s.write("in.tsv", lines(1000, 10));  // 100 malformed, 900 good
  for (int64_t ahead : {int64_t{-1}, int64_t{0}}) {  // counted first; count-ahead asked for
    EtlOptions o = options(s, input);
    o.read.on_error = io::OnError::Skip;
    o.valid_ratio = 0.1;
    o.count_ahead_min_bytes = ahead;
    EtlResult r = run_etl(o);
    EXPECT_EQ(r.skipped_rows, 100) << ahead;
    EXPECT_EQ(r.valid_rows, 90) << ahead;
    EXPECT_EQ(r.train_rows, 810) << ahead;
    EXPECT_TRUE(r.warnings.empty()) << ahead;
  }
}

TEST(EtlCountsTest, EmptyValidationSplitWarns) {
  Scratch s;
  const std::string input = s.write("in.tsv", lines(5));
  EtlOptions o = options(s, input);
  o.valid_ratio = 0.1;  // floor(5 x 0.1) = 0
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.valid_rows, 0);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("validation split is empty"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("of 5 rows leaves 0"), std::string::npos) << r.warnings[0];
  o.valid_ratio = 0;
  o.train_rows = 5;
  r = run_etl(o);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("train_rows 5 takes every row"), std::string::npos);
  o.train_rows = -1;  // no split asked for: nothing to warn about
  EXPECT_TRUE(run_etl(o).warnings.empty());
}

TEST(EtlCountsTest, NoRowsAreErrors) {
  Scratch s;
  const std::string bad = s.write("bad.tsv", lines(4, 1));  // every line malformed
  EtlOptions o = options(s, bad);
  o.read.on_error = io::OnError::Skip;
  o.valid_ratio = 0.1;
  dlrec::testing::expect_error([&] { run_etl(o); },
                               {"the input holds no rows", "every line was malformed"});
  o.valid_ratio = 0;  // not counted first: found after the transform
  dlrec::testing::expect_error([&] { run_etl(o); },
                               {"the input holds no rows to fit on", "skipped"});
  // A Filter dropping every training row.
  EtlOptions f = options(s, s.write("in.tsv", lines(20)));
  f.workflow = json::parse(R"({"pipeline": [{"columns": ["I1"], "ops": [{"op": "Filter", "min": 1000}]},
                                            {"columns": ["C1"], "ops": [{"op": "Categorify"}]}]})");
  dlrec::testing::expect_error([&] { run_etl(f); }, {"no training rows", "Filter"});
  EXPECT_FALSE(fs::exists(f.output_dir + "/dataset.json"));
}

// The split counts rows, not the schema's comment lines or skipped lines (a newline count would
// put it past the last row: an empty validation split).
TEST(EtlCountsTest, SplitCountsRowsNotCommentsOrSkippedLines) {
  Scratch s;
  std::string text = "junk line\nuser,rating\n";
  for (int i = 0; i < 10; ++i)
    text += "# c\nu" + std::to_string(i % 3) + "," + std::to_string(i) + "\n";
  EtlOptions o = options(s, s.write("r.csv", text));
  o.schema = io::Schema::from_json(json::parse(R"({"format": "csv", "comment": "#",
      "skip_lines": 1, "columns": [{"name": "user", "kind": "categorical"},
                                   {"name": "rating", "kind": "dense"}]})"));
  o.workflow = json::parse(R"({"pipeline": [{"columns": "@categorical",
                                             "ops": [{"op": "Categorify"}]}]})");
  o.valid_ratio = 0.2;
  const EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 8);
  EXPECT_EQ(r.valid_rows, 2);
}

// `dlrec etl` on 5 rows printed "[etl fit (pass 1/1)] 0 rows" and "[etl transform] 0 rows".
TEST(EtlCountsTest, ProgressLinesCountSmallInputs) {
  const std::string bin = std::string(DLREC_BIN_DIR) + "/dlrec";
  if (!fs::exists(bin)) GTEST_SKIP() << "the dlrec binary is not built (" << bin << ")";
  Scratch s;
  const std::string input = s.write("in.tsv", lines(5));
  const std::string schema_path =
      s.write("schema.json", R"({"format": "criteo", "num_dense": 1, "num_cat": 1})");
  const std::string wf = s.write(
      "wf.json", R"({"pipeline": [{"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  for (const std::string split : {"--valid-ratio 0", "--train-rows 3"}) {
    const std::string cmd = bin + " etl --input " + input + " --schema " + schema_path +
                            " --workflow " + wf + " --out " + s.dir + "/out --overwrite " + split +
                            " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << out;
    EXPECT_EQ(out.find("] 0 rows"), std::string::npos) << out;
    EXPECT_NE(out.find("[etl transform] 5 rows"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace dlrec::etl
