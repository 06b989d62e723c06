# MPI (Open MPI from Debian: openmpi-bin libopenmpi-dev) for training across processes, and NCCL
# (with CUDA) for the GPUs. Both optional: without MPI, dlrec trains as a single process only.
set(DLREC_WITH_MPI OFF)
if(NOT DLREC_MPI STREQUAL "OFF")
  set(MPI_CXX_SKIP_MPICXX ON)  # the C API only (the C++ bindings are deprecated)
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(DLREC_WITH_MPI ON)
    message(STATUS "dlrec: MPI ${MPI_CXX_VERSION} (${MPI_CXX_LIB_NAMES}); mpiexec: ${MPIEXEC_EXECUTABLE}")
  elseif(DLREC_MPI STREQUAL "ON")
    message(FATAL_ERROR "DLREC_MPI=ON but MPI was not found (Debian: openmpi-bin libopenmpi-dev)")
  else()
    message(STATUS "dlrec: MPI not found: training across processes is not built")
  endif()
endif()

set(DLREC_WITH_NCCL OFF)
if(DLREC_WITH_CUDA)
  find_path(DLREC_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(DLREC_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib
               /usr/local/cuda/lib64)
  if(DLREC_NCCL_INCLUDE AND DLREC_NCCL_LIB)
    set(DLREC_WITH_NCCL ON)
    message(STATUS "dlrec: NCCL ${DLREC_NCCL_LIB}")
  else()
    message(STATUS "dlrec: NCCL not found: GPU training across ranks is not built")
  endif()
endif()

# Links the dist module against what was found; the defines are private to it (callers ask
# dist::mpi_built() / nccl_built()).
function(dlrec_dist_link target)
  if(DLREC_WITH_MPI)
    target_link_libraries(${target} PUBLIC MPI::MPI_CXX)
    target_compile_definitions(${target} PRIVATE DLREC_WITH_MPI=1
                               DLREC_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  endif()
  if(DLREC_WITH_NCCL)
    target_include_directories(${target} PRIVATE ${DLREC_NCCL_INCLUDE})
    target_link_libraries(${target} PUBLIC ${DLREC_NCCL_LIB})
    target_compile_definitions(${target} PRIVATE DLREC_WITH_NCCL=1)
  endif()
endfunction()
