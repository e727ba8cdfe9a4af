#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Python test suite under AddressSanitizer and UndefinedBehaviorSanitizer: builds the
# extension lucid_amp._C with gcc's -fsanitize=address,undefined, linking the instrumented
# static library that scripts/sanitize.sh built (LUCID_AMP_PREBUILT_LIBRARY=
# <build-sanitize>/liblucid_amp.a, so only the bindings are compiled here), into a package
# of its own (<build-sanitize>/python/lucid_amp; the in-place build in python/ is left as
# it is), then runs `pytest -m "not slow" tests/python` on it with the interpreter under
# ASan. Extra arguments go to pytest. .ci/run runs it right after scripts/sanitize.sh;
# run that first (LUCID_AMP_SANITIZE_BUILD_DIR picks its build folder, as there).
#
# The interpreter (LUCID_AMP_PYTHON, else .venv's) and LibTorch are not instrumented; ASan
# checks every access of the bindings and the library, and every allocation that goes
# through malloc/new. Runtime settings (docs/RELIABILITY.md says why each is needed):
#   LD_PRELOAD    gcc's libasan, then libstdc++.so.6. ASan's runtime must be the first
#                 library loaded, and the interpreter does not link it. libstdc++ must be
#                 loaded when that runtime starts: it finds the real __cxa_throw then, and
#                 the interpreter does not link libstdc++ either, so without it the first
#                 C++ exception stops the process (CHECK failed: real___cxa_throw != 0).
#                 The variable goes down to the tests' child interpreters (the examples,
#                 the README's blocks, the Gloo ranks), which run under ASan too.
#   PYTHONMALLOC  malloc: Python's objects come from malloc instead of pymalloc's pools,
#                 so a binding that touches a freed Python object is caught too.
#   ASAN_OPTIONS  detect_leaks=0: the interpreter and LibTorch keep process-lifetime
#                 allocations that LeakSanitizer would report at every exit; the rest are
#                 scripts/sanitize.sh's options.
#   UBSAN_OPTIONS halt_on_error=1 and -fno-sanitize-recover=undefined, as in sanitize.sh.
# pytest captures the tests' output with --capture=sys (Python's streams only): a report
# is written to file descriptor 2 and then ends the process, and pytest's default capture
# of the descriptors would take the report down with it. -rs lists each skipped test with
# its reason, so the log shows what did not run under the sanitizers.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${LUCID_AMP_PYTHON:-$root/.venv/bin/python}
build_dir=${LUCID_AMP_SANITIZE_BUILD_DIR:-$root/build-sanitize}
library=$build_dir/liblucid_amp.a
package_dir=$build_dir/python
cd "$root"
if [ ! -x "$python" ]; then
  echo "python_sanitize.sh: no interpreter $python (create .venv, or set LUCID_AMP_PYTHON)" >&2
  exit 1
fi
if [ ! -f "$library" ]; then
  echo "python_sanitize.sh: no $library (run scripts/sanitize.sh first)" >&2
  exit 1
fi
# gcc prints the bare name when it has no such file.
libasan=$(gcc -print-file-name=libasan.so)
if [ ! -f "$libasan" ]; then
  echo "python_sanitize.sh: gcc has no libasan.so (install g++, which brings libasan)" >&2
  exit 1
fi
if [ -d /usr/lib/ccache ]; then
  export PATH=/usr/lib/ccache:$PATH
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

# The package folder is made anew each time, so that it holds no Python file the source
# package no longer has (setup.py names the prebuilt library as a dependency, so the
# extension is relinked when it changed). The objects stay in python-temp (Ninja rebuilds
# only what changed), so a rebuild is a link. setuptools compiles the extension with CFLAGS in
# place of Python's own flags (so without -DNDEBUG, as the library's Debug build) and
# links a C++ extension with LDFLAGS: the link needs -fsanitize too, which makes the
# extension need libasan and libubsan (the library's objects call UBSan's runtime).
# setup.py's -O3 -g0 come after CFLAGS: the bindings are optimised and have no line
# tables; the library keeps sanitize.sh's -O0 -g1.
sanitize="-fsanitize=address,undefined"
rm -rf "$package_dir"
echo "== building the Python package with ASan + UBSan into $package_dir"
CFLAGS="-fno-omit-frame-pointer $sanitize -fno-sanitize-recover=undefined" LDFLAGS="$sanitize" \
  LUCID_AMP_PREBUILT_LIBRARY="$library" \
  "$python" setup.py --quiet build --build-lib "$package_dir" --build-temp "$build_dir/python-temp"

export LUCID_AMP_PACKAGE_DIR=$package_dir  # tests/python/conftest.py imports it from here
export LD_PRELOAD="$libasan libstdc++.so.6${LD_PRELOAD:+ $LD_PRELOAD}"
export PYTHONMALLOC=malloc
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "== pytest -m \"not slow\" tests/python under ASan + UBSan (ASAN_OPTIONS=$ASAN_OPTIONS)"
"$python" -m pytest -q -rs --capture=sys -m "not slow" tests/python "$@"
