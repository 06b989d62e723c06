// Shared by the test programs: a synthetic dataset, generated (io::generate_file) and run through
// the ETL, as the tests that train on data need it.
#pragma once

#include <cstdint>
#include <string>

#include "dlrec/core/config.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"

namespace dlrec::testing {

// How the ETL treats the generated rows.
struct TestEtl {
  std::string workflow;     // the workflow's JSON text
  int64_t train_rows = -1;  // the first rows train, the rest validate (EtlOptions)
  int64_t shard_rows = 0;   // rows per shard file; 0: the ETL's default
  int ranks = 1;            // training rows split for this many ranks (ranks.json)
};

// Writes `gen`'s rows to `logs` and runs the ETL on them into `out_dir`.
inline void generate_and_etl(const io::DatagenConfig& gen, const std::string& logs,
                             const std::string& out_dir, const TestEtl& etl) {
  io::generate_file(gen, logs);
  etl::EtlOptions o;
  o.inputs = {logs};
  o.schema = gen.schema();
  o.workflow = parse_json(etl.workflow, "test workflow");
  o.output_dir = out_dir;
  o.train_rows = etl.train_rows;
  if (etl.shard_rows > 0) o.shard_rows = etl.shard_rows;
  o.ranks = etl.ranks;
  etl::run_etl(o);
}

}  // namespace dlrec::testing
