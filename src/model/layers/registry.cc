// The layer registry (layer.h) and what several layer declarations share.
#include <algorithm>
#include <cstring>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/param.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"

namespace dlrec::model {

const std::vector<const LayerType*>& layer_registry() {
  static const std::vector<const LayerType*> types = {
      &dense_layer(), &embedding_layer(), &wide_layer(), &mlp_layer(), &cross_layer(),
      &dot_layer(),   &concat_layer(),    &fm_layer(),   &add_layer(), &output_layer()};
  return types;
}

const LayerType* find_layer_type(const std::string& name) {
  for (const LayerType* t : layer_registry())
    if (t->name == name) return t;
  return nullptr;
}

const LayerType& layer_type(const std::string& name) {
  const LayerType* t = find_layer_type(name);
  if (!t) fail("unknown layer type '", name, "'");
  return *t;
}

const std::vector<std::string>& graph_layer_types() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const LayerType* t : layer_registry()) n.push_back(t->name);
    return n;
  }();
  return names;
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

std::vector<int64_t> table_features(const LayerSpec& s, const io::ShardLayout& layout) {
  const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
  std::vector<int64_t> f;
  if (s.all_features) {
    for (int64_t t = 0; t < T; ++t) f.push_back(t);
    if (f.empty()) fail("the data has no categorical features");
  } else {
    for (int64_t x : s.features)
      if (x >= T)
        fail("key 'features': feature ", x, " does not exist (the data has ", T,
             " categorical features, 0 .. ", T - 1, ")");
    f = s.features;
  }
  for (int64_t x : f)
    if (layout.cardinalities[x] <= 0)
      fail("key 'features': categorical feature ", x, " has cardinality ", layout.cardinalities[x],
           "; every table needs rows");
  return f;
}

std::string fields_str(const ValueShape& s) {
  std::string out;
  for (size_t i = 0; i < s.fields.size() && i < 8; ++i)
    out += (i ? ", " : "") + std::to_string(s.fields[i]);
  if (s.fields.size() > 8) out += ", ...";
  return "[" + out + "]";
}

std::pair<int64_t, int64_t> interaction_fields(const LayerSpec& s,
                                               const std::vector<ValueShape>& in,
                                               const std::string& hint) {
  int64_t nf = 0;
  const int64_t d = in[0].fields.at(0);
  for (size_t k = 0; k < in.size(); ++k)
    for (int64_t w : in[k].fields) {
      if (w != d)
        fail("key '", s.input_key, "': the ", s.type,
             " interaction needs vectors of one width, but '", s.inputs[0], "' starts with width ",
             d, " and '", s.inputs[k], "' has vectors of widths ", fields_str(in[k]), hint);
      ++nf;
    }
  if (nf < 2)
    fail("key '", s.input_key, "': the ", s.type,
         " interaction needs at least 2 vectors, its inputs give ", nf);
  return {nf, d};
}

std::string cuda_all_features(const LayerSpec& s, const io::ShardLayout& layout) {
  const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
  if (s.all_features) return "";
  bool all = static_cast<int64_t>(s.features.size()) == T;
  for (size_t k = 0; all && k < s.features.size(); ++k)
    all = s.features[k] == static_cast<int64_t>(k);
  if (all) return "";
  return "key 'features': the CUDA graph model's " + s.type +
         " layer reads all categorical features (0 .. " + std::to_string(T - 1) +
         ", in order); train this model on the CPU";
}

std::string cuda_compute_type_input(const CudaQuery& q) {
  if (q.precision != "bf16" && q.precision != "fp16") return "";
  for (size_t k = 0; k < q.in.size(); ++k)
    if (q.in[k].width == 1)
      return "key '" + q.spec.input_key + "': in " + q.precision + " precision a '" + q.spec.type +
             "' layer cannot read the 1-wide (f32) output of '" + q.spec.inputs[k] +
             "'; use \"precision\": \"fp32\" or \"tf32\"";
  return "";
}

namespace cpu_graph {

void concat_cols(const std::vector<const Tensor*>& in, Tensor& out) {
  const int64_t B = in[0]->dim(0);
  int64_t W = 0;
  for (auto* t : in) W += t->dim(1);
  nn::ensure_buffer(out, {B, W});
  float* o = out.data<float>();
  parallel_for(0, B, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t c = 0;
      for (auto* t : in) {
        const int64_t w = t->dim(1);
        std::memcpy(o + r * W + c, t->data<float>() + r * w, w * sizeof(float));
        c += w;
      }
    }
  });
}

void slice_cols(const Tensor& src, int64_t c0, int64_t w, Tensor& dst) {
  const int64_t B = src.dim(0), Ws = src.dim(1);
  nn::ensure_buffer(dst, {B, w});
  const float* s = src.data<float>();
  float* d = dst.data<float>();
  parallel_for(0, B, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) std::memcpy(d + r * w, s + r * Ws + c0, w * sizeof(float));
  });
}

void split_cols(const Tensor& dout, const std::vector<int64_t>& widths,
                const std::vector<bool>& need, std::vector<Tensor>& bufs,
                std::vector<Tensor>& dins) {
  bufs.resize(widths.size());
  int64_t c = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    if (need[i]) {
      slice_cols(dout, c, widths[i], bufs[i]);
      dins[i] = bufs[i];
    }
    c += widths[i];
  }
}

}  // namespace cpu_graph
}  // namespace dlrec::model
