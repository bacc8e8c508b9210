// End-to-end: a tp = 2 plan with sequence parallelism trains as two processes (`loom launch`,
// Gloo over loopback) to the losses of the same plan without it, dropout included (each rank's
// shard applies its slice of the whole-sequence mask, which the plain tp ranks apply whole); and
// `loom train` refuses, in one line, a flash-attention plan on a LibTorch without the fused kernel.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

using Catch::Contains;
using loom::test::CliResult;
using Folder = loom::test::CliSandbox;

namespace {

// Ranks come from `loom launch` only, never from the environment the tests run in.
const std::string kNoRankVariables =
    "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID";

CliResult run(const Folder& f, const std::string& args) { return f.loom(args, kNoRankVariables); }

// PLAN.json with strategy.KEY set to `value`, written as `name`.
void variant(const Folder& f, const std::string& name, const std::string& key,
             const nlohmann::json& value) {
  nlohmann::json plan = nlohmann::json::parse(f.read("PLAN.json"));
  plan.at("strategy")[key] = value;
  f.write(name, plan.dump(2));
}

const std::string kPlanTp2 =
    "plan --model tiny-bert --cluster local-cpu --global-batch 4 --seq-len 32 --dp 1 --tp 2 "
    "--pp 1 --zero 0 --micro-batch 2 --precision fp32 -o PLAN.json";

// The losses rank 0 reports for `plan` trained by two processes.
std::vector<double> launched_losses(const Folder& f, const std::string& plan) {
  const CliResult r =
      run(f, "launch --nproc 2 --master-port " + loom::test::free_port() + " -- loom train " +
                 plan + " --data synthetic:40 --steps 3 --dropout 0.1 --comm-timeout 60 --json");
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  std::string json;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[rank 0] ", 0) == 0) json += line.substr(9) + "\n";
  }
  return nlohmann::json::parse(json).at("losses").get<std::vector<double>>();
}

}  // namespace

TEST_CASE("loom launch trains a tp2 + sp plan to the tp2 plan's losses, dropout on",
          "[tools][launch][sp]") {
  const Folder f("test-sp");
  REQUIRE(run(f, kPlanTp2).exit_code == 0);
  variant(f, "PLAN-SP.json", "sequence_parallel", true);
  const std::vector<double> plain = launched_losses(f, "PLAN.json");
  const std::vector<double> sp = launched_losses(f, "PLAN-SP.json");
  REQUIRE(plain.size() == 3);
  REQUIRE(sp.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("step " << i + 1 << ": " << sp[i] << " vs " << plain[i]);
    CHECK(std::abs(sp[i] - plain[i]) <= 1e-5 * std::abs(plain[i]));
  }
}

TEST_CASE("loom train refuses sp with tp 1 and, on LibTorch 1.13, flash attention",
          "[tools][train][sp]") {
  const Folder f("test-sp");
  REQUIRE(run(f,
              "plan --model tiny-bert --cluster local-cpu --global-batch 4 --seq-len 32 --dp "
              "1 --tp 1 --pp 1 --zero 0 --micro-batch 2 --precision fp32 -o PLAN.json")
              .exit_code == 0);
  variant(f, "PLAN-SP.json", "sequence_parallel", true);
  const CliResult sp = run(f, "train PLAN-SP.json --data synthetic:40 --steps 1");
  CHECK(sp.exit_code == 2);
  CHECK_THAT(sp.err,
             Contains("$.strategy") && Contains("sequence parallelism") && Contains("tp > 1"));

  variant(f, "PLAN-FLASH.json", "attention", "flash");
  const CliResult flash = run(f, "train PLAN-FLASH.json --data synthetic:40 --steps 1");
  if (flash.exit_code == 0) return;  // a LibTorch 2 build runs it
  CHECK(flash.exit_code == 2);
  CHECK_THAT(flash.err, Contains("$.strategy.attention") && Contains("--attention math"));
  CHECK(std::count(flash.err.begin(), flash.err.end(), '\n') == 1);  // one line
}

TEST_CASE("loom train refuses a context-parallel plan in one line", "[tools][train][cp]") {
  const Folder f("test-cp");
  REQUIRE(run(f,
              "plan --model tiny-bert --cluster local-cpu --global-batch 4 --seq-len 32 --runtime "
              "megatron --cp 2 --attention flash --precision fp32 -o PLAN.json")
              .exit_code == 0);
  const CliResult r = run(f, "train PLAN.json --data synthetic:40 --steps 1");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("$.strategy.cp") && Contains("--cp 1") && Contains("found cp 2"));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("loom plan --cp names the runtimes that run it", "[tools][cli][cp]") {
  const Folder f("test-cp-plan");
  const CliResult r =
      run(f, "plan --model gpt2 --cluster dgx-a100-80g --global-batch 8 --seq-len 1024 --cp 2");
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "loom plan: error: --cp: context parallelism is Megatron-Core's: --cp 2 needs --runtime "
        "megatron or nemo (runtime loom plans cp 1)\n");
  const CliResult megatron = run(f,
                                 "plan --model gpt2 --cluster dgx-a100-80g --gpus 8 "
                                 "--global-batch 8 --seq-len 1024 --cp 2 --runtime megatron");
  CHECK(megatron.exit_code == 0);
  CHECK_THAT(megatron.out, Contains(" cp=2"));
}
