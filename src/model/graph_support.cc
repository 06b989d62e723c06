// What the CUDA graph engine supports (graph_cuda_unsupported, include/dlrec/model/graph.h):
// the engine-wide limits (precision, optimizers, per-layer overrides) here, each layer type's
// own in its LayerType::cuda_unsupported (src/model/layers/<type>.cc). Built in every build, so
// a CPU-only build and the parity harness can ask it too.
#include <map>

#include "dlrec/model/graph.h"
#include "dlrec/nn/optimizer.h"
#include "model/layers/layer.h"

namespace dlrec::model {
namespace {

// "" when the CUDA engine has the optimizer (sgd with or without momentum, adagrad, adam, and for
// the tables rowwise_adagrad; no clipping; weight decay for adam's dense layers only), else why
// not.
std::string optimizer_unsupported(const OptimizerConfig& c, const std::string& what, bool dense) {
  auto why = [&](const std::string& s) {
    return "the CUDA graph model " + s + " (" + what +
           "; train this model on the CPU: "
           "\"device\": \"cpu\")";
  };
  const nn::OptimizerKind k = nn::parse_optimizer(c.type);
  if (dense && k == nn::OptimizerKind::RowWiseAdagrad)
    return why("supports rowwise_adagrad for the embedding tables only (set it as "
               "optimizer.embedding, with sgd or adagrad for the dense layers)");
  if (k != nn::OptimizerKind::SGD && k != nn::OptimizerKind::Adagrad &&
      k != nn::OptimizerKind::RowWiseAdagrad && k != nn::OptimizerKind::Adam)
    return why("supports the sgd, adagrad and adam optimizers (and rowwise_adagrad for the "
               "tables), not '" + c.type + "'");
  if (c.clip_value != 0)
    return why("does not clip gradients (optimizer.clip_value = " + std::to_string(c.clip_value) +
               ")");
  if (dense && c.weight_decay != 0 && k != nn::OptimizerKind::Adam)
    return why("has weight decay for adam only (decoupled, AdamW; optimizer.weight_decay = " +
               std::to_string(c.weight_decay) + ")");
  if (dense && c.clip_norm != 0)
    return why("does not clip gradients (optimizer.clip_norm = " + std::to_string(c.clip_norm) +
               ")");
  return "";
}

}  // namespace

std::string graph_cuda_unsupported(const GraphSpec& spec, const OptimizerConfig& opt,
                                   const io::ShardLayout& layout, const std::string& precision) {
  for (const LayerSpec& s : spec.layers) {
    if (precision == "fp16" && s.hashed.on)
      return s.where +
             ": hashed tables are not implemented in fp16 on CUDA (their evaluation pooling "
             "writes f32 or bf16); use \"precision\": \"bf16\" or \"fp32\"";
    if (!s.optimizer.is_null())
      return s.where +
             ": per-layer optimizers are not implemented on CUDA yet (the layer's "
             "\"optimizer\"); remove it or train on the CPU (\"device\": \"cpu\")";
    if (!s.tables.empty())
      return s.where +
             ": per-table settings (\"tables\") are not implemented on CUDA yet; "
             "remove them or train on the CPU (\"device\": \"cpu\")";
  }
  // Hashed tables number their rows by capacity; the step's row array is shared by all table
  // layers, so no other table layer (rows by cardinality) can sit beside a hashed one.
  for (const LayerSpec& h : spec.layers)
    for (const LayerSpec& w : spec.layers)
      if (h.hashed.on && &h != &w && layer_type(w.type).table_keys)
        return h.where + ": hashed tables and a " + w.type + " layer ('" + w.name +
               "') in one model are not implemented on CUDA; train this model on the CPU "
               "(\"device\": \"cpu\")";
  std::string why = optimizer_unsupported(opt, "optimizer", true);
  if (why.empty())
    why = optimizer_unsupported(opt.embedding_config(), "optimizer.embedding", false);
  if (!why.empty()) return why;
  const bool rowwise =
      nn::parse_optimizer(opt.embedding_config().type) == nn::OptimizerKind::RowWiseAdagrad;
  for (const LayerSpec& s : spec.layers) {
    if (!rowwise || !layer_type(s.type).table_keys) continue;
    for (int64_t d : s.dims.empty() ? std::vector<int64_t>{s.dim} : s.dims)
      if (d > nn::cuda_rowwise_max_dim(d))
        return s.where + ": optimizer.embedding \"rowwise_adagrad\" on CUDA takes tables of dim "
                         "up to " + std::to_string(nn::cuda_rowwise_max_dim(d)) + ", not " +
               std::to_string(d) + "; train this model on the CPU (\"device\": \"cpu\")";
  }
  // Layer by layer in topological order, with the inputs' shapes.
  std::vector<ValueShape> shapes(spec.layers.size());
  std::map<std::string, std::string> single;  // type -> the first layer of a cuda_single type
  for (int i : spec.order) {
    const LayerSpec& s = spec.layers[i];
    const LayerType& type = layer_type(s.type);
    std::vector<ValueShape> in;
    for (int j : s.input_ids) in.push_back(shapes[j]);
    try {
      shapes[i] = type.infer(s, in, layout);
    } catch (const Error& e) {
      fail(s.where, ": ", e.what());
    }
    if (type.cuda_single) {
      auto it = single.find(s.type);
      if (it != single.end())
        return s.where + ": the CUDA graph model supports one " + s.type +
               " layer (over all "
               "categorical features; '" +
               it->second + "' is one); train this model on the CPU";
      single[s.type] = s.name;
    }
    const std::string w = type.cuda_unsupported(CudaQuery{s, in, layout, precision});
    if (!w.empty()) return s.where + ": " + w;
  }
  return "";
}

}  // namespace dlrec::model
