// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Umbrella header of lucid-amp's fused, scaler-aware optimizers.

/// @namespace lucid::optim
/// Fused, scaler-aware optimizers (FusedSGD, FusedAdam, FusedAdamW).

#include <lucid/optim/fused_adam.h>
#include <lucid/optim/fused_optimizer.h>
#include <lucid/optim/fused_sgd.h>
