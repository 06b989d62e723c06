// Internal: the whole 16-bit DLRM inference forward of a few rows (serving at batch 1..64) as
// ONE persistent kernel, instead of a CUDA graph of ~15 small kernels and two copies.
//
// Why: at batch 1 each of those kernels runs ~1 us of work behind ~3 us of launch, tail and
// dependency latency; the copies in and out cost a copy-engine round trip each. Here all blocks
// are resident at once (grid <= SM count, __launch_bounds__ guaranteeing 2 blocks per SM), and
// the stages are separated by a grid-wide barrier on a counter in global memory:
//
//   in:    dense features (read from the caller's pinned host buffer, which is mapped into the
//          device's address space) -> 16-bit padded rows; each (row, table) embedding row
//          gathered from the f32 tables -> 16-bit (the key read from the pinned host buffer)
//   b0:    bottom layer 0 || the embedding-embedding dot products of the interaction
//   b1..:  the other bottom layers
//   int:   the dense-embedding dot products, the dense copy, the zero padding
//   t0..:  the top layers; the last one (one output) also applies the sigmoid and writes the
//          probabilities straight into the caller's pinned host buffer
//
// A layer is warp-per-output like cd::skinny_linear, with the same per-lane order of fused
// multiply-adds and the same warp reduction, so a layer given the same input gives the same
// bits; the weight row of a warp's first output of the next layer is loaded into registers
// before the barrier (weights never change during a launch), so after the barrier only the
// activations are waited for. The dot products are summed in f32 by 8-lane groups (4 pairs per
// warp) rather than on tensor cores: the interaction output can differ from the graph path's
// by one 16-bit rounding step.
//
// Co-residency: the barrier needs every block of a launch resident at once. Blocks are at most
// the SM count and the kernel is compiled for 2 blocks of 256 threads per SM without shared
// memory, so up to 2 such launches (two model instances on one GPU) are always resident
// together; other kernels only delay the start of some blocks. More concurrent launches than
// 2 x (blocks/SM) could deadlock: callers keep one launch per model stream and the block count
// at or below the SM count.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace dlrec::model::fused_infer {

constexpr int kMaxLayers = 16;  // bottom + top layers
constexpr int kMaxRows = 64;    // rows per launch
constexpr int kMaxK = 1024;     // layer input width (the weight row a warp holds in registers)

struct Layer {
  const void* w = nullptr;  // 16-bit [out, k] row-major (k = the padded input width)
  const void* b = nullptr;  // f32 when f32_out, else 16-bit [out]
  void* y = nullptr;        // device [rows, out]: 16-bit, or f32 when f32_out
  int out = 0, k = 0;
  bool relu = false, f32_out = false;
};

// Everything the kernel reads and writes. Device buffers are sized for `rows` rows at least.
struct Params {
  // Inputs and output in pinned host memory (device-visible pointers).
  const float* dense = nullptr;   // [rows, num_dense]
  const uint32_t* keys = nullptr; // [T, ld_keys]: global rows of the concatenated tables
  float* probs = nullptr;         // [rows]
  int rows = 0, ld_keys = 0, num_dense = 0, T = 0, d = 0, inter_ld = 0;
  int nb = 0, nt = 0;             // bottom layers, then top layers, in `layer`
  void* x0 = nullptr;             // device 16-bit [rows, layer[0].k]: the padded dense rows
  void* emb = nullptr;            // device 16-bit [rows, T, d]
  void* inter = nullptr;          // device 16-bit [rows, inter_ld]
  float* const* tables = nullptr; // device [T] table pointers (f32 [rows_t, d])
  const uint32_t* row_base = nullptr;  // device [T] first global row of each table
  unsigned* barrier = nullptr;    // device [2] zero-initialised, one per concurrent launcher
  Layer layer[kMaxLayers];
};

// Why `p`'s shape cannot run fused ("" when it can): layer count, widths, alignment.
std::string unsupported(const Params& p);

// Enqueues the kernel on `stream` with `blocks` blocks (at most the device's SM count;
// <= 0: the SM count). bf16 when !fp16, else f16. p.rows in [1, kMaxRows]; unsupported(p)
// must be "".
void launch(const Params& p, bool fp16, int blocks, cudaStream_t stream);

// Launches so far in this process (tests check that the path ran).
int64_t launches();

}  // namespace dlrec::model::fused_infer
