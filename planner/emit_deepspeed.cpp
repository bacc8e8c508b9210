// `loom plan --emit deepspeed`: DeepSpeed's JSON configuration (deepspeed/runtime/config.py,
// DeepSpeedConfig) and the deepspeed launcher's line (deepspeed/launcher/runner.py).
#include <nlohmann/json.hpp>
#include <string>

#include "costmodel/runtime_zero.hpp"
#include "planner/emit_common.hpp"

namespace loom::planner::emit_detail {
namespace {

using costmodel::Recompute;
using profiles::Precision;

// The zero_optimization section: the settings the plan times (costmodel/runtime_zero.hpp's
// DeepSpeedZero, runtime_deepspeed.cpp).
nlohmann::ordered_json zero_section(const costmodel::Strategy& s) {
  const costmodel::DeepSpeedZero z = costmodel::deepspeed_zero_of(s);
  nlohmann::ordered_json zero = {{"stage", z.stage}};
  if (z.policy.shards_optimizer_states) {
    zero["contiguous_gradients"] = true;
    zero["overlap_comm"] = z.overlap_comm;
    zero["reduce_scatter"] = true;
    zero["reduce_bucket_size"] = 500000000;
  }
  if (z.policy.gathers_after_step) zero["allgather_bucket_size"] = 500000000;
  if (z.policy.shards_parameters) {
    zero["stage3_prefetch_bucket_size"] = 50000000;
    zero["stage3_max_live_parameters"] = 1000000000;
    zero["stage3_param_persistence_threshold"] = 100000;
  }
  return zero;
}

// How the model's parallelism is built: DeepSpeedConfig checks train_batch_size against the
// data-parallel size its mpu or PipelineModule's topology gives.
std::string model_parallel_comments(const costmodel::Strategy& s) {
  std::string out;
  if (s.tp > 1) {
    out += "# tp=" + num(s.tp) +
           ": tensor parallelism is the model's (Megatron-DeepSpeed's "
           "--tensor-model-parallel-size " +
           num(s.tp) + ")\n";
  }
  if (s.pp > 1 && s.tp > 1) {
    // deepspeed/runtime/pipe/module.py: PipelineModule(num_stages=P) alone builds a pipe x data
    // topology, data = world / P, counting the tp ranks as data parallel.
    out += "# pp=" + num(s.pp) + " with tp=" + num(s.tp) +
           ": wrap the model in deepspeed.pipe.PipelineModule(..., topology=deepspeed.runtime."
           "pipe.topology.PipeModelDataParallelTopology(num_pp=" +
           num(s.pp) + ", num_mp=" + num(s.tp) + ", num_dp=" + num(s.dp) + "))\n";
  } else if (s.pp > 1) {
    out += "# pp=" + num(s.pp) +
           ": wrap the model in deepspeed.pipe.PipelineModule(num_stages=" + num(s.pp) + ")\n";
  }
  return out;
}

std::string recompute_comment(const costmodel::Strategy& s) {
  if (s.recompute == Recompute::kSelective) {
    return "# recompute=selective: checkpoint only each block's attention core (the softmax and "
           "its two products, softmax(QK^T)V) with deepspeed.checkpointing.checkpoint; the "
           "projections, the MLP and the norms keep their activations\n";
  }
  if (s.recompute == Recompute::kFull) {
    return "# recompute=full: checkpoint " +
           (s.recompute_layers > 0
                ? "the first " + num(s.recompute_layers) + " transformer blocks of each stage"
                : std::string("every transformer block")) +
           " (deepspeed.checkpointing.checkpoint)\n";
  }
  return "";
}

}  // namespace

std::string deepspeed(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  nlohmann::ordered_json config = {
      {"train_batch_size", plan.job.global_batch},
      {"train_micro_batch_size_per_gpu", s.micro_batch},
      {"gradient_accumulation_steps", s.num_micro_batches},
  };
  if (plan.job.precision == Precision::kBf16) config["bf16"] = {{"enabled", true}};
  if (plan.job.precision == Precision::kFp16) config["fp16"] = {{"enabled", true}};
  // DeepSpeed's own AdamW (its fused kernel, the step the plan predicts); without an optimizer
  // section the engine would step the client's.
  config["optimizer"] = {{"type", "AdamW"}};
  config["zero_optimization"] = zero_section(s);
  std::string out = header(plan, "DeepSpeed");
  out += model_parallel_comments(s);
  out += recompute_comment(s);
  if (plan.job.precision == Precision::kTf32) {
    out += "# tf32: fp32 training with TF32 matrix products; in train.py before the model:\n";
    out += "#   torch.backends.cuda.matmul.allow_tf32 = True\n";
    out += "#   torch.backends.cudnn.allow_tf32 = True\n";
  }
  if (plan.job.compile) {
    // The configuration's "compile" section configures DeepCompile only (deepspeed/compile/
    // config.py, CompileConfig, no other keys); the engine compiles its module on request.
    out +=
        "# compile: after deepspeed.initialize, engine.compile(backend=\"inductor\") "
        "(torch.compile of the engine's module)\n";
  }
  out += "# optimizer: DeepSpeed's fused AdamW; its params (lr, betas, weight_decay) are yours\n";
  out += "cat > ds_config.json <<'JSON'\n" + config.dump(2) + "\nJSON\n";
  const std::int64_t nodes = nodes_of(plan);
  std::string launch = "deepspeed";
  if (nodes > 1) {
    out += "# " + num(nodes) +
           " nodes: the hostfile names them (replace node0.. with your hosts, which this one "
           "reaches by ssh); run this on one of them with MASTER_ADDR its address\n";
    out += "cat > hostfile <<'HOSTS'\n";
    for (std::int64_t n = 0; n < nodes; ++n) {
      out += "node" + num(n) + " slots=" + num(ranks_per_node(plan)) + "\n";
    }
    out += "HOSTS\n";
    launch += " --hostfile hostfile --master_addr \"$MASTER_ADDR\" --master_port 29500";
  }
  out += launch + " --num_nodes " + num(nodes) + " --num_gpus " + num(ranks_per_node(plan)) +
         " train.py --deepspeed --deepspeed_config ds_config.json\n";
  return out;
}

}  // namespace loom::planner::emit_detail
