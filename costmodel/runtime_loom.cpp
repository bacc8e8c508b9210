// Loom's own executor: the memory and overlap rules of executor/ (zero.hpp says what each ZeRO
// stage shards and when it communicates).
#include <algorithm>

#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/zero.hpp"

namespace loom::costmodel {

// Loom's executor's per-step gradient work (declared in estimate.hpp beside the terms it sets).
double zero_staging_bytes_per_parameter(const Strategy& s) {
  if (s.dp <= 1 || !zero_policy(s.zero).reduces_every_micro_batch) return 0;
  return 8 + 12.0 / s.dp;
}

double zeroed_gradient_parameters(const Strategy& s, bool cpu, double rank_parameters) {
  if (s.world_size() == 1) return cpu ? rank_parameters : 0;
  return s.dp > 1 && zero_policy(s.zero).shards_gradients ? rank_parameters / s.dp
                                                          : rank_parameters;
}

namespace {

RuntimeMemory loom_memory(const Job& job, const Strategy& s, const RankMemoryInput& in) {
  const ZeroPolicy zero = zero_policy(s.zero);
  RuntimeMemory out;
  // fp32 weights, gradients and AdamW moments at every precision (16-bit jobs run under
  // autocast).
  out.states = model_state_bytes(in.num_parameters, s.dp, s.zero, Precision::kFp32);
  const double recompute = in.backward_working_bytes();
  // The optimizer step's working set, when it exceeds the backward pass's activations and
  // buffers (the step's peak is then the model states plus it). Loom's executor runs AdamW over
  // lists of tensors on one rank, in chunks of at most twice the largest tensor's elements (the
  // word embedding, or an MLP weight with a small vocabulary) with one fp32 temporary of a chunk
  // (executor/flat_adamw.hpp), and its own flat AdamW on the rank's shard with many (one fp32
  // temporary of the shard).
  const double shard = in.num_parameters / (zero.shards_optimizer_states ? s.dp : 1);
  // A plan describing DDP's torch.optim step (optimizer kernels other than fused, zero 0) has
  // that step's temporaries instead.
  double optimizer_working =
      s.world_size() == 1 ? 4 * std::min(2 * in.largest_tensor_num_parameters, in.num_parameters)
                          : 4 * shard;
  if (job.optimizer_kernels != OptimizerKernels::kFused) {
    optimizer_working =
        optimizer_temporary_bytes(job.optimizer_kernels, shard, in.largest_tensor_num_parameters);
  }
  // What Loom's executor holds beyond the model states. ZeRO 0/1 need no bucket copies: the
  // executor reduces gradient buckets in place in its flat gradient buffer (as Megatron-LM's
  // contiguous buffer, or DDP's gradient_as_bucket_view). ZeRO-2/3 keep no full gradient buffer:
  // every backward pass's gradients go through one staging buffer of at most a bucket, and one
  // bucket's gradients are alive at the end of the backward pass, when the activations are gone.
  // ZeRO-3 gathers its parameters block by block: kZero3GatheredUnits fp32 blocks (the one
  // computing and the next, in flight) besides the shard. At the activation peak (the start of
  // the backward pass) they are the last layers' (a transformer layer bounds the head's block).
  double persistent = 0;
  double transient = optimizer_working;
  double gathered = 0;
  if (s.dp > 1 && zero.reduces_every_micro_batch) {
    // The staging buffer holds a piece of one block at a time: at most a bucket, at most the
    // largest block.
    const double staging = std::min(in.bucket_bytes, 4.0 * in.largest_block_num_parameters);
    persistent += staging;
    transient = std::max(transient, staging);
    if (zero.gathers_per_block) {
      const double block = in.num_layers > 0 ? in.layer_num_parameters : in.num_parameters;
      gathered = 4.0 * kZero3GatheredUnits * std::min(block, in.num_parameters);
      persistent += gathered;
    }
  }
  // The word embedding's dense fp32 gradient (a GPipe stage 0 holds all but one micro-batch's
  // activations then). Under ZeRO-3 the embeddings' gathered block (the table) is held then
  // instead of the two layers counted above.
  double embedding_grad_extra = in.dense_embedding_gradient_bytes(4.0);
  if (in.embedding_table_num_parameters > 0 && gathered > 0) {
    embedding_grad_extra += 4.0 * in.embedding_table_num_parameters - gathered;
  }
  // Autocast's 16-bit copies of the transformer layers' weights: cached through the forward
  // pass (whose end holds every layer's) and kept by autograd for the backward. A layer that
  // recomputes keeps none into the backward pass (its forward records no graph, and the cache
  // ends with the forward pass): only the one being recomputed holds them again.
  const double copy_bytes =
      trains_under_autocast(job) ? element_bytes(job.precision) * in.layer_num_parameters : 0;
  const double copies = copy_bytes * in.num_layers;
  const double held =
      copy_bytes * (in.num_layers - in.recomputing_layers + (in.recomputing_layers > 0 ? 1 : 0));
  // One rank on a GPU sets its gradients to none at the step's start (the caching allocator
  // hands the memory back): with one micro-batch none exist at the activation peak; they appear
  // as the backward pass frees the activations and are all there for the optimizer step.
  double absent = 0;
  if (in.gpu && s.world_size() == 1 && s.num_micro_batches == 1) {
    absent = out.states.gradient_bytes;
    out.states.gradient_bytes = 0;
  }
  if (in.embedding_table_num_parameters > 0) embedding_grad_extra += absent;
  out.buffer_bytes =
      persistent + std::max({recompute + held, copies, absent + transient - in.activation_bytes,
                             embedding_grad_extra});
  return out;
}

// Loom's executor reduces gradients at every ZeRO stage (each rank then keeps its shard):
// ZeRO 0/1 all-reduce buckets once per step, during the last micro-batch's backward pass;
// ZeRO-2/3 reduce-scatter each block during every micro-batch's (the gradients cannot accumulate
// unsharded): NCCL's reduce-scatter, and on Gloo (CPU ranks) an all-reduce of the block, which
// ran faster there than a ring of point-to-point sends. ZeRO-1/2 all-gather the updated shards
// after the optimizer step; ZeRO-3 gathers every block in every forward and backward pass, the
// next block's gather hidden behind the current block's compute: the pass's first block is
// exposed, and what the pass cannot hide. Of the embedding's lookup tables the forward pass
// gathers only the rows some dp rank looks up (after an all-reduce of a mask of the rows,
// exposed), and the backward pass none: a lookup's backward reads no values.
DataParallelExposure loom_exposure(const Job&, const Strategy& s, const DataParallelInput& in) {
  const ZeroPolicy zero = zero_policy(s.zero);
  const double grads = in.num_parameters * in.element_bytes;
  const double bucket = std::min(in.bucket_bytes, grads);
  const Collective reduce = zero.reduce_scatters_gradients && !in.gloo ? Collective::kReduceScatter
                                                                       : Collective::kAllReduce;
  const double ar = in.time_s(reduce, grads);
  const double last = exposed_after_window_s(ar, in.backward_window_s, in.time_s(reduce, bucket),
                                             in.overlap_slowdown);
  DataParallelExposure out;
  out.gradient_s =
      zero.reduces_every_micro_batch
          ? static_cast<double>(in.num_micro_batches - 1) *
                    exposed_beyond_window_s(ar, in.backward_window_s, in.overlap_slowdown) +
                last
          : last;
  if (zero.gathers_per_block) {
    const double gather =
        in.time_s(Collective::kAllGather,
                  (in.num_parameters - in.forward_ungathered_num_parameters) * in.element_bytes);
    const double mask =
        in.lookup_mask_bytes > 0 ? in.time_s(Collective::kAllReduce, in.lookup_mask_bytes) : 0.0;
    const double backward_gather =
        in.time_s(Collective::kAllGather,
                  (in.num_parameters - in.backward_ungathered_num_parameters) * in.element_bytes);
    const double block = in.layer_num_parameters > 0 ? in.layer_num_parameters : in.num_parameters;
    const double first =
        in.time_s(Collective::kAllGather, std::min(block, in.num_parameters) * in.element_bytes);
    out.parameter_s =
        static_cast<double>(in.num_micro_batches) *
        (mask +
         exposed_after_window_s(gather, in.forward_window_s, std::min(first, gather),
                                in.overlap_slowdown) +
         exposed_after_window_s(backward_gather, in.backward_window_s,
                                std::min(first, backward_gather), in.overlap_slowdown));
  } else if (zero.gathers_after_step) {
    out.parameter_s = in.time_s(Collective::kAllGather, grads);
  }
  return out;
}

}  // namespace

RuntimeRules loom_runtime_rules() {
  RuntimeRules r;
  r.name = "loom";
  r.engine = "Loom's executor";
  // Its head runs LibTorch's eager cross-entropy: a plan may not promise a fused loss's memory.
  r.refusal = [](const Job& job, const Strategy& s) -> std::optional<std::string> {
    if (job.loss == Loss::kFused) {
      return std::string(
          "Loom's executor runs the eager loss (use loss eager, or runtime fsdp or "
          "deepspeed for a fused one)");
    }
    if (job.optimizer_kernels != OptimizerKernels::kFused &&
        zero_policy(s.zero).shards_optimizer_states) {
      return std::string(
          "optimizer_kernels other than fused describe plain data parallelism's optimizer (zero "
          "0); Loom's ZeRO stages step flat shards with one fused kernel");
    }
    if (job.precision == Precision::kFp8) {
      return std::string(
          "Loom's executor has no fp8 products (use bf16, or runtime megatron or fsdp, which "
          "run TransformerEngine's fp8)");
    }
    return std::nullopt;
  };
  r.memory = loom_memory;
  r.exposure = loom_exposure;
  r.skips_lookup_gathers = true;
  // The executor runs the MLP's activation as one kernel (torch::gelu): it refuses gelu_new.
  r.fusions.activation = true;
  r.host_floor = true;
  r.chooses_optimizer_kernels = true;  // as DDP's (Loom's executor itself runs fused)
  r.autocast = true;
  r.reduce_bytes_per_parameter = [](const Job&) { return 4.0; };  // fp32 gradients
  return r;
}

}  // namespace loom::costmodel
