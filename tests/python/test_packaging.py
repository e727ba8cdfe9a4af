# SPDX-License-Identifier: BSD-3-Clause
"""The package as a package: it imports from outside the source tree in any order, it
refuses a PyTorch other than the one it was compiled against, its type stubs match the
extension, and setup.py stops at once without PyTorch.

The round trip through a wheel (build, install into a new virtual environment, import,
metadata) and an editable install take minutes: they run only with LUCID_AMP_SLOW_TESTS=1
(the long CI tier), and link LUCID_AMP_PREBUILT_LIBRARY when it is set, as setup.py does.
"""

import ast
import email.parser
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

import lucid_amp
from lucid_amp import _C, _build_info
from conftest import ROOT

# The folder that holds the lucid_amp under test (python/ for the in-place build).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(lucid_amp.__file__)))
STUB = os.path.join(os.path.dirname(os.path.abspath(_C.__file__)), "_C.pyi")

SLOW = os.environ.get("LUCID_AMP_SLOW_TESTS", "0") not in ("", "0")


def slow(test):
    """Marks a test slow (pytest -m slow picks them) and runs it only with
    LUCID_AMP_SLOW_TESTS=1."""
    skip = pytest.mark.skipif(not SLOW, reason="builds and installs lucid_amp (minutes); "
                              "set LUCID_AMP_SLOW_TESTS=1")
    return pytest.mark.slow(skip(test))


def cmake_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(lucid_amp VERSION (\d+\.\d+\.\d+)", f.read()).group(1)


def run_python(code, cwd, pythonpath=PACKAGE_PARENT, python=sys.executable, timeout=300):
    """Runs `code` in a new interpreter, in `cwd` (outside the source tree), with
    `pythonpath` ahead of the inherited PYTHONPATH; returns the CompletedProcess."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# --- importing ---------------------------------------------------------------------


@pytest.mark.parametrize("first", ["lucid_amp", "torch"])
def test_import_in_either_order_from_outside_the_tree(tmp_path, first):
    second = "torch" if first == "lucid_amp" else "lucid_amp"
    out = run_python(f"import {first}, {second}\n"
                     "print(lucid_amp.__version__, lucid_amp.__file__)", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    version, path = out.stdout.split()
    assert version == cmake_version()
    assert path == lucid_amp.__file__


def test_version_is_cmakes():
    assert lucid_amp.__version__ == cmake_version()
    assert _build_info.VERSION == cmake_version()


def test_build_info_records_this_torch():
    assert _build_info.TORCH_VERSION == str(torch.__version__)
    assert _build_info.TORCH_CUDA_VERSION == torch.version.cuda
    assert _build_info.WITH_CUDA == lucid_amp.with_cuda


@pytest.mark.parametrize("other", [
    "2.99.0",  # another release
    str(torch.__version__).split("+")[0] + "+other",  # the same release, another build
])
def test_another_torch_is_refused(tmp_path, other):
    out = run_python(f"import torch\ntorch.__version__ = {other!r}\nimport lucid_amp",
                     cwd=tmp_path)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), out.stderr
    assert f"compiled against torch {_build_info.TORCH_VERSION}," in last
    assert f"installed torch is {other}." in last
    assert "Rebuild or reinstall lucid_amp" in last


def test_unbuilt_source_tree_is_refused(tmp_path):
    # The package's Python files alone, as in a source tree that was never built.
    source = os.path.dirname(os.path.abspath(lucid_amp.__file__))
    shutil.copytree(source, tmp_path / "lucid_amp", ignore=shutil.ignore_patterns(
        "_build_info.py", "_C*.so", "_C*.pyd", "__pycache__"))
    out = run_python("import lucid_amp", cwd=tmp_path, pythonpath=str(tmp_path))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: lucid_amp is not built"), out.stderr


def test_setup_without_torch_stops_with_advice():
    # torch is made unimportable (None in sys.modules); setup.py must stop before it
    # builds anything and say how to install.
    code = ("import runpy, sys\n"
            "sys.modules['torch'] = None\n"
            "sys.argv = ['setup.py', '--version']\n"
            "runpy.run_path('setup.py', run_name='__main__')\n")
    out = run_python(code, cwd=ROOT, pythonpath="")
    assert out.returncode != 0
    assert "cannot import torch" in out.stderr
    assert "pip install torch==" in out.stderr
    assert "pip install --no-build-isolation -v ." in out.stderr


# --- the type stubs ---------------------------------------------------------------


def stub_tree():
    with open(STUB) as f:
        return ast.parse(f.read(), filename=STUB)


def is_typing_only(node):
    """A stub name that does not exist at run time: an alias of a type (_Name = ...)."""
    return isinstance(node, ast.Assign)


def stub_names(body):
    """{name: node} of what a stub module or class body defines."""
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
    return names


def runtime_names(obj):
    """The names a module or pybind11 class binds, without Python's and pybind11's own."""
    names = {n for n in vars(obj) if not (n.startswith("__") and n.endswith("__"))}
    if isinstance(obj, type):
        names = {n for n in names if not n.startswith("_pybind11")}
        if "__init__" in vars(obj):
            names.add("__init__")
    return names


def test_stub_names_match_the_extension():
    stub = {n: node for n, node in stub_names(stub_tree().body).items()
            if not is_typing_only(node)}
    assert set(stub) == runtime_names(_C)
    for name, node in stub.items():
        if isinstance(node, ast.ClassDef):
            members = set(stub_names(node.body))
            assert members == runtime_names(getattr(_C, name)), name


def split_parameters(text):
    """The top-level comma-separated parts of a pybind11 parameter list."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def runtime_parameters(function):
    """[(name, has_default)] from the signature pybind11 writes first in the docstring."""
    first = function.__doc__.splitlines()[0]
    inner = first[first.index("(") + 1:first.rindex(")")]
    params = []
    for part in split_parameters(inner):
        name = part.split(":", 1)[0].strip()
        params.append((name, "=" in part.split(":", 1)[1] if ":" in part else "=" in part))
    return [p for p in params if p[0] != "self"]


def stub_parameters(node):
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    params = [(a.arg, d) for a, d in zip(positional, defaults)]
    params += [(a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg is not None:
        params.append(("**" + args.kwarg.arg, False))
    return [p for p in params if p[0] != "self"]


def stub_functions():
    """(qualified name, stub node, runtime function) of every function in the stub."""
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node, getattr(_C, node.name)
        elif isinstance(node, ast.ClassDef) and not is_typing_only(node):
            cls = getattr(_C, node.name)
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    yield f"{node.name}.{member.name}", member, getattr(cls, member.name)


def test_stub_signatures_match_the_extension():
    checked = 0
    for name, node, function in stub_functions():
        assert stub_parameters(node) == runtime_parameters(function), name
        # pybind11 cannot take an unnamed argument (arg0, ...) by keyword: the stub
        # makes those positional-only.
        unnamed = [a.arg for a in node.args.args if re.fullmatch(r"arg\d+", a.arg)]
        assert not unnamed, f"{name}: {unnamed} must be positional-only (/)"
        checked += 1
    assert checked > 20


def test_stub_and_marker_sit_beside_the_extension():
    package = os.path.dirname(os.path.abspath(_C.__file__))
    assert os.path.isfile(os.path.join(package, "_C.pyi"))
    assert os.path.isfile(os.path.join(package, "py.typed"))


# --- the wheel and an editable install (slow) ---------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A new virtual environment with the build's PyTorch release (from pip's configured
    indexes), setuptools and wheel (for an editable build), and nothing of lucid_amp."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = str(path / "bin" / "python")
    release = str(torch.__version__).split("+")[0]
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"torch=={release}",
                    "setuptools>=77", "wheel"], check=True, timeout=1800)
    out = run_python("import torch; print(torch.__version__)", cwd=path, pythonpath="",
                     python=python)
    if out.stdout.strip() != str(torch.__version__):
        pytest.skip(f"pip installs torch {out.stdout.strip()} here, not the build's "
                    f"{torch.__version__}")
    return python


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """lucid_amp's wheel, built from this tree with the running interpreter's PyTorch."""
    out_dir = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                    "--wheel-dir", str(out_dir), ROOT], check=True, timeout=3600)
    (path,) = out_dir.glob("lucid_amp-*.whl")
    return path


@slow
def test_wheel_contents_and_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = f"lucid_amp-{cmake_version()}.dist-info"
        metadata = email.parser.Parser().parsestr(z.read(f"{dist_info}/METADATA").decode())
        build_info = z.read("lucid_amp/_build_info.py").decode()
    for name in ["lucid_amp/__init__.py", "lucid_amp/py.typed", "lucid_amp/_C.pyi",
                 "lucid_amp/optim/__init__.py", f"{dist_info}/licenses/LICENSE"]:
        assert name in names
    assert any(re.fullmatch(r"lucid_amp/_C\..*\.so", n) for n in names)
    assert metadata["Name"] == "lucid_amp"
    assert metadata["Version"] == cmake_version()
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata.get_all("Requires-Dist") == [
        f"torch=={str(torch.__version__).split('+')[0]}"]
    assert f"TORCH_VERSION = {str(torch.__version__)!r}" in build_info


@slow
def test_wheel_installs_and_imports(venv, wheel, tmp_path):
    subprocess.run([venv, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    str(wheel)], check=True, timeout=600)
    try:
        out = run_python("import lucid_amp, torch, importlib.metadata as m\n"
                         "print(lucid_amp.__version__)\n"
                         "print(lucid_amp.__file__)\n"
                         "print(m.requires('lucid_amp'))\n"
                         "s = lucid_amp.GradScaler('cpu')\n"
                         "print(s.get_scale())\n", cwd=tmp_path, pythonpath="", python=venv)
        assert out.returncode == 0, out.stderr
        version, path, requires, scale = out.stdout.split("\n")[:4]
        assert version == cmake_version()
        assert path.startswith(os.path.dirname(os.path.dirname(venv)))
        assert requires == repr([f"torch=={str(torch.__version__).split('+')[0]}"])
        assert float(scale) == 65536.0
    finally:
        subprocess.run([venv, "-m", "pip", "uninstall", "--quiet", "--yes", "lucid_amp"],
                       check=True)


# The files a build needs (the source distribution's): an editable build copies the
# extension into the source package, so it runs on a copy, never over the _C*.so that
# this process has loaded from python/.
SOURCE_FILES = ["CMakeLists.txt", "LICENSE", "README.md", "MANIFEST.in", "pyproject.toml",
                "setup.py", "include", "src", "python"]


@slow
def test_editable_install_imports(venv, tmp_path):
    tree = tmp_path / "tree"
    for name in SOURCE_FILES:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns(
                "_C*.so", "_build_info.py", "*.egg-info", "__pycache__"))
        else:
            tree.mkdir(exist_ok=True)
            shutil.copy2(source, tree / name)
    subprocess.run([venv, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                    "--no-deps", "--editable", str(tree)], check=True, timeout=3600)
    try:
        out = run_python("import lucid_amp\nprint(lucid_amp.__version__)\n"
                         "print(lucid_amp.__file__)", cwd=tmp_path, pythonpath="",
                         python=venv)
        assert out.returncode == 0, out.stderr
        version, path = out.stdout.split()
        assert version == cmake_version()
        assert path == str(tree / "python" / "lucid_amp" / "__init__.py")
        assert os.path.isfile(tree / "python" / "lucid_amp" / "_build_info.py")
    finally:
        subprocess.run([venv, "-m", "pip", "uninstall", "--quiet", "--yes", "lucid_amp"],
                       check=True)


def _public_callables():
    import inspect

    import lucid_amp.distributed
    import lucid_amp.optim

    for module in (lucid_amp, lucid_amp.optim, lucid_amp.distributed):
        names = getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")])
        for name in names:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if inspect.isfunction(member) or isinstance(member, (property, classmethod, staticmethod)):
                        yield f"{module.__name__}.{name}.{attr}", member


def test_every_public_name_has_a_docstring():
    missing = [name for name, obj in _public_callables()
               if callable(obj) or isinstance(obj, property)
               if not (getattr(obj, "__doc__", None) or "").strip()]
    assert missing == []
