#!/usr/bin/env python3
"""The allocator peaks and step times of the stored GPU runs against this build's prediction.

Usage: bench/gpu_memory.py [-v] [--datasheet] [RUN.json ...]
       (BUILD=build-foo to use another build's loom)

Each `loom validate --json` document (default: every one under bench/gpu-runs/ predicted by the
roofline, i.e. without a profile, except h200/, whose executor predates the one-cast-per-layer
input) is predicted again by `loom simulate` from the plan it ran, on the shipped cluster file of
the plan's cluster name where there is one, with the shipped runtime calibration of the plan's
runtime on its device (profiles/calibrations/: its fitted process memory).
The tensors the plan predicts (the prediction less the CUDA context and the allocator's
fragmentation) are compared with the caching allocator's measured peak, the whole prediction
with the device's used memory, and the predicted step time with the measured one. Runs of the
same plan on several machines count once. Prints the median |error| per recomputation mode and
overall; -v one line per run; --datasheet predicts on the cluster file's hardware values alone
(no runtime calibration: the model before calibration).
Needs no GPU.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tools", "loom")


def default_runs():
    files = sorted(glob.glob(os.path.join(ROOT, "bench", "gpu-runs", "*", "*.json")))
    return [f for f in files if os.sep + "h200" + os.sep not in f]


def with_parameters(cluster, parameters):
    """The cluster with each named parameter ("device.memory_efficiency", ...) set."""
    cluster = json.loads(json.dumps(cluster))
    for name, value in parameters.items():
        *path, last = name.split(".")
        node = cluster
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return cluster


def runtime_calibration(runtime, device):
    """The parameters of the shipped calibration of `runtime` on `device` ({} without one)."""
    for path in sorted(glob.glob(os.path.join(ROOT, "profiles", "calibrations", "*.json"))):
        c = json.load(open(path))
        if c["runtime"] == runtime and c["device"] == device:
            return c["parameters"]
    return {}


def shipped(plan, hardware_alone=False):
    """The plan with its cluster replaced by the shipped file of the same name, if any, with the
    shipped calibration of the plan's runtime on its device, as `loom plan` applies it."""
    path = os.path.join(ROOT, "profiles", "clusters", plan["cluster"].get("name", "") + ".json")
    if os.path.exists(path):
        cluster = json.load(open(path))
        if not hardware_alone:
            runtime = plan.get("job", {}).get("runtime", "loom")
            cluster = with_parameters(
                cluster, runtime_calibration(runtime, cluster["device"]["name"]))
        keep = {k: plan["cluster"][k] for k in ("nodes", "devices_per_node") if k in plan["cluster"]}
        plan = dict(plan, cluster=dict(cluster, **keep))
    return plan


def predicted(plan):
    """(tensors, device) predicted for the plan's first stage, and the step time."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
        path = f.name
    try:
        r = subprocess.run([LOOM, "simulate", path, "--json"], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    prediction = json.loads(r.stdout)
    stage = prediction["memory_bytes_by_stage"][0]
    tensors = stage["total"] - stage["cuda_context"] - stage["fragmentation"]
    return tensors, stage["total"], prediction["step_time_s"]


def mode(strategy):
    if strategy["recompute"] == "full" and strategy.get("recompute_layers"):
        return "full, some layers"
    return strategy["recompute"]


def main(argv):
    verbose = "-v" in argv
    before_calibration = "--datasheet" in argv
    files = [a for a in argv if a not in ("-v", "--datasheet")] or default_runs()
    errors = {}
    device_errors = []
    step_errors = []
    seen = set()
    for path in files:
        try:
            doc = json.load(open(path))
        except ValueError:
            continue
        if doc.get("calibration") != "roofline" or "plan" not in doc:
            continue
        plan = doc["plan"]
        key = json.dumps([plan["model"], plan["job"], plan["strategy"]], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        measured = doc["measured"]["peak_memory_bytes"]
        tensors, device, step_s = predicted(shipped(plan, before_calibration))
        error = tensors / measured - 1
        step_error = step_s / doc["measured"]["step_time_s"] - 1
        step_errors.append(step_error)
        errors.setdefault(mode(plan["strategy"]), []).append(error)
        used = doc["measured"].get("device_used_bytes", 0)
        device_error = device / used - 1 if used else None
        if device_error is not None:
            device_errors.append(device_error)
        if verbose:
            name = os.path.relpath(path, os.path.join(ROOT, "bench", "gpu-runs"))
            shown = "-" if device_error is None else f"{100 * device_error:+6.1f} %"
            print(f"{name:60s} {mode(plan['strategy']):18s} {measured / 2**20:8.0f} MiB "
                  f"{100 * error:+6.1f} %  device {shown}  step {100 * step_error:+6.1f} %")
    every = [e for v in errors.values() for e in v]
    if not every:
        print("no roofline runs among the files", file=sys.stderr)
        return 2
    for name, v in sorted(errors.items()):
        print(f"{name:18s} {len(v):3d} plans: median |error| "
              f"{100 * statistics.median(abs(e) for e in v):4.1f} %, signed median "
              f"{100 * statistics.median(v):+5.1f} %")
    print(f"{'all':18s} {len(every):3d} plans: median |error| "
          f"{100 * statistics.median(abs(e) for e in every):4.1f} %")
    if device_errors:
        print(f"{'device memory':18s} {len(device_errors):3d} plans: median |error| "
              f"{100 * statistics.median(abs(e) for e in device_errors):4.1f} %, signed median "
              f"{100 * statistics.median(device_errors):+5.1f} %")
    print(f"{'step time':18s} {len(step_errors):3d} plans: median |error| "
          f"{100 * statistics.median(abs(e) for e in step_errors):4.1f} %, signed median "
          f"{100 * statistics.median(step_errors):+5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
