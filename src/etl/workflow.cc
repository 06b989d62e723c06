#include "dlrec/etl/workflow.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::etl {
namespace {

constexpr int64_t kRowBlock = 8192;  // rows per transform task

// Raw statistics of one column over the training rows of the first fit pass.
struct ColumnStats {
  int64_t rows = 0, nulls = 0;
  // Dense: over present values. Categorical: values = keys seen (multi-hot: several per row).
  int64_t values = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
};

struct ColumnPipe {
  std::string name;
  ColumnType type = ColumnType::Dense;
  bool multi_hot = false;
  int index = 0;  // position among the chunk's dense or categorical columns
  std::vector<std::unique_ptr<Op>> ops;
  ColumnStats stats;

  std::vector<int> fit_ops() const {  // indices of the ops that learn from data
    std::vector<int> v;
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i]->needs_fit()) v.push_back(static_cast<int>(i));
    return v;
  }
  const CategoricalEncoder& encoder() const {
    return static_cast<const CategoricalEncoder&>(*ops.back());
  }
};

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

struct Workflow::Impl {
  io::Schema schema;
  json config;
  std::vector<ColumnPipe> dense, cat;
  bool fitted = false;
  bool have_stats = false;
  int64_t stats_rows = 0;

  // Creates one pipe per dense and categorical schema column, without ops.
  void init_columns() {
    for (const auto& c : schema.columns) {
      ColumnPipe p;
      p.name = c.name;
      if (c.kind == io::ColumnKind::Dense) {
        p.type = ColumnType::Dense;
        p.index = static_cast<int>(dense.size());
        dense.push_back(std::move(p));
      } else if (c.kind == io::ColumnKind::Categorical) {
        p.type = ColumnType::Categorical;
        p.multi_hot = c.multi_hot;
        p.index = static_cast<int>(cat.size());
        cat.push_back(std::move(p));
      }
    }
  }

  ColumnPipe* find(const std::string& name) {
    for (auto* v : {&dense, &cat})
      for (auto& p : *v)
        if (p.name == name) return &p;
    return nullptr;
  }

  std::vector<std::string> column_names() const {
    std::vector<std::string> v;
    for (const auto& c : schema.columns) v.push_back(c.name);
    return v;
  }

  // Resolves a step's "columns" value.
  std::vector<ColumnPipe*> resolve(const json& cols, const std::string& where) {
    std::vector<ColumnPipe*> out;
    auto add = [&](const std::string& name) {
      ColumnPipe* p = find(name);
      if (!p) {
        for (const auto& c : schema.columns)
          if (c.name == name)
            fail("'", where, "': column '", name, "' is a ",
                 c.kind == io::ColumnKind::Label ? "label" : "skipped",
                 " column; ops apply to dense and categorical columns");
        std::string near = nearest_name(name, column_names());
        fail("'", where, "': unknown column '", name, "'",
             near.empty() ? "" : " (did you mean '" + near + "'?)");
      }
      if (std::find(out.begin(), out.end(), p) != out.end())
        fail("'", where, "': column '", name, "' is listed twice");
      out.push_back(p);
    };
    if (cols.is_string()) {
      const std::string s = cols.get<std::string>();
      if (s == "@dense") {
        for (auto& p : dense) out.push_back(&p);
      } else if (s == "@categorical") {
        for (auto& p : cat) out.push_back(&p);
      } else if (!s.empty() && s[0] == '@') {
        std::string near = nearest_name(s, {"@dense", "@categorical"});
        fail("'", where, "': unknown column group '", s, "'",
             near.empty() ? "" : " (did you mean '" + near + "'?)",
             "; use \"@dense\", \"@categorical\" or a list of column names");
      } else {
        add(s);
      }
    } else if (cols.is_array()) {
      for (const auto& c : cols) {
        if (!c.is_string()) fail("'", where, "' must list column names, got ", c.dump());
        add(c.get<std::string>());
      }
    } else {
      fail("'", where, "' must be \"@dense\", \"@categorical\" or a list of names, got ",
           cols.dump());
    }
    return out;
  }

  void add_op(ColumnPipe& p, const json& spec, const std::string& where, bool fitted_state) {
    const OpRegistry& reg = OpRegistry::global();
    if (spec.is_object() && spec.contains("op") && spec["op"].is_string()) {
      const std::string name = spec["op"].get<std::string>();
      if (reg.has(name) && reg.input_type(name) != p.type)
        fail("op '", name, "' at '", where, "' applies to ", column_type_name(reg.input_type(name)),
             " columns, but '", p.name, "' is ", column_type_name(p.type));
    } else if (!spec.is_object()) {
      fail("'", where, "' must be an object like {\"op\": \"FillMissing\"}, got ", spec.dump());
    }
    p.ops.push_back(reg.create(spec, where, fitted_state));
  }

  // Checks the chains once all ops are known.
  void validate() const {
    for (const auto& p : cat) {
      if (p.ops.empty())
        fail("categorical column '", p.name,
             "' has no encoder; the model needs ids: add {\"op\": \"Categorify\"} to a pipeline "
             "step that lists it");
      for (size_t i = 0; i < p.ops.size(); ++i) {
        bool is_encoder = dynamic_cast<const CategoricalEncoder*>(p.ops[i].get()) != nullptr;
        if (is_encoder && i + 1 != p.ops.size())
          fail("categorical column '", p.name, "': op '", p.ops[i + 1]->name(),
               "' follows its encoder '", p.ops[i]->name(), "'; the encoder must come last");
        if (!is_encoder && i + 1 == p.ops.size())
          fail("categorical column '", p.name, "' must end with an encoder (Categorify), not '",
               p.ops[i]->name(), "'");
      }
    }
    for (const auto& p : dense)
      for (const auto& op : p.ops)
        DLREC_CHECK(dynamic_cast<const DenseOp*>(op.get()), "dense column '", p.name, "': op '",
                    op->name(), "' is not a dense op");
  }

  void check_chunk(const io::RawChunk& c, const char* what) const {
    DLREC_CHECK(c.num_dense == static_cast<int>(dense.size()) &&
                    c.num_cat == static_cast<int>(cat.size()),
                "Workflow::", what, ": chunk has ", c.num_dense, " dense and ", c.num_cat,
                " categorical columns, the schema ", dense.size(), " and ", cat.size());
    DLREC_CHECK(static_cast<int64_t>(c.dense.size()) == c.rows * c.num_dense &&
                    static_cast<int64_t>(c.cat_offsets.size()) == c.num_cat &&
                    static_cast<int64_t>(c.cat_values.size()) == c.num_cat,
                "Workflow::", what, ": malformed chunk");
    for (int k = 0; k < c.num_cat; ++k)
      DLREC_CHECK(static_cast<int64_t>(c.cat_offsets[k].size()) == c.rows + 1 &&
                      c.cat_offsets[k].back() == static_cast<int64_t>(c.cat_values[k].size()),
                  "Workflow::", what, ": malformed offsets of column '", cat[k].name, "'");
  }

  std::string line_of(const io::RawChunk& c, int64_t r) const {
    return c.first_line > 0 ? "line " + std::to_string(c.first_line + r)
                            : "row " + std::to_string(r) + " of the chunk";
  }

  // One chunk of fit pass `pass`: accumulates statistics (pass 0) and feeds each column's
  // pass-th fitted op with the values transformed by the ops before it.
  void fit_chunk(const io::RawChunk& c, int pass) {
    check_chunk(c, "fit");
    const int nd = static_cast<int>(dense.size());
    const int ncols = nd + static_cast<int>(cat.size());
    parallel_for(0, ncols, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> buf;
      for (int64_t col = lo; col < hi; ++col) {
        ColumnPipe& p = col < nd ? dense[col] : cat[col - nd];
        std::vector<int> fit_ops = p.fit_ops();
        const int stage = pass < static_cast<int>(fit_ops.size()) ? fit_ops[pass] : -1;
        if (p.type == ColumnType::Dense) {
          if (pass > 0 && stage < 0) continue;
          buf.resize(c.rows);
          for (int64_t r = 0; r < c.rows; ++r) buf[r] = c.dense[r * nd + p.index];
          if (pass == 0) {
            ColumnStats& s = p.stats;
            s.rows += c.rows;
            for (float v : buf) {
              if (std::isnan(v)) {
                ++s.nulls;
                continue;
              }
              ++s.values;
              s.min = std::min<double>(s.min, v);
              s.max = std::max<double>(s.max, v);
              s.sum += v;
            }
          }
          if (stage < 0) continue;
          for (int i = 0; i < stage; ++i)
            static_cast<const DenseOp&>(*p.ops[i]).transform(buf.data(), c.rows, 1);
          static_cast<DenseOp&>(*p.ops[stage]).fit_chunk(buf.data(), c.rows);
        } else {
          const auto& off = c.cat_offsets[p.index];
          const auto& vals = c.cat_values[p.index];
          if (pass == 0) {
            ColumnStats& s = p.stats;
            s.rows += c.rows;
            s.values += static_cast<int64_t>(vals.size());
            for (int64_t r = 0; r < c.rows; ++r) s.nulls += off[r + 1] == off[r];
          }
          if (stage < 0) continue;
          // v1 categorical chains are a single encoder, so the keys reach it unchanged.
          static_cast<CategoricalEncoder&>(*p.ops[stage])
              .fit_chunk(vals.data(), static_cast<int64_t>(vals.size()));
        }
      }
    });
  }

  void begin_pass(int pass) {
    for (auto* v : {&dense, &cat})
      for (auto& p : *v) {
        if (pass == 0) p.stats = ColumnStats{};
        std::vector<int> f = p.fit_ops();
        if (pass >= static_cast<int>(f.size())) continue;
        if (p.type == ColumnType::Dense)
          static_cast<DenseOp&>(*p.ops[f[pass]]).fit_begin();
        else
          static_cast<CategoricalEncoder&>(*p.ops[f[pass]]).fit_begin();
      }
  }

  void end_pass(int pass) {
    std::vector<Op*> todo;
    for (auto* v : {&dense, &cat})
      for (auto& p : *v) {
        std::vector<int> f = p.fit_ops();
        if (pass < static_cast<int>(f.size())) todo.push_back(p.ops[f[pass]].get());
      }
    // Finishing a vocabulary sorts it; do the columns in parallel.
    parallel_for(0, static_cast<int64_t>(todo.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (todo[i]->input_type() == ColumnType::Dense)
          static_cast<DenseOp*>(todo[i])->fit_end();
        else
          static_cast<CategoricalEncoder*>(todo[i])->fit_end();
      }
    });
  }

  json column_json(const ColumnPipe& p) const {
    json ops = json::array();
    for (const auto& op : p.ops) ops.push_back(op->to_json());
    json j = {{"name", p.name}, {"kind", column_type_name(p.type)}};
    if (p.type == ColumnType::Categorical) j["multi_hot"] = p.multi_hot;
    j["ops"] = ops;
    return j;
  }
};

Workflow::Workflow(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Workflow::Workflow(Workflow&&) noexcept = default;
Workflow& Workflow::operator=(Workflow&&) noexcept = default;
Workflow::~Workflow() = default;

Workflow Workflow::from_config(const json& config, const io::Schema& schema) {
  auto m = std::make_unique<Impl>();
  m->schema = schema;
  m->config = config;
  m->init_columns();
  ConfigReader root(config, "");
  const json& steps = root.raw("pipeline");
  root.finish();
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
      for (ColumnPipe* p : targets) m->add_op(*p, ops[k], op_where, false);
    }
  }
  m->validate();
  m->fitted = true;
  for (auto* v : {&m->dense, &m->cat})
    for (auto& p : *v)
      for (auto& op : p.ops) m->fitted = m->fitted && op->fitted();
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
  m->schema = io::Schema::from_json(r.raw("schema"));
  m->config = r.get<json>("config", json::object());
  m->init_columns();
  const json& cols = r.raw("columns");
  r.raw("output");  // informational; checked against the rebuilt layout below
  r.finish();
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
  m->validate();
  m->fitted = true;
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

int Workflow::num_fit_passes() const {
  size_t n = 1;
  for (auto* v : {&impl_->dense, &impl_->cat})
    for (auto& p : *v) n = std::max(n, p.fit_ops().size());
  return static_cast<int>(n);
}

void Workflow::fit(const ChunkSource& next_chunk) {
  const int passes = num_fit_passes();
  if (passes > 1)
    fail("this workflow chains several fitted ops on one column and needs ", passes,
         " passes over the data; use fit_multipass()");
  bool used = false;
  fit_multipass([&]() -> ChunkSource {
    DLREC_CHECK(!used, "Workflow::fit: single-pass source reused");
    used = true;
    return next_chunk;
  });
}

void Workflow::fit_multipass(const std::function<ChunkSource()>& open_pass) {
  Impl& m = *impl_;
  m.fitted = false;
  m.have_stats = false;
  const int passes = num_fit_passes();
  io::RawChunk chunk;
  for (int pass = 0; pass < passes; ++pass) {
    m.begin_pass(pass);
    ChunkSource next = open_pass();
    int64_t rows = 0;
    while (next(chunk)) {
      m.fit_chunk(chunk, pass);
      rows += chunk.rows;
    }
    m.end_pass(pass);
    if (pass == 0) m.stats_rows = rows;
  }
  m.fitted = true;
  m.have_stats = true;
}

bool Workflow::fitted() const { return impl_->fitted; }

void Workflow::transform(const io::RawChunk& in, io::Batch& out) const {
  const Impl& m = *impl_;
  DLREC_CHECK(m.fitted, "Workflow::transform: the workflow is not fitted; call fit() first");
  m.check_chunk(in, "transform");
  const int nd = static_cast<int>(m.dense.size());
  const int nc = static_cast<int>(m.cat.size());
  const int64_t rows = in.rows;
  out.reset(nd, nc);
  out.rows = rows;
  if (static_cast<int64_t>(in.label.size()) == rows)
    out.labels = in.label;
  else
    out.labels.assign(rows, 0.0f);
  out.dense = in.dense;

  // Output offsets: one id per one-hot row; max(1, values) per multi-hot row.
  std::mutex err_mu;
  int64_t err_row = std::numeric_limits<int64_t>::max();
  std::string err_msg;
  auto report = [&](int64_t row, std::string msg) {
    std::lock_guard<std::mutex> g(err_mu);
    if (row < err_row) {
      err_row = row;
      err_msg = std::move(msg);
    }
  };
  parallel_for(0, nc, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const ColumnPipe& p = m.cat[k];
      const auto& in_off = in.cat_offsets[p.index];
      auto& off = out.cat_offsets[k];
      off.resize(rows + 1);
      off[0] = 0;
      if (!p.multi_hot) {
        for (int64_t r = 0; r < rows; ++r) {
          if (in_off[r + 1] - in_off[r] > 1) {
            report(r, detail::concat("categorical column '", p.name, "' is one-hot but ",
                                     m.line_of(in, r), " holds ", in_off[r + 1] - in_off[r],
                                     " values (declare it multi_hot in the schema)"));
            break;
          }
          off[r + 1] = r + 1;
        }
      } else {
        for (int64_t r = 0; r < rows; ++r)
          off[r + 1] = off[r] + std::max<int64_t>(1, in_off[r + 1] - in_off[r]);
      }
      out.cat_indices[k].resize(off[rows]);
    }
  });
  if (!err_msg.empty()) fail(err_msg);

  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_for(0, (nd + nc) * blocks, 1, [&](int64_t t_lo, int64_t t_hi) {
    std::vector<int64_t> scratch;
    for (int64_t t = t_lo; t < t_hi; ++t) {
      const int64_t col = t / blocks;
      const int64_t lo = (t % blocks) * kRowBlock;
      const int64_t hi = std::min(rows, lo + kRowBlock);
      if (col < nd) {
        const ColumnPipe& p = m.dense[col];
        float* v = out.dense.data() + lo * nd + p.index;
        for (const auto& op : p.ops)
          static_cast<const DenseOp&>(*op).transform(v, hi - lo, nd);
        for (int64_t r = 0; r < hi - lo; ++r) {
          const float x = v[r * nd];
          if (!std::isfinite(x)) {
            const float raw = in.dense[(lo + r) * nd + p.index];
            report(lo + r,
                   std::isnan(raw)
                       ? detail::concat("dense column '", p.name, "' is missing (NaN) at ",
                                        m.line_of(in, lo + r),
                                        " after its ops; the model needs finite values: add "
                                        "{\"op\": \"FillMissing\"} to its ops")
                       : detail::concat("dense column '", p.name, "' is ", x, " at ",
                                        m.line_of(in, lo + r), " after its ops (raw value ", raw,
                                        "); the model needs finite values: clip it (e.g. "
                                        "{\"op\": \"Clip\", \"min\": 0} before LogOp)"));
            break;
          }
        }
      } else {
        const ColumnPipe& p = m.cat[col - nd];
        const CategoricalEncoder& enc = p.encoder();
        const auto& in_off = in.cat_offsets[p.index];
        const uint64_t* keys = in.cat_values[p.index].data();
        const auto& off = out.cat_offsets[col - nd];
        int64_t* ids = out.cat_indices[col - nd].data();
        const int64_t k_lo = in_off[lo], k_hi = in_off[hi];
        if (k_hi - k_lo == off[hi] - off[lo]) {  // no missing rows: ids map 1:1 to keys
          enc.encode(keys + k_lo, k_hi - k_lo, ids + off[lo]);
          continue;
        }
        scratch.resize(k_hi - k_lo);
        enc.encode(keys + k_lo, k_hi - k_lo, scratch.data());
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t n = in_off[r + 1] - in_off[r];
          int64_t* dst = ids + off[r];
          if (n == 0) {
            dst[0] = 0;  // missing
          } else {
            std::copy_n(scratch.data() + (in_off[r] - k_lo), n, dst);
          }
        }
      }
    }
  });
  if (!err_msg.empty()) fail(err_msg);
}

io::ShardLayout Workflow::output_layout() const {
  DLREC_CHECK(impl_->fitted, "Workflow::output_layout: the workflow is not fitted");
  io::ShardLayout l;
  l.num_dense = static_cast<int>(impl_->dense.size());
  for (const auto& p : impl_->cat) {
    l.cardinalities.push_back(p.encoder().cardinality());
    l.multi_hot.push_back(p.multi_hot);
  }
  return l;
}

std::vector<std::string> Workflow::dense_names() const {
  std::vector<std::string> v;
  for (const auto& p : impl_->dense) v.push_back(p.name);
  return v;
}

std::vector<std::string> Workflow::cat_names() const {
  std::vector<std::string> v;
  for (const auto& p : impl_->cat) v.push_back(p.name);
  return v;
}

const io::Schema& Workflow::schema() const { return impl_->schema; }
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
  return {{"format", "dlrec-workflow"},
          {"version", 1},
          {"schema", m.schema.to_json()},
          {"config", m.config},
          {"columns", cols},
          {"output",
           {{"layout", output_layout().to_json()},
            {"dense_names", dense_names()},
            {"cat_names", cat_names()}}}};
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
    json f = p.encoder().fit_summary();
    if (f.is_object())
      for (auto it = f.begin(); it != f.end(); ++it)
        if (!c.contains(it.key())) c[it.key()] = it.value();
    cat.push_back(c);
  }
  return {{"rows", m.stats_rows}, {"dense", dense}, {"categorical", cat}};
}

}  // namespace dlrec::etl
