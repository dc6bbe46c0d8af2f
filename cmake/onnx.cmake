# The ONNX frontend (frontend/onnx*.c): ONNX files are protobuf messages,
# read with protobuf-c from code that protoc-c generates at build time from
# the vendored schema third_party/onnx/onnx.proto.
#
# SMELT_ONNX = AUTO (default) builds it when protobuf-c and protoc-c are
# found, ON requires them, OFF leaves it out.  A machine with the protobuf-c
# library but without protoc-c (the GPU machine: scripts/fetch-gpu-deps.sh)
# can name a directory of onnx.pb-c.c/.h generated elsewhere from the same
# onnx.proto: SMELT_ONNX_PB_DIR, holding onnx.proto.sha256 as well, which
# must match the vendored schema.  Without it the importer still
# links and answers ST_UNSUPPORTED ("built without ONNX support ...").
#
# The frontend lives in the compiler library: the object library
# `smelt_compiler_objects` (under libsmelt) since the layout change,
# `smeltcore` before it; the sources go to whichever of them exists.
set(SMELT_ONNX AUTO CACHE STRING "Build the ONNX importer (AUTO: when protobuf-c is found)")
set_property(CACHE SMELT_ONNX PROPERTY STRINGS AUTO ON OFF)

if(TARGET smelt_compiler_objects)
  set(SMELT_ONNX_TARGET smelt_compiler_objects)
elseif(TARGET smeltcore)
  set(SMELT_ONNX_TARGET smeltcore)
elseif(TARGET smelt_compiler_lib)
  set(SMELT_ONNX_TARGET smelt_compiler_lib)
elseif(TARGET smelt)
  get_target_property(_smelt_onnx_type smelt TYPE)
  if(_smelt_onnx_type STREQUAL "EXECUTABLE")
    message(FATAL_ERROR "cmake/onnx.cmake: no compiler library target (smeltcore or smelt) found")
  endif()
  set(SMELT_ONNX_TARGET smelt)
else()
  message(FATAL_ERROR "cmake/onnx.cmake: include it after the compiler library target is defined")
endif()

# The importer's sources always build (they compile to the ST_UNSUPPORTED
# stub without protobuf-c); target_sources ignores a file a glob already added.
file(GLOB SMELT_ONNX_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/frontend/onnx*.c ${CMAKE_SOURCE_DIR}/frontend/model.c)
target_sources(${SMELT_ONNX_TARGET} PRIVATE ${SMELT_ONNX_SOURCES})

set(SMELT_HAVE_ONNX OFF)
if(NOT SMELT_ONNX STREQUAL "OFF")
  find_program(PROTOC_C_EXECUTABLE NAMES protoc-c protoc-gen-c)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(PROTOBUF_C IMPORTED_TARGET libprotobuf-c)
  endif()
  set(SMELT_ONNX_PB_DIR "" CACHE PATH "onnx.pb-c.c/.h generated elsewhere, for a machine without protoc-c")
  set(_onnx_pregen OFF)
  set(_have_protoc OFF)
  if(PROTOC_C_EXECUTABLE AND EXISTS "${PROTOC_C_EXECUTABLE}")
    set(_have_protoc ON)
  endif()
  if(NOT _have_protoc AND PROTOBUF_C_FOUND AND SMELT_ONNX_PB_DIR AND EXISTS ${SMELT_ONNX_PB_DIR}/onnx.pb-c.c)
    file(SHA256 ${CMAKE_SOURCE_DIR}/third_party/onnx/onnx.proto _onnx_sha)
    file(READ ${SMELT_ONNX_PB_DIR}/onnx.proto.sha256 _onnx_pregen_sha)
    string(STRIP "${_onnx_pregen_sha}" _onnx_pregen_sha)
    if(_onnx_sha STREQUAL _onnx_pregen_sha)
      set(_onnx_pregen ON)
    else()
      message(WARNING "SMELT_ONNX_PB_DIR ${SMELT_ONNX_PB_DIR} was generated from another onnx.proto: not used")
    endif()
  endif()
  if((_have_protoc OR _onnx_pregen) AND PROTOBUF_C_FOUND)
    set(SMELT_HAVE_ONNX ON)
  elseif(SMELT_ONNX STREQUAL "ON")
    message(FATAL_ERROR "SMELT_ONNX=ON but protobuf-c was not found: install libprotobuf-c-dev protobuf-c-compiler")
  else()
    message(STATUS "smelt: ONNX importer off (install libprotobuf-c-dev protobuf-c-compiler to build it)")
  endif()
endif()

if(SMELT_HAVE_ONNX)
  set(_onnx_proto ${CMAKE_SOURCE_DIR}/third_party/onnx/onnx.proto)
  set(_onnx_gen ${CMAKE_BINARY_DIR}/onnx_pb)
  file(MAKE_DIRECTORY ${_onnx_gen})
  if(_onnx_pregen)
    configure_file(${SMELT_ONNX_PB_DIR}/onnx.pb-c.c ${_onnx_gen}/onnx.pb-c.c COPYONLY)
    configure_file(${SMELT_ONNX_PB_DIR}/onnx.pb-c.h ${_onnx_gen}/onnx.pb-c.h COPYONLY)
    set(PROTOC_C_EXECUTABLE "pre-generated in ${SMELT_ONNX_PB_DIR}")
  else()
    add_custom_command(
      OUTPUT ${_onnx_gen}/onnx.pb-c.c ${_onnx_gen}/onnx.pb-c.h
      COMMAND ${PROTOC_C_EXECUTABLE} --c_out=${_onnx_gen} -I${CMAKE_SOURCE_DIR}/third_party/onnx ${_onnx_proto}
      DEPENDS ${_onnx_proto}
      COMMENT "protoc-c: generating the ONNX protobuf reader from third_party/onnx/onnx.proto"
      VERBATIM)
  endif()
  target_sources(${SMELT_ONNX_TARGET} PRIVATE ${_onnx_gen}/onnx.pb-c.c)
  # generated code: not held to smelt's warning set
  set_source_files_properties(${_onnx_gen}/onnx.pb-c.c PROPERTIES COMPILE_OPTIONS "-w")
  set_source_files_properties(${SMELT_ONNX_SOURCES} PROPERTIES INCLUDE_DIRECTORIES ${_onnx_gen})
  target_compile_definitions(${SMELT_ONNX_TARGET} PUBLIC SMELT_HAVE_ONNX=1)
  target_link_libraries(${SMELT_ONNX_TARGET} PUBLIC PkgConfig::PROTOBUF_C)
  message(STATUS "smelt: ONNX importer on (protobuf-c ${PROTOBUF_C_VERSION}, ${PROTOC_C_EXECUTABLE})")
endif()
