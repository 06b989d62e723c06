// Internal: CUDA kernels of the embedding bags (forward pooling and initialisation in
// embedding_cuda.cu; the de-duplicated backward with the optimizer fused into the row update in
// embedding_backward_cuda.cu). Host-callable launchers; every launcher enqueues on `stream` and
// never synchronises.
//
// Layout shared by the launchers. A batch of B samples over T tables is flattened into
// T * B bags, bag = t * B + b. `offsets` [T * B + 1] (int32) index one concatenated id array
// `keys` [nnz] (uint32): the ids of bag `bag` are keys[offsets[bag] .. offsets[bag + 1]), each
// stored as row_base[t] + id, i.e. a row of the concatenation of all tables. Pooled outputs and
// their gradients are [B, T, dim] (sample-major, as the interaction wants them), with rows `ld`
// elements apart (ld = 0: T * dim, packed). A larger ld lets the pooled rows of sample b live in
// a wider matrix (e.g. columns of a concatenation): out[b * ld + t * dim + k].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dlrec/nn/row_quant.h"

namespace dlrec::nn::cuda_emb {

struct Tables {
  float* const* weights = nullptr;   // device array [T] of table pointers, table t is [rows_t, dim]
  float* const* states = nullptr;    // device array [T] of optimizer states (or null): Adagrad's
                                     // accumulator per value, per row for
                                     // Update::RowWiseAdagrad; Adam's [rows_t, 2 * dim + 1];
                                     // the momentum's velocity [rows_t, dim]
  float beta1 = 0.9f, beta2 = 0.999f;  // Update::Adam's decay rates
  float momentum = 0.f;                // Update::Momentum's mu, and Nesterov's form
  bool nesterov = false;
  const uint32_t* row_base = nullptr;  // device [T]: first global row of table t
  int num_tables = 0;
  int dim = 0;
  // device [T] or null: table t's columns in the pooled rows (forward's out, backward's
  // dpooled) start at col[t] * dim instead of t * dim (a subset of a layer's tables pooled
  // straight into, or updated straight from, the layer's columns). The caller keeps every
  // (col[t] + 1) * dim within the row stride ld.
  const int32_t* col = nullptr;
  // Serving only: row-wise quantized tables (nn/row_quant_cuda.cuh), device arrays [T] or null.
  // Table t with codes[t] non-null is read from its rows of codes, scale and bias
  // (pack_quant_rows' layout, qbits[t]: 8 or 4), and weights[t] is null; forward() pools them
  // like fp32 rows of their values (bit for bit). The backward refuses them (GraphCuda: a served
  // table).
  const uint8_t* const* codes = nullptr;
  const int32_t* qbits = nullptr;
  int quant_bits = 0;  // host-known: 8 or 4 when every table has codes of that width, else 0
};

// The device layout of a row-wise quantized table (nn/row_quant.h): row r at r * stride, its
// row_bytes() codes, then at row_bytes() rounded up to 8 its scale and bias as two floats;
// stride = that offset + 8 (dim 128: 136 bytes for int8, 72 for int4). pack_quant_rows writes
// rows [r0, r0 + n) of q into out (n * stride bytes, padding zero).
int64_t quant_row_stride(int64_t dim, int bits);
void pack_quant_rows(const RowQuantRows& q, int64_t r0, int64_t n, uint8_t* out);

// weight[i] = float(-a + 2 a uniform_at(seed, i)), a = sqrt(1 / rows): bit-identical to
// EmbeddingBag::init on the CPU.
void init_uniform(float* w, int64_t n, uint64_t seed, double a, cudaStream_t stream);
void fill(float* p, int64_t n, float value, cudaStream_t stream);

// forward() of tables all quantized with one width (quant_bits 8 or 4), dim a multiple of 16
// whose dim / 16 divides 32, out and ld aligned to 4 elements: a group of dim / 16 lanes reads
// a row, 16 codes per lane (embedding_quant_cuda.cu). False (nothing launched) otherwise.
template <class O>
bool forward_quant16(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
                     bool mean, O* out, int64_t ld, cudaStream_t stream);

// out[b, t, :] = sum (or mean) of the rows of bag t * B + b (fp32 or quantized tables: the
// codes' values); zeros for an empty bag. O is
// float, __nv_bfloat16 or __half (sums in float, rounded once). Rows ld apart (0: T * dim,
// else ld >= T * dim); the columns beyond T * dim of each row are not written. `order`: device
// [T] scratch (the caller's, for this call's stream) or null: the tables are first ordered by
// their ids in the batch (most first) into it, and the warps take them in that order (a
// multi-hot layout's long bags start first; the sums are the same).
template <class O>
void forward(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
             bool mean, O* out, cudaStream_t stream, int64_t ld = 0, int32_t* order = nullptr);

// Scratch for backward, sized for up to `max_nnz` ids (allocate with the byte count of
// scratch_bytes and carve with carve()).
struct Scratch {
  int32_t* pos_bag = nullptr;      // [nnz] bag of each id position
  uint32_t* keys_sorted = nullptr; // [nnz]
  int32_t* iota = nullptr;         // [nnz] 0..nnz-1 (filled by prepare())
  int32_t* pos_sorted = nullptr;   // [nnz]
  void* cub_temp = nullptr;
  size_t cub_bytes = 0;
  float* head = nullptr;           // [chunks, dim] partial sums of runs that began earlier
  float* tail = nullptr;           // [chunks, dim] partial sums of runs that go on later
  float* group = nullptr;          // [chunks / kGroupChunks, dim] sums of head over a group of
                                   // chunks inside one run (embedding_backward_cuda.cu, group_kernel)
  int dim = 0;
  int64_t capacity = 0;
};
size_t scratch_bytes(int64_t max_nnz, int key_bits, int dim);
Scratch carve(void* base, int64_t max_nnz, int key_bits, int dim);
void prepare(const Scratch& s, cudaStream_t stream);  // once after carve()

// The tables' optimizer: SGD; Adagrad, an accumulator per value (Tables::states[t] is
// [rows_t, dim]); row-wise Adagrad, one accumulator per row (states[t] is [rows_t]: a += the
// mean of the row's g^2, then w -= lr * g / (sqrt(a) + eps), as nn::Optimizer's
// rowwise_adagrad), for dim <= nn::cuda_rowwise_max_dim(dim) (backward_apply checks); Adam as
// nn::Optimizer's "adam" on sparse rows (states[t] is [rows_t, 2 * dim + 1]: m, v and the row's
// own step count t; Tables::beta1/beta2, `eps` its epsilon), every dim; SGD with momentum
// (states[t] [rows_t, dim], the velocity: b = mu b + g, w -= lr b, or w -= lr (g + mu b) with
// Tables::nesterov; Tables::momentum is mu).
enum class Update { SGD, Adagrad, RowWiseAdagrad, Adam, Momentum };

// dL/dpooled [B, T, dim] -> for every distinct row of the batch: its gradient, summed over its
// occurrences (mean bags scaled by 1/len) in chunks of 32 occurrences (in order of occurrence)
// whose partial sums are then added in chunk order (deterministic; equal to the CPU's in-order
// sum up to rounding), applied at once by the Update. With gscale (device, loss scaling)
// the gradients are multiplied by *gscale first, and *gscale == 0 leaves the tables untouched
// (an overflowed step). No table gradient is materialised. nnz = offsets[T * B] - offsets[0]
// with offsets[0] = 0.
// backward_update = backward_ids, then backward_apply on a packed f32 dpooled (ld = T * dim).
void backward_update(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
                     int64_t nnz, bool mean, const float* dpooled, Update kind, const float* lr,
                     float eps, int key_bits, const Scratch& s, cudaStream_t stream,
                     const float* gscale = nullptr);

// The two halves of backward_update (the second also reads a strided or bf16 gradient in
// place, as the graph model's embedding layer written into a concat does). backward_ids does
// the work that depends on the batch's ids only (the bag of each id, the stable sort by row, the
// runs of equal rows) and leaves it in `s`; backward_apply reads it (the same batch and
// scratch, nothing else using `s` in between) and reduces the gradient and updates the rows.
// dpooled is float, __nv_bfloat16 or __half (widened to float on load: the same sums as from an f32
// copy of it), rows ld apart (0: T * dim).
void backward_ids(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
                  int64_t nnz, int key_bits, const Scratch& s, cudaStream_t stream);
template <class G>
void backward_apply(const Tables& tab, const int32_t* offsets, int64_t B, int64_t nnz, bool mean,
                    const G* dpooled, int64_t ld, Update kind, const float* lr, float eps,
                    const Scratch& s, cudaStream_t stream, const float* gscale = nullptr);

}  // namespace dlrec::nn::cuda_emb
