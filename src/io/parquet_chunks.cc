// ParquetReader (Parquet files -> RawChunks for an io::Schema) and open_reader, the ETL's
// choice between text and Parquet input.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "io/parquet_column.h"

namespace dlrec::io {
namespace {

const char* kind_label(ColumnKind k) {
  switch (k) {
    case ColumnKind::Label: return "label";
    case ColumnKind::Dense: return "dense";
    case ColumnKind::Categorical: return "categorical";
    case ColumnKind::Skip: return "skip";
  }
  return "?";
}

// Keeps the rows of `c` whose keep[r] is set.
void keep_rows(RawChunk& c, const std::vector<uint8_t>& keep) {
  RawChunk k;
  k.reset(c.num_dense, c.num_cat);
  k.first_line = c.first_line;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (!keep[r]) continue;
    k.label.push_back(c.label[r]);
    k.dense.insert(k.dense.end(), c.dense.begin() + r * c.num_dense,
                   c.dense.begin() + (r + 1) * c.num_dense);
    for (int j = 0; j < c.num_cat; ++j) {
      k.cat_values[j].insert(k.cat_values[j].end(), c.cat_values[j].begin() + c.cat_offsets[j][r],
                             c.cat_values[j].begin() + c.cat_offsets[j][r + 1]);
      k.cat_offsets[j].push_back(static_cast<int64_t>(k.cat_values[j].size()));
    }
    ++k.rows;
  }
  c = std::move(k);
}

}  // namespace

struct ParquetReader::Impl {
  struct Target {
    ColumnKind kind;
    int index;  // among the dense / categorical columns
    std::string name;
    bool multi_hot;
  };

  std::vector<std::string> files;
  Schema schema;
  ReadOptions opt;
  ReadStats stats;
  std::vector<Target> targets;

  size_t next_file = 0;
  std::unique_ptr<ParquetFile> file;
  std::vector<int> field_of;  // per target: the file's field
  int row_group = -1;
  int64_t rg_left = 0, row_in_file = 0;
  std::vector<std::unique_ptr<ColumnCursor>> cursors;
  std::vector<ColumnValues> vals;

  void open_file(const std::string& path) {
    file = std::make_unique<ParquetFile>(path);
    row_group = -1;
    row_in_file = 0;
    field_of.assign(targets.size(), -1);
    std::string names;
    for (const auto& f : file->fields()) names += (names.empty() ? "" : ", ") + f.name;
    for (size_t t = 0; t < targets.size(); ++t) {
      const Target& tg = targets[t];
      const int i = file->field_index(tg.name);
      if (i < 0)
        fail(path, ": the schema's ", kind_label(tg.kind), " column '", tg.name,
             "' is not in the file (its columns: ", names, ")");
      const std::string where = path + ": column '" + tg.name + "'";
      if (!file->unsupported_reason(i).empty()) fail(where, ": ", file->unsupported_reason(i));
      const ParquetField& f = file->fields()[i];
      if (tg.kind == ColumnKind::Label || tg.kind == ColumnKind::Dense) {
        if (f.list) fail(where, ": a LIST column cannot be a ", kind_label(tg.kind), " column");
        if (f.type == ParquetType::ByteArray)
          fail(where, ": BYTE_ARRAY cannot be a ", kind_label(tg.kind),
               " column (needs BOOLEAN, INT32, INT64, FLOAT or DOUBLE)");
      } else {
        if (f.type == ParquetType::Float || f.type == ParquetType::Double)
          fail(where, ": ", parquet_type_name(f.type),
               " cannot be a categorical column (needs INT32, INT64, BOOLEAN or BYTE_ARRAY)");
        if (f.list && !tg.multi_hot)
          fail(where, ": a LIST column; mark it \"multi_hot\": true in the schema");
      }
      field_of[t] = i;
    }
  }

  // Moves to the next non-empty row group (of this or a later file); false at the end.
  bool next_row_group() {
    for (;;) {
      if (file && row_group + 1 < file->num_row_groups()) {
        ++row_group;
        rg_left = file->row_group_rows(row_group);
        if (rg_left == 0) continue;
        const BytesMode mode =
            schema.cat_encoding == CatEncoding::Hex ? BytesMode::Hex : BytesMode::Hash;
        cursors.clear();
        for (size_t t = 0; t < targets.size(); ++t)
          cursors.push_back(std::make_unique<ColumnCursor>(
              file->impl(), row_group, field_of[t], mode));
        return true;
      }
      if (next_file >= files.size()) return false;
      open_file(files[next_file++]);
    }
  }

  bool next(RawChunk& out) {
    const int nd = schema.num_dense(), nc = schema.num_cat();
    for (;;) {
      out.reset(nd, nc);
      if (opt.max_rows >= 0 && stats.rows >= opt.max_rows) return false;
      if (rg_left == 0 && !next_row_group()) return false;
      int64_t n = std::min(std::max<int64_t>(1, opt.chunk_rows), rg_left);
      if (opt.max_rows >= 0) n = std::min(n, opt.max_rows - stats.rows);
      vals.resize(targets.size());
      std::vector<int64_t> before(targets.size());
      parallel_for(0, static_cast<int64_t>(targets.size()), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          vals[t].clear();
          before[t] = cursors[t]->bytes_read();
          cursors[t]->read(n, vals[t]);
          before[t] = cursors[t]->bytes_read() - before[t];
        }
      });
      for (int64_t b : before) stats.bytes += b;
      rg_left -= n;
      out.first_line = row_in_file + 1;
      row_in_file += n;
      fill(n, out);
      if (out.rows > 0) {
        stats.rows += out.rows;
        return true;
      }
    }
  }

  void fill(int64_t n, RawChunk& out) {
    const int nd = out.num_dense;
    out.rows = n;
    out.label.assign(static_cast<size_t>(n), 0.f);
    out.dense.assign(static_cast<size_t>(n * nd), std::numeric_limits<float>::quiet_NaN());
    std::vector<uint8_t> keep;
    for (size_t t = 0; t < targets.size(); ++t) {
      const Target& tg = targets[t];
      const ColumnValues& v = vals[t];
      const ParquetField& f = file->fields()[field_of[t]];
      const bool u64 = f.is_unsigned && f.type == ParquetType::Int64;
      auto number = [&](int64_t s) -> double {
        if (!v.reals.empty()) return v.reals[s];
        return u64 ? static_cast<double>(static_cast<uint64_t>(v.ints[s]))
                   : static_cast<double>(v.ints[s]);
      };
      switch (tg.kind) {
        case ColumnKind::Label:
          for (int64_t r = 0; r < n; ++r) {
            const bool ok = v.present(r) && (number(r) == 0 || number(r) == 1);
            if (ok) {
              out.label[r] = static_cast<float>(number(r));
              continue;
            }
            const int64_t file_row = out.first_line - 1 + r;
            if (opt.on_error == OnError::Fail)
              fail(file->path(), ": row group ", row_group, ", column '", tg.name, "': row ",
                   file_row, ": ",
                   v.present(r) ? "label must be 0 or 1, got " + std::to_string(number(r))
                                : std::string("the label is null"));
            if (keep.empty()) keep.assign(static_cast<size_t>(n), 1);
            if (keep[r] && stats.skipped_rows == 0 && stats.first_skip_reason.empty())
              stats.first_skip_reason =
                  file->path() + ": row " + std::to_string(file_row) + ": " +
                  (v.present(r) ? "label must be 0 or 1" : "the label is null");
            keep[r] = 0;
          }
          break;
        case ColumnKind::Dense:
          for (int64_t r = 0; r < n; ++r)
            if (v.present(r)) out.dense[r * nd + tg.index] = static_cast<float>(number(r));
          break;
        case ColumnKind::Categorical: {
          std::vector<uint64_t>& cv = out.cat_values[tg.index];
          std::vector<int64_t>& co = out.cat_offsets[tg.index];
          const bool bytes = f.type == ParquetType::ByteArray;
          auto key = [&](int64_t s) {
            return bytes ? v.keys[s] : static_cast<uint64_t>(v.ints[s]);
          };
          co.resize(1);
          for (int64_t r = 0; r < n; ++r) {
            if (f.list) {
              for (int64_t s = v.offsets[r]; s < v.offsets[r + 1]; ++s)
                if (v.present(s)) cv.push_back(key(s));
            } else if (v.present(r)) {
              cv.push_back(key(r));
            }
            co.push_back(static_cast<int64_t>(cv.size()));
          }
          break;
        }
        case ColumnKind::Skip:
          break;
      }
    }
    if (!keep.empty()) {
      const int64_t before = out.rows;
      keep_rows(out, keep);
      stats.skipped_rows += before - out.rows;
    }
  }
};

ParquetReader::ParquetReader(std::vector<std::string> files, Schema schema, ReadOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.files = std::move(files);
  r.schema = std::move(schema);
  r.opt = options;
  DLREC_CHECK(!r.files.empty(), "ParquetReader: no input files");
  int nd = 0, nc = 0;
  for (const auto& c : r.schema.columns) {
    if (c.kind == ColumnKind::Skip) continue;
    Impl::Target t;
    t.kind = c.kind;
    t.name = c.name;
    t.multi_hot = c.multi_hot;
    t.index = c.kind == ColumnKind::Dense ? nd++ : c.kind == ColumnKind::Categorical ? nc++ : 0;
    r.targets.push_back(t);
  }
}

ParquetReader::~ParquetReader() = default;
bool ParquetReader::next(RawChunk& out) { return impl_->next(out); }
const ReadStats& ParquetReader::stats() const { return impl_->stats; }
const Schema& ParquetReader::schema() const { return impl_->schema; }

// ---------------------------------------------------------------------------------------------

bool is_parquet_path(const std::string& path) {
  std::string lower(path);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto ends = [&](const char* s) {
    const size_t n = std::strlen(s);
    return lower.size() >= n && lower.compare(lower.size() - n, n, s) == 0;
  };
  return ends(".parquet") || ends(".parq");
}

int64_t parquet_num_rows(const std::string& path) { return ParquetFile(path).num_rows(); }

std::unique_ptr<ChunkReader> open_reader(const std::vector<std::string>& files,
                                         const Schema& schema, const ReadOptions& options) {
  size_t parquet = 0;
  for (const auto& f : files) parquet += is_parquet_path(f);
  if (parquet > 0 && parquet < files.size()) {
    std::string p, t;
    for (const auto& f : files) (is_parquet_path(f) ? p : t) = f;
    fail("the inputs mix Parquet and text files ('", p, "', '", t,
         "'); give files of one kind");
  }
  if (parquet > 0) return std::make_unique<ParquetReader>(files, schema, options);
  return std::make_unique<TextReader>(files, schema, options);
}

}  // namespace dlrec::io
