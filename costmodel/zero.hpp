// ZeRO (Rajbhandari et al. 2020) as Loom runs it: what each stage shards over the data-parallel
// group and when it communicates. The one home of those rules: the memory model, the estimate,
// the simulator and the executor ask a ZeroPolicy instead of comparing stage numbers.
//
//   stage                      0    1    2    3
//   shards_optimizer_states    -    x    x    x   AdamW moments and fp32 master weights: 1/dp
//   shards_gradients           -    -    x    x   no full gradient buffer, each rank its 1/dp
//   shards_parameters          -    -    -    x   between steps a rank holds its 1/dp only
//   reduces_every_micro_batch  -    -    x    x   gradients reduced after every backward pass
//   gathers_after_step         -    x    x    -   updated shards all-gathered after AdamW
//   gathers_before_forward     -    -    -    x   parameters gathered before the first forward
//   reduces_norm_over_dp       -    x    x    x   the gradient norm sums the ranks' shards
//
// What the executor does at each stage with dp > 1 (with dp = 1 every shard is the whole):
// - 0 and 1: every micro-batch's gradients accumulate in one flat buffer of the rank's
//   parameters, all-reduced once per step (in buckets from the step's last backward pass when
//   that overlaps); stage 1 then updates only its shard of that buffer.
// - 2 and 3: after every backward pass of a chunk its gradients are reduced bucket by bucket
//   through one staging buffer and the rank's part added into its gradient shard.
// - 1 and 2: after the optimizer step on its shard, each rank's updated shard is all-gathered into
//   the full parameters.
// - 3: the stage's parameters are all-gathered from the shards before the step's first forward
//   pass, held for the whole step, and released after the optimizer step.
#pragma once

namespace loom::costmodel {

struct ZeroPolicy {
  bool shards_optimizer_states = false;
  bool shards_gradients = false;
  bool shards_parameters = false;
  bool reduces_every_micro_batch = false;
  bool gathers_after_step = false;
  bool gathers_before_forward = false;
  bool reduces_norm_over_dp = false;
  bool operator==(const ZeroPolicy&) const = default;
};

// The policy of ZeRO stage `stage` (0..3; check_strategy() refuses others). std::invalid_argument
// for a stage outside 0..3.
ZeroPolicy zero_policy(int stage);

}  // namespace loom::costmodel
