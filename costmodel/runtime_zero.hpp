// What a plan's ZeRO stage (Strategy::zero, 0..3) means in each engine that runs it, in the
// engine's own terms. The runtimes' memory and time rules (runtime_<name>.cpp), the engine
// configurations (planner/emit_<name>.cpp) and the published rows ask these instead of comparing
// stage numbers; Loom's own executor asks zero_policy() (zero.hpp).
//
//   zero   DeepSpeed (deepspeed_zero)        PyTorch FSDP (fsdp_sharding)   Megatron-LM / NeMo
//                                                                           (megatron_optimizer)
//   0      DDP-style all-reduce              NO_SHARD                       replicated optimizer
//   1      optimizer states partitioned      (none)                         --use-distributed-
//                                                                           optimizer
//   2      + gradients                       SHARD_GRAD_OP                  Apex DistributedFused
//                                                                           Adam (NeMo only)
//   3      + parameters                      FULL_SHARD                     (none)
//
// A stage an engine has not is refused by its runtime's RuntimeRules::refusal; the functions
// below say so with std::nullopt.
#pragma once

#include <optional>

#include "costmodel/strategy.hpp"
#include "costmodel/zero.hpp"

namespace loom::costmodel {

// DeepSpeed's zero_optimization.stage with the settings `loom plan --emit deepspeed` writes
// (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py).
struct DeepSpeedZero {
  int stage = 0;
  // What the stage partitions over dp and when it communicates: DeepSpeed's stages are the ZeRO
  // paper's (zero.hpp's shards_*, reduces_every_micro_batch, gathers_after_step).
  ZeroPolicy policy;
  // Reductions on a side stream under the backward pass, with a second bucket buffer: DeepSpeed's
  // default, on at stage 3 only. The published DeepSpeed runs Loom is fitted on (the autotuner's
  // templates, deepspeed/autotuning/config_templates/template_zero2.json) keep it off at stage 2,
  // and the plan times that: the emitted configuration writes what the plan times.
  bool overlap_comm = false;
  bool runs_with_pipeline = true;  // its pipeline engine takes stages 0 and 1 only
};

// std::nullopt outside 0..3.
std::optional<DeepSpeedZero> deepspeed_zero(int stage);

// PyTorch FSDP's ShardingStrategy (torch/distributed/fsdp/api.py).
enum class FsdpSharding { kNoShard, kShardGradOp, kFullShard };

// zero 0 = NO_SHARD, 2 = SHARD_GRAD_OP, 3 = FULL_SHARD; std::nullopt for zero 1 (FSDP has no
// optimizer-only sharding) and outside 0..3.
std::optional<FsdpSharding> fsdp_sharding(int zero);
const char* to_string(FsdpSharding sharding);  // "NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"
inline bool shards_states(FsdpSharding s) { return s != FsdpSharding::kNoShard; }

// The optimizer Megatron-LM (megatron/core/optimizer) or NeMo runs over data parallelism.
enum class MegatronOptimizer {
  kReplicated,   // every data-parallel rank holds the whole optimizer (Float16OptimizerWith...)
  kDistributed,  // --use-distributed-optimizer: fp32 main weights and moments sharded over dp
  kDistributedFusedAdam,  // Apex's, as NeMo configures it: gradients sharded too (NeMo only)
};

// zero 0, 1, 2 as above; std::nullopt for zero 3 (neither shards the weights between steps) and
// outside 0..3.
std::optional<MegatronOptimizer> megatron_optimizer(int zero);
inline bool shards_optimizer_states(MegatronOptimizer o) {
  return o != MegatronOptimizer::kReplicated;
}

// The same for a strategy its runtime accepted (RuntimeRules::refusal says no to the stages an
// engine has not): what the runtime's rules and its emitter read. A stage refused there is given
// the nearest the engine has, so that a refused strategy's figures are still defined: FSDP's zero
// 1 is NO_SHARD, Megatron's zero 3 Apex's DistributedFusedAdam.
DeepSpeedZero deepspeed_zero_of(const Strategy& strategy);
FsdpSharding fsdp_sharding_of(const Strategy& strategy);
MegatronOptimizer megatron_optimizer_of(const Strategy& strategy);

}  // namespace loom::costmodel
