// JoinExternal: side tables read, indexed, embedded in workflow.json and joined onto chunks.
#include "etl/join_external.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/parquet.h"

namespace dlrec::etl {
namespace {

std::string hex_key(uint64_t k) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(k));
  return buf;
}

const io::ColumnSpec* find_column(const io::Schema& s, const std::string& name) {
  for (const auto& c : s.columns)
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<std::string> names_of(const io::Schema& s) {
  std::vector<std::string> v;
  for (const auto& c : s.columns) v.push_back(c.name);
  return v;
}

std::string near_hint(const std::string& name, const std::vector<std::string>& names) {
  const std::string n = nearest_name(name, names);
  return n.empty() ? "" : " (did you mean '" + n + "'?)";
}

// Reads every row of one file into `all`; `lines` receives each row's source line (text) or
// 1-based row (Parquet), for messages.
void read_whole(const std::string& path, const io::Schema& schema, io::RawChunk& all,
                std::vector<int64_t>& lines) {
  std::unique_ptr<io::ChunkReader> reader = io::open_reader({path}, schema, io::ReadOptions{});
  io::RawChunk c;
  all.reset(schema.num_dense(), schema.num_cat());
  while (reader->next(c)) {
    for (int64_t r = 0; r < c.rows; ++r) lines.push_back(c.first_line + r);
    all.append(c);
  }
}

}  // namespace

SideTable SideTable::from_config(const json& spec, const std::string& where,
                                 const std::string& base_dir, const io::Schema& columns) {
  SideTable t;
  ConfigReader r(spec, where);
  t.path_ = r.require<std::string>("path");
  t.on_ = r.require<std::string>("on");
  const json schema_json = r.has("schema") ? r.raw("schema") : json(nullptr);
  const json keep = r.has("columns") ? r.raw("columns") : json(nullptr);
  r.finish();
  if (schema_json.is_null())
    fail("'", where, "': a side table needs its \"schema\" (like an input's: format, columns)");
  try {
    t.schema_ = io::Schema::from_json(schema_json);
  } catch (const Error& e) {
    fail("'", where, ".schema': ", e.what());
  }
  const io::ColumnSpec* key = find_column(t.schema_, t.on_);
  if (!key)
    fail("'", where, "': the side table's schema has no key column '", t.on_, "'",
         near_hint(t.on_, names_of(t.schema_)));
  if (key->kind != io::ColumnKind::Categorical || key->multi_hot)
    fail("'", where, "': the side table's key column '", t.on_,
         "' must be a one-hot categorical column");
  std::vector<std::string> kept;
  if (!keep.is_null()) {
    if (!keep.is_array()) fail("'", where, ".columns' must be a list of column names");
    for (const auto& k : keep) {
      if (!k.is_string()) fail("'", where, ".columns' must be a list of column names");
      kept.push_back(k.get<std::string>());
    }
  }
  for (const auto& name : kept) {
    const io::ColumnSpec* c = find_column(t.schema_, name);
    if (!c || name == t.on_ ||
        (c->kind != io::ColumnKind::Dense && c->kind != io::ColumnKind::Categorical))
      fail("'", where, ".columns': '", name,
           "' is not a dense or categorical column of the side table besides its key",
           c ? "" : near_hint(name, names_of(t.schema_)));
  }
  for (auto& c : t.schema_.columns) {
    if (c.kind == io::ColumnKind::Label)
      fail("'", where, "': the side table's column '", c.name,
           "' is a label; a side table adds features: declare it dense (or skip)");
    const bool listed = kept.empty() || std::find(kept.begin(), kept.end(), c.name) != kept.end();
    if (c.name != t.on_ && !listed) c.kind = io::ColumnKind::Skip;  // not read at all
  }
  for (const auto& c : t.schema_.columns)
    if (c.name != t.on_ &&
        (c.kind == io::ColumnKind::Dense || c.kind == io::ColumnKind::Categorical))
      t.added_.push_back(c);
  t.check_against(where, columns);  // before reading: a wrong config fails fast
  std::string path = t.path_;
  if (!base_dir.empty() && !path.empty() && path[0] != '/')
    path = base_dir + (base_dir.back() == '/' ? "" : "/") + path;
  io::RawChunk all;
  std::vector<int64_t> lines;
  try {
    if (!file_exists(path)) fail("cannot read '", path, "': no such file");
    const std::string bytes = read_file(path);
    t.file_bytes_ = static_cast<int64_t>(bytes.size());
    t.crc32c_ = crc32c(bytes.data(), bytes.size());
    read_whole(path, t.schema_, all, lines);
  } catch (const Error& e) {
    fail("'", where, "': side table '", path, "': ", e.what());
  }
  // Split the key column from the added ones.
  t.rows_ = all.rows;
  int k = 0;
  for (const auto& c : t.schema_.columns) {
    if (c.kind == io::ColumnKind::Dense) {
      t.dense_cols_.push_back(c.name);
    } else if (c.kind == io::ColumnKind::Categorical) {
      if (c.name == t.on_) {
        const auto& off = all.cat_offsets[k];
        for (int64_t row = 0; row < all.rows; ++row) {
          if (off[row + 1] == off[row])
            fail("'", where, "': side table '", path, "' line ", lines[row], ": the key '", t.on_,
                 "' is empty");
          t.keys_.push_back(all.cat_values[k][off[row]]);
        }
      } else {
        t.cat_cols_.push_back(c.name);
        t.cat_values_.push_back(std::move(all.cat_values[k]));
        t.cat_offsets_.push_back(std::move(all.cat_offsets[k]));
      }
      ++k;
    }
  }
  t.dense_ = std::move(all.dense);
  t.build_index("'" + where + "': side table '" + path + "'", lines);
  return t;
}

void SideTable::check_against(const std::string& where, const io::Schema& columns) const {
  const io::ColumnSpec* key = find_column(columns, on_);
  if (!key)
    fail("'", where, "': the join key '", on_, "' is not a column of the input schema",
         near_hint(on_, names_of(columns)));
  if (key->kind != io::ColumnKind::Categorical || key->multi_hot)
    fail("'", where, "': the join key '", on_,
         "' must be a one-hot categorical column of the input schema");
  if (schema_.cat_encoding != columns.cat_encoding)
    fail("'", where,
         "': the side table's cat_encoding differs from the input's; keys would "
         "not match (give both the same \"cat_encoding\")");
  for (const auto& c : added_)
    if (find_column(columns, c.name))
      fail("'", where, "': the side table's column '", c.name,
           "' clashes with a column of the same name in the input (or an earlier side table); "
           "declare one of them \"skip\" or list the columns to join in \"columns\"");
}

void SideTable::build_index(const std::string& where, const std::vector<int64_t>& lines) {
  index_.clear();
  index_.reserve(static_cast<size_t>(rows_));
  for (int64_t row = 0; row < rows_; ++row) {
    auto ins = index_.emplace(keys_[row], row);
    if (!ins.second) {
      auto line = [&](int64_t i) {
        return lines.empty() ? "row " + std::to_string(i) : "line " + std::to_string(lines[i]);
      };
      fail(where, ": duplicate key ", hex_key(keys_[row]), " in column '", on_, "' (",
           line(ins.first->second), " and ", line(row), "); a side table holds one row per key");
    }
  }
}

SideTable SideTable::from_json(const json& j, const std::string& where, const io::Schema& columns) {
  SideTable t;
  ConfigReader r(j, where);
  t.path_ = r.require<std::string>("path");
  t.file_bytes_ = r.require<int64_t>("file_bytes");
  t.crc32c_ = static_cast<uint32_t>(r.get_int_range("crc32c", 0, 0, UINT32_MAX));
  t.on_ = r.require<std::string>("on");
  t.schema_ = io::Schema::from_json(r.raw("schema"));
  t.rows_ = r.get_int_range("rows", 0, 0, std::numeric_limits<int32_t>::max());
  t.keys_ = r.require<std::vector<uint64_t>>("keys");
  const json& dense = r.raw("dense");
  const json& cat = r.raw("categorical");
  r.finish();
  auto bad = [&](const std::string& what) { fail("'", where, "': ", what); };
  if (static_cast<int64_t>(t.keys_.size()) != t.rows_) bad("'keys' does not hold 'rows' keys");
  if (!dense.is_array() || !cat.is_array()) bad("'dense' and 'categorical' must be lists");
  for (const auto& c : t.schema_.columns)
    if (c.name != t.on_ &&
        (c.kind == io::ColumnKind::Dense || c.kind == io::ColumnKind::Categorical))
      t.added_.push_back(c);
  std::vector<std::vector<float>> cols;
  for (size_t i = 0; i < dense.size(); ++i) {
    ConfigReader c(dense[i], where + ".dense[" + std::to_string(i) + "]");
    t.dense_cols_.push_back(c.require<std::string>("name"));
    const json& v = c.raw("values");
    c.finish();
    if (!v.is_array() || static_cast<int64_t>(v.size()) != t.rows_)
      bad("dense column '" + t.dense_cols_.back() + "' does not hold 'rows' values");
    std::vector<float> col;
    for (const auto& x : v) {
      // Checked as a double first: a value outside float's range would not convert.
      const double d = x.is_number() ? x.get<double>() : 0.0;
      if (!x.is_null() && (!x.is_number() || !(std::abs(d) <= std::numeric_limits<float>::max())))
        bad("dense column '" + t.dense_cols_.back() + "' holds a non-number or a value out of "
            "float's range: " + dump_json_safe(x));
      col.push_back(x.is_null() ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(d));
    }
    cols.push_back(std::move(col));
  }
  t.dense_.resize(static_cast<size_t>(t.rows_) * cols.size());
  for (int64_t row = 0; row < t.rows_; ++row)
    for (size_t k = 0; k < cols.size(); ++k) t.dense_[row * cols.size() + k] = cols[k][row];
  for (size_t i = 0; i < cat.size(); ++i) {
    ConfigReader c(cat[i], where + ".categorical[" + std::to_string(i) + "]");
    t.cat_cols_.push_back(c.require<std::string>("name"));
    t.cat_values_.push_back(c.require<std::vector<uint64_t>>("values"));
    t.cat_offsets_.push_back(c.require<std::vector<int64_t>>("offsets"));
    c.finish();
    const auto& off = t.cat_offsets_.back();
    bool ok = static_cast<int64_t>(off.size()) == t.rows_ + 1 && off[0] == 0 &&
              off.back() == static_cast<int64_t>(t.cat_values_.back().size());
    for (size_t k = 1; ok && k < off.size(); ++k) ok = off[k] >= off[k - 1];
    if (!ok) bad("categorical column '" + t.cat_cols_.back() + "' has malformed offsets");
  }
  // The columns must be the schema's added ones, kind by kind, in order.
  std::vector<std::string> want_d, want_c;
  for (const auto& c : t.added_)
    (c.kind == io::ColumnKind::Dense ? want_d : want_c).push_back(c.name);
  if (want_d != t.dense_cols_ || want_c != t.cat_cols_)
    bad("the stored columns do not match the side table's schema");
  t.check_against(where, columns);
  t.build_index("'" + where + "'", {});
  return t;
}

json SideTable::to_json() const {
  json dense = json::array(), cat = json::array();
  for (int j = 0; j < num_dense(); ++j) {
    json v = json::array();
    for (int64_t row = 0; row < rows_; ++row) {
      const float x = dense_[row * num_dense() + j];
      v.push_back(std::isnan(x) ? json(nullptr) : json(x));
    }
    dense.push_back({{"name", dense_cols_[j]}, {"values", std::move(v)}});
  }
  for (int j = 0; j < num_cat(); ++j)
    cat.push_back(
        {{"name", cat_cols_[j]}, {"values", cat_values_[j]}, {"offsets", cat_offsets_[j]}});
  return {{"path", path_}, {"file_bytes", file_bytes_},   {"crc32c", crc32c_},
          {"on", on_},     {"schema", schema_.to_json()}, {"rows", rows_},
          {"keys", keys_}, {"dense", std::move(dense)},   {"categorical", std::move(cat)}};
}

int64_t SideTable::memory_bytes() const {
  int64_t b = static_cast<int64_t>(keys_.size() * sizeof(uint64_t) + dense_.size() * sizeof(float));
  for (const auto& v : cat_values_) b += static_cast<int64_t>(v.size() * sizeof(uint64_t));
  for (const auto& v : cat_offsets_) b += static_cast<int64_t>(v.size() * sizeof(int64_t));
  // The index: one node (key, row, next pointer, allocation overhead) and one bucket per key.
  b += static_cast<int64_t>(index_.size() * 40 + index_.bucket_count() * sizeof(void*));
  return b;
}

json SideTable::summary() const {
  std::vector<std::string> names;
  for (const auto& c : added_) names.push_back(c.name);
  return {{"path", path_},
          {"on", on_},
          {"rows", rows_},
          {"columns", names},
          {"memory_bytes", memory_bytes()}};
}

void JoinPlan::add(SideTable t, io::Schema& schema) {
  int cat_index = 0;
  int key = -1;
  for (const auto& c : schema.columns) {
    if (c.kind != io::ColumnKind::Categorical) continue;
    if (c.name == t.on()) key = cat_index;
    ++cat_index;
  }
  DLREC_CHECK(key >= 0, "JoinPlan: key column '", t.on(), "' not found");
  for (const auto& c : t.added()) schema.columns.push_back(c);
  key_col_.push_back(key);
  tables_.push_back(std::move(t));
}

void JoinPlan::from_config(const json& list, const std::string& base_dir, io::Schema& schema) {
  in_dense_ = schema.num_dense();
  in_cat_ = schema.num_cat();
  if (list.is_null()) return;
  if (!list.is_array())
    fail(
        "config key 'join_external' must be a list of side tables ({\"path\", \"on\", "
        "\"schema\"})");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "join_external[" + std::to_string(i) + "]";
    add(SideTable::from_config(list[i], where, base_dir, schema), schema);
  }
}

void JoinPlan::from_json(const json& list, io::Schema& schema) {
  in_dense_ = schema.num_dense();
  in_cat_ = schema.num_cat();
  if (list.is_null()) return;
  if (!list.is_array()) fail("workflow: 'join_external' must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "workflow.join_external[" + std::to_string(i) + "]";
    add(SideTable::from_json(list[i], where, schema), schema);
  }
}

json JoinPlan::to_json() const {
  json j = json::array();
  for (const auto& t : tables_) j.push_back(t.to_json());
  return j;
}

json JoinPlan::summary() const {
  json j = json::array();
  for (const auto& t : tables_) j.push_back(t.summary());
  return j;
}

int64_t JoinPlan::memory_bytes() const {
  int64_t b = 0;
  for (const auto& t : tables_) b += t.memory_bytes();
  return b;
}

void JoinPlan::apply(const io::RawChunk& in, io::RawChunk& out) const {
  DLREC_CHECK(in.num_dense == in_dense_ && in.num_cat == in_cat_, "JoinExternal: the chunk has ",
              in.num_dense, " dense and ", in.num_cat, " categorical columns, the input schema ",
              in_dense_, " and ", in_cat_);
  int nd = in_dense_, nc = in_cat_;
  for (const auto& t : tables_) {
    nd += t.num_dense();
    nc += t.num_cat();
  }
  const int64_t rows = in.rows;
  out.reset(nd, nc);
  out.rows = rows;
  out.first_line = in.first_line;
  out.label = in.label;
  out.dense.resize(static_cast<size_t>(rows * nd));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(in.dense.begin() + r * in_dense_, in.dense.begin() + (r + 1) * in_dense_,
              out.dense.begin() + r * nd);
  for (int c = 0; c < in_cat_; ++c) {
    out.cat_values[c] = in.cat_values[c];
    out.cat_offsets[c] = in.cat_offsets[c];
  }
  std::vector<int64_t> side_row(static_cast<size_t>(rows));
  int d0 = in_dense_, c0 = in_cat_;
  for (size_t i = 0; i < tables_.size(); ++i) {
    const SideTable& t = tables_[i];
    const auto& kv = out.cat_values[key_col_[i]];
    const auto& ko = out.cat_offsets[key_col_[i]];
    for (int64_t r = 0; r < rows; ++r)  // a missing key joins nothing: missing values
      side_row[r] = ko[r + 1] > ko[r] ? t.find(kv[ko[r]]) : -1;
    constexpr float kMissing = std::numeric_limits<float>::quiet_NaN();
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < t.num_dense(); ++j)
        out.dense[r * nd + d0 + j] = side_row[r] < 0 ? kMissing : t.dense(side_row[r], j);
    for (int j = 0; j < t.num_cat(); ++j) {
      auto& vals = out.cat_values[c0 + j];
      auto& offs = out.cat_offsets[c0 + j];
      offs.reserve(static_cast<size_t>(rows + 1));
      for (int64_t r = 0; r < rows; ++r) {
        if (side_row[r] >= 0)
          vals.insert(vals.end(), t.cat_begin(side_row[r], j), t.cat_end(side_row[r], j));
        offs.push_back(static_cast<int64_t>(vals.size()));
      }
    }
    d0 += t.num_dense();
    c0 += t.num_cat();
  }
}

}  // namespace dlrec::etl
