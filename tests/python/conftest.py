# SPDX-License-Identifier: BSD-3-Clause
"""pytest setup for the Python package: import lucid_amp from LUCID_AMP_PACKAGE_DIR when it
is set (a folder holding a built lucid_amp, e.g. scripts/python_sanitize.sh's ASan build),
else from python/ when it was built in place there (python3 setup.py build_ext --inplace),
else the installed one."""

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_IN_PLACE = os.path.join(ROOT, "python")
_PACKAGE_DIR = os.environ.get("LUCID_AMP_PACKAGE_DIR")
if _PACKAGE_DIR:
    sys.path.insert(0, os.path.abspath(_PACKAGE_DIR))
elif glob.glob(os.path.join(_IN_PLACE, "lucid_amp", "_C*.so")) and not os.environ.get(
    "LUCID_AMP_TEST_INSTALLED"
):
    sys.path.insert(0, _IN_PLACE)
