// The graph model (model.arch = "graph", docs/MODELS.md) on a CUDA device: the same layers,
// parameter names, shapes and initial values (from the same seed) as the CPU graph model
// (src/model/graph_model.cc), trained with CUDA kernels, cuBLAS and cuBLASLt. Built only when
// CUDA is (DLREC_WITH_CUDA); build_model() dispatches here for arch "graph" on Device::cuda(i).
//
// Supported: every layer type, as each type's LayerType::cuda_unsupported says (e.g. one
// embedding layer over all categorical features, one dim for all tables); optimizers sgd (no
// momentum) and adagrad, no weight decay or clipping (graph_cuda_unsupported in graph.h).
// Anything else is a clear error naming the layer or the key, before anything is built.
// Precision: "fp32" (no TF32: the parity reference), "tf32", "bf16" (bf16
// activations and compute copies of the weights, f32 master weights, f32 tables), "fp16" (the
// same in fp16 with dynamic loss scaling: optimizer.loss_scale_init and
// loss_scale_growth_interval; not with hashed tables). predict() replays one CUDA graph per
// power-of-two bucket of rows (src/model/graph_cuda_infer.cu).
#pragma once

#include <memory>
#include <string>

#include "dlrec/model/cuda_model.h"

namespace dlrec::model {

// Alternative paths of the engine that give the same results as the defaults (bit for bit in
// fp32; the fused cross kernels differ only in the bias gradient's summation order) and were
// slower on an H100 (bench/RESULTS.md). Not configuration: build_model always takes the
// defaults; tests build with them off to check the paths against each other, and the engine
// itself takes the unfused and per-layer paths where the fast ones do not apply (no CUTLASS,
// not sm_90, widths not multiples of 8, more than 8 cross layers, DLREC_PROFILE=1).
struct GraphCudaOptions {
  bool cuda_graphs = true;  // the step and predict() as CUDA graph replays (off: eager launches)
  bool weight_stream = true;     // weight gradients and updates on a low-priority stream
  bool cross_defer_dx0 = true;   // the cross layer's dL/dx0 sum formed once, at layer 0
  bool cross_fused = true;       // bf16 cross: GEMM + combine as one CUTLASS kernel
  bool cross_fused_bwd = true;   // bf16 cross: data GEMM + next element-wise pass as one kernel
  bool embedding_direct = true;  // an embedding layer read only by a concat writes into it
  // cuBLASLt times its candidate algorithms on first use and keeps the fastest (off: the
  // heuristic's first choice, the same algorithm in every model, which bit-identity tests need).
  bool lt_tune = true;
  // predict(): threads packing chunks of more than 16384 ids; 0: min(8, cores / 2); 1: the
  // calling thread alone. At most 256. The team is per process (shared with every model): the
  // first model that packs on it sets its size.
  int infer_pack_threads = 0;
  // predict(): rows per graph launch; bigger batches go in chunks of this many rows through two
  // alternating buckets, the host packing one while the GPU runs the other. A power of two in
  // [256, 65536].
  int64_t infer_chunk = 8192;
  // predict() in bf16/fp16 of 1..infer_fused_rows rows runs the whole forward as one kernel
  // (src/model/infer_small_cuda.h): a DLRM-shaped graph (dense -> MLP, embedding, dot over
  // both, MLP -> output), or any graph of the parts the program form takes (DCNv2, DeepFM,
  // Wide&Deep; fewer rows where its measured limit says so); 0: never. At most 64 (kernel
  // limit); from 16 rows on the DLRM kernel is no faster than the layer-by-layer path
  // (bench/RESULTS.md), hence 8.
  int64_t infer_fused_rows = 8;
  // That kernel's grid; 0: the device's SM count (also the most it takes). At most 65536.
  int infer_fused_blocks = 0;
};

std::unique_ptr<CudaModel> make_graph_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                           const io::ShardLayout& layout, Device device,
                                           uint64_t seed, const std::string& precision = "fp32",
                                           const GraphCudaOptions& options = {});

}  // namespace dlrec::model
