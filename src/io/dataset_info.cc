// DatasetInfo: dataset.json, the description of an ETL output directory (layout, shards, rows).
#include <set>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"

namespace dlrec::io {

// ---------------------------------------------------------------------------------------------
// DatasetInfo

json DatasetInfo::to_json() const {
  json j = {{"format", "dlrec-dataset"},        {"version", 1},
            {"layout", layout.to_json()},       {"train_shards", train_shards},
            {"valid_shards", valid_shards},     {"train_rows", train_rows},
            {"valid_rows", valid_rows}};
  if (!dense_names.empty()) j["dense_names"] = dense_names;
  if (!cat_names.empty()) j["cat_names"] = cat_names;
  return j;
}

DatasetInfo DatasetInfo::from_json(const json& j) {
  ConfigReader r(j, "dataset");
  DatasetInfo d;
  std::string format = r.get<std::string>("format", "dlrec-dataset");
  DLREC_CHECK(format == "dlrec-dataset", "dataset.json: format is '", format,
              "', expected 'dlrec-dataset'");
  int64_t version = r.get<int64_t>("version", 1);
  DLREC_CHECK(version == 1, "dataset.json: unsupported version ", version);
  d.layout = ShardLayout::from_json(r.raw("layout"));
  d.train_shards = r.get<std::vector<std::string>>("train_shards", {});
  d.valid_shards = r.get<std::vector<std::string>>("valid_shards", {});
  d.train_rows = r.get_int_range("train_rows", 0, 0, INT64_MAX);
  d.valid_rows = r.get_int_range("valid_rows", 0, 0, INT64_MAX);
  d.dense_names = r.get<std::vector<std::string>>("dense_names", {});
  d.cat_names = r.get<std::vector<std::string>>("cat_names", {});
  r.finish();
  DLREC_CHECK(d.dense_names.empty() || static_cast<int>(d.dense_names.size()) ==
                                           d.layout.num_dense,
              "dataset.json: ", d.dense_names.size(), " dense_names for ", d.layout.num_dense,
              " dense features");
  DLREC_CHECK(d.cat_names.empty() || d.cat_names.size() == d.layout.cardinalities.size(),
              "dataset.json: ", d.cat_names.size(), " cat_names for ",
              d.layout.cardinalities.size(), " categorical features");
  return d;
}

DatasetInfo DatasetInfo::load(const std::string& dir) {
  const std::string path = dir + "/dataset.json";
  json j = read_json_file(path);
  try {
    return from_json(j);
  } catch (const Error& e) {
    fail("'", path, "': ", e.what());
  }
}

void DatasetInfo::verify(const std::string& dir) const {
  const std::string where = "'" + dir + "/dataset.json'";
  std::set<std::string> seen;
  auto check = [&](const std::vector<std::string>& shards, int64_t expected, const char* split) {
    int64_t rows = 0;
    for (const std::string& s : shards) {
      if (s.empty()) fail(where, ": an empty name in ", split, "_shards");
      if (!seen.insert(s).second) fail(where, ": shard '", s, "' is listed twice");
      ShardReader r(dir + "/" + s);
      if (!(r.layout() == layout))
        fail(where, ": shard '", s, "' has the layout ", r.layout().to_json().dump(),
             ", dataset.json says ", layout.to_json().dump());
      rows += r.rows();
    }
    if (rows != expected)
      fail(where, ": ", split, "_rows is ", expected, " but its ", shards.size(), " ", split,
           " shards hold ", rows, " rows");
  };
  check(train_shards, train_rows, "train");
  check(valid_shards, valid_rows, "valid");
}

void DatasetInfo::save(const std::string& dir) const {
  write_file_atomic(dir + "/dataset.json", to_json().dump(2) + "\n");
}

}  // namespace dlrec::io
