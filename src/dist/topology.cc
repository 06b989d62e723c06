// Node topology and the routing of the hierarchical all-to-all (include/dlrec/dist/topology.h).
#include "dlrec/dist/topology.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "dlrec/core/error.h"

namespace dlrec::dist {

AllToAll parse_all_to_all(const std::string& s) {
  if (s == "auto") return AllToAll::Auto;
  if (s == "flat") return AllToAll::Flat;
  if (s == "hierarchical") return AllToAll::Hierarchical;
  fail("--all-to-all: unknown routing '", s, "' (auto, flat, hierarchical)");
}

const char* all_to_all_name(AllToAll a) {
  switch (a) {
    case AllToAll::Auto:
      return "auto";
    case AllToAll::Flat:
      return "flat";
    case AllToAll::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

int Topology::local_size() const {
  if (ranks_of_node.empty()) return 0;
  const size_t n = ranks_of_node[0].size();
  for (const auto& r : ranks_of_node)
    if (r.size() != n) return 0;
  return static_cast<int>(n);
}

std::string Topology::describe() const {
  std::ostringstream s;
  const int ls = local_size();
  s << size() << " rank" << (size() == 1 ? "" : "s") << " on " << nodes() << " node"
    << (nodes() == 1 ? "" : "s") << " (";
  if (ls > 0)
    s << ls << " per node";
  else
    s << "unequal ranks per node";
  s << ", from " << source << "):";
  for (int k = 0; k < nodes(); ++k) {
    s << (k ? ";" : "") << " node " << k;
    if (k < static_cast<int>(host_of_node.size()) && !host_of_node[k].empty())
      s << " (" << host_of_node[k] << ")";
    s << ": ranks";
    for (int r : ranks_of_node[k]) s << " " << r;
  }
  return s.str();
}

namespace {
// Fills local_of and ranks_of_node from node_of.
void index_nodes(Topology& t, int nodes) {
  t.ranks_of_node.assign(nodes, {});
  t.local_of.assign(t.node_of.size(), 0);
  for (int r = 0; r < t.size(); ++r) {
    auto& on_node = t.ranks_of_node[t.node_of[r]];
    t.local_of[r] = static_cast<int>(on_node.size());
    on_node.push_back(r);
  }
}
}  // namespace

Topology topology_from_hosts(const std::vector<std::string>& host_of_rank) {
  DLREC_CHECK(!host_of_rank.empty(), "dist: a topology needs at least one rank");
  Topology t;
  std::map<std::string, int> node_of_host;
  for (const auto& h : host_of_rank) {
    auto [it, fresh] = node_of_host.emplace(h, static_cast<int>(t.host_of_node.size()));
    if (fresh) t.host_of_node.push_back(h);
    t.node_of.push_back(it->second);
  }
  index_nodes(t, static_cast<int>(t.host_of_node.size()));
  return t;
}

Topology topology_from_ranks_per_node(int size, int ranks_per_node,
                                      const std::vector<std::string>& host_of_rank) {
  DLREC_CHECK(size >= 1, "dist: a topology needs at least one rank, got ", size);
  DLREC_CHECK(ranks_per_node >= 1, "--ranks-per-node must be >= 1, got ", ranks_per_node);
  DLREC_CHECK(size % ranks_per_node == 0, "--ranks-per-node ", ranks_per_node,
              " does not divide the job's ", size, " ranks into whole nodes");
  Topology t;
  t.source = "--ranks-per-node " + std::to_string(ranks_per_node);
  for (int r = 0; r < size; ++r) t.node_of.push_back(r / ranks_per_node);
  index_nodes(t, size / ranks_per_node);
  for (int k = 0; k < t.nodes(); ++k) {
    const int first = t.ranks_of_node[k][0];
    t.host_of_node.push_back(first < static_cast<int>(host_of_rank.size()) ? host_of_rank[first]
                                                                           : std::string());
  }
  return t;
}

Topology make_topology(const ExchangeOptions& options,
                       const std::vector<std::string>& host_of_rank) {
  DLREC_CHECK(options.ranks_per_node >= 0,
              "--ranks-per-node must be >= 0 (0: from the host "
              "names), got ",
              options.ranks_per_node);
  if (options.ranks_per_node > 0)
    return topology_from_ranks_per_node(static_cast<int>(host_of_rank.size()),
                                        options.ranks_per_node, host_of_rank);
  return topology_from_hosts(host_of_rank);
}

bool use_hierarchical(const Topology& topo, AllToAll choice) {
  if (choice == AllToAll::Flat) return false;
  if (choice == AllToAll::Hierarchical) {
    DLREC_CHECK(topo.local_size() > 0,
                "--all-to-all hierarchical needs equally many ranks on every node; this job has ",
                topo.describe());
    return true;
  }
  return topo.spans_nodes() && topo.local_size() > 0;
}

const TopologyAware* topology_of(const Communicator& c) {
  return dynamic_cast<const TopologyAware*>(&c);
}

void print_topology(const Communicator& c, std::FILE* out) {
  if (!out || c.rank() != 0 || c.size() < 2) return;
  const TopologyAware* t = topology_of(c);
  if (!t) return;
  std::fprintf(out, "[dist] %s; all-to-all: %s\n", t->topology().describe().c_str(),
               t->hierarchical() ? "hierarchical (intra-node, then inter-node)" : "flat");
  std::fflush(out);
}

std::unique_ptr<Communicator> make_communicator(const std::string& kind, const CommOptions& options,
                                                const ExchangeOptions& exchange) {
  const bool mpi = kind == "mpi" || (kind == "auto" && started_by_mpi_launcher());
  if (!mpi) return make_communicator(kind, options);  // single (or an unknown kind's error)
  return make_mpi_communicator(options, exchange);
}

// ---- Routing ----

namespace {
void add_copy(std::vector<CopyPiece>& v, int64_t src, int64_t dst, int64_t count) {
  if (count == 0) return;
  if (!v.empty() && v.back().src + v.back().count == src && v.back().dst + v.back().count == dst) {
    v.back().count += count;  // contiguous on both sides: one copy
    return;
  }
  v.push_back({src, dst, count});
}
}  // namespace

HierarchicalPlan plan_hierarchical(const Topology& topo, int rank,
                                   const std::vector<int64_t>& counts,
                                   const std::vector<int64_t>& send_offsets,
                                   const std::vector<int64_t>& recv_counts,
                                   const std::vector<int64_t>& recv_offsets) {
  const int n = topo.size(), nodes = topo.nodes(), locals = topo.local_size();
  DLREC_CHECK(locals > 0, "dist: the hierarchical all-to-all needs equally many ranks per node");
  DLREC_CHECK(rank >= 0 && rank < n, "dist: rank ", rank, " outside a job of ", n);
  DLREC_CHECK(counts.size() == static_cast<size_t>(n) * n, "dist: ", counts.size(),
              " counts for a job of ", n, " ranks (", n * n, " expected)");
  DLREC_CHECK(send_offsets.size() == static_cast<size_t>(n) &&
                  recv_counts.size() == static_cast<size_t>(n) &&
                  recv_offsets.size() == static_cast<size_t>(n),
              "dist: all_to_all_v needs ", n, " counts and offsets each (one per rank)");
  auto c = [&](int s, int d) { return counts[static_cast<size_t>(s) * n + d]; };
  for (int s = 0; s < n; ++s) {
    DLREC_CHECK(c(s, rank) >= 0 && recv_offsets[s] >= 0 && send_offsets[s] >= 0,
                "dist: all_to_all_v: negative count or offset");
    DLREC_CHECK(c(s, rank) == recv_counts[s], "dist: all_to_all_v: rank ", s, " sends ", c(s, rank),
                " elements to rank ", rank, ", which expects ", recv_counts[s]);
  }
  const int node = topo.node_of[rank], local = topo.local_of[rank];
  HierarchicalPlan p;
  p.intra = {std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0),
             std::vector<int64_t>(n, 0)};
  p.inter = p.intra;
  // 1. pack: for the peer of each local index on this node, everything for that local index,
  //    node by node.
  int64_t at = 0;
  for (int ld = 0; ld < locals; ++ld) {
    const int peer = topo.rank_at(node, ld);
    p.intra.send_offsets[peer] = at;
    for (int nd = 0; nd < nodes; ++nd) {
      const int d = topo.rank_at(nd, ld);
      add_copy(p.pack, send_offsets[d], at, c(rank, d));
      at += c(rank, d);
    }
    p.intra.send_counts[peer] = at - p.intra.send_offsets[peer];
  }
  p.stage_elems = at;
  // 2. intra receive: from each rank of this node, its messages for this local index on every
  //    node (node by node).
  at = 0;
  std::vector<int64_t> relay_from(locals);
  for (int ls = 0; ls < locals; ++ls) {
    const int s = topo.rank_at(node, ls);
    relay_from[ls] = at;
    p.intra.recv_offsets[s] = at;
    for (int nd = 0; nd < nodes; ++nd) at += c(s, topo.rank_at(nd, local));
    p.intra.recv_counts[s] = at - relay_from[ls];
  }
  p.relay_elems = at;
  // 3. regroup, and 4. inter send: to this local index's rank on each node, the messages of
  //    every rank of this node for it (by source local index).
  at = 0;
  for (int nd = 0; nd < nodes; ++nd) {
    const int d = topo.rank_at(nd, local);
    p.inter.send_offsets[d] = at;
    for (int ls = 0; ls < locals; ++ls) {
      const int s = topo.rank_at(node, ls);
      int64_t within = 0;  // message s -> d inside s's block of relay_in
      for (int k = 0; k < nd; ++k) within += c(s, topo.rank_at(k, local));
      add_copy(p.regroup, relay_from[ls] + within, at, c(s, d));
      at += c(s, d);
    }
    p.inter.send_counts[d] = at - p.inter.send_offsets[d];
  }
  // 4. inter receive, 5. unpack: from this local index's rank on each node, the messages of
  //    that node's ranks for this rank (by source local index).
  at = 0;
  for (int ns = 0; ns < nodes; ++ns) {
    const int relay = topo.rank_at(ns, local);
    p.inter.recv_offsets[relay] = at;
    for (int ls = 0; ls < locals; ++ls) {
      const int s = topo.rank_at(ns, ls);
      add_copy(p.unpack, at, recv_offsets[s], c(s, rank));
      at += c(s, rank);
    }
    p.inter.recv_counts[relay] = at - p.inter.recv_offsets[relay];
  }
  p.stage_elems = std::max(p.stage_elems, at);  // the stage is reused for the inter receive
  return p;
}

void run_hierarchical(const HierarchicalPlan& plan, const void* send, void* recv, void* work,
                      size_t elem_bytes, const CopyFn& copy, const FlatExchangeFn& exchange) {
  char* stage = static_cast<char*>(work);
  char* relay_in = stage + plan.stage_elems * elem_bytes;
  char* relay_out = relay_in + plan.relay_elems * elem_bytes;
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  const int64_t es = static_cast<int64_t>(elem_bytes);
  for (const CopyPiece& c : plan.pack) copy(stage + c.dst * es, src + c.src * es, c.count * es);
  exchange(stage, plan.intra, relay_in);
  for (const CopyPiece& c : plan.regroup)
    copy(relay_out + c.dst * es, relay_in + c.src * es, c.count * es);
  exchange(relay_out, plan.inter, stage);
  for (const CopyPiece& c : plan.unpack) copy(dst + c.dst * es, stage + c.src * es, c.count * es);
}

}  // namespace dlrec::dist
