#include "dlrec/model/model.h"

#include <algorithm>
#include <map>

#include "dlrec/model/graph.h"
#ifdef DLREC_WITH_CUDA
#include "dlrec/model/graph_cuda.h"
#endif
#include "dlrec/nn/loss.h"

namespace dlrec::model {

void Model::set_mask(const std::string& name, const Tensor& /*mask*/) {
  fail("2:4 masks are CPU-only in this build: the ", device().str(),
       " model cannot hold the mask of '", name, "' (train with \"device\": \"cpu\")");
}

void Model::set_compressed(const std::vector<CompressedWeight>& weights,
                           nn::kernel_choice::Policy /*policy*/) {
  if (weights.empty()) return;
  fail("compressed layers: the ", device().str(), " model takes no compressed kernels ('",
       weights[0].name, "')");
}

void Model::set_quantized_tables(std::vector<QuantizedTable> tables) {
  if (tables.empty()) return;
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : parameters()) params[name] = t;
  for (const QuantizedTable& q : tables) {
    const std::string what = "quantized table '" + q.name + "'";
    auto it = params.find(q.name);
    if (it == params.end() || it->second.ndim() != 2 || it->second.dtype() != DType::F32)
      fail(what, ": the model has no table parameter of that name (2-d, F32)");
    Tensor& p = it->second;
    nn::check_row_quant(q.rows, what);
    if (q.rows.rows != p.dim(0) || q.rows.dim != p.dim(1))
      fail(what, ": the record is [", q.rows.rows, ", ", q.rows.dim, "], the model's table is [",
           p.dim(0), ", ", p.dim(1), "]");
    // Dequantized a block of rows at a time into the parameter, wherever it lives.
    const int64_t d = q.rows.dim, block = std::max<int64_t>(1, (int64_t{1} << 16) / d);
    std::vector<float> buf(static_cast<size_t>(std::min(block, q.rows.rows) * d));
    for (int64_t r0 = 0; r0 < q.rows.rows; r0 += block) {
      const int64_t n = std::min(block, q.rows.rows - r0);
      for (int64_t r = 0; r < n; ++r) nn::row_quant_dequantize(q.rows, r0 + r, buf.data() + r * d);
      copy_bytes(p.data<float>() + r0 * d, p.device(), buf.data(), Device::cpu(),
                 static_cast<size_t>(n * d) * sizeof(float));
    }
  }
}

void Model::set_kernel_policy(nn::kernel_choice::Policy /*policy*/) {}

double Model::train_step(const io::Batch& batch, double lr_scale, bool /*want_loss*/) {
  // The loss is the CPU reference's (BCE or MSE, loss()); for a model on a GPU the logits come
  // over and dL/dlogits goes back (a few KB per step).
  Tensor logits = forward(batch, true).to(Device::cpu());
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows, "train_step: the batch has ",
              batch.labels.size(), " labels for ", batch.rows, " rows");
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const double batch_loss = nn::loss_and_grad(loss(), logits.data<float>(),
                                              batch.labels.data(), batch.rows,
                                              dlogits.data<float>());
  if (device().is_cuda()) dlogits = dlogits.to(device());
  backward_and_update(dlogits, lr_scale);
  return batch_loss;
}

void Model::shard_tables(dist::Communicator&, const dist::PlannerOptions&,
                         const std::vector<double>&, std::FILE*) {
  fail("sharded embeddings are not supported by this model on ", device().str(),
       " yet (the CPU graph engine supports them)");
}

void Model::set_gradient_reducer(GradientReducer* reducer) {
  if (reducer)
    fail("data-parallel training across ranks is not supported by this model on ", device().str(),
         " yet (the CPU graph engine supports it)");
}

double Model::train_step_distill(const io::Batch&, const float*, double, double, double, bool) {
  fail("distillation steps inside the engine are not supported by this model on ",
       device().str(), " (bug: the trainer asks distills_in_step() first)");
}

double Model::train_step_part(const io::Batch&, int64_t, double, bool) {
  fail("data-parallel steps on the device are not supported by this model on ", device().str(),
       " (bug: the trainer asks trains_parts_on_device() first)");
}

// Every model is a graph of registry layers run by the graph engine (on the CPU, or on CUDA by
// the CUDA graph engine); every arch but "graph" is a preset (presets.cc) expanded to one.
std::unique_ptr<Model> build_model(const ModelConfig& model, const OptimizerConfig& opt,
                                   const io::ShardLayout& layout, Device device, uint64_t seed,
                                   const std::string& precision, bool deterministic) {
  DLREC_CHECK(precision == "fp32" || device.is_cuda(), "precision '", precision,
              "' needs a CUDA device; the CPU computes in fp32");
  const std::vector<std::string>& presets = preset_archs();
  if (model.arch != "graph" &&
      std::find(presets.begin(), presets.end(), model.arch) == presets.end())
    preset_graph_layers(model, layout);  // fails naming the known archs
#ifndef DLREC_WITH_CUDA
  if (device.is_cuda())
    fail("cannot build the model (arch \"", model.arch, "\") on ", device.str(),
         ": this build of dlrec has no CUDA support and runs models on the CPU only (use "
         "\"device\": \"cpu\")");
#endif
  ModelConfig graph = model;
  if (model.arch != "graph") {
    graph.arch = "graph";
    graph.layers = preset_graph_layers(model, layout);
  }
#ifdef DLREC_WITH_CUDA
  if (device.is_cuda()) {
    GraphCudaOptions o;
    o.lt_tune = !deterministic;
    return make_graph_cuda(graph, opt, layout, device, seed, precision, o);
  }
#endif
  (void)deterministic;  // the CPU engine is deterministic
  return build_graph_model(graph, opt, layout, device, seed);
}

}  // namespace dlrec::model
