// The C ABI of dlrec's embedding engine for PyTorch (python/dlrec/torch.py loads it with ctypes,
// so one library serves any Python version; docs/PYTHON.md, "dlrec.torch").
//
// A collection holds T tables. A batch of B samples comes as PyTorch's KeyedJaggedTensor does:
// `offsets` [T * B + 1] (int64) into one id array `ids` [nnz] (int64), bag t * B + b holding
// sample b's ids of table t (ids local to the table, or any 64-bit key for a hashed table).
// Pooled rows go to `out` [B, W] (float32, row-major, W = the sum of the tables' widths, table t
// at its column offset). All pointers are host memory for a CPU collection and device memory of
// the collection's GPU for a CUDA one; `stream` is the cudaStream_t to enqueue on (ignored on the
// CPU). Nothing is copied: the caller owns every buffer.
//
// Every function returns 0 on success and -1 on failure, with the message in
// dlrec_emb_last_error() (the calling thread's last error).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLREC_EMB_ABI_VERSION 1

int dlrec_emb_abi_version(void);
int dlrec_emb_has_cuda(void);  // 1 when the library was built with CUDA
const char* dlrec_emb_last_error(void);

// config: JSON text (docs/PYTHON.md lists the keys): {"device": "cpu" | "cuda",
// "device_index": 0, "optimizer": {"kind": "sgd" | "adagrad" | ..., "lr": ..., ...},
// "tables": [{"name": ..., "rows": ..., "dim": ..., "pooling": "sum" | "mean", "seed": ...,
// "hashed": {"capacity": ..., "init_scale": ...}}, ...]}.
int dlrec_emb_create(const char* config_json, void** handle);
void dlrec_emb_destroy(void* handle);
int dlrec_emb_width(void* handle, int64_t* width);

// Pools the batch into out (float32; bfloat16 when out_bf16 != 0, CUDA only: the sums are
// taken in float and rounded once). training != 0 keeps the batch for dlrec_emb_backward (and
// inserts a hashed table's unseen keys); training == 0 pools unknown hashed keys as zeros.
int dlrec_emb_forward(void* handle, const int64_t* offsets, const int64_t* ids, int64_t batch,
                      int64_t nnz, void* out, int out_bf16, void* stream, int training);
// CUDA: the id checks of the last forward run on the device; this waits for the stream and
// fails with the first bad id or offset found (no-op on the CPU, whose forward checks itself).
int dlrec_emb_check(void* handle, void* stream);
// From dL/dout [B, W] (float32, or bfloat16 when dout_bf16 != 0 (CUDA only), rows `ld`
// elements apart, ld >= W) of the last training forward: the fused sparse update of every table
// with learning rate lr. No table gradient is formed.
int dlrec_emb_backward(void* handle, const void* dout, int dout_bf16, int64_t ld, float lr,
                       void* stream);

// Copies a fixed table's weights (which = 0) or optimizer state (which = 1), [rows, S] float32,
// to or from `buf` (device memory of the collection's GPU when on_device, else host memory).
int dlrec_emb_table_size(void* handle, int table, int which, int64_t* rows, int64_t* cols);
int dlrec_emb_read_table(void* handle, int table, int which, float* buf, int on_device,
                         void* stream);
int dlrec_emb_write_table(void* handle, int table, int which, const float* buf, int on_device,
                          void* stream);

#ifdef __cplusplus
}  // extern "C"

#include <memory>
#include <string>
#include <vector>

#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/optimizer.h"

namespace dlrec::torch_abi {

struct TableConfig {
  std::string name;
  int64_t rows = 0;  // fixed: the vocabulary; hashed: the capacity
  int64_t dim = 0;
  nn::Pooling pooling = nn::Pooling::Sum;
  uint64_t seed = 0;
  bool hashed = false;
  float init_scale = 0.f;  // hashed: rows start uniform in [-init_scale, init_scale)
};

struct CollectionConfig {
  bool cuda = false;
  int device_index = 0;
  nn::OptimizerOptions optimizer;
  std::vector<TableConfig> tables;
  int64_t width = 0;
};

// One collection's tables on one device.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int64_t width() const = 0;
  virtual void forward(const int64_t* offsets, const int64_t* ids, int64_t batch, int64_t nnz,
                       void* out, bool out_bf16, void* stream, bool training) = 0;
  virtual void check(void* stream) {}
  virtual void backward(const void* dout, bool dout_bf16, int64_t ld, float lr, void* stream) = 0;
  virtual void table_size(int table, int which, int64_t* rows, int64_t* cols) = 0;
  virtual void copy_table(int table, int which, float* buf, bool on_device, bool read,
                          void* stream) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(const CollectionConfig& config);
// CUDA builds only (torch_abi_cuda.cu); fixed tables, SGD and Adagrad.
std::unique_ptr<Backend> make_cuda_backend(const CollectionConfig& config);

}  // namespace dlrec::torch_abi
#endif
