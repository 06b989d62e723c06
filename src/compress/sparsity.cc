#include "dlrec/compress/sparsity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace dlrec::compress {

double SparsitySchedule::target(int64_t step) const {
  if (step < start_step) return 0.0;
  if (step >= end_step) return 0.5;
  const double f = static_cast<double>(step - start_step) / (end_step - start_step);
  return 0.5 * (1.0 - std::pow(1.0 - f, 3));
}

bool SparsitySchedule::update_at(int64_t step) const {
  if (step < start_step) return false;
  if (step >= end_step) return step == end_step;
  return (step - start_step) % every == 0;
}

json SparsityConfig::to_json() const {
  json j = {{"pattern", "2:4"}, {"skip_incompatible", skip_incompatible}};
  j["layers"] = all_dense ? json("all_dense") : json(layers);
  if (schedule.on)
    j["schedule"] = {{"start_step", schedule.start_step},
                     {"end_step", schedule.end_step},
                     {"every", schedule.every}};
  return j;
}

CompressConfig CompressConfig::from_json(const json& section) {
  CompressConfig c;
  if (section.is_null()) return c;
  if (!section.is_object()) fail("compress: must be an object");
  ConfigReader root(section, "compress");
  if (root.has("sparsity")) {
    ConfigReader r = root.child("sparsity");
    SparsityConfig& s = c.sparsity;
    s.on = true;
    r.get_choice("pattern", "2:4", {"2:4"});
    const json layers = r.get<json>("layers", json("all_dense"));
    if (layers.is_string()) {
      if (layers.get<std::string>() != "all_dense")
        fail(r.key_path("layers"), ": must be \"all_dense\" or a list of layer names, got ",
             dump_json_safe(layers));
    } else if (layers.is_array() && !layers.empty()) {
      s.all_dense = false;
      std::set<std::string> seen;
      for (const json& l : layers) {
        if (!l.is_string() || l.get<std::string>().empty())
          fail(r.key_path("layers"), ": every entry must be a layer name, got ", dump_json_safe(l));
        if (!seen.insert(l.get<std::string>()).second)
          fail(r.key_path("layers"), ": layer '", l.get<std::string>(), "' is listed twice");
        s.layers.push_back(l.get<std::string>());
      }
    } else {
      fail(r.key_path("layers"), ": must be \"all_dense\" or a non-empty list of layer names, got ",
           dump_json_safe(layers));
    }
    s.skip_incompatible = r.get<bool>("skip_incompatible", false);
    if (r.has("schedule")) {
      ConfigReader q = r.child("schedule");
      SparsitySchedule& sc = s.schedule;
      sc.on = true;
      sc.start_step = q.get_int_range("start_step", 0, 0, int64_t{1} << 50);
      sc.end_step = q.get_int_range("end_step", -1, 0, int64_t{1} << 50);
      sc.every = q.get_int_range("every", 1, 1, int64_t{1} << 50);
      if (!q.has("end_step")) fail(q.key_path("end_step"), ": required");
      if (sc.end_step <= sc.start_step)
        fail(q.key_path("end_step"), ": must be > start_step (", sc.start_step, "), got ",
             sc.end_step);
      q.finish();
    }
    r.finish();
  }
  if (root.has("quantize")) {
    ConfigReader q = root.child("quantize");
    c.quantize = QuantizeConfig::from_json(q);
  }
  if (root.has("qat")) {
    ConfigReader q = root.child("qat");
    c.qat = QatConfig::from_json(q);
  }
  if (root.has("embeddings")) {
    ConfigReader e = root.child("embeddings");
    c.embeddings = EmbeddingQuantConfig::from_json(e);
  }
  if (root.has("distill")) {
    ConfigReader d = root.child("distill");
    c.distill = DistillConfig::from_json(d);
  }
  root.finish();
  return c;
}

json CompressConfig::to_json() const {
  json j = json::object();
  if (sparsity.on) j["sparsity"] = sparsity.to_json();
  if (quantize.on) j["quantize"] = quantize.to_json();
  if (qat.on) j["qat"] = qat.to_json();
  if (distill.on) j["distill"] = distill.to_json();
  if (embeddings.on) j["embeddings"] = embeddings.to_json();
  return j;
}

int64_t compute_mask_2_4(const Tensor& weight, double sparsity, Tensor& mask) {
  DLREC_CHECK(weight.ndim() == 2 && weight.dtype() == DType::F32 && !weight.device().is_cuda(),
              "2:4 mask: the weight must be a 2-d F32 CPU tensor");
  DLREC_CHECK(mask.defined() && mask.shape() == weight.shape() && mask.dtype() == DType::F32,
              "2:4 mask: the mask must be F32 of the weight's shape");
  DLREC_CHECK(sparsity >= 0.0 && sparsity <= 0.5, "2:4 mask: sparsity must be in [0, 0.5], got ",
              sparsity);
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  DLREC_CHECK(cols % 4 == 0, "2:4 mask: the input size ", cols, " is not a multiple of 4");
  const float* w = weight.data<float>();
  float* m = mask.data<float>();
  std::fill(m, m + weight.numel(), 1.f);
  // The 2 pruning candidates of each group: its 2 smallest |w|, the later index first on ties.
  struct Cand {
    float mag;
    int64_t index;
  };
  auto before = [](const Cand& a, const Cand& b) {
    return a.mag != b.mag ? a.mag < b.mag : a.index > b.index;
  };
  std::vector<Cand> cands;
  cands.reserve(static_cast<size_t>(weight.numel() / 2));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols; g += 4) {
      Cand c[4];
      for (int k = 0; k < 4; ++k) c[k] = {std::fabs(w[r * cols + g + k]), r * cols + g + k};
      std::sort(c, c + 4, before);
      cands.push_back(c[0]);
      cands.push_back(c[1]);
    }
  const int64_t want = std::min<int64_t>(static_cast<int64_t>(cands.size()),
                                         std::llround(sparsity * weight.numel()));
  if (want < static_cast<int64_t>(cands.size()))
    std::nth_element(cands.begin(), cands.begin() + want, cands.end(), before);
  for (int64_t i = 0; i < want; ++i) m[cands[i].index] = 0.f;
  return want;
}

Pruner::Pruner(const SparsityConfig& config, model::Model& model) : config_(config), model_(model) {
  DLREC_CHECK(config.on, "Pruner: the config has no sparsity section");
  // The CPU engine and the CUDA graph engine hold masks; a model that cannot lists no weights.
  const std::vector<model::PrunableWeight> all = model.prunable_weights();
  if (all.empty())
    fail("compress.sparsity: the ", model.device().str(),
         " model holds no prunable weights (2:4 masks are for the mlp and cross layers of the "
         "CPU engine and the CUDA graph engine)");
  std::set<std::string> layers_with_weights;
  for (const auto& w : all) layers_with_weights.insert(w.layer);
  if (!config.all_dense)
    for (const std::string& l : config.layers)
      if (!layers_with_weights.count(l))
        fail(
            "compress.sparsity.layers: '", l,
            "' is not an mlp or cross layer of the model (prunable layers: ",
            [&] {
              std::string s;
              for (const auto& n : layers_with_weights) s += (s.empty() ? "" : ", ") + n;
              return s.empty() ? std::string("none") : s;
            }(),
            ")");
  for (const auto& w : all) {
    if (!config.all_dense &&
        std::find(config.layers.begin(), config.layers.end(), w.layer) == config.layers.end())
      continue;
    const int64_t in = w.weight.dim(1);
    if (in % 4 != 0) {
      if (!config.skip_incompatible)
        fail("compress.sparsity: layer '", w.layer, "' weight '", w.name, "' has input size ", in,
             ", not a multiple of 4, so 2:4 cannot prune it (leave the layer out of "
             "compress.sparsity.layers, or set skip_incompatible to keep such weights dense)");
      skipped_.push_back({w.layer, w.name, w.weight.numel(), 0,
                          "input size " + std::to_string(in) + " is not a multiple of 4"});
      continue;
    }
    targets_.push_back(w);
  }
  if (targets_.empty())
    fail("compress.sparsity: no weight to prune (every selected weight was skipped)");
}

std::vector<PruneReport> Pruner::prune(double sparsity) {
  std::vector<PruneReport> out;
  std::map<std::string, Tensor> existing;
  for (auto& [name, t] : model_.masks()) existing[name] = t;
  // The weights as they are now: a GPU model hands out host copies of its weights, so those
  // taken at construction would be the initial values (the CPU engine's share storage).
  std::map<std::string, Tensor> current;
  for (const auto& w : model_.prunable_weights()) current[w.name] = w.weight;
  for (const auto& w : targets_) {
    const Tensor& weight = current.at(w.name);
    auto it = existing.find(w.name + ".mask");
    Tensor mask = it != existing.end() ? it->second
                                       : Tensor::empty(weight.shape(), DType::F32, Device::cpu());
    const int64_t zeros = compute_mask_2_4(weight, sparsity, mask);
    model_.set_mask(w.name, mask);  // zeroes the newly pruned weights
    out.push_back({w.layer, w.name, weight.numel(), zeros, ""});
  }
  return out;
}

void Pruner::before_step(int64_t step) {
  const bool first = !started_;
  started_ = true;
  double sparsity = -1;
  if (config_.schedule.on) {
    // On the first call of a (resumed) run inside or after the ramp, the masks are brought to
    // the schedule's current sparsity; later calls follow the update steps.
    if (config_.schedule.update_at(step) || (first && step > config_.schedule.start_step))
      sparsity = config_.schedule.target(step);
  } else if (first && model_.masks().empty()) {
    sparsity = 0.5;  // fine-tuning from a dense model: one-shot 2:4 before the first step
  }
  if (sparsity < 0) return;
  int64_t zeros = 0, total = 0;
  for (const PruneReport& r : prune(sparsity)) {
    zeros += r.zeroed;
    total += r.numel;
  }
  std::fprintf(stderr, "[compress] step %lld: 2:4 masks at sparsity %.4f (%lld of %lld weights)\n",
               static_cast<long long>(step), total ? static_cast<double>(zeros) / total : 0.0,
               static_cast<long long>(zeros), static_cast<long long>(total));
}

std::unique_ptr<Pruner> make_pruner(const model::RunConfig& config, model::Model& model) {
  const CompressConfig c = CompressConfig::from_json(config.compress);
  if (!c.sparsity.on) return nullptr;
  return std::make_unique<Pruner>(c.sparsity, model);
}

json mask_names(model::Model& model) {
  json names = json::array();
  const std::string suffix = ".mask";
  for (auto& [name, t] : model.masks())
    names.push_back(name.substr(0, name.size() - suffix.size()));
  return names;
}

void prepare_masks(const json& meta, const std::string& path, model::Model& model) {
  if (!meta.is_object() || !meta.contains("masks")) return;
  const json& names = meta.at("masks");
  if (!names.is_array()) fail("tensor file '", path, "': meta key 'masks' is not a list");
  std::map<std::string, Tensor> weights;
  for (const auto& w : model.prunable_weights()) weights[w.name] = w.weight;
  for (const json& n : names) {
    if (!n.is_string()) fail("tensor file '", path, "': meta 'masks' holds a non-name");
    auto it = weights.find(n.get<std::string>());
    if (it == weights.end())
      fail("tensor file '", path, "': mask of '", n.get<std::string>(),
           "', which is not a prunable weight of the model");
    Tensor mask = Tensor::empty(it->second.shape(), DType::F32, Device::cpu());
    std::fill(mask.data<float>(), mask.data<float>() + mask.numel(), 1.f);
    model.set_mask(it->first, mask);
  }
}

void apply_loaded_masks(const std::string& path, model::Model& model) {
  const std::string suffix = ".mask";
  for (auto& [name, mask] : model.masks()) {
    const float* m = mask.data<float>();
    for (int64_t k = 0; k < mask.numel(); ++k)
      if (m[k] != 0.f && m[k] != 1.f)
        fail("tensor file '", path, "': tensor '", name, "' element ", k, " is ", m[k],
             " (a mask holds only 0 and 1)");
    model.set_mask(name.substr(0, name.size() - suffix.size()), mask);
  }
}

}  // namespace dlrec::compress
