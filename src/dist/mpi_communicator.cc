// The MPI communicator (CPU buffers), built when CMake finds MPI (DLREC_WITH_MPI).
//
// Every collective is a non-blocking MPI call that this rank waits for by polling, so that a wait
// has a deadline. To say which ranks are missing when it expires, each rank announces every
// collective it enters (its sequence number and op) to the others on a second communicator: a
// 16-byte message per peer, drained while waiting. A rank whose last announcement is older than
// the collective that timed out has not arrived; one announcing another op at the same number
// took another path through the program.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <sstream>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/topology.h"

#ifdef DLREC_WITH_MPI
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#endif

namespace dlrec::dist {

bool mpi_built() {
#ifdef DLREC_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool started_by_mpi_launcher() {
  // Set by Open MPI's mpirun (OMPI_*), by PMIx launchers and by MPICH/Hydra (PMI_*) in every rank.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

#ifndef DLREC_WITH_MPI

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  return make_mpi_communicator(options, ExchangeOptions{});
}
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions&, const ExchangeOptions&) {
  fail(
      "this build of dlrec has no MPI: install Open MPI (Debian: openmpi-bin libopenmpi-dev) and "
      "rebuild, or train as a single process");
}
int mpi_local_rank() { return 0; }
void abort_job(const std::string& message, int) {
  std::fprintf(stderr, "dlrec: error: %s\n", message.c_str());
}
void finalize() {}

#else

namespace {

bool g_initialised_here = false;

void check_mpi(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("dist: ", call, " failed on rank ", rank, ": ", std::string(text, len));
}

MPI_Datatype mpi_type(Elem e, bool reduce) {
  switch (e) {
    case Elem::U8:
      return MPI_UINT8_T;
    case Elem::I32:
      return MPI_INT32_T;
    case Elem::I64:
      return MPI_INT64_T;
    case Elem::F32:
      return MPI_FLOAT;
    case Elem::F64:
      return MPI_DOUBLE;
    case Elem::BF16:
    case Elem::F16:
      // MPI has no 16-bit floats: moving them is fine, reducing them is not.
      if (reduce)
        fail("dist: the MPI communicator cannot reduce ", elem_name(e),
             " values (MPI has no 16-bit float type); reduce f32");
      return MPI_UINT16_T;
  }
  fail("dist: unknown element type");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  fail("dist: unknown reduce op");
}

enum OpCode : int64_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAllV,
  kBarrier
};
const char* op_name(int64_t op) {
  switch (op) {
    case kAllReduce:
      return "all_reduce";
    case kBroadcast:
      return "broadcast";
    case kAllGather:
      return "all_gather";
    case kReduceScatter:
      return "reduce_scatter";
    case kAllToAllV:
      return "all_to_all_v";
    case kBarrier:
      return "barrier";
  }
  return "none";
}

int to_int(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > INT_MAX)
    fail("dist: ", op, ": ", what, " ", v, " is out of MPI's range (0 to ", INT_MAX,
         " elements); split the collective");
  return static_cast<int>(v);
}

constexpr int kNoticeTag = 7001;

class MpiCommunicator final : public Communicator, public TopologyAware {
 public:
  MpiCommunicator(const CommOptions& opt, const ExchangeOptions& exchange) : opt_(opt) {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", -1);
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &notice_comm_), "MPI_Comm_dup", -1);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(notice_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    seen_seq_.assign(size_, 0);
    seen_op_.assign(size_, 0);
    topology_ = make_topology(exchange, gather_host_names());
    hierarchical_ = use_hierarchical(topology_, exchange.all_to_all);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& n : pending_) {  // announcements nobody will read any more
      MPI_Cancel(&n.req);
      MPI_Request_free(&n.req);
    }
    MPI_Comm_free(&notice_comm_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }
  const Topology& topology() const override { return topology_; }
  bool hierarchical() const override { return hierarchical_; }

  void all_reduce(void* buf, int64_t count, Elem type, ReduceOp op) override {
    DLREC_CHECK(count >= 0, "dist: all_reduce of ", count, " elements");
    const MPI_Datatype t = mpi_type(type, true);
    const int64_t chunk = INT_MAX / 2;
    char* p = static_cast<char*>(buf);
    do {  // at least once, so that every rank counts the same collectives
      const int64_t n = std::min(count, chunk);
      MPI_Request req;
      check(MPI_Iallreduce(MPI_IN_PLACE, p, static_cast<int>(n), t, mpi_op(op), comm_, &req),
            "MPI_Iallreduce");
      wait(req, kAllReduce, type, n, reduce_op_name(op));
      p += n * elem_size(type);
      count -= n;
    } while (count > 0);
  }

  void broadcast(void* buf, int64_t count, Elem type, int root) override {
    DLREC_CHECK(count >= 0, "dist: broadcast of ", count, " elements");
    DLREC_CHECK(root >= 0 && root < size_, "dist: broadcast from rank ", root, " in a job of ",
                size_, " ranks");
    const MPI_Datatype t = mpi_type(type, false);
    const int64_t chunk = INT_MAX / 2;
    char* p = static_cast<char*>(buf);
    do {
      const int64_t n = std::min(count, chunk);
      MPI_Request req;
      check(MPI_Ibcast(p, static_cast<int>(n), t, root, comm_, &req), "MPI_Ibcast");
      wait(req, kBroadcast, type, n, "");
      p += n * elem_size(type);
      count -= n;
    } while (count > 0);
  }

  void all_gather(const void* send, void* recv, int64_t count, Elem type) override {
    const int n = to_int(count, "all_gather", "count");
    to_int(count * size_, "all_gather", "result size");
    const MPI_Datatype t = mpi_type(type, false);
    MPI_Request req;
    const void* src = send == recv ? MPI_IN_PLACE : send;
    if (src == MPI_IN_PLACE) fail("dist: all_gather needs distinct send and receive buffers");
    check(MPI_Iallgather(src, n, t, recv, n, t, comm_, &req), "MPI_Iallgather");
    wait(req, kAllGather, type, count, "");
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, Elem type,
                      ReduceOp op) override {
    const int n = to_int(count, "reduce_scatter", "count");
    to_int(count * size_, "reduce_scatter", "input size");
    DLREC_CHECK(send != recv, "dist: reduce_scatter needs distinct send and receive buffers");
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(type, true), mpi_op(op), comm_, &req),
          "MPI_Ireduce_scatter_block");
    wait(req, kReduceScatter, type, count, reduce_op_name(op));
  }

  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& send_offsets, void* recv,
                    const std::vector<int64_t>& recv_counts,
                    const std::vector<int64_t>& recv_offsets, Elem type) override {
    if (!hierarchical_) {
      flat_all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, type);
      return;
    }
    // Every rank's send counts (one all-gather), so that each can route the messages it relays.
    const size_t n = size_;
    DLREC_CHECK(send_counts.size() == n, "dist: all_to_all_v needs ", n,
                " send counts (one per rank), got ", send_counts.size());
    std::vector<int64_t> counts(n * n);
    all_gather(send_counts.data(), counts.data(), size_, Elem::I64);
    const HierarchicalPlan plan =
        plan_hierarchical(topology_, rank_, counts, send_offsets, recv_counts, recv_offsets);
    const size_t es = elem_size(type);
    work_.resize((plan.stage_elems + 2 * plan.relay_elems) * es);
    run_hierarchical(
        plan, send, recv, work_.data(), es,
        [](void* dst, const void* src, int64_t bytes) { std::memcpy(dst, src, bytes); },
        [&](const void* s, const ExchangeCounts& x, void* r) {
          flat_all_to_all_v(s, x.send_counts, x.send_offsets, r, x.recv_counts, x.recv_offsets,
                            type);
        });
  }

  void flat_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                         const std::vector<int64_t>& send_offsets, void* recv,
                         const std::vector<int64_t>& recv_counts,
                         const std::vector<int64_t>& recv_offsets, Elem type) {
    const size_t n = size_;
    DLREC_CHECK(send_counts.size() == n && send_offsets.size() == n && recv_counts.size() == n &&
                    recv_offsets.size() == n,
                "dist: all_to_all_v needs ", n, " counts and offsets each (one per rank), got ",
                send_counts.size(), ", ", send_offsets.size(), ", ", recv_counts.size(), ", ",
                recv_offsets.size());
    std::vector<int> sc(n), so(n), rc(n), ro(n);
    int64_t total = 0;
    for (size_t r = 0; r < n; ++r) {
      sc[r] = to_int(send_counts[r], "all_to_all_v", "send count");
      so[r] = to_int(send_offsets[r], "all_to_all_v", "send offset");
      rc[r] = to_int(recv_counts[r], "all_to_all_v", "receive count");
      ro[r] = to_int(recv_offsets[r], "all_to_all_v", "receive offset");
      total += send_counts[r];
    }
    const MPI_Datatype t = mpi_type(type, false);
    MPI_Request req;
    check(MPI_Ialltoallv(send, sc.data(), so.data(), t, recv, rc.data(), ro.data(), t, comm_, &req),
          "MPI_Ialltoallv");
    wait(req, kAllToAllV, type, total, "");
  }

  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
    wait(req, kBarrier, Elem::U8, 0, "");
  }

 private:
  void check(int rc, const char* call) { check_mpi(rc, call, rank_); }

  // Every rank's host name, in rank order (once, when the communicator is made).
  std::vector<std::string> gather_host_names() {
    constexpr int kLen = 256;
    char mine[kLen] = {};
    gethostname(mine, kLen - 1);
    std::vector<char> all(static_cast<size_t>(kLen) * size_);
    check(MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm_),
          "MPI_Allgather (host names)");
    std::vector<std::string> hosts;
    for (int r = 0; r < size_; ++r) hosts.emplace_back(all.data() + static_cast<size_t>(r) * kLen);
    return hosts;
  }

  // Tells every other rank that this one entered collective `seq_` (op).
  void announce(int64_t op) {
    // Finished announcements give their buffers back.
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
      it = done ? pending_.erase(it) : std::next(it);
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      pending_.push_back({{seq_, op}, MPI_REQUEST_NULL});
      Notice& n = pending_.back();
      check(MPI_Isend(n.msg, 2, MPI_INT64_T, r, kNoticeTag, notice_comm_, &n.req), "MPI_Isend");
    }
    seen_seq_[rank_] = seq_;
    seen_op_[rank_] = op;
  }

  void drain_notices() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      check(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notice_comm_, &flag, &st), "MPI_Iprobe");
      if (!flag) return;
      int64_t msg[2];
      check(
          MPI_Recv(msg, 2, MPI_INT64_T, st.MPI_SOURCE, kNoticeTag, notice_comm_, MPI_STATUS_IGNORE),
          "MPI_Recv");
      seen_seq_[st.MPI_SOURCE] = msg[0];
      seen_op_[st.MPI_SOURCE] = msg[1];
    }
  }

  void wait(MPI_Request& req, int64_t op, Elem type, int64_t count, const char* detail) {
    ++seq_;
    announce(op);
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                      std::chrono::duration<double>(opt_.timeout_seconds));
    int64_t polls = 0;
    bool all_in = false, sleeping = false;
    for (;;) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (++polls % 64 == 0 || sleeping) {
        drain_notices();
        const auto now = clock::now();
        if (now > deadline) timed_out(op, type, count, detail);
        all_in = true;
        for (int r = 0; r < size_ && all_in; ++r) all_in = seen_seq_[r] >= seq_;
        sleeping = !all_in && now - start > std::chrono::milliseconds(2);
      }
      // Once every rank is in, the transfer is under way and MPI moves it on as it is polled (a
      // sleep between polls held a 20 MB gather to about 200 MB/s through shared memory): poll
      // on, yielding the core to any other runnable thread (more ranks than cores). While a
      // rank is still out (computing), sleep between polls after 2 ms, each time looking for
      // its announcement.
      if (sleeping)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      else if (polls > 1024)
        std::this_thread::yield();
    }
  }

  [[noreturn]] void timed_out(int64_t op, Elem type, int64_t count, const char* detail) {
    drain_notices();
    std::ostringstream missing, other_op, arrived;
    int n_missing = 0, n_other = 0;
    for (int r = 0; r < size_; ++r) {
      if (seen_seq_[r] < seq_) {
        missing << (n_missing++ ? ", " : "") << r << " (last entered "
                << (seen_seq_[r] ? op_name(seen_op_[r]) : "none") << " #" << seen_seq_[r] << ")";
      } else if (seen_seq_[r] == seq_ && seen_op_[r] != op) {
        other_op << (n_other++ ? ", " : "") << r << " (in " << op_name(seen_op_[r]) << ")";
      } else {
        arrived << (arrived.tellp() > 0 ? ", " : "") << r;
      }
    }
    std::ostringstream msg;
    msg << "dist: collective #" << seq_ << " " << op_name(op) << " (" << elem_name(type) << " x "
        << count << (*detail ? ", " : "") << detail << ") on rank " << rank_ << " of " << size_
        << " waited more than " << opt_.timeout_seconds << " s";
    if (n_missing) msg << "; ranks that have not arrived: " << missing.str();
    if (n_other) msg << "; ranks in another collective at this point: " << other_op.str();
    if (!n_missing && !n_other) msg << "; every rank arrived but the collective did not complete";
    msg << "; arrived: " << arrived.str();
    fail(msg.str());
  }

  struct Notice {
    int64_t msg[2];
    MPI_Request req;
  };
  CommOptions opt_;
  MPI_Comm comm_ = MPI_COMM_NULL, notice_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int64_t seq_ = 0;
  std::vector<int64_t> seen_seq_, seen_op_;
  std::list<Notice> pending_;  // list: the buffers must not move while a send is in flight
  Topology topology_;
  bool hierarchical_ = false;
  std::vector<char> work_;  // the hierarchical all-to-all's staging
};

void init_mpi() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return;
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) fail("dist: MPI_Init_thread failed (code ", rc, ")");
  g_initialised_here = true;
}

bool mpi_running() {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  return initialised && !finalized;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  return make_mpi_communicator(options, ExchangeOptions{});
}

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options,
                                                    const ExchangeOptions& exchange) {
  DLREC_CHECK(options.timeout_seconds > 0, "dist: the collective timeout must be > 0 seconds, got ",
              options.timeout_seconds);
  init_mpi();
  return std::make_unique<MpiCommunicator>(options, exchange);
}

int mpi_local_rank() {
  if (!mpi_running()) return 0;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

void abort_job(const std::string& message, int exit_code) {
  if (!mpi_running()) {
    std::fprintf(stderr, "dlrec: error: %s\n", message.c_str());
    return;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::fprintf(stderr, "dlrec: error: rank %d of %d: %s\n", rank, size, message.c_str());
  std::fflush(stderr);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

void finalize() {
  if (g_initialised_here && mpi_running()) MPI_Finalize();
}

#endif  // DLREC_WITH_MPI

}  // namespace dlrec::dist
