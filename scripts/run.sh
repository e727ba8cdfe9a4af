#!/usr/bin/env bash
# The main job: install what is missing, build, and run the seed example on the CPU
# (it prints the scale and the loss at each step).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=OFF "$@"
echo "== running the seed example"
"${LUCID_AMP_BUILD_DIR:-$root/build}/examples/seed_example"
