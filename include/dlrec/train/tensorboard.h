// TensorBoard event files, written by dlrec itself (docs/FORMATS.md, "TensorBoard event files").
//
// A file is a sequence of TFRecord records, each
//   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
//   `length` bytes of data, uint32 masked CRC-32C of the data,
// whose data is a serialized Event protobuf (src/train/proto/tensorboard_event.proto): the
// first holds file_version "brain.Event:2", the others wall_time, step and one scalar
// (summary { value { tag, simple_value } }). Masked CRC: ((c >> 15) | (c << 17)) + 0xa282ead8.
//
// Crash-safety: every record goes to the file in one write(2) call as soon as it is added, so a
// killed run leaves every record added before the kill readable (at worst the last one cut
// short, which readers drop).
#pragma once

#include <cstdint>
#include <string>

namespace dlrec::train {

// The CRC of the TFRecord framing: CRC-32C, rotated right by 15 bits, plus 0xa282ead8.
uint32_t tfrecord_masked_crc(const void* data, size_t bytes);
// `data` framed as one TFRecord record.
std::string tfrecord_frame(const std::string& data);

class EventFileWriter {
 public:
  // Creates "<dir>/events.out.tfevents.<unix seconds>.<host name>" (a new name when it exists)
  // and writes the file_version record. `dir` must exist.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  // Appends one scalar event (written to the file before this returns). A non-finite value is
  // written as it is (TensorBoard shows NaN). Errors name the file.
  void scalar(const std::string& tag, int64_t step, double value);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);
  std::string path_;
  int fd_ = -1;
};

}  // namespace dlrec::train
