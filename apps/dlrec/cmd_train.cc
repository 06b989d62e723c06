// dlrec train | eval
#include <cstdio>

#include "commands.h"
#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/train/trainer.h"

namespace dlrec::cli {

namespace {
struct TrainArgs {
  std::string config, data, run;
  bool resume = false;
  int64_t batch_size = 0, max_steps = -2;
  int epochs = 0;
  std::string device, precision;
  int rank = -1, ranks = 0;
};

model::RunConfig apply(const TrainArgs& a) {
  model::RunConfig cfg = model::RunConfig::load(a.config);
  if (a.batch_size > 0) cfg.train.batch_size = a.batch_size;
  if (a.epochs > 0) cfg.train.epochs = a.epochs;
  if (a.max_steps != -2) cfg.train.max_steps = a.max_steps;
  if (!a.device.empty()) cfg.train.device = a.device;
  if (!a.precision.empty()) cfg.train.precision = a.precision;
  return cfg;
}

void print_eval(const char* what, const train::EvalResult& e) {
  std::printf("%s: %s (%.1fs)\n", what, train::format_eval(e).c_str(), e.seconds);
}
}  // namespace

Runner add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand("train", "Train a model on an ETL output directory");
  c->add_option("--config", a->config, "Run config JSON (model, optimizer, train)")->required();
  c->add_option("--data", a->data, "ETL output directory (dataset.json + shards)")->required();
  c->add_option("--run", a->run, "Run directory for checkpoints (created)")->required();
  c->add_flag("--resume", a->resume, "Continue from <run>/checkpoint.dlrec if present");
  c->add_option("--batch-size", a->batch_size, "Override train.batch_size");
  c->add_option("--epochs", a->epochs, "Override train.epochs");
  c->add_option("--max-steps", a->max_steps, "Override train.max_steps");
  c->add_option("--device", a->device, "Override train.device (cpu, cuda:N)");
  c->add_option("--precision", a->precision, "Override train.precision (CUDA: fp32, tf32, bf16, fp16)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  c->add_option("--rank", a->rank,
                "Train on this data-parallel rank's rows only (its shards in <data>/ranks.json, "
                "from `dlrec etl --ranks N`); needs --ranks");
  c->add_option("--ranks", a->ranks, "Number of ranks that --rank counts in (must match ranks.json)");
  return [a] {
    train::TrainerOptions opt;
    opt.data_dir = a->data;
    opt.run_dir = a->run;
    opt.resume = a->resume;
    if (a->rank != -1 || a->ranks != 0) {
      DLREC_CHECK(a->rank != -1 && a->ranks != 0, "--rank and --ranks go together");
      opt.rank = a->rank;
      opt.ranks = a->ranks;
      DLREC_CHECK(opt.ranks >= 1, "--ranks must be >= 1, got ", opt.ranks);
      DLREC_CHECK(opt.rank >= 0 && opt.rank < opt.ranks, "--rank ", opt.rank,
                  " is out of range for --ranks ", opt.ranks, " (0 to ", opt.ranks - 1, ")");
    }
    train::Trainer trainer(apply(*a), opt);
    train::TrainResult r = trainer.train();
    std::printf("trained: steps=%lld samples=%lld time=%.1fs throughput=%.0f samples/s loss=%.5f\n",
                static_cast<long long>(r.steps), static_cast<long long>(r.samples), r.seconds,
                r.seconds > 0 ? r.samples / r.seconds : 0.0, r.last_loss);
    if (r.eval.rows > 0) print_eval("validation", r.eval);
    return 0;
  };
}

Runner add_eval(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand("eval", "Evaluate a run's checkpoint on the validation split");
  c->add_option("--run", a->run, "Run directory written by dlrec train")->required();
  c->add_option("--data", a->data, "ETL output directory (default: the run's)");
  return [a] {
    const train::RunInfo info = train::load_run_info(a->run);
    const model::RunConfig& cfg = info.config;
    train::TrainerOptions opt;
    opt.data_dir = a->data.empty() ? train::run_data_dir(a->run, info.run) : a->data;
    std::string ckpt = a->run + "/checkpoint.dlrec";
    DLREC_CHECK(file_exists(ckpt), "no checkpoint at '", ckpt, "'");
    train::Trainer trainer(cfg, opt);
    const train::CheckpointState st = train::load_checkpoint(ckpt, trainer.model());
    train::check_checkpoint_layout(ckpt, st, io::DatasetInfo::load(opt.data_dir).layout,
                                   opt.data_dir);
    print_eval("validation", trainer.evaluate());
    return 0;
  };
}

}  // namespace dlrec::cli
