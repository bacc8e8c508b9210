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
  plan.job.tp_comm_overlap = true;
  // A plan predicted without the overlap is emitted without it.
  plan.job.tp_comm_overlap = false;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             Contains("    --sequence-parallel \\\n    --micro-batch-size 2"));
  plan.job.tp_comm_overlap = true;
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  // 16 ranks on nodes of 8: two nodes of 8, meeting at a c10d rendezvous; tp 2 needs
  // CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args).
  CHECK(from(text, "CUDA_DEVICE_MAX_CONNECTIONS=1") ==
        "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d "
        "--rdzv_endpoint \"$MASTER_ADDR:$MASTER_PORT\" --rdzv_id \"$JOB_ID\" pretrain_gpt.py \\\n"
        "    --num-layers 12 \\\n"
        "    --hidden-size 768 \\\n"
        "    --num-attention-heads 12 \\\n"
        "    --ffn-hidden-size 3072 \\\n"
        "    --seq-length 1024 \\\n"
        "    --max-position-embeddings 1024 \\\n"
        "    --attention-dropout 0.0 \\\n"
        "    --hidden-dropout 0.0 \\\n"
        "    --tensor-model-parallel-size 2 \\\n"
        "    --pipeline-model-parallel-size 2 \\\n"
        "    --sequence-parallel \\\n"
        "    --tp-comm-overlap \\\n"
        "    --micro-batch-size 2 \\\n"
        "    --global-batch-size 64 \\\n"
        "    --recompute-granularity selective \\\n"
        "    --use-distributed-optimizer \\\n"
        "    --overlap-grad-reduce \\\n"
        "    --overlap-param-gather \\\n"
        "    --bf16 \\\n"
        "    --attention-backend flash\n");
  CHECK_THAT(text, Contains("# 2 nodes: run the same line on every node with MASTER_ADDR"));
  CHECK_THAT(text, !Contains("--pipeline-model-parallel-layout"));
  CHECK_THAT(text, !Contains("--use-flash-attn"));
}

TEST_CASE("Emit megatron: no CUDA_DEVICE_MAX_CONNECTIONS nor tp overlap without tp", "[emit]") {
  planner::Plan plan = gpt2_dp16_plan(costmodel::Recompute::kNone);
  plan.strategy.zero = 0;
  plan.cluster = profiles::load_cluster("dgx-a100-80g");
  plan.strategy.dp = 8;
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("\ntorchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py \\\n"));
  CHECK_THAT(text, !Contains("CUDA_DEVICE_MAX_CONNECTIONS"));
  CHECK_THAT(text, !Contains("--tp-comm-overlap"));
  CHECK_THAT(text, !Contains("rdzv"));
}

TEST_CASE("Emit megatron: a bf16 gradient buffer, and dp counts cp's ranks", "[emit]") {
  planner::Plan plan = gpt2_plan(1, costmodel::Recompute::kNone);
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             !Contains("--grad-reduce-in-bf16"));
  plan.job.reduce_precision = profiles::Precision::kBf16;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             Contains("--grad-reduce-in-bf16"));
  // dp 1 beside cp 2: the gradients are still reduced (and the optimizer sharded) over 2 ranks.
  plan.strategy.dp = 1;
  plan.strategy.cp = 2;
  plan.strategy.num_micro_batches = 32;
  plan.strategy.attention = costmodel::Attention::kFlash;
  plan.cluster = profiles::load_cluster("dgx-a100-80g");
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("--context-parallel-size 2"));
  CHECK_THAT(text, Contains("--overlap-grad-reduce") && Contains("--overlap-param-gather"));
}

TEST_CASE("Emit megatron: interleaving and full recomputation", "[emit]") {
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kFull);
  plan.strategy.schedule = costmodel::Schedule::kInterleaved;
  plan.strategy.virtual_stages = 3;
  plan.stages = costmodel::even_partition(plan.model, 6);
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  // 12 layers over pp * v = 6 chunks: 2 layers per virtual stage, Megatron-LM's even split.
  CHECK_THAT(text, Contains("    --num-layers-per-virtual-pipeline-stage 2 \\\n"));
  CHECK_THAT(text, !Contains("--pipeline-model-parallel-layout"));
  CHECK_THAT(text, Contains("    --recompute-granularity full \\\n"
                            "    --recompute-method uniform \\\n"
                            "    --recompute-num-layers 1 \\\n"
                            "    --overlap-grad-reduce \\\n"
                            "    --bf16 \\\n"));
  CHECK_THAT(text, !Contains("--use-distributed-optimizer"));
}

TEST_CASE("Emit megatron: virtual stages that do not divide the layers as a layout", "[emit]") {
  // 12 layers, pp 2, v 5: 10 chunks of 2, 2, 1, ... layers; no layers per virtual stage fits.
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kNone);
  plan.strategy.schedule = costmodel::Schedule::kInterleaved;
  plan.strategy.virtual_stages = 5;
  plan.stages = costmodel::even_partition(plan.model, 10);
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("    --pipeline-model-parallel-size 2 \\\n"
                            "    --pipeline-model-parallel-layout "
                            "\"Et*2|t*2|t|t|t|t|t|t|t|tL\" \\\n"));
  CHECK_THAT(text, !Contains("--num-layers-per-virtual-pipeline-stage"));
  CHECK_THAT(text, Contains("# Loom's stages (2/2/1/1/1/1/1/1/1/1 transformer layers)"));
}

TEST_CASE("Emit megatron: an uneven pipeline split as a layout", "[emit]") {
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kNone);
  // The embedding and layers 1-7 on stage 0; layers 8-12 and the head on stage 1.
  plan.stages = {{0, 7}, {8, 13}};
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("    --pipeline-model-parallel-size 2 \\\n"
                            "    --pipeline-model-parallel-layout \"Et*7|t*5L\" \\\n"
                            "    --sequence-parallel \\\n"));
  CHECK_THAT(text, !Contains("--decoder-first-pipeline-num-layers"));
  // Four stages whose middle ones differ, the embedding alone on the first.
  plan.strategy.pp = 4;
  plan.strategy.dp = 2;
  plan.stages = {{0, 0}, {1, 6}, {7, 10}, {11, 13}};
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kMegatron),
             Contains("    --pipeline-model-parallel-layout \"E|t*6|t*4|t*2L\" \\\n"));
}

TEST_CASE("Emit megatron: layers that pp does not divide are a layout", "[emit]") {
  // 12 layers over 5 stages: Loom's even partition gives 3/3/2/2/2, which Megatron-LM's own
  // split refuses (layers divisible by pp).
  planner::Plan plan = gpt2_plan(0, costmodel::Recompute::kNone);
  plan.strategy.pp = 5;
  plan.strategy.tp = 1;
  plan.strategy.dp = 1;
  plan.strategy.sequence_parallel = false;
  plan.stages = costmodel::even_partition(plan.model, 5);
  const std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("    --pipeline-model-parallel-layout \"Et*3|t*3|t*2|t*2|t*2L\" "
                            "\\\n"));
}

TEST_CASE("Emit megatron: precisions, attention and an encoder", "[emit]") {
  planner::Plan plan = gpt2_dp16_plan(costmodel::Recompute::kNone);
  plan.strategy.zero = 0;
  plan.strategy.attention = costmodel::Attention::kMath;
  plan.job.precision = profiles::Precision::kTf32;
  std::string text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains("\nTORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 torchrun --nnodes 2"));
  CHECK_THAT(text, Contains("    --attention-backend unfused\n"));
  plan.model = profiles::load_model("bert-large");
  plan.model.num_labels = 3;
  plan.stages = costmodel::even_partition(plan.model, 1);
  plan.job.precision = profiles::Precision::kBf16;
  text = planner::emit_plan(plan, costmodel::Runtime::kMegatron);
  CHECK_THAT(text, Contains(" examples/bert/pretrain_bert.py \\\n"));
  CHECK_THAT(text, Contains("    --bert-no-binary-head \\\n"));
  CHECK_THAT(text, Contains("Loom planned a sequence classifier (3 labels)"));
  // Loom's encoders train with dropout: Megatron-LM's 0.1 stays.
  CHECK_THAT(text, !Contains("dropout"));
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

TEST_CASE("Emit: selective recomputation checkpoints the attention core only", "[emit]") {
  const planner::Plan plan = gpt2_dp16_plan(costmodel::Recompute::kSelective);
  const std::string ds = planner::emit_plan(plan, costmodel::Runtime::kDeepspeed);
  CHECK_THAT(ds, Contains("# recompute=selective: checkpoint only each block's attention core "
                          "(the softmax and its two products, softmax(QK^T)V) with "
                          "deepspeed.checkpointing.checkpoint;"));
  CHECK_THAT(ds, !Contains("every transformer block"));
  const std::string fsdp = planner::emit_plan(plan, costmodel::Runtime::kFsdp);
  CHECK_THAT(fsdp, Contains("torch.utils.checkpoint.checkpoint(<the attention core>, q, k, v, "
                            "use_reentrant=False)"));
  CHECK_THAT(fsdp, !Contains("apply_activation_checkpointing"));
}

TEST_CASE("Emit deepspeed: the configuration and the launch line", "[emit]") {
  planner::Plan plan = gpt2_plan(1, costmodel::Recompute::kNone);
  plan.strategy.attention = costmodel::Attention::kFlash;
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
        "# 2 nodes: the hostfile names them (replace node0.. with your hosts, which this one "
        "reaches by ssh); run this on one of them with MASTER_ADDR its address\n"
        "cat > hostfile <<'HOSTS'\n"
        "node0 slots=8\n"
        "node1 slots=8\n"
        "HOSTS\n"
        "deepspeed --hostfile hostfile --master_addr \"$MASTER_ADDR\" --master_port 29500 "
        "--num_nodes 2 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json\n");
  // tp 2 x pp 2: PipelineModule(num_stages=2) alone would make dp = 16 / 2 = 8, not 4.
  CHECK_THAT(text,
             Contains("# pp=2 with tp=2: wrap the model in deepspeed.pipe.PipelineModule(..., "
                      "topology=deepspeed.runtime.pipe.topology."
                      "PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=4))\n"));
  CHECK_THAT(text, !Contains("num_stages"));
  plan.strategy.tp = 1;
  plan.strategy.dp = 8;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
             Contains("# pp=2: wrap the model in deepspeed.pipe.PipelineModule(num_stages=2)\n"));
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
        "#   every micro-batch reduce-scatters its gradients, as the plan times it: no no_sync() "
        "(FSDP2: set_requires_gradient_sync(False)), which would keep whole gradients between "
        "micro-batches\n"
        "# 2 nodes: run the same line on every node with MASTER_ADDR (the address of one node that "
        "all reach), MASTER_PORT (a free port there) and JOB_ID (one id for the job) set; "
        "torchrun's c10d rendezvous numbers the nodes\n"
        "torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "
        "\"$MASTER_ADDR:$MASTER_PORT\" --rdzv_id \"$JOB_ID\" train.py\n");
  planner::Plan no_shard = plan;
  no_shard.strategy.zero = 0;
  CHECK_THAT(planner::emit_plan(no_shard, costmodel::Runtime::kFsdp),
             Contains("#   micro-batches 1 to 1 under `with model.no_sync():` (FSDP2: "
                      "model.set_requires_gradient_sync(False), True for the last): gradients "
                      "all-reduce once per step\n"));
  planner::Plan tf32 = plan;
  tf32.job.precision = profiles::Precision::kTf32;
  CHECK_THAT(planner::emit_plan(tf32, costmodel::Runtime::kFsdp),
             Contains("#   torch.backends.cuda.matmul.allow_tf32 = True\n"
                      "#   torch.backends.cudnn.allow_tf32 = True\n"));
  CHECK_THAT(planner::emit_plan(tf32, costmodel::Runtime::kDeepspeed),
             Contains("#   torch.backends.cuda.matmul.allow_tf32 = True\n"
                      "#   torch.backends.cudnn.allow_tf32 = True\n"));
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
  // DeepSpeed's "compile" section configures DeepCompile and refuses other keys: the engine
  // compiles on request instead.
  const std::string ds = planner::emit_plan(plan, costmodel::Runtime::kDeepspeed);
  CHECK_THAT(ds, !Contains("\"compile\""));
  CHECK_THAT(ds, Contains("# compile: after deepspeed.initialize, "
                          "engine.compile(backend=\"inductor\")"));
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
                      "    --fp8-format hybrid \\\n"
                      "    --fp8-recipe delayed \\\n"
                      "    --fp8-amax-history-len 1024 \\\n"
                      "    --fp8-amax-compute-algo max \\\n"));
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

// The configuration says what the plan times (costmodel/runtime_zero.hpp): overlap_comm at
// stage 3 only, DeepSpeed's default, with which its published ZeRO-2 runs were measured.
TEST_CASE("Emit deepspeed: overlap_comm where the plan times it, at ZeRO-3 only", "[emit]") {
  planner::Plan plan = gpt2_dp16_plan(costmodel::Recompute::kNone);
  plan.strategy.zero = 2;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
             Contains("    \"stage\": 2,\n"
                      "    \"contiguous_gradients\": true,\n"
                      "    \"overlap_comm\": false,\n"));
  plan.strategy.zero = 3;
  CHECK_THAT(planner::emit_plan(plan, costmodel::Runtime::kDeepspeed),
             Contains("    \"overlap_comm\": true,\n"));
}
