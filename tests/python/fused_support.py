# SPDX-License-Identifier: BSD-3-Clause
"""Which of PyTorch's fused optimizers run where: its fused kernels cover some devices
only, and which ones differs between releases (fused Adagrad has a CPU kernel in torch
2.11 and 2.13, a CUDA one in neither)."""

import pytest
import torch


def skip_unless_fused_runs_on(ctor, device):
    """Skips the calling test, with the reason, where a step of ``ctor(..., fused=True)``
    refuses a parameter on ``device`` (PyTorch checks the device at the first step, not at
    construction); the same skip for either scaler, as the test is PyTorch's."""
    param = torch.nn.Parameter(torch.zeros(1, device=device))
    param.grad = torch.zeros_like(param)
    try:
        ctor([param], lr=0.1, fused=True).step()
    except RuntimeError:
        pytest.skip(f"torch {torch.__version__}: fused {ctor.__name__} does not run on {device}")
