// Node topology and the routing arithmetic of the hierarchical all-to-all, in one process: every
// rank's plan is run against simulated ranks and the result compared byte for byte with the flat
// all-to-all's. The exchange itself under mpirun: communicator_test.cc
// (MpiCommunicator.HierarchicalAllToAllMatchesFlat*).
#include "dlrec/dist/topology.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_errors.h"

using namespace dlrec;
using namespace dlrec::dist;

#define EXPECT_THROW_MSG(stmt, part) dlrec::testing::expect_error([&] { stmt; }, {part})

namespace {

TEST(Topology, NodesFromHostNamesInOrderOfFirstAppearance) {
  const Topology t = topology_from_hosts({"b", "a", "b", "a", "b", "a"});
  EXPECT_EQ(t.nodes(), 2);
  EXPECT_EQ(t.local_size(), 3);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(t.local_of, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.rank_at(1, 2), 5);
  EXPECT_EQ(t.describe(),
            "6 ranks on 2 nodes (3 per node, from host names): node 0 (b): ranks 0 2 4; node 1 "
            "(a): ranks 1 3 5");
  EXPECT_TRUE(use_hierarchical(t, AllToAll::Auto));
  EXPECT_FALSE(use_hierarchical(t, AllToAll::Flat));
  // One host: flat unless asked.
  const Topology one = topology_from_hosts({"h", "h"});
  EXPECT_FALSE(one.spans_nodes());
  EXPECT_FALSE(use_hierarchical(one, AllToAll::Auto));
  EXPECT_TRUE(use_hierarchical(one, AllToAll::Hierarchical));
}

TEST(Topology, DeclaredRanksPerNodeOverridesTheHostNames) {
  const Topology t = make_topology({2, AllToAll::Auto}, {"h", "h", "h", "h"});
  EXPECT_EQ(t.nodes(), 2);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(t.local_of, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(t.describe(),
            "4 ranks on 2 nodes (2 per node, from --ranks-per-node 2): node 0 (h): ranks 0 1; "
            "node 1 (h): ranks 2 3");
  EXPECT_TRUE(use_hierarchical(t, AllToAll::Auto));
  EXPECT_EQ(make_topology({0, AllToAll::Auto}, {"h", "h", "h", "h"}).nodes(), 1);
}

TEST(Topology, BadOptionsAreClearErrors) {
  EXPECT_THROW_MSG(topology_from_ranks_per_node(6, 4), "--ranks-per-node 4 does not divide");
  EXPECT_THROW_MSG(topology_from_ranks_per_node(4, 0), "--ranks-per-node must be >= 1");
  EXPECT_THROW_MSG(make_topology({-1, AllToAll::Auto}, {"h"}), "must be >= 0");
  EXPECT_THROW_MSG(parse_all_to_all("tree"), "unknown routing 'tree'");
  EXPECT_EQ(parse_all_to_all("hierarchical"), AllToAll::Hierarchical);
  // Nodes of unequal size: auto falls back to flat, hierarchical is an error naming the nodes.
  const Topology uneven = topology_from_hosts({"a", "a", "b"});
  EXPECT_EQ(uneven.local_size(), 0);
  EXPECT_FALSE(use_hierarchical(uneven, AllToAll::Auto));
  EXPECT_THROW_MSG(use_hierarchical(uneven, AllToAll::Hierarchical),
                   "needs equally many ranks on every node");
}

// Runs the hierarchical all-to-all of every rank of `topo` on simulated ranks and checks it
// against the flat one: counts[s * n + d] elements (int32) from s to d, each rank's send blocks
// in a shuffled order with gaps, recv blocks likewise (gaps must stay untouched).
void expect_hierarchical_matches_flat(const Topology& topo, const std::vector<int64_t>& counts,
                                      uint32_t seed) {
  const int n = topo.size();
  std::mt19937 rng(seed);
  auto layout = [&](const std::vector<int64_t>& sizes, std::vector<int64_t>& offsets) {
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    offsets.assign(n, 0);
    int64_t at = 0;
    for (int i : order) {
      at += rng() % 3;  // a gap
      offsets[i] = at;
      at += sizes[i];
    }
    return at + 1;
  };
  std::vector<std::vector<int64_t>> so(n), ro(n);
  std::vector<std::vector<int32_t>> send(n), flat(n), hier(n);
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> sc(n), rc(n);
    for (int d = 0; d < n; ++d) sc[d] = counts[r * n + d], rc[d] = counts[d * n + r];
    send[r].assign(layout(sc, so[r]), -1);
    for (int d = 0; d < n; ++d)
      for (int64_t k = 0; k < sc[d]; ++k) send[r][so[r][d] + k] = r * 1000000 + d * 1000 + k;
    flat[r].assign(layout(rc, ro[r]), -7);
    hier[r] = flat[r];
  }
  for (int s = 0; s < n; ++s)  // the flat all-to-all
    for (int d = 0; d < n; ++d)
      std::memcpy(&flat[d][ro[d][s]], &send[s][so[s][d]], counts[s * n + d] * 4);
  std::vector<HierarchicalPlan> plan(n);
  std::vector<std::vector<int32_t>> stage(n), relay_in(n), relay_out(n);
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> rc(n);
    for (int s = 0; s < n; ++s) rc[s] = counts[s * n + r];
    plan[r] = plan_hierarchical(topo, r, counts, so[r], rc, ro[r]);
    stage[r].assign(plan[r].stage_elems + 1, -3);
    relay_in[r].assign(plan[r].relay_elems + 1, -3);
    relay_out[r].assign(plan[r].relay_elems + 1, -3);
    for (const CopyPiece& c : plan[r].pack)
      std::memcpy(&stage[r][c.dst], &send[r][c.src], c.count * 4);
  }
  // The two exchanges, checking that each stays where it belongs: intra within a node, inter
  // between ranks of one local index (one aggregated message per pair of nodes).
  auto exchange = [&](bool intra, std::vector<std::vector<int32_t>>& from,
                      std::vector<std::vector<int32_t>>& to) {
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d) {
        const ExchangeCounts& xs = intra ? plan[s].intra : plan[s].inter;
        const ExchangeCounts& xd = intra ? plan[d].intra : plan[d].inter;
        ASSERT_EQ(xs.send_counts[d], xd.recv_counts[s]) << "from " << s << " to " << d;
        const bool allowed =
            intra ? topo.node_of[s] == topo.node_of[d] : topo.local_of[s] == topo.local_of[d];
        if (!allowed) {
          EXPECT_EQ(xs.send_counts[d], 0) << (intra ? "intra" : "inter") << " " << s << "->" << d;
        }
        if (xs.send_counts[d] > 0)
          std::memcpy(&to[d][xd.recv_offsets[s]], &from[s][xs.send_offsets[d]],
                      xs.send_counts[d] * 4);
      }
  };
  exchange(true, stage, relay_in);
  for (int r = 0; r < n; ++r)
    for (const CopyPiece& c : plan[r].regroup)
      std::memcpy(&relay_out[r][c.dst], &relay_in[r][c.src], c.count * 4);
  exchange(false, relay_out, stage);
  for (int r = 0; r < n; ++r) {
    for (const CopyPiece& c : plan[r].unpack)
      std::memcpy(&hier[r][c.dst], &stage[r][c.src], c.count * 4);
    EXPECT_EQ(hier[r], flat[r]) << "rank " << r << " of " << topo.describe();
  }
}

std::vector<int64_t> random_counts(int n, std::mt19937& rng) {
  std::vector<int64_t> c(static_cast<size_t>(n) * n);
  for (auto& x : c) x = rng() % 3 == 0 ? 0 : rng() % 17;  // a third of the parts empty
  return c;
}

TEST(HierarchicalPlan, MatchesTheFlatAllToAllOnRandomSizes) {
  std::mt19937 rng(5);
  const std::vector<Topology> topos = {
      topology_from_ranks_per_node(4, 2),
      topology_from_ranks_per_node(8, 2),
      topology_from_ranks_per_node(6, 3),
      topology_from_ranks_per_node(6, 1),                   // one rank per node: inter only
      topology_from_ranks_per_node(4, 4),                   // one node: intra only
      topology_from_hosts({"b", "a", "b", "a", "b", "a"}),  // ranks interleaved over nodes
  };
  for (const Topology& t : topos)
    for (int trial = 0; trial < 20; ++trial)
      expect_hierarchical_matches_flat(t, random_counts(t.size(), rng), 100 + trial);
  // Everything empty, and one rank sending everything to one other.
  const Topology t = topology_from_ranks_per_node(4, 2);
  expect_hierarchical_matches_flat(t, std::vector<int64_t>(16, 0), 1);
  std::vector<int64_t> one(16, 0);
  one[1 * 4 + 2] = 50;
  expect_hierarchical_matches_flat(t, one, 2);
}

TEST(HierarchicalPlan, CopiesAreMergedAndMismatchedCountsNameTheRanks) {
  const Topology t = topology_from_ranks_per_node(4, 2);
  std::vector<int64_t> counts(16, 1);  // 1 element between every pair, contiguous offsets
  const std::vector<int64_t> offs = {0, 1, 2, 3}, rc(4, 1);
  const HierarchicalPlan p = plan_hierarchical(t, 0, counts, offs, rc, offs);
  EXPECT_EQ(p.stage_elems, 4);
  EXPECT_EQ(p.relay_elems, 4);  // from ranks 0 and 1, for ranks 0 and 2
  EXPECT_EQ(p.intra.send_counts, (std::vector<int64_t>{2, 2, 0, 0}));
  EXPECT_EQ(p.inter.send_counts, (std::vector<int64_t>{2, 0, 2, 0}));
  EXPECT_EQ(p.unpack.size(), 1u);  // node-major ranks, contiguous offsets: one copy
  std::vector<int64_t> wrong = rc;
  wrong[3] = 2;
  EXPECT_THROW_MSG(plan_hierarchical(t, 0, counts, offs, wrong, offs),
                   "rank 3 sends 1 elements to rank 0, which expects 2");
  EXPECT_THROW_MSG(plan_hierarchical(topology_from_hosts({"a", "a", "b"}), 0,
                                     std::vector<int64_t>(9, 0), {0, 0, 0}, {0, 0, 0}, {0, 0, 0}),
                   "equally many ranks per node");
}

}  // namespace
