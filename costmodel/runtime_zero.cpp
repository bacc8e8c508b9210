#include "costmodel/runtime_zero.hpp"

namespace loom::costmodel {

std::optional<DeepSpeedZero> deepspeed_zero(int stage) {
  if (stage < 0 || stage > 3) return std::nullopt;
  DeepSpeedZero z;
  z.stage = stage;
  z.policy = zero_policy(stage);
  z.overlap_comm = stage == 3;
  z.runs_with_pipeline = stage <= 1;
  return z;
}

std::optional<FsdpSharding> fsdp_sharding(int zero) {
  switch (zero) {
    case 0:
      return FsdpSharding::kNoShard;
    case 2:
      return FsdpSharding::kShardGradOp;
    case 3:
      return FsdpSharding::kFullShard;
    default:
      return std::nullopt;
  }
}

const char* to_string(FsdpSharding sharding) {
  switch (sharding) {
    case FsdpSharding::kShardGradOp:
      return "SHARD_GRAD_OP";
    case FsdpSharding::kFullShard:
      return "FULL_SHARD";
    case FsdpSharding::kNoShard:
      break;
  }
  return "NO_SHARD";
}

std::optional<MegatronOptimizer> megatron_optimizer(int zero) {
  switch (zero) {
    case 0:
      return MegatronOptimizer::kReplicated;
    case 1:
      return MegatronOptimizer::kDistributed;
    case 2:
      return MegatronOptimizer::kDistributedFusedAdam;
    default:
      return std::nullopt;
  }
}

DeepSpeedZero deepspeed_zero_of(const Strategy& strategy) {
  return deepspeed_zero(strategy.zero).value_or(DeepSpeedZero{});
}

FsdpSharding fsdp_sharding_of(const Strategy& strategy) {
  return fsdp_sharding(strategy.zero).value_or(FsdpSharding::kNoShard);
}

MegatronOptimizer megatron_optimizer_of(const Strategy& strategy) {
  return megatron_optimizer(strategy.zero).value_or(MegatronOptimizer::kDistributedFusedAdam);
}

}  // namespace loom::costmodel
