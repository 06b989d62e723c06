# Dependencies come from Debian's packages only (see README).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
# BLAS: OpenBLAS. cblas.h comes with libopenblas-dev (the pthreads build's headers); the library
# linked is the single-threaded build (libopenblas0-serial) where it is installed: dlrec calls
# BLAS from its own threads, one GEMM per thread (src/nn/linear.cc), and the pthreads build starts
# one thread per core when it is loaded, each spinning in the kernel before it sleeps: on a
# 64-core host that was ~7 CPU-seconds of every dlrec process (`--help` included; docs/ETL.md).
# Both builds have the soname libopenblas.so.0; the serial one is found through the build RPATH
# that CMake records for a library linked by its full path outside the default directories.
find_library(DLREC_OPENBLAS NAMES libopenblas.so.0 openblas
             PATHS /usr/lib/x86_64-linux-gnu/openblas-serial /usr/lib64/openblas-serial
             NO_DEFAULT_PATH)
if(NOT DLREC_OPENBLAS)
  find_library(DLREC_OPENBLAS NAMES openblas REQUIRED)
  message(STATUS "dlrec: single-threaded OpenBLAS (libopenblas0-serial) not found; linking "
                 "${DLREC_OPENBLAS}, whose threads (one per core) start with every process")
endif()
find_path(DLREC_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include REQUIRED)
add_library(dlrec_blas INTERFACE)
target_link_libraries(dlrec_blas INTERFACE ${DLREC_OPENBLAS})
target_include_directories(dlrec_blas INTERFACE ${DLREC_CBLAS_INCLUDE})
set(DLREC_BLAS_LIBS dlrec_blas)
