// dlrec bench infer: latency and throughput of the inference engine alone (no RPC, no
// batching): one call scores one batch of encoded rows, as the server's worker does.
// GPU: CudaModel::predict (CUDA graph per batch bucket, pinned staging, copies included);
// CPU: the model's forward + sigmoid. Default model: the MLPerf DLRM on the 26 Criteo Kaggle
// tables (random weights), or --model DIR (an exported model) for its layout and weights.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "commands.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/synthetic_batch.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/rng.h"
#include "dlrec/nn/row_quant.h"
#include "dlrec/train/export.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/graph_cuda.h"
#endif

namespace dlrec::cli {

namespace {

const char* kMlperfDlrm = R"({
  "model": {"embedding_dim": 128, "bottom_mlp": [512, 256, 128],
            "top_mlp": [1024, 1024, 512, 256, 1], "interaction": "dot"}})";

struct InferBenchOptions {
  std::string config, model_dir, device = "cpu", precision = "fp32", batches_arg = "1,2048,32768";
  std::string kernels = "fastest";  // compressed exports on CUDA: the per-layer kernel policy
  int iters = 200, warmup = 20, distinct = 4;
  bool breakdown = false;  // CUDA: where one chunk of predict() spends its time
  uint64_t seed = 1;
  // The built-in model's tables: kaggle, criteo_1tb or mlperf_dcnv2 (multi-hot), capped at
  // max_rows rows each when > 0; their ids uniform or zipf.
  std::string cardinalities = "kaggle", dist = "uniform";
  int64_t max_rows = -1;
  std::string embedding_quant = "none";  // the built-in model's tables as row-wise codes
};

// Row-wise codes of every table of `layout` (dim `dim`, `bits` 8 or 4, fp32 scale and bias):
// random codes whose values span the tables' initial range, [-a, a] with a = sqrt(1 / rows),
// as random as the fp32 tables the built-in model has (the speed does not depend on them).
std::vector<model::QuantizedTable> random_quantized_tables(const io::ShardLayout& layout,
                                                           int64_t dim, int bits,
                                                           uint64_t seed) {
  std::vector<model::QuantizedTable> out;
  for (size_t t = 0; t < layout.cardinalities.size(); ++t) {
    nn::RowQuantRows q;
    q.rows = layout.cardinalities[t];
    q.dim = dim;
    q.bits = bits;
    const int64_t rb = q.row_bytes();
    q.codes.resize(static_cast<size_t>(q.rows * rb));
    q.scale.resize(static_cast<size_t>(q.rows));
    q.bias.resize(static_cast<size_t>(q.rows));
    const float a = static_cast<float>(std::sqrt(1.0 / static_cast<double>(q.rows)));
    const float scale = 2.f * a / static_cast<float>((1 << bits) - 1);
    const uint64_t s = nn::derive_seed(seed, t);
    parallel_for(0, q.rows, 4096, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        uint8_t* c = q.codes.data() + r * rb;
        for (int64_t k = 0; k < rb; ++k)
          c[k] = static_cast<uint8_t>(nn::uniform_at(s, static_cast<uint64_t>(r * rb + k)) * 256);
        if (bits == 4 && dim % 2) c[rb - 1] &= 15;  // an odd width's unused nibble
        q.scale[static_cast<size_t>(r)] = scale;
        q.bias[static_cast<size_t>(r)] = -a;
      }
    });
    out.push_back({"emb." + std::to_string(t) + ".weight", std::move(q)});
  }
  return out;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

int run_infer_bench(const InferBenchOptions& o) {
  const Device device = Device::parse(o.device);
  io::ShardLayout layout;
  std::vector<int> hotness;  // ids per row of each built-in table (empty: one)
  std::function<std::vector<float>(const io::Batch&)> score;
  std::function<std::vector<std::string>(const io::Batch&)> breakdown;
  std::unique_ptr<train::Predictor> predictor;
  std::unique_ptr<model::Model> m;
  Timer build;
  DLREC_CHECK(o.model_dir.empty() || (o.cardinalities == "kaggle" && o.embedding_quant == "none" &&
                                       o.max_rows < 0 && o.dist == "uniform"),
              "--cardinalities, --max-rows, --dist and --embedding-quant are for the built-in "
              "model: an export (--model) has its own tables (dlrec compress gives it row-wise "
              "quantized ones)");
  if (!o.model_dir.empty()) {
    predictor = std::make_unique<train::Predictor>(o.model_dir, device, o.precision);
    predictor->set_kernel_policy(o.kernels);
    for (const std::string& line : predictor->kernel_report())
      std::fprintf(stderr, "[bench infer] %s\n", line.c_str());
    layout = predictor->workflow().output_layout();
    score = [&](const io::Batch& b) { return predictor->predict(b); };
    breakdown = [&](const io::Batch& b) { return predictor->serving_breakdown(b, 20); };
  } else {
    model::RunConfig cfg = o.config.empty() ? model::RunConfig::from_json(parse_json(
                                                  kMlperfDlrm, "the built-in MLPerf DLRM config"))
                                            : model::RunConfig::load(o.config);
    // mlperf_dcnv2: every row has the DCNv2 benchmark's fixed number of ids per table.
    layout = io::builtin_layout(o.cardinalities, o.max_rows, hotness);
    m = model::build_model(cfg.model, cfg.optimizer, layout, device, o.seed, o.precision);
    // Before anything reads the tables: a CUDA model then never allocates them in fp32.
    if (o.embedding_quant != "none")
      m->set_quantized_tables(random_quantized_tables(
          layout, cfg.model.embedding_dim, o.embedding_quant == "int8" ? 8 : 4, o.seed));
    if (!device.is_cuda()) m->prepare_cpu_inference();  // as train::Predictor does
#ifdef DLREC_WITH_CUDA
    if (auto* cm = dynamic_cast<model::CudaModel*>(m.get())) {
      score = [cm](const io::Batch& b) {
        std::vector<float> p(static_cast<size_t>(b.rows));
        cm->predict(b, p.data());
        return p;
      };
      breakdown = [cm](const io::Batch& b) { return cm->serving_breakdown(b, 20); };
    }
#endif
    if (!score)
      score = [&](const io::Batch& b) {
        std::vector<float> p = m->forward(b, false).to_vector<float>();
        for (float& v : p) v = 1.f / (1.f + std::exp(-v));
        return p;
      };
  }
  std::fprintf(stderr, "[bench infer] model ready on %s in %.1fs\n", device.str().c_str(),
               build.seconds());

  std::stringstream ss(o.batches_arg);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int64_t B = std::stoll(item);
    DLREC_CHECK(B > 0, "--batch: sizes must be positive");
    std::vector<io::Batch> batches;
    for (int i = 0; i < o.distinct; ++i)
      batches.push_back(
          io::random_batch(layout, B, o.dist == "zipf", o.seed * 7919 + B + i, hotness));
    for (int i = 0; i < o.warmup; ++i) score(batches[i % batches.size()]);
    std::vector<double> us;
    us.reserve(o.iters);
    double checksum = 0;
    Timer total;
    for (int i = 0; i < o.iters; ++i) {
      Timer t;
      std::vector<float> p = score(batches[i % batches.size()]);
      us.push_back(t.seconds() * 1e6);
      checksum += p[0];
    }
    const double s = total.seconds();
    std::printf("bench infer: device=%s precision=%s batch=%lld iters=%d p50_us=%.1f p90_us=%.1f "
                "p99_us=%.1f mean_us=%.1f samples/s=%.0f checksum=%.4f\n",
                device.str().c_str(), o.precision.c_str(), static_cast<long long>(B), o.iters,
                quantile(us, 0.5), quantile(us, 0.9), quantile(us, 0.99), 1e6 * s / o.iters,
                B * o.iters / s, checksum / o.iters);
    std::fflush(stdout);
    if (o.breakdown) {
      const std::vector<std::string> lines =
          breakdown ? breakdown(batches[0]) : std::vector<std::string>{};
      if (lines.empty()) std::printf("bench infer: breakdown: not available for this model\n");
      for (const std::string& line : lines)
        std::printf("bench infer: breakdown %s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  // The tables (fp32 or codes; allocated on first use), the weights and the batches' buffers.
  if (device.is_cuda())
    std::printf("bench infer: device memory peak %.2f GiB\n",
                static_cast<double>(cuda::pool_peak_bytes(device.index)) / (1 << 30));
  // Compressed layers: the kernel each layer chose per batch size, with every candidate's time.
  if (predictor)
    for (const std::string& line : predictor->kernel_report())
      std::printf("bench infer: kernel %s\n", line.c_str());
  return 0;
}

}  // namespace

Runner add_bench_infer(CLI::App* bench) {
  auto o = std::make_shared<InferBenchOptions>();
  CLI::App* c = bench->add_subcommand(
      "infer", "Inference engine alone: latency percentiles and samples/s per batch size");
  c->add_option("--config", o->config, "Run config for the model (default: MLPerf DLRM)");
  c->add_option("--model", o->model_dir, "Exported model directory instead of random weights");
  c->add_option("--device", o->device, "cpu or cuda[:N]");
  c->add_option("--precision", o->precision, "CUDA arithmetic: fp32, tf32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  c->add_option("--batch", o->batches_arg, "Batch sizes, comma-separated (default 1,2048,32768)");
  c->add_option("--iters", o->iters, "Timed calls per batch size")->check(CLI::Range(1, 10000000));
  c->add_option("--warmup", o->warmup, "Untimed calls first")->check(CLI::Range(0, 1000000));
  c->add_option("--batches", o->distinct, "Distinct batches, rotated")->check(CLI::Range(1, 1024));
  c->add_option("--seed", o->seed, "Seed of weights and inputs");
  c->add_option("--cardinalities", o->cardinalities,
                "The built-in model's tables: kaggle (Criteo Kaggle, 33.8M rows, default) or "
                "criteo_1tb (the MLPerf DLRM's Criteo-1TB tables, 187.8M rows) or mlperf_dcnv2 "
                "(the MLPerf DLRM-DCNv2 tables, 204M rows, with its ids per row: 214)")
      ->check(CLI::IsMember({"kaggle", "criteo_1tb", "mlperf_dcnv2"}));
  c->add_option("--max-rows", o->max_rows, "Cap each built-in table's rows");
  c->add_option("--dist", o->dist, "The built-in model's ids: uniform or zipf")
      ->check(CLI::IsMember({"uniform", "zipf"}));
  c->add_option("--embedding-quant", o->embedding_quant,
                "The built-in model's tables served from row-wise codes (random, fp32 scale and "
                "bias per row): none (fp32 tables, default), int8 or int4")
      ->check(CLI::IsMember({"none", "int8", "int4"}));
  c->add_flag("--breakdown", o->breakdown,
              "CUDA: after each batch size, where one chunk of predict() spends its time (host "
              "packing, input copy, each layer's and dense layer's device time run eagerly, the "
              "captured graph), 20 runs");
  c->add_option("--kernels", o->kernels,
                "Compressed exports on CUDA: per-layer kernel policy, fastest (timed per batch "
                "size; dense is a candidate), compressed or dense")
      ->check(CLI::IsMember({"fastest", "compressed", "dense"}));
  return [o] { return run_infer_bench(*o); };
}

}  // namespace dlrec::cli
