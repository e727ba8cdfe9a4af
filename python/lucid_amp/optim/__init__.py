# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.optim: torch.optim optimizers on lucid-amp's fused, scaler-aware kernels."""

from .fused import FusedAdam, FusedAdamW, FusedSGD

__all__ = ["FusedAdam", "FusedAdamW", "FusedSGD"]
