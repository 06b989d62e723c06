// Layer "cross" (DCNv2) on CUDA (src/model/layers/cross.cc); the algorithm is described at
// the top of src/model/graph_cuda.cu.
#include "model/layers/graph_cuda_engine.h"
#include "dlrec/nn/cross.h"
#if DLREC_WITH_CUTLASS
#include "fused/cross_fused.h"
#endif

namespace dlrec::model::gpu_graph {
namespace {

class CrossNode final : public Node {
 public:
  CrossNode(Engine& e, const std::string& name, int64_t F, int64_t in_ld, int64_t ld,
            int64_t layers, int64_t rank, uint64_t seed)
      : name_(name), F_(F), in_ld_(in_ld), ld_(ld), r_(rank) {
    nn::CrossNet cpu(F, layers, rank);
    cpu.init(seed);
    auto params = cpu.params();
    deferred_ = layers - 1 <= cg::kMaxCrossTerms && e.opts->cross_defer_dx0;
    // The CUTLASS kernels (src/fused) are bf16 only: fp16 takes the two-step paths.
    fused_ = e.opts->cross_fused && !e.fp16;
    fused_bwd_ = fused_ && e.opts->cross_fused_bwd;
    rld_ = e.lowp ? round_up(std::max<int64_t>(rank, 1), 8) : rank;
    // params(): per layer "<l>.w.weight", "<l>.w.bias", and low rank "<l>.v.weight". The
    // Linear objects behind them: w (F x F, or U: r -> F) and v (V: F -> r, bias unused).
    size_t p = 0;
    for (int64_t l = 0; l < layers; ++l) {
      Layer L;
      nn::Param* w = params[p++].second;
      nn::Param* b = params[p++].second;
      nn::Param* v = r_ > 0 ? params[p++].second : nullptr;
      // Rebuild Linear shells around the CPU values (same shapes) for make_lin.
      if (r_ > 0) {
        nn::Linear vl(F, r_), ul(r_, F);
        vl.weight().value = v->value;
        ul.weight().value = w->value;
        ul.bias().value = b->value;
        L.v = e.make_lin(vl, ld_, rld_, false, false);
        L.w = e.make_lin(ul, rld_, ld_, true, false);
      } else {
        nn::Linear wl(F, F);
        wl.weight().value = w->value;
        wl.bias().value = b->value;
        L.w = e.make_lin(wl, ld_, ld_, true, false);
      }
      layers_.push_back(std::move(L));
    }
  }
  void alloc(Engine& e, int64_t cap) override {
    alloc_value(e, cap);
    const Value& v = e.vals[self];
    const size_t L = layers_.size();
    for (size_t l = 0; l < L; ++l) {
      Layer& Y = layers_[l];
      Y.u = e.buf({cap, ld_}, e.act);
      if (r_ > 0) Y.h = e.buf({cap, rld_}, e.act);
      Y.x = l + 1 == L ? v.y : e.buf({cap, ld_}, e.act);
      // Backward: per layer (the weight stream reads them while st goes on to the next layer).
      Y.du = Tensor();
      Y.dh = Tensor();
      Y.gin = Tensor();
      if (v.need_grad) {
        Y.du = e.buf({cap, ld_}, e.act);
        if (r_ > 0) Y.dh = e.buf({cap, rld_}, e.act);
        if (deferred_ && l > 0) Y.gin = e.buf({cap, ld_}, e.act);
      }
    }
    for (Layer& Y : layers_) {
      if (Y.w.comp) Y.w.comp->reserve(cap);
      if (Y.v.comp) Y.v.comp->reserve(cap);
    }
    if (in_ld_ != ld_) x0_ = e.buf({cap, ld_}, e.act);
    if (v.need_grad) acc_ = e.buf({cap, ld_}, e.act);
#if DLREC_WITH_CUTLASS
    part_ = Tensor();
    e.vals[self].fused_dgrad = nullptr;
    if (v.need_grad && e.lowp && fused_bwd_ && deferred_ && r_ > 0 && ld_ == F_) {
      part_ = e.buf({cutlass_k::dgrad_partial_floats(ld_, cap)}, DType::F32);
      if (L >= 2)
        e.vals[self].fused_dgrad = [this](Engine& en, const Lin& l, const void* dz,
                                          int64_t dz_ld) { return fused_top(en, l, dz, dz_ld); };
    }
#endif
  }
  void forward(Engine& e) override {
    const Value& in0 = e.vals[in[0]];
    const void* x0 = in0.y.raw();
    if (in_ld_ != ld_) {
      cg::copy_cols(x0, elem(in0.dt), in_ld_, 0, x0_.raw(), elem(e.act), ld_, 0, e.B, F_, false,
                    e.st);
      x0 = x0_.raw();
    }
    x0p_ = x0;
    const void* xl = x0;
    for (auto& L : layers_) {
      const void* in = xl;  // the input of the F-wide GEMM: h (low rank) or x_l
      if (r_ > 0) {
        e.lin_forward(L.v, xl, L.h.raw(), e.act);
        in = L.h.raw();
      }
#if DLREC_WITH_CUTLASS
      // bf16: u = in W^T + b and x_{l+1} = x0 * u + x_l in one kernel (src/fused); declined
      // (false) on a device or layout it cannot serve, then the two steps below.
      // A compressed W when serving (GraphCuda::set_compressed) takes lin_forward's kernel
      // choice and the separate combine instead, unless dense was chosen for this batch size
      // (then the fused kernel, the dense path's real cost).
      const bool comp = e.serving && L.w.comp &&
                        L.w.comp->policy() != nn::kernel_choice::Policy::Dense &&
                        !L.w.comp->chose_dense(e.B);
      if (e.lowp && fused_ && e.B > 0 && !comp && !L.w.qat &&
          cutlass_k::cross_gemm_combine(L.w.out, e.B, L.w.in_pad, L.w.wh.raw(), L.w.in_pad, in,
                                        L.w.in_pad, L.w.bh.raw(), x0, xl, L.u.raw(), L.x.raw(),
                                        ld_, e.st)) {
        L.w.x = in;  // the weight gradient's input, as lin_forward records it
        e.sub(name_ + ": fwd gemms + combine (fused)");
        xl = L.x.raw();
        continue;
      }
#endif
      e.lin_forward(L.w, in, L.u.raw(), e.act);
      e.sub(name_ + ": fwd gemms");
      if (e.lowp)
        with_half(e.act, [&](auto* h) {
          using H = std::remove_pointer_t<decltype(h)>;
          cg::cross_combine(static_cast<const H*>(x0), static_cast<const H*>(L.u.raw()),
                            static_cast<const H*>(xl), static_cast<H*>(L.x.raw()), e.B, F_, ld_,
                            e.st);
        });
      else
        cg::cross_combine(static_cast<const float*>(x0), L.u.data<float>(),
                          static_cast<const float*>(xl), L.x.data<float>(), e.B, F_, ld_, e.st);
      e.sub(name_ + ": fwd combine");
      xl = L.x.raw();
    }
  }
  // Backward of layer l, g = dL/dx_{l+1}: the element-wise pass (du = g * x0, the bias
  // gradient, and the dL/dx0 sum: per layer into an accumulator, or deferred: all layers' terms
  // at layer 0 from the kept g's), then on st the data GEMMs dh = du U, dL/dx_l = g + dh V (a
  // new buffer when deferred, else g in place; at layer 0 added to the dL/dx0 sum), and on the
  // weight stream the weight GEMMs and the updates.
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    Value& x = e.vals[in[0]];
    // The accumulator of dL/dx0 (compute type): the input's gradient buffer itself when this is
    // its first consumer and the layouts agree (no copy), else our own, delivered at the end.
    const bool alias = x.need_grad && !x.has_grad && x.gdt == e.act && in_ld_ == ld_;
    void* acc = alias ? x.g.raw() : acc_.raw();
    if (alias) e.claim(in[0]);
    const int64_t L = static_cast<int64_t>(layers_.size());
    // gs[l] = dL/dx_l for l >= 1 (deferred: each in its own buffer; else all in v.g).
    std::vector<void*> gs(L + 1, v.g.raw());
    // Layer l's element-wise pass was done by layer l+1's data GEMM (the top layer's: by the
    // consumer's, fused_top).
    bool pass_done = top_pass_done_;
    top_pass_done_ = false;
    for (int64_t l = L; l-- > 0;) {
      Layer& Y = layers_[l];
      void* g = gs[l + 1];
      const bool ran_pass = !pass_done;
      if (pass_done) {
        pass_done = false;
      } else if (deferred_) {
        cg::CrossTerms terms;
        if (l == 0)
          for (int64_t k = L - 1; k >= 1; --k) {
            terms.g[terms.n] = gs[k + 1];
            terms.u[terms.n] = layers_[k].u.raw();
            ++terms.n;
          }
        void* a = l == 0 ? acc : nullptr;
        if (e.lowp)
          with_half(e.act, [&](auto* h) {
            using H = std::remove_pointer_t<decltype(h)>;
            cg::cross_backward_deferred(static_cast<const H*>(g), static_cast<const H*>(x0p_),
                                        static_cast<const H*>(Y.u.raw()),
                                        static_cast<H*>(Y.du.raw()), static_cast<H*>(a), terms,
                                        e.partial.data<float>(), Y.w.db.data<float>(), e.B, F_,
                                        ld_, l == 0, e.st);
          });
        else
          cg::cross_backward_deferred(static_cast<const float*>(g),
                                      static_cast<const float*>(x0p_), Y.u.data<float>(),
                                      Y.du.data<float>(), static_cast<float*>(a), terms,
                                      e.partial.data<float>(), Y.w.db.data<float>(), e.B, F_,
                                      ld_, l == 0, e.st);
      } else if (e.lowp) {
        with_half(e.act, [&](auto* h) {
          using H = std::remove_pointer_t<decltype(h)>;
          cg::cross_backward(static_cast<const H*>(g), static_cast<const H*>(x0p_),
                             static_cast<const H*>(Y.u.raw()), static_cast<H*>(Y.du.raw()),
                             static_cast<H*>(acc), e.partial.data<float>(), Y.w.db.data<float>(),
                             e.B, F_, ld_, l == L - 1, l == 0, e.st);
        });
      } else {
        cg::cross_backward(static_cast<const float*>(g), static_cast<const float*>(x0p_),
                           Y.u.data<float>(), Y.du.data<float>(), static_cast<float*>(acc),
                           e.partial.data<float>(), Y.w.db.data<float>(), e.B, F_, ld_,
                           l == L - 1, l == 0, e.st);
      }
      if (ran_pass) e.sub(name_ + ": bwd elementwise");
      // dL/dx_l = g + (du through W, or through U then V); at layer 0 added to the dL/dx0 sum.
      void* dst = l > 0 ? (deferred_ ? Y.gin.raw() : g) : acc;
      Lin& last = r_ > 0 ? Y.v : Y.w;  // the Lin whose dgrad gives dL/dx_l
      const void* dz = Y.du.raw();
      int64_t dz_ld = ld_;
      if (r_ > 0) {
        e.lin_dgrad(Y.w, Y.du.raw(), ld_, Y.dh.raw(), e.act, rld_, false);
        dz = Y.dh.raw();
        dz_ld = rld_;
      }
      if (l > 0 && fused_bwd(e, l, last, dz, dz_ld, gs, acc)) {
        pass_done = true;
        gs[l] = l > 1 ? Y.gin.raw() : nullptr;  // layer 0's g lives only in the dL/dx0 sum
        e.sub(name_ + ": bwd dgrad + next elementwise (fused)");
      } else if (l == 0 || !deferred_) {  // added in place to g or to the dL/dx0 sum
        e.lin_dgrad(last, dz, dz_ld, dst, e.act, ld_, true);
      } else {  // a new buffer: dst = dz W + g
        e.lin_dgrad_c(last, dz, dz_ld, g, dst, e.act, ld_);
      }
      if (!pass_done) {
        gs[l] = dst;
        e.sub(name_ + ": bwd dgrad");
      }
      e.weights([&e, &Y, this] {
        e.lin_wgrad(Y.w, Y.du.raw(), ld_);
        if (r_ > 0) e.lin_wgrad(Y.v, Y.dh.raw(), rld_);
        e.sub(name_ + ": bwd wgrad");
        if (r_ > 0) e.lin_update(Y.v);
        e.lin_update(Y.w);
        e.sub(name_ + ": bwd update");
      });
    }
    if (x.need_grad && !alias) {
      const bool accumulate = e.claim(in[0]);
      e.deliver(in[0], acc_.raw(), e.act, ld_, 0, 0, F_, accumulate);
    }
  }
#if DLREC_WITH_CUTLASS
  // Whether the fused backward kernels (src/fused, cross_bwd_fused.cu) may run: bf16, the
  // deferred dL/dx0 sum, low rank, x0 unpadded.
  bool can_fuse_bwd(const Engine& e) const {
    if (!(e.lowp && fused_bwd_ && deferred_ && r_ > 0 && ld_ == F_ && e.B > 0 &&
          part_.raw() != nullptr))
      return false;
    for (const Layer& Y : layers_)  // QAT layers' data gradients go through their gate
      if (Y.w.qat || Y.v.qat) return false;
    return true;
  }
  // A fused data GEMM g = dz W (+ c) by `w`'s weights that also writes layer `below`'s du and
  // bias gradient.
  cutlass_k::DgradArgs dgrad_args(Engine& e, const Lin& w, const void* dz, int64_t dz_ld,
                                  const void* c, size_t below) {
    cutlass_k::DgradArgs a;
    a.m = w.in_pad;
    a.n = e.B;
    a.k = w.out;
    a.w = e.wcomp(w);
    a.lda = w.in_pad;
    a.dh = dz;
    a.ldb = dz_ld;
    a.c = c;
    a.x0 = x0p_;
    a.du = layers_[below].du.raw();
    a.db = layers_[below].w.db.data<float>();
    a.partial = part_.data<float>();
    a.partial_floats = part_.numel();
    a.ld = ld_;
    return a;
  }
#endif
  // The consumer's data GEMM that forms our gradient (v.g = dz W), with the top cross layer's
  // du pass in its epilogue (two or more layers: the top layer's pass is du only).
  bool fused_top(Engine& e, const Lin& l, const void* dz, int64_t dz_ld) {
#if DLREC_WITH_CUTLASS
    Value& v = e.vals[self];
    if (!can_fuse_bwd(e) || layers_.size() < 2 || v.consumers != 1 || l.in_pad != ld_ ||
        v.gdt != e.act)
      return false;
    const cutlass_k::DgradArgs a = dgrad_args(e, l, dz, dz_ld, nullptr, layers_.size() - 1);
    if (!cutlass_k::cross_dgrad_du(a, v.g.raw(), e.st)) return false;
    top_pass_done_ = true;
    return true;
#else
    (void)e, (void)l, (void)dz, (void)dz_ld;
    return false;
#endif
  }
  // Layer l's data GEMM dL/dx_l = g + dh V with layer l-1's element-wise pass in its epilogue:
  // for l >= 2 it also stores dL/dx_l (Y.gin); for l == 1 it forms the dL/dx0 sum (two or three
  // layers) instead. False (nothing done) where the kernel declines; then the two-step path.
  bool fused_bwd(Engine& e, int64_t l, const Lin& last, const void* dz, int64_t dz_ld,
                 const std::vector<void*>& gs, void* acc) {
#if DLREC_WITH_CUTLASS
    const int64_t L = static_cast<int64_t>(layers_.size());
    if (!can_fuse_bwd(e)) return false;
    if (l == 1 && L > 3) return false;  // the kernel forms at most two deferred terms
    const cutlass_k::DgradArgs a =
        dgrad_args(e, last, dz, dz_ld, gs[l + 1], static_cast<size_t>(l - 1));
    if (l >= 2) return cutlass_k::cross_dgrad_du(a, layers_[l].gin.raw(), e.st);
    const bool three = L == 3;
    return cutlass_k::cross_dgrad_acc(a, layers_[0].u.raw(), layers_[1].u.raw(),
                                      three ? gs[3] : nullptr,
                                      three ? layers_[2].u.raw() : nullptr, acc, e.st);
#else
    (void)e, (void)l, (void)last, (void)dz, (void)dz_ld, (void)gs, (void)acc;
    return false;
#endif
  }
  // The fused forward reads x0 in place: only when it needs no copy to our row stride.
  ServingParts serving_parts(Engine&) override {
    ServingParts p;
    if (in_ld_ != ld_) return p;
    p.kind = ServingParts::Kind::Cross;
    p.rank = r_;
    for (Layer& L : layers_) {
      if (r_ > 0) {
        p.lins.push_back(&L.v);
        p.ys.push_back(L.h.raw());
      }
      p.lins.push_back(&L.w);
      p.ys.push_back(L.x.raw());
    }
    return p;
  }
  // Low rank: h = V x_l is read by the second GEMM alone (u = W h + b).
  void chainable(std::vector<std::pair<Lin*, Lin*>>& out) override {
    if (r_ > 0)
      for (auto& L : layers_) out.emplace_back(&L.v, &L.w);
  }
  void compressible(std::vector<std::pair<std::string, Lin*>>& out) override {
    for (size_t l = 0; l < layers_.size(); ++l) {
      const std::string p = name_ + "." + std::to_string(l);
      out.emplace_back(p + ".w.weight", &layers_[l].w);
      if (r_ > 0) out.emplace_back(p + ".v.weight", &layers_[l].v);
    }
  }
  void collect(Engine& e, std::vector<NamedState>& dense, std::vector<NamedState>&) override {
    for (size_t l = 0; l < layers_.size(); ++l) {
      const std::string p = name_ + "." + std::to_string(l);
      e.add_params(layers_[l].w, p + ".w.weight", p + ".w.bias", dense);
      if (r_ > 0) e.add_params(layers_[l].v, p + ".v.weight", "", dense);
    }
  }
  void refresh(Engine& e) override {
    for (auto& L : layers_) {
      e.refresh(L.w);
      if (r_ > 0) e.refresh(L.v);
    }
  }

 private:
  struct Layer {
    Lin w, v;        // w: W (full) or U (low rank); v: V (low rank)
    Tensor u, h, x;  // u = W x_l + b; h = V x_l; x = x_{l+1}
    Tensor du, dh;   // backward: dL/du, dL/dh
    Tensor gin;      // deferred, l >= 1: dL/dx_l
  };
  std::string name_;
  int64_t F_, in_ld_, ld_, r_, rld_ = 0;
  bool deferred_ = true;  // the dL/dx0 sum at layer 0 (GraphCudaOptions::cross_defer_dx0)
  bool fused_ = true;     // bf16: GEMM + combine as one kernel when built (GraphCudaOptions::cross_fused)
  bool fused_bwd_ = true;  // bf16: data GEMM + next pass in one (GraphCudaOptions::cross_fused_bwd)
  std::vector<Layer> layers_;
  Tensor x0_, acc_;
  Tensor part_;  // the fused backward's column sums per tile (bf16 with CUTLASS only)
  bool top_pass_done_ = false;  // fused_top ran the top layer's pass in this backward
  const void* x0p_ = nullptr;
};

}  // namespace

std::unique_ptr<Node> make_cross(Build& b) {
  const int64_t F = b.shape.width;
  b.set_value(F, true);
  return std::make_unique<CrossNode>(b.e, b.spec.name, F, b.ins[0]->ld, b.v.ld,
                                     b.spec.num_layers, b.spec.low_rank, b.seed);
}

}  // namespace dlrec::model::gpu_graph
