// Layer "dot": DLRM's dot interaction over all fields of the inputs (n vectors of width d): the
// first vector followed by the n(n-1)/2 pairwise dot products (nn::DotInteraction).
#include "dlrec/nn/interaction.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"

namespace dlrec::model {
namespace {

using cpu_graph::concat_cols;
using cpu_graph::slice_cols;

class DotNode final : public cpu_graph::Node {
 public:
  DotNode(const std::vector<ValueShape>& in, int64_t n, int64_t d) : n_(n), d_(d), dot_(n - 1, d) {
    for (const auto& s : in) widths_.push_back(s.width);
    // Inputs [one field of d, then anything]: no copies (the DLRM layout).
    direct_ = in.size() == 2 && in[0].width == d;
  }
  const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch& b, bool) override {
    const int64_t B = b.rows;
    if (direct_) return dot_.forward(*in[0], in[1]->reshape({B, n_ - 1, d_}));
    concat_cols(in, z_);
    slice_cols(z_, 0, d_, first_);
    slice_cols(z_, d_, (n_ - 1) * d_, rest_);
    return dot_.forward(first_, rest_.reshape({B, n_ - 1, d_}));
  }
  void backward(const Tensor& dout, const std::vector<bool>& need,
                std::vector<Tensor>& dins) override {
    dot_.backward(dout);
    const int64_t B = dout.dim(0);
    if (direct_) {
      if (need[0]) dins[0] = dot_.grad_dense();
      if (need[1]) dins[1] = dot_.grad_emb().reshape({B, (n_ - 1) * d_});
      return;
    }
    flat_ = dot_.grad_emb().reshape({B, (n_ - 1) * d_});
    concat_cols({&dot_.grad_dense(), &flat_}, dz_);
    cpu_graph::split_cols(dz_, widths_, need, bufs_, dins);
  }

 private:
  int64_t n_, d_;
  nn::DotInteraction dot_;
  std::vector<int64_t> widths_;
  bool direct_;
  Tensor z_, first_, rest_, dz_, flat_;
  std::vector<Tensor> bufs_;
};

const char* kHint = " (make the MLP's last size equal the embedding dim)";

}  // namespace

const LayerType& dot_layer() {
  static const LayerType t = [] {
    LayerType t;
    t.name = "dot";
    t.arity = -1;
    t.parse = [](ConfigReader&, LayerSpec&) {};
    t.infer = [](const LayerSpec& s, const std::vector<ValueShape>& in, const io::ShardLayout&) {
      const auto nd = interaction_fields(s, in, kHint);
      const int64_t w = nd.second + nd.first * (nd.first - 1) / 2;
      return ValueShape{w, {w}};
    };
    t.make_cpu = [](cpu_graph::Build& b) {
      const auto nd = interaction_fields(b.spec, b.in, kHint);
      return std::make_unique<DotNode>(b.in, nd.first, nd.second);
    };
    t.cuda_unsupported = [](const CudaQuery& q) { return cuda_compute_type_input(q); };
    t.make_cuda = DLREC_CUDA_LAYER(gpu_graph::make_dot);
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
