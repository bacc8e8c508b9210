// The data-parallel engine of the many-rank training step: one rank's parameters and gradients in
// flat fp32 buffers, their ZeRO shards over the dp group, the gradient reduction, the global
// gradient norm and AdamW on the part this rank updates.
//
// Layout: the parameters of the rank's model chunks, in order, are concatenated into one buffer
// of numel elements padded to a multiple of dp (padded_numel); dp rank r owns the shard
// [r * S, (r + 1) * S), S = padded_numel / dp. Every parameter tensor is a view of its slice of
// the buffer (set_data), so the model reads and writes the buffer directly.
//
// What a rank holds between steps, and how a step reduces (dp > 1; G = the gradient), as
// costmodel::ZeroPolicy (costmodel/zero.hpp) names each stage's behaviours:
//   ZeRO-0: full parameters, a full gradient buffer (micro-batches accumulate into it), AdamW
//     moments of the full buffer. After the last backward pass G is all-reduced (summed) and
//     divided by dp; AdamW updates the whole buffer. No all-gather.
//   ZeRO-1: as ZeRO-0, but the moments cover the shard only: AdamW updates this rank's shard of
//     the full buffer, then the dp group all-gathers the updated shards into the full buffer.
//   ZeRO-2: full parameters, no full gradient buffer: a gradient shard of S elements and one
//     staging buffer of at most a bucket. After every backward pass of a chunk (not only the last
//     micro-batch's), its gradients are all-reduced bucket by bucket through the staging buffer
//     (an all-reduce, not a reduce-scatter: Gloo has none), this rank's part added to its
//     gradient shard and the parameters' gradients freed, as DeepSpeed's ZeRO-2 does. The shard
//     is divided by dp; AdamW updates the shard; the shards are all-gathered as in ZeRO-1.
//   ZeRO-3: gradients as ZeRO-2, but between steps the rank keeps only its parameter shard (the
//     full buffer is freed, parameters are empty): materialize() all-gathers the full parameters
//     before the step's forward passes (and before an evaluation), release() frees them after
//     the step. AdamW updates the kept shard; no all-gather after the step.
//   With dp = 1, ZeRO-2/3 keep a full gradient buffer and reduce_gradients "reduce-scatters"
//   it over the group of one (a copy).
//
// Order of the dp collectives in a step, the same on every rank:
//   1. ZeRO-3: all-gather of the parameters (materialize).
//   2. During the backward passes: ZeRO-0/1 with `overlap`: the last backward pass's gradient
//      hooks (after arm()) start bucket all-reduces asynchronously, in bucket index order only;
//      ZeRO-2/3: after each chunk's backward pass, that chunk's buckets are all-reduced in
//      index order (a hook may start them earlier, never out of order).
//   3. reduce_gradients: ZeRO-0/1 start the buckets not yet started and wait for all (without
//      overlap: one all-reduce of the whole buffer).
//   4. global_norm: the squared norm all-reduced over dp (ZeRO >= 1: each rank holds a shard),
//      then over tp and pp.
//   5. step: ZeRO-1/2 all-gather the updated shards.
// Buckets hold consecutive parameters counted from the last (the order in which a backward pass
// finishes them), about bucket_bytes each; ZeRO-2/3 buckets never span two chunks.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/zero.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_adamw.hpp"
#include "executor/torch_compat.hpp"

namespace loom::executor {

// One parameter handed to the engine: a leaf tensor that requires grad, on the engine's device.
struct FlatParameter {
  torch::Tensor tensor;
  bool decays = true;   // AdamW's weight decay applies (weight_decay_applies)
  bool counted = true;  // counts in the global norm (false: a tp-replicated copy on tp rank > 0)
};

struct FlatOptions {
  int zero = 0;  // ZeRO stage 0..3 over the dp group
  double weight_decay = 0.0;
  std::int64_t bucket_bytes = 25 << 20;
  // ZeRO-0/1: start bucket all-reduces from the gradient hooks of the pass after arm().
  bool overlap = false;
};

class FlatParameters {
 public:
  // Over `chunks` (this rank's model chunks, each a list of parameters in order). Copies the
  // parameters' values into the flat buffer and rebinds them to it (ZeRO-3: keeps the shard and
  // releases the rest). Collective-free.
  FlatParameters(const std::vector<std::vector<FlatParameter>>& chunks, const FlatOptions& options,
                 ParallelGroups& groups, const torch::Device& device);
  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  // The next backward pass is the step's last: its gradient hooks start the bucket all-reduces
  // (ZeRO-0/1 with overlap and dp > 1; a no-op otherwise).
  void arm();
  // ZeRO-3: gathers the full parameters from the dp shards (a no-op otherwise or when held).
  void materialize();
  // ZeRO-3: frees the full parameters and gradients, keeping the shard (a no-op otherwise).
  void release();
  void zero_grad();
  // After every backward pass of chunk k (ZeRO-2/3 with dp > 1; a no-op otherwise): reduces the
  // chunk's buckets that its hooks have not reduced yet (parameters without a gradient count as
  // zeros) and readies them for the next pass.
  void finish_backward(int k);
  // Sums the gradients over the dp group and divides by dp. Returns the gradient this rank
  // updates with: the whole buffer (ZeRO-0) or this rank's shard of it (ZeRO >= 1).
  torch::Tensor reduce_gradients();
  // The L2 norm of the whole model's gradient (every stage, tp shard and dp shard once), as a
  // one-element tensor on the gradient's device; `grad` is what reduce_gradients returned.
  torch::Tensor global_norm(const torch::Tensor& grad);
  // AdamW (flat_adamw_update) on this rank's part with `grad`, then the ZeRO-1/2 all-gather.
  void step(const torch::Tensor& grad, double lr);

  // What a checkpoint keeps of this rank between steps, on the CPU: {the parameters it holds
  // (the full buffer, or the shard with ZeRO-3), exp_avg, exp_avg_sq, the step count}.
  std::vector<torch::Tensor> state() const;
  // Restores state(); InputError (source `source`) when the sizes are not this rank's.
  void load_state(const std::vector<torch::Tensor>& state, const std::string& source);

  std::int64_t padded_numel() const { return padded_; }
  std::int64_t shard_numel() const { return shard_numel_; }
  std::int64_t shard_offset() const { return shard_offset_; }  // 0 without ZeRO
  // The (start, length) ranges of the gradient buffer whose dp reductions this rank issued since
  // zero_grad, in issue order (every dp rank must list the same).
  const FlatRanges& reduction_log() const { return reduction_log_; }

 private:
  struct ShardBucket {  // sharded gradients: parameters [first, last) of one chunk
    std::size_t first = 0;
    std::size_t last = 0;
    std::size_t remaining = 0;
  };
  struct ShardChunk {  // buckets [begin, end) of one chunk; `next` is the next to reduce
    std::size_t begin = 0;
    std::size_t end = 0;
    std::size_t next = 0;
  };
  struct Bucket {  // overlapped all-reduce: a contiguous range of the gradient buffer
    std::int64_t begin = 0;
    std::int64_t end = 0;
    int parameters = 0;
    int remaining = 0;
  };

  void copy_into_flat(const std::vector<std::vector<FlatParameter>>& chunks,
                      const torch::TensorOptions& options);
  void bind();
  void make_shard_buckets(const std::vector<std::size_t>& chunk_ends, std::int64_t bucket_numel);
  void reduce_shard_bucket(std::size_t index);
  void make_buckets(std::int64_t bucket_numel);
  void launch(std::size_t index);

  costmodel::ZeroPolicy zero_;  // what the plan's ZeRO stage shards and when it communicates
  double weight_decay_;
  ParallelGroups& groups_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> numels_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::int64_t numel_ = 0;
  std::int64_t padded_ = 0;
  std::int64_t shard_numel_ = 0;
  std::int64_t shard_offset_ = 0;
  torch::Tensor flat_;   // all parameters (undefined between ZeRO-3 steps)
  torch::Tensor grad_;   // all gradients (undefined with sharded gradients)
  torch::Tensor shard_;  // ZeRO-3: this rank's parameters
  bool sharded_gradients_ = false;
  torch::Tensor shard_grad_;  // sharded gradients: this rank's summed gradient shard
  torch::Tensor staging_;     // sharded gradients: the reduction buffer (at most a bucket)
  std::vector<ShardBucket> shard_buckets_;
  std::vector<ShardChunk> shard_chunks_;
  // (start, length) ranges of the updated part where weight decay applies, and where the global
  // norm counts the elements.
  FlatRanges decay_ranges_;
  FlatRanges counted_ranges_;
  torch::Tensor exp_avg_;
  torch::Tensor exp_avg_sq_;
  std::int64_t step_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<compat::NodePointer> accumulators_;
  std::vector<PendingOperation> pending_;
  std::size_t next_bucket_ = 0;
  bool armed_ = false;
  FlatRanges reduction_log_;
};

}  // namespace loom::executor
