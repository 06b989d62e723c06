// Hashed embedding tables as a layer of the CUDA graph model (src/model/graph_hashed_cuda.cu)
// against the CPU graph model's hashed tables and a reference of the GPU's eviction policy:
//   - no eviction (capacity >= distinct keys): fp32 training (SGD, Adagrad, row-wise Adagrad)
//     tracks the CPU from the same seed on the same batches (losses within 1e-4 at every step
//     for 100-150 steps, as the other GraphCuda tests), and the state tensors (rows by slot,
//     keys, LRU links, counters) agree;
//     evaluation with keys no table holds pools them as zeros, as on the CPU;
//   - eviction: CUDA-graph training steps against a host reference of the policy (LRU by first
//     occurrence within a batch, a batch never evicts its own keys): the same resident keys, LRU
//     order and counters; device memory does not grow;
//   - checkpoints: a GPU-trained model (with evictions) loads on the CPU and predicts the same,
//     a CPU-trained one loads on the GPU, and a GPU checkpoint resumed on the GPU continues
//     bit-identically;
//   - bf16 and tf32 runs track the f32 CPU;
//   - predict() runs through the bucketed inference graphs, as the CPU model predicts;
//   - bad inputs are errors naming the table or key: negative keys, more distinct keys in a
//     batch than the capacity, capacity 0, an unknown eviction policy, a corrupt state (the table
//     is then left empty), a wide layer beside hashed tables.
// Without a GPU every test skips visibly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/gpu_resources.h"
#include "dlrec/embedding/hash_common.h"
#include "dlrec/model/cuda_model.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "dlrec/train/trainer.h"
#include "model/test_batches.h"
#include "test_errors.h"

namespace dlrec::model {
namespace {

using dlrec::model::testing::rel;

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: hashed GPU tests not run"; \
  } while (0)

using dlrec::testing::expect_error;

// DLREC_PARITY_STEPS caps the step counts (short runs under compute-sanitizer).
int steps(int dflt) {
  const char* e = std::getenv("DLREC_PARITY_STEPS");
  return e ? std::max(1, std::min(dflt, std::atoi(e))) : dflt;
}

RunConfig config(const std::string& layers, const std::string& opt) {
  return RunConfig::from_json(json::parse(R"({"model": {"arch": "graph", "layers": [)" + layers +
                                          R"(]}, "optimizer": )" + opt + "}"));
}

std::string dlrm(int64_t capacity, const char* pooling = "sum") {
  return R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [16, 8], "relu_last": true},
  {"name": "emb", "type": "embedding", "dim": 8, "pooling": ")" + std::string(pooling) +
         R"(", "hashed": {"capacity": )" + std::to_string(capacity) + R"(}},
  {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
  {"name": "top", "type": "mlp", "input": "inter", "sizes": [16, 1]},
  {"name": "logit", "type": "output", "input": "top"})";
}

// DCNv2 (parallel) over mean-pooled hashed tables of width 12 (not a multiple of 8).
std::string dcn(int64_t capacity) {
  return R"(
  {"name": "dense", "type": "dense"},
  {"name": "emb", "type": "embedding", "dim": 12, "pooling": "mean",
   "hashed": {"capacity": )" + std::to_string(capacity) + R"(, "init_scale": 0.05}},
  {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
  {"name": "deep", "type": "mlp", "input": "x0", "sizes": [32, 16], "relu_last": true},
  {"name": "both", "type": "concat", "inputs": ["cross", "deep"]},
  {"name": "head", "type": "mlp", "input": "both", "sizes": [1]},
  {"name": "logit", "type": "output", "input": "head"})";
}

const char* kSgd = R"({"type": "sgd", "lr": 0.05})";
const char* kAdagrad =
    R"({"type": "adagrad", "lr": 0.02, "embedding_lr": 0.05, "adagrad_init": 0.01})";
// Row-wise Adagrad on the tables (one accumulator per row, [capacity, 1] as the CPU's), SGD on
// the dense layers.
const char* kRowWise = R"({"type": "sgd", "lr": 0.05, "embedding": {"type": "rowwise_adagrad",
                          "lr": 0.05, "adagrad_init": 0.01}})";
// Adam on both (the tables' rows [capacity, 2 * dim + 1]: m, v and the row's step count, reset to
// zeros on insert).
const char* kAdam = R"({"type": "adam", "lr": 0.002, "embedding_lr": 0.01})";
// SGD with momentum on both (the tables' velocities reset to zeros on insert).
const char* kMomentum = R"({"type": "sgd", "lr": 0.02, "momentum": 0.9, "embedding_lr": 0.05})";

// Keys: ids of a small space (`ids` per feature, from the model tests' batches: multi-hot bags
// with duplicates and empty bags) scattered over 40 bits, as raw hashed ids look.
constexpr int64_t kKeySpace = int64_t{1} << 40;
io::ShardLayout key_layout() { return testing::make_layout(4, std::vector<int64_t>(5, kKeySpace)); }

io::Batch batch_of(int64_t rows, uint64_t seed, int64_t ids) {
  io::Batch b = testing::make_batch(testing::make_layout(4, std::vector<int64_t>(5, ids)), rows,
                                    seed, true, 0.3);
  for (auto& col : b.cat_indices)
    for (int64_t& k : col)
      k = static_cast<int64_t>(embedding::mix64(static_cast<uint64_t>(k) + 17) >> 24);
  return b;
}

std::map<std::string, Tensor> by_name(const std::vector<NamedTensor>& v) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : v) m[n] = t.to(Device::cpu());
  return m;
}

template <class T>
std::vector<T> values(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<T>();
}

// Every CPU tensor has a GPU tensor of the same name, shape and dtype; f32 tensors within
// `tol` of their scale, integer tensors (keys, LRU links, counters) equal.
void expect_same_state(Model& gpu, Model& cpu, double tol) {
  auto g = by_name(gpu.parameters()), c = by_name(cpu.parameters());
  for (auto& [n, t] : by_name(gpu.optimizer_state())) g[n] = t;
  for (auto& [n, t] : by_name(cpu.optimizer_state())) c[n] = t;
  EXPECT_EQ(g.size(), c.size());
  for (const auto& [name, ct] : c) {
    auto it = g.find(name);
    ASSERT_NE(it, g.end()) << name << " missing on the GPU";
    const Tensor& gt = it->second;
    ASSERT_EQ(gt.shape(), ct.shape()) << name;
    ASSERT_EQ(gt.dtype(), ct.dtype()) << name;
    if (ct.dtype() == DType::F32) {
      auto a = gt.to_vector<float>(), b = ct.to_vector<float>();
      double scale = 1e-12, d = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        scale = std::max(scale, std::fabs(double(b[k])));
        d = std::max(d, std::fabs(double(a[k]) - double(b[k])));
      }
      EXPECT_LE(d / scale, tol) << name;
    } else if (ct.dtype() == DType::I64) {
      EXPECT_EQ(gt.to_vector<int64_t>(), ct.to_vector<int64_t>()) << name;
    } else {
      EXPECT_EQ(gt.to_vector<int32_t>(), ct.to_vector<int32_t>()) << name;
    }
  }
}

// The same tables key by key (rows and optimizer state bit for bit, the LRU order as keys, the
// counters), whatever slots the keys sit in (under eviction, freed slots are reused in an order
// that is not deterministic).
void expect_same_tables(Model& a, Model& b, int64_t tables) {
  auto pa = by_name(a.parameters()), pb = by_name(b.parameters());
  for (auto& [n, t] : by_name(a.optimizer_state())) pa[n] = t;
  for (auto& [n, t] : by_name(b.optimizer_state())) pb[n] = t;
  for (int64_t t = 0; t < tables; ++t) {
    const std::string n = "emb." + std::to_string(t);
    auto rows = [&](std::map<std::string, Tensor>& p) {
      const auto meta = p.at(n + ".hash_meta").to_vector<int64_t>();
      const auto keys = p.at(n + ".keys").to_vector<int64_t>();
      const auto lru = p.at(n + ".lru").to_vector<int32_t>();
      const Tensor& w = p.at(n + ".weight");
      const int64_t d = w.dim(1), cap = w.dim(0);
      const auto wv = w.to_vector<float>();
      std::vector<float> sv;  // [cap, sd]: sd = d (Adagrad) or 1 (row-wise)
      for (const char* suffix :
           {".weight.adagrad", ".weight.rowwise_adagrad", ".weight.adam", ".weight.momentum"})
        if (p.count(n + suffix)) sv = p.at(n + suffix).to_vector<float>();
      const int64_t sd = static_cast<int64_t>(sv.size()) / cap;
      std::vector<std::vector<float>> out;  // per key in LRU order: key, row, state
      for (int64_t s = meta[1]; s >= 0 && static_cast<int64_t>(out.size()) <= cap;
           s = lru[cap + s]) {
        std::vector<float> r(wv.begin() + s * d, wv.begin() + (s + 1) * d);
        if (!sv.empty()) r.insert(r.end(), sv.begin() + s * sd, sv.begin() + (s + 1) * sd);
        r.push_back(static_cast<float>(keys[s] & 0xFFFFF));
        r.push_back(static_cast<float>(keys[s] >> 20));
        out.push_back(r);
      }
      std::vector<int64_t> counters(meta.begin(), meta.end());
      counters[1] = counters[2] = 0;  // slots of the LRU ends
      return std::make_pair(counters, out);
    };
    auto ra = rows(pa), rb = rows(pb);
    EXPECT_EQ(ra.first, rb.first) << n << ": size and counters";
    EXPECT_EQ(ra.second, rb.second) << n << ": keys in LRU order with their rows and state";
  }
}

void expect_same_logits(Model& a, Model& b, const io::Batch& batch, double tol) {
  auto za = values<float>(a.forward(batch, false)), zb = values<float>(b.forward(batch, false));
  ASSERT_EQ(za.size(), zb.size());
  for (size_t i = 0; i < za.size(); ++i)
    EXPECT_NEAR(za[i], zb[i], tol * (1 + std::fabs(zb[i]))) << "row " << i;
}

// CPU and GPU from one seed, same batches, fp32: the loss at every step within 1e-4.
void expect_parity(const std::string& layers, const char* opt, int64_t ids, int steps) {
  const RunConfig c = config(layers, opt);
  const io::ShardLayout l = key_layout();
  auto cpu = build_model(c.model, c.optimizer, l, Device::cpu(), 7);
  auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 7);
  expect_same_state(*gpu, *cpu, 0.0);  // empty tables, identical dense layers
  double worst = 0;
  for (int i = 0; i < steps; ++i) {
    io::Batch b = batch_of(64, 1000 + i, ids);
    Tensor dl, dlg;
    const double lc = nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
    cpu->backward_and_update(dl, 1.0);
    const double lg = nn::bce_with_logits(gpu->forward(b, true).to(Device::cpu()),
                                          b.labels.data(), &dlg);
    gpu->backward_and_update(dlg.to(Device::cuda(0)), 1.0);
    worst = std::max(worst, rel(lg, lc));
    ASSERT_LE(rel(lg, lc), 1e-4) << "step " << i << ": loss cpu " << lc << " gpu " << lg;
  }
  std::printf("[hashed parity] %d steps, worst loss rel diff %.3g\n", steps, worst);
  expect_same_state(*gpu, *cpu, 1e-3);
  // Evaluation over keys partly never seen (a wider id space): zeros for those, on both.
  for (int i = 0; i < 3; ++i) expect_same_logits(*gpu, *cpu, batch_of(200, 50 + i, 2 * ids), 1e-5);
}

TEST(GraphHashedCuda, NoEvictionDlrmSgdTracksCpuEveryStep) {
  SKIP_WITHOUT_GPU();
  expect_parity(dlrm(400), kSgd, 300, steps(150));
}

TEST(GraphHashedCuda, NoEvictionDcnMeanPoolingAdagradTracksCpuEveryStep) {
  SKIP_WITHOUT_GPU();
  expect_parity(dcn(400), kAdagrad, 300, steps(150));
}

TEST(GraphHashedCuda, NoEvictionRowWiseAdagradTracksCpuEveryStep) {
  SKIP_WITHOUT_GPU();
  expect_parity(dlrm(400), kRowWise, 300, steps(150));
  expect_parity(dcn(400), kRowWise, 300, steps(100));
}

TEST(GraphHashedCuda, NoEvictionAdamTracksCpuEveryStep) {
  SKIP_WITHOUT_GPU();
  expect_parity(dlrm(400), kAdam, 300, steps(100));
}

TEST(GraphHashedCuda, NoEvictionMomentumTracksCpuEveryStep) {
  SKIP_WITHOUT_GPU();
  expect_parity(dcn(400), kMomentum, 300, steps(100));
}

// ---- Eviction against a host reference of the GPU's policy ----

// Per table: the resident keys with their stamps, the counters.
struct RefTable {
  int64_t cap = 0, lookups = 0, hits = 0, inserts = 0, evictions = 0;
  std::unordered_map<int64_t, int64_t> stamp;
};

void ref_step(std::vector<RefTable>& tabs, const io::Batch& b, int64_t& seq) {
  for (size_t t = 0; t < tabs.size(); ++t) {
    RefTable& r = tabs[t];
    const auto& off = b.cat_offsets[t];
    const int64_t* ids = b.cat_indices[t].data() + off[0];
    const int64_t n = off[b.rows] - off[0];
    std::vector<int64_t> uniq;
    std::unordered_map<int64_t, int64_t> occ;
    for (int64_t i = 0; i < n; ++i)
      if (occ[ids[i]]++ == 0) uniq.push_back(ids[i]);
    r.lookups += n;
    int64_t m = 0;
    for (int64_t k : uniq) {
      if (r.stamp.count(k)) r.hits += occ[k];
      else ++m;
    }
    const int64_t k_evict = std::max<int64_t>(0, static_cast<int64_t>(r.stamp.size()) + m - r.cap);
    // The k oldest rows among those this batch does not use.
    std::vector<std::pair<int64_t, int64_t>> old;
    for (auto& [key, s] : r.stamp)
      if (!occ.count(key)) old.emplace_back(s, key);
    std::sort(old.begin(), old.end());
    for (int64_t i = 0; i < k_evict; ++i) r.stamp.erase(old[i].second);
    for (size_t u = 0; u < uniq.size(); ++u) r.stamp[uniq[u]] = seq + static_cast<int64_t>(u);
    seq += static_cast<int64_t>(uniq.size());
    r.inserts += m;
    r.evictions += k_evict;
  }
}

TEST(GraphHashedCuda, EvictionFollowsTheLruReferenceAndMemoryStaysAtTheCap) {
  SKIP_WITHOUT_GPU();
  const int64_t cap = 200, ids = 1000;
  const RunConfig c = config(dlrm(cap), kAdagrad);
  const io::ShardLayout l = key_layout();
  auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 3);
  std::vector<RefTable> ref(5);
  for (auto& r : ref) r.cap = cap;
  int64_t seq = 0;
  // Buffers sized once for a batch larger than any below (an evaluation forward: no inserts),
  // so that the memory peak measures the tables alone.
  gpu->forward(batch_of(400, 1, ids), false);
  size_t peak_after_warmup = 0;
  const int n_steps = steps(300);
  for (int i = 0; i < n_steps; ++i) {
    // Row counts change (a new CUDA graph per shape); a drifting id window makes old keys go
    // cold, hot ids (the low ones) recur.
    const int64_t rows = i % 50 < 40 ? 48 : 31;
    io::Batch b = batch_of(rows, 5000 + i, ids / 2 + (i * 3) % (ids / 2));
    ref_step(ref, b, seq);
    const double loss = gpu->train_step(b, 1.0, i % 10 == 0);  // NaN when not asked for
    if (i % 10 == 0) {
      ASSERT_TRUE(std::isfinite(loss)) << "step " << i;
    }
    if (i == std::min(20, n_steps / 2)) {
      gpu->synchronize();
      peak_after_warmup = cuda::pool_peak_bytes(0);
    }
  }
  gpu->synchronize();
  EXPECT_EQ(cuda::pool_peak_bytes(0), peak_after_warmup) << "device memory grew while evicting";
  auto p = by_name(gpu->parameters());
  int64_t total_evictions = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    const std::string n = "emb." + std::to_string(t);
    const auto meta = p.at(n + ".hash_meta").to_vector<int64_t>();
    const auto keys = p.at(n + ".keys").to_vector<int64_t>();
    const auto lru = p.at(n + ".lru").to_vector<int32_t>();
    const RefTable& r = ref[t];
    EXPECT_EQ(meta[0], static_cast<int64_t>(r.stamp.size())) << n;
    EXPECT_LE(meta[0], cap) << n;
    EXPECT_EQ(meta[3], r.lookups) << n;
    EXPECT_EQ(meta[4], r.hits) << n;
    EXPECT_EQ(meta[5], r.inserts) << n;
    EXPECT_EQ(meta[6], r.evictions) << n;
    EXPECT_EQ(meta[7], cap) << n;
    EXPECT_EQ(meta[5] - meta[6], meta[0]) << n << ": inserts - evictions = rows held";
    total_evictions += meta[6];
    // The LRU list, least recent first, against the reference's stamp order.
    std::vector<std::pair<int64_t, int64_t>> by_stamp;
    for (auto& [key, s] : r.stamp) by_stamp.emplace_back(s, key);
    std::sort(by_stamp.begin(), by_stamp.end());
    std::vector<int64_t> want, got;
    for (auto& [s, key] : by_stamp) want.push_back(key);
    for (int64_t s = meta[1]; s >= 0 && got.size() <= keys.size(); s = lru[cap + s])
      got.push_back(keys[s]);
    EXPECT_EQ(got, want) << n;
    const double hit_rate = static_cast<double>(meta[4]) / meta[3];
    std::printf("[hashed eviction] %s: %lld/%lld rows, %lld lookups, hit rate %.4f, %lld inserts, "
                "%lld evictions\n", n.c_str(), (long long)meta[0], (long long)cap,
                (long long)meta[3], hit_rate, (long long)meta[5], (long long)meta[6]);
    EXPECT_GT(hit_rate, 0.0);
    EXPECT_LT(hit_rate, 1.0);
  }
  EXPECT_GT(total_evictions, 0);
}

// ---- Checkpoints ----

std::string temp_path(const char* name) {
  return "/tmp/dlrec_hashed_cuda_" + std::to_string(::getpid()) + "_" + name;
}

// Adagrad, row-wise Adagrad (its accumulators [capacity, 1]), Adam (m, v and a step count per
// row) and SGD with momentum, every state reset on insert.
TEST(GraphHashedCuda, GpuCheckpointWithEvictionsLoadsOnCpuAndResumesOnGpu) {
  SKIP_WITHOUT_GPU();
  for (const char* opt : {kAdagrad, kRowWise, kAdam, kMomentum}) {
    SCOPED_TRACE(opt);
    const RunConfig c = config(dlrm(150), opt);
    const io::ShardLayout l = key_layout();
    auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 5);
    for (int i = 0; i < 60; ++i) gpu->train_step(batch_of(40, 700 + i, 800), 1.0, false);
    const std::string path = temp_path("ckpt.dlrec");
    train::save_checkpoint(path, *gpu, c, l, {60, 2400, std::nullopt});
    auto meta = by_name(gpu->parameters()).at("emb.0.hash_meta").to_vector<int64_t>();
    EXPECT_GT(meta[6], 0) << "the run should have evicted rows";

    // On the CPU: the same state, the same predictions (seen and unseen keys).
    auto cpu = build_model(c.model, c.optimizer, l, Device::cpu(), 99);
    train::load_checkpoint(path, *cpu);
    expect_same_state(*gpu, *cpu, 0.0);
    for (int i = 0; i < 3; ++i) expect_same_logits(*gpu, *cpu, batch_of(100, 60 + i, 1600), 1e-5);

    // On another GPU model: bit-identical predictions and continued training (from the same
    // seed: new keys' initial rows derive from it, as on the CPU).
    auto resumed = build_model(c.model, c.optimizer, l, Device::cuda(0), 5);
    train::load_checkpoint(path, *resumed);
    expect_same_logits(*resumed, *gpu, batch_of(100, 77, 1600), 0.0);
    for (int i = 0; i < 30; ++i) {
      io::Batch b = batch_of(40, 800 + i, 800);
      ASSERT_EQ(resumed->train_step(b, 1.0, true), gpu->train_step(b, 1.0, true)) << "step " << i;
    }
    expect_same_tables(*resumed, *gpu, 5);
    std::remove(path.c_str());
  }
}

TEST(GraphHashedCuda, CpuCheckpointLoadsOnGpu) {
  SKIP_WITHOUT_GPU();
  const RunConfig c = config(dlrm(500), kSgd);
  const io::ShardLayout l = key_layout();
  auto cpu = build_model(c.model, c.optimizer, l, Device::cpu(), 5);
  for (int i = 0; i < 40; ++i) {
    io::Batch b = batch_of(32, 900 + i, 300);
    Tensor dl;
    nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
    cpu->backward_and_update(dl, 1.0);
  }
  const std::string path = temp_path("cpu.dlrec");
  train::save_checkpoint(path, *cpu, c, l, {40, 1280, std::nullopt});
  auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 1);
  train::load_checkpoint(path, *gpu);
  expect_same_state(*gpu, *cpu, 0.0);
  expect_same_logits(*gpu, *cpu, batch_of(100, 5, 600), 1e-5);
  std::remove(path.c_str());
}

// ---- Precisions and the CUDA-graph step ----

TEST(GraphHashedCuda, GraphReplayEqualsEagerAndBf16Tf32TrackCpu) {
  SKIP_WITHOUT_GPU();
  const RunConfig c = config(dlrm(250), kAdagrad);
  const io::ShardLayout l = key_layout();
  {
    auto a = build_model(c.model, c.optimizer, l, Device::cuda(0), 9);
    setenv("DLREC_CUDA_GRAPH", "0", 1);
    auto eager = build_model(c.model, c.optimizer, l, Device::cuda(0), 9);
    unsetenv("DLREC_CUDA_GRAPH");
    for (int i = 0; i < 40; ++i) {
      io::Batch b = batch_of(i % 7 < 5 ? 64 : 20, 300 + i, 900);
      ASSERT_EQ(a->train_step(b, 1.0, true), eager->train_step(b, 1.0, true)) << "step " << i;
    }
    expect_same_tables(*a, *eager, 5);
  }
  for (const char* prec : {"bf16", "tf32"}) {
    auto cpu = build_model(c.model, c.optimizer, l, Device::cpu(), 5);
    auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 5, prec);
    double worst = 0;
    for (int i = 0; i < 100; ++i) {
      io::Batch b = batch_of(64, 2000 + i, 200);
      Tensor dl;
      const double lc = nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
      cpu->backward_and_update(dl, 1.0);
      const double lg = gpu->train_step(b, 1.0, true);
      ASSERT_TRUE(std::isfinite(lg));
      worst = std::max(worst, rel(lg, lc));
    }
    std::printf("[hashed %s] 100 steps, worst loss rel diff vs f32 CPU %.3g\n", prec, worst);
    EXPECT_LE(worst, std::string(prec) == "bf16" ? 0.05 : 0.01) << prec;
  }
}

// ---- Serving: predict() through the buckets' graphs ----

// predict() of a hashed model runs through the bucketed inference graphs (one-hot and
// multi-hot buckets, their int64 keys resolved in the graph): the CPU model's probabilities
// after the same training (keys seen and never seen, several chunks), and again after more
// training steps (rows the graphs read in place); a negative key is the hashed table's error
// and the model serves on; the serving breakdown measures it.
TEST(GraphHashedCuda, PredictThroughGraphsMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string& layers : {dlrm(100000), dcn(100000)}) {
    const RunConfig c = config(layers, kAdagrad);
    const io::ShardLayout l = key_layout();
    auto cpu = build_model(c.model, c.optimizer, l, Device::cpu(), 3);
    auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 3);
    auto* cm = dynamic_cast<CudaModel*>(gpu.get());
    ASSERT_NE(cm, nullptr);
    auto train = [&](int from, int n) {
      for (int i = from; i < from + n; ++i) {
        io::Batch b = batch_of(64, 700 + i, 400);
        Tensor dl;
        nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
        cpu->backward_and_update(dl, 1.0);
        gpu->train_step(b, 1.0, false);
      }
    };
    auto one_hot = [&](int64_t rows, uint64_t seed) {  // one key per table and row
      io::Batch b = testing::make_batch(testing::make_layout(4, std::vector<int64_t>(5, 800)),
                                        rows, seed, false, 0.3);
      for (auto& col : b.cat_indices)
        for (int64_t& k : col)
          k = static_cast<int64_t>(embedding::mix64(static_cast<uint64_t>(k) + 17) >> 24);
      return b;
    };
    auto check = [&](const io::Batch& b, const char* what) {
      std::vector<float> got(b.rows, -1.f);
      cm->predict(b, got.data());
      const auto z = values<float>(cpu->forward(b, false));
      ASSERT_EQ(z.size(), got.size());
      double worst = 0;
      for (size_t i = 0; i < z.size(); ++i)
        worst = std::max(worst, std::fabs(got[i] - 1.0 / (1.0 + std::exp(-double(z[i])))));
      EXPECT_LE(worst, 1e-5) << what << ", " << b.rows << " rows";
    };
    train(0, 20);
    const int64_t graphs = gpu::live_counts().graphs;
    check(one_hot(300, 1), "one-hot");
    check(batch_of(300, 2, 800), "multi-hot");  // keys of ids 400-799 never trained
    EXPECT_GE(gpu::live_counts().graphs, graphs + 2) << "the buckets' graphs were not captured";
    for (int64_t rows : {1, 3, 9000}) {
      check(one_hot(rows, 10 + rows), "one-hot");
      check(batch_of(rows, 20 + rows, 800), "multi-hot");
    }
    train(20, 10);  // new rows and values under the captured graphs
    check(one_hot(300, 3), "one-hot after training");
    check(batch_of(300, 4, 800), "multi-hot after training");
    io::Batch neg = one_hot(7, 5);
    neg.cat_indices[3][2] = -9;
    std::vector<float> out(7);
    expect_error([&] { cm->predict(neg, out.data()); }, {"hashed table 'emb.3'", "negative"});
    check(one_hot(7, 6), "one-hot after the error");
    io::Batch mh = batch_of(300, 7, 800);
    check(mh, "multi-hot");
    std::string all;
    for (const std::string& line : cm->serving_breakdown(mh, 2)) all += line + "\n";
    EXPECT_NE(all.find("device, captured graph"), std::string::npos) << all;
    EXPECT_EQ(all.find("n/a (not captured"), std::string::npos) << all;
  }
}

// ---- Bad inputs ----

TEST(GraphHashedCuda, BadConfigsAreClearErrors) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "built without CUDA";
  const io::ShardLayout l = key_layout();
  auto build = [&](const std::string& layers) {
    const RunConfig c = config(layers, kSgd);
    build_model(c.model, c.optimizer, l, Device::cuda(0), 1);
  };
  const std::string tail = R"(,
    {"name": "c", "type": "concat", "inputs": ["emb"]},
    {"name": "o", "type": "mlp", "input": "c", "sizes": [1]},
    {"name": "logit", "type": "output", "input": "o"})";
  expect_error([&] { build(R"({"name": "emb", "type": "embedding", "dim": 4,
                               "hashed": {"capacity": 0}})" + tail); },
               {"capacity"});
  expect_error([&] { build(R"({"name": "emb", "type": "embedding", "dim": 4,
                               "hashed": {"capacity": 10, "eviction": "fifo"}})" + tail); },
               {"eviction", "lru"});
  expect_error([&] { build(R"({"name": "emb", "type": "embedding", "dim": 4,
                               "hashed": {"capacity": 10, "eviction": "lfu"}})" + tail); },
               {"eviction", "lfu"});
  expect_error([&] { build(R"({"name": "emb", "type": "embedding", "dim": 4,
                               "hashed": {"capacity": 10}},
                              {"name": "w", "type": "wide"},
                              {"name": "c", "type": "concat", "inputs": ["emb"]},
                              {"name": "o", "type": "mlp", "input": "c", "sizes": [1]},
                              {"name": "s", "type": "add", "inputs": ["o", "w"]},
                              {"name": "logit", "type": "output", "input": "s"})"); },
               {"layer 'emb'", "wide layer ('w')", "CPU"});
}

TEST(GraphHashedCuda, BadKeysAndBatchesAreClearErrors) {
  SKIP_WITHOUT_GPU();
  const RunConfig c = config(dlrm(10), kSgd);
  const io::ShardLayout l = key_layout();
  auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 1);
  io::Batch ok = batch_of(3, 1, 100);  // at most 9 distinct keys per table
  gpu->train_step(ok, 1.0, true);
  const auto before = values<float>(gpu->forward(ok, false));
  io::Batch neg = batch_of(3, 2, 100);
  neg.cat_indices[2][1] = -5;
  expect_error([&] { gpu->train_step(neg, 1.0, true); },
               {"hashed table 'emb.2'", "key -5", "negative"});
  expect_error([&] { gpu->forward(neg, false); }, {"hashed table 'emb.2'", "negative"});
  // 64 rows of ids from 1000: more distinct keys than the 10 rows (training only).
  io::Batch wide = batch_of(64, 3, 1000);
  expect_error([&] { gpu->train_step(wide, 1.0, true); },
               {"hashed table 'emb.0'", "distinct keys", "capacity of 10"});
  EXPECT_NO_THROW(gpu->forward(wide, false));
  // The state is intact: the model predicts as before the errors, and trains on.
  EXPECT_EQ(values<float>(gpu->forward(ok, false)), before);
  EXPECT_TRUE(std::isfinite(gpu->train_step(ok, 1.0, true)));
  // More keys than rows, but repeats of 5 distinct ones a table: a training batch like any.
  EXPECT_TRUE(std::isfinite(gpu->train_step(batch_of(64, 4, 5), 1.0, true)));
}

TEST(GraphHashedCuda, CorruptStateIsAnErrorAndLeavesTheTableEmpty) {
  SKIP_WITHOUT_GPU();
  const RunConfig c = config(dlrm(100), kSgd);
  const io::ShardLayout l = key_layout();
  auto gpu = build_model(c.model, c.optimizer, l, Device::cuda(0), 1);
  for (int i = 0; i < 5; ++i) gpu->train_step(batch_of(16, 10 + i, 50), 1.0, false);
  for (auto& [name, t] : gpu->parameters())
    if (name == "emb.1.keys") t.data<int64_t>()[1] = t.data<int64_t>()[0];  // a key twice
  io::Batch b = batch_of(16, 99, 50);
  expect_error([&] { gpu->train_step(b, 1.0, true); },
               {"hashed table 'emb.1'", "two rows"});
  auto p = by_name(gpu->parameters());
  EXPECT_EQ(p.at("emb.1.hash_meta").to_vector<int64_t>()[0], 0) << "left empty";
  EXPECT_GT(p.at("emb.0.hash_meta").to_vector<int64_t>()[0], 0) << "other tables kept";
  for (auto& [name, t] : gpu->parameters())
    if (name == "emb.2.lru") t.data<int32_t>()[0] = 1000;  // a link out of range
  expect_error([&] { gpu->train_step(b, 1.0, true); }, {"hashed table 'emb.2'", "LRU"});
  EXPECT_TRUE(std::isfinite(gpu->train_step(b, 1.0, true)));  // empty tables fill again
}

}  // namespace
}  // namespace dlrec::model
