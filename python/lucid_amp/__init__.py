# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp: dynamic loss scaling for PyTorch on lucid-amp's C++ core.

``lucid_amp.GradScaler`` is a drop-in for ``torch.amp.GradScaler`` (change the import and
nothing else), with lucid-amp's guards and diagnostics; ``lucid_amp.autocast`` is the
reference API's autocast over torch.autocast; ``lucid_amp.optim`` has FusedAdam,
FusedAdamW and FusedSGD, torch.optim optimizers on lucid-amp's fused, scaler-aware kernels.
"""

from . import _C, optim
from .autocast import autocast, is_autocast_enabled
from .grad_scaler import (
    BackoffEvent,
    GradScaler,
    NonFiniteGradient,
    OverflowReport,
    ScalerCounters,
    clip_grad_norm_,
)

__version__ = _C.version

#: Whether the extension was compiled with lucid-amp's CUDA kernels.
with_cuda = bool(_C.with_cuda)

__all__ = [
    "GradScaler",
    "autocast",
    "is_autocast_enabled",
    "ScalerCounters",
    "OverflowReport",
    "NonFiniteGradient",
    "BackoffEvent",
    "optim",
    "clip_grad_norm_",
    "with_cuda",
]
