// How run_etl writes its output directory so that a killed run never loses a dataset
// (docs/ETL.md "Crashes and --overwrite"). Internal to src/etl.
#pragma once

#include <string>

#include "dlrec/etl/run.h"

namespace dlrec::etl {

// Where a run writes, decided before any work:
//  - the output directory does not exist: a staging directory beside it
//    ("<out>.tmp.<pid>"), renamed into place once complete;
//  - it holds a dataset (dataset.json) and overwrite is set: a staging directory too, swapped
//    with the old dataset in one step once complete (replace_dir), so that the old dataset
//    stays whole until the new one is; the directory must hold nothing but dataset files
//    (they all go with the old dataset);
//  - it exists without a dataset: in place, as there is nothing to keep (a killed run leaves
//    files but no dataset.json, which is written last).
// Leftovers of killed runs are removed first: "<out>.tmp.<pid>" / "<out>.old.<pid>" beside it
// (recover_dir; an old dataset whose replacement was killed between its renames comes back),
// and our temporaries inside it and in the spill directory, when their pid is dead.
class EtlOutput {
 public:
  explicit EtlOutput(const EtlOptions& o);
  ~EtlOutput();  // without commit(): removes the staging directory
  EtlOutput(const EtlOutput&) = delete;
  EtlOutput& operator=(const EtlOutput&) = delete;

  // The directory to write the files into.
  const std::string& dir() const { return write_dir_; }
  // Puts a staged dataset in place (the last step of a run).
  void commit();

 private:
  std::string final_dir_, write_dir_;
  bool staged_ = false, committed_ = false;
};

// Removes our temporaries of dead processes in `dir`: "<file>.tmp.<pid>" (AtomicFile),
// ".dlrec-spill-<pid>-..." (Categorify's spilled runs) and ".shuffle-<pid>-..." (RankWriter's
// buckets). Returns the paths removed.
std::vector<std::string> remove_stale_etl_temporaries(const std::string& dir);

}  // namespace dlrec::etl
