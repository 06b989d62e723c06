// Protocol-neutral inference requests and responses, and the tensor contract (docs/SERVING.md).
//
// Both front ends (HTTP/JSON with binary tensors, gRPC) turn a request into InferRequest whose
// input data is in the binary wire layout of the KServe v2 protocol: row-major, little-endian,
// BYTES elements each as a 4-byte little-endian length followed by the bytes.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace dlrec::serve {

struct InputTensor {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::string_view data;  // wire layout; points into the request body or InferRequest::storage
};

struct RequestedOutput {
  std::string name;
  bool binary = false;  // HTTP: return as binary data (Triton's binary tensor extension)
};

struct InferRequest {
  std::string model, version, id;
  std::vector<InputTensor> inputs;
  std::vector<RequestedOutput> outputs;  // empty: all outputs
  bool binary_output = false;            // HTTP: request-level "binary_data_output"
  std::deque<std::string> storage;       // owns converted tensor data (stable addresses)
};

struct InferResponse {
  std::string model, version, id;
  int64_t rows = 0;
  std::vector<float> probability;  // output "probability", FP32 [rows, 1]
};

// Size in bytes of one element of a fixed-size datatype; 0 for BYTES, -1 when unknown.
int datatype_size(const std::string& datatype);
// Splits BYTES wire data into `count` elements; throws RequestError(InvalidArgument) naming
// `tensor` if the data does not hold exactly `count` well-formed elements.
std::vector<std::string_view> split_bytes(std::string_view data, int64_t count,
                                          const std::string& tensor);
// Product of the dims; throws on negative dims or overflow beyond `limit` elements.
int64_t element_count(const std::vector<int64_t>& shape, const std::string& tensor,
                      int64_t limit);

}  // namespace dlrec::serve
