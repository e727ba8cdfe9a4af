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

from . import _C
from .grad_scaler import GradScaler

__all__ = ["bind_to_group", "unbind"]


class OverflowAgreement:
    """The hooks bind_to_group installs; counts its all-reduces."""

    def __init__(self, group: Optional["dist.ProcessGroup"]) -> None:
        self.group = group
        self.all_reduces = 0

    def __call__(self, found_inf: torch.Tensor) -> None:
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.group)
        self.all_reduces += 1

    def agree_with_norm(self, found_inf: torch.Tensor, partial: torch.Tensor, norm_type: float) -> None:
        """Sharded clip_grad_norm_: the flag and the norm's partial in one all-reduce, packed
        and read back by the C++ core as lucid::distributed does (SUM for a finite p, MAX
        for inf, a NaN partial kept as NaN on every rank). Nothing is read back to the
        host."""
        values, reduce_max = _C._norm_agreement_payload(found_inf, partial, norm_type)
        dist.all_reduce(values, op=dist.ReduceOp.MAX if reduce_max else dist.ReduceOp.SUM,
                        group=self.group)
        _C._apply_norm_agreement(values, found_inf, partial, norm_type)
        self.all_reduces += 1


def bind_to_group(scaler: GradScaler, group: Optional["dist.ProcessGroup"] = None, *,
                  sharded: bool = False) -> OverflowAgreement:
    """Makes ``scaler`` agree on overflow with the same scaler on every rank of ``group``
    (None: the default group). ``sharded``: each rank owns a part of the parameters
    (ZeRO/FSDP-like), and ``scaler.clip_grad_norm_`` clips by the norm over every rank's
    gradients, its partial travelling in the flag's all-reduce (still one per optimizer
    and iteration). Data-parallel runs, whose gradients are replicated, leave it off.
    Returns the agreement (``all_reduces`` counts them)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("lucid_amp.distributed.bind_to_group: torch.distributed is not initialized; "
                           "call torch.distributed.init_process_group first.")
    agreement = OverflowAgreement(group)
    scaler.set_found_inf_hook(agreement, agreement.agree_with_norm if sharded else None)
    return agreement


def unbind(scaler: GradScaler) -> None:
    """Removes the agreement: the scaler decides on its own rank's gradients again."""
    scaler.set_found_inf_hook(None)
