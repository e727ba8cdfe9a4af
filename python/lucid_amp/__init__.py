# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp: dynamic loss scaling for PyTorch on lucid-amp's C++ core.

``lucid_amp.GradScaler`` is a drop-in for ``torch.amp.GradScaler`` (change the import and
nothing else), with lucid-amp's guards and diagnostics; ``lucid_amp.autocast`` is the
reference API's autocast over torch.autocast; ``lucid_amp.optim`` has FusedAdam,
FusedAdamW and FusedSGD, torch.optim optimizers on lucid-amp's fused, scaler-aware kernels.
"""

# PyTorch first: the extension links against its libraries (libc10, libtorch), which the
# dynamic loader finds only once torch has loaded them.
import torch

try:
    from . import _build_info
except ImportError as _error:
    raise ImportError(
        "lucid_amp is not built: lucid_amp/_build_info.py, which the build writes beside "
        "the extension lucid_amp._C, is missing. Install the package "
        "(pip install --no-build-isolation .) or build it in place "
        "(python setup.py build_ext --inplace)."
    ) from _error

# The extension is compiled against one PyTorch, whose C++ API and ABI change with every
# release and whose builds differ by their local version part too (+cpu, +cu130: other
# libraries, other CUDA runtime), so it is loaded only into the very PyTorch it was built
# for: the whole version string must match. A mismatch would otherwise show as an
# undefined symbol, or as a crash later.
if str(torch.__version__) != _build_info.TORCH_VERSION:
    raise ImportError(
        f"lucid_amp was compiled against torch {_build_info.TORCH_VERSION}, but the "
        f"installed torch is {torch.__version__}. Rebuild or reinstall lucid_amp against "
        "the installed torch: in lucid-amp's source tree, pip install "
        "--no-build-isolation --force-reinstall --no-deps . (or, for an in-place build, "
        "python setup.py build_ext --inplace)."
    )

from . import _C, optim
from .autocast import autocast, is_autocast_enabled
from .grad_scaler import (
    BackoffEvent,
    GradScaler,
    NonFiniteGradient,
    OverflowReport,
    ScalerCounters,
    StepRecord,
    clip_grad_norm_,
)
from .sharded_grad_scaler import ShardedGradScaler

__version__ = _C.version

#: Whether the extension was compiled with lucid-amp's CUDA kernels.
with_cuda = bool(_C.with_cuda)
#: How many updates the step log keeps (GradScaler.history): the latest ones.
STEP_LOG_CAPACITY = int(_C.step_log_capacity)
#: How many optimizers of one iteration the step log tells apart
#: (StepRecord.overflowed_optimizers).
STEP_LOG_OPTIMIZERS = int(_C.step_log_optimizers)

__all__ = [
    "GradScaler",
    "ShardedGradScaler",
    "autocast",
    "is_autocast_enabled",
    "ScalerCounters",
    "OverflowReport",
    "NonFiniteGradient",
    "BackoffEvent",
    "StepRecord",
    "optim",
    "clip_grad_norm_",
    "with_cuda",
    "STEP_LOG_CAPACITY",
    "STEP_LOG_OPTIMIZERS",
]
