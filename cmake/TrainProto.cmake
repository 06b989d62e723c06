# The protobuf messages the train module writes: TensorBoard event files
# (src/train/proto/tensorboard_event.proto) and ONNX models (src/train/proto/onnx_model.proto),
# generated with Debian's protoc (protobuf-compiler, libprotobuf-dev; scripts/install-deps.sh).
find_package(Protobuf REQUIRED)
if(NOT Protobuf_PROTOC_EXECUTABLE)
  message(FATAL_ERROR "protoc not found (apt-get install protobuf-compiler; scripts/install-deps.sh)")
endif()
set(_tp_dir ${CMAKE_SOURCE_DIR}/src/train/proto)
set(_tp_gen ${CMAKE_BINARY_DIR}/generated/train)
file(MAKE_DIRECTORY ${_tp_gen})
set(_tp_srcs)
foreach(_p tensorboard_event onnx_model)
  add_custom_command(
    OUTPUT ${_tp_gen}/${_p}.pb.cc ${_tp_gen}/${_p}.pb.h
    COMMAND ${Protobuf_PROTOC_EXECUTABLE} --proto_path=${_tp_dir} --cpp_out=${_tp_gen}
            ${_tp_dir}/${_p}.proto
    DEPENDS ${_tp_dir}/${_p}.proto
    COMMENT "Generating C++ from ${_p}.proto"
    VERBATIM)
  list(APPEND _tp_srcs ${_tp_gen}/${_p}.pb.cc)
endforeach()
add_library(dlrec_train_proto STATIC ${_tp_srcs})
target_compile_options(dlrec_train_proto PRIVATE -w)  # generated code is not ours to warn about
target_include_directories(dlrec_train_proto PUBLIC ${_tp_gen})
target_link_libraries(dlrec_train_proto PUBLIC protobuf::libprotobuf)
