// dlrec datagen | etl
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>

#include "commands.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/launch.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "etl_ranks.h"

namespace dlrec::cli {

Runner add_datagen(CLI::App& app) {
  struct Args {
    std::string out, config, schema = "criteo", schema_out;
    int64_t rows = -1;
    int comment_lines = -1;
    int64_t seed = -1;
    int num_dense = -1, num_cat = -1, multi_hot = -1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "datagen", "Write synthetic Criteo-like click logs (TSV), or the ratings example's files");
  c->add_option("--out", a->out,
                "Output TSV file (--schema ratings: a directory, receiving ratings.csv, "
                "users.csv and items.csv)")
      ->required();
  c->add_option("--schema", a->schema,
                "criteo (default): Criteo-like click logs; mlperf_dcnv2: the same with the "
                "MLPerf DLRM-DCNv2 model's 26 multi-hot columns (its cardinalities, 40M at most, "
                "and a fixed 1-100 values per field; docs/ETL.md); ratings: a ratings log with "
                "user and item side tables (configs/ratings_*.json; docs/ETL.md, JoinExternal)")
      ->check(CLI::IsMember({"criteo", "mlperf_dcnv2", "ratings"}));
  c->add_option("--schema-out", a->schema_out,
                "criteo, mlperf_dcnv2: also write the generated file's schema JSON here (for "
                "`dlrec etl --schema`: names the multi-hot columns)");
  c->add_option("--comment-lines", a->comment_lines,
                "--schema ratings: '#' comment lines at the top of ratings.csv (default 2; "
                "configs/ratings_schema.json's \"comment\" skips them)")
      ->check(CLI::Range(0, 1000));
  c->add_option("--rows", a->rows, "Number of rows (default 1,000,000)");
  c->add_option("--seed", a->seed, "Random seed (default 42)");
  c->add_option("--config", a->config, "Generator config JSON (see docs/FORMATS.md)");
  c->add_option("--num-dense", a->num_dense, "Integer feature columns (default 13)");
  c->add_option("--num-cat", a->num_cat, "Categorical columns (default 26)");
  c->add_option("--multi-hot", a->multi_hot, "How many of the categorical columns are multi-hot");
  return [a] {
    if (a->schema == "ratings") {
      DLREC_CHECK(a->config.empty() && a->num_dense < 0 && a->num_cat < 0 &&
                      a->multi_hot < 0 && a->schema_out.empty(),
                  "datagen --schema ratings takes --rows, --seed and --comment-lines only");
      io::RatingsConfig rc;
      if (a->rows >= 0) rc.rows = a->rows;
      if (a->seed >= 0) rc.seed = static_cast<uint64_t>(a->seed);
      if (a->comment_lines >= 0) rc.comment_lines = a->comment_lines;
      Timer t;
      io::RatingsResult r = io::generate_ratings(rc, a->out);
      std::printf(
          "datagen: ratings: %lld rows, %.1f MB, rating > 3 in %.4f, signal AUC ceiling "
          "%.4f (last 10%% of rows: %.4f), %.2fs -> %s, %s, %s\n",
          static_cast<long long>(r.rows), r.bytes / 1e6, r.positive_rate, r.signal_auc,
          r.signal_auc_last_tenth, t.seconds(), r.ratings.c_str(), r.users.c_str(),
          r.items.c_str());
      return 0;
    }
    DLREC_CHECK(a->comment_lines < 0, "--comment-lines applies to --schema ratings only");
    io::DatagenConfig cfg;
    if (a->schema == "mlperf_dcnv2") {
      // The benchmark's columns are the point of the schema: only the rows and seed vary.
      DLREC_CHECK(a->config.empty() && a->num_dense < 0 && a->num_cat < 0 && a->multi_hot < 0,
                  "datagen --schema mlperf_dcnv2 takes --rows, --seed and --schema-out only "
                  "(its columns are fixed; use --config for other layouts)");
      cfg = io::DatagenConfig::mlperf_dcnv2();
    }
    if (!a->config.empty()) cfg = io::DatagenConfig::from_json(read_json_file(a->config));
    if (a->rows >= 0) cfg.rows = a->rows;
    if (a->seed >= 0) cfg.seed = static_cast<uint64_t>(a->seed);
    if (a->num_dense >= 0) cfg.num_dense = a->num_dense;
    if (a->num_cat >= 0) cfg.num_cat = a->num_cat;
    if (a->multi_hot >= 0) cfg.num_multi_hot = a->multi_hot;
    Timer t;
    io::DatagenResult r = io::generate_file(cfg, a->out);
    if (!a->schema_out.empty()) write_file_atomic(a->schema_out, cfg.schema().to_json().dump(2));
    double s = t.seconds();
    std::printf(
        "datagen: %lld rows, %.1f MB, positives %.4f, signal AUC ceiling %.4f, %.2fs "
        "(%.2fM rows/s) -> %s\n",
        static_cast<long long>(r.rows), r.bytes / 1e6, r.positive_rate, r.signal_auc, s,
        r.rows / s / 1e6, a->out.c_str());
    return 0;
  };
}

// Used when --workflow is not given; the same as configs/etl_criteo.json.
const char* kDefaultWorkflow = R"({"pipeline": [
  {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                {"op": "LogOp"}]},
  {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 15}]}]})";

io::Schema load_schema(const std::string& format, const std::string& schema_path) {
  if (!schema_path.empty()) return io::Schema::from_json(read_json_file(schema_path));
  if (format == "criteo") return io::Schema::criteo();
  fail("--format ", format, " needs --schema (a JSON file naming the columns; docs/FORMATS.md)");
}

struct EtlArgs {
  std::vector<std::string> inputs;
  std::string format = "criteo", schema, workflow, out;
  std::string on_error = "fail";
  int64_t train_rows = -1, shard_rows = 0, memory_budget_mb = 0, input_cache_mb = -1;
  std::string spill_dir, cache_form = "auto";
  bool shuffle = false, cache_huge_pages = false, no_cache_huge_pages = false;
  int64_t seed = 0;
  int ranks = 1, processes = 0;
  double valid_ratio = -1, comm_timeout = 300;
  bool overwrite = false;
};

int run_etl_command(const EtlArgs& args, dist::Communicator& comm);

Runner add_etl(CLI::App& app) {
  auto a = std::make_shared<EtlArgs>();
  CLI::App* c = app.add_subcommand("etl", "Fit a workflow on raw logs and write training shards");
  c->add_option("--input", a->inputs, "Input files (TSV/CSV), read in order")->required();
  c->add_option("--format", a->format, "criteo (TSV, no header) or csv (needs --schema)")
      ->check(CLI::IsMember({"criteo", "csv"}));
  c->add_option("--schema", a->schema, "Schema JSON (columns, delimiter, header, ...)");
  c->add_option("--workflow", a->workflow,
                "Workflow JSON (default: the Criteo workflow of configs/etl_criteo.json)");
  c->add_option("--out", a->out, "Output directory")->required();
  c->add_option("--train-rows", a->train_rows, "First N rows train, the rest validate");
  c->add_option("--valid-ratio", a->valid_ratio, "Last fraction of rows validates (default 0.1)");
  c->add_option("--shard-rows", a->shard_rows, "Rows per shard file");
  c->add_option("--on-error", a->on_error, "Malformed rows: fail (default) or skip")
      ->check(CLI::IsMember({"fail", "skip"}));
  c->add_flag("--overwrite", a->overwrite, "Replace a dataset already in --out");
  c->add_option("--memory-budget", a->memory_budget_mb,
                "Memory budget in MB for fitting vocabularies: past half of it, value counts "
                "spill to disk and are merged (exact). 0 (default): no bound")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  c->add_option("--spill-dir", a->spill_dir, "Directory for spill files (default: --out)");
  c->add_option("--input-cache", a->input_cache_mb,
                "MB of memory for the parsed input kept between the passes, so that it is "
                "parsed once (0: parse it again each pass; default: a quarter of --memory-budget, "
                "else 40% of the RAM; past it the input is read again)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 30));
  c->add_option("--cache-form", a->cache_form,
                "How the kept input is held: parsed (~1.9x the text), compact (~0.6x), auto "
                "(default: compact when it gets huge pages, under --memory-budget or when the "
                "parsed rows would not fit, else parsed)")
      ->check(CLI::IsMember({"auto", "compact", "parsed"}));
  c->add_flag("--cache-huge-pages", a->cache_huge_pages,
              "Always ask for transparent huge pages for the kept compacted input (MADV_HUGEPAGE; "
              "default: only where free 2 MB blocks already hold twice its size, so that the "
              "kernel need not compact memory)");
  c->add_flag("--no-cache-huge-pages", a->no_cache_huge_pages,
              "Never ask for huge pages for the kept input (then --cache-form auto keeps it as "
              "parsed when it fits)")
      ->excludes("--cache-huge-pages");
  c->add_flag("--shuffle", a->shuffle,
              "Shuffle the training rows within and across files (seeded permutation)");
  c->add_option("--seed", a->seed, "Seed of --shuffle (default 0)")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  c->add_option("--ranks", a->ranks,
                "Split the training rows into N equal shard sets, one per training rank "
                "(listed in ranks.json)")
      ->check(CLI::Range(1, 65536));
  c->add_option("--processes", a->processes,
                "Run the ETL as N processes (docs/ETL.md \"Several processes\"): started here "
                "through mpirun, or checked against the job's size under mpirun (where it may "
                "be left out). Each parses its part of the input; the output is the same bytes "
                "as one process's")
      ->check(CLI::Range(1, 65536));
  c->add_option("--comm-timeout", a->comm_timeout,
                "With several processes: seconds a collective may wait for the other ranks "
                "before the job ends with an error naming them")
      ->check(CLI::Range(1.0, 1e6));
  return [a]() -> int {
    dist::JobRequest job;
    job.size = a->processes;
    job.launch = a->processes > 1;
    job.command = "etl";
    job.unit = "process";
    job.option = "--processes";
    job.comm_kind = "auto";
    job.comm.timeout_seconds = a->comm_timeout;
    return dist::run_job(job, own_command_line(),
                         [a](dist::Communicator& comm) { return run_etl_command(*a, comm); });
  };
}

int run_etl_command(const EtlArgs& args, dist::Communicator& comm) {
  const EtlArgs* a = &args;
  etl::EtlOptions o;
  o.inputs = a->inputs;
  o.schema = load_schema(a->format, a->schema);
  o.workflow = a->workflow.empty() ? parse_json(kDefaultWorkflow, "the default workflow")
                                   : read_json_file(a->workflow);
  o.output_dir = a->out;
  DLREC_CHECK(a->train_rows < 0 || a->valid_ratio < 0,
              "give either --train-rows or --valid-ratio, not both");
  o.train_rows = a->train_rows;
  o.valid_ratio = a->valid_ratio >= 0 ? a->valid_ratio : (a->train_rows >= 0 ? 0.0 : 0.1);
  if (a->shard_rows > 0) o.shard_rows = a->shard_rows;
  o.read.on_error = io::parse_on_error(a->on_error);
  o.overwrite = a->overwrite;
  o.memory_budget_mb = a->memory_budget_mb;
  o.spill_dir = a->spill_dir;
  o.input_cache_mb = a->input_cache_mb;
  o.input_cache_huge_pages = a->cache_huge_pages      ? etl::HugePages::On
                             : a->no_cache_huge_pages ? etl::HugePages::Off
                                                      : etl::HugePages::Auto;
  o.input_cache_form = etl::parse_cache_form(a->cache_form);
  o.shuffle = a->shuffle;
  o.seed = static_cast<uint64_t>(a->seed);
  o.ranks = a->ranks;
  std::optional<etl::EtlResult> result =
      comm.size() > 1 ? run_etl_ranks(o, comm) : std::optional(etl::run_etl(o));
  if (!result) return 0;  // a rank other than 0: its part is with rank 0
  const etl::EtlResult& r = *result;
  for (const auto& w : r.warnings) std::fprintf(stderr, "etl: warning: %s\n", w.c_str());
  std::printf(
      "etl: train=%lld valid=%lld skipped=%lld input=%.1f MB output=%.1f MB "
      "fit=%.2fs transform=%.2fs total=%.2fs (%.1f MB/s) -> %s\n",
      static_cast<long long>(r.train_rows), static_cast<long long>(r.valid_rows),
      static_cast<long long>(r.skipped_rows), r.input_bytes / 1e6, r.output_bytes / 1e6,
      r.fit_seconds, r.transform_seconds, r.total_seconds,
      r.input_bytes / 1e6 / std::max(r.total_seconds, 1e-9), a->out.c_str());
  if (r.spill_runs)
    std::printf("etl: vocabulary counts spilled: %lld runs, %.1f MB\n",
                static_cast<long long>(r.spill_runs), r.spill_bytes / 1e6);
  // The side tables held in memory (JoinExternal), as stats.json reports them.
  const json stats = read_json_file(a->out + "/stats.json");
  if (stats.contains("columns") && stats["columns"].contains("join_external"))
    for (const auto& t : stats["columns"]["join_external"])
      std::printf(
          "etl: side table %s joined on '%s': %lld rows, %zu columns, %.1f MB in "
          "memory\n",
          t.at("path").get<std::string>().c_str(), t.at("on").get<std::string>().c_str(),
          static_cast<long long>(t.at("rows").get<int64_t>()), t.at("columns").size(),
          t.at("memory_bytes").get<int64_t>() / 1e6);
  return 0;
}

}  // namespace dlrec::cli
