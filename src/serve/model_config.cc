#include "dlrec/serve/model_config.h"

#include <algorithm>

#include "dlrec/serve/request_error.h"

namespace dlrec::serve {

int http_status(Status s) {
  switch (s) {
    case Status::InvalidArgument: return 400;
    case Status::NotFound: return 404;
    case Status::ResourceExhausted: return 429;
    case Status::Unavailable: return 503;
    case Status::Internal: break;
  }
  return 500;
}

std::vector<int64_t> VersionPolicy::select(std::vector<int64_t> available) const {
  std::sort(available.begin(), available.end());
  available.erase(std::unique(available.begin(), available.end()), available.end());
  switch (kind) {
    case Kind::All:
      return available;
    case Kind::Latest: {
      size_t n = std::min(available.size(), static_cast<size_t>(std::max<int64_t>(num_versions, 0)));
      return std::vector<int64_t>(available.end() - static_cast<std::ptrdiff_t>(n), available.end());
    }
    case Kind::Specific: {
      std::vector<int64_t> out;
      for (int64_t v : available)
        if (std::find(versions.begin(), versions.end(), v) != versions.end()) out.push_back(v);
      return out;
    }
  }
  return {};
}

int64_t BatchingConfig::preferred_rows() const {
  int64_t p = 0;
  for (int64_t v : preferred_batch_size) p = std::max(p, std::min(v, max_batch_size));
  return p > 0 ? p : max_batch_size;
}

ModelConfig ModelConfig::from_json(const json& j, const BatchingConfig& defaults,
                                   const std::string& model_dir) {
  DLREC_CHECK(j.is_object(), "config.json: expected a JSON object");
  ModelConfig c;
  c.batching = defaults;
  ConfigReader r(j, "");
  if (r.has("version_policy")) {
    ConfigReader p = r.child("version_policy");
    int kinds = 0;
    if (p.has("latest")) {
      ++kinds;
      ConfigReader l = p.child("latest");
      c.version_policy.kind = VersionPolicy::Kind::Latest;
      c.version_policy.num_versions = l.get_int_range("num_versions", 1, 1, 1 << 20);
      l.finish();
    }
    if (p.has("all")) {
      ++kinds;
      ConfigReader a = p.child("all");
      c.version_policy.kind = VersionPolicy::Kind::All;
      a.finish();
    }
    if (p.has("specific")) {
      ++kinds;
      ConfigReader s = p.child("specific");
      c.version_policy.kind = VersionPolicy::Kind::Specific;
      c.version_policy.versions = s.require<std::vector<int64_t>>("versions");
      DLREC_CHECK(!c.version_policy.versions.empty(),
                  "config key 'version_policy.specific.versions' must not be empty");
      for (int64_t v : c.version_policy.versions)
        DLREC_CHECK(v > 0, "config key 'version_policy.specific.versions': versions are positive");
      s.finish();
    }
    DLREC_CHECK(kinds == 1,
                "config key 'version_policy' needs exactly one of 'latest', 'all', 'specific'");
    p.finish();
  }
  c.batching.max_batch_size =
      r.get_int_range("max_batch_size", defaults.max_batch_size, 1, int64_t{1} << 24);
  if (r.has("dynamic_batching")) {
    ConfigReader d = r.child("dynamic_batching");
    c.batching.preferred_batch_size =
        d.get<std::vector<int64_t>>("preferred_batch_size", defaults.preferred_batch_size);
    for (int64_t v : c.batching.preferred_batch_size)
      DLREC_CHECK(v >= 1, "config key 'dynamic_batching.preferred_batch_size': sizes are >= 1");
    c.batching.max_queue_delay_us = d.get_int_range("max_queue_delay_microseconds",
                                                    defaults.max_queue_delay_us, 0, 10000000);
    c.batching.max_queue_size =
        d.get_int_range("max_queue_size", defaults.max_queue_size, 1, int64_t{1} << 24);
    d.finish();
  }
  if (r.has("instance_group")) {
    const json& g = r.raw("instance_group");
    DLREC_CHECK(g.is_array() && g.size() == 1,
                "config key 'instance_group' must be a list of one group (dlrec serves a version "
                "from one kind of device)");
    ConfigReader ig(g[0], "instance_group[0]");
    const std::string kind = ig.get_choice("kind", "KIND_CPU", {"KIND_CPU", "KIND_GPU"});
    c.instances.gpu = kind == "KIND_GPU";
    c.instances.count = ig.get_int_range("count", 1, 1, 64);
    c.instances.gpus = ig.get<std::vector<int64_t>>("gpus", {});
    for (int64_t d : c.instances.gpus)
      DLREC_CHECK(d >= 0 && d < 1024, "config key 'instance_group[0].gpus': device ", d,
                  " is not a device index");
    DLREC_CHECK(c.instances.gpu || c.instances.gpus.empty(),
                "config key 'instance_group[0].gpus' needs \"kind\": \"KIND_GPU\"");
    if (c.instances.gpu && c.instances.gpus.empty()) c.instances.gpus = {0};
    ig.finish();
  }
  r.get<json>("instance_group", json());
  c.instances.precision = r.get_choice("precision", "fp32", {"fp32", "tf32", "bf16", "fp16"});
  DLREC_CHECK(c.instances.gpu || c.instances.precision == "fp32",
              "config key 'precision': '", c.instances.precision,
              "' needs a GPU instance group (the CPU engine computes in fp32)");
  if (r.has("embedding_store")) {
    c.instances.store = std::make_shared<const store::StoreConfig>(store::StoreConfig::from_json(
        r.raw("embedding_store"), model_dir, "embedding_store"));
    DLREC_CHECK(!c.instances.gpu, "config key 'embedding_store': the tiered store serves CPU ",
                "instances only so far (instance_group kind KIND_CPU)");
  }
  r.finish();
  return c;
}

std::string model_name_problem(const std::string& name) {
  if (name.empty()) return "the model name is empty";
  if (name.size() > 255) return "the model name is longer than 255 bytes";
  if (name == "." || name == "..") return "the model name '" + name + "' is not allowed";
  for (unsigned char ch : name) {
    if (ch == '/' || ch == '\\') return "the model name must not contain '/' or '\\'";
    if (ch < 0x20 || ch == 0x7f) return "the model name contains a control character";
  }
  return "";
}

void check_model_name(const std::string& name) {
  std::string why = model_name_problem(name);
  if (!why.empty()) request_fail(Status::InvalidArgument, "invalid model name: ", why);
}

}  // namespace dlrec::serve
