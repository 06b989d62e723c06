// The NCCL communicator: built in CUDA builds where CMake finds NCCL (DLREC_WITH_NCCL).
//
// One GPU per process. Rank 0 creates the unique id and the bootstrap communicator (MPI)
// broadcasts it. The communicator is created non-blocking, so that creating it and every
// collective can be waited for with a deadline: past CommOptions::timeout_seconds the NCCL
// communicator is aborted and the call throws naming the collective (NCCL cannot tell which
// ranks are missing; their own timeouts or the launcher name them).
//
// Collectives run on the communicator's own stream (stream()). Outside stream capture a call
// returns once its collective completed, so host code can use the result; while stream() is
// being captured into a CUDA graph, a call only records the collective (no wait), so a step's
// graph holds its collectives. Inputs written on another stream must be ordered before the
// call by the caller (an event, or writing them on stream()).
#include "dlrec/core/error.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/topology.h"

#ifdef DLREC_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <thread>
#endif

namespace dlrec::dist {

#ifndef DLREC_WITH_NCCL

bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int, const CommOptions&) {
  fail(
      "this build of dlrec has no NCCL (it needs a CUDA build with NCCL's headers and library): "
      "GPU training across ranks is not available");
}

#else

bool nccl_built() { return true; }

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("dist (nccl): ", what, ": ", cudaGetErrorString(e));
}

ncclDataType_t nccl_type(Elem e) {
  switch (e) {
    case Elem::U8:
      return ncclUint8;
    case Elem::I32:
      return ncclInt32;
    case Elem::I64:
      return ncclInt64;
    case Elem::F32:
      return ncclFloat32;
    case Elem::F64:
      return ncclFloat64;
    case Elem::BF16:
      return ncclBfloat16;
    case Elem::F16:
      return ncclFloat16;
  }
  fail("dist (nccl): unknown element type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  fail("dist (nccl): unknown reduce op");
}

using Clock = std::chrono::steady_clock;

class NcclCommunicator final : public Communicator, public TopologyAware {
 public:
  NcclCommunicator(Communicator& bootstrap, int device, const CommOptions& opt)
      : opt_(opt),
        device_(device),
        rank_(bootstrap.rank()),
        size_(bootstrap.size()),
        bootstrap_(&bootstrap) {
    DLREC_CHECK(!bootstrap.device().is_cuda(),
                "dist (nccl): the bootstrap communicator must be a host one (MPI)");
    // The nodes and the all-to-all's routing are the bootstrap's (the processes are its ranks).
    if (const TopologyAware* t = topology_of(bootstrap)) {
      topology_ = t->topology();
      hierarchical_ = t->hierarchical();
    } else {
      topology_ = topology_from_hosts(std::vector<std::string>(size_, ""));
    }
    int count = 0;
    check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    DLREC_CHECK(device >= 0 && device < count, "dist (nccl): rank ", rank_, " asks for GPU ",
                device, " but this node has ", count);
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id;
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(&id, sizeof id, Elem::U8, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that creation and collectives can be waited for with a deadline
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    wait_comm_ready("ncclCommInitRankConfig");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, 16), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        ncclResult_t st = ncclInProgress;
        while (ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress)
          std::this_thread::yield();
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_) cudaFree(scratch_);
    for (void* w : work_) cudaFree(w);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }
  void* stream() const override { return stream_; }
  // A new NCCL communicator (its unique id broadcast over the same bootstrap) and stream.
  std::unique_ptr<Communicator> duplicate() override {
    return std::make_unique<NcclCommunicator>(*bootstrap_, device_, opt_);
  }
  const Topology& topology() const override { return topology_; }
  bool hierarchical() const override { return hierarchical_; }

  void all_reduce(void* buf, int64_t count, Elem type, ReduceOp op) override {
    DLREC_CHECK(count >= 0, "dist (nccl): all_reduce of ", count, " elements");
    run("all_reduce", [&] {
      return ncclAllReduce(buf, buf, count, nccl_type(type), nccl_op(op), comm_, stream_);
    });
  }
  void broadcast(void* buf, int64_t count, Elem type, int root) override {
    DLREC_CHECK(root >= 0 && root < size_, "dist (nccl): broadcast from rank ", root,
                " in a job of ", size_, " ranks");
    run("broadcast",
        [&] { return ncclBroadcast(buf, buf, count, nccl_type(type), root, comm_, stream_); });
  }
  void all_gather(const void* send, void* recv, int64_t count, Elem type) override {
    run("all_gather",
        [&] { return ncclAllGather(send, recv, count, nccl_type(type), comm_, stream_); });
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, Elem type,
                      ReduceOp op) override {
    run("reduce_scatter", [&] {
      return ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), comm_, stream_);
    });
  }
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& send_offsets, void* recv,
                    const std::vector<int64_t>& recv_counts,
                    const std::vector<int64_t>& recv_offsets, Elem type) override {
    if (!hierarchical_) {
      flat_all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, type);
      return;
    }
    // Every rank's send counts over the bootstrap (host; counts are host values, also while the
    // stream is captured), so that each rank can route the messages it relays.
    const size_t n = size_;
    DLREC_CHECK(send_counts.size() == n, "dist (nccl): all_to_all_v needs ", n,
                " send counts (one per rank), got ", send_counts.size());
    std::vector<int64_t> counts(n * n);
    bootstrap_->all_gather(send_counts.data(), counts.data(), size_, Elem::I64);
    const HierarchicalPlan plan =
        plan_hierarchical(topology_, rank_, counts, send_offsets, recv_counts, recv_offsets);
    const size_t es = elem_size(type);
    void* work = workspace((plan.stage_elems + 2 * plan.relay_elems) * es);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    run_hierarchical(
        plan, send, recv, work, es,
        [&](void* dst, const void* src, int64_t bytes) {
          check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                     "cudaMemcpyAsync (hierarchical all_to_all_v)");
        },
        [&](const void* s, const ExchangeCounts& x, void* r) {
          flat_all_to_all_v(s, x.send_counts, x.send_offsets, r, x.recv_counts, x.recv_offsets,
                            type);
        });
    wait_stream("all_to_all_v (hierarchical: unpack)");  // the last copies
  }

  void flat_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                         const std::vector<int64_t>& send_offsets, void* recv,
                         const std::vector<int64_t>& recv_counts,
                         const std::vector<int64_t>& recv_offsets, Elem type) {
    const size_t n = size_;
    DLREC_CHECK(send_counts.size() == n && send_offsets.size() == n && recv_counts.size() == n &&
                    recv_offsets.size() == n,
                "dist (nccl): all_to_all_v needs ", n, " counts and offsets each (one per rank)");
    const size_t es = elem_size(type);
    const ncclDataType_t t = nccl_type(type);
    run("all_to_all_v", [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        if (send_counts[p] > 0)
          r = ncclSend(static_cast<const char*>(send) + send_offsets[p] * es, send_counts[p], t, p,
                       comm_, stream_);
        if (r == ncclSuccess && recv_counts[p] > 0)
          r = ncclRecv(static_cast<char*>(recv) + recv_offsets[p] * es, recv_counts[p], t, p, comm_,
                       stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  void barrier() override {
    run("barrier",
        [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress)
      fail("dist (nccl): ", what, " failed on rank ", rank_, ": ", ncclGetErrorString(r), " (",
           ncclGetLastError(comm_), ")");
  }

  // Waits (with the deadline) until the non-blocking communicator finished its last call.
  void wait_comm_ready(const char* what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(opt_.timeout_seconds));
    for (;;) {
      ncclResult_t st = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) check(st, what);
      if (Clock::now() > deadline) timed_out(what);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  template <class F>
  void run(const char* op, F&& enqueue) {
    ++seq_;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check(enqueue(), op);
    wait_comm_ready(op);
    wait_stream(op);
  }

  // Outside stream capture: returns when the work queued on stream() is done (with the
  // deadline). While the stream is captured: returns at once (the work is in the graph).
  void wait_stream(const char* op) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) return;  // recorded into the graph
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(opt_.timeout_seconds));
    for (int64_t polls = 0;; ++polls) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, op);
      ncclResult_t st = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st != ncclSuccess && st != ncclInProgress) check(st, op);
      if (Clock::now() > deadline) timed_out(op);
      if (polls > 4096) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // A device buffer of at least `bytes` for the hierarchical all-to-all. Buffers are never
  // freed while the communicator lives: a captured CUDA graph may still use an older one.
  void* workspace(size_t bytes) {
    if (bytes <= work_bytes_ && !work_.empty()) return work_.back();
    const size_t want = std::max<size_t>({bytes, work_bytes_ * 2, 1 << 20});
    void* p = nullptr;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    // The first call may come while a step's graph is being captured: allocate in relaxed
    // capture mode (an allocation is not part of the graph).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    const cudaError_t e = cudaMalloc(&p, want);
    cudaThreadExchangeStreamCaptureMode(&mode);
    check_cuda(e, "cudaMalloc (hierarchical all_to_all_v staging)");
    work_.push_back(p);
    work_bytes_ = want;
    return p;
  }

  [[noreturn]] void timed_out(const char* op) {
    aborted_ = true;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    fail("dist (nccl): collective #", seq_, " ", op, " on rank ", rank_, " of ", size_, " (GPU ",
         device_, ") waited more than ", opt_.timeout_seconds,
         " s; the NCCL communicator was aborted (NCCL does not say which ranks are missing: "
         "the other ranks' messages and the launcher's name them)");
  }

  CommOptions opt_;
  int device_ = 0, rank_ = 0, size_ = 1;
  int64_t seq_ = 0;
  bool aborted_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;            // the barrier's all-reduce
  Communicator* bootstrap_ = nullptr;  // outlives this communicator (the caller's MPI one)
  Topology topology_;
  bool hierarchical_ = false;
  std::vector<void*> work_;  // staging of the hierarchical all-to-all; the last is the largest
  size_t work_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     const CommOptions& options) {
  DLREC_CHECK(options.timeout_seconds > 0, "dist: the collective timeout must be > 0 seconds, got ",
              options.timeout_seconds);
  return std::make_unique<NcclCommunicator>(bootstrap, device, options);
}

#endif  // DLREC_WITH_NCCL

}  // namespace dlrec::dist
