// The GPU cache tier's worker team (include/dlrec/store/worker_team.h).
#include "dlrec/store/worker_team.h"

#include "dlrec/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dlrec::store {

namespace {
inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}
inline uint64_t run_of(uint64_t t) { return t >> 32; }
}  // namespace

WorkerTeam::WorkerTeam(int workers, std::chrono::microseconds spin) : spin_(spin) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
}

WorkerTeam::~WorkerTeam() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    ticket_.store((runs_ + 1) << 32, std::memory_order_release);  // a run of no task
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerTeam::work(uint64_t run) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t n = (t >> 16) & 0xFFFF, i = t & 0xFFFF;
    if (run_of(t) != run || i >= n) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire))
      continue;  // t reloaded
    try {
      (*fn_)(static_cast<int>(i));
    } catch (...) {
      std::lock_guard<std::mutex> l(mu_);
      if (!error_) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
    t = ticket_.load(std::memory_order_acquire);
  }
}

void WorkerTeam::loop() {
  uint64_t seen = 0;
  for (;;) {
    // Watch for the next run for spin_, then sleep until one comes.
    const auto until = std::chrono::steady_clock::now() + spin_;
    uint64_t run = run_of(ticket_.load(std::memory_order_acquire));
    for (int k = 1; run == seen; ++k) {
      relax();
      run = run_of(ticket_.load(std::memory_order_acquire));
      if (run == seen && k % 64 == 0 && std::chrono::steady_clock::now() >= until) {
        std::unique_lock<std::mutex> l(mu_);
        sleeping_.fetch_add(1, std::memory_order_acq_rel);
        cv_.wait(l, [&] { return run_of(ticket_.load(std::memory_order_acquire)) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_acq_rel);
        run = run_of(ticket_.load(std::memory_order_acquire));
      }
    }
    seen = run;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
    }
    work(run);
  }
}

void WorkerTeam::run(int n, const std::function<void(int)>& fn) {
  DLREC_CHECK(n < 65536, "worker team: ", n, " tasks (at most 65535)");
  if (n <= 0) return;
  if (threads_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  fn_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  const uint64_t run = ++runs_;
  {
    std::lock_guard<std::mutex> l(mu_);  // (a worker going to sleep checks ticket_ under mu_)
    ticket_.store(run << 32 | static_cast<uint64_t>(n) << 16, std::memory_order_release);
  }
  if (sleeping_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  work(run);
  while (done_.load(std::memory_order_acquire) < n) relax();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace dlrec::store
