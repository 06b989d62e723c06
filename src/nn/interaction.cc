#include "dlrec/nn/interaction.h"

#include <cstring>
#include <vector>

#include "dlrec/core/thread_pool.h"
#include "nn/interaction_avx512.h"

namespace dlrec::nn {
namespace {

void check_emb(const Tensor& emb, int64_t B, int64_t tables, int64_t dim, const char* who) {
  DLREC_CHECK(emb.dtype() == DType::F32 && !emb.device().is_cuda(), who,
              ": embeddings must be an f32 CPU tensor");
  DLREC_CHECK(emb.ndim() == 3 && emb.dim(0) == B && emb.dim(1) == tables && emb.dim(2) == dim,
              who, ": embeddings must have shape [", B, ", ", tables, ", ", dim, "], got ",
              shape_str(emb.shape()));
}

}  // namespace

DotInteraction::DotInteraction(int64_t num_tables, int64_t dim) : tables_(num_tables), dim_(dim) {
  DLREC_CHECK(num_tables >= 0 && dim > 0, "DotInteraction: bad sizes (", num_tables, " tables, dim ",
              dim, ")");
}

int64_t DotInteraction::out_features() const {
  const int64_t n = tables_ + 1;
  return dim_ + n * (n - 1) / 2;
}

const Tensor& DotInteraction::forward(const Tensor& dense, const Tensor& emb) {
  const int64_t B = check_matrix(dense, dim_, "DotInteraction dense input");
  check_emb(emb, B, tables_, dim_, "DotInteraction");
  dense_ = dense;
  emb_ = emb;
  const int64_t n = tables_ + 1, d = dim_, F = out_features();
  ensure_buffer(out_, {B, F});
  const float* xd = dense.data<float>();
  const float* xe = emb.data<float>();
  float* out = out_.data<float>();
  if (dot_avx512_available()) {  // interaction_avx512.cc: the same bits
    dot_forward_avx512(xd, xe, B, tables_, d, out);
    return out_;
  }
  parallel_for(0, B, 32, [&](int64_t lo, int64_t hi) {
    // zt: Z^T [d, n] of one sample, so that <Z_i, Z_j> for all j < i is a loop over j that
    // vectorises (the sum over k stays in a fixed order).
    std::vector<float> zt(d * n);
    for (int64_t b = lo; b < hi; ++b) {
      const float* zd = xd + b * d;
      const float* ze = xe + b * tables_ * d;
      for (int64_t k = 0; k < d; ++k) {
        float* ztk = zt.data() + k * n;
        ztk[0] = zd[k];
        for (int64_t t = 0; t < tables_; ++t) ztk[t + 1] = ze[t * d + k];
      }
      float* o = out + b * F;
      std::memcpy(o, zd, d * sizeof(float));
      float* tri = o + d;
      for (int64_t i = 1; i < n; ++i) {
        float* oi = tri + i * (i - 1) / 2;  // the i entries <Z_i, Z_0..i-1>
        for (int64_t j = 0; j < i; ++j) oi[j] = 0.f;
        for (int64_t k = 0; k < d; ++k) {
          const float zik = zt[k * n + i];
          const float* ztk = zt.data() + k * n;
          for (int64_t j = 0; j < i; ++j) oi[j] += zik * ztk[j];
        }
      }
    }
  });
  return out_;
}

void DotInteraction::backward(const Tensor& dout) {
  DLREC_CHECK(dense_.defined(), "DotInteraction::backward called before forward");
  const int64_t B = dense_.dim(0), n = tables_ + 1, d = dim_, F = out_features();
  DLREC_CHECK(check_matrix(dout, F, "DotInteraction::backward dout") == B,
              "DotInteraction::backward: dout rows differ from the forward batch");
  ensure_buffer(d_dense_, {B, d});
  ensure_buffer(d_emb_, {B, tables_, d});
  const float* g = dout.data<float>();
  const float* xd = dense_.data<float>();
  const float* xe = emb_.data<float>();
  float* gd = d_dense_.data<float>();
  float* ge = d_emb_.data<float>();
  parallel_for(0, B, 32, [&](int64_t lo, int64_t hi) {
    // dZ_i = sum_{j != i} G_ij Z_j with G the symmetric matrix of the triangle's gradients.
    // dZ_0 goes to a scratch row, dZ_1.. straight into grad_emb.
    std::vector<float> dz0(d);
    for (int64_t b = lo; b < hi; ++b) {
      const float* gb = g + b * F;
      const float* tri = gb + d;
      const float* zd = xd + b * d;
      const float* ze = xe + b * tables_ * d;
      float* geb = ge + b * tables_ * d;
      auto z = [&](int64_t i) { return i == 0 ? zd : ze + (i - 1) * d; };
      auto dz = [&](int64_t i) { return i == 0 ? dz0.data() : geb + (i - 1) * d; };
      std::fill(dz0.begin(), dz0.end(), 0.f);
      std::memset(geb, 0, tables_ * d * sizeof(float));
      for (int64_t i = 1; i < n; ++i) {
        const float* gi = tri + i * (i - 1) / 2;
        const float* zi = z(i);
        float* dzi = dz(i);
        for (int64_t j = 0; j < i; ++j) {
          const float gij = gi[j];
          const float* zj = z(j);
          float* dzj = dz(j);
          for (int64_t k = 0; k < d; ++k) {
            dzi[k] += gij * zj[k];
            dzj[k] += gij * zi[k];
          }
        }
      }
      float* gdb = gd + b * d;
      for (int64_t k = 0; k < d; ++k) gdb[k] = gb[k] + dz0[k];
    }
  });
}

CatInteraction::CatInteraction(int64_t dense_dim, int64_t num_tables, int64_t dim)
    : dense_dim_(dense_dim), tables_(num_tables), dim_(dim) {
  DLREC_CHECK(dense_dim >= 0 && num_tables >= 0 && dim > 0 && dense_dim + num_tables > 0,
              "CatInteraction: bad sizes (dense ", dense_dim, ", ", num_tables, " tables, dim ",
              dim, ")");
}

int64_t CatInteraction::out_features() const { return dense_dim_ + tables_ * dim_; }

const Tensor& CatInteraction::forward(const Tensor& dense, const Tensor& emb) {
  const int64_t B = check_matrix(dense, dense_dim_, "CatInteraction dense input");
  check_emb(emb, B, tables_, dim_, "CatInteraction");
  dense_ = dense;
  emb_ = emb;
  const int64_t F = out_features(), E = tables_ * dim_, D = dense_dim_;
  ensure_buffer(out_, {B, F});
  const float* xd = dense.data<float>();
  const float* xe = emb.data<float>();
  float* out = out_.data<float>();
  parallel_for(0, B, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      std::memcpy(out + b * F, xd + b * D, D * sizeof(float));
      std::memcpy(out + b * F + D, xe + b * E, E * sizeof(float));
    }
  });
  return out_;
}

void CatInteraction::backward(const Tensor& dout) {
  DLREC_CHECK(dense_.defined(), "CatInteraction::backward called before forward");
  const int64_t B = dense_.dim(0), F = out_features(), E = tables_ * dim_, D = dense_dim_;
  DLREC_CHECK(check_matrix(dout, F, "CatInteraction::backward dout") == B,
              "CatInteraction::backward: dout rows differ from the forward batch");
  ensure_buffer(d_dense_, {B, D});
  ensure_buffer(d_emb_, {B, tables_, dim_});
  const float* g = dout.data<float>();
  float* gd = d_dense_.data<float>();
  float* ge = d_emb_.data<float>();
  parallel_for(0, B, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      std::memcpy(gd + b * D, g + b * F, D * sizeof(float));
      std::memcpy(ge + b * E, g + b * F + D, E * sizeof(float));
    }
  });
}

std::unique_ptr<Interaction> make_interaction(const std::string& kind, int64_t dense_dim,
                                              int64_t num_tables, int64_t dim) {
  if (kind == "dot") {
    DLREC_CHECK(dense_dim == dim, "dot interaction needs the dense vector (bottom MLP output, ",
                dense_dim, ") to have the embedding dimension (", dim, ")");
    return std::make_unique<DotInteraction>(num_tables, dim);
  }
  if (kind == "cat") return std::make_unique<CatInteraction>(dense_dim, num_tables, dim);
  fail("unknown interaction '", kind, "' (expected dot or cat)");
}

}  // namespace dlrec::nn
