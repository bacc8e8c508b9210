// The ZeRO policy table: what each stage shards and when it communicates (zero.hpp).
#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>

#include "costmodel/runtime_zero.hpp"
#include "costmodel/zero.hpp"

using namespace loom::costmodel;

namespace {

// Fields in the table's order: optimizer states, gradients, parameters sharded; reduces every
// micro-batch; gathers after the step; gathers before the forward; norm summed over dp; gathers
// block by block; reduce-scatters the gradients.
ZeroPolicy row(bool o, bool g, bool p, bool every, bool after, bool before, bool norm,
               bool per_block, bool reduce_scatter) {
  return ZeroPolicy{o, g, p, every, after, before, norm, per_block, reduce_scatter};
}

}  // namespace

TEST_CASE("the ZeRO policy of each stage", "[zero]") {
  CHECK(zero_policy(0) == row(false, false, false, false, false, false, false, false, false));
  CHECK(zero_policy(1) == row(true, false, false, false, true, false, true, false, false));
  CHECK(zero_policy(2) == row(true, true, false, true, true, false, true, false, true));
  CHECK(zero_policy(3) == row(true, true, true, true, false, true, true, true, true));
  CHECK_THROWS_AS(zero_policy(-1), std::invalid_argument);
  CHECK_THROWS_AS(zero_policy(4), std::invalid_argument);
}

TEST_CASE("ZeRO-3 gathers every block twice per micro-batch, two held at once", "[zero]") {
  CHECK(zero3_gathers_per_micro_batch(1) == 2);
  CHECK(zero3_gathers_per_micro_batch(26) == 52);  // BERT-large: embeddings, 24 layers, head
  CHECK(kZero3GatheredUnits == 2);
}

// What each engine calls a plan's stage (runtime_zero.hpp), which its runtime rules and its
// emitted configuration both read.
TEST_CASE("each engine's name for a ZeRO stage", "[zero][runtime]") {
  CHECK(fsdp_sharding(0) == FsdpSharding::kNoShard);
  CHECK_FALSE(fsdp_sharding(1));  // FSDP has no optimizer-only sharding
  CHECK(fsdp_sharding(2) == FsdpSharding::kShardGradOp);
  CHECK(fsdp_sharding(3) == FsdpSharding::kFullShard);
  CHECK(std::string(to_string(FsdpSharding::kShardGradOp)) == "SHARD_GRAD_OP");
  CHECK(std::string(to_string(FsdpSharding::kFullShard)) == "FULL_SHARD");
  CHECK(std::string(to_string(FsdpSharding::kNoShard)) == "NO_SHARD");
  CHECK_FALSE(shards_states(FsdpSharding::kNoShard));

  CHECK(megatron_optimizer(0) == MegatronOptimizer::kReplicated);
  CHECK(megatron_optimizer(1) == MegatronOptimizer::kDistributed);
  CHECK(megatron_optimizer(2) == MegatronOptimizer::kDistributedFusedAdam);
  CHECK_FALSE(megatron_optimizer(3));  // neither Megatron-LM nor NeMo shards the weights
  CHECK_FALSE(shards_optimizer_states(MegatronOptimizer::kReplicated));
  CHECK(shards_optimizer_states(MegatronOptimizer::kDistributed));

  // DeepSpeed: the ZeRO paper's stages; the pipeline engine takes 0 and 1; overlap_comm on at
  // stage 3 only (its default).
  for (int stage = 0; stage <= 3; ++stage) {
    const DeepSpeedZero z = *deepspeed_zero(stage);
    CHECK(z.stage == stage);
    CHECK(z.policy == zero_policy(stage));
    CHECK(z.runs_with_pipeline == (stage <= 1));
    CHECK(z.overlap_comm == (stage == 3));
  }

  // A strategy's stage that its engine has not (refused by the runtime) still maps to one.
  Strategy s;
  s.zero = 1;
  CHECK(fsdp_sharding_of(s) == FsdpSharding::kNoShard);
  s.zero = 3;
  CHECK(megatron_optimizer_of(s) == MegatronOptimizer::kDistributedFusedAdam);
  CHECK(deepspeed_zero_of(s).policy.shards_parameters);
  CHECK_FALSE(deepspeed_zero(4));
  CHECK_FALSE(fsdp_sharding(-1));
}
