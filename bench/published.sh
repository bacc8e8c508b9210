#!/usr/bin/env bash
# Published GPU training runs against Loom's predictions: every training row of the JSON files in
# DIR (default bench/published, whose README says where each file comes from) mapped to Loom's
# model, cluster, job and strategy as published, predicted with the analytical estimate, and
# compared with what was measured. Prints one line per row (throughput in the row's own unit with
# its error calibrated, leave-one-out and on the hardware alone, and, where published, memory
# with its error), the rows Loom cannot express with the reason, and per file the median |error|
# and the share of pairs (measured more than 5 % apart) that the prediction orders as measured:
# first with the shipped calibration of each row's runtime (profiles/calibrations); then
# leave-one-out: the usable rows of each cluster and runtime (all files together) fitted from the
# hardware values as `loom calibrate --runtime` fits them, each row predicted by the fit of the
# others (lab/fit.hpp), the error to expect on runs the calibration has not seen; then
# leave-one-source-out: each file predicted with a calibration of its runtime fitted to the other
# files' rows only (the hardware alone where no other file has rows of that runtime on that
# cluster), the error to expect on a source no calibration has seen; and last on the hardware
# alone: each row on its cluster file's values, the model with no calibration at all.
#
# Usage: bench/published.sh [DIR] [--json] [--explain ID]
#        BUILD=build-foo bench/published.sh
# Builds bench_published first when it is missing (configuring BUILD if needed).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BIN="$BUILD/bench/bench_published"
if [ ! -x "$BIN" ]; then
  if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD" --target bench_published >/dev/null
fi
# The folder is the one argument that is neither an option nor the id after --explain.
HAS_DIR=0
PREV=""
for arg in "$@"; do
  case "$arg" in -*) ;; *) [ "$PREV" = "--explain" ] || HAS_DIR=1 ;; esac
  PREV="$arg"
done
if [ "$HAS_DIR" = 1 ]; then exec "$BIN" "$@"; fi
exec "$BIN" "$ROOT/bench/published" "$@"
