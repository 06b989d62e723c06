// dlrec train | eval
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "commands.h"
#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/launch.h"
#include "dlrec/train/trainer.h"

namespace dlrec::cli {

namespace {
struct TrainArgs {
  std::string config, data, run;
  bool resume = false, deterministic = false;
  int64_t batch_size = 0, max_steps = -2;
  int epochs = 0;
  std::string device, precision;
  int rank = -1, ranks = 0, gpus = 0;
  std::string comm = "auto", metrics_log;
  double comm_timeout = 300;
  int ranks_per_node = 0;
  std::string all_to_all = "auto";
};

model::RunConfig apply(const TrainArgs& a) {
  model::RunConfig cfg = model::RunConfig::load(a.config);
  json o = json::object();
  if (a.batch_size != 0) o["batch_size"] = a.batch_size;
  if (a.epochs != 0) o["epochs"] = a.epochs;
  if (a.max_steps != -2) o["max_steps"] = a.max_steps;
  if (!a.device.empty()) o["device"] = a.device;
  if (!a.precision.empty()) o["precision"] = a.precision;
  if (a.deterministic) o["deterministic"] = true;
  cfg.override_train(o);  // validated as the file's keys are
  return cfg;
}

}  // namespace

// This process's command line (to start the same command as each rank of a job).
std::vector<std::string> own_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), {});
  std::vector<std::string> args;
  size_t at = 0;
  while (at < all.size()) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end - at));
    at = end == std::string::npos ? all.size() : end + 1;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  DLREC_CHECK(n > 0 && !args.empty(), "cannot read this process's command line");
  args[0] = std::string(exe, n);
  return args;
}

void print_eval(const char* what, const train::EvalResult& e) {
  std::printf("%s: %s (%.1fs)\n", what, train::format_eval(e).c_str(), e.seconds);
}

int run_train(const TrainArgs& args, dist::Communicator* comm);

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
  c->add_flag("--deterministic", a->deterministic,
              "Set train.deterministic: GEMM algorithms chosen without timing them, the same bits "
              "run to run (CUDA bf16/fp16)");
  c->add_option("--rank", a->rank,
                "Train on this data-parallel rank's rows only (its shards in <data>/ranks.json, "
                "from `dlrec etl --ranks N`); needs --ranks");
  c->add_option("--ranks", a->ranks,
                "Data-parallel training on N ranks (CPU; docs/DISTRIBUTED.md): started here "
                "through mpirun, or checked against the job's size under mpirun. With --rank: the "
                "number of ranks --rank counts in (must match ranks.json)");
  c->add_option("--gpus", a->gpus,
                "Data-parallel training on N GPUs of this node (one rank per GPU, cuda:<local "
                "rank>), started as --ranks does");
  c->add_option("--comm", a->comm,
                "Communicator: auto (MPI when started by mpirun, else single process), single, mpi")
      ->check(CLI::IsMember({"auto", "single", "mpi"}));
  c->add_option("--comm-timeout", a->comm_timeout,
                "Seconds a collective may wait for the other ranks before the job ends with an "
                "error naming them")
      ->check(CLI::PositiveNumber);
  c->add_option("--ranks-per-node", a->ranks_per_node,
                "Declare nodes of N consecutive ranks (e.g. to test the inter-node path on one "
                "host); 0 (default): nodes from the ranks' host names")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--all-to-all", a->all_to_all,
                "Routing of the all-to-all exchanges: auto (hierarchical when the ranks span "
                "nodes), flat, hierarchical (intra-node, then inter-node)")
      ->check(CLI::IsMember({"auto", "flat", "hierarchical"}));
  c->add_option("--metrics-log", a->metrics_log,
                "Append a JSON line per logged step (loss) and for the final evaluation here");
  return [a]() -> int {
    const int job = a->gpus > 0 ? a->gpus : (a->rank == -1 ? a->ranks : 0);
    DLREC_CHECK(!(a->gpus > 0 && a->ranks > 0), "--gpus and --ranks exclude each other");
    DLREC_CHECK(a->gpus >= 0 && a->ranks >= 0, "--gpus and --ranks must be >= 1");
    dist::JobRequest request;
    request.size = job;
    request.launch = job > 0 && a->comm != "single";
    request.command = "training";
    request.unit = "rank";
    request.option = a->gpus > 0 ? "--gpus" : "--ranks";
    request.comm_kind = a->comm;
    request.comm.timeout_seconds = a->comm_timeout;
    request.exchange.ranks_per_node = a->ranks_per_node;
    request.exchange.all_to_all = dist::parse_all_to_all(a->all_to_all);
    return dist::run_job(request, own_command_line(),
                         [a](dist::Communicator& comm) { return run_train(*a, &comm); });
  };
}

int run_train(const TrainArgs& args, dist::Communicator* comm) {
  const TrainArgs* a = &args;
  {
    train::TrainerOptions opt;
    opt.data_dir = a->data;
    opt.run_dir = a->run;
    opt.resume = a->resume;
    opt.comm = comm;
    opt.comm_timeout_seconds = a->comm_timeout;
    opt.metrics_log = a->metrics_log;
    if (a->rank != -1) {
      DLREC_CHECK(a->rank != -1 && a->ranks != 0, "--rank and --ranks go together");
      opt.rank = a->rank;
      opt.ranks = a->ranks;
      DLREC_CHECK(opt.ranks >= 1, "--ranks must be >= 1, got ", opt.ranks);
      DLREC_CHECK(opt.rank >= 0 && opt.rank < opt.ranks, "--rank ", opt.rank,
                  " is out of range for --ranks ", opt.ranks, " (0 to ", opt.ranks - 1, ")");
    }
    model::RunConfig cfg = apply(*a);
    if (a->gpus > 0) cfg.train.device = "cuda:" + std::to_string(dist::mpi_local_rank());
    train::Trainer trainer(cfg, opt);
    train::TrainResult r = trainer.train();
    const int64_t samples = comm ? comm->all_reduce_value(r.samples) : r.samples;  // the job's
    if (comm && comm->rank() != 0) return 0;  // rank 0 reports for the job
    std::printf("trained: steps=%lld samples=%lld time=%.1fs throughput=%.0f samples/s loss=%.5f\n",
                static_cast<long long>(r.steps), static_cast<long long>(samples), r.seconds,
                r.seconds > 0 ? samples / r.seconds : 0.0, r.last_loss);
    if (r.eval.rows > 0) print_eval("validation", r.eval);
    return 0;
  }
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
