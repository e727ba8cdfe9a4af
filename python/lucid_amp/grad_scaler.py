# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.GradScaler: torch.amp.GradScaler's interface on lucid-amp's C++ scaler.

Everything the scaler decides (the stage machine, unscaling and the overflow check in
lucid-amp's kernels, skipping, the scale's sawtooth, the guards, the diagnostics) happens
in the C++ core (lucid_amp._C._GradScaler). This module turns Python arguments into what
the core takes and speaks the protocol of PyTorch's optimizers: each call describes the
optimizer to the core by its id(), the parameters of its param_groups, a callable that
runs ``optimizer.step(*args, **kwargs)`` and, for an optimizer that sets
``_step_supports_amp_scaling``, the hand-off of the scale and the overflow flag that
PyTorch's own GradScaler makes (the attributes ``optimizer.grad_scale`` and
``optimizer.found_inf``, set for the step and removed after it).
"""

import dataclasses
import inspect
import math
import operator
import warnings
from collections import abc
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch.amp.grad_scaler import OptState

from . import _C, _dtensor
from ._dynamo import opaque_to_dynamo

__all__ = ["GradScaler", "ScalerCounters", "OverflowReport", "NonFiniteGradient", "BackoffEvent"]

# The core's stages 0, 1, 2: by name (stage()) and as PyTorch's OptState
# (_per_optimizer_states).
_STAGES = ("ready", "unscaled", "stepped")
_OPT_STATES = (OptState.READY, OptState.UNSCALED, OptState.STEPPED)

_CLOSURE_MESSAGE = (
    "GradScaler.step does not accept a closure while the scaler is enabled: the closure "
    "would re-run backward() and its gradients would never be unscaled. Run "
    "forward/backward yourself, then call step(optimizer)."
)


@dataclasses.dataclass(frozen=True)
class ScalerCounters:
    """What the scaler did since it was built (or since the state it was loaded from)."""

    steps_taken: int
    """step() calls that ran optimizer.step()."""
    steps_skipped: int
    """step() calls that skipped optimizer.step() because a gradient was inf/NaN."""
    updates: int
    """update() calls: every iteration ended, replays of a captured update() included,
    and so are update(new_scale) and the updates_without_checks."""
    overflow_updates: int
    """Of those, the updates that saw an overflow in any optimizer."""
    backoffs: int
    """Updates that multiplied the scale by backoff_factor."""
    growths: int
    """Updates that completed growth_interval clean updates and grew the scale."""
    overflow_streak: int
    """Consecutive overflowing updates up to the last one (0 after a clean update)."""
    updates_without_checks: int
    """update() calls with no gradient checked since the previous one (scale left as is)."""
    steps_without_gradients: int
    """step() calls of an optimizer none of whose parameters had a gradient."""
    min_scale_holds: int
    """Backoffs held at min_scale (min_scale_policy="clamp")."""


@dataclasses.dataclass(frozen=True)
class NonFiniteGradient:
    """One gradient that held inf or NaN after unscaling."""

    param_group: int
    index: int
    name: str
    """The name given with set_parameter_names (empty when none was)."""
    nan_count: int
    inf_count: int
    numel: int
    sizes: Tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    optimizer_key: int
    """id() of the optimizer the parameter belongs to."""


@dataclasses.dataclass(frozen=True)
class OverflowReport:
    """Which gradients overflowed in one iteration (between two update() calls)."""

    iteration: int
    scale: float
    optimizers: int
    uninspected_optimizers: int
    gradients: Tuple[NonFiniteGradient, ...]
    text: str

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class BackoffEvent:
    """What a backoff callback receives, once per backoff, after update() applied it."""

    iteration: int
    old_scale: float
    new_scale: float
    overflow_streak: int
    report: Optional[OverflowReport]


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One update() as the step log recorded it on the device (GradScaler.history)."""

    update: int
    """The update's number among those that ran the schedule (replays of a captured one
    included), from 0; after lucid-amp's own state is restored, on from its count."""
    scale: float
    """The scale the iteration's gradients were divided by."""
    new_scale: float
    """The scale after the update."""
    found_inf: bool
    """Whether a gradient of the iteration held inf/NaN (its steps were skipped)."""
    overflowed_optimizers: Tuple[int, ...]
    """Which optimizers' gradients held inf/NaN, ascending: j names the iteration's j-th
    optimizer, from 0, in the order of each one's first unscale_, clip_grad_norm_ or step
    since the update before; STEP_LOG_OPTIMIZERS - 1 (23) stands for that one and every
    later one. Empty exactly when found_inf is False."""
    first_overflow: Optional[Tuple[int, int]]
    """The first gradient the iteration's checks found holding inf/NaN once unscaled, as
    (optimizer, parameter): the first such optimizer (numbered as in
    overflowed_optimizers) and its first such parameter, by position among its
    parameters with the param groups concatenated (parameters without a gradient count).
    None when none did; so also when only a found-inf hook raised the flag (another rank)
    or the norm alone overflowed."""
    nan_count: int
    """How many gradient entries held NaN once unscaled, over the iteration's checks (each
    optimizer's gradients as its first unscale_, clip_grad_norm_ or step saw them)."""
    inf_count: int
    """How many held inf (one that overflowed only once unscaled counts), as nan_count."""
    change: str
    """What the update did to the scale: "none", "growth", "absorbed" (an overflow taken
    by hysteresis) or "backoff"."""
    grad_norm: Optional[float]
    """The norm the iteration's last clip_grad_norm_ returned (of the unscaled gradients,
    before clipping); None when the iteration did not clip."""


def _report(d: Optional[dict]) -> Optional[OverflowReport]:
    if d is None:
        return None
    grads = tuple(NonFiniteGradient(**g) for g in d["gradients"])
    return OverflowReport(
        iteration=d["iteration"],
        scale=d["scale"],
        optimizers=d["optimizers"],
        uninspected_optimizers=d["uninspected_optimizers"],
        gradients=grads,
        text=d["text"],
    )


def clip_grad_norm_(
    parameters,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: Optional[bool] = None,
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` on lucid-amp's multi-tensor pass: clips the
    gradients in place and returns the total norm as a 0-dim float32 tensor on the
    gradients' device, without reading it back.

    Args:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is clipped.
        max_norm: the largest total norm (finite, > 0: else ValueError).
        norm_type: the p of the p-norm, > 0 (``math.inf`` for the largest magnitude).
        error_if_nonfinite: as PyTorch's: a non-finite total norm raises RuntimeError
            before any gradient is clipped (this reads the norm back, one host
            synchronisation; off, nothing is read).
        foreach: as PyTorch's: ``True`` raises RuntimeError for gradients on a device
            that PyTorch's foreach kernels do not serve (the CPU among them), as
            ``torch.nn.utils.clip_grad_norm_`` does; ``None`` and ``False`` change
            nothing: lucid-amp's own multi-tensor kernels clip every device alike.

    Example::

        norm = lucid_amp.clip_grad_norm_(model.parameters(), max_norm=1.0)
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    if any(_dtensor.is_dtensor(p.grad) for p in parameters):
        # A DTensor's norm is taken over every rank's shard, with DTensor's collectives.
        _dtensor.check_clip_arguments(max_norm, norm_type)
        return torch.nn.utils.clip_grad_norm_(
            parameters, max_norm, norm_type, error_if_nonfinite, foreach)
    if foreach:
        from torch.utils._foreach_utils import _device_has_foreach_support

        for p in parameters:
            if p.grad is not None and not _device_has_foreach_support(p.grad.device):
                raise RuntimeError(
                    "foreach=True was passed, but can't use the foreach API on "
                    f"{p.grad.device.type} tensors"
                )
    return _C.clip_grad_norm_(parameters, float(max_norm), float(norm_type), bool(error_if_nonfinite))


def _map_tensors(outputs, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``fn`` applied to a tensor, or to each tensor of nested lists/tuples/iterables (lists
    stay lists, tuples tuples, other iterables become lazy iterators), as PyTorch's scaler
    walks what scale() is given."""
    if isinstance(outputs, torch.Tensor):
        return fn(outputs)
    if isinstance(outputs, abc.Iterable):
        mapped = map(lambda val: _map_tensors(val, fn), outputs)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(mapped)
        return mapped
    raise ValueError("outputs must be a Tensor or an iterable of Tensors")


def _param_groups(optimizer) -> List[Tuple[torch.Tensor, ...]]:
    """The parameters the core is given: ``optimizer``'s, a DTensor one as the plain alias
    of its local shard (lucid_amp._dtensor). Tuples, which the core borrows from without
    copying them again."""
    groups = [tuple(group["params"]) for group in optimizer.param_groups]
    return _dtensor.local_param_groups(optimizer, groups)


def _protocol(optimizer) -> Optional[str]:
    """Which of PyTorch's protocols for scaler-aware optimizers ``optimizer`` follows, if
    it sets ``_step_supports_amp_scaling``: "flag" (PyTorch 2.x: its step reads
    ``self.grad_scale`` and ``self.found_inf``) or "scaler" (the older one, deprecated by
    PyTorch: its step takes a ``grad_scaler`` argument and asks the scaler itself); None
    for any other optimizer."""
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return None
    # Asked on every step: inspect.signature costs tens of microseconds, so the answer is
    # kept per optimizer class (the protocol is the class's).
    cls = type(optimizer)
    protocol = _PROTOCOL_BY_CLASS.get(cls)
    if protocol is None:
        try:
            takes_scaler = "grad_scaler" in inspect.signature(optimizer.step).parameters
        except (TypeError, ValueError):
            takes_scaler = False
        protocol = "scaler" if takes_scaler else "flag"
        _PROTOCOL_BY_CLASS[cls] = protocol
    return protocol


_PROTOCOL_BY_CLASS: Dict[type, str] = {}


def _is_pytorch_fused(optimizer) -> bool:
    """Whether ``optimizer`` is one of torch.optim's own optimizers built with
    ``fused=True``, whose kernels write every gradient they unscale back to memory."""
    return type(optimizer).__module__.startswith("torch.") and any(
        group.get("fused") for group in optimizer.param_groups
    )


# PyTorch's words, so that a warnings filter written for torch.amp.GradScaler matches.
_PASSING_ITSELF_WARNING = (
    "GradScaler is going to stop passing itself as a keyword argument to the passed "
    "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
    "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly."
)

# torch.amp.GradScaler's private methods that its own public methods call and that a
# subclass of it may override to change them. lucid_amp.GradScaler's methods run in the
# C++ core and never call them, so an override would be silently ignored: a subclass
# that defines one is refused when it is created.
_PYTORCH_EXTENSION_POINTS = (
    "_unscale_grads_",
    "_maybe_opt_step",
    "_lazy_init_scale_growth_tracker",
    "_check_scale_growth_tracker",
    "_get_growth_tracker",
)

_SUPPORTED_DEVICES = ("cuda", "cpu")


def _device_type(device: Any) -> str:
    """The device type of ``device`` (a str such as "cuda" or "cuda:1", or a torch.device),
    or ValueError when it is none of the types lucid-amp has kernels for."""
    if isinstance(device, torch.device):
        kind = device.type
    elif isinstance(device, str):
        try:
            kind = torch.device(device).type
        except RuntimeError:
            kind = device
    else:
        raise ValueError(
            f"GradScaler: device must be a device type such as 'cuda' or 'cpu' (a str or a "
            f"torch.device), got {device!r}. torch.cuda.amp.GradScaler's first argument "
            "was init_scale: pass it by keyword (init_scale=...)."
        )
    if kind not in _SUPPORTED_DEVICES:
        raise ValueError(
            f"GradScaler: lucid-amp has no kernels for device {device!r}; supported devices "
            "are 'cuda' (also 'cuda:N' or a torch.device of it) and 'cpu'."
        )
    return kind


class _OptimizerStates(abc.Mapping):
    """torch.amp.GradScaler's ``_per_optimizer_states``, read from the core: per id() of
    an optimizer seen since the last update(), a new dict of its ``"stage"`` (an
    ``OptState``) and its ``"found_inf_per_device"`` ({device: float32 0-dim flag}, empty
    while ready). As PyTorch's defaultdict, an unknown id reads as ready; writing to a
    dict it returns changes nothing in the scaler."""

    def __init__(self, scaler: "GradScaler") -> None:
        self._scaler = scaler

    def __getitem__(self, key: int) -> Dict[str, Any]:
        return self._scaler._optimizer_state(key)

    def __iter__(self):
        return iter(list(self._scaler._active))

    def __len__(self) -> int:
        return len(self._scaler._active)

    # As a dict's: only the optimizers seen count as present (__getitem__ answers for any).
    def __contains__(self, key: object) -> bool:
        return key in self._scaler._active

    def get(self, key: int, default: Any = None) -> Any:
        return self[key] if key in self else default


def _integer(name: str, value: Any) -> int:
    """``value`` as an int, or TypeError: a count given as 2.5 is refused, not truncated
    (PyTorch's scaler fails on it at the first update())."""
    if not hasattr(type(value), "__index__"):
        raise TypeError(
            f"GradScaler: {name} must be an int, got {value!r} ({type(value).__name__})."
        )
    return operator.index(value)


class GradScaler(torch.amp.GradScaler):
    """A drop-in for ``torch.amp.GradScaler`` on lucid-amp's C++ core.

    ``torch.amp.GradScaler(...)`` code keeps working when only the import changes::

        scaler = lucid_amp.GradScaler("cuda")
        for inputs, target in data:
            optimizer.zero_grad()
            with lucid_amp.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(inputs), target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    Args:
        device: the device type the scaler is for: "cuda" or "cpu", as a str ("cuda:1"
            counts as "cuda") or a torch.device; any other type (xpu, mps, ...) raises
            ValueError, as lucid-amp has no kernels for it. As PyTorch's, a "cuda" scaler
            on a machine without CUDA warns and disables itself. The scale
            tensor itself lives on the device of the first tensor it meets.
        init_scale, growth_factor, backoff_factor, growth_interval, enabled: as
            ``torch.amp.GradScaler``.
        min_scale: guard (0 = off): the smallest scale; what a backoff below it does is
            ``min_scale_policy``.
        min_scale_policy: "throw" (RuntimeError "the loss is diverging", nothing
            applied) or "clamp" (the scale is held at min_scale, steps still skipped).
        max_scale: guard (inf = off): the scale never grows past it.
        hysteresis: guard (1 = off): back off only after this many consecutive
            overflowing updates; the overflowing steps are still skipped.
        hysteresis_refill: "on_growth" (Megatron-LM's rule) or "on_clean_update"
            (DeepSpeed's consecutive_hysteresis): when the hysteresis count is refilled.
        overflow_warning_streak: after this many consecutive overflowing updates, one
            warning (a Python UserWarning) with the overflow report; 0 = never.
        max_overflow_streak: guard (0 = off): the update that would make this many
            consecutive overflowing updates raises RuntimeError and applies nothing.
        strict_inf_checks: raise PyTorch's "No inf checks were recorded ..." errors
            (RuntimeError) for a step or an update with no checked gradient, instead of
            counting them.

    Differences from PyTorch, all on misuse: invalid options and float16 gradients raise
    ValueError, complex gradients NotImplementedError, before anything changes.

    It is a ``torch.amp.GradScaler`` (``isinstance`` holds) whose state lives in the C++
    core, not in PyTorch's attributes: the private attributes libraries read (``_scale``,
    ``_growth_tracker``, ``_enabled``, ``_per_optimizer_states``, ...) are read-only views
    of the core with PyTorch's meaning, and a subclass that overrides one of PyTorch's
    private methods that this class never calls (``_unscale_grads_``, ...) is refused
    with TypeError when it is created.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: float = 0.0,
        min_scale_policy: str = "throw",
        max_scale: float = math.inf,
        hysteresis: int = 1,
        hysteresis_refill: str = "on_growth",
        overflow_warning_streak: int = 100,
        max_overflow_streak: int = 0,
        strict_inf_checks: bool = False,
    ) -> None:
        self._device = _device_type(device)
        # PyTorch's test and PyTorch's words, so that a warnings filter written for
        # torch.amp.GradScaler matches this one too.
        if (enabled and self._device == "cuda"
                and torch.cuda.amp.common.amp_definitely_not_available()):
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2,
            )
            enabled = False
        # The core checks each option's type and range; the keywords are its option names.
        self._core = _C._GradScaler(
            init_scale=float(init_scale),
            growth_factor=float(growth_factor),
            backoff_factor=float(backoff_factor),
            growth_interval=_integer("growth_interval", growth_interval),
            enabled=bool(enabled),
            min_scale=float(min_scale),
            min_scale_policy=min_scale_policy,
            max_scale=float(max_scale),
            hysteresis=_integer("hysteresis", hysteresis),
            hysteresis_refill=hysteresis_refill,
            overflow_warning_streak=_integer("overflow_warning_streak", overflow_warning_streak),
            max_overflow_streak=_integer("max_overflow_streak", max_overflow_streak),
            strict_inf_checks=bool(strict_inf_checks),
        )
        self._forget_iteration()

    def _forget_iteration(self) -> None:
        # The optimizers seen since the last update(), by id(): pickling is refused while
        # any is in an iteration, as PyTorch's, and _per_optimizer_states lists them.
        self._active: Dict[int, Any] = {}
        # Overflow flags the core handed over in this iteration, by id() of the optimizer.
        self._flags: Dict[int, torch.Tensor] = {}
        # id()s of the optimizers whose step() runs now with grad_scaler=self.
        self._passing_itself: Dict[int, None] = {}

    # ---- the loop ------------------------------------------------------------------------

    def scale(self, outputs):
        """Multiplies a tensor, or the tensors of nested lists/tuples, by the scale.

        Returns the same structure (lists stay lists, tuples tuples); the result is at
        least float32 and keeps the autograd graph. Disabled: returns ``outputs``.
        """
        if not self._core.is_enabled():
            return outputs
        return _map_tensors(outputs, self._core.scale)

    @_dtensor.agreeing
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides ``optimizer``'s gradients by the scale in place and records overflow.

        Call it before clipping; step() then does not divide a second time. A second
        unscale_ before update(), or an unscale_ after step(), raises RuntimeError.
        """
        if not self._core.is_enabled():
            return
        key = id(optimizer)
        self._core.unscale_(key, _param_groups(optimizer))
        self._active[key] = optimizer

    def clip_grad_norm_(
        self, optimizer: torch.optim.Optimizer, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """``unscale_(optimizer)`` and ``torch.nn.utils.clip_grad_norm_`` over its parameters
        in one read pass; returns the total norm of the unscaled gradients as a 0-dim
        float32 tensor on the scale's device (no host synchronisation). A fused optimizer
        gets the clip folded into its step and its ``.grad`` stays scaled; any other one has
        its gradients written once. A non-finite norm skips the step. Raises ValueError for
        ``max_norm <= 0`` or ``norm_type <= 0`` and the RuntimeErrors of unscale_.
        """
        if not self._core.is_enabled():
            return clip_grad_norm_(
                [p for g in optimizer.param_groups for p in g["params"]], max_norm, norm_type
            )
        if _dtensor.has_dtensor_params(optimizer):
            return _dtensor.clip_grad_norm_(self, optimizer, max_norm, norm_type)
        key = id(optimizer)
        norm = self._core.clip_grad_norm_(
            key, _param_groups(optimizer), float(max_norm), float(norm_type),
            _protocol(optimizer) == "flag",
        )
        self._active[key] = optimizer
        return norm

    @_dtensor.agreeing
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[Any]:
        """Unscales if needed, then runs ``optimizer.step(*args, **kwargs)`` unless the
        gradients held inf/NaN. Returns what ``optimizer.step`` returned, or None when the
        step was skipped. A closure is refused while the scaler is enabled.

        An optimizer with ``_step_supports_amp_scaling`` (PyTorch's fused optimizers,
        lucid_amp.optim's) gets the overflow flag as ``optimizer.found_inf`` and skips on
        the device; step returns its value as PyTorch's GradScaler does, without waiting
        for the device. It also gets the scale as ``optimizer.grad_scale`` (times a
        ``grad_scale`` set on it before step(), as PyTorch's) and unscales as it reads, so
        the scaler's pass only checks; torch.optim's own fused optimizers instead get their
        gradients unscaled by the scaler's pass (their kernels would write them back
        unscaled, a slower step) and only a preset ``grad_scale``. Both are removed after
        the step. An optimizer whose step takes ``grad_scaler`` (PyTorch's older protocol)
        gets PyTorch's FutureWarning and ``grad_scaler=self``, and unscales or checks
        through unscale_ or _check_inf_per_device itself.
        """
        if not self._core.is_enabled():
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs or (args and callable(args[0])):
            raise RuntimeError(_CLOSURE_MESSAGE)
        key = id(optimizer)
        protocol = _protocol(optimizer)
        if protocol == "scaler":
            warnings.warn(_PASSING_ITSELF_WARNING, FutureWarning, stacklevel=2)
            return self._step_passing_itself(optimizer, args, kwargs)
        result = []

        def run_step():
            result.append(optimizer.step(*args, **kwargs))

        if protocol is None:
            ran = self._core.step(key, _param_groups(optimizer), run_step, None)
            self._active[key] = optimizer
            return result[0] if ran and result else None

        # A grad_scale the caller set on the optimizer before step() multiplies the
        # scaler's, as PyTorch's scaler does: the optimizer divides by both.
        preset = optimizer.__dict__.get("grad_scale")

        def hand_off(scale, found_inf):
            if scale is None:
                optimizer.grad_scale = preset
            else:
                optimizer.grad_scale = scale if preset is None else scale * preset
            optimizer.found_inf = found_inf
            if found_inf is not None:
                self._flags[key] = found_inf

        groups = _param_groups(optimizer)
        if (_is_pytorch_fused(optimizer) and self._core.stage(key) == 0
                and self._core.scale_tensor() is not None):
            # PyTorch's fused kernels write a gradient they unscale back to memory: one
            # read-write pass here (unscaling and checking) then costs less than a check
            # plus their slower step. They get found_inf and no scale, as after unscale_.
            # Before any scale() there is no scale, and step() below says so.
            self._core.unscale_(key, groups)
        try:
            self._core.step(key, groups, run_step, hand_off)
        finally:
            # Removed after the step, the preset too, as PyTorch's scaler leaves it.
            for name in ("grad_scale", "found_inf"):
                if name in optimizer.__dict__:
                    delattr(optimizer, name)
        self._active[key] = optimizer
        return result[0] if result else None

    def _step_passing_itself(self, optimizer, args, kwargs):
        """step() for an optimizer of PyTorch's older protocol: it runs its step with
        ``grad_scaler=self`` and unscales or checks its gradients itself, through unscale_,
        _get_scale_async and _check_inf_per_device, as with PyTorch's scaler. A check it
        did not ask for is made after its step, so that update() sees its gradients."""
        key = id(optimizer)
        if self._core.scale_tensor() is None or self._core.stage(key) == 2:
            # The core raises its error for a step before scale() or a second step.
            self._core.step(key, _param_groups(optimizer), lambda: None, lambda *_: None)
        self._active[key] = optimizer
        self._passing_itself[key] = None
        try:
            result = optimizer.step(*args, **dict(kwargs, grad_scaler=self))
        finally:
            del self._passing_itself[key]
        if self._core.stage(key) != 2:
            self._record_check(optimizer)
        return result

    def _record_check(self, optimizer) -> torch.Tensor:
        """Checks ``optimizer``'s gradients in the core (as unscaled already when it is
        in the unscaled stage), keeps the flag and puts the optimizer in the stepped stage."""
        key = id(optimizer)

        def keep(scale, found_inf):
            if found_inf is not None:
                self._flags[key] = found_inf

        self._core.step(key, _param_groups(optimizer), lambda: None, keep)
        self._active[key] = optimizer
        flag = self._flags.get(key)
        if flag is None:
            flag = torch.zeros((), dtype=torch.float32, device=self._core.scale_tensor().device)
            self._flags[key] = flag
        return flag

    def update(self, new_scale: Union[None, float, torch.Tensor] = None) -> None:
        """Backs off or grows the scale (or sets ``new_scale``, a float or a 1-element
        tensor) and returns every optimizer to the ready stage."""
        if not self._core.is_enabled():
            return
        if new_scale is not None:
            if isinstance(new_scale, torch.Tensor):
                reason = "new_scale should be a float or a 1-element torch.FloatTensor with requires_grad=False."
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError(reason)
                new_scale = float(new_scale.item())
            else:
                new_scale = float(new_scale)
        self._core.update(new_scale)
        self._forget_iteration()

    # ---- queries and settings, as torch.amp.GradScaler -------------------------------------

    def get_scale(self) -> float:
        """The current scale as a Python float (reads it back from its device); 1.0 when
        disabled."""
        return self._core.get_scale()

    def is_enabled(self) -> bool:
        """Whether the scaler scales (False when built with ``enabled=False``, or for
        "cuda" on a machine without CUDA)."""
        return self._core.is_enabled()

    def get_growth_factor(self) -> float:
        """The factor the scale is multiplied by after ``growth_interval`` clean updates."""
        return self._core.options()["growth_factor"]

    def set_growth_factor(self, new_factor: float) -> None:
        """Sets the growth factor (finite, > 1, else ValueError and nothing changes); the
        scale and its trackers are kept."""
        self._set_option("growth_factor", float(new_factor))

    def get_backoff_factor(self) -> float:
        """The factor the scale is multiplied by after an update that saw inf/NaN."""
        return self._core.options()["backoff_factor"]

    def set_backoff_factor(self, new_factor: float) -> None:
        """Sets the backoff factor (in (0, 1), else ValueError and nothing changes); the
        scale and its trackers are kept."""
        self._set_option("backoff_factor", float(new_factor))

    def get_growth_interval(self) -> int:
        """How many consecutive clean updates grow the scale."""
        return int(self._core.options()["growth_interval"])

    def set_growth_interval(self, new_interval: int) -> None:
        """Sets the growth interval: an int (else TypeError) in [1, 2**31 - 1] (else
        ValueError); nothing changes on error. A growth tracker past the new interval is
        brought to its last step."""
        self._set_option("growth_interval", _integer("new_interval", new_interval))

    def _set_option(self, key: str, value) -> None:
        if self._core.is_enabled():
            # The core validates it (ValueError) and keeps its scale and trackers.
            state = self._core.state_dict()
            state[key] = float(value)
            if key == "growth_interval":
                state["growth_tracker"] = min(state["growth_tracker"], value - 1)
            self._core.load_state_dict(state)
        else:
            options = self._core.options()
            options[key] = value
            self._core = _C._GradScaler(**options)

    # ---- state -------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """PyTorch's keys (``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker``), so that the dict loads into
        ``torch.amp.GradScaler`` and back; plus ``min_scale``/``max_scale``/``hysteresis``
        and ``overflow_tracker`` where a guard is on. Empty when disabled."""
        if not self._core.is_enabled():
            return {}
        state = self._core.state_dict()
        out: Dict[str, Any] = {
            "scale": state.pop("scale"),
            "growth_factor": state.pop("growth_factor"),
            "backoff_factor": state.pop("backoff_factor"),
            "growth_interval": int(state.pop("growth_interval")),
            "_growth_tracker": int(state.pop("growth_tracker")),
        }
        for key, value in state.items():
            out[key] = int(value) if key in ("hysteresis", "overflow_tracker") else value
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a state_dict of this class or of ``torch.amp.GradScaler``.

        Raises, leaving the scaler unchanged: TypeError when ``state_dict`` is not a
        mapping or a value is neither a number nor a one-element tensor (naming the key);
        RuntimeError when it is empty (saved from a disabled scaler); ValueError when a
        value is out of its range. A disabled scaler ignores it, as PyTorch's does.
        """
        if not self._core.is_enabled():
            return
        if not isinstance(state_dict, abc.Mapping):
            raise TypeError(
                "GradScaler.load_state_dict: state_dict must be a dict of names to numbers, "
                f"as state_dict() returns; got {type(state_dict).__name__}."
            )
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        state = {}
        for key, value in state_dict.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if not isinstance(value, (int, float)):
                raise TypeError(
                    f"GradScaler.load_state_dict: state_dict[{key!r}] must be a number or a "
                    f"one-element tensor, got {type(value).__name__}. Nothing was loaded."
                )
            state[str(key)] = float(value)
        self._core.load_state_dict(state)

    def __getstate__(self) -> Dict[str, Any]:
        if self._core.is_enabled() and self._active:
            raise RuntimeError(
                "A GradScaler instance may only be pickled at the beginning "
                "of an iteration, or at the end after scaler.update()."
            )
        options = self._core.options()
        archive = self._core.save_bytes() if self._core.is_enabled() else None
        return {"device": self._device, "options": options, "archive": archive}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._device = state["device"]
        self._core = _C._GradScaler(**state["options"])
        if state["archive"] is not None:
            self._core.load_bytes(state["archive"])
        self._forget_iteration()

    # ---- torch.amp.GradScaler's private attributes, for libraries that read them ----------

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overridden = [name for name in _PYTORCH_EXTENSION_POINTS if name in cls.__dict__]
        if overridden:
            raise TypeError(
                f"{cls.__qualname__} overrides {', '.join(overridden)} of torch.amp.GradScaler. "
                "lucid_amp.GradScaler runs its scaling in lucid-amp's C++ core and never calls "
                "these methods, so the override would be ignored. Subclass "
                "torch.amp.GradScaler instead, or override the public methods "
                "(scale, unscale_, step, update)."
            )

    @property
    def _enabled(self) -> bool:
        return self._core.is_enabled()

    @property
    def _scale(self) -> Optional[torch.Tensor]:
        """The scale as a float32 0-dim tensor; None before the first scale()."""
        return self._core.scale_tensor()

    @property
    def _growth_tracker(self) -> Optional[torch.Tensor]:
        """Consecutive clean updates, an int32 0-dim tensor beside the scale (a copy: the
        core's own tracker is not a tensor); None before the first scale()."""
        scale = self._core.scale_tensor()
        if scale is None:
            return None
        return torch.full((), self._get_growth_tracker(), dtype=torch.int32, device=scale.device)

    @property
    def _init_scale(self) -> float:
        """The scale the scale tensor starts from: the loaded one after load_state_dict
        before any scale(), as PyTorch's."""
        if self._core.is_enabled() and self._core.scale_tensor() is None:
            return self._core.get_scale()
        return self._core.options()["init_scale"]

    @property
    def _init_growth_tracker(self) -> int:
        return self._get_growth_tracker()

    @property
    def _growth_factor(self) -> float:
        return self.get_growth_factor()

    @property
    def _backoff_factor(self) -> float:
        return self.get_backoff_factor()

    @property
    def _growth_interval(self) -> int:
        return self.get_growth_interval()

    @property
    def _per_optimizer_states(self) -> _OptimizerStates:
        return _OptimizerStates(self)

    def _optimizer_state(self, key: int) -> Dict[str, Any]:
        if not isinstance(key, int):
            return {"stage": OptState.READY, "found_inf_per_device": {}}
        stage = _OPT_STATES[self._core.stage(key)]
        found: Dict[torch.device, torch.Tensor] = {}
        if stage is not OptState.READY:
            flag = self._flags.get(key)
            optimizer = self._active.get(key)
            if flag is None and optimizer is not None:
                scale = self._core.scale_tensor()
                flag = torch.full(
                    (), float(self._core.overflowed(key, _param_groups(optimizer))),
                    dtype=torch.float32, device=scale.device,
                )
            if flag is not None:
                found[flag.device] = flag
        return {"stage": stage, "found_inf_per_device": found}

    def _get_scale_async(self) -> Optional[torch.Tensor]:
        """The scale tensor, without reading it back (None before the first scale())."""
        return self._core.scale_tensor()

    def _get_growth_tracker(self) -> int:
        if not self._core.is_enabled():
            return 0
        return int(self._core.state_dict()["growth_tracker"])

    def _check_scale_growth_tracker(self, funcname: str) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._core.scale_tensor() is None:
            raise AssertionError(
                f"Attempted {funcname} but _scale is None.  This may indicate your script did "
                "not use scaler.scale(loss or outputs) earlier in the iteration."
            )
        return self._scale, self._growth_tracker

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> Dict[torch.device, torch.Tensor]:
        """Checks ``optimizer``'s gradients for inf/NaN without unscaling them; returns
        {device: float32 flag}. Asked by an optimizer from the step() that passes it this
        scaler, the check is that step's and update() sees it; asked at any other time,
        it only reports and the core records nothing."""
        if id(optimizer) in self._passing_itself:
            flag = self._record_check(optimizer)
            return {flag.device: flag}
        found: Dict[torch.device, torch.Tensor] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce()._values() if p.grad.is_sparse else p.grad
                bad = (~torch.isfinite(grad)).any().to(torch.float32)
                device = grad.device
                found[device] = torch.maximum(found[device], bad) if device in found else bad
        return found

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> Dict[torch.device, torch.Tensor]:
        return self._optimizer_state(id(optimizer))["found_inf_per_device"]

    def _unscale_grads_(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "lucid_amp.GradScaler unscales in lucid-amp's C++ core; call unscale_(optimizer)."
        )

    def _maybe_opt_step(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "lucid_amp.GradScaler steps in lucid-amp's C++ core; call step(optimizer)."
        )

    def _lazy_init_scale_growth_tracker(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "lucid_amp.GradScaler creates its scale in lucid-amp's C++ core at the first scale()."
        )

    # ---- lucid-amp's extras ------------------------------------------------------------------

    def counters(self) -> ScalerCounters:
        """Counters of steps and scale changes (a disabled scaler counts nothing)."""
        return ScalerCounters(**self._core.counters())

    def step_skipped(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the last step() of ``optimizer`` skipped optimizer.step(); survives
        update(), so an LR scheduler can ask after the iteration."""
        return self._core.step_skipped(id(optimizer))

    def overflowed(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer``'s gradients held inf/NaN in this iteration (False before
        unscale_/step)."""
        if not self._core.is_enabled():
            return False
        return self._core.overflowed(id(optimizer), _param_groups(optimizer))

    def last_overflow(self) -> Optional[OverflowReport]:
        """The report of the last iteration that overflowed (None if none has): which
        parameters held NaN/inf, by name once set_parameter_names was called."""
        return _report(self._core.last_overflow())

    def history(self, wait: bool = False) -> List[StepRecord]:
        """The step log: what each of the last STEP_LOG_CAPACITY (1024) updates that ran
        the schedule did, oldest first, recorded on the device by the update itself
        (replays of a captured update included). Never waits for the device unless
        ``wait``: it returns what its last copy of the log held once that copy has landed
        and starts the next one, so on a GPU a call sees the updates queued before the
        previous call; ``wait=True`` copies now and waits. Empty before the first scale(); restoring lucid-amp's own
        state (its state_dict, pickle) clears it, PyTorch's state_dict keys keep it."""
        return [StepRecord(**r) for r in self._core.history(wait)]

    def set_parameter_names(
        self, named_parameters: Iterable[Tuple[str, torch.Tensor]], prefix: str = ""
    ) -> None:
        """Names parameters for the overflow report, e.g.
        ``scaler.set_parameter_names(model.named_parameters())``. Held weakly."""
        for name, param in named_parameters:
            self._core.set_parameter_name(_dtensor.local_param(param), prefix + name)

    def set_backoff_callback(self, fn: Optional[Callable[[BackoffEvent], None]]) -> None:
        """``fn(event)`` is called on every backoff, after update() applied it; None
        removes it."""
        if fn is None:
            self._core.set_backoff_callback(None)
            return

        def call(event: dict) -> None:
            fn(
                BackoffEvent(
                    iteration=event["iteration"],
                    old_scale=event["old_scale"],
                    new_scale=event["new_scale"],
                    overflow_streak=event["overflow_streak"],
                    report=_report(event["report"]),
                )
            )

        self._core.set_backoff_callback(call)

    def set_found_inf_hook(
        self,
        fn: Optional[Callable[[torch.Tensor], None]],
        norm_fn: Optional[Callable[[torch.Tensor, torch.Tensor, float], None]] = None,
    ) -> None:
        """``fn(found_inf)`` is called with each optimizer's overflow flag (a float32
        0-dim tensor on the scale's device; non-zero means overflow) each time unscale_ or
        step computes it, before anything reads it; ``fn`` may change it in place (any
        non-zero value it leaves is an overflow, and the flag is then made exactly 1).
        ``norm_fn(found_inf, norm_partial, norm_type)``, if given, is what clip_grad_norm_
        calls instead, with the flag and the partial of the norm (the sum of ``|g|**p``, or
        the largest ``|g|`` for inf; float32 0-dim), both to be changed in place: a rank that
        owns a shard of the parameters combines them across ranks there, and clips by the
        norm of all of them. lucid_amp.distributed.bind_to_group uses it. ``fn=None``
        removes both (a ``norm_fn`` alone raises ValueError). For an optimizer with DTensor
        parameters, ``fn`` runs after the flag is agreed over the DTensors' meshes."""
        self._core.set_found_inf_hook(fn, norm_fn)
        self._found_inf_hooks = (fn, norm_fn)

    def stage(self, optimizer: torch.optim.Optimizer) -> str:
        """Where ``optimizer`` is in this iteration: "ready", "unscaled" or "stepped"."""
        return _STAGES[self._core.stage(id(optimizer))]


# Each public method is one opaque call under torch.compile, as each method of
# torch.amp.GradScaler is (Dynamo skips torch.amp): _dynamo.opaque_to_dynamo says why.
opaque_to_dynamo(GradScaler)
