// CPU side of the device layer. CUDA builds add device_cuda.cu; CPU-only builds use the stubs
// below, which fail clearly when a CUDA device is requested.
#include <cstdlib>
#include <cstring>
#include <new>

#include "dlrec/core/device.h"
#include "dlrec/core/error.h"
#include "dlrec/core/tensor.h"

namespace dlrec {

#ifdef DLREC_WITH_CUDA
namespace cuda_impl {
std::shared_ptr<void> allocate(int device, size_t bytes);
void copy(void* dst, bool dst_cuda, const void* src, bool src_cuda, size_t bytes);
void memset0(void* p, size_t bytes);
}  // namespace cuda_impl
#endif

std::shared_ptr<void> allocate(Device device, size_t bytes) {
  if (device.is_cuda()) {
#ifdef DLREC_WITH_CUDA
    return cuda_impl::allocate(device.index, bytes);
#else
    cuda::require_device(device.index);
#endif
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (!dst_dev.is_cuda() && !src_dev.is_cuda()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef DLREC_WITH_CUDA
  cuda_impl::copy(dst, dst_dev.is_cuda(), src, src_dev.is_cuda(), bytes);
#else
  cuda::require_device(0);
#endif
}

void Tensor::zero_() {
  if (!defined()) return;
  if (device_.is_cuda()) {
#ifdef DLREC_WITH_CUDA
    cuda_impl::memset0(raw(), nbytes());
    return;
#endif
  }
  std::memset(raw(), 0, nbytes());
}

#ifndef DLREC_WITH_CUDA
namespace cuda {
bool built_with_cuda() { return false; }
int device_count() { return 0; }
void require_device(int) {
  fail("this dlrec was built without CUDA; rebuild with nvcc present (DLREC_CUDA=ON) to use a GPU");
}
std::string device_name(int) { return "none"; }
void synchronize(int) {}
size_t pool_bytes_in_use(int) { return 0; }
size_t pool_peak_bytes(int) { return 0; }
}  // namespace cuda
#endif

}  // namespace dlrec
