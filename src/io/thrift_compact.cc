#include "io/thrift_compact.h"

#include <cstring>

#include "dlrec/core/error.h"

namespace dlrec::io::thrift {
namespace {
constexpr int kMaxDepth = 64;  // nesting limit when skipping (hostile input)

int64_t unzigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }
}  // namespace

CompactReader::CompactReader(const uint8_t* data, size_t size, std::string what)
    : data_(data), size_(size), what_(std::move(what)) {}

void CompactReader::corrupt(const std::string& why) const {
  fail(what_, ": corrupt Thrift metadata at byte ", pos_, ": ", why);
}

void CompactReader::need(size_t n) const {
  if (n > size_ - pos_) corrupt("truncated (needs " + std::to_string(n) + " more bytes)");
}

uint64_t CompactReader::read_varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    need(1);
    const uint8_t b = data_[pos_++];
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  corrupt("varint longer than 10 bytes");
}

void CompactReader::begin_struct() {
  if (last_ids_.size() >= kMaxDepth) corrupt("structs nested too deeply");
  last_ids_.push_back(0);
}

void CompactReader::end_struct() { last_ids_.pop_back(); }

bool CompactReader::next_field(int16_t& id, CType& type) {
  need(1);
  const uint8_t b = data_[pos_++];
  if (b == 0) return false;
  type = static_cast<CType>(b & 0x0F);
  if (b & 0x0F) {
    if ((b & 0x0F) > static_cast<uint8_t>(CType::Struct))
      corrupt("unknown field type " + std::to_string(b & 0x0F));
  }
  const int delta = b >> 4;
  if (delta == 0)
    id = read_i16();
  else
    id = static_cast<int16_t>(last_ids_.back() + delta);
  last_ids_.back() = id;
  return true;
}

bool CompactReader::read_bool(CType t) {
  if (t == CType::True) return true;
  if (t == CType::False) return false;
  corrupt("expected a bool field");
}

int8_t CompactReader::read_byte() {
  need(1);
  return static_cast<int8_t>(data_[pos_++]);
}

int16_t CompactReader::read_i16() { return static_cast<int16_t>(unzigzag(read_varint())); }
int32_t CompactReader::read_i32() { return static_cast<int32_t>(unzigzag(read_varint())); }
int64_t CompactReader::read_i64() { return unzigzag(read_varint()); }

double CompactReader::read_double() {
  need(8);
  double d;
  std::memcpy(&d, data_ + pos_, 8);
  pos_ += 8;
  return d;
}

std::string_view CompactReader::read_binary() {
  const uint64_t n = read_varint();
  if (n > size_ - pos_) corrupt("binary of " + std::to_string(n) + " bytes past the end");
  std::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return v;
}

void CompactReader::read_list_header(CType& elem, int64_t& size) {
  need(1);
  const uint8_t b = data_[pos_++];
  elem = static_cast<CType>(b & 0x0F);
  size = b >> 4;
  if (size == 15) {
    const uint64_t n = read_varint();
    // Every element takes at least one byte except bools... which also take one in lists.
    if (n > size_ - pos_) corrupt("list of " + std::to_string(n) + " elements past the end");
    size = static_cast<int64_t>(n);
  }
}

bool CompactReader::read_bool_element() {
  need(1);
  return data_[pos_++] == 1;
}

void CompactReader::skip(CType t) { skip_depth(t, 0); }

void CompactReader::skip_depth(CType t, int depth) {
  if (depth > kMaxDepth) corrupt("values nested too deeply");
  switch (t) {
    case CType::True:
    case CType::False:
      return;  // the value was in the field header
    case CType::Byte:
      need(1);
      ++pos_;
      return;
    case CType::I16:
    case CType::I32:
    case CType::I64:
      read_varint();
      return;
    case CType::Double:
      need(8);
      pos_ += 8;
      return;
    case CType::Binary:
      read_binary();
      return;
    case CType::List:
    case CType::Set: {
      CType e;
      int64_t n;
      read_list_header(e, n);
      for (int64_t i = 0; i < n; ++i) {
        if (e == CType::True || e == CType::False)
          read_bool_element();
        else
          skip_depth(e, depth + 1);
      }
      return;
    }
    case CType::Map: {
      const uint64_t n = read_varint();
      if (n == 0) return;
      if (n > size_ - pos_) corrupt("map past the end");
      need(1);
      const uint8_t kv = data_[pos_++];
      const CType k = static_cast<CType>(kv >> 4), v = static_cast<CType>(kv & 0x0F);
      for (uint64_t i = 0; i < n; ++i) {
        for (CType x : {k, v}) {
          if (x == CType::True || x == CType::False)
            read_bool_element();
          else
            skip_depth(x, depth + 1);
        }
      }
      return;
    }
    case CType::Struct: {
      begin_struct();
      int16_t id;
      CType ft;
      while (next_field(id, ft)) skip_depth(ft, depth + 1);
      end_struct();
      return;
    }
    case CType::Stop:
      break;
  }
  corrupt("cannot skip a value of type " + std::to_string(static_cast<int>(t)));
}

// ---------------------------------------------------------------------------------------------

void CompactWriter::write_varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void CompactWriter::field_header(int16_t id, CType t) {
  const int delta = id - last_id_;
  if (delta > 0 && delta <= 15) {
    out_.push_back(static_cast<char>((delta << 4) | static_cast<int>(t)));
  } else {
    out_.push_back(static_cast<char>(t));
    write_varint(zigzag(id));
  }
  last_id_ = id;
}

void CompactWriter::field_bool(int16_t id, bool v) {
  field_header(id, v ? CType::True : CType::False);
}
void CompactWriter::field_i16(int16_t id, int16_t v) {
  field_header(id, CType::I16);
  write_varint(zigzag(v));
}
void CompactWriter::field_i32(int16_t id, int32_t v) {
  field_header(id, CType::I32);
  write_varint(zigzag(v));
}
void CompactWriter::field_i64(int16_t id, int64_t v) {
  field_header(id, CType::I64);
  write_varint(zigzag(v));
}
void CompactWriter::field_binary(int16_t id, std::string_view v) {
  field_header(id, CType::Binary);
  elem_binary(v);
}
void CompactWriter::field_struct_begin(int16_t id) {
  field_header(id, CType::Struct);
  elem_struct_begin();
}
void CompactWriter::field_list_begin(int16_t id, CType elem, size_t size) {
  field_header(id, CType::List);
  if (size < 15) {
    out_.push_back(static_cast<char>((size << 4) | static_cast<int>(elem)));
  } else {
    out_.push_back(static_cast<char>(0xF0 | static_cast<int>(elem)));
    write_varint(size);
  }
}
void CompactWriter::end_struct() {
  out_.push_back(0);
  if (!stack_.empty()) {
    last_id_ = stack_.back();
    stack_.pop_back();
  } else {
    last_id_ = 0;
  }
}
void CompactWriter::elem_binary(std::string_view v) {
  write_varint(v.size());
  out_.append(v.data(), v.size());
}
void CompactWriter::elem_struct_begin() {
  stack_.push_back(last_id_);
  last_id_ = 0;
}

}  // namespace dlrec::io::thrift
