#!/usr/bin/env bash
# ZeRO memory on this machine's CPUs: peak memory per rank of mini-bert (4 layers, hidden 256,
# 11.2 M parameters: fp32 model states of 179 MB dominate a micro-batch of 2 x 64 tokens) for
# ZeRO 0/1/2/3 at dp = 2 and 4, each plan run with `loom validate` (through loom launch, as
# bench/validation.sh runs plans). Prints, per plan, the measured and predicted peak (and the
# relative error), the model-state bytes of ZeRO's formulas (Rajbhandari et al. 2020: 4 + 4 + 8
# bytes per parameter, sharded by stage; ZeRO-3 adds its gathered blocks), and the measured and
# formula savings against ZeRO-0 at the same dp. With MAIN=DIR (a build folder of another
# commit, e.g. /work/main/build) each plan also runs with that build's loom, right after this
# one's, for step times side by side (the median step of each; this VM's speed drifts, so the two
# alternate plan by plan).
#
# Four ranks share this machine's two cores through a copy of local-cpu with four devices (the
# memory per rank is what counts; their step times are oversubscribed).
#
# Usage: bench/zero_memory.sh [STEPS]        (default 8 steps, the first 3 left out)
#        MAIN=../loom-before/build BUILD=build bench/zero_memory.sh
#        DPS="4" KEEP=1 bench/zero_memory.sh (only dp = 4, keeping the files of earlier runs)
# Writes its files under ${OUT:-/tmp/loom-zero-memory}.
set -euo pipefail
STEPS=${1:-8}
WARMUP=3
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
LOOM="$ROOT/$BUILD/tools/loom"
OUT=${OUT:-/tmp/loom-zero-memory}
[ -x "$LOOM" ] || { echo "zero_memory.sh: $LOOM not found: build first" >&2; exit 2; }
if [ -n "${MAIN:-}" ] && [ ! -x "$MAIN/tools/loom" ]; then
  echo "zero_memory.sh: $MAIN/tools/loom not found" >&2
  exit 2
fi
[ -n "${KEEP:-}" ] || rm -rf "$OUT"
mkdir -p "$OUT" && cd "$OUT"
. "$ROOT/bench/zero_plans.sh"

for dp in ${DPS:-2 4}; do
  for zero in 0 1 2 3; do
    id="dp$dp-zero$zero"
    zero_plan "$LOOM" "$ROOT" "$dp" "$zero"
    echo "== $id" >&2
    "$LOOM" validate "plan-$id.json" --steps "$STEPS" --warmup $WARMUP --json >"validate-$id.json"
    if [ -n "${MAIN:-}" ]; then
      "$MAIN/tools/loom" validate "plan-$id.json" --steps "$STEPS" --warmup $WARMUP --json \
        >"main-$id.json"
    fi
  done
done

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
MiB = 1 << 20
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
print("| plan | measured peak MiB | predicted MiB | error | ZeRO formula states MiB "
      "| predicted buffers MiB | measured saving vs ZeRO-0 MiB | formula saving MiB "
      "| step s | main: step s | main: peak MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for dp in (2, 4):
    base = None
    for zero in range(4):
        pid = f"dp{dp}-zero{zero}"
        if load(f"validate-{pid}.json") is None:
            continue
        plan, v, main = load(f"plan-{pid}.json"), load(f"validate-{pid}.json"), load(f"main-{pid}.json")
        mem = plan["predicted"]["memory_bytes_by_stage"][0]
        formula = mem["parameters"] + mem["gradients"] + mem["optimizer"]
        measured = v["measured"]["peak_memory_bytes"]
        predicted = v["predicted"]["peak_memory_bytes"]
        if zero == 0:
            base = (measured, formula)
        row = [pid, f"{measured / MiB:.1f}", f"{predicted / MiB:.1f}",
               f"{100 * (predicted - measured) / measured:+.1f} %", f"{formula / MiB:.1f}",
               f"{mem['buffers'] / MiB:.1f}", f"{(base[0] - measured) / MiB:.1f}",
               f"{(base[1] - formula) / MiB:.1f}", f"{v['measured']['step_time_s']:.3f}",
               f"{main['measured']['step_time_s']:.3f}" if main else "-",
               f"{main['measured']['peak_memory_bytes'] / MiB:.1f}" if main else "-"]
        print("| " + " | ".join(row) + " |")
PY
