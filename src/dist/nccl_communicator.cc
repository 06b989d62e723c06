// The NCCL communicator: built in CUDA builds where CMake finds NCCL (DLREC_WITH_NCCL).
#include "dlrec/core/error.h"
#include "dlrec/dist/communicator.h"

namespace dlrec::dist {

#ifndef DLREC_WITH_NCCL
bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int, const CommOptions&) {
  fail("this build of dlrec has no NCCL (it needs a CUDA build with NCCL's headers and library): "
       "GPU training across ranks is not available");
}
#endif

}  // namespace dlrec::dist
