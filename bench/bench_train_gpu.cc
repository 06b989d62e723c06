// GPU training throughput of the DLRM (samples/s): the MLPerf DLRM v1 model by default
// (embedding dim 128, bottom 13-512-256-128, top 1024-1024-512-256-1, dot interaction, the 26
// Criteo Kaggle tables, one id per table, SGD), on synthetic batches pre-generated in host
// memory (several distinct ones, rotated). Each step copies its batch to the device (pinned
// staging), runs forward, BCE, backward and the updates; warm-up steps are excluded and the
// loss is read back only after the timed steps. The peer is bench/pytorch_dlrm_gpu.py.
//
//   bench_train_gpu [--batch 32768,55296] [--steps 50] [--warmup 10] [--batches 8]
//                   [--optimizer sgd|adagrad] [--lr 0.01] [--dist uniform|zipf]
//                   [--cardinalities c1,...] [--max-rows R] [--tf32] [--device 0] [--seed 1]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/synthetic_batch.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/rng.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/dlrm_cuda.h"
#endif

namespace {

using namespace dlrec;


std::vector<int64_t> parse_list(const std::string& v) {
  std::vector<int64_t> r;
  size_t p = 0;
  while (p <= v.size()) {
    size_t q = v.find(',', p);
    if (q == std::string::npos) q = v.size();
    r.push_back(std::atoll(v.substr(p, q - p).c_str()));
    p = q + 1;
  }
  return r;
}

struct Args {
  std::vector<int64_t> batches_sizes = {32768, 55296};
  int steps = 50, warmup = 10, distinct = 8, device = 0;
  std::string optimizer = "sgd", dist = "uniform";
  double lr = 0.01;
  std::vector<int64_t> cards = io::criteo_kaggle_cardinalities();
  int64_t max_rows = -1;
  bool tf32 = false;
  uint64_t seed = 1;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: bench_train_gpu [--batch B1,B2] [--steps S] [--warmup W] "
               "[--batches N] [--optimizer sgd|adagrad] [--lr LR] [--dist uniform|zipf] "
               "[--cardinalities c1,...] [--max-rows R] [--tf32] [--device I] [--seed S]\n",
               msg);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") usage("");
    if (k == "--tf32") { a.tf32 = true; continue; }
    if (i + 1 >= argc) usage(("missing value for " + k).c_str());
    std::string v = argv[++i];
    if (k == "--batch") a.batches_sizes = parse_list(v);
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--warmup") a.warmup = std::atoi(v.c_str());
    else if (k == "--batches") a.distinct = std::atoi(v.c_str());
    else if (k == "--optimizer") a.optimizer = v;
    else if (k == "--lr") a.lr = std::atof(v.c_str());
    else if (k == "--dist") a.dist = v;
    else if (k == "--cardinalities") a.cards = parse_list(v);
    else if (k == "--max-rows") a.max_rows = std::atoll(v.c_str());
    else if (k == "--device") a.device = std::atoi(v.c_str());
    else if (k == "--seed") a.seed = std::strtoull(v.c_str(), nullptr, 10);
    else usage(("unknown option " + k).c_str());
  }
  if (a.steps <= 0 || a.warmup < 0 || a.distinct <= 0) usage("steps and batches must be positive");
  for (int64_t b : a.batches_sizes) if (b <= 0) usage("batch sizes must be positive");
  if (a.dist != "zipf" && a.dist != "uniform") usage("--dist is zipf or uniform");
  return a;
}

[[maybe_unused]] double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
#ifndef DLREC_WITH_CUDA
  std::fprintf(stderr, "bench_train_gpu: this build of dlrec has no CUDA support\n");
  return 1;
#else
  try {
    if (cuda::device_count() == 0) {
      std::fprintf(stderr, "bench_train_gpu: no CUDA device\n");
      return 1;
    }
    if (a.tf32) setenv("DLREC_TF32", "1", 1);
    model::ModelConfig mc;
    mc.embedding_dim = 128;
    mc.bottom_mlp = {512, 256, 128};
    mc.top_mlp = {1024, 1024, 512, 256, 1};
    mc.interaction = "dot";
    model::OptimizerConfig oc;
    oc.type = a.optimizer;
    oc.lr = a.lr;
    io::ShardLayout layout;
    layout.num_dense = 13;
    int64_t total_rows = 0;
    for (int64_t c : a.cards) {
      layout.cardinalities.push_back(a.max_rows > 0 ? std::min(c, a.max_rows) : c);
      layout.multi_hot.push_back(false);
      total_rows += layout.cardinalities.back();
    }
    const Device dev = Device::cuda(a.device);
    double t0 = now_s();
    auto m = model::make_dlrm_cuda(mc, oc, layout, dev, a.seed);
    std::fprintf(stderr, "built on %s: %zu tables, %lld rows (%.2f GB of tables%s) in %.1f s\n",
                 cuda::device_name(a.device).c_str(), layout.cardinalities.size(),
                 static_cast<long long>(total_rows), total_rows * 128 * 4.0 / 1e9,
                 a.optimizer == "adagrad" ? " + as much Adagrad state" : "", now_s() - t0);
    for (int64_t B : a.batches_sizes) {
      t0 = now_s();
      std::vector<io::Batch> batches;
      for (int i = 0; i < a.distinct; ++i)
        batches.push_back(io::random_batch(layout, B, a.dist == "zipf", a.seed * 1000 + B + i));
      std::fprintf(stderr, "generated %d batches of %lld in %.1f s\n", a.distinct,
                   static_cast<long long>(B), now_s() - t0);
      for (int i = 0; i < a.warmup; ++i) m->train_step(batches[i % a.distinct], 1.0, false);
      m->synchronize();
      t0 = now_s();
      for (int i = 0; i < a.steps; ++i) m->train_step(batches[i % a.distinct], 1.0, false);
      m->synchronize();
      const double s = now_s() - t0;
      const double loss = m->train_step(batches[0], 1.0, true);
      const double ms = 1e3 * s / a.steps;
      const double sps = static_cast<double>(B) * a.steps / s;
      std::printf(
          "dlrec gpu train: mlperf-dlrm fp32%s optimizer=%s batch=%lld steps=%d warmup=%d "
          "dist=%s ms/iter=%.3f samples/s=%.0f loss=%.4f peak_mem=%.2f GB device=%s\n",
          a.tf32 ? "(tf32 GEMMs)" : "", a.optimizer.c_str(), static_cast<long long>(B), a.steps,
          a.warmup, a.dist.c_str(), ms, sps, loss, cuda::pool_peak_bytes(a.device) / 1e9,
          cuda::device_name(a.device).c_str());
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
#endif
}
