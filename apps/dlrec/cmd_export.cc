// dlrec export | predict
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <iostream>

#include "commands.h"
#include "dlrec/core/file_util.h"
#include "dlrec/train/export.h"
#include "dlrec/train/onnx_export.h"

namespace dlrec::cli {

Runner add_export(CLI::App& app) {
  struct Args {
    std::string run, out, init_config, data;
    bool overwrite = false, onnx = false, onnx_external = false;
    uint64_t seed = 1234;
    std::vector<std::string> tiers;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("export", "Write a self-contained model directory from a run");
  c->add_option("--run", a->run, "Run directory written by dlrec train");
  c->add_option("--init", a->init_config,
                "Instead of a run: an untrained model of this run config (needs --data)");
  c->add_option("--data", a->data, "With --init: the ETL output giving layout and workflow");
  c->add_option("--seed", a->seed, "With --init: parameter seed (default 1234)");
  c->add_option("--out", a->out, "Model directory to create")->required();
  c->add_flag("--overwrite", a->overwrite, "Replace an existing model directory");
  c->add_flag("--onnx", a->onnx,
              "Also write model.onnx (the model as ONNX, opset 17; docs/EXPORT.md); weights over "
              "1 GiB go to model.onnx.data beside it");
  c->add_flag("--onnx-external-data", a->onnx_external,
              "Like --onnx, with all large weights in model.onnx.data (ONNX external data)");
  c->add_option("--tiers", a->tiers,
                 "Write the fixed embedding tables into a tier instead of weights.dlrec: "
                 "rocksdb=DIR (docs/EXPORT.md, \"Tables in RocksDB\")");
  return [a] {
    train::TierExport tiers;
    for (const std::string& t : a->tiers) tiers.add(t);
    const train::OnnxExport onnx = a->onnx_external ? train::OnnxExport::ExternalData
                                   : a->onnx        ? train::OnnxExport::Auto
                                                    : train::OnnxExport::None;
    DLREC_CHECK(a->run.empty() != a->init_config.empty(),
                "dlrec export: give either --run (a trained run) or --init CONFIG --data DIR");
    if (!a->init_config.empty()) {
      DLREC_CHECK(!a->data.empty(), "dlrec export --init needs --data (an ETL output)");
      train::export_initialized(a->init_config, a->data, a->out, a->seed, a->overwrite, onnx,
                                tiers);
      std::printf("exported an untrained %s -> %s\n", a->init_config.c_str(), a->out.c_str());
      return 0;
    }
    train::export_model(a->run, a->out, a->overwrite, onnx, tiers);
    std::printf("exported %s -> %s\n", a->run.c_str(), a->out.c_str());
    return 0;
  };
}

Runner add_predict(CLI::App& app) {
  struct Args {
    std::string model, input = "-", output, onnx_inputs, store, device = "cpu";
    bool plan = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "predict", "Score raw log rows (as in the training logs) with an exported model");
  c->add_option("--model", a->model, "Model directory written by dlrec export")->required();
  c->add_option("--input", a->input, "Raw rows file, or - for standard input (default)");
  c->add_option("--output", a->output, "Write probabilities here (default: standard output)");
  c->add_option("--onnx-inputs", a->onnx_inputs,
                "Also write the rows encoded as the inputs of the model's model.onnx (JSON "
                "object of input name -> nested lists; docs/EXPORT.md)");
  c->add_option("--store", a->store,
                 "Look the embedding tables up through the tiered store of this JSON file (its "
                 "\"embedding_store\" object; docs/SERVING.md, \"Tiered embedding store\")");
  c->add_flag("--plan", a->plan,
              "Print the memory each tier and the model will use, and exit (a dry run)");
  c->add_option("--device", a->device,
                "cpu (default) or cuda[:N]: the CUDA engine; with --store, its tables through "
                "the GPU cache tier (docs/SERVING.md, \"GPU cache tier\")");
  return [a] {
    std::optional<store::StoreConfig> store;
    if (!a->store.empty()) {
      const json j = read_json_file(a->store);
      DLREC_CHECK(j.is_object() && j.contains("embedding_store"), a->store,
                  ": expected an object with \"embedding_store\"");
      const std::string base = std::filesystem::path(a->store).parent_path().string();
      store = store::StoreConfig::from_json(j.at("embedding_store"), base.empty() ? "." : base,
                                            a->store + ": embedding_store");
    }
    train::Predictor predictor(a->model, Device::parse(a->device), "fp32",
                               store ? &*store : nullptr);
    if (a->plan) {
      std::fputs(predictor.memory_plan().c_str(), stdout);
      return 0;
    }
    std::vector<std::string> lines;
    std::string line;
    if (a->input == "-") {
      while (std::getline(std::cin, line)) lines.push_back(line);
    } else {
      std::ifstream in(a->input);
      DLREC_CHECK(in, "cannot open '", a->input, "'");
      while (std::getline(in, line)) lines.push_back(line);
    }
    const std::string source = a->input == "-" ? "<stdin>" : a->input;
    std::vector<float> p = predictor.predict_lines(lines, source);
    if (!a->onnx_inputs.empty()) {
      const io::Batch batch = train::encode_lines(predictor.workflow(), lines, source);
      write_file_atomic(a->onnx_inputs,
                        train::onnx_inputs_json(batch, predictor.workflow().output_layout()).dump());
    }
    std::string text;
    char buf[32];
    for (float v : p) {
      std::snprintf(buf, sizeof buf, "%.9g\n", v);
      text += buf;
    }
    if (a->output.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      write_file_atomic(a->output, text);
    }
    if (predictor.store()) std::fputs(predictor.store()->stats_text().c_str(), stderr);
    return 0;
  };
}

}  // namespace dlrec::cli
