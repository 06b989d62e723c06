// dlrec push: publishes the embedding rows that changed between two weight files as the next
// online update of a served model's store (include/dlrec/store/updates.h; docs/SERVING.md,
// "Online updates").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/store/updates.h"

namespace dlrec::train {

// The model's fixed tables (those a tiered store holds), from <model_dir>/model.json.
std::vector<store::TableInfo> model_store_tables(const std::string& model_dir);

struct PushResult {
  uint64_t version = 0;  // 0: nothing changed, nothing published
  int64_t rows = 0;
};

// Diffs the tables of `tables` between two tensor files holding them (a checkpoint.dlrec or an
// export's weights.dlrec: `base`, the state last pushed or exported, and `next`), and publishes
// the rows that differ (bitwise) as the stream's next version (or `version`, to publish a
// rejected one again; store::publish_update), in chunks of `chunk_rows`.
PushResult push_update(const std::vector<store::TableInfo>& tables, const std::string& base,
                       const std::string& next, const store::StreamAddress& at, int64_t chunk_rows,
                       uint64_t version = 0);

}  // namespace dlrec::train
