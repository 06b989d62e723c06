#include "dlrec/serve/inference.h"

#include <cstring>
#include <limits>

#include "dlrec/serve/request_error.h"

namespace dlrec::serve {

int datatype_size(const std::string& dt) {
  if (dt == "BOOL" || dt == "INT8" || dt == "UINT8") return 1;
  if (dt == "INT16" || dt == "UINT16" || dt == "FP16" || dt == "BF16") return 2;
  if (dt == "INT32" || dt == "UINT32" || dt == "FP32") return 4;
  if (dt == "INT64" || dt == "UINT64" || dt == "FP64") return 8;
  if (dt == "BYTES") return 0;
  return -1;
}

std::vector<std::string_view> split_bytes(std::string_view data, int64_t count,
                                          const std::string& tensor) {
  std::vector<std::string_view> out;
  out.reserve(static_cast<size_t>(count));
  size_t pos = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (data.size() - pos < 4)
      request_fail(Status::InvalidArgument, "input '", tensor, "': BYTES data holds ", i,
                   " elements; the shape needs ", count);
    uint32_t len = 0;
    std::memcpy(&len, data.data() + pos, 4);  // little-endian hosts only (x86-64, aarch64)
    pos += 4;
    if (data.size() - pos < len)
      request_fail(Status::InvalidArgument, "input '", tensor, "': BYTES element ", i,
                   " claims ", len, " bytes but only ", data.size() - pos, " remain");
    out.emplace_back(data.data() + pos, len);
    pos += len;
  }
  if (pos != data.size())
    request_fail(Status::InvalidArgument, "input '", tensor, "': BYTES data has ",
                 data.size() - pos, " bytes beyond the ", count, " elements of its shape");
  return out;
}

int64_t element_count(const std::vector<int64_t>& shape, const std::string& tensor,
                      int64_t limit) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) request_fail(Status::InvalidArgument, "input '", tensor, "': negative dimension");
    if (d != 0 && n > limit / d)
      request_fail(Status::InvalidArgument, "input '", tensor, "' has more than ", limit,
                   " elements");
    n *= d;
  }
  if (n > limit)
    request_fail(Status::InvalidArgument, "input '", tensor, "' has more than ", limit,
                 " elements");
  return n;
}

}  // namespace dlrec::serve
