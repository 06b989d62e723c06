#include "dlrec/io/schema.h"

#include <cstring>
#include <set>

#include "dlrec/core/error.h"

namespace dlrec::io {
namespace {

const char* kind_name(ColumnKind k) {
  switch (k) {
    case ColumnKind::Label: return "label";
    case ColumnKind::Dense: return "dense";
    case ColumnKind::Categorical: return "categorical";
    case ColumnKind::Skip: return "skip";
  }
  return "skip";
}

ColumnKind parse_kind(const std::string& s) {
  if (s == "label") return ColumnKind::Label;
  if (s == "dense") return ColumnKind::Dense;
  if (s == "categorical") return ColumnKind::Categorical;
  return ColumnKind::Skip;
}

// A one-character separator given as a JSON string: "\t", ",", "|", or the word "tab".
char read_separator(ConfigReader& r, const std::string& key, char fallback) {
  std::string s = r.get<std::string>(key, std::string(1, fallback));
  if (s == "tab") return '\t';
  if (s.size() != 1)
    fail("config key '", r.key_path(key), "' must be one character (or \"tab\"), got '", s, "'");
  char c = s[0];
  if (c == '\n' || c == '\r' || c == '"')
    fail("config key '", r.key_path(key), "' cannot be a newline or a double quote");
  return c;
}

}  // namespace

Schema Schema::criteo(int num_dense, int num_cat) {
  DLREC_CHECK(num_dense >= 0 && num_cat >= 0, "Schema::criteo: negative column count");
  Schema s;
  s.columns.push_back({"label", ColumnKind::Label, false});
  for (int i = 1; i <= num_dense; ++i)
    s.columns.push_back({"I" + std::to_string(i), ColumnKind::Dense, false});
  for (int i = 1; i <= num_cat; ++i)
    s.columns.push_back({"C" + std::to_string(i), ColumnKind::Categorical, false});
  s.delimiter = '\t';
  s.header = false;
  s.list_sep = ',';
  s.cat_encoding = CatEncoding::Hex;
  return s;
}

Schema Schema::from_json(const json& j) {
  ConfigReader r(j, "schema");
  const std::string format = r.get_choice("format", "criteo", {"criteo", "csv"});
  const bool criteo = format == "criteo";
  Schema s;
  if (criteo) {
    const int nd = static_cast<int>(r.get_int_range("num_dense", 13, 0, 10000));
    const int nc = static_cast<int>(r.get_int_range("num_cat", 26, 0, 10000));
    s = Schema::criteo(nd, nc);
  } else {
    s.delimiter = ',';
    s.header = true;
    s.cat_encoding = CatEncoding::String;
  }
  if (!criteo) s.list_sep = '|';  // ',' is taken by the delimiter
  s.delimiter = read_separator(r, "delimiter", s.delimiter);
  s.header = r.get<bool>("header", s.header);
  s.list_sep = read_separator(r, "list_sep", s.list_sep);
  s.cat_encoding = r.get_choice("cat_encoding", criteo ? "hex" : "string", {"hex", "string"}) ==
                           "hex"
                       ? CatEncoding::Hex
                       : CatEncoding::String;
  s.comment = r.get<std::string>("comment", "");
  if (s.comment.find_first_of("\r\n") != std::string::npos)
    fail("config key '", r.key_path("comment"), "' must not hold a line break");
  if (!s.comment.empty() && s.comment[0] == '"')
    fail("config key '", r.key_path("comment"), "' must not start with '\"' (it opens a quoted "
         "field)");
  s.skip_lines = r.get_int_range("skip_lines", 0, 0, int64_t{1} << 40);
  const json cols = r.get<json>("columns", json());
  if (!cols.is_null()) {
    if (criteo && (r.has("num_dense") || r.has("num_cat")))
      fail("config key 'schema.columns' cannot be combined with 'num_dense'/'num_cat'");
    if (!cols.is_array() || cols.empty())
      fail("config key 'schema.columns' must be a non-empty array of column objects");
    s.columns.clear();
    for (size_t i = 0; i < cols.size(); ++i) {
      ConfigReader c(cols[i], "schema.columns[" + std::to_string(i) + "]");
      ColumnSpec spec;
      spec.name = c.require<std::string>("name");
      spec.kind = parse_kind(c.get_choice("kind", "skip", {"label", "dense", "categorical", "skip"}));
      spec.multi_hot = c.get<bool>("multi_hot", false);
      c.finish();
      if (spec.multi_hot && spec.kind != ColumnKind::Categorical)
        fail("config key '", c.key_path("multi_hot"), "': only categorical columns can be multi-hot");
      s.columns.push_back(spec);
    }
  } else if (!criteo) {
    fail("config key 'schema.columns' is required when format is 'csv'");
  }
  r.finish();

  // Validation that the keys alone cannot express.
  std::set<std::string> names;
  int labels = 0;
  for (const auto& c : s.columns) {
    if (c.name.empty()) fail("schema: a column has an empty name");
    if (!names.insert(c.name).second) fail("schema: column name '", c.name, "' appears twice");
    if (c.kind == ColumnKind::Label) ++labels;
  }
  if (labels > 1) fail("schema: more than one label column");
  for (const auto& c : s.columns)
    if (c.multi_hot && s.list_sep == s.delimiter)
      fail("schema: multi-hot column '", c.name, "' needs list_sep to differ from the delimiter (",
           "both are '", s.list_sep, "')");
  return s;
}

json Schema::to_json() const {
  json j;
  // Everything is written explicitly, so from_json(to_json()) reproduces the schema whatever
  // the format's defaults are.
  j["format"] = (delimiter == '\t' && !header) ? "criteo" : "csv";
  j["delimiter"] = std::string(1, delimiter);
  j["header"] = header;
  j["list_sep"] = std::string(1, list_sep);
  j["cat_encoding"] = cat_encoding == CatEncoding::Hex ? "hex" : "string";
  if (!comment.empty()) j["comment"] = comment;  // absent: none (older workflow.json unchanged)
  if (skip_lines > 0) j["skip_lines"] = skip_lines;
  json cols = json::array();
  for (const auto& c : columns) {
    json o;
    o["name"] = c.name;
    o["kind"] = kind_name(c.kind);
    if (c.multi_hot) o["multi_hot"] = true;
    cols.push_back(o);
  }
  j["columns"] = cols;
  return j;
}

int Schema::num_dense() const {
  int n = 0;
  for (const auto& c : columns) n += c.kind == ColumnKind::Dense;
  return n;
}

int Schema::num_cat() const {
  int n = 0;
  for (const auto& c : columns) n += c.kind == ColumnKind::Categorical;
  return n;
}

bool Schema::has_label() const {
  for (const auto& c : columns)
    if (c.kind == ColumnKind::Label) return true;
  return false;
}

std::vector<std::string> Schema::dense_names() const {
  std::vector<std::string> v;
  for (const auto& c : columns)
    if (c.kind == ColumnKind::Dense) v.push_back(c.name);
  return v;
}

std::vector<std::string> Schema::cat_names() const {
  std::vector<std::string> v;
  for (const auto& c : columns)
    if (c.kind == ColumnKind::Categorical) v.push_back(c.name);
  return v;
}

std::vector<bool> Schema::cat_multi_hot() const {
  std::vector<bool> v;
  for (const auto& c : columns)
    if (c.kind == ColumnKind::Categorical) v.push_back(c.multi_hot);
  return v;
}

// hash_category: a 64-bit hash designed for this project (version 1; changing it changes every
// vocabulary built from string categories, so the constants below are frozen).
//
//   h  = 0x243F6A8885A308D3 ^ (len * M1)            (the length separates "a" from "a\0")
//   for each 8-byte word w (little-endian; the last partial word zero-padded):
//     w = rotl(w * M1, 31) * M2                      (spread every input bit over the word)
//     h = rotl(h ^ w, 27) * 5 + 0x52DCE729           (chain: order of words matters)
//   finalizer: h ^= h >> 33; h *= F1; h ^= h >> 29; h *= F2; h ^= h >> 32   (avalanche)
//
// Words are read as little-endian on every platform, so the value is the same everywhere.
namespace {
constexpr uint64_t kM1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd
constexpr uint64_t kM2 = 0xD6E8FEB86659FD93ull;
constexpr uint64_t kF1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kF2 = 0x94D049BB133111EBull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  w = __builtin_bswap64(w);
#endif
  return w;
}

inline uint64_t mix_word(uint64_t h, uint64_t w) {
  w = rotl(w * kM1, 31) * kM2;
  return rotl(h ^ w, 27) * 5 + 0x52DCE729ull;
}
}  // namespace

uint64_t hash_category(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x243F6A8885A308D3ull ^ (static_cast<uint64_t>(n) * kM1);
  while (n >= 8) {
    h = mix_word(h, load_le64(p));
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    for (size_t i = 0; i < n; ++i) w |= static_cast<uint64_t>(p[i]) << (8 * i);
    h = mix_word(h, w);
  }
  h ^= h >> 33;
  h *= kF1;
  h ^= h >> 29;
  h *= kF2;
  h ^= h >> 32;
  return h;
}

}  // namespace dlrec::io
