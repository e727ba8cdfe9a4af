# SPDX-License-Identifier: BSD-3-Clause
"""torch.compile: a training step compiled with torch.compile that calls the scaler inside
the compiled region (scale(loss).backward(), unscale_, step, update) breaks Dynamo's graph
no more often with lucid_amp.GradScaler than with torch.amp.GradScaler, and trains alike:
the same losses, parameters, scales and skipped step, an injected overflow included; on
the CPU here and on CUDA where there is a GPU.

Graph breaks are Dynamo's, counted before any backend runs, so the backend does not change
them: "aot_eager" (AOTAutograd's graphs, run by PyTorch's eager kernels) keeps the test
short; inductor, which generates and compiles C++ on the CPU, is in the slow tier.
"""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import lucid_amp
import lucid_amp.optim
from fused_support import skip_unless_fused_runs_on
from test_sharded_grad_scaler import world_of_one  # noqa: F401 (a fixture)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
]

BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
# Dynamo compiles the optimizer's step under torch's scaler (it skips only the scaler's own
# frames), while lucid_amp's step runs the optimizer eagerly. Inductor generates its own
# code for that update; AOTAutograd runs PyTorch's kernels, but on the step's decomposition
# (torch 2.11's CPU rounds it otherwise than the foreach kernel: 3e-8 after five SGD
# steps). Either may move the last float32 bits of the parameters, and of later losses.
TOLERANCE = {"aot_eager": dict(rtol=1e-6, atol=1e-7), "inductor": dict(rtol=1e-5, atol=1e-6)}

# The optimizer is the same on both sides; "adam-fused" is PyTorch's fused Adam (the
# scale and the overflow flag handed over through its protocol), "lucid-fused-adamw"
# lucid_amp.optim's, whose step is itself one opaque call under torch.compile.
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam-fused": lambda params: torch.optim.Adam(params, lr=1e-2, fused=True),
    "lucid-fused-adamw": lambda params: lucid_amp.optim.FusedAdamW(params, lr=1e-2, weight_decay=0.1),
}

STEPS = 5
OVERFLOW_AT = 2


def _autocast_dtype(device):
    # float16 is what needs a scaler on CUDA; the CPU's autocast computes in bfloat16.
    return torch.float16 if device == "cuda" else torch.bfloat16


def _model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# Both runs of a comparison start from these weights and see this data.
INITIAL = _model().state_dict()
DATA = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(STEPS)]


def _train(scaler_cls, device, opt_name, backend):
    """STEPS compiled training steps, the gradients poisoned with inf at OVERFLOW_AT;
    returns the losses, per step (scale after update, whether the parameters stayed as
    they were), the final parameters and the count of Dynamo's graph breaks."""
    model = _model()
    model.load_state_dict(INITIAL)
    model.to(device)
    optimizer = OPTIMIZERS[opt_name](model.parameters())
    scaler = scaler_cls(device, init_scale=2.0**10, growth_interval=2)
    dtype = _autocast_dtype(device)

    def train_step(x, y, poison):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        # poison is 1 or inf: a tensor, so that one compiled graph serves both.
        scaler.scale(loss * poison).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    compiled = torch.compile(train_step, backend=backend)
    torch._dynamo.reset()
    counters.clear()
    losses, trace = [], []
    for i, (x, y) in enumerate(DATA):
        x, y = x.to(device), y.to(device)
        poison = torch.tensor(float("inf") if i == OVERFLOW_AT else 1.0, device=device)
        before = [p.detach().clone() for p in model.parameters()]
        losses.append(compiled(x, y, poison))
        unchanged = all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
        trace.append((scaler.get_scale(), unchanged))
    breaks = sum(counters["graph_break"].values())
    if isinstance(scaler, lucid_amp.GradScaler):
        counts = scaler.counters()
        assert (counts.steps_taken, counts.steps_skipped, counts.backoffs) == (STEPS - 1, 1, 1)
    return torch.stack(losses), trace, [p.detach() for p in model.parameters()], breaks


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_step_breaks_no_more_and_trains_alike(device, opt_name, backend):
    if opt_name == "adam-fused":
        skip_unless_fused_runs_on(torch.optim.Adam, device)
    ref_losses, ref_trace, ref_params, ref_breaks = _train(torch.amp.GradScaler, device, opt_name, backend)
    losses, trace, params, breaks = _train(lucid_amp.GradScaler, device, opt_name, backend)

    assert breaks <= ref_breaks, f"lucid_amp: {breaks} graph breaks, torch.amp.GradScaler: {ref_breaks}"
    # The scales and skip decisions are equal exactly: the two scalers decide alike bit for
    # bit (test_parity.py) on the same gradients.
    assert trace == ref_trace
    torch.testing.assert_close(losses, ref_losses, **TOLERANCE[backend])
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, **TOLERANCE[backend])
    # The injected overflow skipped exactly its step and backed the scale off.
    assert [unchanged for _, unchanged in trace] == [i == OVERFLOW_AT for i in range(STEPS)]
    assert trace[OVERFLOW_AT][0] == trace[OVERFLOW_AT - 1][0] * 0.5
    assert torch.isfinite(losses).all()


@pytest.mark.usefixtures("world_of_one")
def test_sharded_scaler_compiled_step_breaks_no_more_and_trains_alike():
    """FSDP1's scaler, whose overflow flag is all-reduced over a group (here a Gloo group
    of this process alone), against PyTorch's; its scale() is its own method."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    ref_losses, ref_trace, ref_params, ref_breaks = _train(ShardedGradScaler, "cpu", "sgd", "aot_eager")
    losses, trace, params, breaks = _train(lucid_amp.ShardedGradScaler, "cpu", "sgd", "aot_eager")

    assert breaks <= ref_breaks, f"lucid_amp: {breaks} graph breaks, PyTorch's: {ref_breaks}"
    assert trace == ref_trace
    assert [unchanged for _, unchanged in trace] == [i == OVERFLOW_AT for i in range(STEPS)]
    torch.testing.assert_close(losses, ref_losses, **TOLERANCE["aot_eager"])
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, **TOLERANCE["aot_eager"])


def test_every_public_method_is_one_opaque_call():
    """Each public method of the scalers and the fused optimizers' step are wrapped with
    torch.compiler.disable (one graph break each, instead of one at every call into the
    extension); the wrap keeps the name, signature and docstring."""
    import inspect

    classes = [lucid_amp.GradScaler, lucid_amp.ShardedGradScaler, lucid_amp.optim.FusedAdam,
               lucid_amp.optim.FusedSGD]
    for cls in classes:
        own = [name for name, member in vars(cls).items()
               if not name.startswith("_") and inspect.isfunction(member)]
        assert own, cls
        for name in own:
            member = vars(cls)[name]
            # PyTorch's optimizers wrap step once more (their step hooks), outside.
            inner = member
            while not getattr(inner, "_torchdynamo_disable", False) and hasattr(inner, "__wrapped__"):
                inner = inner.__wrapped__
            assert getattr(inner, "_torchdynamo_disable", False), f"{cls.__name__}.{name}"
            assert getattr(inner, "_torchdynamo_disable_recursive", True), f"{cls.__name__}.{name}"
            assert inner.__name__ == name and inner.__doc__
    assert str(inspect.signature(lucid_amp.GradScaler.step)).startswith("(self, optimizer")
