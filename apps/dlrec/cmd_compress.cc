// dlrec compress: one-shot 2:4 magnitude pruning of a trained run (docs/COMPRESSION.md).
#include "cmd_compress.h"

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "dlrec/compress/sparsity.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "dlrec/train/trainer.h"

namespace dlrec::cli {

namespace {

struct CompressArgs {
  std::string run, out, sparsity = "2:4", layers;
  bool skip_incompatible = false, overwrite = false;
  bool quantize = false;
  QuantizeArgs quant;  // with --quantize
};

// "a,b,c" -> {"a", "b", "c"}; empty entries are errors.
std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = s.find(',', at);
    const std::string name = s.substr(at, comma == std::string::npos ? comma : comma - at);
    if (name.empty()) fail("dlrec compress --layers: an empty layer name in '", s, "'");
    out.push_back(name);
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

int run_compress(const CompressArgs& a) {
  namespace fs = std::filesystem;
  DLREC_CHECK(a.sparsity == "2:4", "dlrec compress --sparsity: only \"2:4\" exists, got '",
              a.sparsity, "'");
  const CompressSource src = open_compress_source(a.run, a.out);
  const train::RunInfo& info = src.info;
  const std::string& data_dir = src.data_dir;
  const std::string& ckpt = src.ckpt;
  const std::string out_ckpt = a.out + "/checkpoint.dlrec";
  if (file_exists(out_ckpt) && !a.overwrite)
    fail("'", out_ckpt, "' already exists (use --overwrite to replace it)");

  model::RunConfig cfg = info.config;
  compress::SparsityConfig sp;
  sp.on = true;
  sp.skip_incompatible = a.skip_incompatible;
  if (!a.layers.empty()) {
    sp.all_dense = false;
    sp.layers = split_names(a.layers);
  }
  compress::CompressConfig cc = compress::CompressConfig::from_json(cfg.compress);
  cc.sparsity = sp;  // fixed masks from now on: no schedule
  cfg.compress = cc.to_json();
  compress::CompressConfig::from_json(cfg.compress);  // the section it writes reads back

  const io::DatasetInfo data = io::DatasetInfo::load(data_dir);
  // Pruning runs on the CPU engine whatever device the run trained on.
  auto model = model::build_model(cfg.model, cfg.optimizer, data.layout, Device::cpu(), 0);
  const train::CheckpointState st = train::load_checkpoint(ckpt, *model);
  train::check_checkpoint_layout(ckpt, st, data.layout, data_dir);
  compress::Pruner pruner(cc.sparsity, *model);
  const std::vector<compress::PruneReport> report = pruner.prune(0.5);

  make_dirs(a.out);
  train::save_checkpoint(out_ckpt, *model, cfg, data.layout, st);
  write_file_atomic(a.out + "/config.json", cfg.to_json().dump(2));
  const std::string data_abs = fs::absolute(data_dir).lexically_normal().string();
  write_file_atomic(a.out + "/run.json",
                    json{{"config", cfg.to_json()},
                         {"data_dir", data_abs},
                         {"compressed_from", fs::absolute(a.run).lexically_normal().string()}}
                        .dump(2));

  std::printf("%-12s %-22s %10s %10s %8s\n", "layer", "weight", "weights", "zeroed", "share");
  int64_t zeros = 0, total = 0;
  for (const auto& r : pruner.skipped())
    std::printf("%-12s %-22s %10lld %10s %8s  skipped: %s\n", r.layer.c_str(), r.weight.c_str(),
                static_cast<long long>(r.numel), "-", "-", r.skipped.c_str());
  for (const auto& r : report) {
    std::printf("%-12s %-22s %10lld %10lld %7.2f%%\n", r.layer.c_str(), r.weight.c_str(),
                static_cast<long long>(r.numel), static_cast<long long>(r.zeroed),
                r.numel ? 100.0 * r.zeroed / r.numel : 0.0);
    zeros += r.zeroed;
    total += r.numel;
  }
  std::printf(
      "2:4 pruned %lld of %lld weights in %zu tensors; wrote %s (fine-tune: dlrec train "
      "--config %s/config.json --data %s --run %s --resume --max-steps N)\n",
      static_cast<long long>(zeros), static_cast<long long>(total), report.size(), out_ckpt.c_str(),
      a.out.c_str(), data_dir.c_str(), a.out.c_str());
  return 0;
}

}  // namespace

CompressSource open_compress_source(const std::string& run, const std::string& out) {
  namespace fs = std::filesystem;
  CompressSource s;
  s.info = train::load_run_info(run);
  s.data_dir = train::run_data_dir(run, s.info.run);
  s.ckpt = run + "/checkpoint.dlrec";
  DLREC_CHECK(file_exists(s.ckpt), "no checkpoint at '", s.ckpt, "' (train first)");
  DLREC_CHECK(fs::absolute(out).lexically_normal() != fs::absolute(run).lexically_normal(),
              "dlrec compress: --out must differ from --run (the trained run is kept)");
  return s;
}

Runner add_compress(CLI::App& app) {
  auto a = std::make_shared<CompressArgs>();
  CLI::App* c = app.add_subcommand(
      "compress",
      "Prune a trained run to 2:4 sparsity by magnitude, or (--quantize) export it as INT8 "
      "(docs/COMPRESSION.md)");
  c->add_option("--run", a->run, "Run directory written by dlrec train")->required();
  c->add_option("--out", a->out, "Run directory to write (checkpoint, config.json, run.json)")
      ->required();
  CLI::Option* sparsity =
      c->add_option("--sparsity", a->sparsity,
                    "Sparsity pattern (only \"2:4\"); prunes, so not with --quantize or "
                    "--embeddings (prune, fine-tune, then quantize the pruned run)");
  c->add_option("--layers", a->layers,
                "Comma-separated mlp/cross layer names to prune (default: all of them)");
  c->add_flag("--skip-incompatible", a->skip_incompatible,
              "Keep weights whose input size is not a multiple of 4 dense instead of failing");
  c->add_flag("--overwrite", a->overwrite, "Replace the checkpoint (or INT8 model) in --out");
  QuantizeArgs& q = a->quant;
  c->add_flag("--quantize", a->quantize,
              "INT8 post-training quantization: calibrate, report, and export to --out "
              "(a model directory) instead of pruning");
  c->add_option("--calibration", q.calibration,
                "--quantize: max | percentile | entropy (default: the config's, else entropy)");
  c->add_option("--percentile", q.percentile,
                "--quantize with percentile calibration: in (50, 100), e.g. 99.99");
  c->add_option("--calib-batches", q.calib_batches, "--quantize: calibration batches (16)");
  c->add_option("--calib-batch-size", q.calib_batch_size, "--quantize: rows per batch (4096)");
  c->add_option("--calib-data", q.calib_data,
                "--quantize: dataset directory to calibrate on (default: the run's)");
  c->add_option("--skip", q.skip,
                "--quantize: comma-separated layers or weights (\"top.2\") kept fp32");
  c->add_option("--embeddings", q.embeddings,
                "Row-wise quantized embedding tables: int8 | int4 (with or without --quantize)");
  c->add_option("--embedding-tables", q.embedding_tables,
                "--embeddings: comma-separated tables (\"emb.0\"; default: all)");
  c->add_option("--embedding-scale", q.embedding_scale,
                "--embeddings: fp32 | fp16 per-row scale and bias (default fp32)");
  return [a, sparsity] {
    // Pruning writes a run to fine-tune; --quantize and --embeddings write an export. One
    // command does one of them: a one-shot prune feeding the calibration unfine-tuned would lose
    // the accuracy fine-tuning wins back (docs/COMPRESSION.md).
    if (a->quantize || !a->quant.embeddings.empty())
      DLREC_CHECK(sparsity->count() == 0 && !a->skip_incompatible,
                  "dlrec compress: ", sparsity->count() ? "--sparsity" : "--skip-incompatible",
                  " prunes a run, ", a->quantize ? "--quantize" : "--embeddings",
                  " exports one: prune first (dlrec compress --run RUN --out PRUNED --sparsity "
                  "2:4), fine-tune PRUNED (dlrec train --resume), then dlrec compress --run PRUNED "
                  "--out MODEL ",
                  a->quantize ? "--quantize" : "--embeddings ...", " (its 2:4 masks are kept)");
    if (!a->quantize && a->quant.embeddings.empty()) {
      DLREC_CHECK(a->quant.embedding_tables.empty() && a->quant.embedding_scale.empty(),
                  "dlrec compress: --embedding-tables and --embedding-scale need --embeddings");
      DLREC_CHECK(a->quant.calibration.empty() && a->quant.percentile < 0 &&
                      a->quant.calib_batches < 0 && a->quant.calib_batch_size < 0 &&
                      a->quant.calib_data.empty() && a->quant.skip.empty(),
                  "dlrec compress: calibration options need --quantize");
      return run_compress(*a);
    }
    a->quant.run = a->run;
    a->quant.out = a->out;
    a->quant.layers = a->layers;
    a->quant.overwrite = a->overwrite;
    a->quant.int8_layers = a->quantize;
    if (!a->quantize)
      DLREC_CHECK(a->quant.calibration.empty() && a->quant.percentile < 0 &&
                      a->quant.calib_batches < 0 && a->quant.calib_batch_size < 0 &&
                      a->quant.calib_data.empty() && a->quant.skip.empty() && a->layers.empty(),
                  "dlrec compress: calibration options need --quantize");
    return run_compress_quantize(a->quant);
  };
}

}  // namespace dlrec::cli
