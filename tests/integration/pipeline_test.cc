// End-to-end: datagen -> etl -> train -> checkpoint/resume -> export -> predict, and the CLI's
// handling of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "dlrec/core/config.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/nn/linear_packed.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"

using namespace dlrec;
namespace fs = std::filesystem;

namespace {

std::string work_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "dlrec_it_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  make_dirs(d);
  return d;
}

// A small dataset shared by the tests of this file (built once).
struct Dataset {
  std::string dir, logs, data;
  int64_t train_rows = 0;
  double signal_auc = 0;
  io::DatagenConfig gen;
};

const Dataset& dataset() {
  static Dataset ds = [] {
    Dataset d;
    d.dir = work_dir("data");
    d.logs = d.dir + "/logs.tsv";
    d.data = d.dir + "/data";
    d.gen.rows = 30000;
    d.gen.seed = 5;
    d.gen.num_dense = 5;
    d.gen.num_cat = 6;
    d.gen.num_multi_hot = 1;
    d.gen.cardinalities = {50, 300, 2000};
    d.signal_auc = io::generate_file(d.gen, d.logs).signal_auc;
    etl::EtlOptions o;
    o.inputs = {d.logs};
    o.schema = d.gen.schema();
    o.workflow = json::parse(R"({"pipeline": [
      {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                    {"op": "LogOp"}, {"op": "Normalize"}]},
      {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]})");
    o.output_dir = d.data;
    o.train_rows = 25000;
    o.shard_rows = 7000;  // several shards, so positions cross files
    o.block_rows = 1000;
    etl::EtlResult r = etl::run_etl(o);
    d.train_rows = r.train_rows;
    return d;
  }();
  return ds;
}

model::RunConfig small_config(const std::string& optimizer) {
  return model::RunConfig::from_json(json::parse(R"({
    "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
    "optimizer": {"type": ")" + optimizer + R"(", "lr": 0.05},
    "train": {"batch_size": 256, "epochs": 2, "log_every": 0, "checkpoint_every": 20}})"));
}

std::vector<std::vector<float>> weights(model::Model& m) {
  std::vector<std::vector<float>> w;
  for (auto& [name, t] : m.parameters()) w.push_back(t.to_vector<float>());
  for (auto& [name, t] : m.optimizer_state()) w.push_back(t.to_vector<float>());
  return w;
}

int run_cli(const std::string& args, std::string* output) {
  return dlrec::testing::run_dlrec(args, output);
}

}  // namespace

TEST(Pipeline, TrainsAndBeatsChance) {
  const Dataset& d = dataset();
  train::TrainerOptions opt;
  opt.data_dir = d.data;
  opt.run_dir = work_dir("run_basic");
  train::Trainer t(small_config("adagrad"), opt);
  train::TrainResult r = t.train();
  EXPECT_EQ(r.steps, 2 * ((d.train_rows + 255) / 256));
  EXPECT_EQ(r.eval.rows, 5000);
  // At least half of the way from chance to the ceiling of the planted signal.
  EXPECT_GT(r.eval.auc, 0.5 + 0.5 * (d.signal_auc - 0.5))
      << "planted signal not learned (ceiling " << d.signal_auc << ")";
  EXPECT_TRUE(file_exists(opt.run_dir + "/checkpoint.dlrec"));
}

// A run stopped mid-epoch (as by a crash: no final checkpoint) and resumed from its last
// periodic checkpoint ends with exactly the weights of an uninterrupted run.
TEST(Pipeline, ResumeAfterCrashGivesIdenticalWeights) {
  const Dataset& d = dataset();
  for (std::string optimizer : {"sgd", "adagrad"}) {
    train::TrainerOptions full;
    full.data_dir = d.data;
    full.run_dir = work_dir("run_full_" + optimizer);
    train::Trainer a(small_config(optimizer), full);
    a.train();

    train::TrainerOptions crash = full;
    crash.run_dir = work_dir("run_crash_" + optimizer);
    crash.stop_after_steps = 137;  // checkpoint at 120; steps 121..137 are lost
    {
      train::Trainer b(small_config(optimizer), crash);
      train::TrainResult rb = b.train();
      ASSERT_TRUE(rb.stopped_early);
    }
    json meta = io::read_tensor_meta(crash.run_dir + "/checkpoint.dlrec");
    EXPECT_EQ(meta.at("step").get<int64_t>(), 120);
    crash.stop_after_steps = -1;
    crash.resume = true;
    train::Trainer c(small_config(optimizer), crash);
    EXPECT_EQ(c.step(), 120);
    c.train();
    auto wa = weights(a.model()), wc = weights(c.model());
    ASSERT_EQ(wa.size(), wc.size());
    for (size_t i = 0; i < wa.size(); ++i) ASSERT_EQ(wa[i], wc[i]) << optimizer << " tensor " << i;
  }
}

// The exported model scores raw log rows exactly like the trainer's evaluation.
TEST(Pipeline, ExportAndPredictMatchEvaluation) {
  const Dataset& d = dataset();
  train::TrainerOptions opt;
  opt.data_dir = d.data;
  opt.run_dir = work_dir("run_export");
  model::RunConfig cfg = small_config("adagrad");
  cfg.train.epochs = 1;
  train::Trainer t(cfg, opt);
  t.train();
  std::vector<float> eval_probs;
  train::EvalResult ev = t.evaluate(&eval_probs);
  ASSERT_EQ(eval_probs.size(), 5000u);

  std::string model_dir = work_dir("export") + "/model";
  train::export_model(opt.run_dir, model_dir);
  EXPECT_THROW(train::export_model(opt.run_dir, model_dir), Error);  // exists
  std::vector<std::string> lines;
  std::ifstream in(d.logs);
  std::string line;
  for (int64_t i = 0; std::getline(in, line); ++i)
    if (i >= d.train_rows) lines.push_back(line);
  train::Predictor p(model_dir);
  std::vector<float> probs = p.predict_lines(lines, "logs", 777);
  ASSERT_EQ(probs.size(), eval_probs.size());
  double max_diff = 0;
  for (size_t i = 0; i < probs.size(); ++i)
    max_diff = std::max(max_diff, double(std::abs(probs[i] - eval_probs[i])));
  EXPECT_LE(max_diff, 1e-6);
  EXPECT_GT(ev.auc, 0.6);

  // A row's score does not depend on the batch it runs in (the Predictor's packed fp32 layers,
  // nn/linear_packed.h): the first rows again one at a time and in batches of 13.
  if (nn::fp32_best_kernel() == nn::Fp32Kernel::Reference) {
    std::printf("[ skipped  ] batch invariance: this CPU has no AVX2 (OpenBLAS serves)\n");
  } else {
    const std::vector<std::string> head(lines.begin(), lines.begin() + 40);
    for (const int64_t rows : {int64_t{1}, int64_t{13}}) {
      const std::vector<float> again = p.predict_lines(head, "logs", rows);
      ASSERT_EQ(again.size(), head.size());
      for (size_t i = 0; i < head.size(); ++i)
        EXPECT_EQ(again[i], probs[i]) << "batches of " << rows << ", row " << i;
    }
  }

  // The CLI prints the same numbers.
  std::string in_file = work_dir("predict_in") + "/rows.tsv";
  std::ofstream(in_file) << lines[0] << "\n" << lines[1] << "\n";
  std::string out;
  ASSERT_EQ(run_cli("predict --model " + model_dir + " --input " + in_file, &out), 0) << out;
  double p0 = 0, p1 = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "%lf %lf", &p0, &p1), 2) << out;
  EXPECT_NEAR(p0, eval_probs[0], 1e-6);
  EXPECT_NEAR(p1, eval_probs[1], 1e-6);
}

TEST(Pipeline, CorruptCheckpointIsRejected) {
  const Dataset& d = dataset();
  train::TrainerOptions opt;
  opt.data_dir = d.data;
  opt.run_dir = work_dir("run_corrupt");
  model::RunConfig cfg = small_config("sgd");
  cfg.train.max_steps = 5;
  train::Trainer(cfg, opt).train();
  std::string ck = opt.run_dir + "/checkpoint.dlrec";
  std::string bytes = read_file(ck);
  bytes[bytes.size() / 2] ^= 0x5A;
  write_file_atomic(ck, bytes);
  opt.resume = true;
  try {
    train::Trainer t(cfg, opt);
    FAIL() << "corrupt checkpoint accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  write_file_atomic(ck, bytes.substr(0, bytes.size() - 100));
  EXPECT_THROW(train::Trainer(cfg, opt), Error);
}

// The CLI turns errors into one line on stderr and a non-zero exit.
TEST(Cli, BadInputsGiveClearErrors) {
  const Dataset& d = dataset();
  std::string dir = work_dir("cli");
  std::string out;

  // A row with 39 fields.
  std::ofstream(dir + "/short.tsv") << "0\t1\t2\n";
  EXPECT_EQ(run_cli("etl --input " + dir + "/short.tsv --out " + dir + "/o1", &out), 1);
  EXPECT_NE(out.find("short.tsv:1"), std::string::npos) << out;
  EXPECT_NE(out.find("dlrec: error:"), std::string::npos) << out;
  EXPECT_FALSE(file_exists(dir + "/o1/dataset.json"));

  // Unknown config key.
  std::ofstream(dir + "/bad.json") << R"({"model": {"embeding_dim": 8}})";
  EXPECT_EQ(run_cli("train --config " + dir + "/bad.json --data " + d.data + " --run " + dir +
                        "/r",
                    &out),
            1);
  EXPECT_NE(out.find("model.embeding_dim"), std::string::npos) << out;
  EXPECT_NE(out.find("embedding_dim"), std::string::npos) << out;

  // A shard with a bad checksum.
  std::string data2 = dir + "/data2";
  fs::copy(d.data, data2);
  std::string shard = data2 + "/train_00000.shard";
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 3] ^= 0x01;
  write_file_atomic(shard, bytes);
  std::ofstream(dir + "/ok.json") << R"({"model": {"embedding_dim": 8, "bottom_mlp": [8]},
                                         "train": {"log_every": 0}})";
  EXPECT_EQ(run_cli("train --config " + dir + "/ok.json --data " + data2 + " --run " + dir + "/r2",
                    &out),
            1);
  EXPECT_NE(out.find("checksum"), std::string::npos) << out;
  EXPECT_NE(out.find("train_00000.shard"), std::string::npos) << out;

  // The flags that override "train" keys are validated as the file's keys are.
  for (const char* flag : {"--batch-size -3", "--epochs -1", "--max-steps 0", "--device cuda:x"}) {
    EXPECT_EQ(run_cli("train --config " + dir + "/ok.json --data " + d.data + " --run " + dir +
                          "/r3 " + flag,
                      &out),
              1)
        << flag;
    EXPECT_NE(out.find("config key 'train."), std::string::npos) << flag << ": " << out;
  }

  // bench train on the dataset's shards prints a summary; bad batch sizes are errors.
  EXPECT_EQ(run_cli("bench train --config " + dir + "/ok.json --data " + d.data +
                        " --batch 64,128 --steps 3 --warmup 1",
                    &out),
            0)
      << out;
  EXPECT_NE(out.find("source=shards batch=128"), std::string::npos) << out;
  // --deterministic sets train.deterministic (kept in run.json; the CPU is deterministic anyway).
  ASSERT_EQ(run_cli("train --config " + dir + "/ok.json --data " + d.data + " --run " + dir +
                        "/r4 --max-steps 2 --deterministic",
                    &out),
            0)
      << out;
  EXPECT_EQ(read_json_file(dir + "/r4/run.json").at("config").at("train").at("deterministic"),
            true);
  ASSERT_EQ(run_cli("bench train --config " + dir + "/ok.json --data " + d.data +
                        " --batch 64 --steps 2 --warmup 1 --deterministic",
                    &out),
            0)
      << out;
  EXPECT_NE(out.find("deterministic=1"), std::string::npos) << out;
  EXPECT_EQ(run_cli("bench train --config " + dir + "/ok.json --data " + d.data + " --batch 0",
                    &out),
            1);
  EXPECT_NE(out.find("--batch"), std::string::npos) << out;
  // bench infer: the built-in model's table options are refused beside an export (before it
  // loads), and a value outside the choices is an error naming the option.
  EXPECT_EQ(run_cli("bench infer --model " + dir + "/nope --embedding-quant int8", &out), 1);
  EXPECT_NE(out.find("--embedding-quant are for the built-in model"), std::string::npos) << out;
  EXPECT_EQ(run_cli("bench infer --model " + dir + "/nope --cardinalities criteo_1tb", &out), 1);
  EXPECT_NE(out.find("an export (--model) has its own tables"), std::string::npos) << out;
  EXPECT_NE(run_cli("bench infer --embedding-quant int16", &out), 0);
  EXPECT_NE(out.find("--embedding-quant"), std::string::npos) << out;

  // Missing input file, unknown subcommand option.
  EXPECT_EQ(run_cli("etl --input " + dir + "/nope.tsv --out " + dir + "/o2", &out), 1);
  EXPECT_NE(out.find("nope.tsv"), std::string::npos) << out;
  EXPECT_NE(run_cli("train --bogus", &out), 0);
}
