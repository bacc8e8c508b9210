#!/usr/bin/env python3
"""Device time of fused attention and of whole decoder blocks, measured with PyTorch on one GPU.

Usage: [LAYERS="attention encoder block"] bench/gpu_layers.py OUT.json [--quick]

Three groups, each timed with CUDA events around every iteration (eager launches), the median
over iterations; each row records the host's time per iteration beside the device's.

Each measurement starts behind a spin of the device (torch.cuda._sleep) so that the host has queued
the iterations before the device reaches them. Groups:

- attention: torch's scaled_dot_product_attention in bf16 at a fixed number of tokens per call
  (ATTN_TOKENS, 32768) and sequence lengths 512-32768, causal and not, for three (hidden, heads)
  shapes (head dimension 64 and 128), with each backend that runs (flash, cudnn, and the default
  dispatch, which is what LibTorch's at::scaled_dot_product_attention picks); forward alone and
  forward plus backward. The FLOPs are those the cost model counts: 4 b s^2 h forward, 2.5 times
  that backward, half of each for a causal mask.
- encoder: the same at BERT-base and BERT-large shapes (head dimension 64) at ENC_TOKENS (8192)
  tokens and sequence 128-2048, non-causal, as Loom's executor calls it: with attention dropout
  0.1 or none, and with a boolean key mask (b, 1, 1, s) or none, each backend (the efficient
  kernel too, the one that takes a mask), so that which kernel the default dispatch picks, and
  at what rate, shows;
- block: an MPT-style decoder block as llm-foundry builds it (no biases, LayerNorm, fused QKV
  projection, causal flash attention, output projection, 4h GeLU MLP, two residual adds, no
  dropout) with bf16 weights, at BLOCK_TOKENS (16384) tokens per micro-batch and sequence 512,
  2048 and 8192, for MPT-125M, -1B and -7B widths; forward alone and forward plus backward,
  and the four products of the block alone, so that the rest (attention, elementwise kernels)
  can be separated from the matrix work.

OUT.json holds {"info", "rows"}; a table is printed. With DEVICE=cpu (or no GPU) it runs tiny
sizes on the CPU as a check of the script only.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DEVICE = os.environ.get("DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
GPU = DEVICE == "cuda"
QUICK = "--quick" in sys.argv or not GPU
TARGET_S = 0.15  # device time spent per measurement
SPIN_CYCLES = 100_000_000  # torch.cuda._sleep before each measurement (about 50 ms)


def sync():
    if GPU:
        torch.cuda.synchronize()


def timed(fn):
    """(median device seconds, median host seconds) per call of fn, over enough calls to fill
    TARGET_S after two warm-up calls."""
    fn()
    fn()
    sync()
    t = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t
    iters = int(max(3, min(30, TARGET_S / max(first, 1e-6))))
    if not GPU:
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times), statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    host = []
    # A spin of about 50 ms first, so that the host queues every iteration before the device
    # reaches them: the events then time the kernels back to back, not the host's issue.
    torch.cuda._sleep(SPIN_CYCLES)
    for start, end in events:
        h = time.perf_counter()
        start.record()
        fn()
        end.record()
        host.append(time.perf_counter() - h)
    sync()
    dev = [s.elapsed_time(e) * 1e-3 for s, e in events]
    return statistics.median(dev), statistics.median(host)


def randn(shape, grad=False):
    x = torch.randn(shape, device=DEVICE, dtype=torch.float32).to(torch.bfloat16)
    return x.requires_grad_(grad)


def backends():
    """(name, context factory) of each SDPA backend this torch has."""
    out = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return out
    for name in ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"]:
        if hasattr(SDPBackend, name):
            out.append((name.split("_")[0].lower(),
                        lambda b=getattr(SDPBackend, name): sdpa_kernel([b])))
    return out


def measure(row, ctx, fwd, both, inputs):
    """Times fwd and both (forward and backward) under the backend context ctx (None: the
    default dispatch) into row; a backend that refuses the arguments costs its row an "error".
    True when it ran."""
    try:
        if ctx is not None:
            with ctx():
                f, fh = timed(fwd)
                fb, _ = timed(both)
        else:
            f, fh = timed(fwd)
            fb, _ = timed(both)
    except Exception as err:
        row["error"] = str(err)[:160]
        return False
    for t in inputs:
        t.grad = None
    flops = row["forward_flops"]
    row.update({"forward_s": f, "host_forward_s": fh, "backward_s": fb - f,
                "forward_tflops": flops / f / 1e12,
                "backward_tflops": 2.5 * flops / max(fb - f, 1e-9) / 1e12})
    return True


def inputs(shapes, seqs, tokens, skip):
    """For each SDPA backend (but those in skip; on a CPU only the default), (hidden, heads) shape
    and sequence: the backend's name and context, the shape, the batch that makes `tokens`, and
    bf16 q, k, v (requiring gradients) and an output gradient, (batch, heads, seq, head_dim)."""
    for name, ctx in backends():
        if name in skip or (not GPU and name != "default"):
            continue
        for hidden, heads in shapes:
            for s in seqs:
                b = max(1, tokens // s)
                d = hidden // heads
                q, k, v = (randn((b, heads, s, d), True) for _ in range(3))
                yield name, ctx, (hidden, heads, s, b, d), (q, k, v, randn((b, heads, s, d)))
        if GPU:
            torch.cuda.empty_cache()


def attention(rows):
    """Long sequences, decoder and encoder shapes, no dropout, no mask."""
    tokens = int(os.environ.get("ATTN_TOKENS", 32768)) if not QUICK else 256
    shapes = [(768, 12), (2048, 16), (4096, 32)] if not QUICK else [(64, 2)]
    seqs = [512, 1024, 2048, 4096, 8192, 16384, 32768] if not QUICK else [64, 128]
    for name, ctx, (hidden, heads, s, b, d), (q, k, v, g) in inputs(shapes, seqs, tokens,
                                                                    ("efficient",)):
        for causal in [False, True]:
            flops = 4 * b * s * s * hidden * (0.5 if causal else 1)

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def both():
                fwd().backward(g)
            row = {"group": "attention", "backend": name, "hidden": hidden, "heads": heads,
                   "head_dim": d, "seq": s, "batch": b, "causal": causal,
                   "forward_flops": flops, "backward_flops": 2.5 * flops}
            measure(row, ctx, fwd, both, (q, k, v))
            rows.append(row)


def kernel_names(fn):
    """The names of the attention kernels one call of fn runs (what the dispatch picked)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        keys = ("attention", "fmha", "flash", "cudnn", "sdpa", "softmax", "mha")
        return sorted({e.key[:90] for e in prof.key_averages()
                       if any(w in e.key.lower() for w in keys)})
    except Exception as err:  # the profiler is a side show: its failure costs nothing else
        return ["profiler: " + str(err)[:80]]


def encoder(rows):
    """BERT shapes at short sequences, with and without dropout and a key mask."""
    tokens = int(os.environ.get("ENC_TOKENS", 8192)) if not QUICK else 256
    shapes = [(768, 12), (1024, 16)] if not QUICK else [(64, 2)]
    seqs = [128, 256, 384, 512, 1024, 2048] if not QUICK else [64]
    for name, ctx, (hidden, heads, s, b, d), (q, k, v, g) in inputs(shapes, seqs, tokens, ()):
        keep = torch.ones((b, 1, 1, s), device=DEVICE, dtype=torch.bool)
        for p in [0.0, 0.1]:
            for mask in [None, keep]:
                flops = 4 * b * s * s * hidden

                def fwd():
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

                def both():
                    fwd().backward(g)
                row = {"group": "encoder", "backend": name, "hidden": hidden, "heads": heads,
                       "head_dim": d, "seq": s, "batch": b, "causal": False, "dropout": p,
                       "mask": mask is not None, "forward_flops": flops,
                       "backward_flops": 2.5 * flops}
                if measure(row, ctx, fwd, both, (q, k, v)) and GPU and name == "default":
                    row["kernels"] = kernel_names(both)
                rows.append(row)


class Block(torch.nn.Module):
    """An MPT block: pre-LayerNorm attention and GeLU MLP, no biases, no dropout."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden, bias=False)
        self.wqkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)
        self.ln2 = torch.nn.LayerNorm(hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = torch.nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        qkv = self.wqkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def block(rows):
    tokens = int(os.environ.get("BLOCK_TOKENS", 16384)) if not QUICK else 128
    shapes = [(768, 12), (2048, 16), (4096, 32)] if not QUICK else [(64, 2)]
    seqs = [512, 2048, 8192] if not QUICK else [32, 64]
    for hidden, heads in shapes:
        m = Block(hidden, heads).to(device=DEVICE, dtype=torch.bfloat16)
        for s in seqs:
            b = max(1, tokens // s)
            x = randn((b, s, hidden), True)
            g = randn((b, s, hidden))

            def fwd():
                return m(x)

            def both():
                m(x).backward(g)
            f, fh = timed(fwd)
            fb, bh = timed(both)
            m.zero_grad(set_to_none=True)
            x.grad = None
            # The block's four products alone (forward), at the same tokens.
            t = b * s
            prod = 0.0
            for n, k in [(3 * hidden, hidden), (hidden, hidden), (4 * hidden, hidden),
                         (hidden, 4 * hidden)]:
                a = randn((t, k))
                w = randn((k, n))
                prod += timed(lambda: torch.matmul(a, w))[0]
            flops = 2 * t * 12 * hidden * hidden
            rows.append({"group": "block", "hidden": hidden, "heads": heads, "seq": s,
                         "batch": b, "tokens": t, "forward_s": f, "host_forward_s": fh,
                         "backward_s": fb - f, "host_both_s": bh,
                         "products_forward_s": prod, "product_flops": flops,
                         "products_tflops": flops / prod / 1e12})
            del x, g
        del m
        if GPU:
            torch.cuda.empty_cache()


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    rows = []
    info = {"device": torch.cuda.get_device_name() if GPU else "cpu", "torch": torch.__version__}
    parts = {"attention": attention, "encoder": encoder, "block": block}
    chosen = os.environ.get("LAYERS", "attention encoder block").split()
    for part in (parts[c] for c in chosen):
        t = time.perf_counter()
        try:
            part(rows)
        except Exception as err:
            rows.append({"group": part.__name__, "error": str(err)[:300]})
        print(f"{part.__name__}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    with open(sys.argv[1], "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=0)
    print(f"| layers on {info['device']} (torch {info['torch']}) | - | - | - |")
    for r in rows:
        if "error" in r:
            print(f"| {r['group']} {r.get('backend', '')} {r.get('seq', '')} | error "
                  f"{r['error'][:80]} | - | - |")
        elif r["group"] in ("attention", "encoder"):
            extra = (f" p{r['dropout']} {'mask' if r['mask'] else 'nomask'}"
                     if r["group"] == "encoder" else "")
            print(f"| {r['group']} {r['backend']}{extra} h{r['hidden']}/{r['heads']} s{r['seq']} "
                  f"{'causal' if r['causal'] else 'full'} | fwd {r['forward_tflops']:.0f}, "
                  f"bwd {r['backward_tflops']:.0f} TFLOP/s | - | - |")
        else:
            print(f"| block h{r['hidden']} s{r['seq']} b{r['batch']} | fwd "
                  f"{r['forward_s'] * 1e3:.3f} ms (products {r['products_forward_s'] * 1e3:.3f}),"
                  f" bwd {r['backward_s'] * 1e3:.3f} ms, host {r['host_both_s'] * 1e3:.3f} ms "
                  f"| - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
