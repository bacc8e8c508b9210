#!/usr/bin/env bash
# clang-tidy on one file with every finding an error (make tidy runs it JOBS files at a time).
# clang-tidy prints "N warnings generated." for the warnings it suppressed in system and LibTorch
# headers, which are not findings; only that line is dropped, the findings and the exit status
# are kept.
# Usage: tools/tidy-one.sh BUILD_DIR FILE.cpp
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: tools/tidy-one.sh BUILD_DIR FILE.cpp" >&2; exit 2; }
clang-tidy -p "$1" --quiet --warnings-as-errors='*' "$2" 2>&1 |
  grep -Ev '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$'
status=${PIPESTATUS[0]}
exit "$status"
