// Layer "fm" on CUDA (src/model/layers/fm.cc).
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {
namespace {

// DeepFM's second-order term over the n fields (width d) of its inputs (1-wide f32 output):
// read in place when one input holds them unpadded (ld == n d), its gradient then written
// straight into that input's gradient buffer; otherwise gathered into a compute-type buffer
// first and the gradient (f32) routed to the inputs' columns.
class FmNode final : public Node {
 public:
  FmNode(const std::vector<const Value*>& ins, int64_t n, int64_t d) : n_(n), d_(d) {
    direct_ = ins.size() == 1 && ins[0]->ld == n * d;
  }
  void alloc(Engine& e, int64_t cap) override {
    alloc_value(e, cap);
    if (direct_) return;
    x_ = e.buf({cap, n_ * d_}, e.act);
    if (e.vals[self].need_grad) dx_ = e.buf({cap, n_ * d_}, DType::F32);
  }
  void forward(Engine& e) override {
    if (!direct_) {
      int64_t c = 0;
      for (int j : in) {
        const Value& x = e.vals[j];
        cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, 0, x_.raw(), elem(e.act), n_ * d_, c, e.B,
                      x.width, false, e.st);
        c += x.width;
      }
    }
    const void* x = input(e);
    float* y = e.vals[self].y.data<float>();
    if (is_half(input_type(e)))
      with_half(input_type(e), [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        cg::fm_forward(static_cast<const H*>(x), n_ * d_, e.B, ni(), di(), y, e.st);
      });
    else
      cg::fm_forward(static_cast<const float*>(x), n_ * d_, e.B, ni(), di(), y, e.st);
  }
  void backward(Engine& e) override {
    const float* dy = e.vals[self].g.data<float>();
    if (direct_) {
      Value& x = e.vals[in[0]];
      if (!x.need_grad) return;
      const bool acc = e.claim(in[0]);
      if (is_half(x.gdt))
        with_half(x.gdt, [&](auto* h) {
          using H = std::remove_pointer_t<decltype(h)>;
          grad(e, static_cast<H*>(x.g.raw()), x.ld, acc, dy);
        });
      else
        grad(e, x.g.data<float>(), x.ld, acc, dy);
      return;
    }
    grad(e, dx_.data<float>(), n_ * d_, false, dy);
    int64_t c = 0;
    for (int j : in) {
      const int64_t w = e.vals[j].width;
      if (e.vals[j].need_grad) {
        const bool acc = e.claim(j);
        e.deliver(j, dx_.raw(), DType::F32, n_ * d_, c, 0, w, acc);
      }
      c += w;
    }
  }
  // The fused forward reads the fields in place (one input holding them unpadded).
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    if (!direct_) return p;
    p.kind = ServingParts::Kind::Fm;
    p.fields = n_;
    p.dim = d_;
    return p;
  }

 private:
  int ni() const { return static_cast<int>(n_); }
  int di() const { return static_cast<int>(d_); }
  const void* input(Engine& e) const { return direct_ ? e.vals[in[0]].y.raw() : x_.raw(); }
  DType input_type(Engine& e) const { return direct_ ? e.vals[in[0]].dt : e.act; }
  template <class D>
  void grad(Engine& e, D* dst, int64_t ld, bool acc, const float* dy) {
    const void* x = input(e);
    if (!is_half(input_type(e))) {
      cg::fm_backward(static_cast<const float*>(x), n_ * d_, dy, e.B, ni(), di(), dst, ld, acc,
                      e.st);
    } else if constexpr (std::is_same_v<D, float>) {
      with_half(input_type(e), [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        cg::fm_backward(static_cast<const H*>(x), n_ * d_, dy, e.B, ni(), di(), dst, ld, acc,
                        e.st);
      });
    } else {  // a 16-bit gradient of a 16-bit input: one 16-bit type per model
      cg::fm_backward(static_cast<const D*>(x), n_ * d_, dy, e.B, ni(), di(), dst, ld, acc,
                      e.st);
    }
  }
  int64_t n_, d_;
  bool direct_ = false;
  Tensor x_, dx_;
};

}  // namespace

std::unique_ptr<Node> make_fm(Build& b) {
  const auto nd = interaction_fields(b.spec, [&] {
    std::vector<ValueShape> in;
    for (const Value* x : b.ins) in.push_back({x->width, x->fields});
    return in;
  }(), "");
  b.set_value(1, false);
  return std::make_unique<FmNode>(b.ins, nd.first, nd.second);
}

}  // namespace dlrec::model::gpu_graph
