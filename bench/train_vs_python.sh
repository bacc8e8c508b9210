#!/usr/bin/env bash
# Training speed of bert-base (seq 128, batch 8, fp32, CPU) in loom's C++ executor against the
# same model in plain PyTorch (bench/python_bert.py, Debian's python3-torch), in one run, side by
# side: ROUNDS rounds, each running both (alternating which goes first), with the same number of
# torch threads (OMP_NUM_THREADS and torch.set_num_threads = THREADS).
#
# Both time whole training steps (forward, cross-entropy, backward, gradient clipping to norm 1,
# AdamW lr 2e-5 / weight decay 0.01 with a linear schedule, dropout 0.1) after one untimed warm-up
# step; loom tokenizes its synthetic reviews before training (not timed) and its per-step times
# come from its metrics file (step_time_s of steps 2..). Prints the per-round medians, the
# median over all timed steps of each side and the ratio.
#
# Usage: bench/train_vs_python.sh [ROUNDS] [STEPS] [THREADS]   (defaults 3, 4, 2: about 2.5 min)
#        BUILD=build-foo bench/train_vs_python.sh ...           (default BUILD=build)
# Needs: the built loom ($BUILD/tools/loom) and python3-torch (apt-get install python3-torch).
set -euo pipefail

ROUNDS=${1:-3}
STEPS=${2:-4}
THREADS=${3:-2}
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LOOM="$BUILD/tools/loom"
PY=/usr/bin/python3 # Debian's, with python3-torch; not a pyenv python3 on PATH

[ -x "$LOOM" ] || { echo "train_vs_python.sh: $LOOM not found: build first (make build)" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || {
  echo "train_vs_python.sh: $PY has no torch: apt-get install python3-torch" >&2
  exit 2
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# local-cpu with one device: a one-rank plan.
"$PY" - "$tmp/cpu-1.json" <<'EOF'
import json, sys
cluster = json.load(open("profiles/clusters/local-cpu.json"))
cluster["name"] = "local-cpu (1 rank)"
cluster["devices_per_node"] = 1
json.dump(cluster, open(sys.argv[1], "w"), indent=2)
EOF
"$LOOM" plan --model bert-base --cluster "$tmp/cpu-1.json" --global-batch 8 --seq-len 128 \
  --precision fp32 --micro-batch 8 -o "$tmp/plan.json" >/dev/null

export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS

run_cpp() { # $1 = round
  # 2000 synthetic reviews, 8 held out (one evaluation batch after the last step, not timed).
  "$LOOM" train "$tmp/plan.json" --data synthetic:2000 --validation-fraction 0.004 \
    --steps $((STEPS + 1)) --metrics "$tmp/cpp-$1.jsonl" --json >"$tmp/cpp-$1.json"
}
run_python() { # $1 = round
  "$PY" bench/python_bert.py --steps "$STEPS" --warmup 1 --threads "$THREADS" >"$tmp/py-$1.json"
}

echo "bert-base, batch 8, seq 128, fp32, $THREADS threads, $ROUNDS rounds of 1 + $STEPS steps each"
for round in $(seq 1 "$ROUNDS"); do
  if ((round % 2 == 1)); then
    run_cpp "$round"
    run_python "$round"
  else
    run_python "$round"
    run_cpp "$round"
  fi
  "$PY" - "$tmp" "$round" <<'EOF'
import json, statistics, sys
tmp, r = sys.argv[1], sys.argv[2]
cpp = [json.loads(l) for l in open(f"{tmp}/cpp-{r}.jsonl")]
cpp = [l["step_time_s"] for l in cpp if "eval" not in l and l["step"] >= 2]
py = json.load(open(f"{tmp}/py-{r}.json"))["step_times_s"]
c, p = statistics.median(cpp), statistics.median(py)
print(f"round {r}: loom {c:.3f} s/step, python {p:.3f} s/step, loom/python {c / p:.3f}")
EOF
done

"$PY" - "$tmp" "$ROUNDS" <<'EOF'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
cpp, py = [], []
for r in range(1, rounds + 1):
    cpp += [l["step_time_s"] for l in map(json.loads, open(f"{tmp}/cpp-{r}.jsonl"))
            if "eval" not in l and l["step"] >= 2]
    py += json.load(open(f"{tmp}/py-{r}.json"))["step_times_s"]
c, p = statistics.median(cpp), statistics.median(py)
print(f"loom   median {c:.3f} s/step ({8 / c:.2f} samples/s) over {len(cpp)} steps, "
      f"min {min(cpp):.3f} max {max(cpp):.3f}")
print(f"python median {p:.3f} s/step ({8 / p:.2f} samples/s) over {len(py)} steps, "
      f"min {min(py):.3f} max {max(py):.3f}")
print(f"loom / python step time: {c / p:.3f} ({'loom faster' if c < p else 'python faster'})")
EOF
