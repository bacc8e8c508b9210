#!/usr/bin/env bash
# The validation set of issue 7: plans on this machine's CPUs (1 and 2 ranks; DP, ZeRO 1-3, TP,
# PP gpipe/1f1b with several micro-batch counts, recomputation on and off; tiny-bert and
# mini-bert), each predicted with a measured profile (loom profile for the layers and the
# optimizer, loom profile --links inside a 2-rank launch for the links) and then measured with
# loom validate. Prints one row per plan (predicted, measured, relative error of step time and
# peak memory), the median |error| of each, and the ranking check: the plan loom plan ranks first
# for each job against the fastest measured plan of that job.
#
# Usage: bench/validation.sh [STEPS]       (default 12 steps, the first 3 left out: ~4 min)
#        BUILD=build-foo bench/validation.sh
# Writes its files under ${OUT:-/tmp/loom-validation}.
set -euo pipefail
STEPS=${1:-12}
WARMUP=3
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
LOOM="$ROOT/$BUILD/tools/loom"
OUT=${OUT:-/tmp/loom-validation}
[ -x "$LOOM" ] || { echo "validation.sh: $LOOM not found: build first (make build)" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"

SEQ=64
BATCH=16
MINI="$ROOT/bench/models/mini-bert.json"
# One rank uses both cores (2 threads); two ranks get one core each and run side by side, so their
# layers are measured the same way: two profiling ranks at once (loom launch), one thread each.
echo "== profiles (layers: 1 rank x 2 threads, 2 ranks x 1 thread; optimizer; links)" >&2
for model in tiny-bert "$MINI"; do
  name=$(basename "$model" .json)
  "$LOOM" profile --model "$model" --seq-len $SEQ --micro-batch 2 4 8 16 --threads 2 \
    --recompute none selective full --repeats 10 -o "profile-$name-2t.json" 2>/dev/null
  "$LOOM" launch --nproc 2 -- loom profile --model "$model" --seq-len $SEQ --micro-batch 2 4 8 16 \
    --threads 1 --tp 1 2 --recompute none selective full --repeats 10 -o "profile-$name-1t.json" >/dev/null 2>&1
done
"$LOOM" launch --nproc 2 -- loom profile --links --repeats 10 -o links.json >/dev/null

# name|model|flags
PLANS=(
  "1 rank, b=8 x2|tiny-bert|--dp 1 --tp 1 --pp 1 --micro-batch 8"
  "1 rank, b=16 x1|tiny-bert|--dp 1 --tp 1 --pp 1 --micro-batch 16"
  "1 rank, b=4 x4|tiny-bert|--dp 1 --tp 1 --pp 1 --micro-batch 4"
  "1 rank, b=8 x2, full recompute|tiny-bert|--dp 1 --tp 1 --pp 1 --micro-batch 8 --recompute full"
  "1 rank, b=8 x2, selective|tiny-bert|--dp 1 --tp 1 --pp 1 --micro-batch 8 --recompute selective"
  "dp=2|tiny-bert|--dp 2 --zero 0 --micro-batch 8"
  "dp=2 zero=1|tiny-bert|--dp 2 --zero 1 --micro-batch 8"
  "dp=2 zero=2, b=4 x2|tiny-bert|--dp 2 --zero 2 --micro-batch 4"
  "dp=2 zero=3|tiny-bert|--dp 2 --zero 3 --micro-batch 8"
  "tp=2|tiny-bert|--tp 2 --dp 1 --pp 1 --micro-batch 16"
  "pp=2 gpipe, b=4 x4|tiny-bert|--pp 2 --dp 1 --tp 1 --schedule gpipe --micro-batch 4"
  "pp=2 1f1b, b=4 x4|tiny-bert|--pp 2 --dp 1 --tp 1 --schedule 1f1b --micro-batch 4"
  "pp=2 1f1b, b=2 x8|tiny-bert|--pp 2 --dp 1 --tp 1 --schedule 1f1b --micro-batch 2"
  "pp=2 1f1b, b=4 x4, full recompute|tiny-bert|--pp 2 --dp 1 --tp 1 --schedule 1f1b --micro-batch 4 --recompute full"
  "mini: 1 rank, b=8 x2|$MINI|--dp 1 --tp 1 --pp 1 --micro-batch 8"
  "mini: 1 rank, b=8 x2, full recompute|$MINI|--dp 1 --tp 1 --pp 1 --micro-batch 8 --recompute full"
  "mini: dp=2 zero=1|$MINI|--dp 2 --zero 1 --micro-batch 8"
  "mini: pp=2 1f1b, b=4 x4|$MINI|--pp 2 --dp 1 --tp 1 --schedule 1f1b --micro-batch 4"
)

echo "== validating ${#PLANS[@]} plans, $STEPS steps each (median of steps $((WARMUP + 1))-$STEPS)" >&2
i=0
for row in "${PLANS[@]}"; do
  IFS='|' read -r label model flags <<<"$row"
  name=$(basename "$model" .json)
  i=$((i + 1))
  # shellcheck disable=SC2086
  "$LOOM" plan --model "$model" --cluster local-cpu --global-batch $BATCH --seq-len $SEQ \
    --precision fp32 --profile "profile-$name-2t.json" --profile "profile-$name-1t.json" \
    --profile links.json $flags -o "plan-$i.json" >/dev/null
  "$LOOM" validate "plan-$i.json" --steps "$STEPS" --warmup $WARMUP --json >"validate-$i.json"
  echo "$label|$name" >"label-$i.txt"
done
# The planner's own choice for each job, validated the same way.
for model in tiny-bert "$MINI"; do
  name=$(basename "$model" .json)
  "$LOOM" plan --model "$model" --cluster local-cpu --global-batch $BATCH --seq-len $SEQ \
    --precision fp32 --profile "profile-$name-2t.json" --profile "profile-$name-1t.json" \
    --profile links.json -o "best-$name.json" >/dev/null
  "$LOOM" validate "best-$name.json" --steps "$STEPS" --warmup $WARMUP --json >"validate-best-$name.json"
done

python3 - "$i" <<'PY'
import json, statistics, sys
n = int(sys.argv[1])
rows, by_model = [], {}
print(f"| # | plan | model | predicted s | measured s | error | predicted MiB | measured MiB | error |")
print(f"|---|---|---|---|---|---|---|---|---|")
for i in range(1, n + 1):
    label, model = open(f"label-{i}.txt").read().strip().split("|")
    v = json.load(open(f"validate-{i}.json"))
    p, m, e = v["predicted"], v["measured"], v["relative_error"]
    rows.append((e["step_time"], e["peak_memory"]))
    by_model.setdefault(model, []).append((m["step_time_s"], label))
    print(f"| {i} | {label} | {model} | {p['step_time_s']:.4f} | {m['step_time_s']:.4f} | "
          f"{100*e['step_time']:+.1f} % | {p['peak_memory_bytes']/2**20:.1f} | "
          f"{m['peak_memory_bytes']/2**20:.1f} | {100*e['peak_memory']:+.1f} % |")
t = statistics.median(abs(r[0]) for r in rows)
mem = statistics.median(abs(r[1]) for r in rows)
print(f"\nmedian |error|: step time {100*t:.1f} %, peak memory {100*mem:.1f} % over {n} plans")
for model, measured in by_model.items():
    v = json.load(open(f"validate-best-{model}.json"))
    plan = json.load(open(f"best-{model}.json"))["strategy"]
    best_t, best_label = min(measured)
    chosen = v["measured"]["step_time_s"]
    desc = f"dp={plan['dp']} tp={plan['tp']} pp={plan['pp']} zero={plan['zero']} b={plan['micro_batch']} {plan['schedule']} recompute={plan['recompute']}"
    print(f"{model}: planner's first plan ({desc}) measured {chosen:.4f} s; fastest of the set "
          f"'{best_label}' {best_t:.4f} s: {100*(chosen/best_t-1):+.1f} %")
PY
