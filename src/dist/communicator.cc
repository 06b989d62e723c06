// The parts of the communicator that every implementation shares: element types, the
// conveniences over the virtual collectives, the single-process communicator and the factory.
#include "dlrec/dist/communicator.h"

#include <cstring>

#include "dlrec/core/error.h"

namespace dlrec::dist {

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::U8:
      return 1;
    case Elem::I32:
      return 4;
    case Elem::I64:
      return 8;
    case Elem::F32:
      return 4;
    case Elem::F64:
      return 8;
    case Elem::BF16:
      return 2;
    case Elem::F16:
      return 2;
  }
  fail("dist: unknown element type ", static_cast<int>(e));
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::U8:
      return "u8";
    case Elem::I32:
      return "i32";
    case Elem::I64:
      return "i64";
    case Elem::F32:
      return "f32";
    case Elem::F64:
      return "f64";
    case Elem::BF16:
      return "bf16";
    case Elem::F16:
      return "f16";
  }
  return "?";
}

Elem elem_of(DType t) {
  switch (t) {
    case DType::F32:
      return Elem::F32;
    case DType::BF16:
      return Elem::BF16;
    case DType::F16:
      return Elem::F16;
    case DType::I32:
      return Elem::I32;
    case DType::I64:
      return Elem::I64;
    case DType::U8:
      return Elem::U8;
  }
  fail("dist: no element type for dtype ", static_cast<int>(t));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

namespace {
void check_tensor(const Communicator& c, const Tensor& t, const char* what) {
  DLREC_CHECK(t.device() == c.device(), "dist: ", what, " of a tensor on ", t.device().str(),
              " with the ", c.kind(), " communicator, whose buffers are on ", c.device().str());
}
}  // namespace

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(*this, t, "all_reduce");
  all_reduce(t.raw(), t.numel(), elem_of(t.dtype()), op);
}

void Communicator::broadcast(Tensor& t, int root) {
  check_tensor(*this, t, "broadcast");
  broadcast(t.raw(), t.numel(), elem_of(t.dtype()), root);
}

// Host values go through a device buffer on a GPU communicator.
namespace {
template <class T>
T reduce_value(Communicator& c, T v, ReduceOp op) {
  if (!c.device().is_cuda()) {
    c.all_reduce(&v, 1, elem_of_t<T>::value, op);
    return v;
  }
  Tensor buf = Tensor::empty({1}, DType::I64, c.device());
  copy_bytes(buf.raw(), c.device(), &v, Device::cpu(), sizeof(T));
  c.all_reduce(buf.raw(), 1, elem_of_t<T>::value, op);
  copy_bytes(&v, Device::cpu(), buf.raw(), c.device(), sizeof(T));
  return v;
}
}  // namespace

double Communicator::all_reduce_value(double v, ReduceOp op) { return reduce_value(*this, v, op); }
int64_t Communicator::all_reduce_value(int64_t v, ReduceOp op) {
  return reduce_value(*this, v, op);
}

std::vector<int64_t> Communicator::all_gather_counts(int64_t count) {
  std::vector<int64_t> out(size());
  if (!device().is_cuda()) {
    all_gather(&count, out.data(), 1, Elem::I64);
    return out;
  }
  Tensor send = Tensor::empty({1}, DType::I64, device());
  Tensor recv = Tensor::empty({size()}, DType::I64, device());
  copy_bytes(send.raw(), device(), &count, Device::cpu(), sizeof count);
  all_gather(send.raw(), recv.raw(), 1, Elem::I64);
  copy_bytes(out.data(), Device::cpu(), recv.raw(), device(), sizeof(int64_t) * out.size());
  return out;
}

void Communicator::all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts,
                                Elem type) {
  const int n = size();
  DLREC_CHECK(static_cast<int>(counts.size()) == n, "dist: all_gather_v needs ", n, " counts, got ",
              counts.size());
  std::vector<int64_t> send_counts(n, counts[rank()]), send_offsets(n, 0), recv_offsets(n, 0);
  for (int r = 1; r < n; ++r) recv_offsets[r] = recv_offsets[r - 1] + counts[r - 1];
  all_to_all_v(send, send_counts, send_offsets, recv, counts, recv_offsets, type);
}

namespace {

// One rank: reductions are the identity, gathers and all-to-alls are copies.
class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* kind() const override { return "single"; }
  Device device() const override { return Device::cpu(); }
  void all_reduce(void*, int64_t count, Elem, ReduceOp) override { check_count(count); }
  void broadcast(void*, int64_t count, Elem, int root) override {
    check_count(count);
    DLREC_CHECK(root == 0, "dist: broadcast from rank ", root, " in a job of 1 rank");
  }
  void all_gather(const void* send, void* recv, int64_t count, Elem type) override {
    check_count(count);
    if (send != recv) std::memmove(recv, send, count * elem_size(type));
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, Elem type, ReduceOp) override {
    check_count(count);
    if (send != recv) std::memmove(recv, send, count * elem_size(type));
  }
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& send_offsets, void* recv,
                    const std::vector<int64_t>& recv_counts,
                    const std::vector<int64_t>& recv_offsets, Elem type) override {
    DLREC_CHECK(send_counts.size() == 1 && send_offsets.size() == 1 && recv_counts.size() == 1 &&
                    recv_offsets.size() == 1,
                "dist: all_to_all_v in a job of 1 rank needs 1 count and offset each");
    DLREC_CHECK(send_counts[0] == recv_counts[0], "dist: all_to_all_v sends ", send_counts[0],
                " elements to itself but expects ", recv_counts[0]);
    check_count(send_counts[0]);
    DLREC_CHECK(send_offsets[0] >= 0 && recv_offsets[0] >= 0, "dist: negative offset");
    const size_t es = elem_size(type);
    std::memmove(static_cast<char*>(recv) + recv_offsets[0] * es,
                 static_cast<const char*>(send) + send_offsets[0] * es, send_counts[0] * es);
  }
  void barrier() override {}

 private:
  static void check_count(int64_t count) {
    DLREC_CHECK(count >= 0, "dist: negative element count ", count);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

std::unique_ptr<Communicator> make_communicator(const std::string& kind,
                                                const CommOptions& options) {
  DLREC_CHECK(options.timeout_seconds > 0, "dist: the collective timeout must be > 0 seconds, got ",
              options.timeout_seconds);
  if (kind == "single") return make_single_communicator();
  if (kind == "mpi") return make_mpi_communicator(options);
  if (kind == "auto")
    return started_by_mpi_launcher() ? make_mpi_communicator(options) : make_single_communicator();
  fail("dist: unknown communicator '", kind, "' (auto, single, mpi)");
}

}  // namespace dlrec::dist
