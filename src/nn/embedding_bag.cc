#include "dlrec/nn/embedding_bag.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/rng.h"

namespace dlrec::nn {

Pooling parse_pooling(const std::string& s) {
  if (s == "sum") return Pooling::Sum;
  if (s == "mean") return Pooling::Mean;
  fail("unknown pooling '", s, "' (expected sum or mean)");
}

EmbeddingBag::EmbeddingBag(int64_t rows, int64_t dim, Pooling pooling)
    : rows_(rows), dim_(dim), pooling_(pooling) {
  DLREC_CHECK(rows > 0 && dim > 0, "EmbeddingBag: rows and dim must be positive, got [", rows, ", ",
              dim, "]");
  DLREC_CHECK(rows < (int64_t{1} << 40), "EmbeddingBag: too many rows (", rows, ")");
  w_.value = Tensor::zeros({rows, dim}, DType::F32);
  grad_.dim = dim;
}

void EmbeddingBag::init(uint64_t seed) {
  const double a = std::sqrt(1.0 / static_cast<double>(rows_));
  float* w = w_.value.data<float>();
  parallel_for(0, rows_ * dim_, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      w[i] = static_cast<float>(-a + 2.0 * a * uniform_at(seed, static_cast<uint64_t>(i)));
  });
}

void EmbeddingBag::set_quantized(RowQuantRows q, const std::string& what) {
  check_row_quant(q, what);
  if (q.rows != rows_ || q.dim != dim_)
    fail(what, ": quantized rows are [", q.rows, ", ", q.dim, "], the table is [", rows_, ", ",
         dim_, "]");
  quant_ = std::move(q);
  quantized_ = true;
  w_ = Param();  // the values and any optimizer state released
  w_.value = Tensor::zeros({0, dim_}, DType::F32);
}

void EmbeddingBag::forward(const int64_t* offsets, const int64_t* indices, int64_t batch_rows,
                           float* out, int64_t out_stride, bool training) {
  DLREC_CHECK(batch_rows >= 0, "EmbeddingBag::forward: negative batch size");
  DLREC_CHECK(!(training && quantized_),
              "EmbeddingBag: a table served from quantized codes cannot train");
  have_batch_ = false;
  for (int64_t r = 0; r < batch_rows; ++r)
    DLREC_CHECK(offsets[r] <= offsets[r + 1], "EmbeddingBag::forward: offsets decrease at row ", r);
  const float* w = quantized_ ? nullptr : w_.value.data<float>();
  const int64_t d = dim_, rows = rows_;
  const bool mean = pooling_ == Pooling::Mean;
  const int64_t qrb = quant_.row_bytes();
  const int qbits = quant_.bits;
  parallel_for(0, batch_rows, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* o = out + r * out_stride;
      const int64_t b = offsets[r], e = offsets[r + 1];
      if (b == e) {
        std::memset(o, 0, d * sizeof(float));
        continue;
      }
      for (int64_t p = b; p < e; ++p) {
        const int64_t id = indices[p];
        if (id < 0 || id >= rows)
          fail("EmbeddingBag: id ", id, " of sample ", r, " is out of range [0, ", rows, ")");
        if (quantized_) {
          // The fp32 path's operations on the dequantized row: a copy, then a float add.
          const uint8_t* c = quant_.codes.data() + id * qrb;
          const float s = quant_.scale[id], bs = quant_.bias[id];
          if (p == b) {
            for (int64_t k = 0; k < d; ++k)
              o[k] = row_quant_value(row_quant_code(c, k, qbits), s, bs);
          } else {
            for (int64_t k = 0; k < d; ++k)
              o[k] += row_quant_value(row_quant_code(c, k, qbits), s, bs);
          }
          continue;
        }
        const float* wr = w + id * d;
        if (p == b) {
          std::memcpy(o, wr, d * sizeof(float));
        } else {
          for (int64_t k = 0; k < d; ++k) o[k] += wr[k];
        }
      }
      if (mean && e - b > 1) {
        const float s = 1.f / static_cast<float>(e - b);
        for (int64_t k = 0; k < d; ++k) o[k] *= s;
      }
    }
  });
  if (training) dedup(offsets, indices, batch_rows);
}

// Builds the distinct ids (first-occurrence order) with an open-addressing hash table, then the
// CSR of the samples each distinct id occurs in. O(nnz), serial: callers parallelise over tables.
void EmbeddingBag::dedup(const int64_t* offsets, const int64_t* indices, int64_t batch_rows) {
  const int64_t base = batch_rows > 0 ? offsets[0] : 0;
  const int64_t nnz = batch_rows > 0 ? offsets[batch_rows] - base : 0;
  int64_t cap = 16;
  while (cap < 2 * nnz) cap <<= 1;
  hash_keys_.assign(cap, -1);
  hash_slots_.resize(cap);
  inverse_.resize(nnz);
  uniq_ids_.clear();
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  for (int64_t p = 0; p < nnz; ++p) {
    const int64_t id = indices[base + p];
    uint64_t h = splitmix64(static_cast<uint64_t>(id)) & mask;
    for (;;) {
      if (hash_keys_[h] == id) break;
      if (hash_keys_[h] < 0) {
        hash_keys_[h] = id;
        hash_slots_[h] = static_cast<int32_t>(uniq_ids_.size());
        uniq_ids_.push_back(id);
        break;
      }
      h = (h + 1) & mask;
    }
    inverse_[p] = hash_slots_[h];
  }
  const int64_t U = static_cast<int64_t>(uniq_ids_.size());
  uniq_ptr_.assign(U + 1, 0);
  for (int64_t p = 0; p < nnz; ++p) ++uniq_ptr_[inverse_[p] + 1];
  for (int64_t u = 0; u < U; ++u) uniq_ptr_[u + 1] += uniq_ptr_[u];
  cursor_.assign(uniq_ptr_.begin(), uniq_ptr_.end() - 1);
  occ_sample_.resize(nnz);
  scale_.resize(batch_rows);
  for (int64_t r = 0; r < batch_rows; ++r) {
    const int64_t len = offsets[r + 1] - offsets[r];
    scale_[r] = (pooling_ == Pooling::Mean && len > 0) ? 1.f / static_cast<float>(len) : 1.f;
    for (int64_t p = offsets[r] - base; p < offsets[r + 1] - base; ++p)
      occ_sample_[cursor_[inverse_[p]]++] = r;
  }
  batch_rows_ = batch_rows;
  have_batch_ = true;
}

Tensor EmbeddingBag::forward(const std::vector<int64_t>& offsets,
                             const std::vector<int64_t>& indices, bool training) {
  DLREC_CHECK(!offsets.empty(), "EmbeddingBag::forward: offsets must have batch + 1 entries");
  const int64_t B = static_cast<int64_t>(offsets.size()) - 1;
  DLREC_CHECK(offsets.front() >= 0 && offsets.back() <= static_cast<int64_t>(indices.size()),
              "EmbeddingBag::forward: offsets [", offsets.front(), ", ", offsets.back(),
              "] do not fit ", indices.size(), " indices");
  Tensor out = Tensor::empty({B, dim_}, DType::F32);
  forward(offsets.data(), indices.data(), B, out.data<float>(), dim_, training);
  return out;
}

const SparseGrad& EmbeddingBag::backward(const float* dout, int64_t dout_stride) {
  DLREC_CHECK(have_batch_, "EmbeddingBag::backward needs a training forward first");
  const int64_t U = static_cast<int64_t>(uniq_ids_.size()), d = dim_;
  grad_.dim = d;
  grad_.ids = uniq_ids_;
  grad_.values.resize(U * d);
  float* gv = grad_.values.data();
  parallel_for(0, U, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      float* gr = gv + u * d;
      std::memset(gr, 0, d * sizeof(float));
      for (int64_t q = uniq_ptr_[u]; q < uniq_ptr_[u + 1]; ++q) {
        const int64_t r = occ_sample_[q];
        const float s = scale_[r];
        const float* g = dout + r * dout_stride;
        for (int64_t k = 0; k < d; ++k) gr[k] += s * g[k];
      }
    }
  });
  return grad_;
}

const SparseGrad& EmbeddingBag::backward(const Tensor& dout) {
  DLREC_CHECK(check_matrix(dout, dim_, "EmbeddingBag::backward dout") == batch_rows_,
              "EmbeddingBag::backward: dout has ", dout.dim(0), " rows, the forward had ",
              batch_rows_);
  return backward(dout.data<float>(), dim_);
}

}  // namespace dlrec::nn
