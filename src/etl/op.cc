#include "dlrec/etl/op.h"

#include "dlrec/core/error.h"

namespace dlrec::etl {

const char* column_type_name(ColumnType t) {
  return t == ColumnType::Dense ? "dense" : t == ColumnType::Categorical ? "categorical" : "any";
}

OpRegistry& OpRegistry::global() {
  // Registered explicitly (not by static initializers, which a static library may drop).
  static OpRegistry* r = [] {
    auto* reg = new OpRegistry;
    register_dense_ops(*reg);
    register_categorical_ops(*reg);
    register_column_ops(*reg);
    register_feature_ops(*reg);
    return reg;
  }();
  return *r;
}

void OpRegistry::add(const std::string& name, ColumnType input, OpFactory factory) {
  DLREC_CHECK(!ops_.count(name), "op '", name, "' is registered twice");
  ops_[name] = Entry{input, std::move(factory)};
}

bool OpRegistry::has(const std::string& name) const { return ops_.count(name) != 0; }

ColumnType OpRegistry::input_type(const std::string& name) const {
  auto it = ops_.find(name);
  DLREC_CHECK(it != ops_.end(), "unknown op '", name, "'");
  return it->second.input;
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> v;
  for (const auto& [name, e] : ops_) v.push_back(name);
  return v;
}

std::unique_ptr<Op> OpRegistry::create(const json& spec, const std::string& where,
                                       bool fitted) const {
  ConfigReader r(spec, where);
  const json& op = r.raw("op");
  if (!op.is_string()) fail("'", where, ".op' must be a string, got ", op.dump());
  const std::string name = op.get<std::string>();
  auto it = ops_.find(name);
  if (it == ops_.end()) {
    std::string list;
    for (const auto& n : names()) list += (list.empty() ? "" : ", ") + n;
    std::string near = nearest_name(name, names());
    fail("unknown op '", name, "' at '", where, "'",
         near.empty() ? "" : " (did you mean '" + near + "'?)", "; known ops: ", list);
  }
  std::unique_ptr<Op> result = it->second.factory(r, fitted);
  r.finish();
  return result;
}

}  // namespace dlrec::etl
