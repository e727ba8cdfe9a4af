// SPDX-License-Identifier: BSD-3-Clause
// lucid_distributed_worker: one rank of the distributed tests as its own executable.

#include "worker.h"

int main(int argc, char** argv) { return lucid_test::worker_main(argc, argv); }
