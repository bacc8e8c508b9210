#!/usr/bin/env python3
"""The cost model's fused-attention time against kernels measured by bench/gpu_layers.py.

Usage: bench/attention_check.py LAYERS.json... [--efficiency E] [--backend NAME]

Reads the kernel constants (FusedAttentionFit) and the fixed time per kernel (GemmFit::fixed_s)
from costmodel/gemm.hpp, so that it checks what the C++ model computes, and times every
attention and encoder row of the files as fused_attention_time_s does: the blocks (one per 128
queries of each sample and head) in whole waves over the SMs, each walking its tiles of 128 x 128
scores (a causal block those on and under the diagonal). Prints the median and largest |error|
per backend and pass, and each row with --rows. The device is an H100/H200 (132 SMs, 989.5
TFLOP/s bf16 at the 0.905 sustained clock of the shipped files); E (--efficiency, default 0.893)
is the kernel's product rate as a fraction of that.
"""
import json
import math
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMS = 132
PEAK = 989.5e12 * 0.905


def constants():
    text = open(os.path.join(ROOT, "costmodel", "gemm.hpp")).read()
    pairs = {name: [float(v) for v in re.search(
        name + r"\s*=\s*\{([^}]*)\}", text).group(1).split(",")]
        for name in ["exp_head_dims", "dropout_head_dims", "mask_head_dims",
                     "block_tile_head_dims"]}
    single = {name: float(re.search(r"double " + name + r"\s*=\s*([0-9.e-]+)", text).group(1))
              for name in ["backward_rate", "mask_setup_s", "dropout_setup_s", "fixed_s"]}
    return pairs, single


def predict(r, backward, eff, pairs, single):
    tiles = math.ceil(r["seq"] / 128)
    heads = r["batch"] * r["heads"]
    blocks = heads * tiles
    walked = tiles * (tiles + 1) / 2 if r["causal"] else tiles * tiles
    elements = heads * walked * 128 * 128
    dropout = r.get("dropout", 0) > 0
    mask = bool(r.get("mask", False))
    p = 1 if backward else 0
    per_dim = 4 * 2.5 / single["backward_rate"] if backward else 4
    dims = (r["head_dim"] + pairs["exp_head_dims"][p] +
            (pairs["dropout_head_dims"][p] if dropout else 0) +
            (pairs["mask_head_dims"][p] if mask else 0))
    work = per_dim * (elements * dims + blocks * 128 * 128 * pairs["block_tile_head_dims"][p])
    rate = PEAK * eff
    setup = 0 if backward else ((single["mask_setup_s"] if mask else 0) +
                                (single["dropout_setup_s"] if dropout else 0))
    return single["fixed_s"] + setup + math.ceil(blocks / SMS) * (work / blocks) / (rate / SMS)


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    eff = 0.893
    only = None
    show = "--rows" in args
    files = []
    i = 0
    while i < len(args):
        if args[i] == "--efficiency":
            eff = float(args[i + 1])
            i += 1
        elif args[i] == "--backend":
            only = args[i + 1]
            i += 1
        elif args[i] != "--rows":
            files.append(args[i])
        i += 1
    pairs, single = constants()
    errors = {}
    for path in files:
        for r in json.load(open(path))["rows"]:
            if r.get("group") not in ("attention", "encoder") or "error" in r:
                continue
            if only and r["backend"] != only:
                continue
            for backward, key in [(False, "forward_s"), (True, "backward_s")]:
                t = predict(r, backward, eff, pairs, single)
                e = t / r[key] - 1
                errors.setdefault((r["backend"], key), []).append(e)
                if show:
                    print(f"{r['backend']:8} h{r['hidden']}/{r['heads']} s{r['seq']:<6} "
                          f"{'causal' if r['causal'] else 'full  '} p{r.get('dropout', 0)} "
                          f"mask {int(bool(r.get('mask')))} {key[:-2]:8} measured "
                          f"{r[key] * 1e6:9.1f} us  model {t * 1e6:9.1f} us  {100 * e:+6.1f} %")
    print(f"attention_efficiency {eff}")
    print("backend  pass      rows  median |error|  largest |error|")
    for (backend, key), es in sorted(errors.items()):
        a = [abs(x) for x in es]
        print(f"{backend:8} {key[:-2]:8} {len(es):5}  {100 * statistics.median(a):13.1f} %"
              f"  {100 * max(a):14.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
