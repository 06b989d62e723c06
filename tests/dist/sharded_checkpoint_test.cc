// Sharded checkpoints: saved on N ranks, loaded on M (re-sharding), bit-exact; bad checkpoints
// are clear errors. The multi-rank part starts this program under mpirun (filter
// ShardedCheckpointRanks.*, with --shard_ckpt_load=DIR and --shard_ckpt_save=DIR after the gtest
// flags); those tests skip when the program was not started by an MPI launcher.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "dlrec/core/file_util.h"
#include "dlrec/dist/sharded_embedding.h"
#include "dlrec/io/tensor_file.h"
#include "run_job.h"
#include "sharded_test_util.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::dist {
namespace {

using dlrec::testing::expect_error;

// Every table kind, different from make_scenario's, so that loading re-shards every table.
std::map<std::string, TableOverride> other_kinds() {
  return {{"tw", {ShardingKind::RowWise, -1}},      {"rw", {ShardingKind::ColumnWise, -1}},
          {"cw", {ShardingKind::TableWise, -1}},    {"rep", {ShardingKind::RowWise, -1}},
          {"tiny", {ShardingKind::Replicated, -1}}, {"auto", {ShardingKind::ColumnWise, -1}}};
}

std::shared_ptr<const nn::Optimizer> adam() {
  return std::make_shared<const nn::Optimizer>(optimizer_options(nn::OptimizerKind::Adam));
}

// The whole tables (values and state) as a tensor file, written by rank 0, for the next job to
// compare with.
void save_expected(ShardedEmbedding& se, Communicator& comm, const std::string& path) {
  std::vector<io::NamedTensor> all;
  for (int t = 0; t < se.num_tables(); ++t) {
    all.emplace_back(std::to_string(t) + ".weight", se.gather_table(t));
    all.emplace_back(std::to_string(t) + ".state", se.gather_table(t, true));
  }
  if (comm.rank() == 0) io::save_tensors(path, all, json::object());
  comm.barrier();
}

void expect_tables(ShardedEmbedding& se, const std::string& path) {
  std::vector<io::NamedTensor> got, want;
  for (int t = 0; t < se.num_tables(); ++t) {
    got.emplace_back(std::to_string(t) + ".weight", se.gather_table(t));
    got.emplace_back(std::to_string(t) + ".state", se.gather_table(t, true));
    want.emplace_back(got[2 * t].first, Tensor::empty(got[2 * t].second.shape(), DType::F32));
    want.emplace_back(got[2 * t + 1].first,
                      Tensor::empty(got[2 * t + 1].second.shape(), DType::F32));
  }
  io::load_tensors(path, want);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i].second.to_vector<float>(), want[i].second.to_vector<float>())
        << got[i].first << " after loading into " << se.plan().ranks << " rank(s)";
}

TEST(ShardedCheckpoint, SavesAndReshardsOnOneRank) {
  dlrec::testing::TempDir tmp("sharded_ckpt");
  auto comm = make_single_communicator();
  const Scenario sc = make_scenario(nn::OptimizerKind::Adam);
  const auto cfg = scenario_tables(sc, adam());
  ShardedEmbedding a(cfg, scenario_plan(cfg, sc.overrides, 1), *comm);
  train_steps(a, *comm, sc, 0, 3);
  a.save(tmp.path, 3);
  ShardedEmbedding b(cfg, scenario_plan(cfg, other_kinds(), 1), *comm);
  EXPECT_EQ(b.load(tmp.path), 3);
  for (int t = 0; t < a.num_tables(); ++t) {
    EXPECT_EQ(b.gather_table(t).to_vector<float>(), a.gather_table(t).to_vector<float>());
    EXPECT_EQ(b.gather_table(t, true).to_vector<float>(),
              a.gather_table(t, true).to_vector<float>());
  }
  // Training on from the loaded state gives what training on without the checkpoint gives.
  train_steps(a, *comm, sc, 3, 2);
  train_steps(b, *comm, sc, 3, 2);
  for (int t = 0; t < a.num_tables(); ++t)
    EXPECT_EQ(b.gather_table(t).to_vector<float>(), a.gather_table(t).to_vector<float>());
  // A newer checkpoint replaces the files of the older one.
  a.save(tmp.path, 5);
  EXPECT_EQ(
      dlrec::testing::list_dir(tmp.path),
      std::vector<std::string>({"embedding.manifest.json", "embedding.step-5.rank-0-of-1.dlrec"}));
}

TEST(ShardedCheckpoint, BadCheckpointsAreClearErrors) {
  dlrec::testing::TempDir tmp("sharded_ckpt_bad");
  auto comm = make_single_communicator();
  const Scenario sc = make_scenario(nn::OptimizerKind::Adam);
  const auto cfg = scenario_tables(sc, adam());
  ShardedEmbedding a(cfg, scenario_plan(cfg, sc.overrides, 1), *comm);
  expect_error([&] { a.load(tmp.path); }, {tmp.path, "no embedding.manifest.json"});
  a.save(tmp.path, 7);
  const std::string manifest = tmp.path + "/embedding.manifest.json";
  const std::string text = dlrec::testing::read_all(manifest);
  // Another optimizer.
  auto sgd_cfg = scenario_tables(sc, std::make_shared<const nn::Optimizer>(nn::OptimizerOptions{}));
  ShardedEmbedding sgd(sgd_cfg, scenario_plan(sgd_cfg, sc.overrides, 1), *comm);
  expect_error([&] { sgd.load(tmp.path); }, {"table 'tw'", "optimizer adam", "uses sgd"});
  // Another table size.
  Scenario bigger = sc;
  bigger.specs[1].rows = 104;
  auto big_cfg = scenario_tables(bigger, adam());
  ShardedEmbedding big(big_cfg, scenario_plan(big_cfg, sc.overrides, 1), *comm);
  expect_error([&] { big.load(tmp.path); }, {"table 'rw' is 103 x 8", "the model's 104 x 8"});
  // A piece that does not fit its table.
  json m = parse_json(text, "manifest");
  m["files"][0]["pieces"][0]["rows"] = 51;
  write_file_atomic(manifest, m.dump());
  expect_error([&] { a.load(tmp.path); }, {"files[0].pieces", "rows"});
  // A rank file listed but missing.
  m = parse_json(text, "manifest");
  m["ranks"] = 2;
  m["files"].push_back({{"rank", 1},
                        {"file", "embedding.step-7.rank-1-of-2.dlrec"},
                        {"pieces", m["files"][0]["pieces"]}});
  m["files"][0]["pieces"] = json::array();
  write_file_atomic(manifest, m.dump());
  expect_error([&] { a.load(tmp.path); },
               {"the file of rank 1", "embedding.step-7.rank-1-of-2.dlrec", "is missing"});
  // A truncated rank file.
  write_file_atomic(manifest, text);
  const std::string f = tmp.path + "/embedding.step-7.rank-0-of-1.dlrec";
  std::filesystem::resize_file(f, std::filesystem::file_size(f) - 10);
  EXPECT_NE(dlrec::testing::error_of([&] { a.load(tmp.path); }).find("rank-0-of-1"),
            std::string::npos);
}

// The flag `--name=VALUE` after the gtest flags, or "".
std::string flag(const std::string& name) {
  for (const std::string& a : ::testing::internal::GetArgvs())
    if (a.rfind("--" + name + "=", 0) == 0) return a.substr(name.size() + 3);
  return "";
}

// Under mpirun: load --shard_ckpt_load (if given) with make_scenario's plan on 4 ranks or
// other_kinds() on others and compare with its .expected file; then train 3 steps and save to
// --shard_ckpt_save (if given) with its .expected file.
TEST(ShardedCheckpointRanks, LoadTrainSave) {
  if (!started_by_mpi_launcher())
    GTEST_SKIP() << "runs only under mpirun (ShardedCheckpointMpi starts it)";
  {
    auto comm = make_mpi_communicator();
    const Scenario sc = make_scenario(nn::OptimizerKind::Adam);
    const auto cfg = scenario_tables(sc, adam());
    const int n = comm->size();
    ShardedEmbedding se(cfg, scenario_plan(cfg, n == 4 ? sc.overrides : other_kinds(), n), *comm);
    int step = 0;
    if (!flag("shard_ckpt_load").empty()) {
      step = static_cast<int>(se.load(flag("shard_ckpt_load")));
      expect_tables(se, flag("shard_ckpt_load") + ".expected");
    }
    if (!flag("shard_ckpt_save").empty()) {
      train_steps(se, *comm, sc, step, 3);
      se.save(flag("shard_ckpt_save"), step + 3);
      save_expected(se, *comm, flag("shard_ckpt_save") + ".expected");
    }
  }
  finalize();
}

// 1 rank saves; 2 ranks load it, train and save; 4 ranks load that; so does 1 rank.
TEST(ShardedCheckpointMpi, OneToTwoToFourAndBack) {
  if (dlrec::testing::mpirun_prefix(2).empty())
    GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin)";
  if (!mpi_built()) GTEST_SKIP() << "this build has no MPI";
  dlrec::testing::TempDir tmp("sharded_ckpt_mpi");
  const std::string one = tmp.path + "/one", two = tmp.path + "/two";
  auto comm = make_single_communicator();
  const Scenario sc = make_scenario(nn::OptimizerKind::Adam);
  const auto cfg = scenario_tables(sc, adam());
  {
    ShardedEmbedding se(cfg, scenario_plan(cfg, sc.overrides, 1), *comm);
    train_steps(se, *comm, sc, 0, 3);
    se.save(one, 3);
    save_expected(se, *comm, one + ".expected");
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto job = [&](int ranks, const std::string& args) {
    const auto r = dlrec::testing::run_job(dlrec::testing::mpirun_prefix(ranks) + self +
                                               " --gtest_color=no"
                                               " --gtest_filter=ShardedCheckpointRanks.* " +
                                               args,
                                           300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    size_t ok = 0;
    for (size_t p = r.output.find("[       OK ] ShardedCheckpointRanks"); p != std::string::npos;
         p = r.output.find("[       OK ] ShardedCheckpointRanks", p + 1))
      ++ok;
    EXPECT_EQ(ok, static_cast<size_t>(ranks)) << r.output;
  };
  job(2, "--shard_ckpt_load=" + one + " --shard_ckpt_save=" + two);
  EXPECT_TRUE(file_exists(two + "/embedding.step-6.rank-1-of-2.dlrec"));
  job(4, "--shard_ckpt_load=" + two);
  ShardedEmbedding back(cfg, scenario_plan(cfg, other_kinds(), 1), *comm);
  EXPECT_EQ(back.load(two), 6);
  expect_tables(back, two + ".expected");
  // A rank's file missing: a clear error, not a partial load.
  std::remove((two + "/embedding.step-6.rank-1-of-2.dlrec").c_str());
  expect_error([&] { back.load(two); }, {"the file of rank 1", "is missing", "2 rank files"});
}

}  // namespace
}  // namespace dlrec::dist
