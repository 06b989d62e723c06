// The DCNv2 embedding layer's CUDA kernels (src/nn/embedding_cuda.h) on their own (issue 6):
// the forward, the backward's id work and its gradient reduction + fused update, timed apart
// with CUDA events, on the table set of configs/dcnv2.json.
//
//   bench_embedding_cuda [--batch 55296] [--dim 128] [--iters 50] [--warmup 5] [--batches 4]
//                        [--zipf] [--sgd | --rowwise] [--f32-grad] [--seed 1]
//                        [--tables kaggle|criteo_1tb|mlperf_dcnv2] [--max-rows N]
//
// Tables: the 26 Criteo Kaggle cardinalities (io::criteo_kaggle_cardinalities, 33.8M rows; or
// --tables, io::builtin_layout, each capped at --max-rows rows), dim 128, f32, Adagrad (--sgd:
// SGD; --rowwise: row-wise Adagrad), initialised as the graph engine does. Ids: one per table and sample (mlperf_dcnv2: its
// fixed ids per sample, 214 a row in all), from io::random_batch (the batches `dlrec bench train` draws: uniform, or
// log-uniform with --zipf, P(id) ~ 1/(id + 1), so a few rows of every table are hot); `batches`
// distinct batches are used in turn. As in the DCNv2 graph (embeddings written into x0), the
// forward writes bf16 pooled rows into columns 128 .. 128 + 26 * 128 of a [batch, 3456] matrix
// and the backward reads its bf16 gradient from the same columns of another one (--f32-grad:
// f32 there).
//
// Prints, per phase, the mean device time of one call (events around each phase of each
// iteration, warm-up excluded) and the bytes it must at least move (forward: every id's row read
// in f32 and the pooled rows written; update: each distinct row's weights and accumulator read
// and written once and every id's gradient row read once) as GB/s; a 1 GiB device-to-device copy
// as the card's copy bandwidth for comparison; then checksums of the forward's output and of
// the tables of up to 300k rows after one forward + backward of each batch, so two builds or
// settings (e.g. DLREC_EMB_PAIRS=0 and not) can be compared for bit-identical results.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dlrec/io/synthetic_batch.h"
#ifdef DLREC_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../src/nn/embedding_cuda.h"
#endif

namespace {

#ifdef DLREC_WITH_CUDA
bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}
const char* arg_str(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}
long long arg_int(int argc, char** argv, const char* name, long long dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return dflt;
}

namespace ce = dlrec::nn::cuda_emb;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_embedding_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

uint64_t fnv(uint64_t h, const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ c[i]) * 0x100000001B3ULL;
  return h;
}

struct Ids {
  std::vector<int32_t> offsets;  // [T * B + 1], bag = t * B + b
  std::vector<uint32_t> keys;    // row_base[t] + id
  int32_t* d_offsets = nullptr;
  uint32_t* d_keys = nullptr;
};

int run(int argc, char** argv) {
  const int64_t B = arg_int(argc, argv, "--batch", 55296);
  const int dim = static_cast<int>(arg_int(argc, argv, "--dim", 128));
  const int iters = static_cast<int>(arg_int(argc, argv, "--iters", 50));
  const int warmup = static_cast<int>(arg_int(argc, argv, "--warmup", 5));
  const int nb = static_cast<int>(std::max<long long>(1, arg_int(argc, argv, "--batches", 4)));
  const uint64_t seed = static_cast<uint64_t>(arg_int(argc, argv, "--seed", 1));
  const bool zipf = has_flag(argc, argv, "--zipf");
  const bool rowwise = has_flag(argc, argv, "--rowwise");  // row-wise Adagrad
  const bool adagrad = !rowwise && !has_flag(argc, argv, "--sgd");
  const bool f32_grad = has_flag(argc, argv, "--f32-grad");
  if (B <= 0 || dim <= 0 || iters <= 0 || warmup < 0) {
    std::fprintf(stderr, "bench_embedding_cuda: --batch, --dim, --iters must be > 0\n");
    return 2;
  }

  const char* tables = arg_str(argc, argv, "--tables", "kaggle");
  const int64_t max_rows = arg_int(argc, argv, "--max-rows", 0);
  std::vector<int> hotness;
  dlrec::io::ShardLayout layout;
  try {
    layout = dlrec::io::builtin_layout(tables, max_rows, hotness);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_embedding_cuda: %s\n", e.what());
    return 2;
  }
  const int T = static_cast<int>(layout.cardinalities.size());
  std::vector<uint32_t> row_base;
  uint64_t total = 0;
  for (int64_t c : layout.cardinalities) {
    row_base.push_back(static_cast<uint32_t>(total));
    total += static_cast<uint64_t>(c);
  }
  int key_bits = 1;
  while (key_bits < 32 && (uint64_t{1} << key_bits) < total) ++key_bits;
  const int64_t col = 128, ld = col + int64_t(T) * dim;  // x0 = concat(bottom 128, embeddings)

  // Ids of each batch, and what the first one needs at least.
  std::vector<Ids> ids(nb);
  for (int i = 0; i < nb; ++i) {
    const dlrec::io::Batch b = dlrec::io::random_batch(layout, B, zipf, seed * 7919 + i, hotness);
    ids[i].offsets.push_back(0);
    for (int t = 0; t < T; ++t)
      for (int64_t r = 0; r < B; ++r) {
        for (int64_t p = b.cat_offsets[t][r]; p < b.cat_offsets[t][r + 1]; ++p)
          ids[i].keys.push_back(row_base[t] + static_cast<uint32_t>(b.cat_indices[t][p]));
        ids[i].offsets.push_back(static_cast<int32_t>(ids[i].keys.size()));
      }
  }
  const int64_t nnz = static_cast<int64_t>(ids[0].keys.size());
  int64_t distinct = 0, longest = 0, long_runs = 0;
  {
    std::vector<uint32_t> k = ids[0].keys;
    std::sort(k.begin(), k.end());
    for (size_t i = 0; i < k.size();) {
      size_t j = i + 1;
      while (j < k.size() && k[j] == k[i]) ++j;
      ++distinct;
      longest = std::max<int64_t>(longest, static_cast<int64_t>(j - i));
      if (j - i > 32) ++long_runs;
      i = j;
    }
  }
  const size_t gsz = f32_grad ? 4 : 2;
  const double upd_bytes = double(distinct) * dim * 4 * (adagrad ? 4 : 2) +
                           (rowwise ? double(distinct) * 8 : 0.0) + double(nnz) * dim * gsz;
  const double fwd_bytes = double(nnz) * dim * 4 + double(B) * T * dim * 2;

  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  std::printf("tables: %d (%s), %llu rows, dim %d, %s, key bits %d; ids: %s, "
              "batch %lld, %d batches\n",
              T, tables, static_cast<unsigned long long>(total), dim, rowwise ? "rowwise_adagrad" : adagrad ? "adagrad" : "sgd", key_bits,
              zipf ? "log-uniform (--zipf)" : "uniform", static_cast<long long>(B), nb);
  std::printf("batch 0: %lld ids, %lld distinct rows, longest run %lld (%lld runs over 32 ids)\n",
              static_cast<long long>(nnz), static_cast<long long>(distinct),
              static_cast<long long>(longest), static_cast<long long>(long_runs));

  // Tables and accumulators, as the graph engine sets them up.
  cudaStream_t st;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  std::vector<float*> hw(T), ha(T);
  for (int t = 0; t < T; ++t) {
    const int64_t n = layout.cardinalities[t] * dim;
    check(cudaMalloc(&hw[t], sizeof(float) * n), "table");
    ce::init_uniform(hw[t], n, 1234 + t, std::sqrt(1.0 / double(layout.cardinalities[t])), st);
    ha[t] = nullptr;
    if (adagrad || rowwise) {  // an accumulator per value, or per row
      const int64_t na = rowwise ? layout.cardinalities[t] : n;
      check(cudaMalloc(&ha[t], sizeof(float) * na), "accumulator");
      ce::fill(ha[t], na, 0.f, st);
    }
  }
  float **d_w, **d_a;
  uint32_t* d_base;
  check(cudaMalloc(&d_w, sizeof(float*) * T), "ptrs");
  check(cudaMalloc(&d_a, sizeof(float*) * T), "ptrs");
  check(cudaMalloc(&d_base, sizeof(uint32_t) * T), "base");
  check(cudaMemcpy(d_w, hw.data(), sizeof(float*) * T, cudaMemcpyHostToDevice), "ptrs");
  check(cudaMemcpy(d_a, ha.data(), sizeof(float*) * T, cudaMemcpyHostToDevice), "ptrs");
  check(cudaMemcpy(d_base, row_base.data(), sizeof(uint32_t) * T, cudaMemcpyHostToDevice), "base");
  ce::Tables tab;
  tab.weights = d_w;
  tab.states = adagrad || rowwise ? d_a : nullptr;
  tab.row_base = d_base;
  tab.num_tables = T;
  tab.dim = dim;
  int32_t* order = nullptr;  // as the graph engine's tables of a multi-hot layout
  if (std::any_of(hotness.begin(), hotness.end(), [](int h) { return h > 1; }))
    check(cudaMalloc(&order, sizeof(int32_t) * T), "order");
  int64_t max_nnz = 0;
  for (auto& x : ids) {
    max_nnz = std::max<int64_t>(max_nnz, static_cast<int64_t>(x.keys.size()));
    check(cudaMalloc(&x.d_offsets, sizeof(int32_t) * x.offsets.size()), "offsets");
    check(cudaMalloc(&x.d_keys, sizeof(uint32_t) * std::max<size_t>(1, x.keys.size())), "keys");
    check(cudaMemcpy(x.d_offsets, x.offsets.data(), sizeof(int32_t) * x.offsets.size(),
                     cudaMemcpyHostToDevice), "offsets");
    check(cudaMemcpy(x.d_keys, x.keys.data(), sizeof(uint32_t) * x.keys.size(),
                     cudaMemcpyHostToDevice), "keys");
  }
  void* scratch_mem;
  check(cudaMalloc(&scratch_mem, ce::scratch_bytes(max_nnz, key_bits, dim)), "scratch");
  const ce::Scratch scratch = ce::carve(scratch_mem, max_nnz, key_bits, dim);
  ce::prepare(scratch, st);

  // x0 (forward output) and dL/dx0 (the gradient read in place), [B, ld].
  __nv_bfloat16* x0;
  check(cudaMalloc(&x0, sizeof(__nv_bfloat16) * B * ld), "x0");
  check(cudaMemset(x0, 0, sizeof(__nv_bfloat16) * B * ld), "x0");
  void* dx0;
  check(cudaMalloc(&dx0, gsz * B * ld), "dx0");
  {
    // Pseudo-random gradient values of loss-gradient size (|g| < 2^-10).
    std::vector<float> g(B * ld);
    uint64_t s = 0x9E3779B97F4A7C15ULL ^ seed;
    for (auto& v : g) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      v = (static_cast<float>(s >> 40) / 16777216.f - 0.5f) * 0x1p-9f;
    }
    if (f32_grad) {
      check(cudaMemcpy(dx0, g.data(), 4 * g.size(), cudaMemcpyHostToDevice), "dx0");
    } else {
      std::vector<__nv_bfloat16> h(g.size());
      for (size_t i = 0; i < g.size(); ++i) h[i] = __float2bfloat16(g[i]);
      check(cudaMemcpy(dx0, h.data(), 2 * h.size(), cudaMemcpyHostToDevice), "dx0");
    }
  }
  float* d_lr;
  const float lr = 0.004f, eps = 1e-8f;
  check(cudaMalloc(&d_lr, sizeof(float)), "lr");
  check(cudaMemcpy(d_lr, &lr, sizeof(float), cudaMemcpyHostToDevice), "lr");
  const auto kind = rowwise   ? ce::Update::RowWiseAdagrad
                    : adagrad ? ce::Update::Adagrad
                              : ce::Update::SGD;

  auto fwd = [&](const Ids& x) {
    ce::forward(tab, x.d_offsets, x.d_keys, B, false, x0 + col, st, ld, order);
  };
  auto bwd_ids = [&](const Ids& x) {
    ce::backward_ids(tab, x.d_offsets, x.d_keys, B, static_cast<int64_t>(x.keys.size()), key_bits,
                     scratch, st);
  };
  auto bwd_apply = [&](const Ids& x) {
    const int64_t n = static_cast<int64_t>(x.keys.size());
    if (f32_grad)
      ce::backward_apply(tab, x.d_offsets, B, n, false, static_cast<const float*>(dx0) + col, ld,
                         kind, d_lr, eps, scratch, st);
    else
      ce::backward_apply(tab, x.d_offsets, B, n, false,
                         static_cast<const __nv_bfloat16*>(dx0) + col, ld, kind, d_lr, eps,
                         scratch, st);
  };

  // Checksums first (from the freshly initialised tables): the forward output of batch 0, then
  // the tables of up to 300k rows after a forward + backward of each batch in turn.
  fwd(ids[0]);
  check(cudaStreamSynchronize(st), "forward");
  uint64_t h_fwd = 0xcbf29ce484222325ULL;
  {
    std::vector<__nv_bfloat16> o(B * ld);
    check(cudaMemcpy(o.data(), x0, 2 * o.size(), cudaMemcpyDeviceToHost), "x0");
    h_fwd = fnv(h_fwd, o.data(), 2 * o.size());
  }
  for (int i = 0; i < nb; ++i) {
    fwd(ids[i]);
    bwd_ids(ids[i]);
    bwd_apply(ids[i]);
  }
  check(cudaStreamSynchronize(st), "backward");
  uint64_t h_tab = 0xcbf29ce484222325ULL;
  for (int t = 0; t < T; ++t) {
    if (layout.cardinalities[t] > 300000) continue;
    for (float* p : {hw[t], ha[t]}) {
      if (!p) continue;
      // A row-wise accumulator holds one value per row.
      std::vector<float> v(layout.cardinalities[t] * (rowwise && p == ha[t] ? 1 : dim));
      check(cudaMemcpy(v.data(), p, 4 * v.size(), cudaMemcpyDeviceToHost), "table");
      h_tab = fnv(h_tab, v.data(), 4 * v.size());
    }
  }

  // Timing: events between the phases of every iteration.
  const int n_all = warmup + iters;
  std::vector<cudaEvent_t> ev(4 * n_all);
  for (auto& e : ev) check(cudaEventCreate(&e), "event");
  for (int it = 0; it < n_all; ++it) {
    const Ids& x = ids[it % nb];
    check(cudaEventRecord(ev[4 * it], st), "record");
    fwd(x);
    check(cudaEventRecord(ev[4 * it + 1], st), "record");
    bwd_ids(x);
    check(cudaEventRecord(ev[4 * it + 2], st), "record");
    bwd_apply(x);
    check(cudaEventRecord(ev[4 * it + 3], st), "record");
  }
  check(cudaStreamSynchronize(st), "timed loop");
  double t_fwd = 0, t_ids = 0, t_apply = 0;
  for (int it = warmup; it < n_all; ++it) {
    float a, b, c;
    check(cudaEventElapsedTime(&a, ev[4 * it], ev[4 * it + 1]), "elapsed");
    check(cudaEventElapsedTime(&b, ev[4 * it + 1], ev[4 * it + 2]), "elapsed");
    check(cudaEventElapsedTime(&c, ev[4 * it + 2], ev[4 * it + 3]), "elapsed");
    t_fwd += a;
    t_ids += b;
    t_apply += c;
  }
  t_fwd /= iters;
  t_ids /= iters;
  t_apply /= iters;
  // The backward alone, back to back (no forward, no events in between).
  check(cudaEventRecord(ev[0], st), "record");
  for (int it = 0; it < iters; ++it) {
    bwd_ids(ids[it % nb]);
    bwd_apply(ids[it % nb]);
  }
  check(cudaEventRecord(ev[1], st), "record");
  check(cudaStreamSynchronize(st), "backward loop");
  float t_bwd_loop;
  check(cudaEventElapsedTime(&t_bwd_loop, ev[0], ev[1]), "elapsed");
  t_bwd_loop /= iters;

  // The card's copy bandwidth: 1 GiB device to device (2 GiB moved), 10 times.
  double copy_gbs = 0;
  {
    void *a, *b;
    const size_t n = size_t(1) << 30;
    check(cudaMalloc(&a, n), "copy");
    check(cudaMalloc(&b, n), "copy");
    check(cudaMemsetAsync(a, 1, n, st), "copy");
    check(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st), "copy");
    check(cudaEventRecord(ev[0], st), "record");
    for (int i = 0; i < 10; ++i)
      check(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st), "copy");
    check(cudaEventRecord(ev[1], st), "record");
    check(cudaStreamSynchronize(st), "copy");
    float ms;
    check(cudaEventElapsedTime(&ms, ev[0], ev[1]), "elapsed");
    copy_gbs = 10.0 * 2 * double(n) / (ms * 1e-3) / 1e9;
    cudaFree(a);
    cudaFree(b);
  }

  std::printf("forward (bf16 into x0 columns)        %8.3f ms  floor %.0f MB -> %.0f GB/s\n", t_fwd,
              fwd_bytes / 1e6, fwd_bytes / (t_fwd * 1e-3) / 1e9);
  std::printf("backward ids (bag of id, sort)        %8.3f ms\n", t_ids);
  std::printf("backward reduce + update              %8.3f ms  floor %.0f MB -> %.0f GB/s\n",
              t_apply, upd_bytes / 1e6, upd_bytes / (t_apply * 1e-3) / 1e9);
  std::printf("backward (ids + apply)                %8.3f ms\n", t_ids + t_apply);
  std::printf("backward back to back, no events      %8.3f ms\n", double(t_bwd_loop));
  std::printf("device copy bandwidth (1 GiB d2d)     %8.0f GB/s (read + write)\n", copy_gbs);
  std::printf("checksum forward %016llx tables<=300k rows after %d steps %016llx\n",
              static_cast<unsigned long long>(h_fwd), nb, static_cast<unsigned long long>(h_tab));
  for (auto& e : ev) cudaEventDestroy(e);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
#ifdef DLREC_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_embedding_cuda: no CUDA device\n");
    return 1;
  }
  return run(argc, argv);
#else
  (void)argc;
  (void)argv;
  std::fprintf(stderr,
               "bench_embedding_cuda: built without CUDA (configure with -DDLREC_CUDA=ON)\n");
  return 1;
#endif
}
