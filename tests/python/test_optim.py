# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.optim: the fused optimizers against torch.optim within float32 rounding over
100 steps, their state_dicts in torch.optim's form both ways, LR schedulers, and the
scaler-aware protocol with lucid_amp.GradScaler (skip on overflow, unscaling inside)."""

import copy
import math

import pytest
import torch

import lucid_amp
from lucid_amp.optim import FusedAdam, FusedAdamW, FusedSGD

CASES = {
    "adam": (FusedAdam, torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.01)),
    "adam-amsgrad": (FusedAdam, torch.optim.Adam, dict(lr=1e-2, amsgrad=True)),
    "adamw": (FusedAdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "adamw-amsgrad": (FusedAdamW, torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    "sgd": (FusedSGD, torch.optim.SGD, dict(lr=0.05)),
    "sgd-momentum": (FusedSGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1,
                                                     weight_decay=0.01)),
    "sgd-nesterov": (FusedSGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
}
TOL = dict(rtol=1e-5, atol=1e-6)


def make_model(dtype=torch.float32):
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).to(dtype)


def data(n, dtype=torch.float32):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(8, 10, generator=g, dtype=dtype), torch.randn(8, 3, generator=g, dtype=dtype))
            for _ in range(n)]


def train(model, opt, batches, scaler=None, inject=()):
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if i in inject:
            model[0].weight.grad[0, 0] = math.inf
        if scaler:
            scaler.step(opt)
            scaler.update()
        elif i not in inject:
            opt.step()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_matches_torch_optim_over_100_steps(case, dtype):
    fused_cls, torch_cls, kw = CASES[case]
    a, b = make_model(dtype), make_model(dtype)
    opt_a, opt_b = fused_cls(a.parameters(), **kw), torch_cls(b.parameters(), **kw)
    batches = data(100, dtype)
    train(a, opt_a, batches)
    train(b, opt_b, batches)
    tol = TOL if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **tol)
    assert not torch.equal(a[0].weight, make_model(dtype)[0].weight)


@pytest.mark.parametrize("case", list(CASES))
def test_with_the_scaler_fused_matches_torch_optim_and_skips_on_overflow(case):
    fused_cls, torch_cls, kw = CASES[case]
    a, b = make_model(), make_model()
    opt_a, opt_b = fused_cls(a.parameters(), **kw), torch_cls(b.parameters(), **kw)
    batches = data(30)
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
    train(a, opt_a, batches, scaler=scaler, inject=(3, 4, 17))
    train(b, opt_b, batches, inject=(3, 4, 17))  # the control skips the same steps
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **TOL)
    c = scaler.counters()
    assert (c.steps_taken, c.steps_skipped, c.backoffs) == (27, 3, 3)
    if "step" in opt_a.state[a[0].weight]:
        assert opt_a.state[a[0].weight]["step"].item() == 27.0


def test_the_fused_optimizer_unscales_inside_its_kernel():
    """With the scale handed over, the step equals a step on gradients divided by hand."""
    a, b = make_model(), make_model()
    opt_a = FusedAdamW(a.parameters(), lr=1e-2)
    opt_b = FusedAdamW(b.parameters(), lr=1e-2)
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10)
    x, y = data(1)[0]
    scaler.scale(torch.nn.functional.mse_loss(a(x), y)).backward()
    torch.nn.functional.mse_loss(b(x), y).backward()
    scaler.step(opt_a)
    assert not hasattr(opt_a, "grad_scale") and not hasattr(opt_a, "found_inf")
    opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    # and the scale mattered: without it the step differs
    c = make_model()
    opt_c = FusedAdamW(c.parameters(), lr=1e-2, eps=1e-3)
    opt_a2 = FusedAdamW(make_model().parameters(), lr=1e-2, eps=1e-3)
    (torch.nn.functional.mse_loss(c(x), y) * 2.0**10).backward()
    opt_c.step()  # wrong: scaled gradients, no scaler
    m = opt_a2.param_groups[0]["params"]
    m[0].grad, m[1].grad = c[0].weight.grad / 2.0**10, c[0].bias.grad / 2.0**10
    opt_a2.step()
    assert not torch.equal(c[0].weight, m[0])


@pytest.mark.parametrize("case", ["adam", "adamw-amsgrad", "sgd-momentum"])
def test_state_dict_moves_to_torch_optim_and_back(case):
    fused_cls, torch_cls, kw = CASES[case]
    batches = data(20)
    ref = make_model()
    ref_opt = torch_cls(ref.parameters(), **kw)
    train(ref, ref_opt, batches)

    # 10 steps fused, then torch.optim, from the fused state_dict
    a = make_model()
    opt_a = fused_cls(a.parameters(), **kw)
    train(a, opt_a, batches[:10])
    sd = opt_a.state_dict()
    names = set(sd["state"][0])
    assert names >= ({"exp_avg", "exp_avg_sq"} if "adam" in case else {"momentum_buffer"})
    opt_t = torch_cls(a.parameters(), **kw)
    opt_t.load_state_dict(sd)
    train(a, opt_t, batches[10:])
    for p, q in zip(a.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, **TOL)

    # 10 steps torch.optim, then fused, from the torch state_dict
    b = make_model()
    opt_b = torch_cls(b.parameters(), **kw)
    train(b, opt_b, batches[:10])
    opt_f = fused_cls(b.parameters(), **kw)
    opt_f.load_state_dict(opt_b.state_dict())
    train(b, opt_f, batches[10:])
    for p, q in zip(b.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, **TOL)


def test_lr_scheduler_drives_the_fused_optimizer():
    a, b = make_model(), make_model()
    opt_a = FusedAdamW(a.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
    sa = torch.optim.lr_scheduler.StepLR(opt_a, step_size=3, gamma=0.3)
    sb = torch.optim.lr_scheduler.StepLR(opt_b, step_size=3, gamma=0.3)
    for x, y in data(12):
        for m, o, s in ((a, opt_a, sa), (b, opt_b, sb)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
            s.step()
    assert opt_a.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.3**4)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **TOL)


def test_param_groups_with_their_own_options_and_parameters_without_gradients():
    a, b = make_model(), make_model()
    groups = lambda m: [{"params": m[0].parameters(), "lr": 1e-3},
                        {"params": m[2].parameters(), "weight_decay": 0.5}]
    opt_a, opt_b = FusedAdamW(groups(a), lr=1e-2), torch.optim.AdamW(groups(b), lr=1e-2)
    for x, y in data(5):
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(x), y).backward()
            m[2].bias.grad = None  # a parameter that took no part
            o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **TOL)


def test_errors():
    with pytest.raises(ValueError):
        FusedAdam([torch.nn.Parameter(torch.zeros(1))], lr=-1.0)
    with pytest.raises(ValueError):
        FusedSGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, nesterov=True)
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    p.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="float32"):
        FusedAdamW([p]).step()
    q = torch.nn.Parameter(torch.zeros(3))
    q.grad = torch.ones(3).to_sparse()
    with pytest.raises(NotImplementedError, match="sparse"):
        FusedSGD([q], lr=0.1).step()


def test_a_loaded_state_of_the_wrong_size_raises_instead_of_being_walked_past_its_end():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = FusedAdamW([p])
    p.grad = torch.ones(4)
    opt.step()
    state = opt.state_dict()
    state["state"][0]["exp_avg"] = torch.zeros(3)  # load_state_dict checks no sizes
    opt.load_state_dict(state)
    before = p.detach().clone()
    with pytest.raises(RuntimeError, match=r"exp_avg of parameter 0 of param group 0 .* sizes \[3\]"):
        opt.step()
    assert torch.equal(p.detach(), before)


@pytest.mark.parametrize("case", ["adamw", "sgd-momentum"])
def test_strided_parameters_and_gradients_between_steady_steps(case):
    """A steady step launches from the kept lists; a step whose parameter or gradient is
    not contiguous goes through a contiguous copy that is written back, and the result
    matches torch.optim either way."""
    fused_cls, torch_cls, kwargs = CASES[case]
    a = torch.nn.Parameter(torch.randn(6, 4).t())  # not contiguous from the start
    b = torch.nn.Parameter(torch.randn(5))
    ref = [torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())]
    opt, opt_ref = fused_cls([a, b], **kwargs), torch_cls(ref, **kwargs)
    g = torch.Generator().manual_seed(3)
    for i in range(8):
        ga, gb = torch.randn(6, 4, generator=g).t(), torch.randn(5, generator=g)
        if i % 3 == 0:  # contiguous gradients on some steps, strided on others
            ga = ga.contiguous()
        for params, o in (([a, b], opt), (ref, opt_ref)):
            params[0].grad, params[1].grad = ga.clone(), gb.clone()
            if i % 3 == 1:
                params[0].grad = ga.t().contiguous().t()
            o.step()
        torch.testing.assert_close(a, ref[0], **TOL)
        torch.testing.assert_close(b, ref[1], **TOL)
    assert not a.is_contiguous()  # written back into the parameter, not replaced


def test_a_gradient_that_turns_wrong_after_steady_steps_raises_before_any_change():
    p, q = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))
    opt = FusedAdamW([p, q])
    for _ in range(2):
        p.grad, q.grad = torch.ones(4), torch.ones(2)
        opt.step()
    before = [p.detach().clone(), q.detach().clone()]
    p.grad, q.grad = torch.ones(4), torch.ones(2).to_sparse()
    with pytest.raises(NotImplementedError, match="sparse"):
        opt.step()
    assert torch.equal(p.detach(), before[0]) and torch.equal(q.detach(), before[1])
    q.grad = torch.ones(2)
    opt.step()  # and the group steps again once the gradient is right
    assert not torch.equal(p.detach(), before[0])


@pytest.mark.parametrize("case", ["adamw", "sgd-momentum"])
def test_kept_state_lists_follow_every_change_of_the_group(case):
    """The fused optimizers keep each group's state lists between steps; every change that
    torch.optim would see on its next step is seen here too: a parameter that gains or
    loses a gradient, a group's parameter swapped in place, a parameter moved to float64,
    load_state_dict, add_param_group and momentum switched on."""
    fused_cls, torch_cls, kwargs = CASES[case]
    a, b = make_model(), make_model()
    opt_a, opt_b = fused_cls(a.parameters(), **kwargs), torch_cls(b.parameters(), **kwargs)
    batches = data(12)

    def step_both(i, x, y, drop_bias=False):
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(x.to(m[0].weight.dtype)), y.to(m[0].weight.dtype)).backward()
            if drop_bias:
                m[2].bias.grad = None
            o.step()

    for i, (x, y) in enumerate(batches[:3]):
        step_both(i, x, y, drop_bias=i == 1)  # loses, then regains a gradient
    # a parameter of the group swapped in place for a fresh one (same list object)
    for m, o in ((a, opt_a), (b, opt_b)):
        fresh = torch.nn.Parameter(m[2].weight.detach().clone() * 0.5)
        o.state.pop(m[2].weight, None)  # torch.optim's state_dict needs no orphan state
        m[2].weight = fresh
        o.param_groups[0]["params"][2] = fresh
    for i, (x, y) in enumerate(batches[3:5]):
        step_both(i, x, y)
    # load_state_dict: the fused optimizer continues from the torch one's state. From a
    # copy, as from a checkpoint: PyTorch 2.x's load_state_dict keeps the very tensors it
    # is given, which both optimizers would then update in place.
    opt_a.load_state_dict(copy.deepcopy(opt_b.state_dict()))
    a.load_state_dict(b.state_dict())
    for i, (x, y) in enumerate(batches[5:7]):
        step_both(i, x, y)
    # a new group
    extra_a = torch.nn.Parameter(torch.ones(3))
    extra_b = torch.nn.Parameter(torch.ones(3))
    opt_a.add_param_group({"params": [extra_a]})
    opt_b.add_param_group({"params": [extra_b]})
    for x, y in batches[7:9]:
        for m, o, e in ((a, opt_a, extra_a), (b, opt_b, extra_b)):
            o.zero_grad(set_to_none=True)
            (torch.nn.functional.mse_loss(m(x), y) + (e * e).sum()).backward()
            o.step()
    # a parameter's tensor swapped under its Python object (what a module conversion may
    # do in PyTorch 2.x): same object, another tensor
    swap = getattr(torch.utils, "swap_tensors", None)
    if swap is not None:
        for m in (a, b):
            swap(m[0].bias, torch.nn.Parameter(m[0].bias.detach().clone() + 0.25))
        for i, (x, y) in enumerate(batches[9:10]):
            step_both(i, x, y)
    # every parameter moved to float64 in place (model.to keeps the Parameter objects)
    for m in (a, b):
        m.to(torch.float64)
    # torch.optim leaves its state as it is, and its next update would fail on it, as the
    # fused one's does: move it by hand
    for st in list(opt_a.state.values()) + list(opt_b.state.values()):
        for key, value in st.items():
            if torch.is_tensor(value) and key != "step":
                st[key] = value.double()
    for i, (x, y) in enumerate(batches[9:12]):
        step_both(i, x, y)
    for p, q in zip(list(a.parameters()) + [extra_a], list(b.parameters()) + [extra_b]):
        assert p.dtype == q.dtype
        torch.testing.assert_close(p, q, **TOL)


def test_a_scaler_aware_step_is_reported_when_asked_before_or_after_update():
    """With a scaler-aware optimizer the scaler's step does not wait for the device; the
    outcome is read at update() or when asked for, and names the parameter either way."""
    for ask_before_update in (True, False):
        model = make_model()
        opt = FusedAdamW(model.parameters(), lr=1e-2)
        scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10)
        scaler.set_parameter_names(model.named_parameters())
        outcomes = []
        for i, (x, y) in enumerate(data(4)):
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            if i == 2:
                model[2].bias.grad[1] = math.nan
            scaler.step(opt)
            if ask_before_update:
                outcomes.append(scaler.step_skipped(opt))
                if i == 2:
                    assert scaler.last_overflow().gradients[0].name == "2.bias"
            scaler.update()
            if not ask_before_update:
                outcomes.append(scaler.step_skipped(opt))
        assert outcomes == [False, False, True, False]
        counters = scaler.counters()
        assert (counters.steps_taken, counters.steps_skipped, counters.backoffs) == (3, 1, 1)
        report = scaler.last_overflow()
        assert [(g.name, g.nan_count) for g in report.gradients] == [("2.bias", 1)]
        assert report.iteration == 2 and report.scale == 2.0**10


# ---- tensors changed in place or replaced between steps ----------------------------------
# The rule: where torch.optim's step succeeds, the fused one gives the same parameters and
# state; where torch.optim's step raises, the fused one raises before anything is written.
# Each change is made alike to a fused optimizer and to its torch.optim counterpart after
# two steady steps (the kept kernel arguments are in use by then).

def _grad_sized(p):
    return torch.ones_like(p)


CHANGES = {
    # inconsistent: torch.optim raises
    "grad-set-to-2-elements": lambda opt, p: p.grad.set_(torch.ones(2)),
    "grad-resized-in-place": lambda opt, p: p.grad.resize_(3),
    "state-set-to-2-elements": lambda opt, p: opt.state[p][_first_buffer(opt)].set_(torch.zeros(2)),
    "state-replaced-by-another-size": lambda opt, p: opt.state[p].__setitem__(
        _first_buffer(opt), torch.zeros(3)),
    "state-replaced-by-float64": lambda opt, p: opt.state[p].__setitem__(
        _first_buffer(opt), torch.zeros_like(p, dtype=torch.float64)),
    "data-reshaped-state-kept": lambda opt, p: _reshape(p),
    # consistent: torch.optim proceeds
    "state-replaced-by-a-same-sized-tensor": lambda opt, p: opt.state[p].__setitem__(
        _first_buffer(opt), torch.full_like(p, 0.25)),
    "state-set-to-new-storage-of-the-same-size": lambda opt, p: opt.state[p][_first_buffer(opt)].set_(
        torch.full_like(p, 0.5)),
    "state-deleted": lambda opt, p: opt.state.pop(p),
    "data-reshaped-state-deleted": lambda opt, p: (_reshape(p), opt.state.pop(p)),
    "grad-replaced-by-a-transposed-layout": lambda opt, p: setattr(
        p, "grad", p.grad.t().contiguous().t()) if p.dim() == 2 else None,
}


# Deliberately stricter than torch.optim (docs/behaviour.md): torch.optim.SGD updates a
# float64 momentum buffer of a float32 parameter (torch.optim.Adam refuses such an
# exp_avg); the fused kernels keep every state in its parameter's dtype and refuse both.
STRICTER = {("sgd-momentum", "state-replaced-by-float64")}


def _first_buffer(opt):
    return "momentum_buffer" if isinstance(opt, (FusedSGD, torch.optim.SGD)) else "exp_avg"


def _reshape(p):
    p.data = p.data.reshape(-1)[:6].clone().reshape(2, 3)
    p.grad = torch.ones(2, 3)


def _outcome(fn):
    try:
        fn()
        return None
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
        return err


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("case", ["adamw", "adam-amsgrad", "sgd-momentum"])
def test_a_tensor_changed_between_steps_is_stepped_or_refused_as_torch_optim_does(case, change):
    fused_cls, torch_cls, kwargs = CASES[case]
    worlds = []
    for cls in (fused_cls, torch_cls):
        torch.manual_seed(5)
        params = [torch.nn.Parameter(torch.randn(28, 28)), torch.nn.Parameter(torch.randn(5))]
        opt = cls(params, **kwargs)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
        for p in params:
            p.grad = torch.randn_like(p) if p.dim() == 1 else torch.full_like(p, 0.5)
        CHANGES[change](opt, params[0])
        before = [p.detach().clone() for p in params]
        worlds.append((opt, params, before, _outcome(opt.step)))
    (opt, params, before, err), (ref, ref_params, _, ref_err) = worlds
    if (case, change) in STRICTER:
        assert err is not None and ref_err is None, f"fused: {err!r}; torch.optim: {ref_err!r}"
    else:
        assert (err is None) == (ref_err is None), f"fused: {err!r}; torch.optim: {ref_err!r}"
    if err is not None:
        assert "parameter 0 of param group 0" in str(err), str(err)
        for p, b in zip(params, before):
            assert torch.equal(p.detach(), b), "a refused step wrote a parameter"
        return
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p.detach(), q.detach(), **TOL)
    for p, q in zip(params, ref_params):
        for key, value in ref.state[q].items():
            if torch.is_tensor(value) and key != "step":
                torch.testing.assert_close(opt.state[p][key], value, **TOL)
    # and the group keeps stepping alike
    for world in ((opt, params), (ref, ref_params)):
        for p in world[1]:
            p.grad = torch.ones_like(p)
        world[0].step()
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p.detach(), q.detach(), **TOL)


def test_a_wrong_gradient_before_the_first_step_raises_instead_of_writing_past_its_end():
    p = torch.nn.Parameter(torch.zeros(784))
    for cls in (FusedSGD, torch.optim.SGD):
        opt = cls([p], lr=0.1)
        p.grad = torch.zeros(784)
        p.grad.set_(torch.ones(2))
        with pytest.raises(RuntimeError):
            opt.step()
        assert torch.equal(p.detach(), torch.zeros(784))


def test_an_error_in_a_later_param_group_leaves_the_earlier_ones_unwritten():
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(3))
    opt = FusedAdamW([{"params": [a]}, {"params": [b]}], lr=0.1)
    for _ in range(2):
        a.grad, b.grad = torch.ones(4), torch.ones(3)
        opt.step()
    before = a.detach().clone()
    opt.state[b]["exp_avg_sq"].set_(torch.zeros(1))
    with pytest.raises(RuntimeError, match="exp_avg_sq of parameter 0 of param group 1"):
        opt.step()
    assert torch.equal(a.detach(), before)


@pytest.mark.parametrize("case", ["adamw", "sgd-momentum"])
def test_channels_last_parameters_keep_their_layout_and_match_torch_optim(case):
    fused_cls, torch_cls, kwargs = CASES[case]
    torch.manual_seed(2)
    w = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
    a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    opt_a, opt_b = fused_cls([a], **kwargs), torch_cls([b], **kwargs)
    for _ in range(5):
        g = torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(a.detach(), b.detach(), **TOL)
    buffer = _first_buffer(opt_a)
    assert opt_a.state[a][buffer].is_contiguous(memory_format=torch.channels_last)
    assert a.is_contiguous(memory_format=torch.channels_last)
