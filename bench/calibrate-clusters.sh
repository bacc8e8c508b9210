#!/usr/bin/env bash
# Calibrates the shipped GPU clusters (profiles/clusters/) from the published training runs in
# bench/published/*.json with `loom calibrate`, writing each file in place with its calibration
# record (rows, files, date, in-sample and leave-one-out error, every parameter's datasheet start,
# fitted value and uncertainty):
#
#   A100 80GB rows  -> dgx-a100-80g          A100 40GB rows -> dgx-a100-40g
#   H100 80GB rows  -> dgx-h100, and its device parameters (GEMM ceilings, memory and attention
#                      efficiency, fragmentation: properties of the GH100 die and its software, not
#                      of the node) carried to h100-x1 and h200-x1 as ratios to their own starting
#                      values; their links and H200's larger, faster memory stay as in the
#                      datasheets
#   H100 96GB HBM2e (torchtitan) rows -> h100-96g-hbm2e
#   V100 rows       -> dgx1-v100-16g (device parameters carried to v100-16g-4x-nvlink),
#                      dgx1-v100-32g (carried to v100-32g-2x-pcie), dgx2-v100-32g
#
# The fit starts from the datasheet values each file records, so the script gives the same files
# when run again on the same code; re-run it after the cost model changes.
#
# Usage: bench/calibrate-clusters.sh            (DATE=YYYY-MM-DD for the record; default today)
#        BUILD=build-foo bench/calibrate-clusters.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
LOOM="$BUILD/tools/loom"
if [ ! -x "$LOOM" ]; then
  if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD" --target loom >/dev/null
fi
DATE=${DATE:-$(date -u +%F)}
CLUSTERS="$ROOT/profiles/clusters"
RUNS=()
for f in "$ROOT"/bench/published/*.json; do
  # Training rows only (the GEMM and collective files have no "model").
  if grep -q '"model"' "$f"; then RUNS+=("$f"); fi
done

calibrate() {
  local name=$1
  shift
  local targets=()
  for t in "$@"; do targets+=(--apply-to "$CLUSTERS/$t.json"); done
  echo "== $name"
  # Skipped rows (another GPU, not expressible) are many: show only their count.
  "$LOOM" calibrate "${RUNS[@]}" --cluster "$CLUSTERS/$name.json" -o "$CLUSTERS/$name.json" \
    --date "$DATE" "${targets[@]}" | awk '
      /^skipped / { skipping = 1; print; next }
      skipping && /^  / { next }
      { skipping = 0; print }'
  echo
}

calibrate dgx-a100-80g
calibrate dgx-a100-40g
calibrate dgx-h100 h100-x1 h200-x1
calibrate h100-96g-hbm2e
calibrate dgx1-v100-16g v100-16g-4x-nvlink
calibrate dgx1-v100-32g v100-32g-2x-pcie
calibrate dgx2-v100-32g
