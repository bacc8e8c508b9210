// The data-parallel engine of the many-rank training step: one rank's parameters and gradients in
// flat fp32 buffers, their ZeRO shards over the dp group, the gradient reduction, ZeRO-3's
// gathers of the parameters block by block, the global gradient norm and AdamW on the part this
// rank updates.
//
// Layout: the rank's parameters (its model chunks in order, each chunk's in order) fall into
// units. ZeRO-0/1 have one unit holding them all; ZeRO-2/3 one unit per entry of a chunk's layer
// sequence (the embeddings, each transformer layer, the head: FlatParameter::unit), as FSDP wraps
// each block in a FlatParameter. A unit of n elements is padded to a multiple of dp (its padded
// numel) and the units are concatenated into the full buffer of padded_numel elements; dp rank r
// owns chunk r of every unit ([r * S_u, (r + 1) * S_u) of unit u, S_u = padded_u / dp), and its
// shard is those chunks concatenated in unit order (shard_numel = padded_numel / dp elements;
// shard_ranges() lists where they lie in the full buffer). Every parameter tensor is a view of its
// slice of the full buffer (ZeRO-3: of its unit's gathered buffer), so the model reads and writes
// the buffer directly. AdamW's moments cover the shard (ZeRO >= 1) or the full buffer (ZeRO-0).
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
//     micro-batch's), as soon as a unit's gradients are all there, they are copied into the
//     staging buffer (pieces of at most bucket_bytes / dp per rank), the parameters' gradients
//     freed and the buffer reduce-scattered asynchronously while the backward pass goes on; this
//     rank's chunk of the sum is added to its gradient shard when the buffer is needed for the
//     next piece or the chunk's backward pass ends (one reduction in flight at a time), as
//     DeepSpeed's ZeRO-2 overlaps its reductions. The shard is divided by dp; AdamW updates the
//     shard; the updated chunks are all-gathered unit by unit.
//   ZeRO-3: gradients as ZeRO-2, but the rank keeps only its parameter shard. Each unit has a
//     gathered buffer whose memory exists only while the unit is in use: all-gathered just before
//     the unit's forward (layer_hooks(), which the model calls around each layer) and freed after
//     it; gathered again just before its backward (a hook on its output's gradient: only the
//     parameters the backward reads, FlatParameter::read_by_backward) and freed when its
//     gradients have been reduce-scattered. Of the lookup tables the model names before a
//     unit's forward (LayerHooks::before_forward), the forward gather takes only the rows some
//     dp rank reads (gather_rows). While unit u computes, the next unit's gather is in
//     flight (u + 1 in the forward, u - 1 in the backward, within the chunk):
//     asynchronous on Gloo's worker threads, on NCCL's stream on CUDA. So a rank holds its shard
//     plus at most two gathered units (kGatheredUnits). AdamW updates the shard; no all-gather
//     after the step. materialize() gathers every unit and holds them until release() (an
//     export, a checkpoint conversion).
//   With dp = 1, ZeRO-2/3 keep a full gradient buffer and reduce_gradients "reduce-scatters"
//   it over the group of one (a copy).
//
// Order of the dp collectives in a step, the same on every rank:
//   1. ZeRO-3: during every forward pass, each unit's all-gather in unit order (started while
//      the previous unit computes; a unit with lookup tables: the mask's all-reduce, then one
//      broadcast per rank holding some of the rows); during every backward pass, each unit's
//      all-gather in reverse unit order, interleaved with the reduce-scatters of 2.
//   2. During the backward passes: ZeRO-0/1 with `overlap`: the last backward pass's gradient
//      hooks (after arm()) start bucket all-reduces asynchronously, in bucket index order only;
//      ZeRO-2/3: each unit's reduce-scatter, in reverse unit order within the chunk (a hook
//      starts it when the unit's gradients are all there, never out of order; finish_backward
//      reduces the rest).
//   3. reduce_gradients: ZeRO-0/1 start the buckets not yet started and wait for all (without
//      overlap: one all-reduce of the whole buffer).
//   4. global_norm: the squared norm all-reduced over dp (ZeRO >= 1: each rank holds a shard),
//      then over tp and pp.
//   5. step: ZeRO-1/2 all-gather the updated shards (ZeRO-2: unit by unit).
// ZeRO-0/1 buckets hold consecutive parameters counted from the last (the order in which a
// backward pass finishes them), about bucket_bytes each.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
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
  int unit = 0;  // ZeRO-2/3 unit within the chunk: the entry of the layer sequence it belongs to
  // Whether the backward pass reads its values (false: an embedding table only looked up, whose
  // backward scatters the gradient into rows; ZeRO-3 then leaves it out of the backward gather).
  bool read_by_backward = true;
};

// ZeRO-3 holds at most this many gathered units at once: the one computing and the one whose
// gather is in flight (the cost model's rule, costmodel::kZero3GatheredUnits).
inline constexpr int kGatheredUnits = costmodel::kZero3GatheredUnits;

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
  // ZeRO-3: gathers every unit's parameters from the dp shards and holds them until release()
  // (a no-op otherwise or when held).
  void materialize();
  // ZeRO-3: frees every gathered unit and the gradients, keeping the shard (a no-op otherwise).
  void release();
  // ZeRO-3: what chunk k's model calls around each entry of its layer sequence (gathering and
  // freeing units); null otherwise. Keeps a pointer to this engine.
  std::shared_ptr<LayerHooks> layer_hooks(int k);
  // ZeRO-3 with dp > 1: every forward pass runs dp collectives (its gathers), so every dp rank
  // must run the same forward passes, training or not.
  bool gathers_in_forward() const { return per_block_ && groups_.dp_size() > 1; }
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
  // Where this rank's shard lies in the full buffer: (start, length) per unit, in shard order.
  const FlatRanges& shard_ranges() const { return shard_ranges_; }
  // Each parameter's offset in the full buffer, in the order given to the constructor.
  const std::vector<std::int64_t>& parameter_offsets() const { return offsets_; }
  // ZeRO-3: the dp all-gathers issued since zero_grad (one per unit gathered) and the most
  // gathered-buffer elements this rank held at once.
  std::int64_t gather_count() const { return gather_count_; }
  std::int64_t peak_gathered_numel() const { return peak_gathered_; }
  // ZeRO-3: the elements of the units those gathers held (a backward gather counts only the
  // parameters the backward pass reads).
  std::int64_t gathered_elements() const { return gathered_elements_; }
  // The (start, length) ranges of the gradient buffer whose dp reductions this rank issued since
  // zero_grad, in issue order (every dp rank must list the same).
  const FlatRanges& reduction_log() const { return reduction_log_; }

 private:
  struct Unit {
    std::size_t first = 0;  // parameters [first, last)
    std::size_t last = 0;
    int chunk = 0;
    int layer = 0;
    std::int64_t offset = 0;  // in the full buffer
    std::int64_t padded = 0;
    std::int64_t shard_numel = 0;   // padded / dp
    std::int64_t shard_offset = 0;  // in this rank's shard
    std::size_t remaining = 0;      // gradients still to come in this backward pass
    FlatRanges decay;               // AdamW's decay ranges within this rank's chunk of the unit
    // ZeRO-3: the gathered parameters (memory only while gathered), and the gather in flight.
    torch::Tensor gathered;
    bool held = false;
    std::vector<PendingOperation> gathering;
    // ZeRO-3's backward gather: the unit-relative ranges of the parameters the backward pass
    // reads, when some are not read (empty: the whole unit); `partial` while only they are held.
    FlatRanges backward_ranges;
    bool partial = false;
  };
  struct ChunkUnits {  // units [begin, end) of one chunk; `next` is the next to reduce (from end)
    std::size_t begin = 0;
    std::size_t end = 0;
    std::size_t next = 0;
  };
  class UnitHooks;
  class GatherBeforeBackward;
  struct Bucket {  // overlapped all-reduce: a contiguous range of the gradient buffer
    std::int64_t begin = 0;
    std::int64_t end = 0;
    int parameters = 0;
    int remaining = 0;
  };

  void copy_into_flat(const std::vector<std::vector<FlatParameter>>& chunks,
                      const torch::TensorOptions& options);
  void bind();
  void make_units(const std::vector<std::vector<FlatParameter>>& chunks, bool per_layer, int dp);
  void make_unit_hooks();
  void reduce_unit(std::size_t index);
  // Waits for the reduction in flight, if any, and adds this rank's sum to its gradient shard.
  void settle_reduction();
  // ZeRO-3: starts the gather of unit u unless it is held or in flight; makes it held and
  // complete; frees it (unless materialized).
  // For the backward pass (`backward`), only the unit's backward_ranges are gathered.
  void start_gather(std::size_t u, bool backward = false);
  // Gives the unit's gathered buffer its memory and counts the gather (its elements are counted
  // by the caller).
  void allocate_gathered(Unit& unit);
  void gather(std::size_t u, bool backward = false);
  void free_unit(std::size_t u);
  // ZeRO-3 with dp > 1, before the forward pass of unit u, which looks up `lookups`: gathers the
  // unit's parameters except the rows of those tables that no dp rank looks up (the union over
  // the group, all-reduced as a mask of rows). Each rank's part of what is gathered is one
  // contiguous run of its chunk's elements in unit order, broadcast from it. The unit is then
  // held partially, and freed after its forward pass.
  void gather_rows(std::size_t u, const std::vector<LookupRows>& lookups);
  // The layer hooks' actions: before unit u's forward, after it, before its backward.
  void enter_forward(int k, int layer, const std::vector<LookupRows>& lookups);
  torch::Tensor exit_forward(int k, int layer, const torch::Tensor& output);
  void enter_backward(std::size_t u);
  std::size_t unit_of(int k, int layer) const;
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
  std::int64_t shard_offset_ = 0;  // one unit: this rank's chunk starts there
  FlatRanges shard_ranges_;
  std::vector<Unit> units_;
  std::vector<ChunkUnits> chunk_units_;
  bool per_block_ = false;  // ZeRO-3: units gathered around their forward and backward
  bool materialized_ = false;
  std::int64_t gathered_numel_ = 0;
  std::int64_t peak_gathered_ = 0;
  std::int64_t gather_count_ = 0;
  std::int64_t gathered_elements_ = 0;  // elements all-gathered since zero_grad()
  torch::Tensor flat_;                  // all parameters (undefined with ZeRO-3)
  torch::Tensor grad_;                  // all gradients (undefined with sharded gradients)
  torch::Tensor shard_;                 // ZeRO-3: this rank's parameters
  bool sharded_gradients_ = false;
  torch::Tensor shard_grad_;        // sharded gradients: this rank's summed gradient shard
  torch::Tensor staging_;           // sharded gradients: the reduction buffer (at most a bucket)
  std::int64_t staging_piece_ = 0;  // elements of each rank's chunk the staging buffer holds
  // The staging buffer's reduction in flight: its sum (this rank's chunk of the staging buffer)
  // goes into the gradient shard at `shard_at` once it is done.
  struct InFlight {
    PendingOperation operation;
    torch::Tensor mine;
    std::int64_t shard_at = 0;
  };
  std::optional<InFlight> in_flight_;
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
