// Megatron-LM (megatron/core: DistributedDataParallel, DistributedOptimizer) as Loom's plans run
// it: --use-distributed-optimizer for zero 1, --overlap-grad-reduce and --overlap-param-gather.
// Sources: Megatron-LM docs/source/distrib_optimizer.md (bytes per parameter); megatron/core/
// distributed/distributed_data_parallel.py (bucket size); docs/runtimes.md.
//
// NeMo 24.x runs Megatron-Core's model and pipeline with its own optimizer choice, so its rules
// are Megatron-LM's but for the gradients' width and the optimizer: zero 0 is fused Adam over
// Megatron's DDP, zero 1 Megatron-Core's distributed optimizer, zero 2 Apex's
// DistributedFusedAdam (apex/contrib/optimizers/distributed_fused_adam.py, as NeMo's
// nemo/core/optim/distributed_adam.py and megatron_base_model.py set it up and the launcher's
// 24.07 configurations ask for it: bf16 parameter synchronisation, contiguous gradient and
// parameter buffers, fp32 master weights stored as the bf16 weights plus 16-bit remainders,
// overlap_grad_sync and overlap_param_sync). The gradients' width is optim.grad_sync_dtype, the
// job's reduce_dtype: fp32 unless set (Apex's default, and Megatron-Core's fp32 gradient buffer,
// which NeMo keeps unless grad_sync_dtype is bf16).
#include <algorithm>

#include "costmodel/runtime.hpp"
#include "costmodel/runtime_zero.hpp"

namespace loom::costmodel {
namespace {

// Bytes per parameter of Megatron's model states (distrib_optimizer.md's table): bf16 weights
// with an fp32 main-grad buffer (accumulate-allreduce-grads-in-fp32, forced with bf16) and fp32
// main weights + Adam moments (12); fp16 weights and grads, whose optimizer also keeps an fp32
// copy of the gradients (16); fp32 training (4 + 4 + 8).
struct MegatronBytes {
  double parameters;
  double gradients;
  double optimizer;
};

MegatronBytes megatron_bytes(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
    case Precision::kFp8:  // TransformerEngine's fp8 keeps bf16 weights and fp32 main grads
      return {2, 4, 12};
    case Precision::kFp16:
      return {2, 2, 16};
    case Precision::kFp32:
    case Precision::kTf32:
      break;
  }
  return {4, 4, 8};
}

// Megatron's gradient buffer width: fp32 main grads by default, the weights' bf16 with
// --grad-reduce-in-bf16 (the job's reduce_dtype bf16; megatron/core/distributed/
// distributed_data_parallel_config.py, grad_reduce_in_fp32). The distributed optimizer's fp32
// main weights and moments stay as they are.
double megatron_gradient_bytes(const Job& job) {
  return job.reduce_precision ? element_bytes(*job.reduce_precision)
                              : megatron_bytes(job.precision).gradients;
}

// Megatron's gradient bucket: max(40M, 1M * dp) elements of the gradient buffer.
double bucket_elements(int dp) { return std::max(40e6, 1e6 * dp); }

// NeMo's gradient width: the job's reduce_dtype (grad_sync_dtype), else fp32.
double nemo_gradient_bytes(const Job& job) {
  return job.reduce_precision ? element_bytes(*job.reduce_precision) : 4.0;
}

// NeMo: the same weights and optimizer as Megatron-LM, with the gradient buffer in
// grad_sync_dtype.
MegatronBytes nemo_bytes(const Job& job) {
  MegatronBytes b = megatron_bytes(job.precision);
  b.gradients = nemo_gradient_bytes(job);
  return b;
}

// Apex's DistributedFusedAdam per parameter: the bf16 weights (views of the contiguous parameter
// buffer) and the contiguous gradient buffer (grad_sync_dtype) on every rank; over the
// data-parallel group, each rank's shard of the reduced gradients (grads_shard, grad_sync_dtype;
// the buffer itself when the group is one rank), of the 16-bit remainders that make the bf16
// weights fp32 master weights (store_param_remainders), and of Adam's two fp32 moments.
struct DistributedFusedAdamBytes {
  double parameters = 2;
  double gradients = 4;  // the buffer and the shard, each in grad_sync_dtype
  double sharded_optimizer = 2 + 8;
};

// Apex's bucket_cap_mb as NeMo's launcher sets it (125 MB; Apex's own default is 100).
constexpr double kDistributedAdamBucketBytes = 125e6;

std::optional<std::string> megatron_refusal(const Job& job, const Strategy& s) {
  if (job.reduce_precision) {
    const Precision reduce = *job.reduce_precision;
    const bool bf16_job = job.precision == Precision::kBf16 || job.precision == Precision::kFp8;
    if (reduce != Precision::kFp32 && !(reduce == Precision::kBf16 && bf16_job)) {
      return std::string(
                 "Megatron-LM reduces gradients in fp32, or with --grad-reduce-in-bf16 "
                 "in bf16 for bf16 and fp8 jobs: reduce_dtype ") +
             profiles::to_string(reduce) + " needs fp32 or bf16 (bf16 jobs), or runtime nemo";
    }
  }
  if (megatron_optimizer_of(s) == MegatronOptimizer::kDistributedFusedAdam) {
    return "Megatron-LM shards the optimizer states only (its distributed optimizer is ZeRO-1); "
           "zero=" +
           std::to_string(s.zero) +
           " needs --runtime nemo (Apex's DistributedFusedAdam), "
           "deepspeed or fsdp";
  }
  if (s.pp > 1 && s.schedule == Schedule::kGpipe) {
    return "Megatron-LM runs 1F1B or interleaved 1F1B pipelines, not GPipe";
  }
  return std::nullopt;
}

// fp8 jobs: TransformerEngine's fp8 copy of each linear weight and of its transpose (1 + 1 B per
// element), made by a step's first micro-batch and kept for the others (the workspaces
// TransformerEngineBaseModule keeps when is_first_microbatch is passed;
// RuntimeRules::caches_fp8_weights). Megatron-Core's output layer is not a TransformerEngine
// layer and stays in 16 bits.
double fp8_weight_copy_bytes(const Job& job, const RankMemoryInput& in) {
  return job.precision == Precision::kFp8 ? 2 * in.linear_weight_parameters : 0;
}

RuntimeMemory megatron_memory(const Job& job, const Strategy& s, const RankMemoryInput& in) {
  const MegatronBytes b = megatron_bytes(job.precision);
  RuntimeMemory out;
  out.states.parameter_bytes = in.num_parameters * b.parameters + fp8_weight_copy_bytes(job, in);
  out.states.gradient_bytes = in.num_parameters * megatron_gradient_bytes(job);
  out.states.optimizer_bytes = in.num_parameters * b.optimizer /
                               (shards_optimizer_states(megatron_optimizer_of(s)) ? s.dp : 1);
  // Gradient buckets are views of the contiguous main-grad buffer and the parameter all-gather
  // writes into the contiguous parameter buffer: no copies. The fused multi-tensor Adam needs no
  // shard-sized temporary. What remains: one layer's backward temporaries, and the word
  // embedding's dense gradient in the weights' dtype before it is added to the main grad.
  const double recompute = in.backward_working_bytes();
  out.buffer_bytes = std::max({0.0, recompute, in.dense_embedding_gradient_bytes(b.parameters)});
  return out;
}

RuntimeMemory nemo_memory(const Job& job, const Strategy& s, const RankMemoryInput& in) {
  RuntimeMemory out = megatron_memory(job, s, in);
  const double n = in.num_parameters;
  if (megatron_optimizer_of(s) != MegatronOptimizer::kDistributedFusedAdam) {
    out.states.gradient_bytes = n * nemo_bytes(job).gradients;
    return out;
  }
  DistributedFusedAdamBytes b;
  b.gradients = nemo_gradient_bytes(job);
  // optim.dtype bf16: the moments in bf16 and no remainders, the bf16 weights being the master
  // weights (store_params and store_param_remainders off when the optimizer's dtype is the
  // model's: setup_optimization in NeMo's megatron_base_model.py).
  if (job.optimizer_precision == Precision::kBf16) b.sharded_optimizer = 2 + 2;
  out.states.parameter_bytes = n * b.parameters + fp8_weight_copy_bytes(job, in);
  // A data-parallel group of one reduces nothing: the shard is the buffer itself
  // (_start_bucket_grad_sync: distributed_size == 1 makes sync_grads_shard the bucket).
  out.states.gradient_bytes = n * (b.gradients + (s.dp > 1 ? b.gradients / s.dp : 0));
  out.states.optimizer_bytes = n * b.sharded_optimizer / s.dp;
  return out;
}

// --overlap-grad-reduce: the buckets of the main-grad buffer are reduced (all-reduce, or
// reduce-scatter with the distributed optimizer) as the last micro-batch's backward fills them.
// --overlap-param-gather: the distributed optimizer's all-gather of updated weights runs bucket by
// bucket under the next step's first forward pass.
// `grad_width`: bytes per element of the gradient buffer, which the reduction sends.
DataParallelExposure overlapped_exposure(double grad_width, const Strategy& s,
                                         const DataParallelInput& in) {
  const double grads = in.num_parameters * grad_width;
  const double bucket = std::min(bucket_elements(s.dp) * grad_width, grads);
  DataParallelExposure out;
  const bool distributed = shards_optimizer_states(megatron_optimizer_of(s));
  const Collective reduce = distributed ? Collective::kReduceScatter : Collective::kAllReduce;
  out.gradient_s = exposed_after_window_s(in.time_s(reduce, grads), in.backward_window_s,
                                          in.time_s(reduce, bucket), in.overlap_slowdown);
  if (distributed) {
    const double params = in.num_parameters * in.element_bytes;
    const double param_bucket = std::min(bucket_elements(s.dp) * in.element_bytes, params);
    out.parameter_s = exposed_after_window_s(
        in.time_s(Collective::kAllGather, params), in.forward_window_s,
        in.time_s(Collective::kAllGather, param_bucket), in.overlap_slowdown);
  }
  return out;
}

// Zero 2 (DistributedFusedAdam): the bf16 gradient buckets are reduce-scattered as the last
// micro-batch's backward fills them (overlap_grad_sync), and the updated bf16 weights all-gathered
// bucket by bucket under the next step's first forward pass (overlap_param_sync). Zero 0 and 1
// are Megatron-Core's, reducing the gradient buffer.
DataParallelExposure nemo_exposure(const Job& job, const Strategy& s, const DataParallelInput& in) {
  if (megatron_optimizer_of(s) != MegatronOptimizer::kDistributedFusedAdam) {
    return overlapped_exposure(nemo_bytes(job).gradients, s, in);
  }
  const double grads = in.num_parameters * nemo_gradient_bytes(job);
  const double bucket = std::min(kDistributedAdamBucketBytes, grads);
  const double params = in.num_parameters * in.element_bytes;
  const double param_bucket = std::min(kDistributedAdamBucketBytes, params);
  DataParallelExposure out;
  out.gradient_s =
      exposed_after_window_s(in.time_s(Collective::kReduceScatter, grads), in.backward_window_s,
                             in.time_s(Collective::kReduceScatter, bucket), in.overlap_slowdown);
  out.parameter_s =
      exposed_after_window_s(in.time_s(Collective::kAllGather, params), in.forward_window_s,
                             in.time_s(Collective::kAllGather, param_bucket), in.overlap_slowdown);
  return out;
}

std::optional<std::string> nemo_refusal(const Job& job, const Strategy& s) {
  const std::optional<MegatronOptimizer> optimizer = megatron_optimizer(s.zero);
  if (job.optimizer_precision && *job.optimizer_precision != Precision::kFp32 &&
      optimizer != MegatronOptimizer::kDistributedFusedAdam) {
    return std::string("optimizer_dtype ") + profiles::to_string(*job.optimizer_precision) +
           " is Apex DistributedFusedAdam's dtype: it needs zero=2 (Megatron-Core's optimizers "
           "keep fp32 states)";
  }
  if (!optimizer) {
    return "NeMo shards optimizer states (zero 1, Megatron-Core's distributed optimizer) and "
           "gradients (zero 2, Apex's DistributedFusedAdam), not weights: zero=3 needs "
           "--runtime deepspeed or fsdp";
  }
  if (s.pp > 1 && s.schedule == Schedule::kGpipe) {
    return "NeMo runs Megatron-Core's 1F1B or interleaved 1F1B pipelines, not GPipe";
  }
  return std::nullopt;
}

}  // namespace

RuntimeRules megatron_runtime_rules() {
  RuntimeRules r;
  r.name = "megatron";
  r.engine = "Megatron-LM";
  r.refusal = megatron_refusal;
  r.memory = megatron_memory;
  r.exposure = [](const Job& job, const Strategy& s, const DataParallelInput& in) {
    return overlapped_exposure(megatron_gradient_bytes(job), s, in);  // the main-grad buffer
  };
  r.loss_backward_bytes_per_logit = 0;
  r.runs_job_loss = false;
  r.reduce_bytes_per_parameter = megatron_gradient_bytes;
  r.sets_reduce_dtype = true;  // --grad-reduce-in-bf16 (megatron_refusal: bf16 or fp32 only)
  // Megatron-LM fuses the QKV product, bias-GeLU, bias-dropout-add and the masked softmax.
  r.fusions = KernelFusions::megatron();
  r.overlaps_tp_communication = true;  // --tp-comm-overlap (TransformerEngine's userbuffers)
  r.caches_fp8_weights = true;         // TE's transpose cache (is_first_microbatch)
  r.context_parallel = true;           // --context-parallel-size
  return r;
}

RuntimeRules nemo_runtime_rules() {
  RuntimeRules r = megatron_runtime_rules();
  r.name = "nemo";
  r.engine = "NeMo";
  r.refusal = nemo_refusal;
  r.memory = nemo_memory;
  r.exposure = nemo_exposure;
  r.reduce_bytes_per_parameter = nemo_gradient_bytes;
  r.sets_reduce_dtype = true;     // optim.grad_sync_dtype
  r.sets_optimizer_dtype = true;  // optim.dtype (zero 2: nemo_refusal)
  return r;
}

}  // namespace loom::costmodel
