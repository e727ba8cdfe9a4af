#pragma once

// Umbrella header: the whole public API of lucid-amp.

#include <lucid/amp/autocast.h>
#include <lucid/amp/clip_grad.h>
#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler.h>
#include <lucid/amp/serialize.h>
#include <lucid/amp/version.h>
#include <lucid/optim.h>
