// GPU resources in a build without CUDA: nothing can be created, and every attempt says why
// (cuda::require_device's "built without CUDA" error). CUDA builds use gpu_resources_cuda.cu.
#ifndef DLREC_WITH_CUDA

#include "dlrec/core/gpu_resources.h"

#include "dlrec/core/device.h"
#include "dlrec/core/error.h"

namespace dlrec::gpu {

LiveCounts live_counts() { return {}; }

size_t pool_bytes_live(int device) {
  cuda::require_device(device);
  return 0;
}

Stream::Stream(int device, int) { cuda::require_device(device); }
Stream::~Stream() = default;
Stream& Stream::operator=(Stream&& o) noexcept {
  s_ = o.s_;
  o.s_ = nullptr;
  return *this;
}

Event::Event(int device, bool) { cuda::require_device(device); }
Event::~Event() = default;
Event& Event::operator=(Event&& o) noexcept {
  e_ = o.e_;
  o.e_ = nullptr;
  return *this;
}

GraphExec::GraphExec(CUgraphExec_st* adopt) : g_(adopt) {
  DLREC_CHECK(adopt == nullptr, "GraphExec: this dlrec was built without CUDA");
}
void GraphExec::reset() { g_ = nullptr; }
GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  g_ = o.g_;
  o.g_ = nullptr;
  return *this;
}

struct DeviceResources::Impl {};

std::shared_ptr<DeviceResources> DeviceResources::get(int device) {
  cuda::require_device(device);  // throws: no device in this build
  return nullptr;
}
DeviceResources::DeviceResources(int device) : device_(device) {}
DeviceResources::~DeviceResources() = default;
BlasLease DeviceResources::blas(CUstream_st*, bool) {
  cuda::require_device(device_);
  return {};
}
LtLease DeviceResources::blas_lt() {
  cuda::require_device(device_);
  return {};
}
void DeviceResources::give_back_blas(int) noexcept {}
void DeviceResources::give_back_lt(int) noexcept {}
size_t DeviceResources::blas_pool_size() const { return 0; }
size_t DeviceResources::lt_pool_size() const { return 0; }

void BlasLease::release() noexcept {}
BlasLease::~BlasLease() = default;
BlasLease::BlasLease(BlasLease&&) noexcept {}
BlasLease& BlasLease::operator=(BlasLease&&) noexcept { return *this; }
void LtLease::release() noexcept {}
LtLease::~LtLease() = default;
LtLease::LtLease(LtLease&&) noexcept {}
LtLease& LtLease::operator=(LtLease&&) noexcept { return *this; }

}  // namespace dlrec::gpu

#endif  // !DLREC_WITH_CUDA
