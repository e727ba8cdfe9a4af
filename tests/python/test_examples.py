# SPDX-License-Identifier: BSD-3-Clause
"""The Python examples run and print what they promise."""

import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples", "python")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def run(script, *args):
    import lucid_amp

    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.dirname(lucid_amp.__file__))
    env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def check_schedule(lines, steps):
    """Each printed step: a stepped one keeps the scale (65536 to start with, growth
    interval 2000), a skipped one (float16 gradients that overflowed at the initial scale,
    as can happen on CUDA) halves it; the last step is a stepped one.
    Returns the stepped lines."""
    assert len(lines) == steps
    scale = 65536.0
    stepped = []
    for line in lines:
        printed = float(line.split("scale ", 1)[1].split()[0])
        if " skipped" in line:
            scale /= 2
        else:
            assert " stepped" in line
            stepped.append(line)
        assert printed == scale, line
    assert lines[-1] in stepped
    return stepped


@pytest.mark.parametrize("device", DEVICES)
def test_basic_loop(device):
    out = run("basic_loop.py", "--device", device, "--steps", "8")
    check_schedule([l for l in out.splitlines() if l.startswith("step")], 8)
    if device == "cpu":  # bfloat16 has float32's range: nothing overflows
        assert " skipped" not in out


@pytest.mark.parametrize("device", DEVICES)
def test_clip_loop(device):
    out = run("clip_loop.py", "--device", device, "--steps", "8", "--max-norm", "0.5")
    lines = [l for l in out.splitlines() if l.startswith("step")]
    for line in check_schedule(lines, 8):
        # the norm printed is the unscaled one: small, not ~65536 times larger
        assert 0.0 < float(line.rsplit(" ", 1)[1]) < 100.0, line
    for line in lines:
        if " skipped" in line:
            assert not math.isfinite(float(line.rsplit(" ", 1)[1])), line
