#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Style checks; scripts/test.sh runs them after the build (they need its
# compile_commands.json). Both cover the library: src/ and include/.
#   clang-format (.clang-format): every line of src/ and include/ changed since the commit
#     that added .clang-format (and not yet committed) must come out of clang-format
#     unchanged. Code older than the style file was wrapped by hand and is reformatted
#     when it is touched; LUCID_AMP_LINT_FORMAT=all checks whole files instead.
#   clang-tidy (.clang-tidy, which lists the checks and why some are off): every src/ file
#     of the build's compile_commands.json, with warnings as errors.
# Usage: scripts/lint.sh [format|tidy] (default both). About 2 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
what=${1:-all}
cd "$root"

# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages clang-format clang-tidy git

status=0
if [ "$what" = all ] || [ "$what" = format ]; then
  if [ "${LUCID_AMP_LINT_FORMAT:-changed}" = all ]; then
    echo "== clang-format: whole files of src/ and include/"
    mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'include/*.h')
    clang-format --dry-run --Werror "${files[@]}" || status=1
  else
    added=$(git log --diff-filter=A --format=%H -- .clang-format | tail -1)
    base=${added:+$added^}
    base=${base:-HEAD}
    echo "== clang-format: lines of src/ and include/ changed since $(git rev-parse --short "$base")"
    # git-clang-format 14 exits 0 whatever it finds: a diff in its output is the failure.
    out=$(git clang-format --binary clang-format --diff --extensions h,cpp,cu,cuh \
            "$base" -- src include) || status=1
    echo "$out"
    if [ -n "$out" ] && ! grep -qxE 'no modified files to format|clang-format did not modify any files' \
         <<<"$out"; then
      echo "lint: the lines above are not formatted: run git clang-format $base"
      status=1
    fi
  fi
fi

if [ "$what" = all ] || [ "$what" = tidy ]; then
  db=$build_dir/compile_commands.json
  [ -f "$db" ] || { echo "lint: no $db: configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON"; exit 1; }
  mapfile -t sources < <(grep -o "\"file\": \"$root/src/[^\"]*\.cpp\"" "$db" |
                         sed 's/"file": "//; s/"$//' | sort -u)
  # The build forces GCC's precompiled header in (-include .../cmake_pch.hxx), which clang
  # cannot read: clang-tidy gets the same commands without it, each file then parsing what
  # it includes itself.
  tidy_db=$(mktemp -d)
  trap 'rm -rf "$tidy_db"' EXIT
  python3 - "$db" "$tidy_db/compile_commands.json" <<'PY'
import json, shlex, sys
entries = json.load(open(sys.argv[1]))
for e in entries:
    args = shlex.split(e.pop("command")) if "command" in e else e.pop("arguments")
    pch = {i for i, a in enumerate(args[:-1]) if a == "-include" and "cmake_pch" in args[i + 1]}
    e["arguments"] = [a for i, a in enumerate(args)
                      if i not in pch and i - 1 not in pch and a != "-Winvalid-pch"]
json.dump(entries, open(sys.argv[2], "w"))
PY
  echo "== clang-tidy: ${#sources[@]} files of src/ ($(nproc) at a time)"
  printf '%s\n' "${sources[@]}" |
    xargs -P "$(nproc)" -n 1 clang-tidy -p "$tidy_db" --quiet --warnings-as-errors='*' \
      2> >(grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$' >&2) || status=1
fi
exit "$status"
