// Layer "mlp" on CUDA (src/model/layers/mlp.cc).
#include "model/layers/graph_cuda_engine.h"
#include "dlrec/nn/mlp.h"

namespace dlrec::model::gpu_graph {
namespace {

// An MLP: per layer y = x W^T + b (+ ReLU), in bf16 one cuBLASLt GEMM with the bias (+ ReLU)
// epilogue, whose ReLU layers also write the ReLU bit mask (Lin::aux). Backward per layer: one
// pass masks dL/dy by y > 0 and sums the bias gradient (cd::mask_bias_grad); then the input
// gradient (dgrad) on the main stream and the weight gradient and update on the weight stream.
// The mask is read from y, not from the epilogue's bit mask: cuBLASLt sets the bit where the
// pre-activation is >= 0 in its own precision, so it differs from y > 0 where that is exactly 0
// (and, with some of its algorithms, where a tiny pre-activation and the rounded y disagree).
// Reading the bits was 0.12 ms faster per DCNv2 step on an H100 but not bit-identical, and was
// removed (bench/RESULTS.md, "ReLU mask from cuBLASLt's bits").
class MlpNode final : public Node {
 public:
  MlpNode(Engine& e, const std::string& name, int64_t in_width, int64_t in_ld,
          const std::vector<int64_t>& sizes, bool relu_last, uint64_t seed)
      : name_(name) {
    nn::MLP cpu(in_width, sizes, relu_last);
    cpu.init(seed);
    int64_t in_pad = in_ld;
    for (auto& l : cpu.layers()) {
      const bool relu = l.activation() == nn::Activation::ReLU;
      layers_.push_back(e.make_lin(l, in_pad, l.out_features(), true, relu));
      in_pad = l.out_features();
    }
  }
  void alloc(Engine& e, int64_t cap) override {
    alloc_value(e, cap);
    const Value& v = e.vals[self];
    ys_.assign(layers_.size(), Tensor());
    gys_.assign(layers_.size(), Tensor());
    dzs_.assign(layers_.size(), Tensor());
    dzh_ = Tensor();
    for (size_t k = 0; k < layers_.size(); ++k) {
      Lin& l = layers_[k];
      const bool last = k + 1 == layers_.size();
      const DType ydt = last ? v.dt : e.act;
      if (!last) {
        ys_[k] = e.buf({cap, l.out}, e.act);
        gys_[k] = e.buf({cap, l.out}, e.act);
      }
      if (l.relu) dzs_[k] = e.buf({cap, l.out}, ydt);
      if (e.lowp && l.relu) l.aux = e.buf({cap * l.aux_ld / 8}, DType::U8);
      if (last && ydt != e.act) dzh_ = e.buf({cap, l.out}, e.act);
      if (l.comp) l.comp->reserve(cap);
    }
  }
  void forward(Engine& e) override {
    const Value& x = e.vals[in[0]];
    Value& v = e.vals[self];
    const void* p = x.y.raw();
    for (size_t k = 0; k < layers_.size(); ++k) {
      const bool last = k + 1 == layers_.size();
      void* y = last ? v.y.raw() : ys_[k].raw();
      e.lin_forward(layers_[k], p, y, last ? v.dt : e.act);
      p = y;
    }
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    const void* dy = v.g.raw();
    for (size_t k = layers_.size(); k-- > 0;) {
      Lin& l = layers_[k];
      const bool last = k + 1 == layers_.size();
      const DType ydt = last ? v.dt : e.act;
      const void* y = last ? v.y.raw() : ys_[k].raw();
      void* dz = l.relu ? dzs_[k].raw() : nullptr;
      // ReLU mask and bias gradient in one pass; dzc: the GEMMs' operand.
      const void* dzc = nullptr;
      if (ydt == DType::F32) {
        cd::mask_bias_grad(static_cast<const float*>(dy), l.relu ? static_cast<const float*>(y)
                                                                 : nullptr,
                           static_cast<float*>(dz), e.partial.data<float>(), l.db.data<float>(),
                           e.B, l.out, e.st);
        dzc = l.relu ? dz : dy;
        if (is_half(e.act)) {  // a 1-wide f32 output in bf16/fp16 precision
          with_half(e.act, [&](auto* h) {
            using H = std::remove_pointer_t<decltype(h)>;
            cd::to_half_padded(static_cast<const float*>(dzc), e.B, l.out,
                               static_cast<H*>(dzh_.raw()), l.out, e.st);
          });
          dzc = dzh_.raw();
        }
      } else {
        with_half(ydt, [&](auto* h) {
          using H = std::remove_pointer_t<decltype(h)>;
          cd::mask_bias_grad(static_cast<const H*>(dy),
                             l.relu ? static_cast<const H*>(y) : nullptr, static_cast<H*>(dz),
                             e.partial.data<float>(), l.db.data<float>(), e.B, l.out, e.st);
        });
        dzc = l.relu ? dz : dy;
      }
      e.sub(name_ + ": bwd mask+bias grad");
      // The input gradient on st (the chain to the layers below), then this layer's weight
      // gradient and update on the weight stream (after the dgrad, which reads the weights).
      if (k > 0) {
        e.lin_dgrad(l, dzc, l.out, gys_[k - 1].raw(), e.act, layers_[k - 1].out, false);
        dy = gys_[k - 1].raw();
      } else if (e.vals[in[0]].need_grad) {
        Value& x = e.vals[in[0]];
        const bool acc = e.claim(in[0]);
        // The producer may run this GEMM with its own first backward pass fused in (cross).
        if (acc || l.qat || !x.fused_dgrad || !x.fused_dgrad(e, l, dzc, l.out))
          e.lin_dgrad(l, dzc, l.out, x.g.raw(), x.gdt, x.ld, acc);
      }
      e.sub(name_ + ": bwd dgrad");
      e.weights([&e, &l, dzc, this] {
        e.lin_wgrad(l, dzc, l.out);
        e.sub(name_ + ": bwd wgrad");
        e.lin_update(l);
        e.sub(name_ + ": bwd update");
      });
    }
  }
  void collect(Engine& e, std::vector<NamedState>& dense, std::vector<NamedState>&) override {
    for (size_t k = 0; k < layers_.size(); ++k) {
      const std::string p = name_ + "." + std::to_string(k);
      e.add_params(layers_[k], p + ".weight", p + ".bias", dense);
    }
  }
  void refresh(Engine& e) override {
    for (auto& l : layers_) e.refresh(l);
  }
  void compressible(std::vector<std::pair<std::string, Lin*>>& out) override {
    for (size_t k = 0; k < layers_.size(); ++k)
      out.emplace_back(name_ + "." + std::to_string(k) + ".weight", &layers_[k]);
  }
  // Layer k's output ys_[k] is read by layer k + 1 alone when serving.
  void chainable(std::vector<std::pair<Lin*, Lin*>>& out) override {
    for (size_t k = 0; k + 1 < layers_.size(); ++k) out.emplace_back(&layers_[k], &layers_[k + 1]);
  }
  ServingParts serving_parts(Engine& e) override {
    ServingParts p;
    p.kind = ServingParts::Kind::Mlp;
    for (size_t k = 0; k < layers_.size(); ++k) {
      p.lins.push_back(&layers_[k]);
      p.ys.push_back(k + 1 == layers_.size() ? e.vals[self].y.raw() : ys_[k].raw());
    }
    return p;
  }

 private:
  std::string name_;
  std::vector<Lin> layers_;
  std::vector<Tensor> ys_, gys_, dzs_;
  Tensor dzh_;
};

}  // namespace

std::unique_ptr<Node> make_mlp(Build& b) {
  b.set_value(b.shape.width, false);
  return std::make_unique<MlpNode>(b.e, b.spec.name, b.ins[0]->width, b.ins[0]->ld, b.spec.sizes,
                                   b.spec.relu_last, b.seed);
}

}  // namespace dlrec::model::gpu_graph
