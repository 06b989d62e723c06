// Presets: model architectures given by a few keys that expand to a graph of registry layers
// (docs/MODELS.md, "Presets"). arch "dlrm" is DLRM (Naumov et al. 2019): bottom MLP over the
// dense features, one embedding table per categorical feature, dot (or cat) interaction, top
// MLP to one logit. The graph's layer names and init tags are the former DLRM class's, so its
// parameters carry the same names ("bottom.0.weight", "top.1.bias", "emb.3.weight") and the
// same initial values, and checkpoints and exported models of arch "dlrm" load unchanged.
#include "dlrec/model/graph.h"

namespace dlrec::model {

json dlrm_graph_layers(const ModelConfig& mc, const io::ShardLayout& layout) {
  const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
  DLREC_CHECK(layout.num_dense >= 0, "DLRM: negative number of dense features");
  DLREC_CHECK(T + layout.num_dense > 0, "DLRM: the data has no features");
  DLREC_CHECK(!mc.top_mlp.empty() && mc.top_mlp.back() == 1,
              "DLRM: the top MLP must end in 1 output (the logit)");
  const bool dot = mc.interaction == "dot";
  if (dot)
    DLREC_CHECK(layout.num_dense > 0,
                "DLRM: the dot interaction needs dense features (the data has none); use "
                "\"interaction\": \"cat\"");
  for (int64_t t = 0; t < T; ++t)
    DLREC_CHECK(layout.cardinalities[t] > 0, "DLRM: categorical feature ", t, " has cardinality ",
                layout.cardinalities[t], "; every table needs rows");
  json layers = json::array();
  json inter_inputs = json::array();
  if (layout.num_dense > 0) {
    layers.push_back({{"name", "dense"}, {"type", "dense"}});
    int64_t dense_dim = layout.num_dense;
    if (!mc.bottom_mlp.empty()) {
      layers.push_back({{"name", "bottom"},
                        {"type", "mlp"},
                        {"input", "dense"},
                        {"sizes", mc.bottom_mlp},
                        {"relu_last", true},
                        {"init_tag", 1}});
      dense_dim = mc.bottom_mlp.back();
    }
    if (dot && dense_dim != mc.embedding_dim)
      fail("DLRM: the dot interaction needs the bottom MLP to output embedding_dim = ",
           mc.embedding_dim, " values, but it outputs ", dense_dim,
           mc.bottom_mlp.empty() ? " (no bottom MLP: the dense feature count)"
                                 : " (set the last bottom_mlp size to embedding_dim)");
    inter_inputs.push_back(mc.bottom_mlp.empty() ? "dense" : "bottom");
  }
  if (T > 0) {
    layers.push_back({{"name", "emb"},
                      {"type", "embedding"},
                      {"dim", mc.embedding_dim},
                      {"pooling", mc.pooling},
                      {"init_tag", 3}});
    inter_inputs.push_back("emb");
  }
  layers.push_back({{"name", "inter"}, {"type", dot ? "dot" : "concat"}, {"inputs", inter_inputs}});
  layers.push_back({{"name", "top"},
                    {"type", "mlp"},
                    {"input", "inter"},
                    {"sizes", mc.top_mlp},
                    {"init_tag", 2}});
  layers.push_back({{"name", "logit"}, {"type", "output"}, {"input", "top"}});
  return layers;
}

}  // namespace dlrec::model
