// SpinTeam: every index runs once per job, errors come back, sleeping teams wake up.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
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

// post() returns while the members run the job; wait() ends it: every index once, whether
// the members were awake, asleep (the caller then runs what is left) or the team is the
// caller alone; the first error comes back from wait() and the team stays usable.
TEST(SpinTeam, PostedJobsRunBesideTheCallerAndWaitEndsThem) {
  for (int spin : {200, 0})
    for (int size : {1, 4}) {
      SCOPED_TRACE("spin_us " + std::to_string(spin) + " size " + std::to_string(size));
      SpinTeam team(size, spin);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(size));
      const std::function<void(int)> job = [&](int i) { hits[static_cast<size_t>(i)] += 1; };
      for (int j = 0; j < 100; ++j) {
        for (auto& h : hits) h.store(0);
        team.post(job);
        volatile long caller_work = 0;
        for (int k = 0; k < 1000; ++k) caller_work = caller_work + k;
        team.wait();
        for (int i = 0; i < size; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
        if (j % 25 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      const std::function<void(int)> bad = [](int i) {
        if (i == 0) throw std::runtime_error("posted piece failed");
      };
      team.post(bad);
      EXPECT_THROW(team.wait(), std::runtime_error);
      expect_each_index_once(team, 5);
    }
  SpinTeam team(2);
  EXPECT_THROW(team.wait(), Error);  // no post
}

TEST(SpinTeam, BadArgumentsAreErrors) {
  EXPECT_THROW(SpinTeam(0), Error);
  EXPECT_THROW(SpinTeam(2, -1), Error);
}

}  // namespace
}  // namespace dlrec
