// DynamicBatcher: merges concurrent requests for one model version into larger executions.
//
// Requests (encoded io::Batch rows) wait in a bounded FIFO queue. A worker thread (one per
// model instance) takes the oldest request and waits up to max_queue_delay_us for more, until
// the queued rows reach the preferred batch size; it then merges requests in order while the
// total stays within max_batch_size, runs `execute` once on the merged rows and hands each
// request its slice of the outputs. A full queue rejects new requests at once (RequestError
// ResourceExhausted). With max_queue_delay_us = 0, a request that finds the queue empty and an
// instance idle runs on the caller's thread (no hand-off to a worker and back) when it holds
// fewer rows than the caller's inline limit; an instance never runs two batches at once.
// The destructor finishes every queued request before returning.
//
// submit() is the asynchronous form: it returns once the request is queued (or, inline, once
// it is scored) and calls `done` with the result on the thread that scored it (a worker, or
// the caller). run() is submit() plus a wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dlrec/io/batch.h"
#include "dlrec/serve/model_config.h"

namespace dlrec::serve {

class DynamicBatcher {
 public:
  // One output value per row of the batch it is given.
  using Execute = std::function<std::vector<float>(const io::Batch&)>;
  // The same, told which worker (0 .. workers-1) runs it (one model instance per worker).
  using ExecuteOn = std::function<std::vector<float>(const io::Batch&, int worker)>;
  // Called after each execution with its rows and duration (nanoseconds).
  using OnExecute = std::function<void(int64_t rows, uint64_t ns)>;

  struct Result {
    std::vector<float> outputs;  // [rows of the request]
    uint64_t queue_ns = 0;       // enqueue -> execution start
    uint64_t compute_ns = 0;     // the merged execution's duration
    int64_t merged_rows = 0;     // rows of the execution this request was part of
  };
  // Called once per submitted request: `error` null and `result` filled, or `error` set (what
  // `execute` threw, or RequestError(Internal) for a wrong output count). It runs on a worker
  // thread (or inline on the submitting thread) and must not throw; a worker scores nothing
  // else while it runs, so it should be quick. It must not destroy the batcher.
  using Done = std::function<void(Result&& result, std::exception_ptr error)>;

  DynamicBatcher(BatchingConfig cfg, Execute execute, OnExecute on_execute = {});
  // `workers` threads take merged batches from the one queue concurrently.
  DynamicBatcher(BatchingConfig cfg, int workers, ExecuteOn execute, OnExecute on_execute = {});
  ~DynamicBatcher();
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues the request, or scores it on this thread when the queue delay is 0, nothing is
  // queued, an instance is idle and batch.rows < inline_max_rows; `done` is then called before
  // submit returns. Throws RequestError(ResourceExhausted) when the queue is full and
  // RequestError(Unavailable) when the batcher is stopping; `done` is then neither called nor
  // moved from (the caller may still call it to report the error).
  void submit(io::Batch batch, Done&& done, int64_t inline_max_rows = INT64_MAX);
  // submit without taking the batch: the caller keeps `batch` alive and unchanged until `done`
  // has been called (or submit has thrown), and may reuse its buffers after that (no copy, no
  // allocation per request).
  void submit_ref(const io::Batch& batch, Done&& done, int64_t inline_max_rows = INT64_MAX);

  // Blocks until the request's rows are scored (inline whenever submit allows it). Throws what
  // submit throws, and rethrows what `execute` throws.
  Result run(io::Batch batch);

  int64_t queued() const;  // requests waiting now

 private:
  struct Job;
  void worker(int index);
  // Scores `batch` on this thread as instance `index` (already marked busy), then frees the
  // instance and calls `done`.
  void run_inline(const io::Batch& batch, int index, uint64_t enqueued_ns, const Done& done);
  // submit's body: `owned` (moved into the queue) is `batch` itself, or null for submit_ref.
  void submit_impl(const io::Batch& batch, io::Batch* owned, Done&& done, int64_t inline_max_rows);

  BatchingConfig cfg_;
  ExecuteOn execute_;
  OnExecute on_execute_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t queued_rows_ = 0;
  bool stop_ = false;
  std::vector<bool> busy_;  // per instance: executing (a worker's batch or an inline request)
  // Callers' threads inside run_inline: the destructor waits for them as it joins the workers,
  // since they run on threads it does not own (found by ASan in CI: an inline request that
  // outlived the batcher read its members after destruction).
  int inline_running_ = 0;
  std::condition_variable inline_done_cv_;
  std::vector<std::thread> threads_;
};

}  // namespace dlrec::serve
