// Hybrid embedding (docs/DISTRIBUTED.md, "Hybrid embedding"): ids [0, F) replicated with their
// gradients all-reduced, ids >= F split by rows. Against one unsharded nn::EmbeddingBag per
// table on 1 rank and under `mpirun -np 2` and `-np 4` (HybridMpi starts this program again
// with the filter HybridRanks.*): pooled rows, tables and optimizer state after training; a
// small logistic model's losses (1e-5 relative) and AUC (1e-4); the bytes exchanged and the step
// time with and without hybrid; checkpoints re-sharded across kinds and rank counts. Also the
// planner's choice of F and the bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "dlrec/core/file_util.h"
#include "dlrec/dist/sharded_embedding.h"
#include "run_job.h"
#include "sharded_test_util.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::dist {
namespace {

using dlrec::testing::expect_error;

// make_batch draws id u^2 * rows (u uniform): a fraction sqrt(f / rows) of the ids is below f.
FrequencySummary square_law(int64_t rows) {
  FrequencySummary f;
  f.values = 1'000'000;
  for (int64_t b = 1;; b = std::min(rows, b * 2)) {
    f.ids.push_back(b);
    f.values_below.push_back(
        static_cast<int64_t>(1e6 * std::sqrt(static_cast<double>(b) / static_cast<double>(rows))));
    if (b == rows) break;
  }
  return f;
}

struct HybridScenario : Scenario {
  std::map<std::string, FrequencySummary> frequency;
};

// hy: 103 rows, F = 10, mean pooling; hy_all: every row frequent; hy_few: 2 rare rows (fewer than
// 4 ranks); hy_auto: hybrid with F chosen by the planner; rw: row-wise (not hybrid).
HybridScenario hybrid_scenario(bool hybrid = true) {
  HybridScenario s;
  auto add = [&](const std::string& name, int64_t rows, int64_t dim, nn::Pooling p, int64_t f) {
    TableSpec t;
    t.name = name;
    t.rows = rows;
    t.dim = dim;
    s.frequency[name] = square_law(rows);
    s.specs.push_back(t);
    s.pooling.push_back(p);
    TableOverride ov;
    ov.kind = hybrid && f != 0 ? ShardingKind::Hybrid : ShardingKind::RowWise;
    if (hybrid && f > 0) ov.frequent_rows = f;
    s.overrides[name] = ov;
  };
  add("hy", 103, 8, nn::Pooling::Mean, 10);
  add("hy_all", 20, 4, nn::Pooling::Sum, 20);
  add("hy_few", 30, 4, nn::Pooling::Sum, 28);
  add("hy_auto", 200, 4, nn::Pooling::Mean, -1);
  add("rw", 50, 4, nn::Pooling::Sum, 0);
  return s;
}

Plan plan_of(const std::vector<ShardedTableConfig>& cfg, const HybridScenario& sc, int ranks) {
  PlannerOptions po;
  po.ranks = ranks;
  po.memory_per_rank = 1'000'000;
  po.batch_per_rank = 16;
  po.overrides = sc.overrides;
  po.frequency = sc.frequency;
  std::vector<TableSpec> specs;
  for (const auto& c : cfg) specs.push_back(c.spec);
  return plan_sharding(specs, po);
}

bool near(float a, float b, double rel) {
  return std::abs(a - b) <= rel * std::max(1.0, static_cast<double>(std::abs(b)));
}

// Area under the ROC curve (ties count one half).
double auc(const std::vector<double>& score, const std::vector<int>& label) {
  std::vector<size_t> o(score.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = i;
  std::sort(o.begin(), o.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  double pos = 0, neg = 0, sum = 0;
  for (size_t i = 0; i < o.size();) {
    size_t j = i;
    while (j < o.size() && score[o[j]] == score[o[i]]) ++j;
    double p = 0;
    for (size_t k = i; k < j; ++k) p += label[o[k]];
    sum += p * (neg + (j - i - p) / 2.0);
    pos += p;
    neg += static_cast<double>(j - i) - p;
    i = j;
  }
  return pos > 0 && neg > 0 ? sum / (pos * neg) : 0.5;
}

// Trains the hybrid tables and a fixed logistic layer on top (logit = v . pooled row - 0.1) for
// `steps` steps of 16 + r samples per rank r, next to the unsharded reference on the whole
// global batch. Checks the pooled rows every step (1e-6 relative), the loss every step (1e-5
// relative), the tables and optimizer state at the end (1e-5) and the validation AUC (1e-4).
void check_hybrid(Communicator& comm, nn::OptimizerKind kind, int steps) {
  const int n = comm.size(), me = comm.rank();
  const HybridScenario sc = hybrid_scenario();
  const int T = static_cast<int>(sc.specs.size());
  auto opt = std::make_shared<const nn::Optimizer>(optimizer_options(kind));
  const auto cfg = scenario_tables(sc, opt);
  std::vector<std::unique_ptr<nn::EmbeddingBag>> ref;
  for (int t = 0; t < T; ++t) {
    ref.push_back(
        std::make_unique<nn::EmbeddingBag>(sc.specs[t].rows, sc.specs[t].dim, sc.pooling[t]));
    ref.back()->init(100 + static_cast<uint64_t>(t));
    opt->init_state(ref.back()->weight());
  }
  ShardedEmbedding se(cfg, plan_of(cfg, sc, n), comm);
  for (int t = 0; t < 3; ++t) ASSERT_EQ(se.plan().tables[t].kind, ShardingKind::Hybrid);
  EXPECT_EQ(se.frequent_rows(0), 10);
  EXPECT_EQ(se.frequent_rows(1), 20);
  EXPECT_EQ(se.frequent_rows(4), 0);
  const int64_t W = se.width();
  std::vector<float> v(W);
  for (int64_t c = 0; c < W; ++c) v[c] = static_cast<float>(nn::uniform_at(5, c) * 4 - 2);
  std::vector<int64_t> first(n + 1, 0);
  for (int s = 0; s < n; ++s) first[s + 1] = first[s] + 16 + s;
  const int64_t global = first[n], mine = 16 + me;
  const std::vector<float> lr(T, 0.05f);
  // A label the tables can learn: whether the first table's first id is below 8.
  auto label = [&](const GlobalBatch& gb, int64_t r) {
    const auto& o = gb.offsets[0];
    return o[r + 1] > o[r] && gb.indices[0][o[r]] < 8 ? 1 : 0;
  };
  // Forward of rows [r0, r0 + m) of `gb` on the sharded tables and on the reference.
  auto run = [&](const GlobalBatch& gb, bool training, std::vector<float>& out,
                 std::vector<float>& want) {
    std::vector<BagsView> bags(T);
    for (int t = 0; t < T; ++t) bags[t] = {gb.offsets[t].data() + first[me], gb.indices[t].data()};
    out.assign(mine * W, -1.f);
    se.forward(bags, mine, out.data(), W, training);
    want.assign(global * W, 0.f);
    for (int t = 0; t < T; ++t) {
      const Tensor r = ref[t]->forward(gb.offsets[t], gb.indices[t], training);
      for (int64_t i = 0; i < global; ++i)
        for (int64_t k = 0; k < sc.specs[t].dim; ++k)
          want[i * W + se.column_offset(t) + k] = r.data<float>()[i * sc.specs[t].dim + k];
    }
  };
  auto sigmoid = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    const GlobalBatch gb = make_batch(sc.specs, global, 5000 + static_cast<uint64_t>(step));
    std::vector<float> out, want;
    run(gb, true, out, want);
    double loss = 0, ref_loss = 0;
    std::vector<float> dout(mine * W), ref_g(global * W);
    for (int64_t i = 0; i < global; ++i) {
      const int64_t local = i - first[me];
      const bool is_mine = local >= 0 && local < mine;
      double z = -0.1, zr = -0.1;
      for (int64_t c = 0; c < W; ++c) {
        zr += static_cast<double>(v[c]) * want[i * W + c];
        if (is_mine) {
          ASSERT_TRUE(near(out[local * W + c], want[i * W + c], 1e-6))
              << "step " << step << " sample " << i << " column " << c;
          z += static_cast<double>(v[c]) * out[local * W + c];
        }
      }
      const int y = label(gb, i);
      auto bce = [&](double zz) {
        return -(y ? std::log(sigmoid(zz)) : std::log(1 - sigmoid(zz)));
      };
      ref_loss += bce(zr) / static_cast<double>(global);
      const double gr = (sigmoid(zr) - y) / static_cast<double>(global);
      for (int64_t c = 0; c < W; ++c) ref_g[i * W + c] = static_cast<float>(gr * v[c]);
      if (!is_mine) continue;
      loss += bce(z) / static_cast<double>(global);
      const double g = (sigmoid(z) - y) / static_cast<double>(global);
      for (int64_t c = 0; c < W; ++c) dout[local * W + c] = static_cast<float>(g * v[c]);
    }
    loss = comm.all_reduce_value(loss);
    worst = std::max(worst, std::abs(loss - ref_loss) / std::abs(ref_loss));
    ASSERT_LE(std::abs(loss - ref_loss), 1e-5 * std::abs(ref_loss)) << "loss at step " << step;
    se.backward(dout.data(), W);
    se.step(lr);
    for (int t = 0; t < T; ++t) {
      const int64_t d = sc.specs[t].dim;
      std::vector<float> g(global * d);
      for (int64_t r = 0; r < global; ++r)
        for (int64_t k = 0; k < d; ++k) g[r * d + k] = ref_g[r * W + se.column_offset(t) + k];
      opt->step_sparse(ref[t]->weight(), ref[t]->backward(g.data(), d), lr[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    const auto got = se.gather_table(t).to_vector<float>();
    const auto w = ref[t]->weight().value.to_vector<float>();
    ASSERT_EQ(got.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_TRUE(near(got[i], w[i], 1e-5)) << sc.specs[t].name << " value " << i;
    if (!opt->has_state()) continue;
    const auto st = se.gather_table(t, true).to_vector<float>();
    const auto ws = ref[t]->weight().state.to_vector<float>();
    ASSERT_EQ(st.size(), ws.size());
    for (size_t i = 0; i < ws.size(); ++i)
      ASSERT_TRUE(near(st[i], ws[i], 1e-5)) << sc.specs[t].name << " state " << i;
  }
  // Validation AUC over a batch of every rank, gathered.
  const GlobalBatch vb = make_batch(sc.specs, global, 77);
  std::vector<float> out, want;
  run(vb, false, out, want);
  std::vector<double> mine_scores(mine), scores(global), ref_scores(global);
  std::vector<int> labels(global);
  for (int64_t i = 0; i < global; ++i) {
    double zr = -0.1;
    for (int64_t c = 0; c < W; ++c) zr += static_cast<double>(v[c]) * want[i * W + c];
    ref_scores[i] = zr;
    labels[i] = label(vb, i);
  }
  for (int64_t i = 0; i < mine; ++i) {
    double z = -0.1;
    for (int64_t c = 0; c < W; ++c) z += static_cast<double>(v[c]) * out[i * W + c];
    mine_scores[i] = z;
  }
  comm.all_gather_v(mine_scores.data(), scores.data(), comm.all_gather_counts(mine), Elem::F64);
  const double a = auc(scores, labels), ra = auc(ref_scores, labels);
  EXPECT_NEAR(a, ra, 1e-4);
  if (me == 0)
    std::printf(
        "hybrid %s on %d rank(s): worst relative loss difference %.2e over %d steps, "
        "AUC %.6f vs %.6f\n",
        nn::optimizer_name(kind), n, worst, steps, a, ra);
}

const nn::OptimizerKind kKinds[] = {nn::OptimizerKind::SGD, nn::OptimizerKind::Adagrad,
                                    nn::OptimizerKind::Adam};

TEST(Hybrid, MatchesUnshardedOnOneRank) {
  auto comm = make_single_communicator();
  for (nn::OptimizerKind k : kKinds) {
    SCOPED_TRACE(nn::optimizer_name(k));
    check_hybrid(*comm, k, 30);
  }
}

// A skewed batch (ids u^4 * rows: ~56 % below 10 of 100) through `plan`: the bytes each rank
// sent for one step and the mean step time over `steps`.
std::pair<ExchangeBytes, double> bytes_and_time(Communicator& comm, const HybridScenario& sc,
                                                int steps) {
  auto opt = std::make_shared<const nn::Optimizer>(optimizer_options(nn::OptimizerKind::SGD));
  const auto cfg = scenario_tables(sc, opt);
  ShardedEmbedding se(cfg, plan_of(cfg, sc, comm.size()), comm);
  const int T = se.num_tables();
  const int64_t mine = 512, W = se.width();
  std::vector<std::vector<int64_t>> off(T), idx(T);
  nn::Rng rng(9 + comm.rank());
  for (int t = 0; t < T; ++t) {
    off[t].assign(1, 0);
    for (int64_t r = 0; r < mine; ++r) {
      const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
      idx[t].push_back(std::min<int64_t>(sc.specs[t].rows - 1,
                                         static_cast<int64_t>(u * u * u * u * sc.specs[t].rows)));
      off[t].push_back(r + 1);
    }
  }
  std::vector<BagsView> bags(T);
  for (int t = 0; t < T; ++t) bags[t] = {off[t].data(), idx[t].data()};
  std::vector<float> out(mine * W), dout(mine * W, 0.01f);
  const std::vector<float> lr(T, 0.01f);
  ExchangeBytes one;
  comm.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    se.reset_exchange_bytes();
    se.forward(bags, mine, out.data(), W, true);
    se.backward(dout.data(), W);
    se.step(lr);
    if (s == 0) one = se.exchange_bytes();
  }
  comm.barrier();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return {one, ms / steps};
}

void report_bytes(Communicator& comm) {
  // with: F = 10, 100, 10, the planner's; rare_only: hybrid with F = 0 (the same sparse exchange,
  // nothing replicated); without: row_wise (every pooled row to and from every rank).
  HybridScenario with = hybrid_scenario(true), without = hybrid_scenario(false);
  for (auto* sc : {&with, &without})  // 100 x 64 tables: the exchange matters
    for (TableSpec& s : sc->specs)
      s.rows = 100, s.dim = 64, sc->frequency[s.name] = square_law(100);
  with.overrides["hy_all"].frequent_rows = 100;
  with.overrides["hy_few"].frequent_rows = 10;
  HybridScenario rare_only = with;
  for (auto& [name, ov] : rare_only.overrides)
    if (ov.kind == ShardingKind::Hybrid) ov.frequent_rows = 0;  // rw stays row_wise
  const auto [hb, ht] = bytes_and_time(comm, with, 20);
  const auto [zb, zt] = bytes_and_time(comm, rare_only, 20);
  const auto [rb, rt] = bytes_and_time(comm, without, 20);
  auto line = [](const char* what, const ExchangeBytes& b, double ms) {
    std::printf(
        "  %-22s %9lld B (all-to-all %lld, all-reduce %lld, all-gather %lld), %.3f ms/step\n", what,
        static_cast<long long>(b.total()), static_cast<long long>(b.all_to_all),
        static_cast<long long>(b.all_reduce), static_cast<long long>(b.all_gather), ms);
  };
  if (comm.rank() == 0) {
    std::printf("bytes sent per step by rank 0 on %d rank(s), 5 tables 100 x 64, 512 rows:\n",
                comm.size());
    line("hybrid", hb, ht);
    line("hybrid F = 0", zb, zt);
    line("row_wise (no hybrid)", rb, rt);
  }
  if (comm.size() == 1) {
    EXPECT_EQ(hb.total(), 0);
    EXPECT_EQ(rb.total(), 0);
    return;
  }
  // Over the job (a rank's own share moves: with F = 0 the owner of the most frequent ids sends
  // most pooled rows), fewer bytes through the all-to-all (the frequent lookups stay home), an
  // all-reduce instead, and fewer bytes in all.
  auto sum = [&](int64_t v) { return comm.all_reduce_value(v); };
  const int64_t h_a2a = sum(hb.all_to_all), z_a2a = sum(zb.all_to_all), r_a2a = sum(rb.all_to_all);
  const int64_t h_all = sum(hb.total()), z_all = sum(zb.total()), r_all = sum(rb.total());
  if (comm.rank() == 0)
    std::printf("  all ranks: hybrid %lld B, hybrid F = 0 %lld B, row_wise %lld B per step\n",
                static_cast<long long>(h_all), static_cast<long long>(z_all),
                static_cast<long long>(r_all));
  EXPECT_LT(h_a2a, r_a2a / 2);
  EXPECT_LT(h_a2a, z_a2a);
  EXPECT_LT(h_all, z_all);
  EXPECT_LT(h_all, r_all);
  EXPECT_EQ(zb.all_reduce, 0);
  EXPECT_GT(hb.all_reduce, 0);
  EXPECT_EQ(rb.all_reduce, 0);
}

TEST(Hybrid, BytesAndStepTime) {
  auto comm = make_single_communicator();
  report_bytes(*comm);
}

// Checkpoints: hybrid -> row_wise -> hybrid on this job, bit for bit; `dir` is left for the
// caller to load on another rank count.
void check_checkpoints(Communicator& comm, const std::string& dir) {
  auto opt = std::make_shared<const nn::Optimizer>(optimizer_options(nn::OptimizerKind::Adam));
  const HybridScenario hy = hybrid_scenario(true), rw = hybrid_scenario(false);
  const auto cfg = scenario_tables(hy, opt);
  ShardedEmbedding a(cfg, plan_of(cfg, hy, comm.size()), comm);
  ShardedEmbedding b(cfg, plan_of(cfg, rw, comm.size()), comm);
  ShardedEmbedding c(cfg, plan_of(cfg, hy, comm.size()), comm);
  Scenario s;
  s.specs = hy.specs;
  s.pooling = hy.pooling;
  train_steps(a, comm, s, 0, 3);
  a.save(dir + "/a", 3);
  EXPECT_EQ(b.load(dir + "/a"), 3);
  b.save(dir + "/b", 3);
  EXPECT_EQ(c.load(dir + "/b"), 3);
  for (int t = 0; t < a.num_tables(); ++t)
    for (bool state : {false, true}) {
      const auto want = a.gather_table(t, state).to_vector<float>();
      EXPECT_EQ(b.gather_table(t, state).to_vector<float>(), want) << t;
      EXPECT_EQ(c.gather_table(t, state).to_vector<float>(), want) << t;
    }
}

TEST(Hybrid, CheckpointsReshard) {
  auto comm = make_single_communicator();
  dlrec::testing::TempDir tmp("hybrid_ckpt");
  check_checkpoints(*comm, tmp.path);
}

std::string flag(const std::string& name) {
  for (const std::string& a : ::testing::internal::GetArgvs())
    if (a.rfind("--" + name + "=", 0) == 0) return a.substr(name.size() + 3);
  return "";
}

TEST(HybridRanks, MatchesUnsharded) {
  if (!started_by_mpi_launcher()) GTEST_SKIP() << "runs only under mpirun (HybridMpi starts it)";
  {
    auto comm = make_mpi_communicator();
    for (nn::OptimizerKind k : kKinds) {
      SCOPED_TRACE(nn::optimizer_name(k));
      check_hybrid(*comm, k, comm->size() == 2 ? 200 : 50);
      if (::testing::Test::HasFatalFailure()) break;
    }
    if (!::testing::Test::HasFatalFailure()) report_bytes(*comm);
    if (!flag("hybrid_dir").empty()) check_checkpoints(*comm, flag("hybrid_dir"));
  }
  finalize();
}

TEST(HybridMpi, TwoAndFourRanks) {
  if (dlrec::testing::mpirun_prefix(2).empty())
    GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin)";
  if (!mpi_built()) GTEST_SKIP() << "this build has no MPI";
  for (int ranks : {2, 4}) {
    dlrec::testing::TempDir tmp("hybrid_mpi");
    const auto r =
        run_self_on_ranks(ranks, "--gtest_filter=HybridRanks.* --hybrid_dir=" + tmp.path, 600);
    EXPECT_FALSE(r.hung) << r.output;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(occurrences(r.output, "[       OK ] HybridRanks.MatchesUnsharded"),
              static_cast<size_t>(ranks))
        << r.output;
    for (const char* tag : {"hybrid sgd on", "hybrid adagrad on", "hybrid adam on"}) {
      const size_t at = r.output.find(tag);
      if (at != std::string::npos)
        std::printf("%s\n", r.output.substr(at, r.output.find('\n', at) - at).c_str());
    }
    const size_t at = r.output.find("bytes sent per step");
    if (at != std::string::npos) {  // the report's four lines
      size_t end = at;
      for (int i = 0; i < 5 && end != std::string::npos; ++i) end = r.output.find('\n', end + 1);
      std::printf("%s\n", r.output.substr(at, end - at).c_str());
    }
    // The job's checkpoint, written by `ranks` ranks, loads on one rank with the hybrid plan
    // and with the row-wise one alike.
    auto comm = make_single_communicator();
    auto opt = std::make_shared<const nn::Optimizer>(optimizer_options(nn::OptimizerKind::Adam));
    const HybridScenario hy = hybrid_scenario(true), rw = hybrid_scenario(false);
    const auto cfg = scenario_tables(hy, opt);
    ShardedEmbedding a(cfg, plan_of(cfg, hy, 1), *comm);
    ShardedEmbedding b(cfg, plan_of(cfg, rw, 1), *comm);
    EXPECT_EQ(a.load(tmp.path + "/a"), 3);
    EXPECT_EQ(b.load(tmp.path + "/a"), 3);
    for (int t = 0; t < a.num_tables(); ++t)
      EXPECT_EQ(a.gather_table(t, true).to_vector<float>(),
                b.gather_table(t, true).to_vector<float>());
  }
}

}  // namespace
}  // namespace dlrec::dist
