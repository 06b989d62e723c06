#include "dlrec/model/model.h"

#include "dlrec/model/graph.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/dlrm_cuda.h"
#include "dlrec/model/graph_cuda.h"
#endif
#include "dlrec/nn/loss.h"

namespace dlrec::model {

double Model::train_step(const io::Batch& batch, double lr_scale, bool /*want_loss*/) {
  // The loss is the CPU reference's BCE; for a model on a GPU the logits come over and
  // dL/dlogits goes back (a few KB per step).
  Tensor logits = forward(batch, true).to(Device::cpu());
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows, "train_step: the batch has ",
              batch.labels.size(), " labels for ", batch.rows, " rows");
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const double loss = nn::bce_with_logits(logits.data<float>(), batch.labels.data(), batch.rows,
                                          dlogits.data<float>());
  if (device().is_cuda()) dlogits = dlogits.to(device());
  backward_and_update(dlogits, lr_scale);
  return loss;
}

// Every model is a graph of registry layers run by the graph engine; arch "dlrm" is a preset
// (presets.cc). On CUDA, arch "dlrm" is still built by the CUDA DLRM (dlrm_cuda.cu), which has
// what the CUDA graph engine lacks so far: fp16 with loss scaling, the bucketed inference
// graphs and the fused small-batch forward.
std::unique_ptr<Model> build_model(const ModelConfig& model, const OptimizerConfig& opt,
                                   const io::ShardLayout& layout, Device device, uint64_t seed,
                                   const std::string& precision) {
  DLREC_CHECK(precision == "fp32" || device.is_cuda(), "precision '", precision,
              "' needs a CUDA device; the CPU computes in fp32");
  if (model.arch != "dlrm" && model.arch != "graph")
    fail("unknown model arch '", model.arch, "' (this build knows: dlrm, graph)");
  if (device.is_cuda()) {
#ifdef DLREC_WITH_CUDA
    if (model.arch == "dlrm") return make_dlrm_cuda(model, opt, layout, device, seed, precision);
    return make_graph_cuda(model, opt, layout, device, seed, precision);
#else
    if (model.arch == "graph") return build_graph_model(model, opt, layout, device, seed);
    fail("cannot build the DLRM on ", device.str(),
         ": this build of dlrec has no CUDA support (use \"device\": \"cpu\")");
#endif
  }
  if (model.arch == "graph") return build_graph_model(model, opt, layout, device, seed);
  ModelConfig graph = model;
  graph.arch = "graph";
  graph.layers = dlrm_graph_layers(model, layout);
  return build_graph_model(graph, opt, layout, device, seed);
}

}  // namespace dlrec::model
