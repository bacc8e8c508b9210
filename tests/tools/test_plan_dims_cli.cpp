// The plan dimensions `loom plan` takes beyond dp, tp, pp and ZeRO: sequence parallelism (--sp),
// the attention kernels (--attention), the runtime (--runtime) and tf32 (docs/README.md).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

using Catch::Contains;
using loom::test::CliResult;

namespace {

class Sandbox : public loom::test::CliSandbox {
 public:
  Sandbox() : CliSandbox("test-plan-dims") {}
};

// The line of `text` that starts with `prefix` ("" when none does).
std::string line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

void require_error(const CliResult& r, const std::string& line) {
  INFO("stdout: " << r.out);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == line + "\n");
}

const std::string kGpt2 =
    "plan --model gpt2 --cluster dgx-a100-80g --gpus 8 --global-batch 16 --seq-len 1024 ";

}  // namespace

TEST_CASE("loom plan --sp on needs tensor parallelism", "[tools][cli]") {
  Sandbox box;
  require_error(box.loom(kGpt2 + "--tp 1 --sp on"),
                "loom plan: error: --sp: sequence parallelism shards the sequence over the "
                "tensor-parallel group: --sp on needs tp > 1, but --tp is 1");
  require_error(box.loom("plan --model gpt2 --cluster dgx-a100-80g --gpus 8 --global-batch 16 "
                         "--seq-len 1022 --tp 4 --sp on"),
                "loom plan: error: --sp: sequence parallelism needs tp=4 to divide --seq-len 1022");
  require_error(box.loom(kGpt2 + "--sp maybe"),
                "loom plan: error: --sp: maybe not in {on,off} (see loom plan --help)");
}

TEST_CASE("loom plan --sp, --attention and --runtime reach the plan and its JSON", "[tools][cli]") {
  Sandbox box;
  const CliResult r = box.loom(kGpt2 +
                               "--tp 2 --pp 1 --zero 1 --micro-batch 2 --recompute none --sp on "
                               "--attention math --runtime megatron -o plan.json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(line_starting(r.out, "strategy ") ==
        "strategy dp=4 tp=2 pp=1 zero=1 micro-batch=2 micro-batches=2 recompute=none "
        "sequence-parallel attention=math");
  // Megatron-LM overlaps the tp exchanges with the products by default (--tp-comm-overlap).
  CHECK(line_starting(r.out, "runtime ") ==
        "runtime  megatron (Megatron-LM's memory and overlap rules), tp communication "
        "overlapped");
  const nlohmann::json plan = nlohmann::json::parse(loom::test::read_all(box.work() / "plan.json"));
  CHECK(plan.at("job").at("tp_comm_overlap") == true);
  CHECK(plan.at("strategy").at("sequence_parallel") == true);
  CHECK(plan.at("strategy").at("attention") == "math");
  CHECK(plan.at("job").at("runtime") == "megatron");
  // simulate reads them back, and --runtime predicts for another runtime.
  const CliResult sim = box.loom("simulate plan.json --runtime deepspeed");
  INFO("stderr: " << sim.err);
  REQUIRE(sim.exit_code == 0);
  CHECK(line_starting(sim.out, "strategy ") ==
        "strategy dp=4 tp=2 pp=1 zero=1 micro-batch=2 micro-batches=2 recompute=none "
        "sequence-parallel attention=math");
  CHECK(line_starting(sim.out, "runtime ") ==
        "runtime  deepspeed (DeepSpeed's memory and overlap rules)");
}

TEST_CASE("GPU plans default to flash attention, CPU plans to math", "[tools][cli]") {
  Sandbox box;
  const CliResult gpu = box.loom(kGpt2 + "--tp 1 --pp 1 --zero 0 --micro-batch 2 --json");
  INFO("stderr: " << gpu.err);
  REQUIRE(gpu.exit_code == 0);
  const nlohmann::json g = nlohmann::json::parse(gpu.out);
  CHECK(g.at("plans").at(0).at("strategy").at("attention") == "flash");
  CHECK(g.at("plans").at(0).at("job").at("runtime") == "loom");
  const CliResult cpu = box.loom(
      "plan --model tiny-bert --cluster local-cpu --gpus 2 --global-batch 16 --seq-len 64 --json");
  INFO("stderr: " << cpu.err);
  REQUIRE(cpu.exit_code == 0);
  const nlohmann::json c = nlohmann::json::parse(cpu.out);
  CHECK(c.at("plans").at(0).at("strategy").at("attention") == "math");
}

TEST_CASE("loom plan --precision tf32 on a device with a tf32 rate", "[tools][cli]") {
  Sandbox box;
  const CliResult r = box.loom(kGpt2 + "--tp 1 --pp 1 --zero 0 --micro-batch 2 --precision tf32");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(line_starting(r.out, "job ") == "job      global batch 16, seq 1024, precision tf32");
  // The V100's peak table has no tf32 rate.
  require_error(box.loom("plan --model gpt2 --cluster v100-32g-2x-pcie --global-batch 16 "
                         "--seq-len 1024 --precision tf32"),
                "loom plan: error: --precision: the V100-PCIE-32GB has no tf32 rate in its "
                "peak_tflops: use --precision fp16 (the best it runs)");
}
