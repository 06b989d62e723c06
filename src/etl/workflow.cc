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
void compact(const io::RawChunk& in, const std::vector<uint8_t>& keep, io::RawChunk& out,
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
  std::vector<FeatureStep> features;
  std::vector<FilterStep> filters;
  std::vector<DenseOut> dense_out;
  std::vector<CatOut> cat_out;
  bool fitted = false;
  bool have_stats = false;
  std::shared_ptr<FitMemory> fit_memory;  // set_fit_memory's budget (null: none)
  int64_t stats_rows = 0, stats_input_rows = 0;

  std::string label_name() const {
    for (const auto& c : schema.columns)
      if (c.kind == io::ColumnKind::Label) return c.name;
    return "";
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
                     std::vector<io::RawChunk>& filtered) {
    for (int i = 0; i < n; ++i) check_chunk(*raws[i], "fit");
    chunks.assign(raws, raws + n);
    if (!filters.empty()) {
      filtered.resize(n);
      parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
        std::vector<uint8_t> keep;
        for (int64_t i = lo; i < hi; ++i) {
          filter_mask(*raws[i], keep);
          compact(*raws[i], keep, filtered[i], nullptr);
          chunks[i] = &filtered[i];
        }
      });
    }
    for (int i = 0; i < n; ++i) {
      if (pass == 0) stats_input_rows += raws[i]->rows;
      if (pass == 0) stats_rows += chunks[i]->rows;
    }
  }

  // The fit tasks of a pass (one per column, and per feature op in pass 0), in the order they
  // are claimed: categorical columns (the heaviest), feature ops, dense columns.
  std::vector<int> task_order(int pass) const {
    const int nd = static_cast<int>(dense.size());
    const int ncols = nd + static_cast<int>(cat.size());
    const int ntasks = ncols + (pass == 0 ? static_cast<int>(features.size()) : 0);
    std::vector<int> order;
    for (int col = nd; col < ncols; ++col) order.push_back(col);
    for (int col = ncols; col < ntasks; ++col) order.push_back(col);
    for (int col = 0; col < nd; ++col) order.push_back(col);
    return order;
  }

  // Chunks [0, n) of fit pass `pass`, in order: accumulates statistics (pass 0) and feeds each
  // column's pass-th fitted op with the values transformed by the ops before it. One task per
  // column (and feature op) walks all the chunks in order, so every op sees exactly the value
  // sequence of a chunk-by-chunk fit; the tasks are claimed dynamically, Categorify columns
  // (the heaviest) first, then the side tasks of the batch. A fork-join: it returns when the
  // slowest task is done.
  void fit_chunks(const io::RawChunk* const* raws, int n, int pass, FitSideWork* side = nullptr,
                  int64_t batch = 0) {
    std::vector<io::RawChunk> filtered;
    std::vector<const io::RawChunk*> chunks;
    prepare_batch(raws, n, pass, chunks, filtered);
    const std::vector<int> order = task_order(pass);
    const int ntasks = static_cast<int>(order.size());
    const int nside = side && side->task ? side->count : 0;
    const int total = ntasks + nside;
    std::atomic<int> next{0};
    parallel_for(0, std::min(total, num_threads()), 1, [&](int64_t, int64_t) {
      std::vector<float> buf;
      for (int k = next++; k < total; k = next++) {
        if (k >= ntasks) {
          side->task(batch, k - ntasks);
          continue;
        }
        const int col = order[k];
        for (int i = 0; i < n; ++i) fit_column(*chunks[i], col, pass, buf);
      }
    });
  }

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
  void fit_pipelined(const ChunkBatchSource& next, int pass, FitSideWork* side, int window) {
    struct InFlight {
      std::vector<const io::RawChunk*> chunks;  // as the fit sees them (filtered)
      std::vector<io::RawChunk> filtered;
      int nside = 0;      // side tasks
      int side_next = 0;  // side tasks claimed
      int remaining = 0;  // strands and side tasks not done with it
    };
    const std::vector<int> order = task_order(pass);
    const int ntasks = static_cast<int>(order.size());
    constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
    std::mutex mu;
    std::condition_variable cv;
    std::deque<InFlight> win;        // batches [base, fetched) in flight
    int64_t base = 0, fetched = 0;
    bool fetching = false, ended = false;
    int running = 0;                 // claimed items not finished
    std::vector<int64_t> strand_at(ntasks, 0);  // the next batch of each strand
    std::vector<char> strand_busy(ntasks, 0);
    int64_t stop = kNone;            // the oldest failed batch: no work from it on
    std::exception_ptr error;
    // Seconds of work per strand, of the side tasks and of the source's calls (DLREC_ETL_FIT_PROFILE).
    std::vector<double> strand_seconds(ntasks, 0.0);
    double side_seconds = 0, source_seconds = 0;
    Timer pass_timer;
    auto fail_at = [&](int64_t seq, std::exception_ptr e) {  // under mu
      if (seq < stop) {
        stop = seq;
        error = std::move(e);
      }
    };
    auto release = [&] {  // under mu: gives up the oldest batches nothing works on any more
      while (!win.empty() && win.front().remaining == 0) {
        win.pop_front();
        ++base;
      }
    };
    auto done_with = [&](int64_t seq) {  // under mu: one strand or side task done with seq
      --win[seq - base].remaining;
      release();
    };
    auto work = [&] {
      std::vector<float> buf;
      std::vector<const io::RawChunk*> got;
      std::unique_lock<std::mutex> l(mu);
      for (;;) {
        // The source's next batch.
        if (!ended && !fetching && fetched < stop && static_cast<int64_t>(win.size()) < window) {
          fetching = true;
          ++running;
          const int64_t seq = fetched;
          l.unlock();
          InFlight b;
          std::exception_ptr e;
          int n = 0;
          Timer t;
          try {
            n = next(got);
            DLREC_CHECK(n <= static_cast<int>(got.size()), "Workflow::fit_batches: the source "
                        "reported ", n, " chunks but holds ", got.size());
            if (n > 0) {
              prepare_batch(got.data(), n, pass, b.chunks, b.filtered);
              b.nside = side && side->task ? side->count : 0;
              b.remaining = ntasks + b.nside;
            }
          } catch (...) {
            e = std::current_exception();
          }
          l.lock();
          source_seconds += t.seconds();
          fetching = false;
          --running;
          if (e) {
            fail_at(seq, e);
            ended = true;
          } else if (n == 0) {
            ended = true;
          } else {
            win.push_back(std::move(b));
            ++fetched;
            release();  // (a batch without tasks: given up at once)
          }
          cv.notify_all();
          continue;
        }
        // The oldest batch's work: a strand (in task order), else a side task.
        int64_t best = kNone;
        int pick = -1;  // strand k, or ntasks + side task of batch `best`
        for (int k = 0; k < ntasks; ++k)
          if (!strand_busy[k] && strand_at[k] < fetched && strand_at[k] < best) {
            best = strand_at[k];
            pick = k;
          }
        for (int64_t seq = base; seq < std::min(best, fetched); ++seq)
          if (win[seq - base].side_next < win[seq - base].nside) {
            best = seq;
            pick = ntasks;
            break;
          }
        if (pick < 0 || best >= stop) {
          // Nothing to do now: wait for a running item, or end when none can come.
          const bool can_fetch = !ended && !fetching && fetched < stop &&
                                 static_cast<int64_t>(win.size()) < window;
          if (running == 0 && !can_fetch) break;
          cv.wait(l);
          continue;
        }
        ++running;
        InFlight& b = win[best - base];  // stays in place: only the front leaves, when done
        std::exception_ptr e;
        Timer t;
        if (pick < ntasks) {
          strand_busy[pick] = 1;
          l.unlock();
          try {
            for (const io::RawChunk* c : b.chunks) fit_column(*c, order[pick], pass, buf);
          } catch (...) {
            e = std::current_exception();
          }
          l.lock();
          strand_seconds[pick] += t.seconds();
          strand_busy[pick] = 0;
          ++strand_at[pick];
        } else {
          const int i = b.side_next++;
          l.unlock();
          try {
            side->task(best, i);
          } catch (...) {
            e = std::current_exception();
          }
          l.lock();
          side_seconds += t.seconds();
        }
        --running;
        if (e) fail_at(best, e);
        done_with(best);
        cv.notify_all();
      }
      cv.notify_all();  // the others see the end too
    };
    std::vector<std::thread> threads;
    try {
      for (int t = 1; t < num_threads(); ++t) threads.emplace_back(work);
    } catch (...) {  // no more threads: go on with those started
    }
    work();
    for (auto& t : threads) t.join();
    if (const char* p = std::getenv("DLREC_ETL_FIT_PROFILE"); p && *p && *p != '0') {
      // Where the pass's time went: if the slowest strand's seconds come near the wall time,
      // that column bounds the pass whatever the window.
      double sum = 0;
      int slow = 0;
      for (int k = 0; k < ntasks; ++k) {
        sum += strand_seconds[k];
        if (strand_seconds[k] > strand_seconds[slow]) slow = k;
      }
      const int ncols = static_cast<int>(dense.size() + cat.size());
      const int col = ntasks ? order[slow] : 0;
      const std::string name = col < static_cast<int>(dense.size()) ? dense[col].name
                               : col < ncols ? cat[col - dense.size()].name
                                             : "feature " + std::to_string(col - ncols);
      std::fprintf(stderr,
                   "fit pass %d: %lld batches, window %d, %d threads, wall %.3f s; strands %.3f s "
                   "(slowest %s %.3f s), side tasks %.3f s, source calls %.3f s\n",
                   pass, static_cast<long long>(fetched), window, num_threads(),
                   pass_timer.seconds(), sum, name.c_str(), ntasks ? strand_seconds[slow] : 0.0,
                   side_seconds, source_seconds);
    }
    if (error) std::rethrow_exception(error);
  }

  // Column (or feature op, col >= columns) `col` of one chunk.
  void fit_column(const io::RawChunk& c, int col, int pass, std::vector<float>& buf) {
    const int nd = static_cast<int>(dense.size());
    const int ncols = nd + static_cast<int>(cat.size());
    if (col >= ncols) {
      features[col - ncols].op->fit_chunk(c);
      return;
    }
    ColumnPipe& p = col < nd ? dense[col] : cat[col - nd];
    std::vector<int> fit_ops = p.fit_ops();
    const int stage = pass < static_cast<int>(fit_ops.size()) ? fit_ops[pass] : -1;
    if (p.type == ColumnType::Dense) {
      if (pass > 0 && stage < 0) return;
      buf.resize(c.rows);
      for (int64_t r = 0; r < c.rows; ++r) buf[r] = c.dense[r * nd + p.index];
      if (pass == 0) {
        ColumnStats& s = p.stats;
        s.rows += c.rows;
        // Without a branch per value (missing values are frequent and random): a missing one
        // adds 0 to the sum (which is never -0: it starts at +0) and leaves min/max as they
        // are, so the results are those of skipping it.
        int64_t nulls = 0;
        double lo = s.min, hi = s.max, sum = s.sum;
        for (float v : buf) {
          const bool missing = std::isnan(v);
          nulls += missing;
          const double d = missing ? 0.0 : static_cast<double>(v);
          sum += d;
          lo = missing ? lo : std::min(lo, d);
          hi = missing ? hi : std::max(hi, d);
        }
        s.nulls += nulls;
        s.values += c.rows - nulls;
        s.min = lo;
        s.max = hi;
        s.sum = sum;
      }
      if (stage < 0) return;
      p.apply_dense(buf.data(), c.rows, 1, stage);
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
      if (stage < 0) return;
      // A categorical chain holds one encoder (and column ops), so the keys reach it unchanged.
      static_cast<CategoricalEncoder&>(*p.ops[stage])
          .fit_chunk(vals.data(), static_cast<int64_t>(vals.size()));
    }
  }

  void begin_pass(int pass) {
    if (pass == 0) {
      stats_rows = stats_input_rows = 0;
      for (auto& f : features) f.op->fit_begin();
    }
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
    if (pass == 0)
      for (auto& f : features) todo.push_back(f.op.get());
    // Finishing a vocabulary sorts it; do the columns in parallel.
    parallel_for(0, static_cast<int64_t>(todo.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        if (auto* f = dynamic_cast<FeatureOp*>(todo[i]))
          f->fit_end();
        else if (todo[i]->input_type() == ColumnType::Dense)
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
  m->schema = io::Schema::from_json(r.raw("schema"));
  m->config = r.get<json>("config", json::object());
  m->init_columns();
  const json& cols = r.raw("columns");
  const json features = r.get<json>("features", json::array());
  const json filters = r.get<json>("filters", json::array());
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
  const io::RawChunk* one = &chunk;
  for (int pass = 0; pass < passes; ++pass) {
    m.begin_pass(pass);
    ChunkSource next = open_pass();
    while (next(chunk)) m.fit_chunks(&one, 1, pass);
    m.end_pass(pass);
  }
  m.fitted = true;
  m.have_stats = true;
  m.build_plan(true);
}

void Workflow::fit_batches(const std::function<ChunkBatchSource()>& open_pass,
                           FitSideWork* side, int window) {
  DLREC_CHECK(window >= 1, "Workflow::fit_batches: window must be >= 1, got ", window);
  Impl& m = *impl_;
  m.fitted = false;
  m.have_stats = false;
  const int passes = num_fit_passes();
  std::vector<const io::RawChunk*> chunks;
  for (int pass = 0; pass < passes; ++pass) {
    m.begin_pass(pass);
    ChunkBatchSource next = open_pass();
    if (window > 1) {
      m.fit_pipelined(next, pass, side, window);
    } else {
      for (int64_t batch = 0, n; (n = next(chunks)) > 0; ++batch) {
        DLREC_CHECK(n <= static_cast<int64_t>(chunks.size()), "Workflow::fit_batches: the source "
                    "reported ", n, " chunks but holds ", chunks.size());
        m.fit_chunks(chunks.data(), static_cast<int>(n), pass, side, batch);
        if (side) side->count = 0;
      }
    }
    m.end_pass(pass);
  }
  m.fitted = true;
  m.have_stats = true;
  m.build_plan(true);
}

bool Workflow::has_filters() const { return !impl_->filters.empty(); }

bool Workflow::fitted() const { return impl_->fitted; }

std::pair<int64_t, int64_t> Workflow::fit_spill_stats() const {
  const auto& m = impl_->fit_memory;
  return m ? std::make_pair(m->spilled_runs.load(), m->spilled_bytes.load())
           : std::make_pair(int64_t{0}, int64_t{0});
}

void Workflow::set_fit_memory(int64_t budget_bytes, const std::string& spill_dir) {
  std::shared_ptr<FitMemory> mem;
  if (budget_bytes > 0) {
    DLREC_CHECK(!spill_dir.empty(), "Workflow::set_fit_memory: no spill directory");
    mem = std::make_shared<FitMemory>();
    mem->available = budget_bytes / 2;
    mem->spill_dir = spill_dir;
  }
  impl_->fit_memory = mem;
  for (auto& p : impl_->cat)
    for (auto& op : p.ops)
      if (auto* e = dynamic_cast<CategoricalEncoder*>(op.get())) e->set_fit_memory(mem);
}

void Workflow::transform(const io::RawChunk& raw, io::Batch& out,
                         std::vector<int64_t>* kept, bool append, const TrainRows* train) const {
  const Impl& m = *impl_;
  DLREC_CHECK(m.fitted, "Workflow::transform: the workflow is not fitted; call fit() first");
  m.check_chunk(raw, "transform");
  // Filters apply only when the caller asks which rows were kept (run_etl); serving encodes
  // every request row.
  io::RawChunk filtered;
  bool use_filtered = false;
  if (kept) {
    kept->clear();
    if (!m.filters.empty()) {
      std::vector<uint8_t> keep;
      m.filter_mask(raw, keep);
      use_filtered = std::find(keep.begin(), keep.end(), 0) != keep.end();
      if (use_filtered) compact(raw, keep, filtered, kept);
    }
    if (!use_filtered)
      for (int64_t r = 0; r < raw.rows; ++r) kept->push_back(r);
  }
  const io::RawChunk& in = use_filtered ? filtered : raw;
  // `train` counts input rows; the feature ops see the kept ones (a prefix of `in` too).
  TrainRows train_rows;
  if (train) {
    train_rows.first = train->first;
    train_rows.rows = std::min(train->rows, raw.rows);
    if (use_filtered)
      train_rows.rows = std::lower_bound(kept->begin(), kept->end(), train_rows.rows) - kept->begin();
  }
  const int nd_in = in.num_dense;
  const int nd = static_cast<int>(m.dense_out.size());
  const int nc = static_cast<int>(m.cat_out.size());
  const int64_t rows = in.rows;
  // Appending: the chunk's rows go after the `rows0` rows already in `out`.
  int64_t rows0 = 0;
  if (append && out.rows > 0) {
    DLREC_CHECK(out.num_dense == nd && out.num_cat() == nc,
                "Workflow::transform: cannot append to a batch of another layout");
    rows0 = out.rows;
  } else {
    out.reset(nd, nc);
  }
  out.rows = rows0 + rows;
  out.labels.resize(rows0 + rows);
  if (static_cast<int64_t>(in.label.size()) == rows)
    std::copy(in.label.begin(), in.label.end(), out.labels.begin() + rows0);
  else
    std::fill(out.labels.begin() + rows0, out.labels.end(), 0.0f);
  out.dense.resize((rows0 + rows) * nd);

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
      const CatOut& o = m.cat_out[k];
      auto& offv = out.cat_offsets[k];
      if (rows0 == 0) offv.assign(1, 0);
      offv.resize(rows0 + rows + 1);
      int64_t* off = offv.data() + rows0;  // off[r]: the chunk's row r; off[0] is the old end
      if (o.cat_pipe < 0) {
        for (int64_t r = 0; r < rows; ++r) off[r + 1] = off[0] + r + 1;
      } else if (!o.multi_hot) {
        const ColumnPipe& p = m.cat[o.cat_pipe];
        const auto& in_off = in.cat_offsets[p.index];
        for (int64_t r = 0; r < rows; ++r) {
          if (in_off[r + 1] - in_off[r] > 1) {
            report(r, detail::concat("categorical column '", p.name, "' is one-hot but ",
                                     m.line_of(in, r), " holds ", in_off[r + 1] - in_off[r],
                                     " values (declare it multi_hot in the schema)"));
            break;
          }
          off[r + 1] = off[0] + r + 1;
        }
      } else {
        const auto& in_off = in.cat_offsets[m.cat[o.cat_pipe].index];
        for (int64_t r = 0; r < rows; ++r)
          off[r + 1] = off[r] + std::max<int64_t>(1, in_off[r + 1] - in_off[r]);
      }
      out.cat_indices[k].resize(off[rows]);
    }
  });
  if (!err_msg.empty()) fail(err_msg);

  // Column of each feature op's outputs.
  std::vector<std::vector<int>> feat_dense(m.features.size()), feat_cat(m.features.size());
  for (int j = 0; j < nd; ++j)
    if (m.dense_out[j].feature >= 0) feat_dense[m.dense_out[j].feature].push_back(j);
  for (int j = 0; j < nc; ++j)
    if (m.cat_out[j].feature >= 0) feat_cat[m.cat_out[j].feature].push_back(j);
  const int nf = static_cast<int>(m.features.size());

  // Reports the first value of v[0], v[stride], ... (rows lo, lo + 1, ...) that is not finite.
  auto check_finite = [&](const float* v, int64_t stride, int64_t lo, int64_t n,
                          const std::string& name, int raw_col) {
    // First whether there is one at all: all exponent bits set marks NaN and +-inf; no branch
    // per value (a loop the compiler vectorizes on contiguous values).
    uint32_t bad = 0;
    for (int64_t r = 0; r < n; ++r) {
      uint32_t bits;
      std::memcpy(&bits, v + r * stride, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad) return;
    for (int64_t r = 0; r < n; ++r) {
      const float x = v[r * stride];
      if (std::isfinite(x)) continue;
      const float rawv = raw_col >= 0 ? in.dense[(lo + r) * nd_in + raw_col] : x;
      report(lo + r,
             std::isnan(rawv)
                 ? detail::concat("dense column '", name, "' is missing (NaN) at ",
                                  m.line_of(in, lo + r),
                                  " after its ops; the model needs finite values: add "
                                  "{\"op\": \"FillMissing\"} to its ops")
                 : detail::concat("dense column '", name, "' is ", x, " at ",
                                  m.line_of(in, lo + r), " after its ops (raw value ", rawv,
                                  "); the model needs finite values: clip it (e.g. "
                                  "{\"op\": \"Clip\", \"min\": 0} before LogOp)"));
      return;
    }
  };

  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t ntasks = nd + nc + nf;
  parallel_for(0, ntasks * blocks, 1, [&](int64_t t_lo, int64_t t_hi) {
    std::vector<int64_t> scratch;
    std::vector<float> fbuf;
    for (int64_t t = t_lo; t < t_hi; ++t) {
      const int64_t task = t / blocks;
      const int64_t lo = (t % blocks) * kRowBlock;
      const int64_t hi = std::min(rows, lo + kRowBlock);
      if (task < nd) {  // a dense output from a dense column's chain
        const DenseOut& o = m.dense_out[task];
        if (o.pipe < 0) continue;  // a feature op's output: written by its task
        const ColumnPipe& p = m.dense[o.pipe];
        // The column's values of the block side by side, through its ops, into the rows:
        // the ops run on contiguous values (vectorized) instead of every 4 * nd bytes.
        fbuf.resize(hi - lo);
        for (int64_t r = lo; r < hi; ++r) fbuf[r - lo] = in.dense[r * nd_in + p.index];
        p.apply_dense(fbuf.data(), hi - lo, 1);
        check_finite(fbuf.data(), 1, lo, hi - lo, p.name, p.index);
        float* v = out.dense.data() + (rows0 + lo) * nd + task;
        for (int64_t r = lo; r < hi; ++r) v[(r - lo) * nd] = fbuf[r - lo];
      } else if (task < nd + nc) {
        const int64_t k = task - nd;
        const CatOut& o = m.cat_out[k];
        if (o.feature >= 0) continue;
        const int64_t* off = out.cat_offsets[k].data() + rows0;  // the chunk's rows
        int64_t* ids = out.cat_indices[k].data();
        if (o.dense_pipe >= 0) {  // Bucketize (one-hot)
          const ColumnPipe& p = m.dense[o.dense_pipe];
          fbuf.resize(hi - lo);
          for (int64_t r = lo; r < hi; ++r) fbuf[r - lo] = in.dense[r * nd_in + p.index];
          const int e = p.encoder_index();
          p.apply_dense(fbuf.data(), hi - lo, 1, e);
          p.dense_encoder()->encode(fbuf.data(), hi - lo, 1, ids + off[lo]);
          continue;
        }
        const ColumnPipe& p = m.cat[o.cat_pipe];
        const CategoricalEncoder& enc = p.encoder();
        const auto& in_off = in.cat_offsets[p.index];
        const uint64_t* keys = in.cat_values[p.index].data();
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
      } else {  // a feature op: all its outputs
        const int f = static_cast<int>(task - nd - nc);
        std::vector<float*> dptr;
        std::vector<int64_t*> iptr;
        for (int j : feat_dense[f]) dptr.push_back(out.dense.data() + (rows0 + lo) * nd + j);
        for (int j : feat_cat[f]) iptr.push_back(out.cat_indices[j].data() + rows0 + lo);
        m.features[f].op->transform(in, lo, hi, dptr.data(), nd, iptr.data(),
                                    train ? &train_rows : nullptr);
        for (size_t j = 0; j < dptr.size(); ++j)
          check_finite(dptr[j], nd, lo, hi - lo, m.dense_out[feat_dense[f][j]].name, -1);
      }
    }
  });
  if (!err_msg.empty()) fail(err_msg);
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
  json j = {{"format", "dlrec-workflow"},
            {"version", 1},
            {"schema", m.schema.to_json()},
            {"config", m.config},
            {"columns", cols}};
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
