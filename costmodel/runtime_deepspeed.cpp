// DeepSpeed's ZeRO (runtime/zero/stage_1_and_2.py, stage3.py; runtime/pipe/engine.py) with the
// configuration `loom plan --emit deepspeed` writes (runtime_zero.hpp's DeepSpeedZero: its
// defaults, contiguous_gradients on, overlap_comm on at stage 3 only). Sources in
// docs/runtimes.md.
#include <algorithm>

#include "costmodel/layers.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/runtime_zero.hpp"

namespace loom::costmodel {
namespace {

// zero_optimization defaults (DeepSpeed's configuration docs), in elements.
constexpr double kReduceBucketElements = 5e8;      // reduce_bucket_size
constexpr double kPrefetchBucketElements = 5e7;    // stage3_prefetch_bucket_size
constexpr double kMaxLiveParameterElements = 1e9;  // stage3_max_live_parameters

std::optional<std::string> deepspeed_refusal(const Job& job, const Strategy& s) {
  if (job.precision == Precision::kFp8) {
    return std::string(
        "DeepSpeed's engine has no fp8 training of its own (use bf16, or runtime megatron or "
        "fsdp, which run TransformerEngine's fp8)");
  }
  if (s.pp > 1 && !deepspeed_zero_of(s).runs_with_pipeline) {
    return "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (they are incompatible with its "
           "pipeline parallelism); use zero 0 or 1 with pp=" +
           std::to_string(s.pp);
  }
  if (s.pp > 1 && (s.schedule != Schedule::k1F1B || s.virtual_stages > 1)) {
    return "DeepSpeed's pipeline engine runs one 1F1B schedule (TrainSchedule), not " +
           std::string(to_string(s.schedule));
  }
  return std::nullopt;
}

RuntimeMemory deepspeed_memory(const Job& job, const Strategy& s, const RankMemoryInput& in) {
  const DeepSpeedZero zero = deepspeed_zero_of(s);
  RuntimeMemory out;
  // The ZeRO paper's accounting is DeepSpeed's: low-precision weights and gradients, fp32 master
  // weights and Adam moments in the optimizer states (K = 12), sharded by stage.
  out.states = model_state_bytes(in.num_parameters, s.dp, s.zero, job.precision);
  const double e = element_bytes(job.precision);
  const double recompute = in.backward_working_bytes();
  double persistent = 0;
  double transient = 0;
  if (zero.policy.shards_optimizer_states) {
    // contiguous_gradients: the gradients of the bucket being reduced are copied into one
    // buffer of reduce_bucket_size elements (two with overlap_comm).
    const double buffers = zero.overlap_comm ? 2 : 1;
    persistent += buffers * e * std::min(kReduceBucketElements, in.num_parameters);
    // The optimizer step gives the fp32 partition of the master weights an fp32 gradient.
    transient = 4 * in.num_parameters / s.dp;
  }
  if (zero.policy.shards_parameters) {
    // Live gathered parameters: the module running plus the prefetched bucket, at most
    // stage3_max_live_parameters; and the module's full gradient before it is reduced.
    const double live =
        std::min({kMaxLiveParameterElements, in.layer_num_parameters + kPrefetchBucketElements,
                  in.num_parameters});
    persistent += e * live + e * std::min(in.layer_num_parameters, in.num_parameters);
  }
  out.buffer_bytes = persistent + std::max({0.0, recompute, transient - in.activation_bytes,
                                            in.dense_embedding_gradient_bytes(e)});
  return out;
}

// Stages 0-2 without overlap_comm reduce on the compute stream: nothing hides them. Stage 0
// all-reduces the gradients once per step; stage 1 reduce-scatters them once per step; stage 2
// after every micro-batch's backward. Stages 1 and 2 all-gather the updated weights after the
// optimizer step. Stage 3 (overlap_comm, prefetch) gathers every module's weights in the forward
// and again in the backward pass and reduce-scatters its gradients, hidden behind each pass but
// for the first module's gather and the last one's reduction.
DataParallelExposure deepspeed_exposure(const Job&, const Strategy& s,
                                        const DataParallelInput& in) {
  const double grads = in.num_parameters * in.element_bytes;
  const double layer = std::min(in.layer_num_parameters, in.num_parameters) * in.element_bytes;
  const double mb = static_cast<double>(in.num_micro_batches);
  const DeepSpeedZero zero = deepspeed_zero_of(s);
  DataParallelExposure out;
  if (zero.policy.shards_parameters) {
    const double gather = in.time_s(Collective::kAllGather, grads);
    const double reduce = in.time_s(Collective::kReduceScatter, grads);
    out.parameter_s =
        mb * exposed_after_window_s(gather, in.forward_window_s,
                                    in.time_s(Collective::kAllGather, layer), in.overlap_slowdown);
    out.gradient_s = mb * exposed_after_window_s(gather + reduce, in.backward_window_s,
                                                 in.time_s(Collective::kReduceScatter, layer),
                                                 in.overlap_slowdown);
  } else if (zero.policy.shards_optimizer_states) {
    out.gradient_s = (zero.policy.reduces_every_micro_batch ? mb : 1) *
                     in.time_s(Collective::kReduceScatter, grads);
    out.parameter_s = in.time_s(Collective::kAllGather, grads);
  } else {
    out.gradient_s = in.time_s(Collective::kAllReduce, grads);
  }
  return out;
}

// ZeRO-2 hands every parameter's gradient to a Python hook in each backward pass (copy into the
// contiguous bucket, partition bookkeeping: stage_1_and_2.py's
// reduce_independent_p_g_buckets_and_remove_grads); ZeRO-3 also fetches and releases every
// module's parameters around each forward and backward pass and reduces each gradient
// (stage3.py, partitioned_param_coordinator.py). ZeRO-1 reduces once after the last backward and
// ZeRO-0 not at all through hooks. The GPU waits for that host work. The figures are DeepSpeed's
// autotuning runs (DeepSpeedExamples training/autotuning/hf, 16 V100s, DeepSpeed 0.5): at equal
// micro-batch, ZeRO-2 took 0.15-0.16 ms per parameter tensor longer than ZeRO-1 for GPT-2
// medium, large and XL in fp16 (292, 436, 580 tensors), ZeRO-3 1.2 ms longer per tensor for
// DistilBERT and BERT-base in fp32 and 1.45 ms for GPT-2 XL in fp16. (ZeRO-2 cost the fp32 BERTs
// 0.39-0.46 ms per tensor, which this rule does not explain.) ZeRO-3's share is put a third in
// the forward pass (the fetches) and two thirds in the backward (fetches and reductions).
LayerTime deepspeed_host_per_tensor(const Job&, const Strategy& s) {
  constexpr double kZero2BackwardS = 0.15e-3;
  constexpr double kZero3S = 1.2e-3;
  const DeepSpeedZero zero = deepspeed_zero_of(s);
  if (zero.policy.shards_parameters) return {kZero3S / 3, 2 * kZero3S / 3, 0};
  if (zero.policy.shards_gradients) return {0, kZero2BackwardS, 0};
  return {};
}

// A step whose fp16 gradients overflow returns from the optimizer's step() after the overflow
// check, before the update (DeepSpeed 0.5's zero/stage2.py and stage3.py, fp16/fused_optimizer.py):
// no AdamW and, at ZeRO 1 and 2, no all-gather of updated weights. The gradients were reduced in
// the backward pass; ZeRO-3's parameter gathers run in the passes and stay.
double deepspeed_overflow_skipped_s(const Strategy& s, double optimizer_s, double parameter_s) {
  return optimizer_s + (deepspeed_zero_of(s).policy.gathers_after_step ? parameter_s : 0);
}

}  // namespace

RuntimeRules deepspeed_runtime_rules() {
  RuntimeRules r;
  r.name = "deepspeed";
  r.engine = "DeepSpeed";
  r.refusal = deepspeed_refusal;
  r.memory = deepspeed_memory;
  r.exposure = deepspeed_exposure;
  r.reduce_bytes_per_parameter = [](const Job& job) {
    return static_cast<double>(element_bytes(job.precision));
  };
  r.compiles = true;
  r.attention_kernel = AttentionKernel::kFlashAttention2;  // Hugging Face models under SDPA
  r.host_per_tensor = deepspeed_host_per_tensor;
  r.overflow_skipped_s = deepspeed_overflow_skipped_s;
  return r;
}

}  // namespace loom::costmodel
