#!/usr/bin/env bash
# loom tune on this machine's CPU cluster (local-cpu) for 5 model/batch settings: for each, a
# quick profile of the layers (one rank with 2 threads, two launched ranks with 1 thread each) and
# the links, then `loom tune --top 3` with that profile, which measures the prediction's best 3
# plans and keeps the fastest. Reported per setting: the regret of the predicted-first plan (from
# the tune's own measurements), and whether the tuned plan is slower than the predicted-first by
# more than the measurement noise. For that the two plans are measured again afterwards,
# alternately, RERUNS times each (default 2): the noise is the spread (max - min) / min of the
# predicted-first plan's runs (its tune measurement and the re-runs), and the tuned plan counts as
# slower only when the median of its re-runs exceeds the predicted-first's by more than that.
#
# Usage: bench/tune.sh                      (about 10 min on the 2-core build machine)
#        STEPS=12 WARMUP=4 RERUNS=2 BUILD=build OUT=/tmp/loom-tune bench/tune.sh
set -euo pipefail
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
RERUNS=${RERUNS:-2}
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
LOOM="$ROOT/$BUILD/tools/loom"
OUT=${OUT:-/tmp/loom-tune}
[ -x "$LOOM" ] || { echo "tune.sh: $LOOM not found: build first (make build)" >&2; exit 2; }
command -v jq >/dev/null || { echo "tune.sh: needs jq" >&2; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"

# A 4-layer, hidden-128 encoder of another shape than tiny-bert: RoBERTa-style, 2 heads, a
# narrow MLP and a small vocabulary.
cat >enc-4x128.json <<'EOF'
{
  "format": "loom-model/1",
  "name": "enc-4x128",
  "family": "encoder",
  "model_type": "roberta",
  "layers": 4,
  "hidden": 128,
  "heads": 2,
  "ffn_hidden": 256,
  "vocab": 8192,
  "max_positions": 514,
  "type_vocab": 1,
  "num_labels": 2,
  "tied_embeddings": true,
  "source": "a 4-layer, hidden-128 encoder for bench/tune.sh"
}
EOF
MINI="$ROOT/bench/models/mini-bert.json"
# name|model|global batch|seq len
SETTINGS=(
  "tiny-bert b16 s64|tiny-bert|16|64"
  "tiny-bert b32 s32|tiny-bert|32|32"
  "mini-bert b16 s64|$MINI|16|64"
  "mini-bert b8 s128|$MINI|8|128"
  "enc-4x128 b16 s128|$OUT/enc-4x128.json|16|128"
)

# validate PLAN: the plan's measured median step time (s).
validate() {
  "$LOOM" validate "$1" --steps "$STEPS" --warmup "$WARMUP" --json 2>/dev/null |
    jq -r '.measured.step_time_s'
}
# median of the arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

echo "== links (2 ranks)" >&2
"$LOOM" launch --nproc 2 -- loom profile --links --repeats 5 -o links.json >/dev/null 2>&1
ROWS=()
i=0
for row in "${SETTINGS[@]}"; do
  IFS='|' read -r label model batch seq <<<"$row"
  i=$((i + 1))
  mkdir -p "s$i" && cd "s$i"
  echo "== $label: profile" >&2
  mbs=()
  for b in 1 2 4 8 16 32; do ((b <= batch)) && mbs+=("$b"); done
  "$LOOM" profile --model "$model" --seq-len "$seq" --micro-batch "${mbs[@]}" --threads 2 \
    --repeats 5 -o profile-2t.json >/dev/null 2>&1
  "$LOOM" launch --nproc 2 -- loom profile --model "$model" --seq-len "$seq" \
    --micro-batch "${mbs[@]}" --threads 1 --tp 1 2 --repeats 5 -o profile-1t.json >/dev/null 2>&1
  echo "== $label: loom tune --top 3" >&2
  "$LOOM" tune --model "$model" --cluster local-cpu --global-batch "$batch" --seq-len "$seq" \
    --precision fp32 --profile profile-2t.json --profile profile-1t.json --profile ../links.json \
    --top 3 --steps "$STEPS" --warmup "$WARMUP" --keep keep --resume measured.json \
    -o tuned.json >tune.txt
  cat tune.txt >&2
  best_rank=$(jq -r '.tuned.predicted_rank' tuned.json)
  regret=$(jq -r '.tuned.regret // "null"' tuned.json)
  first_s=$(jq -r '.tuned.candidates[0].measured_step_time_s // "null"' tuned.json)
  echo "== $label: re-measuring the predicted-first and the tuned plan" >&2
  firsts=()
  tuneds=()
  [ "$first_s" != null ] && firsts+=("$first_s")
  for ((k = 0; k < RERUNS; k++)); do
    [ "$first_s" != null ] && firsts+=("$(validate keep/candidate-1.json)")
    if [ "$best_rank" != 1 ]; then tuneds+=("$(validate tuned.json)"); fi
  done
  verdict="-"
  noise="-"
  slower="-"
  if [ "$first_s" != null ]; then
    noise=$(printf '%s\n' "${firsts[@]}" | sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.1f", 100*(hi-lo)/lo}')
    first_med=$(median "${firsts[@]:1}")
    if [ "$best_rank" = 1 ]; then
      slower="0.0"
    else
      slower=$(awk -v t="$(median "${tuneds[@]}")" -v f="$first_med" 'BEGIN {printf "%+.1f", 100*(t-f)/f}')
    fi
    verdict=$(awk -v s="$slower" -v n="$noise" 'BEGIN {print (s > n ? "yes" : "no")}')
  fi
  runs=$(jq -r '[.tuned.candidates[] | "#\(.predicted_rank) \(if .measured_step_time_s then "\(.measured_step_time_s * 1000 | round) ms" else "failed" end)"] | join(", ")' tuned.json)
  regret_pct=$([ "$regret" = null ] && echo "-" || awk -v r="$regret" 'BEGIN {printf "%.1f", 100*r}')
  ms() { printf '%s\n' "$@" | awk '{printf "%s%.0f", (NR > 1 ? ", " : ""), 1000 * $1}'; }
  first_runs=$([ ${#firsts[@]} -gt 0 ] && ms "${firsts[@]}" || echo "-")
  tuned_runs=$([ ${#tuneds[@]} -gt 0 ] && ms "${tuneds[@]}" || echo "(the same plan)")
  ROWS+=("$(printf '| %s | %s | #%s | %s %% | %s | %s | %s %% | %s %% | %s |' "$label" "$runs" \
    "$best_rank" "$regret_pct" "$first_runs" "$tuned_runs" "$noise" "$slower" "$verdict")")
  cd "$OUT"
done

echo
echo "| setting | tune's measurements (predicted rank: median step) | tuned | regret of predicted-first | predicted-first runs (tune's, re-runs; ms) | tuned re-runs (ms) | noise (spread of predicted-first's runs) | tuned vs predicted-first (medians of re-runs) | tuned slower beyond noise? |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
