// Shared by the sharded embedding tests: a scenario of tables of every sharding kind, its
// batches and gradients, all deterministic so that every rank of a job computes the same ones.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/dist/planner.h"
#include "dlrec/dist/sharded_embedding.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "run_job.h"

namespace dlrec::dist {

// One global batch: per table CSR over `samples` samples, bags of 0..3 ids, skewed to small ids
// (as after Categorify) so that rows repeat within the batch.
struct GlobalBatch {
  std::vector<std::vector<int64_t>> offsets, indices;  // per table
};

inline GlobalBatch make_batch(const std::vector<TableSpec>& specs, int64_t samples, uint64_t seed) {
  GlobalBatch g;
  nn::Rng rng(seed);
  for (const TableSpec& s : specs) {
    std::vector<int64_t> off(1, 0), idx;
    for (int64_t r = 0; r < samples; ++r) {
      const int len = static_cast<int>(rng.next() % 4);
      for (int k = 0; k < len; ++k) {
        const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
        idx.push_back(std::min<int64_t>(s.rows - 1, static_cast<int64_t>(u * u * s.rows)));
      }
      off.push_back(static_cast<int64_t>(idx.size()));
    }
    g.offsets.push_back(off);
    g.indices.push_back(idx);
  }
  return g;
}

// A deterministic gradient for global sample r, column c.
inline float dout_at(uint64_t step, int64_t r, int64_t c) {
  return static_cast<float>(nn::uniform_at(step * 7919 + 1, static_cast<uint64_t>(r * 1000 + c)) -
                            0.5);
}

struct Scenario {
  std::vector<TableSpec> specs;
  std::vector<nn::Pooling> pooling;
  std::map<std::string, TableOverride> overrides;
};

// Six tables of every kind: table_wise, row_wise (rows not a multiple of the ranks), column_wise
// (dim 12: pieces of 4 columns), replicated, a row_wise table with fewer rows than 4 ranks, and
// one the planner places (table_wise).
inline Scenario make_scenario(nn::OptimizerKind kind) {
  Scenario s;
  auto add = [&](const std::string& name, int64_t rows, int64_t dim, nn::Pooling p,
                 const char* kind_name) {
    TableSpec t;
    t.name = name;
    t.rows = rows;
    t.dim = dim;
    t.state_splits_by_column = kind != nn::OptimizerKind::RowWiseAdagrad;
    s.specs.push_back(t);
    s.pooling.push_back(p);
    if (kind_name) s.overrides[name] = {parse_sharding_kind(kind_name), -1};
  };
  add("tw", 50, 8, nn::Pooling::Sum, "table_wise");
  add("rw", 103, 8, nn::Pooling::Mean, "row_wise");
  add("cw", 40, 12, nn::Pooling::Mean,
      kind == nn::OptimizerKind::RowWiseAdagrad ? "row_wise" : "column_wise");
  add("rep", 7, 4, nn::Pooling::Sum, "replicated");
  add("tiny", 3, 4, nn::Pooling::Sum, "row_wise");
  add("auto", 30, 4, nn::Pooling::Mean, nullptr);
  return s;
}

inline nn::OptimizerOptions optimizer_options(nn::OptimizerKind kind) {
  nn::OptimizerOptions o;
  o.kind = kind;
  if (kind == nn::OptimizerKind::SGD) o.momentum = 0.5f;
  if (kind == nn::OptimizerKind::Adagrad) o.initial_accumulator = 0.1f;
  return o;
}

// The scenario's tables with `opt` (seeds 100 + t).
inline std::vector<ShardedTableConfig> scenario_tables(const Scenario& sc,
                                                       std::shared_ptr<const nn::Optimizer> opt) {
  std::vector<ShardedTableConfig> cfg;
  for (size_t t = 0; t < sc.specs.size(); ++t) {
    TableSpec spec = sc.specs[t];
    spec.state_bytes_per_row = opt->state_row_size(spec.dim) * 4;
    cfg.push_back({spec, 100 + static_cast<uint64_t>(t), sc.pooling[t], opt});
  }
  return cfg;
}

inline Plan scenario_plan(const std::vector<ShardedTableConfig>& cfg,
                          const std::map<std::string, TableOverride>& overrides, int ranks) {
  PlannerOptions po;
  po.ranks = ranks;
  po.memory_per_rank = 1'000'000;
  po.overrides = overrides;
  std::vector<TableSpec> specs;
  for (const auto& c : cfg) specs.push_back(c.spec);
  return plan_sharding(specs, po);
}

// Steps [first, first + steps) of the scenario on this rank (3 + rank samples per step).
inline void train_steps(ShardedEmbedding& se, Communicator& comm, const Scenario& sc, int first,
                        int steps) {
  const int n = comm.size(), me = comm.rank(), T = se.num_tables();
  std::vector<int64_t> start(n + 1, 0);
  for (int s = 0; s < n; ++s) start[s + 1] = start[s] + 3 + s;
  const int64_t mine = 3 + me, W = se.width();
  const std::vector<float> lr(T, 0.1f);
  for (int step = first; step < first + steps; ++step) {
    const GlobalBatch gb = make_batch(sc.specs, start[n], 1000 + static_cast<uint64_t>(step));
    std::vector<BagsView> bags(T);
    for (int t = 0; t < T; ++t) bags[t] = {gb.offsets[t].data() + start[me], gb.indices[t].data()};
    std::vector<float> out(mine * W), dout(mine * W);
    se.forward(bags, mine, out.data(), W, true);
    for (int64_t i = 0; i < mine; ++i)
      for (int64_t c = 0; c < W; ++c) dout[i * W + c] = dout_at(step, start[me] + i, c);
    se.backward(dout.data(), W);
    se.step(lr);
  }
}

// This test program under mpirun on `ranks` ranks with gtest flags `args` (a filter naming the
// tests that run on every rank), without colour, within `limit_seconds`.
inline dlrec::testing::JobResult run_self_on_ranks(int ranks, const std::string& args,
                                                   int limit_seconds) {
  // The program's own path: "/proc/self/exe" would name mpirun's helper in the ranks.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return dlrec::testing::run_job(
      dlrec::testing::mpirun_prefix(ranks) + self + " --gtest_color=no " + args, limit_seconds);
}

// How many times `what` occurs in `text` (a test's OK line in a job's output: once per rank).
inline size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace dlrec::dist
