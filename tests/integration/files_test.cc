// The files a run reads, end to end, against hostile or inconsistent content: deeply nested
// JSON in every document dlrec reads, a dataset.json that disagrees with its shards, run.json
// read from another directory, NaN weights at eval and predict, and error text with a NUL.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cli_test_util.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
namespace fs = std::filesystem;
using dlrec::testing::expect_error;
using dlrec::testing::read_all;
using dlrec::testing::write_file;

namespace {

// Everything of this file lives in one scratch directory, removed when the program exits.
const std::string& root() {
  static dlrec::testing::TempDir dir("files_it");
  return dir.path;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = root() + "/" + name;
  fs::remove_all(d);
  make_dirs(d);
  return d;
}

model::RunConfig tiny_config() {
  return model::RunConfig::from_json(parse_json(R"({
    "model": {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
    "optimizer": {"type": "sgd", "lr": 0.05},
    "train": {"batch_size": 256, "epochs": 1, "log_every": 0}})",
                                                "test config"));
}

// Raw logs, an ETL output, a trained run and its export (built once).
struct World {
  std::string logs, data, run, model;
};

const World& world() {
  static World w = [] {
    World x;
    const std::string dir = fresh_dir("world");
    x.logs = dir + "/logs.tsv";
    x.data = dir + "/data";
    x.run = dir + "/run";
    x.model = dir + "/model";
    io::DatagenConfig gen;
    gen.rows = 3000;
    gen.seed = 7;
    gen.num_dense = 3;
    gen.num_cat = 3;
    gen.cardinalities = {20, 100};
    io::generate_file(gen, x.logs);
    etl::EtlOptions o;
    o.inputs = {x.logs};
    o.schema = gen.schema();
    o.workflow = parse_json(R"({"pipeline": [
      {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"}]},
      {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})",
                            "test workflow");
    o.output_dir = x.data;
    o.train_rows = 2500;
    o.shard_rows = 1000;
    etl::run_etl(o);
    train::TrainerOptions opt;
    opt.data_dir = x.data;
    opt.run_dir = x.run;
    train::Trainer(tiny_config(), opt).train();
    train::export_model(x.run, x.model);
    return x;
  }();
  return w;
}

int run_cli(const std::string& args, std::string* output) {
  return dlrec::testing::run_dlrec(args, output);
}

// A JSON document nested 100000 levels deep inside an object (once a stack overflow).
std::string deep_json() {
  return R"({"x": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
}

// Every float tensor of `tensors` filled with NaN.
void poison(const std::vector<io::NamedTensor>& tensors) {
  for (const auto& [name, t] : tensors)
    if (t.dtype() == DType::F32) {
      std::vector<float> v(t.numel(), std::numeric_limits<float>::quiet_NaN());
      copy_bytes(t.raw(), t.device(), v.data(), Device::cpu(), v.size() * sizeof(float));
    }
}

}  // namespace

TEST(Files, DeeplyNestedJsonIsAClearErrorInEveryReader) {
  const World& w = world();
  const std::string dir = fresh_dir("deep");
  const std::string deep = write_file(dir, "deep.json", deep_json());
  const char* kDepth = "nesting deeper than 64";
  expect_error([&] { model::RunConfig::load(deep); }, {"deep.json", kDepth});
  expect_error([&] { etl::Workflow::load(deep); }, {"deep.json", kDepth});
  // dataset.json, ranks.json, run.json, model.json in copies of real directories.
  const std::string data = dir + "/data";
  fs::copy(w.data, data);
  write_file(data, "dataset.json", deep_json());
  expect_error([&] { io::DatasetInfo::load(data); }, {"dataset.json", kDepth});
  write_file(data, "ranks.json", deep_json());
  expect_error([&] { io::load_rank_shards(data, 0, 1); }, {"ranks.json", kDepth});
  const std::string run = dir + "/run";
  fs::copy(w.run, run);
  write_file(run, "run.json", deep_json());
  expect_error([&] { train::export_model(run, dir + "/out"); }, {"run.json", kDepth});
  const std::string model = dir + "/model";
  fs::copy(w.model, model);
  write_file(model, "model.json", deep_json());
  expect_error([&] { train::Predictor p(model); }, {"model.json", kDepth});
  fs::copy(w.model + "/model.json", model + "/model.json", fs::copy_options::overwrite_existing);
  write_file(model, "workflow.json", deep_json());
  expect_error([&] { train::Predictor p(model); }, {"workflow.json", kDepth});
  // A checkpoint whose header JSON (meta) nests deeper than the limit (checksum valid).
  json meta = json::array();
  for (int i = 0; i < 500; ++i) meta = json::array({meta});
  io::save_tensors(dir + "/ckpt.dlrec", {}, meta);
  expect_error([&] { io::read_tensor_meta(dir + "/ckpt.dlrec"); }, {"ckpt.dlrec", kDepth});
  // The command line's own readers: schema, datagen config, parquet write --from-json, config.
  std::string out;
  EXPECT_EQ(
      run_cli("etl --input " + w.logs + " --format csv --schema " + deep + " --out " + dir + "/o",
              &out),
      1);
  EXPECT_NE(out.find(kDepth), std::string::npos) << out;
  EXPECT_EQ(run_cli("datagen --config " + deep + " --out " + dir + "/g.tsv", &out), 1);
  EXPECT_NE(out.find(kDepth), std::string::npos) << out;
  EXPECT_EQ(run_cli("parquet write --from-json " + deep + " --out " + dir + "/p.parquet", &out), 1);
  EXPECT_NE(out.find(kDepth), std::string::npos) << out;
  EXPECT_EQ(run_cli("train --config " + deep + " --data " + w.data + " --run " + dir + "/r", &out),
            1);
  EXPECT_NE(out.find(kDepth), std::string::npos) << out;
}

// A NUL byte in a message (here an unknown key of the config) reached the terminal cut off.
TEST(Files, ErrorTextAfterANulByteIsPrinted) {
  const World& w = world();
  const std::string dir = fresh_dir("nul");
  write_file(dir, "cfg.json", R"({"model": {"embedding_dim": 4}, "a\u0000b": 1})");
  std::string out;
  EXPECT_EQ(run_cli("train --config " + dir + "/cfg.json --data " + w.data + " --run " + dir + "/r",
                    &out),
            1);
  EXPECT_NE(out.find("a\\0b'"), std::string::npos) << out;
}

TEST(Files, DatasetJsonThatDisagreesWithItsShardsIsRefused) {
  const World& w = world();
  const std::string data = fresh_dir("rows") + "/data";
  fs::copy(w.data, data);
  json j = read_json_file(data + "/dataset.json");
  const int64_t rows = j.at("train_rows").get<int64_t>();
  j["train_rows"] = 1;  // once: one step of training, no word said
  write_file(data, "dataset.json", j.dump());
  train::TrainerOptions opt;
  opt.data_dir = data;
  expect_error([&] { train::Trainer t(tiny_config(), opt); },
               {"dataset.json", "train_rows is 1", "hold " + std::to_string(rows) + " rows"});
}

// run.json holds the data directory absolute, so eval and export work from anywhere; the
// relative one of an older run.json is found beside the run, or named in the error.
TEST(Files, RunJsonDataDirWorksFromAnotherDirectory) {
  const World& w = world();
  const std::string dir = fresh_dir("cwd");
  const std::string here = fs::current_path().string();
  fs::copy(w.data, dir + "/data");
  ASSERT_EQ(::chdir(dir.c_str()), 0);
  {
    train::TrainerOptions opt;
    opt.data_dir = "data";  // relative to the training directory
    opt.run_dir = "run";
    model::RunConfig cfg = tiny_config();
    cfg.train.max_steps = 2;
    train::Trainer(cfg, opt).train();
  }
  ASSERT_EQ(::chdir(here.c_str()), 0);
  const json run = read_json_file(dir + "/run/run.json");
  EXPECT_EQ(run.at("data_dir").get<std::string>(),
            fs::path(dir + "/data").lexically_normal().string());
  train::export_model(dir + "/run", dir + "/model");  // from elsewhere
  EXPECT_TRUE(file_exists(dir + "/model/weights.dlrec"));
  std::string out;
  EXPECT_EQ(run_cli("eval --run " + dir + "/run", &out), 0) << out;
  // An older run.json, relative: resolved beside the run directory.
  json old = run;
  old["data_dir"] = "data";
  write_file(dir + "/run", "run.json", old.dump());
  EXPECT_EQ(train::run_data_dir(dir + "/run", old), dir + "/data");
  train::export_model(dir + "/run", dir + "/model2");
  old["data_dir"] = "elsewhere/data";
  expect_error([&] { train::run_data_dir(dir + "/run", old); },
               {"run.json", "'elsewhere/data' relative to where training ran", "--data"});
}

TEST(Files, NaNWeightsAreRefusedByEvalAndPredict) {
  const World& w = world();
  const std::string dir = fresh_dir("poisoned");
  // A checkpoint with NaN weights: eval is an error that counts the NaN scores (it once hung).
  fs::copy(w.run, dir + "/run");
  {
    train::TrainerOptions opt;
    opt.data_dir = w.data;
    train::Trainer t(tiny_config(), opt);
    train::load_checkpoint(dir + "/run/checkpoint.dlrec", t.model());
    poison(t.model().parameters());
    expect_error([&] { t.evaluate(); }, {"500 of 500 scores are NaN"});
    train::save_checkpoint(dir + "/run/checkpoint.dlrec", t.model(), tiny_config(),
                           io::DatasetInfo::load(w.data).layout, {1, 256});
  }
  std::string out;
  EXPECT_EQ(run_cli("eval --run " + dir + "/run", &out), 1) << out;
  EXPECT_NE(out.find("scores are NaN"), std::string::npos) << out;
  // An exported model with NaN weights: refused at load, and `predict` prints no "nan".
  fs::copy(w.model, dir + "/model");
  {
    const io::ShardLayout layout = io::DatasetInfo::load(w.data).layout;
    const model::RunConfig cfg = tiny_config();
    auto m = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 0);
    io::load_tensors(dir + "/model/weights.dlrec", m->parameters());
    poison(m->parameters());
    io::save_tensors(dir + "/model/weights.dlrec", m->parameters(), {{"kind", "weights"}});
  }
  expect_error([&] { train::Predictor p(dir + "/model"); },
               {"weights.dlrec", "non-finite", "element 0"});
  EXPECT_EQ(run_cli("predict --model " + dir + "/model --input " + w.logs, &out), 1);
  EXPECT_NE(out.find("non-finite"), std::string::npos) << out;
  EXPECT_EQ(out.find("nan"), std::string::npos) << out;
}

// A checkpoint trained on another data layout (here: a feature's multi-hot flag, which no
// tensor shape shows) is refused by resume, eval and export instead of being used silently.
TEST(Files, CheckpointOfAnotherDataLayoutIsRefused) {
  const World& w = world();
  const std::string dir = fresh_dir("layout");
  fs::copy(w.run, dir + "/run");
  const std::string ckpt = dir + "/run/checkpoint.dlrec";
  {
    train::TrainerOptions opt;
    opt.data_dir = w.data;
    train::Trainer t(tiny_config(), opt);
    const train::CheckpointState st = train::load_checkpoint(ckpt, t.model());
    io::ShardLayout other = io::DatasetInfo::load(w.data).layout;
    other.multi_hot[0] = !other.multi_hot[0];
    train::save_checkpoint(ckpt, t.model(), tiny_config(), other, st);
  }
  const char* kWhy = "was trained on the data layout";
  expect_error([&] { train::export_model(dir + "/run", dir + "/model"); },
               {"checkpoint.dlrec", kWhy});
  train::TrainerOptions opt;
  opt.data_dir = w.data;
  opt.run_dir = dir + "/run";
  opt.resume = true;
  expect_error([&] { train::Trainer t(tiny_config(), opt); }, {"checkpoint.dlrec", kWhy});
  std::string out;
  EXPECT_EQ(run_cli("eval --run " + dir + "/run", &out), 1) << out;
  EXPECT_NE(out.find(kWhy), std::string::npos) << out;
}
