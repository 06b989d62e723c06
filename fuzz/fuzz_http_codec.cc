// Fuzz target: the KServe v2 HTTP infer body (serve::parse_infer_request: the JSON header,
// JSON "data" of every datatype, Triton's binary tensor extension with
// Inference-Header-Content-Length), then what the server does next with a parsed request that
// needs no model (BYTES elements split, element counts) and the response encoder.
//
// Input: 1 selector byte, then the body.
//   selector 0: no Inference-Header-Content-Length header;
//   otherwise the header's value is the offset just after the body's first "}\n" (where the
//   seeds end their JSON part), else of its first 0x00 byte, else the whole body's size.
#include <algorithm>
#include <cstring>
#include <string_view>

#include "dlrec/serve/http_codec.h"
#include "dlrec/serve/inference.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dlrec;
  using namespace dlrec::serve;
  fuzz::Bytes in(data, size);
  const uint8_t sel = in.byte();
  const std::string_view body = in.rest();
  int64_t header_length = -1;
  if (sel != 0) {
    size_t cut = body.find("}\n");
    if (cut != std::string_view::npos) cut += 2;
    else cut = std::min(body.find('\0'), body.size());
    header_length = static_cast<int64_t>(cut);
  }
  HttpLimits limits;
  limits.max_tensor_elements = 1 << 20;  // the fuzzer's memory, not the server's default
  InferRequest req;
  if (!fuzz::guarded("http_codec", [&] { req = parse_infer_request(body, header_length, limits); }))
    return 0;
  for (const InputTensor& t : req.inputs) {
    // Inputs point into the body or into req.storage: touch every byte (ASan checks them).
    volatile char sink = 0;
    for (char c : t.data) sink = sink ^ c;
    (void)sink;
    fuzz::guarded("http_codec", [&] {
      const int64_t count = element_count(t.shape, t.name, limits.max_tensor_elements);
      const int esize = datatype_size(t.datatype);
      if (esize == 0) {
        split_bytes(t.data, count, t.name);
      } else if (static_cast<int64_t>(t.data.size()) != count * esize) {
        fuzz::finding("http_codec", "a parsed input's data size does not match its shape");
      }
    });
  }
  InferResponse resp;
  resp.model = "m";
  resp.version = "1";
  resp.id = req.id;
  resp.rows = 2;
  resp.probability = {0.25f, 0.75f};
  fuzz::guarded("http_codec", [&] { encode_infer_response(resp, req); });
  return 0;
}
