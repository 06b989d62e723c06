// Parsing and layout-free checks of the graph model's "layers" list (docs/MODELS.md).
#include <algorithm>
#include <functional>
#include <map>

#include "dlrec/model/graph.h"
#include "model/layers/layer.h"

namespace dlrec::model {
namespace {

// The keys an optimizer override may hold; the others of the optimizer section apply to the
// whole run (or, for embedding_lr, are the override's lr).
const std::vector<std::string>& override_keys() {
  static const std::vector<std::string> keys = {
      "type",  "lr",       "momentum",  "nesterov", "adagrad_eps", "adagrad_init", "beta1",
      "beta2", "adam_eps", "ftrl_beta", "ftrl_l1",  "ftrl_l2",     "clip_value",   "weight_decay"};
  return keys;
}

}  // namespace

HashedSpec parse_hashed(ConfigReader& parent, const std::string& key) {
  const json& v = parent.raw(key);
  if (!v.is_object())
    fail("config key '", parent.key_path(key),
         "' must be an object like {\"capacity\": 1000000, \"eviction\": \"lru\"}, got ", v.dump());
  ConfigReader r = parent.child(key);
  HashedSpec h;
  h.on = true;
  if (!r.has("capacity")) fail("config key '", r.key_path("capacity"), "' is required");
  h.capacity = r.get_int_range("capacity", 0, 1, (int64_t{1} << 31) - 1);
  if (r.has("eviction") && r.raw("eviction").is_string() &&
      r.raw("eviction").get<std::string>() == "lfu")
    fail("config key '", r.key_path("eviction"),
         "': \"lfu\" is not implemented; hashed tables evict the least recently used row "
         "(\"lru\", docs/EMBEDDINGS.md says why)");
  h.eviction = r.get_choice("eviction", h.eviction, {"lru"});
  if (r.has("init_scale")) h.init_scale = r.get_range("init_scale", 0.0, 0.0, 1e6);
  r.finish();
  return h;
}

namespace {

// "embedding, wide and mlp": the registered types with the flag, for messages.
std::string types_with(bool LayerType::*flag) {
  std::vector<std::string> names;
  for (const LayerType* t : layer_registry())
    if (t->*flag) names.push_back(t->name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
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
    const LayerType& type = layer_type(s.type);
    const int arity = type.arity;
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
      if (!t.is_number_unsigned() && !(t.is_number_integer() && t.get<int64_t>() >= 0))
        fail("config key '", r.key_path("init_tag"), "' must be a non-negative integer, got ",
             t.dump());
      s.has_init_tag = true;
      s.init_tag = t.get<uint64_t>();
    }
    r.get<json>("init_tag", json());

    if (type.table_keys) {
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
      if (r.has("tables")) {
        const json& t = r.raw("tables");
        if (!t.is_object())
          fail("config key '", r.key_path("tables"),
               "' must be an object of per-feature settings, e.g. {\"3\": {\"optimizer\": "
               "{\"type\": \"adagrad\"}}}, got ",
               t.dump());
        ConfigReader tr = r.child("tables");
        for (auto it = t.begin(); it != t.end(); ++it) {
          const std::string& k = it.key();
          int64_t f = -1;
          if (!k.empty() && k.size() <= 7 && k.find_first_not_of("0123456789") == std::string::npos)
            f = std::stoll(k);
          if (f < 0)
            fail(
                "config key '", tr.key_path(k),
                "': tables are named by their categorical feature index (\"0\", \"1\", ...), got '",
                k, "'");
          if (!s.all_features &&
              std::find(s.features.begin(), s.features.end(), f) == s.features.end())
            fail("config key '", tr.key_path(k), "': feature ", f,
                 " is not one of the layer's 'features'");
          if (!it.value().is_object())
            fail("config key '", tr.key_path(k), "' must be an object, got ", it.value().dump());
          ConfigReader er = tr.child(k);
          TableSpec ts;
          ts.where = s.where + ": " + tr.key_path(k);
          if (er.has("optimizer")) {
            ts.optimizer = er.raw("optimizer");
            layer_optimizer(OptimizerConfig(), ts.optimizer, er.key_path("optimizer"), false);
          }
          er.get<json>("optimizer", json());
          if (er.has("hashed")) {
            if (!type.hashed_tables)
              fail("config key '", er.key_path("hashed"),
                   "': hashed tables are for embedding layers (the wide part's tables are fixed)");
            ts.hashed = parse_hashed(er, "hashed");
          }
          er.finish();
          s.tables[f] = std::move(ts);
        }
        tr.finish();
      }
      r.get<json>("tables", json());
    }
    if (r.has("hashed") && !type.hashed_tables)
      fail("key 'hashed': hashed tables are for ", types_with(&LayerType::hashed_tables),
           " layers, not '", s.type, "'");
    if (r.has("tables") && !type.table_keys)
      fail("key 'tables': per-table settings are for ", types_with(&LayerType::table_keys),
           " layers, not '", s.type, "'");
    if (r.has("optimizer")) {
      if (!type.trainable)
        fail("key 'optimizer': a '", s.type, "' layer has no parameters to optimize (",
             types_with(&LayerType::trainable), " layers do)");
      s.optimizer = r.raw("optimizer");
      layer_optimizer(OptimizerConfig(), s.optimizer, r.key_path("optimizer"), type.dense_params);
    }
    r.get<json>("optimizer", json());
    type.parse(r, s);
    r.finish();
  } catch (const Error& e) {
    fail(s.where, ": ", e.what());
  }
  return s;
}

}  // namespace

OptimizerConfig layer_optimizer(const OptimizerConfig& base, const json& o, const std::string& path,
                                bool dense) {
  if (!o.is_object())
    fail("config key '", path,
         "' must be an object of optimizer keys, e.g. {\"type\": \"ftrl\", "
         "\"lr\": 0.05}, got ",
         o.dump());
  for (auto it = o.begin(); it != o.end(); ++it) {
    const std::string& k = it.key();
    if (k == "schedule" || k == "clip_norm" || k == "embedding" || k == "embedding_lr")
      fail("config key '", path, ".", k, "': '", k,
           "' applies to the whole run; set it in the optimizer section",
           k == "embedding_lr" ? " (or give this override an 'lr')" : "");
    if (k == "weight_decay" && !dense)
      fail("config key '", path,
           ".weight_decay': embedding rows and the wide part never decay; "
           "weight_decay is for mlp and cross layers");
  }
  {
    ConfigReader r(o, path);  // unknown keys name the nearest valid one
    for (const auto& k : override_keys()) r.get<json>(k, json());
    r.finish();
  }
  // The override's keys over the base's values, read (and range-checked) as a section.
  json merged = base.to_json();
  merged.erase("embedding");
  merged["embedding_lr"] = -1;
  if (!dense) merged["weight_decay"] = 0.0;
  for (auto it = o.begin(); it != o.end(); ++it) merged[it.key()] = it.value();
  ConfigReader r(merged, path);
  OptimizerConfig c = OptimizerConfig::from_json(r);
  c.embedding.clear();
  c.schedule = base.schedule;
  c.clip_norm = base.clip_norm;
  return c;
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
      if (layer_type(g.layers[it->second].type).is_output)
        fail(s.where, ": '", x, "' is the output layer and feeds nothing");
      s.input_ids.push_back(it->second);
    }
    if (layer_type(s.type).is_output) {
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
