# Dependencies come from Debian's packages only (see README).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
# BLAS: OpenBLAS (pthreads build) from libopenblas-dev; cblas.h comes with it.
find_library(DLREC_OPENBLAS NAMES openblas REQUIRED)
find_path(DLREC_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include REQUIRED)
# Not linked: src/nn/linear.cc loads libopenblas.so.0 at run time with one thread asked for, so
# that its load-time worker pool (one spinning thread per core) is never created. The library is
# still required here, so that a machine without it fails at configure time.
add_library(dlrec_blas INTERFACE)
target_link_libraries(dlrec_blas INTERFACE ${CMAKE_DL_LIBS})
target_include_directories(dlrec_blas INTERFACE ${DLREC_CBLAS_INCLUDE})
set(DLREC_BLAS_LIBS dlrec_blas)
