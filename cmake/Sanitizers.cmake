# Sanitizer and fuzzing builds (docs/FUZZING.md).
#
#   -DDLREC_SANITIZE=address,undefined   instrument every target with these sanitizers
#                                         (address, undefined, thread, leak; comma-separated)
#   -DDLREC_FUZZ=ON                       also build the libFuzzer targets in fuzz/ (clang only);
#                                         the libraries get coverage instrumentation
#
# Without DLREC_FUZZ the targets in fuzz/ still build, each with a small main that replays the
# files given on its command line (fuzz/replay_main.cc): the seed-corpus replay test then runs
# in every build, so the targets cannot rot where clang is absent.
#
# A sanitizer finding must stop the program (CI fails on it): scripts/ci-sanitizers.sh and
# scripts/fuzz-campaign.sh run with halt_on_error=1 for ASan, UBSan and TSan.
set(DLREC_SANITIZE "" CACHE STRING
    "Sanitizers for every target, comma-separated: address, undefined, thread, leak")
option(DLREC_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

set(DLREC_SANITIZE_FLAGS "")
if(DLREC_SANITIZE)
  string(REPLACE "," ";" _sanitizers "${DLREC_SANITIZE}")
  foreach(s ${_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "DLREC_SANITIZE: unknown sanitizer '${s}' "
                          "(valid: address, undefined, thread, leak)")
    endif()
  endforeach()
  if("thread" IN_LIST _sanitizers AND ("address" IN_LIST _sanitizers OR "leak" IN_LIST _sanitizers))
    message(FATAL_ERROR "DLREC_SANITIZE: thread cannot be combined with address or leak")
  endif()
  if(DLREC_WITH_CUDA)
    message(FATAL_ERROR "DLREC_SANITIZE needs a CPU-only build (-DDLREC_CUDA=OFF)")
  endif()
  string(REPLACE ";" "," _list "${_sanitizers}")
  list(APPEND DLREC_SANITIZE_FLAGS -fsanitize=${_list} -fno-omit-frame-pointer)
  # UBSan checks stay recoverable in the code (a finding can be suppressed at run time while
  # it is investigated); the scripts run with UBSAN_OPTIONS=halt_on_error=1 and no
  # suppressions, so every finding stops the program (non-zero exit).
  foreach(f ${DLREC_SANITIZE_FLAGS})
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${f}>)
  endforeach()
  add_link_options(${DLREC_SANITIZE_FLAGS})
  message(STATUS "dlrec: sanitizers ${_list}")
endif()

if(DLREC_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DLREC_FUZZ=ON needs clang (e.g. -DCMAKE_CXX_COMPILER=clang++-14; "
                        "scripts/install-deps.sh installs clang-14 and libclang-rt-14-dev)")
  endif()
  if(DLREC_WITH_CUDA)
    message(FATAL_ERROR "DLREC_FUZZ needs a CPU-only build (-DDLREC_CUDA=OFF)")
  endif()
  # Coverage instrumentation for everything (libFuzzer's main links only into fuzz targets).
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  message(STATUS "dlrec: libFuzzer targets enabled")
endif()
