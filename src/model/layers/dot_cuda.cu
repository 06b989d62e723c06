// Layer "dot" on CUDA (src/model/layers/dot.cc).
#include "model/layers/graph_cuda_engine.h"

namespace dlrec::model::gpu_graph {
namespace {

// DLRM's dot interaction over the n fields (width d) of the inputs: cd::dot_forward with the
// first vector and the other n - 1 read in place when the inputs are laid out that way (one
// d-wide input, then one input of n - 1 vectors, both of the compute type and unpadded),
// otherwise gathered first.
class DotNode final : public Node {
 public:
  DotNode(const Engine& e, const std::vector<const Value*>& ins, int64_t n, int64_t d)
      : n_(n), d_(d) {
    direct_ = ins.size() == 2 && ins[0]->width == d && ins[0]->ld == d &&
              ins[1]->ld == (n - 1) * d && ins[0]->dt == e.act && ins[1]->dt == e.act;
  }
  void alloc(Engine& e, int64_t cap) override {
    alloc_value(e, cap);
    if (!direct_) {
      first_ = e.buf({cap, d_}, e.act);
      rest_ = e.buf({cap, (n_ - 1) * d_}, e.act);
    }
    direct_bwd_ = direct_ && plan_direct_backward(e);
    if (e.vals[self].need_grad && !direct_bwd_) {
      dfirst_ = e.buf({cap, d_}, e.act);
      drest_ = e.buf({cap, (n_ - 1) * d_}, DType::F32);
    }
  }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    const void* a;
    const void* b;
    if (direct_) {
      a = e.vals[in[0]].y.raw();
      b = e.vals[in[1]].y.raw();
    } else {
      // Global column c of the concatenated inputs: c < d -> first_, else rest_[c - d].
      int64_t c = 0;
      for (int j : in) {
        const Value& x = e.vals[j];
        const int64_t lo = c, hi = c + x.width;
        if (lo < d_)
          cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, 0, first_.raw(), elem(e.act), d_, lo,
                        e.B, std::min(hi, d_) - lo, false, e.st);
        if (hi > d_) {
          const int64_t s = std::max(lo, d_);
          cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, s - lo, rest_.raw(), elem(e.act),
                        (n_ - 1) * d_, s - d_, e.B, hi - s, false, e.st);
        }
        c = hi;
      }
      a = first_.raw();
      b = rest_.raw();
    }
    a_ = a;
    b_ = b;
    const int T = static_cast<int>(n_ - 1), d = static_cast<int>(d_);
    if (e.lowp)
      with_half(e.act, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        cd::dot_forward(static_cast<const H*>(a), static_cast<const H*>(b), e.B, T, d,
                        static_cast<H*>(v.y.raw()), v.ld, e.st);
      });
    else
      cd::dot_forward(static_cast<const float*>(a), static_cast<const float*>(b), e.B, T, d,
                      v.y.data<float>(), v.ld, e.st);
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    const int T = static_cast<int>(n_ - 1), d = static_cast<int>(d_);
    void* dfirst = dfirst_.raw();
    float* drest = drest_.data<float>();
    if (direct_bwd_) {
      // Both inputs' gradients are written here and nowhere else (plan_direct_backward).
      DLREC_CHECK(!e.claim(in[0]) && !e.claim(in[1]),
                  "dot: an input's gradient was written before the layer's own (bug)");
      dfirst = e.vals[in[0]].g.raw();
      drest = e.vals[in[1]].g.data<float>();
    }
    if (e.lowp)
      with_half(e.act, [&](auto* h) {
        using H = std::remove_pointer_t<decltype(h)>;
        cd::dot_backward(static_cast<const H*>(a_), static_cast<const H*>(b_),
                         static_cast<const H*>(v.g.raw()), v.ld, e.B, T, d, false,
                         static_cast<H*>(dfirst), drest, e.st);
      });
    else
      cd::dot_backward(static_cast<const float*>(a_), static_cast<const float*>(b_),
                       v.g.data<float>(), v.ld, e.B, T, d, false, static_cast<float*>(dfirst),
                       drest, e.st);
    if (direct_bwd_) return;
    int64_t c = 0;
    for (int j : in) {
      const Value& x = e.vals[j];
      const int64_t lo = c, hi = c + x.width;
      c = hi;
      if (!x.need_grad) continue;
      const bool acc = e.claim(j);
      if (lo < d_) e.deliver(j, dfirst_.raw(), e.act, d_, lo, 0, std::min(hi, d_) - lo, acc);
      if (hi > d_) {
        const int64_t s = std::max(lo, d_);
        e.deliver(j, drest_.raw(), DType::F32, (n_ - 1) * d_, s - d_, s - lo, hi - s, acc);
      }
    }
  }

  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    if (!direct_) return p;  // the fused forward reads the two inputs in place
    p.kind = ServingParts::Kind::Dot;
    p.fields = n_;
    p.dim = d_;
    return p;
  }

 private:
  // The backward writes the two inputs' gradients in place, without scratch and copies, when
  // the inputs are read in place (direct_), are two different values that need a gradient and
  // have this layer as their only consumer (nobody else writes or adds to their gradients), and
  // their gradients are laid out as the kernel writes them: the first [B, d] of the compute
  // type, the rest [B, (n - 1) d] in f32 (DLRM: the bottom MLP's and the embedding layer's
  // values; the copy of the f32 rest was 1.5 GB of traffic per step at batch 55296).
  bool plan_direct_backward(const Engine& e) const {
    if (in.size() != 2 || in[0] == in[1]) return false;
    const Value& a = e.vals[in[0]];
    const Value& b = e.vals[in[1]];
    return a.need_grad && b.need_grad && a.consumers == 1 && b.consumers == 1 &&
           a.gdt == e.act && a.ld == d_ && b.gdt == DType::F32 && b.ld == (n_ - 1) * d_ &&
           a.g.numel() > 0 && b.g.numel() > 0;
  }
  int64_t n_, d_;
  bool direct_ = false, direct_bwd_ = false;
  Tensor first_, rest_, dfirst_, drest_;
  const void* a_ = nullptr;
  const void* b_ = nullptr;
};

}  // namespace

std::unique_ptr<Node> make_dot(Build& b) {
  const auto nd = interaction_fields(b.spec, [&] {
    std::vector<ValueShape> in;
    for (const Value* x : b.ins) in.push_back({x->width, x->fields});
    return in;
  }(), "");
  b.set_value(b.shape.width, true);
  return std::make_unique<DotNode>(b.e, b.ins, nd.first, nd.second);
}

}  // namespace dlrec::model::gpu_graph
