# SPDX-License-Identifier: BSD-3-Clause
"""Hugging Face accelerate: lucid_amp.GradScaler in an Accelerator's training loop trains as
the torch.amp.GradScaler accelerate builds itself, an injected overflow included, and
save_state/load_state carry its state.

accelerate takes no scaler object: with ``mixed_precision="fp16"`` on a GPU, Accelerator
builds ``torch.amp.GradScaler`` itself (options only through ``GradScalerKwargs``) and
keeps it as ``accelerator.scaler``, which backward(), unscale_gradients(),
clip_grad_norm_(), the prepared optimizer's step() (scaler.step and scaler.update; its
``step_was_skipped`` from whether optimizer.step ran) and save_state()/load_state() use
through the public API alone. Assigning ``accelerator.scaler`` before ``prepare()``
puts lucid_amp's in its place; prepare() hands it to the optimizer it wraps.

On the CPU accelerate 1.16.0 keeps fp16 off: no scaler, no autocast, and
unscale_gradients() does nothing (``native_amp`` is False). The first test turns its fp16
paths on there as accelerate does on a GPU (``native_amp = True``), so the CPU runs the
code a GPU runs; the second drives lucid_amp beside an Accelerator with mixed precision
off, the loop that works alike on any device.
"""

import math

import pytest
import torch

import lucid_amp

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from accelerate.utils import GradScalerKwargs  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
]

STEPS = 6
OVERFLOW_AT = 2
SCALER_OPTIONS = dict(init_scale=2.0**10, growth_interval=2)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    # accelerate keeps one process-wide state, set by the first Accelerator; each run here
    # makes its own.
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# Every run starts from these weights and sees this data, in this order.
INITIAL = _model().state_dict()
DATA = torch.utils.data.TensorDataset(torch.randn(STEPS * 8, 8), torch.randn(STEPS * 8, 4))


def _parts():
    model = _model()
    model.load_state_dict(INITIAL)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer, torch.utils.data.DataLoader(DATA, batch_size=8)


def _fp16_accelerator(device, lucid):
    """An fp16 Accelerator whose scaler is lucid_amp's (``lucid``) or PyTorch's, with
    SCALER_OPTIONS."""
    accelerator = accelerate.Accelerator(
        cpu=device == "cpu",
        mixed_precision="fp16",
        kwargs_handlers=[GradScalerKwargs(**SCALER_OPTIONS)],
    )
    if device == "cpu":
        assert accelerator.scaler is None and not accelerator.native_amp
        accelerator.native_amp = True
        if not lucid:
            accelerator.scaler = torch.amp.GradScaler("cpu", **SCALER_OPTIONS)
    else:
        assert isinstance(accelerator.scaler, torch.amp.GradScaler)
    if lucid:
        accelerator.scaler = lucid_amp.GradScaler(device, **SCALER_OPTIONS)
    return accelerator


def _poison(model):
    with torch.no_grad():
        next(model.parameters()).grad[0, 0] = math.inf


def _fit_fp16(device, lucid):
    accelerator = _fp16_accelerator(device, lucid)
    model, optimizer, data = accelerator.prepare(*_parts())
    assert optimizer.scaler is accelerator.scaler
    trace = []
    for i, (x, y) in enumerate(data):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        if i == OVERFLOW_AT:
            _poison(model)
        accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        skipped = optimizer.step_was_skipped
        assert accelerator.optimizer_step_was_skipped == skipped
        if lucid:
            # The prepared optimizer steps the one it wraps through the scaler.
            assert accelerator.scaler.step_skipped(optimizer.optimizer) == skipped
        trace.append((loss.item(), accelerator.scaler.get_scale(), skipped))
    return accelerator, model, optimizer, trace


@pytest.mark.parametrize("device", DEVICES)
def test_scaler_assigned_to_the_accelerator_trains_as_its_own(device):
    _, ref_model, _, ref_trace = _fit_fp16(device, lucid=False)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator, model, _, trace = _fit_fp16(device, lucid=True)

    assert trace == ref_trace
    assert [skipped for _, _, skipped in trace] == [i == OVERFLOW_AT for i in range(STEPS)]
    assert trace[OVERFLOW_AT][1] == trace[OVERFLOW_AT - 1][1] * 0.5
    counts = accelerator.scaler.counters()
    assert (counts.steps_taken, counts.steps_skipped, counts.backoffs) == (STEPS - 1, 1, 1)
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_save_state_and_load_state_keep_the_scalers_state(device, tmp_path):
    accelerator, _, _, _ = _fit_fp16(device, lucid=True)
    saved = accelerator.scaler.state_dict()
    assert saved["scale"] != SCALER_OPTIONS["init_scale"] and saved["_growth_tracker"] != 0
    accelerator.save_state(str(tmp_path))

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    resumed = _fp16_accelerator(device, lucid=True)
    resumed.prepare(*_parts())
    resumed.load_state(str(tmp_path))
    assert resumed.scaler.state_dict() == saved


@pytest.mark.parametrize("device", DEVICES)
def test_lucid_amp_driven_beside_an_accelerator_without_mixed_precision(device):
    def fit(scaler):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        accelerator = accelerate.Accelerator(cpu=device == "cpu", mixed_precision="no")
        model, optimizer, data = accelerator.prepare(*_parts())
        dtype = torch.float16 if device == "cuda" else torch.bfloat16
        trace = []
        for i, (x, y) in enumerate(data):
            optimizer.zero_grad()
            with torch.autocast(device, dtype=dtype):
                out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            accelerator.backward(scaler.scale(loss))
            if i == OVERFLOW_AT:
                _poison(model)
            scaler.unscale_(optimizer)
            accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()
            trace.append((loss.item(), scaler.get_scale()))
        return model, trace

    ref_model, ref_trace = fit(torch.amp.GradScaler(device, **SCALER_OPTIONS))
    scaler = lucid_amp.GradScaler(device, **SCALER_OPTIONS)
    model, trace = fit(scaler)

    assert trace == ref_trace
    assert trace[OVERFLOW_AT][1] == trace[OVERFLOW_AT - 1][1] * 0.5
    counts = scaler.counters()
    assert (counts.steps_taken, counts.steps_skipped, counts.backoffs) == (STEPS - 1, 1, 1)
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
