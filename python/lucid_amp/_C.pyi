# SPDX-License-Identifier: BSD-3-Clause
"""Type stubs of the extension module lucid_amp._C (python/csrc/*.cpp).

The bindings are private to the package: lucid_amp.GradScaler (grad_scaler.py) wraps
_GradScaler, lucid_amp.optim (optim/fused.py) wraps _FusedGroup. An argument that the
binding does not name (pybind11's arg0, arg1, ...) is positional-only here, as it is in
the extension. tests/python/test_packaging.py checks these stubs against the built
module: every name, and every function's parameter names and defaults.

The types are the bindings' own: a string option is any str (the core checks its value
and raises ValueError), and a dict is a plain dict, whose keys the Python front turns into
its typed classes (lucid_amp.ScalerCounters, OverflowReport, BackoffEvent); the docstrings
name the keys.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

#: lucid-amp's version, "major.minor.patch" (CMakeLists.txt's project(VERSION)).
version: str
#: Whether the extension was compiled with lucid-amp's CUDA kernels.
with_cuda: bool
#: How many updates the step log keeps (kStepLogCapacity).
step_log_capacity: int
#: How many optimizers of one iteration the step log tells apart (kStepLogOptimizers).
step_log_optimizers: int

# One optimizer's parameters, one sequence per param group (typing only).
_ParamGroups = Sequence[Sequence[torch.Tensor]]

def clip_grad_norm_(
    parameters: Sequence[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> torch.Tensor:
    """lucid::amp::clip_grad_norm_: clips the gradients in place, returns the total norm
    (on the gradients' device); error_if_nonfinite: a non-finite norm raises RuntimeError
    before anything is clipped."""

def _norm_agreement_payload(
    found_inf: torch.Tensor, norm_partial: torch.Tensor, norm_type: float
) -> tuple[torch.Tensor, bool]:
    """A sharded clip's agreement: the tensor lucid_amp.distributed all-reduces and
    whether with MAX (else SUM). ValueError for norm_type <= 0, RuntimeError for a flag or
    partial that is not one float32 element, or on different devices."""

def _apply_norm_agreement(
    reduced: torch.Tensor, found_inf: torch.Tensor, norm_partial: torch.Tensor, norm_type: float
) -> None:
    """Writes the agreed flag (0 or 1) and norm partial from the reduced payload into
    found_inf and norm_partial, in place."""

class _GradScaler:
    """lucid::amp::GradScaler; use lucid_amp.GradScaler, which wraps it.

    An optimizer is named by a key (the Python front passes id(optimizer), never 0) and
    handed over as its param groups' parameters on every call."""

    def __init__(self, **kwargs: float | int | bool | str) -> None:
        """Keyword arguments named as lucid::amp::GradScalerOptions' options, each
        optional (the C++ default otherwise): a float option takes a float or an int, an
        integer option an int, a bool option a bool, an enum its name (min_scale_policy:
        "throw" or "clamp"; hysteresis_refill: "on_growth" or "on_clean_update").
        TypeError for another keyword or type, ValueError for a value out of range."""
    def scale(self, arg0: torch.Tensor, /) -> torch.Tensor:
        """outputs times the scale."""
    def unscale_(self, arg0: int, arg1: _ParamGroups, /) -> None:
        """Unscales the gradients of the optimizer with key arg0 in place (nothing when
        disabled)."""
    def clip_grad_norm_(
        self, arg0: int, arg1: _ParamGroups, arg2: float, arg3: float, arg4: bool, /
    ) -> torch.Tensor:
        """(key, param groups, max_norm, norm_type, scaler_aware): the norm of the
        unscaled gradients; scaler_aware: the optimizer takes the scale in its step, so
        the clip is folded into it there."""
    def step(
        self,
        arg0: int,
        arg1: _ParamGroups,
        arg2: Callable[[], object],
        arg3: Callable[[torch.Tensor | None, torch.Tensor | None], object] | None,
        /,
    ) -> bool:
        """(key, param groups, step_fn, set_grad_scaling): whether the step ran.
        set_grad_scaling is None, or for a scaler-aware optimizer a callable(scale or
        None, found_inf or None)."""
    def update(self, new_scale: float | None = None) -> None: ...
    def get_scale(self) -> float: ...
    def scale_tensor(self) -> torch.Tensor | None:
        """The scale as a tensor; None before scale(), unscale_() or step()."""
    def is_enabled(self) -> bool: ...
    def options(self) -> dict[str, Any]:
        """Every option by name, as the constructor takes them (the schedule's follow
        load_state_dict)."""
    def stage(self, arg0: int, /) -> Literal[0, 1, 2]:
        """The stage of the optimizer with key arg0: 0 ready, 1 unscaled, 2 stepped."""
    def step_skipped(self, arg0: int, /) -> bool: ...
    def overflowed(self, arg0: int, arg1: _ParamGroups, /) -> bool: ...
    def state_dict(self) -> dict[str, float]: ...
    def load_state_dict(self, arg0: Mapping[str, float], /) -> None: ...
    def save_bytes(self) -> bytes:
        """The whole scaler (state, options but enabled, counters) in lucid-amp's
        checkpoint format."""
    def load_bytes(self, arg0: bytes | str, /) -> None: ...
    def counters(self) -> dict[str, int]:
        """steps_taken, steps_skipped, updates, overflow_updates, backoffs, growths,
        overflow_streak, updates_without_checks, steps_without_gradients,
        min_scale_holds."""
    def last_overflow(self) -> dict[str, Any] | None:
        """The report of the last iteration that overflowed, None if none has: iteration,
        scale, optimizers, uninspected_optimizers, text, and gradients, a list of dicts
        (optimizer_key, param_group, index, name, nan_count, inf_count, numel, sizes,
        dtype, device)."""
    def history(self, wait: bool = False) -> list[dict[str, Any]]:
        """The step log, oldest first: dicts of update, scale, new_scale, found_inf,
        overflowed_optimizers (a tuple of the iteration's optimizers by order of first
        use), first_overflow ((optimizer, parameter) of the first non-finite gradient, or
        None), nan_count, inf_count, change ("none", "growth", "absorbed", "backoff") and grad_norm (None: no
        clip)."""
    def set_backoff_callback(self, arg0: Callable[[dict[str, Any]], object] | None, /) -> None:
        """fn(event) on every backoff, event a dict of iteration, old_scale, new_scale,
        overflow_streak and report (as last_overflow, or None); None removes it."""
    def set_found_inf_hook(
        self,
        fn: Callable[[torch.Tensor], object] | None,
        norm_fn: Callable[[torch.Tensor, torch.Tensor, float], object] | None = None,
    ) -> None:
        """fn(found_inf); norm_fn(found_inf, norm_partial, norm_type): both may change
        their tensors in place. None removes them (a norm_fn needs an fn)."""
    def set_parameter_name(self, arg0: torch.Tensor, arg1: str, /) -> None: ...

class _FusedGroup:
    """One param group's kernel arguments, kept between steps (lucid_amp.optim)."""

    def __init__(
        self,
        name: str,
        group: int,
        params: list[torch.Tensor],
        states: Sequence[Sequence[torch.Tensor]],
        state_names: Sequence[str],
        watched: list[dict],
    ) -> None:
        """group: the param group's index; states: the state lists aligned with the
        parameters that have a gradient now, named by state_names, the step counters
        (float32, one element) last; watched: the dicts they were taken from, whose change
        makes the group stale."""
    def prepare_(self, params: list[torch.Tensor]) -> bool:
        """Takes the group's parameters and gradients for the next launch and checks every
        tensor it will use; false (nothing taken) if its parameters, the set of them with a
        gradient, or a watched state dict changed since it was built."""
    def adam_(
        self,
        arg0: float,
        arg1: float,
        arg2: float,
        arg3: float,
        arg4: float,
        arg5: bool,
        arg6: bool,
        arg7: torch.Tensor | None,
        arg8: torch.Tensor | None,
        /,
    ) -> None:
        """(lr, beta1, beta2, eps, weight_decay, amsgrad, decoupled_weight_decay,
        grad_scale, found_inf): steps what prepare_ took with Adam/AdamW, then releases
        it."""
    def sgd_(
        self,
        arg0: float,
        arg1: float,
        arg2: float,
        arg3: float,
        arg4: bool,
        arg5: torch.Tensor | None,
        arg6: torch.Tensor | None,
        /,
    ) -> None:
        """(lr, momentum, dampening, weight_decay, nesterov, grad_scale, found_inf): steps
        what prepare_ took with SGD, then releases it."""
    def release_(self) -> None:
        """Drops what prepare_ took without launching."""
