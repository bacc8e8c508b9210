#!/usr/bin/env bash
# The GPU checks on one GPU (an H100 or H200), each stage's logs
# under $OUT, a table of every figure at the end ($OUT/table.md). CI has no GPU and never runs
# this; it needs the GPU machine's CUDA PyTorch (its LibTorch builds Loom), transformers, and the
# Debian packages of Loom's header-only dependencies and libutf8proc, unpacked into .devdeps/
# beside the checkout (the GPU machine has no package access).
#
# Usage: bench/gpu.sh [STAGE...]      (default: all but memory and precision, in this order)
#   env         the machine: GPU, driver, CUDA, torch (and its C++ ABI), transformers, compilers
#   build       configures build-gpu/ against the CUDA LibTorch and builds loom
#   logits      tiny random BERT and RoBERTa made with transformers: loom logits against
#               transformers' (fp32 within 1e-4 relative, bf16 within 2e-2)
#   losses      the tiny BERT's first 5 training steps, fp32, no dropout, the batches loom trained
#               on replayed by transformers (within 1e-3)
#   throughput  BERT-base and BERT-large, seq 128 and 512, bf16: loom train against transformers
#               eager (autocast) and torch.compile, samples/s side by side, and loom's MFU (the
#               plan's model FLOPs per step over the measured step, against the measured bf16
#               matmul rate). Batches: B_BASE128, B_BASE512, B_LARGE128, B_LARGE512, by default
#               the largest power of two that the planner predicts to fit without recomputation,
#               halved while either side runs out of memory. Both sides train on full-length
#               sequences (no padding): Loom on long reviews (hf_reference.py reviews),
#               transformers on random ids. THROUGHPUT="bert-base-128 bert-large-512" runs some.
#               COMPARE=1 runs the three configurations with targets instead: bert-base seq 128
#               batch 64 and 256, bert-large seq 512 batch 32 (>= 1.2x eager, >= 1.0x compiled,
#               MFU >= 50 % for bert-large), with each side's peak memory.
#   profile     loom profile --device cuda of bert-base and bert-large at seq 128
#               (profiles/measured/<gpu>-<model>.json)
#   validate    loom validate of single-GPU plans (micro-batch and recompute variants) with them,
#               beside the roofline's prediction of each; tensor and device memory
#   memory      peak memory of one-micro-batch plans of models cut to 2, 6, 12 layers (MEMORY_PLANS)
#   precision   loom validate of bert-base (seq 128, micro-batch 32) in fp32, tf32 and bf16
#               (PRECISION_MODELS="bert-base bert-large" for others); not in the default list
#   tune        loom tune --top 3 of bert-base (global batch 64, seq 128) on this GPU
#   layouts     2 ranks sharing the one GPU over Gloo (loom train --comm gloo): dp2, ZeRO-1/2/3
#               at dp2, tp2, tp2 with sequence parallelism, pp2 1F1B, pp2 interleaved, and a dp2
#               ZeRO-3 checkpoint resumed as tp2, each against one rank (fp32, no dropout, 1e-5)
#   layers      bench/gpu_layers.py: fused attention and MPT-style decoder blocks timed with
#               PyTorch alone (no Loom build needed); not in the default list
# DEVICE=cpu runs the stages on the CPU (transformers' side too), e.g. inside tools/check-torch2.sh's
# Debian sid root, which has transformers (that script clears the environment: set it after --run):
#   TORCH2_SUITE=sid tools/check-torch2.sh --run env DEVICE=cpu bench/gpu.sh logits losses
# logits and losses are then the same correctness checks as on the GPU (fp32 only). throughput,
# profile and validate are a dry run of this script's plumbing, not figures: give them small sizes,
# e.g. DEVICE=cpu STEPS=3 B_BASE128=2 THROUGHPUT=bert-base-128 MODELS=tiny-bert MICRO_BATCHES="2 4"
# VALIDATE_BATCHES="2 4" bench/gpu.sh throughput profile validate (profiles then go to $OUT/profiles,
# not into the checkout).
# COMPILE=0 leaves torch.compile out of the throughput stage; CMD_TIMEOUT (240) limits each command.
# MODELS (default "bert-base bert-large"), MICRO_BATCHES ("4 8 16 32"), REPEATS (10),
# VALIDATE_BATCHES ("8 32"), VALIDATE_STEPS (12) and VALIDATE_WARMUP (4) choose what profile and
# validate run; VALIDATE_PLANS="bert-base:512:8:none ..." (model:seq:micro-batch:recompute, global
# batch 64, optionally :attention and :attention:precision, e.g. bert-large:384:32:none:math:tf32;
# RECOMPUTE fullN recomputes the first N layers only, e.g. bert-large:512:32:full12)
# replaces validate's models x batches x {none, full} at seq 128.
# A machine call is at most 10 minutes: run the stages over several calls (build products stay
# on a warm machine), e.g. `bench/gpu.sh env build logits losses`, then
# `THROUGHPUT="bert-base-128 bert-base-512" bench/gpu.sh throughput` and the same for bert-large
# (torch.compile takes a minute or two per model), then `bench/gpu.sh profile validate`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-/tmp/loom-gpu}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
LOOM="$ROOT/$BUILD/tools/loom"
PY=${PYTHON:-python3}
export DEVICE=${DEVICE:-cuda}
# Loom trains in bf16 on GPUs and in fp32 on CPUs (its profiles and plans follow).
PRECISION=bf16
[ "$DEVICE" = cpu ] && PRECISION=fp32
REF="$ROOT/bench/hf_reference.py"
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(env build logits losses layouts throughput profile validate tune)
TABLE="$OUT/table.md"
[ -f "$TABLE" ] || printf '| check | result | target | verdict |\n|---|---|---|---|\n' >"$TABLE"

say() { echo "== $*" >&2; }
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >>"$TABLE"; }
# The GPU's name as a file name (profiles/measured/<gpu>-<model>.json); "cpu" with DEVICE=cpu.
gpu_name() {
  if [ "$DEVICE" = cpu ]; then echo cpu; return; fi
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-'
}
# Where the profile stage writes and the validate stage reads: the shipped profiles on a GPU.
profiles_dir() { [ "$DEVICE" = cpu ] && echo "$OUT/profiles" || echo profiles/measured; }
# The built-in cluster of this GPU (one H100 or one H200).
cluster() {
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) echo h200-x1 ;;
    *) echo h100-x1 ;;
  esac
}
# sps FILE: samples/s from a JSON result, or "failed".
sps() { "$PY" -c "import json; print(round(json.load(open('$1'))['samples_per_s'], 1))" 2>/dev/null || echo failed; }
# oom FILE: true when a run's stderr says it ran out of GPU memory.
oom() { grep -qi "out of memory" "$1" 2>/dev/null; }
# Every loom and transformers command runs under a time limit (CMD_TIMEOUT seconds, default 240),
# so that one hang costs one row, not the machine call.
t() { timeout --kill-after=10 "${CMD_TIMEOUT:-240}" "$@"; }
need_loom() { [ -x "$LOOM" ] || { say "no $LOOM: run the build stage first"; return 1; }; }

stage_env() {
  {
    nvidia-smi || true
    nproc
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI, "prefix", torch.utils.cmake_prefix_path)'
    "$PY" -c 'import transformers; print("transformers", transformers.__version__)'
    "$PY" -c 'import nvidia.nccl, os; print("nccl", list(nvidia.nccl.__path__))' || true
    cmake --version | head -1
    c++ --version | head -1
    ls "$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')/include" | head -50
  } >"$OUT/env.txt" 2>&1
  say "machine: $OUT/env.txt"
  head -20 "$OUT/env.txt" >&2
}

stage_build() {
  local dd=/tmp/loom-devdeps
  mkdir -p "$dd"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$dd"; done
  local nccl_include utf8proc
  nccl_include=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null || true)
  utf8proc=$(ls "$dd"/usr/lib/x86_64-linux-gnu/libutf8proc.a 2>/dev/null ||
             ls "$dd"/usr/lib/x86_64-linux-gnu/libutf8proc.so* 2>/dev/null | head -1)
  export CMAKE_PREFIX_PATH="$dd/usr:$dd/usr/lib/x86_64-linux-gnu/cmake:$dd/usr/share/cmake:$dd/usr/lib/cmake"
  export CPATH="$dd/usr/include${nccl_include:+:$nccl_include}"
  export LD_LIBRARY_PATH="$dd/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  say "configuring $BUILD (log: $OUT/build.log)"
  if cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF \
       -DLOOM_CUDA=ON -DPython3_EXECUTABLE="$(command -v "$PY")" \
       -DUTF8PROC_INCLUDE_DIR="$dd/usr/include" -DUTF8PROC_LIBRARY="$utf8proc" >"$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" --target loom -j "$(nproc)" >>"$OUT/build.log" 2>&1; then
    row "CUDA build against $("$PY" -c 'import torch; print(torch.__version__)')" "built" "builds" "met"
    "$LOOM" --version >&2 || true
  else
    tail -40 "$OUT/build.log" >&2
    row "CUDA build" "failed: $OUT/build.log" "builds" "NOT MET"
    return 1
  fi
}

# Logits of the tiny random checkpoints: transformers against loom logits, fp32 and bf16.
stage_logits() {
  need_loom || return 1
  local dir="$OUT/hf"
  row "logits and losses on" "$DEVICE" "-" "-"
  [ -f "$dir/ids.json" ] || "$PY" "$REF" make "$dir" || { row "random checkpoints" "failed" "-" "NOT MET"; return 1; }
  local model precision tolerance verdict result precisions=(fp32 bf16)
  [ "$DEVICE" = cpu ] && precisions=(fp32)  # loom computes in fp32 on CPUs
  for model in bert roberta; do
    for precision in "${precisions[@]}"; do
      tolerance=1e-4
      [ "$precision" = bf16 ] && tolerance=2e-2
      rm -f "$dir/$model-$precision-hf.json" "$dir/$model-$precision-loom.json"
      if ! t "$PY" "$REF" logits "$dir/$model" "$dir/ids.json" $precision \
             >"$dir/$model-$precision-hf.json" 2>"$dir/$model-$precision-hf.err"; then
        row "logits, random $model, $precision" "transformers failed: $dir/$model-$precision-hf.err" \
          "<= $tolerance relative" "NOT MET"
        continue
      fi
      if ! t "$LOOM" logits --init "$dir/$model" --ids "$dir/ids.json" --device "$DEVICE" \
             --precision $precision -o "$dir/$model-$precision-loom.json" 2>"$dir/$model-$precision.err"; then
        row "logits, random $model, $precision" "loom failed: $(tail -1 "$dir/$model-$precision.err")" \
          "<= $tolerance relative" "NOT MET"
        continue
      fi
      result=$("$PY" "$REF" compare-logits "$dir/$model-$precision-hf.json" \
                 "$dir/$model-$precision-loom.json" $tolerance 2>&1)
      verdict=$([ $? -eq 0 ] && echo met || echo "NOT MET")
      result=$(tail -1 <<<"$result")
      row "logits, random $model, $precision" "$result" "<= $tolerance relative" "$verdict"
    done
  done
}

# The first 5 steps of the tiny BERT, fp32 without dropout: loom's losses against transformers'
# on the batches loom trained on.
stage_losses() {
  need_loom || return 1
  local dir="$OUT/hf"
  [ -f "$dir/ids.json" ] || "$PY" "$REF" make "$dir" || return 1
  "$LOOM" plan --model "$dir/bert/config.json" --cluster "$(cluster)" --global-batch 8 --seq-len 32 \
    --precision fp32 --dp 1 --tp 1 --pp 1 --micro-batch 4 -o "$dir/plan-losses.json" >/dev/null &&
    t "$LOOM" train "$dir/plan-losses.json" --init "$dir/bert" --data "$dir/reviews.csv" --steps 5 \
      --dropout 0 --lr 1e-3 --device "$DEVICE" --dump-batches "$dir/batches.jsonl" \
      --metrics "$dir/losses-loom.jsonl" --json >"$dir/train-losses.json" 2>"$dir/train-losses.err" ||
    { tail -5 "$dir/train-losses.err" >&2; row "losses, 5 steps" "loom train failed" "1e-3" "NOT MET"; return 1; }
  t "$PY" "$REF" losses "$dir/bert" "$dir/batches.jsonl" "$dir/losses-loom.jsonl" 1e-3 0.01 0 5 1.0 \
    | tee "$dir/losses.txt" >&2
  local worst
  worst=$(tail -1 "$dir/losses.txt" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["max_loss_difference"])' 2>/dev/null)
  if [ -z "$worst" ]; then
    row "losses, first 5 steps, fp32" "the transformers replay failed" "<= 1e-3" "NOT MET"
    return 1
  fi
  row "losses, first 5 steps, fp32" "max difference $worst" "<= 1e-3" \
    "$("$PY" -c "print('met' if $worst <= 1e-3 else 'NOT MET')")"
}

# Samples/s side by side, in turn: loom train (bf16), transformers eager, transformers compiled.
stage_throughput() {
  need_loom || return 1
  local dir="$OUT/throughput"
  mkdir -p "$dir"
  local steps=${STEPS:-20}
  local peak_tflops
  # The GPU's measured dense bf16 matrix rate, for MFU (a 8192^3 matmul, median of 20).
  peak_tflops=$("$PY" - <<'PY'
import os, time, torch
device = os.environ["DEVICE"]
n = 8192 if device == "cuda" else 1024
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
for _ in range(5): a @ b
times = []
for _ in range(20):
    sync(); t = time.perf_counter(); a @ b; sync()
    times.append(time.perf_counter() - t)
times.sort()
print(f"{2 * n**3 / times[10] / 1e12:.3f}")
PY
)
  row "measured bf16 matmul rate" "$peak_tflops TFLOP/s" "-" "-"
  [ -f "$dir/data/long.csv" ] || "$PY" "$REF" reviews "$dir/data" 2048 600
  # transformers config | loom model | seq | batch (empty: the largest that fits both)
  local configs=("bert-base-uncased|bert-base|128|${B_BASE128:-}" "bert-base-uncased|bert-base|512|${B_BASE512:-}"
                 "bert-large-uncased|bert-large|128|${B_LARGE128:-}" "bert-large-uncased|bert-large|512|${B_LARGE512:-}")
  # COMPARE=1: the three configurations the targets are set on, batches pinned.
  [ "${COMPARE:-0}" = 1 ] && configs=("bert-base-uncased|bert-base|128|64" "bert-base-uncased|bert-base|128|256"
                                       "bert-large-uncased|bert-large|512|32")
  local c hf model seq batch fixed name loom_sps eager_sps compiled_sps ratio mfu
  for c in "${configs[@]}"; do
    IFS='|' read -r hf model seq batch <<<"$c"
    name="$model-$seq"
    [ "${COMPARE:-0}" = 1 ] && name="$model-$seq-b$batch"
    [ -n "${THROUGHPUT:-}" ] && [[ " $THROUGHPUT " != *" $name "* ]] && continue
    fixed=$batch
    if [ -z "$batch" ]; then
      # The largest power of two the planner predicts to fit without recomputation (HF eager
      # recomputes nothing either), then halved while either side runs out of memory.
      batch=1024
      while ((batch > 1)) && ! "$LOOM" plan --model $model --cluster "$(cluster)" --global-batch $batch \
          --seq-len "$seq" --precision $PRECISION --dp 1 --tp 1 --pp 1 --micro-batch $batch \
          --recompute none -o "$dir/plan-fit.json" >/dev/null 2>&1; do
        batch=$((batch / 2))
      done
    fi
    while :; do
      "$LOOM" plan --model $model --cluster "$(cluster)" --global-batch "$batch" --seq-len "$seq" \
        --precision $PRECISION --dp 1 --tp 1 --pp 1 --micro-batch "$batch" --recompute none \
        -o "$dir/plan-$name.json" >/dev/null 2>"$dir/plan-$name.err"
      t "$LOOM" train "$dir/plan-$name.json" --data "$dir/data/long.csv" \
        --tokenizer "$dir/data/vocab.txt" --steps "$steps" --device "$DEVICE" --json \
        >"$dir/loom-$name.json" 2>"$dir/loom-$name.err"
      t "$PY" "$REF" throughput "$hf" "$seq" "$batch" "$steps" >"$dir/eager-$name.json" 2>"$dir/eager-$name.err"
      if [ -z "$fixed" ] && ((batch > 1)) && { oom "$dir/loom-$name.err" || oom "$dir/eager-$name.err"; }; then
        say "$name: out of memory at batch $batch, halving"
        batch=$((batch / 2))
        continue
      fi
      break
    done
    loom_sps=$(sps "$dir/loom-$name.json")
    eager_sps=$(sps "$dir/eager-$name.json")
    compiled_sps="not run (COMPILE=0)"
    if [ "${COMPILE:-1}" != 0 ]; then
      t "$PY" "$REF" throughput "$hf" "$seq" "$batch" "$steps" compile >"$dir/compiled-$name.json" 2>"$dir/compiled-$name.err"
      compiled_sps=$(sps "$dir/compiled-$name.json")
      oom "$dir/compiled-$name.err" && compiled_sps="out of memory"
    fi
    ratio=$("$PY" -c "print(f'{$loom_sps / $eager_sps:.2f}')" 2>/dev/null || echo "-")
    # MFU: the plan's model FLOPs per step (its predicted model TFLOP/s times its predicted step)
    # over the measured step time, against the measured matmul rate.
    mfu=$("$PY" -c "import json
p = json.load(open('$dir/plan-$name.json'))['predicted']
flops = p['model_tflops_per_gpu'] * p['step_time_s']
print(f'{100 * flops * $loom_sps / $batch / $peak_tflops:.1f} %')" 2>/dev/null || echo "-")
    local compiled_ratio peaks target verdict
    compiled_ratio=$("$PY" -c "print(f'{$loom_sps / $compiled_sps:.2f}')" 2>/dev/null || echo "-")
    peaks=$("$PY" -c "import json
def gib(f):
    try: return f\"{json.load(open(f))['peak_memory_bytes'] / 2**30:.1f}\"
    except Exception: return '-'
print(' / '.join(gib(f'$dir/{k}-$name.json') for k in ('loom', 'eager', 'compiled')))")
    # The targets: 1.2x eager and 1.0x compiled everywhere, MFU 50 % for bert-large at seq 512.
    target=">= 1.2x eager, >= 1.0x compiled"
    [ "$model-$seq" = bert-large-512 ] && target="$target, MFU >= 50 %"
    verdict=$("$PY" - "$loom_sps" "$eager_sps" "$compiled_sps" "${mfu% %}" "$model-$seq" <<'PYEOF'
import sys
def num(text):
    try: return float(text)
    except ValueError: return None
loom, eager, compiled, mfu = (num(x) for x in sys.argv[1:5])
ok = loom is not None and eager is not None and loom >= 1.2 * eager
ok = ok and (compiled is None or loom >= compiled)
ok = ok and (sys.argv[5] != "bert-large-512" or (mfu is not None and mfu >= 50))
print("met" if ok else "NOT MET")
PYEOF
)
    row "$model seq $seq b=$batch $PRECISION: loom / eager / compiled samples/s" \
      "$loom_sps / $eager_sps / $compiled_sps (loom/eager $ratio, loom/compiled $compiled_ratio, loom MFU $mfu, peak GiB $peaks)" \
      "$target" "$verdict"
  done
}

stage_profile() {
  need_loom || return 1
  local gpu model
  gpu=$(gpu_name)
  mkdir -p "$(profiles_dir)"
  for model in ${MODELS:-bert-base bert-large}; do
    t "$LOOM" profile --device "$DEVICE" --model $model --seq-len 128 --micro-batch ${MICRO_BATCHES:-4 8 16 32} \
      --precision $PRECISION --recompute none selective full --repeats ${REPEATS:-10} \
      -o "$(profiles_dir)/$gpu-$model.json" >"$OUT/profile-$model.log" 2>&1 &&
      cp "$(profiles_dir)/$gpu-$model.json" "$OUT/" &&
      row "loom profile --device $DEVICE, $model" "$(profiles_dir)/$gpu-$model.json" "written" "met" ||
      row "loom profile --device $DEVICE, $model" "failed: $OUT/profile-$model.log" "written" "NOT MET"
  done
}

# Single-GPU plans (micro-batch and recomputation variants) through loom validate: the
# prediction from the measured profile when the profile stage wrote one (else the cluster's
# calibrated roofline), and beside it the roofline's prediction of the same plan (loom plan with
# no profile), both against the measured step; tensor peak against the allocator's, the
# prediction's total against the device's used memory.
stage_validate() {
  need_loom || return 1
  local gpu dir="$OUT/validate" model b r profile name
  gpu=$(gpu_name)
  mkdir -p "$dir"
  # MODEL:SEQ:MICRO_BATCH:RECOMPUTE each, global batch 64 on one GPU.
  local plans=() item seq
  if [ -n "${VALIDATE_PLANS:-}" ]; then
    read -r -a plans <<<"$VALIDATE_PLANS"
  else
    for model in ${MODELS:-bert-base bert-large}; do
      for b in ${VALIDATE_BATCHES:-8 32}; do
        for r in none full; do plans+=("$model:128:$b:$r"); done
      done
    done
  fi
  local a p extra
  for item in "${plans[@]}"; do
    IFS=: read -r model seq b r a p <<<"$item"
    name=$model-$b-$r
    [ "$seq" = 128 ] || name=$model-s$seq-$b-$r
    # Optional fifth and sixth fields: the attention kernel and the precision (the plan's
    # defaults otherwise); a profile is only used for the default precision.
    extra=()
    # RECOMPUTE "fullN": full recomputation of the first N layers (--recompute-layers N).
    if [[ $r =~ ^full([0-9]+)$ ]]; then extra+=(--recompute-layers "${BASH_REMATCH[1]}"); r=full; fi
    [ -n "$a" ] && extra+=(--attention "$a") && name=$name-$a
    [ -n "$p" ] && [ "$p" != "$PRECISION" ] && name=$name-$p
    p=${p:-$PRECISION}
    profile=()
    [ "$p" = "$PRECISION" ] && [ -f "$(profiles_dir)/$gpu-$model.json" ] &&
      profile=(--profile "$(profiles_dir)/$gpu-$model.json")
    "$LOOM" plan --model $model --cluster "$(cluster)" --global-batch 64 --seq-len $seq \
      --precision $p --dp 1 --tp 1 --pp 1 --micro-batch $b --recompute $r "${extra[@]}" \
      -o "$dir/roofline-$name.json" >/dev/null 2>&1
    "$LOOM" plan --model $model --cluster "$(cluster)" --global-batch 64 --seq-len $seq \
      --precision $p --dp 1 --tp 1 --pp 1 --micro-batch $b --recompute $r "${extra[@]}" \
      "${profile[@]}" -o "$dir/plan-$name.json" >/dev/null &&
      t "$LOOM" validate "$dir/plan-$name.json" --device "$DEVICE" --steps ${VALIDATE_STEPS:-12} \
        --warmup ${VALIDATE_WARMUP:-4} --json >"$dir/validate-$name.json" 2>"$dir/validate-$name.err"
  done
  "$PY" - "$dir" <<'PY' | tee -a "$TABLE" >&2
import glob, json, statistics, sys
rows = []
def pct(x):
    return "-" if x is None else f"{100 * x:+.1f} %"
for path in sorted(glob.glob(f"{sys.argv[1]}/validate-*.json")):
    name = path.split("validate-")[1][:-5]
    try:
        d = json.load(open(path))
    except ValueError:
        print(f"| validate {name} | failed (see its .err) | - | NOT MET |")
        continue
    measured = d["measured"]["step_time_s"]
    roofline = None
    try:
        r = json.load(open(f"{sys.argv[1]}/roofline-{name}.json"))["predicted"]["step_time_s"]
        roofline = (r - measured) / measured
    except (OSError, ValueError, KeyError):
        pass
    e = d["relative_error"]
    rows.append((name, e["step_time"], e["peak_memory"], e.get("device_memory"), roofline))
    print(f"| validate {name} ({d['calibration']}) | step {1e3 * measured:.1f} ms: "
          f"{pct(e['step_time'])}, roofline {pct(roofline)}; tensors {pct(e['peak_memory'])}, "
          f"device {pct(e.get('device_memory'))} | - | - |")
if rows:
    med = lambda k: statistics.median(abs(r[k]) for r in rows if r[k] is not None) \
        if any(r[k] is not None for r in rows) else None
    t, m, dev, roof = med(1), med(2), med(3), med(4)
    print(f"| validate, median abs error over {len(rows)} plans | step time {pct(t)}, roofline "
          f"{pct(roof)}, tensors {pct(m)}, device {pct(dev)} | <= 5 % each | "
          f"{'met' if max(t, m) <= 0.05 else 'NOT MET'} |")
PY
}

# What one GPU's memory holds against the model's depth, width, tokens and recomputation: plans of
# one micro-batch through loom validate, for models cut to other depths (MEMORY_PLANS, each
# MODEL:LAYERS:SEQ:MICRO_BATCH:RECOMPUTE:ATTENTION), the allocator's peak and the device's used
# memory beside the prediction. Differences between depths at the same tokens give the bytes one
# layer keeps; between micro-batches at the same depth, the bytes per token.
stage_memory() {
  need_loom || return 1
  local dir="$OUT/memory" item model layers seq b r a name
  mkdir -p "$dir"
  local plans=(${MEMORY_PLANS:-bert-base:2:128:8:none:flash bert-base:2:128:32:none:flash
    bert-base:6:128:8:none:flash bert-base:6:128:32:none:flash bert-base:12:128:32:none:flash
    bert-base:6:512:8:none:flash bert-base:6:128:32:selective:flash bert-base:6:128:32:full:flash
    bert-base:2:128:32:full:flash bert-base:6:128:32:none:math bert-large:2:128:32:none:flash
    bert-large:6:128:32:none:flash})
  for item in "${plans[@]}"; do
    IFS=: read -r model layers seq b r a <<<"$item"
    name=$model-l$layers-s$seq-b$b-$r-$a
    "$PY" -c "import json, sys
d = json.load(open('profiles/models/$model.json'))
d['layers'] = $layers
d['name'] = '$model-l$layers'
json.dump(d, open('$dir/$name-model.json', 'w'))"
    "$LOOM" plan --model "$dir/$name-model.json" --cluster "$(cluster)" --global-batch $b \
      --seq-len $seq --precision $PRECISION --dp 1 --tp 1 --pp 1 --micro-batch $b --recompute $r \
      --attention $a -o "$dir/plan-$name.json" >/dev/null &&
      t "$LOOM" validate "$dir/plan-$name.json" --device "$DEVICE" --steps ${MEMORY_STEPS:-4} \
        --warmup 1 --json >"$dir/validate-$name.json" 2>"$dir/validate-$name.err"
  done
  "$PY" - "$dir" <<'PY' | tee -a "$TABLE" >&2
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/validate-*.json")):
    name = path.split("validate-")[1][:-5]
    try:
        d = json.load(open(path))
    except ValueError:
        print(f"| memory {name} | failed (see its .err) | - | - |")
        continue
    m, p = d["measured"], d["predicted"]
    mib = 2 ** 20
    print(f"| memory {name} | tensors {m['peak_memory_bytes'] / mib:.0f} MiB (predicted "
          f"{p['peak_memory_bytes'] / mib:.0f} total), device {m.get('device_used_bytes', 0) / mib:.0f} "
          f"MiB | - | - |")
PY
}

# The precisions a GPU job can name, through loom validate: bert-base at sequence 128, global
# batch 64, micro-batch 32, in fp32, tf32 (matrix products on tensor cores in tf32, which the
# executor must switch on) and bf16, each beside its prediction (PRECISION_MODELS changes the
# model).
stage_precision() {
  need_loom || return 1
  local dir="$OUT/precision" model p name
  mkdir -p "$dir"
  for model in ${PRECISION_MODELS:-bert-base}; do
    for p in fp32 tf32 bf16; do
      name=$model-$p
      rm -f "$dir/plan-$name.json" "$dir/validate-$name.json" "$dir/validate-$name.err"
      "$LOOM" plan --model $model --cluster "$(cluster)" --global-batch 64 --seq-len 128 \
        --precision $p --dp 1 --tp 1 --pp 1 --micro-batch 32 --recompute none \
        -o "$dir/plan-$name.json" >/dev/null &&
        t "$LOOM" validate "$dir/plan-$name.json" --device "$DEVICE" --steps ${VALIDATE_STEPS:-12} \
          --warmup ${VALIDATE_WARMUP:-4} --json >"$dir/validate-$name.json" 2>"$dir/validate-$name.err"
      "$PY" -c "import json
d = json.load(open('$dir/validate-$name.json'))
m, e = d['measured'], d['relative_error']
ph = m['ranks'][0]['phases_s']
print(f\"| precision $name | step {1e3 * m['step_time_s']:.1f} ms (forward {1e3 * ph['forward']:.1f}, \"
      f\"backward {1e3 * ph['backward']:.1f}, optimizer {1e3 * ph['optimizer']:.1f}): \"
      f\"{100 * e['step_time']:+.1f} % | - | - |\")" 2>/dev/null | tee -a "$TABLE" >&2 ||
        row "precision $name" "failed: $(tail -1 "$dir/validate-$name.err")" "-" "NOT MET"
    done
  done
}

# loom tune on this GPU: bert-base, global batch 64, seq 128, the top 3 predicted single-GPU plans
# run and re-ranked by measured step time (the regret of the predicted-first is in its log).
stage_tune() {
  need_loom || return 1
  local dir="$OUT/tune"
  mkdir -p "$dir"
  if t "$LOOM" tune --model ${TUNE_MODEL:-bert-base} --cluster "$(cluster)" --global-batch 64 \
       --seq-len 128 --precision $PRECISION --top ${TUNE_TOP:-3} --steps ${VALIDATE_STEPS:-12} \
       --warmup ${VALIDATE_WARMUP:-4} -o "$dir/tuned.json" >"$dir/tune.log" 2>"$dir/tune.err"; then
    row "loom tune --top ${TUNE_TOP:-3}, ${TUNE_MODEL:-bert-base}" "$(grep -i regret "$dir/tune.log" | head -1)" "-" "-"
  else
    row "loom tune, ${TUNE_MODEL:-bert-base}" "failed: $(tail -1 "$dir/tune.err")" "-" "NOT MET"
  fi
  cat "$dir/tune.log" >&2
}

# Many ranks on the one GPU: each layout's 2 ranks share the device over Gloo (loom train --comm
# gloo stages every collective through host memory), CUDA tensors everywhere else; the tiny BERT in
# fp32 without dropout, 6 steps, against one rank on the same GPU with the same global batch and
# micro-batch (the same batches): every step's loss within 1e-5 relative. The last row resumes
# the step-3 checkpoint of the dp2 ZeRO-3 run as tp2 for steps 4-6 and compares those.
LAYOUTS_TOLERANCE=${LAYOUTS_TOLERANCE:-1e-5}
stage_layouts() {
  need_loom || return 1
  local dir="$OUT/layouts" failed=0
  mkdir -p "$dir"
  local common=(--model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 32 --precision fp32 --micro-batch 2)
  local train=(--data synthetic:512 --device "$DEVICE" --dropout 0 --lr 1e-3 --seed 7 --warmup-steps 0)
  "$LOOM" plan "${common[@]}" --dp 1 --tp 1 --pp 1 -o "$dir/one.json" >/dev/null &&
    t "$LOOM" train "$dir/one.json" "${train[@]}" --steps 6 --metrics "$dir/one.jsonl" \
      >"$dir/one.log" 2>&1 || { row "layouts: one rank" "failed: $(tail -1 "$dir/one.log")" "-" "NOT MET"; return 1; }
  local spec name flags
  for spec in "dp2:--dp 2 --zero 0" "dp2-zero1:--dp 2 --zero 1" "dp2-zero2:--dp 2 --zero 2" \
              "dp2-zero3:--dp 2 --zero 3" "tp2:--tp 2" "tp2-sp:--tp 2 --sp on" \
              "pp2-1f1b:--pp 2 --schedule 1f1b" "pp2-interleaved:--pp 2 --schedule interleaved --virtual-stages 2"; do
    name=${spec%%:*}; flags=${spec#*:}
    # shellcheck disable=SC2086
    if "$LOOM" plan "${common[@]}" $flags -o "$dir/$name.json" >"$dir/$name.plan" 2>&1 &&
       t "$LOOM" launch --nproc 2 -- "$LOOM" train "$dir/$name.json" "${train[@]}" --steps 6 --comm gloo \
         --metrics "$dir/$name.jsonl" >"$dir/$name.log" 2>&1; then
      layouts_compare "$name" "$dir/$name.jsonl" "$dir/one.jsonl" 1 || failed=1
    else
      row "layouts: $name on one $DEVICE device" "failed: $(tail -1 "$dir/$name.log" "$dir/$name.plan" 2>/dev/null | tail -1)" "-" "NOT MET"
      failed=1
    fi
  done
  # A dp2 ZeRO-3 checkpoint resumed as tp2.
  rm -rf "$dir/ckpt"
  if "$LOOM" plan "${common[@]}" --dp 2 --zero 3 -o "$dir/z3.json" >/dev/null &&
     t "$LOOM" launch --nproc 2 -- "$LOOM" train "$dir/z3.json" "${train[@]}" --steps 6 --comm gloo \
       --checkpoint "$dir/ckpt" --checkpoint-every 3 >"$dir/z3.log" 2>&1 &&
     rm -rf "$dir/ckpt/step-00000006" &&
     t "$LOOM" launch --nproc 2 -- "$LOOM" train "$dir/tp2.json" "${train[@]}" --steps 6 --comm gloo \
       --checkpoint "$dir/ckpt" --resume --metrics "$dir/resharded.jsonl" >"$dir/resharded.log" 2>&1; then
    layouts_compare "dp2 ZeRO-3 checkpoint resumed as tp2" "$dir/resharded.jsonl" "$dir/one.jsonl" 4 || failed=1
  else
    row "layouts: dp2 ZeRO-3 resumed as tp2" "failed: $(tail -1 "$dir/resharded.log" "$dir/z3.log" 2>/dev/null | tail -1)" "-" "NOT MET"
    failed=1
  fi
  return $failed
}

# One table row: the worst relative difference of the steps from FIRST on between two metrics
# files (rank 0's step lines).
layouts_compare() {
  local worst
  worst=$("$PY" - "$2" "$3" "$4" <<'PYEOF'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r and not r.get("eval") and r.get("rank", 0) == 0:
            out[r["step"]] = r["loss"]
    return out
a, b, first = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
steps = [s for s in sorted(a) if s >= first and s in b]
print(max(abs(a[s] - b[s]) / abs(b[s]) for s in steps) if steps else "none")
PYEOF
)
  if [ "$worst" = none ] || [ -z "$worst" ]; then
    row "layouts: $1" "no common steps" "<= $LAYOUTS_TOLERANCE" "NOT MET"; return 1
  fi
  local verdict
  verdict=$("$PY" -c "print('met' if $worst <= $LAYOUTS_TOLERANCE else 'NOT MET')")
  row "layouts: $1, 2 ranks on one $DEVICE device" "worst relative loss difference $worst" "<= $LAYOUTS_TOLERANCE" "$verdict"
  [ "$verdict" = met ]
}

# Fused attention (every SDPA backend, causal and not, sequence 512-32768) and MPT-style decoder
# blocks timed apart from Loom with PyTorch (bench/gpu_layers.py): what the cost model's flash
# attention and decoder layers are checked against.
stage_layers() {
  t "$PY" bench/gpu_layers.py "$OUT/layers.json" >"$OUT/layers.md" 2>"$OUT/layers.err"
  local rc=$?
  cat "$OUT/layers.md" >&2
  row "bench/gpu_layers.py" "$(grep -c '^| ' "$OUT/layers.md") rows in layers.json" "-" "-"
  return $rc
}

for s in "${STAGES[@]}"; do
  say "stage $s"
  "stage_$s" || say "stage $s failed (continuing)"
done
echo
cat "$TABLE"
