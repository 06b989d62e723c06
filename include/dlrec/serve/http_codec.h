// The KServe v2 HTTP/REST inference body, with Triton's binary tensor extension.
//
// Request body: a JSON object; when the Inference-Header-Content-Length header is present, the
// JSON is that many leading bytes and the rest holds the binary data of the inputs whose
// "parameters" carry "binary_data_size", in input order. Response: JSON, or JSON followed by the
// binary outputs (those requested with "binary_data": true, or all when the request sets
// "binary_data_output": true and names no outputs).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dlrec/serve/inference.h"

namespace dlrec::serve {

struct HttpLimits {
  int64_t max_tensor_elements = int64_t{1} << 26;
};

// Parses an infer body; `header_length` < 0 when the header is absent. The request's inputs
// may point into `body`, which must outlive it. Throws RequestError(InvalidArgument) for
// malformed JSON, wrong types, sizes that do not add up, and limits exceeded.
InferRequest parse_infer_request(std::string_view body, int64_t header_length,
                                 const HttpLimits& limits = {});

struct HttpBody {
  std::string body;
  std::string content_type;
  int64_t header_length = -1;  // set when binary data follows the JSON
};
HttpBody encode_infer_response(const InferResponse& resp, const InferRequest& req);

}  // namespace dlrec::serve
