// `loom plan --emit megatron|deepspeed|fsdp`: the runtime's configuration of the best plan, planned
// for that runtime, and the runtime's refusal as an input error.
#include <catch2/catch.hpp>
#include <string>

#include "tests/tools/cli_sandbox.hpp"

using Catch::Contains;
using loom::test::CliResult;

namespace {

class Sandbox : public loom::test::CliSandbox {
 public:
  Sandbox() : CliSandbox("test-emit") {}
};

// GPT-2 on one DGX A100 with every dimension pinned but the recomputation's search.
const std::string kPinned =
    "plan --model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 2 --pp 2 "
    "--dp 2 --micro-batch 2 --schedule 1f1b --recompute none";

}  // namespace

TEST_CASE("loom plan --emit megatron prints Megatron-LM's arguments", "[tools][cli][emit]") {
  Sandbox box;
  const CliResult r = box.loom(kPinned + " --zero 1 --emit megatron");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("\nCUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 1 "
                             "--nproc_per_node 8 pretrain_gpt.py \\\n"
                             "    --num-layers 12 \\\n"));
  CHECK_THAT(r.out, Contains("    --tensor-model-parallel-size 2 \\\n"
                             "    --pipeline-model-parallel-size 2 \\\n"));
  CHECK_THAT(r.out, Contains("    --micro-batch-size 2 \\\n"
                             "    --global-batch-size 64 \\\n"
                             "    --use-distributed-optimizer \\\n"
                             "    --overlap-grad-reduce \\\n"
                             "    --overlap-param-gather \\\n"
                             "    --bf16 \\\n"
                             "    --attention-backend flash\n"));
}

TEST_CASE("loom plan --emit deepspeed and fsdp print their configurations", "[tools][cli][emit]") {
  Sandbox box;
  const CliResult ds = box.loom(kPinned + " --zero 1 --emit deepspeed");
  INFO("stderr: " << ds.err);
  REQUIRE(ds.exit_code == 0);
  CHECK_THAT(ds.out, Contains("  \"train_micro_batch_size_per_gpu\": 2,\n"
                              "  \"gradient_accumulation_steps\": 16,\n"));
  CHECK_THAT(ds.out, Contains("deepspeed --num_nodes 1 --num_gpus 8 train.py --deepspeed "
                              "--deepspeed_config ds_config.json\n"));
  const CliResult fsdp = box.loom(
      "plan --model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 1 --pp 1 "
      "--dp 8 --micro-batch 8 --zero 3 --recompute full --emit fsdp");
  INFO("stderr: " << fsdp.err);
  REQUIRE(fsdp.exit_code == 0);
  CHECK_THAT(fsdp.out, Contains("#       sharding_strategy=ShardingStrategy.FULL_SHARD,\n"));
  CHECK_THAT(fsdp.out, Contains("\ntorchrun --nnodes 1 --nproc_per_node 8 train.py\n"));
}

TEST_CASE("loom plan --emit refuses what the runtime cannot run", "[tools][cli][emit]") {
  Sandbox box;
  // DeepSpeed's pipeline engine refuses ZeRO-2 with pp = 2: nothing is left to plan.
  const CliResult r = box.loom(kPinned + " --zero 2 --emit deepspeed");
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Contains("runtime deepspeed: DeepSpeed's pipeline engine refuses ZeRO-2 and "
                             "ZeRO-3"));
  const CliResult both = box.loom(kPinned + " --zero 1 --emit fsdp --json");
  CHECK(both.exit_code == 2);
  CHECK_THAT(both.err, Contains("--emit and --json both print: give one of them"));
}

TEST_CASE("loom plan --recompute-layers recomputes the first layers of each chunk",
          "[tools][cli][emit]") {
  Sandbox box;
  const std::string base =
      "plan --model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 2 --pp 2 "
      "--dp 2 --micro-batch 2 --schedule 1f1b --zero 1";
  const CliResult r = box.loom(base + " --recompute-layers 3 --emit megatron");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("    --recompute-granularity full \\\n"
                             "    --recompute-method block \\\n"
                             "    --recompute-num-layers 3 \\\n"));
  const CliResult table = box.loom(base + " --recompute-layers 3");
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Contains(" full(3) "));
  const CliResult selective = box.loom(base + " --recompute selective --recompute-layers 3");
  CHECK(selective.exit_code == 2);
  CHECK_THAT(selective.err, Contains("--recompute-layers") && Contains("--recompute full"));
  const CliResult too_many = box.loom(base + " --recompute-layers 13");
  CHECK(too_many.exit_code == 2);
  CHECK_THAT(too_many.err, Contains("at most the 12 transformer layers of gpt2"));
}

TEST_CASE("loom plan --emit megatron writes the plan's stages as Megatron-LM's layout",
          "[tools][cli][emit]") {
  Sandbox box;
  const CliResult r = box.loom(
      "plan --model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --tp 1 --pp 2 "
      "--dp 4 --micro-batch 2 --schedule 1f1b --recompute none --zero 0 --stages 0-7,8-13 "
      "--emit megatron");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("    --pipeline-model-parallel-size 2 \\\n"
                             "    --pipeline-model-parallel-layout \"Et*7|t*5L\" \\\n"));
  CHECK_THAT(r.out, Contains("# Loom's stages (7/5 transformer layers) as the layout"));
}

TEST_CASE("loom plan --emit on two nodes meets at a rendezvous", "[tools][cli][emit]") {
  Sandbox box;
  const std::string base =
      "plan --model gpt2-xl --cluster dgx-a100-80g --nodes 2 --global-batch 128 --seq-len 1024 "
      "--tp 1 --pp 1 --dp 16 --micro-batch 4 --zero 3 --recompute none";
  const CliResult fsdp = box.loom(base + " --emit fsdp");
  INFO("stderr: " << fsdp.err);
  REQUIRE(fsdp.exit_code == 0);
  CHECK_THAT(fsdp.out, Contains("\ntorchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d "
                                "--rdzv_endpoint \"$MASTER_ADDR:$MASTER_PORT\" --rdzv_id "
                                "\"$JOB_ID\" train.py\n"));
  const CliResult ds = box.loom(base + " --emit deepspeed");
  REQUIRE(ds.exit_code == 0);
  CHECK_THAT(ds.out, Contains("\ndeepspeed --hostfile hostfile --master_addr \"$MASTER_ADDR\" "
                              "--master_port 29500 --num_nodes 2 --num_gpus 8 train.py"));
}
