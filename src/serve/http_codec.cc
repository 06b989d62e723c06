#include "dlrec/serve/http_codec.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/core/config.h"
#include "dlrec/serve/request_error.h"

namespace dlrec::serve {

namespace {

[[noreturn]] void bad(const std::string& msg) { request_fail(Status::InvalidArgument, msg); }

// Appends the elements of a (possibly nested) JSON array in row-major order.
void flatten(const json& j, std::vector<const json*>& out, int64_t limit, const std::string& n,
             int depth = 0) {
  if (depth > 32) bad("input '" + n + "': 'data' is nested too deeply");
  if (!j.is_array()) {
    if (static_cast<int64_t>(out.size()) >= limit)
      bad(detail::concat("input '", n, "': 'data' has more elements than its shape"));
    out.push_back(&j);
    return;
  }
  for (const auto& e : j) flatten(e, out, limit, n, depth + 1);
}

template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  s.append(b, sizeof b);
}

template <class T>
void put_int(std::string& s, const json& e, const std::string& n) {
  if (e.is_number_integer()) {
    if (e.is_number_unsigned()) {
      uint64_t u = e.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        bad("input '" + n + "': value " + e.dump() + " is out of range");
      put<T>(s, static_cast<T>(u));
      return;
    }
    int64_t v = e.get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
      bad("input '" + n + "': value " + e.dump() + " is out of range");
    put<T>(s, static_cast<T>(v));
    return;
  }
  bad("input '" + n + "': expected integers in 'data', found " + e.dump().substr(0, 40));
}

// JSON "data" -> the binary wire layout of the datatype.
std::string to_wire(const json& data, const std::string& dt, int64_t count, const std::string& n,
                    int64_t limit) {
  std::vector<const json*> el;
  flatten(data, el, std::min(count, limit), n);
  if (static_cast<int64_t>(el.size()) != count)
    bad(detail::concat("input '", n, "': 'data' has ", el.size(), " elements; its shape needs ",
                       count));
  std::string s;
  for (const json* p : el) {
    const json& e = *p;
    if (dt == "BYTES") {
      if (!e.is_string()) bad("input '" + n + "': BYTES 'data' must hold strings");
      const auto& str = e.get_ref<const std::string&>();
      put<uint32_t>(s, static_cast<uint32_t>(str.size()));
      s += str;
    } else if (dt == "FP32" || dt == "FP64") {
      if (!e.is_number()) bad("input '" + n + "': expected numbers in 'data', found " +
                              e.dump().substr(0, 40));
      double v = e.get<double>();
      if (dt == "FP32") put<float>(s, static_cast<float>(v));
      else put<double>(s, v);
    } else if (dt == "BOOL") {
      if (!e.is_boolean()) bad("input '" + n + "': BOOL 'data' must hold true/false");
      put<uint8_t>(s, e.get<bool>() ? 1 : 0);
    } else if (dt == "INT8") put_int<int8_t>(s, e, n);
    else if (dt == "INT16") put_int<int16_t>(s, e, n);
    else if (dt == "INT32") put_int<int32_t>(s, e, n);
    else if (dt == "INT64") put_int<int64_t>(s, e, n);
    else if (dt == "UINT8") put_int<uint8_t>(s, e, n);
    else if (dt == "UINT16") put_int<uint16_t>(s, e, n);
    else if (dt == "UINT32") put_int<uint32_t>(s, e, n);
    else if (dt == "UINT64") put_int<uint64_t>(s, e, n);
    else bad("input '" + n + "': datatype " + dt + " is not supported in JSON 'data'");
  }
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
  json j = json::parse(head.begin(), head.end(), nullptr, false);
  if (j.is_discarded()) bad("malformed JSON in the request body");
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
  for (const auto& in : *inputs) {
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
    const bool has_data = in.contains("data");
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
      req.storage.push_back(
          to_wire(in.at("data"), t.datatype, count, t.name, limits.max_tensor_elements));
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
  b.body = j.dump();
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
