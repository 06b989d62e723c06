#include "dlrec/core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dlrec {
namespace {

// All hardware threads; programs choose otherwise through set_num_threads (the CLI's
// --threads).
int default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

std::atomic<int> g_threads{0};
thread_local bool t_in_parallel = false;

// Polls `ready` for up to ~50 us (a worker between a model's layers, a caller waiting for its
// pieces), then gives up so that the caller sleeps on its condition variable.
template <class F>
void spin_until(F ready) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  for (int i = 0; !ready(); ++i)
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return;
}

// Workers pull closures from a queue; the pool grows on demand and never shrinks.
class Pool {
 public:
  static Pool& get() {
    static Pool p;
    return p;
  }
  void ensure(size_t n) {
    std::lock_guard<std::mutex> g(mu_);
    while (workers_.size() < n) workers_.emplace_back([this] { loop(); });
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(std::move(f));
      queued_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_one();
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

 private:
  void loop() {
    t_in_parallel = true;
    for (;;) {
      // A model's layers hand out work every few microseconds: wait briefly awake before
      // sleeping, so that the next task does not pay a futex wake-up.
      spin_until([&] { return queued_.load(std::memory_order_acquire) > 0; });
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (stop_ && q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      f();
    }
  }
  std::atomic<int> queued_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

// Runs fn(i) for i in [0, n): i = 0 in the caller, the rest on pool workers.
void run_tasks(int n, const std::function<void(int)>& fn) {
  if (n <= 1 || t_in_parallel) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::get().ensure(n - 1);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> remaining{n - 1};  // atomic: the spin below reads it without the lock
  std::exception_ptr first;
  auto guarded = [&](int i) {
    try {
      fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (!first) first = std::current_exception();
    }
  };
  for (int i = 1; i < n; ++i) {
    Pool::get().submit([&, i] {
      guarded(i);
      std::lock_guard<std::mutex> g(mu);
      if (remaining.fetch_sub(1, std::memory_order_release) == 1) cv.notify_one();
    });
  }
  t_in_parallel = true;
  guarded(0);
  t_in_parallel = false;
  spin_until([&] { return remaining.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return remaining.load(std::memory_order_acquire) == 0; });
  if (first) std::rethrow_exception(first);
}

}  // namespace

int num_threads() {
  int n = g_threads.load();
  if (n <= 0) {
    n = default_threads();
    g_threads.store(n);
  }
  return n;
}

void set_num_threads(int n) { g_threads.store(n > 0 ? n : default_threads()); }

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t n = end - begin;
  int pieces = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (pieces <= 1 || t_in_parallel) {
    fn(begin, end);
    return;
  }
  run_tasks(pieces, [&](int p) {
    int64_t lo = begin + n * p / pieces, hi = begin + n * (p + 1) / pieces;
    if (lo < hi) fn(lo, hi);
  });
}

void parallel_tasks(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  // Tasks may block on each other (producer/consumer), so each gets its own worker.
  bool saved = t_in_parallel;
  t_in_parallel = false;
  try {
    run_tasks(n, fn);
  } catch (...) {
    t_in_parallel = saved;
    throw;
  }
  t_in_parallel = saved;
}

}  // namespace dlrec
