# The Python package (docs/PYTHON.md): the extension module dlrec._dlrec, built from python/src
# against the static libraries when pybind11 (Debian's pybind11-dev, or PyPI's) is found, so
# that `make test` tests it (tests/python/test_package*.py) without a second build. The build
# tree gets a ready-to-import package in <build>/python/dlrec (the .py files copied beside the
# module); `pip install .` (pyproject.toml, scikit-build-core) installs the module's component.
# dlrec.torch's engine (docs/PYTHON.md, "dlrec.torch"): a C ABI shared library (src/python/
# torch_abi.*, extern "C" functions on raw pointers and a CUDA stream) that python/dlrec/torch.py
# loads with ctypes, so it serves any Python version and needs no torch at build time. With CUDA
# it holds the CUDA collection too. Static libraries' symbols stay inside it (--exclude-libs), so
# that they cannot clash with a process's other copies (PyTorch's).
set(_dlrec_torch_srcs ${CMAKE_SOURCE_DIR}/src/python/torch_abi.cc)
if(DLREC_WITH_CUDA)
  list(APPEND _dlrec_torch_srcs ${CMAKE_SOURCE_DIR}/src/python/torch_abi_cuda.cu)
endif()
add_library(dlrec_torch SHARED ${_dlrec_torch_srcs})
target_include_directories(dlrec_torch PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(dlrec_torch PRIVATE dlrec_nn)
target_link_options(dlrec_torch PRIVATE -Wl,--exclude-libs,ALL)
set_target_properties(dlrec_torch PROPERTIES LIBRARY_OUTPUT_DIRECTORY
                                             ${CMAKE_BINARY_DIR}/python/dlrec)
install(TARGETS dlrec_torch LIBRARY DESTINATION dlrec COMPONENT python)

find_program(DLREC_PYTHON python3)
if(NOT DEFINED Python_EXECUTABLE AND DLREC_PYTHON)
  set(Python_EXECUTABLE ${DLREC_PYTHON})  # the python3 the tests run under (tests/CMakeLists.txt)
endif()
set(PYBIND11_FINDPYTHON ON)
find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
if(Python_FOUND)
  find_package(pybind11 2.10 CONFIG QUIET)
endif()
if(pybind11_FOUND)
  file(GLOB _dlrec_py_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/src/*.cc)
  pybind11_add_module(_dlrec ${_dlrec_py_srcs})
  target_link_libraries(_dlrec PRIVATE dlrec_train)
  set(_dlrec_py_out ${CMAKE_BINARY_DIR}/python/dlrec)
  set_target_properties(_dlrec PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${_dlrec_py_out})
  file(MAKE_DIRECTORY ${_dlrec_py_out})
  file(GLOB _dlrec_py_files CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/dlrec/*.py)
  foreach(f ${_dlrec_py_files})
    get_filename_component(_name ${f} NAME)
    configure_file(${f} ${_dlrec_py_out}/${_name} COPYONLY)
  endforeach()
  install(TARGETS _dlrec LIBRARY DESTINATION dlrec COMPONENT python)
  message(STATUS "Python package: building dlrec._dlrec for Python ${Python_VERSION}")
else()
  message(STATUS "Python package: pybind11 or Python's headers not found; dlrec._dlrec is not "
                 "built and tests/python/test_package*.py skip")
endif()
