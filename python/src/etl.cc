// Raw rows from NumPy buffers, the fitted Workflow, run_etl (the `dlrec etl` command) and shard
// reading, for the Python package. Long C++ work runs without the GIL.
#include <cmath>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string_view>

#include "bind.h"
#include "dlrec/core/error.h"
#include "dlrec/etl/run.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/parquet.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style>;
using U64Array = py::array_t<uint64_t, py::array::c_style>;
using I64Array = py::array_t<int64_t, py::array::c_style>;
using U8Array = py::array_t<uint8_t, py::array::c_style>;

// A categorical key from its text as the text reader reads it (hex, or the hashed bytes).
uint64_t text_key(std::string_view v, const io::Schema& schema, const std::string& col,
                  int64_t row) {
  if (schema.cat_encoding == io::CatEncoding::String) return io::hash_category(v);
  const std::string shown(v.substr(0, 40));
  DLREC_CHECK(v.size() <= 16, "column '", col, "', row ", row, ": '", shown,
              "' is not a hexadecimal category (more than 16 digits)");
  uint64_t x = 0;
  for (char ch : v) {
    unsigned d;
    if (ch >= '0' && ch <= '9')
      d = static_cast<unsigned>(ch - '0');
    else if (ch >= 'a' && ch <= 'f')
      d = static_cast<unsigned>(ch - 'a' + 10);
    else if (ch >= 'A' && ch <= 'F')
      d = static_cast<unsigned>(ch - 'A' + 10);
    else
      fail("column '", col, "', row ", row, ": '", shown, "' is not a hexadecimal category");
    x = (x << 4) | d;
  }
  return x;
}

// Checks offsets [n + 1] into `size` values: 0 first, non-decreasing, `size` last.
void check_offsets(const int64_t* o, int64_t n, int64_t size, const std::string& col,
                   const char* what) {
  DLREC_CHECK(o[0] == 0 && o[n] == size, "column '", col, "': ", what,
              " must start at 0 and end at ", size, ", got ", o[0], " and ", o[n]);
  for (int64_t i = 0; i < n; ++i)
    DLREC_CHECK(o[i] <= o[i + 1], "column '", col, "': ", what, " decrease at row ", i);
}

// Fills categorical column c of `out` from one of the Python side's descriptions:
//   ("int", values uint64 [n], list offsets int64 [rows + 1] or None (one value a row))
//   ("str", bytes uint8, string offsets int64 [n + 1], list offsets or None)
// A string column without list offsets holds one field a row as in the text logs: empty =
// missing, multi-hot items separated by the schema's list_sep.
void fill_cat(io::RawChunk& out, int c, const py::tuple& desc, const io::Schema& schema,
              const std::string& col, bool multi_hot) {
  const int64_t rows = out.rows;
  auto& vals = out.cat_values[c];
  auto& offs = out.cat_offsets[c];
  const std::string kind = desc[0].cast<std::string>();
  const py::object list_obj = desc[kind == "int" ? 2 : 3];
  I64Array list_offsets;
  if (!list_obj.is_none()) {
    list_offsets = list_obj.cast<I64Array>();
    DLREC_CHECK(list_offsets.ndim() == 1 && list_offsets.shape(0) == rows + 1, "column '", col,
                "': list offsets need ", rows + 1, " entries");
  }
  if (kind == "int") {
    const U64Array v = desc[1].cast<U64Array>();
    const uint64_t* p = v.data();
    const int64_t n = v.ndim() == 1 ? v.shape(0) : -1;
    if (list_obj.is_none()) {
      DLREC_CHECK(n == rows, "column '", col, "': ", n, " values for ", rows, " rows");
      vals.assign(p, p + n);
      offs.resize(rows + 1);
      for (int64_t r = 0; r <= rows; ++r) offs[r] = r;
    } else {
      check_offsets(list_offsets.data(), rows, n, col, "list offsets");
      vals.assign(p, p + n);
      offs.assign(list_offsets.data(), list_offsets.data() + rows + 1);
    }
  } else {
    DLREC_CHECK(kind == "str", "internal: unknown column kind '", kind, "'");
    const U8Array bytes = desc[1].cast<U8Array>();
    const I64Array so = desc[2].cast<I64Array>();
    DLREC_CHECK(so.ndim() == 1 && so.shape(0) >= 1 && bytes.ndim() == 1, "column '", col,
                "': the string offsets must be a 1-D array of at least one value");
    const int64_t n = so.shape(0) - 1;
    check_offsets(so.data(), n, bytes.shape(0), col, "string offsets");
    const char* base = reinterpret_cast<const char*>(bytes.data());
    auto str = [&](int64_t i) {
      return std::string_view(base + so.data()[i], so.data()[i + 1] - so.data()[i]);
    };
    vals.clear();
    offs.assign(1, 0);
    if (list_obj.is_none()) {
      DLREC_CHECK(n == rows, "column '", col, "': ", n, " values for ", rows, " rows");
      for (int64_t r = 0; r < rows; ++r) {
        const std::string_view f = str(r);
        if (!multi_hot) {
          if (!f.empty()) vals.push_back(text_key(f, schema, col, r));
        } else {
          size_t p = 0;
          while (p <= f.size() && !f.empty()) {
            size_t q = f.find(schema.list_sep, p);
            if (q == std::string_view::npos) q = f.size();
            if (q > p) vals.push_back(text_key(f.substr(p, q - p), schema, col, r));
            p = q + 1;
          }
        }
        offs.push_back(static_cast<int64_t>(vals.size()));
      }
    } else {
      const int64_t* lo = list_offsets.data();
      check_offsets(lo, rows, n, col, "list offsets");
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = lo[r]; i < lo[r + 1]; ++i)
          if (!str(i).empty()) vals.push_back(text_key(str(i), schema, col, r));
        offs.push_back(static_cast<int64_t>(vals.size()));
      }
    }
  }
  DLREC_CHECK(
      multi_hot ||
          [&] {
            for (int64_t r = 0; r < rows; ++r)
              if (offs[r + 1] - offs[r] > 1) return false;
            return true;
          }(),
      "column '", col, "' is one-hot in the schema but a row holds several values");
}

// Raw rows (io::RawChunk) from the Python side's columns, in schema order: label (float32 [rows]
// or None), dense (float32 [rows] each, NaN = missing), cats (fill_cat's descriptions). The
// dense columns are interleaved into the chunk's row-major array, so they are copied once.
io::RawChunk make_rows(const io::Schema& schema, int64_t rows, const py::object& label,
                       const std::vector<FloatArray>& dense, const py::list& cats) {
  io::RawChunk out;
  out.reset(schema.num_dense(), schema.num_cat());
  out.rows = rows;
  out.first_line = 0;  // messages name "row r of the chunk" (0-based), as the docs say
  DLREC_CHECK(static_cast<int>(dense.size()) == out.num_dense &&
                  static_cast<int>(cats.size()) == out.num_cat,
              "internal: column counts do not match the schema");
  if (!label.is_none()) {
    const FloatArray l = label.cast<FloatArray>();
    DLREC_CHECK(l.ndim() == 1 && l.shape(0) == rows, "the label needs ", rows, " values");
    out.label.assign(l.data(), l.data() + rows);
  }
  out.dense.resize(static_cast<size_t>(rows) * out.num_dense);
  for (int d = 0; d < out.num_dense; ++d) {
    DLREC_CHECK(dense[d].ndim() == 1 && dense[d].shape(0) == rows, "dense column ", d, " needs ",
                rows, " values");
    const float* p = dense[d].data();
    for (int64_t r = 0; r < rows; ++r) out.dense[r * out.num_dense + d] = p[r];
  }
  const auto names = schema.cat_names();
  const auto multi = schema.cat_multi_hot();
  for (int c = 0; c < out.num_cat; ++c)
    fill_cat(out, c, cats[c].cast<py::tuple>(), schema, names[c], multi[c]);
  return out;
}

// A Workflow and its lock (the calls run without the GIL): fit takes it exclusively, transform
// shared, so transforms run concurrently with each other but never beside a fit.
struct PyWorkflow {
  std::unique_ptr<etl::Workflow> w;
  std::shared_mutex mu;
};

py::dict transform_rows(PyWorkflow& pw, const io::RawChunk& in) {
  io::Batch b;
  std::vector<int64_t> kept;
  const bool filters = pw.w->has_filters();
  {
    py::gil_scoped_release nogil;
    std::shared_lock<std::shared_mutex> lock(pw.mu);
    pw.w->transform(in, b, filters ? &kept : nullptr);
  }
  py::dict d = batch_to_dict(std::move(b));
  if (filters) d["kept_rows"] = to_numpy(std::move(kept));
  return d;
}

py::dict transform_files(PyWorkflow& pw, const std::vector<std::string>& files,
                         const std::string& on_error) {
  io::Batch b;
  std::vector<int64_t> kept_all;
  const bool filters = pw.w->has_filters();
  {
    py::gil_scoped_release nogil;
    std::shared_lock<std::shared_mutex> lock(pw.mu);
    io::ReadOptions ro;
    ro.on_error = io::parse_on_error(on_error);
    auto reader = io::open_reader(files, pw.w->schema(), ro);
    io::RawChunk c;
    std::vector<int64_t> kept;
    int64_t seen = 0;
    bool first = true;
    while (reader->next(c)) {
      pw.w->transform(c, b, filters ? &kept : nullptr, /*append=*/!first);
      first = false;
      for (int64_t k : kept) kept_all.push_back(seen + k);
      seen += c.rows;
    }
    if (first) pw.w->transform(c, b, filters ? &kept : nullptr);  // no rows: an empty batch
  }
  py::dict d = batch_to_dict(std::move(b));
  if (filters) d["kept_rows"] = to_numpy(std::move(kept_all));
  return d;
}

py::dict etl_result_dict(const etl::EtlResult& r) {
  py::dict d;
  d["train_rows"] = r.train_rows;
  d["valid_rows"] = r.valid_rows;
  d["skipped_rows"] = r.skipped_rows;
  d["warnings"] = r.warnings;
  d["input_bytes"] = r.input_bytes;
  d["output_bytes"] = r.output_bytes;
  d["fit_passes"] = r.fit_passes;
  d["train_shards"] = r.train_shards;
  d["valid_shards"] = r.valid_shards;
  d["fit_seconds"] = r.fit_seconds;
  d["transform_seconds"] = r.transform_seconds;
  d["total_seconds"] = r.total_seconds;
  return d;
}

}  // namespace

void bind_etl(py::module_& m) {
  py::class_<io::RawChunk>(m, "RawRows", "Raw rows in dlrec's reader form (io::RawChunk)")
      .def_property_readonly("rows", [](const io::RawChunk& c) { return c.rows; });
  m.def(
      "make_rows",
      [](const std::string& schema_json, int64_t rows, const py::object& label,
         const std::vector<FloatArray>& dense, const py::list& cats) {
        const io::Schema s = io::Schema::from_json(parse_py_json(schema_json, "the schema"));
        return make_rows(s, rows, label, dense, cats);
      },
      py::arg("schema_json"), py::arg("rows"), py::arg("label"), py::arg("dense"), py::arg("cats"));

  py::class_<PyWorkflow>(m, "Workflow")
      .def_static("from_config",
                  [](const std::string& config_json, const std::string& schema_json,
                     const std::string& base_dir) {
                    auto pw = std::make_unique<PyWorkflow>();
                    pw->w = std::make_unique<etl::Workflow>(etl::Workflow::from_config(
                        parse_py_json(config_json, "the workflow config"),
                        io::Schema::from_json(parse_py_json(schema_json, "the schema")), base_dir));
                    return pw;
                  })
      .def_static("load",
                  [](const std::string& path) {
                    auto pw = std::make_unique<PyWorkflow>();
                    pw->w = std::make_unique<etl::Workflow>(etl::Workflow::load(path));
                    return pw;
                  })
      .def("fit_rows",
           [](PyWorkflow& pw, const io::RawChunk& rows) {
             py::gil_scoped_release nogil;
             std::unique_lock<std::shared_mutex> lock(pw.mu);
             // One batch of one chunk per pass, handed over by pointer (not copied).
             pw.w->fit_batches([&rows]() -> etl::ChunkBatchSource {
               auto given = std::make_shared<bool>(false);
               return [&rows, given](std::vector<const io::RawChunk*>& chunks) {
                 if (*given) return 0;
                 *given = true;
                 chunks.assign(1, &rows);
                 return 1;
               };
             });
           })
      .def("fit_files",
           [](PyWorkflow& pw, const std::vector<std::string>& files, const std::string& on_error) {
             py::gil_scoped_release nogil;
             std::unique_lock<std::shared_mutex> lock(pw.mu);
             io::ReadOptions ro;
             ro.on_error = io::parse_on_error(on_error);
             const io::Schema& schema = pw.w->schema();
             pw.w->fit_multipass([&]() -> etl::ChunkSource {
               std::shared_ptr<io::ChunkReader> reader = io::open_reader(files, schema, ro);
               return [reader](io::RawChunk& c) { return reader->next(c); };
             });
           })
      .def("transform_rows", &transform_rows)
      .def("transform_files", &transform_files)
      .def("fitted", [](const PyWorkflow& pw) { return pw.w->fitted(); })
      .def("has_filters", [](const PyWorkflow& pw) { return pw.w->has_filters(); })
      .def("schema_json", [](const PyWorkflow& pw) { return pw.w->schema().to_json().dump(); })
      .def("to_json", [](const PyWorkflow& pw) { return pw.w->to_json().dump(); })
      .def("save", [](const PyWorkflow& pw, const std::string& path) { pw.w->save(path); })
      .def("dense_names", [](const PyWorkflow& pw) { return pw.w->dense_names(); })
      .def("cat_names", [](const PyWorkflow& pw) { return pw.w->cat_names(); })
      .def("label_name", [](const PyWorkflow& pw) { return pw.w->label_name(); })
      .def("layout_json",
           [](const PyWorkflow& pw) { return pw.w->output_layout().to_json().dump(); });

  m.def(
      "run_etl",
      [](const std::vector<std::string>& inputs, const std::string& schema_json,
         const std::string& workflow_json, const std::string& out, int64_t train_rows,
         double valid_ratio, int64_t shard_rows, const std::string& on_error, bool overwrite,
         int64_t memory_budget_mb, bool shuffle, uint64_t seed, int ranks) {
        etl::EtlOptions o;
        o.inputs = inputs;
        o.schema = io::Schema::from_json(parse_py_json(schema_json, "the schema"));
        o.workflow = parse_py_json(workflow_json, "the workflow config");
        o.output_dir = out;
        o.train_rows = train_rows;
        o.valid_ratio = valid_ratio;
        if (shard_rows > 0) o.shard_rows = shard_rows;
        o.read.on_error = io::parse_on_error(on_error);
        o.overwrite = overwrite;
        o.memory_budget_mb = memory_budget_mb;
        o.shuffle = shuffle;
        o.seed = seed;
        o.ranks = ranks;
        etl::EtlResult r;
        {
          py::gil_scoped_release nogil;
          r = etl::run_etl(o);
        }
        return etl_result_dict(r);
      },
      py::arg("inputs"), py::arg("schema_json"), py::arg("workflow_json"), py::arg("out"),
      py::arg("train_rows"), py::arg("valid_ratio"), py::arg("shard_rows"), py::arg("on_error"),
      py::arg("overwrite"), py::arg("memory_budget_mb"), py::arg("shuffle"), py::arg("seed"),
      py::arg("ranks"));

  m.def(
      "read_shard",
      [](const std::string& path) {
        io::Batch b;
        std::string layout;
        {
          py::gil_scoped_release nogil;
          io::ShardReader reader(path);
          reader.read(0, reader.rows(), b);
          layout = reader.layout().to_json().dump();
        }
        py::dict d = batch_to_dict(std::move(b));
        d["layout_json"] = layout;
        return d;
      },
      py::arg("path"));
}

}  // namespace dlrec::python
