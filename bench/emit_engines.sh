#!/usr/bin/env bash
# Checks what `loom plan --emit` writes with the engines' own code, on this CPU-only machine:
# plans a set of strategies with `loom plan`, emits each for Megatron-LM, DeepSpeed and PyTorch
# FSDP (as the runtime runs the strategy), and feeds every result to bench/emit_engines.py:
#
#   Megatron-LM  the torchrun line through torch.distributed.run's parser, the arguments through
#                megatron/training/arguments.py's parse_args and validate_args (with the
#                environment the line sets), a pipeline layout through
#                PipelineParallelLayerLayout.validate_layer_layout
#   DeepSpeed    ds_config.json through DeepSpeedConfig with the data-parallel size the script's
#                topology gives, the launch line through deepspeed/launcher/runner.py's
#                parse_args, a multi-node hostfile through its hostfile parser
#   FSDP         the torchrun line through torch.distributed.run's parser
#
# Multi-node lines must carry a rendezvous endpoint or node rank and master address.
# Prints one line per (plan, engine), accepted or rejected with the engine's message, and a
# count; exits 1 when any is rejected.
#
# Usage: MEGATRON=/path/to/Megatron-LM DEEPSPEED=/path/to/DeepSpeed bench/emit_engines.sh
#        BUILD=build-foo ...   (the build folder holding `loom`, relative to the repository or
#                               absolute; default build)
# The engines' checkouts are the user's (nothing is downloaded); Python is Debian's
# /usr/bin/python3 with python3-torch, python3-numpy, python3-packaging, python3-psutil,
# python3-cpuinfo, python3-msgpack, python3-tqdm; DeepSpeed also needs pydantic 2 (PYDANTIC=the
# site-packages folder holding pydantic, pydantic_core, annotated_types, typing_extensions and
# typing_inspection, when /usr/bin/python3 lacks it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=${BUILD:-build}
case "$BUILD" in /*) LOOM="$BUILD/tools/loom" ;; *) LOOM="$ROOT/$BUILD/tools/loom" ;; esac
PY=${PY:-/usr/bin/python3}
: "${MEGATRON:?set MEGATRON to a Megatron-LM checkout}"
: "${DEEPSPEED:?set DEEPSPEED to a DeepSpeed checkout}"
[ -x "$LOOM" ] || { echo "no $LOOM: build loom first" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Pydantic 2 for DeepSpeed's configuration models, from another Python's site-packages.
if ! "$PY" -c 'import pydantic, sys; sys.exit(int(pydantic.VERSION.split(".")[0]) < 2)' 2>/dev/null; then
  : "${PYDANTIC:?/usr/bin/python3 lacks pydantic 2: set PYDANTIC to a site-packages folder with it}"
  mkdir -p "$WORK/pydeps"
  for p in pydantic pydantic_core annotated_types typing_extensions.py typing_inspection; do
    ln -s "$PYDANTIC/$p" "$WORK/pydeps/$p"
  done
  export PYTHONPATH="$WORK/pydeps${PYTHONPATH:+:$PYTHONPATH}"
fi

# Llama-shaped decoders (a gated MLP, grouped-query attention, untied output).
cat > "$WORK/llama-7b.json" <<'JSON'
{"format": "loom-model/1", "name": "llama-7b", "family": "decoder", "layers": 32,
 "hidden": 4096, "heads": 32, "ffn_hidden": 11008, "vocab": 32000, "max_positions": 4096,
 "tied_embeddings": false, "mlp": "swiglu"}
JSON
cat > "$WORK/llama-70b.json" <<'JSON'
{"format": "loom-model/1", "name": "llama-70b", "family": "decoder", "layers": 80,
 "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672, "vocab": 32000,
 "max_positions": 4096, "tied_embeddings": false, "mlp": "swiglu"}
JSON
L7="$WORK/llama-7b.json"
L70="$WORK/llama-70b.json"

# name | engines | GPU generation (8 A100, 9 H100) | loom plan arguments
CASES=(
  "gpt2-tp2-pp2-zero1|megatron deepspeed|8|--model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 2 --pp 2 --dp 2 --micro-batch 2 --schedule 1f1b --recompute none --zero 1"
  "llama7b-tp4-sp-selective|megatron deepspeed fsdp|8|--model $L7 --cluster dgx-a100-80g --global-batch 64 --seq-len 4096 --tp 4 --pp 1 --dp 2 --micro-batch 2 --sp on --recompute selective --zero 0"
  "gpt2-uneven-7-5|megatron|8|--model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 1 --pp 2 --dp 4 --micro-batch 2 --schedule 1f1b --recompute none --zero 0 --stages 0-7,8-13"
  "gpt2-pp5-balanced|megatron|8|--model gpt2 --cluster dgx-a100-80g --gpus 5 --global-batch 64 --seq-len 1024 --tp 1 --pp 5 --dp 1 --micro-batch 2 --schedule 1f1b --recompute none --zero 0"
  "llama7b-pp3-11-11-10|megatron fsdp|8|--model $L7 --cluster dgx-a100-80g --gpus 6 --global-batch 48 --seq-len 4096 --tp 2 --pp 3 --dp 1 --micro-batch 1 --schedule 1f1b --recompute full --zero 0"
  "llama7b-interleaved-pp2-v3|megatron|8|--model $L7 --cluster dgx-a100-80g --global-batch 64 --seq-len 4096 --tp 2 --pp 2 --dp 2 --micro-batch 1 --schedule interleaved --virtual-stages 3 --recompute full --zero 1"
  "gpt2-interleaved-pp4-v3|megatron|8|--model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 1 --pp 4 --dp 2 --micro-batch 2 --schedule interleaved --virtual-stages 3 --recompute none --zero 0"
  "llama70b-4nodes-tp8-pp4|megatron deepspeed fsdp|8|--model $L70 --cluster dgx-a100-80g --nodes 4 --global-batch 128 --seq-len 4096 --tp 8 --pp 4 --dp 1 --micro-batch 1 --schedule 1f1b --recompute full --zero 0"
  "gpt2xl-zero2|deepspeed fsdp|8|--model gpt2-xl --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 1 --pp 1 --dp 8 --micro-batch 8 --zero 2 --recompute none"
  "gpt2xl-zero3-2nodes|deepspeed fsdp|8|--model gpt2-xl --cluster dgx-a100-80g --nodes 2 --global-batch 128 --seq-len 1024 --tp 1 --pp 1 --dp 16 --micro-batch 4 --zero 3 --recompute selective"
  "llama7b-fp8-h100|megatron fsdp|9|--model $L7 --cluster dgx-h100 --precision fp8 --global-batch 64 --seq-len 4096 --tp 2 --pp 1 --dp 4 --micro-batch 1 --sp on --recompute none --zero 0"
  "llama7b-compile|deepspeed fsdp|9|--model $L7 --cluster dgx-h100 --compile on --global-batch 64 --seq-len 2048 --tp 1 --pp 1 --dp 8 --micro-batch 2 --zero 3 --recompute full"
  "gpt3-175b-16nodes|megatron|8|--model gpt3-175b --cluster dgx-a100-80g --nodes 16 --global-batch 512 --seq-len 2048 --tp 8 --pp 8 --dp 2 --micro-batch 1 --schedule 1f1b --recompute full --zero 1"
  "bert-large-encoder|megatron deepspeed|8|--model bert-large --cluster dgx-a100-80g --global-batch 256 --seq-len 512 --tp 1 --pp 1 --dp 8 --micro-batch 32 --zero 1 --recompute none"
  "bert-large-tf32-tp2|megatron deepspeed fsdp|8|--model bert-large --cluster dgx-a100-80g --precision tf32 --global-batch 256 --seq-len 512 --tp 2 --pp 1 --dp 4 --micro-batch 16 --sp off --zero 0 --recompute selective"
)

for engine in megatron deepspeed fsdp; do : > "$WORK/$engine.list"; done
plans=0
failed=0
for c in "${CASES[@]}"; do
  IFS='|' read -r name engines arch args <<<"$c"
  plans=$((plans + 1))
  for engine in $engines; do
    # shellcheck disable=SC2086  # the plan's arguments are words
    if "$LOOM" plan $args --runtime "$engine" --emit "$engine" >"$WORK/$name.$engine.sh" \
      2>"$WORK/$name.$engine.err"; then
      printf '%s\t%s\t%s\n' "$name" "$arch" "$WORK/$name.$engine.sh" >>"$WORK/$engine.list"
    else
      echo "$name $engine: loom plan failed: $(tail -1 "$WORK/$name.$engine.err")"
      failed=$((failed + 1))
    fi
  done
done

status=0
for engine in megatron deepspeed fsdp; do
  # The engines log to stdout too: only the verdicts are kept.
  PYTORCH_JIT=0 "$PY" "$ROOT/bench/emit_engines.py" "$engine" "$WORK/$engine.list" \
    2>"$WORK/$engine.log" | grep -E "^[^ ]+ $engine: (accepted|rejected)" | tee -a "$WORK/results" \
    || status=1
  if [ "$(wc -l <"$WORK/$engine.list")" -ne "$(grep -c " $engine: " "$WORK/results" || true)" ]; then
    echo "$engine: the check stopped early:" && tail -5 "$WORK/$engine.log"
    status=1
  fi
done
accepted=$(grep -c ': accepted$' "$WORK/results" || true)
total=$(($(wc -l <"$WORK/results") + failed))
echo "$accepted of $total accepted ($plans plans; Megatron-LM $(git -C "$MEGATRON" rev-parse --short=8 HEAD 2>/dev/null || echo "at $MEGATRON"), DeepSpeed $(cat "$DEEPSPEED/version.txt" 2>/dev/null || echo "at $DEEPSPEED"))"
[ "$failed" -eq 0 ] || status=1
exit $status
