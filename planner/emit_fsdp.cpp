// `loom plan --emit fsdp`: a torchrun line and the settings of PyTorch FSDP
// (torch.distributed.fsdp.FullyShardedDataParallel) for train.py, as comments.
#include <string>

#include "costmodel/layers.hpp"
#include "costmodel/runtime_zero.hpp"
#include "planner/emit_common.hpp"

namespace loom::planner::emit_detail {
namespace {

using costmodel::Recompute;
using profiles::Precision;

// PyTorch's name of a precision's storage dtype (tf32 stores fp32).
const char* torch_dtype(Precision p) {
  if (p == Precision::kBf16 || p == Precision::kFp8) return "torch.bfloat16";
  if (p == Precision::kFp16) return "torch.float16";
  return "torch.float32";
}

std::string wrap_settings(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  const char* sharding = costmodel::to_string(costmodel::fsdp_sharding_of(s));
  // Mixed precision for 16-bit jobs only.
  const std::string dtype =
      costmodel::element_bytes(plan.job.precision) == 2 ? torch_dtype(plan.job.precision) : "";
  std::string out = "# in train.py, one FSDP unit per transformer block:\n";
  out += "#   model = FSDP(model,\n";
  out += std::string("#       sharding_strategy=ShardingStrategy.") + sharding + ",\n";
  out +=
      "#       auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, "
      "transformer_layer_cls={<the block class>}),\n";
  if (!dtype.empty()) {
    out += "#       mixed_precision=MixedPrecision(param_dtype=" + dtype +
           ", reduce_dtype=" + torch_dtype(plan.job.reduce_precision.value_or(Precision::kFp32)) +
           ", buffer_dtype=" + dtype + "),\n";
  }
  out += "#       backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n";
  out += "#       forward_prefetch=True,\n";
  out += "#       limit_all_gathers=True,\n";
  out += "#       use_orig_params=True)\n";
  return out;
}

std::string recompute_settings(const costmodel::Strategy& s) {
  if (s.recompute == Recompute::kSelective) {
    // Megatron-LM's selective recomputation: the attention core only.
    return "#   selective recomputation: in each block's attention, "
           "torch.utils.checkpoint.checkpoint(<the attention core>, q, k, v, use_reentrant=False) "
           "around the softmax and its two products; the projections, the MLP and the norms keep "
           "their activations\n";
  }
  if (s.recompute == Recompute::kFull && s.recompute_layers > 0) {
    return "#   apply_activation_checkpointing(model, check_fn=lambda m: m in "
           "set(<the block list>[:" +
           num(s.recompute_layers) + "]))\n";
  }
  if (s.recompute == Recompute::kFull) {
    return "#   apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, <the block "
           "class>))\n";
  }
  return "";
}

// Gradient accumulation as the plan times it (costmodel/runtime_fsdp.cpp): NO_SHARD reduces once
// per step, the sharded strategies reduce-scatter every micro-batch.
std::string accumulation_settings(const costmodel::Strategy& s) {
  std::string out = "#   " + num(s.micro_batch) + " samples per GPU per micro-batch, " +
                    num(s.num_micro_batches) + " micro-batches per step (gradient accumulation)\n";
  if (s.num_micro_batches <= 1) return out;
  if (!costmodel::shards_states(costmodel::fsdp_sharding_of(s))) {
    out += "#   micro-batches 1 to " + num(s.num_micro_batches - 1) +
           " under `with model.no_sync():` (FSDP2: model.set_requires_gradient_sync(False), "
           "True for the last): gradients all-reduce once per step\n";
  } else {
    out +=
        "#   every micro-batch reduce-scatters its gradients, as the plan times it: no "
        "no_sync() (FSDP2: set_requires_gradient_sync(False)), which would keep whole "
        "gradients between micro-batches\n";
  }
  return out;
}

}  // namespace

std::string fsdp(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  std::string out = header(plan, "PyTorch FSDP") + wrap_settings(plan);
  if (plan.job.precision == Precision::kTf32) {
    out += "#   torch.backends.cuda.matmul.allow_tf32 = True\n";
    out += "#   torch.backends.cudnn.allow_tf32 = True\n";
  }
  if (plan.job.precision == Precision::kFp8) {
    out +=
        "#   the blocks' linear layers as transformer_engine.pytorch.Linear, their forward "
        "under te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(fp8_format=Format.HYBRID))"
        "\n";
  }
  out += recompute_settings(s);
  if (s.attention == costmodel::Attention::kFlash) {
    out += "#   attention through torch.nn.functional.scaled_dot_product_attention (flash)\n";
  }
  if (plan.job.compile) {
    out += "#   each transformer block compiled before wrapping: block.compile() (torch.compile)\n";
  }
  out +=
      std::string("#   optimizer = torch.optim.AdamW(model.parameters(), ...") +
      (plan.job.optimizer_kernels == costmodel::OptimizerKernels::kFused     ? ", fused=True"
       : plan.job.optimizer_kernels == costmodel::OptimizerKernels::kForeach ? ", foreach=True"
                                                                             : ", foreach=False") +
      ")\n";
  out += accumulation_settings(s);
  if (s.tp > 1 || s.pp > 1) {
    out += "#   a DeviceMesh of (dp=" + num(s.dp) + ", tp=" + num(s.tp) + ", pp=" + num(s.pp) +
           "): shard over dp, torch.distributed.tensor.parallel over tp" +
           (s.sequence_parallel ? " with SequenceParallel" : "") +
           ", torch.distributed.pipelining over pp\n";
  }
  out += torchrun_nodes_comment(plan);
  out += torchrun(plan) + " train.py\n";
  return out;
}

}  // namespace loom::planner::emit_detail
