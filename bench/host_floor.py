#!/usr/bin/env python3
"""The host floor's parameters against measured single-GPU runs.

Usage: bench/host_floor.py [--grid] [--fit-on PREFIX] [LAUNCH_US PASS_US SERIAL]
       (BUILD=build-foo to use another build's loom; RUNS=DIR for other runs)

Each run in RUNS (default bench/gpu-runs/h200: `loom validate --json` documents, written by
bench/gpu.sh's validate stage on an H200) is planned again with its model, job and strategy on a
copy of the h200-x1 cluster whose device carries host_launch_us, host_pass_us and
host_serial_fraction (costmodel/compute.hpp), and its predicted step time compared with the
measured one. With three numbers: one line per run and the median |error|, overall and per file
prefix ("a-", "b-": the two machines). With --grid: the grid point whose median |error| is
smallest over the runs whose file names start with --fit-on (default: all), then its figures.
"""
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.path.join(ROOT, os.environ.get("BUILD", "build"), "tools", "loom")
RUNS = os.environ.get("RUNS", os.path.join(ROOT, "bench", "gpu-runs", "h200"))


def runs():
    out = []
    for name in sorted(os.listdir(RUNS)):
        if name.endswith(".json"):
            with open(os.path.join(RUNS, name)) as f:
                doc = json.load(f)
            out.append((name, doc["plan"], doc["measured"]["step_time_s"]))
    return out


def errors(all_runs, launch_us, pass_us, serial, folder):
    with open(os.path.join(ROOT, "profiles", "clusters", "h200-x1.json")) as f:
        cluster = json.load(f)
    cluster["name"] = "h200-host-floor"
    cluster["device"].update(host_launch_us=launch_us, host_pass_us=pass_us,
                             host_serial_fraction=serial)
    cluster_path = os.path.join(folder, "cluster.json")
    with open(cluster_path, "w") as f:
        json.dump(cluster, f)
    out = []
    for name, plan, measured_s in all_runs:
        job, s = plan["job"], plan["strategy"]
        plan_path = os.path.join(folder, "plan.json")
        subprocess.run([LOOM, "plan", "--model", plan["model"]["name"], "--cluster", cluster_path,
                        "--global-batch", str(job["global_batch"]), "--seq-len",
                        str(job["seq_len"]), "--precision", job["precision"], "--dp", "1",
                        "--tp", "1", "--pp", "1", "--micro-batch", str(s["micro_batch"]),
                        "--recompute", s["recompute"], "--attention", s["attention"],
                        "-o", plan_path], check=True, capture_output=True)
        with open(plan_path) as f:
            predicted_s = json.load(f)["predicted"]["step_time_s"]
        out.append((name, (predicted_s - measured_s) / measured_s))
    return out


def median_abs(errs, prefix=""):
    picked = [abs(e) for n, e in errs if n.startswith(prefix)]
    return 100 * statistics.median(picked) if picked else float("nan")


def report(errs):
    for name, e in errs:
        print(f"{name:40s} {100 * e:+7.1f} %")
    prefixes = sorted({n.split("-")[0] + "-" for n, _ in errs})
    per = ", ".join(f"{p} {median_abs(errs, p):.1f} %" for p in prefixes)
    print(f"median |error| {median_abs(errs):.1f} % ({len(errs)} runs; {per})")


def main(argv):
    grid = "--grid" in argv
    fit_on = ""
    if "--fit-on" in argv:
        fit_on = argv[argv.index("--fit-on") + 1]
        argv = [a for a in argv if a not in ("--fit-on", fit_on)]
    numbers = [float(a) for a in argv if a != "--grid"]
    all_runs = runs()
    with tempfile.TemporaryDirectory() as folder:
        if grid:
            best = None
            for point in itertools.product([20, 25, 30, 35, 40], [1000, 2000, 3000, 4000],
                                           [0, 0.25, 0.5, 0.75, 1]):
                m = median_abs(errors(all_runs, *point, folder), fit_on)
                if best is None or m < best[0]:
                    best = (m, point)
            print(f"best on '{fit_on or 'all'}': host_launch_us {best[1][0]}, host_pass_us "
                  f"{best[1][1]}, host_serial_fraction {best[1][2]}")
            numbers = list(best[1])
        if len(numbers) != 3:
            print(__doc__, file=sys.stderr)
            return 2
        report(errors(all_runs, *numbers, folder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
