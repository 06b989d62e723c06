// A program that tests/dist starts under mpirun: it runs one scenario of collectives on every
// rank and exits 0 when each result is right ("ok rank R" on stdout), non-zero otherwise.
//   dist_worker collectives         every collective, checked against closed forms
//   dist_worker timeout             rank 1 arrives 4 s late; the others time out after 1 s
//   dist_worker die                 rank 1 is killed (SIGKILL) before the first collective
//   dist_worker nccl                the NCCL communicator on GPU <local rank> (GPU hosts)
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/dist/communicator.h"

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
}

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
