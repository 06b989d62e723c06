// dlrec demo: datagen -> etl -> train (one epoch) -> eval -> export -> predict, timed.
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "commands.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"

namespace dlrec::cli {

namespace {
// The demo's ETL workflow and model; kept here so the demo runs from any directory.
const char* kDemoWorkflow = R"({
  "pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 3}]}
  ]
})";
const char* kDemoModel = R"({
  "model": {"arch": "dlrm", "embedding_dim": 16, "bottom_mlp": [64, 16], "top_mlp": [64, 1],
            "interaction": "dot"},
  "optimizer": {"type": "adagrad", "lr": 0.05},
  "train": {"batch_size": 512, "epochs": 1, "log_every": 500, "eval_batch_size": 16384}
})";
}  // namespace

Runner add_demo(CLI::App& app) {
  struct Args {
    int64_t rows = 2000000;
    std::string work = "dlrec-demo";
    uint64_t seed = 42;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("demo", "Run the whole pipeline on synthetic data");
  c->add_option("--rows", a->rows, "Synthetic rows (default 2,000,000)");
  c->add_option("--work", a->work, "Working directory (default ./dlrec-demo, replaced)");
  c->add_option("--seed", a->seed, "Data seed");
  return [a] {
    namespace fs = std::filesystem;
    fs::remove_all(a->work);
    make_dirs(a->work);
    const std::string logs = a->work + "/logs.tsv", data = a->work + "/data",
                      run = a->work + "/run", model_dir = a->work + "/model";
    Timer total;
    std::vector<std::pair<std::string, double>> times;

    Timer t;
    io::DatagenConfig gcfg;
    gcfg.rows = a->rows;
    gcfg.seed = a->seed;
    io::DatagenResult g = io::generate_file(gcfg, logs);
    times.emplace_back("datagen", t.seconds());
    std::printf("[demo] datagen: %lld rows (%.0f MB), positives %.3f, signal AUC ceiling %.4f, %.1fs\n",
                static_cast<long long>(g.rows), g.bytes / 1e6, g.positive_rate, g.signal_auc,
                times.back().second);

    t.reset();
    etl::EtlOptions eo;
    eo.inputs = {logs};
    eo.schema = gcfg.schema();
    eo.workflow = parse_json(kDemoWorkflow, "the demo workflow");
    eo.output_dir = data;
    eo.valid_ratio = 0.1;
    etl::EtlResult er = etl::run_etl(eo);
    times.emplace_back("etl", t.seconds());
    std::printf("[demo] etl: %lld train + %lld validation rows, %.1fs (%.0f MB/s)\n",
                static_cast<long long>(er.train_rows), static_cast<long long>(er.valid_rows),
                times.back().second, er.input_bytes / 1e6 / times.back().second);

    t.reset();
    model::RunConfig cfg =
        model::RunConfig::from_json(parse_json(kDemoModel, "the demo model config"));
    train::TrainerOptions to;
    to.data_dir = data;
    to.run_dir = run;
    train::Trainer trainer(cfg, to);
    train::TrainResult tr = trainer.train();
    times.emplace_back("train", t.seconds());
    std::printf("[demo] train: %lld steps, %.0f samples/s, last loss %.4f, %.1fs\n",
                static_cast<long long>(tr.steps), tr.samples / tr.seconds, tr.last_loss,
                times.back().second);

    t.reset();
    std::vector<float> eval_probs;
    train::EvalResult ev = trainer.evaluate(&eval_probs);
    times.emplace_back("eval", t.seconds());
    std::printf("[demo] eval: %lld rows, AUC %.4f (signal ceiling %.4f), logloss %.4f, %.1fs\n",
                static_cast<long long>(ev.rows), ev.auc, g.signal_auc, ev.logloss,
                times.back().second);

    t.reset();
    train::export_model(run, model_dir);
    times.emplace_back("export", t.seconds());

    t.reset();
    // The first validation rows, raw as in the log file, scored by the exported model.
    std::vector<std::string> lines;
    {
      std::ifstream in(logs);
      std::string line;
      for (int64_t i = 0; i < er.train_rows + 5 && std::getline(in, line); ++i)
        if (i >= er.train_rows) lines.push_back(line);
    }
    train::Predictor predictor(model_dir);
    std::vector<float> p = predictor.predict_lines(lines, logs);
    times.emplace_back("predict", t.seconds());
    double max_diff = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      max_diff = std::max(max_diff, double(std::abs(p[i] - eval_probs[i])));
      std::printf("[demo] predict row %lld: p=%.6f (trainer's evaluation %.6f)\n",
                  static_cast<long long>(er.train_rows + i + 1), p[i], eval_probs[i]);
    }

    std::printf("\n[demo] stage times:");
    for (auto& [name, s] : times) std::printf(" %s %.1fs,", name.c_str(), s);
    std::printf(" total %.1fs\n", total.seconds());
    std::printf("[demo] validation AUC %.4f (signal ceiling %.4f); predict vs eval max |diff| %.2g\n",
                ev.auc, g.signal_auc, max_diff);
    return 0;
  };
}

}  // namespace dlrec::cli
