#!/usr/bin/env bash
# Fits the shipped runtime calibrations (profiles/calibrations/) to the published training runs in
# bench/published/*.json and to Loom's stored GPU runs, with `loom calibrate --runtime`. The
# cluster files (profiles/clusters/) hold hardware values and are not changed: each calibration
# starts from them, moves a hardware parameter only inside its stated range, and records the rows,
# files, date, in-sample and leave-one-out errors and every parameter's start, value and
# uncertainty.
#
#   fsdp      H100 80GB rows (FSDP blog, llm-foundry)          -> fsdp-h100
#             A100 80GB rows (FSDP blog, llm-foundry, torchtitan) -> fsdp-a100-80g
#             A100 40GB rows (llm-foundry)                      -> fsdp-a100-40g
#             H100 96GB HBM2e rows (torchtitan)                 -> fsdp-h100-96g
#   nemo      NeMo 24.03/24.07 rows on DGX H100                 -> nemo-h100
#   deepspeed DeepSpeed 0.5 with Hugging Face on DGX-2          -> deepspeed-v100-sxm3
#   loom      plain data parallelism (DDP, Horovod): NVIDIA's BERT SQuAD rows on A100 80GB and
#             V100 16/32GB, the DDP rows of the DeepSpeed file on DGX-2
#                                                               -> loom-a100-80g, loom-v100-16g,
#                                                                  loom-v100-32g, loom-v100-sxm3
#             Loom's own runs on one H100 and one H200 (bench/gpu-runs/, `loom validate`), their
#             GEMM ceilings and fused-attention rate kept at the files' measured values (--fix):
#             Loom's runs, mostly bound by the host, inform them weakly. Runs of `flash`
#             attention in tf32 are left out: PyTorch runs its memory-efficient fp32 kernel
#             there, which the model does not describe.       -> loom-h100, loom-h200
#
# The fit starts from the cluster files' values, so the script gives the same files when run
# again on the same code; re-run it after the cost model changes.
#
# Usage: bench/calibrate-clusters.sh            (DATE=YYYY-MM-DD for the records; default today)
#        BUILD=build-foo bench/calibrate-clusters.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
LOOM="$BUILD/tools/loom"
if [ ! -x "$LOOM" ]; then
  if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD" --target loom >/dev/null
fi
DATE=${DATE:-$(date -u +%F)}
CLUSTERS="$ROOT/profiles/clusters"
OUT="$ROOT/profiles/calibrations"
mkdir -p "$OUT"
RUNS=()
for f in "$ROOT"/bench/published/*.json; do
  # Training rows only (the GEMM and collective files have no "model").
  if grep -q '"model"' "$f"; then RUNS+=("$f"); fi
done

# calibrate NAME RUNTIME CLUSTER STACK [extra calibrate arguments...]
calibrate() {
  local name=$1 runtime=$2 cluster=$3 stack=$4
  shift 4
  echo "== $name"
  # Skipped rows (another GPU or runtime, not expressible) are many: show only their count.
  "$LOOM" calibrate "$@" --cluster "$CLUSTERS/$cluster.json" --runtime "$runtime" \
    --name "$name" --stack "$stack" -o "$OUT/$name.json" --date "$DATE" | awk '
      /^skipped / { skipping = 1; print; next }
      skipping && /^  / { next }
      { skipping = 0; print }'
  echo
}

calibrate fsdp-h100 fsdp dgx-h100 "PyTorch FSDP as llm-foundry (Composer) and fms-fsdp run it" \
  "${RUNS[@]}"
calibrate fsdp-a100-80g fsdp dgx-a100-80g \
  "PyTorch FSDP as llm-foundry (Composer), fms-fsdp and torchtitan run it" "${RUNS[@]}"
calibrate fsdp-a100-40g fsdp dgx-a100-40g "PyTorch FSDP as llm-foundry (Composer) runs it" \
  "${RUNS[@]}"
calibrate fsdp-h100-96g fsdp h100-96g-hbm2e "PyTorch FSDP2 as torchtitan runs it" "${RUNS[@]}"
calibrate nemo-h100 nemo dgx-h100 \
  "NeMo 24.03 and 24.07: Megatron-Core, TransformerEngine fp8, Apex DistributedFusedAdam" \
  "${RUNS[@]}"
calibrate deepspeed-v100-sxm3 deepspeed dgx2-v100-32g \
  "DeepSpeed 0.5 with the Hugging Face Trainer (transformers 4.12)" "${RUNS[@]}"
calibrate loom-v100-sxm3 loom dgx2-v100-32g \
  "PyTorch DDP with the Hugging Face Trainer (transformers 4.12)" "${RUNS[@]}"
calibrate loom-a100-80g loom dgx-a100-80g \
  "plain data parallelism: NVIDIA's BERT (PyTorch with apex DDP, TensorFlow with Horovod)" \
  "${RUNS[@]}"
calibrate loom-v100-16g loom dgx1-v100-16g \
  "plain data parallelism: NVIDIA's BERT (PyTorch with apex DDP, TensorFlow with Horovod)" \
  "${RUNS[@]}"
calibrate loom-v100-32g loom dgx1-v100-32g \
  "plain data parallelism: NVIDIA's BERT (PyTorch with apex DDP, TensorFlow with Horovod)" \
  "${RUNS[@]}"

RUNS_DIR="$ROOT/bench/gpu-runs"
FIXED=(--fix device.attention_efficiency)
for p in bf16 fp16 tf32 fp32 fp8; do FIXED+=(--fix "device.achievable_tflops.$p"); done
# Every `loom validate` document of the GPU but the tf32 flash runs (kernels.json and gaps.json
# are kernel timings, not runs). The first H100 machine's runs (h100/) stay out: they predate the
# executor's fused AdamW, and that machine ran the same plans up to 1.8 times slower than the
# three H100 machines since (BERT-base at micro-batch 64: 46.8 ms against 26.6 and 29.7). The
# H100 runs kept out as a check (h100-check/) stay out of the fit.
runs_of() {
  local f
  for f in "$@"; do
    case "$f" in *flash-tf32* | */kernels.json | */gaps.json) ;; *) echo "$f" ;; esac
  done
}
mapfile -t H100_RUNS < <(runs_of "$RUNS_DIR"/h100-precision/*.json \
  "$RUNS_DIR"/h100-fused/bert*.json "$RUNS_DIR"/h100-fused/roberta*.json \
  "$RUNS_DIR"/h100-fused/tiny*.json "$RUNS_DIR"/h100-recompute/*.json)
mapfile -t H200_RUNS < <(runs_of "$RUNS_DIR"/h200/*.json "$RUNS_DIR"/h200-autocast/*.json \
  "$RUNS_DIR"/h200-precision/*.json "$RUNS_DIR"/h200-recompute/*.json \
  "$RUNS_DIR"/h100-fused/h200-*.json)
calibrate loom-h100 loom h100-x1 "Loom's executor (LibTorch, cuDNN attention, fused AdamW)" \
  "${FIXED[@]}" "${H100_RUNS[@]}"
calibrate loom-h200 loom h200-x1 "Loom's executor (LibTorch, cuDNN attention, fused AdamW)" \
  "${FIXED[@]}" "${H200_RUNS[@]}"
