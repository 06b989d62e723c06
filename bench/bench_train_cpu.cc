// CPU training throughput of the DLRM (samples/s): forward, BCE loss, backward and the optimizer
// step on in-memory random batches. The peer is bench/pytorch_dlrm_cpu.py (same model, batch,
// optimizer and thread count).
//
//   bench_train_cpu [--config configs/dlrm_criteo.json] [--threads N] [--batch 4096]
//                   [--steps 50] [--warmup 5] [--max-rows 1000000] [--optimizer sgd|adagrad]
//                   [--dist zipf|uniform] [--cardinalities c1,c2,...] [--seed 1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/synthetic_batch.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "dlrec/nn/rng.h"

namespace {

using namespace dlrec;

// Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features.

struct Args {
  std::string config = "configs/dlrm_criteo.json";
  int threads = 0;
  int64_t batch = 4096;
  int steps = 50;
  int warmup = 5;
  int64_t max_rows = 1000000;
  std::string optimizer;  // empty: the config's
  std::string dist = "zipf";
  std::vector<int64_t> cards = io::criteo_kaggle_cardinalities();
  uint64_t seed = 1;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: bench_train_cpu [--config PATH] [--threads N] [--batch B] [--steps S] "
               "[--warmup W] [--max-rows R] [--optimizer sgd|adagrad] [--dist zipf|uniform] "
               "[--cardinalities c1,c2,...] [--seed S]\n",
               msg);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") usage("");
    if (i + 1 >= argc) usage(("missing value for " + k).c_str());
    std::string v = argv[++i];
    if (k == "--config") a.config = v;
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--batch") a.batch = std::atoll(v.c_str());
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--warmup") a.warmup = std::atoi(v.c_str());
    else if (k == "--max-rows") a.max_rows = std::atoll(v.c_str());
    else if (k == "--optimizer") a.optimizer = v;
    else if (k == "--dist") a.dist = v;
    else if (k == "--seed") a.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--cardinalities") {
      a.cards.clear();
      size_t p = 0;
      while (p <= v.size()) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        a.cards.push_back(std::atoll(v.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else {
      usage(("unknown option " + k).c_str());
    }
  }
  if (a.batch <= 0 || a.steps <= 0 || a.warmup < 0) usage("batch and steps must be positive");
  if (a.dist != "zipf" && a.dist != "uniform") usage("--dist is zipf or uniform");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    set_num_threads(a.threads);
    model::RunConfig cfg;
    if (file_exists(a.config)) {
      cfg = model::RunConfig::load(a.config);
    } else {
      std::fprintf(stderr, "note: %s not found, using the built-in dlrm_criteo model\n",
                   a.config.c_str());
      cfg.model.bottom_mlp = {512, 256, 64, 16};
      cfg.model.top_mlp = {512, 256, 1};
      cfg.optimizer.type = "adagrad";
      cfg.optimizer.lr = 0.02;
    }
    if (!a.optimizer.empty()) cfg.optimizer.type = a.optimizer;

    io::ShardLayout layout;
    layout.num_dense = 13;
    int64_t total_rows = 0;
    for (int64_t c : a.cards) {
      layout.cardinalities.push_back(std::max<int64_t>(1, std::min(c, a.max_rows)));
      layout.multi_hot.push_back(false);
      total_rows += layout.cardinalities.back();
    }
    Timer build_timer;
    auto m = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), a.seed);
    std::fprintf(stderr, "built model: %zu tables, %lld embedding rows (%.2f GB with state) in %.1f s\n",
                 layout.cardinalities.size(), static_cast<long long>(total_rows),
                 total_rows * cfg.model.embedding_dim * 4.0 *
                     (cfg.optimizer.type == "adagrad" ? 2 : 1) / 1e9,
                 build_timer.seconds());

    // Enough distinct batches that a short run does not memorise them (a saturated model
    // back-propagates tiny, denormal gradients and times something unrealistic).
    const int kBatches = 32;
    std::vector<io::Batch> batches;
    for (int i = 0; i < kBatches; ++i)
      batches.push_back(io::random_batch(layout, a.batch, a.dist == "zipf", a.seed * 1000 + i));

    Tensor dz;
    double loss = 0;
    auto step = [&](int i) {
      const io::Batch& b = batches[i % kBatches];
      Tensor z = m->forward(b, true);
      loss = nn::bce_with_logits(z, b.labels.data(), &dz);
      m->backward_and_update(dz, 1.0);
    };
    for (int i = 0; i < a.warmup; ++i) step(i);
    Timer t;
    for (int i = 0; i < a.steps; ++i) step(i);
    const double s = t.seconds();
    const double sps = static_cast<double>(a.batch) * a.steps / s;
    std::printf(
        "dlrec cpu train: config=%s optimizer=%s threads=%d batch=%lld steps=%d dist=%s "
        "time=%.3f s step=%.2f ms loss=%.4f\n",
        a.config.c_str(), cfg.optimizer.type.c_str(), num_threads(),
        static_cast<long long>(a.batch), a.steps, a.dist.c_str(), s, 1e3 * s / a.steps, loss);
    std::printf("samples/s: %.0f\n", sps);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
