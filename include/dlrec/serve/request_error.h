// RequestError: a failure caused by (or reported to) one request, with the protocol-neutral
// status the front ends map to HTTP (400/404/429/503/500) and gRPC (INVALID_ARGUMENT, NOT_FOUND,
// RESOURCE_EXHAUSTED, UNAVAILABLE, INTERNAL) codes.
#pragma once

#include <string>
#include <utility>

#include "dlrec/core/error.h"

namespace dlrec::serve {

enum class Status { InvalidArgument, NotFound, ResourceExhausted, Unavailable, Internal };

class RequestError : public Error {
 public:
  RequestError(Status status, const std::string& msg) : Error(msg), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

template <class... Args>
[[noreturn]] void request_fail(Status s, Args&&... args) {
  throw RequestError(s, detail::concat(std::forward<Args>(args)...));
}

int http_status(Status s);  // 400, 404, 429, 503, 500

}  // namespace dlrec::serve
