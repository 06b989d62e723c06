// A program that tests/dist starts under mpirun: it runs one scenario of collectives on every
// rank and exits 0 when each result is right ("ok rank R" on stdout), non-zero otherwise.
//   dist_worker collectives         every collective, checked against closed forms
//   dist_worker timeout             rank 1 arrives 4 s late; the others time out after 1 s
//   dist_worker die                 rank 1 is killed (SIGKILL) before the first collective
//   dist_worker nccl                the NCCL communicator on GPU <local rank> (GPU hosts)
//   dist_worker hier                hierarchical all_to_all_v (2 declared nodes) == flat, MPI
//   dist_worker nccl-hier           the same on NCCL, directly and replayed from a CUDA graph
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/topology.h"

#ifdef DLREC_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace dlrec;

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) fail("check failed: ", what);
}

void collectives(dist::Communicator& c) {
  const int r = c.rank(), n = c.size();
  // all_reduce f32, f64, i64: sum, max, min.
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i * (r + 1));
  c.all_reduce(f.data(), static_cast<int64_t>(f.size()));
  const float tri = n * (n + 1) / 2.f;
  for (size_t i = 0; i < f.size(); ++i) expect(f[i] == i * tri, "all_reduce f32 sum");
  std::vector<double> d = {0.1 * r, 1e300};
  c.all_reduce(d.data(), 2, dist::ReduceOp::Max);
  expect(d[0] == 0.1 * (n - 1) && d[1] == 1e300, "all_reduce f64 max");
  int64_t v = 1000 + r;
  c.all_reduce(&v, 1, dist::ReduceOp::Min);
  expect(v == 1000, "all_reduce i64 min");
  expect(c.all_reduce_value(0.5) == 0.5 * n, "all_reduce_value f64");
  expect(c.all_reduce_value(int64_t{3}) == 3 * n, "all_reduce_value i64");
  // A tensor, and an empty all_reduce (still a collective every rank counts).
  Tensor t = Tensor::from_vector<float>({1.f, 2.f}, {2});
  c.all_reduce(t);
  expect(t.to_vector<float>() == std::vector<float>({1.f * n, 2.f * n}), "all_reduce tensor");
  c.all_reduce(static_cast<float*>(nullptr), 0);
  // broadcast from the last rank.
  std::vector<int32_t> b(5, r);
  c.broadcast(b.data(), 5, dist::Elem::I32, n - 1);
  for (int x : b) expect(x == n - 1, "broadcast");
  // all_gather.
  std::vector<int64_t> mine = {r, 10 * r}, all(2 * n);
  c.all_gather(mine.data(), all.data(), 2, dist::Elem::I64);
  for (int s = 0; s < n; ++s) expect(all[2 * s] == s && all[2 * s + 1] == 10 * s, "all_gather");
  // reduce_scatter: block s of rank r holds r + s; rank r gets sum over ranks of (k + r).
  std::vector<double> rs(3 * n), got(3);
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < 3; ++k) rs[3 * s + k] = r + s + k;
  c.reduce_scatter(rs.data(), got.data(), 3, dist::Elem::F64);
  for (int k = 0; k < 3; ++k) expect(got[k] == n * (r + k) + n * (n - 1) / 2.0, "reduce_scatter");
  // all_to_all_v: rank r sends s + 1 values (r * 100 + s) to rank s.
  std::vector<int64_t> sc(n), so(n), rc(n), ro(n);
  std::vector<float> send, recv;
  for (int s = 0; s < n; ++s) {
    so[s] = static_cast<int64_t>(send.size());
    sc[s] = s + 1;
    for (int k = 0; k <= s; ++k) send.push_back(static_cast<float>(r * 100 + s));
    rc[s] = r + 1;
    ro[s] = s * (r + 1);
  }
  recv.assign(n * (r + 1), -1.f);
  c.all_to_all_v(send.data(), sc, so, recv.data(), rc, ro, dist::Elem::F32);
  for (int s = 0; s < n; ++s)
    for (int k = 0; k <= r; ++k) expect(recv[s * (r + 1) + k] == s * 100 + r, "all_to_all_v");
  // all_gather_v: rank r contributes r + 1 values equal to r.
  const auto counts = c.all_gather_counts(r + 1);
  std::vector<int32_t> part(r + 1, r), gathered(n * (n + 1) / 2);
  c.all_gather_v(part.data(), gathered.data(), counts, dist::Elem::I32);
  size_t at = 0;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k <= s; ++k) expect(gathered[at++] == s, "all_gather_v");
  // 16-bit floats move but do not reduce.
  bool refused = false;
  try {
    uint16_t h = 0;
    c.all_reduce(&h, 1, dist::Elem::BF16);
  } catch (const Error& e) {
    refused = std::strstr(e.what(), "bf16") != nullptr;
  }
  expect(refused, "bf16 all_reduce refused with a message naming bf16");
  c.barrier();
}

// The NCCL collectives on device buffers, checked on the host.
void nccl_collectives(dist::Communicator& boot) {
  auto c = dist::make_nccl_communicator(boot, dist::mpi_local_rank());
  const int r = c->rank(), n = c->size();
  const Device dev = c->device();
  auto to_dev = [&](const std::vector<float>& v) {
    return Tensor::from_vector(v, {(int64_t)v.size()}, dev);
  };
  std::vector<float> f(4097);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 100) * (r + 1);
  Tensor t = to_dev(f);
  c->all_reduce(t);
  std::vector<float> got = t.to_vector<float>();
  for (size_t i = 0; i < f.size(); ++i)
    expect(got[i] == (i % 100) * n * (n + 1) / 2.f, "nccl all_reduce f32");
  Tensor mine = to_dev({static_cast<float>(r), static_cast<float>(10 * r)});
  Tensor all = Tensor::empty({2 * n}, DType::F32, dev);
  c->all_gather(mine.raw(), all.raw(), 2, dist::Elem::F32);
  got = all.to_vector<float>();
  for (int s = 0; s < n; ++s)
    expect(got[2 * s] == s && got[2 * s + 1] == 10 * s, "nccl all_gather");
  std::vector<float> rs(2 * n);
  for (int s = 0; s < n; ++s) rs[2 * s] = rs[2 * s + 1] = static_cast<float>(r + s);
  Tensor rs_in = to_dev(rs), rs_out = Tensor::empty({2}, DType::F32, dev);
  c->reduce_scatter(rs_in.raw(), rs_out.raw(), 2, dist::Elem::F32);
  got = rs_out.to_vector<float>();
  expect(got[0] == n * r + n * (n - 1) / 2.f, "nccl reduce_scatter");
  // all_to_all_v: rank r sends s + 1 values (r * 100 + s) to rank s.
  std::vector<int64_t> sc(n), so(n), rc(n), ro(n);
  std::vector<float> send;
  for (int s = 0; s < n; ++s) {
    so[s] = static_cast<int64_t>(send.size());
    sc[s] = s + 1;
    for (int k = 0; k <= s; ++k) send.push_back(static_cast<float>(r * 100 + s));
    rc[s] = r + 1;
    ro[s] = s * (r + 1);
  }
  Tensor sd = to_dev(send), rv = Tensor::zeros({n * (r + 1)}, DType::F32, dev);
  c->all_to_all_v(sd.raw(), sc, so, rv.raw(), rc, ro, dist::Elem::F32);
  got = rv.to_vector<float>();
  for (int s = 0; s < n; ++s)
    for (int k = 0; k <= r; ++k) expect(got[s * (r + 1) + k] == s * 100 + r, "nccl all_to_all_v");
  Tensor b = to_dev({static_cast<float>(r)});
  c->broadcast(b, n - 1);
  expect(b.to_vector<float>()[0] == n - 1, "nccl broadcast");
  expect(c->all_reduce_value(int64_t{2}) == 2 * n, "nccl all_reduce_value");
  c->barrier();
  // duplicate(): a second communicator over the same ranks, its own stream; both work after.
  auto d = c->duplicate();
  expect(d && d->rank() == r && d->size() == n && d->stream() && d->stream() != c->stream(),
         "nccl duplicate: same ranks, own stream");
  Tensor x = to_dev({1.f + r});
  d->all_reduce(x);
  expect(x.to_vector<float>()[0] == n * (n + 1) / 2.f, "nccl duplicate all_reduce");
  expect(c->all_reduce_value(int64_t{3}) == 3 * n, "nccl all_reduce_value after duplicate");
}

// One random all_to_all_v of the same sizes on every rank (the counts matrix comes from a seed
// all ranks share; the bytes from one per rank): send layout, recv layout with gaps.
struct RandomExchange {
  dist::Elem type;
  std::vector<int64_t> sc, so, rc, ro;
  std::vector<uint8_t> send;
  size_t recv_bytes = 0;
  RandomExchange(int rank, int n, uint32_t seed) {
    std::mt19937 shared(seed), mine(seed * 7919 + rank);
    const dist::Elem types[] = {dist::Elem::U8, dist::Elem::I32, dist::Elem::I64, dist::Elem::F32,
                                dist::Elem::BF16};
    type = types[shared() % 5];
    const size_t es = dist::elem_size(type);
    std::vector<int64_t> counts(static_cast<size_t>(n) * n);
    const int64_t big = shared() % 4 == 0 ? 5000 : 40;  // now and then larger messages
    for (auto& c : counts) c = shared() % 3 == 0 ? 0 : shared() % big;  // a third empty
    sc.resize(n), so.resize(n), rc.resize(n), ro.resize(n);
    int64_t at = 0;
    for (int d = n - 1; d >= 0; --d) {  // blocks in reverse rank order, with gaps
      at += mine() % 3;
      so[d] = at;
      sc[d] = counts[static_cast<size_t>(rank) * n + d];
      at += sc[d];
    }
    send.resize(at * es);
    for (auto& b : send) b = static_cast<uint8_t>(mine());
    at = 0;
    for (int s = 0; s < n; ++s) {
      at += 1 + mine() % 2;
      ro[s] = at;
      rc[s] = counts[static_cast<size_t>(s) * n + rank];
      at += rc[s];
    }
    recv_bytes = (at + 1) * es;
  }
};

// hier: the MPI communicator's hierarchical all_to_all_v (nodes of 2 declared ranks) against
// the flat one, byte for byte, on random sizes (zero-length parts included).
void hierarchical_vs_flat(const dist::CommOptions& opt) {
  auto flat = dist::make_mpi_communicator(opt, {2, dist::AllToAll::Flat});
  auto hier = dist::make_mpi_communicator(opt, {2, dist::AllToAll::Auto});
  expect(dist::topology_of(*hier)->hierarchical(), "2 declared nodes: hierarchical");
  expect(!dist::topology_of(*flat)->hierarchical(), "--all-to-all flat: flat");
  expect(dist::topology_of(*hier)->topology().nodes() == hier->size() / 2, "node count");
  const int r = hier->rank(), n = hier->size();
  for (uint32_t trial = 0; trial < 40; ++trial) {
    RandomExchange x(r, n, 1000 + trial);
    std::vector<uint8_t> a(x.recv_bytes, 0xAB), b(x.recv_bytes, 0xAB);
    flat->all_to_all_v(x.send.data(), x.sc, x.so, a.data(), x.rc, x.ro, x.type);
    hier->all_to_all_v(x.send.data(), x.sc, x.so, b.data(), x.rc, x.ro, x.type);
    expect(a == b, "hierarchical all_to_all_v == flat, trial " + std::to_string(trial));
  }
  // all_gather_v goes through all_to_all_v.
  const auto counts = hier->all_gather_counts(r + 1);
  std::vector<int32_t> part(r + 1, r), gathered(n * (n + 1) / 2);
  hier->all_gather_v(part.data(), gathered.data(), counts, dist::Elem::I32);
  size_t at = 0;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k <= s; ++k) expect(gathered[at++] == s, "hierarchical all_gather_v");
  if (r == 0) dist::print_topology(*hier, stdout);
}

#ifdef DLREC_WITH_CUDA
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, ": ", cudaGetErrorString(e));
}

// nccl-hier: the same on NCCL (bootstraps with 2 declared ranks per node; GPU <local rank>),
// and the hierarchical exchange captured into a CUDA graph and replayed on new bytes.
void nccl_hierarchical_vs_flat(const dist::CommOptions& opt) {
  auto boot_flat = dist::make_mpi_communicator(opt, {2, dist::AllToAll::Flat});
  auto boot_hier = dist::make_mpi_communicator(opt, {2, dist::AllToAll::Auto});
  const int gpu = dist::mpi_local_rank();
  auto flat = dist::make_nccl_communicator(*boot_flat, gpu, opt);
  auto hier = dist::make_nccl_communicator(*boot_hier, gpu, opt);
  expect(dist::topology_of(*hier)->hierarchical(), "nccl: hierarchical from its bootstrap");
  const int r = hier->rank(), n = hier->size();
  auto run = [&](dist::Communicator& c, const RandomExchange& x, bool graph) {
    void *s = nullptr, *d = nullptr;
    check_cuda(cudaMalloc(&s, x.send.size() + 1), "cudaMalloc");
    check_cuda(cudaMalloc(&d, x.recv_bytes), "cudaMalloc");
    check_cuda(cudaMemset(d, 0xAB, x.recv_bytes), "cudaMemset");
    auto stream = static_cast<cudaStream_t>(c.stream());
    if (!graph) {
      check_cuda(cudaMemcpy(s, x.send.data(), x.send.size(), cudaMemcpyHostToDevice), "copy");
      c.all_to_all_v(s, x.sc, x.so, d, x.rc, x.ro, x.type);
    } else {  // captured on zeros, replayed on the real bytes
      check_cuda(cudaMemset(s, 0, x.send.size() + 1), "cudaMemset");
      check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
      c.all_to_all_v(s, x.sc, x.so, d, x.rc, x.ro, x.type);
      cudaGraph_t g;
      check_cuda(cudaStreamEndCapture(stream, &g), "end capture");
      cudaGraphExec_t exec;
      check_cuda(cudaGraphInstantiate(&exec, g, 0), "instantiate");
      check_cuda(cudaMemcpy(s, x.send.data(), x.send.size(), cudaMemcpyHostToDevice), "copy");
      check_cuda(cudaGraphLaunch(exec, stream), "launch");
      check_cuda(cudaStreamSynchronize(stream), "sync");
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    }
    std::vector<uint8_t> out(x.recv_bytes);
    check_cuda(cudaMemcpy(out.data(), d, x.recv_bytes, cudaMemcpyDeviceToHost), "copy back");
    cudaFree(s);
    cudaFree(d);
    return out;
  };
  for (uint32_t trial = 0; trial < 20; ++trial) {
    RandomExchange x(r, n, 2000 + trial);
    const auto a = run(*flat, x, false);
    expect(a == run(*hier, x, false), "nccl hierarchical == flat, trial " + std::to_string(trial));
    expect(a == run(*hier, x, true),
           "nccl hierarchical in a graph == flat, " + std::to_string(trial));
  }
  if (r == 0) dist::print_topology(*hier, stdout);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  dist::CommOptions opt;
  if (mode == "timeout") opt.timeout_seconds = 1;
  std::unique_ptr<dist::Communicator> c;
  try {
    c = dist::make_communicator("auto", opt);
    if (mode == "collectives") {
      collectives(*c);
    } else if (mode == "timeout") {
      c->barrier();
      if (c->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
      float x = 1;
      c->all_reduce(&x, 1);
    } else if (mode == "die") {
      c->barrier();
      if (c->rank() == 1) raise(SIGKILL);
      float x = 1;
      c->all_reduce(&x, 1);
    } else if (mode == "nccl") {
      nccl_collectives(*c);
    } else if (mode == "hier") {
      hierarchical_vs_flat(opt);
    } else if (mode == "nccl-hier") {
#ifdef DLREC_WITH_CUDA
      nccl_hierarchical_vs_flat(opt);
#else
      fail("nccl-hier needs a CUDA build");
#endif
    } else {
      fail("unknown mode '", mode, "'");
    }
    std::printf("ok rank %d of %d\n", c->rank(), c->size());
  } catch (const std::exception& e) {
    dist::abort_job(e.what());
    return 1;
  }
  c.reset();
  dist::finalize();
  return 0;
}
