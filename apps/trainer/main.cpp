// SPDX-License-Identifier: BSD-3-Clause
// lucid_amp_trainer: everything lives in the lucid_trainer library (cli.cpp, app.cpp),
// where the tests can reach it.

#include "cli.h"

int main(int argc, char** argv) { return lucid::trainer::trainer_main(argc, argv); }
