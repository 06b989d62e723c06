// dlrec bench train: steady-state training throughput (samples/s) of a model config on a CPU
// or a GPU, from random batches already in host memory or from a dataset's shards, warm-up
// excluded; one summary line per batch size. `dlrec bench serve` lives in cmd_bench.cc.
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "commands.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/synthetic_batch.h"
#include "dlrec/model/model.h"

namespace dlrec::cli {

namespace {

// The MLPerf DLRM v1 model (configs/mlperf_dlrm.json), used when no --config is given.
const char* kMlperfDlrm = R"({
  "model": {"embedding_dim": 128, "bottom_mlp": [512, 256, 128],
            "top_mlp": [1024, 1024, 512, 256, 1], "interaction": "dot"},
  "optimizer": {"type": "sgd", "lr": 0.01}})";

struct TrainBenchOptions {
  std::string config, device = "cpu", data, dist = "uniform", batches_arg = "32768", optimizer;
  double lr = -1;
  int steps = 30, warmup = 5, distinct = 8;
  int64_t max_rows = -1;
  bool tf32 = false, reader_only = false;
  std::string precision = "fp32";
  uint64_t seed = 1;
};

std::vector<int64_t> parse_sizes(const std::string& s) {
  std::vector<int64_t> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    DLREC_CHECK(end && *end == '\0' && v > 0, "--batch: '", item, "' is not a positive integer");
    r.push_back(v);
  }
  DLREC_CHECK(!r.empty(), "--batch: no batch size given");
  return r;
}

// The input pipeline alone: batches/s and samples/s of the shard loader (background reader
// threads, prefetch), reading the dataset's training shards start to end `steps` times over
// at most.
int run_reader_bench(const TrainBenchOptions& o, const std::vector<std::string>& shards) {
  DLREC_CHECK(!shards.empty(), "--reader-only needs --data (an ETL output directory)");
  for (int64_t B : parse_sizes(o.batches_arg)) {
    io::Batch b;
    int64_t rows = 0, batches = 0;
    Timer t;
    for (int pass = 0; pass < std::max(1, o.steps / 10); ++pass) {
      io::ShardLoader loader(shards, B);
      while (loader.next(b)) {
        rows += b.rows;
        ++batches;
      }
    }
    const double s = t.seconds();
    std::printf("bench train --reader-only: source=shards batch=%lld batches=%lld rows=%lld "
                "seconds=%.3f batches/s=%.1f samples/s=%.0f\n",
                static_cast<long long>(B), static_cast<long long>(batches),
                static_cast<long long>(rows), s, batches / s, rows / s);
  }
  return 0;
}

int run_train_bench(const TrainBenchOptions& o) {
  model::RunConfig cfg =
      o.config.empty()
          ? model::RunConfig::from_json(parse_json(kMlperfDlrm, "the built-in MLPerf DLRM config"))
          : model::RunConfig::load(o.config);
  if (!o.optimizer.empty()) cfg.optimizer.type = o.optimizer;
  if (o.lr > 0) cfg.optimizer.lr = o.lr;
  const std::string precision = o.tf32 ? "tf32" : o.precision;
  io::ShardLayout layout;
  std::vector<std::string> shards;
  if (!o.data.empty()) {
    io::DatasetInfo info = io::DatasetInfo::load(o.data);
    layout = info.layout;
    for (const auto& s : info.train_shards) shards.push_back(o.data + "/" + s);
  } else {
    layout.num_dense = 13;
    for (int64_t c : io::criteo_kaggle_cardinalities()) {
      layout.cardinalities.push_back(o.max_rows > 0 ? std::min(c, o.max_rows) : c);
      layout.multi_hot.push_back(false);
    }
  }
  if (o.reader_only) return run_reader_bench(o, shards);
  const Device device = Device::parse(o.device);
  Timer build;
  auto m = model::build_model(cfg.model, cfg.optimizer, layout, device, o.seed, precision);
  std::fprintf(stderr, "[bench train] built %s on %s in %.1fs\n", cfg.model.arch.c_str(),
               device.str().c_str(), build.seconds());
  for (int64_t B : parse_sizes(o.batches_arg)) {
    std::vector<io::Batch> batches;
    if (shards.empty()) {
      for (int i = 0; i < o.distinct; ++i)
        batches.push_back(io::random_batch(layout, B, o.dist == "zipf", o.seed * 1000 + B + i));
    }
    std::unique_ptr<io::ShardLoader> loader;
    io::Batch from_disk;
    // The batch of step i: rotated in memory, or streamed from the shards (re-opened at the end).
    auto batch_for = [&](int i) -> const io::Batch& {
      if (shards.empty()) return batches[i % batches.size()];
      if (!loader || !loader->next(from_disk)) {
        loader = std::make_unique<io::ShardLoader>(shards, B);
        DLREC_CHECK(loader->next(from_disk), "dataset '", o.data, "' has no training rows");
      }
      return from_disk;
    };
    for (int i = 0; i < o.warmup; ++i) m->train_step(batch_for(i), 1.0, false);
    m->synchronize();
    int64_t samples = 0;
    Timer t;
    for (int i = 0; i < o.steps; ++i) {
      const io::Batch& b = batch_for(o.warmup + i);
      m->train_step(b, 1.0, false);
      samples += b.rows;
    }
    m->synchronize();
    const double s = t.seconds();
    const double loss = m->train_step(batch_for(0), 1.0, true);
    const double peak_gb =
        device.is_cuda() ? cuda::pool_peak_bytes(device.index) / 1e9 : 0.0;
    std::printf("bench train: arch=%s optimizer=%s device=%s threads=%d source=%s batch=%lld "
                "steps=%d ms/iter=%.3f samples/s=%.0f loss=%.4f precision=%s",
                cfg.model.arch.c_str(), cfg.optimizer.type.c_str(), device.str().c_str(),
                num_threads(),
                shards.empty() ? "memory" : "shards", static_cast<long long>(B), o.steps,
                1e3 * s / o.steps, samples / s, loss, precision.c_str());
    if (device.is_cuda()) std::printf(" peak_mem=%.2fGB", peak_gb);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  CLI::App* b = app.add_subcommand("bench", "Benchmarks: train (throughput), serve (load)");
  b->require_subcommand(1);
  auto o = std::make_shared<TrainBenchOptions>();
  CLI::App* t = b->add_subcommand(
      "train", "Steady-state training samples/s (default: the MLPerf DLRM on 26 Criteo tables)");
  t->add_option("--config", o->config, "Run config (default: configs/mlperf_dlrm.json's model)");
  t->add_option("--device", o->device, "cpu or cuda[:N]");
  t->add_option("--batch", o->batches_arg, "Batch sizes, comma-separated (default 32768)");
  t->add_option("--steps", o->steps, "Timed steps")->check(CLI::Range(1, 1000000));
  t->add_option("--warmup", o->warmup, "Untimed steps first")->check(CLI::Range(0, 1000000));
  t->add_option("--batches", o->distinct, "Distinct in-memory batches, rotated")
      ->check(CLI::Range(1, 1024));
  t->add_option("--dist", o->dist, "Ids: uniform or zipf")->check(CLI::IsMember({"uniform", "zipf"}));
  t->add_option("--max-rows", o->max_rows, "Cap each table's rows (synthetic layout)");
  t->add_option("--data", o->data, "Stream batches from this ETL output's training shards");
  t->add_option("--precision", o->precision, "CUDA arithmetic: fp32, tf32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  t->add_flag("--tf32", o->tf32, "Same as --precision tf32");
  t->add_flag("--reader-only", o->reader_only,
              "Time the shard reader alone (needs --data; --steps/10 passes, at least one)");
  t->add_option("--optimizer", o->optimizer, "Override the config's optimizer")
      ->check(CLI::IsMember({"sgd", "adagrad"}));
  t->add_option("--lr", o->lr, "Override the config's learning rate");
  t->add_option("--seed", o->seed, "Seed of parameters and batches");
  Runner train = [o] { return run_train_bench(*o); };
#ifdef DLREC_WITH_SERVER
  Runner serve = add_bench_serve(b);
#else
  Runner serve = [] { return 1; };
#endif
  Runner etl = add_bench_etl(b);
  CLI::App* e = b->get_subcommand("etl");
  Runner infer = add_bench_infer(b);
  CLI::App* inf = b->get_subcommand("infer");
  return [t, e, inf, train, serve, etl, infer] {
    return t->parsed() ? train() : e->parsed() ? etl() : inf->parsed() ? infer() : serve();
  };
}

}  // namespace dlrec::cli
