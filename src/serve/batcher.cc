#include "dlrec/serve/batcher.h"

#include <chrono>
#include <exception>
#include <future>

#include "dlrec/serve/request_error.h"
#include "dlrec/serve/stats.h"

namespace dlrec::serve {

struct DynamicBatcher::Job {
  io::Batch batch;
  uint64_t enqueued_ns = 0;
  std::promise<Result> promise;
};

DynamicBatcher::DynamicBatcher(BatchingConfig cfg, Execute execute, OnExecute on_execute)
    : DynamicBatcher(
          std::move(cfg), 1,
          [f = std::move(execute)](const io::Batch& b, int) { return f(b); },
          std::move(on_execute)) {}

DynamicBatcher::DynamicBatcher(BatchingConfig cfg, int workers, ExecuteOn execute,
                               OnExecute on_execute)
    : cfg_(std::move(cfg)), execute_(std::move(execute)), on_execute_(std::move(on_execute)) {
  DLREC_CHECK(workers >= 1, "DynamicBatcher: at least one worker");
  busy_.assign(static_cast<size_t>(workers), false);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { worker(i); });
}

DynamicBatcher::~DynamicBatcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

int64_t DynamicBatcher::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(queue_.size());
}

DynamicBatcher::Result DynamicBatcher::run(io::Batch batch) {
  int inline_worker = -1;
  uint64_t enqueued_ns = 0;
  std::future<Result> fut;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) request_fail(Status::Unavailable, "the model is being unloaded");
    if (static_cast<int64_t>(queue_.size()) >= cfg_.max_queue_size)
      request_fail(Status::ResourceExhausted, "overloaded: the queue of the model holds ",
                   queue_.size(), " requests (max_queue_size); retry later");
    enqueued_ns = now_ns();
    // No queue delay, nothing queued and an instance idle: run on this thread (no hand-off to
    // a worker and back, which is most of a small request's latency).
    if (cfg_.max_queue_delay_us == 0 && queue_.empty())
      for (size_t i = 0; i < busy_.size(); ++i)
        if (!busy_[i]) {
          busy_[i] = true;
          inline_worker = static_cast<int>(i);
          break;
        }
    if (inline_worker < 0) {
      auto job = std::make_shared<Job>();
      job->batch = std::move(batch);
      job->enqueued_ns = enqueued_ns;
      fut = job->promise.get_future();
      queued_rows_ += job->batch.rows;
      queue_.push_back(std::move(job));
    }
  }
  if (inline_worker < 0) {
    // Every idle worker looks: notify_one could wake the worker of an instance that is busy
    // with an inline request, which would go back to sleep.
    if (busy_.size() > 1) cv_.notify_all();
    else cv_.notify_one();
    return fut.get();
  }
  auto release = [&] {
    bool waiting;
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_[static_cast<size_t>(inline_worker)] = false;
      waiting = !queue_.empty();
    }
    // Only queued requests need a worker: waking the idle workers after every inline request
    // would cost each of them a context switch for nothing.
    if (waiting) cv_.notify_all();
  };
  Result r;
  const uint64_t start = now_ns();
  try {
    r.outputs = execute_(batch, inline_worker);
    if (static_cast<int64_t>(r.outputs.size()) != batch.rows)
      request_fail(Status::Internal, "the model returned ", r.outputs.size(), " outputs for ",
                   batch.rows, " rows");
  } catch (...) {
    release();
    throw;
  }
  const uint64_t end = now_ns();
  release();
  if (on_execute_) {
    try {
      on_execute_(batch.rows, end - start);
    } catch (...) {
    }
  }
  r.queue_ns = start - enqueued_ns;
  r.compute_ns = end - start;
  r.merged_rows = batch.rows;
  return r;
}

void DynamicBatcher::worker(int index) {
  const int64_t preferred = cfg_.preferred_rows();
  std::vector<std::shared_ptr<Job>> jobs;
  io::Batch merged;
  for (;;) {
    jobs.clear();
    {
      std::unique_lock<std::mutex> lk(mu_);
      // This instance may be running an inline request (run()); wait until it is free.
      cv_.wait(lk, [&] { return (stop_ && queue_.empty()) || (!queue_.empty() && !busy_[index]); });
      if (queue_.empty()) return;  // stopping and drained
      // Wait for more rows until the oldest request has waited max_queue_delay_us.
      auto deadline = std::chrono::steady_clock::time_point(
          std::chrono::nanoseconds(queue_.front()->enqueued_ns + cfg_.max_queue_delay_us * 1000));
      while (!stop_ && queued_rows_ < preferred && std::chrono::steady_clock::now() < deadline)
        cv_.wait_until(lk, deadline);
      int64_t rows = 0;
      while (!queue_.empty()) {
        int64_t r = queue_.front()->batch.rows;
        if (!jobs.empty() && rows + r > cfg_.max_batch_size) break;
        rows += r;
        queued_rows_ -= r;
        jobs.push_back(std::move(queue_.front()));
        queue_.pop_front();
        if (rows >= preferred) break;
      }
      // Another worker may have taken the requests while this one waited.
      if (jobs.empty()) continue;
      busy_[index] = true;
      if (!queue_.empty()) cv_.notify_one();  // more for an idle worker
    }
    const uint64_t start = now_ns();
    const io::Batch* input = &jobs[0]->batch;
    if (jobs.size() > 1) {
      merged.reset(jobs[0]->batch.num_dense, jobs[0]->batch.num_cat());
      for (auto& j : jobs) merged.append(j->batch);
      input = &merged;
    }
    std::vector<float> out;
    std::exception_ptr err;
    try {
      out = execute_(*input, index);
      if (static_cast<int64_t>(out.size()) != input->rows)
        request_fail(Status::Internal, "the model returned ", out.size(), " outputs for ",
                     input->rows, " rows");
    } catch (...) {
      err = std::current_exception();
    }
    const uint64_t end = now_ns();
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_[index] = false;
    }
    if (!err && on_execute_) {
      try {
        on_execute_(input->rows, end - start);
      } catch (...) {
      }
    }
    int64_t offset = 0;
    for (auto& j : jobs) {
      if (err) {
        j->promise.set_exception(err);
        continue;
      }
      Result r;
      r.outputs.assign(out.begin() + offset, out.begin() + offset + j->batch.rows);
      offset += j->batch.rows;
      r.queue_ns = start - j->enqueued_ns;
      r.compute_ns = end - start;
      r.merged_rows = input->rows;
      j->promise.set_value(std::move(r));
    }
  }
}

}  // namespace dlrec::serve
