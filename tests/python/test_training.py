# SPDX-License-Identifier: BSD-3-Clause
"""Training equivalence: a loop with lucid_amp.GradScaler gives the parameters of a control
loop without scaling (a power-of-two scale is exact in float32), with clipping, gradient
accumulation and two optimizers; an overflow skips exactly the optimizer it hit. PyTorch's
own torch.amp.GradScaler("cpu") runs the same loops beside it, so that each expectation is
shown to be PyTorch's behaviour too."""

import math

import pytest
import torch

import lucid_amp


def make_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batches(n, micro=1):
    g = torch.Generator().manual_seed(5)
    return [[(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(micro)]
            for _ in range(n)]


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def train(model, opts, data, scaler=None, clip=None, inject=None):
    """inject: {iteration: index of the optimizer whose first gradient gets an inf}"""
    for it, micro in enumerate(data):
        for o in opts:
            o.zero_grad()
        for x, y in micro:
            loss = loss_of(model, x, y) / len(micro)
            (scaler.scale(loss) if scaler else loss).backward()
        hit = (inject or {}).get(it)
        if hit is not None:
            opts[hit].param_groups[0]["params"][0].grad.view(-1)[0] = math.inf
        for i, o in enumerate(opts):
            if scaler is None:
                if hit == i:
                    continue  # the control skips what the scaler must skip
                if clip:
                    torch.nn.utils.clip_grad_norm_(o.param_groups[0]["params"], clip)
                o.step()
            else:
                if clip:
                    scaler.unscale_(o)
                    torch.nn.utils.clip_grad_norm_(o.param_groups[0]["params"], clip)
                scaler.step(o)
        if scaler is not None:
            scaler.update()
    return [p.detach().clone() for p in model.parameters()]


SCALERS = {"lucid": lucid_amp.GradScaler, "torch": torch.amp.GradScaler}


def optimizer_pairs(kind, model):
    if kind == "sgd":
        return [torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)]
    if kind == "adam":
        return [torch.optim.Adam(model.parameters(), lr=1e-2)]
    if kind == "two":
        return [torch.optim.Adam(model[0].parameters(), lr=1e-2),
                torch.optim.SGD(model[2].parameters(), lr=0.05)]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["sgd", "adam", "two"])
@pytest.mark.parametrize("clip", [None, 0.1])
@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("which", sorted(SCALERS))
def test_scaled_training_equals_the_control_run(which, kind, clip, micro):
    data = batches(12, micro)
    control_model = make_model()
    control = train(control_model, optimizer_pairs(kind, control_model), data, clip=clip)
    model = make_model()
    scaler = SCALERS[which]("cpu", init_scale=2.0**12, growth_interval=4)
    scaled = train(model, optimizer_pairs(kind, model), data, scaler=scaler, clip=clip)
    for a, b in zip(control, scaled):
        assert torch.equal(a, b)
    assert scaler.get_scale() == 2.0**15
    # the control differs from the start: training did something
    assert not torch.equal(control[0], make_model()[0].weight)


@pytest.mark.parametrize("which", sorted(SCALERS))
def test_an_overflow_in_one_of_two_optimizers_skips_only_that_one(which):
    data = batches(8)
    inject = {2: 0, 5: 1}
    control_model = make_model()
    control = train(control_model, optimizer_pairs("two", control_model), data, inject=inject)
    model = make_model()
    opts = optimizer_pairs("two", model)
    scaler = SCALERS[which]("cpu", init_scale=2.0**12, growth_interval=100)
    scaled = train(model, opts, data, scaler=scaler, inject=inject)
    for a, b in zip(control, scaled):
        assert torch.equal(a, b)
    assert scaler.get_scale() == 2.0**10
    if which == "lucid":  # lucid-amp's own counters
        assert scaler.counters().steps_skipped == 2 and scaler.counters().steps_taken == 14


def test_without_unscaling_the_parameters_would_differ():
    """The equivalence test can fail: stepping on scaled gradients gives other weights."""
    data = batches(3)
    control_model = make_model()
    control = train(control_model, optimizer_pairs("sgd", control_model), data)
    model = make_model()
    opt = optimizer_pairs("sgd", model)[0]
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**4)
    for micro in data:
        opt.zero_grad()
        for x, y in micro:
            scaler.scale(loss_of(model, x, y)).backward()
        opt.step()  # wrong: not through the scaler
    assert not torch.equal(control[0], model[0].weight)


def test_lr_scheduler_and_step_skipped():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**8)
    for it, micro in enumerate(batches(4)):
        opt.zero_grad()
        for x, y in micro:
            scaler.scale(loss_of(model, x, y)).backward()
        if it == 1:
            model[0].bias.grad[0] = math.nan
        scaler.step(opt)
        scaler.update()
        if not scaler.step_skipped(opt):
            sched.step()
    assert opt.param_groups[0]["lr"] == 0.125
