// Shared pieces of the extension module dlrec._dlrec (docs/PYTHON.md): NumPy arrays that own a
// moved std::vector (no copy), and the registration functions of each source file.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/batch.h"

namespace dlrec::python {

namespace py = pybind11;

// A NumPy array over the vector's memory: the vector is moved into a heap object that the
// array's base capsule owns, so the data is not copied.
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule base(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, owned->data(), base);
}

template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  const auto n = static_cast<py::ssize_t>(v.size());
  return to_numpy(std::move(v), {n});
}

// An encoded batch as a dict of NumPy arrays (moved out of `b`, no copy): "labels" [rows],
// "dense" [rows, num_dense], "cat_ids" and "cat_offsets" (lists, one per categorical feature;
// ids of row r are cat_ids[t][cat_offsets[t][r]:cat_offsets[t][r+1]]).
py::dict batch_to_dict(io::Batch&& b);

// Parses JSON text handed over by the Python side (json.dumps of a dict or a file's text).
json parse_py_json(const std::string& text, const std::string& what);

void bind_etl(py::module_& m);    // etl.cc: raw rows, Workflow, run_etl, shards
void bind_train(py::module_& m);  // train.cc: train, evaluate, export, Predictor

}  // namespace dlrec::python
