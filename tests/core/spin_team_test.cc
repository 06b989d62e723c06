// SpinTeam: every index runs once per job, errors come back, sleeping teams wake up.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/spin_team.h"

namespace dlrec {
namespace {

void expect_each_index_once(SpinTeam& team, int jobs) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(team.size()));
  for (int j = 0; j < jobs; ++j) {
    for (auto& h : hits) h.store(0);
    team.run([&](int i) { hits[static_cast<size_t>(i)].fetch_add(1); });
    for (int i = 0; i < team.size(); ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "job " << j << " index " << i;
  }
}

TEST(SpinTeam, EveryIndexRunsOncePerJob) {
  SpinTeam team(4);
  EXPECT_EQ(team.size(), 4);
  expect_each_index_once(team, 300);
}

TEST(SpinTeam, SleepingThreadsAreWoken) {
  SpinTeam team(3, /*spin_us=*/0);  // the workers sleep right after each job
  for (int j = 0; j < 50; ++j) {
    expect_each_index_once(team, 1);
    if (j % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(SpinTeam, SizeOneRunsOnTheCaller) {
  SpinTeam team(1);
  const auto me = std::this_thread::get_id();
  std::thread::id ran;
  team.run([&](int i) {
    EXPECT_EQ(i, 0);
    ran = std::this_thread::get_id();
  });
  EXPECT_EQ(ran, me);
}

TEST(SpinTeam, FirstErrorIsRethrownAndTheTeamStaysUsable) {
  SpinTeam team(4);
  for (int bad : {0, 3}) {
    std::atomic<int> done{0};
    try {
      team.run([&](int i) {
        if (i == bad) throw std::runtime_error("piece " + std::to_string(i) + " failed");
        done.fetch_add(1);
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "piece " + std::to_string(bad) + " failed");
    }
    EXPECT_EQ(done.load(), 3);  // the other pieces still ran
  }
  expect_each_index_once(team, 10);
}

TEST(SpinTeam, ConcurrentCallersAreSerialised) {
  SpinTeam team(3);
  std::atomic<int> inside{0}, worst{0};
  std::atomic<long> total{0};
  auto caller = [&] {
    for (int j = 0; j < 300; ++j)
      team.run([&](int) {
        const int now = inside.fetch_add(1) + 1;
        int w = worst.load();
        while (now > w && !worst.compare_exchange_weak(w, now)) {}
        total.fetch_add(1);
        inside.fetch_sub(1);
      });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 300 * 3);
  EXPECT_LE(worst.load(), 3);  // never two jobs' pieces at once
}

TEST(SpinTeam, BadArgumentsAreErrors) {
  EXPECT_THROW(SpinTeam(0), Error);
  EXPECT_THROW(SpinTeam(2, -1), Error);
}

}  // namespace
}  // namespace dlrec
