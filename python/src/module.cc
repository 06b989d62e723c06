// The extension module dlrec._dlrec: the C++ library behind the Python package (python/dlrec,
// docs/PYTHON.md). dlrec::Error becomes dlrec.Error (a RuntimeError) with the same message.
#include "bind.h"
#include "dlrec/core/error.h"
#include "dlrec/core/progress.h"

namespace dlrec::python {

py::dict batch_to_dict(io::Batch&& b) {
  py::dict d;
  const auto rows = static_cast<py::ssize_t>(b.rows);
  d["labels"] = to_numpy(std::move(b.labels));
  d["dense"] = to_numpy(std::move(b.dense), {rows, static_cast<py::ssize_t>(b.num_dense)});
  py::list ids, offsets;
  for (size_t t = 0; t < b.cat_indices.size(); ++t) {
    ids.append(to_numpy(std::move(b.cat_indices[t])));
    offsets.append(to_numpy(std::move(b.cat_offsets[t])));
  }
  d["cat_ids"] = ids;
  d["cat_offsets"] = offsets;
  return d;
}

json parse_py_json(const std::string& text, const std::string& what) {
  return parse_json(text, what);
}

}  // namespace dlrec::python

PYBIND11_MODULE(_dlrec, m) {
  namespace py = pybind11;
  m.doc() = "dlrec's C++ library (use the dlrec package, docs/PYTHON.md)";
  py::register_exception<dlrec::Error>(m, "Error", PyExc_RuntimeError);
  m.def("set_progress_quiet", &dlrec::set_progress_quiet, py::arg("quiet"),
        "Silences (True) or restores the progress lines dlrec prints to stderr.");
  m.def(
      "read_json_file", [](const std::string& path) { return dlrec::read_json_file(path).dump(); },
      py::arg("path"), "A JSON file's text, parsed and checked as dlrec reads its files.");
  dlrec::python::bind_etl(m);
  dlrec::python::bind_train(m);
}
