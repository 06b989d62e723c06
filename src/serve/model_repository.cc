#include "dlrec/serve/model_repository.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "dlrec/serve/request_error.h"

namespace dlrec::serve {

namespace fs = std::filesystem;

namespace {

// Version directory names: decimal, positive, no sign or leading zeros.
bool parse_version(const std::string& s, int64_t& v) {
  if (s.empty() || s.size() > 18 || s[0] == '0') return false;
  v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  return v > 0;
}

}  // namespace

ModelRepository::ModelRepository(std::string root, BatchingConfig defaults,
                                 std::shared_ptr<StatsRegistry> stats)
    : root_(std::move(root)), defaults_(std::move(defaults)), stats_(std::move(stats)) {
  DLREC_CHECK(fs::is_directory(root_), "model repository '", root_, "' is not a directory");
}

ModelRepository::~ModelRepository() = default;

std::vector<std::string> ModelRepository::models_on_disk() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    std::string n = e.path().filename().string();
    if (e.is_directory(ec) && model_name_problem(n).empty() && n[0] != '.') out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> ModelRepository::load_all() {
  std::vector<std::string> errors;
  for (const auto& n : models_on_disk()) {
    try {
      load(n);
    } catch (const std::exception& e) {
      errors.push_back(n + ": " + e.what());
    }
  }
  return errors;
}

void ModelRepository::load(const std::string& name) {
  check_model_name(name);
  std::lock_guard<std::mutex> load_lock(load_mu_);
  const fs::path dir = fs::path(root_) / name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    request_fail(Status::NotFound, "model '", name, "' is not in the repository");
  auto record_failure = [&](const std::string& why) {
    std::lock_guard<std::mutex> lk(mu_);
    failures_[name] = why;
  };
  try {
    ModelConfig cfg;
    cfg.batching = defaults_;
    if (fs::exists(dir / "config.json")) {
      try {
        cfg = ModelConfig::from_json(read_json_file((dir / "config.json").string()), defaults_,
                                     dir.string());
      } catch (const RequestError&) {
        throw;
      } catch (const Error& e) {
        request_fail(Status::InvalidArgument, "model '", name, "': config.json: ", e.what());
      }
    }
    std::vector<int64_t> available;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      int64_t v = 0;
      if (e.is_directory(ec) && parse_version(e.path().filename().string(), v))
        available.push_back(v);
    }
    std::vector<int64_t> chosen = cfg.version_policy.select(available);
    if (chosen.empty())
      request_fail(Status::InvalidArgument, "model '", name,
                   "' has no version to serve under its version policy (versions on disk: ",
                   available.size(), ")");
    auto versions = std::make_shared<VersionMap>();
    for (int64_t v : chosen) {
      try {
        (*versions)[v] = std::make_shared<ServedModel>(name, v, (dir / std::to_string(v)).string(),
                                                       cfg.batching,
                                                       stats_->get(name, std::to_string(v)),
                                                       cfg.instances);
      } catch (const RequestError&) {
        throw;
      } catch (const std::exception& e) {
        request_fail(Status::InvalidArgument, "model '", name, "' version ", v, ": ", e.what());
      }
    }
    std::shared_ptr<const VersionMap> old;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto& slot = models_[name];
      old = std::move(slot);
      slot = std::move(versions);
      failures_.erase(name);
    }
    // `old` is released here (or by the last request still using one of its versions).
  } catch (const std::exception& e) {
    record_failure(e.what());
    throw;
  }
}

void ModelRepository::unload(const std::string& name) {
  check_model_name(name);
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::vector<std::weak_ptr<ServedModel>> going;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) {
      std::error_code ec;
      if (!fs::is_directory(fs::path(root_) / name, ec))
        request_fail(Status::NotFound, "model '", name, "' is not in the repository");
      return;  // unloading a model that is not loaded is not an error (as in Triton)
    }
    for (const auto& [v, m] : *it->second) going.push_back(m);
    models_.erase(it);  // the versions go once the requests still using them finish
    unloading_.insert(name);
    failures_[name] = "unloading";
  }
  // Until the versions are gone (their requests in flight answered, their batchers stopped) the
  // model is UNAVAILABLE (503), not unknown (404): a client retries a 503. Bounded, so that a
  // stuck request cannot hold an unload forever.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto gone = [&] {
    for (const auto& w : going)
      if (!w.expired()) return false;
    return true;
  };
  while (!gone() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::lock_guard<std::mutex> lk(mu_);
  unloading_.erase(name);
  failures_[name] = "unloaded";
}

std::shared_ptr<ServedModel> ModelRepository::get(const std::string& name,
                                                  const std::string& version) const {
  check_model_name(name);
  int64_t v = 0;
  if (!version.empty() && !parse_version(version, v))
    request_fail(Status::InvalidArgument, "invalid model version '", version.substr(0, 40),
                 "' (versions are positive integers)");
  std::shared_ptr<const VersionMap> versions;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) {
      if (unloading_.count(name))
        request_fail(Status::Unavailable, "model '", name, "' is being unloaded");
      request_fail(Status::NotFound, "model '", name, "' is not loaded");
    }
    versions = it->second;
  }
  if (version.empty()) return versions->rbegin()->second;
  auto it = versions->find(v);
  if (it == versions->end())
    request_fail(Status::NotFound, "model '", name, "' version ", v, " is not loaded");
  return it->second;
}

bool ModelRepository::ready(const std::string& name, const std::string& version) const {
  try {
    return get(name, version) != nullptr;
  } catch (const RequestError&) {
    return false;
  }
}

std::vector<int64_t> ModelRepository::loaded_versions(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int64_t> out;
  auto it = models_.find(name);
  if (it != models_.end())
    for (const auto& [v, m] : *it->second) out.push_back(v);
  return out;
}

std::vector<RepositoryEntry> ModelRepository::index(bool ready_only) const {
  std::vector<std::string> names = models_on_disk();
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [n, m] : models_)
    if (!std::binary_search(names.begin(), names.end(), n)) names.push_back(n);
  std::sort(names.begin(), names.end());
  std::vector<RepositoryEntry> out;
  for (const auto& n : names) {
    auto it = models_.find(n);
    if (it != models_.end()) {
      for (const auto& [v, m] : *it->second) out.push_back({n, std::to_string(v), "READY", ""});
    } else if (!ready_only) {
      auto f = failures_.find(n);
      out.push_back({n, "", "UNAVAILABLE", f == failures_.end() ? "not loaded" : f->second});
    }
  }
  return out;
}

}  // namespace dlrec::serve
