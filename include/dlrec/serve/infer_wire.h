// The gRPC ModelInfer messages (inference.ModelInferRequest / ModelInferResponse, KServe v2) in
// their protobuf wire form, read and written without protobuf's message objects.
//
// The gRPC front end receives ModelInfer as raw bytes (a list of slices, as the transport
// received them) and reads the request straight from them: the raw_input_contents are not
// copied into a message (a tensor that lies within one slice is used in place; one that spans
// slices is gathered into a reused buffer). The reader handles the messages clients send in
// practice (names, datatypes, shapes, raw contents, requested outputs) and answers Unusual for
// anything else (typed contents, parameters, unknown fields, non-ASCII strings, malformed
// bytes...); the caller then parses the same bytes with protobuf, so every message means what
// protobuf says it means. Both readers feed bind_infer_inputs, which holds the checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dlrec/serve/inference.h"

namespace inference {
class ModelInferRequest;
}

namespace dlrec::serve {

// A contiguous piece of a received message (one gRPC slice).
struct WireSegment {
  const char* data = nullptr;
  size_t size = 0;
};

// Buffers the wire reader reuses from call to call (their capacity stays).
struct InferWireScratch {
  // Copies of raw tensors that span segments. A deque: growing it never moves the strings,
  // whose short contents live inside them (earlier views must stay valid).
  std::deque<std::string> gathered;
};

enum class WireRead { Parsed, Unusual };

// Where a raw tensor that spans segments may be gathered: given its index among the
// raw_input_contents, its input (name, datatype and shape as read so far; empty when its
// InferInputTensor comes later in the message) and its size in bytes, a buffer of that size,
// or null for `scratch`. The gRPC front end passes the model's own input buffer (so that the
// tensor is copied once, straight to where the model reads it).
using GatherTarget = std::function<char*(size_t index, const InputTensor& input, size_t bytes)>;

// Reads a serialized ModelInferRequest made of `n` segments into `req` (model, version, id;
// each input's name, datatype and shape; the requested outputs' names) and `raw` (the
// raw_input_contents in order: views into the segments or into `scratch`, valid while both
// are, or into the buffers `target` gave). Returns Unusual for what it does not read itself (see above); `req` and `raw` then
// hold partial results and the caller must parse the message with protobuf instead. Never
// throws for bad bytes.
WireRead read_infer_wire(const WireSegment* segs, size_t n, InferRequest& req,
                         std::vector<std::string_view>& raw, InferWireScratch& scratch,
                         const GatherTarget& target = {});

// The same fields from a message protobuf parsed (views into `q`).
void read_infer_proto(const inference::ModelInferRequest& q, InferRequest& req,
                      std::vector<std::string_view>& raw);

// Checks the inputs that one of the readers filled, in order (the raw_input_contents count;
// per input its datatype, at most 8 dimensions, the element count against `max_elements`, the
// raw size), and points each input's data at its raw contents, or, when the request has no
// raw contents, at its typed contents from `typed` converted into req.storage. Throws
// RequestError(InvalidArgument) naming the input.
void bind_infer_inputs(InferRequest& req, const std::vector<std::string_view>& raw,
                       const inference::ModelInferRequest* typed, int64_t max_elements);

// The ModelInferResponse for `resp` (model, version, id; output "probability" FP32
// [rows, 1] in raw_output_contents), byte for byte what protobuf serializes for it:
// infer_response_size bytes written by write_infer_response.
size_t infer_response_size(const InferResponse& resp);
void write_infer_response(const InferResponse& resp, char* out);

}  // namespace dlrec::serve
