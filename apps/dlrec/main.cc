// dlrec: ETL, training, evaluation, export and prediction for deep-learning recommenders.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>

#include "commands.h"
#include "dlrec/core/error.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/linear.h"

int main(int argc, char** argv) {
  // OpenBLAS, loaded at the first GEMM, is to start no worker pool (dlrec/nn/linear.h).
  dlrec::nn::prepare_single_threaded_blas();
  // The open-file limit raised to what the system allows (as far as 2^20): the ETL's spill
  // merges and the server's connections need descriptors, and the default soft limit (1024)
  // is often far below the hard one.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, rlim_t{1} << 20);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  CLI::App app{"dlrec: deep-learning recommender pipeline (ETL, training, export, prediction)"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads (default: all cores)");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress lines on stderr (errors and results still print)");
  // The global options may also follow the subcommand's own (dlrec train ... --quiet).
  app.fallthrough();
  std::vector<std::pair<CLI::App*, dlrec::cli::Runner>> commands;
  auto add = [&](dlrec::cli::Runner (*f)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    dlrec::cli::Runner r = f(app);
    commands.emplace_back(app.get_subcommands({}).at(before), std::move(r));
  };
  add(dlrec::cli::add_datagen);
  add(dlrec::cli::add_etl);
  add(dlrec::cli::add_train);
  add(dlrec::cli::add_eval);
  add(dlrec::cli::add_export);
  add(dlrec::cli::add_compress);
  add(dlrec::cli::add_predict);
  add(dlrec::cli::add_push);
  add(dlrec::cli::add_demo);
  add(dlrec::cli::add_parquet);
  add(dlrec::cli::add_bench);
#ifdef DLREC_WITH_SERVER
  add(dlrec::cli::add_serve);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    dlrec::set_num_threads(threads);
    dlrec::set_progress_quiet(quiet);
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
  } catch (const dlrec::Error& e) {
    std::fprintf(stderr, "dlrec: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dlrec: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlrec: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
