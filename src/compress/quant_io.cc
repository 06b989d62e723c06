// The compress.quantize config section and INT8 layers in weight files (docs/COMPRESSION.md).
#include <cmath>
#include <cstring>
#include <set>

#include "dlrec/compress/qat.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/nn/param.h"

namespace dlrec::compress {

namespace {

std::vector<std::string> read_names(ConfigReader& r, const std::string& key, bool allow_empty) {
  const json v = r.get<json>(key, json::array());
  if (!v.is_array() || (!allow_empty && v.empty()))
    fail(r.key_path(key), ": must be a ", allow_empty ? "" : "non-empty ", "list of names, got ",
         dump_json_safe(v));
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const json& n : v) {
    if (!n.is_string() || n.get<std::string>().empty())
      fail(r.key_path(key), ": every entry must be a name, got ", dump_json_safe(n));
    if (!seen.insert(n.get<std::string>()).second)
      fail(r.key_path(key), ": '", n.get<std::string>(), "' is listed twice");
    out.push_back(n.get<std::string>());
  }
  return out;
}

}  // namespace

void QuantizeConfig::validate(const std::string& where) const {
  if (calibration != "max" && calibration != "percentile" && calibration != "entropy")
    fail(where, ".calibration: unknown method '", calibration,
         "' (choose max, percentile or entropy)");
  if (!(percentile > 50.0 && percentile < 100.0))
    fail(where, ".percentile: must be in (50, 100) (e.g. 99.9, 99.99, 99.999), got ", percentile);
  if (batches < 1 || batch_size < 1)
    fail(where, ": batches and batch_size must be >= 1, got ", batches, " and ", batch_size);
}

QuantizeConfig QuantizeConfig::from_json(ConfigReader& r) {
  QuantizeConfig c;
  c.on = true;
  r.get_choice("dtype", "int8", {"int8"});
  const json layers = r.get<json>("layers", json("all_dense"));
  if (layers.is_string()) {
    if (layers.get<std::string>() != "all_dense")
      fail(r.key_path("layers"), ": must be \"all_dense\" or a list of layer names, got ",
           dump_json_safe(layers));
  } else {
    c.all_dense = false;
    c.layers = read_names(r, "layers", false);
  }
  c.skip = read_names(r, "skip", true);
  c.calibration = r.get<std::string>("calibration", c.calibration);
  c.percentile = r.get<double>("percentile", c.percentile);
  c.batches = r.get_int_range("batches", c.batches, 1, 1 << 20);
  c.batch_size = r.get_int_range("batch_size", c.batch_size, 1, 1 << 24);
  r.finish();
  c.validate(r.path());
  return c;
}

json QuantizeConfig::to_json() const {
  json j = {{"dtype", "int8"},          {"skip", skip},       {"calibration", calibration},
            {"percentile", percentile}, {"batches", batches}, {"batch_size", batch_size}};
  j["layers"] = all_dense ? json("all_dense") : json(layers);
  return j;
}

std::vector<model::NamedTensor> quant_tensors(model::Model& model, json& meta_quant) {
  std::vector<model::NamedTensor> out;
  json names = json::array();
  for (const auto& w : model.prunable_weights()) {
    if (!w.param || !w.param->quant) continue;
    // A QAT layer exports as the INT8 layer of its weight and running input range.
    std::shared_ptr<Int8Linear> from_qat;
    if (const auto* t = dynamic_cast<const QatLinear*>(w.param->quant.get()))
      from_qat = t->to_int8(w.weight);
    const auto* q =
        from_qat ? from_qat.get() : dynamic_cast<const Int8Linear*>(w.param->quant.get());
    DLREC_CHECK(q, "export: '", w.name, "' holds a calibration observer, not an INT8 layer");
    const QuantWeight& qw = q->weight();
    Tensor bytes = Tensor::empty({qw.out, qw.in}, DType::U8, Device::cpu());
    std::memcpy(bytes.raw(), qw.q.data(), qw.q.size());
    Tensor ws = Tensor::empty({qw.out}, DType::F32, Device::cpu());
    std::memcpy(ws.raw(), qw.scales.data(), qw.scales.size() * sizeof(float));
    Tensor xs = Tensor::empty({1}, DType::F32, Device::cpu());
    xs.data<float>()[0] = q->x_scale();
    out.emplace_back(w.name + ".qweight", bytes);
    out.emplace_back(w.name + ".wscale", ws);
    out.emplace_back(w.name + ".xscale", xs);
    names.push_back(w.name);
  }
  meta_quant = names.empty() ? json() : json{{"dtype", "int8"}, {"weights", names}};
  return out;
}

std::vector<model::NamedTensor> prepare_quant(const json& meta, const std::string& path,
                                              model::Model& model) {
  std::vector<model::NamedTensor> out;
  if (!meta.is_object() || !meta.contains("quant")) return out;
  const json& q = meta.at("quant");
  if (!q.is_object() || q.value("dtype", json()) != json("int8") || !q.contains("weights") ||
      !q.at("weights").is_array())
    fail("tensor file '", path,
         "': meta key 'quant' must be {\"dtype\": \"int8\", \"weights\": [...]}");
  if (model.device().is_cuda())
    fail("'", path,
         "' holds INT8 layers, which run on the CPU engine only in this build (serve it on a "
         "CPU instance)");
  std::map<std::string, Tensor> weights;
  for (const auto& w : model.prunable_weights()) weights[w.name] = w.weight;
  for (const json& n : q.at("weights")) {
    if (!n.is_string()) fail("tensor file '", path, "': meta 'quant.weights' holds a non-name");
    auto it = weights.find(n.get<std::string>());
    if (it == weights.end())
      fail("tensor file '", path, "': INT8 record of '", n.get<std::string>(),
           "', which is not an mlp or cross weight of the model");
    const int64_t rows = it->second.dim(0), cols = it->second.dim(1);
    out.emplace_back(it->first + ".qweight", Tensor::empty({rows, cols}, DType::U8, Device::cpu()));
    out.emplace_back(it->first + ".wscale", Tensor::empty({rows}, DType::F32, Device::cpu()));
    out.emplace_back(it->first + ".xscale", Tensor::empty({1}, DType::F32, Device::cpu()));
  }
  return out;
}

void apply_loaded_quant(const std::vector<model::NamedTensor>& loaded, const std::string& path,
                        model::Model& model) {
  if (loaded.empty()) return;
  std::map<std::string, Tensor> t(loaded.begin(), loaded.end());
  for (const auto& w : model.prunable_weights()) {
    auto qi = t.find(w.name + ".qweight");
    if (qi == t.end()) continue;
    const Tensor& bytes = qi->second;
    const Tensor& ws = t.at(w.name + ".wscale");
    const Tensor& xs = t.at(w.name + ".xscale");
    QuantWeight qw;
    qw.out = bytes.dim(0);
    qw.in = bytes.dim(1);
    qw.q.resize(static_cast<size_t>(bytes.numel()));
    std::memcpy(qw.q.data(), bytes.raw(), qw.q.size());
    for (size_t k = 0; k < qw.q.size(); ++k)
      if (qw.q[k] == -128)
        fail("tensor file '", path, "': tensor '", qi->first, "' element ", k,
             " is -128 (INT8 weights are symmetric: -127 .. 127)");
    qw.scales = ws.to_vector<float>();
    for (size_t j = 0; j < qw.scales.size(); ++j)
      if (!(std::isfinite(qw.scales[j]) && qw.scales[j] > 0))
        fail("tensor file '", path, "': tensor '", w.name, ".wscale' element ", j, " is ",
             qw.scales[j], " (a scale is finite and > 0)");
    const float x_scale = xs.data<float>()[0];
    if (!(std::isfinite(x_scale) && x_scale > 0))
      fail("tensor file '", path, "': tensor '", w.name, ".xscale' is ", x_scale,
           " (a scale is finite and > 0)");
    w.param->quant = std::make_shared<Int8Linear>(std::move(qw), x_scale);
  }
}

}  // namespace dlrec::compress
