// Shared by the arch "dlrm" CUDA tests (dlrm_cuda_test.cc, dlrm_cuda_predict_test.cc): the
// small DLRM they train and serve, its batches and the CUDA model built with engine options.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "dlrec/core/device.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/model.h"
#include "model/test_batches.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/graph_cuda.h"
#endif

namespace dlrec::model::dlrm_cuda_test {

using testing::make_layout;

// Labels positive with probability 0.3.
inline io::Batch make_batch(const io::ShardLayout& l, int64_t rows, uint64_t seed, bool multi_hot) {
  return testing::make_batch(l, rows, seed, multi_hot, 0.3);
}

#ifdef DLREC_WITH_CUDA
// arch "dlrm" on CUDA with non-default engine options: the preset's graph on the CUDA graph
// engine, as build_model() builds it (with the default options).
using DlrmCudaOptions = GraphCudaOptions;
inline std::unique_ptr<CudaModel> make_dlrm_cuda(const ModelConfig& mc, const OptimizerConfig& oc,
                                          const io::ShardLayout& layout, Device device,
                                          uint64_t seed, const std::string& precision = "fp32",
                                          const GraphCudaOptions& options = {}) {
  ModelConfig graph = mc;
  graph.arch = "graph";
  graph.layers = preset_graph_layers(mc, layout);
  return make_graph_cuda(graph, oc, layout, device, seed, precision, options);
}
#endif

inline int steps_or(int dflt) {
  const char* e = std::getenv("DLREC_PARITY_STEPS");
  return e ? std::max(1, std::atoi(e)) : dflt;
}

struct SmallDlrm {
  ModelConfig mc;
  OptimizerConfig oc;
  io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  bool multi_hot = true;
  int64_t batch = 64;
  SmallDlrm() {
    mc.embedding_dim = 8;
    mc.bottom_mlp = {16, 8};
    mc.top_mlp = {16, 1};
    oc.lr = 0.05;
  }
};

#ifdef DLREC_WITH_CUDA
// Options with the fused small-batch kernel off (the layer-by-layer graph) or on.
inline DlrmCudaOptions fused_rows(int64_t rows) {
  DlrmCudaOptions o;
  o.infer_fused_rows = rows;
  return o;
}
#endif

}  // namespace dlrec::model::dlrm_cuda_test
