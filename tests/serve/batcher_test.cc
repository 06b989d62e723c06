#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "dlrec/serve/batcher.h"
#include "dlrec/serve/request_error.h"

using namespace dlrec;
using namespace dlrec::serve;

namespace {

// One dense feature per row; the "model" returns it doubled so each request can check that it
// got its own rows back.
io::Batch rows_with(std::vector<float> values) {
  io::Batch b;
  b.reset(1, 0);
  b.rows = static_cast<int64_t>(values.size());
  b.labels.assign(values.size(), 0.f);
  b.dense = std::move(values);
  return b;
}

std::vector<float> doubled(const io::Batch& b) {
  std::vector<float> out(b.dense.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = 2 * b.dense[i];
  return out;
}

}  // namespace

TEST(DynamicBatcher, MergesConcurrentRequestsAndSplitsOutputs) {
  BatchingConfig cfg;
  cfg.max_batch_size = 64;
  cfg.preferred_batch_size = {16};
  cfg.max_queue_delay_us = 500000;  // long: the preferred size triggers execution
  std::atomic<int> executions{0};
  std::atomic<int64_t> max_rows{0};
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    ++executions;
    max_rows = std::max<int64_t>(max_rows, x.rows);
    return doubled(x);
  });
  std::vector<std::future<void>> fs;
  for (int i = 0; i < 8; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto r = b.run(rows_with({float(i), float(i) + 0.5f}));
      ASSERT_EQ(r.outputs.size(), 2u);
      EXPECT_EQ(r.outputs[0], 2.f * i);
      EXPECT_EQ(r.outputs[1], 2.f * i + 1.f);
      EXPECT_GE(r.merged_rows, 2);
    }));
  for (auto& f : fs) f.get();
  EXPECT_EQ(executions.load(), 1);  // 8 requests x 2 rows = the preferred 16 rows
  EXPECT_EQ(max_rows.load(), 16);
}

TEST(DynamicBatcher, RespectsMaxBatchSizeAndDelay) {
  BatchingConfig cfg;
  cfg.max_batch_size = 5;
  cfg.max_queue_delay_us = 2000;
  std::atomic<int64_t> max_rows{0};
  std::atomic<int64_t> total{0};
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    max_rows = std::max<int64_t>(max_rows, x.rows);
    total += x.rows;
    return doubled(x);
  });
  std::vector<std::future<void>> fs;
  for (int i = 0; i < 20; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto r = b.run(rows_with({float(i), 1.f}));
      EXPECT_EQ(r.outputs[0], 2.f * i);
    }));
  for (auto& f : fs) f.get();
  EXPECT_LE(max_rows.load(), 5);
  EXPECT_EQ(total.load(), 40);
  // A single request does not wait longer than about the delay.
  auto t0 = std::chrono::steady_clock::now();
  b.run(rows_with({1.f}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
}

TEST(DynamicBatcher, BoundedQueueRejectsWithResourceExhausted) {
  BatchingConfig cfg;
  cfg.max_batch_size = 1;  // one request per execution
  cfg.max_queue_delay_us = 0;
  cfg.max_queue_size = 2;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> started{0};
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    ++started;
    gate.wait();
    return doubled(x);
  });
  auto first = std::async(std::launch::async, [&] { return b.run(rows_with({1.f})); });
  while (started.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto q1 = std::async(std::launch::async, [&] { return b.run(rows_with({2.f})); });
  auto q2 = std::async(std::launch::async, [&] { return b.run(rows_with({3.f})); });
  while (b.queued() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  try {
    b.run(rows_with({4.f}));
    FAIL() << "expected an overload error";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), Status::ResourceExhausted);
    EXPECT_EQ(http_status(e.status()), 429);
  }
  release.set_value();
  EXPECT_EQ(first.get().outputs[0], 2.f);
  EXPECT_EQ(q1.get().outputs[0], 4.f);
  EXPECT_EQ(q2.get().outputs[0], 6.f);
}

TEST(DynamicBatcher, ExecutionErrorsReachEveryMergedRequest) {
  BatchingConfig cfg;
  cfg.max_queue_delay_us = 0;
  DynamicBatcher b(cfg, [](const io::Batch&) -> std::vector<float> { fail("engine failed"); });
  EXPECT_THROW(b.run(rows_with({1.f})), Error);
  // The batcher keeps working after a failure.
  EXPECT_THROW(b.run(rows_with({1.f})), Error);
}

TEST(DynamicBatcher, DestructorFinishesQueuedRequests) {
  BatchingConfig cfg;
  cfg.max_batch_size = 1;
  cfg.max_queue_delay_us = 0;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> started{0};
  std::vector<std::future<DynamicBatcher::Result>> fs;
  std::thread releaser;
  {
    DynamicBatcher b(cfg, [&](const io::Batch& x) {
      ++started;
      gate.wait();
      return doubled(x);
    });
    fs.push_back(std::async(std::launch::async, [&b] { return b.run(rows_with({0.f})); }));
    while (started.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 1; i < 6; ++i)
      fs.push_back(std::async(std::launch::async, [&b, i] { return b.run(rows_with({float(i)})); }));
    while (b.queued() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      release.set_value();
    });
  }  // the destructor waits for all six
  releaser.join();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(fs[i].get().outputs[0], 2.f * i);
}

// Several workers (one per model instance) run merged batches concurrently from one queue; every
// request gets its own rows back and each worker index is used.
TEST(DynamicBatcher, SeveralWorkersShareTheQueue) {
  BatchingConfig cfg;
  cfg.max_batch_size = 4;
  cfg.max_queue_delay_us = 0;
  std::atomic<int> running{0}, max_running{0};
  std::mutex mu;
  std::set<int> used;
  DynamicBatcher b(cfg, 3, [&](const io::Batch& x, int worker) {
    {
      std::lock_guard<std::mutex> g(mu);
      used.insert(worker);
    }
    const int now = ++running;
    int prev = max_running.load();
    while (now > prev && !max_running.compare_exchange_weak(prev, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --running;
    return doubled(x);
  });
  std::vector<std::future<void>> fs;
  for (int i = 0; i < 24; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto r = b.run(rows_with({float(i), float(i) + 0.25f, float(i) + 0.5f}));
      ASSERT_EQ(r.outputs.size(), 3u);
      EXPECT_EQ(r.outputs[0], 2.f * i);
      EXPECT_EQ(r.outputs[2], 2.f * i + 1.f);
    }));
  for (auto& f : fs) f.get();
  EXPECT_GE(max_running.load(), 2) << "workers never overlapped";
  EXPECT_LE(max_running.load(), 3);
  EXPECT_EQ(used.size(), 3u);
}

// With no queue delay, a request that finds the queue empty and an instance idle runs on the
// caller's thread; under concurrency the rest queue as usual, and no instance ever runs two
// batches at once.
TEST(DynamicBatcher, IdleInstanceRunsTheRequestInline) {
  BatchingConfig cfg;
  cfg.max_batch_size = 64;
  cfg.max_queue_delay_us = 0;
  std::mutex mu;
  std::vector<std::thread::id> ran_on;
  std::atomic<int> running[2] = {{0}, {0}};
  std::atomic<int> overlaps{0};
  DynamicBatcher b(cfg, 2, [&](const io::Batch& x, int worker) {
    if (++running[worker] > 1) ++overlaps;
    {
      std::lock_guard<std::mutex> g(mu);
      ran_on.push_back(std::this_thread::get_id());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    --running[worker];
    return doubled(x);
  });
  auto r = b.run(rows_with({1.f, 2.f}));
  EXPECT_EQ(r.outputs, (std::vector<float>{2.f, 4.f}));
  ASSERT_EQ(ran_on.size(), 1u);
  EXPECT_EQ(ran_on[0], std::this_thread::get_id()) << "an idle instance should run it inline";
  std::vector<std::future<void>> fs;
  for (int i = 0; i < 40; ++i)
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto rr = b.run(rows_with({float(i)}));
      ASSERT_EQ(rr.outputs.size(), 1u);
      EXPECT_EQ(rr.outputs[0], 2.f * i);
    }));
  for (auto& f : fs) f.get();
  EXPECT_EQ(overlaps.load(), 0) << "an instance ran two batches at once";
  EXPECT_EQ(ran_on.size() > 1, true);
}
