// Megatron-LM (megatron/core: DistributedDataParallel, DistributedOptimizer) as Loom's plans run
// it: --use-distributed-optimizer for zero 1, --overlap-grad-reduce and --overlap-param-gather.
// Sources: Megatron-LM docs/source/distrib_optimizer.md (bytes per parameter); megatron/core/
// distributed/distributed_data_parallel.py (bucket size); docs/runtimes.md.
#include <algorithm>

#include "costmodel/runtime.hpp"

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

// Megatron's gradient bucket: max(40M, 1M * dp) elements of the gradient buffer.
double bucket_elements(int dp) { return std::max(40e6, 1e6 * dp); }

std::optional<std::string> megatron_refusal(const Job&, const Strategy& s) {
  if (s.zero > 1) {
    return "Megatron-LM shards the optimizer states only (its distributed optimizer is ZeRO-1); "
           "zero=" +
           std::to_string(s.zero) + " needs --runtime deepspeed or fsdp";
  }
  if (s.pp > 1 && s.schedule == Schedule::kGpipe) {
    return "Megatron-LM runs 1F1B or interleaved 1F1B pipelines, not GPipe";
  }
  return std::nullopt;
}

RuntimeMemory megatron_memory(const Job& job, const Strategy& s, const RankMemoryInput& in) {
  const MegatronBytes b = megatron_bytes(job.precision);
  RuntimeMemory out;
  out.states.parameter_bytes = in.num_parameters * b.parameters;
  out.states.gradient_bytes = in.num_parameters * b.gradients;
  out.states.optimizer_bytes = in.num_parameters * b.optimizer / (s.zero >= 1 ? s.dp : 1);
  // Gradient buckets are views of the contiguous main-grad buffer and the parameter all-gather
  // writes into the contiguous parameter buffer: no copies. The fused multi-tensor Adam needs no
  // shard-sized temporary. What remains: one layer's backward temporaries, and the word
  // embedding's dense gradient in the weights' dtype before it is added to the main grad.
  const double recompute = in.backward_working_bytes();
  double embedding_grad_extra = 0;
  if (in.embedding_table_num_parameters > 0) {
    embedding_grad_extra = b.parameters * in.embedding_table_num_parameters -
                           std::min(in.chunk_activation_bytes, in.activation_bytes);
  }
  out.buffer_bytes = std::max({0.0, recompute, embedding_grad_extra});
  return out;
}

// --overlap-grad-reduce: the buckets of the main-grad buffer are reduced (all-reduce, or
// reduce-scatter with the distributed optimizer) as the last micro-batch's backward fills them.
// --overlap-param-gather: the distributed optimizer's all-gather of updated weights runs bucket by
// bucket under the next step's first forward pass.
DataParallelExposure megatron_exposure(const Job& job, const Strategy& s,
                                       const DataParallelInput& in) {
  const double grad_width = megatron_bytes(job.precision).gradients;  // the main-grad buffer
  const double grads = in.num_parameters * grad_width;
  const double bucket = std::min(bucket_elements(s.dp) * grad_width, grads);
  DataParallelExposure out;
  const Collective reduce = s.zero >= 1 ? Collective::kReduceScatter : Collective::kAllReduce;
  out.gradient_s = exposed_after_window_s(in.time_s(reduce, grads), in.backward_window_s,
                                          in.time_s(reduce, bucket), in.overlap_slowdown);
  if (s.zero >= 1) {
    const double params = in.num_parameters * in.element_bytes;
    const double param_bucket = std::min(bucket_elements(s.dp) * in.element_bytes, params);
    out.parameter_s = exposed_after_window_s(
        in.time_s(Collective::kAllGather, params), in.forward_window_s,
        in.time_s(Collective::kAllGather, param_bucket), in.overlap_slowdown);
  }
  return out;
}

}  // namespace

RuntimeRules megatron_runtime_rules() {
  RuntimeRules r;
  r.name = "megatron";
  r.engine = "Megatron-LM";
  r.refusal = megatron_refusal;
  r.memory = megatron_memory;
  r.exposure = megatron_exposure;
  r.loss_backward_bytes_per_logit = 0;
  r.runs_job_loss = false;
  r.reduce_bytes_per_parameter = [](const Job& job) {
    return megatron_bytes(job.precision).gradients;
  };
  // Megatron-LM fuses the QKV product, bias-GeLU, bias-dropout-add and the masked softmax.
  r.fusions = KernelFusions::megatron();
  return r;
}

}  // namespace loom::costmodel
