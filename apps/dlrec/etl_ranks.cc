// `dlrec etl` as one rank of a job of several processes (docs/ETL.md "Several processes").
// Every rank parses its part of the input (etl::parse_input_part); the first malformed row in
// input order ends the job, reported by its rank. Then, where the workflow's fit merges exactly
// (etl::FitParts), each rank fits its own training rows, the partial statistics are added on
// rank 0 in rank (= input) order and the fitted workflow goes to every rank, which transforms
// and writes the shard files it owns (etl/ranks_merge.h), receiving only their rows held by
// other ranks. Otherwise every part's rows are gathered on rank 0, which runs the
// single-process ETL on them. Either way the output is the single-process run's, byte for byte.
#include "etl_ranks.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/fit_merge.h"
#include "dlrec/etl/input_parts.h"
#include "dlrec/etl/ranks_merge.h"

namespace dlrec::cli {
namespace {

// What each rank sent to this one (exchange_bytes), in one buffer.
struct Received {
  std::vector<int64_t> words;
  std::vector<int64_t> offset, size;  // per sending rank: in words, in bytes
  const char* data(int q) const { return reinterpret_cast<const char*>(words.data() + offset[q]); }
  std::string str(int q) const { return std::string(data(q), static_cast<size_t>(size[q])); }
};

// Sends to[d] to rank d for every rank d (8-byte words on the wire: MPI counts are ints, so up
// to 16 GB per pair).
Received exchange_bytes(dist::Communicator& comm, std::vector<std::string> to) {
  const int ranks = comm.size(), rank = comm.rank();
  DLREC_CHECK(static_cast<int>(to.size()) == ranks, "etl: ", to.size(), " messages for ", ranks,
              " ranks");
  // Sizes in bytes, every rank's to every rank (N x N).
  std::vector<int64_t> sizes(ranks), all(static_cast<size_t>(ranks) * ranks);
  for (int d = 0; d < ranks; ++d) sizes[d] = static_cast<int64_t>(to[d].size());
  comm.all_gather(sizes.data(), all.data(), ranks, dist::Elem::I64);
  std::vector<int64_t> send_counts(ranks), send_offsets(ranks), recv_counts(ranks),
      recv_offsets(ranks);
  std::string send;
  int64_t words = 0;
  for (int d = 0; d < ranks; ++d) {
    send_offsets[d] = static_cast<int64_t>(send.size() / 8);
    send += to[d];
    send.resize((send.size() + 7) / 8 * 8);
    send_counts[d] = static_cast<int64_t>(send.size() / 8) - send_offsets[d];
    to[d] = std::string();
    recv_offsets[d] = words;
    recv_counts[d] = (all[static_cast<size_t>(d) * ranks + rank] + 7) / 8;
    words += recv_counts[d];
  }
  Received got;
  got.words.resize(static_cast<size_t>(words));
  comm.all_to_all_v(send.data(), send_counts, send_offsets, got.words.data(), recv_counts,
                    recv_offsets, dist::Elem::I64);
  got.offset = std::move(recv_offsets);
  got.size.resize(ranks);
  for (int q = 0; q < ranks; ++q) got.size[q] = all[static_cast<size_t>(q) * ranks + rank];
  return got;
}

// Every rank's `bytes` on `root`, in rank order; empty strings on the other ranks.
std::vector<std::string> gather_bytes(dist::Communicator& comm, std::string bytes, int root) {
  std::vector<std::string> to(comm.size());
  to[root] = std::move(bytes);
  const Received got = exchange_bytes(comm, std::move(to));
  std::vector<std::string> out(comm.size());
  if (comm.rank() == root)
    for (int q = 0; q < comm.size(); ++q) out[q] = got.str(q);
  return out;
}

// `s` of rank `root` on every rank.
std::string broadcast_string(dist::Communicator& comm, std::string s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  comm.broadcast(&n, 1, dist::Elem::I64, root);
  s.resize(static_cast<size_t>(n));
  if (n > 0) comm.broadcast(s.data(), n, dist::Elem::U8, root);
  return s;
}

// Ends the job from the first rank (in input order) whose `error` is set: that rank throws it
// (the caller ends the job), the others wait until MPI kills them.
void fail_first(dist::Communicator& comm, const std::string& error) {
  const int ranks = comm.size(), rank = comm.rank();
  const int64_t first = comm.all_reduce_value(static_cast<int64_t>(error.empty() ? ranks : rank),
                                              dist::ReduceOp::Min);
  if (first == ranks) return;
  if (rank == first) fail(error);
  comm.barrier();
  fail("etl: rank ", first, " failed");  // not reached: that rank ends the job
}

// The rows gathered on rank 0, which runs the single-process ETL on them.
std::optional<etl::EtlResult> gather_and_run(etl::EtlOptions o, etl::InputPart part,
                                             dist::Communicator& comm) {
  std::vector<std::string> parts = gather_bytes(comm, etl::serialize_parsed(part.parsed), 0);
  part = etl::InputPart{};
  if (comm.rank() != 0) return std::nullopt;
  auto input = std::make_shared<etl::ParsedInput>();
  for (std::string& p : parts) {
    etl::append_serialized(p.data(), p.size(), *input);
    p = std::string();
  }
  o.parsed_input = std::move(input);
  // The gathered rows are in memory already: every pass replays them, not a second copy.
  o.input_cache_mb = 0;
  return etl::run_etl(o);
}

etl::Workflow make_workflow(const etl::EtlOptions& o) {
  const std::string& first = o.inputs.front();
  const size_t slash = first.rfind('/');
  return etl::Workflow::from_config(o.workflow, o.schema,
                                    slash == std::string::npos ? "" : first.substr(0, slash + 1));
}

// The training rows of the split: the first n_train of all rows (run_etl's rule).
int64_t training_rows(const etl::EtlOptions& o, int64_t total) {
  if (o.train_rows >= 0) return o.train_rows;
  return o.valid_ratio > 0 ? etl::train_rows_of(total, o.valid_ratio) : total;
}

// Why the fit of this job is not merged ("" where it is), decided on rank 0: options and
// splits that the merged path does not handle (shuffling and training ranks, a memory budget,
// and the splits run_etl refuses or warns about, whose messages are run_etl's) and workflows
// whose fit does not merge exactly (FitParts::why_not_mergeable).
std::string why_not_merged(const etl::EtlOptions& o, const etl::Workflow& w, int64_t total) {
  if (o.shuffle || o.ranks > 1) return "--shuffle and --ranks are not merged yet";
  if (o.memory_budget_mb > 0) return "a memory budget is not merged yet";
  if (o.read.max_rows >= 0 || o.shard_rows < 1 || o.block_rows < 1 || !(o.valid_ratio >= 0) ||
      o.valid_ratio >= 1)
    return "options the single-process run checks";
  const int64_t n_train = training_rows(o, total);
  if (total <= 0 || n_train <= 0 || n_train > total ||
      (n_train == total && (o.valid_ratio > 0 || o.train_rows >= 0)))
    return "a split that the single-process run refuses or warns about";
  return etl::FitParts::why_not_mergeable(w);
}

// The rows of the files this rank owns, held by the others, are sent to it; returns what this
// rank received from each rank.
std::vector<etl::ParsedInput> exchange_rows(const std::vector<etl::RankShard>& plan,
                                            const std::vector<int64_t>& first,
                                            const std::vector<io::RawChunk>& own,
                                            dist::Communicator& comm) {
  const int ranks = comm.size(), rank = comm.rank();
  std::vector<std::string> to(ranks);
  for (int d = 0; d < ranks; ++d) {
    if (d == rank) continue;
    etl::ParsedInput send;
    for (const etl::RankShard& s : plan)
      if (s.owner == d)
        for (const etl::RowSlice& sl : etl::slices_of(own, first[rank], s.begin, s.end))
          send.chunks.push_back(etl::copy_slice(sl));
    if (!send.chunks.empty()) to[d] = etl::serialize_parsed(send);
  }
  const Received bytes = exchange_bytes(comm, std::move(to));
  std::vector<etl::ParsedInput> got(ranks);
  for (int q = 0; q < ranks; ++q)
    if (bytes.size[q] > 0)
      etl::append_serialized(bytes.data(q), static_cast<size_t>(bytes.size[q]), got[q]);
  return got;
}

// The encoders' counts of every rank added into rank 0's workflow `w` (each rank's `w` holds
// its own part's counts). Rank 0 alone would add ranks - 1 parts per encoder, one after the
// other; instead each encoder has an owner among the other ranks (the largest encoders first,
// each to the owner with the fewest bytes so far), which adds the counts of the ranks other
// than 0 to its own and sends that sum to rank 0: the owners add at once, and rank 0 adds one
// sum per encoder. Counts are integers, so the order of the additions does not matter.
void merge_counts(etl::Workflow& w, dist::Communicator& comm) {
  const int ranks = comm.size(), rank = comm.rank();
  const int n = etl::FitParts::num_counts(w);
  if (ranks < 2 || n == 0) return;
  // size[q * n + j]: rank q's bytes of encoder j (rank 0 sends none).
  std::vector<int64_t> own(n, 0), size(static_cast<size_t>(ranks) * n);
  if (rank != 0)
    for (int j = 0; j < n; ++j) own[j] = static_cast<int64_t>(etl::FitParts::counts_bytes(w, j));
  comm.all_gather(own.data(), size.data(), n, dist::Elem::I64);
  std::vector<int64_t> total(n, 0), load(ranks, 0);
  for (int q = 0; q < ranks; ++q)
    for (int j = 0; j < n; ++j) total[j] += size[static_cast<size_t>(q) * n + j];
  std::vector<int> by_size(n), owner(n);
  for (int j = 0; j < n; ++j) by_size[j] = j;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](int a, int b) { return total[a] > total[b]; });
  for (int j : by_size) {
    int o = 1;
    for (int q = 2; q < ranks; ++q)
      if (load[q] < load[o]) o = q;
    owner[j] = o;
    load[o] += total[j];
  }
  // Each encoder's counts to its owner (its own stay in its workflow), in encoder order.
  std::vector<std::string> mine(n);
  if (rank != 0)
    parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j)
        if (owner[j] != rank) mine[j] = etl::FitParts::save_counts(w, static_cast<int>(j));
    });
  std::vector<std::string> to(ranks);
  for (int j = 0; j < n; ++j) {
    if (owner[j] != rank) to[owner[j]] += mine[j];
    mine[j] = std::string();
  }
  const Received got = exchange_bytes(comm, std::move(to));
  std::vector<int> owned;
  for (int j = 0; j < n; ++j)
    if (owner[j] == rank) owned.push_back(j);
  // Where encoder j's counts from rank q start in what q sent.
  auto at = [&](int q, int j) {
    int64_t off = 0;
    for (int k = 0; k < j; ++k)
      if (owner[k] == rank) off += size[static_cast<size_t>(q) * n + k];
    return off;
  };
  std::vector<std::string> sums(owned.size());
  parallel_for(0, static_cast<int64_t>(owned.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int j = owned[i];
      for (int q = 1; q < ranks; ++q)
        if (q != rank)
          etl::FitParts::add_counts(w, j, got.data(q) + at(q, j),
                                    static_cast<size_t>(size[static_cast<size_t>(q) * n + j]));
      sums[i] = etl::FitParts::save_counts(w, j);
    }
  });
  // The owners' sums to rank 0 (each after its size), added there.
  std::string back;
  for (const std::string& b : sums) {
    const uint64_t len = b.size();
    back.append(reinterpret_cast<const char*>(&len), 8);
    back += b;
  }
  sums.clear();
  const std::vector<std::string> parts = gather_bytes(comm, std::move(back), 0);
  if (rank != 0) return;
  std::vector<std::pair<const char*, uint64_t>> sum_of(n, {nullptr, 0});
  std::vector<size_t> pos(ranks, 0);
  for (int j = 0; j < n; ++j) {
    const std::string& b = parts[owner[j]];
    size_t& p = pos[owner[j]];
    uint64_t len = 0;
    DLREC_CHECK(p + 8 <= b.size(), "etl: rank ", owner[j], "'s counts are cut short");
    std::memcpy(&len, b.data() + p, 8);
    DLREC_CHECK(len <= b.size() - p - 8, "etl: rank ", owner[j], "'s counts are cut short");
    sum_of[j] = {b.data() + p + 8, len};
    p += 8 + len;
  }
  parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j)
      etl::FitParts::add_counts(w, static_cast<int>(j), sum_of[j].first, sum_of[j].second);
  });
}

// Rows handed out in order from what one rank sent.
struct Cursor {
  const std::vector<io::RawChunk>* chunks = nullptr;
  size_t chunk = 0;
  int64_t row = 0;
  void take(int64_t n, std::vector<etl::RowSlice>& out) {
    while (n > 0) {
      DLREC_CHECK(chunks && chunk < chunks->size(), "etl: a rank sent fewer rows than planned");
      const io::RawChunk& c = (*chunks)[chunk];
      const int64_t k = std::min(n, c.rows - row);
      if (k > 0) out.push_back({&c, row, row + k});
      row += k;
      n -= k;
      if (row == c.rows) ++chunk, row = 0;
    }
  }
};

// The merged path (file comment). `w`: rank 0's workflow, built to decide the path.
std::optional<etl::EtlResult> run_merged(const etl::EtlOptions& o, etl::InputPart& part,
                                         const std::vector<int64_t>& rows, int64_t skipped,
                                         etl::Workflow w, dist::Communicator& comm,
                                         const Timer& timer) {
  const int ranks = comm.size(), rank = comm.rank();
  std::vector<int64_t> first(ranks + 1, 0);
  for (int q = 0; q < ranks; ++q) first[q + 1] = first[q] + rows[q];
  const int64_t n_train = training_rows(o, first[ranks]);
  const std::vector<io::RawChunk>& own = part.parsed.chunks;
  etl::EtlResult res;
  res.skipped_rows = skipped;

  // The output directory first, as run_etl decides it (an existing dataset without
  // --overwrite ends the job before any work).
  std::unique_ptr<etl::RankOutput> output;
  if (rank == 0) output = std::make_unique<etl::RankOutput>(o);
  const std::string dir = broadcast_string(comm, output ? output->dir() : "", 0);

  // The fit: this rank's training rows, the parts added on rank 0 in rank order, the dense
  // sums continued rank after rank, the fitted workflow to every rank.
  Timer fit_timer;
  std::vector<const io::RawChunk*> train;
  std::vector<io::RawChunk> cut;
  cut.reserve(1);
  for (const etl::RowSlice& s : etl::slices_of(own, first[rank], 0, n_train)) {
    if (s.begin == 0 && s.end == s.chunk->rows) {
      train.push_back(s.chunk);
    } else {
      cut.push_back(etl::copy_slice(s));
      train.push_back(&cut.back());
    }
  }
  etl::FitParts::fit_part(w, train);
  std::vector<double> sums(etl::FitParts::num_sums(w), 0.0);
  for (int q = 0; q < ranks && !sums.empty(); ++q) {
    if (q == rank) etl::FitParts::continue_sums(w, train, sums);
    comm.broadcast(sums.data(), static_cast<int64_t>(sums.size()), dist::Elem::F64, q);
  }
  cut.clear();
  merge_counts(w, comm);
  std::vector<std::string> heads = gather_bytes(comm, etl::FitParts::save_head(w), 0);
  std::string fitted;
  if (rank == 0) {
    for (int q = 1; q < ranks; ++q) etl::FitParts::add_head(w, heads[q].data(), heads[q].size());
    etl::FitParts::finish(w, sums);
    fitted = w.to_json().dump();
  }
  fitted = broadcast_string(comm, std::move(fitted), 0);
  if (rank != 0) w = etl::Workflow::from_json(parse_json(fitted, "the workflow fitted on rank 0"));
  fitted = std::string();
  res.fit_seconds = fit_timer.seconds();
  res.fit_passes = 1;

  // The files: the rows each owner lacks sent to it, then each owner transforms and writes.
  Timer tr_timer;
  const std::vector<etl::RankShard> plan = etl::plan_rank_shards(first, n_train, o.shard_rows);
  std::string error;
  try {
    std::vector<etl::ParsedInput> got = exchange_rows(plan, first, own, comm);
    std::vector<io::Batch> scratch;  // the transformed chunks' buffers, from file to file
    std::vector<Cursor> from(ranks);
    for (int q = 0; q < ranks; ++q) from[q].chunks = &got[q].chunks;
    for (const etl::RankShard& s : plan) {
      if (s.owner != rank) continue;
      std::vector<etl::RowSlice> slices;
      for (int q = 0; q < ranks; ++q) {
        const int64_t lo = std::max(s.begin, first[q]), hi = std::min(s.end, first[q + 1]);
        if (lo >= hi) continue;
        if (q == rank) {
          for (const etl::RowSlice& sl : etl::slices_of(own, first[rank], lo, hi))
            slices.push_back(sl);
        } else {
          from[q].take(hi - lo, slices);
        }
      }
      etl::write_rank_shard(w, slices, dir + "/" + s.name(), o.block_rows, &scratch);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_first(comm, error);  // every file is written past here
  if (rank != 0) return std::nullopt;
  res.transform_seconds = tr_timer.seconds();
  for (const auto& f : o.inputs) res.input_bytes += static_cast<int64_t>(file_size(f));
  output->finish(w, plan, res, part.parsed.stats.first_skip_reason);
  res.total_seconds = timer.seconds();
  return res;
}

}  // namespace

std::optional<etl::EtlResult> run_etl_ranks(etl::EtlOptions o, dist::Communicator& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  const int64_t files = static_cast<int64_t>(o.inputs.size());
  Timer timer;
  etl::InputPart part = etl::parse_input_part(o.inputs, o.schema, o.read, rank, ranks);
  const double own_parse = timer.seconds();
  // Line numbers: file f's lines in the parts before this one.
  std::vector<int64_t> lines(ranks * files), before(files, 0);
  comm.all_gather(part.file_lines.data(), lines.data(), files, dist::Elem::I64);
  for (int q = 0; q < rank; ++q)
    for (int64_t f = 0; f < files; ++f) before[f] += lines[q * files + f];
  const std::string error = etl::settle_part(part, o.inputs, before);
  // The first malformed row in input order (OnError::Fail) ends the job from its rank.
  fail_first(comm, part.failed ? error : "");
  const std::vector<int64_t> rows = comm.all_gather_counts(part.parsed.stats.rows);
  const std::vector<int64_t> skipped = comm.all_gather_counts(part.parsed.stats.skipped_rows);
  int64_t total = 0, total_skipped = 0;
  for (int q = 0; q < ranks; ++q) total += rows[q], total_skipped += skipped[q];
  // The first skipped row's message: the earliest rank's (on rank 0).
  std::vector<std::string> reasons = gather_bytes(comm, part.parsed.stats.first_skip_reason, 0);
  if (rank == 0)
    std::printf(
        "etl: %d processes parsed %lld rows (%lld skipped) in %.2fs (rank 0's part %.2fs)\n", ranks,
        static_cast<long long>(total), static_cast<long long>(total_skipped), timer.seconds(),
        own_parse);

  // Rank 0 decides whether the fit is merged (its workflow errors end the job from there).
  std::optional<etl::Workflow> w;
  std::string why;
  if (rank == 0) {
    w.emplace(make_workflow(o));
    why = why_not_merged(o, *w, total);
  }
  why = broadcast_string(comm, why, 0);
  if (!why.empty()) {
    if (rank == 0)
      std::printf(
          "etl: the statistics are not merged across processes (%s): rank 0 gathers "
          "every row and runs the ETL alone\n",
          why.c_str());
    return gather_and_run(std::move(o), std::move(part), comm);
  }
  if (rank != 0) w.emplace(make_workflow(o));
  if (rank == 0) {
    std::printf("etl: statistics merged across %d processes; each writes the shards it owns\n",
                ranks);
    std::fflush(stdout);
    part.parsed.stats.first_skip_reason.clear();
    for (const std::string& r : reasons)
      if (!r.empty()) {
        part.parsed.stats.first_skip_reason = r;
        break;
      }
  }
  return run_merged(o, part, rows, total_skipped, std::move(*w), comm, timer);
}

}  // namespace dlrec::cli
