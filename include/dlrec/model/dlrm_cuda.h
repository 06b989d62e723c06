// The DLRM on a CUDA device: the same parameters (names, shapes, initial values from the same
// seed) as the CPU model, trained with CUDA kernels and cuBLAS. Built only when CUDA is
// (DLREC_WITH_CUDA); build_model() dispatches here for Device::cuda(i).
#pragma once

#include <memory>
#include <string>

#include "dlrec/model/model.h"

namespace dlrec::model {

// A model whose training step can run entirely on its device.
class CudaModel : public Model {
 public:
  // forward + BCE loss on the device + backward_and_update, all enqueued on the model's stream:
  // no host synchronisation unless want_loss (then the mean loss of the batch is returned;
  // otherwise NaN). The batch may be reused by the caller as soon as the call returns.
  double train_step(const io::Batch& batch, double lr_scale, bool want_loss) override = 0;
  // Waits for all work the model has enqueued.
  void synchronize() override = 0;
  // Serving: probabilities sigmoid(logits) of the batch's rows into `probs` (host memory).
  // Batches with one id per table and at most 65536 rows run as one CUDA graph per
  // power-of-two bucket of rows (pinned staging, copies, forward and sigmoid captured
  // together; rows beyond the batch are padding); others run eagerly. Blocks until done.
  // Not to be called concurrently with itself or with training on the same model.
  virtual void predict(const io::Batch& batch, float* probs) = 0;
};

// Engine settings of the CUDA DLRM that are not part of a run's config: tests and benchmarks
// set them, build_model() uses the defaults (the measured winners, bench/RESULTS.md).
// make_dlrm_cuda validates them.
struct DlrmCudaOptions {
  // Training steps and predict() chunks as CUDA graph replays; false: every launch eager (what
  // the tests compare the graphs with).
  bool cuda_graphs = true;
  // predict(): rows per graph launch; bigger batches go in chunks of this many rows through two
  // alternating buckets, the host packing one while the GPU runs the other. A power of two in
  // [256, 65536].
  int64_t infer_chunk = 8192;
  // predict(): threads packing chunks of more than 16384 ids; 0: min(8, cores / 2); 1: the
  // calling thread alone. At most 256. The team is per process: the first model that packs on
  // a team sets its size.
  int infer_pack_threads = 0;
  // predict() in bf16/fp16 of 1..infer_fused_rows rows runs the whole forward as one kernel
  // (src/model/infer_small_cuda.h); 0: never. At most 64; from 16 rows on it is no faster than
  // the layer-by-layer path (bench/RESULTS.md), hence 8.
  int64_t infer_fused_rows = 8;
  // That kernel's grid; 0: the device's SM count (also the most it takes). At most 65536.
  int infer_fused_blocks = 0;
};

// Throws dlrec::Error when the device is unusable or the configuration is invalid; a model
// that fails to build releases everything it had created (streams, handles, device memory).
// precision: "fp32" (parity reference), "tf32" (TF32 GEMMs), "bf16" (mixed precision with
// f32 master weights and f32 tables) or "fp16" (bf16's scheme in fp16 with dynamic loss
// scaling: optimizer.loss_scale_init, optimizer.loss_scale_growth_interval); see
// src/model/dlrm_cuda.cu.
std::unique_ptr<CudaModel> make_dlrm_cuda(const ModelConfig& model, const OptimizerConfig& opt,
                                          const io::ShardLayout& layout, Device device,
                                          uint64_t seed, const std::string& precision = "fp32",
                                          const DlrmCudaOptions& options = {});

}  // namespace dlrec::model
