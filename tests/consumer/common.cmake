# SPDX-License-Identifier: BSD-3-Clause
# Shared by the consumer checks (cmake -P scripts): run() and the configure arguments that
# give an outside project the toolchain and dependencies of the build under test.
#
# Inputs (-D on the check's command line, from tests/CMakeLists.txt): GENERATOR,
# CXX_COMPILER, CXX_LAUNCHER (a compiler cache such as ccache, or empty), TORCH_DIR,
# ZLIB_INCLUDE_DIR and ZLIB_LIBRARY (where zlib is not installed, as on the GPU machine),
# CUDA_COMPILER and CUDA_ARCHITECTURES ('|' for ';'; empty without CUDA).

# Runs a command; prints its output; fails the check when it fails.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${err}")
  endif()
endfunction()

# Only the command line names Torch (where LibTorch is), never the projects themselves.
set(consumer_args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DTorch_DIR=${TORCH_DIR})
if(CXX_LAUNCHER)
  list(APPEND consumer_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
if(ZLIB_INCLUDE_DIR AND ZLIB_LIBRARY)
  list(APPEND consumer_args -DZLIB_INCLUDE_DIR=${ZLIB_INCLUDE_DIR} -DZLIB_LIBRARY=${ZLIB_LIBRARY})
endif()
if(CUDA_COMPILER)
  list(APPEND consumer_args -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
if(CUDA_ARCHITECTURES)
  string(REPLACE "|" "\\;" _archs "${CUDA_ARCHITECTURES}")
  list(APPEND consumer_args "-DCMAKE_CUDA_ARCHITECTURES=${_archs}")
endif()

# Every file under `dir`, relative to it.
function(list_files dir out)
  file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE ${dir} ${dir}/*)
  set(${out} ${files} PARENT_SCOPE)
endfunction()
