# Dependencies come from Debian's packages only (see README).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
# BLAS: OpenBLAS (pthreads build) from libopenblas-dev; cblas.h comes with it.
find_library(DLREC_OPENBLAS NAMES openblas REQUIRED)
find_path(DLREC_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include REQUIRED)
add_library(dlrec_blas INTERFACE)
target_link_libraries(dlrec_blas INTERFACE ${DLREC_OPENBLAS})
target_include_directories(dlrec_blas INTERFACE ${DLREC_CBLAS_INCLUDE})
set(DLREC_BLAS_LIBS dlrec_blas)
