# SPDX-License-Identifier: BSD-3-Clause
"""Parity: the same random sequences of scale / unscale_ (+ clipping) / step / update, with
inf and NaN injected into the gradients, through lucid_amp.GradScaler and PyTorch's own
torch.amp.GradScaler, give identical scales, skip decisions and parameters (bit for bit),
on the CPU here and on CUDA where there is a GPU.

"""

import math
import random

import pytest
import torch

import lucid_amp
import lucid_amp.optim


def torch_scaler(**kwargs):
    """The reference: PyTorch's own scaler on the CPU."""
    return torch.amp.GradScaler("cpu", **kwargs)


def lucid_scaler(**kwargs):
    return lucid_amp.GradScaler("cpu", **kwargs)


def _kwargs_if_supported(cls, device, **kwargs):
    """kwargs if this PyTorch's ``cls`` takes them for a parameter on ``device``, else None."""
    try:
        p = torch.nn.Parameter(torch.zeros(1, device=device))
        p.grad = torch.zeros_like(p)
        cls([p], lr=0.1, **kwargs).step()
        return kwargs
    except (TypeError, RuntimeError, ValueError):
        return None


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, foreach=False)),
    "sgd-foreach": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, foreach=True)),
    "adam": (torch.optim.Adam, dict(lr=1e-2, foreach=False)),
    "adam-foreach": (torch.optim.Adam, dict(lr=1e-2, foreach=True)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=1e-3)),
    "adagrad": (torch.optim.Adagrad, dict(lr=1e-2)),
    # PyTorch's fused AdamW: the scaler hands it the scale and the overflow flag
    "adamw-fused": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, fused=True)),
    "lucid-fused-adamw": (lucid_amp.optim.FusedAdamW, dict(lr=1e-2, weight_decay=0.1)),
    "lucid-fused-sgd": (lucid_amp.optim.FusedSGD, dict(lr=0.05, momentum=0.9)),
}


def _optimizer(name, params):
    cls, kwargs = OPTIMIZERS[name]
    params = list(params)
    for option in ("foreach", "fused"):
        if option in kwargs and _kwargs_if_supported(cls, params[0].device, **{option: kwargs[option]}) is None:
            pytest.skip(f"{cls.__name__} has no {option} option on {params[0].device} in this PyTorch")
    return cls(params, **kwargs)


def make_model(device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model.to(device)


def run_sequence(make_scaler, opt_names, sequence, iterations=40, device="cpu", **scaler_kwargs):
    """Runs one random sequence; returns per-iteration (scale, skips) and final params."""
    rng = random.Random(sequence)
    model = make_model(device)
    # one optimizer per layer group when two are asked for
    if len(opt_names) == 1:
        opts = [_optimizer(opt_names[0], model.parameters())]
    else:
        opts = [_optimizer(opt_names[0], model[0].parameters()),
                _optimizer(opt_names[1], model[2].parameters())]
    scaler = make_scaler(**scaler_kwargs)
    data = torch.Generator().manual_seed(sequence)
    trace = []
    for it in range(iterations):
        for o in opts:
            o.zero_grad()
        micro = 2 if rng.random() < 0.2 else 1  # gradient accumulation now and then
        for _ in range(micro):
            x = torch.randn(4, 6, generator=data).to(device)
            y = torch.randn(4, 2, generator=data).to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
        r = rng.random()
        if r < 0.25:  # inject a non-finite into one gradient of one optimizer
            o = rng.choice(opts)
            p = rng.choice([p for g in o.param_groups for p in g["params"]])
            p.grad.view(-1)[rng.randrange(p.grad.numel())] = rng.choice([math.inf, -math.inf, math.nan])
        skips = []
        for o in opts:
            if rng.random() < 0.3:
                scaler.unscale_(o)
                torch.nn.utils.clip_grad_norm_(
                    [p for g in o.param_groups for p in g["params"]], max_norm=0.5)
            before = [p.detach().clone() for g in o.param_groups for p in g["params"]]
            scaler.step(o)
            after = [p.detach() for g in o.param_groups for p in g["params"]]
            skips.append(all(torch.equal(a, b) for a, b in zip(before, after)))
        if rng.random() < 0.05:
            scaler.update(rng.choice([2.0**8, 2.0**12]))
        else:
            scaler.update()
        trace.append((scaler.get_scale(), tuple(skips)))
    return trace, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("opt_names", [("sgd",), ("sgd-foreach",), ("adam",), ("adam-foreach",),
                                       ("adamw",), ("rmsprop",), ("adagrad",), ("adam", "sgd")],
                         ids=lambda names: "+".join(names))
@pytest.mark.parametrize("sequence", [11, 12, 13])
def test_same_scales_skips_and_parameters(opt_names, sequence):
    kw = dict(init_scale=2.0**14, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours_trace, ours_params = run_sequence(lucid_scaler,
                                           opt_names, sequence, **kw)
    ref_trace, ref_params = run_sequence(torch_scaler, opt_names, sequence, **kw)
    assert ours_trace == ref_trace
    # the sequence is not trivial: it grew, backed off and skipped
    scales = [s for s, _ in ours_trace]
    assert len(set(scales)) > 2
    assert any(any(skips) for _, skips in ours_trace)
    for a, b in zip(ours_params, ref_params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("opt_name", ["lucid-fused-adamw", "lucid-fused-sgd", "adamw-fused"])
def test_fused_optimizers_same_scales_skips_and_parameters(opt_name):
    kw = dict(init_scale=2.0**14, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours_trace, ours_params = run_sequence(lucid_scaler,
                                           (opt_name,), 12, **kw)
    ref_trace, ref_params = run_sequence(torch_scaler, (opt_name,), 12, **kw)
    assert ours_trace == ref_trace
    assert any(any(skips) for _, skips in ours_trace)
    for a, b in zip(ours_params, ref_params):
        assert torch.equal(a, b)


def _torch_cuda_scaler():
    cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if cls is None or not torch.cuda.is_available():
        return None
    return lambda **kw: cls("cuda", **kw)


@pytest.mark.skipif(_torch_cuda_scaler() is None,
                    reason="needs CUDA and a PyTorch with torch.amp.GradScaler")
@pytest.mark.parametrize("opt_names", [("sgd",), ("adam-foreach",), ("adamw-fused",),
                                       ("lucid-fused-adamw",), ("lucid-fused-sgd",),
                                       ("adamw-fused", "sgd-foreach")],
                         ids=lambda names: "+".join(names))
@pytest.mark.parametrize("sequence", [11, 12])
def test_cuda_same_scales_skips_and_parameters_as_torch(opt_names, sequence):
    kw = dict(init_scale=2.0**14, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours_trace, ours_params = run_sequence(lambda **k: lucid_amp.GradScaler("cuda", **k),
                                           opt_names, sequence, device="cuda", **kw)
    ref_trace, ref_params = run_sequence(_torch_cuda_scaler(), opt_names, sequence,
                                         device="cuda", **kw)
    assert ours_trace == ref_trace
    assert len({s for s, _ in ours_trace}) > 2
    assert any(any(skips) for _, skips in ours_trace)
    for a, b in zip(ours_params, ref_params):
        assert torch.equal(a, b)


@pytest.mark.skipif(_torch_cuda_scaler() is None,
                    reason="needs CUDA and a PyTorch with torch.amp.GradScaler")
def test_cuda_state_dict_moves_between_the_two_scalers_mid_training():
    kw = dict(init_scale=2.0**14, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    torch_scaler = _torch_cuda_scaler()
    lucid_scaler = lambda **k: lucid_amp.GradScaler("cuda", **k)
    for make_src, make_dst in [(lucid_scaler, torch_scaler), (torch_scaler, lucid_scaler)]:
        src = make_src(**kw)
        model = make_model("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for it in range(7):
            opt.zero_grad()
            src.scale(model(torch.ones(2, 6, device="cuda")).sum()).backward()
            if it == 4:
                model[0].weight.grad[0, 0] = math.inf
            src.step(opt)
            src.update()
        state = src.state_dict()
        assert set(state) >= {"scale", "growth_factor", "backoff_factor", "growth_interval",
                              "_growth_tracker"}
        dst = make_dst()
        dst.load_state_dict(state)
        assert dst.get_scale() == src.get_scale()
        assert dst.state_dict()["_growth_tracker"] == state["_growth_tracker"]
        # the next iterations follow the same schedule in both
        for scaler in (src, dst):
            for _ in range(3):
                opt.zero_grad()
                scaler.scale(model(torch.ones(2, 6, device="cuda")).sum()).backward()
                scaler.step(opt)
                scaler.update()
        assert dst.get_scale() == src.get_scale()


def test_odd_factors_give_the_same_float32_schedule():
    kw = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=2)
    ours_trace, ours_params = run_sequence(lucid_scaler,
                                           ("sgd",), 21, iterations=60, **kw)
    ref_trace, ref_params = run_sequence(torch_scaler, ("sgd",), 21, iterations=60, **kw)
    assert [s for s, _ in ours_trace] == [s for s, _ in ref_trace]
    assert [k for _, k in ours_trace] == [k for _, k in ref_trace]
    for a, b in zip(ours_params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_comparison_can_tell_a_wrong_schedule():
    """The parity test could fail: a scaler that grows after 2 clean updates instead of 3
    gives another trace."""
    kw = dict(init_scale=2.0**14, growth_factor=2.0, backoff_factor=0.5)
    a, _ = run_sequence(lambda **k: torch_scaler(growth_interval=3, **k), ("sgd",), 11, **kw)
    b, _ = run_sequence(lambda **k: lucid_scaler(growth_interval=2, **k), ("sgd",), 11, **kw)
    assert a != b
