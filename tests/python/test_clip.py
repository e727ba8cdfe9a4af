# SPDX-License-Identifier: BSD-3-Clause
"""clip_grad_norm_: lucid_amp's free function and GradScaler.clip_grad_norm_ against
torch.nn.utils.clip_grad_norm_ (after unscale_ for the scaler)."""
import math

import pytest
import torch

import lucid_amp
import lucid_amp.optim

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _params(device, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n, generator=g).to(device)) for n in (3, 500, 40000)]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * scale).to(device)
    return params


def _clone(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
def test_free_function_equals_torch(device, norm_type):
    ours = _params(device, scale=3.0)
    theirs = _clone(ours)
    norm = lucid_amp.clip_grad_norm_(ours, 0.7, norm_type)
    want = torch.nn.utils.clip_grad_norm_(theirs, 0.7, norm_type)
    assert norm.device.type == device and norm.dtype == torch.float32 and norm.dim() == 0
    assert norm.item() == pytest.approx(want.item(), rel=1e-5)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True])
def test_scaler_clip_equals_unscale_then_clip(device, fused):
    ours = _params(device, seed=1)
    theirs = _clone(ours)
    for p in ours + theirs:
        p.grad.mul_(1024.0)
    make = (lambda ps: lucid_amp.optim.FusedAdamW(ps, lr=1e-2)) if fused else (
        lambda ps: torch.optim.SGD(ps, lr=0.1))
    opt_a, opt_b = make(ours), make(theirs)
    a = lucid_amp.GradScaler(device, init_scale=1024.0)
    b = lucid_amp.GradScaler(device, init_scale=1024.0)
    for s in (a, b):
        s.scale(torch.ones((), device=device))  # the loss whose gradients these are
    norm = a.clip_grad_norm_(opt_a, 0.5)
    b.unscale_(opt_b)
    want = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert norm.item() == pytest.approx(want.item(), rel=1e-5)
    a.step(opt_a)
    b.step(opt_b)
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-5, atol=1e-6)


def test_bad_arguments_raise_value_error():
    params = _params("cpu")
    opt = torch.optim.SGD(params, lr=0.1)
    scaler = lucid_amp.GradScaler("cpu")
    with pytest.raises(ValueError, match="max_norm"):
        scaler.clip_grad_norm_(opt, 0.0)
    with pytest.raises(ValueError, match="norm_type"):
        lucid_amp.clip_grad_norm_(params, 1.0, -1.0)
    scaler.scale(torch.ones(()))
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_"):
        scaler.clip_grad_norm_(opt, 1.0)


def test_non_finite_norm_skips_the_step():
    params = _params("cpu")
    params[2].grad[7] = float("nan")
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.1)
    scaler = lucid_amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    assert math.isnan(scaler.clip_grad_norm_(opt, 1.0).item())
    assert scaler.step(opt) is None
    for p, q in zip(params, before):
        assert torch.equal(p.detach(), q)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_error_if_nonfinite_means_what_it_means_for_torch(device, bad):
    ours = _params(device)
    ours[1].grad[7] = bad
    theirs = _clone(ours)
    before = [p.grad.clone() for p in ours]
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        lucid_amp.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    for p, b, q in zip(ours, before, theirs):  # neither clipped anything
        assert torch.equal(p.grad.nan_to_num(), b.nan_to_num())
        assert torch.equal(q.grad.nan_to_num(), b.nan_to_num())
    # Off, both clip by the non-finite norm and return it.
    norm = lucid_amp.clip_grad_norm_(ours, 1.0, error_if_nonfinite=False)
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=False)
    assert math.isnan(norm.item()) == math.isnan(want.item()) and not math.isfinite(norm.item())
    for p, q in zip(ours, theirs):
        assert torch.equal(p.grad.isnan(), q.grad.isnan())


@pytest.mark.parametrize("foreach", [None, False, True])
def test_foreach_means_what_it_means_for_torch(foreach):
    ours = _params("cpu", scale=3.0)
    theirs = _clone(ours)

    def outcome(fn, params):
        try:
            return fn(params, 0.7, foreach=foreach).item(), None
        except RuntimeError as e:
            return None, str(e)

    got, got_error = outcome(lucid_amp.clip_grad_norm_, ours)
    want, want_error = outcome(torch.nn.utils.clip_grad_norm_, theirs)
    assert got_error == want_error  # True on the CPU: the same refusal
    if want_error is None:
        assert got == pytest.approx(want, rel=1e-5)
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)
