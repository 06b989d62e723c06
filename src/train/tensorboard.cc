// TensorBoard event files (include/dlrec/train/tensorboard.h).
#include "dlrec/train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "tensorboard_event.pb.h"

namespace dlrec::train {

namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  std::string h = buf;
  for (char& c : h)  // a file name: no path separators
    if (c == '/') c = '_';
  return h;
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t tfrecord_masked_crc(const void* data, size_t bytes) {
  const uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) rec.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  put_u32(rec, tfrecord_masked_crc(rec.data(), 8));
  rec += data;
  put_u32(rec, tfrecord_masked_crc(data.data(), data.size()));
  return rec;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  const double t = now_seconds();
  const std::string base =
      dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host_name();
  // Two writers in one second (a resumed run, tests): the later one takes a suffix.
  for (int k = 0; fd_ < 0; ++k) {
    path_ = k == 0 ? base : base + "." + std::to_string(k);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || k >= 1000))
      fail("cannot create the TensorBoard event file '", path_, "': ", std::strerror(errno));
  }
  tbpb::Event e;
  e.set_wall_time(t);
  e.set_file_version("brain.Event:2");
  append(e.SerializeAsString());
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFileWriter::scalar(const std::string& tag, int64_t step, double value) {
  tbpb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  tbpb::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  append(e.SerializeAsString());
}

void EventFileWriter::append(const std::string& event_bytes) {
  const std::string rec = tfrecord_frame(event_bytes);
  size_t done = 0;
  while (done < rec.size()) {
    const ssize_t w = ::write(fd_, rec.data() + done, rec.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail("cannot write to the TensorBoard event file '", path_,
           "': ", w < 0 ? std::strerror(errno) : "no progress");
    done += static_cast<size_t>(w);
  }
}

}  // namespace dlrec::train
