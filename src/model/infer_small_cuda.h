// Internal: the whole 16-bit DLRM inference forward of a few rows (serving at batch 1..64) as
// ONE persistent kernel, instead of a CUDA graph of ~15 small kernels and two copies.
//
// Why: at batch 1..8 the graph path is ~15 small kernels, each ~1 us of work behind ~2 us of
// dependency latency, plus a copy-engine round trip in (~5 us) and one out. Here there are no
// copies (the kernel reads the caller's pinned inputs and writes the probabilities there) and
// 8 stage boundaries for the MLPerf shape. Measured on an H100 (bench infer, bf16, p50):
// batch 1 33.7-35.5 us vs 35.8-38.7, batch 2 34.5-36.7 vs 44.0-47.0, batch 8 41.3-43.7 vs
// 56.3-60.3. The kernel alone at batch 1 took ~31 us: a stage boundary (grid barrier and
// re-reading the activations from L2) costs 3-4 us, about what a graph's kernel boundary does.
// Past 8 rows each warp loops over groups of 8 rows: 16 rows took 59 us, no better than the
// GEMM path at 64 rows (55-66 us); 32 and 64 rows took 95 and 164 us. Hence 8 by default.
// All blocks are resident at once (cooperative launch, grid <= SM count, __launch_bounds__
// guaranteeing 2 blocks per SM), and the stages are separated by grid-wide barriers on a
// counter in global memory:
//
//   b0:    bottom layer 0, its input read from the caller's pinned host buffer (mapped into
//          the device's address space) and converted to 16-bit || each (row, table) embedding
//          row gathered from the f32 tables -> 16-bit (the key read from the pinned buffer)
//   b1:    bottom layer 1 || the embedding-embedding dot products of the interaction
//   b2..:  the other bottom layers
//   int:   the dense-embedding dot products, the dense copy, the zero padding
//   t0..:  the top layers but the last
//   last:  the last top layer (one output) by the last block to finish the one before, with
//          the sigmoid, the probabilities written straight into the caller's pinned buffer
//
// A layer is warp-per-output like cd::skinny_linear, with the same per-lane order of fused
// multiply-adds and the same warp reduction, so a layer given the same input gives the same
// bits; each block stages the layer's input rows in shared memory once; the weight row of a
// warp's first output of the next layer is loaded into registers before the barrier (weights
// never change during a launch), so after the barrier only the activations are waited for.
// The dot products are summed in f32 by 8-lane groups (4 pairs per warp) rather than on tensor
// cores: the interaction output can differ from the graph path's by one 16-bit rounding step.
//
// Co-residency: the barrier needs every block of a launch resident at once. The launch is
// cooperative (the runtime refuses a grid that cannot be co-resident and places its blocks
// together; the plain launch that was kept for A/B runs is gone, since only the cooperative
// one guarantees co-residency); besides, blocks are at most the SM count and the kernel is compiled for 2
// blocks of 256 threads per SM (16 KiB of shared memory each), so two such launches (two model
// instances on one GPU, tested) fit beside each other; other kernels only delay the start of
// some blocks. More model instances per GPU running this kernel at once are not tested.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace dlrec::model::fused_infer {

constexpr int kMaxLayers = 16;  // bottom + top layers
constexpr int kMaxRows = 64;    // rows per launch
constexpr int kMaxK = 1024;     // layer input width (the weight row a warp holds in registers)

// A layer's INT8 form (a compressed export's record, nn/compressed_linear_cuda.h Int8View):
// with q set the layer computes, as compress::int8_linear does (the CPU reference),
//   qx = clamp(rint(x * inv_x), -127, 127)      the staged 16-bit input rows, once per block
//   acc = qx . q[o]                             int32 (dp4a), exact
//   y = act(float(acc) * deq[o] + bias[o])      IEEE-rounded, no FMA; bias f32 (null: none)
// so given the same 16-bit input it writes the reference's value rounded to the output type.
struct Int8Form {
  const int8_t* q = nullptr;  // [out, qk] (rows zero-padded, qk a multiple of 16, >= k)
  const float* deq = nullptr;
  const float* bias = nullptr;
  float inv_x = 0.f;
  int qk = 0;
};

struct Layer {
  const void* w = nullptr;  // 16-bit [out, k] row-major (k = the padded input width)
  const void* b = nullptr;  // f32 when f32_out, else 16-bit [out]
  void* y = nullptr;        // device [rows, out]: 16-bit, or f32 when f32_out
  int out = 0, k = 0;
  bool relu = false, f32_out = false;
  Int8Form int8;            // q null: the 16-bit weights
};

// Everything the kernel reads and writes. Device buffers are sized for `rows` rows at least.
struct Params {
  // Inputs and output in pinned host memory (device-visible pointers).
  const float* dense = nullptr;   // [rows, num_dense]
  const uint32_t* keys = nullptr; // [T, ld_keys]: global rows of the concatenated tables
  float* probs = nullptr;         // [rows]
  int rows = 0, ld_keys = 0, num_dense = 0, T = 0, d = 0, inter_ld = 0;
  int nb = 0, nt = 0;             // bottom layers, then top layers, in `layer`
  void* emb = nullptr;            // device 16-bit [rows, T, d]
  void* inter = nullptr;          // device 16-bit [rows, inter_ld]
  float* const* tables = nullptr; // device [T] table pointers (f32 [rows_t, d])
  const uint32_t* row_base = nullptr;  // device [T] first global row of each table
  // Row-wise quantized tables (nn/embedding_cuda.h, Tables::codes): null, or device [T] with
  // table t read from its codes where codes[t] is non-null.
  const uint8_t* const* codes = nullptr;
  const int32_t* qbits = nullptr;
  unsigned* barrier = nullptr;    // device counter of the grid barriers, one per launcher
  unsigned bar_base = 0;          // its value when the launch starts (set by launch())
  Layer layer[kMaxLayers];
};

// Why `p`'s shape cannot run fused ("" when it can): layer count, widths, alignment.
std::string unsupported(const Params& p);

// Enqueues the kernel on `stream` with `blocks` blocks (at most `sm_count`, the device's SM
// count from gpu::DeviceResources; <= 0: the SM count). bf16 when !fp16, else f16. p.rows in [1, kMaxRows]; unsupported(p)
// must be "". *counter_base is the value p.barrier's counter will hold when this launch
// starts (0 for a zeroed counter); it is advanced by this launch's arrivals. Launches sharing
// a counter must run one after the other (one stream) and all go through the same
// *counter_base: a counter ahead of its base would let barriers pass early.
// The launch is a cooperative one (the driver guarantees that all its blocks are resident
// together, whatever else runs).
void launch(Params p, bool fp16, int blocks, int sm_count, uint32_t* counter_base,
            cudaStream_t stream);

// Launches so far in this process (tests check that the path ran).
int64_t launches();

// The program form of the fused forward: any graph made of the parts below (DCNv2's
// concat/cross/MLP, DeepFM's wide/fm/concat/MLP/add, ...) as one cooperative kernel that runs
// a list of ops stage by stage, with a grid barrier between stages. GraphCuda::plan_fused
// builds the list from the layers' serving parts (layers/graph_cuda_engine.h) over the engine's
// own weights and activation buffers, so the same bits land where the layer path puts them.
// Ops of one stage run side by side (every warp of the grid takes its share of each, one
// after the other); the last stage is one Linear with one output (the logit), run by the
// block arriving last at its barrier, like the DLRM kernel's last layer.
namespace prog {

enum class OpKind : int {
  Linear,   // warp-per-output y = x W^T + b (ReLU; cross combine; the logit and sigmoid)
  Gather,   // the embedding rows of fixed tables, f32 -> 16-bit, any dim
  DenseIn,  // the caller's dense rows, f32 -> 16-bit (into a concat's columns)
  Fm,       // DeepFM's second-order term over n fields of width d (f32, 1 wide)
  Wide,     // b + sum_t w_t[key_t] over tables of width 1 (f32, 1 wide)
};

constexpr int kMaxOps = 64;
constexpr int kMaxK = 4096;     // Linear input width: the staged rows are 8 * k 16-bit values
constexpr int kMaxAddends = 3;  // values added to the logit (DeepFM: the wide and fm terms)

struct Op {
  OpKind kind = OpKind::Linear;
  int stage = 0;  // ops are sorted by stage; stage s reads what stages < s wrote
  // Linear: y[r, o] (rows y_ld apart; f32 when f32_out, else 16-bit) = x[r, :k] . w[o, :k] +
  // b[o] (b: f32 when f32_out, else 16-bit; null: none), ReLU when relu; x rows x_ld apart
  // (16-bit), or with host_x the caller's dense rows (f32, num_dense wide, zero-padded to k).
  // With x0 and xl (DCNv2's cross layer, rows y_ld apart): y = x0 * v + xl, v rounded to 16
  // bits first as the layer path stores u. With to_probs (the last op): v += addend[a][r] for
  // each addend, probs[r] = sigmoid(v).
  const void* w = nullptr;
  const void* b = nullptr;
  const void* x = nullptr;
  void* y = nullptr;
  const void* x0 = nullptr;
  const void* xl = nullptr;
  const float* addend[kMaxAddends] = {};
  int out = 0, k = 0, x_ld = 0, y_ld = 0, naddend = 0;
  bool relu = false, f32_out = false, host_x = false, to_probs = false;
  // Gather: y[r, t d + c] = tables[t][key_t(r) - row_base[t]][c] (16-bit, rows y_ld apart).
  // Wide: y[r * y_ld] = b[0] + sum_t tables[t][key_t(r) - row_base[t]] (f32, in t order).
  // Fm: y[r * y_ld] from x (16-bit, rows x_ld apart): T fields of d. DenseIn: y[r, c], c <
  // num_dense (16-bit, rows y_ld apart).
  float* const* tables = nullptr;  // device [T]
  const uint32_t* row_base = nullptr;
  const uint8_t* const* codes = nullptr;  // Gather: quantized tables, as in Params
  const int32_t* qbits = nullptr;
  int T = 0, d = 0;
  Int8Form int8;  // Linear: its INT8 form (as Layer::int8; the bias then replaces b)
};

// What a launch reads besides the ops (device memory, uploaded when planned).
struct Program {
  const float* dense = nullptr;    // caller's pinned rows [rows, num_dense] (device pointer)
  const uint32_t* keys = nullptr;  // [T, ld_keys]
  float* probs = nullptr;          // [rows]
  int rows = 0, ld_keys = 0, num_dense = 0;
  const Op* ops = nullptr;  // device [nops]
  int nops = 0, stages = 0;
  int max_k = 0;               // the widest Linear input (sizes the staged rows)
  unsigned* barrier = nullptr;  // as Params::barrier
  unsigned bar_base = 0;
};

// Why the host copy of a program cannot run ("" when it can): stages in order, the last stage
// one logit op, widths, alignment.
std::string unsupported(const Op* ops, int nops);

// The most rows a program whose widest Linear input is max_k values fuses (predict() takes the
// bucketed graphs above; infer_fused_rows limits it too): where the fused kernel was measured
// no faster than the bucketed graphs (bench/RESULTS.md, "Fused small-batch forward").
int64_t rows_limit(int max_k);

// As fused_infer::launch (rows 1..kMaxRows, cooperative, the same counter contract); p.ops and
// p.max_k as planned, p.stages = the last op's stage + 1.
void launch(Program p, bool fp16, int blocks, int sm_count, uint32_t* counter_base,
            cudaStream_t stream);

}  // namespace prog

}  // namespace dlrec::model::fused_infer
