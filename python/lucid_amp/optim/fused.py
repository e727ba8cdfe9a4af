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

import itertools
import operator
from typing import Iterable, Optional, Tuple

import torch

from .. import _C

__all__ = ["FusedAdam", "FusedAdamW", "FusedSGD"]


def _take_scaling(optimizer) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    return getattr(optimizer, "grad_scale", None), getattr(optimizer, "found_inf", None)


def _step_counter(state: dict, param: torch.Tensor, initial: float = 0.0) -> torch.Tensor:
    """state["step"] as the kernels keep it: a float32 0-dim tensor on the parameter's
    device (a torch.optim state may hold it on the CPU, or as a number)."""
    step = state.get("step")
    if step is None:
        step = torch.full((), initial, dtype=torch.float32, device=param.device)
    elif not isinstance(step, torch.Tensor):
        step = torch.tensor(float(step), dtype=torch.float32, device=param.device)
    elif step.dtype != torch.float32 or step.device != param.device or step.dim() != 0:
        step = step.detach().reshape(()).to(device=param.device, dtype=torch.float32)
    state["step"] = step
    return step


def _buffer(state: dict, key: str, param: torch.Tensor) -> torch.Tensor:
    """state[key], made (zeros) on first use, contiguous, on the parameter's device and dtype."""
    buf = state.get(key)
    if buf is None:
        buf = torch.zeros_like(param, memory_format=torch.contiguous_format)
    elif buf.device != param.device or buf.dtype != param.dtype or not buf.is_contiguous():
        buf = buf.to(device=param.device, dtype=param.dtype).contiguous()
    state[key] = buf
    return buf


def _run_closure(closure):
    """The closure's loss, evaluated with gradients enabled (None without a closure)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class _GroupLists:
    """One param group's kernel arguments, gathered once and kept between steps.

    The state tensors are looked up (and made, or moved to the parameter's device and
    dtype) when a group is first stepped, and kept: per step only the gradients are read
    again. The lists are gathered anew when the group's parameters, the set of them that
    have a gradient, or an option that picks the buffers (``amsgrad``, a zero or non-zero
    ``momentum``) change, and after load_state_dict, add_param_group or a new
    ``optimizer.state``. So state is changed in place (``state["exp_avg"].zero_()``); a
    state entry replaced by assignment is picked up at the next load_state_dict.
    """

    __slots__ = ("state", "snapshot", "layout", "has_grad", "params", "lists")

    def __init__(self, state, snapshot, layout, has_grad, params, lists):
        self.state = state
        self.snapshot = snapshot
        self.layout = layout
        self.has_grad = has_grad
        self.params = params
        self.lists = lists

    def fits(self, state, params_list, layout, has_grad):
        return (self.state is state and self.layout == layout and self.has_grad == has_grad
                and len(self.snapshot) == len(params_list)
                and all(map(operator.is_, self.snapshot, params_list)))


class _CachedListsMixin:
    """Keeps a _GroupLists per param group (see there); forgets them whenever torch.optim
    rebuilds the state or the groups."""

    def _group_lists(self, index, group, layout, gather):
        """The cached lists of ``group`` (the index-th) and its current gradients;
        ``gather(params)`` builds the state lists of the parameters that have a gradient.
        (None, None) when no parameter of the group has one."""
        params_list = group["params"]
        grads = [p.grad for p in params_list]
        has_grad = tuple(map(operator.is_not, grads, itertools.repeat(None)))
        cache = self.__dict__.setdefault("_lucid_lists", {})
        entry = cache.get(index)
        if entry is None or not entry.fits(self.state, params_list, layout, has_grad):
            params = [p for p, present in zip(params_list, has_grad) if present]
            for i, p in enumerate(params):
                if p.grad.is_sparse:
                    raise NotImplementedError(
                        f"{type(self).__name__} does not support sparse gradients (parameter "
                        f"{i}); use torch.optim's optimizer")
            lists = gather(params) if params else None
            entry = _GroupLists(self.state, tuple(params_list), layout, has_grad, params, lists)
            cache[index] = entry
        if not entry.params:
            return None, None
        if len(grads) != len(entry.params):
            grads = [g for g in grads if g is not None]
        return entry, grads

    def _forget_lists(self):
        self.__dict__.pop("_lucid_lists", None)

    def add_param_group(self, param_group):
        self._forget_lists()
        super().add_param_group(param_group)

    def __setstate__(self, state):
        # torch.optim's load_state_dict ends here: the state tensors are new ones
        self._forget_lists()
        super().__setstate__(state)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_lucid_lists", None)
        return state


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
        for index, group in enumerate(self.param_groups):
            _refuse_maximize(self, group)
            amsgrad = bool(group["amsgrad"])
            entry, grads = self._group_lists(
                index, group, amsgrad, lambda params: self._state_lists(params, amsgrad))
            if entry is None:
                continue
            exp_avg, exp_avg_sq, max_exp_avg_sq, steps = entry.lists
            beta1, beta2 = group["betas"]
            _C._fused_adam_(entry.params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps,
                            float(group["lr"]), float(beta1), float(beta2), float(group["eps"]),
                            float(group["weight_decay"]), amsgrad, self._decoupled_weight_decay,
                            grad_scale, found_inf)
        return loss

    def _state_lists(self, params, amsgrad):
        """exp_avg, exp_avg_sq, max_exp_avg_sq (empty without amsgrad) and the step
        counters of ``params``, made on first use."""
        exp_avg, exp_avg_sq, max_exp_avg_sq, steps = [], [], [], []
        for p in params:
            state = self.state[p]
            steps.append(_step_counter(state, p))
            exp_avg.append(_buffer(state, "exp_avg", p))
            exp_avg_sq.append(_buffer(state, "exp_avg_sq", p))
            if amsgrad:
                max_exp_avg_sq.append(_buffer(state, "max_exp_avg_sq", p))
        return exp_avg, exp_avg_sq, max_exp_avg_sq, steps


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
        for index, group in enumerate(self.param_groups):
            _refuse_maximize(self, group)
            momentum = group["momentum"] != 0
            entry, grads = self._group_lists(
                index, group, momentum, lambda params: self._state_lists(params, momentum))
            if entry is None:
                continue
            buffers, steps = entry.lists
            _C._fused_sgd_(entry.params, grads, buffers, steps, float(group["lr"]),
                           float(group["momentum"]), float(group["dampening"]),
                           float(group["weight_decay"]), bool(group["nesterov"]), grad_scale,
                           found_inf)
        return loss

    def _state_lists(self, params, momentum):
        """The momentum buffers (empty without momentum) and the step counters of
        ``params``, made on first use."""
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
        return buffers, steps
