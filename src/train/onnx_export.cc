// ONNX export (include/dlrec/train/onnx_export.h): the layer registry's emitters build an
// OnnxGraph (src/model/layers/onnx_emit.h); this file adds the inputs and outputs and writes it
// as an ONNX ModelProto (src/train/proto/onnx_model.proto).
#include "dlrec/train/onnx_export.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "dlrec/core/file_util.h"
#include "dlrec/io/text_reader.h"
#include "dlrec/model/graph.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"
#include "onnx_model.pb.h"
#include "train/onnx_export_impl.h"

namespace dlrec::train {

namespace {

namespace fs = std::filesystem;
using model::OnnxAttr;
using model::OnnxGraph;
using model::OnnxIds;

constexpr int kIrVersion = 8;  // the IR of opset 17
constexpr int kMlOpset = 3;    // ai.onnx.ml of opset 17 (LabelEncoder 2)

int onnx_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return onnxpb::TensorProto::FLOAT;
    case DType::I32:
      return onnxpb::TensorProto::INT32;
    case DType::I64:
      return onnxpb::TensorProto::INT64;
    default:
      fail("ONNX export: unsupported tensor type ", dtype_name(t));
  }
}

// A graph input or output: `dims` with -1 for a symbolic dimension named from `sym`.
void value_info(onnxpb::ValueInfoProto* v, const std::string& name, int elem,
                const std::vector<int64_t>& dims, const std::vector<std::string>& sym,
                const std::string& doc) {
  v->set_name(name);
  v->set_doc_string(doc);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  for (size_t k = 0; k < dims.size(); ++k) {
    auto* d = shape->add_dim();
    if (dims[k] >= 0)
      d->set_dim_value(dims[k]);
    else
      d->set_dim_param(sym[k]);
  }
}

void write_attr(onnxpb::AttributeProto* a, const OnnxAttr& x) {
  a->set_name(x.name);
  switch (x.kind) {
    case OnnxAttr::Kind::Int:
      a->set_type(onnxpb::AttributeProto::INT);
      a->set_i(x.i);
      break;
    case OnnxAttr::Kind::Float:
      a->set_type(onnxpb::AttributeProto::FLOAT);
      a->set_f(x.f);
      break;
    case OnnxAttr::Kind::Ints:
      a->set_type(onnxpb::AttributeProto::INTS);
      for (int64_t v : x.ints) a->add_ints(v);
      break;
    case OnnxAttr::Kind::String:
      a->set_type(onnxpb::AttributeProto::STRING);
      a->set_s(x.s);
      break;
  }
}

// The layer graph of the model: the preset's expansion, or the config's own list.
json graph_layers(const model::ModelConfig& config, const io::ShardLayout& layout) {
  return config.arch == "graph" ? config.layers : model::preset_graph_layers(config, layout);
}

// Adds the graph's inputs (onnx_export.h) and returns how layers read them.
struct Inputs {
  std::string dense, cat;
  std::map<int64_t, OnnxIds> ids;  // per feature, made on first use
};

// Constants below this size stay inside the model even with external data (shapes, indices).
constexpr int64_t kExternalMinBytes = 1024;

// The graph's constants as initializers: raw_data inside the model, or, when they exceed
// `inline_limit` bytes in all, the large ones in `external_path` (each at an offset aligned to
// 4 KiB, which lets readers map them).
void write_initializers(onnxpb::GraphProto* gp, const std::vector<model::OnnxConstant>& constants,
                        int64_t inline_limit, const std::string& external_path) {
  int64_t total = 0;
  for (const auto& c : constants) total += static_cast<int64_t>(c.value.nbytes());
  const bool external = total > inline_limit;
  if (external && external_path.empty())
    fail("ONNX export: the model's weights take ", total, " bytes, more than a protobuf file ",
         "holds inline (", inline_limit, "); write them as external data (dlrec export ",
         "--onnx-external-data)");
  std::FILE* f = nullptr;
  const std::string location = fs::path(external_path).filename().string();
  if (external) {
    f = std::fopen(external_path.c_str(), "wb");
    if (!f) fail("cannot create '", external_path, "': ", std::strerror(errno));
  }
  int64_t offset = 0;
  try {
    for (const model::OnnxConstant& c : constants) {
      onnxpb::TensorProto* tp = gp->add_initializer();
      tp->set_name(c.name);
      tp->set_data_type(onnx_dtype(c.value.dtype()));
      for (int64_t d : c.value.shape()) tp->add_dims(d);
      const int64_t n = static_cast<int64_t>(c.value.nbytes());
      // Values are little-endian, as this machine's memory (x86-64, aarch64).
      const char* bytes = static_cast<const char*>(c.value.raw());
      if (!external || n < kExternalMinBytes) {
        tp->set_raw_data(std::string(bytes, n));
        continue;
      }
      const int64_t at = (offset + 4095) / 4096 * 4096;
      static const char zeros[4096] = {};
      if (at > offset && std::fwrite(zeros, 1, at - offset, f) != static_cast<size_t>(at - offset))
        fail("cannot write '", external_path, "': ", std::strerror(errno));
      if (std::fwrite(bytes, 1, n, f) != static_cast<size_t>(n))
        fail("cannot write '", external_path, "': ", std::strerror(errno));
      offset = at + n;
      tp->set_data_location(onnxpb::TensorProto::EXTERNAL);
      const std::pair<const char*, std::string> entries[] = {
          {"location", location}, {"offset", std::to_string(at)}, {"length", std::to_string(n)}};
      for (const auto& [k, v] : entries) {
        auto* e = tp->add_external_data();
        e->set_key(k);
        e->set_value(v);
      }
    }
    if (f && (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0))
      fail("cannot write '", external_path, "': ", std::strerror(errno));
  } catch (...) {
    if (f) std::fclose(f);
    throw;
  }
  if (f && std::fclose(f) != 0) fail("cannot write '", external_path, "': ", std::strerror(errno));
}

}  // namespace

std::string onnx_model_bytes(const model::ModelConfig& config, const io::ShardLayout& layout,
                             model::Model& mdl) {
  return onnx_model_bytes_with(config, layout, mdl, model::layer_type, INT64_MAX, "");
}

void write_onnx_model(const std::string& dir, const model::ModelConfig& config,
                      const io::ShardLayout& layout, model::Model& mdl, OnnxWeights weights) {
  const int64_t limit = weights == OnnxWeights::Inline     ? INT64_MAX
                        : weights == OnnxWeights::External ? 0
                                                           : kOnnxInlineLimit;
  const std::string data = dir + "/model.onnx.data";
  write_file_atomic(dir + "/model.onnx",
                    onnx_model_bytes_with(config, layout, mdl, model::layer_type, limit,
                                          weights == OnnxWeights::Inline ? "" : data));
}

std::string onnx_model_bytes_with(const model::ModelConfig& config, const io::ShardLayout& layout,
                                  model::Model& mdl, const LayerTypeLookup& type_of,
                                  int64_t inline_limit, const std::string& external_path) {
  const model::GraphSpec spec =
      model::GraphSpec::parse(graph_layers(config, layout), "model.layers");
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : mdl.parameters()) params[name] = t.to(Device::cpu());

  onnxpb::ModelProto m;
  m.set_ir_version(kIrVersion);
  m.set_producer_name("dlrec");
  m.set_producer_version("0.1.0");
  m.set_doc_string("dlrec model (arch '" + config.arch + "'); inputs: docs/EXPORT.md, ONNX");
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  auto* ml = m.add_opset_import();
  ml->set_domain("ai.onnx.ml");
  ml->set_version(kMlOpset);
  onnxpb::GraphProto* gp = m.mutable_graph();
  gp->set_name("dlrec");

  OnnxGraph g;
  Inputs inputs;
  const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
  bool any_one_hot = false;
  for (int64_t t = 0; t < T; ++t) any_one_hot = any_one_hot || !layout.multi_hot[t];
  if (layout.num_dense > 0) {
    inputs.dense = "dense";
    g.reserve("dense");
    value_info(gp->add_input(), "dense", onnxpb::TensorProto::FLOAT, {-1, layout.num_dense},
               {"N", ""}, "dense features after the workflow");
  }
  if (any_one_hot) {
    inputs.cat = "cat";
    g.reserve("cat");
    value_info(gp->add_input(), "cat", onnxpb::TensorProto::INT64, {-1, T}, {"N", ""},
               "one id per row for each one-hot categorical feature (column t = feature t)");
  }
  for (int64_t t = 0; t < T; ++t) {
    if (!layout.multi_hot[t]) continue;
    const std::string p = "cat_" + std::to_string(t);
    g.reserve(p + "_ids");
    g.reserve(p + "_offsets");
    value_info(gp->add_input(), p + "_ids", onnxpb::TensorProto::INT64, {-1}, {"nnz_" + p},
               "multi-hot feature " + std::to_string(t) + ": ids, row by row");
    value_info(gp->add_input(), p + "_offsets", onnxpb::TensorProto::INT64, {-1}, {"N_plus_1"},
               "multi-hot feature " + std::to_string(t) +
                   ": row r's ids are ids[offsets[r] .. "
                   "offsets[r + 1])");
    inputs.ids[t] = OnnxIds{true, p + "_ids", p + "_offsets"};
  }
  auto dense = [&]() {
    if (inputs.dense.empty()) fail("the data has no dense features");
    return inputs.dense;
  };
  auto ids = [&](int64_t t) {
    DLREC_CHECK(t >= 0 && t < T, "ONNX export: no categorical feature ", t);
    auto it = inputs.ids.find(t);
    if (it != inputs.ids.end()) return it->second;
    const std::string col =
        g.constant("cat.col" + std::to_string(t), Tensor::from_vector(std::vector<int64_t>{t}, {}));
    OnnxIds one{false,
                g.op("Gather", {inputs.cat, col}, "cat_" + std::to_string(t),
                     {OnnxAttr::integer("axis", 1)}),
                ""};
    inputs.ids[t] = one;
    return one;
  };
  auto param = [&](const std::string& name) {
    auto it = params.find(name);
    if (it == params.end()) fail("ONNX export: the model has no tensor '", name, "'");
    return it->second;
  };

  std::vector<model::ValueShape> shapes(spec.layers.size());
  std::vector<std::string> values(spec.layers.size());
  for (int i : spec.order) {
    const model::LayerSpec& s = spec.layers[i];
    const model::LayerType& type = type_of(s.type);
    try {
      std::vector<model::ValueShape> in;
      std::vector<std::string> in_values;
      for (int j : s.input_ids) {
        in.push_back(shapes[j]);
        in_values.push_back(values[j]);
      }
      shapes[i] = type.infer(s, in, layout);
      if (!type.to_onnx)
        fail("layer type '", s.type, "' has no ONNX export (its to_onnx in src/model/layers/",
             s.type, ".cc)");
      model::OnnxEmit e{s, in, shapes[i], layout, in_values, g, param, dense, ids};
      values[i] = type.to_onnx(e);
    } catch (const Error& e) {
      fail("ONNX export: ", s.where, ": ", e.what());
    }
  }
  const std::string n1 = g.ints("logit.shape", {-1});
  g.reserve("logit");
  g.reserve("probability");
  const std::string logit_src = values[spec.output];
  for (const model::OnnxNode& n : g.nodes()) {
    onnxpb::NodeProto* np = gp->add_node();
    np->set_op_type(n.op);
    if (!n.domain.empty()) np->set_domain(n.domain);
    np->set_name(n.outputs[0]);
    for (const auto& x : n.inputs) np->add_input(x);
    for (const auto& x : n.outputs) np->add_output(x);
    for (const auto& a : n.attrs) write_attr(np->add_attribute(), a);
  }
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    onnxpb::NodeProto* np = gp->add_node();
    np->set_op_type(op);
    np->set_name(out);
    for (const auto& x : in) np->add_input(x);
    np->add_output(out);
  };
  node("Reshape", {logit_src, n1}, "logit");
  node("Sigmoid", {"logit"}, "probability");
  write_initializers(gp, g.constants(), inline_limit, external_path);
  value_info(gp->add_output(), "logit", onnxpb::TensorProto::FLOAT, {-1}, {"N"},
             "the model's logit per row");
  value_info(gp->add_output(), "probability", onnxpb::TensorProto::FLOAT, {-1}, {"N"},
             "sigmoid(logit): the click probability, as dlrec predict gives");
  std::string bytes;
  DLREC_CHECK(m.SerializeToString(&bytes),
              "ONNX export: the model could not be serialized (over "
              "2 GB? protobuf files cannot be larger)");
  return bytes;
}

json onnx_inputs_json(const io::Batch& b, const io::ShardLayout& layout) {
  const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
  DLREC_CHECK(b.num_dense == layout.num_dense && b.num_cat() == T,
              "ONNX inputs: the batch does not have the model's layout");
  json out = json::object();
  if (layout.num_dense > 0) {
    json dense = json::array();
    for (int64_t r = 0; r < b.rows; ++r)
      dense.push_back(std::vector<float>(b.dense.begin() + r * b.num_dense,
                                         b.dense.begin() + (r + 1) * b.num_dense));
    out["dense"] = std::move(dense);
  }
  bool any_one_hot = false;
  for (int64_t t = 0; t < T; ++t) any_one_hot = any_one_hot || !layout.multi_hot[t];
  if (any_one_hot) {
    json cat = json::array();
    for (int64_t r = 0; r < b.rows; ++r) {
      std::vector<int64_t> row(T, 0);
      for (int64_t t = 0; t < T; ++t) {
        if (layout.multi_hot[t]) continue;
        const auto& off = b.cat_offsets[t];
        DLREC_CHECK(off[r + 1] - off[r] == 1, "ONNX inputs: one-hot feature ", t, " has ",
                    off[r + 1] - off[r], " ids in row ", r);
        row[t] = b.cat_indices[t][off[r]];
      }
      cat.push_back(std::move(row));
    }
    out["cat"] = std::move(cat);
  }
  for (int64_t t = 0; t < T; ++t) {
    if (!layout.multi_hot[t]) continue;
    const auto& off = b.cat_offsets[t];
    const std::string p = "cat_" + std::to_string(t);
    std::vector<int64_t> o(off.begin(), off.end());
    for (int64_t& x : o) x -= off[0];
    out[p + "_ids"] = std::vector<int64_t>(b.cat_indices[t].begin() + off[0],
                                           b.cat_indices[t].begin() + off[b.rows]);
    out[p + "_offsets"] = std::move(o);
  }
  return out;
}

io::Batch encode_lines(const etl::Workflow& wf, const std::vector<std::string>& lines,
                       const std::string& source) {
  const io::Schema& schema = wf.schema();
  size_t first = 0;
  std::string header;
  if (schema.header) {
    DLREC_CHECK(!lines.empty(), source, ": empty input (a header line is expected)");
    header = lines[0];
    first = 1;
  }
  const std::vector<int> mapping = io::field_mapping(schema, header, source);
  io::RawChunk chunk;
  chunk.reset(schema.num_dense(), schema.num_cat());
  chunk.first_line = static_cast<int64_t>(first) + 1;
  for (size_t i = first; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty()) continue;
    io::parse_line(l.data(), l.data() + l.size(), schema, mapping, chunk,
                   source + ":" + std::to_string(i + 1));
  }
  io::Batch batch;
  wf.transform(chunk, batch);
  return batch;
}

}  // namespace dlrec::train
