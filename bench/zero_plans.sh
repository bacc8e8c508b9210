# The mini-bert ZeRO plans that bench/zero_memory.sh and bench/zero_step.sh measure; sourced by
# both. mini-bert (bench/models/mini-bert.json), fp32, global batch 8, micro-batch 2, seq 64, on
# local-cpu (dp <= 2) or a copy of it with four devices (dp 4: four ranks share the two cores).
#
# zero_plan LOOM ROOT DP ZERO   writes plan-dpDP-zeroZERO.json in the current folder (and
#                               local-cpu-4.json once, for dp > 2)
zero_plan() {
  local loom=$1 root=$2 dp=$3 zero=$4 cluster=local-cpu
  if [ "$dp" -gt 2 ]; then
    cluster=local-cpu-4.json
    [ -f "$cluster" ] || sed 's/"devices_per_node": 2/"devices_per_node": 4/;
      s/"name": "local-cpu"/"name": "local-cpu-4"/' \
      "$root/profiles/clusters/local-cpu.json" >"$cluster"
  fi
  "$loom" plan --model "$root/bench/models/mini-bert.json" --cluster "$cluster" \
    --global-batch 8 --seq-len 64 --precision fp32 --dp "$dp" --tp 1 --pp 1 --zero "$zero" \
    --micro-batch 2 -o "plan-dp$dp-zero$zero.json" >/dev/null
}
