// Thrift compact protocol: the small subset Parquet's metadata needs (structs, lists, bools,
// i16/i32/i64 zigzag varints, doubles, binary), plus skipping of anything else (sets, maps,
// unknown fields), so metadata written by newer writers still parses.
//
// Wire format (Apache Thrift compact protocol specification):
//   field header  one byte: high nibble = field id delta (1..15) from the previous field of the
//                 same struct, low nibble = type; delta 0 means a zigzag varint i16 id follows.
//                 Bool fields carry their value in the type (1 = true, 2 = false).
//   stop          one zero byte ends a struct.
//   i16/i32/i64   zigzag, then ULEB128 varint.   double: 8 bytes little-endian.
//   binary        varint length, then the bytes.
//   list/set      one byte: high nibble = size (15: a varint size follows), low nibble = element
//                 type. Bool elements are one byte each (1 = true).
//   map           varint size; when non-zero, one byte: key type << 4 | value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlrec::io::thrift {

enum class CType : uint8_t {
  Stop = 0,
  True = 1,
  False = 2,
  Byte = 3,
  I16 = 4,
  I32 = 5,
  I64 = 6,
  Double = 7,
  Binary = 8,
  List = 9,
  Set = 10,
  Map = 11,
  Struct = 12,
};

// Decodes compact-protocol bytes. Every malformed or truncated input throws dlrec::Error
// starting with `what` (e.g. "f.parquet: footer"); nothing reads past `size`.
class CompactReader {
 public:
  CompactReader(const uint8_t* data, size_t size, std::string what);

  // Structs: call begin_struct(), then next_field() until it returns false (the stop byte),
  // reading or skip()ping each field's value, then end_struct(). Nested structs nest the calls.
  void begin_struct();
  bool next_field(int16_t& id, CType& type);
  void end_struct();

  bool read_bool(CType field_type);  // a bool field: the value is in its type
  int8_t read_byte();
  int16_t read_i16();
  int32_t read_i32();
  int64_t read_i64();
  double read_double();
  std::string_view read_binary();  // points into the input
  std::string read_string() { return std::string(read_binary()); }
  // A list (or set) header: element type and count.
  void read_list_header(CType& elem, int64_t& size);
  bool read_bool_element();  // a bool inside a list

  // Skips one value of type t (structs, lists, sets and maps recursively, depth-limited).
  void skip(CType t);

  size_t position() const { return pos_; }
  const std::string& what() const { return what_; }
  [[noreturn]] void corrupt(const std::string& why) const;

 private:
  uint64_t read_varint();
  void need(size_t n) const;
  void skip_depth(CType t, int depth);

  const uint8_t* data_;
  size_t size_, pos_ = 0;
  std::string what_;
  std::vector<int16_t> last_ids_;  // per open struct: the previous field id
};

// Encodes compact-protocol bytes into an internal buffer.
class CompactWriter {
 public:
  // Fields of the current struct (the top-level struct is implicit; call end_struct() at its
  // end to write the stop byte).
  void field_bool(int16_t id, bool v);
  void field_i16(int16_t id, int16_t v);
  void field_i32(int16_t id, int32_t v);
  void field_i64(int16_t id, int64_t v);
  void field_binary(int16_t id, std::string_view v);
  void field_struct_begin(int16_t id);  // then the struct's fields, then end_struct()
  void field_list_begin(int16_t id, CType elem, size_t size);  // then `size` elements
  void end_struct();

  // List elements.
  void elem_i32(int32_t v) { write_varint(zigzag(v)); }
  void elem_i64(int64_t v) { write_varint(zigzag(v)); }
  void elem_binary(std::string_view v);
  void elem_struct_begin();  // then the struct's fields, then end_struct()

  const std::string& bytes() const { return out_; }
  std::string& bytes() { return out_; }

 private:
  static uint64_t zigzag(int64_t v) {
    return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
  }
  void write_varint(uint64_t v);
  void field_header(int16_t id, CType t);

  std::string out_;
  int16_t last_id_ = 0;
  std::vector<int16_t> stack_;  // saved last ids of the enclosing structs
};

}  // namespace dlrec::io::thrift
