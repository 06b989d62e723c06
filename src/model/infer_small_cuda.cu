// The fused small-batch DLRM inference kernel (see infer_small_cuda.h for the stages and the
// co-residency contract).
#include "model/infer_small_cuda.h"
#include "model/infer_small_dot.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <string>
#include <type_traits>

#include "core/cuda_check.h"
#include "dlrec/core/error.h"
#include "nn/half_cuda.cuh"
#include "nn/row_quant_cuda.cuh"

namespace dlrec::model::fused_infer {
namespace {

namespace ce = nn::cuda_emb;

using bf16 = __nv_bfloat16;
using f16 = __half;

constexpr int kWarps = 8;              // warps per block
constexpr int kThreads = 32 * kWarps;  // threads per block
constexpr int kPre = kMaxK / 256;      // 16-byte weight pieces per lane: k <= 32 * 8 * kPre
constexpr int kGroupRows = 8;          // rows per pass over a layer (kernel template G <= 8)

std::atomic<int64_t> g_launches{0};

using nn::half_cuda::from_f;
using nn::half_cuda::to_f;
using nn::half_cuda::unpack8;

// Grid-wide barriers on one monotonic counter (wrapping u32). The host knows how many
// arrivals each launch makes and passes the counter's value at the launch's start, so barrier
// n of a launch waits for base + n * gridDim.x arrivals: an arrival is one fire-and-forget add,
// and the waiting blocks see the last one on their next poll (no reset, no second round trip).
// Writes before a barrier are visible after it to reads that bypass L1 (__ldcg).
struct Barrier {
  unsigned* counter;
  unsigned target;  // arrivals that complete the last barrier passed
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void grid_sync(Barrier& bar) {
  bar.target += gridDim.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar.counter, 1u);
    while (static_cast<int>(load_acquire(bar.counter) - bar.target) < 0) {
    }
  }
  __syncthreads();
}

// An arrival like grid_sync's, but only the block arriving last goes on (true; it sees every
// other block's writes); the others must return without touching the counter again.
__device__ __forceinline__ bool last_block(Barrier& bar) {
  __shared__ int last;
  bar.target += gridDim.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(bar.counter, 1u) + 1 == bar.target;
    __threadfence();
  }
  __syncthreads();
  return last;
}

// The weight row of output o, each lane's pieces lane, lane + 32, ... (16 bytes each).
template <class H>
__device__ __forceinline__ void load_w(const Layer& L, int o, int lane, uint4 (&w)[kPre]) {
  if (L.int8.q) return ops::load_int8_row(L.int8, o, 0, L.int8.qk / 16, lane, w);
  const int pieces = L.k / 8;
  const uint4* row = reinterpret_cast<const uint4*>(static_cast<const H*>(L.w) +
                                                    static_cast<int64_t>(o) * L.k);
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int p = lane + 32 * i;
    w[i] = p < pieces ? __ldg(row + p) : make_uint4(0, 0, 0, 0);
  }
}

// layer_stage for a layer's INT8 form (Int8Form): the group's rows staged quantized, int32
// sums, the CPU reference's dequantization; the rest as layer_stage.
template <class H, int G>
__device__ __forceinline__ void layer_stage_int8(const Layer& L, const H* x, const float* host_x,
                                                 int nx, int rows, int gw, int nw, int lane,
                                                 uint4 (&w)[kPre], int held, float* probs,
                                                 uint4* xs) {
  const Int8Form& q = L.int8;
  const int pieces = q.qk / 16;
  for (int g0 = 0; g0 < rows; g0 += G) {
    const int gn = min(G, rows - g0);
    __syncthreads();  // the previous group's readers are done with xs
    if (host_x)  // the dense rows as the layer path sees them: rounded to 16 bits first
      ops::stage_int8(gn, L.k, q.qk, q.inv_x, [&](int r, int c) {
        return c < nx ? to_f(from_f<H>(host_x[static_cast<int64_t>(g0 + r) * nx + c])) : 0.f;
      }, reinterpret_cast<uint32_t*>(xs));
    else
      ops::stage_int8_16(x + static_cast<int64_t>(g0) * L.k, L.k, gn, L.k, q.qk, q.inv_x,
                         reinterpret_cast<uint32_t*>(xs));
    __syncthreads();
    for (int o = gw; o < L.out; o += nw) {
      if (o != held) {
        load_w<H>(L, o, lane, w);
        held = o;
      }
      int acc[G] = {};
      ops::dot_int8<G>(w, xs, pieces, 0, lane, gn, acc);
      float v = ops::finish_int8<G>(acc, q, o, lane);
      if (lane < gn) {
        const int64_t row = g0 + lane;
        if (L.relu) v = fmaxf(v, 0.f);
        if (L.f32_out) static_cast<float*>(L.y)[row * L.out + o] = v;
        else static_cast<H*>(L.y)[row * L.out + o] = from_f<H>(v);
        if (probs) probs[row] = 1.f / (1.f + expf(-v));
      }
    }
  }
}

// One layer stage: every output of L for every row. The rows are taken G at a time (the
// whole block stages them into shared memory `xs` once, so each block reads the activations
// once rather than each warp): from x (16-bit, device), or with host_x from the caller's f32
// rows of `nx` values (converted and zero-padded to L.k as cd::to_half_padded does). Warp gw
// (of nw, in block `block`) computes outputs gw, gw + nw, ... with the weight row in
// registers (`w` holds the row of output `held` on entry, -1: none). The same order of
// operations per output as cd::skinny_linear. With probs, the sigmoid of the (f32) result is
// also written there. Blocks without an output return at once.
template <class H, int G>
__device__ __forceinline__ void layer_stage(const Layer& L, const H* x, const float* host_x,
                                            int nx, int rows, int block, int gw, int nw, int lane,
                                            uint4 (&w)[kPre], int held, float* probs, uint4* xs) {
  if (block * kWarps >= L.out) return;  // the same for the whole block
  if (L.int8.q)
    return layer_stage_int8<H, G>(L, x, host_x, nx, rows, gw, nw, lane, w, held, probs, xs);
  const int pieces = L.k / 8;
  for (int g0 = 0; g0 < rows; g0 += G) {
    const int gn = min(G, rows - g0);
    __syncthreads();  // the previous group's readers are done with xs
    if (host_x) {
      H* xh = reinterpret_cast<H*>(xs);
      for (int i = threadIdx.x; i < gn * L.k; i += kThreads) {
        const int r = i / L.k, c = i - r * L.k;
        xh[i] = from_f<H>(c < nx ? host_x[static_cast<int64_t>(g0 + r) * nx + c] : 0.f);
      }
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(g0) * L.k);
      for (int i = threadIdx.x; i < gn * pieces; i += kThreads) xs[i] = __ldcg(src + i);
    }
    __syncthreads();
    for (int o = gw; o < L.out; o += nw) {
      if (o != held) {
        load_w<H>(L, o, lane, w);
        held = o;
      }
      float acc[G] = {};
      ops::dot16<H, G>(w, xs, pieces, 0, lane, gn, acc);
      float v = ops::warp_sum_pick<G>(acc, lane);
      if (lane < gn) {
        const int64_t row = g0 + lane;
        v += L.f32_out ? static_cast<const float*>(L.b)[o] : to_f(static_cast<const H*>(L.b)[o]);
        if (L.relu) v = fmaxf(v, 0.f);
        if (L.f32_out) static_cast<float*>(L.y)[row * L.out + o] = v;
        else static_cast<H*>(L.y)[row * L.out + o] = from_f<H>(v);
        if (probs) probs[row] = 1.f / (1.f + expf(-v));
      }
    }
  }
}

// Strict lower triangle, row-major: q -> (i, j) with j < i, q = i (i - 1) / 2 + j.
__device__ __forceinline__ void pair_index(int q, int& i, int& j) {
  i = max(1, static_cast<int>(sqrtf(2.f * static_cast<float>(q))));
  while (i * (i - 1) / 2 > q) --i;
  while (i * (i + 1) / 2 <= q) ++i;
  j = q - i * (i - 1) / 2;
}

// Dot product of two 16-bit vectors of d elements by the 8 lanes of a group (sub = lane & 7):
// f32 partial sums per lane, then a reduction inside the group. Every lane of the warp must
// call it (the shuffles); lanes with !valid contribute nothing.
template <class H>
__device__ __forceinline__ float group_dot(const H* a, const H* b, int d, int sub, bool valid) {
  float acc = 0.f;
  if (valid)
    for (int pc = sub; pc < d / 8; pc += 8) {
      float af[8], bf[8];
      unpack8(__ldcg(reinterpret_cast<const uint4*>(a) + pc), af, static_cast<const H*>(nullptr));
      unpack8(__ldcg(reinterpret_cast<const uint4*>(b) + pc), bf, static_cast<const H*>(nullptr));
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(af[j], bf[j], acc);
    }
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  return acc;
}

// Embedding-embedding dot products of the interaction (pairs of Z rows i > j >= 1), 4 per
// warp task, tasks from the last warp down (warps without a layer output in the stage first).
template <class H>
__device__ __forceinline__ void emb_pairs(const Params& p, int gw, int nw, int group, int sub) {
  const int T = p.T, d = p.d, pee = T * (T - 1) / 2;
  const H* emb = static_cast<const H*>(p.emb);
  H* inter = static_cast<H*>(p.inter);
  const int tasks = (p.rows * pee + 3) / 4;
  for (int it = nw - 1 - gw; it < tasks; it += nw) {
    const int e = it * 4 + group;
    const bool valid = e < p.rows * pee;
    const int r = valid ? e / pee : 0;
    int i = 1, j = 0;
    if (valid) pair_index(e - r * pee, i, j);
    i += 1;  // rows of Z: 0 is the dense vector, 1..T the embeddings
    j += 1;
    const H* er = emb + static_cast<int64_t>(r) * T * d;
    const float v = group_dot(er + (i - 1) * d, er + (j - 1) * d, d, sub, valid);
    if (valid && sub == 0)
      inter[static_cast<int64_t>(r) * p.inter_ld + d + i * (i - 1) / 2 + j] = from_f<H>(v);
  }
}

// Stages (MLPerf shape: 8 arrivals at the counter, the last one a ticket):
//   b0    bottom layer 0 from the caller's dense rows || the embedding gather (keys read from
//         the caller's buffer)
//   b1    bottom layer 1 || the embedding-embedding dot products
//   b2..  the other bottom layers
//   int   the dense vector copied into the interaction, its dot products with the embeddings,
//         the zero padding (and the embedding-embedding products when there is no b1)
//   t0..  the top layers but the last, each behind a grid barrier
//   last  the last top layer (one output) by the block arriving last, with the sigmoid
template <class H, int G>
__global__ void __launch_bounds__(kThreads, 2) fused_forward(const __grid_constant__ Params p) {
  const int lane = threadIdx.x & 31, group = lane >> 3, sub = lane & 7, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
  const int gt = blockIdx.x * kThreads + threadIdx.x, nthr = gridDim.x * kThreads;
  const int rows = p.rows, T = p.T, d = p.d;
  H* emb = static_cast<H*>(p.emb);
  H* inter = static_cast<H*>(p.inter);
  uint4 w[kPre];
  __shared__ uint4 xs[kGroupRows * kMaxK / 8];  // G activation rows of the current layer
  Barrier bar{p.barrier, p.bar_base};
  const int nl = p.nb + p.nt;

  if (gw < p.layer[0].out) load_w<H>(p.layer[0], gw, lane, w);
  for (int l = 0; l < nl - 1; ++l) {
    const Layer& L = p.layer[l];
    const H* x = l == p.nb ? inter : l > 0 ? static_cast<const H*>(p.layer[l - 1].y) : nullptr;
    layer_stage<H, G>(L, x, l == 0 ? p.dense : nullptr, p.num_dense, rows, blockIdx.x, gw, nw,
                      lane, w, gw < L.out ? gw : -1, nullptr, xs);
    if (l == 0) {
      // The embedding rows, (row, table) per warp from the last warp down: f32 -> 16-bit.
      for (int it = nw - 1 - gw; it < rows * T; it += nw) {
        const int r = it / T, t = it - r * T;
        const uint32_t key = p.keys[static_cast<int64_t>(t) * p.ld_keys + r];
        const int64_t row = static_cast<int64_t>(key - __ldg(p.row_base + t));
        const uint8_t* qc = p.codes ? p.codes[t] : nullptr;
        const float4* src = reinterpret_cast<const float4*>(qc ? nullptr : p.tables[t] + row * d);
        H* dst = emb + (static_cast<int64_t>(r) * T + t) * d;
        for (int v = lane; v < d / 4; v += 32) {
          const float4 f = qc ? ce::rq_load4(ce::rq_row(qc, d, p.qbits[t], row), p.qbits[t], d,
                                             4 * v)
                              : __ldg(src + v);
          dst[4 * v] = from_f<H>(f.x);
          dst[4 * v + 1] = from_f<H>(f.y);
          dst[4 * v + 2] = from_f<H>(f.z);
          dst[4 * v + 3] = from_f<H>(f.w);
        }
      }
    }
    if (l == 1 && p.nb >= 2) emb_pairs<H>(p, gw, nw, group, sub);
    if (l == p.nb - 1) {
      // Stage "int": the dense vector (bottom output) copied, its dot products with every
      // embedding, zeros after the last pair.
      grid_sync(bar);
      if (p.nb == 1) emb_pairs<H>(p, gw, nw, group, sub);
      const unsigned short* dense = static_cast<const unsigned short*>(L.y);
      unsigned short* in16 = static_cast<unsigned short*>(p.inter);
      const int F = d + (T + 1) * T / 2;
      for (int i = gt; i < rows * d; i += nthr) {
        const int r = i / d, c = i - r * d;
        in16[static_cast<int64_t>(r) * p.inter_ld + c] = __ldcg(dense + i);
      }
      const int pad = p.inter_ld - F;
      for (int i = gt; i < rows * pad; i += nthr) {
        const int r = i / pad, c = i - r * pad;
        in16[static_cast<int64_t>(r) * p.inter_ld + F + c] = 0;
      }
      for (int base = gw * 4; base < rows * T; base += nw * 4) {
        const int e = base + group;
        const bool valid = e < rows * T;
        const int r = valid ? e / T : 0, i = valid ? e - r * T + 1 : 1;
        const float v = group_dot(static_cast<const H*>(L.y) + static_cast<int64_t>(r) * d,
                                  emb + (static_cast<int64_t>(r) * T + (i - 1)) * d, d, sub,
                                  valid);
        if (valid && sub == 0)
          inter[static_cast<int64_t>(r) * p.inter_ld + d + i * (i - 1) / 2] = from_f<H>(v);
      }
    }
    const Layer& next = p.layer[l + 1];
    if (l + 1 == nl - 1) {
      // The last layer (one output): every block loads its weight row, the last to arrive
      // computes it.
      if (warp < next.out) load_w<H>(next, warp, lane, w);
      if (!last_block(bar)) return;
      const H* xn = l + 1 == p.nb ? inter : static_cast<const H*>(L.y);
      layer_stage<H, G>(next, xn, nullptr, 0, rows, 0, warp, kWarps, lane, w,
                        warp < next.out ? warp : -1, p.probs, xs);
      return;
    }
    // The next layer's first weight row into registers before waiting (weights are constant).
    if (gw < next.out) load_w<H>(next, gw, lane, w);
    grid_sync(bar);
  }
}

// Counter arrivals per launch (grid_sync and last_block calls): one per layer boundary and
// one for the interaction stage.
int arrivals(const Params& p) { return p.nb + p.nt; }

template <class H>
void launch_typed(const Params& p, int blocks, cudaStream_t stream) {
  const int g = p.rows < kGroupRows ? p.rows : kGroupRows;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
#define DLREC_FUSED(NG)                                                        \
  case NG:                                                                     \
    DLREC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fused_forward<H, NG>, p));       \
    break;
  switch (g) {
    DLREC_FUSED(1) DLREC_FUSED(2) DLREC_FUSED(3) DLREC_FUSED(4)
    DLREC_FUSED(5) DLREC_FUSED(6) DLREC_FUSED(7) DLREC_FUSED(8)
  }
#undef DLREC_FUSED
}

bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; }

}  // namespace

// Why an INT8 form cannot run on inputs k wide ("" when it can, or when there is none).
std::string int8_unsupported(const Int8Form& q, int k) {
  if (!q.q) return "";
  if (q.qk < k || q.qk % 16 != 0 || q.qk > 2 * k || !aligned16(q.q) || !q.deq ||
      !(q.inv_x > 0.f))
    return "int8 form (weights, row stride " + std::to_string(q.qk) + ", scales)";
  return "";
}

std::string unsupported(const Params& p) {
  const int nl = p.nb + p.nt;
  if (p.nb < 1 || p.nt < 1 || nl > kMaxLayers)
    return "needs 1.." + std::to_string(kMaxLayers) + " layers, a bottom and a top MLP";
  if (p.T < 0 || p.d < 8 || p.d % 8 != 0) return "embedding dim must be a multiple of 8";
  if (p.inter_ld < p.d + (p.T + 1) * p.T / 2 || p.inter_ld % 8 != 0)
    return "interaction width";
  if (p.layer[p.nb - 1].out != p.d) return "the bottom MLP must output embedding_dim values";
  for (int l = 0; l < nl; ++l) {
    const Layer& L = p.layer[l];
    const bool last = l == nl - 1;
    const int want_k = l == 0 ? L.k : l == p.nb ? p.inter_ld : p.layer[l - 1].out;
    if (L.k != want_k || L.k < 8 || L.k % 8 != 0 || L.k > kMaxK)
      return "layer " + std::to_string(l) + " input width " + std::to_string(L.k) +
             " (needs a multiple of 8 up to " + std::to_string(kMaxK) + ")";
    if (L.out < 1 || (!last && L.out % 8 != 0) || (last && (L.out != 1 || !L.f32_out)) ||
        (!last && L.f32_out))
      return "layer " + std::to_string(l) + " outputs";
    if (!aligned16(L.w) || !L.b || !L.y || (!last && !aligned16(L.y)))
      return "layer " + std::to_string(l) + " buffers";
    const std::string q = int8_unsupported(L.int8, L.k);
    if (!q.empty()) return "layer " + std::to_string(l) + " " + q;
  }
  if (!aligned16(p.emb) || !aligned16(p.inter)) return "buffer alignment";
  return "";
}

void launch(Params p, bool fp16, int blocks, int sm_count, uint32_t* counter_base,
            cudaStream_t stream) {
  DLREC_CHECK(p.rows >= 1 && p.rows <= kMaxRows, "fused inference: ", p.rows,
              " rows (1..", kMaxRows, ")");
  DLREC_CHECK(sm_count >= 1, "fused inference: the device's SM count is ", sm_count);
  if (blocks <= 0 || blocks > sm_count) blocks = sm_count;
  p.bar_base = *counter_base;
  if (fp16) launch_typed<f16>(p, blocks, stream);
  else launch_typed<bf16>(p, blocks, stream);
  // Only a launch that was enqueued moves the base (the check above threw otherwise).
  *counter_base += static_cast<uint32_t>(arrivals(p)) * static_cast<uint32_t>(blocks);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

int64_t launches() { return g_launches.load(std::memory_order_relaxed); }

// --- The program form (infer_small_cuda.h, namespace prog) ------------------------------------

namespace prog {
namespace {

// A 16-bit value written earlier in this launch (bypassing L1, as __ldcg elsewhere).
template <class H>
__device__ __forceinline__ float ld16(const void* base, int64_t i) {
  const unsigned short u = __ldcg(static_cast<const unsigned short*>(base) + i);
  if constexpr (std::is_same_v<H, f16>) return __half2float(__ushort_as_half(u));
  else return __bfloat162float(__ushort_as_bfloat16(u));
}

// Output o's weight pieces [c0, c0 + 32 kPre) of a row of `pieces` 16-byte pieces (lane's:
// c0 + lane, c0 + lane + 32, ...).
__device__ __forceinline__ void load_w_chunk(const Op& L, int o, int c0, int pieces, int lane,
                                             uint4 (&w)[kPre]) {
  if (L.int8.q) return ops::load_int8_row(L.int8, o, c0, pieces, lane, w);
  const uint4* row = static_cast<const uint4*>(L.w) + static_cast<int64_t>(o) * pieces;
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int pc = c0 + lane + 32 * i;
    w[i] = pc < pieces ? __ldg(row + pc) : make_uint4(0, 0, 0, 0);
  }
}

// A Linear's weight row in 16-byte pieces: 8 16-bit values, or 16 int8 ones in its INT8 form.
__device__ __forceinline__ int row_pieces(const Op& L) {
  return L.int8.q ? L.int8.qk / 16 : L.k / 8;
}

// Which weight row the registers hold: a single-chunk Linear's output `o` of op `op`.
struct Held {
  int op = -1, o = -1;
};

// Output o of a Linear op for the staged rows: the lane's row's x . w[o] + b[o] (lane < gn).
template <class H, int G>
__device__ __forceinline__ float op_value(const Op& L, int op, int o, int pieces, bool one_chunk,
                                          int lane, int gn, uint4 (&w)[kPre], Held& held,
                                          const uint4* xs) {
  float acc[G] = {};
  for (int c0 = 0; c0 < pieces; c0 += 32 * kPre) {
    if (!(one_chunk && held.op == op && held.o == o)) load_w_chunk(L, o, c0, pieces, lane, w);
    ops::dot16<H, G>(w, xs, pieces, c0, lane, gn, acc);
  }
  held = one_chunk ? Held{op, o} : Held{};
  float v = ops::warp_sum_pick<G>(acc, lane);
  if (L.b)
    v += L.f32_out ? static_cast<const float*>(L.b)[o] : to_f(static_cast<const H*>(L.b)[o]);
  return v;
}

// op_value of a Linear's INT8 form (rows staged quantized).
template <int G>
__device__ __forceinline__ float op_value_int8(const Op& L, int op, int o, int pieces,
                                               bool one_chunk, int lane, int gn, uint4 (&w)[kPre],
                                               Held& held, const uint4* xs) {
  int acc[G] = {};
  for (int c0 = 0; c0 < pieces; c0 += 32 * kPre) {
    if (!(one_chunk && held.op == op && held.o == o)) load_w_chunk(L, o, c0, pieces, lane, w);
    ops::dot_int8<G>(w, xs, pieces, c0, lane, gn, acc);
  }
  held = one_chunk ? Held{op, o} : Held{};
  return ops::finish_int8<G>(acc, L.int8, o, lane);
}

// A Linear op (see Op): as layer_stage above, but over inputs of any width up to kMaxK (the
// weight row in chunks of 32 kPre pieces; only a one-chunk row stays in registers between
// outputs and across the barrier) and with the cross-combine and logit epilogues.
template <class H, int G>
__device__ void linear_op(const Op& L, const Program& p, int op, int block, int gw, int nw,
                          int lane, uint4 (&w)[kPre], Held& held, uint4* xs) {
  if (block * kWarps >= L.out) return;  // the same for the whole block
  const Int8Form& q = L.int8;
  const int pieces = row_pieces(L);
  const bool one_chunk = pieces <= 32 * kPre;
  for (int g0 = 0; g0 < p.rows; g0 += G) {
    const int gn = min(G, p.rows - g0);
    __syncthreads();  // the previous group's readers are done with xs
    if (q.q && L.host_x) {  // INT8: the rows staged quantized (the dense ones rounded to 16 bits)
      ops::stage_int8(gn, L.k, q.qk, q.inv_x, [&](int r, int c) {
        return c < p.num_dense
                   ? to_f(from_f<H>(p.dense[static_cast<int64_t>(g0 + r) * p.num_dense + c]))
                   : 0.f;
      }, reinterpret_cast<uint32_t*>(xs));
    } else if (q.q) {
      ops::stage_int8_16(static_cast<const H*>(L.x) + static_cast<int64_t>(g0) * L.x_ld, L.x_ld,
                         gn, L.k, q.qk, q.inv_x, reinterpret_cast<uint32_t*>(xs));
    } else if (L.host_x) {
      H* xh = reinterpret_cast<H*>(xs);
      for (int i = threadIdx.x; i < gn * L.k; i += kThreads) {
        const int r = i / L.k, c = i - r * L.k;
        xh[i] = from_f<H>(c < p.num_dense ? p.dense[static_cast<int64_t>(g0 + r) * p.num_dense + c]
                                          : 0.f);
      }
    } else {
      const H* xb = static_cast<const H*>(L.x);
      for (int i = threadIdx.x; i < gn * pieces; i += kThreads) {
        const int r = i / pieces, c = i - r * pieces;
        const H* row = xb + static_cast<int64_t>(g0 + r) * L.x_ld;
        xs[i] = __ldcg(reinterpret_cast<const uint4*>(row) + c);
      }
    }
    __syncthreads();
    for (int o = gw; o < L.out; o += nw) {
      // Row `lane`'s value before the epilogue (lane < gn), the bias included.
      float v = q.q ? op_value_int8<G>(L, op, o, pieces, one_chunk, lane, gn, w, held, xs)
                    : op_value<H, G>(L, op, o, pieces, one_chunk, lane, gn, w, held, xs);
      if (lane < gn) {
        const int64_t row = g0 + lane, at = row * L.y_ld + o;
        if (L.x0) {  // the layer path stores u in 16 bits, then x0 * u + xl
          const float u = to_f(from_f<H>(v));
          v = __fadd_rn(__fmul_rn(ld16<H>(L.x0, at), u), ld16<H>(L.xl, at));
        }
        if (L.relu) v = fmaxf(v, 0.f);
        if (L.f32_out) static_cast<float*>(L.y)[at] = v;
        else static_cast<H*>(L.y)[at] = from_f<H>(v);
        if (L.to_probs) {
          for (int a = 0; a < L.naddend; ++a) v += __ldcg(L.addend[a] + row);
          p.probs[row] = 1.f / (1.f + expf(-v));
        }
      }
    }
  }
}

// The embedding rows, (row, table) per warp: f32 -> 16-bit, any width.
template <class H>
__device__ void gather_op(const Op& L, const Program& p, int gw, int nw, int lane) {
  for (int it = gw; it < p.rows * L.T; it += nw) {
    const int r = it / L.T, t = it - r * L.T;
    const uint32_t key = p.keys[static_cast<int64_t>(t) * p.ld_keys + r];
    const int64_t row = static_cast<int64_t>(key - __ldg(L.row_base + t));
    const uint8_t* qc = L.codes ? L.codes[t] : nullptr;
    H* dst = static_cast<H*>(L.y) + static_cast<int64_t>(r) * L.y_ld + t * L.d;
    if (qc) {
      const int bits = L.qbits[t];
      const uint8_t* qr = ce::rq_row(qc, L.d, bits, row);
      for (int c = lane; c < L.d; c += 32) dst[c] = from_f<H>(ce::rq_load1(qr, bits, L.d, c));
      continue;
    }
    const float* src = L.tables[t] + row * L.d;
    for (int c = lane; c < L.d; c += 32) dst[c] = from_f<H>(__ldg(src + c));
  }
}

// The wide sum, a row per warp: lane t reads table t's weight, lane 0 adds them in t order
// (after the bias) as cg::wide_sum does.
__device__ void wide_op(const Op& L, const Program& p, int gw, int nw, int lane) {
  for (int r = gw; r < p.rows; r += nw) {
    float acc = __ldg(static_cast<const float*>(L.b));
    for (int t0 = 0; t0 < L.T; t0 += 32) {
      const int t = t0 + lane;
      float v = 0.f;
      if (t < L.T) {
        const uint32_t key = p.keys[static_cast<int64_t>(t) * p.ld_keys + r];
        v = __ldg(L.tables[t] + (key - __ldg(L.row_base + t)));
      }
      for (int j = 0; j < 32 && t0 + j < L.T; ++j)
        acc = __fadd_rn(acc, __shfl_sync(0xffffffffu, v, j));
    }
    if (lane == 0) static_cast<float*>(L.y)[static_cast<int64_t>(r) * L.y_ld] = acc;
  }
}

// DeepFM's second-order term, a row per warp, lanes over the d components: the sums of
// cg::fm_forward in the same order.
template <class H>
__device__ void fm_op(const Op& L, const Program& p, int gw, int nw, int lane) {
  for (int r = gw; r < p.rows; r += nw) {
    const int64_t base = static_cast<int64_t>(r) * L.x_ld;
    double acc = 0;
    for (int c = lane; c < L.d; c += 32) {
      float s = 0.f, q = 0.f;
      for (int f = 0; f < L.T; ++f) {
        const float v = ld16<H>(L.x, base + static_cast<int64_t>(f) * L.d + c);
        s = __fadd_rn(s, v);
        q = __fadd_rn(q, __fmul_rn(v, v));
      }
      acc += static_cast<double>(s) * s - q;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) static_cast<float*>(L.y)[static_cast<int64_t>(r) * L.y_ld] = 0.5 * acc;
  }
}

// The caller's dense rows into a 16-bit buffer (a concat's first columns), a value per thread.
template <class H>
__device__ void dense_op(const Op& L, const Program& p, int gt, int nthr) {
  for (int i = gt; i < p.rows * p.num_dense; i += nthr) {
    const int r = i / p.num_dense, c = i - r * p.num_dense;
    static_cast<H*>(L.y)[static_cast<int64_t>(r) * L.y_ld + c] = from_f<H>(p.dense[i]);
  }
}

// Stage by stage; before each barrier the next stage's first Linear loads its first weight
// row (weights are constant during a launch). The last stage (after stage 0) runs on the block
// arriving last, its 8 warps sharing the op.
template <class H, int G>
__global__ void __launch_bounds__(kThreads, 2) program_forward(const __grid_constant__ Program p) {
  extern __shared__ uint4 xs[];  // G rows of the current Linear's input
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  Barrier bar{p.barrier, p.bar_base};
  uint4 w[kPre];
  Held held;
  int i = 0;
  for (int s = 0; s < p.stages; ++s) {
    const bool solo = s > 0 && s == p.stages - 1;  // the last stage, on one block
    const int block = solo ? 0 : blockIdx.x;
    const int gw = solo ? warp : blockIdx.x * kWarps + warp;
    const int nw = solo ? kWarps : gridDim.x * kWarps;
    if (s > 0) {
      const Op& first = p.ops[i];
      if (first.kind == OpKind::Linear && row_pieces(first) <= 32 * kPre && gw < first.out) {
        load_w_chunk(first, gw, 0, row_pieces(first), lane, w);
        held = Held{i, gw};
      }
      if (solo) {
        if (!last_block(bar)) return;
      } else {
        grid_sync(bar);
      }
    }
    for (; i < p.nops && p.ops[i].stage == s; ++i) {
      const Op& L = p.ops[i];
      switch (L.kind) {
        case OpKind::Linear: linear_op<H, G>(L, p, i, block, gw, nw, lane, w, held, xs); break;
        case OpKind::Gather: gather_op<H>(L, p, gw, nw, lane); break;
        case OpKind::Wide: wide_op(L, p, gw, nw, lane); break;
        case OpKind::Fm: fm_op<H>(L, p, gw, nw, lane); break;
        case OpKind::DenseIn: dense_op<H>(L, p, gw * 32 + lane, nw * 32); break;
      }
    }
  }
}

size_t smem_bytes(const Program& p) { return sizeof(uint16_t) * kGroupRows * p.max_k; }

template <class H>
void launch_typed(const Program& p, int blocks, cudaStream_t stream) {
  const int g = p.rows < kGroupRows ? p.rows : kGroupRows;
  const size_t smem = smem_bytes(p);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // Over 48 KiB of dynamic shared memory must be allowed per kernel (once per process and
  // device would do; the call is cheap next to a launch).
#define DLREC_PROGRAM(NG)                                                                   \
  case NG:                                                                                  \
    if (smem > 48 * 1024)                                                                   \
      DLREC_CUDA_CHECK(cudaFuncSetAttribute(program_forward<H, NG>,                         \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                                            static_cast<int>(smem)));                       \
    DLREC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, program_forward<H, NG>, p));                  \
    break;
  switch (g) {
    DLREC_PROGRAM(1) DLREC_PROGRAM(2) DLREC_PROGRAM(3) DLREC_PROGRAM(4)
    DLREC_PROGRAM(5) DLREC_PROGRAM(6) DLREC_PROGRAM(7) DLREC_PROGRAM(8)
  }
#undef DLREC_PROGRAM
}

}  // namespace

// Measured on an H200 (bench/RESULTS.md, "Fused small-batch forward", bf16 p50, two rounds
// against the bucketed graphs of the build before): programs whose rows fit a warp's register
// row (DeepFM, 400 wide) were faster at 1..8 rows (34.9-36.0 vs 38.8-41.9 us at batch 1,
// 38.4-39.1 vs 47.2-48.4 at 8); DCNv2 (3456 wide: rows taken in chunks) only at batch 1
// (86.9-87.3 vs 88.0-89.1 us), slower at 2, 4 and 8 rows (up to +10 %). A variant holding
// rows up to 4096 wide in registers, several outputs per warp, was no faster at batch 1 and
// spilled at 5..8 rows (175 us at 8); it was dropped.
int64_t rows_limit(int max_k) { return max_k > 32 * 8 * kPre ? 1 : kMaxRows; }

std::string unsupported(const Op* ops, int nops) {
  if (nops < 1 || nops > kMaxOps) return "needs 1.." + std::to_string(kMaxOps) + " ops";
  for (int i = 0; i < nops; ++i) {
    const Op& L = ops[i];
    const std::string at = "op " + std::to_string(i) + ": ";
    if (i > 0 && L.stage < ops[i - 1].stage) return at + "stages out of order";
    if (!L.y) return at + "no output buffer";
    if (L.kind == OpKind::Linear) {
      if (L.k < 8 || L.k % 8 != 0 || L.k > kMaxK)
        return at + "input width " + std::to_string(L.k) + " (needs a multiple of 8 up to " +
               std::to_string(kMaxK) + ")";
      if (L.out < 1 || !aligned16(L.w) || (L.to_probs && !L.b && !L.int8.q)) return at + "weights";
      const std::string q = int8_unsupported(L.int8, L.k);
      if (!q.empty()) return at + q;
      if (!L.host_x && (!aligned16(L.x) || L.x_ld % 8 != 0 || L.x_ld < L.k))
        return at + "input buffer alignment";
      if ((L.x0 != nullptr) != (L.xl != nullptr) || (L.x0 && L.f32_out))
        return at + "cross combine";
      if (L.naddend < 0 || L.naddend > kMaxAddends) return at + "addends";
      if (L.to_probs != (i == nops - 1)) return at + "only the last op writes probabilities";
    } else if (L.kind == OpKind::Gather || L.kind == OpKind::Wide) {
      if (!L.tables || !L.row_base || L.T < 1 || L.d < 1) return at + "tables";
      if (L.kind == OpKind::Wide && (L.d != 1 || !L.b)) return at + "wide tables";
    } else if (L.kind == OpKind::Fm) {
      if (!L.x || L.T < 1 || L.d < 1) return at + "fm input";
    }
  }
  const Op& last = ops[nops - 1];
  if (last.kind != OpKind::Linear || last.out != 1 || !last.f32_out || !last.to_probs)
    return "the last op is not a one-output Linear giving the probabilities";
  if (nops > 1 && ops[nops - 2].stage == last.stage)
    return "the last stage holds more than the logit";
  return "";
}

void launch(Program p, bool fp16, int blocks, int sm_count, uint32_t* counter_base,
            cudaStream_t stream) {
  DLREC_CHECK(p.rows >= 1 && p.rows <= kMaxRows, "fused inference: ", p.rows, " rows (1..",
              kMaxRows, ")");
  DLREC_CHECK(sm_count >= 1, "fused inference: the device's SM count is ", sm_count);
  DLREC_CHECK(p.stages >= 1 && p.max_k >= 8 && p.max_k <= kMaxK, "fused inference: program of ",
              p.stages, " stages, widest input ", p.max_k);
  if (blocks <= 0 || blocks > sm_count) blocks = sm_count;
  p.bar_base = *counter_base;
  if (fp16) launch_typed<f16>(p, blocks, stream);
  else launch_typed<bf16>(p, blocks, stream);
  // One arrival per stage boundary.
  *counter_base += static_cast<uint32_t>(p.stages - 1) * static_cast<uint32_t>(blocks);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace prog

}  // namespace dlrec::model::fused_infer
