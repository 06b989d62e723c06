// Fuzz target: the gRPC ModelInfer wire reader (serve::read_infer_wire, bytes read in place from
// the transport's slices) and bind_infer_inputs, against protobuf itself: when the wire reader
// says Parsed, protobuf must parse the same bytes and both paths must give the same request
// (model, version, id, inputs with their data, outputs) or the same error. When it says
// Unusual, the protobuf path runs, as the server does. The message is cut into segments, each
// a separate heap allocation (a read across a cut is caught by ASan and by the comparison).
//
// Input: 1 byte: bits 0-2 number of cuts, bit 3 gather tensors that span segments into
// buffers of the caller (the GatherTarget the server passes); then 2 bytes per cut (its
// offset, modulo the message size + 1); then the serialized message.
#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "dlrec/serve/infer_wire.h"
#include "dlrec/serve/request_error.h"
#include "fuzz_util.h"
#include "grpc_service.pb.h"

namespace {

using namespace dlrec;
using namespace dlrec::serve;
constexpr const char* kTarget = "infer_wire";
constexpr int64_t kMaxElements = 1 << 20;

struct Outcome {
  std::string error;  // the RequestError's message when binding failed
  InferRequest req;   // inputs' data copied into req.storage (outlives the parser's buffers)
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const RequestError& e) {
    return std::to_string(static_cast<int>(e.status())) + ": " + e.what();
  }
  return {};
}

void own_data(const InferRequest& from, Outcome& o) {
  o.req.model = from.model;
  o.req.version = from.version;
  o.req.id = from.id;
  o.req.outputs = from.outputs;
  o.req.inputs = from.inputs;
  for (auto& t : o.req.inputs) {
    o.req.storage.emplace_back(t.data);
    t.data = o.req.storage.back();
  }
}

void expect_same(const Outcome& a, const Outcome& b) {
  if (a.error != b.error)
    fuzz::finding(kTarget, "wire and protobuf paths disagree on the error: '" + a.error +
                               "' vs '" + b.error + "'");
  if (!a.error.empty()) return;
  bool same = a.req.model == b.req.model && a.req.version == b.req.version &&
              a.req.id == b.req.id && a.req.inputs.size() == b.req.inputs.size() &&
              a.req.outputs.size() == b.req.outputs.size();
  for (size_t i = 0; same && i < a.req.inputs.size(); ++i) {
    const auto &x = a.req.inputs[i], &y = b.req.inputs[i];
    same = x.name == y.name && x.datatype == y.datatype && x.shape == y.shape && x.data == y.data;
  }
  for (size_t i = 0; same && i < a.req.outputs.size(); ++i)
    same = a.req.outputs[i].name == b.req.outputs[i].name;
  if (!same) fuzz::finding(kTarget, "wire and protobuf paths read different requests");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string field with invalid UTF-8 it rejects; that is its answer here,
  // not news (a null handler drops the lines).
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  fuzz::Bytes in(data, size);
  const uint8_t sel = in.byte();
  std::vector<size_t> cuts;
  for (int i = 0; i < (sel & 7); ++i) cuts.push_back(in.byte() | size_t{in.byte()} << 8);
  const std::string msg(in.rest());
  for (size_t& c : cuts) c %= msg.size() + 1;
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string> pieces;
  size_t at = 0;
  for (size_t c : cuts) {
    pieces.push_back(msg.substr(at, c - at));
    at = c;
  }
  pieces.push_back(msg.substr(at));
  std::vector<WireSegment> segs;
  for (const auto& p : pieces) segs.push_back({p.data(), p.size()});

  std::deque<std::string> model_buffers;  // where the GatherTarget puts spanning tensors
  GatherTarget target;
  if (sel & 8)
    target = [&](size_t, const InputTensor&, size_t bytes) {
      model_buffers.emplace_back(bytes, '\0');
      return model_buffers.back().data();
    };

  InferWireScratch scratch;
  InferRequest wire_req;
  std::vector<std::string_view> raw;
  WireRead how = WireRead::Unusual;
  // Twice with the same scratch and request, as the server reuses them: the same outcome.
  Outcome first;
  for (int round = 0; round < 2; ++round) {
    wire_req = InferRequest();
    raw.clear();
    how = read_infer_wire(segs.data(), segs.size(), wire_req, raw, scratch, target);
    if (how == WireRead::Unusual) break;
    Outcome o;
    o.error = error_of([&] { bind_infer_inputs(wire_req, raw, nullptr, kMaxElements); });
    own_data(wire_req, o);
    if (round == 0) first = std::move(o);
    else expect_same(first, o);
  }

  inference::ModelInferRequest q;
  const bool parsed = q.ParseFromString(msg);
  if (how == WireRead::Parsed && !parsed)
    fuzz::finding(kTarget, "the wire reader parsed a message protobuf rejects");
  if (!parsed) return 0;
  InferRequest proto_req;
  std::vector<std::string_view> praw;
  Outcome by_proto;
  fuzz::guarded(kTarget, [&] {
    read_infer_proto(q, proto_req, praw);
    by_proto.error = error_of([&] { bind_infer_inputs(proto_req, praw, &q, kMaxElements); });
    own_data(proto_req, by_proto);
  });
  if (how == WireRead::Parsed) expect_same(by_proto, first);
  return 0;
}
