// Communicator: the collectives that training across processes and GPUs is built on
// (docs/DISTRIBUTED.md). Three implementations behind one interface:
//   - single process (size 1; every collective is a copy or nothing);
//   - MPI, on CPU buffers (Open MPI; the job is started by `mpirun` or `dlrec train --ranks N`);
//   - NCCL, on GPU buffers of one device per process (the unique id is broadcast over a
//     bootstrap communicator, normally the MPI one; collectives run on the communicator's own
//     stream, so a step's CUDA graph can capture them).
//
// Every rank must call the same collectives in the same order with matching sizes. A collective
// that waits longer than CommOptions::timeout_seconds throws a dlrec::Error naming the
// collective (its sequence number, op, type and size) and the ranks that had not arrived; the
// CLI then ends the whole job (abort_job), so a job never hangs.
//
// Counts and offsets are in elements of the given type; buffers live on device(). This
// interface is stable: new operations are added, existing signatures do not change.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/core/tensor.h"

namespace dlrec::dist {

// Element types of collective buffers (a superset of DType: F64 for exact sums of metrics).
enum class Elem { U8, I32, I64, F32, F64, BF16, F16 };
size_t elem_size(Elem e);
const char* elem_name(Elem e);
Elem elem_of(DType t);
template <class T>
struct elem_of_t;
template <>
struct elem_of_t<uint8_t> {
  static constexpr Elem value = Elem::U8;
};
template <>
struct elem_of_t<int32_t> {
  static constexpr Elem value = Elem::I32;
};
template <>
struct elem_of_t<int64_t> {
  static constexpr Elem value = Elem::I64;
};
template <>
struct elem_of_t<float> {
  static constexpr Elem value = Elem::F32;
};
template <>
struct elem_of_t<double> {
  static constexpr Elem value = Elem::F64;
};

enum class ReduceOp { Sum, Max, Min };
const char* reduce_op_name(ReduceOp op);

struct CommOptions {
  // A collective that waits longer than this (seconds) fails, naming the ranks missing.
  double timeout_seconds = 300;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single", "mpi" or "nccl".
  virtual const char* kind() const = 0;
  // Where the buffers of the collectives must be: the CPU (single, mpi) or the GPU (nccl).
  virtual Device device() const = 0;

  // In place: buf[count] becomes the reduction over the ranks.
  virtual void all_reduce(void* buf, int64_t count, Elem type, ReduceOp op = ReduceOp::Sum) = 0;
  // buf[count] of rank `root` is copied to every rank.
  virtual void broadcast(void* buf, int64_t count, Elem type, int root) = 0;
  // send[count] of every rank -> recv[size() * count], rank r's block at r * count.
  virtual void all_gather(const void* send, void* recv, int64_t count, Elem type) = 0;
  // send[size() * count] -> recv[count]: the reduction over the ranks of block rank().
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, Elem type,
                              ReduceOp op = ReduceOp::Sum) = 0;
  // send_counts[r] elements at send + send_offsets[r] go to rank r; recv_counts[r] elements from
  // rank r land at recv + recv_offsets[r]. Each vector has size() entries (host memory); every
  // rank's recv_counts[s] must equal rank s's send_counts[rank()].
  virtual void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& send_offsets, void* recv,
                            const std::vector<int64_t>& recv_counts,
                            const std::vector<int64_t>& recv_offsets, Elem type) = 0;
  // Returns when every rank has entered it.
  virtual void barrier() = 0;

  // The NCCL communicator's stream (a cudaStream_t); null for host communicators. Work
  // queued on it after a collective sees the collective's result.
  virtual void* stream() const { return nullptr; }
  // A second communicator over the same ranks and device with its own stream, so that two
  // chains of collectives (a step's dense all-reduces and its embedding exchange) progress
  // independently. A collective call (every rank calls it, in the same order as its other
  // collectives); null where the implementation has none (host communicators).
  virtual std::unique_ptr<Communicator> duplicate() { return nullptr; }

  // Conveniences over the above (the same on every implementation).
  template <class T>
  void all_reduce(T* buf, int64_t count, ReduceOp op = ReduceOp::Sum) {
    all_reduce(buf, count, elem_of_t<T>::value, op);
  }
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  void broadcast(Tensor& t, int root);
  double all_reduce_value(double v, ReduceOp op = ReduceOp::Sum);
  int64_t all_reduce_value(int64_t v, ReduceOp op = ReduceOp::Sum);
  // Every rank's `count` (host memory; on a GPU communicator too), in rank order.
  std::vector<int64_t> all_gather_counts(int64_t count);
  // Variable-size all-gather: recv gets every rank's send[counts[r]] one after the other in
  // rank order; counts as all_gather_counts returns them.
  void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, Elem type);
};

// A communicator of one rank.
std::unique_ptr<Communicator> make_single_communicator();

// MPI: whether this build has it, and whether this process was started by an MPI launcher
// (mpirun sets its variables in every rank's environment; that is how a rank learns it is one).
bool mpi_built();
bool started_by_mpi_launcher();
// Initialises MPI (once per process) and returns a communicator over all its ranks. Throws
// naming the reason in a build without MPI.
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options = {});
// The rank on this node (for choosing a GPU) of an MPI job: from the launcher, 0 otherwise.
int mpi_local_rank();

// NCCL over the GPU `device` of this process: rank 0 creates the unique id and `bootstrap`
// (e.g. the MPI communicator) broadcasts it; the ranks and size are bootstrap's. Throws naming
// the reason in a build without NCCL or without that GPU.
bool nccl_built();
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     const CommOptions& options = {});

// "auto" (MPI when started by an MPI launcher, single otherwise), "single" or "mpi".
std::unique_ptr<Communicator> make_communicator(const std::string& kind,
                                                const CommOptions& options = {});

// Ends every process of the job after a fatal error on this rank (MPI_Abort under MPI): the
// other ranks may be waiting in a collective for this one. Prints `message` first (stderr),
// prefixed with the rank. Returns only when no MPI job is running (single process).
void abort_job(const std::string& message, int exit_code = 1);

// The MPI launcher this build found (mpiexec/mpirun; CMake's MPIEXEC_EXECUTABLE), or "".
std::string mpi_launcher();
// Starts `argv` (argv[0]: the program) as a job of `ranks` processes on this node through the
// MPI launcher and waits for it; returns the job's exit status. Any rank failing ends the
// job; the launcher prints which rank failed and how. Throws when there is no launcher.
int launch_local_job(int ranks, const std::vector<std::string>& argv);

// Finalises MPI when this process initialised it (call before a clean exit); no-op otherwise.
void finalize();

}  // namespace dlrec::dist
