#!/usr/bin/env bash
# Runs every libFuzzer target of a `make fuzz` build for SECONDS each (default 600), one after
# another, growing a working corpus per target from the seeds in fuzz/corpus. Crashing inputs are
# written to BUILD/findings/; keep them in fuzz/regressions/<target>/ once fixed (CTest replays
# them). Prints executions and findings per target. FUZZ_TARGETS="fuzz_x fuzz_y" limits the run to
# those targets. With FUZZ_RUNS=N set, each target instead
# runs exactly N inputs from seed 1 over the shipped seeds only (deterministic: the CI smoke run).
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-600}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$build/findings"
status=0
printf '%-20s %10s %12s %s\n' target seconds executions findings
for bin in "$build"/fuzz/fuzz_*; do
  name=$(basename "$bin")
  # FUZZ_TARGETS="fuzz_a fuzz_b" runs only those.
  if [ -n "${FUZZ_TARGETS:-}" ] && [[ " $FUZZ_TARGETS " != *" $name "* ]]; then continue; fi
  corpus="$build/corpus/$name"
  mkdir -p "$corpus"
  limit=(-max_total_time="$seconds")
  if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS" -seed=1)
    rm -rf "$corpus" && mkdir -p "$corpus"
  fi
  log="$build/findings/$name.log"
  rm -f "$build/findings/$name"-*
  set +e
  "$bin" "${limit[@]}" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$build/findings/$name-" "$corpus" "$root/fuzz/corpus/$name" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  found=$(ls "$build/findings" | grep -c "^$name-" || true)
  printf '%-20s %10s %12s %s\n' "$name" "$seconds" "$execs" "$found"
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "  $name failed (exit $rc); see $log" >&2
  fi
done
exit $status
