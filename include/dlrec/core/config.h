// Strict reading of JSON configuration into typed structs.
//
// ConfigReader wraps one JSON object. Each get()/require() marks the key as known; finish()
// throws if the object holds a key nobody asked for, naming it with its full path and the
// nearest known key ("unknown key 'model.optimizer.lerning_rate' (did you mean
// 'learning_rate'?)"). Type and range errors name the key too.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dlrec/core/error.h"

namespace dlrec {

using json = nlohmann::json;

class ConfigReader {
 public:
  // `path` is the dotted location of this object, used in messages ("" for the root).
  ConfigReader(const json& j, std::string path);

  bool has(const std::string& key) const;
  template <class T>
  T get(const std::string& key, const T& fallback);
  template <class T>
  T require(const std::string& key);
  // Numeric value with inclusive bounds.
  double get_range(const std::string& key, double fallback, double lo, double hi);
  int64_t get_int_range(const std::string& key, int64_t fallback, int64_t lo, int64_t hi);
  // String restricted to a set of choices.
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices);
  ConfigReader child(const std::string& key);  // requires an object under key
  const json& raw(const std::string& key);     // marks key as known, returns the value
  std::string key_path(const std::string& key) const;
  const std::string& path() const { return path_; }
  // Throws on any key not asked for.
  void finish() const;

 private:
  const json* j_;
  std::string path_;
  std::set<std::string> known_;
};

// The closest string by edit distance (empty if none within distance 3 or half the length).
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

// Limits on JSON read from anywhere outside the program (files, requests). Every JSON text
// dlrec reads goes through parse_json, so that a hostile document cannot exhaust the stack
// (nesting) or memory (values) before a typed reader looks at it.
struct JsonLimits {
  int max_depth = 64;                  // nesting of objects/arrays; the root is depth 1
  int64_t max_values = int64_t{1} << 27;  // values of any kind (each array element counts)
};

// Parses `text`; errors name `what` (a file name, "request body", ...), the byte offset and
// the reason (syntax, invalid UTF-8, depth or value-count limit). Never returns a partial value.
json parse_json(std::string_view text, const std::string& what, const JsonLimits& limits = {});

// Serialises `j` without throwing on invalid UTF-8 in its strings (replaced by U+FFFD): for
// values that carry text from outside (a request path, a file name) into an error body.
std::string dump_json_safe(const json& j, int indent = -1);

// Reads and parses a JSON file (parse_json's limits); errors name the file and the position.
json read_json_file(const std::string& path);

namespace detail {
// Whether JSON value v converts to the integer type I without undefined behaviour: nlohmann
// converts a float with a plain cast, which is undefined outside I's range (found by fuzzing:
// a shard header with "cardinalities": [5e300]). Integers and integral floats inside the range
// pass; anything else is refused by the caller with the key's name.
template <class I>
bool json_fits_integer(const json& v) {
  if (!v.is_number_float()) return true;
  const double d = v.get<double>();
  const double hi = std::ldexp(1.0, std::numeric_limits<I>::digits);  // exclusive
  const double lo = std::numeric_limits<I>::is_signed ? -hi : 0.0;
  return std::isfinite(d) && d == std::floor(d) && d >= lo && d < hi;
}
template <class T>
struct IntegerVector : std::false_type {};
template <class U, class A>
struct IntegerVector<std::vector<U, A>>
    : std::integral_constant<bool, std::is_integral<U>::value && !std::is_same<U, bool>::value> {};
}  // namespace detail

template <class T>
T ConfigReader::get(const std::string& key, const T& fallback) {
  known_.insert(key);
  if (!j_->contains(key)) return fallback;
  const json& v = (*j_)[key];
  bool fits = true;
  if constexpr (std::is_integral<T>::value && !std::is_same<T, bool>::value) {
    fits = detail::json_fits_integer<T>(v);
  } else if constexpr (detail::IntegerVector<T>::value) {
    if (v.is_array())
      for (const json& e : v) fits = fits && detail::json_fits_integer<typename T::value_type>(e);
  }
  if (!fits)
    fail("config key '", key_path(key), "' must hold integers in range, got ", v.dump());
  try {
    return v.template get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("config key '", key_path(key), "' has the wrong type: ", (*j_)[key].dump());
  }
}

template <class T>
T ConfigReader::require(const std::string& key) {
  if (!j_->contains(key)) fail("config key '", key_path(key), "' is required");
  return get<T>(key, T{});
}

}  // namespace dlrec
