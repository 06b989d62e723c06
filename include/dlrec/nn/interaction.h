// Feature interactions between the dense (bottom-MLP) vector and the pooled embeddings.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dlrec/nn/param.h"

namespace dlrec::nn {

class Interaction {
 public:
  virtual ~Interaction() = default;
  // dense [B, dense_dim], emb [B, num_tables, dim] -> out [B, out_features()] (a layer-owned
  // buffer valid until the next forward). Keeps references to the inputs for backward().
  virtual const Tensor& forward(const Tensor& dense, const Tensor& emb) = 0;
  // dout [B, out_features()] -> grad_dense() [B, dense_dim] and grad_emb() [B, num_tables, dim].
  virtual void backward(const Tensor& dout) = 0;
  const Tensor& grad_dense() const { return d_dense_; }
  const Tensor& grad_emb() const { return d_emb_; }
  virtual int64_t out_features() const = 0;

 protected:
  Tensor dense_, emb_, out_, d_dense_, d_emb_;
};

// DLRM's dot interaction: with Z = [dense; emb_0; ...; emb_{T-1}] (n = 1 + T vectors of dim d,
// dense_dim must equal d), out = [dense, <Z_i, Z_j> for i in 1..n-1, j in 0..i-1], i.e. dense
// followed by the strictly-lower triangle of Z Z^T in row-major order: d + n(n-1)/2 features.
class DotInteraction : public Interaction {
 public:
  DotInteraction(int64_t num_tables, int64_t dim);
  const Tensor& forward(const Tensor& dense, const Tensor& emb) override;
  void backward(const Tensor& dout) override;
  int64_t out_features() const override;

 private:
  int64_t tables_, dim_;
};

// Concatenation: out = [dense, emb_0, ..., emb_{T-1}]: dense_dim + T * dim features.
class CatInteraction : public Interaction {
 public:
  CatInteraction(int64_t dense_dim, int64_t num_tables, int64_t dim);
  const Tensor& forward(const Tensor& dense, const Tensor& emb) override;
  void backward(const Tensor& dout) override;
  int64_t out_features() const override;

 private:
  int64_t dense_dim_, tables_, dim_;
};

// "dot" or "cat"; throws on anything else.
std::unique_ptr<Interaction> make_interaction(const std::string& kind, int64_t dense_dim,
                                              int64_t num_tables, int64_t dim);

}  // namespace dlrec::nn
