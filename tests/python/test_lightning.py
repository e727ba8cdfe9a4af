# SPDX-License-Identifier: BSD-3-Clause
"""Lightning: lucid_amp.GradScaler as the scaler of Lightning's MixedPrecision plugin
(``plugins=[MixedPrecision("16-mixed", device, scaler=lucid_amp.GradScaler(device))]``)
trains a Trainer as torch.amp.GradScaler does in the same setup: an overflow injected
into a gradient skips that step and backs the scale off, step for step alike, and a
checkpoint saved by the Trainer and resumed with ``fit(ckpt_path=...)`` carries the
scaler's state (scale, growth tracker), so the resumed run ends where an uninterrupted one
does. On the CPU here and on CUDA where there is a GPU.

The plugin form is the one that takes a scaler: ``precision="16-mixed"`` alone builds
torch's own, and on the CPU it is not even float16 (Lightning turns it into bf16-mixed,
which has no scaler).
"""

import math
import os
import warnings

import pytest
import torch

import lucid_amp

L = pytest.importorskip("lightning")
from lightning.pytorch.plugins.precision import MixedPrecision  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
]

BATCHES = 6  # per epoch
OVERFLOW_AT = 2  # the global step whose gradients get an inf
SCALER_OPTIONS = dict(init_scale=2.0**10, growth_interval=2)


def _net():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# Every run starts from these weights and sees this data, in this order.
INITIAL = _net().state_dict()
DATA = torch.utils.data.TensorDataset(torch.randn(BATCHES * 8, 8), torch.randn(BATCHES * 8, 4))


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = _net()
        self.net.load_state_dict(INITIAL)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).float(), y)

    def on_after_backward(self):
        # After backward, before the plugin's unscale_: the scaler finds the inf there.
        if self.global_step == OVERFLOW_AT:
            with torch.no_grad():
                self.net[0].weight.grad[0, 0] = math.inf

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=8)


class Trace(L.Callback):
    """Per optimizer step: (scale after update, whether the parameters stayed unchanged)."""

    def __init__(self):
        self.steps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._before = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        unchanged = all(torch.equal(b, p) for b, p in zip(self._before, pl_module.parameters()))
        scaler = trainer.precision_plugin.scaler
        entry = (scaler.get_scale(), unchanged)
        if isinstance(scaler, lucid_amp.GradScaler):
            # lucid-amp's own answer must agree with what the parameters show.
            assert scaler.step_skipped(trainer.optimizers[0]) == unchanged
        self.steps.append(entry)


def _fit(scaler, device, epochs, tmp_path, ckpt_path=None, model=None):
    model = model if model is not None else Tiny()
    trace = Trace()
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        max_epochs=epochs,
        plugins=[MixedPrecision("16-mixed", device, scaler=scaler)],
        callbacks=[trace],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    with warnings.catch_warnings():
        # Lightning's advice on DataLoader workers and on its own log intervals.
        warnings.simplefilter("ignore")
        trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model, trace.steps


def _params(model):
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_skips_the_overflowing_step_as_torch_does(device, tmp_path):
    _, ref_model, ref_steps = _fit(torch.amp.GradScaler(device, **SCALER_OPTIONS), device, 1, tmp_path)
    scaler = lucid_amp.GradScaler(device, **SCALER_OPTIONS)
    trainer, model, steps = _fit(scaler, device, 1, tmp_path)

    assert trainer.precision_plugin.scaler is scaler
    assert steps == ref_steps
    assert [unchanged for _, unchanged in steps] == [i == OVERFLOW_AT for i in range(BATCHES)]
    assert steps[OVERFLOW_AT][0] == steps[OVERFLOW_AT - 1][0] * 0.5
    counts = scaler.counters()
    assert (counts.steps_taken, counts.steps_skipped, counts.backoffs) == (BATCHES - 1, 1, 1)
    assert counts.growths >= 1
    for a, b in zip(_params(model), _params(ref_model)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_and_resume_keep_the_scalers_state(device, tmp_path):
    # One run of two epochs, against one epoch, a checkpoint, and a resumed second epoch.
    straight = lucid_amp.GradScaler(device, **SCALER_OPTIONS)
    _, straight_model, straight_steps = _fit(straight, device, 2, tmp_path)

    first = lucid_amp.GradScaler(device, **SCALER_OPTIONS)
    trainer, _, first_steps = _fit(first, device, 1, tmp_path)
    saved = first.state_dict()
    # Scale and growth tracker both away from a fresh scaler's, so that a lost state shows.
    assert saved["scale"] != SCALER_OPTIONS["init_scale"] and saved["_growth_tracker"] != 0
    path = os.path.join(str(tmp_path), "epoch1.ckpt")
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=False)["MixedPrecision"] == saved

    second = lucid_amp.GradScaler(device, **SCALER_OPTIONS)
    _, resumed_model, second_steps = _fit(second, device, 2, tmp_path, ckpt_path=path)

    # The resumed scaler went on from the saved scale and growth tracker: each later
    # scale, and the step its growth fell on, are the uninterrupted run's.
    assert first_steps + second_steps == straight_steps
    assert second.state_dict() == straight.state_dict()
    for a, b in zip(_params(resumed_model), _params(straight_model)):
        assert torch.equal(a, b)
