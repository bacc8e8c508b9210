#!/usr/bin/env bash
# ZeRO step time on this machine's CPUs, side by side with another build: the mini-bert plans of
# bench/zero_plans.sh (those of bench/zero_memory.sh) at dp = 2 and 4 with ZeRO 0, 2 and 3
# (ZeRO-0 as the control: its code path is the same in most builds). Each round runs every plan
# with this build's `loom validate` and with MAIN's, alternating which goes first from round
# to round, so that the machine's drift falls on both. Prints each plan's step times per round,
# the medians and their ratio (this build / MAIN), and the ratio of each round's pair with the
# median of those and a bootstrap 90 % interval of that median (4000 resamples, fixed seed).
#
# Usage: MAIN=/path/to/other/build bench/zero_step.sh [ROUNDS]   (default 3 rounds, 8 steps each,
#        the first 3 left out)            BUILD=build-foo, OUT=dir (default /tmp/loom-zero-step),
#        STEPS=n (steps per run, of which the first 3 are left out), ZEROS="2 3" (default "0 2 3")
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${STEPS:-8}
WARMUP=3
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
LOOM="$ROOT/$BUILD/tools/loom"
OUT=${OUT:-/tmp/loom-zero-step}
[ -x "$LOOM" ] || { echo "zero_step.sh: $LOOM not found: build first" >&2; exit 2; }
[ -n "${MAIN:-}" ] || { echo "zero_step.sh: set MAIN to the build folder to compare with" >&2; exit 2; }
[ -x "$MAIN/tools/loom" ] || { echo "zero_step.sh: $MAIN/tools/loom not found" >&2; exit 2; }
rm -rf "$OUT"
mkdir -p "$OUT" && cd "$OUT"
. "$ROOT/bench/zero_plans.sh"

PLANS=()
for dp in 2 4; do
  for zero in ${ZEROS:-0 2 3}; do
    zero_plan "$LOOM" "$ROOT" "$dp" "$zero"
    PLANS+=("dp$dp-zero$zero")
  done
done

run() {  # run BUILD_LABEL LOOM_BINARY PLAN_ID ROUND
  "$2" validate "plan-$3.json" --steps "$STEPS" --warmup "$WARMUP" --json >"$1-$3-$4.json"
}
for round in $(seq 1 "$ROUNDS"); do
  for id in "${PLANS[@]}"; do
    echo "== round $round $id" >&2
    if [ $((round % 2)) -eq 1 ]; then
      run this "$LOOM" "$id" "$round"
      run main "$MAIN/tools/loom" "$id" "$round"
    else
      run main "$MAIN/tools/loom" "$id" "$round"
      run this "$LOOM" "$id" "$round"
    fi
  done
done

python3 - "$ROUNDS" "${PLANS[@]}" <<'PY'
import json, random, statistics, sys
rounds, plans = int(sys.argv[1]), sys.argv[2:]
def steps(label, pid):
    return [json.load(open(f"{label}-{pid}-{r}.json"))["measured"]["step_time_s"]
            for r in range(1, rounds + 1)]
print("| plan | this build, step s per round | MAIN | median this / MAIN | ratio "
      "| per-round ratios | their median | 90 % interval |")
print("|---|---|---|---|---|---|---|---|")
rng = random.Random(1)
def interval(values):
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(4000))
    return medians[200], medians[3799]
for pid in plans:
    this, main = steps("this", pid), steps("main", pid)
    a, b = statistics.median(this), statistics.median(main)
    # Each round's two runs are side by side: their ratio cancels the machine's drift.
    paired = [t / m for t, m in zip(this, main)]
    low, high = interval(paired)
    print(f"| {pid} | {' '.join(f'{t:.3f}' for t in this)} | {' '.join(f'{t:.3f}' for t in main)}"
          f" | {a:.3f} / {b:.3f} | {a / b:.2f} | {' '.join(f'{r:.2f}' for r in paired)}"
          f" | {statistics.median(paired):.2f} | {low:.2f}-{high:.2f} |")
PY
