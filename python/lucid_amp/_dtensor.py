# SPDX-License-Identifier: BSD-3-Clause
"""DTensor parameters (FSDP2's fully_shard, tensor parallelism, both, HSDP) under
lucid_amp.GradScaler.

A DTensor keeps its data in a plain local tensor (its shard on this rank), which
lucid-amp's kernels cannot reach through the DTensor itself. The scaler therefore gives
the C++ core, for each DTensor parameter, a plain alias of its local shard (sharing its
storage) whose ``.grad`` is the local shard of the parameter's gradient: the core unscales
and checks that shard in place, and the DTensor gradient sees the result. The optimizer
itself still steps the DTensor parameters (torch.optim handles DTensor).

Overflow is agreed as PyTorch's scaler agrees it through DTensor's dispatch of
``_amp_foreach_non_finite_check_and_unscale_``: the flag is all-reduced (MAX) over the
process group of each mesh dimension on which a gradient is not Replicate (Shard or
Partial), and over no other ranks; over a flattened mesh of exactly those dimensions in
one all-reduce where the user made one, as DTensor's redistribution does. On a Replicate
dimension (HSDP's replicate dimension) the ranks are meant to hold the same gradient, and
PyTorch's scaler leaves each of them to decide on its own; so does this one.
"""

import functools
import weakref
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a PyTorch built without torch.distributed
    DTensor = None

# The attribute of a DTensor parameter that keeps (its local tensor, the plain alias of
# it): the alias is made once per local tensor, so that the core sees the same tensor every
# step (its caches and the names given with set_parameter_names hold to it), and it dies
# with its parameter. (A dictionary keyed by the parameter would compare tensors by value.)
_ALIAS = "_lucid_amp_local_alias"


def is_dtensor(t: Optional[torch.Tensor]) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


# Per optimizer: (the identity and length of each group's parameter list, whether any
# parameter is a DTensor). Asked on every call of the scaler: a walk over every parameter
# costs tens of microseconds on a large model, a walk over the groups next to nothing. A
# parameter swapped for another in place, in a list of the same length, is not seen; a
# DTensor passed on unseen is refused by the core, by name, and nothing changes.
_HAS_DTENSOR: "weakref.WeakKeyDictionary[object, tuple]" = weakref.WeakKeyDictionary()


def has_dtensor_params(optimizer) -> bool:
    """Whether any parameter of ``optimizer`` is a DTensor."""
    if DTensor is None:
        return False
    layout = tuple((id(group["params"]), len(group["params"])) for group in optimizer.param_groups)
    try:
        cached = _HAS_DTENSOR.get(optimizer)
    except TypeError:  # an optimizer that cannot be referenced weakly
        cached = None
    if cached is not None and cached[0] == layout:
        return cached[1]
    has = any(isinstance(p, DTensor) for group in optimizer.param_groups for p in group["params"])
    try:
        _HAS_DTENSOR[optimizer] = (layout, has)
    except TypeError:
        pass
    return has


def local_param(param: torch.Tensor) -> torch.Tensor:
    """``param`` itself when it is plain; for a DTensor, the plain alias of its local shard
    whose ``.grad`` is the local shard of the parameter's gradient (None without one)."""
    if not is_dtensor(param):
        return param
    local = param._local_tensor
    cached = getattr(param, _ALIAS, None)
    if cached is None or cached[0] is not local:
        cached = (local, local.detach())
        setattr(param, _ALIAS, cached)
    alias = cached[1]
    grad = param.grad
    local_grad = None if grad is None else (grad._local_tensor if is_dtensor(grad) else grad)
    if local_grad is not None and local_grad.shape != alias.shape:
        # A gradient placed otherwise than its parameter (Replicate or Partial beside a
        # Shard) has a local tensor of another size: it is handed over on an alias of its
        # own, which the core checks and unscales alike (its name, if any, is not kept).
        other = local_grad.detach()
        other.grad = local_grad
        return other
    if alias.grad is not local_grad:
        alias.grad = local_grad
    return alias


def local_param_groups(
    optimizer, groups: Sequence[Sequence[torch.Tensor]]
) -> Sequence[Sequence[torch.Tensor]]:
    """``groups`` (``optimizer``'s parameters) with each DTensor parameter replaced by
    ``local_param``'s alias."""
    if not has_dtensor_params(optimizer):
        return groups
    return [[local_param(p) if isinstance(p, DTensor) else p for p in group] for group in groups]


def agreement_groups(optimizer) -> List["dist.ProcessGroup"]:
    """The process groups over which ``optimizer``'s overflow flag is agreed: one per mesh
    dimension on which a DTensor gradient is not Replicate, each set of ranks once (two
    meshes of the same layout may hand out distinct group objects over the same ranks,
    and a MAX repeated over them would only cost a collective), in the order the gradients
    first name them (the same on every rank of a model built alike). A DTensor parameter
    without a gradient counts by its own placements, so that a rank holding no gradient
    still joins the same all-reduces as the others."""
    groups: List["dist.ProcessGroup"] = []
    seen = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            t = p.grad if is_dtensor(p.grad) else p
            if not is_dtensor(t):
                continue
            mesh = t.device_mesh
            dims = tuple(d for d, placement in enumerate(t.placements) if not placement.is_replicate())
            for pg in _dimension_groups(mesh, dims):
                ranks = tuple(dist.get_process_group_ranks(pg))
                if ranks not in seen:
                    seen.add(ranks)
                    groups.append(pg)
    return groups


def _dimension_groups(mesh, dims) -> List["dist.ProcessGroup"]:
    """The process groups of ``mesh``'s dimensions ``dims``: the group of a flattened mesh
    of exactly those dimensions where the user made one (``mesh[dims]._flatten()``; one
    all-reduce over it, as DTensor's redistribution then makes), else one per dimension."""
    if len(dims) > 1:
        try:
            from torch.distributed.tensor._redistribute import _get_flattened_mesh_by_layout

            flat = _get_flattened_mesh_by_layout(mesh, dims)
        except (ImportError, AttributeError, RuntimeError):
            flat = None
        if flat is not None:
            return [flat.get_group()]
    return [mesh.get_group(d) for d in dims]


class MeshAgreement:
    """The found-inf hook of a call on an optimizer with DTensor gradients: the flag is
    all-reduced (MAX) over ``groups``, then handed to the hook the user installed (if any),
    e.g. lucid_amp.distributed's agreement over a group of its own."""

    def __init__(self, groups: Sequence["dist.ProcessGroup"],
                 then: Optional[Callable[[torch.Tensor], None]]) -> None:
        self.groups = list(groups)
        self.then = then

    def __call__(self, found_inf: torch.Tensor) -> None:
        for pg in self.groups:
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=pg)
        if self.then is not None:
            self.then(found_inf)


def agreeing(method):
    """Decorates a GradScaler method taking the optimizer first (unscale_, step): for an
    optimizer with DTensor parameters, the core's found-inf hook is, for that call, the
    mesh agreement followed by the user's hook, and the user's hooks are back after it."""

    @functools.wraps(method)
    def call(self, optimizer, *args, **kwargs):
        if not has_dtensor_params(optimizer) or not self._core.is_enabled():
            return method(self, optimizer, *args, **kwargs)
        fn, norm_fn = getattr(self, "_found_inf_hooks", (None, None))
        self._core.set_found_inf_hook(MeshAgreement(agreement_groups(optimizer), fn), None)
        try:
            return method(self, optimizer, *args, **kwargs)
        finally:
            self._core.set_found_inf_hook(fn, norm_fn)

    return call


def check_clip_arguments(max_norm: float, norm_type: float) -> None:
    """lucid-amp's ValueErrors for ``max_norm`` and ``norm_type`` (PyTorch's clipping takes
    any), raised by the core's own check: clipping an empty list checks the arguments."""
    from . import _C

    _C.clip_grad_norm_([], float(max_norm), float(norm_type), False)


def clip_grad_norm_(scaler, optimizer, max_norm: float, norm_type: float) -> torch.Tensor:
    """GradScaler.clip_grad_norm_ for an optimizer with DTensor parameters: unscale_ (the
    agreed flag), then ``torch.nn.utils.clip_grad_norm_`` over its parameters, as
    PyTorch's scaler is used with it. The norm is PyTorch's: a DTensor, computed with
    PyTorch's collectives and no others; a non-finite norm skips the step only where a
    gradient was inf or NaN (the flag), as with PyTorch's scaler."""
    check_clip_arguments(max_norm, norm_type)
    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
