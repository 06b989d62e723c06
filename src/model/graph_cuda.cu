// The graph model on a CUDA device (include/dlrec/model/graph_cuda.h). Same layers, parameter
// names, shapes and initial values as the CPU graph model (src/model/graph_model.cc): dense
// layers are initialised on the CPU by nn::MLP / nn::CrossNet with the layer's seed and copied,
// tables are initialised on the device by the kernel that computes EmbeddingBag::init's values
// bit for bit.
//
// Values. Every layer's output is a device matrix [B, width] with rows `ld` elements apart, and
// (when a parameter lies upstream) a gradient buffer of the same shape. In bf16 precision
// outputs are bf16 except 1-wide ones (logits, kept in f32), and embedding gradients are f32
// (the table update reads them; an embedding layer written into a concat has none and reads
// the concat's, widened on load); the rows of bf16 values other than embeddings and MLP outputs
// are padded to a multiple of 8 elements (tensor-core alignment of the GEMMs that read them);
// padding is zero from allocation on and never written with anything else. A layer's
// gradient is complete once every consumer (later in the topological order) has run its
// backward: the first one writes it, the others add to it (GEMMs with beta = 1, copies that
// accumulate). Each layer applies the optimizer to its own parameters as soon as its gradients
// are known (no global-norm clipping, so the order does not matter).
//
// A step follows src/model/dlrm_cuda.cu: the batch is packed into one of two pinned slots and
// copied on a copy stream (overlapping the previous step), learning rates live in device memory,
// and from the second step of a shape on the whole step (forward, BCE, backward, updates) is one
// CUDA graph replay (DLREC_CUDA_GRAPH=0 turns that off). The embedding layer's lookup and its
// fused update run on a side stream beside the dense layers that do not depend on them. When a
// concat is the embedding layer's only consumer, the lookup writes into the concat's columns
// and the update reads its gradient from the concat's gradient (no copies; DLREC_EMB_DIRECT=0:
// off).
// bf16 GEMMs without an epilogue that overwrite their output go through cuBLASLt with the
// fastest of its candidates (DLREC_GRAPH_LT=0: cublasGemmEx); DLREC_PROFILE=1 prints the device
// time per layer and, for MLP and cross layers, per kind of work (no graphs, no side streams).
//
// The cross layer (DCNv2): forward per layer h = x_l V^T (low rank), u = h U^T + b (or x_l W^T + b)
// through cuBLASLt's bias epilogue in bf16, then x_{l+1} = x0 * u + x_l in one pass; in bf16 builds
// with CUTLASS the second GEMM and that pass are one kernel (src/fused/cross_fused.h;
// DLREC_CROSS_FUSED=0: off). Backward per layer, g = dL/dx_{l+1}: one pass writes du = g * x0 and
// sums the bias gradient; then the data GEMMs dh = du U and dL/dx_l = g + dh V (into a new buffer:
// cuBLASLt's beta = 1 with C != D). The dL/dx0 sum, sum_l g_{l+1} * u_l + g_1 (+ dh_0 V_0 by the
// last GEMM, beta = 1 in place), is formed once, by layer 0's pass, from the kept g's and u's
// (DLREC_CROSS_DEFER=0, or more than 8 layers: added layer by layer into an accumulator, each pass
// reading and writing it). It has the compute type (bf16 in bf16, as autograd's would) and is the
// input's gradient buffer itself when the cross layer is its first consumer.
//
// Weight gradients and updates (every MLP and cross layer) run on a weight stream beside the
// data-gradient chain (Engine::weights: forked after the layer's dgrad, which reads the
// weights; joined at the end of the backward pass; own cuBLAS handle and cuBLASLt workspace;
// DLREC_GRAPH_WSTREAM=0: in order on the main stream). The main stream and the embedding's side
// stream have the device's greatest priority, the weight stream the least.
//
// The fm layer (DeepFM) and the wide layer (Wide&Deep's linear part) write 1-wide f32 values
// (src/nn/graph_layers_cuda.h): fm reads its fields in the compute type, sums in f32 (the last
// sum in double, as the CPU), and writes its input's gradient in place or through an f32
// buffer; wide pools its [cardinality, 1] tables with the embedding kernels (dim 1, zero
// initial values, the fused de-duplicated update with the embedding optimizer) and updates its
// bias [1] with the dense optimizer.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/graph_cuda.h"
#include "dlrec/nn/cross.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/optimizer.h"
#include "dlrec/nn/rng.h"
#include "nn/cross_cuda.h"
#if DLREC_WITH_CUTLASS
#include "fused/cross_fused.h"
#endif
#include "nn/dense_cuda.h"
#include "nn/embedding_cuda.h"
#include "nn/graph_layers_cuda.h"
#include "nn/lt_gemm.h"
#include "model/cuda_step.h"
#include "model/graph_hashed_cuda.h"

namespace dlrec::model {
namespace {

namespace ce = nn::cuda_emb;
namespace cd = nn::cuda_dense;
namespace cg = nn::cuda_graph;
namespace lt = nn::cuda_lt;
using bf16 = cd::bf16;

using namespace cuda_step;

// The CPU graph model's default init tag: FNV-1a of the layer name (graph_model.cc).
uint64_t name_tag(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

cg::Elem elem(DType t) { return t == DType::BF16 ? cg::Elem::BF16 : cg::Elem::F32; }
cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// A layer's output and its gradient.
struct Engine;
struct Lin;
struct Value {
  int64_t width = 0, ld = 0;
  std::vector<int64_t> fields;
  DType dt = DType::F32, gdt = DType::F32;
  Tensor y, g;  // [cap, ld]
  bool need_grad = false;
  bool has_grad = false;  // during backward: some consumer wrote g
  int consumers = 0;      // inputs of other layers that name this value
  // Set by the producer: a consumer whose backward forms g with one data GEMM, g = dz W (dz rows
  // dz_ld apart, W the Lin's weights; nothing accumulated), offers it here first; true: the
  // producer ran it (g written) with its own backward's first pass fused in.
  std::function<bool(Engine&, const Lin&, const void* dz, int64_t dz_ld)> fused_dgrad;
};

// y [B, out] = x [B, in] W^T (+ b, ReLU): the master weights w [out, in] (f32), their gradient
// dw [out, in_pad], optional Adagrad state, and in bf16 the compute copies wh [out, in_pad],
// bh [out]. `in_pad` is the row stride of the input (its producer's ld); the padding columns of
// wh and dw are zero.
struct Lin {
  int64_t in = 0, in_pad = 0, out = 0, out_ld = 0;
  bool has_bias = true, relu = false;
  Tensor w, b, dw, db, sw, sb, wh, bh;
  // bf16 ReLU layers: the ReLU bit mask cuBLASLt's epilogue writes (read by the MLP backward
  // only with DLREC_MLP_MASK_BITS=1: the bits are not exactly y > 0, see MlpNode)
  Tensor aux;
  int64_t aux_ld = 0;
  bool aux_written = false;  // the last forward wrote aux (cuBLASLt ran the RELU_AUX epilogue)
  const void* x = nullptr;  // input of the last forward
};

struct NamedState {
  std::string name;
  Tensor value, state;  // state undefined without one
};

// What every layer shares: streams, handles, precision, the step's inputs and rows.
struct Engine {
  Device dev;
  Precision prec = Precision::FP32;
  bool lowp = false;  // bf16 precision
  DType act = DType::F32;
  cudaStream_t st = nullptr;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<lt::Lt> lt;
  int sms = 0;  // SM count target of cuBLASLt GEMMs on st (0: all)
  // The weight-gradient stream: weights() runs a layer's weight gradients and update there,
  // beside the data-gradient chain on st (own cuBLAS handle and cuBLASLt workspace; null: off).
  cudaStream_t wst = nullptr;
  cublasHandle_t wblas = nullptr;
  std::unique_ptr<lt::Lt> wlt;
  int wsms = 0;
  cudaEvent_t wfork = nullptr, wjoin = nullptr;
  bool w_pending = false;
  bool use_lt = true;  // DLREC_GRAPH_LT=0: plain cublasGemmEx for epilogue-free bf16 GEMMs
  // DLREC_PROFILE=1: records a named event on st (sub-phases of a layer); null otherwise.
  std::function<void(const std::string&)> mark;
  bool dense_adagrad = false, emb_adagrad = false;
  float eps = 1e-8f, init_acc = 0.f, emb_eps = 1e-8f, emb_init_acc = 0.f;
  std::vector<Value> vals;
  Tensor partial;  // bias-gradient partial sums [chunks, max_cols]
  // The current step.
  int64_t B = 0, nnz = 0;
  const float* lr = nullptr;  // device [2]: dense, embedding
  const float* dense = nullptr;
  const int32_t* offsets = nullptr;
  const uint32_t* keys = nullptr;

  Tensor buf(Shape s, DType t) {
    Tensor x = Tensor::empty(std::move(s), t, dev);
    if (x.nbytes()) DLREC_CUDA_CHECK(cudaMemsetAsync(x.raw(), 0, x.nbytes(), st));
    return x;
  }
  cudaDataType_t ab_type() const { return lowp ? CUDA_R_16BF : CUDA_R_32F; }

  // Column-major D [m, n] = op(A) op(B) (+ D when accumulate); A and B of the compute type.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
            const void* Bm, int64_t ldb, void* D, DType dt, int64_t ldd, bool accumulate) {
    if (m == 0 || n == 0) return;
    if (lt && !accumulate && use_lt) {
      // bf16 GEMMs that overwrite D: cuBLASLt, the fastest of its candidates timed on first use.
      lt::Gemm g = lt::Gemm::shape(ta, tb, m, n, k, lda, ldb, ldd);
      g.d_type = cuda_type(dt);
      g.sm_target = sms;
      if (lt->run(g, A, Bm, D, nullptr, nullptr, st)) return;
    }
    const float one = 1.f, zero = 0.f;
    const cublasComputeType_t ct =
        prec == Precision::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DLREC_CUBLAS_CHECK(cublasGemmEx(
        blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, A, ab_type(),
        static_cast<int>(lda), Bm, ab_type(), static_cast<int>(ldb), accumulate ? &one : &zero,
        D, cuda_type(dt), static_cast<int>(ldd), ct, CUBLAS_GEMM_DEFAULT));
  }

  // D = op(A) op(B) + C with C != D of D's type and layout: cuBLASLt's beta = 1 with a separate
  // C in bf16, else a copy of C into D and an accumulating GEMM (the same sums).
  void gemm_c(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
              const void* Bm, int64_t ldb, const void* C, void* D, DType dt, int64_t ldd) {
    if (m == 0 || n == 0) return;
    if (lt && use_lt) {
      lt::Gemm g = lt::Gemm::shape(ta, tb, m, n, k, lda, ldb, ldd);
      g.d_type = cuda_type(dt);
      g.accumulate_c = true;
      g.sm_target = sms;
      if (lt->run(g, A, Bm, D, nullptr, nullptr, st, C)) return;
    }
    // Column-major [m, n] with leading dimension ldd: n rows of m elements, ldd apart.
    cg::copy_cols(C, elem(dt), ldd, 0, D, elem(dt), ldd, 0, n, m, false, st);
    gemm(ta, tb, m, n, k, A, lda, Bm, ldb, D, dt, ldd, true);
  }

  // Runs f (a layer's weight gradients and update) on the weight stream, after everything
  // enqueued on st so far; joined back by join_weights(). Without that stream: f() on st.
  template <class F>
  void weights(F&& f) {
    if (!wst) {
      f();
      return;
    }
    DLREC_CUDA_CHECK(cudaEventRecord(wfork, st));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(wst, wfork, 0));
    auto swap_all = [&] {
      std::swap(st, wst);
      std::swap(blas, wblas);
      std::swap(lt, wlt);
      std::swap(sms, wsms);
    };
    swap_all();
    try {
      f();
    } catch (...) {
      swap_all();
      throw;
    }
    swap_all();
    w_pending = true;
  }
  // st waits for the weight stream's work (end of the backward pass).
  void join_weights() {
    if (!w_pending) return;
    DLREC_CUDA_CHECK(cudaEventRecord(wjoin, wst));
    DLREC_CUDA_CHECK(cudaStreamWaitEvent(st, wjoin, 0));
    w_pending = false;
  }
  void sub(const std::string& what) {
    if (mark) mark(what);
  }

  const void* wcomp(const Lin& l) const { return lowp ? l.wh.raw() : l.w.raw(); }

  // y [B, out] (rows out_ld apart, type ydt) = x W^T + b, ReLU when l.relu.
  void lin_forward(Lin& l, const void* x, void* y, DType ydt) {
    l.x = x;
    l.aux_written = false;
    if (B == 0) return;
    if (lowp && l.has_bias) {
      lt::Gemm g = lt::Gemm::shape(true, false, l.out, B, l.in_pad, l.in_pad, l.in_pad, l.out_ld);
      g.d_type = cuda_type(ydt);
      g.epi = l.relu ? lt::Epi::ReluAuxBias : lt::Epi::Bias;
      g.aux_ld = l.aux_ld;
      void* bias = ydt == DType::F32 ? l.b.raw() : l.bh.raw();
      if (lt->run(g, l.wh.raw(), x, y, bias, l.relu ? l.aux.raw() : nullptr, st)) {
        l.aux_written = l.relu;
        return;
      }
    }
    gemm(true, false, l.out, B, l.in_pad, wcomp(l), l.in_pad, x, l.in_pad, y, ydt, l.out_ld,
         false);
    if (!l.has_bias) return;
    if (ydt == DType::F32) {
      if (l.out_ld == l.out) cd::bias_act(static_cast<float*>(y), l.b.data<float>(), B, l.out,
                                          l.relu, st);
      else cg::bias_act_strided(static_cast<float*>(y), l.b.data<float>(), B, l.out, l.out_ld,
                                l.relu, st);
    } else {
      cg::bias_act_strided(static_cast<bf16*>(y), static_cast<const bf16*>(l.bh.raw()), B, l.out,
                           l.out_ld, l.relu, st);
    }
  }
  // dw [out, in_pad] = dz^T x, dz [B, out] rows dz_ld apart (compute type).
  void lin_wgrad(Lin& l, const void* dz, int64_t dz_ld) {
    gemm(false, true, l.in_pad, l.out, B, l.x, l.in_pad, dz, dz_ld, l.dw.raw(), DType::F32,
         l.in_pad, false);
  }
  // dst [B, in_pad] (+)= dz W.
  void lin_dgrad(Lin& l, const void* dz, int64_t dz_ld, void* dst, DType dt, int64_t dst_ld,
                 bool accumulate) {
    gemm(false, false, l.in_pad, B, l.out, wcomp(l), l.in_pad, dz, dz_ld, dst, dt, dst_ld,
         accumulate);
  }
  void lin_update(Lin& l) {
    cd::optimizer_step(l.w.data<float>(), l.dw.data<float>(),
                       dense_adagrad ? l.sw.data<float>() : nullptr, l.out, l.in, l.in_pad,
                       lowp ? static_cast<bf16*>(l.wh.raw()) : nullptr, l.in_pad, lr, eps, st);
    if (l.has_bias)
      cd::optimizer_step(l.b.data<float>(), l.db.data<float>(),
                         dense_adagrad ? l.sb.data<float>() : nullptr, 1, l.out, l.out,
                         lowp ? static_cast<bf16*>(l.bh.raw()) : nullptr, l.out, lr, eps, st);
  }
  void refresh(Lin& l) {
    if (!lowp) return;
    cd::to_half_padded(l.w.data<float>(), l.out, l.in, static_cast<bf16*>(l.wh.raw()), l.in_pad,
                       st);
    if (l.has_bias)
      cd::to_half_padded(l.b.data<float>(), 1, l.out, static_cast<bf16*>(l.bh.raw()), l.out, st);
  }
  // Builds the device copy of a CPU nn::Linear (its values, zeroed gradients and state).
  Lin make_lin(nn::Linear& cpu, int64_t in_pad, int64_t out_ld, bool has_bias, bool relu) {
    Lin l;
    l.in = cpu.in_features();
    l.out = cpu.out_features();
    l.in_pad = in_pad;
    l.out_ld = out_ld;
    l.has_bias = has_bias;
    l.relu = relu;
    l.w = cpu.weight().value.to(dev);
    l.dw = buf({l.out, l.in_pad}, DType::F32);
    if (dense_adagrad) {
      l.sw = Tensor::empty({l.out, l.in}, DType::F32, dev);
      ce::fill(l.sw.data<float>(), l.sw.numel(), init_acc, st);
    }
    if (has_bias) {
      l.b = cpu.bias().value.to(dev);
      l.db = buf({l.out}, DType::F32);
      if (dense_adagrad) {
        l.sb = Tensor::empty({l.out}, DType::F32, dev);
        ce::fill(l.sb.data<float>(), l.sb.numel(), init_acc, st);
      }
    }
    if (lowp) {
      l.wh = buf({l.out, l.in_pad}, DType::BF16);
      if (has_bias) l.bh = buf({l.out}, DType::BF16);
      l.aux_ld = round_up(l.out, 128);
    }
    refresh(l);
    return l;
  }
  void add_params(Lin& l, const std::string& wname, const std::string& bname,
                  std::vector<NamedState>& out) {
    out.push_back({wname, l.w, l.sw});
    if (l.has_bias) out.push_back({bname, l.b, l.sb});
  }

  // Value j's gradient columns [dst_col, dst_col + cols) (+)= src columns from src_col.
  void deliver(int j, const void* src, DType sdt, int64_t src_ld, int64_t src_col,
               int64_t dst_col, int64_t cols, bool accumulate) {
    Value& v = vals[j];
    cg::copy_cols(src, elem(sdt), src_ld, src_col, v.g.raw(), elem(v.gdt), v.ld, dst_col, B,
                  cols, accumulate, st);
  }
  // Marks j's gradient as written; true when an earlier consumer wrote it (then add to it).
  bool claim(int j) {
    const bool acc = vals[j].has_grad;
    vals[j].has_grad = true;
    return acc;
  }
};

class Node {
 public:
  virtual ~Node() = default;
  // Allocates the activations for `cap` rows (the value's y and g included, unless noted).
  virtual void alloc(Engine& e, int64_t cap) = 0;
  virtual void forward(Engine& e) = 0;
  virtual void backward(Engine& e) = 0;
  virtual void collect(Engine&, std::vector<NamedState>&, std::vector<NamedState>&) {}
  virtual void refresh(Engine&) {}
  // Scratch sized by the batch's number of ids (table layers).
  virtual void alloc_scratch(Engine&, int64_t /*max_nnz*/) {}
  int self = -1;
  std::vector<int> in;
  // The value's own buffers.
  void alloc_value(Engine& e, int64_t cap) {
    Value& v = e.vals[self];
    v.y = e.buf({cap, v.ld}, v.dt);
    if (v.need_grad) v.g = e.buf({cap, v.ld}, v.gdt);
  }
};

class DenseNode final : public Node {
 public:
  void alloc(Engine& e, int64_t cap) override { alloc_value(e, cap); }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    if (v.dt == DType::BF16)
      cd::to_half_padded(e.dense, e.B, v.width, static_cast<bf16*>(v.y.raw()), v.ld, e.st);
    else
      cg::copy_cols(e.dense, cg::Elem::F32, v.width, 0, v.y.raw(), cg::Elem::F32, v.ld, 0, e.B,
                    v.width, false, e.st);
  }
  void backward(Engine&) override {}
};

// Device tables of one width over all categorical features (table t: [cardinality_t, dim]),
// with the pointer arrays the embedding kernels read (nn/embedding_cuda.h), optional Adagrad
// accumulators and the backward's scratch. Rows are initialised like EmbeddingBag::init
// (uniform, a = sqrt(1 / rows), seed derived per table) or zero (the wide layer's tables).
// Hashed tables (`capacities` given) have capacity_t rows, zero with zero state until a key is
// inserted (graph_hashed_cuda.h initialises a row then).
struct TableSet {
  std::vector<Tensor> tables, states;
  std::vector<uint32_t> row_base;
  int key_bits = 1;
  int64_t dim = 0;
  Tensor ptrs, sptrs, base, scratch_mem;
  ce::Tables tab;
  ce::Scratch scratch;

  TableSet(Engine& e, const io::ShardLayout& layout, int64_t d, bool zero, uint64_t seed,
           const std::vector<int64_t>& capacities = {})
      : dim(d) {
    const int64_t T = static_cast<int64_t>(layout.cardinalities.size());
    const bool hashed = !capacities.empty();
    if (hashed) zero = true;
    uint64_t total = 0;
    std::vector<float*> wp, sp;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t rows = hashed ? capacities[t] : layout.cardinalities[t];
      row_base.push_back(static_cast<uint32_t>(total));
      total += static_cast<uint64_t>(rows);
      DLREC_CHECK(total < (uint64_t{1} << 32), "key 'features': more than 2^32 rows in all "
                  "tables of a layer together are not supported on CUDA");
      Tensor w;
      if (zero) {
        w = e.buf({rows, dim}, DType::F32);
      } else {
        w = Tensor::empty({rows, dim}, DType::F32, e.dev);
        ce::init_uniform(w.data<float>(), w.numel(),
                         nn::derive_seed(seed, static_cast<uint64_t>(t)),
                         std::sqrt(1.0 / static_cast<double>(rows)), e.st);
      }
      wp.push_back(w.data<float>());
      tables.push_back(w);
      if (e.emb_adagrad) {
        Tensor s = hashed ? e.buf({rows, dim}, DType::F32)
                          : Tensor::empty({rows, dim}, DType::F32, e.dev);
        if (!hashed) ce::fill(s.data<float>(), s.numel(), e.emb_init_acc, e.st);
        sp.push_back(s.data<float>());
        states.push_back(s);
      }
    }
    while (key_bits < 32 && (uint64_t{1} << key_bits) < total) ++key_bits;
    auto upload = [&](const void* src, size_t bytes) {
      Tensor t = Tensor::empty({static_cast<int64_t>(bytes ? bytes : 1)}, DType::U8, e.dev);
      if (bytes) copy_bytes(t.raw(), e.dev, src, Device::cpu(), bytes);
      return t;
    };
    ptrs = upload(wp.data(), wp.size() * sizeof(float*));
    sptrs = upload(sp.data(), sp.size() * sizeof(float*));
    base = upload(row_base.data(), row_base.size() * sizeof(uint32_t));
    tab.weights = static_cast<float* const*>(ptrs.raw());
    tab.states = e.emb_adagrad ? static_cast<float* const*>(sptrs.raw()) : nullptr;
    tab.row_base = static_cast<const uint32_t*>(base.raw());
    tab.num_tables = static_cast<int>(T);
    tab.dim = static_cast<int>(dim);
  }
  void alloc_scratch(Engine& e, int64_t max_nnz) {
    const size_t sb = ce::scratch_bytes(max_nnz, key_bits, static_cast<int>(dim));
    scratch_mem = Tensor::empty({static_cast<int64_t>(sb)}, DType::U8, e.dev);
    scratch = ce::carve(scratch_mem.raw(), max_nnz, key_bits, static_cast<int>(dim));
    ce::prepare(scratch, e.st);
  }
  // The fused de-duplicated update from dL/dpooled [B, T, dim] (f32), embedding optimizer.
  void update(Engine& e, bool mean, const float* dpooled) {
    ce::backward_update(tab, e.offsets, e.keys, e.B, e.nnz, mean, dpooled,
                        e.emb_adagrad ? ce::Update::Adagrad : ce::Update::SGD, e.lr + 1,
                        e.emb_eps, key_bits, scratch, e.st);
  }
  // The same in two halves: the id work of the step's batch (sort by row, runs), then the
  // update from dL/dpooled (f32 or bf16, rows ld apart).
  void ids(Engine& e) { ce::backward_ids(tab, e.offsets, e.keys, e.B, e.nnz, key_bits, scratch, e.st); }
  template <class G>
  void apply(Engine& e, bool mean, const G* dpooled, int64_t ld) {
    ce::backward_apply(tab, e.offsets, e.B, e.nnz, mean, dpooled, ld,
                       e.emb_adagrad ? ce::Update::Adagrad : ce::Update::SGD, e.lr + 1,
                       e.emb_eps, scratch, e.st);
  }
  void collect(const std::string& name, std::vector<NamedState>& out) {
    for (size_t t = 0; t < tables.size(); ++t)
      out.push_back({name + "." + std::to_string(t) + ".weight", tables[t],
                     states.empty() ? Tensor() : states[t]});
  }
};

// The embedding layer. Hashed (`hashed` non-empty: one table's options per feature): before
// the pooling, the batch's keys are resolved to rows on the device (graph_hashed_cuda.h), which
// overwrites the step's row array; an evaluation forward pools with keys no table holds as zeros.
//
// Direct (write_into(): a concat is its only consumer, see GraphCuda::plan_direct_embedding):
// the pooled rows are written straight into the concat's columns [col, col + T * dim) (its
// row stride and type), and the backward reads its gradient from the same columns of the
// concat's gradient (bf16 widened on load), so the layer has no buffers of its own and the
// concat neither copies nor splits it.
class EmbeddingNode final : public Node {
 public:
  EmbeddingNode(Engine& e, const std::string& name, const io::ShardLayout& layout, int64_t dim,
                bool mean, uint64_t seed, std::vector<hashed_cuda::TableOptions> hashed = {})
      : name_(name), mean_(mean), ts_(e, layout, dim, false, seed, capacities(hashed)) {
    if (hashed.empty()) return;
    hashed_ = std::make_unique<hashed_cuda::HashedTables>(std::move(hashed), dim, e.emb_adagrad,
                                                          e.emb_init_acc, e.dev, e.st);
    hashed_->bind(ts_.tab);
  }
  void alloc(Engine& e, int64_t cap) override {
    if (into_ < 0) alloc_value(e, cap);
  }
  void alloc_scratch(Engine& e, int64_t max_nnz) override {
    ts_.alloc_scratch(e, max_nnz);
    if (hashed_) hashed_->alloc(max_nnz);
  }
  void write_into(int into, int64_t col) {
    into_ = into;
    col_ = col;
  }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    if (hashed_) {
      // The step's row array belongs to this step's inputs; only table layers read it, and a
      // hashed embedding layer is the only one (the constructor refuses a wide layer beside it).
      uint32_t* rows = const_cast<uint32_t*>(e.keys);
      hashed_->resolve(e.offsets, rows, e.B, e.nnz, e.st);
      if (!hashed_->training()) {
        if (v.dt == DType::BF16)
          hashed_->pool_eval(e.offsets, rows, e.B, mean_, static_cast<bf16*>(v.y.raw()), e.st);
        else
          hashed_->pool_eval(e.offsets, rows, e.B, mean_, v.y.data<float>(), e.st);
        return;
      }
    }
    // Direct: the concat's columns (same type: checked by the plan), else our own rows.
    const Value& o = into_ >= 0 ? e.vals[into_] : v;
    const int64_t col = into_ >= 0 ? col_ : 0;
    if (o.dt == DType::BF16)
      ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, static_cast<bf16*>(o.y.raw()) + col,
                  e.st, o.ld);
    else
      ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, o.y.data<float>() + col, e.st, o.ld);
  }
  void backward(Engine& e) override {
    ts_.ids(e);
    if (into_ < 0) {
      ts_.apply(e, mean_, e.vals[self].g.data<float>(), e.vals[self].ld);
      return;
    }
    const Value& c = e.vals[into_];
    if (c.gdt == DType::BF16)
      ts_.apply(e, mean_, static_cast<const bf16*>(c.g.raw()) + col_, c.ld);
    else
      ts_.apply(e, mean_, c.g.data<float>() + col_, c.ld);
  }
  void collect(Engine&, std::vector<NamedState>&, std::vector<NamedState>& tables) override {
    ts_.collect(name_, tables);
  }
  const std::vector<uint32_t>& row_base() const { return ts_.row_base; }
  hashed_cuda::HashedTables* hashed() const { return hashed_.get(); }
  const std::string& name() const { return name_; }

 private:
  static std::vector<int64_t> capacities(const std::vector<hashed_cuda::TableOptions>& h) {
    std::vector<int64_t> c;
    for (const auto& o : h) c.push_back(o.capacity);
    return c;
  }
  std::string name_;
  bool mean_;
  TableSet ts_;
  std::unique_ptr<hashed_cuda::HashedTables> hashed_;
  int into_ = -1;    // direct: the concat value written into (else -1)
  int64_t col_ = 0;  // and the first of its columns
};

// Wide & Deep's linear part over the one-hot categorical features (nn::WideLinear):
// y = b + sum_t w_t[ids of feature t] (pooled), tables [cardinality_t, 1] zero-initialised and
// updated by the embedding optimizer (the fused table update, dim 1), the bias [1] (zero) by
// the dense one. Forward pools the parts [B, T] (f32) and sums them in the CPU's order;
// backward broadcasts dL/dy to every part and sums it for the bias.
class WideNode final : public Node {
 public:
  WideNode(Engine& e, const std::string& name, const io::ShardLayout& layout, bool mean)
      : name_(name), mean_(mean), T_(static_cast<int>(layout.cardinalities.size())),
        ts_(e, layout, 1, true, 0) {
    b_ = e.buf({1}, DType::F32);
    db_ = e.buf({1}, DType::F32);
    if (e.dense_adagrad) {
      sb_ = Tensor::empty({1}, DType::F32, e.dev);
      ce::fill(sb_.data<float>(), 1, e.init_acc, e.st);
    }
  }
  void alloc(Engine& e, int64_t cap) override {
    alloc_value(e, cap);
    parts_ = e.buf({cap, T_}, DType::F32);
    if (e.vals[self].need_grad) dparts_ = e.buf({cap, T_}, DType::F32);
  }
  void alloc_scratch(Engine& e, int64_t max_nnz) override { ts_.alloc_scratch(e, max_nnz); }
  void forward(Engine& e) override {
    ce::forward(ts_.tab, e.offsets, e.keys, e.B, mean_, parts_.data<float>(), e.st);
    cg::wide_sum(parts_.data<float>(), b_.data<float>(), e.B, T_, e.vals[self].y.data<float>(),
                 e.st);
  }
  void backward(Engine& e) override {
    const float* dy = e.vals[self].g.data<float>();
    cd::mask_bias_grad(dy, nullptr, nullptr, e.partial.data<float>(), db_.data<float>(), e.B, 1,
                       e.st);
    cg::wide_broadcast(dy, e.B, T_, dparts_.data<float>(), e.st);
    ts_.update(e, mean_, dparts_.data<float>());
    cd::optimizer_step(b_.data<float>(), db_.data<float>(),
                       e.dense_adagrad ? sb_.data<float>() : nullptr, 1, 1, 1,
                       static_cast<bf16*>(nullptr), 1, e.lr, e.eps, e.st);
  }
  void collect(Engine&, std::vector<NamedState>& dense, std::vector<NamedState>& tables) override {
    dense.push_back({name_ + ".bias", b_, sb_});
    ts_.collect(name_, tables);
  }
  const std::vector<uint32_t>& row_base() const { return ts_.row_base; }

 private:
  std::string name_;
  bool mean_;
  int T_;
  TableSet ts_;
  Tensor b_, db_, sb_, parts_, dparts_;
};

// An MLP: per layer y = x W^T + b (+ ReLU), in bf16 one cuBLASLt GEMM with the bias (+ ReLU)
// epilogue, whose ReLU layers also write the ReLU bit mask (Lin::aux). Backward per layer: one
// pass masks dL/dy by y > 0 and sums the bias gradient (cd::mask_bias_grad); then the input
// gradient (dgrad) on the main stream and the weight gradient and update on the weight stream.
// DLREC_MLP_MASK_BITS=1 (bf16, off by default): the pass reads the forward's bit mask instead of
// y (cd::mask_bias_grad_bits: 1 bit per element instead of 16; DCNv2 on an H100: -0.12 ms per
// step). cuBLASLt sets the bit where the pre-activation is >= 0 in its own precision, so it
// differs from y > 0 where that is exactly 0 (the gradient passes there) and, with some of its
// algorithms, where a tiny pre-activation and the rounded y disagree: not bit-identical to the
// default, hence off.
class MlpNode final : public Node {
 public:
  MlpNode(Engine& e, const std::string& name, int64_t in_width, int64_t in_ld,
          const std::vector<int64_t>& sizes, bool relu_last, uint64_t seed)
      : name_(name) {
    const char* bits = std::getenv("DLREC_MLP_MASK_BITS");
    mask_bits_ = bits && bits[0] == '1';
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
        if (e.act == DType::BF16) {  // a 1-wide f32 output in bf16 precision
          cd::to_half_padded(static_cast<const float*>(dzc), e.B, l.out,
                             static_cast<bf16*>(dzh_.raw()), l.out, e.st);
          dzc = dzh_.raw();
        }
      } else if (l.relu && l.aux_written && mask_bits_) {
        // The ReLU mask from the forward's bit mask (opt-in, see above).
        cd::mask_bias_grad_bits(static_cast<const bf16*>(dy),
                                static_cast<const uint8_t*>(l.aux.raw()), l.aux_ld,
                                static_cast<bf16*>(dz), e.partial.data<float>(),
                                l.db.data<float>(), e.B, l.out, e.st);
        dzc = dz;
      } else {
        cd::mask_bias_grad(static_cast<const bf16*>(dy), l.relu ? static_cast<const bf16*>(y)
                                                                : nullptr,
                           static_cast<bf16*>(dz), e.partial.data<float>(), l.db.data<float>(),
                           e.B, l.out, e.st);
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
        if (acc || !x.fused_dgrad || !x.fused_dgrad(e, l, dzc, l.out))
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

 private:
  std::string name_;
  std::vector<Lin> layers_;
  std::vector<Tensor> ys_, gys_, dzs_;
  Tensor dzh_;
  bool mask_bits_ = false;  // DLREC_MLP_MASK_BITS=1: the ReLU mask from Lin::aux (see above)
};

class CrossNode final : public Node {
 public:
  CrossNode(Engine& e, const std::string& name, int64_t F, int64_t in_ld, int64_t ld,
            int64_t layers, int64_t rank, uint64_t seed)
      : name_(name), F_(F), in_ld_(in_ld), ld_(ld), r_(rank) {
    nn::CrossNet cpu(F, layers, rank);
    cpu.init(seed);
    auto params = cpu.params();
    const char* defer = std::getenv("DLREC_CROSS_DEFER");
    deferred_ = layers - 1 <= cg::kMaxCrossTerms && !(defer && defer[0] == '0');
    const char* fused = std::getenv("DLREC_CROSS_FUSED");
    fused_ = !(fused && fused[0] == '0');
    const char* fused_bwd = std::getenv("DLREC_CROSS_FUSED_BWD");
    fused_bwd_ = fused_ && !(fused_bwd && fused_bwd[0] == '0');
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
      if (e.lowp && fused_ && e.B > 0 &&
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
        cg::cross_combine(static_cast<const bf16*>(x0), static_cast<const bf16*>(L.u.raw()),
                          static_cast<const bf16*>(xl), static_cast<bf16*>(L.x.raw()), e.B, F_,
                          ld_, e.st);
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
          cg::cross_backward_deferred(static_cast<const bf16*>(g),
                                      static_cast<const bf16*>(x0p_),
                                      static_cast<const bf16*>(Y.u.raw()),
                                      static_cast<bf16*>(Y.du.raw()), static_cast<bf16*>(a),
                                      terms, e.partial.data<float>(), Y.w.db.data<float>(), e.B,
                                      F_, ld_, l == 0, e.st);
        else
          cg::cross_backward_deferred(static_cast<const float*>(g),
                                      static_cast<const float*>(x0p_), Y.u.data<float>(),
                                      Y.du.data<float>(), static_cast<float*>(a), terms,
                                      e.partial.data<float>(), Y.w.db.data<float>(), e.B, F_,
                                      ld_, l == 0, e.st);
      } else if (e.lowp) {
        cg::cross_backward(static_cast<const bf16*>(g), static_cast<const bf16*>(x0p_),
                           static_cast<const bf16*>(Y.u.raw()), static_cast<bf16*>(Y.du.raw()),
                           static_cast<bf16*>(acc), e.partial.data<float>(), Y.w.db.data<float>(),
                           e.B, F_, ld_, l == L - 1, l == 0, e.st);
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
        e.gemm_c(false, false, last.in_pad, e.B, last.out, e.wcomp(last), last.in_pad, dz,
                 dz_ld, g, dst, e.act, ld_);
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
    return e.lowp && fused_bwd_ && deferred_ && r_ > 0 && ld_ == F_ && e.B > 0 &&
           part_.raw() != nullptr;
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
  bool deferred_ = true;  // the dL/dx0 sum at layer 0 (DLREC_CROSS_DEFER=0: per layer)
  bool fused_ = true;     // bf16: GEMM + combine as one kernel when built (DLREC_CROSS_FUSED=0: off)
  bool fused_bwd_ = true;  // bf16: data GEMM + next pass in one (DLREC_CROSS_FUSED_BWD=0: off)
  std::vector<Layer> layers_;
  Tensor x0_, acc_;
  Tensor part_;  // the fused backward's column sums per tile (bf16 with CUTLASS only)
  bool top_pass_done_ = false;  // fused_top ran the top layer's pass in this backward
  const void* x0p_ = nullptr;
};

// Concatenates its inputs' columns. An input that writes its columns itself (`direct`, the
// embedding layer in direct mode) is neither copied forward nor handed its gradient backward
// (it reads it from ours); it is only marked as having one.
class ConcatNode final : public Node {
 public:
  int direct = -1;  // the input value that writes into our columns itself
  void alloc(Engine& e, int64_t cap) override { alloc_value(e, cap); }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    int64_t c = 0;
    for (int j : in) {
      const Value& x = e.vals[j];
      if (j == direct) {
        c += x.width;
        continue;
      }
      cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, 0, v.y.raw(), elem(v.dt), v.ld, c, e.B, x.width,
                    false, e.st);
      c += x.width;
    }
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    int64_t c = 0;
    for (int j : in) {
      const int64_t w = e.vals[j].width;
      if (e.vals[j].need_grad) {
        const bool acc = e.claim(j);
        if (j != direct) e.deliver(j, v.g.raw(), v.gdt, v.ld, c, 0, w, acc);
      }
      c += w;
    }
  }
};

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
    if (e.vals[self].need_grad) {
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
      cd::dot_forward(static_cast<const bf16*>(a), static_cast<const bf16*>(b), e.B, T, d,
                      static_cast<bf16*>(v.y.raw()), v.ld, e.st);
    else
      cd::dot_forward(static_cast<const float*>(a), static_cast<const float*>(b), e.B, T, d,
                      v.y.data<float>(), v.ld, e.st);
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    const int T = static_cast<int>(n_ - 1), d = static_cast<int>(d_);
    if (e.lowp)
      cd::dot_backward(static_cast<const bf16*>(a_), static_cast<const bf16*>(b_),
                       static_cast<const bf16*>(v.g.raw()), v.ld, e.B, T, d, false,
                       static_cast<bf16*>(dfirst_.raw()), drest_.data<float>(), e.st);
    else
      cd::dot_backward(static_cast<const float*>(a_), static_cast<const float*>(b_),
                       v.g.data<float>(), v.ld, e.B, T, d, false, dfirst_.data<float>(),
                       drest_.data<float>(), e.st);
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

 private:
  int64_t n_, d_;
  bool direct_ = false;
  Tensor first_, rest_, dfirst_, drest_;
  const void* a_ = nullptr;
  const void* b_ = nullptr;
};

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
    if (input_type(e) == DType::BF16)
      cg::fm_forward(static_cast<const bf16*>(x), n_ * d_, e.B, ni(), di(), y, e.st);
    else
      cg::fm_forward(static_cast<const float*>(x), n_ * d_, e.B, ni(), di(), y, e.st);
  }
  void backward(Engine& e) override {
    const float* dy = e.vals[self].g.data<float>();
    if (direct_) {
      Value& x = e.vals[in[0]];
      if (!x.need_grad) return;
      const bool acc = e.claim(in[0]);
      if (x.gdt == DType::BF16) grad(e, static_cast<bf16*>(x.g.raw()), x.ld, acc, dy);
      else grad(e, x.g.data<float>(), x.ld, acc, dy);
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

 private:
  int ni() const { return static_cast<int>(n_); }
  int di() const { return static_cast<int>(d_); }
  const void* input(Engine& e) const { return direct_ ? e.vals[in[0]].y.raw() : x_.raw(); }
  DType input_type(Engine& e) const { return direct_ ? e.vals[in[0]].dt : e.act; }
  template <class D>
  void grad(Engine& e, D* dst, int64_t ld, bool acc, const float* dy) {
    const void* x = input(e);
    if (input_type(e) == DType::BF16)
      cg::fm_backward(static_cast<const bf16*>(x), n_ * d_, dy, e.B, ni(), di(), dst, ld, acc,
                      e.st);
    else
      cg::fm_backward(static_cast<const float*>(x), n_ * d_, dy, e.B, ni(), di(), dst, ld, acc,
                      e.st);
  }
  int64_t n_, d_;
  bool direct_ = false;
  Tensor x_, dx_;
};

class AddNode final : public Node {
 public:
  void alloc(Engine& e, int64_t cap) override { alloc_value(e, cap); }
  void forward(Engine& e) override {
    Value& v = e.vals[self];
    for (size_t i = 0; i < in.size(); ++i) {
      const Value& x = e.vals[in[i]];
      cg::copy_cols(x.y.raw(), elem(x.dt), x.ld, 0, v.y.raw(), elem(v.dt), v.ld, 0, e.B, v.width,
                    i > 0, e.st);
    }
  }
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    for (int j : in) {
      if (!e.vals[j].need_grad) continue;
      const bool acc = e.claim(j);
      e.deliver(j, v.g.raw(), v.gdt, v.ld, 0, 0, v.width, acc);
    }
  }
};

// The logit: the input's value itself (1 wide, f32); its gradient is the model's dlogits.
class OutputNode final : public Node {
 public:
  void alloc(Engine&, int64_t) override {}
  void forward(Engine&) override {}
  void backward(Engine& e) override {
    Value& v = e.vals[self];
    if (!e.vals[in[0]].need_grad) return;
    const bool acc = e.claim(in[0]);
    e.deliver(in[0], v.g.raw(), DType::F32, 1, 0, 0, 1, acc);
  }
};

class GraphCuda final : public CudaModel {
 public:
  GraphCuda(const ModelConfig& mc, const OptimizerConfig& oc, const io::ShardLayout& layout,
            Device device, uint64_t seed, const std::string& precision);
  ~GraphCuda() override;
  Tensor forward(const io::Batch& batch, bool training) override;
  void backward_and_update(const Tensor& dlogits, double lr_scale) override;
  std::vector<NamedTensor> parameters() override;
  std::vector<NamedTensor> optimizer_state() override;
  Device device() const override { return dev_; }
  double train_step(const io::Batch& batch, double lr_scale, bool want_loss) override;
  void synchronize() override;
  // Serving (CudaModel::predict where the base declares it): sigmoid of the logits, eagerly.
  void predict(const io::Batch& batch, float* probs) {
    const std::vector<float> z = forward(batch, false).to_vector<float>();
    for (size_t i = 0; i < z.size(); ++i) {
      const double x = z[i];
      probs[i] = static_cast<float>(x >= 0 ? 1.0 / (1.0 + std::exp(-x))
                                           : std::exp(x) / (1.0 + std::exp(x)));
    }
  }

 private:
  std::unique_ptr<Node> make_node(const LayerSpec& s, int idx, uint64_t seed);
  void check_batch(const io::Batch& b) const;
  void ensure_capacity(int64_t B, int64_t nnz);
  // `training`: hashed tables insert the batch's keys (evaluation only looks them up).
  void upload(const io::Batch& b, float lr, float emb_lr, bool training);
  void bind_slot();
  void run_forward();
  void run_backward();
  void on_side(int i, bool fwd);
  void step_body();
  void plan_direct_embedding();
  void refresh_shadows();
  void drop_graphs();
  void report_hashed(hashed_cuda::HashedTables& h);
  int64_t hashed_reported_lookups_ = 0;
  const float* logits() const { return e_.vals[spec_.layers[spec_.output].input_ids[0]].y.data<float>(); }

  OptimizerConfig oc_;
  io::ShardLayout layout_;
  GraphSpec spec_;
  Device dev_;
  int dev_index_;
  Engine e_;
  int64_t T_ = 0, num_dense_ = 0;
  float lr_ = 0, emb_lr_ = 0;
  cudaStream_t copy_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool overlap_ = true;  // the embedding layer on a side stream (off when profiling)
  int emb_idx_ = -1;
  Tensor blas_ws_, lt_ws_, wblas_ws_, wlt_ws_;
  bool graphs_ = true, shadows_stale_ = false;
  bool exposed_ = false;  // parameters()/optimizer_state() handed out tensors since last upload
  std::vector<std::unique_ptr<Node>> nodes_;
  EmbeddingNode* emb_ = nullptr;
  // The global row of id 0 of each feature in the keys uploaded (the same for every table
  // layer: all read all features), or null without table layers.
  const std::vector<uint32_t>* row_base_ = nullptr;
  std::vector<NamedState> dense_, tables_;
  int64_t cap_b_ = 0, cap_nnz_ = 0;
  Tensor dlogits_, loss_;
  std::unique_ptr<StepInputs> inputs_;  // double-buffered step inputs (cuda_step.h)
  int cur_ = 0;                          // the slot of the last upload
  int64_t fwd_rows_ = 0, fwd_nnz_ = 0;
  bool have_training_forward_ = false;

  // DLREC_PROFILE=1: device time per layer and direction from events around each layer (no
  // CUDA graphs), summed over train_step calls after the first 3, printed at destruction.
  void mark(const std::string& what);
  void flush_profile();
  bool profile_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> marks_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  int64_t profiled_steps_ = 0, seen_steps_ = 0;
};

void GraphCuda::mark(const std::string& what) {
  if (!profile_) return;
  const size_t i = marks_.size();
  if (i == events_.size()) {
    cudaEvent_t ev;
    DLREC_CUDA_CHECK(cudaEventCreate(&ev));
    events_.push_back(ev);
  }
  DLREC_CUDA_CHECK(cudaEventRecord(events_[i], e_.st));
  marks_.push_back(what);
}

void GraphCuda::flush_profile() {
  if (!profile_ || marks_.empty()) return;
  DLREC_CUDA_CHECK(cudaEventSynchronize(events_[marks_.size() - 1]));
  if (++seen_steps_ > 3) {
    ++profiled_steps_;
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
      auto it = std::find_if(phase_ms_.begin(), phase_ms_.end(),
                             [&](const auto& p) { return p.first == marks_[i]; });
      if (it == phase_ms_.end()) phase_ms_.emplace_back(marks_[i], ms);
      else it->second += ms;
    }
  }
  marks_.clear();
}

GraphCuda::GraphCuda(const ModelConfig& mc, const OptimizerConfig& oc,
                     const io::ShardLayout& layout, Device device, uint64_t seed,
                     const std::string& precision)
    : oc_(oc), layout_(layout), spec_(GraphSpec::parse(mc.layers, "model.layers")), dev_(device),
      dev_index_(device.index) {
  e_.prec = parse_precision(precision);
  if (e_.prec == Precision::FP16)
    fail("graph models on CUDA support precision fp32, tf32 and bf16; fp16 (with loss "
         "scaling) is implemented for arch dlrm only — use \"precision\": \"bf16\"");
  e_.lowp = e_.prec == Precision::BF16;
  e_.act = e_.lowp ? DType::BF16 : DType::F32;
  e_.dev = device;
  // Everything that needs no device is checked first: unsupported layers and optimizers.
  for (const LayerSpec& s : spec_.layers) {
    if (!s.optimizer.is_null())
      fail(s.where, ": per-layer optimizers are not implemented on CUDA yet (the layer's "
           "\"optimizer\"); remove it or train on the CPU (\"device\": \"cpu\")");
    if (!s.tables.empty())
      fail(s.where, ": per-table settings (\"tables\") are not implemented on CUDA yet; remove "
           "them or train on the CPU (\"device\": \"cpu\")");
  }
  // Hashed tables number their rows by capacity; the step's row array is shared by all table
  // layers, so a wide layer (rows by cardinality) cannot sit beside a hashed embedding layer.
  for (const LayerSpec& h : spec_.layers)
    for (const LayerSpec& w : spec_.layers)
      if (h.hashed.on && w.type == "wide")
        fail(h.where, ": hashed tables and a wide layer ('", w.name, "') in one model are not "
             "implemented on CUDA; train this model on the CPU (\"device\": \"cpu\")");
  auto check_opt = [](const OptimizerConfig& c, const std::string& what, bool dense) {
    const nn::OptimizerKind k = nn::parse_optimizer(c.type);
    DLREC_CHECK(k == nn::OptimizerKind::SGD || k == nn::OptimizerKind::Adagrad,
                "the CUDA graph model supports the sgd and adagrad optimizers, not '", c.type,
                "' (", what, "; train this model on the CPU: \"device\": \"cpu\")");
    DLREC_CHECK(c.momentum == 0 && !c.nesterov, "the CUDA graph model supports sgd without "
                "momentum (", what, "; optimizer.momentum = ", c.momentum, ")");
    DLREC_CHECK(c.clip_value == 0, "the CUDA graph model does not clip gradients (", what,
                "; optimizer.clip_value = ", c.clip_value, ")");
    if (dense) {
      DLREC_CHECK(c.weight_decay == 0, "the CUDA graph model has no weight decay (",
                  "optimizer.weight_decay = ", c.weight_decay, ")");
      DLREC_CHECK(c.clip_norm == 0, "the CUDA graph model does not clip gradients (",
                  "optimizer.clip_norm = ", c.clip_norm, ")");
    }
    return k == nn::OptimizerKind::Adagrad;
  };
  e_.dense_adagrad = check_opt(oc, "optimizer", true);
  const OptimizerConfig ec = oc.embedding_config();
  e_.emb_adagrad = check_opt(ec, "optimizer.embedding", false);
  e_.eps = static_cast<float>(oc.adagrad_eps);
  e_.init_acc = static_cast<float>(oc.adagrad_init);
  e_.emb_eps = static_cast<float>(ec.adagrad_eps);
  e_.emb_init_acc = static_cast<float>(ec.adagrad_init);
  DLREC_CHECK(e_.eps >= 0 && e_.init_acc >= 0 && e_.emb_eps >= 0 && e_.emb_init_acc >= 0,
              "Optimizer: eps and the initial accumulator must be >= 0");
  lr_ = static_cast<float>(oc.lr);
  emb_lr_ = static_cast<float>(oc.embedding_lr_value());
  T_ = static_cast<int64_t>(layout.cardinalities.size());
  num_dense_ = layout.num_dense;
  DLREC_CHECK(num_dense_ >= 0, "graph model: negative number of dense features");

  cuda::require_device(dev_index_);
  DeviceGuard guard(dev_index_);
  const char* prof = std::getenv("DLREC_PROFILE");
  profile_ = prof && prof[0] == '1';
  const char* gr = std::getenv("DLREC_CUDA_GRAPH");
  graphs_ = !profile_ && !(gr && gr[0] == '0');
  // Non-blocking streams (as the CUDA DLRM): with several serving instances in a process,
  // another model's legacy-stream copy during this one's graph capture would otherwise fail the
  // capture. forward() synchronises before returning; after parameters()/optimizer_state()
  // handed out tensors, the next step first waits for the legacy stream (Tensor copies/fills).
  // Priorities: the main stream and the embedding's side stream (the critical path) get the
  // device's greatest priority, the weight-gradient stream the least, so that waiting blocks
  // of the critical path go first (DLREC_STREAM_PRIO=0: all at the default priority).
  int least = 0, greatest = 0;
  DLREC_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const char* prio = std::getenv("DLREC_STREAM_PRIO");
  if (prio && prio[0] == '0') greatest = least;
  DLREC_CUDA_CHECK(cudaStreamCreateWithPriority(&e_.st, cudaStreamNonBlocking, greatest));
  DLREC_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  DLREC_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, greatest));
  DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  overlap_ = !profile_;
  // A cuBLAS handle on `stream` with its own 32 MB workspace, and in 16-bit modes a cuBLASLt
  // planner with another (the main stream's and the weight stream's).
  auto gemm_handles = [&](cudaStream_t stream, Tensor& ws, cublasHandle_t* blas, Tensor& lt_ws,
                          std::unique_ptr<lt::Lt>* lt) {
    ws = Tensor::empty({32 << 20}, DType::U8, dev_);
    DLREC_CUBLAS_CHECK(cublasCreate(blas));
    DLREC_CUBLAS_CHECK(cublasSetStream(*blas, stream));
    DLREC_CUBLAS_CHECK(cublasSetMathMode(
        *blas, e_.prec == Precision::TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    DLREC_CUBLAS_CHECK(cublasSetWorkspace(*blas, ws.raw(), ws.nbytes()));
    if (e_.lowp) {
      lt_ws = Tensor::empty({32 << 20}, DType::U8, dev_);
      *lt = std::make_unique<lt::Lt>(lt_ws.raw(), lt_ws.nbytes());
    }
  };
  gemm_handles(e_.st, blas_ws_, &e_.blas, lt_ws_, &e_.lt);
  if (e_.lowp) {
    const char* gl = std::getenv("DLREC_GRAPH_LT");
    e_.use_lt = !(gl && gl[0] == '0');
  }
  // The weight-gradient stream (Engine::weights), off when profiling or DLREC_GRAPH_WSTREAM=0.
  // DLREC_WSIDE_SMS=N: its cuBLASLt GEMMs target N SMs (leaving the rest to the main stream).
  const char* wsv = std::getenv("DLREC_GRAPH_WSTREAM");
  if (overlap_ && !(wsv && wsv[0] == '0')) {
    DLREC_CUDA_CHECK(cudaStreamCreateWithPriority(&e_.wst, cudaStreamNonBlocking, least));
    DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&e_.wfork, cudaEventDisableTiming));
    DLREC_CUDA_CHECK(cudaEventCreateWithFlags(&e_.wjoin, cudaEventDisableTiming));
    gemm_handles(e_.wst, wblas_ws_, &e_.wblas, wlt_ws_, &e_.wlt);
    const char* sms = std::getenv("DLREC_WSIDE_SMS");
    if (sms) e_.wsms = std::max(0, std::atoi(sms));
  }
  if (profile_) e_.mark = [this](const std::string& what) { mark(what); };
  inputs_ = std::make_unique<StepInputs>(dev_);

  const size_t n = spec_.layers.size();
  nodes_.resize(n);
  e_.vals.resize(n);
  for (int i : spec_.order) {
    const LayerSpec& s = spec_.layers[i];
    const uint64_t tag = s.has_init_tag ? s.init_tag : name_tag(s.name);
    try {
      nodes_[i] = make_node(s, i, nn::derive_seed(seed, tag));
    } catch (const Error& err) {
      fail(s.where, ": ", err.what());
    }
    nodes_[i]->self = i;
    nodes_[i]->in = s.input_ids;
    for (int j : s.input_ids) ++e_.vals[j].consumers;
    std::vector<NamedState> d, t;
    nodes_[i]->collect(e_, d, t);
    bool need = !d.empty() || !t.empty();
    for (int j : s.input_ids) need = need || e_.vals[j].need_grad;
    e_.vals[i].need_grad = need;
  }
  for (size_t i = 0; i < n; ++i) nodes_[i]->collect(e_, dense_, tables_);
  plan_direct_embedding();
  loss_ = Tensor::empty({8}, DType::U8, dev_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

std::unique_ptr<Node> GraphCuda::make_node(const LayerSpec& s, int idx, uint64_t seed) {
  Value& v = e_.vals[idx];
  std::vector<const Value*> ins;
  for (int j : s.input_ids) ins.push_back(&e_.vals[j]);
  // Default value layout: one field; bf16 unless 1 wide; padded rows in bf16.
  auto set_value = [&](int64_t width, bool pad) {
    v.width = width;
    v.fields = {width};
    v.dt = (e_.lowp && width != 1) ? DType::BF16 : DType::F32;
    v.gdt = v.dt;
    v.ld = (v.dt == DType::BF16 && pad) ? round_up(width, 8) : width;
  };
  auto need_compute_type = [&](const Value& x, const std::string& name) {
    if (x.dt != e_.act)
      fail("key '", s.input_key, "': in bf16 precision a '", s.type,
           "' layer cannot read the 1-wide (f32) output of '", name,
           "'; use \"precision\": \"fp32\" or \"tf32\"");
  };
  const std::string& t = s.type;
  if (t == "dense") {
    if (num_dense_ <= 0) fail("the data has no dense features");
    set_value(num_dense_, true);
    return std::make_unique<DenseNode>();
  }
  // Table layers (embedding, wide) read all categorical features, in order.
  auto all_features = [&]() {
    if (T_ == 0) fail("the data has no categorical features");
    if (!s.all_features) {
      bool all = static_cast<int64_t>(s.features.size()) == T_;
      for (size_t k = 0; all && k < s.features.size(); ++k)
        all = s.features[k] == static_cast<int64_t>(k);
      if (!all)
        fail("key 'features': the CUDA graph model's ", t, " layer reads all categorical "
             "features (0 .. ", T_ - 1, ", in order); train this model on the CPU");
    }
    for (int64_t f = 0; f < T_; ++f)
      if (layout_.cardinalities[f] <= 0)
        fail("key 'features': categorical feature ", f, " has cardinality ",
             layout_.cardinalities[f], "; every table needs rows");
  };
  if (t == "embedding") {
    DLREC_CHECK(emb_ == nullptr, "the CUDA graph model supports one embedding layer (over all "
                "categorical features); train this model on the CPU");
    all_features();
    int64_t dim = s.dim;
    for (int64_t d : s.dims)
      if (d != s.dims[0])
        fail("key 'dims': the CUDA graph model needs one width for all tables (got ", s.dims[0],
             " and ", d, "); train this model on the CPU");
    if (!s.dims.empty()) {
      if (static_cast<int64_t>(s.dims.size()) != T_)
        fail("key 'dims': ", s.dims.size(), " widths for ", T_, " features");
      dim = s.dims[0];
    }
    DLREC_CHECK(dim > 0, "key 'dim': must be positive");
    set_value(T_ * dim, false);
    v.fields.assign(T_, dim);
    v.gdt = DType::F32;
    // Hashed: the CPU layer's table options (graph_model.cc): capacity clamped to the feature's
    // cardinality, seed per feature, init_scale or sqrt(1 / capacity).
    std::vector<hashed_cuda::TableOptions> hashed;
    if (s.hashed.on)
      for (int64_t f = 0; f < T_; ++f) {
        hashed_cuda::TableOptions o;
        o.name = s.name + "." + std::to_string(f);
        o.capacity = std::min<int64_t>(s.hashed.capacity, layout_.cardinalities[f]);
        o.seed = nn::derive_seed(seed, static_cast<uint64_t>(f));
        o.init_scale = static_cast<float>(s.hashed.init_scale >= 0
                                              ? s.hashed.init_scale
                                              : std::sqrt(1.0 / static_cast<double>(o.capacity)));
        hashed.push_back(std::move(o));
      }
    auto node = std::make_unique<EmbeddingNode>(e_, s.name, layout_, dim,
                                                nn::parse_pooling(s.pooling) == nn::Pooling::Mean,
                                                seed, std::move(hashed));
    emb_ = node.get();
    emb_idx_ = idx;
    row_base_ = &node->row_base();
    return node;
  }
  if (t == "wide") {
    all_features();
    set_value(1, false);
    auto node = std::make_unique<WideNode>(e_, s.name, layout_,
                                           nn::parse_pooling(s.pooling) == nn::Pooling::Mean);
    row_base_ = &node->row_base();
    return node;
  }
  if (t == "mlp") {
    need_compute_type(*ins[0], s.inputs[0]);
    if (s.sizes.empty()) fail("key 'sizes': needs at least one size");
    for (size_t k = 0; k + 1 < s.sizes.size(); ++k)
      if (e_.lowp && s.sizes[k] == 1)
        fail("key 'sizes': in bf16 precision hidden layers need more than one unit");
    set_value(s.sizes.back(), false);
    return std::make_unique<MlpNode>(e_, s.name, ins[0]->width, ins[0]->ld, s.sizes, s.relu_last,
                                     seed);
  }
  if (t == "cross") {
    need_compute_type(*ins[0], s.inputs[0]);
    const int64_t F = ins[0]->width;
    if (s.low_rank > F)
      fail("key 'low_rank': ", s.low_rank, " exceeds the input width ", F, " of '", s.inputs[0],
           "'");
    set_value(F, true);
    return std::make_unique<CrossNode>(e_, s.name, F, ins[0]->ld, v.ld, s.num_layers, s.low_rank,
                                       seed);
  }
  if (t == "concat") {
    int64_t w = 0;
    std::vector<int64_t> fields;
    for (const Value* x : ins) {
      w += x->width;
      fields.insert(fields.end(), x->fields.begin(), x->fields.end());
    }
    set_value(w, true);
    v.fields = fields;
    return std::make_unique<ConcatNode>();
  }
  if (t == "dot" || t == "fm") {
    int64_t nf = 0;
    const int64_t d = ins[0]->fields.at(0);
    for (size_t k = 0; k < ins.size(); ++k)
      for (int64_t w : ins[k]->fields) {
        if (w != d)
          fail("key '", s.input_key, "': the ", t, " interaction needs vectors of one width, "
               "but '", s.inputs[0], "' starts with width ", d, " and '", s.inputs[k],
               "' has other widths",
               t == "dot" ? " (make the MLP's last size equal the embedding dim)" : "");
        ++nf;
      }
    if (nf < 2)
      fail("key '", s.input_key, "': the ", t, " interaction needs at least 2 vectors, its "
           "inputs give ", nf);
    if (t == "fm") {
      set_value(1, false);
      return std::make_unique<FmNode>(ins, nf, d);
    }
    set_value(d + nf * (nf - 1) / 2, true);
    return std::make_unique<DotNode>(e_, ins, nf, d);
  }
  if (t == "add") {
    for (size_t k = 1; k < ins.size(); ++k)
      if (ins[k]->width != ins[0]->width)
        fail("key '", s.input_key, "': add needs inputs of one width, but '", s.inputs[0],
             "' is ", ins[0]->width, " wide and '", s.inputs[k], "' is ", ins[k]->width);
    set_value(ins[0]->width, true);
    return std::make_unique<AddNode>();
  }
  if (t == "output") {
    if (ins[0]->width != 1)
      fail("key '", s.input_key, "': the output must be one logit per sample, but '",
           s.inputs[0], "' is ", ins[0]->width, " wide (end it with a layer of size 1)");
    set_value(1, false);
    return std::make_unique<OutputNode>();
  }
  fail("the '", t, "' layer is not implemented on CUDA yet; this model runs on the CPU only "
       "(\"device\": \"cpu\")");
}

// The embedding layer writes its pooled rows straight into a concat's columns (and reads its
// gradient from there) when that concat is its only consumer, reading it once, and has its
// type (EmbeddingNode::write_into). Off for hashed tables (their evaluation pooling writes
// packed rows) and with DLREC_EMB_DIRECT=0.
void GraphCuda::plan_direct_embedding() {
  if (emb_idx_ < 0 || emb_->hashed()) return;
  const char* ev = std::getenv("DLREC_EMB_DIRECT");
  if (ev && ev[0] == '0') return;
  int uses = 0, consumer = -1;
  for (size_t i = 0; i < spec_.layers.size(); ++i)
    for (int j : spec_.layers[i].input_ids)
      if (j == emb_idx_) {
        ++uses;
        consumer = static_cast<int>(i);
      }
  if (uses != 1) return;
  auto* cat = dynamic_cast<ConcatNode*>(nodes_[consumer].get());
  const Value& x = e_.vals[emb_idx_];
  const Value& c = e_.vals[consumer];
  if (!cat || x.dt != c.dt || (x.need_grad && (!c.need_grad || c.gdt != c.dt))) return;
  int64_t col = 0;
  for (int j : spec_.layers[consumer].input_ids) {
    if (j == emb_idx_) break;
    col += e_.vals[j].width;
  }
  cat->direct = emb_idx_;
  emb_->write_into(consumer, col);
}

void GraphCuda::refresh_shadows() {
  for (auto& n : nodes_) n->refresh(e_);
  shadows_stale_ = false;
}

void GraphCuda::drop_graphs() {
  if (inputs_) inputs_->drop_graphs();
}

GraphCuda::~GraphCuda() {
  if (copy_) cudaStreamSynchronize(copy_);
  if (side_) cudaStreamSynchronize(side_);
  if (e_.wst) cudaStreamSynchronize(e_.wst);
  if (e_.st) cudaStreamSynchronize(e_.st);
  if (profile_ && profiled_steps_ > 0) {
    double total = 0;
    for (auto& p : phase_ms_) total += p.second;
    std::fprintf(stderr, "[profile] %lld steps of batch %lld, device ms per step by phase:\n",
                 static_cast<long long>(profiled_steps_), static_cast<long long>(fwd_rows_));
    for (auto& p : phase_ms_)
      std::fprintf(stderr, "[profile]   %-28s %8.3f ms  %5.1f%%\n", p.first.c_str(),
                   p.second / profiled_steps_, 100.0 * p.second / std::max(total, 1e-9));
    std::fprintf(stderr, "[profile]   %-28s %8.3f ms\n", "total", total / profiled_steps_);
    if (e_.lt)
      std::fprintf(stderr, "[profile]   cuBLASLt plans without an algorithm (fallbacks): %d\n",
                   e_.lt->unsupported_count());
  }
  for (auto ev : events_) cudaEventDestroy(ev);
  inputs_.reset();
  nodes_.clear();
  e_.lt.reset();
  e_.wlt.reset();
  if (e_.blas) cublasDestroy(e_.blas);
  if (e_.wblas) cublasDestroy(e_.wblas);
  if (e_.wfork) cudaEventDestroy(e_.wfork);
  if (e_.wjoin) cudaEventDestroy(e_.wjoin);
  if (e_.wst) cudaStreamDestroy(e_.wst);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (side_) cudaStreamDestroy(side_);
  if (copy_) cudaStreamDestroy(copy_);
  if (e_.st) cudaStreamDestroy(e_.st);
}

void GraphCuda::check_batch(const io::Batch& b) const {
  cuda_step::check_batch(b, num_dense_, T_, "graph model");
}

void GraphCuda::ensure_capacity(int64_t B, int64_t nnz) {
  if (B <= cap_b_ && nnz <= cap_nnz_) return;
  DLREC_CUDA_CHECK(cudaStreamSynchronize(copy_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(side_));
  if (e_.wst) DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.wst));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  drop_graphs();
  const int64_t nb = std::max(B, cap_b_), nn_ = std::max<int64_t>(std::max(nnz, cap_nnz_), 1);
  DLREC_CHECK(nn_ < (int64_t{1} << 31) && nb * std::max<int64_t>(T_, 1) < (int64_t{1} << 31),
              "CUDA graph model: a batch with ", nn_, " ids is too large (int32 offsets)");
  cap_b_ = nb;
  cap_nnz_ = nn_;
  const int64_t cb = std::max<int64_t>(nb, 1);
  int64_t max_cols = 1;
  for (const Value& v : e_.vals) max_cols = std::max(max_cols, v.ld);
  for (const LayerSpec& s : spec_.layers)
    for (int64_t z : s.sizes) max_cols = std::max(max_cols, z);
  e_.partial = Tensor::empty(
      {std::max<int64_t>(std::max(cd::bias_grad_chunks(cb), cg::cross_grad_chunks(cb)), 1),
       max_cols},
      DType::F32, dev_);
  for (int i : spec_.order) nodes_[i]->alloc(e_, cb);
  dlogits_ = e_.buf({cb}, DType::F32);
  e_.vals[spec_.output].g = dlogits_;
  for (int i : spec_.order) nodes_[i]->alloc_scratch(e_, nn_);
  inputs_->allocate(cb, nn_, num_dense_, T_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

void GraphCuda::upload(const io::Batch& b, float lr, float emb_lr, bool training) {
  const int64_t B = b.rows;
  int64_t nnz = 0;
  for (int64_t t = 0; t < T_; ++t) nnz += b.cat_offsets[t][B] - b.cat_offsets[t][0];
  ensure_capacity(B, nnz);
  // Hashed tables: their state is rebuilt if it was handed out, their keys checked, before the
  // common upload (which would reject a negative key with a fixed table's message); their int64
  // keys follow on the copy stream after it (ordered after its wait for the slot to be free).
  hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr;
  if (hashed) hashed->prepare(b, training);
  cur_ = inputs_->upload(b, layout_.cardinalities, row_base_, lr,
                         emb_lr, copy_, e_.st, "graph model");
  if (hashed) hashed->upload(b, cur_, copy_, e_.st);
  fwd_rows_ = B;
  fwd_nnz_ = nnz;
  bind_slot();
  if (exposed_) {
    DLREC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    exposed_ = false;
  }
  if (shadows_stale_) refresh_shadows();
}

void GraphCuda::bind_slot() {
  const InputSlot& s = inputs_->slots[cur_];
  e_.B = fwd_rows_;
  e_.nnz = fwd_nnz_;
  e_.lr = s.d_lr.data<float>();
  e_.dense = s.d_dense.data<float>();
  e_.offsets = s.d_offsets.data<int32_t>();
  e_.keys = static_cast<const uint32_t*>(s.d_keys.raw());
}

// Runs node i's forward or backward on the side stream, forked from and joined to the main one.
void GraphCuda::on_side(int i, bool fwd) {
  cudaStream_t main = e_.st;
  DLREC_CUDA_CHECK(cudaEventRecord(fork_, main));
  DLREC_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
  e_.st = side_;
  try {
    if (fwd) nodes_[i]->forward(e_);
    else nodes_[i]->backward(e_);
  } catch (...) {
    e_.st = main;
    throw;
  }
  e_.st = main;
  DLREC_CUDA_CHECK(cudaEventRecord(join_, side_));
}

void GraphCuda::run_forward() {
  if (e_.B == 0) return;
  // The embedding lookup (no inputs) runs on the side stream beside the dense layers before
  // its first consumer.
  const bool ov = overlap_ && emb_idx_ >= 0;
  bool pending = false;
  if (ov) {
    on_side(emb_idx_, true);
    pending = true;
  }
  for (int i : spec_.order) {
    if (ov && i == emb_idx_) continue;
    if (pending)
      for (int j : spec_.layers[i].input_ids)
        if (j == emb_idx_ && pending) {
          DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, join_, 0));
          pending = false;
        }
    nodes_[i]->forward(e_);
    mark(spec_.layers[i].name + " fwd");
  }
  if (pending) DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, join_, 0));
}

void GraphCuda::run_backward() {
  if (e_.B == 0) return;
  for (auto& v : e_.vals) v.has_grad = false;
  e_.vals[spec_.output].has_grad = true;
  // The embedding update (its gradient is complete when its turn comes) runs on the side
  // stream beside the backward of the layers before it (the bottom MLP).
  bool pending = false;
  for (size_t k = spec_.order.size(); k-- > 0;) {
    const int i = spec_.order[k];
    if (!e_.vals[i].need_grad || !e_.vals[i].has_grad) continue;
    if (overlap_ && i == emb_idx_) {
      on_side(i, false);
      pending = true;
      continue;
    }
    nodes_[i]->backward(e_);
    mark(spec_.layers[i].name + " bwd+update");
  }
  e_.join_weights();
  if (pending) DLREC_CUDA_CHECK(cudaStreamWaitEvent(e_.st, join_, 0));
}

void GraphCuda::step_body() {
  run_forward();
  cd::bce_with_logits(logits(), inputs_->slots[cur_].d_labels.data<float>(), fwd_rows_,
                      dlogits_.data<float>(), static_cast<double*>(loss_.raw()), e_.st, nullptr);
  mark("bce");
  run_backward();
}

Tensor GraphCuda::forward(const io::Batch& batch, bool training) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  have_training_forward_ = false;
  upload(batch, 0.f, 0.f, training);
  run_forward();
  marks_.clear();  // phases are profiled in train_step only
  const int64_t B = fwd_rows_;
  Tensor out = Tensor::empty({B}, DType::F32, dev_);
  if (B)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(out.raw(), logits(), sizeof(float) * B,
                                     cudaMemcpyDeviceToDevice, e_.st));
  if (!training) DLREC_CUDA_CHECK(cudaEventRecord(inputs_->slots[cur_].free, e_.st));
  have_training_forward_ = training;
  // Callers read the logits with legacy-stream copies, which do not wait for our streams.
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  return out;
}

void GraphCuda::backward_and_update(const Tensor& dlogits, double lr_scale) {
  DeviceGuard g(dev_index_);
  DLREC_CHECK(have_training_forward_,
              "graph model: backward_and_update needs a forward(batch, training = true) before it");
  DLREC_CHECK(dlogits.dtype() == DType::F32 && dlogits.numel() == fwd_rows_,
              "graph model: dlogits must be f32 with ", fwd_rows_, " values, got ",
              dtype_name(dlogits.dtype()), " ", shape_str(dlogits.shape()));
  DLREC_CHECK(!dlogits.device().is_cuda() || dlogits.device() == dev_, "graph model: dlogits on ",
              dlogits.device().str(), ", the model is on ", dev_.str());
  DLREC_CHECK(lr_scale >= 0, "graph model: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  InputSlot& sl = inputs_->slots[cur_];
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  sl.lr[0] = static_cast<float>(lr_ * lr_scale);
  sl.lr[1] = static_cast<float>(emb_lr_ * lr_scale);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(sl.d_lr.raw(), sl.lr, sizeof(float) * 2,
                                   cudaMemcpyHostToDevice, e_.st));
  if (fwd_rows_)
    DLREC_CUDA_CHECK(cudaMemcpyAsync(dlogits_.raw(), dlogits.raw(), sizeof(float) * fwd_rows_,
                                     dlogits.device().is_cuda() ? cudaMemcpyDeviceToDevice
                                                                : cudaMemcpyHostToDevice,
                                     e_.st));
  run_backward();
  marks_.clear();
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, e_.st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));  // the host lr buffer and dlogits are reused
}

double GraphCuda::train_step(const io::Batch& batch, double lr_scale, bool want_loss) {
  DeviceGuard g(dev_index_);
  check_batch(batch);
  DLREC_CHECK(static_cast<int64_t>(batch.labels.size()) == batch.rows,
              "graph model: train_step needs one label per row");
  DLREC_CHECK(lr_scale >= 0, "graph model: lr_scale must be >= 0, got ", lr_scale);
  have_training_forward_ = false;
  mark("begin");
  upload(batch, static_cast<float>(lr_ * lr_scale), static_cast<float>(emb_lr_ * lr_scale),
         true);
  mark("h2d (+host packing)");
  InputSlot& sl = inputs_->slots[cur_];
  run_step(sl, fwd_rows_, fwd_nnz_, graphs_, e_.st, [&] { step_body(); });
  DLREC_CUDA_CHECK(cudaEventRecord(sl.free, e_.st));
  flush_profile();
  if (!want_loss) return std::numeric_limits<double>::quiet_NaN();
  double loss = 0;
  DLREC_CUDA_CHECK(
      cudaMemcpyAsync(&loss, loss_.raw(), sizeof(double), cudaMemcpyDeviceToHost, e_.st));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
  return loss;
}

void GraphCuda::synchronize() {
  DeviceGuard g(dev_index_);
  DLREC_CUDA_CHECK(cudaStreamSynchronize(copy_));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(side_));
  if (e_.wst) DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.wst));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(e_.st));
}

std::vector<NamedTensor> GraphCuda::parameters() {
  synchronize();
  shadows_stale_ = e_.lowp;  // the caller may write into the f32 masters
  exposed_ = true;
  std::vector<NamedTensor> out;
  for (auto& p : dense_) out.emplace_back(p.name, p.value);
  hashed_cuda::HashedTables* hashed = emb_ ? emb_->hashed() : nullptr;
  if (!hashed) {
    for (auto& p : tables_) out.emplace_back(p.name, p.value);
    return out;
  }
  // Hashed tables as the CPU graph model hands them out (names, order, shapes and meaning):
  // per table "<t>.weight" (the device rows by slot), then host tensors "<t>.keys", "<t>.lru"
  // and "<t>.hash_meta" built from the device state; the caller may write into all of them (a
  // checkpoint load), and the next step rebuilds the device state from them.
  report_hashed(*hashed);
  const auto& st = hashed->export_state();
  DLREC_CHECK(st.size() == tables_.size(), "graph model: ", st.size(), " hashed tables for ",
              tables_.size(), " tables (bug)");
  for (size_t t = 0; t < tables_.size(); ++t) {
    const std::string base = emb_->name() + "." + std::to_string(t);
    out.emplace_back(tables_[t].name, tables_[t].value);
    out.emplace_back(base + ".keys", st[t].keys);
    out.emplace_back(base + ".lru", st[t].lru);
    out.emplace_back(base + ".hash_meta", st[t].meta);
  }
  return out;
}

// One "[hashed]" line per table on stderr when lookups happened since the last report, as the
// CPU graph model prints at checkpoints and exports.
void GraphCuda::report_hashed(hashed_cuda::HashedTables& h) {
  const auto st = h.stats();
  int64_t total = 0;
  for (const auto& s : st) total += s.lookups;
  if (total == hashed_reported_lookups_) return;
  hashed_reported_lookups_ = total;
  for (size_t t = 0; t < st.size(); ++t) {
    const auto& s = st[t];
    std::fprintf(stderr,
                 "[hashed] %s.%zu: %lld/%lld rows, %lld lookups, hit rate %.4f, %lld inserts, "
                 "%lld evictions\n",
                 emb_->name().c_str(), t, static_cast<long long>(s.size),
                 static_cast<long long>(h.capacities()[t]), static_cast<long long>(s.lookups),
                 s.lookups ? static_cast<double>(s.hits) / s.lookups : 0.0,
                 static_cast<long long>(s.inserts), static_cast<long long>(s.evictions));
  }
}

std::vector<NamedTensor> GraphCuda::optimizer_state() {
  synchronize();
  exposed_ = true;
  std::vector<NamedTensor> out;
  if (e_.dense_adagrad)
    for (auto& p : dense_) out.emplace_back(p.name + ".adagrad", p.state);
  if (e_.emb_adagrad)
    for (auto& p : tables_) out.emplace_back(p.name + ".adagrad", p.state);
  return out;
}

}  // namespace

std::unique_ptr<CudaModel> make_graph_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                           const io::ShardLayout& layout, Device device,
                                           uint64_t seed, const std::string& precision) {
  DLREC_CHECK(device.is_cuda(), "make_graph_cuda: ", device.str(), " is not a CUDA device");
  DLREC_CHECK(model.arch == "graph", "make_graph_cuda: model.arch is '", model.arch,
              "', expected \"graph\"");
  return std::make_unique<GraphCuda>(model, opt, layout, device, seed, precision);
}

}  // namespace dlrec::model
