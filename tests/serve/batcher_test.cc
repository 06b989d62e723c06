#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
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

// --- submit(): the asynchronous form --------------------------------------------------------

namespace {

// Collects the callbacks of submitted requests.
struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<float, std::vector<float>>> ok;  // first input value -> outputs
  std::vector<std::string> errors;
  std::set<std::thread::id> threads;
  int calls = 0;

  DynamicBatcher::Done done_for(float first) {
    return [this, first](DynamicBatcher::Result&& r, std::exception_ptr err) {
      std::lock_guard<std::mutex> lk(mu);
      threads.insert(std::this_thread::get_id());
      ++calls;
      if (err) {
        try {
          std::rethrow_exception(err);
        } catch (const std::exception& e) {
          errors.push_back(e.what());
        }
      } else {
        ok.emplace_back(first, std::move(r.outputs));
      }
      cv.notify_all();
    };
  }
  void wait_for(int n) {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return calls >= n; }))
        << calls << " of " << n << " callbacks";
  }
};

}  // namespace

// submit() returns while its requests wait behind a busy instance; each is answered later, on
// the worker, with its own rows.
TEST(DynamicBatcher, SubmitReturnsAtOnceAndTheWorkerAnswers) {
  BatchingConfig cfg;
  cfg.max_batch_size = 8;
  cfg.max_queue_delay_us = 0;
  cfg.max_queue_size = 1000;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> executions{0};
  Collected c;
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    gate.wait();
    ++executions;
    return doubled(x);
  });
  const int n = 300;
  for (int i = 0; i < n; ++i)
    b.submit(rows_with({float(i), float(i) + 0.5f}), c.done_for(float(i)), /*inline_max_rows=*/0);
  {
    std::lock_guard<std::mutex> lk(c.mu);
    EXPECT_EQ(c.calls, 0) << "a callback ran before its execution was released";
  }
  release.set_value();
  c.wait_for(n);
  std::lock_guard<std::mutex> lk(c.mu);
  ASSERT_EQ(c.ok.size(), size_t(n));
  EXPECT_TRUE(c.errors.empty());
  for (const auto& [first, out] : c.ok) {
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0], 2 * first);
    EXPECT_EQ(out[1], 2 * first + 1);
  }
  EXPECT_EQ(c.threads.count(std::this_thread::get_id()), 0u) << "answered on the caller";
  EXPECT_EQ(c.threads.size(), 1u);  // the one worker
  EXPECT_LE(executions.load(), n / 4 + 2) << "requests were not merged (4 per execution)";
}

// Below the inline limit an idle instance scores the request on the caller's thread (the
// callback has run when submit returns); at the limit it goes to the worker.
TEST(DynamicBatcher, InlineOnlyBelowTheRowLimit) {
  BatchingConfig cfg;
  cfg.max_queue_delay_us = 0;
  std::mutex mu;
  std::vector<std::thread::id> ran_on;
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    std::lock_guard<std::mutex> g(mu);
    ran_on.push_back(std::this_thread::get_id());
    return doubled(x);
  });
  Collected small;
  b.submit(rows_with({1.f, 2.f, 3.f}), small.done_for(1.f), /*inline_max_rows=*/4);
  {
    std::lock_guard<std::mutex> lk(small.mu);
    ASSERT_EQ(small.calls, 1) << "an idle instance should score a small request inline";
    EXPECT_EQ(small.ok[0].second, (std::vector<float>{2.f, 4.f, 6.f}));
  }
  Collected big;
  b.submit(rows_with({1.f, 2.f, 3.f, 4.f}), big.done_for(1.f), /*inline_max_rows=*/4);
  big.wait_for(1);
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(ran_on.size(), 2u);
  EXPECT_EQ(ran_on[0], std::this_thread::get_id());
  EXPECT_NE(ran_on[1], std::this_thread::get_id()) << "a big request ran on the caller";
  EXPECT_EQ(big.ok[0].second, (std::vector<float>{2.f, 4.f, 6.f, 8.f}));
}

// Failures after submission reach the callback (inline and on the worker), with the message;
// a wrong output count is an Internal error naming the counts.
TEST(DynamicBatcher, SubmitDeliversExecutionErrorsToTheCallback) {
  BatchingConfig cfg;
  cfg.max_batch_size = 2;  // the two requests never merge
  cfg.max_queue_delay_us = 0;
  DynamicBatcher b(cfg, [](const io::Batch& x) -> std::vector<float> {
    if (x.dense[0] < 0) fail("engine failed on row 0");
    return std::vector<float>(static_cast<size_t>(x.rows) + 1, 0.f);  // one output too many
  });
  for (int64_t limit : {int64_t{1} << 20, int64_t{0}}) {  // inline, then on the worker
    Collected c;
    b.submit(rows_with({-1.f}), c.done_for(-1.f), limit);
    b.submit(rows_with({1.f, 2.f}), c.done_for(1.f), limit);
    c.wait_for(2);
    std::lock_guard<std::mutex> lk(c.mu);
    EXPECT_TRUE(c.ok.empty());
    ASSERT_EQ(c.errors.size(), 2u);
    std::sort(c.errors.begin(), c.errors.end());
    EXPECT_NE(c.errors[0].find("engine failed on row 0"), std::string::npos) << c.errors[0];
    EXPECT_NE(c.errors[1].find("3 outputs for 2 rows"), std::string::npos) << c.errors[1];
  }
}

// A full queue rejects by throwing; the callback is neither called nor moved from, so the
// caller can still report the error through it.
TEST(DynamicBatcher, SubmitToAFullQueueThrowsAndKeepsTheCallback) {
  BatchingConfig cfg;
  cfg.max_batch_size = 1;
  cfg.max_queue_delay_us = 0;
  cfg.max_queue_size = 1;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    gate.wait();
    return doubled(x);
  });
  Collected c;
  b.submit(rows_with({1.f}), c.done_for(1.f), 0);  // taken by the worker, which waits
  while (b.queued() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  b.submit(rows_with({2.f}), c.done_for(2.f), 0);  // queued
  DynamicBatcher::Done rejected = c.done_for(3.f);
  try {
    b.submit(rows_with({3.f}), std::move(rejected), 0);
    FAIL() << "expected an overload error";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), Status::ResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("max_queue_size"), std::string::npos);
  }
  ASSERT_TRUE(static_cast<bool>(rejected)) << "the rejected callback was moved from";
  release.set_value();
  c.wait_for(2);
  std::lock_guard<std::mutex> lk(c.mu);
  EXPECT_EQ(c.calls, 2);
  EXPECT_EQ(c.ok.size(), 2u);
}

// The destructor answers every submitted request before it returns.
TEST(DynamicBatcher, DestructorAnswersSubmittedRequests) {
  BatchingConfig cfg;
  cfg.max_batch_size = 2;
  cfg.max_queue_delay_us = 0;
  Collected c;
  {
    DynamicBatcher b(cfg, 2, [&](const io::Batch& x, int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return doubled(x);
    });
    for (int i = 0; i < 40; ++i) b.submit(rows_with({float(i)}), c.done_for(float(i)), 0);
  }
  std::lock_guard<std::mutex> lk(c.mu);
  EXPECT_EQ(c.calls, 40);
  ASSERT_EQ(c.ok.size(), 40u);
  for (const auto& [first, out] : c.ok) EXPECT_EQ(out, std::vector<float>{2 * first});
}

// submit_ref scores the caller's batch in place (merged with others on the worker, or inline);
// once a request's callback has run, its batch is the caller's again: overwriting it then
// changes no other request's answer.
TEST(DynamicBatcher, SubmitRefScoresTheCallersBatchAndHandsItBack) {
  BatchingConfig cfg;
  cfg.max_batch_size = 64;
  cfg.max_queue_delay_us = 0;
  cfg.max_queue_size = 1000;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> executions{0};
  DynamicBatcher b(cfg, [&](const io::Batch& x) {
    gate.wait();
    ++executions;
    return doubled(x);
  });
  const int n = 40;
  std::vector<io::Batch> batches;
  for (int i = 0; i < n; ++i) batches.push_back(rows_with({float(i), float(i) + 0.5f}));
  std::mutex mu;
  std::condition_variable cv;
  int answered = 0;
  std::vector<std::vector<float>> outs(n);
  for (int i = 0; i < n; ++i)
    b.submit_ref(batches[i], [&, i](DynamicBatcher::Result&& r, std::exception_ptr err) {
      EXPECT_FALSE(err);
      // The batch is ours again: scribble on it (the sanitizers and the other answers catch a
      // worker still reading it).
      batches[i].dense.assign(batches[i].dense.size(), -1.f);
      std::lock_guard<std::mutex> lk(mu);
      outs[i] = std::move(r.outputs);
      ++answered;
      cv.notify_all();
    }, /*inline_max_rows=*/0);
  release.set_value();
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return answered == n; });
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(outs[i], (std::vector<float>{2.f * i, 2.f * i + 1.f})) << i;
  EXPECT_LT(executions.load(), n) << "the queued batches were not merged";
  // Inline: the same batch object reused for several requests in a row.
  io::Batch mine = rows_with({1.f});
  for (float v : {3.f, 5.f, 7.f}) {
    mine.dense[0] = v;
    std::vector<float> got;
    b.submit_ref(mine, [&](DynamicBatcher::Result&& r, std::exception_ptr) { got = r.outputs; },
                 /*inline_max_rows=*/2);
    EXPECT_EQ(got, (std::vector<float>{2 * v})) << "inline with a reused batch";
  }
}

// A merged batch that fails is run again request by request: only the request that fails by
// itself gets the error (an embedding store tier down fails the requests whose rows are not
// cached, not the cached ones merged with them).
TEST(DynamicBatcher, AMergedBatchThatFailsIsRetriedRequestByRequest) {
  BatchingConfig cfg;
  cfg.max_batch_size = 64;
  cfg.preferred_batch_size = {3};      // the three rows below execute as one batch
  cfg.max_queue_delay_us = 2000000;  // ...once all are queued
  std::atomic<int> executions{0};
  DynamicBatcher b(cfg, [&](const io::Batch& x) -> std::vector<float> {
    ++executions;
    for (float v : x.dense)
      if (v < 0) fail("engine failed on a negative row");
    return std::vector<float>(x.dense.begin(), x.dense.end());
  });
  Collected c;
  b.submit(rows_with({-1.f}), c.done_for(-1.f), 0);
  b.submit(rows_with({1.f, 2.f}), c.done_for(1.f), 0);
  c.wait_for(2);
  std::lock_guard<std::mutex> lk(c.mu);
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_NE(c.errors[0].find("negative row"), std::string::npos) << c.errors[0];
  ASSERT_EQ(c.ok.size(), 1u);
  EXPECT_EQ(c.ok[0].first, 1.f);
  EXPECT_EQ(c.ok[0].second, (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(executions, 3) << "the merged batch, then each request alone";
}
