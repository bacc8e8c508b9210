#!/usr/bin/env bash
# Wall time of one `loom plan` from start to exit: bert-large on one 8-GPU DGX A100 node (global
# batch 256, sequence 512), the command a user types. The search itself takes milliseconds; the
# rest is starting the process (loading its shared libraries), which is why `loom` links no
# LibTorch. Prints every run's time and the median.
#
# Usage: bench/plan_wall.sh [RUNS]               (default 21 runs, after one untimed warm-up)
#        LOOM=/path/to/loom bench/plan_wall.sh   (another build's binary, e.g. to compare)
set -euo pipefail
RUNS=${1:-21}
cd "$(dirname "$0")/.."
LOOM=${LOOM:-$PWD/${BUILD:-build}/tools/loom}
[ -x "$LOOM" ] || { echo "plan_wall.sh: $LOOM not found: build first (make build)" >&2; exit 2; }
ARGS=(plan --model bert-large --cluster dgx-a100-80g --nodes 1 --global-batch 256 --seq-len 512)
"$LOOM" "${ARGS[@]}" >/dev/null  # warm the page cache
times_ms=()
for _ in $(seq "$RUNS"); do
  start=$(date +%s%N)
  "$LOOM" "${ARGS[@]}" >/dev/null
  end=$(date +%s%N)
  times_ms+=("$(((end - start) / 1000))")
done
printf '%s\n' "${times_ms[@]}" | sort -n | awk -v loom="$LOOM" '
  { t[NR] = $1 / 1000 }
  END {
    line = ""
    for (i = 1; i <= NR; ++i) line = line sprintf(" %.1f", t[i])
    median = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "loom plan (bert-large, 8 GPUs) with %s, %d runs, ms sorted:%s\n", loom, NR, line
    printf "median %.1f ms\n", median
  }'
