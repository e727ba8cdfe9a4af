# SPDX-License-Identifier: BSD-3-Clause
# Configures this checkout as a top-level project with BUILD_TESTING=OFF and GoogleTest
# made unfindable, then reads the targets from CMake's file API: the library targets
# (and `docs` where Doxygen is installed) must be all there is. Inputs as common.cmake,
# and: LUCID_AMP_SOURCE_DIR, WORK_DIR.
cmake_policy(VERSION 3.24)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
file(WRITE ${WORK_DIR}/.cmake/api/v1/query/codemodel-v2 "")
run(${CMAKE_COMMAND} -S ${LUCID_AMP_SOURCE_DIR} -B ${WORK_DIR} ${consumer_args}
    -DBUILD_TESTING=OFF -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)

file(GLOB index ${WORK_DIR}/.cmake/api/v1/reply/index-*.json)
file(READ "${index}" index_json)
string(JSON codemodel_file GET "${index_json}" reply codemodel-v2 jsonFile)
file(READ ${WORK_DIR}/.cmake/api/v1/reply/${codemodel_file} codemodel)
string(JSON targets GET "${codemodel}" configurations 0 targets)
string(JSON count LENGTH "${targets}")
math(EXPR last "${count} - 1")
set(names)
foreach(i RANGE ${last})
  string(JSON name GET "${targets}" ${i} name)
  list(APPEND names ${name})
endforeach()
message("targets: ${names}")
foreach(name ${names})
  if(NOT name MATCHES "^(lucid_amp|lucid_amp_distributed|docs)$")
    message(FATAL_ERROR "BUILD_TESTING=OFF still builds ${name}")
  endif()
endforeach()
if(NOT "lucid_amp" IN_LIST names)
  message(FATAL_ERROR "no lucid_amp target")
endif()
message("library only: passed")
