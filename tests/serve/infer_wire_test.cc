// The ModelInfer wire reader and writer (include/dlrec/serve/infer_wire.h) against protobuf:
// the same bytes, split into segments every which way, must give the same request (or the
// same error) by both paths; whatever the reader leaves to protobuf must be what it cannot
// read; the response writer must produce protobuf's bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dlrec/serve/infer_wire.h"
#include "dlrec/serve/request_error.h"
#include "grpc_service.pb.h"

using namespace dlrec;
using namespace dlrec::serve;

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 26;

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// A typical encoded request: dense FP32 [rows, nd] and cat_t INT64 [rows], raw contents.
inference::ModelInferRequest encoded_request(int64_t rows, int nd, int ncat, uint32_t seed) {
  std::mt19937 rng(seed);
  inference::ModelInferRequest q;
  q.set_model_name("m");
  q.set_model_version("1");
  q.set_id("req-" + std::to_string(seed));
  auto* d = q.add_inputs();
  d->set_name("dense");
  d->set_datatype("FP32");
  d->add_shape(rows);
  d->add_shape(nd);
  std::vector<float> dense(static_cast<size_t>(rows * nd));
  for (auto& x : dense) x = static_cast<float>(rng() % 1000) / 7.f;
  q.add_raw_input_contents(bytes_of(dense.data(), dense.size() * 4));
  for (int t = 0; t < ncat; ++t) {
    auto* c = q.add_inputs();
    c->set_name("cat_" + std::to_string(t));
    c->set_datatype("INT64");
    c->add_shape(rows);
    std::vector<int64_t> ids(static_cast<size_t>(rows));
    for (auto& x : ids) x = static_cast<int64_t>(rng() % 100);
    q.add_raw_input_contents(bytes_of(ids.data(), ids.size() * 8));
  }
  q.add_outputs()->set_name("probability");
  return q;
}

// The outcome of one path: the request after bind_infer_inputs, or the error.
struct Outcome {
  bool unusual = false;  // wire path only: left to protobuf
  std::string error;     // "status: message" when bind (or protobuf) failed
  InferRequest req;
};

std::string describe_error() {
  try {
    throw;
  } catch (const RequestError& e) {
    return std::to_string(static_cast<int>(e.status())) + ": " + e.what();
  }
}

Outcome by_proto(const std::string& bytes) {
  Outcome o;
  inference::ModelInferRequest q;
  if (!q.ParseFromString(bytes)) {
    o.error = "unparsable";
    return o;
  }
  std::vector<std::string_view> raw;
  read_infer_proto(q, o.req, raw);
  try {
    bind_infer_inputs(o.req, raw, &q, kMaxElements);
  } catch (...) {
    o.error = describe_error();
  }
  // The views point into `q`: copy the data so that the outcome outlives it.
  for (auto& t : o.req.inputs) {
    o.req.storage.emplace_back(t.data);
    t.data = o.req.storage.back();
  }
  return o;
}

// `bytes` cut at the given offsets into segments (each a separate allocation, so that a view
// across a cut would be caught by the sanitizers and by the comparison).
Outcome by_wire(const std::string& bytes, const std::vector<size_t>& cuts,
                InferWireScratch& scratch, InferRequest& req) {
  std::vector<std::string> pieces;
  size_t at = 0;
  for (size_t c : cuts) {
    pieces.push_back(bytes.substr(at, c - at));
    at = c;
  }
  pieces.push_back(bytes.substr(at));
  std::vector<WireSegment> segs;
  for (const auto& p : pieces) segs.push_back({p.data(), p.size()});
  Outcome o;
  std::vector<std::string_view> raw;
  if (read_infer_wire(segs.data(), segs.size(), req, raw, scratch) == WireRead::Unusual) {
    o.unusual = true;
    return o;
  }
  try {
    bind_infer_inputs(req, raw, nullptr, kMaxElements);
  } catch (...) {
    o.error = describe_error();
  }
  o.req.model = req.model;
  o.req.version = req.version;
  o.req.id = req.id;
  o.req.inputs = req.inputs;
  o.req.outputs = req.outputs;
  for (auto& t : o.req.inputs) {
    o.req.storage.emplace_back(t.data);
    t.data = o.req.storage.back();
  }
  return o;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_FALSE(b.unusual);
  EXPECT_EQ(a.error, b.error);
  if (!a.error.empty()) return;  // inputs may be partly bound; the error is what counts
  EXPECT_EQ(a.req.model, b.req.model);
  EXPECT_EQ(a.req.version, b.req.version);
  EXPECT_EQ(a.req.id, b.req.id);
  ASSERT_EQ(a.req.inputs.size(), b.req.inputs.size());
  for (size_t i = 0; i < a.req.inputs.size(); ++i) {
    const auto &x = a.req.inputs[i], &y = b.req.inputs[i];
    EXPECT_EQ(x.name, y.name) << i;
    EXPECT_EQ(x.datatype, y.datatype) << i;
    EXPECT_EQ(x.shape, y.shape) << i;
    EXPECT_EQ(x.data, y.data) << i;
  }
  ASSERT_EQ(a.req.outputs.size(), b.req.outputs.size());
  for (size_t i = 0; i < a.req.outputs.size(); ++i)
    EXPECT_EQ(a.req.outputs[i].name, b.req.outputs[i].name);
}

// Both paths on `bytes` cut at `cuts`; the wire path must read it (not Unusual).
void check_read(const std::string& bytes, const std::vector<size_t>& cuts,
                const std::string& what) {
  InferWireScratch scratch;
  InferRequest req;
  expect_same(by_proto(bytes), by_wire(bytes, cuts, scratch, req), what);
}

// Hand-made wire bytes.
std::string varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s += static_cast<char>(v | 0x80);
    v >>= 7;
  }
  s += static_cast<char>(v);
  return s;
}
std::string field_len(int field, const std::string& body) {
  return varint(static_cast<uint64_t>(field) << 3 | 2) + varint(body.size()) + body;
}
std::string field_varint(int field, uint64_t v) {
  return varint(static_cast<uint64_t>(field) << 3) + varint(v);
}

}  // namespace

TEST(InferWire, EncodedRequestEqualsProtobufAtEveryCut) {
  const std::string bytes = encoded_request(3, 2, 3, 1).SerializeAsString();
  check_read(bytes, {}, "one segment");
  for (size_t c = 0; c <= bytes.size(); ++c) check_read(bytes, {c}, "cut at " + std::to_string(c));
  // Many cuts, some empty segments.
  std::mt19937 rng(7);
  for (int k = 0; k < 50; ++k) {
    std::vector<size_t> cuts;
    for (int j = 0; j < 8; ++j) cuts.push_back(rng() % (bytes.size() + 1));
    std::sort(cuts.begin(), cuts.end());
    check_read(bytes, cuts, "random cuts " + std::to_string(k));
  }
}

TEST(InferWire, BigRequestInTransportSizedSlices) {
  // 4096 rows, 13 dense, 26 ids: ~1 MB, cut as gRPC delivers it (64 KiB slices, an odd first).
  const std::string bytes = encoded_request(4096, 13, 26, 2).SerializeAsString();
  std::vector<size_t> cuts;
  for (size_t c = 7669; c < bytes.size(); c += 65536) cuts.push_back(c);
  check_read(bytes, cuts, "64 KiB slices");
  check_read(bytes, {}, "one slice");
  // The same scratch and request reused for a smaller and then a bigger message.
  InferWireScratch scratch;
  InferRequest req;
  const std::string small = encoded_request(5, 13, 26, 3).SerializeAsString();
  expect_same(by_proto(bytes), by_wire(bytes, cuts, scratch, req), "first");
  expect_same(by_proto(small), by_wire(small, {100, 200}, scratch, req), "smaller, reused");
  expect_same(by_proto(bytes), by_wire(bytes, cuts, scratch, req), "bigger again, reused");
}

TEST(InferWire, RareButPlainFieldsEqualProtobuf) {
  // No outputs, no id/version, empty strings, zero-row tensors, unpacked and mixed shapes,
  // repeated model_name (the last wins), overlong varints, negative dimensions.
  inference::ModelInferRequest q;
  q.set_model_name("x");
  auto* in = q.add_inputs();
  in->set_name("cat_0");
  in->set_datatype("INT64");
  in->add_shape(0);
  q.add_raw_input_contents("");
  check_read(q.SerializeAsString(), {1}, "zero rows, no outputs");

  std::string input = field_len(1, "cat_1") + field_len(2, "INT32") + field_varint(3, 2) +
                      field_len(3, varint(1));  // shape [2] unpacked then [1] packed
  std::string msg = field_len(1, "first") + field_len(5, input) +
                    field_len(7, std::string(8, '\x01')) + field_len(1, "second") +
                    field_len(3, "");
  check_read(msg, {}, "unpacked + packed shape, repeated model_name");
  // A dimension of -3 (10-byte varint) and 1 written with a redundant continuation byte.
  input = field_len(1, "dense") + field_len(2, "FP32") +
          field_len(3, varint(static_cast<uint64_t>(int64_t{-3})) + std::string("\x81\x00", 2));
  msg = field_len(5, input) + field_len(7, "abcd");
  check_read(msg, {3, 9}, "negative dimension, overlong varint");
  // The empty message.
  check_read("", {}, "empty");
}

TEST(InferWire, BindErrorsEqualProtobufs) {
  auto base = [] { return encoded_request(2, 2, 2, 4); };
  std::vector<std::pair<std::string, inference::ModelInferRequest>> cases;
  {
    auto q = base();
    q.add_raw_input_contents("extra");
    cases.emplace_back("raw count", q);
  }
  {
    auto q = base();
    q.mutable_inputs(1)->set_datatype("INT65");
    cases.emplace_back("unknown datatype", q);
  }
  {
    auto q = base();
    for (int i = 0; i < 8; ++i) q.mutable_inputs(2)->add_shape(1);
    cases.emplace_back("9 dimensions", q);
  }
  {
    auto q = base();
    q.mutable_raw_input_contents(0)->pop_back();
    cases.emplace_back("raw size", q);
  }
  {
    auto q = base();
    q.mutable_inputs(0)->set_shape(0, -2);
    cases.emplace_back("negative dimension", q);
  }
  {
    auto q = base();
    q.mutable_inputs(0)->set_shape(0, int64_t{1} << 40);
    cases.emplace_back("too many elements", q);
  }
  for (auto& [what, q] : cases) {
    const std::string bytes = q.SerializeAsString();
    InferWireScratch scratch;
    InferRequest req;
    Outcome w = by_wire(bytes, {bytes.size() / 2}, scratch, req);
    Outcome p = by_proto(bytes);
    EXPECT_FALSE(p.error.empty()) << what;
    EXPECT_NE(p.error.find(std::to_string(static_cast<int>(Status::InvalidArgument))),
              std::string::npos)
        << what << ": " << p.error;
    expect_same(p, w, what);
  }
}

TEST(InferWire, LeavesWhatItDoesNotReadToProtobuf) {
  auto unusual = [](const std::string& bytes) {
    InferWireScratch scratch;
    InferRequest req;
    std::vector<std::string_view> raw;
    WireSegment seg{bytes.data(), bytes.size()};
    return read_infer_wire(&seg, 1, req, raw, scratch) == WireRead::Unusual;
  };
  const auto plain = encoded_request(2, 1, 1, 5);
  EXPECT_FALSE(unusual(plain.SerializeAsString()));
  {
    auto q = plain;
    (*q.mutable_parameters())["priority"].set_int64_param(1);
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "request parameters";
  }
  {
    auto q = plain;
    (*q.mutable_inputs(0)->mutable_parameters())["x"].set_bool_param(true);
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "input parameters";
  }
  {
    auto q = plain;
    (*q.mutable_outputs(0)->mutable_parameters())["binary_data"].set_bool_param(true);
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "output parameters";
  }
  {
    auto q = plain;
    q.clear_raw_input_contents();
    for (int i = 0; i < 2; ++i) q.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.f);
    q.mutable_inputs(1)->mutable_contents()->add_int64_contents(1);
    q.mutable_inputs(1)->mutable_contents()->add_int64_contents(2);
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "typed contents";
  }
  {
    auto q = plain;
    q.clear_raw_input_contents();
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "inputs without any contents";
  }
  {
    auto q = plain;
    q.set_model_name("m\xc3\xa9");
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "non-ASCII model name";
    q.set_model_name("m");
    q.mutable_inputs(0)->set_name("d\xff");  // not UTF-8 either: protobuf must refuse it
    EXPECT_TRUE(unusual(q.SerializeAsString())) << "non-ASCII input name";
  }
  const std::string bytes = plain.SerializeAsString();
  EXPECT_TRUE(unusual(bytes + field_varint(15, 1))) << "unknown field";
  EXPECT_TRUE(unusual(bytes + field_varint(1, 1))) << "model_name as a varint";
  EXPECT_TRUE(unusual(bytes + varint(1 << 3 | 3))) << "a group";
  EXPECT_TRUE(unusual(bytes + varint(0 << 3 | 2) + varint(0))) << "field number 0";
  // A varint of 11 bytes.
  EXPECT_TRUE(unusual(std::string(10, '\x80') + std::string(1, '\x01')));
}

// fuzz_infer_wire's differential finding: protobuf reads a tag or a length in at most 5 bytes
// (ReadTag, ReadSize) and refuses a longer encoding even of a small number; a 64-bit value (the
// shape's) may take 10. The wire reader took 10 bytes everywhere, so it parsed messages that
// protobuf refuses, such as 0a 80 00 0a 80 80 80 80 80 00 (model_name "" twice, the second
// length 0 in 6 bytes).
TEST(InferWire, OverLongTagsAndLengthsAreRefusedAsProtobufRefusesThem) {
  auto wire = [](const std::string& bytes) {
    InferWireScratch scratch;
    InferRequest req;
    std::vector<std::string_view> raw;
    WireSegment seg{bytes.data(), bytes.size()};
    return read_infer_wire(&seg, 1, req, raw, scratch);
  };
  auto proto_ok = [](const std::string& bytes) {
    inference::ModelInferRequest q;
    return q.ParseFromString(bytes);
  };
  // A zero in n bytes (n - 1 continuation bytes), and 10 (model_name's tag) in n bytes.
  auto zero_in = [](int n) { return std::string(n - 1, '\x80') + '\0'; };
  auto tag1_in = [](int n) {
    return n == 1 ? std::string("\x0a") : "\x8a" + std::string(n - 2, '\x80') + '\0';
  };
  for (int n = 1; n <= 10; ++n) {
    SCOPED_TRACE("encoded in " + std::to_string(n) + " bytes");
    const std::string long_len = "\x0a\x80" + std::string(1, '\0') + "\x0a" + zero_in(n);
    const std::string long_tag = tag1_in(n) + '\0';
    for (const std::string& m : {long_len, long_tag}) {
      const bool ok = proto_ok(m);
      EXPECT_EQ(ok, n <= 5);  // what the reader must follow
      EXPECT_EQ(wire(m) == WireRead::Parsed, ok);
    }
  }
  // The same inside a real request: an input's length, its name's length, its packed shape's.
  const auto q = encoded_request(2, 1, 1, 9);
  auto with_input = [&](const std::string& input_body, const std::string& len) {
    return q.SerializeAsString() + "\x2a" + len + input_body;
  };
  inference::ModelInferRequest::InferInputTensor t;
  t.set_name("x");
  t.set_datatype("FP32");
  t.add_shape(1);
  const std::string body = t.SerializeAsString();
  const std::string six_byte_len =
      varint(body.size() | 0x80).substr(0, 1) + std::string(4, '\x80') + '\0';
  ASSERT_EQ(six_byte_len.size(), 6u);
  const std::string bad = with_input(body, six_byte_len);
  EXPECT_FALSE(proto_ok(bad));
  EXPECT_NE(wire(bad), WireRead::Parsed);
  // name "x" with its length 1 in 6 bytes, inside a well-formed input
  std::string inner = "\x0a\x81\x80\x80\x80\x80" + std::string(1, '\0') + "x";
  inner += body.substr(3);  // datatype and shape as protobuf wrote them
  const std::string bad_inner = with_input(inner, varint(inner.size()));
  EXPECT_FALSE(proto_ok(bad_inner));
  EXPECT_NE(wire(bad_inner), WireRead::Parsed);
  // A packed shape element of 10 bytes is protobuf's too: both read it, or the wire reader
  // leaves it to protobuf.
  std::string shape10 =
      "\x0a\x01x\x12\x04"
      "FP32\x1a\x0a\x81" +
      std::string(8, '\x80') + '\0';
  const std::string long_shape = with_input(shape10, varint(shape10.size()));
  EXPECT_TRUE(proto_ok(long_shape));
  if (wire(long_shape) == WireRead::Parsed) {
    InferWireScratch scratch;
    InferRequest req;
    expect_same(by_proto(long_shape), by_wire(long_shape, {}, scratch, req), "10-byte shape");
  }
}

TEST(InferWire, TruncatedAndCorruptedBytesNeverReadDifferently) {
  // Whatever the wire reader accepts, protobuf must accept and read the same way; what it
  // refuses goes to protobuf (which may accept it: e.g. a prefix that ends on a field boundary).
  const std::string bytes = encoded_request(2, 2, 2, 6).SerializeAsString();
  int parsed_prefixes = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string prefix = bytes.substr(0, n);
    InferWireScratch scratch;
    InferRequest req;
    Outcome w = by_wire(prefix, {n / 3}, scratch, req);
    inference::ModelInferRequest q;
    const bool proto_ok = q.ParseFromString(prefix);
    if (!w.unusual) {
      ++parsed_prefixes;
      ASSERT_TRUE(proto_ok) << "prefix " << n;
      expect_same(by_proto(prefix), w, "prefix " + std::to_string(n));
    }
  }
  EXPECT_GT(parsed_prefixes, 0);
  std::mt19937 rng(11);
  int unusual = 0;
  for (int k = 0; k < 3000; ++k) {
    std::string b = bytes;
    for (int j = 0; j < 3; ++j) b[rng() % b.size()] = static_cast<char>(rng());
    InferWireScratch scratch;
    InferRequest req;
    Outcome w = by_wire(b, {rng() % (b.size() + 1)}, scratch, req);
    if (w.unusual) {
      ++unusual;
      continue;
    }
    inference::ModelInferRequest q;
    ASSERT_TRUE(q.ParseFromString(b)) << "mutation " << k;
    expect_same(by_proto(b), w, "mutation " + std::to_string(k));
  }
  EXPECT_GT(unusual, 0);
  EXPECT_LT(unusual, 3000) << "no mutated message was read by the wire reader";
}

TEST(InferWire, ResponseBytesAreProtobufs) {
  for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{127}, int64_t{128}, int64_t{4096},
                       int64_t{70000}}) {
    for (int names = 0; names < 2; ++names) {
      InferResponse r;
      r.model = names ? "dlrm" : "";
      r.version = names ? "12" : "";
      r.id = names ? "abc" : "";
      r.rows = rows;
      for (int64_t i = 0; i < rows; ++i) r.probability.push_back(static_cast<float>(i) / 3.f);
      inference::ModelInferResponse m;
      m.set_model_name(r.model);
      m.set_model_version(r.version);
      m.set_id(r.id);
      auto* out = m.add_outputs();
      out->set_name("probability");
      out->set_datatype("FP32");
      out->add_shape(rows);
      out->add_shape(1);
      m.add_raw_output_contents(bytes_of(r.probability.data(), r.probability.size() * 4));
      std::string mine(infer_response_size(r), '\0');
      write_infer_response(r, mine.data());
      EXPECT_EQ(mine, m.SerializeAsString()) << rows << " rows, names " << names;
    }
  }
}

TEST(InferWire, SplitTensorsGoWhereTheTargetSays) {
  // 600 rows: 26 tensors of 4800 bytes, cut every 4096 bytes, so that most span a cut.
  const auto q = encoded_request(600, 3, 26, 8);
  const std::string bytes = q.SerializeAsString();
  std::vector<std::string> pieces;
  for (size_t at = 0; at < bytes.size(); at += 4096) pieces.push_back(bytes.substr(at, 4096));
  std::vector<WireSegment> segs;
  for (const auto& p : pieces) segs.push_back({p.data(), p.size()});
  std::vector<std::vector<char>> buffers(q.raw_input_contents_size());
  std::vector<std::string> names(q.raw_input_contents_size());
  int calls = 0;
  GatherTarget target = [&](size_t k, const InputTensor& in, size_t n) -> char* {
    ++calls;
    names[k] = in.name;
    EXPECT_EQ(n, q.raw_input_contents(static_cast<int>(k)).size());
    if (k % 2) return nullptr;  // odd ones: the reader's own gather buffer
    buffers[k].resize(n);
    return buffers[k].data();
  };
  InferWireScratch scratch;
  InferRequest req;
  std::vector<std::string_view> raw;
  ASSERT_EQ(read_infer_wire(segs.data(), segs.size(), req, raw, scratch, target),
            WireRead::Parsed);
  EXPECT_GT(calls, 10);
  ASSERT_EQ(raw.size(), static_cast<size_t>(q.raw_input_contents_size()));
  for (size_t k = 0; k < raw.size(); ++k) {
    EXPECT_EQ(raw[k], q.raw_input_contents(static_cast<int>(k))) << k;
    if (!names[k].empty()) {  // it spanned a cut: the target was asked, with its input
      EXPECT_EQ(names[k], q.inputs(static_cast<int>(k)).name());
      if (k % 2 == 0) EXPECT_EQ(raw[k].data(), buffers[k].data()) << k;
      else EXPECT_EQ(raw[k].data(), scratch.gathered[k].data()) << k;
    } else {  // within one segment: in place
      bool inside = false;
      for (const auto& s : segs) inside |= raw[k].data() >= s.data && raw[k].data() < s.data + s.size;
      EXPECT_TRUE(inside) << k;
    }
  }
  // Raw contents before the inputs (legal, if unusual): the target is told nothing of them.
  std::string reordered;
  for (const auto& c : q.raw_input_contents()) reordered += field_len(7, c);
  for (const auto& in : q.inputs()) reordered += field_len(5, in.SerializeAsString());
  std::vector<std::string> rpieces;
  for (size_t at = 0; at < reordered.size(); at += 4096) rpieces.push_back(reordered.substr(at, 4096));
  segs.clear();
  for (const auto& p : rpieces) segs.push_back({p.data(), p.size()});
  names.assign(names.size(), "?");
  ASSERT_EQ(read_infer_wire(segs.data(), segs.size(), req, raw, scratch, target),
            WireRead::Parsed);
  for (size_t k = 0; k < raw.size(); ++k) {
    EXPECT_EQ(raw[k], q.raw_input_contents(static_cast<int>(k))) << k;
    EXPECT_TRUE(names[k] == "?" || names[k].empty()) << k << " " << names[k];
  }
  check_read(reordered, {4096, 8192, 20000}, "raw contents first");
}

TEST(InferWire, ManySmallTensorsSplitAtEveryByte) {
  // 1 row, 30 tensors of 8 bytes: each lies across segments (one byte each), so each is
  // gathered, into buffers short enough to live inside a std::string: the views must survive
  // the gathering of the ones after them.
  const std::string bytes = encoded_request(1, 1, 29, 9).SerializeAsString();
  std::vector<size_t> cuts;
  for (size_t c = 1; c < bytes.size(); ++c) cuts.push_back(c);
  check_read(bytes, cuts, "every byte");
  InferWireScratch scratch;
  InferRequest req;
  for (int k = 0; k < 3; ++k)  // reused scratch
    expect_same(by_proto(bytes), by_wire(bytes, cuts, scratch, req), "reused " + std::to_string(k));
}
