// The dlrec CLI: each subcommand registers its options on the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace dlrec::cli {

// Adds the subcommand to `app` and returns the function that runs it once parsed.
using Runner = std::function<int()>;
Runner add_datagen(CLI::App& app);
Runner add_etl(CLI::App& app);
Runner add_train(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_compress(CLI::App& app);  // cmd_compress.cc
Runner add_predict(CLI::App& app);
Runner add_push(CLI::App& app);     // cmd_push.cc (online updates)
Runner add_demo(CLI::App& app);
Runner add_parquet(CLI::App& app);  // parquet dump | write (inspection, interop tests)
Runner add_serve(CLI::App& app);  // built with DLREC_WITH_SERVER
Runner add_bench(CLI::App& app);  // bench train, and bench serve with DLREC_WITH_SERVER
Runner add_bench_serve(CLI::App* bench);  // built with DLREC_WITH_SERVER
Runner add_bench_etl(CLI::App* bench);    // cmd_bench_etl.cc
Runner add_bench_infer(CLI::App* bench);  // cmd_bench_infer.cc
// This process's command line, to start the same command as each rank of a job (cmd_train.cc).
std::vector<std::string> own_command_line();

}  // namespace dlrec::cli
