// Column ops: Rename, DropLowCardinality (docs/ETL.md). They change how a column appears in the
// output, not its values.
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

// {"op": "Rename", "name": "user_id"} or {"op": "Rename", "prefix": "p_", "suffix": "_s"}:
// the output feature's name. Applies to dense and categorical columns, anywhere in the chain.
class Rename final : public ColumnOp {
 public:
  Rename(std::string name, std::string prefix, std::string suffix)
      : name_(std::move(name)), prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  std::string name() const override { return "Rename"; }
  ColumnType input_type() const override { return ColumnType::Any; }
  json to_json() const override {
    json j = {{"op", name()}};
    if (!name_.empty()) j["name"] = name_;
    if (!prefix_.empty()) j["prefix"] = prefix_;
    if (!suffix_.empty()) j["suffix"] = suffix_;
    return j;
  }
  std::string rename(const std::string& n) const override {
    return name_.empty() ? prefix_ + n + suffix_ : name_;
  }

 private:
  std::string name_, prefix_, suffix_;
};

// {"op": "DropLowCardinality", "min_cardinality": 3}: after its encoder (it must follow one),
// drops the categorical feature from the output when the fitted cardinality (reserved ids
// included) is below min_cardinality. The default 3 drops a column whose vocabulary is empty
// (every training value missing or rarer than freq_threshold), as NVTabular's default does.
class DropLowCardinality final : public ColumnOp {
 public:
  explicit DropLowCardinality(int64_t min_card) : min_(min_card) {}
  std::string name() const override { return "DropLowCardinality"; }
  ColumnType input_type() const override { return ColumnType::Categorical; }
  json to_json() const override { return {{"op", name()}, {"min_cardinality", min_}}; }
  bool drops(int64_t cardinality) const override { return cardinality < min_; }

 private:
  int64_t min_;
};

}  // namespace

void register_column_ops(OpRegistry& reg) {
  reg.add("Rename", ColumnType::Any, [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    std::string name = r.get<std::string>("name", "");
    std::string prefix = r.get<std::string>("prefix", "");
    std::string suffix = r.get<std::string>("suffix", "");
    if (name.empty() == (prefix.empty() && suffix.empty()))
      fail("'", r.path(), "': Rename needs either \"name\" or \"prefix\"/\"suffix\"");
    return std::make_unique<Rename>(name, prefix, suffix);
  });
  reg.add("DropLowCardinality", ColumnType::Categorical,
          [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
            return std::make_unique<DropLowCardinality>(r.get_int_range(
                "min_cardinality", 3, 0, std::numeric_limits<int64_t>::max()));
          });
}

}  // namespace dlrec::etl
