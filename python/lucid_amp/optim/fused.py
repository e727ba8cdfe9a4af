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


def _groups_to_step(optimizer):
    """Each param group of ``optimizer`` with its parameters that have a gradient, groups
    without any left out; ``maximize`` is refused (NotImplementedError)."""
    name = type(optimizer).__name__
    for group in optimizer.param_groups:
        if group.get("maximize", False):
            raise NotImplementedError(f"{name} has no maximize option")
        params = _params_with_grads(group, name)
        if params:
            yield group, params


def _params_with_grads(group, name):
    out = []
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise NotImplementedError(f"{name} does not support sparse gradients; use torch.optim's optimizer")
        out.append(p)
    return out


class FusedAdam(torch.optim.Optimizer):
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
        for group, params in _groups_to_step(self):
            exp_avg, exp_avg_sq, max_exp_avg_sq, steps = [], [], [], []
            for p in params:
                state = self.state[p]
                steps.append(_step_counter(state, p))
                exp_avg.append(_buffer(state, "exp_avg", p))
                exp_avg_sq.append(_buffer(state, "exp_avg_sq", p))
                if group["amsgrad"]:
                    max_exp_avg_sq.append(_buffer(state, "max_exp_avg_sq", p))
            beta1, beta2 = group["betas"]
            _C._fused_adam_(params, [p.grad for p in params], exp_avg, exp_avg_sq, max_exp_avg_sq,
                            steps, float(group["lr"]), float(beta1), float(beta2),
                            float(group["eps"]), float(group["weight_decay"]),
                            bool(group["amsgrad"]), self._decoupled_weight_decay,
                            grad_scale, found_inf)
        return loss


class FusedAdamW(FusedAdam):
    """torch.optim.AdamW (decoupled weight decay) in lucid-amp's fused kernel.

    Args as torch.optim.AdamW: params, lr (1e-3), betas ((0.9, 0.999)), eps (1e-8),
    weight_decay (1e-2), amsgrad (False).
    """

    _decoupled_weight_decay = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


class FusedSGD(torch.optim.Optimizer):
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
        for group, params in _groups_to_step(self):
            momentum = group["momentum"] != 0
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
            _C._fused_sgd_(params, [p.grad for p in params], buffers, steps, float(group["lr"]),
                           float(group["momentum"]), float(group["dampening"]),
                           float(group["weight_decay"]), bool(group["nesterov"]), grad_scale,
                           found_inf)
        return loss
