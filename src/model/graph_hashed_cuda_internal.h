// Internal to graph_hashed_cuda.cu and graph_hashed_state_cuda.cu: the device state's layout
// (control words per table, global words, sentinels) that the step's kernels and the state's
// export and import share.
#pragma once

#include <cstdint>
#include <limits>

namespace dlrec::model::hashed_cuda::state_layout {

constexpr int64_t kEmpty = -1;  // index position never used
constexpr int64_t kTomb = -2;   // index position of an evicted key
constexpr int64_t kFree = std::numeric_limits<int64_t>::max();  // stamp of a free row
constexpr int kThreads = 256;

// Per-table control words (int64), ctl[t * kNF + field].
enum Field {
  kSize,      // rows in use
  kTop,       // free rows on the stack
  kUsed,      // index positions not empty (live keys and tombstones)
  kLookups,
  kHits,
  kInserts,
  kEvictions,
  kM,         // this step: distinct keys that missed
  kK,         // this step: rows to evict
  kMBase,     // this step: misses before the table's first position (exclusive scan)
  kKRem,      // radix select: rank still to find within the current prefix
  kPrefix,    // radix select: the stamp digits chosen so far
  kRebuild,   // this step: rebuild the index
  kPush,      // this step: evicted rows pushed so far
  kNF
};
// Global words: the stamp sequence, "some table evicts", "some table rebuilds".
enum Glob { kSeq, kAnyEvict, kAnyRebuild, kNG };

}  // namespace dlrec::model::hashed_cuda::state_layout
