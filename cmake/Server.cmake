# The inference server's dependencies, from Debian's packages (scripts/install-deps.sh):
#   gRPC C++ + protobuf (libgrpc++-dev, libprotobuf-dev, protobuf-compiler,
#   protobuf-compiler-grpc) and cpp-httplib (libcpp-httplib-dev).
# Sets DLREC_WITH_SERVER (ON only when all are found) and DLREC_SERVER_LIBS (the generated
# KServe v2 protocol library plus the packages' targets).
set(DLREC_WITH_SERVER OFF)
set(DLREC_SERVER_LIBS "")

find_package(Protobuf QUIET)
find_package(gRPC CONFIG QUIET)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(DLREC_HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
endif()
find_program(DLREC_GRPC_CPP_PLUGIN grpc_cpp_plugin)

set(_missing "")
if(NOT Protobuf_FOUND OR NOT Protobuf_PROTOC_EXECUTABLE)
  list(APPEND _missing "protobuf (libprotobuf-dev, protobuf-compiler)")
endif()
if(NOT gRPC_FOUND)
  list(APPEND _missing "gRPC C++ (libgrpc++-dev)")
endif()
if(NOT DLREC_GRPC_CPP_PLUGIN)
  list(APPEND _missing "grpc_cpp_plugin (protobuf-compiler-grpc)")
endif()
if(NOT DLREC_HTTPLIB_FOUND)
  list(APPEND _missing "cpp-httplib (libcpp-httplib-dev)")
endif()

if(_missing)
  string(REPLACE ";" ", " _m "${_missing}")
  message(STATUS "dlrec serve: not built; missing ${_m} (scripts/install-deps.sh installs them)")
  return()
endif()

set(_proto ${CMAKE_SOURCE_DIR}/src/serve/proto/grpc_service.proto)
set(_gen ${CMAKE_BINARY_DIR}/generated/serve)
file(MAKE_DIRECTORY ${_gen})
set(_gen_srcs ${_gen}/grpc_service.pb.cc ${_gen}/grpc_service.grpc.pb.cc)
set(_gen_hdrs ${_gen}/grpc_service.pb.h ${_gen}/grpc_service.grpc.pb.h)
add_custom_command(
  OUTPUT ${_gen_srcs} ${_gen_hdrs}
  COMMAND ${Protobuf_PROTOC_EXECUTABLE} --proto_path=${CMAKE_SOURCE_DIR}/src/serve/proto
          --cpp_out=${_gen} --grpc_out=${_gen}
          --plugin=protoc-gen-grpc=${DLREC_GRPC_CPP_PLUGIN} ${_proto}
  DEPENDS ${_proto}
  COMMENT "Generating C++ from grpc_service.proto (KServe v2 / Triton gRPC protocol)"
  VERBATIM)
add_library(dlrec_serve_proto STATIC ${_gen_srcs})
# Generated code is not ours to warn about.
target_compile_options(dlrec_serve_proto PRIVATE -w)
target_include_directories(dlrec_serve_proto PUBLIC ${_gen})
target_link_libraries(dlrec_serve_proto PUBLIC gRPC::grpc++ protobuf::libprotobuf)

set(DLREC_WITH_SERVER ON)
set(DLREC_SERVER_LIBS dlrec_serve_proto PkgConfig::DLREC_HTTPLIB)
message(STATUS "dlrec serve: enabled (gRPC ${gRPC_VERSION}, protobuf ${Protobuf_VERSION}, "
               "cpp-httplib ${DLREC_HTTPLIB_VERSION})")
