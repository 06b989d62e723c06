// dlrec bench train: steady-state training throughput (samples/s) of a model config on a CPU
// or a GPU, from random batches already in host memory or from a dataset's shards, warm-up
// excluded; one summary line per batch size. `dlrec bench serve` lives in cmd_bench.cc.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "commands.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/planner.h"
#include "dlrec/dist/topology.h"
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
  int steps = 30, warmup = 5, distinct = 8, gpus = 0;
  double comm_timeout = 300;
  int ranks_per_node = 0;           // --ranks-per-node (dist/topology.h)
  std::string all_to_all = "auto";  // --all-to-all
  int64_t max_rows = -1;
  bool tf32 = false, reader_only = false, deterministic = false;
  std::string precision = "fp32";
  std::string cardinalities = "kaggle";  // the synthetic layout's tables
  uint64_t seed = 1;
};

// --gpus with hybrid tables in the config: the bytes their exchange moves per step (the rows
// whose bag has an id >= F, forward and backward, in the model's precision; a rank's rows on the
// owner stay there: (N - 1) / N of them travel on average) against the table-wise exchange of
// the same tables (every row), from the in-memory batches of every rank (rank 0 prints).
void report_hybrid_exchange(dist::Communicator& host, const io::ShardLayout& layout,
                            const std::map<std::string, int64_t>& hybrid,
                            const std::vector<io::Batch>& batches, const model::RunConfig& cfg,
                            const std::string& precision) {
  const int n = host.size();
  const double value = precision == "bf16" || precision == "fp16" ? 2 : 4;
  const double dim = static_cast<double>(cfg.model.embedding_dim);
  int64_t rows = 0, rare = 0;  // over every batch, rank and hybrid table
  for (const io::Batch& b : batches)
    for (const auto& [name, f] : hybrid) {
      const size_t dot = name.rfind('.');
      const int64_t t = dot == std::string::npos ? -1 : std::atoll(name.c_str() + dot + 1);
      if (t < 0 || t >= static_cast<int64_t>(layout.cardinalities.size())) continue;
      const auto& off = b.cat_offsets[t];
      for (int64_t r = 0; r < b.rows; ++r) {
        bool any = false;
        for (int64_t i = off[r]; i < off[r + 1]; ++i) any |= b.cat_indices[t][i] >= f;
        rare += any;
      }
      rows += b.rows;
    }
  rows = host.all_reduce_value(rows);
  rare = host.all_reduce_value(rare);
  if (host.rank() != 0 || rows == 0) return;
  const double steps = static_cast<double>(batches.size()), remote = (n - 1.0) / n;
  const double tw = rows / steps * remote * dim * value * 2,
               hy = rare / steps * remote * dim * value * 2;
  std::fprintf(stderr,
               "[bench train] hybrid tables (%zu): %.1f %% of their rows have an id >= F; their "
               "exchange moves ~%.1f MB per step over all GPUs (forward + backward), table-wise "
               "~%.1f MB\n",
               hybrid.size(), 100.0 * rare / rows, hy / 1e6, tw / 1e6);
}

// --gpus: the exchanges of a model that trains data-parallel on its GPUs (the CUDA engine
// sums inside its step through `gpu`; host-side reductions are never asked of it).
class DeviceReducer final : public model::GradientReducer {
 public:
  DeviceReducer(dist::Communicator& host, dist::Communicator& gpu) : host_(host), gpu_(gpu) {}
  void reduce_dense(const std::vector<Tensor*>&) override {
    fail("bench train --gpus: host-side gradient reduction asked of a device model (bug)");
  }
  void reduce_sparse(const nn::SparseGrad&, nn::SparseGrad&) override {
    fail("bench train --gpus: host-side gradient reduction asked of a device model (bug)");
  }
  dist::Communicator* device_communicator() override { return &gpu_; }
  dist::Communicator* host_communicator() override { return &host_; }

 private:
  dist::Communicator &host_, &gpu_;
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
  std::vector<int> hotness;  // ids per row of each synthetic table (empty: one)
  std::vector<std::string> shards;
  if (!o.data.empty()) {
    io::DatasetInfo info = io::DatasetInfo::load(o.data);
    layout = info.layout;
    for (const auto& s : info.train_shards) shards.push_back(o.data + "/" + s);
  } else {
    // mlperf_dcnv2: every row has the DCNv2 benchmark's fixed number of ids per table.
    layout = io::builtin_layout(o.cardinalities, o.max_rows, hotness);
  }
  if (o.reader_only) return run_reader_bench(o, shards);
  // --gpus N: data-parallel on N GPUs (one rank each, started through mpirun); every rank
  // trains on its own random batches of --batch rows (weak scaling: the global batch is N x).
  std::unique_ptr<dist::Communicator> host, nccl;
  std::map<std::string, int64_t> hybrid_f;  // the config's hybrid tables: F by table name
  std::unique_ptr<DeviceReducer> reducer;
  int rank = 0, ranks = 1;
  Device device = Device::parse(o.device);
  if (o.gpus > 0) {
    DLREC_CHECK(shards.empty(), "bench train --gpus: in-memory batches only (drop --data)");
    dist::CommOptions co;
    co.timeout_seconds = o.comm_timeout;
    dist::ExchangeOptions xo;
    xo.ranks_per_node = o.ranks_per_node;
    xo.all_to_all = dist::parse_all_to_all(o.all_to_all);
    host = dist::make_mpi_communicator(co, xo);
    dist::print_topology(*host, stderr);
    DLREC_CHECK(host->size() == o.gpus, "bench train: this job has ", host->size(),
                " ranks but --gpus ", o.gpus);
    rank = host->rank();
    ranks = host->size();
    device = Device::cuda(dist::mpi_local_rank());
  }
  Timer build;
  const bool deterministic = o.deterministic || cfg.train.deterministic;
  auto m = model::build_model(cfg.model, cfg.optimizer, layout, device, o.seed, precision,
                              deterministic);
  if (o.gpus > 0) {
    nccl = dist::make_nccl_communicator(*host, device.index, dist::CommOptions{o.comm_timeout});
    reducer = std::make_unique<DeviceReducer>(*host, *nccl);
    m->set_gradient_reducer(reducer.get());
    DLREC_CHECK(m->trains_parts_on_device(), "bench train --gpus: the model on ", device.str(),
                " does not train data-parallel on the device");
    // The config's "sharding" section: the embedding tables sharded over the GPUs.
    if (!cfg.sharding.is_null()) {
      ConfigReader r(cfg.sharding, "sharding");
      dist::PlannerOptions po = dist::read_planner_options(r, ranks);
      po.batch_per_rank = parse_sizes(o.batches_arg).front();
      for (const auto& [name, ov] : po.overrides)
        if (ov.kind == dist::ShardingKind::Hybrid && ov.frequent_rows > 0)
          hybrid_f[name] = ov.frequent_rows;
      // The planner's lookups per table: the synthetic hotness (one id each without it).
      const std::vector<double> ids_per_sample(hotness.begin(), hotness.end());
      m->shard_tables(*host, po, ids_per_sample, rank == 0 ? stderr : nullptr);
    }
  }
  // One step: the model's own, or this rank's part of a global batch of `ranks` x its rows.
  auto step = [&](const io::Batch& b, bool want_loss) {
    return o.gpus > 0 ? m->train_step_part(b, b.rows * ranks, 1.0, want_loss)
                      : m->train_step(b, 1.0, want_loss);
  };
  std::fprintf(stderr, "[bench train] built %s on %s in %.1fs\n", cfg.model.arch.c_str(),
               device.str().c_str(), build.seconds());
  for (int64_t B : parse_sizes(o.batches_arg)) {
    std::vector<io::Batch> batches;
    if (shards.empty()) {
      for (int i = 0; i < o.distinct; ++i)
        batches.push_back(io::random_batch(layout, B, o.dist == "zipf",
                                           o.seed * 1000 + B + i + 7919 * rank, hotness));
    }
    if (!hybrid_f.empty()) report_hybrid_exchange(*host, layout, hybrid_f, batches, cfg, precision);
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
    for (int i = 0; i < o.warmup; ++i) step(batch_for(i), false);
    m->synchronize();
    if (host) host->barrier();
    int64_t samples = 0;
    Timer t;
    for (int i = 0; i < o.steps; ++i) {
      const io::Batch& b = batch_for(o.warmup + i);
      step(b, false);
      samples += b.rows * ranks;
    }
    m->synchronize();
    if (host) host->barrier();
    const double s = t.seconds();
    double loss = step(batch_for(0), true);
    if (host) loss = host->all_reduce_value(loss);  // the shares of the global batch's mean
    const double peak_gb =
        device.is_cuda() ? cuda::pool_peak_bytes(device.index) / 1e9 : 0.0;
    if (o.gpus > 0) {  // every GPU's peak, printed by rank 0
      std::vector<double> peaks(ranks);
      host->all_gather(&peak_gb, peaks.data(), 1, dist::Elem::F64);
      if (rank == 0)
        for (int r = 0; r < ranks; ++r)
          std::fprintf(stderr, "[bench train] GPU %d: peak memory of dlrec's allocator %.2f GB\n",
                       r, peaks[r]);
    }
    if (rank != 0) continue;
    std::printf("bench train: arch=%s optimizer=%s device=%s threads=%d source=%s batch=%lld "
                "steps=%d ms/iter=%.3f samples/s=%.0f loss=%.4f precision=%s",
                cfg.model.arch.c_str(), cfg.optimizer.type.c_str(), device.str().c_str(),
                num_threads(),
                shards.empty() ? "memory" : "shards", static_cast<long long>(B), o.steps,
                1e3 * s / o.steps, samples / s, loss, precision.c_str());
    if (device.is_cuda()) std::printf(" peak_mem=%.2fGB", peak_gb);
    if (deterministic) std::printf(" deterministic=1");
    if (o.gpus > 0) std::printf(" gpus=%d rows_per_gpu=%lld", ranks, static_cast<long long>(B));
    std::printf("\n");
  }
  if (o.gpus > 0) m->set_gradient_reducer(nullptr);  // before the communicators go
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
  t->add_option("--cardinalities", o->cardinalities,
                "The synthetic layout's tables: kaggle (Criteo Kaggle, default), criteo_1tb "
                "(the MLPerf DLRM's Criteo-1TB tables, max_ind_range 40M) or mlperf_dcnv2 "
                "(the MLPerf DLRM-DCNv2 tables, multi-hot: a fixed 1-100 ids per table, 214 "
                "per row)")
      ->check(CLI::IsMember({"kaggle", "criteo_1tb", "mlperf_dcnv2"}));
  t->add_option("--data", o->data, "Stream batches from this ETL output's training shards");
  t->add_option("--precision", o->precision, "CUDA arithmetic: fp32, tf32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  t->add_flag("--tf32", o->tf32, "Same as --precision tf32");
  t->add_flag("--deterministic", o->deterministic,
              "GEMM algorithms chosen without timing them: the same bits run to run "
              "(train.deterministic; bf16/fp16)");
  t->add_flag("--reader-only", o->reader_only,
              "Time the shard reader alone (needs --data; --steps/10 passes, at least one)");
  t->add_option("--optimizer", o->optimizer, "Override the config's optimizer")
      ->check(CLI::IsMember({"sgd", "adagrad", "adam"}));
  t->add_option("--lr", o->lr, "Override the config's learning rate");
  t->add_option("--seed", o->seed, "Seed of parameters and batches");
  t->add_option("--gpus", o->gpus,
                "Data-parallel on N GPUs of this node (one rank each, started through mpirun "
                "as dlrec train --gpus is); --batch is per GPU, samples/s of the whole job")
      ->check(CLI::Range(1, 64));
  t->add_option("--comm-timeout", o->comm_timeout,
                "With --gpus: seconds a collective may wait for the other ranks")
      ->check(CLI::PositiveNumber);
  t->add_option("--ranks-per-node", o->ranks_per_node,
                "With --gpus: declare nodes of N consecutive ranks (0: from the host names)")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--all-to-all", o->all_to_all,
                "With --gpus: all-to-all routing: auto, flat, hierarchical")
      ->check(CLI::IsMember({"auto", "flat", "hierarchical"}));
  Runner train = [o] {
    if (o->gpus > 0 && !dist::started_by_mpi_launcher())
      return dist::launch_local_job(o->gpus, own_command_line());
    const int rc = run_train_bench(*o);
    if (o->gpus > 0) dist::finalize();
    return rc;
  };
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
