# CUTLASS (header-only; NVIDIA's nvidia-cutlass package on PyPI carries the headers) for the
# fused kernels in src/fused. Found: DLREC_CUTLASS_INCLUDE (or -DDLREC_CUTLASS_INCLUDE=...),
# else the headers of an installed nvidia-cutlass package. Without it, or without CUDA, those
# kernels are not built and the code takes its unfused paths (same results, slower).
set(DLREC_WITH_CUTLASS OFF)
if(DLREC_WITH_CUDA)
  if(NOT DLREC_CUTLASS_INCLUDE)
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND ${Python3_EXECUTABLE} -c
          "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(s.submodule_search_locations[0], 'source', 'include') if s else '')"
        OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      set(DLREC_CUTLASS_INCLUDE "${_cutlass_inc}")
    endif()
  endif()
  if(DLREC_CUTLASS_INCLUDE AND EXISTS "${DLREC_CUTLASS_INCLUDE}/cutlass/cutlass.h")
    set(DLREC_WITH_CUTLASS ON)
  endif()
endif()
message(STATUS "dlrec: CUTLASS ${DLREC_WITH_CUTLASS} ${DLREC_CUTLASS_INCLUDE}")

# dlrec_cutlass: the CUTLASS kernels of src/fused, for sm_90a (Hopper wgmma/TMA; these
# kernels run on H100/H200 only and decline elsewhere). Linked into dlrec_nn, which then sees
# DLREC_WITH_CUTLASS=1.
function(dlrec_cutlass_module)
  if(NOT DLREC_WITH_CUTLASS)
    return()
  endif()
  file(GLOB _cu CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/fused/*.cu)
  add_library(dlrec_cutlass STATIC ${_cu})
  set_target_properties(dlrec_cutlass PROPERTIES CUDA_ARCHITECTURES 90a)
  target_include_directories(dlrec_cutlass PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_include_directories(dlrec_cutlass SYSTEM PRIVATE ${DLREC_CUTLASS_INCLUDE})
  # NDEBUG: CUTLASS's device asserts would serialize the wgmma pipeline.
  target_compile_definitions(dlrec_cutlass PRIVATE NDEBUG)
  target_compile_definitions(dlrec_cutlass PUBLIC DLREC_WITH_CUTLASS=1)
  target_link_libraries(dlrec_cutlass PUBLIC CUDA::cudart)
endfunction()
