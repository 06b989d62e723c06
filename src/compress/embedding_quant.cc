// Row-wise INT8 / 4-bit embedding tables (docs/COMPRESSION.md).
#include "dlrec/compress/embedding_quant.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dlrec/core/thread_pool.h"

namespace dlrec::compress {

namespace {

// x rounded to the nearest fp16 value (round to nearest even; the range here is far inside
// fp16's normal range or is flushed like any subnormal).
float round_fp16(float x) {
  if (x == 0.f || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);     // |x| in [2^(e-1), 2^e)
  e = std::max(e, -13);  // fp16 subnormals: spacing 2^-24
  const float ulp = std::ldexp(1.f, e - 11);
  return std::nearbyint(x / ulp) * ulp;
}

}  // namespace

EmbeddingQuantConfig EmbeddingQuantConfig::from_json(ConfigReader& r) {
  EmbeddingQuantConfig c;
  c.on = true;
  const std::string dtype = r.get_choice("dtype", "int8", {"int8", "int4"});
  c.bits = dtype == "int4" ? 4 : 8;
  const json tables = r.get<json>("tables", json("all"));
  if (tables.is_string()) {
    if (tables.get<std::string>() != "all")
      fail(r.key_path("tables"), ": must be \"all\" or a list of table names, got ",
           dump_json_safe(tables));
  } else {
    if (!tables.is_array() || tables.empty())
      fail(r.key_path("tables"), ": must be \"all\" or a non-empty list of table names");
    c.all_tables = false;
    for (const json& t : tables) {
      if (!t.is_string() || t.get<std::string>().empty())
        fail(r.key_path("tables"), ": every entry must be a table name, got ", dump_json_safe(t));
      c.tables.push_back(t.get<std::string>());
    }
  }
  c.fp16_scale_bias = r.get_choice("scale_bias", "fp32", {"fp32", "fp16"}) == "fp16";
  r.finish();
  return c;
}

json EmbeddingQuantConfig::to_json() const {
  json j = {{"dtype", bits == 4 ? "int4" : "int8"},
            {"scale_bias", fp16_scale_bias ? "fp16" : "fp32"}};
  j["tables"] = all_tables ? json("all") : json(tables);
  return j;
}

RowQuantTable quantize_rows(const Tensor& table, int bits, bool fp16) {
  DLREC_CHECK(table.ndim() == 2 && table.dtype() == DType::F32 && !table.device().is_cuda(),
              "row-wise quantization: the table must be a 2-d F32 CPU tensor");
  DLREC_CHECK(bits == 8 || bits == 4, "row-wise quantization: bits must be 8 or 4, got ", bits);
  RowQuantTable t;
  t.rows = table.dim(0);
  t.dim = table.dim(1);
  t.bits = bits;
  t.fp16 = fp16;
  const int64_t rb = t.row_bytes(), d = t.dim;
  t.codes.assign(static_cast<size_t>(t.rows * rb), 0);
  t.scale.resize(static_cast<size_t>(t.rows));
  t.bias.resize(static_cast<size_t>(t.rows));
  const float levels = static_cast<float>((1 << bits) - 1);
  const float* v = table.data<float>();
  parallel_for(0, t.rows, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* x = v + r * d;
      float mn = x[0], mx = x[0];
      for (int64_t k = 1; k < d; ++k) {
        mn = std::min(mn, x[k]);
        mx = std::max(mx, x[k]);
      }
      float scale = (mx - mn) / levels, bias = mn;
      if (fp16) {
        scale = round_fp16(scale);
        bias = round_fp16(bias);
      }
      t.scale[r] = scale;
      t.bias[r] = bias;
      uint8_t* c = t.codes.data() + r * rb;
      const float inv = scale > 0 ? 1.f / scale : 0.f;
      for (int64_t k = 0; k < d; ++k) {
        const float q = std::min(levels, std::max(0.f, std::nearbyint((x[k] - bias) * inv)));
        const uint8_t u = static_cast<uint8_t>(q);
        if (bits == 8)
          c[k] = u;
        else
          c[k / 2] |= static_cast<uint8_t>(k % 2 ? u << 4 : u);
      }
    }
  });
  return t;
}

std::vector<TableQuantReport> quantize_embedding_tables(
    const EmbeddingQuantConfig& config, model::Model& model,
    std::vector<model::QuantizedTable>* records) {
  if (model.device().is_cuda())
    fail("compress.embeddings: row-wise quantized tables run on the CPU engine only");
  // The fixed tables: 2-d "<layer>.<feature>.weight" parameters that are not mlp/cross weights.
  std::set<std::string> dense;
  for (const auto& w : model.prunable_weights()) dense.insert(w.name);
  std::vector<std::pair<std::string, Tensor>> tables;
  for (auto& [name, t] : model.parameters()) {
    const std::string suffix = ".weight";
    if (t.ndim() != 2 || dense.count(name) || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    tables.emplace_back(name.substr(0, name.size() - suffix.size()), t);
  }
  std::string known;
  for (const auto& t : tables) known += (known.empty() ? "" : ", ") + t.first;
  DLREC_CHECK(!tables.empty(), "compress.embeddings: the model has no fixed embedding table");
  if (!config.all_tables)
    for (const std::string& n : config.tables)
      if (std::none_of(tables.begin(), tables.end(), [&](const auto& t) { return t.first == n; }))
        fail("compress.embeddings.tables: '", n, "' is not a fixed embedding table of the model ",
             "(tables: ", known, ")");
  std::vector<TableQuantReport> out;
  for (auto& [name, t] : tables) {
    if (!config.all_tables &&
        std::find(config.tables.begin(), config.tables.end(), name) == config.tables.end())
      continue;
    RowQuantTable q = quantize_rows(t, config.bits, config.fp16_scale_bias);
    TableQuantReport r;
    r.table = name;
    r.rows = q.rows;
    r.dim = q.dim;
    r.fp32_bytes = q.rows * q.dim * 4;
    r.quant_bytes = q.bytes();
    float* v = t.data<float>();
    std::vector<float> row(static_cast<size_t>(q.dim));
    double e2 = 0, r2 = 0;
    for (int64_t i = 0; i < q.rows; ++i) {
      nn::row_quant_dequantize(q, i, row.data());
      for (int64_t k = 0; k < q.dim; ++k) {
        const double a = v[i * q.dim + k], b = row[k];
        e2 += (a - b) * (a - b);
        r2 += a * a;
        r.max_abs_err = std::max(r.max_abs_err, std::abs(a - b));
        v[i * q.dim + k] = row[k];
      }
    }
    r.rel_l2 = r2 > 0 ? std::sqrt(e2 / r2) : 0.0;
    out.push_back(r);
    if (records) records->push_back({name + ".weight", std::move(q)});
  }
  return out;
}

}  // namespace dlrec::compress
