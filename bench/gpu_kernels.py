#!/usr/bin/env python3
"""Device time of the kernels the cost model charges, measured with PyTorch on one GPU.

Usage: bench/gpu_kernels.py OUT.json [--quick] [--gaps]

Five groups. Kernels are timed as device time alone: CUDA events around a captured CUDA graph of
REPEAT launches where capture works, else around REPEAT eager launches, the median of REPLAYS
replays, so that the host's issue of kernels stays out:

- copy: the device's memory bandwidth for a large clone (bytes read plus bytes written);
- elementwise: the eager ATen kernels of a transformer layer (residual add, GeLU, dropout,
  LayerNorm, softmax) forward and backward, at several sizes and dtypes, each with the bytes the
  cost model counts for it (the fewest bytes it must move), so that bytes / time over the copy
  bandwidth is the efficiency the cost model's memory_efficiency stands for;
- gemm: matrix products of transformer shapes (BERT-base and -large, tensor-parallel shards of
  larger models, LM heads) in bf16, fp16, tf32 and fp32, for the shape model's tile and wave
  quantization.

Two groups time what a host issues:

- optimizer: one eager AdamW step (torch.optim.AdamW: per tensor with foreach=False,
  multi-tensor with foreach=True, fused) over a BERT-base-sized set of fp32 parameters, CUDA
  events around the step, the median of 10, beside the host's time for it;
- gaps (alone with --gaps): small products and GeLU issued eagerly back to back with the host
  ahead, against the same kernels in a graph: what a kernel costs in an eager stream beyond itself.

OUT.json holds {"info", "copy_gbps", "rows"}, one object per measurement in "rows"; a table is
printed.
With DEVICE=cpu (or no GPU) it runs small sizes on the CPU as a check of the script only.
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
REPEAT = 20
REPLAYS = 7


def sync():
    if GPU:
        torch.cuda.synchronize()


def device_time_s(fn):
    """Median device time of one call of fn (seconds) and how it was timed."""
    fn()
    sync()
    if GPU:
        how = "graph"
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(REPEAT):
                    fn()
            run = graph.replay
        except Exception:  # capture unsupported for this op: eager launches
            how = "eager"
            torch.cuda.synchronize()

            def run():
                for _ in range(REPEAT):
                    fn()
        run()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPLAYS):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / REPEAT)
        return statistics.median(times), how
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), "host"


def randn(shape, dtype):
    return torch.randn(shape, device=DEVICE, dtype=torch.float32).to(dtype)


def copy_bandwidth(rows):
    n = (1 << 28) if not QUICK else (1 << 22)  # 1 GiB of fp32
    x = randn((n,), torch.float32)
    y = torch.empty_like(x)
    t, how = device_time_s(lambda: y.copy_(x))
    gbps = 2 * 4 * n / t / 1e9
    rows.append({"group": "copy", "op": "copy", "dtype": "fp32", "elements": n, "time_s": t,
                 "bytes": 8 * n, "gbps": gbps, "timed": how})
    return gbps


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def elementwise(rows, copy_gbps):
    hidden = 1024
    token_counts = [1024, 4096, 16384] if not QUICK else [64]
    for dname in ["bf16", "fp32"]:
        dt = DTYPES[dname]
        e = torch.finfo(dt).bits // 8
        for tokens in token_counts:
            for width in [hidden, 4 * hidden]:
                n = tokens * width
                x = randn((tokens, width), dt)
                r = randn((tokens, width), dt)
                g = randn((tokens, width), dt)
                ops = []
                ops.append(("add", lambda: x + r, 3 * e * n))
                ops.append(("gelu", lambda: F.gelu(x), 2 * e * n))
                ops.append(("gelu_backward", lambda: torch.ops.aten.gelu_backward(g, x), 3 * e * n))
                ops.append(("dropout", lambda: torch.ops.aten.native_dropout(x, 0.1, True),
                            2 * e * n + n))
                mask = torch.rand((tokens, width), device=DEVICE) > 0.1
                ops.append(("dropout_backward",
                            lambda: torch.ops.aten.native_dropout_backward(g, mask, 1 / 0.9),
                            2 * e * n + n))
                if width == hidden:
                    w = randn((width,), dt)
                    b = randn((width,), dt)
                    ops.append(("layer_norm", lambda: F.layer_norm(x, (width,), w, b),
                                2 * e * n))
                    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [width], w, b, 1e-5)
                    ops.append(("layer_norm_backward",
                                lambda: torch.ops.aten.native_layer_norm_backward(
                                    g, x, [width], mean, rstd, w, b, [True, True, True]),
                                3 * e * n))
                    ops.append(("gelu_new_chain",
                                lambda: 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (
                                    x + 0.044715 * torch.pow(x, 3.0)))), 2 * e * n))
                for name, fn, nbytes in ops:
                    try:
                        t, how = device_time_s(fn)
                    except Exception as err:  # one op failing costs its row
                        rows.append({"group": "elementwise", "op": name, "error": str(err)[:200]})
                        continue
                    rows.append({"group": "elementwise", "op": name, "dtype": dname,
                                 "tokens": tokens, "width": width, "elements": n, "bytes": nbytes,
                                 "time_s": t, "gbps": nbytes / t / 1e9,
                                 "of_copy": nbytes / t / 1e9 / copy_gbps, "timed": how})
        # softmax over attention scores: batch x heads x s x s
        for heads, seq, batch in ([(16, 128, 32), (16, 512, 8)] if not QUICK else [(2, 16, 2)]):
            n = batch * heads * seq * seq
            s = randn((batch, heads, seq, seq), dt)
            g = randn((batch, heads, seq, seq), dt)
            y = torch.softmax(s, -1)
            for name, fn, nbytes in [
                    ("softmax", lambda: torch.softmax(s, -1), 2 * e * n),
                    ("softmax_backward",
                     lambda: torch.ops.aten._softmax_backward_data(g, y, -1, dt), 3 * e * n)]:
                t, how = device_time_s(fn)
                rows.append({"group": "elementwise", "op": name, "dtype": dname, "seq": seq,
                             "elements": n, "bytes": nbytes, "time_s": t,
                             "gbps": nbytes / t / 1e9, "of_copy": nbytes / t / 1e9 / copy_gbps,
                             "timed": how})


def gemms(rows):
    # (n, k) of transformer layers: BERT-base, BERT-large, and tensor-parallel shards (tp 2, 4,
    # 8) of a 5120-wide layer; m = tokens.
    shapes = [(768, 768), (2304, 768), (3072, 768), (768, 3072),
              (1024, 1024), (3072, 1024), (4096, 1024), (1024, 4096),
              (7680, 5120), (3840, 5120), (1920, 5120), (5120, 2560), (5120, 1280),
              (30522, 768), (50257, 768)]
    ms = [512, 1024, 4096, 16384] if not QUICK else [64]
    if QUICK:
        shapes = shapes[:2]
    precisions = ["bf16", "fp16", "tf32", "fp32"]
    for p in precisions:
        dt = torch.float32 if p in ("tf32", "fp32") else DTYPES[p]
        if GPU:
            torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        for m in ms:
            for n, k in shapes:
                if p == "fp32" and m > 4096:
                    continue
                a = randn((m, k), dt)
                b = randn((k, n), dt)
                c = torch.empty((m, n), device=DEVICE, dtype=dt)
                t, how = device_time_s(lambda: torch.matmul(a, b, out=c))
                rows.append({"group": "gemm", "dtype": p, "m": m, "n": n, "k": k, "time_s": t,
                             "tflops": 2 * m * n * k / t / 1e12, "timed": how})
    if GPU:
        torch.backends.cuda.matmul.allow_tf32 = False


def optimizer(rows):
    # BERT-base's parameter tensors: 151 tensors, 109.5 M values (fp32 weights, grads, moments).
    shapes = [(30522, 768), (512, 768), (2, 768), (768,), (768,)]
    for _ in range(12):
        shapes += [(2304, 768), (2304,), (768, 768), (768,), (768,), (768,),
                   (3072, 768), (3072,), (768, 3072), (768,), (768,), (768,)]
    shapes += [(768, 768), (768,)]
    if QUICK:
        shapes = [(64, 32), (32,)]
    values = sum(torch.Size(s).numel() for s in shapes)
    for mode in ["for-loop", "foreach", "fused"]:
        params = [torch.nn.Parameter(randn(s, torch.float32)) for s in shapes]
        for p in params:
            p.grad = randn(p.shape, torch.float32)
        kwargs = {"lr": 1e-4, "weight_decay": 0.01}
        if mode == "for-loop":
            kwargs["foreach"] = False
        elif mode == "foreach":
            kwargs["foreach"] = True
        elif GPU:
            kwargs["fused"] = True
        else:
            continue
        opt = torch.optim.AdamW(params, **kwargs)
        opt.step()  # creates the moments
        sync()
        times = []
        for _ in range(10):
            if GPU:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            opt.step()
            if GPU:
                end.record()
                end.synchronize()
                times.append((start.elapsed_time(end) * 1e-3, time.perf_counter() - t0))
            else:
                times.append((time.perf_counter() - t0, time.perf_counter() - t0))
        dev = statistics.median(t for t, _ in times)
        host = statistics.median(h for _, h in times)
        rows.append({"group": "optimizer", "op": "adamw-" + mode, "tensors": len(shapes),
                     "values": values, "bytes": 28 * values, "time_s": dev, "host_s": host,
                     "gbps": 28 * values / dev / 1e9})


def gaps(rows):
    """Small products and elementwise kernels issued eagerly one after another, the host far ahead
    (a long product first fills the queue), against the same kernels in a CUDA graph: the device
    time per kernel that an eager training step pays beyond the kernel itself."""
    if not GPU:
        return
    big_a = randn((8192, 8192), torch.bfloat16)
    big_c = torch.empty_like(big_a)
    for m, n, k in [(512, 768, 768), (1024, 768, 768), (4096, 768, 768), (4096, 3072, 768)]:
        a = randn((m, k), torch.bfloat16)
        b = randn((k, n), torch.bfloat16)
        c = torch.empty((m, n), device=DEVICE, dtype=torch.bfloat16)
        x = randn((m, n), torch.bfloat16)
        for name, fn in [("matmul", lambda: torch.matmul(a, b, out=c)),
                         ("gelu", lambda: F.gelu(x))]:
            graph_s, _ = device_time_s(fn)
            eager = []
            for _ in range(REPLAYS):
                torch.matmul(big_a, big_a, out=big_c)  # about 1.5 ms: the host gets ahead
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(100):
                    fn()
                end.record()
                end.synchronize()
                eager.append(start.elapsed_time(end) * 1e-3 / 100)
            rows.append({"group": "gaps", "op": name, "m": m, "n": n, "k": k,
                         "graph_s": graph_s, "eager_s": statistics.median(eager),
                         "gap_s": statistics.median(eager) - graph_s})


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    rows = []
    info = {"device": torch.cuda.get_device_name() if GPU else "cpu", "torch": torch.__version__}
    copy_gbps = copy_bandwidth(rows)
    parts = (elementwise, gemms, optimizer, gaps)
    if "--gaps" in sys.argv:
        parts = (gaps,)
    for part in parts:
        t = time.perf_counter()
        try:
            part(rows) if part is not elementwise else part(rows, copy_gbps)
        except Exception as err:
            rows.append({"group": part.__name__, "error": str(err)[:300]})
        print(f"{part.__name__}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    with open(out, "w") as f:
        json.dump({"info": info, "copy_gbps": copy_gbps, "rows": rows}, f, indent=0)
    print(f"| kernels on {info['device']} | copy {copy_gbps:.0f} GB/s | - | - |")
    for r in rows:
        if r["group"] == "elementwise" and "gbps" in r and r.get("width") in (None, 1024):
            print(f"| {r['op']} {r['dtype']} {r['elements']} | {r['time_s'] * 1e6:.1f} us, "
                  f"{r['of_copy']:.2f} of copy | - | - |")
        if r["group"] == "optimizer":
            print(f"| {r['op']} | device {r['time_s'] * 1e3:.2f} ms, host {r['host_s'] * 1e3:.2f} ms, "
                  f"{r['gbps']:.0f} GB/s | - | - |")
        if r["group"] == "gaps":
            print(f"| {r['op']} {r['m']}x{r['n']}x{r['k']} | graph {r['graph_s'] * 1e6:.2f} us, "
                  f"eager {r['eager_s'] * 1e6:.2f} us | - | - |")
        if "error" in r:
            print(f"| {r['group']} {r.get('op', '')} | error {r['error'][:80]} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
