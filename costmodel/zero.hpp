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
//   gathers_before_forward     -    -    -    x   parameters all-gathered before forwards
//   reduces_norm_over_dp       -    x    x    x   the gradient norm sums the ranks' shards
//
//   gathers_per_block          -    -    -    x   each block gathered before its forward and
//                                                   again before its backward, freed after each
//   reduce_scatters_gradients  -    -    x    x   gradients reduce-scattered (not all-reduced;
//                                                   on Gloo by an all-reduce, see below)
//
// What the executor does at each stage with dp > 1 (with dp = 1 every shard is the whole):
// - 0 and 1: every micro-batch's gradients accumulate in one flat buffer of the rank's
//   parameters, all-reduced once per step (in buckets from the step's last backward pass when
//   that overlaps); stage 1 then updates only its shard of that buffer.
// - 2 and 3: the parameters are sharded block by block (a block: the embeddings, one transformer
//   layer, the head); after every backward pass each block's gradients are reduce-scattered
//   (NCCL: (dp - 1) / dp of the block per rank; Gloo: an all-reduce of the block, faster on CPU
//   ranks) through one staging buffer of at most a bucket, and the rank's chunk added into its
//   gradient shard.
// - 1 and 2: after the optimizer step on its shard, each rank's updated shard is all-gathered into
//   the full parameters.
// - 3: every forward and every backward pass of every micro-batch all-gathers each block just
//   before it computes, with the next block's gather in flight meanwhile, and frees it after: a
//   rank holds its shard plus kZero3GatheredUnits gathered blocks.
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
  bool gathers_per_block = false;
  bool reduce_scatters_gradients = false;
  bool operator==(const ZeroPolicy&) const = default;
};

// ZeRO-3's gathered blocks held at once: the one computing and the next, whose gather is in
// flight (fp32, the executor's master weights).
inline constexpr int kZero3GatheredUnits = 2;

// ZeRO-3's all-gathers in one micro-batch's forward and backward passes over `num_blocks` blocks:
// each block once before its forward and once before its backward.
inline int zero3_gathers_per_micro_batch(int num_blocks) { return 2 * num_blocks; }

// The policy of ZeRO stage `stage` (0..3; check_strategy() refuses others). std::invalid_argument
// for a stage outside 0..3.
ZeroPolicy zero_policy(int stage);

}  // namespace loom::costmodel
