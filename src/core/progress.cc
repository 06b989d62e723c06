#include "dlrec/core/progress.h"

#include <algorithm>
#include <atomic>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dlrec {

namespace {
std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}
std::string duration(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}
}  // namespace

std::atomic<bool> g_quiet{false};

void set_progress_quiet(bool quiet) { g_quiet.store(quiet, std::memory_order_relaxed); }

Progress::Progress(std::string label, int64_t total, std::string unit, double interval_s)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), interval_s_(interval_s) {
  start_ = last_ = std::chrono::steady_clock::now();
  quiet_ = g_quiet.load(std::memory_order_relaxed);
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, const std::string& status) {
  done_ = done;  // for finish(), even when this update is not printed
  auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_).count() < interval_s_) return;
  last_ = now;
  print(done, status, false);
}

void Progress::finish(const std::string& status) {
  // An unknown total (<= 0): the last update's count (this printed "0 rows" on inputs too small
  // for an update to be printed).
  finish(total_ > 0 ? total_ : std::max<int64_t>(done_, 0), status);
}

void Progress::finish(int64_t done, const std::string& status) {
  if (finished_) return;
  finished_ = true;
  print(done, status, true);
}

void Progress::print(int64_t done, const std::string& status, bool final) {
  if (quiet_) return;
  double t = elapsed_s();
  double rate = t > 0 ? done / t : 0;
  std::string line = "[" + label_ + "] " + human(double(done));
  if (total_ > 0) {
    char pct[16];
    std::snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * done / total_);
    line += "/" + human(double(total_)) + " " + unit_ + pct;
  } else {
    line += " " + unit_;
  }
  line += "  " + human(rate) + " " + unit_ + "/s  elapsed " + duration(t);
  if (!final && total_ > 0 && rate > 0) line += "  ETA " + duration((total_ - done) / rate);
  if (!status.empty()) line += "  " + status;
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace dlrec
