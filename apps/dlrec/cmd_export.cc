// dlrec export | predict
#include <cstdio>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "dlrec/core/file_util.h"
#include "dlrec/train/export.h"

namespace dlrec::cli {

Runner add_export(CLI::App& app) {
  struct Args {
    std::string run, out;
    bool overwrite = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("export", "Write a self-contained model directory from a run");
  c->add_option("--run", a->run, "Run directory written by dlrec train")->required();
  c->add_option("--out", a->out, "Model directory to create")->required();
  c->add_flag("--overwrite", a->overwrite, "Replace an existing model directory");
  return [a] {
    train::export_model(a->run, a->out, a->overwrite);
    std::printf("exported %s -> %s\n", a->run.c_str(), a->out.c_str());
    return 0;
  };
}

Runner add_predict(CLI::App& app) {
  struct Args {
    std::string model, input = "-", output;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "predict", "Score raw log rows (as in the training logs) with an exported model");
  c->add_option("--model", a->model, "Model directory written by dlrec export")->required();
  c->add_option("--input", a->input, "Raw rows file, or - for standard input (default)");
  c->add_option("--output", a->output, "Write probabilities here (default: standard output)");
  return [a] {
    train::Predictor predictor(a->model);
    std::vector<std::string> lines;
    std::string line;
    if (a->input == "-") {
      while (std::getline(std::cin, line)) lines.push_back(line);
    } else {
      std::ifstream in(a->input);
      DLREC_CHECK(in, "cannot open '", a->input, "'");
      while (std::getline(in, line)) lines.push_back(line);
    }
    std::vector<float> p =
        predictor.predict_lines(lines, a->input == "-" ? "<stdin>" : a->input);
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
    return 0;
  };
}

}  // namespace dlrec::cli
