// CUDA side of the device layer: device queries, copies and a caching allocator.
//
// The pool keeps freed blocks in per-size free lists (sizes rounded up to 512 bytes below 1 MiB
// and to 2 MiB above), so steady-state training allocates nothing from the driver. Blocks are
// returned to the driver only when an allocation fails, after which it is retried once.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/device.h"

namespace dlrec {

namespace {
struct DevicePool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // size -> pointer
  size_t in_use = 0, cached = 0, peak = 0;

  static size_t round(size_t b) {
    const size_t small = 512, large = 2u << 20;
    return b < (1u << 20) ? (b + small - 1) / small * small : (b + large - 1) / large * large;
  }
  void release_cached() {
    for (auto& kv : free_blocks) cudaFree(kv.second);
    free_blocks.clear();
    cached = 0;
  }
};

DevicePool& pool(int device) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DevicePool>> pools;
  std::lock_guard<std::mutex> g(mu);
  if (pools.size() <= static_cast<size_t>(device)) pools.resize(device + 1);
  if (!pools[device]) pools[device] = std::make_unique<DevicePool>();
  return *pools[device];
}
}  // namespace

namespace cuda_impl {

std::shared_ptr<void> allocate(int device, size_t bytes) {
  cuda::require_device(device);
  DevicePool& p = pool(device);
  size_t size = DevicePool::round(bytes ? bytes : 1);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> g(p.mu);
    auto it = p.free_blocks.lower_bound(size);
    if (it != p.free_blocks.end() && it->first < size * 2) {
      size = it->first;
      ptr = it->second;
      p.free_blocks.erase(it);
      p.cached -= size;
    }
  }
  if (!ptr) {
    int prev;
    DLREC_CUDA_CHECK(cudaGetDevice(&prev));
    DLREC_CUDA_CHECK(cudaSetDevice(device));
    cudaError_t e = cudaMalloc(&ptr, size);
    if (e != cudaSuccess) {
      cudaGetLastError();
      {
        std::lock_guard<std::mutex> g(p.mu);
        p.release_cached();
      }
      e = cudaMalloc(&ptr, size);
    }
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("out of GPU memory on cuda:", device, ": requested ", bytes, " bytes, ", free_b,
           " of ", total_b, " free");
    }
  }
  {
    std::lock_guard<std::mutex> g(p.mu);
    p.in_use += size;
    p.peak = std::max(p.peak, p.in_use + p.cached);
  }
  return std::shared_ptr<void>(ptr, [device, size](void* q) {
    DevicePool& p = pool(device);
    std::lock_guard<std::mutex> g(p.mu);
    p.in_use -= size;
    p.cached += size;
    p.free_blocks.emplace(size, q);
  });
}

// Both are complete when they return. cudaMemcpy from pageable host memory returns once the
// bytes are staged, device to device it returns at once, and cudaMemset is asynchronous: the
// work sits on the default stream, which the engines' non-blocking streams do not wait for, so
// a kernel launched next on such a stream could read the buffer before it is written (most
// likely what faulted with an illegal address in session 29: a distillation teacher's serving
// bucket, its offsets copied while the student's step kept the GPU busy).
void copy(void* dst, bool dst_cuda, const void* src, bool src_cuda, size_t bytes) {
  cudaMemcpyKind kind = dst_cuda ? (src_cuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                 : cudaMemcpyDeviceToHost;
  DLREC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, 0));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(0));
}

void memset0(void* p, size_t bytes) {
  DLREC_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(0));
}

void count_outside_pool(int device, size_t bytes, bool allocated) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> g(p.mu);
  if (allocated) {
    p.in_use += bytes;
    p.peak = std::max(p.peak, p.in_use + p.cached);
  } else {
    p.in_use -= std::min(p.in_use, bytes);
  }
}

size_t pool_live_bytes(int device) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> g(p.mu);
  return p.in_use;
}

}  // namespace cuda_impl

namespace cuda {

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void require_device(int index) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("no usable CUDA device: ", cudaGetErrorString(e));
  }
  if (index < 0 || index >= n) fail("CUDA device ", index, " requested but ", n, " present");
}

std::string device_name(int index) {
  require_device(index);
  cudaDeviceProp prop;
  DLREC_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

void synchronize(int index) {
  int prev;
  DLREC_CUDA_CHECK(cudaGetDevice(&prev));
  DLREC_CUDA_CHECK(cudaSetDevice(index));
  DLREC_CUDA_CHECK(cudaDeviceSynchronize());
  DLREC_CUDA_CHECK(cudaSetDevice(prev));
}

size_t pool_bytes_in_use(int index) {
  DevicePool& p = pool(index);
  std::lock_guard<std::mutex> g(p.mu);
  return p.in_use + p.cached;
}

size_t pool_peak_bytes(int index) {
  DevicePool& p = pool(index);
  std::lock_guard<std::mutex> g(p.mu);
  return p.peak;
}

}  // namespace cuda
}  // namespace dlrec
