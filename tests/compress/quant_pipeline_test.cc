// INT8 PTQ end to end: `dlrec compress --quantize` on a trained run (calibration, report,
// export), the Predictor serving the INT8 export, the export format's version (2 for
// compressed models, a newer version refused), and the command's bad inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dlrec/compress/quantize.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/nn/linear_packed.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "test_errors.h"
#include "compress/compress_test_util.h"
#include "test_files.h"

using namespace dlrec;
namespace fs = std::filesystem;
using dlrec::testing::expect_error;

namespace {

const std::string& root() {
  static dlrec::testing::TempDir dir("int8_it");
  return dir.path;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = root() + "/" + name;
  fs::remove_all(d);
  make_dirs(d);
  return d;
}

// An ETL output of `num_dense` dense features.
std::string make_data(const std::string& dir, int num_dense, int64_t rows) {
  return dlrec::testing::make_compress_data(dir, num_dense, rows, 21);
}

struct World {
  std::string data, run;
};

// A trained DCNv2 run (cross and mlp layers).
const World& world() {
  static World w = [] {
    World x;
    const std::string dir = fresh_dir("world");
    x.data = make_data(dir, 4, 3000);
    x.run = dir + "/run";
    const model::RunConfig cfg = model::RunConfig::from_json(parse_json(R"({
      "model": {"arch": "dcnv2", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1],
                "cross_layers": 2},
      "optimizer": {"type": "adam", "lr": 0.01},
      "train": {"batch_size": 128, "epochs": 1, "log_every": 0}})",
                                                                        "test config"));
    train::TrainerOptions opt;
    opt.data_dir = x.data;
    opt.run_dir = x.run;
    train::Trainer(cfg, opt).train();
    return x;
  }();
  return w;
}

using dlrec::testing::dlrec_bin;
using dlrec::testing::run_cli;

#define SKIP_WITHOUT_CLI()       \
  if (!file_exists(dlrec_bin())) \
  GTEST_SKIP() << "the dlrec binary is not built (" << dlrec_bin() << ")"

}  // namespace

TEST(Int8Run, QuantizeReportExportAndPredict) {
  SKIP_WITHOUT_CLI();
  const World& w = world();
  const std::string dir = fresh_dir("q1");
  const std::string fp32 = dir + "/fp32", int8 = dir + "/int8";
  train::export_model(w.run, fp32);
  EXPECT_EQ(read_json_file(fp32 + "/model.json").at("version"), 1);  // plain: version 1
  std::string text;
  ASSERT_EQ(run_cli("compress --run " + w.run + " --out " + int8 +
                        " --quantize --calibration percentile --percentile 99.99"
                        " --calib-batches 2 --calib-batch-size 500 --skip top.1",
                    &text),
            0)
      << text;
  EXPECT_NE(text.find("cross.0.w.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("opted out"), std::string::npos) << text;
  EXPECT_NE(text.find("int8 AUC"), std::string::npos) << text;

  const json model_json = read_json_file(int8 + "/model.json");
  EXPECT_EQ(model_json.at("version"), train::kModelFormatMasks);
  EXPECT_EQ(model_json.at("config").at("compress").at("quantize").at("calibration"), "percentile");
  const json meta = io::read_tensor_meta(int8 + "/weights.dlrec");
  ASSERT_TRUE(meta.contains("quant")) << meta.dump();
  EXPECT_EQ(meta.at("quant").at("weights").size(), 5u);  // bottom 2, cross 2, top.0

  const json report = read_json_file(int8 + "/quant_report.json");
  EXPECT_EQ(report.at("calibration_rows"), 1000);
  ASSERT_EQ(report.at("layers").size(), 6u);
  for (const json& l : report.at("layers")) {
    if (l.at("weight") == "top.1.weight") {
      EXPECT_FALSE(l.at("int8").get<bool>());
      continue;
    }
    EXPECT_TRUE(l.at("int8").get<bool>()) << l.dump();
    EXPECT_GT(l.at("output_rel_l2").get<double>(), 0.0) << l.dump();
    EXPECT_LT(l.at("output_rel_l2").get<double>(), 0.2) << l.dump();
  }
  const double dauc = report.at("validation").at("auc_delta").get<double>();
  EXPECT_LT(std::fabs(dauc), 0.02) << report.dump();

  // The INT8 export serves: close to the fp32 export, not equal to it.
  const io::Batch b = dlrec::testing::first_valid_batch(w.data);
  train::Predictor p32(fp32), p8(int8);
  const std::vector<float> a = p32.predict(b), q = p8.predict(b);
  ASSERT_EQ(a.size(), q.size());
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(double(a[i]) - q[i]));
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 0.05);
  // Loading is deterministic: a second predictor gives the same bits.
  train::Predictor p8b(int8);
  EXPECT_EQ(p8b.predict(b), q);
  // The kernel each weight runs on this CPU (dlrec bench infer prints it): the int8 ones, and
  // the fp32 ones on packed weights (none where the CPU lacks AVX2: OpenBLAS then).
  const std::string int8_kernel =
      std::string("int8 ") + compress::int8_kernel_name(compress::int8_best_kernel()) + " (cpu)";
  const bool packed = nn::fp32_best_kernel() != nn::Fp32Kernel::Reference;
  const std::string fp32_kernel =
      std::string("fp32 ") + nn::fp32_kernel_name(nn::fp32_best_kernel()) + " (packed) (cpu)";
  int64_t int8_lines = 0;
  for (const std::string& l : p8.kernel_report()) {
    if (l.find(int8_kernel) != std::string::npos) {
      ++int8_lines;
    } else {
      EXPECT_TRUE(packed && l.find(fp32_kernel) != std::string::npos) << l;
    }
  }
  EXPECT_EQ(int8_lines, 5);
  const std::vector<std::string> fp32_report = p32.kernel_report();
  EXPECT_EQ(fp32_report.size(), packed ? 6u : 0u);
  for (const std::string& l : fp32_report) EXPECT_NE(l.find(fp32_kernel), std::string::npos) << l;

  // `dlrec predict` runs it: the same scores as the Predictor's.
  const std::string logs = fs::path(w.data).parent_path().string() + "/logs.tsv";
  std::vector<std::string> lines;
  {
    std::ifstream in(logs);
    std::string line;
    while (lines.size() < 30 && std::getline(in, line)) lines.push_back(line);
  }
  const std::vector<float> want = p8.predict_lines(lines, "test");
  const std::string head = dir + "/head.tsv", scores = dir + "/scores.txt";
  {
    std::ofstream o(head);
    for (const auto& l : lines) o << l << "\n";
  }
  ASSERT_EQ(run_cli("predict --model " + int8 + " --input " + head + " --output " + scores, &text),
            0)
      << text;
  std::ifstream got(scores);
  for (size_t i = 0; i < want.size(); ++i) {
    float v = -1;
    ASSERT_TRUE(got >> v) << "line " << i;
    EXPECT_NEAR(v, want[i], 1e-6) << "line " << i;
  }
  // Another calibration over the same directory.
  ASSERT_EQ(run_cli("compress --run " + w.run + " --out " + int8 +
                        " --quantize --overwrite"
                        " --calibration entropy --calib-batches 1 --calib-batch-size 300",
                    &text),
            0)
      << text;
  EXPECT_EQ(read_json_file(int8 + "/quant_report.json").at("calibration").at("calibration"),
            "entropy");
}

TEST(Int8Run, NewerFormatVersionIsRefused) {
  SKIP_WITHOUT_CLI();
  const World& w = world();
  const std::string dir = fresh_dir("q2");
  const std::string m = dir + "/m";
  std::string text;
  ASSERT_EQ(run_cli("compress --run " + w.run + " --out " + m +
                        " --quantize --calibration max --calib-batches 1",
                    &text),
            0)
      << text;
  json mj = read_json_file(m + "/model.json");
  mj["version"] = train::kModelFormatVersion + 1;
  write_file_atomic(m + "/model.json", mj.dump(2));
  expect_error([&] { train::Predictor p(m); },
               {"model format version " + std::to_string(train::kModelFormatVersion + 1),
                "newer than this dlrec reads"});
}

TEST(Int8Run, CorruptInt8RecordsAreRefused) {
  SKIP_WITHOUT_CLI();
  const World& w = world();
  const std::string dir = fresh_dir("q3");
  const std::string m = dir + "/m";
  std::string text;
  ASSERT_EQ(
      run_cli("compress --run " + w.run + " --out " + m + " --quantize --calibration max", &text),
      0)
      << text;
  // Rewrite weights.dlrec (checksummed: edits go through save_tensors) with a -128 weight and
  // then with a zero scale.
  const std::string wf = m + "/weights.dlrec";
  const json meta = io::read_tensor_meta(wf);
  train::Predictor ok(m);  // loads before the edits
  const json mj = read_json_file(m + "/model.json");
  const model::RunConfig cfg = model::RunConfig::from_json(mj.at("config"));
  auto mdl = model::build_model(cfg.model, cfg.optimizer,
                                io::ShardLayout::from_json(mj.at("layout")), Device::cpu(), 0);
  std::vector<model::NamedTensor> all = mdl->parameters();
  const auto quant = compress::prepare_quant(meta, wf, *mdl);
  all.insert(all.end(), quant.begin(), quant.end());
  io::load_tensors(wf, all);
  const json& user_meta = meta;
  for (auto& [name, t] : all)
    if (name == "bottom.0.weight.qweight") static_cast<uint8_t*>(t.raw())[3] = 0x80;
  io::save_tensors(wf, all, user_meta);
  expect_error([&] { train::Predictor p(m); }, {"bottom.0.weight.qweight", "element 3", "-128"});
  for (auto& [name, t] : all) {
    if (name == "bottom.0.weight.qweight") static_cast<uint8_t*>(t.raw())[3] = 1;
    if (name == "top.0.weight.xscale") t.data<float>()[0] = 0.f;
  }
  io::save_tensors(wf, all, user_meta);
  expect_error([&] { train::Predictor p(m); }, {"top.0.weight.xscale", "finite and > 0"});
}

TEST(Int8Run, BadCommandLinesAreClearErrors) {
  SKIP_WITHOUT_CLI();
  const World& w = world();
  const std::string dir = fresh_dir("q4");
  std::string text;
  // Calibration data of another layout (5 dense features instead of 4).
  const std::string other = make_data(dir, 5, 600);
  EXPECT_NE(
      run_cli("compress --run " + w.run + " --out " + dir + "/m --quantize --calib-data " + other,
              &text),
      0);
  EXPECT_NE(text.find("calibration data '" + other + "' has the layout (5 dense"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("4 dense"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir + "/m"));
  EXPECT_NE(run_cli("compress --run " + w.run + " --out " + dir + "/m --quantize --calibration kl",
                    &text),
            0);
  EXPECT_NE(text.find("unknown method 'kl'"), std::string::npos) << text;
  EXPECT_NE(run_cli("compress --run " + w.run + " --out " + dir +
                        "/m --quantize --calibration percentile --percentile 100.5",
                    &text),
            0);
  EXPECT_NE(text.find("percentile: must be in (50, 100)"), std::string::npos) << text;
  EXPECT_NE(
      run_cli("compress --run " + w.run + " --out " + dir + "/m --quantize --skip bottom,tops",
              &text),
      0);
  EXPECT_NE(text.find("'tops' names no quantized layer"), std::string::npos) << text;
  EXPECT_NE(run_cli("compress --run " + w.run + " --out " + dir + "/m --calibration max", &text),
            0);
  EXPECT_NE(text.find("calibration options need --quantize"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir + "/m"));
}

// Row-wise quantized embedding tables through the command (alone, without --quantize): the
// report, the export serving the quantized tables, and the bad flags.
TEST(Int8Run, EmbeddingTablesRowWise) {
  SKIP_WITHOUT_CLI();
  const World& w = world();
  const std::string dir = fresh_dir("emb");
  std::string text;
  ASSERT_EQ(run_cli("compress --run " + w.run + " --out " + dir +
                        "/m4 --embeddings int4 --embedding-scale fp16",
                    &text),
            0)
      << text;
  EXPECT_NE(text.find("int4 rows"), std::string::npos) << text;
  const json report = read_json_file(dir + "/m4/quant_report.json");
  ASSERT_EQ(report.at("embeddings").size(), 3u) << report.dump();  // 3 categorical features
  for (const json& t : report.at("embeddings")) {
    EXPECT_GT(t.at("max_abs_err").get<double>(), 0.0) << t.dump();
    // 4-bit codes (dim 4: 2 bytes) and fp16 scale and bias (4 bytes) a row, against 16 bytes.
    const int64_t rows = t.at("rows").get<int64_t>(), dim = t.at("dim").get<int64_t>();
    EXPECT_EQ(t.at("quantized_bytes").get<int64_t>(), rows * ((dim * 4 + 7) / 8 + 4));
    EXPECT_EQ(t.at("fp32_bytes").get<int64_t>(), rows * dim * 4);
  }
  EXPECT_TRUE(report.at("layers").empty());  // the mlp/cross layers stay fp32 without --quantize
  EXPECT_LT(std::fabs(report.at("validation").at("auc_delta").get<double>()), 0.01);
  const json meta = io::read_tensor_meta(dir + "/m4/weights.dlrec");
  EXPECT_FALSE(meta.contains("quant"));
  train::Predictor p(dir + "/m4");
  const std::vector<float> probs = p.predict(dlrec::testing::first_valid_batch(w.data));
  for (float v : probs) EXPECT_TRUE(v > 0.f && v < 1.f);

  EXPECT_NE(run_cli("compress --run " + w.run + " --out " + dir +
                        "/x --embeddings int8 --embedding-tables nope",
                    &text),
            0);
  EXPECT_NE(text.find("compress.embeddings.tables: 'nope'"), std::string::npos) << text;
  EXPECT_NE(run_cli("compress --run " + w.run + " --out " + dir + "/x --embeddings int3", &text),
            0);
  EXPECT_NE(text.find("int3"), std::string::npos) << text;
  EXPECT_NE(
      run_cli("compress --run " + w.run + " --out " + dir + "/x --embedding-scale fp16", &text), 0);
  EXPECT_NE(text.find("need --embeddings"), std::string::npos) << text;
  EXPECT_NE(run_cli("compress --run " + w.run + " --out " + dir + "/x --embeddings int8 --skip top",
                    &text),
            0);
  EXPECT_NE(text.find("calibration options need --quantize"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir + "/x"));
}

// --sparsity (or --skip-incompatible) with --quantize or --embeddings was ignored: the export
// held no 2:4 masks while the command line asked for them. Now an error before any work, saying
// how to get a 2:4 + INT8 model.
TEST(Int8Run, SparsityWithQuantizeIsAnError) {
  SKIP_WITHOUT_CLI();
  const std::string dir = fresh_dir("sparsity_quant");
  std::string text;
  for (const std::string flags : {"--quantize --sparsity 2:4", "--quantize --skip-incompatible",
                                  "--embeddings int8 --sparsity 2:4"}) {
    EXPECT_EQ(run_cli("compress --run " + dir + "/run --out " + dir + "/m " + flags, &text), 1)
        << flags << ": " << text;
    EXPECT_NE(text.find("prunes a run"), std::string::npos) << flags << ": " << text;
    EXPECT_NE(text.find("prune first (dlrec compress --run RUN --out PRUNED --sparsity 2:4)"),
              std::string::npos)
        << text;
    EXPECT_FALSE(fs::exists(dir + "/m"));
  }
  EXPECT_NE(text.find("--sparsity prunes a run, --embeddings exports one"), std::string::npos)
      << text;
}
