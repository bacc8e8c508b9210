#!/usr/bin/env python3
"""The Hugging Face side of bench/gpu.sh: transformers' figures for the same models,
ids and batches that Loom runs, on the same GPU. Needs torch, transformers and safetensors (the
GPU machine's Python); Loom's side never imports this. DEVICE=cpu runs them on the CPU (the GPU
is the default).

  hf_reference.py make DIR
      Small random BERT and RoBERTa sequence classifiers made with transformers and saved with
      save_pretrained (safetensors): DIR/bert/ and DIR/roberta/, each with config.json,
      model.safetensors and vocab.txt (a WordPiece vocabulary of the words of DIR/reviews.csv, a
      Kaggle-style `review,sentiment` file for loom train), and DIR/ids.json (token ids with
      padding, for loom logits).
  hf_reference.py reviews DIR N WORDS
      N reviews of WORDS words each (DIR/long.csv) and their vocabulary (DIR/vocab.txt): data
      without padding at any sequence length up to WORDS + 2 tokens, for the throughput runs.
  hf_reference.py logits CHECKPOINT IDS.json PRECISION
      transformers' logits for IDS.json (PRECISION fp32 or bf16: torch.autocast), as JSON.
  hf_reference.py compare-logits REFERENCE.json LOOM.json RELATIVE_TOLERANCE
      max |loom - reference| / max |reference| over all logits; exit 1 above the tolerance.
  hf_reference.py losses CHECKPOINT BATCHES.jsonl METRICS.jsonl LR WEIGHT_DECAY WARMUP TOTAL CLIP
      Replays the micro-batches `loom train --dump-batches` wrote with transformers (fp32, dropout
      0, AdamW with Loom's groups and linear schedule, clipping) and prints both losses per step.
  hf_reference.py throughput MODEL SEQ BATCH STEPS [compile]
      Training samples/s of transformers' BertForSequenceClassification made from MODEL (a
      config name: bert-base-uncased or bert-large-uncased, built offline from its sizes), bf16
      autocast, AdamW; optionally torch.compile'd. Prints one JSON line.
"""
import json
import math
import os
import sys
import time


# Where transformers runs: the GPU unless DEVICE says otherwise (DEVICE=cpu: fp32 and bf16 autocast
# on the CPU, for the correctness checks on a machine without a GPU).
DEVICE = os.environ.get("DEVICE", "cuda")


def die(message):
    print(f"hf_reference.py: {message}", file=sys.stderr)
    sys.exit(2)


WORDS = ("good great fine superb moving bad awful dull boring weak plot actor film movie story "
         "scene music ending cast script the a an and but of to was is it this that very not "
         "really quite rather some").split()


# A WordPiece vocabulary of WORDS: BERT's special tokens first ([PAD] 0, [CLS] 2, [SEP] 3).
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))


def make(out):
    import random

    import torch
    from transformers import (BertConfig, BertForSequenceClassification, RobertaConfig,
                              RobertaForSequenceClassification)

    os.makedirs(out, exist_ok=True)
    random.seed(7)
    torch.manual_seed(7)
    # Reviews: sentiment words decide the label, the rest are distractors.
    rows = []
    for i in range(64):
        label = i % 2
        mood = WORDS[:5] if label else WORDS[5:10]
        words = [random.choice(WORDS[10:]) for _ in range(random.randint(6, 20))]
        for _ in range(2):
            words.insert(random.randrange(len(words) + 1), random.choice(mood))
        rows.append((" ".join(words), "positive" if label else "negative"))
    with open(os.path.join(out, "reviews.csv"), "w") as f:
        f.write("review,sentiment\n")
        for text, sentiment in rows:
            f.write(f'"{text}",{sentiment}\n')
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, num_labels=2)
    bert = BertForSequenceClassification(
        BertConfig(vocab_size=len(VOCAB), max_position_embeddings=64, **sizes))
    roberta = RobertaForSequenceClassification(
        RobertaConfig(vocab_size=len(VOCAB), max_position_embeddings=66, type_vocab_size=1,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2, **sizes))
    for name, model in (("bert", bert), ("roberta", roberta)):
        folder = os.path.join(out, name)
        model.save_pretrained(folder)  # safetensors, transformers' default since 4.35
        with open(os.path.join(folder, "vocab.txt"), "w") as f:
            f.write("\n".join(VOCAB) + "\n")
    # Ids for logits: 4 rows of 16, two of them padded (BERT's [PAD] is 0; RoBERTa's is 1, but the
    # mask decides, and both checks use the same ids).
    ids, mask = [], []
    for r in range(4):
        length = 16 if r < 2 else 9 + r
        row = [2] + [random.randrange(5, len(VOCAB)) for _ in range(length - 2)] + [3]
        ids.append(row + [0] * (16 - length))
        mask.append([1] * length + [0] * (16 - length))
    with open(os.path.join(out, "ids.json"), "w") as f:
        json.dump({"input_ids": ids, "attention_mask": mask}, f)


def reviews(out, n, words):
    import random

    os.makedirs(out, exist_ok=True)
    random.seed(11)
    with open(os.path.join(out, "long.csv"), "w") as f:
        f.write("review,sentiment\n")
        for i in range(int(n)):
            text = " ".join(random.choice(WORDS) for _ in range(int(words)))
            f.write(f'"{text}",{"positive" if i % 2 else "negative"}\n')
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")


def load(checkpoint):
    import torch
    from transformers import AutoModelForSequenceClassification

    try:  # `dtype` from transformers 4.56; `torch_dtype` before (deprecated in 5)
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.float32)
    except TypeError:
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint,
                                                                   torch_dtype=torch.float32)
    return model.to(DEVICE)


def logits(checkpoint, ids_path, precision):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = load(checkpoint).eval()
    doc = json.load(open(ids_path))
    ids = torch.tensor(doc["input_ids"]).to(DEVICE)
    mask = torch.tensor(doc.get("attention_mask", [[1] * len(r) for r in doc["input_ids"]]))
    mask = mask.to(DEVICE)
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16,
                                         enabled=precision == "bf16"):
        out = model(input_ids=ids, attention_mask=mask).logits.float()
    print(json.dumps({"logits": out.cpu().tolist()}))


def compare_logits(reference, loom, tolerance):
    a = [x for row in json.load(open(reference))["logits"] for x in row]
    b = [x for row in json.load(open(loom))["logits"] for x in row]
    if len(a) != len(b):
        print(f"logits: {len(b)} values from loom, {len(a)} from transformers")
        sys.exit(1)
    tolerance = float(tolerance)
    scale = max(abs(x) for x in a) or 1.0
    error = max(abs(x - y) for x, y in zip(a, b)) / scale
    print(f"max relative difference {error:.3e} (tolerance {tolerance:g})")
    sys.exit(0 if error <= tolerance else 1)


def losses(checkpoint, batches_path, metrics_path, lr, weight_decay, warmup, total, clip):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lr, weight_decay, clip = float(lr), float(weight_decay), float(clip)
    warmup, total = int(warmup), int(total)
    model = load(checkpoint).train()
    decay = [p for n, p in model.named_parameters()
             if not (n.endswith(".bias") or "LayerNorm." in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or "LayerNorm." in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.999), eps=1e-8)

    def factor(step):  # Loom's (and transformers') linear schedule with warm-up
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    steps = {}
    for line in open(batches_path):
        b = json.loads(line)
        steps.setdefault(b["step"], []).append(b)
    loom = {m["step"]: m["loss"] for m in map(json.loads, open(metrics_path)) if "eval" not in m}
    worst = 0.0
    for step in sorted(steps):
        micro = steps[step]
        for group in optimizer.param_groups:
            group["lr"] = lr * factor(step - 1)
        optimizer.zero_grad()
        loss_sum = 0.0
        for b in micro:
            out = model(input_ids=torch.tensor(b["input_ids"]).to(DEVICE),
                        attention_mask=torch.tensor(b["attention_mask"]).to(DEVICE),
                        token_type_ids=torch.tensor(b["token_type_ids"]).to(DEVICE))
            labels = torch.tensor(b["labels"]).to(DEVICE)
            loss = torch.nn.functional.cross_entropy(out.logits.float(), labels) / len(micro)
            loss.backward()
            loss_sum += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        difference = abs(loss_sum - loom[step])
        worst = max(worst, difference)
        print(f"step {step}: transformers {loss_sum:.6f}, loom {loom[step]:.6f}, "
              f"|difference| {difference:.2e}")
    print(json.dumps({"max_loss_difference": worst}))


SIZES = {"bert-base-uncased": (768, 12, 12, 3072), "bert-large-uncased": (1024, 24, 16, 4096)}


def throughput(name, seq, batch, steps, compiled):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    hidden, layers, heads, ffn = SIZES[name]
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ffn,
                        max_position_embeddings=512, num_labels=2)
    model = BertForSequenceClassification(config).to(DEVICE).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    step_model = torch.compile(model) if compiled else model
    ids = torch.randint(5, 30522, (batch, seq), device=DEVICE)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (batch,), device=DEVICE)
    cuda = DEVICE == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times = []
    for i in range(steps + 3):
        sync()
        start = time.perf_counter()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = step_model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"model": name, "seq": seq, "batch": batch, "compiled": compiled,
                      "median_step_s": median, "samples_per_s": batch / median,
                      "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else 0}))


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    command, args = argv[1], argv[2:]
    if command == "make" and len(args) == 1:
        make(*args)
    elif command == "reviews" and len(args) == 3:
        reviews(*args)
    elif command == "logits" and len(args) == 3:
        logits(*args)
    elif command == "compare-logits" and len(args) == 3:
        compare_logits(*args)
    elif command == "losses" and len(args) == 8:
        losses(*args)
    elif command == "throughput" and len(args) in (4, 5):
        throughput(args[0], int(args[1]), int(args[2]), int(args[3]),
                   len(args) == 5 and args[4] == "compile")
    else:
        die(f"bad arguments for {command!r}; see the usage at the top of this file")


if __name__ == "__main__":
    main(sys.argv)
