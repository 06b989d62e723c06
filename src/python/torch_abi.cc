// The C ABI of torch_abi.h: configuration, the CPU collection (nn::EmbeddingBag and
// embedding::HashedEmbedding tables with nn::Optimizer's sparse steps, the CPU engine's own
// code), and the entry points, which turn every exception into an error message.
#include "python/torch_abi.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "dlrec/core/config.h"
#include "dlrec/core/error.h"
#include "dlrec/embedding/hashed_embedding.h"
#include "dlrec/nn/rng.h"

namespace dlrec::torch_abi {
namespace {

thread_local std::string g_last_error;

CollectionConfig parse_config(const char* text) {
  DLREC_CHECK(text != nullptr, "EmbeddingCollection config: null text");
  const json j = parse_json(text, "EmbeddingCollection config");
  DLREC_CHECK(j.is_object(), "EmbeddingCollection config: not a JSON object");
  ConfigReader r(j, "");
  CollectionConfig c;
  c.cuda = r.get_choice("device", "cpu", {"cpu", "cuda"}) == "cuda";
  c.device_index = static_cast<int>(r.get_int_range("device_index", 0, 0, 1023));
  if (r.has("optimizer")) {  // default: SGD
    const json& o = r.raw("optimizer");
    DLREC_CHECK(o.is_object(), "config key 'optimizer' must be an object");
    ConfigReader ro(o, "optimizer");
    nn::OptimizerOptions& opt = c.optimizer;
    opt.kind = nn::parse_optimizer(
        ro.get_choice("kind", "sgd", {"sgd", "adagrad", "rowwise_adagrad", "adam"}));
    opt.adagrad_eps = static_cast<float>(ro.get_range("eps", 1e-8, 0.0, 1.0));
    opt.adam_eps = opt.adagrad_eps;
    opt.initial_accumulator =
        static_cast<float>(ro.get_range("initial_accumulator", 0.0, 0.0, 1e30));
    opt.beta1 = static_cast<float>(ro.get_range("beta1", 0.9, 0.0, 0.999999));
    opt.beta2 = static_cast<float>(ro.get_range("beta2", 0.999, 0.0, 0.999999));
    ro.finish();
    opt.validate();
  }
  const json& tables = r.raw("tables");
  DLREC_CHECK(tables.is_array() && !tables.empty(),
              "config key 'tables' must be a non-empty list of tables");
  for (size_t i = 0; i < tables.size(); ++i) {
    const std::string where = "tables[" + std::to_string(i) + "]";
    DLREC_CHECK(tables[i].is_object(), "config key '", where, "' must be an object");
    ConfigReader rt(tables[i], where);
    TableConfig t;
    t.name = rt.get<std::string>("name", "table" + std::to_string(i));
    t.dim = rt.get_int_range("dim", 0, 1, 1 << 16);
    t.pooling = nn::parse_pooling(rt.get_choice("pooling", "sum", {"sum", "mean"}));
    t.seed = static_cast<uint64_t>(
        rt.get_int_range("seed", static_cast<int64_t>(i), 0, std::numeric_limits<int64_t>::max()));
    if (rt.has("hashed")) {
      const json& h = rt.raw("hashed");
      DLREC_CHECK(h.is_object(), "config key '", where, ".hashed' must be an object");
      ConfigReader rh(h, where + ".hashed");
      t.hashed = true;
      t.rows = rh.get_int_range("capacity", 0, 1, (int64_t{1} << 31) - 1);
      t.init_scale = static_cast<float>(
          rh.get_range("init_scale", std::sqrt(1.0 / static_cast<double>(t.rows)), 0.0, 1e3));
      rh.finish();
    } else {
      t.rows = rt.get_int_range("rows", 0, 1, int64_t{1} << 40);
    }
    rt.finish();
    c.width += t.dim;
    c.tables.push_back(std::move(t));
  }
  r.finish();
  return c;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CollectionConfig& c) : c_(c), opt_(c.optimizer) {
    int64_t col = 0;
    for (const TableConfig& t : c.tables) {
      col_.push_back(col);
      col += t.dim;
      if (t.hashed) {
        embedding::HashedEmbeddingOptions o;
        o.dim = t.dim;
        o.capacity = t.rows;
        o.seed = t.seed;
        o.init_scale = t.init_scale;
        o.pooling = t.pooling;
        o.optimizer = c.optimizer;
        hashed_.push_back(std::make_unique<embedding::HashedEmbedding>(o));
        fixed_.emplace_back();
      } else {
        fixed_.push_back(std::make_unique<nn::EmbeddingBag>(t.rows, t.dim, t.pooling));
        fixed_.back()->init(t.seed);
        opt_.init_state(fixed_.back()->weight());
        hashed_.emplace_back();
      }
    }
  }
  void forward(const int64_t* offsets, const int64_t* ids, int64_t B, int64_t nnz, void* out_v,
               bool out_bf16, void*, bool training) override {
    DLREC_CHECK(!out_bf16, "bfloat16 outputs are CUDA-only; a CPU collection writes float32");
    float* out = static_cast<float*>(out_v);
    const int64_t T = static_cast<int64_t>(c_.tables.size());
    DLREC_CHECK(B >= 0 && nnz >= 0, "forward: negative batch size or id count");
    DLREC_CHECK(offsets[T * B] - offsets[0] == nnz, "forward: offsets[", T * B,
                "] - offsets[0] = ", offsets[T * B] - offsets[0], " but ", nnz, " ids were given");
    have_batch_ = false;
    local_.resize(B + 1);
    for (int64_t t = 0; t < T; ++t) {
      // Table t's bags, re-based to start at 0 (the tables' forward wants offsets[0] = 0).
      const int64_t* o = offsets + t * B;
      for (int64_t b = 0; b <= B; ++b) {
        if (b < B && o[b] > o[b + 1])
          fail("table '", c_.tables[t].name, "': offsets decrease at sample ", b, " (", o[b], " > ",
               o[b + 1], ")");
        if (o[b] < offsets[0] || o[b] - offsets[0] > nnz)
          fail("table '", c_.tables[t].name, "': offset ", o[b], " of sample ", b,
               " is outside the ", nnz, " ids");
        local_[b] = o[b] - o[0];
      }
      const int64_t* tid = ids + (o[0] - offsets[0]);
      try {
        if (hashed_[t])
          hashed_[t]->forward(local_.data(), tid, B, out + col_[t], c_.width, training);
        else
          fixed_[t]->forward(local_.data(), tid, B, out + col_[t], c_.width, training);
      } catch (const Error& e) {
        fail("table '", c_.tables[t].name, "' (table ", t, "): ", e.what());
      }
    }
    have_batch_ = training;
  }
  void backward(const void* dout_v, bool dout_bf16, int64_t ld, float lr, void*) override {
    DLREC_CHECK(!dout_bf16, "bfloat16 gradients are CUDA-only; a CPU collection takes float32");
    const float* dout = static_cast<const float*>(dout_v);
    DLREC_CHECK(have_batch_, "backward: no training forward to take the gradient of");
    DLREC_CHECK(ld >= c_.width, "backward: gradient row stride ", ld, " < width ", c_.width);
    DLREC_CHECK(lr >= 0.f, "backward: learning rate must be >= 0, got ", lr);
    for (size_t t = 0; t < c_.tables.size(); ++t) {
      if (hashed_[t]) {
        const nn::SparseGrad& g = hashed_[t]->backward(dout + col_[t], ld);
        hashed_[t]->apply(g, lr);
      } else {
        const nn::SparseGrad& g = fixed_[t]->backward(dout + col_[t], ld);
        opt_.step_sparse(fixed_[t]->weight(), g, lr);
      }
    }
    have_batch_ = false;
  }
  int64_t width() const override { return c_.width; }
  void table_size(int t, int which, int64_t* rows, int64_t* cols) override {
    const nn::Param& p = fixed_table(t, which);
    const Tensor& x = which ? p.state : p.value;
    *rows = x.dim(0);
    *cols = x.numel() / x.dim(0);
  }
  void copy_table(int t, int which, float* buf, bool on_device, bool read, void*) override {
    DLREC_CHECK(!on_device, "a CPU collection's tables copy to and from host memory only");
    nn::Param& p = fixed_table(t, which);
    Tensor& x = which ? p.state : p.value;
    if (read)
      std::memcpy(buf, x.data<float>(), x.numel() * sizeof(float));
    else
      std::memcpy(x.data<float>(), buf, x.numel() * sizeof(float));
  }

 private:
  nn::Param& fixed_table(int t, int which) {
    DLREC_CHECK(t >= 0 && t < static_cast<int>(c_.tables.size()), "table ", t, " out of range [0, ",
                c_.tables.size(), ")");
    DLREC_CHECK(!hashed_[t], "table '", c_.tables[t].name,
                "' is hashed: its rows are by key, not copied as a whole");
    nn::Param& p = fixed_[t]->weight();
    DLREC_CHECK(which == 0 || (which == 1 && p.state.defined()), "table '", c_.tables[t].name,
                "': ", which == 1 ? "the optimizer keeps no state" : "which must be 0 or 1");
    return p;
  }
  CollectionConfig c_;
  nn::Optimizer opt_;
  std::vector<int64_t> col_, local_;
  std::vector<std::unique_ptr<nn::EmbeddingBag>> fixed_;
  std::vector<std::unique_ptr<embedding::HashedEmbedding>> hashed_;
  bool have_batch_ = false;
};

template <class F>
int guarded(F&& fn) {
  try {
    fn();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown error";
  }
  return -1;
}

Backend& backend(void* h) {
  DLREC_CHECK(h != nullptr, "null EmbeddingCollection handle");
  return *static_cast<Backend*>(h);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CollectionConfig& config) {
  return std::make_unique<CpuBackend>(config);
}

#ifndef DLREC_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(const CollectionConfig&) {
  fail("device 'cuda': this dlrec library was built without CUDA (DLREC_CUDA=OFF)");
}
#endif

}  // namespace dlrec::torch_abi

using namespace dlrec::torch_abi;

extern "C" {

int dlrec_emb_abi_version(void) { return DLREC_EMB_ABI_VERSION; }
int dlrec_emb_has_cuda(void) {
#ifdef DLREC_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}
const char* dlrec_emb_last_error(void) { return g_last_error.c_str(); }

int dlrec_emb_create(const char* config_json, void** handle) {
  return guarded([&] {
    DLREC_CHECK(handle != nullptr, "null handle pointer");
    *handle = nullptr;
    const CollectionConfig c = parse_config(config_json);
    std::unique_ptr<Backend> b = c.cuda ? make_cuda_backend(c) : make_cpu_backend(c);
    *handle = b.release();
  });
}
void dlrec_emb_destroy(void* handle) { delete static_cast<Backend*>(handle); }

int dlrec_emb_width(void* handle, int64_t* width) {
  return guarded([&] {
    DLREC_CHECK(width != nullptr, "null width pointer");
    *width = backend(handle).width();
  });
}

int dlrec_emb_forward(void* handle, const int64_t* offsets, const int64_t* ids, int64_t batch,
                      int64_t nnz, void* out, int out_bf16, void* stream, int training) {
  return guarded([&] {
    DLREC_CHECK(offsets && out && (ids || nnz == 0), "forward: null pointer");
    backend(handle).forward(offsets, ids, batch, nnz, out, out_bf16 != 0, stream, training != 0);
  });
}
int dlrec_emb_check(void* handle, void* stream) {
  return guarded([&] { backend(handle).check(stream); });
}
int dlrec_emb_backward(void* handle, const void* dout, int dout_bf16, int64_t ld, float lr,
                       void* stream) {
  return guarded([&] {
    DLREC_CHECK(dout != nullptr, "backward: null gradient");
    backend(handle).backward(dout, dout_bf16 != 0, ld, lr, stream);
  });
}
int dlrec_emb_table_size(void* handle, int table, int which, int64_t* rows, int64_t* cols) {
  return guarded([&] { backend(handle).table_size(table, which, rows, cols); });
}
int dlrec_emb_read_table(void* handle, int table, int which, float* buf, int on_device,
                         void* stream) {
  return guarded([&] {
    DLREC_CHECK(buf != nullptr, "read_table: null buffer");
    backend(handle).copy_table(table, which, buf, on_device != 0, true, stream);
  });
}
int dlrec_emb_write_table(void* handle, int table, int which, const float* buf, int on_device,
                          void* stream) {
  return guarded([&] {
    DLREC_CHECK(buf != nullptr, "write_table: null buffer");
    backend(handle).copy_table(table, which, const_cast<float*>(buf), on_device != 0, false,
                               stream);
  });
}

}  // extern "C"
