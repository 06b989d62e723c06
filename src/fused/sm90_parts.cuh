// Internal to src/fused: what the CUTLASS sm90 kernels there share — element types, the
// column-major activation layout, and the epilogue's aux load/store nodes (TMA through shared
// memory, with the stage counts the epilogue builder picks for C and D, so that they share its
// pipeline).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>

namespace dlrec::cutlass_k::sm90 {

using Bf = cutlass::bfloat16_t;
using Acc = float;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
constexpr int kAlign = 8;  // elements: 16 bytes, what TMA needs of every leading dimension
using LayoutC = cutlass::layout::ColumnMajor;  // m x n, m contiguous (C, D and every aux)

// The bf16 aux load and store nodes of an epilogue with this tile and schedule (non-void C).
template <class Tile, class EpiSchedule>
struct AuxNodes {
  using EpiDesc = cutlass::epilogue::collective::detail::EpilogueDescriptor<
      Tile, cutlass::epilogue::collective::EpilogueTileAuto, Bf, Bf, EpiSchedule>;
  using EpiTile = typename EpiDesc::EpilogueTile;
  using LDesc = cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpiDesc, LayoutC, Bf>;
  using SDesc = cutlass::epilogue::collective::detail::AuxStoreDescriptor<EpiDesc, LayoutC, Bf>;
  using Load = cutlass::epilogue::fusion::Sm90AuxLoad<
      LDesc::Stages, EpiTile, Bf, typename LDesc::Stride, typename LDesc::SmemLayoutAtom,
      typename LDesc::CopyOpS2R, kAlign>;
  using Store = cutlass::epilogue::fusion::Sm90AuxStore<
      SDesc::Stages, EpiTile, Bf, kRound, typename SDesc::Stride, typename SDesc::SmemLayoutAtom,
      typename SDesc::CopyOpR2S, kAlign>;
  using Stride = typename LDesc::Stride;  // (m, n, l): (1, ld, 0)
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace dlrec::cutlass_k::sm90
