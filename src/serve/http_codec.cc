#include "dlrec/serve/http_codec.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/core/config.h"
#include "dlrec/serve/request_error.h"

namespace dlrec::serve {

namespace {

[[noreturn]] void bad(const std::string& msg) { request_fail(Status::InvalidArgument, msg); }

// The elements of one input's "data", as the parser met them (row-major; nested arrays only
// give the order). Kept compact, 1 byte of kind plus 8 of value per number, strings as BYTES
// wire bytes, instead of a DOM node per element: a JSON DOM costs 16 bytes per number and ~64
// per string (four concurrent 60 MB bodies took 5.5 GB). Converted to the wire layout once the
// datatype is known (it may come after "data" in the object).
struct DataValues {
  enum Kind : uint8_t { kInt, kUnsigned, kFloat, kBool, kString };
  bool present = false;
  std::vector<uint8_t> kind;
  std::vector<uint64_t> num;  // the bits of int64 / uint64 / double / bool, in order
  std::string bytes;          // strings, each as a 4-byte length and its bytes
};

// Builds the request's JSON value without its inputs' "data", which goes to DataValues.
// nlohmann's SAX parser is iterative; the depth limit keeps the value built (and destroyed
// recursively) shallow, and the counts keep memory proportional to the body.
class InferBodySax {
 public:
  InferBodySax(int max_depth, int64_t max_values, int64_t max_elements)
      : max_depth_(max_depth), max_values_(max_values), max_elements_(max_elements) {}

  json root;
  std::vector<DataValues> data;  // per element of "inputs"
  std::string error;

  bool null() { return in_data() ? data_error("null") : add(json(nullptr)); }
  bool boolean(bool v) { return in_data() ? put(DataValues::kBool, v ? 1 : 0) : add(json(v)); }
  bool number_integer(int64_t v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    return in_data() ? put(DataValues::kInt, bits) : add(json(v));
  }
  bool number_unsigned(uint64_t v) { return in_data() ? put(DataValues::kUnsigned, v) : add(json(v)); }
  bool number_float(double v, const std::string&) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    return in_data() ? put(DataValues::kFloat, bits) : add(json(v));
  }
  bool string(std::string& v) {
    if (!in_data()) return add(json(std::move(v)));
    if (v.size() > UINT32_MAX) return fail_with("a BYTES element is longer than 4 GB");
    DataValues& d = data[data_input_];
    uint32_t len = static_cast<uint32_t>(v.size());
    char b[4];
    std::memcpy(b, &len, 4);
    d.bytes.append(b, 4);
    d.bytes += v;
    return put(DataValues::kString, 0);
  }
  bool binary(json::binary_t&) { return fail_with("binary values are not JSON"); }
  bool start_object(size_t) {
    if (in_data()) return data_error("an object");
    if (!deeper()) return false;
    const bool input = !stack_.empty() && stack_.back().inputs_array;
    const size_t index = input ? stack_.back().node->size() : 0;
    json* node = add_container(json::object());
    if (!node) return false;
    stack_.push_back({node, true, {}, false, input, index});
    return true;
  }
  bool key(std::string& k) {
    Frame& f = stack_.back();
    if (f.node->contains(k))
      return fail_with("duplicate key '" + k.substr(0, 64) + "' in a JSON object");
    f.key = std::move(k);
    if (f.input_object && f.key == "data") {
      // The next value is the input's data.
      if (f.input_index >= data.size()) data.resize(f.input_index + 1);
      if (data[f.input_index].present) return fail_with("duplicate key 'data' in an input");
      data_input_ = f.input_index;
      data[data_input_].present = true;
      data_next_ = true;
    }
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    if (!deeper()) return false;
    if (in_data()) {
      data_next_ = false;
      ++data_nest_;
      return true;
    }
    const bool inputs = stack_.size() == 1 && stack_.back().key == "inputs";
    json* node = add_container(json::array());
    if (!node) return false;
    stack_.push_back({node, false, {}, inputs, false, 0});
    return true;
  }
  bool end_array() {
    if (data_nest_ > 0) {
      --data_nest_;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (error.empty()) error = std::string("malformed JSON in the request body: ") + e.what();
    return false;
  }

 private:
  struct Frame {
    json* node;
    bool object;
    std::string key;       // objects: the key of the value that comes next
    bool inputs_array;     // the root's "inputs"
    bool input_object;     // an element of it
    size_t input_index;
  };

  bool in_data() const { return data_nest_ > 0 || data_next_; }
  bool fail_with(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  bool data_error(const char* what) {
    return fail_with("'data' of input " + std::to_string(data_input_) + " holds " + what +
                     "; it must hold scalars, in (nested) arrays");
  }
  bool deeper() {
    if (static_cast<int>(stack_.size()) + data_nest_ + 1 > max_depth_)
      return fail_with("the request body is nested deeper than " + std::to_string(max_depth_) +
                       " levels");
    return true;
  }
  bool put(DataValues::Kind k, uint64_t bits) {
    data_next_ = false;
    DataValues& d = data[data_input_];
    if (static_cast<int64_t>(d.kind.size()) >= max_elements_)
      return fail_with("'data' of input " + std::to_string(data_input_) + " has more than " +
                       std::to_string(max_elements_) + " elements");
    d.kind.push_back(k);
    if (k != DataValues::kString) d.num.push_back(bits);
    return true;
  }
  // Adds a value where the parser is (the root, an array element or an object member).
  bool add(json&& v) { return add_container(std::move(v)) != nullptr; }
  json* add_container(json&& v) {
    if (++values_ > max_values_) {
      fail_with("the request body holds more than " + std::to_string(max_values_) +
                " JSON values outside 'data'");
      return nullptr;
    }
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Frame& f = stack_.back();
    if (f.object) return &((*f.node)[f.key] = std::move(v));
    f.node->push_back(std::move(v));
    return &f.node->back();
  }

 private:
  int max_depth_;
  int64_t max_values_, max_elements_;
  int64_t values_ = 0;
  std::vector<Frame> stack_;
  int data_nest_ = 0;
  bool data_next_ = false;
  size_t data_input_ = 0;
};

template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  s.append(b, sizeof b);
}

const char* kind_name(uint8_t k) {
  switch (k) {
    case DataValues::kInt:
    case DataValues::kUnsigned: return "an integer";
    case DataValues::kFloat: return "a number with a fraction or exponent";
    case DataValues::kBool: return "a boolean";
    default: return "a string";
  }
}

template <class T>
void put_int(std::string& s, uint8_t k, uint64_t bits, const std::string& n) {
  if (k == DataValues::kUnsigned) {
    if (bits > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      bad("input '" + n + "': value " + std::to_string(bits) + " is out of range");
    put<T>(s, static_cast<T>(bits));
    return;
  }
  if (k != DataValues::kInt)
    bad(std::string("input '") + n + "': expected integers in 'data', found " + kind_name(k));
  int64_t v;
  std::memcpy(&v, &bits, 8);
  if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
    bad("input '" + n + "': value " + std::to_string(v) + " is out of range");
  put<T>(s, static_cast<T>(v));
}

// The data's elements -> the binary wire layout of the datatype (moves the strings out).
std::string to_wire(DataValues& d, const std::string& dt, int64_t count, const std::string& n) {
  if (static_cast<int64_t>(d.kind.size()) != count)
    bad(detail::concat("input '", n, "': 'data' has ", d.kind.size(),
                       " elements; its shape needs ", count));
  if (dt == "BYTES") {
    for (uint8_t k : d.kind)
      if (k != DataValues::kString) bad("input '" + n + "': BYTES 'data' must hold strings");
    return std::move(d.bytes);
  }
  const int esize = datatype_size(dt);
  std::string s;
  s.reserve(static_cast<size_t>(count) * static_cast<size_t>(std::max(esize, 1)));
  size_t j = 0;
  for (uint8_t k : d.kind) {
    if (k == DataValues::kString)
      bad("input '" + n + "': expected " + (dt == "BOOL" ? "true/false" : "numbers") +
          " in 'data', found a string");
    const uint64_t bits = d.num[j++];
    if (dt == "FP32" || dt == "FP64") {
      if (k == DataValues::kBool) bad("input '" + n + "': expected numbers in 'data', found a boolean");
      double v;
      if (k == DataValues::kFloat) std::memcpy(&v, &bits, 8);
      else if (k == DataValues::kUnsigned) v = static_cast<double>(bits);
      else {
        int64_t i;
        std::memcpy(&i, &bits, 8);
        v = static_cast<double>(i);
      }
      if (dt == "FP32") put<float>(s, static_cast<float>(v));
      else put<double>(s, v);
    } else if (dt == "BOOL") {
      if (k != DataValues::kBool) bad("input '" + n + "': BOOL 'data' must hold true/false");
      put<uint8_t>(s, bits ? 1 : 0);
    } else if (dt == "INT8") put_int<int8_t>(s, k, bits, n);
    else if (dt == "INT16") put_int<int16_t>(s, k, bits, n);
    else if (dt == "INT32") put_int<int32_t>(s, k, bits, n);
    else if (dt == "INT64") put_int<int64_t>(s, k, bits, n);
    else if (dt == "UINT8") put_int<uint8_t>(s, k, bits, n);
    else if (dt == "UINT16") put_int<uint16_t>(s, k, bits, n);
    else if (dt == "UINT32") put_int<uint32_t>(s, k, bits, n);
    else if (dt == "UINT64") put_int<uint64_t>(s, k, bits, n);
    else bad("input '" + n + "': datatype " + dt + " is not supported in JSON 'data'");
  }
  // The compact copy goes as soon as the wire form exists.
  std::vector<uint8_t>().swap(d.kind);
  std::vector<uint64_t>().swap(d.num);
  return s;
}

bool param_bool(const json& obj, const char* key) {
  if (!obj.is_object()) return false;
  auto p = obj.find("parameters");
  if (p == obj.end() || !p->is_object()) return false;
  auto v = p->find(key);
  return v != p->end() && v->is_boolean() && v->get<bool>();
}

}  // namespace

InferRequest parse_infer_request(std::string_view body, int64_t header_length,
                                 const HttpLimits& limits) {
  if (header_length >= 0 && static_cast<uint64_t>(header_length) > body.size())
    bad(detail::concat("Inference-Header-Content-Length is ", header_length, " but the body has ",
                       body.size(), " bytes"));
  std::string_view head = header_length >= 0 ? body.substr(0, static_cast<size_t>(header_length))
                                             : body;
  std::string_view binary =
      header_length >= 0 ? body.substr(static_cast<size_t>(header_length)) : std::string_view{};
  // The JSON is read with the limits of dlrec::parse_json (depth 64), the inputs' data straight
  // into a compact form (InferBodySax) and bounded by the element limit as it arrives.
  const JsonLimits jl;
  InferBodySax sax(jl.max_depth, int64_t{1} << 20, limits.max_tensor_elements);
  if (!json::sax_parse(head.begin(), head.end(), &sax) || !sax.error.empty())
    bad(sax.error.empty() ? std::string("malformed JSON in the request body") : sax.error);
  json& j = sax.root;
  if (!j.is_object()) bad("the request body must be a JSON object");

  InferRequest req;
  if (auto it = j.find("id"); it != j.end()) {
    if (!it->is_string()) bad("'id' must be a string");
    req.id = it->get<std::string>();
  }
  if (auto it = j.find("parameters"); it != j.end() && !it->is_object())
    bad("'parameters' must be an object");
  req.binary_output = param_bool(j, "binary_data_output");

  auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array() || inputs->empty())
    bad("'inputs' must be a non-empty array");
  size_t offset = 0;
  for (size_t index = 0; index < inputs->size(); ++index) {
    const json& in = (*inputs)[index];
    if (!in.is_object()) bad("each input must be a JSON object");
    InputTensor t;
    auto name = in.find("name");
    if (name == in.end() || !name->is_string()) bad("each input needs a string 'name'");
    t.name = name->get<std::string>();
    auto dt = in.find("datatype");
    if (dt == in.end() || !dt->is_string()) bad("input '" + t.name + "' needs a string 'datatype'");
    t.datatype = dt->get<std::string>();
    if (datatype_size(t.datatype) < 0)
      bad("input '" + t.name + "': unknown datatype '" + t.datatype.substr(0, 20) + "'");
    auto shape = in.find("shape");
    if (shape == in.end() || !shape->is_array()) bad("input '" + t.name + "' needs a 'shape' array");
    if (shape->size() > 8) bad("input '" + t.name + "': more than 8 dimensions");
    for (const auto& d : *shape) {
      if (!d.is_number_integer()) bad("input '" + t.name + "': 'shape' must hold integers");
      t.shape.push_back(d.get<int64_t>());
    }
    const int64_t count = element_count(t.shape, t.name, limits.max_tensor_elements);
    const int esize = datatype_size(t.datatype);

    const json* params = nullptr;
    if (auto p = in.find("parameters"); p != in.end()) {
      if (!p->is_object()) bad("input '" + t.name + "': 'parameters' must be an object");
      params = &*p;
    }
    const bool has_data = index < sax.data.size() && sax.data[index].present;
    if (params && params->contains("binary_data_size")) {
      const json& bs = params->at("binary_data_size");
      if (!bs.is_number_integer() || bs.get<int64_t>() < 0)
        bad("input '" + t.name + "': 'binary_data_size' must be a non-negative integer");
      if (has_data) bad("input '" + t.name + "' has both 'data' and 'binary_data_size'");
      if (header_length < 0)
        bad("input '" + t.name +
            "' uses 'binary_data_size' but the Inference-Header-Content-Length header is missing");
      const uint64_t size = bs.get<uint64_t>();
      if (size > binary.size() - offset)
        bad(detail::concat("input '", t.name, "': binary_data_size ", size, " exceeds the ",
                           binary.size() - offset, " binary bytes left in the body"));
      t.data = binary.substr(offset, size);
      offset += size;
      if (esize > 0 && static_cast<int64_t>(size) != count * esize)
        bad(detail::concat("input '", t.name, "': binary_data_size is ", size, " bytes; shape and ",
                           t.datatype, " need ", count * esize));
    } else {
      if (!has_data) bad("input '" + t.name + "' has neither 'data' nor 'binary_data_size'");
      req.storage.push_back(to_wire(sax.data[index], t.datatype, count, t.name));
      t.data = req.storage.back();
    }
    req.inputs.push_back(std::move(t));
  }
  if (offset != binary.size())
    bad(detail::concat("the body has ", binary.size() - offset,
                       " bytes of binary data that no input claims (binary_data_size)"));

  if (auto outs = j.find("outputs"); outs != j.end()) {
    if (!outs->is_array()) bad("'outputs' must be an array");
    for (const auto& o : *outs) {
      if (!o.is_object() || !o.contains("name") || !o.at("name").is_string())
        bad("each requested output needs a string 'name'");
      RequestedOutput r;
      r.name = o.at("name").get<std::string>();
      r.binary = param_bool(o, "binary_data");
      if (auto p = o.find("parameters"); p != o.end() && p->is_object() &&
                                         p->contains("classification"))
        bad("output '" + r.name + "': the classification extension is not supported");
      req.outputs.push_back(std::move(r));
    }
  }
  return req;
}

HttpBody encode_infer_response(const InferResponse& resp, const InferRequest& req) {
  bool binary = req.binary_output;
  if (!req.outputs.empty()) binary = req.outputs[0].binary || req.binary_output;
  json out = {{"name", "probability"}, {"datatype", "FP32"}, {"shape", {resp.rows, 1}}};
  HttpBody b;
  const size_t nbytes = resp.probability.size() * sizeof(float);
  if (binary) {
    out["parameters"] = {{"binary_data_size", nbytes}};
  } else {
    json data = json::array();
    for (float v : resp.probability) data.push_back(v);
    out["data"] = std::move(data);
  }
  json j = {{"model_name", resp.model}, {"model_version", resp.version}};
  if (!resp.id.empty()) j["id"] = resp.id;
  j["outputs"] = json::array({std::move(out)});
  b.body = dump_json_safe(j);
  if (binary) {
    b.header_length = static_cast<int64_t>(b.body.size());
    b.body.append(reinterpret_cast<const char*>(resp.probability.data()), nbytes);
    b.content_type = "application/octet-stream";
  } else {
    b.content_type = "application/json";
  }
  return b;
}

}  // namespace dlrec::serve
