// SpinTeam: a few threads for parallel work that lasts microseconds (the GPU engine's input
// packing at serving batch sizes), where waking pool threads through a condition variable
// costs more than the work.
//
// run(fn) calls fn(i) once for each i in [0, size()) and returns when all are done (rethrowing
// the first exception). The caller and the team's threads take the pieces i from a shared
// counter, so a piece runs on whichever member is free (the caller included: with every other
// member asleep the caller runs them all, rather than waiting for wake-ups). After a job the
// threads spin for `spin_us` microseconds waiting for the next one (a back-to-back caller finds
// them awake: a dispatch costs an atomic store), then sleep until woken. One run() at a time;
// concurrent callers are serialised.
//
// post(fn) starts such a job on the members alone and returns at once; wait() ends it (the
// caller runs the pieces no member took, waits for the others, rethrows the first error). In
// between the caller does other work (the GPU cache's bookkeeping beside the forward); fn
// must live until wait(), and the team takes no other job meanwhile (other threads' run() and
// post() wait).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dlrec {

class SpinTeam {
 public:
  // `size` >= 1 participants (size - 1 threads are started); spin_us >= 0.
  explicit SpinTeam(int size, int spin_us = 200);
  ~SpinTeam();
  SpinTeam(const SpinTeam&) = delete;
  SpinTeam& operator=(const SpinTeam&) = delete;

  int size() const { return static_cast<int>(threads_.size()) + 1; }
  void run(const std::function<void(int)>& fn);
  void post(const std::function<void(int)>& fn);
  void wait();  // after post() on the same thread; an error without one

 private:
  void loop(int index);
  void call(int index);
  uint64_t generation() const { return claim_.load(std::memory_order_acquire) >> 32; }
  int claim();  // the next piece of the current job, or -1
  void work();  // runs pieces until none is left

  const int spin_us_;
  std::mutex run_mu_;  // one run() or post()..wait() at a time
  bool posted_ = false;  // a post() not yet waited for (guarded by run_mu_, held meanwhile)
  const std::function<void(int)>* job_ = nullptr;
  // The job's generation (bumped per job; members start when it changes) << 32 | the next
  // piece to take.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> finished_{0};    // pieces of the current job done
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards sleeping_ and the wake-up
  std::condition_variable wake_;
  int sleeping_ = 0;
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

}  // namespace dlrec
