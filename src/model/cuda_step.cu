// Shared pieces of the CUDA models; see cuda_step.h.
#include "model/cuda_step.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "dlrec/core/thread_pool.h"

namespace dlrec::model::cuda_step {

DeviceGuard::DeviceGuard(int d) {
  DLREC_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != d) DLREC_CUDA_CHECK(cudaSetDevice(d));
}
DeviceGuard::~DeviceGuard() { cudaSetDevice(prev); }

PinnedPtr pinned_alloc(size_t bytes) {
  void* p = nullptr;
  DLREC_CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
  return PinnedPtr(p);
}

Precision parse_precision(const std::string& p) {
  if (p == "fp32") return Precision::FP32;
  if (p == "tf32") return Precision::TF32;
  if (p == "bf16") return Precision::BF16;
  if (p == "fp16") return Precision::FP16;
  fail("unknown precision '", p, "' (expected fp32, tf32, bf16 or fp16)");
}

cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body,
                              const char* what) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  std::string why;
  if (ok) {
    try {
      body();
    } catch (const std::exception& e) {
      ok = false;
      why = e.what();
    }
    const cudaError_t e = cudaStreamEndCapture(stream, &graph);
    if (e != cudaSuccess && why.empty()) why = cudaGetErrorString(e);
    ok = ok && e == cudaSuccess && graph;
    if (ok) {
      const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
      if (ie != cudaSuccess) {
        ok = false;
        why = cudaGetErrorString(ie);
        exec = nullptr;
      }
    }
    if (graph) cudaGraphDestroy(graph);
  }
  if (!ok) {
    cudaGetLastError();  // clear the error of the failed capture
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr, "dlrec: warning: CUDA graph capture of the %s failed (%s); running "
                   "it eagerly\n", what, why.c_str());
  }
  return exec;
}

gpu::GraphExec capture(cudaStream_t stream, const std::function<void()>& body, const char* what) {
  return gpu::GraphExec(capture_graph(stream, body, what));
}

void check_batch(const io::Batch& b, int64_t num_dense, int64_t tables, const char* what) {
  DLREC_CHECK(b.rows >= 0, what, ": negative batch size");
  DLREC_CHECK(b.num_dense == num_dense, what, ": the batch has ", b.num_dense,
              " dense features, the model was built for ", num_dense);
  DLREC_CHECK(b.num_cat() == tables && static_cast<int64_t>(b.cat_indices.size()) == tables,
              what, ": the batch has ", b.num_cat(),
              " categorical features, the model was built for ", tables);
  DLREC_CHECK(static_cast<int64_t>(b.dense.size()) == b.rows * b.num_dense, what,
              ": the batch has ", b.dense.size(), " dense values for ", b.rows, " rows x ",
              b.num_dense, " features");
  DLREC_CHECK(static_cast<int64_t>(b.labels.size()) >= b.rows || b.labels.empty(), what,
              ": the batch has ", b.labels.size(), " labels for ", b.rows, " rows");
  for (int64_t t = 0; t < tables; ++t) {
    const auto& off = b.cat_offsets[t];
    DLREC_CHECK(static_cast<int64_t>(off.size()) == b.rows + 1, what, ": categorical feature ",
                t, " has ", off.size(), " offsets for ", b.rows, " rows");
    DLREC_CHECK(off.front() >= 0 && off.back() <= static_cast<int64_t>(b.cat_indices[t].size()),
                what, ": categorical feature ", t, ": offsets do not fit its ",
                b.cat_indices[t].size(), " ids");
  }
}

StepInputs::StepInputs(Device dev) : dev_(dev) {
  // The slots' events and tensors own themselves: a throw half-way releases what exists.
  for (auto& sl : slots) {
    sl.ready = gpu::Event(dev_.index);
    sl.free = gpu::Event(dev_.index);
    sl.d_lr = Tensor::empty({2}, DType::F32, dev_);
  }
}

StepInputs::~StepInputs() {
  drop_graphs();
  for (auto& sl : slots)
    if (sl.pending) cudaEventSynchronize(sl.ready);  // the copy has left the pinned buffer
}

void StepInputs::drop_graphs() {
  for (auto& sl : slots) {
    sl.graph.reset();
    sl.graph_rows = sl.graph_nnz = -1;
    sl.eager_steps = 0;
  }
}

void StepInputs::allocate(int64_t rows, int64_t ids, int64_t num_dense, int64_t tables) {
  const int64_t cb = std::max<int64_t>(rows, 1), nn = std::max<int64_t>(ids, 1);
  const size_t host_bytes = sizeof(float) * cb * (num_dense + 1) +
                            sizeof(int32_t) * (cb * tables + 1) + sizeof(uint32_t) * nn + 512;
  for (auto& sl : slots) {
    sl.pending = false;
    sl.mem = pinned_alloc(host_bytes);
    char* p = static_cast<char*>(sl.mem.get());
    sl.lr = reinterpret_cast<float*>(p);
    p += 256;
    sl.dense = reinterpret_cast<float*>(p);
    p += sizeof(float) * cb * num_dense;
    sl.labels = reinterpret_cast<float*>(p);
    p += sizeof(float) * cb;
    sl.offsets = reinterpret_cast<int32_t*>(p);
    p += sizeof(int32_t) * (cb * tables + 1);
    sl.keys = reinterpret_cast<uint32_t*>(p);
    sl.d_dense = Tensor::empty({cb, std::max<int64_t>(num_dense, 1)}, DType::F32, dev_);
    sl.d_labels = Tensor::empty({cb}, DType::F32, dev_);
    sl.d_offsets = Tensor::empty({cb * tables + 1}, DType::I32, dev_);
    sl.d_keys = Tensor::empty({nn}, DType::I32, dev_);
  }
}

void pack_ids(const io::Batch& b, int64_t r0, const std::vector<int64_t>& start, int64_t lo,
              int64_t hi, const std::vector<int64_t>& cardinalities,
              const std::vector<uint32_t>* row_base, uint32_t* keys) {
  if (lo >= hi) return;
  int64_t t = std::upper_bound(start.begin(), start.end(), lo) - start.begin() - 1;
  for (int64_t p = lo; p < hi;) {
    while (start[t + 1] <= p) ++t;  // past tables without ids here
    const int64_t m = std::min(hi, start[t + 1]) - p;
    const int64_t* ids = b.cat_indices[t].data() + b.cat_offsets[t][r0] + (p - start[t]);
    const uint64_t rows = static_cast<uint64_t>(cardinalities[t]);
    const uint32_t base = row_base ? (*row_base)[t] : 0;
    uint32_t* k = keys + p;
    // 0 <= id < rows <=> the sign bits of id and of ~(id - rows) are clear (adds, nots and ors:
    // the loop vectorises).
    uint64_t sign = 0;
    for (int64_t i = 0; i < m; ++i) {
      const uint64_t id = static_cast<uint64_t>(ids[i]);
      sign |= id | ~(id - rows);
      k[i] = base + static_cast<uint32_t>(id);
    }
    if (sign >> 63)
      for (int64_t i = 0; i < m; ++i)
        if (ids[i] < 0 || ids[i] >= static_cast<int64_t>(rows))
          fail("EmbeddingBag: id ", ids[i], " of table ", t, " is out of range [0, ", rows, ")");
    p += m;
  }
}

int StepInputs::upload(const io::Batch& b, const std::vector<int64_t>& cardinalities,
                       const std::vector<uint32_t>* row_base, float lr, float emb_lr,
                       cudaStream_t copy, cudaStream_t compute, const char* what) {
  const int64_t B = b.rows, T = static_cast<int64_t>(cardinalities.size());
  const int64_t nd = b.num_dense;
  const int idx = next_;
  InputSlot& s = slots[idx];
  next_ ^= 1;
  // The slot's previous copy must have left the pinned buffer before we overwrite it.
  if (s.pending) DLREC_CUDA_CHECK(cudaEventSynchronize(s.ready));
  s.lr[0] = lr;
  s.lr[1] = emb_lr;
  if (B * nd > 0) std::memcpy(s.dense, b.dense.data(), sizeof(float) * B * nd);
  if (b.labels.empty()) std::memset(s.labels, 0, sizeof(float) * B);
  else std::memcpy(s.labels, b.labels.data(), sizeof(float) * B);
  // The offsets a table per task, the ids (range-checked) in equal shares (pack_ids).
  std::vector<int64_t> start(T + 1, 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t m = b.cat_offsets[t][B] - b.cat_offsets[t][0];
    DLREC_CHECK(m >= 0, what, ": categorical feature ", t, ": offsets decrease");
    start[t + 1] = start[t] + m;
  }
  parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const auto& off = b.cat_offsets[t];
      const int32_t pos = static_cast<int32_t>(start[t]);
      int32_t* o = s.offsets + t * B;
      for (int64_t r = 0; r < B; ++r) {
        DLREC_CHECK(off[r] <= off[r + 1], what, ": categorical feature ", t,
                    ": offsets decrease at row ", r);
        o[r] = pos + static_cast<int32_t>(off[r] - off[0]);
      }
    }
  });
  parallel_for(0, start[T], 1 << 15, [&](int64_t lo, int64_t hi) {
    pack_ids(b, 0, start, lo, hi, cardinalities, row_base, s.keys);
  });
  s.offsets[T * B] = static_cast<int32_t>(start[T]);
  // The copy stream writes the slot's device inputs once the step that last read them is done.
  if (copy != compute) DLREC_CUDA_CHECK(cudaStreamWaitEvent(copy, s.free, 0));
  auto h2d = [&](void* dst, const void* src, size_t bytes) {
    if (bytes) DLREC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy));
  };
  h2d(s.d_lr.raw(), s.lr, sizeof(float) * 2);
  h2d(s.d_dense.raw(), s.dense, sizeof(float) * B * nd);
  h2d(s.d_labels.raw(), s.labels, sizeof(float) * B);
  h2d(s.d_offsets.raw(), s.offsets, sizeof(int32_t) * (T * B + 1));
  h2d(s.d_keys.raw(), s.keys, sizeof(uint32_t) * start[T]);
  DLREC_CUDA_CHECK(cudaEventRecord(s.ready, copy));
  if (copy != compute) DLREC_CUDA_CHECK(cudaStreamWaitEvent(compute, s.ready, 0));
  s.pending = true;
  return idx;
}

void run_step(InputSlot& sl, int64_t rows, int64_t nnz, bool& graphs, cudaStream_t stream,
              const std::function<void()>& body) {
  if (graphs && rows > 0) {
    if (sl.graph && (sl.graph_rows != rows || sl.graph_nnz != nnz)) {
      sl.graph.reset();
      sl.eager_steps = 0;
    }
    if (!sl.graph && sl.eager_steps >= 1) {
      // Capture once the shape has run eagerly (cuBLAS/cuBLASLt plans and CUB sizes are set).
      sl.graph = capture(stream, body, "training step");
      if (sl.graph) {
        sl.graph_rows = rows;
        sl.graph_nnz = nnz;
      } else {
        graphs = false;  // run eagerly from now on
      }
    }
  }
  if (graphs && sl.graph) {
    DLREC_CUDA_CHECK(cudaGraphLaunch(sl.graph.get(), stream));
    return;
  }
  body();
  if (sl.graph_rows != rows || sl.graph_nnz != nnz) {
    sl.graph_rows = rows;
    sl.graph_nnz = nnz;
    sl.eager_steps = 0;
  }
  ++sl.eager_steps;
}

}  // namespace dlrec::model::cuda_step
