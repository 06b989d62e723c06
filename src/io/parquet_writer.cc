// Parquet writing: flat and LIST columns, PLAIN or dictionary encoding, data pages V1, one
// dictionary page per dictionary-encoded column chunk, UNCOMPRESSED / SNAPPY / ZSTD.
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "io/parquet_column.h"

namespace dlrec::io {
namespace {

int32_t physical_of(ParquetType t) {
  switch (t) {
    case ParquetType::Boolean: return pq::kBoolean;
    case ParquetType::Int32: return pq::kInt32;
    case ParquetType::Int64: return pq::kInt64;
    case ParquetType::Float: return pq::kFloat;
    case ParquetType::Double: return pq::kDouble;
    case ParquetType::ByteArray: return pq::kByteArray;
  }
  return pq::kInt64;
}

int32_t codec_of(ParquetCodec c) {
  switch (c) {
    case ParquetCodec::Uncompressed: return pq::kUncompressed;
    case ParquetCodec::Snappy: return pq::kSnappy;
    case ParquetCodec::Zstd: return pq::kZstd;
  }
  return pq::kUncompressed;
}

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

pq::SchemaElement leaf_element(const ParquetField& f, const std::string& name, int32_t rep) {
  pq::SchemaElement e;
  e.type = physical_of(f.type);
  e.repetition = rep;
  e.name = name;
  if (f.type == ParquetType::ByteArray && f.utf8) {
    e.converted_type = pq::kUtf8;
    e.logical = 1;  // STRING
  }
  return e;
}

// One column of one row group, flattened to levels and non-null value positions.
struct Flat {
  std::vector<uint32_t> def, rep;     // per level (empty when the max level is 0)
  std::vector<int64_t> slots;         // slot index of each non-null value, in order
  std::vector<int64_t> level_of_row;  // [rows + 1]: first level of each row
  std::vector<int64_t> value_of_row;  // [rows + 1]: first non-null value of each row
  int16_t max_def = 0, max_rep = 0;
};

Flat flatten(const ParquetField& f, const ParquetColumnData& c) {
  Flat fl;
  const int64_t rows = c.rows;
  fl.level_of_row.reserve(rows + 1);
  fl.value_of_row.reserve(rows + 1);
  if (!f.list) {
    fl.max_def = f.nullable ? 1 : 0;
    for (int64_t r = 0; r < rows; ++r) {
      fl.level_of_row.push_back(r);
      fl.value_of_row.push_back(static_cast<int64_t>(fl.slots.size()));
      const bool p = c.present(r);
      if (fl.max_def) fl.def.push_back(p ? 1 : 0);
      if (p) fl.slots.push_back(r);
    }
    fl.level_of_row.push_back(rows);
  } else {
    const uint32_t b = f.nullable ? 1 : 0;
    fl.max_def = static_cast<int16_t>(b + 2);
    fl.max_rep = 1;
    for (int64_t r = 0; r < rows; ++r) {
      fl.level_of_row.push_back(static_cast<int64_t>(fl.def.size()));
      fl.value_of_row.push_back(static_cast<int64_t>(fl.slots.size()));
      if (!c.row_present(r)) {
        fl.def.push_back(0);
        fl.rep.push_back(0);
        continue;
      }
      const int64_t s0 = c.offsets[r], s1 = c.offsets[r + 1];
      if (s0 == s1) {
        fl.def.push_back(b);
        fl.rep.push_back(0);
      }
      for (int64_t s = s0; s < s1; ++s) {
        const bool p = c.present(s);
        fl.def.push_back(p ? b + 2 : b + 1);
        fl.rep.push_back(s == s0 ? 0 : 1);
        if (p) fl.slots.push_back(s);
      }
    }
    fl.level_of_row.push_back(static_cast<int64_t>(fl.def.size()));
  }
  fl.value_of_row.push_back(static_cast<int64_t>(fl.slots.size()));
  return fl;
}

}  // namespace

ParquetType parse_parquet_type(const std::string& s) {
  if (s == "bool" || s == "boolean" || s == "BOOLEAN") return ParquetType::Boolean;
  if (s == "int32" || s == "INT32") return ParquetType::Int32;
  if (s == "int64" || s == "INT64") return ParquetType::Int64;
  if (s == "float" || s == "FLOAT") return ParquetType::Float;
  if (s == "double" || s == "DOUBLE") return ParquetType::Double;
  if (s == "string" || s == "binary" || s == "BYTE_ARRAY") return ParquetType::ByteArray;
  fail("unknown Parquet column type '", s,
       "' (expected bool, int32, int64, float, double, string or binary)");
}

ParquetCodec parse_parquet_codec(const std::string& s) {
  if (s == "none" || s == "uncompressed" || s == "UNCOMPRESSED") return ParquetCodec::Uncompressed;
  if (s == "snappy" || s == "SNAPPY") return ParquetCodec::Snappy;
  if (s == "zstd" || s == "ZSTD") return ParquetCodec::Zstd;
  fail("unknown Parquet codec '", s, "' (expected none, snappy or zstd)");
}

struct ParquetWriter::Impl {
  AtomicFile file;
  std::vector<ParquetField> fields;
  ParquetWriteOptions opt;
  pq::FileMetaData meta;
  uint64_t offset = 0;
  bool closed = false;
  std::string page, packed, levels, header;

  Impl(const std::string& path) : file(path) {}

  void write(const std::string& s) {
    file.write(s);
    offset += s.size();
  }

  void validate(const ParquetField& f, const ParquetColumnData& c, int64_t rows) const {
    const std::string what = file.path() + ": column '" + f.name + "'";
    if (c.rows != rows)
      fail(what, ": ", c.rows, " rows, the row group's first column has ", rows);
    if (f.list) {
      if (static_cast<int64_t>(c.offsets.size()) != rows + 1 || c.offsets[0] != 0)
        fail(what, ": a list column needs rows + 1 offsets starting at 0");
      for (int64_t r = 0; r < rows; ++r)
        if (c.offsets[r + 1] < c.offsets[r]) fail(what, ": list offsets decrease at row ", r);
      if (!c.row_valid.empty()) {
        if (static_cast<int64_t>(c.row_valid.size()) != rows)
          fail(what, ": row_valid needs one entry per row");
        for (int64_t r = 0; r < rows; ++r) {
          if (c.row_valid[r]) continue;
          if (!f.nullable) fail(what, ": row ", r, " is a null list but the column is not nullable");
          if (c.offsets[r + 1] != c.offsets[r]) fail(what, ": null list at row ", r, " has values");
        }
      }
    } else if (!c.offsets.empty() || !c.row_valid.empty()) {
      fail(what, ": offsets/row_valid given for a column that is not a list");
    }
    const int64_t slots = c.slots();
    if (!c.valid.empty()) {
      if (static_cast<int64_t>(c.valid.size()) != slots)
        fail(what, ": valid needs one entry per value (", slots, "), got ", c.valid.size());
      if (!f.list && !f.nullable)
        for (int64_t s = 0; s < slots; ++s)
          if (!c.valid[s]) fail(what, ": row ", s, " is null but the column is not nullable");
    }
    int64_t have = 0;
    switch (f.type) {
      case ParquetType::Boolean:
      case ParquetType::Int32:
      case ParquetType::Int64: have = static_cast<int64_t>(c.ints.size()); break;
      case ParquetType::Float:
      case ParquetType::Double: have = static_cast<int64_t>(c.reals.size()); break;
      case ParquetType::ByteArray: have = static_cast<int64_t>(c.strings.size()); break;
    }
    if (have != slots)
      fail(what, ": ", have, " values for ", slots, " value slots (type ",
           parquet_type_name(f.type), ")");
    if (f.type == ParquetType::Int32)
      for (int64_t s = 0; s < slots; ++s)
        if (c.present(s) && (c.ints[s] < INT32_MIN || c.ints[s] > INT32_MAX))
          fail(what, ": value ", c.ints[s], " does not fit INT32");
  }

  // PLAIN-encodes the values at `slots[v0, v1)` into `out`.
  static void plain(const ParquetField& f, const ParquetColumnData& c, const int64_t* slots,
                    int64_t n, std::string& out) {
    switch (f.type) {
      case ParquetType::Boolean: {
        const size_t start = out.size();
        out.resize(start + static_cast<size_t>((n + 7) / 8), 0);
        for (int64_t i = 0; i < n; ++i)
          if (c.ints[slots[i]]) out[start + (i >> 3)] |= static_cast<char>(1 << (i & 7));
        return;
      }
      case ParquetType::Int32:
        for (int64_t i = 0; i < n; ++i) {
          const int32_t v = static_cast<int32_t>(c.ints[slots[i]]);
          out.append(reinterpret_cast<const char*>(&v), 4);
        }
        return;
      case ParquetType::Int64:
        for (int64_t i = 0; i < n; ++i)
          out.append(reinterpret_cast<const char*>(&c.ints[slots[i]]), 8);
        return;
      case ParquetType::Float:
        for (int64_t i = 0; i < n; ++i) {
          const float v = static_cast<float>(c.reals[slots[i]]);
          out.append(reinterpret_cast<const char*>(&v), 4);
        }
        return;
      case ParquetType::Double:
        for (int64_t i = 0; i < n; ++i)
          out.append(reinterpret_cast<const char*>(&c.reals[slots[i]]), 8);
        return;
      case ParquetType::ByteArray:
        for (int64_t i = 0; i < n; ++i) {
          const std::string& s = c.strings[slots[i]];
          put_u32(out, static_cast<uint32_t>(s.size()));
          out += s;
        }
        return;
    }
  }

  // Dictionary indices of the non-null values and the slots of the dictionary's entries;
  // false when the dictionary would be too large (or the type has none).
  bool build_dictionary(const ParquetField& f, const ParquetColumnData& c, const Flat& fl,
                        std::vector<uint32_t>& indices, std::vector<int64_t>& entries) const {
    if (!opt.dictionary || f.type == ParquetType::Boolean) return false;
    indices.resize(fl.slots.size());
    int64_t bytes = 0;
    const int64_t width = f.type == ParquetType::Int32 || f.type == ParquetType::Float ? 4 : 8;
    auto run = [&](auto&& key_of, auto& map) {
      for (size_t i = 0; i < fl.slots.size(); ++i) {
        const int64_t s = fl.slots[i];
        auto [it, fresh] = map.emplace(key_of(s), static_cast<uint32_t>(entries.size()));
        if (fresh) {
          entries.push_back(s);
          bytes += f.type == ParquetType::ByteArray
                       ? 4 + static_cast<int64_t>(c.strings[s].size())
                       : width;
          if (bytes > opt.dictionary_max_bytes) return false;
        }
        indices[i] = it->second;
      }
      return true;
    };
    if (f.type == ParquetType::ByteArray) {
      std::unordered_map<std::string_view, uint32_t> m;
      return run([&](int64_t s) { return std::string_view(c.strings[s]); }, m);
    }
    if (f.type == ParquetType::Float || f.type == ParquetType::Double) {
      std::unordered_map<uint64_t, uint32_t> m;  // by bit pattern: -0.0 and NaNs stay distinct
      return run(
          [&](int64_t s) {
            uint64_t b = 0;
            if (f.type == ParquetType::Float) {
              const float v = static_cast<float>(c.reals[s]);
              uint32_t b32;
              std::memcpy(&b32, &v, 4);
              b = b32;
            } else {
              std::memcpy(&b, &c.reals[s], 8);
            }
            return b;
          },
          m);
    }
    std::unordered_map<int64_t, uint32_t> m;
    return run([&](int64_t s) { return c.ints[s]; }, m);
  }

  // Compresses `page` and writes it with its header; returns (uncompressed, compressed) bytes
  // including the header.
  std::pair<int64_t, int64_t> write_page(pq::PageHeader h, int32_t codec) {
    pq::compress(codec, page.data(), page.size(), packed);
    h.uncompressed_size = static_cast<int32_t>(page.size());
    h.compressed_size = static_cast<int32_t>(packed.size());
    DLREC_CHECK(page.size() < (size_t{1} << 31) && packed.size() < (size_t{1} << 31),
                file.path(), ": a page exceeds 2 GiB; use smaller pages");
    header = pq::encode_page_header(h);
    write(header);
    write(packed);
    return {static_cast<int64_t>(header.size() + page.size()),
            static_cast<int64_t>(header.size() + packed.size())};
  }

  pq::ColumnChunk write_column(const ParquetField& f, const ParquetColumnData& c) {
    const Flat fl = flatten(f, c);
    const int32_t codec = codec_of(opt.codec);
    pq::ColumnChunk cc;
    pq::ColumnMeta& m = cc.meta;
    cc.has_meta = true;
    m.type = physical_of(f.type);
    m.path = f.list ? std::vector<std::string>{f.name, "list", "element"}
                    : std::vector<std::string>{f.name};
    m.codec = codec;
    m.num_values = static_cast<int64_t>(fl.level_of_row.back());
    cc.file_offset = static_cast<int64_t>(offset);

    std::vector<uint32_t> indices;
    std::vector<int64_t> entries;
    const bool dict = build_dictionary(f, c, fl, indices, entries);
    if (dict) {
      m.dictionary_page_offset = static_cast<int64_t>(offset);
      page.clear();
      plain(f, c, entries.data(), static_cast<int64_t>(entries.size()), page);
      pq::PageHeader h;
      h.type = pq::kDictionaryPage;
      h.num_values = static_cast<int32_t>(entries.size());
      h.encoding = pq::kPlain;
      auto [u, z] = write_page(h, codec);
      m.total_uncompressed_size += u;
      m.total_compressed_size += z;
      m.encodings = {pq::kPlain, pq::kRle, pq::kRleDictionary};
    } else {
      m.encodings = {pq::kPlain, pq::kRle};
    }
    m.data_page_offset = static_cast<int64_t>(offset);
    const int64_t page_rows = std::max<int64_t>(1, opt.page_rows);
    const int bw = pq::bit_width(entries.empty() ? 0 : entries.size() - 1);
    for (int64_t r0 = 0; r0 < c.rows || (r0 == 0 && c.rows == 0); r0 += page_rows) {
      const int64_t r1 = std::min(c.rows, r0 + page_rows);
      const int64_t l0 = fl.level_of_row[r0], l1 = fl.level_of_row[r1];
      const int64_t v0 = fl.value_of_row[r0], v1 = fl.value_of_row[r1];
      page.clear();
      auto put_levels = [&](const std::vector<uint32_t>& lv, int16_t max_level) {
        levels.clear();
        pq::rle_encode(lv.data() + l0, l1 - l0, pq::bit_width(max_level), levels);
        put_u32(page, static_cast<uint32_t>(levels.size()));
        page += levels;
      };
      if (fl.max_rep) put_levels(fl.rep, fl.max_rep);
      if (fl.max_def) put_levels(fl.def, fl.max_def);
      if (dict) {
        page.push_back(static_cast<char>(bw));
        pq::rle_encode(indices.data() + v0, v1 - v0, bw, page);
      } else {
        plain(f, c, fl.slots.data() + v0, v1 - v0, page);
      }
      pq::PageHeader h;
      h.type = pq::kDataPage;
      h.num_values = static_cast<int32_t>(l1 - l0);
      h.encoding = dict ? pq::kRleDictionary : pq::kPlain;
      h.def_encoding = pq::kRle;
      h.rep_encoding = pq::kRle;
      auto [u, z] = write_page(h, codec);
      m.total_uncompressed_size += u;
      m.total_compressed_size += z;
      if (c.rows == 0) break;
    }
    return cc;
  }
};

ParquetWriter::ParquetWriter(const std::string& path, std::vector<ParquetField> fields,
                             ParquetWriteOptions options)
    : impl_(std::make_unique<Impl>(path)) {
  Impl& w = *impl_;
  DLREC_CHECK(!fields.empty(), path, ": a Parquet file needs at least one column");
  std::unordered_set<std::string> names;
  for (const auto& f : fields) {
    DLREC_CHECK(!f.name.empty(), path, ": a column has an empty name");
    DLREC_CHECK(names.insert(f.name).second, path, ": column '", f.name, "' appears twice");
  }
  w.fields = std::move(fields);
  w.opt = options;
  DLREC_CHECK(w.opt.page_rows >= 1, path, ": page_rows must be >= 1");
  pq::SchemaElement root;
  root.name = "schema";
  root.num_children = static_cast<int32_t>(w.fields.size());
  w.meta.schema.push_back(root);
  for (const auto& f : w.fields) {
    const int32_t rep = f.nullable ? pq::kOptional : pq::kRequired;
    if (!f.list) {
      w.meta.schema.push_back(leaf_element(f, f.name, rep));
      continue;
    }
    pq::SchemaElement g;
    g.name = f.name;
    g.repetition = rep;
    g.num_children = 1;
    g.converted_type = pq::kList;
    g.logical = 3;  // LIST
    w.meta.schema.push_back(g);
    pq::SchemaElement l;
    l.name = "list";
    l.repetition = pq::kRepeated;
    l.num_children = 1;
    w.meta.schema.push_back(l);
    w.meta.schema.push_back(leaf_element(f, "element", pq::kOptional));
  }
  w.meta.version = 2;
  w.meta.created_by = "dlrec version 0.1.0";
  w.write("PAR1");
}

ParquetWriter::~ParquetWriter() = default;

void ParquetWriter::write_row_group(const std::vector<ParquetColumnData>& columns) {
  Impl& w = *impl_;
  DLREC_CHECK(!w.closed, w.file.path(), ": write_row_group after close");
  DLREC_CHECK(columns.size() == w.fields.size(), w.file.path(), ": ", columns.size(),
              " columns given, the file has ", w.fields.size());
  const int64_t rows = columns[0].rows;
  DLREC_CHECK(rows >= 1, w.file.path(), ": an empty row group");
  for (size_t i = 0; i < columns.size(); ++i) w.validate(w.fields[i], columns[i], rows);
  pq::RowGroup g;
  g.num_rows = rows;
  g.file_offset = static_cast<int64_t>(w.offset);
  g.ordinal = static_cast<int32_t>(w.meta.row_groups.size());
  g.total_compressed_size = 0;
  for (size_t i = 0; i < columns.size(); ++i) {
    g.columns.push_back(w.write_column(w.fields[i], columns[i]));
    g.total_byte_size += g.columns.back().meta.total_uncompressed_size;
    g.total_compressed_size += g.columns.back().meta.total_compressed_size;
  }
  w.meta.num_rows += rows;
  w.meta.row_groups.push_back(std::move(g));
}

void ParquetWriter::close() {
  Impl& w = *impl_;
  if (w.closed) return;
  const std::string footer = pq::encode_file_metadata(w.meta);
  w.write(footer);
  std::string tail;
  put_u32(tail, static_cast<uint32_t>(footer.size()));
  tail += "PAR1";
  w.write(tail);
  w.file.commit();
  w.closed = true;
}

int64_t ParquetWriter::rows() const { return impl_->meta.num_rows; }

void write_parquet(const std::string& path, const std::vector<ParquetField>& fields,
                   const std::vector<ParquetColumnData>& columns,
                   const ParquetWriteOptions& options) {
  DLREC_CHECK(columns.size() == fields.size(), path, ": ", columns.size(),
              " columns given for ", fields.size(), " fields");
  DLREC_CHECK(options.row_group_rows >= 1, path, ": row_group_rows must be >= 1");
  ParquetWriter w(path, fields, options);
  const int64_t rows = columns.empty() ? 0 : columns[0].rows;
  std::vector<ParquetColumnData> part(columns.size());
  for (int64_t r0 = 0; r0 < rows; r0 += options.row_group_rows) {
    const int64_t r1 = std::min(rows, r0 + options.row_group_rows);
    for (size_t i = 0; i < columns.size(); ++i) {
      const ParquetColumnData& c = columns[i];
      ParquetColumnData& p = part[i];
      DLREC_CHECK(c.rows == rows, path, ": column '", fields[i].name, "' has ", c.rows,
                  " rows, the first column ", rows);
      p = ParquetColumnData{};
      p.rows = r1 - r0;
      int64_t s0 = r0, s1 = r1;
      if (fields[i].list) {
        DLREC_CHECK(static_cast<int64_t>(c.offsets.size()) == rows + 1, path, ": column '",
                    fields[i].name, "' needs rows + 1 offsets");
        s0 = c.offsets[r0];
        s1 = c.offsets[r1];
        for (int64_t r = r0; r <= r1; ++r) p.offsets.push_back(c.offsets[r] - s0);
        if (!c.row_valid.empty())
          p.row_valid.assign(c.row_valid.begin() + r0, c.row_valid.begin() + r1);
      }
      auto slice = [&](const auto& v, auto& out) {
        if (static_cast<int64_t>(v.size()) >= s1) out.assign(v.begin() + s0, v.begin() + s1);
        else out = v;  // wrong size: validate() reports it
      };
      slice(c.ints, p.ints);
      slice(c.reals, p.reals);
      slice(c.strings, p.strings);
      if (!c.valid.empty()) slice(c.valid, p.valid);
    }
    w.write_row_group(part);
  }
  w.close();
}

}  // namespace dlrec::io
