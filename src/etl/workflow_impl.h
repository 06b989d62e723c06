// Workflow's state and its helpers (internal to src/etl): workflow.cc builds it from a config or
// workflow.json and writes it back, workflow_fit.cc fits it, workflow_transform.cc applies it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/workflow.h"
#include "etl/join_external.h"

namespace dlrec::etl {
namespace workflow_detail {

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
  // Index of the op ending the value chain (CategoricalEncoder or DenseEncoder); -1 if none.
  int encoder_index() const {
    for (size_t i = 0; i < ops.size(); ++i)
      if (dynamic_cast<const CategoricalEncoder*>(ops[i].get()) ||
          dynamic_cast<const DenseEncoder*>(ops[i].get()))
        return static_cast<int>(i);
    return -1;
  }
  const CategoricalEncoder& encoder() const {
    return static_cast<const CategoricalEncoder&>(*ops[encoder_index()]);
  }
  const DenseEncoder* dense_encoder() const {
    const int e = encoder_index();
    return e < 0 ? nullptr : dynamic_cast<const DenseEncoder*>(ops[e].get());
  }
  int64_t cardinality() const {
    const int e = encoder_index();
    if (auto* d = dynamic_cast<const DenseEncoder*>(ops[e].get())) return d->cardinality();
    return static_cast<const CategoricalEncoder&>(*ops[e]).cardinality();
  }
  std::string out_name() const {
    std::string n = name;
    for (const auto& op : ops)
      if (auto* c = dynamic_cast<const ColumnOp*>(op.get())) n = c->rename(n);
    return n;
  }
  // Whether a DropLowCardinality removes it (valid once fitted).
  bool dropped() const {
    for (const auto& op : ops)
      if (auto* c = dynamic_cast<const ColumnOp*>(op.get()))
        if (c->drops(cardinality())) return true;
    return false;
  }
  // Applies the dense value ops before `end` (all when -1) in place.
  void apply_dense(float* v, int64_t n, int64_t stride, int end = -1) const {
    const int stop = end < 0 ? static_cast<int>(ops.size()) : end;
    for (int i = 0; i < stop; ++i)
      if (auto* d = dynamic_cast<const DenseOp*>(ops[i].get())) d->transform(v, n, stride);
  }
};

// A step-level op adding features, with the step's columns.
struct FeatureStep {
  std::unique_ptr<FeatureOp> op;
  std::vector<std::string> columns;
};

// A Filter on one raw dense column.
struct FilterStep {
  std::unique_ptr<RowFilter> op;
  std::string column;
  int index = 0;  // chunk dense column
};

// Where an output feature comes from.
struct DenseOut {
  std::string name;
  int pipe = -1;     // dense pipe, or
  int feature = -1;  // features[feature], its dense output j
  int j = 0;
};
struct CatOut {
  std::string name;
  int64_t cardinality = 0;
  bool multi_hot = false;
  int cat_pipe = -1;    // categorical pipe, or
  int dense_pipe = -1;  // dense pipe ending with a DenseEncoder (Bucketize), or
  int feature = -1;     // features[feature], its categorical output j
  int j = 0;
};

// Copies the rows of `in` with keep[r] into `out`; src receives their indices in `in`.
inline void compact(const io::RawChunk& in, const std::vector<uint8_t>& keep, io::RawChunk& out,
             std::vector<int64_t>* src) {
  out.reset(in.num_dense, in.num_cat);
  const bool has_label = static_cast<int64_t>(in.label.size()) == in.rows;
  for (int64_t r = 0; r < in.rows; ++r) {
    if (!keep[r]) continue;
    if (src) src->push_back(r);
    if (has_label) out.label.push_back(in.label[r]);
    out.dense.insert(out.dense.end(), in.dense.begin() + r * in.num_dense,
                     in.dense.begin() + (r + 1) * in.num_dense);
    for (int k = 0; k < in.num_cat; ++k) {
      const auto& off = in.cat_offsets[k];
      out.cat_values[k].insert(out.cat_values[k].end(), in.cat_values[k].begin() + off[r],
                               in.cat_values[k].begin() + off[r + 1]);
      out.cat_offsets[k].push_back(static_cast<int64_t>(out.cat_values[k].size()));
    }
    ++out.rows;
  }
}

}  // namespace workflow_detail

using namespace workflow_detail;

struct Workflow::Impl {
  io::Schema input_schema;  // the raw rows' columns (Workflow::schema())
  io::Schema schema;        // the columns the pipeline sees: the input's, then the side tables'
  JoinPlan joins;           // JoinExternal: input chunks -> chunks of `schema`
  json config;
  std::vector<ColumnPipe> dense, cat;
  std::vector<FeatureStep> features;
  std::vector<FilterStep> filters;
  std::vector<DenseOut> dense_out;
  std::vector<CatOut> cat_out;
  bool fitted = false;
  bool have_stats = false;
  std::shared_ptr<FitMemory> fit_memory;  // set_fit_memory's budget (null: none)
  int64_t stats_rows = 0, stats_input_rows = 0;
  // The config's "label": a dense column whose value after its ops is the label (and not a
  // feature); -1: the schema's label column, copied as read.
  int label_pipe = -1;

  // `raw` (of the input schema) with the side tables joined: `raw` itself without joins,
  // else `buf` filled.
  const io::RawChunk& joined(const io::RawChunk& raw, io::RawChunk& buf) const {
    if (joins.empty()) return raw;
    joins.apply(raw, buf);
    return buf;
  }

  std::string label_name() const {
    if (label_pipe >= 0) return dense[label_pipe].name;
    for (const auto& c : schema.columns)
      if (c.kind == io::ColumnKind::Label) return c.name;
    return "";
  }

  // Sets the label from the config's (or workflow.json's) "label" value `name` (at `where`).
  void set_label(const std::string& name, const std::string& where) {
    for (size_t i = 0; i < dense.size(); ++i)
      if (dense[i].name == name) {
        label_pipe = static_cast<int>(i);
        return;
      }
    for (const auto& c : schema.columns) {
      if (c.name != name) continue;
      if (c.kind == io::ColumnKind::Label) return;  // the default, said explicitly
      fail("'", where, "': column '", name, "' is ",
           c.kind == io::ColumnKind::Categorical ? "categorical" : "skipped",
           "; the label must be numeric: the schema's label column or a dense column (declare "
           "it \"dense\" in the schema and derive the label with its ops, e.g. Binarize)");
    }
    const std::string near = nearest_name(name, column_names());
    fail("'", where, "': unknown column '", name, "'",
         near.empty() ? "" : " (did you mean '" + near + "'?)");
  }

  int dense_index(const std::string& name) const {
    for (const auto& p : dense)
      if (p.name == name) return p.index;
    return -1;
  }

  // Resolves a feature op's inputs: the step's columns (categorical) and its extra dense
  // columns; errors name the nearest valid column.
  void bind_feature(FeatureOp& op, const std::vector<std::string>& cols, const std::string& where) {
    FeatureInputs in;
    in.label_name = label_name();
    if (label_pipe >= 0 && op.name() == "TargetEncoding")
      fail("op 'TargetEncoding' at '", where, "' reads the label as read from the input, but the "
           "label is derived from column '", in.label_name, "' by its ops (\"label\"); this "
           "combination is not supported yet");
    for (const auto& c : cols) {
      ColumnPipe* p = find(c);
      if (!p) fail("'", where, "': unknown column '", c, "'");
      if (p->type != ColumnType::Categorical)
        fail("op '", op.name(), "' at '", where, "' applies to categorical columns, but '", c,
             "' is dense");
      in.cat_names.push_back(c);
      in.cat.push_back(p->index);
      in.cat_multi_hot.push_back(p->multi_hot);
    }
    std::vector<std::string> dnames;
    for (const auto& p : dense) dnames.push_back(p.name);
    for (const auto& d : op.dense_inputs()) {
      const int i = dense_index(d);
      if (i < 0) {
        std::string near = nearest_name(d, dnames);
        fail("'", where, "': '", d, "' is not a dense column",
             near.empty() ? "" : " (did you mean '" + near + "'?)");
      }
      in.dense_names.push_back(d);
      in.dense.push_back(i);
    }
    op.bind(in, where);
  }

  // Adds the op `spec` of a step to its columns: per-column ops to each column's chain,
  // feature ops (one per column or one for all), filters (one per column).
  void add_step_op(const std::vector<ColumnPipe*>& targets, const json& spec,
                   const std::string& where, bool fitted_state) {
    const OpRegistry& reg = OpRegistry::global();
    std::unique_ptr<Op> probe = reg.create(spec, where, fitted_state);
    if (auto* f = dynamic_cast<FeatureOp*>(probe.get())) {
      std::vector<std::string> names;
      for (ColumnPipe* p : targets) names.push_back(p->name);
      if (names.empty()) return;
      if (!f->per_column()) {
        probe.release();
        add_feature(std::unique_ptr<FeatureOp>(f), names, where);
        return;
      }
      for (const auto& n : names)
        add_feature(std::unique_ptr<FeatureOp>(
                        static_cast<FeatureOp*>(reg.create(spec, where, fitted_state).release())),
                    {n}, where);
      return;
    }
    if (dynamic_cast<RowFilter*>(probe.get())) {
      for (ColumnPipe* p : targets) {
        if (p->type != ColumnType::Dense)
          fail("op '", probe->name(), "' at '", where, "' applies to dense columns, but '",
               p->name, "' is categorical");
        add_filter(std::unique_ptr<RowFilter>(
                       static_cast<RowFilter*>(reg.create(spec, where, fitted_state).release())),
                   p->name);
      }
      return;
    }
    for (ColumnPipe* p : targets) add_op(*p, spec, where, fitted_state);
    // A joint encoder: the step's columns fit one vocabulary together.
    auto* first = targets.empty() ? nullptr
                                  : dynamic_cast<CategoricalEncoder*>(targets[0]->ops.back().get());
    if (first && first->joint() && !fitted_state)
      for (size_t i = 1; i < targets.size(); ++i)
        static_cast<CategoricalEncoder&>(*targets[i]->ops.back()).join_fit(*first);
  }

  void add_feature(std::unique_ptr<FeatureOp> op, const std::vector<std::string>& cols,
                   const std::string& where) {
    bind_feature(*op, cols, where);
    features.push_back(FeatureStep{std::move(op), cols});
  }

  void add_filter(std::unique_ptr<RowFilter> op, const std::string& column) {
    FilterStep f;
    f.index = dense_index(column);
    f.column = column;
    f.op = std::move(op);
    filters.push_back(std::move(f));
  }

  // keep[r] = whether row r of c passes every Filter.
  void filter_mask(const io::RawChunk& c, std::vector<uint8_t>& keep) const {
    keep.assign(c.rows, 1);
    if (c.rows == 0) return;  // (no dense values then: data() may be null)
    for (const auto& f : filters)
      f.op->apply(c.dense.data() + f.index, c.rows, c.num_dense, keep.data());
  }

  // The output features and where they come from. Before fitting, cardinalities are unknown
  // (0) and DropLowCardinality drops nothing.
  void build_plan(bool with_fit) {
    dense_out.clear();
    cat_out.clear();
    // Schema order over dense and categorical pipes.
    for (const auto& col : schema.columns) {
      for (size_t i = 0; i < dense.size(); ++i) {
        const ColumnPipe& p = dense[i];
        if (p.name != col.name) continue;
        if (static_cast<int>(i) == label_pipe) continue;  // the label, not a feature
        if (const DenseEncoder* e = p.dense_encoder()) {
          CatOut o;
          o.name = p.out_name();
          o.cardinality = e->cardinality();
          o.dense_pipe = static_cast<int>(i);
          cat_out.push_back(o);
        } else {
          dense_out.push_back(DenseOut{p.out_name(), static_cast<int>(i), -1, 0});
        }
      }
      for (size_t i = 0; i < cat.size(); ++i) {
        const ColumnPipe& p = cat[i];
        if (p.name != col.name) continue;
        if (with_fit && p.dropped()) continue;
        CatOut o;
        o.name = p.out_name();
        o.cardinality = with_fit ? p.cardinality() : 0;
        o.multi_hot = p.multi_hot;
        o.cat_pipe = static_cast<int>(i);
        cat_out.push_back(o);
      }
    }
    for (size_t f = 0; f < features.size(); ++f) {
      const FeatureOp& op = *features[f].op;
      const auto dn = op.dense_outputs();
      for (size_t j = 0; j < dn.size(); ++j)
        dense_out.push_back(DenseOut{dn[j], -1, static_cast<int>(f), static_cast<int>(j)});
      const auto cn = op.cat_outputs();
      for (size_t j = 0; j < cn.size(); ++j) {
        CatOut o;
        o.name = cn[j];
        o.cardinality = op.cat_cardinality(j);
        o.feature = static_cast<int>(f);
        o.j = static_cast<int>(j);
        cat_out.push_back(o);
      }
    }
    std::set<std::string> names;
    for (const auto& o : dense_out)
      if (!names.insert(o.name).second)
        fail("output feature '", o.name, "' is produced twice; rename one with {\"op\": \"Rename\", "
             "\"name\": ...}");
    for (const auto& o : cat_out)
      if (!names.insert(o.name).second)
        fail("output feature '", o.name, "' is produced twice; rename one with {\"op\": \"Rename\", "
             "\"name\": ...} (or give HashedCross a \"name\")");
  }

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
      if (reg.has(name) && reg.input_type(name) != ColumnType::Any &&
          reg.input_type(name) != p.type)
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
      const int e = p.encoder_index();
      if (e < 0)
        fail("categorical column '", p.name,
             "' has no encoder; the model needs ids: add {\"op\": \"Categorify\"} (or "
             "HashBucket) to a pipeline step that lists it");
      for (size_t i = 0; i < p.ops.size(); ++i) {
        const Op* op = p.ops[i].get();
        const bool column_op = dynamic_cast<const ColumnOp*>(op) != nullptr;
        if (static_cast<int>(i) > e && !column_op)
          fail("categorical column '", p.name, "': op '", op->name(), "' follows its encoder '",
               p.ops[e]->name(), "'; the encoder must come last");
        if (static_cast<int>(i) < e && !column_op)
          fail("categorical column '", p.name, "': op '", op->name(), "' comes before its encoder '",
               p.ops[e]->name(), "'; categorical columns take one encoder");
        if (static_cast<int>(i) < e && op->name() == "DropLowCardinality")
          fail("categorical column '", p.name,
               "': DropLowCardinality needs the fitted cardinality; put it after the encoder '",
               p.ops[e]->name(), "'");
      }
    }
    if (label_pipe >= 0 && dense[label_pipe].encoder_index() >= 0)
      fail("dense column '", dense[label_pipe].name, "' is the label (\"label\"), but op '",
           dense[label_pipe].ops[dense[label_pipe].encoder_index()]->name(),
           "' would make it categorical; a label takes value ops only (e.g. Binarize)");
    for (const auto& p : dense) {
      const int e = p.encoder_index();
      for (size_t i = 0; i < p.ops.size(); ++i) {
        const Op* op = p.ops[i].get();
        const bool column_op = dynamic_cast<const ColumnOp*>(op) != nullptr;
        DLREC_CHECK(column_op || dynamic_cast<const DenseOp*>(op) ||
                        dynamic_cast<const DenseEncoder*>(op),
                    "dense column '", p.name, "': op '", op->name(), "' is not a dense op");
        if (e >= 0 && static_cast<int>(i) > e && !column_op)
          fail("dense column '", p.name, "': op '", op->name(), "' follows '", p.ops[e]->name(),
               "', which makes it categorical; put value ops before it");
      }
    }
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

  // Checks a batch's chunks, applies the Filter ops (copies of the kept rows in `filtered`) and
  // counts its rows (pass 0); `chunks` receives the chunks the fit sees.
  void prepare_batch(const io::RawChunk* const* raws, int n, int pass,
                     std::vector<const io::RawChunk*>& chunks,
                     std::vector<io::RawChunk>& filtered);

  // The fit tasks of a pass (one per column, and per feature op in pass 0), in the order they
  // are claimed: categorical columns (the heaviest), feature ops, dense columns.
  std::vector<int> task_order(int pass) const;

  // Chunks [0, n) of fit pass `pass`, in order: accumulates statistics (pass 0) and feeds each
  // column's pass-th fitted op with the values transformed by the ops before it. One task per
  // column (and feature op) walks all the chunks in order, so every op sees exactly the value
  // sequence of a chunk-by-chunk fit; the tasks are claimed dynamically, Categorify columns
  // (the heaviest) first, then the side tasks of the batch. A fork-join: it returns when the
  // slowest task is done.
  void fit_chunks(const io::RawChunk* const* raws, int n, int pass, FitSideWork* side = nullptr,
                  int64_t batch = 0);

  // Fit pass `pass` over the batches of `next` with up to `window` (> 1) batches in flight and
  // no barrier between batches (Workflow::fit_batches). Each fit task (task_order) is a strand:
  // it fits the batches one after the other in input order, so every op sees the same value
  // sequence as with fit_chunks, but the strands of different columns may be on different
  // batches. num_threads() workers (this thread and threads of their own, which block while
  // there is nothing to do, so they must not be the shared pool's: the reader's parse runs
  // there) take, under one lock, in this order of preference:
  //  - the source's next batch (one caller at a time), when fewer than `window` are in flight;
  //  - the strand or side task whose batch is the oldest (strands first, in task order).
  // A batch is given up (the source may reuse its chunks at its `window`-th next call) once
  // every strand has passed it and its side tasks are done. An exception (from the source, a
  // strand or a side task) stops the work on its batch and later ones; the older batches are
  // finished, and the exception of the oldest failing batch is rethrown: the error a batch by
  // batch fit would report.
  void fit_pipelined(const ChunkBatchSource& next, int pass, FitSideWork* side, int window);

  // Column (or feature op, col >= columns) `col` of one chunk.
  void fit_column(const io::RawChunk& c, int col, int pass, std::vector<float>& buf);

  void begin_pass(int pass);

  void end_pass(int pass);

  json column_json(const ColumnPipe& p) const {
    json ops = json::array();
    for (const auto& op : p.ops) ops.push_back(op->to_json());
    json j = {{"name", p.name}, {"kind", column_type_name(p.type)}};
    if (p.type == ColumnType::Categorical) j["multi_hot"] = p.multi_hot;
    j["ops"] = ops;
    return j;
  }
};

}  // namespace dlrec::etl
