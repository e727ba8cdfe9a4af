# SPDX-License-Identifier: BSD-3-Clause
"""Builds the Python package lucid_amp against the PyTorch of the running interpreter.

    pip install --no-build-isolation .          # as any PyTorch C++ extension
    python3 setup.py build_ext --inplace        # in place, for the tests (scripts/test.sh)

The extension lucid_amp._C compiles the library's own sources (src/, without the
distributed target) together with the bindings in python/csrc/, so the package needs no
CMake build. The CUDA kernels are compiled (CUDAExtension) when the installed PyTorch was
built with CUDA and a CUDA toolkit is found (CUDA_HOME); a GPU is not needed to build.
LUCID_AMP_FORCE_CPU=1 builds the CPU-only extension even then. TORCH_CUDA_ARCH_LIST picks
the GPU architectures (e.g. "9.0" for the H100/H200), as for every PyTorch extension.
MAX_JOBS bounds the parallel compile (Ninja).

LUCID_AMP_PREBUILT_LIBRARY=/path/to/liblucid_amp.a links the static library of a CMake
build of this tree against the same LibTorch instead of compiling its sources again
(scripts/test.sh does this after the C++ suite has built it); only the bindings are then
compiled. The library must match the extension's CUDA setting.
"""

import glob
import os
import re

from setuptools import setup

import torch
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _rel(path):
    return os.path.relpath(path, ROOT)


def _library_sources():
    """The library's C++ and CUDA sources, wherever they sit under src/ (the layout moves).

    A file is CUDA-only when it is a .cu file or lies under a directory named "cuda" or
    "cuda_*" (src/amp/cuda, src/optim/cuda, src/cuda_common); src/distributed (the c10d
    target) is left out: Python users have torch.distributed.
    """
    cpp, cuda = [], []
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "**", "*"), recursive=True)):
        if not path.endswith((".cpp", ".cu")):
            continue
        parts = _rel(path).split(os.sep)
        if "distributed" in parts:
            continue
        cuda_dir = any(d == "cuda" or d.startswith("cuda_") for d in parts[:-1])
        if path.endswith(".cu") or cuda_dir:
            cuda.append(_rel(path))
        else:
            cpp.append(_rel(path))
    return cpp, cuda


def _project_version():
    """The version CMakeLists.txt's project(VERSION) sets: the one place it is kept."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        match = re.search(r"project\(lucid_amp VERSION (\d+)\.(\d+)\.(\d+)", f.read())
    if match is None:
        raise RuntimeError("setup.py: no project(lucid_amp VERSION x.y.z) in CMakeLists.txt")
    return match.groups()


def _generated_include_dir():
    """Generates lucid/amp/version.h from its .in template, as CMake's configure_file does,
    into build-python/include, and returns that folder for the include path."""
    major, minor, patch = _project_version()
    values = {
        "PROJECT_VERSION_MAJOR": major,
        "PROJECT_VERSION_MINOR": minor,
        "PROJECT_VERSION_PATCH": patch,
        "PROJECT_VERSION": f"{major}.{minor}.{patch}",
    }
    with open(os.path.join(ROOT, "include", "lucid", "amp", "version.h.in")) as f:
        text = re.sub(r"@(\w+)@", lambda m: values[m.group(1)], f.read())
    out_dir = os.path.join(ROOT, "build-python", "include")
    header = os.path.join(out_dir, "lucid", "amp", "version.h")
    os.makedirs(os.path.dirname(header), exist_ok=True)
    old = None
    if os.path.exists(header):
        with open(header) as f:
            old = f.read()
    if old != text:  # unchanged: keep the timestamp, so nothing rebuilds for it
        with open(header, "w") as f:
            f.write(text)
    return out_dir


def _use_cuda():
    if os.environ.get("LUCID_AMP_FORCE_CPU", "0") not in ("", "0"):
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _extension():
    cpp, cuda = _library_sources()
    bindings = sorted(_rel(p) for p in glob.glob(os.path.join(ROOT, "python", "csrc", "*.cpp")))
    # -g0: Python's own CFLAGS ask for debug information (-g), which makes the objects
    # several times larger and the compile slower; the extension ships without it.
    # -Wno-deprecated-declarations: LibTorch 1.13's headers use std::iterator (C++17-deprecated)
    # in every file that includes them.
    cxx_flags = ["-O3", "-g0", "-Wno-deprecated-declarations"]
    # The library is C++17. PyTorch 2.x's extension builds use at least that already (and
    # may move on); 1.13's default is C++14.
    std = ["-std=c++17"] if int(torch.__version__.split(".")[0]) < 2 else []
    cxx_flags += std
    prebuilt = os.environ.get("LUCID_AMP_PREBUILT_LIBRARY", "")
    kwargs = dict(
        name="lucid_amp._C",
        sources=bindings + ([] if prebuilt else cpp),
        include_dirs=[_generated_include_dir(), os.path.join(ROOT, "include"),
                      os.path.join(ROOT, "src")],
        extra_compile_args={"cxx": cxx_flags},
    )
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise FileNotFoundError(f"LUCID_AMP_PREBUILT_LIBRARY: no such file {prebuilt}")
        kwargs["extra_objects"] = [os.path.abspath(prebuilt)]
        # The static library links zlib privately (its archive check): the extension that
        # takes it in links the runtime library, by its soname (machines without zlib's
        # development files have no plain libz.so).
        kwargs["extra_link_args"] = ["-l:libz.so.1"]
    # The C++ runtime by its shared library, named before the compiler's own runtime
    # arguments: a toolchain that links libstdc++ statically would otherwise put a second
    # copy of it (locales, streams) into the extension, beside the one PyTorch loads, and
    # formatting a number into an error message then crashes inside that copy.
    kwargs.setdefault("extra_link_args", []).append("-l:libstdc++.so.6")
    if _use_cuda():
        if not prebuilt:
            kwargs["sources"] += cuda
        kwargs["define_macros"] = [("LUCID_AMP_WITH_CUDA", "1")]
        kwargs["extra_compile_args"]["nvcc"] = ["-O3"] + std
        return cpp_extension.CUDAExtension(**kwargs)
    return cpp_extension.CppExtension(**kwargs)


setup(
    name="lucid_amp",
    version=".".join(_project_version()),
    description="Dynamic loss scaling for PyTorch: a drop-in torch.amp.GradScaler on "
    "lucid-amp's C++ core and kernels",
    package_dir={"": "python"},
    packages=["lucid_amp", "lucid_amp.optim"],
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    # Out of CMake's ./build: setuptools' objects go to build-python/.
    options={"build": {"build_base": "build-python"}},
    python_requires=">=3.8",
    zip_safe=False,
)
