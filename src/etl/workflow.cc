#include "dlrec/etl/workflow.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"

#include "etl/workflow_impl.h"

namespace dlrec::etl {

namespace {

// Pretty JSON where arrays of scalars stay on one line (vocabularies can hold millions of keys).
void pretty(const json& j, int indent, std::string& out) {
  const std::string pad(indent, ' '), pad2(indent + 2, ' ');
  if (j.is_object() && !j.empty()) {
    out += "{\n";
    size_t i = 0;
    for (auto it = j.begin(); it != j.end(); ++it, ++i) {
      out += pad2 + json(it.key()).dump() + ": ";
      pretty(it.value(), indent + 2, out);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out += pad + "}";
  } else if (j.is_array() && !j.empty() &&
             std::any_of(j.begin(), j.end(), [](const json& e) { return e.is_structured(); })) {
    out += "[\n";
    for (size_t i = 0; i < j.size(); ++i) {
      out += pad2;
      pretty(j[i], indent + 2, out);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out += pad + "]";
  } else {
    out += j.dump();
  }
}

}  // namespace


Workflow::Workflow(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Workflow::Workflow(Workflow&&) noexcept = default;
Workflow& Workflow::operator=(Workflow&&) noexcept = default;
Workflow::~Workflow() = default;

Workflow Workflow::from_config(const json& config, const io::Schema& schema,
                               const std::string& base_dir) {
  auto m = std::make_unique<Impl>();
  m->input_schema = schema;
  m->schema = schema;
  m->config = config;
  ConfigReader root(config, "");
  const json& steps = root.raw("pipeline");
  const json joins = root.has("join_external") ? root.raw("join_external") : json(nullptr);
  const json label = root.has("label") ? root.raw("label") : json(nullptr);
  root.finish();
  m->joins.from_config(joins, base_dir, m->schema);
  m->init_columns();
  if (!label.is_null()) {
    if (!label.is_string()) fail("config key 'label' must be a column name, got ", label.dump());
    m->set_label(label.get<std::string>(), "label");
  }
  if (!steps.is_array()) fail("config key 'pipeline' must be a list of steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string where = "pipeline[" + std::to_string(i) + "]";
    ConfigReader step(steps[i], where);
    const json& cols = step.raw("columns");
    const json& ops = step.raw("ops");
    step.finish();
    std::vector<ColumnPipe*> targets = m->resolve(cols, where + ".columns");
    if (!ops.is_array()) fail("'", where, ".ops' must be a list of ops");
    for (size_t k = 0; k < ops.size(); ++k) {
      const std::string op_where = where + ".ops[" + std::to_string(k) + "]";
      if (targets.empty()) {  // still validate the op
        OpRegistry::global().create(ops[k], op_where, false);
        continue;
      }
      m->add_step_op(targets, ops[k], op_where, false);
    }
  }
  m->validate();
  m->fitted = true;
  for (auto* v : {&m->dense, &m->cat})
    for (auto& p : *v)
      for (auto& op : p.ops) m->fitted = m->fitted && op->fitted();
  for (auto& f : m->features) m->fitted = m->fitted && f.op->fitted();
  m->build_plan(m->fitted);  // checks output names
  return Workflow(std::move(m));
}

Workflow Workflow::from_json(const json& j) {
  auto m = std::make_unique<Impl>();
  ConfigReader r(j, "workflow");
  std::string format = r.get<std::string>("format", "");
  if (format != "dlrec-workflow")
    fail("not a fitted dlrec workflow (format '", format, "', expected 'dlrec-workflow')");
  int64_t version = r.get<int64_t>("version", 0);
  if (version != 1) fail("workflow: unsupported version ", version, " (this build reads 1)");
  m->input_schema = m->schema = io::Schema::from_json(r.raw("schema"));
  m->config = r.get<json>("config", json::object());
  m->joins.from_json(r.has("join_external") ? r.raw("join_external") : json(nullptr), m->schema);
  m->init_columns();
  const json& cols = r.raw("columns");
  const json features = r.get<json>("features", json::array());
  const json filters = r.get<json>("filters", json::array());
  r.raw("output");  // informational; checked against the rebuilt layout below
  const std::string label = r.get<std::string>("label", "");
  r.finish();
  if (!label.empty()) m->set_label(label, "workflow.label");
  if (!cols.is_array()) fail("workflow: 'columns' must be a list");
  std::set<std::string> seen;
  for (size_t i = 0; i < cols.size(); ++i) {
    const std::string where = "workflow.columns[" + std::to_string(i) + "]";
    ConfigReader c(cols[i], where);
    std::string name = c.require<std::string>("name");
    std::string kind = c.require<std::string>("kind");
    c.get<bool>("multi_hot", false);
    const json& ops = c.raw("ops");
    c.finish();
    ColumnPipe* p = m->find(name);
    if (!p) fail("'", where, "': column '", name, "' is not a dense or categorical column of the schema");
    if (kind != column_type_name(p->type))
      fail("'", where, "': column '", name, "' is ", column_type_name(p->type), ", not ", kind);
    if (!seen.insert(name).second) fail("'", where, "': column '", name, "' appears twice");
    if (!ops.is_array()) fail("'", where, ".ops' must be a list");
    for (size_t k = 0; k < ops.size(); ++k)
      m->add_op(*p, ops[k], where + ".ops[" + std::to_string(k) + "]", true);
  }
  for (auto* v : {&m->dense, &m->cat})
    for (auto& p : *v)
      if (!seen.count(p.name)) fail("workflow: column '", p.name, "' of the schema has no entry");
  if (!features.is_array() || !filters.is_array())
    fail("workflow: 'features' and 'filters' must be lists");
  const OpRegistry& reg = OpRegistry::global();
  for (size_t i = 0; i < features.size(); ++i) {
    const std::string where = "workflow.features[" + std::to_string(i) + "]";
    ConfigReader c(features[i], where);
    auto names = c.require<std::vector<std::string>>("columns");
    const json& op = c.raw("op");
    c.finish();
    std::unique_ptr<Op> o = reg.create(op, where + ".op", true);
    auto* f = dynamic_cast<FeatureOp*>(o.get());
    if (!f) fail("'", where, ".op': '", o->name(), "' is not a feature op");
    o.release();
    m->add_feature(std::unique_ptr<FeatureOp>(f), names, where);
  }
  for (size_t i = 0; i < filters.size(); ++i) {
    const std::string where = "workflow.filters[" + std::to_string(i) + "]";
    ConfigReader c(filters[i], where);
    std::string name = c.require<std::string>("column");
    const json& op = c.raw("op");
    c.finish();
    if (m->dense_index(name) < 0) fail("'", where, "': '", name, "' is not a dense column");
    std::unique_ptr<Op> o = reg.create(op, where + ".op", true);
    auto* f = dynamic_cast<RowFilter*>(o.get());
    if (!f) fail("'", where, ".op': '", o->name(), "' is not a filter");
    o.release();
    m->add_filter(std::unique_ptr<RowFilter>(f), name);
  }
  m->validate();
  m->fitted = true;
  m->build_plan(true);
  Workflow w(std::move(m));
  if (j.at("output").contains("layout") &&
      !(io::ShardLayout::from_json(j.at("output").at("layout")) == w.output_layout()))
    fail("workflow: the stored output layout does not match the columns' fitted state");
  return w;
}

Workflow Workflow::load(const std::string& path) {
  json j = read_json_file(path);
  try {
    return from_json(j);
  } catch (const Error& e) {
    fail("'", path, "': ", e.what());
  }
}

io::ShardLayout Workflow::output_layout() const {
  DLREC_CHECK(impl_->fitted, "Workflow::output_layout: the workflow is not fitted");
  io::ShardLayout l;
  l.num_dense = static_cast<int>(impl_->dense_out.size());
  for (const auto& o : impl_->cat_out) {
    l.cardinalities.push_back(o.cardinality);
    l.multi_hot.push_back(o.multi_hot);
  }
  return l;
}

std::vector<std::string> Workflow::dense_names() const {
  std::vector<std::string> v;
  for (const auto& o : impl_->dense_out) v.push_back(o.name);
  return v;
}

std::vector<std::string> Workflow::cat_names() const {
  std::vector<std::string> v;
  for (const auto& o : impl_->cat_out) v.push_back(o.name);
  return v;
}

const io::Schema& Workflow::schema() const { return impl_->input_schema; }
std::string Workflow::label_name() const { return impl_->label_name(); }
std::string Workflow::derived_label_column() const {
  return impl_->label_pipe >= 0 ? impl_->dense[impl_->label_pipe].name : "";
}
const json& Workflow::config() const { return impl_->config; }

json Workflow::to_json() const {
  const Impl& m = *impl_;
  DLREC_CHECK(m.fitted, "Workflow::to_json: the workflow is not fitted");
  json cols = json::array();
  // Schema order, so a reader sees the columns as in the input.
  for (const auto& c : m.schema.columns) {
    for (auto* v : {&m.dense, &m.cat})
      for (const auto& p : *v)
        if (p.name == c.name) cols.push_back(m.column_json(p));
  }
  json j = {{"format", "dlrec-workflow"},
            {"version", 1},
            {"schema", m.input_schema.to_json()},
            {"config", m.config},
            {"columns", cols}};
  if (!m.joins.empty()) j["join_external"] = m.joins.to_json();
  if (m.label_pipe >= 0) j["label"] = m.dense[m.label_pipe].name;  // absent: the schema's
  if (!m.features.empty()) {
    json f = json::array();
    for (const auto& s : m.features) f.push_back({{"columns", s.columns}, {"op", s.op->to_json()}});
    j["features"] = f;
  }
  if (!m.filters.empty()) {
    json f = json::array();
    for (const auto& s : m.filters) f.push_back({{"column", s.column}, {"op", s.op->to_json()}});
    j["filters"] = f;
  }
  j["output"] = {{"layout", output_layout().to_json()},
                 {"dense_names", dense_names()},
                 {"cat_names", cat_names()}};
  return j;
}

void Workflow::save(const std::string& path) const {
  std::string s;
  pretty(to_json(), 0, s);
  s += "\n";
  write_file_atomic(path, s);
}

json Workflow::fit_stats() const {
  const Impl& m = *impl_;
  DLREC_CHECK(m.have_stats, "Workflow::fit_stats: no statistics (the workflow was not fitted "
                            "in this process)");
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json dense = json::array(), cat = json::array();
  for (const auto& p : m.dense) {
    const ColumnStats& s = p.stats;
    dense.push_back({{"name", p.name},
                     {"rows", s.rows},
                     {"nulls", s.nulls},
                     {"min", num(s.min)},
                     {"max", num(s.max)},
                     {"mean", s.values ? num(s.sum / s.values) : json(nullptr)}});
    for (const auto& op : p.ops) {
      json f = op->fit_summary();
      if (!f.is_null()) dense.back()[op->name()] = f;
    }
  }
  for (const auto& p : m.cat) {
    const ColumnStats& s = p.stats;
    json c = {{"name", p.name},         {"rows", s.rows},
              {"nulls", s.nulls},       {"multi_hot", p.multi_hot},
              {"values", s.values},     {"cardinality", p.encoder().cardinality()}};
    if (p.dropped()) c["dropped"] = true;
    json f = p.encoder().fit_summary();
    if (f.is_object())
      for (auto it = f.begin(); it != f.end(); ++it)
        if (!c.contains(it.key())) c[it.key()] = it.value();
    cat.push_back(c);
  }
  for (size_t i = 0; i < m.dense.size(); ++i)
    if (m.dense[i].dense_encoder()) dense[i]["cardinality"] = m.dense[i].cardinality();
  json r = {{"rows", m.stats_rows}, {"dense", dense}, {"categorical", cat}};
  if (!m.filters.empty()) r["filtered_rows"] = m.stats_input_rows - m.stats_rows;
  if (!m.joins.empty()) r["join_external"] = m.joins.summary();
  if (!m.features.empty()) {
    json f = json::array();
    for (const auto& s : m.features) {
      json e = {{"op", s.op->name()}, {"columns", s.columns}};
      json sum = s.op->fit_summary();
      if (!sum.is_null()) e["fit"] = sum;
      f.push_back(e);
    }
    r["features"] = f;
  }
  return r;
}

}  // namespace dlrec::etl
