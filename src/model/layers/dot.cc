// Layer "dot": DLRM's dot interaction over all fields of the inputs (n vectors of width d): the
// first vector followed by the n(n-1)/2 pairwise dot products (nn::DotInteraction).
#include "dlrec/nn/interaction.h"
#include "model/layers/graph_cpu.h"
#include "model/layers/layer.h"
#include "model/layers/onnx_emit.h"

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

// Z = the n vectors [N, n, d]; Z Z^T's entries below the diagonal, row by row (Gather), after
// the first vector.
std::string dot_to_onnx(OnnxEmit& e) {
  const auto nd = interaction_fields(e.spec, e.in, kHint);
  const int64_t n = nd.first, d = nd.second;
  const std::string& name = e.spec.name;
  const std::string x = onnx_concat(e.g, e.inputs, name + ".z");
  const std::string z =
      e.g.op("Reshape", {x, e.g.ints(name + ".zshape", {-1, n, d})}, name + ".z3");
  const std::string zt =
      e.g.op("Transpose", {z}, name + ".zt", {OnnxAttr::integers("perm", {0, 2, 1})});
  const std::string zz = e.g.op("MatMul", {z, zt}, name + ".zz");
  const std::string flat =
      e.g.op("Reshape", {zz, e.g.ints(name + ".flatshape", {-1, n * n})}, name + ".flat");
  std::vector<int64_t> tri;
  for (int64_t i = 1; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) tri.push_back(i * n + j);
  const std::string pairs = e.g.op("Gather", {flat, e.g.ints(name + ".pairs", tri)}, name + ".dots",
                                   {OnnxAttr::integer("axis", 1)});
  const std::string first = e.g.op(
      "Slice",
      {x, e.g.ints(name + ".s0", {0}), e.g.ints(name + ".s1", {d}), e.g.ints(name + ".sa", {1})},
      name + ".first");
  return e.g.op("Concat", {first, pairs}, name, {OnnxAttr::integer("axis", 1)});
}

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
    t.to_onnx = dot_to_onnx;
    return t;
  }();
  return t;
}

}  // namespace dlrec::model
