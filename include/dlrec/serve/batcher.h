// DynamicBatcher: merges concurrent requests for one model version into larger executions.
//
// Requests (encoded io::Batch rows) wait in a bounded FIFO queue. A worker thread (one per
// model instance) takes the oldest request and waits up to max_queue_delay_us for more, until
// the queued rows reach the preferred batch size; it then merges requests in order while the
// total stays within max_batch_size, runs `execute` once on the merged rows and hands each
// request its slice of the outputs. A full queue rejects new requests at once (RequestError
// ResourceExhausted). With max_queue_delay_us = 0, a request that finds the queue empty and an
// instance idle runs on the caller's thread (no hand-off to a worker and back); an instance
// never runs two batches at once. The destructor finishes every queued request before
// returning.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
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

  DynamicBatcher(BatchingConfig cfg, Execute execute, OnExecute on_execute = {});
  // `workers` threads take merged batches from the one queue concurrently.
  DynamicBatcher(BatchingConfig cfg, int workers, ExecuteOn execute, OnExecute on_execute = {});
  ~DynamicBatcher();
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Blocks until the request's rows are scored. Throws RequestError(ResourceExhausted) when
  // the queue is full or the batcher is stopping, and rethrows what `execute` throws.
  Result run(io::Batch batch);

  int64_t queued() const;  // requests waiting now

 private:
  struct Job;
  void worker(int index);

  BatchingConfig cfg_;
  ExecuteOn execute_;
  OnExecute on_execute_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t queued_rows_ = 0;
  bool stop_ = false;
  std::vector<bool> busy_;  // per instance: executing (a worker's batch or an inline request)
  std::vector<std::thread> threads_;
};

}  // namespace dlrec::serve
