// A fixed pool of worker threads and parallel_for over index ranges.
//
// parallel_for splits [begin, end) into contiguous pieces of at least `grain` indices and runs
// fn(lo, hi) on them; the calling thread takes part. The first exception thrown by any piece is
// rethrown in the caller after all pieces finished. Nested calls run serially in the caller.
// Workers, and a caller waiting for its pieces, poll for up to ~50 us before they sleep on a
// condition variable: a model's layers hand out work every few microseconds, and a futex
// wake-up costs tens of microseconds (bench/RESULTS.md, "INT8 on the CPU engine").
#pragma once

#include <cstdint>
#include <functional>

namespace dlrec {

// Number of threads parallel_for uses (default: hardware concurrency; the CLI's --threads sets
// it through set_num_threads).
int num_threads();
// Sets the thread count for later parallel_for calls (n <= 0 means hardware concurrency).
void set_num_threads(int n);

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t lo, int64_t hi)>& fn);

// Runs fn(t) for t in [0, n) on n tasks concurrently (n may exceed num_threads()).
void parallel_tasks(int n, const std::function<void(int t)>& fn);

}  // namespace dlrec
