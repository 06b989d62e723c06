// Fuzz target: the tensor file (checkpoints, exported weights): read_tensor_meta, then
// train::load_checkpoint into a small model (every tensor must match; the checkpoint metadata
// is read) and load_tensors of its parameters only with extra tensors allowed (how a model
// directory's weights.dlrec is read).
//
// Input: 1 selector byte, then the file's bytes.
//   bit 0: fix the whole-file CRC-32C before reading (the mutations then reach the header
//          JSON and the tensor index instead of stopping at the checksum)
#include <string>

#include "dlrec/core/file_util.h"
#include "dlrec/train/trainer.h"
#include "fuzz_util.h"
#include "tensor_file_api.h"
#include "tiny_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dlrec;
  fuzz::Bytes in(data, size);
  const uint8_t sel = in.byte();
  std::string bytes(in.rest());
  // Layout: ... | u32 crc32c(everything before it) | "DLRECEND".
  if ((sel & 1) && bytes.size() >= 32) {
    const uint32_t crc = crc32c(bytes.data(), bytes.size() - 12);
    std::memcpy(&bytes[bytes.size() - 12], &crc, 4);
  }
  fuzz::MemFile file(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (!fuzz::guarded("tensor_file", [&] { fuzz::read_tensor_meta(file.path()); })) return 0;
  static std::unique_ptr<model::Model> model = fuzz::tiny_model();
  fuzz::guarded("tensor_file", [&] { train::load_checkpoint(file.path(), *model); });
  fuzz::guarded("tensor_file",
                [&] { fuzz::load_tensors_allow_extra(file.path(), model->parameters()); });
  return 0;
}
