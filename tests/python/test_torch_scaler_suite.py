# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch's own GradScaler tests (test_torch.py, test_cuda.py, test_optim.py), ported to run
alike on torch.amp.GradScaler ("torch") and lucid_amp.GradScaler ("lucid"), on the CPU and
on CUDA where there is one.

Where PyTorch's tests call the scaler's private kernels (_unscale_grads_,
torch._amp_update_scale_), the port drives the same cases through the public calls, which
both scalers serve. Where they compare a scaled run against a control run without
scaling, so does the port: with an inf injected into one iteration's gradients, the scaled
run must skip that step and otherwise end with the control's parameters and optimizer
state."""

import contextlib
import copy
import itertools
import math
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.amp.grad_scaler import OptState

import lucid_amp
from fused_support import skip_unless_fused_runs_on

IMPLS = {"torch": torch.amp.GradScaler, "lucid": lucid_amp.GradScaler}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_cuda)])
def device(request):
    return request.param


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return request.param


def make_scaler(impl, device, **kwargs):
    return IMPLS[impl](device, **kwargs)


def models_and_optimizers(device, optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    """A control and a scaled copy of one small model, each with its own optimizer; the
    same model on every call, so that runs of both scalers start alike."""
    torch.manual_seed(0)
    control = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device)
    scaled = copy.deepcopy(control)
    kwargs = {"lr": 1.0, **(optimizer_kwargs or {})}
    return (control, scaled, optimizer_ctor(control.parameters(), **kwargs),
            optimizer_ctor(scaled.parameters(), **kwargs))


SKIP_ITER = 2


def scaling_case(device, optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 8, generator=gen).to(device), torch.randn(8, 8, generator=gen).to(device))
            for _ in range(4)]
    return models_and_optimizers(device, optimizer_ctor, optimizer_kwargs) + (
        data, torch.nn.MSELoss())


def inject_inf(model):
    with torch.no_grad():
        model[1].weight.grad.fill_(math.inf)


def run_scaling_case(impl, device, run, unskipped, skipped, atol=1e-7,
                     optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    """PyTorch's pattern: ``run`` trains the control model without the scaler's API and the
    scaled one with it (the inf at SKIP_ITER included); enabled or not, both end alike, and
    an enabled scaler's scale shows ``unskipped`` growths and ``skipped`` backoffs."""
    for enabled in (True, False):
        control, scaled, opt_control, opt_scaled, data, loss_fn = scaling_case(
            device, optimizer_ctor, optimizer_kwargs)
        # A modest initial scale and a growth on every clean update magnify any error in
        # the growth handling.
        scaler = make_scaler(impl, device, init_scale=128.0, growth_factor=2.0,
                             enabled=enabled, growth_interval=1)
        run(device, data, control, opt_control, scaler, loss_fn, False)
        returned = run(device, data, scaled, opt_scaled, scaler, loss_fn, True)
        scaler = returned or scaler
        if enabled:
            expect = 128.0 * scaler.get_growth_factor() ** unskipped * scaler.get_backoff_factor() ** skipped
            assert scaler.get_scale() == expect
        else:
            assert scaler.get_scale() == 1.0
        for c, s in zip(control.parameters(), scaled.parameters()):
            torch.testing.assert_close(c.grad, s.grad, atol=atol, rtol=1e-5)
            c_state, s_state = opt_control.state[c], opt_scaled.state[s]
            for k in c_state:
                torch.testing.assert_close(c_state[k], s_state[k], atol=atol, rtol=1e-5, msg=k)
            torch.testing.assert_close(c, s, atol=atol, rtol=1e-5)


def step_or_skip(scaler, optimizer, i):
    """The control run's step: skipped where the scaled run's inf is."""
    if not scaler.is_enabled() or i != SKIP_ITER:
        optimizer.step()


# ---- unscale_, update, scale ------------------------------------------------------------------


def test_grad_scaling_unscale(impl, device):
    g = torch.full((20, 20), 4.0, device=device)
    ginf, gnan = g.clone(), g.clone()
    ginf[2, 2] = math.inf
    gnan[2, 2] = math.nan
    # Contiguous gradients, a transposed one (dense, not contiguous) and column slices (not
    # dense): PyTorch's kernels take the first two on their multi-tensor path and the
    # slices on a per-tensor one; both have to find every inf and NaN.
    cases = [
        ([g.clone(), g.clone()], False),
        ([g.clone(), g.clone().t()], False),
        ([g.clone(), g.clone()[:, :5]], False),
        ([g.clone()[:, :5], g.clone()[:, :5]], False),
        ([g.clone(), ginf.clone()], True),
        ([g.clone(), gnan.clone()], True),
        ([g.clone(), ginf.clone()[:, :5]], True),
        ([g.clone(), gnan.clone()[:, :5]], True),
        ([ginf.clone(), g.clone()[:, :5]], True),
        ([ginf.clone()[:, :5], g.clone()[:, :5]], True),
    ]
    for case, has_inf in cases:
        params = [torch.nn.Parameter(torch.zeros_like(t)) for t in case]
        for p, t in zip(params, case):
            p.grad = t
        opt = torch.optim.SGD(params, lr=1.0)
        scaler = make_scaler(impl, device, init_scale=4.0)
        scaler.scale(torch.ones((), device=device))
        scaler.unscale_(opt)
        state = scaler._per_optimizer_states[id(opt)]
        assert state["stage"] is OptState.UNSCALED
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        assert found == (1.0 if has_inf else 0.0)
        if not has_inf:
            for p in params:
                torch.testing.assert_close(p.grad, torch.ones_like(p.grad), rtol=1e-5, atol=1e-7)
        before = [p.detach().clone() for p in params]
        scaler.step(opt)
        assert all(torch.equal(b, p) for b, p in zip(before, params)) == has_inf
        scaler.update()
        assert scaler.get_scale() == (2.0 if has_inf else 4.0)


def test_grad_scaling_unscale_refuses_float16_gradients(impl, device):
    # PyTorch's test hands float16 gradients to the private _unscale_grads_(allow_fp16=True);
    # through the public unscale_ both scalers refuse them.
    p = torch.nn.Parameter(torch.zeros(4, device=device, dtype=torch.float16))
    p.grad = torch.ones_like(p)
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = make_scaler(impl, device)
    scaler.scale(torch.ones((), device=device))
    with pytest.raises(ValueError, match="(?i)unscale (FP16|float16) gradients"):
        scaler.unscale_(opt)


def test_grad_scaling_update_scale(impl, device):
    scaler = make_scaler(impl, device, init_scale=4.0, growth_factor=2.0, backoff_factor=0.25,
                         growth_interval=2)
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    opt = torch.optim.SGD([p], lr=1.0)

    def iteration(bad):
        p.grad = scaler.scale(torch.ones(3, device=device))
        if bad:
            p.grad[1] = math.inf
        scaler.step(opt)
        scaler.update()

    iteration(False)
    assert scaler._get_growth_tracker() == 1 and scaler.get_scale() == 4.0
    iteration(False)
    assert scaler._get_growth_tracker() == 0 and scaler.get_scale() == 8.0
    iteration(True)
    assert scaler._get_growth_tracker() == 0 and scaler.get_scale() == 2.0
    assert int(scaler._growth_tracker) == 0 and float(scaler._scale) == 2.0


def test_grad_scaling_unscale_sparse(impl, device):
    scaler = make_scaler(impl, device, init_scale=4.0)
    scaler.scale(torch.ones((), device=device))
    i = torch.tensor([[0, 1, 1], [2, 0, 2]], device=device)
    s = torch.sparse_coo_tensor(i, torch.tensor([16.0, 32.0, 64.0]), (2, 3), device=device)

    optimizers = []  # kept alive: both scalers know an optimizer by its id()

    def unscale_with(values):
        p = s.clone()
        opt = torch.optim.SGD([p], lr=1.0)
        optimizers.append(opt)
        p.grad = torch.sparse_coo_tensor(i, torch.tensor(values), (2, 3), device=device)
        scaler.unscale_(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        return p, found

    p, found = unscale_with([16.0, 32.0, 64.0])
    assert found == 0.0
    assert torch.equal(p.grad.to_dense(), (s / 4).to_dense())
    assert unscale_with([16.0, 32.0, math.inf])[1] == 1.0
    assert unscale_with([16.0, 32.0, math.nan])[1] == 1.0


def test_grad_scaling_state_dict(impl, device):
    for lazy_init_scale in (True, False):
        s0 = make_scaler(impl, device, init_scale=3.0, growth_factor=4.0, backoff_factor=0.5,
                         growth_interval=2)
        s1 = make_scaler(impl, device, init_scale=6.0, growth_factor=7.0, backoff_factor=0.8,
                         growth_interval=1)
        if impl == "torch":
            # A value for load_state_dict to overwrite (lucid's is read-only, from its core).
            s1._init_growth_tracker = 7
        if lazy_init_scale:
            s1.scale(torch.full((1,), 4.0, device=device))
            assert s1._scale.dtype == torch.float32 and s1._scale.device.type == device
        s1.load_state_dict(s0.state_dict())
        assert s1.get_scale() == 3.0
        assert s1.get_growth_factor() == 4.0
        assert s1.get_backoff_factor() == 0.5
        assert s1.get_growth_interval() == 2
        assert s1._init_growth_tracker == 0


def test_grad_scaling_scale(impl, device):
    scaler = make_scaler(impl, device, init_scale=2.0)
    t0 = torch.full((1,), 4.0, device=device)
    t1 = torch.full((1,), 4.0, device=device)
    outputs = (t1.clone(), (t0.clone(), t1.clone()), [t0.clone(), (t1.clone(), t0.clone())])
    outputs = scaler.scale(outputs)
    assert isinstance(outputs, tuple) and isinstance(outputs[2], list)
    assert all(t.item() == 8.0 for t in (outputs[0], outputs[1][0], outputs[1][1], outputs[2][0],
                                          outputs[2][1][0], outputs[2][1][1]))
    assert scaler._scale.device == t1.device


# ---- the scaled run against the control run ---------------------------------------------------


def _has(ctor, **kwargs):
    try:
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.zeros(1)
        ctor([p], lr=0.1, **kwargs).step()
        return True
    except (TypeError, RuntimeError, ValueError):
        return False


AUTOCAST_OPTIMIZERS = [
    pytest.param(ctor, kwargs, id=f"{ctor.__name__}-{next(iter(kwargs), 'default')}")
    for ctor in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad,
                 torch.optim.RMSprop)
    for kwargs in ({}, {"foreach": True}, {"fused": True})
    if _has(ctor, **kwargs)
]


def autocast_run(try_pickle):
    def run(device, data, model, optimizer, scaler, loss_fn, try_scaling_api):
        for i, (inputs, target) in enumerate(data):
            optimizer.zero_grad()
            with torch.autocast(device_type=device, dtype=torch.half, enabled=try_scaling_api):
                loss = loss_fn(model(inputs), target)
            if try_scaling_api:
                scaler.scale(loss).backward()
                if i == SKIP_ITER and scaler.is_enabled():
                    inject_inf(model)
                scaler.step(optimizer)
                scaler.update()
                if try_pickle:
                    scaler = pickle.loads(pickle.dumps(scaler))
            else:
                loss.backward()
                step_or_skip(scaler, optimizer, i)
        return scaler

    return run


@pytest.mark.parametrize("optimizer_ctor,optimizer_kwargs", AUTOCAST_OPTIMIZERS)
@pytest.mark.parametrize("try_pickle", [False, True])
def test_grad_scaling_autocast(impl, device, optimizer_ctor, optimizer_kwargs, try_pickle):
    """Scaling with float16 autocast against float32 without either. As PyTorch's test finds,
    adaptive optimizers (Adam, AdamW; Adagrad and RMSprop too) magnify the float16 rounding
    past the tolerance, so for them the scaled run is compared with torch.amp.GradScaler's
    scaled run instead."""
    if optimizer_kwargs.get("fused"):
        skip_unless_fused_runs_on(optimizer_ctor, device)
    run = autocast_run(try_pickle)
    if optimizer_ctor is torch.optim.SGD:
        run_scaling_case(impl, device, run, unskipped=3, skipped=1, atol=1e-3,
                         optimizer_ctor=optimizer_ctor, optimizer_kwargs=optimizer_kwargs)
        return
    results = {}
    for name in ("torch", impl):
        _, model, _, opt, data, loss_fn = scaling_case(device, optimizer_ctor, optimizer_kwargs)
        scaler = make_scaler(name, device, init_scale=128.0, growth_interval=1)
        scaler = run(device, data, model, opt, scaler, loss_fn, True)
        results[name] = (scaler.get_scale(), [p.detach().clone() for p in model.parameters()])
    # RMSprop at lr=1.0 overflows on its own besides the injected inf: the scales are
    # compared with each other, not with a count of growths.
    assert results[impl][0] == results["torch"][0]
    for a, b in zip(results[impl][1], results["torch"][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_grad_scaling_clipping(impl, device):
    max_norm = 0.2

    def run(device, data, model, optimizer, scaler, loss_fn, try_scaling_api):
        for i, (inputs, target) in enumerate(data):
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), target)
            if try_scaling_api:
                scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm * scaler.get_scale())
                if i == SKIP_ITER and scaler.is_enabled():
                    inject_inf(model)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                step_or_skip(scaler, optimizer, i)

    run_scaling_case(impl, device, run, unskipped=3, skipped=1, atol=1e-5)


def test_grad_scaling_clipping_separate_unscale(impl, device):
    max_norm = 0.2

    def run(device, data, model, optimizer, scaler, loss_fn, try_scaling_api):
        for i, (inputs, target) in enumerate(data):
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), target)
            if try_scaling_api:
                scaler.scale(loss).backward()
                if i == SKIP_ITER and scaler.is_enabled():
                    inject_inf(model)
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, error_if_nonfinite=False)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                step_or_skip(scaler, optimizer, i)

    run_scaling_case(impl, device, run, unskipped=3, skipped=1)


def test_grad_scaling_penalty(impl, device):
    def run(device, data, model, optimizer, scaler, loss_fn, try_scaling_api):
        for i, (inputs, target) in enumerate(data):
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), target)
            if try_scaling_api:
                grad_params = torch.autograd.grad(scaler.scale(loss), model.parameters(),
                                                  create_graph=True)
                inv_scale = 1.0 / scaler.get_scale()
                grad_params = [g * inv_scale for g in grad_params]
            else:
                grad_params = torch.autograd.grad(loss, model.parameters(), create_graph=True)
            penalty = sum(g.pow(2).sum() for g in grad_params).sqrt()
            loss = loss + penalty
            if try_scaling_api:
                scaler.scale(loss).backward()
                if i == SKIP_ITER and scaler.is_enabled():
                    inject_inf(model)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                step_or_skip(scaler, optimizer, i)

    run_scaling_case(impl, device, run, unskipped=3, skipped=1)


def test_grad_scaling_accumulation(impl, device):
    def run(device, data, model, optimizer, scaler, loss_fn, try_scaling_api):
        iters_to_accumulate = 2
        for i, (inputs, target) in enumerate(data):
            loss = loss_fn(model(inputs), target) / iters_to_accumulate
            if try_scaling_api:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if (i + 1) % iters_to_accumulate == 0:
                if try_scaling_api:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad()

    run_scaling_case(impl, device, run, unskipped=2, skipped=0)


def test_grad_scaling_multiple(impl, device):
    """Two models and two optimizers, both receiving gradients from two losses."""
    for enabled in (True, False):
        control0, scaled0, opt_control0, opt_scaled0, data, loss_fn = scaling_case(device)
        control1, scaled1, opt_control1, opt_scaled1 = models_and_optimizers(device)
        scaler = make_scaler(impl, device, init_scale=128.0, growth_factor=2.0, enabled=enabled,
                             growth_interval=1)

        def run(model0, model1, optimizer0, optimizer1, try_scaling_api):
            for i, (inputs, target) in enumerate(data):
                optimizer0.zero_grad()
                optimizer1.zero_grad()
                out0, out1 = model0(inputs), model1(inputs)
                loss0 = loss_fn(0.3 * out0 + 0.7 * out1, target)
                loss1 = loss_fn(0.6 * out0 - 0.4 * out1, target)
                if try_scaling_api:
                    scaler.scale(loss0).backward(retain_graph=True)
                    scaler.scale(loss1).backward()
                    if i == SKIP_ITER and scaler.is_enabled():
                        inject_inf(model1)
                    # One optimizer unscaled separately, as a further stress.
                    scaler.unscale_(optimizer0)
                    scaler.step(optimizer0)
                    scaler.step(optimizer1)
                    scaler.update()
                else:
                    loss0.backward(retain_graph=True)
                    loss1.backward()
                    optimizer0.step()
                    step_or_skip(scaler, optimizer1, i)

        run(control0, control1, opt_control0, opt_control1, False)
        run(scaled0, scaled1, opt_scaled0, opt_scaled1, True)
        expect = 128.0 * scaler.get_growth_factor() ** 3 * scaler.get_backoff_factor() if enabled else 1.0
        assert scaler.get_scale() == expect
        for c, s in zip(itertools.chain(control0.parameters(), control1.parameters()),
                        itertools.chain(scaled0.parameters(), scaled1.parameters())):
            torch.testing.assert_close(c, s, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_grad_scaling_multigpu(impl):
    """Two models on two GPUs, one optimizer each, checked by one scaler."""
    for enabled in (True, False):
        control0, scaled0, opt_control0, opt_scaled0, data, loss_fn = scaling_case("cuda:0")
        control1, scaled1, opt_control1, opt_scaled1 = models_and_optimizers("cuda:1")
        scaler = make_scaler(impl, "cuda", init_scale=128.0, growth_factor=2.0, enabled=enabled,
                             growth_interval=1)

        def run(model0, model1, optimizer0, optimizer1, try_scaling_api):
            for i, (inputs, target) in enumerate(data):
                optimizer0.zero_grad()
                optimizer1.zero_grad()
                out0, out1 = model0(inputs), model1(inputs.to("cuda:1"))
                loss0 = loss_fn(0.3 * out0 + 0.7 * out1.to("cuda:0"), target)
                loss1 = loss_fn(0.6 * out0.to("cuda:1") - 0.4 * out1, target.to("cuda:1"))
                if try_scaling_api:
                    scaler.scale(loss0).backward(retain_graph=True)
                    scaler.scale(loss1).backward()
                    if i == SKIP_ITER and scaler.is_enabled():
                        inject_inf(model1)
                    scaler.unscale_(optimizer0)
                    scaler.step(optimizer0)
                    scaler.step(optimizer1)
                    scaler.update()
                else:
                    loss0.backward(retain_graph=True)
                    loss1.backward()
                    optimizer0.step()
                    step_or_skip(scaler, optimizer1, i)

        run(control0, control1, opt_control0, opt_control1, False)
        run(scaled0, scaled1, opt_scaled0, opt_scaled1, True)
        expect = 128.0 * scaler.get_growth_factor() ** 3 * scaler.get_backoff_factor() if enabled else 1.0
        assert scaler.get_scale() == expect
        for c, s in zip(itertools.chain(control0.parameters(), control1.parameters()),
                        itertools.chain(scaled0.parameters(), scaled1.parameters())):
            torch.testing.assert_close(c, s, rtol=1e-5, atol=1e-7)


# ---- pickling, overflow of the scale, PyTorch's optimizer protocols ------------------------------


def test_pickle_gradscaler(impl, device):
    for lazy_init_scale in (True, False):
        a = make_scaler(impl, device, init_scale=3.0, growth_factor=4.0, backoff_factor=0.5,
                        growth_interval=2)
        assert a.is_enabled()
        if lazy_init_scale:
            a.scale(torch.tensor([4.0], device=device))
            assert a._scale.device.type == device
        b = pickle.loads(pickle.dumps(a))
        assert b.is_enabled() == a.is_enabled()
        assert b.get_scale() == 3.0
        assert b.get_growth_factor() == 4.0
        assert b.get_backoff_factor() == 0.5
        assert b.get_growth_interval() == 2
        assert b._init_growth_tracker == 0
        # An unknown key reads as a fresh optimizer's state, as PyTorch's defaultdict does.
        assert b._per_optimizer_states["fdsa"] == {"stage": OptState.READY, "found_inf_per_device": {}}
        if lazy_init_scale:
            assert b.scale(torch.tensor([4.0], device=device)).item() == 12.0


def test_grad_scale_will_not_overflow(impl, device):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 1).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    scaler = make_scaler(impl, device, growth_interval=1, growth_factor=2.0**4, init_scale=1e38)
    x = torch.randn(1, 5, device=device)
    y = 1e-30 * torch.randn(1, 1, device=device)
    loss = ((model(x) - y) ** 2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert math.isfinite(float(scaler._scale))


def fused_optimizers(*ctors):
    return [pytest.param(ctor, id=ctor.__name__) for ctor in ctors if _has(ctor, fused=True)]


# PyTorch's test compares these three; fused Adagrad rounds apart from its for-loop
# version beyond the tolerance with either scaler.
@pytest.mark.parametrize("optimizer_ctor", fused_optimizers(torch.optim.SGD, torch.optim.Adam,
                                                            torch.optim.AdamW))
@pytest.mark.parametrize("separate_unscale", [False, True])
@pytest.mark.parametrize("optimizer_kwargs", [{}, {"weight_decay": 0.1}], ids=["plain", "decay"])
def test_grad_scaling_autocast_fused_optimizers(impl, device, optimizer_ctor, separate_unscale,
                                                optimizer_kwargs):
    """A fused optimizer against the same optimizer unfused (foreach=False), both scaled
    under float16 autocast: loss, gradients, parameters and optimizer state agree each step.

    As in PyTorch's test, each compared tensor of the fused run is then set to the control's
    value, so that every step is compared from the same start: otherwise one step's rounding
    difference moves the next step's float16 forward and the differences compound."""
    control, scaled, _, opt_scaled, data, loss_fn = scaling_case(
        device, optimizer_ctor, {**optimizer_kwargs, "fused": True})
    opt_control = optimizer_ctor(control.parameters(), lr=1.0, foreach=False, **optimizer_kwargs)
    scaler_control = make_scaler(impl, device, init_scale=128.0)
    scaler_scaled = make_scaler(impl, device, init_scale=128.0)
    # PyTorch's tolerance where the for-loop optimizer computes with Python float betas
    # (double) and the fused one in float: parameters and second moments.
    loose = {"atol": 2e-5, "rtol": 2e-5} if "betas" in opt_control.param_groups[0] else {}

    def check_then_set(expected, actual, what, **tolerance):
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tolerance)
        with torch.no_grad():
            actual.copy_(expected)

    for inputs, target in data:
        losses = []
        for model, opt, scaler, separate in ((control, opt_control, scaler_control, False),
                                             (scaled, opt_scaled, scaler_scaled, separate_unscale)):
            opt.zero_grad()
            with torch.autocast(device_type=device, dtype=torch.half):
                loss = loss_fn(model(inputs), target)
            scaler.scale(loss).backward()
            if separate:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0])
        for pc, ps in zip(control.parameters(), scaled.parameters()):
            check_then_set(pc.grad, ps.grad, "grad")
            check_then_set(pc, ps, "param", **loose)
            sc, ss = opt_control.state[pc], opt_scaled.state[ps]
            for k in sc:
                # The fused optimizer keeps "step" on the parameters' device, the for-loop
                # one on the CPU (unless capturable).
                expected = sc[k].reshape(ss[k].shape).to(ss[k].device)
                check_then_set(expected, ss[k], k, **(loose if "exp_avg_sq" in k else {}))


@pytest.mark.parametrize("optimizer_ctor", fused_optimizers(
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad))
def test_grad_scaler_with_preset_grad_scale(impl, device, optimizer_ctor):
    """A grad_scale the caller set on a fused optimizer multiplies the scaler's: the
    gradients are divided by both. What is left on the optimizer afterwards is what
    torch.amp.GradScaler leaves (nothing, except on torch 2.11's fused Adagrad, which keeps
    a grad_scale)."""
    skip_unless_fused_runs_on(optimizer_ctor, device)

    def run(impl):
        weight = torch.ones((5, 5), device=device, requires_grad=True)
        weight.grad = torch.full_like(weight, 15.0)
        opt = optimizer_ctor([weight], lr=0.1, fused=True)
        scaler = make_scaler(impl, device, init_scale=5.0)
        scaler.scale(torch.ones(5, device=device))
        opt.grad_scale = torch.tensor(3.0, device=device)
        scaler.step(opt)
        assert torch.equal(weight.grad, torch.ones_like(weight))
        return hasattr(opt, "grad_scale"), hasattr(opt, "found_inf")

    assert run(impl) == run("torch")


class _PlaceHolderOptimizer(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})
        self._step_supports_amp_scaling = True
        self.seen = None


class _PassedTheScaler(_PlaceHolderOptimizer):
    def step(self, closure=None, *, grad_scaler=None):
        self.seen = (isinstance(grad_scaler, torch.amp.GradScaler),
                     hasattr(self, "grad_scale"), hasattr(self, "found_inf"))


class _GivenScaleAndFlag(_PlaceHolderOptimizer):
    def step(self, closure=None):
        self.seen = (isinstance(self.grad_scale, torch.Tensor), isinstance(self.found_inf, torch.Tensor))


def test_grad_scaler_pass_itself(impl, device):
    m = torch.nn.Linear(4, 1).to(device)
    o1, o2 = _PassedTheScaler(m.parameters()), _GivenScaleAndFlag(m.parameters())
    scaler = make_scaler(impl, device, init_scale=2.0)
    with torch.autocast(device_type=device, dtype=torch.half):
        loss = m(torch.randn(4, 4, device=device)).mean()
    scaler.scale(loss).backward()
    with pytest.warns(FutureWarning):
        scaler.step(o1)
    scaler.step(o2)
    scaler.update()
    assert o1.seen == (True, False, False)
    assert o2.seen == (True, True)


# ---- CUDA graphs --------------------------------------------------------------------------------
# Each runs in a child process: a capture that fails leaves the CUDA context unusable for
# every test after it.

_GRAPH_GRAD_SCALING = """
    scaler = GradScaler("cuda", init_scale=4.0)
    weight = torch.ones((100,), device="cuda", requires_grad=True)
    opt = torch.optim.SGD([weight], lr=0.1)
    static_input = torch.ones_like(weight)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        scaler.scale((weight.half() * static_input).sum()).backward()
    torch.cuda.current_stream().wait_stream(s)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin()
        scaler.scale((weight.half() * static_input).sum()).backward()
        g.capture_end()
    for data, scale, tracker, grad in zip([5, 20000, 5, 40000], [4, 2, 2, 1], [1, 0, 1, 0],
                                          [5 * 4, math.inf, 5 * 2, math.inf]):
        static_input.fill_(data)
        g.replay()
        assert torch.equal(weight.grad, torch.full_like(weight.grad, grad))
        scaler.step(opt)
        scaler.update()
        assert float(scaler._scale) == scale and int(scaler._growth_tracker) == tracker
"""

_GRAPH_SCALING_FUSED_OPTIMIZERS = """
    for ctor in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        capturable = {} if ctor is torch.optim.SGD else {"capturable": True}
        params = [torch.randn((i + 5, i + 5), device="cuda") for i in range(2)]
        params_control = [p.clone().requires_grad_() for p in params]
        params_graphed = [p.clone().requires_grad_() for p in params]
        grads = [[torch.randn_like(p) for p in params] for _ in range(5)]
        scaler_control = GradScaler("cuda", init_scale=128.0)
        scaler_graphed = GradScaler("cuda", init_scale=128.0)
        opt = ctor(params_control, lr=0.1, fused=True)
        for i in range(5):
            for j, p in enumerate(params_control):
                p.grad = grads[i][j].clone()
            scaler_control.scale(torch.ones((), device="cuda"))
            scaler_control.step(opt)
            scaler_control.update()
        opt = ctor(params_graphed, lr=0.1, fused=True, **capturable)
        for i in range(3):
            for j, p in enumerate(params_graphed):
                p.grad = grads[i][j].clone()
            scaler_graphed.scale(torch.ones((), device="cuda"))
            scaler_graphed.step(opt)
            scaler_graphed.update()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            scaler_graphed.step(opt)
            scaler_graphed.update()
        for i in range(3, 5):
            for j, p in enumerate(params_graphed):
                p.grad.copy_(grads[i][j])
            g.replay()
        for a, b in zip(params_control, params_graphed):
            torch.testing.assert_close(a, b)
"""


def _run_in_child(impl, body):
    code = "import math, torch, lucid_amp\n" + (
        f"GradScaler = {'torch.amp.GradScaler' if impl == 'torch' else 'lucid_amp.GradScaler'}\n"
        "def main():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "main()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


# Only scale() and the backward are captured; step() and update() run eagerly.
@pytest.mark.parametrize("graph_impl", ["torch", "lucid"])
def test_graph_grad_scaling(graph_impl, device):
    if device != "cuda":
        pytest.skip("needs CUDA")
    _run_in_child(graph_impl, _GRAPH_GRAD_SCALING)


@pytest.mark.parametrize("graph_impl", ["torch", "lucid"])
def test_graph_scaling_fused_optimizers(graph_impl, device):
    if device != "cuda":
        pytest.skip("needs CUDA")
    _run_in_child(graph_impl, _GRAPH_SCALING_FUSED_OPTIMIZERS)
