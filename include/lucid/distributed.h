// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Umbrella header of lucid_amp::distributed (CMake target lucid_amp::distributed): ranks
/// of a c10d process group that agree on overflow, and the store/group factories.

/// @namespace lucid::distributed
/// Overflow agreement across the ranks of a c10d process group, and group factories.

#include <lucid/distributed/overflow_agreement.h>
#include <lucid/distributed/process_group.h>
