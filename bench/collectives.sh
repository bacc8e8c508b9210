#!/usr/bin/env bash
# The NCCL collective model against published collective measurements: every row of
# bench/published/collectives.json (or the file given) not marked doubtful, modelled on the
# cluster file its system maps to in bench/collectives/systems.json; per row the measured and
# modelled bus bandwidth, the algorithm and protocol the model picks and the error, then the
# median |error| per system.
#
# Usage: bench/collectives.sh [COLLECTIVES_JSON]      BUILD=build-foo bench/collectives.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
FILE=${1:-bench/published/collectives.json}
[ -f "$FILE" ] || { echo "collectives.sh: $FILE not found" >&2; exit 2; }
cmake --build "$BUILD" --target bench_collectives >/dev/null
"$BUILD/bench/bench_collectives" "$FILE" bench/collectives/systems.json
