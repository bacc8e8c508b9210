#!/usr/bin/python3
"""BERT-base sequence classification trained in plain PyTorch: the Python reference that
bench/train_vs_python.sh times against `loom train`.

The same model and step as loom's executor (executor/model.cpp, executor/train.cpp), without the
transformers package: word + position + token-type embeddings, LayerNorm (eps 1e-12), 12 post-LN
layers (self-attention with an additive padding mask, exact GELU MLP), tanh pooler on the first
token, classifier; dropout 0.1 on hidden states, attention probabilities and the head; weights
normal(0, 0.02), biases 0. One step: forward, cross-entropy, backward, clip the gradient norm to
1.0, AdamW (lr 2e-5, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on weights, none on biases and
LayerNorm weights), fp32, on the CPU. Inputs are random token ids with random lengths (padding
after), generated before timing.

Prints one JSON line: {"median_step_time_s", "samples_per_s", "step_times_s", "threads", ...}.

Usage: /usr/bin/python3 bench/python_bert.py [--steps N] [--warmup W] [--threads T]
       [--batch 8] [--seq-len 128]
(Debian's python3-torch; not a pyenv python3 without torch.)
"""
import argparse
import json
import math
import statistics
import time

import torch
from torch import nn

# bert-base (profiles/models/bert-base.json)
VOCAB = 30522
HIDDEN = 768
LAYERS = 12
HEADS = 12
FFN = 3072
MAX_POSITIONS = 512
TYPE_VOCAB = 2
LABELS = 2
EPS = 1e-12
DROPOUT = 0.1


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(HIDDEN, HIDDEN)
        self.key = nn.Linear(HIDDEN, HIDDEN)
        self.value = nn.Linear(HIDDEN, HIDDEN)
        self.dropout = nn.Dropout(DROPOUT)

    def heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

    def forward(self, x, additive_mask):
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS)
        probs = self.dropout(torch.softmax(scores + additive_mask, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(x.shape[0], x.shape[1], HIDDEN)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = SelfAttention()
        self.attention_output = nn.Linear(HIDDEN, HIDDEN)
        self.attention_norm = nn.LayerNorm(HIDDEN, eps=EPS)
        self.intermediate = nn.Linear(HIDDEN, FFN)
        self.output = nn.Linear(FFN, HIDDEN)
        self.output_norm = nn.LayerNorm(HIDDEN, eps=EPS)
        self.dropout = nn.Dropout(DROPOUT)
        self.gelu = nn.GELU()  # exact (erf)

    def forward(self, x, additive_mask):
        a = self.attention_norm(
            self.dropout(self.attention_output(self.attention(x, additive_mask))) + x)
        return self.output_norm(self.dropout(self.output(self.gelu(self.intermediate(a)))) + a)


class BertClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
        self.position = nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.token_type = nn.Embedding(TYPE_VOCAB, HIDDEN)
        self.embedding_norm = nn.LayerNorm(HIDDEN, eps=EPS)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.classifier = nn.Linear(HIDDEN, LABELS)
        self.dropout = nn.Dropout(DROPOUT)
        for module in self.modules():  # transformers' _init_weights
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.data.normal_(0.0, 0.02)
            if isinstance(module, nn.Linear):
                module.bias.data.zero_()
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()

    def forward(self, ids, mask, types):
        positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
        x = self.word(ids) + self.position(positions) + self.token_type(types)
        x = self.dropout(self.embedding_norm(x))
        additive = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, additive)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(self.dropout(pooled))


def make_optimizer(model, lr, weight_decay):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        exempt = name.endswith(".bias") or "norm" in name
        (no_decay if exempt else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.999), eps=1e-8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = BertClassifier()
    model.train()
    optimizer = make_optimizer(model, 2e-5, 0.01)
    params = sum(p.numel() for p in model.parameters())

    total = args.warmup + args.steps
    batches = []
    for _ in range(total):
        ids = torch.randint(5, VOCAB, (args.batch, args.seq_len))
        lengths = torch.randint(16, args.seq_len + 1, (args.batch, 1))
        mask = (torch.arange(args.seq_len)[None, :] < lengths).long()
        ids = ids * mask  # padding id 0 after each sequence's length
        ids[:, 0] = 2  # [CLS]
        batches.append((ids, mask, torch.zeros_like(ids), torch.randint(0, LABELS, (args.batch,))))

    times = []
    for step, (ids, mask, types, labels) in enumerate(batches):
        started = time.perf_counter()
        for group in optimizer.param_groups:  # linear decay, as the executor's schedule
            group["lr"] = 2e-5 * (total - step) / total
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(ids, mask, types), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        elapsed = time.perf_counter() - started
        if step >= args.warmup:
            times.append(elapsed)

    median = statistics.median(times)
    print(json.dumps({
        "implementation": "python " + torch.__version__,
        "parameters": params,
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "median_step_time_s": median,
        "samples_per_s": args.batch / median,
        "step_times_s": times,
        "final_loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
