// A workflow's fit split across the processes of a job (docs/ETL.md "Several processes"):
// each process fits its own training rows into a partial state (the column statistics and
// the encoders' counts, before fit_end), the parts are added, and the fit is finished once:
// the same fitted workflow, byte for byte, as one process fitting every row.
// Exact by construction: counts and row numbers add up (the encoders' (key, count) pairs in any
// order and on any process: save_counts / add_counts, one encoder at a time); the head (row
// numbers, min/max) is added in input order (ties keep the earlier value, as the single fit
// does); the dense columns' sums are not added (floating-point addition is not associative)
// but continued: each process adds its values, in input order, to the running sums of the
// processes before it (continue_sums), so the sums are the single fit's sequence of additions.
// No communication here: the caller moves the bytes (apps/dlrec).
#pragma once

#include <string>
#include <vector>

#include "dlrec/etl/workflow.h"
#include "dlrec/io/raw_chunk.h"

namespace dlrec::etl {

class FitParts {
 public:
  // "" when the fit of `w` can be split (one pass; every fitted op an encoder whose partial
  // fit merges exactly: Categorify without a joint vocabulary; no memory budget, side tables,
  // feature ops or Filter ops), else why not, for the log.
  static std::string why_not_mergeable(const Workflow& w);
  // Starts the fit and fits `chunks` (this process's training rows, in input order).
  static void fit_part(Workflow& w, const std::vector<const io::RawChunk*>& chunks);
  // The part's head as bytes (row numbers and column statistics), and the addition of a later
  // part's head (parts in input order).
  static std::string save_head(const Workflow& w);
  static void add_head(Workflow& w, const char* data, size_t size);
  // The merged encoders (Categorify of one column each), numbered 0 .. num_counts - 1: their
  // (key, count) pairs as bytes, and the addition of another part's (any order; encoders
  // apart may be added on different threads).
  static int num_counts(const Workflow& w);
  static std::string save_counts(const Workflow& w, int j);
  static size_t counts_bytes(const Workflow& w, int j);  // save_counts(w, j).size()
  static void add_counts(Workflow& w, int j, const char* data, size_t size);
  // The running sums (one per dense column) continued over `chunks` as the single fit adds them.
  static int num_sums(const Workflow& w);
  static void continue_sums(const Workflow& w, const std::vector<const io::RawChunk*>& chunks,
                            std::vector<double>& sums);
  // Sets the sums and finishes the fit (the encoders' fit_end): `w` is fitted.
  static void finish(Workflow& w, const std::vector<double>& sums);
};

}  // namespace dlrec::etl
