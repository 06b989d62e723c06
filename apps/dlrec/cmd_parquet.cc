// dlrec parquet dump | parquet write: Parquet files <-> JSON, for inspecting files and for the
// pyarrow interop tests (tests/python/test_parquet_interop.py).
//
// JSON conventions (both commands): one value per row; null for a null value or list; lists
// as arrays; FLOAT/DOUBLE non-finite values as the strings "NaN", "Infinity", "-Infinity";
// binary (non-UTF-8) BYTE_ARRAY columns as lower-case hex strings; unsigned 64-bit columns as
// unsigned numbers.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "dlrec/core/config.h"
#include "dlrec/core/error.h"
#include "dlrec/io/parquet.h"

namespace dlrec::cli {
namespace {

std::string to_hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : s) {
    h.push_back(d[c >> 4]);
    h.push_back(d[c & 15]);
  }
  return h;
}

std::string from_hex(const std::string& h, const std::string& where) {
  auto v = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    fail(where, ": '", h, "' is not a hex string");
  };
  if (h.size() % 2) fail(where, ": '", h, "' is not a hex string");
  std::string s;
  for (size_t i = 0; i < h.size(); i += 2) s.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
  return s;
}

json value_json(const io::ParquetField& f, const io::ParquetColumnData& c, int64_t s) {
  if (!c.present(s)) return nullptr;
  switch (f.type) {
    case io::ParquetType::Boolean: return c.ints[s] != 0;
    case io::ParquetType::Int32:
    case io::ParquetType::Int64:
      if (f.is_unsigned) return static_cast<uint64_t>(c.ints[s]);
      return c.ints[s];
    case io::ParquetType::Float:
    case io::ParquetType::Double: {
      const double d = c.reals[s];
      if (std::isnan(d)) return "NaN";
      if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
      return d;
    }
    case io::ParquetType::ByteArray:
      return f.utf8 ? json(c.strings[s]) : json(to_hex(c.strings[s]));
  }
  return nullptr;
}

const char* type_word(const io::ParquetField& f) {
  switch (f.type) {
    case io::ParquetType::Boolean: return "bool";
    case io::ParquetType::Int32: return f.is_unsigned ? "uint32" : "int32";
    case io::ParquetType::Int64: return f.is_unsigned ? "uint64" : "int64";
    case io::ParquetType::Float: return "float";
    case io::ParquetType::Double: return "double";
    case io::ParquetType::ByteArray: return f.utf8 ? "string" : "binary";
  }
  return "?";
}

int dump(const std::string& path, bool schema_only) {
  io::ParquetFile file(path);
  json head = {{"num_rows", file.num_rows()},
               {"row_groups", file.num_row_groups()},
               {"created_by", file.created_by()}};
  json fields = json::array();
  for (size_t i = 0; i < file.fields().size(); ++i) {
    const auto& f = file.fields()[i];
    json j = {{"name", f.name}, {"type", type_word(f)}, {"nullable", f.nullable},
              {"list", f.list}};
    if (!file.unsupported_reason(static_cast<int>(i)).empty())
      j["unsupported"] = file.unsupported_reason(static_cast<int>(i));
    fields.push_back(j);
  }
  head["fields"] = fields;
  std::string out = head.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (schema_only) return 0;
  const auto& fl = file.fields();
  for (int g = 0; g < file.num_row_groups(); ++g) {
    std::vector<io::ParquetColumnData> cols;
    for (size_t i = 0; i < fl.size(); ++i) cols.push_back(file.read_column(g, static_cast<int>(i)));
    for (int64_t r = 0; r < file.row_group_rows(g); ++r) {
      json row = json::object();
      for (size_t i = 0; i < fl.size(); ++i) {
        const auto& c = cols[i];
        if (!fl[i].list) {
          row[fl[i].name] = value_json(fl[i], c, r);
        } else if (!c.row_present(r)) {
          row[fl[i].name] = nullptr;
        } else {
          json a = json::array();
          for (int64_t s = c.offsets[r]; s < c.offsets[r + 1]; ++s)
            a.push_back(value_json(fl[i], c, s));
          row[fl[i].name] = a;
        }
      }
      out = row.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
  }
  return 0;
}

// Appends one JSON value to a column's slots.
void put_value(const io::ParquetField& f, const json& v, io::ParquetColumnData& c,
               const std::string& where) {
  if (v.is_null()) {
    c.valid.push_back(0);
    if (f.type == io::ParquetType::Float || f.type == io::ParquetType::Double)
      c.reals.push_back(0);
    else if (f.type == io::ParquetType::ByteArray)
      c.strings.emplace_back();
    else
      c.ints.push_back(0);
    return;
  }
  c.valid.push_back(1);
  switch (f.type) {
    case io::ParquetType::Boolean:
      if (!v.is_boolean()) fail(where, ": expected true/false");
      c.ints.push_back(v.get<bool>() ? 1 : 0);
      return;
    case io::ParquetType::Int32:
    case io::ParquetType::Int64:
      if (!v.is_number_integer()) fail(where, ": expected an integer, got ", v.dump());
      c.ints.push_back(v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>())
                                              : v.get<int64_t>());
      return;
    case io::ParquetType::Float:
    case io::ParquetType::Double:
      if (v.is_string()) {
        const std::string s = v.get<std::string>();
        if (s == "NaN") c.reals.push_back(std::nan(""));
        else if (s == "Infinity") c.reals.push_back(HUGE_VAL);
        else if (s == "-Infinity") c.reals.push_back(-HUGE_VAL);
        else fail(where, ": expected a number, got '", s, "'");
        return;
      }
      if (!v.is_number()) fail(where, ": expected a number, got ", v.dump());
      c.reals.push_back(v.get<double>());
      return;
    case io::ParquetType::ByteArray:
      if (!v.is_string()) fail(where, ": expected a string, got ", v.dump());
      c.strings.push_back(f.utf8 ? v.get<std::string>() : from_hex(v.get<std::string>(), where));
      return;
  }
}

int write(const std::string& from, const std::string& out, const std::string& codec,
          bool dictionary, int64_t row_group_rows, int64_t page_rows) {
  const json j = read_json_file(from);
  if (!j.is_object() || !j.contains("fields") || !j.contains("columns"))
    fail(from, ": expected {\"fields\": [...], \"columns\": {name: [values]}}");
  std::vector<io::ParquetField> fields;
  for (const json& f : j.at("fields")) {
    io::ParquetField pf;
    pf.name = f.at("name").get<std::string>();
    const std::string t = f.at("type").get<std::string>();
    pf.type = io::parse_parquet_type(t);
    pf.utf8 = t != "binary";
    pf.nullable = f.value("nullable", true);
    pf.list = f.value("list", false);
    fields.push_back(pf);
  }
  std::vector<io::ParquetColumnData> cols(fields.size());
  int64_t rows = -1;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields[i];
    const std::string where = from + ": column '" + f.name + "'";
    if (!j.at("columns").contains(f.name)) fail(where, ": no values");
    const json& vals = j.at("columns").at(f.name);
    if (!vals.is_array()) fail(where, ": expected an array");
    auto& c = cols[i];
    c.rows = static_cast<int64_t>(vals.size());
    if (rows >= 0 && rows != c.rows) fail(where, ": ", c.rows, " rows, other columns ", rows);
    rows = c.rows;
    if (f.list) c.offsets.push_back(0);
    for (size_t r = 0; r < vals.size(); ++r) {
      const std::string w = where + " row " + std::to_string(r);
      if (!f.list) {
        put_value(f, vals[r], c, w);
        continue;
      }
      if (vals[r].is_null()) {
        c.row_valid.push_back(0);
      } else {
        if (!vals[r].is_array()) fail(w, ": expected a list or null");
        c.row_valid.push_back(1);
        for (const json& e : vals[r]) put_value(f, e, c, w);
      }
      c.offsets.push_back(static_cast<int64_t>(c.valid.size()));
    }
  }
  io::ParquetWriteOptions o;
  o.codec = io::parse_parquet_codec(codec);
  o.dictionary = dictionary;
  if (row_group_rows > 0) o.row_group_rows = row_group_rows;
  if (page_rows > 0) o.page_rows = page_rows;
  io::write_parquet(out, fields, cols, o);
  return 0;
}

}  // namespace

Runner add_parquet(CLI::App& app) {
  struct Args {
    std::string file, from, out, codec = "snappy";
    bool schema_only = false, dictionary = false;
    int64_t row_group_rows = 0, page_rows = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* p = app.add_subcommand("parquet", "Parquet tools: dump a file as JSON, write one from JSON");
  p->require_subcommand(1);
  CLI::App* d = p->add_subcommand("dump", "Print a Parquet file as JSON lines (schema line first)");
  d->add_option("file", a->file, "Parquet file")->required();
  d->add_flag("--schema-only", a->schema_only, "Print only the first line (schema, row counts)");
  CLI::App* w = p->add_subcommand("write", "Write a Parquet file from JSON");
  w->add_option("--from-json", a->from,
                "JSON {\"fields\": [{name, type, nullable, list}], \"columns\": {name: [...]}}")
      ->required();
  w->add_option("--out", a->out, "Parquet file to write")->required();
  w->add_option("--codec", a->codec, "none, snappy (default) or zstd");
  w->add_flag("--dictionary", a->dictionary, "Dictionary-encode the columns");
  w->add_option("--row-group-rows", a->row_group_rows, "Rows per row group");
  w->add_option("--page-rows", a->page_rows, "Rows per data page");
  return [a, w] {
    if (w->parsed())
      return write(a->from, a->out, a->codec, a->dictionary, a->row_group_rows, a->page_rows);
    return dump(a->file, a->schema_only);
  };
}

}  // namespace dlrec::cli
