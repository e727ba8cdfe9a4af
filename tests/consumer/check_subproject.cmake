# SPDX-License-Identifier: BSD-3-Clause
# Configures, builds and runs a parent project that takes lucid-amp from this checkout
# (PARENT: tests/consumer/subdirectory or tests/consumer/fetchcontent), installs the
# parent into WORK_DIR/prefix and checks what lucid-amp put there. Inputs as common.cmake,
# and: LUCID_AMP_SOURCE_DIR, WORK_DIR, BUILD_TYPE and CXX_FLAGS (the parent's), SHARED
# (BUILD_SHARED_LIBS for the parent), EXPECT_INSTALL (whether lucid-amp's install rules
# are on: its library, headers and package config in the prefix, or nothing of it).
cmake_policy(VERSION 3.24)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} -S ${PARENT} -B ${WORK_DIR}/build ${consumer_args}
    -DLUCID_AMP_SOURCE_DIR=${LUCID_AMP_SOURCE_DIR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DEXPECT_BUILD_TYPE=${BUILD_TYPE}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" -DBUILD_SHARED_LIBS=${SHARED})
include(ProcessorCount)
ProcessorCount(jobs)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel ${jobs})
run(${WORK_DIR}/build/consumer)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/build --prefix ${WORK_DIR}/prefix)

list_files(${WORK_DIR}/prefix installed)
message("installed: ${installed}")
if(NOT installed MATCHES "(^|;)bin/consumer(;|$)")
  message(FATAL_ERROR "the parent's program was not installed")
endif()
if(EXPECT_INSTALL)
  foreach(pattern "lucid_amp/lucid_ampConfig\\.cmake" "lucid_amp/lucid_ampConfigVersion\\.cmake"
                  "include/lucid/amp\\.h" "include/lucid/amp/version\\.h")
    if(NOT installed MATCHES "${pattern}")
      message(FATAL_ERROR "lucid-amp's install rules are on, but nothing matches ${pattern}")
    endif()
  endforeach()
else()
  if(installed MATCHES "lucid")
    message(FATAL_ERROR "LUCID_AMP_INSTALL is OFF, but lucid-amp installed files")
  endif()
endif()

# A shared lucid_amp is liblucid_amp.so.MAJOR.MINOR.PATCH with the soname
# liblucid_amp.so.MAJOR.MINOR, and installed under both names with the link name.
if(SHARED)
  file(READ ${LUCID_AMP_SOURCE_DIR}/CMakeLists.txt top)
  string(REGEX MATCH "project\\(lucid_amp VERSION ([0-9]+)\\.([0-9]+)\\.([0-9]+)" _ "${top}")
  set(version ${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3})
  set(soversion ${CMAKE_MATCH_1}.${CMAKE_MATCH_2})
  foreach(name liblucid_amp.so liblucid_amp.so.${soversion} liblucid_amp.so.${version})
    if(NOT installed MATCHES "/${name}(;|$)")
      message(FATAL_ERROR "shared build: ${name} was not installed")
    endif()
  endforeach()
  find_program(READELF readelf)
  if(READELF)
    file(GLOB_RECURSE lib ${WORK_DIR}/prefix/*/liblucid_amp.so.${version})
    execute_process(COMMAND ${READELF} -d ${lib} OUTPUT_VARIABLE dynamic)
    if(NOT dynamic MATCHES "SONAME\\)[^\n]*\\[liblucid_amp\\.so\\.${soversion}\\]")
      message(FATAL_ERROR "shared build: the soname is not liblucid_amp.so.${soversion}")
    endif()
  endif()
  message("shared build: liblucid_amp.so.${version}, soname liblucid_amp.so.${soversion}")
endif()
message("subproject: passed")
