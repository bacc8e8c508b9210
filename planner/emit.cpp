#include "planner/emit.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "costmodel/layers.hpp"
#include "costmodel/runtime.hpp"
#include "profiles/errors.hpp"

namespace loom::planner {
namespace {

using costmodel::Recompute;
using profiles::Precision;

std::string num(std::int64_t v) { return std::to_string(v); }

// Whole nodes the plan's ranks fill (ranks fill nodes in order) and ranks per node.
std::int64_t nodes_of(const Plan& plan) {
  const std::int64_t world = plan.strategy.world_size();
  const std::int64_t per_node = plan.cluster.devices_per_node;
  return (world + per_node - 1) / per_node;
}
std::int64_t ranks_per_node(const Plan& plan) {
  return std::min<std::int64_t>(plan.strategy.world_size(), plan.cluster.devices_per_node);
}

std::string header(const Plan& plan, const char* engine) {
  std::string out = std::string("# ") + engine + " settings for Loom's plan: " + plan.model.name +
                    " on " + num(plan.strategy.world_size()) + " " + plan.cluster.device.name +
                    ", " + costmodel::describe(plan.strategy) + "\n";
  out += "# global batch " + num(plan.job.global_batch) + ", seq " + num(plan.job.seq_len) +
         ", precision " + profiles::to_string(plan.job.precision) + "\n";
  return out;
}

// "torchrun --nnodes N --nproc-per-node G" (every node runs it with its --node-rank).
std::string torchrun(const Plan& plan) {
  return "torchrun --nnodes " + num(nodes_of(plan)) + " --nproc-per-node " +
         num(ranks_per_node(plan));
}

// Transformer layers in stage range `r` (entries 1..L of the layer sequence).
std::int64_t layers_in(const costmodel::StageRange& r, std::int64_t layers) {
  return std::max<std::int64_t>(0, std::min<std::int64_t>(r.last_layer, layers) -
                                       std::max<std::int64_t>(r.first_layer, 1) + 1);
}

// Megatron-LM's --decoder-first/last-pipeline-num-layers for a plan whose pipeline (no
// interleaving) gives the first and last stages their own layer counts and the others one equal
// count; false when the plan's split is not of that form.
bool uneven_pipeline_args(const Plan& plan, std::vector<std::string>* args) {
  const costmodel::Strategy& s = plan.strategy;
  if (s.pp < 2 || s.virtual_stages > 1 || plan.stages.size() != static_cast<std::size_t>(s.pp)) {
    return false;
  }
  const std::int64_t layers = plan.model.layers;
  for (std::size_t i = 2; i + 1 < plan.stages.size(); ++i) {
    if (layers_in(plan.stages[i], layers) != layers_in(plan.stages[1], layers)) return false;
  }
  const std::int64_t first = layers_in(plan.stages.front(), layers);
  const std::int64_t last = layers_in(plan.stages.back(), layers);
  if (first == 0 || last == 0) return false;
  auto at = std::find_if(args->begin(), args->end(), [](const std::string& a) {
    return a.rfind("--pipeline-model-parallel-size", 0) == 0;
  });
  args->insert(at + 1, {"--decoder-first-pipeline-num-layers " + num(first),
                        "--decoder-last-pipeline-num-layers " + num(last)});
  return true;
}

std::string megatron(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  const profiles::ModelSpec& m = plan.model;
  std::vector<std::string> args = {
      "--num-layers " + num(m.layers),         "--hidden-size " + num(m.hidden),
      "--num-attention-heads " + num(m.heads), "--ffn-hidden-size " + num(m.ffn_hidden),
      "--seq-length " + num(plan.job.seq_len), "--max-position-embeddings " + num(m.max_positions),
  };
  if (m.key_value_heads() != m.heads) {
    args.push_back("--group-query-attention");
    args.push_back("--num-query-groups " + num(m.key_value_heads()));
  }
  if (m.gated_mlp) {
    // The cost model reads a gated MLP as the Llama family: RMSNorm, rotary positions, no
    // biases, an output matrix of its own.
    for (const char* a : {"--swiglu", "--normalization RMSNorm", "--position-embedding-type rope",
                          "--disable-bias-linear", "--untie-embeddings-and-output-weights"}) {
      args.emplace_back(a);
    }
  }
  args.push_back("--tensor-model-parallel-size " + num(s.tp));
  args.push_back("--pipeline-model-parallel-size " + num(s.pp));
  if (s.sequence_parallel) args.push_back("--sequence-parallel");
  if (s.virtual_stages > 1) {
    args.push_back("--num-layers-per-virtual-pipeline-stage " +
                   num(m.layers / (static_cast<std::int64_t>(s.pp) * s.virtual_stages)));
  }
  args.push_back("--micro-batch-size " + num(s.micro_batch));
  args.push_back("--global-batch-size " + num(plan.job.global_batch));
  if (s.recompute == Recompute::kSelective) args.push_back("--recompute-granularity selective");
  if (s.recompute == Recompute::kFull) {
    args.push_back("--recompute-granularity full");
    // block: the first N layers of each model chunk recompute, the rest keep their activations;
    // uniform with one layer per group recomputes every layer.
    args.push_back(s.recompute_layers > 0 ? "--recompute-method block"
                                          : "--recompute-method uniform");
    args.push_back("--recompute-num-layers " + num(std::max(1, s.recompute_layers)));
  }
  if (s.zero == 1) args.push_back("--use-distributed-optimizer");
  if (s.dp > 1) args.push_back("--overlap-grad-reduce");
  if (s.dp > 1 && s.zero == 1) args.push_back("--overlap-param-gather");
  if (plan.job.precision == Precision::kBf16) args.push_back("--bf16");
  if (plan.job.precision == Precision::kFp16) args.push_back("--fp16");
  if (plan.job.precision == Precision::kFp8) {
    // TransformerEngine's delayed scaling: e4m3 forward, e5m2 gradients, bf16 everywhere else.
    args.push_back("--bf16");
    args.push_back("--transformer-impl transformer_engine");
    args.push_back("--fp8-format hybrid");
  }
  if (s.attention == costmodel::Attention::kFlash) args.push_back("--use-flash-attn");
  std::string out = header(plan, "Megatron-LM");
  out += "# data, tokenizer, optimizer and schedule arguments are yours to add\n";
  if (plan.job.precision == Precision::kTf32) {
    out += "# tf32: fp32 training with TF32 matrix products (PyTorch's allow_tf32)\n";
  }
  if (plan.stages != costmodel::even_partition(m, s.pp * s.virtual_stages) &&
      !uneven_pipeline_args(plan, &args)) {
    out += "# Loom's plan splits the layers unevenly; Megatron-LM splits them evenly\n";
  }
  const char* script =
      m.family == profiles::Family::kEncoder ? "pretrain_bert.py" : "pretrain_gpt.py";
  out += torchrun(plan) + " " + script;
  for (const std::string& a : args) out += " \\\n    " + a;
  return out + "\n";
}

std::string deepspeed(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  nlohmann::ordered_json zero = {{"stage", s.zero}};
  if (s.zero >= 1) {
    zero["contiguous_gradients"] = true;
    zero["overlap_comm"] = s.zero == 3;
    zero["reduce_scatter"] = true;
    zero["reduce_bucket_size"] = 500000000;
  }
  if (s.zero == 1 || s.zero == 2) zero["allgather_bucket_size"] = 500000000;
  if (s.zero == 3) {
    zero["stage3_prefetch_bucket_size"] = 50000000;
    zero["stage3_max_live_parameters"] = 1000000000;
    zero["stage3_param_persistence_threshold"] = 100000;
  }
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
  config["zero_optimization"] = zero;
  if (plan.job.compile) config["compile"] = {{"enabled", true}, {"backend", "inductor"}};
  std::string out = header(plan, "DeepSpeed");
  if (s.tp > 1) {
    out += "# tp=" + num(s.tp) +
           ": tensor parallelism is the model's (Megatron-DeepSpeed's "
           "--tensor-model-parallel-size " +
           num(s.tp) + ")\n";
  }
  if (s.pp > 1) {
    out += "# pp=" + num(s.pp) +
           ": wrap the model in deepspeed.pipe.PipelineModule(num_stages=" + num(s.pp) + ")\n";
  }
  if (s.recompute != Recompute::kNone) {
    out += std::string("# recompute=") + costmodel::to_string(s.recompute) + ": checkpoint " +
           (s.recompute_layers > 0
                ? "the first " + num(s.recompute_layers) + " transformer blocks of each stage"
                : std::string("every transformer block")) +
           " (deepspeed.checkpointing.checkpoint)\n";
  }
  if (nodes_of(plan) > 1) {
    out += "# " + num(nodes_of(plan)) + " nodes: name them in a hostfile (deepspeed --hostfile)\n";
  }
  out += "# optimizer: DeepSpeed's fused AdamW; its params (lr, betas, weight_decay) are yours\n";
  out += "cat > ds_config.json <<'JSON'\n" + config.dump(2) + "\nJSON\n";
  out += "deepspeed --num_nodes " + num(nodes_of(plan)) + " --num_gpus " +
         num(ranks_per_node(plan)) + " train.py --deepspeed --deepspeed_config ds_config.json\n";
  return out;
}

// PyTorch's name of a precision's storage dtype (tf32 stores fp32).
const char* torch_dtype(Precision p) {
  if (p == Precision::kBf16 || p == Precision::kFp8) return "torch.bfloat16";
  if (p == Precision::kFp16) return "torch.float16";
  return "torch.float32";
}

std::string fsdp(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  const char* sharding = s.zero == 3 ? "FULL_SHARD" : s.zero == 2 ? "SHARD_GRAD_OP" : "NO_SHARD";
  // Mixed precision for 16-bit jobs only.
  const std::string dtype =
      costmodel::element_bytes(plan.job.precision) == 2 ? torch_dtype(plan.job.precision) : "";
  std::string out = header(plan, "PyTorch FSDP");
  out += "# in train.py, one FSDP unit per transformer block:\n";
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
  if (plan.job.precision == Precision::kTf32) {
    out += "#   torch.backends.cuda.matmul.allow_tf32 = True\n";
  }
  if (plan.job.precision == Precision::kFp8) {
    out +=
        "#   the blocks' linear layers as transformer_engine.pytorch.Linear, their forward "
        "under te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(fp8_format=Format.HYBRID))"
        "\n";
  }
  if (s.recompute != Recompute::kNone && s.recompute_layers > 0) {
    out +=
        "#   apply_activation_checkpointing(model, check_fn=lambda m: m in "
        "set(<the block list>[:" +
        num(s.recompute_layers) + "]))\n";
  } else if (s.recompute != Recompute::kNone) {
    out +=
        "#   apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, <the block "
        "class>))\n";
  }
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
  out += "#   " + num(s.micro_batch) + " samples per GPU per micro-batch, " +
         num(s.num_micro_batches) + " micro-batches per step (gradient accumulation)\n";
  if (s.tp > 1 || s.pp > 1) {
    out += "#   a DeviceMesh of (dp=" + num(s.dp) + ", tp=" + num(s.tp) + ", pp=" + num(s.pp) +
           "): shard over dp, torch.distributed.tensor.parallel over tp" +
           (s.sequence_parallel ? " with SequenceParallel" : "") +
           ", torch.distributed.pipelining over pp\n";
  }
  out += torchrun(plan) + " train.py\n";
  return out;
}

}  // namespace

std::string emit_plan(const Plan& plan, costmodel::Runtime runtime) {
  costmodel::Job job = plan.job;
  job.runtime = runtime;
  if (auto why = costmodel::runtime_refusal(job, plan.strategy)) {
    throw InputError("--emit", "", *why);
  }
  const std::int64_t world = plan.strategy.world_size();
  const std::int64_t per_node = plan.cluster.devices_per_node;
  if (world > per_node && world % per_node != 0) {
    throw InputError("--emit", "",
                     "a plan whose " + num(world) + " ranks fill whole nodes of " + num(per_node) +
                         " devices (torchrun starts the same count on every node)");
  }
  switch (runtime) {
    case costmodel::Runtime::kMegatron:
      return megatron(plan);
    case costmodel::Runtime::kDeepspeed:
      return deepspeed(plan);
    case costmodel::Runtime::kFsdp:
      return fsdp(plan);
    case costmodel::Runtime::kLoom:
      break;
  }
  throw InputError("--emit", "",
                   "expected megatron, deepspeed or fsdp (a plan is Loom's own input)");
}

}  // namespace loom::planner
