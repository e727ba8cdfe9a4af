# SPDX-License-Identifier: BSD-3-Clause
"""The Python examples run and print what they promise."""

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


@pytest.mark.parametrize("device", DEVICES)
def test_basic_loop(device):
    out = run("basic_loop.py", "--device", device, "--steps", "4")
    lines = [l for l in out.splitlines() if l.startswith("step")]
    assert len(lines) == 4
    assert all("scale 65536.0" in l and "stepped" in l for l in lines)


@pytest.mark.parametrize("device", DEVICES)
def test_clip_loop(device):
    out = run("clip_loop.py", "--device", device, "--steps", "3", "--max-norm", "0.5")
    lines = [l for l in out.splitlines() if l.startswith("step")]
    assert len(lines) == 3
    # the norm printed is the unscaled one: small, not ~65536 times larger
    norms = [float(l.rsplit(" ", 1)[1]) for l in lines]
    assert all(0.0 < n < 100.0 for n in norms)
