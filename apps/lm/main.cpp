// SPDX-License-Identifier: BSD-3-Clause
#include "lm_cli.h"

int main(int argc, char** argv) { return lucid::lm::lm_main(argc, argv); }
