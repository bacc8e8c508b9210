#!/usr/bin/env bash
# Runs the commands of README.md's jobs on this machine, without GPUs and without network.
#
# Usage: bench/readme_jobs.sh BUILD_DIR          (e.g. bench/readme_jobs.sh build)
#   KEEP_GOING=1   run every command and list the failures at the end, instead of stopping at
#                  the first failing one
#   SCRATCH=DIR    work there instead of a fresh temporary folder (kept at the end either way)
#   README=FILE    run another file's blocks (a variant of README.md, for testing this script)
#
# The convention in README.md: every fenced block opened with ```sh is runnable, one command per
# line (lines starting with # are comments); blocks fenced with a bare ``` are not run. Blocks run
# in README order in one shell, in one scratch folder, so a later block may use an earlier one's
# files.
#
# `loom` in those lines is a shell function that runs BUILD_DIR/tools/loom:
# - plan, simulate, report, slurm, export and validate run exactly as written. The checkpoint
#   folders the README names (bert-base-cased/, roberta-large/) are stand-ins holding the real
#   Hugging Face config.json, so plans are the real ones.
# - train (directly or after `launch --`) of a plan made for a GPU cluster runs the same layout on
#   this machine's CPU: the same dp, tp, pp, ZeRO stage, schedule, virtual stages, recomputation
#   and stage partition, replanned (into PLAN.cpu.json) for a CPU cluster with as many devices as
#   the plan has ranks, in fp32, at sequence length 32 and a small batch, with tiny stand-ins of
#   the checkpoints (the same layer counts, hidden size 32, their own vocabularies and weights)
#   and 2 steps (--epochs and --steps replaced, --checkpoint-every 1). Plans for CPU clusters
#   train as written.
# - launch --nnodes M --node-rank R --master-addr HOST runs every node on this machine: the master
#   becomes 127.0.0.1, node ranks below M - 1 run in the background and the last one waits for
#   them.
# - sbatch only checks the job script's syntax (there is no Slurm here).
# aclImdb/ is a stand-in with the same layout (train/{pos,neg}, test/{pos,neg}, one review per
# .txt file), a few dozen short reviews.
#
# Every command is printed (`$ ...`, and `  runs: ...` when it was rewritten) before it runs.
set -uo pipefail
[ $# -eq 1 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd) || exit 2
LOOM_BIN="$BUILD/tools/loom"
[ -x "$LOOM_BIN" ] || { echo "readme_jobs: no $LOOM_BIN: build loom first" >&2; exit 2; }
SCRATCH=${SCRATCH:-$(mktemp -d /tmp/loom-readme-jobs.XXXXXX)}
mkdir -p "$SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)
KEEP_GOING=${KEEP_GOING:-0}
README=$(realpath "${README:-$ROOT/README.md}") || exit 2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "readme_jobs: scratch folder $SCRATCH" >&2

# --- stand-ins --------------------------------------------------------------------------------

# The real checkpoints' config.json (what `--model DIR/` plans), the tiny ones' (what training
# loads), the tokenizers, and the aclImdb/ folder.
make_stand_ins() {
  python3 - "$SCRATCH" <<'EOF'
import json, os, sys
root = sys.argv[1]
def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
def write_json(path, obj):
    write(path, json.dumps(obj, indent=2) + "\n")

# The configs of the Hugging Face Hub's bert-base-cased and roberta-large.
write_json(f"{root}/hub/bert-base-cased/config.json", {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
    "type_vocab_size": 2, "vocab_size": 28996})
write_json(f"{root}/hub/roberta-large/config.json", {
    "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 4096,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
    "num_attention_heads": 16, "num_hidden_layers": 24, "pad_token_id": 1,
    "type_vocab_size": 1, "vocab_size": 50265})

# A few dozen reviews in the aclImdb layout.
good = ["great", "wonderful", "moving", "brilliant", "superb", "delightful"]
bad = ["awful", "boring", "dull", "terrible", "weak", "clumsy"]
neutral = ["the", "film", "plot", "actor", "story", "scene", "was", "and", "a", "movie",
           "music", "ending", "director", "cast", "this", "is", "it", "of"]
def review(i, words):
    body = [neutral[(i * 7 + k) % len(neutral)] for k in range(8 + i % 5)]
    body.insert(3, words[i % len(words)])
    body.insert(6, words[(i + 2) % len(words)])
    return "The " + " ".join(body) + ". " + words[(i + 1) % len(words)].capitalize() + "!"
for split, count in (("train", 24), ("test", 8)):
    for label, words in (("pos", good), ("neg", bad)):
        for i in range(count):
            write(f"{root}/data/aclImdb/{split}/{label}/{i}_{7 if label == 'pos' else 2}.txt",
                  review(i, words))

# WordPiece vocabulary (cased, as bert-base-cased's), padded with [unusedN] as BERT's are.
words = sorted(set(good + bad + neutral + [w.capitalize() for w in good + bad + neutral]))
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "!", ",", "'"] + words
vocab += [f"[unused{i}]" for i in range(256 - len(vocab))]
write(f"{root}/tiny/bert-base-cased/vocab.txt", "\n".join(vocab) + "\n")
write_json(f"{root}/tiny/bert-base-cased/tokenizer_config.json", {"do_lower_case": False})

# Byte-level BPE (GPT-2's scheme): every byte's symbol, then merges building each word with and
# without the space marker.
def byte_symbols():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out
symbols = byte_symbols()
bpe = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
for b in range(256):
    bpe.setdefault(symbols[b], len(bpe))
merges = []
for word in words:
    for form in (word, symbols[ord(" ")] + word):
        token = form[0]
        for ch in form[1:]:
            merged = token + ch
            if merged not in bpe:
                merges.append(f"{token} {ch}")
                bpe[merged] = len(bpe)
            token = merged
bpe["<mask>"] = len(bpe)
write_json(f"{root}/tiny/roberta-large/vocab.json", bpe)
write(f"{root}/tiny/roberta-large/merges.txt", "#version: 0.2\n" + "\n".join(merges) + "\n")

# Tiny configs with the real layer counts (so stage pins mean the same), hidden size 32.
write_json(f"{root}/tiny/bert-base-cased/config.json", {
    "architectures": ["BertForMaskedLM"], "hidden_act": "gelu", "hidden_size": 32,
    "intermediate_size": 64, "max_position_embeddings": 64, "model_type": "bert",
    "num_attention_heads": 4, "num_hidden_layers": 12, "pad_token_id": 0,
    "type_vocab_size": 2, "vocab_size": len(vocab)})
write_json(f"{root}/tiny/roberta-large/config.json", {
    "architectures": ["RobertaForMaskedLM"], "bos_token_id": 0, "eos_token_id": 2,
    "hidden_act": "gelu", "hidden_size": 32, "intermediate_size": 64,
    "max_position_embeddings": 66, "model_type": "roberta", "num_attention_heads": 4,
    "num_hidden_layers": 24, "pad_token_id": 1, "type_vocab_size": 1,
    "vocab_size": len(bpe)})
EOF
}

# A loom-cluster/1 of one node with N CPU devices: $SCRATCH/cpu-N.json.
cpu_cluster() {
  local n=$1 file="$SCRATCH/cpu-$1.json"
  [ -f "$file" ] || sed -e "s/\"devices_per_node\": *[0-9]*/\"devices_per_node\": $n/" \
    -e "s/\"name\": \"local-cpu\"/\"name\": \"cpu-$n\"/" "$ROOT/profiles/clusters/local-cpu.json" >"$file"
  echo "$file"
}

# Weights for a tiny checkpoint: one step from scratch on one CPU rank, saved as a checkpoint,
# whose model.safetensors (Hugging Face names) becomes the stand-in's.
make_weights() {
  local name=$1 dir="$SCRATCH/tiny/$1" work="$SCRATCH/weights-$1"
  [ -f "$dir/model.safetensors" ] && return 0
  mkdir -p "$work"
  "$LOOM_BIN" plan --model "$dir/config.json" --cluster "$(cpu_cluster 1)" --precision fp32 \
    --global-batch 4 --seq-len 32 -o "$work/plan.json" >"$work/plan.log" 2>&1 &&
    "$LOOM_BIN" train "$work/plan.json" --data synthetic:16 --steps 1 --checkpoint "$work/ckpt" \
      >"$work/train.log" 2>&1 &&
    cp "$work"/ckpt/step-*/model.safetensors "$dir/" ||
    { echo "readme_jobs: could not make the weights of the tiny $name (logs in $work)" >&2; return 1; }
}

# --- the loom function ------------------------------------------------------------------------

BACKGROUND=()  # node ranks started in the background
PORT=29700

# The tiny stand-in of a checkpoint folder argument (bert-base-cased/ ...), or the argument.
tiny() {
  local name=${1%/}
  if [ -d "$SCRATCH/tiny/$name" ]; then echo "$SCRATCH/tiny/$name/"; else echo "$1"; fi
}

# PLAN on the CPU: the plan itself for a CPU cluster, else the same layout replanned for a CPU
# cluster with tiny stand-ins (PLAN.cpu.json, made again when PLAN is newer); prints the plan to
# train.
cpu_plan() {
  local plan=$1
  [ -f "$plan" ] || { echo "readme_jobs: no plan $plan" >&2; return 1; }
  if [ "$(jq -r '.cluster.device.kind // "gpu"' "$plan")" = cpu ]; then
    echo "$plan"
    return 0
  fi
  local model name dp tp pp out="${plan%.json}.cpu.json"
  [ "$out" -nt "$plan" ] && { echo "$out"; return 0; }
  name=$(jq -r '.model.name' "$plan")
  model=$(tiny "$name")
  [ -d "$model" ] || { echo "readme_jobs: no tiny stand-in of model $name for $plan" >&2; return 1; }
  dp=$(jq '.strategy.dp' "$plan")
  tp=$(jq '.strategy.tp' "$plan")
  pp=$(jq '.strategy.pp' "$plan")
  local stages
  stages=$(jq -r '[.stages[] | "\(.first_layer)-\(.last_layer)"] | join(",")' "$plan")
  local args=(plan --model "${model}config.json" --cluster "$(cpu_cluster $((dp * tp * pp)))" --precision fp32
    --global-batch $((dp * pp * 2)) --seq-len 32 --dp "$dp" --tp "$tp" --pp "$pp"
    --zero "$(jq '.strategy.zero' "$plan")" --schedule "$(jq -r '.strategy.schedule' "$plan")"
    --virtual-stages "$(jq '.strategy.virtual_stages' "$plan")"
    --recompute "$(jq -r '.strategy.recompute' "$plan")" --stages "$stages" -o "$out")
  if jq -e '.model.num_labels' "$plan" >/dev/null; then
    args+=(--num-labels "$(jq '.model.num_labels' "$plan")")
  fi
  echo "  replans: loom ${args[*]}" >&2
  "$LOOM_BIN" "${args[@]}" >"$out.log" 2>&1 || { cat "$out.log" >&2; return 1; }
  echo "$out"
}

# `loom train ARGS` rewritten for the CPU: prints the arguments, one per line.
train_args() {
  local plan=$2 cpu
  cpu=$(cpu_plan "$plan") || return 1
  printf '%s\n' train "$cpu"
  shift 2
  local steps_given=0 rewrite=0
  [ "$cpu" = "$plan" ] || rewrite=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --init | --tokenizer)
        printf '%s\n' "$1" "$(tiny "$2")"
        shift 2 ;;
      --epochs | --steps)
        steps_given=1
        if [ $rewrite = 1 ]; then printf '%s\n' --steps 2; else printf '%s\n' "$1" "$2"; fi
        shift 2 ;;
      --checkpoint-every)
        if [ $rewrite = 1 ]; then printf '%s\n' "$1" 1; else printf '%s\n' "$1" "$2"; fi
        shift 2 ;;
      *)
        printf '%s\n' "$1"
        shift ;;
    esac
  done
  [ $rewrite = 1 ] && [ $steps_given = 0 ] && printf '%s\n' --steps 2
  return 0
}

run_launch() {
  local opts=() nnodes=1 node_rank=0 has_port=0
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in
      --master-addr) opts+=("$1" 127.0.0.1); shift 2 ;;
      --nnodes) nnodes=$2; opts+=("$1" "$2"); shift 2 ;;
      --node-rank) node_rank=$2; opts+=("$1" "$2"); shift 2 ;;
      --master-port) has_port=1; opts+=("$1" "$2"); shift 2 ;;
      *) opts+=("$1"); shift ;;
    esac
  done
  shift  # --
  if [ $has_port = 0 ]; then
    [ "$node_rank" = 0 ] && PORT=$((PORT + 1))
    opts+=(--master-port "$PORT")
  fi
  local command=("$@")
  if [ "${1:-}" = loom ] && [ "${2:-}" = train ]; then
    mapfile -t command < <(train_args "${@:2}") && [ ${#command[@]} -gt 0 ] || return 1
    command=(loom "${command[@]}")
  fi
  echo "  runs: loom launch ${opts[*]} -- ${command[*]}"
  if [ "$node_rank" -lt $((nnodes - 1)) ]; then
    "$LOOM_BIN" launch "${opts[@]}" -- "${command[@]}" &
    BACKGROUND+=($!)
    return 0
  fi
  local status=0 pid
  "$LOOM_BIN" launch "${opts[@]}" -- "${command[@]}" || status=$?
  for pid in "${BACKGROUND[@]}"; do wait "$pid" || status=$?; done
  BACKGROUND=()
  return $status
}

loom() {
  case "${1:-}" in
    train)
      local args
      mapfile -t args < <(train_args "$@") && [ ${#args[@]} -gt 0 ] || return 1
      echo "  runs: loom ${args[*]}"
      "$LOOM_BIN" "${args[@]}" ;;
    launch)
      shift
      run_launch "$@" ;;
    *)
      "$LOOM_BIN" "$@" ;;
  esac
}

sbatch() {
  bash -n "$1" && echo "  (no Slurm here: $1 has valid syntax; not submitted)"
}

# --- the README's blocks ----------------------------------------------------------------------

# The lines of README.md's ```sh blocks, one per line, with "## heading" lines before each block.
readme_commands() {
  awk '/^## / { heading = $0 }
       /^```sh *$/ { inside = 1; print heading; next }
       /^```/ { inside = 0; next }
       inside && NF && $1 !~ /^#/ { print }' "$README"
}

make_stand_ins || exit 1
make_weights bert-base-cased || exit 1
make_weights roberta-large || exit 1
mkdir -p "$SCRATCH/work"
cd "$SCRATCH/work" || exit 1
ln -sfn ../hub/bert-base-cased bert-base-cased
ln -sfn ../hub/roberta-large roberta-large
ln -sfn ../data/aclImdb aclImdb

failures=()
count=0
while IFS= read -r line <&3; do
  if [[ $line == "## "* ]]; then
    echo
    echo "== ${line#\#\# }"
    continue
  fi
  count=$((count + 1))
  echo "\$ $line"
  if ! eval "$line" </dev/null; then
    echo "readme_jobs: FAILED: $line" >&2
    failures+=("$line")
    [ "$KEEP_GOING" = 1 ] || exit 1
  fi
done 3< <(readme_commands)

echo
if [ ${#failures[@]} -gt 0 ]; then
  echo "readme_jobs: ${#failures[@]} of $count commands failed:" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "readme_jobs: all $count commands of $README ran (scratch folder $SCRATCH)"
