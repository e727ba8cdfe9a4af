#pragma once

// Umbrella header of lucid-amp's fused, scaler-aware optimizers.

#include <lucid/optim/fused_adam.h>
#include <lucid/optim/fused_optimizer.h>
#include <lucid/optim/fused_sgd.h>
