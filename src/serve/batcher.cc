#include "dlrec/serve/batcher.h"

#include <chrono>
#include <exception>
#include <future>
#include <string>

#include <pthread.h>

#include "dlrec/serve/request_error.h"
#include "dlrec/serve/stats.h"

namespace dlrec::serve {

struct DynamicBatcher::Job {
  io::Batch owned;               // submit's batch (submit_ref: unused)
  const io::Batch* batch = nullptr;  // the request's rows: &owned or the caller's
  uint64_t enqueued_ns = 0;
  Done done;
};

namespace {

// Calls a request's `done`; what it throws (it should not) is dropped, so that a worker keeps
// serving the others.
void call_done(const DynamicBatcher::Done& done, DynamicBatcher::Result&& r,
               std::exception_ptr err) {
  try {
    done(std::move(r), std::move(err));
  } catch (...) {
  }
}

}  // namespace

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
  {
    std::unique_lock<std::mutex> lk(mu_);
    inline_done_cv_.wait(lk, [&] { return inline_running_ == 0; });
  }
  for (auto& t : threads_) t.join();
}

int64_t DynamicBatcher::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(queue_.size());
}

void DynamicBatcher::submit(io::Batch batch, Done&& done, int64_t inline_max_rows) {
  submit_impl(batch, &batch, std::move(done), inline_max_rows);
}

void DynamicBatcher::submit_ref(const io::Batch& batch, Done&& done, int64_t inline_max_rows) {
  submit_impl(batch, nullptr, std::move(done), inline_max_rows);
}

void DynamicBatcher::submit_impl(const io::Batch& batch, io::Batch* owned, Done&& done,
                                 int64_t inline_max_rows) {
  int inline_worker = -1;
  uint64_t enqueued_ns = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) request_fail(Status::Unavailable, "the model is being unloaded");
    if (static_cast<int64_t>(queue_.size()) >= cfg_.max_queue_size)
      request_fail(Status::ResourceExhausted, "overloaded: the queue of the model holds ",
                   queue_.size(), " requests (max_queue_size); retry later");
    enqueued_ns = now_ns();
    // No queue delay, nothing queued and an instance idle: a small request runs on this thread
    // (no hand-off to a worker and back, which is most of its latency). A big one goes to a
    // worker all the same, so that the caller (a front end's I/O thread) is free for the next
    // request while it runs.
    if (cfg_.max_queue_delay_us == 0 && queue_.empty() && batch.rows < inline_max_rows)
      for (size_t i = 0; i < busy_.size(); ++i)
        if (!busy_[i]) {
          busy_[i] = true;
          inline_worker = static_cast<int>(i);
          ++inline_running_;
          break;
        }
    if (inline_worker < 0) {
      auto job = std::make_shared<Job>();
      if (owned) {
        job->owned = std::move(*owned);
        job->batch = &job->owned;
      } else {
        job->batch = &batch;
      }
      job->enqueued_ns = enqueued_ns;
      job->done = std::move(done);
      queued_rows_ += job->batch->rows;
      queue_.push_back(std::move(job));
    }
  }
  if (inline_worker >= 0) return run_inline(batch, inline_worker, enqueued_ns, done);
  // Every idle worker looks: notify_one could wake the worker of an instance that is busy with
  // an inline request, which would go back to sleep.
  if (busy_.size() > 1) cv_.notify_all();
  else cv_.notify_one();
}

DynamicBatcher::Result DynamicBatcher::run(io::Batch batch) {
  std::promise<Result> promise;
  std::future<Result> fut = promise.get_future();
  submit(std::move(batch), [&promise](Result&& r, std::exception_ptr err) {
    if (err) promise.set_exception(std::move(err));
    else promise.set_value(std::move(r));
  });
  return fut.get();
}

void DynamicBatcher::run_inline(const io::Batch& batch, int index, uint64_t enqueued_ns,
                                const Done& done) {
  Result r;
  std::exception_ptr err;
  const uint64_t start = now_ns();
  try {
    r.outputs = execute_(batch, index);
    if (static_cast<int64_t>(r.outputs.size()) != batch.rows)
      request_fail(Status::Internal, "the model returned ", r.outputs.size(), " outputs for ",
                   batch.rows, " rows");
  } catch (...) {
    err = std::current_exception();
  }
  const uint64_t end = now_ns();
  bool waiting;
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_[static_cast<size_t>(index)] = false;
    waiting = !queue_.empty();
  }
  // Only queued requests need a worker: waking the idle workers after every inline request
  // would cost each of them a context switch for nothing.
  if (waiting) cv_.notify_all();
  if (!err && on_execute_) {
    try {
      on_execute_(batch.rows, end - start);
    } catch (...) {
    }
  }
  if (!err) {
    r.queue_ns = start - enqueued_ns;
    r.compute_ns = end - start;
    r.merged_rows = batch.rows;
  }
  {
    // The last use of the batcher on this thread: from here on its destructor may finish.
    std::lock_guard<std::mutex> lk(mu_);
    --inline_running_;
    inline_done_cv_.notify_all();
  }
  call_done(done, std::move(r), std::move(err));
}

void DynamicBatcher::worker(int index) {
#ifdef __linux__
  pthread_setname_np(pthread_self(), ("batcher-w" + std::to_string(index)).substr(0, 15).c_str());
#endif
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
        int64_t r = queue_.front()->batch->rows;
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
    const io::Batch* input = jobs[0]->batch;
    if (jobs.size() > 1) {
      merged.reset(jobs[0]->batch->num_dense, jobs[0]->batch->num_cat());
      for (auto& j : jobs) merged.append(*j->batch);
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
    if (err && jobs.size() > 1) {
      // A merged batch failed: each request runs again alone, so that only those that fail by
      // themselves fail (an embedding store tier down fails the requests whose rows no tier
      // above it holds, not the cached ones merged with them).
      for (auto& j : jobs) {
        Result r;
        std::exception_ptr own;
        const uint64_t s0 = now_ns();
        try {
          r.outputs = execute_(*j->batch, index);
          if (static_cast<int64_t>(r.outputs.size()) != j->batch->rows)
            request_fail(Status::Internal, "the model returned ", r.outputs.size(),
                         " outputs for ", j->batch->rows, " rows");
        } catch (...) {
          own = std::current_exception();
        }
        r.queue_ns = start - j->enqueued_ns;
        r.compute_ns = now_ns() - s0;
        r.merged_rows = j->batch->rows;
        call_done(j->done, std::move(r), own);
      }
      jobs.clear();
      continue;
    }
    int64_t offset = 0;
    for (auto& j : jobs) {
      Result r;
      if (!err) {
        if (jobs.size() == 1) {
          r.outputs = std::move(out);
        } else {
          r.outputs.assign(out.begin() + offset, out.begin() + offset + j->batch->rows);
          offset += j->batch->rows;
        }
        r.queue_ns = start - j->enqueued_ns;
        r.compute_ns = end - start;
        r.merged_rows = input->rows;
      }
      // After this the caller may reuse a submit_ref batch: j->batch is not read again.
      call_done(j->done, std::move(r), err);
    }
    jobs.clear();  // the callbacks and their captures go now, not with the next batch
  }
}

}  // namespace dlrec::serve
