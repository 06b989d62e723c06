#include <gtest/gtest.h>

#include <cstring>

#include "dlrec/core/config.h"
#include "dlrec/serve/http_codec.h"
#include "dlrec/serve/request_error.h"

using namespace dlrec;
using namespace dlrec::serve;

namespace {

void expect_invalid(std::string_view body, int64_t header_length, const std::string& needle) {
  try {
    parse_infer_request(body, header_length);
    ADD_FAILURE() << "accepted: " << body.substr(0, 200);
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(HttpCodec, ParsesJsonTensors) {
  InferRequest r = parse_infer_request(
      R"({"id": "7", "inputs": [
            {"name": "dense", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2.5], [3, 4]]},
            {"name": "cat_0", "datatype": "INT64", "shape": [2], "data": [5, 6]},
            {"name": "C1", "datatype": "BYTES", "shape": [2, 1], "data": ["ab", ""]}],
          "outputs": [{"name": "probability", "parameters": {"binary_data": true}}]})",
      -1);
  EXPECT_EQ(r.id, "7");
  ASSERT_EQ(r.inputs.size(), 3u);
  ASSERT_EQ(r.inputs[0].data.size(), 16u);
  float f[4];
  std::memcpy(f, r.inputs[0].data.data(), 16);
  EXPECT_EQ(f[1], 2.5f);
  EXPECT_EQ(f[3], 4.f);
  int64_t ids[2];
  std::memcpy(ids, r.inputs[1].data.data(), 16);
  EXPECT_EQ(ids[1], 6);
  auto items = split_bytes(r.inputs[2].data, 2, "C1");
  EXPECT_EQ(items[0], "ab");
  EXPECT_EQ(items[1], "");
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(r.outputs[0].binary);
}

TEST(HttpCodec, ParsesBinaryTensors) {
  std::string head =
      R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
                     {"name": "b", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}],
          "parameters": {"binary_data_output": true}})";
  std::string body = head;
  float a[2] = {1.5f, -2.f};
  body.append(reinterpret_cast<const char*>(a), 8);
  uint32_t len = 3;
  body.append(reinterpret_cast<const char*>(&len), 4);
  body += "xyz";
  InferRequest r = parse_infer_request(body, static_cast<int64_t>(head.size()));
  EXPECT_TRUE(r.binary_output);
  float got[2];
  std::memcpy(got, r.inputs[0].data.data(), 8);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(split_bytes(r.inputs[1].data, 1, "b")[0], "xyz");

  // Binary size mismatches.
  expect_invalid(body.substr(0, body.size() - 1), static_cast<int64_t>(head.size()), "exceeds");
  expect_invalid(body + "!", static_cast<int64_t>(head.size()), "no input claims");
  expect_invalid(body, static_cast<int64_t>(body.size()) + 5, "Inference-Header-Content-Length");
  expect_invalid(head, -1, "Inference-Header-Content-Length header is missing");
}

TEST(HttpCodec, RejectsMalformedRequests) {
  expect_invalid("{not json", -1, "malformed JSON");
  expect_invalid("[1]", -1, "JSON object");
  expect_invalid(R"({"inputs": []})", -1, "non-empty");
  expect_invalid(R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]})", -1, "name");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP17", "shape": [1], "data": [1]}]})",
                 -1, "unknown datatype");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [3], "data": [1, 2]}]})",
                 -1, "shape needs 3");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1, 2]}]})",
                 -1, "has 2 elements; its shape needs 1");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1], "data": [1]}]})",
                 -1, "negative");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "data": [1.5]}]})",
                 -1, "integers");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [9999999999]}]})",
                 -1, "out of range");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": [1]}]})",
                 -1, "strings");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": ["x"]}]})",
                 -1, "numbers");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}]})", -1,
                 "neither");
  expect_invalid(
      R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1000000, 1000000], "data": []}]})",
      -1, "more than");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}],
                     "outputs": [{"name": "probability", "parameters": {"classification": 2}}]})",
                 -1, "classification");
}

TEST(HttpCodec, SplitBytesChecksLengths) {
  std::string d;
  uint32_t n = 10;
  d.append(reinterpret_cast<const char*>(&n), 4);
  d += "abc";
  EXPECT_THROW(split_bytes(d, 1, "x"), RequestError);
  EXPECT_THROW(split_bytes("", 1, "x"), RequestError);
  EXPECT_TRUE(split_bytes("", 0, "x").empty());
}

TEST(HttpCodec, EncodesJsonAndBinaryResponses) {
  InferResponse resp;
  resp.model = "m";
  resp.version = "1";
  resp.rows = 2;
  resp.probability = {0.25f, 0.75f};
  InferRequest req;
  HttpBody j = encode_infer_response(resp, req);
  EXPECT_EQ(j.header_length, -1);
  json parsed = json::parse(j.body);
  EXPECT_EQ(parsed["outputs"][0]["data"][1].get<float>(), 0.75f);
  EXPECT_EQ(parsed["outputs"][0]["shape"], json({2, 1}));
  req.binary_output = true;
  HttpBody b = encode_infer_response(resp, req);
  ASSERT_GT(b.header_length, 0);
  json head = json::parse(b.body.substr(0, static_cast<size_t>(b.header_length)));
  EXPECT_EQ(head["outputs"][0]["parameters"]["binary_data_size"], 8);
  float got[2];
  std::memcpy(got, b.body.data() + b.header_length, 8);
  EXPECT_EQ(got[1], 0.75f);
}

// Issue 25: a body whose 'data' holds ~10,000 nested arrays or objects crashed the server (stack
// overflow); now refused by the depth limit of parse_json (64), before anything deep exists.
TEST(HttpCodec, DeeplyNestedBodiesAreRefused) {
  for (const char* open_close : {"[]", "{}"}) {
    std::string deep;
    for (int i = 0; i < 10000; ++i) deep += open_close[0] == '[' ? "[" : "{\"a\":";
    deep += "1";
    for (int i = 0; i < 10000; ++i) deep += open_close[1];
    // In 'data' an object is refused at once, arrays at the depth limit.
    expect_invalid(R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": )" +
                       deep + "}]}",
                   -1, open_close[0] == '[' ? "nested deeper than 64" : "holds an object");
    expect_invalid(R"({"parameters": {"p": )" + deep + "}}", -1, "nested deeper than 64");
  }
  // 60 levels of arrays around one number are fine (within the limit).
  std::string ok = R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": )";
  ok += std::string(60, '[') + "2" + std::string(60, ']') + "}]}";
  InferRequest r = parse_infer_request(ok, -1);
  ASSERT_EQ(r.inputs.size(), 1u);
  float v;
  std::memcpy(&v, r.inputs[0].data.data(), 4);
  EXPECT_EQ(v, 2.0f);
}

TEST(HttpCodec, DataIsReadInAnyKeyOrderAndCheckedAfterwards) {
  // 'data' before 'datatype' and 'shape': converted once the datatype is known.
  InferRequest r = parse_infer_request(
      R"({"inputs": [{"data": [[1, 2], [3, 4]], "name": "a", "shape": [2, 2], "datatype": "INT32"},
                     {"data": ["x", "yz"], "datatype": "BYTES", "name": "b", "shape": [2]}]})",
      -1);
  ASSERT_EQ(r.inputs.size(), 2u);
  int32_t a[4];
  ASSERT_EQ(r.inputs[0].data.size(), sizeof a);
  std::memcpy(a, r.inputs[0].data.data(), sizeof a);
  EXPECT_EQ(a[0], 1);
  EXPECT_EQ(a[3], 4);
  EXPECT_EQ(r.inputs[1].data, std::string("\x01\0\0\0x\x02\0\0\0yz", 11));
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1],
                   "data": [2]}]})", -1, "duplicate key 'data'");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [{}]}]})",
                 -1, "holds an object");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [null]}]})",
                 -1, "holds null");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": ["s"]}]})",
                 -1, "found a string");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": [1]}]})",
                 -1, "must hold strings");
  expect_invalid(R"({"inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [1.5]}]})",
                 -1, "expected integers");
  expect_invalid(R"({"id": "1", "id": "2", "inputs": []})", -1, "duplicate key 'id'");
  expect_invalid("{\"id\": \"\xff\", \"inputs\": []}", -1, "malformed JSON");
}

TEST(HttpCodec, ElementsBeyondTheLimitStopTheParse) {
  HttpLimits lim;
  lim.max_tensor_elements = 1000;
  std::string body = R"({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [)";
  for (int i = 0; i < 5000; ++i) body += (i ? ",1" : "1");
  body += "]}]}";
  try {
    parse_infer_request(body, -1, lim);
    ADD_FAILURE() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1000 elements"), std::string::npos) << e.what();
  }
}
