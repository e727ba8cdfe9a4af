#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The scaler's core knows no optimizer class: no source of it may include
torch/optim/optimizer.h, directly or through another header. Only the adapter
(src/amp/torch_optimizer_view.cpp) and the public front (src/amp/grad_scaler.cpp,
src/amp/serialize.cpp, which implement GradScaler's torch::optim overloads) may.

Usage: check_core_includes.py BUILD_DIR/compile_commands.json
Runs each core file's own compile command with -M (the headers it reads) and fails,
naming the file, if the optimizer header is among them."""
import json
import shlex
import subprocess
import sys

CORE = [
    "src/amp/scaler_core.cpp",
    "src/amp/scale_schedule.cpp",
    "src/amp/optimizer_records.cpp",
    "src/amp/scaler_diagnostics.cpp",
    "src/amp/scaler_state.cpp",
    "src/amp/kernel_routing.cpp",
    "src/amp/clip_grad.cpp",
]
FORBIDDEN = "torch/optim/optimizer.h"


def headers_of(entry):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    # The precompiled header is forced in as `-include .../cmake_pch.hxx`: drop the pair,
    # so that -M lists what the file itself includes.
    pairs = [i for i, a in enumerate(args[:-1]) if a == "-include" and "cmake_pch" in args[i + 1]]
    args = [a for i, a in enumerate(args) if i not in pairs and i - 1 not in pairs]
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-Winvalid-pch") or "cmake_pch" in a:
            continue
        out.append(a)
    if out and out[0].endswith("ccache"):
        out = out[1:]
    result = subprocess.run(out + ["-M"], cwd=entry["directory"], capture_output=True,
                            text=True, check=True)
    return result.stdout


def main(path):
    with open(path) as f:
        entries = json.load(f)
    seen = 0
    bad = []
    for entry in entries:
        file = entry["file"]
        match = next((c for c in CORE if file.endswith(c)), None)
        if match is None:
            continue
        seen += 1
        if FORBIDDEN in headers_of(entry):
            bad.append(match)
    if seen != len(CORE):
        print(f"check_core_includes: found {seen} of the {len(CORE)} core files in {path}")
        return 1
    if bad:
        print("check_core_includes: these core files include " + FORBIDDEN + ": " + ", ".join(bad))
        return 1
    print(f"check_core_includes: {seen} core files, none includes {FORBIDDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
