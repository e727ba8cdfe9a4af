# SPDX-License-Identifier: BSD-3-Clause
"""Runs a worker script as the ranks of a Gloo group, one process each, and returns what
each printed as JSON on its last line (rank order). The ranks meet over a FileStore in a
test's temporary folder; each worker gets ``rank world store *args`` on its command line
and imports the lucid_amp the tests import. Each rank writes into files, not pipes: a rank
blocked on a full pipe that nobody reads yet would hold up the collectives of the others."""

import json
import os
import subprocess
import sys

import lucid_amp

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(worker, tmp_path, world, *args, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(lucid_amp.__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    store = str(tmp_path / "store")
    outs = [(tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err") for r in range(world)]
    procs = []
    for r, (out, err) in enumerate(outs):
        with open(out, "w") as stdout, open(err, "w") as stderr:
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, worker), str(r), str(world), store, *args],
                env=env, stdout=stdout, stderr=stderr, text=True))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.read_text()
        results.append(json.loads(out.read_text().strip().splitlines()[-1]))
    return results
