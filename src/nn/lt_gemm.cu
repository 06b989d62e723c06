// cuBLASLt GEMM plans with epilogues; see lt_gemm.h.
#include "nn/lt_gemm.h"

#include <vector>

#include "core/cuda_check.h"

namespace dlrec::nn::cuda_lt {

#define DLREC_LT_CHECK(expr)                                                               \
  do {                                                                                     \
    cublasStatus_t _s = (expr);                                                            \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                       \
      ::dlrec::fail("cuBLASLt error ", static_cast<int>(_s), " in ", #expr, " at ", __FILE__, \
                    ":", __LINE__);                                                        \
  } while (0)

struct Lt::Plan {
  bool ok = false;
  bool tuned = false;
  bool int_scale = false;  // alpha and beta are int32 (int8 GEMMs with an int32 D)
  std::vector<cublasLtMatmulAlgo_t> candidates;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

Lt::Lt(gpu::LtLease lease, bool tune)
    : lease_(std::move(lease)), ws_(lease_.workspace()), ws_bytes_(lease_.workspace_bytes()),
      tune_(tune) {
  DLREC_CHECK(static_cast<bool>(lease_), "cuBLASLt planner: no handle leased");
  handle_ = lease_.handle();
}

Lt::~Lt() { plans_.clear(); }

namespace {
// A matmul preference and timing events that release themselves (plan() and run() throw on
// cuBLASLt and CUDA errors).
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};
struct TimingEvent {
  cudaEvent_t e = nullptr;
  TimingEvent() { DLREC_CUDA_CHECK(cudaEventCreate(&e)); }
  ~TimingEvent() {
    if (e) cudaEventDestroy(e);
  }
};
}  // namespace

namespace {
cublasLtEpilogue_t to_lt(Epi e) {
  switch (e) {
    case Epi::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epi::ReluAuxBias: return CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    case Epi::DRelu: return CUBLASLT_EPILOGUE_DRELU;
    case Epi::BGradB: return CUBLASLT_EPILOGUE_BGRADB;
    case Epi::ReluBias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epi::None: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
}  // namespace

Lt::Plan* Lt::plan(const Gemm& g) {
  auto it = plans_.find(g.key());
  if (it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  // int8 operands take the integer tensor cores: int32 accumulation, and either an int32 D
  // (scale type int32) or an int8 D requantized by the float alpha (scale type float).
  const bool int8 = g.ab_type == CUDA_R_8I;
  const cudaDataType_t scale = int8 && g.d_type == CUDA_R_32I ? CUDA_R_32I : CUDA_R_32F;
  DLREC_LT_CHECK(cublasLtMatmulDescCreate(&p->desc, int8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                          scale));
  p->int_scale = scale == CUDA_R_32I;
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const cublasLtEpilogue_t epi = to_lt(g.epi);
  DLREC_LT_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (g.sm_target > 0) {
    const int32_t sms = g.sm_target;
    DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                  &sms, sizeof sms));
  }
  if (g.alpha_vector) {
    DLREC_CHECK(!g.accumulate_c, "cuBLASLt GEMM: an alpha vector takes no C operand (beta 0)");
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
    DLREC_LT_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm));
  }
  if (g.bias_f32) {
    const cudaDataType_t bt = CUDA_R_32F;
    DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                  &bt, sizeof bt));
  }
  if (g.epi == Epi::ReluAuxBias || g.epi == Epi::DRelu) {
    const int64_t ld = g.aux_ld;
    DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &ld, sizeof ld));
  }
  // Rows x columns of the stored (untransposed) matrices.
  const uint64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
  const uint64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  DLREC_LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, g.ab_type, ar, ac, g.lda));
  DLREC_LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, g.ab_type, br, bc, g.ldb));
  DLREC_LT_CHECK(cublasLtMatrixLayoutCreate(&p->d, g.d_type, g.m, g.n, g.ldd));
  Preference pref;
  DLREC_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  DLREC_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes_, sizeof ws_bytes_));
  constexpr int kMax = 8;
  cublasLtMatmulHeuristicResult_t res[kMax] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d,
                                                           p->d, pref.p, kMax, res, &found);
  if (st == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(res[i].algo);
  p->ok = !p->candidates.empty();
  if (p->ok) p->algo = p->candidates.front();
  else ++unsupported_;
  // Without tuning: the heuristic's first choice instead of timing the candidates.
  p->tuned = p->candidates.size() < 2 || !tune_;
  Plan* raw = p.get();
  plans_.emplace(g.key(), std::move(p));
  return raw;
}

bool Lt::supported(const Gemm& g) { return plan(g)->ok; }

bool Lt::run(const Gemm& g, const void* A, const void* B, void* D, const void* vec, void* aux,
             cudaStream_t stream, const void* C, float alpha, const float* alpha_dev) {
  Plan* p = plan(g);
  if (!p->ok) return false;
  DLREC_CHECK(!g.accumulate_c || (C != nullptr && C != D),
              "cuBLASLt GEMM: accumulate_c needs a C operand distinct from D");
  // C has D's type and layout (p->d); without accumulate_c it is D itself, scaled by 0.
  const void* c = g.accumulate_c ? C : D;
  DLREC_CHECK(!g.alpha_vector || alpha_dev != nullptr,
              "cuBLASLt GEMM: an alpha-vector plan run without its vector");
  if (g.epi == Epi::Bias || g.epi == Epi::ReluAuxBias || g.epi == Epi::BGradB ||
      g.epi == Epi::ReluBias)
    DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &vec, sizeof vec));
  if (g.epi == Epi::ReluAuxBias || g.epi == Epi::DRelu)
    DLREC_LT_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
  const float one = 1.f, zero = 0.f;
  const int32_t ione = 1, izero = 0, ialpha = static_cast<int32_t>(alpha);
  DLREC_CHECK(!p->int_scale || static_cast<float>(ialpha) == alpha,
              "cuBLASLt GEMM: an int32 output takes an integer alpha, not ", alpha);
  const void* a_scale = g.alpha_vector ? static_cast<const void*>(alpha_dev)
                        : p->int_scale ? static_cast<const void*>(&ialpha)
                                       : &alpha;
  const void* beta = p->int_scale ? static_cast<const void*>(g.accumulate_c ? &ione : &izero)
                                  : static_cast<const void*>(g.accumulate_c ? &one : &zero);
  if (!p->tuned) {
    // First use of the plan, on the real operands (every epilogue here is idempotent: D, the
    // bias gradient and the ReLU mask are overwritten, C != D is only read): time each
    // candidate, keep the fastest.
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    DLREC_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap == cudaStreamCaptureStatusNone) {
      TimingEvent t0, t1;
      const cudaEvent_t e0 = t0.e, e1 = t1.e;
      float best = 1e30f;
      for (const auto& algo : p->candidates) {
        bool good = true;
        for (int rep = 0; rep < 3 && good; ++rep) {
          if (rep == 1) DLREC_CUDA_CHECK(cudaEventRecord(e0, stream));
          good = cublasLtMatmul(handle_, p->desc, a_scale, A, p->a, B, p->b, beta, c, p->d, D,
                                p->d, &algo, ws_, ws_bytes_, stream) == CUBLAS_STATUS_SUCCESS;
        }
        if (!good) continue;
        DLREC_CUDA_CHECK(cudaEventRecord(e1, stream));
        DLREC_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        DLREC_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) {
          best = ms;
          p->algo = algo;
        }
      }
      p->tuned = true;
    }
  }
  DLREC_LT_CHECK(cublasLtMatmul(handle_, p->desc, a_scale, A, p->a, B, p->b, beta, c, p->d, D, p->d,
                                &p->algo, ws_, ws_bytes_, stream));
  return true;
}

}  // namespace dlrec::nn::cuda_lt
