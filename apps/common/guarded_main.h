// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Both programs' main(): one clear message and exit status 1 for any error.

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>

namespace lucid {
namespace apps {

/// A program's main() around its parse and run: `parse(argc, argv, exit_code)` returns the
/// options, or nullopt with the exit code (--help, a bad flag); `run(options)` does the
/// work. A c10::Error or std::exception ends it with one message on stderr and status 1.
template <typename Parse, typename Run>
int guarded_main(int argc, char** argv, Parse parse, Run run) {
  int code = 0;
  try {
    auto options = parse(argc, argv, code);
    if (!options) return code;
    run(*options);
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nerror: %s\n", e.what());
  }
  return 1;
}

}  // namespace apps
}  // namespace lucid
