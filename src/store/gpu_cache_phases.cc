// The GPU cache's diagnostic per-batch record (GpuCache::keep_phases, gpu_cache.h): a team job
// timed per member, with each member's involuntary context switches and page faults.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "dlrec/store/gpu_cache.h"

namespace dlrec::store {

void GpuCache::thread_usage(int64_t* preempted, int64_t* faults, int64_t* slept) {
  *preempted = *faults = 0;
  if (slept) *slept = 0;
#ifdef RUSAGE_THREAD
  rusage r{};
  if (getrusage(RUSAGE_THREAD, &r) == 0) {
    *preempted = r.ru_nivcsw;
    *faults = r.ru_minflt + r.ru_majflt;
    if (slept) *slept = r.ru_nvcsw;
  }
#endif
}

namespace {
struct ThreadUsage {
  int64_t preempted = 0, faults = 0, slept = 0;
  static ThreadUsage now() {
    ThreadUsage u;
    GpuCache::thread_usage(&u.preempted, &u.faults, &u.slept);
    return u;
  }
};

void raise_to(std::atomic<int64_t>& a, int64_t v) {
  for (int64_t c = a.load(std::memory_order_relaxed);
       c < v && !a.compare_exchange_weak(c, v, std::memory_order_relaxed);) {
  }
}
}  // namespace

void GpuCache::run_tasks_timed(int n, bool threaded, const std::function<void(int)>& fn,
                               TeamPhase* rec) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count();
  };
  std::atomic<int> next{0}, workers{0}, preempted{0}, slept{0};
  std::atomic<int64_t> max_task{0}, last_start{0}, last_work_end{0}, last_end{0}, faults{0};
  auto member = [&](int) {
    const ThreadUsage u0 = ThreadUsage::now();
    const int64_t began = ns();
    int64_t longest = 0, tasks = 0;
    for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n; ++tasks) {
      const int64_t a = ns();
      fn(i);
      longest = std::max(longest, ns() - a);
    }
    const ThreadUsage u1 = ThreadUsage::now();
    const int64_t ended = ns();
    raise_to(max_task, longest);
    raise_to(last_start, began);
    raise_to(last_end, ended);
    if (tasks > 0) {
      raise_to(last_work_end, ended);
      workers.fetch_add(1, std::memory_order_relaxed);
    }
    preempted.fetch_add(static_cast<int>(u1.preempted - u0.preempted), std::memory_order_relaxed);
    slept.fetch_add(static_cast<int>(u1.slept - u0.slept), std::memory_order_relaxed);
    faults.fetch_add(u1.faults - u0.faults, std::memory_order_relaxed);
  };
  if (threaded)
    team_->run(member);
  else
    member(0);
  rec->wall_ns = ns();
  rec->max_task_ns = max_task.load();
  rec->last_start_ns = last_start.load();
  rec->last_work_end_ns = last_work_end.load();
  rec->last_end_ns = last_end.load();
  rec->workers = workers.load();
  rec->preempted = preempted.load();
  rec->slept = slept.load();
  rec->faults = faults.load();
}

}  // namespace dlrec::store
