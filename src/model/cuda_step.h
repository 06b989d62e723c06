// Internal: what the CUDA graph engine (graph_cuda.cu, graph_cuda_infer.cu) uses: device
// guard, pinned memory, precision names, CUDA graph capture, batch checks, and the double-buffered step
// inputs: the host packs a batch into one of two pinned slots (dense f32, labels, int32
// offsets, ids as uint32 rows of the concatenation of all tables) and copies it on a copy
// stream into that slot's device tensors, so the copy of step i+1 overlaps step i.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/gpu_resources.h"
#include "dlrec/core/tensor.h"
#include "dlrec/io/batch.h"

#define DLREC_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                    \
    cublasStatus_t _s = (expr);                                                           \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                      \
      ::dlrec::fail("cuBLAS error ", static_cast<int>(_s), " in ", #expr, " at ", __FILE__, \
                    ":", __LINE__);                                                       \
  } while (0)

namespace dlrec::model::cuda_step {

struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int d);
  ~DeviceGuard();
};

struct PinnedDeleter {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using PinnedPtr = std::unique_ptr<void, PinnedDeleter>;
PinnedPtr pinned_alloc(size_t bytes);

enum class Precision { FP32, TF32, BF16, FP16 };
Precision parse_precision(const std::string& p);  // "fp32" | "tf32" | "bf16" | "fp16"

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Captures `body` on `stream` into an executable graph; empty (and a one-time warning naming
// `what`) when the capture or the instantiation fails, so that the caller runs eagerly.
gpu::GraphExec capture(cudaStream_t stream, const std::function<void()>& body, const char* what);
// The same as a raw handle that the caller must destroy (graph_cuda.cu; new code uses capture).
cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body,
                              const char* what);

// The batch fits a model of `num_dense` dense and `tables` categorical features (`what` names
// the model in the messages).
void check_batch(const io::Batch& b, int64_t num_dense, int64_t tables, const char* what);

// Ids [lo, hi) of rows [r0, ...) of a batch, counted across its tables (table t's ids of those
// rows start at start[t], T + 1 entries, non-decreasing), as uint32 rows of the concatenated
// tables: range-checked against `cardinalities` (an error naming the id and table) and offset by
// row_base[t] (none: 0). Equal shares of a step's ids go to the threads whatever the tables
// (MLPerf DCNv2's table 20 holds 100 of a row's 214 ids).
void pack_ids(const io::Batch& b, int64_t r0, const std::vector<int64_t>& start, int64_t lo,
              int64_t hi, const std::vector<int64_t>& cardinalities,
              const std::vector<uint32_t>* row_base, uint32_t* keys);

struct InputSlot {
  PinnedPtr mem;
  float* dense = nullptr;
  float* labels = nullptr;
  int32_t* offsets = nullptr;
  uint32_t* keys = nullptr;
  float* lr = nullptr;         // [2]: dense and embedding learning rate of the step
  Tensor d_dense, d_labels, d_offsets, d_keys, d_lr;
  gpu::Event ready;            // copy stream: inputs on the device
  gpu::Event free;             // model stream: last use of the device inputs
  bool pending = false;        // a copy from `mem` was enqueued
  // The CUDA graph of a training step on this slot's inputs, for (rows, nnz).
  gpu::GraphExec graph;
  int64_t graph_rows = -1, graph_nnz = -1;
  int eager_steps = 0;         // eager steps with the current shape (graph after one)
};

class StepInputs {
 public:
  explicit StepInputs(Device dev);
  ~StepInputs();
  StepInputs(const StepInputs&) = delete;
  StepInputs& operator=(const StepInputs&) = delete;

  InputSlot slots[2];

  // (Re)allocates both slots for `rows` rows and `ids` ids (callers synchronise first).
  void allocate(int64_t rows, int64_t ids, int64_t num_dense, int64_t tables);
  // Packs the batch into the next slot (ids range-checked; table t's ids offset by
  // row_base[t], or 0 without row_base) and copies it on `copy` once the slot's last step is
  // done; `compute` waits for the copy. Returns the slot index.
  int upload(const io::Batch& b, const std::vector<int64_t>& cardinalities,
             const std::vector<uint32_t>* row_base, float lr, float emb_lr, cudaStream_t copy,
             cudaStream_t compute, const char* what);
  void drop_graphs();  // destroys the slots' graphs (buffers moved, or the model closes)

 private:
  Device dev_;
  int next_ = 0;
};

// One training step on `sl`: replays the slot's graph for (rows, nnz), captured on the second
// step of that shape, or runs `body` eagerly (always when `graphs` is false; a failed capture
// clears it).
void run_step(InputSlot& sl, int64_t rows, int64_t nnz, bool& graphs, cudaStream_t stream,
              const std::function<void()>& body);

}  // namespace dlrec::model::cuda_step
