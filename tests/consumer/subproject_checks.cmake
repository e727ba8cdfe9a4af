# SPDX-License-Identifier: BSD-3-Clause
# Included by the parent projects in subdirectory/ and fetchcontent/ after they took
# lucid-amp in: what lucid-amp as a subproject must leave alone. EXPECT_BUILD_TYPE is
# the build type the check configured the parent with (empty: none).
if(NOT TARGET lucid_amp::lucid_amp)
  message(FATAL_ERROR "no target lucid_amp::lucid_amp")
endif()
# lucid-amp's tests, examples, trainer and benchmarks are its own, not the parent's.
foreach(target lucid_amp_test_pch test_grad_scaler_api data_parallel lucid_trainer
               lucid_amp_trainer bench_unscale)
  if(TARGET ${target})
    message(FATAL_ERROR "lucid-amp as a subproject defined its development target ${target}")
  endif()
endforeach()
if(NOT "${CMAKE_BUILD_TYPE}" STREQUAL "${EXPECT_BUILD_TYPE}")
  message(FATAL_ERROR "lucid-amp changed the parent's CMAKE_BUILD_TYPE to '${CMAKE_BUILD_TYPE}'")
endif()
message(STATUS "subproject checks passed")
