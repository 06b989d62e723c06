// EmbeddingBag: one embedding table with bag pooling and sparse gradients (F32, CPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/nn/param.h"
#include "dlrec/nn/row_quant.h"

namespace dlrec::nn {

enum class Pooling { Sum, Mean };
Pooling parse_pooling(const std::string& s);  // "sum" | "mean"

// The gradient of a table for one batch: the batch's distinct ids (in order of first
// occurrence) and the summed gradient row of each. Never a dense table gradient.
struct SparseGrad {
  int64_t dim = 0;
  std::vector<int64_t> ids;   // [U], distinct
  std::vector<float> values;  // [U * dim], row u is the gradient of row ids[u]
  int64_t size() const { return static_cast<int64_t>(ids.size()); }
};

class EmbeddingBag {
 public:
  // Table [rows, dim], zero until init().
  EmbeddingBag(int64_t rows, int64_t dim, Pooling pooling = Pooling::Sum);

  // uniform(-sqrt(1 / rows), sqrt(1 / rows)) like the DLRM reference, from the counter-based
  // stream `seed` (identical on any thread count).
  void init(uint64_t seed);

  // Pools the bags of `batch_rows` samples: sample r's ids are
  // indices[offsets[r] .. offsets[r + 1]); its pooled row (sum, or mean; zeros for an empty bag)
  // goes to out + r * out_stride (dim floats). Ids out of [0, rows) throw. With training = true
  // the batch's ids are de-duplicated and kept for backward() (offsets/indices may be freed
  // after the call).
  void forward(const int64_t* offsets, const int64_t* indices, int64_t batch_rows, float* out,
               int64_t out_stride, bool training);
  // Convenience: offsets [B + 1], indices -> pooled [B, dim] (a new tensor).
  Tensor forward(const std::vector<int64_t>& offsets, const std::vector<int64_t>& indices,
                 bool training);

  // From dL/dpooled (row r at dout + r * dout_stride) of the last training forward, the sparse
  // gradient of the table. The result is owned by the layer, valid until the next backward().
  // Deterministic: each row's contributions are summed in order of occurrence.
  const SparseGrad& backward(const float* dout, int64_t dout_stride);
  const SparseGrad& backward(const Tensor& dout);  // dout [B, dim]

  Param& weight() { return w_; }  // value [rows, dim]; grad stays undefined
  // Serves the table from row-wise INT8 / 4-bit codes (row_quant.h; checked, errors name the
  // table as `what`): the fp32 values are released (weight() becomes [0, dim]) and forward()
  // dequantizes each row inside the pooling, bit for bit the pooling of the fp32 table those
  // codes dequantize to. Inference only: a training forward or backward() is an error.
  void set_quantized(RowQuantRows q, const std::string& what);
  const RowQuantRows* quantized() const { return quantized_ ? &quant_ : nullptr; }
  int64_t rows() const { return rows_; }
  int64_t dim() const { return dim_; }
  Pooling pooling() const { return pooling_; }

 private:
  void dedup(const int64_t* offsets, const int64_t* indices, int64_t batch_rows);

  int64_t rows_, dim_;
  Pooling pooling_;
  Param w_;
  bool quantized_ = false;
  RowQuantRows quant_;
  // State of the last training forward: per-sample scale (1 or 1/len) and, per distinct id,
  // the samples it occurs in (CSR, in order of occurrence).
  bool have_batch_ = false;
  int64_t batch_rows_ = 0;
  std::vector<float> scale_;
  std::vector<int64_t> uniq_ids_, uniq_ptr_, occ_sample_, cursor_;
  std::vector<int64_t> hash_keys_;
  std::vector<int32_t> hash_slots_, inverse_;
  SparseGrad grad_;
};

}  // namespace dlrec::nn
