#include "dlrec/core/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace dlrec {

ConfigReader::ConfigReader(const json& j, std::string path) : j_(&j), path_(std::move(path)) {
  if (!j.is_object()) fail("config '", path_.empty() ? "<root>" : path_, "' must be an object");
}

std::string ConfigReader::key_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool ConfigReader::has(const std::string& key) const { return j_->contains(key); }

const json& ConfigReader::raw(const std::string& key) {
  known_.insert(key);
  if (!j_->contains(key)) fail("config key '", key_path(key), "' is required");
  return (*j_)[key];
}

double ConfigReader::get_range(const std::string& key, double fallback, double lo, double hi) {
  known_.insert(key);
  if (!j_->contains(key)) return fallback;
  const json& v = (*j_)[key];
  if (!v.is_number()) fail("config key '", key_path(key), "' must be a number, got ", v.dump());
  double d = v.get<double>();
  if (!(d >= lo && d <= hi))
    fail("config key '", key_path(key), "' = ", d, " is out of range [", lo, ", ", hi, "]");
  return d;
}

int64_t ConfigReader::get_int_range(const std::string& key, int64_t fallback, int64_t lo,
                                    int64_t hi) {
  known_.insert(key);
  if (!j_->contains(key)) return fallback;
  const json& v = (*j_)[key];
  if (!v.is_number_integer())
    fail("config key '", key_path(key), "' must be an integer, got ", v.dump());
  int64_t d = v.get<int64_t>();
  if (d < lo || d > hi)
    fail("config key '", key_path(key), "' = ", d, " is out of range [", lo, ", ", hi, "]");
  return d;
}

std::string ConfigReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& choices) {
  std::string v = get<std::string>(key, fallback);
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    std::string list;
    for (auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    std::string near = nearest_name(v, choices);
    fail("config key '", key_path(key), "' = '", v, "' is not one of: ", list,
         near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  return v;
}

ConfigReader ConfigReader::child(const std::string& key) {
  const json& v = raw(key);
  if (!v.is_object()) fail("config key '", key_path(key), "' must be an object");
  return ConfigReader(v, key_path(key));
}

void ConfigReader::finish() const {
  std::vector<std::string> known(known_.begin(), known_.end());
  for (auto it = j_->begin(); it != j_->end(); ++it) {
    if (known_.count(it.key())) continue;
    std::string near = nearest_name(it.key(), known);
    fail("unknown config key '", key_path(it.key()), "'",
         near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
}

std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    // Levenshtein distance, case-insensitive.
    std::vector<size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= name.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        bool same = std::tolower(name[i - 1]) == std::tolower(c[j - 1]);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
      }
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  if (best_d == std::string::npos || best_d > std::max<size_t>(3, name.size() / 2)) return "";
  return best;
}

namespace {
// Thrown from the parse callback; carries no JSON state, so unwinding frees the partial value.
struct JsonLimitHit {
  std::string reason;
};
}  // namespace

json parse_json(std::string_view text, const std::string& what, const JsonLimits& limits) {
  int64_t values = 0;
  // nlohmann's parser is iterative, but the values it builds are destroyed, copied and dumped
  // recursively; the callback stops the parse before a deep or huge value exists.
  auto limit = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= limits.max_depth)
      throw JsonLimitHit{"nesting deeper than " + std::to_string(limits.max_depth) + " levels"};
    if (event == json::parse_event_t::value || event == json::parse_event_t::object_start ||
        event == json::parse_event_t::array_start) {
      if (++values > limits.max_values)
        throw JsonLimitHit{"more than " + std::to_string(limits.max_values) + " values"};
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit);
  } catch (const JsonLimitHit& e) {
    fail(what, " is refused: ", e.reason);
  } catch (const json::parse_error& e) {
    fail(what, " is not valid JSON: ", e.what());
  }
}

std::string dump_json_safe(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read '", path, "'");
  return parse_json(ss.str(), "'" + path + "'");
}

}  // namespace dlrec
