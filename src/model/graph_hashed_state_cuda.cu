// Hashed embedding tables of the CUDA graph model (graph_hashed_cuda.h): counters and the
// state's export to and import from the host tensors that checkpoints hold. The step's kernels
// are in graph_hashed_cuda.cu.
#include "model/graph_hashed_cuda.h"
#include "model/graph_hashed_cuda_internal.h"

#include "model/graph_hashed_cuda.h"
#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>
#include "core/cuda_check.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/embedding/hash_common.h"

namespace dlrec::model::hashed_cuda {

using namespace state_layout;

std::vector<Stats> HashedTables::stats() {
  DLREC_CUDA_CHECK(cudaStreamSynchronize(st_));
  std::vector<int64_t> ctl(num_tables() * kNF);
  copy_bytes(ctl.data(), Device::cpu(), d_ctl_.raw(), dev_, ctl.size() * sizeof(int64_t));
  std::vector<Stats> out(num_tables());
  for (int64_t t = 0; t < num_tables(); ++t) {
    const int64_t* c = ctl.data() + t * kNF;
    out[t] = {c[kSize], c[kLookups], c[kHits], c[kInserts], c[kEvictions]};
  }
  return out;
}

const std::vector<HashedTables::HostState>& HashedTables::export_state() {
  if (handed_out_) return host_;
  DLREC_CUDA_CHECK(cudaStreamSynchronize(st_));
  std::vector<int64_t> keys(total_rows_), stamps(total_rows_), ctl(num_tables() * kNF);
  copy_bytes(keys.data(), Device::cpu(), d_slot_key_.raw(), dev_, keys.size() * 8);
  copy_bytes(stamps.data(), Device::cpu(), d_stamp_.raw(), dev_, stamps.size() * 8);
  copy_bytes(ctl.data(), Device::cpu(), d_ctl_.raw(), dev_, ctl.size() * 8);
  for (int64_t t = 0; t < num_tables(); ++t) {
    const int64_t* c = ctl.data() + t * kNF;
    const int64_t C = caps_[t], n = c[kSize], base = sbase_[t];
    HostState& h = host_[t];
    int64_t* hk = h.keys.data<int64_t>();
    int32_t* prev = h.lru.data<int32_t>();
    int32_t* next = prev + C;
    std::fill(hk, hk + C, 0);
    std::fill(prev, prev + 2 * C, -1);
    // Rows in use are slots [0, n) between steps (free rows are taken from the top of a stack
    // that starts with the slots in order, and a full table's evictions are refilled in the
    // same step); the LRU list is their order by stamp.
    std::vector<int32_t> order(n);
    for (int64_t s = 0; s < n; ++s) {
      DLREC_CHECK(stamps[base + s] != kFree, "hashed table '", opts_[t].name, "': row ", s,
                  " of ", n, " is not in use (bug)");
      order[s] = static_cast<int32_t>(s);
      hk[s] = keys[base + s];
    }
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return stamps[base + a] < stamps[base + b]; });
    for (int64_t i = 0; i < n; ++i) {
      prev[order[i]] = i > 0 ? order[i - 1] : -1;
      next[order[i]] = i + 1 < n ? order[i + 1] : -1;
    }
    int64_t* m = h.meta.data<int64_t>();
    m[0] = n;
    m[1] = n > 0 ? order.front() : -1;
    m[2] = n > 0 ? order.back() : -1;
    m[3] = c[kLookups];
    m[4] = c[kHits];
    m[5] = c[kInserts];
    m[6] = c[kEvictions];
    m[7] = C;
  }
  handed_out_ = true;
  return host_;
}

// Checks the host tensors of every table like the CPU table's import_tensors and rebuilds the
// device state from them: rows [0, n) in use, stamps = position in the LRU list, the free stack
// holding n .. C-1 (n on top), the counters, the index. A table whose tensors fail a check is
// left empty (device and host) and the first failure is thrown, naming the table.
void HashedTables::import_state() {
  const int64_t T = num_tables();
  DLREC_CUDA_CHECK(cudaStreamSynchronize(st_));
  std::vector<int64_t> keys(total_rows_, 0), stamps(total_rows_, kFree), ctl(T * kNF, 0);
  std::vector<int32_t> fl(total_rows_);
  std::string first_error;
  int64_t seq = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t C = caps_[t], base = sbase_[t];
    HostState& h = host_[t];
    const int64_t* m = h.meta.data<int64_t>();
    const int64_t* hk = h.keys.data<int64_t>();
    const int32_t* prev = h.lru.data<int32_t>();
    const int32_t* next = prev + C;
    std::string why;
    auto bad = [&](auto&&... parts) {
      if (why.empty()) why = detail::concat(parts...);
    };
    const int64_t n = m[0];
    if (m[7] != C) bad("capacity ", m[7], " in the file, the table has ", C);
    else if (n < 0 || n > C) bad("size ", n, " is outside 0 .. ", C);
    else if (m[3] < 0 || m[4] < 0 || m[5] < 0 || m[6] < 0) bad("a negative counter");
    else if (m[4] > m[3]) bad("more hits than lookups");
    std::vector<int64_t> order;
    if (why.empty()) {
      std::vector<char> seen(static_cast<size_t>(n), 0);
      int64_t p = -1;
      for (int64_t s = n > 0 ? m[1] : -1; s >= 0 && why.empty(); s = next[s]) {
        if (s >= n || seen[s]) bad("the LRU list is broken at slot ", s);
        else if (prev[s] != p) bad("the LRU list's back link of slot ", s, " is wrong");
        else {
          seen[s] = 1;
          p = s;
          order.push_back(s);
        }
      }
      if (why.empty() && (static_cast<int64_t>(order.size()) != n ||
                          (n > 0 ? m[2] != p : (m[1] != -1 || m[2] != -1))))
        bad("the LRU list holds ", order.size(), " slots, the size is ", n);
    }
    if (why.empty()) {
      std::unordered_set<int64_t> distinct;
      for (int64_t s = 0; s < n && why.empty(); ++s) {
        if (hk[s] < 0) bad("key ", hk[s], " (slot ", s, ") is negative; hashed tables on CUDA "
                           "hold keys >= 0");
        else if (!distinct.insert(hk[s]).second) bad("key ", hk[s], " has two rows");
      }
    }
    int64_t* c = ctl.data() + t * kNF;
    const int64_t used = why.empty() ? n : 0;
    if (why.empty()) {
      for (int64_t s = 0; s < n; ++s) keys[base + s] = hk[s];
      for (int64_t i = 0; i < n; ++i) stamps[base + order[i]] = i;
      c[kLookups] = m[3];
      c[kHits] = m[4];
      c[kInserts] = m[5];
      c[kEvictions] = m[6];
    } else {
      if (first_error.empty())
        first_error = detail::concat("hashed table '", opts_[t].name, "': ", why,
                          " (not a state this table wrote: a corrupt or mismatched file)");
      // Left empty; its tensors say so.
      std::fill(h.keys.data<int64_t>(), h.keys.data<int64_t>() + C, 0);
      std::fill(h.lru.data<int32_t>(), h.lru.data<int32_t>() + 2 * C, -1);
      int64_t* hm = h.meta.data<int64_t>();
      std::fill(hm, hm + 8, 0);
      hm[1] = hm[2] = -1;
      hm[7] = C;
    }
    for (int64_t j = 0; j < C - used; ++j) fl[base + j] = static_cast<int32_t>(C - 1 - j);
    c[kSize] = used;
    c[kTop] = C - used;
    c[kRebuild] = 1;
    seq = std::max(seq, used);
  }
  copy_bytes(d_slot_key_.raw(), dev_, keys.data(), Device::cpu(), keys.size() * 8);
  copy_bytes(d_stamp_.raw(), dev_, stamps.data(), Device::cpu(), stamps.size() * 8);
  copy_bytes(d_free_.raw(), dev_, fl.data(), Device::cpu(), fl.size() * 4);
  copy_bytes(d_ctl_.raw(), dev_, ctl.data(), Device::cpu(), ctl.size() * 8);
  const int64_t glob[kNG] = {seq, 0, 1};
  copy_bytes(d_glob_.raw(), dev_, glob, Device::cpu(), sizeof(glob));
  seq_bound_ = static_cast<uint64_t>(seq);
  rebuild_index_all(st_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(st_));
  handed_out_ = false;
  if (!first_error.empty()) fail(first_error);
}

}  // namespace dlrec::model::hashed_cuda
