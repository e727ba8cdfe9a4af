# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.ShardedGradScaler: ``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler``'s
interface on lucid-amp's scaler, for FSDP1 (``FullyShardedDataParallel``) and other
data-parallel wrappers whose ranks hold different gradients.

It is a lucid_amp.GradScaler whose overflow flag is agreed over a process group: each
optimizer's flag is all-reduced over ``process_group`` right after its gradients are
checked (lucid_amp.distributed's agreement, the scaler's found-inf hook), so every rank
skips the same steps and keeps the same scale. Clipping with ``clip_grad_norm_`` clips by
the norm over every rank's shard, its partial travelling in that same all-reduce.
"""

from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from ._dynamo import opaque_to_dynamo
from .distributed import OverflowAgreement
from .grad_scaler import GradScaler, _map_tensors

__all__ = ["ShardedGradScaler"]


class ShardedGradScaler(GradScaler):
    """A drop-in for FSDP1's ``ShardedGradScaler``; change the import and nothing else::

        model = FullyShardedDataParallel(model, ...)
        scaler = lucid_amp.ShardedGradScaler()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    Args:
        device, init_scale, backoff_factor, growth_factor, growth_interval, enabled: as
            PyTorch's ShardedGradScaler, in its order (``backoff_factor`` before
            ``growth_factor``, unlike GradScaler).
        process_group: the group whose ranks agree on overflow (default: the world group,
            as PyTorch's). torch.distributed need not be initialized when the scaler is
            built, only when it first checks gradients.
        **guards: lucid_amp.GradScaler's keyword-only guards (min_scale, hysteresis, ...).

    As PyTorch's, ``scale()`` returns the loss in its own dtype (a float16 loss stays
    float16). Gradients are checked where they live (CPU-offloaded shards included: the
    flag is combined on the scale's device before it is all-reduced). Differences from
    PyTorch's, as for GradScaler: float16 gradients raise ValueError (FSDP's
    ``MixedPrecision(keep_low_precision_grads=True)`` keeps them; loss scaling needs
    float32 ones), and the flag is all-reduced with MAX (PyTorch: SUM), which decides alike.
    ``set_found_inf_hook`` replaces the agreement: call it only to bind another group.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        backoff_factor: float = 0.5,
        growth_factor: float = 2.0,
        growth_interval: int = 2000,
        enabled: bool = True,
        process_group: Optional["dist.ProcessGroup"] = dist.group.WORLD,
        **guards: Any,
    ) -> None:
        super().__init__(
            device,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
            **guards,
        )
        self._bind(process_group)

    def _bind(self, process_group: Optional["dist.ProcessGroup"]) -> None:
        """Installs the agreement over ``process_group`` (when enabled, as PyTorch keeps
        ``process_group`` only then)."""
        if not self.is_enabled():
            return
        self.process_group = process_group
        self._agreement = OverflowAgreement(process_group)
        self.set_found_inf_hook(self._agreement, self._agreement.agree_with_norm)

    def scale(self, outputs):
        """As GradScaler.scale, but each result keeps the dtype of the tensor it scales."""
        if not self.is_enabled():
            return outputs
        return _map_tensors(outputs, lambda t: self._core.scale(t).to(t.dtype))

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # The process group is not part of the pickled state (a group is local to its
        # processes); an unpickled scaler agrees over the default group.
        super().__setstate__(state)
        self._bind(dist.group.WORLD)


# Its own methods are one opaque call each under torch.compile, as GradScaler's are (the
# inherited ones are wrapped already): _dynamo.opaque_to_dynamo says why.
opaque_to_dynamo(ShardedGradScaler)
