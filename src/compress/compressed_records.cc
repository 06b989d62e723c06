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

std::vector<model::NamedTensor> quantized_table_tensors(const std::string& name,
                                                        const nn::RowQuantRows& q) {
  nn::check_row_quant(q, "quantized table '" + name + "'");
  Tensor codes = Tensor::empty({q.rows, q.row_bytes()}, DType::U8, Device::cpu());
  if (!q.codes.empty()) std::memcpy(codes.raw(), q.codes.data(), q.codes.size());
  auto values = [&](const std::vector<float>& v, const char* what) {
    if (!q.fp16) return Tensor::from_vector(v, {q.rows});
    Tensor t = Tensor::empty({q.rows}, DType::F16, Device::cpu());
    auto* b = static_cast<uint16_t*>(t.raw());
    for (size_t r = 0; r < v.size(); ++r)
      b[r] = nn::fp16_bits_exact(v[r], "quantized table '" + name + "' row " + std::to_string(r) +
                                           "'s " + what);
    return t;
  };
  return {{name + ".codes", codes},
          {name + ".qscale", values(q.scale, "scale")},
          {name + ".qbias", values(q.bias, "bias")}};
}

json quantized_table_meta(const std::string& name, const nn::RowQuantRows& q) {
  return {{"table", name}, {"bits", q.bits}, {"scale_bias", q.fp16 ? "fp16" : "fp32"}};
}

namespace {

struct QuantEntry {
  std::string table;
  int bits = 8;
  bool fp16 = false;
};

std::vector<QuantEntry> quant_entries(const json& meta, const std::string& path) {
  std::vector<QuantEntry> out;
  if (!meta.is_object() || !meta.contains("embedding_quant")) return out;
  const json& list = meta.at("embedding_quant");
  const std::string where = "tensor file '" + path + "': meta key 'embedding_quant'";
  if (!list.is_array()) fail(where, " is not a list");
  for (const json& e : list) {
    const bool ok = e.is_object() && e.contains("table") && e.at("table").is_string() &&
                    e.contains("bits") && e.at("bits").is_number_integer() &&
                    e.contains("scale_bias") && e.at("scale_bias").is_string();
    if (!ok)
      fail(where, ": entry ", dump_json_safe(e),
           " is not {\"table\": NAME, \"bits\": 8 | 4, \"scale_bias\": \"fp32\" | \"fp16\"}");
    QuantEntry q;
    q.table = e.at("table").get<std::string>();
    q.bits = e.at("bits").get<int>();
    const std::string sb = e.at("scale_bias").get<std::string>();
    if (q.bits != 8 && q.bits != 4)
      fail(where, ": table '", q.table, "': bits ", q.bits, " (8 or 4)");
    if (sb != "fp32" && sb != "fp16")
      fail(where, ": table '", q.table, "': scale_bias '", sb, "' (fp32 or fp16)");
    q.fp16 = sb == "fp16";
    for (const QuantEntry& o : out)
      if (o.table == q.table) fail(where, ": table '", q.table, "' is listed twice");
    out.push_back(q);
  }
  return out;
}

}  // namespace

std::vector<model::QuantizedTable> read_quantized_tables(const json& meta, const std::string& path,
                                                         model::Model& model) {
  const std::vector<QuantEntry> entries = quant_entries(meta, path);
  std::vector<model::QuantizedTable> out;
  if (entries.empty()) return out;
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.parameters()) params[name] = t;
  std::vector<io::NamedTensor> targets;
  std::vector<std::array<Tensor, 3>> loaded;
  for (const QuantEntry& e : entries) {
    auto p = params.find(e.table);
    if (p == params.end() || p->second.ndim() != 2)
      fail("tensor file '", path, "': quantized table '", e.table,
           "' is not a table (2-d parameter) of the model");
    model::QuantizedTable q;
    q.name = e.table;
    q.rows.rows = p->second.dim(0);
    q.rows.dim = p->second.dim(1);
    q.rows.bits = e.bits;
    q.rows.fp16 = e.fp16;
    const DType sd = e.fp16 ? DType::F16 : DType::F32;
    std::array<Tensor, 3> t = {
        Tensor::empty({q.rows.rows, q.rows.row_bytes()}, DType::U8, Device::cpu()),
        Tensor::empty({q.rows.rows}, sd, Device::cpu()),
        Tensor::empty({q.rows.rows}, sd, Device::cpu())};
    targets.emplace_back(e.table + ".codes", t[0]);
    targets.emplace_back(e.table + ".qscale", t[1]);
    targets.emplace_back(e.table + ".qbias", t[2]);
    loaded.push_back(t);
    out.push_back(std::move(q));
  }
  io::TensorLoadOptions opts;
  opts.allow_extra = true;  // the parameters, loaded by the caller
  io::load_tensors(path, targets, opts);
  auto values = [](const Tensor& t, bool fp16) {
    if (!fp16) return t.to_vector<float>();
    std::vector<float> v(static_cast<size_t>(t.numel()));
    const auto* b = static_cast<const uint16_t*>(t.raw());
    for (size_t r = 0; r < v.size(); ++r) v[r] = nn::fp16_value(b[r]);
    return v;
  };
  for (size_t k = 0; k < out.size(); ++k) {
    nn::RowQuantRows& q = out[k].rows;
    const auto& [codes, scale, bias] = loaded[k];
    q.codes.resize(static_cast<size_t>(codes.numel()));
    if (!q.codes.empty()) std::memcpy(q.codes.data(), codes.raw(), q.codes.size());
    q.scale = values(scale, q.fp16);
    q.bias = values(bias, q.fp16);
    loaded[k] = {};  // one copy of each table's codes at a time
    nn::check_row_quant(q, "tensor file '" + path + "': quantized table '" + out[k].name + "'");
  }
  return out;
}

}  // namespace dlrec::compress
