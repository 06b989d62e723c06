// load_rank_shards: one data-parallel rank's training shards, from the ranks.json that
// `dlrec etl --ranks N` writes (docs/ETL.md "Shuffling and ranks", docs/FORMATS.md).
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"

namespace dlrec::io {

RankShards load_rank_shards(const std::string& dir, int rank, int ranks) {
  DLREC_CHECK(ranks >= 1, "ranks must be >= 1, got ", ranks);
  DLREC_CHECK(rank >= 0 && rank < ranks, "rank ", rank, " is out of range for ", ranks,
              " ranks (ranks are 0 to ", ranks - 1, ")");
  const std::string path = dir + "/ranks.json";
  if (!file_exists(path))
    fail("dataset '", dir, "' has no ranks.json: prepare it for ", ranks,
         " ranks with `dlrec etl --ranks ", ranks, "`");
  json j;
  try {
    j = read_json_file(path);
  } catch (const Error& e) {
    fail("'", path, "': ", e.what());
  }
  ConfigReader r(j, "ranks.json");
  const std::string format = r.get<std::string>("format", "");
  if (format != "dlrec-ranks") fail("'", path, "': format '", format, "', expected 'dlrec-ranks'");
  const int64_t version = r.get<int64_t>("version", 0);
  if (version != 1) fail("'", path, "': unsupported version ", version, " (this build reads 1)");
  const int64_t n = r.require<int64_t>("ranks");
  const auto rows = r.require<std::vector<int64_t>>("train_rows");
  const auto shards = r.require<std::vector<std::vector<std::string>>>("train_shards");
  r.get<bool>("shuffle", false);
  r.get<uint64_t>("seed", 0);
  r.finish();
  if (n != ranks)
    fail("'", path, "' splits the training rows for ", n, " ranks, not ", ranks,
         "; run `dlrec etl --ranks ", ranks, "` again or train with ", n, " ranks");
  if (static_cast<int64_t>(rows.size()) != n || static_cast<int64_t>(shards.size()) != n)
    fail("'", path, "': train_rows and train_shards must list ", n, " ranks, got ", rows.size(),
         " and ", shards.size());
  RankShards out;
  out.shards = shards[rank];
  out.rows = rows[rank];
  int64_t in_files = 0;
  for (const auto& s : out.shards) in_files += ShardReader(dir + "/" + s).rows();
  if (in_files != out.rows)
    fail("'", path, "': rank ", rank, " should hold ", out.rows, " rows, its shards hold ",
         in_files);
  return out;
}

}  // namespace dlrec::io
