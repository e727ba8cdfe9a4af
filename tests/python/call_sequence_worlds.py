# SPDX-License-Identifier: BSD-3-Clause
"""The interpreter behind test_call_sequences.py: runs one generated program of calls in two
worlds built alike and compares them after every call.

World A is lucid_amp.GradScaler("cpu") with a lucid_amp.optim fused optimizer or a
torch.optim one (foreach=False); world B is torch.amp.GradScaler("cpu") with the
torch.optim optimizer of the same rule (foreach=False), the reference.

A program is plain JSON (lists, dicts, numbers, strings), so that it can cross a pipe and
be saved to a file. Run as a script, this module is the worker the test starts: it reads
one program per line on stdin and answers one JSON line each on the stdout it was started
with (anything the libraries print goes to stderr). ``python call_sequence_worlds.py
FILE.json`` runs the one program saved in FILE.json in this process and prints the
outcome, so that a crash reproduces under gdb or a sanitizer as it is.

The oracle, call by call:

- both worlds raise at the same call, or neither does (any exception type). After an
  exception of the scaler's stage machine (unscale_ twice, step twice, unscale_ after
  step, a call before any scale()) the program goes on: both contracts say such a call
  changes nothing. After any other exception (from the optimizer's step: a tensor of the
  wrong size, say) the program ends: PyTorch's per-parameter loop may have updated some
  parameters before it raised, which lucid-amp's contract does not mirror.
- the same scale (get_scale(), exactly), the same state_dict() of the scaler, the same
  skip decision at every step (world B: whether the scaler called optimizer.step()).
- after each update() that ran the schedule, world A's step log ends with its record: the
  scales before and after it as world B's, the change the scale made, an overflow for
  every backoff or absorbed one, the optimizers (by first use in the iteration) in
  which world B's scaler found inf, the first gradient among them that held inf/NaN
  once unscaled and how many NaN and inf entries they held, as world B's gradients stood
  at each optimizer's first check.
- the same parameters and gradients, bit for bit, when world A's optimizer is a
  torch.optim one. A fused optimizer is not bitwise equal to torch.optim (its kernel
  unscales as it reads and uses its own operation order); there every step is compared
  within torch.optim's float32 tolerance (rtol 1e-5, atol 1e-6, as test_optim.py) and the
  step counters exactly, and then world B's parameters, state and gradients are set to
  world A's, so that the tolerance applies to one step and never to an accumulated drift.
  Clipping sums in another order than PyTorch's: its norm and the clipped gradients are
  compared within the same tolerance and world B then takes world A's gradients.

Deliberate differences (docs/behaviour.md), coded here: each is checked where it happens
(world A does what lucid-amp's contract says, world B what PyTorch does) and then ends
the program, because the two worlds' hidden state (PyTorch's per-optimizer records, a
refused call's effects) differs from there on.

- a step of an optimizer none of whose parameters has a gradient, and an update() with no
  overflow check since the last one: PyTorch raises "No inf checks were recorded"; lucid-
  amp runs the step and leaves the scale as it is.
- update(new_scale) with a value that is not finite and > 0, and clip_grad_norm_ with
  max_norm <= 0: lucid-amp raises ValueError, PyTorch applies it.
- update(new_scale) with a tensor of shape [1]: lucid-amp takes any 1-element tensor, as
  PyTorch's documentation says; PyTorch's own scale is 0-dim and its copy_ raises.
- a non-finite clipping norm of finite gradients counts as an overflow in lucid-amp (the
  step is skipped); PyTorch clips by it and steps.
- the floor: PyTorch's scale may fall below float32's smallest normal value; lucid-amp's
  stops there. A program whose reference scale leaves the normal range ends.
- a fused optimizer's gradients stay scaled in memory after clip_grad_norm_ and step (the
  kernel unscales as it reads): they are not compared there, and world B takes world A's
  once both treat them as scaled again (after update(), a fresh scaler or optimizer); a
  backward() or another clip before the step ends the program, after zero_grad too (world
  A's step still divides by scale / coefficient).
- clip_grad_norm_ with norm_type inf over gradients one of which is empty: PyTorch's
  _foreach_norm raises, lucid-amp clips by the largest magnitude of the others.
- a fused optimizer checks its gradients and state at every step, also one the device
  will skip on an overflow (the host does not know it will be skipped; PyTorch's scaler
  then never calls optimizer.step(), which would raise), and refuses a momentum buffer of
  another dtype than its parameter, which torch.optim.SGD updates: where world A raises at
  such a step and world B does not, the program ends.
- a fused kernel's arithmetic on non-finite values (a gradient poisoned after its check,
  so that the step runs) may give inf where torch.optim gives NaN: where values are
  non-finite must agree, not which non-finite value they are.
"""

import copy
import json
import math
import os
import sys
import traceback

if __name__ == "__main__":
    # Run as a script: lucid_amp from python/ where it was built in place, as conftest.py
    # picks it for pytest.
    _IN_PLACE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "python")
    if (os.path.isdir(os.path.join(_IN_PLACE, "lucid_amp"))
            and not os.environ.get("LUCID_AMP_TEST_INSTALLED")):
        sys.path.insert(0, _IN_PLACE)

import torch
from torch.amp.grad_scaler import OptState

import lucid_amp
import lucid_amp.optim

# Float32's smallest normal value: lucid-amp's backoff floor.
FLOAT32_TINY = torch.finfo(torch.float32).tiny
TOL = dict(rtol=1e-5, atol=1e-6)

# PyTorch's messages for the stage errors after which both worlds are unchanged.
STAGE_ERRORS = (
    "has already been called",
    "is being called after step()",
    "but _scale is None",
)

TORCH_CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
FUSED_CLASSES = {
    "sgd": lucid_amp.optim.FusedSGD,
    "adam": lucid_amp.optim.FusedAdam,
    "adamw": lucid_amp.optim.FusedAdamW,
}


class Divergence(AssertionError):
    """The worlds disagree: world A does not do what the oracle says."""


class EndProgram(Exception):
    """The program ends here, the worlds agreeing so far (the reason is counted)."""


def _values(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


class World:
    """One side: parameters, a scaler and an optimizer, built from the program alone."""

    def __init__(self, program, lucid):
        self.lucid = lucid
        self.program = program
        kind = program["optimizer"]
        self.fused = lucid and kind["fused"]
        self.params = [torch.nn.Parameter(_values(shape, program["init"] + i))
                       for i, shape in enumerate(program["shapes"])]
        self.scaler = self.new_scaler(program["scaler"])
        if lucid and program.get("graph_safe"):
            # The Python front has no graph_safe keyword (a CUDA capture needs none); the
            # core it binds has the mode, and the same core with it on replaces its own.
            options = self.scaler._core.options() | {"graph_safe": True}
            self.scaler._core = lucid_amp._C._GradScaler(**options)
        self.kept = []  # replaced optimizers and scalers stay alive: no id() is reused
        groups = []
        for indices, lr in zip(program["groups"], program["group_lr"]):
            group = {"params": [self.params[i] for i in indices]}
            if lr is not None:
                group["lr"] = lr
            groups.append(group)
        self.step_calls = 0
        self.opt = self.new_optimizer(groups)

    def new_scaler(self, options):
        cls = lucid_amp.GradScaler if self.lucid else torch.amp.GradScaler
        return cls("cpu", **options)

    def new_optimizer(self, groups):
        kind = self.program["optimizer"]
        if self.fused:
            opt = FUSED_CLASSES[kind["rule"]](groups, **kind["kwargs"])
        else:
            opt = TORCH_CLASSES[kind["rule"]](groups, foreach=False, **kind["kwargs"])
        step = opt.step

        def counted_step(*args, **kwargs):
            self.step_calls += 1
            return step(*args, **kwargs)

        opt.step = counted_step  # the scaler calls optimizer.step: an instance attribute
        return opt

    def group_specs(self):
        return [{k: v for k, v in g.items()} | {"params": list(g["params"])}
                for g in self.opt.param_groups]

    def opt_params(self):
        return [p for g in self.opt.param_groups for p in g["params"]]


def _same(a, b, exact):
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if exact:
        return torch.equal(a, b) or (a.isnan().any() and torch.equal(a.nan_to_num(), b.nan_to_num())
                                     and torch.equal(a.isnan(), b.isnan()))
    # a fused kernel's arithmetic on a non-finite gradient (one poisoned after its check)
    # may give inf where torch.optim's lerp gives NaN: where, not which, must agree
    finite = a.isfinite()
    if not torch.equal(finite, b.isfinite()):
        return False
    return torch.allclose(a[finite], b[finite], **TOL)


class Pair:
    """Both worlds and the comparison between them."""

    def __init__(self, program):
        self.program = program
        self.a = World(program, lucid=True)
        self.b = World(program, lucid=False)
        self.fused = self.a.fused
        # gradients of world A that legitimately differ from world B's until the next
        # step (a fused optimizer's after clip_grad_norm_)
        self.grads_apart = False
        # for a fused optimizer, whether world A's skip is asked for at the step or at
        # the next update() (the deferred outcome)
        self.pending_skip = None
        # a gradient or state was made inconsistent with its parameter (bad_grad, bad_state)
        self.tensors_inconsistent = False
        # per optimizer of world B (by id) in this iteration, as its gradients stood at its
        # first check once unscaled: (the position of its first parameter whose gradient
        # held inf/NaN or None, NaN entries, inf entries), or "apart" where world A's
        # gradients then differed from B's
        self.first_bad = {}
        self.stats = dict(calls=0, both_raised=0, steps=0, skipped=0, updates=0,
                          backoffs=0, growths=0, first_named=0, graph_safe_steps=0)

    # ---- comparison -------------------------------------------------------------------

    def fail(self, what):
        raise Divergence(what)

    def compare_scale(self):
        sa, sb = self.a.scaler.get_scale(), self.b.scaler.get_scale()
        if not (sb >= FLOAT32_TINY and math.isfinite(sb)):
            raise EndProgram("reference scale left float32's normal range (the floor)")
        if sa != sb:
            self.fail(f"scale {sa!r} != reference {sb!r}")
        return sa

    def compare_tensors(self, grads=True, exact=None):
        if exact is None:
            exact = not self.fused
        for i, (p, q) in enumerate(zip(self.a.params, self.b.params)):
            if not _same(p.detach(), q.detach(), exact):
                self.fail(f"parameter {i} differs:\n{p.detach()}\nreference\n{q.detach()}")
            if grads and not self.grads_apart:
                if not _same(p.grad, q.grad, exact and True):
                    self.fail(f"gradient of parameter {i} differs:\n{p.grad}\nreference\n{q.grad}")

    def compare_state(self):
        """Step counters exactly, the other state tensors as parameters are compared."""
        for i, (p, q) in enumerate(zip(self.a.params, self.b.params)):
            sa, sb = self.a.opt.state.get(p, {}), self.b.opt.state.get(q, {})
            for key, vb in sb.items():
                va = sa.get(key)
                if not isinstance(vb, torch.Tensor) or not isinstance(va, torch.Tensor):
                    continue
                if key == "step":
                    if float(va) != float(vb):
                        self.fail(f"state['step'] of parameter {i}: {float(va)} != reference {float(vb)}")
                elif not _same(va, vb, not self.fused):
                    self.fail(f"state[{key!r}] of parameter {i} differs:\n{va}\nreference\n{vb}")

    def compare_private_views(self):
        """PyTorch's private attributes that libraries and user code read (_scale,
        _growth_tracker, _per_optimizer_states' stage and found-inf flag) say in world A
        what they say in world B."""
        sa, sb = self.a.scaler, self.b.scaler
        if (sa._scale is None) != (sb._scale is None):
            self.fail(f"_scale {sa._scale!r} != reference {sb._scale!r}")
        if sb._scale is not None:
            if float(sa._scale) != float(sb._scale):
                self.fail(f"_scale {float(sa._scale)!r} != reference {float(sb._scale)!r}")
            if int(sa._growth_tracker) != int(sb._growth_tracker):
                self.fail(f"_growth_tracker {int(sa._growth_tracker)} != reference "
                          f"{int(sb._growth_tracker)}")
        # (.get: reading PyTorch's defaultdict by [] would add an entry)
        ref = sb._per_optimizer_states.get(id(self.b.opt))
        stage_b = OptState.READY if ref is None else ref["stage"]
        mine = sa._per_optimizer_states[id(self.a.opt)]
        if mine["stage"] is not stage_b:
            self.fail(f"_per_optimizer_states stage {mine['stage']} != reference {stage_b}")
        if stage_b is not OptState.READY and self.pending_skip is None:
            found_a = any(float(t) != 0 for t in mine["found_inf_per_device"].values())
            found_b = any(float(t) != 0 for t in ref["found_inf_per_device"].values())
            if found_a != found_b:
                self.fail(f"_per_optimizer_states found_inf {found_a} != reference {found_b}")

    def sync_b_from_a(self, grads=True):
        """World B takes world A's parameters, state and gradients (after a comparison
        within tolerance), in place: its optimizer keeps its tensors."""
        with torch.no_grad():
            for p, q in zip(self.a.params, self.b.params):
                if p.shape == q.shape:
                    q.copy_(p)
                if grads and p.grad is not None and q.grad is not None and p.grad.shape == q.grad.shape:
                    q.grad.copy_(p.grad)
                sa, sb = self.a.opt.state.get(p, {}), self.b.opt.state.get(q, {})
                for key, vb in sb.items():
                    va = sa.get(key)
                    if (key != "step" and isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)
                            and va.shape == vb.shape and va.dtype == vb.dtype):
                        vb.copy_(va)
        self.grads_apart = False

    def skip_of_a(self, calls_before):
        if self.fused:
            return self.a.scaler.step_skipped(self.a.opt)
        return self.a.step_calls == calls_before

    # ---- one call in both worlds --------------------------------------------------------

    def both(self, fn):
        """fn(world) in A, then in B; returns (exception of A, exception of B)."""
        out = []
        for w in (self.a, self.b):
            try:
                fn(w)
                out.append(None)
            except Exception as e:  # the oracle compares where, not which
                out.append(e)
        return out

    def expect_same_raise(self, ea, eb, call):
        if (ea is None) != (eb is None):
            if ea is None:
                self.fail(f"{call}: PyTorch raised {type(eb).__name__}: {eb}; lucid_amp did not")
            self.fail(f"{call}: lucid_amp raised {type(ea).__name__}: {ea}; PyTorch did not")
        if eb is not None:
            self.stats["both_raised"] += 1
            if not any(m in str(eb) for m in STAGE_ERRORS):
                raise EndProgram("both raised outside the stage machine")
            return True
        return False

    def run(self):
        ops = self.program["ops"]
        self.compare_scale()
        for index, op in enumerate(ops):
            self.stats["calls"] += 1
            try:
                getattr(self, "op_" + op[0])(*op[1:])
                self.compare_private_views()
            except Divergence as d:
                raise Divergence(f"call {index} {op!r}: {d}") from None
            except EndProgram as e:
                return f"ended at call {index} ({op[0]}): {e}"
        self.flush_pending_skip()
        self.compare_scale()
        self.compare_tensors()
        sda, sdb = self.a.scaler.state_dict(), self.b.scaler.state_dict()
        if sda != sdb:
            self.fail(f"end: state_dict {sda} != reference {sdb}")
        return "completed"

    # ---- the calls ----------------------------------------------------------------------

    def op_backward(self, data_seed, mask, poison):
        """scale(loss).backward() over the parameters in ``mask``, then one gradient
        element set to inf/NaN (poison: [parameter, value, fraction of its length])."""
        self.end_if_apart()

        def backward(w):
            loss = None
            for i, p in enumerate(w.params):
                if i < len(mask) and mask[i] and p.numel() > 0:
                    x = _values(p.shape, data_seed + i)
                    term = (torch.tanh(p) * x).sum() + 0.125 * (p * p).sum()
                    loss = term if loss is None else loss + term
            if loss is None:
                # a loss none of whose parameters takes part still goes through scale()
                loss = torch.zeros((), requires_grad=True) * 1.0
            w.scaler.scale(loss).backward()
            if poison is not None:
                i, value, frac = poison
                if i < len(w.params):
                    g = w.params[i].grad
                    if g is not None and g.numel() > 0:
                        with torch.no_grad():
                            g.view(-1)[min(int(frac * g.numel()), g.numel() - 1)] = float(value)

        ea, eb = self.both(backward)
        self.expect_same_raise(ea, eb, "scale(loss).backward()")
        self.compare_tensors()

    def end_if_apart(self, changes_gradients=True):
        """Between a fused optimizer's clip_grad_norm_ and its step, world A's gradients
        are the scaled ones and world B's the unscaled, clipped ones (documented): a call
        that adds to them or clips them again is not comparable, and the program ends."""
        if self.grads_apart and changes_gradients:
            raise EndProgram("gradients changed between a fused optimizer's clip and its step")

    def sync_apart_grads(self):
        """Once both worlds treat the gradients as scaled again (after update(), a fresh
        scaler or optimizer), world B takes world A's."""
        if self.grads_apart:
            with torch.no_grad():
                for p, q in zip(self.a.params, self.b.params):
                    if p.grad is None or q.grad is None or p.grad.shape != q.grad.shape:
                        q.grad = None if p.grad is None else p.grad.clone()
                    else:
                        q.grad.copy_(p.grad)
            self.grads_apart = False

    def note_first_check(self):
        """Before a call that may run the optimizer's first check of the iteration (unscale_,
        clip_grad_norm_, step): where world B's gradients first hold inf/NaN once divided by
        its scale, as its check computes them (float64 gradients in float64, others in
        float32)."""
        opt, scaler = self.b.opt, self.b.scaler
        state = scaler._per_optimizer_states.get(id(opt))
        if scaler._scale is None or (state is not None and state["stage"] is not OptState.READY):
            return
        if self.grads_apart:
            self.first_bad[id(opt)] = "apart"
            return
        inv = scaler._scale.double().reciprocal()
        first, nan, inf = None, 0, 0
        for k, p in enumerate(self.b.opt_params()):
            g = p.grad
            if g is None or g.is_sparse:
                continue
            work = g.double() * inv if g.dtype == torch.float64 else g.float() * inv.float()
            nan += int(torch.isnan(work).sum())
            inf += int(torch.isinf(work).sum())
            if first is None and (nan or inf):
                first = k
        self.first_bad[id(opt)] = (first, nan, inf)

    def op_unscale(self):
        self.note_first_check()

        no_grads = all(p.grad is None for p in self.b.opt_params())
        ea, eb = self.both(lambda w: w.scaler.unscale_(w.opt))
        self.expect_same_raise(ea, eb, "unscale_")
        self.compare_scale()
        self.compare_tensors()
        if no_grads and eb is None:
            # PyTorch recorded no check for this optimizer: its step and update raise
            # "No inf checks were recorded", where lucid-amp's go on (documented)
            raise EndProgram("unscale_ of an optimizer without gradients")

    def _clip(self, kind, max_norm, norm_type):
        self.end_if_apart(kind != "scaler")
        norms = {}

        if kind == "scaler":
            self.note_first_check()

        def clip(w):
            params = w.opt_params()
            if kind == "scaler":
                if w.lucid:
                    norms[w.lucid] = w.scaler.clip_grad_norm_(w.opt, max_norm, norm_type)
                else:
                    w.scaler.unscale_(w.opt)
                    norms[w.lucid] = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
            else:
                fn = lucid_amp.clip_grad_norm_ if w.lucid else torch.nn.utils.clip_grad_norm_
                norms[w.lucid] = fn(params, max_norm, norm_type)

        ea, eb = self.both(clip)
        if max_norm <= 0:
            if ea is None:
                self.fail(f"clip with max_norm {max_norm}: lucid_amp did not refuse it")
            raise EndProgram("max_norm <= 0 (lucid_amp refuses, PyTorch clips)")
        if (ea is None and eb is not None and math.isinf(norm_type)
                and "cannot compute the infinity norm on an empty tensor" in str(eb)):
            # PyTorch's _foreach_norm refuses the inf-norm of an empty gradient; lucid_amp's
            # clip takes the largest magnitude of the others (a difference this test found)
            raise EndProgram("inf-norm clip over an empty gradient (PyTorch raises)")
        self.expect_same_raise(ea, eb, f"clip_grad_norm_ ({kind})")
        if eb is not None:
            return
        na, nb = float(norms[True]), float(norms[False])
        if math.isfinite(na) != math.isfinite(nb) or math.isnan(na) != math.isnan(nb):
            self.fail(f"clip norm {na} != reference {nb}")
        if math.isfinite(nb) and not math.isclose(na, nb, rel_tol=1e-5, abs_tol=1e-6):
            self.fail(f"clip norm {na} != reference {nb}")
        if kind == "scaler" and not math.isfinite(nb):
            found = self.b.scaler._per_optimizer_states[id(self.b.opt)]["found_inf_per_device"]
            if not sum(float(v) for v in found.values()):
                raise EndProgram("non-finite norm of finite gradients (an overflow for lucid_amp)")
        if kind == "scaler" and self.fused:
            # world A's gradients stay scaled; its step divides by scale / coefficient
            self.grads_apart = True
            self.compare_tensors(grads=False)
        else:
            self.compare_tensors(grads=False)
            for i, (p, q) in enumerate(zip(self.a.params, self.b.params)):
                if not _same(p.grad, q.grad, exact=False):
                    self.fail(f"clipped gradient of parameter {i} differs:\n{p.grad}\nreference\n{q.grad}")
            self.sync_b_from_a()

    def op_clip(self, max_norm, norm_type):
        self._clip("scaler", max_norm, norm_type)

    def op_free_clip(self, max_norm, norm_type):
        self._clip("free", max_norm, norm_type)

    def op_step(self):
        self.note_first_check()
        calls = (self.a.step_calls, self.b.step_calls)
        ea, eb = self.both(lambda w: w.scaler.step(w.opt))
        if eb is not None and "No inf checks were recorded for this optimizer" in str(eb):
            if ea is not None:
                self.fail(f"step without gradients: lucid_amp raised {ea!r} (it runs the step)")
            raise EndProgram("step of an optimizer without gradients (documented)")
        if self.fused and self.tensors_inconsistent and ea is not None and eb is None:
            # checked at every step, also one the device will skip (PyTorch's scaler then
            # never calls the optimizer), and stricter on a state's dtype than torch.optim.SGD
            raise EndProgram("a fused optimizer refused an inconsistent tensor (documented)")
        self.expect_same_raise(ea, eb, "step")
        if eb is not None:
            return
        self.stats["steps"] += 1
        self.stats["graph_safe_steps"] += bool(self.program.get("graph_safe"))
        skip_b = self.b.step_calls == calls[1]
        self.stats["skipped"] += skip_b
        if self.fused and self.program["skip_query"] == "later":
            self.pending_skip = skip_b
        else:
            skip_a = self.skip_of_a(calls[0])
            if skip_a != skip_b:
                self.fail(f"step skipped: lucid_amp {skip_a}, reference {skip_b}")
        self.compare_scale()
        self.grads_apart = self.fused
        self.compare_tensors()
        self.compare_state()
        if self.fused:
            self.sync_b_from_a()

    def flush_pending_skip(self):
        if self.pending_skip is not None:
            skip_a = self.a.scaler.step_skipped(self.a.opt)
            if skip_a != self.pending_skip:
                self.fail(f"step skipped (asked later): lucid_amp {skip_a}, reference {self.pending_skip}")
            self.pending_skip = None

    def op_update(self, new_scale):

        before = self.a.scaler.get_scale()
        arg = None
        if new_scale is not None:
            form, value = new_scale
            arg = float(value) if form == "float" else None
        invalid = new_scale is not None and not (math.isfinite(new_scale[1]) and new_scale[1] > 0)

        overflowed = []  # world B's optimizers, by first use, whose gradients overflowed
        # the first gradient of them that held inf/NaN, (place, position), and the NaN and
        # inf entries; "apart" where not compared
        site = {"first": None, "nan": 0, "inf": 0}

        def update(w):
            if w is self.b:
                # PyTorch's records are made at each optimizer's first use in the iteration
                # (insertion order) and dropped by update().
                for place, (key, state) in enumerate(w.scaler._per_optimizer_states.items()):
                    if sum(v.item() for v in state["found_inf_per_device"].values()) > 0:
                        overflowed.append(min(place, lucid_amp.STEP_LOG_OPTIMIZERS - 1))
                    bad = self.first_bad.get(key)
                    if bad == "apart":
                        site["first"] = "apart"
                    elif bad is not None and site["first"] != "apart":
                        if bad[0] is not None and site["first"] is None:
                            site["first"] = (place, bad[0])
                        site["nan"] += bad[1]
                        site["inf"] += bad[2]
                self.first_bad = {}
            if new_scale is not None and new_scale[0] != "float":
                shape = () if new_scale[0] == "tensor0" else (1,)
                w.scaler.update(torch.full(shape, float(new_scale[1])))
            else:
                w.scaler.update(arg)

        ea, eb = self.both(update)
        if eb is not None and "No inf checks were recorded prior to update" in str(eb):
            if ea is not None:
                self.fail(f"update without checks: lucid_amp raised {ea!r}")
            if self.a.scaler.get_scale() != before:
                self.fail("update without checks changed lucid_amp's scale")
            raise EndProgram("update with no check since the last one (documented)")
        if (new_scale is not None and new_scale[0] == "tensor1" and ea is None and eb is not None
                and "doesn't match the broadcast shape" in str(eb)):
            # PyTorch's scale is 0-dim and copy_ of a [1] tensor into it raises, though its
            # documentation asks for a 1-element tensor; lucid_amp takes any 1-element one
            raise EndProgram("update with a [1] tensor (PyTorch's 0-dim scale refuses it)")
        if invalid and not (eb is not None and "but _scale is None" in str(eb)):
            # (before any scale() both refuse the call, for that reason first)
            if not isinstance(ea, ValueError):
                self.fail(f"update({new_scale}): expected lucid_amp's ValueError, got {ea!r}")
            raise EndProgram("update with an invalid new scale (lucid_amp refuses)")
        self.expect_same_raise(ea, eb, "update")
        if eb is None:
            self.sync_apart_grads()
            self.flush_pending_skip()
            self.stats["updates"] += 1
            after = self.compare_scale()
            self.stats["backoffs"] += after < before
            self.stats["growths"] += after > before
            if new_scale is None and self.a.scaler.is_enabled():
                self.check_step_log(before, after, tuple(sorted(set(overflowed))), site)
        self.compare_tensors()

    def check_step_log(self, before, after, overflowed, site):
        """The step log's newest record is this update, as the reference scaler did it:
        its scales, its change, the optimizers (by first use) in which it found inf, and
        `site`: the first gradient that held inf/NaN and the NaN and inf entries ("apart":
        not compared)."""
        log = self.a.scaler.history(wait=True)
        if not log:
            self.fail("a scheduled update left no record in the step log")
        r = log[-1]
        if (r.scale, r.new_scale) != (before, after):
            self.fail(f"step log {r} != scales {before} -> {after}")
        moved = "backoff" if after < before else "growth" if after > before else None
        if moved is not None and r.change != moved:
            self.fail(f"step log {r}: the scale moved by a {moved}")
        if r.change in ("backoff", "absorbed") and not r.found_inf:
            self.fail(f"step log {r}: a backoff without an overflow")
        if r.overflowed_optimizers != overflowed or r.found_inf != bool(overflowed):
            self.fail(f"step log {r}: the reference found inf in optimizers {overflowed}")
        got = {"first": r.first_overflow, "nan": r.nan_count, "inf": r.inf_count}
        if site["first"] != "apart" and got != site:
            self.fail(f"step log {r}: the reference's gradients held {site}")
        self.stats["first_named"] += r.first_overflow is not None

    def op_scaler_state(self, fresh):
        """state_dict() of both scalers compared, then loaded back into the same scaler or
        into a fresh one (default options, replacing the world's scaler)."""
        self.flush_pending_skip()
        sda, sdb = self.a.scaler.state_dict(), self.b.scaler.state_dict()
        if sda != sdb:
            self.fail(f"state_dict {sda} != reference {sdb}")
        for w, sd in ((self.a, sda), (self.b, sdb)):
            target = w.scaler
            if fresh:
                w.kept.append(w.scaler)
                target = w.new_scaler({})
            target.load_state_dict(copy.deepcopy(sd))
            w.scaler = target
        if fresh:
            self.first_bad = {}  # the fresh scalers start their iteration afresh
        if fresh:
            self.sync_apart_grads()
        self.compare_scale()

    def op_opt_state(self, fresh):
        """optimizer.state_dict() deep-copied (a checkpoint) and loaded into the same
        optimizer or a fresh one of the same class and param groups."""
        self.flush_pending_skip()

        for w in (self.a, self.b):
            sd = copy.deepcopy(w.opt.state_dict())
            target = w.opt
            if fresh:
                w.kept.append(w.opt)
                target = w.new_optimizer(w.group_specs())
            target.load_state_dict(sd)
            w.opt = target
        if fresh:
            self.sync_apart_grads()
        self.compare_state()

    def op_zero_grad(self, set_to_none):

        for w in (self.a, self.b):
            w.opt.zero_grad(set_to_none=set_to_none)
        # zeros (or None) are the same in both worlds, but between a fused optimizer's
        # clip and its step world A still divides by scale / coefficient: the gradients
        # stay apart, and a backward() before the step ends the program
        self.compare_tensors()

    def op_grad_none(self, i):

        for w in (self.a, self.b):
            w.params[i].grad = None

    def op_add_group(self, shape, value_seed, lr):

        for w in (self.a, self.b):
            p = torch.nn.Parameter(_values(shape, value_seed))
            w.params.append(p)
            group = {"params": [p]}
            if lr is not None:
                group["lr"] = lr
            w.opt.add_param_group(group)

    def op_resize(self, i, shape, value_seed, grad_seed, drop_state):
        """Consistent: new data of a new (or the same) shape, a gradient of that shape or
        none, and the parameter's state dropped (kept only when the shape is the same)."""
        self.end_if_apart(grad_seed is not None)
        for w in (self.a, self.b):
            p = w.params[i]
            same_shape = list(p.shape) == list(shape)
            p.data = _values(shape, value_seed)
            p.grad = None if grad_seed is None else _values(shape, grad_seed)
            if drop_state or not same_shape:
                w.opt.state.pop(p, None)
        self.compare_tensors()

    # ---- inconsistent tensors (PyTorch's optimizer raises at its step) -------------------

    def op_bad_grad(self, i, extra, how):
        """The gradient made another size than its parameter."""
        self.end_if_apart()
        self.tensors_inconsistent = True
        for w in (self.a, self.b):
            p = w.params[i]
            if p.grad is None:
                continue
            with torch.no_grad():
                if how == "set_":
                    p.grad.set_(torch.ones(p.numel() + extra))
                else:  # the parameter changes under a gradient kept as it was
                    p.data = torch.ones(p.numel() + extra)

    def op_bad_state(self, i, key_index, how):
        """A state tensor replaced by one of another size or dtype, or set_ to another
        size."""

        pa, pb = self.a.params[i], self.b.params[i]
        sa, sb = self.a.opt.state.get(pa, {}), self.b.opt.state.get(pb, {})
        keys = sorted(k for k, v in sb.items()
                      if k != "step" and isinstance(v, torch.Tensor) and isinstance(sa.get(k), torch.Tensor))
        if not keys:
            return
        key = keys[key_index % len(keys)]
        self.tensors_inconsistent = True
        for state in (sa, sb):
            t = state[key]
            with torch.no_grad():
                if how == "resize":
                    state[key] = torch.zeros(t.numel() + 1)
                elif how == "dtype":
                    state[key] = t.double()
                else:
                    t.set_(torch.zeros(t.numel() + 1, dtype=t.dtype))


def run_program(program):
    """Runs one program; returns a JSON-ready outcome."""
    pair = Pair(program)
    try:
        end = pair.run()
    except Divergence as d:
        return {"ok": False, "error": str(d), "stats": pair.stats}
    except Exception:  # a failure of the interpreter itself is a failure too
        return {"ok": False, "error": "interpreter error:\n" + traceback.format_exc(), "stats": pair.stats}
    return {"ok": True, "end": end, "stats": pair.stats}


def _serve():
    # The protocol owns the original stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    torch.set_num_threads(1)
    for line in sys.stdin:
        program = json.loads(line)
        out.write(json.dumps(run_program(program)) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 2:
        with open(sys.argv[1]) as f:
            result = run_program(json.load(f))
        print(json.dumps(result, indent=1))
        sys.exit(0 if result["ok"] else 1)
    _serve()
