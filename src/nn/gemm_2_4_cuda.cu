// 2:4 sparse GEMMs through cuSPARSELt, loaded at run time; see gemm_2_4_cuda.h.
#include <vector>

#include "core/cuda_check.h"
#include "dlrec/core/error.h"
#include "dlrec/nn/cusparselt_version.h"
#include "nn/gemm_2_4_cuda.h"

#ifdef DLREC_WITH_CUSPARSELT
#include <cusparseLt.h>
#include <dlfcn.h>
#endif

namespace dlrec::nn::cuda_sparse {

const char* type_name(Type t) {
  switch (t) {
    case Type::BF16:
      return "bf16";
    case Type::FP16:
      return "fp16";
    case Type::INT8:
      return "int8";
  }
  return "?";
}

#ifndef DLREC_WITH_CUSPARSELT

bool available(std::string* why) {
  if (why)
    *why =
        "this build has no cuSPARSELt (install the nvidia-cusparselt-cu13 wheel of "
        "requirements-cuda.txt and rebuild)";
  return false;
}
struct Gemm24::State {};
struct Gemm24::Plan {};
Gemm24::Gemm24(int64_t out, int64_t in, Type type, Layout layout, bool)
    : out_(out), in_(in), type_(type), layout_(layout) {
  std::string why;
  available(&why);
  fail("2:4 sparse GEMM: ", why);
}
Gemm24::~Gemm24() = default;
void Gemm24::set_weight(const void*, cudaStream_t) {}
void Gemm24::run(const void*, void*, int64_t, cudaStream_t, float) {}
void Gemm24::prune(void*, cudaStream_t) {}
void Gemm24::set_epilogue(const Epilogue&) {}

#else

namespace {

// The cuSPARSELt entry points used here, resolved from the shared library.
struct Api {
  std::string error;  // empty when loaded
#define DLREC_CUSPARSELT_FNS(X)                                                     \
  X(cusparseLtInit)                                                                 \
  X(cusparseLtDestroy) X(cusparseLtGetErrorString) X(cusparseLtDenseDescriptorInit) \
      X(cusparseLtStructuredDescriptorInit) X(cusparseLtMatDescriptorDestroy)       \
          X(cusparseLtMatmulDescriptorInit) X(cusparseLtMatmulAlgSelectionInit)     \
              X(cusparseLtMatmulAlgSelectionDestroy) X(cusparseLtMatmulPlanInit)    \
                  X(cusparseLtMatmulPlanDestroy) X(cusparseLtMatmulGetWorkspace)    \
                      X(cusparseLtMatmul) X(cusparseLtSpMMAPrune2)                  \
                          X(cusparseLtSpMMACompressedSize2) X(cusparseLtSpMMACompress2) \
                              X(cusparseLtMatmulDescSetAttribute)
#define DLREC_DECLARE(name) decltype(&::name) name = nullptr;
  DLREC_CUSPARSELT_FNS(DLREC_DECLARE)
#undef DLREC_DECLARE
};

Api load_api() {
  Api a;
  std::string where = "libcusparseLt.so.0 (the loader's path)";
  void* lib = dlopen("libcusparseLt.so.0", RTLD_NOW | RTLD_LOCAL);
#ifdef DLREC_CUSPARSELT_LIB
  if (!lib) {
    lib = dlopen(DLREC_CUSPARSELT_LIB, RTLD_NOW | RTLD_LOCAL);
    where = DLREC_CUSPARSELT_LIB;
  }
#endif
  if (!lib) {
    a.error = std::string("cuSPARSELt library not found (libcusparseLt.so.0 on the loader path") +
#ifdef DLREC_CUSPARSELT_LIB
              ", or " DLREC_CUSPARSELT_LIB
#endif
              "): " +
              dlerror();
    return a;
  }
  // The version first (cusparseLtGetProperty has no handle): the error names the found and
  // the required version rather than a missing entry point.
  auto get_property = reinterpret_cast<decltype(&::cusparseLtGetProperty)>(
      dlsym(lib, "cusparseLtGetProperty"));
  int major = -1, minor = -1, patch = -1;
  if (!get_property || get_property(MAJOR_VERSION, &major) != CUSPARSE_STATUS_SUCCESS ||
      get_property(MINOR_VERSION, &minor) != CUSPARSE_STATUS_SUCCESS ||
      get_property(PATCH_LEVEL, &patch) != CUSPARSE_STATUS_SUCCESS) {
    a.error = "cuSPARSELt at " + where + " does not report its version (cusparseLtGetProperty); " +
              "the 2:4 kernels need 0." + std::to_string(kernel_choice::kCusparseltMinMinor) +
              " or a later 0.x";
    return a;
  }
  a.error = kernel_choice::cusparselt_version_error(major, minor, patch, where);
  if (!a.error.empty()) return a;
#define DLREC_RESOLVE(name)                                                                   \
  a.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));                            \
  if (!a.name) {                                                                              \
    a.error = "cuSPARSELt at " + where + " (version " + std::to_string(major) + "." +         \
              std::to_string(minor) + "." + std::to_string(patch) + ") lacks " #name;         \
    return a;                                                                                 \
  }
  DLREC_CUSPARSELT_FNS(DLREC_RESOLVE)
#undef DLREC_RESOLVE
  return a;  // the library stays loaded for the process
}

const Api& api() {
  static const Api a = load_api();
  return a;
}

#define DLREC_SPL_CHECK(expr)                                                                   \
  do {                                                                                          \
    const cusparseStatus_t _s = (expr);                                                         \
    if (_s != CUSPARSE_STATUS_SUCCESS)                                                          \
      ::dlrec::fail("cuSPARSELt: ", api().cusparseLtGetErrorString(_s), " (", int(_s), ") in ", \
                    #expr);                                                                     \
  } while (0)

cudaDataType_t cuda_type(Type t) {
  switch (t) {
    case Type::BF16:
      return CUDA_R_16BF;
    case Type::FP16:
      return CUDA_R_16F;
    case Type::INT8:
      return CUDA_R_8I;
  }
  return CUDA_R_32F;
}

// `n` bytes on the current device, owned (the engine's allocation); undefined for n == 0.
Tensor device_bytes(size_t n) {
  if (n == 0) return Tensor();
  int dev = 0;
  DLREC_CUDA_CHECK(cudaGetDevice(&dev));
  return Tensor::empty({static_cast<int64_t>(n)}, DType::U8, Device::cuda(dev));
}

constexpr uint32_t kAlign = 16;
constexpr cusparseOperation_t kOpA = CUSPARSE_OPERATION_NON_TRANSPOSE;
constexpr cusparseOperation_t kOpB = CUSPARSE_OPERATION_TRANSPOSE;

}  // namespace

bool available(std::string* why) {
  const Api& a = api();
  if (!a.error.empty()) {
    if (why) *why = a.error;
    return false;
  }
  return true;
}

// The operands as cuSPARSELt sees them:
//   D [out, batch] = A [out, in] * op(B) [in, batch]
//   A = W, row-major [out, in], untransposed (2:4 along its rows: along `in`);
//   B = X, row-major [batch, in], transposed;
//   D = Y^T as a column-major [out, batch], which is Y row-major [batch, out].
// (The form PyTorch uses; the all-column-major "TN" form of the same product was not kept.)
struct Gemm24::State {
  cusparseLtHandle_t handle{};
  cusparseLtMatDescriptor_t a{};  // the structured weight
  bool handle_ok = false, a_ok = false;
  ~State() {
    if (a_ok) api().cusparseLtMatDescriptorDestroy(&a);
    if (handle_ok) api().cusparseLtDestroy(&handle);
  }
};

struct Gemm24::Plan {
  cusparseLtMatDescriptor_t b{}, d{};
  cusparseLtMatmulDescriptor_t mm{};
  cusparseLtMatmulAlgSelection_t alg{};
  cusparseLtMatmulPlan_t plan{};
  bool b_ok = false, d_ok = false, alg_ok = false, plan_ok = false;
  Tensor workspace;  // device bytes (none when the plan needs none)
  ~Plan() {
    const Api& a = api();
    if (plan_ok) a.cusparseLtMatmulPlanDestroy(&plan);
    if (alg_ok) a.cusparseLtMatmulAlgSelectionDestroy(&alg);
    if (d_ok) a.cusparseLtMatDescriptorDestroy(&d);
    if (b_ok) a.cusparseLtMatDescriptorDestroy(&b);
  }
};

Gemm24::Gemm24(int64_t out, int64_t in, Type type, Layout layout, bool int8_to_bf16)
    : out_(out),
      in_(in),
      type_(type),
      int8_to_bf16_(int8_to_bf16),
      layout_(layout),
      s_(std::make_unique<State>()) {
  std::string why;
  if (!available(&why)) fail("2:4 sparse GEMM: ", why);
  DLREC_CHECK(out > 0 && in > 0, "2:4 sparse GEMM: bad shape [", out, ", ", in, "]");
  DLREC_CHECK(!int8_to_bf16 || type == Type::INT8, "2:4 sparse GEMM: a bf16 output of int8 ",
              "operands asked for ", type_name(type), " operands");
  DLREC_CHECK(in % 4 == 0, "2:4 sparse GEMM: the reduction size ", in,
              " is not a multiple of 4, so 2:4 groups do not tile it");
  const Api& a = api();
  DLREC_SPL_CHECK(a.cusparseLtInit(&s_->handle));
  s_->handle_ok = true;
  DLREC_SPL_CHECK(a.cusparseLtStructuredDescriptorInit(&s_->handle, &s_->a, out, in, in, kAlign,
                                                       cuda_type(type), CUSPARSE_ORDER_ROW,
                                                       CUSPARSELT_SPARSITY_50_PERCENT));
  s_->a_ok = true;
}

Gemm24::~Gemm24() {
  plans_.clear();
}

void Gemm24::set_weight(const void* w, cudaStream_t stream) {
  const Api& a = api();
  // The pattern is checked here, on the host, once per load: every group of 4 along `in` holds
  // at least 2 zeros (+0 or -0). Compression would silently drop values of any other weight.
  const size_t elem = type_ == Type::INT8 ? 1 : 2;
  std::vector<uint8_t> host(static_cast<size_t>(out_ * in_) * elem);
  DLREC_CUDA_CHECK(cudaMemcpyAsync(host.data(), w, host.size(), cudaMemcpyDeviceToHost, stream));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t r = 0; r < out_; ++r)
    for (int64_t g = 0; g < in_; g += 4) {
      int zeros = 0;
      for (int64_t j = g; j < g + 4; ++j) {
        const uint8_t* v = &host[static_cast<size_t>(r * in_ + j) * elem];
        zeros += elem == 1 ? v[0] == 0 : (v[0] == 0 && (v[1] & 0x7f) == 0);
      }
      DLREC_CHECK(zeros >= 2, "2:4 sparse GEMM: the weight [", out_, ", ", in_, "] is not 2:4 ",
                  "sparse along its input dimension: row ", r, ", columns ", g, "-", g + 3,
                  " hold ", 4 - zeros, " non-zeros (prune it first)");
    }
  size_t bytes = 0, buffer_bytes = 0;
  DLREC_SPL_CHECK(a.cusparseLtSpMMACompressedSize2(&s_->handle, &s_->a, &bytes, &buffer_bytes));
  compressed_ = device_bytes(bytes);
  const Tensor buffer = device_bytes(buffer_bytes);
  const cusparseStatus_t cst = a.cusparseLtSpMMACompress2(
      &s_->handle, &s_->a, 1, kOpA, w, compressed_.raw(), buffer_bytes ? buffer.raw() : nullptr,
      stream);
  const cudaError_t ce = cudaStreamSynchronize(stream);
  DLREC_SPL_CHECK(cst);
  DLREC_CUDA_CHECK(ce);
  compressed_bytes_ = bytes;
}

void Gemm24::prune(void* w, cudaStream_t stream) {
  DLREC_SPL_CHECK(api().cusparseLtSpMMAPrune2(&s_->handle, &s_->a, 1, kOpA, w, w,
                                              CUSPARSELT_PRUNE_SPMMA_STRIP, stream));
  DLREC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

Gemm24::Plan& Gemm24::plan(int64_t batch, const void* x, void* y, cudaStream_t stream) {
  auto it = plans_.find(batch);
  if (it != plans_.end()) return *it->second;
  DLREC_CHECK(plans_.size() < kMaxPlans, "2:4 sparse GEMM [", out_, ", ", in_, "]: a plan for ",
              "batch ", batch, " would be the ", kMaxPlans + 1, "th; plans are kept (captured ",
              "graphs use them) for at most ", kMaxPlans, " distinct batch sizes");
  const Api& a = api();
  auto p = std::make_unique<Plan>();
  const cudaDataType_t t = cuda_type(type_);
  // B = X^T [in, batch] (feature-major input, untransposed) or X [batch, in] (transposed);
  // D = Y^T [out, batch] row-major (feature-major output) or Y [batch, out] (column-major D).
  const bool in_fm = layout_ == Layout::FeatureMajor, out_fm = layout_ != Layout::RowMajor;
  DLREC_SPL_CHECK(a.cusparseLtDenseDescriptorInit(&s_->handle, &p->b, in_fm ? in_ : batch,
                                                  in_fm ? batch : in_, in_fm ? batch : in_, kAlign,
                                                  t, CUSPARSE_ORDER_ROW));
  p->b_ok = true;
  DLREC_SPL_CHECK(a.cusparseLtDenseDescriptorInit(
      &s_->handle, &p->d, out_, batch, out_fm ? batch : out_, kAlign,
      int8_to_bf16_ ? CUDA_R_16BF : t, out_fm ? CUSPARSE_ORDER_ROW : CUSPARSE_ORDER_COL));
  p->d_ok = true;
  const cusparseComputeType compute =
      type_ == Type::INT8 ? CUSPARSE_COMPUTE_32I : CUSPARSE_COMPUTE_32F;
  DLREC_SPL_CHECK(a.cusparseLtMatmulDescriptorInit(&s_->handle, &p->mm, kOpA,
                                                   in_fm ? CUSPARSE_OPERATION_NON_TRANSPOSE : kOpB,
                                                   &s_->a, &p->b, &p->d, &p->d, compute));
  // The epilogue (set_epilogue): set on the matmul descriptor before the plan is made from it.
  if (epi_.relu) {
    const int on = 1;
    DLREC_SPL_CHECK(a.cusparseLtMatmulDescSetAttribute(&s_->handle, &p->mm,
                                                       CUSPARSELT_MATMUL_ACTIVATION_RELU, &on,
                                                       sizeof on));
  }
  if (epi_.bias) {
    const void* bias = epi_.bias;
    DLREC_SPL_CHECK(a.cusparseLtMatmulDescSetAttribute(&s_->handle, &p->mm,
                                                       CUSPARSELT_MATMUL_BIAS_POINTER, &bias,
                                                       sizeof bias));
  }
  if (epi_.alpha_vec) {
    const int on = 1;
    DLREC_SPL_CHECK(a.cusparseLtMatmulDescSetAttribute(&s_->handle, &p->mm,
                                                       CUSPARSELT_MATMUL_ALPHA_VECTOR_SCALING,
                                                       &on, sizeof on));
  }
  // The library's default kernel configuration for the shape. Not searched: on cuSPARSELt 0.8
  // (the GPU hosts' copy, PyTorch 2.11's) with an H200, cusparseLtMatmulSearch fails with an
  // internal error, and timing each configuration in turn reaches one whose kernel stops on an
  // illegal instruction, which ends the CUDA context. PyTorch uses the default too.
  DLREC_SPL_CHECK(a.cusparseLtMatmulAlgSelectionInit(&s_->handle, &p->alg, &p->mm,
                                                     CUSPARSELT_MATMUL_ALG_DEFAULT));
  p->alg_ok = true;
  DLREC_SPL_CHECK(a.cusparseLtMatmulPlanInit(&s_->handle, &p->plan, &p->mm, &p->alg));
  p->plan_ok = true;
  size_t ws = 0;
  DLREC_SPL_CHECK(a.cusparseLtMatmulGetWorkspace(&s_->handle, &p->plan, &ws));
  if (ws) p->workspace = device_bytes(ws);
  (void)x;
  (void)y;
  (void)stream;
  Plan& ref = *p;
  plans_.emplace(batch, std::move(p));
  return ref;
}

void Gemm24::set_epilogue(const Epilogue& e) {
  DLREC_CHECK(plans_.empty(), "2:4 sparse GEMM: set_epilogue() after the first run()");
  epi_ = e;
}

void Gemm24::run(const void* x, void* y, int64_t batch, cudaStream_t stream, float alpha) {
  DLREC_CHECK(compressed_.defined(), "2:4 sparse GEMM: run() before set_weight()");
  DLREC_CHECK(batch > 0, "2:4 sparse GEMM: batch ", batch);
  Plan& p = plan(batch, x, y, stream);
  const float zero = 0.f;
  cudaStream_t streams[1] = {stream};
  // With an alpha vector, alpha is its device pointer (beta stays the host scalar 0).
  const void* a = epi_.alpha_vec ? static_cast<const void*>(epi_.alpha_vec) : &alpha;
  DLREC_SPL_CHECK(api().cusparseLtMatmul(&s_->handle, &p.plan, a, compressed_.raw(), x, &zero, y,
                                         y, p.workspace.defined() ? p.workspace.raw() : nullptr,
                                         streams, 1));
}

#endif  // DLREC_WITH_CUSPARSELT

}  // namespace dlrec::nn::cuda_sparse
