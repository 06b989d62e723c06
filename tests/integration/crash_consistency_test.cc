// Crash consistency (issue 25): `dlrec export --overwrite` and `dlrec etl --overwrite` killed
// (SIGKILL) at random moments always leave a complete old or a complete new output, and the
// next run leaves no temporary files. Plus the pieces underneath: replace_dir / recover_dir
// (also the two-rename path of file systems that cannot swap), AtomicFile's clean-up of
// temporaries of killed processes, run_etl's checks of what --overwrite would replace, and the
// refusal of NaN/Inf weights by export.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/shard.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"

using namespace dlrec;
namespace fs = std::filesystem;

namespace {

// pipeline_test.cc (in this program too) makes its scratch directories TempDir()/dlrec_it_<pid>_*
// and never removed them: every `make test` left them in /tmp (ctest runs each test in a
// process of its own). They go when the program ends.
struct RemoveItScratch : ::testing::Environment {
  void TearDown() override {
    const std::string prefix = "dlrec_it_" + std::to_string(::getpid()) + "_";
    std::error_code ec;
    for (fs::directory_iterator it(testing::TempDir(), ec), end; !ec && it != end;
         it.increment(ec))
      if (it->path().filename().string().rfind(prefix, 0) == 0) {
        std::error_code rec;
        fs::remove_all(it->path(), rec);
      }
  }
};
const auto* const kRemoveItScratch = ::testing::AddGlobalTestEnvironment(new RemoveItScratch);

// A scratch directory removed when the test ends (also when it fails).
struct Scratch {
  std::string dir;
  explicit Scratch(const std::string& name) {
    dir = testing::TempDir() + "dlrec_crash_" + std::to_string(::getpid()) + "_" + name;
    fs::remove_all(dir);
    make_dirs(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// A pid no process has: a child that has exited and been reaped.
long dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

void write_text(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary) << s;
}

// name -> contents of every entry of a directory tree (directories as "<dir>").
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    m[rel] = e.is_directory() ? "<dir>" : read_file(e.path().string());
  }
  return m;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Entries anywhere under `dir` that look like our temporaries.
std::vector<std::string> temporaries_under(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp.") != std::string::npos || n.find(".old.") != std::string::npos ||
        n.rfind(".dlrec-spill-", 0) == 0 || n.rfind(".shuffle-", 0) == 0)
      v.push_back(e.path().string());
  }
  return v;
}

std::string dlrec_bin() { return std::string(DLREC_BIN_DIR) + "/dlrec"; }

// Starts the dlrec binary with `args` (output to /dev/null); returns its pid. Everything the
// child needs is prepared before fork(): the test process may have threads (a lock held by one
// of them at fork time would never be released in the child), so the child only calls
// async-signal-safe functions.
pid_t spawn(const std::vector<std::string>& args) {
  std::string bin = dlrec_bin();
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  argv.push_back(bin.data());
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t p = ::fork();
  if (p == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  return p;
}

// Runs dlrec to the end; returns its exit status (-1 when killed by a signal).
int run_dlrec(const std::vector<std::string>& args) {
  int status = 0;
  ::waitpid(spawn(args), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs dlrec and kills it (SIGKILL) after `delay` unless it ended before.
void run_and_kill(const std::vector<std::string>& args, std::chrono::microseconds delay) {
  pid_t p = spawn(args);
  std::this_thread::sleep_for(delay);
  ::kill(p, SIGKILL);
  ::waitpid(p, nullptr, 0);
}

double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Kills `make_args(i)` 20 times at uniformly random moments of [0, 1.5 x its duration] and
// checks after each kill that `out` is one of the complete outputs `refs` (after the recovery
// the next run does: recover_dir), then that a run to the end leaves no temporaries.
void kill_at_random_moments(const std::string& what, const std::string& work,
                            const std::string& out,
                            const std::function<std::vector<std::string>(int)>& make_args,
                            const std::vector<std::map<std::string, std::string>>& refs) {
  const double full = seconds_of([&] { ASSERT_EQ(run_dlrec(make_args(0)), 0); });
  std::mt19937_64 rng(25);
  std::uniform_real_distribution<double> when(0.0, 1.5 * full);
  int old_kept = 0, new_kept = 0;
  for (int i = 1; i <= 20; ++i) {
    const auto before = snapshot(out);
    const auto delay = std::chrono::microseconds(static_cast<int64_t>(when(rng) * 1e6));
    run_and_kill(make_args(i), delay);
    if (!fs::exists(out)) recover_dir(out);  // two-rename file systems: the next run does this
    ASSERT_TRUE(fs::is_directory(out)) << what << " kill " << i << " at " << delay.count()
                                       << " us left no output";
    const auto after = snapshot(out);
    bool complete = false;
    for (const auto& r : refs) complete |= after == r;
    ASSERT_TRUE(complete) << what << " kill " << i << " at " << delay.count()
                          << " us left an output that is neither complete version";
    (after == before ? old_kept : new_kept)++;
  }
  const size_t left = temporaries_under(work).size();  // by the last kill
  ASSERT_EQ(run_dlrec(make_args(21)), 0);  // the next run cleans up
  EXPECT_EQ(temporaries_under(work), std::vector<std::string>{});
  std::printf("%s: 20 kills within %.0f ms: %d kept the old output, %d had the new one; "
              "%zu temporaries left by the last kill, none after the next run\n",
              what.c_str(), 1500 * full, old_kept, new_kept, left);
}

}  // namespace

TEST(ReplaceDir, SwapsAndRecoversAfterAKillBetweenTwoRenames) {
  Scratch s("replace");
  const std::string x = s.dir + "/model";
  make_dirs(x);
  write_text(x + "/a", "old");
  for (bool swap : {true, false}) {  // false: the path of file systems without RENAME_EXCHANGE
    const std::string staged = staging_dir_for(x);
    make_dirs(staged);
    write_text(staged + "/a", swap ? "new1" : "new2");
    replace_dir(staged, x, swap);
    EXPECT_EQ(read_file(x + "/a"), swap ? "new1" : "new2");
    EXPECT_EQ(names_in(s.dir), std::vector<std::string>{"model"});
  }
  // A process killed between the two renames: no model, its old and new versions beside it.
  const long pid = dead_pid();
  fs::rename(x, x + ".old." + std::to_string(pid));
  make_dirs(x + ".tmp." + std::to_string(pid));
  write_text(x + ".tmp." + std::to_string(pid) + "/a", "new3");
  std::vector<std::string> done = recover_dir(x);
  EXPECT_EQ(done.size(), 2u);
  EXPECT_EQ(read_file(x + "/a"), "new2");  // the old version is back
  EXPECT_EQ(names_in(s.dir), std::vector<std::string>{"model"});
  // A live process's temporaries stay (pid 1 always runs).
  make_dirs(x + ".tmp.1");
  EXPECT_TRUE(recover_dir(x).empty());
  EXPECT_TRUE(fs::exists(x + ".tmp.1"));
  // Names that only look like ours stay.
  make_dirs(x + ".tmp.12x");
  make_dirs(x + "2.old." + std::to_string(pid));
  EXPECT_TRUE(recover_dir(x).empty());
}

TEST(AtomicFile, RemovesTemporariesOfKilledProcesses) {
  Scratch s("atomic");
  const std::string f = s.dir + "/checkpoint.dlrec";
  const std::string stale = f + ".tmp." + std::to_string(dead_pid());
  write_text(stale, std::string(1000, 'x'));
  write_text(f + ".tmp.1", "a live process's");
  write_file_atomic(f, "new");
  EXPECT_EQ(read_file(f), "new");
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(f + ".tmp.1"));
}

class CrashConsistency : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(dlrec_bin()))
      GTEST_SKIP() << "the dlrec binary is not built (" << dlrec_bin() << ")";
  }
};

TEST_F(CrashConsistency, EtlOverwriteKilledKeepsACompleteDataset) {
  Scratch s("etl");
  io::DatagenConfig gen;
  gen.rows = 4000;
  gen.num_dense = 4;
  gen.num_cat = 5;
  gen.cardinalities = {20, 300, 3000};
  std::vector<std::string> inputs;
  for (int k = 0; k < 2; ++k) {
    gen.seed = 100 + k;
    inputs.push_back(s.dir + "/logs" + std::to_string(k) + ".tsv");
    io::generate_file(gen, inputs.back());
  }
  const std::string schema = s.dir + "/schema.json";
  write_text(schema, gen.schema().to_json().dump());
  auto args = [&](int i, const std::string& out) {
    return std::vector<std::string>{"etl", "--input", inputs[i % 2], "--format", "csv",
                                    "--schema", schema, "--out", out, "--shard-rows", "700",
                                    "--valid-ratio", "0.1", "--overwrite"};
  };
  std::vector<std::map<std::string, std::string>> refs;
  for (int k = 0; k < 2; ++k) {
    const std::string ref = s.dir + "/ref" + std::to_string(k);
    ASSERT_EQ(run_dlrec(args(k, ref)), 0);
    refs.push_back(snapshot(ref));
    io::DatasetInfo info = io::DatasetInfo::load(ref);  // loadable, several shards
    EXPECT_GT(info.train_shards.size(), 3u);
  }
  ASSERT_NE(refs[0], refs[1]);
  const std::string work = s.dir + "/work", out = work + "/data";
  make_dirs(work);
  kill_at_random_moments(
      "dlrec etl --overwrite", work, out, [&](int i) { return args(i, out); }, refs);
  EXPECT_EQ(snapshot(out), refs[1]);  // the last run (21) read the second input
}

TEST_F(CrashConsistency, ExportOverwriteKilledKeepsACompleteModel) {
  Scratch s("export");
  io::DatagenConfig gen;
  gen.rows = 3000;
  gen.num_dense = 4;
  gen.num_cat = 5;
  gen.cardinalities = {20, 300, 3000};
  const std::string logs = s.dir + "/logs.tsv", data = s.dir + "/data";
  io::generate_file(gen, logs);
  const std::string schema = s.dir + "/schema.json";
  write_text(schema, gen.schema().to_json().dump());
  ASSERT_EQ(run_dlrec({"etl", "--input", logs, "--format", "csv", "--schema", schema, "--out",
                       data}),
            0);
  const std::string config = s.dir + "/model.json";
  write_text(config, R"({"model": {"embedding_dim": 16, "bottom_mlp": [64, 16],
    "top_mlp": [64, 1]}, "optimizer": {"type": "adagrad", "lr": 0.05},
    "train": {"batch_size": 256, "epochs": 1}})");
  auto args = [&](int i, const std::string& out) {
    return std::vector<std::string>{"export", "--init", config, "--data", data, "--seed",
                                    std::to_string(1 + i % 2), "--out", out, "--overwrite"};
  };
  std::vector<std::map<std::string, std::string>> refs;
  for (int k = 0; k < 2; ++k) {
    const std::string ref = s.dir + "/ref" + std::to_string(k);
    ASSERT_EQ(run_dlrec(args(k, ref)), 0);
    refs.push_back(snapshot(ref));
    train::Predictor p(ref);  // loadable
    EXPECT_EQ(p.workflow().schema().num_cat(), 5);
  }
  ASSERT_NE(refs[0], refs[1]);
  const std::string work = s.dir + "/work", out = work + "/model";
  make_dirs(work);
  kill_at_random_moments(
      "dlrec export --overwrite", work, out, [&](int i) { return args(i, out); }, refs);
  EXPECT_EQ(snapshot(out), refs[1]);
}

TEST(EtlOverwrite, RefusesToReplaceADirectoryWithForeignFiles) {
  Scratch s("foreign");
  io::DatagenConfig gen;
  gen.rows = 500;
  gen.num_dense = 2;
  gen.num_cat = 2;
  gen.cardinalities = {10};
  const std::string logs = s.dir + "/logs.tsv";
  io::generate_file(gen, logs);
  etl::EtlOptions o;
  o.inputs = {logs};
  o.schema = gen.schema();
  o.workflow = json::parse(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  o.output_dir = s.dir + "/out";
  etl::run_etl(o);
  const auto first = snapshot(o.output_dir);
  write_text(o.output_dir + "/notes.txt", "mine");
  o.overwrite = true;
  try {
    etl::run_etl(o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("not part of its dataset ('notes.txt')"), std::string::npos) << msg;
  }
  EXPECT_EQ(read_file(o.output_dir + "/notes.txt"), "mine");
  fs::remove(o.output_dir + "/notes.txt");
  EXPECT_EQ(snapshot(o.output_dir), first);  // untouched
  // Temporaries of a killed run inside the directory and beside it go at the next run.
  const std::string pid = std::to_string(dead_pid());
  write_text(o.output_dir + "/train_00000.shard.tmp." + pid, "partial");
  write_text(o.output_dir + "/.dlrec-spill-" + pid + "-1-0.tmp", "spilled");
  make_dirs(o.output_dir + ".tmp." + pid);
  etl::run_etl(o);
  EXPECT_EQ(snapshot(o.output_dir), first);  // the same input: the same bytes
  EXPECT_EQ(temporaries_under(s.dir), std::vector<std::string>{});
  EXPECT_EQ(names_in(s.dir), (std::vector<std::string>{"logs.tsv", "out"}));
}

TEST(Export, RefusesNonFiniteWeightsNamingTheTensor) {
  Scratch s("nan");
  io::DatagenConfig gen;
  gen.rows = 500;
  gen.num_dense = 2;
  gen.num_cat = 2;
  gen.cardinalities = {10};
  const std::string logs = s.dir + "/logs.tsv", data = s.dir + "/data";
  io::generate_file(gen, logs);
  etl::EtlOptions o;
  o.inputs = {logs};
  o.schema = gen.schema();
  o.workflow = json::parse(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  o.output_dir = data;
  etl::run_etl(o);
  io::DatasetInfo info = io::DatasetInfo::load(data);
  model::RunConfig cfg = model::RunConfig::from_json(json::parse(R"({
    "model": {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
    "optimizer": {"type": "sgd", "lr": 0.1}, "train": {"batch_size": 64}})"));
  for (float bad : {std::nanf(""), INFINITY}) {
    const std::string run = s.dir + "/run", out = s.dir + "/model";
    make_dirs(run);
    write_file_atomic(run + "/run.json",
                      json{{"config", cfg.to_json()}, {"data_dir", data}}.dump());
    auto m = model::build_model(cfg.model, cfg.optimizer, info.layout, Device::cpu(), 0);
    auto params = m->parameters();
    ASSERT_GE(params.size(), 2u);
    const std::string name = params[1].first;
    params[1].second.data<float>()[3] = bad;
    train::save_checkpoint(run + "/checkpoint.dlrec", *m, cfg, info.layout, {});
    try {
      train::export_model(run, out);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("parameter tensor '" + name + "' holds 1 non-finite value"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("the first at element 3"), std::string::npos) << msg;
    }
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(temporaries_under(s.dir), std::vector<std::string>{});
  }
}
