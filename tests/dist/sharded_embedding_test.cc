// ShardedEmbedding against one unsharded nn::EmbeddingBag per table: with the single-process
// communicator here, and under `mpirun -np 2` and `-np 4` (ShardedEmbeddingMpi starts this
// program again under mpirun with the filter ShardedEmbeddingRanks.*; those tests skip when the
// program was not started by an MPI launcher).
#include "dlrec/dist/sharded_embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "dlrec/nn/rng.h"
#include "run_job.h"
#include "sharded_test_util.h"
#include "test_errors.h"

namespace dlrec::dist {
namespace {

using dlrec::testing::expect_error;

// Trains `steps` steps on `comm` and compares every pooled row and, at the end, every table
// and optimizer state with the unsharded reference. Rank r has 3 + r samples per step.
void check_equivalence(Communicator& comm, nn::OptimizerKind kind, int steps) {
  const int n = comm.size(), me = comm.rank();
  const Scenario sc = make_scenario(kind);
  const int T = static_cast<int>(sc.specs.size());
  auto opt = std::make_shared<const nn::Optimizer>(optimizer_options(kind));
  std::vector<ShardedTableConfig> cfg;
  std::vector<std::unique_ptr<nn::EmbeddingBag>> ref;
  for (int t = 0; t < T; ++t) {
    TableSpec spec = sc.specs[t];
    spec.state_bytes_per_row = opt->state_row_size(spec.dim) * 4;
    cfg.push_back({spec, 100 + static_cast<uint64_t>(t), sc.pooling[t], opt});
    ref.push_back(std::make_unique<nn::EmbeddingBag>(spec.rows, spec.dim, sc.pooling[t]));
    ref.back()->init(100 + static_cast<uint64_t>(t));
    opt->init_state(ref.back()->weight());
  }
  PlannerOptions po;
  po.ranks = n;
  po.memory_per_rank = 1'000'000;
  po.overrides = sc.overrides;
  std::vector<TableSpec> specs;
  for (const auto& c : cfg) specs.push_back(c.spec);
  ShardedEmbedding se(cfg, plan_sharding(specs, po), comm);
  ASSERT_EQ(se.width(), 8 + 8 + 12 + 4 + 4 + 4);

  std::vector<int64_t> first(n + 1, 0);
  for (int s = 0; s < n; ++s) first[s + 1] = first[s] + 3 + s;
  const int64_t global = first[n], mine = 3 + me, W = se.width();
  const std::vector<float> lr = {0.1f, 0.05f, 0.2f, 0.1f, 0.3f, 0.1f};
  for (int step = 0; step < steps; ++step) {
    const GlobalBatch gb = make_batch(sc.specs, global, 1000 + static_cast<uint64_t>(step));
    // Reference: every table on the whole global batch.
    std::vector<Tensor> ref_out(T);
    for (int t = 0; t < T; ++t) ref_out[t] = ref[t]->forward(gb.offsets[t], gb.indices[t], true);
    // This rank's slice of the batch.
    std::vector<BagsView> bags(T);
    for (int t = 0; t < T; ++t) bags[t] = {gb.offsets[t].data() + first[me], gb.indices[t].data()};
    std::vector<float> out(mine * W, -1.f), dout(mine * W);
    se.forward(bags, mine, out.data(), W, true);
    for (int t = 0; t < T; ++t) {
      const float* r = ref_out[t].data<float>();
      const int64_t d = sc.specs[t].dim;
      const bool exact = se.plan().tables[t].kind != ShardingKind::RowWise;
      for (int64_t i = 0; i < mine; ++i)
        for (int64_t k = 0; k < d; ++k) {
          const float want = r[(first[me] + i) * d + k], got = out[i * W + se.column_offset(t) + k];
          if (exact)
            ASSERT_EQ(got, want) << sc.specs[t].name << " step " << step << " sample " << i;
          else
            ASSERT_NEAR(got, want, 1e-6 * std::max(1.f, std::abs(want))) << sc.specs[t].name;
        }
    }
    for (int64_t i = 0; i < mine; ++i)
      for (int64_t c = 0; c < W; ++c) dout[i * W + c] = dout_at(step, first[me] + i, c);
    se.backward(dout.data(), W);
    se.step(lr);
    for (int t = 0; t < T; ++t) {
      const int64_t d = sc.specs[t].dim;
      std::vector<float> g(global * d);
      for (int64_t r = 0; r < global; ++r)
        for (int64_t k = 0; k < d; ++k) g[r * d + k] = dout_at(step, r, se.column_offset(t) + k);
      opt->step_sparse(ref[t]->weight(), ref[t]->backward(g.data(), d), lr[t]);
    }
  }
  // Bit-identical weights and optimizer state for every kind.
  for (int t = 0; t < T; ++t) {
    const Tensor w = se.gather_table(t);
    ASSERT_EQ(w.to_vector<float>(), ref[t]->weight().value.to_vector<float>())
        << "table " << sc.specs[t].name << " (" << sharding_kind_name(se.plan().tables[t].kind)
        << ") after " << steps << " steps on " << n << " rank(s)";
    if (opt->has_state()) {
      const Tensor s = se.gather_table(t, true);
      ASSERT_EQ(s.shape(), ref[t]->weight().state.shape()) << sc.specs[t].name;
      ASSERT_EQ(s.to_vector<float>(), ref[t]->weight().state.to_vector<float>())
          << "state of " << sc.specs[t].name;
    }
  }
  // Re-sharding: the tables loaded into a plan of other kinds give the same pooled rows.
  PlannerOptions po2 = po;
  po2.overrides.clear();
  po2.replicate_max_bytes = 0;
  for (const TableSpec& s : specs) po2.overrides[s.name] = {ShardingKind::RowWise, -1};
  ShardedEmbedding other(cfg, plan_sharding(specs, po2), comm);
  for (int t = 0; t < T; ++t) other.load_table(t, se.gather_table(t), se.gather_table(t, true));
  for (int t = 0; t < T; ++t)
    ASSERT_EQ(other.gather_table(t).to_vector<float>(), se.gather_table(t).to_vector<float>());
  const GlobalBatch gb = make_batch(sc.specs, global, 99);
  std::vector<BagsView> bags(T);
  for (int t = 0; t < T; ++t) bags[t] = {gb.offsets[t].data() + first[me], gb.indices[t].data()};
  std::vector<float> a(mine * W), b(mine * W);
  se.forward(bags, mine, a.data(), W, false);
  other.forward(bags, mine, b.data(), W, false);
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-6 * std::max(1.f, std::abs(a[i])));
}

const nn::OptimizerKind kKinds[] = {nn::OptimizerKind::SGD, nn::OptimizerKind::Adagrad,
                                    nn::OptimizerKind::RowWiseAdagrad, nn::OptimizerKind::Adam,
                                    nn::OptimizerKind::FTRL};

TEST(ShardedEmbedding, EqualsUnshardedOnOneRank) {
  auto comm = make_single_communicator();
  for (nn::OptimizerKind k : kKinds) {
    SCOPED_TRACE(nn::optimizer_name(k));
    check_equivalence(*comm, k, 5);
  }
}

TEST(ShardedEmbedding, AccumulateSparseGradMatchesEmbeddingBag) {
  nn::EmbeddingBag bag(10, 3);
  const std::vector<int64_t> off = {0, 2, 2, 5}, idx = {4, 1, 4, 4, 9};
  bag.forward(off, idx, true);
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 0.5f, -1, 7};
  const nn::SparseGrad& want = bag.backward(g.data(), 3);
  nn::SparseGrad got;
  accumulate_sparse_grad(off.data(), idx.data(), 3, g.data(), 3, 3, got);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.values, want.values);
}

TEST(ShardedEmbedding, BadInputIsAClearError) {
  auto comm = make_single_communicator();
  auto opt = std::make_shared<const nn::Optimizer>(nn::OptimizerOptions{});
  TableSpec s;
  s.name = "cat_7";
  s.rows = 10;
  s.dim = 4;
  PlannerOptions po;
  po.memory_per_rank = 1'000'000;
  const Plan plan = plan_sharding({s}, po);
  ShardedEmbedding se({{s, 1, nn::Pooling::Sum, opt}}, plan, *comm);
  const std::vector<int64_t> off = {0, 1, 2}, idx = {3, 10};
  std::vector<float> out(8);
  expect_error(
      [&] {
        se.forward({{off.data(), idx.data()}}, 2, out.data(), 4, true);
      },
      {"table 'cat_7'", "id 10", "sample 1", "rank 0", "[0, 10)"});
  expect_error([&] { se.backward(out.data(), 4); }, {"needs a training forward"});
  // A plan for another rank count or other tables.
  PlannerOptions po2 = po;
  po2.ranks = 2;
  expect_error(
      [&] {
        ShardedEmbedding({{s, 1, nn::Pooling::Sum, opt}}, plan_sharding({s}, po2), *comm);
      },
      {"plan is for 2 rank(s)", "job has 1"});
  TableSpec other = s;
  other.name = "cat_8";
  expect_error(
      [&] {
        ShardedEmbedding({{other, 1, nn::Pooling::Sum, opt}}, plan, *comm);
      },
      {"'cat_8'", "plan's is 'cat_7'"});
  expect_error(
      [&] {
        se.load_table(0, Tensor::zeros({9, 4}, DType::F32), Tensor());
      },
      {"'cat_7'", "9 x 4", "10 x 4"});
}

// Under mpirun: every optimizer on this job's ranks.
TEST(ShardedEmbeddingRanks, EqualsUnsharded) {
  if (!started_by_mpi_launcher())
    GTEST_SKIP() << "runs only under mpirun (ShardedEmbeddingMpi starts it)";
  {
    auto comm = make_mpi_communicator();
    for (nn::OptimizerKind k : kKinds) {
      SCOPED_TRACE(nn::optimizer_name(k));
      check_equivalence(*comm, k, 6);
      if (::testing::Test::HasFatalFailure()) break;
    }
  }
  finalize();
}

TEST(ShardedEmbeddingMpi, TwoAndFourRanks) {
  for (int ranks : {2, 4}) {
    const std::string mpirun = dlrec::testing::mpirun_prefix(ranks);
    if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin)";
    if (!mpi_built()) GTEST_SKIP() << "this build has no MPI";
    const auto r = run_self_on_ranks(ranks, "--gtest_filter=ShardedEmbeddingRanks.*", 300);
    EXPECT_FALSE(r.hung) << r.output;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(occurrences(r.output, "[       OK ] ShardedEmbeddingRanks.EqualsUnsharded"),
              static_cast<size_t>(ranks))
        << r.output;
  }
}

}  // namespace
}  // namespace dlrec::dist
