// GPU resources with one owner each; see include/dlrec/core/gpu_resources.h.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <string>

#include "core/cuda_check.h"
#include "dlrec/core/device.h"
#include "dlrec/core/gpu_resources.h"

namespace dlrec {
namespace cuda_impl {
size_t pool_live_bytes(int device);  // device_cuda.cu
}  // namespace cuda_impl

namespace gpu {
namespace {

std::atomic<int64_t> g_streams{0}, g_events{0}, g_graphs{0}, g_blas{0}, g_lt{0};
std::atomic<int64_t> g_streams_created{0};

#define DLREC_BLAS_CHECK(expr)                                                                   \
  do {                                                                                           \
    cublasStatus_t _s = (expr);                                                                  \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                             \
      ::dlrec::fail("cuBLAS error ", static_cast<int>(_s), " in ", #expr, " at ", __FILE__, ":", \
                    __LINE__);                                                                   \
  } while (0)

// Makes `device` current for the scope.
struct OnDevice {
  int prev = 0;
  explicit OnDevice(int device) {
    DLREC_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) DLREC_CUDA_CHECK(cudaSetDevice(device));
  }
  ~OnDevice() { cudaSetDevice(prev); }
};

// A cuBLAS handle that destroys itself (counted).
struct OwnedBlas {
  cublasHandle_t h = nullptr;
  OwnedBlas() {
    DLREC_BLAS_CHECK(cublasCreate(&h));
    ++g_blas;
  }
  ~OwnedBlas() {
    if (h) {
      cublasDestroy(h);
      --g_blas;
    }
  }
  OwnedBlas(const OwnedBlas&) = delete;
  OwnedBlas& operator=(const OwnedBlas&) = delete;
};

struct OwnedLt {
  cublasLtHandle_t h = nullptr;
  OwnedLt() {
    DLREC_BLAS_CHECK(cublasLtCreate(&h));
    ++g_lt;
  }
  ~OwnedLt() {
    if (h) {
      cublasLtDestroy(h);
      --g_lt;
    }
  }
  OwnedLt(const OwnedLt&) = delete;
  OwnedLt& operator=(const OwnedLt&) = delete;
};

}  // namespace

LiveCounts live_counts() {
  LiveCounts c;
  c.streams = g_streams.load();
  c.events = g_events.load();
  c.graphs = g_graphs.load();
  c.blas = g_blas.load();
  c.blas_lt = g_lt.load();
  c.streams_created = g_streams_created.load();
  return c;
}

size_t pool_bytes_live(int device) {
  cuda::require_device(device);
  return cuda_impl::pool_live_bytes(device);
}

// ---- Stream, Event, GraphExec ----

Stream::Stream(int device, int priority) {
  cuda::require_device(device);
  OnDevice on(device);
  cudaStream_t s = nullptr;
  DLREC_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  s_ = s;
  ++g_streams;
  ++g_streams_created;
}

Stream::~Stream() {
  if (!s_) return;
  cudaStreamSynchronize(s_);  // nothing in flight reads buffers freed after this
  cudaStreamDestroy(s_);
  --g_streams;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream dying(std::move(*this));
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Event::Event(int device, bool timing) {
  cuda::require_device(device);
  OnDevice on(device);
  cudaEvent_t e = nullptr;
  DLREC_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  e_ = e;
  ++g_events;
}

Event::~Event() {
  if (!e_) return;
  cudaEventDestroy(e_);
  --g_events;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event dying(std::move(*this));
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

GraphExec::GraphExec(CUgraphExec_st* adopt) : g_(adopt) {
  if (g_) ++g_graphs;
}

void GraphExec::reset() {
  if (!g_) return;
  cudaGraphExecDestroy(g_);
  g_ = nullptr;
  --g_graphs;
}

GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  if (this != &o) {
    reset();
    g_ = o.g_;
    o.g_ = nullptr;
  }
  return *this;
}

// ---- DeviceResources ----

struct DeviceResources::Impl {
  struct BlasEntry {
    Tensor workspace;
    std::unique_ptr<OwnedBlas> handle;
    bool busy = false;
  };
  struct LtEntry {
    Tensor workspace;
    std::unique_ptr<OwnedLt> handle;
    bool busy = false;
  };
  std::vector<std::unique_ptr<BlasEntry>> blas;
  std::vector<std::unique_ptr<LtEntry>> lt;
};

namespace {
struct Registry {
  std::mutex mu;
  std::map<int, std::weak_ptr<DeviceResources>> devices;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: usable from other statics' destructors
  return *r;
}
}  // namespace

std::shared_ptr<DeviceResources> DeviceResources::get(int device) {
  cuda::require_device(device);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  std::shared_ptr<DeviceResources> res = r.devices[device].lock();
  if (!res) {
    res = std::shared_ptr<DeviceResources>(new DeviceResources(device));
    r.devices[device] = res;
  }
  return res;
}

DeviceResources::DeviceResources(int device) : device_(device), impl_(std::make_unique<Impl>()) {
  OnDevice on(device);
  DLREC_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  DLREC_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority_, &greatest_priority_));
}

DeviceResources::~DeviceResources() {
  // Leases hold this object alive, so every pooled handle is idle here. (No throwing device
  // guard in a destructor.)
  int prev = 0;
  const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  impl_.reset();
  if (switched) cudaSetDevice(prev);
}

BlasLease DeviceResources::blas(CUstream_st* stream, bool tf32) {
  OnDevice on(device_);
  std::unique_lock<std::mutex> g(mu_);
  int slot = -1;
  for (size_t i = 0; i < impl_->blas.size(); ++i)
    if (!impl_->blas[i]->busy) {
      slot = static_cast<int>(i);
      break;
    }
  if (slot < 0) {
    auto e = std::make_unique<Impl::BlasEntry>();
    e->workspace =
        Tensor::empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::U8, Device::cuda(device_));
    e->handle = std::make_unique<OwnedBlas>();
    impl_->blas.push_back(std::move(e));
    slot = static_cast<int>(impl_->blas.size() - 1);
  }
  Impl::BlasEntry& e = *impl_->blas[slot];
  // cublasSetStream resets the handle to cuBLAS' default workspace pool: the entry's own
  // workspace is set after it (a pool that allocates would break CUDA graph capture).
  DLREC_BLAS_CHECK(cublasSetStream(e.handle->h, stream));
  DLREC_BLAS_CHECK(cublasSetWorkspace(e.handle->h, e.workspace.raw(), kWorkspaceBytes));
  DLREC_BLAS_CHECK(
      cublasSetMathMode(e.handle->h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  e.busy = true;
  BlasLease lease;
  lease.owner_ = shared_from_this();
  lease.h_ = e.handle->h;
  lease.slot_ = slot;
  return lease;
}

LtLease DeviceResources::blas_lt() {
  OnDevice on(device_);
  std::unique_lock<std::mutex> g(mu_);
  int slot = -1;
  for (size_t i = 0; i < impl_->lt.size(); ++i)
    if (!impl_->lt[i]->busy) {
      slot = static_cast<int>(i);
      break;
    }
  if (slot < 0) {
    auto e = std::make_unique<Impl::LtEntry>();
    e->workspace =
        Tensor::empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::U8, Device::cuda(device_));
    e->handle = std::make_unique<OwnedLt>();
    impl_->lt.push_back(std::move(e));
    slot = static_cast<int>(impl_->lt.size() - 1);
  }
  Impl::LtEntry& e = *impl_->lt[slot];
  e.busy = true;
  LtLease lease;
  lease.owner_ = shared_from_this();
  lease.h_ = e.handle->h;
  lease.ws_ = e.workspace.raw();
  lease.ws_bytes_ = kWorkspaceBytes;
  lease.slot_ = slot;
  return lease;
}

void DeviceResources::give_back_blas(int slot) noexcept {
  std::lock_guard<std::mutex> g(mu_);
  Impl::BlasEntry& e = *impl_->blas[slot];
  // Unbound from the lessee's stream (which is about to go) and back to the default math.
  cublasSetStream(e.handle->h, nullptr);
  cublasSetMathMode(e.handle->h, CUBLAS_DEFAULT_MATH);
  e.busy = false;
}

void DeviceResources::give_back_lt(int slot) noexcept {
  std::lock_guard<std::mutex> g(mu_);
  impl_->lt[slot]->busy = false;
}

size_t DeviceResources::blas_pool_size() const {
  std::lock_guard<std::mutex> g(mu_);
  return impl_->blas.size();
}

size_t DeviceResources::lt_pool_size() const {
  std::lock_guard<std::mutex> g(mu_);
  return impl_->lt.size();
}

// ---- leases ----

void BlasLease::release() noexcept {
  if (owner_ && slot_ >= 0) owner_->give_back_blas(slot_);
  owner_.reset();
  h_ = nullptr;
  slot_ = -1;
}
BlasLease::~BlasLease() { release(); }
BlasLease::BlasLease(BlasLease&& o) noexcept
    : owner_(std::move(o.owner_)), h_(o.h_), slot_(o.slot_) {
  o.h_ = nullptr;
  o.slot_ = -1;
}
BlasLease& BlasLease::operator=(BlasLease&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::move(o.owner_);
    h_ = o.h_;
    slot_ = o.slot_;
    o.h_ = nullptr;
    o.slot_ = -1;
  }
  return *this;
}

void LtLease::release() noexcept {
  if (owner_ && slot_ >= 0) owner_->give_back_lt(slot_);
  owner_.reset();
  h_ = nullptr;
  ws_ = nullptr;
  ws_bytes_ = 0;
  slot_ = -1;
}
LtLease::~LtLease() { release(); }
LtLease::LtLease(LtLease&& o) noexcept
    : owner_(std::move(o.owner_)), h_(o.h_), ws_(o.ws_), ws_bytes_(o.ws_bytes_), slot_(o.slot_) {
  o.h_ = nullptr;
  o.ws_ = nullptr;
  o.ws_bytes_ = 0;
  o.slot_ = -1;
}
LtLease& LtLease::operator=(LtLease&& o) noexcept {
  if (this != &o) {
    release();
    owner_ = std::move(o.owner_);
    h_ = o.h_;
    ws_ = o.ws_;
    ws_bytes_ = o.ws_bytes_;
    slot_ = o.slot_;
    o.h_ = nullptr;
    o.ws_ = nullptr;
    o.ws_bytes_ = 0;
    o.slot_ = -1;
  }
  return *this;
}

}  // namespace gpu
}  // namespace dlrec
