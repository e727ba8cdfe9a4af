// Compiled only to build the tests' precompiled header (tests/CMakeLists.txt).
