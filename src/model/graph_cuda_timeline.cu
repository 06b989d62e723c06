// The step's diagnostics (docs/DIAGNOSTICS.md). DLREC_PROFILE=1: GraphCuda::mark records an event
// per phase on the main stream (eager steps, no graphs), flush_profile sums the times between
// them after each step from the fourth on, profile_print prints them per step at destruction.
//
// DLREC_PROFILE=timeline: the training step stays one CUDA graph with its
// streams; GraphCuda::mark records an external event node on the current stream (and
// Engine::mark_on on the communicators' streams around each collective), and after each step
// the time of every mark from the step's start is summed, printed per rank at destruction.
// Data-parallel, the ranks are first aligned by a one-value all-reduce (timeline_align) and the
// marks timed from its end, so that the first collective no longer holds the ranks' launch
// skew; the alignment's own time, that skew, is printed apart.
#include <algorithm>
#include <cstdio>
#include <string>

#include "model/graph_cuda_impl.h"

namespace dlrec::model::graph_cuda_impl {

void GraphCuda::mark(const std::string& what) {
  if (timeline_) {
    if (in_body_) timeline_mark(what, e_.st);
    return;
  }
  if (!profile_) return;
  const size_t i = marks_.size();
  if (i == events_.size()) events_.emplace_back(dev_index_, /*timing=*/true);
  DLREC_CUDA_CHECK(cudaEventRecord(events_[i], e_.st));
  marks_.push_back(what);
}

void GraphCuda::flush_profile() {
  if (timeline_) {
    timeline_flush();
    return;
  }
  if (!profile_ || marks_.empty()) return;
  DLREC_CUDA_CHECK(cudaEventSynchronize(events_[marks_.size() - 1]));
  if (e_.dp.comm) profile_rank_ = e_.dp.rank;  // the communicator may be gone at the end
  if (++seen_steps_ > 3) {
    ++profiled_steps_;
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      auto it = std::find_if(phase_ms_.begin(), phase_ms_.end(),
                             [&](const auto& p) { return p.first == marks_[i]; });
      if (it == phase_ms_.end()) phase_ms_.emplace_back(marks_[i], ms);
      else it->second += ms;
    }
  }
  marks_.clear();
}

void GraphCuda::profile_print() {
  double total = 0;
  for (auto& p : phase_ms_) total += p.second;
  // Data-parallel: every rank prints its own phases, labelled (the lines of ranks interleave).
  char who[32] = "[profile]";
  if (profile_rank_ >= 0) std::snprintf(who, sizeof who, "[profile r%d]", profile_rank_);
  std::fprintf(stderr, "%s %lld steps of batch %lld, device ms per step by phase:\n", who,
               static_cast<long long>(profiled_steps_), static_cast<long long>(fwd_rows_));
  for (auto& p : phase_ms_)
    std::fprintf(stderr, "%s   %-28s %8.3f ms  %5.1f%%\n", who, p.first.c_str(),
                 p.second / profiled_steps_, 100.0 * p.second / std::max(total, 1e-9));
  std::fprintf(stderr, "%s   %-28s %8.3f ms\n", who, "total", total / profiled_steps_);
  if (e_.lt)
    std::fprintf(stderr, "[profile]   cuBLASLt plans without an algorithm (fallbacks): %d\n",
                 e_.lt->unsupported_count());
}

void GraphCuda::timeline_mark(const std::string& what, cudaStream_t s) {
  const size_t i = marks_.size();
  if (i == events_.size()) events_.emplace_back(dev_index_, /*timing=*/true);
  // Inside a capture an external event node (recorded when a replay reaches this point; a
  // plain record would be a dependency), else a plain record (the eager steps).
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  DLREC_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
  if (cap == cudaStreamCaptureStatusActive)
    DLREC_CUDA_CHECK(cudaEventRecordWithFlags(events_[i], s, cudaEventRecordExternal));
  else
    DLREC_CUDA_CHECK(cudaEventRecord(events_[i], s));
  const char* on = s == st_.get() ? "main" : s == side_.get() ? "side"
                   : (wst_ && s == wst_.get()) ? "wgt" : s == e_.dp.cst ? "comm"
                   : s == e_.dp.dcst ? "dcomm" : "?";
  marks_.push_back(std::string(on) + "  " + what);
}

void GraphCuda::timeline_setup() {  // the alignment's value, zeroed once (its sum stays zero)
  tl_align_ = Tensor::empty({1}, DType::F32, dev_);
  DLREC_CUDA_CHECK(cudaMemsetAsync(tl_align_.raw(), 0, sizeof(float), e_.st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

void GraphCuda::timeline_align() {
  tl_origin_ = 0;
  if (!e_.dp.comm) return;
  e_.on_comm("align ranks", [&](dist::Communicator& c) {
    c.all_reduce(tl_align_.raw(), 1, dist::Elem::F32);
  });
  tl_origin_ = marks_.size() - 1;  // "< align ranks", on the communicator's stream
}

void GraphCuda::timeline_flush() {
  // marks_ holds the labels of the last run of the step's body (the capture: a replay runs
  // the same events).
  if (marks_.empty()) return;
  DLREC_CUDA_CHECK(cudaDeviceSynchronize());
  if (e_.dp.comm) profile_rank_ = e_.dp.rank;
  if (tl_ms_.size() != marks_.size()) {
    tl_ms_.assign(marks_.size(), 0.0);
    tl_skew_ms_ = 0;
    profiled_steps_ = 0;
  }
  if (++seen_steps_ <= 3) return;
  ++profiled_steps_;
  const size_t o = tl_origin_ < marks_.size() ? tl_origin_ : 0;
  float ms = 0;
  if (o > 0) {
    DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[o]));
    tl_skew_ms_ += ms;
  }
  for (size_t i = o + 1; i < marks_.size(); ++i) {
    DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[o], events_[i]));
    tl_ms_[i] += ms;
  }
}

void GraphCuda::timeline_print() {
  if (profiled_steps_ == 0) return;
  char who[32] = "[timeline]";
  if (profile_rank_ >= 0) std::snprintf(who, sizeof who, "[timeline r%d]", profile_rank_);
  const size_t o = tl_origin_ < marks_.size() ? tl_origin_ : 0;
  std::fprintf(stderr, "%s %lld graph replays of batch %lld, ms from the step's start%s when "
               "each stream reaches the mark:\n", who, static_cast<long long>(profiled_steps_),
               static_cast<long long>(fwd_rows_), o > 0 ? " (the ranks aligned)" : "");
  if (o > 0)
    std::fprintf(stderr, "%s %8.3f  skew: the alignment all-reduce, from this rank's launch "
                 "(not in the times below)\n", who, tl_skew_ms_ / profiled_steps_);
  for (size_t i = o + 1; i < marks_.size() && i < tl_ms_.size(); ++i)
    std::fprintf(stderr, "%s %8.3f  %s\n", who, tl_ms_[i] / profiled_steps_,
                 marks_[i].c_str());
}

}  // namespace dlrec::model::graph_cuda_impl
