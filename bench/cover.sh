#!/usr/bin/env bash
# Profiles that cover the plan: for five model/batch settings on this machine's CPUs (tiny-bert,
# mini-bert and a 4-layer 128-hidden encoder from bench/models/enc4-128.json; dp=2 and tp=2 plans,
# one thread per rank as loom launch runs two ranks on two cores; none of them in
# bench/validation.sh), runs
#   loom plan ... -o plan.json                        the plan, predicted from the roofline
#   loom profile --for plan.json -o for.json          exactly the points the plan uses
#   loom validate plan.json --profile for.json        predicted (from that profile) vs measured
# and prints predicted against measured step time and the median |error|. For contrast it also
# predicts each plan from a general profile of the model (loom profile at this machine's 2
# threads, micro-batches 1 2 4 8 at the plan's sequence length: what a new user takes first), whose
# points the plan lacks (its threads per rank), and counts the extrapolated points of each.
#
# This VM's speed drifts by 10-25 % over minutes, so each plan's profile is taken just before it
# runs, and with PASSES > 1 the whole sequence repeats (plans in alternating order) and each
# figure is the median over the passes.
#
# Usage: bench/cover.sh [STEPS]      (default 14 steps, the first 5 left out; about 5 min a pass)
#        PASSES=2 BUILD=build-foo bench/cover.sh
# Writes its files under ${OUT:-/tmp/loom-cover}/pass-K.
set -euo pipefail
STEPS=${1:-14}
PASSES=${PASSES:-1}
WARMUP=5
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
LOOM="$ROOT/$BUILD/tools/loom"
OUT=${OUT:-/tmp/loom-cover}
[ -x "$LOOM" ] || { echo "cover.sh: $LOOM not found: build first (make build)" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"

MINI="$ROOT/bench/models/mini-bert.json"
ENC="$ROOT/bench/models/enc4-128.json"
# name|model|flags (global batch, sequence length and the pinned strategy)
PLANS=(
  "tiny-bert dp=2, b=4 x2, s=128|tiny-bert|--global-batch 16 --seq-len 128 --dp 2 --tp 1 --pp 1 --zero 0 --micro-batch 4"
  "tiny-bert tp=2, b=8 x2, s=32|tiny-bert|--global-batch 16 --seq-len 32 --dp 1 --tp 2 --pp 1 --micro-batch 8"
  "mini-bert dp=2 zero=1, b=4 x1, s=96|$MINI|--global-batch 8 --seq-len 96 --dp 2 --tp 1 --pp 1 --zero 1 --micro-batch 4"
  "enc4-128 dp=2, b=8 x2, s=64|$ENC|--global-batch 32 --seq-len 64 --dp 2 --tp 1 --pp 1 --zero 0 --micro-batch 8"
  "enc4-128 tp=2, b=16 x1, s=48|$ENC|--global-batch 16 --seq-len 48 --dp 1 --tp 2 --pp 1 --micro-batch 16"
)

for ((pass = 1; pass <= PASSES; pass++)); do
  mkdir -p "$OUT/pass-$pass" && cd "$OUT/pass-$pass"
  ORDER=()
  for ((k = 0; k < ${#PLANS[@]}; k++)); do ORDER+=("$k"); done
  if ((pass % 2 == 0)); then
    ORDER=()
    for ((k = ${#PLANS[@]} - 1; k >= 0; k--)); do ORDER+=("$k"); done
  fi
  for k in "${ORDER[@]}"; do
    IFS='|' read -r label model flags <<<"${PLANS[k]}"
    i=$((k + 1))
    echo "== pass $pass/$PASSES, plan $i: $label" >&2
    seq=$(sed -E 's/.*--seq-len ([0-9]+).*/\1/' <<<"$flags")
    # shellcheck disable=SC2086
    "$LOOM" plan --model "$model" --cluster local-cpu --precision fp32 $flags -o "plan-$i.json" \
      >/dev/null
    # The general profile a new user takes first: this machine's threads for one process.
    "$LOOM" profile --model "$model" --seq-len "$seq" --micro-batch 1 2 4 8 --repeats 10 \
      -o "general-$i.json" >/dev/null 2>&1
    "$LOOM" simulate "plan-$i.json" --profile "general-$i.json" --json \
      >"general-$i.sim.json" 2>"general-$i.lines"
    # What the plan needs, measured by its two ranks side by side, then the run.
    "$LOOM" profile --for "plan-$i.json" --repeats 10 -o "for-$i.json" >/dev/null 2>&1
    "$LOOM" validate "plan-$i.json" --profile "for-$i.json" --steps "$STEPS" --warmup $WARMUP \
      --json >"validate-$i.json" 2>"for-$i.lines"
    echo "$label" >"label-$i.txt"
  done
  cd "$OUT"
done

python3 - "${#PLANS[@]}" "$PASSES" <<'PY'
import json, statistics, sys
n, passes = int(sys.argv[1]), int(sys.argv[2])
med = statistics.median
rows = []
print("| # | plan | predicted s (--for) | measured s | error | extrapolated points | "
      "predicted s (general profile) | error | extrapolated points |")
print("|---|---|---|---|---|---|---|---|---|")
for i in range(1, n + 1):
    label = open(f"pass-1/label-{i}.txt").read().strip()
    runs = [json.load(open(f"pass-{k}/validate-{i}.json")) for k in range(1, passes + 1)]
    general = [json.load(open(f"pass-{k}/general-{i}.sim.json")) for k in range(1, passes + 1)]
    pt = [r["predicted"]["step_time_s"] for r in runs]
    mt = [r["measured"]["step_time_s"] for r in runs]
    gt = [g["step_time_s"] for g in general]
    err = med(p / m - 1 for p, m in zip(pt, mt))
    gerr = med(g / m - 1 for g, m in zip(gt, mt))
    lines = max(len(r.get("extrapolated", [])) for r in runs)
    glines = max(len(g.get("extrapolated", [])) for g in general)
    rows.append((err, gerr))
    print(f"| {i} | {label} | {med(pt):.4f} | {med(mt):.4f} | {100*err:+.1f} % | {lines} | "
          f"{med(gt):.4f} | {100*gerr:+.1f} % | {glines} |")
print(f"\nmedian |error| of step time over {n} plans (each the median of {passes} pass(es)): "
      f"{100*med(abs(r[0]) for r in rows):.1f} % with loom profile --for, "
      f"{100*med(abs(r[1]) for r in rows):.1f} % with the general profile")
PY
