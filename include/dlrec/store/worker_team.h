// A small team of threads for the GPU cache tier's per-batch work (include/dlrec/store/
// gpu_cache.h): run(n, fn) runs fn(0..n-1) on the caller and the workers and returns when all
// are done.
//
// Why not the shared pool (core/thread_pool.h): its idle workers sleep on a condition variable
// and are woken one by one as tasks are queued, which on the GPU host measured (a virtual
// machine) looked like 100-150 us per parallel_for of 8 to 16 tasks (the phases' times on 1
// and 16 threads; bench/RESULTS.md): as long as the tasks of a batch of 2048 themselves. Here
// workers that finished a task keep watching for the next one for `spin` (under load the next
// batch comes within microseconds), and only then sleep; an idle instance burns no CPU after.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dlrec::store {

class WorkerTeam {
 public:
  // `workers` threads besides the caller (0: run() runs everything in the caller).
  WorkerTeam(int workers, std::chrono::microseconds spin);
  ~WorkerTeam();
  WorkerTeam(const WorkerTeam&) = delete;
  WorkerTeam& operator=(const WorkerTeam&) = delete;
  int workers() const { return static_cast<int>(threads_.size()); }
  // fn(i) for i in [0, n), each once, on any member; rethrows the first exception after all
  // are done. n < 65536. One run at a time (the caller holds the instance's lock).
  void run(int n, const std::function<void(int)>& fn);

 private:
  void loop();
  void work(uint64_t run);  // takes tasks of `run` until none is left
  const std::chrono::microseconds spin_;
  std::vector<std::thread> threads_;
  // The current run (high 32 bits), its task count (16 bits) and the next task to take (16
  // bits), in one word: a worker late from the last run can take nothing from this one.
  std::atomic<uint64_t> ticket_{0};
  uint64_t runs_ = 0;
  std::atomic<int> done_{0};
  const std::function<void(int)>* fn_ = nullptr;
  std::mutex mu_;  // for sleeping workers, stop_ and the first exception
  std::condition_variable cv_;
  std::atomic<int> sleeping_{0};
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace dlrec::store
