#include "costmodel/runtime_zero.hpp"

namespace loom::costmodel {

std::optional<DeepSpeedZero> deepspeed_zero(int stage) {
  if (stage < 0 || stage > 3) return std::nullopt;
  DeepSpeedZero z;
  z.stage = stage;
  z.partitions_optimizer_states = stage >= 1;
  z.partitions_gradients = stage >= 2;
  z.partitions_parameters = stage == 3;
  z.reduces_every_micro_batch = stage == 2;
  z.gathers_updated_weights = stage == 1 || stage == 2;
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

}  // namespace loom::costmodel
