// Presets: model architectures given by a few keys that expand to a graph of registry layers
// (docs/MODELS.md, "Presets"). Each preset's layers are named as in its shipped graph config
// (configs/dcnv2.json, deepfm.json, wide_deep.json), so the preset and the config are the same
// model (tests/model/graph_model_test.cc, ZooPresetsMatchShippedConfigs). arch "dlrm" is DLRM (Naumov et al. 2019): bottom MLP over the
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

namespace {

json layer(const std::string& name, const std::string& type) {
  return {{"name", name}, {"type", type}};
}

// "dense" (when the data has dense features) and "emb": the inputs every zoo preset starts from.
// Returns the names the deep part concatenates.
json dense_and_embeddings(const ModelConfig& mc, const io::ShardLayout& layout, json& layers) {
  DLREC_CHECK(!layout.cardinalities.empty(), "model.arch '", mc.arch,
              "': the data has no categorical features");
  json deep_in = json::array();
  if (layout.num_dense > 0) {
    layers.push_back(layer("dense", "dense"));
    deep_in.push_back("dense");
  }
  json emb = layer("emb", "embedding");
  emb["dim"] = mc.embedding_dim;
  emb["pooling"] = mc.pooling;
  layers.push_back(emb);
  deep_in.push_back("emb");
  return deep_in;
}

// DCNv2 (stacked): bottom MLP over the dense features, x0 = concat(bottom, emb), cross network
// (cross_layers, cross_low_rank), top MLP.
json dcnv2_layers(const ModelConfig& mc, const io::ShardLayout& layout) {
  json layers = json::array();
  json x0_in = dense_and_embeddings(mc, layout, layers);
  if (layout.num_dense > 0 && !mc.bottom_mlp.empty()) {
    json bottom = layer("bottom", "mlp");
    bottom["input"] = "dense";
    bottom["sizes"] = mc.bottom_mlp;
    bottom["relu_last"] = true;
    layers.insert(layers.begin() + 1, bottom);
    x0_in[0] = "bottom";
  }
  json x0 = layer("x0", "concat");
  x0["inputs"] = x0_in;
  json cross = layer("cross", "cross");
  cross["input"] = "x0";
  cross["num_layers"] = mc.cross_layers;
  cross["low_rank"] = mc.cross_low_rank;
  json top = layer("top", "mlp");
  top["input"] = "cross";
  top["sizes"] = mc.top_mlp;
  json logit = layer("logit", "output");
  logit["input"] = "top";
  for (json* l : {&x0, &cross, &top, &logit}) layers.push_back(*l);
  return layers;
}

// The wide part, the deep MLP (top_mlp) over concat(dense, emb) and their sum; DeepFM adds the
// fm term over the embeddings.
json wide_and_deep_layers(const ModelConfig& mc, const io::ShardLayout& layout,
                          const std::string& wide_name, bool fm) {
  json layers = json::array();
  json wide = layer(wide_name, "wide");
  wide["features"] = "all";
  wide["pooling"] = mc.pooling;
  json deep_in_inputs = dense_and_embeddings(mc, layout, layers);
  layers.insert(layers.begin() + (layout.num_dense > 0 ? 1 : 0), wide);
  json sum_in = json::array({wide_name});
  if (fm) {
    json f = layer("fm", "fm");
    f["inputs"] = json::array({"emb"});
    layers.push_back(f);
    sum_in.push_back("fm");
  }
  json deep_in = layer("deep_in", "concat");
  deep_in["inputs"] = deep_in_inputs;
  json deep = layer("deep", "mlp");
  deep["input"] = "deep_in";
  deep["sizes"] = mc.top_mlp;
  sum_in.push_back("deep");
  json sum = layer("sum", "add");
  sum["inputs"] = sum_in;
  json logit = layer("logit", "output");
  logit["input"] = "sum";
  for (json* l : {&deep_in, &deep, &sum, &logit}) layers.push_back(*l);
  return layers;
}

struct Preset {
  const char* arch;
  json (*layers)(const ModelConfig&, const io::ShardLayout&);
};

const Preset kPresets[] = {
    {"dlrm", dlrm_graph_layers},
    {"dcnv2", dcnv2_layers},
    {"deepfm",
     [](const ModelConfig& mc, const io::ShardLayout& l) {
       return wide_and_deep_layers(mc, l, "first_order", true);
     }},
    {"wide_deep",
     [](const ModelConfig& mc, const io::ShardLayout& l) {
       return wide_and_deep_layers(mc, l, "wide", false);
     }},
};

}  // namespace

const std::vector<std::string>& preset_archs() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Preset& p : kPresets) n.push_back(p.arch);
    return n;
  }();
  return names;
}

json preset_graph_layers(const ModelConfig& mc, const io::ShardLayout& layout) {
  for (const Preset& p : kPresets)
    if (mc.arch == p.arch) return p.layers(mc, layout);
  fail("unknown model arch '", mc.arch, "' (this build knows: graph and the presets ",
       [] {
         std::string s;
         for (const Preset& p : kPresets) s += std::string(s.empty() ? "" : ", ") + p.arch;
         return s;
       }(),
       ")");
}

}  // namespace dlrec::model
