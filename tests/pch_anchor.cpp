// SPDX-License-Identifier: BSD-3-Clause
// Compiled only to build the tests' precompiled header (tests/CMakeLists.txt).
