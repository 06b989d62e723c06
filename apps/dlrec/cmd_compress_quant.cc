// dlrec compress --quantize: INT8 post-training quantization of a trained run
// (docs/COMPRESSION.md): calibration on training shards, the per-layer error, the model's
// AUC/logloss fp32 vs INT8 on the validation split, and an export that serves INT8.
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cmd_compress.h"
#include "dlrec/compress/quantize.h"
#include "dlrec/compress/sparsity.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"

namespace dlrec::cli {

namespace {

std::vector<std::string> comma_list(const std::string& s, const char* what) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string name;
  while (std::getline(in, name, ','))
    if (name.empty())
      fail("dlrec compress ", what, ": an empty name in '", s, "'");
    else
      out.push_back(name);
  if (!s.empty() && s.back() == ',') fail("dlrec compress ", what, ": an empty name in '", s, "'");
  return out;
}

std::string layout_str(const io::ShardLayout& l) {
  return std::to_string(l.num_dense) + " dense, " + std::to_string(l.cardinalities.size()) +
         " categorical features, cardinalities " + json(l.cardinalities).dump();
}

std::vector<std::string> under(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> r;
  for (const auto& n : names) r.push_back(dir + "/" + n);
  return r;
}

json eval_json(const train::EvalResult& e) {
  return {{"rows", e.rows}, {"auc", e.auc}, {"logloss", e.logloss}};
}

}  // namespace

int run_compress_quantize(const QuantizeArgs& a) {
  namespace fs = std::filesystem;
  const CompressSource src = open_compress_source(a.run, a.out);
  const train::RunInfo& info = src.info;
  const std::string& data_dir = src.data_dir;
  const std::string& ckpt = src.ckpt;
  if (fs::exists(a.out) && !a.overwrite)
    fail("'", a.out, "' already exists (use --overwrite to replace it)");

  // The config's compress.quantize (if any), then the command line's choices.
  model::RunConfig cfg = info.config;
  compress::CompressConfig cc = compress::CompressConfig::from_json(cfg.compress);
  compress::QuantizeConfig& q = cc.quantize;
  q.on = true;
  if (!a.layers.empty()) {
    q.all_dense = false;
    q.layers = comma_list(a.layers, "--layers");
  }
  if (!a.skip.empty()) q.skip = comma_list(a.skip, "--skip");
  if (!a.calibration.empty()) q.calibration = a.calibration;
  if (a.percentile >= 0) q.percentile = a.percentile;
  if (a.calib_batches >= 0) q.batches = a.calib_batches;
  if (a.calib_batch_size >= 0) q.batch_size = a.calib_batch_size;
  q.validate("dlrec compress (compress.quantize)");
  q.on = a.int8_layers;
  // Row-wise embedding tables: the config's compress.embeddings, then the flags.
  compress::EmbeddingQuantConfig& e = cc.embeddings;
  if (!a.embeddings.empty()) {
    json ej = e.on ? e.to_json() : json::object();
    ej["dtype"] = a.embeddings;
    if (!a.embedding_tables.empty())
      ej["tables"] = comma_list(a.embedding_tables, "--embedding-tables");
    if (!a.embedding_scale.empty()) ej["scale_bias"] = a.embedding_scale;
    ConfigReader er(ej, "dlrec compress --embeddings");
    e = compress::EmbeddingQuantConfig::from_json(er);
  }
  cc.qat = compress::QatConfig();  // an export: no training follows
  cc.distill = compress::DistillConfig();
  cc.sparsity.schedule.on = false;  // an export: no training follows
  cfg.compress = cc.to_json();
  compress::CompressConfig::from_json(cfg.compress);  // the section it writes reads back

  const io::DatasetInfo data = io::DatasetInfo::load(data_dir);
  const std::string calib_dir = a.calib_data.empty() ? data_dir : a.calib_data;
  const io::DatasetInfo calib = io::DatasetInfo::load(calib_dir);
  if (!(calib.layout == data.layout))
    fail("calibration data '", calib_dir, "' has the layout (", layout_str(calib.layout),
         "), but the model was trained on '", data_dir, "' (", layout_str(data.layout),
         "): calibrate on data of the model's layout");
  DLREC_CHECK(!calib.train_shards.empty(), "calibration data '", calib_dir,
              "' lists no training shards");

  auto model = model::build_model(cfg.model, cfg.optimizer, data.layout, Device::cpu(), 0);
  const train::CheckpointState st = train::load_checkpoint(ckpt, *model);
  train::check_checkpoint_layout(ckpt, st, data.layout, data_dir);

  std::vector<io::Batch> batches;
  if (q.on) {
    io::ShardLoader loader(under(calib_dir, calib.train_shards), q.batch_size);
    DLREC_CHECK(loader.layout() == data.layout, "calibration shards of '", calib_dir,
                "' do not have the model's layout (", layout_str(data.layout), ")");
    io::Batch b;
    while (static_cast<int64_t>(batches.size()) < q.batches && loader.next(b))
      batches.push_back(std::move(b));
  }
  DLREC_CHECK(!q.on || !batches.empty(), "calibration data '", calib_dir, "' holds no rows");

  const bool have_valid = !data.valid_shards.empty() && data.valid_rows > 0;
  const auto valid = under(data_dir, data.valid_shards);
  train::EvalResult fp32;
  if (have_valid) fp32 = train::evaluate_shards(*model, valid, 16384);
  std::vector<compress::LayerQuant> layers;
  if (q.on) layers = compress::calibrate_and_quantize(q, *model, batches);
  std::vector<compress::TableQuantReport> tables;
  if (e.on) {  // the tables then served (evaluated and exported) from their codes
    std::vector<model::QuantizedTable> records;
    tables = compress::quantize_embedding_tables(e, *model, &records);
    model->set_quantized_tables(std::move(records));
  }
  train::EvalResult int8;
  if (have_valid) int8 = train::evaluate_shards(*model, valid, 16384);

  etl::Workflow wf = etl::Workflow::load(data_dir + "/workflow.json");
  train::export_loaded_model(*model, cfg, data.layout, st.step, wf, a.out, a.overwrite);

  json report = {{"calibration", q.to_json()},
                 {"calibration_rows",
                  [&] {
                    int64_t n = 0;
                    for (const auto& b : batches) n += b.rows;
                    return n;
                  }()},
                 {"run", fs::absolute(a.run).lexically_normal().string()},
                 {"layers", json::array()}};
  std::printf("%-10s %-18s %6s %10s %10s %10s %10s\n", "layer", "weight", "int8", "max|x|", "clip",
              "out_relL2", "w_relL2");
  for (const auto& l : layers) {
    report["layers"].push_back({{"layer", l.layer},
                                {"weight", l.weight},
                                {"int8", !l.skipped},
                                {"input_amax", l.amax},
                                {"input_clip", l.threshold},
                                {"input_scale", l.x_scale},
                                {"output_rel_l2", l.output_rel_l2},
                                {"weight_rel_l2", l.weight_rel_l2},
                                {"zero_weights", l.zeros}});
    if (l.skipped)
      std::printf("%-10s %-18s %6s  (opted out: fp32)\n", l.layer.c_str(), l.weight.c_str(), "no");
    else
      std::printf("%-10s %-18s %6s %10.4g %10.4g %10.3e %10.3e\n", l.layer.c_str(),
                  l.weight.c_str(), "yes", l.amax, l.threshold, l.output_rel_l2, l.weight_rel_l2);
  }
  report["embeddings"] = json::array();
  for (const auto& t : tables) {
    report["embeddings"].push_back({{"table", t.table},
                                    {"rows", t.rows},
                                    {"dim", t.dim},
                                    {"max_abs_err", t.max_abs_err},
                                    {"rel_l2", t.rel_l2},
                                    {"fp32_bytes", t.fp32_bytes},
                                    {"quantized_bytes", t.quant_bytes}});
    std::printf(
        "table %-12s %8lld x %-4lld %s rows: max|err| %.3e relL2 %.3e (%lld -> %lld bytes)\n",
        t.table.c_str(), static_cast<long long>(t.rows), static_cast<long long>(t.dim),
        e.bits == 4 ? "int4" : "int8", t.max_abs_err, t.rel_l2,
        static_cast<long long>(t.fp32_bytes), static_cast<long long>(t.quant_bytes));
  }
  if (have_valid) {
    report["validation"] = {{"fp32", eval_json(fp32)},
                            {"int8", eval_json(int8)},
                            {"auc_delta", int8.auc - fp32.auc},
                            {"logloss_delta", int8.logloss - fp32.logloss}};
    std::printf(
        "validation (%lld rows): fp32 AUC %.6f logloss %.6f | %s AUC %.6f logloss %.6f "
        "| dAUC %+.6f\n",
        static_cast<long long>(fp32.rows), fp32.auc, fp32.logloss,
        q.on ? "int8" : "quantized-tables", int8.auc, int8.logloss, int8.auc - fp32.auc);
  } else {
    report["validation"] = nullptr;
    std::printf("no validation split in '%s': model AUC not measured\n", data_dir.c_str());
  }
  write_file_atomic(a.out + "/quant_report.json", report.dump(2));
  std::printf("wrote INT8 model %s (calibration %s on %zu batches; report %s/quant_report.json)\n",
              a.out.c_str(),
              q.calibration == "percentile" ? ("percentile " + json(q.percentile).dump()).c_str()
                                            : q.calibration.c_str(),
              batches.size(), a.out.c_str());
  return 0;
}

}  // namespace dlrec::cli
