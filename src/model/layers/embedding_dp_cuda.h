// Internal: the data-parallel embedding exchange of the CUDA graph engine (embedding_cuda.cu,
// docs/DISTRIBUTED.md). Every rank's step inputs (int32 offsets [T * B_r + 1] and uint32 row
// keys [nnz_r], table-major bags as nn/embedding_cuda.h lays them out) are gathered in rank
// order; build_global_bags turns them into the offsets and keys of the global batch, bag
// t * G + R_r + b for row b of rank r (R_r: the rows of the ranks before r, G: all rows), i.e.
// the batch one GPU would see. CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/layers/embedding_exchange_layout.h"

namespace dlrec::model::gpu_graph::dp {

constexpr int kMaxRanks = 64;

// Where each rank's part lies (host-computed each step; passed by value to the kernels).
struct RankGeometry {
  int ranks = 1;
  int64_t tables = 0, global_rows = 0;
  int64_t rows[kMaxRanks];       // B_r
  int64_t row_begin[kMaxRanks];  // R_r
  int64_t off_begin[kMaxRanks];  // rank r's offsets in the gathered offsets: sum of T * B_s + 1
  int64_t key_begin[kMaxRanks];  // rank r's keys in the gathered keys: sum of nnz_s
};

// The geometry of every rank's gathered ids, S tables each (rows[r], keys[r]: rank r's rows
// and ids), and the all-gathers' counts per rank (offsets S * B_r + 1, keys).
RankGeometry gathered_geometry(const std::vector<int64_t>& rows, const std::vector<int64_t>& keys,
                               int64_t S, std::vector<int64_t>* off_counts,
                               std::vector<int64_t>* key_counts);

// Scratch bytes of build_global_bags for up to `bags` global bags.
size_t scan_bytes(int64_t bags);

// off_g [T * G + 1], keys_g [sum nnz_r] from the gathered off_in and keys_in; lens and src
// ([T * G] each) and temp (scan_bytes) are scratch.
void build_global_bags(const RankGeometry& g, const int32_t* off_in, const uint32_t* keys_in,
                       int32_t* off_g, uint32_t* keys_g, int32_t* lens, int64_t* src, void* temp,
                       size_t temp_bytes, cudaStream_t stream);

// The same for the tables tables[0..K) (device array) only: bag k * G + row of table tables[k]
// (offsets [K * G + 1] from 0, keys compacted in that order). Table-wise sharding: the owner's
// tables over the global batch, in the global row order one GPU has. With cap (device [K]), table
// k's keys above cap[k] become cap[k] (a hybrid table's ids >= F go to its prefix's zero row).
void build_table_bags(const RankGeometry& g, const int32_t* tables, int64_t K,
                      const int32_t* off_in, const uint32_t* keys_in, int32_t* off_g,
                      uint32_t* keys_g, int32_t* lens, int64_t* src, void* temp, size_t temp_bytes,
                      cudaStream_t stream, const uint32_t* cap = nullptr);

// A rank's ids of the tables sel only (host list, increasing; sel_dev: the same on the device),
// laid out as the step's inputs are (bags table-major, offsets from 0): off_out [S * B + 1] and
// keys_out. nnz[t] (host, every table): this rank's ids of table t, whose keys are contiguous
// after the tables before it. Table-wise sharding all-gathers only the tables that travel (the
// replicated ones stay home).
void compact_ids(const int32_t* off, const uint32_t* keys, int64_t B,
                 const std::vector<int64_t>& sel, const int32_t* sel_dev, const int64_t* nnz,
                 int32_t* off_out, uint32_t* keys_out, cudaStream_t stream);

// The exchange blocks on a rank with B rows (ExchangeLayout, embedding_exchange_layout.h): position
// p's element (p, b, c), c < width[p], at B * first[p] + b * count[p] + index[p] + c in the blocks
// and at b * ld + col[p] + c in the activation (or its gradient; the pointer already at the
// layer's first column). Every field counts values; unit divides all of them (16-byte vectors
// when it allows), max_width is the widest position.
struct TwLayout {
  const int32_t* col = nullptr;  // device arrays [positions]
  const int32_t* width = nullptr;
  const int32_t* first = nullptr;
  const int32_t* count = nullptr;
  const int32_t* index = nullptr;
  int64_t positions = 0;
  int64_t max_width = 0;
  int64_t unit = 1;
};
// The device view of l's arrays uploaded as ExchangeLayout::packed() at `packed`.
inline TwLayout device_layout(const int32_t* packed, const ExchangeLayout& l) {
  const int64_t P = l.positions();
  return TwLayout{packed,         packed + P, packed + 2 * P, packed + 3 * P,
                  packed + 4 * P, P,          l.max_width,    l.unit ? l.unit : 1};
}

// out's table-wise columns from the received blocks (T: float, __nv_bfloat16, __half).
template <class T>
void scatter_pooled(const TwLayout& l, int64_t B, const T* recv, T* out, int64_t ld,
                    cudaStream_t stream);
// The send blocks from the gradient's table-wise columns.
template <class T>
void gather_grads(const TwLayout& l, int64_t B, const T* grad, int64_t ld, T* send,
                  cudaStream_t stream);
// The same, rounding an f32 gradient to the model's 16-bit type on the way (To: __nv_bfloat16 or
// __half, round to nearest even): the gradient all-to-all of a bf16/fp16 run moves 16 bits per
// value, as the pooled rows' all-to-all does (docs/DISTRIBUTED.md, "Table-wise sharding on the
// GPUs").
template <class To>
void gather_grads_rounded(const TwLayout& l, int64_t B, const float* grad, int64_t ld, To* send,
                          cudaStream_t stream);

// Row-wise sharding (docs/DISTRIBUTED.md, "Row-wise tables on the GPUs"): table t's rows are
// split into contiguous ranges over the GPUs, rank r holding [rows * r / N, rows * (r + 1) / N)
// (plus one zero row, the "outside" row, that ids of other ranges are mapped to).
inline void row_range(int64_t rows, int ranks, int rank, int64_t* lo, int64_t* hi) {
  *lo = rows * rank / ranks;
  *hi = rows * (rank + 1) / ranks;
}

// This rank's row-wise pieces: device array [5 * K] of int64, per piece k (k-major):
// table, first global key of the whole table, lo, hi (its range), first local key of the piece
// in the pieces' own key space (piece k holds local keys [local, local + hi - lo], the last one
// the outside row).
struct RwLayout {
  const int64_t* info = nullptr;
  int64_t K = 0;
};

// The row-wise tables' bags over the global batch in a padded geometry: every rank's rows at
// r * bmax (bmax: the most rows of any rank this step), the rows past a rank's count empty, so
// that piece k's pooled rows [n * bmax, K, dim] split into equal blocks per rank (a reduce-scatter
// and an all-gather of equal counts). Bag k * n * bmax + r * bmax + b; its keys are the local
// keys of this rank's piece k: an id in the range [lo, hi) maps to local + id - lo, any other id
// to the outside row (local + hi - lo), which is zero, so it adds nothing to the sum and still
// counts in a mean's length. lens and src ([K * n * bmax]) and temp (scan_bytes) are scratch.
void build_row_bags(const RankGeometry& g, int64_t bmax, const RwLayout& l, const int32_t* off_in,
                    const uint32_t* keys_in, int32_t* off_g, uint32_t* keys_g, int32_t* lens,
                    int64_t* src, void* temp, size_t temp_bytes, cudaStream_t stream);

// Replicated tables: the optimizer step of every element with g[i] != 0 (the rows some rank's
// batch touched; an untouched row's all-reduced gradient is exactly zero), with the arithmetic of
// the fused update (nn/embedding_backward_cuda.cu): SGD w -= lr g, or Adagrad (a non-null) a += g g,
// w -= lr g / (sqrt(a) + eps); then g[i] = 0 for the next step. lr: device pointer. G: float,
// or the 16-bit copy that round_dense made and the all-reduce summed in a bf16/fp16 run (read
// and widened; left as it is: the f32 gradient was zeroed by round_dense).
template <class G>
void dense_update(float* w, float* a, G* g, int64_t n, const float* lr, float eps,
                  cudaStream_t stream);
// out[i] = g[i] rounded to To (__nv_bfloat16 or __half, to nearest even), then g[i] = 0: a bf16
// run's replicas all-reduce their gradient in 16 bits (docs/DISTRIBUTED.md).
template <class To>
void round_dense(float* g, To* out, int64_t n, cudaStream_t stream);

// w[i] = the value one GPU's init_uniform gives element first + i of the whole table
// (nn/embedding_cuda.h: float(-a + 2 a u(seed, first + i)), bit for bit): a row range's values.
void init_uniform_range(float* w, int64_t n, int64_t first, uint64_t seed, double a,
                        cudaStream_t stream);
// w [rows, width] = columns [c0, c0 + width) of the whole table [rows, dim] as one GPU's
// init_uniform gives them (bit for bit): a column-wise piece's values.
void init_uniform_cols(float* w, int64_t rows, int64_t dim, int64_t c0, int64_t width,
                       uint64_t seed, double a, cudaStream_t stream);

}  // namespace dlrec::model::gpu_graph::dp
