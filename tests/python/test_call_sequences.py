# SPDX-License-Identifier: BSD-3-Clause
"""Random call sequences through lucid_amp and through PyTorch, compared call by call.

Hypothesis writes programs: a model of a few float32 parameters of a few shapes in one or
two param groups, scaler options (init_scale, growth_factor, backoff_factor,
growth_interval 1..4, so that the scale grows and backs off within a program), an
optimizer (lucid_amp.optim's FusedSGD with or without momentum, Nesterov and weight decay,
FusedAdam, FusedAdamW, amsgrad, with lucid_amp's scaler in the default or the graph_safe
mode; or the torch.optim optimizer of the same rule driven by lucid_amp's scaler), and up to MAX_CALLS calls: scale(loss).backward() with a gradient
now and then poisoned by inf or NaN, unscale_, clip_grad_norm_ (the scaler's, and
lucid_amp.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_), step, update (also with
a new scale, a float or a tensor), state_dict/load_state_dict of the scaler (into itself
or a fresh scaler) and of the optimizer, zero_grad, gradients set to None,
add_param_group, parameters resized or replaced with their gradient and state made to
match, gradients and state tensors made inconsistent with their parameter, and calls in
the wrong order; after each call PyTorch's private attributes that code reads
(`_scale`, `_growth_tracker`, `_per_optimizer_states`) are compared too.
call_sequence_worlds.py runs each program in two worlds, lucid_amp's and
torch.amp.GradScaler with torch.optim (foreach=False), and states the oracle and the
deliberate differences it codes.

Every program runs in a worker process (one for the whole test, started again after a
crash), so that a segmentation fault or an abort fails this test with the program that
caused it instead of ending pytest.

Environment:
  LUCID_AMP_SEQUENCES       how many programs (default 2000; .ci/run runs 10000)
  LUCID_AMP_SEQUENCES_SEED  Hypothesis' random seed (default 0); with no example
                            database, a count and a random seed always give the same
                            programs
"""

import json
import os
import select
import subprocess
import sys
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "call_sequence_worlds.py")

SEQUENCES = int(os.environ.get("LUCID_AMP_SEQUENCES", "2000"))
RANDOM_SEED = int(os.environ.get("LUCID_AMP_SEQUENCES_SEED", "0"))
MAX_CALLS = 30
# A program that does not answer in this many seconds is a hang: the worker is killed.
TIMEOUT_S = 60

SHAPES = [[3], [2, 3], [4], [1], [2, 2, 2], [5], [0]]
POISON = [float("inf"), float("-inf"), float("nan")]


class Worker:
    """One worker process running programs; started again after it dies."""

    def __init__(self):
        self.proc = None

    def start(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [HERE])
        self.proc = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env)

    def run(self, program):
        """The worker's answer, or {"crash": description} when it died or hung."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(program) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"crash": f"no answer within {TIMEOUT_S} s (killed)"}
        code = self.proc.wait()
        self.proc = None
        return {"crash": f"the worker died with exit status {code}"
                         + (f" (signal {-code})" if code < 0 else "")}

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _numel(shape):
    out = 1
    for d in shape:
        out *= d
    return out


def _weighted(draw, weights):
    """A name drawn with the given weights; shrinks toward the first."""
    total = sum(w for _, w in weights)
    x = draw(st.integers(0, total - 1))
    for name, w in weights:
        if x < w:
            return name
        x -= w
    raise AssertionError


@st.composite
def programs(draw):
    rule = draw(st.sampled_from(["sgd", "adam", "adamw"]))
    fused = draw(st.booleans())
    if rule == "sgd":
        momentum = draw(st.sampled_from([0.0, 0.9]))
        nesterov = momentum > 0 and draw(st.booleans())
        kwargs = dict(lr=draw(st.sampled_from([0.05, 0.01])), momentum=momentum,
                      dampening=0.0 if nesterov else draw(st.sampled_from([0.0, 0.1])),
                      nesterov=nesterov, weight_decay=draw(st.sampled_from([0.0, 0.01])))
    else:
        kwargs = dict(lr=draw(st.sampled_from([1e-2, 1e-3])), amsgrad=draw(st.booleans()),
                      weight_decay=draw(st.sampled_from([0.0, 0.01, 0.1])),
                      betas=draw(st.sampled_from([(0.9, 0.999), (0.8, 0.99)])),
                      eps=draw(st.sampled_from([1e-8, 1e-6])))
    scaler = dict(
        init_scale=draw(st.sampled_from([2.0**k for k in range(-2, 21)] + [1000.0, 3.0, 96.0])),
        growth_factor=draw(st.sampled_from([2.0, 4.0, 1.5, 3.0])),
        backoff_factor=draw(st.sampled_from([0.5, 0.25, 0.75, 0.3])),
        growth_interval=draw(st.integers(1, 4)),
    )
    n = draw(st.integers(1, 4))
    shapes = [draw(st.sampled_from(SHAPES)) for _ in range(n)]
    if n > 1 and draw(st.booleans()):
        cut = draw(st.integers(1, n - 1))
        groups = [list(range(cut)), list(range(cut, n))]
    else:
        groups = [list(range(n))]
    group_lr = [draw(st.sampled_from([None, None, 0.02])) for _ in groups]

    # A small model of what the calls do, so that the program mostly follows a training
    # loop's order.
    scaled = False  # the current scaler has run scale()
    stage = "ready"  # of the optimizer in this iteration, had every call succeeded
    checked = False  # a gradient was checked since the last update()
    has_grad = [False] * n
    numel = [_numel(s) for s in shapes]
    current = list(shapes)
    ops = []
    length = draw(st.integers(1, MAX_CALLS))
    for _ in range(length):
        # a training loop's order is the likeliest; every call stays possible anywhere
        weights = {"ready": [("backward", 30), ("step", 14), ("unscale", 4), ("clip", 5)],
                   "unscaled": [("step", 30), ("backward", 3), ("unscale", 2), ("clip", 2)],
                   "stepped": [("update", 30), ("step", 2), ("backward", 4), ("unscale", 2)],
                   }[stage]
        weights += [("update", 6), ("zero_grad", 6), ("free_clip", 2), ("grad_none", 2),
                    ("scaler_state", 3), ("opt_state", 3), ("add_group", 2), ("resize", 3)]
        weights += [("bad_grad", 2), ("bad_state", 2)]
        name = _weighted(draw, weights)
        if not scaled and name in ("step", "update", "unscale", "clip") and draw(st.integers(0, 3)) > 0:
            # refused by both scalers before any scale(): now and then only
            name = "backward"
        if name == "update" and not checked and draw(st.integers(0, 7)) > 0:
            # PyTorch raises at an update() with no check since the last one, lucid_amp
            # does not (documented), and the program ends there: now and then only
            name = "step" if any(has_grad) and stage != "stepped" else "backward"
        if name in ("step", "unscale", "clip") and not any(has_grad) and draw(st.integers(0, 7)) > 0:
            # PyTorch raises at a step without gradients, lucid_amp does not (documented)
            name = "backward"
        if name in ("step", "unscale", "clip"):
            if any(has_grad) and stage in ("ready", "unscaled"):
                checked = True
            stage = {"step": "stepped", "unscale": "unscaled", "clip": "unscaled"}[name] \
                if stage == "ready" or (stage == "unscaled" and name == "step") else stage
        elif name == "update":
            stage, checked = "ready", False
        if name == "backward":
            mask = [draw(st.integers(0, 5)) > 0 for _ in range(n)]
            poison = None
            if draw(st.integers(0, 4)) == 0:
                poison = [draw(st.integers(0, n - 1)), draw(st.sampled_from(POISON)),
                          draw(st.floats(0, 1))]
            ops.append(["backward", draw(st.integers(0, 1000)), mask, poison])
            scaled = True
            has_grad = [h or (m and k > 0) for h, m, k in zip(has_grad, mask, numel)]
        elif name == "step":
            ops.append(["step"])
        elif name == "update":
            new_scale = None
            if draw(st.integers(0, 5)) == 0:
                value = draw(st.sampled_from([2.0**8, 2.0**12, 1000.0, 0.5, 2.0**-3]))
                if draw(st.integers(0, 9)) == 0:  # refused by lucid_amp, and the program ends
                    value = draw(st.sampled_from([0.0, -1.0, float("inf"), float("nan")]))
                form = draw(st.sampled_from(["float", "tensor0", "float", "tensor0", "tensor1"]))
                new_scale = [form, value]
            ops.append(["update", new_scale])
        elif name == "zero_grad":
            set_to_none = draw(st.booleans())
            ops.append(["zero_grad", set_to_none])
            if set_to_none:
                has_grad = [False] * n
        elif name == "unscale":
            ops.append(["unscale"])
        elif name in ("clip", "free_clip"):
            max_norm = draw(st.sampled_from([0.1, 1.0, 10.0, 1e-3]))
            if draw(st.integers(0, 19)) == 0:  # refused by lucid_amp, and the program ends
                max_norm = 0.0
            norm_type = draw(st.sampled_from([2.0, float("inf"), 1.0, 3.0]))
            ops.append([name, max_norm, norm_type])
        elif name == "grad_none":
            i = draw(st.integers(0, n - 1))
            ops.append(["grad_none", i])
            has_grad[i] = False
        elif name == "scaler_state":
            fresh = draw(st.booleans())
            ops.append(["scaler_state", fresh])
            if fresh:
                scaled = False
        elif name == "opt_state":
            ops.append(["opt_state", draw(st.booleans())])
        elif name == "add_group":
            shape = draw(st.sampled_from(SHAPES))
            ops.append(["add_group", shape, draw(st.integers(0, 1000)),
                        draw(st.sampled_from([None, 0.03]))])
            n += 1
            has_grad.append(False)
            numel.append(_numel(shape))
            current.append(shape)
        elif name == "resize":
            i = draw(st.integers(0, n - 1))
            grad_seed = draw(st.one_of(st.none(), st.integers(0, 1000)))
            shape = draw(st.sampled_from(SHAPES))
            drop_state = draw(st.booleans())
            ops.append(["resize", i, shape, draw(st.integers(0, 1000)), grad_seed, drop_state])
            current[i] = shape
            numel[i] = _numel(shape)
            has_grad[i] = grad_seed is not None and numel[i] > 0
        elif name == "bad_grad":
            ops.append(["bad_grad", draw(st.integers(0, n - 1)), draw(st.integers(1, 3)),
                        draw(st.sampled_from(["set_", "param"]))])
        elif name == "bad_state":
            ops.append(["bad_state", draw(st.integers(0, n - 1)), draw(st.integers(0, 2)),
                        draw(st.sampled_from(["resize", "dtype", "set_"]))])
    return {
        "optimizer": {"rule": rule, "fused": fused, "kwargs": kwargs},
        "scaler": scaler,
        "shapes": shapes,
        "groups": groups,
        "group_lr": group_lr,
        "init": draw(st.integers(0, 1000)),
        "skip_query": draw(st.sampled_from(["now", "later"])),
        # lucid_amp's scaler in graph_safe mode, where the update counts the fused
        # optimizer's steps on the device: a third of the programs with one
        "graph_safe": fused and draw(st.integers(0, 2)) == 0,
        "ops": ops,
    }


def _save(program):
    fd, path = tempfile.mkstemp(prefix="lucid_amp_call_sequence_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(program, f, indent=1)
    return path


def test_random_call_sequences_match_pytorch():
    worker = Worker()
    totals = {}
    ends = {}
    started = time.monotonic()

    @seed(RANDOM_SEED)
    @settings(max_examples=SEQUENCES, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(programs())
    def check(program):
        result = worker.run(program)
        if "crash" in result or not result["ok"]:
            path = _save(program)
            what = result.get("crash") or result["error"]
            raise AssertionError(
                f"{what}\n(LUCID_AMP_SEQUENCES_SEED={RANDOM_SEED}; the program is saved in "
                f"{path}; run it alone with: .venv/bin/python {os.path.relpath(WORKER)} {path})")
        for key, value in result["stats"].items():
            totals[key] = totals.get(key, 0) + value
        reason = result["end"]
        if reason != "completed":  # "ended at call N (name): why"
            reason = reason.split(": ", 1)[1]
        ends[reason] = ends.get(reason, 0) + 1

    try:
        check()
    finally:
        worker.close()
    programs_run = sum(ends.values())
    print(f"\ncall sequences: {programs_run} programs, LUCID_AMP_SEQUENCES_SEED={RANDOM_SEED}, "
          f"{time.monotonic() - started:.1f} s")
    print("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    for reason, count in sorted(ends.items(), key=lambda kv: -kv[1]):
        print(f"  {count:6d}  {reason}")
    assert programs_run >= SEQUENCES * 0.9, "Hypothesis ran fewer programs than asked"


@pytest.mark.parametrize("rule", ["sgd", "adam"])
def test_fused_optimizer_starts_a_fresh_state_after_del_state(rule):
    """torch.optim starts a fresh state for a parameter whose state entry was deleted; so
    must a fused optimizer (here: the momentum buffer and Adam's step count restart)."""
    import torch
    import lucid_amp.optim

    classes = {"sgd": (lucid_amp.optim.FusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
               "adam": (lucid_amp.optim.FusedAdam, torch.optim.Adam, dict(lr=0.1))}[rule]
    states = []
    for cls in classes[:2]:
        p = torch.nn.Parameter(torch.ones(3))
        opt = cls([p], **classes[2])
        p.grad = torch.ones(3)
        opt.step()
        del opt.state[p]
        p.grad = torch.ones(3)
        opt.step()
        states.append({k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)})
    fused, reference = states
    for key, value in reference.items():
        torch.testing.assert_close(fused[key], value, rtol=1e-5, atol=1e-6)
