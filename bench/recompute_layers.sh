#!/usr/bin/env bash
# Recomputing some layers on this machine's CPUs: one dp=2 setting of mini-bert (4 layers,
# bench/models/mini-bert.json) planned with no, partial (the first 2 of 4 layers) and full
# recomputation; for each
#   loom plan ... -o plan.json                  the pinned plan
#   loom profile --for plan.json -o for.json    exactly its points (both layer variants for 2 of 4)
#   loom validate plan.json --profile for.json  predicted vs measured step time and peak memory
# and prints the three side by side, each figure the median over the passes (variants in
# alternating order), with the share of the none-to-full memory saving that partial
# recomputation gets, predicted and measured.
#
# Usage: bench/recompute_layers.sh [STEPS]   (default 14 steps, the first 5 left out; about 2 min
#        PASSES=3 BUILD=build-foo bench/recompute_layers.sh               a pass)
# Writes its files under ${OUT:-/tmp/loom-recompute-layers}/pass-K.
set -euo pipefail
STEPS=${1:-14}
PASSES=${PASSES:-2}
WARMUP=5
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
LOOM="$ROOT/$BUILD/tools/loom"
OUT=${OUT:-/tmp/loom-recompute-layers}
[ -x "$LOOM" ] || { echo "recompute_layers.sh: $LOOM not found: build first (make build)" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"

BASE="--model $ROOT/bench/models/mini-bert.json --cluster local-cpu --precision fp32
  --global-batch 16 --seq-len 128 --dp 2 --tp 1 --pp 1 --zero 0 --micro-batch 8"
# name|flags
VARIANTS=("none|--recompute none" "2 of 4|--recompute-layers 2" "full|--recompute full")

for ((pass = 1; pass <= PASSES; pass++)); do
  mkdir -p "$OUT/pass-$pass" && cd "$OUT/pass-$pass"
  ORDER=(0 1 2)
  ((pass % 2 == 0)) && ORDER=(2 1 0)
  for k in "${ORDER[@]}"; do
    IFS='|' read -r label flags <<<"${VARIANTS[k]}"
    echo "== pass $pass/$PASSES, recompute $label" >&2
    # shellcheck disable=SC2086
    "$LOOM" plan $BASE $flags -o "plan-$k.json" >/dev/null
    "$LOOM" profile --for "plan-$k.json" --repeats 10 -o "for-$k.json" >/dev/null 2>&1
    "$LOOM" validate "plan-$k.json" --profile "for-$k.json" --steps "$STEPS" --warmup $WARMUP \
      --json >"validate-$k.json" 2>"lines-$k.txt"
  done
  cd "$OUT"
done

python3 - "$PASSES" <<'PY'
import json, statistics, sys
passes = int(sys.argv[1])
med = statistics.median
names = ["none", "2 of 4", "full"]
rows = []
for k, name in enumerate(names):
    runs = [json.load(open(f"pass-{p}/validate-{k}.json")) for p in range(1, passes + 1)]
    pred = {key: med(r["predicted"][key] for r in runs) for key in ("step_time_s", "peak_memory_bytes")}
    meas = {key: med(r["measured"][key] for r in runs) for key in ("step_time_s", "peak_memory_bytes")}
    rows.append((name, pred, meas))
print("| recompute | predicted step s | measured step s | error | predicted peak MiB | "
      "measured peak MiB | error |")
print("|---|---|---|---|---|---|---|")
for name, pred, meas in rows:
    t = 100 * (pred["step_time_s"] / meas["step_time_s"] - 1)
    m = 100 * (pred["peak_memory_bytes"] / meas["peak_memory_bytes"] - 1)
    print(f"| {name} | {pred['step_time_s']:.4f} | {meas['step_time_s']:.4f} | {t:+.1f} % | "
          f"{pred['peak_memory_bytes'] / 2**20:.1f} | {meas['peak_memory_bytes'] / 2**20:.1f} | "
          f"{m:+.1f} % |")
def share(which):
    none, part, full = (r[1 if which == "predicted" else 2]["peak_memory_bytes"] for r in rows)
    return (none - part) / (none - full) if none != full else float("nan")
print(f"\nshare of the none-to-full peak-memory saving that 2 of 4 layers get: "
      f"predicted {share('predicted'):.2f}, measured {share('measured'):.2f} (median of {passes} passes)")
PY
