// PyTorch FSDP (torch.distributed.fsdp, FSDP1 and FSDP2's fully_shard) with one unit per
// transformer block, forward and backward prefetch, and the mixed precision `loom plan --emit
// fsdp` writes (param_dtype = the job's, reduce_dtype = the job's reduce_dtype, fp32 unless it
// says otherwise): zero 0 = NO_SHARD, 2 = SHARD_GRAD_OP, 3 = FULL_SHARD (runtime_zero.hpp).
// Sources in docs/runtimes.md.
#include <algorithm>

#include "costmodel/layers.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/runtime_zero.hpp"

namespace loom::costmodel {
namespace {

constexpr double kDdpBucketBytes = 25.0 * 1024 * 1024;  // NO_SHARD reduces as DDP does

// Bytes per gradient element the reduction sends: the job's reduce_dtype, fp32 when unset
// (torchtitan's default; Composer's PURE and fms-fsdp's bf16 policy reduce in bf16).
double reduce_bytes(const Job& job) {
  return job.reduce_precision ? element_bytes(*job.reduce_precision) : 4.0;
}

std::optional<std::string> fsdp_refusal(const Job&, const Strategy& s) {
  if (!fsdp_sharding(s.zero)) {
    return "PyTorch FSDP has no optimizer-only sharding (ZeRO-1): zero 0 = NO_SHARD, 2 = "
           "SHARD_GRAD_OP, 3 = FULL_SHARD";
  }
  return std::nullopt;
}

RuntimeMemory fsdp_memory(const Job& job, const Strategy& s, const RankMemoryInput& in) {
  // The sharded flat parameters stay fp32 and are the optimizer's weights (no separate master
  // copy); their gradients are fp32; AdamW keeps two fp32 moments. Sharded by dp with
  // SHARD_GRAD_OP and FULL_SHARD, whole with NO_SHARD.
  const FsdpSharding sharding = fsdp_sharding_of(s);
  const double shards = shards_states(sharding) ? s.dp : 1;
  RuntimeMemory out;
  out.states.parameter_bytes = 4 * in.num_parameters / shards;
  out.states.gradient_bytes = 4 * in.num_parameters / shards;
  out.states.optimizer_bytes = 8 * in.num_parameters / shards;
  const double e = element_bytes(job.precision);
  const double layer = std::min(in.layer_num_parameters, in.num_parameters);
  // The root unit (embeddings, final norm, head) stays gathered from forward to backward.
  const double root = std::max(0.0, in.num_parameters - in.num_layers * layer);
  double gathered = 0;
  if (sharding == FsdpSharding::kShardGradOp) {
    // SHARD_GRAD_OP keeps every block unsharded from its forward until its backward.
    gathered = e * in.num_parameters;
  } else if (sharding == FsdpSharding::kFullShard || e < 4) {
    // FULL_SHARD: the running block and the prefetched one, unsharded in param_dtype; NO_SHARD
    // with mixed precision: the low-precision copies of the same two blocks.
    gathered = e * (root + std::min(2 * layer, in.num_parameters - root));
  }
  // One block's unsharded gradient in reduce_dtype before its reduce-scatter (NO_SHARD: a
  // DDP-style bucket).
  const double gradient_working =
      shards_states(sharding) ? reduce_bytes(job) * layer : kDdpBucketBytes;
  const double recompute = in.backward_working_bytes();
  // The optimizer step's temporaries, by its kernels (costmodel/optimizer.hpp).
  const double optimizer_working = optimizer_temporary_bytes(
      job.optimizer_kernels, in.num_parameters / shards, in.largest_tensor_num_parameters / shards);
  out.buffer_bytes = gathered + gradient_working +
                     std::max({0.0, recompute, optimizer_working - in.activation_bytes,
                               in.dense_embedding_gradient_bytes(e)});
  return out;
}

// Per micro-batch (no no_sync with sharding): SHARD_GRAD_OP gathers every block once in the
// forward pass; FULL_SHARD again in the backward pass; both reduce-scatter each block's fp32
// gradients in the backward pass. Prefetch hides them behind the pass but for the first block's
// gather and the last block's reduction. NO_SHARD all-reduces fp32 gradients in 25 MiB buckets
// during the last micro-batch's backward (no_sync before it), as DDP.
DataParallelExposure fsdp_exposure(const Job& job, const Strategy& s, const DataParallelInput& in) {
  const double layer = std::min(in.layer_num_parameters, in.num_parameters);
  const double grads = reduce_bytes(job) * in.num_parameters;
  const double mb = static_cast<double>(in.num_micro_batches);
  const FsdpSharding sharding = fsdp_sharding_of(s);
  DataParallelExposure out;
  if (!shards_states(sharding)) {
    out.gradient_s = exposed_after_window_s(
        in.time_s(Collective::kAllReduce, grads), in.backward_window_s,
        in.time_s(Collective::kAllReduce, std::min(kDdpBucketBytes, grads)), in.overlap_slowdown);
    return out;
  }
  const double gather = in.time_s(Collective::kAllGather, in.num_parameters * in.element_bytes);
  const double first_gather = in.time_s(Collective::kAllGather, layer * in.element_bytes);
  const double reduce = in.time_s(Collective::kReduceScatter, grads);
  const double last_reduce = in.time_s(Collective::kReduceScatter, reduce_bytes(job) * layer);
  out.parameter_s =
      mb * exposed_after_window_s(gather, in.forward_window_s, first_gather, in.overlap_slowdown);
  const double backward_comm = reduce + (sharding == FsdpSharding::kFullShard ? gather : 0);
  out.gradient_s = mb * exposed_after_window_s(backward_comm, in.backward_window_s, last_reduce,
                                               in.overlap_slowdown);
  return out;
}

}  // namespace

RuntimeRules fsdp_runtime_rules() {
  RuntimeRules r;
  r.name = "fsdp";
  r.engine = "PyTorch FSDP";
  r.refusal = fsdp_refusal;
  r.memory = fsdp_memory;
  r.exposure = fsdp_exposure;
  r.reduce_bytes_per_parameter = reduce_bytes;
  r.sets_reduce_dtype = true;
  r.chooses_optimizer_kernels = true;
  // Selective checkpointing as torchtitan applies it to FSDP2 models (its per-operator policy,
  // torchtitan's default "selective op" mode).
  r.selective = SelectivePolicy::kOperators;
  r.compiles = true;
  r.attention_kernel = AttentionKernel::kFlashAttention2;  // flash-attn 2, SDPA's flash backend
  return r;
}

}  // namespace loom::costmodel
