// ModelInfer messages in protobuf wire form (include/dlrec/serve/infer_wire.h).
//
// Wire format reminders: a field is a tag varint (field number << 3 | wire type) followed by a
// varint (type 0), 8 bytes (1), a length varint and that many bytes (2) or 4 bytes (5); types 3
// and 4 (groups) are obsolete. A varint is 1 to 10 bytes of 7 bits each, low bits first.
#include "dlrec/serve/infer_wire.h"

#include <algorithm>
#include <cstring>

#include "dlrec/serve/request_error.h"
#include "grpc_service.pb.h"

namespace dlrec::serve {

namespace {

// Reads across segments. Every read returns false (and the caller gives up) when the bytes end
// early or are not what the wire format allows.
class SegmentReader {
 public:
  SegmentReader(const WireSegment* segs, size_t n) : segs_(segs), n_(n) {
    for (size_t i = 0; i < n; ++i) total_ += segs[i].size;
    enter(0);
  }

  size_t pos() const { return pos_; }
  size_t total() const { return total_; }

  bool byte(uint8_t& b) {
    if (p_ == end_ && !next()) return false;
    b = static_cast<uint8_t>(*p_++);
    ++pos_;
    return true;
  }

  // At most 10 bytes; the 10th may only hold the 64th bit (protobuf's limit; anything longer
  // is left to protobuf, which rejects it).
  bool varint(uint64_t& v) {
    v = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t b;
      if (!byte(b)) return false;
      if (i == 9 && b > 1) return false;
      v |= uint64_t(b & 0x7f) << (7 * i);
      if (!(b & 0x80)) return true;
    }
    return false;
  }

  // A tag or a length as protobuf reads them (parse_context.h, ReadTag and ReadSize): at most 5
  // bytes, whatever the value (an over-long encoding of a small number such as 80 80 80 80 80
  // 00 is refused), and a length below 2^31 less protobuf's 16 slop bytes.
  bool tag(uint64_t& v) { return short_varint(v) && v <= UINT32_MAX; }
  bool size(uint64_t& v) { return short_varint(v) && v <= kMaxSize; }

  // `len` bytes: a view into the current segment when they lie in it, else copied into
  // `target()` when it gives a buffer, or into `gather` (no zero-fill: assign/append from the
  // segments).
  template <class Target>
  bool bytes(size_t len, std::string_view& out, std::string& gather, Target&& target) {
    if (len > total_ - pos_) return false;
    if (static_cast<size_t>(end_ - p_) >= len) {
      out = std::string_view(p_, len);
      p_ += len;
      pos_ += len;
      return true;
    }
    char* dst = target();
    if (!dst) {
      gather.clear();
      gather.reserve(len);
    }
    size_t left = len, at = 0;
    while (left > 0) {
      if (p_ == end_ && !next()) return false;
      const size_t k = std::min(left, static_cast<size_t>(end_ - p_));
      if (dst) std::memcpy(dst + at, p_, k);
      else gather.append(p_, k);
      p_ += k;
      pos_ += k;
      left -= k;
      at += k;
    }
    out = dst ? std::string_view(dst, len) : std::string_view(gather);
    return true;
  }
  bool bytes(size_t len, std::string_view& out, std::string& gather) {
    return bytes(len, out, gather, [] { return static_cast<char*>(nullptr); });
  }

 private:
  static constexpr uint64_t kMaxSize = INT32_MAX - 16;

  bool short_varint(uint64_t& v) {
    v = 0;
    for (int i = 0; i < 5; ++i) {
      uint8_t b;
      if (!byte(b)) return false;
      v |= uint64_t(b & 0x7f) << (7 * i);
      if (!(b & 0x80)) return true;
    }
    return false;
  }

  void enter(size_t i) {
    si_ = i;
    if (i < n_) {
      p_ = segs_[i].data;
      end_ = p_ + segs_[i].size;
    } else {
      p_ = end_ = nullptr;
    }
  }
  bool next() {
    do {
      if (si_ >= n_) return false;
      enter(si_ + 1);
    } while (si_ < n_ && p_ == end_);
    return si_ < n_;
  }

  const WireSegment* segs_;
  size_t n_;
  size_t si_ = 0;
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  size_t pos_ = 0, total_ = 0;
};

constexpr int kVarint = 0, kLen = 2;

// A string field of `len` bytes into `s`. Non-ASCII text is left to protobuf (it checks that
// strings are UTF-8).
bool read_string(SegmentReader& r, uint64_t len, std::string& s, std::string& tmp) {
  std::string_view v;
  if (!r.bytes(static_cast<size_t>(len), v, tmp)) return false;
  for (char c : v)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  s.assign(v.data(), v.size());
  return true;
}

// The length of a type-2 field, checked against the end of the enclosing message.
bool read_len(SegmentReader& r, size_t end, uint64_t& len) {
  return r.size(len) && r.pos() <= end && len <= end - r.pos();
}

// ModelInferRequest.InferInputTensor in [r.pos(), end).
bool read_input(SegmentReader& r, size_t end, InputTensor& t, std::string& tmp) {
  t.name.clear();
  t.datatype.clear();
  t.shape.clear();
  t.data = {};
  while (r.pos() < end) {
    uint64_t tag, v;
    if (!r.tag(tag) || r.pos() > end) return false;
    const uint64_t field = tag >> 3;
    const int type = static_cast<int>(tag & 7);
    if (field == 1 && type == kLen) {
      if (!read_len(r, end, v) || !read_string(r, v, t.name, tmp)) return false;
    } else if (field == 2 && type == kLen) {
      if (!read_len(r, end, v) || !read_string(r, v, t.datatype, tmp)) return false;
    } else if (field == 3 && type == kVarint) {  // shape, unpacked
      if (!r.varint(v) || r.pos() > end) return false;
      t.shape.push_back(static_cast<int64_t>(v));
    } else if (field == 3 && type == kLen) {  // shape, packed
      if (!read_len(r, end, v)) return false;
      const size_t stop = r.pos() + static_cast<size_t>(v);
      while (r.pos() < stop) {
        uint64_t d;
        if (!r.varint(d) || r.pos() > stop) return false;
        t.shape.push_back(static_cast<int64_t>(d));
      }
    } else {
      return false;  // parameters, typed contents, anything else
    }
  }
  return r.pos() == end;
}

// ModelInferRequest.InferRequestedOutputTensor in [r.pos(), end).
bool read_output(SegmentReader& r, size_t end, RequestedOutput& o, std::string& tmp) {
  o.name.clear();
  o.binary = false;
  while (r.pos() < end) {
    uint64_t tag, v;
    if (!r.tag(tag) || r.pos() > end) return false;
    if (tag != (1 << 3 | kLen)) return false;  // parameters, anything else
    if (!read_len(r, end, v) || !read_string(r, v, o.name, tmp)) return false;
  }
  return r.pos() == end;
}

template <class T>
void put_le(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  s.append(b, sizeof b);
}

// Typed contents -> the wire layout. Checks the element count against the shape.
std::string contents_to_wire(const inference::InferTensorContents& c, const std::string& dt,
                             int64_t count, const std::string& name) {
  std::string s;
  auto check = [&](int n) {
    if (n != count)
      request_fail(Status::InvalidArgument, "input '", name, "': contents hold ", n,
                   " elements; its shape needs ", count);
  };
  if (dt == "FP32") {
    check(c.fp32_contents_size());
    s.assign(reinterpret_cast<const char*>(c.fp32_contents().data()), sizeof(float) * count);
  } else if (dt == "FP64") {
    check(c.fp64_contents_size());
    s.assign(reinterpret_cast<const char*>(c.fp64_contents().data()), sizeof(double) * count);
  } else if (dt == "INT64") {
    check(c.int64_contents_size());
    s.assign(reinterpret_cast<const char*>(c.int64_contents().data()), sizeof(int64_t) * count);
  } else if (dt == "INT32") {
    check(c.int_contents_size());
    s.assign(reinterpret_cast<const char*>(c.int_contents().data()), sizeof(int32_t) * count);
  } else if (dt == "BYTES") {
    check(c.bytes_contents_size());
    for (const auto& b : c.bytes_contents()) {
      put_le<uint32_t>(s, static_cast<uint32_t>(b.size()));
      s += b;
    }
  } else {
    request_fail(Status::InvalidArgument, "input '", name, "': datatype ", dt.substr(0, 20),
                 " is not supported in typed contents (use raw_input_contents)");
  }
  return s;
}

size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

char* put_varint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

// A type-2 field: tag, length, bytes (protobuf leaves out empty strings of proto3).
size_t len_field_size(size_t len) { return 1 + varint_size(len) + len; }
char* put_len_field(char* p, int field, const void* data, size_t len) {
  p = put_varint(p, static_cast<uint64_t>(field) << 3 | kLen);
  p = put_varint(p, len);
  if (len > 0) std::memcpy(p, data, len);  // (data may be null when empty: 0 rows)
  return p + len;
}

constexpr std::string_view kOutName = "probability", kOutType = "FP32";

// InferOutputTensor {name, datatype, shape [rows, 1] packed}: its size without tag and length.
size_t output_tensor_size(int64_t rows) {
  const size_t shape = varint_size(static_cast<uint64_t>(rows)) + 1;
  return len_field_size(kOutName.size()) + len_field_size(kOutType.size()) +
         len_field_size(shape);
}

}  // namespace

WireRead read_infer_wire(const WireSegment* segs, size_t n, InferRequest& req,
                         std::vector<std::string_view>& raw, InferWireScratch& scratch,
                         const GatherTarget& target) {
  SegmentReader r(segs, n);
  req.model.clear();
  req.version.clear();
  req.id.clear();
  req.binary_output = false;
  req.storage.clear();
  raw.clear();
  std::string tmp;  // strings that span segments (rare; names are short)
  const size_t end = r.total();
  // The inputs and outputs of the last call are overwritten (their strings and shapes keep
  // their capacity), then the vectors cut to what this message holds.
  size_t ni = 0, no = 0;
  while (r.pos() < end) {
    uint64_t tag, v;
    if (!r.tag(tag)) return WireRead::Unusual;
    const uint64_t field = tag >> 3;
    if ((tag & 7) != kLen) return WireRead::Unusual;  // every field read here is type 2
    if (!read_len(r, end, v)) return WireRead::Unusual;
    const size_t stop = r.pos() + static_cast<size_t>(v);
    bool ok;
    switch (field) {
      case 1: ok = read_string(r, v, req.model, tmp); break;
      case 2: ok = read_string(r, v, req.version, tmp); break;
      case 3: ok = read_string(r, v, req.id, tmp); break;
      case 5:
        if (ni == req.inputs.size()) req.inputs.emplace_back();
        ok = read_input(r, stop, req.inputs[ni++], tmp);
        break;
      case 6:
        if (no == req.outputs.size()) req.outputs.emplace_back();
        ok = read_output(r, stop, req.outputs[no++], tmp);
        break;
      case 7: {
        const size_t k = raw.size();
        if (scratch.gathered.size() <= k) scratch.gathered.resize(k + 1);
        const size_t len = static_cast<size_t>(v);
        ok = r.bytes(len, raw.emplace_back(), scratch.gathered[k], [&]() -> char* {
          if (!target) return nullptr;
          static const InputTensor none;
          return target(k, k < ni ? req.inputs[k] : none, len);
        });
        break;
      }
      default: ok = false;  // parameters (4), unknown fields
    }
    if (!ok) return WireRead::Unusual;
  }
  req.inputs.resize(ni);
  req.outputs.resize(no);
  // Typed contents (or none at all) are protobuf's: the inputs then carry their data in it.
  if (raw.empty() && !req.inputs.empty()) return WireRead::Unusual;
  return WireRead::Parsed;
}

void read_infer_proto(const inference::ModelInferRequest& q, InferRequest& req,
                      std::vector<std::string_view>& raw) {
  req.model = q.model_name();
  req.version = q.model_version();
  req.id = q.id();
  req.binary_output = false;
  req.storage.clear();
  req.inputs.resize(static_cast<size_t>(q.inputs_size()));
  for (int i = 0; i < q.inputs_size(); ++i) {
    const auto& in = q.inputs(i);
    InputTensor& t = req.inputs[static_cast<size_t>(i)];
    t.name = in.name();
    t.datatype = in.datatype();
    t.shape.assign(in.shape().begin(), in.shape().end());
    t.data = {};
  }
  req.outputs.resize(static_cast<size_t>(q.outputs_size()));
  for (int i = 0; i < q.outputs_size(); ++i) {
    req.outputs[static_cast<size_t>(i)].name = q.outputs(i).name();
    req.outputs[static_cast<size_t>(i)].binary = false;
  }
  raw.assign(q.raw_input_contents().begin(), q.raw_input_contents().end());
}

void bind_infer_inputs(InferRequest& req, const std::vector<std::string_view>& raw,
                       const inference::ModelInferRequest* typed, int64_t max_elements) {
  const bool has_raw = !raw.empty();
  if (has_raw && raw.size() != req.inputs.size())
    request_fail(Status::InvalidArgument, "raw_input_contents has ", raw.size(),
                 " entries for ", req.inputs.size(), " inputs");
  req.storage.clear();
  for (size_t i = 0; i < req.inputs.size(); ++i) {
    InputTensor& t = req.inputs[i];
    if (datatype_size(t.datatype) < 0)
      request_fail(Status::InvalidArgument, "input '", t.name, "': unknown datatype '",
                   t.datatype.substr(0, 20), "'");
    if (t.shape.size() > 8)
      request_fail(Status::InvalidArgument, "input '", t.name, "': more than 8 dimensions");
    const int64_t count = element_count(t.shape, t.name, max_elements);
    if (has_raw) {
      t.data = raw[i];
      const int es = datatype_size(t.datatype);
      if (es > 0 && static_cast<int64_t>(t.data.size()) != count * es)
        request_fail(Status::InvalidArgument, "input '", t.name, "': ", t.data.size(),
                     " bytes of raw_input_contents; shape and ", t.datatype, " need ",
                     count * es);
    } else {
      DLREC_CHECK(typed && typed->inputs_size() == static_cast<int>(req.inputs.size()),
                  "bind_infer_inputs: typed contents needed for input '", t.name, "'");
      req.storage.push_back(contents_to_wire(typed->inputs(static_cast<int>(i)).contents(),
                                             t.datatype, count, t.name));
      t.data = req.storage.back();
    }
  }
}

size_t infer_response_size(const InferResponse& resp) {
  size_t n = 0;
  for (const std::string* s : {&resp.model, &resp.version, &resp.id})
    if (!s->empty()) n += len_field_size(s->size());
  n += len_field_size(output_tensor_size(resp.rows));
  n += len_field_size(resp.probability.size() * sizeof(float));
  return n;
}

void write_infer_response(const InferResponse& resp, char* p) {
  int field = 1;
  for (const std::string* s : {&resp.model, &resp.version, &resp.id}) {
    if (!s->empty()) p = put_len_field(p, field, s->data(), s->size());
    ++field;
  }
  // outputs (5): one InferOutputTensor
  p = put_varint(p, 5 << 3 | kLen);
  p = put_varint(p, output_tensor_size(resp.rows));
  p = put_len_field(p, 1, kOutName.data(), kOutName.size());
  p = put_len_field(p, 2, kOutType.data(), kOutType.size());
  p = put_varint(p, 3 << 3 | kLen);
  p = put_varint(p, varint_size(static_cast<uint64_t>(resp.rows)) + 1);
  p = put_varint(p, static_cast<uint64_t>(resp.rows));
  p = put_varint(p, 1);
  // raw_output_contents (6); protobuf writes a repeated bytes element even when empty
  put_len_field(p, 6, resp.probability.data(), resp.probability.size() * sizeof(float));
}

}  // namespace dlrec::serve
