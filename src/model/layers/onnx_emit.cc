// The ONNX graph description and the pieces several layers' emitters share (onnx_emit.h).
#include "model/layers/onnx_emit.h"

#include <algorithm>
#include <cstring>

#include "model/layers/layer.h"

namespace dlrec::model {

OnnxAttr OnnxAttr::integer(const std::string& n, int64_t v) {
  OnnxAttr a;
  a.name = n;
  a.kind = Kind::Int;
  a.i = v;
  return a;
}
OnnxAttr OnnxAttr::real(const std::string& n, float v) {
  OnnxAttr a;
  a.name = n;
  a.kind = Kind::Float;
  a.f = v;
  return a;
}
OnnxAttr OnnxAttr::integers(const std::string& n, std::vector<int64_t> v) {
  OnnxAttr a;
  a.name = n;
  a.kind = Kind::Ints;
  a.ints = std::move(v);
  return a;
}
OnnxAttr OnnxAttr::text(const std::string& n, const std::string& v) {
  OnnxAttr a;
  a.name = n;
  a.kind = Kind::String;
  a.s = v;
  return a;
}

void OnnxGraph::reserve(const std::string& name) { taken_.push_back(name); }

std::string OnnxGraph::unique(const std::string& hint) {
  auto used = [&](const std::string& n) {
    return std::find(taken_.begin(), taken_.end(), n) != taken_.end();
  };
  std::string name = hint;
  for (int k = 1; used(name); ++k) name = hint + "_" + std::to_string(k);
  taken_.push_back(name);
  return name;
}

std::string OnnxGraph::constant(const std::string& hint, Tensor value) {
  DLREC_CHECK(
      !value.device().is_cuda() && (value.dtype() == DType::F32 || value.dtype() == DType::I32 ||
                                    value.dtype() == DType::I64),
      "ONNX export: constant '", hint, "' must be an f32, i32 or i64 CPU tensor");
  const std::string name = unique(hint);
  constants_.push_back({name, std::move(value)});
  return name;
}

std::string OnnxGraph::ints(const std::string& hint, const std::vector<int64_t>& v) {
  return constant(hint, Tensor::from_vector(v, {static_cast<int64_t>(v.size())}));
}

std::string OnnxGraph::scalar(const std::string& hint, float v) {
  return constant(hint, Tensor::from_vector(std::vector<float>{v}, {1}));
}

std::string OnnxGraph::op(const std::string& type, const std::vector<std::string>& inputs,
                          const std::string& hint, std::vector<OnnxAttr> attrs,
                          const std::string& domain) {
  OnnxNode n;
  n.op = type;
  n.domain = domain;
  n.inputs = inputs;
  n.outputs = {unique(hint)};
  n.attrs = std::move(attrs);
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs[0];
}

std::string onnx_concat(OnnxGraph& g, const std::vector<std::string>& inputs,
                        const std::string& hint) {
  if (inputs.size() == 1) return inputs[0];
  return g.op("Concat", inputs, hint, {OnnxAttr::integer("axis", 1)});
}

std::string onnx_linear(OnnxGraph& g, const std::string& x, const std::string& weight,
                        const std::string& bias, const std::string& hint) {
  std::vector<std::string> in = {x, weight};
  if (!bias.empty()) in.push_back(bias);
  return g.op("Gemm", in, hint, {OnnxAttr::integer("transB", 1)});
}

std::string onnx_pooled_lookup(OnnxGraph& g, const OnnxIds& ids, const std::string& table,
                               int64_t dim, const std::string& pooling, const std::string& hint) {
  // One id per row: a plain Gather (sum and mean of one row are the row).
  if (!ids.multi_hot) return g.op("Gather", {table, ids.ids}, hint, {OnnxAttr::integer("axis", 0)});
  // Bags: the rows of all ids, then summed into their row's slot (ScatterND, reduction add).
  // The slot of each id comes from the offsets: a 1 at every row start (offsets[1 .. N - 1],
  // equal ones added), cumulatively summed over the ids.
  const std::string rows =
      g.op("Gather", {table, ids.ids}, hint + ".rows", {OnnxAttr::integer("axis", 0)});
  const std::string nnz = g.op("Shape", {ids.ids}, hint + ".nnz");
  const std::string one = g.ints(hint + ".one", {1});
  const std::string zero = g.ints(hint + ".zero", {0});
  const std::string last = g.ints(hint + ".last", {-1});
  const std::string axis0 = g.ints(hint + ".axis0", {0});
  const std::string nnz1 = g.op("Add", {nnz, one}, hint + ".nnz1");
  const std::string marks0 = g.op("Expand", {zero, nnz1}, hint + ".marks0");
  const std::string starts = g.op("Slice", {ids.offsets, one, last, axis0}, hint + ".starts");
  const std::string ones =
      g.op("Expand", {one, g.op("Shape", {starts}, hint + ".nstarts")}, hint + ".ones");
  const std::string marks = g.op("ScatterElements", {marks0, starts, ones}, hint + ".marks",
                                 {OnnxAttr::text("reduction", "add")});
  const std::string cum =
      g.op("CumSum",
           {marks, g.constant(hint + ".cumaxis", Tensor::from_vector(std::vector<int64_t>{0}, {}))},
           hint + ".cum");
  const std::string seg = g.op("Slice", {cum, zero, nnz, axis0}, hint + ".seg");
  const std::string seg2 = g.op("Unsqueeze", {seg, g.ints(hint + ".axis1", {1})}, hint + ".seg2");
  const std::string n = g.op("Sub", {g.op("Shape", {ids.offsets}, hint + ".n1"), one}, hint + ".n");
  const std::string out_shape = g.op("Concat", {n, g.ints(hint + ".dim", {dim})}, hint + ".shape",
                                     {OnnxAttr::integer("axis", 0)});
  const std::string zeros =
      g.op("Expand", {g.scalar(hint + ".fzero", 0.f), out_shape}, hint + ".zeros");
  std::string out = g.op("ScatterND", {zeros, seg2, rows}, hint + (pooling == "mean" ? ".sum" : ""),
                         {OnnxAttr::text("reduction", "add")});
  if (pooling != "mean") return out;
  // Mean: divided by the bag's length (an empty bag stays zero).
  const std::string ends =
      g.op("Slice", {ids.offsets, one, g.ints(hint + ".big", {INT64_MAX}), axis0}, hint + ".ends");
  const std::string begins = g.op("Slice", {ids.offsets, zero, last, axis0}, hint + ".begins");
  const std::string len =
      g.op("Max", {g.op("Sub", {ends, begins}, hint + ".len0"), one}, hint + ".len");
  const std::string lenf =
      g.op("Cast", {len}, hint + ".lenf", {OnnxAttr::integer("to", 1 /* FLOAT */)});
  const std::string len2 = g.op("Unsqueeze", {lenf, g.ints(hint + ".axis1b", {1})}, hint + ".len2");
  return g.op("Div", {out, len2}, hint);
}

std::string onnx_table_lookup(OnnxEmit& e, int64_t feature, int64_t dim) {
  const std::string name = e.spec.name + "." + std::to_string(feature);
  const OnnxIds ids = e.ids(feature);
  const Tensor w = e.param(name + ".weight");
  const bool hashed =
      e.spec.hashed.on || (e.spec.tables.count(feature) && e.spec.tables.at(feature).hashed.on);
  if (!hashed) {
    DLREC_CHECK(w.ndim() == 2 && w.dim(1) == dim, "ONNX export: table '", name, "' has shape ",
                shape_str(w.shape()), ", expected [rows, ", dim, "]");
    return onnx_pooled_lookup(e.g, ids, e.g.constant(name + ".weight", w), dim, e.spec.pooling,
                              name + ".pooled");
  }
  // A hashed table: slots [0, size) hold keys[slot]; ids map to their slot, unknown ones to an
  // extra zero row (index size).
  const Tensor keys = e.param(name + ".keys");
  const Tensor meta = e.param(name + ".hash_meta");
  DLREC_CHECK(keys.dtype() == DType::I64 && meta.dtype() == DType::I64 && meta.numel() >= 1 &&
                  w.ndim() == 2 && w.dim(1) == dim && keys.numel() == w.dim(0),
              "ONNX export: hashed table '", name, "' has unexpected tensors");
  const int64_t size = meta.data<int64_t>()[0];
  DLREC_CHECK(size >= 0 && size <= keys.numel(), "ONNX export: hashed table '", name, "' holds ",
              size, " rows of ", keys.numel());
  Tensor rows = Tensor::zeros({size + 1, dim}, DType::F32);
  if (size > 0) std::memcpy(rows.data<float>(), w.data<float>(), size * dim * sizeof(float));
  const std::string table = e.g.constant(name + ".weight", rows);
  OnnxIds slots = ids;
  if (size == 0) {
    // Nothing trained yet: every id reads the zero row.
    slots.ids = e.g.op("Mul", {ids.ids, e.g.ints(name + ".none", {0})}, name + ".slots");
  } else {
    std::vector<int64_t> k(keys.data<int64_t>(), keys.data<int64_t>() + size), v(size);
    for (int64_t s = 0; s < size; ++s) v[s] = s;
    slots.ids =
        e.g.op("LabelEncoder", {ids.ids}, name + ".slots",
               {OnnxAttr::integers("keys_int64s", k), OnnxAttr::integers("values_int64s", v),
                OnnxAttr::integer("default_int64", size)},
               "ai.onnx.ml");
  }
  return onnx_pooled_lookup(e.g, slots, table, dim, e.spec.pooling, name + ".pooled");
}

}  // namespace dlrec::model
