// Row-wise INT8 / 4-bit tables in the export (docs/COMPRESSION.md): weights.dlrec holds the
// codes, scales and biases instead of the fp32 values (format version 3), the Predictor serves
// them (the CPU embedding layer reads the codes; the CUDA engine takes their dequantized values)
// bit for bit like an export of the dequantized fp32 tables, and bad records are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "compress/compress_test_util.h"
#include "dlrec/compress/compressed_records.h"
#include "dlrec/compress/embedding_quant.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
namespace fs = std::filesystem;
using dlrec::testing::expect_error;

namespace {

const std::string& root() {
  static dlrec::testing::TempDir dir("emb_quant_export");
  return dir.path;
}

struct TrainedRun {
  std::string data, run;
  model::RunConfig cfg;
};

// A trained run of `arch` on synthetic data (3 categorical features, cardinalities 20, 100 and
// the generator's default for the third), embedding width `dim`.
TrainedRun trained(const std::string& arch, int dim = 5) {
  TrainedRun x;
  const std::string dir = root() + "/" + arch + std::to_string(dim);
  fs::remove_all(dir);
  x.data = dlrec::testing::make_compress_data(dir, 4, 3000, 5);
  x.run = dir + "/run";
  const std::string extra = arch == "dcnv2" ? R"(, "cross_layers": 2)" : "";
  x.cfg = model::RunConfig::from_json(parse_json(R"({
      "model": {"arch": ")" + arch + R"(", "embedding_dim": )" + std::to_string(dim) +
                                                 R"(, "bottom_mlp": [8, )" + std::to_string(dim) +
                                                 R"(],
                "top_mlp": [8, 1])" + extra + R"(},
      "optimizer": {"type": "adagrad", "lr": 0.05},
      "train": {"batch_size": 128, "epochs": 1, "log_every": 0}})",
                                                 "test config"));
  train::TrainerOptions opt;
  opt.data_dir = x.data;
  opt.run_dir = x.run;
  train::Trainer(x.cfg, opt).train();
  return x;
}

// The run's model with its tables quantized; with `compact` the tables are served from their
// codes (Model::set_quantized_tables), else they hold the dequantized fp32 values. Exported
// into `out`.
void export_quantized(const TrainedRun& r, int bits, bool fp16, bool compact,
                      const std::string& out) {
  const io::DatasetInfo data = io::DatasetInfo::load(r.data);
  auto m = model::build_model(r.cfg.model, r.cfg.optimizer, data.layout, Device::cpu(), 0);
  const train::CheckpointState st = train::load_checkpoint(r.run + "/checkpoint.dlrec", *m);
  compress::EmbeddingQuantConfig e;
  e.on = true;
  e.bits = bits;
  e.fp16_scale_bias = fp16;
  std::vector<model::QuantizedTable> records;
  compress::quantize_embedding_tables(e, *m, &records);
  if (compact) m->set_quantized_tables(std::move(records));
  const etl::Workflow wf = etl::Workflow::load(r.data + "/workflow.json");
  train::export_loaded_model(*m, r.cfg, data.layout, st.step, wf, out, true);
}

bool have_gpu() { return cuda::built_with_cuda() && cuda::device_count() > 0; }

}  // namespace

TEST(EmbeddingQuantExport, ServesTheCodesBitForBitLikeTheDequantizedTables) {
  for (const std::string arch : {"dlrm", "dcnv2"}) {
    const TrainedRun r = trained(arch);
    const io::Batch b = dlrec::testing::first_valid_batch(r.data);
    for (int bits : {8, 4})
      for (bool fp16 : {false, true}) {
        SCOPED_TRACE(arch + " int" + std::to_string(bits) + (fp16 ? " fp16" : " fp32"));
        const std::string ref = root() + "/ref", q = root() + "/q";
        export_quantized(r, bits, fp16, false, ref);
        export_quantized(r, bits, fp16, true, q);
        // The compact export: version 3, the tables as codes (no fp32 values), smaller.
        EXPECT_EQ(read_json_file(ref + "/model.json").at("version"), train::kModelFormatOldest);
        EXPECT_EQ(read_json_file(q + "/model.json").at("version"), train::kModelFormatVersion);
        const json meta = io::read_tensor_meta(q + "/weights.dlrec");
        ASSERT_TRUE(meta.contains("embedding_quant")) << meta.dump();
        ASSERT_EQ(meta.at("embedding_quant").size(), 3u) << meta.dump();
        for (const json& t : meta.at("embedding_quant")) {
          EXPECT_EQ(t.at("bits"), bits);
          EXPECT_EQ(t.at("scale_bias"), fp16 ? "fp16" : "fp32");
        }
        EXPECT_LT(fs::file_size(q + "/weights.dlrec"), fs::file_size(ref + "/weights.dlrec"));

        train::Predictor pr(ref), pq(q);
        // Served from the codes: the plan counts them, beside parameters without the tables.
        EXPECT_NE(pq.memory_plan().find("row-wise quantized tables"), std::string::npos)
            << pq.memory_plan();
        EXPECT_EQ(pr.memory_plan().find("row-wise quantized tables"), std::string::npos);
        const std::vector<float> a = pr.predict(b), c = pq.predict(b);
        ASSERT_EQ(a.size(), c.size());
        EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
      }
  }
}

// The CUDA engine serves the compact export from the codes on the device (its fp32 tables never
// allocated): bit for bit its predictions of the dequantized fp32 export, through the bucketed
// graphs (400 rows) and the fused small-batch kernels (5 rows, bf16: DLRM's kernel at width 8,
// the program form's gather for DCNv2), at an odd width (scalar reads) and at 8 (vector reads).
TEST(EmbeddingQuantExport, CudaEngineServesTheCodesLikeTheDequantizedTables) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CUDA engine's serving not run";
  for (const std::string arch : {"dlrm", "dcnv2"})
    for (int dim : {5, 8}) {
      const TrainedRun r = trained(arch, dim);
      const io::Batch big = dlrec::testing::first_valid_batch(r.data),
                      small = dlrec::testing::first_valid_batch(r.data, 5);
      for (int bits : {8, 4}) {
        SCOPED_TRACE(arch + " dim " + std::to_string(dim) + " int" + std::to_string(bits));
        const std::string ref = root() + "/gref", q = root() + "/gq";
        export_quantized(r, bits, true, false, ref);
        export_quantized(r, bits, true, true, q);
        for (const std::string precision : {"fp32", "bf16"}) {
          train::Predictor gr(ref, Device::cuda(), precision), gq(q, Device::cuda(), precision);
          EXPECT_NE(gq.memory_plan().find("row-wise quantized tables"), std::string::npos)
              << gq.memory_plan();
          for (const io::Batch* b : {&big, &small}) {
            const std::vector<float> a = gr.predict(*b), c = gq.predict(*b);
            ASSERT_EQ(a.size(), c.size());
            EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0)
                << precision << ", " << b->rows << " rows";
          }
        }
      }
    }
}

// A CUDA model serving codes holds no fp32 copy of those tables (parameters() lists the others
// only) and refuses to train, with the layer named; a record of another shape is refused.
TEST(EmbeddingQuantExport, CudaModelServingCodesHasNoFp32TablesAndDoesNotTrain) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CUDA engine's tables not checked";
  const TrainedRun r = trained("dlrm", 8);
  const io::DatasetInfo data = io::DatasetInfo::load(r.data);
  auto cpu = model::build_model(r.cfg.model, r.cfg.optimizer, data.layout, Device::cpu(), 0);
  train::load_checkpoint(r.run + "/checkpoint.dlrec", *cpu);
  compress::EmbeddingQuantConfig e;
  e.on = true;
  e.bits = 8;
  std::vector<model::QuantizedTable> records;
  compress::quantize_embedding_tables(e, *cpu, &records);
  ASSERT_EQ(records.size(), 3u);
  std::vector<std::string> names;
  for (const auto& q : records) names.push_back(q.name);
  auto gpu = model::build_model(r.cfg.model, r.cfg.optimizer, data.layout, Device::cuda(), 0);
  // A record of another shape than the model's table is an error naming the table.
  {
    std::vector<model::QuantizedTable> bad{records[1]};
    bad[0].rows.rows -= 1;
    bad[0].rows.codes.resize(static_cast<size_t>(bad[0].rows.rows * bad[0].rows.row_bytes()));
    bad[0].rows.scale.pop_back();
    bad[0].rows.bias.pop_back();
    auto fresh = model::build_model(r.cfg.model, r.cfg.optimizer, data.layout, Device::cuda(), 0);
    expect_error([&] { fresh->set_quantized_tables(bad); }, {names[1], "the model's table is"});
  }
  int tables_before = 0, tables_after = 0;
  for (const auto& [name, t] : gpu->parameters())
    tables_before += std::count(names.begin(), names.end(), name);
  EXPECT_EQ(tables_before, 3);
  gpu->set_quantized_tables(std::move(records));
  for (const auto& [name, t] : gpu->parameters())
    tables_after += std::count(names.begin(), names.end(), name);
  EXPECT_EQ(tables_after, 0);
  const io::Batch b = dlrec::testing::first_valid_batch(r.data, 64);
  expect_error([&] { gpu->train_step(b, 1.0, true); },
               {"layer 'emb'", "row-wise quantized codes, which cannot train"});
}

// Rewrites weights.dlrec (checksummed: edits go through save_tensors) with one tensor edited.
template <class F>
void edit_weights(const std::string& dir, const std::string& tensor, F&& edit,
                  const json* meta_override = nullptr) {
  const std::string wf = dir + "/weights.dlrec";
  const json meta = io::read_tensor_meta(wf);
  const json mj = read_json_file(dir + "/model.json");
  const model::RunConfig cfg = model::RunConfig::from_json(mj.at("config"));
  auto m = model::build_model(cfg.model, cfg.optimizer,
                              io::ShardLayout::from_json(mj.at("layout")), Device::cpu(), 0);
  std::vector<model::NamedTensor> all;
  const auto records = compress::read_quantized_tables(meta, wf, *m);
  for (auto& p : m->parameters())
    if (std::none_of(records.begin(), records.end(),
                     [&](const model::QuantizedTable& q) { return q.name == p.first; }))
      all.push_back(p);
  for (auto& q : records)
    for (auto& t : compress::quantized_table_tensors(q.name, q.rows)) all.push_back(t);
  io::TensorLoadOptions o;
  o.allow_extra = true;
  io::load_tensors(wf, all, o);
  bool found = false;
  for (auto& [name, t] : all)
    if (name == tensor) {
      edit(t);
      found = true;
    }
  ASSERT_TRUE(found) << tensor;
  io::save_tensors(wf, all, meta_override ? *meta_override : meta);
}

TEST(EmbeddingQuantExport, BadRecordsAreClearErrors) {
  const TrainedRun r = trained("dlrm");
  const std::string q = root() + "/bad";
  auto fresh = [&] { export_quantized(r, 4, true, true, q); };
  fresh();
  train::Predictor ok(q);  // loads before the edits
  const json meta = io::read_tensor_meta(q + "/weights.dlrec");
  const std::string t0 = meta.at("embedding_quant").at(0).at("table").get<std::string>();

  // A NaN scale (fp16 bits of a NaN), an infinite bias.
  edit_weights(q, t0 + ".qscale", [](Tensor& t) { static_cast<uint16_t*>(t.raw())[2] = 0x7e00; });
  expect_error([&] { train::Predictor p(q); }, {"quantized table '" + t0 + "'", "row 2's scale"});
  fresh();
  edit_weights(q, t0 + ".qbias", [](Tensor& t) { static_cast<uint16_t*>(t.raw())[1] = 0x7c00; });
  expect_error([&] { train::Predictor p(q); }, {"row 1's bias is inf"});
  // The codes of another shape (a truncated record): named with the shapes.
  fresh();
  edit_weights(q, t0 + ".codes",
               [](Tensor& t) { t = Tensor::zeros({t.dim(0) - 1, t.dim(1)}, DType::U8); });
  expect_error([&] { train::Predictor p(q); }, {t0 + ".codes"});
  // A table the model does not have; a malformed entry; bits that are neither 8 nor 4.
  for (const auto& [entry, want] : std::vector<std::pair<json, std::string>>{
           {{{"table", "nope.weight"}, {"bits", 8}, {"scale_bias", "fp32"}},
            "quantized table 'nope.weight' is not a table"},
           {{{"table", t0}, {"bits", "8"}, {"scale_bias", "fp32"}}, "is not {\"table\""},
           {{{"table", t0}, {"bits", 3}, {"scale_bias", "fp16"}}, "bits 3 (8 or 4)"},
           {{{"table", t0}, {"bits", 4}, {"scale_bias", "bf16"}}, "scale_bias 'bf16'"}}) {
    fresh();
    json m2 = meta;
    m2["embedding_quant"][0] = entry;
    edit_weights(q, t0 + ".codes", [](Tensor&) {}, &m2);
    expect_error([&] { train::Predictor p(q); }, {want});
  }
  // An older build (one that reads format versions up to 2) refuses the export by its version:
  // this build refuses a version above its own the same way.
  fresh();
  json mj = read_json_file(q + "/model.json");
  mj["version"] = train::kModelFormatVersion + 1;
  write_file_atomic(q + "/model.json", mj.dump(2));
  expect_error([&] { train::Predictor p(q); }, {"newer than this dlrec reads"});
}
