# SPDX-License-Identifier: BSD-3-Clause
"""The step log (GradScaler.history): every update's scales, overflow (in which
optimizers, and its first non-finite gradient), change and clip norm, checked against PyTorch's own scaler driven by the same
random sequence; the ring's
capacity; checkpoints; a graph-captured step's replays and a read that does not wait, on
CUDA."""

import csv
import dataclasses
import io
import pickle
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lucid_amp

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def one_iteration(scaler, param, opt, overflow, clip=None):
    """scale, a gradient with or without an inf, optional clip, step, update. Returns the
    clip's norm (a float) or None."""
    opt.zero_grad()
    scaler.scale((param * 1.0).sum())  # makes the scale; the gradient is set below
    g = torch.full_like(param, 3.0) * scaler.get_scale()
    if overflow:
        g[0] = float("inf")
    param.grad = g
    norm = None
    if clip is not None:
        norm = scaler.clip_grad_norm_(opt, clip).item()
    scaler.step(opt)
    scaler.update()
    return norm


def make(scaler_cls, device="cpu", **kwargs):
    param = torch.zeros(4, device=device, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.1)
    return scaler_cls(device, **kwargs), param, opt


@settings(max_examples=60, deadline=None)
@given(
    overflows=st.lists(st.booleans(), min_size=1, max_size=25),
    growth_interval=st.integers(1, 4),
    backoff=st.sampled_from([0.5, 0.25]),
)
def test_each_record_is_what_pytorchs_scaler_did_in_that_iteration(
    overflows, growth_interval, backoff
):
    kwargs = dict(init_scale=2.0**10, growth_interval=growth_interval, backoff_factor=backoff)
    ours, p, opt = make(lucid_amp.GradScaler, **kwargs)
    ref, rp, ropt = make(torch.amp.GradScaler, **kwargs)
    expected = []
    for overflow in overflows:
        one_iteration(ours, p, opt, overflow)
        before = ref.get_scale()
        one_iteration(ref, rp, ropt, overflow)
        after = ref.get_scale()
        change = "backoff" if overflow else ("growth" if after > before else "none")
        expected.append((before, after, overflow, change))
    log = ours.history(wait=True)
    assert [(r.scale, r.new_scale, r.found_inf, r.change) for r in log] == expected
    assert [r.update for r in log] == list(range(len(overflows)))
    assert all(r.grad_norm is None for r in log)


def torch_found_inf(scaler, opt):
    """Whether PyTorch's scaler found inf/NaN in `opt`'s gradients this iteration."""
    state = scaler._per_optimizer_states[id(opt)]
    return sum(v.item() for v in state["found_inf_per_device"].values()) > 0


OPTIMIZERS = 6  # more than the scaler's first flags hold: the first iteration grows them


@settings(max_examples=40, deadline=None)
@given(
    iterations=st.lists(
        st.tuples(
            st.permutations(range(OPTIMIZERS)),
            st.lists(st.booleans(), min_size=OPTIMIZERS, max_size=OPTIMIZERS),
            st.lists(st.booleans(), min_size=OPTIMIZERS, max_size=OPTIMIZERS),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_each_record_names_the_optimizers_pytorchs_scaler_found_inf_in(iterations):
    """Six optimizers used in a random order each iteration, some through unscale_ first,
    half of them lucid_amp.optim's (which skip on the flag itself): each steps or skips
    as with PyTorch's scaler, and a record names, by place in that order, exactly the
    optimizers for which PyTorch's scaler found inf/NaN."""
    worlds = []
    for cls in (lucid_amp.GradScaler, torch.amp.GradScaler):
        params = [torch.zeros(3, requires_grad=True) for _ in range(OPTIMIZERS)]
        fused = cls is lucid_amp.GradScaler
        opts = [
            (lucid_amp.optim.FusedSGD if fused and i % 2 else torch.optim.SGD)([q], lr=0.1)
            for i, q in enumerate(params)
        ]
        worlds.append((cls("cpu", init_scale=2.0**8), params, opts))
    expected = []
    for order, overflows, unscale_first in iterations:
        named = None
        for scaler, params, opts in worlds:
            scaler.scale(torch.ones(()))
            for i, q in enumerate(params):
                q.grad = torch.full_like(q, 2.0 * scaler.get_scale())
                if overflows[i]:
                    q.grad[1] = float("nan")
            for i in order:
                if unscale_first[i]:
                    scaler.unscale_(opts[i])
                scaler.step(opts[i])
            if isinstance(scaler, torch.amp.GradScaler):
                named = tuple(
                    place for place, i in enumerate(order) if torch_found_inf(scaler, opts[i])
                )
            scaler.update()
        expected.append(named)
        (ours, ours_params, _), (ref, ref_params, _) = worlds
        assert ours.get_scale() == ref.get_scale()
        for q, r in zip(ours_params, ref_params):
            torch.testing.assert_close(q, r)
    log = worlds[0][0].history(wait=True)
    assert [r.overflowed_optimizers for r in log] == expected
    assert [r.found_inf for r in log] == [bool(e) for e in expected]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_each_record_names_the_first_non_finite_gradient_and_counts_them(data):
    """Three optimizers of two param groups each (a parameter may have no gradient),
    stepped in a random order through a random check (unscale_, clip_grad_norm_, step's
    own; lucid_amp's fused AdamW, which only checks, among them): a record names the first
    optimizer, in that order, whose gradients held inf/NaN, and its first such parameter
    with the groups concatenated (None for a clean iteration), and counts the NaN and inf
    entries."""
    from lucid_amp.optim import FusedAdamW

    sizes = [[1, 7, 300], [70000, 3], [5, 2, 9]]
    params = [[torch.zeros(n, requires_grad=True) for n in group] for group in sizes]
    a, b, c = params
    opts = [
        torch.optim.SGD([{"params": a[:2]}, {"params": a[2:]}], lr=0.0),
        FusedAdamW([{"params": b[:1]}, {"params": b[1:]}], lr=0.0),
        torch.optim.SGD([{"params": c[:1]}, {"params": c[1:]}], lr=0.0),
    ]
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**8)
    expected = []
    for _ in range(data.draw(st.integers(1, 6))):
        scaler.scale(torch.ones(()))
        order = data.draw(st.permutations(range(3)))
        first = None
        counts = {"nan": 0, "inf": 0}
        checked = False  # an update without checks (no gradient at all) logs no record
        for place, j in enumerate(order):
            for k, q in enumerate(params[j]):
                kind = data.draw(st.sampled_from(["none", "clean", "clean", "inf", "nan"]))
                q.grad = None if kind == "none" else torch.ones_like(q)
                checked = checked or q.grad is not None
                if kind in ("inf", "nan"):
                    q.grad[data.draw(st.integers(0, q.numel() - 1))] = float(kind)
                    counts[kind] += 1
                    if first is None:
                        first = (place, k)
            check = data.draw(st.sampled_from(["unscale_", "clip", "step"]))
            if check == "unscale_":
                scaler.unscale_(opts[j])
            elif check == "clip":
                scaler.clip_grad_norm_(opts[j], 1.0)
            scaler.step(opts[j])
        scaler.update()
        if checked:
            expected.append((first, counts["nan"], counts["inf"]))
    log = scaler.history(wait=True)
    assert [(r.first_overflow, r.nan_count, r.inf_count) for r in log] == expected


@pytest.mark.parametrize("left", [2.0, -1.0])
def test_a_hooks_non_zero_flag_skips_pytorchs_fused_step_and_names_its_optimizer(left):
    """A found-inf hook may leave any non-zero value (a sum over ranks, say): PyTorch's
    fused optimizers skip only on a flag of exactly 1, so the scaler makes it 1, and the
    log names the optimizer by its bit."""
    scaler = lucid_amp.GradScaler("cpu", init_scale=8.0)
    scaler.set_found_inf_hook(lambda f: f.fill_(left))
    param = torch.ones(3, requires_grad=True)
    opt = torch.optim.Adam([param], lr=0.1, fused=True)
    scaler.scale(torch.ones(()))
    param.grad = torch.full_like(param, 8.0)
    scaler.step(opt)
    assert torch.equal(param.detach(), torch.ones(3)), "the fused step ran on an overflow"
    scaler.update()
    assert scaler.get_scale() == 4.0
    assert [r.overflowed_optimizers for r in scaler.history(wait=True)] == [(0,)]


def test_hysteresis_is_logged_as_absorbed():
    scaler, p, opt = make(lucid_amp.GradScaler, init_scale=8.0, hysteresis=2)
    for _ in range(2):
        one_iteration(scaler, p, opt, overflow=True)
    assert [(r.change, r.new_scale) for r in scaler.history(wait=True)] == [
        ("absorbed", 8.0),
        ("backoff", 4.0),
    ]


def test_the_clip_norm_is_logged_finite_or_not():
    scaler, p, opt = make(lucid_amp.GradScaler, init_scale=4.0)
    clean = one_iteration(scaler, p, opt, overflow=False, clip=1.0)
    one_iteration(scaler, p, opt, overflow=True, clip=1.0)
    one_iteration(scaler, p, opt, overflow=False)
    log = scaler.history(wait=True)
    assert clean == pytest.approx(6.0)  # four unscaled gradients of 3
    assert log[0].grad_norm == pytest.approx(clean)
    assert log[1].found_inf and not torch.isfinite(torch.tensor(log[1].grad_norm))
    assert log[2].grad_norm is None


def test_it_keeps_the_latest_step_log_capacity_updates():
    scaler, p, opt = make(lucid_amp.GradScaler, growth_interval=10**6)
    assert lucid_amp.STEP_LOG_CAPACITY == 1024
    n = lucid_amp.STEP_LOG_CAPACITY + 5
    for i in range(n):
        one_iteration(scaler, p, opt, overflow=i == n - 1)
    log = scaler.history(wait=True)
    assert len(log) == lucid_amp.STEP_LOG_CAPACITY
    assert (log[0].update, log[-1].update) == (5, n - 1)
    assert log[-1].found_inf and not log[-2].found_inf


def test_empty_before_the_first_scale_and_when_disabled():
    assert lucid_amp.GradScaler("cpu").history(wait=True) == []
    scaler, p, opt = make(lucid_amp.GradScaler, enabled=False)
    one_iteration(scaler, p, opt, overflow=False)
    assert scaler.history(wait=True) == []


def test_a_restored_checkpoint_starts_a_new_log_numbered_on():
    scaler, p, opt = make(lucid_amp.GradScaler)
    for _ in range(3):
        one_iteration(scaler, p, opt, overflow=False)
    restored = pickle.loads(pickle.dumps(scaler))
    assert restored.history(wait=True) == []
    one_iteration(restored, p, opt, overflow=True)
    (record,) = restored.history(wait=True)
    assert (record.update, record.found_inf, record.change) == (3, True, "backoff")
    assert len(scaler.history(wait=True)) == 3  # the original keeps its own


def test_records_are_plain_and_write_to_csv():
    scaler, p, opt = make(lucid_amp.GradScaler, init_scale=2.0, growth_interval=1)
    one_iteration(scaler, p, opt, overflow=False)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[f.name for f in dataclasses.fields(lucid_amp.StepRecord)])
    writer.writeheader()
    for record in scaler.history(wait=True):
        writer.writerow(dataclasses.asdict(record))
    assert out.getvalue().splitlines() == [
        "update,scale,new_scale,found_inf,overflowed_optimizers,first_overflow,nan_count,"
        "inf_count,change,grad_norm",
        "0,2.0,4.0,False,(),,0,0,growth,",
    ]


@cuda
def test_reading_the_log_does_not_wait_for_the_device():
    scaler, p, opt = make(lucid_amp.GradScaler, device="cuda")
    one_iteration(scaler, p, opt, overflow=False)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e9))  # ~0.5 s of one GPU thread, queued ahead of the copy
    start = time.perf_counter()
    scaler.history()
    waited = time.perf_counter() - start
    still_busy = not torch.cuda.current_stream().query()
    assert still_busy, "history() waited for the device"
    assert waited < 0.05
    assert len(scaler.history(wait=True)) == 1


@cuda
def test_a_captured_steps_replays_are_logged_like_eager_updates():
    opt_kwargs = dict(lr=0.1, fused=True, capturable=True)  # a captured Adam step needs it
    param = torch.zeros(4, device="cuda", requires_grad=True)
    opt = torch.optim.Adam([param], **opt_kwargs)
    scaler = lucid_amp.GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
    grad = torch.full((4,), 3.0, device="cuda")

    def train_step():
        scaler.scale((param * 1.0).sum())
        param.grad = grad * scaler._scale  # the scaled gradient, in stream order
        scaler.step(opt)
        scaler.update()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        train_step()
    overflows = [True, False, True]
    for overflow in overflows:
        grad.fill_(float("inf") if overflow else 3.0)
        graph.replay()
    log = scaler.history(wait=True)
    assert [r.found_inf for r in log[-3:]] == overflows
    assert [r.first_overflow for r in log[-3:]] == [(0, 0), None, (0, 0)]
    assert [r.inf_count for r in log[-3:]] == [4, 0, 4]
    assert [r.new_scale for r in log[-3:]] == [512.0, 512.0, 256.0]
    assert [r.update for r in log] == list(range(len(log)))
