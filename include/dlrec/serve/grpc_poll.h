// Waiting for a gRPC completion queue's next event, polling first: shared by the server's
// front end (--grpc-spin-us) and the load generator (bench serve --grpc-spin-us).
#pragma once

#include <grpcpp/completion_queue.h>

#include <chrono>

namespace dlrec::serve {

// The queue's next event, as cq.Next. With spin > 0 the thread first polls without sleeping
// for up to `spin` (zero-deadline AsyncNext), so that an event arriving soon after the last one
// finds it running: no wake-up of a sleeping thread (whose cost grows with the idle state its
// CPU fell into), at the price of that much CPU after each event.
inline bool next_event(grpc::CompletionQueue& cq, std::chrono::nanoseconds spin, void** tag,
                       bool* ok) {
  if (spin.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + spin;
    const gpr_timespec now = gpr_time_0(GPR_CLOCK_MONOTONIC);
    do {
      switch (cq.AsyncNext(tag, ok, now)) {
        case grpc::CompletionQueue::GOT_EVENT: return true;
        case grpc::CompletionQueue::SHUTDOWN: return false;
        case grpc::CompletionQueue::TIMEOUT: break;
      }
    } while (std::chrono::steady_clock::now() < until);
  }
  return cq.Next(tag, ok);
}

}  // namespace dlrec::serve
