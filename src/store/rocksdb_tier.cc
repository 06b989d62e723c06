// The RocksDB tier: the persistent store of the full tables (docs/SERVING.md, "Tiered embedding
// store"; docs/FORMATS.md-style layout in docs/EXPORT.md, "Tables in RocksDB").
//   key "r" + table index (u16 big-endian) + id (u64 big-endian)  value: dim floats, f32 LE
//   key "!dlrec-store"  value: JSON {"format": "dlrec-embedding-store", "version": 1,
//                        "row_set_version": 1, "tables": [{name, feature, rows, dim}],
//                        "checksum": FNV-1a 64 of the tables' JSON text (hex)}
// Big-endian keys keep a table's rows together and in id order (one key prefix per table). The
// meta record is written last, so a store whose writer died has none and is refused. Rows are
// protected by RocksDB's block checksums (verified on every read).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/store/embedding_store.h"

#ifdef DLREC_WITH_ROCKSDB
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#endif

namespace dlrec::store {

#ifdef DLREC_WITH_ROCKSDB

namespace {

namespace fs = std::filesystem;
constexpr const char* kMetaKey = "!dlrec-store";
constexpr const char* kFormat = "dlrec-embedding-store";
constexpr int kStoreVersion = 1;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "rows are stored as little-endian floats: a big-endian host needs byte swaps");

std::string row_key(int table, int64_t id) {
  std::string k(11, '\0');
  k[0] = 'r';
  k[1] = static_cast<char>((table >> 8) & 0xFF);
  k[2] = static_cast<char>(table & 0xFF);
  const auto u = static_cast<uint64_t>(id);
  for (int b = 0; b < 8; ++b) k[3 + b] = static_cast<char>((u >> (56 - 8 * b)) & 0xFF);
  return k;
}

json tables_json(const std::vector<TableInfo>& tables) {
  json a = json::array();
  for (const TableInfo& t : tables)
    a.push_back({{"name", t.name}, {"feature", t.feature}, {"rows", t.rows}, {"dim", t.dim}});
  return a;
}

std::string fnv1a_hex(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Why the store's tables differ from the model's, or "" when they are equal.
std::string table_difference(const std::vector<TableInfo>& have,
                             const std::vector<TableInfo>& want) {
  if (have.size() != want.size())
    return "it holds " + std::to_string(have.size()) + " tables, the model has " +
           std::to_string(want.size());
  for (size_t k = 0; k < have.size(); ++k) {
    const TableInfo &h = have[k], &w = want[k];
    const std::string at = "table " + std::to_string(k) + " ('" + w.name + "')";
    if (h.name != w.name || h.feature != w.feature)
      return at + " is '" + h.name + "' (feature " + std::to_string(h.feature) + ") in the store";
    if (h.rows != w.rows)
      return at + " has " + std::to_string(h.rows) + " rows in the store, " +
             std::to_string(w.rows) + " in the model";
    if (h.dim != w.dim)
      return at + " has dim " + std::to_string(h.dim) + " in the store, " + std::to_string(w.dim) +
             " in the model";
  }
  return "";
}

// Field `key` of the meta record's object `obj` (at `what`: the store and the record) as T, or
// `fallback` when it is absent; a value of another JSON type is an error naming the store, the
// key and the type expected (not nlohmann's "type must be number, but is string").
template <class T>
T meta_field(const json& obj, const std::string& key, const std::string& what, const T& fallback) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  bool ok = false;
  const char* type = "";
  if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
    type = "a string";
  } else if constexpr (std::is_unsigned_v<T>) {
    ok = it->is_number_unsigned();
    type = "an integer >= 0";
  } else {
    ok = it->is_number_integer();
    type = "an integer";
  }
  DLREC_CHECK(ok, what, ": key '", key, "' is ", it->dump().substr(0, 80), " (", it->type_name(),
              "), expected ", type);
  return it->get<T>();
}

int64_t dir_bytes(const std::string& path) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(path, ec))
    if (e.is_regular_file(ec)) total += static_cast<int64_t>(e.file_size(ec));
  return total;
}

}  // namespace

namespace {

class RocksDbTier final : public Tier {
 public:
  RocksDbTier(const std::string& path, const std::vector<TableInfo>& expected,
              int64_t block_cache_bytes, const std::string& export_id, const std::string& reads)
      : path_(path), tables_(expected), cache_bytes_(block_cache_bytes), export_id_(export_id) {
    DLREC_CHECK(reads == "pread" || reads == "mmap", "rocksdb tier: reads '", reads,
                "': expected 'pread' or 'mmap'");
    DLREC_CHECK(fs::is_directory(path), "rocksdb tier: no store at '", path,
                "' (write one with dlrec export --tiers rocksdb=DIR)");
    rocksdb::Options options;
    options.create_if_missing = false;
    options.paranoid_checks = true;
    options.allow_mmap_reads = reads == "mmap";
    options.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
    rocksdb::BlockBasedTableOptions table;
    table.block_cache =
        rocksdb::NewLRUCache(static_cast<size_t>(std::max<int64_t>(block_cache_bytes, 1)));
    options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    rocksdb::DB* db = nullptr;
    const rocksdb::Status st = rocksdb::DB::OpenForReadOnly(options, path, &db);
    DLREC_CHECK(st.ok(), "rocksdb tier: cannot open the store at '", path, "': ", st.ToString());
    db_.reset(db);
    check_meta();
    disk_ = dir_bytes(path);
  }
  std::string name() const override { return "rocksdb"; }
  bool complete() const override { return true; }
  uint64_t version() const override { return row_set_version_; }
  int64_t memory_bound() const override { return cache_bytes_; }
  int64_t disk_bytes() const override { return disk_; }

  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    std::vector<std::string> keys(static_cast<size_t>(n));
    std::vector<rocksdb::Slice> slices(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      keys[i] = row_key(table, ids[i]);
      slices[i] = keys[i];
    }
    std::vector<std::string> values;
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    const std::vector<rocksdb::Status> st = db_->MultiGet(ro, slices, &values);
    for (int64_t i = 0; i < n; ++i) {
      if (st[i].IsNotFound()) continue;
      DLREC_CHECK(st[i].ok(), "rocksdb tier '", path_, "': reading row ", ids[i], " of table '",
                  tables_[table].name, "': ", st[i].ToString());
      DLREC_CHECK(static_cast<int64_t>(values[i].size()) == dim * 4, "rocksdb tier '", path_,
                  "': row ", ids[i], " of table '", tables_[table].name, "' holds ",
                  values[i].size(), " bytes, expected ", dim * 4, " (", dim,
                  " floats): the store is corrupt");
      std::memcpy(out + i * dim, values[i].data(), static_cast<size_t>(dim) * 4);
      found[i] = 1;
    }
  }

 private:
  void check_meta() {
    std::string text;
    const rocksdb::Status st = db_->Get(rocksdb::ReadOptions(), kMetaKey, &text);
    DLREC_CHECK(!st.IsNotFound(), "rocksdb tier: '", path_,
                "' is not a complete dlrec embedding store (no '", kMetaKey,
                "' record: not written by dlrec export, or its export did not finish)");
    DLREC_CHECK(st.ok(), "rocksdb tier '", path_, "': reading its meta record: ", st.ToString());
    const std::string what = path_ + " (record " + kMetaKey + ")";
    const json meta = parse_json(text, what);
    DLREC_CHECK(meta.is_object(), what, ": not a dlrec embedding store (the record is ",
                meta.type_name(), ", expected an object)");
    DLREC_CHECK(meta_field<std::string>(meta, "format", what, "") == kFormat, what,
                ": not a dlrec embedding store (format field)");
    const int64_t version = meta_field<int64_t>(meta, "version", what, 0);
    DLREC_CHECK(version == kStoreVersion, what, ": store format version ", version,
                "; this dlrec reads version ", kStoreVersion, " (export the model again)");
    DLREC_CHECK(meta.contains("tables") && meta["tables"].is_array(), what, ": no table list");
    const std::string checksum = fnv1a_hex(meta["tables"].dump());
    const std::string recorded = meta_field<std::string>(meta, "checksum", what, "");
    DLREC_CHECK(recorded == checksum, what, ": the table list's checksum does not match (",
                recorded, " recorded, ", checksum, " computed): the store is corrupt");
    std::vector<TableInfo> have;
    for (size_t k = 0; k < meta["tables"].size(); ++k) {
      const json& t = meta["tables"][k];
      const std::string at = what + ": tables[" + std::to_string(k) + "]";
      DLREC_CHECK(t.is_object(), at, " is ", t.type_name(), ", expected an object");
      for (const char* key : {"name", "feature", "rows", "dim"})
        DLREC_CHECK(t.contains(key), at, ": no key '", key, "'");
      have.push_back({meta_field<std::string>(t, "name", at, ""),
                      meta_field<int64_t>(t, "feature", at, 0),
                      meta_field<int64_t>(t, "rows", at, 0), meta_field<int64_t>(t, "dim", at, 0)});
    }
    const std::string diff = table_difference(have, tables_);
    DLREC_CHECK(diff.empty(), "rocksdb tier: the store at '", path_,
                "' was written for another model: ", diff);
    row_set_version_ = meta_field<uint64_t>(meta, "row_set_version", what, 1);
    const std::string id = meta_field<std::string>(meta, "export_id", what, "");
    DLREC_CHECK(export_id_.empty() || id == export_id_, what,
                " was written by another export (id '", id, "', the model names '", export_id_,
                "'): export the model again, or point its config at the store it was exported "
                "with");
  }

  std::string path_;
  std::vector<TableInfo> tables_;
  int64_t cache_bytes_, disk_ = 0;
  std::string export_id_;  // "": not checked
  uint64_t row_set_version_ = 1;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

bool rocksdb_available() { return true; }

std::unique_ptr<Tier> open_rocksdb_tier(const std::string& path,
                                        const std::vector<TableInfo>& expected,
                                        int64_t block_cache_bytes, const std::string& export_id,
                                        const std::string& reads) {
  return std::make_unique<RocksDbTier>(path, expected, block_cache_bytes, export_id, reads);
}

void write_rocksdb_store(const std::string& path, const std::vector<TableRows>& tables,
                         bool overwrite, const std::string& export_id) {
  DLREC_CHECK(tables.size() < (size_t{1} << 16), "rocksdb store: at most 65535 tables");
  for (const std::string& line : recover_dir(path))
    std::fprintf(stderr, "export: %s\n", line.c_str());
  if (fs::exists(path) && !overwrite)
    fail("'", path, "' already exists (use --overwrite to replace it)");
  const std::string tmp = staging_dir_for(path);
  fs::remove_all(tmp);
  try {
    rocksdb::Options options;
    options.create_if_missing = true;
    options.error_if_exists = true;
    options.compression = rocksdb::kNoCompression;  // float rows hardly compress
    options.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
    rocksdb::DB* raw = nullptr;
    rocksdb::Status st = rocksdb::DB::Open(options, tmp, &raw);
    DLREC_CHECK(st.ok(), "rocksdb store: cannot create '", tmp, "': ", st.ToString());
    std::unique_ptr<rocksdb::DB> db(raw);
    // Rows go into SST files written in key order (one per table and 1 GiB at most), written
    // in parallel (each file's keys are a contiguous id range of one table, so the files do not
    // overlap) and ingested whole: several times faster than puts through the memtable.
    struct FileJob {
      size_t table;
      int64_t first, end;
    };
    std::vector<TableInfo> infos;
    std::vector<FileJob> jobs;
    for (size_t k = 0; k < tables.size(); ++k) {
      const TableRows& t = tables[k];
      infos.push_back(t.info);
      const size_t row_bytes = static_cast<size_t>(t.info.dim) * 4;
      const int64_t rows_per_file =
          std::max<int64_t>(1, (int64_t{1} << 30) / static_cast<int64_t>(row_bytes + 16));
      for (int64_t first = 0; first < t.info.rows; first += rows_per_file)
        jobs.push_back({k, first, std::min(t.info.rows, first + rows_per_file)});
    }
    std::vector<std::string> files(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) files[j] = tmp + "/ingest_" + std::to_string(j) + ".sst";
    parallel_for(0, static_cast<int64_t>(jobs.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) {
        const FileJob& job = jobs[static_cast<size_t>(j)];
        const TableRows& t = tables[job.table];
        const size_t row_bytes = static_cast<size_t>(t.info.dim) * 4;
        rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), options);
        rocksdb::Status ws = writer.Open(files[static_cast<size_t>(j)]);
        for (int64_t id = job.first; ws.ok() && id < job.end; ++id) {
          const char* row = reinterpret_cast<const char*>(t.data + id * t.info.dim);
          ws = writer.Put(row_key(static_cast<int>(job.table), id), rocksdb::Slice(row, row_bytes));
        }
        if (ws.ok()) ws = writer.Finish();
        DLREC_CHECK(ws.ok(), "rocksdb store '", tmp, "': writing table '", t.info.name,
                    "' (rows ", job.first, "..", job.end - 1, "): ", ws.ToString());
      }
    });
    rocksdb::IngestExternalFileOptions ingest;
    ingest.move_files = true;
    if (!files.empty()) st = db->IngestExternalFile(files, ingest);
    DLREC_CHECK(st.ok(), "rocksdb store '", tmp, "': ingesting the tables: ", st.ToString());
    rocksdb::WriteOptions wo;
    const json list = tables_json(infos);
    const json meta = {{"format", kFormat},
                       {"version", kStoreVersion},
                       {"row_set_version", 1},
                       {"export_id", export_id},
                       {"tables", list},
                       {"checksum", fnv1a_hex(list.dump())}};
    st = db->Put(wo, kMetaKey, meta.dump());
    if (st.ok()) st = db->Flush(rocksdb::FlushOptions());
    DLREC_CHECK(st.ok(), "rocksdb store '", tmp, "': finishing: ", st.ToString());
    st = db->Close();
    DLREC_CHECK(st.ok(), "rocksdb store '", tmp, "': closing: ", st.ToString());
    db.reset();
    replace_dir(tmp, path);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

#else  // built without librocksdb-dev

bool rocksdb_available() { return false; }

std::unique_ptr<Tier> open_rocksdb_tier(const std::string& path, const std::vector<TableInfo>&,
                                        int64_t, const std::string&, const std::string&) {
  fail("rocksdb tier ('", path,
       "'): this dlrec was built without RocksDB (librocksdb-dev; scripts/install-deps.sh)");
}

void write_rocksdb_store(const std::string& path, const std::vector<TableRows>&, bool,
                         const std::string&) {
  fail("export to RocksDB ('", path,
       "'): this dlrec was built without RocksDB (librocksdb-dev; scripts/install-deps.sh)");
}

#endif

}  // namespace dlrec::store
