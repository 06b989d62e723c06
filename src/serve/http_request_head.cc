// Reading an HTTP/1.x request head (request line and header fields), strictly: what the
// server accepts and refuses is listed in http_server.h.
#include <cctype>
#include <cstring>

#include "http_server.h"

namespace dlrec::serve {

namespace {

bool is_token_char(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim_ows(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

}  // namespace

bool valid_utf8(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07;
    else
      return false;
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

bool decode_request_path(const std::string& raw, std::string& out) {
  out.clear();
  out.reserve(raw.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '%') {
      out.push_back(raw[i]);
      continue;
    }
    if (i + 2 >= raw.size()) return false;
    int h = hex(raw[i + 1]), l = hex(raw[i + 2]);
    if (h < 0 || l < 0) return false;
    out.push_back(static_cast<char>(h * 16 + l));
    i += 2;
  }
  return out.find('\0') == std::string::npos && valid_utf8(out.data(), out.size());
}

const std::string* HttpRequest::header(const std::string& lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return &v;
  return nullptr;
}

RequestHead parse_request_head(const std::string& h, HttpRequest& req) {
  RequestHead out;
  auto refuse = [&out](int status, std::string message) {
    out.refusal_status = status;
    out.refusal = std::move(message);
    return out;
  };
  if (!valid_utf8(h.data(), h.size())) return refuse(400, "the request head is not valid UTF-8");
  size_t eol = h.find("\r\n");
  const std::string line = h.substr(0, eol);
  // request-line = method SP request-target SP HTTP-version
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos)
    return refuse(400, "malformed request line");
  req.method = line.substr(0, sp1);
  for (char ch : req.method)
    if (!is_token_char(static_cast<unsigned char>(ch)))
      return refuse(400, "malformed request method");
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string version = line.substr(sp2 + 1);
  if (version == "HTTP/1.1")
    req.minor_version = 1;
  else if (version == "HTTP/1.0")
    req.minor_version = 0;
  else if (version.compare(0, 5, "HTTP/") == 0)
    return refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  else
    return refuse(400, "malformed request line");
  for (char ch : target)
    if (static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f)
      return refuse(400, "control bytes in the request target");
  if (target.empty() || target[0] != '/') return refuse(400, "the request target must be a path");
  const size_t q = target.find('?');
  if (!decode_request_path(target.substr(0, q), req.path))
    return refuse(400, "the request path has a bad %-escape or is not valid UTF-8");
  if (q != std::string::npos) req.query = target.substr(q + 1);

  bool& chunked = out.chunked;
  int64_t& content_length = out.content_length;
  bool close_requested = false, keep_alive_requested = false;
  size_t pos = eol + 2;
  while (pos < h.size()) {
    size_t e = h.find("\r\n", pos);
    if (e == pos) break;  // the empty line
    const std::string field = h.substr(pos, e - pos);
    pos = e + 2;
    if (field[0] == ' ' || field[0] == '\t') return refuse(400, "obsolete header folding");
    size_t colon = field.find(':');
    if (colon == std::string::npos || colon == 0) return refuse(400, "malformed header line");
    for (size_t k = 0; k < colon; ++k)
      if (!is_token_char(static_cast<unsigned char>(field[k])))
        return refuse(400, "malformed header name");
    std::string name = lower(field.substr(0, colon));
    std::string value = trim_ows(field.substr(colon + 1));
    for (char ch : value)
      if ((static_cast<unsigned char>(ch) < 0x20 && ch != '\t') || ch == 0x7f)
        return refuse(400, "control bytes in header '" + name + "'");
    if (name == "content-length") {
      if (value.empty() || value.size() > 18 ||
          value.find_first_not_of("0123456789") != std::string::npos)
        return refuse(400, "malformed Content-Length");
      int64_t v = std::stoll(value);
      if (content_length >= 0 && v != content_length)
        return refuse(400, "conflicting Content-Length headers");
      content_length = v;
    } else if (name == "transfer-encoding") {
      if (lower(value) != "chunked")
        return refuse(501, "only the chunked transfer coding is served");
      if (chunked) return refuse(400, "repeated Transfer-Encoding");
      chunked = true;
    } else if (name == "connection") {
      std::string v = lower(value);
      if (v.find("close") != std::string::npos) close_requested = true;
      if (v.find("keep-alive") != std::string::npos) keep_alive_requested = true;
    } else if (name == "expect") {
      if (lower(value) != "100-continue") return refuse(417, "unsupported Expect header");
      out.expect_continue = true;
    }
    req.headers.emplace_back(std::move(name), std::move(value));
  }
  if (chunked && content_length >= 0)
    return refuse(400, "both Content-Length and Transfer-Encoding");
  out.keep_alive = req.minor_version == 1 ? !close_requested : keep_alive_requested;
  return out;
}

}  // namespace dlrec::serve
