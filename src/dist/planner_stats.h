// The planner's reading of the ETL's stats.json (planner.cc: ids per sample; planner_hybrid.cc:
// frequency summaries): the checks both readers make first, with the same messages.
#pragma once

#include <string>

#include "dlrec/core/config.h"

namespace dlrec::dist {

// Throws "'<stats_path>': <why> (expected the stats.json of `dlrec etl`)".
[[noreturn]] void fail_bad_stats(const std::string& stats_path, const std::string& why);

// The columns.categorical array of `stats` (read from `stats_path`); a clear error when `stats`
// is not a dlrec-stats document or has no such array.
const json& stats_categorical_columns(const json& stats, const std::string& stats_path);

}  // namespace dlrec::dist
