# SPDX-License-Identifier: BSD-3-Clause
# Installs the built lucid_amp into WORK_DIR/prefix, checks the installed export, and
# builds and runs tests/consumer against the package. Inputs as common.cmake, and:
# BUILD_DIR (the build under test), SOURCE_DIR (tests/consumer), CXX_FLAGS.
cmake_policy(VERSION 3.24)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)

# The export names LibTorch's target `torch` (found again by the package config through
# find_dependency(Torch)), never a library file by its path.
file(GLOB_RECURSE targets_file ${WORK_DIR}/prefix/*/lucid_ampTargets.cmake)
file(READ "${targets_file}" exported)
string(REGEX MATCH "INTERFACE_LINK_LIBRARIES \"[^\"]*\"" lucid_amp_links "${exported}")
message("installed export: lucid_amp::lucid_amp ${lucid_amp_links}")
if(NOT lucid_amp_links MATCHES "\"torch[;\"]")
  message(FATAL_ERROR "the installed export does not link `torch`: ${lucid_amp_links}")
endif()
if(exported MATCHES "/[^/\"; ]+\\.(so|a|dylib)([.\"; ]|$)")
  message(FATAL_ERROR "the installed export names a library file: ${CMAKE_MATCH_0}")
endif()
file(GLOB_RECURSE version_h ${WORK_DIR}/prefix/*/lucid/amp/version.h)
if(NOT version_h)
  message(FATAL_ERROR "lucid/amp/version.h was not installed")
endif()

run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build ${consumer_args}
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
