// The GPU cache's worker team (include/dlrec/store/worker_team.h): every task of every run
// exactly once, with workers spinning and with workers that went to sleep between runs; the
// first exception of a run rethrown in the caller, and the team usable after it.
#include "dlrec/store/worker_team.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

using dlrec::store::WorkerTeam;

TEST(WorkerTeam, RunsEveryTaskOnceAwakeOrAfterSleeping) {
  for (int workers : {0, 1, 3, 7})
    for (int spin_us : {0, 1000}) {
      WorkerTeam team(workers, std::chrono::microseconds(spin_us));
      EXPECT_EQ(team.workers(), workers);
      for (int run = 0; run < 300; ++run) {
        const int n = 1 + run % 17;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        team.run(n, [&](int i) { hits[static_cast<size_t>(i)].fetch_add(1); });
        for (int i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << workers << " workers, spin " << spin_us << ", run " << run << ", task " << i;
        if (run % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));  // asleep
      }
    }
}

TEST(WorkerTeam, RethrowsTheFirstExceptionAfterEveryTaskFinished) {
  WorkerTeam team(3, std::chrono::microseconds(500));
  std::atomic<int> finished{0};
  EXPECT_THROW(team.run(12,
                        [&](int i) {
                          if (i % 4 == 1) throw std::runtime_error("task failed");
                          finished.fetch_add(1);
                        }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 9);
  std::atomic<int> again{0};
  team.run(5, [&](int) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 5);
  EXPECT_THROW(team.run(70000, [](int) {}), std::exception);  // beyond 65535 tasks
}
