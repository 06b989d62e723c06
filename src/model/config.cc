// Strict JSON (de)serialisation of the run configuration (docs/CONFIG.md).
#include <cmath>
#include <limits>

#include "dlrec/core/device.h"
#include "dlrec/dist/planner.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/model.h"

namespace dlrec::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A list of positive layer sizes (may be empty only when allow_empty).
std::vector<int64_t> read_sizes(ConfigReader& r, const std::string& key, bool allow_empty) {
  const json& v = r.raw(key);
  if (!v.is_array())
    fail("config key '", r.key_path(key), "' must be a list of layer sizes, got ", v.dump());
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<int64_t>() <= 0 ||
        v[i].get<int64_t>() > (int64_t{1} << 20))
      fail("config key '", r.key_path(key), "[", i,
           "]' must be a positive integer layer size (at most 1048576), got ", v[i].dump());
    out.push_back(v[i].get<int64_t>());
  }
  if (out.empty() && !allow_empty)
    fail("config key '", r.key_path(key), "' must list at least one layer");
  return out;
}

double positive(ConfigReader& r, const std::string& key, double fallback, double hi) {
  const double v = r.get_range(key, fallback, 0.0, hi);
  if (!(v > 0)) fail("config key '", r.key_path(key), "' must be > 0, got ", v);
  return v;
}

}  // namespace

ModelConfig ModelConfig::from_json(ConfigReader& r) {
  ModelConfig c;
  std::vector<std::string> archs = preset_archs();
  archs.insert(archs.begin() + 1, "graph");
  c.arch = r.get_choice("arch", c.arch, archs);
  c.layers = r.get<json>("layers", json());
  if (c.arch == "graph")
    GraphSpec::parse(c.layers, r.key_path("layers"));  // the layout-free checks, early
  else if (!c.layers.is_null())
    fail("config key '", r.key_path("layers"), "' needs \"arch\": \"graph\"");
  c.embedding_dim = r.get_int_range("embedding_dim", c.embedding_dim, 1, 1 << 16);
  if (r.has("bottom_mlp")) c.bottom_mlp = read_sizes(r, "bottom_mlp", true);
  r.get<json>("bottom_mlp", json());  // mark known even when absent
  if (r.has("top_mlp")) c.top_mlp = read_sizes(r, "top_mlp", false);
  r.get<json>("top_mlp", json());
  if (c.top_mlp.back() != 1)
    fail("config key '", r.key_path("top_mlp"), "' must end in 1 (the logit), got ",
         c.top_mlp.back());
  c.interaction = r.get_choice("interaction", c.interaction, {"dot", "cat"});
  c.pooling = r.get_choice("pooling", c.pooling, {"sum", "mean"});
  for (const char* k : {"cross_layers", "cross_low_rank"})
    if (r.has(k) && c.arch != "dcnv2")
      fail("config key '", r.key_path(k), "' needs \"arch\": \"dcnv2\"");
  c.cross_layers = r.get_int_range("cross_layers", c.cross_layers, 1, 1024);
  c.cross_low_rank = r.get_int_range("cross_low_rank", c.cross_low_rank, 0, 1 << 20);
  r.finish();
  return c;
}

json ModelConfig::to_json() const {
  json j = {{"arch", arch},       {"embedding_dim", embedding_dim}, {"bottom_mlp", bottom_mlp},
            {"top_mlp", top_mlp}, {"interaction", interaction},     {"pooling", pooling}};
  if (arch == "graph") j["layers"] = layers;
  if (arch == "dcnv2") {
    j["cross_layers"] = cross_layers;
    j["cross_low_rank"] = cross_low_rank;
  }
  return j;
}

namespace {

// Below 1 (inclusive range checks cannot say it).
double below_one(ConfigReader& r, const std::string& key, double fallback) {
  const double v = r.get_range(key, fallback, 0.0, 1.0);
  if (!(v < 1.0)) fail("config key '", r.key_path(key), "' must be in [0, 1), got ", v);
  return v;
}

const std::vector<std::string> kOptimizerTypes = {"sgd", "adagrad", "rowwise_adagrad", "adam",
                                                  "ftrl"};

// The keys an optimizer of one group of parameters has (the dense section and the embedding
// override alike); fallbacks are c's current values.
void read_optimizer_fields(ConfigReader& r, OptimizerConfig& c) {
  c.type = r.get_choice("type", c.type, kOptimizerTypes);
  c.lr = positive(r, "lr", c.lr, 1e6);
  c.momentum = below_one(r, "momentum", c.momentum);
  c.nesterov = r.get<bool>("nesterov", c.nesterov);
  if (c.nesterov && !(c.momentum > 0))
    fail("config key '", r.key_path("nesterov"), "' needs '", r.key_path("momentum"),
         "' > 0, got ", c.momentum);
  c.adagrad_eps = r.get_range("adagrad_eps", c.adagrad_eps, 0.0, 1.0);
  c.adagrad_init = r.get_range("adagrad_init", c.adagrad_init, 0.0, 1e6);
  c.beta1 = below_one(r, "beta1", c.beta1);
  c.beta2 = below_one(r, "beta2", c.beta2);
  c.adam_eps = positive(r, "adam_eps", c.adam_eps, 1.0);
  c.ftrl_beta = r.get_range("ftrl_beta", c.ftrl_beta, 0.0, 1e6);
  c.ftrl_l1 = r.get_range("ftrl_l1", c.ftrl_l1, 0.0, 1e6);
  c.ftrl_l2 = r.get_range("ftrl_l2", c.ftrl_l2, 0.0, 1e6);
  if (c.type == "ftrl" && c.ftrl_beta == 0 && c.ftrl_l2 == 0)
    fail("config key '", r.key_path("ftrl_beta"),
         "' must be > 0 when ftrl_l2 is 0 (the first FTRL step would divide by zero)");
  c.clip_value = r.get_range("clip_value", c.clip_value, 0.0, 1e30);
}

json optimizer_fields_json(const OptimizerConfig& c) {
  return {{"type", c.type},  {"lr", c.lr},
          {"momentum", c.momentum},   {"nesterov", c.nesterov},
          {"adagrad_eps", c.adagrad_eps}, {"adagrad_init", c.adagrad_init},
          {"beta1", c.beta1},         {"beta2", c.beta2},
          {"adam_eps", c.adam_eps},   {"ftrl_beta", c.ftrl_beta},
          {"ftrl_l1", c.ftrl_l1},     {"ftrl_l2", c.ftrl_l2},
          {"clip_value", c.clip_value}};
}

}  // namespace

OptimizerConfig OptimizerConfig::from_json(ConfigReader& r) {
  OptimizerConfig c;
  read_optimizer_fields(r, c);
  c.embedding_lr = r.get_range("embedding_lr", c.embedding_lr, -kInf, 1e6);
  if (c.embedding_lr < 0) c.embedding_lr = -1;
  c.weight_decay = r.get_range("weight_decay", c.weight_decay, 0.0, 1e6);
  c.clip_norm = r.get_range("clip_norm", c.clip_norm, 0.0, 1e30);
  c.loss_scale_init = r.get_range("loss_scale_init", c.loss_scale_init, 1.0, 1e38);
  c.loss_scale_growth_interval = r.get_int_range(
      "loss_scale_growth_interval", c.loss_scale_growth_interval, 1, (int64_t{1} << 31) - 1);
  if (r.has("schedule")) {
    ConfigReader sr = r.child("schedule");
    c.schedule = LrSchedule::from_json(sr);
  }
  r.get<json>("schedule", json());
  if (r.has("embedding")) {
    ConfigReader er = r.child("embedding");
    if (er.has("lr") && c.embedding_lr >= 0)
      fail("config keys '", r.key_path("embedding_lr"), "' and '", er.key_path("lr"),
           "' both set the embedding learning rate; keep one");
    OptimizerConfig e = c;  // missing keys: the section's values
    e.lr = c.embedding_lr_value();
    e.embedding_lr = -1;
    e.weight_decay = 0;  // never applied to embeddings
    e.clip_norm = 0;     // embedding gradients are not part of the global norm
    e.embedding.clear();
    read_optimizer_fields(er, e);
    er.finish();
    c.embedding.push_back(std::move(e));
  }
  r.get<json>("embedding", json());
  r.finish();
  return c;
}

OptimizerConfig OptimizerConfig::embedding_config() const {
  if (!embedding.empty()) return embedding.front();
  OptimizerConfig e = *this;
  e.lr = embedding_lr_value();
  e.embedding_lr = -1;
  e.weight_decay = 0;
  e.clip_norm = 0;
  return e;
}

double OptimizerConfig::embedding_lr_value() const {
  if (!embedding.empty()) return embedding.front().lr;
  return embedding_lr >= 0 ? embedding_lr : lr;
}

LrSchedule LrSchedule::from_json(ConfigReader& r) {
  constexpr int64_t kBig = int64_t{1} << 40;
  LrSchedule s;
  s.warmup_steps = r.get_int_range("warmup_steps", s.warmup_steps, 0, kBig);
  s.decay_start_step = r.get_int_range("decay_start_step", s.decay_start_step, 0, kBig);
  s.decay_steps = r.get_int_range("decay_steps", s.decay_steps, -1, kBig);
  s.decay_power = r.get_range("decay_power", s.decay_power, 0.0, 100.0);
  s.end_factor = r.get_range("end_factor", s.end_factor, 0.0, 1.0);
  s.decay_every = r.get_int_range("decay_every", s.decay_every, 0, kBig);
  s.gamma = r.get_range("gamma", s.gamma, 0.0, 1.0);
  if (s.decay_every > 0 && s.decay_steps != 0)
    fail("config keys '", r.key_path("decay_every"), "' (step decay) and '",
         r.key_path("decay_steps"), "' (polynomial decay) cannot both be set");
  r.finish();
  return s;
}

json LrSchedule::to_json() const {
  return {{"warmup_steps", warmup_steps},
          {"decay_start_step", decay_start_step},
          {"decay_steps", decay_steps},
          {"decay_power", decay_power},
          {"end_factor", end_factor},
          {"decay_every", decay_every},
          {"gamma", gamma}};
}

double LrSchedule::factor(int64_t step, int64_t total_steps) const {
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step < decay_start_step) return 1.0;
  if (decay_every > 0)
    return std::pow(gamma, static_cast<double>((step - decay_start_step) / decay_every));
  if (decay_steps == 0) return 1.0;
  const double span = decay_steps > 0 ? static_cast<double>(decay_steps)
                                      : static_cast<double>(total_steps - decay_start_step);
  const double t = span > 0 ? std::min(1.0, (step - decay_start_step) / span) : 1.0;
  return end_factor + (1.0 - end_factor) * std::pow(1.0 - t, decay_power);
}

json OptimizerConfig::to_json() const {
  json j = optimizer_fields_json(*this);
  j["embedding_lr"] = embedding_lr;
  j["weight_decay"] = weight_decay;
  j["clip_norm"] = clip_norm;
  j["loss_scale_init"] = loss_scale_init;
  j["loss_scale_growth_interval"] = loss_scale_growth_interval;
  j["schedule"] = schedule.to_json();
  if (!embedding.empty()) j["embedding"] = optimizer_fields_json(embedding.front());
  return j;
}

TrainConfig TrainConfig::from_json(ConfigReader& r) {
  TrainConfig c;
  constexpr int64_t kBig = int64_t{1} << 40;
  c.batch_size = r.get_int_range("batch_size", c.batch_size, 1, 1 << 24);
  c.eval_batch_size = r.get_int_range("eval_batch_size", c.eval_batch_size, 1, 1 << 24);
  c.epochs = static_cast<int>(r.get_int_range("epochs", c.epochs, 1, 1 << 20));
  c.max_steps = r.get_int_range("max_steps", c.max_steps, -1, kBig);
  if (c.max_steps == 0) fail("config key '", r.key_path("max_steps"), "' must be -1 or >= 1");
  c.eval_every = r.get_int_range("eval_every", c.eval_every, 0, kBig);
  c.log_every = r.get_int_range("log_every", c.log_every, 0, kBig);
  c.checkpoint_every = r.get_int_range("checkpoint_every", c.checkpoint_every, 0, kBig);
  if (r.has("seed")) {
    const json& s = r.raw("seed");
    if (!s.is_number_integer() || (s.is_number_integer() && !s.is_number_unsigned() &&
                                   s.get<int64_t>() < 0))
      fail("config key '", r.key_path("seed"), "' must be a non-negative integer, got ", s.dump());
    c.seed = s.get<uint64_t>();
  }
  r.get<json>("seed", json());
  c.device = r.get<std::string>("device", c.device);
  try {
    Device::parse(c.device);
  } catch (const Error& e) {
    fail("config key '", r.key_path("device"), "': ", e.what());
  }
  c.precision = r.get_choice("precision", c.precision, {"fp32", "tf32", "bf16", "fp16"});
  c.loss = r.get_choice("loss", c.loss, {"bce", "mse"});
  c.deterministic = r.get<bool>("deterministic", c.deterministic);
  r.finish();
  return c;
}

json TrainConfig::to_json() const {
  json j = {{"batch_size", batch_size},
            {"eval_batch_size", eval_batch_size},
            {"epochs", epochs},
            {"max_steps", max_steps},
            {"eval_every", eval_every},
            {"log_every", log_every},
            {"checkpoint_every", checkpoint_every},
            {"seed", seed},
            {"device", device},
            {"precision", precision}};
  if (loss != "bce") j["loss"] = loss;  // absent: bce (run.json of older builds unchanged)
  if (deterministic) j["deterministic"] = true;  // absent: false (older builds read it)
  return j;
}

RunConfig RunConfig::from_json(const json& j) {
  ConfigReader root(j, "");
  RunConfig c;
  if (root.has("model")) {
    ConfigReader r = root.child("model");
    c.model = ModelConfig::from_json(r);
  }
  if (root.has("optimizer")) {
    ConfigReader r = root.child("optimizer");
    c.optimizer = OptimizerConfig::from_json(r);
  }
  if (root.has("train")) {
    ConfigReader r = root.child("train");
    c.train = TrainConfig::from_json(r);
  }
  if (root.has("sharding")) {
    ConfigReader r = root.child("sharding");
    dist::read_planner_options(r, 65536);  // the keys and ranges; owners against the job later
    c.sharding = root.raw("sharding");
  }
  root.get<json>("model", json());
  root.get<json>("optimizer", json());
  root.get<json>("train", json());
  c.compress = root.get<json>("compress", json());
  if (!c.compress.is_null() && !c.compress.is_object())
    fail("compress: must be an object (docs/COMPRESSION.md)");
  root.finish();
  return c;
}

RunConfig RunConfig::load(const std::string& path) {
  const json j = read_json_file(path);
  try {
    return from_json(j);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

void RunConfig::override_train(const json& values) {
  json j = train.to_json();
  for (const auto& [key, value] : values.items()) j[key] = value;
  ConfigReader r(j, "train");
  train = TrainConfig::from_json(r);
}

json RunConfig::to_json() const {
  json j = {
      {"model", model.to_json()}, {"optimizer", optimizer.to_json()}, {"train", train.to_json()}};
  if (!sharding.is_null()) j["sharding"] = sharding;
  if (!compress.is_null()) j["compress"] = compress;
  return j;
}

}  // namespace dlrec::model
