// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The rank program of the distributed tests (worker.cpp). The tests fork and call
// worker_main in the child; the lucid_distributed_worker executable (worker_exe.cpp)
// runs the same function for a fork + exec start or a run by hand.

namespace lucid_test {

constexpr int kAgreementError = 10;  // step() threw; <out>/rank<r>.err holds the message
constexpr int kStalled = 4;          // the stalling victim gave up waiting

// argv as a program's: argv[0], then "--name value" pairs. Returns the exit code.
int worker_main(int argc, char** argv);

}  // namespace lucid_test
