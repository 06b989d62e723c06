// ShardLoader: batches of a fixed size from a list of shards, read ahead by worker threads.
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"

namespace dlrec::io {

// ---------------------------------------------------------------------------------------------
// ShardLoader

// Batches are read by `workers` threads, worker w producing batches w, w + workers, ...
// (each with its own readers: a reader caches one block), at most kDepth batches ahead of the
// consumer per worker; next() hands them out in order. An error is raised when the consumer
// reaches the batch that failed, after every batch before it.
struct ShardLoader::Impl {
  std::vector<std::string> paths;
  std::vector<std::vector<std::unique_ptr<ShardReader>>> readers;  // [worker][shard]
  std::vector<int64_t> starts;  // first global row of each shard, plus the total
  int64_t batch_size = 0;
  int part = 0, parts = 1;  // data-parallel part (see shard.h)
  int64_t first = 0;      // start_row
  int64_t nbatches = 0;
  int64_t delivered = 0;  // global row position of the next batch handed out
  ShardLayout layout;
  int workers = 1;

  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, Batch> ready;  // batch index -> batch
  int64_t next_index = 0;          // the consumer's next batch
  std::vector<Batch> free_list;
  std::exception_ptr error;
  int64_t error_index = INT64_MAX;
  bool stop = false;
  static constexpr int64_t kDepth = 2;  // batches ahead per worker
  std::vector<std::thread> threads;

  void produce(int w) {
    int64_t i = w;
    try {
      const int64_t total = starts.back();
      for (; i < nbatches; i += workers) {
        Batch b;
        {
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return stop || i < next_index + kDepth * workers; });
          if (stop) return;
          if (!free_list.empty()) {
            b = std::move(free_list.back());
            free_list.pop_back();
          }
        }
        const int64_t global = batch_size * parts;
        const int64_t gpos = first + i * global, gend = std::min(total, gpos + global);
        int64_t pos = gpos + part * batch_size;
        int64_t end = std::min(gend, pos + batch_size);
        if (gend - gpos < global) {  // the last, partial global batch: even contiguous pieces
          pos = gpos + (gend - gpos) * part / parts;
          end = gpos + (gend - gpos) * (part + 1) / parts;
        }
        b.reset(layout.num_dense, static_cast<int>(layout.cardinalities.size()));
        Batch part;
        while (pos < end) {
          size_t s = std::upper_bound(starts.begin(), starts.end(), pos) - starts.begin() - 1;
          const int64_t lo = pos - starts[s];
          const int64_t n = std::min(end, starts[s + 1]) - pos;
          if (b.rows == 0 && n == end - pos) {
            readers[w][s]->read(lo, n, b);
          } else {
            readers[w][s]->read(lo, n, part);
            b.append(part);
          }
          pos += n;
        }
        {
          std::lock_guard<std::mutex> g(mu);
          ready.emplace(i, std::move(b));
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (i < error_index) {
        error = std::current_exception();
        error_index = i;
      }
    }
    cv.notify_all();
  }
};

ShardLoader::ShardLoader(std::vector<std::string> paths, int64_t batch_size, int64_t start_row,
                         int part, int parts)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  DLREC_CHECK(batch_size >= 1, "ShardLoader: batch_size must be >= 1, got ", batch_size);
  DLREC_CHECK(parts >= 1 && part >= 0 && part < parts, "ShardLoader: part ", part,
              " is outside [0, ", parts, ")");
  m.part = part;
  m.parts = parts;
  DLREC_CHECK(!paths.empty(), "ShardLoader: no shard files");
  m.paths = std::move(paths);
  m.batch_size = batch_size;
  m.starts.push_back(0);
  m.workers = std::clamp(num_threads() / 4, 1, 4);
  m.readers.resize(static_cast<size_t>(m.workers));
  for (const auto& p : m.paths) {
    m.readers[0].push_back(std::make_unique<ShardReader>(p));
    const ShardReader& r = *m.readers[0].back();
    if (m.readers[0].size() == 1) {
      m.layout = r.layout();
    } else if (!(r.layout() == m.layout)) {
      fail("shard '", p, "' has a different layout (", r.layout().to_json().dump(), ") than '",
           m.paths[0], "' (", m.layout.to_json().dump(), ")");
    }
    m.starts.push_back(m.starts.back() + r.rows());
  }
  for (int w = 1; w < m.workers; ++w)
    for (const auto& p : m.paths) m.readers[w].push_back(std::make_unique<ShardReader>(p));
  DLREC_CHECK(start_row >= 0 && start_row <= m.starts.back(), "ShardLoader: start_row ",
              start_row, " is outside [0, ", m.starts.back(), "]");
  m.delivered = m.first = start_row;
  const int64_t global = batch_size * parts;
  m.nbatches = (m.starts.back() - start_row + global - 1) / global;
  for (int w = 0; w < m.workers; ++w) m.threads.emplace_back([this, w] { impl_->produce(w); });
}

ShardLoader::~ShardLoader() {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
}

bool ShardLoader::next(Batch& out) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> l(m.mu);
  m.cv.wait(l, [&] {
    return m.next_index >= m.nbatches || m.ready.count(m.next_index) ||
           m.error_index <= m.next_index;
  });
  auto it = m.ready.find(m.next_index);
  if (it == m.ready.end()) {
    if (m.error_index <= m.next_index && m.error) {
      std::exception_ptr e = m.error;
      m.error = nullptr;
      std::rethrow_exception(e);
    }
    return false;
  }
  std::swap(out, it->second);  // the caller's old buffers go back to the producers
  m.free_list.push_back(std::move(it->second));
  m.ready.erase(it);
  ++m.next_index;
  m.delivered += out.rows;
  l.unlock();
  m.cv.notify_all();
  return true;
}

int64_t ShardLoader::position() const { return impl_->delivered; }
int64_t ShardLoader::total_rows() const { return impl_->starts.back(); }
const ShardLayout& ShardLoader::layout() const { return impl_->layout; }


}  // namespace dlrec::io
