// Devices, the allocator behind every buffer, and the CUDA run-time queries.
//
// Every op has a CPU implementation (always built, the reference) and, in CUDA builds, a CUDA
// one; callers select by the tensor's device. In a build without CUDA, asking for a CUDA
// device throws a clear dlrec::Error.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace dlrec {

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
  // Parses "cpu", "cuda", "cuda:1", "gpu" (= cuda:0).
  static Device parse(const std::string& s);
};

// Allocates `bytes` on `device`; the returned pointer frees itself. CPU memory is 64-byte
// aligned; CUDA memory comes from a per-device caching pool (never managed memory).
std::shared_ptr<void> allocate(Device device, size_t bytes);

// Copies bytes between any two devices; the copy is complete when this returns. It is not
// ordered after work queued on a model's streams: synchronize those first.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

namespace cuda {
bool built_with_cuda();
int device_count();       // 0 when built without CUDA or no GPU/driver is present
void require_device(int index);  // throws with the reason when the device cannot be used
std::string device_name(int index);
void synchronize(int index);
// Bytes currently held by the caching pool of a device (in use + cached), and the peak.
size_t pool_bytes_in_use(int index);
size_t pool_peak_bytes(int index);
}  // namespace cuda

}  // namespace dlrec
