// Schema of raw tabular input (Criteo TSV, CSV): which columns exist, in which order, and what
// each one is. Categorical values are read as 64-bit keys: with `cat_encoding = hex` the field
// is parsed as a hexadecimal number (Criteo's 32-bit hashes); with `string` the field's bytes
// are hashed (hash_category). Multi-hot columns hold several values separated by `list_sep`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dlrec/core/config.h"

namespace dlrec::io {

enum class ColumnKind { Label, Dense, Categorical, Skip };
enum class CatEncoding { Hex, String };

struct ColumnSpec {
  std::string name;
  ColumnKind kind = ColumnKind::Skip;
  bool multi_hot = false;  // categorical only
};

struct Schema {
  std::vector<ColumnSpec> columns;  // in file order (or matched by name when `header`)
  char delimiter = '\t';
  bool header = false;   // first line holds column names; columns are matched by name
  char list_sep = ',';   // separator inside a multi-hot field
  CatEncoding cat_encoding = CatEncoding::Hex;
  // Text inputs: lines starting with `comment` (when not empty) are not rows; the first
  // `skip_lines` lines of each file (before the header) are skipped whatever they hold. A UTF-8
  // byte order mark at the start of a file is always dropped.
  std::string comment;
  int64_t skip_lines = 0;

  // Criteo's layout: label, I1..I<num_dense>, C1..C<num_cat>, tab-separated, hex categories.
  static Schema criteo(int num_dense = 13, int num_cat = 26);
  // {"format": "criteo"|"csv", "delimiter", "header", "list_sep", "cat_encoding", "comment",
  //  "skip_lines",
  //  "columns": [{"name", "kind": "label"|"dense"|"categorical"|"skip", "multi_hot"}]}
  // "criteo" defaults: tab, no header, hex, columns = criteo(num_dense, num_cat) where the
  // optional keys "num_dense"/"num_cat" (13/26) apply when "columns" is absent. "csv" defaults:
  // ',', header, string encoding, list_sep '|', "columns" required. Separators are one
  // character or "tab". Unknown keys, duplicate column names, two labels, and list_sep equal to
  // the delimiter when a column is multi-hot are errors.
  static Schema from_json(const json& j);
  json to_json() const;

  int num_dense() const;
  int num_cat() const;
  bool has_label() const;
  std::vector<std::string> dense_names() const;
  std::vector<std::string> cat_names() const;
  std::vector<bool> cat_multi_hot() const;
};

// 64-bit hash of a categorical string value (stable across platforms and versions; the
// algorithm is described in schema.cc and its constants are frozen).
uint64_t hash_category(std::string_view s);

}  // namespace dlrec::io
