// Progress reporting for long work: rate, ETA and free-form status, printed to stderr at most
// once per interval. Silent after set_progress_quiet(true) (the CLI's --quiet).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dlrec {

// Silences every Progress of the process (progress lines only; errors and results still print).
void set_progress_quiet(bool quiet);

class Progress {
 public:
  // total <= 0 means unknown (no ETA). `unit` names what is counted ("rows", "samples").
  Progress(std::string label, int64_t total, std::string unit, double interval_s = 2.0);
  // Reports `done` units so far; `status` is appended (e.g. "loss=0.45").
  void update(int64_t done, const std::string& status = "");
  // Prints the final line (the total, or when it is unknown the count of the last update();
  // elapsed time, mean rate).
  void finish(const std::string& status = "");
  // The same with the count reached (where the total was an estimate or counted rows that were
  // skipped).
  void finish(int64_t done, const std::string& status = "");
  double elapsed_s() const;

 private:
  void print(int64_t done, const std::string& status, bool final);
  std::string label_, unit_;
  int64_t total_;
  int64_t done_ = -1;  // the last update()'s count (-1: none yet)
  double interval_s_;
  std::chrono::steady_clock::time_point start_, last_;
  bool finished_ = false;
  bool quiet_ = false;
};

// Wall-clock stopwatch.
class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void reset() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dlrec
