// `dlrec etl` as one rank of a job of several processes (etl_ranks.cc, docs/ETL.md "Several
// processes").
#pragma once

#include <optional>

#include "dlrec/dist/communicator.h"
#include "dlrec/etl/run.h"

namespace dlrec::cli {

// Runs this rank's share of the job; returns the result on rank 0, nothing on the others.
std::optional<etl::EtlResult> run_etl_ranks(etl::EtlOptions o, dist::Communicator& comm);

}  // namespace dlrec::cli
