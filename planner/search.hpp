// The planner's search: every dp x tp x pp (x cp) factorisation of the devices, ZeRO stage,
// micro-batch size, schedule (with virtual stages), sequence parallelism (both ways whenever tp > 1
// on GPUs; off on CPUs unless pinned) and recomputation, each dimension optionally pinned; every
// candidate is estimated analytically, the ones that fit are ranked by step time. The attention
// kernels are not searched: unpinned, GPU plans run `flash` (what Loom's executor runs on CUDA:
// scaled_dot_product_attention) and CPU plans `math` (the CPU build's LibTorch has no fused
// attention). Deterministic: the same input gives the same plans in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

// The fewest tokens per rank the search splits a sequence into with context parallelism: below
// it the attention blocks are too short to hide the key/value sends behind (context_parallel.hpp),
// and Megatron-Core's guidance reserves cp for long sequences.
inline constexpr std::int64_t kMinContextParallelTokens = 1024;

// Dimensions the user pinned; nullopt ones are searched.
//
// Pruning: for a fixed (tp, pp, dp, zero, schedule, sequence parallelism), memory only grows with
// the micro-batch size, so once the leanest recomputation does not fit at micro-batch b, larger
// ones are not estimated; and recomputing more only adds time, so once a recomputation choice fits
// the heavier ones are not estimated. Both are counted in `searched` but not in `evaluated`.
//
// Unpinned recomputation: where neither none nor selective fits and full does, full
// recomputation covers only the fewest layers per chunk that fit (Strategy::recompute_layers),
// found with one to two more estimates (counted in `evaluated`).
struct SearchOptions {
  std::optional<int> tp;
  std::optional<int> pp;
  std::optional<int> dp;
  // Context parallelism (Strategy::cp). Unpinned, runtimes that run it (RuntimeRules::
  // context_parallel) try every cp that divides the devices left beside tp, keeps at least
  // kMinContextParallelTokens tokens per rank and cuts the sequence into 2 cp equal chunks;
  // the others plan cp 1.
  std::optional<int> cp;
  std::optional<int> zero;
  std::optional<std::int64_t> micro_batch;
  std::optional<costmodel::Schedule> schedule;
  std::optional<int> virtual_stages;
  std::optional<costmodel::Recompute> recompute;
  // > 0: full recomputation of only each chunk's first recompute_layers layers (Strategy::
  // recompute_layers); needs recompute pinned to full.
  int recompute_layers = 0;
  std::optional<bool> sequence_parallel;  // pinned on: only tp > 1 is searched
  std::optional<costmodel::Attention> attention;
  // A pinned layer-to-stage partition (pp ranges; pins pp to its size). Without it the search
  // tries Megatron's even split and, for the most promising strategies, the balanced one
  // (partition.hpp), and keeps the faster that fits.
  std::optional<std::vector<costmodel::StageRange>> stages;
  double memory_margin = 0.9;  // fraction of device memory a plan may use
  // Refine the top `top` plans with the event-driven simulator (costmodel/simulator.hpp): their
  // `predicted` becomes the simulation's (source "simulation") and they are re-ranked by it.
  bool simulate = true;
  bool prune = true;  // false: estimate every point (to check that pruning loses nothing)
  // On a one-node CPU cluster, also try fewer ranks than cores (each rank then runs more threads:
  // costmodel::threads_per_rank); false: every plan uses every device, as on GPUs.
  bool fewer_cpu_ranks = true;
  int top = 5;
};

// The attention kernel a plan on `cluster` runs unless pinned: flash for bf16/fp16 jobs on GPUs
// of the generations FlashAttention supports (those with a bf16 rate: Ampere and later), where
// PyTorch's scaled_dot_product_attention runs the fused kernel; math otherwise (CPUs, V100s,
// fp32 and tf32 jobs, where it would fall back to slower kernels).
costmodel::Attention default_attention(const profiles::Cluster& cluster,
                                       profiles::Precision precision);

struct SearchResult {
  std::vector<Plan> plans;     // the best `top` feasible plans, fastest first
  std::int64_t searched = 0;   // strategies in the space (each recomputation choice counts)
  std::int64_t evaluated = 0;  // of which estimated; the rest were pruned by dominance
  std::int64_t feasible = 0;   // strategies that fit in memory: evaluated, or skipped as
                               // recomputing more than a fitting one (they keep less)
  // When nothing fits: which limit was hit and by how much (empty otherwise).
  std::string infeasible_reason;
};

SearchResult search(const costmodel::CostModel& cost, const costmodel::Job& job,
                    const SearchOptions& options);

// One short label for what limits a plan most: "memory", "bubble", "tp comm", "pp comm",
// "dp comm", "zero comm", "optimizer", "host hooks" (the runtime's per-tensor host work,
// costmodel::runtime_host_s_per_step) or "compute".
std::string binding_constraint(const Plan& plan, double memory_margin);

}  // namespace loom::planner
