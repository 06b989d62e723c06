// Parquet reading: the footer and schema (ParquetFile) and page decoding (ColumnCursor).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "dlrec/core/error.h"
#include "io/parquet_column.h"
#include "io/parquet_encodings.h"

namespace dlrec::io {
namespace {

constexpr char kMagic[4] = {'P', 'A', 'R', '1'};
constexpr int kMaxSchemaDepth = 100;
constexpr int64_t kPageValuesFloor = int64_t{1} << 22;  // see next_page

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

ParquetType to_parquet_type(int32_t t) {
  switch (t) {
    case pq::kBoolean: return ParquetType::Boolean;
    case pq::kInt32: return ParquetType::Int32;
    case pq::kInt64: return ParquetType::Int64;
    case pq::kFloat: return ParquetType::Float;
    case pq::kDouble: return ParquetType::Double;
    default: return ParquetType::ByteArray;
  }
}

bool supported_physical(int32_t t) {
  return t == pq::kBoolean || t == pq::kInt32 || t == pq::kInt64 || t == pq::kFloat ||
         t == pq::kDouble || t == pq::kByteArray;
}

}  // namespace

const char* parquet_type_name(ParquetType t) {
  switch (t) {
    case ParquetType::Boolean: return "BOOLEAN";
    case ParquetType::Int32: return "INT32";
    case ParquetType::Int64: return "INT64";
    case ParquetType::Float: return "FLOAT";
    case ParquetType::Double: return "DOUBLE";
    case ParquetType::ByteArray: return "BYTE_ARRAY";
  }
  return "?";
}

void ColumnValues::clear() {
  rows = 0;
  ints.clear();
  reals.clear();
  strings.clear();
  valid.clear();
  offsets.clear();
  row_valid.clear();
  keys.clear();
}

// ---------------------------------------------------------------------------------------------
// ParquetFile

ParquetFile::Impl::~Impl() {
  if (fd >= 0) ::close(fd);
}

void ParquetFile::Impl::pread_exact(uint64_t offset, size_t n, void* out,
                                    const std::string& what) const {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(what, ": read failed: ", std::strerror(errno));
    }
    if (got == 0) fail(what, ": unexpected end of file at byte ", offset);
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

std::string ParquetFile::Impl::context(int row_group, int field) const {
  return path + ": row group " + std::to_string(row_group) + ", column '" + fields[field].name +
         "'";
}

namespace {

// Walks the depth-first schema list from element `i`; appends the element path of every leaf
// below it (inclusive) to `leaves`. Returns the index after the subtree.
size_t walk_schema(const pq::FileMetaData& m, size_t i, std::vector<int>& path,
                   std::vector<std::vector<int>>& leaves, const std::string& path_name) {
  if (i >= m.schema.size()) fail(path_name, ": corrupt footer: the schema ends early");
  if (path.size() >= kMaxSchemaDepth) fail(path_name, ": schema nested too deeply");
  const pq::SchemaElement& e = m.schema[i];
  path.push_back(static_cast<int>(i));
  size_t next = i + 1;
  if (e.type >= 0) {
    leaves.push_back(path);
  } else {
    if (e.num_children < 0) fail(path_name, ": corrupt footer: negative child count");
    for (int c = 0; c < e.num_children; ++c) next = walk_schema(m, next, path, leaves, path_name);
  }
  path.pop_back();
  return next;
}

}  // namespace

ParquetFile::ParquetFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& f = *impl_;
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(f.fd, &st) != 0) fail("cannot stat '", path, "': ", std::strerror(errno));
  f.file_size = static_cast<uint64_t>(st.st_size);
  if (f.file_size < 12)
    fail(path, ": bad magic: not a Parquet file (", f.file_size,
         " bytes, too small for the 'PAR1' markers and a footer)");
  uint8_t head[4], tail[8];
  f.pread_exact(0, 4, head, path);
  f.pread_exact(f.file_size - 8, 8, tail, path);
  if (std::memcmp(head, kMagic, 4) != 0)
    fail(path, ": bad magic: the file does not start with 'PAR1' (not a Parquet file)");
  if (std::memcmp(tail + 4, "PARE", 4) == 0)
    fail(path, ": encrypted Parquet footers are not supported");
  if (std::memcmp(tail + 4, kMagic, 4) != 0)
    fail(path, ": bad magic: the file does not end with 'PAR1' (truncated, or not a Parquet "
         "file)");
  const uint64_t footer_len = load_u32(tail);
  if (footer_len + 12 > f.file_size)
    fail(path, ": truncated footer: its length is ", footer_len, " bytes but the file has only ",
         f.file_size, " bytes");
  f.data_end = f.file_size - 8 - footer_len;
  std::vector<uint8_t> footer(footer_len);
  f.pread_exact(f.data_end, footer_len, footer.data(), path);
  try {
    f.meta = pq::decode_file_metadata(footer.data(), footer.size(), path + ": footer");
  } catch (const Error& e) {
    fail(e.what(), " (truncated or corrupt footer)");
  }
  const pq::FileMetaData& m = f.meta;
  if (m.encrypted_footer_fields) fail(path, ": encrypted Parquet files are not supported");
  if (m.schema.empty()) fail(path, ": corrupt footer: empty schema");
  if (m.num_rows < 0) fail(path, ": corrupt footer: negative row count");

  // Top-level fields.
  size_t i = 1;
  for (int c = 0; c < m.schema[0].num_children; ++c) {
    std::vector<int> path_nodes;
    std::vector<std::vector<int>> leaves;
    const size_t top = i;
    i = walk_schema(m, i, path_nodes, leaves, path);
    const pq::SchemaElement& t = m.schema[top];
    ParquetField fld;
    fld.name = t.name;
    FieldLevels lv;
    lv.leaf = f.num_leaves;
    f.num_leaves += static_cast<int>(leaves.size());
    std::string why;
    if (leaves.size() != 1) {
      why = "a nested column with " + std::to_string(leaves.size()) +
            " leaf columns (structs and maps are not supported)";
    } else {
      const std::vector<int>& nodes = leaves[0];
      const pq::SchemaElement& leaf = m.schema[nodes.back()];
      int repeated = -1, n_rep = 0;
      int16_t def = 0;
      for (size_t k = 0; k < nodes.size(); ++k) {
        const pq::SchemaElement& e = m.schema[nodes[k]];
        if (e.converted_type == pq::kMap || e.converted_type == pq::kMapKeyValue || e.logical == 2)
          why = "a map column";
        if (e.repetition == pq::kRepeated) {
          ++n_rep;
          repeated = static_cast<int>(k);
          lv.null_below = def;
          lv.empty_below = static_cast<int16_t>(def + 1);
        }
        if (e.repetition == pq::kOptional || e.repetition == pq::kRepeated) ++def;
      }
      lv.max_def = def;
      lv.max_rep = static_cast<int16_t>(n_rep);
      lv.physical = leaf.type;
      fld.type = to_parquet_type(leaf.type);
      fld.list = n_rep == 1;
      fld.nullable = fld.list ? lv.null_below > 0 : def > 0;
      fld.is_unsigned = leaf.converted_type == pq::kUint32 || leaf.converted_type == pq::kUint64 ||
                        (leaf.logical == 10 && !leaf.logical_int_signed);
      fld.utf8 = leaf.type == pq::kByteArray &&
                 (leaf.converted_type == pq::kUtf8 || leaf.converted_type == pq::kEnum ||
                  leaf.logical == 1 || leaf.logical == 4 || leaf.logical == 12);
      if (!why.empty()) {
      } else if (n_rep > 1) {
        why = "a nested list (lists of lists are not supported)";
      } else if (n_rep == 0 && nodes.size() > 1) {
        why = "a struct column (structs are not supported)";
      } else if (!supported_physical(leaf.type)) {
        why = std::string("physical type ") + pq::type_name(leaf.type) +
              " (supported: BOOLEAN, INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY)";
      }
      (void)repeated;
    }
    if (!why.empty()) why = "unsupported column type: " + why;
    f.fields.push_back(fld);
    f.levels.push_back(lv);
    f.unsupported.push_back(why);
  }
  if (i != m.schema.size())
    fail(path, ": corrupt footer: the schema lists ", m.schema.size(), " elements but its tree ",
         "covers ", i);
  int64_t rows = 0;
  for (size_t g = 0; g < m.row_groups.size(); ++g) {
    const pq::RowGroup& rg = m.row_groups[g];
    if (static_cast<int>(rg.columns.size()) != f.num_leaves)
      fail(path, ": row group ", g, ": ", rg.columns.size(), " column chunks, the schema has ",
           f.num_leaves, " leaf columns");
    if (rg.num_rows < 0) fail(path, ": row group ", g, ": negative row count");
    for (const auto& cc : rg.columns)
      if (!cc.has_meta) fail(path, ": row group ", g, ": a column chunk has no metadata");
    rows += rg.num_rows;
  }
  if (rows != m.num_rows)
    fail(path, ": corrupt footer: the row groups hold ", rows, " rows, the file says ",
         m.num_rows);
}

ParquetFile::~ParquetFile() = default;
ParquetFile::ParquetFile(ParquetFile&&) noexcept = default;
ParquetFile& ParquetFile::operator=(ParquetFile&&) noexcept = default;

const std::string& ParquetFile::path() const { return impl_->path; }
int64_t ParquetFile::num_rows() const { return impl_->meta.num_rows; }
int ParquetFile::num_row_groups() const { return static_cast<int>(impl_->meta.row_groups.size()); }
int64_t ParquetFile::row_group_rows(int g) const { return impl_->meta.row_groups.at(g).num_rows; }
const std::string& ParquetFile::created_by() const { return impl_->meta.created_by; }
const std::vector<ParquetField>& ParquetFile::fields() const { return impl_->fields; }
const std::string& ParquetFile::unsupported_reason(int field) const {
  return impl_->unsupported.at(field);
}
int ParquetFile::field_index(const std::string& name) const {
  for (size_t i = 0; i < impl_->fields.size(); ++i)
    if (impl_->fields[i].name == name) return static_cast<int>(i);
  return -1;
}

ParquetColumnData ParquetFile::read_column(int row_group, int field) const {
  DLREC_CHECK(row_group >= 0 && row_group < num_row_groups(), impl_->path, ": no row group ",
              row_group, " (the file has ", num_row_groups(), ")");
  DLREC_CHECK(field >= 0 && field < static_cast<int>(impl_->fields.size()), impl_->path,
              ": no column ", field);
  ColumnValues v;
  if (row_group_rows(row_group) == 0) {  // writers may leave an empty group's chunks blank
    if (impl_->fields[field].list) v.offsets.push_back(0);
    return std::move(static_cast<ParquetColumnData&>(v));
  }
  ColumnCursor cur(*impl_, row_group, field, BytesMode::Strings);
  cur.read(row_group_rows(row_group), v);
  v.keys.clear();
  return std::move(static_cast<ParquetColumnData&>(v));
}

// ---------------------------------------------------------------------------------------------
// ColumnCursor

struct ColumnCursor::State {
  const ParquetFile::Impl& f;
  std::string ctx;
  ParquetField field;
  FieldLevels lv;
  BytesMode mode;
  int32_t codec = 0;
  uint64_t pos = 0, end = 0;
  int64_t bytes = 0;
  int64_t values_left = 0;        // levels the chunk metadata declares, not yet seen
  int64_t max_page_bytes = 0;     // the chunk's uncompressed size (0: unknown)

  // Dictionary (decoded PLAIN values; keys for Hash/Hex).
  bool has_dict = false;
  int64_t dict_size = 0;
  std::vector<int64_t> d_ints;
  std::vector<double> d_reals;
  std::vector<std::string> d_strs;
  std::vector<uint64_t> d_keys;
  std::vector<uint8_t> d_key_valid;

  // Current data page.
  std::string raw, buf, hdr;
  int64_t n_levels = 0, lpos = 0;
  std::vector<uint32_t> def, rep;
  int64_t vpos = 0, n_vals = 0;
  bool page_dict = false;
  std::vector<uint32_t> idx;
  std::vector<int64_t> p_ints;
  std::vector<double> p_reals;
  std::vector<std::string_view> p_views;
  std::string p_bytes;             // BYTE_STREAM_SPLIT as PLAIN; DELTA_BYTE_ARRAY's values
  std::vector<int64_t> p_lengths;  // DELTA_LENGTH_BYTE_ARRAY scratch
  int data_pages = 0;              // data pages read so far (for messages)
  std::string page_ctx;            // ctx + ": data page N"

  State(const ParquetFile::Impl& file) : f(file) {}

  bool is_bytes() const { return lv.physical == pq::kByteArray; }
  bool is_real() const { return lv.physical == pq::kFloat || lv.physical == pq::kDouble; }

  // ---- values

  uint64_t key_of(std::string_view s, bool& ok) const {
    if (s.empty()) {
      ok = false;
      return 0;
    }
    ok = true;
    if (mode == BytesMode::Hash) return hash_category(s);
    if (s.size() > 16)
      fail(ctx, ": '", std::string(s.substr(0, 40)), "' is not a hexadecimal category (more ",
           "than 16 digits)");
    uint64_t v = 0;
    for (char c : s) {
      unsigned d;
      if (c >= '0' && c <= '9')
        d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<unsigned>(c - 'A' + 10);
      else
        fail(ctx, ": '", std::string(s.substr(0, 40)), "' is not a hexadecimal category");
      v = (v << 4) | d;
    }
    return v;
  }

  // Decodes n PLAIN values from [p, p + size) into ints / reals / views.
  void decode_plain(const uint8_t* p, size_t size, int64_t n, std::vector<int64_t>& ints,
                    std::vector<double>& reals, std::vector<std::string_view>& views) {
    auto need = [&](uint64_t bytes_needed) {
      if (bytes_needed > size)
        fail(ctx, ": PLAIN values need ", bytes_needed, " bytes, the page holds ", size);
    };
    const auto un = static_cast<uint64_t>(n);
    switch (lv.physical) {
      case pq::kBoolean:
        need((un + 7) / 8);
        ints.resize(un);
        for (int64_t i = 0; i < n; ++i) ints[i] = (p[i >> 3] >> (i & 7)) & 1;
        return;
      case pq::kInt32:
        need(4 * un);
        ints.resize(un);
        for (int64_t i = 0; i < n; ++i) {
          int32_t v;
          std::memcpy(&v, p + 4 * i, 4);
          ints[i] = field.is_unsigned ? static_cast<int64_t>(static_cast<uint32_t>(v)) : v;
        }
        return;
      case pq::kInt64:
        need(8 * un);
        ints.resize(un);
        if (un) std::memcpy(ints.data(), p, 8 * un);
        return;
      case pq::kFloat:
        need(4 * un);
        reals.resize(un);
        for (int64_t i = 0; i < n; ++i) {
          float v;
          std::memcpy(&v, p + 4 * i, 4);
          reals[i] = v;
        }
        return;
      case pq::kDouble:
        need(8 * un);
        reals.resize(un);
        if (un) std::memcpy(reals.data(), p, 8 * un);
        return;
      case pq::kByteArray: {
        need(4 * un);  // at least a length per value
        views.resize(un);
        size_t at = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (size - at < 4) fail(ctx, ": PLAIN BYTE_ARRAY value ", i, " is past the page's end");
          const uint32_t len = load_u32(p + at);
          at += 4;
          if (size - at < len)
            fail(ctx, ": PLAIN BYTE_ARRAY value ", i, " of ", len, " bytes is past the page's end");
          views[i] = std::string_view(reinterpret_cast<const char*>(p + at), len);
          at += len;
        }
        return;
      }
      default:
        fail(ctx, ": unsupported physical type ", pq::type_name(lv.physical));
    }
  }

  void decode_dictionary(const pq::PageHeader& h) {
    if (has_dict) fail(ctx, ": a second dictionary page");
    if (h.encoding != pq::kPlain && h.encoding != pq::kPlainDictionary)
      fail(ctx, ": unsupported dictionary page encoding ", pq::encoding_name(h.encoding));
    if (lv.physical == pq::kBoolean) fail(ctx, ": a dictionary page for a BOOLEAN column");
    pq::decompress(codec, reinterpret_cast<const uint8_t*>(raw.data()), raw.size(),
                   static_cast<size_t>(h.uncompressed_size), buf, ctx + ": dictionary page");
    std::vector<std::string_view> views;
    decode_plain(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), h.num_values, d_ints,
                 d_reals, views);
    dict_size = h.num_values;
    if (is_bytes()) {
      if (mode == BytesMode::Strings) {
        d_strs.assign(views.begin(), views.end());
      } else {
        d_keys.resize(views.size());
        d_key_valid.resize(views.size());
        for (size_t i = 0; i < views.size(); ++i) {
          bool ok;
          d_keys[i] = key_of(views[i], ok);
          d_key_valid[i] = ok;
        }
      }
    }
    has_dict = true;
  }

  // Levels of a V1 page: a 4-byte length, then the hybrid runs. Advances p/size.
  void levels_v1(int32_t encoding, int16_t max_level, const uint8_t*& p, size_t& size,
                 std::vector<uint32_t>& out, const char* which) {
    if (encoding != pq::kRle)
      fail(ctx, ": unsupported encoding ", pq::encoding_name(encoding), " for ", which,
           " levels");
    if (size < 4) fail(ctx, ": ", which, " levels are past the page's end");
    const uint32_t len = load_u32(p);
    if (len > size - 4) fail(ctx, ": ", which, " levels of ", len, " bytes are past the page's end");
    out.resize(static_cast<size_t>(n_levels));
    pq::rle_decode(p + 4, len, pq::bit_width(static_cast<uint64_t>(max_level)), n_levels,
                   out.data(), ctx + ": " + which + " levels");
    p += 4 + len;
    size -= 4 + len;
  }

  void decode_values(int32_t encoding, const uint8_t* p, size_t size) {
    n_vals = n_levels;
    if (lv.max_def > 0) {
      n_vals = 0;
      for (int64_t i = 0; i < n_levels; ++i) {
        if (def[i] > static_cast<uint32_t>(lv.max_def))
          fail(ctx, ": definition level ", def[i], " exceeds the maximum ", lv.max_def);
        n_vals += def[i] == static_cast<uint32_t>(lv.max_def);
      }
    }
    if (lv.max_rep > 0)
      for (int64_t i = 0; i < n_levels; ++i)
        if (rep[i] > static_cast<uint32_t>(lv.max_rep))
          fail(ctx, ": repetition level ", rep[i], " exceeds the maximum ", lv.max_rep);
    vpos = 0;
    page_dict = false;
    switch (encoding) {
      case pq::kPlain:
        decode_plain(p, size, n_vals, p_ints, p_reals, p_views);
        return;
      case pq::kPlainDictionary:
      case pq::kRleDictionary: {
        if (!has_dict)
          fail(ctx, ": a dictionary-encoded data page but the column chunk has no dictionary page");
        page_dict = true;
        idx.resize(static_cast<size_t>(n_vals));
        if (n_vals == 0) return;
        if (size < 1) fail(ctx, ": dictionary indices are past the page's end");
        pq::rle_decode(p + 1, size - 1, p[0], n_vals, idx.data(), ctx + ": dictionary indices");
        for (int64_t i = 0; i < n_vals; ++i)
          if (idx[i] >= static_cast<uint64_t>(dict_size))
            fail(ctx, ": dictionary index ", idx[i], " out of range (the dictionary has ",
                 dict_size, " values)");
        return;
      }
      case pq::kDeltaBinaryPacked:
      case pq::kDeltaLengthByteArray:
      case pq::kDeltaByteArray:
      case pq::kByteStreamSplit:
        decode_delta_or_split(encoding, p, size);
        return;
      case pq::kRle:
        if (lv.physical == pq::kBoolean) {
          if (size < 4) fail(ctx, ": RLE booleans are past the page's end");
          const uint32_t len = load_u32(p);
          if (len > size - 4) fail(ctx, ": RLE booleans are past the page's end");
          idx.resize(static_cast<size_t>(n_vals));
          pq::rle_decode(p + 4, len, 1, n_vals, idx.data(), ctx + ": RLE booleans");
          p_ints.assign(idx.begin(), idx.end());
          return;
        }
        [[fallthrough]];
      default:
        fail(ctx, ": unsupported encoding ", pq::encoding_name(encoding), " (supported: PLAIN, ",
             "PLAIN_DICTIONARY, RLE_DICTIONARY, DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, ",
             "DELTA_BYTE_ARRAY, BYTE_STREAM_SPLIT, and RLE for booleans)");
    }
  }

  // The DELTA_* and BYTE_STREAM_SPLIT encodings (parquet_encodings.h) into the vectors
  // decode_plain fills.
  void decode_delta_or_split(int32_t encoding, const uint8_t* p, size_t size) {
    const int32_t t = lv.physical;
    const bool ok = encoding == pq::kDeltaBinaryPacked ? t == pq::kInt32 || t == pq::kInt64
                    : encoding == pq::kByteStreamSplit
                        ? t == pq::kInt32 || t == pq::kInt64 || t == pq::kFloat || t == pq::kDouble
                        : t == pq::kByteArray;
    if (!ok)
      fail(page_ctx, ": encoding ", pq::encoding_name(encoding), " is not valid for a ",
           pq::type_name(t), " column");
    if (n_vals == 0) return;  // all nulls: nothing to decode (some writers leave no bytes)
    const std::string what = page_ctx + ": " + pq::encoding_name(encoding);
    auto enough = [&](size_t got) {
      if (got < static_cast<size_t>(n_vals))
        fail(what, ": the data holds ", got, " values, the page's levels need ", n_vals);
    };
    if (encoding == pq::kByteStreamSplit) {
      const int width = t == pq::kInt32 || t == pq::kFloat ? 4 : 8;
      pq::byte_stream_split_decode(p, size, n_vals, width, p_bytes, what);
      decode_plain(reinterpret_cast<const uint8_t*>(p_bytes.data()), p_bytes.size(), n_vals, p_ints,
                   p_reals, p_views);
    } else if (encoding == pq::kDeltaBinaryPacked) {
      pq::delta_binary_packed_decode(p, size, t == pq::kInt32 ? 32 : 64, n_levels, p_ints, what);
      enough(p_ints.size());
      if (t == pq::kInt32 && field.is_unsigned)
        for (int64_t& v : p_ints) v = static_cast<int64_t>(static_cast<uint32_t>(v));
    } else if (encoding == pq::kDeltaLengthByteArray) {
      pq::delta_length_byte_array_decode(p, size, n_levels, p_views, p_lengths, what);
      enough(p_views.size());
    } else {
      pq::delta_byte_array_decode(p, size, n_levels, p_bytes, p_views, what);
      enough(p_views.size());
    }
  }

  void decode_v1(const pq::PageHeader& h) {
    pq::decompress(codec, reinterpret_cast<const uint8_t*>(raw.data()), raw.size(),
                   static_cast<size_t>(h.uncompressed_size), buf, page_ctx);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(buf.data());
    size_t size = buf.size();
    n_levels = h.num_values;
    lpos = 0;
    if (lv.max_rep > 0) levels_v1(h.rep_encoding, lv.max_rep, p, size, rep, "repetition");
    if (lv.max_def > 0) levels_v1(h.def_encoding, lv.max_def, p, size, def, "definition");
    decode_values(h.encoding, p, size);
  }

  void decode_v2(const pq::PageHeader& h) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(raw.data());
    n_levels = h.num_values;
    lpos = 0;
    if (h.rep_bytes < 0 || h.def_bytes < 0 ||
        static_cast<uint64_t>(h.rep_bytes) + static_cast<uint64_t>(h.def_bytes) > raw.size() ||
        h.rep_bytes + h.def_bytes > h.uncompressed_size)
      fail(ctx, ": data page V2 level sizes exceed the page");
    if (lv.max_rep > 0) {
      rep.resize(static_cast<size_t>(n_levels));
      pq::rle_decode(p, h.rep_bytes, pq::bit_width(lv.max_rep), n_levels, rep.data(),
                     ctx + ": repetition levels");
    }
    if (lv.max_def > 0) {
      def.resize(static_cast<size_t>(n_levels));
      pq::rle_decode(p + h.rep_bytes, h.def_bytes, pq::bit_width(lv.max_def), n_levels,
                     def.data(), ctx + ": definition levels");
    }
    const size_t off = static_cast<size_t>(h.rep_bytes) + h.def_bytes;
    const size_t vsize = static_cast<size_t>(h.uncompressed_size) - off;
    if (h.v2_compressed && codec != pq::kUncompressed) {
      pq::decompress(codec, p + off, raw.size() - off, vsize, buf, page_ctx);
    } else {
      if (raw.size() - off != vsize) fail(ctx, ": data page V2 sizes disagree");
      buf.assign(raw, off, std::string::npos);
    }
    decode_values(h.encoding, reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  }

  size_t read_header(pq::PageHeader& h) {
    uint64_t want = std::min<uint64_t>(end - pos, 1024);
    for (;;) {
      hdr.resize(static_cast<size_t>(want));
      f.pread_exact(pos, hdr.size(), hdr.data(), ctx);
      try {
        return pq::decode_page_header(reinterpret_cast<const uint8_t*>(hdr.data()), hdr.size(),
                                      ctx + ": page header at byte " + std::to_string(pos), h);
      } catch (const Error&) {
        if (want >= end - pos || want >= (uint64_t{64} << 20)) throw;
        want = std::min<uint64_t>(end - pos, want * 8);
      }
    }
  }

  // Loads the next data page; false at the end of the chunk.
  bool next_page() {
    while (pos < end) {
      pq::PageHeader h;
      const size_t hlen = read_header(h);
      const uint64_t body = pos + hlen;
      if (static_cast<uint64_t>(h.compressed_size) > end - body)
        fail(ctx, ": page of ", h.compressed_size, " bytes at byte ", body,
             " runs past the end of the column chunk (byte ", end, ")");
      if (max_page_bytes > 0 && h.uncompressed_size > max_page_bytes)
        fail(ctx, ": page of ", h.uncompressed_size, " uncompressed bytes exceeds the column ",
             "chunk's ", max_page_bytes);
      if (h.type == pq::kDataPage || h.type == pq::kDataPageV2) {
        // A page's levels, indices and values are decoded at once (up to ~30 bytes a value),
        // and RLE lets a few bytes claim 2^31 values: the count is bounded by the page's bytes
        // (8 a byte: bit-packed booleans) beyond a floor that all-null pages of any writer's
        // default size stay far below.
        const int64_t most = std::max<int64_t>(kPageValuesFloor, 8 * int64_t{h.uncompressed_size});
        if (h.num_values > most)
          fail(ctx, ": a data page of ", h.uncompressed_size, " bytes claims ", h.num_values,
               " values; at most ", most, " are read (", kPageValuesFloor,
               " or 8 a byte, whichever is more)");
        if (h.num_values > values_left)
          fail(ctx, ": a data page holds ", h.num_values, " values, more than the ", values_left,
               " left of the column chunk's declared count");
        values_left -= h.num_values;
      }
      raw.resize(static_cast<size_t>(h.compressed_size));
      f.pread_exact(body, raw.size(), raw.data(), ctx);
      pos = body + static_cast<uint64_t>(h.compressed_size);
      bytes += static_cast<int64_t>(hlen) + h.compressed_size;
      switch (h.type) {
        case pq::kDictionaryPage: decode_dictionary(h); break;
        case pq::kDataPage:
        case pq::kDataPageV2:
          page_ctx = ctx + ": data page " + std::to_string(data_pages++);
          if (h.type == pq::kDataPage)
            decode_v1(h);
          else
            decode_v2(h);
          return true;
        case pq::kIndexPage: break;
        default: fail(ctx, ": unsupported page type ", h.type);
      }
    }
    return false;
  }

  void emit_null(ColumnValues& out) {
    out.valid.push_back(0);
    if (is_bytes()) {
      if (mode == BytesMode::Strings)
        out.strings.emplace_back();
      else
        out.keys.push_back(0);
    } else if (is_real()) {
      out.reals.push_back(0);
    } else {
      out.ints.push_back(0);
    }
  }

  void emit_value(ColumnValues& out) {
    const int64_t k = vpos++;
    if (is_bytes()) {
      if (mode == BytesMode::Strings) {
        if (page_dict)
          out.strings.push_back(d_strs[idx[k]]);
        else
          out.strings.emplace_back(p_views[k]);
        out.valid.push_back(1);
      } else if (page_dict) {
        out.keys.push_back(d_keys[idx[k]]);
        out.valid.push_back(d_key_valid[idx[k]]);
      } else {
        bool ok;
        out.keys.push_back(key_of(p_views[k], ok));
        out.valid.push_back(ok);
      }
      return;
    }
    out.valid.push_back(1);
    if (is_real())
      out.reals.push_back(page_dict ? d_reals[idx[k]] : p_reals[k]);
    else
      out.ints.push_back(page_dict ? d_ints[idx[k]] : p_ints[k]);
  }

  void read_flat(int64_t rows, ColumnValues& out) {
    int64_t left = rows;
    while (left > 0) {
      if (lpos == n_levels && !next_page())
        fail(ctx, ": the column chunk ends ", left, " rows before the row group does");
      const int64_t take = std::min(left, n_levels - lpos);
      if (lv.max_def == 0) {
        for (int64_t i = 0; i < take; ++i) emit_value(out);
      } else {
        const uint32_t md = static_cast<uint32_t>(lv.max_def);
        for (int64_t i = 0; i < take; ++i) {
          if (def[lpos + i] == md)
            emit_value(out);
          else
            emit_null(out);
        }
      }
      lpos += take;
      left -= take;
      out.rows += take;
    }
  }

  void read_list(int64_t rows, ColumnValues& out) {
    if (out.offsets.empty()) out.offsets.push_back(0);
    int64_t got = 0;
    for (;;) {
      if (lpos == n_levels && !next_page()) break;
      if (lpos == n_levels) continue;  // an empty page
      const uint32_t r = rep[lpos];
      const uint32_t d = lv.max_def > 0 ? def[lpos] : 0;
      if (r == 0) {
        if (got == rows) break;
        ++got;
        ++out.rows;
        out.offsets.push_back(out.offsets.back());
        out.row_valid.push_back(1);
      } else if (got == 0) {
        fail(ctx, ": a list continues a row that the previous read ended");
      }
      if (d < static_cast<uint32_t>(lv.null_below)) {
        out.row_valid.back() = 0;
      } else if (d >= static_cast<uint32_t>(lv.empty_below)) {
        if (d == static_cast<uint32_t>(lv.max_def))
          emit_value(out);
        else
          emit_null(out);
        ++out.offsets.back();
      }
      ++lpos;
    }
    if (got < rows)
      fail(ctx, ": the column chunk ends ", rows - got, " rows before the row group does");
  }
};

ColumnCursor::ColumnCursor(const ParquetFile::Impl& f, int row_group, int field, BytesMode mode)
    : s_(std::make_unique<State>(f)) {
  State& s = *s_;
  s.ctx = f.context(row_group, field);
  if (!f.unsupported[field].empty()) fail(s.ctx, ": ", f.unsupported[field]);
  s.field = f.fields[field];
  s.lv = f.levels[field];
  s.mode = mode;
  const pq::ColumnChunk& cc = f.meta.row_groups[row_group].columns[s.lv.leaf];
  if (!cc.file_path.empty())
    fail(s.ctx, ": column data in another file ('", cc.file_path, "') is not supported");
  const pq::ColumnMeta& cm = cc.meta;
  if (cm.type != s.lv.physical)
    fail(s.ctx, ": the column chunk's type ", pq::type_name(cm.type), " differs from the schema's ",
         pq::type_name(s.lv.physical));
  s.codec = cm.codec;
  if (!pq::codec_supported(s.codec))
    fail(s.ctx, ": unsupported compression codec ", pq::codec_name(s.codec),
         " (supported: ", pq::kSupportedCodecs, ")");
  int64_t start = cm.data_page_offset;
  if (cm.dictionary_page_offset >= 4 && cm.dictionary_page_offset < start)
    start = cm.dictionary_page_offset;
  if (start < 4 || cm.total_compressed_size < 0 ||
      static_cast<uint64_t>(start) + static_cast<uint64_t>(cm.total_compressed_size) > f.data_end)
    fail(s.ctx, ": column chunk bytes [", start, ", ", start + cm.total_compressed_size,
         ") lie outside the file's data [4, ", f.data_end, ")");
  s.values_left = cm.num_values;
  s.max_page_bytes = cm.total_uncompressed_size;
  s.pos = static_cast<uint64_t>(start);
  s.end = s.pos + static_cast<uint64_t>(cm.total_compressed_size);
}

ColumnCursor::~ColumnCursor() = default;

void ColumnCursor::read(int64_t rows, ColumnValues& out) {
  if (s_->field.list)
    s_->read_list(rows, out);
  else
    s_->read_flat(rows, out);
}

const std::string& ColumnCursor::context() const { return s_->ctx; }
int64_t ColumnCursor::bytes_read() const { return s_->bytes; }

}  // namespace dlrec::io
