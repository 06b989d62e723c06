#include "fuzz_util.h"

#include <cstring>

#include "dlrec/core/thread_pool.h"

namespace dlrec::fuzz {
bool g_strict_errors = false;
}

// libFuzzer calls this once with its command line (the replay driver does too).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i)
    if (std::strcmp((*argv)[i], "--dlrec-strict-errors") == 0) dlrec::fuzz::g_strict_errors = true;
  // Two threads: the readers' parallel paths run (and ASan/TSan see them) without one thread
  // per core of the fuzzing machine in every process.
  dlrec::set_num_threads(2);
  return 0;
}
