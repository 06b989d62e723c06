#include "dlrec/core/spin_team.h"

#include <chrono>
#include <string>
#ifdef __linux__
#include <pthread.h>
#endif

#include "dlrec/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DLREC_CPU_RELAX() _mm_pause()
#else
#define DLREC_CPU_RELAX() std::this_thread::yield()
#endif

namespace dlrec {

SpinTeam::SpinTeam(int size, int spin_us) : spin_us_(spin_us) {
  DLREC_CHECK(size >= 1, "SpinTeam: size must be >= 1, got ", size);
  DLREC_CHECK(spin_us >= 0, "SpinTeam: spin_us must be >= 0, got ", spin_us);
  threads_.reserve(static_cast<size_t>(size - 1));
  for (int i = 1; i < size; ++i) threads_.emplace_back([this, i] { loop(i); });
}

SpinTeam::~SpinTeam() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
    // A new generation that has no pieces (the next piece is already past the last).
    const uint64_t g = (claim_.load() >> 32) + 1;
    claim_.store(g << 32 | static_cast<uint64_t>(size()));
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void SpinTeam::call(int index) {
  try {
    (*job_)(index);
  } catch (...) {
    std::lock_guard<std::mutex> lk(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void SpinTeam::loop(int index) {
#ifdef __linux__
  // Named, so that per-thread CPU figures (top -H, /proc/<pid>/task) show the team as itself
  // rather than under the name of the thread that happened to create it.
  pthread_setname_np(pthread_self(), ("spin-team" + std::to_string(index)).substr(0, 15).c_str());
#endif
  uint64_t seen = 0;  // the generation at construction: a job posted before this thread
                     // got here still counts as new
  for (;;) {
    // Spin for the next job, then sleep.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    uint64_t g = generation();
    for (int k = 0; g == seen; ++k) {
      DLREC_CPU_RELAX();
      if ((k & 255) == 255 && std::chrono::steady_clock::now() >= deadline) break;
      g = generation();
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      ++sleeping_;
      wake_.wait(lk, [&] { return generation() != seen; });
      --sleeping_;
      g = generation();
    }
    seen = g;
    if (stop_.load()) return;
    work();
  }
}

int SpinTeam::claim() {
  // A piece of the job posted now: the claim carries the job's generation, so that a member
  // that wakes after its job was done (by the others) claims nothing of it.
  uint64_t s = claim_.load(std::memory_order_acquire);
  while (static_cast<int>(s & 0xffffffffu) < size()) {
    if (claim_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      return static_cast<int>(s & 0xffffffffu);
  }
  return -1;
}

void SpinTeam::work() {
  for (int i; (i = claim()) >= 0;) {
    call(i);
    finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void SpinTeam::run(const std::function<void(int)>& fn) {
  post(fn);
  // The caller takes pieces too, so the job never waits for a member to wake up: members that
  // are awake share the pieces, a sleeping one finds them taken (a wake-up takes tens to
  // hundreds of microseconds on a virtual machine; a team that waited for every member and
  // slept between jobs longer apart than spin_us stayed that slow: bench/RESULTS.md).
  wait();
}

void SpinTeam::post(const std::function<void(int)>& fn) {
  run_mu_.lock();  // until wait()
  posted_ = true;
  job_ = &fn;
  error_ = nullptr;
  finished_.store(0, std::memory_order_relaxed);
  // A new generation, pieces from 0 (publishes job_ and finished_).
  claim_.store(((claim_.load(std::memory_order_relaxed) >> 32) + 1) << 32,
               std::memory_order_release);
  std::lock_guard<std::mutex> lk(mu_);
  if (sleeping_ > 0) wake_.notify_all();
}

void SpinTeam::wait() {
  // (posted_ is read without run_mu_ only by the thread that holds it after its post())
  DLREC_CHECK(posted_, "SpinTeam::wait without a post (bug)");
  std::unique_lock<std::mutex> one(run_mu_, std::adopt_lock);
  work();  // the pieces no member has taken
  // What members claimed is running on them (they are awake): wait for it.
  for (int k = 0; finished_.load(std::memory_order_acquire) != size(); ++k) {
    DLREC_CPU_RELAX();
    if (k > (1 << 16)) std::this_thread::yield();  // a descheduled member: do not burn the core
  }
  job_ = nullptr;
  posted_ = false;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace dlrec
