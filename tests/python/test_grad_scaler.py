# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.GradScaler: the reference API's rules, errors and dtype rules, state_dict and
pickling, PyTorch's optimizer protocol and lucid-amp's extras, on the CPU."""

import inspect
import math
import pickle
import warnings

import pytest
import torch
from torch.amp.grad_scaler import OptState

import lucid_amp


def make_model(init=0, features=4):
    torch.manual_seed(init)
    return torch.nn.Sequential(torch.nn.Linear(features, 3), torch.nn.Linear(3, 1))


def backward(scaler, model, batch=1):
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(5, model[0].in_features, generator=g)
    loss = model(x).pow(2).mean()
    scaler.scale(loss).backward()
    return loss


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def same(xs, ys):
    return all(torch.equal(a, b) for a, b in zip(xs, ys))


@pytest.fixture
def scaler():
    return lucid_amp.GradScaler("cpu", init_scale=2.0**10)


# ---- scale -----------------------------------------------------------------------------------


def test_scale_multiplies_a_tensor_and_keeps_the_graph(scaler):
    x = torch.tensor([1.5, -2.0], requires_grad=True)
    y = scaler.scale(x)
    assert torch.equal(y, x.detach() * 1024)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((2,), 1024.0))


def test_scale_returns_at_least_float32(scaler):
    assert scaler.scale(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert scaler.scale(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert scaler.scale(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


def test_scale_keeps_nested_lists_and_tuples(scaler):
    a, b, c = torch.ones(1), torch.full((2,), 2.0), torch.full((3,), 3.0)
    out = scaler.scale([a, (b, [c])])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    assert torch.equal(out[0], a * 1024)
    assert torch.equal(out[1][0], b * 1024)
    assert torch.equal(out[1][1][0], c * 1024)


def test_scale_refuses_what_is_not_a_tensor(scaler):
    with pytest.raises(ValueError):
        scaler.scale([torch.ones(1), 3.0])


# ---- the stage machine ---------------------------------------------------------------------


def test_unscale_divides_the_gradients_once_and_step_does_not_divide_again(scaler):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaled = grads(model)
    scaler.unscale_(opt)
    assert scaler.stage(opt) == "unscaled"
    assert same(grads(model), [g / 1024 for g in scaled])
    before = params(model)
    scaler.step(opt)
    assert scaler.stage(opt) == "stepped"
    assert same(params(model), [p - 0.1 * g / 1024 for p, g in zip(before, scaled)])
    scaler.update()
    assert scaler.stage(opt) == "ready"


@pytest.mark.parametrize("optimizer", ["sgd", "fused_adamw"])
@pytest.mark.parametrize("call", ["unscale_", "clip_grad_norm_", "step", "update", "update(4.0)"])
def test_every_call_that_needs_the_scale_refuses_to_run_before_scale(call, optimizer):
    # torch.amp.GradScaler raises too: its scale does not exist until the first scale().
    def run(scaler, opt):
        if call == "update(4.0)":
            scaler.update(4.0)
        elif call == "clip_grad_norm_":
            if isinstance(scaler, lucid_amp.GradScaler):
                scaler.clip_grad_norm_(opt, 1.0)
            else:
                scaler.unscale_(opt)
        else:
            getattr(scaler, call)(*(() if call == "update" else (opt,)))

    for kind in (torch.amp.GradScaler, lucid_amp.GradScaler):
        model = make_model()
        for p in model.parameters():
            p.grad = torch.full_like(p, 1024.0)
        make = lucid_amp.optim.FusedAdamW if optimizer == "fused_adamw" else torch.optim.SGD
        opt = make(model.parameters(), lr=0.1)
        scaler = kind("cpu", init_scale=1024.0)
        before, grads_before = params(model), grads(model)
        with pytest.raises((RuntimeError, AssertionError)) as raised:
            run(scaler, opt)
        if kind is lucid_amp.GradScaler:
            assert "before any scale()" in str(raised.value) and "Call scale(loss)" in str(raised.value)
            assert scaler.stage(opt) == "ready"
        assert same(params(model), before) and same(grads(model), grads_before)
        assert scaler.get_scale() == 1024.0
        scaler.scale(torch.ones(()))  # from here on the same call runs
        if call == "update":
            scaler.step(opt)  # PyTorch's update() wants a checked step
        run(scaler, opt)


def test_unscale_twice_raises_runtime_error_and_changes_nothing(scaler):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaler.unscale_(opt)
    once = grads(model)
    with pytest.raises(RuntimeError, match="unscale_"):
        scaler.unscale_(opt)
    assert same(grads(model), once)
    assert scaler.stage(opt) == "unscaled"


def test_unscale_after_step_raises_runtime_error(scaler):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaler.step(opt)
    g = grads(model)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    assert same(grads(model), g)
    assert scaler.stage(opt) == "stepped"


def test_step_twice_raises_runtime_error_and_does_not_step_again(scaler):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaler.step(opt)
    p = params(model)
    with pytest.raises(RuntimeError, match="step"):
        scaler.step(opt)
    assert same(params(model), p)


@pytest.mark.parametrize("how", ["keyword", "positional"])
def test_closure_while_enabled_raises_runtime_error_and_nothing_steps(scaler, how):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    g, p = grads(model), params(model)
    calls = []

    def closure():
        calls.append(1)
        return torch.zeros(())

    with pytest.raises(RuntimeError, match="closure"):
        if how == "keyword":
            scaler.step(opt, closure=closure)
        else:
            scaler.step(opt, closure)
    assert not calls
    assert same(grads(model), g) and same(params(model), p)
    assert scaler.stage(opt) == "ready"
    scaler.step(opt)  # the iteration can go on


def test_step_returns_what_the_optimizer_returned_or_none_when_skipped(scaler):
    class Returning(torch.optim.SGD):
        def step(self, closure=None):
            super().step()
            return "stepped"

    model = make_model()
    opt = Returning(model.parameters(), lr=0.1)
    backward(scaler, model)
    assert scaler.step(opt) == "stepped"
    scaler.update()
    opt.zero_grad()
    backward(scaler, model)
    next(model.parameters()).grad[0, 0] = math.inf
    assert scaler.step(opt) is None


def test_an_exception_from_the_optimizer_reaches_the_caller_unchanged(scaler):
    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            raise KeyError("from the optimizer")

    model = make_model()
    opt = Failing(model.parameters(), lr=0.1)
    backward(scaler, model)
    with pytest.raises(KeyError, match="from the optimizer"):
        scaler.step(opt)


# ---- dtype rules ----------------------------------------------------------------------------


def _one_param_optimizer(grad):
    p = torch.nn.Parameter(torch.zeros(grad.shape, dtype=grad.dtype))
    p.grad = grad
    return p, torch.optim.SGD([p], lr=1.0)


def test_float16_gradients_raise_value_error_and_nothing_is_unscaled(scaler):
    ok = torch.nn.Parameter(torch.zeros(3))
    ok.grad = torch.full((3,), 2048.0)
    half = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    half.grad = torch.full((3,), 2048.0, dtype=torch.float16)
    opt = torch.optim.SGD([ok, half], lr=1.0)
    scaler.scale(torch.ones(1))
    with pytest.raises(ValueError, match="float16"):
        scaler.unscale_(opt)
    assert torch.equal(ok.grad, torch.full((3,), 2048.0))
    assert scaler.stage(opt) == "ready"
    with pytest.raises(ValueError, match="float16"):
        scaler.step(opt)
    assert torch.equal(ok, torch.zeros(3))
    assert scaler.stage(opt) == "ready"


def test_complex_gradients_raise_not_implemented_error_and_change_nothing(scaler):
    ok = torch.nn.Parameter(torch.zeros(2))
    ok.grad = torch.full((2,), 2048.0)
    cplx = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    cplx.grad = torch.ones(2, dtype=torch.complex64)
    opt = torch.optim.SGD([{"params": [ok]}, {"params": [cplx]}], lr=1.0)
    scaler.scale(torch.ones(1))
    with pytest.raises(NotImplementedError, match="complex"):
        scaler.unscale_(opt)
    assert torch.equal(ok.grad, torch.full((2,), 2048.0))
    assert scaler.stage(opt) == "ready"
    with pytest.raises(NotImplementedError):
        scaler.step(opt)
    assert torch.equal(ok, torch.zeros(2))


def test_a_parameter_that_is_not_a_tensor_raises_type_error_and_changes_nothing(scaler):
    ok = torch.nn.Parameter(torch.zeros(2))
    ok.grad = torch.full((2,), 2048.0)
    opt = torch.optim.SGD([ok], lr=1.0)
    opt.param_groups.append({"params": [ok, "not a tensor"], "lr": 1.0})
    scaler.scale(torch.ones(1))
    for call in (scaler.unscale_, scaler.step):
        with pytest.raises(TypeError, match="parameter 1 of param group 1 is a str, not a tensor"):
            call(opt)
        assert torch.equal(ok.grad, torch.full((2,), 2048.0))
        assert torch.equal(ok, torch.zeros(2))
        assert scaler.stage(opt) == "ready"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_bfloat16_and_float64_gradients_are_unscaled_in_their_dtype(scaler, dtype):
    grad = torch.tensor([3072.0, -512.0, 1.0], dtype=dtype)
    p, opt = _one_param_optimizer(grad.clone())
    scaler.scale(torch.ones(1))
    scaler.unscale_(opt)
    assert p.grad.dtype == dtype
    assert torch.equal(p.grad, grad / 1024)
    assert not scaler.overflowed(opt)


def test_float64_unscaling_keeps_float64_precision():
    scaler = lucid_amp.GradScaler("cpu", init_scale=3.0)
    grad = torch.tensor([1.0 / 3.0 * 3.0 + 1e-12], dtype=torch.float64)
    p, opt = _one_param_optimizer(grad.clone())
    scaler.scale(torch.ones(1))
    scaler.unscale_(opt)
    # float32 arithmetic would lose the 1e-12
    assert abs(p.grad.item() - grad.item() / 3.0) < 1e-15


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_every_kind_of_non_finite_is_found_and_the_step_skipped(scaler, bad):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    list(model.parameters())[-1].grad[0] = bad
    p = params(model)
    assert scaler.step(opt) is None
    assert scaler.step_skipped(opt) and scaler.overflowed(opt)
    assert same(params(model), p)
    scaler.update()
    assert scaler.get_scale() == 512.0


# ---- update -------------------------------------------------------------------------------


def test_update_grows_after_growth_interval_clean_steps():
    scaler = lucid_amp.GradScaler("cpu", init_scale=4.0, growth_factor=3.0, growth_interval=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    for _ in range(4):
        opt.zero_grad()
        backward(scaler, model)
        scaler.step(opt)
        scaler.update()
        seen.append(scaler.get_scale())
    assert seen == [4.0, 12.0, 12.0, 36.0]


def test_update_new_scale_takes_a_float_or_a_one_element_tensor(scaler):
    scaler.scale(torch.ones(1))
    scaler.update(8.0)
    assert scaler.get_scale() == 8.0
    scaler.update(torch.tensor([16.0]))
    assert scaler.get_scale() == 16.0
    with pytest.raises(ValueError):
        scaler.update(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError):
        scaler.update(-1.0)
    with pytest.raises(ValueError):
        scaler.update(math.inf)
    assert scaler.get_scale() == 16.0


# ---- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [dict(init_scale=0.0), dict(growth_factor=1.0), dict(backoff_factor=1.0),
     dict(backoff_factor=0.0), dict(growth_interval=0), dict(hysteresis=0),
     dict(min_scale=-1.0), dict(max_scale=1.0)],
)
def test_invalid_options_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        lucid_amp.GradScaler("cpu", **kwargs)


def test_getters_and_setters():
    scaler = lucid_amp.GradScaler("cpu", init_scale=8.0, growth_factor=4.0, backoff_factor=0.25,
                                  growth_interval=3)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (4.0, 0.25, 3)
    assert scaler.is_enabled()
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.5)
    scaler.set_growth_interval(1)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (3.0, 0.5, 1)
    with pytest.raises(ValueError):
        scaler.set_growth_factor(0.5)
    assert scaler.get_growth_factor() == 3.0
    # the new interval and factor act on the next update
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    backward(scaler, model)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 24.0


# ---- disabled ------------------------------------------------------------------------------


def test_disabled_scaler_is_a_pass_through():
    scaler = lucid_amp.GradScaler("cpu", enabled=False)
    assert not scaler.is_enabled()
    x = torch.ones(2)
    assert scaler.scale(x) is x
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    calls = []

    def closure():
        calls.append(1)
        return torch.zeros(())

    scaler.step(opt, closure)  # a closure is allowed while disabled
    assert calls == [1]
    scaler.update()
    assert scaler.get_scale() == 1.0
    assert scaler.state_dict() == {}
    scaler.set_growth_interval(7)
    assert scaler.get_growth_interval() == 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_scaler_without_cuda_warns_and_disables_itself_as_pytorchs():
    messages = []
    for cls in (lucid_amp.GradScaler, torch.amp.GradScaler):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler = cls()
        assert not scaler.is_enabled()
        mine = [w for w in caught if "CUDA is not available" in str(w.message)]
        assert len(mine) == 1 and mine[0].category is UserWarning
        assert mine[0].filename == __file__  # attributed to the caller's line
        messages.append(str(mine[0].message))
    assert messages[0] == messages[1]


# ---- state_dict ---------------------------------------------------------------------------


def _advanced_scaler(**kwargs):
    scaler = lucid_amp.GradScaler("cpu", init_scale=64.0, growth_interval=5, **kwargs)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(3):
        opt.zero_grad()
        backward(scaler, model)
        scaler.step(opt)
        scaler.update()
    return scaler


def test_state_dict_has_pytorchs_keys_and_types():
    state = _advanced_scaler().state_dict()
    assert state == {"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 5, "_growth_tracker": 3}
    assert isinstance(state["growth_interval"], int) and isinstance(state["_growth_tracker"], int)


def test_state_dict_round_trip_and_guard_keys():
    src = _advanced_scaler(hysteresis=2, max_scale=1024.0)
    state = src.state_dict()
    assert state["hysteresis"] == 2 and state["max_scale"] == 1024.0
    dst = lucid_amp.GradScaler("cpu", init_scale=2.0, growth_interval=9)
    dst.load_state_dict(state)
    assert dst.state_dict() == state


def test_load_state_dict_refuses_invalid_states_and_keeps_its_own():
    scaler = _advanced_scaler()
    before = scaler.state_dict()
    for bad in ({"scale": 1.0}, dict(before, scale=-1.0), dict(before, _growth_tracker=5),
                dict(before, growth_factor=0.9)):
        with pytest.raises(ValueError):
            scaler.load_state_dict(bad)
        assert scaler.state_dict() == before
    with pytest.raises(RuntimeError, match="empty"):
        scaler.load_state_dict({})


def torch_scaler(**kwargs):
    """PyTorch's own scaler, for the state_dict round trips."""
    return torch.amp.GradScaler("cpu", **kwargs)


def test_a_lucid_state_dict_loads_into_pytorchs_scaler():
    state = _advanced_scaler().state_dict()
    theirs = torch_scaler(init_scale=2.0, growth_interval=9)
    theirs.load_state_dict(state)
    assert theirs.state_dict() == {"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                   "growth_interval": 5, "_growth_tracker": 3}
    assert theirs.get_scale() == 64.0 and theirs.get_growth_interval() == 5


def test_pytorchs_state_dict_loads_into_a_lucid_scaler():
    theirs = torch_scaler(init_scale=256.0, growth_factor=4.0, backoff_factor=0.25,
                          growth_interval=7)
    state = theirs.state_dict()
    assert "_growth_tracker" in state
    ours = lucid_amp.GradScaler("cpu")
    ours.load_state_dict(state)
    assert ours.get_scale() == 256.0
    assert ours.state_dict() == {"scale": 256.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                                 "growth_interval": 7, "_growth_tracker": state["_growth_tracker"]}


# ---- pickling ------------------------------------------------------------------------------


def test_pickling_keeps_state_options_and_counters():
    src = _advanced_scaler(hysteresis=3, min_scale=1.0)
    dst = pickle.loads(pickle.dumps(src))
    assert dst.state_dict() == src.state_dict()
    assert dst.counters() == src.counters() and dst.counters().steps_taken == 3
    assert dst.get_growth_interval() == 5
    dst.scale(torch.ones(1))  # as PyTorch's, an unpickled scaler makes its scale anew
    with pytest.raises(ValueError, match="min_scale"):
        dst.update(0.5)  # min_scale survived: below the guard
    disabled = pickle.loads(pickle.dumps(lucid_amp.GradScaler("cpu", enabled=False)))
    assert not disabled.is_enabled()


def test_pickling_in_the_middle_of_an_iteration_is_refused(scaler):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="pickled"):
        pickle.dumps(scaler)
    scaler.step(opt)
    scaler.update()
    pickle.dumps(scaler)


# ---- PyTorch's protocol for scaler-aware optimizers -----------------------------------------


class ProtocolSGD(torch.optim.Optimizer):
    """Follows PyTorch's fused-optimizer protocol: reads self.grad_scale/self.found_inf,
    divides the gradients by the scale itself when given one and skips when found_inf is
    set."""

    _step_supports_amp_scaling = True

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))
        self.seen = []

    @torch.no_grad()
    def step(self, closure=None):
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        self.seen.append((None if grad_scale is None else grad_scale.item(),
                          None if found_inf is None else found_inf.item()))
        if found_inf is not None and found_inf.item() != 0:
            return "skipped-on-device"
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad if grad_scale is None else p.grad / grad_scale
                p.add_(g, alpha=-group["lr"])
        return "ran"


def test_a_protocol_optimizer_gets_the_flag_and_the_scale_and_unscales_itself(scaler):
    """Any optimizer of the protocol but torch.optim's own fused ones gets the scale and
    the flag, as from PyTorch's scaler, and unscales itself: the scaler only checks the
    gradients, which stay scaled."""
    model = make_model()
    opt = ProtocolSGD(model.parameters(), lr=0.1)
    control = make_model()
    backward(scaler, model)
    scaled = grads(model)
    assert scaler.step(opt) == "ran"
    assert opt.seen == [(1024.0, 0.0)]
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    assert same(grads(model), scaled)
    expect = [p.detach() - 0.1 * (g / 1024) for p, g in zip(control.parameters(), scaled)]
    assert same(params(model), expect)
    scaler.update()
    opt.zero_grad()
    backward(scaler, model)
    next(model.parameters()).grad.view(-1)[0] = math.inf
    p = params(model)
    assert scaler.step(opt) == "skipped-on-device"
    assert opt.seen[-1] == (1024.0, 1.0)
    assert scaler.step_skipped(opt) and same(params(model), p)
    scaler.update()
    assert scaler.get_scale() == 512.0


def test_a_protocol_optimizer_after_unscale_gets_no_scale_and_skips_on_overflow(scaler):
    model = make_model()
    opt = ProtocolSGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaler.unscale_(opt)
    scaler.step(opt)
    assert opt.seen[-1] == (None, 0.0)
    scaler.update()
    opt.zero_grad()
    backward(scaler, model)
    next(model.parameters()).grad.view(-1)[0] = math.nan
    p = params(model)
    assert scaler.step(opt) == "skipped-on-device"
    assert opt.seen[-1] == (1024.0, 1.0)
    assert scaler.step_skipped(opt)
    assert same(params(model), p)
    scaler.update()
    assert scaler.get_scale() == 512.0


class OldProtocolSGD(torch.optim.SGD):
    """PyTorch 1.13's protocol: _step_supports_amp_scaling and a grad_scaler argument; its
    step unscales through the scaler it is given, as PyTorch 1.13's fused Adam did."""

    _step_supports_amp_scaling = True

    def step(self, closure=None, *, grad_scaler=None):
        assert isinstance(grad_scaler, torch.amp.GradScaler)
        assert not hasattr(self, "grad_scale") and not hasattr(self, "found_inf")
        if grad_scaler._per_optimizer_states[id(self)]["stage"] is OptState.READY:
            grad_scaler.unscale_(self)
        if sum(v.item() for v in grad_scaler._found_inf_per_device(self).values()):
            return "skipped"
        return super().step(closure)


@pytest.mark.parametrize("impl", [torch.amp.GradScaler, lucid_amp.GradScaler])
def test_an_optimizer_of_the_older_protocol_is_passed_the_scaler_with_pytorchs_warning(impl):
    model, control = make_model(), make_model()
    scaler = impl("cpu", init_scale=1024.0)
    opt = OldProtocolSGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaled = grads(model)
    with pytest.warns(FutureWarning, match="stop passing itself"):
        scaler.step(opt)
    assert same(grads(model), [g / 1024 for g in scaled])
    expect = [p.detach() - 0.1 * (g / 1024) for p, g in zip(control.parameters(), scaled)]
    assert same(params(model), expect)
    scaler.update()
    opt.zero_grad()
    backward(scaler, model)
    model[0].bias.grad[0] = math.inf
    p = params(model)
    with pytest.warns(FutureWarning):
        assert scaler.step(opt) == "skipped"
    assert same(params(model), p)
    scaler.update()
    assert scaler.get_scale() == 512.0


class CheckingOldProtocolSGD(torch.optim.SGD):
    """The older protocol through _get_scale_async and _check_inf_per_device: checks
    without unscaling and divides by the scale itself."""

    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None, *, grad_scaler=None):
        found = grad_scaler._check_inf_per_device(self)
        if sum(v.item() for v in found.values()):
            return "skipped"
        scale = grad_scaler._get_scale_async()
        for group in self.param_groups:
            for p in group["params"]:
                p.grad.div_(scale)
        return super().step(closure)


@pytest.mark.parametrize("impl", [torch.amp.GradScaler, lucid_amp.GradScaler])
def test_an_optimizer_of_the_older_protocol_may_check_and_unscale_itself(impl):
    model, control = make_model(), make_model()
    scaler = impl("cpu", init_scale=1024.0)
    opt = CheckingOldProtocolSGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    scaled = grads(model)
    with pytest.warns(FutureWarning):
        scaler.step(opt)
    expect = [p.detach() - 0.1 * (g / 1024) for p, g in zip(control.parameters(), scaled)]
    assert same(params(model), expect)
    scaler.update()
    assert scaler.get_scale() == 1024.0
    opt.zero_grad()
    backward(scaler, model)
    model[0].bias.grad[0] = math.nan
    p = params(model)
    with pytest.warns(FutureWarning):
        assert scaler.step(opt) == "skipped"
    assert same(params(model), p)
    scaler.update()
    assert scaler.get_scale() == 512.0


def _has_cpu_fused_adam():
    try:
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.zeros(1)
        torch.optim.Adam([p], fused=True).step()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _has_cpu_fused_adam(), reason="this PyTorch has no fused Adam on the CPU")
def test_pytorchs_fused_adam_through_its_own_protocol_matches_for_loop_adam():
    ref_model, fused_model = make_model(), make_model()
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-2, foreach=False)
    fused_opt = torch.optim.Adam(fused_model.parameters(), lr=1e-2, fused=True)
    s_ref = lucid_amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    s_fused = lucid_amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    for it in range(6):
        for m, o, s in ((ref_model, ref_opt, s_ref), (fused_model, fused_opt, s_fused)):
            o.zero_grad()
            backward(s, m, batch=it)
            if it == 3:
                next(m.parameters()).grad.view(-1)[0] = math.inf
            s.step(o)
            s.update()
        assert s_ref.get_scale() == s_fused.get_scale()
        assert s_fused.step_skipped(fused_opt) == (it == 3)
        for a, b in zip(ref_model.parameters(), fused_model.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


# ---- lucid-amp's extras -------------------------------------------------------------------


def test_counters_step_skipped_and_the_overflow_report_name_the_parameter():
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10)
    model = make_model()
    scaler.set_parameter_names(model.named_parameters(), prefix="net.")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert scaler.last_overflow() is None
    backward(scaler, model)
    scaler.step(opt)
    scaler.update()
    assert not scaler.step_skipped(opt)
    opt.zero_grad()
    backward(scaler, model)
    model[1].bias.grad[0] = math.nan
    model[1].weight.grad[0, 1] = math.inf
    model[1].weight.grad[0, 2] = -math.inf
    scaler.step(opt)
    assert scaler.step_skipped(opt)
    report = scaler.last_overflow()
    assert report.scale == 1024.0 and report.optimizers == 1
    by_name = {g.name: g for g in report.gradients}
    assert set(by_name) == {"net.1.weight", "net.1.bias"}
    assert by_name["net.1.weight"].inf_count == 2 and by_name["net.1.weight"].nan_count == 0
    assert by_name["net.1.bias"].nan_count == 1
    assert by_name["net.1.weight"].sizes == (1, 3)
    assert by_name["net.1.weight"].dtype == torch.float32
    assert by_name["net.1.weight"].device == torch.device("cpu")
    assert "net.1.bias" in str(report)
    scaler.update()
    assert scaler.step_skipped(opt)  # survives update()
    c = scaler.counters()
    assert (c.steps_taken, c.steps_skipped, c.updates, c.overflow_updates, c.backoffs,
            c.overflow_streak) == (1, 1, 2, 1, 1, 1)


def test_backoff_callback_and_hysteresis():
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10, hysteresis=2)
    events = []
    scaler.set_backoff_callback(events.append)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        backward(scaler, model)
        model[0].bias.grad[0] = math.inf
        scaler.step(opt)
        scaler.update()
    # hysteresis 2: the first overflow keeps the scale, the second backs off and so does
    # every further one of the same streak (Megatron-LM's and DeepSpeed's rule)
    assert [(e.old_scale, e.new_scale) for e in events] == [(1024.0, 512.0), (512.0, 256.0)]
    assert [e.overflow_streak for e in events] == [2, 3]
    assert events[0].report is not None and events[0].report.gradients[0].param_group == 0
    assert scaler.get_scale() == 256.0
    scaler.set_backoff_callback(None)


def test_min_scale_guard_raises_and_changes_nothing():
    scaler = lucid_amp.GradScaler("cpu", init_scale=4.0, min_scale=4.0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    model[0].bias.grad[0] = math.inf
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="diverging"):
        scaler.update()
    assert scaler.get_scale() == 4.0
    assert scaler.stage(opt) == "stepped"


def test_max_scale_caps_growth():
    scaler = lucid_amp.GradScaler("cpu", init_scale=4.0, growth_interval=1, max_scale=8.0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in range(3):
        opt.zero_grad()
        backward(scaler, model)
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 8.0


def _overflowing_iteration(scaler, model, opt):
    opt.zero_grad()
    backward(scaler, model)
    model[0].bias.grad[0] = math.inf
    scaler.step(opt)
    scaler.update()


def test_min_scale_policy_clamp_holds_the_scale_and_counts():
    scaler = lucid_amp.GradScaler("cpu", init_scale=8.0, min_scale=4.0, min_scale_policy="clamp")
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _overflowing_iteration(scaler, model, opt)
    assert scaler.get_scale() == 4.0
    assert scaler.counters().min_scale_holds == 2
    with pytest.raises(ValueError, match="min_scale_policy"):
        lucid_amp.GradScaler("cpu", min_scale_policy="sometimes")


def test_max_overflow_streak_raises_runtime_error_and_applies_nothing():
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10, max_overflow_streak=3)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _overflowing_iteration(scaler, model, opt)
    _overflowing_iteration(scaler, model, opt)
    with pytest.raises(RuntimeError):
        _overflowing_iteration(scaler, model, opt)
    assert scaler.get_scale() == 256.0


def test_overflow_warning_streak_reaches_python_as_a_warning():
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10, overflow_warning_streak=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            _overflowing_iteration(scaler, model, opt)
    streak = [w for w in caught if "consecutive" in str(w.message)]
    assert len(streak) == 1  # once per streak


def test_strict_inf_checks_raises_pytorchs_errors():
    lenient = lucid_amp.GradScaler("cpu")
    strict = lucid_amp.GradScaler("cpu", strict_inf_checks=True)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in (lenient, strict):
        s.scale(torch.ones(1))
    lenient.update()  # nothing checked: counted, scale left as it is
    assert lenient.counters().updates_without_checks == 1
    with pytest.raises(RuntimeError, match="No inf checks were recorded prior to update"):
        strict.update()
    with pytest.raises(RuntimeError, match="No inf checks were recorded for this optimizer"):
        strict.step(opt)  # no parameter has a gradient


def test_hysteresis_refill_on_clean_update():
    def run(refill):
        scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**10, hysteresis=2, growth_interval=100,
                                      hysteresis_refill=refill)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for bad in (True, False, True):  # two overflows separated by a clean update
            if bad:
                _overflowing_iteration(scaler, model, opt)
            else:
                opt.zero_grad()
                backward(scaler, model)
                scaler.step(opt)
                scaler.update()
        return scaler.get_scale()

    assert run("on_growth") == 512.0  # the count was used up across the clean update
    assert run("on_clean_update") == 1024.0  # refilled by it


@pytest.mark.parametrize("value", [2.5, "3", None, 4.0])
def test_a_count_that_is_not_an_int_is_refused_at_construction(value):
    """PyTorch truncates nothing either: its update fails on growth_interval=2.5."""
    for name in ("growth_interval", "hysteresis", "overflow_warning_streak", "max_overflow_streak"):
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            lucid_amp.GradScaler("cpu", **{name: value})
    scaler = lucid_amp.GradScaler("cpu", growth_interval=7)
    with pytest.raises(TypeError, match="must be an int"):
        scaler.set_growth_interval(value)
    assert scaler.get_growth_interval() == 7


def test_the_core_takes_every_option_by_keyword_and_lists_each_back():
    """The binding walks the core's option table: options() names every option, a core
    built from that dict has the same options, and a keyword that names no option, or a
    value of another type, is a TypeError."""
    scaler = lucid_amp.GradScaler(
        "cpu", init_scale=8.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=5,
        min_scale=1.0, min_scale_policy="clamp", max_scale=1024.0, hysteresis=2,
        hysteresis_refill="on_clean_update", overflow_warning_streak=7, max_overflow_streak=9,
        strict_inf_checks=True)
    options = scaler._core.options()
    assert options["hysteresis_refill"] == "on_clean_update" and options["growth_interval"] == 5
    assert lucid_amp._C._GradScaler(**options).options() == options
    assert set(inspect.signature(lucid_amp.GradScaler).parameters) - {"device"} <= set(options)
    with pytest.raises(TypeError, match="unexpected keyword argument 'growth'"):
        lucid_amp._C._GradScaler(growth=2.0)
    for key, bad in [("init_scale", "8"), ("growth_interval", 2.0), ("enabled", 1),
                     ("min_scale_policy", 0)]:
        with pytest.raises(TypeError, match=f"GradScaler: {key} must be"):
            lucid_amp._C._GradScaler(**{key: bad})
    with pytest.raises(ValueError, match="min_scale_policy must be 'throw' or 'clamp'"):
        lucid_amp._C._GradScaler(min_scale_policy="hold")


@pytest.mark.parametrize("bad,match", [
    ([1, 2], "must be a dict of names to numbers.*got list"),
    ("scale", "must be a dict.*got str"),
    ({"scale": "1024"}, r"state_dict\['scale'\] must be a number.*got str"),
    ({"scale": 1024.0, "growth_interval": None}, r"state_dict\['growth_interval'\].*got NoneType"),
    ({"scale": torch.ones(2)}, r"state_dict\['scale'\].*got Tensor"),
])
def test_a_state_dict_of_the_wrong_type_is_a_type_error_and_loads_nothing(scaler, bad, match):
    before = scaler.state_dict()
    with pytest.raises(TypeError, match=match):
        scaler.load_state_dict(bad)
    assert scaler.state_dict() == before


# ---- messages ------------------------------------------------------------------------------


def _errors_of_every_front():
    """One error from each way a Python call reaches the C++ core: options, state, the
    stage machine, the fused optimizers' checks, clipping, the gradients' dtype."""
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.ones(4)
    sgd = torch.optim.SGD([p], lr=0.1)
    fused = lucid_amp.optim.FusedAdamW([torch.nn.Parameter(torch.zeros(4))])
    fused.param_groups[0]["params"][0].grad = torch.ones(4)
    fused.step()
    half = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    half.grad = torch.ones(2, dtype=torch.float16)
    calls = {
        "option": lambda: lucid_amp.GradScaler("cpu", growth_factor=0.5),
        "state": lambda: lucid_amp.GradScaler("cpu").load_state_dict(
            {"scale": -1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2,
             "_growth_tracker": 0}),
        "before scale": lambda: lucid_amp.GradScaler("cpu").unscale_(sgd),
        "float16 gradient": lambda: _scaled(lucid_amp.GradScaler("cpu")).unscale_(
            torch.optim.SGD([half], lr=0.1)),
        "clip argument": lambda: lucid_amp.clip_grad_norm_([p], -1.0),
        "fused state": lambda: (fused.state[fused.param_groups[0]["params"][0]]["exp_avg"].set_(
            torch.zeros(2)), fused.step()),
    }
    for name, call in calls.items():
        with pytest.raises(Exception) as raised:
            call()
        yield name, raised.value


def _scaled(scaler):
    scaler.scale(torch.ones(()))
    return scaler


def test_python_facing_messages_carry_no_cpp_frames_or_names():
    for name, err in _errors_of_every_front():
        text = str(err)
        for cpp in ("Exception raised from", "frame #", "c10::", "GradScalerOptions", "at::", "std::"):
            assert cpp not in text, f"{name}: {cpp!r} in {text!r}"
        assert text.strip(), name


# ---- a torch.amp.GradScaler to libraries ------------------------------------------------------


def test_it_is_a_torch_amp_grad_scaler_and_overrides_every_public_method():
    scaler = lucid_amp.GradScaler("cpu")
    assert isinstance(scaler, torch.amp.GradScaler)
    assert isinstance(lucid_amp.ShardedGradScaler("cpu", process_group=None), torch.amp.GradScaler)
    public = [n for n in vars(torch.amp.GradScaler) if not n.startswith("_") and callable(
        getattr(torch.amp.GradScaler, n))]
    assert public and all(n in vars(lucid_amp.GradScaler) for n in public), public


def _same_run(kind):
    """One iteration (clean) and one with an inf, stopping before the last update()."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = kind("cpu", init_scale=2.0**10, growth_interval=3)
    views = [dict(scale=scaler._scale, tracker=scaler._growth_tracker, states=dict(scaler._per_optimizer_states))]
    for it in range(2):
        opt.zero_grad()
        backward(scaler, model, batch=it)
        if it == 1:
            model[0].bias.grad[0] = math.inf
        scaler.unscale_(opt)
        state = scaler._per_optimizer_states[id(opt)]
        views.append(dict(stage=state["stage"], found=[v.item() for v in state["found_inf_per_device"].values()],
                          async_scale=scaler._get_scale_async().item()))
        scaler.step(opt)
        views.append(dict(stage=scaler._per_optimizer_states[id(opt)]["stage"],
                          found=[v.item() for v in scaler._found_inf_per_device(opt).values()]))
        scaler.update()
        views.append(dict(scale=scaler._scale.item(), tracker=int(scaler._growth_tracker),
                          gt=scaler._get_growth_tracker(), n=len(scaler._per_optimizer_states)))
    views.append(dict(enabled=scaler._enabled, init=scaler._init_scale, gf=scaler._growth_factor,
                      bf=scaler._backoff_factor, gi=scaler._growth_interval, device=scaler._device))
    return views


def test_private_attribute_views_read_as_pytorchs_on_the_same_run():
    assert _same_run(lucid_amp.GradScaler) == _same_run(torch.amp.GradScaler)


def test_private_attribute_views_are_read_only():
    scaler = lucid_amp.GradScaler("cpu")
    with pytest.raises(AttributeError):
        scaler._scale = torch.tensor(1.0)
    with pytest.raises(AttributeError):
        scaler._enabled = False


def test_check_inf_per_device_outside_a_step_reports_without_recording():
    scaler = lucid_amp.GradScaler("cpu", init_scale=4.0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    model[0].bias.grad[0] = math.nan
    found = scaler._check_inf_per_device(opt)
    assert [v.item() for v in found.values()] == [1.0]
    assert scaler.stage(opt) == "ready"


@pytest.mark.parametrize("name", ["_unscale_grads_", "_maybe_opt_step", "_lazy_init_scale_growth_tracker",
                                  "_check_scale_growth_tracker", "_get_growth_tracker"])
def test_a_subclass_overriding_pytorchs_unused_extension_points_is_refused(name):
    with pytest.raises(TypeError, match=f"overrides {name}.*never calls"):
        type("Mine", (lucid_amp.GradScaler,), {name: lambda self, *a, **k: None})
    # Public methods may be overridden, and PyTorch's own class takes any override.
    type("Mine", (lucid_amp.GradScaler,), {"step": lambda self, *a, **k: None})
    type("Theirs", (torch.amp.GradScaler,), {name: lambda self, *a, **k: None})


def test_pytorchs_unused_private_methods_raise_clearly():
    scaler = lucid_amp.GradScaler("cpu")
    for name in ("_unscale_grads_", "_maybe_opt_step", "_lazy_init_scale_growth_tracker"):
        with pytest.raises(NotImplementedError, match="lucid-amp"):
            getattr(scaler, name)(None)
    with pytest.raises(AssertionError, match="_scale is None"):
        scaler._check_scale_growth_tracker("step")


@pytest.mark.parametrize("impl", [torch.amp.GradScaler, lucid_amp.GradScaler])
def test_a_preset_grad_scale_multiplies_the_scale_and_is_removed_after_the_step(impl):
    seen = []

    class Spy(ProtocolSGD):
        def step(self, closure=None):
            seen.append(self.grad_scale.item())
            return super().step(closure)

    model = make_model()
    opt = Spy(model.parameters(), lr=0.1)
    scaler = impl("cpu", init_scale=1024.0)
    backward(scaler, model)
    opt.grad_scale = torch.tensor(3.0)
    scaler.step(opt)
    assert seen == [3072.0]
    assert "grad_scale" not in vars(opt) and "found_inf" not in vars(opt)


def test_after_unscale_a_preset_grad_scale_is_handed_alone():
    seen = []

    class Spy(ProtocolSGD):
        def step(self, closure=None):
            seen.append(self.grad_scale.item())

    for impl in (torch.amp.GradScaler, lucid_amp.GradScaler):
        model = make_model()
        opt = Spy(model.parameters(), lr=0.1)
        scaler = impl("cpu", init_scale=1024.0)
        backward(scaler, model)
        scaler.unscale_(opt)
        opt.grad_scale = torch.tensor(3.0)
        scaler.step(opt)
    assert seen == [3.0, 3.0]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "cuda", "cuda:1", torch.device("cuda", 0)])
def test_device_strings_and_torch_devices_are_taken(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = lucid_amp.GradScaler(device)
    assert scaler._device == torch.device(device).type
    if scaler._device == "cpu":
        assert scaler.is_enabled()


@pytest.mark.parametrize("device", ["xpu", "mps", "meta", "not-a-device", 65536.0])
def test_devices_without_kernels_are_refused_at_construction(device):
    with pytest.raises(ValueError, match="'cuda'.*'cpu'"):
        lucid_amp.GradScaler(device)


def test_torch_cuda_amp_style_construction_by_keyword():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = lucid_amp.GradScaler(init_scale=8.0, growth_interval=3)
    assert scaler._device == "cuda"
    with pytest.raises(ValueError, match="init_scale"):
        lucid_amp.GradScaler(8.0)


@pytest.mark.parametrize("call", ["unscale_", "clip_grad_norm_"])
def test_unscale_and_clipping_put_the_optimizer_in_the_iteration_as_step_does(scaler, call):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    backward(scaler, model)
    if call == "unscale_":
        scaler.unscale_(opt)
    else:
        scaler.clip_grad_norm_(opt, 1.0)
    states = scaler._per_optimizer_states
    assert list(states) == [id(opt)] and id(opt) in states and states.get(id(opt)) is not None
    assert 1 not in states and states.get(1) is None and states[1]["stage"] is OptState.READY
    with pytest.raises(RuntimeError, match="may only be pickled"):
        pickle.dumps(scaler)
    scaler.step(opt)
    scaler.update()
    pickle.dumps(scaler)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("which", ["lucid_amp", "torch"])
@pytest.mark.parametrize("optimizer", ["lucid_amp FusedAdamW", "torch fused AdamW"])
def test_step_and_update_with_a_device_skipping_optimizer_wait_for_nothing_queued(which, optimizer):
    """With kernels queued ahead of the gradients' check, scaler.step(opt) and
    scaler.update() return while the GPU is still busy, for an optimizer that skips on
    the device, as PyTorch's scaler does; the outcome is right when asked for after."""
    import lucid_amp.optim

    params = [torch.nn.Parameter(torch.zeros(1000, device="cuda"))]
    opt = (lucid_amp.optim.FusedAdamW(params, lr=1e-3) if optimizer.startswith("lucid")
           else torch.optim.AdamW(params, lr=1e-3, fused=True))
    scaler = (lucid_amp.GradScaler("cuda", init_scale=4.0) if which == "lucid_amp"
              else torch.amp.GradScaler("cuda", init_scale=4.0))
    scaler.scale(torch.ones((), device="cuda"))
    params[0].grad = torch.ones(1000, device="cuda")
    scaler.step(opt)  # the first step makes the optimizer's state
    scaler.update()
    busy = 500_000_000  # cycles of one GPU thread: far longer than what the calls queue
    for bad in (False, True):
        params[0].grad = torch.full((1000,), math.inf if bad else 1.0, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(busy)
        scaler.step(opt)
        scaler.update()
        assert not torch.cuda.current_stream().query(), "step() or update() waited for the GPU"
        torch.cuda.synchronize()
        assert scaler.get_scale() == (2.0 if bad else 4.0)
        if which == "lucid_amp":
            assert scaler.step_skipped(opt) == bad
    if which == "lucid_amp":
        counters = scaler.counters()
        assert (counters.steps_taken, counters.steps_skipped, counters.backoffs) == (2, 1, 1)


_CAPTURE_AND_REPLAY = """
import math, torch, lucid_amp, lucid_amp.optim

def make(optimizer, which, params):
    opt = (lucid_amp.optim.FusedAdamW(params, lr=1e-2) if optimizer == "lucid_amp"
           else torch.optim.AdamW(params, lr=1e-2, fused=True, capturable=True))
    scaler = (lucid_amp.GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
              if which == "lucid_amp" else
              torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=1000))
    return opt, scaler

torch.manual_seed(0)
start = torch.randn(64, 64, device="cuda")
weight = torch.nn.Parameter(start.clone())
twin = torch.nn.Parameter(start.clone())
opt, scaler = make(OPTIMIZER, WHICH, [weight])
twin_opt, twin_scaler = make(OPTIMIZER, WHICH, [twin])
x = torch.randn(8, 64, device="cuda")
clean = x.clone()

def train_step(w, o, s):
    o.zero_grad(set_to_none=False)
    s.scale((x @ w).pow(2).mean()).backward()
    s.step(o)
    s.update()

side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        train_step(weight, opt, scaler)
        train_step(twin, twin_opt, twin_scaler)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    train_step(weight, opt, scaler)
for bad in (False, True, False):
    x.copy_(clean)
    if bad:
        x[0, 0] = math.inf
    before = weight.detach().clone()
    graph.replay()
    train_step(twin, twin_opt, twin_scaler)
    torch.cuda.synchronize()
    assert torch.equal(weight.detach(), before) == bad, "a replay skips exactly on overflow"
    torch.testing.assert_close(weight.detach(), twin.detach())
    assert scaler.get_scale() == twin_scaler.get_scale()
    if WHICH == "lucid_amp":
        assert scaler.step_skipped(opt) == bad
assert scaler.get_scale() == 512.0
if WHICH == "lucid_amp":
    c = scaler.counters()
    assert (c.steps_taken, c.steps_skipped, c.updates, c.backoffs) == (5, 1, 6, 1), c
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("which", ["lucid_amp", "torch"])
@pytest.mark.parametrize("optimizer", ["lucid_amp", "torch"])
def test_a_default_mode_step_and_update_captured_in_a_cuda_graph_replay_like_eager(which,
                                                                                   optimizer):
    """A whole training step with an optimizer that skips on the device, captured once in
    a CUDA graph with the scaler's defaults, replays like the same step run eagerly: an
    overflowing replay skips and backs off, and the counters count the replays. In a child
    process: a capture that fails leaves the CUDA context unusable."""
    import os
    import subprocess
    import sys
    code = f"WHICH = {which!r}\nOPTIMIZER = {optimizer!r}\n" + _CAPTURE_AND_REPLAY
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
