// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Umbrella header: the whole public API of lucid-amp.

/// @namespace lucid
/// lucid-amp: mixed-precision training for LibTorch.

/// @namespace lucid::amp
/// Loss scaling (GradScaler), autocast, and their checkpoints and diagnostics.

#include <lucid/amp/autocast.h>
#include <lucid/amp/clip_grad.h>
#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler.h>
#include <lucid/amp/serialize.h>
#include <lucid/amp/version.h>
#include <lucid/optim.h>
