// The cross layer's backward data GEMM with the next (lower) layer's element-wise pass in its
// epilogue; see cross_fused.h.
//
// Kernels: sm90 TMA warp-specialized ping-pong GEMMs, 128 x 128 x 64 tiles, bf16 in, fp32
// accumulators, m-major A (the weights as stored), k-major B. Epilogue visitor trees:
//   dgrad_du:   g = round(acc + C); store g; du = round(x0 * g) -> D; column sums of du
//   dgrad_acc:  g = round(acc + C); du = round(x0 * g) stored; column sums of du;
//               D = ((g3 * u2 + C * u1) + g * u0) + g       (two deferred terms; one: C * u1 only)
// The column sums (the bias gradient of the lower layer) are written per 128-column tile and
// added in tile order by a small kernel: deterministic. Every value is rounded where the
// two-step path (cuBLASLt + cross_backward_deferred) rounds it, and the sums of the deferred
// terms are formed in the same order with the same operations, so g, du and D carry the same
// bits as there; only the bias gradient's summation order differs (fp32 rounding).
// Measured on an H100 (m 3456, n 55296, k 512, prototype): the dgrad_du kernel 0.70-0.72 ms
// against 0.81 ms for cuBLASLt's GEMM (0.38) and the du pass (0.43).
#include <atomic>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "fused/cross_fused.h"
#include "fused/sm90_parts.cuh"

namespace dlrec::cutlass_k {
namespace {

using namespace cute;
namespace fu = cutlass::epilogue::fusion;
namespace ec = cutlass::epilogue::collective;

using namespace sm90;
constexpr int kTileM = 128, kTileN = 128;
using LayoutA = cutlass::layout::ColumnMajor;  // the weights [k, m] as stored: m contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // dh^T [k, n]: k contiguous
using Tile = Shape<Int<kTileM>, Int<kTileN>, _64>;
using Cluster = Shape<_1, _1, _1>;
using MainSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpiSchedule = cutlass::epilogue::TmaWarpSpecialized;

using Aux = AuxNodes<Tile, EpiSchedule>;
using EpiTile = typename Aux::EpiTile;
using Load = typename Aux::Load;
using Store = typename Aux::Store;
using AuxStride = typename Aux::Stride;

// g = acc + C, rounded to bf16 (what cuBLASLt's beta = 1 GEMM stores).
using G = fu::Sm90EVT<fu::Sm90Compute<cutlass::plus, Bf, Acc, kRound>, fu::Sm90AccFetch,
                      fu::Sm90SrcFetch<Bf>>;
// du = x0 * g rounded to bf16, its column sums per tile (non-final: tile partials, no atomics).
template <class GNode>
using Du = fu::Sm90EVT<fu::Sm90Compute<cutlass::multiplies, Bf, Acc, kRound>, Load, GNode>;
using ColSums = fu::Sm90ColReduction<cutlass::plus, cutlass::plus, cutlass::plus, 0, Tile, float,
                                     Acc, kRound, Stride<_1, _0, int64_t>, 4, true, false>;

// D = du (of the layer below), g stored: layers >= 1 with G (g = acc + C), and the data GEMM of
// the layer above the cross layers (the first MLP layer) with G0 (g = acc, no C).
using G0 = fu::Sm90EVT<fu::Sm90Compute<cutlass::epilogue::thread::Identity, Bf, Acc, kRound>,
                       fu::Sm90AccFetch>;
template <class GNode>
using TreeDuOf =
    fu::Sm90EVT<fu::Sm90Compute<cutlass::epilogue::thread::Identity, Bf, Acc, kRound>,
                 fu::Sm90EVT<ColSums, Du<fu::Sm90EVT<Store, GNode>>>>;
using TreeDu = TreeDuOf<G>;
using TreeDuNoC = TreeDuOf<G0>;

// Layer 0's dL/dx0 sum, as cross_backward_deferred forms it (no FMA contraction: the same
// products and sums in the same order): ((a + g2 * u1) + g * u0) + g, where a = 0 + g3 * u2 for
// three layers and 0 for two. The last input (du's branch: stored and summed on the way) only
// has to be visited.
CUTLASS_DEVICE float acc_sum(float a, float g2, float u1, float g, float u0) {
  a = __fadd_rn(a, __fmul_rn(g2, u1));
  a = __fadd_rn(a, __fmul_rn(g, u0));
  return __fadd_rn(a, g);
}
template <class T>
struct Acc2 {  // inputs: g3, u2, C (g2), u1, g (g1), u0, du
  template <class A>
  CUTLASS_DEVICE A operator()(A const& g3, A const& u2, A const& g2, A const& u1, A const& g,
                              A const& u0, A const&) const {
    A out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < A::kElements; ++i)
      out[i] = acc_sum(__fadd_rn(0.f, __fmul_rn(g3[i], u2[i])), g2[i], u1[i], g[i], u0[i]);
    return out;
  }
};
template <class T>
struct Acc1 {  // inputs: C (g2), u1, g (g1), u0, du
  template <class A>
  CUTLASS_DEVICE A operator()(A const& g2, A const& u1, A const& g, A const& u0, A const&) const {
    A out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < A::kElements; ++i) out[i] = acc_sum(0.f, g2[i], u1[i], g[i], u0[i]);
    return out;
  }
};
using DuBranch = fu::Sm90EVT<ColSums, fu::Sm90EVT<Store, Du<G>>>;
using TreeAcc2 = fu::Sm90EVT<fu::Sm90Compute<Acc2, Bf, Acc, kRound>, Load, Load,
                             fu::Sm90SrcFetch<Bf>, Load, G, Load, DuBranch>;
using TreeAcc1 = fu::Sm90EVT<fu::Sm90Compute<Acc1, Bf, Acc, kRound>, fu::Sm90SrcFetch<Bf>, Load, G,
                             Load, DuBranch>;

template <class Tree, class ElementC = Bf>
struct Kern {
  using Epilogue = typename ec::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, EpiTile, Acc, Acc,
      ElementC, LayoutC, kAlign, Bf, LayoutC, kAlign, EpiSchedule, Tree>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf, LayoutA, kAlign, Bf, LayoutB,
      kAlign, Acc, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                       Epilogue,
                                                       cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

std::atomic<int64_t> g_launches{0};

// db[c] = sum over tiles t (in order) of part[t * mp + c].
__global__ void sum_tiles_kernel(const float* __restrict__ part, int tiles, int64_t mp, int64_t m,
                                 float* __restrict__ db) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= m) return;
  float s = 0.f;
  for (int t = 0; t < tiles; ++t) s += part[t * mp + c];
  db[c] = s;
}

// The shared checks: shapes and strides TMA can serve, 16-byte aligned pointers.
bool servable(const DgradArgs& a) {
  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || !cross_fused_device_ok()) return false;
  if (a.m > INT32_MAX || a.n > INT32_MAX || a.k > INT32_MAX) return false;
  if (a.m % kAlign || a.k % kAlign || a.lda % kAlign || a.ldb % kAlign || a.ld % kAlign)
    return false;
  if (a.lda < a.m || a.ldb < a.k || a.ld < a.m) return false;
  if (!a.partial || a.partial_floats < dgrad_partial_floats(a.m, a.n)) return false;
  for (const void* p : {a.w, a.dh, a.x0, static_cast<const void*>(a.du),
                        static_cast<const void*>(a.partial), static_cast<const void*>(a.db)})
    if (!aligned16(p)) return false;
  return true;
}

template <class K>
bool launch(const DgradArgs& a, typename K::Gemm::Arguments& args, cudaStream_t stream) {
  typename K::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  if (K::Gemm::get_workspace_size(args) != 0) return false;  // non-final reduction: none
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return false;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return false;
  const int64_t tiles = (a.n + kTileN - 1) / kTileN;
  const int64_t mp = (a.m + kTileM - 1) / kTileM * kTileM;
  sum_tiles_kernel<<<static_cast<unsigned>((a.m + 127) / 128), 128, 0, stream>>>(
      a.partial, static_cast<int>(tiles), mp, a.m, a.db);
  if (cudaGetLastError() != cudaSuccess) return false;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

template <class K>
typename K::Gemm::Arguments base_args(const DgradArgs& a, void* d) {
  using Kernel = typename K::Kernel;
  typename Kernel::StrideA sa = make_stride(Int<1>{}, a.lda, int64_t(0));
  typename Kernel::StrideB sb = make_stride(a.ldb, Int<1>{}, int64_t(0));
  typename Kernel::StrideC sc = make_stride(Int<1>{}, a.ld, int64_t(0));
  static int sms = 0;  // the first device's count; the scheduler only sizes its grid by it
  if (sms == 0) sms = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sms;
  return typename K::Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k), 1},
      {static_cast<const Bf*>(a.w), sa, static_cast<const Bf*>(a.dh), sb},
      {{}, static_cast<const typename K::Epilogue::ElementC*>(a.c), sc, static_cast<Bf*>(d), sc},
      hw};
}

}  // namespace

int64_t dgrad_partial_floats(int64_t m, int64_t n) {
  return (m + kTileM - 1) / kTileM * kTileM * ((n + kTileN - 1) / kTileN);
}

bool cross_dgrad_du(const DgradArgs& a, void* g_out, cudaStream_t stream) {
  if (!servable(a) || !g_out || !aligned16(g_out) || !aligned16(a.c)) return false;
  const AuxStride s = make_stride(Int<1>{}, a.ld, int64_t(0));
  if (!a.c) {  // g = acc
    using K = Kern<TreeDuNoC, void>;
    auto args = base_args<K>(a, a.du);
    args.epilogue.thread = {
        {{{static_cast<const Bf*>(a.x0), Bf(0), s}, {{{}, {}}, {static_cast<Bf*>(g_out), s}}, {}},
         {a.partial, 0.f, {}}},
        {}};
    return launch<K>(a, args, stream);
  }
  using K = Kern<TreeDu>;
  auto args = base_args<K>(a, a.du);
  // Children first, then the node's own: ((x0, ((acc, C, plus), store g), multiply), sums),
  // identity.
  args.epilogue.thread = {
      {{{static_cast<const Bf*>(a.x0), Bf(0), s}, {{{}, {}, {}}, {static_cast<Bf*>(g_out), s}}, {}},
       {a.partial, 0.f, {}}},
      {}};
  return launch<K>(a, args, stream);
}

bool cross_dgrad_acc(const DgradArgs& a, const void* u0, const void* u1, const void* g3,
                     const void* u2, void* acc, cudaStream_t stream) {
  if (!servable(a) || !a.c || !aligned16(a.c) || !acc || !aligned16(acc) || !u0 ||
      !aligned16(u0) || !u1 || !aligned16(u1))
    return false;
  if ((g3 == nullptr) != (u2 == nullptr) || (g3 && (!aligned16(g3) || !aligned16(u2))))
    return false;
  const AuxStride s = make_stride(Int<1>{}, a.ld, int64_t(0));
  auto load = [&](const void* p) {
    return typename Load::Arguments{static_cast<const Bf*>(p), Bf(0), s};
  };
  // du's branch: (((x0, (acc, C, plus), multiply), store du), sums).
  typename DuBranch::Arguments du{
      {{load(a.x0), {{}, {}, {}}, {}}, {static_cast<Bf*>(a.du), s}}, {a.partial, 0.f, {}}};
  if (g3) {
    using K = Kern<TreeAcc2>;
    auto args = base_args<K>(a, acc);
    args.epilogue.thread = {load(g3), load(u2), {}, load(u1), {{}, {}, {}}, load(u0), du, {}};
    return launch<K>(a, args, stream);
  }
  using K = Kern<TreeAcc1>;
  auto args = base_args<K>(a, acc);
  args.epilogue.thread = {{}, load(u1), {{}, {}, {}}, load(u0), du, {}};
  return launch<K>(a, args, stream);
}

int64_t cross_dgrad_fused_launches() { return g_launches.load(std::memory_order_relaxed); }

}  // namespace dlrec::cutlass_k
