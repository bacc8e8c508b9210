// `loom plan --emit`: what realises a plan in Megatron-LM, DeepSpeed and PyTorch FSDP (emit.hpp),
// argument by argument.
#include <catch2/catch.hpp>
#include <string>

#include "planner/emit.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using Catch::Contains;

namespace {

// GPT-2 (12 layers, hidden 768) on 2 DGX A100 nodes: dp 4 x tp 2 x pp 2, global batch 64.
planner::Plan gpt2_plan(int zero, costmodel::Recompute recompute) {
  planner::Plan plan;
  plan.model = profiles::load_model("gpt2");
  plan.cluster = profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 2, "test");
  plan.job = {64, 1024, profiles::Precision::kBf16, "adamw"};
  plan.strategy.dp = 4;
  plan.strategy.tp = 2;
  plan.strategy.pp = 2;
  plan.strategy.zero = zero;
  plan.strategy.micro_batch = 2;
  plan.strategy.num_micro_batches = 8;
  plan.strategy.recompute = recompute;
  plan.strategy.sequence_parallel = true;
  plan.stages = costmodel::even_partition(plan.model, 2);
  return plan;
}

// The same model on one node's worth of ranks, data parallel only: dp 16, two micro-batches.
planner::Plan gpt2_dp16_plan(costmodel::Recompute recompute) {
  planner::Plan plan = gpt2_plan(3, recompute);
  plan.strategy.tp = 1;
  plan.strategy.pp = 1;
  plan.strategy.dp = 16;
  plan.strategy.num_micro_batches = 2;
  plan.strategy.sequence_parallel = false;
  plan.stages = costmodel::even_partition(plan.model, 1);
  return plan;
}

// The text from the first line that starts with `start` to the end.
std::string from(const std::string& text, const std::string& start) {
  const auto at = text.find("\n" + start);
  return at == std::string::npos ? "" : text.substr(at + 1);
}

}  // namespace

TEST_CASE("Emit megatron: Megatron-LM's arguments for the plan", "[emit]") {
  planner::Plan plan = gpt2_plan(1, costmodel::Recompute::kSelective);
  plan.strategy.attention = costmodel::Attention::kFlash;
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  // 16 ranks on nodes of 8: two nodes of 8.
  CHECK(from(text, "torchrun") ==
        "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \\\n"
        "    --num-layers 12 \\\n"
        "    --hidden-size 768 \\\n"
        "    --num-attention-heads 12 \\\n"
        "    --ffn-hidden-size 3072 \\\n"
        "    --seq-length 1024 \\\n"
        "    --max-position-embeddings 1024 \\\n"
        "    --tensor-model-parallel-size 2 \\\n"
        "    --pipeline-model-parallel-size 2 \\\n"
        "    --sequence-parallel \\\n"
        "    --micro-batch-size 2 \\\n"
        "    --global-batch-size 64 \\\n"
        "    --recompute-granularity selective \\\n"
        "    --use-distributed-optimizer \\\n"
        "    --overlap-grad-reduce \\\n"
        "    --overlap-param-gather \\\n"
        "    --bf16 \\\n"
        "    --use-flash-attn\n");
  CHECK_THAT(text, !Contains("unevenly"));
}

TEST_CASE("Emit megatron: interleaving and full recomputation", "[emit]") {
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kFull);
  plan.strategy.schedule = costmodel::Schedule::kInterleaved;
  plan.strategy.virtual_stages = 3;
  plan.stages = costmodel::even_partition(plan.model, 6);
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  // 12 layers over pp * v = 6 chunks: 2 layers per virtual stage.
  CHECK_THAT(text, Contains("    --num-layers-per-virtual-pipeline-stage 2 \\\n"));
  CHECK_THAT(text, Contains("    --recompute-granularity full \\\n"
                            "    --recompute-method uniform \\\n"
                            "    --recompute-num-layers 1 \\\n"
                            "    --overlap-grad-reduce \\\n"
                            "    --bf16\n"));
  CHECK_THAT(text, !Contains("--use-distributed-optimizer"));
}

TEST_CASE("Emit: the first N layers of each chunk recompute", "[emit]") {
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kFull);
  plan.strategy.recompute_layers = 4;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             Contains("    --recompute-granularity full \\\n"
                      "    --recompute-method block \\\n"
                      "    --recompute-num-layers 4 \\\n"));
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
             Contains("# recompute=full: checkpoint the first 4 transformer blocks of each stage"));
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kFsdp),
             Contains("check_fn=lambda m: m in set(<the block list>[:4])"));
}

TEST_CASE("Emit megatron: an uneven pipeline split as first and last stage layers", "[emit]") {
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kNone);
  // The embedding and layers 1-7 on stage 0; layers 8-12 and the head on stage 1.
  plan.stages = {{0, 7}, {8, 13}};
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("    --pipeline-model-parallel-size 2 \\\n"
                            "    --decoder-first-pipeline-num-layers 7 \\\n"
                            "    --decoder-last-pipeline-num-layers 5 \\\n"
                            "    --sequence-parallel \\\n"));
  CHECK_THAT(text, !Contains("unevenly"));
  // Four stages whose middle ones differ have no such form: a comment says so.
  plan.strategy.pp = 4;
  plan.strategy.dp = 2;
  plan.stages = {{0, 3}, {4, 6}, {7, 10}, {11, 13}};
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             Contains("# Loom's plan splits the layers unevenly; Megatron-LM splits them evenly"));
}

TEST_CASE("Emit deepspeed: the configuration and the launch line", "[emit]") {
  planner::Plan plan = gpt2_plan(1, costmodel::Recompute::kNone);
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kDeepspeed);
  CHECK(from(text, "cat > ds_config.json") ==
        "cat > ds_config.json <<'JSON'\n"
        "{\n"
        "  \"train_batch_size\": 64,\n"
        "  \"train_micro_batch_size_per_gpu\": 2,\n"
        "  \"gradient_accumulation_steps\": 8,\n"
        "  \"bf16\": {\n"
        "    \"enabled\": true\n"
        "  },\n"
        "  \"optimizer\": {\n"
        "    \"type\": \"AdamW\"\n"
        "  },\n"
        "  \"zero_optimization\": {\n"
        "    \"stage\": 1,\n"
        "    \"contiguous_gradients\": true,\n"
        "    \"overlap_comm\": false,\n"
        "    \"reduce_scatter\": true,\n"
        "    \"reduce_bucket_size\": 500000000,\n"
        "    \"allgather_bucket_size\": 500000000\n"
        "  }\n"
        "}\n"
        "JSON\n"
        "deepspeed --num_nodes 2 --num_gpus 8 train.py --deepspeed --deepspeed_config "
        "ds_config.json\n");
  CHECK_THAT(text,
             Contains("# pp=2: wrap the model in deepspeed.pipe.PipelineModule(num_stages=2)"));
  CHECK_THAT(text, Contains("# optimizer: DeepSpeed's fused AdamW; its params (lr, betas, "
                            "weight_decay) are yours\ncat > ds_config.json"));
}

TEST_CASE("Emit fsdp: the sharding strategy and mixed precision", "[emit]") {
  const planner::Plan plan = gpt2_dp16_plan(costmodel::Recompute::kFull);
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kFsdp);
  CHECK(from(text, "#   model = FSDP") ==
        "#   model = FSDP(model,\n"
        "#       sharding_strategy=ShardingStrategy.FULL_SHARD,\n"
        "#       auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, "
        "transformer_layer_cls={<the block class>}),\n"
        "#       mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16),\n"
        "#       backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n"
        "#       forward_prefetch=True,\n"
        "#       limit_all_gathers=True,\n"
        "#       use_orig_params=True)\n"
        "#   apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, <the block "
        "class>))\n"
        "#   optimizer = torch.optim.AdamW(model.parameters(), ..., fused=True)\n"
        "#   2 samples per GPU per micro-batch, 2 micro-batches per step (gradient accumulation)\n"
        "torchrun --nnodes 2 --nproc-per-node 8 train.py\n");
  planner::Plan bf16_reduce = plan;
  bf16_reduce.job.reduce_precision = costmodel::Precision::kBf16;
  CHECK_THAT(planner::emit_plan(bf16_reduce, costmodel::Runtime::kFsdp),
             Catch::Matchers::Contains("MixedPrecision(param_dtype=torch.bfloat16, "
                                       "reduce_dtype=torch.bfloat16, buffer_dtype"));
  planner::Plan per_tensor = plan;
  per_tensor.job.optimizer_kernels = costmodel::OptimizerKernels::kPerTensor;
  CHECK_THAT(
      planner::emit_plan(per_tensor, costmodel::Runtime::kFsdp),
      Catch::Matchers::Contains("torch.optim.AdamW(model.parameters(), ..., foreach=False)"));
}

TEST_CASE("Emit refuses a strategy the runtime cannot run", "[emit]") {
  // DeepSpeed's pipeline engine refuses ZeRO-2 with pp = 2.
  const planner::Plan plan = gpt2_plan(2, costmodel::Recompute::kNone);
  CHECK_THROWS_WITH(planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
                    Contains("DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3"));
  CHECK_THROWS_AS(planner::emit_plan(plan, costmodel::Runtime::kMegatron), loom::InputError);
  CHECK_NOTHROW(planner::emit_plan(plan, costmodel::Runtime::kFsdp));
}

TEST_CASE("Emit compiles the blocks of a torch.compile plan, and Megatron refuses it", "[emit]") {
  planner::Plan plan = gpt2_dp16_plan(costmodel::Recompute::kNone);
  plan.job.compile = true;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kFsdp),
             Contains("#   each transformer block compiled before wrapping: block.compile() "
                      "(torch.compile)\n"));
  CHECK_THAT(
      planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
      Contains("  \"compile\": {\n    \"enabled\": true,\n    \"backend\": \"inductor\"\n  }"));
  CHECK_THROWS_WITH(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
                    Contains("torch.compile is not available"));
}

TEST_CASE("Emit an fp8 plan: TransformerEngine's hybrid format, bf16 elsewhere", "[emit][fp8]") {
  planner::Plan plan = gpt2_plan(1, costmodel::Recompute::kNone);
  plan.cluster = profiles::with_nodes(profiles::load_cluster("dgx-h100"), 2, "test");
  plan.job.precision = profiles::Precision::kFp8;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             Contains("    --bf16 \\\n"
                      "    --transformer-impl transformer_engine \\\n"
                      "    --fp8-format hybrid"));
  const std::string fsdp =
      planner::emit_plan(gpt2_dp16_plan(costmodel::Recompute::kNone), costmodel::Runtime::kFsdp);
  plan = gpt2_dp16_plan(costmodel::Recompute::kNone);
  plan.job.precision = profiles::Precision::kFp8;
  const std::string fp8 = planner::emit_plan(plan, costmodel::Runtime::kFsdp);
  CHECK_THAT(fp8, Contains("MixedPrecision(param_dtype=torch.bfloat16"));
  CHECK_THAT(fp8, Contains("transformer_engine.pytorch.Linear"));
  CHECK_THAT(fsdp, !Contains("transformer_engine"));
  CHECK_THROWS_WITH(planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
                    Contains("DeepSpeed's engine has no fp8 training of its own"));
}
