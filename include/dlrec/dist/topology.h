// Node topology of a job and the hierarchical all-to-all (docs/DISTRIBUTED.md, "Several
// nodes").
//
// A rank learns its node from the host names the ranks gather over MPI when the communicator is
// made, or from a declared `ranks_per_node` (several "nodes" on one host, for testing; it
// overrides the host names). When the ranks span several nodes, all_to_all_v of the MPI and NCCL
// communicators is hierarchical: every message first goes to the rank of the sender's node that
// has the destination's local index (one intra-node all-to-all: a rank gathers there everything
// for the ranks of its local index), then one inter-node exchange among the ranks of the same
// local index carries, per pair of nodes, one aggregated message. Pure data movement: the
// result is byte-identical to the flat all-to-all.
//
// Kept out of communicator.h so that the Communicator interface stays as it is: the MPI and
// NCCL communicators also implement TopologyAware (topology_of() finds it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/dist/communicator.h"

namespace dlrec::dist {

enum class AllToAll { Auto, Flat, Hierarchical };
// "auto", "flat", "hierarchical"; anything else is an error naming the option.
AllToAll parse_all_to_all(const std::string& s);
const char* all_to_all_name(AllToAll a);

// How the ranks are grouped into nodes and how all_to_all_v is routed.
struct ExchangeOptions {
  // 0: nodes from the ranks' host names. N > 0: ranks [k*N, (k+1)*N) form node k (declared
  // "nodes", e.g. on one host to test the inter-node path); the job's size must be a multiple.
  int ranks_per_node = 0;
  // auto: hierarchical when the ranks span several nodes with equally many ranks each, flat
  // otherwise. hierarchical: an error unless every node has equally many ranks.
  AllToAll all_to_all = AllToAll::Auto;
};

struct Topology {
  std::vector<int> node_of, local_of;           // per rank
  std::vector<std::vector<int>> ranks_of_node;  // per node: its ranks in local order
  std::vector<std::string> host_of_node;        // per node: a host name (first rank's)
  std::string source = "host names";            // or "--ranks-per-node N"

  int size() const { return static_cast<int>(node_of.size()); }
  int nodes() const { return static_cast<int>(ranks_of_node.size()); }
  bool spans_nodes() const { return nodes() > 1; }
  // Ranks per node when every node has equally many, else 0.
  int local_size() const;
  int rank_at(int node, int local) const { return ranks_of_node[node][local]; }
  // One line: "4 ranks on 2 nodes (2 per node, from host names): node 0 (host a): ranks 0 1; ..."
  std::string describe() const;
};

// Node k is the k-th distinct host name in rank order; a rank's local index is its position
// among its node's ranks (by rank).
Topology topology_from_hosts(const std::vector<std::string>& host_of_rank);
// Ranks [k*n, (k+1)*n) form node k; an error unless n >= 1 divides size.
Topology topology_from_ranks_per_node(int size, int ranks_per_node,
                                      const std::vector<std::string>& host_of_rank = {});
// The topology `options` asks for given the gathered host names.
Topology make_topology(const ExchangeOptions& options,
                       const std::vector<std::string>& host_of_rank);
// Whether all_to_all_v is hierarchical for this topology and choice (an error for
// `hierarchical` on nodes of unequal size).
bool use_hierarchical(const Topology& topo, AllToAll choice);

// Implemented by the communicators that know their nodes (MPI, NCCL).
class TopologyAware {
 public:
  virtual ~TopologyAware() = default;
  virtual const Topology& topology() const = 0;
  virtual bool hierarchical() const = 0;
};
// The communicator's topology and routing, or null for one that has none (single process).
const TopologyAware* topology_of(const Communicator& c);
// Rank 0 writes the job's topology and the all-to-all's routing to `out` (when the job has
// several ranks and `out` is not null).
void print_topology(const Communicator& c, std::FILE* out);

// The factories with the exchange options (communicator.h's use the defaults).
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options,
                                                    const ExchangeOptions& exchange);
std::unique_ptr<Communicator> make_communicator(const std::string& kind, const CommOptions& options,
                                                const ExchangeOptions& exchange);

// ---- The routing arithmetic of the hierarchical all-to-all (pure functions, unit-tested). ----

// Copy `count` elements from src offset to dst offset (elements).
struct CopyPiece {
  int64_t src = 0, dst = 0, count = 0;
};
// One flat all-to-all's counts and offsets (elements), one entry per rank.
struct ExchangeCounts {
  std::vector<int64_t> send_counts, send_offsets, recv_counts, recv_offsets;
};
// One rank's part of a hierarchical all_to_all_v. Buffers: `send`, the user's send buffer;
// stage (stage_elems), relay_in and relay_out (relay_elems each), the user's recv.
//   1. pack:    send -> stage, grouped by destination local index, then destination node;
//   2. intra:   stage -> relay_in, an all-to-all among the ranks of this node only;
//   3. regroup: relay_in -> relay_out, grouped by destination node, then source local index;
//   4. inter:   relay_out -> stage, an all-to-all among the ranks of this local index only;
//   5. unpack:  stage -> recv, each source's message to its recv offset.
struct HierarchicalPlan {
  int64_t stage_elems = 0, relay_elems = 0;
  std::vector<CopyPiece> pack, regroup, unpack;
  ExchangeCounts intra, inter;
};
// counts[s * N + d]: the elements rank s sends to rank d (every rank's send_counts, gathered).
// Checks that column `rank` equals recv_counts (an error naming the two ranks otherwise).
HierarchicalPlan plan_hierarchical(const Topology& topo, int rank,
                                   const std::vector<int64_t>& counts,
                                   const std::vector<int64_t>& send_offsets,
                                   const std::vector<int64_t>& recv_counts,
                                   const std::vector<int64_t>& recv_offsets);

// Runs a plan with the communicator's own copy and flat exchange. `work` holds
// stage_elems + 2 * relay_elems elements of `elem_bytes`.
using CopyFn = std::function<void(void* dst, const void* src, int64_t bytes)>;
using FlatExchangeFn = std::function<void(const void* send, const ExchangeCounts& x, void* recv)>;
void run_hierarchical(const HierarchicalPlan& plan, const void* send, void* recv, void* work,
                      size_t elem_bytes, const CopyFn& copy, const FlatExchangeFn& exchange);

}  // namespace dlrec::dist
