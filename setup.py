# SPDX-License-Identifier: BSD-3-Clause
"""Builds the Python package lucid_amp against the PyTorch of the running interpreter.

    pip install --no-build-isolation -v .                # install
    pip wheel --no-build-isolation --no-deps .           # a wheel
    pip install --no-build-isolation -e .                # editable, for development
    python setup.py build_ext --inplace                  # in place (scripts/python_test.sh)

It needs torch, setuptools (77 or newer) and wheel installed first: pyproject.toml leaves
torch out of the build requirements, and an isolated build stops at once saying so.

The package's metadata lives in pyproject.toml; this file supplies what only a build can
know: the version (CMakeLists.txt's project(VERSION), its one source), the dependency on
the exact PyTorch the extension is compiled against, and the extension itself.

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

Every build writes lucid_amp/_build_info.py beside the extension (in place, into the
wheel, into an editable install): the PyTorch it was compiled against, which
lucid_amp/__init__.py checks before it loads the extension.
"""

import glob
import os
import re

import setuptools
from setuptools import setup

# What to run when torch or a recent setuptools is missing. lucid-amp supports PyTorch
# 2.11 and 2.13; which one is the user's choice.
_HOW_TO_BUILD = (
    "lucid_amp compiles a C++ extension against the PyTorch it is installed with, so it "
    "builds in an environment that already has torch, not in pip's isolated build "
    "environment (which would have to download one). Install the build requirements and "
    "PyTorch first, then build without isolation:\n"
    '    pip install torch==<version> "setuptools>=77" wheel    # e.g. torch==2.13.0\n'
    "    pip install --no-build-isolation -v .\n"
)

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as error:
    raise SystemExit(f"setup.py: cannot import torch ({error}).\n{_HOW_TO_BUILD}") from None

# pyproject.toml gives the licence as an SPDX expression with its file (PEP 639), which
# setuptools reads from 77 on; an older one rejects the file with a schema error that
# does not say what to do. With --no-build-isolation pip does not check build-system
# requirements, so the check is here.
if int(setuptools.__version__.split(".")[0]) < 77:
    raise SystemExit(
        f"setup.py: setuptools {setuptools.__version__} is too old (77 or newer reads "
        f"pyproject.toml's licence).\n{_HOW_TO_BUILD}"
    )

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


def _torch_requirement():
    """The installed wheel's dependency: exactly the PyTorch release it is compiled
    against. PyTorch keeps no C++ ABI between releases, so the extension loads only into
    the release it was built for. The local part (+cpu, +cu130) is left out: which build
    of a release gets installed is the index's choice (PyTorch's CPU and CUDA indexes),
    and torch==2.13.0 matches each of them (PEP 440); lucid_amp/__init__.py checks the
    whole version, local part included, when it is imported."""
    return f"torch=={torch.__version__.split('+')[0]}"


def _write_if_changed(path, text):
    """Writes `text` to `path` unless it holds it already: an unchanged file keeps its
    timestamp, so nothing that depends on it is rebuilt."""
    old = None
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if old != text:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


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
    _write_if_changed(os.path.join(out_dir, "lucid", "amp", "version.h"), text)
    return out_dir


def _use_cuda():
    if os.environ.get("LUCID_AMP_FORCE_CPU", "0") not in ("", "0"):
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _build_info(with_cuda):
    """The text of lucid_amp/_build_info.py: what the extension is compiled against."""
    return (
        "# SPDX-License-Identifier: BSD-3-Clause\n"
        "# Generated by setup.py when lucid_amp._C is built; not to be edited or committed.\n"
        '"""The PyTorch that lucid_amp._C was compiled against (checked on import)."""\n'
        "\n"
        "#: torch.__version__ of the build, local part included.\n"
        f"TORCH_VERSION = {str(torch.__version__)!r}\n"
        "#: torch.version.cuda of the build (None: a PyTorch without CUDA).\n"
        f"TORCH_CUDA_VERSION = {torch.version.cuda!r}\n"
        "#: Whether the extension has lucid-amp's CUDA kernels.\n"
        f"WITH_CUDA = {bool(with_cuda)!r}\n"
        "#: lucid-amp's version (CMakeLists.txt's project(VERSION)).\n"
        f"VERSION = {'.'.join(_project_version())!r}\n"
    )


def _extension():
    cpp, cuda = _library_sources()
    bindings = sorted(_rel(p) for p in glob.glob(os.path.join(ROOT, "python", "csrc", "*.cpp")))
    # -g0: Python's own CFLAGS ask for debug information (-g), which makes the objects
    # several times larger and the compile slower; the extension ships without it.
    # -std=c++20: the library's standard, and the one PyTorch's headers are written for.
    # BuildExtension adds its own default only when no -std is given; naming it keeps
    # every supported PyTorch and the CMake build on the same standard.
    std = ["-std=c++20"]
    cxx_flags = ["-O3", "-g0"] + std
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
        # build_ext relinks when a source or a dependency is newer than the extension;
        # extra objects are neither, so a rebuilt library is named here.
        kwargs["depends"] = [os.path.abspath(prebuilt)]
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


class BuildExtension(cpp_extension.BuildExtension):
    """PyTorch's build_ext, which also writes lucid_amp/_build_info.py next to the
    extension: into the build folder (what a wheel packs), and, for an in-place or
    editable build, into python/lucid_amp/ as well (where that extension is imported)."""

    def run(self):
        super().run()
        text = _build_info(_use_cuda())
        for inplace in [False, True] if self.inplace else [False]:
            _write_if_changed(os.path.join(self._package_dir(inplace), "_build_info.py"), text)

    def _package_dir(self, inplace):
        """The folder of lucid_amp._C: in the build folder, or in the source package."""
        saved, self.inplace = self.inplace, inplace
        try:
            return os.path.dirname(self.get_ext_fullpath("lucid_amp._C"))
        finally:
            self.inplace = saved


setup(
    version=".".join(_project_version()),
    install_requires=[_torch_requirement()],
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension},
    # Out of CMake's ./build: setuptools' objects go to build-python/.
    options={"build": {"build_base": "build-python"}},
)
