# The Python package's extension module, smelt._smelt (python/src/smelt_ext.cpp,
# nanobind).  Included from the top CMakeLists.txt only when scikit-build-core
# drives the build (`pip install .`, `pip wheel .`; SKBUILD is defined), so
# the normal build (scripts/setup.sh) never needs a C++ compiler or Python
# headers.  The module links libsmelt and libsmelt_runtime statically; only
# the "python" install component goes into the wheel (pyproject.toml).
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)

find_package(Python 3.8 REQUIRED COMPONENTS Interpreter Development.Module)
if(NOT nanobind_DIR)
  execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
    OUTPUT_VARIABLE nanobind_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
find_package(nanobind CONFIG REQUIRED)

# The top file's warning flags are meant for C (-Wstrict-prototypes and
# -Wmissing-prototypes are C-only) and should not reach nanobind's own
# sources: restrict what this directory gives new targets to C, and give the
# extension its own C++ warnings below.
get_directory_property(_smelt_dir_opts COMPILE_OPTIONS)
set(_smelt_c_opts "")
foreach(_o ${_smelt_dir_opts})
  list(APPEND _smelt_c_opts "$<$<COMPILE_LANGUAGE:C>:${_o}>")
endforeach()
set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_smelt_c_opts}")

nanobind_add_module(_smelt NB_STATIC ${CMAKE_SOURCE_DIR}/python/src/smelt_ext.cpp)
target_include_directories(_smelt PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(_smelt PRIVATE smelt_compiler_static)
# (no -Wshadow: nanobind's headers are not written for it)
target_compile_options(_smelt PRIVATE -Wall -Wextra $<$<BOOL:${SMELT_WERROR}>:-Werror>)
# smelt's own symbols stay inside the module
target_link_options(_smelt PRIVATE -Wl,--exclude-libs,ALL)
install(TARGETS _smelt LIBRARY DESTINATION smelt COMPONENT python)
