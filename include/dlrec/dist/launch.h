// Running a CLI command as a job of several processes (docs/DISTRIBUTED.md): started here
// through the MPI launcher, or, in a rank of the launched job, run with a communicator over the
// job's ranks, the whole job ending when one rank fails (src/dist/launch.cc).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dlrec/dist/communicator.h"
#include "dlrec/dist/topology.h"

namespace dlrec::dist {

// What a command asks of its job: `dlrec etl --processes N`, `dlrec train --ranks N`.
struct JobRequest {
  // Processes asked for (0: the job's size as launched, unchecked).
  int size = 0;
  // Start the job here (through launch_local_job) unless this process already is a rank of one.
  bool launch = false;
  std::string command;       // in messages: "etl", "training"
  std::string unit;          // "process" or "rank" (plural: + "es" / "s")
  std::string option;        // the option that asked for the size: "--processes"
  std::string comm_kind;     // make_communicator's kind: "auto", "mpi", "single"
  CommOptions comm;          // its options (the collectives' timeout)
  ExchangeOptions exchange;  // its nodes and all-to-all routing (--ranks-per-node, --all-to-all)
};

// Runs a command as the job `request` describes. With `launch` and no MPI launcher above this
// process: starts `argv` (this command line) as a job of `size` processes, waits for it, and
// returns its exit status (a failed job's is also reported on stderr). Otherwise: makes the
// communicator, checks its size against `size` (an error naming the option), prints the job's
// nodes (rank 0, stderr), runs
// `body(comm)`, finalizes MPI and returns body's status. An exception thrown in a job of
// several ranks ends every rank (abort_job: the others may wait in a collective for this one);
// in a single process it propagates.
int run_job(const JobRequest& request, const std::vector<std::string>& argv,
            const std::function<int(Communicator&)>& body);

}  // namespace dlrec::dist
