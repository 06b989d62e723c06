// GPU resources with exactly one owner each: streams, events, executable CUDA graphs, cuBLAS
// and cuBLASLt handles with their workspaces.
//
// Why: a model's constructor may throw after it has created some of them (a configuration
// found invalid late, out of memory); with raw handles released in a destructor that never
// runs, each failed build leaked them, which a server that loads and unloads models pays for
// again and again. Every resource here is an RAII object (move-only, released by its
// destructor), so a model that holds them as members leaks nothing whichever statement throws.
//
// What is per device and shared: `DeviceResources` (one per device, created on first use by
// `DeviceResources::get`, thread-safe, alive while anyone holds it) keeps the device's
// properties and pools of cuBLAS and cuBLASLt handles, each with its own 32 MiB workspace.
// A model leases handles (`BlasLease`, `LtLease`) and gives them back when it is destroyed, so
// loading a model after another was unloaded reuses the handles and workspaces instead of
// creating new ones (cublasCreate costs milliseconds and device memory). A lease is used by one
// model at a time; handles are never shared by two live models (cuBLAS handles are not safe to
// use from two threads with different streams).
//
// What is per model: its streams and events (`Stream`, `Event`) and graphs (`GraphExec`).
//
// The types of the CUDA headers appear as their underlying struct pointers (cudaStream_t is
// CUstream_st*, and so on), so this header compiles in builds without CUDA too. There, every
// constructor that would create a resource throws the "built without CUDA" error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "dlrec/core/tensor.h"

struct CUstream_st;
struct CUevent_st;
struct CUgraphExec_st;
struct cublasContext;
struct cublasLtContext;

namespace dlrec::gpu {

// How many resources of each kind are alive in the process, and how many streams were ever
// created (tests: a failing model build must leave `alive` as it found it).
struct LiveCounts {
  int64_t streams = 0, events = 0, graphs = 0, blas = 0, blas_lt = 0;
  int64_t streams_created = 0;
};
LiveCounts live_counts();

// Bytes of the device's caching pool handed out and not yet freed (the pool's cached blocks
// not counted; cuda::pool_bytes_in_use counts both).
size_t pool_bytes_live(int device);

// A non-blocking stream (work on the legacy stream does not order against it: another model's
// copies cannot break this one's graph capture). The destructor waits for the stream's work
// before releasing it, so that buffers freed after it are no longer in use.
class Stream {
 public:
  Stream() = default;  // no stream
  // priority: as cudaDeviceGetStreamPriorityRange gives them (lower = more urgent); 0 = default.
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream_st* get() const { return s_; }
  operator CUstream_st*() const { return s_; }  // NOLINT: used where cudaStream_t is expected
  explicit operator bool() const { return s_ != nullptr; }

 private:
  CUstream_st* s_ = nullptr;
};

class Event {
 public:
  Event() = default;  // no event
  // timing = false: cudaEventDisableTiming (the cheap kind, for ordering only).
  explicit Event(int device, bool timing = false);
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent_st* get() const { return e_; }
  operator CUevent_st*() const { return e_; }  // NOLINT: used where cudaEvent_t is expected
  explicit operator bool() const { return e_ != nullptr; }

 private:
  CUevent_st* e_ = nullptr;
};

// An instantiated CUDA graph (adopted from cudaGraphInstantiate's result).
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(CUgraphExec_st* adopt);
  ~GraphExec() { reset(); }
  GraphExec(GraphExec&& o) noexcept : g_(o.g_) { o.g_ = nullptr; }
  GraphExec& operator=(GraphExec&& o) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  void reset();
  CUgraphExec_st* get() const { return g_; }
  explicit operator bool() const { return g_ != nullptr; }

 private:
  CUgraphExec_st* g_ = nullptr;
};

class DeviceResources;

// A cuBLAS handle and its workspace, leased from the device's pool: bound to the lessee's stream
// with its math mode; back to the pool (stream and math mode reset) when destroyed.
class BlasLease {
 public:
  BlasLease() = default;
  ~BlasLease();
  BlasLease(BlasLease&& o) noexcept;
  BlasLease& operator=(BlasLease&& o) noexcept;
  BlasLease(const BlasLease&) = delete;
  BlasLease& operator=(const BlasLease&) = delete;
  cublasContext* get() const { return h_; }
  operator cublasContext*() const { return h_; }  // NOLINT: used where cublasHandle_t is
  explicit operator bool() const { return h_ != nullptr; }

 private:
  friend class DeviceResources;
  void release() noexcept;
  std::shared_ptr<DeviceResources> owner_;
  cublasContext* h_ = nullptr;
  int slot_ = -1;
};

// A cuBLASLt handle and its workspace, leased likewise.
class LtLease {
 public:
  LtLease() = default;
  ~LtLease();
  LtLease(LtLease&& o) noexcept;
  LtLease& operator=(LtLease&& o) noexcept;
  LtLease(const LtLease&) = delete;
  LtLease& operator=(const LtLease&) = delete;
  cublasLtContext* handle() const { return h_; }
  void* workspace() const { return ws_; }
  size_t workspace_bytes() const { return ws_bytes_; }
  explicit operator bool() const { return h_ != nullptr; }

 private:
  friend class DeviceResources;
  void release() noexcept;
  std::shared_ptr<DeviceResources> owner_;
  cublasLtContext* h_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  int slot_ = -1;
};

class DeviceResources : public std::enable_shared_from_this<DeviceResources> {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // The device's resources: created on the first call (after cuda::require_device), shared by
  // every caller until the last holder lets go. Thread-safe.
  static std::shared_ptr<DeviceResources> get(int device);

  ~DeviceResources();
  DeviceResources(const DeviceResources&) = delete;
  DeviceResources& operator=(const DeviceResources&) = delete;

  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  // The greatest (most urgent) and least stream priorities of the device.
  int greatest_priority() const { return greatest_priority_; }
  int least_priority() const { return least_priority_; }

  // An idle pooled cuBLAS handle (or a new one), bound to `stream` with TF32 tensor-op math
  // when `tf32`, else the default math.
  BlasLease blas(CUstream_st* stream, bool tf32);
  // An idle pooled cuBLASLt handle (or a new one) with its workspace.
  LtLease blas_lt();

  // Pooled handles (leased + idle), for tests.
  size_t blas_pool_size() const;
  size_t lt_pool_size() const;

  struct Impl;  // the pools (CUDA types), in gpu_resources_cuda.cu

 private:
  friend class BlasLease;
  friend class LtLease;
  explicit DeviceResources(int device);
  void give_back_blas(int slot) noexcept;
  void give_back_lt(int slot) noexcept;

  int device_ = 0;
  int sm_count_ = 0;
  int greatest_priority_ = 0, least_priority_ = 0;
  mutable std::mutex mu_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::gpu
