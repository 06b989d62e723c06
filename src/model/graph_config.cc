// Parsing and layout-free checks of the graph model's "layers" list (docs/MODELS.md).
#include <algorithm>
#include <functional>
#include <map>

#include "dlrec/model/graph.h"

namespace dlrec::model {
namespace {

// Number of graph inputs each layer type takes: exact count, or at least one (-1).
int input_arity(const std::string& type) {
  if (type == "dense" || type == "embedding" || type == "wide") return 0;
  if (type == "mlp" || type == "cross" || type == "output") return 1;
  return -1;  // dot, concat, fm, add
}

std::vector<int64_t> read_int_list(ConfigReader& r, const std::string& key, int64_t lo, int64_t hi,
                                   bool allow_empty) {
  const json& v = r.raw(key);
  if (!v.is_array())
    fail("config key '", r.key_path(key), "' must be a list of integers, got ", v.dump());
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<int64_t>() < lo || v[i].get<int64_t>() > hi)
      fail("config key '", r.key_path(key), "[", i, "]' must be an integer in ", lo, " .. ", hi,
           ", got ", v[i].dump());
    out.push_back(v[i].get<int64_t>());
  }
  if (out.empty() && !allow_empty) fail("config key '", r.key_path(key), "' must not be empty");
  return out;
}

LayerSpec parse_layer(const json& j, const std::string& path) {
  if (!j.is_object()) fail("config key '", path, "' must be a layer object, got ", j.dump());
  ConfigReader r(j, path);
  LayerSpec s;
  s.name = r.require<std::string>("name");
  if (s.name.empty() || s.name.find_first_of(". \t") != std::string::npos)
    fail("config key '", r.key_path("name"),
         "' must be a non-empty name without dots or "
         "spaces (it prefixes the layer's parameter names), got '",
         s.name, "'");
  s.where = path + " (layer '" + s.name + "')";
  try {
    if (!r.has("type")) fail("config key '", r.key_path("type"), "' is required");
    s.type = r.get_choice("type", "", graph_layer_types());
    s.where = path + " (layer '" + s.name + "', " + s.type + ")";
    const int arity = input_arity(s.type);
    if (r.has("input") && r.has("inputs")) fail("give either 'input' or 'inputs', not both");
    if (r.has("input")) s.inputs.push_back(r.get<std::string>("input", ""));
    if (r.has("inputs")) {
      s.input_key = "inputs";
      const json& v = r.raw("inputs");
      if (!v.is_array() || v.empty())
        fail("config key '", r.key_path("inputs"), "' must be a non-empty list of layer names");
      for (const auto& x : v) {
        if (!x.is_string())
          fail("config key '", r.key_path("inputs"), "' must list layer names, got ", x.dump());
        s.inputs.push_back(x.get<std::string>());
      }
    }
    r.get<json>("input", json());
    r.get<json>("inputs", json());
    if (arity == 0 && !s.inputs.empty())
      fail("a '", s.type, "' layer reads the batch and takes no 'input'");
    if (arity == 1 && s.inputs.size() != 1)
      fail("a '", s.type, "' layer needs exactly one input (key 'input')");
    if (arity < 0 && s.inputs.empty())
      fail("a '", s.type, "' layer needs its inputs (key 'inputs')");
    if (r.has("init_tag")) {
      const json& t = r.raw("init_tag");
      if (!t.is_number_unsigned())
        fail("config key '", r.key_path("init_tag"), "' must be a non-negative integer, got ",
             t.dump());
      s.has_init_tag = true;
      s.init_tag = t.get<uint64_t>();
    }
    r.get<json>("init_tag", json());

    if (s.type == "embedding" || s.type == "wide") {
      if (r.has("features")) {
        const json& f = r.raw("features");
        if (f.is_string()) {
          if (f.get<std::string>() != "all")
            fail("config key '", r.key_path("features"),
                 "' must be \"all\" or a list of categorical feature indices, got ", f.dump());
        } else {
          s.features = read_int_list(r, "features", 0, int64_t{1} << 20, false);
          s.all_features = false;
          std::vector<int64_t> sorted = s.features;
          std::sort(sorted.begin(), sorted.end());
          if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
            fail("config key '", r.key_path("features"), "' lists a feature twice");
        }
      }
      r.get<json>("features", json());
      s.pooling = r.get_choice("pooling", s.pooling, {"sum", "mean"});
    }
    if (s.type == "embedding") {
      s.dim = r.get_int_range("dim", s.dim, 1, 1 << 16);
      if (r.has("dims")) {
        if (r.has("dim")) fail("give either 'dim' or 'dims', not both");
        s.dims = read_int_list(r, "dims", 1, 1 << 16, false);
        if (!s.all_features && s.dims.size() != s.features.size())
          fail("config key '", r.key_path("dims"), "' has ", s.dims.size(), " widths for the ",
               s.features.size(), " features of 'features'");
      }
      r.get<json>("dims", json());
    } else if (s.type == "mlp") {
      s.sizes = read_int_list(r, "sizes", 1, 1 << 20, false);
      s.relu_last = r.get<bool>("relu_last", false);
    } else if (s.type == "cross") {
      s.num_layers = r.get_int_range("num_layers", s.num_layers, 1, 1024);
      s.low_rank = r.get_int_range("low_rank", s.low_rank, 0, 1 << 20);
    }
    r.finish();
  } catch (const Error& e) {
    fail(s.where, ": ", e.what());
  }
  return s;
}

}  // namespace

const std::vector<std::string>& graph_layer_types() {
  static const std::vector<std::string> types = {"dense", "embedding", "wide", "mlp", "cross",
                                                 "dot",   "concat",    "fm",   "add", "output"};
  return types;
}

GraphSpec GraphSpec::parse(const json& layers, const std::string& path) {
  if (!layers.is_array() || layers.empty())
    fail("config key '", path, "' must be a non-empty list of layers (arch \"graph\")");
  GraphSpec g;
  std::map<std::string, int> index;
  std::vector<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    g.layers.push_back(parse_layer(layers[i], path + "[" + std::to_string(i) + "]"));
    const LayerSpec& s = g.layers.back();
    if (index.count(s.name))
      fail(s.where, ": name '", s.name, "' is already used by ", g.layers[index[s.name]].where);
    index[s.name] = static_cast<int>(i);
    names.push_back(s.name);
  }
  const int n = static_cast<int>(g.layers.size());
  for (int i = 0; i < n; ++i) {
    LayerSpec& s = g.layers[i];
    for (const auto& x : s.inputs) {
      auto it = index.find(x);
      if (it == index.end()) {
        const std::string near = nearest_name(x, names);
        fail(s.where, ": key '", s.input_key, "': unknown layer '", x, "'",
             near.empty() ? "" : " (did you mean '" + near + "'?)");
      }
      if (it->second == i) fail(s.where, ": the layer lists itself as an input");
      if (g.layers[it->second].type == "output")
        fail(s.where, ": '", x, "' is the output layer and feeds nothing");
      s.input_ids.push_back(it->second);
    }
    if (s.type == "output") {
      if (g.output >= 0)
        fail(s.where, ": a second output layer (", g.layers[g.output].where, " is one)");
      g.output = i;
    }
  }
  if (g.output < 0) fail("config key '", path, "' has no layer of type \"output\"");

  // Depth-first topological sort from the output; a grey node met again closes a cycle.
  std::vector<int> color(n, 0), stack;
  std::vector<int> order;
  std::function<void(int)> visit = [&](int v) {
    color[v] = 1;
    stack.push_back(v);
    for (int u : g.layers[v].input_ids) {
      if (color[u] == 1) {
        std::string cyc;
        auto at = std::find(stack.begin(), stack.end(), u);
        for (auto k = at; k != stack.end(); ++k) cyc += "'" + g.layers[*k].name + "' -> ";
        cyc += "'" + g.layers[u].name + "'";
        fail(g.layers[v].where, ": the layers form a cycle (", cyc, ", each consuming the next)");
      }
      if (color[u] == 0) visit(u);
    }
    stack.pop_back();
    color[v] = 2;
    order.push_back(v);
  };
  visit(g.output);
  for (int i = 0; i < n; ++i)
    if (color[i] == 0)
      fail(g.layers[i].where, ": the layer does not feed the output layer '",
           g.layers[g.output].name, "' (remove it or use it)");
  g.order = std::move(order);
  return g;
}

}  // namespace dlrec::model
