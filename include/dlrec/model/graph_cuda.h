// The graph model (model.arch = "graph", docs/MODELS.md) on a CUDA device: the same layers,
// parameter names, shapes and initial values (from the same seed) as the CPU graph model
// (src/model/graph_model.cc), trained with CUDA kernels, cuBLAS and cuBLASLt. Built only when
// CUDA is (DLREC_WITH_CUDA); build_model() dispatches here for arch "graph" on Device::cuda(i).
//
// Supported: layers dense, embedding (one layer over all categorical features, one dim for all
// tables), mlp, concat, dot, cross (full and low rank), add, output; optimizers sgd (no
// momentum) and adagrad, no weight decay or clipping. Anything else is a clear error naming the
// layer or the key. Precision as for the CUDA DLRM: "fp32" (no TF32: the parity reference),
// "tf32", "bf16" (bf16 activations and compute copies of the weights, f32 master weights,
// f32 tables).
#pragma once

#include <memory>
#include <string>

#include "dlrec/model/dlrm_cuda.h"

namespace dlrec::model {

std::unique_ptr<CudaModel> make_graph_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                           const io::ShardLayout& layout, Device device,
                                           uint64_t seed, const std::string& precision = "fp32");

}  // namespace dlrec::model
