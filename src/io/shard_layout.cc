// ShardLayout (the columns of a shard) and its JSON form; see shard_format.h for the format.
#include "dlrec/core/error.h"
#include "shard_format.h"

namespace dlrec::io {

namespace shard_format {

void validate_layout(const ShardLayout& l, const std::string& where) {
  DLREC_CHECK(l.num_dense >= 0, where, ": negative num_dense");
  DLREC_CHECK(l.cardinalities.size() == l.multi_hot.size(), where,
              ": layout has ", l.cardinalities.size(), " cardinalities but ", l.multi_hot.size(),
              " multi_hot flags");
  for (size_t t = 0; t < l.cardinalities.size(); ++t)
    DLREC_CHECK(l.cardinalities[t] >= 1, where, ": categorical feature ", t,
                " has cardinality ", l.cardinalities[t], " (must be >= 1)");
}


}  // namespace shard_format

// ---------------------------------------------------------------------------------------------
// ShardLayout

json ShardLayout::to_json() const {
  json mh = json::array();
  for (bool b : multi_hot) mh.push_back(static_cast<bool>(b));
  return {{"num_dense", num_dense}, {"cardinalities", cardinalities}, {"multi_hot", mh}};
}

ShardLayout ShardLayout::from_json(const json& j) {
  ConfigReader r(j, "layout");
  ShardLayout l;
  l.num_dense = static_cast<int>(r.get_int_range("num_dense", 0, 0, 1 << 30));
  l.cardinalities = r.require<std::vector<int64_t>>("cardinalities");
  l.multi_hot = r.get<std::vector<bool>>("multi_hot",
                                         std::vector<bool>(l.cardinalities.size(), false));
  r.finish();
  shard_format::validate_layout(l, "layout");
  return l;
}

}  // namespace dlrec::io
