# cuSPARSELt (NVIDIA's 2:4 sparse tensor-core GEMMs; the nvidia-cusparselt-cu13 wheel on PyPI
# carries the header and the library) for src/nn/gemm_2_4_cuda.cu. Only the header is needed to
# build: the library is loaded at run time (dlopen), so binaries never depend on its 240 MB
# and run without it; the sparse path then says what is missing. Found: -DDLREC_CUSPARSELT_ROOT=
# (a folder with include/cusparseLt.h and lib/libcusparseLt.so.0), else the installed wheel.
# dlrec_cusparselt_link(target) gives the target DLREC_WITH_CUSPARSELT=1, the include folder
# and the library path found here (tried after the loader's own path).
set(DLREC_WITH_CUSPARSELT OFF)
if(DLREC_WITH_CUDA)
  if(NOT DLREC_CUSPARSELT_ROOT)
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND ${Python3_EXECUTABLE} -c
          "import importlib.util, os; s = importlib.util.find_spec('nvidia'); print(next((os.path.join(p, d) for p in (s.submodule_search_locations if s else []) for d in ('cusparselt', 'cu13') if os.path.exists(os.path.join(p, d, 'include', 'cusparseLt.h'))), ''))"
        OUTPUT_VARIABLE _spl_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      set(DLREC_CUSPARSELT_ROOT "${_spl_root}")
    endif()
  endif()
  if(DLREC_CUSPARSELT_ROOT AND EXISTS "${DLREC_CUSPARSELT_ROOT}/include/cusparseLt.h")
    set(DLREC_WITH_CUSPARSELT ON)
  endif()
endif()
message(STATUS "dlrec: cuSPARSELt ${DLREC_WITH_CUSPARSELT} ${DLREC_CUSPARSELT_ROOT}")

function(dlrec_cusparselt_link target)
  if(NOT DLREC_WITH_CUSPARSELT)
    return()
  endif()
  set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/nn/gemm_2_4_cuda.cu APPEND PROPERTY
               COMPILE_DEFINITIONS DLREC_WITH_CUSPARSELT=1
               DLREC_CUSPARSELT_LIB="${DLREC_CUSPARSELT_ROOT}/lib/libcusparseLt.so.0")
  target_include_directories(${target} SYSTEM PRIVATE ${DLREC_CUSPARSELT_ROOT}/include)
  target_link_libraries(${target} PUBLIC ${CMAKE_DL_LIBS})
endfunction()
