# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.distributed: GradScalers of a torch.distributed process group that agree on
overflow.

Every rank must take the same decision each step: if any rank's gradients overflowed, all
skip and all back off, or their parameters and scales drift apart (most of all when each
rank holds only a shard of the gradients, as with ZeRO/FSDP). ``bind_to_group`` installs
the scaler's found-inf hook: each optimizer's overflow flag is all-reduced (MAX) over the
group right after unscaling, before the scaler reads it, so the scaler's own rules act
identically on every rank. The flag lives on the scale's device: use a Gloo group for a
CPU scale, NCCL for a CUDA one. As for the C++ binding (lucid::distributed), every rank
calls scale() each iteration and unscales/steps the same optimizers in the same order.
"""

from typing import Optional

import torch
import torch.distributed as dist

from .grad_scaler import GradScaler

__all__ = ["bind_to_group", "unbind"]


class OverflowAgreement:
    """The hook bind_to_group installs; counts its all-reduces."""

    def __init__(self, group: Optional["dist.ProcessGroup"]) -> None:
        self.group = group
        self.all_reduces = 0

    def __call__(self, found_inf: torch.Tensor) -> None:
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.group)
        self.all_reduces += 1


def bind_to_group(scaler: GradScaler, group: Optional["dist.ProcessGroup"] = None) -> OverflowAgreement:
    """Makes ``scaler`` agree on overflow with the same scaler on every rank of ``group``
    (None: the default group). Returns the agreement (``all_reduces`` counts them)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("lucid_amp.distributed.bind_to_group: torch.distributed is not initialized; "
                           "call torch.distributed.init_process_group first.")
    agreement = OverflowAgreement(group)
    scaler.set_found_inf_hook(agreement)
    return agreement


def unbind(scaler: GradScaler) -> None:
    """Removes the agreement: the scaler decides on its own rank's gradients again."""
    scaler.set_found_inf_hook(None)
