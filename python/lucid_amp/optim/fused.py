# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.optim: torch.optim optimizers whose step runs lucid-amp's fused kernels.

FusedAdam, FusedAdamW and FusedSGD update every parameter of a param group in one
multi-tensor kernel per device and dtype (CPU and CUDA; float32 and float64 parameters),
with torch.optim's update rules, hyper-parameter names and state names (``step``,
``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``, ``momentum_buffer``), so that
``state_dict()`` loads into the torch.optim optimizer and back, and LR schedulers work.

They are scaler-aware through PyTorch's own protocol (``_step_supports_amp_scaling``): a
GradScaler (lucid_amp's, or PyTorch's) hands them ``grad_scale`` and ``found_inf``; the
kernel multiplies each gradient by 1/scale as it reads it and, when ``found_inf`` is set,
changes nothing, step counters included. The scaler then needs no unscaling pass of its
own, only a read-only finiteness check.
"""

from typing import Iterable, Optional, Tuple

import torch

from .. import _C
from .._dynamo import opaque_to_dynamo

__all__ = ["FusedAdam", "FusedAdamW", "FusedSGD"]


def _take_scaling(optimizer) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    return getattr(optimizer, "grad_scale", None), getattr(optimizer, "found_inf", None)


def _step_counter(state: dict, param: torch.Tensor, initial: float = 0.0) -> torch.Tensor:
    """state["step"] as the kernels keep it: a float32 0-dim tensor on the parameter's
    device (a torch.optim state may hold it on the CPU, or as a number). The entry is
    written only when it changes: the kernel arguments are gathered anew after any write."""
    step = state.get("step")
    if step is None:
        step = torch.full((), initial, dtype=torch.float32, device=param.device)
    elif not isinstance(step, torch.Tensor):
        step = torch.tensor(float(step), dtype=torch.float32, device=param.device)
    elif (step.dtype != torch.float32 or step.device != param.device or step.dim() != 0) and step.numel() == 1:
        step = step.detach().reshape(()).to(device=param.device, dtype=torch.float32)
    if state.get("step") is not step:
        state["step"] = step
    return step


def _buffer(state: dict, key: str, param: torch.Tensor) -> torch.Tensor:
    """state[key], made (zeros laid out as the parameter) on first use. One that exists is
    used as it is: the kernels refuse another size, dtype or device (torch.optim's update
    fails there too), and work on another layout through a copy."""
    buf = state.get(key)
    if buf is None:
        buf = torch.zeros_like(param)
        state[key] = buf
    return buf


def _run_closure(closure):
    """The closure's loss, evaluated with gradients enabled (None without a closure)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class _CachedListsMixin:
    """Keeps one param group's kernel arguments between steps (lucid_amp._C._FusedGroup).

    The state tensors are looked up (and made, or moved to the parameter's device and
    dtype) when a group is first stepped, and kept: a step reads only the gradients again.
    They are gathered anew when the group's parameters, the set of them that have a
    gradient, their devices or dtypes, an option that picks the buffers (``amsgrad``, a
    zero or non-zero ``momentum``), ``optimizer.state`` or a parameter's state dict (an
    entry replaced, added or deleted) change, and after load_state_dict or
    add_param_group. A tensor changed in place (``set_``, ``resize_``, ``p.data = x``) is
    seen by the kernel entry's own checks at every step: where torch.optim's update would
    fail (a gradient or state of another size, dtype or device), the step raises before
    anything is written.
    """

    def _step_groups(self, layout_of, gather, launch):
        """One step of every param group: each group's kept _FusedGroup takes and checks
        its tensors (``prepare_``), gathered anew (``gather(group, params)``: the names
        and the state lists of the parameters that have a gradient, step counters last)
        when it reports itself stale; then ``launch(fused, group)`` runs for each. Every
        group is checked before the first launch, so an error leaves all as they were."""
        cache = self.__dict__.setdefault("_lucid_groups", {})
        prepared = []
        try:
            for index, group in enumerate(self.param_groups):
                fused = self._prepared_group(cache, index, group, layout_of(group), gather)
                if fused is not None:
                    prepared.append((fused, group))
        except BaseException:
            for fused, _ in prepared:  # a launch releases its own; these will not launch
                fused.release_()
            raise
        for fused, group in prepared:
            launch(fused, group)

    def _prepared_group(self, cache, index, group, layout, gather):
        """The index-th group's _FusedGroup with its tensors taken, or None when no
        parameter of the group has a gradient."""
        entry = cache.get(index)
        params_list = group["params"]
        if entry is not None and entry[0] is self.state and entry[1] == layout and entry[2].prepare_(params_list):
            return entry[2]
        params = [p for p in params_list if p.grad is not None]
        for i, p in enumerate(params):
            if p.grad.is_sparse:
                raise NotImplementedError(
                    f"{type(self).__name__} does not support sparse gradients (parameter "
                    f"{i}); use torch.optim's optimizer")
        if not params:
            cache.pop(index, None)
            return None
        names, states = gather(group, params)
        watched = [self.state] + [self.state[p] for p in params]
        fused = _C._FusedGroup(type(self).__name__, index, params_list, states, names, watched)
        cache[index] = (self.state, layout, fused)
        if not fused.prepare_(params_list):
            raise RuntimeError(f"{type(self).__name__}: the parameters changed during step()")
        return fused

    def _forget_lists(self):
        self.__dict__.pop("_lucid_groups", None)

    def add_param_group(self, param_group):
        self._forget_lists()
        super().add_param_group(param_group)
        _refuse_dtensors(self, len(self.param_groups) - 1)

    def __setstate__(self, state):
        # torch.optim's load_state_dict ends here: the state tensors are new ones
        self._forget_lists()
        super().__setstate__(state)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_lucid_groups", None)
        return state


def _refuse_dtensors(optimizer, index):
    """NotImplementedError, and param group ``index`` taken back, when it holds a DTensor:
    the fused kernels step plain tensors, and a DTensor's data lies in its local shard.
    Said when the group is added, so that the alternative is known before training."""
    from .._dtensor import is_dtensor

    group = optimizer.param_groups[index]
    for i, p in enumerate(group["params"]):
        if is_dtensor(p):
            optimizer.param_groups.pop(index)
            name = type(optimizer).__name__
            raise NotImplementedError(
                f"{name}: parameter {i} of param group {index} is a DTensor (FSDP2's "
                "fully_shard, tensor parallelism), which lucid-amp's fused kernels do not "
                f"step. Use torch.optim's {name[len('Fused'):]} (fused=True or foreach=True "
                "step DTensors) with lucid_amp.GradScaler, which handles DTensor gradients.")


def _refuse_maximize(optimizer, group):
    if group.get("maximize", False):
        raise NotImplementedError(f"{type(optimizer).__name__} has no maximize option")


class FusedAdam(_CachedListsMixin, torch.optim.Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient) in lucid-amp's fused kernel.

    Args as torch.optim.Adam: params, lr (1e-3), betas ((0.9, 0.999)), eps (1e-8),
    weight_decay (0), amsgrad (False).
    """

    _step_supports_amp_scaling = True
    _decoupled_weight_decay = False

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False) -> None:
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient; a closure is evaluated first."""
        loss = _run_closure(closure)
        grad_scale, found_inf = _take_scaling(self)
        decoupled = self._decoupled_weight_decay
        for group in self.param_groups:
            _refuse_maximize(self, group)

        def launch(fused, group):
            beta1, beta2 = group["betas"]
            fused.adam_(float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                        float(group["weight_decay"]), bool(group["amsgrad"]), decoupled,
                        grad_scale, found_inf)

        self._step_groups(lambda group: bool(group["amsgrad"]),
                          lambda group, params: self._state_lists(params, bool(group["amsgrad"])),
                          launch)
        return loss

    def _state_lists(self, params, amsgrad):
        """exp_avg, exp_avg_sq, max_exp_avg_sq (with amsgrad) and the step counters of
        ``params`` in the kernel's order, made on first use: (names, lists)."""
        exp_avg, exp_avg_sq, max_exp_avg_sq, steps = [], [], [], []
        for p in params:
            state = self.state[p]
            steps.append(_step_counter(state, p))
            exp_avg.append(_buffer(state, "exp_avg", p))
            exp_avg_sq.append(_buffer(state, "exp_avg_sq", p))
            if amsgrad:
                max_exp_avg_sq.append(_buffer(state, "max_exp_avg_sq", p))
        if amsgrad:
            return ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"], [exp_avg, exp_avg_sq, max_exp_avg_sq, steps]
        return ["exp_avg", "exp_avg_sq", "step"], [exp_avg, exp_avg_sq, steps]


class FusedAdamW(FusedAdam):
    """torch.optim.AdamW (decoupled weight decay) in lucid-amp's fused kernel.

    Args as torch.optim.AdamW: params, lr (1e-3), betas ((0.9, 0.999)), eps (1e-8),
    weight_decay (1e-2), amsgrad (False).
    """

    _decoupled_weight_decay = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


class FusedSGD(_CachedListsMixin, torch.optim.Optimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay) in lucid-amp's fused
    kernel.

    Args as torch.optim.SGD: params, lr, momentum (0), dampening (0), weight_decay (0),
    nesterov (False). ``state["momentum_buffer"]`` is torch.optim's; ``state["step"]``
    (float32, on the parameter's device) counts the updates, so that a skipped first
    step leaves the buffer unborn without the host knowing.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient; a closure is evaluated first."""
        loss = _run_closure(closure)
        grad_scale, found_inf = _take_scaling(self)
        for group in self.param_groups:
            _refuse_maximize(self, group)

        def launch(fused, group):
            fused.sgd_(float(group["lr"]), float(group["momentum"]), float(group["dampening"]),
                       float(group["weight_decay"]), bool(group["nesterov"]), grad_scale, found_inf)

        self._step_groups(lambda group: group["momentum"] != 0,
                          lambda group, params: self._state_lists(params, group["momentum"] != 0),
                          launch)
        return loss

    def _state_lists(self, params, momentum):
        """The momentum buffers (with momentum) and the step counters of ``params``, made
        on first use: (names, lists)."""
        buffers, steps = [], []
        for p in params:
            state = self.state[p]
            # a momentum buffer loaded from torch.optim.SGD is a live one: count it
            has_buffer = state.get("momentum_buffer") is not None
            steps.append(_step_counter(state, p, initial=1.0 if has_buffer else 0.0))
            if momentum:
                buffers.append(_buffer(state, "momentum_buffer", p))
            elif "momentum_buffer" not in state:
                state["momentum_buffer"] = None  # as torch.optim.SGD keeps it
        if momentum:
            return ["momentum_buffer", "step"], [buffers, steps]
        return ["step"], [steps]


# step() is one opaque call under torch.compile, as the kernels of PyTorch's fused
# optimizers are (PyTorch wraps them with torch.compiler.disable); FusedAdamW inherits
# FusedAdam's. _dynamo.opaque_to_dynamo says why.
opaque_to_dynamo(FusedAdam)
opaque_to_dynamo(FusedSGD)
