# SPDX-License-Identifier: BSD-3-Clause
"""Every ```python block of README.md and docs/*.md is a complete program that runs as
written, here on the CPU (and on CUDA where there is a GPU): each is extracted and run in
a fresh interpreter with the package on its path."""

import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks():
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for path in files:
        with open(path) as f:
            text = f.read()
        for m in _BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(m.group(1), id=f"{os.path.relpath(path, ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_there_are_examples_to_run():
    assert any("README.md" in p.id for p in BLOCKS)


@pytest.mark.parametrize("code", BLOCKS)
def test_the_example_runs_as_written(code, tmp_path):
    import lucid_amp

    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.dirname(lucid_amp.__file__))
    env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
