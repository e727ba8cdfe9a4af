#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Two include checks, both run by the ctest entry core_knows_no_optimizer.

1. The scaler's core knows no optimizer class: no source of it may include
   torch/optim/optimizer.h, directly or through another header. Only the adapter
   (src/amp/torch_optimizer_view.cpp) and the public front (src/amp/grad_scaler.cpp,
   src/amp/serialize.cpp, which implement GradScaler's torch::optim overloads) may.
   Runs each core file's own compile command with -M (the headers it reads) and fails,
   naming the file, if the optimizer header is among them.

2. The layer rules (MAY_INCLUDE below; docs/architecture.md, "Layers", states the same
   table): every `#include` of every file under src/ and include/ that names a file of
   this repository must be allowed by the rule of the including file's folder. Text
   parse of the direct includes; fails naming the file, the include and the rule.

Usage: check_core_includes.py BUILD_DIR/compile_commands.json"""
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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

# ---- Layer rules ----------------------------------------------------------------------
# Folders are feature first (amp, optim, distributed), device second (cpu, cuda, generic).
# A key is a folder (the rule of every file directly in it) or one file (allowed in
# addition to its folder's rule). A value lists what those files may include besides the
# files of their own folder: a folder (any file directly in it, not in its subfolders) or
# one file. A subfolder is a folder of its own with its own rule. Every folder of src/ and
# include/ that holds a source file needs a key.
#
# Why each rule holds:
# - src/compat is the one place for LibTorch version differences: any folder of src/ may
#   include it (ANY_SRC_FOLDER_MAY_INCLUDE), and it includes nothing of ours.
# - src/common (the device-kernel registry, the plain-tensor check) and src/cuda_common
#   (the CUDA multi-tensor machinery of amp and optim) sit below the features and include
#   none of them; the registry's source alone includes the one table interface of each
#   feature, whose tables it fills, and the CUDA capture query it registers for CUDA.
# - A feature's top folder includes its own public headers, src/common and nothing of
#   its device folders, which it reaches through the registry. src/amp includes no
#   optimizer code: its adapter alone sees the public ScalerAware interface of lucid::optim.
#   src/optim includes nothing of amp: a fused optimizer gets the scale and the flag as
#   tensors.
# - A device folder includes only its feature's table interface (and src/cuda_common for
#   CUDA): kernels know nothing of the scaler's state or of optimizer classes.
# - src/distributed binds the scaler through its public API; the sharded clip's payload
#   (src/amp/norm_agreement.h) is the one internal header it shares with the Python front.
# - Public headers include public headers only, never src/.
AMP_TABLE = ["src/amp/backend.h", "src/amp/flag_read.h", "src/amp/scale_rule.h"]
OPTIM_TABLE = ["src/optim/fused_backend.h", "src/optim/fused_kernel_params.h"]
ANY_SRC_FOLDER_MAY_INCLUDE = ["src/compat"]
MAY_INCLUDE = {
    "src/compat": [],
    "src/common": [],
    "src/common/device_kernels.cpp": ["src/amp/backend.h", "src/optim/fused_backend.h",
                                      "src/cuda_common/stream_capture.h"],
    "src/cuda_common": [],
    "src/amp": ["include/lucid/amp", "src/common"],
    "src/amp/torch_optimizer_view.cpp": ["include/lucid/optim/fused_optimizer.h"],
    "src/amp/cpu": AMP_TABLE,
    "src/amp/cuda": AMP_TABLE + ["src/cuda_common"],
    "src/amp/generic": AMP_TABLE,
    "src/optim": ["include/lucid/optim", "src/common"],
    "src/optim/cpu": OPTIM_TABLE,
    "src/optim/cuda": OPTIM_TABLE + ["src/cuda_common"],
    "src/distributed": ["include/lucid/distributed", "include/lucid/amp",
                        "src/amp/norm_agreement.h"],
    "include/lucid": ["include/lucid/amp", "include/lucid/optim", "include/lucid/distributed"],
    "include/lucid/amp": [],
    "include/lucid/optim": [],
    "include/lucid/distributed": ["include/lucid/amp"],
}
SOURCE_SUFFIXES = (".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu", ".h.in")
INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


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


def check_core(path):
    """Check 1; returns (ok, message)."""
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
        return False, f"check_core_includes: found {seen} of the {len(CORE)} core files in {path}"
    if bad:
        return False, ("check_core_includes: these core files include " + FORBIDDEN + ": "
                       + ", ".join(bad))
    return True, f"check_core_includes: {seen} core files, none includes {FORBIDDEN}"


# ---- Check 2: the layer rules ---------------------------------------------------------

def tree_files(root):
    """Every source file under src/ and include/, as paths relative to `root`."""
    files = set()
    for top in ("src", "include"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if name.endswith(SOURCE_SUFFIXES):
                    rel = os.path.relpath(os.path.join(folder, name), root)
                    files.add(rel.replace(os.sep, "/"))
    return files


def includes_of(root, rel):
    """The direct includes of `rel`: (bracket, name) pairs, bracket '"' or '<'."""
    found = []
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for line in f:
            m = INCLUDE_LINE.match(line)
            if m:
                found.append((m.group(1), m.group(2).strip()))
    return found


def resolve(rel, bracket, name, files):
    """The repository file an include names, or None for a library header. A quoted include
    is looked up beside the including file, then in src/ and include/ (the include path);
    one that matches nothing is returned as '?'. <lucid/...> is a public header (possibly
    generated, as lucid/amp/version.h); another <...> counts only where src/ holds it."""
    def norm(p):
        return os.path.normpath(p).replace(os.sep, "/")

    if bracket == '"':
        for candidate in (norm(os.path.join(os.path.dirname(rel), name)), norm("src/" + name),
                          norm("include/" + name)):
            if candidate in files:
                return candidate
        return "?"
    if name.startswith("lucid/"):
        return norm("include/" + name)
    candidate = norm("src/" + name)
    return candidate if candidate in files else None


def is_file_entry(entry):
    return os.path.splitext(entry)[1] != ""


def rule_text(folder, rel):
    allowed = MAY_INCLUDE.get(folder, []) + MAY_INCLUDE.get(rel, [])
    if folder.startswith("src/"):
        allowed = allowed + ANY_SRC_FOLDER_MAY_INCLUDE
    where = folder + (" (and " + rel + ")" if rel in MAY_INCLUDE else "")
    return f"{where} may include its own folder" + ("".join(", " + a for a in allowed))


def layer_violations(includes, files):
    """`includes`: {file: [(bracket, name), ...]} for files relative to the repository root;
    `files`: the repository's files (to resolve against). Returns one message per include
    that no rule allows."""
    bad = []
    for rel in sorted(includes):
        folder = os.path.dirname(rel)
        if folder not in MAY_INCLUDE:
            bad.append(f"{rel}: its folder {folder} has no rule in MAY_INCLUDE "
                       "(scripts/check_core_includes.py); add one, and to docs/architecture.md")
            continue
        allowed = MAY_INCLUDE[folder] + MAY_INCLUDE.get(rel, [])
        if folder.startswith("src/"):
            allowed = allowed + ANY_SRC_FOLDER_MAY_INCLUDE
        for bracket, name in includes[rel]:
            shown = f'"{name}"' if bracket == '"' else f"<{name}>"
            target = resolve(rel, bracket, name, files)
            if target is None:
                continue
            if target == "?":
                bad.append(f"{rel} includes {shown}, which is no file beside it, in src/ or "
                           "in include/")
                continue
            target_folder = os.path.dirname(target)
            ok = target_folder == folder or any(
                target == a if is_file_entry(a) else target_folder == a for a in allowed)
            if not ok:
                bad.append(f"{rel} includes {shown} ({target}); the rule: "
                           + rule_text(folder, rel))
    return bad


def stale_rules(files):
    """Keys and entries of the table that name nothing in the tree (renamed or removed)."""
    folders = {os.path.dirname(f) for f in files}
    named = set(MAY_INCLUDE) | {a for v in MAY_INCLUDE.values() for a in v}
    named |= set(ANY_SRC_FOLDER_MAY_INCLUDE)
    stale = []
    for n in sorted(named):
        exists = n in files if is_file_entry(n) else n in folders
        if not exists:
            stale.append(f"MAY_INCLUDE names {n}, which is not in the tree")
    return stale


def self_test(files):
    """Plants violations of each kind of rule in made-up include lists (the real tree's
    files resolve them) and checks that every one is caught and that allowed includes pass.
    Returns the number caught, or raises AssertionError naming what went wrong."""
    planted = {
        "src/common/plain_tensor.h": [('"', "amp/scaler_core.h")],       # common -> feature
        "src/common/device_kernels.cpp": [('"', "amp/scaler_core.h")],   # registry: tables only
        "src/amp/scaler_core.cpp": [('"', "optim/fused_launch.h")],      # amp -> optim
        "src/amp/kernel_routing.cpp": [('"', "amp/cpu/amp_kernels.h")],  # top -> device folder
        "src/amp/scale_schedule.cpp": [("<", "lucid/optim/fused_optimizer.h")],
        "src/amp/cpu/backend.cpp": [('"', "amp/scaler_core.h")],         # device -> core
        "src/amp/cpu/unscale_kernel.cpp": [('"', "cuda_common/tensor_table.h")],
        "src/optim/fused_launch.cpp": [('"', "amp/backend.h")],          # optim -> amp
        "src/optim/cuda/fused_backend.cpp": [('"', "amp/cuda/unscale_kernels.h")],
        "src/distributed/process_group.cpp": [('"', "amp/scaler_core.h")],
        "src/cuda_common/table_cache.h": [('"', "common/device_kernels.h")],
        "include/lucid/amp/grad_scaler.h": [('"', "amp/scaler_core.h")],  # public -> src/
        "include/lucid/optim/fused_sgd.h": [("<", "lucid/amp/grad_scaler.h")],
        "src/amp/clip_grad.cpp": [('"', "amp/no_such_header.h")],        # resolves nowhere
        "src/newfeature/x.cpp": [],                                      # folder without a rule
    }
    for rel, incs in planted.items():
        caught = layer_violations({rel: incs}, files)
        if len(caught) != 1:
            raise AssertionError(f"a planted violation in {rel} {incs} gave {caught}")
    allowed = {
        "src/amp/cuda/backend.cpp": [('"', "amp/backend.h"), ('"', "cuda_common/table_cache.h"),
                                     ("<", "ATen/ATen.h")],
        "src/common/device_kernels.cpp": [('"', "optim/fused_backend.h")],
        "src/optim/fused_sgd.cpp": [('"', "compat/torch_version.h"),
                                    ("<", "lucid/optim/fused_sgd.h")],
        "src/distributed/overflow_agreement.cpp": [('"', "amp/norm_agreement.h"),
                                                   ("<", "lucid/amp/grad_scaler.h")],
        "include/lucid/amp.h": [("<", "lucid/optim.h"), ("<", "lucid/amp/version.h")],
    }
    refused = layer_violations(allowed, files)
    if refused:
        raise AssertionError(f"allowed includes were refused: {refused}")
    return len(planted)


def check_layers(root=ROOT):
    """Check 2; returns (ok, messages)."""
    files = tree_files(root)
    try:
        caught = self_test(files)
    except AssertionError as e:
        return False, ["check_core_includes: the layer check failed its own test: " + str(e)]
    includes = {rel: includes_of(root, rel) for rel in sorted(files)}
    bad = stale_rules(files) + layer_violations(includes, files)
    if bad:
        return False, ["check_core_includes: layer rule broken: " + b for b in bad]
    count = sum(1 for rel, incs in includes.items() for bracket, name in incs
                if resolve(rel, bracket, name, files) is not None)
    return True, [f"check_core_includes: layer rules: {len(files)} files under src/ and "
                  f"include/, {count} includes of repository headers, all allowed (self-test: "
                  f"{caught} planted violations caught)"]


def main(path):
    ok_core, core_message = check_core(path)
    ok_layers, layer_messages = check_layers()
    print(core_message)
    for message in layer_messages:
        print(message)
    return 0 if ok_core and ok_layers else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
