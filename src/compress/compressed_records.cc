// The compressed records of an export for the CUDA engine (compressed_records.h).
#include "dlrec/compress/compressed_records.h"

#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "dlrec/io/tensor_file.h"

namespace dlrec::compress {

namespace {

std::vector<std::string> names_in(const json& list, const std::string& path,
                                  const std::string& key) {
  if (!list.is_array()) fail("tensor file '", path, "': meta key '", key, "' is not a list");
  std::vector<std::string> out;
  for (const json& n : list) {
    if (!n.is_string()) fail("tensor file '", path, "': meta '", key, "' holds a non-name");
    out.push_back(n.get<std::string>());
  }
  return out;
}

}  // namespace

std::vector<model::CompressedWeight> read_compressed_weights(const json& meta,
                                                             const std::string& path,
                                                             model::Model& model) {
  std::vector<model::CompressedWeight> out;
  if (!meta.is_object()) return out;
  std::vector<std::string> masked, quant;
  if (meta.contains("masks")) masked = names_in(meta.at("masks"), path, "masks");
  if (meta.contains("quant")) {
    const json& q = meta.at("quant");
    if (!q.is_object() || q.value("dtype", json()) != json("int8") || !q.contains("weights"))
      fail("tensor file '", path,
           "': meta key 'quant' must be {\"dtype\": \"int8\", \"weights\": [...]}");
    quant = names_in(q.at("weights"), path, "quant.weights");
  }
  if (masked.empty() && quant.empty()) return out;
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.parameters()) params[name] = t;
  std::map<std::string, size_t> index;
  auto entry = [&](const std::string& name, const char* what) -> model::CompressedWeight& {
    auto p = params.find(name);
    if (p == params.end() || p->second.ndim() != 2)
      fail("tensor file '", path, "': ", what, " of '", name,
           "', which is not a weight matrix of the model");
    auto [it, fresh] = index.emplace(name, out.size());
    if (fresh) {
      model::CompressedWeight w;
      w.name = name;
      out.push_back(std::move(w));
    }
    return out[it->second];
  };
  std::vector<io::NamedTensor> targets;
  std::map<std::string, std::array<Tensor, 3>> qt;
  for (const std::string& n : masked) {
    model::CompressedWeight& w = entry(n, "mask");
    const Tensor& p = params.at(n);
    w.mask = Tensor::empty({p.dim(0), p.dim(1)}, DType::F32, Device::cpu());
    targets.emplace_back(n + ".mask", w.mask);
  }
  for (const std::string& n : quant) {
    entry(n, "INT8 record");
    const Tensor& p = params.at(n);
    auto& t = qt[n];
    t[0] = Tensor::empty({p.dim(0), p.dim(1)}, DType::U8, Device::cpu());
    t[1] = Tensor::empty({p.dim(0)}, DType::F32, Device::cpu());
    t[2] = Tensor::empty({1}, DType::F32, Device::cpu());
    targets.emplace_back(n + ".qweight", t[0]);
    targets.emplace_back(n + ".wscale", t[1]);
    targets.emplace_back(n + ".xscale", t[2]);
  }
  io::TensorLoadOptions opts;
  opts.allow_extra = true;  // the parameters, loaded by the caller
  io::load_tensors(path, targets, opts);
  for (model::CompressedWeight& w : out) {
    if (w.mask.defined()) {
      const float* m = w.mask.data<float>();
      for (int64_t k = 0; k < w.mask.numel(); ++k)
        if (m[k] != 0.f && m[k] != 1.f)
          fail("tensor file '", path, "': tensor '", w.name, ".mask' element ", k, " is ", m[k],
               " (a mask holds only 0 and 1)");
    }
    auto it = qt.find(w.name);
    if (it == qt.end()) continue;
    const auto& [bytes, ws, xs] = it->second;
    w.int8 = true;
    w.q.resize(static_cast<size_t>(bytes.numel()));
    std::memcpy(w.q.data(), bytes.raw(), w.q.size());
    for (size_t k = 0; k < w.q.size(); ++k)
      if (w.q[k] == -128)
        fail("tensor file '", path, "': tensor '", w.name, ".qweight' element ", k,
             " is -128 (INT8 weights are symmetric: -127 .. 127)");
    w.wscale = ws.to_vector<float>();
    for (size_t j = 0; j < w.wscale.size(); ++j)
      if (!(std::isfinite(w.wscale[j]) && w.wscale[j] > 0))
        fail("tensor file '", path, "': tensor '", w.name, ".wscale' element ", j, " is ",
             w.wscale[j], " (a scale is finite and > 0)");
    w.xscale = xs.data<float>()[0];
    if (!(std::isfinite(w.xscale) && w.xscale > 0))
      fail("tensor file '", path, "': tensor '", w.name, ".xscale' is ", w.xscale,
           " (a scale is finite and > 0)");
  }
  return out;
}

}  // namespace dlrec::compress
