#pragma once

// The schedule rule (next_scale_state and its types) as the core names it; defined with
// the CPU update kernel, which is the rule's twin.

#include "cpu/amp_kernels.h"

namespace lucid {
namespace amp {
namespace detail {
using cpu::next_scale_state;
using cpu::ScaleEvent;
using cpu::ScaleGuards;
using cpu::ScaleState;
}  // namespace detail
}  // namespace amp
}  // namespace lucid
